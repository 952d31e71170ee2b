/*
 * nondumpable: two processes of one uid (this program and a child it forks before any verbs
 * call), each with its own context, connect an RC QP each to the other's and ping-pong SENDs
 * and RDMA WRITEs (issue 35, item 5; docs/design/direct-path.md, "Who goes direct"). The child
 * makes itself not dumpable, prctl(PR_SET_DUMPABLE, 0), as privilege-dropping programs do:
 *
 *   nondumpable none   neither does (the control: the pair goes direct)
 *   nondumpable early  the child before it opens the device (it must still be able to)
 *   nondumpable late   the child after it opened the device, before it connects
 *
 * A same-uid process may not open a non-dumpable process's /proc/<pid>/mem (ptrace(2),
 * "Ptrace access mode checking"), so the daemon must not hand it one: each side prints
 * "info holds_peer_mem <side> <0|1>", whether it holds a descriptor of the other's
 * /proc/<pid>/mem after the traffic, and "ok side<N>_pingpong" when every message arrived.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

#define ROUNDS 50
#define MSG 64
/* The buffer: [0, MSG) sent from, [MSG, 2 MSG) received into, [2 MSG, 3 MSG) written to. */
#define BUF (3 * MSG)

struct addr {
	uint32_t qpn, rkey;
	uint64_t addr;
};

static void put(int fd, const void *p, size_t n)
{
	if (write(fd, p, n) != (ssize_t)n)
		fatal("write to the other side");
}

static void get(int fd, void *p, size_t n)
{
	if (read(fd, p, n) != (ssize_t)n)
		fatal("read from the other side");
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr + MSG, .length = MSG, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(qp, &wr, &bad))
		fatal("ibv_post_recv");
}

/* Whether this process holds a descriptor of /proc/<pid>/mem. */
static int holds_mem_of(pid_t pid)
{
	char want[64], link[256], path[300];
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int yes = 0;

	if (!d)
		fatal("opendir /proc/self/fd");
	snprintf(want, sizeof(want), "/proc/%d/mem", (int)pid);
	while ((e = readdir(d))) {
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n < 0)
			continue;
		link[n] = 0;
		if (!strcmp(link, want))
			yes = 1;
	}
	closedir(d);
	return yes;
}

/* One side: returns the number of rounds that failed. */
static int side(int me, const char *mode, int out, int in, pid_t other)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	union ibv_gid gid;
	struct addr mine, theirs;
	unsigned char *buf;
	int bad = 0;
	char c = 0;

	if (me == 1 && !strcmp(mode, "early") && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
		fatal("prctl");
	ctx = open_first_device(&pd, &cq, 16);
	if (me == 1 && !strcmp(mode, "late") && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
		fatal("prctl");
	buf = calloc(1, BUF);
	if (!buf)
		fatal("calloc");
	mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		fatal("ibv_reg_mr");
	qp = new_rc_qp(pd, cq, 4, 1);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	mine = (struct addr){ .qpn = qp->qp_num, .rkey = mr->rkey, .addr = (uintptr_t)buf };
	put(out, &mine, sizeof(mine));
	get(in, &theirs, sizeof(theirs));
	connect_rc(qp, &gid, theirs.qpn, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	post_recv(qp, mr);
	/* Both connected, both with a receive posted. */
	put(out, &c, 1);
	get(in, &c, 1);

	for (int r = 0; r < ROUNDS; r++) {
		/* Side 0 pings, side 1 answers with the round number plus one. */
		int sender = me == 0;

		for (int turn = 0; turn < 2; turn++, sender = !sender) {
			unsigned char want = (unsigned char)(r + turn);

			if (sender) {
				memset(buf, want, MSG);
				if (rdma_op(qp, cq, IBV_WR_RDMA_WRITE, buf, MSG, mr->lkey,
					    (void *)(uintptr_t)(theirs.addr + 2 * MSG),
					    theirs.rkey) != IBV_WC_SUCCESS)
					bad++;
				if (rdma_op(qp, cq, IBV_WR_SEND, buf, MSG, mr->lkey, NULL, 0) !=
				    IBV_WC_SUCCESS)
					bad++;
			} else {
				int ok = wait_one_wc(cq) == IBV_WC_SUCCESS;
				int same = 1;

				for (int i = 0; i < MSG; i++)
					same &= buf[MSG + i] == want && buf[2 * MSG + i] == want;
				if (!ok || !same)
					bad++;
				post_recv(qp, mr);
			}
		}
	}
	printf("info holds_peer_mem %d %d\n", me, holds_mem_of(other));
	fflush(stdout);
	/* Neither side tears down while the other may still look at its descriptors. */
	put(out, &c, 1);
	get(in, &c, 1);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return bad;
}

int main(int argc, char **argv)
{
	int to_child[2], to_parent[2], status, bad;
	char why[100];
	pid_t pid;

	if (argc != 2 || (strcmp(argv[1], "none") && strcmp(argv[1], "early") &&
			  strcmp(argv[1], "late"))) {
		fprintf(stderr, "usage: nondumpable none|early|late\n");
		return 2;
	}
	if (pipe(to_child) || pipe(to_parent))
		fatal("pipe");
	pid = fork();
	if (pid < 0)
		fatal("fork");
	/* Each side keeps only its own ends: if the other dies, a read ends instead of waiting. */
	if (pid == 0) {
		close(to_child[1]);
		close(to_parent[0]);
		bad = side(1, argv[1], to_parent[1], to_child[0], getppid());
		snprintf(why, sizeof(why), "%d of %d rounds failed", bad, ROUNDS);
		check("side1_pingpong", bad == 0, why);
		_exit(bad != 0);
	}
	close(to_child[0]);
	close(to_parent[1]);
	bad = side(0, argv[1], to_child[1], to_parent[0], pid);
	snprintf(why, sizeof(why), "%d of %d rounds failed", bad, ROUNDS);
	check("side0_pingpong", bad == 0, why);
	if (waitpid(pid, &status, 0) != pid)
		fatal("waitpid");
	snprintf(why, sizeof(why), "the child ended with status %#x", status);
	check("child_exited_cleanly", WIFEXITED(status) && WEXITSTATUS(status) == 0, why);
	return summary("nondumpable");
}
