/*
 * test_jinja.c - the sandboxed template engine: syntax, whitespace control,
 * Python-like values, filters, tests, methods, and the limits that make a
 * hostile template fail fast (RELIABILITY.md G19).
 *
 * Expected strings are written by hand from Jinja's documented semantics
 * (transformers' settings: trim_blocks, lstrip_blocks, loop controls).
 */
#include <pthread.h>
#include <time.h>

#include "core/alloc.h"
#include "chat/jinja.h"
#include "test.h"

static char g_err[512];

/* Render; returns an sp_malloc'd string, or NULL with the status in *st. */
static char *
render_st(const char *tmpl, const char *ctx, const sp_jinja_opts_t *o, sp_status_t *st)
{
    sp_jinja_t *t = NULL;
    char *out = NULL;
    size_t n = 0;
    g_err[0] = '\0';
    *st = sp_jinja_compile(tmpl, strlen(tmpl), &t, g_err, sizeof g_err);
    if (*st != SP_OK) {
        return NULL;
    }
    *st = sp_jinja_render_json(t, ctx, ctx != NULL ? strlen(ctx) : 0, o, &out, &n, g_err,
                               sizeof g_err);
    sp_jinja_destroy(t);
    if (*st == SP_OK && strlen(out) != n) {
        SP_TEST_FAIL("length mismatch for %s", tmpl);
    }
    return out;
}

static void
expect(const char *tmpl, const char *ctx, const char *want, int line)
{
    sp_status_t st;
    char *out = render_st(tmpl, ctx, NULL, &st);
    if (out == NULL) {
        SP_TEST_FAIL("line %d: %s: status %d: %s", line, tmpl, (int)st, g_err);
    }
    if (strcmp(out, want) != 0) {
        fprintf(stderr, "  line %d: template %s\n  got  [%s]\n  want [%s]\n", line, tmpl, out,
                want);
        exit(1);
    }
    sp_free(out);
}

/* The status, and that err mentions `needle`. */
static void
expect_fail(const char *tmpl, const char *ctx, const sp_jinja_opts_t *o, sp_status_t want,
            const char *needle, int line)
{
    sp_status_t st;
    char *out = render_st(tmpl, ctx, o, &st);
    if (out != NULL) {
        SP_TEST_FAIL("line %d: %.80s: expected an error, got [%.80s]", line, tmpl, out);
    }
    if (st != want) {
        SP_TEST_FAIL("line %d: %.80s: status %d, want %d (%s)", line, tmpl, (int)st, (int)want,
                     g_err);
    }
    if (needle != NULL && strstr(g_err, needle) == NULL) {
        SP_TEST_FAIL("line %d: error [%s] lacks [%s]", line, g_err, needle);
    }
}

#define EXPECT(t, c, w) expect((t), (c), (w), __LINE__)
#define EXPECT_FAIL(t, c, st, needle) expect_fail((t), (c), NULL, (st), (needle), __LINE__)

TEST(jinja_text_and_output)
{
    EXPECT("plain text", NULL, "plain text");
    EXPECT("a{{ x }}b", "{\"x\": \"X\"}", "aXb");
    EXPECT("[{{ missing }}]", NULL, "[]");
    EXPECT("{{ none }} {{ true }} {{ false }} {{ None }} {{ True }}", NULL,
           "None True False None True");
    EXPECT("a{# a comment #}b", NULL, "ab");
    EXPECT("{{ 'a\\nb\\t\"c\"' }}|{{ \"it's\" }}|{{ '\\u00e9\\x41' }}", NULL,
           "a\nb\t\"c\"|it's|\xc3\xa9" "A");
    EXPECT("{{ 'a' 'b' }}", NULL, "ab");
    EXPECT("{% raw %}{{ x }}{% endraw %}!", NULL, "{{ x }}!");
}

