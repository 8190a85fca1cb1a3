/*
 * dialect.h - the output dialects of the chat pipeline: one request
 * pipeline (openai.c: parse, prepare on a worker, schedule, account, trace,
 * log), several wire shapes for what it answers.
 *
 * A route that speaks another API (Anthropic's /v1/messages, Ollama's
 * /api/chat, ...) translates its request into the chat parameters (an
 * OpenAI chat body: messages, tools, tool_choice, stop, max_tokens, ...) and
 * runs sp_api_chat_run with its dialect. Every byte the client then gets -
 * the one-shot answer, a stream's frames, an error - comes from the
 * dialect's functions below; everything else (scheduler, tenants, quotas,
 * metrics, tracing, the access log, the response cache) is shared.
 *
 * The pipeline calls the functions in this order:
 *
 *   one-shot:  answer                                  (or error)
 *   streamed:  stream_start, then per choice any number of
 *              stream_delta (text or reasoning, in the order written),
 *              stream_finish (the choice's tool calls and its end),
 *              then stream_end once (usage, the closing frame)
 *              - or stream_error after any of them when the job failed;
 *   counting:  count (the prompt's tokens, nothing generated).
 *
 * Each writer appends whole frames (zero or more) to `out`, which the
 * pipeline sends as one write: SSE frames ("event: NAME\ndata: JSON\n\n",
 * sp_dialect_sse_*) or NDJSON lines ("JSON\n", sp_dialect_ndjson_end) as the
 * dialect's stream_type says. A dialect keeps what it must remember between
 * frames (the open content block, how many it opened, the stop reason) in
 * the request's sp_dialect_req_t, which the pipeline zeroes and never reads.
 *
 * Errors: sp_api_error (api.h) writes the error shape of the dialect whose
 * path prefix the request's path has (sp_api_dialect_for_path), so answers
 * from shared code (authentication, an unknown model, a full queue, a bad
 * body) come in the client's shape too.
 *
 * Translation (sp_dialect_tx_t, below): the record and helpers every
 * translator of another API's request into the chat parameters shares.
 *
 * Threads: loop threads only, on the request's own loop. Memory: the writers
 * keep nothing beyond the call but what they store in sp_dialect_req_t;
 * strings they are given live until the call returns.
 */
#ifndef SP_API_DIALECT_H
#define SP_API_DIALECT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "core/jbuf.h"
#include "engine/gen.h"
#include "sampan/status.h"
#include "http/router.h"
#include "sched/sched.h"
#include "serving/metrics.h"
#include "serving/serving.h"

typedef enum sp_dialect_part {
    SP_DIALECT_TEXT = 1, /* the answer's text (content) */
    SP_DIALECT_REASONING, /* the model's thinking (reasoning_content, thinking blocks) */
} sp_dialect_part_t;

/* A request as its dialect sees it: set by the pipeline before the first
 * writer runs, except the fields marked "dialect's" (zero until it writes them). */
typedef struct sp_dialect_req {
    const char *id;          /* the answer's id ("chatcmpl-...", "msg_...") */
    int64_t created;         /* unix seconds */
    const char *model;       /* the model name as the answer reports it, JSON-quoted */
    uint64_t req_id;         /* the HTTP request's id (derive call ids from it) */
    int n;                   /* choices (1 unless the request asked for more) */
    int64_t n_prompt;        /* prompt tokens */
    bool include_usage;      /* a stream ends with usage (OpenAI's stream_options) */
    bool logprobs;           /* log-probabilities were asked for */
    bool one_call;           /* at most one tool call per answer (the first one) */
    /* dialect's: the stream's state */
    int part;                /* the open part (sp_dialect_part_t, or a dialect's own), 0 = none */
    int n_parts;             /* parts opened so far (content block indices) */
    int flags;               /* the dialect's own bits */
    const char *reason;      /* the stop reason stream_finish saw, for stream_end */
    const char *stop_seq;    /* the stop string that ended the answer, or NULL */
    void *ud;                /* the dialect's own state for this request (sp_api_chat_run_ud),
                                released by the dialect's `release` when the request ends */
    const sp_req_clock_t *clk; /* the request's clock (metrics.h), for timings: complete
                                  (queue, compute, first token) when answer / stream_end run */
    /* With sp_api_chat_opts_t.keep_tokens: the prompt's token ids (as evaluated) and
     * those choice 0 generated (an end-of-generation token left out), complete when
     * answer / stream_end run; NULL otherwise. */
    const int32_t *prompt_ids;
    int64_t n_prompt_ids;
    const int32_t *gen_ids;
    int64_t n_gen_ids;
} sp_dialect_req_t;

