/*
 * schema.h - JSON Schema to a GBNF grammar (grammar.h), for structured output
 * and tool arguments.
 *
 * Supported: type (object, array, string, number, integer, boolean, null, or
 * a list of them), properties, required (the others optional), additional-
 * Properties (false, true or a schema; extra properties are generated only
 * for an object without `properties`), enum, const, anyOf (alternation),
 * oneOf (the same alternation, exact because branches that a value could
 * match twice are refused: only branches of different types, with different
 * const / enum values, or objects with a required property of different
 * const / enum values are accepted), allOf (merged), items,
 * minItems / maxItems, uniqueItems over finite items, minLength / maxLength
 * (up to 4096), minimum / maximum / exclusiveMinimum / exclusiveMaximum /
 * multipleOf on integers and numbers (ranges compiled into digit patterns),
 * format (date-time, date, time, email, uuid, uri, ipv4), pattern (the regex
 * subset of regex.h), $ref to "#", "#/$defs/NAME" or "#/definitions/NAME"
 * (each target becomes one rule, so recursive schemas become recursive
 * rules, never a recursive compile). docs/structured-output.md says which
 * subset of the valid values each generates. Annotations (title,
 * description, default, examples, $schema, $id, $comment, ...) are ignored.
 * Anything else that constrains values (if/then/else, not, prefixItems,
 * patternProperties, ...) is an error naming the keyword and where it is, so
 * the server answers 400 instead of generating output that might not
 * validate. So is a constraining keyword beside $ref, const, enum, anyOf,
 * oneOf or allOf, which would be dropped (type beside const or enum is kept when
 * every value has that type). Properties are generated in the schema's order. Between tokens
 * the output may have one space, or a line break and up to 20 spaces.
 * Compile work is linear in the schema (at most SP_SCHEMA_MAX_NODES nodes),
 * and the grammar's own limits apply to the result.
 */
#ifndef SP_CONSTRAIN_SCHEMA_H
#define SP_CONSTRAIN_SCHEMA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "constrain/grammar.h"
#include "sampan/status.h"

#define SP_SCHEMA_MAX_NODES 10000 /* schema objects compiled, enum values included */
#define SP_SCHEMA_MAX_DEPTH 64    /* nesting of schema objects (refs do not nest) */

typedef struct sp_schema_gbnf sp_schema_gbnf_t;

/* A builder for one grammar made of several schemas plus the caller's rules. */
sp_status_t sp_schema_gbnf_create(sp_schema_gbnf_t **out);
void sp_schema_gbnf_destroy(sp_schema_gbnf_t *b);
/* Add the rules for schema (its $refs resolve inside it); the name of the
 * rule that matches one instance goes to rule (cap >= 32). SP_ERR_INVALID
 * with err naming the keyword and JSON pointer for what is not supported. */
sp_status_t sp_schema_gbnf_add(sp_schema_gbnf_t *b, const json_t *schema, char *rule,
                               size_t rule_cap, char *err, size_t err_len);
/* Work done so far: schema properties and 'required' entries visited. Linear
 * in the schema's size (tests check that it does not grow faster). */
uint64_t sp_schema_gbnf_work(const sp_schema_gbnf_t *b);
/* Append GBNF text as is (the caller's rules, e.g. its root). */
void sp_schema_gbnf_raw(sp_schema_gbnf_t *b, const char *text);
/* The text will define `ws` (optional JSON whitespace) for the caller's rules. */
void sp_schema_gbnf_use_ws(sp_schema_gbnf_t *b);
/* Append s[0..n) as a GBNF string literal ("...", escaped). */
void sp_schema_gbnf_literal(sp_schema_gbnf_t *b, const char *s, size_t n);
/* The GBNF text so far (with the shared helper rules), NUL-terminated, owned
 * by b; NULL when out of memory. */
const char *sp_schema_gbnf_text(sp_schema_gbnf_t *b, size_t *len);

/* The GBNF of one schema (root ::= the schema). *out from sp_malloc. */
sp_status_t sp_schema_to_gbnf(const json_t *schema, char **out, size_t *out_len, char *err,
                              size_t err_len);
/* Schema to compiled grammar in one call. */
sp_status_t sp_schema_grammar(const json_t *schema, sp_grammar_t **out, char *err,
                              size_t err_len);

#endif /* SP_CONSTRAIN_SCHEMA_H */
