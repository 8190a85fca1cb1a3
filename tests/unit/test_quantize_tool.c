/*
 * test_quantize_tool.c - `sampan quantize` end to end: convert, reopen, compare
 * the dequantized weights with the originals, check the metadata and the
 * per-tensor type choices; and `sampan inspect` on good and bad files.
 */
#include "test.h"

#include <unistd.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tools/tools.h"

#define DEMO_MODEL "models/stories260K.gguf"

static int
run_quantize(const char *in, const char *out, const char *type)
{
    char *argv[] = {"quantize", (char *)in, (char *)out, (char *)type, "--threads", "2",
                    "--no-progress", NULL};
    int rc = sp_cmd_quantize(7, argv);
    fflush(stdout);
    return rc;
}

static const char *
tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", sp_test_tmpdir(), name);
    return buf[k];
}

/* Every row of b (any type) dequantized against a's float rows: max |err| relative to the
 * row's max |x|, and the relative RMS error over the tensor. */
static void
compare_tensor(const sp_gguf_tensor_t *a, const sp_gguf_tensor_t *b, double max_rel,
               double max_rms)
{
    ASSERT_EQ(a->ne[0], b->ne[0]);
    ASSERT_EQ(a->ne[1], b->ne[1]);
    int64_t ne0 = a->ne[0], rows = a->ne[1] * a->ne[2] * a->ne[3];
    float *x = malloc((size_t)ne0 * sizeof *x), *y = malloc((size_t)ne0 * sizeof *y);
    size_t ra = sp_row_size(a->type, ne0), rb = sp_row_size(b->type, ne0);
    double se = 0, sx = 0;
    for (int64_t r = 0; r < rows; r++) {
        ASSERT(sp_dequantize_row(a->type, (const uint8_t *)a->data + r * ra, x, ne0));
        ASSERT(sp_dequantize_row(b->type, (const uint8_t *)b->data + r * rb, y, ne0));
        double amax = 0;
        for (int64_t i = 0; i < ne0; i++) {
            amax = fmax(amax, fabs(x[i]));
        }
        for (int64_t i = 0; i < ne0; i++) {
            double e = fabs((double)x[i] - y[i]);
            if (e > max_rel * amax + 1e-7) {
                SP_TEST_FAIL("%.*s row %" PRId64 " col %" PRId64 ": %g vs %g (amax %g)",
                             (int)a->name.len, a->name.ptr, r, i, x[i], y[i], amax);
            }
            se += e * e;
            sx += (double)x[i] * x[i];
        }
    }
    if (sx > 0) {
        double rms = sqrt(se / sx);
        if (rms > max_rms) {
            SP_TEST_FAIL("%.*s: relative rms error %g > %g", (int)a->name.len, a->name.ptr, rms,
                         max_rms);
        }
    }
    free(x);
    free(y);
}

