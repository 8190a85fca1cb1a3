/*
 * tstats.c - recording Triton's per-model statistics (tstats.h): relaxed
 * atomic adds, and a lock-free table of batch sizes (a slot is claimed by
 * a compare-and-swap of its size from 0). Any thread; no allocation.
 */
#include "serving/tstats.h"

void
sp_tstat_add(sp_tstat_dur_t *d, int64_t ns)
{
    atomic_fetch_add_explicit(&d->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->ns, (uint64_t)(ns > 0 ? ns : 0), memory_order_relaxed);
}

void
sp_tstats_batch(sp_tstats_t *t, int64_t size, int64_t input_ns, int64_t infer_ns,
                int64_t output_ns)
{
    atomic_fetch_add_explicit(&t->execution_count, 1, memory_order_relaxed);
    if (size <= 0) {
        return;
    }
    /* Probe from the size's own slot: a size is claimed once and never moves. */
    for (int i = 0; i < SP_TSTATS_BATCH_SIZES; i++) {
        sp_tstat_batch_t *b = &t->batch[(size - 1 + i) % SP_TSTATS_BATCH_SIZES];
        int64_t cur = atomic_load_explicit(&b->size, memory_order_acquire);
        if (cur == 0) {
            int64_t zero = 0;
            if (atomic_compare_exchange_strong_explicit(&b->size, &zero, size, memory_order_acq_rel,
                                                        memory_order_acquire)) {
                cur = size;
            } else {
                cur = zero; /* another thread claimed it: for which size? */
            }
        }
        if (cur == size) {
            sp_tstat_add(&b->input, input_ns);
            sp_tstat_add(&b->infer, infer_ns);
            sp_tstat_add(&b->output, output_ns);
            return;
        }
    }
}
