/*
 * tok_bpe.c - byte-level BPE (tokenizer.ggml.model = "gpt2"): GPT-2, Llama 3,
 * Qwen2, DeepSeek, Falcon, StarCoder, MPT, Command-R and the other families
 * whose GGUF names a pre-tokenizer in tokenizer.ggml.pre.
 *
 * Encoding a run of plain text (specials are already split out) is:
 *   1. pre-tokenize: the family's regexes, applied in order as Hugging Face's
 *      Sequence of Split(..., "isolated") does: each regex cuts every piece
 *      left by the previous one into its matches and the gaps between them.
 *      The regexes run in PCRE2 (UTF + UCP, JIT when available) on the raw
 *      UTF-8; invalid UTF-8 is allowed (PCRE2_MATCH_INVALID_UTF): such bytes
 *      never match and end up in gap pieces, so every input byte is encoded.
 *   2. each piece's bytes become the GPT-2 byte-to-unicode characters, one
 *      symbol per byte (the symbol is the id of that one-character token);
 *   3. adjacent pairs merge by their rank in tokenizer.ggml.merges, lowest
 *      first, ties to the leftmost (a 4-ary heap of (rank, position) keys;
 *      entries made stale by an earlier merge are re-checked and skipped), so a
 *      piece of n bytes costs O(n log n) whatever its content.
 * The pieces are split recursively (one level per regex) and encoded as they
 * are found, so nothing but one piece's symbols is ever held.
 *
 * Untrusted merges (RELIABILITY.md G14-G16): a merge must be "LEFT RIGHT" where
 * LEFT, RIGHT and LEFTRIGHT are all tokens of the vocabulary; any other entry
 * is skipped (Hugging Face refuses such a file; we keep the ones that are
 * well-formed and log how many were dropped), which keeps every symbol a real
 * token. A duplicate pair keeps its first (best) rank.
 *
 * Threads: the compiled regexes and tables are read-only after load; each call
 * creates its own PCRE2 match data and merge scratch, so sp_tokenizer_encode may run
 * concurrently on one tokenizer.
 */
#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "core/heap.h"
#include "text/tokenizer_impl.h"
#include "sampan/log.h"

#define MAX_REGEX 8

/* ---- pre-tokenizer regexes ------------------------------------------------
 *
 * Written from each family's tokenizer.json (pre_tokenizer); the Split regexes
 * are applied in the order listed. A ByteLevel(use_regex=true) stage is the
 * GPT-2 regex. Contractions are spelled with explicit case classes where the
 * original used (?i:...), as llama.cpp does, so case folding of non-ASCII
 * letters cannot creep in.
 */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                       \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                        \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"     \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen 3.5: Qwen2's, with combining marks (\p{M}) kept in the letter runs */
#define RE_QWEN35                                                                       \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"                          \
                    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK ideographs (U+4E00..9FA5), U+0800..4E00 and Hangul (U+AC00..D7FF) */
#define RE_DEEPSEEK_CJK "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+"
/* The letters of DeepSeek LLM's tokenizer.json, as ranges. */
#define RE_DEEPSEEK_LETTERS                                                              \
    "A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}" \
    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}" \
    "\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}" \
    "\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}" \
    "\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}" \
    "\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}" \
    "\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}" \
    "\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}" \
    "\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}" \
    "\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}" \
    "\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}" \
    "\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}" \
    "\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}" \
    "\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}" \
    "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}" \
    "\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}" \
    "\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}" \
    "\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}" \
    "\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}"

typedef struct pre_def {
    const char *names[12];        /* tokenizer.ggml.pre values, NULL-terminated */
    const char *regex[MAX_REGEX]; /* NULL-terminated */
    bool ignore_merges;           /* a piece that is a whole token is taken as is (Llama 3) */
} pre_def_t;

/* "gemma4" (tokenizer.ggml.model): no word split, only runs of newlines are
 * cut apart from the rest (the merges never join across a newline) */
static const pre_def_t pre_raw = {{"gemma4"}, {"[^\\n]+|\\n+"}, false};

