/*
 * chat_input.h - the chat inputs of an OpenAI-style request, checked and
 * gathered for the template (chat.h), once for every route that renders one
 * (/v1/chat/completions, /apply-template):
 *
 *   - `messages`: each an object with a string role; content a string, null,
 *     or a list of {"type": "text", "text": ...} parts (joined); optional
 *     string name and tool_call_id; tool_calls kept as JSON text;
 *   - `chat_template_kwargs` (an object of more template variables) and
 *     `reasoning_effort` ("low" | "medium" | "high", the template's
 *     `reasoning_effort` variable unless the kwargs set it): the template's
 *     extra variables (sp_chat_params_t.extra_json).
 *
 * An error is a (param, message) pair for the caller's error shape.
 *
 * Threads: none of its own; a gather runs on whichever thread calls it (a
 * preparation worker) and touches only its arguments. Memory: the messages'
 * strings point into the JSON (role, name, tool_call_id) or into the
 * sp_chat_input_t's own stores (content, tool_calls); both must outlive the
 * messages' use. sp_chat_input_free releases what the gather allocated.
 */
#ifndef SP_API_CHAT_INPUT_H
#define SP_API_CHAT_INPUT_H

#include <stddef.h>

#include <jansson.h>

#include "core/jbuf.h"
#include "sampan/status.h"
#include "chat/chat.h"

typedef struct sp_chat_input {
    sp_chat_msg_t *msgs; /* n of them */
    size_t n;
    size_t *offs;        /* per message: content's and tool_calls' offsets in the stores */
    sp_jbuf_t store;     /* the contents, NUL-terminated */
    sp_jbuf_t tc;        /* the tool calls as JSON text, NUL-terminated */
} sp_chat_input_t;

/* Zero ci (an all-zero sp_chat_input_t is initialized too). */
void sp_chat_input_init(sp_chat_input_t *ci);

/* Check and gather `messages` (a non-empty JSON list, the caller checked)
 * into ci. SP_OK; SP_ERR_INVALID with *param ("messages") and err set;
 * SP_ERR_NOMEM (err says so, *param NULL). */
sp_status_t sp_chat_input_gather(sp_chat_input_t *ci, const json_t *messages, const char **param,
                                 char *err, size_t cap);

void sp_chat_input_free(sp_chat_input_t *ci);

/* The request's chat_template_kwargs and reasoning_effort (cheap type checks,
 * for the loop): *kwargs the object or NULL, *effort the string or NULL.
 * SP_OK, or SP_ERR_INVALID with *param and err set. */
sp_status_t sp_chat_input_options(const json_t *body, const json_t **kwargs, const char **effort,
                                  const char **param, char *err, size_t cap);

/* The template's extra variables from those options: *out a JSON object's
 * text (jansson's allocator: sp_jfree), or NULL when there are none.
 * SP_OK or SP_ERR_NOMEM. */
sp_status_t sp_chat_input_extra_json(const json_t *kwargs, const char *effort, char **out);

#endif /* SP_API_CHAT_INPUT_H */
