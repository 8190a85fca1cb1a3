/* test_grammar.c - GBNF parsing, acceptance, limits (constrain/grammar.h). */
#include <time.h>

#include "core/alloc.h"
#include "constrain/grammar.h"
#include "test.h"

static sp_grammar_t *
compile_ok(const char *src)
{
    sp_grammar_t *g = NULL;
    char err[256] = "";
    sp_status_t st = sp_grammar_compile(src, strlen(src), &g, err, sizeof err);
    if (st != SP_OK) {
        SP_TEST_FAIL("compile failed: %s\n  grammar: %s", err, src);
    }
    return g;
}

/* The error text of a grammar that must not compile. */
static const char *
compile_err(const char *src, size_t len, sp_status_t want)
{
    static char err[256];
    sp_grammar_t *g = NULL;
    err[0] = '\0';
    sp_status_t st = sp_grammar_compile(src, len, &g, err, sizeof err);
    if (st == SP_OK) {
        sp_grammar_release(g);
        SP_TEST_FAIL("compiled, expected an error: %s", src);
    }
    ASSERT_EQ(st, want);
    ASSERT(g == NULL);
    ASSERT(err[0] != '\0');
    return err;
}

static int
match(const sp_grammar_t *g, const char *s)
{
    return sp_gmatch_match(g, s, strlen(s));
}

#define ACCEPT(g, s) do { if (match(g, s) != 1) SP_TEST_FAIL("should accept: \"%s\"", s); } while (0)
#define REJECT(g, s) do { if (match(g, s) != 0) SP_TEST_FAIL("should reject: \"%s\"", s); } while (0)

TEST(grammar_literals_and_alternation)
{
    sp_grammar_t *g = compile_ok("root ::= \"yes\" | \"no\" | \"maybe\" \"!\"\n");
    ACCEPT(g, "yes");
    ACCEPT(g, "no");
    ACCEPT(g, "maybe!");
    REJECT(g, "maybe");
    REJECT(g, "yesno");
    REJECT(g, "");
    sp_grammar_release(g);
}

TEST(grammar_repetitions)
{
    sp_grammar_t *g = compile_ok("root ::= \"a\"* \"b\"+ \"c\"? d{2,3} e{2} f{1,}\n"
                                 "d ::= \"d\"\ne ::= \"e\"\nf ::= \"f\"\n");
    ACCEPT(g, "bddeef");
    ACCEPT(g, "aaabbbcdddeefff");
    REJECT(g, "ddeef");    /* b+ needs one */
    REJECT(g, "bdeef");    /* d{2,3} */
    REJECT(g, "bddddeef"); /* d{2,3} */
    REJECT(g, "bddeeef");  /* e{2} */
    REJECT(g, "bddee");    /* f{1,} */
    REJECT(g, "bccddeef");
    sp_grammar_release(g);
    /* A repeated group, and {0} */
    g = compile_ok("root ::= (\"ab\" | \"c\"){2,4} \"x\"{0}");
    ACCEPT(g, "abc");
    ACCEPT(g, "cccc");
    REJECT(g, "c");
    REJECT(g, "ccccc");
    REJECT(g, "abx");
    sp_grammar_release(g);
}

TEST(grammar_classes_utf8)
{
    sp_grammar_t *g = compile_ok("root ::= [a-z0-9_]+ [^a-z]\n");
    ACCEPT(g, "abc_9X");
    ACCEPT(g, "a\xc3\xa9");         /* é is not a-z */
    ACCEPT(g, "a\xf0\x9f\x98\x80"); /* an emoji */
    REJECT(g, "abc");
    REJECT(g, "ab");
    REJECT(g, "A!");
    REJECT(g, "a\xc3");             /* half a character */
    REJECT(g, "a\xed\xa0\x80");     /* a surrogate is not UTF-8 */
    REJECT(g, "a\xc0\x80");         /* overlong */
    sp_grammar_release(g);
    /* Ranges over multi-byte code points; escapes. */
    g = compile_ok("root ::= [\\u00e0-\\u00ff\\u4e00-\\u9fff]+ \"\\x21\" [\\n\\t\\]\\-]\n");
    ACCEPT(g, "\xc3\xa9\xe4\xb8\xad!\n");
    ACCEPT(g, "\xc3\xa0!-");
    ACCEPT(g, "\xc3\xbf!]");
    REJECT(g, "\xc3\x9f!\n"); /* U+00DF is below the range */
    REJECT(g, "e!\t");
    sp_grammar_release(g);
    g = compile_ok("root ::= . .\n");
    ACCEPT(g, "ab");
    ACCEPT(g, "\xe2\x82\xac\n");
    REJECT(g, "a");
    REJECT(g, "abc");
    sp_grammar_release(g);
}

