/*
 * log.h - one line per event, key=value, to a replaceable sink.
 *
 * The level is tested before the arguments are evaluated (redis serverLog), so
 * a disabled debug line costs one compare. Kernels and the token loop never log.
 */
#ifndef SAMPAN_LOG_H
#define SAMPAN_LOG_H

#include <stddef.h>

#include "sampan/status.h"

typedef enum sp_log_level {
    SP_LOG_LEVEL_DEBUG = 0,
    SP_LOG_LEVEL_INFO = 1,
    SP_LOG_LEVEL_WARN = 2,
    SP_LOG_LEVEL_ERROR = 3,
    SP_LOG_LEVEL_NONE = 4,
} sp_log_level_t;

/* The sink receives one finished line without the trailing newline. */
typedef void (*sp_log_cb)(sp_log_level_t level, const char *line, void *user_data);

extern sp_log_level_t sp__log_level;

typedef enum sp_log_format {
    SP_LOG_FORMAT_KV = 0, /* ts=... level=... event=... key=value */
    SP_LOG_FORMAT_JSON,   /* {"ts":...,"level":...,"event":...,"key":value} */
} sp_log_format_t;

void sp_log_set(sp_log_cb cb, void *user_data);   /* NULL restores stderr */
void sp_log_set_format(sp_log_format_t f);        /* of the stderr sink */
void sp_log_set_level(sp_log_level_t level);
/* Warnings and errors with the same event name are limited to 10 per 10 s;
 * the rest are counted and reported in one event=log_suppressed line. */
void sp_log_write(sp_log_level_t level, const char *fmt, ...) SP_PRINTF(2, 3);
/* Change the limit (tests); resets the counts. */
void sp_log_set_rate_limit(int burst, int window_s);

/* A value from outside (a name, a path, an error text) for a key=value line:
 * bare when it is a plain token ([A-Za-z0-9._:/@+,-]), else a JSON string
 * (quotes, backslashes and control bytes escaped, invalid UTF-8 replaced,
 * cut at about 1 KiB). The result lives in a per-thread ring of 8 buffers:
 * use it in the same log call. */
const char *sp_log_str(const char *s);
const char *sp_log_str_n(const char *s, size_t n);
/* s[0..n) as a JSON string into out (cap >= 8); returns its length. */
size_t sp_log_quote_into(char *out, size_t cap, const char *s, size_t n);
/* One key=value line as a JSON object with ts and level first (tests). */
size_t sp_log_to_json(const char *ts, const char *level, const char *line, char *out, size_t cap);

#define SP_LOG(level, ...)                                                      \
    do {                                                                        \
        if ((level) >= sp__log_level) {                                         \
            sp_log_write((level), __VA_ARGS__);                                 \
        }                                                                       \
    } while (0)
#define SP_LOG_DEBUG(...) SP_LOG(SP_LOG_LEVEL_DEBUG, __VA_ARGS__)
#define SP_LOG_INFO(...)  SP_LOG(SP_LOG_LEVEL_INFO, __VA_ARGS__)
#define SP_LOG_WARN(...)  SP_LOG(SP_LOG_LEVEL_WARN, __VA_ARGS__)
#define SP_LOG_ERROR(...) SP_LOG(SP_LOG_LEVEL_ERROR, __VA_ARGS__)

#endif /* SAMPAN_LOG_H */
