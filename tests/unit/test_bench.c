/* test_bench.c - the pure parts of `sampan bench` (src/bench/): the SSE event splitter fed
 * at every cut, the chunk scanner on OpenAI, vLLM and llama.cpp shaped events (and text that
 * looks like keys), the size bounds, and the statistics against NumPy's definitions. The
 * client itself runs against a real server in tests/py/test_bench_cli.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tools/sse.h"
#include "tools/stats.h"
#include "core/alloc.h"
#include "test.h"

typedef struct collect {
    char all[4096]; /* events joined with '|' */
    size_t len;
    int n;
} collect_t;

static int
collect_fn(const char *data, size_t len, void *ud)
{
    collect_t *c = ud;
    if (c->len + len + 1 < sizeof c->all) {
        memcpy(c->all + c->len, data, len);
        c->len += len;
        c->all[c->len++] = '|';
        c->all[c->len] = '\0';
    }
    c->n++;
    return 0;
}

TEST(sse_every_split)
{
    const char *body = "data: {\"a\":1}\n\n: ping\n\ndata:{\"b\":2}\r\n\r\nevent: x\nid: 7\n"
                       "data: line1\ndata: line2\n\ndata: [DONE]\n\n";
    const char *want = "{\"a\":1}|{\"b\":2}|line1\nline2|[DONE]|";
    size_t n = strlen(body);
    for (size_t cut1 = 0; cut1 <= n; cut1++) {
        for (size_t cut2 = cut1; cut2 <= n; cut2 += 3) {
            sp_sse_reader_t r;
            ASSERT_OK(sp_sse_reader_init(&r, 1 << 16));
            collect_t c;
            memset(&c, 0, sizeof c);
            ASSERT_EQ(sp_sse_feed(&r, body, cut1, collect_fn, &c), 0);
            ASSERT_EQ(sp_sse_feed(&r, body + cut1, cut2 - cut1, collect_fn, &c), 0);
            ASSERT_EQ(sp_sse_feed(&r, body + cut2, n - cut2, collect_fn, &c), 0);
            ASSERT_EQ(sp_sse_finish(&r, collect_fn, &c), 0);
            ASSERT_STR_EQ(c.all, want);
            ASSERT_EQ(c.n, 4);
            sp_sse_reader_free(&r);
        }
    }
}

TEST(sse_unterminated_and_bounds)
{
    sp_sse_reader_t r;
    ASSERT_OK(sp_sse_reader_init(&r, 4096));
    collect_t c;
    memset(&c, 0, sizeof c);
    /* The last event without its blank line (or even its LF) is dispatched at the end. */
    ASSERT_EQ(sp_sse_feed(&r, "data: x", 7, collect_fn, &c), 0);
    ASSERT_EQ(sp_sse_finish(&r, collect_fn, &c), 0);
    ASSERT_STR_EQ(c.all, "x|");
    /* A line longer than the bound is an error, whatever the pieces. */
    static char big[5000];
    memset(big, 'a', sizeof big);
    sp_sse_reader_reset(&r);
    ASSERT_EQ(sp_sse_feed(&r, big, 3000, collect_fn, &c), 0);
    ASSERT_EQ(sp_sse_feed(&r, big, 2000, collect_fn, &c), -1);
    /* So is an event made of many short data lines. */
    sp_sse_reader_reset(&r);
    int rc = 0;
    for (int i = 0; i < 1000 && rc == 0; i++) {
        rc = sp_sse_feed(&r, "data: 0123456789\n", 17, collect_fn, &c);
    }
    ASSERT_EQ(rc, -1);
    sp_sse_reader_free(&r);
}

TEST(sse_scan_chunks)
{
    sp_sse_event_t e;
    const char *s = "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
                    "\"text\":\" there\",\"logprobs\":null,\"finish_reason\":null}]}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(e.has_text && !e.error && !e.done);
    ASSERT_EQ(e.completion_tokens, -1);
    s = "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(!e.has_text); /* the role-only first chat chunk is not the first token */
    s = "{\"choices\":[{\"delta\":{\"content\" : \"Hi\"}}]}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(e.has_text);
    s = "{\"choices\":[{\"delta\":{\"content\":null,\"reasoning_content\":\"x\"}}]}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(!e.has_text);
    /* Generated text that looks like keys: quotes inside strings are escaped. */
    s = "{\"choices\":[{\"text\":\"\",\"x\":\"\\\"text\\\":\\\"a\\\" \\\"usage\\\":{\\\"completion_tokens\\\":9}\"}]}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(!e.has_text);
    ASSERT_EQ(e.completion_tokens, -1);
    s = "{\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"completion_tokens\":128,"
        "\"total_tokens\":192}}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(!e.has_text);
    ASSERT_EQ(e.prompt_tokens, 64);
    ASSERT_EQ(e.completion_tokens, 128);
    s = " [DONE] ";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(e.done);
    s = "{ \"error\": {\"message\": \"boom\", \"type\": \"server_error\"}}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(e.error);
    s = "{\"choices\":[{\"text\":\"error\"}]}";
    sp_sse_scan(s, strlen(s), &e);
    ASSERT(!e.error && e.has_text);
    /* Truncated and empty data never read past the end. */
    for (size_t n = 0; n < strlen(s); n++) {
        sp_sse_scan(s, n, &e);
    }
    sp_sse_scan("", 0, &e);
    ASSERT(!e.has_text && !e.done && !e.error);
}

TEST(stats_numpy)
{
    /* np.percentile([1,2,3,4,10], [50,90,95,99]) = 3, 7.6, 8.8, 9.76; np.std = 3.1622776... */
    double x[] = {10, 3, 1, 4, 2};
    sp_stats_t s;
    sp_stats_compute(x, 5, &s);
    ASSERT(fabs(s.mean - 4.0) < 1e-12);
    ASSERT(fabs(s.median - 3.0) < 1e-12);
    ASSERT(fabs(s.std - sqrt(10.0)) < 1e-12);
    ASSERT(fabs(s.pct[0] - 3.0) < 1e-12);
    ASSERT(fabs(s.pct[1] - 7.6) < 1e-12);
    ASSERT(fabs(s.pct[2] - 8.8) < 1e-12);
    ASSERT(fabs(s.pct[3] - 9.76) < 1e-12);
    ASSERT(s.min == 1 && s.max == 10);
    double even[] = {4, 1, 3, 2};
    sp_stats_compute(even, 4, &s);
    ASSERT(fabs(s.median - 2.5) < 1e-12);
    sp_stats_compute(NULL, 0, &s);
    ASSERT(s.n == 0 && s.mean == 0 && s.pct[3] == 0);
    double one[] = {7};
    sp_stats_compute(one, 1, &s);
    ASSERT(s.median == 7 && s.pct[3] == 7 && s.std == 0);
}
