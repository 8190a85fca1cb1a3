/* test_respcache.c - the response cache (serving/respcache.c): LRU order, the
 * byte bound, refused entries, collisions, concurrent use, the request keys,
 * and config.json's response_cache field. The routes are tested against the
 * real server in tests/py/test_response_cache.py. */
#include "test.h"

#include <pthread.h>

#include "core/alloc.h"
#include "serving/repo_config.h"
#include "serving/respcache.h"
#include "api/api.h"
#include "api/rcache.h"

static sp_respcache_t *
make(uint64_t cap)
{
    sp_respcache_t *c = NULL;
    char err[256];
    ASSERT_OK(sp_respcache_create(cap, &c, err, sizeof err));
    ASSERT(c != NULL);
    return c;
}

static sp_status_t
put(sp_respcache_t *c, const char *key, const char *body)
{
    sp_respcache_value_t v = {"application/json", NULL, NULL, body, strlen(body), 0};
    return sp_respcache_put(c, sp_respcache_hash(c, key, strlen(key)), key, strlen(key), &v);
}

/* The stored body of key, or NULL (copied into buf). */
static const char *
get(sp_respcache_t *c, const char *key, char *buf, size_t cap)
{
    sp_respcache_hit_t hit;
    if (!sp_respcache_get(c, sp_respcache_hash(c, key, strlen(key)), key, strlen(key), &hit)) {
        return NULL;
    }
    size_t n = hit.v.body_len < cap - 1 ? hit.v.body_len : cap - 1;
    memcpy(buf, hit.v.body, n);
    buf[n] = '\0';
    sp_respcache_hit_release(&hit);
    return buf;
}

static uint64_t
entry_cost(sp_respcache_t *c, const char *key, const char *body)
{
    /* What one entry charges: measured, so the test does not hard-code the header size. */
    sp_respcache_stats_t a, b;
    sp_respcache_get_stats(c, &a);
    ASSERT_OK(put(c, key, body));
    sp_respcache_get_stats(c, &b);
    return b.bytes - a.bytes;
}

TEST(respcache_get_put_and_headers)
{
    sp_respcache_t *c = make(1 << 20);
    char buf[128];
    ASSERT(get(c, "k1", buf, sizeof buf) == NULL);
    sp_respcache_value_t v = {"application/octet-stream", "Inference-Header-Content-Length", "12",
                              "{\"a\":1}\x01\x02", 9, 1};
    sp_respcache_hash_t h = sp_respcache_hash(c, "k1", 2);
    ASSERT_OK(sp_respcache_put(c, h, "k1", 2, &v));
    sp_respcache_hit_t hit;
    ASSERT(sp_respcache_get(c, h, "k1", 2, &hit));
    ASSERT_STR_EQ(hit.v.content_type, "application/octet-stream");
    ASSERT_STR_EQ(hit.v.header_name, "Inference-Header-Content-Length");
    ASSERT_STR_EQ(hit.v.header_value, "12");
    ASSERT_EQ(hit.v.body_len, 9);
    ASSERT(memcmp(hit.v.body, "{\"a\":1}\x01\x02", 9) == 0);
    ASSERT_EQ(hit.v.tag, 1);
    sp_respcache_hit_release(&hit);
    sp_respcache_hit_release(&hit); /* a second release is a no-op */
    /* no extra header: NULL back */
    ASSERT_OK(put(c, "k2", "body2"));
    h = sp_respcache_hash(c, "k2", 2);
    ASSERT(sp_respcache_get(c, h, "k2", 2, &hit));
    ASSERT(hit.v.header_name == NULL && hit.v.header_value == NULL);
    sp_respcache_hit_release(&hit);
    /* over-long texts and a name without value are refused */
    char lng[100];
    memset(lng, 'x', sizeof lng - 1);
    lng[sizeof lng - 1] = '\0';
    sp_respcache_value_t bad = {lng, NULL, NULL, "b", 1, 0};
    ASSERT_EQ(sp_respcache_put(c, h, "k3", 2, &bad), SP_ERR_INVALID);
    sp_respcache_value_t half = {"a/b", "X-Y", NULL, "b", 1, 0};
    ASSERT_EQ(sp_respcache_put(c, h, "k3", 2, &half), SP_ERR_INVALID);
    sp_respcache_stats_t st;
    sp_respcache_get_stats(c, &st);
    ASSERT_EQ(st.entries, 2);
    ASSERT_EQ(st.inserts, 2);
    ASSERT_EQ(st.capacity_bytes, 1 << 20);
    sp_respcache_destroy(c);
    sp_respcache_destroy(NULL);
    char err[128];
    ASSERT_EQ(sp_respcache_create(0, &c, err, sizeof err), SP_ERR_INVALID);
    ASSERT(c == NULL);
}

