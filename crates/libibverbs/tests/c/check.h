/* What the C test programs share: one "ok NAME" / "FAIL NAME: why" line per check (the Rust
 * side compares the names with its list), a fatal exit for setup that cannot go on, and a
 * connected RC QP of this context (GID index 0 of port 1: loopback through the daemon). */
#ifndef SOFTVERBS_TEST_CHECK_H
#define SOFTVERBS_TEST_CHECK_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

static int checks, failures;

static inline void check(const char *name, int ok, const char *what)
{
	checks++;
	if (ok) {
		printf("ok %s\n", name);
	} else {
		failures++;
		printf("FAIL %s: %s (errno %d)\n", name, what, errno);
	}
	fflush(stdout);
}

static inline void fatal(const char *what)
{
	printf("FATAL %s: %s\n", what, strerror(errno));
	exit(2);
}

/* The closing line the Rust side expects; the exit status of the program. */
static inline int summary(const char *prog)
{
	printf("%s: %d checks, %d failed\n", prog, checks, failures);
	return failures != 0;
}

/* The first device's context (fatal if there is none). */
static inline struct ibv_context *open_first_context(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;

	if (!list || !list[0])
		fatal("ibv_get_device_list");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		fatal("ibv_open_device");
	ibv_free_device_list(list);
	return ctx;
}

/* The first device's context, with a PD and a CQ of `cqe` entries on it (fatal if any is
 * missing). */
static inline struct ibv_context *open_first_device(struct ibv_pd **pd, struct ibv_cq **cq,
						    int cqe)
{
	struct ibv_context *ctx = open_first_context();

	*pd = ibv_alloc_pd(ctx);
	*cq = ibv_create_cq(ctx, cqe, NULL, NULL, 0);
	if (!*pd || !*cq)
		fatal("alloc_pd/create_cq");
	return ctx;
}

static inline struct ibv_qp *new_rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t wrs,
				       uint32_t send_sges)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = wrs;
	a.cap.max_recv_wr = wrs;
	a.cap.max_send_sge = send_sges;
	a.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &a);
	if (!qp)
		fatal("ibv_create_qp");
	return qp;
}

/* The status of the next completion of `cq`, polling for it (fatal after ~a minute). */
static inline int wait_one_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	for (long spins = 0; spins < 200000000; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n < 0)
			fatal("ibv_poll_cq");
		if (n == 1)
			return wc.status;
	}
	errno = ETIMEDOUT;
	fatal("no completion");
	return -1;
}

/* Posts one signalled RDMA operation `op` of `len` bytes from/to `local` (under `lkey`) and
 * `remote` (under `rkey`) on `qp`, and returns the status of its completion on `cq`. */
static inline int rdma_op(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
			  void *local, uint32_t len, uint32_t lkey, void *remote, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = op;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = (uintptr_t)remote;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		fatal("ibv_post_send");
	return wait_one_wc(cq);
}

/* Whether the /proc/self/maps line of the mapping holding `p` contains `what` (e.g. "memfd:",
 * which a page the library shared in place at registration shows). */
static inline int maps_line_has(const void *p, const char *what)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	int yes = 0;

	if (!f)
		fatal("fopen /proc/self/maps");
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= (unsigned long)p &&
		    (unsigned long)p < hi) {
			yes = strstr(line, what) != NULL;
			break;
		}
	}
	fclose(f);
	return yes;
}

/* A GID as 32 hex digits on stdout, and back from them (how the test programs exchange
 * addresses over their stdio). */
static inline void print_gid(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		printf("%02x", g->raw[i]);
}

static inline void parse_gid(const char *hex, union ibv_gid *g)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(hex + 2 * i, "%2x", &v);
		g->raw[i] = (uint8_t)v;
	}
}

/* RESET -> INIT -> RTR -> RTS towards `remote` at `gid`, with remote `access`. */
static inline void connect_rc(struct ibv_qp *qp, const union ibv_gid *gid, uint32_t remote,
			      unsigned int access)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fatal("modify to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fatal("modify to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fatal("modify to RTS");
}

#endif
