/*
 * router.h - method + path patterns to handlers.
 *
 * Patterns are literal segments and {name} captures: "/v1/models/{model}",
 * "/v2/models/{model}/versions/{version}/infer". Each protocol module
 * registers its own routes (sp_openai_register, later sp_kserve_register), so
 * adding one is a new file and one call. HEAD requests match GET routes.
 * A path that matches with another method gives 405, none gives 404.
 */
#ifndef SP_SERVER_ROUTER_H
#define SP_SERVER_ROUTER_H

#include "core/str.h"
#include "sampan/status.h"
#include "server/http.h"

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
/* 0: a handler ran; 404: no route for the path; 405: the path exists for other methods. */
int sp_router_dispatch(const sp_router_t *rt, sp_http_req_t *r);
/* Does path match pattern (captures into *p)? The matcher dispatch uses. */
bool sp_router_match(const char *pattern, sp_str_t path, sp_route_params_t *p);
/* Value of capture `name`, ptr NULL if absent. */
sp_str_t sp_route_param(const sp_route_params_t *p, const char *name);

#endif /* SP_SERVER_ROUTER_H */
