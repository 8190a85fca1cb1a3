/*
 * kv.c - the paged KV pool: its sizes, creation, block copies (for
 * copy-on-write) and the names of its element types. The layout (block-major,
 * one block is SP_KV_BLOCK positions of every layer and KV head; a two-part
 * pool has a global part for the global layers and a sliding part for the
 * sliding-window layers, docs/design.md, "KV cache with sliding windows") is described at the top of
 * batch.c, whose forward pass reads and writes the pool through
 * model_impl.h's view of it.
 *
 * Threads: a pool is used by one step at a time (the scheduler's thread or
 * one sp_ctx); creating and sizing pools is thread-safe. Memory: the cache and
 * the per-block marks are allocated once at create, the device part (a model
 * with a GPU binding) by gpu.c; sp_kv_pool_destroy frees all of them.
 */
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/assert.h"
#include "engine/batch.h"
#include "engine/gpu.h"
#include "engine/model_impl.h"
#include "kernels/kernels.h"

const char *
sp_kv_type_name(sp_kv_type_t t)
{
    switch (t) {
    case SP_KV_TYPE_F32: return "f32";
    case SP_KV_TYPE_F16: return "f16";
    case SP_KV_TYPE_Q8_0: return "q8_0";
    default: return "?";
    }
}

int
sp_kv_type_from_name(const char *name)
{
    for (int t = 0; name != NULL && t < SP_KV_TYPE_COUNT; t++) {
        if (strcasecmp(name, sp_kv_type_name((sp_kv_type_t)t)) == 0) {
            return t;
        }
    }
    return -1;
}

/* Bytes of one (layer, KV head) key tile (= its value tile) of one block. */
static size_t
kv_tile_bytes(int64_t head_dim, sp_kv_type_t type)
{
    switch (type) {
    case SP_KV_TYPE_F32: return SP_KV_BLOCK * (size_t)head_dim * sizeof(float);
    case SP_KV_TYPE_F16: return SP_KV_BLOCK * (size_t)head_dim * sizeof(sp_fp16_t);
    case SP_KV_TYPE_Q8_0: return (size_t)sp_kv_q8_tile_bytes(head_dim);
    default: return 0;
    }
}

size_t
sp_kv_block_bytes(const sp_model_t *m, sp_kv_type_t type)
{
    const sp_hparams_t *hp = &m->hp;
    /* Bounded by load (layers <= 512, heads <= 4096, head_dim <= 16384): no overflow. The
     * layers that keep a cache (gemma4's shared layers do not), tiles of the widest head. */
    return (size_t)sp__n_layer_kv(hp) * (size_t)hp->n_head_kv * (size_t)sp__kv_n_tiles(m) *
           kv_tile_bytes(sp__head_dim_max(hp), type);
}

size_t
sp_kv_swa_block_bytes(const sp_model_t *m, sp_kv_type_t type)
{
    const sp_hparams_t *hp = &m->hp;
    size_t n_swa = 0; /* sliding layers that keep a cache, in tiles of the widest head */
    for (int64_t il = 0; il < sp__n_layer_kv(hp) && hp->n_swa > 0; il++) {
        n_swa += hp->layer_swa[il] != 0;
    }
    return n_swa * (size_t)hp->n_head_kv * (size_t)sp__kv_n_tiles(m) *
           kv_tile_bytes(sp__head_dim_max(hp), type);
}

/* The sizes of a pool's arrays, for sp_kv_pool_create and sp_kv_pool_bytes
 * alike: the cache's global part (data) and sliding part (swa, 0 without one)
 * as allocated, 64 bytes standing in for an empty host part (every layer on
 * the GPU); the per-block marks and the layer slots (mark). The errors are
 * create's. */
