/*
 * tensor_model.h - models served by a backend plugin (XGBoost, identity, ...):
 * their instances and the dynamic batcher in front of them. Their HTTP
 * routes (infer, metadata) are api/tensor_infer.c.
 */
#ifndef SP_SERVING_TENSOR_MODEL_H
#define SP_SERVING_TENSOR_MODEL_H

#include "serving/registry.h"
#include "serving/image.h"
#include "serving/repo_config.h"
#include "sampan/status.h"

struct sp_serving;
struct sp_served_model;

/* What the server does around the backend for a tensor model: image inputs
 * decoded into the tensors the backend takes, and class labels of outputs
 * (Triton's label_filename), indexed as be_info's inputs and outputs. Built
 * at probe, read-only afterwards (any thread). */
typedef struct sp_tensor_io {
    bool any_image;
    bool has_image[SP_BACKEND_MAX_TENSORS];
    sp_img_spec_t image[SP_BACKEND_MAX_TENSORS];
    char *label_store[SP_BACKEND_MAX_TENSORS]; /* the file's bytes, lines NUL-terminated */
    const char **labels[SP_BACKEND_MAX_TENSORS]; /* line i = class i; NULL: no labels */
    int32_t n_labels[SP_BACKEND_MAX_TENSORS];
} sp_tensor_io_t;

#define SP_TENSOR_LABELS_MAX_BYTES ((size_t)16 << 20)

/* The tensor kind of served model (sp_model_kind_t, registry.h): probe
 * places the instances (CPU only) and loads one to learn the memory of
 * each; start loads the others and the batcher in front of them. */
extern const sp_model_kind_t sp_tensor_model_kind;

#endif /* SP_SERVING_TENSOR_MODEL_H */
