/*
 * mem_semantics: registering memory must not change what a later legal operation on the
 * program's own memory does (issue 35, item 6; docs/design/registered-memory.md, "What registration
 * must not change"). The Rust side runs this with sharing on (the default) and with
 * SOFTVERBS_SHARED_MR=0, where nothing is converted, as with a NIC: every check must hold in
 * both.
 *
 * - mlock: a locked range stays locked (VmFlags "lo") after ibv_reg_mr;
 * - MADV_DONTFORK: a child forked while the range is registered does not have it (a read
 *   there is SIGSEGV), and the range keeps "dc";
 * - MADV_WIPEONFORK: such a child reads zeros there, and the range keeps "wf";
 * - the program's own pthread_atfork child handler, installed before any verbs call, that
 *   writes a registered buffer writes the child's copy, never the parent's;
 * - realloc of a registered malloc'd chunk (mmapped: glibc grows it with mremap) grows it and
 *   keeps its bytes (no SIGBUS).
 *
 * Prints "ok <check>" or "FAIL <check>: ..." per check, "info converted <what> <0|1>"
 * (whether registration shared the pages), then a summary line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

#define PAGE 4096
#define LEN (4 * PAGE)
/* A chunk glibc serves with mmap (above its 128 KiB threshold) and grows with mremap. */
#define BIG (5 << 20)
#define BIGGER (16 << 20)

static int all(const unsigned char *p, size_t n, unsigned char v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

/* Whether the VmFlags line of the /proc/self/smaps entry holding `p` has flag `f` (two
 * letters, proc(5)). */
static int vm_flag(const void *p, const char *f)
{
	char line[512], want[8];
	FILE *s = fopen("/proc/self/smaps", "r");
	int in = 0, yes = 0;

	if (!s)
		fatal("fopen /proc/self/smaps");
	snprintf(want, sizeof(want), " %s", f);
	while (fgets(line, sizeof(line), s)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = lo <= (unsigned long)p && (unsigned long)p < hi;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			yes = strstr(line, want) != NULL;
			break;
		}
	}
	fclose(s);
	return yes;
}

static unsigned char *fresh(unsigned char fill)
{
	unsigned char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
				0);

	if (p == MAP_FAILED)
		fatal("mmap");
	memset(p, fill, LEN);
	return p;
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *p, size_t n, const char *what)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, p, n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);

	if (!mr)
		fatal(what);
	printf("info converted %s %d\n", what, maps_line_has(p, "memfd:"));
	fflush(stdout);
	return mr;
}

/* The status of a child that runs `f(p)` and exits with what it returns. */
static int in_child(int (*f)(unsigned char *), unsigned char *p)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		fatal("fork");
	if (pid == 0)
		_exit(f(p));
	if (waitpid(pid, &status, 0) != pid)
		fatal("waitpid");
	return status;
}

static int reads_first_byte(unsigned char *p)
{
	return *(volatile unsigned char *)p;
}

static int sees_zeros(unsigned char *p)
{
	return all(p, LEN, 0) ? 0 : 1;
}

static int exits_at_once(unsigned char *p)
{
	(void)p;
	return 0;
}

/* The program's own child handler: writes the buffer it is pointed at. */
static unsigned char *atfork_target;

static void program_child_handler(void)
{
	if (atfork_target)
		memset(atfork_target, 'X', LEN);
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	unsigned char *p, *big;
	int status;
	char why[200];

	/* Before any verbs call, as a program's own initialisation would. */
	if (pthread_atfork(NULL, NULL, program_child_handler))
		fatal("pthread_atfork");
	ctx = open_first_device(&pd, &cq, 8);

	p = fresh('L');
	if (mlock(p, LEN))
		fatal("mlock");
	mr = reg(pd, p, LEN, "mlock");
	check("mlock_stays_locked", vm_flag(p, "lo") && all(p, LEN, 'L'),
	      "after ibv_reg_mr the range is no longer locked (VmFlags without lo)");
	ibv_dereg_mr(mr);
	munmap(p, LEN);

	p = fresh('D');
	if (madvise(p, LEN, MADV_DONTFORK))
		fatal("madvise DONTFORK");
	mr = reg(pd, p, LEN, "dontfork");
	status = in_child(reads_first_byte, p);
	snprintf(why, sizeof(why), "VmFlags dc %d; a child's read ended with status %#x, not SIGSEGV",
		 vm_flag(p, "dc"), status);
	check("dontfork_keeps_the_range_out_of_children",
	      vm_flag(p, "dc") && WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, why);
	ibv_dereg_mr(mr);
	munmap(p, LEN);

	p = fresh('W');
	if (madvise(p, LEN, MADV_WIPEONFORK))
		fatal("madvise WIPEONFORK");
	mr = reg(pd, p, LEN, "wipeonfork");
	status = in_child(sees_zeros, p);
	snprintf(why, sizeof(why), "VmFlags wf %d; the child ended with status %#x (1: not zeros)",
		 vm_flag(p, "wf"), status);
	check("wipeonfork_children_see_zeros",
	      vm_flag(p, "wf") && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
		      all(p, LEN, 'W'),
	      why);
	ibv_dereg_mr(mr);
	munmap(p, LEN);

	p = malloc(LEN);
	if (!p)
		fatal("malloc");
	memset(p, 'A', LEN);
	mr = reg(pd, p, LEN, "atfork");
	atfork_target = p;
	status = in_child(exits_at_once, p);
	atfork_target = NULL;
	check("program_atfork_handler_writes_the_childs_copy",
	      WIFEXITED(status) && all(p, LEN, 'A'),
	      "the program's own child handler wrote into the parent's buffer");
	ibv_dereg_mr(mr);
	free(p);

	big = malloc(BIG);
	if (!big)
		fatal("malloc BIG");
	memset(big, 'R', BIG);
	mr = reg(pd, big, BIG, "realloc");
	big = realloc(big, BIGGER);
	if (!big)
		fatal("realloc");
	memset(big + BIG, 'S', BIGGER - BIG); /* SIGBUS here if the grown part is past a memfd's end */
	check("realloc_of_a_registered_chunk_grows",
	      all(big, BIG, 'R') && all(big + BIG, BIGGER - BIG, 'S'),
	      "the grown chunk lost its bytes");
	ibv_dereg_mr(mr);
	free(big);

	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return summary("mem_semantics");
}
