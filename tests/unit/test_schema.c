/* test_schema.c - JSON Schema to grammar (constrain/schema.h), and generation under it. */
#include <jansson.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/gen.h"
#include "engine/model.h"
#include "constrain/schema.h"
#include "test.h"

static sp_grammar_t *
schema_ok(const char *json)
{
    json_error_t je;
    json_t *s = json_loads(json, 0, &je);
    if (s == NULL) {
        SP_TEST_FAIL("bad test JSON: %s", je.text);
    }
    sp_grammar_t *g = NULL;
    char err[256];
    if (sp_schema_grammar(s, &g, err, sizeof err) != SP_OK) {
        char *text = NULL;
        size_t n;
        sp_schema_to_gbnf(s, &text, &n, err, sizeof err);
        SP_TEST_FAIL("schema failed: %s\n%s", err, text ? text : "");
    }
    json_decref(s);
    return g;
}

static const char *
schema_err(const char *json)
{
    static char err[256];
    json_t *s = json_loads(json, 0, NULL);
    ASSERT(s != NULL);
    sp_grammar_t *g = NULL;
    err[0] = '\0';
    sp_status_t st = sp_schema_grammar(s, &g, err, sizeof err);
    json_decref(s);
    if (st == SP_OK) {
        sp_grammar_release(g);
        SP_TEST_FAIL("accepted, expected an error: %s", json);
    }
    ASSERT_EQ(st, SP_ERR_INVALID);
    return err;
}

#define YES(g, s) do { if (sp_gmatch_match(g, s, strlen(s)) != 1) SP_TEST_FAIL("should accept: %s", s); } while (0)
#define NO(g, s) do { if (sp_gmatch_match(g, s, strlen(s)) != 0) SP_TEST_FAIL("should reject: %s", s); } while (0)

TEST(schema_primitives)
{
    sp_grammar_t *g = schema_ok("{\"type\": \"integer\"}");
    YES(g, "0");
    YES(g, "-12");
    NO(g, "01");
    NO(g, "1.5");
    sp_grammar_release(g);
    g = schema_ok("{\"type\": \"number\"}");
    YES(g, "-1.25e+10");
    YES(g, "3");
    NO(g, "1.");
    NO(g, "12345678901234567890"); /* digits are bounded */
    sp_grammar_release(g);
    g = schema_ok("{\"type\": [\"string\", \"null\"]}");
    YES(g, "null");
    YES(g, "\"a\\\"b\\u00e9\\n\"");
    NO(g, "\"a\nb\"");          /* raw control character */
    NO(g, "\"\\ud800\"");       /* lone surrogate escape */
    NO(g, "true");
    sp_grammar_release(g);
    g = schema_ok("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}");
    YES(g, "\"ab\"");
    YES(g, "\"\\n\\tx\"");
    NO(g, "\"a\"");
    NO(g, "\"abcd\"");
    sp_grammar_release(g);
    g = schema_ok("{\"type\": \"boolean\"}");
    YES(g, "true");
    NO(g, "1");
    sp_grammar_release(g);
    g = schema_ok("{\"type\": \"integer\", \"minimum\": 0}");
    YES(g, "7");
    NO(g, "-7");
    sp_grammar_release(g);
}

TEST(schema_objects_required_optional)
{
    sp_grammar_t *g = schema_ok(
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"},"
        " \"age\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": "
        "{\"enum\": [\"a\", \"b\", 3, null]}, \"maxItems\": 2}},"
        " \"required\": [\"age\"], \"additionalProperties\": false}");
    YES(g, "{\"age\":3}");
    YES(g, "{\"name\":\"x\",\"age\":3}");
    YES(g, "{ \"name\" : \"x\" , \"age\" : 3 , \"tags\" : [ \"a\" , null ] }");
    YES(g, "{\"age\":3,\"tags\":[]}");
    NO(g, "{}");                            /* age is required */
    NO(g, "{\"name\":\"x\"}");
    NO(g, "{\"age\":3,}");
    NO(g, "{,\"age\":3}");
    NO(g, "{\"age\":3,\"tags\":[\"a\",\"b\",3]}"); /* maxItems */
    NO(g, "{\"age\":3,\"tags\":[\"c\"]}");   /* enum */
    NO(g, "{\"age\":3,\"extra\":1}");
    sp_grammar_release(g);
    /* all optional: {} and any subset in order */
    g = schema_ok("{\"properties\": {\"a\": {\"const\": 1}, \"b\": {\"const\": 2}}}");
    YES(g, "{}");
    YES(g, "{\"b\":2}");
    YES(g, "{\"a\":1,\"b\":2}");
    NO(g, "{\"a\":1,}");
    sp_grammar_release(g);
}

