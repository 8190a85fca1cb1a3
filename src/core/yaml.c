/* yaml.c - YAML documents read as JSON values (yaml.h). */
#include "core/yaml.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "core/json.h"

enum { MAX_DEPTH_HARD = 256 };

typedef struct frame {
    json_t *v;   /* the open object or array */
    char *key;   /* object: the key waiting for its value (malloc'd), or NULL */
} frame_t;

static bool
is_word(const char *s, const char *const *words)
{
    for (; *words; words++) {
        if (strcmp(s, *words) == 0) {
            return true;
        }
    }
    return false;
}

/* The core schema's integer forms: [-+]?[0-9]+, 0o[0-7]+, 0x[0-9a-fA-F]+. */
static bool
parse_int(const char *s, long long *out)
{
    int base = 10;
    const char *p = s;
    if (p[0] == '0' && p[1] == 'x') {
        base = 16;
        p += 2;
    } else if (p[0] == '0' && p[1] == 'o') {
        base = 8;
        p += 2;
    } else if (*p == '-' || *p == '+') {
        p++;
    }
    if (*p == '\0') {
        return false;
    }
    for (const char *q = p; *q; q++) {
        bool ok = base == 16 ? ((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f') ||
                                (*q >= 'A' && *q <= 'F'))
                  : base == 8 ? (*q >= '0' && *q <= '7')
                              : (*q >= '0' && *q <= '9');
        if (!ok) {
            return false;
        }
    }
    errno = 0;
    char *end;
    long long v = strtoll(base == 10 ? s : p, &end, base);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *out = v;
    return true;
}

/* [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? */
static bool
parse_float(const char *s, double *out)
{
    const char *p = s;
    if (*p == '-' || *p == '+') {
        p++;
    }
    int digits = 0;
    while (*p >= '0' && *p <= '9') {
        p++, digits++;
    }
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') {
            p++, digits++;
        }
    }
    if (digits == 0) {
        return false;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '-' || *p == '+') {
            p++;
        }
        if (!(*p >= '0' && *p <= '9')) {
            return false;
        }
        while (*p >= '0' && *p <= '9') {
            p++;
        }
    }
    if (*p != '\0') {
        return false;
    }
    *out = strtod(s, NULL);
    return isfinite(*out);
}

/* The value of one scalar event, or NULL with err filled. */
static json_t *
scalar_value(const yaml_event_t *ev, char *err, size_t err_len)
{
    const char *s = (const char *)ev->data.scalar.value;
    const char *tag = (const char *)ev->data.scalar.tag;
    bool plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    if (!plain || (tag != NULL && strcmp(tag, YAML_STR_TAG) == 0)) {
        return json_stringn(s, ev->data.scalar.length);
    }
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL", NULL};
    static const char *const trues[] = {"true", "True", "TRUE", NULL};
    static const char *const falses[] = {"false", "False", "FALSE", NULL};
    static const char *const nonfinite[] = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF",
                                            "-.inf", "-.Inf", "-.INF", ".nan", ".NaN", ".NAN", NULL};
    if (is_word(s, nulls)) {
        return json_null();
    }
    if (is_word(s, trues)) {
        return json_true();
    }
    if (is_word(s, falses)) {
        return json_false();
    }
    if (is_word(s, nonfinite)) {
        sp_errf(err, err_len, SP_ERR_INVALID, "line %zu, column %zu: '%s' (infinity and NaN) is not a "
                "value a configuration takes", ev->start_mark.line + 1, ev->start_mark.column + 1, s);
        return NULL;
    }
    long long i;
    if (parse_int(s, &i)) {
        return json_integer(i);
    }
    double d;
    if (parse_float(s, &d)) {
        return json_real(d);
    }
    return json_stringn(s, ev->data.scalar.length);
}

