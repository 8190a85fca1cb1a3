/*
 * gpu.c - the forward pass on a CUDA device, strung together from the ops of
 * cuda_api.h (gpu.h explains where the engine calls in).
 *
 * Weights: every matrix of the GPU layers is held in F16 on the device,
 * dequantised once at attach (Q8_0/Q4_0 on the device from the stored blocks,
 * K-quants on the CPU first); norms, biases and RoPE frequencies in F32. Why
 * F16 rather than quantised kernels: cuBLAS's F16 GEMM with F32 accumulation
 * is the fast path for prefill and batched decode; decode at batch 1 pays
 * twice the weight reads of Q8_0 (docs/cuda.md).
 *
 * A step, for R rows (the CPU has already embedded them into x):
 *   upload: x, and one int32 block of positions, block-table offsets, output
 *           rows and the concatenated block tables of the step's sequences
 *   rope_cs once; xn = RMSNorm(x) (F16)
 *   per GPU layer: q, k, v = xn W (+ b); RoPE q, k; write k, v into the
 *           rows' slots; attention -> att (F16); proj = att Wo; x += proj,
 *           xn = RMSNorm(x); gate, up = xn W; ff = silu(gate) up (F16);
 *           proj = ff Wdown; x += proj (and the next layer's RMSNorm)
 *   full offload: output RMSNorm of the rows wanted, logits = xn Wout, download
 *   partial: download x, the CPU runs the remaining layers
 * Nothing is allocated per step. All ops of one model go to one stream, so
 * they run in order; the downloads synchronise.
 */
#include "cuda/gpu.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "cuda/cuda_common.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"
#include "sampan/log.h"

#define STAGE_BYTES ((size_t)64 << 20) /* weight upload chunk */
#define F16 2                          /* bytes */

typedef struct gpu_layer {
    void *wq, *wk, *wv, *wo, *gate, *up, *down; /* F16 */
    float *attn_norm, *ffn_norm, *bq, *bk, *bv; /* F32; biases may be NULL */
} gpu_layer_t;

struct sp_gpu_model {
    const sp_cuda_api_t *api;
    sp_cuda_ctx_t *ctx;
    const sp_model_t *m;
    int ordinal;
    int64_t n_gpu;   /* layers on the device */
    bool full;       /* every layer: the output runs on the device too */
    gpu_layer_t *L;  /* (n_gpu) */
    void *output;    /* F16 (n_vocab, n_embd), full only */
    float *output_norm;
    float *inv_freq; /* (n_rot / 2) */
    bool logged;     /* the first error has been logged */
};

struct sp_gpu_kv {
    sp_gpu_model_t *g;
    sp_cuda_kv_t desc;
    size_t block_bytes;
};

struct sp_gpu_batch {
    sp_gpu_model_t *g;
    int64_t max_tokens, max_seqs, max_bt;
    /* device */
    float *x, *q, *k, *v, *gate, *up, *proj, *cs, *logits;
    void *xn, *att, *ff; /* F16 */
    int32_t *ints;       /* pos (R) | bt (R) | rows (R) | btab (max_bt) */
    /* host staging of ints */
    int32_t *h_ints;
};

/* ------------------------------------------------------------- errors */

/* A failed op: log the driver's message once per model, mark the device. */
static sp_status_t
dev_fail(sp_gpu_model_t *g, int st, const char *what)
{
    if (st == SP_ERR_DEVICE || !g->api->healthy(g->ctx)) {
        sp_gpu_device_fail(g->ordinal);
    }
    if (!g->logged) {
        g->logged = true;
        SP_LOG_ERROR("event=gpu_error device=cuda:%d op=%s status=%s error=%s", g->ordinal, what,
                     sp_status_name((sp_status_t)st), sp_log_str(g->api->last_error(g->ctx)));
    }
    return st < 0 ? (sp_status_t)st : SP_ERR_DEVICE;
}

#define TRY(g, what, call)                                                                      \
    do {                                                                                        \
        int st_ = (call);                                                                       \
        if (st_ != SP_OK) return dev_fail((g), st_, (what));                                    \
    } while (0)

/* ------------------------------------------------------------- sizing */

static uint64_t
mat_bytes(const sp_weight_t *w)
{
    return (uint64_t)w->n_in * (uint64_t)w->n_out * F16;
}

