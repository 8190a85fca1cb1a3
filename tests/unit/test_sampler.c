/*
 * test_sampler.c - greedy, the filters, the seeded draw and the penalties.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/sampler.h"
#include "test.h"

static sp_sampler_t *
make(const sp_sampler_params_t *p, int32_t n_vocab)
{
    sp_sampler_t *s = NULL;
    char err[256] = "";
    sp_status_t st = sp_sampler_create(p, n_vocab, &s, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("create: %s", err);
    }
    return s;
}

/* Plain sampling: no filters, no penalties. */
static sp_sampler_params_t
plain(float temperature, uint64_t seed)
{
    sp_sampler_params_t p = sp_sampler_default_params();
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

static uint64_t
rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void
random_logits(float *l, int32_t n, uint64_t *seed)
{
    for (int32_t i = 0; i < n; i++) {
        l[i] = (float)((double)(rng_next(seed) >> 11) * 0x1.0p-53 * 20.0 - 10.0);
    }
}

TEST(sampler_greedy_argmax_lowest_id_on_ties)
{
    sp_sampler_params_t p = plain(0.0f, 1);
    sp_sampler_t *s = make(&p, 10);
    float l[10] = {0, 1, 2, 3, 9, 4, 5, 9, 1, -3};
    ASSERT_EQ(sp_sampler_sample(s, l), 4);
    float m[10] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, 7};
    ASSERT_EQ(sp_sampler_sample(s, m), 9);
    float nan_first[10] = {NAN, 1, 2, NAN, 0, 0, 0, 0, 0, 0}; /* NaN never wins */
    ASSERT_EQ(sp_sampler_sample(s, nan_first), 2);
    sp_sampler_destroy(s);
}

TEST(sampler_top_k_1_equals_greedy)
{
    enum { N = 1000 };
    static float l[N], copy[N];
    sp_sampler_params_t pg = plain(0.0f, 1), pk = sp_sampler_default_params();
    pk.top_k = 1;
    pk.temperature = 1.5f;
    sp_sampler_t *g = make(&pg, N), *k = make(&pk, N);
    uint64_t seed = 7;
    for (int round = 0; round < 50; round++) {
        random_logits(l, N, &seed);
        memcpy(copy, l, sizeof l);
        ASSERT_EQ(sp_sampler_sample(k, l), sp_sampler_sample(g, copy));
    }
    sp_sampler_destroy(g);
    sp_sampler_destroy(k);
}

static void
draw_sequence(uint64_t seed, int32_t *out, int n)
{
    enum { V = 64 };
    float l[V];
    sp_sampler_params_t p = sp_sampler_default_params();
    p.seed = seed;
    p.top_k = 0;
    p.min_p = 0.0f;
    sp_sampler_t *s = make(&p, V);
    uint64_t ls = 99; /* the logits are the same for every seed */
    for (int i = 0; i < n; i++) {
        random_logits(l, V, &ls);
        for (int j = 0; j < V; j++) {
            l[j] *= 0.2f; /* flat enough that the draw matters */
        }
        out[i] = sp_sampler_sample(s, l);
    }
    sp_sampler_destroy(s);
}

TEST(sampler_seed_determinism)
{
    enum { N = 200 };
    int32_t a[N], b[N], c[N];
    draw_sequence(1234, a, N);
    draw_sequence(1234, b, N);
    draw_sequence(1235, c, N);
    int same_ab = 0, same_ac = 0;
    for (int i = 0; i < N; i++) {
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
    }
    ASSERT_EQ(same_ab, N);
    ASSERT(same_ac < N / 2);

    /* reset(seed) replays the same draws */
    float l[16];
    sp_sampler_params_t p = plain(1.0f, 5);
    sp_sampler_t *s = make(&p, 16);
    int32_t first[32];
    for (int i = 0; i < 32; i++) {
        memset(l, 0, sizeof l);
        first[i] = sp_sampler_sample(s, l);
    }
    sp_sampler_reset(s, 5);
    for (int i = 0; i < 32; i++) {
        memset(l, 0, sizeof l);
        ASSERT_EQ(sp_sampler_sample(s, l), first[i]);
    }
    sp_sampler_destroy(s);
}

