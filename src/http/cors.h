/*
 * cors.h - Cross-Origin Resource Sharing for `sampan serve` (--cors-origins).
 *
 * Off unless origins are configured: then no Access-Control-* header is ever
 * written. With a list, a request whose Origin equals one entry byte for
 * byte gets Access-Control-Allow-Origin with that origin (and
 * Access-Control-Expose-Headers), every response gets Vary: Origin (caches
 * must not hand one origin's answer to another), and a preflight (OPTIONS
 * with Access-Control-Request-Method) is answered 204 here. A preflight
 * from any other origin is refused with 403 and no Access-Control-* header;
 * its other requests go on without CORS headers (the browser then hides the
 * answer from the page). The entry "*" allows every origin with the literal
 * "Access-Control-Allow-Origin: *", which browsers never combine with
 * credentials (cookies, client certificates); Sampan never sends
 * Access-Control-Allow-Credentials. docs/security.md, "Transport".
 */
#ifndef SP_HTTP_CORS_H
#define SP_HTTP_CORS_H

#include <stdbool.h>

#include "core/str.h"
#include "http/http.h"

/* origins: the comma-separated list ("" = CORS off; spaces around entries
 * are ignored). true when origin matches an entry exactly; *wildcard is set
 * when it matched only through "*". */
bool sp_cors_origin_allowed(const char *origins, sp_str_t origin, bool *wildcard);

/* true when the list has the entry "*" (start-up warns about it). */
bool sp_cors_has_wildcard(const char *origins);

typedef enum sp_cors_decision {
    SP_CORS_CONTINUE = 0, /* go on with the request (its CORS headers are added) */
    SP_CORS_ANSWERED,     /* a preflight answered here (204): leave the request alone */
    SP_CORS_REFUSED,      /* a preflight from an origin not listed: the caller answers
                           * 403 in its protocol's error shape (the transport knows none) */
} sp_cors_decision_t;

/* Called first for every request (loop thread). Adds the CORS headers the
 * request deserves and says what is left to do. */
sp_cors_decision_t sp_cors_handle(sp_http_req_t *r, const char *origins);

#endif /* SP_HTTP_CORS_H */
