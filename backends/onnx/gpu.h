/*
 * backends/onnx/gpu.h - the ONNX plugin's GPU path: which models run on the
 * GPU (config.json's instance_group KIND_GPU), loading the GPU executor
 * library at run time (gpu_api.h), lowering the prepared graph for it and
 * running batches through it.
 *
 * The plugin never links CUDA: without the library, a driver or a GPU, a
 * KIND_GPU model fails to load with the reason and CPU models are served
 * as always.
 * Threads: as the CPU run context (one batch at a time per instance).
 */
#ifndef SP_BACKENDS_ONNX_GPU_H
#define SP_BACKENDS_ONNX_GPU_H

#include <stdbool.h>
#include <stdint.h>

#include "../common.h"
#include "ox.h"

/* Workspace bytes a convolution's algorithm may use (cuDNN picks the fastest within it). */
#define SP_OX_GPU_WORKSPACE ((uint64_t)256 << 20)

typedef struct sp_ox_gpu_cfg {
    bool on;          /* every instance group is KIND_GPU */
    int32_t device;   /* CUDA ordinal (instance_group[].gpus[0], else 0) */
    bool fp16;        /* parameters.precision "fp16" */
} sp_ox_gpu_cfg_t;

typedef struct sp_ox_gpu sp_ox_gpu_t;

/* Read instance_group and parameters.precision. 0, or -1 with err (a mix of CPU and GPU
 * groups, several GPUs, an unknown precision for the GPU). */
int sp_ox_gpu_config(const sp__bk_config_t *cfg, sp_ox_gpu_cfg_t *gc, char *err, size_t err_len);
/* Open the library, lower g (prepared) and load it on the device. 0 or -1 with err. */
int sp_ox_gpu_load(const sp_ox_graph_t *g, const sp_ox_gpu_cfg_t *gc, sp_ox_gpu_t **out, char *err,
                   size_t err_len);
/* Run one batch: inputs[i] feeds graph value in_value[i]; outputs named, filled with
 * alloc'd data (as the backend ABI's execute). */
int sp_ox_gpu_execute(sp_ox_gpu_t *gpu, const sp_ox_graph_t *g, const int32_t *in_value,
                      const sp_backend_tensor_t *inputs, int32_t n_inputs, sp_backend_tensor_t *outputs,
                      int32_t n_outputs, void *(*alloc)(size_t), char *err, size_t err_len);
uint64_t sp_ox_gpu_device_bytes(const sp_ox_gpu_t *gpu);
/* Where the library came from, for the load log. */
const char *sp_ox_gpu_lib_path(const sp_ox_gpu_t *gpu);
void sp_ox_gpu_free(sp_ox_gpu_t *gpu);

#endif /* SP_BACKENDS_ONNX_GPU_H */
