/*
 * lora.c - reading and validating LoRA adapter files (lora.h).
 *
 * Two passes over the tensor list: the first checks every name, type and
 * shape against the base model and records each pair's place, so the sizes
 * of the one F32 allocation are known (and bounded by the file: every element
 * is at least a byte of it) before anything is allocated; the second converts
 * the matrices and checks that every value is finite (a NaN in an adapter
 * would turn a sequence's logits into NaN long after load, with nothing
 * naming the file).
 */
#include "engine/lora.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "core/pool.h"
#include "engine/batch.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"

struct sp_lora {
    atomic_int refs;
    uint64_t id;
    const sp_model_t *m;
    int64_t n_layer;
    sp_lora_mat_t *mats; /* (n_layer, SP_LORA_N_PROJ) */
    float *data;         /* every matrix, F32 */
    sp_lora_info_t info;
};

static atomic_uint_fast64_t next_id = 1;

static const char *const proj_names[SP_LORA_N_PROJ] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};

/* The base weight of layer il's projection p. */
static const sp_weight_t *
base_weight(const sp_model_t *m, int64_t il, int p)
{
    const sp_layer_t *L = &m->layers[il];
    const sp_weight_t *w[SP_LORA_N_PROJ] = {&L->wq, &L->wk, &L->wv, &L->wo,
                                            &L->w_gate, &L->w_up, &L->w_down};
    return w[p];
}

/* Parse "blk.<il>.<proj>.weight.lora_<a|b>". false when the name is not one. */
static bool
parse_name(sp_str_t name, int64_t n_layer, int64_t *il, int *proj, bool *is_b)
{
    char buf[128];
    if (name.len == 0 || name.len >= sizeof buf) {
        return false;
    }
    memcpy(buf, name.ptr, name.len);
    buf[name.len] = '\0';
    if (strncmp(buf, "blk.", 4) != 0) {
        return false;
    }
    const char *p = buf + 4;
    int64_t v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 6) {
        v = v * 10 + (*p++ - '0');
        digits++;
    }
    if (digits == 0 || (digits > 1 && buf[4] == '0') || *p++ != '.' || v >= n_layer) {
        return false;
    }
    for (int k = 0; k < SP_LORA_N_PROJ; k++) {
        size_t n = strlen(proj_names[k]);
        if (strncmp(p, proj_names[k], n) == 0 && p[n] == '.') {
            const char *rest = p + n + 1;
            if (strcmp(rest, "weight.lora_a") == 0 || strcmp(rest, "weight.lora_b") == 0) {
                *il = v;
                *proj = k;
                *is_b = rest[12] == 'b';
                return true;
            }
        }
    }
    return false;
}

static bool
type_ok(sp_type_t t)
{
    return t == SP_TYPE_F32 || t == SP_TYPE_F16 || t == SP_TYPE_BF16 || t == SP_TYPE_Q8_0;
}

void
sp_lora_ref(sp_lora_t *l)
{
    atomic_fetch_add(&l->refs, 1);
}

void
sp_lora_release(sp_lora_t *l)
{
    if (l == NULL || atomic_fetch_sub(&l->refs, 1) != 1) {
        return;
    }
    sp_free(l->mats);
    sp_free(l->data);
    sp_free(l);
}

uint64_t
sp_lora_id(const sp_lora_t *l)
{
    return l->id;
}

const sp_model_t *
sp_lora_model(const sp_lora_t *l)
{
    return l->m;
}

void
sp_lora_get_info(const sp_lora_t *l, sp_lora_info_t *out)
{
    *out = l->info;
}

const sp_lora_mat_t *
sp_lora_mat(const sp_lora_t *l, int64_t il, sp_lora_proj_t p)
{
    return &l->mats[il * SP_LORA_N_PROJ + p];
}

/* Convert a tensor to F32 rows into dst (n elements); false on a value that is
 * not finite. */
