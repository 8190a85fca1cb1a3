/*
 * test_gen.c - the generation module: stop strings, UTF-8 hold-back, limits,
 * log-probabilities, seeds and the JSON constraint, on the demo model's
 * tokenizer (512 tokens, SentencePiece with byte fallback) driven by
 * synthetic logits, and on the demo model itself.
 */
#include "test.h"
#include "vocab.h"

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/gen.h"
#include "engine/model.h"

#define DEMO "models/stories260K.gguf"
#define SPM32K "tests/data/tokenizer/ggml-vocab-llama-spm.gguf"

static sp_gen_params_t
greedy_params(int32_t max_tokens)
{
    sp_gen_params_t p = sp_gen_default_params();
    p.sampling.temperature = 0.0f;
    p.max_tokens = max_tokens;
    return p;
}

static sp_gen_t *
make_gen(const sp_tokenizer_t *t, const sp_gen_params_t *p)
{
    sp_gen_t *g = NULL;
    char err[256] = "";
    if (sp_gen_create(t, p, &g, err, sizeof err) != SP_OK) {
        SP_TEST_FAIL("create: %s", err);
    }
    return g;
}

/* One step with logits that make `id` the clear favourite. */
static sp_status_t
force(sp_gen_t *g, const sp_tokenizer_t *t, int32_t id, sp_gen_token_t *out)
{
    static float l[1 << 16];
    int32_t n = sp_tokenizer_n_vocab(t);
    ASSERT(n <= (int32_t)(sizeof l / sizeof l[0]));
    for (int32_t i = 0; i < n; i++) {
        l[i] = (float)(i % 7) * 0.01f;
    }
    l[id] = 30.0f;
    return sp_gen_step(g, l, out);
}

/*
 * Feed `text` one byte token at a time; append the released text to `got`
 * (NUL-terminated) and the per-step releases, separated by '|', to `steps`
 * when not NULL. Returns the finish of the last step taken (it stops early
 * when the generation finishes) and the number of steps in *n_steps.
 */
static sp_finish_t
feed_bytes(sp_gen_t *g, const sp_tokenizer_t *t, const char *text, char *got, char *steps,
           int *n_steps)
{
    sp_gen_token_t o;
    got[0] = '\0';
    if (steps) steps[0] = '\0';
    int k = 0;
    sp_finish_t f = SP_FINISH_NONE;
    for (const char *p = text; *p && f == SP_FINISH_NONE; p++, k++) {
        int32_t id = sp_test_byte_token(t, (unsigned char)*p);
        ASSERT_OK(force(g, t, id, &o));
        ASSERT_EQ(o.token, id);
        ASSERT_EQ(strlen(o.text), o.text_len);
        strncat(got, o.text, o.text_len);
        if (steps) {
            if (k > 0) strcat(steps, "|");
            strncat(steps, o.text, o.text_len);
        }
        f = o.finish;
    }
    if (n_steps) *n_steps = k;
    return f;
}

/* ---- parameters ---------------------------------------------------------- */

TEST(gen_create_rejects_bad_params)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char err[256], long_stop[SP_GEN_MAX_STOP_LEN + 2];
    memset(long_stop, 'x', sizeof long_stop - 1);
    long_stop[sizeof long_stop - 1] = '\0';
    struct {
        const char *name, *want;
        void (*edit)(sp_gen_params_t *);
    } cases[] = {
        {"max_tokens 0", "max_tokens", NULL},
        {"max_tokens -1", "max_tokens", NULL},
        {"top_logprobs 21", "top_logprobs", NULL},
        {"n_stop 17", "n_stop", NULL},
        {"n_stop -1", "n_stop", NULL},
        {"empty stop", "stop[1]", NULL},
        {"NULL stop in n_stop", "stop[0]", NULL},
        {"long stop", "stop[0]", NULL},
        {"bad utf-8 stop", "stop[0]", NULL},
        {"temperature", "temperature", NULL},
        {"top_p", "top_p", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sp_gen_params_t p = sp_gen_default_params();
        switch (i) {
        case 0: p.max_tokens = 0; break;
        case 1: p.max_tokens = -1; break;
        case 2: p.top_logprobs = 21; break;
        case 3: p.n_stop = 17; break;
        case 4: p.n_stop = -1; break;
        case 5: p.stop[0] = "a"; p.stop[1] = ""; p.n_stop = 2; break;
        case 6: p.n_stop = 1; break;
        case 7: p.stop[0] = long_stop; break;
        case 8: p.stop[0] = "ok\xC3("; break;
        case 9: p.sampling.temperature = -1.0f; break;
        case 10: p.sampling.top_p = NAN; break;
        }
        sp_gen_t *g = (sp_gen_t *)1;
        err[0] = '\0';
        sp_status_t st = sp_gen_create(v.t, &p, &g, err, sizeof err);
        if (st != SP_ERR_INVALID || g != NULL || strstr(err, cases[i].want) == NULL) {
            SP_TEST_FAIL("%s: status %d, err '%s'", cases[i].name, (int)st, err);
        }
    }
    /* a table built for another tokenizer */
    sp_test_vocab_t w = sp_test_vocab_open(DEMO);
    sp_gen_vocab_t *table = NULL;
    ASSERT_OK(sp_gen_vocab_create(w.t, &table, err, sizeof err));
    sp_gen_params_t p = sp_gen_default_params();
    p.json_object = true;
    p.vocab = table;
    sp_gen_t *g = NULL;
    ASSERT_EQ(sp_gen_create(v.t, &p, &g, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "vocab") != NULL);
    /* the limits themselves are fine; NULL-terminated stops with n_stop 0 */
    p = sp_gen_default_params();
    p.top_logprobs = SP_GEN_MAX_TOP_LOGPROBS;
    for (int i = 0; i < SP_GEN_MAX_STOP; i++) {
        p.stop[i] = long_stop + 1;
    }
    g = make_gen(v.t, &p);
    sp_gen_destroy(g);
    sp_gen_destroy(NULL);
    sp_gen_vocab_destroy(table);
    sp_test_vocab_close(&w);
    sp_test_vocab_close(&v);
}