static uint64_t
layer_bytes(const sp_model_t *m, int64_t il)
{
    const sp_layer_t *L = &m->layers[il];
    const sp_hparams_t *hp = &m->hp;
    uint64_t b = mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo) +
                 mat_bytes(&L->w_gate) + mat_bytes(&L->w_up) + mat_bytes(&L->w_down);
    b += 2 * (uint64_t)hp->n_embd * sizeof(float);
    if (L->bq) {
        b += (uint64_t)(L->wq.n_out + L->wk.n_out + L->wv.n_out) * sizeof(float);
    }
    return b;
}

uint64_t
sp_gpu_weight_bytes(const sp_model_t *m, int64_t n_gpu)
{
    const sp_hparams_t *hp = &m->hp;
    if (n_gpu < 0 || n_gpu > hp->n_layer) {
        n_gpu = hp->n_layer;
    }
    uint64_t b = (uint64_t)(hp->n_rot / 2 + 1) * sizeof(float);
    for (int64_t il = 0; il < n_gpu; il++) {
        b += layer_bytes(m, il);
    }
    if (n_gpu == hp->n_layer) {
        b += mat_bytes(&m->output) + (uint64_t)hp->n_embd * sizeof(float);
    }
    return b;
}

uint64_t
sp_gpu_kv_bytes(const sp_model_t *m, int64_t n_gpu, int64_t n_blocks, bool f16)
{
    const sp_hparams_t *hp = &m->hp;
    return (uint64_t)n_gpu * (uint64_t)hp->n_head_kv * 2 * SP_KV_BLOCK * (uint64_t)hp->head_dim *
           (f16 ? 2u : 4u) * (uint64_t)n_blocks;
}

/* The device buffers of a batch, in one list for create and for the estimate. */
enum { GB_X, GB_Q, GB_K, GB_V, GB_GATE, GB_UP, GB_PROJ, GB_CS, GB_LOGITS, GB_XN, GB_ATT, GB_FF,
       GB_INTS, GB_COUNT };

static void
batch_sizes(const sp_model_t *m, const sp_batch_params_t *p, uint64_t *B, int64_t *max_bt)
{
    const sp_hparams_t *hp = &m->hp;
    const uint64_t R = (uint64_t)p->max_tokens, S = (uint64_t)p->max_seqs;
    const uint64_t E = (uint64_t)hp->n_embd, F = (uint64_t)hp->n_ff;
    const uint64_t qd = (uint64_t)(hp->n_head * hp->head_dim);
    const uint64_t kvd = (uint64_t)(hp->n_head_kv * hp->head_dim);
    *max_bt = p->max_seqs * ((p->max_ctx + SP_KV_BLOCK - 1) / SP_KV_BLOCK);
    B[GB_X] = R * E * 4;
    B[GB_Q] = R * qd * 4;
    B[GB_K] = R * kvd * 4;
    B[GB_V] = R * kvd * 4;
    B[GB_GATE] = R * F * 4;
    B[GB_UP] = R * F * 4;
    B[GB_PROJ] = R * E * 4;
    B[GB_CS] = R * (uint64_t)(hp->n_rot > 0 ? hp->n_rot : 1) * 4;
    B[GB_LOGITS] = S * (uint64_t)hp->n_vocab * 4;
    B[GB_XN] = R * E * F16;
    B[GB_ATT] = R * qd * F16;
    B[GB_FF] = R * F * F16;
    B[GB_INTS] = (3 * R + (uint64_t)*max_bt) * sizeof(int32_t);
}

uint64_t
sp_gpu_batch_bytes(const sp_model_t *m, const sp_batch_params_t *p)
{
    uint64_t B[GB_COUNT], total = 0;
    int64_t max_bt;
    batch_sizes(m, p, B, &max_bt);
    for (int i = 0; i < GB_COUNT; i++) {
        total += B[i];
    }
    return total;
}