TEST(respcache_lru_order)
{
    char body[512];
    memset(body, 'b', sizeof body - 1);
    body[sizeof body - 1] = '\0';
    sp_respcache_t *probe = make(1 << 20);
    uint64_t cost = entry_cost(probe, "A", body);
    sp_respcache_destroy(probe);
    /* 8 entries of `cost` fit exactly; each is exactly 1/8 of the capacity (allowed). */
    sp_respcache_t *c = make(cost * 8);
    const char *keys[] = {"A", "B", "C", "D", "E", "F", "G", "H"};
    for (int i = 0; i < 8; i++) {
        ASSERT_OK(put(c, keys[i], body));
    }
    sp_respcache_stats_t st;
    sp_respcache_get_stats(c, &st);
    ASSERT_EQ(st.entries, 8);
    ASSERT_EQ(st.bytes, cost * 8);
    ASSERT_EQ(st.evictions, 0);
    char buf[600];
    /* Touch A: B becomes the least recently used. */
    ASSERT(get(c, "A", buf, sizeof buf) != NULL);
    ASSERT_OK(put(c, "I", body));
    ASSERT(get(c, "B", buf, sizeof buf) == NULL);
    ASSERT(get(c, "A", buf, sizeof buf) != NULL);
    ASSERT(get(c, "C", buf, sizeof buf) != NULL);
    /* Order now (old -> new): D E F G H I A C. Two more evict D, then E. */
    ASSERT_OK(put(c, "J", body));
    ASSERT(get(c, "D", buf, sizeof buf) == NULL);
    ASSERT(get(c, "E", buf, sizeof buf) != NULL); /* touched: F is next */
    ASSERT_OK(put(c, "K", body));
    ASSERT(get(c, "F", buf, sizeof buf) == NULL);
    ASSERT(get(c, "E", buf, sizeof buf) != NULL);
    sp_respcache_get_stats(c, &st);
    ASSERT_EQ(st.entries, 8);
    ASSERT_EQ(st.evictions, 3);
    ASSERT(st.bytes <= cost * 8);
    sp_respcache_destroy(c);
}

TEST(respcache_byte_bound_and_big_entries)
{
    const uint64_t cap = 64 << 10;
    sp_respcache_t *c = make(cap);
    char key[32], body[3000];
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        size_t n = 100 + (size_t)(i * 37) % 2800; /* mixed sizes */
        memset(body, 'a' + i % 26, n);
        body[n] = '\0';
        ASSERT_OK(put(c, key, body));
        sp_respcache_stats_t st;
        sp_respcache_get_stats(c, &st);
        ASSERT(st.bytes <= cap);
        /* the newest entry is always there */
        char buf[3100];
        ASSERT(get(c, key, buf, sizeof buf) != NULL);
        ASSERT_EQ(strlen(buf), n);
    }
    sp_respcache_stats_t st;
    sp_respcache_get_stats(c, &st);
    ASSERT(st.evictions > 0);
    ASSERT_EQ(st.inserts, 400);
    ASSERT_EQ(st.inserts - st.evictions, st.entries);
    /* An entry over 1/8 of the capacity is refused and evicts nothing. */
    size_t big = cap / 8 + 1;
    char *b = sp_malloc(big);
    ASSERT(b != NULL);
    memset(b, 'z', big);
    sp_respcache_value_t v = {"application/json", NULL, NULL, b, big, 0};
    ASSERT_EQ(sp_respcache_put(c, sp_respcache_hash(c, "big", 3), "big", 3, &v), SP_ERR_TOO_LARGE);
    sp_respcache_stats_t after;
    sp_respcache_get_stats(c, &after);
    ASSERT_EQ(after.refused, 1);
    ASSERT_EQ(after.entries, st.entries);
    ASSERT_EQ(after.evictions, st.evictions);
    /* The key counts too: a large key with a small body is refused as well. */
    sp_respcache_value_t small = {"application/json", NULL, NULL, "x", 1, 0};
    ASSERT_EQ(sp_respcache_put(c, sp_respcache_hash(c, b, big), b, big, &small), SP_ERR_TOO_LARGE);
    sp_free(b);
    sp_respcache_destroy(c);
}