TEST(grammar_multiline_comments_and_recursion)
{
    const char *src =
        "# a tiny JSON\n"
        "root   ::= value\n"
        "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
        "object ::= \"{\" ws ( string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)* )? \"}\"\n"
        "array  ::= \"[\" ws (\n"
        "             value ws (\",\" ws value ws)*\n"
        "           )? \"]\"\n"
        "string ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [\"\\\\/bfnrt] )* \"\\\"\"   # escapes\n"
        "number ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\n"
        "ws     ::= [ \\t\\n]*\n";
    sp_grammar_t *g = compile_ok(src);
    ACCEPT(g, "{}");
    ACCEPT(g, "{\"a\": [1, 2.5, -3, \"x\\\"y\"], \"b\": {\"c\": null}}");
    ACCEPT(g, "[[[[]]]]");
    REJECT(g, "{\"a\" 1}");
    REJECT(g, "[1,]");
    REJECT(g, "{\"a\": tru}");
    sp_grammar_release(g);
    /* '|' at the start of a continuation line */
    g = compile_ok("root ::= \"a\"\n  | \"b\"\n");
    ACCEPT(g, "b");
    sp_grammar_release(g);
}

TEST(grammar_deep_nesting_no_stack_overflow)
{
    sp_grammar_t *g = compile_ok("root ::= \"(\" root \")\" | \"x\"\n");
    size_t depth = 200000;
    char *s = sp_malloc(2 * depth + 2);
    ASSERT(s != NULL);
    memset(s, '(', depth);
    s[depth] = 'x';
    memset(s + depth + 1, ')', depth);
    s[2 * depth + 1] = '\0';
    ASSERT_EQ(sp_gmatch_match(g, s, 2 * depth + 1), 1);
    ASSERT_EQ(sp_gmatch_match(g, s, 2 * depth), 0); /* one ')' short */
    sp_free(s);
    sp_grammar_release(g);
}

TEST(grammar_errors)
{
    const char *e;
    e = compile_err("root ::= \"a\n", 11, SP_ERR_INVALID);
    ASSERT(strstr(e, "line 1") != NULL && strstr(e, "unterminated") != NULL);
    e = compile_err("root ::= foo\n", 13, SP_ERR_INVALID);
    ASSERT(strstr(e, "'foo'") != NULL && strstr(e, "not defined") != NULL);
    e = compile_err("foo ::= \"a\"\n", 12, SP_ERR_INVALID);
    ASSERT(strstr(e, "root") != NULL);
    e = compile_err("root ::= root \"a\" | \"b\"\n", 24, SP_ERR_INVALID);
    ASSERT(strstr(e, "left-recursive") != NULL);
    e = compile_err("root ::= x \"a\" | \"c\"\nx ::= \"b\"? root\n", 37, SP_ERR_INVALID);
    ASSERT(strstr(e, "left-recursive") != NULL);
    e = compile_err("root ::= \"a\" root\n", 18, SP_ERR_INVALID);
    ASSERT(strstr(e, "never end") != NULL);
    e = compile_err("root ::= [z-a]\n", 15, SP_ERR_INVALID);
    ASSERT(strstr(e, "backwards") != NULL);
    e = compile_err("root ::= \"a\"{5,2}\n", 18, SP_ERR_INVALID);
    e = compile_err("root ::= \"a\"{99999}\n", 20, SP_ERR_INVALID);
    ASSERT(strstr(e, "4096") != NULL);
    e = compile_err("root ::= \"a\"\nroot ::= \"b\"\n", 26, SP_ERR_INVALID);
    ASSERT(strstr(e, "twice") != NULL);
    e = compile_err("root ::= \"\\q\"\n", 14, SP_ERR_INVALID);
    e = compile_err("root ::= * \"a\"\n", 15, SP_ERR_INVALID);
    e = compile_err("root ::= (\"a\"\n", 14, SP_ERR_INVALID);
    e = compile_err("root = \"a\"\n", 11, SP_ERR_INVALID);
    ASSERT(strstr(e, "::=") != NULL);
    e = compile_err("root ::= \"\xff\"\n", 13, SP_ERR_INVALID);
    ASSERT(strstr(e, "UTF-8") != NULL);
    e = compile_err("root ::= \"a\"\0", 13, SP_ERR_INVALID);
    /* (x*)* : a repetition of something empty is left recursion */
    e = compile_err("root ::= (\"a\"*)*\n", 17, SP_ERR_INVALID);
}

