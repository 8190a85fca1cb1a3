/*
 * router.h - method + path patterns to handlers.
 *
 * Patterns are literal segments and {name} captures: "/v1/models/{model}",
 * "/v2/models/{model}/versions/{version}/infer". Each protocol module
 * registers its own routes (sp_openai_register, sp_kserve_register, ...), so
 * adding one is a new file and one call. HEAD requests match GET routes.
 * A path that matches with another method gives 405, none gives 404.
 *
 * Paths are normalised once, here, for matching and for whatever the caller
 * decides from the match (authorisation): empty segments ("//", a trailing
 * "/") are dropped, and a segment that is or percent-decodes to "." or ".."
 * makes the path invalid (400), so no two spellings of a path can reach
 * different routes. Each route carries an access class (opaque to the
 * router, 0 unless set) that the server reads from the route it matched
 * (sp_router_find) before running it (sp_router_run).
 */
#ifndef SP_HTTP_ROUTER_H
#define SP_HTTP_ROUTER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/str.h"
#include "sampan/status.h"
#include "http/http.h"

#define SP_ROUTE_MAX_PARAMS 4

typedef struct sp_route_params {
    int n;
    sp_str_t name[SP_ROUTE_MAX_PARAMS];
    sp_str_t value[SP_ROUTE_MAX_PARAMS]; /* raw (not percent-decoded) path segments */
} sp_route_params_t;

typedef void (*sp_route_fn)(sp_http_req_t *r, const sp_route_params_t *p, void *ud);

typedef struct sp_router sp_router_t;

sp_router_t *sp_router_create(void);
void sp_router_destroy(sp_router_t *rt);
/* pattern is copied. SP_ERR_INVALID for a malformed pattern. */
sp_status_t sp_router_add(sp_router_t *rt, sp_http_method_t method, const char *pattern,
                          sp_route_fn fn, void *ud);
/* Set the access class of the routes whose pattern is `pattern` (prefix
 * false) or starts with its segments (prefix true). Returns how many. */
int sp_router_set_access(sp_router_t *rt, const char *pattern, bool prefix, uint32_t access);

typedef struct sp_route_match {
    const void *route;      /* the matched route (status 0) */
    uint32_t access;        /* its access class; for 405, that of a route with the path */
    sp_route_params_t params;
} sp_route_match_t;

/* Find the route for method + path: 0 (m->route set), 400 (a dot segment),
 * 404 (no route) or 405 (the path exists for other methods). */
int sp_router_find(const sp_router_t *rt, sp_http_method_t method, sp_str_t path,
                   sp_route_match_t *m);
/* Run the handler of a route sp_router_find matched. */
void sp_router_run(const sp_route_match_t *m, sp_http_req_t *r);
/* find + run: 0 when a handler ran, else find's status. */
int sp_router_dispatch(const sp_router_t *rt, sp_http_req_t *r);
/* Does path match pattern (captures into *p)? The matcher dispatch uses. */
bool sp_router_match(const char *pattern, sp_str_t path, sp_route_params_t *p);
/* Value of capture `name`, ptr NULL if absent. */
sp_str_t sp_router_param(const sp_route_params_t *p, const char *name);

#endif /* SP_HTTP_ROUTER_H */
