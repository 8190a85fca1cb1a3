/*
 * grpc_msg.h - the gRPC front end's translation between the protocol's
 * protobuf messages (proto/grpc_service.proto) and the REST routes of
 * kserve.c (internal to src/api/grpc*.c).
 *
 * A gRPC call is served by the REST route that means the same thing: the
 * message becomes that route's request (a KServe v2 infer request with every
 * tensor in the binary tail, a generate_stream body, a GET), the server's own
 * handler answers it as it answers HTTP (keys, tenants, limits, validation,
 * batcher, metrics, access log), and the answer becomes the method's reply
 * message or a gRPC status. So REST and gRPC cannot drift: there is one
 * implementation of each check, and this file only checks what REST cannot
 * see (the typed contents of a tensor, which must match its datatype).
 *
 * Everything here is pure (no I/O, no loop): messages are untrusted bytes,
 * decoded by protobuf-c under an allocation budget (a small message must not
 * be able to expand into a large allocation), and every failure is a gRPC
 * status code with a one-line message naming the field.
 */
#ifndef SP_API_GRPC_MSG_H
#define SP_API_GRPC_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"

/* gRPC status codes (grpc/doc/statuscodes.md). */
enum {
    SP_GRPC_OK = 0,
    SP_GRPC_CANCELLED = 1,
    SP_GRPC_UNKNOWN = 2,
    SP_GRPC_INVALID_ARGUMENT = 3,
    SP_GRPC_DEADLINE_EXCEEDED = 4,
    SP_GRPC_NOT_FOUND = 5,
    SP_GRPC_PERMISSION_DENIED = 7,
    SP_GRPC_RESOURCE_EXHAUSTED = 8,
    SP_GRPC_FAILED_PRECONDITION = 9,
    SP_GRPC_ABORTED = 10,
    SP_GRPC_UNIMPLEMENTED = 12,
    SP_GRPC_INTERNAL = 13,
    SP_GRPC_UNAVAILABLE = 14,
    SP_GRPC_UNAUTHENTICATED = 16,
};

/* The service's methods, found by their HTTP/2 :path. */
typedef enum sp_grpc_method {
    SP_GRPC_SERVER_LIVE,
    SP_GRPC_SERVER_READY,
    SP_GRPC_MODEL_READY,
    SP_GRPC_SERVER_METADATA,
    SP_GRPC_MODEL_METADATA,
    SP_GRPC_MODEL_INFER,
    SP_GRPC_MODEL_STREAM_INFER, /* bidirectional: many requests, many responses */
    SP_GRPC_MODEL_CONFIG,
    /* Triton's statistics and repository methods, and grpc.health.v1.Health
     * (grpc_ext.c): from SP_GRPC_EXT_FIRST on. */
    SP_GRPC_MODEL_STATISTICS,
    SP_GRPC_REPOSITORY_INDEX,
    SP_GRPC_REPOSITORY_MODEL_LOAD,
    SP_GRPC_REPOSITORY_MODEL_UNLOAD,
    SP_GRPC_HEALTH_CHECK,
    SP_GRPC_HEALTH_WATCH,       /* server streaming: the status, then each change */
    SP_GRPC_METHOD_COUNT
} sp_grpc_method_t;

/* The method of ":path" ("/inference.GRPCInferenceService/ModelInfer"), or -1
 * (the methods from SP_GRPC_EXT_FIRST on are grpc_ext.c's). */
int sp__grpc_msg_method_find(const char *path, size_t len);
const char *sp__grpc_msg_method_name(int m);

/* How to read the REST answer. */
typedef enum sp_grpc_kind {
    SP_GRPC_K_LIVE,
    SP_GRPC_K_READY,
    SP_GRPC_K_MODEL_READY,
    SP_GRPC_K_SERVER_META,
    SP_GRPC_K_MODEL_META,
    SP_GRPC_K_INFER,      /* .../infer: one ModelInferResponse */
    SP_GRPC_K_GENERATE,   /* .../generate_stream: SSE events, one response each */
    SP_GRPC_K_MODEL_CONFIG, /* .../config: Triton's ModelConfig JSON */
    SP_GRPC_K_STATS,      /* the rest: grpc_ext.c */
    SP_GRPC_K_REPO_INDEX,
    SP_GRPC_K_REPO_LOAD,
    SP_GRPC_K_REPO_UNLOAD,
    SP_GRPC_K_HEALTH,       /* a readiness route as a HealthCheckResponse */
    SP_GRPC_K_HEALTH_WATCH, /* the same; an unknown service is SERVICE_UNKNOWN, not an error */
} sp_grpc_kind_t;

/* A call as a REST request. */
typedef struct sp_grpc_rest {
    sp_grpc_kind_t kind;
    sp_http_method_t method;
    char path[600];
    size_t path_len;
    char *body; /* owned (sp_malloc), NULL for GET */
    size_t body_len;
    char hl[24]; /* Inference-Header-Content-Length, "" = none */
    char id[128]; /* the request's id, for in-stream errors ("" = none) */
} sp_grpc_rest_t;

