/*
 * gpu.c - the forward pass on a CUDA device, strung together from the ops of
 * cuda_api.h (gpu.h explains where the engine calls in).
 *
 * Weights ($SAMPAN_CUDA_WEIGHTS, read at attach; docs/cuda.md says why each):
 *   f16 (default)  every matrix of the GPU layers in F16 on the device,
 *                  dequantised once at attach (Q8_0/Q4_0 on the device from
 *                  the stored blocks, K-quants on the CPU first): cuBLAS for
 *                  every product.
 *   native         Q8_0/Q4_0 matrices stay quantised (split layout,
 *                  cuda_api.h): up to SP_CUDA_GEMV_MAX_ROWS rows go through
 *                  gemv_q (the weights read once at their stored size); more
 *                  rows dequantise the matrix into the batch's F16 scratch and
 *                  use cuBLAS. Other types as in f16.
 *   both           quantised and F16 copies: gemv_q for few rows, cuBLAS on
 *                  the resident F16 copy for more (the most device memory).
 * Norms, biases and RoPE frequencies in F32.
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
 * The architectures' variations (docs/cuda.md has the table) slot into this
 * sequence as batch.c has them: q/k norms after their GEMMs, post-norms on
 * proj before the add, proj times the residual scale before the add, a
 * missing pre-norm as xn = F16(x), the logits times 1 / logit_scale and
 * soft-capped, cos/sin from the batch's RoPE table (LongRoPE: short or long
 * by its context) times the attention factor.
 * Nothing is allocated per step. All ops of one model go to one stream, so
 * they run in order; the downloads synchronise.
 *
 * CUDA graphs ($SAMPAN_CUDA_GRAPHS, default on): a decode step (every
 * sequence one row; full offload with the logits of the sequences, or
 * partial offload) runs padded to a bucket of rows (1, 2, 4, ... up to
 * max_seqs), and the bucket's ops are captured once and replayed. What
 * changes per step lives in fixed device buffers uploaded before the launch
 * (x, positions, block-table offsets, block tables, with a two-part pool
 * the sliding tables at a fixed offset past them, output rows); no op
 * takes a per-step host value (attention and kv_write read each row's
 * position from the device). Pad rows have x = 0, position 0 and a table of
 * one entry: the KV pool's pad block (each part's own), a block past the
 * scheduler's ids that nothing else reads; their logits rows gather row 0 and are never
 * downloaded. The first step of a bucket runs its padded ops eagerly (so
 * cuBLAS and lazily loaded kernels are initialised outside the capture),
 * the second captures. Graphs are dropped and recaptured when the step
 * uses another KV pool than they were captured with (the only buffer that
 * can change under a batch). A capture that fails (SP_ERR_UNSUPPORTED) logs
 * event=gpu_graph_fallback and the batch runs eagerly from then on; a CUDA
 * error in a capture or a launch is a device error like any other.
 *
 * Pinned host memory ($SAMPAN_CUDA_PINNED, default on): every host buffer a
 * step copies to or from (the batch's x, logits and hidden rows, which the
 * engine owns, and this file's integer block and candidate buffer) is
 * page-locked once at batch creation with host_register, so the copies are
 * DMA at link speed, and unregistered at destroy (before the memory is
 * freed). A registration that fails logs event=gpu_pin_fallback and that
 * buffer stays pageable; nothing else changes. Only a logits_all step's
 * output (the caller's buffer) is copied pageable.
 *
 * Candidates ($SAMPAN_CUDA_CANDIDATES, default on): a decode step whose
 * caller asks, per sequence, for only the k <= 64 best logits (the engine
 * decides from the request's sampling parameters: sp_gen_candidates) runs
 * topk on the device over the step's logits rows with the largest k asked
 * and downloads k ids and values per row instead of n_vocab floats; the
 * rows that asked for none still come back whole (consecutive ones in one
 * copy). topk runs after the graph launch, eagerly, so the graphs do not
 * depend on k.
 */
#include "engine/gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "cuda/cuda_common.h"
#include "engine/model_impl.h"
#include "engine/sampler.h"
#include "engine/yarn.h"
#include "kernels/kernels.h"
#include "sampan/log.h"

#define STAGE_BYTES ((size_t)64 << 20) /* weight upload chunk */

_Static_assert(SP_BATCH_MAX_CANDIDATES <= SP_CU_MAX_TOPK &&
                   SP_CUDA_MAX_CANDIDATES == SP_BATCH_MAX_CANDIDATES &&
                   SP_SAMPLER_MAX_CANDIDATES == SP_BATCH_MAX_CANDIDATES,
               "candidates: one limit, within the topk op's");
#define F16 2                          /* bytes */

/* How weight matrices are held (SAMPAN_CUDA_WEIGHTS). */
enum { W_F16, W_NATIVE, W_BOTH };

/* One weight matrix (n_out, n_in) on the device: F16, quantised (split
 * layout), or both. Native mode keeps only q for Q8_0/Q4_0. */
typedef struct gpu_mat {
    void *f16;
    void *q;
    int qtype;
    int64_t n_out, n_in;
} gpu_mat_t;

typedef struct gpu_layer {
    gpu_mat_t wq, wk, wv, wo, gate, up, down;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv; /* F32; biases may be NULL */
    float *q_norm, *k_norm;       /* (head_dim) per-head q/k norms (qwen3, gemma3), or
                                     (q_dim), (kv_dim) over the whole projection (olmo2),
                                     or NULL */
    float *post_attn, *post_ffn;  /* (n_embd) gemma's and olmo2's post-norms or NULL */
    float *bo;                    /* (n_embd) attention output bias (gpt-oss) or NULL */
    float *sinks;                 /* (n_head) attention sink logits (gpt-oss) or NULL */
} gpu_layer_t;

struct sp_gpu_model {
    const sp_cuda_api_t *api;
    sp_cuda_ctx_t *ctx;
    const sp_model_t *m;
    int ordinal;
    int mode;        /* W_* */
    int64_t n_gpu;   /* layers on the device */
    bool full;       /* every layer: the output runs on the device too */
    gpu_layer_t *L;  /* (n_gpu) */
    gpu_mat_t output; /* (n_vocab, n_embd), full only */
    float *output_norm;
    float *inv_freq; /* (n_rot / 2): the file's factors (LongRoPE: the short set), YaRN's mix */
    /* LongRoPE's table with the long factors, for batches whose context is
     * past the original one (as batch.c chooses), or NULL. */
    float *inv_freq_long;
    /* The sliding layers' own RoPE table (gemma3: another base, unscaled),
     * or NULL when they rotate as the others. */
    float *inv_freq_swa;
    double mscale;   /* cos and sin times this: LongRoPE's and YaRN's attention factor */
    bool logged;     /* the first error has been logged */
};

/* The device part of a KV pool. One part: every GPU layer in desc. Two parts
 * (a sliding part, kv.c): desc holds the global GPU layers and swa the
 * sliding ones, each with its own block ids (the host pool's) and its own pad
 * block; slot[il] is layer il's index within its part. A part with no GPU
 * layer has no device memory (d_data NULL). */
typedef struct gpu_kv_part {
    sp_cuda_kv_t desc; /* n_blocks counts the pad block */
    int32_t pad_block; /* the block past the scheduler's: graph pad rows write here */
    size_t block_bytes;
} gpu_kv_part_t;

struct sp_gpu_kv {
    sp_gpu_model_t *g;
    gpu_kv_part_t part[2]; /* global (or every layer), sliding */
    bool split;            /* two parts: the step uploads the sliding tables too */
    int32_t *slot;         /* (n_gpu) a layer's index within its part */
    bool *in_swa;          /* (n_gpu) the layer is in the sliding part */
};

#define MAX_BUCKETS 40

