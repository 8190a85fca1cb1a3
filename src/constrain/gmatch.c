/*
 * gmatch.c - the matcher of a compiled grammar (grammar.h: sp_gmatch_*): feeds
 * bytes through the pushdown automaton grammar.c builds.
 *
 * Matching. A parse stack is a chain of nodes (element position, parent
 * node); nodes are hash-consed, so two equal stacks are one node id. A state
 * is the set of stack tops that wait for a byte (each top's element is a
 * BYTES) plus an "accepting" flag (some stack was fully popped), interned in
 * a table, so equal states are one id. Feeding byte c to a state advances
 * every top whose set holds c and expands the result with an explicit work
 * list (pop at END, push every alternative at REF) until each stack again
 * waits on a BYTES; the (state, byte class) -> state result is cached (bytes
 * no set of the grammar tells apart are one class: grammar_impl.h). Inside a
 * loop (a string's characters, a run of digits) the state after a byte is
 * the state before it, so after the first few steps a walk over the
 * vocabulary costs a cache look-up per distinct prefix. All tables have hard
 * caps: a feed that would pass one answers DEAD (the token is masked, never
 * wrongly allowed) and sp_gmatch_maintain rebuilds the tables around the
 * current state between steps.
 *
 * Threads: a matcher belongs to one sequence and one thread at a time; the
 * grammar it holds a reference to is shared read-only. Memory: every table is
 * owned by the matcher, grows up to its hard cap and is freed by
 * sp_gmatch_destroy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "constrain/grammar_impl.h"

/* ---- the matcher --------------------------------------------------------- */

#define NONE UINT32_MAX
#define NODE_SOFT (1u << 16)
#define NODE_HARD (1u << 20)
#define STATE_SOFT (1u << 13)
#define STATE_HARD (1u << 16)
#define TOPS_HARD (1u << 22)   /* stack tops over all states */
#define TRANS_SOFT (1u << 17)
#define TRANS_HARD (1u << 20)
#define MAX_TOPS 4096          /* stacks alive in one state */
#define MAX_WORK (1u << 15)    /* pending expansion items; steps in one feed: 8x */
#define MASK_SLOTS 8

typedef struct gnode {
    uint32_t pos, parent;
    uint32_t next;  /* hash chain */
    uint32_t mark;  /* epoch of the last feed that reached it */
    uint32_t tail;  /* fewest bytes after this element's alternative ends, up the stack */
    uint32_t smark; /* state_get's epoch: this node is a top of the set being interned */
} gnode_t;

typedef struct gst {
    uint32_t off, n; /* tops[off .. off + n) */
    uint32_t next;   /* hash chain */
    uint32_t cost;
    uint32_t hash;
    uint8_t accept;
    uint64_t live[4]; /* bytes some top takes: any other byte is DEAD without a scan */
} gst_t;

typedef struct gtrans {
    uint64_t key;    /* (state << 8 | byte class) + 1; 0 = empty */
    uint32_t to;
} gtrans_t;

typedef struct mask_slot {
    uint32_t state;
    uint32_t max_cost;
    int32_t n_bits;
    uint64_t *bits;
} mask_slot_t;

struct sp_gmatch {
    sp_grammar_t *g;
    gnode_t *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *node_head;   /* buckets, power of two */
    uint32_t node_buckets;
    gst_t *states;
    uint32_t n_states, cap_states;
    uint32_t *state_head;
    uint32_t state_buckets;
    uint32_t *tops;
    uint32_t n_tops, cap_tops;
    gtrans_t *trans;
    uint32_t n_trans, trans_cap; /* power of two */
    uint32_t epoch;
    uint32_t sepoch;       /* state_get's marks (gnode_t.smark) */
    uint32_t cur;          /* the current state */
    bool full;             /* a table hit its hard cap: maintain rebuilds */
    uint32_t live_nodes;   /* nodes right after the last rebuild (the current stacks) */
    /* feed scratch */
    uint32_t *work_pos, *work_par;
    uint32_t *new_tops;
    mask_slot_t masks[MASK_SLOTS];
    int mask_next;
};

