/*
 * generate.c - `sampan run` (one-shot generation streamed to the terminal) and
 * `sampan eval` (logits and timings for tests and benchmarks).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/gen.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "gguf/gguf.h"
#include "tools/cli.h"

static int
parse_i64(const char *s, const char *flag, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || end == s || v < lo || v > hi) {
        fprintf(stderr, "sampan: %s expects an integer in [%lld, %lld], got '%s'\n", flag,
                (long long)lo, (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int
parse_f32(const char *s, const char *flag, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno != 0 || *end != '\0' || end == s || !isfinite(v)) {
        fprintf(stderr, "sampan: %s expects a number, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

static const char run_usage[] =
    "usage: sampan run -m MODEL.gguf [-p PROMPT] [-n N] [options]\n"
    "  -m, --model FILE       GGUF model\n"
    "  -p, --prompt TEXT      prompt (default: empty, generation starts from BOS)\n"
    "  -n, --n-predict N      tokens to generate (default 128)\n"
    "  -t, --threads N        threads (default: one per core)\n"
    "  -c, --ctx-size N       context size (default: the model's, at most 4096)\n"
    "      --temp T           temperature, 0 = greedy (default 0.8)\n"
    "      --top-k K          (default 40, 0 = off)\n"
    "      --top-p P          (default 0.95, 1 = off)\n"
    "      --min-p P          (default 0.05, 0 = off)\n"
    "      --repeat-penalty R (default 1 = off)\n"
    "      --frequency-penalty F, --presence-penalty P (default 0)\n"
    "      --seed S           sampling seed (default 0xC0FFEE)\n"
    "      --no-bos           do not prepend BOS\n"
    "      --ignore-eos       keep generating past end-of-sequence\n"
    "      --stop STR         end the text before STR (repeatable, up to 16)\n"
    "      --json             constrain the output to one JSON object\n"
    "Text goes to stdout as it is generated; timings and the finish reason go to stderr.\n";

enum {
    OPT_TEMP = 256, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT, OPT_FREQ, OPT_PRES, OPT_SEED,
    OPT_NO_BOS, OPT_IGNORE_EOS, OPT_TOKENS, OPT_LOGITS_OUT, OPT_DECODE, OPT_RANDOM, OPT_GEN,
    OPT_BATCH, OPT_STOP, OPT_JSON, OPT_KV_F16, OPT_KV_TYPE, OPT_NO_REPACK, OPT_PROFILE,
};

/* --kv-type / --kv-f16 (eval): the KV cache type (see sp_ctx_params_t). */
static sp_kv_type_t opt_kv_type;