TEST(schema_nested_arrays_anyof_refs)
{
    sp_grammar_t *g = schema_ok(
        "{\"type\": \"array\", \"minItems\": 1, \"items\": {\"anyOf\": ["
        "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"array\", \"items\": "
        "{\"type\": \"number\"}}}, \"required\": [\"x\"]}, {\"type\": \"boolean\"}]}}");
    YES(g, "[true]");
    YES(g, "[{\"x\":[1,2.5]},false]");
    NO(g, "[]");
    NO(g, "[{\"x\":[\"1\"]}]");
    sp_grammar_release(g);
    /* a recursive tree through $defs */
    g = schema_ok(
        "{\"$ref\": \"#/$defs/node\", \"$defs\": {\"node\": {\"type\": \"object\", "
        "\"properties\": {\"v\": {\"type\": \"integer\"}, \"kids\": {\"type\": \"array\", "
        "\"items\": {\"$ref\": \"#/$defs/node\"}}}, \"required\": [\"v\", \"kids\"]}}}");
    YES(g, "{\"v\":1,\"kids\":[]}");
    YES(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[]}]}]}");
    NO(g, "{\"v\":1}");
    sp_grammar_release(g);
    /* definitions and "#" */
    g = schema_ok("{\"type\": \"object\", \"properties\": {\"next\": {\"anyOf\": [{\"$ref\": \"#\"}, "
                  "{\"type\": \"null\"}]}}, \"required\": [\"next\"]}");
    YES(g, "{\"next\":{\"next\":null}}");
    sp_grammar_release(g);
    g = schema_ok("{\"definitions\": {\"a~1b\": {\"type\": \"null\"}}, \"$ref\": \"#/definitions/a~01b\"}");
    sp_grammar_release(g);
}

TEST(schema_unsupported_features_named)
{
    const char *e;
    e = schema_err("{\"type\": \"string\", \"pattern\": \"^(a)\\\\1$\"}");
    ASSERT(strstr(e, "backreference") != NULL);
    e = schema_err("{\"type\": \"object\", \"properties\": {\"d\": {\"type\": \"string\", \"format\": \"ipv6\"}}}");
    ASSERT(strstr(e, "format 'ipv6'") != NULL && strstr(e, "/properties/d") != NULL);
    e = schema_err("{\"if\": {}, \"then\": {}}");
    ASSERT(strstr(e, "'if'") != NULL);
    e = schema_err("{\"type\": \"integer\", \"minimum\": 3, \"maximum\": 2}");
    ASSERT(strstr(e, "no value") != NULL);
    e = schema_err("{\"$ref\": \"http://example.com/x.json\"}");
    ASSERT(strstr(e, "$ref") != NULL);
    e = schema_err("{\"$ref\": \"#/$defs/missing\"}");
    ASSERT(strstr(e, "points at nothing") != NULL);
    e = schema_err("{\"type\": \"strin\"}");
    ASSERT(strstr(e, "strin") != NULL);
    e = schema_err("{\"type\": \"object\", \"properties\": {}, \"required\": [\"x\"]}");
    ASSERT(strstr(e, "'x'") != NULL);
    e = schema_err("{\"type\": \"string\", \"maxLength\": 100000}");
    ASSERT(strstr(e, "maxLength") != NULL);
    e = schema_err("{\"allOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}");
    ASSERT(strstr(e, "disagree on 'type'") != NULL);
    /* a recursion that can never end: the grammar compiler says so */
    e = schema_err("{\"$ref\": \"#/$defs/a\", \"$defs\": {\"a\": {\"type\": \"object\", "
                   "\"properties\": {\"a\": {\"$ref\": \"#/$defs/a\"}}, \"required\": [\"a\"]}}}");
    ASSERT(strstr(e, "never end") != NULL);
}

