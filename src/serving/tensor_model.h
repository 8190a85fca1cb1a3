/*
 * tensor_model.h - models served by a backend plugin (XGBoost, identity, ...):
 * their instances and the dynamic batcher in front of them. Their HTTP
 * routes (infer, metadata) are api/tensor_infer.c.
 */
#ifndef SP_SERVING_TENSOR_MODEL_H
#define SP_SERVING_TENSOR_MODEL_H

#include "serving/registry.h"
#include "serving/repo_config.h"
#include "sampan/status.h"

struct sp_serving;
struct sp_served_model;

/* The tensor kind of served model (sp_model_kind_t, registry.h): probe
 * places the instances (CPU only) and loads one to learn the memory of
 * each; start loads the others and the batcher in front of them. */
extern const sp_model_kind_t sp_tensor_model_kind;

#endif /* SP_SERVING_TENSOR_MODEL_H */
