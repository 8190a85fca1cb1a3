/*
 * sampler.h - picks the next token from logits.
 *
 * Order (as llama.cpp and vLLM apply them): penalties (repetition, frequency,
 * presence over the last penalty_last_n tokens), then the logit bias (OpenAI's
 * logit_bias: a value in [-100, 100] added to a token's logit; -100 in effect
 * bans it, +100 in effect forces it), then temperature 0 = greedy
 * (argmax, lowest id on ties); otherwise top-k, temperature, softmax, top-p,
 * min-p, and a draw from a seeded PRNG that belongs to the sampler, so the same
 * seed gives the same tokens. All buffers are sized at create: sampling a
 * token allocates nothing.
 */
#ifndef SP_ENGINE_SAMPLER_H
#define SP_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "sampan/status.h"

#define SP_SAMPLER_MAX_BIAS 300 /* logit_bias entries per request */

typedef struct sp_sampler_params {
    float temperature;       /* 0 = greedy; default 0.8 */
    int32_t top_k;           /* <= 0 disables; default 40 */
    float top_p;             /* 1 disables; default 0.95 */
    float min_p;             /* 0 disables; default 0.05 */
    float repeat_penalty;    /* 1 disables; default 1 */
    float frequency_penalty; /* 0 disables */
    float presence_penalty;  /* 0 disables */
    int32_t penalty_last_n;  /* window for the penalties; default 64 */
    uint64_t seed;           /* default 0xC0FFEE */
    int32_t n_bias;          /* logit bias entries (distinct ids); 0 disables */
    int32_t bias_id[SP_SAMPLER_MAX_BIAS];
    float bias[SP_SAMPLER_MAX_BIAS]; /* each finite, in [-100, 100] */
} sp_sampler_params_t;

typedef struct sp_sampler sp_sampler_t;

sp_sampler_params_t sp_sampler_default_params(void);
/* SP_ERR_INVALID (with err) for NaN/inf or out-of-range parameters. */
sp_status_t sp_sampler_create(const sp_sampler_params_t *p, int32_t n_vocab, sp_sampler_t **out,
                              char *err, size_t err_len);
void sp_sampler_destroy(sp_sampler_t *s);
void sp_sampler_reset(sp_sampler_t *s, uint64_t seed); /* forget history, reseed */
/* Record a token of the context (prompt or generated) for the penalties. */
void sp_sampler_accept(sp_sampler_t *s, int32_t token);
/* The lowest index among the largest of x[0..n), n >= 1 (greedy's pick; a NaN never wins
 * over x[0]). The best value is kept, not re-read through the index: no load in the loop's
 * chain (32000 logits in about 24 us instead of 136). */
int32_t sp_argmax(const float *x, int64_t n);
/* Sample from n_vocab logits; `logits` is used as scratch and modified. */
int32_t sp_sampler_sample(sp_sampler_t *s, float *logits);
/*
 * The two halves of sp_sampler_sample, for callers that need the penalised
 * logits in between (log-probabilities, constrained decoding): apply the
 * penalties in place, then sample without applying them again. The second
 * half changes the logits only by turning NaN into -inf.
 */
void sp_sampler_apply_penalties(sp_sampler_t *s, float *logits);
int32_t sp_sampler_sample_penalized(sp_sampler_t *s, float *logits);

/*
 * Sampling from the best few logits only (the GPU returns them instead of
 * the whole row: docs/cuda.md "Candidates").
 * sp_sampler_candidates: how many best logits these parameters need to give
 * exactly the token sp_sampler_sample would: 1 for greedy (temperature 0 or
 * top_k 1), top_k for 2 <= top_k <= SP_SAMPLER_MAX_CANDIDATES (and below
 * n_vocab), whatever top_p, min_p and temperature; 0 (the whole row) without
 * such a top_k or with a penalty or a logit bias configured.
 * sp_sampler_sample_candidates: the token from n >= that many candidates,
 * ids[] with their logits vals[], best first (larger value, then lower id;
 * NaN ranks as -inf), as sp_sampler_sample_penalized would pick from the
 * whole row with the same state and seed (it draws the same numbers).
 * -1 when the parameters need the whole row or n is too small.
 */
#define SP_SAMPLER_MAX_CANDIDATES 64
int32_t sp_sampler_candidates(const sp_sampler_t *s);
int32_t sp_sampler_sample_candidates(sp_sampler_t *s, const int32_t *ids, const float *vals,
                                     int32_t n);

#endif /* SP_ENGINE_SAMPLER_H */
