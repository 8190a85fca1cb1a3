/*
 * status.h - the one status table of Sampan.
 *
 * Every fallible call returns sp_status_t: SP_OK (0) or a negative SP_ERR_*.
 * The X-macro below generates the enum, the message and the HTTP status, so the
 * three can never drift apart (libuv's UV_ERRNO_MAP). There are no positive
 * "warning" values inside the int.
 */
#ifndef SAMPAN_STATUS_H
#define SAMPAN_STATUS_H

#include <stdarg.h>
#include <stddef.h>

/*   name            value  http  message */
#define SP_STATUS_MAP(XX)                                                       \
    XX(OK,              0, 200, "ok")                                           \
    XX(ERR_NOMEM,      -1, 503, "out of memory")                                \
    XX(ERR_INVALID,    -2, 400, "invalid argument")                             \
    XX(ERR_IO,         -3, 500, "i/o error")                                    \
    XX(ERR_FORMAT,     -4, 400, "invalid format")                               \
    XX(ERR_NOT_FOUND,  -5, 404, "not found")                                    \
    XX(ERR_BUSY,       -6, 429, "busy")                                         \
    XX(ERR_KV_FULL,    -7, 503, "kv cache full")                                \
    XX(ERR_CANCELLED,  -8, 499, "cancelled")                                    \
    XX(ERR_DEVICE,     -9, 500, "device error")                                 \
    XX(ERR_UNSUPPORTED,-10, 501, "unsupported")                                 \
    XX(ERR_TOO_LARGE, -11, 413, "too large")                                \
    XX(ERR_MODEL_FAULT,-12, 500, "model fault") /* NaN/inf out of a model */   \
    XX(ERR_SHUTDOWN,  -13, 503, "shutting down") /* the server or the model is stopping */

typedef enum sp_status {
#define SP__STATUS_ENUM(name, val, http, msg) SP_##name = (val),
    SP_STATUS_MAP(SP__STATUS_ENUM)
#undef SP__STATUS_ENUM
} sp_status_t;

/* Short English message for a status; never NULL. */
const char *sp_status_str(sp_status_t st);
/* Symbolic name ("ERR_FORMAT"); never NULL. */
const char *sp_status_name(sp_status_t st);
/* HTTP status code a front end should answer with: the one place a status
 * becomes an HTTP answer (a protocol with its own convention says so where it
 * differs, e.g. OpenAI's 400 for a prompt too long). 500 for an unknown value. */
int sp_status_http(sp_status_t st);

/*
 * Error-message buffers. Fallible constructors take (char *err, size_t err_len)
 * and write one human-readable line there on failure (like sqlite3_errmsg).
 * err may be NULL. sp_errf returns st so that `return sp_errf(...)` reads well.
 */
#if defined(__GNUC__)
#define SP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SP_PRINTF(a, b)
#endif

sp_status_t sp_errf(char *err, size_t err_len, sp_status_t st, const char *fmt, ...)
    SP_PRINTF(4, 5);

#endif /* SAMPAN_STATUS_H */