static inline uint32_t
hash2(uint32_t a, uint32_t b)
{
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32) ^ (uint32_t)x;
}

static bool
grow(void **p, uint32_t *cap, uint32_t need, size_t elem, uint32_t hard)
{
    if (need <= *cap) {
        return true;
    }
    if (need > hard) {
        return false;
    }
    uint32_t c = *cap ? *cap : 256;
    while (c < need) {
        c *= 2;
    }
    c = c > hard ? hard : c;
    void *np = sp_realloc(*p, (size_t)c * elem);
    if (np == NULL) {
        return false;
    }
    *p = np;
    *cap = c;
    return true;
}

static bool
rehash_nodes(sp_gmatch_t *m, uint32_t buckets)
{
    uint32_t *h = sp_malloc((size_t)buckets * sizeof(uint32_t));
    if (h == NULL) {
        return false;
    }
    memset(h, 0xFF, (size_t)buckets * sizeof(uint32_t));
    for (uint32_t i = 0; i < m->n_nodes; i++) {
        uint32_t k = hash2(m->nodes[i].pos, m->nodes[i].parent) & (buckets - 1);
        m->nodes[i].next = h[k];
        h[k] = i;
    }
    sp_free(m->node_head);
    m->node_head = h;
    m->node_buckets = buckets;
    return true;
}

/* The node (pos, parent), created when new; NONE when a table is full. */
static uint32_t
node_get(sp_gmatch_t *m, uint32_t pos, uint32_t parent)
{
    uint32_t k = hash2(pos, parent) & (m->node_buckets - 1);
    for (uint32_t i = m->node_head[k]; i != NONE; i = m->nodes[i].next) {
        if (m->nodes[i].pos == pos && m->nodes[i].parent == parent) {
            return i;
        }
    }
    if (!grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof(gnode_t), NODE_HARD)) {
        m->full = true;
        return NONE;
    }
    if (m->n_nodes + 1 > m->node_buckets) {
        if (!rehash_nodes(m, m->node_buckets * 2)) {
            m->full = true;
            return NONE;
        }
        k = hash2(pos, parent) & (m->node_buckets - 1);
    }
    uint32_t id = m->n_nodes++;
    gnode_t *n = &m->nodes[id];
    n->pos = pos;
    n->parent = parent;
    n->mark = 0;
    n->smark = 0;
    n->tail = sat_add(m->g->rest[pos + 1], parent == NONE ? 0 : m->nodes[parent].tail);
    n->next = m->node_head[k];
    m->node_head[k] = id;
    return id;
}

/*
 * The interned state (the set tops[0..n), accept); NONE when a table is full.
 * A set, not a sequence: the hash is order-free (a sum) and equality marks
 * the new set's nodes, so an ambiguous grammar's states of thousands of tops
 * (a bounded repetition of variable-length items: every item position at
 * once) cost a pass, not a sort. Duplicates in tops[] are dropped in place.
 */
