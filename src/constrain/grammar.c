/*
 * grammar.c - GBNF compiled to a byte-level pushdown automaton (grammar.h has
 * the contract, docs/structured-output.md the design; the matcher that runs
 * the automaton is gmatch.c).
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
 */
#include "constrain/grammar.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "constrain/grammar_impl.h"

#define MAX_CLASS_RANGES 1024

static inline void
bset_add_range(bset_t *s, unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi; c++) {
        s->w[c >> 6] |= 1ull << (c & 63);
    }
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
    if (left == 0 || sp_utf8_seq(s, left) == 0) {
        return -1;
    }
    uint32_t cp;
    b->p += sp_utf8_decode(s, left, &cp);
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
/*
 * Partition the 256 bytes into classes no set tells apart: refine one class
 * by each set in turn (a class splits into its members inside and outside
 * the set). O(sets x 256), and it stops once every byte is alone.
 */
static void
byte_classes(sp_grammar_t *g)
{
    memset(g->byte_class, 0, sizeof g->byte_class);
    unsigned n = 1;
    for (uint32_t i = 0; i < g->n_sets && n < 256; i++) {
        uint8_t split[256][2];
        bool used[256][2];
        memset(used, 0, sizeof used);
        unsigned m = 0;
        for (unsigned c = 0; c < 256; c++) {
            unsigned k = g->byte_class[c], in = bset_has(&g->sets[i], c);
            if (!used[k][in]) {
                used[k][in] = true;
                split[k][in] = (uint8_t)m++;
            }
            g->byte_class[c] = split[k][in];
        }
        n = m;
    }
}

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
    byte_classes(g);
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
