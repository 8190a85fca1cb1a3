/*
 * resp_store.c - the Responses API's stored answers (resp_store.h): a list
 * in insertion order (the oldest first, evicted first) under one mutex.
 *
 * Lookups walk the list: it holds at most --responses-store entries (1024
 * by default), and a walk compares short ids, so a lookup costs microseconds
 * next to the generation it precedes.
 *
 * Threads: any; every function takes the mutex. Memory: each entry is one
 * sp_malloc block (header, id, response, items); the entries' bytes count
 * all three.
 */
#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "api/resp_store.h"

typedef struct entry {
    struct entry *prev, *next;
    int32_t tenant;
    size_t bytes;            /* the whole block */
    char *id, *response, *items;
} entry_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry_t *head, *tail;  /* head: the oldest */
static int64_t n_entries, max_entries = 1024;
static size_t n_bytes, max_bytes = (size_t)64 << 20;

static void
unlink_entry(entry_t *e)
{
    if (e->prev) {
        e->prev->next = e->next;
    } else {
        head = e->next;
    }
    if (e->next) {
        e->next->prev = e->prev;
    } else {
        tail = e->prev;
    }
    n_entries--;
    n_bytes -= e->bytes;
    sp_free(e);
}

static entry_t *
find(int32_t tenant, const char *id)
{
    for (entry_t *e = tail; e != NULL; e = e->prev) { /* the newest first: chains continue them */
        if (e->tenant == tenant && strcmp(e->id, id) == 0) {
            return e;
        }
    }
    return NULL;
}

void
sp_resp_store_config(int64_t count, size_t bytes)
{
    pthread_mutex_lock(&mu);
    while (head != NULL) {
        unlink_entry(head);
    }
    max_entries = count;
    max_bytes = bytes;
    pthread_mutex_unlock(&mu);
}

sp_status_t
sp_resp_store_put(int32_t tenant, const char *id, const char *response, size_t rlen,
                  const char *items, size_t ilen)
{
    size_t idlen = strlen(id);
    size_t bytes = sizeof(entry_t) + idlen + 1 + rlen + 1 + ilen + 1;
    if (max_entries <= 0 || bytes > max_bytes) {
        return SP_ERR_TOO_LARGE;
    }
    entry_t *e = sp_malloc(bytes);
    if (e == NULL) {
        return SP_ERR_NOMEM;
    }
    char *p = (char *)(e + 1);
    e->tenant = tenant;
    e->bytes = bytes;
    e->id = p;
    memcpy(p, id, idlen + 1);
    p += idlen + 1;
    e->response = p;
    memcpy(p, response, rlen);
    p[rlen] = '\0';
    p += rlen + 1;
    e->items = p;
    memcpy(p, items, ilen);
    p[ilen] = '\0';
    pthread_mutex_lock(&mu);
    entry_t *old = find(tenant, id);
    if (old != NULL) {
        unlink_entry(old);
    }
    while (head != NULL && (n_entries + 1 > max_entries || n_bytes + bytes > max_bytes)) {
        unlink_entry(head);
    }
    e->next = NULL;
    e->prev = tail;
    if (tail) {
        tail->next = e;
    } else {
        head = e;
    }
    tail = e;
    n_entries++;
    n_bytes += bytes;
    pthread_mutex_unlock(&mu);
    return SP_OK;
}

static char *
dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = sp_malloc(n);
    if (p != NULL) {
        memcpy(p, s, n);
    }
    return p;
}

bool
sp_resp_store_get(int32_t tenant, const char *id, char **response, char **items)
{
    *response = *items = NULL;
    pthread_mutex_lock(&mu);
    entry_t *e = find(tenant, id);
    if (e != NULL) {
        *response = dup(e->response);
        *items = dup(e->items);
    }
    pthread_mutex_unlock(&mu);
    if (e != NULL && (*response == NULL || *items == NULL)) {
        sp_free(*response);
        sp_free(*items);
        *response = *items = NULL;
    }
    return *response != NULL;
}

bool
sp_resp_store_delete(int32_t tenant, const char *id)
{
    pthread_mutex_lock(&mu);
    entry_t *e = find(tenant, id);
    if (e != NULL) {
        unlink_entry(e);
    }
    pthread_mutex_unlock(&mu);
    return e != NULL;
}

void
sp_resp_store_usage(int64_t *count, size_t *bytes)
{
    pthread_mutex_lock(&mu);
    *count = n_entries;
    *bytes = n_bytes;
    pthread_mutex_unlock(&mu);
}
