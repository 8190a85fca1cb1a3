/*
 * perplexity.c - `sampan perplexity`: how well a model predicts a text, the
 * quality number that quantisation results (weights, KV cache) quote.
 *
 * The text is tokenized once (no BOS) and cut into consecutive windows of
 * n_ctx positions: the window starts with BOS when the vocabulary adds one,
 * then the next n_ctx - 1 (or n_ctx) text tokens; windows do not overlap. Each
 * window is evaluated from an empty cache in one pass with every position's
 * logits, and only the second half of its predictions is scored, so that every
 * scored token has at least n_ctx / 2 tokens of context (a token near the start
 * of a window is hard to predict for reasons that have nothing to do with the
 * model's precision). --score-all scores every prediction instead.
 *
 * Perplexity = exp(mean negative log-likelihood) over the scored tokens; the
 * log-softmax is done in double. The +/- is one standard error of the mean NLL
 * carried through exp (ppl * se), which is what two runs of the same text
 * (F32 vs Q8_0 KV, say) should be compared with: their difference is paired,
 * so it is far smaller than either error bar, and --json gives the per-token
 * NLL sums to compare exactly.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/timer.h"
#include "engine/model.h"
#include "text/tokenizer.h"
#include "tools/tools.h"

#define PPL_MAX_TEXT_BYTES (256u << 20)

static const char ppl_usage[] =
    "usage: sampan perplexity -m FILE -f TEXT [options]\n"
    "  perplexity of a GGUF model on a text file (UTF-8)\n"
    "  -m FILE         the model\n"
    "  -f TEXT         the text\n"
    "  -c N            window (context) size in tokens (default 256, at most the model's)\n"
    "  --chunks N      score at most N windows (default: all the text holds)\n"
    "  --score-all     score every prediction, not only each window's second half\n"
    "  --kv-type T     KV cache type: f32 (default), f16 or q8_0 (--kv-f16: f16)\n"
    "  -t N            threads (default one per core)\n"
    "  --json          one JSON object on stdout instead of the summary line\n";

enum { OPT_CHUNKS = 256, OPT_SCORE_ALL, OPT_KV_F16, OPT_KV_TYPE, OPT_JSON };

static const struct option ppl_opts[] = {
    {"chunks", required_argument, 0, OPT_CHUNKS},
    {"score-all", no_argument, 0, OPT_SCORE_ALL},
    {"kv-f16", no_argument, 0, OPT_KV_F16},
    {"kv-type", required_argument, 0, OPT_KV_TYPE},
    {"json", no_argument, 0, OPT_JSON},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

static int
ppl_int(const char *s, const char *flag, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "sampan perplexity: %s expects an integer in [%lld, %lld], got '%s'\n", flag,
                lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* -log softmax(row)[y], in double. */
static double
nll_of(const float *row, int64_t n_vocab, int32_t y)
{
    double mx = row[0];
    for (int64_t i = 1; i < n_vocab; i++) {
        mx = row[i] > mx ? row[i] : mx;
    }
    double sum = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        sum += exp((double)row[i] - mx);
    }
    return -((double)row[y] - mx - log(sum));
}

