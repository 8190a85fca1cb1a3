/*
 * test_gguf.c - the GGUF reader against every bad-file case of RELIABILITY.md
 * (G1-G13, G18), the demo model, and a writer round trip.
 *
 * Corrupt files are crafted byte by byte with a small builder (bb_*), so each
 * test states exactly which field is wrong; the rest of the file is valid.
 */
#include "test.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "gguf/gguf.h"

#define DEMO_MODEL "models/stories260K.gguf"

/* ---- byte builder -------------------------------------------------------- */

typedef struct bb {
    uint8_t *p;
    size_t len, cap;
} bb;

static void
bb_put(bb *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n) {
            cap *= 2;
        }
        b->p = realloc(b->p, cap);
        ASSERT(b->p != NULL);
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void
bb_u32(bb *b, uint32_t v)
{
    bb_put(b, &v, 4);
}

static void
bb_u64(bb *b, uint64_t v)
{
    bb_put(b, &v, 8);
}

static void
bb_str(bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static void
bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}

static void
bb_kv_u32(bb *b, const char *key, uint32_t v)
{
    bb_str(b, key);
    bb_u32(b, SP_GGUF_TYPE_UINT32);
    bb_u32(b, v);
}

/* Tensor info; n_dims entries of ne. */
static void
bb_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
          uint64_t offset)
{
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) {
        bb_u64(b, ne[i]);
    }
    bb_u32(b, type);
    bb_u64(b, offset);
}

static void
bb_pad(bb *b, size_t align)
{
    while (b->len % align != 0) {
        uint8_t z = 0;
        bb_put(b, &z, 1);
    }
}

static void
bb_zeros(bb *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t z = (uint8_t)i;
        bb_put(b, &z, 1);
    }
}

static void
bb_free(bb *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Open from memory and expect a clean rejection whose message contains `want`. */
static void
expect_reject(const bb *b, const char *want, int line)
{
    char err[512] = "";
    sp_gguf_t *g = (sp_gguf_t *)1;
    sp_status_t st = sp_gguf_open_mem(b->p, b->len, "crafted.gguf", &g, err, sizeof err);
    if (st == SP_OK) {
        sp_gguf_close(g);
        SP_TEST_FAIL("line %d: accepted a bad file (want '%s')", line, want);
    }
    if (g != NULL) {
        SP_TEST_FAIL("line %d: *out not NULL on failure", line);
    }
    if (strstr(err, "crafted.gguf") == NULL || strstr(err, want) == NULL) {
        SP_TEST_FAIL("line %d: message '%s' lacks '%s'", line, err, want);
    }
}
#define REJECT(b, want) expect_reject((b), (want), __LINE__)

static sp_gguf_t *
expect_accept(const bb *b, int line)
{
    char err[512] = "";
    sp_gguf_t *g = NULL;
    sp_status_t st = sp_gguf_open_mem(b->p, b->len, "crafted.gguf", &g, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("line %d: rejected a good file: %s", line, err);
    }
    return g;
}
#define ACCEPT(b) expect_accept((b), __LINE__)

/* A valid file: 2 kvs, 2 f32 tensors [8, 2] and [8]; the last tensor has no tail padding. */
static void
build_small(bb *b, uint64_t ne0_second)
{
    uint64_t ne_a[2] = {8, 2};
    uint64_t ne_b[1] = {ne0_second};
    bb_header(b, 3, 2, 2);
    bb_kv_u32(b, "general.alignment", 32);
    bb_str(b, "general.architecture");
    bb_u32(b, SP_GGUF_TYPE_STRING);
    bb_str(b, "llama");
    bb_tensor(b, "a", 2, ne_a, SP_TYPE_F32, 0);
    bb_tensor(b, "b", 1, ne_b, SP_TYPE_F32, 64);
    bb_pad(b, 32);
    bb_zeros(b, 64 + ne0_second * 4);
}

/* ---- positive ------------------------------------------------------------ */

TEST(gguf_small_crafted_ok)
{
    bb b = {0};
    build_small(&b, 8);
    sp_gguf_t *g = ACCEPT(&b);
    ASSERT_EQ(sp_gguf_version(g), 3);
    ASSERT_EQ(sp_gguf_n_kv(g), 2);
    ASSERT_EQ(sp_gguf_n_tensors(g), 2);
    ASSERT_EQ(sp_gguf_alignment(g), 32);
    ASSERT_EQ(sp_gguf_data_offset(g) % 32, 0);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(g, "b");
    ASSERT(t != NULL);
    ASSERT_EQ(t->n_dims, 1);
    ASSERT_EQ(t->ne[0], 8);
    ASSERT_EQ(t->ne[1], 1);
    ASSERT_EQ(t->nbytes, 32);
    ASSERT((const uint8_t *)t->data == b.p + sp_gguf_data_offset(g) + 64);
    ASSERT(sp_gguf_find_tensor(g, "c") == NULL);
    sp_gguf_close(g);
    sp_gguf_close(NULL);
    bb_free(&b);
}

TEST(gguf_demo_model)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    char err[256];
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open(DEMO_MODEL, &g, err, sizeof err));
    ASSERT_EQ(sp_gguf_version(g), 3);
    ASSERT_EQ(sp_gguf_alignment(g), 32);
    ASSERT_EQ(sp_gguf_n_tensors(g), 48);
    ASSERT_STR_EQ(sp_gguf_path(g), DEMO_MODEL);

    sp_str_t arch;
    ASSERT_OK(sp_gguf_get_str(g, "general.architecture", &arch, err, sizeof err));
    ASSERT(sp_str_eq_c(arch, "llama"));
    int64_t v;
    ASSERT_OK(sp_gguf_get_int(g, "llama.embedding_length", &v, err, sizeof err));
    ASSERT_EQ(v, 64);
    ASSERT_OK(sp_gguf_get_int(g, "llama.block_count", &v, err, sizeof err));
    ASSERT_EQ(v, 5);
    double eps;
    ASSERT_OK(sp_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps, err,
                                sizeof err));
    ASSERT(eps > 0 && eps < 1e-3);
    bool add_bos;
    ASSERT_OK(sp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, err, sizeof err));

    sp_gguf_arr_t toks;
    ASSERT_OK(sp_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err, sizeof err));
    ASSERT_EQ(toks.elem_type, SP_GGUF_TYPE_STRING);
    ASSERT_EQ(toks.n, 512);
    ASSERT(toks.strs != NULL && toks.data == NULL);
    ASSERT(sp_str_eq_c(toks.strs[0], "<unk>"));
    ASSERT(sp_str_eq_c(toks.strs[1], "<s>"));
    sp_gguf_arr_t scores;
    ASSERT_OK(sp_gguf_get_arr(g, "tokenizer.ggml.scores", &scores, err, sizeof err));
    ASSERT_EQ(scores.elem_type, SP_GGUF_TYPE_FLOAT32);
    ASSERT_EQ(scores.n, 512);
    (void)sp_gguf_arr_float(&scores, 511);
    ASSERT_EQ(sp_gguf_arr_float(&scores, 512), 0.0); /* out of range reads as 0 */

    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(g, "token_embd.weight");
    ASSERT(t != NULL);
    ASSERT_EQ(t->type, SP_TYPE_F32);
    ASSERT_EQ(t->n_dims, 2);
    ASSERT_EQ(t->ne[0], 64);
    ASSERT_EQ(t->ne[1], 512);
    ASSERT_EQ(t->nbytes, 64 * 512 * 4);
    ASSERT(sp_gguf_find_tensor(g, "output_norm.weight") != NULL);
    ASSERT_EQ(sp_gguf_find_key(g, "no.such.key"), -1);
    ASSERT_EQ(sp_gguf_get_int(g, "no.such.key", &v, err, sizeof err), SP_ERR_NOT_FOUND);
    sp_gguf_close(g);
}

