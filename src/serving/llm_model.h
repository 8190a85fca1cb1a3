/*
 * llm_model.h - the LLM kind of served model (sp_model_kind_t, registry.h):
 * a GGUF model on the engine with one scheduler per instance.
 *
 * The manager builds an LLM with sp_registry_build(s, &sp_llm_model_kind, ...)
 * for a --model file or a repository model whose backend is the engine.
 */
#ifndef SP_SERVING_LLM_MODEL_H
#define SP_SERVING_LLM_MODEL_H

#include "serving/registry.h"

extern const sp_model_kind_t sp_llm_model_kind;

#endif /* SP_SERVING_LLM_MODEL_H */