TEST(gen_create_cleans_up_after_oom)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    sp_gen_params_t p = sp_gen_default_params();
    p.json_object = true;
    p.stop[0] = "x";
    size_t before = sp_alloc_bytes_in_use();
    int ok_at = -1;
    for (int i = 0; i < 64 && ok_at < 0; i++) {
        sp_gen_t *g = NULL;
        char err[256];
        sp_alloc_fail_after(i);
        sp_status_t st = sp_gen_create(v.t, &p, &g, err, sizeof err);
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            ok_at = i;
            sp_gen_destroy(g);
        } else {
            ASSERT_EQ(st, SP_ERR_NOMEM);
            ASSERT(g == NULL);
        }
        ASSERT_EQ(sp_alloc_bytes_in_use(), before);
    }
    ASSERT(ok_at > 0);
    sp_test_vocab_close(&v);
}

/* ---- stop strings and text ------------------------------------------------ */

TEST(gen_stop_across_token_boundaries)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char got[512], steps[1024];
    int n;
    sp_gen_params_t p = greedy_params(100);
    p.stop[0] = "lo wo";
    sp_gen_t *g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "hello world", got, steps, &n), SP_FINISH_STOP);
    ASSERT_STR_EQ(got, "hel");
    ASSERT_STR_EQ(steps, "h|e||l||||"); /* "l" waits; then "lo", "lo ", "lo w"; "lo wo" ends it */
    ASSERT_EQ(n, 8);
    ASSERT_EQ(sp_gen_n_generated(g), 8);
    sp_gen_token_t o;
    ASSERT_EQ(force(g, v.t, sp_test_byte_token(v.t, 'x'), &o), SP_ERR_INVALID); /* over */
    ASSERT(strstr(sp_gen_error(g), "ended") != NULL);
    sp_gen_destroy(g);

    /* a stop string inside one multi-byte token, and across real tokens */
    int32_t toks[64];
    int64_t nt = sp_tokenizer_encode(v.t, "Once upon a time there", 22, false, false, toks, 64);
    ASSERT(nt > 2 && nt < 10);
    const char *stops[] = {"upon", "pon a ti", "e th", "Once"};
    const char *want[] = {" Once ", " Once u", " Once upon a tim", " "};
    for (int s = 0; s < 4; s++) {
        p = greedy_params(100);
        p.stop[0] = stops[s];
        g = make_gen(v.t, &p);
        got[0] = '\0';
        sp_finish_t f = SP_FINISH_NONE;
        for (int64_t i = 0; i < nt && f == SP_FINISH_NONE; i++) {
            ASSERT_OK(force(g, v.t, toks[i], &o));
            strncat(got, o.text, o.text_len);
            f = o.finish;
        }
        ASSERT_EQ(f, SP_FINISH_STOP);
        ASSERT_STR_EQ(got, want[s]);
        sp_gen_destroy(g);
    }
    sp_test_vocab_close(&v);
}