static const pre_def_t pre_defs[] = {
    /* tokenizer.ggml.pre absent or "default": llama.cpp's generic BPE split */
    {{"default"},
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false},
    {{"gpt-2", "mpt", "olmo", "jais", "phi-2", "roberta-bpe", "jina-es", "jina-de",
      "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code"},
     {RE_GPT2}, false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {RE_LLAMA3}, true},
    {{"dbrx", "smaug-bpe", "chatglm-bpe"}, {RE_LLAMA3}, false},
    {{"qwen2", "stablelm2", "deepseek-r1-qwen", "megrez"}, {RE_QWEN2}, false},
    {{"qwen35"}, {RE_QWEN35}, false},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
     {"\\p{N}", RE_GPT2}, false},
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false},
    {{"deepseek-llm"},
     {"[\\r\\n]", "\\s?[" RE_DEEPSEEK_LETTERS "]+",
      "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
      /* "\s+$": only the run that reaches the end can match, so starting
       * inside a run is pointless; the lookbehind says so and keeps a long
       * run of spaces from costing O(n^2) */
      "(?<!\\s)\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
     false},
    {{"deepseek-coder"},
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"}, false},
    {{"deepseek-v3"},
     {"\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"
      "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false},
    {{"poro-chat", "bloom", "gpt3-finnish"},
     {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{0964}\\x{06d4}\\x{060c})]+"}, false},
    {{"viking"},
     {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{0964}\\x{06d4}\\x{060c})]+", "\\p{N}"},
     false},
    /* Tekken's "((?=[\p{L}])([^a-z]))*" is a letter other than a-z; written as
     * the class [^\P{L}a-z] it needs no backtracking frame per character */
    {{"tekken"},
     {"[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]*[^\\P{L}A-Z]+"
      "|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]+[^\\P{L}A-Z]*"
      "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false},
    {{"gpt-4o"},
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
      "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
      "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false},
    {{"chameleon"},
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
      "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2},
     false},
};

/* ---- state built at load ---------------------------------------------- */

typedef struct merge_slot {
    uint64_t key;   /* left id << 32 | right id; UINT64_MAX = empty */
    uint32_t rank;  /* position in tokenizer.ggml.merges */
    int32_t result; /* id of the merged token */
} merge_slot_t;

struct sp__tok_bpe {
    pcre2_general_context *gctx;
    pcre2_match_context *mctx; /* read-only after load: shared by every call */
    pcre2_code *re[MAX_REGEX];
    int n_re;
    bool ignore_merges;
    merge_slot_t *merges;
    size_t merge_mask;
    int32_t byte_tok[256];  /* token of each byte's one-character text, -1 if none */
    uint16_t byte_char[256]; /* GPT-2 byte -> code point (all < 0x144) */
    int16_t char_byte[0x144]; /* inverse, -1 where a code point stands for no byte */
};

static void *
pcre_alloc(PCRE2_SIZE n, void *ud)
{
    (void)ud;
    return sp_malloc(n);
}

static void
pcre_free(void *p, void *ud)
{
    (void)ud;
    sp_free(p);
}

/* GPT-2's byte <-> unicode table: printable Latin-1 bytes stand for
 * themselves, the other 68 take the code points from U+0100 up, in byte order. */
static void
build_byte_chars(sp__tok_bpe_t *b)
{
    int next = 0x100;
    for (int i = 0; i < 0x144; i++) {
        b->char_byte[i] = -1;
    }
    for (int c = 0; c < 256; c++) {
        bool keep = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        b->byte_char[c] = (uint16_t)(keep ? c : next++);
        b->char_byte[b->byte_char[c]] = (int16_t)c;
    }
}

static uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static const merge_slot_t *
find_merge(const sp__tok_bpe_t *b, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = (size_t)mix64(key) & b->merge_mask;
    for (;;) {
        const merge_slot_t *s = &b->merges[i];
        if (s->key == key) {
            return s;
        }
        if (s->key == UINT64_MAX) {
            return NULL;
        }
        i = (i + 1) & b->merge_mask;
    }
}

void
sp__tok_bpe_free(sp__tok_bpe_t *b)
{
    if (b == NULL) {
        return;
    }
    for (int i = 0; i < b->n_re; i++) {
        pcre2_code_free(b->re[i]);
    }
    pcre2_match_context_free(b->mctx);
    pcre2_general_context_free(b->gctx);
    sp_free(b->merges);
    sp_free(b);
}

static const pre_def_t *
find_pre(sp_str_t name)
{
    for (size_t i = 0; i < sizeof(pre_defs) / sizeof(pre_defs[0]); i++) {
        for (int k = 0; k < 12 && pre_defs[i].names[k] != NULL; k++) {
            if (sp_str_eq_c(name, pre_defs[i].names[k])) {
                return &pre_defs[i];
            }
        }
    }
    return NULL;
}

static sp_status_t
load_merges(sp_tokenizer_t *t, sp__tok_bpe_t *b, const sp_gguf_t *g, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    sp_gguf_arr_t m;
    sp_status_t st = sp_gguf_get_arr(g, "tokenizer.ggml.merges", &m, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: tokenizer.ggml.merges: key missing "
                       "(a gpt2 tokenizer needs its merges)", path);
    }
    if (st != SP_OK) {
        return st;
    }
    if (m.elem_type != SP_GGUF_TYPE_STRING || m.strs == NULL) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tokenizer.ggml.merges: elements are %s, want string", path,
                       sp_gguf_type_name(m.elem_type));
    }
    if (m.n > (uint64_t)1 << 26) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tokenizer.ggml.merges: %llu merges (max %d)", path,
                       (unsigned long long)m.n, 1 << 26);
    }
    size_t slots = 16;
    while (slots < (size_t)m.n * 2) {
        slots <<= 1;
    }
    b->merges = sp_malloc(slots * sizeof(merge_slot_t));
    if (b->merges == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: tokenizer: out of memory", path);
    }
    memset(b->merges, 0xff, slots * sizeof(merge_slot_t));
    b->merge_mask = slots - 1;

    char cat[2 * SP_TOKEN_MAX_BYTES];
    uint64_t n_bad = 0, first_bad = 0;
    for (uint64_t i = 0; i < m.n; i++) {
        sp_str_t s = m.strs[i];
        /* the separator is the first space after the first byte (a token may be " ") */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        int32_t l = -1, r = -1, res = -1;
        if (sp != NULL && s.len <= sizeof cat) {
            size_t nl = (size_t)(sp - s.ptr), nr = s.len - nl - 1;
            l = sp__vocab_lookup(t, s.ptr, nl);
            r = nr > 0 ? sp__vocab_lookup(t, sp + 1, nr) : -1;
            memcpy(cat, s.ptr, nl);
            memcpy(cat + nl, sp + 1, nr);
            res = sp__vocab_lookup(t, cat, nl + nr);
        }
        if (l < 0 || r < 0 || res < 0) {
            if (n_bad++ == 0) {
                first_bad = i;
            }
            continue;
        }
        uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
        size_t k = (size_t)mix64(key) & b->merge_mask;
        while (b->merges[k].key != UINT64_MAX && b->merges[k].key != key) {
            k = (k + 1) & b->merge_mask;
        }
        if (b->merges[k].key == UINT64_MAX) { /* a duplicate keeps its first rank */
            b->merges[k] = (merge_slot_t){key, (uint32_t)i, res};
        }
    }
    if (n_bad > 0) {
        SP_LOG_WARN("%s: tokenizer.ggml.merges: skipped %llu of %llu merges that are not "
                    "\"LEFT RIGHT\" over tokens of the vocabulary (first: #%llu)",
                    path, (unsigned long long)n_bad, (unsigned long long)m.n,
                    (unsigned long long)first_bad);
    }
    return SP_OK;
}

