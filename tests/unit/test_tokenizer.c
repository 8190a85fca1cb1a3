/*
 * test_tokenizer.c - the llama SentencePiece tokenizer against llama.cpp's test
 * vectors (tests/data/tokenizer), round trips, special tokens, hostile
 * vocabularies built in memory, and big or pathological inputs.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"
#include "sampan/log.h"
#include "test.h"

#define TOKDIR "tests/data/tokenizer/"
/* The newer set: vectors in tests/data/tokenizer-2026/, the vocabularies
 * shipped there xz-compressed and unpacked by `make unit` into UNPACKED. */
#define TOKDIR2026 "tests/data/tokenizer-2026/"
#define UNPACKED "build/testdata/"
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

/* Tokenize into a malloc'd array (the count-then-fill protocol of sp_tokenizer_encode). */
static int32_t *
tokenize(const sp_tokenizer_t *t, const char *s, size_t len, bool add_bos, bool special,
         int64_t *n)
{
    int64_t need = sp_tokenizer_encode(t, s, len, add_bos, special, NULL, 0);
    ASSERT(need >= 0);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof(int32_t));
    ASSERT(ids != NULL);
    int64_t got = sp_tokenizer_encode(t, s, len, add_bos, special, ids, need);
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
        int32_t k = sp_tokenizer_piece(t, ids[i], false, NULL, 0);
        ASSERT(k >= 0);
        while (used + (size_t)k + 1 > cap) {
            cap *= 2;
            s = realloc(s, cap);
            ASSERT(s != NULL);
        }
        ASSERT_EQ(sp_tokenizer_piece(t, ids[i], false, s + used, k), k);
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

/* The tokenizer.ggml.model string of an open file ("llama", "gpt2", "bert"). */
static bool
model_is(const loaded_t *l, const char *want)
{
    sp_str_t m = {"", 0};
    char err[128];
    return sp_gguf_get_str(l->g, "tokenizer.ggml.model", &m, err, sizeof err) == SP_OK &&
           sp_str_eq_c(m, want);
}

/*
 * Every string of INP must tokenize (no BOS, specials not parsed: how the
 * vectors were made) to the ids on the matching line of OUT. Each mismatch is
 * printed with the text, expected and actual ids; returns the number of
 * mismatches and adds the cases run to *n_cases. SPM and BPE also round-trip.
 */