TEST(gen_stop_at_start_and_multiple_stops)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char got[512], steps[1024];
    int n;
    sp_gen_params_t p = greedy_params(100);
    p.stop[0] = "he";
    sp_gen_t *g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "hello", got, steps, &n), SP_FINISH_STOP);
    ASSERT_STR_EQ(got, "");
    ASSERT_EQ(n, 2);
    sp_gen_destroy(g);

    /* the first stop to complete wins, wherever it is in the list */
    p = greedy_params(100);
    p.stop[0] = "world";
    p.stop[1] = "o w";
    p.stop[2] = "zzz";
    g = make_gen(v.t, &p);
    ASSERT_EQ(sp_gen_stop_index(g), -1); /* none yet */
    ASSERT_EQ(feed_bytes(g, v.t, "hello world", got, NULL, &n), SP_FINISH_STOP);
    ASSERT_STR_EQ(got, "hell");
    ASSERT_EQ(n, 7);
    ASSERT_EQ(sp_gen_stop_index(g), 1); /* which one ended it (Anthropic's stop_sequence) */
    sp_gen_destroy(g);

    /* two complete on the same byte: the longer one cuts */
    p = greedy_params(100);
    p.stop[0] = "b";
    p.stop[1] = "ab";
    p.n_stop = 2;
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "xxabc", got, NULL, &n), SP_FINISH_STOP);
    ASSERT_STR_EQ(got, "xx");
    ASSERT_EQ(sp_gen_stop_index(g), 1);
    sp_gen_destroy(g);

    /* self-overlapping stop string (KMP fallback): "aab" in "aaab" */
    p = greedy_params(100);
    p.stop[0] = "aab";
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "caaab", got, steps, &n), SP_FINISH_STOP);
    ASSERT_STR_EQ(got, "ca");
    ASSERT_STR_EQ(steps, "c|||a|");
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_hold_back_then_release)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char got[512], steps[1024];
    int n;
    sp_gen_params_t p = greedy_params(100);
    p.stop[0] = "lox";
    sp_gen_t *g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "hello worl", got, steps, &n), SP_FINISH_NONE);
    ASSERT_STR_EQ(got, "hello wor"); /* the last "l" waits: it may begin "lox" */
    ASSERT_STR_EQ(steps, "h|e||l||lo |w|o|r|");
    sp_gen_destroy(g);
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "hello world", got, steps, &n), SP_FINISH_NONE);
    ASSERT_STR_EQ(steps, "h|e||l||lo |w|o|r||ld");
    sp_gen_destroy(g);
    /* max_tokens releases what is held */
    p.max_tokens = 10;
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "hello worl", got, steps, &n), SP_FINISH_LENGTH);
    ASSERT_STR_EQ(got, "hello worl");
    ASSERT_STR_EQ(steps, "h|e||l||lo |w|o|r|l");
    sp_gen_destroy(g);

    /* an end-of-generation token releases it too, with no text of its own */
    p.max_tokens = 100;
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "halo", got, NULL, &n), SP_FINISH_NONE);
    ASSERT_STR_EQ(got, "ha");
    sp_gen_token_t o;
    int32_t eos = sp_tokenizer_eos(v.t);
    ASSERT(eos >= 0);
    ASSERT_OK(force(g, v.t, eos, &o));
    ASSERT_EQ(o.token, eos);
    ASSERT_EQ(o.finish, SP_FINISH_STOP);
    ASSERT_STR_EQ(o.text, "lo");
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_utf8_hold_back)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char got[512], steps[1024];
    int n;
    sp_gen_params_t p = greedy_params(100);
    sp_gen_t *g = make_gen(v.t, &p);
    /* é (C3 A9), € (E2 82 AC), 😀 (F0 9F 98 80): nothing until a character is whole */
    ASSERT_EQ(feed_bytes(g, v.t, "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z", got, steps, &n),
              SP_FINISH_NONE);
    ASSERT_STR_EQ(steps, "a||\xC3\xA9|||\xE2\x82\xAC||||\xF0\x9F\x98\x80|z");
    sp_gen_destroy(g);

    /* a stop string with a multi-byte character, matched and not matched */
    p.stop[0] = "\xC3\xA9x";
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "a\xC3\xA9y\xC3\xA9x", got, steps, &n), SP_FINISH_STOP);
    ASSERT_STR_EQ(got, "a\xC3\xA9y");
    ASSERT_STR_EQ(steps, "a|||\xC3\xA9y|||");
    sp_gen_destroy(g);

    /* the end releases an unfinished character as it is */
    p = greedy_params(3);
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "ab\xE2\x82", got, steps, &n), SP_FINISH_LENGTH);
    ASSERT_STR_EQ(steps, "a|b|\xE2");
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_max_tokens_eog_and_dummy_prefix)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    sp_gen_token_t o;
    int32_t toks[16];
    int64_t nt = sp_tokenizer_encode(v.t, "Once upon", 9, true, false, toks, 16);
    ASSERT_EQ(nt, 3); /* BOS, "▁Once", "▁upon" */

    sp_gen_params_t p = greedy_params(2);
    sp_gen_t *g = make_gen(v.t, &p);
    sp_gen_accept_prompt(g, toks, 1); /* just BOS: the first word loses its space */
    ASSERT_OK(force(g, v.t, toks[1], &o));
    ASSERT_STR_EQ(o.text, "Once");
    ASSERT_EQ(o.finish, SP_FINISH_NONE);
    ASSERT_OK(force(g, v.t, toks[2], &o));
    ASSERT_STR_EQ(o.text, " upon");
    ASSERT_EQ(o.finish, SP_FINISH_LENGTH); /* the max_tokens-th token */
    ASSERT_EQ(sp_gen_n_generated(g), 2);
    sp_gen_destroy(g);

    p = greedy_params(10);
    g = make_gen(v.t, &p);
    sp_gen_accept_prompt(g, toks, 2); /* after "Once" the space stays */
    ASSERT_OK(force(g, v.t, toks[2], &o));
    ASSERT_STR_EQ(o.text, " upon");
    int32_t eos = sp_tokenizer_eos(v.t);
    ASSERT_OK(force(g, v.t, eos, &o));
    ASSERT_EQ(o.finish, SP_FINISH_STOP);
    ASSERT_EQ(o.text_len, 0);
    ASSERT_EQ(o.token, eos);
    sp_gen_destroy(g);

    /* ignore_eos: the end token is just a token without text */
    p.ignore_eos = true;
    p.max_tokens = 3;
    g = make_gen(v.t, &p);
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(force(g, v.t, eos, &o));
        ASSERT_EQ(o.token, eos);
        ASSERT_EQ(o.text_len, 0);
        ASSERT_EQ(o.finish, i == 2 ? SP_FINISH_LENGTH : SP_FINISH_NONE);
    }
    sp_gen_destroy(g);

    /* max_tokens 1: the first step is the last */
    p = greedy_params(1);
    g = make_gen(v.t, &p);
    ASSERT_OK(force(g, v.t, toks[1], &o));
    ASSERT_EQ(o.finish, SP_FINISH_LENGTH);
    sp_gen_destroy(g);

    /* no finite logit: an error, not a token */
    p = greedy_params(5);
    g = make_gen(v.t, &p);
    static float l[512];
    for (int i = 0; i < 512; i++) l[i] = -INFINITY;
    ASSERT_EQ(sp_gen_step(g, l, &o), SP_ERR_INVALID);
    ASSERT(strstr(sp_gen_error(g), "finite") != NULL);
    sp_gen_destroy(g);
    /* a NaN or +inf logit is the model's fault (500), even beside finite ones */
    for (int k = 0; k < 2; k++) {
        g = make_gen(v.t, &p);
        for (int i = 0; i < 512; i++) l[i] = (float)(i % 7);
        l[300] = k ? INFINITY : NAN;
        ASSERT_EQ(sp_gen_step(g, l, &o), SP_ERR_MODEL_FAULT);
        ASSERT(strstr(sp_gen_error(g), "NaN") != NULL);
        sp_gen_destroy(g);
    }
    sp_test_vocab_close(&v);
}