sp_status_t
sp__tok_bpe_init(sp_tokenizer_t *t, const sp_gguf_t *g, char *err, size_t err_len)
{
    const char *path = sp_gguf_path(g);
    sp_str_t pre = sp_str_c("default");
    sp_status_t st = sp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        pre = sp_str_c("default");
    } else if (st != SP_OK) {
        return st;
    }
    const pre_def_t *def = t->raw_bpe ? &pre_raw : find_pre(pre);
    if (def == NULL) {
        int n = pre.len > 64 ? 64 : (int)pre.len;
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.pre: pre-tokenizer \"%.*s\" is not supported", path, n,
                       pre.ptr);
    }

    sp__tok_bpe_t *b = sp_calloc(1, sizeof(*b));
    pcre2_compile_context *cctx = NULL;
    if (b == NULL) {
        goto nomem;
    }
    t->bpe = b; /* freed with t from here on */
    b->ignore_merges = def->ignore_merges;
    b->gctx = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
    if (b->gctx == NULL || (cctx = pcre2_compile_context_create(b->gctx)) == NULL ||
        (b->mctx = pcre2_match_context_create(b->gctx)) == NULL) {
        goto nomem;
    }
    /* The default match limit (10 million steps per call) can be reached by a
     * search over megabytes without a match when the interpreter runs; the
     * regexes are ours and linear, so only the heap limit stays. */
    pcre2_set_match_limit(b->mctx, UINT32_MAX);
    for (int i = 0; i < MAX_REGEX && def->regex[i] != NULL; i++) {
        int code;
        PCRE2_SIZE at;
        b->re[i] = pcre2_compile((PCRE2_SPTR)def->regex[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at,
                                 cctx);
        if (b->re[i] == NULL) {
            if (code == PCRE2_ERROR_NOMEMORY || code == PCRE2_ERROR_HEAP_FAILED) {
                goto nomem;
            }
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(code, msg, sizeof msg);
            st = sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                         "%s: tokenizer.ggml.pre: regex %d of \"%.*s\" does not compile at %zu: %s",
                         path, i, (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, (size_t)at,
                         (const char *)msg);
            pcre2_compile_context_free(cctx);
            return st;
        }
        b->n_re = i + 1;
        /* JIT is a speed-up only: without it (no support, no memory) the interpreter runs */
        (void)pcre2_jit_compile(b->re[i], PCRE2_JIT_COMPLETE);
    }
    pcre2_compile_context_free(cctx);
    cctx = NULL;

    build_byte_chars(b);
    for (int c = 0; c < 256; c++) {
        char u[2];
        size_t n = sp_utf8_encode(u, b->byte_char[c]);
        b->byte_tok[c] = sp__vocab_lookup(t, u, n);
    }
    return load_merges(t, b, g, err, err_len);

nomem:
    pcre2_compile_context_free(cctx);
    return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: tokenizer: out of memory", path);
}

