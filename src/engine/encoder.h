/*
 * encoder.h - bidirectional encoders (BERT and nomic-bert GGUF files) for
 * embeddings and reranking.
 *
 * An encoder loads through sp_model_load like any model (model.c hands
 * general.architecture bert / nomic-bert to encoder.c) and runs through an
 * sp_ctx: sp_ctx_embed pools the final hidden states as the file's
 * `<arch>.pooling_type` says. Generation (sp_ctx_eval, the scheduler's
 * generative jobs) is refused for it.
 *
 * Threads and memory: as sp_ctx (one thread per context at a time, every
 * buffer allocated at create).
 */
#ifndef SP_ENGINE_ENCODER_H
#define SP_ENGINE_ENCODER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model.h"

/* GGUF's pooling_type numbers (llama.cpp's enum). */
typedef enum sp_pooling {
    SP_POOLING_NONE = 0, /* per-token states: no single vector, refused for embeddings */
    SP_POOLING_MEAN = 1,
    SP_POOLING_CLS = 2,  /* the first position ([CLS]) */
    SP_POOLING_LAST = 3,
    SP_POOLING_RANK = 4, /* [CLS] through the classification head: relevance scores */
} sp_pooling_t;

/* true for a bert / nomic-bert model (no generation). */
bool sp_model_is_encoder(const sp_model_t *m);
/* The pooling the model's file asks for; SP_POOLING_MEAN for generative models
 * (what sp_ctx_embed does for them). */
sp_pooling_t sp_model_pooling(const sp_model_t *m);
/* "none", "mean", "cls", "last", "rank". */
const char *sp_pooling_name(sp_pooling_t p);
/* Scores a reranker writes (its classification head's outputs, >= 1); 0 for
 * every other model. */
int64_t sp_model_n_cls_out(const sp_model_t *m);

#endif /* SP_ENGINE_ENCODER_H */
