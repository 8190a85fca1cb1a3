/*
 * test_tokenizer.c - the llama SentencePiece tokenizer against llama.cpp's test
 * vectors (tests/data/tokenizer), round trips, special tokens, hostile
 * vocabularies built in memory, and big or pathological inputs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "test.h"

#define TOKDIR "tests/data/tokenizer/"
#define SEP "\n__ggml_vocab_test__\n"

/* ---- helpers ----------------------------------------------------------- */

static char *
slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ASSERT(buf != NULL);
    ASSERT_EQ(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

typedef struct loaded {
    sp_gguf_t *g;
    sp_tokenizer_t *t;
} loaded_t;

static loaded_t
load_file(const char *path)
{
    loaded_t l = {0};
    char err[256] = "";
    sp_status_t st = sp_gguf_open(path, &l.g, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("open %s: %s", path, err);
    }
    st = sp_tokenizer_from_gguf(l.g, &l.t, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("tokenizer %s: %s", path, err);
    }
    return l;
}

static void
unload(loaded_t *l)
{
    sp_tokenizer_destroy(l->t);
    sp_gguf_close(l->g);
}

/* Tokenize into a malloc'd array (the count-then-fill protocol of sp_tokenize). */
static int32_t *
tokenize(const sp_tokenizer_t *t, const char *s, size_t len, bool add_bos, bool special,
         int64_t *n)
{
    int64_t need = sp_tokenize(t, s, len, add_bos, special, NULL, 0);
    ASSERT(need >= 0);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    ASSERT(ids != NULL);
    int64_t got = sp_tokenize(t, s, len, add_bos, special, ids, need);
    ASSERT_EQ(got, need);
    *n = need;
    return ids;
}

/* Concatenated pieces (special = false), malloc'd, NUL-terminated. */
static char *
detokenize(const sp_tokenizer_t *t, const int32_t *ids, int64_t n, size_t *len)
{
    size_t cap = 64, used = 0;
    char *s = malloc(cap);
    ASSERT(s != NULL);
    for (int64_t i = 0; i < n; i++) {
        int32_t k = sp_token_to_piece(t, ids[i], false, NULL, 0);
        ASSERT(k >= 0);
        while (used + (size_t)k + 1 > cap) {
            cap *= 2;
            s = realloc(s, cap);
            ASSERT(s != NULL);
        }
        ASSERT_EQ(sp_token_to_piece(t, ids[i], false, s + used, k), k);
        used += (size_t)k;
    }
    s[used] = '\0';
    *len = used;
    return s;
}

/* decode(encode(x)) == x, give or take the dummy-prefix space at the front. */
static void
check_round_trip(const sp_tokenizer_t *t, const char *s, size_t len)
{
    int64_t n;
    int32_t *ids = tokenize(t, s, len, false, false, &n);
    size_t dlen;
    char *d = detokenize(t, ids, n, &dlen);
    const char *p = d;
    if (dlen == len + 1 && d[0] == ' ') {
        p++;
        dlen--;
    }
    if (dlen != len || memcmp(p, s, len) != 0) {
        size_t at = 0;
        while (at < len && at < dlen && p[at] == s[at]) {
            at++;
        }
        size_t from = at > 8 ? at - 8 : 0;
        fprintf(stderr, "  first difference at byte %zu of %zu (got %zu):\n  in: ", at, len, dlen);
        for (size_t i = from; i < at + 8 && i < len; i++) {
            fprintf(stderr, " %02x", (unsigned char)s[i]);
        }
        fprintf(stderr, "\n  out:");
        for (size_t i = from; i < at + 8 && i < dlen; i++) {
            fprintf(stderr, " %02x", (unsigned char)p[i]);
        }
        fprintf(stderr, "\n");
        SP_TEST_FAIL("round trip of \"%.*s\" differs", (int)(len > 40 ? 40 : len), s);
    }
    free(d);
    free(ids);
}

/* Every string of NAME.inp must tokenize to the ids on the matching line of NAME.out. */
static void
check_vectors(const char *gguf, const char *inp, const char *outp)
{
    loaded_t l = load_file(gguf);
    size_t in_len, out_len;
    char *in = slurp(inp, &in_len), *out = slurp(outp, &out_len);
    ASSERT(in != NULL && out != NULL);

    int n_cases = 0;
    char *cur = in, *line = out;
    for (;;) {
        char *end = strstr(cur, SEP);
        if (end == NULL) {
            break;
        }
        char *eol = strchr(line, '\n');
        ASSERT(eol != NULL);
        *eol = '\0';
        int32_t want[1024];
        int n_want = 0;
        for (char *q = line; *q;) {
            char *next;
            long v = strtol(q, &next, 10);
            if (next == q) {
                break;
            }
            ASSERT(n_want < 1024);
            want[n_want++] = (int32_t)v;
            q = next;
        }
        size_t len = (size_t)(end - cur);
        int64_t n;
        int32_t *got = tokenize(l.t, cur, len, false, false, &n);
        bool same = n == n_want;
        for (int i = 0; same && i < n_want; i++) {
            same = got[i] == want[i];
        }
        if (!same) {
            fprintf(stderr, "  case %d \"%.*s\"\n  want:", n_cases, (int)len, cur);
            for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got: ");
            for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
            SP_TEST_FAIL("%s: case %d differs", inp, n_cases);
        }
        free(got);
        check_round_trip(l.t, cur, len);
        n_cases++;
        cur = end + strlen(SEP);
        line = eol + 1;
    }
    ASSERT_EQ(n_cases, 46);
    free(in);
    free(out);
    unload(&l);
}

/* ---- test vectors and real vocabularies -------------------------------- */

TEST(tokenizer_vectors_llama_spm)
{
    check_vectors(TOKDIR "ggml-vocab-llama-spm.gguf", TOKDIR "ggml-vocab-llama-spm.gguf.inp",
                  TOKDIR "ggml-vocab-llama-spm.gguf.out");
}

TEST(tokenizer_vectors_phi3)
{
    check_vectors(TOKDIR "ggml-vocab-phi-3.gguf", TOKDIR "ggml-vocab-phi-3.gguf.inp",
                  TOKDIR "ggml-vocab-phi-3.gguf.out");
}

TEST(tokenizer_baichuan_round_trip)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-baichuan.gguf");
    ASSERT_EQ(sp_tokenizer_n_vocab(l.t), 64000);
    ASSERT_EQ(sp_tokenizer_bos(l.t), 1);
    ASSERT_EQ(sp_tokenizer_eos(l.t), 2);
    size_t in_len;
    char *in = slurp(TOKDIR "ggml-vocab-llama-spm.gguf.inp", &in_len);
    ASSERT(in != NULL);
    int n_cases = 0;
    for (char *cur = in, *end; (end = strstr(cur, SEP)) != NULL; cur = end + strlen(SEP)) {
        check_round_trip(l.t, cur, (size_t)(end - cur));
        n_cases++;
    }
    ASSERT_EQ(n_cases, 46);
    free(in);
    unload(&l);
}