/* One finished choice. Strings are not NUL-terminated; len 0 = none. */
typedef struct sp_dialect_choice {
    int index;
    const char *content;
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
    const json_t *calls;     /* tool calls [{"name": str, "arguments": {...}}], or NULL */
    sp_finish_t finish;      /* STOP or LENGTH */
    const char *stop_seq;    /* the stop string that ended it (STOP), or NULL */
    const char *logprobs;    /* OpenAI chat logprobs "content" entries, joined; NULL = none */
    size_t logprobs_len;
} sp_dialect_choice_t;

typedef struct sp_api_dialect {
    const char *name;        /* "openai/chat", "anthropic/messages": the response cache's key */
    const char *stream_type; /* the stream's Content-Type */
    const char *id_prefix;   /* answer ids: id_prefix, id_sep, 16 hex digits (sp_dialect_id) */
    char id_sep;
    bool max_is_ceiling;     /* max_tokens past the context's room is cut to it, not refused */
    bool no_cache;           /* never answered from the response cache (each answer is new:
                                the Responses API stores it under its own id) */
    void (*answer)(sp_dialect_req_t *q, const sp_dialect_choice_t *c, int n,
                   int64_t completion_tokens, sp_jbuf_t *out);
    void (*stream_start)(sp_dialect_req_t *q, sp_jbuf_t *out);
    /* ev: the token's event when this text is one token's (its logprobs), else NULL */
    void (*stream_delta)(sp_dialect_req_t *q, int index, sp_dialect_part_t part, const char *text,
                         size_t len, const sp_sched_event_t *ev, sp_jbuf_t *out);
    /* c: the whole choice as parsed at its end (content and reasoning as
     * already streamed; calls not streamed yet) */
    void (*stream_finish)(sp_dialect_req_t *q, const sp_dialect_choice_t *c, sp_jbuf_t *out);
    void (*stream_end)(sp_dialect_req_t *q, int64_t completion_tokens, sp_jbuf_t *out);
    void (*stream_error)(sp_dialect_req_t *q, int status, const char *message, sp_jbuf_t *out);
    /* The prompt's token count (a count-only request); NULL: the dialect has no such route. */
    void (*count)(sp_dialect_req_t *q, int64_t n_prompt, sp_jbuf_t *out);
    /* An error answer's body. type/param/code: OpenAI's words, or NULL. */
    void (*error)(sp_jbuf_t *out, int status, const char *type, const char *param,
                  const char *code, const char *message);
    /* Release sp_dialect_req_t.ud (NULL: the dialect passes none). Called once,
     * also when the request failed before any writer ran. */
    void (*release)(void *ud);
} sp_api_dialect_t;

/* The dialects (openai.c, anthropic.c, ollama_chat.c). */
extern const sp_api_dialect_t sp_openai_chat_dialect;
extern const sp_api_dialect_t sp_anthropic_dialect;
extern const sp_api_dialect_t sp_ollama_dialect;
extern const sp_api_dialect_t sp_responses_dialect; /* responses.c */

/* A dialect's routes own the paths under prefix (a static string): their
 * errors take its shape. Call while registering routes (one thread, before
 * the loops start); at most 8 prefixes. */
void sp_api_dialect_claim(const char *prefix, const sp_api_dialect_t *d);
/* The dialect whose routes own this path, or NULL for OpenAI's shape. */
const sp_api_dialect_t *sp_api_dialect_for_path(sp_str_t path);

/* Run a chat request (openai.c): `body` is an OpenAI chat body (the caller
 * keeps its reference; the pipeline takes its own), `retry` the route to run
 * again while the model loads on demand. count_only: render and tokenize,
 * answer d->count, generate nothing. flags: the dialect's own bits, as
 * sp_dialect_req_t.flags starts. The request is answered on every path. */
void sp_api_chat_run(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p,
                     sp_route_fn retry, json_t *body, const sp_api_dialect_t *d, bool count_only,
                     int flags);

/* sp_api_chat_run with the dialect's own state: ud becomes
 * sp_dialect_req_t.ud and is released by d->release on every path. */
void sp_api_chat_run_ud(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p,
                        sp_route_fn retry, json_t *body, const sp_api_dialect_t *d,
                        bool count_only, int flags, void *ud);

