/*
 * quant_mix.h - llama.cpp's quantization "mixes" (the file types of llama-quantize:
 * Q4_K_M, Q5_K_M, Q3_K_M, Q6_K, Q8_0, ...): which tensor type each tensor of a model gets.
 *
 * A mix is a base type plus per-tensor rules that give the sensitive tensors more bits:
 * the output matrix (and a tied token embedding) in q6_k, attn_v and ffn_down in a higher
 * type on a pattern of layers (the first and last eighth and every third in between), a
 * fallback when a row length is not a multiple of the block (q4_k -> q5_0, q6_k -> q8_0,
 * ...), and a few rules keyed on grouped-query attention, 8-expert models and 70B shapes.
 * The choice follows llama.cpp's quantizer so that the same source model gives the same
 * per-tensor types; tests/py/test_llamacpp.py compares both files.
 *
 * Pure functions over a parsed GGUF; no threads, no allocation beyond the caller's arrays
 * and one temporary index array.
 */
#ifndef SP_TOOLS_QUANT_MIX_H
#define SP_TOOLS_QUANT_MIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "sampan/status.h"

typedef struct sp_quant_mix {
    const char *name;  /* as llama-quantize spells it: "Q4_K_M" */
    uint32_t ftype;    /* llama.cpp's LLAMA_FTYPE_* (general.file_type) */
    sp_type_t base;    /* the type of the tensors no rule singles out */
} sp_quant_mix_t;

/* The mix called `name` (case-insensitive), or NULL. */
const sp_quant_mix_t *sp_quant_mix_find(const char *name);
/* The i-th mix of the table (for usage text), NULL past the end. */
const sp_quant_mix_t *sp_quant_mix_at(size_t i);

/* The type of every tensor of g for `mix` (in g's tensor order): types[i], and why[i] a short
 * static reason when it is not the base type (NULL otherwise). `pure`: no per-tensor rules,
 * every quantizable tensor takes the base type (the row-length fallback still applies).
 * Tensors that are not quantized (1-D, norms, ...) keep their source type. Fails with a
 * message naming the tensor for a shape no type fits or an expert tensor outside the
 * model's layers. */
sp_status_t sp_quant_mix_plan(const sp_quant_mix_t *mix, const sp_gguf_t *g, bool pure,
                              sp_type_t *types, const char **why, char *err, size_t err_len);

#endif /* SP_TOOLS_QUANT_MIX_H */
