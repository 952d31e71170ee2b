/*
 * concurrent_reg: a second thread keeps writing a buffer while the first registers it with
 * ibv_reg_mr, and no write is lost or torn (docs/design/registered-memory.md, "Registration while
 * other threads write"). The buffer is three private anonymous pages; the registered range
 * starts 40 bytes into the first and ends 40 bytes before the end of the last, so the
 * writer also writes bytes on the same pages just outside the MR, as a neighbouring object
 * would. Each round the writer stores every 8-byte word of the three pages exactly once,
 * one after another with a short pause, a value that names the round and the word; the
 * main thread registers while that sweep runs. Afterwards every word must hold its value
 * (a write lost to a conversion of the pages would leave the old one), an RDMA READ of the
 * MR must return what the program sees, and an RDMA WRITE into it must land while the
 * words outside it keep their values.
 *
 * Run with the default registration and with SOFTVERBS_SHARED_MR=1 (which turns the pages
 * into shared memory in place while the writer runs).
 *
 * Prints "ok <check>" or "FAIL <check>: ..." per check, then a summary line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "check.h"

#define PAGE 4096
#define PAGES 3
#define WORDS (PAGES * PAGE / 8)
#define EDGE 40
#define ROUNDS 40

struct sweep {
	volatile uint64_t *words;
	uint64_t round;
	long step_ns; /* pause between two words */
	volatile int started; /* words written so far */
};

static uint64_t value(uint64_t round, uint64_t i)
{
	return (round << 32) | (i + 1) | 0x8000000000000000ull;
}

static long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* One store per word, paced so that the sweep outlasts ibv_reg_mr. */
static void *writer(void *arg)
{
	struct sweep *s = arg;
	long t0 = now_ns();

	for (uint64_t i = 0; i < WORDS; i++) {
		__atomic_store_n(&s->words[i], value(s->round, i), __ATOMIC_RELAXED);
		__atomic_store_n(&s->started, (int)i + 1, __ATOMIC_RELEASE);
		while (now_ns() - t0 < (long)(i + 1) * s->step_ns)
			;
	}
	return NULL;
}

static int rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, struct ibv_mr *local,
		uint32_t len, void *remote, uint32_t rkey)
{
	return rdma_op(qp, cq, op, local->addr, len, local->lkey, remote, rkey);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	struct ibv_mr *local;
	union ibv_gid gid;
	unsigned char *copy;
	long lost = 0, first_lost = -1, read_wrong = 0, write_wrong = 0, outside_wrong = 0;
	long concurrent = 0, reg_failed = 0, ops_failed = 0, shared = 0;
	const uint32_t mr_len = PAGES * PAGE - 2 * EDGE;
	long step_ns = 200;
	char why[200];

	ctx = open_first_device(&pd, &cq, 8);
	copy = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (copy == MAP_FAILED)
		fatal("mmap");
	local = ibv_reg_mr(pd, copy, PAGES * PAGE, IBV_ACCESS_LOCAL_WRITE);
	if (!local)
		fatal("ibv_reg_mr local");
	a = new_rc_qp(pd, cq, 4, 1);
	b = new_rc_qp(pd, cq, 4, 1);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	connect_rc(a, &gid, b->qp_num, 0);
	connect_rc(b, &gid, a->qp_num,
		   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE);

	for (uint64_t round = 1; round <= ROUNDS; round++) {
		unsigned char *buf = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE,
					  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct sweep s = { .words = (volatile uint64_t *)buf,
				   .round = round,
				   .step_ns = step_ns,
				   .started = 0 };
		pthread_t t;
		struct ibv_mr *mr;
		int during;

		if (buf == MAP_FAILED)
			fatal("mmap");
		memset(buf, 0, PAGES * PAGE); /* present pages, all words 0 */
		if (pthread_create(&t, NULL, writer, &s))
			fatal("pthread_create");
		while (__atomic_load_n(&s.started, __ATOMIC_ACQUIRE) < 16)
			;
		mr = ibv_reg_mr(pd, buf + EDGE, mr_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					IBV_ACCESS_REMOTE_READ);
		during = __atomic_load_n(&s.started, __ATOMIC_ACQUIRE) < WORDS;
		concurrent += during;
		/* The sweep should outlast the registration: slower next time if it did not. */
		if (!during && step_ns < 100000)
			step_ns *= 2;
		pthread_join(t, NULL);
		if (!mr) {
			reg_failed++;
			munmap(buf, PAGES * PAGE);
			continue;
		}
		shared += maps_line_has(buf, "memfd:");
		for (uint64_t i = 0; i < WORDS; i++) {
			uint64_t got = s.words[i];
			if (got != value(round, i)) {
				if (first_lost < 0)
					first_lost = (long)(i * 8);
				lost++;
			}
		}
		/* What the device reads is what the program sees. */
		memset(copy, 0, PAGES * PAGE);
		if (rdma(a, cq, IBV_WR_RDMA_READ, local, mr_len, buf + EDGE, mr->rkey))
			ops_failed++;
		else if (memcmp(copy, buf + EDGE, mr_len))
			read_wrong++;
		/* What the device writes lands, and nothing around it. */
		memset(copy, (int)(0x40 + round), PAGES * PAGE);
		if (rdma(a, cq, IBV_WR_RDMA_WRITE, local, mr_len, buf + EDGE, mr->rkey))
			ops_failed++;
		else if (memcmp(copy, buf + EDGE, mr_len))
			write_wrong++;
		for (uint64_t i = 0; i < EDGE / 8; i++) {
			if (s.words[i] != value(round, i) ||
			    s.words[WORDS - 1 - i] != value(round, WORDS - 1 - i))
				outside_wrong++;
		}
		ibv_dereg_mr(mr);
		munmap(buf, PAGES * PAGE);
	}

	snprintf(why, sizeof(why), "%ld of %d registrations failed", reg_failed, ROUNDS);
	check("reg_mr_while_another_thread_writes", reg_failed == 0, why);
	snprintf(why, sizeof(why), "%ld words of %d rounds lost their write (first at byte %ld)",
		 lost, ROUNDS, first_lost);
	check("no_write_lost_or_torn", lost == 0, why);
	snprintf(why, sizeof(why), "%ld RDMA operations failed, %ld READs returned other bytes",
		 ops_failed, read_wrong);
	check("rdma_read_sees_what_the_program_wrote", ops_failed == 0 && read_wrong == 0, why);
	snprintf(why, sizeof(why), "%ld WRITEs did not land, %ld words beside the MR changed",
		 write_wrong, outside_wrong);
	check("rdma_write_lands_and_neighbours_keep_theirs",
	      ops_failed == 0 && write_wrong == 0 && outside_wrong == 0, why);
	/* Informational: in how many rounds the writer was still writing when ibv_reg_mr returned. */
	printf("info rounds with the writer still running after ibv_reg_mr: %ld of %d\n", concurrent,
	       ROUNDS);
	/* Informational: how many registrations turned the pages into shared memory. */
	printf("info converted %ld of %d\n", shared, ROUNDS);

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(local);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return summary("concurrent_reg");
}