TEST(respcache_same_key_keeps_the_first_answer)
{
    sp_respcache_t *c = make(1 << 20);
    ASSERT_OK(put(c, "k", "first"));
    ASSERT_OK(put(c, "k", "second"));
    char buf[32];
    ASSERT_STR_EQ(get(c, "k", buf, sizeof buf), "first");
    sp_respcache_stats_t st;
    sp_respcache_get_stats(c, &st);
    ASSERT_EQ(st.entries, 1);
    ASSERT_EQ(st.inserts, 1);
    sp_respcache_destroy(c);
}

TEST(respcache_collision_never_serves_another_answer)
{
    /* Force every key onto one hash: only the full key compare tells them apart. */
    sp_respcache_t *c = make(1 << 20);
    sp_respcache_hash_t h = {0x1234, 0x5678};
    sp_respcache_value_t va = {"text/plain", NULL, NULL, "answer-a", 8, 0};
    sp_respcache_value_t vb = {"text/plain", NULL, NULL, "answer-b", 8, 0};
    ASSERT_OK(sp_respcache_put(c, h, "request-a", 9, &va));
    ASSERT_OK(sp_respcache_put(c, h, "request-b", 9, &vb));
    sp_respcache_hit_t hit;
    ASSERT(sp_respcache_get(c, h, "request-a", 9, &hit));
    ASSERT(memcmp(hit.v.body, "answer-a", 8) == 0);
    sp_respcache_hit_release(&hit);
    ASSERT(sp_respcache_get(c, h, "request-b", 9, &hit));
    ASSERT(memcmp(hit.v.body, "answer-b", 8) == 0);
    sp_respcache_hit_release(&hit);
    /* same hash, another key (also a prefix, and a longer one): a miss */
    ASSERT(!sp_respcache_get(c, h, "request-c", 9, &hit));
    ASSERT(!sp_respcache_get(c, h, "request-", 8, &hit));
    ASSERT(!sp_respcache_get(c, h, "request-aa", 10, &hit));
    /* same key, another hash half: a miss */
    sp_respcache_hash_t h2 = {0x1234, 0x5679};
    ASSERT(!sp_respcache_get(c, h2, "request-a", 9, &hit));
    sp_respcache_stats_t st;
    sp_respcache_get_stats(c, &st);
    ASSERT_EQ(st.entries, 2);
    /* real hashes of different keys differ */
    sp_respcache_hash_t x = sp_respcache_hash(c, "a", 1), y = sp_respcache_hash(c, "b", 1);
    ASSERT(x.lo != y.lo || x.hi != y.hi);
    sp_respcache_hash_t x2 = sp_respcache_hash(c, "a", 1);
    ASSERT(x.lo == x2.lo && x.hi == x2.hi);
    sp_respcache_destroy(c);
}

TEST(respcache_hit_outlives_eviction)
{
    sp_respcache_t *c = make(8 << 10);
    ASSERT_OK(put(c, "keep", "the body a hit still reads"));
    sp_respcache_hit_t hit;
    ASSERT(sp_respcache_get(c, sp_respcache_hash(c, "keep", 4), "keep", 4, &hit));
    char key[16], body[600];
    memset(body, 'q', sizeof body - 1);
    body[sizeof body - 1] = '\0';
    for (int i = 0; i < 100; i++) { /* evicts "keep" many times over */
        snprintf(key, sizeof key, "f%d", i);
        ASSERT_OK(put(c, key, body));
    }
    char buf[64];
    ASSERT(get(c, "keep", buf, sizeof buf) == NULL);
    /* the hit's reference keeps the bytes (ASan would catch a use after free) */
    ASSERT_EQ(hit.v.body_len, 26);
    ASSERT(memcmp(hit.v.body, "the body a hit still reads", 26) == 0);
    sp_respcache_hit_release(&hit);
    sp_respcache_destroy(c);
}

