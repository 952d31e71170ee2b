/*
 * hiccup: spin for 2 s reading the clock and count the gaps longer than 2, 8 and 20 us: what
 * steals a spinning CPU (interrupts, timer ticks, preemption, the hypervisor).
 * Run by scripts/hiccup.sh, one per CPU.
 */
#include <stdio.h>
#include <time.h>

static long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

int main(void)
{
	long t0 = now_ns(), last = t0, over2 = 0, over8 = 0, over20 = 0, worst = 0;

	while (last - t0 < 2000000000L) {
		long n = now_ns(), gap = n - last;

		last = n;
		over2 += gap > 2000;
		over8 += gap > 8000;
		over20 += gap > 20000;
		if (gap > worst)
			worst = gap;
	}
	printf("2 s: gaps >2us %ld, >8us %ld (one per %ld us), >20us %ld, worst %ld us\n", over2,
	       over8, over8 ? 2000000 / over8 : 0, over20, worst / 1000);
	return 0;
}
