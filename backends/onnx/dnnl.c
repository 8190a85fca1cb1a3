/*
 * backends/onnx/dnnl.c - the oneDNN engine of the ONNX backend (see dnnl.h).
 *
 * Conv (2-D, groups, dilations, fused bias, Relu, and the residual Add as oneDNN's sum
 * post-op), MaxPool/AveragePool (2-D) and GlobalAveragePool (4-D), Gemm (bias [N], alpha)
 * and MatMul (a constant 2-D B with the fused bias, or two activations of one rank with
 * broadcast batch dimensions). Anything else, or a shape these do not cover, returns 0 and
 * runs on our own operators.
 *
 * Primitives: one per (node, input shapes), created on first use and kept in the node's
 * cache (max_batch_size entries, at least OX_DNNL_CACHE and at most OX_DNNL_CACHE_MAX, least
 * recently used dropped): every batch size the dynamic batcher forms keeps its primitives (a
 * smaller cache made the batcher recreate them all the time: 0.78x the unbatched throughput),
 * and the cache stays bounded whatever the traffic. Constant weights are
 * reordered once into the layout the primitive prefers (oneDNN's blocked formats) and shared
 * by the node's primitives that want the same layout.
 * Layouts: Conv and the pools write their outputs in the layout oneDNN picks (blocked, e.g.
 * nChw8c on AVX2); the value remembers it, the next oneDNN node reads it as is, and our own
 * operators (and the graph outputs) get it reordered back to plain first (graph.c).
 * Errors: oneDNN refusing a shape (unimplemented, invalid arguments) at creation is a
 * fallback to our own runtime, counted in the stats; any other failure (memory, execution)
 * is the request's error, naming the node (graph.c adds the label).
 */
#include "dnnl.h"

#include <stdio.h>
#include <string.h>

#ifdef SP_HAVE_DNNL

#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>

#include "ops.h"

#define KEY_MAX (2 * OX_MAX_DIMS + 4)

typedef struct prim {
    bool used;
    uint64_t stamp;           /* last use, for eviction */
    int64_t key[KEY_MAX];
    int nkey;
    dnnl_primitive_t p;
    dnnl_memory_desc_t src_md, w_md, dst_md;
    void *w;                  /* packed constant weights (NULL: reordered per run) */
    bool w_own;               /* w is this entry's (else the node's) */
} prim_t;

typedef struct node_cache {
    prim_t *e;                /* cache_cap entries */
    void *w;                  /* the node's packed weights, in layout w_md */
    dnnl_memory_desc_t w_md;
    /* QDQConv / QDQMatMul (qdq.c's fused INT8 nodes): their INT8 weights in the plain layout
     * oneDNN reads (s8, zero point already subtracted), made once from the node's int16 rows;
     * q8 is 1 once made, -1 when the weights do not fit s8 (the node stays ours). */
    int8_t *q8w;
    int q8;
    /* A QDQConv whose every reader is a QDQConv quantizing with the same [sx, zx, lo, hi]
     * (find_chains): it writes its output quantized for them (u8/s8, scales mult[c] / sx, bias
     * bias[c] / sx, zero point zx), the readers skip their quantization. NULL: f32 output. */
    const float *chain;
    float *cmult, *cbias;
} node_cache_t;

/* A value oneDNN left quantized (a chained QDQConv's output): real = s * (q - z). */
typedef struct vq {
    bool on;
    float s;
    int32_t z;
} vq_t;

/* A chain of elementary operators run as one primitive (LayerNorm, GELU: see find_groups). */
typedef struct fuse {
    int kind;         /* on the chain's first node (its head): FZ_LN or FZ_GELU; else FZ_NONE */
    int32_t head;     /* on the other members: the head's node index; -1 otherwise */
    int32_t x, out;   /* the chain's input and output values */
    int32_t gamma, beta;
    float eps;
    bool ran;         /* this run: the head computed the chain, the members are skipped */
    int32_t gelu_of;  /* on a MatMul read only by a GELU chain: the chain's head (its GELU is the
                       * matmul's post-op, written to the chain's output), -1 none */
} fuse_t;

struct sp_ox_dnnl {
    dnnl_stream_t stream;
    bool bf16;
    /* oneDNN's int8 kernels on this CPU compute our exact int32 sums for any 8-bit operands
     * (VNNI), else only for u8 sources and weights within [-64, 64] (q8_limit). */
    bool vnni;
    node_cache_t *nodes;      /* per graph node */
    fuse_t *fz;               /* per graph node */
    int32_t n_nodes;
    bool *blocked;            /* per value: t.data is in layout md[v], not plain */
    vq_t *vq;                 /* per value: quantized (8-bit md[v]) rather than f32 */
    dnnl_memory_desc_t *md;
    int32_t n_values;
    uint64_t clock;
    int cache_cap;            /* primitives kept per node */
    sp_ox_dnnl_stats_t st;
};

static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;
static dnnl_status_t engine_status;

static void
make_engine(void)
{
    engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
}

bool
sp_ox_dnnl_built(void)
{
    return true;
}

bool
sp_ox_dnnl_has_bf16(void)
{
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    /* The ISA values are bit sets: each level includes the ones below it. */
    return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 ||
           (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
}

/* Whether oneDNN's int8 convolutions and matmuls sum u8 x s8 products in int32 on this CPU:
 * with VNNI (vpdpbusd: AVX512-VNNI, or AVX-VNNI on AVX2 cores) they do. Without it (an AVX2 CPU
 * such as Zen 2/3 or Haswell to Skylake client, or AVX-512 without VNNI) oneDNN 2.6's kernels pair
 * the products with vpmaddubsw, which adds two u8 x s8 products in a *saturating* int16 (2 * 255
 * * 127 > 32767), and for an s8 source add 128 and halve the weights (ONEDNN_VERBOSE's "sa0.5"),
 * dropping each weight's last bit. Found by running test_onnx_quant.py at
 * ONEDNN_MAX_CPU_ISA=AVX2: ConvInteger off by 16955 of an int32 sum, the digits MLP's logits by
 * 2.2. So there a node runs on oneDNN only when its products cannot saturate: a u8 source and
 * weights within [-64, 64] (255 * 128 = 32640 <= 32767), e.g. `sampan optimize --weight-bits 7`;
 * the rest run on our exact kernels (counted as fallbacks). */
static bool
isa_vnni(void)
{
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return (isa & dnnl_cpu_isa_avx512_core_vnni) == dnnl_cpu_isa_avx512_core_vnni ||
           (isa & dnnl_cpu_isa_avx2_vnni) == dnnl_cpu_isa_avx2_vnni;
}

bool
sp_ox_dnnl_int8_vnni(void)
{
    return isa_vnni();
}

/* The largest |weight| (after its zero point) oneDNN computes exactly here (isa_vnni). */
static int32_t
q8_limit(const struct sp_ox_dnnl *d)
{
    return d->vnni ? 128 : 64;
}

static int
fail_st(sp_ox_run_t *r, dnnl_status_t st, const char *what)
{
    return sp_ox_fail(r, "oneDNN %s failed (status %d)", what, (int)st);
}

static void find_groups(struct sp_ox_dnnl *d, const sp_ox_graph_t *g);
static void find_chains(struct sp_ox_dnnl *d, const sp_ox_graph_t *g);

/* Whether node i gets a primitive cache: oneDNN's operators and the chains' heads. */
static bool
has_cache(const struct sp_ox_dnnl *d, const sp_ox_graph_t *g, int32_t i)
{
    static const char *const ops[] = {"Conv", "MatMul", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool",
                                      "Softmax", "LayerNormalization", "Gelu", "QLinearConv", "ConvInteger",
                                      "QLinearMatMul", "MatMulInteger", NULL};
    if (d->fz[i].kind != 0) return true;
    for (int k = 0; ops[k]; k++) {
        if (strcmp(g->nodes[i].p->op_type, ops[k]) == 0) return true;
    }
    return false;
}

int
sp_ox_dnnl_attach(sp_ox_run_t *r, bool bf16, int cache_cap, char *err, size_t err_len)
{
    pthread_once(&engine_once, make_engine);
    if (engine_status != dnnl_success) {
        snprintf(err, err_len, "oneDNN: no CPU engine (status %d)", (int)engine_status);
        return -1;
    }
    struct sp_ox_dnnl *d = calloc(1, sizeof *d);
    if (d == NULL) goto oom;
    r->dnnl = d;
    d->bf16 = bf16;
    d->vnni = isa_vnni();
    d->n_nodes = r->g->n_nodes;
    d->n_values = r->g->n_values;
    d->cache_cap = cache_cap < OX_DNNL_CACHE ? OX_DNNL_CACHE : cache_cap > OX_DNNL_CACHE_MAX ? OX_DNNL_CACHE_MAX : cache_cap;
    d->nodes = calloc((size_t)d->n_nodes + 1, sizeof *d->nodes);
    d->blocked = calloc((size_t)d->n_values + 1, sizeof *d->blocked);
    d->md = calloc((size_t)d->n_values + 1, sizeof *d->md);
    d->fz = calloc((size_t)d->n_nodes + 1, sizeof *d->fz);
    d->vq = calloc((size_t)d->n_values + 1, sizeof *d->vq);
    if (d->nodes == NULL || d->blocked == NULL || d->md == NULL || d->fz == NULL || d->vq == NULL) goto oom;
    find_groups(d, r->g);
    for (int32_t i = 0; i < d->n_nodes; i++) {
        if (!has_cache(d, r->g, i)) continue; /* only oneDNN's operators have a cache */
        d->nodes[i].e = calloc((size_t)d->cache_cap, sizeof *d->nodes[i].e);
        if (d->nodes[i].e == NULL) goto oom;
    }
    if (!bf16) find_chains(d, r->g);
    dnnl_status_t st = dnnl_stream_create(&d->stream, engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        d->stream = NULL;
        sp_ox_dnnl_free(r);
        snprintf(err, err_len, "oneDNN: no stream (status %d)", (int)st);
        return -1;
    }
    return 0;
oom:
    sp_ox_dnnl_free(r);
    snprintf(err, err_len, "oneDNN: out of memory");
    return -1;
}

static void
entry_drop(node_cache_t *nc, prim_t *e, sp_ox_dnnl_stats_t *st)
{
    if (!e->used) return;
    if (e->p) dnnl_primitive_destroy(e->p);
    if (e->w_own) free(e->w);
    (void)nc;
    memset(e, 0, sizeof *e);
    st->cached--;
}

void
sp_ox_dnnl_free(sp_ox_run_t *r)
{
    struct sp_ox_dnnl *d = r->dnnl;
    if (d == NULL) return;
    for (int32_t i = 0; d->nodes && i < d->n_nodes; i++) {
        for (int k = 0; d->nodes[i].e && k < d->cache_cap; k++) entry_drop(&d->nodes[i], &d->nodes[i].e[k], &d->st);
        free(d->nodes[i].e);
        free(d->nodes[i].w);
        free(d->nodes[i].q8w);
        free(d->nodes[i].cmult);
        free(d->nodes[i].cbias);
    }
    if (d->stream) dnnl_stream_destroy(d->stream);
    free(d->nodes);
    free(d->fz);
    free(d->vq);
    free(d->blocked);
    free(d->md);
    free(d);
    r->dnnl = NULL;
}

void
sp_ox_dnnl_begin(sp_ox_run_t *r)
{
    struct sp_ox_dnnl *d = r->dnnl;
    memset(d->blocked, 0, (size_t)d->n_values * sizeof *d->blocked);
    for (int32_t i = 0; i < d->n_nodes; i++) d->fz[i].ran = false;
    memset(d->vq, 0, (size_t)d->n_values * sizeof *d->vq);
    /* OpenMP's thread count is per calling thread: this instance's runs only. */
    omp_set_num_threads(r->n_threads > 0 ? r->n_threads : 1);
}

void
sp_ox_dnnl_get_stats(const sp_ox_run_t *r, sp_ox_dnnl_stats_t *s)
{
    if (r->dnnl) *s = r->dnnl->st;
    else memset(s, 0, sizeof *s);
}

static dnnl_format_tag_t
plain_tag(int nd)
{
    static const dnnl_format_tag_t tags[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc,
                                             dnnl_abcd, dnnl_abcde, dnnl_abcdef};
    return nd >= 1 && nd <= 6 ? tags[nd] : dnnl_format_tag_undef;
}

static dnnl_status_t
md_plain(dnnl_memory_desc_t *md, int nd, const int64_t *dims)
{
    dnnl_dims_t dd;
    for (int i = 0; i < nd; i++) dd[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, nd, dd, dnnl_f32, plain_tag(nd));
}

/* The layout value v's data is in now. */
static int
md_of(sp_ox_run_t *r, int32_t v, dnnl_memory_desc_t *md)
{
    if (r->dnnl->blocked[v]) {
        *md = r->dnnl->md[v];
        return 0;
    }
    const sp_ox_tensor_t *t = &r->g->values[v].t;
    dnnl_status_t st = md_plain(md, t->nd, t->dims);
    return st == dnnl_success ? 0 : fail_st(r, st, "memory descriptor");
}

static int
execute(sp_ox_run_t *r, dnnl_primitive_t p, int n, const int *arg_ids, const dnnl_memory_desc_t *const *mds,
        void *const *ptrs)
{
    dnnl_exec_arg_t args[7];
    int made = 0, rc = 0;
    /* The primitive's scratchpad: the cached primitives are made in user-managed mode (create),
     * so their workspace is the run context's scratch buffer, grown to the largest and kept,
     * instead of memory oneDNN holds per thread; a reorder (library mode) reports none. */
    const_dnnl_primitive_desc_t pd = NULL;
    const dnnl_memory_desc_t *spmd = NULL;
    if (dnnl_primitive_get_primitive_desc(p, &pd) == dnnl_success && pd != NULL) {
        spmd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    }
    size_t sp_bytes = spmd ? dnnl_memory_desc_get_size(spmd) : 0;
    if (sp_bytes > 0 && n < 7) {
        void *buf = sp_ox_scratch(r, sp_bytes);
        if (buf == NULL) return -1;
        if (sp_bytes > r->dnnl->st.scratchpad_bytes) r->dnnl->st.scratchpad_bytes = sp_bytes;
        dnnl_status_t st = dnnl_memory_create(&args[n].memory, spmd, engine, buf);
        if (st != dnnl_success) return fail_st(r, st, "scratchpad memory creation");
        args[n].arg = DNNL_ARG_SCRATCHPAD;
    } else {
        sp_bytes = 0;
    }
    for (int i = 0; i < n; i++) {
        dnnl_status_t st = dnnl_memory_create(&args[i].memory, mds[i], engine, ptrs[i]);
        if (st != dnnl_success) {
            rc = fail_st(r, st, "memory creation");
            break;
        }
        args[i].arg = arg_ids[i];
        made++;
    }
    if (rc == 0) {
        dnnl_status_t st = dnnl_primitive_execute(p, r->dnnl->stream, n + (sp_bytes > 0), args);
        if (st == dnnl_success) st = dnnl_stream_wait(r->dnnl->stream);
        if (st != dnnl_success) rc = fail_st(r, st, "execution");
    }
    for (int i = 0; i < made; i++) dnnl_memory_destroy(args[i].memory);
    if (sp_bytes > 0) dnnl_memory_destroy(args[n].memory);
    return rc;
}

/* Copy src (layout smd) into dst (layout dmd), one logical tensor. */
static int
reorder(sp_ox_run_t *r, const dnnl_memory_desc_t *smd, void *src, const dnnl_memory_desc_t *dmd, void *dst)
{
    if (dnnl_memory_desc_equal(smd, dmd)) {
        if (src != dst) memcpy(dst, src, dnnl_memory_desc_get_size(smd));
        return 0;
    }
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, smd, engine, dmd, engine, NULL);
    if (st != dnnl_success) return fail_st(r, st, "reorder creation");
    st = dnnl_primitive_create(&p, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) return fail_st(r, st, "reorder creation");
    int ids[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    const dnnl_memory_desc_t *mds[2] = {smd, dmd};
    void *ptrs[2] = {src, dst};
    int rc = execute(r, p, 2, ids, mds, ptrs);
    dnnl_primitive_destroy(p);
    return rc;
}

/* A pool buffer of at least bytes for tensor t, which then has the logical shape dims. */
static int
out_bytes(sp_ox_run_t *r, sp_ox_tensor_t *t, size_t bytes, int nd, const int64_t *dims)
{
    int64_t n = (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
    if (n < 1) n = 1;
    if (sp_ox_out(r, t, OX_FLOAT, 1, &n)) return -1;
    t->nd = nd;
    for (int i = 0; i < nd; i++) t->dims[i] = dims[i];
    return 0;
}

/* A quantized tensor (layout smd, 8-bit) to real values (layout dmd, f32): s * (q - z), a
 * reorder with an output scale and a source zero point. Exact for |q - z| < 2^24. */
static int
dequant(sp_ox_run_t *r, const dnnl_memory_desc_t *smd, void *src, float s, int32_t z, const dnnl_memory_desc_t *dmd,
        void *dst)
{
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return sp_ox_fail(r, "oneDNN: out of memory");
    dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s);
    if (z != 0) dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0, &z);
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, smd, engine, dmd, engine, attr);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return fail_st(r, st, "dequantizing reorder creation");
    st = dnnl_primitive_create(&p, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) return fail_st(r, st, "dequantizing reorder creation");
    int ids[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    const dnnl_memory_desc_t *mds[2] = {smd, dmd};
    void *ptrs[2] = {src, dst};
    int rc = execute(r, p, 2, ids, mds, ptrs);
    dnnl_primitive_destroy(p);
    return rc;
}

