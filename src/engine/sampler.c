/*
 * sampler.c - the next token from a row of logits.
 *
 * Pipeline per token (sampler.h gives the order): penalties over the recent
 * window, then either greedy argmax (temperature 0) or top-k, temperature,
 * softmax, top-p, min-p and one draw. Top-k is a heap selection (O(n log k));
 * top-p and min-p both keep a prefix of the best-first order, so min-p is
 * applied first as a plain threshold and only the survivors are sorted, and
 * only when top-p needs the order (a stable radix sort on the logit bits, ties
 * to the lower id). The result depends only on the logits, the parameters and
 * the seed: the same inputs give the same token.
 *
 * PRNG: xoshiro256** (Blackman and Vigna), its 256-bit state seeded by
 * expanding the 64-bit seed with splitmix64, as the authors recommend. Each
 * draw uses the top 53 bits of one output as a double in [0, 1).
 *
 * Candidates (sp_sampler_sample_candidates): when the parameters need only
 * the best k <= 64 logits (greedy, or a top-k of at most 64 without
 * penalties), the same pipeline runs on those k (ids and values, best
 * first, as the GPU's topk gives them): the top-k set is the same, put in
 * id order as the heap's is, and the tail from the temperature on (draw())
 * is one function for both, so the weights, their sums, the sort and the
 * draw are the same operations in the same order, and the token is the
 * same for the same seed.
 *
 * Memory: everything is sized at create from n_vocab and penalty_last_n;
 * sp_sampler_sample allocates nothing.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/kernels.h"

#define MAX_VOCAB (1 << 24)
#define MAX_PENALTY_WINDOW (1 << 20) /* tokens; the ring buffer is sized by it */

struct sp_sampler {
    sp_sampler_params_t p;
    int32_t n_vocab;
    uint64_t rng[4];     /* xoshiro256** state */
    int32_t *cand;       /* (n_vocab) candidate ids */
    float *weight;       /* (n_vocab) exp((logit - max) / T) of cand[i]; 1 for the best */
    uint64_t *key;       /* (n_vocab) sort keys of the candidates (see sort_key) */
    uint64_t *key_tmp;   /* (n_vocab) radix sort scratch */
    int32_t *count;      /* (n_vocab) occurrences of each id in the window */
    int32_t *ring;       /* (penalty_last_n) last accepted tokens, oldest at ring_head */
    int32_t ring_head;
    int32_t ring_len;
    float cval[SP_SAMPLER_MAX_CANDIDATES]; /* candidates' values, slot by slot (cand) */
    sp_exp_fn exp;       /* the CPU's vector exp (kernels.h) */
};

/* ---- PRNG -------------------------------------------------------------- */

static uint64_t
splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t
rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t
xoshiro_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static void
seed_rng(sp_sampler_t *s, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        s->rng[i] = splitmix64(&x); /* never all zero: splitmix64 is a bijection of a counter */
    }
}

static double
uniform01(sp_sampler_t *s)
{
    return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53;
}

/* ---- create / destroy -------------------------------------------------- */

sp_sampler_params_t
sp_sampler_default_params(void)
{
    sp_sampler_params_t p = {
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .frequency_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0xC0FFEE,
    };
    return p;
}