TEST(tokenizer_stories260k_bos)
{
    FILE *f = fopen("models/stories260K.gguf", "rb");
    if (f == NULL) {
        SKIP("models/stories260K.gguf not present");
    }
    fclose(f);
    loaded_t l = load_file("models/stories260K.gguf");
    ASSERT(sp_tokenizer_add_bos(l.t));
    int64_t n;
    int32_t *ids = tokenize(l.t, "Once upon a time", 16, true, false, &n);
    int32_t want[] = {1, 403, 407, 261, 378};
    ASSERT_EQ(n, 5);
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(ids[i], want[i]);
    }
    ASSERT(sp_tokenizer_is_eog(l.t, 2));
    ASSERT(!sp_tokenizer_is_eog(l.t, 1));
    free(ids);
    unload(&l);
}

TEST(tokenizer_llama_specials_and_pieces)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-llama-spm.gguf");
    const sp_tokenizer_t *t = l.t;
    ASSERT_EQ(sp_tokenizer_n_vocab(t), 32000);
    ASSERT_EQ(sp_tokenizer_bos(t), 1);
    ASSERT_EQ(sp_tokenizer_eos(t), 2);
    ASSERT(sp_tokenizer_is_eog(t, 2));
    ASSERT(!sp_tokenizer_is_eog(t, 15043));

    /* empty text: nothing, or BOS alone */
    int64_t n;
    int32_t *ids = tokenize(t, "", 0, true, false, &n);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(ids[0], 1);
    free(ids);

    /* parse_special: "<s>" and "</s>" are tokens, and text after a special gets the prefix */
    const char *s = "<s>Hello</s>";
    ids = tokenize(t, s, strlen(s), false, true, &n);
    ASSERT_EQ(n, 3);
    ASSERT_EQ(ids[0], 1);
    ASSERT_EQ(ids[1], 15043); /* "▁Hello" */
    ASSERT_EQ(ids[2], 2);
    free(ids);
    /* ...and without it they are text, which round-trips */
    ids = tokenize(t, s, strlen(s), false, false, &n);
    ASSERT(n > 3);
    for (int64_t i = 0; i < n; i++) {
        ASSERT(ids[i] != 1 && ids[i] != 2);
    }
    free(ids);
    check_round_trip(t, s, strlen(s));

    /* with BOS and a special in the middle */
    s = "Hello<s> world";
    ids = tokenize(t, s, strlen(s), true, true, &n);
    ASSERT(n >= 4);
    ASSERT_EQ(ids[0], 1);
    ASSERT_EQ(ids[1], 15043);
    ASSERT_EQ(ids[2], 1);
    size_t dlen;
    char *d = detokenize(t, ids + 3, n - 3, &dlen); /* the dummy prefix comes back after <s> */
    ASSERT_STR_EQ(d, "  world");
    free(d);
    free(ids);

    /* pieces: U+2581 -> ' ', <0x0A> -> '\n', control tokens only when special */
    char buf[32];
    ASSERT_EQ(sp_token_to_piece(t, 15043, false, buf, sizeof buf), 6);
    ASSERT(memcmp(buf, " Hello", 6) == 0);
    ASSERT_EQ(sp_token_to_piece(t, 13, false, buf, sizeof buf), 1);
    ASSERT_EQ(buf[0], '\n');
    ASSERT_EQ(sp_token_to_piece(t, 1, false, buf, sizeof buf), 0);
    ASSERT_EQ(sp_token_to_piece(t, 1, true, buf, sizeof buf), 3);
    ASSERT(memcmp(buf, "<s>", 3) == 0);
    ASSERT(sp_token_to_piece(t, 32000, false, buf, sizeof buf) < 0);
    ASSERT(sp_token_to_piece(t, -1, false, buf, sizeof buf) < 0);
    /* short buffer: the full length comes back, nothing past cap is written */
    memset(buf, 'x', sizeof buf);
    ASSERT_EQ(sp_token_to_piece(t, 15043, false, buf, 3), 6);
    ASSERT(memcmp(buf, " He", 3) == 0);
    ASSERT_EQ(buf[3], 'x');
    sp_str_t raw = sp_tokenizer_token_text(t, 15043);
    ASSERT(raw.len == 8 && memcmp(raw.ptr, "\xE2\x96\x81Hello", 8) == 0);

    /* short output array: the total comes back, nothing past cap is written */
    int32_t few[3] = {-7, -7, -7};
    ASSERT_EQ(sp_tokenize(t, "Hello world", 11, true, false, few, 2), 3);
    ASSERT_EQ(few[0], 1);
    ASSERT_EQ(few[1], 15043);
    ASSERT_EQ(few[2], -7);
    ASSERT(sp_tokenize(t, "x", 1, false, false, NULL, 4) < 0);
    unload(&l);
}

