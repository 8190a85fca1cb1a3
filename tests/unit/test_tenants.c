/* test_tenants.c - tokens-per-minute reservations, tier caps on tensor-model
 * priority levels, prefix-cache scopes (serving/tenants.h) and the Retry-After
 * drain estimate (sched/drain.h). */
#include "test.h"

#include "sched/drain.h"
#include "sched/sched.h"
#include "serving/auth.h"

/* An auth table from a tenants file with these tenants' JSON bodies; key i is
 * "key-<i>". */
static void
auth_with(sp_auth_t *a, const char *const *tenants, int n)
{
    char path[512], text[8192];
    snprintf(path, sizeof path, "%s/tenants.json", sp_test_tmpdir());
    size_t off = (size_t)snprintf(text, sizeof text, "{\"tenants\":[");
    for (int i = 0; i < n; i++) {
        char key[32], hs[72];
        uint8_t h[32];
        snprintf(key, sizeof key, "key-%d", i);
        sp_tenants_key_hash(key, strlen(key), h);
        sp_tenants_key_hash_str(h, hs);
        off += (size_t)snprintf(text + off, sizeof text - off, "%s{\"name\":\"t%d\",\"keys\":[\"%s\"]%s%s}",
                                i ? "," : "", i, hs, tenants[i][0] ? "," : "", tenants[i]);
    }
    snprintf(text + off, sizeof text - off, "]}");
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
    char err[256];
    ASSERT_OK(sp_auth_init(a, path, NULL, err, sizeof err));
}

static sp_tenant_state_t *
admit(sp_auth_t *a, int i, sp_auth_result_t *ar)
{
    char key[32];
    snprintf(key, sizeof key, "key-%d", i);
    sp_auth_check(a, (sp_str_t){key, strlen(key)}, SP_SCOPE_INFER, ar);
    return ar->state;
}

TEST(tenants_reserve_before_work)
{
    sp_auth_t a;
    const char *t[] = {"\"limits\":{\"tokens_per_minute\":200}"};
    auth_with(&a, t, 1);
    sp_auth_result_t ar;
    sp_tenant_state_t *st = admit(&a, 0, &ar);
    ASSERT(st != NULL);
    ASSERT_EQ(sp_auth_tpm(st), 200);
    /* n = 16, max_tokens = 400: more than the whole minute, refused before any work. */
    sp_tenant_charge_t big;
    ASSERT(!sp_auth_reserve(st, 16 * 400 + 2, &big, &ar));
    ASSERT_EQ(ar.status, 429);
    ASSERT(strstr(ar.message, "lower max_tokens or n") != NULL);
    ASSERT(big.st == NULL);
    /* Reservations add up like used tokens. */
    sp_tenant_charge_t c1, c2, c3;
    ASSERT(sp_auth_reserve(st, 150, &c1, &ar));
    ASSERT(!sp_auth_reserve(st, 100, &c2, &ar));
    ASSERT_EQ(ar.status, 429);
    ASSERT(ar.retry_after_s >= 1 && ar.retry_after_s <= 60);
    /* Settling releases the rest: 30 used, 170 free again. */
    sp_auth_settle(&c1, st, 30);
    ASSERT(c1.st == NULL);
    ASSERT(sp_auth_reserve(st, 170, &c2, &ar));
    ASSERT(!sp_auth_reserve(st, 1, &c3, &ar));
    /* A new request is refused at admission while the minute is all used or reserved. */
    sp_auth_done(st);
    ASSERT(admit(&a, 0, &ar) == NULL);
    ASSERT_EQ(ar.status, 429);
    sp_auth_settle(&c2, st, 170);
    ASSERT_EQ(atomic_load(&st->tokens), 200);
    /* Settling twice charges nothing more. */
    sp_auth_settle(&c2, st, 0);
    ASSERT_EQ(atomic_load(&st->tokens), 200);
    sp_auth_fini(&a);
}

TEST(tenants_concurrent_reservations_bounded)
{
    sp_auth_t a;
    const char *t[] = {"\"limits\":{\"tokens_per_minute\":1000}", ""};
    auth_with(&a, t, 2);
    sp_auth_result_t ar;
    sp_tenant_state_t *st = admit(&a, 0, &ar);
    sp_tenant_state_t *free_st = admit(&a, 1, &ar);
    ASSERT(st != NULL && free_st != NULL);
    /* 30 requests in flight at once, 402 tokens each at most: two fit. */
    sp_tenant_charge_t c[30];
    int ok = 0;
    for (int i = 0; i < 30; i++) {
        ok += sp_auth_reserve(st, 402, &c[i], &ar);
    }
    ASSERT_EQ(ok, 2);
    int64_t used = 0;
    for (int i = 0; i < 30; i++) {
        used += c[i].st ? 402 : 0;
        sp_auth_settle(&c[i], st, c[i].st ? 402 : 0);
    }
    ASSERT(used <= 1000);
    ASSERT_EQ(st->tpm_reserved, 0);
    /* No tokens limit: nothing is reserved, but what is used is counted. */
    sp_tenant_charge_t u;
    ASSERT(sp_auth_reserve(free_st, 1 << 30, &u, &ar));
    ASSERT(u.st == NULL);
    sp_auth_settle(&u, free_st, 7);
    ASSERT_EQ(atomic_load(&free_st->tokens), 7);
    /* No tenant at all (no keys): always admitted. */
    ASSERT(sp_auth_reserve(NULL, 1 << 30, &u, &ar));
    sp_auth_settle(&u, NULL, 5);
    sp_auth_fini(&a);
}

