/* test_log.c - log lines: value quoting, the JSON translation, control bytes, the rate limit
 * on repeated warnings, and the masking of prompts (serving/metrics.h). */
#include <time.h>
#include <unistd.h>

#include "sampan/log.h"
#include "serving/mask.h"
#include "serving/metrics.h"
#include "test.h"

#define CAP_LINES 64
static char cap_line[CAP_LINES][512];
static int cap_n;

static void
capture(sp_log_level_t level, const char *line, void *ud)
{
    (void)level;
    (void)ud;
    if (cap_n < CAP_LINES) {
        snprintf(cap_line[cap_n++], sizeof cap_line[0], "%s", line);
    }
}

TEST(log_str_bare_or_quoted)
{
    ASSERT_STR_EQ(sp_log_str("stories260K"), "stories260K");
    ASSERT_STR_EQ(sp_log_str("a/b.gguf"), "a/b.gguf");
    ASSERT_STR_EQ(sp_log_str("two words"), "\"two words\"");
    ASSERT_STR_EQ(sp_log_str("say \"hi\"\\"), "\"say \\\"hi\\\"\\\\\"");
    ASSERT_STR_EQ(sp_log_str("line\r\nevent=forged"), "\"line\\u000d\\u000aevent=forged\"");
    ASSERT_STR_EQ(sp_log_str(""), "\"\"");
    ASSERT_STR_EQ(sp_log_str("caf\xc3\xa9 \xff"), "\"caf\xc3\xa9 \\ufffd\"");
    ASSERT_STR_EQ(sp_log_str(NULL), "\"\"");
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    big[5] = ' ';
    const char *q = sp_log_str(big);
    ASSERT(strlen(q) < 1100);
    ASSERT(strcmp(q + strlen(q) - 4, "...\"") == 0);
}

TEST(log_control_bytes_never_split_a_line)
{
    cap_n = 0;
    sp_log_set(capture, NULL);
    SP_LOG_INFO("event=x raw=%s", "a\nb\rc");
    sp_log_set(NULL, NULL);
    ASSERT_EQ(cap_n, 1);
    ASSERT(strchr(cap_line[0], '\n') == NULL && strchr(cap_line[0], '\r') == NULL);
    ASSERT(strstr(cap_line[0], "a\\x0ab\\x0dc") != NULL);
}

TEST(log_to_json)
{
    char out[1024];
    sp_log_to_json("T", "info",
                   "event=request rid=ab-1 status=200 ms=1.5 neg=-3 path=\"/v1 x\" bad=\"a\\x01\" "
                   "word=v1.2.3 loose text",
                   out, sizeof out);
    ASSERT_STR_EQ(out, "{\"ts\":\"T\",\"level\":\"info\",\"event\":\"request\",\"rid\":\"ab-1\","
                       "\"status\":200,\"ms\":1.5,\"neg\":-3,\"path\":\"/v1 x\","
                       "\"bad\":\"\\\"a\\\\x01\\\"\",\"word\":\"v1.2.3\",\"msg\":\"loose text\"}");
}

TEST(log_rate_limit_repeated_warnings)
{
    cap_n = 0;
    sp_log_set(capture, NULL);
    sp_log_set_rate_limit(3, 1);
    for (int i = 0; i < 10; i++) {
        SP_LOG_WARN("event=disk_full n=%d", i);
    }
    SP_LOG_WARN("event=other n=1");
    SP_LOG_INFO("event=disk_full n=99"); /* info is never limited */
    ASSERT_EQ(cap_n, 5);
    sleep(2);
    SP_LOG_WARN("event=disk_full n=10");
    sp_log_set(NULL, NULL);
    sp_log_set_rate_limit(10, 10);
    ASSERT_EQ(cap_n, 7);
    ASSERT(strstr(cap_line[5], "event=log_suppressed repeated_event=disk_full count=7") != NULL);
    ASSERT(strstr(cap_line[6], "n=10") != NULL);
}