TEST(tokenizer_phi3_user_defined_and_eog)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-phi-3.gguf");
    const sp_tokenizer_t *t = l.t;
    ASSERT_EQ(sp_tokenizer_eos(t), 32000);
    ASSERT(sp_tokenizer_is_eog(t, 32000)); /* <|endoftext|> */
    ASSERT(sp_tokenizer_is_eog(t, 32007)); /* <|end|> */
    int64_t n;
    const char *s = "<|user|>\nHi<|end|>";
    int32_t *ids = tokenize(t, s, strlen(s), false, true, &n);
    ASSERT(n >= 3);
    ASSERT_EQ(ids[0], 32010);
    ASSERT_EQ(ids[n - 1], 32007);
    free(ids);
    /* "</s>" is a user-defined token in phi-3: split out even without parse_special,
     * as Hugging Face does with added tokens */
    ids = tokenize(t, "a</s>", 5, false, false, &n);
    ASSERT(n >= 2);
    ASSERT_EQ(ids[n - 1], 2);
    free(ids);
    char buf[16];
    ASSERT_EQ(sp_token_to_piece(t, 2, false, buf, sizeof buf), 4); /* user-defined: always text */
    unload(&l);
}

/* ---- big and hostile inputs -------------------------------------------- */

static uint64_t
rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double
time_tokenize(const sp_tokenizer_t *t, const char *s, size_t len, const char *what, int64_t *n)
{
    int64_t t0 = sp_time_ns();
    int64_t need = sp_tokenize(t, s, len, true, false, NULL, 0);
    double ms = (double)(sp_time_ns() - t0) / 1e6;
    ASSERT(need > 0);
    fprintf(stderr, "  %s: %zu bytes -> %lld tokens in %.1f ms\n", what, len, (long long)need, ms);
    *n = need;
    return ms;
}