/* Frequencies of many draws against softmax(l / T): a chi-square statistic
 * with 7 degrees of freedom. 40 is far in the tail (p < 1e-5) yet an off-by-
 * one in the temperature or the cumulative walk gives thousands. */
TEST(sampler_temperature_matches_softmax)
{
    enum { V = 8, DRAWS = 200000 };
    const float base[V] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.25f};
    const float temps[] = {0.7f, 1.0f, 2.5f};
    for (size_t ti = 0; ti < sizeof(temps) / sizeof(temps[0]); ti++) {
        float T = temps[ti];
        sp_sampler_params_t p = plain(T, 42 + ti);
        sp_sampler_t *s = make(&p, V);
        long count[V] = {0};
        float l[V];
        for (int i = 0; i < DRAWS; i++) {
            memcpy(l, base, sizeof l);
            int32_t tok = sp_sampler_sample(s, l);
            ASSERT(tok >= 0 && tok < V);
            count[tok]++;
        }
        double z = 0, prob[V], chi2 = 0;
        for (int i = 0; i < V; i++) {
            z += exp(base[i] / T);
        }
        for (int i = 0; i < V; i++) {
            prob[i] = exp(base[i] / T) / z;
            double e = prob[i] * DRAWS;
            chi2 += (count[i] - e) * (count[i] - e) / e;
        }
        fprintf(stderr, "  T=%.1f chi2=%.2f (7 dof)\n", (double)T, chi2);
        ASSERT(chi2 < 40.0);
        sp_sampler_destroy(s);
    }
}

/* probabilities 0.5 0.3 0.15 0.05 at T = 1 */
static void
four_logits(float *l)
{
    l[0] = logf(0.5f);
    l[1] = logf(0.3f);
    l[2] = logf(0.15f);
    l[3] = logf(0.05f);
}

static void
histogram(sp_sampler_params_t *p, long *count)
{
    sp_sampler_t *s = make(p, 4);
    float l[4];
    memset(count, 0, 4 * sizeof(long));
    for (int i = 0; i < 20000; i++) {
        four_logits(l);
        count[sp_sampler_sample(s, l)]++;
    }
    sp_sampler_destroy(s);
}

TEST(sampler_filters_exclude_what_they_should)
{
    long c[4];
    sp_sampler_params_t p = plain(1.0f, 3);
    histogram(&p, c); /* nothing filtered: all four appear */
    ASSERT(c[0] > 0 && c[1] > 0 && c[2] > 0 && c[3] > 0);

    p = plain(1.0f, 3); /* top-p 0.75: 0.5 < 0.75 <= 0.8, keep {0, 1} */
    p.top_p = 0.75f;
    histogram(&p, c);
    ASSERT(c[0] > 0 && c[1] > 0);
    ASSERT_EQ(c[2] + c[3], 0);
    ASSERT_NEAR((double)c[0] / 20000, 0.5 / 0.8, 0.02); /* renormalised over the kept */

    p = plain(1.0f, 3); /* top-p 0.81: also the 0.15 */
    p.top_p = 0.81f;
    histogram(&p, c);
    ASSERT(c[2] > 0);
    ASSERT_EQ(c[3], 0);

    p = plain(1.0f, 3); /* min-p 0.2: floor 0.1 drops only the 0.05 */
    p.min_p = 0.2f;
    histogram(&p, c);
    ASSERT(c[2] > 0);
    ASSERT_EQ(c[3], 0);
    p.min_p = 0.5f; /* floor 0.25: keep {0, 1} */
    histogram(&p, c);
    ASSERT(c[1] > 0);
    ASSERT_EQ(c[2] + c[3], 0);

    p = plain(1.0f, 3); /* top-k 3 */
    p.top_k = 3;
    histogram(&p, c);
    ASSERT(c[2] > 0);
    ASSERT_EQ(c[3], 0);

    p = plain(1.0f, 3); /* top-p 0 still keeps the best token */
    p.top_p = 0.0f;
    histogram(&p, c);
    ASSERT_EQ(c[0], 20000);
}