TEST(schema_keywords_beside_whole_rules)
{
    /* $ref, const, enum and the combinators make the whole rule: a constraining keyword beside
     * them would be dropped (output that does not validate), so it is refused */
    const char *e;
    e = schema_err("{\"type\": \"integer\", \"anyOf\": [{}]}");
    ASSERT(strstr(e, "'type' beside 'anyOf'") != NULL);
    e = schema_err("{\"minimum\": 0, \"oneOf\": [{\"type\": \"integer\"}]}");
    ASSERT(strstr(e, "'minimum' beside 'oneOf'") != NULL);
    e = schema_err("{\"$ref\": \"#/$defs/a\", \"type\": \"string\", \"$defs\": {\"a\": {}}}");
    ASSERT(strstr(e, "'type' beside '$ref'") != NULL);
    e = schema_err("{\"properties\": {\"a\": {\"const\": 1, \"required\": [\"b\"]}}}");
    ASSERT(strstr(e, "'required' beside 'const'") != NULL && strstr(e, "/properties/a") != NULL);
    e = schema_err("{\"type\": \"string\", \"enum\": [\"a\", 1]}");
    ASSERT(strstr(e, "'type' beside 'enum'") != NULL);
    /* type beside enum or const is kept when every value has it; annotations stay ignored */
    sp_grammar_t *g = schema_ok("{\"type\": \"string\", \"enum\": [\"a\", \"b\"], \"title\": \"t\"}");
    ASSERT_EQ(sp_gmatch_match(g, "\"b\"", 3), 1);
    sp_grammar_release(g);
    g = schema_ok("{\"type\": [\"integer\", \"null\"], \"const\": null}");
    ASSERT_EQ(sp_gmatch_match(g, "null", 4), 1);
    sp_grammar_release(g);
}

TEST(schema_oneof_exclusive)
{
    /* Branches no value can match twice compile (the alternation is then exactly oneOf). */
    sp_grammar_t *g = schema_ok("{\"oneOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}, "
                                "{\"type\": [\"integer\", \"boolean\"]}]}");
    YES(g, "\"a\"");
    YES(g, "null");
    YES(g, "3");
    NO(g, "[]");
    sp_grammar_release(g);
    g = schema_ok("{\"oneOf\": [{\"const\": \"a\"}, {\"enum\": [\"b\", 1]}, {\"type\": \"object\"}]}");
    YES(g, "1");
    NO(g, "\"c\"");
    sp_grammar_release(g);
    /* a tagged union through $defs (pydantic's shape): a required const discriminator */
    g = schema_ok("{\"oneOf\": [{\"$ref\": \"#/$defs/cat\"}, {\"$ref\": \"#/$defs/dog\"}], "
                  "\"discriminator\": {\"propertyName\": \"kind\"}, \"$defs\": {"
                  "\"cat\": {\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"cat\"}, "
                  "\"lives\": {\"type\": \"integer\"}}, \"required\": [\"kind\", \"lives\"]}, "
                  "\"dog\": {\"type\": \"object\", \"properties\": {\"kind\": {\"type\": \"string\", "
                  "\"enum\": [\"dog\"]}, \"lives\": {\"type\": \"integer\"}}, \"required\": [\"kind\"]}}}");
    YES(g, "{\"kind\":\"cat\",\"lives\":9}");
    YES(g, "{\"kind\":\"dog\"}");
    NO(g, "{\"kind\":\"cow\"}");
    sp_grammar_release(g);

    /* Overlapping branches are refused, naming oneOf and the branches. */
    const char *e;
    e = schema_err("{\"oneOf\": [{\"type\": \"integer\"}, {\"type\": \"number\"}]}");
    ASSERT(strstr(e, "'oneOf' branches 0 and 1") != NULL);
    e = schema_err("{\"oneOf\": [{\"enum\": [1, 2]}, {\"const\": 2.0}]}"); /* 2 = 2.0 */
    ASSERT(strstr(e, "'oneOf'") != NULL);
    e = schema_err("{\"oneOf\": [{\"type\": \"string\"}, {\"const\": \"x\"}]}");
    ASSERT(strstr(e, "'oneOf' branches 0 and 1") != NULL);
    e = schema_err("{\"type\": \"object\", \"properties\": {\"p\": {\"oneOf\": [{\"type\": \"null\"}, "
                   "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}}, {}]}}}");
    ASSERT(strstr(e, "'oneOf' branches 0 and 2") != NULL && strstr(e, "/properties/p") != NULL);
    /* objects: a discriminator only when both require it (else {} matches both) */
    e = schema_err("{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"k\": {\"const\": 1}}, "
                   "\"required\": [\"k\"]}, {\"type\": \"object\", \"properties\": {\"k\": "
                   "{\"const\": 2}}}]}");
    ASSERT(strstr(e, "'oneOf'") != NULL);
    e = schema_err("{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"k\": {\"enum\": [1, 2]}}, "
                   "\"required\": [\"k\"]}, {\"type\": \"object\", \"properties\": {\"k\": "
                   "{\"enum\": [2, 3]}}, \"required\": [\"k\"]}]}");
    ASSERT(strstr(e, "'oneOf'") != NULL);
    /* anyOf with the same branches stays an alternation */
    g = schema_ok("{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"number\"}]}");
    sp_grammar_release(g);
}