/* ---- encoding ------------------------------------------------------------ */

#define DEAD INT32_MIN /* a symbol merged into its left neighbour */

typedef struct bpe_work {
    const sp_tokenizer_t *t;
    const sp__tok_bpe_t *b;
    sp__tok_out_t *o;
    pcre2_match_data *md;
    int32_t *id, *prev, *next; /* (cap) symbols of the current piece */
    size_t cap;
    sp_heap_u64_t heap;        /* rank << 32 | left index */
    char *enc;                 /* (2 * cap) the piece in byte characters (ignore_merges) */
    int32_t *off;              /* (cap) raw BPE: byte offset of each symbol in the piece */
} bpe_work_t;

static int
grow(bpe_work_t *w, size_t n)
{
    if (n <= w->cap) {
        return 0;
    }
    size_t cap = w->cap ? w->cap : 64, bytes;
    while (cap < n) {
        cap *= 2;
    }
    if (sp_mul_size(cap, sizeof(int32_t), &bytes)) {
        return -1;
    }
    int32_t *a = sp_realloc(w->id, bytes);
    if (a == NULL) {
        return -1;
    }
    w->id = a;
    if ((a = sp_realloc(w->prev, bytes)) == NULL) {
        return -1;
    }
    w->prev = a;
    if ((a = sp_realloc(w->next, bytes)) == NULL) {
        return -1;
    }
    w->next = a;
    if (w->t->raw_bpe) {
        if ((a = sp_realloc(w->off, bytes)) == NULL) {
            return -1;
        }
        w->off = a;
    }
    if (w->b->ignore_merges) {
        char *e = sp_realloc(w->enc, 2 * cap); /* cap < 2^30: no overflow */
        if (e == NULL) {
            return -1;
        }
        w->enc = e;
    }
    w->cap = cap;
    return 0;
}

/* Queue the pair (i, next of i) when a merge exists for it. */
static int
try_pair(bpe_work_t *w, int32_t i)
{
    if (i < 0) {
        return 0;
    }
    int32_t j = w->next[i];
    if (j < 0 || w->id[i] < 0 || w->id[j] < 0) {
        return 0;
    }
    const merge_slot_t *m = find_merge(w->b, w->id[i], w->id[j]);
    return m == NULL ? 0 : sp_heap_u64_push(&w->heap, (uint64_t)m->rank << 32 | (uint32_t)i);
}

static void
emit_or_unk(bpe_work_t *w, int32_t id)
{
    if (id < 0) {
        id = w->t->unk; /* a byte with no token: unk, or dropped when there is none */
    }
    if (id >= 0) {
        sp__tok_emit(w->o, id);
    }
}