int64_t
sp_gpu_fit_layers(const sp_model_t *m, uint64_t budget, uint64_t fixed, uint64_t per_layer)
{
    const int64_t n = m->hp.n_layer;
    if (sp_gpu_weight_bytes(m, n) + fixed + per_layer * (uint64_t)n <= budget) {
        return n;
    }
    /* Partial: the output stays on the CPU; layers go on in order while they fit. */
    uint64_t used = fixed + (uint64_t)(m->hp.n_rot / 2 + 1) * sizeof(float);
    int64_t k = 0;
    while (k < n) {
        const uint64_t more = layer_bytes(m, k) + per_layer;
        if (used + more > budget) {
            break;
        }
        used += more;
        k++;
    }
    return k == n ? n - 1 : k; /* n layers without the output did fit, with it not */
}

/* ------------------------------------------------------------- upload */

typedef struct uploader {
    sp_gpu_model_t *g;
    void *stage;   /* device: raw blocks or F32 */
    float *h_f32;  /* host: K-quants dequantised here */
} uploader_t;

static bool
device_dequant(sp_type_t t)
{
    return t == SP_TYPE_F32 || t == SP_TYPE_F16 || t == SP_TYPE_BF16 || t == SP_TYPE_Q8_0 ||
           t == SP_TYPE_Q4_0;
}

/* A weight matrix to a new F16 device buffer, STAGE_BYTES at a time. */
static sp_status_t
upload_matrix(uploader_t *u, const sp_weight_t *w, void **out)
{
    sp_gpu_model_t *g = u->g;
    const sp_cuda_api_t *api = g->api;
    TRY(g, "alloc weights", api->alloc(g->ctx, (size_t)mat_bytes(w), out));
    const bool dev = device_dequant(w->type);
    const size_t in_row = dev ? w->row_bytes : (size_t)w->n_in * sizeof(float);
    int64_t rows = (int64_t)(STAGE_BYTES / in_row);
    if (rows < 1) {
        return sp_errf(NULL, 0, SP_ERR_UNSUPPORTED, "row too long");
    }
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    for (int64_t r0 = 0; r0 < w->n_out; r0 += rows) {
        const int64_t n = r0 + rows <= w->n_out ? rows : w->n_out - r0;
        const char *src = (const char *)w->data + (size_t)r0 * w->row_bytes;
        int type = (int)w->type;
        if (!dev) {
            if (k->to_float[w->type] == NULL) {
                return SP_ERR_UNSUPPORTED;
            }
            for (int64_t r = 0; r < n; r++) {
                k->to_float[w->type](src + (size_t)r * w->row_bytes, u->h_f32 + r * w->n_in,
                                     w->n_in);
            }
            src = (const char *)u->h_f32;
            type = SP_TYPE_F32;
        }
        TRY(g, "upload weights", api->h2d(g->ctx, u->stage, src, (size_t)n * in_row));
        TRY(g, "dequantise weights",
            api->to_f16(g->ctx, type, u->stage, (char *)*out + (size_t)r0 * w->n_in * F16,
                        n * w->n_in));
    }
    return SP_OK;
}

static sp_status_t
upload_vec(sp_gpu_model_t *g, const float *v, int64_t n, float **out)
{
    *out = NULL;
    if (v == NULL) {
        return SP_OK;
    }
    TRY(g, "alloc vector", g->api->alloc(g->ctx, (size_t)n * sizeof(float), (void **)out));
    TRY(g, "upload vector", g->api->h2d(g->ctx, *out, v, (size_t)n * sizeof(float)));
    return SP_OK;
}

void
sp__gpu_model_free(sp_gpu_model_t *g)
{
    if (g == NULL) {
        return;
    }
    /* Destroying the context frees every allocation it made. */
    g->api->ctx_destroy(g->ctx);
    sp_free(g->L);
    sp_free(g);
}