sp_status_t
sp_sampler_create(const sp_sampler_params_t *p, int32_t n_vocab, sp_sampler_t **out, char *err,
                  size_t err_len)
{
    *out = NULL;
    if (n_vocab < 1 || n_vocab > MAX_VOCAB) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: n_vocab %d out of range [1, %d]",
                       (int)n_vocab, MAX_VOCAB);
    }
    if (!isfinite(p->temperature) || p->temperature < 0.0f) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: temperature %g must be finite and >= 0",
                       (double)p->temperature);
    }
    if (!isfinite(p->top_p) || p->top_p < 0.0f || p->top_p > 1.0f) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: top_p %g must be in [0, 1]",
                       (double)p->top_p);
    }
    if (!isfinite(p->min_p) || p->min_p < 0.0f || p->min_p > 1.0f) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: min_p %g must be in [0, 1]",
                       (double)p->min_p);
    }
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty <= 0.0f) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: repeat_penalty %g must be finite and > 0",
                       (double)p->repeat_penalty);
    }
    /* OpenAI accepts [-2, 2] for both; larger magnitudes only make garbage. */
    if (!isfinite(p->frequency_penalty) || fabsf(p->frequency_penalty) > 2.0f) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: frequency_penalty %g must be in [-2, 2]",
                       (double)p->frequency_penalty);
    }
    if (!isfinite(p->presence_penalty) || fabsf(p->presence_penalty) > 2.0f) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: presence_penalty %g must be in [-2, 2]",
                       (double)p->presence_penalty);
    }
    if (p->n_bias < 0 || p->n_bias > SP_SAMPLER_MAX_BIAS) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "sampler: %d logit bias entries (at most %d)",
                       (int)p->n_bias, SP_SAMPLER_MAX_BIAS);
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        if (p->bias_id[i] < 0 || p->bias_id[i] >= n_vocab || !isfinite(p->bias[i]) ||
            fabsf(p->bias[i]) > 100.0f) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "sampler: logit bias %g for token %d (ids below %d, bias in [-100, 100])",
                           (double)p->bias[i], (int)p->bias_id[i], (int)n_vocab);
        }
    }
    if (p->penalty_last_n < 0 || p->penalty_last_n > MAX_PENALTY_WINDOW) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "sampler: penalty_last_n %d must be in [0, %d]",
                       (int)p->penalty_last_n, MAX_PENALTY_WINDOW);
    }

    sp_sampler_t *s = sp_calloc(1, sizeof(*s));
    if (s == NULL) {
        goto nomem;
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    s->exp = sp_cpu_kernels()->exp_f32;
    s->cand = sp_calloc((size_t)n_vocab, sizeof(int32_t));
    s->weight = sp_calloc((size_t)n_vocab, sizeof(float));
    s->key = sp_calloc((size_t)n_vocab, sizeof(uint64_t));
    s->key_tmp = sp_calloc((size_t)n_vocab, sizeof(uint64_t));
    s->count = sp_calloc((size_t)n_vocab, sizeof(int32_t));
    s->ring = sp_calloc(p->penalty_last_n > 0 ? (size_t)p->penalty_last_n : 1, sizeof(int32_t));
    if (s->cand == NULL || s->weight == NULL || s->key == NULL || s->key_tmp == NULL ||
        s->count == NULL || s->ring == NULL) {
        goto nomem;
    }
    seed_rng(s, p->seed);
    *out = s;
    return SP_OK;
nomem:
    sp_sampler_destroy(s);
    return sp_errf(err, err_len, SP_ERR_NOMEM, "sampler: out of memory for %d tokens",
                   (int)n_vocab);
}

void
sp_sampler_destroy(sp_sampler_t *s)
{
    if (s == NULL) {
        return;
    }
    sp_free(s->cand);
    sp_free(s->weight);
    sp_free(s->key);
    sp_free(s->key_tmp);
    sp_free(s->count);
    sp_free(s->ring);
    sp_free(s);
}

void
sp_sampler_reset(sp_sampler_t *s, uint64_t seed)
{
    memset(s->count, 0, (size_t)s->n_vocab * sizeof(int32_t));
    s->ring_head = 0;
    s->ring_len = 0;
    s->p.seed = seed;
    seed_rng(s, seed);
}

void
sp_sampler_accept(sp_sampler_t *s, int32_t token)
{
    int32_t cap = s->p.penalty_last_n;
    if (cap == 0 || token < 0 || token >= s->n_vocab) {
        return; /* out-of-range ids cannot be penalised; ignore rather than corrupt counts */
    }
    if (s->ring_len == cap) { /* full: the oldest token leaves the window */
        s->count[s->ring[s->ring_head]]--;
        s->ring[s->ring_head] = token;
        s->ring_head = (s->ring_head + 1) % cap;
    } else {
        s->ring[(s->ring_head + s->ring_len) % cap] = token;
        s->ring_len++;
    }
    s->count[token]++;
}

