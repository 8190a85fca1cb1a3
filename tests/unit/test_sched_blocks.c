/* test_sched_blocks.c - the scheduler's pure parts: block manager (refcounts, free list,
 * LRU reclaim), prefix cache (hash chain, collision safety), tier queue; and a random
 * alloc/share/free/cancel run that must leave every block free. */
#include <stdint.h>
#include <string.h>

#include "sched/blocks.h"
#include "sched/tierq.h"
#include "test.h"

static void
check(const sp_blocks_t *b)
{
    char err[256];
    if (!sp_blocks_check(b, err, sizeof err)) {
        SP_TEST_FAIL("blocks inconsistent: %s", err);
    }
}

static void
fill(int32_t *t, int32_t base)
{
    for (int i = 0; i < SP_KV_BLOCK; i++) {
        t[i] = base + i;
    }
}

TEST(blocks_refcount_and_free_list)
{
    sp_blocks_t *b = NULL;
    char err[128];
    ASSERT_EQ(sp_blocks_create(0, &b, err, sizeof err), SP_ERR_INVALID);
    ASSERT_OK(sp_blocks_create(3, &b, err, sizeof err));
    int32_t a = sp_blocks_alloc(b), c = sp_blocks_alloc(b), d = sp_blocks_alloc(b);
    ASSERT(a >= 0 && c >= 0 && d >= 0 && a != c && c != d && a != d);
    ASSERT_EQ(sp_blocks_alloc(b), -1);
    ASSERT_EQ(sp_blocks_available(b), 0);
    sp_blocks_ref(b, a);
    ASSERT_EQ(sp_blocks_refcount(b, a), 2);
    sp_blocks_unref(b, a);
    ASSERT_EQ(sp_blocks_available(b), 0);
    sp_blocks_unref(b, a);
    ASSERT_EQ(sp_blocks_available(b), 1);
    sp_blocks_unref(b, a); /* extra unref: ignored, lists intact */
    check(b);
    ASSERT_EQ(sp_blocks_alloc(b), a);
    sp_blocks_unref(b, a);
    sp_blocks_unref(b, c);
    sp_blocks_unref(b, d);
    sp_blocks_stats_t st;
    sp_blocks_get_stats(b, &st);
    ASSERT_EQ(st.n_free, 3);
    ASSERT_EQ(st.n_held, 0);
    check(b);
    sp_blocks_destroy(b);
}

TEST(blocks_prefix_chain_and_lru)
{
    sp_blocks_t *b = NULL;
    char err[128];
    ASSERT_OK(sp_blocks_create(4, &b, err, sizeof err));
    int32_t t0[SP_KV_BLOCK], t1[SP_KV_BLOCK], t2[SP_KV_BLOCK];
    fill(t0, 100);
    fill(t1, 200);
    fill(t2, 300);
    uint64_t h0 = sp_blocks_hash(0, t0), h1 = sp_blocks_hash(h0, t1);
    ASSERT(h0 != h1);
    ASSERT(sp_blocks_hash(0, t1) != h1); /* chained: the same tokens after another prefix differ */
    /* sequence A computes two blocks and publishes them */
    int32_t a0 = sp_blocks_alloc(b), a1 = sp_blocks_alloc(b);
    uint64_t s0 = sp_blocks_publish(b, a0, h0, SP_BLOCKS_ROOT, t0);
    uint64_t s1 = sp_blocks_publish(b, a1, h1, s0, t1);
    ASSERT(s0 != 0 && s1 != 0 && s0 != s1);
    ASSERT_EQ(sp_blocks_publish(b, a0, h0, SP_BLOCKS_ROOT, t0), s0); /* idempotent */
    /* B shares both while A still holds them */
    uint64_t ss;
    ASSERT_EQ(sp_blocks_lookup(b, h0, SP_BLOCKS_ROOT, t0, &ss), a0);
    ASSERT_EQ(ss, s0);
    ASSERT_EQ(sp_blocks_lookup(b, h1, ss, t1, &ss), a1);
    ASSERT_EQ(sp_blocks_refcount(b, a1), 2);
    /* wrong parent or wrong tokens under the same hash: miss (collision safety) */
    ASSERT_EQ(sp_blocks_lookup(b, h1, s1, t1, &ss), -1);
    ASSERT_EQ(sp_blocks_lookup(b, h1, s0, t2, &ss), -1);
    /* a duplicate computed elsewhere stays private but chains on the original */
    int32_t dup = sp_blocks_alloc(b);
    ASSERT_EQ(sp_blocks_publish(b, dup, h0, SP_BLOCKS_ROOT, t0), s0);
    sp_blocks_unref(b, dup);
    sp_blocks_stats_t st;
    sp_blocks_get_stats(b, &st);
    ASSERT_EQ(st.n_free, 2);
    ASSERT_EQ(st.lookups, 4);
    ASSERT_EQ(st.hits, 2);
    /* release all: both cached (a0 released first = older) */
    sp_blocks_unref(b, a0);
    sp_blocks_unref(b, a0);
    sp_blocks_unref(b, a1);
    sp_blocks_unref(b, a1);
    sp_blocks_get_stats(b, &st);
    ASSERT_EQ(st.n_cached, 2);
    ASSERT_EQ(sp_blocks_available(b), 4);
    check(b);
    /* a hit on a cached block takes it out of the LRU */
    ASSERT_EQ(sp_blocks_lookup(b, h0, SP_BLOCKS_ROOT, t0, &ss), a0);
    sp_blocks_unref(b, a0); /* now a0 is the newest, a1 the oldest */
    /* free list first, then the oldest cached block */
    int32_t x = sp_blocks_alloc(b), y = sp_blocks_alloc(b);
    ASSERT(x != a0 && x != a1 && y != a0 && y != a1);
    ASSERT_EQ(sp_blocks_alloc(b), a1);
    ASSERT_EQ(sp_blocks_lookup(b, h1, s0, t1, &ss), -1); /* evicted */
    ASSERT_EQ(sp_blocks_lookup(b, h0, SP_BLOCKS_ROOT, t0, &ss), a0);
    sp_blocks_get_stats(b, &st);
    ASSERT_EQ(st.evictions, 1);
    ASSERT_EQ(st.n_held, 4);
    check(b);
    sp_blocks_destroy(b);
}