TEST(schema_bounded_compile)
{
    /* 20000 enum values: over the node cap, refused quickly */
    size_t cap = 1 << 20;
    char *s = sp_malloc(cap);
    ASSERT(s != NULL);
    size_t k = (size_t)sprintf(s, "{\"enum\": [");
    for (int i = 0; i < 20000; i++) {
        k += (size_t)sprintf(s + k, i ? ",%d" : "%d", i);
    }
    k += (size_t)sprintf(s + k, "]}");
    int64_t t0 = sp_time_ns();
    const char *e = schema_err(s);
    ASSERT(strstr(e, "10000") != NULL);
    /* deep nesting of arrays: refused past 64 levels, no deep recursion */
    k = 0;
    for (int i = 0; i < 100; i++) {
        k += (size_t)sprintf(s + k, "{\"type\": \"array\", \"items\": ");
    }
    k += (size_t)sprintf(s + k, "{\"type\": \"null\"}");
    for (int i = 0; i < 100; i++) {
        s[k++] = '}';
    }
    s[k] = '\0';
    json_t *j = json_loads(s, 0, NULL);
    ASSERT(j != NULL);
    sp_grammar_t *g = NULL;
    char err[256];
    ASSERT(sp_schema_grammar(j, &g, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "64") != NULL);
    json_decref(j);
    ASSERT((sp_time_ns() - t0) / 1000000 < 2000);
    sp_free(s);
}

/* An object with n properties, all required: the work of compiling it
 * (properties and required entries visited) is linear in n, so 4x the
 * properties cost at most 4x (plus a constant), never the 16x of a
 * properties x required scan. A 0.4 MB schema once held the server's event
 * loop for seconds that way. */
static uint64_t
object_work(int n)
{
    json_t *props = json_object(), *req = json_array();
    ASSERT(props != NULL && req != NULL);
    for (int i = 0; i < n; i++) {
        char k[32];
        snprintf(k, sizeof k, "p%d", i);
        json_object_set_new(props, k, json_pack("{s:s}", "type", "integer"));
        json_array_append_new(req, json_string(k));
    }
    json_t *s = json_pack("{s:s,s:o,s:o}", "type", "object", "properties", props, "required", req);
    ASSERT(s != NULL);
    sp_schema_gbnf_t *b = NULL;
    ASSERT_EQ(sp_schema_gbnf_create(&b), SP_OK);
    char rule[64], err[256];
    ASSERT_EQ(sp_schema_gbnf_add(b, s, rule, sizeof rule, err, sizeof err), SP_OK);
    uint64_t w = sp_schema_gbnf_work(b);
    sp_schema_gbnf_destroy(b);
    json_decref(s);
    return w;
}

