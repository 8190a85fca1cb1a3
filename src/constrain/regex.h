/*
 * regex.h - a regular expression (the subset that JSON Schema `pattern`s and
 * vLLM's guided_regex use) translated into one GBNF expression (grammar.h),
 * so that constrained decoding can only write text the expression matches.
 *
 * Supported: literals (UTF-8), `.`, classes `[a-z]` `[^...]` with the escapes
 * \d \w \s \D \W \S inside and out, \n \r \t \f \v \0 \xHH \uHHHH, escaped
 * punctuation, groups `(...)` `(?:...)` `(?<name>...)`, alternation, the
 * quantifiers * + ? {m} {m,} {m,n} (n at most 4096; a lazy `?` after one is
 * accepted, it does not change what matches), `^` at the start and `$` at the
 * end of a top-level alternative. Anything else (backreferences, lookaround,
 * \b, \p{...}, inline flags, anchors elsewhere) is an error naming the
 * construct and its offset. Pure functions, no shared state; the parser's
 * recursion is bounded by the group nesting (SP_REGEX_MAX_NEST).
 */
#ifndef SP_CONSTRAIN_REGEX_H
#define SP_CONSTRAIN_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

#define SP_REGEX_MAX_LEN 4096 /* bytes of pattern */
#define SP_REGEX_MAX_NEST 32  /* group nesting (the GBNF nests each group once) */

enum {
    /* The text is the inside of a JSON string: each character is written as
     * JSON encodes it ('"' as \", '\' as \\, line feed as \n, ...). Control
     * characters other than tab, line feed and carriage return are never
     * generated (what is generated still matches). */
    SP_REGEX_JSON = 1,
    /* JSON Schema semantics: an alternative without ^ (or $) may have any
     * text before (or after) its match. Without it the whole text matches. */
    SP_REGEX_SEARCH = 2,
};

/* The GBNF expression (self-contained: literals, classes and groups only),
 * NUL-terminated, from sp_malloc; NULL with err and *st set when the pattern
 * uses something unsupported (SP_ERR_INVALID) or is too large
 * (SP_ERR_TOO_LARGE). */
char *sp_regex_gbnf(const char *re, size_t len, unsigned flags, sp_status_t *st, char *err,
                    size_t err_len);
/* The same with unbounded repetitions (*, +, {m,}, and the text around an
 * unanchored match) capped at `cap` (> 0; 0: uncapped), so the matches are a
 * subset of the pattern's with a finite longest length. The shortest and
 * longest match in characters go to *min_len / *max_len (-1: unbounded);
 * either may be NULL. */
char *sp_regex_gbnf_capped(const char *re, size_t len, unsigned flags, long cap,
                           int64_t *min_len, int64_t *max_len, sp_status_t *st, char *err,
                           size_t err_len);

#endif /* SP_CONSTRAIN_REGEX_H */
