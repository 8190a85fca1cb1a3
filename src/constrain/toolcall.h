/*
 * toolcall.h - finding tool calls in a chat model's output, per family
 * (sp_chat_tools_t in chat.h), and the grammar that forces one.
 *
 * Parsing is linear: memmem for the markers and jansson for the JSON (one
 * value at a time), never a regular expression. A call is {"name": string,
 * "arguments" (or "parameters"): object}; output whose calls do not parse is
 * plain content.
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
 * Parse text. On finding calls: *calls is a new JSON array of
 * {"name": "...", "arguments": <object>} (caller json_decrefs it) and
 * *content_len the length of the text before the first call (content the
 * model wrote first). No calls: *calls is NULL.
 */
void sp_toolcall_parse(sp_chat_tools_t f, const char *text, size_t len, json_t **calls,
                       size_t *content_len);

/*
 * Streaming: the length of the prefix of text that is content for sure
 * (no call can start inside it); *in_call is true once a call has started
 * (everything from there waits for the end of the generation).
 */
size_t sp_toolcall_safe_prefix(sp_chat_tools_t f, const char *text, size_t len, bool *in_call);

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
