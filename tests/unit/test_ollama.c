/* test_ollama.c - the Ollama dialect's writers (api/ollama_chat.c): the one-shot
 * answer and the NDJSON stream lines, with thinking, tool calls and the
 * timings; the routes themselves are checked against the real server in
 * tests/py/test_ollama.py and with the ollama npm client. */
#include <string.h>

#include "test.h"

#include "core/json.h"
#include "core/timer.h"
#include "api/dialect.h"
#include "api/ollama.h"

#define NS_PER_S INT64_C(1000000000)

/* A JSON string's text, or "(null)" when it is not one. */
static const char *
jstr(const json_t *v)
{
    return json_is_string(v) ? json_string_value(v) : "(null)";
}

static json_t *
parse(const sp_jbuf_t *b)
{
    json_t *v = NULL;
    char err[256];
    if (b->p == NULL || sp_json_parse(b->p, b->len, 64, &v, err, sizeof err) != SP_OK) {
        return NULL;
    }
    return v;
}

/* A request 50 s old whose job ran 40 s and wrote its first token 10 s ago: seconds, so that
 * the time the test itself takes (e, below: ASan on a loaded host took over 30 ms) stays far
 * inside the bounds. */
static void
req_init(sp_dialect_req_t *d, sp_req_clock_t *c, int flags)
{
    int64_t now = sp_time_ns();
    memset(c, 0, sizeof *c);
    c->t0_ns = now - 50 * NS_PER_S;
    c->compute_ns = 40 * NS_PER_S;
    c->first_ns = now - 10 * NS_PER_S;
    memset(d, 0, sizeof *d);
    d->model = "\"m\"";
    d->n = 1;
    d->n_prompt = 7;
    d->flags = flags | (2 << SP_OLLAMA_LOAD_SHIFT); /* a 2 ms wait for the model */
    d->clk = c;
}

TEST(ollama_answer_chat_thinking_calls_timings)
{
    sp_dialect_req_t d;
    sp_req_clock_t c;
    req_init(&d, &c, 0);
    json_t *calls = NULL;
    char err[128];
    const char *ct = "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]";
    ASSERT_OK(sp_json_parse(ct, strlen(ct), 16, &calls, err, sizeof err));
    sp_dialect_choice_t ch = {.content = "Hi", .content_len = 2, .reasoning = "hmm",
                              .reasoning_len = 3, .calls = calls, .finish = SP_FINISH_STOP};
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_ollama_dialect.answer(&d, &ch, 1, 9, &b);
    json_t *v = parse(&b);
    ASSERT(v != NULL);
    ASSERT_STR_EQ(jstr(json_object_get(v, "model")), "m");
    const json_t *msg = json_object_get(v, "message");
    ASSERT_STR_EQ(jstr(json_object_get(msg, "role")), "assistant");
    ASSERT_STR_EQ(jstr(json_object_get(msg, "content")), "Hi");
    ASSERT_STR_EQ(jstr(json_object_get(msg, "thinking")), "hmm");
    const json_t *fn = json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function");
    ASSERT_STR_EQ(jstr(json_object_get(fn, "name")), "get_weather");
    ASSERT_STR_EQ(jstr(json_object_get(json_object_get(fn, "arguments"), "city")), "Paris");
    ASSERT(json_is_true(json_object_get(v, "done")));
    ASSERT_STR_EQ(jstr(json_object_get(v, "done_reason")), "stop");
    ASSERT_EQ(json_integer_value(json_object_get(v, "prompt_eval_count")), 7);
    ASSERT_EQ(json_integer_value(json_object_get(v, "eval_count")), 9);
    /* the clock's parts, all from one "now" (the write's), e the time since req_init:
     * total 50 s + e, load 2 ms, admission (now - 40 s) to the first token (start - 10 s)
     * 30 s - e, the first token to now 10 s + e: exact sums */
    int64_t total = json_integer_value(json_object_get(v, "total_duration"));
    int64_t load = json_integer_value(json_object_get(v, "load_duration"));
    int64_t pe = json_integer_value(json_object_get(v, "prompt_eval_duration"));
    int64_t ev = json_integer_value(json_object_get(v, "eval_duration"));
    ASSERT(total >= 50 * NS_PER_S && total < 80 * NS_PER_S); /* e < 30 s keeps pe positive */
    ASSERT_EQ(load, 2000000);
    ASSERT_EQ(pe + total, 80 * NS_PER_S);
    ASSERT_EQ(ev, total - 40 * NS_PER_S);
    json_decref(v);
    json_decref(calls);
    sp_jbuf_free(&b);
}

