/* respcache.c - the response cache (respcache.h). */
#include "serving/respcache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "core/alloc.h"
#include "sampan/log.h"
#include "serving/registry.h"
#include "api/api.h"

/* ------------------------------------------------------------------ the map */

/* One stored answer: the entry header, then key_len key bytes, then the body.
 * Linked in a hash chain and in the LRU list while the cache holds it; `refs`
 * counts the cache's reference (while linked) and every outstanding hit. */
/* LRU links; the first member of an entry, so that a node is its entry. */
typedef struct lru_node {
    struct lru_node *prev, *next; /* lru.next is the most recent */
} lru_node_t;

typedef struct entry {
    lru_node_t link;           /* first: see lru_node_t */
    struct entry *hnext;
    sp_respcache_hash_t h;
    atomic_int refs;
    size_t charge;             /* what it counts against the capacity */
    size_t key_len, body_len;
    int tag;
    bool has_header;
    char content_type[SP_RESPCACHE_TEXT_MAX];
    char header_name[SP_RESPCACHE_TEXT_MAX];
    char header_value[SP_RESPCACHE_TEXT_MAX];
    unsigned char data[];      /* key, then body */
} entry_t;

struct sp_respcache {
    pthread_mutex_t mu;
    uint64_t capacity;
    uint64_t bytes;
    uint64_t n_entries;
    uint64_t evictions, inserts, refused;
    entry_t **buckets;         /* n_buckets, a power of two */
    size_t n_buckets;
    lru_node_t lru;            /* sentinel of the LRU list */
    EVP_MD *sha256;            /* fetched once: an implicit fetch per digest takes a global lock */
};

#define MIN_BUCKETS 256

sp_status_t
sp_respcache_create(uint64_t capacity_bytes, sp_respcache_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (capacity_bytes == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "response cache: the size must be > 0");
    }
    sp_respcache_t *c = sp_calloc(1, sizeof *c);
    if (c == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "response cache: out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->capacity = capacity_bytes;
    c->n_buckets = MIN_BUCKETS;
    c->buckets = sp_calloc(c->n_buckets, sizeof *c->buckets);
    c->lru.next = c->lru.prev = &c->lru;
    c->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (c->buckets == NULL || c->sha256 == NULL) {
        bool md = c->sha256 == NULL;
        sp_respcache_destroy(c);
        return sp_errf(err, err_len, md ? SP_ERR_UNSUPPORTED : SP_ERR_NOMEM,
                       "response cache: %s", md ? "SHA-256 is not available" : "out of memory");
    }
    *out = c;
    return SP_OK;
}

static void
entry_unref(entry_t *e)
{
    if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1) {
        sp_free(e);
    }
}

void
sp_respcache_destroy(sp_respcache_t *c)
{
    if (c == NULL) {
        return;
    }
    for (lru_node_t *n = c->lru.next; n != &c->lru;) {
        lru_node_t *next = n->next;
        entry_unref((entry_t *)n);
        n = next;
    }
    pthread_mutex_destroy(&c->mu);
    sp_free(c->buckets);
    EVP_MD_free(c->sha256);
    sp_free(c);
}

sp_respcache_hash_t
sp_respcache_hash(const sp_respcache_t *c, const void *key, size_t len)
{
    unsigned char md[32];
    unsigned int n = sizeof md;
    sp_respcache_hash_t h = {0, 0};
    if (EVP_Digest(key, len, md, &n, c->sha256, NULL) == 1) {
        memcpy(&h.lo, md, 8);
        memcpy(&h.hi, md + 8, 8);
    }
    /* A failed digest (it cannot fail with the default provider) leaves
     * {0, 0}: every key then shares a chain, and the full compare keeps the
     * answers right. */
    return h;
}

static bool
same_key(const entry_t *e, sp_respcache_hash_t h, const void *key, size_t key_len)
{
    return e->h.lo == h.lo && e->h.hi == h.hi && e->key_len == key_len &&
           (key_len == 0 || memcmp(e->data, key, key_len) == 0);
}