TEST(jinja_whitespace_control)
{
    /* trim_blocks: the newline after a block tag goes. */
    EXPECT("{% if true %}\nx\n{% endif %}\ny", NULL, "x\ny");
    /* lstrip_blocks: blanks before a block tag at the start of a line go. */
    EXPECT("a\n    {% if true %}\n    b\n    {% endif %}\nc", NULL, "a\n    b\nc");
    EXPECT("a\n  {# c #}\nb", NULL, "a\nb");
    /* '-' strips all whitespace on that side, newlines included. */
    EXPECT("a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %}", NULL, "abcd");
    EXPECT("x\n\n{{- 'y' }}", NULL, "xy");
    /* Output tags keep the newline after them. */
    EXPECT("{{ 'a' }}\n{{ 'b' }}\n", NULL, "a\nb");
    /* One trailing newline of the source is dropped, not two. */
    EXPECT("x\n\n", NULL, "x\n");
    /* '+' keeps the blanks and the newline. */
    EXPECT("a\n  {%+ if true %}x{% endif +%}\ny", NULL, "a\n  x\ny");
    /* lstrip only applies at the start of a line. */
    EXPECT("{{ 1 }}  {% if true %}x{% endif %}", NULL, "1  x");
    EXPECT("a\r\nb", NULL, "a\nb");
}

TEST(jinja_numbers_and_operators)
{
    EXPECT("{{ 1 + 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ -7 // 2 }} {{ 2 * 3 - 1 }}", NULL,
           "3 3 1 2 -4 5");
    EXPECT("{{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 1 }} {{ -4 }}", NULL,
           "3.5 2.0 1024 2.5 -4");
    EXPECT("{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 123456789.0 }} {{ 1e16 }} {{ 1e15 }}", NULL,
           "0.30000000000000004 1e+20 1e-05 123456789.0 1e+16 1000000000000000.0");
    EXPECT("{{ 1/3 }} {{ 2.5e-7 }} {{ -0.0 }}", NULL, "0.3333333333333333 2.5e-07 -0.0");
    EXPECT("{{ 'n=' ~ 3 ~ true ~ none ~ [1, 'a'] }}", NULL, "n=3TrueNone[1, 'a']");
    EXPECT("{{ 'ab' * 3 }}{{ [1] * 2 }}{{ [1] + [2] }}", NULL, "ababab[1, 1][1, 2]");
    EXPECT("{{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' == 'a' }}{{ 'a' != 'a' }}{{ 3 > 2 }}{{ 1 >= 1 }}", NULL,
           "TrueFalseTrueFalseTrueTrue");
    EXPECT("{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}", NULL,
           "TrueFalseTrueTrueTrue");
    EXPECT("{{ true and false }}{{ true or false }}{{ not true }}{{ not (1 == 2) }}", NULL,
           "FalseTrueFalseTrue");
    /* and/or return the deciding operand, as in Python. */
    EXPECT("{{ 0 or 'x' }}{{ 'a' and 'b' }}{{ '' or none }}", NULL, "xbNone");
    EXPECT("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'q' not in d }}",
           "{\"d\": {\"k\": 1}}", "TrueTrueTrueTrue");
    EXPECT("{{ 'yes' if flag else 'no' }}[{{ 'a' if false }}]", "{\"flag\": true}", "yes[]");
    EXPECT("{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}{{ [1, [2]] == [1, [2]] }}", NULL,
           "TrueTrue");
}

TEST(jinja_precedence)
{
    /* Filters bind to the operand before them, tighter than + and -. */
    EXPECT("{{ 'a' + ' b ' | trim + 'c' }}", NULL, "abc");
    EXPECT("{{ xs | length - 1 }}", "{\"xs\": [1, 2, 3]}", "2");
    /* Tests bind tighter than not. */
    EXPECT("{{ not x is defined }}", NULL, "True");
    EXPECT("{{ -2 ** 2 }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }}", NULL, "4 14 20");
}

TEST(jinja_subscripts_and_slices)
{
    const char *ctx = "{\"xs\": [1, 2, 3, 4, 5], \"d\": {\"k\": \"v\"}}";
    EXPECT("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:2] }}{{ 'hello'[1:3] }}", ctx,
           "15[2, 3, 4, 5][1, 2]el");
    EXPECT("{{ d['k'] }}{{ d.k }}[{{ xs[10] }}][{{ d.nope }}]{{ xs.0 }}", ctx, "vv[][]1");
    EXPECT("{{ xs[::-1] }}{{ xs[::2] }}{{ xs[1::2] }}{{ xs[-1:0:-1] }}{{ xs[:-2:-1] }}", ctx,
           "[5, 4, 3, 2, 1][1, 3, 5][2, 4][5, 4, 3, 2][5]");
    EXPECT("{{ 'abc'[::-1] }}{{ xs[-100:100] | length }}{{ xs[3:1] }}", ctx, "cba5[]");
    /* Strings index by code point, not byte. */
    EXPECT("{{ 'h\xc3\xa9llo'[1:3] }}|{{ 'h\xc3\xa9llo'[::-2] }}|{{ 'h\xc3\xa9y' | length }}",
           NULL, "\xc3\xa9l|olh|3");
    EXPECT("{% for c in 'h\xc3\xa9y' %}{{ c }}.{% endfor %}", NULL, "h.\xc3\xa9.y.");
}