TEST(tenants_tier_caps_tensor_levels)
{
    /* 4 levels, default 3 (1 is the highest). */
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_PREMIUM, 1, 4, 3), 1);
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_PREMIUM, 0, 4, 3), 3);
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_STANDARD, 1, 4, 3), 3);
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_STANDARD, 4, 4, 3), 4);
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_STANDARD, 99, 4, 3), 3);
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_BATCH, 1, 4, 3), 4);
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_BATCH, 0, 4, 3), 4);
    /* One level: nothing to cap. */
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_BATCH, 5, 1, 1), 5);
    ASSERT_EQ(sp_auth_tier_cap_level(SP_SCHED_PRIO_BATCH, 0, 0, 0), 0);
    /* Without a tenant the request's own level stands. */
    ASSERT_EQ(sp_auth_tensor_priority(NULL, 1, 4, 3), 1);
    sp_auth_t a;
    const char *t[] = {"\"tier\":\"batch\"", "\"tier\":\"premium\""};
    auth_with(&a, t, 2);
    sp_auth_result_t ar;
    ASSERT_EQ(sp_auth_tensor_priority(admit(&a, 0, &ar), 1, 2, 1), 2);
    ASSERT_EQ(sp_auth_tensor_priority(admit(&a, 1, &ar), 1, 2, 2), 1);
    sp_auth_fini(&a);
}

TEST(tenants_prefix_scopes)
{
    sp_auth_t a;
    const char *t[] = {"", "\"limits\":{\"models\":[\"m\", \"m:lora\"]}", ""};
    auth_with(&a, t, 3);
    sp_auth_result_t ar;
    sp_tenant_state_t *s0 = admit(&a, 0, &ar), *s1 = admit(&a, 1, &ar), *s2 = admit(&a, 2, &ar);
    uint32_t p0 = sp_auth_prefix_scope(s0, "tenant"), p1 = sp_auth_prefix_scope(s1, "tenant");
    uint32_t p2 = sp_auth_prefix_scope(s2, "tenant");
    ASSERT(p0 != 0 && p1 != 0 && p2 != 0 && p0 != p1 && p1 != p2 && p0 != p2);
    ASSERT_EQ(sp_auth_prefix_scope(s0, "global"), 0);
    ASSERT_EQ(sp_auth_prefix_scope(NULL, "tenant"), 0);
    /* Model lists, for the listing filters. */
    ASSERT(!sp_auth_restricted(s0));
    ASSERT(sp_auth_restricted(s1));
    char names[SP_TENANT_MODELS_MAX][129];
    ASSERT_EQ(sp_auth_models(s1, names, SP_TENANT_MODELS_MAX), 2);
    ASSERT_STR_EQ(names[1], "m:lora");
    sp_auth_fini(&a);
}

TEST(retry_after_from_drain_rate)
{
    /* 10 done in 10 s (1/s): 5 ahead wait 5 s; 20 ahead 20 s; more, 60 at most. */
    ASSERT_EQ(sp_drain_retry_after_rate_s(5, 10, 10.0), 5);
    ASSERT_EQ(sp_drain_retry_after_rate_s(20, 10, 10.0), 20);
    ASSERT_EQ(sp_drain_retry_after_rate_s(1000, 10, 10.0), 60);
    /* Fast drains still say at least 1 s. */
    ASSERT_EQ(sp_drain_retry_after_rate_s(3, 1000, 10.0), 1);
    /* Nothing drained lately: one per second is assumed. */
    ASSERT_EQ(sp_drain_retry_after_rate_s(4, 0, 10.0), 4);
    ASSERT_EQ(sp_drain_retry_after_rate_s(0, 0, 0.0), 1);
    /* The estimator: 4 per second for 10 s, then a deeper queue waits longer. */
    sp_drain_t d;
    memset(&d, 0, sizeof d);
    int64_t t0 = 1000LL * 1000000000LL;
    for (int s = 0; s < 10; s++) {
        for (int k = 0; k < 4; k++) {
            sp_drain_note(&d, 1, t0 + s * 1000000000LL + k * 200000000LL);
        }
    }
    int64_t now = t0 + 10 * 1000000000LL;
    int shallow = sp_drain_retry_after_s(&d, 8, now), deep = sp_drain_retry_after_s(&d, 80, now);
    ASSERT(shallow >= 2 && shallow <= 3);
    ASSERT(deep >= 20 && deep <= 22);
    ASSERT(deep > shallow);
    /* Long idle: the old seconds leave the window; with no rate, one per second. */
    int64_t later = now + 100 * 1000000000LL;
    ASSERT_EQ(sp_drain_retry_after_s(&d, 80, later), 60);
    ASSERT_EQ(sp_drain_retry_after_s(&d, 7, later), 7);
    /* A burst after the idle spell is measured over the burst: 5 in its first half second. */
    for (int k = 0; k < 5; k++) {
        sp_drain_note(&d, 1, later + k * 100000000LL);
    }
    ASSERT_EQ(sp_drain_retry_after_s(&d, 10, later + 500000000LL), 2);
    ASSERT_EQ(sp_drain_retry_after_s(&d, 50, later + 500000000LL), 10);
}