/* Equal logits: the lower id counts as the better one in every cut. */
TEST(sampler_ties_go_to_the_lower_id)
{
    enum { V = 6 };
    sp_sampler_params_t p = plain(1.0f, 9);
    p.top_p = 0.5f; /* six equal: 1/6 each, three reach 0.5 */
    sp_sampler_t *s = make(&p, V);
    long c[V] = {0};
    for (int i = 0; i < 6000; i++) {
        float l[V] = {2, 2, 2, 2, 2, 2};
        c[sp_sampler_sample(s, l)]++;
    }
    ASSERT(c[0] > 0 && c[1] > 0 && c[2] > 0);
    ASSERT_EQ(c[3] + c[4] + c[5], 0);
    sp_sampler_destroy(s);

    p.top_k = 4; /* the heap path: keeps ids 0..3 of the ties, then top-p 0.5 keeps two */
    s = make(&p, V);
    memset(c, 0, sizeof c);
    for (int i = 0; i < 6000; i++) {
        float l[V] = {1, 2, 2, 2, 2, 2}; /* ids 1..4 survive top-k; top-p keeps 1, 2 */
        c[sp_sampler_sample(s, l)]++;
    }
    ASSERT(c[1] > 0 && c[2] > 0);
    ASSERT_EQ(c[0] + c[3] + c[4] + c[5], 0);
    sp_sampler_destroy(s);
}

TEST(sampler_penalties_change_exactly_the_right_logits)
{
    enum { V = 6 };
    sp_sampler_params_t p = plain(0.0f, 1);
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.penalty_last_n = 8;
    sp_sampler_t *s = make(&p, V);
    sp_sampler_accept(s, 1);
    sp_sampler_accept(s, 3);
    sp_sampler_accept(s, 3);
    sp_sampler_accept(s, 99); /* out of range: ignored */
    float l[V] = {0.5f, 2.0f, 1.0f, -1.0f, 1.9f, -4.0f};
    /* 1: 2/2 - (1*0.5 + 0.25) = 0.25;  3: -1*2 - (2*0.5 + 0.25) = -3.25 */
    ASSERT_EQ(sp_sampler_sample(s, l), 4); /* 2.0 would have won */
    ASSERT_NEAR(l[0], 0.5, 0);
    ASSERT_NEAR(l[1], 0.25, 1e-6);
    ASSERT_NEAR(l[2], 1.0, 0);
    ASSERT_NEAR(l[3], -3.25, 1e-6);
    ASSERT_NEAR(l[4], 1.9, 1e-7);
    ASSERT_NEAR(l[5], -4.0, 0);
    /* the counts survive sampling: the same again */
    float l2[V] = {0.5f, 2.0f, 1.0f, -1.0f, 1.9f, -4.0f};
    sp_sampler_sample(s, l2);
    ASSERT_NEAR(l2[1], 0.25, 1e-6);
    ASSERT_NEAR(l2[3], -3.25, 1e-6);
    /* reset forgets the history */
    sp_sampler_reset(s, 1);
    float l3[V] = {0.5f, 2.0f, 1.0f, -1.0f, 1.9f, -4.0f};
    ASSERT_EQ(sp_sampler_sample(s, l3), 1);
    ASSERT_NEAR(l3[1], 2.0, 0);
    sp_sampler_destroy(s);

    /* the window: only the last 2 accepted tokens count */
    p.penalty_last_n = 2;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    s = make(&p, V);
    int32_t hist[] = {0, 1, 2, 2, 5, 2};
    for (size_t i = 0; i < sizeof(hist) / sizeof(hist[0]); i++) {
        sp_sampler_accept(s, hist[i]);
    }
    float l4[V] = {1, 1, 1, 1, 1, 1}; /* window {5, 2}: one each */
    sp_sampler_sample(s, l4);
    ASSERT_NEAR(l4[0], 1.0, 0);
    ASSERT_NEAR(l4[1], 1.0, 0);
    ASSERT_NEAR(l4[2], 0.5, 1e-7);
    ASSERT_NEAR(l4[5], 0.5, 1e-7);
    sp_sampler_destroy(s);

    /* penalty_last_n 0 disables the penalties */
    p.penalty_last_n = 0;
    p.frequency_penalty = 2.0f;
    s = make(&p, V);
    sp_sampler_accept(s, 1);
    float l5[V] = {0, 3, 0, 0, 0, 0};
    ASSERT_EQ(sp_sampler_sample(s, l5), 1);
    ASSERT_NEAR(l5[1], 3.0, 0);
    sp_sampler_destroy(s);
}

