/*
 * fuzz_onnx.c - libFuzzer target for the ONNX backend's model reader and
 * graph runtime (backends/onnx/: load.c, graph.c and the operators).
 *
 * Seeds: tests/fuzz/corpus/onnx (small models written by
 * tests/fuzz/onnx_seeds.py). Input: the bytes of a model.onnx, written to a
 * private folder and loaded as the backend loads one: decoded, checked,
 * ordered, folded, fused. A model that loads is then run once with every
 * input filled with small values (free dimensions 2), so truncated and
 * mutated files reach the operators with wrong shapes and types. Computed
 * tensors are capped at 2^20 elements so that a mutated Expand or Pad is an
 * error, not an out-of-memory. Load and run errors are expected; crashes,
 * leaks and undefined behaviour are not.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ox.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_onnx.XXXXXX");
        if (mkdtemp(dir) == NULL) abort();
    }
    char path[128];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    FILE *f = fopen(path, "wb");
    if (f == NULL) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);

    char err[512];
    sp_ox_graph_t *g = NULL;
    if (sp_ox_graph_load(path, dir, &g, err, sizeof err) != 0) {
        if (!err[0]) abort(); /* every refusal says why */
        return 0;
    }
    g->max_numel = (int64_t)1 << 20;
    if (sp_ox_graph_prepare(g, err, sizeof err) == 0) {
        sp_ox_run_t r = {0};
        r.g = g;
        r.err = err;
        r.err_len = sizeof err;
        int ok = 1;
        for (int32_t i = 0; i < g->n_inputs && ok; i++) {
            sp_ox_value_t *v = &g->values[g->inputs[i]];
            const Onnx__ValueInfoProto *vi = NULL;
            const Onnx__GraphProto *gp = g->proto->graph;
            for (size_t k = 0; k < gp->n_input; k++) {
                if (strcmp(gp->input[k]->name, v->name) == 0) vi = gp->input[k];
            }
            int64_t dims[OX_MAX_DIMS];
            int32_t nd = 0;
            const Onnx__TensorShapeProto *sh = vi && vi->type && vi->type->tensor_type
                                                   ? vi->type->tensor_type->shape : NULL;
            for (size_t k = 0; sh && k < sh->n_dim && k < OX_MAX_DIMS; k++) {
                const Onnx__TensorShapeProto__Dimension *d = sh->dim[k];
                int64_t x = d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE
                                ? d->dim_value : 2;
                dims[nd++] = x < 0 || x > 64 ? 2 : x;
            }
            if (sp_ox_out(&r, &v->t, v->t.dtype, nd, dims) != 0) {
                ok = 0;
                break;
            }
            size_t bytes = (size_t)sp_ox_numel(&v->t) * sp_ox_dtype_size(v->t.dtype);
            for (size_t k = 0; k < bytes; k++) ((uint8_t *)v->t.data)[k] = (uint8_t)(k % 3);
        }
        if (ok) (void)sp_ox_graph_run(&r);
        sp_ox_run_release_all(&r);
        sp_ox_run_free(&r);
    }
    sp_ox_graph_free(g);
    unlink(path);
    return 0;
}