static uint32_t
state_get(sp_gmatch_t *m, uint32_t *tops, uint32_t n, bool accept)
{
    if (++m->sepoch == 0) { /* wrapped: clear the marks */
        for (uint32_t i = 0; i < m->n_nodes; i++) {
            m->nodes[i].smark = 0;
        }
        m->sepoch = 1;
    }
    uint32_t h = accept ? 0x9E3779B9u : 0, u = 0;
    for (uint32_t i = 0; i < n; i++) {
        gnode_t *t = &m->nodes[tops[i]];
        if (t->smark != m->sepoch) {
            t->smark = m->sepoch;
            h += hash2(tops[i], 0x85EBCA6Bu);
            tops[u++] = tops[i];
        }
    }
    n = u;
    uint32_t k = h & (m->state_buckets - 1);
    for (uint32_t i = m->state_head[k]; i != NONE; i = m->states[i].next) {
        const gst_t *s = &m->states[i];
        if (s->hash != h || s->n != n || s->accept != accept) {
            continue;
        }
        uint32_t j = 0;
        while (j < n && m->nodes[m->tops[s->off + j]].smark == m->sepoch) {
            j++;
        }
        if (j == n) { /* n distinct members, all in the new set: equal sets */
            return i;
        }
    }
    if (m->n_states >= m->state_buckets ||
        !grow((void **)&m->states, &m->cap_states, m->n_states + 1, sizeof(gst_t), STATE_HARD) ||
        !grow((void **)&m->tops, &m->cap_tops, m->n_tops + n + 1, sizeof(uint32_t), TOPS_HARD)) {
        m->full = true;
        return NONE;
    }
    uint32_t id = m->n_states++;
    gst_t *s = &m->states[id];
    s->off = m->n_tops;
    s->n = n;
    s->accept = accept;
    s->hash = h;
    memcpy(m->tops + m->n_tops, tops, (size_t)n * sizeof(uint32_t));
    m->n_tops += n;
    uint32_t cost = accept ? 0 : LEN_INF;
    memset(s->live, 0, sizeof s->live);
    for (uint32_t i = 0; i < n; i++) {
        const gnode_t *t = &m->nodes[tops[i]];
        uint32_t c = sat_add(1, t->tail);
        cost = c < cost ? c : cost;
        const bset_t *set = &m->g->sets[E_ARG(m->g->elems[t->pos])];
        for (int w = 0; w < 4; w++) {
            s->live[w] |= set->w[w];
        }
    }
    s->cost = cost;
    s->next = m->state_head[k];
    m->state_head[k] = id;
    return id;
}

/*
 * Expand the work items (stack positions that may be END or REF) until every
 * stack waits on a BYTES element; collect those tops. Returns false when a
 * limit was hit (the caller treats the feed as refused).
 */
static bool
expand(sp_gmatch_t *m, uint32_t n_work, uint32_t *n_tops, bool *accept)
{
    const sp_grammar_t *g = m->g;
    uint32_t steps = 0;
    while (n_work > 0) {
        if (++steps > 8 * MAX_WORK) {
            m->full = true;
            return false;
        }
        n_work--;
        uint32_t pos = m->work_pos[n_work], parent = m->work_par[n_work];
        for (;;) {
            uint32_t e = g->elems[pos];
            if (e == E_END) {
                if (parent == NONE) {
                    *accept = true;
                    break;
                }
                pos = m->nodes[parent].pos + 1;
                parent = m->nodes[parent].parent;
                continue;
            }
            uint32_t id = node_get(m, pos, parent);
            if (id == NONE) {
                return false;
            }
            if (m->nodes[id].mark == m->epoch) {
                break; /* reached already in this feed */
            }
            m->nodes[id].mark = m->epoch;
            if (E_KIND(e) == K_BYTES) {
                if (*n_tops >= MAX_TOPS) {
                    m->full = true;
                    return false;
                }
                m->new_tops[(*n_tops)++] = id;
                break;
            }
            /* A REF at the end of its alternative returns straight to our
             * parent: the children skip this frame (a tail call), so right
             * recursion (x*, h ::= x h) keeps the stack flat and the state
             * after another repetition is the state before it. */
            uint32_t r = E_ARG(e), frame = g->elems[pos + 1] == E_END ? parent : id;
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                if (n_work >= MAX_WORK) {
                    m->full = true;
                    return false;
                }
                m->work_pos[n_work] = g->alt_start[a];
                m->work_par[n_work] = frame;
                n_work++;
            }
            break;
        }
    }
    return true;
}

static uint32_t
trans_find(const sp_gmatch_t *m, uint64_t key, uint32_t *slot)
{
    uint32_t mask = m->trans_cap - 1;
    uint32_t i = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & mask;
    while (m->trans[i].key != 0) {
        if (m->trans[i].key == key) {
            *slot = i;
            return m->trans[i].to;
        }
        i = (i + 1) & mask;
    }
    *slot = i;
    return NONE - 1; /* not cached */
}

