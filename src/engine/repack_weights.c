/*
 * repack_weights.c - the load-time repack of a model's dense projection weights (attention
 * q/k/v/o, FFN gate/up/down, the output matrix) and of its mixture-of-experts tensors (router,
 * each expert's slice of gate/up/down, the shared expert) into the kernel table's packed form
 * (kernels/kernels.h: the layout the table names in repack_layout[type], 8 or 16 rows
 * interleaved), for the products batch.c and moe.c run.
 * An expert tensor is packed expert by expert: each expert is a matrix of its own (64-byte
 * aligned, sp_experts_t.packed_expert_bytes apart), so moe.c's product of one expert over the
 * rows that chose it runs the same packed kernels as a dense matrix.
 *
 * The GGUF rows stay where they are (the file mapping): every other reader of the weight
 * bytes (token embedding rows, GPU upload, LoRA, the encoder, quantize / inspect) reads
 * them as before, and only the matrix products of batch.c and moe.c read the packed copy. The copy
 * is one allocation of sp_model_repack_bytes() (about the size of the packed tensors;
 * the load log line and the memory estimate count it). A type is packed only when the
 * current kernel table has a packed gemm for it (AVX2: Q4_0, IQ4_NL, Q8_0, Q4_K, IQ4_XS,
 * Q6_K, Q5_K; AVX-512 VNNI: Q8_0, Q4_0, Q4_K, IQ4_XS, IQ4_NL, MXFP4), in the form that table reads (its
 * repack_layout: the 8-row groups, or Q8_0's and Q4_0's 16-row panels at AVX-512). The table is the process's one
 * (sp_cpu_kernels(), fixed once chosen), so the products and the refill read the form
 * that was packed.
 *
 * Once packed, the file's copy of those tensors is given back (whole pages): a file mapping's
 * pages leave the process and the page cache (a later reader faults them back), and anonymous
 * memory (the file read into memory, a decrypted model) is freed; it reads as zeros until
 * sp__model_refill_originals unpacks the packed copy into it, which the GPU upload calls
 * first. Nothing else reads those bytes: batch.c's products read the packed copy, and the
 * output matrix is kept when it is the token embedding as well (tied).
 *
 * Threads: the packing runs on a few threads of its own while the model loads (groups of
 * rows are independent); afterwards the copy is read-only and shared by every context.
 * Process-wide switch: sp_model_set_repack (sampan --no-repack) or SAMPAN_REPACK=0.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "engine/model_impl.h"
#include "engine/moe.h"
#include "kernels/kernels.h"
#include "sampan/log.h"

static atomic_int repack_disabled; /* 0: on (default), 1: off */

void
sp_model_set_repack(bool on)
{
    atomic_store(&repack_disabled, on ? 0 : 1);
}

bool
sp_model_repack_enabled(void)
{
    const char *env = getenv("SAMPAN_REPACK");
    if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0)) {
        return false;
    }
    return atomic_load(&repack_disabled) == 0;
}

size_t
sp_model_repack_bytes(const sp_model_t *m)
{
    return m->packed_bytes;
}

size_t
sp_model_repack_released_bytes(const sp_model_t *m)
{
    return m->released_bytes;
}

#define GROUPS_PER_ITEM 64

/* One tensor to pack: a dense weight (n_mat 1) or an expert tensor (n_mat experts, each its
 * own matrix of n_out rows, src_mat bytes apart in the file, dst_mat bytes apart packed). */
typedef struct pack_mat {
    sp_weight_t *w;  /* exactly one of w and x */
    sp_experts_t *x;
    sp_type_t type;
    int64_t n_in, n_out, n_mat;
    const char *src;
    size_t row_bytes, src_mat, dst_mat;
    bool keep; /* the tied output matrix: also the token embedding */
    sp_repack_layout_t lay; /* the form the process's kernel table reads for this type */
} pack_mat_t;

static pack_mat_t
mat_of_weight(sp_model_t *m, sp_weight_t *w)
{
    const sp_repack_layout_t lay = sp_cpu_kernels()->repack_layout[w->type];
    const size_t bytes = (sp_repack_bytes_in(lay, w->type, w->n_in, w->n_out) + 63) & ~(size_t)63;
    return (pack_mat_t){.w = w, .lay = lay, .type = w->type, .n_in = w->n_in, .n_out = w->n_out, .n_mat = 1,
                        .src = w->data, .row_bytes = w->row_bytes,
                        .src_mat = w->row_bytes * (size_t)w->n_out, .dst_mat = bytes,
                        .keep = w == &m->output && m->hp.tied_output};
}