static int
check_vectors(const char *gguf, const char *inp, const char *outp, int *n_cases)
{
    loaded_t l = load_file(gguf);
    size_t in_len, out_len;
    char *in = slurp(inp, &in_len), *out = slurp(outp, &out_len);
    ASSERT(in != NULL && out != NULL);
    /* WordPiece lowercases and drops accents; Unigram's charsmap normalises (NFKC)
     * and may collapse spaces. */
    bool lossless = !model_is(&l, "bert") && !model_is(&l, "t5");

    int n = 0, bad = 0;
    char *cur = in, *line = out;
    for (bool last = false; !last;) {
        /* each string ends with SEP; in some files the last one ends the file instead */
        char *end = strstr(cur, SEP);
        if (end == NULL) {
            if (*cur == '\0') {
                break;
            }
            end = cur + strlen(cur);
            last = true;
        }
        char *eol = strchr(line, '\n');
        ASSERT(eol != NULL);
        *eol = '\0';
        static int32_t want[4096];
        int n_want = 0;
        for (char *q = line; *q;) {
            char *next;
            long v = strtol(q, &next, 10);
            if (next == q) {
                break;
            }
            ASSERT(n_want < 4096);
            want[n_want++] = (int32_t)v;
            q = next;
        }
        size_t len = (size_t)(end - cur);
        int64_t got_n;
        int32_t *got = tokenize(l.t, cur, len, false, false, &got_n);
        bool same = got_n == n_want;
        for (int i = 0; same && i < n_want; i++) {
            same = got[i] == want[i];
        }
        if (!same) {
            fprintf(stderr, "  MISMATCH %s case %d \"%.*s\"\n    want:", inp, n, (int)len, cur);
            for (int i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n    got: ");
            for (int64_t i = 0; i < got_n; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
            bad++;
        }
        free(got);
        if (lossless) {
            check_round_trip(l.t, cur, len);
        }
        n++;
        cur = last ? end : end + strlen(SEP);
        line = eol + 1;
    }
    ASSERT(n > 0 && *line == '\0'); /* one line of ids per string, no more */
    *n_cases += n;
    free(in);
    free(out);
    unload(&l);
    return bad;
}

/* ---- test vectors and real vocabularies -------------------------------- */

/* Vocabularies whose tokenizer model is not here yet: their vectors (made
 * with llama.cpp, see the folder's README) wait, and the test says so, while
 * loading fails as unsupported; once it loads they run like the others. */
static const char *const pending[][2] = {
    {"ggml-vocab-nomic-bert-moe.gguf", "Unigram (\"t5\") tokenizer model not supported yet"},
};

typedef struct vec_totals {
    int n_vocab, n_cases, n_bad, n_skipped;
} vec_totals_t;

/* Every NAME.gguf.inp/.out pair in dir whose NAME.gguf is in dir or in
 * UNPACKED; the ones without a vocabulary are counted and named. */
static void
run_vector_dir(const char *dir, vec_totals_t *tot)
{
    DIR *d = opendir(dir);
    ASSERT(d != NULL);
    char names[64][128];
    int n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t k = strlen(e->d_name);
        if (k > 4 && k < 120 && strcmp(e->d_name + k - 4, ".inp") == 0 && n_names < 64) {
            memcpy(names[n_names], e->d_name, k - 4);
            names[n_names++][k - 4] = '\0';
        }
    }
    closedir(d);
    qsort(names, (size_t)n_names, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 0; i < n_names; i++) {
        char gguf[256], inp[256], outp[256];
        snprintf(gguf, sizeof gguf, "%s%.120s", dir, names[i]);
        snprintf(inp, sizeof inp, "%s%.120s.inp", dir, names[i]);
        snprintf(outp, sizeof outp, "%s%.120s.out", dir, names[i]);
        FILE *f = fopen(gguf, "rb");
        if (f == NULL) {
            snprintf(gguf, sizeof gguf, UNPACKED "%.120s", names[i]);
            f = fopen(gguf, "rb");
        }
        if (f == NULL) {
            fprintf(stderr, "  %-34s no vocabulary here (vectors only)\n", names[i]);
            continue;
        }
        fclose(f);
        const char *why = NULL;
        for (size_t k = 0; k < sizeof pending / sizeof pending[0]; k++) {
            if (strcmp(names[i], pending[k][0]) == 0) {
                why = pending[k][1];
            }
        }
        if (why != NULL) {
            sp_gguf_t *g = NULL;
            sp_tokenizer_t *t = NULL;
            char err[256] = "";
            ASSERT_OK(sp_gguf_open(gguf, &g, err, sizeof err));
            sp_status_t st = sp_tokenizer_from_gguf(g, &t, err, sizeof err);
            sp_tokenizer_destroy(t);
            sp_gguf_close(g);
            if (st == SP_ERR_UNSUPPORTED) {
                fprintf(stderr, "  %-34s SKIPPED: %s (%s)\n", names[i], why, err);
                tot->n_skipped++;
                continue;
            }
        }
        int cases = 0;
        int bad = check_vectors(gguf, inp, outp, &cases);
        fprintf(stderr, "  %-34s %2d vectors, %d mismatches\n", names[i], cases, bad);
        tot->n_vocab++;
        tot->n_cases += cases;
        tot->n_bad += bad;
    }
}

TEST(tokenizer_vectors_all)
{
    vec_totals_t tot = {0};
    run_vector_dir(TOKDIR, &tot);
    fprintf(stderr, "  newer set (%s, vocabularies from %s):\n", TOKDIR2026, UNPACKED);
    int before = tot.n_vocab;
    run_vector_dir(TOKDIR2026, &tot);
    fprintf(stderr, "  tokenizer vectors: %d vectors over %d vocabularies, %d mismatches, "
            "%d vocabularies skipped\n", tot.n_cases, tot.n_vocab, tot.n_bad, tot.n_skipped);
    ASSERT_EQ(tot.n_bad, 0);
    /* the older set's own vocabularies and the three whose vectors wait for
     * the newer set's files (llama-bpe, qwen2, command-r) */
    ASSERT(before >= 13);
    /* `make unit` unpacks the newer set: all of it runs or is named as skipped */
    ASSERT(tot.n_vocab - before + tot.n_skipped >= 7);
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
    ASSERT_EQ(sp_tokenizer_piece(t, 15043, false, buf, sizeof buf), 6);
    ASSERT(memcmp(buf, " Hello", 6) == 0);
    ASSERT_EQ(sp_tokenizer_piece(t, 13, false, buf, sizeof buf), 1);
    ASSERT_EQ(buf[0], '\n');
    ASSERT_EQ(sp_tokenizer_piece(t, 1, false, buf, sizeof buf), 0);
    ASSERT_EQ(sp_tokenizer_piece(t, 1, true, buf, sizeof buf), 3);
    ASSERT(memcmp(buf, "<s>", 3) == 0);
    ASSERT(sp_tokenizer_piece(t, 32000, false, buf, sizeof buf) < 0);
    ASSERT(sp_tokenizer_piece(t, -1, false, buf, sizeof buf) < 0);
    /* short buffer: the full length comes back, nothing past cap is written */
    memset(buf, 'x', sizeof buf);
    ASSERT_EQ(sp_tokenizer_piece(t, 15043, false, buf, 3), 6);
    ASSERT(memcmp(buf, " He", 3) == 0);
    ASSERT_EQ(buf[3], 'x');
    sp_str_t raw = sp_tokenizer_token_text(t, 15043);
    ASSERT(raw.len == 8 && memcmp(raw.ptr, "\xE2\x96\x81Hello", 8) == 0);

    /* short output array: the total comes back, nothing past cap is written */
    int32_t few[3] = {-7, -7, -7};
    ASSERT_EQ(sp_tokenizer_encode(t, "Hello world", 11, true, false, few, 2), 3);
    ASSERT_EQ(few[0], 1);
    ASSERT_EQ(few[1], 15043);
    ASSERT_EQ(few[2], -7);
    ASSERT(sp_tokenizer_encode(t, "x", 1, false, false, NULL, 4) < 0);
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
    ASSERT_EQ(sp_tokenizer_piece(t, 2, false, buf, sizeof buf), 4); /* user-defined: always text */
    unload(&l);
}

/* ---- byte-level BPE and WordPiece --------------------------------------- */

TEST(tokenizer_bpe_specials_and_pieces)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-gpt-2.gguf");
    const sp_tokenizer_t *t = l.t;
    ASSERT_EQ(sp_tokenizer_n_vocab(t), 50257);
    ASSERT_EQ(sp_tokenizer_eos(t), 50256);
    ASSERT(sp_tokenizer_is_eog(t, 50256));
    ASSERT(!sp_tokenizer_add_bos(t));
    int64_t n;
    const char *s = "Hello<|endoftext|> world";
    int32_t *ids = tokenize(t, s, strlen(s), true, true, &n);
    ASSERT_EQ(n, 3);
    ASSERT_EQ(ids[0], 15496);
    ASSERT_EQ(ids[1], 50256);
    ASSERT_EQ(ids[2], 995);
    free(ids);
    ids = tokenize(t, s, strlen(s), true, false, &n); /* not parsed: ordinary text */
    ASSERT(n > 3);
    for (int64_t i = 0; i < n; i++) {
        ASSERT(ids[i] != 50256);
    }
    free(ids);
    check_round_trip(t, s, strlen(s));
    char buf[32];
    ASSERT_EQ(sp_tokenizer_piece(t, 995, false, buf, sizeof buf), 6); /* "Ġworld" */
    ASSERT(memcmp(buf, " world", 6) == 0);
    ASSERT_EQ(sp_tokenizer_piece(t, 50256, false, buf, sizeof buf), 0);
    ASSERT_EQ(sp_tokenizer_piece(t, 50256, true, buf, sizeof buf), 13);
    unload(&l);

    /* deepseek: add_bos from the file; BOS is its control token */
    l = load_file(TOKDIR "ggml-vocab-deepseek-coder.gguf");
    ASSERT(sp_tokenizer_add_bos(l.t));
    ids = tokenize(l.t, "x", 1, true, false, &n);
    ASSERT_EQ(ids[0], 32013);
    free(ids);
    unload(&l);

    /* MPT: runs of spaces are user-defined tokens, split out even without parse_special */
    l = load_file(TOKDIR "ggml-vocab-mpt.gguf");
    ids = tokenize(l.t, "a    b", 6, false, false, &n);
    ASSERT(n >= 3);
    sp_str_t sp4 = sp_tokenizer_token_text(l.t, ids[1]);
    ASSERT(sp4.len == 4 && memcmp(sp4.ptr, "    ", 4) == 0);
    free(ids);
    unload(&l);
}