TEST(gguf_getter_type_mismatch_names_key)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    char err[256] = "";
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open(DEMO_MODEL, &g, err, sizeof err));
    int64_t v;
    ASSERT_EQ(sp_gguf_get_int(g, "general.architecture", &v, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(strstr(err, "general.architecture") != NULL);
    ASSERT(strstr(err, DEMO_MODEL) != NULL);
    sp_str_t s;
    ASSERT_EQ(sp_gguf_get_str(g, "llama.block_count", &s, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(strstr(err, "llama.block_count") != NULL);
    bool bv;
    ASSERT_EQ(sp_gguf_get_bool(g, "llama.block_count", &bv, err, sizeof err), SP_ERR_FORMAT);
    sp_gguf_arr_t a;
    ASSERT_EQ(sp_gguf_get_arr(g, "llama.block_count", &a, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(strstr(err, "llama.block_count") != NULL);
    ASSERT_EQ(sp_gguf_get_int(g, "llama.rope.freq_base", &v, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(strstr(err, "llama.rope.freq_base") != NULL);
    double d;
    ASSERT_EQ(sp_gguf_get_float(g, "tokenizer.ggml.tokens", &d, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(strstr(err, "tokenizer.ggml.tokens") != NULL);
    ASSERT_OK(sp_gguf_get_float(g, "llama.block_count", &d, err, sizeof err)); /* int -> float */
    ASSERT_EQ(d, 5.0);
    sp_gguf_close(g);
}

TEST(gguf_open_path_rejects_non_regular)
{
    char err[256] = "";
    sp_gguf_t *g = (sp_gguf_t *)1;
    ASSERT_EQ(sp_gguf_open("tests/data/no-such-file.gguf", &g, err, sizeof err),
              SP_ERR_NOT_FOUND);
    ASSERT(g == NULL);
    ASSERT(strstr(err, "no-such-file.gguf") != NULL);
    ASSERT(sp_gguf_open("tests", &g, err, sizeof err) != SP_OK);
    ASSERT(strstr(err, "not a regular file") != NULL);
    ASSERT(sp_gguf_open("/dev/null", &g, err, sizeof err) != SP_OK);
    ASSERT(strstr(err, "not a regular file") != NULL);
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/fifo.gguf", sp_test_tmpdir());
    ASSERT_EQ(mkfifo(fifo, 0600), 0);
    ASSERT(sp_gguf_open(fifo, &g, err, sizeof err) != SP_OK); /* must not block */
    ASSERT(strstr(err, "not a regular file") != NULL);
    char empty[512];
    snprintf(empty, sizeof empty, "%s/empty.gguf", sp_test_tmpdir());
    FILE *f = fopen(empty, "wb");
    ASSERT(f != NULL);
    fclose(f);
    ASSERT_EQ(sp_gguf_open(empty, &g, err, sizeof err), SP_ERR_FORMAT);
    ASSERT(g == NULL);
}

/* ---- G1: magic and version ------------------------------------------------ */

TEST(gguf_g1_magic_version)
{
    bb b = {0};
    build_small(&b, 8);
    memcpy(b.p, "FUGG", 4);
    REJECT(&b, "bad magic");
    memcpy(b.p, "GGUF", 4);
    uint32_t bad[] = {0, 1, 4, 0x03000000u, 0x02000000u, 0xffffffffu};
    const char *want[] = {"version 0", "version 1", "version 4", "byte-swapped", "byte-swapped",
                          "version 4294967295"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(b.p + 4, &bad[i], 4);
        REJECT(&b, want[i]);
    }
    uint32_t v2 = 2;
    memcpy(b.p + 4, &v2, 4);
    sp_gguf_t *g = ACCEPT(&b); /* v2 has the same layout as v3 */
    ASSERT_EQ(sp_gguf_version(g), 2);
    sp_gguf_close(g);
    bb_free(&b);
}

/* ---- G2/G3: counts --------------------------------------------------------- */

TEST(gguf_g2_g3_counts)
{
    uint64_t bad[] = {UINT64_MAX, 0x1D1D1D1D1D1D1D1Dull, 1ull << 63, 0xFFFFFFFFull, 1000};
    size_t before = sp_alloc_bytes_in_use();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bb b = {0};
        bb_header(&b, 3, bad[i], 0);
        bb_zeros(&b, 200);
        REJECT(&b, "tensor count");
        bb_free(&b);
        bb_header(&b, 3, 0, bad[i]);
        bb_zeros(&b, 200);
        REJECT(&b, "kv count");
        bb_free(&b);
    }
    ASSERT_EQ(sp_alloc_bytes_in_use(), before); /* nothing leaked on the failure paths */
}

/* ---- G4: string lengths ------------------------------------------------------ */

TEST(gguf_g4_string_lengths)
{
    uint64_t bad[] = {UINT64_MAX, 1ull << 63, 1ull << 30, (uint64_t)SP_GGUF_MAX_STRING + 1, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* as a key */
        bb b = {0};
        bb_header(&b, 3, 0, 1);
        bb_u64(&b, bad[i]);
        bb_zeros(&b, 200);
        REJECT(&b, "length");
        bb_free(&b);
        /* as a string value */
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "general.name");
        bb_u32(&b, SP_GGUF_TYPE_STRING);
        bb_u64(&b, bad[i]);
        bb_zeros(&b, 200);
        REJECT(&b, "string value length");
        bb_free(&b);
        /* as a tensor name */
        bb_header(&b, 3, 1, 0);
        bb_u64(&b, bad[i]);
        bb_zeros(&b, 200);
        REJECT(&b, "name of tensor 0");
        bb_free(&b);
    }
    /* a key over the key cap but inside the file */
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 2000);
    bb_zeros(&b, 2100);
    REJECT(&b, "exceeds the limit");
    bb_free(&b);
}

/* ---- G5: array counts ---------------------------------------------------------- */

TEST(gguf_g5_array_counts)
{
    uint64_t bad[] = {1ull << 62, UINT64_MAX, (UINT64_MAX / 8) + 2, 100};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bb b = {0};
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "tokenizer.ggml.scores");
        bb_u32(&b, SP_GGUF_TYPE_ARRAY);
        bb_u32(&b, SP_GGUF_TYPE_UINT64);
        bb_u64(&b, bad[i]);
        bb_zeros(&b, 100);
        REJECT(&b, "runs past end of file");
        bb_free(&b);
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "tokenizer.ggml.tokens");
        bb_u32(&b, SP_GGUF_TYPE_ARRAY);
        bb_u32(&b, SP_GGUF_TYPE_STRING);
        bb_u64(&b, bad[i]);
        bb_zeros(&b, 100);
        REJECT(&b, "strings runs past end of file");
        bb_free(&b);
    }
    /* a count that fits, with one string inside running past the end */
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "tokenizer.ggml.tokens");
    bb_u32(&b, SP_GGUF_TYPE_ARRAY);
    bb_u32(&b, SP_GGUF_TYPE_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "ok");
    bb_u64(&b, 50);
    bb_zeros(&b, 10);
    REJECT(&b, "array string length 50");
    bb_free(&b);
}

/* ---- G6: nested arrays and unknown types --------------------------------------- */

TEST(gguf_g6_nested_and_unknown_types)
{
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "x.nested");
    bb_u32(&b, SP_GGUF_TYPE_ARRAY);
    bb_u32(&b, SP_GGUF_TYPE_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, SP_GGUF_TYPE_UINT8);
    bb_u64(&b, 1);
    bb_zeros(&b, 8);
    REJECT(&b, "nested arrays");
    bb_free(&b);

    uint32_t bad[] = {13, 255, 0xffffffffu};
    for (size_t i = 0; i < 3; i++) {
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "x.unknown");
        bb_u32(&b, bad[i]);
        bb_zeros(&b, 16);
        REJECT(&b, "unknown value type");
        bb_free(&b);
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "x.unknown_elem");
        bb_u32(&b, SP_GGUF_TYPE_ARRAY);
        bb_u32(&b, bad[i]);
        bb_u64(&b, 1);
        bb_zeros(&b, 16);
        REJECT(&b, "unknown array element type");
        bb_free(&b);
    }
}