int
sp_cmd_perplexity(int argc, char **argv)
{
    const char *model = NULL, *text_path = NULL;
    long long n_ctx = 256, max_chunks = 0, n_threads = 0;
    bool score_all = false, json = false;
    sp_kv_type_t kv_type = SP_KV_TYPE_F32;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:f:c:t:h", ppl_opts, NULL)) != -1) {
        int bad = 0;
        switch (opt) {
        case 'm': model = optarg; break;
        case 'f': text_path = optarg; break;
        case 'c': bad = ppl_int(optarg, "-c", 8, 1 << 20, &n_ctx); break;
        case 't': bad = ppl_int(optarg, "-t", 0, 512, &n_threads); break;
        case OPT_CHUNKS: bad = ppl_int(optarg, "--chunks", 1, 1 << 30, &max_chunks); break;
        case OPT_SCORE_ALL: score_all = true; break;
        case OPT_KV_F16: kv_type = SP_KV_TYPE_F16; break;
        case OPT_KV_TYPE:
            if (sp_kv_type_from_name(optarg) < 0) {
                fprintf(stderr, "sampan perplexity: --kv-type must be f32, f16 or q8_0, got '%s'\n",
                        optarg);
                return 2;
            }
            kv_type = (sp_kv_type_t)sp_kv_type_from_name(optarg);
            break;
        case OPT_JSON: json = true; break;
        case 'h': fputs(ppl_usage, stdout); return 0;
        default: fputs(ppl_usage, stderr); return 2;
        }
        if (bad) {
            return 2;
        }
    }
    if (model == NULL || text_path == NULL || optind != argc) {
        fputs(ppl_usage, stderr);
        return 2;
    }

    int rc = 1;
    char err[512];
    size_t text_len = 0;
    char *text = NULL;
    int32_t *toks = NULL;
    sp_model_t *m = NULL;
    sp_ctx_t *c = NULL;
    if (sp_file_read(text_path, text_path, PPL_MAX_TEXT_BYTES, &text, &text_len, err,
                     sizeof err) != SP_OK) {
        fprintf(stderr, "sampan perplexity: %s\n", err);
        goto done;
    }
    int64_t t0 = sp_time_ns();
    if (sp_model_load(model, &m, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan perplexity: %s\n", err);
        goto done;
    }
    const sp_hparams_t *hp = sp_model_hparams(m);
    if (hp->n_ctx_train > 0 && n_ctx > hp->n_ctx_train) {
        fprintf(stderr, "sampan perplexity: -c %lld is more than the model's context (%lld)\n",
                n_ctx, (long long)hp->n_ctx_train);
        rc = 2;
        goto done;
    }
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = (int)n_threads;
    cp.logits_all = true;
    cp.kv_type = kv_type;
    if (sp_ctx_create(m, &cp, &c, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan perplexity: %s\n", err);
        goto done;
    }
    int64_t load_ns = sp_time_ns() - t0;

    const sp_tokenizer_t *tok = sp_model_tokenizer(m);
    int64_t n_text = sp_tokenizer_encode(tok, text, text_len, false, false, NULL, 0);
    if (n_text < 0) {
        fprintf(stderr, "sampan perplexity: %s: cannot tokenize (%s)\n", text_path,
                sp_status_str((sp_status_t)n_text));
        goto done;
    }
    toks = sp_malloc((size_t)(n_text > 0 ? n_text : 1) * sizeof(int32_t));
    if (toks == NULL || sp_tokenizer_encode(tok, text, text_len, false, false, toks, n_text) != n_text) {
        fprintf(stderr, "sampan perplexity: out of memory tokenizing %s\n", text_path);
        goto done;
    }
    int32_t bos = sp_tokenizer_add_bos(tok) ? sp_tokenizer_bos(tok) : -1;
    int64_t per_window = bos >= 0 ? n_ctx - 1 : n_ctx; /* text tokens per window */
    int64_t n_chunks = n_text / per_window;
    if (max_chunks > 0 && n_chunks > max_chunks) {
        n_chunks = max_chunks;
    }
    if (n_chunks < 1) {
        fprintf(stderr,
                "sampan perplexity: %s has %lld tokens, fewer than one window of %lld: use a "
                "longer text or a smaller -c\n",
                text_path, (long long)n_text, (long long)per_window);
        rc = 2;
        goto done;
    }
    /* Predictions in a window: position j's logits predict token j + 1. */
    int64_t first = score_all ? 0 : n_ctx / 2;
    int32_t *w = sp_malloc((size_t)n_ctx * sizeof(int32_t));
    if (w == NULL) {
        fprintf(stderr, "sampan perplexity: out of memory\n");
        goto done;
    }
    double sum = 0, sum2 = 0;
    int64_t scored = 0;
    int64_t te = sp_time_ns();
    for (int64_t k = 0; k < n_chunks; k++) {
        int64_t n = 0;
        if (bos >= 0) {
            w[n++] = bos;
        }
        memcpy(w + n, toks + k * per_window, (size_t)per_window * sizeof(int32_t));
        n += per_window;
        sp_status_t st = sp_ctx_eval(c, w, n, 0);
        if (st != SP_OK) {
            fprintf(stderr, "sampan perplexity: evaluating window %lld: %s\n", (long long)k,
                    sp_status_str(st));
            sp_free(w);
            goto done;
        }
        const float *all = sp_ctx_logits_all(c);
        double wsum = 0;
        for (int64_t j = first; j + 1 < n; j++) {
            double v = nll_of(all + j * hp->n_vocab, hp->n_vocab, w[j + 1]);
            wsum += v;
            sum2 += v * v;
            scored++;
        }
        sum += wsum;
        if (!json) {
            fprintf(stderr, "[%lld/%lld] perplexity so far %.4f\n", (long long)(k + 1),
                    (long long)n_chunks, exp(sum / (double)scored));
        }
    }
    sp_free(w);
    double eval_s = (double)(sp_time_ns() - te) / 1e9;
    double mean = sum / (double)scored;
    double var = scored > 1 ? (sum2 - sum * mean) / (double)(scored - 1) : 0;
    double se = var > 0 ? sqrt(var / (double)scored) : 0;
    double ppl = exp(mean);
    int64_t evaluated = n_chunks * n_ctx;
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                              "model", model, "text", text_path, "n_ctx", (json_int_t)n_ctx,
                              "chunks", (json_int_t)n_chunks, "tokens_scored", (json_int_t)scored,
                              "kv", sp_kv_type_name(kv_type), "nll_sum", sum, "nll_mean", mean,
                              "nll_stderr", se, "perplexity", ppl, "perplexity_stderr", ppl * se,
                              "load_s", (double)load_ns / 1e9, "eval_s", eval_s, "tokens_per_s",
                              eval_s > 0 ? (double)evaluated / eval_s : 0.0);
        char *out = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
        if (out == NULL) {
            fprintf(stderr, "sampan perplexity: out of memory\n");
            json_decref(o);
            goto done;
        }
        puts(out);
        free(out);
        json_decref(o);
    } else {
        printf("perplexity: %.4f +/- %.4f (%lld tokens scored in %lld windows of %lld, KV %s; "
               "%.1f tokens/s)\n",
               ppl, ppl * se, (long long)scored, (long long)n_chunks, n_ctx,
               sp_kv_type_name(kv_type),
               eval_s > 0 ? (double)evaluated / eval_s : 0.0);
    }
    rc = 0;
done:
    sp_free(toks);
    sp_free(text);
    sp_ctx_destroy(c);
    sp_model_free(m);
    return rc;
}
