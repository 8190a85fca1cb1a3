/*
 * rcache.h - the response cache as the protocols use it: whether a model's
 * answers are cached, answering a request from the cache (which ends the
 * request's accounting like any other answer), and keeping an answer. The
 * cache itself and its keys are serving's (serving/respcache.h).
 *
 * Threads: loop threads, each with its own request and key.
 */
#ifndef SP_API_RCACHE_H
#define SP_API_RCACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "http/http.h"
#include "serving/metrics.h"
#include "serving/registry.h"
#include "serving/respcache.h"

/* Look the key up. On a hit: count it, end the request's clock as a success
 * (with the stored finish reason), answer r with the stored response and
 * return true (r must not be used afterwards). On a miss: count it and
 * return false. k NULL: false, nothing counted. */
bool sp_rcache_lookup(sp_http_req_t *r, struct sp_served_model *m, sp_rckey_t *k,
                      sp_req_clock_t *clk);
/* Keep a successful answer under k (looked up before). k NULL: nothing. */
void sp_rcache_store(struct sp_served_model *m, sp_rckey_t *k, const char *content_type,
                     const char *header_name, const char *header_value, const void *body,
                     size_t len, int finish);

#endif /* SP_API_RCACHE_H */