/* ---- G7: keys and names --------------------------------------------------------- */

TEST(gguf_g7_keys_and_names)
{
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "", 1);
    REJECT(&b, "empty key");
    bb_free(&b);

    bb_header(&b, 3, 0, 3);
    bb_kv_u32(&b, "a.b", 1);
    bb_kv_u32(&b, "c.d", 1);
    bb_kv_u32(&b, "a.b", 2);
    REJECT(&b, "duplicate key 'a.b'");
    bb_free(&b);

    /* control bytes in a key are escaped in the message */
    bb_header(&b, 3, 0, 2);
    bb_kv_u32(&b, "x\ny", 1);
    bb_kv_u32(&b, "x\ny", 1);
    REJECT(&b, "duplicate key 'x\\x0ay'");
    bb_free(&b);

    uint64_t ne[1] = {8};
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "w", 1, ne, SP_TYPE_F32, 0);
    bb_tensor(&b, "w", 1, ne, SP_TYPE_F32, 32);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    REJECT(&b, "duplicate tensor name 'w'");
    bb_free(&b);

    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "", 1, ne, SP_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 32);
    REJECT(&b, "empty name");
    bb_free(&b);

    char name[SP_GGUF_MAX_NAME + 1];
    memset(name, 'n', SP_GGUF_MAX_NAME);
    name[SP_GGUF_MAX_NAME] = '\0';
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, name, 1, ne, SP_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 32);
    REJECT(&b, "name is 64 bytes");
    bb_free(&b);

    name[SP_GGUF_MAX_NAME - 1] = '\0'; /* 63 bytes: the longest allowed */
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, name, 1, ne, SP_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 32);
    sp_gguf_t *g = ACCEPT(&b);
    ASSERT(sp_gguf_find_tensor(g, name) != NULL);
    sp_gguf_close(g);
    bb_free(&b);
}

