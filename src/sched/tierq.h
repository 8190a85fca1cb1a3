/*
 * tierq.h - the scheduler's waiting queue: one FIFO per priority tier, each
 * bounded, intrusive (the caller's items embed a sp_tierq_node_t, so queueing
 * never allocates).
 *
 * Admission takes the oldest item of the highest non-empty tier; a preempted
 * sequence goes back to the *head* of its tier so it resumes before anything
 * that arrived after it. The bound applies to new arrivals only (push_back):
 * a preempted item always finds room, or preemption could lose work.
 */
#ifndef SP_SCHED_TIERQ_H
#define SP_SCHED_TIERQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum sp_tier {
    SP_TIER_BATCH = 0,
    SP_TIER_STANDARD = 1,
    SP_TIER_PREMIUM = 2,
} sp_tier_t;
#define SP_TIER_COUNT 3

typedef struct sp_tierq_node {
    struct sp_tierq_node *prev, *next;
    int tier;
    bool queued;
} sp_tierq_node_t;

typedef struct sp_tierq {
    sp_tierq_node_t *head[SP_TIER_COUNT], *tail[SP_TIER_COUNT];
    int64_t count[SP_TIER_COUNT];
    int64_t cap[SP_TIER_COUNT]; /* bound for push_back */
} sp_tierq_t;

void sp_tierq_init(sp_tierq_t *q, const int64_t cap[SP_TIER_COUNT]);
/* Whether k more new items fit in tier t. */
bool sp_tierq_has_room(const sp_tierq_t *q, int tier, int64_t k);
/* Append a new item (the caller checked room). */
void sp_tierq_push_back(sp_tierq_t *q, sp_tierq_node_t *n, int tier);
/* Put an item back at the head of its tier (preemption); never refused. */
void sp_tierq_push_front(sp_tierq_t *q, sp_tierq_node_t *n, int tier);
/* The next item to admit (highest tier, oldest), or NULL; not removed. */
sp_tierq_node_t *sp_tierq_peek(const sp_tierq_t *q);
void sp_tierq_remove(sp_tierq_t *q, sp_tierq_node_t *n);
int64_t sp_tierq_total(const sp_tierq_t *q);
/* Tier from a request's priority: a name ("premium", "standard", "batch"),
 * returns -1 for an unknown one. */
int sp_tierq_tier_from_name(const char *name);
/* Tier from an integer priority: > 0 premium, 0 standard, < 0 batch. */
int sp_tierq_tier_from_int(int64_t priority);
const char *sp_tierq_tier_name(int tier);

#endif /* SP_SCHED_TIERQ_H */