/* ---- sampling ---------------------------------------------------------- */

/*
 * Repetition penalty as in CTRL / llama.cpp (a positive logit is divided by it,
 * a negative one multiplied, so either way the token gets less likely), then
 * OpenAI's frequency and presence terms: logit -= count*freq + (count>0)*presence.
 * Each distinct token of the window is changed once: its count is negated while
 * it is done and restored afterwards.
 */
static void
apply_window(sp_sampler_t *s, float *logits)
{
    const sp_sampler_params_t *p = &s->p;
    if (s->ring_len == 0 || (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f &&
                             p->presence_penalty == 0.0f)) {
        return;
    }
    int32_t cap = p->penalty_last_n;
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t tok = s->ring[(s->ring_head + i) % cap];
        int32_t c = s->count[tok];
        if (c <= 0) {
            continue; /* already done */
        }
        float l = logits[tok];
        if (p->repeat_penalty != 1.0f) {
            l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        }
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        logits[tok] = l;
        s->count[tok] = -c;
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t tok = s->ring[(s->ring_head + i) % cap];
        if (s->count[tok] < 0) {
            s->count[tok] = -s->count[tok];
        }
    }
}

/* Candidate order: higher logit first, then lower id. NaN was mapped to -inf. */
/* The penalties, then the logit bias: per row, the same whatever else is in
 * the batch. */
static void
apply_penalties(sp_sampler_t *s, float *logits)
{
    apply_window(s, logits);
    for (int32_t i = 0; i < s->p.n_bias; i++) {
        logits[s->p.bias_id[i]] += s->p.bias[i];
    }
}

static bool
better(const float *logits, int32_t a, int32_t b)
{
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

/* Replace NaN by -inf (a NaN would break every comparison after this) and
 * return the lowest id with the largest logit: one pass for the max, a second
 * that usually stops early. */
static int32_t
clean_argmax(float *logits, int32_t n)
{
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (v != v) {
            logits[i] = v = -INFINITY;
        }
        m = v > m ? v : m;
    }
    for (int32_t i = 0; i < n; i++) {
        if (logits[i] == m) {
            return i;
        }
    }
    return 0;
}

int32_t
sp_argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    float bv = x[0];
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > bv) {
            bv = x[i];
            best = (int32_t)i;
        }
    }
    return best;
}

/* Min-heap on `better` (the worst candidate at the root), for top-k selection. */
static void
sift_down(const float *logits, int32_t *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) {
            return;
        }
        if (c + 1 < n && better(logits, h[c], h[c + 1])) {
            c++; /* the worse child */
        }
        if (!better(logits, h[i], h[c])) {
            return;
        }
        int32_t tmp = h[i];
        h[i] = h[c];
        h[c] = tmp;
        i = c;
    }
}

/*
 * Sort key of a candidate: the logit's bits mapped so that a larger float gives
 * a smaller unsigned value, in the high half, and the candidate's slot in the
 * low half. Sorting keys ascending gives logits descending; the slots are in
 * ascending id order and the radix sort is stable, so equal logits stay in id
 * order.
 */
