/*
 * rckey.c - response cache keys (respcache.h): what makes two requests the
 * same answer, written as length-prefixed fields after the model's identity
 * (name, version and the stamps it was built from), so a reload never
 * replays an old model's answers.
 *
 * Threads: a key belongs to one request. Memory: the key's buffer grows
 * with its fields; sp_rckey_free releases it.
 */
#include <string.h>

#include <jansson.h>

#include "core/alloc.h"
#include "serving/registry.h"
#include "serving/respcache.h"
#include "serving/serving.h"

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

bool
sp_rckey_enabled(const sp_served_model_t *m)
{
    return m && m->srv && m->srv->rcache && m->response_cache;
}

sp_rckey_t *
sp_rckey_new(const sp_served_model_t *m, const char *route)
{
    if (!sp_rckey_enabled(m)) {
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

