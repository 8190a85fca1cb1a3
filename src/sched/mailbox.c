/*
 * mailbox.c - the cross-thread mailbox (see mailbox.h).
 *
 * One singly linked FIFO (head and tail) of intrusive messages under a
 * mutex; sp_mailbox_post wraps its call in a node it allocates. `woken` is
 * set by the post that finds the mailbox quiet and cleared by drain when it
 * takes the list, so the owner gets one wake per batch of posts. Drain takes
 * the whole list under the lock and runs it without: messages may post again
 * (to the next drain) and posters never wait for a message to run.
 */
#include "sched/mailbox.h"

#include <pthread.h>
#include <stdbool.h>

#include "core/alloc.h"
#include "core/assert.h"

struct sp_mailbox {
    void (*wake)(void *ud);
    void *ud;
    pthread_mutex_t mu;
    sp_mailbox_msg_t *head, *tail; /* oldest, newest */
    bool woken;                    /* wake called since the last drain */
};

/* A call of sp_mailbox_post. */
typedef struct post_node {
    sp_mailbox_msg_t msg; /* first: messages convert back to nodes */
    void (*fn)(void *arg);
    void *arg;
} post_node_t;

sp_mailbox_t *
sp_mailbox_create(void (*wake)(void *ud), void *ud)
{
    sp_mailbox_t *mb = sp_calloc(1, sizeof *mb);
    if (mb == NULL) {
        return NULL;
    }
    mb->wake = wake;
    mb->ud = ud;
    pthread_mutex_init(&mb->mu, NULL);
    return mb;
}

void
sp_mailbox_send(sp_mailbox_t *mb, sp_mailbox_msg_t *msg)
{
    SP_ASSERT(msg->run != NULL);
    msg->next = NULL;
    pthread_mutex_lock(&mb->mu);
    if (mb->tail) {
        mb->tail->next = msg;
    } else {
        mb->head = msg;
    }
    mb->tail = msg;
    bool wake = !mb->woken;
    mb->woken = true;
    pthread_mutex_unlock(&mb->mu);
    if (wake && mb->wake) {
        mb->wake(mb->ud);
    }
}

static void
post_run(sp_mailbox_msg_t *msg)
{
    post_node_t *p = (post_node_t *)msg;
    void (*fn)(void *) = p->fn;
    void *arg = p->arg;
    sp_free(p);
    fn(arg);
}

sp_status_t
sp_mailbox_post(sp_mailbox_t *mb, void (*fn)(void *arg), void *arg)
{
    post_node_t *p = sp_malloc(sizeof *p);
    if (p == NULL) {
        return SP_ERR_NOMEM;
    }
    p->msg.run = post_run;
    p->msg.drop = NULL; /* at destroy the call runs: it frees what it carries */
    p->fn = fn;
    p->arg = arg;
    sp_mailbox_send(mb, &p->msg);
    return SP_OK;
}

/* Take every pending message, oldest first, and clear `woken`. */
static sp_mailbox_msg_t *
take_all(sp_mailbox_t *mb)
{
    pthread_mutex_lock(&mb->mu);
    sp_mailbox_msg_t *list = mb->head;
    mb->head = mb->tail = NULL;
    mb->woken = false;
    pthread_mutex_unlock(&mb->mu);
    return list;
}

void
sp_mailbox_drain(sp_mailbox_t *mb)
{
    sp_mailbox_msg_t *m = take_all(mb);
    while (m) {
        /* Read the link first: run may free the message or send it again. */
        sp_mailbox_msg_t *next = m->next;
        m->run(m);
        m = next;
    }
}

void
sp_mailbox_destroy(sp_mailbox_t *mb)
{
    if (mb == NULL) {
        return;
    }
    /* Until nothing is left: a call run here may post once more. */
    for (sp_mailbox_msg_t *m; (m = take_all(mb)) != NULL;) {
        while (m) {
            sp_mailbox_msg_t *next = m->next;
            if (m->drop) {
                m->drop(m);
            } else {
                m->run(m);
            }
            m = next;
        }
    }
    pthread_mutex_destroy(&mb->mu);
    sp_free(mb);
}
