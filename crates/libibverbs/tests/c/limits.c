/*
 * limits: a context over one of the daemon's limits (docs/guide/limits.md) gets what rdma-core
 * gives when the kernel or the device runs out (NULL with errno ENOMEM, as ib_umem_get past
 * RLIMIT_MEMLOCK and a full device table answer), and another context of the same process
 * still creates objects and moves data.
 *
 * The daemon runs with --limit context.cqs=3, context.pds=1, context.qps=2,
 * context.channels=1, context.registered-bytes=64K and context.ring-bytes=40K. Prints
 * "ok <check>" or "FAIL <check>: ..." per check, then a summary line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "check.h"

/* A constructor that must fail: NULL with errno ENOMEM. */
static void expect_enomem(const char *name, const void *got)
{
	int err = errno;
	char why[120];

	snprintf(why, sizeof(why), "%s, errno %d; want NULL with errno ENOMEM (%d)",
		 got ? "an object" : "NULL", got ? 0 : err, ENOMEM);
	errno = err;
	check(name, !got && err == ENOMEM, why);
}

/* Two connected RC QPs of `ctx` move 4 KiB from one buffer to another. */
static int transfer_works(struct ibv_context *ctx)
{
	static char buf[8192];
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	struct ibv_mr *mr;
	struct ibv_qp *a, *b;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_send_wr swr, *bad_s;
	struct ibv_wc wc[2];
	union ibv_gid gid;
	int got = 0, n, i;

	if (!cq)
		return 0;
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr || ibv_query_gid(ctx, 1, 0, &gid))
		return 0;
	a = new_rc_qp(pd, cq, 4, 1);
	b = new_rc_qp(pd, cq, 4, 1);
	connect_rc(a, &gid, b->qp_num, 0);
	connect_rc(b, &gid, a->qp_num, 0);
	for (i = 0; i < 4096; i++)
		buf[i] = (char)(i * 7);
	sge.addr = (uintptr_t)buf + 4096;
	sge.length = 4096;
	sge.lkey = mr->lkey;
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 1;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	if (ibv_post_recv(b, &rwr, &bad_r))
		return 0;
	sge.addr = (uintptr_t)buf;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 2;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(a, &swr, &bad_s))
		return 0;
	/* Bounded: 20 s of polling at most. */
	for (i = 0; got < 2 && i < 20000000; i++) {
		n = ibv_poll_cq(cq, 2 - got, wc + got);
		if (n < 0)
			return 0;
		got += n;
	}
	if (got < 2 || wc[0].status != IBV_WC_SUCCESS || wc[1].status != IBV_WC_SUCCESS)
		return 0;
	return memcmp(buf, buf + 4096, 4096) == 0;
}

int main(void)
{
	static char mem[128 << 10];
	struct ibv_context *ctx = open_first_context(), *other;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp_init_attr qa;

	/* Objects of a kind per context: a full table (mlx5 answers ENOMEM). */
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		fatal("ibv_alloc_pd");
	expect_enomem("alloc_pd_over_limit", ibv_alloc_pd(ctx));
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	if (!cq)
		fatal("ibv_create_cq");
	/* Ring bytes: a CQ of 1,000 entries needs a 48 KiB ring, past the 40 KiB. */
	expect_enomem("create_cq_over_ring_bytes", ibv_create_cq(ctx, 1000, NULL, NULL, 0));
	if (!ibv_create_cq(ctx, 4, NULL, NULL, 0) || !ibv_create_cq(ctx, 4, NULL, NULL, 0))
		fatal("ibv_create_cq 2 and 3");
	expect_enomem("create_cq_over_limit", ibv_create_cq(ctx, 4, NULL, NULL, 0));
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	if (!ibv_create_qp(pd, &qa) || !ibv_create_qp(pd, &qa))
		fatal("ibv_create_qp");
	expect_enomem("create_qp_over_limit", ibv_create_qp(pd, &qa));
	if (!ibv_create_comp_channel(ctx))
		fatal("ibv_create_comp_channel");
	expect_enomem("create_comp_channel_over_limit", ibv_create_comp_channel(ctx));
	/* Registered bytes, as RLIMIT_MEMLOCK counts them. */
	if (!ibv_reg_mr(pd, mem, 32 << 10, IBV_ACCESS_LOCAL_WRITE))
		fatal("ibv_reg_mr");
	expect_enomem("reg_mr_over_registered_bytes",
		      ibv_reg_mr(pd, mem + (32 << 10), 48 << 10, IBV_ACCESS_LOCAL_WRITE));

	/* Another context (another connection, as another process would have) has its own
	 * share and moves data. */
	other = open_first_context();
	check("other_context_transfers", transfer_works(other), "the other context failed");
	return summary("limits");
}