int
sp_ox_dnnl_plain(sp_ox_run_t *r, int32_t v)
{
    struct sp_ox_dnnl *d = r->dnnl;
    if (d == NULL || v < 0 || !d->blocked[v]) return 0;
    sp_ox_tensor_t *t = &r->g->values[v].t;
    sp_ox_tensor_t nt = {0};
    dnnl_memory_desc_t pmd;
    dnnl_status_t st = md_plain(&pmd, t->nd, t->dims);
    if (st != dnnl_success) return fail_st(r, st, "memory descriptor");
    if (sp_ox_out(r, &nt, OX_FLOAT, t->nd, t->dims)) return -1;
    if (d->vq[v].on ? dequant(r, &d->md[v], t->data, d->vq[v].s, d->vq[v].z, &pmd, nt.data)
                    : reorder(r, &d->md[v], t->data, &pmd, nt.data)) {
        sp_ox_pool_put(r, &nt);
        return -1;
    }
    sp_ox_pool_put(r, t);
    *t = nt;
    d->blocked[v] = false;
    d->vq[v].on = false;
    return 0;
}

int
sp_ox_dnnl_plain_inputs(sp_ox_run_t *r, const sp_ox_node_t *n)
{
    for (int k = 0; k < n->n_in; k++) {
        if (sp_ox_dnnl_plain(r, n->in[k])) return -1;
    }
    return sp_ox_dnnl_plain(r, n->fused_add);
}

/* Record the layout of value v just written in layout md. */
static void
set_layout(sp_ox_run_t *r, int32_t v, const dnnl_memory_desc_t *md)
{
    const sp_ox_tensor_t *t = &r->g->values[v].t;
    dnnl_memory_desc_t pmd;
    bool plain = md_plain(&pmd, t->nd, t->dims) == dnnl_success && dnnl_memory_desc_equal(&pmd, md);
    r->dnnl->blocked[v] = !plain;
    if (!plain) r->dnnl->md[v] = *md;
}

static prim_t *
cache_find(struct sp_ox_dnnl *d, node_cache_t *nc, const int64_t *key, int nkey)
{
    for (int k = 0; k < d->cache_cap; k++) {
        prim_t *e = &nc->e[k];
        if (e->used && e->nkey == nkey && memcmp(e->key, key, (size_t)nkey * sizeof *key) == 0) {
            e->stamp = ++d->clock;
            return e;
        }
    }
    return NULL;
}

/* A free entry for key, dropping the least recently used one when all are taken. */
static prim_t *
cache_slot(struct sp_ox_dnnl *d, node_cache_t *nc, const int64_t *key, int nkey)
{
    prim_t *e = &nc->e[0];
    for (int k = 0; k < d->cache_cap; k++) {
        if (!nc->e[k].used) {
            e = &nc->e[k];
            break;
        }
        if (nc->e[k].stamp < e->stamp) e = &nc->e[k];
    }
    if (e->used) {
        entry_drop(nc, e, &d->st);
        d->st.evicted++;
    }
    e->nkey = nkey;
    memcpy(e->key, key, (size_t)nkey * sizeof *key);
    return e;
}

/* Create the primitive of entry e from op_desc; fills the layouts it wants. 1: created,
 * 0: oneDNN has no implementation for it (fallback), -1: error. */
static int
create(sp_ox_run_t *r, prim_t *e, const void *op_desc, const dnnl_primitive_attr_t attr, bool has_w)
{
    struct sp_ox_dnnl *d = r->dnnl;
    dnnl_primitive_desc_t pd;
    /* user-managed scratchpad (execute hands it the run context's scratch buffer) */
    dnnl_primitive_attr_t a = attr, own = NULL;
    if (a == NULL) {
        if (dnnl_primitive_attr_create(&own) != dnnl_success) return sp_ox_fail(r, "oneDNN: out of memory");
        a = own;
    }
    dnnl_primitive_attr_set_scratchpad_mode(a, dnnl_scratchpad_mode_user);
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, op_desc, a, engine, NULL);
    if (own) dnnl_primitive_attr_destroy(own);
    if (st == dnnl_unimplemented || st == dnnl_invalid_arguments) {
        memset(e, 0, sizeof *e);
        d->st.fallbacks++;
        return 0;
    }
    if (st != dnnl_success) {
        memset(e, 0, sizeof *e);
        return fail_st(r, st, "primitive descriptor creation");
    }
    e->src_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    if (has_w) e->w_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    e->dst_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    st = dnnl_primitive_create(&e->p, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) {
        memset(e, 0, sizeof *e);
        return fail_st(r, st, "primitive creation");
    }
    e->used = true;
    e->stamp = ++d->clock;
    d->st.created++;
    d->st.cached++;
    return 1;
}

/* The weights of entry e in the layout it wants: constants packed once (shared with the
 * node's other entries of that layout), others reordered into a pool tensor tmp per run. */
static int
pack_const(sp_ox_run_t *r, node_cache_t *nc, prim_t *e, const dnnl_memory_desc_t *wmd_plain, void *data,
           void **out)
{
    if (e->w == NULL) {
        if (nc->w && dnnl_memory_desc_equal(&nc->w_md, &e->w_md)) {
            e->w = nc->w;
        } else {
            size_t bytes = dnnl_memory_desc_get_size(&e->w_md);
            void *buf = sp_ox_aligned_alloc(bytes ? bytes : 64);
            if (buf == NULL) return sp_ox_fail(r, "out of memory for %zu bytes of weights", bytes);
            if (reorder(r, wmd_plain, data, &e->w_md, buf)) {
                free(buf);
                return -1;
            }
            if (nc->w == NULL) {
                nc->w = buf;
                nc->w_md = e->w_md;
            } else {
                e->w_own = true;
            }
            e->w = buf;
        }
    }
    *out = e->w;
    return 0;
}

static int
weights(sp_ox_run_t *r, node_cache_t *nc, prim_t *e, int32_t wv, const dnnl_memory_desc_t *wmd_plain,
        sp_ox_tensor_t *tmp, void **out)
{
    const sp_ox_value_t *wval = &r->g->values[wv];
    if (wval->is_const) return pack_const(r, nc, e, wmd_plain, wval->t.data, out);
    if (dnnl_memory_desc_equal(wmd_plain, &e->w_md)) {
        *out = wval->t.data;
        return 0;
    }
    if (out_bytes(r, tmp, dnnl_memory_desc_get_size(&e->w_md), 1, (int64_t[]){1}) ||
        reorder(r, wmd_plain, wval->t.data, &e->w_md, tmp->data)) {
        return -1;
    }
    *out = tmp->data;
    return 0;
}

/* The source of entry e: value v as is when it has the wanted layout, else reordered into
 * the pool tensor tmp. */
static int
source(sp_ox_run_t *r, prim_t *e, int32_t v, sp_ox_tensor_t *tmp, void **out)
{
    dnnl_memory_desc_t have;
    if (md_of(r, v, &have)) return -1;
    void *data = r->g->values[v].t.data;
    if (dnnl_memory_desc_equal(&have, &e->src_md)) {
        *out = data;
        return 0;
    }
    if (out_bytes(r, tmp, dnnl_memory_desc_get_size(&e->src_md), 1, (int64_t[]){1}) ||
        reorder(r, &have, data, &e->src_md, tmp->data)) {
        return -1;
    }
    *out = tmp->data;
    return 0;
}

static dnnl_primitive_attr_t
make_attr(sp_ox_run_t *r, dnnl_alg_kind_t first, bool sum, bool relu_after, float scale)
{
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
    if (dnnl_post_ops_create(&po) != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    if (first != dnnl_alg_kind_undef) dnnl_post_ops_append_eltwise(po, 1.0f, first, 0.0f, 0.0f);
    if (sum) dnnl_post_ops_append_sum(po, 1.0f);
    if (relu_after) dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    dnnl_primitive_attr_set_post_ops(attr, po);
    dnnl_post_ops_destroy(po);
    if (scale != 1.0f) dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale);
    return attr;
}

