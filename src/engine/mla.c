/*
 * mla.c - multi-head latent attention (deepseek2): loading its
 * hyper-parameters and tensors, and the products before and after the
 * attention kernels (mla.h explains the latent cache layout).
 *
 * A step's rows are processed in chunks of up to MLA_CHUNK_ROWS; each
 * product runs over all rows of a chunk at once, split by (matrix, range of
 * weight rows) across the pool, so a weight is read once per chunk.
 *
 * Batch invariance: every product element is one vec_dot of a weight row and
 * the row's own converted activation (the gemm contract in kernels.h), and
 * the norms and copies read only their own row, so a row's q, k, v and output
 * are bit-identical whatever else shares the step.
 *
 * Threads: the caller's pool. Memory: the model part is allocated at load
 * (owned by the model); per step nothing is allocated (the batch's scratch).
 */
#include "engine/mla.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"

#define MLA_CHUNK_ROWS 256

bool
sp__mla_arch(const char *arch)
{
    return strcmp(arch, "deepseek2") == 0;
}

/* ------------------------------------------------------------------------ */
/* Hyper-parameters                                                          */
/* ------------------------------------------------------------------------ */

sp_status_t
sp__mla_hparams(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g), *a = hp->arch;
    int64_t kv_lora, q_lora, k_len, v_len, k_mla, v_mla, n_rot, nextn;
    sp_status_t st;
    /* Multi-token-prediction blocks (nextn, for speculative decoding) are
     * counted in block_count after the trunk; the trunk alone is the model. */
    if ((st = sp__hp_int(g, a, "nextn_predict_layers", 0, 0, hp->n_layer - 1, &nextn, err,
                         err_len)) != SP_OK) {
        return st;
    }
    hp->n_layer -= nextn;
    if ((st = sp__hp_int(g, a, "attention.kv_lora_rank", -1, 1, 1 << 14, &kv_lora, err, err_len)) !=
            SP_OK ||
        (st = sp__hp_int(g, a, "attention.q_lora_rank", 0, 0, 1 << 16, &q_lora, err, err_len)) !=
            SP_OK ||
        (st = sp__hp_int(g, a, "attention.key_length", -1, 2, 1 << 14, &k_len, err, err_len)) !=
            SP_OK ||
        (st = sp__hp_int(g, a, "attention.value_length", -1, 1, 1 << 14, &v_len, err, err_len)) !=
            SP_OK ||
        (st = sp__hp_int(g, a, "attention.key_length_mla", 0, 0, 1 << 14, &k_mla, err, err_len)) !=
            SP_OK ||
        (st = sp__hp_int(g, a, "attention.value_length_mla", 0, 0, 1 << 14, &v_mla, err,
                         err_len)) != SP_OK ||
        (st = sp__hp_int(g, a, "rope.dimension_count", -1, 2, 1 << 14, &n_rot, err, err_len)) !=
            SP_OK) {
        return st;
    }
    if ((k_mla == 0) != (v_mla == 0)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: '%s.attention.key_length_mla' and 'value_length_mla' must be both "
                       "present or both absent", path, a);
    }
    if (k_mla > 0) {
        /* The split (wk_b / wv_b) form: key_length and value_length are the
         * latent cache's widths, the _mla keys the per-head ones. */
        if (k_len != kv_lora + n_rot || v_len != kv_lora) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: '%s.attention.key_length' %lld / 'value_length' %lld, expected "
                           "kv_lora_rank + rope.dimension_count = %lld / kv_lora_rank = %lld",
                           path, a, (long long)k_len, (long long)v_len,
                           (long long)(kv_lora + n_rot), (long long)kv_lora);
        }
        k_len = k_mla;
        v_len = v_mla;
    }
    if (kv_lora + n_rot > (1 << 14)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: '%s.attention.kv_lora_rank' %lld + rope dims %lld is over %d (the "
                       "latent cache's width)", path, a, (long long)kv_lora, (long long)n_rot,
                       1 << 14);
    }
    if (n_rot % 2 != 0 || n_rot >= k_len) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: '%s.rope.dimension_count' %lld must be even and below the key "
                       "length %lld", path, a, (long long)n_rot, (long long)k_len);
    }
    hp->mla_kv_lora = kv_lora;
    hp->mla_q_lora = q_lora;
    hp->mla_nope = k_len - n_rot;
    hp->mla_v_dim = v_len;
    hp->n_rot = n_rot;
    hp->head_dim = n_rot + kv_lora;
    hp->n_head_kv = 1;
    return SP_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */
