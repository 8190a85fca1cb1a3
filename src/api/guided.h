/*
 * guided.h - vLLM's constrained-decoding fields on the OpenAI routes:
 * `structured_outputs: {json | regex | choice | grammar | json_object}` and
 * the older top-level `guided_json`, `guided_regex`, `guided_choice`,
 * `guided_grammar`, read into one constraint (a JSON schema, GBNF text, or
 * "any JSON object") for the request's preparation to compile.
 * Pure functions of the request body; the result owns what it holds.
 */
#ifndef SP_API_GUIDED_H
#define SP_API_GUIDED_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct sp_guided {
    json_t *schema;     /* a JSON schema (a reference held), or NULL */
    char *gbnf;         /* GBNF text from sp_malloc (regex, choice, grammar), or NULL */
    size_t gbnf_len;
    bool json_object;   /* any JSON object */
    const char *param;  /* the field it came from (or the field at fault) */
} sp_guided_t;

/* 0: none of the fields; 1: one constraint in *out; -1: a client error
 * (err says what, out->param names the field); -2: out of memory. */
int sp_guided_parse(const json_t *body, sp_guided_t *out, char *err, size_t err_len);
void sp_guided_clear(sp_guided_t *g);

#endif /* SP_API_GUIDED_H */