/* The type oneDNN's operands are in: FP32, or BF16 (precision "bf16": activations and weights
 * rounded to bfloat16, products accumulated in FP32, bias in FP32). BF16 activations stay BF16
 * between oneDNN nodes and come back to FP32 with the plain reorder (set_layout: a BF16 layout
 * is never plain). */
static dnnl_data_type_t
act_type(const struct sp_ox_dnnl *d)
{
    return d->bf16 ? dnnl_bf16 : dnnl_f32;
}

static bool
is_float(const sp_ox_tensor_t *t)
{
    return t && t->dtype == OX_FLOAT && t->data;
}

/* The destination of a Conv with a fused residual Add (oneDNN's sum post-op adds into dst):
 * the residual itself in the layout dst has, taking over its buffer when this is its last
 * reader, else a copy. */
static int
residual_dst(sp_ox_run_t *r, const sp_ox_node_t *n, int32_t o, const prim_t *e, const int64_t *od)
{
    sp_ox_graph_t *g = r->g;
    sp_ox_value_t *yv = &g->values[n->fused_add];
    sp_ox_tensor_t *out = &g->values[n->out[0]].t;
    size_t dbytes = dnnl_memory_desc_get_size(&e->dst_md);
    dnnl_memory_desc_t ymd;
    if (md_of(r, n->fused_add, &ymd)) return -1;
    const vq_t *q = &r->dnnl->vq[n->fused_add];
    dnnl_memory_desc_t dmd = e->dst_md;
    if (q->on && dmd.data_type == dnnl_f32) {
        /* a residual a chained QDQConv left quantized, read by an f32 destination: its real
         * values s * (q - z), in dst's layout */
        return out_bytes(r, out, dbytes, 4, od) || dequant(r, &ymd, yv->t.data, q->s, q->z, &e->dst_md, out->data)
                   ? -1 : 0;
    }
    /* a quantized residual into a quantized dst: its bytes as they are (the sum post-op reads
     * them with the residual's own type, u8 or s8), in dst's layout */
    if (q->on) dmd.data_type = ymd.data_type;
    if (dnnl_memory_desc_equal(&ymd, &dmd) && yv->last_use == o && !yv->is_output && yv->t.cap >= dbytes &&
        sp_ox_plan_take(r, n->fused_add, n->out[0])) {
        /* The residual is read for the last time: accumulate into its buffer. */
        if (out->data) sp_ox_pool_put(r, out);
        out->data = yv->t.data;
        out->cap = yv->t.cap;
        yv->t.data = NULL;
        yv->t.cap = 0;
        out->dtype = OX_FLOAT;
        out->nd = 4;
        for (int i = 0; i < 4; i++) out->dims[i] = od[i];
        return 0;
    }
    return out_bytes(r, out, dbytes, 4, od) || reorder(r, &ymd, yv->t.data, &dmd, out->data) ? -1 : 0;
}

static int
run_conv(sp_ox_run_t *r, sp_ox_node_t *n, int32_t o)
{
    struct sp_ox_dnnl *d = r->dnnl;
    sp_ox_graph_t *g = r->g;
    const sp_ox_tensor_t *x = &g->values[n->in[0]].t, *w = &g->values[n->in[1]].t;
    const sp_ox_tensor_t *b = n->n_in > 2 && n->in[2] >= 0 ? &g->values[n->in[2]].t : NULL;
    if (!is_float(x) || !is_float(w) || (b && !is_float(b)) || x->nd != 4 || w->nd != 4) return 0;
    int64_t group = sp_ox_attr_i(n, "group", 1), c = x->dims[1], m = w->dims[0];
    if (group < 1 || c % group || m % group || w->dims[1] != c / group || (b && sp_ox_numel(b) != m)) return 0;
    size_t nk;
    const int64_t *ks = sp_ox_attr_ints(n, "kernel_shape", &nk);
    if (ks && (nk != 2 || ks[0] != w->dims[2] || ks[1] != w->dims[3])) return 0;
    geom_t gm;
    if (sp_ox_geometry(r, n, x, w->dims + 2, 2, false, &gm)) return 0;
    int64_t od[4] = {x->dims[0], m, gm.oh, gm.ow};
    const sp_ox_tensor_t *y = n->fused_add >= 0 ? &g->values[n->fused_add].t : NULL;
    if (y) {
        if (!is_float(y) || y->nd != 4) return 0;
        for (int i = 0; i < 4; i++) {
            if (y->dims[i] != od[i]) return 0; /* a broadcasting Add: our own runtime */
        }
    }
    node_cache_t *nc = &d->nodes[n - g->nodes];
    int64_t key[9] = {x->dims[0], x->dims[1], x->dims[2], x->dims[3], y != NULL,
                      w->dims[0], w->dims[1], w->dims[2], w->dims[3]};
    prim_t *e = cache_find(d, nc, key, 9);
    dnnl_memory_desc_t wplain;
    dnnl_dims_t wd;
    int wnd = group > 1 ? 5 : 4;
    if (group > 1) {
        int64_t gd[5] = {group, m / group, c / group, w->dims[2], w->dims[3]};
        for (int i = 0; i < 5; i++) wd[i] = gd[i];
    } else {
        for (int i = 0; i < 4; i++) wd[i] = w->dims[i];
    }
    if (dnnl_memory_desc_init_by_tag(&wplain, wnd, wd, dnnl_f32, wnd == 5 ? dnnl_goihw : dnnl_oihw) != dnnl_success) return 0;
    if (e == NULL) {
        dnnl_memory_desc_t smd, wmd, bmd, dmd;
        dnnl_dims_t sd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]}, ddm = {od[0], od[1], od[2], od[3]};
        dnnl_dims_t bd = {m};
        dnnl_data_type_t dt = act_type(d);
        dnnl_memory_desc_init_by_tag(&smd, 4, sd, dt, dnnl_format_tag_any);
        dnnl_memory_desc_init_by_tag(&wmd, wnd, wd, dt, dnnl_format_tag_any);
        dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a);
        dnnl_memory_desc_init_by_tag(&dmd, 4, ddm, dt, dnnl_format_tag_any);
        dnnl_dims_t strides = {gm.sh, gm.sw}, dil = {gm.dh - 1, gm.dw - 1}, pl = {gm.pt, gm.pl},
                    pr = {gm.pb_end, gm.pr_end};
        dnnl_convolution_desc_t cd;
        if (dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                                       &smd, &wmd, b ? &bmd : NULL, &dmd, strides, dil,
                                                       pl, pr) != dnnl_success) {
            d->st.fallbacks++;
            return 0;
        }
        dnnl_primitive_attr_t attr = make_attr(r, dnnl_alg_kind_undef, y != NULL, n->fused_relu != 0, 1.0f);
        if (attr == NULL) return sp_ox_fail(r, "oneDNN: out of memory");
        e = cache_slot(d, nc, key, 9);
        int rc = create(r, e, &cd, attr, true);
        dnnl_primitive_attr_destroy(attr);
        if (rc <= 0) return rc;
    }
    sp_ox_tensor_t tx = {0}, tw = {0};
    sp_ox_tensor_t *out = &g->values[n->out[0]].t;
    void *src, *wp;
    int rc = -1;
    if (source(r, e, n->in[0], &tx, &src) || weights(r, nc, e, n->in[1], &wplain, &tw, &wp)) goto done;
    size_t dbytes = dnnl_memory_desc_get_size(&e->dst_md);
    if (y) {
        if (residual_dst(r, n, o, e, od)) goto done;
    } else if (out_bytes(r, out, dbytes, 4, od)) {
        goto done;
    }
    int ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    dnnl_memory_desc_t bmd;
    dnnl_dims_t bd = {m};
    dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a);
    const dnnl_memory_desc_t *mds[4] = {&e->src_md, &e->w_md, &e->dst_md, &bmd};
    void *ptrs[4] = {src, wp, out->data, b ? b->data : NULL};
    if (execute(r, e->p, b ? 4 : 3, ids, mds, ptrs)) goto done;
    set_layout(r, n->out[0], &e->dst_md);
    rc = 1;
done:
    sp_ox_pool_put(r, &tx);
    sp_ox_pool_put(r, &tw);
    return rc;
}

/* MaxPool, AveragePool (2-D) and GlobalAveragePool (4-D). */
static int
run_pool(sp_ox_run_t *r, sp_ox_node_t *n, bool global, bool is_max)
{
    struct sp_ox_dnnl *d = r->dnnl;
    sp_ox_graph_t *g = r->g;
    int32_t xv = n->in[0];
    const sp_ox_tensor_t *x = &g->values[xv].t;
    if (!is_float(x) || x->nd != 4 || n->n_out != 1) return 0;
    geom_t gm;
    if (global) {
        gm = (geom_t){x->dims[2], x->dims[3], x->dims[2], x->dims[3], 1, 1, 1, 1, 0, 0, 1, 1, 0, 0};
    } else {
        size_t nk;
        const int64_t *ks = sp_ox_attr_ints(n, "kernel_shape", &nk);
        if (ks == NULL || nk != 2 || sp_ox_geometry(r, n, x, ks, 2, true, &gm)) return 0;
    }
    if (gm.ih < 1 || gm.iw < 1) return 0;
    /* ceil_mode: the last window may run past the padding; oneDNN sees that as more right
     * padding, which max ignores, and average counts only when count_include_pad is set, where
     * ONNX counts only the given pads: that case stays ours. */
    int64_t prh = (gm.oh - 1) * gm.sh + (gm.kh - 1) * gm.dh + 1 - gm.ih - gm.pt;
    int64_t prw = (gm.ow - 1) * gm.sw + (gm.kw - 1) * gm.dw + 1 - gm.iw - gm.pl;
    bool incl = !global && !is_max && sp_ox_attr_i(n, "count_include_pad", 0) != 0;
    if (prh < 0) prh = 0;
    if (prw < 0) prw = 0;
    if (incl && (prh > gm.pb_end || prw > gm.pr_end)) return 0;
    /* A window entirely in the padding has no value in ONNX's definition: ours. */
    if (gm.pt >= gm.kh || gm.pl >= gm.kw || prh >= gm.kh || prw >= gm.kw) return 0;
    dnnl_memory_desc_t have;
    if (md_of(r, xv, &have)) return -1;
    node_cache_t *nc = &d->nodes[n - g->nodes];
    int64_t key[5] = {x->dims[0], x->dims[1], x->dims[2], x->dims[3], d->blocked[xv]};
    prim_t *e = cache_find(d, nc, key, 5);
    int64_t od[4] = {x->dims[0], x->dims[1], gm.oh, gm.ow};
    if (e == NULL) {
        dnnl_memory_desc_t dmd;
        dnnl_dims_t ddm = {od[0], od[1], od[2], od[3]};
        dnnl_memory_desc_init_by_tag(&dmd, 4, ddm, have.data_type, dnnl_format_tag_any);
        dnnl_dims_t strides = {gm.sh, gm.sw}, kern = {gm.kh, gm.kw}, dil = {gm.dh - 1, gm.dw - 1},
                    pl = {gm.pt, gm.pl}, pr = {prh, prw};
        dnnl_alg_kind_t alg = is_max ? dnnl_pooling_max
                              : incl ? dnnl_pooling_avg_include_padding
                                     : dnnl_pooling_avg_exclude_padding;
        dnnl_pooling_v2_desc_t pd;
        if (dnnl_pooling_v2_forward_desc_init(&pd, dnnl_forward_inference, alg, &have, &dmd, strides, kern,
                                              dil, pl, pr) != dnnl_success) {
            d->st.fallbacks++;
            return 0;
        }
        dnnl_primitive_attr_t attr = make_attr(r, dnnl_alg_kind_undef, false, false, 1.0f);
        if (attr == NULL) return sp_ox_fail(r, "oneDNN: out of memory");
        e = cache_slot(d, nc, key, 5);
        int rc = create(r, e, &pd, attr, false);
        dnnl_primitive_attr_destroy(attr);
        if (rc <= 0) return rc;
    }
    sp_ox_tensor_t tx = {0};
    sp_ox_tensor_t *out = &g->values[n->out[0]].t;
    void *src;
    int rc = -1;
    if (source(r, e, xv, &tx, &src) || out_bytes(r, out, dnnl_memory_desc_get_size(&e->dst_md), 4, od)) goto done;
    int ids[2] = {DNNL_ARG_SRC, DNNL_ARG_DST};
    const dnnl_memory_desc_t *mds[2] = {&e->src_md, &e->dst_md};
    void *ptrs[2] = {src, out->data};
    if (execute(r, e->p, 2, ids, mds, ptrs)) goto done;
    set_layout(r, n->out[0], &e->dst_md);
    rc = 1;
done:
    sp_ox_pool_put(r, &tx);
    return rc;
}