/* Whether a model is an LLM (generate) or a tensor model (infer): asked by
 * ModelStreamInfer of the model a request names. */
typedef bool (*sp_grpc_is_llm_fn)(void *ud, const char *name, size_t len, const char *version,
                                  size_t vlen);

/*
 * Decode the request message of method m (msg, len: one gRPC message without
 * its 5-byte prefix) and build the REST request. Returns SP_GRPC_OK, or a
 * status with err set (INVALID_ARGUMENT for a malformed message or a bad
 * field, RESOURCE_EXHAUSTED when decoding would need more memory than the
 * budget allows). For SP_GRPC_MODEL_STREAM_INFER, is_llm picks the route.
 */
int sp__grpc_msg_to_rest(int m, const uint8_t *msg, size_t len, sp_grpc_is_llm_fn is_llm, void *ud,
                     sp_grpc_rest_t *out, char *err, size_t err_len);
void sp__grpc_msg_rest_free(sp_grpc_rest_t *r);

/*
 * A complete REST answer as the method's reply: *out (sp_malloc, with the
 * 5-byte gRPC message prefix) for SP_GRPC_OK; otherwise the status and err
 * (the REST error's message). stream: wrap the ModelInferResponse in a
 * ModelStreamInferResponse, and report an error as one with error_message
 * (SP_GRPC_OK with *out set) unless it is UNAUTHENTICATED, which ends the
 * whole stream.
 */
int sp__grpc_msg_from_rest(sp_grpc_kind_t kind, bool stream, int status, const char *hdrs,
                       size_t hdrs_len, const char *body, size_t len, const char *id,
                       uint8_t **out, size_t *out_len, char *err, size_t err_len);

/*
 * One generate_stream event (the JSON after "data: ") as a prefixed
 * ModelStreamInferResponse in *out; *final when it is the request's last
 * (a finish_reason or an error). false when memory ran out.
 */
bool sp__grpc_msg_from_event(const char *json, size_t len, const char *id, uint8_t **out,
                         size_t *out_len, bool *final);

/* A ModelStreamInferResponse carrying error_message (and the request's id
 * when not ""), prefixed, in *out. false when memory ran out. */
bool sp__grpc_msg_stream_error(const char *msg, const char *id, uint8_t **out, size_t *out_len);

/* The HTTP status of a REST answer as a gRPC status code. */
int sp__grpc_msg_code_of_http(int status);

/* ---- shared with grpc_ext.c (the methods from SP_GRPC_MODEL_STATISTICS on) */

#define SP_GRPC_EXT_FIRST SP_GRPC_MODEL_STATISTICS

struct ProtobufCMessage;
struct ProtobufCMessageDescriptor;
/* Decode msg under the allocation budget, refusing a NUL in the top-level
 * string fields of nul_mask (bit f: field f, named names[f]), call fn with
 * the message and free it. Returns fn's status or the decoding's. */
typedef int (*sp_grpc_decoded_fn)(const struct ProtobufCMessage *m, void *ud, char *err,
                                  size_t err_len);
int sp__grpc_msg_decoded(const struct ProtobufCMessageDescriptor *desc, const uint8_t *msg,
                         size_t len, unsigned nul_mask, const char *const *names,
                         sp_grpc_decoded_fn fn, void *ud, char *err, size_t err_len);
/* A model name or version that can stand in a REST path segment: 1..max
 * bytes, no control character, space, '/', '?', '#', '%' or '\\'. */
bool sp__grpc_msg_segment_ok(const char *s, size_t max);
/* A message packed with its 5-byte gRPC prefix into *out (sp_malloc). */
bool sp__grpc_msg_pack(const struct ProtobufCMessage *m, uint8_t **out, size_t *out_len);
/* The message of a REST error body ({"error": "..."}), or a generic one. */
void sp__grpc_msg_error_of(const char *body, size_t len, int status, char *err, size_t err_len);

/* grpc_ext.c (grpc.c dispatches to it; it uses the helpers above): the
 * method of a :path among SP_GRPC_EXT_FIRST.. (-1: none), its name, its REST
 * request and its reply. */
int sp__grpc_ext_method_find(const char *path, size_t len);
const char *sp__grpc_ext_method_name(int m);
int sp__grpc_ext_to_rest(int m, const uint8_t *msg, size_t len, sp_grpc_rest_t *out, char *err,
                         size_t err_len);
/* kind from SP_GRPC_K_STATS on; status is the REST answer's: any for the
 * health kinds (readiness answers are replies), 200 for the others (an error
 * answer is sp__grpc_msg_from_rest's to translate). */
int sp__grpc_ext_from_rest(sp_grpc_kind_t kind, int status, const char *body, size_t len,
                           uint8_t **out, size_t *out_len, char *err, size_t err_len);

#endif /* SP_API_GRPC_MSG_H */
