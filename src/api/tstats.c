/*
 * tstats.c - Triton's statistics extension over REST:
 *   GET /v2/models/stats                               every ready model version
 *   GET /v2/models/{m}/stats                           every ready version of m
 *   GET /v2/models/{m}/versions/{v}/stats              that version
 * answered with Triton's shape ({"model_stats":[...]}, each entry name,
 * version, last_inference, inference_count, execution_count,
 * inference_stats and batch_stats; every duration {count, ns}). The
 * counters are recorded where the work happens (serving/tstats.h); the
 * gRPC ModelStatistics method runs this route and converts its answer.
 *
 * Threads: loop threads; the counters are read with relaxed loads while
 * requests keep recording them. Memory: the answer is built in a jbuf.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "core/alloc.h"
#include "serving/auth.h"
#include "serving/metrics.h"
#include "serving/registry.h"

static void
dur(sp_jbuf_t *b, const char *name, const sp_tstat_dur_t *d, bool first)
{
    sp_jbuf_printf(b, "%s\"%s\":{\"count\":%llu,\"ns\":%llu}", first ? "" : ",", name,
                   (unsigned long long)atomic_load_explicit(&((sp_tstat_dur_t *)d)->count,
                                                            memory_order_relaxed),
                   (unsigned long long)atomic_load_explicit(&((sp_tstat_dur_t *)d)->ns,
                                                            memory_order_relaxed));
}

static int
cmp_size(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* One $model_stat. */
static void
model_stat(sp_jbuf_t *b, const sp_served_model_t *m, bool first)
{
    sp_tstats_t *t = (sp_tstats_t *)&m->metrics.tstats;
    sp_jbuf_lit(b, first ? "{\"name\":" : ",{\"name\":");
    sp_jbuf_cstr(b, m->name);
    sp_jbuf_lit(b, ",\"version\":");
    sp_jbuf_cstr(b, m->version_str);
    sp_jbuf_printf(b, ",\"last_inference\":%llu,\"inference_count\":%llu,\"execution_count\":%llu",
                   (unsigned long long)atomic_load_explicit(&t->last_inference_ms, memory_order_relaxed),
                   (unsigned long long)atomic_load_explicit(&t->inference_count, memory_order_relaxed),
                   (unsigned long long)atomic_load_explicit(&t->execution_count, memory_order_relaxed));
    sp_jbuf_lit(b, ",\"inference_stats\":{");
    dur(b, "success", &t->success, true);
    dur(b, "fail", &t->fail, false);
    dur(b, "queue", &t->queue, false);
    dur(b, "compute_input", &t->compute_input, false);
    dur(b, "compute_infer", &t->compute_infer, false);
    dur(b, "compute_output", &t->compute_output, false);
    dur(b, "cache_hit", &t->cache_hit, false);
    dur(b, "cache_miss", &t->cache_miss, false);
    sp_jbuf_lit(b, "},\"batch_stats\":[");
    /* By batch size, ascending (the table keeps them in claim order). */
    int64_t sizes[SP_TSTATS_BATCH_SIZES];
    int idx[SP_TSTATS_BATCH_SIZES], n = 0;
    for (int i = 0; i < SP_TSTATS_BATCH_SIZES; i++) {
        int64_t sz = atomic_load_explicit(&t->batch[i].size, memory_order_acquire);
        if (sz > 0) {
            sizes[n++] = sz * SP_TSTATS_BATCH_SIZES + i; /* the slot rides along in the key */
        }
    }
    qsort(sizes, (size_t)n, sizeof sizes[0], cmp_size);
    for (int k = 0; k < n; k++) {
        idx[k] = (int)(sizes[k] % SP_TSTATS_BATCH_SIZES);
        const sp_tstat_batch_t *bs = &t->batch[idx[k]];
        sp_jbuf_printf(b, "%s{\"batch_size\":%lld,", k ? "," : "",
                       (long long)(sizes[k] / SP_TSTATS_BATCH_SIZES));
        dur(b, "compute_input", &bs->input, true);
        dur(b, "compute_infer", &bs->infer, false);
        dur(b, "compute_output", &bs->output, false);
        sp_jbuf_lit(b, "}");
    }
    sp_jbuf_lit(b, "]}");
}

static void
h_stats(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    sp_str_t name = sp_router_param(p, "model");
    sp_str_t ver = sp_router_param(p, "version");
    sp_tenant_state_t *u = sp_http_req_user(r);
    if (name.ptr != NULL && !sp_auth_model_allowed(u, name.ptr, name.len)) {
        /* Outside the tenant's list: the same 404 as an unknown name. */
        sp_auth_reject(u, SP_LIMIT_MODEL);
        sp_api_error_kserve(r, 404, "model '%.*s' is not served", (int)name.len, name.ptr);
        return;
    }
    sp_served_model_t **all = NULL;
    int n = sp_registry_snapshot(s, &all);
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"model_stats\":[");
    int written = 0;
    for (int i = 0; i < n; i++) {
        sp_served_model_t *m = all[i];
        size_t nl = strlen(m->name);
        bool want = name.ptr != NULL
                        ? nl == name.len && memcmp(m->name, name.ptr, nl) == 0 &&
                              (ver.ptr == NULL || (strlen(m->version_str) == ver.len &&
                                                   memcmp(m->version_str, ver.ptr, ver.len) == 0))
                        : sp_auth_model_allowed(u, m->name, nl);
        if (want) {
            model_stat(&b, m, written++ == 0);
        }
        sp_served_release(m);
    }
    sp_free(all);
    sp_jbuf_lit(&b, "]}");
    if (name.ptr != NULL && written == 0) {
        /* Triton answers an error for a model (or version) it does not serve. */
        if (ver.ptr != NULL) {
            sp_api_error_kserve(r, 404, "model '%.*s' has no ready version '%.*s'", (int)name.len,
                                name.ptr, (int)ver.len, ver.ptr);
        } else {
            sp_api_error_kserve(r, 404, "model '%.*s' is not served", (int)name.len, name.ptr);
        }
    } else if (b.oom) {
        sp_api_error_kserve(r, 500, "out of memory while writing the response");
    } else {
        sp_api_reply_json(r, 200, &b);
    }
    sp_jbuf_free(&b);
}

void
sp_tstats_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_GET, "/v2/models/stats", h_stats, s);
    sp_router_add(rt, SP_HTTP_GET, "/v2/models/{model}/stats", h_stats, s);
    sp_router_add(rt, SP_HTTP_GET, "/v2/models/{model}/versions/{version}/stats", h_stats, s);
}
