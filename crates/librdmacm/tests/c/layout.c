/* Prints the sizes and offsets of rdma_cma.h's public structs (tests/layout.rs). */
#include <stddef.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

#define S(t) printf("sizeof %s %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	S(rdma_event_channel);
	S(rdma_addr); O(rdma_addr, dst_addr); O(rdma_addr, addr);
	S(rdma_route); O(rdma_route, path_rec); O(rdma_route, num_paths);
	S(rdma_cm_id); O(rdma_cm_id, verbs); O(rdma_cm_id, channel); O(rdma_cm_id, context);
	O(rdma_cm_id, qp); O(rdma_cm_id, route); O(rdma_cm_id, ps); O(rdma_cm_id, port_num);
	O(rdma_cm_id, event); O(rdma_cm_id, send_cq_channel); O(rdma_cm_id, send_cq);
	O(rdma_cm_id, recv_cq_channel); O(rdma_cm_id, recv_cq); O(rdma_cm_id, srq);
	O(rdma_cm_id, pd); O(rdma_cm_id, qp_type);
	S(rdma_conn_param); O(rdma_conn_param, private_data_len); O(rdma_conn_param, responder_resources);
	O(rdma_conn_param, rnr_retry_count); O(rdma_conn_param, srq); O(rdma_conn_param, qp_num);
	S(rdma_ud_param); O(rdma_ud_param, ah_attr); O(rdma_ud_param, qp_num); O(rdma_ud_param, qkey);
	S(rdma_cm_event); O(rdma_cm_event, listen_id); O(rdma_cm_event, event); O(rdma_cm_event, status);
	O(rdma_cm_event, param);
	S(rdma_addrinfo); O(rdma_addrinfo, ai_src_len); O(rdma_addrinfo, ai_src_addr);
	O(rdma_addrinfo, ai_dst_addr); O(rdma_addrinfo, ai_route_len); O(rdma_addrinfo, ai_connect);
	O(rdma_addrinfo, ai_next);
	S(ibv_qp_attr); O(ibv_qp_attr, ah_attr); O(ibv_qp_attr, pkey_index); O(ibv_qp_attr, rnr_retry);
	S(ibv_qp_init_attr); O(ibv_qp_init_attr, qp_type);
	O(ibv_qp_init_attr_ex, comp_mask); O(ibv_qp_init_attr_ex, pd);
	O(ibv_qp, qp_num); O(ibv_qp, qp_type);
	return 0;
}
