/*
 * odp: on-demand paging through the drop-in (ibv_reg_mr(3) IBV_ACCESS_ON_DEMAND,
 * ibv_advise_mr(3), ibv_query_device_ex(3) odp_caps; docs/design/registered-memory.md, "On-demand
 * paging"). An ODP MR over a page that is not mapped registers; the implicit MR (addr NULL,
 * length SIZE_MAX) takes an RDMA WRITE into a page mapped after it was registered; a READ of
 * a page unmapped after registration completes with IBV_WC_REM_ACCESS_ERR, and a page mapped
 * again at that address is what the next READ returns; a local gather from an unmapped page
 * is IBV_WC_LOC_PROT_ERR; ibv_advise_mr answers with the kernel's errnos.
 *
 * Prints "ok <check>" or "FAIL <check>: ..." per check, then a summary line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <infiniband/verbs.h>

#include "check.h"

#define PAGE 4096

/* Below vm.mmap_min_addr (65536 by default): never mapped. */
#define HOLE ((void *)0x1000)

#define ALL_ODP_RC                                                                        \
	(IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |              \
	 IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

/* A fresh connected pair; only `a` posts. */
static struct ibv_qp *pair(struct ibv_qp **b)
{
	struct ibv_qp *a = new_rc_qp(pd, cq, 4, 1);

	*b = new_rc_qp(pd, cq, 4, 1);
	connect_rc(a, &gid, (*b)->qp_num, 0);
	connect_rc(*b, &gid, a->qp_num,
		   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE);
	return a;
}

/* Posts one signalled RDMA op of `len` bytes and returns its completion status. */
static int rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, void *local, uint32_t lkey,
		uint32_t len, void *remote, uint32_t rkey)
{
	return rdma_op(qp, cq, op, local, len, lkey, remote, rkey);
}

static int filled(const unsigned char *p, unsigned char v, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

/* A fresh page, at `at` if given: there only if it is still a hole (MAP_FIXED_NOREPLACE),
 * so nothing mapped into it meanwhile is ever replaced. */
static void *map_page(void *at, unsigned char fill)
{
	void *p = mmap(at, PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);

	if (p == MAP_FAILED || (at && p != at))
		fatal("mmap");
	memset(p, fill, PAGE);
	return p;
}

int main(void)
{
	struct ibv_device_attr_ex attr;
	struct ibv_mr *hole, *implicit, *local, *pinned, *mr;
	struct ibv_qp *a, *b, *a2, *b2, *a3, *b3;
	struct ibv_sge sge;
	unsigned char *buf, *page;
	int status, rc;

	ctx = open_first_device(&pd, &cq, 16);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");

	memset(&attr, 0, sizeof(attr));
	rc = ibv_query_device_ex(ctx, NULL, &attr);
	check("query_device_ex_odp_caps",
	      rc == 0 && attr.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) &&
		      attr.odp_caps.per_transport_caps.rc_odp_caps == ALL_ODP_RC &&
		      attr.xrc_odp_caps == ALL_ODP_RC &&
		      attr.odp_caps.per_transport_caps.ud_odp_caps ==
			      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV),
	      "odp_caps are not the device's");

	hole = ibv_reg_mr(pd, HOLE, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	check("reg_odp_over_unmapped", hole != NULL, "ibv_reg_mr(ON_DEMAND) over a hole failed");

	errno = 0;
	mr = ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE);
	check("reg_implicit_needs_on_demand", !mr && errno == EINVAL,
	      "want NULL with EINVAL for addr NULL, length SIZE_MAX without ON_DEMAND");
	if (mr)
		ibv_dereg_mr(mr);

	implicit = ibv_reg_mr(pd, NULL, SIZE_MAX,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ON_DEMAND);
	check("reg_implicit", implicit && implicit->length == SIZE_MAX,
	      "the implicit ODP MR was refused");
	if (!implicit || !hole)
		return summary("odp");

	buf = map_page(NULL, 0);
	local = ibv_reg_mr(pd, buf, PAGE, IBV_ACCESS_LOCAL_WRITE);
	if (!local)
		fatal("ibv_reg_mr local");

	/* Mapped after the implicit MR was registered. */
	page = map_page(NULL, 0);
	memset(buf, 0xa7, PAGE);
	a = pair(&b);
	status = rdma(a, IBV_WR_RDMA_WRITE, buf, local->lkey, PAGE, page, implicit->rkey);
	check("write_into_page_mapped_after_implicit_mr",
	      status == IBV_WC_SUCCESS && filled(page, 0xa7, PAGE),
	      "the RDMA WRITE did not land in the new page");

	/* Every QP (and its rings) exists before the page is unmapped, so no mapping lands in
	 * the hole. */
	a2 = pair(&b2);
	a3 = pair(&b3);
	if (munmap(page, PAGE))
		fatal("munmap");
	status = rdma(a, IBV_WR_RDMA_READ, buf, local->lkey, PAGE, page, implicit->rkey);
	check("read_of_unmapped_page_is_rem_access_err", status == IBV_WC_REM_ACCESS_ERR,
	      "want IBV_WC_REM_ACCESS_ERR");

	map_page(page, 0x22);
	memset(buf, 0, PAGE);
	status = rdma(a2, IBV_WR_RDMA_READ, buf, local->lkey, PAGE, page, implicit->rkey);
	check("remapped_page_is_read", status == IBV_WC_SUCCESS && filled(buf, 0x22, PAGE),
	      "the READ did not return the page mapped again");

	status = rdma(a3, IBV_WR_RDMA_WRITE, HOLE, hole->lkey, 64, page, implicit->rkey);
	check("gather_from_unmapped_is_loc_prot_err", status == IBV_WC_LOC_PROT_ERR,
	      "want IBV_WC_LOC_PROT_ERR");

	sge.addr = (uintptr_t)page;
	sge.length = PAGE;
	sge.lkey = implicit->lkey;
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	check("advise_prefetch_write_flush", rc == 0, "prefetch of a mapped page failed");
	sge.addr = (uintptr_t)HOLE;
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	check("advise_flush_of_unmapped_is_efault", rc == EFAULT, "want EFAULT");
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1);
	check("advise_async_of_unmapped_is_0", rc == 0, "want 0 (faults are not reported)");
	sge.addr = (uintptr_t)page;
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &sge, 1);
	check("advise_unknown_flag_is_einval", rc == EINVAL, "want EINVAL");
	rc = ibv_advise_mr(pd, (enum ibv_advise_mr_advice)7, 0, &sge, 1);
	check("advise_unknown_advice_is_eopnotsupp", rc == EOPNOTSUPP, "want EOPNOTSUPP");
	pinned = local;
	sge.addr = (uintptr_t)buf;
	sge.lkey = pinned->lkey;
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	check("advise_of_pinned_mr_is_enoent", rc == ENOENT, "want ENOENT");
	sge.lkey = 0xdeadbeef;
	rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	check("advise_of_unknown_lkey_is_enoent", rc == ENOENT, "want ENOENT");

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_qp(a2);
	ibv_destroy_qp(b2);
	ibv_destroy_qp(a3);
	ibv_destroy_qp(b3);
	ibv_dereg_mr(local);
	ibv_dereg_mr(implicit);
	ibv_dereg_mr(hole);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	munmap(page, PAGE);
	munmap(buf, PAGE);
	return summary("odp");
}
