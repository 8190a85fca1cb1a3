/*
 * guided.c - vLLM's structured_outputs / guided_* fields into one constraint
 * (guided.h). A regex becomes GBNF through constrain/regex.h (the whole text
 * must match, characters as they are); a choice becomes an alternation of
 * literals; a grammar is GBNF text; json is a schema (an object, or a string
 * holding one). Threads: called on the event loop; the work is linear in the
 * fields (a pattern is at most SP_REGEX_MAX_LEN bytes). Memory: the result
 * owns a schema reference and a GBNF buffer, freed by sp_guided_clear.
 */
#include "api/guided.h"

#include <stdio.h>
#include <string.h>

#include "constrain/regex.h"
#include "core/alloc.h"

void
sp_guided_clear(sp_guided_t *g)
{
    json_decref(g->schema);
    sp_free(g->gbnf);
    memset(g, 0, sizeof *g);
}

/* GBNF "root ::= "a" | "b" ..." for a list of choices. */
static int
choice_gbnf(const json_t *c, sp_guided_t *out, char *err, size_t err_len)
{
    if (!json_is_array(c) || json_array_size(c) == 0 || json_array_size(c) > 4096) {
        snprintf(err, err_len, "'%s' must be a list of 1 to 4096 strings", out->param);
        return -1;
    }
    size_t cap = 16;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *s = json_array_get(c, i);
        if (!json_is_string(s) || json_string_length(s) == 0 ||
            strlen(json_string_value(s)) != json_string_length(s)) {
            snprintf(err, err_len, "'%s' must be a list of non-empty strings (no NUL)", out->param);
            return -1;
        }
        cap += 4 * json_string_length(s) + 8;
    }
    char *t = sp_malloc(cap), *p = t;
    if (t == NULL) {
        return -2;
    }
    p += sprintf(p, "root ::= ");
    for (size_t i = 0; i < json_array_size(c); i++) {
        const char *s = json_string_value(json_array_get(c, i));
        p += sprintf(p, i ? " | \"" : "\"");
        for (; *s; s++) {
            unsigned char ch = (unsigned char)*s;
            if (ch == '"' || ch == '\\') {
                *p++ = '\\', *p++ = (char)ch;
            } else if (ch < 0x20 || ch == 0x7F) {
                p += sprintf(p, "\\x%02X", ch);
            } else {
                *p++ = (char)ch;
            }
        }
        *p++ = '"';
    }
    *p++ = '\n';
    *p = '\0';
    out->gbnf = t;
    out->gbnf_len = (size_t)(p - t);
    return 1;
}

static int
regex_gbnf(const json_t *r, sp_guided_t *out, char *err, size_t err_len)
{
    if (!json_is_string(r) || json_string_length(r) == 0) {
        snprintf(err, err_len, "'%s' must be a regular expression (a string)", out->param);
        return -1;
    }
    sp_status_t st;
    char rerr[256];
    char *e = sp_regex_gbnf(json_string_value(r), json_string_length(r), 0, &st, rerr, sizeof rerr);
    if (e == NULL) {
        if (st == SP_ERR_NOMEM) {
            return -2;
        }
        snprintf(err, err_len, "%s: %s", out->param, rerr);
        return -1;
    }
    size_t n = strlen(e) + 16;
    out->gbnf = sp_malloc(n);
    if (out->gbnf == NULL) {
        sp_free(e);
        return -2;
    }
    out->gbnf_len = (size_t)snprintf(out->gbnf, n, "root ::= %s\n", e);
    sp_free(e);
    return 1;
}

static int
json_schema(const json_t *j, sp_guided_t *out, char *err, size_t err_len)
{
    if (json_is_string(j)) {
        json_error_t je;
        out->schema = json_loadb(json_string_value(j), json_string_length(j), 0, &je);
        if (out->schema == NULL || !json_is_object(out->schema)) {
            json_decref(out->schema);
            out->schema = NULL;
            snprintf(err, err_len, "'%s' must be a JSON schema (an object or its JSON text)",
                     out->param);
            return -1;
        }
        return 1;
    }
    if (!json_is_object(j)) {
        snprintf(err, err_len, "'%s' must be a JSON schema (an object or its JSON text)", out->param);
        return -1;
    }
    out->schema = json_incref((json_t *)j);
    return 1;
}

