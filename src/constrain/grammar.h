/*
 * grammar.h - GBNF grammars compiled for constrained decoding.
 *
 * A grammar (llama.cpp's GBNF dialect: `name ::= alternatives`, string
 * literals, character classes with ranges and `^`, `.`, groups, `*` `+` `?`
 * `{m}` `{m,}` `{m,n}`, `#` comments) is compiled once into a byte-level
 * pushdown automaton: every literal and character class becomes sequences of
 * byte sets (a class over code points is split into its UTF-8 byte ranges),
 * repetitions become small helper rules. A compiled sp_grammar_t is
 * immutable and reference-counted: any number of generations on any threads
 * share it.
 *
 * Matching happens in an sp_gmatch_t (one per generation, not thread-safe).
 * Its states are sets of parse stacks; stacks are hash-consed nodes
 * (element, parent), so equal stacks are equal ids, and a state is an
 * interned set of stack tops. Advancing a state by a byte is cached, so after
 * warm-up a walk over the vocabulary is mostly table look-ups (docs/
 * structured-output.md has the numbers). Nothing here recurses on input:
 * expansion uses explicit work lists, left recursion is refused at compile
 * time, and every table has a hard cap.
 *
 *     sp_grammar_t *g;
 *     if (sp_grammar_compile(text, len, &g, err, sizeof err) != SP_OK) ... err says why
 *     sp_gmatch_t *m; sp_gmatch_create(g, &m, err, sizeof err);
 *     sp_gstate_t s = sp_gmatch_feed(m, sp_gmatch_state(m), 'a');   // a trial
 *     sp_gmatch_commit(m, "abc", 3);                                 // the real state moves
 *     sp_gmatch_destroy(m); sp_grammar_release(g);
 */
#ifndef SP_CONSTRAIN_GRAMMAR_H
#define SP_CONSTRAIN_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

#define SP_GRAMMAR_MAX_SOURCE (1u << 20) /* bytes of GBNF text */
#define SP_GRAMMAR_MAX_ELEMS (1u << 18)  /* elements after repetitions are expanded */
#define SP_GRAMMAR_MAX_RULES (1u << 15)  /* rules, helper rules included */
#define SP_GRAMMAR_MAX_NEST 64           /* parenthesis depth */
#define SP_GRAMMAR_MAX_REPEAT 4096       /* m and n of {m,n} */

typedef struct sp_grammar sp_grammar_t;

/* Compile GBNF text (the root rule is `root`). SP_ERR_INVALID with err naming
 * the line and column, or the rule, for syntax errors, undefined rules, left
 * recursion and rules that can never end; SP_ERR_TOO_LARGE past the limits
 * above. The result has one reference. */
sp_status_t sp_grammar_compile(const char *src, size_t len, sp_grammar_t **out, char *err,
                               size_t err_len);
void sp_grammar_retain(sp_grammar_t *g);  /* NULL is a no-op; atomic */
void sp_grammar_release(sp_grammar_t *g); /* NULL is a no-op; frees at the last reference */
size_t sp_grammar_bytes(const sp_grammar_t *g);
int32_t sp_grammar_n_rules(const sp_grammar_t *g);
/* True when some byte set of the grammar has none of the bytes in `have`
 * (256 flags): then the shortest completion may need a byte the caller
 * cannot produce alone. */
bool sp_grammar_needs_byte_outside(const sp_grammar_t *g, const bool have[256]);
/* Whole-string test: 1 when text is a complete sentence of the grammar, 0 when
 * not, < 0 on an internal limit (tests and tools; generation uses sp_gmatch). */
int sp_gmatch_match(const sp_grammar_t *g, const char *text, size_t len);

/* ---- matching ----------------------------------------------------------- */

typedef struct sp_gmatch sp_gmatch_t;
typedef uint32_t sp_gstate_t;
#define SP_GSTATE_DEAD UINT32_MAX

/* A matcher at the grammar's start; it holds a reference to g. */
sp_status_t sp_gmatch_create(sp_grammar_t *g, sp_gmatch_t **out, char *err, size_t err_len);
void sp_gmatch_destroy(sp_gmatch_t *m);
sp_gstate_t sp_gmatch_state(const sp_gmatch_t *m);
/* The state after byte c from s, or SP_GSTATE_DEAD when the grammar refuses it
 * (or, conservatively, when a table is full: the next sp_gmatch_maintain
 * makes room). States stay valid until sp_gmatch_maintain. */
sp_gstate_t sp_gmatch_feed(sp_gmatch_t *m, sp_gstate_t s, unsigned c);
/* s is a complete sentence (the generation may end here). */
bool sp_gmatch_accepting(const sp_gmatch_t *m, sp_gstate_t s);
/* s has some byte that continues it. */
bool sp_gmatch_can_continue(const sp_gmatch_t *m, sp_gstate_t s);
/* Bytes in the shortest completion of s (0 when accepting). */
uint32_t sp_gmatch_cost(const sp_gmatch_t *m, sp_gstate_t s);
/* Move the current state by n bytes; false (state unchanged) when refused. */
bool sp_gmatch_commit(sp_gmatch_t *m, const void *p, size_t n);
/* A table hit its hard cap since the last rebuild: some DEAD answers may
 * have been the limit's, not the grammar's (do not cache masks then). */
bool sp_gmatch_overflowed(const sp_gmatch_t *m);
/* Between steps: when the tables are past their soft limits, rebuild them
 * around the current state (every other sp_gstate_t becomes invalid).
 * True when it did. */
bool sp_gmatch_maintain(sp_gmatch_t *m);
/* A small per-matcher cache of token masks by state: a bit per token (n_bits,
 * the caller's vocabulary) and the largest cost (sp_gmatch_cost) a valid
 * token leads to; NULL when none is stored for s. */
const uint64_t *sp_gmatch_mask_get(sp_gmatch_t *m, sp_gstate_t s, int32_t n_bits,
                                   uint32_t *max_cost);
/* Room for the mask of s (zeroed), or NULL when out of memory. */
uint64_t *sp_gmatch_mask_put(sp_gmatch_t *m, sp_gstate_t s, int32_t n_bits, uint32_t max_cost);
size_t sp_gmatch_bytes(const sp_gmatch_t *m);

#endif /* SP_CONSTRAIN_GRAMMAR_H */
