/*
 * hparams.c - reading a model's `<arch>.<key>` hyper-parameters from its GGUF
 * file with a default and a range (model_impl.h: sp__hp_int, sp__hp_double,
 * sp__hp_float), for every loader (model.c, encoder.c, gemma4.c, mla.c); an
 * error names the file and the key. No state, no allocation; any thread.
 */
#include <math.h>
#include <stdio.h>

#include "engine/model_impl.h"

sp_status_t
sp__hp_int(const sp_gguf_t *g, const char *arch, const char *suffix, int64_t dflt, int64_t lo,
           int64_t hi, int64_t *out, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    sp_status_t st = sp_gguf_get_int(g, key, out, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        if (dflt < 0) {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing required key '%s'",
                           sp_gguf_path(g), key);
        }
        *out = dflt;
    } else if (st != SP_OK) {
        return st;
    }
    if (*out < lo || *out > hi) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: key '%s' = %lld out of range [%lld, %lld]", sp_gguf_path(g), key,
                       (long long)*out, (long long)lo, (long long)hi);
    }
    return SP_OK;
}

sp_status_t
sp__hp_double(const sp_gguf_t *g, const char *arch, const char *suffix, double dflt, double lo,
              double hi, double *out, char *err, size_t err_len)
{
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    sp_status_t st = sp_gguf_get_float(g, key, &v, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        v = dflt;
    } else if (st != SP_OK) {
        return st;
    }
    if (!isfinite(v) || v < lo || v > hi) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s' = %g out of range [%g, %g]",
                       sp_gguf_path(g), key, v, lo, hi);
    }
    *out = v;
    return SP_OK;
}

sp_status_t
sp__hp_float(const sp_gguf_t *g, const char *arch, const char *suffix, double dflt, double lo,
             double hi, float *out, char *err, size_t err_len)
{
    double v;
    sp_status_t st = sp__hp_double(g, arch, suffix, dflt, lo, hi, &v, err, err_len);
    if (st == SP_OK) {
        *out = (float)v;
    }
    return st;
}
