/*
 * test_chat_templates.c - every real chat template of tests/data/chat/templates/
 * rendered with every conversation of tests/data/chat/conversations.json through
 * sp_chat_apply_ex, byte for byte against what Hugging Face's
 * apply_chat_template gives (tests/data/chat/expected.json, written by
 * scripts/gen-chat-expected.py with Debian's python3-jinja2; `--check` there
 * re-renders and compares). A case where the reference raises an error must
 * fail here too. Stored outputs keep this test free of Python; the script's
 * --check (run by tests/py/test_chat_templates.py when jinja2 is installed)
 * catches a stale expected.json.
 *
 * SP_CHAT_TEMPLATES_VERBOSE=1 prints the first difference of each mismatch.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "chat/chat.h"
#include "test.h"

#define CHATDIR "tests/data/chat/"

/* Templates whose renders we know differ from the reference, and why
 * (docs/chat-templates.md lists them). Their differences are reported, not
 * failed; each must still differ somewhere, so the list cannot go stale. */
static const char *const known[][2] = {
    {NULL, NULL}, /* none at present: the templates of the folder all render as the reference */
};

static const char *
known_difference(const char *tname)
{
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (known[i][0] != NULL && strcmp(known[i][0], tname) == 0) {
            return known[i][1];
        }
    }
    return NULL;
}

static char *
read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ASSERT(buf != NULL);
    ASSERT_EQ(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static json_t *
load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (j == NULL) {
        SP_TEST_FAIL("%s:%d: %s", path, e.line, e.text);
    }
    return j;
}

/* A JSON value as compact text (malloc'd), or NULL for NULL / JSON null. */
static char *
dump(const json_t *v)
{
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    ASSERT(s != NULL);
    return s;
}

static const char *
str_or_null(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void
show_difference(const char *got, size_t got_len, const char *want, size_t want_len)
{
    size_t at = 0;
    while (at < got_len && at < want_len && got[at] == want[at]) {
        at++;
    }
    size_t from = at > 60 ? at - 60 : 0;
    fprintf(stderr, "      first difference at byte %zu (got %zu bytes, want %zu)\n", at,
            got_len, want_len);
    fprintf(stderr, "      got : [%.*s]\n", (int)((got_len - from) > 160 ? 160 : got_len - from),
            got + from);
    fprintf(stderr, "      want: [%.*s]\n",
            (int)((want_len - from) > 160 ? 160 : want_len - from), want + from);
}

/* Render one case; returns 1 when it matches the reference, else 0 (and says why). */
static int
run_case(const sp_chat_template_t *t, const char *tname, const json_t *conv, const json_t *c,
         const json_t *want, bool verbose)
{
    const char *cname = json_string_value(json_object_get(c, "name"));
    const json_t *jm = json_object_get(c, "messages");
    size_t n = json_array_size(jm);
    sp_chat_msg_t *msgs = calloc(n ? n : 1, sizeof *msgs);
    char **calls = calloc(n ? n : 1, sizeof *calls);
    ASSERT(msgs != NULL && calls != NULL);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(jm, i);
        calls[i] = dump(json_object_get(m, "tool_calls"));
        msgs[i] = (sp_chat_msg_t){str_or_null(m, "role"), str_or_null(m, "content"), calls[i],
                                  str_or_null(m, "name"), str_or_null(m, "tool_call_id")};
    }
    char *tools = dump(json_object_get(c, "tools"));
    char *extra = dump(json_object_get(c, "extra"));
    sp_jinja_opts_t o = sp_jinja_default_opts();
    o.now = (int64_t)json_integer_value(json_object_get(conv, "now"));
    sp_chat_params_t p = {json_is_true(json_object_get(c, "add_generation_prompt")),
                          json_string_value(json_object_get(conv, "bos_token")),
                          json_string_value(json_object_get(conv, "eos_token")),
                          tools, extra, &o};
    char *out = NULL, err[512] = "";
    size_t len = 0;
    sp_status_t st = sp_chat_apply_ex(t, msgs, n, &p, &out, &len, err, sizeof err);
    const json_t *wout = json_object_get(want, "out");
    int ok;
    if (wout == NULL) { /* the reference raised: so must we */
        ok = st != SP_OK;
        if (!ok) {
            fprintf(stderr, "    %s / %s: rendered, but the reference fails with %s\n", tname,
                    cname, json_string_value(json_object_get(want, "error")));
        }
    } else if (st != SP_OK) {
        ok = 0;
        fprintf(stderr, "    %s / %s: error %s\n", tname, cname, err);
    } else {
        const char *w = json_string_value(wout);
        size_t wl = json_string_length(wout);
        ok = len == wl && memcmp(out, w, wl) == 0;
        if (!ok) {
            fprintf(stderr, "    %s / %s: output differs\n", tname, cname);
            if (verbose) {
                show_difference(out, len, w, wl);
            }
        }
    }
    sp_free(out);
    for (size_t i = 0; i < n; i++) {
        free(calls[i]);
    }
    free(calls);
    free(msgs);
    free(tools);
    free(extra);
    return ok;
}

