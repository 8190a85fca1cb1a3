/*
 * respcache.h - the response cache: whole answers of deterministic requests,
 * kept in memory and replayed byte for byte (Triton's response cache).
 *
 * Two layers:
 *
 *  1. sp_respcache_t, a plain byte-bounded LRU map from a request key (any
 *     bytes) to a stored response (body, content type, one extra header, a
 *     caller's tag). One per process (sp_serving_t.rcache), shared by every
 *     model and loop thread behind one mutex: a lookup or an insert holds it
 *     for a hash-table probe and a few pointer moves, never for a copy of a
 *     body (entries are reference-counted, so a hit is answered from the
 *     entry after the lock is released, even if it is evicted meanwhile).
 *
 *     The table is indexed by 128 bits of SHA-256 of the key, but a hit also
 *     compares the full key bytes: a collision (or a forged one) can cost a
 *     miss, never another request's answer. The byte bound counts keys,
 *     bodies and the entry headers; an entry larger than 1/8 of the bound is
 *     refused so that one answer cannot flush the whole cache. When two
 *     requests with the same key miss at once, the first answer stored stays
 *     (later ones are dropped): every hit replays the same bytes.
 *
 *  2. The server glue (sp_rcache_*, sp_rckey_*): keys built from a served
 *     model (name, version and build signature, so a reloaded model never
 *     serves its predecessor's answers), a route and the request's
 *     canonical content; lookups that answer the request on a hit and count
 *     hits and misses in the model's metrics; stores after a successful
 *     answer. Which requests may be cached at all (deterministic ones only)
 *     is the caller's decision: see docs/api.md, "Response cache".
 */
#ifndef SP_SERVING_RESPCACHE_H
#define SP_SERVING_RESPCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "sampan/status.h"
#include "http/http.h"
#include "core/json.h"
#include "serving/metrics.h"

#define SP_RESPCACHE_TEXT_MAX 64 /* bytes of a content type, header name or value, with the NUL */

typedef struct sp_respcache sp_respcache_t;

typedef struct sp_respcache_hash {
    uint64_t lo, hi;
} sp_respcache_hash_t;

/* A response to store (copied by sp_respcache_put) or a stored one (borrowed
 * from its entry until sp_respcache_hit_release). */
typedef struct sp_respcache_value {
    const char *content_type;  /* NUL-terminated, < SP_RESPCACHE_TEXT_MAX bytes */
    const char *header_name;   /* one extra response header, or NULL */
    const char *header_value;
    const void *body;
    size_t body_len;
    int tag;                   /* the caller's (the server: the finish reason) */
} sp_respcache_value_t;

typedef struct sp_respcache_hit {
    sp_respcache_value_t v;
    void *entry_;              /* the reference the hit holds */
} sp_respcache_hit_t;

typedef struct sp_respcache_stats {
    uint64_t capacity_bytes;
    uint64_t bytes;            /* charged by the entries held */
    uint64_t entries;
    uint64_t evictions;        /* entries dropped to make room */
    uint64_t inserts;
    uint64_t refused;          /* entries over 1/8 of the capacity */
} sp_respcache_stats_t;

/* A cache of at most capacity_bytes (> 0). *out NULL on failure. */
sp_status_t sp_respcache_create(uint64_t capacity_bytes, sp_respcache_t **out, char *err,
                                size_t err_len);
/* Frees every entry. No hit may be outstanding. NULL is a no-op. */
void sp_respcache_destroy(sp_respcache_t *c);

/* 128 bits of SHA-256 of key. */
sp_respcache_hash_t sp_respcache_hash(const sp_respcache_t *c, const void *key, size_t len);

/* Look up (h, key). true: *out holds the entry (now the most recently used)
 * until sp_respcache_hit_release. Keys are compared in full. */
bool sp_respcache_get(sp_respcache_t *c, sp_respcache_hash_t h, const void *key, size_t key_len,
                      sp_respcache_hit_t *out);
void sp_respcache_hit_release(sp_respcache_hit_t *hit);

/* Store a copy of v under (h, key), evicting the least recently used
 * entries as needed. SP_OK when stored or when the key is already present
 * (the first answer stays); SP_ERR_TOO_LARGE when the entry would take more
 * than 1/8 of the capacity; SP_ERR_INVALID for over-long texts;
 * SP_ERR_NOMEM. */
sp_status_t sp_respcache_put(sp_respcache_t *c, sp_respcache_hash_t h, const void *key,
                             size_t key_len, const sp_respcache_value_t *v);

void sp_respcache_get_stats(sp_respcache_t *c, sp_respcache_stats_t *out);

/* ------------------------------------------------------------------ server glue */

struct sp_served_model;

/* A request's cache key: the canonical bytes, hashed at lookup. */
typedef struct sp_rckey {
    sp_jbuf_t buf;
    sp_respcache_hash_t h;
    bool hashed;
} sp_rckey_t;

/* Whether m's answers are cached: the server has a cache
 * (--response-cache-bytes) and the model enables it. */
bool sp_rckey_enabled(const struct sp_served_model *m);

/* A new key for m and route ("openai/completions", "kserve/infer", ...), or
 * NULL when m's answers are not cached or memory ran out (the request then
 * simply runs uncached). Free with sp_rckey_free (NULL is a no-op). */
sp_rckey_t *sp_rckey_new(const struct sp_served_model *m, const char *route);
void sp_rckey_free(sp_rckey_t *k);
/* Append a field, length-prefixed so that the encoding is unambiguous. */
void sp_rckey_add(sp_rckey_t *k, const void *p, size_t n);
void sp_rckey_add_u64(sp_rckey_t *k, uint64_t v);
/* Append a JSON object as compact JSON with sorted keys, without the
 * top-level keys in drop (NULL-terminated; "parameters.priority" drops a
 * key of the object under "parameters"). */
void sp_rckey_add_json(sp_rckey_t *k, const json_t *obj, const char *const *drop);

#endif /* SP_SERVING_RESPCACHE_H */