/* Gemm (bias [N] or [1, N] at beta 1, any alpha, transposes as strides) and MatMul. */
static int
run_matmul(sp_ox_run_t *r, sp_ox_node_t *n, bool gemm)
{
    struct sp_ox_dnnl *d = r->dnnl;
    sp_ox_graph_t *g = r->g;
    if (sp_ox_dnnl_plain(r, n->in[0]) || sp_ox_dnnl_plain(r, n->in[1])) return -1;
    /* a GELU chain reading only this product: computed here as the post-op, into its output */
    int32_t gh = gemm ? -1 : d->fz[n - g->nodes].gelu_of;
    bool gelu = gh >= 0;
    const sp_ox_tensor_t *a = &g->values[n->in[0]].t, *b = &g->values[n->in[1]].t;
    const sp_ox_tensor_t *bias = NULL;
    if (!is_float(a) || !is_float(b) || a->nd < 2 || b->nd < 2 || a->nd > 5 || b->nd > 5) return 0;
    float alpha = 1.0f;
    bool ta = false, tb = false, wconst = g->values[n->in[1]].is_const && b->nd == 2;
    int64_t mrows, k, nn;
    if (gemm) {
        if (a->nd != 2 || b->nd != 2) return 0;
        ta = sp_ox_attr_i(n, "transA", 0) != 0;
        tb = sp_ox_attr_i(n, "transB", 0) != 0;
        alpha = sp_ox_attr_f(n, "alpha", 1.0f);
        if (n->n_in > 2 && n->in[2] >= 0) {
            if (sp_ox_dnnl_plain(r, n->in[2])) return -1;
            bias = &g->values[n->in[2]].t;
            if (!is_float(bias) || sp_ox_attr_f(n, "beta", 1.0f) != 1.0f || bias->nd < 1 || bias->nd > 2 ||
                (bias->nd == 2 && bias->dims[0] != 1)) {
                return 0;
            }
        }
    } else if (n->fused_bias >= 0) {
        bias = &g->values[n->fused_bias].t;
    }
    mrows = ta ? a->dims[1] : a->dims[a->nd - 2];
    k = ta ? a->dims[0] : a->dims[a->nd - 1];
    int64_t kb = tb ? b->dims[1] : b->dims[b->nd - 2];
    nn = tb ? b->dims[0] : b->dims[b->nd - 1];
    if (k != kb || (bias && sp_ox_numel(bias) != nn)) return 0;
    /* Shapes: a constant 2-D B flattens A's leading dimensions into rows; else both operands
     * have one rank and the batch dimensions broadcast (equal, or 1). */
    int nd;
    int64_t sa[5], sb[5], sd[5], od[OX_MAX_DIMS];
    int ond;
    if (wconst) {
        int64_t rows = 1;
        for (int i = 0; i < a->nd - 1; i++) rows *= a->dims[i];
        if (gemm) rows = mrows;
        nd = 2;
        sa[0] = rows;
        sa[1] = k;
        sb[0] = k;
        sb[1] = nn;
        sd[0] = rows;
        sd[1] = nn;
        ond = a->nd;
        for (int i = 0; i < a->nd - 1; i++) od[i] = a->dims[i];
        if (gemm) od[0] = mrows;
        od[ond - 1] = nn;
    } else {
        if (a->nd != b->nd || (bias && a->nd != 2)) return 0;
        nd = a->nd;
        for (int i = 0; i < nd - 2; i++) {
            if (a->dims[i] != b->dims[i] && a->dims[i] != 1 && b->dims[i] != 1) return 0;
            sa[i] = a->dims[i];
            sb[i] = b->dims[i];
            sd[i] = a->dims[i] > b->dims[i] ? a->dims[i] : b->dims[i];
        }
        sa[nd - 2] = mrows;
        sa[nd - 1] = k;
        sb[nd - 2] = k;
        sb[nd - 1] = nn;
        sd[nd - 2] = mrows;
        sd[nd - 1] = nn;
        ond = nd;
        for (int i = 0; i < nd; i++) od[i] = sd[i];
    }
    for (int i = 0; i < nd; i++) {
        if (sa[i] < 1 || sb[i] < 1) return 0; /* empty products: ours */
    }
    node_cache_t *nc = &d->nodes[n - g->nodes];
    int64_t key[KEY_MAX];
    int nkey = 0;
    for (int i = 0; i < a->nd; i++) key[nkey++] = a->dims[i];
    for (int i = 0; i < b->nd; i++) key[nkey++] = b->dims[i];
    prim_t *e = cache_find(d, nc, key, nkey);
    /* The operands as they are stored: row-major, transposes as swapped strides. */
    dnnl_memory_desc_t amd, bmd_plain, biasmd, dmd;
    dnnl_dims_t dsa, dsb, dsd, st_a, st_b, bsd = {1, nn};
    for (int i = 0; i < nd; i++) {
        dsa[i] = sa[i];
        dsb[i] = sb[i];
        dsd[i] = sd[i];
    }
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st_a[i] = s;
        s *= sa[i];
    }
    if (ta) {
        st_a[0] = 1;
        st_a[1] = mrows;
    }
    s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st_b[i] = s;
        s *= sb[i];
    }
    if (tb) {
        st_b[0] = 1;
        st_b[1] = k;
    }
    if (dnnl_memory_desc_init_by_strides(&amd, nd, dsa, dnnl_f32, st_a) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&bmd_plain, nd, dsb, dnnl_f32, st_b) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&dmd, nd, dsd, dnnl_f32, plain_tag(nd)) != dnnl_success) {
        return 0;
    }
    if (nd == 2) dnnl_memory_desc_init_by_tag(&biasmd, 2, bsd, dnnl_f32, dnnl_ab);
    /* BF16: A and a non-constant B are rounded into BF16 copies (plain layout) per run. */
    dnnl_memory_desc_t amd_run = amd;
    if (d->bf16) dnnl_memory_desc_init_by_tag(&amd_run, nd, dsa, dnnl_bf16, plain_tag(nd));
    if (e == NULL) {
        dnnl_memory_desc_t wmd = bmd_plain;
        if (wconst) dnnl_memory_desc_init_by_tag(&wmd, 2, dsb, act_type(d), dnnl_format_tag_any);
        else if (d->bf16) dnnl_memory_desc_init_by_tag(&wmd, nd, dsb, dnnl_bf16, plain_tag(nd));
        dnnl_matmul_desc_t md;
        if (dnnl_matmul_desc_init(&md, &amd_run, &wmd, bias ? &biasmd : NULL, &dmd) != dnnl_success) {
            d->st.fallbacks++;
            return 0;
        }
        dnnl_primitive_attr_t attr = make_attr(r, n->fused_relu ? dnnl_eltwise_relu : gelu ? dnnl_eltwise_gelu_erf : dnnl_alg_kind_undef, false,
                                               false, alpha);
        if (attr == NULL) return sp_ox_fail(r, "oneDNN: out of memory");
        e = cache_slot(d, nc, key, nkey);
        int rc = create(r, e, &md, attr, true);
        dnnl_primitive_attr_destroy(attr);
        if (rc <= 0) return rc;
    }
    sp_ox_tensor_t tw = {0}, ta16 = {0};
    sp_ox_tensor_t *out = &g->values[gelu ? d->fz[gh].out : n->out[0]].t;
    void *wp, *ap = a->data;
    int rc = -1;
    if (weights(r, nc, e, n->in[1], &bmd_plain, &tw, &wp)) goto done;
    if (!dnnl_memory_desc_equal(&amd, &e->src_md)) {
        if (out_bytes(r, &ta16, dnnl_memory_desc_get_size(&e->src_md), 1, (int64_t[]){1}) ||
            reorder(r, &amd, a->data, &e->src_md, ta16.data)) {
            goto done;
        }
        ap = ta16.data;
    }
    if (sp_ox_out(r, out, OX_FLOAT, ond, od)) goto done;
    int ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    const dnnl_memory_desc_t *mds[4] = {&e->src_md, &e->w_md, &e->dst_md, &biasmd};
    void *ptrs[4] = {ap, wp, out->data, bias ? bias->data : NULL};
    if (execute(r, e->p, bias ? 4 : 3, ids, mds, ptrs)) goto done;
    if (gelu) d->fz[gh].ran = true;
    rc = 1;
done:
    sp_ox_pool_put(r, &tw);
    sp_ox_pool_put(r, &ta16);
    return rc;
}

/* ---- INT8: qdq.c's fused QDQConv / QDQMatMul as oneDNN int8 primitives ----
 *
 * The node computes y[c] = mult[c] * sum((xq - zx) * wq[c]) + bias[c] (Relu), xq =
 * clamp(rint(x / sx) + zx) in u8 or s8 (qdq.c). Here xq is made by quantize8 with exactly
 * qdq.c's arithmetic (a true division, round half to even, NaN -> zx), in whatever dense
 * layout x is in (quantizing is elementwise), so oneDNN sees the same integers as our own
 * kernels; the weights are the node's int16 rows narrowed to s8 (they fit whenever the model's
 * weights are INT8 with zero point 0, what `sampan optimize` writes); the product is exact
 * int32 on both sides; oneDNN applies mult[c] as per-channel output scales, zx as the source
 * zero point (padding counts as zx, i.e. real 0, as in ours), the bias as a per-channel binary
 * add and the Relu as an eltwise post-op, writing f32: float(acc) * mult[c] + bias[c], the same
 * two roundings as sp_ox_dequant_row, so results agree to an ulp or two of |acc * mult| + |bias|
 * (oneDNN may contract the multiply and add). */

static void
quantize8_scalar(const float *x, int64_t n, const float *qp, void *dst, bool u8)
{
    float s = qp[0], z = qp[1], lo = qp[2], hi = qp[3];
    for (int64_t i = 0; i < n; i++) {
        float q = rintf(x[i] / s) + z;
        q = q < lo ? lo : q > hi ? hi : q;
        if (q != q) q = z;
        if (u8) ((uint8_t *)dst)[i] = (uint8_t)(int)q;
        else ((int8_t *)dst)[i] = (int8_t)(int)q;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* 16 at a time: vdivps and vroundps are the IEEE division and rint; the clamped values fit
 * 8 bits, so the saturating packs are exact. */
__attribute__((target("avx2"))) static void
quantize8_avx2(const float *x, int64_t n, const float *qp, void *dst, bool u8)
{
    __m256 s = _mm256_set1_ps(qp[0]), z = _mm256_set1_ps(qp[1]), lo = _mm256_set1_ps(qp[2]),
           hi = _mm256_set1_ps(qp[3]);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i k[2];
        for (int h = 0; h < 2; h++) {
            __m256 q = _mm256_add_ps(_mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * h), s),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), z);
            __m256 nan = _mm256_cmp_ps(q, q, _CMP_UNORD_Q);
            q = _mm256_blendv_ps(_mm256_min_ps(_mm256_max_ps(q, lo), hi), z, nan);
            k[h] = _mm256_cvtps_epi32(q);
        }
        __m128i a = _mm_packs_epi32(_mm256_castsi256_si128(k[0]), _mm256_extracti128_si256(k[0], 1));
        __m128i b = _mm_packs_epi32(_mm256_castsi256_si128(k[1]), _mm256_extracti128_si256(k[1], 1));
        _mm_storeu_si128((__m128i *)((char *)dst + i), u8 ? _mm_packus_epi16(a, b) : _mm_packs_epi16(a, b));
    }
    quantize8_scalar(x + i, n - i, qp, (char *)dst + i, u8);
}
#endif

static void
quantize8(const float *x, int64_t n, const float *qp, void *dst, bool u8)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (strcmp(sp_ox_qgemm_kernel(), "scalar") != 0) {
        quantize8_avx2(x, n, qp, dst, u8);
        return;
    }
#endif
    quantize8_scalar(x, n, qp, dst, u8);
}

/* The node's s8 weights, made once: conv rows [m][kp] as [m][k] (oihw order); matmul panels
 * (sp_ox_qpack_rows) unpacked to B [k][m]. false when a weight is outside s8. */
static bool
q8_weights(node_cache_t *nc, const sp_ox_tensor_t *w16, int64_t k, bool conv, int32_t lim)
{
    if (nc->q8) return nc->q8 > 0;
    int64_t m = w16->dims[0], kp = w16->dims[1];
    const int16_t *src = w16->data;
    nc->q8 = -1;
    nc->q8w = malloc((size_t)(m * k + 1));
    if (nc->q8w == NULL) return false;
    for (int64_t o = 0; o < m; o++) {
        for (int64_t i = 0; i < k; i++) {
            int16_t v = conv ? src[o * kp + i] : src[((o / 16 * (kp / 2) + i / 2) * 16 + o % 16) * 2 + i % 2];
            if (v < -lim || v > (lim < 128 ? lim : 127)) {
                free(nc->q8w);
                nc->q8w = NULL;
                return false;
            }
            nc->q8w[conv ? o * k + i : i * m + o] = (int8_t)v;
        }
    }
    nc->q8 = 1;
    return true;
}