/* ---- log-probabilities and seeds ------------------------------------------- */

static uint64_t
rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void
random_logits(float *l, int32_t n, uint64_t *seed)
{
    for (int32_t i = 0; i < n; i++) {
        l[i] = (float)((double)(rng_next(seed) >> 11) * 0x1.0p-53 * 12.0 - 6.0);
    }
}

TEST(gen_logprobs_match_direct_computation)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    enum { V = 512 };
    static float l[V], ref[V];
    sp_gen_params_t p = sp_gen_default_params();
    p.sampling.temperature = 0.7f; /* temperature and truncation must not show */
    p.sampling.top_k = 5;
    p.sampling.presence_penalty = 1.5f;
    p.top_logprobs = 20;
    p.max_tokens = 50;
    sp_gen_t *g = make_gen(v.t, &p);
    int32_t prompt[3] = {7, 9, 7};
    sp_gen_accept_prompt(g, prompt, 3);
    bool seen[V] = {false};
    seen[7] = seen[9] = true;
    uint64_t seed = 5;
    for (int step = 0; step < 30; step++) {
        random_logits(l, V, &seed);
        if (step == 3) { /* ties: equal logits list the lower id first */
            for (int i = 0; i < V; i++) l[i] = -5.0f;
            l[40] = l[30] = l[300] = 2.0f;
        }
        /* the expected values: presence penalty on every token seen, then log-softmax */
        double mx = -INFINITY, z = 0.0;
        for (int i = 0; i < V; i++) {
            ref[i] = l[i] - (seen[i] ? 1.5f : 0.0f);
            mx = ref[i] > mx ? ref[i] : mx;
        }
        for (int i = 0; i < V; i++) z += exp((double)ref[i] - mx);
        double log_z = mx + log(z);
        sp_gen_token_t o;
        ASSERT_OK(sp_gen_step(g, l, &o));
        ASSERT_EQ(o.chosen.token, o.token);
        ASSERT_NEAR(o.chosen.logprob, ref[o.token] - log_z, 1e-5);
        ASSERT_EQ(o.n_top, 20);
        double prev = INFINITY;
        for (int j = 0; j < o.n_top; j++) {
            int32_t id = o.top[j].token;
            ASSERT_NEAR(o.top[j].logprob, ref[id] - log_z, 1e-5);
            ASSERT(o.top[j].logprob <= prev);
            prev = o.top[j].logprob;
            /* nothing outside the list ranks above its last entry */
            if (j == o.n_top - 1) {
                for (int i = 0; i < V; i++) {
                    bool listed = false;
                    for (int k = 0; k < o.n_top; k++) listed |= o.top[k].token == i;
                    ASSERT(listed || ref[i] < ref[id] || (ref[i] == ref[id] && i > id));
                }
            }
        }
        if (step == 3 && !seen[30] && !seen[40] && !seen[300]) {
            ASSERT_EQ(o.top[0].token, 30);
            ASSERT_EQ(o.top[1].token, 40);
            ASSERT_EQ(o.top[2].token, 300);
            ASSERT_NEAR(o.top[0].logprob, o.top[1].logprob, 0);
        }
        /* the chosen token comes from the top 5 (top_k) */
        bool in_top5 = false;
        for (int j = 0; j < 5; j++) in_top5 |= o.top[j].token == o.token;
        ASSERT(in_top5);
        seen[o.token] = true;
    }
    sp_gen_destroy(g);

    /* top_logprobs 0: only the chosen token */
    p.top_logprobs = 0;
    g = make_gen(v.t, &p);
    sp_gen_token_t o;
    random_logits(l, V, &seed);
    ASSERT_OK(sp_gen_step(g, l, &o));
    ASSERT_EQ(o.n_top, 0);
    ASSERT_EQ(o.chosen.token, o.token);
    ASSERT(o.chosen.logprob < 0.0f);
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_seed_determinism)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    enum { V = 512, N = 40 };
    static float l[V];
    int32_t runs[3][N];
    uint64_t seeds[3] = {42, 42, 43};
    for (int r = 0; r < 3; r++) {
        sp_gen_params_t p = sp_gen_default_params();
        p.sampling.temperature = 1.0f;
        p.sampling.top_k = 0;
        p.sampling.top_p = 1.0f;
        p.sampling.min_p = 0.0f;
        p.sampling.seed = seeds[r];
        p.max_tokens = N;
        p.ignore_eos = true;
        sp_gen_t *g = make_gen(v.t, &p);
        uint64_t ls = 9; /* the same logits every run */
        for (int i = 0; i < N; i++) {
            random_logits(l, V, &ls);
            sp_gen_token_t o;
            ASSERT_OK(sp_gen_step(g, l, &o));
            runs[r][i] = o.token;
        }
        sp_gen_destroy(g);
    }
    ASSERT(memcmp(runs[0], runs[1], sizeof runs[0]) == 0);
    ASSERT(memcmp(runs[0], runs[2], sizeof runs[0]) != 0);
    sp_test_vocab_close(&v);
}

/* ---- JSON ------------------------------------------------------------------ */

/* A strict RFC 8259 checker, written apart from gen.c's recogniser. */
typedef struct jp {
    const unsigned char *p, *end;
    int depth;
} jp_t;

static void
jp_ws(jp_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static bool jp_value(jp_t *j);

static bool
jp_lit(jp_t *j, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, s, n) != 0) return false;
    j->p += n;
    return true;
}

