/*
 * toolcall.h - finding tool calls in a chat model's output, per family
 * (sp_chat_tools_t in chat.h), and the grammar that forces one.
 *
 * Parsing is linear: memmem for the markers and jansson for the JSON (one
 * value at a time), never a regular expression. A call is {"name": string,
 * "arguments": object}; output whose calls do not parse is plain content.
 * Threads: pure functions. Memory: results are the caller's.
 */
#ifndef SP_CONSTRAIN_TOOLCALL_H
#define SP_CONSTRAIN_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "chat/chat.h"
#include "sampan/status.h"

#define SP_TOOLCALL_MAX_CALLS 16

/*
 * Parse text (the answer, after any reasoning) for calls in family f (every
 * family of sp_chat_tools_t but HARMONY, whose calls answer.c reads from its
 * channels). tools: the request's OpenAI list (may be NULL), which says the
 * type of each parameter for the families that write arguments as text
 * (QWEN3_CODER, SEED, GLM: a parameter declared "string" stays a string,
 * others are read as JSON when they spell a JSON value). On finding calls:
 * *calls is a new JSON array of {"name": "...", "arguments": <object>}
 * (caller json_decrefs it); no calls: *calls is NULL. Either way the
 * content is text[*content_start, *content_end): what the model wrote before
 * its first call (a call that does not parse is content, never an error).
 */
void sp_toolcall_parse(sp_chat_tools_t f, const json_t *tools, const char *text, size_t len,
                       json_t **calls, size_t *content_start, size_t *content_end);

/*
 * Streaming: the end of the part of text that is content for sure (no call
 * can start inside it: a possible start marker split across tokens is held
 * back), and where content starts (*content_start); *in_call is true once a
 * call has started (everything from there waits for the end of the
 * generation). Always consistent with sp_toolcall_parse of any longer text:
 * text[*content_start, returned) is a prefix of its content.
 */
size_t sp_toolcall_safe_prefix(sp_chat_tools_t f, const char *text, size_t len,
                               size_t *content_start, bool *in_call);

/* The family a forced call's grammar (below) writes for models of family f:
 * f itself for HERMES, LLAMA3 and MISTRAL, HERMES for the others. */
sp_chat_tools_t sp_toolcall_grammar_format(sp_chat_tools_t f);

/*
 * A GBNF grammar that makes the model write exactly one call, in family f,
 * to one of the functions of `tools` (OpenAI's list; only the one called
 * `only` when not NULL), its arguments valid against the function's
 * parameters schema. *out from sp_malloc. SP_ERR_INVALID with err for a
 * schema the grammar cannot express, or when `only` is not in tools.
 */
sp_status_t sp_toolcall_grammar(sp_chat_tools_t f, const json_t *tools, const char *only,
                                char **out, size_t *out_len, char *err, size_t err_len);

#endif /* SP_CONSTRAIN_TOOLCALL_H */