static sp_status_t
kv_pool_sizes(const sp_model_t *m, const sp_kv_pool_params_t *p, int64_t n_swa_blocks,
              size_t *data, size_t *swa, size_t *mark, char *err, size_t err_len)
{
    if (m == NULL || p == NULL || p->n_blocks < 1 || p->n_blocks > INT32_MAX) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "kv pool: n_blocks %lld out of range [1, %d]",
                       p != NULL ? (long long)p->n_blocks : 0LL, INT32_MAX);
    }
    if ((unsigned)p->type >= SP_KV_TYPE_COUNT) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "kv pool: unknown cache type %d",
                       (int)p->type);
    }
    if (p->type == SP_KV_TYPE_Q8_0 && sp_gpu_model_layers(m) > 0) {
        /* The device pool and its kernels know F32 and F16 only. */
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "kv cache type q8_0 runs on the CPU only: this model has %lld GPU "
                       "layers (use f16 or f32, or no GPU layers)",
                       (long long)sp_gpu_model_layers(m));
    }
    if (n_swa_blocks < 0 || n_swa_blocks > INT32_MAX) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "kv pool: sliding blocks %lld out of range [0, %d]",
                       (long long)n_swa_blocks, INT32_MAX);
    }
    if (n_swa_blocks > 0 && sp_kv_swa_block_bytes(m, p->type) == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "kv pool: a sliding part needs a model with sliding-window layers");
    }
    /* Host memory for the CPU layers only (all of them without a GPU binding;
     * the GPU layers' parts are on the device, gpu.c). */
    const int64_t n_gpu = sp_gpu_model_layers(m);
    const int64_t n_cpu = sp__n_layer_kv(&m->hp) - n_gpu;
    const size_t layer_bb = sp_kv_block_bytes(m, p->type) / (size_t)sp__n_layer_kv(&m->hp);
    size_t bb = layer_bb * (size_t)n_cpu;
    size_t swa_data = 0;
    if (n_swa_blocks > 0) {
        size_t n_swa_cpu = 0; /* the sliding layers among the CPU ones */
        for (int64_t il = n_gpu; il < sp__n_layer_kv(&m->hp); il++) {
            n_swa_cpu += m->hp.layer_swa[il] != 0;
        }
        const size_t swa_bb = layer_bb * n_swa_cpu;
        bb -= swa_bb; /* the global part keeps the other layers */
        if (sp_mul_size(swa_bb, (size_t)n_swa_blocks, &swa_data) != 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "kv pool: %lld sliding blocks of %zu bytes overflow",
                           (long long)n_swa_blocks, swa_bb);
        }
    }
    size_t all; /* the two parts together must fit a size_t too */
    if (sp_mul_size(bb, (size_t)p->n_blocks, data) != 0 ||
        sp_add_size(*data, swa_data, &all) != 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "kv pool: %lld blocks of %zu bytes overflow",
                       (long long)p->n_blocks, bb);
    }
    *data = *data > 0 ? *data : 64;
    *swa = n_swa_blocks == 0 ? 0 : swa_data > 0 ? swa_data : 64;
    /* n_blocks, n_swa_blocks <= INT32_MAX, n_layer <= 512: no overflow. */
    *mark = (size_t)(p->n_blocks + n_swa_blocks) * sizeof(uint32_t) +
            (size_t)m->hp.n_layer * sizeof(int32_t);
    return SP_OK;
}

sp_status_t
sp_kv_pool_check_split(const sp_model_t *m, const sp_kv_pool_params_t *p, int64_t n_swa_blocks,
                       char *err, size_t err_len)
{
    size_t data, swa, mark;
    return kv_pool_sizes(m, p, n_swa_blocks, &data, &swa, &mark, err, err_len);
}

sp_status_t
sp_kv_pool_check(const sp_model_t *m, const sp_kv_pool_params_t *p, char *err, size_t err_len)
{
    return sp_kv_pool_check_split(m, p, 0, err, err_len);
}

size_t
sp_kv_pool_bytes(const sp_model_t *m, const sp_kv_pool_params_t *p)
{
    return sp_kv_pool_bytes_split(m, p, 0);
}

