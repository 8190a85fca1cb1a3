/*
 * split.c - the work items of a product job: how batch.c's products (and moe.c's item size,
 * bench/decode_bench.c's products) cut a job's weight rows into pool items. See
 * engine/model_impl.h for the contract. A module of its own so that moe.c can use it without
 * depending on batch.c (scripts/check-cycles.py).
 */
#include <string.h>

#include "core/assert.h"
#include "engine/model_impl.h"

int64_t
sp__batch_mm_chunk(int64_t rows, int n_threads, int64_t n_tok)
{
    (void)n_tok;
    /* About 8 items per thread balances load; at least 16 rows per item keeps
     * tiles full. Any split gives the same bits (kernel contract). */
    int64_t chunk = rows / ((int64_t)n_threads * 8);
    return chunk < 16 ? 16 : (chunk + 15) & ~(int64_t)15;
}

void
sp__mm_split_init(sp_mm_split_t *s, int n_w, const int64_t *rows, int n_threads, int64_t n_tok)
{
    SP_ASSERT(n_w >= 1 && n_w <= SP_MM_SPLIT_MAX_W && n_tok >= 1);
    memset(s, 0, sizeof *s);
    s->n_w = n_w;
    s->n_tok = n_tok;
    int64_t all = 0;
    for (int i = 0; i < n_w; i++) {
        s->rows[i] = rows[i];
        all += rows[i];
    }
    if (n_tok >= 2 * SP_MM_TOK_BLOCK) {
        /* Few row items (~8 items a thread with the token blocks, at most SP_MM_ROWS_MAX
         * rows) and no fine rows: the fine tail is in the tokens (below). */
        s->tb = SP_MM_TOK_BLOCK;
        s->n_tb = (n_tok + s->tb - 1) / s->tb;
        const int64_t n_ri = ((int64_t)n_threads * 8 + s->n_tb - 1) / s->n_tb;
        int64_t c = (all + n_ri - 1) / n_ri;
        c = c < 16 ? 16 : (c + 15) & ~(int64_t)15;
        s->chunk = c < SP_MM_ROWS_MAX ? c : SP_MM_ROWS_MAX;
        s->fine = s->chunk;
    } else {
        s->chunk = sp__batch_mm_chunk(all, n_threads, n_tok);
        const int64_t fine = (s->chunk / 4 + 15) & ~(int64_t)15;
        s->fine = fine < 16 ? 16 : fine;
    }
    /* The fine tail: the last matrix's last n_threads items' worth of rows, its start on a
     * 16-row tile; none on one thread or where the items are already a single tile. */
    const int64_t last = rows[n_w - 1];
    int64_t tail = 0;
    if (n_threads > 1 && s->fine < s->chunk) {
        const int64_t want = (int64_t)n_threads * s->chunk;
        tail = last <= want ? last : last - ((last - want) & ~(int64_t)15);
    }
    s->head = last - tail;
    s->n_head = (s->head + s->chunk - 1) / s->chunk;
    for (int i = 0; i < n_w; i++) {
        s->n_items[i] = i < n_w - 1 ? (rows[i] + s->chunk - 1) / s->chunk
                                    : s->n_head + (tail + s->fine - 1) / s->fine;
        s->total += s->n_items[i];
    }
    s->n_row = s->total;
    if (s->tb > 0) {
        /* each row item's token blocks one after the other (the threads on them read its
         * weights at about the same time), the last row item's in quarter blocks (the fine
         * tail) */
        s->tb_tail = n_threads > 1 ? SP_MM_TOK_BLOCK / 4 : SP_MM_TOK_BLOCK;
        s->total = (s->n_row - 1) * s->n_tb + (n_tok + s->tb_tail - 1) / s->tb_tail;
    }
}

void
sp__mm_split_item(const sp_mm_split_t *s, int64_t item, int *wi, int64_t *r0, int64_t *r1,
                  int64_t *t0, int64_t *t1)
{
    *t0 = 0;
    *t1 = s->n_tok;
    if (s->tb > 0) { /* row item, then its token block (the last row item's: quarter block) */
        const int64_t main = (s->n_row - 1) * s->n_tb;
        const int64_t tn = item < main ? s->tb : s->tb_tail;
        *t0 = (item < main ? item % s->n_tb : item - main) * tn;
        *t1 = *t0 + tn < s->n_tok ? *t0 + tn : s->n_tok;
        item = item < main ? item / s->n_tb : s->n_row - 1;
    }
    int i = 0;
    while (item >= s->n_items[i]) {
        item -= s->n_items[i++];
    }
    *wi = i;
    int64_t a, b;
    if (i < s->n_w - 1 || item < s->n_head) {
        const int64_t end = i < s->n_w - 1 ? s->rows[i] : s->head;
        a = item * s->chunk;
        b = a + s->chunk < end ? a + s->chunk : end;
    } else {
        a = s->head + (item - s->n_head) * s->fine;
        b = a + s->fine < s->rows[i] ? a + s->fine : s->rows[i];
    }
    *r0 = a;
    *r1 = b;
}