static uint64_t
sort_key(float logit, uint32_t slot)
{
    uint32_t u;
    memcpy(&u, &logit, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending float order */
    return ((uint64_t)~u << 32) | slot;              /* flipped: descending */
}

/* Stable LSD radix sort of key[0..n) on bits [lo, hi), 8 bits a pass.
 * Returns the buffer that holds the result: key or tmp. */
static uint64_t *
radix_sort(uint64_t *key, uint64_t *tmp, int32_t n, int lo, int hi)
{
    for (int shift = lo; shift < hi; shift += 8) {
        uint32_t count[257] = {0};
        for (int32_t i = 0; i < n; i++) {
            count[((key[i] >> shift) & 0xff) + 1]++;
        }
        for (int b = 0; b < 256; b++) {
            count[b + 1] += count[b];
        }
        for (int32_t i = 0; i < n; i++) {
            tmp[count[(key[i] >> shift) & 0xff]++] = key[i];
        }
        uint64_t *sw = key;
        key = tmp;
        tmp = sw;
    }
    return key;
}

void
sp_sampler_apply_penalties(sp_sampler_t *s, float *logits)
{
    apply_penalties(s, logits); /* a NaN logit stays NaN through them */
}

int32_t
sp_sampler_sample(sp_sampler_t *s, float *logits)
{
    apply_penalties(s, logits);
    return sp_sampler_sample_penalized(s, logits);
}

/*
 * From the temperature on, for the k candidates in s->cand (ids ascending):
 * a candidate's logit is logits[id], or with cv (the candidate path) cv[slot],
 * compacted along with the ids. top is the largest logit.
 */
static int32_t
draw(sp_sampler_t *s, const float *logits, float *cv, int32_t k, double top)
{
    const sp_sampler_params_t *p = &s->p;
    int32_t *c = s->cand;
    /*
     * Temperature and softmax, without dividing yet: w = exp((l - max) / T), so
     * the best token weighs 1 and p = w / z. min-p (p >= min_p * p_max) is then
     * w >= min_p. top-p and min-p both keep a prefix of the same best-first
     * order, so applying min-p first gives the same set and shrinks the sort;
     * z still sums the whole top-k set, as top-p needs.
     */
    double inv_t = 1.0 / (double)p->temperature, z = 0.0;
    float *wt = s->weight;
    /* the exponents, then one vector exp over them all (float precision is plenty for a draw;
     * exp(-inf) = 0 and exp(0) = 1, kernels.h): a whole vocabulary's scalar expf cost more
     * than the rest of the step's sampling */
    for (int32_t i = 0; i < k; i++) {
        const float l = cv ? cv[i] : logits[c[i]];
        wt[i] = (float)(((double)l - top) * inv_t);
    }
    s->exp(wt, wt, k);
    int32_t m = 0;
    for (int32_t i = 0; i < k; i++) {
        const double w = (double)wt[i];
        z += w;
        if (w > 0.0 && w >= (double)p->min_p) { /* weight 0 could only be drawn by rounding */
            c[m] = c[i]; /* m <= i: compacting in place is safe */
            if (cv) {
                cv[m] = cv[i];
            }
            wt[m] = (float)w;
            m++;
        }
    }

    /* top-p: the shortest best-first prefix whose mass reaches top_p; only
     * this needs the order, so only this sorts */
    int32_t keep = m;
    const uint64_t *order = NULL; /* sorted keys; low half = slot */
    if (p->top_p < 1.0f) {
        for (int32_t i = 0; i < m; i++) {
            s->key[i] = sort_key(cv ? cv[i] : logits[c[i]], (uint32_t)i);
        }
        order = radix_sort(s->key, s->key_tmp, m, 32, 64);
        double cum = 0.0, target = (double)p->top_p * z;
        for (keep = 0; keep < m;) {
            cum += s->weight[(uint32_t)order[keep++]];
            if (cum >= target) {
                break;
            }
        }
    }

    /* one draw from what is left, renormalised (walked best first when sorted) */
    double mass = 0.0;
    for (int32_t j = 0; j < keep; j++) {
        mass += s->weight[order ? (uint32_t)order[j] : (uint32_t)j];
    }
    double u = uniform01(s) * mass, acc = 0.0;
    uint32_t slot = 0;
    for (int32_t j = 0; j < keep; j++) {
        slot = order ? (uint32_t)order[j] : (uint32_t)j;
        acc += s->weight[slot];
        if (u < acc) {
            break;
        }
    }
    return c[slot]; /* if rounding left u at the very top, the last kept token */
}

int32_t
sp_sampler_candidates(const sp_sampler_t *s)
{
    const sp_sampler_params_t *p = &s->p;
    if (p->penalty_last_n > 0 && (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                                  p->presence_penalty != 0.0f)) {
        return 0; /* penalties change logits outside any top k of the raw row */
    }
    if (p->n_bias > 0) {
        return 0; /* so does a bias */
    }
    if (p->temperature == 0.0f || p->top_k == 1) {
        return 1;
    }
    if (p->top_k > 1 && p->top_k <= SP_SAMPLER_MAX_CANDIDATES && p->top_k < s->n_vocab) {
        return p->top_k;
    }
    return 0; /* no top-k (or a large one): the whole row is weighed */
}

int32_t
sp_sampler_sample_candidates(sp_sampler_t *s, const int32_t *ids, const float *vals, int32_t n)
{
    const sp_sampler_params_t *p = &s->p;
    const int32_t need = sp_sampler_candidates(s);
    if (need == 0 || n < need || ids == NULL || vals == NULL) {
        return -1;
    }
    /* vals[0] is the largest logit, ids[0] the lowest id holding it (NaN
     * ranks as -inf): what clean_argmax finds in the row. */
    const float v0 = vals[0] != vals[0] ? -INFINITY : vals[0];
    if (p->temperature == 0.0f || p->top_k == 1 || isinf(v0)) {
        return ids[0];
    }
    /* The top-k set in id order, as the heap path leaves it (k <= 64:
     * insertion sort). */
    const int32_t k = need;
    for (int32_t i = 0; i < k; i++) {
        const int32_t id = ids[i];
        const float v = vals[i] != vals[i] ? -INFINITY : vals[i];
        int32_t j = i;
        while (j > 0 && s->cand[j - 1] > id) {
            s->cand[j] = s->cand[j - 1];
            s->cval[j] = s->cval[j - 1];
            j--;
        }
        s->cand[j] = id;
        s->cval[j] = v;
    }
    return draw(s, NULL, s->cval, k, (double)v0);
}

/* Past this point the logits are only read (after NaN -> -inf): the
 * per-candidate weights live in s->weight (sampler.h promises this). */
int32_t
sp_sampler_sample_penalized(sp_sampler_t *s, float *logits)
{
    const sp_sampler_params_t *p = &s->p;
    int32_t n = s->n_vocab;

    int32_t best = clean_argmax(logits, n);
    if (p->temperature == 0.0f || p->top_k == 1 || isinf(logits[best])) {
        /* greedy; +inf dominates; all -inf leaves nothing to weigh */
        return best;
    }

    /* top-k: the k best ids by a min-heap (O(n log k)); otherwise every id */
    int32_t *c = s->cand;
    int32_t k = n;
    if (p->top_k > 0 && p->top_k < n) {
        k = p->top_k;
        for (int32_t i = 0; i < k; i++) {
            c[i] = i;
        }
        for (int32_t i = k / 2 - 1; i >= 0; i--) {
            sift_down(logits, c, k, i);
        }
        /* ids grow, so a later id only beats the root with a strictly larger logit */
        float worst = logits[c[0]];
        for (int32_t i = k; i < n; i++) {
            if (logits[i] > worst) {
                c[0] = i;
                sift_down(logits, c, k, 0);
                worst = logits[c[0]];
            }
        }
        /* back to id order (ids < 2^24: three passes), so that equal logits
         * keep the lower id first in the sort below, as on the k = n path */
        for (int32_t i = 0; i < k; i++) {
            s->key[i] = (uint64_t)c[i];
        }
        const uint64_t *ids = radix_sort(s->key, s->key_tmp, k, 0, 24);
        for (int32_t i = 0; i < k; i++) {
            c[i] = (int32_t)ids[i];
        }
    } else {
        for (int32_t i = 0; i < n; i++) {
            c[i] = i;
        }
    }

    return draw(s, logits, NULL, k, (double)logits[best]);
}
