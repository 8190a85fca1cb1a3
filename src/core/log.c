/*
 * log.c - the default stderr sink, the key=value and JSON line formats, value
 * quoting, and the rate limit on repeated warnings and errors.
 *
 * A call site writes `event=name key=value ...`; values that come from
 * outside (model names, paths, error texts) go through sp_log_str, which
 * leaves a plain token bare and writes anything else as a JSON string. So a
 * line always splits into fields the same way, whatever the data, and the
 * JSON format is a mechanical translation of it. Control bytes that still
 * reach the sink are escaped, so a CRLF smuggled into a model name or URL
 * cannot forge a log line (CWE-117).
 */
#include "sampan/log.h"
#include "core/utf8.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

sp_log_level_t sp__log_level = SP_LOG_LEVEL_INFO;
static sp_log_cb sink;
static void *sink_data;
static sp_log_format_t format = SP_LOG_FORMAT_KV;

static const char *level_names[] = {"debug", "info", "warn", "error", "none"};

void
sp_log_set(sp_log_cb cb, void *user_data)
{
    sink = cb;
    sink_data = user_data;
}

void
sp_log_set_level(sp_log_level_t level)
{
    sp__log_level = level;
}

void
sp_log_set_format(sp_log_format_t f)
{
    format = f;
}

/* ---------------------------------------------------------------- quoting */

size_t
sp_log_quote_into(char *out, size_t cap, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t j = 0;
    if (cap < 8) {
        if (cap) {
            out[0] = '\0';
        }
        return 0;
    }
    out[j++] = '"';
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (j + 12 >= cap) { /* room for an escape, "...", the quote and NUL */
            memcpy(out + j, "...", 3);
            j += 3;
            break;
        }
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            out[j++] = '\\';
            out[j++] = (char)c;
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(out + j, "\\u00", 4);
            out[j + 4] = hex[c >> 4];
            out[j + 5] = hex[c & 15];
            j += 6;
            i++;
        } else if (c < 0x80) {
            out[j++] = (char)c;
            i++;
        } else {
            size_t l = sp_utf8_seq(p + i, n - i);
            if (l == 0) {
                memcpy(out + j, "\\ufffd", 6); /* invalid UTF-8 */
                j += 6;
                i++;
            } else {
                memcpy(out + j, p + i, l);
                j += l;
                i += l;
            }
        }
    }
    out[j++] = '"';
    out[j] = '\0';
    return j;
}

static bool
bare_ok(const char *s, size_t n)
{
    if (n == 0 || n > 256) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-' || c == ':' || c == '/' || c == '@' || c == '+' ||
                  c == ',';
        if (!ok) {
            return false;
        }
    }
    return true;
}

#define QUOTE_RING 8
#define QUOTE_CAP 1100

const char *
sp_log_str_n(const char *s, size_t n)
{
    static _Thread_local char ring[QUOTE_RING][QUOTE_CAP];
    static _Thread_local unsigned next;
    char *b = ring[next++ % QUOTE_RING];
    if (s == NULL) {
        return "\"\"";
    }
    if (bare_ok(s, n)) {
        memcpy(b, s, n);
        b[n] = '\0';
        return b;
    }
    sp_log_quote_into(b, QUOTE_CAP, s, n);
    return b;
}

const char *
sp_log_str(const char *s)
{
    return sp_log_str_n(s, s ? strlen(s) : 0);
}

/* ------------------------------------------------------------ rate limit */

/* Warnings and errors with the same event name: at most rl_burst per
 * rl_window_s seconds; the rest are counted and reported once the window
 * ends, so a failing disk or a flood of bad requests cannot fill the log. */
#define RL_SLOTS 32
static int rl_burst = 10;
static int rl_window_s = 10;

typedef struct rl_slot {
    char key[48];
    time_t window;
    int count;
    long suppressed;
} rl_slot_t;

static pthread_mutex_t rl_mu = PTHREAD_MUTEX_INITIALIZER;
static rl_slot_t rl[RL_SLOTS];

static void emit(sp_log_level_t level, const char *line);

/* The event name of a line (the value of its first event= field). */
static size_t
event_name(const char *line, char *out, size_t cap)
{
    const char *e = strstr(line, "event=");
    if (e == NULL || (e != line && e[-1] != ' ')) {
        snprintf(out, cap, "%.*s", (int)(cap - 1), line);
        return strlen(out);
    }
    e += 6;
    size_t n = strcspn(e, " ");
    if (n >= cap) {
        n = cap - 1;
    }
    memcpy(out, e, n);
    out[n] = '\0';
    return n;
}

void
sp_log_set_rate_limit(int burst, int window_s)
{
    pthread_mutex_lock(&rl_mu);
    rl_burst = burst;
    rl_window_s = window_s;
    memset(rl, 0, sizeof rl);
    pthread_mutex_unlock(&rl_mu);
}

