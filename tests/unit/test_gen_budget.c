/*
 * test_gen_budget.c - the reasoning budget in the generation module: the
 * thinking part's tokens are counted from its open marker (or from the
 * start when the prompt opened it), the close marker is forced after the
 * budget whatever the logits say, a character is never cut, a natural close
 * stops the count, a new part gets a new budget, and the candidates path
 * forces the same. On the demo model's tokenizer (byte-fallback tokens, so
 * every test text is spelled one byte per token) with synthetic logits.
 */
#include "test.h"
#include "vocab.h"

#include "engine/gen.h"

#define DEMO "models/stories260K.gguf"

/* Greedy, a budget of `budget` with markers "<t>" / "</t>", the close
 * marker's bytes as the forced tokens. */
static sp_gen_params_t
budget_params(const sp_tokenizer_t *t, int32_t budget, bool in_prompt)
{
    sp_gen_params_t p = sp_gen_default_params();
    p.sampling.temperature = 0.0f;
    p.max_tokens = 100;
    p.reasoning_budget = budget;
    snprintf(p.think_open, sizeof p.think_open, "<t>");
    snprintf(p.think_close, sizeof p.think_close, "</t>");
    p.think_in_prompt = in_prompt;
    const char *close = "</t>";
    for (int i = 0; close[i]; i++) {
        p.think_force[i] = sp_test_byte_token(t, (unsigned char)close[i]);
    }
    p.n_think_force = 4;
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

/*
 * Each byte of `want` is the logits' clear favourite in turn (one step
 * each); the text released is appended to `got`. The model "wants" `want`;
 * what comes out is what the budget lets through.
 */
static void
run_bytes(sp_gen_t *g, const sp_tokenizer_t *t, const char *want, char *got, size_t cap)
{
    static float l[1 << 16];
    int32_t n = sp_tokenizer_n_vocab(t);
    got[0] = '\0';
    for (const char *p = want; *p; p++) {
        for (int32_t i = 0; i < n; i++) {
            l[i] = (float)(i % 7) * 0.01f;
        }
        l[sp_test_byte_token(t, (unsigned char)*p)] = 30.0f;
        sp_gen_token_t o;
        ASSERT_OK(sp_gen_step(g, l, &o));
        ASSERT(strlen(got) + o.text_len < cap);
        strncat(got, o.text, o.text_len);
    }
}

TEST(gen_budget_forces_the_close_marker)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char got[256];
    /* the prompt opened the part: 3 tokens, then "</t>" however the logits
     * lean, then the model again */
    sp_gen_params_t p = budget_params(v.t, 3, true);
    sp_gen_t *g = make_gen(v.t, &p);
    run_bytes(g, v.t, "abcdefghij", got, sizeof got);
    ASSERT_STR_EQ(got, "abc</t>hij");
    ASSERT_EQ(sp_gen_n_forced(g), 4);
    sp_gen_destroy(g);

    /* the model opens it; the open marker's tokens do not count; a second
     * part gets a budget of its own */
    p = budget_params(v.t, 2, false);
    g = make_gen(v.t, &p);
    run_bytes(g, v.t, "x<t>abcdefgy<t>pqrstuv", got, sizeof got);
    ASSERT_STR_EQ(got, "x<t>ab</t>gy<t>pq</t>v");
    ASSERT_EQ(sp_gen_n_forced(g), 8);
    sp_gen_destroy(g);

    /* closed by the model within the budget: nothing forced, and text after
     * the part is not counted; a close marker the model has begun when the
     * budget runs out (at 't' here) is let finish, not forced over */
    p = budget_params(v.t, 5, false);
    g = make_gen(v.t, &p);
    run_bytes(g, v.t, "<t>ab</t>cdefghijkl", got, sizeof got);
    ASSERT_STR_EQ(got, "<t>ab</t>cdefghijkl");
    ASSERT_EQ(sp_gen_n_forced(g), 0);
    sp_gen_destroy(g);

    /* 0: no thinking at all */
    p = budget_params(v.t, 0, true);
    g = make_gen(v.t, &p);
    run_bytes(g, v.t, "abcdefg", got, sizeof got);
    ASSERT_STR_EQ(got, "</t>efg");
    sp_gen_destroy(g);

    /* no budget (-1): the markers change nothing */
    p = budget_params(v.t, -1, true);
    g = make_gen(v.t, &p);
    run_bytes(g, v.t, "abcdefg", got, sizeof got);
    ASSERT_STR_EQ(got, "abcdefg");
    ASSERT_EQ(sp_gen_n_forced(g), 0);
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_budget_never_cuts_a_character)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char got[256];
    /* the budget's last token begins é (C3 A9): its second byte still comes */
    sp_gen_params_t p = budget_params(v.t, 2, true);
    sp_gen_t *g = make_gen(v.t, &p);
    run_bytes(g, v.t, "a\xC3\xA9xyzwq", got, sizeof got);
    ASSERT_STR_EQ(got, "a\xC3\xA9</t>q");
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_budget_candidates_path)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    sp_gen_params_t p = budget_params(v.t, 1, true);
    sp_gen_t *g = make_gen(v.t, &p);
    ASSERT_EQ(sp_gen_candidates(g), 1); /* greedy: the best logit only */
    int32_t ids[1] = {sp_test_byte_token(v.t, 'a')}; /* never one of the close marker's */
    float vals[1] = {10.0f};
    char got[64] = "";
    for (int k = 0; k < 5; k++) {
        sp_gen_token_t o;
        ASSERT_OK(sp_gen_step_candidates(g, ids, vals, 1, &o));
        strncat(got, o.text, o.text_len);
    }
    ASSERT_STR_EQ(got, "a</t>");
    sp_gen_destroy(g);
    sp_test_vocab_close(&v);
}

TEST(gen_budget_rejects_bad_params)
{
    sp_test_vocab_t v = sp_test_vocab_open(DEMO);
    char err[256];
    sp_gen_t *g = NULL;
    sp_gen_params_t p = budget_params(v.t, 3, false);
    p.think_close[0] = '\0';
    ASSERT_EQ(sp_gen_create(v.t, &p, &g, err, sizeof err), SP_ERR_INVALID);
    p = budget_params(v.t, 3, false);
    p.think_open[0] = '\0'; /* nothing could open a part */
    ASSERT_EQ(sp_gen_create(v.t, &p, &g, err, sizeof err), SP_ERR_INVALID);
    p = budget_params(v.t, 3, true);
    p.think_force[1] = sp_tokenizer_n_vocab(v.t);
    ASSERT_EQ(sp_gen_create(v.t, &p, &g, err, sizeof err), SP_ERR_INVALID);
    p.n_think_force = SP_GEN_MAX_THINK_FORCE + 1;
    ASSERT_EQ(sp_gen_create(v.t, &p, &g, err, sizeof err), SP_ERR_INVALID);
    ASSERT(g == NULL);
    sp_test_vocab_close(&v);
}