static int
jp_hex4(jp_t *j)
{
    if (j->end - j->p < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = *j->p++, d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

static bool
jp_string(jp_t *j)
{
    if (j->p >= j->end || *j->p != '"') return false;
    j->p++;
    while (j->p < j->end) {
        unsigned c = *j->p++;
        if (c == '"') return true;
        if (c < 0x20) return false;
        if (c == '\\') {
            if (j->p >= j->end) return false;
            c = *j->p++;
            if (c == 'u') {
                int u = jp_hex4(j);
                if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) return false;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (!jp_lit(j, "\\u")) return false;
                    int w = jp_hex4(j);
                    if (w < 0xDC00 || w > 0xDFFF) return false;
                }
            } else if (!strchr("\"\\/bfnrt", (int)c) || c == 0) {
                return false;
            }
        } else if (c >= 0x80) {
            uint32_t cp;
            int more;
            if (c >= 0xC2 && c <= 0xDF) cp = c & 0x1F, more = 1;
            else if (c >= 0xE0 && c <= 0xEF) cp = c & 0x0F, more = 2;
            else if (c >= 0xF0 && c <= 0xF4) cp = c & 0x07, more = 3;
            else return false;
            for (int k = 0; k < more; k++) {
                if (j->p >= j->end || (*j->p & 0xC0) != 0x80) return false;
                cp = (cp << 6) | (*j->p++ & 0x3F);
            }
            if ((more == 2 && cp < 0x800) || (more == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
                (cp >= 0xD800 && cp <= 0xDFFF)) {
                return false;
            }
        }
    }
    return false;
}

static bool
jp_number(jp_t *j)
{
    const unsigned char *s = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p >= j->end) return false;
    if (*j->p == '0') {
        j->p++;
    } else if (*j->p >= '1' && *j->p <= '9') {
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
    } else {
        return false;
    }
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        const unsigned char *d = j->p;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
        if (j->p == d) return false;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        const unsigned char *d = j->p;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
        if (j->p == d) return false;
    }
    return j->p > s;
}

static bool
jp_container(jp_t *j, char open, char close)
{
    if (++j->depth > 200) return false;
    j->p++; /* open */
    jp_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        j->depth--;
        return true;
    }
    for (;;) {
        jp_ws(j);
        if (open == '{') {
            if (!jp_string(j)) return false;
            jp_ws(j);
            if (j->p >= j->end || *j->p++ != ':') return false;
            jp_ws(j);
        }
        if (!jp_value(j)) return false;
        jp_ws(j);
        if (j->p >= j->end) return false;
        char c = (char)*j->p++;
        if (c == close) break;
        if (c != ',') return false;
    }
    j->depth--;
    return true;
}

static bool
jp_value(jp_t *j)
{
    if (j->p >= j->end) return false;
    switch (*j->p) {
    case '{': return jp_container(j, '{', '}');
    case '[': return jp_container(j, '[', ']');
    case '"': return jp_string(j);
    case 't': return jp_lit(j, "true");
    case 'f': return jp_lit(j, "false");
    case 'n': return jp_lit(j, "null");
    default: return jp_number(j);
    }
}

/* One JSON object, with whitespace around it and nothing else. */
static bool
json_object_ok(const char *s, size_t n)
{
    jp_t j = {(const unsigned char *)s, (const unsigned char *)s + n, 0};
    jp_ws(&j);
    if (j.p >= j.end || *j.p != '{' || !jp_value(&j)) return false;
    jp_ws(&j);
    return j.p == j.end;
}