static entry_t **
chain(sp_respcache_t *c, sp_respcache_hash_t h)
{
    return &c->buckets[h.lo & (c->n_buckets - 1)];
}

static void
lru_unlink(entry_t *e)
{
    e->link.prev->next = e->link.next;
    e->link.next->prev = e->link.prev;
}

static void
lru_push_front(sp_respcache_t *c, entry_t *e)
{
    e->link.next = c->lru.next;
    e->link.prev = &c->lru;
    c->lru.next->prev = &e->link;
    c->lru.next = &e->link;
}

/* Remove e from the table and the list (lock held); the caller drops the
 * cache's reference. */
static void
unlink_entry(sp_respcache_t *c, entry_t *e)
{
    entry_t **pp = chain(c, e->h);
    while (*pp && *pp != e) {
        pp = &(*pp)->hnext;
    }
    if (*pp) {
        *pp = e->hnext;
    }
    lru_unlink(e);
    c->bytes -= e->charge;
    c->n_entries--;
}

/* Double the buckets when the chains grow past one entry on average (lock
 * held). Without memory the table keeps its size: lookups get slower, never wrong. */
static void
maybe_grow(sp_respcache_t *c)
{
    if (c->n_entries <= c->n_buckets) {
        return;
    }
    size_t n = c->n_buckets * 2;
    entry_t **nb = sp_calloc(n, sizeof *nb);
    if (nb == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n_buckets; i++) {
        for (entry_t *e = c->buckets[i]; e;) {
            entry_t *next = e->hnext;
            entry_t **head = &nb[e->h.lo & (n - 1)];
            e->hnext = *head;
            *head = e;
            e = next;
        }
    }
    sp_free(c->buckets);
    c->buckets = nb;
    c->n_buckets = n;
}

bool
sp_respcache_get(sp_respcache_t *c, sp_respcache_hash_t h, const void *key, size_t key_len,
                 sp_respcache_hit_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->mu);
    entry_t *e = *chain(c, h);
    while (e && !same_key(e, h, key, key_len)) {
        e = e->hnext;
    }
    if (e) {
        atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
        lru_unlink(e);
        lru_push_front(c, e);
    }
    pthread_mutex_unlock(&c->mu);
    if (e == NULL) {
        return false;
    }
    out->entry_ = e;
    out->v.content_type = e->content_type;
    out->v.header_name = e->has_header ? e->header_name : NULL;
    out->v.header_value = e->has_header ? e->header_value : NULL;
    out->v.body = e->data + e->key_len;
    out->v.body_len = e->body_len;
    out->v.tag = e->tag;
    return true;
}

void
sp_respcache_hit_release(sp_respcache_hit_t *hit)
{
    if (hit && hit->entry_) {
        entry_unref(hit->entry_);
        hit->entry_ = NULL;
    }
}

static bool
fits(const char *s)
{
    return s == NULL || strlen(s) < SP_RESPCACHE_TEXT_MAX;
}