static void
trans_put(sp_gmatch_t *m, uint64_t key, uint32_t slot, uint32_t to)
{
    if ((m->n_trans + 1) * 2 > m->trans_cap) {
        if (m->trans_cap >= TRANS_HARD) {
            return; /* uncached; still correct */
        }
        uint32_t cap = m->trans_cap * 2;
        gtrans_t *nt = sp_calloc(cap, sizeof(gtrans_t));
        if (nt == NULL) {
            return;
        }
        for (uint32_t i = 0; i < m->trans_cap; i++) {
            if (m->trans[i].key) {
                uint32_t j = (uint32_t)((m->trans[i].key * 0x9E3779B97F4A7C15ull) >> 40) & (cap - 1);
                while (nt[j].key) {
                    j = (j + 1) & (cap - 1);
                }
                nt[j] = m->trans[i];
            }
        }
        sp_free(m->trans);
        m->trans = nt;
        m->trans_cap = cap;
        trans_find(m, key, &slot);
    }
    m->trans[slot].key = key;
    m->trans[slot].to = to;
    m->n_trans++;
}

sp_gstate_t
sp_gmatch_feed(sp_gmatch_t *m, sp_gstate_t s, unsigned c)
{
    if (s == SP_GSTATE_DEAD || s >= m->n_states) {
        return SP_GSTATE_DEAD;
    }
    c &= 0xFF;
    if (!((m->states[s].live[c >> 6] >> (c & 63)) & 1u)) {
        return SP_GSTATE_DEAD; /* no top takes c */
    }
    uint64_t key = ((uint64_t)s << 8 | m->g->byte_class[c]) + 1;
    uint32_t slot;
    uint32_t to = trans_find(m, key, &slot);
    if (to != NONE - 1) {
        return to;
    }
    const sp_grammar_t *g = m->g;
    if (++m->epoch == 0) { /* wrapped: clear the marks */
        for (uint32_t i = 0; i < m->n_nodes; i++) {
            m->nodes[i].mark = 0;
        }
        m->epoch = 1;
    }
    uint32_t n_work = 0;
    const gst_t *st = &m->states[s];
    for (uint32_t i = 0; i < st->n; i++) {
        const gnode_t *t = &m->nodes[m->tops[st->off + i]];
        if (bset_has(&g->sets[E_ARG(g->elems[t->pos])], c & 0xFF)) {
            m->work_pos[n_work] = t->pos + 1;
            m->work_par[n_work] = t->parent;
            n_work++;
        }
    }
    if (n_work == 0) {
        trans_put(m, key, slot, SP_GSTATE_DEAD);
        return SP_GSTATE_DEAD;
    }
    uint32_t n_tops = 0;
    bool accept = false;
    if (!expand(m, n_work, &n_tops, &accept)) {
        return SP_GSTATE_DEAD; /* a limit, not the grammar: not cached */
    }
    to = n_tops == 0 && !accept ? SP_GSTATE_DEAD : state_get(m, m->new_tops, n_tops, accept);
    if (to == NONE) {
        return SP_GSTATE_DEAD;
    }
    trans_find(m, key, &slot); /* the tables may have moved */
    trans_put(m, key, slot, to);
    return to;
}

static void
mask_clear(sp_gmatch_t *m)
{
    for (int i = 0; i < MASK_SLOTS; i++) {
        m->masks[i].state = NONE;
    }
}

/* Empty tables; false when out of memory. */
static bool
tables_reset(sp_gmatch_t *m)
{
    m->n_nodes = m->n_states = m->n_tops = m->n_trans = 0;
    m->full = false;
    mask_clear(m);
    if (m->node_buckets != 4096 && !rehash_nodes(m, 4096)) {
        return false;
    }
    memset(m->node_head, 0xFF, (size_t)m->node_buckets * sizeof(uint32_t));
    if (m->trans_cap != 4096) {
        sp_free(m->trans);
        m->trans = sp_calloc(4096, sizeof(gtrans_t));
        m->trans_cap = m->trans ? 4096 : 0;
        if (m->trans == NULL) {
            return false;
        }
    } else {
        memset(m->trans, 0, (size_t)m->trans_cap * sizeof(gtrans_t));
    }
    memset(m->state_head, 0xFF, (size_t)m->state_buckets * sizeof(uint32_t));
    return true;
}