TEST(grammar_hostile_bounded)
{
    /* Parentheses nested past the limit: an error, not a deep C recursion. */
    size_t n = 100000;
    char *s = sp_malloc(2 * n + 32);
    ASSERT(s != NULL);
    size_t k = (size_t)sprintf(s, "root ::= ");
    memset(s + k, '(', n);
    k += n;
    s[k++] = '"', s[k++] = 'a', s[k++] = '"';
    memset(s + k, ')', n);
    k += n;
    const char *e = compile_err(s, k, SP_ERR_INVALID);
    ASSERT(strstr(e, "deeper than 64") != NULL);
    sp_free(s);
    /* Nested repetitions that multiply: bounded by the element cap, fast. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const char *big = "root ::= ((((\"a\"{4096}){4096}){4096}){4096})\n";
    sp_grammar_t *g = NULL;
    char err[256];
    sp_status_t st = sp_grammar_compile(big, strlen(big), &g, err, sizeof err);
    sp_grammar_release(g);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    (void)st; /* compiles (each level copies one REF) or hits a limit; either is fine */
    ASSERT(ms < 2000);
    /* Many rules: the element and rule caps answer TOO_LARGE. */
    size_t cap = 6u << 20;
    char *many = sp_malloc(cap);
    ASSERT(many != NULL);
    k = (size_t)sprintf(many, "root ::= r0\n");
    for (int i = 0; i < 40000 && k + 64 < SP_GRAMMAR_MAX_SOURCE; i++) {
        k += (size_t)sprintf(many + k, "r%d ::= \"x\" r%d | \"y\"\n", i, i + 1);
    }
    k += (size_t)sprintf(many + k, "r40000 ::= \"z\"\n");
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g = NULL;
    st = sp_grammar_compile(many, k, &g, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    ASSERT(st != SP_OK);
    ASSERT(ms < 2000);
    sp_grammar_release(g);
    sp_free(many);
    /* An ambiguous grammar: stacks dedupe, the state count stays bounded. */
    g = compile_ok("root ::= (\"a\" | \"a\" | [a-z] | x)*\nx ::= \"a\" | \"aa\"\n");
    char as[4001];
    memset(as, 'a', 4000);
    as[4000] = '\0';
    ASSERT_EQ(match(g, as), 1);
    sp_grammar_release(g);
}

TEST(grammar_matcher_states_and_cost)
{
    sp_grammar_t *g = compile_ok("root ::= \"{\" [0-9]+ \"}\"\n");
    sp_gmatch_t *m;
    char err[128];
    ASSERT_OK(sp_gmatch_create(g, &m, err, sizeof err));
    sp_gstate_t s0 = sp_gmatch_state(m);
    ASSERT_EQ(sp_gmatch_cost(m, s0), 3);
    ASSERT(!sp_gmatch_accepting(m, s0));
    ASSERT_EQ(sp_gmatch_feed(m, s0, 'x'), SP_GSTATE_DEAD);
    sp_gstate_t s1 = sp_gmatch_feed(m, s0, '{');
    ASSERT(s1 != SP_GSTATE_DEAD);
    ASSERT_EQ(sp_gmatch_cost(m, s1), 2);
    sp_gstate_t s2 = sp_gmatch_feed(m, s1, '7');
    ASSERT_EQ(sp_gmatch_cost(m, s2), 1);
    /* Inside the digit loop the state repeats: the cache makes it a look-up. */
    ASSERT_EQ(sp_gmatch_feed(m, s2, '8'), s2);
    ASSERT_EQ(sp_gmatch_feed(m, s1, '7'), s2);
    sp_gstate_t s3 = sp_gmatch_feed(m, s2, '}');
    ASSERT(sp_gmatch_accepting(m, s3));
    ASSERT(!sp_gmatch_can_continue(m, s3));
    ASSERT_EQ(sp_gmatch_cost(m, s3), 0);
    ASSERT(sp_gmatch_commit(m, "{12", 3));
    ASSERT(!sp_gmatch_commit(m, "x", 1));
    ASSERT(sp_gmatch_commit(m, "}", 1));
    ASSERT(sp_gmatch_accepting(m, sp_gmatch_state(m)));
    sp_gmatch_destroy(m);
    sp_grammar_release(g); /* the matcher held its own reference */
}

TEST(grammar_matcher_maintain_keeps_state)
{
    sp_grammar_t *g = compile_ok("root ::= (\"[\" root \"]\")* \"x\"\n");
    sp_gmatch_t *m;
    ASSERT_OK(sp_gmatch_create(g, &m, NULL, 0));
    for (int i = 0; i < 100000; i++) {
        ASSERT(sp_gmatch_commit(m, "[", 1));
        sp_gmatch_maintain(m);
    }
    ASSERT(sp_gmatch_commit(m, "x", 1));
    for (int i = 0; i < 100000; i++) {
        ASSERT(sp_gmatch_commit(m, "]x", 2));
        if (i % 1000 == 0) {
            sp_gmatch_maintain(m);
        }
    }
    ASSERT(sp_gmatch_accepting(m, sp_gmatch_state(m)));
    ASSERT(sp_gmatch_bytes(m) < (64u << 20));
    sp_gmatch_destroy(m);
    sp_grammar_release(g);
}