TEST(schema_object_compile_linear)
{
    uint64_t w1 = object_work(500), w4 = object_work(2000), w16 = object_work(8000);
    ASSERT(w1 >= 500); /* it counts something per property */
    if (w4 > 4 * w1 + 64 || w16 > 4 * w4 + 64) {
        SP_TEST_FAIL("compile work grows faster than the schema: %llu, %llu, %llu for 500, 2000, "
                     "8000 properties", (unsigned long long)w1, (unsigned long long)w4,
                     (unsigned long long)w16);
    }
}

/* ---- generation under a schema grammar --------------------------------------- */

static uint64_t
rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

TEST(schema_gen_random_logits_always_valid)
{
    char err[512];
    sp_gguf_t *gg;
    sp_tokenizer_t *t;
    ASSERT_OK(sp_gguf_open("models/stories260K.gguf", &gg, err, sizeof err));
    ASSERT_OK(sp_tokenizer_from_gguf(gg, &t, err, sizeof err));
    sp_grammar_t *g = schema_ok(
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 12},"
        " \"n\": {\"type\": \"integer\"}, \"ok\": {\"type\": \"boolean\"}, \"kind\": {\"enum\": "
        "[\"cat\", \"dog\"]}, \"list\": {\"type\": \"array\", \"items\": {\"type\": \"number\"}}},"
        " \"required\": [\"name\", \"kind\"]}");
    sp_gen_vocab_t *table = NULL;
    ASSERT_OK(sp_gen_vocab_create(t, &table, err, sizeof err));
    int32_t V = sp_tokenizer_n_vocab(t);
    float *l = sp_malloc((size_t)V * sizeof(float));
    static char text[1 << 16];
    uint64_t seed = 99;
    int complete = 0;
    for (int run = 0; run < 40; run++) {
        sp_gen_params_t p = sp_gen_default_params();
        p.sampling.temperature = 1.0f;
        p.sampling.top_k = 0;
        p.sampling.seed = (uint64_t)run;
        p.max_tokens = 30 + 4 * run;
        p.grammar = g;
        p.vocab = table;
        p.top_logprobs = run % 3 == 0 ? 5 : -1;
        sp_gen_t *gen;
        ASSERT_OK(sp_gen_create(t, &p, &gen, err, sizeof err));
        int32_t prompt = 5;
        sp_gen_accept_prompt(gen, &prompt, 1);
        size_t len = 0;
        sp_gen_token_t o;
        do {
            for (int32_t i = 0; i < V; i++) {
                l[i] = (float)(rng(&seed) % 1000) / 100.0f;
            }
            ASSERT_OK(sp_gen_step(gen, l, &o));
            ASSERT(len + o.text_len < sizeof text);
            memcpy(text + len, o.text, o.text_len);
            len += o.text_len;
        } while (o.finish == SP_FINISH_NONE);
        text[len] = '\0';
        if (sp_gmatch_match(g, text, len) != 1) {
            SP_TEST_FAIL("run %d (max_tokens %d, finish %d): not a sentence: %s", run, p.max_tokens,
                         (int)o.finish, text);
        }
        complete += o.finish == SP_FINISH_STOP;
        sp_gen_destroy(gen);
    }
    ASSERT(complete > 0);
    sp_free(l);
    sp_gen_vocab_destroy(table);
    sp_grammar_release(g);
    sp_tokenizer_destroy(t);
    sp_gguf_close(gg);
}

/* Force the bytes of prefix through the generation (one single-byte token each). */
static void
force_prefix(sp_gen_t *gen, const sp_tokenizer_t *t, float *l, const char *prefix)
{
    int32_t V = sp_tokenizer_n_vocab(t);
    for (const char *c = prefix; *c; c++) {
        int32_t id = -1;
        for (int32_t k = 0; k < V && id < 0; k++) {
            char piece[64];
            if (sp_tokenizer_piece(t, k, false, piece, sizeof piece) == 1 && piece[0] == *c) {
                id = k;
            }
        }
        ASSERT(id >= 0);
        for (int32_t k = 0; k < V; k++) {
            l[k] = k == id ? 10.0f : -10.0f;
        }
        sp_gen_token_t o;
        ASSERT_OK(sp_gen_step(gen, l, &o));
        ASSERT_EQ(o.token, id);
    }
}

/* Random logits; with in_string, tokens holding '"' or '\\' get -inf, so the
 * sampled token keeps a JSON string open (and its grammar state the same). */