sp_status_t
sp_gpu_attach(sp_model_t *m, const sp_cuda_api_t *api, int ordinal, int64_t n_gpu, char *err,
              size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    if (api == NULL) {
        api = sp_gpu_api();
        if (api == NULL) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED, "GPU backend unavailable: %s",
                           sp_gpu_api_note());
        }
    }
    if (m->gpu != NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "model already has a GPU binding");
    }
    if (n_gpu < 0 || n_gpu > hp->n_layer) {
        n_gpu = hp->n_layer;
    }
    if (n_gpu == 0) {
        return SP_OK; /* nothing on the GPU: the CPU path as it is */
    }
    if (hp->head_dim > SP_CU_MAX_HEAD_DIM || hp->n_rot % 2 != 0) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "GPU: head_dim %lld is over %d (or n_rot odd)", (long long)hp->head_dim,
                       SP_CU_MAX_HEAD_DIM);
    }
    sp_gpu_model_t *g = sp_calloc(1, sizeof *g);
    if (g == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    g->api = api;
    g->m = m;
    g->ordinal = ordinal;
    g->n_gpu = n_gpu;
    g->full = n_gpu == hp->n_layer;
    char sub[256] = "";
    uploader_t u = {g, NULL, NULL};
    sp_status_t st = (sp_status_t)api->ctx_create(ordinal, &g->ctx, sub, sizeof sub);
    if (st != SP_OK) {
        sp_free(g);
        if (st == SP_ERR_DEVICE) {
            sp_gpu_device_fail(ordinal);
        }
        return sp_errf(err, err_len, st, "GPU cuda:%d: %s", ordinal, sub);
    }
    g->L = sp_calloc((size_t)n_gpu, sizeof *g->L);
    u.h_f32 = sp_malloc(STAGE_BYTES);
    if (g->L == NULL || u.h_f32 == NULL) {
        st = SP_ERR_NOMEM;
        goto fail;
    }
    if ((st = (sp_status_t)api->alloc(g->ctx, STAGE_BYTES, &u.stage)) != SP_OK) {
        goto fail;
    }
    for (int64_t il = 0; il < n_gpu && st == SP_OK; il++) {
        const sp_layer_t *L = &m->layers[il];
        gpu_layer_t *D = &g->L[il];
        if ((st = upload_matrix(&u, &L->wq, &D->wq)) != SP_OK ||
            (st = upload_matrix(&u, &L->wk, &D->wk)) != SP_OK ||
            (st = upload_matrix(&u, &L->wv, &D->wv)) != SP_OK ||
            (st = upload_matrix(&u, &L->wo, &D->wo)) != SP_OK ||
            (st = upload_matrix(&u, &L->w_gate, &D->gate)) != SP_OK ||
            (st = upload_matrix(&u, &L->w_up, &D->up)) != SP_OK ||
            (st = upload_matrix(&u, &L->w_down, &D->down)) != SP_OK ||
            (st = upload_vec(g, L->attn_norm, hp->n_embd, &D->attn_norm)) != SP_OK ||
            (st = upload_vec(g, L->ffn_norm, hp->n_embd, &D->ffn_norm)) != SP_OK ||
            (st = upload_vec(g, L->bq, L->wq.n_out, &D->bq)) != SP_OK ||
            (st = upload_vec(g, L->bk, L->wk.n_out, &D->bk)) != SP_OK ||
            (st = upload_vec(g, L->bv, L->wv.n_out, &D->bv)) != SP_OK) {
            break;
        }
    }
    if (st == SP_OK && g->full) {
        if ((st = upload_matrix(&u, &m->output, &g->output)) == SP_OK) {
            st = upload_vec(g, m->output_norm, hp->n_embd, &g->output_norm);
        }
    }
    if (st == SP_OK) {
        /* theta_i = pos / scale * base^(-2i / n_rot) / freq_factor_i, as batch.c. */
        const int64_t half = hp->n_rot / 2;
        float *f = u.h_f32;
        for (int64_t i = 0; i < half; i++) {
            double v = pow((double)hp->rope_base, -2.0 * (double)i / (double)hp->n_rot);
            if (m->rope_freqs != NULL) {
                v /= m->rope_freqs[i];
            }
            f[i] = (float)(v / hp->rope_scale);
        }
        st = upload_vec(g, f, half > 0 ? half : 1, &g->inv_freq);
    }
    if (st == SP_OK) {
        st = (sp_status_t)api->sync(g->ctx);
    }
    if (st != SP_OK) {
        goto fail;
    }
    api->free(g->ctx, u.stage);
    sp_free(u.h_f32);
    m->gpu = g;
    SP_LOG_INFO("event=gpu_model_ready device=cuda:%d layers=%lld/%lld device_mib=%.1f",
                ordinal, (long long)n_gpu, (long long)hp->n_layer,
                (double)api->bytes_in_use(g->ctx) / 1048576.0);
    return SP_OK;
fail:
    if (st == SP_ERR_UNSUPPORTED) {
        sp_errf(err, err_len, st, "GPU cuda:%d: a weight type has no dequantiser", ordinal);
    } else {
        const char *why = api->last_error(g->ctx);
        sp_errf(err, err_len, st, "GPU cuda:%d: uploading the weights failed: %s", ordinal,
                why[0] ? why : sp_status_str(st));
    }
    sp_free(u.h_f32);
    sp__gpu_model_free(g);
    return st;
}

