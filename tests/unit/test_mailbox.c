/*
 * test_mailbox.c - the cross-thread mailbox (sched/mailbox.h) on its own,
 * with the test thread as its owner: posts from several threads all run on
 * drain and in each poster's order; one wake per batch of posts; intrusive
 * messages, re-sent from their own run, go to the next drain; destroy runs
 * the pending calls (which free what they carry) and drops pending messages.
 */
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "core/alloc.h"
#include "sched/mailbox.h"

static atomic_int wakes;

static void
count_wake(void *ud)
{
    ASSERT(ud == &wakes);
    atomic_fetch_add(&wakes, 1);
}

/* ---- posts from several threads ----------------------------------------- */

#define POSTERS 4
#define PER_POSTER 2000

typedef struct posted {
    int poster, seq;
} posted_t;

/* Written by the calls, which run on the owner's (this) thread only. */
static int ran_total;
static int ran_last[POSTERS];
static bool ran_in_order = true;

static void
record(void *arg)
{
    posted_t *p = arg;
    if (p->seq != ran_last[p->poster] + 1) {
        ran_in_order = false;
    }
    ran_last[p->poster] = p->seq;
    ran_total++;
    sp_free(p);
}

typedef struct poster_arg {
    sp_mailbox_t *mb;
    int id;
} poster_arg_t;

static void *
poster_main(void *arg)
{
    poster_arg_t *pa = arg;
    for (int i = 1; i <= PER_POSTER; i++) {
        posted_t *p = sp_malloc(sizeof *p);
        ASSERT(p != NULL);
        p->poster = pa->id;
        p->seq = i;
        ASSERT_OK(sp_mailbox_post(pa->mb, record, p));
    }
    return NULL;
}

static void
reset_record(void)
{
    ran_total = 0;
    ran_in_order = true;
    for (int i = 0; i < POSTERS; i++) {
        ran_last[i] = 0;
    }
}

/* Nothing runs before drain; one wake for the whole burst; drain runs all of
 * it, each poster's calls in its order; the next post wakes again. */
TEST(mailbox_posts_from_threads_run_in_order_on_drain)
{
    atomic_store(&wakes, 0);
    reset_record();
    sp_mailbox_t *mb = sp_mailbox_create(count_wake, &wakes);
    ASSERT(mb != NULL);
    pthread_t th[POSTERS];
    poster_arg_t pa[POSTERS];
    for (int i = 0; i < POSTERS; i++) {
        pa[i] = (poster_arg_t){mb, i};
        ASSERT_EQ(pthread_create(&th[i], NULL, poster_main, &pa[i]), 0);
    }
    for (int i = 0; i < POSTERS; i++) {
        pthread_join(th[i], NULL);
    }
    ASSERT_EQ(ran_total, 0);
    ASSERT_EQ(atomic_load(&wakes), 1);
    sp_mailbox_drain(mb);
    ASSERT_EQ(ran_total, POSTERS * PER_POSTER);
    ASSERT(ran_in_order);
    for (int i = 0; i < POSTERS; i++) {
        ASSERT_EQ(ran_last[i], PER_POSTER);
    }
    /* Empty drain: nothing runs, no wake. */
    sp_mailbox_drain(mb);
    ASSERT_EQ(ran_total, POSTERS * PER_POSTER);
    ASSERT_EQ(atomic_load(&wakes), 1);
    /* The first post after a drain wakes the owner again, the second does not. */
    posted_t *p = sp_malloc(sizeof *p);
    *p = (posted_t){0, PER_POSTER + 1};
    ASSERT_OK(sp_mailbox_post(mb, record, p));
    ASSERT_EQ(atomic_load(&wakes), 2);
    p = sp_malloc(sizeof *p);
    *p = (posted_t){0, PER_POSTER + 2};
    ASSERT_OK(sp_mailbox_post(mb, record, p));
    ASSERT_EQ(atomic_load(&wakes), 2);
    sp_mailbox_drain(mb);
    ASSERT(ran_in_order);
    ASSERT_EQ(ran_last[0], PER_POSTER + 2);
    sp_mailbox_destroy(mb);
}

/* The owner drains while the posters post: every call still runs exactly
 * once and in its poster's order across drains, and the owner is woken at
 * most once per drain (plus the first). */
TEST(mailbox_drain_while_posting)
{
    atomic_store(&wakes, 0);
    reset_record();
    sp_mailbox_t *mb = sp_mailbox_create(count_wake, &wakes);
    ASSERT(mb != NULL);
    pthread_t th[POSTERS];
    poster_arg_t pa[POSTERS];
    for (int i = 0; i < POSTERS; i++) {
        pa[i] = (poster_arg_t){mb, i};
        ASSERT_EQ(pthread_create(&th[i], NULL, poster_main, &pa[i]), 0);
    }
    int drains = 0;
    for (int spins = 0; ran_total < POSTERS * PER_POSTER && spins < 200000; spins++) {
        sp_mailbox_drain(mb);
        drains++;
        if (!ran_in_order) {
            break;
        }
    }
    for (int i = 0; i < POSTERS; i++) {
        pthread_join(th[i], NULL);
    }
    sp_mailbox_drain(mb);
    ASSERT(ran_in_order);
    ASSERT_EQ(ran_total, POSTERS * PER_POSTER);
    ASSERT(atomic_load(&wakes) >= 1);
    ASSERT(atomic_load(&wakes) <= drains + 1);
    sp_mailbox_destroy(mb);
}