TEST(jinja_statements)
{
    EXPECT("{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many"
           "{% endif %},{% endfor %}",
           NULL, "one,two,many,");
    EXPECT("{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
           "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}",
           "{\"items\": [\"a\", \"b\"]}", "10TrueFalse221;21FalseTrue210;");
    EXPECT("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    EXPECT("{% for n in [1, 2, 3, 4] %}{% if n == 2 %}{% continue %}{% endif %}"
           "{% if n == 4 %}{% break %}{% endif %}{{ n }}{% endfor %}",
           NULL, "13");
    /* A set inside a loop stays in the loop; one inside an if does not. */
    EXPECT("{% set a = 1 %}{% for x in [1] %}{% set a = 2 %}{{ a }}{% endfor %}{{ a }}"
           "{% if true %}{% set b = 3 %}{% endif %}{{ b }}",
           NULL, "213");
    EXPECT("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}"
           "{% endfor %}",
           "{\"d\": {\"x\": 1, \"y\": \"z\"}}", "x=1;y=z;xy");
    EXPECT("{% for x in [1, 2, 3, 4] if x % 2 == 0 %}{{ loop.index }}:{{ x }}"
           "{% if not loop.last %},{% endif %}{% endfor %}",
           NULL, "1:2,2:4");
    EXPECT("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", NULL,
           "-2;1-3;2-;");
    EXPECT("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", NULL, "aba");
    EXPECT("{% set ns = namespace(total=0, seen=false) %}{% for x in [1, 2, 3] %}"
           "{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.seen = true %}{% endif %}"
           "{% endfor %}{{ ns.total }} {{ ns.seen }}",
           NULL, "6 True");
    EXPECT("{% set a, b = 1, 2 %}{{ b }}{{ a }}", NULL, "21");
    EXPECT("{% set x %}a{{ 1 }}b{% endset %}[{{ x }}]", NULL, "[a1b]");
    EXPECT("{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, 2) }}"
           "{{ f(b=3, a=4) }}",
           NULL, "[1B][12][43]");
    EXPECT("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}"
           "{% endmacro %}{{ fact(4) }}",
           NULL, "4*3*2*1");
    EXPECT("{% if a %}A{% elif b %}B{% elif c %}C{% endif %}", "{\"c\": 1}", "C");
    EXPECT("{% generation %}x{% endgeneration %}", NULL, "x");
}

TEST(jinja_filters)
{
    const char *ctx = "{\"xs\": [1, 2, 3]}";
    EXPECT("{{ '  x  ' | trim }}|{{ xs | length }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}", ctx,
           "x|3|ABab");
    EXPECT("{{ xs | join('-') }}|{{ xs | first }}{{ xs | last }}|{{ missing | default('d') }}",
           ctx, "1-2-3|13|d");
    EXPECT("{{ 5 | string }}|{{ '' | default('e', true) }}|{{ '' | default('e') }}|", NULL,
           "5|e||");
    EXPECT("{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}", NULL, "Hello World|Hello");
    EXPECT("{{ [3, 1, 2] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}{{ [3, 1, 2] | max }}"
           "{{ [3, 1, 2] | min }}",
           NULL, "[1, 2, 3][3, 2, 1]31");
    EXPECT("{{ [1, 2, 2, 1] | unique | list }}{{ [1, 2] | sum }}{{ -3 | abs }}", NULL,
           "[1, 2]33");
    EXPECT("{{ '42' | int + 1 }} {{ '4.5' | float }} {{ 'x' | int }} {{ 2.567 | round(2) }}", NULL,
           "43 4.5 0 2.57");
    EXPECT("{{ 'a<b>&\"' | e }}|{{ [1, 2, 3] | reverse | list }}|{{ 'one two  three' | wordcount }}",
           NULL, "a&lt;b&gt;&amp;&#34;|[3, 2, 1]|3");
    EXPECT("{{ 'aXbX' | replace('X', '-') }}{{ 'aXbX' | replace('X', '-', 1) }}", NULL,
           "a-b-a-bX");
    EXPECT("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}", NULL,
           "a\n  b\n\n  c|  a\n  b");
    EXPECT("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}{{ d | dictsort | first | first }}",
           "{\"d\": {\"b\": 1, \"a\": 2}}", "b1a2a");
    const char *msgs = "{\"m\": [{\"role\": \"user\", \"content\": \"u1\"}, "
                       "{\"role\": \"assistant\", \"content\": \"a1\"}, "
                       "{\"role\": \"user\", \"content\": \"u2\", \"on\": true}]}";
    EXPECT("{{ m | selectattr('role', 'equalto', 'user') | list | length }} "
           "{{ (m | selectattr('role', 'equalto', 'user') | list)[-1].content }} "
           "{% for x in m | rejectattr('role', 'equalto', 'user') %}{{ x.content }}{% endfor %}",
           msgs, "2 u2 a1");
    EXPECT("{% for x in m | selectattr('on') %}{{ x.content }}{% endfor %}"
           "{% for x in m | selectattr('on', 'undefined') %}{{ x.content }}{% endfor %}",
           msgs, "u2u1a1");
    EXPECT("{{ m | map(attribute='role') | join(',') }} {{ ['a', 'b'] | map('upper') | list }}",
           msgs, "user,assistant,user ['A', 'B']");
    EXPECT("{{ [1, 2, 3, 4] | select('odd') | list }}{{ [1, 2, 3, 4] | reject('odd') | list }}",
           NULL, "[1, 3][2, 4]");
}