static bool
convert(const sp_gguf_tensor_t *t, float *dst, int64_t n)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels_ref();
    if (t->type == SP_TYPE_F32) {
        memcpy(dst, t->data, (size_t)n * sizeof(float)); /* the data may be unaligned */
    } else {
        /* Row by row: a Q8_0 row is a whole number of blocks (checked by the caller). */
        const int64_t row = t->ne[0];
        const size_t rb = sp_row_size(t->type, row);
        for (int64_t r = 0; r < n / row; r++) {
            k->to_float[t->type]((const char *)t->data + (size_t)r * rb, dst + r * row, row);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(dst[i])) {
            return false;
        }
    }
    return true;
}

sp_status_t
sp_lora_load_gguf(const sp_model_t *m, const sp_gguf_t *g, sp_lora_t **out, char *err,
                  size_t err_len)
{
    const char *path = sp_gguf_path(g);
    const sp_hparams_t *hp = sp_model_hparams(m);
    sp_status_t st;
    sp_str_t s;
    *out = NULL;

    if (m->gpu != NULL) {
        /* The corrections run in the CPU layers' products only (batch.c). */
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: LoRA adapters run on the CPU only, and this model has GPU layers",
                       path);
    }
    /* Header keys: what the file is and for which architecture. */
    st = sp_gguf_get_str(g, "general.type", &s, err, err_len);
    if (st == SP_ERR_NOT_FOUND || (st == SP_OK && !sp_str_eq_c(s, "adapter"))) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: not a LoRA adapter: general.type is %s%.*s%s, expected 'adapter'",
                       path, st == SP_OK ? "'" : "missing", st == SP_OK ? (int)(s.len > 32 ? 32 : s.len) : 0,
                       st == SP_OK ? s.ptr : "", st == SP_OK ? "'" : "");
    }
    if (st != SP_OK) {
        return st;
    }
    st = sp_gguf_get_str(g, "adapter.type", &s, err, err_len);
    if (st == SP_ERR_NOT_FOUND || (st == SP_OK && !sp_str_eq_c(s, "lora"))) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: adapter.type is %s%.*s%s, only 'lora' is supported", path,
                       st == SP_OK ? "'" : "missing", st == SP_OK ? (int)(s.len > 32 ? 32 : s.len) : 0,
                       st == SP_OK ? s.ptr : "", st == SP_OK ? "'" : "");
    }
    if (st != SP_OK) {
        return st;
    }
    st = sp_gguf_get_str(g, "general.architecture", &s, err, err_len);
    if (st == SP_OK && !sp_str_eq_c(s, hp->arch)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: general.architecture '%.*s' does not match the model's '%s'", path,
                       (int)(s.len > 32 ? 32 : s.len), s.ptr, hp->arch);
    }
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) {
        return st;
    }
    double alpha = 0;
    st = sp_gguf_get_float(g, "adapter.lora.alpha", &alpha, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        alpha = 0;
    } else if (st != SP_OK) {
        return st;
    } else if (!isfinite(alpha) || fabs(alpha) > 1e6) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: adapter.lora.alpha = %g out of range "
                       "[-1e6, 1e6]", path, alpha);
    }

    /* Pass 1: names, types, shapes; each pair's tensors. */
    const int64_t n_mats = hp->n_layer * SP_LORA_N_PROJ;
    const sp_gguf_tensor_t **ta = sp_calloc((size_t)n_mats * 2, sizeof *ta);
    if (ta == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    const sp_gguf_tensor_t **tb = ta + n_mats;
    const int64_t n_t = sp_gguf_n_tensors(g);
    st = SP_OK;
    for (int64_t i = 0; i < n_t && st == SP_OK; i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        const int nl = (int)(t->name.len > 96 ? 96 : t->name.len);
        int64_t il;
        int p;
        bool is_b;
        if (!parse_name(t->name, hp->n_layer, &il, &p, &is_b)) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT,
                         "%s: tensor '%.*s' is not a LoRA tensor of this model: expected "
                         "blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}"
                         ".weight.lora_{a,b} with N < %lld", path, nl, t->name.ptr,
                         (long long)hp->n_layer);
            break;
        }
        if (!type_ok(t->type)) {
            st = sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                         "%s: tensor '%.*s' has type %s; adapters may use f32, f16, bf16 or q8_0",
                         path, nl, t->name.ptr, sp_type_name(t->type));
            break;
        }
        const sp_weight_t *w = base_weight(m, il, p);
        if (w->data == NULL && p <= SP_LORA_O) {
            /* Latent attention (engine/mla.c) has no q/k/v/o matrices. */
            st = sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                         "%s: tensor '%.*s' adapts an attention matrix, which this multi-head "
                         "latent attention (deepseek2) model does not have", path, nl,
                         t->name.ptr);
            break;
        }
        if (w->data == NULL) {
            /* A mixture-of-experts layer (engine/moe.c) has no dense FFN matrix. */
            st = sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                         "%s: tensor '%.*s' adapts a dense FFN matrix, which this mixture-of-"
                         "experts model does not have (expert adapters are not supported)",
                         path, nl, t->name.ptr);
            break;
        }
        const int64_t lim = w->n_in < w->n_out ? w->n_in : w->n_out;
        const int64_t max_rank = lim < SP_LORA_MAX_RANK ? lim : SP_LORA_MAX_RANK;
        /* a: [n_in, rank]; b: [rank, n_out]. */
        const int64_t want0 = is_b ? -1 : w->n_in, want1 = is_b ? w->n_out : -1;
        const int64_t rank = is_b ? t->ne[0] : t->ne[1];
        if (t->n_dims > 2 || (want0 >= 0 && t->ne[0] != want0) ||
            (want1 >= 0 && t->ne[1] != want1) || rank < 1 || rank > max_rank) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT,
                         "%s: tensor '%.*s' has shape [%lld, %lld%s], expected %s%lld%s with "
                         "1 <= r <= %lld (the base weight is [%lld, %lld])", path, nl,
                         t->name.ptr, (long long)t->ne[0], (long long)t->ne[1],
                         t->n_dims > 2 ? ", ..." : "", is_b ? "[r, " : "[",
                         (long long)(is_b ? w->n_out : w->n_in), is_b ? "]" : ", r]",
                         (long long)max_rank, (long long)w->n_in, (long long)w->n_out);
            break;
        }
        if (t->type == SP_TYPE_Q8_0 && t->ne[0] % 32 != 0) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT,
                         "%s: tensor '%.*s' is q8_0 with rows of %lld, not a multiple of 32",
                         path, nl, t->name.ptr, (long long)t->ne[0]);
            break;
        }
        const sp_gguf_tensor_t **slot = &(is_b ? tb : ta)[il * SP_LORA_N_PROJ + p];
        *slot = t; /* the reader refuses duplicate names: a slot is filled once */
    }
    int64_t n_pairs = 0, rmin = 0, rmax = 0;
    size_t floats = 0;
    for (int64_t i = 0; i < n_mats && st == SP_OK; i++) {
        if (ta[i] == NULL && tb[i] == NULL) {
            continue;
        }
        const sp_gguf_tensor_t *have = ta[i] ? ta[i] : tb[i];
        if (ta[i] == NULL || tb[i] == NULL) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tensor '%.*s' has no matching %s", path,
                         (int)(have->name.len > 96 ? 96 : have->name.len), have->name.ptr,
                         ta[i] ? "lora_b" : "lora_a");
            break;
        }
        if (ta[i]->ne[1] != tb[i]->ne[0]) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT,
                         "%s: tensor '%.*s' has rank %lld but its lora_a has rank %lld", path,
                         (int)(tb[i]->name.len > 96 ? 96 : tb[i]->name.len), tb[i]->name.ptr,
                         (long long)tb[i]->ne[0], (long long)ta[i]->ne[1]);
            break;
        }
        const int64_t r = ta[i]->ne[1];
        rmin = n_pairs == 0 || r < rmin ? r : rmin;
        rmax = r > rmax ? r : rmax;
        n_pairs++;
        /* Bounded: every element is at least one byte of the mapped file. */
        floats += (size_t)(ta[i]->ne[0] * r) + (size_t)(r * tb[i]->ne[1]);
    }
    if (st == SP_OK && n_pairs == 0) {
        st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: the adapter has no lora_a/lora_b tensors",
                     path);
    }
    sp_lora_t *l = NULL;
    if (st == SP_OK) {
        l = sp_calloc(1, sizeof *l);
        if (l != NULL) {
            l->mats = sp_calloc((size_t)n_mats, sizeof *l->mats);
            l->data = sp_malloc_aligned(floats * sizeof(float), 64);
        }
        if (l == NULL || l->mats == NULL || l->data == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory for %zu adapter values",
                         path, floats);
        }
    }
    /* Pass 2: convert and check values. */
    float *at = l ? l->data : NULL;
    for (int64_t i = 0; i < n_mats && st == SP_OK; i++) {
        if (ta[i] == NULL) {
            continue;
        }
        sp_lora_mat_t *mt = &l->mats[i];
        mt->rank = ta[i]->ne[1];
        mt->n_in = ta[i]->ne[0];
        mt->n_out = tb[i]->ne[1];
        mt->scale = alpha != 0 ? (float)(alpha / (double)mt->rank) : 1.0f;
        float *a = at, *b = at + mt->n_in * mt->rank;
        at = b + mt->rank * mt->n_out;
        const sp_gguf_tensor_t *bad = NULL;
        float *tmp = sp_malloc((size_t)(mt->rank * mt->n_out) * sizeof(float));
        if (tmp == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        if (!convert(ta[i], a, mt->n_in * mt->rank)) {
            bad = ta[i];
        } else if (!convert(tb[i], tmp, mt->rank * mt->n_out)) {
            bad = tb[i];
        }
        for (int64_t o = 0; o < mt->n_out && bad == NULL; o++) { /* (n_out, rank) -> (rank, n_out) */
            for (int64_t r = 0; r < mt->rank; r++) {
                b[r * mt->n_out + o] = tmp[o * mt->rank + r];
            }
        }
        sp_free(tmp);
        if (bad) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tensor '%.*s' holds a NaN or infinity",
                         path, (int)(bad->name.len > 96 ? 96 : bad->name.len), bad->name.ptr);
            break;
        }
        mt->a = a;
        mt->bt = b;
    }
    sp_free(ta);
    if (st != SP_OK) {
        if (l) {
            sp_free(l->mats);
            sp_free(l->data);
            sp_free(l);
        }
        return st;
    }
    atomic_init(&l->refs, 1);
    l->id = atomic_fetch_add(&next_id, 1);
    l->m = m;
    l->n_layer = hp->n_layer;
    l->info.n_pairs = n_pairs;
    l->info.rank_min = rmin;
    l->info.rank_max = rmax;
    l->info.alpha = alpha;
    l->info.bytes = floats * sizeof(float);
    *out = l;
    return SP_OK;
}

