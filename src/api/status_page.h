/*
 * status_page.h - GET /: the status page a person opens in a browser.
 *
 * One self-contained HTML page (src/api/status_page.html, compiled into
 * the binary at build time by tools/embed.py): no CDN, no fonts, no request
 * to any other origin. It polls GET /stats from the browser and draws the
 * models with their state, the devices' memory against their budgets, the
 * queues per tier and sparklines of tokens/s, latency and TTFT, all client
 * side. The route itself carries no data, so it costs the server one static
 * answer per page load.
 */
#ifndef SP_API_STATUS_PAGE_H
#define SP_API_STATUS_PAGE_H

#include "http/router.h"

typedef struct sp_serving sp_serving_t;

/* Register GET / (and HEAD /, as for every GET route). */
void sp_status_page_register(sp_router_t *rt, sp_serving_t *s);

#endif /* SP_API_STATUS_PAGE_H */