TEST(jinja_tojson_and_repr)
{
    EXPECT("{{ {'a': [1, 'x', none, true, 1.5]} | tojson }}", NULL,
           "{\"a\": [1, \"x\", null, true, 1.5]}");
    /* No HTML escaping, no \u escapes for non-ASCII (ensure_ascii off). */
    EXPECT("{{ 'h\xc3\xa9\"<\\n' | tojson }}{{ [] | tojson }}{{ {} | tojson }}", NULL,
           "\"h\xc3\xa9\\\"<\\n\"[]{}");
    EXPECT("{{ {'b': [1, {'c': 'x'}], 'a': {}} | tojson(indent=2) }}", NULL,
           "{\n  \"b\": [\n    1,\n    {\n      \"c\": \"x\"\n    }\n  ],\n  \"a\": {}\n}");
    EXPECT("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}", NULL, "{\"a\": 2, \"b\": 1}");
    EXPECT("{{ ['it\\'s', 'q\"', 'n\\n', 1.0, none] }}", NULL,
           "[\"it's\", 'q\"', 'n\\n', 1.0, None]");
    EXPECT("{{ {'a': 'b', 'c': true} }}", NULL, "{'a': 'b', 'c': True}");
    /* Context JSON: escapes and surrogate pairs decode to UTF-8. */
    EXPECT("{{ s }}", "{\"s\": \"a\\u00e9\\ud83d\\ude00\\n\"}", "a\xc3\xa9\xf0\x9f\x98\x80\n");
}

