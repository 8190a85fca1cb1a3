/*
 * fuzz_grammar.c - libFuzzer target for the GBNF compiler and matcher
 * (constrain/grammar.c) and the JSON-schema translator (constrain/schema.c).
 *
 * Build with `make fuzz`; run (docs/fuzzing.md has more):
 *   mkdir -p tests/fuzz/corpus-work/grammar
 *   ./build-fuzz/fuzz_grammar -max_total_time=60 -max_len=4096 -dict=tests/fuzz/grammar.dict \
 *       tests/fuzz/corpus-work/grammar tests/fuzz/corpus/grammar
 *
 * Input: SPEC, then optionally a NUL byte and a candidate string TEXT (empty
 * without one). SPEC that parses as a JSON object or boolean is a JSON schema
 * (translated with sp_schema_to_gbnf, then compiled); anything else is GBNF.
 *
 * Checks, besides no crash, leak, UB, hang or unbounded memory:
 *  - a failed compile says why (a non-empty message), and the GBNF the schema
 *    translator writes always compiles unless it is past the grammar's size
 *    limits (SP_ERR_TOO_LARGE): a syntax error there is the translator's bug;
 *  - TEXT fed in one sp_gmatch_commit; fed byte by byte as generation does
 *    (sp_gmatch_maintain, then every byte tried as a token mask does, for the
 *    first PROBED bytes, then the commit, which must land on the state its
 *    byte's trial did); walked with trial sp_gmatch_feed calls that never
 *    commit; and sp_gmatch_match: all four agree on the bytes accepted, the
 *    first refused byte, and the end state as far as it can be observed
 *    (accepting, can continue, the shortest completion's cost, which of the
 *    256 next bytes live and which of those accept). A refused commit leaves
 *    the state unchanged. Where a matcher reports it hit a table's hard cap
 *    (sp_gmatch_overflowed, sp_gmatch_match < 0) its DEAD answers may be the
 *    limit's, so nothing is compared for that input;
 *  - a matcher kept up with sp_gmatch_maintain stays under MATCHER_MAX bytes;
 *  - TEXT also steers a walk to a sentence (guided_sentence: its bytes pick
 *    among the live next bytes, then the cheapest completion follows): on
 *    the way sp_gmatch_cost must be exact, and sp_gmatch_match must accept
 *    the result (an empty TEXT gives the shortest sentence);
 *  - for a schema, an accepted TEXT and the guided sentence are JSON
 *    (jansson; a number too large for a double is the one exception, since
 *    the grammar bounds digits, not magnitude) that an independent validator
 *    of the supported keywords finds valid (JSON Schema's semantics: every
 *    keyword applies; oneOf exactly one branch, which schema.h enforces by
 *    refusing branches it cannot prove apart).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "constrain/grammar.h"
#include "constrain/schema.h"

/* Far above what the matcher's hard caps allow (about 64 MB): a matcher
 * that passes it has a table without a cap. */
#define MATCHER_MAX ((size_t)128 << 20)
#define PROBED 1024 /* text bytes before which the byte-by-byte walk tries all 256 bytes */
#define GUIDED 256      /* choice bytes a guided sentence follows */
#define COMPLETION 1024 /* bytes of its cheapest completion, at most */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((noreturn)) static void
bug(const char *what, const char *spec, size_t spec_len, size_t at)
{
    fprintf(stderr, "fuzz harness: %s (byte %zu of the text; spec %.*s)\n", what, at,
            (int)(spec_len > 400 ? 400 : spec_len), spec);
    abort();
}

/* The observable end state of s: flags and cost, then per next byte c
 * whether it lives (bit 0) and accepts (bit 1). False when a limit was hit. */
typedef struct view {
    bool accept, cont;
    uint32_t cost;
    uint8_t next[256];
} view_t;

static bool
observe(sp_gmatch_t *m, sp_gstate_t s, view_t *v)
{
    memset(v, 0, sizeof *v); /* compared with memcmp: no stale padding */
    v->accept = sp_gmatch_accepting(m, s);
    v->cont = sp_gmatch_can_continue(m, s);
    v->cost = sp_gmatch_cost(m, s);
    for (unsigned c = 0; c < 256; c++) {
        sp_gstate_t t = sp_gmatch_feed(m, s, c);
        v->next[c] = (uint8_t)((t != SP_GSTATE_DEAD) | (sp_gmatch_accepting(m, t) << 1));
    }
    return !sp_gmatch_overflowed(m);
}

