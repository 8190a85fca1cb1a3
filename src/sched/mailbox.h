/*
 * mailbox.h - a cross-thread mailbox: any thread posts work, one owner thread
 * runs it, in post order, when it drains the mailbox.
 *
 * The mailbox knows nothing of what its owner is (an HTTP event loop, a test
 * thread): the owner passes a wake callback at create, which the mailbox
 * calls (on the posting thread, outside its lock) when the first message
 * arrives after a drain, and the owner answers by calling sp_mailbox_drain on
 * its own thread soon. One wake per drain, however many posts: a burst of
 * posts costs the owner one wake-up. The composition root wires it to an
 * event loop (src/server/serve.c: the wake writes the loop's eventfd, the
 * loop's wake callback drains).
 *
 * Two ways in:
 *   - sp_mailbox_post(mb, fn, arg): a call to run, allocated here (it can fail
 *     with SP_ERR_NOMEM, and then nothing was queued);
 *   - sp_mailbox_send(mb, msg): an intrusive message the caller embeds in its
 *     own object (the scheduler's jobs), which never allocates and never
 *     fails; the caller keeps the message alive until it ran or was dropped,
 *     and sends it again only after its run callback started.
 * Both go to one FIFO: drain runs messages in the order they were posted or
 * sent, so what one thread posts runs in its order.
 *
 * Threads: create, drain and destroy on the owner's thread; post and send on
 * any thread, up to destroy (the caller makes sure nothing posts after it:
 * the schedulers and worker pools that post are stopped first). A message run
 * by drain may post or send again: that goes to the next drain (and wakes the
 * owner again).
 *
 * Memory: the mailbox owns the nodes of sp_mailbox_post; destroy runs the
 * calls still pending (they free what they carry) and drops the messages
 * still pending (their drop callback, or their run callback when they have
 * none), until none is left (what they post meanwhile too), so nothing
 * posted leaks.
 */
#ifndef SP_SCHED_MAILBOX_H
#define SP_SCHED_MAILBOX_H

#include "sampan/status.h"

typedef struct sp_mailbox sp_mailbox_t;
typedef struct sp_mailbox_msg sp_mailbox_msg_t;

/* A message embedded in the sender's object. */
struct sp_mailbox_msg {
    /* Owner's thread, at drain: the message is no longer in the mailbox (it
     * may be sent again from here on). */
    void (*run)(sp_mailbox_msg_t *msg);
    /* Owner's thread, at destroy instead of run; NULL: run is called. */
    void (*drop)(sp_mailbox_msg_t *msg);
    sp_mailbox_msg_t *next; /* the mailbox's link while the message waits */
};

/* wake(ud) is called from a posting thread when the mailbox goes from empty
 * to non-empty (since the last drain); it must not block for long nor call
 * into the mailbox. NULL when out of memory. */
sp_mailbox_t *sp_mailbox_create(void (*wake)(void *ud), void *ud);
/* Any thread: run fn(arg) on the owner's thread at the next drain.
 * SP_ERR_NOMEM: nothing was queued. */
sp_status_t sp_mailbox_post(sp_mailbox_t *mb, void (*fn)(void *arg), void *arg);
/* Any thread: queue msg (msg->run set; msg->drop optional). Never fails. */
void sp_mailbox_send(sp_mailbox_t *mb, sp_mailbox_msg_t *msg);
/* Owner's thread: run everything posted or sent before this call, oldest first. */
void sp_mailbox_drain(sp_mailbox_t *mb);
/* Owner's thread, once nothing posts any more: pending calls run, pending
 * messages are dropped (see above), then the mailbox is freed. NULL: no-op. */
void sp_mailbox_destroy(sp_mailbox_t *mb);

#endif /* SP_SCHED_MAILBOX_H */
