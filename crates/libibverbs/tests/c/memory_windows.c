/* Memory windows through the drop-in, between two processes (on one daemon or across two):
 * one check per rule, each named after its source (docs/design/memory-windows.md).
 *
 *   memory_windows target     the responder: owns the memory and the windows
 *       prints "qps GID Q0..Q7", reads "peer GID Q0..Q7", connects, makes its local checks
 *       and binds, prints "keys ADDR K1 K1OLD K2 K3 K4 K5 K6 KMR", reads "check", checks
 *       what the initiator did to it.
 *   memory_windows initiator  the requester: one QP per rule that ends the connection
 *       prints "qps GID Q0..Q7", reads "peer GID Q0..Q7", reads "keys ...", accesses.
 *
 * QP pair i (target's Qi <-> initiator's Qi) is used by one remote check each, since a remote
 * access error ends both ends of a connection (IBA 9.7.5.2.4, 11.6.3.1). */
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define NQP 8
#define BUF 16384
#define RW (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)
#define CONN_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qps[NQP];
static union ibv_gid gid;
static char buf[BUF] __attribute__((aligned(4096)));

static void setup(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		fatal("ibv_get_device_list");
	ctx = ibv_open_device(l[0]);
	if (!ctx)
		fatal("ibv_open_device");
	ibv_free_device_list(l);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	if (!pd || !cq)
		fatal("pd/cq");
	for (int i = 0; i < NQP; i++)
		qps[i] = new_rc_qp(pd, cq, 16, 1);
	printf("qps ");
	print_gid(&gid);
	for (int i = 0; i < NQP; i++)
		printf(" %u", qps[i]->qp_num);
	printf("\n");
	fflush(stdout);
}

static void read_peer(void)
{
	char line[512], hex[40];
	uint32_t q[NQP];
	union ibv_gid peer;
	if (!fgets(line, sizeof(line), stdin) ||
	    sscanf(line, "peer %32s %u %u %u %u %u %u %u %u", hex, &q[0], &q[1], &q[2], &q[3],
		   &q[4], &q[5], &q[6], &q[7]) != 1 + NQP)
		fatal("peer line");
	parse_gid(hex, &peer);
	for (int i = 0; i < NQP; i++)
		connect_rc(qps[i], &peer, q[i], CONN_ACCESS);
}

/* One completion within 5 s (bounded wait). */
static int poll_one(struct ibv_cq *c, struct ibv_wc *wc)
{
	for (int i = 0; i < 50000; i++) {
		int n = ibv_poll_cq(c, 1, wc);
		if (n < 0)
			return -1;
		if (n == 1)
			return 0;
		usleep(100);
	}
	errno = ETIMEDOUT;
	return -1;
}

/* ---- target -------------------------------------------------------------------------------- */

/* A pair of QPs of this process connected to each other, for binds that end their QP. */
static struct ibv_qp *local_pair(struct ibv_qp **other)
{
	struct ibv_qp *a = new_rc_qp(pd, cq, 4, 1), *b = new_rc_qp(pd, cq, 4, 1);
	connect_rc(a, &gid, b->qp_num, CONN_ACCESS);
	connect_rc(b, &gid, a->qp_num, CONN_ACCESS);
	*other = b;
	return a;
}

static int post_bind(struct ibv_qp *qp, struct ibv_mw *mw, uint32_t rkey, struct ibv_mr *mr,
		     uint64_t addr, uint64_t len, unsigned access, uint64_t wr_id)
{
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	return ibv_post_send(qp, &wr, &bad);
}

static int type1_bind(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t addr,
		      uint64_t len, unsigned access, uint64_t wr_id)
{
	struct ibv_mw_bind b;
	memset(&b, 0, sizeof(b));
	b.wr_id = wr_id;
	b.send_flags = IBV_SEND_SIGNALED;
	b.bind_info.mr = mr;
	b.bind_info.addr = addr;
	b.bind_info.length = len;
	b.bind_info.mw_access_flags = access;
	return ibv_bind_mw(qp, mw, &b);
}

/* The status of the completion of `wr_id` (the next one on the CQ), or -1. */
static int status_of(uint64_t wr_id, enum ibv_wc_opcode *op)
{
	struct ibv_wc wc;
	if (poll_one(cq, &wc) || wc.wr_id != wr_id)
		return -1;
	if (op)
		*op = wc.opcode;
	return wc.status;
}