/* ---- an independent validator for the schema subset schema.h supports ----
 * Standard JSON Schema semantics (every keyword applies, oneOf exactly one
 * branch). 1 valid, 0 not, -1 cannot tell (too deep, a $ref it cannot follow). */
static int valid(const json_t *root, const json_t *s, const json_t *x, int depth);

static int
all_valid(int a, int b)
{
    return a == 0 || b == 0 ? 0 : a < 0 || b < 0 ? -1 : 1;
}

static const json_t *
ref_target(const json_t *root, const char *path)
{
    const char *name;
    const json_t *defs;
    if (strcmp(path, "#") == 0) {
        return root;
    }
    if (strncmp(path, "#/$defs/", 8) == 0) {
        defs = json_object_get(root, "$defs"), name = path + 8;
    } else if (strncmp(path, "#/definitions/", 14) == 0) {
        defs = json_object_get(root, "definitions"), name = path + 14;
    } else {
        return NULL;
    }
    char key[256];
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof key; p++) {
        bool esc = p[0] == '~' && (p[1] == '0' || p[1] == '1');
        key[k++] = esc ? (p[1] == '0' ? '~' : '/') : *p;
        p += esc;
    }
    key[k] = '\0';
    return json_object_get(defs, key);
}

static bool
has_type(const json_t *x, const char *t)
{
    return strcmp(t, "string") == 0    ? json_is_string(x)
           : strcmp(t, "integer") == 0 ? json_is_integer(x)
           : strcmp(t, "number") == 0  ? json_is_number(x)
           : strcmp(t, "boolean") == 0 ? json_is_boolean(x)
           : strcmp(t, "null") == 0    ? json_is_null(x)
           : strcmp(t, "object") == 0  ? json_is_object(x)
           : strcmp(t, "array") == 0   ? json_is_array(x)
                                       : false;
}

static size_t
code_points(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    }
    return k;
}

static int
valid(const json_t *root, const json_t *s, const json_t *x, int depth)
{
    if (json_is_boolean(s)) {
        return json_is_true(s);
    }
    if (!json_is_object(s) || depth > 200) {
        return -1;
    }
    int r = 1;
    const json_t *v, *e;
    size_t i;
    if ((v = json_object_get(s, "$ref")) != NULL) {
        const json_t *t = json_is_string(v) ? ref_target(root, json_string_value(v)) : NULL;
        r = all_valid(r, t ? valid(root, t, x, depth + 1) : -1);
    }
    if ((v = json_object_get(s, "const")) != NULL) {
        r = all_valid(r, json_equal((json_t *)v, (json_t *)x));
    }
    if ((v = json_object_get(s, "enum")) != NULL) {
        int any = 0;
        json_array_foreach(v, i, e) {
            any |= json_equal((json_t *)e, (json_t *)x);
        }
        r = all_valid(r, any);
    }
    if ((v = json_object_get(s, "anyOf")) != NULL) {
        int any = 0;
        json_array_foreach(v, i, e) {
            int k = valid(root, e, x, depth + 1);
            any = any == 1 || k == 1 ? 1 : any < 0 || k < 0 ? -1 : 0;
        }
        r = all_valid(r, any);
    }
    if ((v = json_object_get(s, "oneOf")) != NULL) {
        /* exactly one branch: more than one is invalid even with some unknown */
        int yes = 0, unknown = 0;
        json_array_foreach(v, i, e) {
            int k = valid(root, e, x, depth + 1);
            yes += k == 1;
            unknown += k < 0;
        }
        r = all_valid(r, yes > 1 ? 0 : unknown ? -1 : yes);
    }
    if ((v = json_object_get(s, "allOf")) != NULL) {
        json_array_foreach(v, i, e) {
            r = all_valid(r, valid(root, e, x, depth + 1));
        }
    }
    if ((v = json_object_get(s, "type")) != NULL) {
        int any = json_is_string(v) && has_type(x, json_string_value(v));
        json_array_foreach(v, i, e) {
            any |= json_is_string(e) && has_type(x, json_string_value(e));
        }
        r = all_valid(r, any);
    }
    if ((v = json_object_get(s, "minimum")) != NULL && json_is_number(x)) {
        r = all_valid(r, json_number_value(x) >= json_number_value(v));
    }
    if (json_is_string(x)) {
        size_t len = code_points(json_string_value(x), json_string_length(x));
        if ((v = json_object_get(s, "minLength")) != NULL) {
            r = all_valid(r, (json_int_t)len >= json_integer_value(v));
        }
        if ((v = json_object_get(s, "maxLength")) != NULL) {
            r = all_valid(r, (json_int_t)len <= json_integer_value(v));
        }
    }
    if (json_is_array(x)) {
        size_t n = json_array_size(x);
        if ((v = json_object_get(s, "minItems")) != NULL) {
            r = all_valid(r, (json_int_t)n >= json_integer_value(v));
        }
        if ((v = json_object_get(s, "maxItems")) != NULL) {
            r = all_valid(r, (json_int_t)n <= json_integer_value(v));
        }
        if ((v = json_object_get(s, "items")) != NULL) {
            json_array_foreach(x, i, e) {
                r = all_valid(r, valid(root, v, e, depth + 1));
            }
        }
    }
    if (json_is_object(x)) {
        const json_t *props = json_object_get(s, "properties");
        const json_t *add = json_object_get(s, "additionalProperties");
        const char *key;
        json_object_foreach((json_t *)x, key, e) {
            const json_t *ps = json_object_get(props, key);
            if (ps != NULL) {
                r = all_valid(r, valid(root, ps, e, depth + 1));
            } else if (add != NULL) {
                r = all_valid(r, valid(root, add, e, depth + 1));
            }
        }
        json_array_foreach(json_object_get(s, "required"), i, e) {
            r = all_valid(r, json_object_get(x, json_string_value(e)) != NULL);
        }
    }
    return r;
}

