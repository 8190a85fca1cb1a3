/*
 * invariance.h - the batch-invariance check the whole-model tests share.
 *
 * A model is batch invariant when a sequence's logits do not depend on what
 * else is in the batch: sp_test_beside_others runs 32 random sequences alone
 * (an sp_ctx, one token at a time) and then together through sp_batch (all
 * prompts in one prefill step, then decode steps whose row order reverses
 * every other step, so each row has other neighbours), and fails the test
 * unless every row's logits are the same bits. Single-threaded callers; the
 * batch itself uses 2 threads. Memory is freed before returning.
 */
#ifndef SP_TEST_INVARIANCE_H
#define SP_TEST_INVARIANCE_H

#include <stdint.h>

#include "engine/model.h"

/* Logits after every position of toks (n rows of n_vocab), the sequence alone in an
 * sp_ctx evaluated one token at a time with a kv_type cache. Free with sp_free. */
float *sp_test_alone_logits(const sp_model_t *m, const int32_t *toks, int64_t n, sp_kv_type_t kv_type);

/* The check above with sequences of len tokens (prompt of them prefilled together,
 * prompt < len <= 32), random ids in [1, n_vocab) drawn from seed; what names the
 * model in failure messages. */
void sp_test_beside_others(const sp_model_t *m, sp_kv_type_t kv_type, int len, int prompt,
                           uint64_t seed, const char *what);

#endif /* SP_TEST_INVARIANCE_H */