TEST(mask_text)
{
    char out[256];
    const char *in = "mail bob.smith+x@mail.example.org, card 4111 1111 1111 1111, "
                     "call +1 (555) 123-4567 or 555.123.4567; order 12345 of 2024; a@b";
    sp_mask_text(in, strlen(in), out, sizeof out);
    ASSERT_STR_EQ(out, "mail [email], card [card], call [phone] or [phone]; order 12345 of 2024; a@b");
    sp_mask_text("4111-1111-1111-1111", 19, out, sizeof out);
    ASSERT_STR_EQ(out, "[card]");
    /* never writes past cap */
    char small[8];
    size_t n = sp_mask_text("hello world", 11, small, sizeof small);
    ASSERT(n < sizeof small && strlen(small) == n);
}

/* Every line of tests/data/mask/corpus.tsv: input, tab, the masked text
 * ("\n" in either stands for a newline). All mismatches are reported before
 * the test fails, so one run shows every pattern that needs work. */
static void
unescape_nl(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] == 'n') {
            *w++ = '\n';
            r++;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

TEST(mask_corpus)
{
    FILE *f = fopen("tests/data/mask/corpus.tsv", "r");
    ASSERT(f != NULL);
    char line[1024], out[1024];
    int cases = 0, bad = 0, positives = 0, negatives = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0') {
            continue;
        }
        char *tab = strchr(line, '\t');
        ASSERT(tab != NULL);
        *tab = '\0';
        char *want = tab + 1;
        unescape_nl(line);
        unescape_nl(want);
        sp_mask_text(line, strlen(line), out, sizeof out);
        cases++;
        if (strcmp(line, want) == 0) {
            negatives++;
        } else {
            positives++;
        }
        if (strcmp(out, want) != 0) {
            fprintf(stderr, "  mask: \"%s\"\n    got  \"%s\"\n    want \"%s\"\n", line, out, want);
            bad++;
        }
    }
    fclose(f);
    ASSERT(positives >= 30 && negatives >= 10);
    ASSERT_EQ(bad, 0);
    (void)cases;
}

/* Nothing of a secret survives, whatever follows it: the key's tail is not
 * left beside the label (each match is replaced whole). */
TEST(mask_whole_matches)
{
    char out[256];
    const char *in = "k=sk-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789;";
    sp_mask_text(in, strlen(in), out, sizeof out);
    ASSERT_STR_EQ(out, "k=[key];");
    in = "4111 1111 1111 1111 12 2025";
    sp_mask_text(in, strlen(in), out, sizeof out);
    ASSERT(strstr(out, "4111") == NULL && strstr(out, "1111") == NULL);
    /* an empty text, and a tiny buffer */
    ASSERT_EQ(sp_mask_text("", 0, out, sizeof out), 0);
    ASSERT_STR_EQ(out, "");
    char small[4];
    size_t n = sp_mask_text("AKIAIOSFODNN7EXAMPLE", 20, small, sizeof small);
    ASSERT(n < sizeof small && strlen(small) == n);
}

/* Texts built to make the patterns work hard (long runs of what almost
 * matches) finish quickly and are masked, not withheld: the match limit
 * that would withhold them is far above what 256 bytes need. */
TEST(mask_adversarial_inputs)
{
    static const char *const units[] = {"a.",   "a@",  "1 ",  "1-",  "-----BEGIN A-----", "eyJa.",
                                        "+1 ",  "(12)", "AB12 ", "sk-", "9",               "Bearer "};
    char in[SP_REQ_TEXT_MAX + 1], out[4 * SP_REQ_TEXT_MAX];
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t n = 0, l = strlen(units[u]);
        while (n + l <= SP_REQ_TEXT_MAX) {
            memcpy(in + n, units[u], l);
            n += l;
        }
        in[n] = '\0';
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        sp_mask_text(in, n, out, sizeof out);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (ms > 250 || strstr(out, "withheld") != NULL) {
            SP_TEST_FAIL("unit \"%s\": %.1f ms, %s", units[u], ms, out);
        }
    }
}