/* text, a sentence of the schema's grammar, is JSON that the schema validates. */
static void
check_instance(const json_t *schema, const char *spec, size_t spec_len, const char *text,
               size_t n)
{
    json_error_t je;
    json_t *v = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (v == NULL && json_error_code(&je) != json_error_numeric_overflow) {
        fprintf(stderr, "fuzz harness: the sentence: %.*s\n", (int)(n > 400 ? 400 : n), text);
        bug("the schema's grammar accepted text that is not JSON", spec, spec_len,
            (size_t)je.position);
    }
    if (v != NULL && valid(schema, schema, v, 0) == 0) {
        fprintf(stderr, "fuzz harness: the sentence: %.*s\n", (int)(n > 400 ? 400 : n), text);
        bug("the schema's grammar accepted JSON the schema does not validate", spec, spec_len,
            n);
    }
    json_decref(v);
}

/*
 * A sentence of g steered by choice bytes, so that accepted texts are common
 * (a mutated string rarely is one): for each of the first GUIDED choice bytes
 * the live next bytes are listed (plus "stop here" when the state accepts) and
 * the byte picks one; then the cheapest completion, a byte whose state costs
 * least, until the state accepts. Checks on the way that sp_gmatch_cost is
 * exact (an accepting state costs 0, any other has a live byte to a state
 * costing one less), which generation relies on to finish within max_tokens.
 * Returns the length, 0 when a table limit was hit or COMPLETION bytes did
 * not end it; the completion is not walked when the cost says at its start
 * that it cannot end in time (an ambiguous grammar's states are large and
 * each step costs their size, so walking on would only spend the time limit).
 */
static size_t
guided_sentence(sp_grammar_t *g, const char *spec, size_t spec_len, const char *choice,
                size_t n, char *out)
{
    sp_gmatch_t *m;
    if (sp_gmatch_create(g, &m, NULL, 0) != SP_OK) {
        return 0;
    }
    size_t len = 0, i = 0;
    bool ended = false;
    while (len < GUIDED + COMPLETION) {
        sp_gmatch_maintain(m);
        sp_gstate_t s = sp_gmatch_state(m);
        bool acc = sp_gmatch_accepting(m, s);
        uint32_t cost = sp_gmatch_cost(m, s), best = UINT32_MAX;
        unsigned char live[256];
        unsigned n_live = 0, best_c = 0;
        for (unsigned c = 0; c < 256; c++) {
            sp_gstate_t t = sp_gmatch_feed(m, s, c);
            if (t != SP_GSTATE_DEAD) {
                live[n_live++] = (unsigned char)c;
                if (sp_gmatch_cost(m, t) < best) {
                    best = sp_gmatch_cost(m, t), best_c = c;
                }
            }
        }
        if (sp_gmatch_overflowed(m)) {
            break;
        }
        if (acc != (cost == 0) || (!acc && (n_live == 0 || best != cost - 1))) {
            bug("sp_gmatch_cost is not the length of the shortest completion", spec, spec_len,
                len);
        }
        unsigned char c;
        if (i < n && i < GUIDED) {
            unsigned pick = (unsigned char)choice[i++] % (n_live + acc);
            if (pick == n_live) {
                ended = true;
                break;
            }
            c = live[pick];
        } else if (acc) {
            ended = true;
            break;
        } else if (cost > GUIDED + COMPLETION - len) {
            break; /* the cheapest completion cannot end within COMPLETION bytes */
        } else {
            c = (unsigned char)best_c;
        }
        if (!sp_gmatch_commit(m, &c, 1)) {
            if (!sp_gmatch_overflowed(m)) {
                bug("a byte the trial feed took was refused by the commit", spec, spec_len, len);
            }
            break;
        }
        out[len++] = (char)c;
    }
    sp_gmatch_destroy(m);
    return ended ? len : 0;
}

