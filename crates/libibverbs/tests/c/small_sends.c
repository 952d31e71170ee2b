/*
 * small_sends: small SENDs and RDMA WRITEs posted without IBV_SEND_INLINE, as perftest posts
 * them on a device it does not know. The drop-in copies such payloads itself when every SGE
 * lies inside an MR of the QP's PD (qp.rs auto_inline); this checks that the data arrives
 * intact that way (several SGEs, an MR whose IOVA is not its address) and that every request
 * the copy must not take — unknown lkey, a range past the MR's end, a deregistered MR — still
 * completes with IBV_WC_LOC_PROT_ERR as the daemon's checks answer.
 *
 * Two RC QPs of one context connected to each other (GID index 0). Prints "ok <check>" or
 * "FAIL <check>: ..." per check, then a summary line; exits 1 if any check failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

/* The program never asks for inline (max_inline_data 0), as perftest does. */
static struct ibv_qp *rc_qp(void)
{
	return new_rc_qp(pd, cq, 8, 4);
}

static void connect_qp(struct ibv_qp *qp, uint32_t remote)
{
	connect_rc(qp, &gid, remote, IBV_ACCESS_REMOTE_WRITE);
}

/* A connected pair: a[0] sends to a[1]. */
static void pair(struct ibv_qp **a)
{
	a[0] = rc_qp();
	a[1] = rc_qp();
	connect_qp(a[0], a[1]->qp_num);
	connect_qp(a[1], a[0]->qp_num);
}

/* The next completion (10 s at most); status -1 if none came. */
static struct ibv_wc next_wc(void)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;

	while (time(NULL) < end) {
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n < 0)
			fatal("ibv_poll_cq");
		if (n == 1)
			return wc;
	}
	memset(&wc, 0, sizeof(wc));
	wc.status = -1;
	return wc;
}