/* What a dialect may ask beyond an OpenAI chat body (Ollama's /api/generate). */
typedef struct sp_api_chat_opts {
    const char *raw_prompt;  /* non-NULL: this text is the prompt, as is (no chat template;
                                special tokens in it are recognised); the body's messages
                                only say whether there is one (non-empty) */
    size_t raw_len;
    const json_t *context;   /* token ids (a JSON list of integers) put before the prompt,
                                or NULL; the prompt then starts without a BOS */
    bool keep_tokens;        /* fill sp_dialect_req_t's prompt_ids and gen_ids */
    const char *fim_suffix;  /* non-NULL (with raw_prompt, the prefix): fill-in-the-middle,
                                as /v1/completions' suffix (400 for a model without FIM tokens) */
    size_t fim_suffix_len;
} sp_api_chat_opts_t;

/* sp_api_chat_run with those options (o may be NULL); the body must carry
 * what they change (raw, context) so the response cache tells requests apart. */
void sp_api_chat_run_opts(sp_serving_t *s, sp_http_req_t *r, const sp_route_params_t *p,
                          sp_route_fn retry, json_t *body, const sp_api_dialect_t *d, int flags,
                          const sp_api_chat_opts_t *o);

/* An id "<prefix><sep><16 hex digits>" from seed (mixed with the clock). */
void sp_dialect_id(char *buf, size_t cap, const char *prefix, char sep, uint64_t seed);

/* ---- translating another API's request into the chat parameters
 *
 * A translator (anthropic.c, responses.c, ollama_chat.c) builds an OpenAI
 * chat body from its API's request in one sp_dialect_tx_t, which also holds
 * the first refusal: the status, the field at fault and why. The helpers
 * below return 0, or -1 with the record's refusal set, so a translator's
 * steps chain with `!= 0` checks. */
typedef struct sp_dialect_tx {
    json_t *out;        /* the chat body */
    json_t *msgs;       /* its "messages", for translators that append as they go */
    int status;         /* the refusal's HTTP status: 400 (a bad field), 404, 503 (out of memory) */
    const char *param;  /* the field at fault, or NULL */
    char msg[512];      /* why */
    int flags;          /* the dialect's bits for the request (sp_dialect_req_t.flags) */
    void *ud;           /* the translator's own state for the request */
} sp_dialect_tx_t;

/* Refuse the request: status, param and the message. Returns -1. */
int sp_dialect_fail(sp_dialect_tx_t *tx, int status, const char *param, const char *fmt, ...)
    SP_PRINTF(4, 5);
/* Out of memory (503, no field). Returns -1. */
int sp_dialect_nomem(sp_dialect_tx_t *tx);
/* Set obj[key] to v (a new reference, taken even on failure; NULL counts as
 * out of memory). 0 or -1. */
int sp_dialect_set(sp_dialect_tx_t *tx, json_t *obj, const char *key, json_t *v);

/* The parts one API allows in a content that is "a string or a list of text
 * parts", for sp_dialect_text_parts. Lists end with NULL. */
typedef struct sp_dialect_parts {
    const char *param;          /* the request field refusals name ("messages", "input") */
    const char *noun;           /* the API's word for such a list ("text blocks", "content parts") */
    const char *const *text;    /* part types whose text is under "text"; the first is suggested */
    const char *refusal;        /* a part type whose text is under its own name, or NULL */
    const char *const *media;   /* part types refused because no served model reads them */
    const char *media_kinds;    /* what those are, for the refusal ("images or documents") */
    const char *accepted;       /* the accepted types, for the refusal of any other */
} sp_dialect_parts_t;

/* content (a string, or a list of the text part types in pt) as chat text
 * parts [{"type": "text", "text": ...}] in *out (a new list, or NULL; the
 * caller releases it on every path). where names the content in refusals
 * ("system", "input[2].content"), which are 400s naming pt->param. */
int sp_dialect_text_parts(sp_dialect_tx_t *tx, const json_t *content, const char *where,
                          const sp_dialect_parts_t *pt, json_t **out);

/* Framing. SSE: sp_dialect_sse_begin (event NULL: no "event:" line), the
 * JSON, sp_dialect_sse_end. NDJSON: the JSON, sp_dialect_ndjson_end. */
void sp_dialect_sse_begin(sp_jbuf_t *out, const char *event);
void sp_dialect_sse_end(sp_jbuf_t *out);
void sp_dialect_ndjson_end(sp_jbuf_t *out);

#endif /* SP_API_DIALECT_H */