TEST(tokenizer_wpm_basics)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-bert-bge.gguf");
    const sp_tokenizer_t *t = l.t;
    int64_t n;
    /* [CLS] hello , world ! [SEP]; accents stripped and lowercased */
    const char *s = "H\xC3\xA9llo, WORLD!";
    int32_t *ids = tokenize(t, s, strlen(s), true, false, &n);
    int32_t want[] = {101, 7592, 1010, 2088, 999, 102};
    ASSERT_EQ(n, 6);
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ(ids[i], want[i]);
    }
    free(ids);
    /* a word of 101 characters is [UNK] as a whole; control characters vanish */
    char word[101];
    memset(word, 'a', sizeof word);
    ids = tokenize(t, word, sizeof word, false, false, &n);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(ids[0], 100);
    free(ids);
    ids = tokenize(t, "\x01\x7f\xC2\x85", 4, false, false, &n);
    ASSERT_EQ(n, 0);
    free(ids);
    char buf[32];
    ASSERT_EQ(sp_tokenizer_piece(t, 7592, false, buf, sizeof buf), 6); /* "▁hello" */
    ASSERT(memcmp(buf, " hello", 6) == 0);
    ASSERT_EQ(sp_tokenizer_piece(t, 101, false, buf, sizeof buf), 0);
    unload(&l);
}

