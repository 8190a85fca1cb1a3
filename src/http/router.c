/* router.c - a list of routes matched segment by segment (a few dozen routes: no trie needed). */
#include "http/router.h"

#include <string.h>

#include "core/alloc.h"

#define MAX_SEGS 16

typedef struct route {
    sp_http_method_t method;
    char *pattern;
    int n_segs;
    sp_str_t segs[MAX_SEGS];
    sp_route_fn fn;
    void *ud;
    uint32_t access;
} route_t;

struct sp_router {
    route_t *routes;
    int n, cap;
};

sp_router_t *
sp_router_create(void)
{
    return sp_calloc(1, sizeof(sp_router_t));
}

void
sp_router_destroy(sp_router_t *rt)
{
    if (rt == NULL) {
        return;
    }
    for (int i = 0; i < rt->n; i++) {
        sp_free(rt->routes[i].pattern);
    }
    sp_free(rt->routes);
    sp_free(rt);
}

/* Is the segment "." or ".." once percent-decoded ("%2e", ".%2E", ...)? */
static bool
dot_segment(const char *p, size_t len)
{
    int dots = 0;
    for (size_t i = 0; i < len;) {
        if (p[i] == '.') {
            i++;
        } else if (i + 2 < len && p[i] == '%' && p[i + 1] == '2' &&
                   (p[i + 2] == 'e' || p[i + 2] == 'E')) {
            i += 3;
        } else {
            return false;
        }
        dots++;
    }
    return dots == 1 || dots == 2;
}

/* Split "/a/b/c" into segments, dropping empty ones; -1 when there are too
 * many, -2 for a dot segment. */
static int
split(const char *p, size_t len, sp_str_t *segs)
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        if (p[i] == '/') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && p[j] != '/') {
            j++;
        }
        if (dot_segment(p + i, j - i)) {
            return -2;
        }
        if (n == MAX_SEGS) {
            return -1;
        }
        segs[n].ptr = p + i;
        segs[n].len = j - i;
        n++;
        i = j;
    }
    return n;
}

sp_status_t
sp_router_add(sp_router_t *rt, sp_http_method_t method, const char *pattern, sp_route_fn fn,
              void *ud)
{
    if (pattern[0] != '/' || fn == NULL) {
        return SP_ERR_INVALID;
    }
    if (rt->n == rt->cap) {
        int cap = rt->cap ? rt->cap * 2 : 16;
        route_t *nr = sp_realloc(rt->routes, (size_t)cap * sizeof *nr);
        if (nr == NULL) {
            return SP_ERR_NOMEM;
        }
        rt->routes = nr;
        rt->cap = cap;
    }
    route_t *r = &rt->routes[rt->n];
    memset(r, 0, sizeof *r);
    r->pattern = sp_strndup(pattern, strlen(pattern));
    if (r->pattern == NULL) {
        return SP_ERR_NOMEM;
    }
    r->n_segs = split(r->pattern, strlen(r->pattern), r->segs);
    int n_params = 0;
    for (int i = 0; i < r->n_segs; i++) {
        if (r->segs[i].ptr[0] == '{') {
            n_params++;
        }
    }
    if (r->n_segs < 0 || n_params > SP_ROUTE_MAX_PARAMS) {
        sp_free(r->pattern);
        return SP_ERR_INVALID;
    }
    r->method = method;
    r->fn = fn;
    r->ud = ud;
    rt->n++;
    return SP_OK;
}

static bool
match(const route_t *r, const sp_str_t *segs, int n, sp_route_params_t *p)
{
    if (n != r->n_segs) {
        return false;
    }
    p->n = 0;
    for (int i = 0; i < n; i++) {
        sp_str_t pat = r->segs[i];
        if (pat.len >= 2 && pat.ptr[0] == '{' && pat.ptr[pat.len - 1] == '}') {
            if (segs[i].len == 0) {
                return false;
            }
            p->name[p->n].ptr = pat.ptr + 1;
            p->name[p->n].len = pat.len - 2;
            p->value[p->n] = segs[i];
            p->n++;
        } else if (pat.len != segs[i].len || memcmp(pat.ptr, segs[i].ptr, pat.len) != 0) {
            return false;
        }
    }
    return true;
}

int
sp_router_set_access(sp_router_t *rt, const char *pattern, bool prefix, uint32_t access)
{
    sp_str_t segs[MAX_SEGS];
    int n = split(pattern, strlen(pattern), segs);
    int changed = 0;
    for (int i = 0; n >= 0 && i < rt->n; i++) {
        route_t *r = &rt->routes[i];
        if (r->n_segs < n || (!prefix && r->n_segs != n)) {
            continue;
        }
        bool same = true;
        for (int k = 0; k < n && same; k++) {
            same = r->segs[k].len == segs[k].len &&
                   memcmp(r->segs[k].ptr, segs[k].ptr, segs[k].len) == 0;
        }
        if (same) {
            r->access = access;
            changed++;
        }
    }
    return changed;
}

int
sp_router_find(const sp_router_t *rt, sp_http_method_t m, sp_str_t path, sp_route_match_t *out)
{
    memset(out, 0, sizeof *out);
    sp_str_t segs[MAX_SEGS];
    int n = split(path.ptr, path.len, segs);
    if (n < 0) {
        return n == -2 ? 400 : 404;
    }
    if (m == SP_HTTP_HEAD) {
        m = SP_HTTP_GET;
    }
    bool other_method = false;
    for (int i = 0; i < rt->n; i++) {
        sp_route_params_t p;
        if (!match(&rt->routes[i], segs, n, &p)) {
            continue;
        }
        if (rt->routes[i].method != m) {
            if (!other_method) {
                out->access = rt->routes[i].access;
            }
            other_method = true;
            continue;
        }
        out->route = &rt->routes[i];
        out->access = rt->routes[i].access;
        out->params = p;
        return 0;
    }
    return other_method ? 405 : 404;
}

void
sp_router_run(const sp_route_match_t *m, sp_http_req_t *r)
{
    const route_t *rt = m->route;
    rt->fn(r, &m->params, rt->ud);
}

int
sp_router_dispatch(const sp_router_t *rt, sp_http_req_t *req)
{
    sp_route_match_t m;
    int st = sp_router_find(rt, sp_http_req_method(req), sp_http_req_path(req), &m);
    if (st == 0) {
        sp_router_run(&m, req);
    }
    return st;
}

bool
sp_router_match(const char *pattern, sp_str_t path, sp_route_params_t *p)
{
    route_t r;
    sp_str_t segs[MAX_SEGS];
    memset(&r, 0, sizeof r);
    r.n_segs = split(pattern, strlen(pattern), r.segs);
    int n = split(path.ptr, path.len, segs);
    return r.n_segs >= 0 && n >= 0 && match(&r, segs, n, p);
}

sp_str_t
sp_router_param(const sp_route_params_t *p, const char *name)
{
    for (int i = 0; i < p->n; i++) {
        if (sp_str_eq_c(p->name[i], name)) {
            return p->value[i];
        }
    }
    sp_str_t none = {NULL, 0};
    return none;
}
