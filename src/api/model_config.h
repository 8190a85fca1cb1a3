/*
 * model_config.h - GET /v2/models/{m}[/versions/{v}]/config: a served model's
 * configuration as Triton answers it (inference.ModelConfig in the proto3
 * JSON mapping, proto field names). gRPC ModelConfig is this route too.
 */
#ifndef SP_API_MODEL_CONFIG_H
#define SP_API_MODEL_CONFIG_H

#include "http/router.h"
#include "serving/serving.h"

void sp_model_config_register(sp_router_t *rt, sp_serving_t *s);

#endif /* SP_API_MODEL_CONFIG_H */
