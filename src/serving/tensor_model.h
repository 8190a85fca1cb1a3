/*
 * tensor_model.h - models served by a backend plugin (XGBoost, identity, ...):
 * their instances, the dynamic batcher in front of them, and the KServe v2
 * infer and metadata routes for them.
 *
 * A request is decoded (tensor.c), its inputs put in the model's declared
 * order and checked, then handed to the batcher, which merges it with
 * others into one backend call on an instance's worker thread and splits the
 * outputs back. The result comes back to the request's event loop through
 * its mailbox (sp_mailbox_post), so the loop never waits for a backend; a
 * client that goes away meanwhile is simply not answered.
 */
#ifndef SP_SERVING_TENSOR_MODEL_H
#define SP_SERVING_TENSOR_MODEL_H

#include "serving/registry.h"
#include "serving/repo_config.h"
#include "http/http.h"
#include "http/router.h"
#include "sampan/status.h"

struct sp_serving;
struct sp_served_model;

/* The tensor kind of served model (sp_model_kind_t, registry.h): probe
 * places the instances (CPU only) and loads one to learn the memory of
 * each; start loads the others and the batcher in front of them. */
extern const sp_model_kind_t sp_tensor_model_kind;

/* POST .../infer for a tensor model; takes over the request's reference on m. */
void sp_tensor_infer(struct sp_serving *s, sp_http_req_t *r, struct sp_served_model *m);
/* GET /v2/models/{m}[/versions/{v}] for a tensor model (m stays the caller's). */
void sp_tensor_metadata(sp_http_req_t *r, const struct sp_served_model *m);

#endif /* SP_SERVING_TENSOR_MODEL_H */