sp_status_t
sp_gmatch_create(sp_grammar_t *g, sp_gmatch_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_gmatch_t *m = sp_calloc(1, sizeof *m);
    if (m == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
    }
    m->g = g;
    sp_grammar_retain(g);
    m->state_buckets = STATE_HARD;
    m->state_head = sp_malloc((size_t)m->state_buckets * sizeof(uint32_t));
    m->work_pos = sp_malloc(MAX_WORK * sizeof(uint32_t));
    m->work_par = sp_malloc(MAX_WORK * sizeof(uint32_t));
    m->new_tops = sp_malloc(MAX_TOPS * sizeof(uint32_t));
    if (!m->state_head || !m->work_pos || !m->work_par || !m->new_tops || !tables_reset(m)) {
        sp_gmatch_destroy(m);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
    }
    m->epoch = 1;
    uint32_t n_work = 0;
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        m->work_pos[n_work] = g->alt_start[a];
        m->work_par[n_work] = NONE;
        n_work++;
    }
    uint32_t n_tops = 0;
    bool accept = false;
    if (!expand(m, n_work, &n_tops, &accept) ||
        (m->cur = state_get(m, m->new_tops, n_tops, accept)) == NONE) {
        sp_gmatch_destroy(m);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "grammar: the start state exceeds the "
                       "matcher's limits (%u stacks)", MAX_TOPS);
    }
    *out = m;
    return SP_OK;
}

void
sp_gmatch_destroy(sp_gmatch_t *m)
{
    if (m == NULL) {
        return;
    }
    for (int i = 0; i < MASK_SLOTS; i++) {
        sp_free(m->masks[i].bits);
    }
    sp_free(m->nodes);
    sp_free(m->node_head);
    sp_free(m->states);
    sp_free(m->state_head);
    sp_free(m->tops);
    sp_free(m->trans);
    sp_free(m->work_pos);
    sp_free(m->work_par);
    sp_free(m->new_tops);
    sp_grammar_release(m->g);
    sp_free(m);
}

sp_gstate_t
sp_gmatch_state(const sp_gmatch_t *m)
{
    return m->cur;
}

bool
sp_gmatch_accepting(const sp_gmatch_t *m, sp_gstate_t s)
{
    return s != SP_GSTATE_DEAD && s < m->n_states && m->states[s].accept;
}

bool
sp_gmatch_can_continue(const sp_gmatch_t *m, sp_gstate_t s)
{
    return s != SP_GSTATE_DEAD && s < m->n_states && m->states[s].n > 0;
}

uint32_t
sp_gmatch_cost(const sp_gmatch_t *m, sp_gstate_t s)
{
    return s == SP_GSTATE_DEAD || s >= m->n_states ? LEN_INF : m->states[s].cost;
}

/*
 * Rebuild the tables around the current state: copy its stacks out as chains
 * of positions, empty everything, re-intern the chains bottom-up.
 */
static bool
compact(sp_gmatch_t *m)
{
    const gst_t *cs = &m->states[m->cur];
    uint32_t n = cs->n;
    bool accept = cs->accept;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t x = m->tops[cs->off + i]; x != NONE; x = m->nodes[x].parent) {
            total++;
        }
    }
    uint32_t *chains = sp_malloc((total + n + 1) * sizeof(uint32_t));
    if (chains == NULL) {
        return false;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t start = k++;
        for (uint32_t x = m->tops[cs->off + i]; x != NONE; x = m->nodes[x].parent) {
            chains[k++] = m->nodes[x].pos;
        }
        chains[start] = (uint32_t)(k - start - 1); /* chain length, then top .. bottom */
    }
    if (!tables_reset(m)) {
        sp_free(chains);
        return false;
    }
    k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = chains[k], id = NONE;
        for (uint32_t j = len; j >= 1; j--) {
            id = node_get(m, chains[k + j], id);
        }
        m->new_tops[i] = id;
        k += len + 1;
    }
    sp_free(chains);
    m->live_nodes = m->n_nodes;
    m->cur = state_get(m, m->new_tops, n, accept);
    return m->cur != NONE;
}

bool
sp_gmatch_overflowed(const sp_gmatch_t *m)
{
    return m->full;
}