/* How a QDQConv with a fused residual Add gets the residual (run_q8). */
enum {
    RES_NONE,   /* no residual */
    RES_SUM,    /* already in dst, in dst's type: sum post-op (sum_scale, sum_zp: a quantized one) */
    RES_BINARY, /* f32 tensor res_md added before the Relu, dst quantized afterwards (out_scale) */
};

typedef struct q8_post {
    int res;
    float sum_scale;
    int32_t sum_zp;
    dnnl_data_type_t sum_dt;
    const dnnl_memory_desc_t *res_md;
    float out_scale; /* RES_BINARY: 1 / sy, applied after the Relu */
} q8_post_t;

/* Output scales mult[m] per channel (axis 1 of dst), the source zero point, and the post-ops:
 * + bias[c] (binary add of a [1, m(, 1, 1)] tensor), + the residual (graph.c's fused Add: a
 * sum of dst, or a binary add of an f32 tensor, see q8_post_t), Relu: sp_ox_fused_add's order;
 * RES_BINARY then scales by 1 / sy (eltwise linear) before dst's zero point and rounding. */
static dnnl_primitive_attr_t
q8_attr(const float *mult, int64_t m, int32_t zx, int32_t zy, const dnnl_memory_desc_t *bias_md,
        const q8_post_t *post, bool relu)
{
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
    if (dnnl_post_ops_create(&po) != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    dnnl_post_ops_append_binary(po, dnnl_binary_add, bias_md);
    if (post->res == RES_SUM) dnnl_post_ops_append_sum_v3(po, post->sum_scale, post->sum_zp, post->sum_dt);
    if (post->res == RES_BINARY) dnnl_post_ops_append_binary(po, dnnl_binary_add, post->res_md);
    if (relu) dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (post->res == RES_BINARY) dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, post->out_scale, 0.0f);
    dnnl_primitive_attr_set_post_ops(attr, po);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_set_output_scales(attr, m, 1 << 1, mult);
    if (zx != 0) dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0, &zx);
    if (zy != 0) dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_DST, 1, 0, &zy);
    return attr;
}

/* x (value v, f32 in its current layout, dense) quantized into tq, in the same layout with the
 * 8-bit type: *qmd, data at *src. A value a chained QDQConv already wrote quantized with these
 * parameters is used as it is. */
static int
q8_source(sp_ox_run_t *r, int32_t v, const float *qp, bool u8, sp_ox_tensor_t *tq, dnnl_memory_desc_t *qmd,
          void **src)
{
    const vq_t *q = &r->dnnl->vq[v];
    if (q->on && q->s == qp[0] && q->z == (int32_t)qp[1] && r->dnnl->md[v].data_type == (u8 ? dnnl_u8 : dnnl_s8)) {
        *qmd = r->dnnl->md[v];
        *src = r->g->values[v].t.data;
        return 0;
    }
    if (q->on && sp_ox_dnnl_plain(r, v)) return -1;
    const sp_ox_tensor_t *x = &r->g->values[v].t;
    int64_t n = sp_ox_numel(x);
    dnnl_memory_desc_t have;
    if (md_of(r, v, &have)) return -1;
    if (have.data_type != dnnl_f32 || dnnl_memory_desc_get_size(&have) != (size_t)n * sizeof(float)) {
        /* padded blocks or BF16: back to plain f32 first */
        if (sp_ox_dnnl_plain(r, v) || md_of(r, v, &have)) return -1;
        x = &r->g->values[v].t;
    }
    *qmd = have;
    qmd->data_type = u8 ? dnnl_u8 : dnnl_s8;
    int64_t one = n > 0 ? n : 1;
    if (sp_ox_out(r, tq, OX_UINT8, 1, &one)) return -1;
    quantize8(x->data, n, qp, tq->data, u8);
    *src = tq->data;
    return 0;
}

static int
run_q8(sp_ox_run_t *r, sp_ox_node_t *n, int32_t o, bool conv)
{
    struct sp_ox_dnnl *d = r->dnnl;
    sp_ox_graph_t *g = r->g;
    const sp_ox_tensor_t *x = &g->values[n->in[0]].t, *w16 = &g->values[n->in[1]].t;
    const float *mult = g->values[n->in[2]].t.data, *qp = g->values[n->in[3]].t.data;
    const float *bias = g->values[n->in[4]].t.data;
    if (d->bf16 || x->dtype != OX_FLOAT) return 0; /* bf16: its own precision choice; others: ours */
    const sp_ox_tensor_t *y = conv && n->fused_add >= 0 ? &g->values[n->fused_add].t : NULL;
    bool u8 = qp[2] == 0.0f;
    int32_t zx = (int32_t)qp[1];
    int64_t m = w16->dims[0];
    node_cache_t *nc = &d->nodes[n - g->nodes];
    int64_t key[KEY_MAX];
    int nkey = 0;
    for (int i = 0; i < x->nd && i < OX_MAX_DIMS; i++) key[nkey++] = x->dims[i];
    int64_t od[OX_MAX_DIMS];
    int ond = x->nd;
    dnnl_memory_desc_t wplain, bmd, dmd_plain;
    dnnl_dims_t wd, bd, dd;
    geom_t gm;
    int64_t rows = 0, k;
    if (conv) {
        int64_t cg = (int64_t)qp[4], kh = (int64_t)qp[5], kw = (int64_t)qp[6], group = (int64_t)qp[7];
        k = cg * kh * kw;
        if (x->nd != 4 || x->dims[1] != cg * group) return 0;
        int64_t kern[2] = {kh, kw};
        if (sp_ox_geometry(r, n, x, kern, 2, false, &gm) || gm.pb_end < 0 || gm.pr_end < 0) return 0;
        od[0] = x->dims[0];
        od[1] = m;
        od[2] = gm.oh;
        od[3] = gm.ow;
        int64_t w5[5] = {group, m / group, cg, kh, kw}, w4[4] = {m, cg, kh, kw};
        for (int i = 0; i < (group > 1 ? 5 : 4); i++) wd[i] = group > 1 ? w5[i] : w4[i];
        if (dnnl_memory_desc_init_by_tag(&wplain, group > 1 ? 5 : 4, wd, dnnl_s8, group > 1 ? dnnl_goihw : dnnl_oihw) !=
            dnnl_success) return 0;
        bd[0] = 1, bd[1] = m, bd[2] = 1, bd[3] = 1;
        dnnl_memory_desc_init_by_tag(&bmd, 4, bd, dnnl_f32, dnnl_abcd);
        if (y) {
            if (!is_float(y) || y->nd != 4) return 0;
            for (int i = 0; i < 4; i++) {
                if (y->dims[i] != od[i]) return 0; /* a broadcasting Add: our own runtime */
            }
        }
    } else {
        k = (int64_t)qp[4];
        if (x->nd < 1 || k < 1 || x->dims[x->nd - 1] != k) return 0;
        rows = sp_ox_numel(x) / k;
        if (rows < 1) return 0;
        for (int i = 0; i < x->nd; i++) od[i] = x->dims[i];
        od[ond - 1] = m;
        wd[0] = k, wd[1] = m;
        dnnl_memory_desc_init_by_tag(&wplain, 2, wd, dnnl_s8, dnnl_ab);
        bd[0] = 1, bd[1] = m;
        dnnl_memory_desc_init_by_tag(&bmd, 2, bd, dnnl_f32, dnnl_ab);
        dd[0] = rows, dd[1] = m;
        dnnl_memory_desc_init_by_tag(&dmd_plain, 2, dd, dnnl_f32, dnnl_ab);
    }
    if (!d->vnni && !u8) {
        d->st.fallbacks++; /* an s8 source: oneDNN would halve the weights (isa_vnni) */
        return 0;
    }
    if (!q8_weights(nc, w16, k, conv, q8_limit(d))) {
        if (!d->vnni) d->st.fallbacks++;
        return 0;
    }
    const float *ch = conv ? nc->chain : NULL;
    if (conv && qp[8] > 0.0f && ch == NULL) return 0; /* its output pair unchained: ours rounds it */
    if (ch && nc->cmult == NULL) {
        /* y / sy = acc * (mult / sy) + bias / sy: the readers' quantization folded in */
        nc->cmult = malloc((size_t)m * sizeof(float));
        nc->cbias = malloc((size_t)m * sizeof(float));
        if (nc->cmult == NULL || nc->cbias == NULL) return sp_ox_fail(r, "out of memory");
        for (int64_t c = 0; c < m; c++) {
            nc->cmult[c] = mult[c] / ch[0];
            nc->cbias[c] = bias[c] / ch[0];
        }
    }
    /* The residual of a chained QDQConv (its dst quantized): a residual its producer left
     * quantized in dst's type is summed into dst with its scale and zero point,
     * dst = relu(acc * mult / sy + bias / sy + (sr / sy) (r - zr)) + zy; any other one is
     * added in f32 before the Relu, dst = relu(acc * mult + bias + res) / sy + zy. */
    q8_post_t post = {y ? RES_SUM : RES_NONE, 1.0f, 0, dnnl_data_type_undef, NULL, 1.0f};
    dnnl_memory_desc_t rmd;
    memset(&rmd, 0, sizeof rmd);
    if (y && ch) {
        const vq_t *rq = &d->vq[n->fused_add];
        dnnl_data_type_t rdt = d->md[n->fused_add].data_type;
        if (rq->on && (rdt == dnnl_u8 || rdt == dnnl_s8)) {
            /* an s8 residual (a projection's output pair) into a u8 dst: the sum reads dst's
             * bytes as s8 (sum_v3's data type, same size) */
            post.sum_scale = rq->s / ch[0];
            post.sum_zp = rq->z;
            post.sum_dt = rdt;
        } else {
            /* f32 (dequantized when quantized otherwise), given to the primitive as f32 NHWC
             * with dst NHWC too: oneDNN 2.6's int8 JIT convolutions take a full-tensor binary
             * post-op only in dst's own layout (a plain NCHW one ran on ref_int8: 20x slower
             * on ResNet-50's projection blocks) */
            if (rq->on && sp_ox_dnnl_plain(r, n->fused_add)) return -1;
            dnnl_dims_t rd = {od[0], od[1], od[2], od[3]};
            if (dnnl_memory_desc_init_by_tag(&rmd, 4, rd, dnnl_f32, dnnl_acdb) != dnnl_success) return 0;
            post.res = RES_BINARY;
            post.res_md = &rmd;
            post.out_scale = 1.0f / ch[0];
        }
    }
    if (conv) {
        key[nkey++] = post.res;
        if (post.res == RES_SUM) {
            uint32_t bits;
            memcpy(&bits, &post.sum_scale, sizeof bits);
            key[nkey++] = bits;
            key[nkey++] = post.sum_zp;
            key[nkey++] = post.sum_dt;
        }
    }
    /* the multipliers and bias the primitive scales by: divided by sy where dst is quantized
     * straight from the sum */
    bool cscaled = ch && post.res != RES_BINARY;
    prim_t *e = cache_find(d, nc, key, nkey);
    if (e == NULL) {
        dnnl_memory_desc_t smd, wmd, dmd;
        dnnl_data_type_t st8 = u8 ? dnnl_u8 : dnnl_s8;
        int wnd = wplain.ndims;
        dnnl_memory_desc_init_by_tag(&wmd, wnd, wd, dnnl_s8, dnnl_format_tag_any);
        union {
            dnnl_convolution_desc_t c;
            dnnl_matmul_desc_t mm;
        } op;
        dnnl_status_t st;
        if (conv) {
            dnnl_dims_t sd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]}, ddm = {od[0], od[1], od[2], od[3]};
            dnnl_memory_desc_init_by_tag(&smd, 4, sd, st8, dnnl_format_tag_any);
            dnnl_memory_desc_init_by_tag(&dmd, 4, ddm, !ch ? dnnl_f32 : ch[2] == 0.0f ? dnnl_u8 : dnnl_s8,
                                         post.res == RES_BINARY ? dnnl_acdb : dnnl_format_tag_any);
            dnnl_dims_t strides = {gm.sh, gm.sw}, dil = {gm.dh - 1, gm.dw - 1}, pl = {gm.pt, gm.pl},
                        pr = {gm.pb_end, gm.pr_end};
            st = dnnl_dilated_convolution_forward_desc_init(&op.c, dnnl_forward_inference, dnnl_convolution_direct,
                                                            &smd, &wmd, NULL, &dmd, strides, dil, pl, pr);
        } else {
            dnnl_dims_t sd = {rows, k};
            dnnl_memory_desc_init_by_tag(&smd, 2, sd, st8, dnnl_ab);
            st = dnnl_matmul_desc_init(&op.mm, &smd, &wmd, NULL, &dmd_plain);
        }
        if (st != dnnl_success) {
            d->st.fallbacks++;
            return 0;
        }
        dnnl_primitive_attr_t attr = q8_attr(cscaled ? nc->cmult : mult, m, zx, ch ? (int32_t)ch[1] : 0, &bmd, &post,
                                             n->fused_relu != 0);
        if (attr == NULL) return sp_ox_fail(r, "oneDNN: out of memory");
        e = cache_slot(d, nc, key, nkey);
        int rc = create(r, e, &op, attr, true);
        dnnl_primitive_attr_destroy(attr);
        if (rc <= 0) return rc;
    }
    sp_ox_tensor_t tq = {0}, tx = {0}, tr = {0};
    sp_ox_tensor_t *out = &g->values[n->out[0]].t;
    dnnl_memory_desc_t qmd;
    void *res = NULL;
    if (post.res == RES_BINARY) {
        /* the f32 residual in NHWC (rmd), reordered from the layout its producer left */
        dnnl_memory_desc_t have;
        res = g->values[n->fused_add].t.data;
        if (md_of(r, n->fused_add, &have)) return -1;
        if (!dnnl_memory_desc_equal(&have, &rmd)) {
            if (out_bytes(r, &tr, dnnl_memory_desc_get_size(&rmd), 1, (int64_t[]){1})) return -1;
            if (reorder(r, &have, res, &rmd, tr.data)) {
                sp_ox_pool_put(r, &tr);
                return -1;
            }
            res = tr.data;
        }
    }
    void *wp, *src;
    int rc = -1;
    if (!conv && sp_ox_dnnl_plain(r, n->in[0])) return -1;
    if (q8_source(r, n->in[0], qp, u8, &tq, &qmd, &src) || pack_const(r, nc, e, &wplain, nc->q8w, &wp)) goto done;
    if (!conv) {
        /* the rows [rows, k], whatever the rank */
        qmd = e->src_md;
    } else if (!dnnl_memory_desc_equal(&qmd, &e->src_md)) {
        if (out_bytes(r, &tx, dnnl_memory_desc_get_size(&e->src_md), 1, (int64_t[]){1}) ||
            reorder(r, &qmd, src, &e->src_md, tx.data)) {
            goto done;
        }
        src = tx.data;
    }
    if (post.res == RES_SUM) {
        if (residual_dst(r, n, o, e, od)) goto done;
    } else if (conv ? out_bytes(r, out, dnnl_memory_desc_get_size(&e->dst_md), 4, od)
                    : sp_ox_out(r, out, OX_FLOAT, ond, od)) {
        goto done;
    }
    int ids[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                  DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1};
    const dnnl_memory_desc_t *mds[5] = {&e->src_md, &e->w_md, &e->dst_md, &bmd, &rmd};
    void *ptrs[5] = {src, wp, out->data, cscaled ? nc->cbias : (void *)bias,
                     res};
    if (execute(r, e->p, post.res == RES_BINARY ? 5 : 4, ids, mds, ptrs)) goto done;
    if (conv) set_layout(r, n->out[0], &e->dst_md);
    if (ch) d->vq[n->out[0]] = (vq_t){true, ch[0], (int32_t)ch[1]};
    rc = 1;
