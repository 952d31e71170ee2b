/*
 * readonly_mr: ibv_reg_mr over pages the program cannot write, or has not mapped, answers as
 * on a device, where ib_umem_get pins with FOLL_WRITE when the access flags include
 * IBV_ACCESS_LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC or MW_BIND: NULL with errno EFAULT
 * for write access over PROT_READ pages and for any access over unmapped ones; without
 * write access a PROT_READ page registers, an RDMA READ of it returns its bytes, and an
 * RDMA WRITE towards it never changes them (docs/design/registered-memory.md).
 *
 * Prints "ok <check>" or "FAIL <check>: ..." per check, then a summary line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <infiniband/verbs.h>

#include "check.h"

#define PAGE 4096

/* Below vm.mmap_min_addr (65536 by default): never mapped. */
#define HOLE ((void *)0x1000)

static void expect_efault(const char *name, struct ibv_mr *got)
{
	int err = errno;
	char why[120];

	snprintf(why, sizeof(why), "%s, errno %d; want NULL with errno EFAULT (%d)",
		 got ? "an MR" : "NULL", got ? 0 : err, EFAULT);
	if (got)
		ibv_dereg_mr(got);
	errno = err;
	check(name, !got && err == EFAULT, why);
}

/* Posts one signalled RDMA op of a whole page and returns its completion status. */
static int rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, struct ibv_mr *local,
		void *remote, uint32_t rkey)
{
	return rdma_op(qp, cq, op, local->addr, PAGE, local->lkey, remote, rkey);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr, *local;
	union ibv_gid gid;
	unsigned char *ro, *buf, before[PAGE];
	int status;

	ctx = open_first_device(&pd, &cq, 8);

	ro = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	buf = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ro == MAP_FAILED || buf == MAP_FAILED)
		fatal("mmap");
	memset(ro, 0xc3, PAGE);
	if (mprotect(ro, PAGE, PROT_READ))
		fatal("mprotect");
	memcpy(before, ro, PAGE);

	expect_efault("reg_local_write_over_prot_read",
		      ibv_reg_mr(pd, ro, PAGE, IBV_ACCESS_LOCAL_WRITE));
	expect_efault("reg_remote_write_over_prot_read",
		      ibv_reg_mr(pd, ro, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
	expect_efault("reg_remote_atomic_over_prot_read",
		      ibv_reg_mr(pd, ro, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC));
	expect_efault("reg_over_unmapped", ibv_reg_mr(pd, HOLE, PAGE, IBV_ACCESS_REMOTE_READ));
	expect_efault("reg_write_over_unmapped", ibv_reg_mr(pd, HOLE, PAGE, IBV_ACCESS_LOCAL_WRITE));

	/* The strongest registration granted over the page. */
	mr = ibv_reg_mr(pd, ro, PAGE,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!mr)
		mr = ibv_reg_mr(pd, ro, PAGE, IBV_ACCESS_REMOTE_READ);
	check("reg_remote_read_over_prot_read", mr != NULL, "ibv_reg_mr(REMOTE_READ) failed");
	if (!mr)
		return summary("readonly_mr");

	local = ibv_reg_mr(pd, buf, PAGE, IBV_ACCESS_LOCAL_WRITE);
	if (!local)
		fatal("ibv_reg_mr local");
	a = new_rc_qp(pd, cq, 4, 1);
	b = new_rc_qp(pd, cq, 4, 1);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	connect_rc(a, &gid, b->qp_num, 0);
	connect_rc(b, &gid, a->qp_num,
		   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE);

	status = rdma(a, cq, IBV_WR_RDMA_READ, local, ro, mr->rkey);
	check("rdma_read_of_prot_read",
	      status == IBV_WC_SUCCESS && memcmp(buf, before, PAGE) == 0,
	      "RDMA READ failed or returned other bytes");

	memset(buf, 0x11, PAGE);
	status = rdma(a, cq, IBV_WR_RDMA_WRITE, local, ro, mr->rkey);
	check("rdma_write_leaves_prot_read_unchanged",
	      status != IBV_WC_SUCCESS && memcmp(ro, before, PAGE) == 0,
	      "an RDMA WRITE completed or changed the read-only page");

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(local);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return summary("readonly_mr");
}