/* true: write the line. May first write a line about what was suppressed. */
static bool
rate_ok(sp_log_level_t level, const char *line)
{
    if (level < SP_LOG_LEVEL_WARN) {
        return true;
    }
    char key[48];
    event_name(line, key, sizeof key);
    time_t now = time(NULL);
    char note[160] = "";
    bool ok;
    pthread_mutex_lock(&rl_mu);
    rl_slot_t *slot = NULL, *oldest = &rl[0];
    for (int i = 0; i < RL_SLOTS; i++) {
        if (strcmp(rl[i].key, key) == 0) {
            slot = &rl[i];
            break;
        }
        if (rl[i].window < oldest->window) {
            oldest = &rl[i];
        }
    }
    if (slot == NULL) {
        slot = oldest;
        memset(slot, 0, sizeof *slot);
        snprintf(slot->key, sizeof slot->key, "%s", key);
        slot->window = now;
    }
    if (now - slot->window >= rl_window_s) {
        if (slot->suppressed > 0) {
            snprintf(note, sizeof note,
                     "event=log_suppressed repeated_event=%s count=%ld window_s=%d",
                     sp_log_str(key), slot->suppressed, rl_window_s);
        }
        slot->window = now;
        slot->count = 0;
        slot->suppressed = 0;
    }
    ok = slot->count < rl_burst;
    if (ok) {
        slot->count++;
    } else {
        slot->suppressed++;
    }
    pthread_mutex_unlock(&rl_mu);
    if (note[0]) {
        emit(SP_LOG_LEVEL_WARN, note);
    }
    return ok;
}

/* ----------------------------------------------------------------- output */

static void
timestamp(char *buf, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L);
}

/* A quoted value is emitted as is only when its escapes are JSON's. */
static bool
json_escapes_ok(const char *v, size_t n)
{
    for (size_t i = 1; i + 1 < n; i++) {
        if (v[i] == '\\') {
            if (!strchr("\"\\/bfnrtu", v[i + 1])) {
                return false;
            }
            i++;
        }
    }
    return true;
}

static bool
is_number(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i >= n || s[i] < '0' || s[i] > '9' || (s[i] == '0' && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9')) {
        return false;
    }
    size_t d0 = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    /* Ids made of digits (a trace or span id, a request id) are text: more
     * than 15 digits would not survive a reader's double. */
    if (i - d0 > 15) return false;
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return false;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    return i == n;
}

/* key=value fields to one JSON object. A quoted value is already a JSON
 * string (sp_log_str); a bare one is a number or becomes a string; text
 * that is not key=value is gathered into "msg". */
size_t
sp_log_to_json(const char *ts, const char *level, const char *line, char *out, size_t cap)
{
    size_t j = 0;
#define PUT(str, len)                                                           \
    do {                                                                        \
        size_t l_ = (len);                                                      \
        if (j + l_ + 8 < cap) {                                                 \
            memcpy(out + j, (str), l_);                                         \
            j += l_;                                                            \
        }                                                                       \
    } while (0)
    PUT("{\"ts\":\"", 7);
    PUT(ts, strlen(ts));
    PUT("\",\"level\":\"", 11);
    PUT(level, strlen(level));
    PUT("\"", 1);
    char msg[1024];
    size_t msg_len = 0;
    const char *p = line;
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        const char *tok = p;
        size_t klen = strcspn(p, "= \"");
        if (klen > 0 && p[klen] == '=') {
            const char *v = p + klen + 1;
            size_t vlen;
            bool quoted = *v == '"';
            if (quoted) { /* to the closing quote, skipping escapes */
                const char *q = v + 1;
                while (*q && *q != '"') {
                    q += (*q == '\\' && q[1]) ? 2 : 1;
                }
                vlen = (size_t)(q - v) + (*q == '"');
            } else {
                vlen = strcspn(v, " ");
            }
            char key[160];
            size_t kq = sp_log_quote_into(key, sizeof key, tok, klen);
            PUT(",", 1);
            PUT(key, kq);
            PUT(":", 1);
            if (quoted && vlen >= 2 && v[vlen - 1] == '"' && json_escapes_ok(v, vlen)) {
                PUT(v, vlen);
            } else if (!quoted && is_number(v, vlen)) {
                PUT(v, vlen);
            } else {
                char val[1100];
                size_t vq = sp_log_quote_into(val, sizeof val, v, vlen);
                PUT(val, vq);
            }
            p = v + vlen;
        } else {
            size_t n = strcspn(p, " ");
            if (msg_len + n + 2 < sizeof msg) {
                if (msg_len) msg[msg_len++] = ' ';
                memcpy(msg + msg_len, tok, n);
                msg_len += n;
            }
            p += n;
        }
    }
    if (msg_len) {
        char val[1100];
        size_t vq = sp_log_quote_into(val, sizeof val, msg, msg_len);
        PUT(",\"msg\":", 7);
        PUT(val, vq);
    }
    out[j++] = '}';
    out[j] = '\0';
#undef PUT
    return j;
}

static void
emit(sp_log_level_t level, const char *line)
{
    if (sink != NULL) {
        sink(level, line, sink_data);
        return;
    }
    char ts[96];
    timestamp(ts, sizeof ts);
    const char *lv = level_names[level <= SP_LOG_LEVEL_NONE ? level : SP_LOG_LEVEL_ERROR];
    if (format == SP_LOG_FORMAT_JSON) {
        char js[6144];
        sp_log_to_json(ts, lv, line, js, sizeof js);
        fprintf(stderr, "%s\n", js);
    } else {
        fprintf(stderr, "ts=%s level=%s %s\n", ts, lv, line);
    }
}

void
sp_log_write(sp_log_level_t level, const char *fmt, ...)
{
    char raw[2048], line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);

    /* Escape control bytes: one event is always exactly one line. */
    size_t j = 0;
    for (size_t i = 0; raw[i] != '\0' && j + 5 < sizeof line; i++) {
        unsigned char c = (unsigned char)raw[i];
        if (c < 0x20 || c == 0x7f) {
            j += (size_t)snprintf(line + j, sizeof line - j, "\\x%02x", c);
        } else {
            line[j++] = (char)c;
        }
    }
    line[j] = '\0';
    if (rate_ok(level, line)) {
        emit(level, line);
    }
}