struct sp_gpu_batch {
    sp_gpu_model_t *g;
    int64_t max_tokens, max_seqs, max_bt;
    const float *inv_freq; /* the model's table for this batch's context (LongRoPE) */
    /* device */
    float *x, *q, *k, *v, *gate, *up, *proj, *cs, *cs_swa, *logits;
    void *xn, *att, *ff; /* F16 */
    int32_t *ints;       /* pos (R) | bt (R) | rows (R) | btab (max_bt + 1)
                            [| sliding btab (max_bt + 1), when swa_tab] */
    bool swa_tab;        /* room for the sliding tables of a two-part pool */
    float *zeros;        /* (max_seqs, n_embd) zeros: the x of graph pad rows */
    void *wscratch;      /* F16 of the largest native-only matrix (native mode), or NULL */
    /* host staging of ints */
    int32_t *h_ints;
    const char *fail_op; /* the op that failed in step_layers / step_output */
    /* pinned host ranges, unregistered at destroy */
    bool pin_on;
    int n_pins;
    void *pins[8];
    /* candidates: device ids | values of the last step's rows (max_seqs x
     * SP_CU_MAX_TOPK each), and their pinned host copy */
    bool cand_on;
    bool cand_logged;
    int32_t *cand;
    int32_t *h_cand;
    int cand_k;       /* k of the last step's topk (the row stride), 0 = none */
    int64_t cand_rows; /* rows it ran over */
    /* decode graphs, one per bucket of rows */
    bool graphs;
    int n_buckets;
    int64_t bucket[MAX_BUCKETS];
    bool warm[MAX_BUCKETS]; /* ran eagerly once at this size */
    sp_cuda_graph_t *graph[MAX_BUCKETS];
    sp_cuda_kv_t graph_kv[2]; /* the pool (both parts) the graphs were captured with */
    bool graph_kv_set;
};

/* ------------------------------------------------------------- errors */

/* A failed op: log the driver's message once per model, mark the device. */
static sp_status_t
dev_fail(sp_gpu_model_t *g, int st, const char *what)
{
    if (st == SP_ERR_DEVICE || !g->api->healthy(g->ctx)) {
        sp_loader_device_fail(g->ordinal);
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

/* ------------------------------------------------------------- modes */

/* SAMPAN_CUDA_WEIGHTS: W_F16 when unset or empty, -1 for an unknown value. */
static int
weights_mode(void)
{
    const char *v = getenv("SAMPAN_CUDA_WEIGHTS");
    if (v == NULL || v[0] == '\0' || strcmp(v, "f16") == 0) {
        return W_F16;
    }
    if (strcmp(v, "native") == 0) {
        return W_NATIVE;
    }
    return strcmp(v, "both") == 0 ? W_BOTH : -1;
}

static const char *const mode_names[] = {"f16", "native", "both"};

/* A switch of the environment: 1 (unset, empty, 1, on, true), 0 (0, off,
 * false), -1 otherwise. */
static int
switch_env(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0' || !strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "true")) {
        return 1;
    }
    return !strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false") ? 0 : -1;
}

/* The switches batches read when created (SAMPAN_CUDA_GRAPHS, _PINNED,
 * _CANDIDATES): the first with a bad value, or NULL. */
static const char *
bad_switch(void)
{
    static const char *const names[] = {"SAMPAN_CUDA_GRAPHS", "SAMPAN_CUDA_PINNED",
                                        "SAMPAN_CUDA_CANDIDATES"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (switch_env(names[i]) < 0) {
            return names[i];
        }
    }
    return NULL;
}

static bool
kept_quantised(const sp_weight_t *w, int mode)
{
    return mode != W_F16 && (w->type == SP_TYPE_Q8_0 || w->type == SP_TYPE_Q4_0) &&
           w->n_in % SP_CU_QK == 0;
}

/* ------------------------------------------------------------- sizing */

static uint64_t
mat_bytes_mode(const sp_weight_t *w, int mode)
{
    const uint64_t f16 = (uint64_t)w->n_in * (uint64_t)w->n_out * F16;
    if (!kept_quantised(w, mode)) {
        return f16;
    }
    const uint64_t q = (uint64_t)sp_cu_qsplit_bytes((int)w->type, w->n_in * w->n_out);
    return mode == W_NATIVE ? q : q + f16;
}

static uint64_t
mat_bytes(const sp_weight_t *w)
{
    const int mode = weights_mode();
    return mat_bytes_mode(w, mode < 0 ? W_F16 : mode);
}

/* Floats of a layer's q (q) or k norm: a head's, or the whole projection's
 * (olmo2, hp->qk_norm_full). */
static int64_t
qk_norm_len(const sp_hparams_t *hp, bool q)
{
    if (!hp->qk_norm_full) {
        return hp->head_dim;
    }
    return (q ? hp->n_head : hp->n_head_kv) * hp->head_dim;
}

static uint64_t
layer_bytes(const sp_model_t *m, int64_t il)
{
    const sp_layer_t *L = &m->layers[il];
    const sp_hparams_t *hp = &m->hp;
    uint64_t b = mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo) +
                 mat_bytes(&L->w_gate) + mat_bytes(&L->w_up) + mat_bytes(&L->w_down);
    b += (uint64_t)((L->attn_norm != NULL) + (L->ffn_norm != NULL)) * (uint64_t)hp->n_embd *
         sizeof(float);
    if (L->attn_q_norm) {
        b += (uint64_t)(qk_norm_len(hp, true) + qk_norm_len(hp, false)) * sizeof(float);
    }
    if (L->attn_post_norm) {
        b += (uint64_t)hp->n_embd * sizeof(float);
    }
    if (L->ffn_post_norm) {
        b += (uint64_t)hp->n_embd * sizeof(float);
    }
    if (L->bq) {
        b += (uint64_t)(L->wq.n_out + L->wk.n_out + L->wv.n_out) * sizeof(float);
    }
    if (L->bo) {
        b += (uint64_t)hp->n_embd * sizeof(float);
    }
    if (L->attn_sinks) {
        b += (uint64_t)hp->n_head * sizeof(float);
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
    uint64_t b = (uint64_t)(3 * (hp->n_rot / 2) + 3) * sizeof(float); /* the RoPE tables */
    for (int64_t il = 0; il < n_gpu; il++) {
        b += layer_bytes(m, il);
    }
    if (n_gpu == hp->n_layer) {
        b += mat_bytes(&m->output) + (uint64_t)hp->n_embd * sizeof(float);
    }
    return b;
}

/* GPU layers [0, n_gpu) that go to the sliding part of a two-part pool. */
static int64_t
gpu_swa_layers(const sp_model_t *m, int64_t n_gpu)
{
    int64_t n = 0;
    for (int64_t il = 0; il < n_gpu && m->hp.n_swa > 0; il++) {
        n += m->hp.layer_swa[il] != 0;
    }
    return n;
}

uint64_t
sp_gpu_kv_bytes(const sp_model_t *m, int64_t n_gpu, int64_t n_blocks, bool f16)
{
    return sp_gpu_kv_bytes_split(m, n_gpu, n_blocks, 0, f16);
}

uint64_t
sp_gpu_kv_bytes_split(const sp_model_t *m, int64_t n_gpu, int64_t n_blocks,
                      int64_t n_swa_blocks, bool f16)
{
    const sp_hparams_t *hp = &m->hp;
    const uint64_t layer = (uint64_t)hp->n_head_kv * 2 * SP_KV_BLOCK * (uint64_t)hp->head_dim *
                           (f16 ? 2u : 4u); /* one layer of one block */
    const int64_t n_s = n_swa_blocks > 0 ? gpu_swa_layers(m, n_gpu) : 0;
    /* + 1: each part's pad block of graph pad rows (none for a part without layers) */
    const uint64_t g = n_gpu > n_s ? (uint64_t)(n_gpu - n_s) * layer * (uint64_t)(n_blocks + 1)
                                   : 0;
    const uint64_t s = n_s > 0 ? (uint64_t)n_s * layer * (uint64_t)(n_swa_blocks + 1) : 0;
    return g + s;
}

/* Whether the sliding layers rotate with a table of their own: gemma3's
 * second base (batch.c's rope_swa, less what only gemma4 has, refused at
 * attach). */
static bool
rope_swa(const sp_model_t *m)
{
    const sp_hparams_t *hp = &m->hp;
    bool any = false;
    for (int64_t il = 0; il < hp->n_layer; il++) {
        any |= hp->layer_swa[il] != 0;
    }
    return any && (hp->rope_base_swa != hp->rope_base || hp->rope_scale_swa != hp->rope_scale);
}

/* The device buffers of a batch, in one list for create and for the estimate. */
enum { GB_X, GB_Q, GB_K, GB_V, GB_GATE, GB_UP, GB_PROJ, GB_CS, GB_CS_SWA, GB_LOGITS, GB_XN,
       GB_ATT, GB_FF, GB_INTS, GB_ZEROS, GB_WSCRATCH, GB_CAND, GB_COUNT };

/* F16 bytes of the largest matrix native mode keeps only quantised (every
 * layer and the output: an upper bound for a partial offload). */
static uint64_t
native_scratch_bytes(const sp_model_t *m, int mode)
{
    if (mode != W_NATIVE) {
        return 0;
    }
    uint64_t mx = 0;
    for (int64_t il = 0; il < m->hp.n_layer; il++) {
        const sp_layer_t *L = &m->layers[il];
        const sp_weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                   &L->w_down};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) {
            if (kept_quantised(ws[k], mode)) {
                const uint64_t b = (uint64_t)ws[k]->n_in * (uint64_t)ws[k]->n_out * F16;
                mx = b > mx ? b : mx;
            }
        }
    }
    if (kept_quantised(&m->output, mode)) {
        const uint64_t b = (uint64_t)m->output.n_in * (uint64_t)m->output.n_out * F16;
        mx = b > mx ? b : mx;
    }
    return mx;
}