done:
    sp_ox_pool_put(r, &tq);
    sp_ox_pool_put(r, &tx);
    sp_ox_pool_put(r, &tr);
    return rc;
}

/* ---- QLinearConv, ConvInteger, QLinearMatMul, MatMulInteger ----
 *
 * The ONNX integer operators on 8-bit tensors (plain, as our own operators keep them), with
 * constant weights and constant quantization parameters: x's zero point one value (the
 * primitive's source zero point), the weights minus their zero points (per tensor, or per output
 * channel / B column) narrowed to s8 once. QLinear*: scales fl(fl(sx * sw[c]) / sy) as our own
 * operator forms them, the int32 bias B added to the sum before them (oneDNN 2.x's int8 bias),
 * the destination zero point and saturation to y's type: ours rounds (acc + B) * scale in double,
 * oneDNN in float, so the quantized output may differ by 1 where the product lies within a float
 * rounding of a .5 boundary, never more. *Integer: the exact int32 sums, equal. Anything else
 * (a per-row zero point of A, weights that do not fit s8, non-constant parameters, ranks other
 * than 4-D convolution input or 2-D B) stays ours, which also reports every malformed input. */

static bool
q8_type(const sp_ox_tensor_t *t)
{
    return t && t->data && (t->dtype == OX_UINT8 || t->dtype == OX_INT8);
}

static int32_t
q8_val(const sp_ox_tensor_t *t, int64_t i)
{
    return t->dtype == OX_UINT8 ? ((const uint8_t *)t->data)[i] : ((const int8_t *)t->data)[i];
}

/* in[k] when it is a constant (NULL when absent; *ok false when present and not constant) */
static const sp_ox_tensor_t *
const_in(const sp_ox_graph_t *g, const sp_ox_node_t *n, int k, bool *ok)
{
    if (k >= n->n_in || n->in[k] < 0) return NULL;
    if (!g->values[n->in[k]].is_const) *ok = false;
    return &g->values[n->in[k]].t;
}

/* w - zw into dst as s8 (conv [m][k] rows per output channel, matmul [k][m] per column); false
 * when a zero point has another count or type, or a difference is outside s8. */
static bool
q8_narrow(const sp_ox_tensor_t *w, const sp_ox_tensor_t *zw, int64_t m, bool conv, int8_t *dst, int32_t lim)
{
    int32_t hi_lim = lim < 128 ? lim : 127;
    int64_t total = sp_ox_numel(w), nz = zw ? sp_ox_numel(zw) : 0;
    if (zw && ((nz != 1 && nz != m) || zw->dtype != w->dtype)) return false;
    if (nz <= 1) {
        /* one zero point: a loop the compiler vectorizes (run-time B narrows on every run) */
        int32_t z = zw ? q8_val(zw, 0) : 0, lo = 0, hi = 0;
        if (w->dtype == OX_UINT8) {
            const uint8_t *src = w->data;
            for (int64_t i = 0; i < total; i++) {
                int32_t v = (int32_t)src[i] - z;
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                dst[i] = (int8_t)v;
            }
        } else {
            const int8_t *src = w->data;
            for (int64_t i = 0; i < total; i++) {
                int32_t v = (int32_t)src[i] - z;
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                dst[i] = (int8_t)v;
            }
        }
        return lo >= -lim && hi <= hi_lim;
    }
    for (int64_t i = 0; i < total; i++) {
        int64_t c = conv ? i / (total / m) : i % m;
        int32_t v = q8_val(w, i) - (zw ? q8_val(zw, nz == 1 ? 0 : c) : 0);
        if (v < -lim || v > hi_lim) return false;
        dst[i] = (int8_t)v;
    }
    return true;
}

/* The constant weights w - zw as s8, made once per node. */
static bool
q8_int_weights(node_cache_t *nc, const sp_ox_tensor_t *w, const sp_ox_tensor_t *zw, int64_t m, bool conv,
               int32_t lim)
{
    if (nc->q8) return nc->q8 > 0;
    nc->q8 = -1;
    nc->q8w = malloc((size_t)sp_ox_numel(w) + 1);
    if (nc->q8w == NULL) return false;
    if (!q8_narrow(w, zw, m, conv, nc->q8w, lim)) {
        free(nc->q8w);
        nc->q8w = NULL;
        return false;
    }
    nc->q8 = 1;
    return true;
}

static int
run_qlinear(sp_ox_run_t *r, sp_ox_node_t *n, bool conv, bool linear)
{
    struct sp_ox_dnnl *d = r->dnnl;
    sp_ox_graph_t *g = r->g;
    bool ok = true;
    const sp_ox_tensor_t *x = &g->values[n->in[0]].t;
    const sp_ox_tensor_t *sx = linear ? const_in(g, n, 1, &ok) : NULL;
    const sp_ox_tensor_t *zx = const_in(g, n, 2, &ok);
    /* B computed at run time (attention on dynamically quantized activations) stays ours: our
     * kernel packs B per run, and oneDNN with B narrowed and reordered per run was no faster at
     * 1 to 1024 rows of A (measured: docs/design.md, "run-time B"). */
    const sp_ox_tensor_t *w = const_in(g, n, linear ? 3 : 1, &ok);
    const sp_ox_tensor_t *sw = linear ? const_in(g, n, 4, &ok) : NULL;
    const sp_ox_tensor_t *zw = const_in(g, n, linear ? 5 : 3, &ok);
    const sp_ox_tensor_t *sy = linear ? const_in(g, n, 6, &ok) : NULL;
    const sp_ox_tensor_t *zy = linear ? const_in(g, n, 7, &ok) : NULL;
    const sp_ox_tensor_t *b = linear && conv ? const_in(g, n, 8, &ok) : NULL;
    if (!ok || d->blocked[n->in[0]] || !q8_type(x) || !q8_type(w) || n->n_out != 1) return 0;
    if (zx && (sp_ox_numel(zx) != 1 || zx->dtype != x->dtype)) return 0;
    if (linear && (!sx || !sw || !sy || !zy || !q8_type(zy) || sp_ox_numel(zy) != 1 || sx->dtype != OX_FLOAT ||
                   sw->dtype != OX_FLOAT || sy->dtype != OX_FLOAT || sp_ox_numel(sx) != 1 || sp_ox_numel(sy) != 1)) {
        return 0;
    }
    int64_t m, k, rows = 0, od[OX_MAX_DIMS];
    int ond = x->nd;
    geom_t gm;
    dnnl_dims_t wd;
    dnnl_memory_desc_t wplain, xmd, opmd;
    dnnl_data_type_t xt = x->dtype == OX_UINT8 ? dnnl_u8 : dnnl_s8;
    dnnl_data_type_t yt = linear ? (zy->dtype == OX_UINT8 ? dnnl_u8 : dnnl_s8) : dnnl_s32;
    int64_t group = conv ? sp_ox_attr_i(n, "group", 1) : 1;
    if (conv) {
        m = w->dims[0];
        if (x->nd != 4 || w->nd != 4 || group < 1 || x->dims[1] % group || m % group ||
            w->dims[1] != x->dims[1] / group) return 0;
        k = w->dims[1] * w->dims[2] * w->dims[3];
        if (sp_ox_geometry(r, n, x, w->dims + 2, 2, false, &gm) || gm.pb_end < 0 || gm.pr_end < 0) return 0;
        int64_t o4[4] = {x->dims[0], m, gm.oh, gm.ow};
        for (int i = 0; i < 4; i++) od[i] = o4[i];
        int64_t w5[5] = {group, m / group, w->dims[1], w->dims[2], w->dims[3]};
        for (int i = 0; i < (group > 1 ? 5 : 4); i++) wd[i] = group > 1 ? w5[i] : w->dims[i];
        if (dnnl_memory_desc_init_by_tag(&wplain, group > 1 ? 5 : 4, wd, dnnl_s8, group > 1 ? dnnl_goihw : dnnl_oihw) !=
            dnnl_success || md_plain(&xmd, 4, x->dims) != dnnl_success) return 0;
        xmd.data_type = xt;
        if (b && (b->dtype != OX_INT32 || sp_ox_numel(b) != m)) return 0;
    } else {
        if (x->nd < 2 || w->nd != 2 || x->dims[x->nd - 1] != w->dims[0]) return 0;
        k = w->dims[0];
        m = w->dims[1];
        rows = sp_ox_numel(x) / k;
        if (rows < 1) return 0;
        for (int i = 0; i < x->nd; i++) od[i] = x->dims[i];
        od[ond - 1] = m;
        wd[0] = k, wd[1] = m;
        dnnl_dims_t xd = {rows, k};
        dnnl_memory_desc_init_by_tag(&wplain, 2, wd, dnnl_s8, dnnl_ab);
        dnnl_memory_desc_init_by_tag(&xmd, 2, xd, xt, dnnl_ab);
    }
    if (linear && sp_ox_numel(sw) != 1 && sp_ox_numel(sw) != m) return 0;
    if (m < 1 || k < 1) return 0;
    node_cache_t *nc = &d->nodes[n - g->nodes];
    if (!d->vnni && x->dtype != OX_UINT8) {
        d->st.fallbacks++; /* an s8 source: oneDNN would halve the weights (isa_vnni) */
        return 0;
    }
    if (!q8_int_weights(nc, w, zw, m, conv, q8_limit(d))) {
        if (!d->vnni) d->st.fallbacks++;
        return 0;
    }
    if (linear && nc->cmult == NULL) {
        nc->cmult = malloc((size_t)m * sizeof(float));
        if (nc->cmult == NULL) return sp_ox_fail(r, "out of memory");
        float fx = *(const float *)sx->data, fy = *(const float *)sy->data;
        for (int64_t c = 0; c < m; c++) nc->cmult[c] = fx * ((const float *)sw->data)[sp_ox_numel(sw) == 1 ? 0 : c] / fy;
    }
    int64_t key[KEY_MAX];
    int nkey = 0;
    for (int i = 0; i < x->nd; i++) key[nkey++] = x->dims[i];
    dnnl_memory_desc_t bmd;
    dnnl_dims_t bd = {m};
    dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_s32, dnnl_a);
    if (conv) {
        dnnl_dims_t ddm = {od[0], od[1], od[2], od[3]};
        dnnl_memory_desc_init_by_tag(&opmd, 4, ddm, yt, dnnl_abcd);
    } else {
        dnnl_dims_t ddm = {rows, m};
        dnnl_memory_desc_init_by_tag(&opmd, 2, ddm, yt, dnnl_ab);
    }
    prim_t *e = cache_find(d, nc, key, nkey);
    if (e == NULL) {
        dnnl_memory_desc_t smd = xmd, wmd, dmd = opmd;
        dnnl_memory_desc_init_by_tag(&wmd, wplain.ndims, wd, dnnl_s8, dnnl_format_tag_any);
        union {
            dnnl_convolution_desc_t c;
            dnnl_matmul_desc_t mm;
        } op;
        dnnl_status_t st;
        if (conv) {
            dnnl_dims_t sd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]};
            dnnl_memory_desc_init_by_tag(&smd, 4, sd, xt, dnnl_format_tag_any);
            dnnl_memory_desc_init_by_tag(&dmd, 4, opmd.dims, yt, dnnl_format_tag_any);
            dnnl_dims_t strides = {gm.sh, gm.sw}, dil = {gm.dh - 1, gm.dw - 1}, pl = {gm.pt, gm.pl},
                        pr = {gm.pb_end, gm.pr_end};
            st = dnnl_dilated_convolution_forward_desc_init(&op.c, dnnl_forward_inference, dnnl_convolution_direct,
                                                            &smd, &wmd, b ? &bmd : NULL, &dmd, strides, dil, pl, pr);
        } else {
            st = dnnl_matmul_desc_init(&op.mm, &smd, &wmd, NULL, &dmd);
        }
        if (st != dnnl_success) {
            d->st.fallbacks++;
            return 0;
        }
        dnnl_primitive_attr_t attr;
        if (dnnl_primitive_attr_create(&attr) != dnnl_success) return sp_ox_fail(r, "oneDNN: out of memory");
        int32_t z0 = zx ? q8_val(zx, 0) : 0, y0 = linear ? q8_val(zy, 0) : 0;
        if (linear) dnnl_primitive_attr_set_output_scales(attr, sp_ox_numel(sw) == 1 ? 1 : m,
                                                          sp_ox_numel(sw) == 1 ? 0 : 1 << 1, nc->cmult);
        if (z0 != 0) dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0, &z0);
        if (y0 != 0) dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_DST, 1, 0, &y0);
        e = cache_slot(d, nc, key, nkey);
        int rc = create(r, e, &op, attr, true);
        dnnl_primitive_attr_destroy(attr);
        if (rc <= 0) return rc;
    }
    sp_ox_tensor_t tx = {0}, ty = {0};
    sp_ox_tensor_t *out = &g->values[n->out[0]].t;
    void *wp, *src = x->data, *dst;
    int rc = -1;
    if (pack_const(r, nc, e, &wplain, nc->q8w, &wp)) goto done;
    if (!dnnl_memory_desc_equal(&xmd, &e->src_md)) {
        if (out_bytes(r, &tx, dnnl_memory_desc_get_size(&e->src_md), 1, (int64_t[]){1}) ||
            reorder(r, &xmd, x->data, &e->src_md, tx.data)) {
            goto done;
        }
        src = tx.data;
    }
    if (sp_ox_out(r, out, linear ? zy->dtype : OX_INT32, ond, od)) goto done;
    dst = out->data;
    bool dplain = dnnl_memory_desc_equal(&opmd, &e->dst_md);
    if (!dplain) {
        if (out_bytes(r, &ty, dnnl_memory_desc_get_size(&e->dst_md), 1, (int64_t[]){1})) goto done;
        dst = ty.data;
    }
    int ids[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    const dnnl_memory_desc_t *mds[4] = {&e->src_md, &e->w_md, &e->dst_md, &bmd};
    void *ptrs[4] = {src, wp, dst, b ? b->data : NULL};
    if (execute(r, e->p, b ? 4 : 3, ids, mds, ptrs)) goto done;
    if (!dplain && reorder(r, &e->dst_md, ty.data, &opmd, out->data)) goto done;
    rc = 1;
done:
    sp_ox_pool_put(r, &tx);
    sp_ox_pool_put(r, &ty);
    return rc;
}

