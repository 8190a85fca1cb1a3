/*
 * runner.c - runs every registered TEST in a forked child with a timeout.
 *
 *   build/test_unit [substring...]   run the tests whose name or file contains one
 *   SP_TEST_TIMEOUT=seconds          per-test limit (default 120)
 *
 * Ends with "unit: N passed, N failed, N skipped" and exits 1 on any failure.
 */
#include "test.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *name, *file;
    sp_test_fn fn;
} test_entry;

static test_entry tests[1024];
static int n_tests;
static char tmpdir[256];

void
sp_test_register(const char *name, const char *file, sp_test_fn fn)
{
    if (n_tests < (int)(sizeof tests / sizeof tests[0])) {
        tests[n_tests++] = (test_entry){name, file, fn};
    }
}

const char *
sp_test_tmpdir(void)
{
    return tmpdir;
}

static void
rm_rf(const char *path)
{
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
                continue;
            }
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int
selected(const test_entry *t, int argc, char **argv)
{
    if (argc < 2) {
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (strstr(t->name, argv[i]) || strstr(t->file, argv[i])) {
            return 1;
        }
    }
    return 0;
}

static double
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int
main(int argc, char **argv)
{
    int timeout = getenv("SP_TEST_TIMEOUT") ? atoi(getenv("SP_TEST_TIMEOUT")) : 120;
    int passed = 0, failed = 0, skipped = 0;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < n_tests; i++) {
        const test_entry *t = &tests[i];
        if (!selected(t, argc, argv)) {
            continue;
        }
        snprintf(tmpdir, sizeof tmpdir, "%s/sp-test-XXXXXX", base);
        if (mkdtemp(tmpdir) == NULL) {
            perror("mkdtemp");
            return 1;
        }
        double t0 = now_ms();
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm((unsigned)timeout);
            t->fn();
            exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        double ms = now_ms() - t0;
        rm_rf(tmpdir);
        const char *file = strrchr(t->file, '/') ? strrchr(t->file, '/') + 1 : t->file;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            passed++;
            printf("ok      %-48s %-22s %8.1f ms\n", t->name, file, ms);
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
            skipped++;
            printf("skipped %-48s %s\n", t->name, file);
        } else {
            failed++;
            if (WIFSIGNALED(status)) {
                printf("FAIL    %-48s %s (signal %d%s)\n", t->name, file, WTERMSIG(status),
                       WTERMSIG(status) == SIGALRM ? ", timeout" : "");
            } else {
                printf("FAIL    %-48s %s (exit %d)\n", t->name, file, WEXITSTATUS(status));
            }
        }
    }
    printf("unit: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