static uint64_t rng_state = 88172645463325252ull;
static uint32_t
rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* Sequences as the scheduler drives them: look up a prompt's full blocks, allocate the
 * rest (preempting - releasing - another sequence when none is left), publish full
 * blocks, finish or get cancelled. Afterwards every block must be free or cached. */
TEST(blocks_random_no_leak)
{
    enum { NB = 48, NS = 8, MAXB = 12 };
    sp_blocks_t *b = NULL;
    char err[128];
    ASSERT_OK(sp_blocks_create(NB, &b, err, sizeof err));
    int32_t table[NS][MAXB];
    int n_tab[NS] = {0};
    int32_t toks[MAXB * SP_KV_BLOCK];
    for (int req = 0; req < 1000; req++) {
        int s = (int)rnd(NS);
        /* release whatever s held (finished, cancelled or preempted) */
        for (int i = 0; i < n_tab[s]; i++) {
            sp_blocks_unref(b, table[s][i]);
        }
        n_tab[s] = 0;
        if (rnd(4) == 0) {
            continue; /* cancelled before it started */
        }
        /* prompts from a few shared prefixes so that lookups hit */
        int nblk = 1 + (int)rnd(MAXB);
        int family = (int)rnd(3);
        for (int i = 0; i < nblk * SP_KV_BLOCK; i++) {
            toks[i] = i < 2 * SP_KV_BLOCK ? family * 1000 + i : (int32_t)rnd(50);
        }
        uint64_t h = 0, serial = SP_BLOCKS_ROOT;
        int i = 0;
        for (; i < nblk; i++) {
            uint64_t hh = sp_blocks_hash(h, toks + i * SP_KV_BLOCK), ns;
            int32_t id = sp_blocks_lookup(b, hh, serial, toks + i * SP_KV_BLOCK, &ns);
            if (id < 0) {
                break;
            }
            table[s][n_tab[s]++] = id;
            h = hh;
            serial = ns;
        }
        for (; i < nblk; i++) {
            int32_t id = sp_blocks_alloc(b);
            while (id < 0) {
                /* preempt a random other sequence that holds blocks */
                int v = (int)rnd(NS);
                if (v == s || n_tab[v] == 0) {
                    bool any = false;
                    for (int k = 0; k < NS; k++) {
                        any |= k != s && n_tab[k] > 0;
                    }
                    ASSERT(any);
                    continue;
                }
                for (int k = 0; k < n_tab[v]; k++) {
                    sp_blocks_unref(b, table[v][k]);
                }
                n_tab[v] = 0;
                id = sp_blocks_alloc(b);
            }
            table[s][n_tab[s]++] = id;
            uint64_t hh = sp_blocks_hash(h, toks + i * SP_KV_BLOCK);
            if (rnd(8) != 0) { /* most blocks complete and get published */
                serial = sp_blocks_publish(b, id, hh, serial, toks + i * SP_KV_BLOCK);
                h = hh;
            } else {
                break; /* the last, partial block: never published */
            }
        }
        if (req % 97 == 0) {
            check(b);
        }
    }
    for (int s = 0; s < NS; s++) {
        for (int i = 0; i < n_tab[s]; i++) {
            sp_blocks_unref(b, table[s][i]);
        }
    }
    check(b);
    sp_blocks_stats_t st;
    sp_blocks_get_stats(b, &st);
    ASSERT_EQ(st.n_held, 0);
    ASSERT_EQ(st.n_free + st.n_cached, NB);
    ASSERT(st.hits > 0 && st.hits < st.lookups);
    ASSERT(st.evictions > 0);
    /* and all of them can be allocated again */
    for (int i = 0; i < NB; i++) {
        ASSERT(sp_blocks_alloc(b) >= 0);
    }
    ASSERT_EQ(sp_blocks_alloc(b), -1);
    sp_blocks_destroy(b);
}