TEST(gen_json_checker_self_test)
{
    const char *good[] = {"{}", " {\"a\":1}\n", "{\"a\":[1,-0,2.5e-3,1E+9,true,false,null,{}],\"b\":\"\\u00e9\\ud83d\\ude00\\n\xC3\xA9\"}"};
    const char *bad[] = {"[]", "{", "{\"a\"}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":\"\\udc00\"}",
                         "{\"a\":\"\x01\"}", "{} x", "{\"a\":\"\xED\xA0\x80\"}", "{\"a\":1,}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) ASSERT(json_object_ok(good[i], strlen(good[i])));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) ASSERT(!json_object_ok(bad[i], strlen(bad[i])));
}

/*
 * Feed `prefix` as byte tokens to a json_object generation (each must be
 * accepted), then offer byte `next` as the favourite: returns whether it
 * was taken. Checks both mask paths: lazy greedy and the full mask (which
 * log-probabilities force).
 */
static bool
json_takes(const sp_tokenizer_t *t, const sp_gen_vocab_t *table, const char *prefix, size_t plen,
           unsigned next)
{
    bool taken[2];
    for (int full = 0; full < 2; full++) {
        sp_gen_params_t p = greedy_params(1000);
        p.json_object = true;
        p.vocab = table;
        p.top_logprobs = full ? 3 : -1;
        sp_gen_t *g = make_gen(t, &p);
        sp_gen_token_t o;
        for (size_t i = 0; i < plen; i++) {
            int32_t id = sp_test_byte_token(t, (unsigned char)prefix[i]);
            ASSERT_OK(force(g, t, id, &o));
            if (o.token != id) {
                SP_TEST_FAIL("prefix '%.*s': byte %zu (0x%02x) refused", (int)plen, prefix, i,
                             (unsigned char)prefix[i]);
            }
            ASSERT(o.finish == SP_FINISH_NONE || i == plen - 1);
        }
        if (plen > 0 && o.finish != SP_FINISH_NONE) {
            taken[full] = false; /* the object is complete: nothing more comes */
        } else {
            int32_t want = sp_test_byte_token(t, next);
            ASSERT_OK(force(g, t, want, &o));
            taken[full] = o.token == want;
        }
        sp_gen_destroy(g);
    }
    if (taken[0] != taken[1]) {
        SP_TEST_FAIL("prefix '%.*s' + 0x%02x: lazy %d, full mask %d", (int)plen, prefix, next,
                     taken[0], taken[1]);
    }
    return taken[0];
}

TEST(gen_json_recogniser)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    sp_gen_vocab_t *table = NULL;
    char err[256];
    ASSERT_OK(sp_gen_vocab_create(v.t, &table, err, sizeof err));
    /* documents accepted byte by byte up to their last byte */
    const char *good[] = {
        "{}",
        "\n  {\"k\" : \"v\"}",
        "{\"a\":[1,-0,2.5e-3,1E+9,true,false,null,{},[]],\"b\":{\"c\":[]}}",
        "{\"s\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00 \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\x7F\"}",
        "{\r\n\t\"a\": 0.5e10,\n  \"b\": -12}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t n = strlen(good[i]);
        ASSERT(json_object_ok(good[i], n));
        ASSERT(json_takes(v.t, table, good[i], n - 1, (unsigned char)good[i][n - 1]));
    }
    /* a prefix, then a byte that must be refused */
    struct { const char *prefix; unsigned next; } bad[] = {
        {"", '['}, {"", '"'}, {"", 'x'}, {"{", ','}, {"{", '1'}, {"{\"a\"", '}'},
        {"{\"a\":", '}'}, {"{\"a\":0", '1'}, {"{\"a\":-", '}'}, {"{\"a\":1.", '}'},
        {"{\"a\":1.", 'e'}, {"{\"a\":", '.'}, {"{\"a\":1e", '}'}, {"{\"a\":", '+'},
        {"{\"a\":tr", 'x'}, {"{\"a\":nul", '}'}, {"{\"a\":\"\\", 'x'}, {"{\"a\":\"\\u12", 'g'},
        {"{\"a\":\"\\ud800", '"'}, {"{\"a\":\"\\ud800\\", 'n'}, {"{\"a\":\"\\ud800\\u", 'e'},
        {"{\"a\":\"\\ud800\\ud", '0'}, {"{\"a\":\"\\ud", 'c'}, {"{\"a\":\"", 0x01},
        {"{\"a\":\"", '\n'}, {"{\"a\":\"", 0xC0}, {"{\"a\":\"", 0xF5}, {"{\"a\":\"\xED", 0xA0},
        {"{\"a\":\"\xF4", 0x90}, {"{\"a\":\"\xE0", 0x80}, {"{\"a\":\"\xC3", 'x'},
        {"{}", 'x'}, {"{}", ','}, {"{\"a\":1", ']'}, {"{\"a\":[1", '}'}, {"{\"a\":[1,", ']'},
        {"{\"a\":1,", '}'}, {"{\"a\":[", ','}, {"{\n", '\n'}, {"{ ", '\n'}, {"{\r", ' '},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (json_takes(v.t, table, bad[i].prefix, strlen(bad[i].prefix), bad[i].next)) {
            SP_TEST_FAIL("'%s' + 0x%02x was accepted", bad[i].prefix, bad[i].next);
        }
    }
    /* the same prefixes take a valid byte (the state is not dead) */
    const char *hi = "{\"a\":\"\\ud800\\u", *ex = "{\"a\":1e";
    ASSERT(json_takes(v.t, table, hi, strlen(hi), 'd'));
    ASSERT(json_takes(v.t, table, ex, strlen(ex), '-'));

    /* nesting stops at 64 levels; whitespace runs at 20 bytes */
    char deep[128] = "{\"a\":";
    size_t dn = strlen(deep);
    for (int i = 0; i < 63; i++) deep[dn++] = '[';
    ASSERT(!json_takes(v.t, table, deep, dn, '['));
    ASSERT(json_takes(v.t, table, deep, dn, ']'));
    char ws[64] = "{";
    memset(ws + 1, ' ', 20);
    ASSERT(!json_takes(v.t, table, ws, 21, ' '));
    ASSERT(json_takes(v.t, table, ws, 20, ' '));
    /* numbers stop at 64 bytes, never inside "1." or "1e" */
    char num[128] = "{\"a\":";
    size_t nn = strlen(num);
    for (int i = 0; i < 62; i++) num[nn++] = '1';
    ASSERT(json_takes(v.t, table, num, nn, '.')); /* room for one digit after it */
    num[nn++] = '1';
    ASSERT(!json_takes(v.t, table, num, nn, '.'));
    ASSERT(!json_takes(v.t, table, num, nn, 'e'));
    ASSERT(json_takes(v.t, table, num, nn, '1'));
    num[nn++] = '1';
    ASSERT(!json_takes(v.t, table, num, nn, '1'));
    ASSERT(json_takes(v.t, table, num, nn, '}'));
    sp_gen_vocab_destroy(table);
    sp_test_vocab_close(&v);
}

