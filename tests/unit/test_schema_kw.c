/* test_schema_kw.c - JSON Schema keywords compiled into the grammar (constrain/schema.h):
 * numeric ranges and multipleOf, string formats and patterns (constrain/regex.h), uniqueItems,
 * allOf, and the limits that keep a hostile schema a quick 400. Each grammar is checked on both
 * sides of every edge: values just inside are accepted, values just outside refused. */
#include <jansson.h>
#include <stdio.h>

#include "constrain/regex.h"
#include "constrain/schema.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "test.h"

static sp_grammar_t *
kw_ok(const char *json)
{
    json_error_t je;
    json_t *s = json_loads(json, 0, &je);
    if (s == NULL) {
        SP_TEST_FAIL("bad test JSON: %s (%s)", je.text, json);
    }
    sp_grammar_t *g = NULL;
    char err[256];
    if (sp_schema_grammar(s, &g, err, sizeof err) != SP_OK) {
        SP_TEST_FAIL("schema failed: %s (%s)", err, json);
    }
    json_decref(s);
    return g;
}

/* The error of a refused schema; st_out gets its status. */
static const char *
kw_err(const char *json, sp_status_t *st_out)
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
    if (st_out) {
        *st_out = st;
    }
    return err;
}

#define Y(g, s) do { if (sp_gmatch_match(g, s, strlen(s)) != 1) SP_TEST_FAIL("should accept: %s", s); } while (0)
#define N(g, s) do { if (sp_gmatch_match(g, s, strlen(s)) != 0) SP_TEST_FAIL("should reject: %s", s); } while (0)

TEST(schema_kw_integer_ranges)
{
    sp_grammar_t *g = kw_ok("{\"type\": \"integer\", \"minimum\": 1, \"maximum\": 10}");
    for (int i = 1; i <= 10; i++) {
        char t[16];
        snprintf(t, sizeof t, "%d", i);
        Y(g, t);
    }
    N(g, "0");
    N(g, "11");
    N(g, "-1");
    N(g, "01");
    N(g, "1.5");
    sp_grammar_release(g);
    /* every value of a range that crosses zero and digit lengths, exactly */
    g = kw_ok("{\"type\": \"integer\", \"minimum\": -123, \"exclusiveMaximum\": 1057}");
    for (int i = -200; i <= 1200; i++) {
        char t[16];
        snprintf(t, sizeof t, "%d", i);
        if (sp_gmatch_match(g, t, strlen(t)) != (i >= -123 && i < 1057)) {
            SP_TEST_FAIL("range [-123, 1057): %d", i);
        }
    }
    N(g, "-0");
    sp_grammar_release(g);
    /* one side only; exclusive; real bounds round inwards; draft-4 boolean exclusive */
    g = kw_ok("{\"type\": \"integer\", \"exclusiveMinimum\": 0}");
    Y(g, "1");
    Y(g, "9007199254740991");
    N(g, "0");
    N(g, "-3");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"integer\", \"minimum\": -2.5, \"maximum\": 2.5}");
    Y(g, "-2");
    Y(g, "2");
    N(g, "-3");
    N(g, "3");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"integer\", \"minimum\": 5, \"exclusiveMinimum\": true}");
    N(g, "5");
    Y(g, "6");
    sp_grammar_release(g);
    /* OpenAPI's numeric formats: int32 a range, int64 an integer, float/double any number */
    g = kw_ok("{\"type\": \"integer\", \"format\": \"int32\", \"minimum\": -5}");
    Y(g, "2147483647");
    N(g, "2147483648");
    N(g, "-6");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"number\", \"format\": \"int64\"}");
    Y(g, "-12");
    N(g, "1.5");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"number\", \"format\": \"double\"}");
    Y(g, "1.5e3");
    sp_grammar_release(g);
    sp_status_t fst;
    ASSERT(strstr(kw_err("{\"type\": \"integer\", \"format\": \"uint8\"}", &fst), "uint8") != NULL);
    g = kw_ok("{\"type\": [\"string\", \"integer\"], \"format\": \"date\"}");
    Y(g, "7");
    Y(g, "\"2020-01-02\"");
    N(g, "\"x\"");
    sp_grammar_release(g);
    /* zod's int(): the safe-integer range */
    g = kw_ok("{\"type\": \"integer\", \"minimum\": -9007199254740991, \"maximum\": 9007199254740991}");
    Y(g, "-9007199254740991");
    Y(g, "0");
    Y(g, "9007199254740991");
    N(g, "9007199254740992");
    N(g, "-9007199254740992");
    sp_grammar_release(g);
}