/* ------------------------------------------------------------------------ */

static sp_status_t
get_w(const sp_gguf_t *g, const char *name, int64_t n_in, int64_t n_out, int64_t n_mat,
      bool required, sp_mla_w_t *w, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(g, name);
    memset(w, 0, sizeof *w);
    if (t == NULL) {
        return required ? sp_errf(err, err_len, SP_ERR_FORMAT, "%s: missing tensor '%s'", path,
                                  name)
                        : SP_ERR_NOT_FOUND;
    }
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_mat || t->ne[3] != 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected "
                       "[%lld, %lld, %lld]", path, name, (long long)t->ne[0], (long long)t->ne[1],
                       (long long)t->ne[2], (long long)t->ne[3], (long long)n_in,
                       (long long)n_out, (long long)n_mat);
    }
    const sp_type_traits_t *tr = sp_type_traits(t->type);
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    if (tr == NULL || !tr->supported || k->vec_dot[t->type] == NULL ||
        n_in % tr->blck_size != 0) {
        char types[256];
        sp_type_supported_list(types, sizeof types);
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has type %s, which the engine cannot compute with here "
                       "(%s)", path, name, sp_type_name(t->type), types);
    }
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->n_mat = n_mat;
    w->row_bytes = sp_row_size(t->type, n_in);
    w->mat_bytes = w->row_bytes * (size_t)n_out;
    if (t->nbytes != w->mat_bytes * (size_t)n_mat) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tensor '%s' holds %zu bytes, expected %zu",
                       path, name, t->nbytes, w->mat_bytes * (size_t)n_mat);
    }
    return SP_OK;
}

/* llama.cpp's get_mscale: the YaRN attention factor of a scale and mscale. */
static double
yarn_get_mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/*
 * The query scale and the RoPE cos/sin factor as llama.cpp sets them for
 * deepseek2 (llama-context.cpp's yarn_attn_factor, then the deepseek2
 * graph's kq_scale): with s the YaRN factor, L the file's
 * rope.scaling.yarn_log_multiplier / 0.1 (the converter stores 0.1 times the
 * model's mscale_all_dim) and a the file's rope.scaling.attn_factor,
 *   A = a * (L != 0 ? 1 : 1 + 0.1 ln s) / (1 + 0.1 ln s)
 *   cos/sin are multiplied by A (1 + 0.1 ln s),
 *   kq_scale = (A (1 + 0.1 ln s) (1 + 0.1 L ln s))^2 / sqrt(nope + n_rot).
 * Without YaRN (s = 1): A = a, cos/sin times a, kq_scale a^2 / sqrt(nope + n_rot).
 */
static sp_status_t
load_scales(sp_model_t *m, char *err, size_t err_len)
{
    sp_hparams_t *hp = &m->hp;
    double log_mul, attn;
    sp_status_t st;
    if ((st = sp__hp_double(m->gguf, hp->arch, "rope.scaling.yarn_log_multiplier", 0.0, 0.0, 100.0,
                            &log_mul, err, err_len)) != SP_OK ||
        (st = sp__hp_double(m->gguf, hp->arch, "rope.scaling.attn_factor", 1.0, 1e-3, 1e3, &attn,
                            err, err_len)) != SP_OK) {
        return st;
    }
    const double L = log_mul / 0.1;
    const double qk = (double)(hp->mla_nope + hp->n_rot);
    if (hp->rope_yarn) {
        const double s = hp->yarn_factor;
        double A = L != 0.0 ? yarn_get_mscale(s, L) / yarn_get_mscale(s, L)
                            : yarn_get_mscale(s, 1.0);
        A *= 1.0 / (1.0 + 0.1 * log(s));
        A *= attn;
        const double cs = A * (1.0 + 0.1 * log(s));
        const double ms = cs * (1.0 + 0.1 * L * log(s));
        hp->rope_mscale = (float)cs;
        hp->rope_attn_factor = 1.0f;
        hp->attn_scale = (float)(ms * ms / sqrt(qk));
    } else {
        /* Linear scaling (freq_scale = 1 / rope_scale) enters kq_scale through
         * the same terms with no YaRN ramp. */
        const double fs_ln = log((double)hp->rope_scale);
        const double ms = attn * (1.0 + 0.1 * fs_ln) * (1.0 + 0.1 * L * fs_ln);
        hp->rope_attn_factor = (float)attn;
        hp->attn_scale = (float)(ms * ms / sqrt(qk));
    }
    return SP_OK;
}

