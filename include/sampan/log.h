/*
 * log.h - one line per event, key=value, to a replaceable sink.
 *
 * The level is tested before the arguments are evaluated (redis serverLog), so
 * a disabled debug line costs one compare. Kernels and the token loop never log.
 */
#ifndef SAMPAN_LOG_H
#define SAMPAN_LOG_H

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

void sp_log_set(sp_log_cb cb, void *user_data);   /* NULL restores stderr */
void sp_log_set_level(sp_log_level_t level);
void sp_log_write(sp_log_level_t level, const char *fmt, ...) SP_PRINTF(2, 3);

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