/* Streaming: never half a UTF-8 character out, whatever the pieces are. */
TEST(tokenizer_detok_streaming)
{
    loaded_t l = load_file(TOKDIR "ggml-vocab-llama-spm.gguf");
    const sp_tokenizer_t *t = l.t;
    int64_t n;
    const char *s = "\xF0\x9F\xA6\x99 ok \xE4\xB8\xAD";
    int32_t *ids = tokenize(t, s, strlen(s), false, false, &n);
    char out[256], buf[SP_TOKEN_MAX_BYTES + 8];
    size_t used = 0;
    sp_detok_t d = {0};
    for (int64_t i = 0; i < n; i++) {
        int32_t k = sp_detok_push(t, &d, ids[i], false, buf, (int32_t)sizeof buf);
        ASSERT(k >= 0);
        /* what came out so far ends on a character boundary */
        memcpy(out + used, buf, (size_t)k);
        used += (size_t)k;
        ASSERT(used == 0 || ((unsigned char)out[used - 1] & 0xC0) != 0xC0);
        if (used > 0 && ((unsigned char)out[used - 1] & 0x80)) {
            size_t j = used - 1;
            while (j > 0 && ((unsigned char)out[j] & 0xC0) == 0x80) {
                j--;
            }
            unsigned char lead = (unsigned char)out[j];
            size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            ASSERT_EQ(used - j, need);
        }
    }
    used += (size_t)sp_detok_flush(&d, out + used, 4);
    ASSERT_EQ(used, strlen(s) + 1); /* the dummy-prefix space */
    ASSERT(memcmp(out + 1, s, strlen(s)) == 0);
    /* a stray continuation byte is not held; an unfinished lead is, until flushed */
    sp_detok_t d2 = {0};
    ASSERT_EQ(sp_detok_push(t, &d2, 3 + 0x80, false, buf, (int32_t)sizeof buf), 1);
    ASSERT_EQ(sp_detok_push(t, &d2, 3 + 0xE4, false, buf, (int32_t)sizeof buf), 0);
    ASSERT_EQ(d2.n_held, 1);
    ASSERT_EQ(sp_detok_push(t, &d2, 3 + 0x41, false, buf, 1), 2); /* too small: nothing moves */
    ASSERT_EQ(d2.n_held, 1);
    ASSERT_EQ(sp_detok_push(t, &d2, 3 + 0x41, false, buf, (int32_t)sizeof buf), 2);
    ASSERT_EQ(sp_detok_flush(&d2, buf, 4), 0);
    free(ids);
    unload(&l);
}