/* ---- G8-G10: tensor shapes and types ---------------------------------------------- */

static void
one_tensor(bb *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset,
           size_t data_bytes)
{
    bb_header(b, 3, 1, 0);
    bb_tensor(b, "blk.0.attn_q.weight", n_dims, ne, type, offset);
    bb_pad(b, 32);
    bb_zeros(b, data_bytes);
}

TEST(gguf_g8_n_dims)
{
    uint64_t ne[5] = {8, 1, 1, 1, 1};
    bb b = {0};
    one_tensor(&b, 5, ne, SP_TYPE_F32, 0, 64);
    REJECT(&b, "n_dims 5 exceeds 4");
    bb_free(&b);
    bb_header(&b, 3, 1, 0);
    bb_str(&b, "t");
    bb_u32(&b, 0xffffffffu);
    bb_zeros(&b, 100);
    REJECT(&b, "n_dims 4294967295");
    bb_free(&b);
    one_tensor(&b, 4, ne, SP_TYPE_F32, 0, 32);
    sp_gguf_t *g = ACCEPT(&b);
    sp_gguf_close(g);
    bb_free(&b);
}

TEST(gguf_g9_dims_negative_and_overflow)
{
    bb b = {0};
    uint64_t neg[2] = {8, (uint64_t)-1};
    one_tensor(&b, 2, neg, SP_TYPE_F32, 0, 64);
    REJECT(&b, "is negative");
    bb_free(&b);
    uint64_t big[3] = {(1ull << 42) + 1, 1ull << 22, 2};
    one_tensor(&b, 3, big, SP_TYPE_I8, 0, 64);
    REJECT(&b, "element count overflows");
    bb_free(&b);
    /* elements fit int64 but bytes do not fit size_t */
    uint64_t bytes[2] = {1ull << 32, 1ull << 30};
    one_tensor(&b, 2, bytes, SP_TYPE_F64, 0, 64);
    REJECT(&b, "byte size overflows");
    bb_free(&b);
    /* a zero dimension is an empty tensor, accepted */
    uint64_t zero[2] = {8, 0};
    one_tensor(&b, 2, zero, SP_TYPE_F32, 0, 0);
    sp_gguf_t *g = ACCEPT(&b);
    ASSERT_EQ(sp_gguf_tensor(g, 0)->nbytes, 0);
    sp_gguf_close(g);
    bb_free(&b);
}

TEST(gguf_g10_type_and_block)
{
    bb b = {0};
    uint64_t ne[1] = {32};
    uint32_t bad[] = {4, 5, 38, 40, 1000, 0xffffffffu};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        one_tensor(&b, 1, ne, bad[i], 0, 128);
        REJECT(&b, "unknown type");
        bb_free(&b);
    }
    uint64_t ne33[1] = {33};
    one_tensor(&b, 1, ne33, SP_TYPE_Q8_0, 0, 128);
    REJECT(&b, "not a multiple of the q8_0 block size 32");
    bb_free(&b);
    uint64_t ne128[1] = {128};
    one_tensor(&b, 1, ne128, SP_TYPE_Q4_K, 0, 512);
    REJECT(&b, "q4_k block size 256");
    bb_free(&b);
    one_tensor(&b, 1, ne, SP_TYPE_Q8_0, 0, 34);
    sp_gguf_t *g = ACCEPT(&b);
    ASSERT_EQ(sp_gguf_tensor(g, 0)->nbytes, 34);
    sp_gguf_close(g);
    bb_free(&b);
}

/* ---- G11/G12: offsets and sizes -------------------------------------------------- */