/* The legacy fused attn_kv_b (per head: nope key rows, then v_dim value rows,
 * each of kv_lora): wv_b is a view of its value rows; wk_b needs the key rows
 * transposed (kv_lora rows of nope), converted here to F32 into dst. */
static sp_status_t
split_kv_b(const sp_model_t *m, const sp_gguf_t *g, const char *name, sp_mla_layer_t *L,
           float *dst, char *err, size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    const int64_t H = hp->n_head, r = hp->mla_kv_lora, nope = hp->mla_nope, v = hp->mla_v_dim;
    sp_mla_w_t kvb;
    sp_status_t st = get_w(g, name, r, H * (nope + v), 1, true, &kvb, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    L->wv_b = kvb;
    L->wv_b.data = (const char *)kvb.data + (size_t)nope * kvb.row_bytes;
    L->wv_b.n_out = v;
    L->wv_b.n_mat = H;
    L->wv_b.mat_bytes = (size_t)(nope + v) * kvb.row_bytes;
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    float *row = sp_malloc((size_t)r * sizeof(float));
    if (row == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", sp_gguf_path(g));
    }
    for (int64_t h = 0; h < H; h++) {
        for (int64_t d = 0; d < nope; d++) {
            k->to_float[kvb.type]((const char *)kvb.data +
                                      (size_t)(h * (nope + v) + d) * kvb.row_bytes,
                                  row, r);
            for (int64_t j = 0; j < r; j++) {
                dst[(h * r + j) * nope + d] = row[j];
            }
        }
    }
    sp_free(row);
    L->wk_b.data = dst;
    L->wk_b.type = SP_TYPE_F32;
    L->wk_b.n_in = nope;
    L->wk_b.n_out = r;
    L->wk_b.n_mat = H;
    L->wk_b.row_bytes = (size_t)nope * sizeof(float);
    L->wk_b.mat_bytes = (size_t)(r * nope) * sizeof(float);
    return SP_OK;
}

sp_status_t
sp__mla_load(sp_model_t *m, char *err, size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    const sp_gguf_t *g = m->gguf;
    const char *path = sp_gguf_path(g);
    const int64_t E = hp->n_embd, H = hp->n_head, r = hp->mla_kv_lora, rot = hp->n_rot;
    const int64_t qk = hp->mla_nope + rot, ql = hp->mla_q_lora;
    sp_status_t st = load_scales(m, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    struct sp_mla_model *mla = sp_calloc(1, sizeof *mla);
    if (mla == NULL || (mla->layers = sp_calloc((size_t)hp->n_layer, sizeof(sp_mla_layer_t))) ==
                           NULL) {
        sp__mla_free(mla);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    m->mla = mla;
    char name[96];
    for (int64_t il = 0; il < hp->n_layer; il++) {
        sp_mla_layer_t *L = &mla->layers[il];
#define W(field, nm, n_in, n_out, n_mat)                                                    \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                   \
    if ((st = get_w(g, name, n_in, n_out, n_mat, true, &L->field, err, err_len)) != SP_OK)  \
        return st;
#define V(field, nm, n)                                                                     \
    snprintf(name, sizeof name, "blk.%lld." nm ".weight", (long long)il);                   \
    if ((st = sp__model_vector(m, name, n, true, &L->field, err, err_len)) != SP_OK)        \
        return st;
        if (ql > 0) {
            W(wq_a, "attn_q_a", E, ql, 1);
            V(q_a_norm, "attn_q_a_norm", ql);
            W(wq_b, "attn_q_b", ql, H * qk, 1);
        } else {
            W(wq, "attn_q", E, H * qk, 1);
        }
        W(wkv_a, "attn_kv_a_mqa", E, r + rot, 1);
        V(kv_a_norm, "attn_kv_a_norm", r);
        W(wo, "attn_output", H * hp->mla_v_dim, E, 1);
        snprintf(name, sizeof name, "blk.%lld.attn_k_b.weight", (long long)il);
        st = get_w(g, name, hp->mla_nope, r, H, false, &L->wk_b, err, err_len);
        if (st == SP_OK) {
            W(wv_b, "attn_v_b", r, hp->mla_v_dim, H);
        } else if (st == SP_ERR_NOT_FOUND) {
            if (mla->wk_owned == NULL) {
                const size_t n = (size_t)hp->n_layer * (size_t)(H * r * hp->mla_nope);
                if ((mla->wk_owned = sp_malloc_aligned(n * sizeof(float), 64)) == NULL) {
                    return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
                }
            }
            snprintf(name, sizeof name, "blk.%lld.attn_kv_b.weight", (long long)il);
            float *dst = mla->wk_owned + (size_t)il * (size_t)(H * r * hp->mla_nope);
            if ((st = split_kv_b(m, g, name, L, dst, err, err_len)) != SP_OK) {
                return st;
            }
        } else {
            return st;
        }
#undef W
#undef V
    }
    return SP_OK;
}

void
sp__mla_free(struct sp_mla_model *mla)
{
    if (mla == NULL) {
        return;
    }
    sp_free(mla->wk_owned);
    sp_free(mla->layers);
    sp_free(mla);
}

/* ------------------------------------------------------------------------ */
/* Scratch                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct mla_buf {
    int64_t rows;      /* rows per chunk */
    float *qa;         /* (rows, q_lora) */
    float *qf;         /* (rows, n_head * (nope + n_rot)) */
    float *kva;        /* (rows, kv_lora + n_rot) */
    float *vo;         /* (rows, n_head * v_dim) */
    void *act;         /* (rows, act_stride) activations in the dot-product format */
    size_t act_stride;
} mla_buf_t;

static size_t
round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Bytes of one converted input of n elements (every dot-product format
 * takes at most 4 bytes per element), rounded to whole cache lines. */
static size_t
seg_bytes(int64_t n)
{
    return round64((size_t)n * 4);
}

static size_t
carve(const sp_model_t *m, int64_t max_rows, char *base, mla_buf_t *b)
{
    const sp_hparams_t *hp = &m->hp;
    const int64_t H = hp->n_head, R = max_rows < MLA_CHUNK_ROWS ? max_rows : MLA_CHUNK_ROWS;
    const int64_t qk = hp->mla_nope + hp->n_rot;
    size_t act = seg_bytes(hp->n_embd);
    const size_t cand[4] = {seg_bytes(hp->mla_q_lora), seg_bytes(H * hp->mla_v_dim),
                            (size_t)H * seg_bytes(hp->mla_nope),
                            (size_t)H * seg_bytes(hp->mla_kv_lora)};
    for (int i = 0; i < 4; i++) {
        act = cand[i] > act ? cand[i] : act;
    }
    size_t off = 0;
#define TAKE(field, type, count)                                          \
    b->field = base != NULL ? (type *)(base + off) : NULL;                \
    off += round64((size_t)(count) * sizeof(type));
    b->rows = R;
    TAKE(qa, float, R * (hp->mla_q_lora > 0 ? hp->mla_q_lora : 1));
    TAKE(qf, float, R * H * qk);
    TAKE(kva, float, R * (hp->mla_kv_lora + hp->n_rot));
    TAKE(vo, float, R * H * hp->mla_v_dim);
    TAKE(act, char, (size_t)R * act);
#undef TAKE
    b->act_stride = act;
    return off;
}

size_t
sp__mla_scratch_bytes(const sp_model_t *m, int64_t max_rows)
{
    mla_buf_t b;
    return m->mla == NULL ? 0 : carve(m, max_rows, NULL, &b);
}

/* ------------------------------------------------------------------------ */
/* Products                                                                  */
/* ------------------------------------------------------------------------ */

/* Convert, for each row t and matrix h, n_in floats at x + t xs + h x_mat
 * into act + t act_stride + h seg. */
typedef struct conv_job {
    sp_from_float_fn conv;
    const float *x;
    int64_t xs, x_mat, n_in, n_mat;
    char *act;
    size_t act_stride, seg;
} conv_job_t;

static void
conv_job_run(void *arg, int64_t t, int ith)
{
    conv_job_t *j = arg;
    (void)ith;
    for (int64_t h = 0; h < j->n_mat; h++) {
        j->conv(j->x + t * j->xs + h * j->x_mat, j->act + (size_t)t * j->act_stride + h * j->seg,
                j->n_in);
    }
}

typedef struct mm_job {
    const sp_cpu_kernels_t *k;
    const sp_mla_w_t *w;
    const void *x;     /* matrix h's input rows at x + h x_mat_bytes, x_stride bytes apart */
    size_t x_stride, x_mat_bytes;
    int64_t n_tok;
    float *y;          /* matrix h's outputs at y + h y_mat, rows ldy apart */
    int64_t ldy, y_mat;
    int64_t chunk, n_chunks; /* weight rows per item, items per matrix */
} mm_job_t;

static void
mm_job_run(void *arg, int64_t item, int ith)
{
    mm_job_t *j = arg;
    const sp_mla_w_t *w = j->w;
    const int64_t h = item / j->n_chunks, r0 = (item % j->n_chunks) * j->chunk;
    const int64_t r1 = r0 + j->chunk < w->n_out ? r0 + j->chunk : w->n_out;
    (void)ith;
    sp_cpu_gemm(j->k, w->type, w->n_in, (const char *)w->data + (size_t)h * w->mat_bytes,
                w->row_bytes, r0, r1, (const char *)j->x + (size_t)h * j->x_mat_bytes,
                j->x_stride, j->n_tok, j->y + h * j->y_mat, j->ldy);
}

/*
 * For each matrix h of w: y[t, h y_mat + i] = row i of matrix h . x[t, h x_mat ..
 * + n_in), for rows t < n_tok (x rows xs floats apart, y rows ldy apart).
 */
static void
mla_mm(sp_pool_t *pool, const sp_cpu_kernels_t *k, mla_buf_t *b, const sp_mla_w_t *w,
       const float *x, int64_t xs, int64_t x_mat, float *y, int64_t ldy, int64_t y_mat,
       int64_t n_tok)
{
    const sp_type_t at = k->vec_dot_type[w->type];
    mm_job_t j = {k, w, x, (size_t)xs * sizeof(float), (size_t)x_mat * sizeof(float), n_tok, y,
                  ldy, y_mat, 0, 0};
    if (at != SP_TYPE_F32) {
        /* each row the n_mat matrices' inputs side by side, densely (sp__act_row_stride) */
        const size_t seg = sp__act_row_stride(at, w->n_in);
        SP_ASSERT(seg <= seg_bytes(w->n_in) && (size_t)w->n_mat * seg <= b->act_stride);
        conv_job_t cj = {k->from_float[at], x, xs, x_mat, w->n_in, w->n_mat, b->act,
                         (size_t)w->n_mat * seg, seg};
        sp_pool_run_as(pool, "quantize", conv_job_run, &cj, n_tok);
        j.x = b->act;
        j.x_stride = (size_t)w->n_mat * seg;
        j.x_mat_bytes = seg;
    }
    const int nth = sp_pool_n_threads(pool);
    int64_t chunk = w->n_out * w->n_mat / ((int64_t)nth * 8);
    chunk = chunk < 16 ? 16 : (chunk + 15) & ~(int64_t)15;
    j.chunk = chunk;
    j.n_chunks = (w->n_out + chunk - 1) / chunk;
    sp_pool_run_as(pool, "mla_products", mm_job_run, &j, j.n_chunks * w->n_mat);
}

/* Per row: the latent key/value [k_pe, RMSNorm(c) * kv_a_norm] and each query
 * head's q_pe part. */
typedef struct assemble_job {
    const sp_model_t *m;
    const sp_mla_layer_t *L;
    const mla_buf_t *b;
    float *q, *kv_k, *kv_v;
    const sp_cpu_kernels_t *k;
} assemble_job_t;

static void
assemble_job_run(void *arg, int64_t t, int ith)
{
    assemble_job_t *j = arg;
    const sp_hparams_t *hp = &j->m->hp;
    const int64_t r = hp->mla_kv_lora, rot = hp->n_rot, D = hp->head_dim, H = hp->n_head;
    const int64_t qk = hp->mla_nope + rot;
    const float *kva = j->b->kva + t * (r + rot);
    float *kk = j->kv_k + t * D;
    (void)ith;
    memcpy(kk, kva + r, (size_t)rot * sizeof(float));
    j->k->rmsnorm(kk + rot, kva, j->L->kv_a_norm, r, hp->norm_eps);
    memcpy(j->kv_v + t * D, kk, (size_t)D * sizeof(float));
    for (int64_t h = 0; h < H; h++) {
        memcpy(j->q + t * H * D + h * D, j->b->qf + t * H * qk + h * qk + hp->mla_nope,
               (size_t)rot * sizeof(float));
    }
}

typedef struct norm_job {
    const sp_cpu_kernels_t *k;
    float *x;
    const float *w;
    int64_t n;
    float eps;
} norm_job_t;

static void
norm_job_run(void *arg, int64_t t, int ith)
{
    norm_job_t *j = arg;
    (void)ith;
    j->k->rmsnorm(j->x + t * j->n, j->x + t * j->n, j->w, j->n, j->eps);
}

void
sp__mla_qkv(const sp_model_t *m, int64_t il, sp_pool_t *pool, const sp_cpu_kernels_t *k,
            void *scratch, int64_t max_rows, const float *xn, float *q, float *kv_k,
            float *kv_v, int64_t n_rows)
{
    SP_ASSERT(m->mla != NULL && il >= 0 && il < m->hp.n_layer && n_rows <= max_rows);
    const sp_hparams_t *hp = &m->hp;
    const sp_mla_layer_t *L = &m->mla->layers[il];
    mla_buf_t b;
    carve(m, max_rows, scratch, &b);
    const int64_t E = hp->n_embd, H = hp->n_head, D = hp->head_dim, rot = hp->n_rot;
    const int64_t qk = hp->mla_nope + rot, r = hp->mla_kv_lora, ql = hp->mla_q_lora;
    for (int64_t r0 = 0; r0 < n_rows; r0 += b.rows) {
        const int64_t R = n_rows - r0 < b.rows ? n_rows - r0 : b.rows;
        const float *x = xn + r0 * E;
        float *qr = q + r0 * H * D;
        if (ql > 0) {
            mla_mm(pool, k, &b, &L->wq_a, x, E, 0, b.qa, ql, 0, R);
            norm_job_t nj = {k, b.qa, L->q_a_norm, ql, hp->norm_eps};
            sp_pool_run_as(pool, "norm", norm_job_run, &nj, R);
            mla_mm(pool, k, &b, &L->wq_b, b.qa, ql, 0, b.qf, H * qk, 0, R);
        } else {
            mla_mm(pool, k, &b, &L->wq, x, E, 0, b.qf, H * qk, 0, R);
        }
        mla_mm(pool, k, &b, &L->wkv_a, x, E, 0, b.kva, r + rot, 0, R);
        assemble_job_t aj = {m, L, &b, qr, kv_k + r0 * D, kv_v + r0 * D, k};
        sp_pool_run_as(pool, "mla_assemble", assemble_job_run, &aj, R);
        /* The absorbed queries: head h's latent part = wk_b_h q_nope_h. */
        mla_mm(pool, k, &b, &L->wk_b, b.qf, H * qk, qk, qr + rot, H * D, D, R);
    }
}

void
sp__mla_out(const sp_model_t *m, int64_t il, sp_pool_t *pool, const sp_cpu_kernels_t *k,
            void *scratch, int64_t max_rows, const float *att, float *proj, int64_t n_rows)
{
    SP_ASSERT(m->mla != NULL && il >= 0 && il < m->hp.n_layer && n_rows <= max_rows);
    const sp_hparams_t *hp = &m->hp;
    const sp_mla_layer_t *L = &m->mla->layers[il];
    mla_buf_t b;
    carve(m, max_rows, scratch, &b);
    const int64_t E = hp->n_embd, H = hp->n_head, D = hp->head_dim, v = hp->mla_v_dim;
    for (int64_t r0 = 0; r0 < n_rows; r0 += b.rows) {
        const int64_t R = n_rows - r0 < b.rows ? n_rows - r0 : b.rows;
        /* Head h's values from its latent output (past the n_rot k_pe lanes). */
        mla_mm(pool, k, &b, &L->wv_b, att + r0 * H * D + hp->n_rot, H * D, D, b.vo, H * v, v, R);
        mla_mm(pool, k, &b, &L->wo, b.vo, H * v, 0, proj + r0 * E, E, 0, R);
    }
}
