/*
 * grammar.c - GBNF compiled to a byte-level pushdown automaton, and its
 * matcher (grammar.h has the contract; docs/structured-output.md the design).
 *
 * Compiled form. Every rule is a list of alternatives, every alternative a
 * sequence of elements ending in END. An element is one of
 *   BYTES(set)  one byte from a 256-bit set,
 *   REF(rule)   a sentence of another rule,
 *   END         the end of the alternative.
 * String literals become one BYTES per UTF-8 byte. A character class over
 * code points becomes the UTF-8 byte-range sequences that encode it (the
 * classic split at the 1/2/3/4-byte boundaries and at 64-aligned blocks), the
 * sequences that differ only in their first byte merged into one set; a
 * class that is one byte wide stays one BYTES element, others become a
 * helper rule. Groups become helper rules; `x{m,n}` is x m times and then
 * n - m nested optional helpers (`x*` one right-recursive helper), so the
 * automaton never needs counters. Limits on source size, elements, rules,
 * nesting and repeat counts bound compile time and memory.
 *
 * Compile-time checks: undefined and duplicate rules, left recursion (which
 * would make expansion loop; found by an iterative depth-first search over
 * "can start with" edges), and rules that can never end (their shortest
 * sentence, found by Knuth's generalisation of Dijkstra's algorithm, is
 * infinite). The shortest sentence of every rule also gives, for every
 * element, the fewest bytes that finish its alternative, which gives the
 * fewest bytes that finish any parse stack: the generation uses it to close
 * the output before max_tokens.
 *
 * Matching. A parse stack is a chain of nodes (element position, parent
 * node); nodes are hash-consed, so two equal stacks are one node id. A state
 * is the set of stack tops that wait for a byte (each top's element is a
 * BYTES) plus an "accepting" flag (some stack was fully popped), interned in
 * a table, so equal states are one id. Feeding byte c to a state advances
 * every top whose set holds c and expands the result with an explicit work
 * list (pop at END, push every alternative at REF) until each stack again
 * waits on a BYTES; the (state, byte) -> state result is cached. Inside a
 * loop (a string's characters, a run of digits) the state after a byte is
 * the state before it, so after the first few steps a walk over the
 * vocabulary costs a cache look-up per distinct prefix. All tables have hard
 * caps: a feed that would pass one answers DEAD (the token is masked, never
 * wrongly allowed) and sp_gmatch_maintain rebuilds the tables around the
 * current state between steps.
 */
#include "constrain/grammar.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* ---- elements ------------------------------------------------------------ */

#define E_END 0u
#define E_KIND(e) ((e) >> 30)
#define E_ARG(e) ((e) & 0x3FFFFFFFu)
#define K_BYTES 1u
#define K_REF 2u
#define E_BYTES(set) (K_BYTES << 30 | (uint32_t)(set))
#define E_REF(rule) (K_REF << 30 | (uint32_t)(rule))
#define LEN_INF (1u << 30) /* "never ends"; sums saturate here */

#define MAX_CLASS_RANGES 1024

typedef struct bset {
    uint64_t w[4];
} bset_t;

static inline bool
bset_has(const bset_t *s, unsigned c)
{
    return (s->w[c >> 6] >> (c & 63)) & 1u;
}

static inline void
bset_add_range(bset_t *s, unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi; c++) {
        s->w[c >> 6] |= 1ull << (c & 63);
    }
}

struct sp_grammar {
    _Atomic int refs;
    uint32_t *elems;     /* (n_elems) every alternative, END-terminated, rule after rule */
    uint32_t n_elems;
    uint32_t *alt_start; /* (n_alts) element index of each alternative */
    uint32_t *rule_alt;  /* (n_rules + 1) alternatives of rule r: rule_alt[r] .. rule_alt[r+1] */
    uint32_t n_rules, n_alts;
    uint32_t *rest;      /* (n_elems) fewest bytes from this element to its END */
    bset_t *sets;
    uint32_t n_sets;
    uint32_t root;
    size_t bytes;
};

static inline uint32_t
sat_add(uint32_t a, uint32_t b)
{
    uint64_t s = (uint64_t)a + b;
    return s >= LEN_INF ? LEN_INF : (uint32_t)s;
}

/* ---- the builder --------------------------------------------------------- */

typedef struct rbuild {
    uint32_t *e;  /* elements, alternatives END-terminated */
    uint32_t n, cap;
    char *name;   /* NUL-terminated; helper rules get "parent_N" */
    bool defined;
} rbuild_t;

typedef struct builder {
    rbuild_t *rules;
    uint32_t n_rules, cap_rules;
    bset_t *sets;
    uint32_t n_sets, cap_sets;
    uint32_t *set_hash; /* open addressing: set index + 1, 0 = empty */
    uint32_t *name_hash; /* (NAME_SLOTS) named rules: id + 1, 0 = empty */
    uint32_t set_hash_cap;
    uint64_t n_elems;   /* all rules together */
    const char *src, *p, *end;
    char *err;
    size_t err_len;
    sp_status_t st;
    int depth;
} builder_t;