static void
check_matching(sp_grammar_t *g, const char *spec, size_t spec_len, const char *text, size_t n,
               const json_t *schema)
{
    sp_gmatch_t *whole, *bytes, *trial;
    char err[256];
    if (sp_gmatch_create(g, &whole, err, sizeof err) != SP_OK) {
        return; /* the start state is past the matcher's limits: err says so */
    }
    if (sp_gmatch_create(g, &bytes, err, sizeof err) != SP_OK ||
        sp_gmatch_create(g, &trial, err, sizeof err) != SP_OK) {
        bug("a second matcher of the same grammar failed to start", spec, spec_len, 0);
    }

    /* All at once. */
    sp_gstate_t start = sp_gmatch_state(whole);
    bool ok_whole = sp_gmatch_commit(whole, text, n);
    if (!ok_whole && sp_gmatch_state(whole) != start && !sp_gmatch_overflowed(whole)) {
        bug("a refused commit moved the state", spec, spec_len, 0);
    }

    /* Byte by byte, as generation walks: sp_gmatch_maintain (tables rebuilt
     * when past their soft limits), then, for the first PROBED bytes, every
     * byte tried as a token mask does (this fills the tables, so long texts
     * reach the rebuilds), then the commit, which must land where the probe of
     * its byte did. */
    size_t dead_bytes = n;
    bool bytes_full = false;
    for (size_t i = 0; i < n; i++) {
        bytes_full |= sp_gmatch_overflowed(bytes);
        sp_gmatch_maintain(bytes);
        if (sp_gmatch_bytes(bytes) > MATCHER_MAX) {
            bug("the matcher grew past its bound", spec, spec_len, i);
        }
        sp_gstate_t probe = SP_GSTATE_DEAD;
        bool probed = i < PROBED;
        if (probed) {
            sp_gstate_t cur = sp_gmatch_state(bytes);
            for (unsigned c = 0; c < 256; c++) {
                sp_gstate_t t = sp_gmatch_feed(bytes, cur, c);
                probe = c == (unsigned char)text[i] ? t : probe;
            }
            probed = !sp_gmatch_overflowed(bytes);
        }
        bool ok = sp_gmatch_commit(bytes, text + i, 1);
        if (probed && !sp_gmatch_overflowed(bytes) &&
            (ok ? sp_gmatch_state(bytes) != probe : probe != SP_GSTATE_DEAD)) {
            bug("a commit and the trial feed of the same byte disagree", spec, spec_len, i);
        }
        if (!ok) {
            dead_bytes = i;
            break;
        }
    }
    bytes_full |= sp_gmatch_overflowed(bytes);

    /* Trial feeds only: the state ids of one matcher, never committed nor
     * maintained. */
    size_t dead_trial = n;
    sp_gstate_t s = sp_gmatch_state(trial);
    for (size_t i = 0; i < n; i++) {
        s = sp_gmatch_feed(trial, s, (unsigned char)text[i]);
        if (s == SP_GSTATE_DEAD) {
            dead_trial = i;
            break;
        }
    }

    int r = sp_gmatch_match(g, text, n);
    bool limited = r < 0 || sp_gmatch_overflowed(whole) || bytes_full ||
                   sp_gmatch_overflowed(trial);
    if (!limited) {
        bool ok_bytes = dead_bytes == n, ok_trial = dead_trial == n;
        if (ok_whole != ok_bytes || ok_bytes != ok_trial) {
            bug(ok_whole ? "the whole text was accepted but not byte by byte"
                         : "byte-by-byte feeding accepted what the whole commit refused",
                spec, spec_len, dead_bytes < dead_trial ? dead_bytes : dead_trial);
        }
        if (dead_bytes != dead_trial) {
            bug("byte-by-byte commits and trial feeds refused different bytes", spec, spec_len,
                dead_bytes);
        }
        bool acc = ok_whole && sp_gmatch_accepting(whole, sp_gmatch_state(whole));
        if ((r == 1) != acc) {
            bug("sp_gmatch_match disagrees with the matcher", spec, spec_len, n);
        }
        if (ok_whole) {
            view_t a, b, c;
            bool full = !observe(whole, sp_gmatch_state(whole), &a);
            full |= !observe(bytes, sp_gmatch_state(bytes), &b);
            full |= !observe(trial, s, &c);
            if (!full && (memcmp(&a, &b, sizeof a) != 0 || memcmp(&a, &c, sizeof a) != 0)) {
                bug("the end states differ (whole commit, byte by byte, trial feeds)", spec,
                    spec_len, n);
            }
        }
        if (schema != NULL && acc) {
            check_instance(schema, spec, spec_len, text, n);
        }
    }
    sp_gmatch_destroy(whole);
    sp_gmatch_destroy(bytes);
    sp_gmatch_destroy(trial);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t spec_len = nul != NULL ? (size_t)(nul - data) : size;
    size_t n = nul != NULL ? size - spec_len - 1 : 0;
    /* Exact-size heap copies so ASan sees any read past the end. */
    char *spec = malloc(spec_len ? spec_len : 1);
    char *text = malloc(n ? n : 1);
    if (spec == NULL || text == NULL) {
        free(spec);
        free(text);
        return 0;
    }
    memcpy(spec, data, spec_len);
    if (n) {
        memcpy(text, nul + 1, n);
    }

    char err[256] = "";
    sp_grammar_t *g = NULL;
    json_t *schema = json_loadb(spec, spec_len, JSON_DECODE_ANY, NULL);
    if (schema != NULL && !json_is_object(schema) && !json_is_boolean(schema)) {
        json_decref(schema);
        schema = NULL;
    }
    if (schema != NULL) {
        char *gbnf = NULL;
        size_t gbnf_len = 0;
        sp_status_t st = sp_schema_to_gbnf(schema, &gbnf, &gbnf_len, err, sizeof err);
        if (st == SP_OK) {
            if (gbnf == NULL || strlen(gbnf) != gbnf_len) {
                bug("the schema's GBNF is not a string of the reported length", spec, spec_len,
                    0);
            }
            st = sp_grammar_compile(gbnf, gbnf_len, &g, err, sizeof err);
            if (st != SP_OK && st != SP_ERR_TOO_LARGE && st != SP_ERR_NOMEM) {
                fprintf(stderr, "fuzz harness: grammar error: %s\n%.2000s\n", err, gbnf);
                bug("the schema translator wrote GBNF that does not compile", spec, spec_len, 0);
            }
            sp_free(gbnf);
        } else if (gbnf != NULL) {
            bug("a failed translation returned text", spec, spec_len, 0);
        }
        if (st != SP_OK && err[0] == '\0') {
            bug("a failed translation or compile gave no message", spec, spec_len, 0);
        }
    } else if (sp_grammar_compile(spec, spec_len, &g, err, sizeof err) != SP_OK) {
        if (g != NULL || err[0] == '\0') {
            bug("a failed compile returned a grammar or gave no message", spec, spec_len, 0);
        }
    }
    if (g != NULL) {
        bool have[256] = {false};
        for (size_t i = 0; i < n; i++) {
            have[(unsigned char)text[i]] = true;
        }
        (void)sp_grammar_needs_byte_outside(g, have);
        check_matching(g, spec, spec_len, text, n, schema);
        char *sent = malloc(GUIDED + COMPLETION);
        size_t k = sent ? guided_sentence(g, spec, spec_len, text, n, sent) : 0;
        if (k > 0) {
            int r = sp_gmatch_match(g, sent, k);
            if (r == 0) {
                bug("sp_gmatch_match refused a sentence the matcher walked", spec, spec_len, k);
            }
            if (schema != NULL && r == 1) {
                check_instance(schema, spec, spec_len, sent, k);
            }
        }
        free(sent);
        sp_grammar_release(g);
    }
    json_decref(schema);
    free(spec);
    free(text);
    return 0;
}
