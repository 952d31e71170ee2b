/*
 * The order rping's client tears down in (rdmacm-utils rping.c): a CM thread loops in
 * rdma_get_cm_event and handles each event before acking it, while the main thread calls
 * rdma_destroy_id and then rdma_destroy_event_channel. rdma_cm's rules (rdma_destroy_id(3),
 * rdma_ack_cm_event(3)):
 *
 *  - rdma_destroy_id returns only once every event the program got for the id is acked, so
 *    the handler may still read event->id->context while the main thread destroys the id;
 *  - a thread blocked in rdma_get_cm_event when the channel is destroyed stays blocked (as a
 *    read on rdma_cm's fd does after another thread closed it): it neither returns an error
 *    (rping would exit with one) nor touches freed memory. The process then exits with the
 *    thread still blocked, as rping does.
 *
 * Last, the thread that comes back too late: rping's CM thread acks DISCONNECTED and calls
 * rdma_get_cm_event again, and under load the main thread may have destroyed the channel
 * in between. That call waits as the one already waiting does (an error would make rping
 * exit with it; the drop-in once read the freed channel there and closed its fds twice,
 * which aborted rping). On a non-blocking channel it fails with EBADF, as a read on
 * rdma_cm's closed fd does.
 *
 * First, the same wait in rdma_migrate_id (rdma_migrate_id(3): it blocks while there are
 * unacknowledged events on the id's current channel): a thread holds an event of an id while
 * the main thread migrates that id to another channel.
 *
 * The event is the ADDR_RESOLVED of a loopback address. Prints "ok"; exits 1 with what
 * differed otherwise.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAGIC ((void *)0x5eed)

static struct rdma_event_channel *ch;
static atomic_int got;     /* the thread holds the event */
static atomic_int acked;   /* ...and is about to ack it */
static atomic_int returned; /* its next rdma_get_cm_event returned */

static void fail(const char *what)
{
    fprintf(stderr, "%s\n", what);
    exit(1);
}

static atomic_int m_got, m_acked; /* the migrate phase's thread holds / acks its event */

static void *migrate_thread(void *arg)
{
    struct rdma_cm_event *e;
    if (rdma_get_cm_event(arg, &e))
        fail("rdma_get_cm_event (migrate phase)");
    atomic_store(&m_got, 1);
    usleep(200 * 1000);
    atomic_store(&m_acked, 1);
    rdma_ack_cm_event(e);
    return NULL;
}

static void resolve(struct rdma_cm_id *id)
{
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7600)};
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000))
        fail("rdma_resolve_addr");
}

static void migrate_waits_for_the_ack(void)
{
    struct rdma_event_channel *from = rdma_create_event_channel(), *to = rdma_create_event_channel();
    struct rdma_cm_id *id;
    pthread_t t;
    if (!from || !to)
        fail("rdma_create_event_channel (migrate phase)");
    if (rdma_create_id(from, &id, MAGIC, RDMA_PS_TCP))
        fail("rdma_create_id (migrate phase)");
    resolve(id);
    if (pthread_create(&t, NULL, migrate_thread, from))
        fail("pthread_create");
    while (!atomic_load(&m_got))
        usleep(1000);
    if (rdma_migrate_id(id, to))
        fail("rdma_migrate_id");
    if (!atomic_load(&m_acked))
        fail("rdma_migrate_id returned before the event was acked");
    pthread_join(t, NULL);
    if (id->channel != to)
        fail("the id is not on the new channel");
    if (rdma_destroy_id(id))
        fail("rdma_destroy_id (migrate phase)");
    rdma_destroy_event_channel(from);
    rdma_destroy_event_channel(to);
}

static void *cm_thread(void *arg)
{
    (void)arg;
    struct rdma_cm_event *e;
    if (rdma_get_cm_event(ch, &e))
        fail("rdma_get_cm_event (first)");
    if (e->event != RDMA_CM_EVENT_ADDR_RESOLVED)
        fail("not ADDR_RESOLVED");
    atomic_store(&got, 1);
    /* A slow handler: the main thread is in rdma_destroy_id meanwhile. */
    usleep(200 * 1000);
    if (e->id->context != MAGIC)
        fail("the event's id changed under the handler");
    atomic_store(&acked, 1);
    rdma_ack_cm_event(e);
    /* As rping's CM thread: straight back into the wait. */
    int r = rdma_get_cm_event(ch, &e);
    atomic_store(&returned, r == 0 ? 1 : 2);
    if (r)
        perror("rdma_get_cm_event (after destroy)");
    return NULL;
}

static atomic_int late_returned;

static void *late_thread(void *arg)
{
    struct rdma_cm_event *e;
    int r = rdma_get_cm_event(arg, &e);
    atomic_store(&late_returned, r == 0 ? 1 : 2);
    return NULL;
}

static void late_callers_after_destroy(void)
{
    struct rdma_event_channel *c = rdma_create_event_channel();
    pthread_t t;
    if (!c)
        fail("rdma_create_event_channel (late phase)");
    rdma_destroy_event_channel(c);
    if (pthread_create(&t, NULL, late_thread, c))
        fail("pthread_create");
    pthread_detach(t);
    usleep(200 * 1000);
    if (atomic_load(&late_returned))
        fail("a blocking rdma_get_cm_event on a just-destroyed channel returned");

    struct rdma_event_channel *nb = rdma_create_event_channel();
    struct rdma_cm_event *e;
    if (!nb)
        fail("rdma_create_event_channel (late phase, non-blocking)");
    if (fcntl(nb->fd, F_SETFL, fcntl(nb->fd, F_GETFL) | O_NONBLOCK))
        fail("fcntl");
    if (rdma_get_cm_event(nb, &e) == 0 || errno != EAGAIN)
        fail("an empty non-blocking channel did not fail with EAGAIN");
    rdma_destroy_event_channel(nb);
    if (rdma_get_cm_event(nb, &e) == 0 || errno != EBADF)
        fail("a destroyed non-blocking channel did not fail with EBADF");
}

int main(void)
{
    migrate_waits_for_the_ack();
    ch = rdma_create_event_channel();
    if (!ch)
        fail("rdma_create_event_channel");
    struct rdma_cm_id *id;
    if (rdma_create_id(ch, &id, MAGIC, RDMA_PS_TCP))
        fail("rdma_create_id");
    resolve(id);
    pthread_t t;
    if (pthread_create(&t, NULL, cm_thread, NULL))
        fail("pthread_create");
    while (!atomic_load(&got))
        usleep(1000);
    if (rdma_destroy_id(id))
        fail("rdma_destroy_id");
    if (!atomic_load(&acked))
        fail("rdma_destroy_id returned before the event was acked");
    /* Let the thread get back into rdma_get_cm_event, then take the channel away. */
    usleep(100 * 1000);
    rdma_destroy_event_channel(ch);
    usleep(300 * 1000);
    if (atomic_load(&returned))
        fail("rdma_get_cm_event returned after the channel was destroyed");
    late_callers_after_destroy();
    printf("ok\n");
    fflush(stdout);
    return 0;
}