int64_t
sp_gpu_model_layers(const sp_model_t *m)
{
    return m->gpu ? m->gpu->n_gpu : 0;
}

int
sp_gpu_model_ordinal(const sp_model_t *m)
{
    return m->gpu ? m->gpu->ordinal : -1;
}

uint64_t
sp_gpu_model_device_bytes(const sp_model_t *m)
{
    return m->gpu ? m->gpu->api->bytes_in_use(m->gpu->ctx) : 0;
}

/* ------------------------------------------------------------- KV pool */

sp_status_t
sp__gpu_kv_create(sp_gpu_model_t *g, int64_t n_blocks, bool f16, sp_gpu_kv_t **out, char *err,
                  size_t err_len)
{
    *out = NULL;
    const sp_hparams_t *hp = &g->m->hp;
    sp_gpu_kv_t *kv = sp_calloc(1, sizeof *kv);
    if (kv == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    kv->g = g;
    sp_cuda_kv_t *d = &kv->desc;
    d->f16 = f16;
    d->n_blocks = n_blocks;
    d->n_layer = g->n_gpu;
    d->n_head_kv = hp->n_head_kv;
    d->head_dim = hp->head_dim;
    d->tile_elems = SP_KV_BLOCK * hp->head_dim;
    d->block_elems = g->n_gpu * hp->n_head_kv * 2 * d->tile_elems;
    kv->block_bytes = (size_t)d->block_elems * (f16 ? 2 : 4);
    const size_t bytes = kv->block_bytes * (size_t)n_blocks;
    int st = g->api->alloc(g->ctx, bytes, &d->d_data);
    if (st != SP_OK) {
        sp_free(kv);
        dev_fail(g, st, "alloc kv pool");
        return sp_errf(err, err_len, (sp_status_t)st, "GPU cuda:%d: KV pool of %zu bytes: %s",
                       g->ordinal, bytes, g->api->last_error(g->ctx));
    }
    *out = kv;
    return SP_OK;
}

void
sp__gpu_kv_destroy(sp_gpu_kv_t *kv)
{
    if (kv == NULL) {
        return;
    }
    kv->g->api->free(kv->g->ctx, kv->desc.d_data);
    sp_free(kv);
}

void
sp__gpu_kv_copy_block(sp_gpu_kv_t *kv, int32_t dst, int32_t src)
{
    sp_gpu_model_t *g = kv->g;
    int st = g->api->d2d(g->ctx, (char *)kv->desc.d_data + (size_t)dst * kv->block_bytes,
                         (const char *)kv->desc.d_data + (size_t)src * kv->block_bytes,
                         kv->block_bytes);
    if (st != SP_OK) {
        dev_fail(g, st, "kv copy block"); /* the next step fails on the poisoned context */
    }
}

/* ------------------------------------------------------------- batch */

void
sp__gpu_batch_destroy(sp_gpu_batch_t *b)
{
    if (b == NULL) {
        return;
    }
    const sp_cuda_api_t *api = b->g->api;
    sp_cuda_ctx_t *c = b->g->ctx;
    void *bufs[] = {b->x, b->q, b->k, b->v, b->gate, b->up, b->proj, b->cs, b->logits,
                    b->xn, b->att, b->ff, b->ints};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        api->free(c, bufs[i]);
    }
    sp_free(b->h_ints);
    sp_free(b);
}