TEST(jinja_methods_and_functions)
{
    EXPECT("{{ ' x '.strip() }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('x') }}"
           "{{ 'ab'.upper() }}{{ \"they're\".title() }}",
           NULL, "xTrueFalseABThey'Re");
    EXPECT("[{{ ' x '.lstrip() }}][{{ ' x '.rstrip() }}][{{ '\\n\\nx\\n'.strip('\\n') }}]"
           "[{{ 'xxay'.lstrip('x') }}][{{ 'ayyx'.rstrip('xy') }}]",
           NULL, "[x ][ x][x][ay][a]");
    EXPECT("{{ 'abc'.startswith(('x', 'a')) }}{{ 'a-b'.replace('-', '+') }}{{ 'abcb'.find('b') }}"
           "{{ 'abcb'.count('b') }}{{ ', '.join(['a', 'b']) }}",
           NULL, "Truea+b12a, b");
    EXPECT("{{ 'a<b>c<b>'.split('<b>') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}", NULL,
           "['a', 'c', '']['a', 'b']['a', 'b,c']");
    EXPECT("{{ 'r</think>a'.split('</think>')[-1] }}{{ 'a\\nb\\r\\nc'.splitlines() | length }}",
           NULL, "a3");
    EXPECT("{{ d.get('k') }}{{ d.get('q', 'dflt') }}{{ d.get('q') }}{{ d.keys() | list }}"
           "{{ d.values() | list }}",
           "{\"d\": {\"k\": \"v\"}}", "vdfltNone['k']['v']");
    EXPECT("{% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 8, 3) | list }}"
           "{{ range(3, -1, -1) | list }}{{ range(0, 3, -1) | list }}",
           NULL, "012[1, 4, 7][3, 2, 1, 0][]");
    EXPECT("{{ x is defined }}{{ y is defined }}{{ y is not defined }}{{ n is none }}"
           "{{ s is string }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}",
           "{\"x\": 1, \"n\": null, \"s\": \"s\"}", "TrueFalseTrueTrueTrueTrueTrueTrue");
    EXPECT("{{ d is mapping }}{{ [] is iterable }}{{ 1 is number }}{{ false is false }}"
           "{{ 1 is integer }}{{ 1.0 is float }}{{ 'a' is lower }}{{ 3 is gt 2 }}",
           "{\"d\": {}}", "TrueTrueTrueTrueTrueTrueTrueTrue");
    EXPECT("{{ raise_exception is defined }}{{ namespace is defined }}{{ nothing is defined }}",
           NULL, "TrueTrueFalse");
    sp_jinja_opts_t o = sp_jinja_default_opts();
    o.now = 1721952000; /* 2024-07-26 00:00 UTC */
    sp_status_t st;
    char *out = render_st("{{ strftime_now('%d %b %Y') }}", NULL, &o, &st);
    ASSERT(out != NULL);
    ASSERT_STR_EQ(out, "26 Jul 2024");
    sp_free(out);
    /* The format is model-file text: only plain date conversions reach strftime. */
    static const char *const refused[] = {"{{ strftime_now('%c') }}", "{{ strftime_now('%s') }}",
                                          "{{ strftime_now('%-d') }}", "{{ strftime_now('x%') }}"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        out = render_st(refused[i], NULL, &o, &st);
        ASSERT(out == NULL && st == SP_ERR_INVALID);
    }
}

TEST(jinja_int_dict_keys)
{
    /* as Jinja2: keys stay integers through lookup, iteration, dictsort, repr and tojson */
    EXPECT("{% set d = {512: 'b', 0: 'a', 'x': 1} %}{{ d[512] }}{{ d[0] }}{{ d['x'] }}"
           "{{ 512 in d }}{{ 7 in d }}{{ d[7] is defined }}", NULL, "ba1TrueFalseFalse");
    EXPECT("{% set d = {16: 1, 2: 3} %}{% for k, v in d | dictsort %}{{ k + 1 }}:{{ v }},"
           "{% endfor %}{{ d }}{{ d | tojson }}", NULL,
           "3:3,17:1,{16: 1, 2: 3}{\"16\": 1, \"2\": 3}");
    EXPECT("{% for k in {3: 0} %}{{ k is number }}{% endfor %}", NULL, "True");
}

TEST(jinja_markup)
{
    /* Jinja2's Markup: |safe and |e give Markup; Markup + str escapes the str, ~ does not */
    EXPECT("{{ \"a'\"|safe + \"<b>\" }}|{{ \"x\"|safe + \"y\" + \"<\"|safe + \"\\\"\" }}|"
           "{{ (\"<\"|safe) ~ \"<\" }}", NULL, "a'&lt;b&gt;|xy<&#34;|<<");
    EXPECT("{{ \"<\"|e|e }}{{ (\"<\"|e) + \"&\" }}{{ (\"<\"|safe|string) + \">\" }}", NULL,
           "&lt;&lt;&amp;<&gt;");
}

TEST(jinja_generators)
{
    /* map/select give Jinja2 generators: iterable, always true, no len(), not JSON */
    EXPECT("{% set g = [1, 2] | select('equalto', 5) %}{{ 'yes' if g else 'no' }}"
           "{% for x in [3, 1] | map('string') %}{{ x }}{% endfor %}"
           "{{ [1, 2] | map('string') | list | length }}{{ [1] | select | list | tojson }}",
           NULL, "yes312[1]");
    EXPECT_FAIL("{{ [1] | map('string') | tojson }}", NULL, SP_ERR_INVALID,
                "generator is not JSON serializable");
    EXPECT_FAIL("{{ [1] | select | length }}", NULL, SP_ERR_INVALID, "has no len()");
    EXPECT("{{ ([1] | select)[0] is defined }}", NULL, "False");
}

