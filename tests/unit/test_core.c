/* test_core.c - status table, allocator accounting and fault injection, thread pool. */
#include "test.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/heap.h"
#include "core/pool.h"
#include "core/utf8.h"
#include "core/workq.h"
#include "sampan/log.h"
#include "sampan/status.h"

TEST(status_table_is_consistent)
{
    ASSERT_STR_EQ(sp_status_str(SP_OK), "ok");
    ASSERT_STR_EQ(sp_status_name(SP_ERR_FORMAT), "ERR_FORMAT");
    ASSERT_EQ(sp_status_http(SP_ERR_INVALID), 400);
    ASSERT_EQ(sp_status_http(SP_ERR_BUSY), 429);
    ASSERT_STR_EQ(sp_status_str((sp_status_t)-999), "unknown status");
    char err[16];
    ASSERT_EQ(sp_errf(err, sizeof err, SP_ERR_IO, "%s", "a long message that is cut"), SP_ERR_IO);
    ASSERT_EQ(strlen(err), 15);
    ASSERT_EQ(sp_errf(NULL, 0, SP_ERR_IO, "x"), SP_ERR_IO);
}

TEST(alloc_counts_bytes_and_aligns)
{
    size_t base = sp_alloc_bytes_in_use();
    void *a = sp_malloc(100);
    void *b = sp_malloc_aligned(1000, 4096);
    ASSERT(a != NULL && b != NULL);
    ASSERT_EQ((uintptr_t)b % 4096, 0);
    ASSERT_EQ((uintptr_t)a % 16, 0);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base + 1100);
    a = sp_realloc(a, 10);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base + 1010);
    sp_free(a);
    sp_free(b);
    sp_free(NULL);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base);
    ASSERT(sp_calloc(SIZE_MAX / 2, 4) == NULL); /* count * size overflows */
    ASSERT(sp_malloc(SIZE_MAX - 8) == NULL);
}

/* The kernel's word on the mapping holding [p, p + n) (/proc/self/smaps "THPeligible:"): 1 when
 * transparent huge pages may back it, 0 when not, -1 when this kernel does not say. */
static int
thp_eligible(const void *p, size_t n)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL)
        return -1;
    char line[512];
    int in = 0, r = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3) {
            in = (uintptr_t)p >= lo && (uintptr_t)p + n <= hi;
            continue;
        }
        if (in && strncmp(line, "THPeligible:", 12) == 0) {
            r = atoi(line + 12);
            break;
        }
    }
    fclose(f);
    return r;
}

/* Blocks of a huge page or more are aligned to it, rounded up to whole ones, and (where the
 * kernel offers transparent huge pages only on request, the "madvise" mode) advised: the kernel
 * lists the block as eligible, a plain aligned block of the same size not. */
TEST(alloc_huge_pages_for_large_blocks)
{
    const size_t base = sp_alloc_bytes_in_use();
    void *small = sp_malloc_huge(1000);
    uint8_t *big = sp_malloc_huge(SP_HUGE_PAGE + 5);
    void *plain = sp_malloc_aligned(2 * SP_HUGE_PAGE, SP_HUGE_PAGE);
    ASSERT(small != NULL && big != NULL && plain != NULL);
    ASSERT_EQ((uintptr_t)small % 64, 0);
    ASSERT_EQ((uintptr_t)big % SP_HUGE_PAGE, 0);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base + 1000 + 2 * SP_HUGE_PAGE + 2 * SP_HUGE_PAGE);
    memset(big, 1, 2 * SP_HUGE_PAGE); /* the rounded-up tail is the caller's too */
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f != NULL) {
        if (fgets(mode, sizeof mode, f) == NULL)
            mode[0] = 0;
        fclose(f);
    }
    const int eligible = thp_eligible(big, 2 * SP_HUGE_PAGE);
    const int plain_eligible = thp_eligible(plain, 2 * SP_HUGE_PAGE);
    sp_free(small);
    sp_free(big);
    sp_free(plain);
    ASSERT_EQ(sp_alloc_bytes_in_use(), base);
    if (strstr(mode, "[never]") != NULL || mode[0] == 0 || eligible < 0)
        SKIP("no transparent huge pages here (mode '%s', THPeligible %d)", mode, eligible);
    ASSERT_EQ(eligible, 1);
    if (strstr(mode, "[madvise]") != NULL)
        ASSERT_EQ(plain_eligible, 0);
}