TEST(sampler_create_rejects_bad_params)
{
    struct {
        const char *name;
        sp_sampler_params_t p;
        int32_t n_vocab;
    } bad[12];
    int n = 0;
    sp_sampler_params_t d = sp_sampler_default_params();
#define BAD(field, value)                                                                          \
    do {                                                                                           \
        bad[n].name = #field;                                                                      \
        bad[n].p = d;                                                                              \
        bad[n].p.field = value;                                                                    \
        bad[n].n_vocab = 100;                                                                      \
        n++;                                                                                       \
    } while (0)
    BAD(temperature, NAN);
    BAD(temperature, -0.5f);
    BAD(temperature, INFINITY);
    BAD(top_p, 1.5f);
    BAD(min_p, -0.1f);
    BAD(min_p, NAN);
    BAD(repeat_penalty, 0.0f);
    BAD(frequency_penalty, INFINITY);
    BAD(presence_penalty, 3.0f);
    BAD(penalty_last_n, -1);
#undef BAD
    bad[n].name = "n_vocab";
    bad[n].p = d;
    bad[n].n_vocab = 0;
    n++;
    for (int i = 0; i < n; i++) {
        char err[256] = "";
        sp_sampler_t *s = (sp_sampler_t *)&err; /* must come back NULL */
        ASSERT_EQ(sp_sampler_create(&bad[i].p, bad[i].n_vocab, &s, err, sizeof err),
                  SP_ERR_INVALID);
        ASSERT(s == NULL);
        if (strstr(err, bad[i].name) == NULL) {
            SP_TEST_FAIL("case %d: \"%s\" does not name %s", i, err, bad[i].name);
        }
    }
    sp_sampler_t *s = make(&d, 32000); /* the defaults are valid */
    sp_sampler_destroy(s);
    sp_sampler_destroy(NULL);
}

TEST(sampler_sample_allocates_nothing)
{
    enum { V = 32000 };
    static float l[V];
    sp_sampler_params_t p = sp_sampler_default_params();
    p.repeat_penalty = 1.1f;
    p.frequency_penalty = 0.1f;
    sp_sampler_t *s = make(&p, V);
    uint64_t seed = 11;
    size_t before = sp_alloc_bytes_in_use();
    sp_alloc_fail_after(0); /* any allocation inside would fail */
    int64_t t0 = sp_time_ns();
    for (int i = 0; i < 200; i++) {
        random_logits(l, V, &seed);
        int32_t tok = sp_sampler_sample(s, l);
        ASSERT(tok >= 0 && tok < V);
        sp_sampler_accept(s, tok);
    }
    double us = (double)(sp_time_ns() - t0) / 1e3 / 200;
    sp_alloc_fail_after(-1);
    ASSERT_EQ(sp_alloc_bytes_in_use(), before);
    fprintf(stderr, "  %.1f us per token (n_vocab %d, top_k 40, incl. making the logits)\n", us, V);

    /* top_k off: the full sort path */
    sp_sampler_params_t q = plain(0.8f, 1);
    q.top_p = 0.9f;
    sp_sampler_t *s2 = make(&q, V);
    sp_alloc_fail_after(0);
    t0 = sp_time_ns();
    for (int i = 0; i < 20; i++) {
        random_logits(l, V, &seed);
        int32_t tok = sp_sampler_sample(s2, l);
        ASSERT(tok >= 0 && tok < V);
    }
    us = (double)(sp_time_ns() - t0) / 1e3 / 20;
    sp_alloc_fail_after(-1);
    fprintf(stderr, "  %.1f us per token (n_vocab %d, top_k off, top_p 0.9)\n", us, V);
    sp_sampler_destroy(s2);
    sp_sampler_destroy(s);
}

