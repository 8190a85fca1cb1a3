/*
 * backends/onnx/plan.c - the arena memory plan of a run.
 *
 * Activation sizes depend on the input shapes (the batch, a sequence length), so a plan is made
 * per set of input shapes, on its first run: that run takes its buffers from the pool as before
 * and records each value's bytes; then every activation gets an offset in one arena from its
 * liveness interval [the node computing it, the last node reading it] (graph outputs live to
 * the end of the run), by the "greedy by size" offset assignment of TFLite's arena planner
 * (Pisarchyk and Lee, "Efficient Memory Management for Deep Neural Net Inference", 2020):
 * values in decreasing size, each placed in the smallest gap between the already placed values
 * whose intervals overlap its own that fits it (best fit), else past the last of them. Values
 * whose intervals do not overlap may share bytes; values that are live together never do.
 * Later runs with those shapes hand each value its slot (sp_ox_out), so a run allocates nothing
 * for activations and their footprint is the plan's peak, not whatever the pool's best-fit
 * reuse happened to keep. Operator temporaries and the fed inputs stay in the pool.
 *
 * A value that asks for more bytes than its plan recorded (a data-dependent shape) or asks
 * twice in one run takes a pool buffer instead, so a plan is never wrong, only less useful.
 * Plans are kept per run context (OX_MAX_PLANS, least recently used replaced); the arena is
 * sized for the largest plan used and kept.
 *
 * Threads: a run context belongs to one instance. Memory: plans and the arena are freed by
 * sp_ox_run_free.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ox.h"

static bool
same_inputs(const sp_ox_graph_t *g, const sp_ox_plan_t *p)
{
    for (int32_t i = 0; i < g->n_inputs; i++) {
        const sp_ox_tensor_t *t = &g->values[g->inputs[i]].t;
        if (t->nd != p->nd[i] || memcmp(t->dims, p->dims[i], (size_t)t->nd * sizeof t->dims[0]) != 0) {
            return false;
        }
    }
    return true;
}

/* A signature of the values kept to the end of a run: a caller that marks more of them
 * (optimize.c's calibration keeps activations) gets new plans. */
static uint64_t
outs_sig(const sp_ox_graph_t *g)
{
    uint64_t h = 0;
    for (int32_t v = 0; v < g->n_values; v++) {
        if (g->values[v].is_output) h = (h ^ (uint64_t)(v + 1)) * 0x100000001b3ull;
    }
    return h;
}

static void
rec_free(sp_ox_run_t *r)
{
    free(r->rec);
    free(r->rec_first);
    free(r->rec_alias);
    r->rec = NULL;
    r->rec_first = r->rec_alias = NULL;
}

bool
sp_ox_plan_take(sp_ox_run_t *r, int32_t from, int32_t to)
{
    if (r->rec) {
        r->rec_alias[to] = from + 1;
        return true;
    }
    if (r->plan) return r->plan->alias[to] == from + 1;
    return true;
}

void
sp_ox_plan_begin(sp_ox_run_t *r)
{
    sp_ox_graph_t *g = r->g;
    r->runs++;
    r->plan = NULL;
    r->rec = NULL;
    if (r->no_arena) return;
    if (r->handed == NULL) {
        r->handed = calloc((size_t)g->n_values + 1, sizeof *r->handed);
        if (r->handed == NULL) return; /* the pool alone still works */
    }
    sp_ox_plan_t *p = NULL;
    uint64_t sig = outs_sig(g);
    for (int32_t i = 0; i < r->n_plans && p == NULL; i++) {
        if (r->plans[i].outs_sig == sig && same_inputs(g, &r->plans[i])) p = &r->plans[i];
    }
    if (p == NULL) {
        /* all three or none: a run without a plan */
        r->rec = calloc((size_t)g->n_values + 1, sizeof *r->rec);
        r->rec_first = calloc((size_t)g->n_values + 1, sizeof *r->rec_first);
        r->rec_alias = calloc((size_t)g->n_values + 1, sizeof *r->rec_alias);
        if (r->rec == NULL || r->rec_first == NULL || r->rec_alias == NULL) rec_free(r);
        return;
    }
    if (r->trim_pool) {
        /* The pool's buffers of the recording runs are the arena's job now (inputs and
         * temporaries take from the pool again, and keep what they need); freed before the
         * arena grows, so that both are not held at once. */
        for (int32_t i = 0; i < r->n_free; i++) free(r->free_bufs[i].data);
        r->n_free = 0;
        r->trim_pool = false;
    }
    if (r->arena_cap < p->peak) {
        free(r->arena);
        r->arena = sp_ox_aligned_alloc(p->peak);
        r->arena_cap = r->arena ? p->peak : 0;
        if (r->arena == NULL) return;
    }
    p->used = r->runs;
    r->plan = p;
}

typedef struct item {
    int32_t v;
    int32_t first, last; /* liveness interval in order[], inclusive */
    size_t size, off;
} item_t;

static int
by_size_desc(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->first - y->first;
}

/* Offsets for items (sorted by size, largest first): greedy by size, best-fitting gap. Returns
 * the peak. placed: scratch for n indices, kept sorted by offset. */