TEST(alloc_fault_injection)
{
    sp_alloc_fail_after(2);
    void *a = sp_malloc(8), *b = sp_malloc(8), *c = sp_malloc(8);
    ASSERT(a != NULL && b != NULL && c == NULL);
    sp_alloc_fail_after(-1);
    c = sp_malloc(8);
    ASSERT(c != NULL);
    sp_free(a);
    sp_free(b);
    sp_free(c);
}

/* Keys come out in ascending order through growth, duplicates and refills,
 * and a failed growth leaves the heap as it was. */
TEST(heap_pops_in_order)
{
    sp_heap_u64_t h = {0};
    uint64_t x = 88172645463325252ull, prev;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 5000; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ASSERT(sp_heap_u64_push(&h, i % 7 == 0 ? 42 : x % 100000) == 0);
        }
        ASSERT(h.n == 5000);
        prev = 0;
        while (h.n > 0) {
            uint64_t k = sp_heap_u64_pop(&h);
            ASSERT(k >= prev);
            prev = k;
        }
    }
    size_t cap = h.cap;
    while (h.n < cap) {
        ASSERT(sp_heap_u64_push(&h, h.n) == 0);
    }
    sp_alloc_fail_after(0);
    ASSERT(sp_heap_u64_push(&h, 1) == -1);
    sp_alloc_fail_after(-1);
    ASSERT(h.n == cap && sp_heap_u64_pop(&h) == 0);
    sp_heap_u64_free(&h);
    ASSERT(h.keys == NULL && h.n == 0);
}

#define PROBE_CHUNKS 97

typedef struct {
    atomic_int calls[PROBE_CHUNKS];
    atomic_int bad_ith;
    int n_threads;
} pool_probe;

static void
probe_fn(void *arg, int64_t chunk, int ith)
{
    pool_probe *p = arg;
    atomic_fetch_add(&p->calls[chunk], 1);
    if (ith < 0 || ith >= p->n_threads) {
        atomic_fetch_add(&p->bad_ith, 1);
    }
}

TEST(pool_runs_every_chunk_exactly_once)
{
    for (int n = 1; n <= 4; n++) {
        sp_pool_t *pool;
        ASSERT_OK(sp_pool_create(n, &pool));
        ASSERT_EQ(sp_pool_n_threads(pool), n);
        for (int job = 0; job < 2000; job++) {
            pool_probe p = {.n_threads = n};
            int64_t n_chunks = 1 + job % PROBE_CHUNKS;
            sp_pool_run(pool, probe_fn, &p, n_chunks);
            for (int64_t i = 0; i < PROBE_CHUNKS; i++) {
                ASSERT_EQ(atomic_load(&p.calls[i]), i < n_chunks ? 1 : 0);
            }
            ASSERT_EQ(atomic_load(&p.bad_ith), 0);
        }
        sp_pool_run(pool, probe_fn, NULL, 0); /* no chunks: returns at once */
        sp_pool_destroy(pool);
    }
    sp_pool_destroy(NULL);
}

/* More threads than cores: descheduled workers must not stall or break a job. */
TEST(pool_oversubscribed)
{
    sp_pool_t *pool;
    ASSERT_OK(sp_pool_create(8, &pool));
    for (int job = 0; job < 3000; job++) {
        pool_probe p = {.n_threads = 8};
        sp_pool_run(pool, probe_fn, &p, PROBE_CHUNKS);
        for (int64_t i = 0; i < PROBE_CHUNKS; i++) {
            ASSERT_EQ(atomic_load(&p.calls[i]), 1);
        }
    }
    sp_pool_destroy(pool);
}

TEST(pool_wakes_sleeping_workers)
{
    sp_pool_t *pool;
    ASSERT_OK(sp_pool_create(3, &pool));
    for (int job = 0; job < 3; job++) {
        struct timespec ts = {0, 20 * 1000 * 1000}; /* long enough for workers to sleep */
        nanosleep(&ts, NULL);
        pool_probe p = {.n_threads = 3};
        sp_pool_run(pool, probe_fn, &p, PROBE_CHUNKS);
        for (int64_t i = 0; i < PROBE_CHUNKS; i++) {
            ASSERT_EQ(atomic_load(&p.calls[i]), 1);
        }
    }
    sp_pool_destroy(pool);
}