/* ---- concurrency: every hit must return its own key's body */

typedef struct worker {
    sp_respcache_t *c;
    int id;
    int hits, bad;
} worker_t;

static void *
worker_main(void *arg)
{
    worker_t *w = arg;
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
    char key[32], body[256], buf[300];
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int k = (int)(x % 300);
        snprintf(key, sizeof key, "key-%d", k);
        int n = snprintf(body, sizeof body, "body-of-%d-", k);
        for (int j = 0; j < k % 200; j++) {
            body[n++] = (char)('a' + (k + j) % 26);
        }
        body[n] = '\0';
        if (get(w->c, key, buf, sizeof buf)) {
            w->hits++;
            w->bad += strcmp(buf, body) != 0;
        } else if (put(w->c, key, body) != SP_OK) {
            w->bad++;
        }
    }
    return NULL;
}

TEST(respcache_threads)
{
    sp_respcache_t *c = make(16 << 10); /* small: eviction runs all the time */
    enum { N = 4 };
    pthread_t t[N];
    worker_t w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (worker_t){c, i, 0, 0};
        ASSERT_EQ(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    int hits = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        ASSERT_EQ(w[i].bad, 0);
        hits += w[i].hits;
    }
    ASSERT(hits > 0);
    sp_respcache_stats_t st;
    sp_respcache_get_stats(c, &st);
    ASSERT(st.bytes <= 16 << 10);
    ASSERT(st.evictions > 0);
    ASSERT_EQ(st.inserts - st.evictions, st.entries);
    sp_respcache_destroy(c);
}

/* ---- request keys (the server glue) */

typedef struct fake {
    sp_serving_t srv;
    sp_served_model_t m;
} fake_t;

static fake_t *
fake_model(sp_respcache_t *c, bool enabled)
{
    fake_t *f = sp_calloc(1, sizeof *f);
    ASSERT(f != NULL);
    f->srv.rcache = c;
    f->m.srv = &f->srv;
    snprintf(f->m.name, sizeof f->m.name, "m");
    f->m.version = 3;
    f->m.sig = 42;
    f->m.response_cache = enabled;
    sp_metrics_model_init(&f->m.metrics);
    return f;
}

static sp_rckey_t *
json_key(sp_served_model_t *m, const char *route, const char *text, const char *const *drop)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    ASSERT(o != NULL);
    sp_rckey_t *k = sp_rckey_new(m, route);
    ASSERT(k != NULL);
    sp_rckey_add_json(k, o, drop);
    ASSERT(!k->buf.oom);
    /* the request's own tree is untouched by the dropped keys */
    json_t *o2 = json_loads(text, 0, &je);
    ASSERT(json_equal(o, o2));
    json_decref(o2);
    json_decref(o);
    return k;
}

static bool
same(const sp_rckey_t *a, const sp_rckey_t *b)
{
    return a->buf.len == b->buf.len && memcmp(a->buf.p, b->buf.p, a->buf.len) == 0;
}

