/*
 * tensor_infer.h - the KServe v2 infer and metadata routes of a tensor model
 * (a backend plugin behind the dynamic batcher). kserve.c dispatches to these
 * once it has found the model and seen that it is a tensor model.
 *
 * Threads: the request's loop thread.
 */
#ifndef SP_API_TENSOR_INFER_H
#define SP_API_TENSOR_INFER_H

#include "http/http.h"
#include "serving/serving.h"

/* POST .../infer for a tensor model; takes over the request's reference on m. */
void sp_tensor_infer(sp_serving_t *s, sp_http_req_t *r, sp_served_model_t *m);
/* GET /v2/models/{m}[/versions/{v}] for a tensor model (m stays the caller's). */
void sp_tensor_infer_metadata(sp_http_req_t *r, const sp_served_model_t *m);

/* An infer response body: json followed by the binary tail bin when it is not
 * empty. hl gets the Inference-Header-Content-Length value ("" without a
 * tail; the content type is then application/json, else
 * application/octet-stream). false when memory ran out. */
bool sp_tensor_infer_body(sp_jbuf_t *json, const sp_jbuf_t *bin, char hl[32]);

#endif /* SP_API_TENSOR_INFER_H */
