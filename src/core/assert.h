/*
 * assert.h - SP_ASSERT: an invariant whose breaking would corrupt memory or
 * output (a block's reference count below zero, a KV row past its cache, a
 * token id past the vocabulary). On in debug and sanitizer builds (SP_DEBUG,
 * which `make SANITIZER=1` and `make fuzz` set), where a broken one prints
 * the file, line and expression and aborts, so the test run that broke it
 * stops there; compiled out of release builds, where the hot loops it
 * guards cannot afford the branch.
 *
 * Not for bad input: a request or a model file that breaks a rule gets an
 * error, never an assert.
 */
#ifndef SP_CORE_ASSERT_H
#define SP_CORE_ASSERT_H

#ifdef SP_DEBUG
#include <stdio.h>
#include <stdlib.h>
#define SP_ASSERT(x)                                                                          \
    do {                                                                                      \
        if (!(x)) {                                                                           \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #x);         \
            abort();                                                                          \
        }                                                                                     \
    } while (0)
#else
/* sizeof keeps the expression compiled (names checked, no unused-variable
 * warnings) without evaluating it. */
#define SP_ASSERT(x) ((void)sizeof(!(x)))
#endif

#endif /* SP_CORE_ASSERT_H */