static int post_recv(struct ibv_qp *qp, struct ibv_mr *mr, void *at, uint32_t len)
{
	struct ibv_sge s = { .addr = (uintptr_t)at, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &s, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, struct ibv_sge *s, int n,
		uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 1;
	wr.sg_list = s;
	wr.num_sge = n;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* Both completions of a SEND (sender and receiver), in either order. */
static int send_done(enum ibv_wc_status *snd, enum ibv_wc_status *rcv, uint32_t *len)
{
	int i;

	*snd = *rcv = -1;
	for (i = 0; i < 2; i++) {
		struct ibv_wc wc = next_wc();

		if ((int)wc.status == -1)
			return -1;
		if (wc.opcode == IBV_WC_RECV) {
			*rcv = wc.status;
			*len = wc.byte_len;
		} else {
			*snd = wc.status;
		}
	}
	return 0;
}

/* A send whose request the daemon must refuse: the sender's completion is LOC_PROT_ERR. */
static void expect_loc_prot(const char *name, struct ibv_sge *s)
{
	struct ibv_qp *q[2];
	struct ibv_wc wc;
	char msg[128];

	pair(q);
	if (post(q[0], IBV_WR_SEND, s, 1, 0, 0)) {
		check(name, 0, "ibv_post_send refused the request (a NIC takes it)");
		return;
	}
	wc = next_wc();
	snprintf(msg, sizeof(msg), "completion status %d, expected IBV_WC_LOC_PROT_ERR (%d)",
		 (int)wc.status, IBV_WC_LOC_PROT_ERR);
	check(name, wc.status == IBV_WC_LOC_PROT_ERR && wc.wr_id == 1, msg);
	/* The flushes that may follow are not looked at; fresh QPs for the next check. */
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
	ibv_destroy_qp(q[0]);
	ibv_destroy_qp(q[1]);
}

int main(void)
{
	struct ibv_qp *q[2];
	struct ibv_mr *src_mr, *dst_mr, *iova_mr, *gone_mr;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	enum ibv_wc_status snd, rcv;
	uint32_t len = 0;
	static unsigned char src[8192], dst[8192], other[4096];
	const uint64_t iova = 0x10000000;
	struct ibv_sge s[3];
	int i, ok;

	ctx = open_first_device(&pd, &cq, 64);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	for (i = 0; i < (int)sizeof(src); i++)
		src[i] = (unsigned char)(i * 7 + 3);
	src_mr = ibv_reg_mr(pd, src, sizeof(src), 0);
	dst_mr = ibv_reg_mr(pd, dst, sizeof(dst),
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	iova_mr = ibv_reg_mr_iova2(pd, src + 4096, 4096, iova, 0);
	if (!src_mr || !dst_mr || !iova_mr)
		fatal("ibv_reg_mr");
	pair(q);

	/* ibv_create_qp(3): the capacities returned are at least those asked for. */
	memset(&qa, 0, sizeof(qa));
	ok = !ibv_query_qp(q[0], &qa, IBV_QP_CAP, &qi) && qi.cap.max_send_sge >= 4;
	check("query_qp_caps_at_least_asked", ok, "query failed or fewer SGEs than asked");

	/* One SGE of 100 bytes from the middle of an MR. */
	memset(dst, 0, sizeof(dst));
	s[0] = (struct ibv_sge){ .addr = (uintptr_t)(src + 200), .length = 100, .lkey = src_mr->lkey };
	ok = !post_recv(q[1], dst_mr, dst, 4096) && !post(q[0], IBV_WR_SEND, s, 1, 0, 0) &&
	     !send_done(&snd, &rcv, &len);
	check("send_100_bytes", ok && snd == IBV_WC_SUCCESS && rcv == IBV_WC_SUCCESS && len == 100 &&
				       !memcmp(dst, src + 200, 100) && dst[100] == 0,
	      "completions or received bytes differ from what was sent");

	/* Three SGEs, 10 + 20 + 30 bytes, gathered in order. */
	memset(dst, 0, sizeof(dst));
	s[0] = (struct ibv_sge){ .addr = (uintptr_t)(src + 1), .length = 10, .lkey = src_mr->lkey };
	s[1] = (struct ibv_sge){ .addr = (uintptr_t)(src + 500), .length = 20, .lkey = src_mr->lkey };
	s[2] = (struct ibv_sge){ .addr = (uintptr_t)(src + 8162), .length = 30, .lkey = src_mr->lkey };
	ok = !post_recv(q[1], dst_mr, dst, 4096) && !post(q[0], IBV_WR_SEND, s, 3, 0, 0) &&
	     !send_done(&snd, &rcv, &len);
	check("send_three_sges_in_order",
	      ok && snd == IBV_WC_SUCCESS && rcv == IBV_WC_SUCCESS && len == 60 &&
		      !memcmp(dst, src + 1, 10) && !memcmp(dst + 10, src + 500, 20) &&
		      !memcmp(dst + 30, src + 8162, 30),
	      "the gathered bytes differ from the three buffers in order");

	/* An MR registered at IOVA 0x10000000: SGE addresses are IOVAs. */
	memset(dst, 0, sizeof(dst));
	s[0] = (struct ibv_sge){ .addr = iova + 64, .length = 128, .lkey = iova_mr->lkey };
	ok = !post_recv(q[1], dst_mr, dst, 4096) && !post(q[0], IBV_WR_SEND, s, 1, 0, 0) &&
	     !send_done(&snd, &rcv, &len);
	check("send_from_iova_mr", ok && snd == IBV_WC_SUCCESS && rcv == IBV_WC_SUCCESS &&
					  len == 128 && !memcmp(dst, src + 4096 + 64, 128),
	      "the bytes are not those at the IOVA's offset in the MR");

	/* An RDMA WRITE of 64 bytes lands at the remote address. */
	memset(dst, 0, sizeof(dst));
	s[0] = (struct ibv_sge){ .addr = (uintptr_t)(src + 3000), .length = 64, .lkey = src_mr->lkey };
	{
		struct ibv_wc wc;

		ok = !post(q[0], IBV_WR_RDMA_WRITE, s, 1, (uintptr_t)(dst + 128), dst_mr->rkey);
		wc = next_wc();
		check("write_64_bytes", ok && wc.status == IBV_WC_SUCCESS &&
						!memcmp(dst + 128, src + 3000, 64) && dst[127] == 0 &&
						dst[192] == 0,
		      "the WRITE did not land exactly at the remote address");
	}
	ibv_destroy_qp(q[0]);
	ibv_destroy_qp(q[1]);

	/* Requests the local copy must leave to the daemon's checks. */
	s[0] = (struct ibv_sge){ .addr = (uintptr_t)src, .length = 8, .lkey = src_mr->lkey ^ 0x5a5a00 };
	expect_loc_prot("send_unknown_lkey_loc_prot_err", s);
	s[0] = (struct ibv_sge){ .addr = (uintptr_t)(src + sizeof(src) - 8), .length = 16,
				 .lkey = src_mr->lkey };
	expect_loc_prot("send_past_mr_end_loc_prot_err", s);
	gone_mr = ibv_reg_mr(pd, other, sizeof(other), 0);
	if (!gone_mr)
		fatal("ibv_reg_mr");
	s[0] = (struct ibv_sge){ .addr = (uintptr_t)other, .length = 8, .lkey = gone_mr->lkey };
	if (ibv_dereg_mr(gone_mr))
		fatal("ibv_dereg_mr");
	expect_loc_prot("send_from_deregistered_mr_loc_prot_err", s);

	ibv_dereg_mr(iova_mr);
	ibv_dereg_mr(dst_mr);
	ibv_dereg_mr(src_mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return summary("small_sends");
}