/* Put v (stolen) into the innermost open container; mapping keys come first. */
static sp_status_t
attach(frame_t *stack, int depth, json_t **root, json_t *v, const yaml_event_t *ev, char *err,
       size_t err_len)
{
    if (depth == 0) {
        *root = v;
        return SP_OK;
    }
    frame_t *f = &stack[depth - 1];
    if (json_is_array(f->v)) {
        json_array_append_new(f->v, v);
        return SP_OK;
    }
    const size_t line = ev->start_mark.line + 1, col = ev->start_mark.column + 1;
    if (f->key == NULL) {
        if (!json_is_string(v)) {
            json_decref(v);
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "line %zu, column %zu: a mapping key must be a string", line, col);
        }
        f->key = strdup(json_string_value(v));
        json_decref(v);
        if (f->key == NULL) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
        if (json_object_get(f->v, f->key) != NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "line %zu, column %zu: key '%s' given twice",
                           line, col, f->key);
        }
        return SP_OK;
    }
    json_object_set_new(f->v, f->key, v);
    free(f->key);
    f->key = NULL;
    return SP_OK;
}

sp_status_t
sp_yaml_parse(const char *buf, size_t len, int max_depth, json_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_json_init();
    if (max_depth > MAX_DEPTH_HARD) {
        max_depth = MAX_DEPTH_HARD;
    }
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
    frame_t stack[MAX_DEPTH_HARD];
    int depth = 0, docs = 0;
    json_t *root = NULL;
    sp_status_t st = SP_OK;
    for (bool done = false; !done && st == SP_OK;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            st = sp_errf(err, err_len, SP_ERR_INVALID, "line %zu, column %zu: %s%s%s",
                         p.problem_mark.line + 1, p.problem_mark.column + 1,
                         p.problem ? p.problem : "invalid YAML", p.context ? " " : "",
                         p.context ? p.context : "");
            break;
        }
        const size_t line = ev.start_mark.line + 1, col = ev.start_mark.column + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                st = sp_errf(err, err_len, SP_ERR_INVALID,
                             "line %zu, column %zu: more than one YAML document", line, col);
            }
            break;
        case YAML_ALIAS_EVENT:
            st = sp_errf(err, err_len, SP_ERR_INVALID,
                         "line %zu, column %zu: aliases (*%s) are not supported", line, col,
                         (const char *)ev.data.alias.anchor);
            break;
        case YAML_SCALAR_EVENT: {
            json_t *v = scalar_value(&ev, err, err_len);
            st = v == NULL ? SP_ERR_INVALID : attach(stack, depth, &root, v, &ev, err, err_len);
            break;
        }
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT: {
            if (depth >= max_depth) {
                st = sp_errf(err, err_len, SP_ERR_INVALID,
                             "line %zu, column %zu: nested deeper than %d levels", line, col, max_depth);
                break;
            }
            if (depth > 0 && json_is_object(stack[depth - 1].v) && stack[depth - 1].key == NULL) {
                st = sp_errf(err, err_len, SP_ERR_INVALID,
                             "line %zu, column %zu: a mapping key must be a string", line, col);
                break;
            }
            json_t *c = ev.type == YAML_MAPPING_START_EVENT ? json_object() : json_array();
            if (c == NULL) {
                st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
                break;
            }
            /* attached at once (a borrowed reference stays on the stack) so that
             * an error anywhere below frees the whole tree through root */
            json_incref(c);
            st = attach(stack, depth, &root, c, &ev, err, err_len);
            if (st != SP_OK) {
                json_decref(c);
                break;
            }
            json_decref(c);
            stack[depth++] = (frame_t){c, NULL};
            break;
        }
        case YAML_MAPPING_END_EVENT:
        case YAML_SEQUENCE_END_EVENT:
            depth--;
            free(stack[depth].key);
            stack[depth].key = NULL;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    while (depth > 0) {
        free(stack[--depth].key);
    }
    yaml_parser_delete(&p);
    if (st != SP_OK) {
        json_decref(root);
        return st;
    }
    *out = root ? root : json_null();
    return SP_OK;
}
