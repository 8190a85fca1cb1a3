/*
 * manager.h - the manager thread: the one thread that changes what is
 * served (start-up loads of --model and the repository, poll mode, explicit
 * load and unload commands, on-demand loads, LoRA adapter commands, freeing
 * models whose last reference went away).
 *
 * Commands come from the protocol routes (api/repository.c) through
 * sp_manager_submit; each gives a wait record the caller polls (never
 * blocks on) and releases. On-demand loads need no command: a lookup marks
 * the entry demanded in the registry and the manager picks it up.
 *
 * Threads: start and stop on the main thread; submit and the wait calls on
 * any thread. The queue is guarded by reg.mu and woken by reg.cv.
 */
#ifndef SP_SERVING_MANAGER_H
#define SP_SERVING_MANAGER_H

#include <stdbool.h>
#include <stddef.h>

#include "sampan/status.h"

struct sp_serving;

typedef enum sp_manager_op {
    SP_MANAGER_LOAD = 0,       /* load (or reload) a repository model */
    SP_MANAGER_UNLOAD,         /* unload every version of a repository model */
    SP_MANAGER_ADAPTER_LOAD,   /* "<model>:<adapter>": load a LoRA adapter */
    SP_MANAGER_ADAPTER_UNLOAD, /* "<model>:<adapter>": unload it */
} sp_manager_op_t;

/* What a command's caller waits for (opaque): shared with the manager. */
typedef struct sp_manager_wait sp_manager_wait_t;

/* Start the manager thread (the start-up loads run on it). */
sp_status_t sp_manager_start(struct sp_serving *s, char *err, size_t err_len);
/* Stop it and wait for it; queued commands end with 503. */
void sp_manager_stop(struct sp_serving *s);

/* Queue op on name[0..len) (a checked model name, or "<model>:<adapter>"
 * for the adapter ops) with a load's config override (JSON text, NULL for
 * none). *out: the wait record, to poll with sp_manager_wait_done and drop
 * with sp_manager_wait_release. SP_ERR_NOMEM (nothing queued, *out NULL).
 * When the manager is stopping the record is done at once with
 * SP_ERR_SHUTDOWN. */
sp_status_t sp_manager_submit(struct sp_serving *s, sp_manager_op_t op, const char *name,
                              size_t len, const char *override, size_t override_len,
                              sp_manager_wait_t **out);
/* Has the command finished? Then *status is the HTTP status its answer
 * carries (200, 400 failed, 404 unknown, 503 shutting down or out of
 * memory) and *err the reason ("" on success; unredacted). */
bool sp_manager_wait_done(const sp_manager_wait_t *w, sp_status_t *st, const char **err);
/* Drop the caller's reference. NULL is a no-op. */
void sp_manager_wait_release(sp_manager_wait_t *w);

#endif /* SP_SERVING_MANAGER_H */
