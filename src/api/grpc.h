/*
 * grpc.h - the KServe v2 / Open Inference Protocol gRPC service
 * (inference.GRPCInferenceService, proto/grpc_service.proto) on its own port.
 *
 * HTTP/2 is nghttp2's server session, fed from a bufferevent on the HTTP
 * server's own libevent loops (one listening socket, watched by every loop);
 * messages are protobuf-c. Each call is answered by the REST route that
 * means the same (grpc_msg.h), run as a virtual request through the server's
 * handler (http.h, "virtual requests"), so keys, tenants, limits, metrics
 * and the access log are the HTTP ones. docs/grpc.md has the mapping, the
 * status codes and the limits.
 *
 * Threads: sp_grpc_create and sp_grpc_destroy on the main thread; each loop
 * thread calls sp_grpc_loop_start from its loop_init and sp_grpc_loop_stop
 * from its loop_fini; sp_grpc_stop_accepting from any thread.
 */
#ifndef SP_API_GRPC_H
#define SP_API_GRPC_H

#include <stdbool.h>
#include <stddef.h>

#include "sampan/status.h"
#include "http/http.h"

struct sp_serving;
typedef struct sp_grpc sp_grpc_t;
typedef struct sp_grpc_loop sp_grpc_loop_t;

#define SP_GRPC_DEFAULT_PORT 8001
#define SP_GRPC_MAX_STREAMS 100      /* SETTINGS_MAX_CONCURRENT_STREAMS per connection */
#define SP_GRPC_STREAM_MAX_CALLS 32  /* ModelStreamInfer requests in flight per stream */

typedef struct sp_grpc_params {
    const char *host;
    int port;                  /* 0: a free port (tests) */
    sp_http_limits_t limits;   /* the HTTP limits: max_body_bytes bounds a message */
    struct sp_serving *srv;     /* for the registry (ModelStreamInfer's LLM test) */
    const char *tls_cert, *tls_key, *tls_client_ca; /* TLS (ALPN h2) when tls_cert is set */
} sp_grpc_params_t;

/* Bind and listen (main thread, before the loops start). */
sp_status_t sp_grpc_create(const sp_grpc_params_t *p, sp_grpc_t **out, char *err, size_t err_len);
int sp_grpc_port(const sp_grpc_t *g);
bool sp_grpc_tls(const sp_grpc_t *g);
/* Loop thread, before it runs: accept and serve on this loop. NULL when out of memory. */
sp_grpc_loop_t *sp_grpc_loop_start(sp_grpc_t *g, sp_http_loop_t *loop);
/* Loop thread, after it stopped: close every connection (calls in flight are cancelled). */
void sp_grpc_loop_stop(sp_grpc_loop_t *gl);
/* Any thread (drain): stop accepting; connections get GOAWAY, calls in flight finish. */
void sp_grpc_stop_accepting(sp_grpc_t *g);
/* Main thread, after the loops are gone. NULL: no-op. */
void sp_grpc_destroy(sp_grpc_t *g);

#endif /* SP_API_GRPC_H */