static void
check_demo(const char *type, sp_type_t want, uint32_t ftype, double max_rel, double max_rms)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    const char *out = tmp_path("out.gguf");
    ASSERT_EQ(run_quantize(DEMO_MODEL, out, type), 0);
    char err[256];
    sp_gguf_t *a = NULL, *b = NULL;
    ASSERT_OK(sp_gguf_open(DEMO_MODEL, &a, err, sizeof err));
    ASSERT_OK(sp_gguf_open(out, &b, err, sizeof err));

    /* metadata: everything copied, file type and quantization version set */
    ASSERT_EQ(sp_gguf_n_kv(b), sp_gguf_n_kv(a) + 1); /* + general.quantization_version */
    int64_t v;
    ASSERT_OK(sp_gguf_get_int(b, "general.file_type", &v, err, sizeof err));
    ASSERT_EQ(v, ftype);
    ASSERT_OK(sp_gguf_get_int(b, "general.quantization_version", &v, err, sizeof err));
    ASSERT_EQ(v, 2);
    ASSERT_OK(sp_gguf_get_int(b, "llama.block_count", &v, err, sizeof err));
    ASSERT_EQ(v, 5);
    sp_gguf_arr_t ta, tb;
    ASSERT_OK(sp_gguf_get_arr(a, "tokenizer.ggml.tokens", &ta, err, sizeof err));
    ASSERT_OK(sp_gguf_get_arr(b, "tokenizer.ggml.tokens", &tb, err, sizeof err));
    ASSERT_EQ(tb.n, 512);
    for (uint64_t i = 0; i < tb.n; i++) {
        ASSERT(ta.strs[i].len == tb.strs[i].len &&
               memcmp(ta.strs[i].ptr, tb.strs[i].ptr, ta.strs[i].len) == 0);
    }

    ASSERT_EQ(sp_gguf_n_tensors(b), 48);
    for (int64_t i = 0; i < sp_gguf_n_tensors(a); i++) {
        const sp_gguf_tensor_t *ta_ = sp_gguf_tensor(a, i);
        const sp_gguf_tensor_t *tb_ = sp_gguf_tensor(b, i);
        ASSERT(ta_->name.len == tb_->name.len &&
               memcmp(ta_->name.ptr, tb_->name.ptr, ta_->name.len) == 0);
        if (ta_->n_dims == 1) {
            ASSERT_EQ(tb_->type, SP_TYPE_F32); /* norms stay f32 */
            ASSERT(memcmp(ta_->data, tb_->data, ta_->nbytes) == 0);
        } else if (ta_->ne[0] % sp_type_traits(want)->blck_size == 0) {
            ASSERT_EQ(tb_->type, want);
            compare_tensor(ta_, tb_, max_rel, max_rms);
        } else {
            ASSERT_EQ(tb_->type, SP_TYPE_F32); /* ffn_down: ne[0] = 172 fits no block of 32 */
            ASSERT(memcmp(ta_->data, tb_->data, ta_->nbytes) == 0);
        }
    }
    ASSERT_EQ(sp_gguf_find_tensor(b, "token_embd.weight")->type, want);
    ASSERT_EQ(sp_gguf_find_tensor(b, "output.weight")->type, want);
    sp_gguf_close(a);
    sp_gguf_close(b);
}

TEST(quantize_demo_q8_0)
{
    /* q8_0: error <= half a step of amax/127 per block, so <= amax/254 per row */
    check_demo("q8_0", SP_TYPE_Q8_0, 7, 1.0 / 250, 0.01);
}

TEST(quantize_demo_f16)
{
    check_demo("f16", SP_TYPE_F16, 1, 1.0 / 1024, 1e-3);
}

TEST(quantize_demo_q4_0)
{
    check_demo("q4_0", SP_TYPE_Q4_0, 2, 1.0 / 7, 0.15);
}

/* A synthetic model where k-quants fit: rows of 256. */
static const char *
make_synthetic(void)
{
    static float w[256 * 8], norm[256], big[256 * 512]; /* big: enough rows for the pool */
    static sp_fp16_t wh[256 * 4];
    static sp_block_q8_0 wq[8 * 4];
    uint64_t s = 12345;
    for (int i = 0; i < 256 * 8; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    for (int i = 0; i < 256 * 512; i++) {
        big[i] = w[(i * 7) % (256 * 8)] * (float)(1 + i % 5);
    }
    for (int i = 0; i < 256; i++) {
        norm[i] = 1.0f + (float)i / 256.0f;
    }
    for (int i = 0; i < 256 * 4; i++) {
        wh[i] = sp_fp32_to_fp16(w[i]);
    }
    ASSERT(sp_quantize_row(SP_TYPE_Q8_0, w, wq, 256 * 4));
    sp_gguf_writer_t *wr = NULL;
    ASSERT_OK(sp_gguf_writer_create(&wr));
    ASSERT_OK(sp_gguf_writer_set_str(wr, "general.architecture", "llama"));
    ASSERT_OK(sp_gguf_writer_set_u32(wr, "general.file_type", 0));
    int64_t ne2[2] = {256, 8}, ne4[2] = {256, 4}, ne1[1] = {256}, ne96[2] = {96, 4};
    int64_t ne_big[2] = {256, 512};
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "token_embd.weight", SP_TYPE_F32, 2, ne2, w));
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "blk.0.attn_norm.weight", SP_TYPE_F32, 1, ne1, norm));
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "blk.0.attn_q.weight", SP_TYPE_F16, 2, ne4, wh));
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "blk.0.attn_k.weight", SP_TYPE_Q8_0, 2, ne4, wq));
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "blk.0.ffn_down.weight", SP_TYPE_F32, 2, ne96, w));
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "blk.0.ffn_up.weight", SP_TYPE_F32, 2, ne_big, big));
    ASSERT_OK(sp_gguf_writer_add_tensor(wr, "output.weight", SP_TYPE_F32, 2, ne2, w));
    const char *path = tmp_path("synthetic.gguf");
    char err[256];
    ASSERT_OK(sp_gguf_writer_write(wr, path, err, sizeof err));
    sp_gguf_writer_destroy(wr);
    return path;
}