static void
two_tensors(bb *b, uint64_t off_a, uint64_t off_b, const uint64_t *ne_a, uint32_t type,
            size_t data_bytes)
{
    uint64_t ne8[1] = {8};
    bb_header(b, 3, 2, 0);
    bb_tensor(b, "a", 1, ne_a ? ne_a : ne8, type, off_a);
    bb_tensor(b, "b", 1, ne_a ? ne_a : ne8, type, off_b);
    bb_pad(b, 32);
    bb_zeros(b, data_bytes);
}

TEST(gguf_g11_offsets)
{
    bb b = {0};
    two_tensors(&b, 0, 32, NULL, SP_TYPE_F32, 64);
    sp_gguf_t *g = ACCEPT(&b);
    sp_gguf_close(g);
    bb_free(&b);

    two_tensors(&b, 0, 0, NULL, SP_TYPE_F32, 64); /* overlap */
    REJECT(&b, "tensor 'b': offset 0, expected 32");
    bb_free(&b);
    two_tensors(&b, 32, 0, NULL, SP_TYPE_F32, 64); /* backwards */
    REJECT(&b, "tensor 'a': offset 32, expected 0");
    bb_free(&b);
    two_tensors(&b, 0, 64, NULL, SP_TYPE_F32, 128); /* gap */
    REJECT(&b, "tensor 'b': offset 64, expected 32");
    bb_free(&b);
    two_tensors(&b, 0, 33, NULL, SP_TYPE_F32, 128); /* misaligned */
    REJECT(&b, "not a multiple of the alignment");
    bb_free(&b);
    two_tensors(&b, 0, 32, NULL, SP_TYPE_F32, 63); /* last tensor short by one byte */
    REJECT(&b, "tensor 'b': data at offset 32 (32 bytes) runs past end of file");
    bb_free(&b);
    two_tensors(&b, 0, 1ull << 62, NULL, SP_TYPE_F32, 64); /* far past EOF */
    REJECT(&b, "tensor 'b'");
    bb_free(&b);

    /* tensor infos end exactly at EOF: the data section would start past it */
    uint64_t ne8[1] = {8};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "a", 1, ne8, SP_TYPE_F32, 0);
    REJECT(&b, "past end of file");
    bb_free(&b);
}

TEST(gguf_g12_size_sums)
{
    /* CVE-2026-27940: two I8 tensors of 0x7FFFFFFFFFFFFFC0 elements each */
    bb b = {0};
    uint64_t ne[1] = {0x7FFFFFFFFFFFFFC0ull};
    two_tensors(&b, 0, 0x7FFFFFFFFFFFFFC0ull, ne, SP_TYPE_I8, 600);
    REJECT(&b, "tensor 'a'");
    bb_free(&b);
    /* the wrapped second offset must not make it through either */
    two_tensors(&b, 0, 0x8000000000000000ull, ne, SP_TYPE_I8, 600);
    REJECT(&b, "runs past end of file");
    bb_free(&b);
    uint64_t ne_f32[1] = {0x3FFFFFFFFFFFFFF0ull};
    two_tensors(&b, 0, 0xFFFFFFFFFFFFFFC0ull, ne_f32, SP_TYPE_F32, 600);
    REJECT(&b, "tensor 'a'");
    bb_free(&b);
}

/* ---- G13: alignment ---------------------------------------------------------------- */

TEST(gguf_g13_alignment)
{
    uint32_t bad[] = {0, 13, 1u << 30, SP_GGUF_MAX_ALIGNMENT * 2, 48};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bb b = {0};
        bb_header(&b, 3, 0, 1);
        bb_kv_u32(&b, "general.alignment", bad[i]);
        REJECT(&b, "is not a power of two");
        bb_free(&b);
    }
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, SP_GGUF_TYPE_INT32);
    bb_u32(&b, 32);
    REJECT(&b, "general.alignment has type i32, expected u32");
    bb_free(&b);
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, SP_GGUF_TYPE_STRING);
    bb_str(&b, "32");
    REJECT(&b, "general.alignment has type str");
    bb_free(&b);

    /* 64 works, and moves the data start and the required offsets */
    uint64_t ne[1] = {8};
    bb_header(&b, 3, 2, 1);
    bb_kv_u32(&b, "general.alignment", 64);
    bb_tensor(&b, "a", 1, ne, SP_TYPE_F32, 0);
    bb_tensor(&b, "b", 1, ne, SP_TYPE_F32, 64);
    bb_pad(&b, 64);
    bb_zeros(&b, 96);
    sp_gguf_t *g = ACCEPT(&b);
    ASSERT_EQ(sp_gguf_alignment(g), 64);
    ASSERT_EQ(sp_gguf_data_offset(g) % 64, 0);
    sp_gguf_close(g);
    bb_free(&b);
}

/* ---- G18: truncation and byte flips ------------------------------------------------- */