static void
fill_logits(const sp_tokenizer_t *t, float *l, uint64_t *seed, bool in_string)
{
    int32_t V = sp_tokenizer_n_vocab(t);
    for (int32_t k = 0; k < V; k++) {
        l[k] = (float)(rng(seed) % 1000) / 100.0f;
        if (in_string) {
            char piece[64];
            int32_t n = sp_tokenizer_piece(t, k, false, piece, sizeof piece);
            if (n > 0 && (memchr(piece, '"', (size_t)n) || memchr(piece, '\\', (size_t)n))) {
                l[k] = -INFINITY;
            }
        }
    }
}

/*
 * Best-of-runs time of one sampling step after prefix. cold: a fresh
 * generation per run (the state's first walk); otherwise one generation
 * stepping inside a string (the state repeats: its cached mask).
 */
static double
step_us(const sp_tokenizer_t *t, const sp_gen_vocab_t *table, sp_grammar_t *g, const char *prefix,
        int runs, bool cold)
{
    int32_t V = sp_tokenizer_n_vocab(t);
    float *l = sp_malloc((size_t)V * sizeof(float));
    ASSERT(l != NULL);
    uint64_t seed = 5;
    int64_t best = INT64_MAX;
    char err[256];
    sp_gen_params_t p = sp_gen_default_params();
    p.sampling.temperature = 0.8f;
    p.max_tokens = 1 << 20;
    p.grammar = g;
    p.vocab = table;
    p.ignore_eos = true;
    sp_gen_t *gen = NULL;
    sp_gen_token_t o;
    for (int i = 0; i <= runs; i++) {
        if (cold || gen == NULL) {
            sp_gen_destroy(gen);
            ASSERT_OK(sp_gen_create(t, &p, &gen, err, sizeof err));
            force_prefix(gen, t, l, prefix);
        }
        fill_logits(t, l, &seed, !cold);
        int64_t t0 = sp_time_ns();
        ASSERT_OK(sp_gen_step(gen, l, &o));
        int64_t dt = sp_time_ns() - t0;
        if (i > 0 || cold) {
            best = dt < best ? dt : best;
        }
    }
    sp_gen_destroy(gen);
    sp_free(l);
    return (double)best / 1e3;
}

TEST(schema_mask_cost)
{
#ifdef __SANITIZE_ADDRESS__
    const int runs = 2;
#else
    const int runs = 10;
#endif
    const char *files[] = {"models/stories260K.gguf", "tests/data/tokenizer/ggml-vocab-llama-spm.gguf"};
    for (int f = 0; f < 2; f++) {
        char err[512];
        sp_gguf_t *gg;
        sp_tokenizer_t *t;
        ASSERT_OK(sp_gguf_open(files[f], &gg, err, sizeof err));
        ASSERT_OK(sp_tokenizer_from_gguf(gg, &t, err, sizeof err));
        sp_gen_vocab_t *table = NULL;
        ASSERT_OK(sp_gen_vocab_create(t, &table, err, sizeof err));
        sp_grammar_t *g = schema_ok(
            "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": "
            "{\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": "
            "\"string\"}}}, \"required\": [\"name\", \"age\"]}");
        double plain = step_us(t, table, NULL, "", runs, true);
        double start_cold = step_us(t, table, g, "", runs, true);
        double str_cold = step_us(t, table, g, "{\"name\":\"", runs, true);
        double str_warm = step_us(t, table, g, "{\"name\":\"ab", runs, false);
        double num_cold = step_us(t, table, g, "{\"name\":\"x\",\"age\":1", runs, true);
        fprintf(stderr,
                "  %s (n_vocab %d): sampling step (best of %d) plain %.1f us; schema grammar: "
                "start %.1f us (first walk), in a string %.1f us first walk / %.1f us state "
                "seen before, in a number %.1f us first walk\n",
                files[f], sp_tokenizer_n_vocab(t), runs, plain, start_cold, str_cold, str_warm,
                num_cold);
        sp_grammar_release(g);
        sp_gen_vocab_destroy(table);
        sp_tokenizer_destroy(t);
        sp_gguf_close(gg);
    }
}