TEST(jinja_compile_errors)
{
    EXPECT_FAIL("{% if x %}never closed", NULL, SP_ERR_INVALID, "needs 'endif'");
    /* an unknown filter fails where it runs (Jinja2 >= 3.0), not where it is written */
    EXPECT_FAIL("a\nb\n{{ x | no_such_filter }}", NULL, SP_ERR_INVALID,
                "line 3: no filter named 'no_such_filter'");
    EXPECT("{% if false %}{{ x | from_json }}{% endif %}ok", NULL, "ok");
    EXPECT_FAIL("{{ x is no_such_test }}", NULL, SP_ERR_INVALID, "unknown test");
    EXPECT_FAIL("{% include 'other.jinja' %}", NULL, SP_ERR_INVALID, "not supported");
    EXPECT_FAIL("{% extends 'base' %}", NULL, SP_ERR_INVALID, "not supported");
    EXPECT_FAIL("{{ 'unterminated }}", NULL, SP_ERR_INVALID, "unterminated");
    EXPECT_FAIL("{{ x ", NULL, SP_ERR_INVALID, "unclosed");
    EXPECT_FAIL("{# no end", NULL, SP_ERR_INVALID, "unclosed comment");
    EXPECT_FAIL("{% break %}", NULL, SP_ERR_INVALID, "outside a loop");
    EXPECT_FAIL("{% endfor %}", NULL, SP_ERR_INVALID, "endfor");
    EXPECT_FAIL("{% for x in y recursive %}{% endfor %}", NULL, SP_ERR_INVALID, "recursive");
    EXPECT_FAIL("{{ 1 + }}", NULL, SP_ERR_INVALID, "expected an expression");
    EXPECT_FAIL("{{ x.__class__ }}{{ 99999999999999999999 }}", NULL, SP_ERR_INVALID, "too large");
}

/* A string of `n` copies of `unit` between prefix and suffix. */
static char *
repeat_str(const char *prefix, const char *unit, int n, const char *mid, const char *unit2,
           const char *suffix)
{
    size_t len = strlen(prefix) + (strlen(unit) + strlen(unit2)) * (size_t)n + strlen(mid) +
                 strlen(suffix) + 1;
    char *s = malloc(len), *p = s;
    p += sprintf(p, "%s", prefix);
    for (int i = 0; i < n; i++) {
        p += sprintf(p, "%s", unit);
    }
    p += sprintf(p, "%s", mid);
    for (int i = 0; i < n; i++) {
        p += sprintf(p, "%s", unit2);
    }
    sprintf(p, "%s", suffix);
    return s;
}

TEST(jinja_nesting_limits)
{
    /* Deep nesting is refused at compile time, never by exhausting the C stack. */
    char *s = repeat_str("", "{% if true %}", 100, "x", "{% endif %}", "");
    EXPECT_FAIL(s, NULL, SP_ERR_TOO_LARGE, "nested deeper");
    free(s);
    s = repeat_str("{{ ", "(", 5000, "1", ")", " }}");
    EXPECT_FAIL(s, NULL, SP_ERR_TOO_LARGE, "nested deeper");
    free(s);
    s = repeat_str("{{ ", "not ", 5000, "1", "", " }}");
    EXPECT_FAIL(s, NULL, SP_ERR_TOO_LARGE, "nested deeper");
    free(s);
    s = repeat_str("{{ ", "[", 5000, "", "]", " }}");
    EXPECT_FAIL(s, NULL, SP_ERR_TOO_LARGE, "nested deeper");
    free(s);
    s = repeat_str("{{ 1", " + 1", 20000, "", "", " }}");
    EXPECT_FAIL(s, NULL, SP_ERR_TOO_LARGE, "expression nested deeper");
    free(s);
    s = repeat_str("{% if false %}", "{% elif false %}", 5000, "", "", "{% endif %}");
    EXPECT_FAIL(s, NULL, SP_ERR_TOO_LARGE, "nested deeper");
    free(s);
    /* Moderate nesting is fine. */
    s = repeat_str("", "{% if true %}", 30, "x", "{% endif %}", "");
    EXPECT(s, NULL, "x");
    free(s);
    /* Sources over the size limit. */
    size_t big = SP_JINJA_MAX_SOURCE_BYTES + 1;
    char *src = malloc(big);
    memset(src, 'a', big);
    sp_jinja_t *t = NULL;
    ASSERT_EQ(sp_jinja_compile(src, big, &t, g_err, sizeof g_err), SP_ERR_TOO_LARGE);
    ASSERT(t == NULL);
    free(src);
}

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