TEST(respcache_request_keys)
{
    sp_respcache_t *c = make(1 << 20);
    fake_t *f = fake_model(c, true);
    fake_t *off = fake_model(c, false);
    fake_t *none = fake_model(NULL, true);
    ASSERT(sp_rckey_enabled(&f->m));
    ASSERT(!sp_rckey_enabled(&off->m));
    ASSERT(!sp_rckey_enabled(&none->m));
    ASSERT(sp_rckey_new(&off->m, "r") == NULL);
    ASSERT(sp_rckey_new(&none->m, "r") == NULL);
    sp_rckey_free(NULL);
    static const char *const drop[] = {"user", "priority", "parameters.timeout", NULL};
    /* key order and dropped fields do not matter */
    sp_rckey_t *a = json_key(&f->m, "openai/completions",
                             "{\"prompt\":\"x\",\"temperature\":0,\"user\":\"u1\"}", drop);
    sp_rckey_t *b = json_key(&f->m, "openai/completions",
                             "{\"temperature\":0,\"prompt\":\"x\",\"priority\":\"batch\"}", drop);
    ASSERT(same(a, b));
    /* a nested drop */
    sp_rckey_t *p1 = json_key(&f->m, "kserve/generate",
                              "{\"parameters\":{\"timeout\":5,\"seed\":1},\"text_input\":\"t\"}", drop);
    sp_rckey_t *p2 = json_key(&f->m, "kserve/generate",
                              "{\"text_input\":\"t\",\"parameters\":{\"seed\":1}}", drop);
    ASSERT(same(p1, p2));
    /* anything else does */
    sp_rckey_t *d1 = json_key(&f->m, "openai/completions", "{\"prompt\":\"y\",\"temperature\":0}", drop);
    sp_rckey_t *d2 = json_key(&f->m, "openai/chat", "{\"prompt\":\"x\",\"temperature\":0}", drop);
    ASSERT(!same(a, d1));
    ASSERT(!same(a, d2));
    /* the model's version and build signature are part of it */
    f->m.sig = 43;
    sp_rckey_t *d3 = json_key(&f->m, "openai/completions", "{\"prompt\":\"x\",\"temperature\":0}", drop);
    ASSERT(!same(a, d3));
    f->m.sig = 42;
    f->m.version = 4;
    sp_rckey_t *d4 = json_key(&f->m, "openai/completions", "{\"prompt\":\"x\",\"temperature\":0}", drop);
    ASSERT(!same(a, d4));
    f->m.version = 3;
    /* length prefixes: moving bytes between fields changes the key */
    sp_rckey_t *s1 = sp_rckey_new(&f->m, "r"), *s2 = sp_rckey_new(&f->m, "r");
    sp_rckey_add(s1, "ab", 2);
    sp_rckey_add(s1, "c", 1);
    sp_rckey_add(s2, "a", 1);
    sp_rckey_add(s2, "bc", 2);
    ASSERT(!same(s1, s2));
    sp_rckey_t *ks[] = {a, b, p1, p2, d1, d2, d3, d4, s1, s2};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        sp_rckey_free(ks[i]);
    }
    sp_free(f);
    sp_free(off);
    sp_free(none);
    sp_respcache_destroy(c);
}

/* ---- config.json */

static sp_status_t
parse_cfg(const char *text, sp_repo_config_t *cfg, char *err, size_t err_len)
{
    json_t *root = NULL;
    sp_status_t st = sp_repo_config_parse_text(text, strlen(text), "config.json", &root, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    st = sp_repo_config_from_json(root, "config.json", cfg, err, err_len);
    json_decref(root);
    return st;
}

TEST(respcache_config_field)
{
    sp_repo_config_t cfg;
    char err[512];
    ASSERT_OK(parse_cfg("{\"backend\":\"identity\"}", &cfg, err, sizeof err));
    ASSERT(!cfg.response_cache);
    sp_repo_config_free(&cfg);
    ASSERT_OK(parse_cfg("{\"response_cache\":{\"enable\":true}}", &cfg, err, sizeof err));
    ASSERT(cfg.response_cache);
    sp_repo_config_free(&cfg);
    ASSERT_OK(parse_cfg("{\"response_cache\":{\"enable\":false}}", &cfg, err, sizeof err));
    ASSERT(!cfg.response_cache);
    sp_repo_config_free(&cfg);
    ASSERT_OK(parse_cfg("{\"response_cache\":{}}", &cfg, err, sizeof err));
    ASSERT(!cfg.response_cache);
    sp_repo_config_free(&cfg);
    ASSERT_EQ(parse_cfg("{\"response_cache\":{\"enable\":1}}", &cfg, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "response_cache.enable") != NULL);
    sp_repo_config_free(&cfg);
    ASSERT_EQ(parse_cfg("{\"response_cache\":{\"size\":1}}", &cfg, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "response_cache.size: unknown field") != NULL);
    sp_repo_config_free(&cfg);
    ASSERT_EQ(parse_cfg("{\"response_cache\":true}", &cfg, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "must be an object") != NULL);
    sp_repo_config_free(&cfg);
}