TEST(schema_kw_number_ranges)
{
    sp_grammar_t *g = kw_ok("{\"type\": \"number\", \"minimum\": -1.5, \"maximum\": 2.25}");
    Y(g, "-1.50");
    Y(g, "-1.49");
    Y(g, "-0.001");
    Y(g, "0.00");
    Y(g, "2.25");
    Y(g, "2.24999");
    Y(g, "1.00");
    N(g, "-1.51");
    N(g, "-1.501");  /* the far end is exact: no digits after it */
    N(g, "2.26");
    N(g, "2.251");
    N(g, "3.00");
    N(g, "1e2");
    sp_grammar_release(g);
    /* positive(): x > 0; just past the bound needs a digit that is not 0 */
    g = kw_ok("{\"type\": \"number\", \"exclusiveMinimum\": 0}");
    Y(g, "0.1");
    Y(g, "0.05");
    Y(g, "12.5");
    N(g, "0.0");
    N(g, "0");
    N(g, "-0.5");
    sp_grammar_release(g);
    /* integral bounds: plain integers and fractions inside, the top exactly */
    g = kw_ok("{\"type\": \"number\", \"minimum\": 0, \"maximum\": 100}");
    Y(g, "0");
    Y(g, "57");
    Y(g, "99.999");
    Y(g, "100");
    N(g, "100.5");
    N(g, "-0.5");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"number\", \"maximum\": -0.5}");
    Y(g, "-0.5");
    Y(g, "-7.25");
    N(g, "-0.4");
    N(g, "0");
    sp_grammar_release(g);
}

TEST(schema_kw_multiple_of)
{
    sp_grammar_t *g = kw_ok("{\"type\": \"integer\", \"multipleOf\": 7}");
    for (int i = -100; i <= 300; i++) {
        char t[16];
        snprintf(t, sizeof t, "%d", i);
        if (sp_gmatch_match(g, t, strlen(t)) != (i % 7 == 0)) {
            SP_TEST_FAIL("multipleOf 7: %d", i);
        }
    }
    sp_grammar_release(g);
    /* zod's int().multipleOf(5): safe range bounds */
    g = kw_ok("{\"type\": \"integer\", \"minimum\": -9007199254740991, \"maximum\": "
              "9007199254740991, \"multipleOf\": 5}");
    Y(g, "0");
    Y(g, "-35");
    Y(g, "123456789012345");
    N(g, "123456789012346");
    sp_grammar_release(g);
    /* a small range: the multiples listed */
    g = kw_ok("{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 1000, \"multipleOf\": 250}");
    Y(g, "250");
    Y(g, "1000");
    N(g, "0");
    N(g, "10");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"number\", \"multipleOf\": 0.01, \"minimum\": 0, \"maximum\": 5}");
    Y(g, "4.99");
    Y(g, "0.10");
    Y(g, "5.00");
    N(g, "4.995");
    N(g, "5.01");
    sp_grammar_release(g);
    sp_status_t st;
    const char *e = kw_err("{\"type\": \"number\", \"multipleOf\": 0.3}", &st);
    ASSERT(strstr(e, "multipleOf") != NULL);
    e = kw_err("{\"type\": \"integer\", \"multipleOf\": 1000, \"minimum\": 5}", &st);
    ASSERT(strstr(e, "multipleOf") != NULL);
}