/* GPT-2's vocabulary with its merges or pre-tokenizer replaced. */
static sp_status_t
gpt2_variant(const char *pre, const char *const *merges, uint64_t n_merges, sp_tokenizer_t **t,
             char *err, size_t err_len)
{
    sp_gguf_t *src = NULL, *g = NULL;
    sp_gguf_writer_t *w = NULL;
    void *bytes = NULL;
    size_t len = 0;
    ASSERT_OK(sp_gguf_open(TOKDIR "ggml-vocab-gpt-2.gguf", &src, err, err_len));
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, src));
    if (pre != NULL) {
        ASSERT_OK(sp_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre));
    }
    if (merges != NULL) {
        ASSERT_OK(sp_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, n_merges));
    }
    ASSERT_OK(sp_gguf_writer_write_mem(w, &bytes, &len, err, err_len));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(src);
    ASSERT_OK(sp_gguf_open_mem(bytes, len, "variant.gguf", &g, err, err_len));
    sp_status_t st = sp_tokenizer_from_gguf(g, t, err, err_len);
    sp_gguf_close(g);
    sp_free(bytes);
    return st;
}

TEST(tokenizer_bpe_untrusted_merges)
{
    char err[256];
    sp_tokenizer_t *t = NULL;
    /* "h e" and "he llo"... only merges over existing tokens count; the rest are skipped */
    static const char *const merges[] = {"h e", "nospace", " x", "e", "he qqxj", "l l", "ll o",
                                         "zzzz qqqq", "he llo"};
    sp_log_set_level(SP_LOG_LEVEL_ERROR); /* the skip warning is expected */
    ASSERT_OK(gpt2_variant(NULL, merges, sizeof merges / sizeof merges[0], &t, err, sizeof err));
    sp_log_set_level(SP_LOG_LEVEL_INFO);
    int32_t ids[8];
    /* h e -> he; l l -> ll; ll o -> llo; he llo -> hello */
    ASSERT_EQ(sp_tokenizer_encode(t, "hello", 5, false, false, ids, 8), 1);
    ASSERT_EQ(ids[0], 31373);
    sp_tokenizer_destroy(t);

    ASSERT_EQ(gpt2_variant("no-such-pre", NULL, 0, &t, err, sizeof err), SP_ERR_UNSUPPORTED);
    ASSERT(t == NULL);
    ASSERT(strstr(err, "variant.gguf") != NULL && strstr(err, "tokenizer.ggml.pre") != NULL);
}

#include <pthread.h>

typedef struct tok_job {
    const sp_tokenizer_t *t;
    const char *text;
    size_t len;
    int64_t n;
    uint64_t hash;
} tok_job_t;

static void *
tok_thread(void *arg)
{
    tok_job_t *j = arg;
    for (int r = 0; r < 20; r++) {
        int32_t ids[4096];
        int64_t n = sp_tokenizer_encode(j->t, j->text, j->len, true, true, ids, 4096);
        uint64_t h = 0xcbf29ce484222325ull;
        for (int64_t i = 0; i < n && i < 4096; i++) {
            h = (h ^ (uint32_t)ids[i]) * 0x100000001b3ull;
        }
        if (r > 0 && (n != j->n || h != j->hash)) {
            j->n = -1; /* a different answer on a later round */
            return NULL;
        }
        j->n = n;
        j->hash = h;
    }
    return NULL;
}

