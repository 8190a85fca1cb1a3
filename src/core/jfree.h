/*
 * jfree.h - give back what jansson allocated (json_dumps' text) with jansson's
 * own allocator: the server points jansson at sp_malloc (core/json.c), a
 * plain program leaves it on malloc, so free() would be wrong in one of them.
 */
#ifndef SP_CORE_JFREE_H
#define SP_CORE_JFREE_H

#include <jansson.h>

static inline void
sp_jfree(void *p)
{
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    f(p);
}

#endif /* SP_CORE_JFREE_H */
