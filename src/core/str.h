/* str.h - a borrowed byte string {ptr, len} (h2o's iovec); not NUL-terminated. */
#ifndef SP_CORE_STR_H
#define SP_CORE_STR_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct sp_str {
    const char *ptr;
    size_t len;
} sp_str_t;

static inline sp_str_t sp_str_c(const char *s)
{
    sp_str_t r = {s, s ? strlen(s) : 0};
    return r;
}

static inline bool sp_str_eq_c(sp_str_t a, const char *b)
{
    size_t n = strlen(b);
    return a.len == n && (n == 0 || memcmp(a.ptr, b, n) == 0);
}

#endif /* SP_CORE_STR_H */
