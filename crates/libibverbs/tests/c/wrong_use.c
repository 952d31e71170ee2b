/*
 * wrong_use: wrong use of verbs from C must get the answer rdma-core 44 gives.
 *
 * Each check names the rdma-core (or kernel uverbs/driver) code whose answer it expects; where
 * rdma-core has no defined answer (a call on a freed object), it expects what the softverbs
 * drop-in documents instead. Prints "ok <check>" or "FAIL <check>: ..." per check, then a
 * summary line; exits 1 if any check failed.
 *
 *   wrong_use DIR        (DIR: a writable directory for XRC domain files)
 *
 * Build like examples/xrc_legacy.c (it also calls the legacy XRC API) and run it with
 * `softverbs run -- wrong_use DIR`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <softverbs/xrc_legacy.h>

#include "check.h"

static void report(const char *name, int ok, const char *fmt, long got, long want)
{
	char why[200];

	snprintf(why, sizeof(why), fmt, got, want);
	check(name, ok, why);
}

/* A call returning 0 or a positive errno. */
static void expect_ret(const char *name, int got, int want)
{
	report(name, got == want, "returned %ld, rdma-core returns %ld", got, want);
}

/* A constructor: NULL with errno `want`. */
static void expect_null(const char *name, const void *got, int err, int want)
{
	if (got) {
		report(name, 0, "returned an object (%ld), rdma-core returns NULL with errno %ld", 0,
		       want);
		return;
	}
	report(name, err == want, "NULL with errno %ld, rdma-core sets errno %ld", err, want);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	struct ibv_comp_channel *ch;
	struct verbs_context *vctx;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	static unsigned char buf[4096];
	int ret;

	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}

	/* --- NULL where rdma-core tolerates it ------------------------------------------------ */

	/* libibverbs/device.c ibv_get_device_list(): `num` is optional ("if (num) *num = 0").
	 * (ibv_free_device_list(NULL) is not checked: rdma-core dereferences the list.) */
	list = ibv_get_device_list(NULL);
	check("get_device_list_null_num", list && list[0], "no device list without num");
	if (!list || !list[0])
		fatal("ibv_get_device_list");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		fatal("ibv_open_device");
	ibv_free_device_list(list);

	/* verbs.h ibv_query_device_ex() and libibverbs/cmd_device.c
	 * ibv_cmd_query_device_any(): `input` is optional, a non-zero comp_mask is EINVAL. */
	{
		struct ibv_device_attr_ex ax;
		struct ibv_query_device_ex_input in = { .comp_mask = 1 };

		expect_ret("query_device_ex_null_input", ibv_query_device_ex(ctx, NULL, &ax), 0);
		expect_ret("query_device_ex_unknown_comp_mask", ibv_query_device_ex(ctx, &in, &ax),
			   EINVAL);
	}

	/* libibverbs/verbs.c ibv_create_cq(): the channel (and cq_context) may be NULL. */
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	check("create_cq_null_channel", cq != NULL, "no CQ without a channel");
	if (!cq)
		fatal("ibv_create_cq");

	/* --- an undersized (or oversized) struct ----------------------------------------------- */

	/* libibverbs/cmd_device.c ibv_cmd_query_device_any(): attr_size below
	 * sizeof(struct ibv_device_attr) is EINVAL; otherwise exactly attr_size bytes are
	 * cleared and filled. verbs.h's inline wrapper passes sizeof(*attr) of the program's
	 * header; an older or newer program passes its own, so call the slot as such a program's
	 * wrapper would. */
	vctx = verbs_get_ctx_op(ctx, query_device_ex);
	check("query_device_ex_slot", vctx != NULL, "no query_device_ex in verbs_context");
	if (vctx) {
		static unsigned char big[sizeof(struct ibv_device_attr_ex) + 64];
		size_t orig = sizeof(struct ibv_device_attr), i;
		int tail_kept = 1, tail_zeroed = 1;

		expect_ret("query_device_ex_undersized",
			   vctx->query_device_ex(ctx, NULL, (struct ibv_device_attr_ex *)big,
						 orig - 1),
			   EINVAL);
		memset(big, 0xa5, sizeof(big));
		ret = vctx->query_device_ex(ctx, NULL, (struct ibv_device_attr_ex *)big, orig);
		for (i = orig; i < sizeof(big); i++)
			tail_kept &= big[i] == 0xa5;
		expect_ret("query_device_ex_orig_size", ret, 0);
		check("query_device_ex_orig_size_writes_no_more", tail_kept,
			    "bytes past attr_size were written");
		memset(big, 0xa5, sizeof(big));
		ret = vctx->query_device_ex(ctx, NULL, (struct ibv_device_attr_ex *)big,
					    sizeof(big));
		for (i = sizeof(struct ibv_device_attr_ex); i < sizeof(big); i++)
			tail_zeroed &= big[i] == 0;
		expect_ret("query_device_ex_oversized", ret, 0);
		check("query_device_ex_oversized_clears_the_tail", tail_zeroed,
			    "bytes this library does not know were left as they were");
	}

	/* --- bad ports and indexes ------------------------------------------------------------ */

	/* Kernel drivers/infiniband/core/device.c ib_query_port(): a port that is not
	 * rdma_is_port_valid() is EINVAL, which libibverbs/cmd_device.c ibv_cmd_query_port()
	 * returns. Both through verbs.h's inline wrapper and the exported compat symbol. */
	expect_ret("query_port_0", ibv_query_port(ctx, 0, &pa), EINVAL);
	expect_ret("query_port_9", ibv_query_port(ctx, 9, &pa), EINVAL);
	expect_ret("query_port_0_compat",
		   (ibv_query_port)(ctx, 0, (struct _compat_ibv_port_attr *)&pa), EINVAL);
	expect_ret("query_port_1", ibv_query_port(ctx, 1, &pa), 0);

	/* libibverbs/verbs.c ibv_query_gid(): any error but ENODATA (an empty entry, which gives
	 * zeros and 0) is -1. */
	expect_ret("query_gid_index_past_table", ibv_query_gid(ctx, 1, pa.gid_tbl_len, &gid), -1);
	expect_ret("query_gid_negative_index", ibv_query_gid(ctx, 1, -1, &gid), -1);
	expect_ret("query_gid_port_9", ibv_query_gid(ctx, 9, 0, &gid), -1);
	expect_ret("query_gid_index_0", ibv_query_gid(ctx, 1, 0, &gid), 0);

	/* --- parents still in use --------------------------------------------------------------- */

	pd = ibv_alloc_pd(ctx);
	if (!pd)
		fatal("ibv_alloc_pd");
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fatal("ibv_reg_mr");
	/* Kernel drivers/infiniband/core/uverbs_std_types.c uverbs_free_pd():
	 * ib_destroy_usecnt() refuses a PD with users: EBUSY, returned by ibv_dealloc_pd(). */
	expect_ret("dealloc_pd_with_mr", ibv_dealloc_pd(pd), EBUSY);

	/* libibverbs/verbs.c ibv_destroy_comp_channel(): EBUSY while channel->refcnt > 0. */
	ch = ibv_create_comp_channel(ctx);
	if (!ch)
		fatal("ibv_create_comp_channel");
	{
		struct ibv_cq *ccq = ibv_create_cq(ctx, 4, NULL, ch, 0);

		if (!ccq)
			fatal("ibv_create_cq with a channel");
		expect_ret("destroy_comp_channel_with_cq", ibv_destroy_comp_channel(ch), EBUSY);
		expect_ret("destroy_cq_of_channel", ibv_destroy_cq(ccq), 0);
		expect_ret("destroy_comp_channel_unused", ibv_destroy_comp_channel(ch), 0);
	}

	qp = new_rc_qp(pd, cq, 4, 1);
	if (!qp)
		fatal("ibv_create_qp");
	/* Kernel drivers/infiniband/core/verbs.c ib_destroy_cq_user(): a CQ with users is
	 * EBUSY. */
	expect_ret("destroy_cq_with_qp", ibv_destroy_cq(cq), EBUSY);

	/* --- a QP used in the wrong state ------------------------------------------------------ */

	/* IBA Vol. 1 10.3.1: a QP in RESET takes no work request (an immediate error). Kernel
	 * drivers/infiniband/sw/rxe/rxe_verbs.c rxe_post_send() answers EINVAL and names the
	 * request; rdma-core's providers/rxe/rxe.c returns that EINVAL from its doorbell (mlx4/mlx5
	 * queue it silently, and the HCA never executes it). softverbs: EINVAL, *bad_wr = wr. */
	{
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey };
		struct ibv_send_wr wr, *bad = NULL;

		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 7;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		expect_ret("post_send_in_reset", ibv_post_send(qp, &wr, &bad), EINVAL);
		check("post_send_in_reset_names_bad_wr", bad == &wr, "*bad_wr is not the WR");
	}

	/* Kernel drivers/infiniband/core/verbs.c ib_modify_qp_is_ok() rejects RESET->RTS and the
	 * drivers return EINVAL; libibverbs/verbs.c ibv_modify_qp() updates qp->state only on
	 * success. */
	{
		struct ibv_qp_attr a;

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		expect_ret("modify_qp_reset_to_rts", ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
		check("modify_qp_failure_keeps_state", qp->state == IBV_QPS_RESET,
			    "qp->state changed by a failed modify");
	}

	/* --- objects already destroyed ---------------------------------------------------------- */

	/* rdma-core frees the object in the first destroy (e.g. providers/rxe/rxe.c
	 * rxe_dealloc_pd() calls free()), so a second call touches freed memory and has no
	 * defined answer. The drop-in keeps a shell of every destroyed object and documents
	 * EINVAL (src/objects.rs). */
	expect_ret("destroy_qp", ibv_destroy_qp(qp), 0);
	expect_ret("destroy_qp_twice", ibv_destroy_qp(qp), EINVAL);
	expect_ret("destroy_cq", ibv_destroy_cq(cq), 0);
	expect_ret("destroy_cq_twice", ibv_destroy_cq(cq), EINVAL);
	expect_ret("dereg_mr", ibv_dereg_mr(mr), 0);
	expect_ret("dereg_mr_twice", ibv_dereg_mr(mr), EINVAL);
	expect_ret("dealloc_pd", ibv_dealloc_pd(pd), 0);
	expect_ret("dealloc_pd_twice", ibv_dealloc_pd(pd), EINVAL);

	/* --- QP types the device does not have -------------------------------------------------- */

	/* rdma-core passes the type to the kernel: uverbs create_qp() refuses RAW_PACKET with EPERM
	 * without CAP_NET_RAW, and a device without raw packet QPs refuses the type (siw:
	 * EOPNOTSUPP for anything but RC). softverbs has none: EOPNOTSUPP, as such a device. */
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	if (!pd || !cq)
		fatal("ibv_alloc_pd/ibv_create_cq");
	{
		struct ibv_qp_init_attr a;

		memset(&a, 0, sizeof(a));
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = IBV_QPT_RAW_PACKET;
		a.cap.max_send_wr = 1;
		a.cap.max_send_sge = 1;
		errno = 0;
		qp = ibv_create_qp(pd, &a);
		expect_null("create_qp_raw_packet", qp, errno, EOPNOTSUPP);
	}

	/* --- XRC domains ------------------------------------------------------------------------ */

	/* Kernel drivers/infiniband/core/uverbs_cmd.c ib_uverbs_open_xrcd(): a file with no domain
	 * and no O_CREAT is EAGAIN; a file with a domain and O_EXCL is EINVAL. rdma-core's
	 * providers return NULL with the errno of the failed command. */
	{
		char path[4096];
		struct ibv_xrcd_init_attr xa;
		struct ibv_xrcd *x, *x2;
		struct ibv_srq_init_attr_ex sa;
		struct ibv_srq *srq;
		uint32_t qpn;
		int fd;

		snprintf(path, sizeof(path), "%s/wrong_use.domain", argv[1]);
		fd = open(path, O_RDONLY | O_CREAT, 0644);
		if (fd < 0)
			fatal("open domain file");
		memset(&xa, 0, sizeof(xa));
		xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
		xa.fd = fd;
		xa.oflags = 0;
		errno = 0;
		x = ibv_open_xrcd(ctx, &xa);
		expect_null("open_xrcd_new_file_without_o_creat", x, errno, EAGAIN);
		xa.oflags = O_CREAT;
		x = ibv_open_xrcd(ctx, &xa);
		if (!x)
			fatal("ibv_open_xrcd(O_CREAT)");
		xa.oflags = O_CREAT | O_EXCL;
		errno = 0;
		x2 = ibv_open_xrcd(ctx, &xa);
		expect_null("open_xrcd_o_excl_on_existing_domain", x2, errno, EINVAL);

		/* Kernel uverbs_std_types.c uverbs_free_xrcd(): ib_destroy_usecnt() again, EBUSY
		 * while an XRC SRQ (or QP) uses the domain. */
		memset(&sa, 0, sizeof(sa));
		sa.attr.max_wr = 4;
		sa.attr.max_sge = 1;
		sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
			       IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
		sa.srq_type = IBV_SRQT_XRC;
		sa.pd = pd;
		sa.xrcd = x;
		sa.cq = cq;
		srq = ibv_create_srq_ex(ctx, &sa);
		if (!srq)
			fatal("ibv_create_srq_ex(XRC)");
		expect_ret("close_xrcd_with_srq", ibv_close_xrcd(x), EBUSY);

		/* The legacy API (softverbs/xrc_legacy.h): init_attr may be NULL; registering with
		 * a QP the domain does not have, or unregistering without a registration, is EINVAL;
		 * the domain is busy while this process holds a registration. */
		expect_ret("legacy_create_rcv_qp_null_init_attr", ibv_create_xrc_rcv_qp(x, NULL, &qpn),
			   0);
		expect_ret("legacy_reg_unknown_qp", ibv_reg_xrc_rcv_qp(x, qpn ^ 0x5a5a5a), EINVAL);
		expect_ret("legacy_unreg_unregistered_qp", ibv_unreg_xrc_rcv_qp(x, qpn ^ 0x5a5a5a),
			   EINVAL);
		expect_ret("legacy_destroy_srq", ibv_destroy_srq(srq), 0);
		expect_ret("legacy_close_domain_with_registration", ibv_close_xrc_domain(x), EBUSY);
		expect_ret("legacy_unreg", ibv_unreg_xrc_rcv_qp(x, qpn), 0);
		expect_ret("legacy_unreg_twice", ibv_unreg_xrc_rcv_qp(x, qpn), EINVAL);
		expect_ret("close_xrcd", ibv_close_xrcd(x), 0);
		close(fd);
	}

	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);

	/* Objects left open at ibv_close_device(): rdma-core frees the context under them (using
	 * them after that is undefined there); the daemon tears them down with the context, and
	 * the drop-in answers EINVAL instead of reaching the closed connection. */
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		fatal("ibv_alloc_pd");
	expect_ret("close_device_with_open_pd", ibv_close_device(ctx), 0);
	expect_ret("dealloc_pd_after_close_device", ibv_dealloc_pd(pd), EINVAL);
	return summary("wrong_use");
}