static pack_mat_t
mat_of_experts(sp_experts_t *x)
{
    /* each expert's packed matrix starts 64-byte aligned, as every dense one does */
    const sp_repack_layout_t lay = sp_cpu_kernels()->repack_layout[x->type];
    const size_t bytes = (sp_repack_bytes_in(lay, x->type, x->n_in, x->n_out) + 63) & ~(size_t)63;
    return (pack_mat_t){.x = x, .lay = lay, .type = x->type, .n_in = x->n_in, .n_out = x->n_out,
                        .n_mat = x->n_expert, .src = x->data, .row_bytes = x->row_bytes,
                        .src_mat = x->expert_bytes, .dst_mat = bytes};
}

static uint8_t *
mat_packed(const pack_mat_t *p)
{
    return (uint8_t *)(uintptr_t)(p->w != NULL ? p->w->packed : p->x->packed);
}

typedef struct pack_work {
    pack_mat_t *mats;
    int n_mats;
    atomic_llong next; /* work item: a chunk of GROUPS_PER_ITEM groups of one matrix */
    int64_t *chunks_before; /* prefix sums of each tensor's chunk count (all its matrices) */
    int64_t total;
    /* Each tensor's file copy is given back as soon as its last chunk is packed, so the load
     * holds the file and the packed copy together for a few tensors only, not all of them. */
    sp_model_t *m;
    atomic_llong *left;       /* chunks of each tensor still to pack */
    atomic_size_t released;   /* bytes given back */
    atomic_int zeroed, unmapped;
} pack_work_t;

static void
release_range(pack_work_t *pw, const void *p, size_t len)
{
    sp_gguf_release_t how;
    atomic_fetch_add(&pw->released, sp_gguf_release_range(pw->m->gguf, p, len, &how));
    if (how == SP_GGUF_ZEROED) {
        atomic_store(&pw->zeroed, 1);
    } else if (how == SP_GGUF_REFAULTS) {
        atomic_store(&pw->unmapped, 1);
    }
}

static void
release_original(pack_work_t *pw, const pack_mat_t *p)
{
    const size_t rows = p->row_bytes * (size_t)p->n_out;
    if (p->keep) {
        return;
    }
    if (p->src_mat == rows) { /* the matrices are contiguous: one range */
        release_range(pw, p->src, rows * (size_t)p->n_mat);
        return;
    }
    /* a view of a fused tensor (gemma4's gate_up experts): only this view's rows of each
     * expert, the other view's rows in between are packed (and released) on their own */
    for (int64_t e = 0; e < p->n_mat; e++) {
        release_range(pw, p->src + (size_t)e * p->src_mat, rows);
    }
}

static int64_t
chunks_per_mat(const pack_mat_t *p)
{
    const int rows = sp_repack_layout_rows(p->lay);
    const int64_t groups = (p->n_out + rows - 1) / rows;
    return (groups + GROUPS_PER_ITEM - 1) / GROUPS_PER_ITEM;
}

static void *
pack_thread(void *arg)
{
    pack_work_t *pw = arg;
    for (;;) {
        const int64_t item = atomic_fetch_add(&pw->next, 1);
        if (item >= pw->total) {
            return NULL;
        }
        int wi = 0;
        while (item >= pw->chunks_before[wi + 1]) {
            wi++;
        }
        const pack_mat_t *p = &pw->mats[wi];
        const int rows = sp_repack_layout_rows(p->lay);
        const int64_t n_groups = (p->n_out + rows - 1) / rows;
        const int64_t cpm = chunks_per_mat(p), local = item - pw->chunks_before[wi];
        const int64_t e = local / cpm, g0 = (local % cpm) * GROUPS_PER_ITEM;
        const int64_t g1 = g0 + GROUPS_PER_ITEM < n_groups ? g0 + GROUPS_PER_ITEM : n_groups;
        sp_repack_pack_in(p->lay, p->type, p->n_in, p->src + (size_t)e * p->src_mat, p->row_bytes,
                          p->n_out, g0, g1, mat_packed(p) + (size_t)e * p->dst_mat);
        if (atomic_fetch_sub(&pw->left[wi], 1) == 1) {
            release_original(pw, p);
        }
    }
}