static int target(void)
{
	struct ibv_device_attr da;
	struct ibv_device_attr_ex dx;
	struct ibv_mr *mr, *plain;
	struct ibv_mw *w1, *w2, *w3, *w4, *w5, *w6, *bad;
	struct ibv_qp *x, *y;
	struct ibv_pd *other_pd;
	enum ibv_wc_opcode op;
	uint32_t k1old;
	char line[64];
	int st;

	setup();
	memset(buf, 0, sizeof(buf));
	mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	plain = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	other_pd = ibv_alloc_pd(ctx);
	if (!mr || !plain || !other_pd)
		fatal("reg_mr");

	/* The device says what it offers (ibv_query_device(3); IBA 10.6.7 type 1 and 2B). */
	memset(&dx, 0, sizeof(dx));
	check("caps_max_mw", !ibv_query_device(ctx, &da) && da.max_mw > 0, "max_mw is 0");
	check("caps_mem_window_flags",
	      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
		      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) &&
		      !(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A),
	      "MEM_WINDOW and TYPE_2B set, TYPE_2A clear");
	check("caps_ex_flags",
	      !ibv_query_device_ex(ctx, NULL, &dx) && dx.orig_attr.max_mw == da.max_mw &&
		      (dx.device_cap_flags_ex & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
	      "ibv_query_device_ex disagrees");

	/* uverbs ib_uverbs_alloc_mw: only types 1 and 2 exist. */
	errno = 0;
	bad = ibv_alloc_mw(pd, 3);
	check("alloc_mw_type3_einval", !bad && errno == EINVAL, "type 3 window allocated");

	w1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	w2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	w3 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	w4 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	w5 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	w6 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	if (!w1 || !w2 || !w3 || !w4 || !w5 || !w6)
		fatal("ibv_alloc_mw");
	check("alloc_mw_type", w1->type == IBV_MW_TYPE_1 && w2->type == IBV_MW_TYPE_2 &&
				       w1->pd == pd && w1->rkey != w2->rkey,
	      "window fields");
	check("dealloc_pd_with_window_ebusy", ibv_dealloc_pd(pd) == EBUSY,
	      "a PD with windows was deallocated");

	/* ibv_bind_mw(3) / rxe's provider: argument errors before posting. */
	x = local_pair(&y);
	check("bind_mw_type2_einval", type1_bind(x, w2, mr, (uintptr_t)buf, 64, RW, 1) == EINVAL,
	      "ibv_bind_mw took a type 2 window");
	{
		struct ibv_mr *foreign = ibv_reg_mr(other_pd, buf, 64, IBV_ACCESS_LOCAL_WRITE |
								      IBV_ACCESS_MW_BIND);
		check("bind_mw_other_pd_eperm",
		      foreign && type1_bind(x, w1, foreign, (uintptr_t)buf, 64, RW, 1) == EPERM,
		      "an MR of another PD was accepted");
		if (foreign)
			ibv_dereg_mr(foreign);
	}
	check("bind_mw_zero_based_einval",
	      type1_bind(x, w1, mr, 0, 64, RW | IBV_ACCESS_ZERO_BASED, 1) == EINVAL,
	      "zero-based window accepted");

	/* C10-73: the MR must have been registered with IBV_ACCESS_MW_BIND; the bind completes
	 * with IBV_WC_MW_BIND_ERR (rxe) and the QP goes to error. */
	k1old = w1->rkey;
	st = type1_bind(x, w1, plain, (uintptr_t)buf, 64, RW, 2) ? -1 : status_of(2, NULL);
	check("bind_without_mw_bind_access", st == IBV_WC_MW_BIND_ERR, "bind not refused");
	{
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		check("bind_error_qp_in_error",
		      !ibv_query_qp(x, &qa, IBV_QP_STATE, &qi) && qa.qp_state == IBV_QPS_ERR,
		      "QP not in error after a bind error");
	}
	ibv_destroy_qp(x);
	ibv_destroy_qp(y);
	/* ibv_bind_mw(3): the caller undoes the key change after an error completion. */
	w1->rkey = k1old;

	/* C10-75: the window must lie inside the MR. */
	x = local_pair(&y);
	st = post_bind(x, w4, ibv_inc_rkey(w4->rkey), mr, (uintptr_t)buf + BUF - 8, 16, RW, 3) ?
		     -1 :
		     status_of(3, NULL);
	check("bind_past_mr", st == IBV_WC_MW_BIND_ERR, "a window past the MR was bound");
	ibv_destroy_qp(x);
	ibv_destroy_qp(y);

	/* o10-37.2.40: a type 2 window is not bound with length 0. */
	x = local_pair(&y);
	st = post_bind(x, w4, ibv_inc_rkey(w4->rkey), mr, (uintptr_t)buf, 0, RW, 4) ?
		     -1 :
		     status_of(4, NULL);
	check("type2_zero_length_bind", st == IBV_WC_MW_BIND_ERR, "zero-length type 2 bind");
	ibv_destroy_qp(x);
	ibv_destroy_qp(y);

	read_peer();

	/* IBA 10.6.7.2.1: a type 1 bind posts on the send queue and completes IBV_WC_BIND_MW;
	 * the window's rkey moves to the next consumer key (ibv_inc_rkey). */
	st = type1_bind(qps[0], w1, mr, (uintptr_t)buf + 4096, 4096, RW, 10) ? -1 :
									       status_of(10, &op);
	check("type1_bind", st == IBV_WC_SUCCESS && op == IBV_WC_BIND_MW &&
				    w1->rkey == ibv_inc_rkey(k1old),
	      "ibv_bind_mw did not complete as IBV_WC_BIND_MW with the next key");
	/* IBA 10.6.7.2.2: a type 2 bind is an IBV_WR_BIND_MW work request. */
	st = post_bind(qps[0], w2, ibv_inc_rkey(w2->rkey), mr, (uintptr_t)buf, 4096, RW, 11) ?
		     -1 :
		     status_of(11, &op);
	check("type2_bind", st == IBV_WC_SUCCESS && op == IBV_WC_BIND_MW, "type 2 bind");
	w2->rkey = ibv_inc_rkey(w2->rkey);
	/* A read-only type 1 window; a type 1 window deallocated at once; a type 2 window bound
	 * on Q4 and invalidated locally; a type 2 window bound on Q6 (reached through Q3). */
	st = type1_bind(qps[0], w3, mr, (uintptr_t)buf, 4096, IBV_ACCESS_REMOTE_READ, 12) ?
		     -1 :
		     status_of(12, NULL);
	st |= type1_bind(qps[0], w5, mr, (uintptr_t)buf, 4096, RW, 13) ? -1 : status_of(13, NULL);
	st |= post_bind(qps[4], w4, ibv_inc_rkey(w4->rkey), mr, (uintptr_t)buf, 4096, RW, 14) ?
		      -1 :
		      status_of(14, NULL);
	w4->rkey = ibv_inc_rkey(w4->rkey);
	st |= post_bind(qps[6], w6, ibv_inc_rkey(w6->rkey), mr, (uintptr_t)buf, 4096, RW, 15) ?
		      -1 :
		      status_of(15, NULL);
	w6->rkey = ibv_inc_rkey(w6->rkey);
	check("more_binds", st == 0, "binds of w3..w6");

	/* IBA 10.6.7.2.6 (rxe_dereg_mr): an MR with bound windows is not deregistered. */
	check("dereg_mr_with_bound_windows_einval", ibv_dereg_mr(mr) == EINVAL,
	      "an MR with bound windows was deregistered");

	/* IBA 10.6.7.2.5: IBV_WR_LOCAL_INV invalidates a type 2 window (IBV_WC_LOCAL_INV). */
	{
		struct ibv_send_wr wr, *badwr;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 16;
		wr.opcode = IBV_WR_LOCAL_INV;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.invalidate_rkey = w4->rkey;
		st = ibv_post_send(qps[4], &wr, &badwr) ? -1 : status_of(16, &op);
		check("local_invalidate", st == IBV_WC_SUCCESS && op == IBV_WC_LOCAL_INV,
		      "local invalidate of a type 2 window");
	}
	/* ibv_dealloc_mw: the window's key reaches nothing afterwards. */
	uint32_t k5 = w5->rkey;
	check("dealloc_mw", ibv_dealloc_mw(w5) == 0, "ibv_dealloc_mw");

	/* For the remote invalidations on Q0 (of w2) and Q7 (of the MR's key). */
	for (int i = 0; i < 2; i++) {
		struct ibv_sge s = {(uintptr_t)buf + 8192 + 64 * i, 64, mr->lkey};
		struct ibv_recv_wr r = {.wr_id = 20 + i, .sg_list = &s, .num_sge = 1}, *badr;
		if (ibv_post_recv(qps[i ? 7 : 0], &r, &badr))
			fatal("post_recv");
	}
	printf("keys %llu %u %u %u %u %u %u %u %u\n", (unsigned long long)(uintptr_t)buf,
	       w1->rkey, k1old, w2->rkey, w3->rkey, w4->rkey, k5, w6->rkey, mr->rkey);
	fflush(stdout);

	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "check", 5) != 0)
		fatal("check line");
	/* What the initiator did: its write through w1 landed (IBA 10.6.7.3). */
	check("write_through_type1_landed", memcmp(buf + 4096, "through w1", 10) == 0,
	      "bytes written through the window are not there");
	/* IBA 10.6.7.2.5 / ibv_poll_cq(3): Send with Invalidate completes the receive with
	 * IBV_WC_WITH_INV and the key in invalidated_rkey (wr 20); o10-37.2.26: one naming an
	 * MR's key is an invalid request, the receive completes IBV_WC_REM_INV_REQ_ERR (wr 21). */
	{
		struct ibv_wc wc, got[2];
		int have = 0, n;
		for (int i = 0; i < 5000 && have != 3; i++) {
			n = ibv_poll_cq(cq, 1, &wc);
			if (n == 1 && (wc.wr_id == 20 || wc.wr_id == 21)) {
				got[wc.wr_id - 20] = wc;
				have |= 1 << (wc.wr_id - 20);
			} else if (n == 0) {
				usleep(1000);
			}
		}
		check("send_with_inv_completion",
		      (have & 1) && got[0].status == IBV_WC_SUCCESS &&
			      (got[0].wc_flags & IBV_WC_WITH_INV) &&
			      got[0].invalidated_rkey == w2->rkey,
		      "no IBV_WC_WITH_INV receive with the window's key");
		check("send_with_inv_of_mr_key_recv_rem_inv_req_err",
		      (have & 2) && got[1].status == IBV_WC_REM_INV_REQ_ERR,
		      "the receive of a Send with Invalidate of an MR's key did not fail");
	}
	/* IBA 11.6.3.1: the responder's QP of a remote access error goes to error with
	 * IBV_EVENT_QP_ACCESS_ERR. */
	{
		struct ibv_async_event ev;
		struct pollfd p = {ctx->async_fd, POLLIN, 0};
		int found = 0;
		while (!found && poll(&p, 1, 2000) == 1 && !ibv_get_async_event(ctx, &ev)) {
			found = ev.event_type == IBV_EVENT_QP_ACCESS_ERR && ev.element.qp == qps[1];
			ibv_ack_async_event(&ev);
		}
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		check("responder_access_error_event",
		      found && !ibv_query_qp(qps[1], &qa, IBV_QP_STATE, &qi) &&
			      qa.qp_state == IBV_QPS_ERR,
		      "no QP_ACCESS_ERR event / QP not in error");
		/* The invalid request on Q7 (IBA 9.7.5.2.2 class J): IBV_EVENT_QP_REQ_ERR. */
		found = 0;
		while (!found && poll(&p, 1, 2000) == 1 && !ibv_get_async_event(ctx, &ev)) {
			found = ev.event_type == IBV_EVENT_QP_REQ_ERR && ev.element.qp == qps[7];
			ibv_ack_async_event(&ev);
		}
		check("send_with_inv_of_mr_key_req_err_event",
		      found && !ibv_query_qp(qps[7], &qa, IBV_QP_STATE, &qi) &&
			      qa.qp_state == IBV_QPS_ERR,
		      "no QP_REQ_ERR event on Q7 / Q7 not in error");
	}
	/* Type 2 windows belong to their QP (IBA 10.6.7.2.2): destroying Q6 invalidates w6.
	 * Type 1 windows stay bound while their MR lives: w1 and w3 are deallocated here. */
	ibv_destroy_qp(qps[6]);
	ibv_dealloc_mw(w1);
	ibv_dealloc_mw(w3);
	check("dereg_mr_after_windows_gone", ibv_dereg_mr(mr) == 0,
	      "the MR is still pinned after its windows went");
	check("dealloc_remaining", !ibv_dealloc_mw(w2) && !ibv_dealloc_mw(w4) &&
					   !ibv_dealloc_mw(w6),
	      "dealloc of invalidated windows");
	return summary("memory_windows");
}

