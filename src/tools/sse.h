/*
 * sse.h - reading an OpenAI-style server-sent event stream, for `sampan bench`.
 *
 * Two pieces, both free of the network so the unit tests drive them:
 *
 * - sp_sse_reader_t splits a response body (any cut into pieces) into events:
 *   lines end with LF or CRLF, "data:" lines of one event are joined with LF,
 *   a blank line dispatches the event, other fields and comments (":...") are
 *   ignored. Lines and events are bounded (max bytes, set at init): a longer one
 *   is an error, so a hostile server cannot make the client grow without end.
 *
 * - sp_sse_scan looks at one event's data for what a benchmark needs, without
 *   building a JSON tree per token (the client shares the CPU with the server it
 *   measures): whether it carries generated text, an error, [DONE], and the
 *   token counts of a usage object. It matches keys as `"name"` followed by a
 *   colon; inside a JSON string a quote is always escaped, so a key pattern
 *   cannot be matched by generated text.
 */
#ifndef SP_TOOLS_SSE_H
#define SP_TOOLS_SSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

typedef struct sp_sse_event {
    bool done;                 /* data: [DONE] */
    bool error;                /* {"error": ...} at the top level */
    bool has_text;             /* a non-empty "text" (completions) or "content" (chat) string */
    int64_t prompt_tokens;     /* usage.prompt_tokens, -1 when absent */
    int64_t completion_tokens; /* usage.completion_tokens, -1 when absent */
} sp_sse_event_t;

void sp_sse_scan(const char *data, size_t len, sp_sse_event_t *ev);

/* Called with each complete event's data (joined "data:" lines); return
 * non-zero to stop feeding (sp_sse_feed then returns 1). */
typedef int (*sp_sse_event_fn)(const char *data, size_t len, void *ud);

typedef struct sp_sse_reader {
    char *line;       /* the unfinished line, at most max bytes */
    size_t line_len, line_cap;
    char *data;       /* the unfinished event's data, at most max bytes */
    size_t data_len, data_cap;
    size_t max;
    bool has_data;    /* a data: field was seen since the last dispatch */
} sp_sse_reader_t;

sp_status_t sp_sse_reader_init(sp_sse_reader_t *r, size_t max_bytes);
void sp_sse_reader_free(sp_sse_reader_t *r);
/* Forget any partial line or event (a new response on the same connection). */
void sp_sse_reader_reset(sp_sse_reader_t *r);
/* Feed body bytes. Returns 0, 1 when fn asked to stop, or -1 when a line or an
 * event is longer than max_bytes (or memory ran out). */
int sp_sse_feed(sp_sse_reader_t *r, const char *buf, size_t len, sp_sse_event_fn fn, void *ud);
/* End of the body: dispatch an event whose blank line never came. Same returns. */
int sp_sse_finish(sp_sse_reader_t *r, sp_sse_event_fn fn, void *ud);

#endif /* SP_TOOLS_SSE_H */