bool
sp_gmatch_maintain(sp_gmatch_t *m)
{
    /* Deep stacks are live data: rebuild only when the tables doubled past
     * them, so a long nesting costs amortised O(1) per byte. */
    uint32_t node_soft = NODE_SOFT > 2 * m->live_nodes ? NODE_SOFT : 2 * m->live_nodes;
    if (!m->full && m->n_nodes < node_soft && m->n_states < STATE_SOFT &&
        m->n_trans < TRANS_SOFT && m->n_tops < TOPS_HARD / 4) {
        return false;
    }
    return compact(m);
}

bool
sp_gmatch_commit(sp_gmatch_t *m, const void *p, size_t n)
{
    const unsigned char *b = p;
    sp_gstate_t s = m->cur;
    for (size_t i = 0; i < n && s != SP_GSTATE_DEAD; i++) {
        s = sp_gmatch_feed(m, s, b[i]);
        if (s == SP_GSTATE_DEAD && m->full) {
            /* a table filled up on the way: make room around the start, retry once */
            m->full = false;
            if (!compact(m)) {
                return false;
            }
            s = m->cur;
            for (size_t j = 0; j < n && s != SP_GSTATE_DEAD; j++) {
                s = sp_gmatch_feed(m, s, b[j]);
            }
            break;
        }
    }
    if (s == SP_GSTATE_DEAD) {
        return false;
    }
    m->cur = s;
    return true;
}

const uint64_t *
sp_gmatch_mask_get(sp_gmatch_t *m, sp_gstate_t s, int32_t n_bits, uint32_t *max_cost)
{
    for (int i = 0; i < MASK_SLOTS; i++) {
        if (m->masks[i].state == s && m->masks[i].n_bits == n_bits && m->masks[i].bits) {
            *max_cost = m->masks[i].max_cost;
            return m->masks[i].bits;
        }
    }
    return NULL;
}

uint64_t *
sp_gmatch_mask_put(sp_gmatch_t *m, sp_gstate_t s, int32_t n_bits, uint32_t max_cost)
{
    mask_slot_t *sl = &m->masks[m->mask_next];
    m->mask_next = (m->mask_next + 1) % MASK_SLOTS;
    size_t words = ((size_t)n_bits + 63) / 64;
    if (sl->bits == NULL || sl->n_bits != n_bits) {
        sp_free(sl->bits);
        sl->bits = sp_malloc(words * sizeof(uint64_t) + 8);
        if (sl->bits == NULL) {
            sl->state = NONE;
            return NULL;
        }
    }
    memset(sl->bits, 0, words * sizeof(uint64_t));
    sl->state = s;
    sl->max_cost = max_cost;
    sl->n_bits = n_bits;
    return sl->bits;
}

size_t
sp_gmatch_bytes(const sp_gmatch_t *m)
{
    size_t b = sizeof *m + (size_t)m->cap_nodes * sizeof(gnode_t) +
               (size_t)m->node_buckets * 4 + (size_t)m->cap_states * sizeof(gst_t) +
               (size_t)m->state_buckets * 4 + (size_t)m->cap_tops * 4 +
               (size_t)m->trans_cap * sizeof(gtrans_t) + 2 * (size_t)MAX_WORK * 4 + MAX_TOPS * 4;
    for (int i = 0; i < MASK_SLOTS; i++) {
        b += m->masks[i].bits ? ((size_t)m->masks[i].n_bits + 63) / 64 * 8 : 0;
    }
    return b;
}

int
sp_gmatch_match(const sp_grammar_t *g, const char *text, size_t len)
{
    sp_gmatch_t *m;
    if (sp_gmatch_create((sp_grammar_t *)g, &m, NULL, 0) != SP_OK) {
        return -1;
    }
    int rc = 1;
    for (size_t i = 0; i < len; i++) {
        sp_gmatch_maintain(m);
        if (!sp_gmatch_commit(m, text + i, 1)) {
            rc = m->full ? -1 : 0;
            break;
        }
    }
    if (rc == 1) {
        rc = sp_gmatch_accepting(m, m->cur) ? 1 : 0;
    }
    sp_gmatch_destroy(m);
    return rc;
}