static int
grammar_text(const json_t *g, sp_guided_t *out, char *err, size_t err_len)
{
    if (!json_is_string(g) || json_string_length(g) == 0) {
        snprintf(err, err_len, "'%s' must be GBNF text (root ::= ...)", out->param);
        return -1;
    }
    out->gbnf = sp_strndup(json_string_value(g), json_string_length(g));
    out->gbnf_len = json_string_length(g);
    return out->gbnf ? 1 : -2;
}

int
sp_guided_parse(const json_t *body, sp_guided_t *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    static const char *const kinds[] = {"json", "regex", "choice", "grammar", "json_object"};
    static const char *const top[] = {"guided_json", "guided_regex", "guided_choice",
                                      "guided_grammar", NULL};
    static const char *const so_names[] = {"structured_outputs.json", "structured_outputs.regex",
                                           "structured_outputs.choice",
                                           "structured_outputs.grammar",
                                           "structured_outputs.json_object"};
    const json_t *so = json_object_get(body, "structured_outputs");
    const json_t *val = NULL;
    int kind = -1, found = 0;
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_object(so)) {
            out->param = "structured_outputs";
            snprintf(err, err_len, "'structured_outputs' must be an object");
            return -1;
        }
        static const char *const refused[] = {"structural_tag", "whitespace_pattern", NULL};
        for (int i = 0; refused[i]; i++) {
            if (json_object_get(so, refused[i]) != NULL) {
                out->param = "structured_outputs";
                snprintf(err, err_len, "structured_outputs.%s is not supported (json, regex, "
                         "choice, grammar, json_object)", refused[i]);
                return -1;
            }
        }
        static const char *const flags[] = {"disable_any_whitespace",
                                            "disable_additional_properties", NULL};
        for (int i = 0; flags[i]; i++) {
            if (json_is_true(json_object_get(so, flags[i]))) {
                out->param = "structured_outputs";
                snprintf(err, err_len, "structured_outputs.%s is not supported", flags[i]);
                return -1;
            }
        }
        for (int i = 0; i < 5; i++) {
            const json_t *v = json_object_get(so, kinds[i]);
            if (v == NULL || json_is_null(v) || (i == 4 && json_is_false(v))) {
                continue;
            }
            found++;
            kind = i, val = v, out->param = so_names[i];
        }
    }
    for (int i = 0; top[i]; i++) {
        const json_t *v = json_object_get(body, top[i]);
        if (v == NULL || json_is_null(v)) {
            continue;
        }
        found++;
        kind = i, val = v, out->param = top[i];
    }
    if (found == 0) {
        return 0;
    }
    if (found > 1) {
        out->param = so != NULL ? "structured_outputs" : "guided_json";
        snprintf(err, err_len, "give one of structured_outputs.json/regex/choice/grammar/"
                 "json_object and guided_json/regex/choice/grammar");
        return -1;
    }
    int rc;
    switch (kind) {
    case 0: rc = json_schema(val, out, err, err_len); break;
    case 1: rc = regex_gbnf(val, out, err, err_len); break;
    case 2: rc = choice_gbnf(val, out, err, err_len); break;
    case 3: rc = grammar_text(val, out, err, err_len); break;
    default:
        if (!json_is_true(val)) {
            snprintf(err, err_len, "'%s' must be a boolean", out->param);
            rc = -1;
        } else {
            out->json_object = true;
            rc = 1;
        }
        break;
    }
    if (rc < 0) {
        const char *param = out->param;
        sp_guided_clear(out);
        out->param = param;
    }
    return rc;
}