TEST(gen_json_finish_and_eog)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    sp_gen_token_t o;
    char got[256];
    /* the object closing ends the generation with STOP, trailing whitespace allowed */
    sp_gen_params_t p = greedy_params(100);
    p.json_object = true;
    sp_gen_t *g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, " {\"a\": [true]}", got, NULL, NULL), SP_FINISH_STOP);
    ASSERT_STR_EQ(got, " {\"a\": [true]}");
    sp_gen_destroy(g);

    /* end-of-generation is refused while the object is open */
    p = greedy_params(100);
    p.json_object = true;
    g = make_gen(v.t, &p);
    ASSERT_EQ(feed_bytes(g, v.t, "{\"a\":", got, NULL, NULL), SP_FINISH_NONE);
    ASSERT_OK(force(g, v.t, sp_tokenizer_eos(v.t), &o));
    ASSERT(o.token != sp_tokenizer_eos(v.t));
    ASSERT_EQ(o.finish, SP_FINISH_NONE);
    sp_gen_destroy(g);

    /* no token the model allows is valid: an error, never a loop */
    p = greedy_params(100);
    p.json_object = true;
    g = make_gen(v.t, &p);
    static float l[512];
    int32_t open = sp_test_byte_token(v.t, '{');
    for (int i = 0; i < 512; i++) l[i] = -INFINITY;
    l[sp_test_byte_token(v.t, 'x')] = 1.0f; /* only invalid tokens are possible */
    ASSERT_EQ(sp_gen_step(g, l, &o), SP_ERR_UNSUPPORTED);
    ASSERT(strstr(sp_gen_error(g), "JSON") != NULL);
    sp_gen_destroy(g);

    /* sampling (full mask) with the brace a long shot still starts the object */
    p = sp_gen_default_params();
    p.sampling.temperature = 1.0f;
    p.json_object = true;
    p.max_tokens = 10;
    g = make_gen(v.t, &p);
    for (int i = 0; i < 512; i++) l[i] = 5.0f;
    l[open] = -10.0f;
    ASSERT_OK(sp_gen_step(g, l, &o));
    ASSERT(o.text_len > 0);
    for (size_t i = 0; i < o.text_len; i++) {
        ASSERT(o.text[i] == ' ' || o.text[i] == '\n' || o.text[i] == '\t' || o.text[i] == '\r' ||
               (o.text[i] == '{' && i == o.text_len - 1));
    }
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_json_budget_closes_the_object)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    static float l[512];
    /* a model that only ever wants to open things and write 'a' */
    int32_t want[3] = {sp_test_byte_token(v.t, '['), sp_test_byte_token(v.t, 'a'), sp_test_byte_token(v.t, '{')};
    for (int32_t max = 2; max <= 40; max += 3) {
        sp_gen_params_t p = greedy_params(max);
        p.json_object = true;
        sp_gen_t *g = make_gen(v.t, &p);
        char text[4096] = "";
        sp_gen_token_t o;
        int steps = 0;
        do {
            for (int i = 0; i < 512; i++) l[i] = -1.0f;
            l[want[0]] = 3.0f, l[want[1]] = 2.0f, l[want[2]] = 1.0f;
            l[sp_test_byte_token(v.t, '"')] = 0.5f;
            ASSERT_OK(sp_gen_step(g, l, &o));
            strncat(text, o.text, o.text_len);
            steps++;
        } while (o.finish == SP_FINISH_NONE);
        ASSERT(steps <= max);
        ASSERT_EQ(o.finish, SP_FINISH_LENGTH);
        if (!json_object_ok(text, strlen(text))) {
            SP_TEST_FAIL("max_tokens %d: not one JSON object: %s", max, text);
        }
        sp_gen_destroy(g);
    }
    sp_test_vocab_close(&v);
}

TEST(gen_json_random_logits_always_close)
{
    /* any model at all: random logits, sampled, every budget from 2 up */
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    sp_gen_vocab_t *table = NULL;
    char err[256];
    ASSERT_OK(sp_gen_vocab_create(v.t, &table, err, sizeof err));
    static float l[512];
    static char text[1 << 16];
    uint64_t ls = 77;
    for (int run = 0; run < 60; run++) {
        sp_gen_params_t p = sp_gen_default_params();
        p.sampling.temperature = 1.0f;
        p.sampling.top_k = 0;
        p.sampling.min_p = 0.0f;
        p.sampling.seed = (uint64_t)run;
        p.max_tokens = 2 + run;
        p.json_object = true;
        p.vocab = table;
        p.top_logprobs = run % 2 ? 20 : -1;
        sp_gen_t *g = make_gen(v.t, &p);
        size_t len = 0;
        sp_gen_token_t o;
        do {
            random_logits(l, 512, &ls);
            ASSERT_OK(sp_gen_step(g, l, &o));
            memcpy(text + len, o.text, o.text_len);
            len += o.text_len;
            if (p.top_logprobs > 0 && o.n_top < p.top_logprobs) {
                /* fewer valid tokens than asked for: they carry all the mass */
                double sum = 0.0;
                for (int j = 0; j < o.n_top; j++) sum += exp((double)o.top[j].logprob);
                ASSERT_NEAR(sum, 1.0, 1e-4);
            }
        } while (o.finish == SP_FINISH_NONE);
        text[len] = '\0';
        if (!json_object_ok(text, len)) {
            SP_TEST_FAIL("run %d (max_tokens %d): not one JSON object: %s", run, p.max_tokens, text);
        }
        ASSERT(sp_gen_n_generated(g) <= p.max_tokens);
        sp_gen_destroy(g);
    }
    sp_gen_vocab_destroy(table);
    sp_test_vocab_close(&v);
}

/* Generate with the demo model under json_object; returns the finish reason. */
static sp_finish_t
demo_json(sp_model_t *m, sp_ctx_t *c, const sp_gen_vocab_t *table, float temp, uint64_t seed,
          int32_t max_tokens, char *text, size_t cap)
{
    const sp_tokenizer_t *t = sp_model_tokenizer(m);
    int32_t n_vocab = sp_tokenizer_n_vocab(t);
    sp_gen_params_t p = sp_gen_default_params();
    p.sampling.temperature = temp;
    p.sampling.seed = seed;
    p.max_tokens = max_tokens;
    p.json_object = true;
    p.vocab = table;
    sp_gen_t *g = make_gen(t, &p);
    int32_t tok = sp_tokenizer_bos(t);
    sp_gen_accept_prompt(g, &tok, 1);
    ASSERT_OK(sp_ctx_eval(c, &tok, 1, 0));
    static float l[4096];
    ASSERT(n_vocab <= 4096);
    size_t len = 0;
    sp_gen_token_t o;
    for (int64_t pos = 1;; pos++) {
        memcpy(l, sp_ctx_logits(c), (size_t)n_vocab * sizeof(float));
        ASSERT_OK(sp_gen_step(g, l, &o));
        ASSERT(len + o.text_len < cap);
        memcpy(text + len, o.text, o.text_len);
        len += o.text_len;
        if (o.finish != SP_FINISH_NONE) break;
        ASSERT_OK(sp_ctx_eval(c, &o.token, 1, pos));
    }
    text[len] = '\0';
    sp_gen_destroy(g);
    return o.finish;
}