size_t
sp_kv_pool_bytes_split(const sp_model_t *m, const sp_kv_pool_params_t *p, int64_t n_swa_blocks)
{
    size_t data, swa, mark, total;
    if (kv_pool_sizes(m, p, n_swa_blocks, &data, &swa, &mark, NULL, 0) != SP_OK) {
        return 0;
    }
    /* as create allocates the parts: on huge pages */
    const size_t hd = sp_huge_size(data), hs = sp_huge_size(swa);
    if (hd == 0 || (swa > 0 && hs == 0) || sp_add_size(hd, hs, &total) != 0 ||
        sp_add_size(total, mark + sizeof(sp_kv_pool_t), &total) != 0) {
        return 0;
    }
    return total;
}

sp_status_t
sp_kv_pool_create(const sp_model_t *m, const sp_kv_pool_params_t *p, sp_kv_pool_t **out,
                  char *err, size_t err_len)
{
    return sp_kv_pool_create_split(m, p, 0, out, err, err_len);
}

sp_status_t
sp_kv_pool_create_split(const sp_model_t *m, const sp_kv_pool_params_t *p, int64_t n_swa_blocks,
                        sp_kv_pool_t **out, char *err, size_t err_len)
{
    *out = NULL;
    size_t g_bytes, swa_bytes, mark_bytes;
    sp_status_t st = kv_pool_sizes(m, p, n_swa_blocks, &g_bytes, &swa_bytes, &mark_bytes, err,
                                   err_len);
    if (st != SP_OK) {
        return st;
    }
    sp_kv_pool_t *kv = sp_calloc(1, sizeof *kv);
    if (kv == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    const sp_hparams_t *hp = &m->hp;
    kv->m = m;
    static const sp_type_t types[SP_KV_TYPE_COUNT] = {SP_TYPE_F32, SP_TYPE_F16, SP_TYPE_Q8_0};
    static const size_t elts[SP_KV_TYPE_COUNT] = {sizeof(float), sizeof(sp_fp16_t), 1};
    kv->type = types[p->type];
    kv->elt = elts[p->type];
    kv->n_blocks = p->n_blocks;
    const int64_t hd = sp__head_dim_max(hp); /* a narrower layer uses the start of each tile */
    kv->tile_elems = (int64_t)(kv_tile_bytes(hd, p->type) / kv->elt);
    kv->v_row = p->type == SP_KV_TYPE_Q8_0 ? sp_kv_q8_row_bytes(hd) : hd;
    kv->layer0 = sp_gpu_model_layers(m);
    kv->n_swa_blocks = n_swa_blocks;
    /* Each CPU layer's index within its part (the GPU layers' are gpu.c's). */
    int64_t n_part[2] = {0, 0};
    kv->slot = sp_malloc((size_t)hp->n_layer * sizeof *kv->slot);
    for (int64_t il = kv->layer0; kv->slot != NULL && il < sp__n_layer_kv(hp); il++) {
        const int part = sp__kv_in_swa(kv, il) ? 1 : 0;
        kv->slot[il] = (int32_t)n_part[part]++;
    }
    kv->n_tiles = sp__kv_n_tiles(m);
    kv->block_elems = n_part[0] * hp->n_head_kv * kv->n_tiles * kv->tile_elems;
    kv->swa_block_elems = n_part[1] * hp->n_head_kv * kv->n_tiles * kv->tile_elems;
    if (m->gpu != NULL) {
        st = sp__gpu_kv_create(m->gpu, p->n_blocks, n_swa_blocks, p->type == SP_KV_TYPE_F16,
                               &kv->gpu, err, err_len);
        if (st != SP_OK) {
            sp_kv_pool_destroy(kv);
            return st;
        }
    }
    /* Not zeroed: a position is always written before it is read, and key
     * lanes past a sequence's end are computed and ignored (kernels.h).
     * On huge pages where the kernel gives them (a hint, core/alloc.h): a
     * block's first write then faults once per 2 MiB instead of once per
     * 4 KiB, and those faults were a third of a long prefill's rope stage
     * (BENCHMARKS.md). Still committed as it is first written, not here. */
    kv->data = sp_malloc_huge(g_bytes);
    kv->mark = sp_calloc(1, (size_t)p->n_blocks * sizeof(uint32_t));
    if (n_swa_blocks > 0) {
        kv->swa_data = sp_malloc_huge(swa_bytes);
        kv->swa_mark = sp_calloc((size_t)n_swa_blocks, sizeof(uint32_t));
    }
    (void)mark_bytes; /* the marks and the slots, allocated one by one */
    if (kv->data == NULL || kv->mark == NULL || kv->slot == NULL ||
        (n_swa_blocks > 0 && (kv->swa_data == NULL || kv->swa_mark == NULL))) {
        sp_kv_pool_destroy(kv);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory for a KV pool of %lld blocks "
                       "(%zu bytes)", (long long)p->n_blocks, g_bytes + swa_bytes);
    }
    *out = kv;
    return SP_OK;
}