static void
where(const builder_t *b, const char *at, int *line, int *col)
{
    *line = 1, *col = 1;
    for (const char *q = b->src; q < at && q < b->end; q++) {
        if (*q == '\n') {
            (*line)++, *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* Record the first error (later ones are consequences). */
#define BFAIL(b, status, ...)                                                   \
    do {                                                                        \
        if ((b)->st == SP_OK) {                                                 \
            (b)->st = sp_errf((b)->err, (b)->err_len, status, __VA_ARGS__);     \
        }                                                                       \
    } while (0)

static void
syntax(builder_t *b, const char *msg)
{
    int line, col;
    where(b, b->p, &line, &col);
    BFAIL(b, SP_ERR_INVALID, "grammar: line %d column %d: %s", line, col, msg);
}

static bool
push_elem(builder_t *b, uint32_t r, uint32_t e)
{
    if (b->st != SP_OK) {
        return false;
    }
    if (++b->n_elems > SP_GRAMMAR_MAX_ELEMS) {
        BFAIL(b, SP_ERR_TOO_LARGE, "grammar: more than %u elements (after repetitions expand)",
              SP_GRAMMAR_MAX_ELEMS);
        return false;
    }
    rbuild_t *rb = &b->rules[r];
    if (rb->n == rb->cap) {
        uint32_t cap = rb->cap ? rb->cap * 2 : 16;
        uint32_t *ne = sp_realloc(rb->e, (size_t)cap * sizeof(uint32_t));
        if (ne == NULL) {
            BFAIL(b, SP_ERR_NOMEM, "grammar: out of memory");
            return false;
        }
        rb->e = ne, rb->cap = cap;
    }
    rb->e[rb->n++] = e;
    return true;
}

/* A new rule; returns its id or UINT32_MAX (error recorded). */
static uint32_t
new_rule(builder_t *b, const char *name, size_t len)
{
    if (b->st != SP_OK) {
        return UINT32_MAX;
    }
    if (b->n_rules >= SP_GRAMMAR_MAX_RULES) {
        BFAIL(b, SP_ERR_TOO_LARGE, "grammar: more than %u rules (helper rules included)",
              SP_GRAMMAR_MAX_RULES);
        return UINT32_MAX;
    }
    if (b->n_rules == b->cap_rules) {
        uint32_t cap = b->cap_rules ? b->cap_rules * 2 : 32;
        rbuild_t *nr = sp_realloc(b->rules, (size_t)cap * sizeof(rbuild_t));
        if (nr == NULL) {
            BFAIL(b, SP_ERR_NOMEM, "grammar: out of memory");
            return UINT32_MAX;
        }
        b->rules = nr, b->cap_rules = cap;
    }
    rbuild_t *rb = &b->rules[b->n_rules];
    memset(rb, 0, sizeof *rb);
    rb->name = sp_strndup(name, len);
    if (rb->name == NULL) {
        BFAIL(b, SP_ERR_NOMEM, "grammar: out of memory");
        return UINT32_MAX;
    }
    return b->n_rules++;
}

static uint32_t
helper_rule(builder_t *b, uint32_t parent)
{
    char name[96];
    snprintf(name, sizeof name, "%.80s_%u", b->rules[parent].name, b->n_rules);
    return new_rule(b, name, strlen(name));
}

#define NAME_SLOTS (2 * SP_GRAMMAR_MAX_RULES)

/* The rule called name (created when new): a hash table, so a grammar with
 * many names compiles in linear time. */
static uint32_t
rule_by_name(builder_t *b, const char *name, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ (unsigned char)name[i]) * 1099511628211ull;
    }
    uint32_t k = (uint32_t)(h ^ (h >> 32)) & (NAME_SLOTS - 1);
    while (b->name_hash[k]) {
        uint32_t i = b->name_hash[k] - 1;
        if (strlen(b->rules[i].name) == len && memcmp(b->rules[i].name, name, len) == 0) {
            return i;
        }
        k = (k + 1) & (NAME_SLOTS - 1);
    }
    uint32_t id = new_rule(b, name, len);
    if (id != UINT32_MAX) {
        b->name_hash[k] = id + 1;
    }
    return id;
}

static uint32_t
set_fnv(const bset_t *s)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 4; i++) {
        h = (h ^ s->w[i]) * 1099511628211ull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

/* The index of set s in the table (added when new), or UINT32_MAX. */
static uint32_t
intern_set(builder_t *b, const bset_t *s)
{
    if (b->st != SP_OK) {
        return UINT32_MAX;
    }
    if ((b->n_sets + 1) * 2 > b->set_hash_cap) {
        uint32_t cap = b->set_hash_cap ? b->set_hash_cap * 2 : 256;
        uint32_t *nh = sp_calloc(cap, sizeof(uint32_t));
        bset_t *ns = sp_realloc(b->sets, (size_t)cap / 2 * sizeof(bset_t));
        if (nh == NULL || ns == NULL) {
            sp_free(nh);
            if (ns) {
                b->sets = ns;
            }
            BFAIL(b, SP_ERR_NOMEM, "grammar: out of memory");
            return UINT32_MAX;
        }
        b->sets = ns;
        for (uint32_t i = 0; i < b->n_sets; i++) {
            uint32_t h = set_fnv(&b->sets[i]) & (cap - 1);
            while (nh[h]) {
                h = (h + 1) & (cap - 1);
            }
            nh[h] = i + 1;
        }
        sp_free(b->set_hash);
        b->set_hash = nh, b->set_hash_cap = cap;
    }
    uint32_t h = set_fnv(s) & (b->set_hash_cap - 1);
    while (b->set_hash[h]) {
        uint32_t i = b->set_hash[h] - 1;
        if (memcmp(&b->sets[i], s, sizeof *s) == 0) {
            return i;
        }
        h = (h + 1) & (b->set_hash_cap - 1);
    }
    b->sets[b->n_sets] = *s;
    b->set_hash[h] = ++b->n_sets;
    return b->n_sets - 1;
}

static bool
push_byte(builder_t *b, uint32_t r, unsigned c)
{
    bset_t s = {{0}};
    bset_add_range(&s, c, c);
    uint32_t i = intern_set(b, &s);
    return i != UINT32_MAX && push_elem(b, r, E_BYTES(i));
}

/* ---- lexing -------------------------------------------------------------- */

static bool
is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* Skip blanks and # comments; newlines too when nl. */
static void
skip_space(builder_t *b, bool nl)
{
    while (b->p < b->end) {
        char c = *b->p;
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) {
            b->p++;
        } else if (c == '#') {
            while (b->p < b->end && *b->p != '\n') {
                b->p++;
            }
        } else {
            break;
        }
    }
}