TEST(gen_json_demo_model_output_parses)
{
    char err[512];
    sp_model_t *m;
    sp_ctx_t *c;
    ASSERT_OK(sp_model_load(DEMO, &m, err, sizeof err));
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_threads = 1;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    sp_gen_vocab_t *table = NULL;
    ASSERT_OK(sp_gen_vocab_create(sp_model_tokenizer(m), &table, err, sizeof err));
    static char text[65536];
    struct { float temp; uint64_t seed; int32_t max; } runs[] = {
        {0.0f, 0, 120}, {0.0f, 0, 7}, {1.0f, 1, 150}, {1.0f, 2, 150}, {1.0f, 3, 200},
        {1.0f, 4, 60}, {1.0f, 5, 300}, {1.5f, 6, 100},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        sp_finish_t f = demo_json(m, c, table, runs[i].temp, runs[i].seed, runs[i].max, text,
                                  sizeof text);
        if (!json_object_ok(text, strlen(text))) {
            SP_TEST_FAIL("temp %g seed %d: not one JSON object (finish %d): %s",
                         (double)runs[i].temp, (int)runs[i].seed, (int)f, text);
        }
    }
    sp_gen_vocab_destroy(table);
    sp_ctx_destroy(c);
    sp_model_free(m);
}

/* ---- allocation and cost --------------------------------------------------- */

TEST(gen_step_allocates_nothing)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    enum { V = 512 };
    static float l[V];
    for (int mode = 0; mode < 3; mode++) {
        sp_gen_params_t p = sp_gen_default_params();
        p.max_tokens = 200;
        p.stop[0] = "xyz";
        p.stop[1] = "\xC3\xA9";
        p.top_logprobs = mode == 1 ? 20 : -1;
        p.json_object = mode != 0;
        p.sampling.temperature = mode == 2 ? 0.0f : 0.9f;
        p.sampling.repeat_penalty = 1.1f;
        sp_gen_t *g = make_gen(v.t, &p);
        uint64_t seed = 3;
        size_t before = sp_alloc_bytes_in_use();
        sp_alloc_fail_after(0);
        sp_gen_token_t o;
        do {
            random_logits(l, V, &seed);
            ASSERT_OK(sp_gen_step(g, l, &o));
        } while (o.finish == SP_FINISH_NONE);
        sp_alloc_fail_after(-1);
        ASSERT_EQ(sp_alloc_bytes_in_use(), before);
        sp_gen_destroy(g);
    }
    sp_test_vocab_close(&v);
}

/* Time steps on a 32000-token vocabulary, with and without the JSON mask. */
static double
time_steps(const sp_tokenizer_t *t, const sp_gen_vocab_t *table, bool json, float temp,
           const char *prefix, int n)
{
    int32_t V = sp_tokenizer_n_vocab(t);
    static float l[32000];
    ASSERT(V <= 32000);
    sp_gen_params_t p = sp_gen_default_params();
    p.sampling.temperature = temp;
    p.max_tokens = 1 << 20;
    p.json_object = json;
    p.vocab = table;
    p.ignore_eos = true;
    uint64_t seed = 17;
    int64_t best = INT64_MAX;
    for (int i = 0; i < n; i++) {
        sp_gen_t *g = make_gen(t, &p);
        sp_gen_token_t o;
        for (const char *c = prefix; *c; c++) { /* put the recogniser in the state to measure */
            ASSERT_OK(force(g, t, sp_test_byte_token(t, (unsigned char)*c), &o));
        }
        random_logits(l, V, &seed);
        int64_t t0 = sp_time_ns();
        ASSERT_OK(sp_gen_step(g, l, &o));
        int64_t dt = sp_time_ns() - t0;
        best = dt < best ? dt : best;
        sp_gen_destroy(g);
    }
    return (double)best / 1e3;
}

TEST(gen_json_mask_cost_32k_vocab)
{
#ifdef __SANITIZE_ADDRESS__
    const int runs = 3; /* the numbers mean nothing under ASan; keep the suite quick */
#else
    const int runs = 30;
#endif
    sp_test_vocab_t v = sp_test_vocab_open(SPM32K);
    char err[256];
    int64_t t0 = sp_time_ns();
    sp_gen_vocab_t *table = NULL;
    ASSERT_OK(sp_gen_vocab_create(v.t, &table, err, sizeof err));
    double build_ms = (double)(sp_time_ns() - t0) / 1e6;
    double plain = time_steps(v.t, NULL, false, 0.8f, "", runs);
    double str = time_steps(v.t, table, true, 0.8f, "{\"", runs);
    double start = time_steps(v.t, table, true, 0.8f, "", runs);
    double after = time_steps(v.t, table, true, 0.8f, "{\"a\":1", runs);
    double plain_greedy = time_steps(v.t, NULL, false, 0.0f, "", runs);
    double greedy = time_steps(v.t, table, true, 0.0f, "{\"", runs);
    fprintf(stderr,
            "  n_vocab %d: table %.2f ms; step (best of %d) sampling: plain %.1f us, json in a "
            "string %.1f us, at the start %.1f us, after a value %.1f us; greedy: plain %.1f us, "
            "json in a string %.1f us\n",
            sp_tokenizer_n_vocab(v.t), build_ms, runs, plain, str, start, after, plain_greedy, greedy);
    sp_gen_vocab_destroy(table);
    sp_test_vocab_close(&v);
}