TEST(sampler_degenerate_logits)
{
    enum { V = 5 };
    sp_sampler_params_t p = sp_sampler_default_params();
    sp_sampler_t *s = make(&p, V);
    float all_ninf[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    ASSERT_EQ(sp_sampler_sample(s, all_ninf), 0);
    float all_nan[V] = {NAN, NAN, NAN, NAN, NAN};
    ASSERT_EQ(sp_sampler_sample(s, all_nan), 0);
    float pinf[V] = {0, 1, INFINITY, 3, INFINITY};
    ASSERT_EQ(sp_sampler_sample(s, pinf), 2);
    float one[V] = {-INFINITY, -INFINITY, 0, -INFINITY, -INFINITY};
    ASSERT_EQ(sp_sampler_sample(s, one), 2);
    float flat[V] = {0, 0, 0, 0, 0};
    int32_t tok = sp_sampler_sample(s, flat);
    ASSERT(tok >= 0 && tok < V);
    sp_sampler_destroy(s);

    p.temperature = 1e-30f; /* tiny but not zero: effectively greedy, no NaN */
    s = make(&p, V);
    float l[V] = {0.1f, 0.3f, 0.2f, 0.0f, -1.0f};
    ASSERT_EQ(sp_sampler_sample(s, l), 1);
    sp_sampler_destroy(s);
}

/* logit_bias: added after the penalties; -100 removes the greedy token, +100 makes a
 * token the greedy one; the candidates shortcut is off (the whole row is needed). */
TEST(sampler_logit_bias)
{
    enum { V = 16 };
    float base[V];
    for (int i = 0; i < V; i++) {
        base[i] = (float)i * 0.5f; /* token 15 is the greedy one, 14 next */
    }
    sp_sampler_params_t p = sp_sampler_default_params();
    p.temperature = 0.0f;
    sp_sampler_t *s = NULL;
    char err[128];
    float l[V];
    p.n_bias = 1;
    p.bias_id[0] = 15;
    p.bias[0] = -100.0f;
    ASSERT_OK(sp_sampler_create(&p, V, &s, err, sizeof err));
    memcpy(l, base, sizeof l);
    ASSERT_EQ(sp_sampler_sample(s, l), 14);
    ASSERT_EQ(sp_sampler_candidates(s), 0);
    sp_sampler_destroy(s);
    p.bias_id[0] = 2;
    p.bias[0] = 100.0f;
    ASSERT_OK(sp_sampler_create(&p, V, &s, err, sizeof err));
    memcpy(l, base, sizeof l);
    ASSERT_EQ(sp_sampler_sample(s, l), 2);
    sp_sampler_destroy(s);
    p.bias_id[0] = V;
    ASSERT(sp_sampler_create(&p, V, &s, err, sizeof err) == SP_ERR_INVALID);
    p.bias_id[0] = 1;
    p.bias[0] = 101.0f;
    ASSERT(sp_sampler_create(&p, V, &s, err, sizeof err) == SP_ERR_INVALID);
}