sp_status_t
sp_lora_load(const sp_model_t *m, const char *path, sp_lora_t **out, char *err, size_t err_len)
{
    sp_gguf_t *g = NULL;
    *out = NULL;
    sp_status_t st = sp_gguf_open(path, &g, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    st = sp_lora_load_gguf(m, g, out, err, err_len);
    sp_gguf_close(g);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Applying (batch.c)                                                        */
/* ------------------------------------------------------------------------ */

#define A_ROWS 2  /* rank rows of A per work item (each row's dot products with every input) */
#define B_ROWS 64 /* outputs per work item */
/* Below this many multiply-adds a correction runs on the calling thread: a
 * pool wake-up costs more than the work (a decode step of a small model). */
#define INLINE_WORK 16384

typedef struct apply_job {
    const sp_cpu_kernels_t *k;
    const sp_lora_apply_t *a;
    bool stage_b;
} apply_job_t;

static const sp_lora_mat_t *
row_mat(const sp_lora_apply_t *a, int64_t t)
{
    const sp_lora_t *l = a->seqs[a->row_seq[t]].lora;
    if (l == NULL) {
        return NULL;
    }
    const sp_lora_mat_t *mt = &l->mats[a->il * SP_LORA_N_PROJ + a->p];
    return mt->rank > 0 ? mt : NULL;
}

/* Stage A, item c: tmp_t[r] = dot(A[r], x_t) for the rank rows r of chunk c,
 * every row t. Stage B, item c: y_t[o] += scale * dot(B[o], tmp_t) for the
 * outputs o of chunk c, every row t. An item walks all rows with the same few
 * adapter rows, so each adapter row is read from memory once per step, not
 * once per sequence. Each value is one vec_dot over the row's own data, so a
 * row's result depends neither on the other rows nor on the split. */
/* Cloned per ISA (GCC picks one at load time) so the output loop of stage B
 * runs in 16 / 8 lanes where the CPU has them. Every lane sums its own output
 * in the same order and C11 mode contracts no multiply-add, so every clone
 * gives the same bits. */
#if defined(__x86_64__)
#define SP_LORA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SP_LORA_CLONES /* arm64: NEON is the base ISA, one version */
#endif
SP_LORA_CLONES static void
apply_job_run(void *arg, int64_t c, int ith)
{
    apply_job_t *j = arg;
    const sp_lora_apply_t *a = j->a;
    const sp_vec_dot_fn dot = j->k->vec_dot[SP_TYPE_F32];
    (void)ith;
    const int64_t lo = c * (j->stage_b ? B_ROWS : A_ROWS);
    const int64_t hi = lo + (j->stage_b ? B_ROWS : A_ROWS);
    for (int64_t t = 0; t < a->n_rows; t++) {
        const sp_lora_mat_t *mt = row_mat(a, t);
        if (mt == NULL) {
            continue;
        }
        float *tmp = a->tmp + t * a->tmp_stride;
        if (!j->stage_b) {
            const int64_t r1 = hi < mt->rank ? hi : mt->rank;
            for (int64_t r = lo; r < r1; r++) {
                dot(mt->n_in, &tmp[r], mt->a + r * mt->n_in, a->x + t * a->x_stride);
            }
        } else if (lo < mt->n_out) {
            /* B is stored transposed (rank rows of n_out): each output sums
             * its rank terms in order, the lanes run over outputs. */
            const int64_t n = (hi < mt->n_out ? hi : mt->n_out) - lo;
            float acc[B_ROWS] = {0};
            for (int64_t r = 0; r < mt->rank; r++) {
                const float *br = mt->bt + r * mt->n_out + lo;
                const float tr = tmp[r];
                for (int64_t o = 0; o < n; o++) {
                    acc[o] += br[o] * tr;
                }
            }
            float *y = a->y + t * a->y_stride + lo;
            for (int64_t o = 0; o < n; o++) {
                y[o] += mt->scale * acc[o];
            }
        }
    }
}

void
sp__lora_apply(sp_pool_t *pool, const sp_cpu_kernels_t *k, const sp_lora_apply_t *a)
{
    int64_t max_rank = 0, n_out = 0, work = 0;
    for (int64_t t = 0; t < a->n_rows; t++) {
        const sp_lora_mat_t *mt = row_mat(a, t);
        if (mt != NULL) {
            /* The adapter's shape is the projection's: inputs within x's row,
             * outputs exactly y's, rank within the scratch row (batch.c's act). */
            SP_ASSERT(mt->n_in <= a->x_stride && mt->n_out == a->y_stride &&
                      mt->rank <= a->tmp_stride);
            max_rank = mt->rank > max_rank ? mt->rank : max_rank;
            n_out = mt->n_out;
            work += mt->rank * (mt->n_in + mt->n_out);
        }
    }
    if (max_rank == 0) {
        return;
    }
    for (int stage = 0; stage < 2; stage++) {
        apply_job_t j = {k, a, stage == 1};
        /* A row's items over its own rank or outputs; rows with a smaller
         * rank skip the chunks past it. */
        const int64_t n_chunks = stage == 0 ? (max_rank + A_ROWS - 1) / A_ROWS
                                            : (n_out + B_ROWS - 1) / B_ROWS;
        if (work < INLINE_WORK) {
            for (int64_t c = 0; c < n_chunks; c++) {
                apply_job_run(&j, c, 0);
            }
        } else {
            sp_pool_run_as(pool, "lora", apply_job_run, &j, n_chunks);
        }
    }
}
