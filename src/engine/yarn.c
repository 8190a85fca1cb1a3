/*
 * yarn.c - YaRN RoPE: its keys and its per-pair frequency factor (yarn.h
 * says the math). Threads: pure functions. Memory: none.
 */
#include "engine/yarn.h"

#include <math.h>
#include <stdio.h>

/* Optional float key `<arch>.<suffix>` in [lo, hi], dflt when absent. */
static sp_status_t
get_f(const sp_gguf_t *g, const char *arch, const char *suffix, double dflt, double lo, double hi,
      double *out, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    sp_status_t st = sp_gguf_get_float(g, key, out, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        *out = dflt;
        st = SP_OK;
    }
    if (st == SP_OK && (!isfinite(*out) || *out < lo || *out > hi)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s' = %g out of range [%g, %g]",
                       sp_gguf_path(g), key, *out, lo, hi);
    }
    return st;
}

sp_status_t
sp__yarn_load(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len)
{
    const char *a = hp->arch;
    double factor, attn, fast, slow;
    int64_t orig = hp->n_ctx_train;
    char key[128];
    sp_status_t st = get_f(g, a, "rope.scaling.factor", 1.0, 0.0, 1e6, &factor, err, err_len);
    if (st == SP_OK) {
        st = get_f(g, a, "rope.scaling.attn_factor", 1.0, 1e-6, 1e6, &attn, err, err_len);
    }
    if (st == SP_OK) {
        st = get_f(g, a, "rope.scaling.yarn_beta_fast", 32.0, 1e-6, 1e6, &fast, err, err_len);
    }
    if (st == SP_OK) {
        st = get_f(g, a, "rope.scaling.yarn_beta_slow", 1.0, 1e-6, 1e6, &slow, err, err_len);
    }
    if (st != SP_OK) {
        return st;
    }
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", a);
    st = sp_gguf_get_int(g, key, &orig, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        orig = hp->n_ctx_train;
    } else if (st != SP_OK) {
        return st;
    } else if (orig < 1 || orig > (1 << 24)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s' = %lld out of range",
                       sp_gguf_path(g), key, (long long)orig);
    }
    if (factor == 0.0) {
        factor = 1.0; /* llama.cpp: an absent or zero factor is no scaling */
    }
    hp->rope_yarn = true;
    hp->rope_scale = 1.0f;
    hp->yarn_factor = (float)factor;
    hp->yarn_orig_ctx = orig;
    hp->yarn_beta_fast = (float)fast;
    hp->yarn_beta_slow = (float)slow;
    hp->rope_mscale = (float)(attn * (factor > 1.0 ? 1.0 + 0.1 * log(factor) : 1.0));
    return SP_OK;
}

/* The pair index at which a rotation of n_turns turns over the original
 * context completes: below it pairs rotate fast (extrapolated as is), above
 * it slowly (interpolated). */
static double
corr_dim(const sp_hparams_t *hp, double n_turns)
{
    return (double)hp->n_rot * log((double)hp->yarn_orig_ctx / (n_turns * 2.0 * M_PI)) /
           (2.0 * log((double)hp->rope_base));
}

double
sp__yarn_mix(const sp_hparams_t *hp, int64_t i)
{
    if (!hp->rope_yarn) {
        return 1.0;
    }
    double lo = floor(corr_dim(hp, hp->yarn_beta_fast));
    double hi = ceil(corr_dim(hp, hp->yarn_beta_slow));
    lo = lo > 0.0 ? lo : 0.0;
    hi = hi < (double)(hp->n_rot - 1) ? hi : (double)(hp->n_rot - 1);
    double y = ((double)i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
    y = y < 0.0 ? 0.0 : (y > 1.0 ? 1.0 : y);
    const double ramp = 1.0 - y; /* 1: keep the original frequency, 0: interpolate */
    const double fs = 1.0 / (double)hp->yarn_factor;
    return fs * (1.0 - ramp) + ramp;
}