TEST(schema_kw_formats)
{
    sp_grammar_t *g = kw_ok("{\"type\": \"string\", \"format\": \"date\"}");
    Y(g, "\"2024-02-28\"");
    Y(g, "\"1999-12-31\"");
    N(g, "\"2024-02-30\"");
    N(g, "\"2024-04-31\"");
    N(g, "\"2024-13-01\"");
    N(g, "\"24-01-01\"");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"string\", \"format\": \"date-time\"}");
    Y(g, "\"2024-05-06T07:08:09Z\"");
    Y(g, "\"2024-05-06T23:59:59.123+05:30\"");
    N(g, "\"2024-05-06T24:00:00Z\"");
    N(g, "\"2024-05-06 07:08:09Z\"");
    N(g, "\"2024-05-06T07:08:09\"");
    sp_grammar_release(g);
    g = kw_ok("{\"format\": \"time\"}");
    Y(g, "\"07:08:09Z\"");
    N(g, "\"07:60:09Z\"");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"string\", \"format\": \"email\"}");
    Y(g, "\"a.b+c@example.co.uk\"");
    N(g, "\"a..b@example.com\"");
    N(g, "\"a@-x.com\"");
    N(g, "\"ab.com\"");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"string\", \"format\": \"uuid\"}");
    Y(g, "\"123e4567-e89b-42d3-a456-426614174000\"");
    N(g, "\"123e4567-e89b-42d3-a456-42661417400\"");
    N(g, "\"123e4567e89b42d3a456426614174000\"");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"string\", \"format\": \"ipv4\"}");
    Y(g, "\"192.168.0.255\"");
    N(g, "\"256.1.1.1\"");
    N(g, "\"01.1.1.1\"");
    N(g, "\"1.1.1\"");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"string\", \"format\": \"uri\"}");
    Y(g, "\"https://example.com/a/b?x=1&y=%20\"");
    Y(g, "\"ftp://h:21\"");
    N(g, "\"example.com\"");
    N(g, "\"https://ex ample.com\"");
    sp_grammar_release(g);
    sp_status_t st;
    const char *e = kw_err("{\"type\": \"string\", \"format\": \"date\", \"maxLength\": 3}", &st);
    ASSERT(strstr(e, "beside format 'date'") != NULL);
    /* lengths the format already keeps are fine */
    g = kw_ok("{\"type\": \"string\", \"format\": \"uuid\", \"minLength\": 36, \"maxLength\": 40}");
    sp_grammar_release(g);
}

TEST(schema_kw_patterns)
{
    sp_grammar_t *g = kw_ok("{\"type\": \"string\", \"pattern\": \"^[a-z]+\\\\d{2}$\"}");
    Y(g, "\"abc12\"");
    N(g, "\"abc1\"");
    N(g, "\"Abc12\"");
    N(g, "\"abc123\"");
    sp_grammar_release(g);
    /* unanchored: anything around the match, as JSON Schema's search semantics */
    g = kw_ok("{\"type\": \"string\", \"pattern\": \"ab|cd$\"}");
    Y(g, "\"xxabyy\"");
    Y(g, "\"xxcd\"");
    N(g, "\"xxcdy\"");
    N(g, "\"xyz\"");
    sp_grammar_release(g);
    /* characters the JSON text must escape are written escaped */
    g = kw_ok("{\"type\": \"string\", \"pattern\": \"^a\\\"b\\\\\\\\c\\\\n(?:x|y)?[^a-z]$\"}");
    Y(g, "\"a\\\"b\\\\c\\nxZ\"");
    Y(g, "\"a\\\"b\\\\c\\n\\\"\"");
    N(g, "\"a\"b\\\\c\\nxZ\"");
    N(g, "\"a\\\"b\\\\c\\nxz\"");
    sp_grammar_release(g);
    /* maxLength beside a pattern: unbounded repetitions capped so every match fits */
    g = kw_ok("{\"type\": \"string\", \"pattern\": \"^a+b*$\", \"maxLength\": 5}");
    Y(g, "\"aab\"");
    Y(g, "\"a\"");
    N(g, "\"aaaaaa\"");
    N(g, "\"aaabbb\"");
    sp_grammar_release(g);
    sp_status_t st;
    const char *e = kw_err("{\"type\": \"string\", \"pattern\": \"^abc+$\", \"maxLength\": 2}", &st);
    ASSERT(strstr(e, "maxLength") != NULL);
    e = kw_err("{\"type\": \"string\", \"pattern\": \"^a+$\", \"minLength\": 2}", &st);
    ASSERT(strstr(e, "minLength") != NULL);
    g = kw_ok("{\"type\": \"string\", \"pattern\": \"^a{2,}$\", \"minLength\": 2, \"maxLength\": 3}");
    Y(g, "\"aaa\"");
    N(g, "\"aaaa\"");
    sp_grammar_release(g);
    /* zod's email pattern compiles, also under zod's .max(254) */
    g = kw_ok("{\"type\": \"string\", \"format\": \"email\", \"pattern\": "
              "\"^(?:[A-Za-z0-9_'+\\\\-]+\\\\.)*[A-Za-z0-9_'+\\\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\\\-]*\\\\.)+[A-Za-z]{2,}$\"}");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"string\", \"maxLength\": 254, \"format\": \"email\", \"pattern\": "
              "\"^(?:[A-Za-z0-9_'+\\\\-]+\\\\.)*[A-Za-z0-9_'+\\\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\\\-]*\\\\.)+[A-Za-z]{2,}$\"}");
    Y(g, "\"a.b@c.de\"");
    sp_grammar_release(g);
}

