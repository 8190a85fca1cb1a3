/* tierq.c - bounded FIFO per priority tier (see tierq.h). */
#include "sched/tierq.h"

#include <string.h>

#include "core/assert.h"

void
sp_tierq_init(sp_tierq_t *q, const int64_t cap[SP_TIER_COUNT])
{
    memset(q, 0, sizeof *q);
    for (int t = 0; t < SP_TIER_COUNT; t++) {
        q->cap[t] = cap[t];
    }
}

bool
sp_tierq_has_room(const sp_tierq_t *q, int tier, int64_t k)
{
    return q->count[tier] + k <= q->cap[tier];
}

void
sp_tierq_push_back(sp_tierq_t *q, sp_tierq_node_t *n, int tier)
{
    /* An item queued twice would link the lists into a cycle. */
    SP_ASSERT(tier >= 0 && tier < SP_TIER_COUNT && !n->queued);
    n->tier = tier;
    n->next = NULL;
    n->prev = q->tail[tier];
    if (q->tail[tier]) {
        q->tail[tier]->next = n;
    } else {
        q->head[tier] = n;
    }
    q->tail[tier] = n;
    q->count[tier]++;
    n->queued = true;
}

void
sp_tierq_push_front(sp_tierq_t *q, sp_tierq_node_t *n, int tier)
{
    SP_ASSERT(tier >= 0 && tier < SP_TIER_COUNT && !n->queued);
    n->tier = tier;
    n->prev = NULL;
    n->next = q->head[tier];
    if (q->head[tier]) {
        q->head[tier]->prev = n;
    } else {
        q->tail[tier] = n;
    }
    q->head[tier] = n;
    q->count[tier]++;
    n->queued = true;
}

sp_tierq_node_t *
sp_tierq_peek(const sp_tierq_t *q)
{
    for (int t = SP_TIER_COUNT - 1; t >= 0; t--) {
        if (q->head[t]) {
            return q->head[t];
        }
    }
    return NULL;
}

void
sp_tierq_remove(sp_tierq_t *q, sp_tierq_node_t *n)
{
    if (!n->queued) {
        return;
    }
    int t = n->tier;
    SP_ASSERT(t >= 0 && t < SP_TIER_COUNT && q->count[t] > 0);
    if (n->prev) {
        n->prev->next = n->next;
    } else {
        q->head[t] = n->next;
    }
    if (n->next) {
        n->next->prev = n->prev;
    } else {
        q->tail[t] = n->prev;
    }
    n->prev = n->next = NULL;
    n->queued = false;
    q->count[t]--;
}

int64_t
sp_tierq_total(const sp_tierq_t *q)
{
    int64_t s = 0;
    for (int t = 0; t < SP_TIER_COUNT; t++) {
        s += q->count[t];
    }
    return s;
}

static const char *const tier_names[SP_TIER_COUNT] = {"batch", "standard", "premium"};

int
sp_tierq_tier_from_name(const char *name)
{
    for (int t = 0; t < SP_TIER_COUNT; t++) {
        if (strcmp(name, tier_names[t]) == 0) {
            return t;
        }
    }
    return -1;
}

int
sp_tierq_tier_from_int(int64_t priority)
{
    return priority > 0 ? SP_TIER_PREMIUM : priority < 0 ? SP_TIER_BATCH : SP_TIER_STANDARD;
}

const char *
sp_tierq_tier_name(int tier)
{
    return tier >= 0 && tier < SP_TIER_COUNT ? tier_names[tier] : "?";
}
