/* json.c - request parsing: jansson behind a depth scan, and typed field getters (json.h). */
#include "core/json.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

static void
json_set_hooks(void)
{
    json_set_alloc_funcs(sp_malloc, sp_free);
}

void
sp_json_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, json_set_hooks);
}

int
sp_json_depth(const char *buf, size_t len, int limit)
{
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char ch = buf[i];
        if (in_str) {
            if (ch == '\\') {
                i++; /* the escaped byte cannot end the string */
            } else if (ch == '"') {
                in_str = false;
            }
            continue;
        }
        if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max) {
                max = depth;
                if (max > limit) {
                    return limit + 1;
                }
            }
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return max;
}

sp_status_t
sp_json_parse(const char *buf, size_t len, int max_depth, json_t **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_json_init();
    if (sp_json_depth(buf, len, max_depth) > max_depth) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "JSON nested deeper than %d levels", max_depth);
    }
    json_error_t je;
    json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (v == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "invalid JSON at line %d, column %d: %s",
                       je.line, je.column, je.text);
    }
    *out = v;
    return SP_OK;
}

int
sp_json_fail(sp_json_err_t *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->param = param;
    return -1;
}

static const char *
type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

int
sp_json_get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v); /* 5.0 is an integer to most clients */
    } else {
        return sp_json_fail(e, key, "'%s' must be an integer, got %s", key, type_name(v));
    }
    if (x < lo || x > hi) {
        return sp_json_fail(e, key, "'%s' must be between %lld and %lld, got %lld", key,
                            (long long)lo, (long long)hi, (long long)x);
    }
    *out = x;
    return 1;
}

int
sp_json_get_num(const json_t *obj, const char *key, double lo, double hi, double *out,
                sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    if (!json_is_number(v)) {
        return sp_json_fail(e, key, "'%s' must be a number, got %s", key, type_name(v));
    }
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) {
        return sp_json_fail(e, key, "'%s' must be between %g and %g, got %g", key, lo, hi, x);
    }
    *out = x;
    return 1;
}

int
sp_json_get_bool(const json_t *obj, const char *key, bool *out, sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    if (!json_is_boolean(v)) {
        return sp_json_fail(e, key, "'%s' must be a boolean, got %s", key, type_name(v));
    }
    *out = json_is_true(v);
    return 1;
}

int
sp_json_get_str(const json_t *obj, const char *key, const char **out, size_t *len,
                sp_json_err_t *e)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        return 0;
    }
    if (!json_is_string(v)) {
        return sp_json_fail(e, key, "'%s' must be a string, got %s", key, type_name(v));
    }
    *out = json_string_value(v);
    if (len) {
        *len = json_string_length(v);
    }
    return 1;
}