TEST(tokenizer_megabyte_inputs)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-llama-spm.gguf");
    const size_t mb = 1 << 20;
    char *buf = malloc(mb);
    ASSERT(buf != NULL);
    int64_t n;
    /* Bounds are loose on purpose (sanitizer builds on a busy machine): what
     * they catch is quadratic behaviour, which would take minutes. */
    const double limit_ms = 5000;

    size_t in_len;
    char *in = slurp(TOKDIR "ggml-vocab-llama-spm.gguf.inp", &in_len);
    ASSERT(in != NULL);
    for (size_t i = 0; i < mb; i++) {
        buf[i] = in[i % in_len] == '\0' ? ' ' : in[i % in_len];
    }
    free(in);
    ASSERT(time_tokenize(l.t, buf, mb, "1 MiB of test text", &n) < limit_ms);
    ASSERT(n > 100000);

    uint64_t seed = 42;
    for (size_t i = 0; i < mb; i += 8) {
        uint64_t r = rng_next(&seed);
        memcpy(buf + i, &r, 8);
    }
    ASSERT(time_tokenize(l.t, buf, mb, "1 MiB of random bytes", &n) < limit_ms);
    /* byte fallback makes even invalid UTF-8 lossless */
    check_round_trip(l.t, buf, mb);
    free(buf);
    unload(&l);
}

/* One repeated character: every pair has the same score, the whole input is
 * one word, and the merge queue holds about a million pairs. */
TEST(tokenizer_megabyte_pathological)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-llama-spm.gguf");
    const size_t mb = 1 << 20;
    char *buf = malloc(mb);
    ASSERT(buf != NULL);
    int64_t n;
    const double limit_ms = 5000;
    memset(buf, 'a', mb);
    ASSERT(time_tokenize(l.t, buf, mb, "1 MiB of 'a'", &n) < limit_ms);
    memset(buf, ' ', mb);
    ASSERT(time_tokenize(l.t, buf, mb, "1 MiB of ' '", &n) < limit_ms);
    free(buf);
    unload(&l);
}