sp_status_t
sp_respcache_put(sp_respcache_t *c, sp_respcache_hash_t h, const void *key, size_t key_len,
                 const sp_respcache_value_t *v)
{
    if (!fits(v->content_type) || !fits(v->header_name) || !fits(v->header_value) ||
        (v->header_name == NULL) != (v->header_value == NULL)) {
        return SP_ERR_INVALID;
    }
    size_t charge;
    if (sp_add_size(sizeof(entry_t), key_len, &charge) != 0 ||
        sp_add_size(charge, v->body_len, &charge) != 0 || charge > c->capacity / 8) {
        pthread_mutex_lock(&c->mu);
        c->refused++;
        pthread_mutex_unlock(&c->mu);
        return SP_ERR_TOO_LARGE;
    }
    /* Build the entry before taking the lock: the copies are the slow part. */
    entry_t *e = sp_malloc(charge);
    if (e == NULL) {
        return SP_ERR_NOMEM;
    }
    memset(e, 0, sizeof *e);
    e->h = h;
    atomic_init(&e->refs, 1);
    e->charge = charge;
    e->key_len = key_len;
    e->body_len = v->body_len;
    e->tag = v->tag;
    snprintf(e->content_type, sizeof e->content_type, "%s", v->content_type ? v->content_type : "");
    if (v->header_name) {
        e->has_header = true;
        snprintf(e->header_name, sizeof e->header_name, "%s", v->header_name);
        snprintf(e->header_value, sizeof e->header_value, "%s", v->header_value);
    }
    if (key_len) {
        memcpy(e->data, key, key_len);
    }
    if (v->body_len) {
        memcpy(e->data + key_len, v->body, v->body_len);
    }
    entry_t *evicted = NULL; /* freed after the lock is released */
    pthread_mutex_lock(&c->mu);
    entry_t *old = *chain(c, h);
    while (old && !same_key(old, h, key, key_len)) {
        old = old->hnext;
    }
    if (old) {
        /* Another request with the same key stored first: its bytes stay,
         * so every hit replays one answer. */
        pthread_mutex_unlock(&c->mu);
        sp_free(e);
        return SP_OK;
    }
    while (c->bytes + charge > c->capacity && c->lru.prev != &c->lru) {
        entry_t *victim = (entry_t *)c->lru.prev;
        unlink_entry(c, victim);
        c->evictions++;
        victim->hnext = evicted;
        evicted = victim;
    }
    entry_t **head = chain(c, h);
    e->hnext = *head;
    *head = e;
    lru_push_front(c, e);
    c->bytes += charge;
    c->n_entries++;
    c->inserts++;
    maybe_grow(c);
    pthread_mutex_unlock(&c->mu);
    while (evicted) {
        entry_t *next = evicted->hnext;
        entry_unref(evicted);
        evicted = next;
    }
    return SP_OK;
}

void
sp_respcache_get_stats(sp_respcache_t *c, sp_respcache_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    out->capacity_bytes = c->capacity;
    out->bytes = c->bytes;
    out->entries = c->n_entries;
    out->evictions = c->evictions;
    out->inserts = c->inserts;
    out->refused = c->refused;
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ server glue */

bool
sp_rcache_enabled(const sp_served_model_t *m)
{
    return m && m->srv && m->srv->rcache && m->response_cache;
}

void
sp_rckey_add(sp_rckey_t *k, const void *p, size_t n)
{
    if (k == NULL) {
        return;
    }
    sp_rckey_add_u64(k, (uint64_t)n);
    if (n) {
        sp_jbuf_raw(&k->buf, p, n);
    }
}

void
sp_rckey_add_u64(sp_rckey_t *k, uint64_t v)
{
    if (k == NULL) {
        return;
    }
    unsigned char b[8];
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(v >> (8 * i));
    }
    sp_jbuf_raw(&k->buf, (const char *)b, sizeof b);
}

sp_rckey_t *
sp_rckey_new(const sp_served_model_t *m, const char *route)
{
    if (!sp_rcache_enabled(m)) {
        return NULL;
    }
    sp_rckey_t *k = sp_calloc(1, sizeof *k);
    if (k == NULL) {
        return NULL;
    }
    sp_jbuf_init(&k->buf);
    /* Which model built the answer: its name, version and what it was built
     * from (file and config stamps), so a reload never replays old answers. */
    sp_rckey_add(k, "sampan-rcache-1", 15);
    sp_rckey_add(k, route, strlen(route));
    sp_rckey_add(k, m->name, strlen(m->name));
    sp_rckey_add_u64(k, (uint64_t)m->version);
    sp_rckey_add_u64(k, m->sig);
    return k;
}

void
sp_rckey_free(sp_rckey_t *k)
{
    if (k) {
        sp_jbuf_free(&k->buf);
        sp_free(k);
    }
}

static int
dump_cb(const char *buf, size_t size, void *data)
{
    sp_jbuf_raw(data, buf, size);
    return 0;
}