/* Run the queued merges over the symbols of a piece, lowest rank first. */
static sp_status_t
run_merges(bpe_work_t *w)
{
    const sp__tok_bpe_t *b = w->b;
    while (w->heap.n > 0) {
        uint64_t key = sp_heap_u64_pop(&w->heap);
        int32_t i = (int32_t)(uint32_t)key;
        int32_t j = w->next[i];
        if (w->id[i] == DEAD || j < 0) {
            continue;
        }
        /* stale unless the pair at i is still the one queued: ranks are unique per pair */
        const merge_slot_t *m = find_merge(b, w->id[i], w->id[j]);
        if (m == NULL || m->rank != (uint32_t)(key >> 32)) {
            continue;
        }
        w->id[i] = m->result;
        w->id[j] = DEAD;
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) {
            w->prev[w->next[j]] = i;
        }
        if (try_pair(w, w->prev[i]) || try_pair(w, i)) {
            return SP_ERR_NOMEM;
        }
    }
    return SP_OK;
}

/* Raw BPE (gemma4): one symbol per UTF-8 character of p[0..n) (spaces are
 * already U+2581); a piece that is all newlines and a token is taken whole;
 * a character that is no token, and so never merged, becomes its bytes'
 * <0xNN> tokens (dropped where the vocabulary has none, as llama.cpp does). */
static sp_status_t
encode_piece_raw(bpe_work_t *w, const unsigned char *p, size_t n)
{
    const sp_tokenizer_t *t = w->t;
    if (p[0] == '\n' && p[n - 1] == '\n') { /* the pre-tokenizer keeps newline runs apart */
        int32_t id = sp__vocab_lookup(t, (const char *)p, n);
        if (id >= 0) {
            sp__tok_emit(w->o, id);
            return SP_OK;
        }
    }
    if (grow(w, n)) {
        return SP_ERR_NOMEM;
    }
    int32_t ns = 0;
    for (size_t i = 0; i < n; ns++) {
        size_t k = sp_utf8_char_len(p + i, n - i);
        w->id[ns] = sp__vocab_lookup(t, (const char *)p + i, k);
        w->off[ns] = (int32_t)i;
        w->prev[ns] = ns - 1;
        w->next[ns] = ns + 1;
        i += k;
    }
    w->next[ns - 1] = -1;
    w->heap.n = 0;
    for (int32_t i = 0; i + 1 < ns; i++) {
        if (try_pair(w, i)) {
            return SP_ERR_NOMEM;
        }
    }
    sp_status_t st = run_merges(w);
    if (st != SP_OK) {
        return st;
    }
    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        if (w->id[i] >= 0) {
            sp__tok_emit(w->o, w->id[i]);
            continue;
        }
        size_t at = (size_t)w->off[i], k = sp_utf8_char_len(p + at, n - at);
        for (size_t j = 0; j < k; j++) {
            int32_t id = t->byte_id[p[at + j]];
            if (id >= 0 && t->attr[id] == SP_TOKEN_TYPE_BYTE) {
                sp__tok_emit(w->o, id);
            }
        }
    }
    return SP_OK;
}

/* BPE-encode one pre-tokenized piece p[0..n), n > 0. */
static sp_status_t
encode_piece(bpe_work_t *w, const unsigned char *p, size_t n)
{
    const sp__tok_bpe_t *b = w->b;
    if (w->t->raw_bpe) {
        return encode_piece_raw(w, p, n);
    }
    if (n == 1) {
        emit_or_unk(w, b->byte_tok[p[0]]);
        return SP_OK;
    }
    if (grow(w, n)) {
        return SP_ERR_NOMEM;
    }
    if (b->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            m += sp_utf8_encode(w->enc + m, b->byte_char[p[i]]);
        }
        int32_t id = sp__vocab_lookup(w->t, w->enc, m);
        if (id >= 0) {
            sp__tok_emit(w->o, id);
            return SP_OK;
        }
    }
    int32_t ns = (int32_t)n; /* n < 2^29 (MAX_INPUT_BYTES) */
    for (int32_t i = 0; i < ns; i++) {
        w->id[i] = b->byte_tok[p[i]];
        w->prev[i] = i - 1;
        w->next[i] = i + 1;
    }
    w->next[ns - 1] = -1;
    w->heap.n = 0;
    for (int32_t i = 0; i + 1 < ns; i++) {
        if (try_pair(w, i)) {
            return SP_ERR_NOMEM;
        }
    }
    sp_status_t st = run_merges(w);
    if (st != SP_OK) {
        return st;
    }
    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        emit_or_unk(w, w->id[i]);
    }
    return SP_OK;
}

