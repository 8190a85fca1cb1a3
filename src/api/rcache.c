/*
 * rcache.c - the response cache as the protocols use it (rcache.h):
 * whether a model's answers are cached, answering a request from the cache,
 * and storing an answer under its key (rckey.c).
 *
 * Threads: loop threads, each with its own request and key; the cache
 * itself is shared and locks inside (respcache.c).
 */
#include <stdatomic.h>
#include <string.h>

#include "api/api.h"
#include "api/rcache.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/metrics.h"
#include "serving/registry.h"
#include "serving/respcache.h"
#include "serving/serving.h"

bool
sp_rcache_lookup(sp_http_req_t *r, sp_served_model_t *m, sp_rckey_t *k, sp_req_clock_t *clk)
{
    if (k == NULL || k->buf.oom || !sp_rckey_enabled(m)) {
        return false;
    }
    sp_respcache_t *c = m->srv->rcache;
    if (!k->hashed) {
        k->h = sp_respcache_hash(c, k->buf.p, k->buf.len);
        k->hashed = true;
    }
    sp_respcache_hit_t hit;
    int64_t t0 = sp_time_ns();
    if (!sp_respcache_get(c, k->h, k->buf.p, k->buf.len, &hit)) {
        atomic_fetch_add_explicit(&m->metrics.cache_misses, 1, memory_order_relaxed);
        sp_tstat_add(&m->metrics.tstats.cache_miss, sp_time_ns() - t0);
        return false;
    }
    atomic_fetch_add_explicit(&m->metrics.cache_hits, 1, memory_order_relaxed);
    sp_tstat_add(&m->metrics.tstats.cache_hit, sp_time_ns() - t0);
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
    if (k == NULL || k->buf.oom || !k->hashed || !sp_rckey_enabled(m)) {
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
    int64_t t0 = sp_time_ns();
    sp_status_t st = sp_respcache_put(m->srv->rcache, k->h, k->buf.p, k->buf.len, &v);
    /* Triton's cache_miss time is the lookup and the insertion: this is the
     * second part of a miss already counted. */
    atomic_fetch_add_explicit(&m->metrics.tstats.cache_miss.ns, (uint64_t)(sp_time_ns() - t0),
                              memory_order_relaxed);
    if (st != SP_OK && st != SP_ERR_TOO_LARGE) {
        SP_LOG_WARN("event=response_cache_store_failed model=%s status=%s", sp_log_str(m->name),
                    sp_status_str(st));
    }
}
