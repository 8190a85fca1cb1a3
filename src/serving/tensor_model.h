/*
 * tensor_model.h - models served by a backend plugin (XGBoost, identity, ...):
 * their instances and the dynamic batcher in front of them. Their HTTP
 * routes (infer, metadata) are api/tensor_infer.c.
 */
#ifndef SP_SERVING_TENSOR_MODEL_H
#define SP_SERVING_TENSOR_MODEL_H

#include "serving/repo_config.h"
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

#endif /* SP_SERVING_TENSOR_MODEL_H */
