/*
 * open_contexts MAX [hold]: opens up to MAX contexts of the first device with
 * ibv_open_device, each with a PD, and prints "opened N errno E" (E is the errno of the
 * open that failed, or 0). With "hold" it then keeps them until its stdin closes (or it is
 * killed), for the daemon's per-uid descriptor share (docs/guide/limits.md) to be seen full.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

int main(int argc, char **argv)
{
	int max = argc > 1 ? atoi(argv[1]) : 1;
	int hold = argc > 2 && strcmp(argv[2], "hold") == 0;
	struct ibv_device **list;
	int opened = 0, err = 0;
	char c;

	errno = 0;
	list = ibv_get_device_list(NULL);
	if (!list || !list[0]) {
		err = errno ? errno : ENODEV;
	} else {
		for (; opened < max; opened++) {
			struct ibv_context *ctx = ibv_open_device(list[0]);

			if (!ctx) {
				err = errno;
				break;
			}
			if (!ibv_alloc_pd(ctx)) {
				err = errno;
				break;
			}
		}
	}
	printf("opened %d errno %d\n", opened, err);
	fflush(stdout);
	while (hold && read(0, &c, 1) > 0)
		;
	return 0;
}