/* A small valid file from the writer: every kv kind, a string array, three tensors. */
static void
writer_file(void **buf, size_t *len)
{
    sp_gguf_writer_t *w = NULL;
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", "llama"));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.block_count", 1));
    ASSERT_OK(sp_gguf_writer_set_i32(w, "x.i32", -5));
    ASSERT_OK(sp_gguf_writer_set_u64(w, "x.u64", 1ull << 40));
    ASSERT_OK(sp_gguf_writer_set_f32(w, "x.f32", 0.5f));
    ASSERT_OK(sp_gguf_writer_set_bool(w, "x.bool", true));
    const char *toks[] = {"<unk>", "a", "", "bb"};
    ASSERT_OK(sp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4));
    float scores[4] = {0.f, -1.f, -2.f, -3.f};
    ASSERT_OK(sp_gguf_writer_set_arr(w, "tokenizer.ggml.scores", SP_GGUF_TYPE_FLOAT32, 4, scores));
    static float data[64];
    for (int i = 0; i < 64; i++) {
        data[i] = (float)i * 0.25f;
    }
    int64_t ne_a[2] = {8, 4}, ne_b[1] = {8}, ne_c[1] = {32};
    ASSERT_OK(sp_gguf_writer_add_tensor(w, "a", SP_TYPE_F32, 2, ne_a, data));
    ASSERT_OK(sp_gguf_writer_add_tensor(w, "b", SP_TYPE_F32, 1, ne_b, data));
    ASSERT_OK(sp_gguf_writer_add_tensor(w, "c", SP_TYPE_F32, 1, ne_c, data)); /* 128 B: no tail */
    char err[256];
    ASSERT_OK(sp_gguf_writer_write_mem(w, buf, len, err, sizeof err));
    sp_gguf_writer_destroy(w);
}

TEST(gguf_g18_every_prefix_rejected)
{
    void *buf;
    size_t len;
    writer_file(&buf, &len);
    char err[512];
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open_mem(buf, len, "w.gguf", &g, err, sizeof err));
    sp_gguf_close(g);
    size_t before = sp_alloc_bytes_in_use();
    for (size_t n = 0; n < len; n++) {
        /* a fresh exact-size copy so ASan sees any read past the prefix */
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, buf, n);
        sp_status_t st = sp_gguf_open_mem(p, n, "w.gguf", &g, err, sizeof err);
        if (st == SP_OK) {
            SP_TEST_FAIL("prefix of %zu of %zu bytes accepted", n, len);
        }
        ASSERT(g == NULL);
        ASSERT(strstr(err, "w.gguf") != NULL);
        free(p);
    }
    ASSERT_EQ(sp_alloc_bytes_in_use(), before);
    sp_free(buf);
}

static uint64_t
rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

TEST(gguf_g18_random_byte_flips)
{
    void *buf;
    size_t len;
    writer_file(&buf, &len);
    uint8_t *p = malloc(len);
    uint64_t seed = 0x5eed1234abcdull;
    int n_ok = 0, n_bad = 0;
    size_t before = sp_alloc_bytes_in_use();
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(p, buf, len);
        int flips = 1 + (int)(rng_next(&seed) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(rng_next(&seed) % len);
            uint64_t r = rng_next(&seed);
            if (r & 1) {
                p[at] ^= (uint8_t)(1u << ((r >> 1) % 8));
            } else {
                p[at] = (uint8_t)(r >> 8);
            }
        }
        char err[512];
        sp_gguf_t *g = NULL;
        if (sp_gguf_open_mem(p, len, "flip.gguf", &g, err, sizeof err) == SP_OK) {
            n_ok++;
            /* whatever was accepted must be readable without going out of bounds */
            for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
                const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
                ASSERT((const uint8_t *)t->data + t->nbytes <= p + len);
            }
            for (int64_t i = 0; i < sp_gguf_n_kv(g); i++) {
                sp_gguf_arr_t a;
                sp_str_t k = sp_gguf_kv_key(g, i);
                char key[1100];
                memcpy(key, k.ptr, k.len);
                key[k.len] = '\0';
                if (sp_gguf_get_arr(g, key, &a, err, sizeof err) == SP_OK && a.n > 0) {
                    if (a.strs) {
                        ASSERT(a.strs[a.n - 1].ptr + a.strs[a.n - 1].len <= (const char *)p + len);
                    } else {
                        (void)sp_gguf_arr_float(&a, a.n - 1);
                        (void)sp_gguf_arr_int(&a, a.n - 1);
                    }
                }
            }
            sp_gguf_close(g);
        } else {
            ASSERT(g == NULL);
            n_bad++;
        }
    }
    ASSERT_EQ(sp_alloc_bytes_in_use(), before);
    ASSERT(n_bad > 0);
    free(p);
    sp_free(buf);
}

/* ---- writer ---------------------------------------------------------------------- */

static sp_status_t
fill_rows(void *user, int64_t row0, int64_t n_rows, void *dst, char *err, size_t err_len)
{
    (void)user;
    (void)err;
    (void)err_len;
    float *f = dst;
    for (int64_t r = 0; r < n_rows; r++) {
        for (int j = 0; j < 16; j++) {
            f[r * 16 + j] = (float)((row0 + r) * 100 + j);
        }
    }
    return SP_OK;
}

static sp_status_t
fill_fail(void *user, int64_t row0, int64_t n_rows, void *dst, char *err, size_t err_len)
{
    return sp_errf(err, err_len, SP_ERR_IO, "fill failed on purpose");
}

