/*
 * weights.c - finding a model's tensors in its GGUF file by name, with their
 * shape and type checked (model_impl.h: sp__model_weight, sp__model_vector),
 * for the llama-family loader (model.c) and the encoders (encoder.c).
 * No state, no allocation; any thread.
 */
#include <stdint.h>
#include <string.h>

#include "engine/model_impl.h"
#include "kernels/kernels.h"

/* Find a tensor and check it is a (n_out x n_in) matrix of a computable type. */
sp_status_t
sp__model_weight(const sp_model_t *m, const char *name, int64_t n_in, int64_t n_out, bool required,
                 sp_weight_t *w, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(m->gguf);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(m->gguf, name);
    memset(w, 0, sizeof *w);
    if (t == NULL) {
        return required
            ? sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor '%s'", path, name)
            : SP_ERR_NOT_FOUND;
    }
    int64_t ne2 = t->n_dims > 2 ? t->ne[2] * t->ne[3] : 1;
    if (t->ne[0] != n_in || t->ne[1] != n_out || ne2 != 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld]", path,
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)ne2,
                       (long long)n_in, (long long)n_out);
    }
    const sp_type_traits_t *tr = sp_type_traits(t->type);
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    if (tr == NULL || !tr->supported || k->vec_dot[t->type] == NULL) {
        char types[256];
        sp_type_supported_list(types, sizeof types);
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has type %s, which the engine cannot compute with (%s)",
                       path, name, sp_type_name(t->type), types);
    }
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = sp_row_size(t->type, n_in);
    return SP_OK;
}

/* A 1-D F32 vector of n elements (norm weights, biases). */
sp_status_t
sp__model_vector(const sp_model_t *m, const char *name, int64_t n, bool required, const float **out,
                 char *err, size_t err_len)
{
    const char *path = sp_gguf_path(m->gguf);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(m->gguf, name);
    *out = NULL;
    if (t == NULL) {
        return required
            ? sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor '%s'", path, name)
            : SP_OK;
    }
    if (t->type != SP_TYPE_F32 || t->ne[0] != n || t->ne[1] * t->ne[2] * t->ne[3] != 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s' must be f32 [%lld], found %s [%lld, %lld]", path, name,
                       (long long)n, sp_type_name(t->type), (long long)t->ne[0],
                       (long long)t->ne[1]);
    }
    if (((uintptr_t)t->data & 3) != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tensor '%s' data is misaligned", path,
                       name);
    }
    *out = t->data;
    return SP_OK;
}
