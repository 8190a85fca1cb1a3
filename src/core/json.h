/*
 * json.h - JSON in and out for the front ends.
 *
 * In: jansson (strict RFC 8259: invalid UTF-8, lone surrogates, NaN and
 * duplicate keys are errors; integers are exact 64-bit), after a byte scan
 * that rejects nesting deeper than a limit before the recursive parser sees
 * the text. Typed getters validate one field each and name it on error, so
 * every 400 says which parameter was wrong.
 *
 * Out: the writer of jbuf.h, included here since nearly every user of one
 * uses the other.
 */
#ifndef SP_CORE_JSON_H
#define SP_CORE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/jbuf.h"
#include "sampan/status.h"

/* Route jansson's allocations through sp_malloc (once per process). */
void sp_json_init(void);

/* Deepest nesting of arrays/objects in buf (scans bytes, skips strings);
 * stops counting past limit and returns limit + 1. */
int sp_json_depth(const char *buf, size_t len, int limit);

/* Parse a request body. SP_ERR_INVALID with a message such as
 * "invalid JSON at line 1, column 7: ..." or "JSON nested deeper than 100". */
sp_status_t sp_json_parse(const char *buf, size_t len, int max_depth, json_t **out, char *err,
                          size_t err_len);

/* A field error: message plus the offending parameter (OpenAI's "param"). */
typedef struct sp_json_err {
    char msg[512];
    const char *param; /* borrowed: the key passed to the getter */
} sp_json_err_t;

/* Getters: 1 = present and valid (*out set), 0 = absent or null, -1 = wrong
 * type or out of range (e filled). */
int sp_json_get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    sp_json_err_t *e);
int sp_json_get_num(const json_t *obj, const char *key, double lo, double hi, double *out,
                    sp_json_err_t *e);
int sp_json_get_bool(const json_t *obj, const char *key, bool *out, sp_json_err_t *e);
int sp_json_get_str(const json_t *obj, const char *key, const char **out, size_t *len,
                    sp_json_err_t *e);
/* Fill e and return -1 (for checks the getters cannot express). */
int sp_json_fail(sp_json_err_t *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* SP_CORE_JSON_H */