TEST(quantize_synthetic_kquants_and_inputs)
{
    const char *in = make_synthetic();
    const char *out = tmp_path("q4k.gguf");
    ASSERT_EQ(run_quantize(in, out, "q4_k"), 0);
    char err[256];
    sp_gguf_t *a = NULL, *b = NULL;
    ASSERT_OK(sp_gguf_open(in, &a, err, sizeof err));
    ASSERT_OK(sp_gguf_open(out, &b, err, sizeof err));
    int64_t v;
    ASSERT_OK(sp_gguf_get_int(b, "general.file_type", &v, err, sizeof err));
    ASSERT_EQ(v, 15);
    ASSERT_EQ(sp_gguf_find_tensor(b, "token_embd.weight")->type, SP_TYPE_Q4_K);
    ASSERT_EQ(sp_gguf_find_tensor(b, "output.weight")->type, SP_TYPE_Q6_K);
    ASSERT_EQ(sp_gguf_find_tensor(b, "blk.0.attn_norm.weight")->type, SP_TYPE_F32);
    ASSERT_EQ(sp_gguf_find_tensor(b, "blk.0.attn_q.weight")->type, SP_TYPE_Q4_K); /* from f16 */
    ASSERT_EQ(sp_gguf_find_tensor(b, "blk.0.ffn_down.weight")->type, SP_TYPE_Q8_0); /* 96 */
    /* an already quantized input is copied byte for byte */
    const sp_gguf_tensor_t *ka = sp_gguf_find_tensor(a, "blk.0.attn_k.weight");
    const sp_gguf_tensor_t *kb = sp_gguf_find_tensor(b, "blk.0.attn_k.weight");
    ASSERT_EQ(kb->type, SP_TYPE_Q8_0);
    ASSERT(memcmp(ka->data, kb->data, ka->nbytes) == 0);
    compare_tensor(sp_gguf_find_tensor(a, "token_embd.weight"),
                   sp_gguf_find_tensor(b, "token_embd.weight"), 0.2, 0.12);
    compare_tensor(sp_gguf_find_tensor(a, "output.weight"), sp_gguf_find_tensor(b, "output.weight"),
                   0.05, 0.03);
    compare_tensor(sp_gguf_find_tensor(a, "blk.0.attn_q.weight"),
                   sp_gguf_find_tensor(b, "blk.0.attn_q.weight"), 0.2, 0.12);
    ASSERT_EQ(sp_gguf_find_tensor(b, "blk.0.ffn_up.weight")->type, SP_TYPE_Q4_K);
    compare_tensor(sp_gguf_find_tensor(a, "blk.0.ffn_up.weight"),
                   sp_gguf_find_tensor(b, "blk.0.ffn_up.weight"), 0.2, 0.12);
    sp_gguf_close(a);
    sp_gguf_close(b);

    /* q6_k and bf16 on the same input */
    ASSERT_EQ(run_quantize(in, out, "q6_k"), 0);
    ASSERT_OK(sp_gguf_open(in, &a, err, sizeof err));
    ASSERT_OK(sp_gguf_open(out, &b, err, sizeof err));
    ASSERT_EQ(sp_gguf_find_tensor(b, "token_embd.weight")->type, SP_TYPE_Q6_K);
    compare_tensor(sp_gguf_find_tensor(a, "token_embd.weight"),
                   sp_gguf_find_tensor(b, "token_embd.weight"), 0.05, 0.03);
    sp_gguf_close(b);
    ASSERT_EQ(run_quantize(in, out, "bf16"), 0);
    ASSERT_OK(sp_gguf_open(out, &b, err, sizeof err));
    ASSERT_EQ(sp_gguf_find_tensor(b, "blk.0.ffn_down.weight")->type, SP_TYPE_BF16);
    compare_tensor(sp_gguf_find_tensor(a, "blk.0.ffn_down.weight"),
                   sp_gguf_find_tensor(b, "blk.0.ffn_down.weight"), 1.0 / 128, 4e-3);
    ASSERT_OK(sp_gguf_get_int(b, "general.file_type", &v, err, sizeof err));
    ASSERT_EQ(v, 32);
    sp_gguf_close(b);
    sp_gguf_close(a);
}