TEST(tokenizer_invalid_utf8)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-llama-spm.gguf");
    /* truncated sequences at the very end, lone continuation bytes, overlong
     * forms, NUL bytes: each piece is an exact heap copy so ASan sees any overread */
    static const char *cases[] = {"\xE2",         "\xE2\x96",   "\xF0\x9F\x98", "a\xF4",
                                  "\x80\x80\x80", "\xC0\xAF",   "\xFF\xFE",     "ok\xED\xA0\x80",
                                  "\xF8\x88\x80\x80\x80"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = strlen(cases[i]);
        char *copy = malloc(len);
        memcpy(copy, cases[i], len);
        check_round_trip(l.t, copy, len);
        free(copy);
    }
    char nul[3] = {'a', '\0', 'b'};
    check_round_trip(l.t, nul, 3);
    unload(&l);
}

/* ---- hostile vocabularies, built in memory ----------------------------- */

typedef struct vbuf {
    uint8_t *p;
    size_t n, cap;
} vbuf_t;

static void
put(vbuf_t *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        ASSERT(b->p != NULL);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_u32(vbuf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(vbuf_t *b, uint64_t v) { put(b, &v, 8); }
static void
put_str(vbuf_t *b, const char *s, size_t n)
{
    put_u64(b, n);
    put(b, s, n);
}
static void
put_key(vbuf_t *b, const char *key, uint32_t type)
{
    put_str(b, key, strlen(key));
    put_u32(b, type);
}

/* Knobs for one vocabulary; defaults make a valid one (see vocab_defaults). */
typedef struct vocab {
    const char *model;     /* NULL: key absent */
    bool with_bytes;       /* the 256 <0xNN> tokens */
    float bc_score;        /* score of "bc" (the tie test sets it equal to "ab") */
    uint32_t scores_elem;  /* element type of tokenizer.ggml.scores */
    int scores_delta;      /* entries beyond (or short of) the token count */
    uint32_t types_elem;
    int types_delta;
    bool omit_scores, omit_types, tokens_as_ints;
    int64_t bos;           /* stored as bos_type */
    uint32_t bos_type;
    int bad_at;            /* index of a token replaced by bad_text / bad_type, -1: none */
    const char *bad_text;
    size_t bad_len;
    int32_t bad_type;
    bool nan_score;
} vocab_t;

static vocab_t
vocab_defaults(void)
{
    vocab_t v = {.model = "llama", .with_bytes = true, .bc_score = -0.3f,
                 .scores_elem = SP_GGUF_TYPE_FLOAT32, .types_elem = SP_GGUF_TYPE_INT32,
                 .bos = 1, .bos_type = SP_GGUF_TYPE_UINT32, .bad_at = -1};
    return v;
}

typedef struct tok_def {
    char text[16];
    float score;
    int32_t type;
} tok_def_t;

/* unk, <s>, </s>, [256 bytes], "▁", "a", "b", "c", "ab", "bc", "<0xZZ>" (plain text) */
static int
vocab_tokens(const vocab_t *v, tok_def_t *t)
{
    int n = 0;
    t[n++] = (tok_def_t){"<unk>", 0, 2};
    t[n++] = (tok_def_t){"<s>", 0, 3};
    t[n++] = (tok_def_t){"</s>", 0, 3};
    if (v->with_bytes) {
        for (int b = 0; b < 256; b++) {
            t[n] = (tok_def_t){"", 0, 6};
            snprintf(t[n].text, sizeof t[n].text, "<0x%02X>", b);
            n++;
        }
    }
    t[n++] = (tok_def_t){"\xE2\x96\x81", -1, 1};
    t[n++] = (tok_def_t){"a", -2, 1};
    t[n++] = (tok_def_t){"b", -2, 1};
    t[n++] = (tok_def_t){"c", -2, 1};
    t[n++] = (tok_def_t){"ab", -0.5f, 1};
    t[n++] = (tok_def_t){"bc", v->bc_score, 1};
    t[n++] = (tok_def_t){"<0xZZ>", -9, 1};
    return n;
}

static uint8_t *
build_vocab(const vocab_t *v, size_t *len)
{
    tok_def_t defs[300];
    int n = vocab_tokens(v, defs);
    vbuf_t b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0); /* tensors */
    uint64_t n_kv = 3 + (v->model != NULL) + !v->omit_scores + !v->omit_types;
    put_u64(&b, n_kv);
    if (v->model) {
        put_key(&b, "tokenizer.ggml.model", SP_GGUF_TYPE_STRING);
        put_str(&b, v->model, strlen(v->model));
    }
    put_key(&b, "tokenizer.ggml.tokens", SP_GGUF_TYPE_ARRAY);
    if (v->tokens_as_ints) {
        put_u32(&b, SP_GGUF_TYPE_INT32);
        put_u64(&b, (uint64_t)n);
        for (int i = 0; i < n; i++) put_u32(&b, (uint32_t)i);
    } else {
        put_u32(&b, SP_GGUF_TYPE_STRING);
        put_u64(&b, (uint64_t)n);
        for (int i = 0; i < n; i++) {
            if (i == v->bad_at && v->bad_text != NULL) {
                put_str(&b, v->bad_text, v->bad_len);
            } else {
                put_str(&b, defs[i].text, strlen(defs[i].text));
            }
        }
    }
    if (!v->omit_scores) {
        uint64_t ns = (uint64_t)(n + v->scores_delta);
        put_key(&b, "tokenizer.ggml.scores", SP_GGUF_TYPE_ARRAY);
        put_u32(&b, v->scores_elem);
        put_u64(&b, ns);
        for (uint64_t i = 0; i < ns; i++) {
            float s = i < (uint64_t)n ? defs[i].score : 0.0f;
            if (v->nan_score && i == 5) {
                s = NAN;
            }
            if (v->scores_elem == SP_GGUF_TYPE_UINT8) {
                uint8_t u = 0;
                put(&b, &u, 1);
            } else {
                put(&b, &s, 4);
            }
        }
    }
    if (!v->omit_types) {
        uint64_t nt = (uint64_t)(n + v->types_delta);
        put_key(&b, "tokenizer.ggml.token_type", SP_GGUF_TYPE_ARRAY);
        put_u32(&b, v->types_elem);
        put_u64(&b, nt);
        for (uint64_t i = 0; i < nt; i++) {
            int32_t ty = i < (uint64_t)n ? defs[i].type : 1;
            if ((int)i == v->bad_at && v->bad_type != 0) {
                ty = v->bad_type;
            }
            if (v->types_elem == SP_GGUF_TYPE_UINT8) {
                uint8_t u = (uint8_t)ty;
                put(&b, &u, 1);
            } else {
                put(&b, &ty, 4);
            }
        }
    }
    put_key(&b, "tokenizer.ggml.bos_token_id", v->bos_type);
    if (v->bos_type == SP_GGUF_TYPE_STRING) {
        put_str(&b, "1", 1);
    } else {
        put_u32(&b, (uint32_t)v->bos);
    }
    put_key(&b, "tokenizer.ggml.eos_token_id", SP_GGUF_TYPE_INT32);
    put_u32(&b, 2);
    put_key(&b, "tokenizer.ggml.add_bos_token", SP_GGUF_TYPE_BOOL);
    uint8_t yes = 1;
    put(&b, &yes, 1);
    *len = b.n;
    return b.p;
}

/* Load v; return the status and leave the error line in err. */
static sp_status_t
try_vocab(const vocab_t *v, sp_tokenizer_t **out, char *err, size_t err_len)
{
    size_t len;
    uint8_t *bytes = build_vocab(v, &len);
    sp_gguf_t *g = NULL;
    sp_status_t st = sp_gguf_open_mem(bytes, len, "mem.gguf", &g, err, err_len);
    if (st == SP_OK) {
        st = sp_tokenizer_from_gguf(g, out, err, err_len);
        if (st != SP_OK) {
            ASSERT(*out == NULL);
        }
    }
    sp_gguf_close(g);
    free(bytes); /* the tokenizer owns copies of its texts */
    return st;
}

static void
expect_reject(const vocab_t *v, sp_status_t want, const char *key)
{
    char err[256] = "";
    sp_tokenizer_t *t = NULL;
    sp_status_t st = try_vocab(v, &t, err, sizeof err);
    if (st != want) {
        SP_TEST_FAIL("status %d, want %d (%s)", (int)st, (int)want, err);
    }
    ASSERT(t == NULL);
    if (strstr(err, "mem.gguf") == NULL || strstr(err, key) == NULL) {
        SP_TEST_FAIL("message \"%s\" does not name mem.gguf and %s", err, key);
    }
}

TEST(tokenizer_small_vocab_merges)
{
    char err[256] = "";
    sp_tokenizer_t *t = NULL;
    vocab_t v = vocab_defaults();
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    int32_t sp = 3 + 256, a = sp + 1, b = sp + 2, c = sp + 3, ab = sp + 4, bc = sp + 5;
    int32_t ids[8];
    /* "bc" scores higher than "ab": ▁ a bc */
    ASSERT_EQ(sp_tokenize(t, "abc", 3, false, false, ids, 8), 3);
    ASSERT_EQ(ids[0], sp);
    ASSERT_EQ(ids[1], a);
    ASSERT_EQ(ids[2], bc);
    /* bytes fall back to <0xNN>: 'z' is 0x7A at id 3 + 0x7A */
    ASSERT_EQ(sp_tokenize(t, "z", 1, false, false, ids, 8), 2);
    ASSERT_EQ(ids[1], 3 + 0x7A);
    /* "<0xZZ>" is plain text here: it decodes as itself */
    char buf[16];
    ASSERT_EQ(sp_token_to_piece(t, sp + 6, false, buf, sizeof buf), 6);
    ASSERT(memcmp(buf, "<0xZZ>", 6) == 0);
    (void)b;
    sp_tokenizer_destroy(t);

    /* equal scores: the leftmost pair merges first: ▁ ab c */
    v.bc_score = -0.5f;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    ASSERT_EQ(sp_tokenize(t, "abc", 3, false, false, ids, 8), 3);
    ASSERT_EQ(ids[1], ab);
    ASSERT_EQ(ids[2], c);
    sp_tokenizer_destroy(t);

    /* no byte tokens: unknown characters become unk */
    v = vocab_defaults();
    v.with_bytes = false;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    ASSERT_EQ(sp_tokenize(t, "az", 2, false, false, ids, 8), 3);
    ASSERT_EQ(ids[1], 4);
    ASSERT_EQ(ids[2], 0);
    sp_tokenizer_destroy(t);

    /* no scores and no types: loads; <0xNN> spellings still act as bytes */
    v = vocab_defaults();
    v.omit_scores = true;
    v.omit_types = true;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    ASSERT_EQ(sp_token_to_piece(t, 3 + 0x41, false, buf, sizeof buf), 1);
    ASSERT_EQ(buf[0], 'A');
    ASSERT_EQ(sp_token_to_piece(t, 1, false, buf, sizeof buf), 0); /* bos became control */
    sp_tokenizer_destroy(t);

    /* bos stored as INT32 works too */
    v = vocab_defaults();
    v.bos_type = SP_GGUF_TYPE_INT32;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    ASSERT_EQ(sp_tokenizer_bos(t), 1);
    sp_tokenizer_destroy(t);
}

TEST(tokenizer_rejects_bad_vocab)
{
    vocab_t v = vocab_defaults();
    v.model = "gpt2";
    expect_reject(&v, SP_ERR_UNSUPPORTED, "tokenizer.ggml.model");
    v = vocab_defaults();
    v.model = NULL;
    expect_reject(&v, SP_ERR_NOT_FOUND, "tokenizer.ggml.model");

    v = vocab_defaults(); /* G14 */
    v.scores_elem = SP_GGUF_TYPE_UINT8;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.scores");
    v = vocab_defaults();
    v.types_elem = SP_GGUF_TYPE_UINT8;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.token_type");
    v = vocab_defaults();
    v.tokens_as_ints = true;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.tokens");

    v = vocab_defaults(); /* G15 */
    v.scores_delta = -1;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.scores");
    v = vocab_defaults();
    v.types_delta = 1;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.token_type");
    v = vocab_defaults();
    v.bos = 100000;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.bos_token_id");
    v = vocab_defaults();
    v.bos_type = SP_GGUF_TYPE_STRING;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.bos_token_id");

    v = vocab_defaults(); /* G16: byte tokens spelled strictly, lengths bounded */
    static const char *bad_bytes[] = {"<0x-1>", "<0xZZ>", "<0x1>", "<0x123>", "<0x0A", "0x0A>"};
    for (size_t i = 0; i < sizeof(bad_bytes) / sizeof(bad_bytes[0]); i++) {
        v.bad_at = 3 + 10;
        v.bad_text = bad_bytes[i];
        v.bad_len = strlen(bad_bytes[i]);
        expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.token_type");
    }
    static char longtok[SP_TOKEN_MAX_BYTES + 1];
    memset(longtok, 'x', sizeof longtok);
    v = vocab_defaults();
    v.bad_at = 3 + 256 + 1;
    v.bad_text = longtok;
    v.bad_len = sizeof longtok;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.tokens");
    v.bad_len = SP_TOKEN_MAX_BYTES; /* exactly the limit is fine */
    char err[256];
    sp_tokenizer_t *t = NULL;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    sp_tokenizer_destroy(t);

    v = vocab_defaults();
    v.bad_at = 3 + 256 + 1;
    v.bad_type = 7;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.token_type");
    v.bad_type = -1;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.token_type");
    v = vocab_defaults();
    v.nan_score = true;
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.scores");
}

TEST(tokenizer_load_oom_no_leak)
{
    char err[256];
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open(TOKDIR "ggml-vocab-phi-3.gguf", &g, err, sizeof err));
    size_t base = sp_alloc_bytes_in_use();
    int failures = 0;
    for (int64_t k = 0; k < 64; k++) {
        sp_tokenizer_t *t = NULL;
        sp_alloc_fail_after(k);
        sp_status_t st = sp_tokenizer_from_gguf(g, &t, err, sizeof err);
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            int32_t ids[4];
            ASSERT_EQ(sp_tokenize(t, "Hello", 5, false, false, ids, 4), 1);
            sp_tokenizer_destroy(t);
            break;
        }
        ASSERT_EQ(st, SP_ERR_NOMEM);
        ASSERT(t == NULL);
        ASSERT_EQ(sp_alloc_bytes_in_use(), base);
        failures++;
    }
    ASSERT(failures > 3);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base);

    /* tokenize under OOM: an error, never a crash or a leak */
    sp_tokenizer_t *t = NULL;
    ASSERT_OK(sp_tokenizer_from_gguf(g, &t, err, sizeof err));
    size_t base2 = sp_alloc_bytes_in_use();
    for (int64_t k = 0; k < 6; k++) {
        int32_t ids[64];
        sp_alloc_fail_after(k);
        int64_t n = sp_tokenize(t, "<s>Hello world</s>", 18, true, true, ids, 64);
        sp_alloc_fail_after(-1);
        ASSERT(n == SP_ERR_NOMEM || n == 5);
        ASSERT_EQ(sp_alloc_bytes_in_use(), base2);
    }
    sp_tokenizer_destroy(t);
    sp_gguf_close(g);
}
