/*
 * resp_store.h - the stored answers of the Responses API (/v1/responses,
 * responses.c): per tenant, in memory, bounded in count and in bytes
 * (--responses-store, --responses-store-bytes); past either bound the
 * oldest entries are evicted.
 *
 * An entry is the response object as GET /v1/responses/{id} returns it and
 * the conversation's input items (the previous responses' items first), so
 * a request naming it as previous_response_id continues from its input and
 * output. A tenant sees only its own entries: another tenant's id is "not
 * found", never "forbidden".
 *
 * Threads: any (one mutex). Memory: the store copies what it is given;
 * sp_resp_store_get hands out copies the caller frees with sp_free.
 */
#ifndef SP_API_RESP_STORE_H
#define SP_API_RESP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

/* The bounds (0 = nothing is kept). Call before the loops start (a new
 * server in the same process empties the store). */
void sp_resp_store_config(int64_t max_count, size_t max_bytes);

/* Keep (tenant, id): the response object and the conversation's items (both
 * JSON text). An entry bigger than the byte bound is not kept (SP_ERR_TOO_LARGE);
 * the oldest entries go until the new one fits. SP_OK or SP_ERR_NOMEM. */
sp_status_t sp_resp_store_put(int32_t tenant, const char *id, const char *response, size_t rlen,
                              const char *items, size_t ilen);

/* Copies of the tenant's entry (NUL-terminated, sp_free); false: none. */
bool sp_resp_store_get(int32_t tenant, const char *id, char **response, char **items);

/* Remove the tenant's entry; false: none. */
bool sp_resp_store_delete(int32_t tenant, const char *id);

/* What is kept now. */
void sp_resp_store_usage(int64_t *count, size_t *bytes);

#endif /* SP_API_RESP_STORE_H */