/* Profiles (pool.h): runs counted per label (by text), "other" for sp_pool_run, the table's
 * overflow, NULL stops, reset empties. */
static const sp_pool_prof_entry_t *
prof_find(const sp_pool_prof_t *pr, const char *label)
{
    for (int i = 0; i < pr->n; i++) {
        if (strcmp(pr->e[i].label, label) == 0) {
            return &pr->e[i];
        }
    }
    return NULL;
}

TEST(pool_profile_counts_by_label)
{
    for (int n = 1; n <= 3; n += 2) {
        sp_pool_t *pool;
        ASSERT_OK(sp_pool_create(n, &pool));
        sp_pool_prof_t pr;
        pool_probe pp = {.n_threads = n}; /* probe_fn's counts are not looked at here */
        sp_pool_prof_reset(&pr);
        sp_pool_run_as(pool, "alpha", probe_fn, &pp, 5); /* not profiled yet */
        sp_pool_profile(pool, &pr);
        char alpha2[] = "alpha"; /* the same text at another address: the same entry */
        sp_pool_run_as(pool, "alpha", probe_fn, &pp, 5);
        sp_pool_run_as(pool, alpha2, probe_fn, &pp, 7);
        sp_pool_run_as(pool, "beta", probe_fn, &pp, 1);
        sp_pool_run(pool, probe_fn, &pp, 3);
        sp_pool_run_as(pool, "beta", probe_fn, &pp, 0); /* no chunks: not a run */
        ASSERT_EQ(pr.n, 3);
        const sp_pool_prof_entry_t *a = prof_find(&pr, "alpha"), *b = prof_find(&pr, "beta");
        const sp_pool_prof_entry_t *o = prof_find(&pr, "other");
        ASSERT(a != NULL && b != NULL && o != NULL);
        ASSERT(a == &pr.e[0] && b == &pr.e[1] && o == &pr.e[2]); /* first-run order */
        ASSERT_EQ(a->calls, 2);
        ASSERT_EQ(a->chunks, 12);
        ASSERT_EQ(b->calls, 1);
        ASSERT_EQ(b->chunks, 1);
        ASSERT_EQ(o->calls, 1);
        ASSERT_EQ(o->chunks, 3);
        for (int i = 0; i < pr.n; i++) {
            ASSERT(pr.e[i].ns >= 0 && pr.e[i].wait_ns >= 0 && pr.e[i].wait_ns <= pr.e[i].ns);
        }
        /* more labels than the table holds: the rest counted as overflow only */
        char names[SP_POOL_PROF_MAX + 5][16];
        for (int i = 0; i < SP_POOL_PROF_MAX + 5; i++) {
            snprintf(names[i], sizeof names[i], "l%d", i);
            sp_pool_run_as(pool, names[i], probe_fn, &pp, 2);
        }
        ASSERT_EQ(pr.n, SP_POOL_PROF_MAX);
        ASSERT_EQ(pr.overflow_calls, 8); /* 3 used + 29 new fill the table; 8 of 37 left */
        sp_pool_profile(pool, NULL);
        sp_pool_run_as(pool, "alpha", probe_fn, &pp, 5);
        ASSERT_EQ(prof_find(&pr, "alpha")->calls, 2);
        sp_pool_prof_reset(&pr);
        ASSERT_EQ(pr.n, 0);
        ASSERT_EQ(pr.overflow_calls, 0);
        sp_pool_destroy(pool);
    }
}

/* The tail: a job whose chunk on another thread sleeps 30 ms while the caller's returns at
 * once; the caller waits that long for it, and the profile says so. (A worker that starts
 * after a job was published sits that job out, so the first tries may find none: up to 10.) */
typedef struct tail_probe {
    atomic_int worker_started;
} tail_probe;