static void
batch_sizes(const sp_model_t *m, const sp_batch_params_t *p, int mode, uint64_t *B,
            int64_t *max_bt)
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
    B[GB_CS_SWA] = rope_swa(m) ? B[GB_CS] : 0;
    B[GB_LOGITS] = S * (uint64_t)hp->n_vocab * 4;
    B[GB_XN] = R * E * F16;
    B[GB_ATT] = R * qd * F16;
    B[GB_FF] = R * F * F16;
    /* A model with sliding layers may get a two-part pool: room for the
     * sliding tables too, at the same offsets one table area further. */
    B[GB_INTS] = (3 * R + (gpu_swa_layers(m, hp->n_layer) > 0 ? 2 : 1) *
                              ((uint64_t)*max_bt + 1)) * sizeof(int32_t);
    B[GB_ZEROS] = S * E * 4;
    B[GB_WSCRATCH] = native_scratch_bytes(m, mode);
    B[GB_CAND] = S * SP_CU_MAX_TOPK * (sizeof(int32_t) + sizeof(float));
}

uint64_t
sp_gpu_batch_bytes(const sp_model_t *m, const sp_batch_params_t *p)
{
    uint64_t B[GB_COUNT], total = 0;
    int64_t max_bt;
    const int mode = weights_mode();
    batch_sizes(m, p, mode < 0 ? W_F16 : mode, B, &max_bt);
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
    uint64_t used = fixed + (uint64_t)(3 * (m->hp.n_rot / 2) + 3) * sizeof(float);
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

/* A Q8_0/Q4_0 matrix to a new device buffer in the split layout (quants,
 * then scales; cuda_api.h), repacked on the host STAGE_BYTES at a time. */
static sp_status_t
upload_split(uploader_t *u, const sp_weight_t *w, gpu_mat_t *d)
{
    sp_gpu_model_t *g = u->g;
    const sp_cuda_api_t *api = g->api;
    const int type = (int)w->type;
    const int64_t n = w->n_out * w->n_in, nb = w->n_in / SP_CU_QK;
    TRY(g, "alloc weights", api->alloc(g->ctx, (size_t)sp_cu_qsplit_bytes(type, n), &d->q));
    const size_t row_q = (size_t)sp_cu_qsplit_qs_bytes(type, w->n_in), row_s = (size_t)nb * 2;
    const int64_t rows = (int64_t)(STAGE_BYTES / (row_q + row_s));
    if (rows < 1) {
        return sp_errf(NULL, 0, SP_ERR_UNSUPPORTED, "row too long");
    }
    uint8_t *hq = (uint8_t *)u->h_f32;
    const size_t qk_bytes = (size_t)SP_CU_QK / (type == SP_CU_Q4_0 ? 2 : 1);
    const size_t blk = type == SP_CU_Q4_0 ? sizeof(sp_cu_block_q4_0) : sizeof(sp_cu_block_q8_0);
    char *dq = d->q;
    char *ds = dq + sp_cu_qsplit_scales_off(type, n);
    for (int64_t r0 = 0; r0 < w->n_out; r0 += rows) {
        const int64_t k = r0 + rows <= w->n_out ? rows : w->n_out - r0;
        uint8_t *hs = hq + (size_t)k * row_q;
        for (int64_t r = 0; r < k; r++) {
            const char *src = (const char *)w->data + (size_t)(r0 + r) * w->row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                /* Both block types are a 2-byte F16 scale, then the quants. */
                const char *bp = src + (size_t)b * blk;
                memcpy(hs + ((size_t)r * (size_t)nb + (size_t)b) * 2, bp, 2);
                memcpy(hq + (size_t)r * row_q + (size_t)b * qk_bytes, bp + 2, qk_bytes);
            }
        }
        TRY(g, "upload weights", api->h2d(g->ctx, dq + (size_t)r0 * row_q, hq, (size_t)k * row_q));
        TRY(g, "upload scales", api->h2d(g->ctx, ds + (size_t)r0 * row_s, hs, (size_t)k * row_s));
    }
    return SP_OK;
}

/* A weight matrix to a new F16 device buffer, STAGE_BYTES at a time. */
static sp_status_t
upload_f16(uploader_t *u, const sp_weight_t *w, void **out)
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

/* A weight matrix as the model's mode holds it. */
static sp_status_t
upload_matrix(uploader_t *u, const sp_weight_t *w, gpu_mat_t *d)
{
    sp_gpu_model_t *g = u->g;
    d->n_out = w->n_out;
    d->n_in = w->n_in;
    if (!kept_quantised(w, g->mode)) {
        return upload_f16(u, w, &d->f16);
    }
    d->qtype = (int)w->type;
    sp_status_t st = upload_split(u, w, d);
    if (st != SP_OK || g->mode != W_BOTH) {
        return st;
    }
    /* The F16 copy, from the quantised one already on the device. */
    const int64_t n = w->n_out * w->n_in;
    TRY(g, "alloc weights", g->api->alloc(g->ctx, (size_t)n * F16, &d->f16));
    TRY(g, "dequantise weights", g->api->qsplit_to_f16(g->ctx, d->qtype, d->q, d->f16, n));
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

/* The model's release hook (model_impl.h): sp_model_free calls it through
 * the pointer attach installs, so model.c never calls into this file. */
static void
gpu_model_free(sp_gpu_model_t *g)
{
    if (g == NULL) {
        return;
    }
    /* Destroying the context frees every allocation it made. */
    g->api->ctx_destroy(g->ctx);
    sp_free(g->L);
    sp_free(g);
}

/* One RoPE frequency table to the device, as batch.c computes its own:
 * theta_i = pos / scale * base^(-2i / n_rot) / factor_i, times YaRN's mix of
 * pair i (1 without YaRN), in double. f: n_rot / 2 floats of host scratch. */
static sp_status_t
upload_rope_table(sp_gpu_model_t *g, const float *factors, float *f, float **out)
{
    const sp_hparams_t *hp = &g->m->hp;
    const int64_t half = hp->n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        double v = pow((double)hp->rope_base, -2.0 * (double)i / (double)hp->n_rot);
        if (factors != NULL) {
            v /= factors[i];
        }
        v *= sp__yarn_mix(hp, i);
        f[i] = (float)(v / hp->rope_scale);
    }
    return upload_vec(g, f, half > 0 ? half : 1, out);
}

