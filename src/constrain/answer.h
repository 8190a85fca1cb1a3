/*
 * answer.h - a chat model's answer taken apart: its thinking (reasoning
 * content), the text for the user (content) and its tool calls, in the
 * conventions of the model's template family (sp_chat_reasoning_t and
 * sp_chat_tools_t in chat.h).
 *
 * One function serves the whole answer and every prefix of it while it
 * streams: parsed with `partial`, a prefix gives reasoning and content that
 * are prefixes of what the whole answer gives (a marker that may be starting
 * at the end - "<thi", "<tool_" - is held back, a call that has started
 * waits for the end). So a stream sends, at each token, what the reasoning
 * and content grew by, and the concatenated deltas equal the one-shot parse.
 *
 * Threads: pure functions of their arguments. Memory: an sp_answer_t owns
 * its buffers and calls (sp_answer_free).
 */
#ifndef SP_CONSTRAIN_ANSWER_H
#define SP_CONSTRAIN_ANSWER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "chat/chat.h"
#include "core/jbuf.h"

typedef struct sp_answer_fmt {
    sp_chat_tools_t tools;         /* how calls are written */
    sp_chat_reasoning_t reasoning; /* how thinking is written */
    bool parse_tools;              /* tools were offered: look for calls */
    const json_t *tool_list;       /* the request's tools (parameter types), or NULL */
    bool inline_reasoning;         /* keep the thinking in content, markup and all
                                      (reasoning_format "none") */
    bool think_open;               /* the prompt ends inside the thinking block
                                      (sp_answer_opens_thinking): the answer starts
                                      in it, with no open tag */
} sp_answer_fmt_t;

typedef struct sp_answer {
    sp_jbuf_t reasoning; /* raw bytes (not JSON-escaped); .oom on allocation failure */
    sp_jbuf_t content;
    json_t *calls;       /* whole answer only: NULL or [{"name", "arguments": {..}}, ..] */
    bool in_call;        /* partial only: a call has started */
} sp_answer_t;

/* Parse text[0, len) into *a (zero-initialised or freed before). */
void sp_answer_parse(const sp_answer_fmt_t *f, const char *text, size_t len, bool partial,
                     sp_answer_t *a);
void sp_answer_free(sp_answer_t *a);

/* True when the rendered prompt ends (blanks aside) with format r's open
 * tag, so the model starts inside its thinking (QwQ, DeepSeek-R1 templates
 * end the generation prompt with "<think>\n"). */
bool sp_answer_opens_thinking(sp_chat_reasoning_t r, const char *prompt, size_t len);

/* Format r's thinking markers as the parser reads them (static strings);
 * false when r wraps no thinking in a pair of markers (none, harmony). */
bool sp_answer_think_markers(sp_chat_reasoning_t r, const char **open, const char **close);

#endif /* SP_CONSTRAIN_ANSWER_H */