/* Cut s[0..n) with regex `level` into matches and gaps, and hand each on to the
 * next level; past the last regex, encode. */
static sp_status_t
split(bpe_work_t *w, int level, const char *s, size_t n)
{
    if (n == 0) {
        return SP_OK;
    }
    if (level == w->b->n_re) {
        return encode_piece(w, (const unsigned char *)s, n);
    }
    const pcre2_code *re = w->b->re[level];
    size_t pos = 0, last = 0;
    sp_status_t st;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, w->md, w->b->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) {
            break;
        }
        if (rc < 0) {
            /* limits or memory: never a silent change of the split */
            return rc == PCRE2_ERROR_NOMEMORY ? SP_ERR_NOMEM : SP_ERR_TOO_LARGE;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match cuts nothing: step over one character */
            pos = ms + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80) {
                pos++;
            }
            continue;
        }
        if (ms > last && (st = split(w, level + 1, s + last, ms - last)) != SP_OK) {
            return st;
        }
        if ((st = split(w, level + 1, s + ms, me - ms)) != SP_OK) {
            return st;
        }
        last = pos = me;
    }
    return split(w, level + 1, s + last, n - last);
}

sp_status_t
sp__tok_bpe_encode(const sp_tokenizer_t *t, const char *text, size_t len, sp__tok_out_t *o)
{
    if (len == 0) {
        return SP_OK;
    }
    bpe_work_t w = {.t = t, .b = t->bpe, .o = o};
    char *esc = NULL;
    if (t->raw_bpe) { /* the vocabulary spells a space U+2581 */
        size_t spaces = 0, k = 0;
        for (size_t i = 0; i < len; i++) {
            spaces += text[i] == ' ';
        }
        if ((esc = sp_malloc(len + 2 * spaces)) == NULL) { /* len < 2^29: no overflow */
            return SP_ERR_NOMEM;
        }
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') {
                memcpy(esc + k, "\xE2\x96\x81", 3);
                k += 3;
            } else {
                esc[k++] = text[i];
            }
        }
        text = esc;
        len = k;
    }
    w.md = pcre2_match_data_create(1, t->bpe->gctx);
    sp_status_t st = w.md == NULL ? SP_ERR_NOMEM : split(&w, 0, text, len);
    sp_free(esc);
    sp_free(w.off);
    pcre2_match_data_free(w.md);
    sp_free(w.id);
    sp_free(w.prev);
    sp_free(w.next);
    sp_heap_u64_free(&w.heap);
    sp_free(w.enc);
    return st;
}

/* ---- decoding ------------------------------------------------------------ */

int32_t
sp__tok_bpe_text(const sp_tokenizer_t *t, sp_str_t s, char *buf, int32_t cap)
{
    /* byte characters back to bytes; anything else (not produced by the
     * byte-level encoder, but a vocabulary may hold it) is copied as is */
    const sp__tok_bpe_t *b = t->bpe;
    int32_t n = 0;
    for (size_t i = 0; i < s.len;) {
        unsigned char c0 = (unsigned char)s.ptr[i];
        int byte = -1;
        size_t k = 1;
        if (c0 < 0x80) {
            byte = b->char_byte[c0];
        } else if ((c0 & 0xE0) == 0xC0 && i + 1 < s.len &&
                   ((unsigned char)s.ptr[i + 1] & 0xC0) == 0x80) {
            unsigned cp = (unsigned)(c0 & 0x1F) << 6 | ((unsigned char)s.ptr[i + 1] & 0x3F);
            k = 2;
            byte = cp < 0x144 ? b->char_byte[cp] : -1;
        }
        if (byte >= 0) {
            if (buf != NULL && n < cap) {
                buf[n] = (char)byte;
            }
            n++;
        } else {
            for (size_t j = 0; j < k; j++, n++) {
                if (buf != NULL && n < cap) {
                    buf[n] = s.ptr[i + j];
                }
            }
        }
        i += k;
    }
    return n;
}