/* ---- intrusive messages --------------------------------------------------- */

typedef struct item {
    sp_mailbox_msg_t msg;
    sp_mailbox_t *mb;
    int id;
    int runs, drops;
    int resend; /* times to send itself again from run */
} item_t;

static int order[16];
static int n_order;

static void
item_run(sp_mailbox_msg_t *msg)
{
    item_t *it = (item_t *)msg;
    it->runs++;
    order[n_order++] = it->id;
    if (it->resend > 0) {
        it->resend--;
        sp_mailbox_send(it->mb, &it->msg);
    }
}

static void
item_drop(sp_mailbox_msg_t *msg)
{
    ((item_t *)msg)->drops++;
}

static int calls;

static void
count_call(void *arg)
{
    order[n_order++] = (int)(intptr_t)arg;
    calls++;
}

/* Sent messages and posted calls share one FIFO; a message re-sent from its
 * own run goes to the next drain, and wakes the owner for it. */
TEST(mailbox_send_fifo_with_posts_and_resend)
{
    atomic_store(&wakes, 0);
    n_order = 0;
    calls = 0;
    sp_mailbox_t *mb = sp_mailbox_create(count_wake, &wakes);
    ASSERT(mb != NULL);
    item_t a = {{item_run, item_drop, NULL}, mb, 1, 0, 0, 1};
    item_t b = {{item_run, NULL, NULL}, mb, 3, 0, 0, 0};
    sp_mailbox_send(mb, &a.msg);
    ASSERT_OK(sp_mailbox_post(mb, count_call, (void *)(intptr_t)2));
    sp_mailbox_send(mb, &b.msg);
    ASSERT_EQ(atomic_load(&wakes), 1);
    sp_mailbox_drain(mb);
    ASSERT_EQ(n_order, 3);
    ASSERT_EQ(order[0], 1);
    ASSERT_EQ(order[1], 2);
    ASSERT_EQ(order[2], 3);
    /* a sent itself again during the drain: not run twice in it, but queued. */
    ASSERT_EQ(a.runs, 1);
    ASSERT_EQ(atomic_load(&wakes), 2);
    sp_mailbox_drain(mb);
    ASSERT_EQ(a.runs, 2);
    ASSERT_EQ(n_order, 4);
    ASSERT_EQ(a.drops + b.drops, 0);
    sp_mailbox_destroy(mb);
}

/* ---- destroy ---------------------------------------------------------- */

static int freed;

static void
free_carried(void *arg)
{
    sp_free(arg);
    freed++;
}

/* Pending calls run at destroy (and free what they carry: the sanitizer
 * build's leak check sees it); a pending message with a drop callback is
 * dropped, not run; one without is run. Nothing runs twice. */
TEST(mailbox_destroy_runs_pending_posts_and_drops_messages)
{
    atomic_store(&wakes, 0);
    freed = 0;
    n_order = 0;
    sp_mailbox_t *mb = sp_mailbox_create(count_wake, &wakes);
    ASSERT(mb != NULL);
    for (int i = 0; i < 10; i++) {
        void *carried = sp_malloc(64);
        ASSERT(carried != NULL);
        ASSERT_OK(sp_mailbox_post(mb, free_carried, carried));
    }
    item_t a = {{item_run, item_drop, NULL}, mb, 1, 0, 0, 0};
    item_t b = {{item_run, NULL, NULL}, mb, 2, 0, 0, 0};
    sp_mailbox_send(mb, &a.msg);
    sp_mailbox_send(mb, &b.msg);
    /* One drained, then more pending at destroy. */
    sp_mailbox_drain(mb);
    ASSERT_EQ(freed, 10);
    ASSERT_EQ(a.runs, 1);
    ASSERT_EQ(b.runs, 1);
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(sp_mailbox_post(mb, free_carried, sp_malloc(32)));
    }
    sp_mailbox_send(mb, &a.msg);
    sp_mailbox_send(mb, &b.msg);
    sp_mailbox_destroy(mb);
    ASSERT_EQ(freed, 15);
    ASSERT_EQ(a.runs, 1);
    ASSERT_EQ(a.drops, 1);
    ASSERT_EQ(b.runs, 2);
    ASSERT_EQ(b.drops, 0);
    sp_mailbox_destroy(NULL);
}

/* A call run by destroy that posts again: the new call runs too. */
static sp_mailbox_t *repost_mb;

static void
repost_once(void *arg)
{
    freed++;
    if (arg != NULL) {
        ASSERT_OK(sp_mailbox_post(repost_mb, free_carried, arg));
    }
}

TEST(mailbox_destroy_runs_what_pending_calls_post)
{
    freed = 0;
    repost_mb = sp_mailbox_create(NULL, NULL);
    ASSERT(repost_mb != NULL);
    ASSERT_OK(sp_mailbox_post(repost_mb, repost_once, sp_malloc(16)));
    sp_mailbox_destroy(repost_mb);
    ASSERT_EQ(freed, 2);
}

/* A mailbox without a wake callback (the owner polls) works the same. */
TEST(mailbox_without_wake)
{
    calls = 0;
    n_order = 0;
    sp_mailbox_t *mb = sp_mailbox_create(NULL, NULL);
    ASSERT(mb != NULL);
    ASSERT_OK(sp_mailbox_post(mb, count_call, (void *)(intptr_t)7));
    sp_mailbox_drain(mb);
    ASSERT_EQ(calls, 1);
    ASSERT_EQ(order[0], 7);
    sp_mailbox_destroy(mb);
}
