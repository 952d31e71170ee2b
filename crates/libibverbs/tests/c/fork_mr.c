/*
 * fork_mr: registration shares a malloc'ed buffer's pages with the daemon in place
 * (docs/design/registered-memory.md, "Sharing by default"), and the program must not be able to
 * tell: a child forked while the buffer is registered gets its own copy of it as of the
 * fork (as Linux >= 5.8 copies a NIC's pinned pages for the child), the child's writes to
 * the buffer and to its neighbours on the same pages stay in the child, an RDMA WRITE into
 * the MR after the fork reaches the parent only, and after ibv_dereg_mr the pages are
 * private memory again: realloc can grow a deregistered mmapped chunk (on a sealed memfd
 * the grown part would raise SIGBUS) and a child forked then copies it as usual.
 *
 * Prints "ok <check>" or "FAIL <check>: ..." per check, "info converted <0|1>" (whether
 * registration shared the pages), then a summary line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

#define PAGE 4096
/* The block: two pages of neighbours around a three-page MR that starts mid-page. */
#define BLOCK (5 * PAGE)
#define MR_OFF (PAGE + 100)
#define MR_LEN (3 * PAGE)
/* A chunk glibc serves with mmap, larger than a piece of the conversion (2 MiB). */
#define BIG (5 << 20)

static int all(const unsigned char *p, size_t n, unsigned char v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

static int rdma_write(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *src, void *dst,
		      uint32_t rkey)
{
	return rdma_op(qp, cq, IBV_WR_RDMA_WRITE, src->addr, MR_LEN, src->lkey, dst, rkey);
}

/* Child: exit bit 1 if the block was not what the parent had at fork, bit 2 if its own
 * writes did not stay (the parent's RDMA WRITE or memset showed through), 4 on a pipe error. */
static void child(unsigned char *block, int to_parent, int to_child)
{
	int code = 0;
	char c = 0;

	if (!all(block, MR_OFF, 'A') || !all(block + MR_OFF, MR_LEN, 'A') ||
	    !all(block + MR_OFF + MR_LEN, BLOCK - MR_OFF - MR_LEN, 'A'))
		code |= 1;
	memset(block, 'C', BLOCK);
	free(malloc(100)); /* malloc's own bookkeeping in the child */
	if (write(to_parent, &c, 1) != 1 || read(to_child, &c, 1) != 1)
		code |= 4;
	if (!all(block, BLOCK, 'C'))
		code |= 2;
	_exit(code);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr, *src_mr;
	union ibv_gid gid;
	unsigned char *block, *src, *big;
	int to_parent[2], to_child[2], status, was_converted;
	char c = 0, why[200];
	pid_t pid;

	ctx = open_first_device(&pd, &cq, 8);
	a = new_rc_qp(pd, cq, 4, 1);
	b = new_rc_qp(pd, cq, 4, 1);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	connect_rc(a, &gid, b->qp_num, 0);
	connect_rc(b, &gid, a->qp_num, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);

	block = malloc(BLOCK);
	src = malloc(MR_LEN);
	if (!block || !src)
		fatal("malloc");
	memset(block, 'A', BLOCK);
	memset(src, 'B', MR_LEN);
	src_mr = ibv_reg_mr(pd, src, MR_LEN, IBV_ACCESS_LOCAL_WRITE);
	mr = ibv_reg_mr(pd, block + MR_OFF, MR_LEN,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr || !src_mr)
		fatal("ibv_reg_mr");
	was_converted = maps_line_has(block + MR_OFF, "memfd:");
	printf("info converted %d\n", was_converted);
	fflush(stdout);

	if (pipe(to_parent) || pipe(to_child))
		fatal("pipe");
	pid = fork();
	if (pid < 0)
		fatal("fork");
	if (pid == 0)
		child(block, to_parent[1], to_child[0]);
	if (read(to_parent[0], &c, 1) != 1)
		fatal("read from the child");
	check("child_writes_stay_in_the_child", all(block, BLOCK, 'A'),
	      "the child's memset of the block showed in the parent");
	check("rdma_write_after_fork_reaches_the_parent",
	      rdma_write(a, cq, src_mr, block + MR_OFF, mr->rkey) == IBV_WC_SUCCESS &&
		      all(block + MR_OFF, MR_LEN, 'B') && all(block, MR_OFF, 'A') &&
		      all(block + MR_OFF + MR_LEN, BLOCK - MR_OFF - MR_LEN, 'A'),
	      "the WRITE failed, or the MR or its neighbours do not hold what they should");
	if (write(to_child[1], &c, 1) != 1)
		fatal("write to the child");
	if (waitpid(pid, &status, 0) != pid)
		fatal("waitpid");
	snprintf(why, sizeof(why), "the child ended with status %#x (exit bit 1: it did not see the "
				   "parent's bytes; 2: the parent's writes reached it)",
		 status);
	check("child_had_its_own_copy", WIFEXITED(status) && WEXITSTATUS(status) == 0, why);

	if (ibv_dereg_mr(mr))
		fatal("ibv_dereg_mr");
	check("dereg_makes_the_pages_private_again",
	      !maps_line_has(block + MR_OFF, "memfd:") && all(block + MR_OFF, MR_LEN, 'B') &&
		      all(block, MR_OFF, 'A'),
	      "after ibv_dereg_mr the pages are still a memfd, or lost their bytes");

	/* A chunk glibc serves with mmap (above its 128 KiB threshold), grown by mremap. */
	big = malloc(BIG);
	if (!big)
		fatal("malloc BIG");
	memset(big, 'D', BIG);
	mr = ibv_reg_mr(pd, big, BIG, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		fatal("ibv_reg_mr BIG");
	printf("info converted big %d\n", maps_line_has(big, "memfd:"));
	fflush(stdout);
	if (ibv_dereg_mr(mr))
		fatal("ibv_dereg_mr BIG");
	big = realloc(big, 16 << 20);
	if (!big)
		fatal("realloc");
	memset(big + BIG, 'E', (16 << 20) - BIG); /* SIGBUS here if the pages stayed a memfd */
	check("realloc_after_dereg_grows", all(big, BIG, 'D') && all(big + BIG, (16 << 20) - BIG, 'E'),
	      "the grown chunk lost its bytes");
	free(big);

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(src_mr);
	free(src);
	free(block);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return summary("fork_mr");
}
