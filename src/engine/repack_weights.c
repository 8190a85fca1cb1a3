/*
 * repack_weights.c - the load-time repack of a model's dense projection weights (attention
 * q/k/v/o, FFN gate/up/down, the output matrix) into the kernel table's packed form
 * (kernels/kernels.h, SP_REPACK_ROWS rows interleaved), for the products batch.c runs.
 *
 * The GGUF rows stay where they are (the file mapping): every other reader of the weight
 * bytes (token embedding rows, GPU upload, LoRA, the encoder, quantize / inspect) reads
 * them as before, and only the matrix products of batch.c read the packed copy. The copy
 * is one allocation of sp_model_repack_bytes() (about the size of the packed tensors;
 * the load log line and the memory estimate count it). A type is packed only when the
 * current kernel table has a packed gemm for it (AVX2: Q4_0, IQ4_NL, Q8_0, Q4_K, IQ4_XS;
 * AVX-512 VNNI: Q8_0, Q4_K, IQ4_XS), in the form that table reads (its repack_layout: the
 * 8-row groups, or Q8_0's 16-row panels at AVX-512). The table is the process's one
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

typedef struct pack_work {
    const sp_cpu_kernels_t *k;
    sp_weight_t **w;
    int n_w;
    atomic_llong next; /* work item: weight index * 2^32 + group chunk */
    int64_t *chunks_before; /* prefix sums of each weight's chunk count */
    int64_t total;
    /* Each weight's file copy is given back as soon as its last chunk is packed, so the load
     * holds the file and the packed copy together for a few tensors only, not all of them. */
    sp_model_t *m;
    atomic_llong *left;       /* chunks of each weight still to pack */
    atomic_size_t released;   /* bytes given back */
    atomic_int zeroed, unmapped;
} pack_work_t;

static void
release_original(pack_work_t *pw, sp_weight_t *w)
{
    if (w == &pw->m->output && pw->m->hp.tied_output) {
        return; /* also the token embedding */
    }
    sp_gguf_release_t how;
    atomic_fetch_add(&pw->released, sp_gguf_release_range(pw->m->gguf, w->data,
                                                          w->row_bytes * (size_t)w->n_out, &how));
    if (how == SP_GGUF_ZEROED) {
        atomic_store(&pw->zeroed, 1);
    } else if (how == SP_GGUF_REFAULTS) {
        atomic_store(&pw->unmapped, 1);
    }
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
        sp_weight_t *w = pw->w[wi];
        const sp_repack_layout_t lay = pw->k->repack_layout[w->type];
        const int rows = sp_repack_layout_rows(lay);
        const int64_t n_groups = (w->n_out + rows - 1) / rows;
        const int64_t g0 = (item - pw->chunks_before[wi]) * GROUPS_PER_ITEM;
        const int64_t g1 = g0 + GROUPS_PER_ITEM < n_groups ? g0 + GROUPS_PER_ITEM : n_groups;
        sp_repack_pack_in(lay, w->type, w->n_in, w->data, w->row_bytes, w->n_out, g0, g1,
                          (void *)w->packed);
        if (atomic_fetch_sub(&pw->left[wi], 1) == 1) {
            release_original(pw, w);
        }
    }
}

/* Collect the packable weights (in a fixed order) into list; returns how many. */
static int
collect(sp_model_t *m, const sp_cpu_kernels_t *k, sp_weight_t **list, int cap)
{
    int n = 0;
#define ADD(wp)                                                                               \
    do {                                                                                      \
        sp_weight_t *w_ = (wp);                                                               \
        if (n < cap && w_->data != NULL && k->repack_gemm[w_->type] != NULL &&                 \
            sp_repack_bytes_in(k->repack_layout[w_->type], w_->type, w_->n_in, w_->n_out) > 0) { \
            list[n++] = w_;                                                                   \
        }                                                                                     \
    } while (0)
    if (m->layers != NULL) {
        for (int64_t il = 0; il < m->hp.n_layer; il++) {
            sp_layer_t *L = &m->layers[il];
            ADD(&L->wq);
            ADD(&L->wk);
            ADD(&L->wv);
            ADD(&L->wo);
            ADD(&L->w_gate);
            ADD(&L->w_up);
            ADD(&L->w_down);
        }
    }
    ADD(&m->output);
#undef ADD
    return n;
}