/* One UTF-8 code point from the source; -1 on invalid UTF-8. */
static int32_t
decode_utf8(builder_t *b)
{
    const unsigned char *s = (const unsigned char *)b->p;
    size_t left = (size_t)(b->end - b->p);
    unsigned c = s[0];
    int need;
    uint32_t cp, min;
    if (c < 0x80) {
        b->p++;
        return (int32_t)c;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 1, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3, cp = c & 0x07, min = 0x10000;
    } else {
        return -1;
    }
    if (left < (size_t)need + 1) {
        return -1;
    }
    for (int i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return -1;
        }
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        return -1;
    }
    b->p += need + 1;
    return (int32_t)cp;
}

/* A character of a literal or class, escapes decoded; -1 after an error. */
static int32_t
parse_char(builder_t *b)
{
    if (b->p >= b->end) {
        syntax(b, "unexpected end of the grammar");
        return -1;
    }
    if (*b->p != '\\') {
        int32_t cp = decode_utf8(b);
        if (cp < 0) {
            syntax(b, "invalid UTF-8");
        }
        return cp;
    }
    b->p++;
    if (b->p >= b->end) {
        syntax(b, "unfinished escape");
        return -1;
    }
    char c = *b->p++;
    int hex = 0;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
        return (unsigned char)c;
    case 'x': hex = 2; break;
    case 'u': hex = 4; break;
    case 'U': hex = 8; break;
    default:
        b->p--;
        syntax(b, "unknown escape (\\n \\r \\t \\\\ \\\" \\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH)");
        return -1;
    }
    uint32_t v = 0;
    for (int i = 0; i < hex; i++) {
        if (b->p >= b->end) {
            syntax(b, "unfinished hex escape");
            return -1;
        }
        char h = *b->p++;
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) {
            b->p--;
            syntax(b, "bad hex digit in an escape");
            return -1;
        }
        v = v << 4 | (uint32_t)d;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        syntax(b, "escape is not a Unicode scalar value");
        return -1;
    }
    return (int32_t)v;
}

static int
encode_utf8(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    } else if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    } else if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- character classes to UTF-8 byte sequences --------------------------- */

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range_t;

/* One byte-range sequence (1..4 ranges); first byte merged across sequences. */
typedef struct useq {
    int n;
    unsigned lo[4], hi[4];
    bset_t first;
} useq_t;

typedef struct useqs {
    useq_t s[64];
    int n;
    bool overflow;
} useqs_t;

static void
useq_add(useqs_t *q, uint32_t lo, uint32_t hi)
{
    unsigned char a[4], z[4];
    int n = encode_utf8(lo, a);
    encode_utf8(hi, z);
    /* Merge with a sequence that has the same tail ranges. */
    for (int i = 0; i < q->n; i++) {
        useq_t *s = &q->s[i];
        bool same = s->n == n;
        for (int k = 1; same && k < n; k++) {
            same = s->lo[k] == a[k] && s->hi[k] == z[k];
        }
        if (same) {
            bset_add_range(&s->first, a[0], z[0]);
            return;
        }
    }
    if (q->n == (int)(sizeof q->s / sizeof q->s[0])) {
        q->overflow = true;
        return;
    }
    useq_t *s = &q->s[q->n++];
    memset(s, 0, sizeof *s);
    s->n = n;
    for (int k = 0; k < n; k++) {
        s->lo[k] = a[k], s->hi[k] = z[k];
    }
    bset_add_range(&s->first, a[0], z[0]);
}

/*
 * Split [lo, hi] (same encoded length, no surrogates) until every piece is a
 * product of byte ranges. The split points depend only on the code-point
 * structure (at most three levels of 64-aligned blocks), so the explicit
 * stack below never holds more than a few dozen ranges.
 */
static void
split_range(useqs_t *q, uint32_t lo, uint32_t hi)
{
    cp_range_t stack[64];
    int sp = 0;
    stack[sp++] = (cp_range_t){lo, hi};
    while (sp > 0 && !q->overflow) {
        cp_range_t r = stack[--sp];
        unsigned char a[4];
        int n = encode_utf8(r.lo, a);
        bool split = false;
        for (int i = 1; i < n && !split; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((r.lo & ~m) != (r.hi & ~m)) {
                if ((r.lo & m) != 0) {
                    if (sp + 2 > 64) {
                        q->overflow = true;
                        return;
                    }
                    stack[sp++] = (cp_range_t){(r.lo | m) + 1, r.hi};
                    stack[sp++] = (cp_range_t){r.lo, r.lo | m};
                    split = true;
                } else if ((r.hi & m) != m) {
                    if (sp + 2 > 64) {
                        q->overflow = true;
                        return;
                    }
                    stack[sp++] = (cp_range_t){r.hi & ~m, r.hi};
                    stack[sp++] = (cp_range_t){r.lo, (r.hi & ~m) - 1};
                    split = true;
                }
            }
        }
        if (!split) {
            useq_add(q, r.lo, r.hi);
        }
    }
}