TEST(chat_templates_match_reference)
{
    json_t *conv = load_json(CHATDIR "conversations.json");
    json_t *expected = load_json(CHATDIR "expected.json");
    const json_t *cases = json_object_get(conv, "cases");
    bool verbose = getenv("SP_CHAT_TEMPLATES_VERBOSE") != NULL;
    ASSERT(json_array_size(cases) >= 8);
    int n_tmpl = 0, n_cases = 0, n_bad = 0, n_known = 0;
    const char *tname;
    json_t *per;
    json_object_foreach(expected, tname, per) {
        char path[512];
        snprintf(path, sizeof path, CHATDIR "templates/%s", tname);
        size_t len;
        char *src = read_all(path, &len);
        if (src == NULL) {
            SP_TEST_FAIL("expected.json names %s, which is missing", path);
        }
        sp_chat_template_t *t = NULL;
        char err[512];
        if (sp_chat_template_compile(src, len, &t, err, sizeof err) != SP_OK) {
            /* refused at load: right only for a template that fails in the
             * reference whatever it is given (docs/chat-templates.md names them) */
            int fails = 0;
            const char *cn;
            json_t *r;
            json_object_foreach(per, cn, r) {
                fails += json_object_get(r, "error") != NULL;
            }
            bool ok = fails == (int)json_object_size(per);
            fprintf(stderr, "    %s: refused at load (%s): %s\n", tname,
                    ok ? "the reference fails on every case too" : "WRONG", err);
            n_bad += ok ? 0 : (int)json_array_size(cases);
            n_cases += (int)json_array_size(cases);
            n_tmpl++;
            free(src);
            continue;
        }
        int bad = 0;
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const json_t *c = json_array_get(cases, i);
            const json_t *want = json_object_get(per, json_string_value(json_object_get(c, "name")));
            ASSERT(want != NULL);
            bad += !run_case(t, tname, conv, c, want, verbose);
            n_cases++;
        }
        const char *why = known_difference(tname);
        if (why != NULL) {
            fprintf(stderr, "    %s: %d of %zu cases differ, known: %s\n", tname, bad,
                    json_array_size(cases), why);
            if (bad == 0) {
                SP_TEST_FAIL("%s now matches the reference: take it off the known list", tname);
            }
            n_known += bad;
            bad = 0;
        }
        n_bad += bad;
        n_tmpl++;
        sp_chat_template_destroy(t);
        free(src);
    }
    fprintf(stderr, "  chat templates: %d cases over %d templates, %d differ from the reference "
            "(and %d known differences)\n", n_cases, n_tmpl, n_bad, n_known);
    json_decref(conv);
    json_decref(expected);
    ASSERT(n_tmpl >= 60);
    ASSERT_EQ(n_bad, 0);
}