TEST(jinja_runtime_limits)
{
    double t0 = now_s();
    /* Runaway loops: the step budget stops them. */
    EXPECT_FAIL("{% for i in range(1000000000) %}x{% endfor %}", NULL, SP_ERR_TOO_LARGE,
                "step limit");
    EXPECT_FAIL("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
                "{% endfor %}{% endfor %}{% endfor %}",
                NULL, SP_ERR_TOO_LARGE, "step limit");
    /* Unbounded recursion: the depth limit stops it. */
    EXPECT_FAIL("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, SP_ERR_TOO_LARGE,
                "recursion deeper");
    /* Huge output. */
    EXPECT_FAIL("{{ 'x' * 2000000 }}", NULL, SP_ERR_TOO_LARGE, "output over");
    EXPECT_FAIL("{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}", NULL,
                SP_ERR_TOO_LARGE, "output over");
    /* Memory: a string doubled until it is gigabytes. */
    EXPECT_FAIL("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
                NULL, SP_ERR_TOO_LARGE, "memory limit");
    EXPECT_FAIL("{{ 'ab' * 10000000000 }}", NULL, SP_ERR_TOO_LARGE, "memory");
    /* A list nested 5000 deep by a loop: printing, comparing and JSON are bounded. */
    const char *deep = "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}"
                       "{% set ns.x = [ns.x] %}{% endfor %}";
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s{{ ns.x }}", deep);
    EXPECT_FAIL(tmpl, NULL, SP_ERR_TOO_LARGE, NULL);
    snprintf(tmpl, sizeof tmpl, "%s{{ ns.x | tojson }}", deep);
    EXPECT_FAIL(tmpl, NULL, SP_ERR_TOO_LARGE, NULL);
    snprintf(tmpl, sizeof tmpl, "%s{{ ns.x == ns.x }}", deep);
    EXPECT_FAIL(tmpl, NULL, SP_ERR_TOO_LARGE, "too deep");
    /* Tight custom limits. */
    sp_jinja_opts_t o = sp_jinja_default_opts();
    o.max_steps = 100;
    expect_fail("{% for i in range(50) %}{{ i }}{% endfor %}", NULL, &o, SP_ERR_TOO_LARGE,
                "step limit", __LINE__);
    o = sp_jinja_default_opts();
    o.max_output_bytes = 10;
    expect_fail("{{ 'hello world' }}", NULL, &o, SP_ERR_TOO_LARGE, "output over", __LINE__);
    double dt = now_s() - t0;
    fprintf(stderr, "  limits: all refused in %.3f s\n", dt);
    ASSERT(dt < 10.0);
}

TEST(jinja_runtime_errors)
{
    EXPECT_FAIL("{{ raise_exception('Conversation roles must alternate') }}", NULL, SP_ERR_INVALID,
                "line 1: Conversation roles must alternate");
    EXPECT_FAIL("\n{{ foo.bar }}", NULL, SP_ERR_INVALID, "line 2: 'foo' is undefined");
    EXPECT_FAIL("{{ messages[0]['role'] }}", "{\"messages\": []}", SP_ERR_INVALID, "undefined");
    EXPECT_FAIL("{{ 'a' + 1 }}", NULL, SP_ERR_INVALID, "unsupported operand");
    EXPECT_FAIL("{{ missing + 'a' }}", NULL, SP_ERR_INVALID, "'missing' is undefined");
    EXPECT_FAIL("{{ 1 // 0 }}", NULL, SP_ERR_INVALID, "by zero");
    EXPECT_FAIL("{{ 9223372036854775807 + 1 }}", NULL, SP_ERR_INVALID, "overflow");
    EXPECT_FAIL("{{ 'x'.nosuch() }}", NULL, SP_ERR_INVALID, "no method");
    EXPECT_FAIL("{{ 42() }}", NULL, SP_ERR_INVALID, "not callable");
    EXPECT_FAIL("{% set d = {'a': 1} %}{% set d.a = 2 %}", NULL, SP_ERR_INVALID, "non-namespace");
    EXPECT_FAIL("{% for a, b in [1] %}{% endfor %}", NULL, SP_ERR_INVALID, "unpack");
    EXPECT_FAIL("{{ 1 < 'a' }}", NULL, SP_ERR_INVALID, "not supported");
    /* The sandbox: host objects do not exist, so their attributes are just undefined. */
    EXPECT("[{{ ''.__class__ }}][{{ range.__globals__ }}][{{ cycler }}][{{ self }}]", NULL,
           "[][][][]");
    EXPECT_FAIL("{{ ''.__class__.__mro__ }}", NULL, SP_ERR_INVALID, "undefined");
    /* Bad contexts. */
    EXPECT_FAIL("x", "[1, 2]", SP_ERR_INVALID, "JSON object");
    EXPECT_FAIL("x", "{\"a\": ", SP_ERR_INVALID, "json offset");
    EXPECT_FAIL("x", "{\"a\": \"\\ud800\"}", SP_ERR_INVALID, "surrogate");
    const char *good = "{\"a\": [1, 2.5e3, null, \"x\"], \"b\": {\"c\": true}}";
    ASSERT_EQ(sp_jinja_json_check(good, strlen(good), NULL, 0), SP_OK);
    ASSERT_EQ(sp_jinja_json_check("[1,]", 4, NULL, 0), SP_ERR_INVALID);
    char deep[200];
    memset(deep, '[', sizeof deep);
    ASSERT_EQ(sp_jinja_json_check(deep, sizeof deep, g_err, sizeof g_err), SP_ERR_INVALID);
}