static int
range_cmp(const void *x, const void *y)
{
    const cp_range_t *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Emit the class (sorted, merged, maybe negated ranges) into rule r. */
static void
emit_class(builder_t *b, uint32_t r, cp_range_t *rg, int n, bool negate)
{
    qsort(rg, (size_t)n, sizeof *rg, range_cmp);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && rg[i].lo <= rg[m - 1].hi + 1) {
            rg[m - 1].hi = rg[i].hi > rg[m - 1].hi ? rg[i].hi : rg[m - 1].hi;
        } else {
            rg[m++] = rg[i];
        }
    }
    cp_range_t out[MAX_CLASS_RANGES + 2];
    int k = 0;
    if (negate) {
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (rg[i].lo > next) {
                out[k++] = (cp_range_t){next, rg[i].lo - 1};
            }
            next = rg[i].hi + 1;
        }
        if (next <= 0x10FFFF) {
            out[k++] = (cp_range_t){next, 0x10FFFF};
        }
    } else {
        memcpy(out, rg, (size_t)m * sizeof *rg);
        k = m;
    }
    /* Cut at the encoded-length boundaries and around the surrogates. */
    static const cp_range_t zones[] = {
        {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    useqs_t *q = sp_calloc(1, sizeof *q);
    if (q == NULL) {
        BFAIL(b, SP_ERR_NOMEM, "grammar: out of memory");
        return;
    }
    for (int i = 0; i < k; i++) {
        for (size_t z = 0; z < sizeof zones / sizeof zones[0]; z++) {
            uint32_t lo = out[i].lo > zones[z].lo ? out[i].lo : zones[z].lo;
            uint32_t hi = out[i].hi < zones[z].hi ? out[i].hi : zones[z].hi;
            if (lo <= hi) {
                split_range(q, lo, hi);
            }
        }
    }
    if (q->overflow) {
        sp_free(q);
        syntax(b, "character class too complex (more than 64 UTF-8 byte patterns)");
        return;
    }
    if (q->n == 0) {
        sp_free(q);
        syntax(b, "character class matches nothing");
        return;
    }
    if (q->n == 1 && q->s[0].n == 1) {
        uint32_t si = intern_set(b, &q->s[0].first);
        if (si != UINT32_MAX) {
            push_elem(b, r, E_BYTES(si));
        }
        sp_free(q);
        return;
    }
    uint32_t h = helper_rule(b, r);
    for (int i = 0; i < q->n && b->st == SP_OK; i++) {
        const useq_t *s = &q->s[i];
        uint32_t si = intern_set(b, &s->first);
        if (si == UINT32_MAX || !push_elem(b, h, E_BYTES(si))) {
            break;
        }
        for (int j = 1; j < s->n; j++) {
            bset_t t = {{0}};
            bset_add_range(&t, s->lo[j], s->hi[j]);
            si = intern_set(b, &t);
            if (si == UINT32_MAX || !push_elem(b, h, E_BYTES(si))) {
                break;
            }
        }
        push_elem(b, h, E_END);
    }
    sp_free(q);
    if (b->st == SP_OK) {
        b->rules[h].defined = true;
        push_elem(b, r, E_REF(h));
    }
}

/* [ ... ] at b->p */
static void
parse_class(builder_t *b, uint32_t r)
{
    b->p++; /* [ */
    bool negate = false;
    if (b->p < b->end && *b->p == '^') {
        negate = true;
        b->p++;
    }
    cp_range_t *rg = sp_malloc(MAX_CLASS_RANGES * sizeof *rg);
    if (rg == NULL) {
        BFAIL(b, SP_ERR_NOMEM, "grammar: out of memory");
        return;
    }
    int n = 0;
    while (b->st == SP_OK) {
        if (b->p >= b->end) {
            syntax(b, "unterminated character class");
            break;
        }
        if (*b->p == ']') {
            b->p++;
            break;
        }
        int32_t lo = parse_char(b), hi = lo;
        if (lo < 0) {
            break;
        }
        if (b->p + 1 < b->end && *b->p == '-' && b->p[1] != ']') {
            b->p++;
            hi = parse_char(b);
            if (hi < 0) {
                break;
            }
            if (hi < lo) {
                syntax(b, "character range is backwards");
                break;
            }
        }
        if (n == MAX_CLASS_RANGES) {
            syntax(b, "character class has more than 1024 ranges");
            break;
        }
        rg[n++] = (cp_range_t){(uint32_t)lo, (uint32_t)hi};
    }
    if (b->st == SP_OK) {
        if (n == 0 && !negate) {
            syntax(b, "empty character class");
        } else {
            emit_class(b, r, rg, n, negate);
        }
    }
    sp_free(rg);
}

/* ---- rules, alternatives, sequences -------------------------------------- */

static void parse_alternates(builder_t *b, uint32_t r, bool nested);

/* Wrap rule r's elements [from, n) into a helper rule; returns the REF. */
static uint32_t
wrap_tail(builder_t *b, uint32_t r, uint32_t from)
{
    uint32_t h = helper_rule(b, r);
    if (h == UINT32_MAX) {
        return E_END;
    }
    rbuild_t *src = &b->rules[r];
    uint32_t n = src->n - from;
    for (uint32_t i = 0; i < n && b->st == SP_OK; i++) {
        b->n_elems--; /* moved, not added */
        push_elem(b, h, b->rules[r].e[from + i]);
    }
    push_elem(b, h, E_END);
    b->rules[h].defined = true;
    b->rules[r].n = from;
    return E_REF(h);
}

/* x{min,max} for the atom at rule r's elements [from, n); max UINT32_MAX: no bound. */
static void
repeat(builder_t *b, uint32_t r, uint32_t from, uint32_t min, uint32_t max)
{
    if (b->st != SP_OK) {
        return;
    }
    if (b->rules[r].n == from) {
        syntax(b, "repetition of nothing");
        return;
    }
    uint32_t x;
    if (b->rules[r].n - from == 1) {
        x = b->rules[r].e[from];
        b->rules[r].n = from;
        b->n_elems--;
    } else {
        x = wrap_tail(b, r, from); /* moves the atom out of r */
    }
    if (b->st != SP_OK) {
        return;
    }
    for (uint32_t i = 0; i < min; i++) {
        if (!push_elem(b, r, x)) {
            return;
        }
    }
    if (max == UINT32_MAX) {
        uint32_t h = helper_rule(b, r); /* h ::= x h | (empty) */
        push_elem(b, h, x);
        push_elem(b, h, E_REF(h));
        push_elem(b, h, E_END);
        push_elem(b, h, E_END);
        if (b->st == SP_OK) {
            b->rules[h].defined = true;
            push_elem(b, r, E_REF(h));
        }
        return;
    }
    uint32_t prev = UINT32_MAX; /* h_k ::= x h_{k-1} | (empty); h_1 ::= x | (empty) */
    for (uint32_t k = 0; k < max - min && b->st == SP_OK; k++) {
        uint32_t h = helper_rule(b, r);
        push_elem(b, h, x);
        if (prev != UINT32_MAX) {
            push_elem(b, h, E_REF(prev));
        }
        push_elem(b, h, E_END);
        push_elem(b, h, E_END);
        if (b->st == SP_OK) {
            b->rules[h].defined = true;
        }
        prev = h;
    }
    if (prev != UINT32_MAX) {
        push_elem(b, r, E_REF(prev));
    }
}

static bool
parse_uint(builder_t *b, uint32_t *out)
{
    if (b->p >= b->end || *b->p < '0' || *b->p > '9') {
        syntax(b, "expected a number");
        return false;
    }
    uint64_t v = 0;
    while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
        v = v * 10 + (uint64_t)(*b->p++ - '0');
        if (v > SP_GRAMMAR_MAX_REPEAT) {
            syntax(b, "repetition count above 4096");
            return false;
        }
    }
    *out = (uint32_t)v;
    return true;
}

