/*
 * log.c - the default stderr sink and control characters escaped, so that a
 * CRLF smuggled into a model name or URL cannot forge a log line (CWE-117).
 */
#include "sampan/log.h"

#include <stdio.h>
#include <time.h>

sp_log_level_t sp__log_level = SP_LOG_LEVEL_INFO;
static sp_log_cb sink;
static void *sink_data;

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

    if (sink != NULL) {
        sink(level, line, sink_data);
        return;
    }
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
            level_names[level <= SP_LOG_LEVEL_NONE ? level : SP_LOG_LEVEL_ERROR], line);
}