static void
tail_fn(void *arg, int64_t chunk, int ith)
{
    tail_probe *p = arg;
    (void)chunk;
    if (ith != 0) {
        atomic_store(&p->worker_started, 1);
        struct timespec ts = {0, 30 * 1000 * 1000};
        nanosleep(&ts, NULL);
        return;
    }
    /* the caller's chunk: until a worker holds the other one (at most 0.5 s) */
    for (int i = 0; i < 500 && !atomic_load(&p->worker_started); i++) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

TEST(pool_profile_measures_the_tail)
{
    sp_pool_t *pool;
    ASSERT_OK(sp_pool_create(2, &pool));
    sp_pool_prof_t pr;
    bool seen = false;
    for (int attempt = 0; attempt < 10 && !seen; attempt++) {
        sp_pool_prof_reset(&pr);
        sp_pool_profile(pool, &pr);
        tail_probe p = {0};
        sp_pool_run_as(pool, "tail", tail_fn, &p, 2);
        seen = atomic_load(&p.worker_started);
    }
    ASSERT(seen);
    ASSERT_EQ(pr.n, 1);
    ASSERT_EQ(pr.e[0].calls, 1);
    ASSERT(pr.e[0].wait_ns >= 20 * 1000 * 1000); /* the worker's 30 ms, less the clock's slack */
    ASSERT(pr.e[0].ns >= pr.e[0].wait_ns);
    sp_pool_destroy(pool);
}

/* The task queue: every accepted task runs once (some on each worker),
 * a full queue says busy, and destroy runs what is still queued. */
typedef struct wq_probe {
    atomic_int runs[64];
    atomic_int gate; /* tasks wait while 0 */
} wq_probe;

static wq_probe wqp;

static void
wq_task(void *arg)
{
    int i = (int)(intptr_t)arg;
    for (int k = 0; k < 2000 && !atomic_load(&wqp.gate); k++) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&wqp.runs[i], 1);
}

TEST(workq_runs_tasks_and_bounds_the_queue)
{
    memset(&wqp, 0, sizeof wqp);
    sp_workq_t *q;
    ASSERT_OK(sp_workq_create(2, 4, &q));
    /* Two tasks occupy the workers (held by the gate), four wait, the next is refused. */
    int accepted = 0, busy = 0;
    for (int i = 0; i < 12; i++) {
        sp_status_t st = sp_workq_submit(q, wq_task, (void *)(intptr_t)i);
        ASSERT(st == SP_OK || st == SP_ERR_BUSY);
        accepted += st == SP_OK;
        busy += st == SP_ERR_BUSY;
        if (i == 1) { /* let the two workers take the first two tasks */
            for (int k = 0; k < 2000 && sp_workq_pending(q) > 0; k++) {
                struct timespec ts = {0, 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
    }
    ASSERT_EQ(accepted, 6);
    ASSERT_EQ(busy, 6);
    atomic_store(&wqp.gate, 1);
    sp_workq_destroy(q); /* runs the four still queued */
    for (int i = 0; i < 12; i++) {
        ASSERT_EQ(atomic_load(&wqp.runs[i]), i < 6 ? 1 : 0);
    }
}

static char captured[512];
static void
capture(sp_log_level_t level, const char *line, void *ud)
{
    (void)level;
    (void)ud;
    snprintf(captured, sizeof captured, "%s", line);
}

TEST(log_escapes_control_characters)
{
    sp_log_set(capture, NULL);
    SP_LOG_INFO("event=load model=%s", "evil\r\nlevel=error forged");
    ASSERT(strchr(captured, '\n') == NULL && strchr(captured, '\r') == NULL);
    ASSERT(strstr(captured, "\\x0d\\x0a") != NULL);
    captured[0] = '\0';
    SP_LOG_DEBUG("not shown %d", 1); /* below the default level */
    ASSERT_EQ(captured[0], '\0');
    sp_log_set(NULL, NULL);
}

/* Every code point round-trips through encode and decode, with the length RFC 3629 gives it;
 * surrogates are encodable bytes but never a valid sequence. */
TEST(utf8_every_code_point_round_trips)
{
    char buf[4];
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        size_t n = sp_utf8_encode(buf, cp);
        ASSERT_EQ(n, want);
        uint32_t back = 0;
        size_t m = sp_utf8_decode((const unsigned char *)buf, n, &back);
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            ASSERT_EQ(sp_utf8_seq((const unsigned char *)buf, n), 0);
            ASSERT_EQ(m, 1);
            ASSERT_EQ(back, 0xFFFD);
        } else {
            ASSERT_EQ(m, n);
            ASSERT_EQ(back, cp);
            ASSERT_EQ(sp_utf8_invalid_at(buf, n), n);
        }
    }
}

TEST(utf8_invalid_sequences_decode_as_one_replacement_byte)
{
    static const struct { const char *s; size_t n; } bad[] = {
        {"\xC0\x80", 2},         /* overlong NUL */
        {"\xE0\x80\xAF", 3},     /* overlong '/' */
        {"\xED\xA0\x80", 3},     /* a surrogate */
        {"\xF4\x90\x80\x80", 4}, /* above U+10FFFF */
        {"\xE2\x82", 2},         /* truncated euro sign */
        {"\x80", 1},             /* a lone continuation byte */
        {"\xFF", 1},             /* never a lead */
        {"\xC3\x28", 2},         /* a lead followed by ASCII */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t cp = 0;
        ASSERT_EQ(sp_utf8_decode((const unsigned char *)bad[i].s, bad[i].n, &cp), 1);
        ASSERT_EQ(cp, 0xFFFD);
        ASSERT_EQ(sp_utf8_invalid_at(bad[i].s, bad[i].n), 0);
    }
}

/* A streamed piece cut at every byte of "a€😀": the held-back tail is exactly the started
 * character's bytes, and none when the cut falls on a boundary or on bytes that can never
 * become a character. */
TEST(utf8_unfinished_tail_holds_back_started_characters)
{
    const char *s = "a\xE2\x82\xAC\xF0\x9F\x98\x80";
    static const size_t want[] = {0, 0, 1, 2, 0, 1, 2, 3, 0}; /* for each prefix length 0..8 */
    for (size_t n = 0; n <= 8; n++) {
        ASSERT_EQ(sp_utf8_unfinished_tail(s, n), want[n]);
    }
    ASSERT_EQ(sp_utf8_unfinished_tail("\xFF", 1), 0);
    ASSERT_EQ(sp_utf8_unfinished_tail("ab\x80", 3), 0); /* a continuation with no lead */
}

/* The byte-at-a-time check accepts exactly the sequences sp_utf8_seq does: every string of
 * up to three bytes, and every four-byte string whose lead can start one (F0..F4). */
static size_t
incremental_len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80) {
        return 1;
    }
    uint8_t range;
    int need = sp_utf8_lead(s[0], &range);
    if (need == 0 || (size_t)need + 1 > n) {
        return 0;
    }
    for (int i = 1; i <= need; i++) {
        if (!sp_utf8_cont_ok(range, s[i])) {
            return 0;
        }
        range = 0;
    }
    return (size_t)need + 1;
}

