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

#include "serving/repo_config.h"
#include "http/http.h"
#include "http/router.h"
#include "sampan/status.h"

struct sp_serving;
struct sp_served_model;

/* Load m's instances with its backend (m->inst_dev placed, cfg given),
 * reserve their memory and start the batcher. Manager thread. */
sp_status_t sp_tensor_model_build(struct sp_serving *s, struct sp_served_model *m,
                                  const sp_repo_config_t *cfg, char *err, size_t err_len);
/* Stop the batcher (queued requests end with an error) and unload. */
void sp_tensor_model_stop(struct sp_served_model *m);
void sp_tensor_model_free(struct sp_served_model *m);

/* POST .../infer for a tensor model; takes over the request's reference on m. */
void sp_tensor_infer(struct sp_serving *s, sp_http_req_t *r, struct sp_served_model *m);
/* GET /v2/models/{m}[/versions/{v}] for a tensor model (m stays the caller's). */
void sp_tensor_metadata(sp_http_req_t *r, const struct sp_served_model *m);

#endif /* SP_SERVING_TENSOR_MODEL_H */