static void
parse_sequence(builder_t *b, uint32_t r, bool nested)
{
    uint32_t last = UINT32_MAX; /* start of the last atom, for postfix operators */
    while (b->st == SP_OK) {
        skip_space(b, nested);
        if (b->p >= b->end) {
            break;
        }
        char c = *b->p;
        uint32_t start = b->rules[r].n;
        if (c == '"') {
            b->p++;
            while (b->st == SP_OK) {
                if (b->p >= b->end || *b->p == '\n') {
                    syntax(b, "unterminated string literal");
                    break;
                }
                if (*b->p == '"') {
                    b->p++;
                    break;
                }
                int32_t cp = parse_char(b);
                if (cp < 0) {
                    break;
                }
                unsigned char u[4];
                int k = encode_utf8((uint32_t)cp, u);
                for (int i = 0; i < k; i++) {
                    push_byte(b, r, u[i]);
                }
            }
            last = start;
        } else if (c == '[') {
            parse_class(b, r);
            last = start;
        } else if (c == '.') {
            b->p++;
            cp_range_t none[1];
            emit_class(b, r, none, 0, true);
            last = start;
        } else if (c == '(') {
            b->p++;
            if (++b->depth > SP_GRAMMAR_MAX_NEST) {
                syntax(b, "parentheses nested deeper than 64");
                break;
            }
            uint32_t h = helper_rule(b, r);
            if (h == UINT32_MAX) {
                break;
            }
            b->rules[h].defined = true;
            skip_space(b, true);
            parse_alternates(b, h, true);
            b->depth--;
            skip_space(b, true);
            if (b->st == SP_OK && (b->p >= b->end || *b->p != ')')) {
                syntax(b, "expected ')'");
                break;
            }
            b->p++;
            push_elem(b, r, E_REF(h));
            last = start;
        } else if (is_name_char((unsigned char)c)) {
            const char *s = b->p;
            while (b->p < b->end && is_name_char((unsigned char)*b->p)) {
                b->p++;
            }
            uint32_t id = rule_by_name(b, s, (size_t)(b->p - s));
            if (id == UINT32_MAX) {
                break;
            }
            push_elem(b, r, E_REF(id));
            last = start;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == UINT32_MAX) {
                syntax(b, "repetition operator without something to repeat");
                break;
            }
            b->p++;
            uint32_t lo = 0, hi = UINT32_MAX;
            if (c == '+') {
                lo = 1;
            } else if (c == '?') {
                hi = 1;
            } else if (c == '{') {
                skip_space(b, false);
                if (!parse_uint(b, &lo)) {
                    break;
                }
                skip_space(b, false);
                hi = lo;
                if (b->p < b->end && *b->p == ',') {
                    b->p++;
                    skip_space(b, false);
                    hi = UINT32_MAX;
                    if (b->p < b->end && *b->p != '}' && !parse_uint(b, &hi)) {
                        break;
                    }
                    skip_space(b, false);
                }
                if (b->p >= b->end || *b->p != '}') {
                    syntax(b, "expected '}'");
                    break;
                }
                b->p++;
                if (hi < lo) {
                    syntax(b, "repetition {m,n} with n < m");
                    break;
                }
            }
            repeat(b, r, last, lo, hi);
            last = UINT32_MAX; /* x** is an error, as in llama.cpp */
        } else {
            break; /* '|', ')', a newline or something the caller judges */
        }
    }
}

static void
parse_alternates(builder_t *b, uint32_t r, bool nested)
{
    while (b->st == SP_OK) {
        parse_sequence(b, r, nested);
        push_elem(b, r, E_END);
        /* A '|' continues the rule, also at the start of the next line. */
        const char *save = b->p;
        skip_space(b, true);
        if (b->p < b->end && *b->p == '|') {
            b->p++;
            skip_space(b, true);
            continue;
        }
        if (!nested) {
            b->p = save;
        }
        break;
    }
}

