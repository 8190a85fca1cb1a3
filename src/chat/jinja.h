/*
 * jinja.h - a sandboxed interpreter for the Jinja subset of chat templates.
 *
 * A GGUF file's `tokenizer.chat_template` is untrusted input (CVE-2024-34359:
 * rendering one with an unsandboxed Jinja ran attacker code). This engine has
 * no code execution at all: a template can only read the JSON context it is
 * given, call a fixed list of pure built-ins (filters, tests, string and dict
 * methods, range, namespace, raise_exception, strftime_now) and write text.
 * There is no attribute access to anything but that data, no file access
 * (include/import/extends are compile errors), and every render is bounded in
 * steps, recursion depth, memory and output size: a violation is a status
 * with a message, never a crash or a hang.
 *
 * Semantics follow Hugging Face transformers' environment (trim_blocks and
 * lstrip_blocks on, loop controls, a trailing newline of the source dropped,
 * Python-style printing of None/True/False and of lists, `tojson` without HTML
 * escaping and with ensure_ascii off). docs/chat-templates.md lists the
 * supported subset and where we differ.
 *
 * A compiled template is immutable, so one sp_jinja_t can be rendered from
 * many threads at once; each render keeps its state on its own arena. At the
 * default max_depth a render needs about 256 KiB of C stack (-O2; several MiB
 * under ASan): render on threads with >= 1 MiB of stack or lower max_depth.
 */
#ifndef SP_CHAT_JINJA_H
#define SP_CHAT_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

typedef struct sp_jinja sp_jinja_t;

/* Compile-time limits. */
#define SP_JINJA_MAX_SOURCE_BYTES (256u * 1024u) /* bigger sources: SP_ERR_TOO_LARGE */
#define SP_JINJA_MAX_NESTING      64             /* blocks and brackets nested in the source */
#define SP_JINJA_MAX_AST_DEPTH    256            /* e.g. a+b+c+... chains */

typedef struct sp_jinja_opts {
    uint64_t max_steps;      /* statements + expression nodes + loop iterations + O(n) work */
    size_t max_output_bytes; /* rendered text (and any one captured block) */
    size_t max_memory_bytes; /* the render's arena: context, values, strings, captures */
    int max_depth;           /* runtime recursion: nested blocks, expressions, macro calls */
    int64_t now;             /* strftime_now's time (Unix seconds, UTC); 0 = the clock */
} sp_jinja_opts_t;

/* 1e6 steps, 1 MiB output, 64 MiB memory, depth 400, now from the clock. */
sp_jinja_opts_t sp_jinja_default_opts(void);

/*
 * Parse `src` (len bytes, UTF-8; need not be NUL-terminated). Unknown filters
 * and tests, unsupported tags, syntax errors and unclosed blocks fail here with
 * SP_ERR_INVALID and "line N: ..." in err; a source over
 * SP_JINJA_MAX_SOURCE_BYTES or nested deeper than SP_JINJA_MAX_NESTING /
 * SP_JINJA_MAX_AST_DEPTH fails with SP_ERR_TOO_LARGE.
 */
sp_status_t sp_jinja_compile(const char *src, size_t len, sp_jinja_t **out, char *err,
                             size_t err_len);
void sp_jinja_destroy(sp_jinja_t *t); /* NULL is a no-op */

/*
 * Render with the variables of `ctx_json`, a JSON object (its keys become
 * top-level names: `messages`, `bos_token`, `add_generation_prompt`, ...).
 * opts may be NULL for the defaults. On success *out is a NUL-terminated
 * string from sp_malloc (free with sp_free) and *out_len its length.
 * Failures: SP_ERR_INVALID (bad context JSON, a type error, an undefined
 * value used where it cannot be, raise_exception: err holds "line N: ..."),
 * SP_ERR_TOO_LARGE (a limit), SP_ERR_NOMEM. *out is NULL on failure.
 */
sp_status_t sp_jinja_render_json(const sp_jinja_t *t, const char *ctx_json, size_t ctx_len,
                                 const sp_jinja_opts_t *opts, char **out, size_t *out_len,
                                 char *err, size_t err_len);

/* SP_OK if `json` (len bytes) is one well-formed JSON value (UTF-8) nested at
 * most 64 deep; otherwise SP_ERR_INVALID with the offset of the problem. */
sp_status_t sp_jinja_json_check(const char *json, size_t len, char *err, size_t err_len);

#endif /* SP_CHAT_JINJA_H */