typedef struct item {
    sp_tierq_node_t node; /* first: the node's address is the item's */
    int id;
} item_t;

TEST(tierq_order_bounds_preempt)
{
    int64_t cap[SP_TIER_COUNT] = {2, 3, 1};
    sp_tierq_t q;
    sp_tierq_init(&q, cap);
    item_t it[8];
    for (int i = 0; i < 8; i++) {
        it[i].id = i;
        it[i].node.queued = false;
    }
    ASSERT(sp_tierq_peek(&q) == NULL);
    sp_tierq_push_back(&q, &it[0].node, SP_TIER_BATCH);
    sp_tierq_push_back(&q, &it[1].node, SP_TIER_STANDARD);
    sp_tierq_push_back(&q, &it[2].node, SP_TIER_STANDARD);
    sp_tierq_push_back(&q, &it[3].node, SP_TIER_BATCH);
    ASSERT(!sp_tierq_has_room(&q, SP_TIER_BATCH, 1));
    ASSERT(sp_tierq_has_room(&q, SP_TIER_STANDARD, 1));
    ASSERT(!sp_tierq_has_room(&q, SP_TIER_STANDARD, 2));
    ASSERT(sp_tierq_peek(&q) == &it[1].node); /* standard before batch, FIFO */
    sp_tierq_push_back(&q, &it[4].node, SP_TIER_PREMIUM);
    ASSERT(sp_tierq_peek(&q) == &it[4].node);
    sp_tierq_remove(&q, &it[4].node);
    sp_tierq_remove(&q, &it[4].node); /* twice: no-op */
    sp_tierq_remove(&q, &it[1].node);
    ASSERT(sp_tierq_peek(&q) == &it[2].node);
    /* a preempted item goes to the head of its tier, even when the tier is full */
    sp_tierq_push_front(&q, &it[5].node, SP_TIER_BATCH);
    ASSERT_EQ(q.count[SP_TIER_BATCH], 3);
    sp_tierq_remove(&q, &it[2].node);
    ASSERT(sp_tierq_peek(&q) == &it[5].node);
    sp_tierq_remove(&q, &it[5].node);
    ASSERT(sp_tierq_peek(&q) == &it[0].node);
    sp_tierq_remove(&q, &it[0].node);
    ASSERT(sp_tierq_peek(&q) == &it[3].node);
    sp_tierq_remove(&q, &it[3].node);
    ASSERT_EQ(sp_tierq_total(&q), 0);
    ASSERT_EQ(sp_tierq_tier_from_name("premium"), SP_TIER_PREMIUM);
    ASSERT_EQ(sp_tierq_tier_from_name("gold"), -1);
    ASSERT_EQ(sp_tierq_tier_from_int(-5), SP_TIER_BATCH);
    ASSERT_EQ(sp_tierq_tier_from_int(0), SP_TIER_STANDARD);
    ASSERT_EQ(sp_tierq_tier_from_int(3), SP_TIER_PREMIUM);
    ASSERT_STR_EQ(sp_tierq_tier_name(SP_TIER_BATCH), "batch");
}