static void
parse_rule(builder_t *b)
{
    const char *s = b->p;
    while (b->p < b->end && is_name_char((unsigned char)*b->p)) {
        b->p++;
    }
    if (b->p == s) {
        syntax(b, "expected a rule name");
        return;
    }
    size_t len = (size_t)(b->p - s);
    skip_space(b, false);
    if (b->end - b->p < 3 || memcmp(b->p, "::=", 3) != 0) {
        syntax(b, "expected '::='");
        return;
    }
    b->p += 3;
    uint32_t r = rule_by_name(b, s, len);
    if (r == UINT32_MAX) {
        return;
    }
    if (b->rules[r].defined) {
        BFAIL(b, SP_ERR_INVALID, "grammar: rule '%.*s' is defined twice", (int)len, s);
        return;
    }
    b->rules[r].defined = true;
    skip_space(b, true);
    parse_alternates(b, r, false);
    skip_space(b, false);
    if (b->st == SP_OK && b->p < b->end && *b->p != '\n') {
        syntax(b, "unexpected character");
    }
}

/* ---- finishing: flatten, shortest sentences, checks ---------------------- */

typedef struct heap_item {
    uint32_t len, rule;
} heap_item_t;

static void
heap_push(heap_item_t *h, uint32_t *n, heap_item_t x)
{
    uint32_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].len > x.len) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static heap_item_t
heap_pop(heap_item_t *h, uint32_t *n)
{
    heap_item_t top = h[0], x = h[--(*n)];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= *n) {
            break;
        }
        if (c + 1 < *n && h[c + 1].len < h[c].len) {
            c++;
        }
        if (h[c].len >= x.len) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) {
        h[i] = x;
    }
    return top;
}

/*
 * Shortest sentence of every rule (Knuth 1977): an alternative's length is
 * known once all its rules are; the smallest known length is final (lengths
 * only add), so rules are finalised in increasing order from a heap. O((E +
 * R) log R) for E elements and R rules.
 */
static sp_status_t
min_lengths(sp_grammar_t *g, uint32_t *rule_min, char *err, size_t err_len)
{
    uint32_t na = g->n_alts, nr = g->n_rules;
    uint32_t *pending = sp_calloc(na, sizeof(uint32_t));
    uint32_t *base = sp_calloc(na, sizeof(uint32_t));
    uint32_t *alt_rule = sp_malloc((size_t)na * sizeof(uint32_t) + 1);
    uint32_t *occ_off = sp_calloc((size_t)nr + 1, sizeof(uint32_t));
    uint32_t *occ = sp_malloc((size_t)g->n_elems * sizeof(uint32_t) + 1);
    heap_item_t *heap = sp_malloc(((size_t)na + nr + 1) * sizeof(heap_item_t));
    bool *done = sp_calloc((size_t)nr + 1, sizeof(bool));
    sp_status_t st = SP_OK;
    if (!pending || !base || !alt_rule || !occ_off || !occ || !heap || !done) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    for (uint32_t r = 0; r < nr; r++) {
        rule_min[r] = LEN_INF;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            alt_rule[a] = r;
            for (uint32_t i = g->alt_start[a]; g->elems[i] != E_END; i++) {
                if (E_KIND(g->elems[i]) == K_REF) {
                    pending[a]++;
                    occ_off[E_ARG(g->elems[i]) + 1]++;
                } else {
                    base[a]++;
                }
            }
        }
    }
    for (uint32_t r = 0; r < nr; r++) {
        occ_off[r + 1] += occ_off[r];
    }
    uint32_t *fill = sp_calloc((size_t)nr + 1, sizeof(uint32_t));
    if (fill == NULL) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    for (uint32_t a = 0; a < na; a++) {
        for (uint32_t i = g->alt_start[a]; g->elems[i] != E_END; i++) {
            if (E_KIND(g->elems[i]) == K_REF) {
                uint32_t t = E_ARG(g->elems[i]);
                occ[occ_off[t] + fill[t]++] = a;
            }
        }
    }
    sp_free(fill);
    uint32_t nh = 0;
    for (uint32_t a = 0; a < na; a++) {
        if (pending[a] == 0 && base[a] < rule_min[alt_rule[a]]) {
            rule_min[alt_rule[a]] = base[a];
            heap_push(heap, &nh, (heap_item_t){base[a], alt_rule[a]});
        }
    }
    while (nh > 0) {
        heap_item_t it = heap_pop(heap, &nh);
        if (done[it.rule] || it.len != rule_min[it.rule]) {
            continue;
        }
        done[it.rule] = true;
        for (uint32_t k = occ_off[it.rule]; k < occ_off[it.rule + 1]; k++) {
            uint32_t a = occ[k];
            base[a] = sat_add(base[a], it.len);
            if (--pending[a] == 0 && base[a] < rule_min[alt_rule[a]] && !done[alt_rule[a]]) {
                rule_min[alt_rule[a]] = base[a];
                heap_push(heap, &nh, (heap_item_t){base[a], alt_rule[a]});
            }
        }
    }
out:
    sp_free(pending);
    sp_free(base);
    sp_free(alt_rule);
    sp_free(occ_off);
    sp_free(occ);
    sp_free(heap);
    sp_free(done);
    return st;
}

/*
 * Left recursion: rule A "starts with" B when some alternative of A has REF(B)
 * after elements that can all be empty. A cycle of such edges would make
 * expansion push forever, so it is an error. Iterative DFS (colours, an
 * explicit stack of (rule, next alternative element)).
 */