void
sp_kv_pool_destroy(sp_kv_pool_t *kv)
{
    if (kv == NULL) {
        return;
    }
    sp__gpu_kv_destroy(kv->gpu);
    sp_free(kv->data);
    sp_free(kv->mark);
    sp_free(kv->swa_data);
    sp_free(kv->swa_mark);
    sp_free(kv->slot);
    sp_free(kv);
}

int64_t
sp_kv_pool_n_blocks(const sp_kv_pool_t *kv)
{
    return kv->n_blocks;
}

int64_t
sp_kv_pool_n_swa_blocks(const sp_kv_pool_t *kv)
{
    return kv->n_swa_blocks;
}

void
sp_kv_pool_copy_block(sp_kv_pool_t *kv, int32_t dst, int32_t src)
{
    if (dst < 0 || src < 0 || dst >= kv->n_blocks || src >= kv->n_blocks || dst == src) {
        return;
    }
    const size_t bytes = (size_t)kv->block_elems * kv->elt;
    memcpy((char *)kv->data + (size_t)dst * bytes, (const char *)kv->data + (size_t)src * bytes,
           bytes);
    if (kv->gpu != NULL) {
        sp__gpu_kv_copy_block(kv->gpu, false, dst, src);
    }
}

void
sp_kv_pool_copy_swa_block(sp_kv_pool_t *kv, int32_t dst, int32_t src)
{
    if (dst < 0 || src < 0 || dst >= kv->n_swa_blocks || src >= kv->n_swa_blocks || dst == src) {
        return;
    }
    const size_t bytes = (size_t)kv->swa_block_elems * kv->elt;
    if (bytes > 0) {
        memcpy((char *)kv->swa_data + (size_t)dst * bytes,
               (const char *)kv->swa_data + (size_t)src * bytes, bytes);
    }
    if (kv->gpu != NULL) {
        sp__gpu_kv_copy_block(kv->gpu, true, dst, src);
    }
}


int64_t
sp_kv_ring_blocks(int64_t n_swa, int64_t n_rows)
{
    /* the rows, the window of the first one, the block that window's start
     * straddles and the one the last row's block may start past a boundary */
    return (n_rows + n_swa + SP_KV_BLOCK - 1) / SP_KV_BLOCK + 2;
}

bool
sp_kv_ring_step(int64_t n_swa, int64_t n_ring, int32_t base, int64_t *ring_entry, int32_t *tab,
                int64_t n_tab, int64_t pos, int64_t n)
{
    SP_ASSERT(n_ring >= 1 && n >= 1 && pos >= 0 && (pos + n - 1) / SP_KV_BLOCK < n_tab);
    const int64_t lo = (pos + 1 - n_swa > 0 ? pos + 1 - n_swa : 0) / SP_KV_BLOCK;
    const int64_t hi = (pos + n - 1) / SP_KV_BLOCK;
    if (hi - lo + 1 > n_ring) {
        return false;
    }
    for (int64_t i = lo; i <= hi; i++) {
        /* an entry holding positions before pos must still be in its ring block */
        if (i * SP_KV_BLOCK < pos && ring_entry[i % n_ring] != i) {
            return false;
        }
    }
    for (int64_t i = 0; i < n_tab; i++) {
        tab[i] = -1; /* outside the step's range: never read (batch.c checks) */
    }
    for (int64_t i = lo; i <= hi; i++) {
        ring_entry[i % n_ring] = i;
        tab[i] = base + (int32_t)(i % n_ring);
    }
    return true;
}
