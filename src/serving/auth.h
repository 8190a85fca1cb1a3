/*
 * auth.h - the server's view of the tenants file (tenants.h): each request's
 * API key checked against the route's scope, its tenant's tier, rate,
 * concurrency and token limits, the models it may use, and a reload when the
 * file changes. The state of each tenant outlives reloads (its limits
 * carry over by name).
 *
 * Threads: any; the tenants are swapped under a lock, each tenant's counters
 * are atomics or its own token bucket.
 */
#ifndef SP_SERVING_AUTH_H
#define SP_SERVING_AUTH_H

#include "serving/tenants.h"


typedef struct sp_tenant_state {
    char name[SP_TENANT_NAME_MAX + 1];
    pthread_mutex_t mu;
    /* settings, copied from the current table at each reload (mu) */
    double rps, burst;
    int64_t tpm, max_concurrent;
    int32_t tier;
    int32_t n_models;
    char models[SP_TENANT_MODELS_MAX][129];
    /* requests per second (mu); tokens < 0: full at first use */
    sp_bucket_t bucket;
    /* tokens per minute: a ring of 60 one-second bins (mu) */
    int64_t tpm_sec[60];
    int64_t tpm_bin[60];
    int64_t tpm_reserved;     /* held by requests in flight, settled at their end (mu) */
    int32_t id;               /* its slot's index: stable for the process's life */
    atomic_int_fast64_t inflight;
    /* usage, for /metrics */
    atomic_uint_fast64_t requests, tokens;
    atomic_uint_fast64_t rejected[5]; /* by sp_limit_t */
} sp_tenant_state_t;

typedef enum sp_limit {
    SP_LIMIT_RPS = 0,
    SP_LIMIT_TPM,
    SP_LIMIT_CONCURRENCY,
    SP_LIMIT_MODEL,
    SP_LIMIT_SCOPE,
} sp_limit_t;

const char *sp_auth_limit_name(sp_limit_t l);

typedef struct sp_auth {
    pthread_rwlock_t lock;      /* the table pointer */
    sp_tenants_t *table;        /* NULL: no tenants file */
    char path[1024];
    int64_t file_mtime_ns, file_size, file_ino;
    pthread_mutex_t slots_mu;
    sp_tenant_state_t *slots[SP_TENANTS_MAX];
    int n_slots;
    char legacy_key_hash_set;   /* --api-key: one tenant "default" with every scope */
    uint8_t legacy_key[32];
} sp_auth_t;

/* A request's authentication: 0 and *out on success; else the HTTP status
 * (401, 403, 429), a message, and for 429 the seconds to wait. */
typedef struct sp_auth_result {
    int status;
    char message[512];
    int retry_after_s;
    sp_tenant_state_t *state; /* NULL without keys; counts this request in flight */
} sp_auth_result_t;

sp_status_t sp_auth_init(sp_auth_t *a, const char *path, const char *legacy_key, char *err,
                         size_t err_len);
void sp_auth_fini(sp_auth_t *a);
bool sp_auth_enabled(const sp_auth_t *a);
/* Reload the file (SIGHUP); on error the old table stays and err says why. */
sp_status_t sp_auth_reload(sp_auth_t *a, char *err, size_t err_len);
/* Has the file changed since the last load (size, mtime, inode)? */
bool sp_auth_file_changed(sp_auth_t *a);

/* Check key (ptr NULL = none) for a route that needs scope; on success the
 * request counts in its tenant's in-flight requests until sp_auth_done. */
void sp_auth_check(sp_auth_t *a, sp_str_t key, uint32_t scope, sp_auth_result_t *out);
void sp_auth_done(sp_tenant_state_t *st);
/* Tokens a request used (prompt + completion), for tokens_per_minute. */
void sp_auth_add_tokens(sp_tenant_state_t *st, int64_t tokens);

/*
 * Tokens per minute, reserved before the work and settled after it. At
 * admission a generation reserves what it may use at most (its prompts plus
 * max_tokens for each sequence); the reservation counts against the minute
 * like used tokens, so requests running at once cannot together pass the
 * limit. At its end, whichever way it ends (done, error, timeout, client
 * gone), the request settles: the reservation is released and what it really
 * used is charged. A tenant thus overshoots its minute by at most what one
 * request used beyond its reservation, which is nothing for generations.
 */
typedef struct sp_tenant_charge {
    sp_tenant_state_t *st; /* NULL: nothing reserved */
    int64_t reserved;
} sp_tenant_charge_t;

/* Reserve tokens for st's request into c: true, or false with out set to a
 * 429 (the message says whether waiting can help; retry_after_s when the
 * minute's window frees room). A NULL st or a tenant without a tokens limit
 * always succeeds (c stays empty). */
bool sp_auth_reserve(sp_tenant_state_t *st, int64_t tokens, sp_tenant_charge_t *c,
                     sp_auth_result_t *out);
/* Release c's reservation (if any) and charge used tokens to st (the
 * request's tenant; may be NULL). Once per request: c is emptied. */
void sp_auth_settle(sp_tenant_charge_t *c, sp_tenant_state_t *st, int64_t used);
/* The tenant's tokens per minute (0: unlimited or no tenant). */
int64_t sp_auth_tpm(sp_tenant_state_t *st);
/* Whether the tenant has a model list (false: every model, or no tenant). */
bool sp_auth_restricted(sp_tenant_state_t *st);
/* Copy the tenant's allowed model names into out (at most cap); returns how many. */
int32_t sp_auth_models(sp_tenant_state_t *st, char (*out)[129], int32_t cap);
/* The prefix-cache scope of st's requests under --prefix-cache-scope mode:
 * 0 (one scope shared by all) for "global" or no tenant, else 1 + the
 * tenant's slot index (slots are never reused while the process runs). */
uint32_t sp_auth_prefix_scope(sp_tenant_state_t *st, const char *mode);
/* A tensor model's batcher priority (1 = highest .. levels; 0 = the default
 * level) for a request that asked for `asked`, capped by the tenant's tier:
 * premium may ask any level, standard none above the default level, batch
 * gets the lowest level. No tenant: asked, unchanged. */
uint32_t sp_auth_tensor_priority(sp_tenant_state_t *st, uint32_t asked, uint32_t levels,
                                 uint32_t default_level);
/* The same rule without a tenant state (tier: SP_SCHED_PRIO_*), for tests. */
uint32_t sp_auth_tier_cap_level(int32_t tier, uint32_t asked, uint32_t levels, uint32_t default_level);
/* May this tenant use model name? (no list: every model; NULL state: yes) */
bool sp_auth_model_allowed(sp_tenant_state_t *st, const char *name, size_t len);
/* The tenant's tier (SP_SCHED_PRIO_*); standard for NULL. */
int32_t sp_auth_tier(sp_tenant_state_t *st);
/* Count a refusal that happened after sp_auth_check (a model not allowed). */
void sp_auth_reject(sp_tenant_state_t *st, sp_limit_t why);
/* Every tenant's state (for /metrics): calls fn for each slot. */
void sp_auth_each(sp_auth_t *a, void (*fn)(const sp_tenant_state_t *st, void *ud), void *ud);

#endif /* SP_SERVING_AUTH_H */