TEST(utf8_incremental_check_agrees_with_the_sequence_check)
{
    unsigned char s[4];
    for (uint32_t v = 0; v < (1u << 24); v++) {
        s[0] = (unsigned char)(v >> 16), s[1] = (unsigned char)(v >> 8), s[2] = (unsigned char)v;
        size_t want = sp_utf8_seq(s, 3);
        if (want == 4) {
            continue; /* needs a fourth byte: below */
        }
        ASSERT_EQ(incremental_len(s, 3), want);
    }
    for (unsigned lead = 0xF0; lead <= 0xF4; lead++) {
        for (uint32_t v = 0; v < (1u << 24); v += 7) { /* a stride keeps it quick */
            s[0] = (unsigned char)lead, s[1] = (unsigned char)(v >> 16);
            s[2] = (unsigned char)(v >> 8), s[3] = (unsigned char)v;
            ASSERT_EQ(incremental_len(s, 4), sp_utf8_seq(s, 4));
        }
    }
}

/* The SentencePiece split length: what the lead byte announces when its continuation bytes
 * follow (even for sequences the strict check refuses), else one byte. */
TEST(utf8_char_len_is_the_lenient_split)
{
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"a", 1), 1);
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"\xE2\x82\xAC", 3), 3);
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"\xC0\x80", 2), 2);         /* overlong, kept */
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"\xED\xA0\x80", 3), 3);     /* surrogate, kept */
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"\xF8\x80\x80\x80", 4), 4); /* 0xF_ announces 4 */
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"\xE2\x82", 2), 1);         /* truncated */
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"\xE2\x41\xAC", 3), 1);     /* not a continuation */
    ASSERT_EQ(sp_utf8_char_len((const unsigned char *)"\x80", 1), 1);
}