TEST(quantize_bad_input_and_args)
{
    const char *out = tmp_path("never.gguf");
    ASSERT_EQ(run_quantize("tests/data/no-such.gguf", out, "q8_0"), 1);
    ASSERT(access(out, F_OK) != 0);
    /* a truncated model */
    const char *bad = tmp_path("truncated.gguf");
    FILE *f = fopen(bad, "wb");
    ASSERT(f != NULL);
    fwrite("GGUF\3\0\0\0", 1, 8, f);
    fclose(f);
    ASSERT_EQ(run_quantize(bad, out, "q8_0"), 1);
    ASSERT(access(out, F_OK) != 0);
    ASSERT_EQ(run_quantize(bad, out, "q5_k"), 2);
    char *argv1[] = {"quantize", "a", NULL};
    ASSERT_EQ(sp_cmd_quantize(2, argv1), 2);
    char *argv2[] = {"quantize", "a", "b", "q8_0", "--threads", "0", NULL};
    ASSERT_EQ(sp_cmd_quantize(6, argv2), 2);
    char *argv3[] = {"inspect", (char *)bad, NULL};
    ASSERT_EQ(sp_cmd_inspect(2, argv3), 1);
    char *argv4[] = {"inspect", NULL};
    ASSERT_EQ(sp_cmd_inspect(1, argv4), 2);
}

TEST(inspect_demo_model)
{
    if (access(DEMO_MODEL, R_OK) != 0) {
        SKIP("%s not present", DEMO_MODEL);
    }
    /* capture stdout into a file and look for the estimate */
    const char *path = tmp_path("inspect.json");
    fflush(stdout);
    FILE *saved = fdopen(dup(fileno(stdout)), "w");
    ASSERT(freopen(path, "w", stdout) != NULL);
    char *argv[] = {"inspect", DEMO_MODEL, "--json", NULL};
    int rc = sp_cmd_inspect(3, argv);
    fflush(stdout);
    ASSERT(dup2(fileno(saved), fileno(stdout)) >= 0);
    fclose(saved);
    ASSERT_EQ(rc, 0);
    FILE *f = fopen(path, "r");
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* 2 * 5 layers * 512 ctx * (64 / 8) head dim * 4 kv heads * 4 bytes */
    ASSERT(strstr(buf, "\"kv_cache_bytes\": 655360") != NULL);
    ASSERT(strstr(buf, "\"n_params\": 292800") != NULL);
    ASSERT(strstr(buf, "\"weight_bytes\": 1171200") != NULL);
    ASSERT(strstr(buf, "\"architecture\": \"llama\"") != NULL);
    ASSERT(strstr(buf, "\"llama.block_count\": 5") != NULL);
    char *argv2[] = {"inspect", DEMO_MODEL, "--tensors", "--ctx", "1024", NULL};
    fflush(stdout);
    saved = fdopen(dup(fileno(stdout)), "w");
    ASSERT(freopen(path, "w", stdout) != NULL);
    rc = sp_cmd_inspect(5, argv2);
    fflush(stdout);
    ASSERT(dup2(fileno(saved), fileno(stdout)) >= 0);
    fclose(saved);
    ASSERT_EQ(rc, 0);
    f = fopen(path, "r");
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    ASSERT(strstr(buf, "1310720 (1.25 MiB) at 1024 tokens") != NULL);
    ASSERT(strstr(buf, "blk.4.ffn_up.weight") != NULL);
}