static const struct option run_opts[] = {
    {"model", required_argument, 0, 'm'},
    {"prompt", required_argument, 0, 'p'},
    {"n-predict", required_argument, 0, 'n'},
    {"threads", required_argument, 0, 't'},
    {"ctx-size", required_argument, 0, 'c'},
    {"temp", required_argument, 0, OPT_TEMP},
    {"top-k", required_argument, 0, OPT_TOP_K},
    {"top-p", required_argument, 0, OPT_TOP_P},
    {"min-p", required_argument, 0, OPT_MIN_P},
    {"repeat-penalty", required_argument, 0, OPT_REPEAT},
    {"frequency-penalty", required_argument, 0, OPT_FREQ},
    {"presence-penalty", required_argument, 0, OPT_PRES},
    {"seed", required_argument, 0, OPT_SEED},
    {"no-bos", no_argument, 0, OPT_NO_BOS},
    {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
    {"stop", required_argument, 0, OPT_STOP},
    {"json", no_argument, 0, OPT_JSON},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* Load the model and make a context; prints the error and returns -1 on failure. */
static int
open_model(const char *path, int64_t n_ctx, int64_t n_batch, int n_threads, bool logits_all,
           sp_model_t **m, sp_ctx_t **c)
{
    char err[512];
    int64_t t0 = sp_time_ns();
    *m = NULL;
    *c = NULL;
    /* as the server does: files up to its default limit are copied (huge pages) */
    sp_gguf_set_copy_max(SP_GGUF_COPY_MAX_DEFAULT);
    if (sp_model_load(path, m, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan: %s\n", err);
        return -1;
    }
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_threads = n_threads;
    cp.logits_all = logits_all;
    cp.kv_type = opt_kv_type;
    if (sp_ctx_create(*m, &cp, c, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan: %s\n", err);
        sp_model_free(*m);
        *m = NULL;
        return -1;
    }
    const sp_hparams_t *hp = sp_model_hparams(*m);
    fprintf(stderr,
            "model: %s arch=%s layers=%lld embd=%lld heads=%lld/%lld vocab=%lld weights=%.1f MiB "
            "ctx=%lld kernels=%s repacked=%.1f MiB (file pages released %.1f MiB) load=%.1f ms\n",
            path, hp->arch, (long long)hp->n_layer, (long long)hp->n_embd, (long long)hp->n_head,
            (long long)hp->n_head_kv, (long long)hp->n_vocab,
            (double)sp_model_weight_bytes(*m) / (1 << 20), (long long)sp_ctx_n_ctx(*c),
            sp_ctx_kernels_name(*c), (double)sp_model_repack_bytes(*m) / (1 << 20),
            (double)sp_model_repack_released_bytes(*m) / (1 << 20),
            (double)(sp_time_ns() - t0) / 1e6);
    return 0;
}

int
sp_cmd_run(int argc, char **argv)
{
    const char *model = NULL, *prompt = "";
    int64_t n_predict = 128, n_threads = 0, n_ctx = 0, v;
    bool add_bos = true;
    sp_gen_params_t gp = sp_gen_default_params();
    sp_sampler_params_t sp = sp_sampler_default_params();
    int opt, rc = 1;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:p:n:t:c:h", run_opts, NULL)) != -1) {
        int bad = 0;
        switch (opt) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': bad = parse_i64(optarg, "-n", 0, 1 << 24, &n_predict); break;
        case 't': bad = parse_i64(optarg, "-t", 0, 512, &n_threads); break;
        case 'c': bad = parse_i64(optarg, "-c", 0, 1 << 24, &n_ctx); break;
        case OPT_TEMP: bad = parse_f32(optarg, "--temp", &sp.temperature); break;
        case OPT_TOP_K: bad = parse_i64(optarg, "--top-k", 0, INT32_MAX, &v); sp.top_k = (int32_t)v; break;
        case OPT_TOP_P: bad = parse_f32(optarg, "--top-p", &sp.top_p); break;
        case OPT_MIN_P: bad = parse_f32(optarg, "--min-p", &sp.min_p); break;
        case OPT_REPEAT: bad = parse_f32(optarg, "--repeat-penalty", &sp.repeat_penalty); break;
        case OPT_FREQ: bad = parse_f32(optarg, "--frequency-penalty", &sp.frequency_penalty); break;
        case OPT_PRES: bad = parse_f32(optarg, "--presence-penalty", &sp.presence_penalty); break;
        case OPT_SEED: bad = parse_i64(optarg, "--seed", 0, INT64_MAX, &v); sp.seed = (uint64_t)v; break;
        case OPT_NO_BOS: add_bos = false; break;
        case OPT_IGNORE_EOS: gp.ignore_eos = true; break;
        case OPT_STOP:
            if (gp.n_stop == SP_GEN_MAX_STOP) {
                fprintf(stderr, "sampan: at most %d --stop strings\n", SP_GEN_MAX_STOP);
                bad = 1;
                break;
            }
            gp.stop[gp.n_stop++] = optarg;
            break;
        case OPT_JSON: gp.json_object = true; break;
        case 'h': fputs(run_usage, stdout); return 0;
        default: fputs(run_usage, stderr); return 2;
        }
        if (bad) {
            return 2;
        }
    }
    if (model == NULL || optind != argc) {
        fputs(run_usage, stderr);
        return 2;
    }
    gp.sampling = sp;

    sp_model_t *m = NULL;
    sp_ctx_t *c = NULL;
    sp_gen_t *gen = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    char err[512];
    if (open_model(model, n_ctx, 0, (int)n_threads, false, &m, &c) != 0) {
        return 1;
    }
    const sp_tokenizer_t *tok = sp_model_tokenizer(m);
    const sp_hparams_t *hp = sp_model_hparams(m);

    /* Tokenize the prompt; an empty prompt still starts from BOS. */
    int64_t n_ctx_eff = sp_ctx_n_ctx(c);
    toks = sp_malloc((size_t)n_ctx_eff * sizeof(int32_t));
    if (toks == NULL) {
        fprintf(stderr, "sampan: out of memory\n");
        goto done;
    }
    int64_t n_prompt = sp_tokenizer_encode(tok, prompt, strlen(prompt), add_bos, false, toks, n_ctx_eff);
    if (n_prompt < 0) {
        fprintf(stderr, "sampan: cannot tokenize the prompt: %s\n",
                sp_status_str((sp_status_t)n_prompt));
        goto done;
    }
    if (n_prompt == 0) {
        if (sp_tokenizer_bos(tok) < 0) {
            fprintf(stderr, "sampan: empty prompt and the model has no BOS token\n");
            goto done;
        }
        toks[n_prompt++] = sp_tokenizer_bos(tok);
    }
    if (n_prompt >= n_ctx_eff) {
        fprintf(stderr, "sampan: the prompt has %lld tokens, the context only %lld\n",
                (long long)n_prompt, (long long)n_ctx_eff);
        goto done;
    }
    /* The last token the context can hold is generated but not evaluated. */
    int64_t budget = n_ctx_eff - n_prompt < n_predict ? n_ctx_eff - n_prompt : n_predict;
    gp.max_tokens = budget > 0 ? (int32_t)budget : 1;
    if (sp_gen_create(tok, &gp, &gen, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan: %s\n", err);
        goto done;
    }
    sp_gen_accept_prompt(gen, toks, n_prompt);
    fputs(prompt, stdout);
    fflush(stdout);

    int64_t t_prefill = sp_time_ns();
    if (sp_ctx_eval(c, toks, n_prompt, 0) != SP_OK) {
        fprintf(stderr, "sampan: evaluation failed\n");
        goto done;
    }
    t_prefill = sp_time_ns() - t_prefill;

    /* Decode loop: sp_gen picks the token and releases the text that is final
     * (whole UTF-8 characters, nothing that may still become a stop string);
     * the token goes back into the model until the generation finishes. */
    logits = sp_malloc((size_t)hp->n_vocab * sizeof(float));
    if (logits == NULL) {
        fprintf(stderr, "sampan: out of memory\n");
        goto done;
    }
    int64_t pos = n_prompt, t_decode = sp_time_ns();
    const char *finish = "length";
    rc = 0;
    while (budget > 0) {
        memcpy(logits, sp_ctx_logits(c), (size_t)hp->n_vocab * sizeof(float));
        sp_gen_token_t t;
        sp_status_t st = sp_gen_step(gen, logits, &t);
        if (st != SP_OK) {
            fprintf(stderr, "sampan: %s\n", sp_gen_error(gen));
            finish = "error";
            rc = 1;
            break;
        }
        fwrite(t.text, 1, t.text_len, stdout);
        fflush(stdout);
        if (t.finish != SP_FINISH_NONE) {
            finish = t.finish == SP_FINISH_STOP ? "stop" : "length";
            break;
        }
        toks[pos] = t.token;
        if (sp_ctx_eval(c, &toks[pos], 1, pos) != SP_OK) {
            fprintf(stderr, "sampan: evaluation failed\n");
            finish = "error";
            break;
        }
        pos++;
    }
    fputc('\n', stdout);
    t_decode = sp_time_ns() - t_decode;
    int64_t n_gen = sp_gen_n_generated(gen);
    fprintf(stderr, "prefill: %lld tokens in %.2f ms (%.2f tok/s)\n", (long long)n_prompt,
            t_prefill / 1e6, n_prompt / (t_prefill / 1e9));
    fprintf(stderr, "decode: %lld tokens in %.2f ms (%.2f tok/s)\n", (long long)n_gen,
            t_decode / 1e6, n_gen > 0 ? n_gen / (t_decode / 1e9) : 0.0);
    fprintf(stderr, "finish: %s\n", finish);
done:
    sp_free(logits);
    sp_free(toks);
    sp_gen_destroy(gen);
    sp_ctx_destroy(c);
    sp_model_free(m);
    return rc;
}

static const char eval_usage[] =
    "usage: sampan eval -m MODEL.gguf (--tokens ID,ID,... | --random N) [options]\n"
    "  --tokens LIST      comma-separated token ids to evaluate\n"
    "  --random N         N pseudo-random token ids (benchmarks), from --seed\n"
    "  --decode           feed the tokens one at a time instead of one prefill batch\n"
    "  --gen N            then greedily generate N tokens and time them (decode speed)\n"
    "  --logits-out FILE  write the logits of every position: float32 LE, n x n_vocab\n"
    "  -b, --batch N      prefill batch size (default 512)\n"
    "  -t, --threads N    threads (default: one per core)\n"
    "  -c, --ctx-size N   context size\n"
    "  --kv-type T        KV cache type: f32 (default), f16 (half the cache) or q8_0\n"
    "                     (about a quarter); --kv-f16 is --kv-type f16\n"
    "  --no-repack        keep the file's weight layout (no load-time repack; A/B runs)\n"
    "  --profile          after each timing line, where its time went: the step's stages\n"
    "                     (products by matrix, attention, norms, ...), their share of the\n"
    "                     wall time and the share of a stage the caller waited for other\n"
    "                     threads' last chunks; decode per token\n"
    "Prints 'prefill: ...' and 'decode: ...' timing lines to stderr.\n";

static const struct option eval_opts[] = {
    {"model", required_argument, 0, 'm'},
    {"tokens", required_argument, 0, OPT_TOKENS},
    {"random", required_argument, 0, OPT_RANDOM},
    {"seed", required_argument, 0, OPT_SEED},
    {"decode", no_argument, 0, OPT_DECODE},
    {"gen", required_argument, 0, OPT_GEN},
    {"logits-out", required_argument, 0, OPT_LOGITS_OUT},
    {"batch", required_argument, 0, 'b'},
    {"threads", required_argument, 0, 't'},
    {"ctx-size", required_argument, 0, 'c'},
    {"kv-f16", no_argument, 0, OPT_KV_F16},
    {"kv-type", required_argument, 0, OPT_KV_TYPE},
    {"no-repack", no_argument, 0, OPT_NO_REPACK},
    {"profile", no_argument, 0, OPT_PROFILE},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* qsort order of profile entries: the most time first */
static int
by_time_desc(const void *a, const void *b)
{
    const int64_t x = ((const sp_pool_prof_entry_t *)a)->ns;
    const int64_t y = ((const sp_pool_prof_entry_t *)b)->ns;
    return (x < y) - (x > y);
}

/* The profile of one timed phase (wall_ns over n_tok tokens) to stderr: the stages by time,
 * per token when per_token. */
static void
print_profile(const char *phase, const sp_pool_prof_t *pr, int64_t wall_ns, int64_t n_tok,
              bool per_token)
{
    const double div = per_token ? (double)n_tok : 1.0;
    const double pct = wall_ns > 0 ? 100.0 / (double)wall_ns : 0.0;
    fprintf(stderr, "profile: %s, %lld tokens, %.2f ms%s\n", phase, (long long)n_tok,
            wall_ns / 1e6, per_token ? "; calls and ms per token" : "");
    fprintf(stderr, "  %-16s %9s %10s %7s %7s\n", "stage", "calls", "ms", "share", "tail");
    sp_pool_prof_entry_t e[SP_POOL_PROF_MAX];
    memcpy(e, pr->e, (size_t)pr->n * sizeof e[0]);
    qsort(e, (size_t)pr->n, sizeof e[0], by_time_desc);
    int64_t jobs_ns = 0;
    for (int i = 0; i < pr->n; i++) {
        jobs_ns += e[i].ns;
        fprintf(stderr, "  %-16s %9.1f %10.3f %6.1f%% %6.1f%%\n", e[i].label, e[i].calls / div,
                e[i].ns / 1e6 / div, e[i].ns * pct,
                e[i].ns > 0 ? 100.0 * e[i].wait_ns / e[i].ns : 0.0);
    }
    fprintf(stderr, "  %-16s %9s %10.3f %6.1f%%\n", "(outside jobs)", "-",
            (wall_ns - jobs_ns) / 1e6 / div, (wall_ns - jobs_ns) * pct);
    if (pr->overflow_calls > 0) {
        fprintf(stderr, "  (%lld calls under further labels are in \"outside jobs\")\n",
                (long long)pr->overflow_calls);
    }
}

int
sp_cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *tokens_arg = NULL, *logits_out = NULL;
    int64_t n_random = 0, n_gen = 0, n_threads = 0, n_ctx = 0, n_batch = 0, seed = 1;
    bool decode = false, profile = false;
    int opt, rc = 1;
    sp_pool_prof_t prof;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:t:c:b:h", eval_opts, NULL)) != -1) {
        int bad = 0;
        switch (opt) {
        case 'm': model = optarg; break;
        case OPT_TOKENS: tokens_arg = optarg; break;
        case OPT_RANDOM: bad = parse_i64(optarg, "--random", 1, 1 << 24, &n_random); break;
        case OPT_SEED: bad = parse_i64(optarg, "--seed", 0, INT64_MAX, &seed); break;
        case OPT_DECODE: decode = true; break;
        case OPT_GEN: bad = parse_i64(optarg, "--gen", 0, 1 << 24, &n_gen); break;
        case OPT_LOGITS_OUT: logits_out = optarg; break;
        case OPT_NO_REPACK: sp_model_set_repack(false); break;
        case OPT_PROFILE: profile = true; break;
        case OPT_KV_F16: opt_kv_type = SP_KV_TYPE_F16; break;
        case OPT_KV_TYPE:
            if (sp_kv_type_from_name(optarg) < 0) {
                fprintf(stderr, "sampan: --kv-type must be f32, f16 or q8_0, got '%s'\n", optarg);
                return 2;
            }
            opt_kv_type = (sp_kv_type_t)sp_kv_type_from_name(optarg);
            break;
        case 'b': bad = parse_i64(optarg, "-b", 1, 65536, &n_batch); break;
        case 't': bad = parse_i64(optarg, "-t", 0, 512, &n_threads); break;
        case 'c': bad = parse_i64(optarg, "-c", 0, 1 << 24, &n_ctx); break;
        case 'h': fputs(eval_usage, stdout); return 0;
        default: fputs(eval_usage, stderr); return 2;
        }
        if (bad) {
            return 2;
        }
    }
    if (model == NULL || optind != argc || (tokens_arg == NULL) == (n_random == 0)) {
        fputs(eval_usage, stderr);
        return 2;
    }

    /* Count and parse the token list before loading anything. */
    int64_t n = n_random;
    if (tokens_arg != NULL) {
        n = 1;
        for (const char *p = tokens_arg; *p; p++) {
            n += *p == ',';
        }
    }
    int32_t *toks = sp_malloc((size_t)(n + n_gen) * sizeof(int32_t));
    if (toks == NULL) {
        fprintf(stderr, "sampan: out of memory\n");
        return 1;
    }
    sp_model_t *m = NULL;
    sp_ctx_t *c = NULL;
    FILE *f = NULL;
    if (tokens_arg != NULL) {
        const char *p = tokens_arg;
        for (int64_t i = 0; i < n; i++) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (errno != 0 || end == p || (*end != ',' && *end != '\0') || v < 0 || v > INT32_MAX) {
                fprintf(stderr, "sampan: bad token list at '%s'\n", p);
                goto done;
            }
            toks[i] = (int32_t)v;
            p = *end == ',' ? end + 1 : end;
        }
    }
    if (open_model(model, n_ctx > 0 ? n_ctx : n + n_gen + 1, n_batch, (int)n_threads,
                   logits_out != NULL, &m, &c) != 0) {
        goto done;
    }
    const sp_hparams_t *hp = sp_model_hparams(m);
    if (n_random > 0) {
        uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
        for (int64_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            toks[i] = (int32_t)(s % (uint64_t)hp->n_vocab);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        if (toks[i] >= hp->n_vocab) {
            fprintf(stderr, "sampan: token %d is outside the vocabulary (%lld)\n", toks[i],
                    (long long)hp->n_vocab);
            goto done;
        }
    }

    if (profile) {
        sp_pool_prof_reset(&prof);
        if (sp_ctx_profile(c, &prof) != SP_OK) {
            fprintf(stderr, "sampan: --profile: an encoder model, which eval does not run\n");
            goto done;
        }
    }
    int64_t t0 = sp_time_ns();
    sp_status_t st = SP_OK;
    if (decode) {
        for (int64_t i = 0; i < n && st == SP_OK; i++) {
            st = sp_ctx_eval(c, &toks[i], 1, i);
        }
    } else {
        st = sp_ctx_eval(c, toks, n, 0);
    }
    int64_t t1 = sp_time_ns();
    if (st != SP_OK) {
        fprintf(stderr, "sampan: evaluation failed: %s\n", sp_status_str(st));
        goto done;
    }
    fprintf(stderr, "prefill: %lld tokens in %.2f ms (%.2f tok/s)%s\n", (long long)n, (t1 - t0) / 1e6,
            n / ((t1 - t0) / 1e9), decode ? " [one at a time]" : "");
    if (profile) {
        print_profile(decode ? "prefill one at a time" : "prefill", &prof, t1 - t0, n, decode);
    }

    if (logits_out != NULL) {
        f = fopen(logits_out, "wb");
        if (f == NULL || fwrite(sp_ctx_logits_all(c), sizeof(float) * (size_t)hp->n_vocab, (size_t)n, f) != (size_t)n) {
            fprintf(stderr, "sampan: cannot write %s: %s\n", logits_out, strerror(errno));
            goto done;
        }
    }
    if (n_gen > 0) {
        if (profile) {
            sp_pool_prof_reset(&prof);
        }
        int64_t t2 = sp_time_ns();
        for (int64_t i = 0; i < n_gen; i++) {
            const float *lg = logits_out ? sp_ctx_logits_all(c) + (n + i - 1) * hp->n_vocab
                                         : sp_ctx_logits(c);
            toks[n + i] = sp_argmax(lg, hp->n_vocab);
            if (sp_ctx_eval(c, &toks[n + i], 1, n + i) != SP_OK) {
                fprintf(stderr, "sampan: evaluation failed\n");
                goto done;
            }
        }
        int64_t t3 = sp_time_ns();
        fprintf(stderr, "decode: %lld tokens in %.2f ms (%.2f tok/s)\n", (long long)n_gen,
                (t3 - t2) / 1e6, n_gen / ((t3 - t2) / 1e9));
        if (profile) {
            print_profile("decode", &prof, t3 - t2, n_gen, true);
        }
    }
    rc = 0;
done:
    if (f != NULL && fclose(f) != 0) {
        rc = 1;
    }
    sp_free(toks);
    sp_ctx_destroy(c);
    sp_model_free(m);
    return rc;
}