TEST(schema_kw_patterns_refused)
{
    static const struct {
        const char *pattern, *needle;
    } bad[] = {
        {"^(?=a)a$", "lookahead"},     {"^(?<=a)b$", "lookbehind"}, {"\\\\bword", "word boundary"},
        {"^(a)\\\\1$", "backreference"}, {"\\\\p{L}", "Unicode property"}, {"(?i)a", "inline flags"},
        {"a^b", "'^'"},                {"a$b", "'$'"},              {"a**", "quantifier after"},
        {"(ab", "missing ')'"},        {"ab)", "unmatched ')'"},    {"[a-", "unterminated"},
        {"a{5000}", "4096"},           {"[z-a]", "backwards"},      {"*a", "nothing to repeat"},
        {"a[]b", "matches no character"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char js[256];
        snprintf(js, sizeof js, "{\"type\": \"string\", \"pattern\": \"%s\"}", bad[i].pattern);
        sp_status_t st;
        const char *e = kw_err(js, &st);
        if (strstr(e, bad[i].needle) == NULL || strstr(e, "pattern") == NULL) {
            SP_TEST_FAIL("%s: %s", bad[i].pattern, e);
        }
    }
    /* the raw-text form (vLLM's guided_regex): whole-text match, nothing escaped */
    sp_status_t st;
    char err[128];
    char *t = sp_regex_gbnf("[0-9]{3}-\"x\"", 12, 0, &st, err, sizeof err);
    ASSERT(t != NULL);
    char *src = sp_malloc(strlen(t) + 16);
    sprintf(src, "root ::= %s\n", t);
    sp_grammar_t *g = NULL;
    ASSERT_OK(sp_grammar_compile(src, strlen(src), &g, err, sizeof err));
    Y(g, "123-\"x\"");
    N(g, "a123-\"x\"");
    sp_grammar_release(g);
    sp_free(src);
    sp_free(t);
    /* "[^]" is any character, as in JavaScript */
    t = sp_regex_gbnf("a[^]", 4, 0, &st, err, sizeof err);
    ASSERT(t != NULL);
    src = sp_malloc(strlen(t) + 16);
    sprintf(src, "root ::= %s\n", t);
    ASSERT_OK(sp_grammar_compile(src, strlen(src), &g, err, sizeof err));
    Y(g, "a]");
    Y(g, "a\xc3\xa9");
    N(g, "a");
    sp_grammar_release(g);
    sp_free(src);
    sp_free(t);
}

TEST(schema_kw_unique_allof)
{
    sp_grammar_t *g = kw_ok("{\"type\": \"array\", \"uniqueItems\": true, \"items\": "
                            "{\"type\": \"string\", \"enum\": [\"a\", \"b\", \"c\"]}}");
    Y(g, "[]");
    Y(g, "[\"a\",\"c\"]");
    Y(g, "[\"a\",\"b\",\"c\"]");
    N(g, "[\"a\",\"a\"]");
    N(g, "[\"b\",\"b\"]");
    sp_grammar_release(g);
    g = kw_ok("{\"type\": \"array\", \"uniqueItems\": true, \"minItems\": 1, \"items\": "
              "{\"type\": \"boolean\"}}");
    Y(g, "[true]");
    Y(g, "[false,true]");
    N(g, "[]");
    N(g, "[true,true]");
    sp_grammar_release(g);
    sp_status_t st;
    const char *e = kw_err("{\"type\": \"array\", \"uniqueItems\": true, \"items\": "
                           "{\"type\": \"string\"}}", &st);
    ASSERT(strstr(e, "uniqueItems") != NULL);
    /* allOf: objects merged (properties united, required joined) */
    g = kw_ok("{\"allOf\": [{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}},"
              " \"required\": [\"a\"]}, {\"$ref\": \"#/$defs/b\"}], \"$defs\": {\"b\": {\"type\": "
              "\"object\", \"properties\": {\"b\": {\"type\": \"boolean\"}}, \"required\": [\"b\"]}}}");
    Y(g, "{\"a\":1,\"b\":true}");
    N(g, "{\"a\":1}");
    N(g, "{\"b\":true}");
    sp_grammar_release(g);
    e = kw_err("{\"allOf\": [{\"type\": \"object\", \"properties\": {\"a\": {}}, "
               "\"additionalProperties\": false}, {\"properties\": {\"b\": {}}}]}", &st);
    ASSERT(strstr(e, "forbids property 'b'") != NULL);
}

TEST(schema_kw_bombs_refused_fast)
{
    int64_t t0 = sp_time_ns();
    sp_status_t st;
    /* nested repetitions (a shortest sentence of 4096^4 bytes): refused by the grammar
     * compiler, quickly */
    const char *e = kw_err("{\"type\": \"string\", \"pattern\": \"^((((a{4096}){4096}){4096}){4096})$\"}",
                           &st);
    ASSERT(strstr(e, "grammar") != NULL);
    /* deep groups */
    char pat[512] = {0};
    for (int i = 0; i < 40; i++) {
        strcat(pat, "(");
    }
    strcat(pat, "a");
    for (int i = 0; i < 40; i++) {
        strcat(pat, ")");
    }
    char js[700];
    snprintf(js, sizeof js, "{\"pattern\": \"%s\"}", pat);
    e = kw_err(js, &st);
    ASSERT(st == SP_ERR_TOO_LARGE && strstr(e, "nested") != NULL);
    /* many wide numeric ranges: the schema's grammar size cap */
    size_t cap = 1 << 22, k = 0;
    char *s = sp_malloc(cap);
    ASSERT(s != NULL);
    k += (size_t)sprintf(s + k, "{\"type\": \"object\", \"properties\": {");
    for (int i = 0; i < 3000; i++) {
        k += (size_t)sprintf(s + k, "%s\"p%d\": {\"type\": \"number\", \"minimum\": -%d.123457, "
                             "\"maximum\": 98765432%d.654321}", i ? ", " : "", i, i + 1, i);
    }
    k += (size_t)sprintf(s + k, "}}");
    e = kw_err(s, &st);
    if (st != SP_ERR_TOO_LARGE) {
        SP_TEST_FAIL("%d: %s", st, e);
    }
    sp_free(s);
    ASSERT((sp_time_ns() - t0) / 1000000 < 3000);
}

/* Random patterns over the regex syntax's characters: each is refused with a message or becomes
 * GBNF that the grammar compiler accepts (never invalid GBNF, never a crash), in both modes. */
TEST(schema_kw_regex_random_patterns_compile_or_refuse)
{
    static const char alpha[] = "ab()[]{}|*+?^$\\-.,0123dwsSbpu:=!<>\"/\x01 \xc3\xa9";
    uint64_t r = 0x9E3779B97F4A7C15ull;
    int compiled = 0;
    for (int iter = 0; iter < 3000; iter++) {
        char pat[40];
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int len = (int)(r >> 59) + 1;
        for (int i = 0; i < len; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            pat[i] = alpha[(r >> 33) % (sizeof alpha - 1)];
        }
        pat[len] = '\0';
        for (unsigned flags = 0; flags < 4; flags++) {
            sp_status_t st;
            char err[256];
            err[0] = '\0';
            char *t = sp_regex_gbnf(pat, (size_t)len, flags, &st, err, sizeof err);
            if (t == NULL) {
                if (st == SP_OK || err[0] == '\0') {
                    SP_TEST_FAIL("refused without a message: %s", pat);
                }
                continue;
            }
            char *src = sp_malloc(strlen(t) + 16);
            sprintf(src, "root ::= %s\n", t);
            sp_grammar_t *g = NULL;
            if (sp_grammar_compile(src, strlen(src), &g, err, sizeof err) != SP_OK &&
                strstr(err, "never end") == NULL) {
                SP_TEST_FAIL("pattern %s gave GBNF that does not compile: %s\n%s", pat, err, src);
            }
            compiled += g != NULL;
            sp_grammar_release(g);
            sp_free(src);
            sp_free(t);
        }
    }
    ASSERT(compiled > 1000); /* the walk reaches the translator's valid paths too */
}