/* ---- BERT's LayerNorm, Softmax and GELU ----
 *
 * Softmax over the last axis, LayerNormalization over the last axis (Scale and B of that
 * length) and Gelu run as oneDNN's softmax, layer normalization and eltwise (gelu_erf,
 * gelu_tanh) primitives on plain FP32 tensors, at precision fp32 and bf16 alike (they are
 * memory-bound: BF16 would add a conversion pass and lose the statistics' precision).
 * BERT exports written before opset 17 spell LayerNorm and GELU out in elementary operators;
 * at attach, those chains are found (find_groups) and run as one primitive at the chain's
 * first node, the rest of the chain skipped in that run:
 *   LN:   m = ReduceMean(x, -1); d = x - m; v = ReduceMean(d ^ 2, -1);
 *         y = d / Sqrt(v + eps) * gamma + beta
 *   GELU: y = x * (Erf(x / sqrt(2)) + 1) * 0.5      (x * (1/sqrt(2)) also)
 * Every intermediate must be read only inside its chain and not be a graph output. */

enum { FZ_NONE, FZ_LN, FZ_GELU };

/* Live readers of value v: count, and up to max of them in rd. */
static int
readers(const sp_ox_graph_t *g, int32_t v, sp_ox_node_t **rd, int max)
{
    int cnt = 0;
    if (g->values[v].is_output) return 99;
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        bool reads = n->fused_add == v;
        for (int k = 0; k < n->n_in; k++) reads |= n->in[k] == v;
        if (!reads) continue;
        if (cnt < max) rd[cnt] = n;
        cnt++;
    }
    return cnt;
}

/* The one live reader of v with operator op, when v has exactly one reader. */
static sp_ox_node_t *
only_reader(const sp_ox_graph_t *g, int32_t v, const char *op)
{
    sp_ox_node_t *rd[1];
    if (readers(g, v, rd, 1) != 1 || strcmp(rd[0]->op->name, op) != 0) return NULL;
    return rd[0];
}

/* v is a constant FLOAT scalar: its value. */
static bool
scalar_val(const sp_ox_graph_t *g, int32_t v, float *out)
{
    if (v < 0 || !g->values[v].is_const) return false;
    const sp_ox_tensor_t *t = &g->values[v].t;
    if (t->dtype != OX_FLOAT || sp_ox_numel(t) != 1 || t->data == NULL) return false;
    *out = *(const float *)t->data;
    return true;
}

/* v is a constant FLOAT scalar within rel of want. */
static bool
scalar_is(const sp_ox_graph_t *g, int32_t v, float want, float rel)
{
    float x;
    return scalar_val(g, v, &x) && fabsf(x - want) <= rel * fabsf(want);
}

/* n's other input than v (binary operators), -1 when n does not read v once. */
static int32_t
other_in(const sp_ox_node_t *n, int32_t v)
{
    if (n->n_in != 2 || n->in[0] == n->in[1]) return -1;
    return n->in[0] == v ? n->in[1] : n->in[1] == v ? n->in[0] : -1;
}

static bool
mean_last(const sp_ox_graph_t *g, const sp_ox_node_t *n)
{
    if (strcmp(n->op->name, "ReduceMean") || sp_ox_attr_i(n, "keepdims", 1) != 1 || n->n_out != 1) return false;
    size_t na;
    const int64_t *ax = sp_ox_attr_ints(n, "axes", &na);
    if (ax == NULL && n->n_in > 1 && n->in[1] >= 0 && g->values[n->in[1]].is_const) {
        const sp_ox_tensor_t *t = &g->values[n->in[1]].t;
        if (t->dtype != OX_INT64) return false;
        ax = t->data;
        na = (size_t)sp_ox_numel(t);
    } else if (n->n_in > 1 && n->in[1] >= 0) {
        return false;
    }
    return ax != NULL && na == 1 && ax[0] == -1;
}

static bool
const_vec(const sp_ox_graph_t *g, int32_t v)
{
    return v >= 0 && g->values[v].is_const && g->values[v].t.dtype == OX_FLOAT && g->values[v].t.nd == 1;
}

/* LN chain from its first ReduceMean r1; members get head index h. */
static bool
match_ln(struct sp_ox_dnnl *d, const sp_ox_graph_t *g, sp_ox_node_t *r1)
{
    if (!mean_last(g, r1)) return false;
    int32_t x = r1->in[0];
    sp_ox_node_t *sub = only_reader(g, r1->out[0], "Sub");
    if (!sub || sub->in[0] != x || sub->in[1] != r1->out[0]) return false;
    sp_ox_node_t *rd[2];
    if (readers(g, sub->out[0], rd, 2) != 2) return false;
    sp_ox_node_t *pw = strcmp(rd[0]->op->name, "Pow") == 0 ? rd[0] : rd[1];
    sp_ox_node_t *dv = pw == rd[0] ? rd[1] : rd[0];
    if (strcmp(pw->op->name, "Pow") || strcmp(dv->op->name, "Div") || pw->in[0] != sub->out[0] ||
        !scalar_is(g, pw->in[1], 2.0f, 0.0f) || dv->in[0] != sub->out[0]) return false;
    sp_ox_node_t *r2 = only_reader(g, pw->out[0], "ReduceMean");
    if (!r2 || !mean_last(g, r2)) return false;
    sp_ox_node_t *ae = only_reader(g, r2->out[0], "Add");
    float eps;
    if (!ae || !scalar_val(g, other_in(ae, r2->out[0]), &eps)) return false;
    sp_ox_node_t *sq = only_reader(g, ae->out[0], "Sqrt");
    if (!sq || only_reader(g, sq->out[0], "Div") != dv || dv->in[1] != sq->out[0]) return false;
    sp_ox_node_t *mu = only_reader(g, dv->out[0], "Mul");
    int32_t gv = mu ? other_in(mu, dv->out[0]) : -1;
    if (!const_vec(g, gv)) return false;
    sp_ox_node_t *ad = only_reader(g, mu->out[0], "Add");
    int32_t bv = ad ? other_in(ad, mu->out[0]) : -1;
    if (!const_vec(g, bv) || ad->n_out != 1 || !(eps >= 0.0f)) return false;
    int32_t h = (int32_t)(r1 - g->nodes);
    sp_ox_node_t *members[] = {sub, pw, dv, r2, ae, sq, mu, ad};
    for (size_t i = 0; i < sizeof members / sizeof members[0]; i++) d->fz[members[i] - g->nodes].head = h;
    d->fz[h] = (fuse_t){FZ_LN, -1, x, ad->out[0], gv, bv, eps, false, -1};
    return true;
}

/* GELU chain from its first node (x / sqrt(2) or x * (1/sqrt(2))). */
static bool
match_gelu(struct sp_ox_dnnl *d, const sp_ox_graph_t *g, sp_ox_node_t *dv)
{
    bool div = strcmp(dv->op->name, "Div") == 0;
    if ((!div && strcmp(dv->op->name, "Mul")) || dv->n_in != 2 || dv->n_out != 1) return false;
    int32_t x = dv->in[0];
    if (!scalar_is(g, dv->in[1], div ? 1.41421356f : 0.70710678f, 1e-6f)) return false;
    sp_ox_node_t *er = only_reader(g, dv->out[0], "Erf");
    sp_ox_node_t *a1 = er ? only_reader(g, er->out[0], "Add") : NULL;
    if (!a1 || !scalar_is(g, other_in(a1, er->out[0]), 1.0f, 0.0f)) return false;
    sp_ox_node_t *m1 = only_reader(g, a1->out[0], "Mul");
    if (!m1 || other_in(m1, a1->out[0]) != x) return false;
    sp_ox_node_t *m2 = only_reader(g, m1->out[0], "Mul");
    if (!m2 || !scalar_is(g, other_in(m2, m1->out[0]), 0.5f, 0.0f)) return false;
    int32_t h = (int32_t)(dv - g->nodes);
    sp_ox_node_t *members[] = {er, a1, m1, m2};
    for (size_t i = 0; i < sizeof members / sizeof members[0]; i++) d->fz[members[i] - g->nodes].head = h;
    d->fz[h] = (fuse_t){FZ_GELU, -1, x, m2->out[0], -1, -1, 0.0f, false, -1};
    /* x made by a MatMul and read only by this chain (x / sqrt2 and x * (...)): the GELU becomes
     * that matmul's post-op */
    sp_ox_node_t *rd[3];
    if (readers(g, x, rd, 3) != 2) return true;
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *p = &g->nodes[g->order[o]];
        if (p->n_out >= 1 && p->out[0] == x) {
            if (strcmp(p->op->name, "MatMul") == 0 && p->n_out == 1 && !p->fused_relu) d->fz[p - g->nodes].gelu_of = h;
            break;
        }
    }
    return true;
}