/* Room for every tensor collect may list: the dense layer projections and the output, and
 * per MoE layer the router, the three expert tensors and the four of a shared expert. */
static int
collect_cap(const sp_model_t *m)
{
    return (int)(m->hp.n_layer * (7 + 8) + 1);
}

/* Collect the tensors to pack (in a fixed order) into list; returns how many. k: those the
 * table has a packed gemm for (at load); NULL: those already packed (the refill). */
static int
collect(sp_model_t *m, const sp_cpu_kernels_t *k, pack_mat_t *list, int cap)
{
    int n = 0;
#define WANT(type_, n_in_, n_out_, packed_)                                                   \
    (k != NULL ? k->repack_gemm[(type_)] != NULL &&                                          \
                     sp_repack_bytes_in(k->repack_layout[(type_)], (type_), (n_in_), (n_out_)) > 0 \
               : (packed_) != NULL)
#define ADD(wp)                                                                               \
    do {                                                                                      \
        sp_weight_t *w_ = (wp);                                                               \
        if (n < cap && w_->data != NULL && WANT(w_->type, w_->n_in, w_->n_out, w_->packed)) { \
            list[n++] = mat_of_weight(m, w_);                                                 \
        }                                                                                     \
    } while (0)
#define ADDX(xp)                                                                              \
    do {                                                                                      \
        sp_experts_t *x_ = (xp);                                                              \
        if (n < cap && x_->data != NULL && WANT(x_->type, x_->n_in, x_->n_out, x_->packed)) { \
            list[n++] = mat_of_experts(x_);                                                   \
        }                                                                                     \
    } while (0)
    for (int64_t il = 0; m->layers != NULL && il < m->hp.n_layer; il++) {
        sp_layer_t *L = &m->layers[il];
        ADD(&L->wq);
        ADD(&L->wk);
        ADD(&L->wv);
        ADD(&L->wo);
        ADD(&L->w_gate);
        ADD(&L->w_up);
        ADD(&L->w_down);
        if (m->moe != NULL && sp__moe_layer(m, il)) {
            sp_moe_layer_t *X = &m->moe->layers[il];
            ADDX(&X->router);
            ADDX(&X->gate);
            ADDX(&X->up);
            ADDX(&X->down);
            ADDX(&X->sh_gate);
            ADDX(&X->sh_up);
            ADDX(&X->sh_down);
            ADDX(&X->sh_inp);
        }
    }
    ADD(&m->output);
#undef ADDX
#undef ADD
#undef WANT
    return n;
}