TEST(ollama_answer_generate_and_no_think)
{
    sp_dialect_req_t d;
    sp_req_clock_t c;
    req_init(&d, &c, SP_OLLAMA_GENERATE | SP_OLLAMA_NO_THINK);
    sp_dialect_choice_t ch = {.content = "Once", .content_len = 4, .reasoning = "x",
                              .reasoning_len = 1, .finish = SP_FINISH_LENGTH};
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_ollama_dialect.answer(&d, &ch, 1, 4, &b);
    json_t *v = parse(&b);
    ASSERT(v != NULL);
    ASSERT_STR_EQ(jstr(json_object_get(v, "response")), "Once");
    ASSERT(json_object_get(v, "message") == NULL);
    ASSERT(json_object_get(v, "thinking") == NULL); /* think false: left out */
    ASSERT_STR_EQ(jstr(json_object_get(v, "done_reason")), "length");
    json_decref(v);
    sp_jbuf_free(&b);
}

/* The lines of a stream: each one JSON object ending in "\n". */
static int
lines(const sp_jbuf_t *b, json_t **out, int cap)
{
    int n = 0;
    const char *p = b->p, *end = b->p + b->len;
    while (p < end && n < cap) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) {
            return -1; /* a line without its newline */
        }
        char err[128];
        if (sp_json_parse(p, (size_t)(nl - p), 64, &out[n], err, sizeof err) != SP_OK) {
            return -1;
        }
        n++;
        p = nl + 1;
    }
    return n;
}

TEST(ollama_stream_lines)
{
    sp_dialect_req_t d;
    sp_req_clock_t c;
    req_init(&d, &c, 0);
    json_t *calls = NULL;
    char err[128];
    const char *ct = "[{\"name\":\"f\",\"arguments\":{}}]";
    ASSERT_OK(sp_json_parse(ct, strlen(ct), 16, &calls, err, sizeof err));
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_ollama_dialect.stream_start(&d, &b);
    sp_ollama_dialect.stream_delta(&d, 0, SP_DIALECT_REASONING, "think", 5, NULL, &b);
    sp_ollama_dialect.stream_delta(&d, 0, SP_DIALECT_TEXT, "Hel", 3, NULL, &b);
    sp_ollama_dialect.stream_delta(&d, 0, SP_DIALECT_TEXT, "lo", 2, NULL, &b);
    sp_dialect_choice_t ch = {.calls = calls, .finish = SP_FINISH_LENGTH};
    sp_ollama_dialect.stream_finish(&d, &ch, &b);
    sp_ollama_dialect.stream_end(&d, 3, &b);
    json_t *l[8] = {0};
    ASSERT_EQ(lines(&b, l, 8), 5);
    ASSERT_STR_EQ(jstr(json_object_get(json_object_get(l[0], "message"), "thinking")), "think");
    ASSERT_STR_EQ(jstr(json_object_get(json_object_get(l[1], "message"), "content")), "Hel");
    ASSERT_STR_EQ(jstr(json_object_get(json_object_get(l[2], "message"), "content")), "lo");
    ASSERT(json_array_size(json_object_get(json_object_get(l[3], "message"), "tool_calls")) == 1);
    for (int i = 0; i < 4; i++) {
        ASSERT(json_is_false(json_object_get(l[i], "done")));
    }
    ASSERT(json_is_true(json_object_get(l[4], "done")));
    ASSERT_STR_EQ(jstr(json_object_get(l[4], "done_reason")), "length");
    ASSERT_EQ(json_integer_value(json_object_get(l[4], "eval_count")), 3);
    for (int i = 0; i < 5; i++) {
        json_decref(l[i]);
    }
    /* think false: the thinking deltas are not sent */
    sp_jbuf_reset(&b);
    d.flags |= SP_OLLAMA_NO_THINK;
    sp_ollama_dialect.stream_delta(&d, 0, SP_DIALECT_REASONING, "think", 5, NULL, &b);
    ASSERT_EQ((long long)b.len, 0);
    /* a failure mid-stream: one {"error"} line */
    sp_ollama_dialect.stream_error(&d, 500, "boom", &b);
    ASSERT_EQ(lines(&b, l, 8), 1);
    ASSERT_STR_EQ(jstr(json_object_get(l[0], "error")), "boom");
    json_decref(l[0]);
    json_decref(calls);
    sp_jbuf_free(&b);
}