static size_t
assign(item_t *it, int32_t n, int32_t *placed)
{
    int32_t n_placed = 0;
    size_t peak = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t prev = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
        for (int32_t k = 0; k < n_placed; k++) {
            const item_t *q = &it[placed[k]];
            if (q->last < it[i].first || q->first > it[i].last) continue; /* never live together */
            if (q->off > prev && q->off - prev >= it[i].size && q->off - prev < best_gap) {
                best = prev;
                best_gap = q->off - prev;
            }
            if (q->off + q->size > prev) prev = q->off + q->size;
        }
        it[i].off = best != SIZE_MAX ? best : prev;
        if (it[i].off + it[i].size > peak) peak = it[i].off + it[i].size;
        int32_t at = n_placed;
        while (at > 0 && it[placed[at - 1]].off > it[i].off) {
            placed[at] = placed[at - 1];
            at--;
        }
        placed[at] = i;
        n_placed++;
    }
    return peak;
}

/* The plan of the sizes a run recorded (rec), into a free slot or the least recently used. */
static void
make_plan(sp_ox_run_t *r)
{
    sp_ox_graph_t *g = r->g;
    int32_t nv = g->n_values, n = 0;
    item_t *it = malloc(((size_t)nv + 1) * sizeof *it);
    int32_t *placed = malloc(((size_t)nv + 1) * sizeof *placed);
    size_t *off = calloc((size_t)nv + 1, sizeof *off), *size = calloc((size_t)nv + 1, sizeof *size);
    int32_t *alias = calloc((size_t)nv + 1, sizeof *alias), *root = malloc(((size_t)nv + 1) * sizeof *root);
    int32_t *last = malloc(((size_t)nv + 1) * sizeof *last);
    if (it == NULL || placed == NULL || off == NULL || size == NULL || alias == NULL || root == NULL ||
        last == NULL) {
        goto done;
    }
    /* A value whose buffer another value took over (oneDNN's convolution accumulating into its
     * residual) keeps its slot until the last of them is read: chains (ResNet's identity
     * shortcuts pass one buffer down several blocks) end at the first value of the chain. */
    for (int32_t v = 0; v < nv; v++) {
        const sp_ox_value_t *val = &g->values[v];
        root[v] = v;
        last[v] = val->is_output ? g->n_order : val->last_use;
    }
    int n_shared = 0;
    for (int32_t o = 0; o < g->n_order; o++) {
        const sp_ox_node_t *nd = &g->nodes[g->order[o]];
        for (int k = 0; k < nd->n_out; k++) {
            int32_t v = nd->out[k];
            if (r->rec_alias[v] == 0) continue;
            alias[v] = r->rec_alias[v];
            n_shared++;
            int32_t from = root[r->rec_alias[v] - 1];
            root[v] = from;
            if (last[v] > last[from]) last[from] = last[v];
        }
    }
    size_t sum = 0;
    for (int32_t v = 0; v < nv; v++) {
        const sp_ox_value_t *val = &g->values[v];
        if (r->rec[v] == 0 || val->is_const || val->is_input || val->def < 0) continue;
        size_t b = (r->rec[v] + 63) / 64 * 64;
        /* from the first buffer it got (a fused group's head writes the group's last value
         * before the last member's turn) to its last reader */
        int32_t first = r->rec_first[v] > 0 && r->rec_first[v] - 1 < val->def ? r->rec_first[v] - 1 : val->def;
        it[n] = (item_t){v, first, last[v], b, 0};
        if (it[n].last < it[n].first) it[n].last = it[n].first;
        sum += b;
        n++;
    }
    qsort(it, (size_t)n, sizeof *it, by_size_desc);
    size_t peak = assign(it, n, placed);
    for (int32_t i = 0; i < n; i++) {
        off[it[i].v] = it[i].off;
        size[it[i].v] = it[i].size;
    }
    size_t pool = 0;
    for (int32_t i = 0; i < r->n_free; i++) pool += r->free_bufs[i].cap;
    for (int32_t v = 0; v < nv; v++) {
        if (!g->values[v].is_const && g->values[v].t.data) pool += g->values[v].t.cap;
    }
    sp_ox_plan_t *p = NULL;
    if (r->n_plans < OX_MAX_PLANS) {
        p = &r->plans[r->n_plans++];
    } else {
        p = &r->plans[0];
        for (int32_t i = 1; i < r->n_plans; i++) {
            if (r->plans[i].used < p->used) p = &r->plans[i];
        }
        free(p->off);
        free(p->size);
        free(p->alias);
    }
    memset(p, 0, sizeof *p);
    for (int32_t i = 0; i < g->n_inputs; i++) {
        const sp_ox_tensor_t *t = &g->values[g->inputs[i]].t;
        p->nd[i] = t->nd;
        memcpy(p->dims[i], t->dims, (size_t)t->nd * sizeof t->dims[0]);
    }
    p->off = off;
    p->size = size;
    p->alias = alias;
    p->n_shared = n_shared;
    p->peak = peak;
    p->sum = sum;
    p->pool = pool;
    p->used = r->runs;
    p->outs_sig = outs_sig(g);
    off = size = NULL;
    alias = NULL;
    r->trim_pool = true;
    r->plans_made++;
    r->last_made = p;
done:
    free(it);
    free(placed);
    free(off);
    free(size);
    free(alias);
    free(root);
    free(last);
}

void
sp_ox_plan_end(sp_ox_run_t *r, bool ok)
{
    if (r->rec && ok) make_plan(r);
    rec_free(r);
    r->plan = NULL;
}
