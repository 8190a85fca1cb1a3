/*
 * yarn.h - YaRN RoPE context extension (rope.scaling.type "yarn", as
 * llama.cpp runs it: gpt-oss, long-context Qwen and Llama files),
 * engine-private. YaRN keeps each rotation linear in the position: pair i
 * turns by p * f_i * mix_i, where mix_i blends the interpolated frequency
 * (f_i / factor) into the original one over a ramp of pair indices set by
 * beta_fast / beta_slow and the original context length, and every cos/sin is
 * multiplied by rope_mscale = attn_factor * (1 + 0.1 ln factor). So the
 * forward pass only needs a different frequency table and one multiplier.
 * Pure functions; no state, no allocation.
 */
#ifndef SP_ENGINE_YARN_H
#define SP_ENGINE_YARN_H

#include <stddef.h>

#include "engine/model.h"
#include "gguf/gguf.h"

/* Read the YaRN keys of a file whose `<arch>.rope.scaling.type` is "yarn"
 * into hp (rope_yarn, yarn_*, rope_mscale; rope_scale stays 1), with range
 * checks. hp->arch, n_rot, rope_base and n_ctx_train must be set. */
sp_status_t sp__yarn_load(const sp_gguf_t *g, sp_hparams_t *hp, char *err, size_t err_len);

/* The factor pair i's frequency is multiplied by (1 without YaRN). */
double sp__yarn_mix(const sp_hparams_t *hp, int64_t i);

#endif /* SP_ENGINE_YARN_H */
