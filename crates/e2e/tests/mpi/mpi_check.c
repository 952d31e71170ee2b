/*
 * What an MPI job over softverbs must get right, checked on every rank against values each
 * rank can compute for itself (MPI-3.1 §5.8 MPI_Alltoall, §5.9.6 MPI_Allreduce, §11.3
 * MPI_Put/MPI_Get with fence synchronization §11.5.1), plus a token passed around the ring of
 * ranks (what mpi4py.bench ringtest times, for MPIs Debian's mpi4py is not built for). Built by crates/e2e/tests/mpi.rs with
 * each MPI's own mpicc. Prints one "host RANK NAME" line per rank and, on rank 0,
 * "mpi_check OK ranks=N hosts=H" after every check passed on every rank; any mismatch prints
 * what differed and aborts the job with exit status 1. An optional argument sets the number
 * of ring laps (default 10), for a job that runs until something stops it; a second, seconds
 * to wait after the checks with every connection still up.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COUNT 4096 /* 32 KiB of int64 per peer: past UCX's eager limits, so rendezvous too */

static int rank, size;

static void fail(const char *what, long at, long long got, long long want)
{
    fprintf(stderr, "rank %d: %s[%ld] = %lld, expected %lld\n", rank, what, at, got, want);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static long long cell(int from, int to, int k) { return ((long long)from << 40) | ((long long)to << 20) | k; }

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len;
    MPI_Get_processor_name(name, &len);
    printf("host %d %s\n", rank, name);
    fflush(stdout);

    /* Distinct hosts, counted on rank 0 from every rank's processor name. */
    char *names = rank == 0 ? calloc((size_t)size, MPI_MAX_PROCESSOR_NAME) : NULL;
    MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    int hosts = 0;
    if (rank == 0) {
        for (int i = 0; i < size; i++) {
            int seen = 0;
            for (int j = 0; j < i; j++)
                seen |= !strcmp(names + (size_t)i * MPI_MAX_PROCESSOR_NAME, names + (size_t)j * MPI_MAX_PROCESSOR_NAME);
            hosts += !seen;
        }
    }

    /* All-to-all: block j of rank i's send buffer goes to rank j, block i of its receive. */
    long long *sbuf = malloc(sizeof(long long) * COUNT * (size_t)size);
    long long *rbuf = malloc(sizeof(long long) * COUNT * (size_t)size);
    for (int j = 0; j < size; j++)
        for (int k = 0; k < COUNT; k++)
            sbuf[(size_t)j * COUNT + k] = cell(rank, j, k);
    memset(rbuf, 0, sizeof(long long) * COUNT * (size_t)size);
    /* The first all-to-all also makes the connections of stacks that connect on first use
     * (libfabric's ofi_rxm); rank 0 prints its time and that of a second one (information
     * only, scripts/xrc-savings.sh). */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Alltoall(sbuf, COUNT, MPI_LONG_LONG, rbuf, COUNT, MPI_LONG_LONG, MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    MPI_Alltoall(sbuf, COUNT, MPI_LONG_LONG, rbuf, COUNT, MPI_LONG_LONG, MPI_COMM_WORLD);
    double t2 = MPI_Wtime();
    if (rank == 0) {
        printf("alltoall first_ms=%.3f again_ms=%.3f\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3);
        fflush(stdout);
    }
    for (int i = 0; i < size; i++)
        for (int k = 0; k < COUNT; k++)
            if (rbuf[(size_t)i * COUNT + k] != cell(i, rank, k))
                fail("alltoall", (long)i * COUNT + k, rbuf[(size_t)i * COUNT + k], cell(i, rank, k));

    /* Allreduce: sum over ranks r of (r + 1) * (k + 1) = (k + 1) * size * (size + 1) / 2. */
    for (int k = 0; k < COUNT; k++)
        sbuf[k] = (long long)(rank + 1) * (k + 1);
    MPI_Allreduce(sbuf, rbuf, COUNT, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    for (int k = 0; k < COUNT; k++) {
        long long want = (long long)(k + 1) * size * (size + 1) / 2;
        if (rbuf[k] != want)
            fail("allreduce", k, rbuf[k], want);
    }
    int lo = rank, hi = rank;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (lo != 0 || hi != size - 1)
        fail("allreduce min/max", 0, lo * 1000LL + hi, size - 1);

    /* One-sided: each rank puts into its right neighbour's window, then gets from its left
     * neighbour's window the block that neighbour's left neighbour put there. */
    long long *base;
    MPI_Win win;
    MPI_Win_allocate((MPI_Aint)(sizeof(long long) * COUNT), sizeof(long long), MPI_INFO_NULL,
                     MPI_COMM_WORLD, &base, &win);
    for (int k = 0; k < COUNT; k++)
        base[k] = -1;
    int right = (rank + 1) % size, left = (rank + size - 1) % size, left2 = (rank + 2 * size - 2) % size;
    for (int k = 0; k < COUNT; k++)
        sbuf[k] = cell(rank, right, k);
    MPI_Win_fence(0, win);
    MPI_Put(sbuf, COUNT, MPI_LONG_LONG, right, 0, COUNT, MPI_LONG_LONG, win);
    MPI_Win_fence(0, win);
    for (int k = 0; k < COUNT; k++)
        if (base[k] != cell(left, rank, k))
            fail("put", k, base[k], cell(left, rank, k));
    memset(rbuf, 0, sizeof(long long) * COUNT);
    MPI_Get(rbuf, COUNT, MPI_LONG_LONG, left, 0, COUNT, MPI_LONG_LONG, win);
    MPI_Win_fence(0, win);
    for (int k = 0; k < COUNT; k++)
        if (rbuf[k] != cell(left2, left, k))
            fail("get", k, rbuf[k], cell(left2, left, k));
    MPI_Win_free(&win);

    /* Ring: rank 0 starts a token of COUNT values, every rank adds its rank to each and
     * passes it right; back at rank 0 every value is k + sum of ranks. */
    int laps = argc > 1 ? atoi(argv[1]) : 10;
    if (rank == 0) {
        printf("ring laps=%d\n", laps);
        fflush(stdout);
    }
    for (int lap = 0; lap < laps; lap++) {
        if (rank == 0) {
            for (int k = 0; k < COUNT; k++)
                sbuf[k] = k;
            MPI_Send(sbuf, COUNT, MPI_LONG_LONG, right, lap % 32768, MPI_COMM_WORLD);
            MPI_Recv(rbuf, COUNT, MPI_LONG_LONG, left, lap % 32768, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int k = 0; k < COUNT; k++) {
                long long want = k + (long long)size * (size - 1) / 2;
                if (rbuf[k] != want)
                    fail("ring", k, rbuf[k], want);
            }
        } else {
            MPI_Recv(rbuf, COUNT, MPI_LONG_LONG, left, lap % 32768, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int k = 0; k < COUNT; k++)
                rbuf[k] += rank;
            MPI_Send(rbuf, COUNT, MPI_LONG_LONG, right, lap % 32768, MPI_COMM_WORLD);
        }
    }

    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("mpi_check OK ranks=%d hosts=%d\n", size, hosts);
        fflush(stdout);
    }
    /* An optional second argument: seconds every rank then waits, connections still up, so
     * that the daemons' objects can be read while the job holds them (scripts/xrc-savings.sh,
     * crates/e2e/tests/cluster_ofi.rs). */
    int hold = argc > 2 ? atoi(argv[2]) : 0;
    if (hold > 0)
        sleep((unsigned)hold);
    MPI_Barrier(MPI_COMM_WORLD);
    free(sbuf);
    free(rbuf);
    free(names);
    MPI_Finalize();
    return 0;
}