typedef struct render_job {
    const sp_jinja_t *t;
    const char *ctx;
    char *out;
} render_job_t;

static void *
render_thread(void *arg)
{
    render_job_t *j = arg;
    size_t n;
    char err[128];
    for (int i = 0; i < 50; i++) {
        char *out = NULL;
        if (sp_jinja_render_json(j->t, j->ctx, strlen(j->ctx), NULL, &out, &n, err, sizeof err) !=
            SP_OK) {
            return NULL;
        }
        sp_free(j->out);
        j->out = out;
    }
    return NULL;
}

TEST(jinja_threads_share_a_template)
{
    const char *src = "{% for m in messages %}{{ loop.index }}:{{ m | upper }};{% endfor %}";
    sp_jinja_t *t;
    ASSERT_OK(sp_jinja_compile(src, strlen(src), &t, g_err, sizeof g_err));
    const char *ctxs[4] = {"{\"messages\": [\"a\", \"b\"]}", "{\"messages\": [\"c\"]}",
                           "{\"messages\": []}", "{\"messages\": [\"d\", \"e\", \"f\"]}"};
    const char *want[4] = {"1:A;2:B;", "1:C;", "", "1:D;2:E;3:F;"};
    pthread_t th[4];
    render_job_t jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].t = t;
        jobs[i].ctx = ctxs[i];
        jobs[i].out = NULL;
        ASSERT_EQ(pthread_create(&th[i], NULL, render_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ASSERT(jobs[i].out != NULL);
        ASSERT_STR_EQ(jobs[i].out, want[i]);
        sp_free(jobs[i].out);
    }
    sp_jinja_destroy(t);
}

TEST(jinja_out_of_memory)
{
    /* Every allocation failing in turn gives SP_ERR_NOMEM and no leak (LSan checks). */
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}"
                      "{% set ns.n = ns.n + 1 %}{{ m.role | upper ~ ':' ~ m.content | trim }}"
                      "{% endfor %}{{ ns.n }}";
    const char *ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}, "
                      "{\"role\": \"assistant\", \"content\": \"yo\"}]}";
    int ok_at = -1;
    for (int n = 0; n < 200 && ok_at < 0; n++) {
        sp_jinja_t *t = NULL;
        char *out = NULL;
        size_t len;
        sp_alloc_fail_after(n);
        sp_status_t st = sp_jinja_compile(src, strlen(src), &t, g_err, sizeof g_err);
        if (st == SP_OK) {
            st = sp_jinja_render_json(t, ctx, strlen(ctx), NULL, &out, &len, g_err, sizeof g_err);
        }
        sp_alloc_fail_after(-1);
        if (st == SP_OK) {
            ASSERT_STR_EQ(out, "USER:hiASSISTANT:yo2");
            ok_at = n;
        } else {
            if (st != SP_ERR_NOMEM) {
                SP_TEST_FAIL("n=%d: status %d: %s", n, (int)st, g_err);
            }
        }
        sp_free(out);
        sp_jinja_destroy(t);
    }
    ASSERT(ok_at > 0);
}
