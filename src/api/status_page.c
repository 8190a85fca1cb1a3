/*
 * status_page.c - GET /: serves the embedded status page (status_page.h).
 *
 * The answer is the same bytes every time, so the handler only adds the
 * headers that make a static page safe to serve next to an API: a strict
 * Content-Security-Policy (computed by tools/embed.py from the page itself:
 * only the page's own inline script and style run, and it may connect to
 * this origin only), nosniff, and no-cache (the page changes with the
 * binary, and a browser must not keep an old one across an upgrade).
 */
#include "api/status_page.h"

/* Generated in $(BUILD)/gen/ by tools/embed.py (Makefile):
 * sp_status_page[], sp_status_page_LEN, sp_status_page_CSP. */
#include "status_page_html.h"

static void
h_status_page(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_http_add_header(r, "Content-Security-Policy", sp_status_page_CSP);
    sp_http_add_header(r, "X-Content-Type-Options", "nosniff");
    sp_http_add_header(r, "Cache-Control", "no-cache");
    sp_http_add_header(r, "Referrer-Policy", "no-referrer");
    sp_http_respond(r, 200, "text/html; charset=utf-8", (const char *)sp_status_page,
                    sp_status_page_LEN);
}

void
sp_status_page_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_GET, "/", h_status_page, s);
}
