/*
 * test_resp_store.c - the Responses API's store (api/resp_store.h) on its
 * own: entries per tenant (another tenant's id is not found), the count
 * bound and the byte bound evict the oldest first, an entry bigger than
 * the byte bound is refused, a put under an existing id replaces it, and
 * delete and the usage counters agree.
 */
#include "test.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "api/resp_store.h"

static bool
has(int32_t tenant, const char *id, const char *want_resp)
{
    char *r = NULL, *it = NULL;
    bool ok = sp_resp_store_get(tenant, id, &r, &it);
    if (ok && want_resp != NULL) {
        ok = strcmp(r, want_resp) == 0 && strcmp(it, "[]") == 0;
    }
    sp_free(r);
    sp_free(it);
    return ok;
}

static sp_status_t
put(int32_t tenant, const char *id, const char *resp)
{
    return sp_resp_store_put(tenant, id, resp, strlen(resp), "[]", 2);
}

TEST(resp_store_per_tenant_and_count_bound)
{
    sp_resp_store_config(3, (size_t)1 << 20);
    ASSERT_OK(put(1, "resp_a", "{\"a\":1}"));
    ASSERT_OK(put(2, "resp_a", "{\"a\":2}"));
    ASSERT(has(1, "resp_a", "{\"a\":1}"));
    ASSERT(has(2, "resp_a", "{\"a\":2}"));
    ASSERT(!has(3, "resp_a", NULL));
    ASSERT(!sp_resp_store_delete(3, "resp_a"));
    ASSERT_OK(put(1, "resp_b", "{}"));
    ASSERT_OK(put(1, "resp_c", "{}")); /* the fourth: tenant 1's resp_a, the oldest, goes */
    ASSERT(!has(1, "resp_a", NULL));
    ASSERT(has(2, "resp_a", NULL) && has(1, "resp_b", NULL) && has(1, "resp_c", NULL));
    ASSERT_OK(put(1, "resp_b", "{\"b\":2}")); /* replaced, not a second entry */
    ASSERT(has(1, "resp_b", "{\"b\":2}"));
    int64_t n;
    size_t bytes;
    sp_resp_store_usage(&n, &bytes);
    ASSERT_EQ(n, 3);
    ASSERT(sp_resp_store_delete(1, "resp_b"));
    ASSERT(!has(1, "resp_b", NULL));
    sp_resp_store_usage(&n, &bytes);
    ASSERT_EQ(n, 2);
    sp_resp_store_config(0, 0); /* nothing kept, and emptied */
    sp_resp_store_usage(&n, &bytes);
    ASSERT(n == 0 && bytes == 0);
    ASSERT(put(1, "resp_x", "{}") == SP_ERR_TOO_LARGE);
}

TEST(resp_store_byte_bound)
{
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    /* room for two entries of ~1000 bytes (plus headers), not three */
    sp_resp_store_config(100, 2600);
    char id[32];
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        ASSERT_OK(put(7, id, big));
        int64_t n;
        size_t bytes;
        sp_resp_store_usage(&n, &bytes);
        ASSERT(bytes <= 2600);
        ASSERT_EQ(n, i < 1 ? 1 : 2);
    }
    ASSERT(!has(7, "resp_2", NULL) && has(7, "resp_3", NULL) && has(7, "resp_4", big));
    static char huge[4000];
    memset(huge, 'y', sizeof huge - 1);
    ASSERT(put(7, "resp_h", huge) == SP_ERR_TOO_LARGE);
    ASSERT(has(7, "resp_4", NULL)); /* a refused entry evicts nothing */
    sp_resp_store_config(1024, (size_t)64 << 20);
}