static void
find_groups(struct sp_ox_dnnl *d, const sp_ox_graph_t *g)
{
    for (int32_t i = 0; i < g->n_nodes; i++) d->fz[i] = (fuse_t){FZ_NONE, -1, -1, -1, -1, -1, 0.0f, false, -1};
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        if (n->dead || d->fz[n - g->nodes].head >= 0) continue;
        if (match_ln(d, g, n) || match_gelu(d, g, n)) d->st.groups++;
    }
}

/* QDQConvs whose output only QDQConvs read (as their input, all with one quantization, or as
 * their fused residual Add, at least one as input): the producer writes it quantized
 * (node_cache_t.chain), a QDQConv with a fused residual too (ResNet's block outputs). Its value
 * then differs from our own runtime's by at most 1 in the quantized output: both round y / sy
 * to the nearest integer, ours from y = acc * mult + bias (+ res) rounded to float, oneDNN's
 * from acc * (mult / sy) + bias / sy (+ ...), which differ by a few float roundings, enough to
 * cross a .5 boundary and nothing more. A residual reader takes the value quantized, where our
 * runtime adds it in f32: that residual is off by the rounding of its readers' quantization,
 * at most sy / 2 (sy the residual's scale) when it is within the quantized range (a clipped
 * value is off by more: percentile calibration clips the top 0.01%). run_q8 sums it into a
 * quantized dst (RES_SUM), residual_dst dequantizes it for an f32 one. */
static void
find_chains(struct sp_ox_dnnl *d, const sp_ox_graph_t *g)
{
    for (int32_t o = 0; o < g->n_order; o++) {
        sp_ox_node_t *n = &g->nodes[g->order[o]];
        if (n->dead || strcmp(n->op->name, "QDQConv") || n->n_out != 1) continue;
        sp_ox_node_t *rd[OX_MAX_IO];
        int cnt = readers(g, n->out[0], rd, OX_MAX_IO);
        if (cnt < 1 || cnt > OX_MAX_IO) continue;
        /* an output Q -> DQ pair of its own (qdq.c): its grid, whoever reads it (q8_source
         * requantizes for an input reader of another grid) */
        const float *own = g->values[n->in[3]].t.data;
        const float *qp = own[8] > 0.0f ? own + 8 : NULL;
        bool ok = true;
        for (int i = 0; ok && i < cnt; i++) {
            if (qp == own + 8) {
                ok = strcmp(rd[i]->op->name, "QDQConv") == 0;
            } else if (strcmp(rd[i]->op->name, "QDQConv") != 0) {
                ok = false;
            } else if (rd[i]->in[0] != n->out[0]) {
                ok = rd[i]->fused_add == n->out[0]; /* a residual reader: takes it quantized */
            } else {
                const float *q = g->values[rd[i]->in[3]].t.data;
                ok = rd[i]->fused_add != n->out[0] && (qp == NULL || memcmp(q, qp, 4 * sizeof *q) == 0);
                qp = q;
            }
        }
        if (ok && qp != NULL && !g->values[n->out[0]].is_output) {
            d->nodes[n - g->nodes].chain = qp;
            d->st.chained++;
        }
    }
}

/* One oneDNN primitive over plain FP32 x into a new plain output: softmax (last axis), layer
 * normalization (last axis, scale and shift of that length) or eltwise GELU. 1 done, 0 ours. */
static int
run_simple(sp_ox_run_t *r, sp_ox_node_t *n, int kind, int32_t xv, int32_t ov, int32_t gv, int32_t bv, float eps,
           dnnl_alg_kind_t alg)
{
    struct sp_ox_dnnl *d = r->dnnl;
    sp_ox_graph_t *g = r->g;
    if (sp_ox_dnnl_plain(r, xv)) return -1;
    const sp_ox_tensor_t *x = &g->values[xv].t;
    if (!is_float(x) || x->nd < 1 || x->nd > 6 || sp_ox_numel(x) < 1) return 0;
    int64_t c = x->dims[x->nd - 1];
    const sp_ox_tensor_t *gt = gv >= 0 ? &g->values[gv].t : NULL, *bt = bv >= 0 ? &g->values[bv].t : NULL;
    if (kind == FZ_LN && (!is_float(gt) || sp_ox_numel(gt) != c || (bt && (!is_float(bt) || sp_ox_numel(bt) != c)))) {
        return 0;
    }
    node_cache_t *nc = &d->nodes[n - g->nodes];
    int64_t key[KEY_MAX];
    int nkey = 0;
    for (int i = 0; i < x->nd; i++) key[nkey++] = x->dims[i];
    dnnl_memory_desc_t xmd, cmd;
    if (md_plain(&xmd, x->nd, x->dims) != dnnl_success) return 0;
    dnnl_dims_t cd = {c};
    dnnl_memory_desc_init_by_tag(&cmd, 1, cd, dnnl_f32, dnnl_a);
    prim_t *e = cache_find(d, nc, key, nkey);
    if (e == NULL) {
        union {
            dnnl_softmax_v2_desc_t sm;
            dnnl_layer_normalization_desc_t ln;
            dnnl_eltwise_desc_t el;
        } op;
        dnnl_status_t st;
        if (kind == FZ_LN) {
            unsigned flags = dnnl_use_scale | (bt ? dnnl_use_shift : 0);
            st = dnnl_layer_normalization_forward_desc_init(&op.ln, dnnl_forward_inference, &xmd, NULL, eps, flags);
        } else if (kind == FZ_GELU) {
            st = dnnl_eltwise_forward_desc_init(&op.el, dnnl_forward_inference, alg, &xmd, 0.0f, 0.0f);
        } else {
            st = dnnl_softmax_v2_forward_desc_init(&op.sm, dnnl_forward_inference, dnnl_softmax_accurate, &xmd, &xmd,
                                                   x->nd - 1);
        }
        if (st != dnnl_success) {
            d->st.fallbacks++;
            return 0;
        }
        dnnl_primitive_attr_t attr = make_attr(r, dnnl_alg_kind_undef, false, false, 1.0f);
        if (attr == NULL) return sp_ox_fail(r, "oneDNN: out of memory");
        e = cache_slot(d, nc, key, nkey);
        int rc = create(r, e, &op, attr, false);
        dnnl_primitive_attr_destroy(attr);
        if (rc <= 0) return rc;
    }
    sp_ox_tensor_t *out = &g->values[ov].t;
    if (sp_ox_out(r, out, OX_FLOAT, x->nd, x->dims)) return -1;
    int ids[4] = {DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_SCALE, DNNL_ARG_SHIFT};
    const dnnl_memory_desc_t *mds[4] = {&xmd, &xmd, &cmd, &cmd};
    void *ptrs[4] = {x->data, out->data, gt ? gt->data : NULL, bt ? bt->data : NULL};
    int na = kind == FZ_LN ? (bt ? 4 : 3) : 2;
    if (execute(r, e->p, na, ids, mds, ptrs)) return -1;
    return 1;
}

/* The native operators: Softmax (last axis), LayerNormalization (last axis, one output), Gelu. */
static int
run_native(sp_ox_run_t *r, sp_ox_node_t *n)
{
    const char *t = n->op->name;
    const sp_ox_tensor_t *x = &r->g->values[n->in[0]].t;
    if (n->n_out != 1) return 0;
    if (strcmp(t, "Softmax") == 0) {
        int64_t axis = sp_ox_attr_i(n, "axis", n->opset < 13 ? 1 : -1);
        if (axis < 0) axis += x->nd;
        if (axis != x->nd - 1) return 0;
        return run_simple(r, n, FZ_NONE, n->in[0], n->out[0], -1, -1, 0.0f, dnnl_alg_kind_undef);
    }
    if (strcmp(t, "LayerNormalization") == 0) {
        int64_t axis = sp_ox_attr_i(n, "axis", -1);
        if (axis < 0) axis += x->nd;
        if (axis != x->nd - 1) return 0;
        return run_simple(r, n, FZ_LN, n->in[0], n->out[0], n->in[1], n->n_in > 2 ? n->in[2] : -1,
                          sp_ox_attr_f(n, "epsilon", 1e-5f), dnnl_alg_kind_undef);
    }
    bool tanh_form = strcmp(sp_ox_attr_s(n, "approximate", "none"), "tanh") == 0;
    return run_simple(r, n, FZ_GELU, n->in[0], n->out[0], -1, -1, 0.0f,
                      tanh_form ? dnnl_eltwise_gelu_tanh : dnnl_eltwise_gelu_erf);
}

int
sp_ox_dnnl_run(sp_ox_run_t *r, sp_ox_node_t *n, int32_t o)
{
    const char *t = n->op->name;
    fuse_t *f = &r->dnnl->fz[n - r->g->nodes];
    if (f->head >= 0) return r->dnnl->fz[f->head].ran ? 1 : 0; /* a chain member: done at its head */
    if (f->kind != FZ_NONE && f->ran) return 1; /* done by the MatMul before it (gelu_of) */
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] >= 0 && r->g->values[n->in[k]].t.data == NULL) return 0; /* ours reports it */
    }
    if (n->fused_add >= 0 && r->g->values[n->fused_add].t.data == NULL) return 0;
    r->node = n;
    if (r->dnnl->nodes[n - r->g->nodes].e == NULL) return 0;
    if (f->kind != FZ_NONE) {
        int rc = run_simple(r, n, f->kind, f->x, f->out, f->gamma, f->beta, f->eps, dnnl_eltwise_gelu_erf);
        f->ran = rc == 1;
        return rc;
    }
    if (strcmp(t, "Conv") == 0) return run_conv(r, n, o);
    if (strcmp(t, "Softmax") == 0 || strcmp(t, "LayerNormalization") == 0 || strcmp(t, "Gelu") == 0) {
        return run_native(r, n);
    }
    if (strcmp(t, "MaxPool") == 0) return run_pool(r, n, false, true);
    if (strcmp(t, "AveragePool") == 0) return run_pool(r, n, false, false);
    if (strcmp(t, "GlobalAveragePool") == 0) return run_pool(r, n, true, false);
    if (strcmp(t, "Gemm") == 0) return run_matmul(r, n, true);
    if (strcmp(t, "MatMul") == 0) return run_matmul(r, n, false);
    if (strcmp(t, "QDQConv") == 0) return run_q8(r, n, o, true);
    if (strcmp(t, "QLinearConv") == 0) return run_qlinear(r, n, true, true);
    if (strcmp(t, "ConvInteger") == 0) return run_qlinear(r, n, true, false);
    if (strcmp(t, "QLinearMatMul") == 0) return run_qlinear(r, n, false, true);
    if (strcmp(t, "MatMulInteger") == 0) return run_qlinear(r, n, false, false);
    if (strcmp(t, "QDQMatMul") == 0) return run_q8(r, n, o, false);
    return 0;
}

#else /* !SP_HAVE_DNNL: built without oneDNN, our own runtime only */

bool
sp_ox_dnnl_built(void)
{
    return false;
}

bool
sp_ox_dnnl_has_bf16(void)
{
    return false;
}

bool
sp_ox_dnnl_int8_vnni(void)
{
    return false;
}

int
sp_ox_dnnl_attach(sp_ox_run_t *r, bool bf16, int cache_cap, char *err, size_t err_len)
{
    (void)r;
    (void)bf16;
    snprintf(err, err_len, "this build has no oneDNN (libdnnl-dev was missing)");
    return -1;
}

void
sp_ox_dnnl_free(sp_ox_run_t *r)
{
    (void)r;
}

void
sp_ox_dnnl_begin(sp_ox_run_t *r)
{
    (void)r;
}

int
sp_ox_dnnl_run(sp_ox_run_t *r, sp_ox_node_t *n, int32_t o)
{
    (void)r;
    (void)n;
    (void)o;
    return 0;
}

int
sp_ox_dnnl_plain(sp_ox_run_t *r, int32_t v)
{
    (void)r;
    (void)v;
    return 0;
}

int
sp_ox_dnnl_plain_inputs(sp_ox_run_t *r, const sp_ox_node_t *n)
{
    (void)r;
    (void)n;
    return 0;
}

void
sp_ox_dnnl_get_stats(const sp_ox_run_t *r, sp_ox_dnnl_stats_t *s)
{
    (void)r;
    memset(s, 0, sizeof *s);
}

#endif
