/* Prints the verbs.h layout facts the drop-in relies on (crates/libibverbs/src/ffi.rs pins the
 * same numbers at compile time); tests/layout.rs compares them. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define S(t) printf("sizeof %s %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	S(ibv_device); O(ibv_device, transport_type); O(ibv_device, name); O(ibv_device, ibdev_path);
	S(ibv_context); O(ibv_context, ops); O(ibv_context, cmd_fd); O(ibv_context, async_fd);
	O(ibv_context, num_comp_vectors); O(ibv_context, mutex); O(ibv_context, abi_compat);
	O(ibv_context, ops.poll_cq); O(ibv_context, ops.req_notify_cq);
	O(ibv_context, ops.post_srq_recv); O(ibv_context, ops.post_send);
	O(ibv_context, ops.post_recv); O(ibv_context, ops.alloc_mw); O(ibv_context, ops.dealloc_mw);
	S(verbs_context); O(verbs_context, query_port); O(verbs_context, create_cq_ex);
	O(verbs_context, query_device_ex); O(verbs_context, open_qp); O(verbs_context, create_qp_ex);
	O(verbs_context, get_srq_num); O(verbs_context, create_srq_ex); O(verbs_context, open_xrcd);
	O(verbs_context, close_xrcd); O(verbs_context, sz); O(verbs_context, context);
	S(ibv_device_attr); S(ibv_device_attr_ex); O(ibv_device_attr_ex, max_wq_type_rq);
	O(ibv_device_attr_ex, max_dm_size); O(ibv_device_attr_ex, phys_port_cnt_ex);
	S(ibv_port_attr); O(ibv_port_attr, link_layer); O(ibv_port_attr, port_cap_flags2);
	S(ibv_gid_entry); S(ibv_comp_channel);
	O(ibv_mr, addr); O(ibv_mr, length); O(ibv_mr, lkey); O(ibv_mr, rkey);
	S(ibv_cq); O(ibv_cq, comp_events_completed); O(ibv_cq, async_events_completed);
	S(ibv_cq_ex); O(ibv_cq_ex, status); O(ibv_cq_ex, wr_id); O(ibv_cq_ex, start_poll);
	O(ibv_cq_ex, read_completion_ts); O(ibv_cq_ex, read_completion_wallclock_ns);
	S(ibv_srq); O(ibv_srq, events_completed);
	S(ibv_qp); O(ibv_qp, qp_num); O(ibv_qp, events_completed);
	S(ibv_qp_ex); O(ibv_qp_ex, wr_id); O(ibv_qp_ex, wr_flags); O(ibv_qp_ex, wr_send);
	O(ibv_qp_ex, wr_set_xrc_srqn); O(ibv_qp_ex, wr_set_sge); O(ibv_qp_ex, wr_start);
	O(ibv_qp_ex, wr_atomic_write);
	S(ibv_qp_init_attr); S(ibv_qp_init_attr_ex); O(ibv_qp_init_attr_ex, send_ops_flags);
	S(ibv_qp_attr); O(ibv_qp_attr, ah_attr); O(ibv_qp_attr, rate_limit);
	S(ibv_ah_attr); S(ibv_srq_init_attr_ex); O(ibv_srq_init_attr_ex, cq);
	S(ibv_cq_init_attr_ex); S(ibv_qp_open_attr); S(ibv_xrcd_init_attr);
	S(ibv_wc); S(ibv_send_wr); O(ibv_send_wr, wr); O(ibv_send_wr, qp_type.xrc.remote_srqn);
	O(ibv_send_wr, bind_mw); S(ibv_recv_wr); S(ibv_sge); S(ibv_async_event);
	return 0;
}