sp_status_t
sp__model_repack(sp_model_t *m, char *err, size_t err_len)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    if (!sp_model_repack_enabled() || m->enc != NULL) {
        return SP_OK;
    }
    const int cap = collect_cap(m);
    pack_mat_t *list = sp_malloc(sizeof(*list) * (size_t)cap);
    int64_t *before = sp_malloc(sizeof(*before) * (size_t)(cap + 1));
    if (list == NULL || before == NULL) {
        sp_free(list);
        sp_free(before);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    const int n = collect(m, k, list, cap);
    size_t total = 0, expert_total = 0;
    int n_expert_tensors = 0;
    before[0] = 0;
    for (int i = 0; i < n; i++) {
        total += list[i].dst_mat * (size_t)list[i].n_mat;
        if (list[i].x != NULL) {
            expert_total += list[i].dst_mat * (size_t)list[i].n_mat;
            n_expert_tensors++;
        }
        before[i + 1] = before[i] + chunks_per_mat(&list[i]) * list[i].n_mat;
    }
    if (n == 0) {
        sp_free(list);
        sp_free(before);
        return SP_OK;
    }
    uint8_t *mem = sp_malloc_huge(total); /* streamed every step: huge pages, fewer TLB misses */
    if (mem == NULL) {
        sp_free(list);
        sp_free(before);
        return sp_errf(err, err_len, SP_ERR_NOMEM,
                       "%s: out of memory for the packed weights (%zu bytes; SAMPAN_REPACK=0 "
                       "or --no-repack keeps the file's layout)",
                       sp_gguf_path(m->gguf), total);
    }
    atomic_llong *left = sp_malloc(sizeof(*left) * (size_t)n);
    if (left == NULL) {
        sp_free(mem);
        sp_free(list);
        sp_free(before);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        pack_mat_t *p = &list[i];
        const size_t stride = sp_repack_group_bytes_in(p->lay, p->type, p->n_in);
        if (p->w != NULL) {
            p->w->packed = mem + off;
            p->w->packed_stride = stride;
        } else {
            p->x->packed = mem + off;
            p->x->packed_stride = stride;
            p->x->packed_expert_bytes = p->dst_mat;
        }
        off += p->dst_mat * (size_t)p->n_mat;
    }
    for (int i = 0; i < n; i++) {
        atomic_init(&left[i], before[i + 1] - before[i]);
    }
    pack_work_t pw = {.mats = list, .n_mats = n, .chunks_before = before, .total = before[n],
                      .m = m, .left = left};
    atomic_init(&pw.next, 0);
    atomic_init(&pw.released, 0);
    atomic_init(&pw.zeroed, 0);
    atomic_init(&pw.unmapped, 0);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
    pthread_t th[16];
    int started = 0;
    for (int i = 1; i < nth; i++) {
        if (pthread_create(&th[started], NULL, pack_thread, &pw) == 0) {
            started++;
        }
    }
    pack_thread(&pw); /* this thread works too, so a failed create only slows it down */
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
    }
    sp_free(left);
    m->packed_mem = mem;
    m->packed_bytes = total;
    m->released_bytes = atomic_load(&pw.released);
    m->originals_zeroed = atomic_load(&pw.zeroed) != 0;
    const char *how_name = m->originals_zeroed     ? "freed"
                           : atomic_load(&pw.unmapped) ? "unmapped"
                                                       : "kept";
    SP_LOG_INFO("event=weights_repacked model=%s kernels=%s tensors=%d bytes=%zu "
                "expert_tensors=%d expert_bytes=%zu threads=%d "
                "original_released_bytes=%zu original=%s",
                sp_log_str(sp_gguf_path(m->gguf)), k->name, n, total, n_expert_tensors,
                expert_total, started + 1, m->released_bytes, how_name);
    sp_free(list);
    sp_free(before);
    return SP_OK;
}

/* The packed rows of one tensor back to the GGUF layout, in place (the range is writable). */
static void
refill_rows(void *user)
{
    const pack_mat_t *p = user;
    const uint8_t *packed = mat_packed(p);
    for (int64_t e = 0; e < p->n_mat; e++) {
        for (int64_t r = 0; r < p->n_out; r++) {
            sp_repack_unpack_row_in(p->lay, p->type, p->n_in, packed + (size_t)e * p->dst_mat, r,
                                    (char *)(uintptr_t)p->src + (size_t)e * p->src_mat +
                                     (size_t)r * p->row_bytes);
        }
    }
}

sp_status_t
sp__model_refill_originals(sp_model_t *m, char *err, size_t err_len)
{
    if (!m->originals_zeroed) {
        return SP_OK;
    }
    const int cap = collect_cap(m);
    pack_mat_t *list = sp_malloc(sizeof(*list) * (size_t)cap);
    if (list == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    const int n = collect(m, NULL, list, cap);
    sp_status_t st = SP_OK;
    for (int i = 0; i < n && st == SP_OK; i++) {
        const pack_mat_t *p = &list[i];
        if (p->keep) {
            continue;
        }
        /* the whole span of the tensor's rows (a fused view's span also covers the other
         * view's rows, which this fill leaves as they are) */
        const size_t span = p->src_mat * (size_t)(p->n_mat - 1) + p->row_bytes * (size_t)p->n_out;
        st = sp_gguf_refill_range(m->gguf, p->src, span, refill_rows, &list[i], err, err_len);
    }
    sp_free(list);
    if (st == SP_OK) {
        m->originals_zeroed = false;
        m->released_bytes = 0;
        SP_LOG_INFO("event=weights_refilled model=%s reason=\"the GPU upload reads the file's layout\"",
                    sp_log_str(sp_gguf_path(m->gguf)));
    }
    return st;
}