/* ---- initiator ----------------------------------------------------------------------------- */

static int remote_op(int qi, enum ibv_wr_opcode opc, uint64_t raddr, uint32_t rkey, uint32_t len,
		  struct ibv_mr *mr, uint64_t wr_id)
{
	struct ibv_sge s = {(uintptr_t)buf, len, mr->lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = opc;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qps[qi], &wr, &bad))
		return -1;
	struct ibv_wc wc;
	if (poll_one(cq, &wc) || wc.wr_id != wr_id)
		return -1;
	return wc.status;
}

/* A 16-byte Send with Invalidate of `rkey` on Qqi; its completion status, or -1. */
static int send_inv(int qi, uint32_t rkey, struct ibv_mr *mr, uint64_t wr_id)
{
	struct ibv_sge s = {(uintptr_t)buf, 16, mr->lkey};
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_SEND_WITH_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.invalidate_rkey = rkey;
	if (ibv_post_send(qps[qi], &wr, &bad) || poll_one(cq, &wc) || wc.wr_id != wr_id)
		return -1;
	return wc.status;
}

static int initiator(void)
{
	struct ibv_mr *mr;
	unsigned long long addr;
	uint32_t k1, k1old, k2, k3, k4, k5, k6, kmr;
	char line[256];

	setup();
	mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fatal("reg_mr");
	read_peer();
	if (!fgets(line, sizeof(line), stdin) ||
	    sscanf(line, "keys %llu %u %u %u %u %u %u %u %u", &addr, &k1, &k1old, &k2, &k3, &k4,
		   &k5, &k6, &kmr) != 9)
		fatal("keys line");

	memcpy(buf, "through w1", 10);
	/* IBA 10.6.7.3: access through a window's R_Key within its range and rights. */
	check("remote_write_through_type1",
	      remote_op(0, IBV_WR_RDMA_WRITE, addr + 4096, k1, 10, mr, 1) == IBV_WC_SUCCESS,
	      "write through a bound type 1 window");
	check("remote_read_through_type2",
	      remote_op(0, IBV_WR_RDMA_READ, addr, k2, 64, mr, 2) == IBV_WC_SUCCESS,
	      "read through a bound type 2 window");
	/* IBA 10.6.7.2.5: Send with Invalidate, then the window is invalid. */
	check("send_with_invalidate", send_inv(0, k2, mr, 3) == IBV_WC_SUCCESS, "SEND_WITH_INV");
	check("access_after_remote_invalidate_rem_access_err",
	      remote_op(0, IBV_WR_RDMA_READ, addr, k2, 8, mr, 4) == IBV_WC_REM_ACCESS_ERR,
	      "a remotely invalidated window was reachable");
	/* IBA 10.6.7.3 (C10-84): outside the window's range. */
	check("outside_range_rem_access_err",
	      remote_op(1, IBV_WR_RDMA_WRITE, addr + 8192 - 4, k1, 8, mr, 5) == IBV_WC_REM_ACCESS_ERR,
	      "a write past the window's end succeeded");
	/* IBA 10.6.7.3: the window's own access rights (read-only window). */
	check("wrong_access_rem_access_err",
	      remote_op(2, IBV_WR_RDMA_WRITE, addr, k3, 8, mr, 6) == IBV_WC_REM_ACCESS_ERR,
	      "a write through a read-only window succeeded");
	/* IBA 10.6.7.2.2 (type 2B): a type 2 window belongs to the QP that bound it (Q6). */
	check("type2_other_qp_rem_access_err",
	      remote_op(3, IBV_WR_RDMA_WRITE, addr, k6, 8, mr, 7) == IBV_WC_REM_ACCESS_ERR,
	      "a type 2 window was reached through another QP");
	/* IBA 10.6.7.2.5: a locally invalidated window. */
	check("access_after_local_invalidate_rem_access_err",
	      remote_op(4, IBV_WR_RDMA_WRITE, addr, k4, 8, mr, 8) == IBV_WC_REM_ACCESS_ERR,
	      "a locally invalidated window was reachable");
	/* ibv_inc_rkey(3): the key before the rebind names nothing. */
	check("stale_consumer_key_rem_access_err",
	      remote_op(5, IBV_WR_RDMA_WRITE, addr + 4096, k1old, 8, mr, 9) == IBV_WC_REM_ACCESS_ERR,
	      "the pre-bind key still worked");
	/* ibv_dealloc_mw: a deallocated window. */
	check("dealloc_mw_rem_access_err",
	      remote_op(6, IBV_WR_RDMA_WRITE, addr, k5, 8, mr, 10) == IBV_WC_REM_ACCESS_ERR,
	      "a deallocated window was reachable");
	/* o10-37.2.26 (rxe invalidate_rkey): a Send with Invalidate naming an MR's key, not a
	 * window, is an invalid request: Invalid Request NAK, IBV_WC_REM_INV_REQ_ERR. */
	check("send_with_inv_of_mr_key_rem_inv_req_err",
	      send_inv(7, kmr, mr, 11) == IBV_WC_REM_INV_REQ_ERR,
	      "a Send with Invalidate of an MR's key was not refused");
	return summary("memory_windows");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && !strcmp(argv[1], "target"))
		return target();
	if (argc == 2 && !strcmp(argv[1], "initiator"))
		return initiator();
	fprintf(stderr, "usage: memory_windows target|initiator\n");
	return 2;
}
