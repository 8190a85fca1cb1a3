/*
 * test.h - the unit-test harness (libuv's runner in miniature).
 *
 * TEST(name) { ... } registers a test at start-up; tests/unit/runner.c forks
 * each one with a timeout, so a crash or hang fails one test, not the run.
 * Assertions print both values and end the child with status 1. SKIP("why")
 * ends it with status 77, which the runner prints as "skipped".
 * Tests run from the repository root; fixtures live under tests/data/.
 */
#ifndef SP_TEST_H
#define SP_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*sp_test_fn)(void);
void sp_test_register(const char *name, const char *file, sp_test_fn fn);
/* A fresh private directory under $TMPDIR for this test (removed by the runner). */
const char *sp_test_tmpdir(void);

#define TEST(name)                                                              \
    static void test_##name(void);                                              \
    __attribute__((constructor)) static void test_register_##name(void)         \
    {                                                                           \
        sp_test_register(#name, __FILE__, test_##name);                         \
    }                                                                           \
    static void test_##name(void)

#define SP_TEST_FAIL(...)                                                       \
    do {                                                                        \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                       \
        fprintf(stderr, __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                  \
        exit(1);                                                                \
    } while (0)

#define ASSERT(cond)                                                            \
    do {                                                                        \
        if (!(cond)) SP_TEST_FAIL("assertion failed: %s", #cond);               \
    } while (0)

#define ASSERT_EQ(a, b)                                                         \
    do {                                                                        \
        long long a_ = (long long)(a), b_ = (long long)(b);                     \
        if (a_ != b_) SP_TEST_FAIL("%s == %s: %lld != %lld", #a, #b, a_, b_);   \
    } while (0)

#define ASSERT_OK(st)                                                           \
    do {                                                                        \
        long long s_ = (long long)(st);                                         \
        if (s_ != 0) SP_TEST_FAIL("%s: status %lld", #st, s_);                  \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                     \
    do {                                                                        \
        const char *a_ = (a), *b_ = (b);                                        \
        if (strcmp(a_, b_) != 0) SP_TEST_FAIL("%s == %s: \"%s\" != \"%s\"", #a, #b, a_, b_); \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                                  \
    do {                                                                        \
        double a_ = (double)(a), b_ = (double)(b);                              \
        if (!(fabs(a_ - b_) <= (tol)))                                          \
            SP_TEST_FAIL("%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b, a_, b_, (double)(tol)); \
    } while (0)

#define SKIP(...)                                                               \
    do {                                                                        \
        fprintf(stderr, "  skipped: ");                                         \
        fprintf(stderr, __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                  \
        exit(77);                                                               \
    } while (0)

#endif /* SP_TEST_H */