static sp_status_t
check_left_recursion(const sp_grammar_t *g, const uint32_t *rule_min, char *const *names,
                     char *err, size_t err_len)
{
    uint32_t nr = g->n_rules;
    uint8_t *colour = sp_calloc(nr, 1);
    uint32_t *stk_rule = sp_malloc((size_t)nr * sizeof(uint32_t) + 1);
    uint32_t *stk_alt = sp_malloc((size_t)nr * sizeof(uint32_t) + 1);
    uint32_t *stk_pos = sp_malloc((size_t)nr * sizeof(uint32_t) + 1);
    sp_status_t st = SP_OK;
    if (!colour || !stk_rule || !stk_alt || !stk_pos) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    for (uint32_t r0 = 0; r0 < nr && st == SP_OK; r0++) {
        if (colour[r0]) {
            continue;
        }
        uint32_t sp = 0;
        stk_rule[sp] = r0, stk_alt[sp] = g->rule_alt[r0], stk_pos[sp] = 0, sp++;
        colour[r0] = 1;
        while (sp > 0) {
            uint32_t t = sp - 1, r = stk_rule[t];
            if (stk_alt[t] >= g->rule_alt[r + 1]) {
                colour[r] = 2;
                sp--;
                continue;
            }
            uint32_t i = g->alt_start[stk_alt[t]] + stk_pos[t];
            uint32_t e = g->elems[i];
            /* Advance this frame past e when e can be empty, else to the next alternative. */
            bool go_on = e != E_END && E_KIND(e) == K_REF && rule_min[E_ARG(e)] == 0;
            if (go_on) {
                stk_pos[t]++;
            } else {
                stk_alt[t]++, stk_pos[t] = 0;
            }
            if (e == E_END || E_KIND(e) != K_REF) {
                continue;
            }
            uint32_t c = E_ARG(e);
            if (colour[c] == 1) {
                st = sp_errf(err, err_len, SP_ERR_INVALID,
                             "grammar: rule '%s' is left-recursive (it can reach itself before "
                             "reading a byte)", names[c]);
                break;
            }
            if (colour[c] == 0) {
                colour[c] = 1;
                stk_rule[sp] = c, stk_alt[sp] = g->rule_alt[c], stk_pos[sp] = 0, sp++;
            }
        }
    }
out:
    sp_free(colour);
    sp_free(stk_rule);
    sp_free(stk_alt);
    sp_free(stk_pos);
    return st;
}

static void
grammar_free(sp_grammar_t *g)
{
    if (g == NULL) {
        return;
    }
    sp_free(g->elems);
    sp_free(g->alt_start);
    sp_free(g->rule_alt);
    sp_free(g->rest);
    sp_free(g->sets);
    sp_free(g);
}

static sp_status_t
finish(builder_t *b, sp_grammar_t **out)
{
    char *err = b->err;
    size_t err_len = b->err_len;
    uint32_t root = UINT32_MAX;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        if (!b->rules[r].defined) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "grammar: rule '%s' is used but not defined",
                           b->rules[r].name);
        }
        if (strcmp(b->rules[r].name, "root") == 0) {
            root = r;
        }
    }
    if (root == UINT32_MAX) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "grammar: no 'root' rule");
    }
    sp_grammar_t *g = sp_calloc(1, sizeof *g);
    if (g == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
    }
    atomic_init(&g->refs, 1);
    g->root = root;
    g->n_rules = b->n_rules;
    uint64_t ne = 0, na = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        ne += b->rules[r].n;
        for (uint32_t i = 0; i < b->rules[r].n; i++) {
            na += b->rules[r].e[i] == E_END;
        }
    }
    g->n_elems = (uint32_t)ne;
    g->n_alts = (uint32_t)na;
    g->elems = sp_malloc((size_t)ne * sizeof(uint32_t) + 1);
    g->rest = sp_malloc((size_t)ne * sizeof(uint32_t) + 1);
    g->alt_start = sp_malloc((size_t)na * sizeof(uint32_t) + 1);
    g->rule_alt = sp_malloc(((size_t)b->n_rules + 1) * sizeof(uint32_t));
    g->sets = sp_malloc((size_t)b->n_sets * sizeof(bset_t) + 1);
    uint32_t *rule_min = sp_malloc((size_t)b->n_rules * sizeof(uint32_t) + 1);
    char **names = sp_malloc((size_t)b->n_rules * sizeof(char *) + 1);
    sp_status_t st = SP_OK;
    if (!g->elems || !g->rest || !g->alt_start || !g->rule_alt || !g->sets || !rule_min || !names) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
        goto fail;
    }
    if (b->n_sets > 0) { /* memcpy from NULL is undefined even for 0 bytes */
        memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof(bset_t));
    }
    g->n_sets = b->n_sets;
    uint32_t e = 0, a = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        names[r] = b->rules[r].name;
        g->rule_alt[r] = a;
        bool at_start = true;
        for (uint32_t i = 0; i < b->rules[r].n; i++) {
            if (at_start) {
                g->alt_start[a++] = e;
                at_start = false;
            }
            g->elems[e++] = b->rules[r].e[i];
            at_start = b->rules[r].e[i] == E_END;
        }
    }
    g->rule_alt[b->n_rules] = a;
    st = min_lengths(g, rule_min, err, err_len);
    if (st != SP_OK) {
        goto fail;
    }
    /* Every rule reachable from root must be able to end. */
    {
        uint8_t *seen = sp_calloc(g->n_rules, 1);
        uint32_t *todo = sp_malloc((size_t)g->n_rules * sizeof(uint32_t) + 1);
        if (!seen || !todo) {
            sp_free(seen);
            sp_free(todo);
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
            goto fail;
        }
        uint32_t nt = 0;
        todo[nt++] = root;
        seen[root] = 1;
        while (nt > 0 && st == SP_OK) {
            uint32_t r = todo[--nt];
            if (rule_min[r] >= LEN_INF) {
                st = sp_errf(err, err_len, SP_ERR_INVALID,
                             "grammar: rule '%s' can never end (every alternative recurses)",
                             names[r]);
                break;
            }
            for (uint32_t k = g->rule_alt[r]; k < g->rule_alt[r + 1]; k++) {
                for (uint32_t i = g->alt_start[k]; g->elems[i] != E_END; i++) {
                    if (E_KIND(g->elems[i]) == K_REF && !seen[E_ARG(g->elems[i])]) {
                        seen[E_ARG(g->elems[i])] = 1;
                        todo[nt++] = E_ARG(g->elems[i]);
                    }
                }
            }
        }
        sp_free(seen);
        sp_free(todo);
        if (st != SP_OK) {
            goto fail;
        }
    }
    st = check_left_recursion(g, rule_min, names, err, err_len);
    if (st != SP_OK) {
        goto fail;
    }
    for (uint32_t k = 0; k < g->n_alts; k++) {
        uint32_t i = g->alt_start[k], j = i;
        while (g->elems[j] != E_END) {
            j++;
        }
        g->rest[j] = 0;
        for (uint32_t x = j; x-- > i;) {
            uint32_t el = g->elems[x];
            g->rest[x] = sat_add(g->rest[x + 1], E_KIND(el) == K_REF ? rule_min[E_ARG(el)] : 1);
        }
    }
    g->bytes = sizeof *g + (size_t)ne * 8 + (size_t)na * 4 + (size_t)g->n_rules * 4 +
               (size_t)g->n_sets * sizeof(bset_t);
    sp_free(rule_min);
    sp_free(names);
    *out = g;
    return SP_OK;