/* One tokenizer, several threads at once: each gets the single-threaded answer. */
TEST(tokenizer_concurrent_calls)
{
    static const char *const files[] = {"gpt-2", "llama-spm", "bert-bge"};
    size_t in_len;
    char *in = slurp(TOKDIR "ggml-vocab-gpt-2.gguf.inp", &in_len);
    ASSERT(in != NULL);
    for (size_t f = 0; f < 3; f++) {
        char path[128];
        snprintf(path, sizeof path, TOKDIR "ggml-vocab-%s.gguf", files[f]);
        loaded_t l = load_file(path);
        tok_job_t ref = {l.t, in, in_len, 0, 0}, jobs[4];
        tok_thread(&ref);
        ASSERT(ref.n > 0);
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            jobs[i] = (tok_job_t){l.t, in, in_len, 0, 0};
            ASSERT_EQ(pthread_create(&th[i], NULL, tok_thread, &jobs[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            ASSERT_EQ(jobs[i].n, ref.n);
            ASSERT_EQ(jobs[i].hash, ref.hash);
        }
        unload(&l);
    }
    free(in);
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
    int64_t need = sp_tokenizer_encode(t, s, len, true, false, NULL, 0);
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

/* 1 MiB per input, a quarter of that in sanitizer builds (several times slower). */
#if defined(__SANITIZE_ADDRESS__)
#define BIG_INPUT ((size_t)1 << 18)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BIG_INPUT ((size_t)1 << 18)
#endif
#endif
#ifndef BIG_INPUT
#define BIG_INPUT ((size_t)1 << 20)
#endif

/* Fill buf[0..n) with the 1 MiB input of kind k; returns its name or NULL past the last. */
static const char *
fill_kind(int k, char *buf, size_t n)
{
    static const char *units[] = {"a", " ", "\n", "1", "!", " a", "a ", "\xC3\xA9", "\xE4\xB8\xAD",
                                  " \n", "'s", "\t", "\xF0\x9F\xA6\x99"};
    static const char *names[] = {"'a'", "' '", "'\\n'", "'1'", "'!'", "' a'", "'a '", "'é'",
                                  "'中'", "' \\n'", "\"'s\"", "'\\t'", "'🦙'"};
    const int n_units = (int)(sizeof units / sizeof units[0]);
    if (k < n_units) {
        size_t u = strlen(units[k]);
        for (size_t i = 0; i < n; i++) {
            buf[i] = units[k][i % u];
        }
        return names[k];
    }
    k -= n_units;
    if (k == 0) { /* spaces up to one letter at the end: the \s+(?!\S) backtracking case */
        memset(buf, ' ', n);
        buf[n - 1] = 'x';
        return "spaces then 'x'";
    }
    if (k == 1) {
        uint64_t seed = 7;
        for (size_t i = 0; i + 8 <= n; i += 8) {
            uint64_t r = rng_next(&seed);
            memcpy(buf + i, &r, 8);
        }
        return "random bytes";
    }
    if (k == 2) {
        size_t in_len;
        char *in = slurp(TOKDIR "ggml-vocab-llama-spm.gguf.inp", &in_len);
        ASSERT(in != NULL);
        for (size_t i = 0; i < n; i++) {
            buf[i] = in[i % in_len];
        }
        free(in);
        return "test text";
    }
    return NULL;
}

/* Tokenize every kind of 1 MiB input; print times; fail on anything that looks quadratic. */
static void
megabyte_kinds(const sp_tokenizer_t *t, const char *label, size_t mb)
{
    char *buf = malloc(mb);
    ASSERT(buf != NULL);
    double total = 0, worst = 0;
    const char *worst_name = "";
    fprintf(stderr, "  %s, %zu KiB each:", label, mb >> 10);
    for (int k = 0;; k++) {
        const char *name = fill_kind(k, buf, mb);
        if (name == NULL) {
            break;
        }
        int64_t t0 = sp_time_ns();
        int64_t n = sp_tokenizer_encode(t, buf, mb, false, false, NULL, 0);
        double ms = (double)(sp_time_ns() - t0) / 1e6;
        if (n < 0) {
            SP_TEST_FAIL("%s: %zu KiB of %s: status %lld", label, mb >> 10, name, (long long)n);
        }
        fprintf(stderr, " %s %.0f", name, ms);
        total += ms;
        if (ms > worst) {
            worst = ms;
            worst_name = name;
        }
        /* Loose on purpose (sanitizers, a busy machine): quadratic would be minutes.
         * Over the bound, the growth decides, not the clock: a quarter of the input
         * must take more than a sixth of the time (linear: a quarter; quadratic: a
         * sixteenth), so a slow or busy machine does not fail a linear tokenizer. */
        if (ms > 8000.0 * (double)mb / (1 << 20)) {
            int64_t t1 = sp_time_ns();
            (void)sp_tokenizer_encode(t, buf, mb / 4, false, false, NULL, 0);
            double quarter = (double)(sp_time_ns() - t1) / 1e6;
            fprintf(stderr, " (slow: a quarter took %.0f ms)", quarter);
            if (quarter * 6.0 < ms) {
                SP_TEST_FAIL("%s: %zu KiB of %s took %.0f ms, a quarter of it %.0f ms", label,
                             mb >> 10, name, ms, quarter);
            }
        }
    }
    fprintf(stderr, " ms (total %.0f, worst %s)\n", total, worst_name);
    free(buf);
}

static void
megabyte_file(const char *name, size_t size)
{
    char path[128];
    snprintf(path, sizeof path, TOKDIR "ggml-vocab-%s.gguf", name);
    loaded_t l = load_file(path);
    megabyte_kinds(l.t, name, size);
    unload(&l);
}

/* 1 MiB of each kind for each model type; an eighth of that for the other BPE
 * families (what they add is their regexes: a quadratic one would still take minutes). */
TEST(tokenizer_megabyte_spm) { megabyte_file("llama-spm", BIG_INPUT); }
TEST(tokenizer_megabyte_bpe) { megabyte_file("gpt-2", BIG_INPUT); }
TEST(tokenizer_megabyte_wpm) { megabyte_file("bert-bge", BIG_INPUT); }

TEST(tokenizer_megabyte_bpe_families)
{
    static const char *const names[] = {"falcon", "deepseek-llm", "deepseek-coder", "starcoder"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        megabyte_file(names[i], BIG_INPUT / 8);
    }
}

/* Every pre-tokenizer we know, on GPT-2's vocabulary with tokenizer.ggml.pre
 * replaced: each compiles, and none blows up on long repeats. */
static void
megabyte_pres(const char *const *pres, size_t n_pres)
{
    char err[256];
    sp_gguf_t *src = NULL;
    ASSERT_OK(sp_gguf_open(TOKDIR "ggml-vocab-gpt-2.gguf", &src, err, sizeof err));
    for (size_t i = 0; i < n_pres; i++) {
        sp_gguf_writer_t *w = NULL;
        void *bytes = NULL;
        size_t len = 0;
        ASSERT_OK(sp_gguf_writer_create(&w));
        ASSERT_OK(sp_gguf_writer_copy_kv(w, src));
        ASSERT_OK(sp_gguf_writer_set_str(w, "tokenizer.ggml.pre", pres[i]));
        ASSERT_OK(sp_gguf_writer_write_mem(w, &bytes, &len, err, sizeof err));
        sp_gguf_writer_destroy(w);
        sp_gguf_t *g = NULL;
        sp_tokenizer_t *t = NULL;
        ASSERT_OK(sp_gguf_open_mem(bytes, len, "pre.gguf", &g, err, sizeof err));
        if (sp_tokenizer_from_gguf(g, &t, err, sizeof err) != SP_OK) {
            SP_TEST_FAIL("pre %s: %s", pres[i], err);
        }
        megabyte_kinds(t, pres[i], BIG_INPUT / 8);
        sp_tokenizer_destroy(t);
        sp_gguf_close(g);
        sp_free(bytes);
    }
    sp_gguf_close(src);
}

TEST(tokenizer_megabyte_pre_a)
{
    static const char *const pres[] = {"default", "llama-bpe", "qwen2", "dbrx", "tekken",
                                       "gpt-4o"};
    megabyte_pres(pres, sizeof pres / sizeof pres[0]);
}

TEST(tokenizer_megabyte_pre_b)
{
    static const char *const pres[] = {"chameleon", "deepseek-v3", "poro-chat", "viking",
                                       "command-r", "mpt"};
    megabyte_pres(pres, sizeof pres / sizeof pres[0]);
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
    ASSERT_EQ(sp_tokenizer_encode(t, "abc", 3, false, false, ids, 8), 3);
    ASSERT_EQ(ids[0], sp);
    ASSERT_EQ(ids[1], a);
    ASSERT_EQ(ids[2], bc);
    /* bytes fall back to <0xNN>: 'z' is 0x7A at id 3 + 0x7A */
    ASSERT_EQ(sp_tokenizer_encode(t, "z", 1, false, false, ids, 8), 2);
    ASSERT_EQ(ids[1], 3 + 0x7A);
    /* "<0xZZ>" is plain text here: it decodes as itself */
    char buf[16];
    ASSERT_EQ(sp_tokenizer_piece(t, sp + 6, false, buf, sizeof buf), 6);
    ASSERT(memcmp(buf, "<0xZZ>", 6) == 0);
    (void)b;
    sp_tokenizer_destroy(t);

    /* equal scores: the leftmost pair merges first: ▁ ab c */
    v.bc_score = -0.5f;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    ASSERT_EQ(sp_tokenizer_encode(t, "abc", 3, false, false, ids, 8), 3);
    ASSERT_EQ(ids[1], ab);
    ASSERT_EQ(ids[2], c);
    sp_tokenizer_destroy(t);

    /* no byte tokens: unknown characters become unk */
    v = vocab_defaults();
    v.with_bytes = false;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    ASSERT_EQ(sp_tokenizer_encode(t, "az", 2, false, false, ids, 8), 3);
    ASSERT_EQ(ids[1], 4);
    ASSERT_EQ(ids[2], 0);
    sp_tokenizer_destroy(t);

    /* no scores and no types: loads; <0xNN> spellings still act as bytes */
    v = vocab_defaults();
    v.omit_scores = true;
    v.omit_types = true;
    ASSERT_OK(try_vocab(&v, &t, err, sizeof err));
    ASSERT_EQ(sp_tokenizer_piece(t, 3 + 0x41, false, buf, sizeof buf), 1);
    ASSERT_EQ(buf[0], 'A');
    ASSERT_EQ(sp_tokenizer_piece(t, 1, false, buf, sizeof buf), 0); /* bos became control */
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
    v.model = "rwkv";
    expect_reject(&v, SP_ERR_UNSUPPORTED, "tokenizer.ggml.model");
    v.model = "gpt2"; /* byte-level BPE needs its merges */
    expect_reject(&v, SP_ERR_FORMAT, "tokenizer.ggml.merges");
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
            ASSERT_EQ(sp_tokenizer_encode(t, "Hello", 5, false, false, ids, 4), 1);
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
        int64_t n = sp_tokenizer_encode(t, "<s>Hello world</s>", 18, true, true, ids, 64);
        sp_alloc_fail_after(-1);
        ASSERT(n == SP_ERR_NOMEM || n == 5);
        ASSERT_EQ(sp_alloc_bytes_in_use(), base2);
    }
    sp_tokenizer_destroy(t);
    sp_gguf_close(g);
}

/* Byte-level BPE: every allocation of the load (PCRE2's included, which go
 * through sp_malloc) and of a call may fail without a crash or a leak. */
TEST(tokenizer_bpe_oom_no_leak)
{
    char err[256];
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open(TOKDIR "ggml-vocab-deepseek-coder.gguf", &g, err, sizeof err));
    size_t base = sp_alloc_bytes_in_use();
    int failures = 0;
    sp_tokenizer_t *t = NULL;
    for (int64_t k = 0; k < 400; k++) {
        sp_alloc_fail_after(k);
        sp_status_t st = sp_tokenizer_from_gguf(g, &t, err, sizeof err);
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            break;
        }
        ASSERT_EQ(st, SP_ERR_NOMEM);
        ASSERT(t == NULL);
        ASSERT_EQ(sp_alloc_bytes_in_use(), base);
        failures++;
    }
    ASSERT(t != NULL);
    ASSERT(failures > 5);
    size_t base2 = sp_alloc_bytes_in_use();
    const char *s = "Hello world, 你好 123!\n<｜begin▁of▁sentence｜>x";
    int64_t want = sp_tokenizer_encode(t, s, strlen(s), true, true, NULL, 0);
    ASSERT(want > 5);
    for (int64_t k = 0; k < 12; k++) {
        int32_t ids[64];
        sp_alloc_fail_after(k);
        int64_t n = sp_tokenizer_encode(t, s, strlen(s), true, true, ids, 64);
        sp_alloc_fail_after(-1);
        ASSERT(n == SP_ERR_NOMEM || n == want);
        ASSERT_EQ(sp_alloc_bytes_in_use(), base2);
    }
    sp_tokenizer_destroy(t);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base);
    sp_gguf_close(g);
}
