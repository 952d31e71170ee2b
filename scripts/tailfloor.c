/*
 * tailfloor: the p99.9 / median this machine gives any ping-pong of a given round trip,
 * whatever software runs it. Two processes hand a flag back and forth through one shared
 * cache line; the initiator pads each round trip with a busy wait so that it lasts as long
 * as the round trip being judged (perftest's, say), and records one sample per round trip
 * as perftest does (half of it: one-way). What stretches the tail here is the machine:
 * interrupts, timer ticks, the hypervisor taking a CPU (scripts/hiccup.sh).
 *
 *   tailfloor <iterations> <round trip ns>
 * prints "median_us p999_us ratio". Run by scripts/compare.sh.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 5000, rtt = argc > 2 ? atol(argv[2]) : 0;
	long warm = iters / 10, *s = calloc(iters, sizeof(long));
	_Atomic long *flag = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t child;

	if (!s || flag == MAP_FAILED)
		return 1;
	*flag = 0;
	child = fork();
	if (child == 0) {
		for (long i = 1; i <= warm + iters; i++) {
			while (atomic_load_explicit(flag, memory_order_acquire) != 2 * i - 1)
				;
			atomic_store_explicit(flag, 2 * i, memory_order_release);
		}
		_exit(0);
	}
	for (long i = 1; i <= warm + iters; i++) {
		long t0 = now_ns();

		while (now_ns() - t0 < rtt)
			;
		atomic_store_explicit(flag, 2 * i - 1, memory_order_release);
		while (atomic_load_explicit(flag, memory_order_acquire) != 2 * i)
			;
		if (i > warm)
			s[i - warm - 1] = now_ns() - t0;
	}
	waitpid(child, NULL, 0);
	qsort(s, iters, sizeof(long), cmp);
	double med = s[iters / 2] / 2000.0, p999 = s[iters * 999 / 1000] / 2000.0;
	printf("%.2f %.2f %.2f\n", med, p999, p999 / med);
	return 0;
}