sp_status_t
sp__model_repack(sp_model_t *m, char *err, size_t err_len)
{
    const sp_cpu_kernels_t *k = sp_cpu_kernels();
    if (!sp_model_repack_enabled() || m->enc != NULL) {
        return SP_OK;
    }
    const int cap = (int)(m->hp.n_layer * 7 + 1);
    sp_weight_t **list = sp_malloc(sizeof(*list) * (size_t)cap);
    int64_t *before = sp_malloc(sizeof(*before) * (size_t)(cap + 1));
    if (list == NULL || before == NULL) {
        sp_free(list);
        sp_free(before);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    const int n = collect(m, k, list, cap);
    size_t total = 0;
    before[0] = 0;
    for (int i = 0; i < n; i++) {
        const sp_repack_layout_t lay = k->repack_layout[list[i]->type];
        const int rows = sp_repack_layout_rows(lay);
        total += (sp_repack_bytes_in(lay, list[i]->type, list[i]->n_in, list[i]->n_out) + 63) &
                 ~(size_t)63;
        const int64_t groups = (list[i]->n_out + rows - 1) / rows;
        before[i + 1] = before[i] + (groups + GROUPS_PER_ITEM - 1) / GROUPS_PER_ITEM;
    }
    if (n == 0) {
        sp_free(list);
        sp_free(before);
        return SP_OK;
    }
    uint8_t *mem = sp_malloc_aligned(total, 64);
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
        sp_weight_t *w = list[i];
        const sp_repack_layout_t lay = k->repack_layout[w->type];
        w->packed = mem + off;
        w->packed_stride = sp_repack_group_bytes_in(lay, w->type, w->n_in);
        off += (sp_repack_bytes_in(lay, w->type, w->n_in, w->n_out) + 63) & ~(size_t)63;
    }
    for (int i = 0; i < n; i++) {
        atomic_init(&left[i], before[i + 1] - before[i]);
    }
    pack_work_t pw = {.k = k, .w = list, .n_w = n, .chunks_before = before, .total = before[n], .m = m,
                      .left = left};
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
    SP_LOG_INFO("event=weights_repacked model=%s kernels=%s tensors=%d bytes=%zu threads=%d "
                "original_released_bytes=%zu original=%s",
                sp_log_str(sp_gguf_path(m->gguf)), k->name, n, total, started + 1,
                m->released_bytes, how_name);
    sp_free(list);
    sp_free(before);
    return SP_OK;
}

typedef struct refill {
    const sp_weight_t *w;
} refill_t;

/* The packed rows back to the GGUF layout, in place (the range is writable now). */
static void
refill_rows(void *user)
{
    const sp_weight_t *w = ((refill_t *)user)->w;
    const sp_repack_layout_t lay = sp_cpu_kernels()->repack_layout[w->type];
    for (int64_t r = 0; r < w->n_out; r++) {
        sp_repack_unpack_row_in(lay, w->type, w->n_in, w->packed, r,
                             (char *)(uintptr_t)w->data + (size_t)r * w->row_bytes);
    }
}

sp_status_t
sp__model_refill_originals(sp_model_t *m, char *err, size_t err_len)
{
    if (!m->originals_zeroed) {
        return SP_OK;
    }
    const int cap = (int)(m->hp.n_layer * 7 + 1);
    sp_weight_t **list = sp_malloc(sizeof(*list) * (size_t)cap);
    if (list == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    int n = 0;
    for (int64_t il = 0; m->layers != NULL && il < m->hp.n_layer; il++) {
        sp_layer_t *L = &m->layers[il];
        sp_weight_t *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            list[n++] = ws[i];
        }
    }
    list[n++] = &m->output;
    sp_status_t st = SP_OK;
    for (int i = 0; i < n && st == SP_OK; i++) {
        refill_t rf = {list[i]};
        if (list[i]->packed == NULL || (list[i] == &m->output && m->hp.tied_output)) {
            continue;
        }
        st = sp_gguf_refill_range(m->gguf, list[i]->data, list[i]->row_bytes * (size_t)list[i]->n_out,
                                  refill_rows, &rf, err, err_len);
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