sp_status_t
sp__gpu_batch_create(sp_gpu_model_t *g, const sp_batch_params_t *p, sp_gpu_batch_t **out,
                     char *err, size_t err_len)
{
    *out = NULL;
    sp_gpu_batch_t *b = sp_calloc(1, sizeof *b);
    if (b == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    b->g = g;
    b->max_tokens = p->max_tokens;
    b->max_seqs = p->max_seqs;
    uint64_t B[GB_COUNT];
    batch_sizes(g->m, p, B, &b->max_bt);
    void **dst[GB_COUNT] = {
        (void **)&b->x,    (void **)&b->q,      (void **)&b->k,  (void **)&b->v,
        (void **)&b->gate, (void **)&b->up,     (void **)&b->proj, (void **)&b->cs,
        (void **)&b->logits, &b->xn,            &b->att,         &b->ff,
        (void **)&b->ints,
    };
    int st = SP_OK;
    for (int i = 0; i < GB_COUNT && st == SP_OK; i++) {
        st = g->api->alloc(g->ctx, (size_t)B[i], dst[i]);
    }
    b->h_ints = sp_malloc((size_t)B[GB_INTS]);
    if (st != SP_OK || b->h_ints == NULL) {
        if (st != SP_OK) {
            dev_fail(g, st, "alloc batch");
        }
        sp_errf(err, err_len, st != SP_OK ? (sp_status_t)st : SP_ERR_NOMEM,
                "GPU cuda:%d: batch buffers (%lld rows): %s", g->ordinal,
                (long long)p->max_tokens, st != SP_OK ? g->api->last_error(g->ctx) : "host OOM");
        sp__gpu_batch_destroy(b);
        return st != SP_OK ? (sp_status_t)st : SP_ERR_NOMEM;
    }
    *out = b;
    return SP_OK;
}

/* Logits of n rows of x (d_rows into x) into host out, through the output
 * norm and matrix, at most max_seqs rows per pass. */
static sp_status_t
output_rows(sp_gpu_batch_t *b, const int32_t *d_rows, int64_t n, float *out)
{
    sp_gpu_model_t *g = b->g;
    const sp_cuda_api_t *api = g->api;
    const sp_hparams_t *hp = &g->m->hp;
    for (int64_t r0 = 0; r0 < n; r0 += b->max_seqs) {
        const int64_t k = r0 + b->max_seqs <= n ? b->max_seqs : n - r0;
        TRY(g, "output norm", api->add_rmsnorm(g->ctx, b->x, NULL, g->output_norm, d_rows + r0,
                                               k, hp->n_embd, hp->norm_eps, b->xn, 1));
        TRY(g, "output gemm", api->gemm(g->ctx, g->output, hp->n_vocab, hp->n_embd, b->xn, k,
                                        b->logits, NULL));
        TRY(g, "logits download", api->d2h(g->ctx, out + r0 * hp->n_vocab, b->logits,
                                           (size_t)k * (size_t)hp->n_vocab * sizeof(float)));
    }
    return SP_OK;
}

sp_status_t
sp__gpu_batch_run(sp_gpu_batch_t *b, sp_gpu_kv_t *kv, const sp_gpu_step_t *s)
{
    sp_gpu_model_t *g = b->g;
    const sp_cuda_api_t *api = g->api;
    sp_cuda_ctx_t *c = g->ctx;
    const sp_hparams_t *hp = &g->m->hp;
    const int64_t R = s->n_rows, E = hp->n_embd, hd = hp->head_dim;
    const int64_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    if (kv == NULL || kv->g != g || R < 1 || R > b->max_tokens || s->n_seqs > b->max_seqs) {
        return SP_ERR_INVALID;
    }
    if (!api->healthy(c)) {
        return dev_fail(g, SP_ERR_DEVICE, "step on an unhealthy device");
    }

    /* The step's integers: pos | bt | output rows | block tables. */
    int32_t *pos = b->h_ints, *bt = pos + b->max_tokens, *rows = bt + b->max_tokens;
    int32_t *btab = rows + b->max_tokens;
    int64_t n_bt = 0, n_out = 0, row = 0;
    for (int64_t i = 0; i < s->n_seqs; i++) {
        const sp_batch_seq_t *q = &s->seqs[i];
        const int64_t need = (q->pos + q->n_tokens + SP_KV_BLOCK - 1) / SP_KV_BLOCK;
        if (n_bt + need > b->max_bt) {
            return SP_ERR_INVALID;
        }
        for (int64_t k = 0; k < q->n_tokens; k++, row++) {
            pos[row] = (int32_t)s->row_pos[row];
            bt[row] = (int32_t)n_bt;
        }
        memcpy(btab + n_bt, q->blocks, (size_t)need * sizeof(int32_t));
        n_bt += need;
        if (s->out == SP_BATCH_OUT_SEQ) {
            s->seq_out[i] = q->logits ? n_out : -1;
            if (q->logits) {
                rows[n_out++] = (int32_t)(row - 1);
            }
        }
    }
    if (s->out == SP_BATCH_OUT_ALL) {
        for (int64_t t = 0; t < R; t++) {
            rows[t] = (int32_t)t;
        }
        n_out = R;
    }
    /* Upload what is used: the three row arrays keep their max_tokens slots. */
    TRY(g, "upload rows", api->h2d(c, b->ints, b->h_ints,
                                   (size_t)(3 * b->max_tokens + n_bt) * sizeof(int32_t)));
    TRY(g, "upload x", api->h2d(c, b->x, s->x, (size_t)(R * E) * sizeof(float)));
    const int32_t *d_pos = b->ints, *d_bt = b->ints + b->max_tokens;
    const int32_t *d_rows = d_bt + b->max_tokens, *d_btab = d_rows + b->max_tokens;
    const sp_cuda_rows_t rw = {R, d_pos, d_bt, d_btab};

    TRY(g, "rope_cs", api->rope_cs(c, d_pos, R, g->inv_freq, hp->n_rot, b->cs));
    TRY(g, "attn norm", api->add_rmsnorm(c, b->x, NULL, g->L[0].attn_norm, NULL, R, E,
                                         hp->norm_eps, b->xn, 1));
    const float scale = 1.0f / sqrtf((float)hd);
    const int neox = hp->rope_type == SP_ROPE_NEOX;
    for (int64_t il = 0; il < g->n_gpu; il++) {
        const gpu_layer_t *L = &g->L[il];
        TRY(g, "gemm q", api->gemm(c, L->wq, qd, E, b->xn, R, b->q, L->bq));
        TRY(g, "gemm k", api->gemm(c, L->wk, kvd, E, b->xn, R, b->k, L->bk));
        TRY(g, "gemm v", api->gemm(c, L->wv, kvd, E, b->xn, R, b->v, L->bv));
        TRY(g, "rope q", api->rope(c, b->q, R, hp->n_head, hd, hp->n_rot, b->cs, neox));
        TRY(g, "rope k", api->rope(c, b->k, R, hp->n_head_kv, hd, hp->n_rot, b->cs, neox));
        TRY(g, "kv write", api->kv_write(c, &kv->desc, il, b->k, b->v, &rw));
        TRY(g, "attention", api->attn(c, &kv->desc, il, b->q, hp->n_head, scale, &rw, b->att));
        TRY(g, "gemm o", api->gemm(c, L->wo, E, qd, b->att, R, b->proj, NULL));
        TRY(g, "ffn norm", api->add_rmsnorm(c, b->x, b->proj, L->ffn_norm, NULL, R, E,
                                            hp->norm_eps, b->xn, 1));
        TRY(g, "gemm gate", api->gemm(c, L->gate, hp->n_ff, E, b->xn, R, b->gate, NULL));
        TRY(g, "gemm up", api->gemm(c, L->up, hp->n_ff, E, b->xn, R, b->up, NULL));
        TRY(g, "swiglu", api->swiglu(c, b->gate, b->up, R * hp->n_ff, b->ff));
        TRY(g, "gemm down", api->gemm(c, L->down, E, hp->n_ff, b->ff, R, b->proj, NULL));
        const float *next = il + 1 < g->n_gpu ? g->L[il + 1].attn_norm : NULL;
        TRY(g, "residual", api->add_rmsnorm(c, b->x, b->proj, next, NULL, R, E, hp->norm_eps,
                                            b->xn, 1));
    }
    if (!g->full) {
        TRY(g, "x download", api->d2h(c, s->x_out, b->x, (size_t)(R * E) * sizeof(float)));
        return SP_OK;
    }
    if (s->out == SP_BATCH_OUT_HIDDEN) {
        TRY(g, "output norm", api->add_rmsnorm(c, b->x, NULL, g->output_norm, NULL, R, E,
                                               hp->norm_eps, b->proj, 0));
        TRY(g, "hidden download", api->d2h(c, s->hidden, b->proj,
                                           (size_t)(R * E) * sizeof(float)));
        return SP_OK;
    }
    if (n_out > 0) {
        sp_status_t st = output_rows(b, d_rows, n_out, s->logits);
        if (st != SP_OK) {
            return st;
        }
    }
    return SP_OK;
}