void
sp_rckey_add_json(sp_rckey_t *k, const json_t *obj, const char *const *drop)
{
    if (k == NULL) {
        return;
    }
    /* A shallow copy: dropping keys must not touch the request's own tree. */
    json_t *c = json_copy((json_t *)obj);
    if (c == NULL) {
        k->buf.oom = true;
        return;
    }
    for (int i = 0; drop && drop[i]; i++) {
        const char *dot = strchr(drop[i], '.');
        if (dot == NULL) {
            json_object_del(c, drop[i]);
            continue;
        }
        char parent[64];
        snprintf(parent, sizeof parent, "%.*s", (int)(dot - drop[i]), drop[i]);
        json_t *sub = json_object_get(c, parent);
        if (json_is_object(sub) && json_object_get(sub, dot + 1)) {
            json_t *sc = json_copy(sub);
            if (sc == NULL) {
                k->buf.oom = true;
                break;
            }
            json_object_del(sc, dot + 1);
            json_object_set_new(c, parent, sc);
        }
    }
    /* Length-prefixed like every field: reserve the prefix, patch it after. */
    size_t at = k->buf.len;
    sp_rckey_add_u64(k, 0);
    if (json_dump_callback(c, dump_cb, &k->buf, JSON_COMPACT | JSON_SORT_KEYS) != 0) {
        k->buf.oom = true;
    }
    json_decref(c);
    if (!k->buf.oom) {
        uint64_t n = (uint64_t)(k->buf.len - at - 8);
        for (int i = 0; i < 8; i++) {
            k->buf.p[at + (size_t)i] = (char)(unsigned char)(n >> (8 * i));
        }
    }
}

bool
sp_rcache_lookup(sp_http_req_t *r, sp_served_model_t *m, sp_rckey_t *k, sp_req_clock_t *clk)
{
    if (k == NULL || k->buf.oom || !sp_rcache_enabled(m)) {
        return false;
    }
    sp_respcache_t *c = m->srv->rcache;
    if (!k->hashed) {
        k->h = sp_respcache_hash(c, k->buf.p, k->buf.len);
        k->hashed = true;
    }
    sp_respcache_hit_t hit;
    if (!sp_respcache_get(c, k->h, k->buf.p, k->buf.len, &hit)) {
        atomic_fetch_add_explicit(&m->metrics.cache_misses, 1, memory_order_relaxed);
        return false;
    }
    atomic_fetch_add_explicit(&m->metrics.cache_hits, 1, memory_order_relaxed);
    /* A success like any other (latency observed, no queue or compute time),
     * which the access log marks as answered from the cache. */
    sp_api_account(r, m, clk, true, hit.v.tag == SP_FINISH_LENGTH ? SP_FINISH_LENGTH : SP_FINISH_STOP,
               SP_FAIL_INTERNAL);
    sp_http_req_annotate(r, "cache=hit");
    if (hit.v.header_name) {
        sp_http_add_header(r, hit.v.header_name, hit.v.header_value);
    }
    sp_http_respond(r, 200, hit.v.content_type, hit.v.body, hit.v.body_len);
    sp_respcache_hit_release(&hit);
    return true;
}

void
sp_rcache_store(sp_served_model_t *m, sp_rckey_t *k, const char *content_type,
                const char *header_name, const char *header_value, const void *body, size_t len,
                int finish)
{
    if (k == NULL || k->buf.oom || !k->hashed || !sp_rcache_enabled(m)) {
        return;
    }
    sp_respcache_value_t v = {
        .content_type = content_type,
        .header_name = header_name,
        .header_value = header_value,
        .body = body,
        .body_len = len,
        .tag = finish,
    };
    sp_status_t st = sp_respcache_put(m->srv->rcache, k->h, k->buf.p, k->buf.len, &v);
    if (st != SP_OK && st != SP_ERR_TOO_LARGE) {
        SP_LOG_WARN("event=response_cache_store_failed model=%s status=%s", sp_log_str(m->name),
                    sp_status_str(st));
    }
}