fail:
    sp_free(rule_min);
    sp_free(names);
    grammar_free(g);
    return st;
}

sp_status_t
sp_grammar_compile(const char *src, size_t len, sp_grammar_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (src == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "grammar: no text");
    }
    if (len > SP_GRAMMAR_MAX_SOURCE) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "grammar: more than %u bytes",
                       SP_GRAMMAR_MAX_SOURCE);
    }
    if (memchr(src, '\0', len) != NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "grammar: contains a NUL byte");
    }
    builder_t b;
    memset(&b, 0, sizeof b);
    b.src = b.p = src;
    b.end = src + len;
    b.err = err;
    b.err_len = err_len;
    b.name_hash = sp_calloc(NAME_SLOTS, sizeof(uint32_t));
    if (b.name_hash == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "grammar: out of memory");
    }
    skip_space(&b, true);
    while (b.st == SP_OK && b.p < b.end) {
        parse_rule(&b);
        skip_space(&b, true);
    }
    sp_status_t st = b.st;
    if (st == SP_OK) {
        st = finish(&b, out);
    }
    for (uint32_t r = 0; r < b.n_rules; r++) {
        sp_free(b.rules[r].e);
        sp_free(b.rules[r].name);
    }
    sp_free(b.rules);
    sp_free(b.sets);
    sp_free(b.set_hash);
    sp_free(b.name_hash);
    return st;
}

void
sp_grammar_retain(sp_grammar_t *g)
{
    if (g != NULL) {
        atomic_fetch_add(&g->refs, 1);
    }
}

void
sp_grammar_release(sp_grammar_t *g)
{
    if (g != NULL && atomic_fetch_sub(&g->refs, 1) == 1) {
        grammar_free(g);
    }
}

size_t
sp_grammar_bytes(const sp_grammar_t *g)
{
    return g ? g->bytes : 0;
}

int32_t
sp_grammar_n_rules(const sp_grammar_t *g)
{
    return g ? (int32_t)g->n_rules : 0;
}

bool
sp_grammar_needs_byte_outside(const sp_grammar_t *g, const bool have[256])
{
    for (uint32_t i = 0; i < g->n_sets; i++) {
        bool any = false;
        for (unsigned c = 0; c < 256 && !any; c++) {
            any = have[c] && bset_has(&g->sets[i], c);
        }
        if (!any) {
            return true;
        }
    }
    return false;
}

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
} gnode_t;

typedef struct gst {
    uint32_t off, n; /* tops[off .. off + n) */
    uint32_t next;   /* hash chain */
    uint32_t cost;
    uint32_t hash;
    uint8_t accept;
} gst_t;

typedef struct gtrans {
    uint64_t key;    /* (state << 8 | byte) + 1; 0 = empty */
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
    n->tail = sat_add(m->g->rest[pos + 1], parent == NONE ? 0 : m->nodes[parent].tail);
    n->next = m->node_head[k];
    m->node_head[k] = id;
    return id;
}

static int
u32_cmp(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* The interned state (sorted tops[0..n), accept); NONE when a table is full. */
static uint32_t
state_get(sp_gmatch_t *m, uint32_t *tops, uint32_t n, bool accept)
{
    if (n > 1) {
        qsort(tops, n, sizeof(uint32_t), u32_cmp);
    }
    uint32_t h = accept ? 0x9E3779B9u : 0;
    for (uint32_t i = 0; i < n; i++) {
        h = hash2(h, tops[i]);
    }
    uint32_t k = h & (m->state_buckets - 1);
    for (uint32_t i = m->state_head[k]; i != NONE; i = m->states[i].next) {
        const gst_t *s = &m->states[i];
        if (s->hash == h && s->n == n && s->accept == accept &&
            memcmp(m->tops + s->off, tops, (size_t)n * sizeof(uint32_t)) == 0) {
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
    for (uint32_t i = 0; i < n && cost > 0; i++) {
        uint32_t c = sat_add(1, m->nodes[tops[i]].tail);
        cost = c < cost ? c : cost;
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
    uint64_t key = ((uint64_t)s << 8 | (c & 0xFF)) + 1;
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
sp_grammar_match(const sp_grammar_t *g, const char *text, size_t len)
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