sp_status_t
sp_gpu_attach(sp_model_t *m, const sp_cuda_api_t *api, int ordinal, int64_t n_gpu, char *err,
              size_t err_len)
{
    const sp_hparams_t *hp = &m->hp;
    if (api == NULL) {
        api = sp_loader_api();
        if (api == NULL) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED, "GPU backend unavailable: %s",
                           sp_loader_note());
        }
    }
    if (m->gpu != NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "model already has a GPU binding");
    }
    if (m->enc != NULL) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s encoders run on the CPU only (instance_group KIND_CPU)", hp->arch);
    }
    const int mode = weights_mode();
    if (mode < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "SAMPAN_CUDA_WEIGHTS: '%s' is not f16, native or both",
                       getenv("SAMPAN_CUDA_WEIGHTS"));
    }
    /* Batches read them, but a context's batch reports no reason: say it here. */
    const char *bad = bad_switch();
    if (bad != NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: '%s' is not 0 or 1", bad, getenv(bad));
    }
    /* The upload reads the file's layout, which the repack may have given back. */
    sp_status_t rst = sp__model_refill_originals(m, err, err_len);
    if (rst != SP_OK) {
        return rst;
    }
    if (n_gpu < 0 || n_gpu > hp->n_layer) {
        n_gpu = hp->n_layer;
    }
    if (n_gpu == 0) {
        return SP_OK; /* nothing on the GPU: the CPU path as it is */
    }
    if (m->mla != NULL || m->moe != NULL) {
        /* The device path has no latent attention and no mixture-of-experts
         * block: the whole model stays on the CPU (engine/mla.c, moe.c),
         * which the placement then charges. */
        SP_LOG_INFO("event=gpu_skip device=cuda:%d reason=%s layers=0/%lld", ordinal,
                    m->mla != NULL ? "mla_deepseek2_runs_on_cpu" : "moe_model_runs_on_cpu",
                    (long long)hp->n_layer);
        return SP_OK;
    }
    const char *feature = sp__model_cpu_only_feature(m);
    if (feature != NULL) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "GPU: %s (architecture %s) uses %s, which the CUDA path does not "
                       "implement: run it on the CPU (no GPU layers)",
                       sp_gguf_path(m->gguf), hp->arch, feature);
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
    g->mode = mode;
    g->ordinal = ordinal;
    g->n_gpu = n_gpu;
    g->full = n_gpu == hp->n_layer;
    char sub[256] = "";
    uploader_t u = {g, NULL, NULL};
    sp_status_t st = (sp_status_t)api->ctx_create(ordinal, &g->ctx, sub, sizeof sub);
    if (st != SP_OK) {
        sp_free(g);
        if (st == SP_ERR_DEVICE) {
            sp_loader_device_fail(ordinal);
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
            (st = upload_vec(g, L->bv, L->wv.n_out, &D->bv)) != SP_OK ||
            (st = upload_vec(g, L->attn_q_norm, qk_norm_len(hp, true), &D->q_norm)) != SP_OK ||
            (st = upload_vec(g, L->attn_k_norm, qk_norm_len(hp, false), &D->k_norm)) != SP_OK ||
            (st = upload_vec(g, L->attn_post_norm, hp->n_embd, &D->post_attn)) != SP_OK ||
            (st = upload_vec(g, L->ffn_post_norm, hp->n_embd, &D->post_ffn)) != SP_OK ||
            (st = upload_vec(g, L->bo, hp->n_embd, &D->bo)) != SP_OK ||
            (st = upload_vec(g, L->attn_sinks, hp->n_head, &D->sinks)) != SP_OK) {
            break;
        }
    }
    if (st == SP_OK && g->full) {
        if ((st = upload_matrix(&u, &m->output, &g->output)) == SP_OK) {
            st = upload_vec(g, m->output_norm, hp->n_embd, &g->output_norm);
        }
    }
    if (st == SP_OK) {
        /* LongRoPE: the short factors here, the long ones in a second table
         * that batches past the original context use (sp__gpu_batch_create). */
        st = upload_rope_table(g, m->rope_long != NULL ? m->rope_short : m->rope_freqs, u.h_f32,
                               &g->inv_freq);
    }
    if (st == SP_OK && m->rope_long != NULL) {
        st = upload_rope_table(g, m->rope_long, u.h_f32, &g->inv_freq_long);
    }
    /* cos and sin times the attention factor, as batch.c's embed_job_run. */
    g->mscale = (double)hp->rope_attn_factor * (hp->rope_yarn ? hp->rope_mscale : 1.0);
    if (st == SP_OK && rope_swa(m)) {
        /* The sliding layers': their base and scale, the same factors (batch.c). */
        const int64_t half = hp->n_rot / 2;
        float *f = u.h_f32;
        for (int64_t i = 0; i < half; i++) {
            double v = pow((double)hp->rope_base_swa, -2.0 * (double)i / (double)hp->n_rot);
            if (m->rope_freqs != NULL) {
                v /= m->rope_freqs[i];
            }
            f[i] = (float)(v / hp->rope_scale_swa);
        }
        st = upload_vec(g, f, half > 0 ? half : 1, &g->inv_freq_swa);
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
    m->gpu_release = gpu_model_free;
    SP_LOG_INFO("event=gpu_model_ready device=cuda:%d layers=%lld/%lld weights=%s device_mib=%.1f",
                ordinal, (long long)n_gpu, (long long)hp->n_layer, mode_names[mode],
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
    gpu_model_free(g);
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

const char *
sp_gpu_model_weights(const sp_model_t *m)
{
    return m->gpu ? mode_names[m->gpu->mode] : "";
}

/* Weight bytes a product of R rows reads from d (what the bandwidth bound counts). */
static uint64_t
mat_step_bytes(const gpu_mat_t *d, int64_t R)
{
    const uint64_t f16 = (uint64_t)d->n_out * (uint64_t)d->n_in * F16;
    const uint64_t q = d->q ? (uint64_t)sp_cu_qsplit_bytes(d->qtype, d->n_out * d->n_in) : 0;
    if (d->q && R <= SP_CUDA_GEMV_MAX_ROWS) {
        return q;
    }
    return d->f16 ? f16 : q + f16; /* native: the dequantisation reads q, cuBLAS the scratch */
}

uint64_t
sp_gpu_model_step_bytes(const sp_model_t *m, int64_t n_rows)
{
    const sp_gpu_model_t *g = m->gpu;
    if (g == NULL) {
        return 0;
    }
    uint64_t b = 0;
    for (int64_t il = 0; il < g->n_gpu; il++) {
        const gpu_layer_t *L = &g->L[il];
        const gpu_mat_t *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) {
            b += mat_step_bytes(ms[k], n_rows);
        }
    }
    if (g->full) {
        b += mat_step_bytes(&g->output, n_rows);
    }
    return b;
}

/* ------------------------------------------------------------- KV pool */

/* Allocate one part: n_layer GPU layers of n_blocks blocks and a pad block. */
static sp_status_t
gpu_kv_part_alloc(sp_gpu_model_t *g, gpu_kv_part_t *pt, int64_t n_layer, int64_t n_blocks,
                  bool f16, const char *what, char *err, size_t err_len)
{
    const sp_hparams_t *hp = &g->m->hp;
    sp_cuda_kv_t *d = &pt->desc;
    d->f16 = f16;
    d->n_layer = n_layer;
    d->n_head_kv = hp->n_head_kv;
    d->head_dim = hp->head_dim;
    d->tile_elems = SP_KV_BLOCK * hp->head_dim;
    d->block_elems = n_layer * hp->n_head_kv * 2 * d->tile_elems;
    pt->block_bytes = (size_t)d->block_elems * (f16 ? 2 : 4);
    /* One block more than the scheduler's ids: the pad rows of a graph step
     * write their (unused) keys and values there and attend to them alone. */
    pt->pad_block = (int32_t)n_blocks;
    d->n_blocks = n_blocks + 1;
    if (n_layer == 0) {
        return SP_OK; /* no GPU layer in this part: nothing on the device */
    }
    const size_t bytes = pt->block_bytes * (size_t)d->n_blocks;
    int st = g->api->alloc(g->ctx, bytes, &d->d_data);
    if (st != SP_OK) {
        d->d_data = NULL;
        dev_fail(g, st, "alloc kv pool");
        return sp_errf(err, err_len, (sp_status_t)st, "GPU cuda:%d: KV pool (%s part) of %zu "
                       "bytes: %s", g->ordinal, what, bytes, g->api->last_error(g->ctx));
    }
    return SP_OK;
}

sp_status_t
sp__gpu_kv_create(sp_gpu_model_t *g, int64_t n_blocks, int64_t n_swa_blocks, bool f16,
                  sp_gpu_kv_t **out, char *err, size_t err_len)
{
    *out = NULL;
    const sp_hparams_t *hp = &g->m->hp;
    sp_gpu_kv_t *kv = sp_calloc(1, sizeof *kv);
    if (kv == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    kv->g = g;
    kv->split = n_swa_blocks > 0;
    kv->slot = sp_malloc((size_t)g->n_gpu * sizeof *kv->slot);
    kv->in_swa = sp_malloc((size_t)g->n_gpu * sizeof *kv->in_swa);
    if (kv->slot == NULL || kv->in_swa == NULL) {
        sp__gpu_kv_destroy(kv);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    int64_t n_part[2] = {0, 0};
    for (int64_t il = 0; il < g->n_gpu; il++) {
        kv->in_swa[il] = kv->split && hp->layer_swa[il] != 0;
        kv->slot[il] = (int32_t)n_part[kv->in_swa[il] ? 1 : 0]++;
    }
    sp_status_t st = gpu_kv_part_alloc(g, &kv->part[0], n_part[0], n_blocks, f16, "global",
                                       err, err_len);
    if (st == SP_OK && kv->split) {
        st = gpu_kv_part_alloc(g, &kv->part[1], n_part[1], n_swa_blocks, f16, "sliding", err,
                               err_len);
    }
    if (st != SP_OK) {
        sp__gpu_kv_destroy(kv);
        return st;
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
    kv->g->api->free(kv->g->ctx, kv->part[0].desc.d_data);
    kv->g->api->free(kv->g->ctx, kv->part[1].desc.d_data);
    sp_free(kv->slot);
    sp_free(kv->in_swa);
    sp_free(kv);
}

void
sp__gpu_kv_copy_block(sp_gpu_kv_t *kv, bool swa, int32_t dst, int32_t src)
{
    sp_gpu_model_t *g = kv->g;
    const gpu_kv_part_t *pt = &kv->part[swa ? 1 : 0];
    if ((swa && !kv->split) || pt->desc.d_data == NULL) {
        return; /* no such part on the device, or none of its layers */
    }
    int st = g->api->d2d(g->ctx, (char *)pt->desc.d_data + (size_t)dst * pt->block_bytes,
                         (const char *)pt->desc.d_data + (size_t)src * pt->block_bytes,
                         pt->block_bytes);
    if (st != SP_OK) {
        dev_fail(g, st, "kv copy block"); /* the next step fails on the poisoned context */
    }
}

/* ------------------------------------------------------------- batch */

static void
drop_graphs(sp_gpu_batch_t *b)
{
    for (int k = 0; k < b->n_buckets; k++) {
        b->g->api->graph_destroy(b->g->ctx, b->graph[k]);
        b->graph[k] = NULL;
    }
    b->graph_kv_set = false;
}

void
sp__gpu_batch_destroy(sp_gpu_batch_t *b)
{
    if (b == NULL) {
        return;
    }
    drop_graphs(b); /* before the buffers they reference */
    const sp_cuda_api_t *api = b->g->api;
    sp_cuda_ctx_t *c = b->g->ctx;
    void *bufs[] = {b->x, b->q, b->k, b->v, b->gate, b->up, b->proj, b->cs, b->cs_swa,
                    b->logits, b->xn, b->att, b->ff, b->ints, b->zeros, b->wscratch, b->cand};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        api->free(c, bufs[i]);
    }
    /* Unpinned before anything is freed: the engine frees its buffers after this. */
    for (int i = 0; i < b->n_pins; i++) {
        api->host_unregister(c, b->pins[i]);
    }
    sp_free(b->h_ints);
    sp_free(b->h_cand);
    sp_free(b);
}

size_t
sp_gpu_host_page(void)
{
    const long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

size_t
sp_gpu_host_round(size_t bytes)
{
    const size_t pg = sp_gpu_host_page();
    return bytes > SIZE_MAX - pg ? SIZE_MAX : (bytes + pg - 1) / pg * pg;
}

/* A host buffer this file copies through: whole pages of its own, so that
 * pinning it cannot meet another buffer's pages. */
static void *
host_buf(size_t bytes)
{
    return sp_malloc_aligned(sp_gpu_host_round(bytes), sp_gpu_host_page());
}

void
sp__gpu_batch_pin(sp_gpu_batch_t *b, void *p, size_t bytes, const char *what)
{
    sp_gpu_model_t *g = b->g;
    if (!b->pin_on || p == NULL || bytes == 0) {
        return;
    }
    if (b->n_pins == (int)(sizeof b->pins / sizeof b->pins[0])) {
        SP_LOG_WARN("event=gpu_pin_fallback device=cuda:%d buffer=%s bytes=%zu error=%s",
                    g->ordinal, what, bytes, sp_log_str("no room for another pinned range"));
        return;
    }
    const int st = g->api->host_register(g->ctx, p, bytes);
    if (st != SP_OK) {
        /* Pinned memory is a limited resource: without it the copies are
         * slower, not wrong. */
        SP_LOG_WARN("event=gpu_pin_fallback device=cuda:%d buffer=%s bytes=%zu status=%s "
                    "error=%s", g->ordinal, what, bytes, sp_status_name((sp_status_t)st),
                    sp_log_str(g->api->last_error(g->ctx)));
        if (st == SP_ERR_DEVICE || !g->api->healthy(g->ctx)) {
            dev_fail(g, SP_ERR_DEVICE, "host_register");
        }
        return;
    }
    b->pins[b->n_pins++] = p;
}

int
sp__gpu_batch_cand(const sp_gpu_batch_t *b, int64_t row, const int32_t **ids, const float **vals)
{
    if (b == NULL || b->cand_k == 0 || row < 0 || row >= b->cand_rows) {
        return 0;
    }
    *ids = b->h_cand + row * b->cand_k;
    *vals = (const float *)(b->h_cand + b->cand_rows * b->cand_k) + row * b->cand_k;
    return b->cand_k;
}

uint64_t
sp_gpu_model_pinned_bytes(const sp_model_t *m)
{
    return m->gpu ? m->gpu->api->pinned_bytes(m->gpu->ctx) : 0;
}

sp_status_t
sp__gpu_batch_create(sp_gpu_model_t *g, const sp_batch_params_t *p, sp_gpu_batch_t **out,
                     char *err, size_t err_len)
{
    *out = NULL;
    const char *bad = bad_switch();
    if (bad != NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: '%s' is not 0 or 1", bad, getenv(bad));
    }
    sp_gpu_batch_t *b = sp_calloc(1, sizeof *b);
    if (b == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    b->g = g;
    b->max_tokens = p->max_tokens;
    b->max_seqs = p->max_seqs;
    /* LongRoPE: the long factors for a context past the original one, as
     * batch.c picks them from the same max_ctx. */
    b->inv_freq = g->inv_freq_long != NULL && p->max_ctx > g->m->hp.n_ctx_orig
                      ? g->inv_freq_long
                      : g->inv_freq;
    b->graphs = switch_env("SAMPAN_CUDA_GRAPHS") == 1;
    b->pin_on = switch_env("SAMPAN_CUDA_PINNED") == 1;
    b->cand_on = switch_env("SAMPAN_CUDA_CANDIDATES") == 1;
    /* Buckets: powers of two below max_seqs, then max_seqs itself. */
    for (int64_t r = 1; b->n_buckets < MAX_BUCKETS - 1 && r < p->max_seqs; r *= 2) {
        b->bucket[b->n_buckets++] = r;
    }
    b->bucket[b->n_buckets++] = p->max_seqs;
    uint64_t B[GB_COUNT];
    batch_sizes(g->m, p, g->mode, B, &b->max_bt);
    b->swa_tab = gpu_swa_layers(g->m, g->m->hp.n_layer) > 0;
    void **dst[GB_COUNT] = {
        (void **)&b->x,    (void **)&b->q,      (void **)&b->k,  (void **)&b->v,
        (void **)&b->gate, (void **)&b->up,     (void **)&b->proj, (void **)&b->cs,
        (void **)&b->cs_swa, (void **)&b->logits, &b->xn,        &b->att,         &b->ff,
        (void **)&b->ints, (void **)&b->zeros,  &b->wscratch,      (void **)&b->cand,
    };
    int st = SP_OK;
    for (int i = 0; i < GB_COUNT && st == SP_OK; i++) {
        if (B[i] > 0) {
            st = g->api->alloc(g->ctx, (size_t)B[i], dst[i]);
        }
    }
    b->h_ints = host_buf((size_t)B[GB_INTS]);
    b->h_cand = host_buf((size_t)B[GB_CAND]);
    if (st == SP_OK && b->h_ints != NULL && b->h_cand != NULL) {
        /* Zeroed: a step with a sliding part uploads the unused tail of the
         * global tables' area too (one copy). */
        memset(b->h_ints, 0, (size_t)B[GB_INTS]);
        sp__gpu_batch_pin(b, b->h_ints, sp_gpu_host_round((size_t)B[GB_INTS]), "ints");
        sp__gpu_batch_pin(b, b->h_cand, sp_gpu_host_round((size_t)B[GB_CAND]), "candidates");
        /* The pad rows' zeros, through the (pinned) candidate buffer. */
        const size_t chunk = (size_t)B[GB_CAND];
        memset(b->h_cand, 0, chunk);
        for (size_t off = 0; st == SP_OK && off < (size_t)B[GB_ZEROS]; off += chunk) {
            const size_t n = (size_t)B[GB_ZEROS] - off < chunk ? (size_t)B[GB_ZEROS] - off : chunk;
            st = g->api->h2d(g->ctx, (char *)b->zeros + off, b->h_cand, n);
        }
    }
    if (st != SP_OK || b->h_ints == NULL || b->h_cand == NULL) {
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

/* Inside the ops of a step: on failure remember which op, return its status
 * as it is (the caller decides: a device error, or a capture to give up). */
#define OP(b, what, call)                                                                       \
    do {                                                                                        \
        int st_ = (call);                                                                       \
        if (st_ != SP_OK) {                                                                     \
            (b)->fail_op = (what);                                                              \
            return (sp_status_t)st_;                                                            \
        }                                                                                       \
    } while (0)

/* y (R, n_out) = x (R, n_in) F16 times w: gemv_q for few rows of a
 * quantised matrix, else cuBLAS on its F16 copy or, in native mode, on the
 * batch's scratch after dequantising into it. */
static int
mat_mul(sp_gpu_batch_t *b, const gpu_mat_t *w, const void *x, int64_t R, float *y,
        const float *bias)
{
    const sp_cuda_api_t *api = b->g->api;
    sp_cuda_ctx_t *c = b->g->ctx;
    if (w->q != NULL && R <= SP_CUDA_GEMV_MAX_ROWS) {
        return api->gemv_q(c, w->qtype, w->q, w->n_out, w->n_in, x, R, y, bias);
    }
    const void *wf = w->f16;
    if (wf == NULL) {
        int st = api->qsplit_to_f16(c, w->qtype, w->q, b->wscratch, w->n_out * w->n_in);
        if (st != SP_OK) {
            return st;
        }
        wf = b->wscratch;
    }
    return api->gemm(c, wf, w->n_out, w->n_in, x, R, y, bias);
}

/* For R rows: x += add (a sub-layer's output, or NULL for none), add first
 * times the residual scale (granite; add is the batch's scratch, scaled in
 * place as batch.c does), then, when xn is wanted, xn = F16(RMSNorm(x) w)
 * for the next sub-layer, or with no pre-norm (w NULL: olmo2) xn = F16(x),
 * as batch.c's copy. */
static int
add_norm(sp_gpu_batch_t *b, float *add, const float *w, int64_t R, bool xn)
{
    const sp_cuda_api_t *api = b->g->api;
    sp_cuda_ctx_t *c = b->g->ctx;
    const sp_hparams_t *hp = &b->g->m->hp;
    const int64_t E = hp->n_embd;
    int st = SP_OK;
    if (add != NULL && hp->residual_scale != 1.0f) {
        st = api->scale(c, add, R * E, hp->residual_scale);
    }
    if (st == SP_OK && (add != NULL || (xn && w != NULL))) {
        st = api->add_rmsnorm(c, b->x, add, xn ? w : NULL, NULL, R, E, hp->norm_eps, b->xn, 1);
    }
    if (st == SP_OK && xn && w == NULL) {
        st = api->to_f16(c, SP_TYPE_F32, b->x, b->xn, R * E);
    }
    return st;
}

/* The GPU layers for R rows whose x, positions and tables are on the device:
 * enqueued ops only (no copy from or to the host), so a graph can capture it. */
static sp_status_t
step_layers(sp_gpu_batch_t *b, sp_gpu_kv_t *kv, const sp_cuda_rows_t rw2[2])
{
    const sp_cuda_rows_t *rw = &rw2[0];
    sp_gpu_model_t *g = b->g;
    const sp_cuda_api_t *api = g->api;
    sp_cuda_ctx_t *c = g->ctx;
    const sp_hparams_t *hp = &g->m->hp;
    const int64_t R = rw->n_rows, E = hp->n_embd, hd = hp->head_dim;
    OP(b, "rope_cs", api->rope_cs(c, rw->d_pos, R, b->inv_freq, hp->n_rot, g->mscale, b->cs));
    if (g->inv_freq_swa != NULL) {
        OP(b, "rope_cs swa", api->rope_cs(c, rw->d_pos, R, g->inv_freq_swa, hp->n_rot, g->mscale,
                                          b->cs_swa));
    }
    OP(b, "attn norm", add_norm(b, NULL, g->L[0].attn_norm, R, true));
    const int neox = hp->rope_type == SP_ROPE_NEOX;
    const float eps = hp->norm_eps;
    for (int64_t il = 0; il < g->n_gpu; il++) {
        const gpu_layer_t *L = &g->L[il];
        const bool swa = hp->layer_swa[il] != 0;
        const float *cs = swa && g->inv_freq_swa != NULL ? b->cs_swa : b->cs;
        OP(b, "gemm q", mat_mul(b, &L->wq, b->xn, R, b->q, L->bq));
        OP(b, "gemm k", mat_mul(b, &L->wk, b->xn, R, b->k, L->bk));
        OP(b, "gemm v", mat_mul(b, &L->wv, b->xn, R, b->v, L->bv));
        if (L->q_norm != NULL && hp->qk_norm_full) {
            /* RMSNorm of the whole q and k projections before the rotation
             * (olmo2): one "head" as wide as the row. */
            OP(b, "q norm", api->head_rmsnorm(c, b->q, R, 1, hp->n_head * hd, L->q_norm, eps));
            OP(b, "k norm", api->head_rmsnorm(c, b->k, R, 1, hp->n_head_kv * hd, L->k_norm, eps));
        } else if (L->q_norm != NULL) {
            /* Per-head RMSNorm of q and k before the rotation (qwen3, gemma3). */
            OP(b, "q norm", api->head_rmsnorm(c, b->q, R, hp->n_head, hd, L->q_norm, eps));
            OP(b, "k norm", api->head_rmsnorm(c, b->k, R, hp->n_head_kv, hd, L->k_norm, eps));
        }
        if (!hp->layer_nope[il]) { /* smollm3's every fourth layer has no rotation */
            OP(b, "rope q", api->rope(c, b->q, R, hp->n_head, hd, hp->n_rot, cs, neox));
            OP(b, "rope k", api->rope(c, b->k, R, hp->n_head_kv, hd, hp->n_rot, cs, neox));
        }
        /* A layer of the sliding part: its tiles, its slot, the sliding tables
         * (-1 before the window, which neither op reads). */
        const int part = kv->in_swa[il] ? 1 : 0;
        const sp_cuda_kv_t *kd = &kv->part[part].desc;
        OP(b, "kv write", api->kv_write(c, kd, kv->slot[il], b->k, b->v, &rw2[part]));
        OP(b, "attention", api->attn(c, kd, kv->slot[il], b->q, hp->n_head, hp->attn_scale,
                                     swa ? hp->n_swa : 0, hp->attn_softcap, L->sinks,
                                     &rw2[part], b->att));
        OP(b, "gemm o", mat_mul(b, &L->wo, b->att, R, b->proj, L->bo));
        if (L->post_attn != NULL) {
            /* gemma, olmo2: the attention output normalised before the residual add */
            OP(b, "post-attention norm", api->add_rmsnorm(c, b->proj, NULL, L->post_attn, NULL,
                                                          R, E, eps, b->proj, 0));
        }
        OP(b, "ffn norm", add_norm(b, b->proj, L->ffn_norm, R, true));
        OP(b, "gemm gate", mat_mul(b, &L->gate, b->xn, R, b->gate, NULL));
        OP(b, "gemm up", mat_mul(b, &L->up, b->xn, R, b->up, NULL));
        if (hp->ffn_act == SP_FFN_GELU) {
            OP(b, "gelu", api->gelu_mul(c, b->gate, b->up, R * hp->n_ff, b->ff));
        } else {
            OP(b, "swiglu", api->swiglu(c, b->gate, b->up, R * hp->n_ff, b->ff));
        }
        OP(b, "gemm down", mat_mul(b, &L->down, b->ff, R, b->proj, NULL));
        if (L->post_ffn != NULL) {
            OP(b, "post-FFN norm", api->add_rmsnorm(c, b->proj, NULL, L->post_ffn, NULL, R, E,
                                                    eps, b->proj, 0));
        }
        if (il + 1 < g->n_gpu) {
            OP(b, "residual", add_norm(b, b->proj, g->L[il + 1].attn_norm, R, true));
        } else {
            /* The last GPU layer: the output norm (or the CPU's next layer) reads x. */
            OP(b, "residual", add_norm(b, b->proj, NULL, R, false));
        }
    }
    return SP_OK;
}

/* Logits of k <= max_seqs rows of x (gathered by d_rows) into b->logits. */
static sp_status_t
step_output(sp_gpu_batch_t *b, const int32_t *d_rows, int64_t k)
{
    sp_gpu_model_t *g = b->g;
    const sp_hparams_t *hp = &g->m->hp;
    OP(b, "output norm", g->api->add_rmsnorm(g->ctx, b->x, NULL, g->output_norm, d_rows, k,
                                             hp->n_embd, hp->norm_eps, b->xn, 1));
    OP(b, "output gemm", mat_mul(b, &g->output, b->xn, k, b->logits, NULL));
    if (hp->logit_scale != 1.0f) {
        /* granite: the logits divided by its scale, as batch.c's softcap_job (times
         * the same float reciprocal) */
        OP(b, "logit scale",
           g->api->scale(g->ctx, b->logits, k * hp->n_vocab, 1.0f / hp->logit_scale));
    }
    if (hp->final_softcap > 0.0f) {
        OP(b, "final softcap",
           g->api->softcap(g->ctx, b->logits, k * hp->n_vocab, hp->final_softcap));
    }
    return SP_OK;
}

/* Logits of n rows of x (d_rows into x) into host out, at most max_seqs rows
 * per pass. */
static sp_status_t
output_rows(sp_gpu_batch_t *b, const int32_t *d_rows, int64_t n, float *out)
{
    sp_gpu_model_t *g = b->g;
    const sp_hparams_t *hp = &g->m->hp;
    for (int64_t r0 = 0; r0 < n; r0 += b->max_seqs) {
        const int64_t k = r0 + b->max_seqs <= n ? b->max_seqs : n - r0;
        sp_status_t st = step_output(b, d_rows + r0, k);
        if (st != SP_OK) {
            return dev_fail(g, st, b->fail_op);
        }
        TRY(g, "logits download", g->api->d2h(g->ctx, out + r0 * hp->n_vocab, b->logits,
                                              (size_t)k * (size_t)hp->n_vocab * sizeof(float)));
    }
    return SP_OK;
}

/* After the logits of the step's n_out rows are in b->logits: for the
 * sequences that asked, their k best ids and values (one topk over every
 * row with the largest k asked, then one download of ids and values); the
 * whole rows of the others, consecutive rows in one copy. */
static sp_status_t
fetch_out(sp_gpu_batch_t *b, const sp_gpu_step_t *s, int64_t n_out)
{
    sp_gpu_model_t *g = b->g;
    const sp_cuda_api_t *api = g->api;
    sp_cuda_ctx_t *c = g->ctx;
    const int64_t V = g->m->hp.n_vocab;
    int kmax = 0;
    if (b->cand_on && s->cand_k != NULL && s->cand_n != NULL) {
        for (int64_t i = 0; i < s->n_seqs; i++) {
            if (s->seqs[i].logits && s->cand_k[i] > kmax) {
                kmax = s->cand_k[i];
            }
        }
    }
    if (kmax > SP_CU_MAX_TOPK || kmax > V) {
        kmax = 0; /* not for the device: every row whole */
    }
    if (kmax > 0) {
        int32_t *d_idx = b->cand;
        float *d_val = (float *)(b->cand + n_out * kmax);
        TRY(g, "topk", api->topk(c, b->logits, n_out, V, kmax, d_idx, d_val));
        TRY(g, "candidates download", api->d2h(c, b->h_cand, b->cand,
                                               (size_t)(2 * n_out * kmax) * sizeof(int32_t)));
        b->cand_k = kmax;
        b->cand_rows = n_out;
        if (!b->cand_logged) {
            b->cand_logged = true;
            SP_LOG_INFO("event=gpu_candidates device=cuda:%d rows=%lld k=%d", g->ordinal,
                        (long long)n_out, kmax);
        }
    }
    int64_t run0 = 0, run_n = 0; /* consecutive rows that come back whole */
    for (int64_t i = 0; i <= s->n_seqs; i++) {
        const int64_t r = i < s->n_seqs ? s->seq_out[i] : -1;
        if (r < 0 && i < s->n_seqs) {
            continue;
        }
        const int k = r >= 0 && kmax > 0 ? s->cand_k[i] : 0;
        if (r >= 0 && k > 0) {
            s->cand_n[i] = k;
        }
        if (r >= 0 && k == 0 && run_n > 0 && run0 + run_n == r) {
            run_n++;
            continue;
        }
        if (run_n > 0) {
            TRY(g, "logits download",
                api->d2h(c, s->logits + run0 * V, b->logits + run0 * V,
                         (size_t)(run_n * V) * sizeof(float)));
        }
        run_n = r >= 0 && k == 0 ? 1 : 0;
        run0 = r;
    }
    return SP_OK;
}

/* The ops a decode graph holds: the layers and, with full offload, the
 * logits of every (padded) row gathered through d_rows. */
static sp_status_t
graph_ops(sp_gpu_batch_t *b, sp_gpu_kv_t *kv, const sp_cuda_rows_t rw[2],
          const int32_t *d_rows)
{
    sp_status_t st = step_layers(b, kv, rw);
    if (st == SP_OK && b->g->full) {
        st = step_output(b, d_rows, rw[0].n_rows);
    }
    return st;
}

/* Capture graph_ops into *out. The capture is always ended, also when an op
 * failed in it. */
static sp_status_t
capture(sp_gpu_batch_t *b, sp_gpu_kv_t *kv, const sp_cuda_rows_t rw[2], const int32_t *d_rows,
        sp_cuda_graph_t **out)
{
    const sp_cuda_api_t *api = b->g->api;
    *out = NULL;
    int st = api->graph_begin(b->g->ctx);
    if (st != SP_OK) {
        b->fail_op = "graph begin";
        return (sp_status_t)st;
    }
    st = graph_ops(b, kv, rw, d_rows);
    sp_cuda_graph_t *gr = NULL;
    const int st_end = api->graph_end(b->g->ctx, &gr);
    if (st == SP_OK && st_end != SP_OK) {
        st = st_end;
        b->fail_op = "graph end";
    }
    if (st != SP_OK) {
        api->graph_destroy(b->g->ctx, gr);
        return (sp_status_t)st;
    }
    *out = gr;
    return SP_OK;
}

/* Integers to upload for n table entries: the three row arrays, the global
 * tables and, with a sliding part, the sliding tables' area up to the same n. */
static int64_t
ints_count(const sp_gpu_batch_t *b, const sp_gpu_kv_t *kv, int64_t n)
{
    return 3 * b->max_tokens + (kv->split ? b->max_bt + 1 : 0) + n;
}

/* A decode step (R rows = R sequences) through the graph of its bucket; the
 * integers are staged in b->h_ints by the caller with n_bt table entries and
 * n_out output rows. */
static sp_status_t
run_graph(sp_gpu_batch_t *b, sp_gpu_kv_t *kv, const sp_gpu_step_t *s, int64_t n_bt,
          int64_t n_out)
{
    sp_gpu_model_t *g = b->g;
    const sp_cuda_api_t *api = g->api;
    sp_cuda_ctx_t *c = g->ctx;
    const int64_t R = s->n_rows, E = g->m->hp.n_embd;
    int kb = 0;
    while (b->bucket[kb] < R) {
        kb++; /* the last bucket is max_seqs >= R */
    }
    const int64_t Rb = b->bucket[kb];
    /* Pad rows: position 0 through a one-entry table holding the pad block. */
    int32_t *pos = b->h_ints, *bt = pos + b->max_tokens, *rows = bt + b->max_tokens;
    int32_t *btab = rows + b->max_tokens;
    btab[n_bt] = kv->part[0].pad_block;
    if (kv->split) {
        btab[b->max_bt + 1 + n_bt] = kv->part[1].pad_block; /* the sliding part's */
    }
    for (int64_t t = R; t < Rb; t++) {
        pos[t] = 0;
        bt[t] = (int32_t)n_bt;
    }
    for (int64_t t = n_out; t < Rb; t++) {
        rows[t] = 0; /* computed, never downloaded */
    }
    TRY(g, "upload rows", api->h2d(c, b->ints, b->h_ints,
                                   (size_t)ints_count(b, kv, n_bt + 1) * sizeof(int32_t)));
    TRY(g, "upload x", api->h2d(c, b->x, s->x, (size_t)(R * E) * sizeof(float)));
    if (Rb > R) {
        TRY(g, "pad rows", api->d2d(c, b->x + R * E, b->zeros,
                                    (size_t)((Rb - R) * E) * sizeof(float)));
    }
    const int32_t *d_pos = b->ints, *d_bt = b->ints + b->max_tokens;
    const int32_t *d_rows = d_bt + b->max_tokens, *d_btab = d_rows + b->max_tokens;
    /* The sliding tables at a fixed address too: graph inputs like the others. */
    const sp_cuda_rows_t rw[2] = {{Rb, d_pos, d_bt, d_btab},
                                  {Rb, d_pos, d_bt, d_btab + b->max_bt + 1}};

    /* The graphs hold the pool's address and layout: another pool, new graphs. */
    bool same = b->graph_kv_set;
    for (int k = 0; k < 2 && same; k++) {
        const sp_cuda_kv_t *d = &kv->part[k].desc;
        const sp_cuda_kv_t *o = &b->graph_kv[k];
        same = o->d_data == d->d_data && o->f16 == d->f16 && o->n_blocks == d->n_blocks &&
               o->n_layer == d->n_layer && o->block_elems == d->block_elems &&
               o->tile_elems == d->tile_elems;
    }
    if (b->graph_kv_set && !same) {
        drop_graphs(b);
    }
    if (!b->graph_kv_set) {
        b->graph_kv[0] = kv->part[0].desc;
        b->graph_kv[1] = kv->part[1].desc;
        b->graph_kv_set = true;
    }
    if (b->graph[kb] == NULL && b->warm[kb]) {
        sp_status_t st = capture(b, kv, rw, d_rows, &b->graph[kb]);
        if (st == SP_ERR_DEVICE || !api->healthy(c)) {
            return dev_fail(g, st, b->fail_op);
        }
        if (st != SP_OK) {
            SP_LOG_WARN("event=gpu_graph_fallback device=cuda:%d rows=%lld op=%s status=%s "
                        "error=%s", g->ordinal, (long long)Rb, b->fail_op, sp_status_name(st),
                        sp_log_str(api->last_error(c)));
            b->graphs = false; /* eager from now on, for this batch */
        } else {
            SP_LOG_INFO("event=gpu_graph_captured device=cuda:%d rows=%lld", g->ordinal,
                        (long long)Rb);
        }
    }
    if (b->graph[kb] != NULL) {
        TRY(g, "graph launch", api->graph_launch(c, b->graph[kb]));
    } else {
        /* First step at this size (or no graphs after a failed capture): the
         * same padded ops, eagerly. */
        sp_status_t st = graph_ops(b, kv, rw, d_rows);
        if (st != SP_OK) {
            return dev_fail(g, st, b->fail_op);
        }
        b->warm[kb] = true;
    }
    if (!g->full) {
        TRY(g, "x download", api->d2h(c, s->x_out, b->x, (size_t)(R * E) * sizeof(float)));
    } else if (n_out > 0) {
        return fetch_out(b, s, n_out);
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
    const int64_t R = s->n_rows, E = hp->n_embd;
    if (kv == NULL || kv->g != g || R < 1 || R > b->max_tokens || s->n_seqs > b->max_seqs ||
        (kv->split && !b->swa_tab)) {
        return SP_ERR_INVALID;
    }
    if (!api->healthy(c)) {
        return dev_fail(g, SP_ERR_DEVICE, "step on an unhealthy device");
    }
    b->cand_k = 0; /* no candidates from an earlier step survive this one */
    b->cand_rows = 0;

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
        if (kv->split) {
            /* The sliding table (batch.h: after the global one's n_blocks
             * entries), at the same offset in the second area; batch.c checked
             * the entries a step reads. */
            memcpy(btab + b->max_bt + 1 + n_bt, q->blocks + q->n_blocks,
                   (size_t)need * sizeof(int32_t));
        }
        n_bt += need;
        if (s->out == SP_BATCH_OUT_SEQ) {
            s->seq_out[i] = q->logits ? n_out : -1;
            if (q->logits) {
                rows[n_out++] = (int32_t)(row - 1);
            }
        }
    }
    /* A decode step (one row per sequence) whose result is the sequences'
     * logits, or the residual for the CPU layers: through a graph. */
    if (b->graphs && R == s->n_seqs && (!g->full || s->out == SP_BATCH_OUT_SEQ)) {
        return run_graph(b, kv, s, n_bt, n_out);
    }
    if (s->out == SP_BATCH_OUT_ALL) {
        for (int64_t t = 0; t < R; t++) {
            rows[t] = (int32_t)t;
        }
        n_out = R;
    }
    /* Upload what is used: the three row arrays keep their max_tokens slots. */
    TRY(g, "upload rows", api->h2d(c, b->ints, b->h_ints,
                                   (size_t)ints_count(b, kv, n_bt) * sizeof(int32_t)));
    TRY(g, "upload x", api->h2d(c, b->x, s->x, (size_t)(R * E) * sizeof(float)));
    const int32_t *d_pos = b->ints, *d_bt = b->ints + b->max_tokens;
    const int32_t *d_rows = d_bt + b->max_tokens, *d_btab = d_rows + b->max_tokens;
    const sp_cuda_rows_t rw[2] = {{R, d_pos, d_bt, d_btab},
                                  {R, d_pos, d_bt, d_btab + b->max_bt + 1}};
    sp_status_t st = step_layers(b, kv, rw);
    if (st != SP_OK) {
        return dev_fail(g, st, b->fail_op);
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
    if (n_out > 0 && s->out == SP_BATCH_OUT_SEQ) {
        /* n_out <= n_seqs <= max_seqs: one pass of the output */
        st = step_output(b, d_rows, n_out);
        if (st != SP_OK) {
            return dev_fail(g, st, b->fail_op);
        }
        return fetch_out(b, s, n_out);
    }
    if (n_out > 0) {
        return output_rows(b, d_rows, n_out, s->logits);
    }
    return SP_OK;
}