TEST(gguf_writer_round_trip)
{
    void *buf;
    size_t len;
    writer_file(&buf, &len);
    char err[256];
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open_mem(buf, len, "rt.gguf", &g, err, sizeof err));
    ASSERT_EQ(sp_gguf_version(g), 3);
    ASSERT_EQ(sp_gguf_n_kv(g), 8);
    int64_t v;
    ASSERT_OK(sp_gguf_get_int(g, "x.i32", &v, err, sizeof err));
    ASSERT_EQ(v, -5);
    ASSERT_OK(sp_gguf_get_int(g, "x.u64", &v, err, sizeof err));
    ASSERT_EQ(v, 1ll << 40);
    double d;
    ASSERT_OK(sp_gguf_get_float(g, "x.f32", &d, err, sizeof err));
    ASSERT_EQ(d, 0.5);
    bool bv = false;
    ASSERT_OK(sp_gguf_get_bool(g, "x.bool", &bv, err, sizeof err));
    ASSERT(bv);
    sp_gguf_arr_t a;
    ASSERT_OK(sp_gguf_get_arr(g, "tokenizer.ggml.tokens", &a, err, sizeof err));
    ASSERT_EQ(a.n, 4);
    ASSERT(sp_str_eq_c(a.strs[3], "bb"));
    ASSERT_EQ(a.strs[2].len, 0);
    ASSERT_OK(sp_gguf_get_arr(g, "tokenizer.ggml.scores", &a, err, sizeof err));
    ASSERT_EQ(sp_gguf_arr_float(&a, 3), -3.0);
    ASSERT_EQ(sp_gguf_arr_int(&a, 2), -2);
    const sp_gguf_tensor_t *t = sp_gguf_find_tensor(g, "a");
    ASSERT(t && t->ne[0] == 8 && t->ne[1] == 4 && t->nbytes == 128);
    float f;
    memcpy(&f, (const uint8_t *)t->data + 4 * 31, 4);
    ASSERT_EQ(f, 31 * 0.25f);

    /* copy everything into a second writer, override one key, add a streamed tensor */
    sp_gguf_writer_t *w = NULL;
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, g));
    ASSERT_OK(sp_gguf_writer_set_u32(w, "llama.block_count", 7));
    ASSERT_OK(sp_gguf_writer_set_alignment(w, 64));
    int64_t ne[2] = {16, 5};
    ASSERT_OK(sp_gguf_writer_add_tensor_fill(w, "s", SP_TYPE_F32, 2, ne, fill_rows, NULL));
    ASSERT_EQ(sp_gguf_writer_add_tensor_fill(w, "s", SP_TYPE_F32, 2, ne, fill_rows, NULL),
              SP_ERR_INVALID); /* duplicate name */
    int64_t ne_bad[1] = {33};
    ASSERT_EQ(sp_gguf_writer_add_tensor(w, "q", SP_TYPE_Q8_0, 1, ne_bad, NULL), SP_ERR_INVALID);
    ASSERT_EQ(sp_gguf_writer_set_alignment(w, 48), SP_ERR_INVALID);
    ASSERT_EQ(sp_gguf_writer_set_u32(w, "", 1), SP_ERR_INVALID);
    char path[512];
    snprintf(path, sizeof path, "%s/rt2.gguf", sp_test_tmpdir());
    ASSERT_OK(sp_gguf_writer_write(w, path, err, sizeof err));
    sp_gguf_writer_destroy(w);
    sp_gguf_close(g);
    sp_free(buf);

    ASSERT_OK(sp_gguf_open(path, &g, err, sizeof err));
    ASSERT_EQ(sp_gguf_alignment(g), 64);
    ASSERT_EQ(sp_gguf_n_kv(g), 9); /* 8 copied + general.alignment */
    ASSERT_OK(sp_gguf_get_int(g, "llama.block_count", &v, err, sizeof err));
    ASSERT_EQ(v, 7);
    t = sp_gguf_find_tensor(g, "s");
    ASSERT(t != NULL && t->nbytes == 16 * 5 * 4);
    memcpy(&f, (const uint8_t *)t->data + 4 * (16 * 4 + 3), 4);
    ASSERT_EQ(f, 403.0f);
    sp_gguf_close(g);

    /* a failing fill aborts the write, leaves no file and passes the message on */
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_add_tensor_fill(w, "s", SP_TYPE_F32, 2, ne, fill_fail, NULL));
    snprintf(path, sizeof path, "%s/fail.gguf", sp_test_tmpdir());
    ASSERT_EQ(sp_gguf_writer_write(w, path, err, sizeof err), SP_ERR_IO);
    ASSERT(strstr(err, "on purpose") != NULL);
    ASSERT(access(path, F_OK) != 0);
    sp_gguf_writer_destroy(w);
    sp_gguf_writer_destroy(NULL);
}

TEST(gguf_writer_copies_demo_model)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    char err[256];
    sp_gguf_t *g = NULL, *g2 = NULL;
    ASSERT_OK(sp_gguf_open(DEMO_MODEL, &g, err, sizeof err));
    sp_gguf_writer_t *w = NULL;
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_copy_kv(w, g));
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        char name[SP_GGUF_MAX_NAME];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        ASSERT_OK(sp_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data));
    }
    void *buf;
    size_t len;
    ASSERT_OK(sp_gguf_writer_write_mem(w, &buf, &len, err, sizeof err));
    sp_gguf_writer_destroy(w);
    /* same layout as llama.cpp's writer: byte-identical to the original */
    ASSERT_EQ(len, sp_gguf_file_size(g));
    ASSERT_OK(sp_gguf_open_mem(buf, len, "copy", &g2, err, sizeof err));
    ASSERT_EQ(sp_gguf_n_kv(g2), sp_gguf_n_kv(g));
    ASSERT_EQ(sp_gguf_data_offset(g2), sp_gguf_data_offset(g));
    const sp_gguf_tensor_t *a = sp_gguf_find_tensor(g, "output.weight");
    const sp_gguf_tensor_t *b = sp_gguf_find_tensor(g2, "output.weight");
    ASSERT(memcmp(a->data, b->data, a->nbytes) == 0);
    sp_gguf_close(g2);
    sp_gguf_close(g);
    sp_free(buf);
}

TEST(gguf_oom_cleanup)
{
    void *buf;
    size_t len;
    writer_file(&buf, &len);
    char err[256];
    size_t before = sp_alloc_bytes_in_use();
    int opened = 0;
    for (int n = 0; n < 20 && !opened; n++) {
        sp_gguf_t *g = NULL;
        sp_alloc_fail_after(n);
        sp_status_t st = sp_gguf_open_mem(buf, len, "oom", &g, err, sizeof err);
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            opened = 1;
            sp_gguf_close(g);
        } else {
            ASSERT_EQ(st, SP_ERR_NOMEM);
            ASSERT(g == NULL);
        }
        ASSERT_EQ(sp_alloc_bytes_in_use(), before);
    }
    ASSERT(opened);
    sp_free(buf);
}

/* ---- the file changing under an open handle ------------------------------ */

/* Copy the demo model to dst; its size in *size. */
static void
copy_demo(const char *dst, size_t *size)
{
    FILE *in = fopen(DEMO_MODEL, "rb"), *out = fopen(dst, "wb");
    ASSERT(in != NULL && out != NULL);
    char buf[65536];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        ASSERT_EQ(fwrite(buf, 1, n, out), n);
        total += n;
    }
    fclose(in);
    ASSERT_EQ(fclose(out), 0);
    *size = total;
}

TEST(gguf_copy_survives_truncation_and_overwrite)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/copy.gguf", sp_test_tmpdir());
    size_t size;
    copy_demo(path, &size);
    sp_gguf_set_copy_max(size); /* this file exactly: copied */
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open(path, &g, err, sizeof err));
    ASSERT(sp_gguf_is_copy(g));
    ASSERT(!sp_gguf_file_changed(g));
    const sp_gguf_tensor_t *t = sp_gguf_tensor(g, sp_gguf_n_tensors(g) - 1);
    uint8_t *before = malloc(t->nbytes);
    ASSERT(before != NULL);
    memcpy(before, t->data, t->nbytes);

    /* Overwritten in place with other bytes, then cut short: the copy is untouched. */
    FILE *f = fopen(path, "r+b");
    ASSERT(f != NULL);
    ASSERT_EQ(fseek(f, (long)(sp_gguf_data_offset(g) + t->offset), SEEK_SET), 0);
    for (size_t i = 0; i < t->nbytes; i++) {
        fputc(0x7f, f);
    }
    ASSERT_EQ(fclose(f), 0);
    ASSERT_EQ(truncate(path, 1000), 0);
    ASSERT(memcmp(before, t->data, t->nbytes) == 0);
    ASSERT(!sp_gguf_weights_changed(g)); /* nothing outside reaches a copy */
    ASSERT(sp_gguf_file_changed(g));     /* but the file is another one: reload */
    sp_gguf_close(g);
    free(before);
    sp_gguf_set_copy_max(0);
}

TEST(gguf_mapped_truncation_is_caught)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/mapped.gguf", sp_test_tmpdir());
    size_t size;
    copy_demo(path, &size);
    sp_gguf_set_copy_max(0); /* mapped */
    sp_gguf_set_guard(true);
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open(path, &g, err, sizeof err));
    ASSERT(!sp_gguf_is_copy(g));
    ASSERT(!sp_gguf_weights_changed(g));
    ASSERT(!sp_gguf_file_changed(g));
    const sp_gguf_tensor_t *t = sp_gguf_tensor(g, sp_gguf_n_tensors(g) - 1);
    /* Cut the file well before the last tensor: reading it would be SIGBUS. */
    ASSERT_EQ(truncate(path, 16384), 0);
    uint8_t *got = malloc(t->nbytes);
    ASSERT(got != NULL);
    const volatile uint8_t *src = t->data;
    for (size_t i = 0; i < t->nbytes; i++) {
        got[i] = src[i]; /* past the new end: SIGBUS, which the guard turns into zeros */
    }
    bool zeros = true;
    for (size_t i = 0; i < t->nbytes; i++) {
        zeros &= got[i] == 0;
    }
    ASSERT(zeros);
    ASSERT(sp_gguf_weights_changed(g));
    ASSERT(sp_gguf_file_changed(g));
    sp_gguf_close(g);
    free(got);
}

TEST(gguf_mapped_overwrite_is_seen)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/mapped2.gguf", sp_test_tmpdir());
    size_t size;
    copy_demo(path, &size);
    sp_gguf_set_copy_max(0);
    sp_gguf_t *g = NULL;
    ASSERT_OK(sp_gguf_open(path, &g, err, sizeof err));
    /* Same size, other bytes, a later mtime: the per-step check sees it. */
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1, 0}};
    FILE *f = fopen(path, "r+b");
    ASSERT(f != NULL);
    ASSERT_EQ(fseek(f, (long)size - 4, SEEK_SET), 0);
    fputc(0x11, f);
    ASSERT_EQ(fclose(f), 0);
    ASSERT_EQ(utimensat(AT_FDCWD, path, ts, 0), 0); /* an mtime surely not the one at open */
    ASSERT(sp_gguf_weights_changed(g));
    ASSERT(sp_gguf_file_changed(g));
    sp_gguf_close(g);
    /* A buffer handle never changes. */
    static const uint8_t junk[4] = {0};
    ASSERT(sp_gguf_open_mem(junk, sizeof junk, "junk", &g, err, sizeof err) != SP_OK);
}
