/*
 * tenants.h - API keys, scopes, QoS tiers and limits per tenant.
 *
 * The tenants file (JSON, docs/security.md):
 *
 *   {"tenants": [
 *     {"name": "acme",
 *      "keys": ["sha256:<64 hex>", ...],          only hashes, never keys
 *      "scopes": ["infer", "metrics", "admin"],
 *      "tier": "premium" | "standard" | "batch",
 *      "limits": {"requests_per_second": 10, "burst": 20, "tokens_per_minute": 100000,
 *                 "max_concurrent": 4, "models": ["llama", "stories260K"]}}]}
 *
 * is parsed strictly (an unknown field or a bad value is an error naming the
 * file and the field) into an immutable table. The server keeps one table at
 * a time (sp_auth_t) and swaps it on SIGHUP or when the file changes; a file
 * that does not parse leaves the old table in place. What must outlive a
 * reload - the rate-limit buckets, the in-flight counts, the usage counters
 * for /metrics - lives in per-name slots that a reload maps the new table
 * onto, so reloading neither resets a tenant's budget nor drops a request's
 * accounting.
 *
 * Authentication hashes the presented key (SHA-256) and compares the digest
 * with every stored one in constant time (no early exit, no length leak);
 * a missing and a wrong key get the same 401.
 */
#ifndef SP_SERVING_TENANTS_H
#define SP_SERVING_TENANTS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/bucket.h"
#include "core/str.h"
#include "sampan/status.h"

#define SP_TENANTS_MAX 1024        /* tenants per file */
#define SP_TENANT_KEYS_MAX 64      /* keys per tenant */
#define SP_TENANT_MODELS_MAX 64    /* allowed-model entries per tenant */
#define SP_TENANT_NAME_MAX 64
#define SP_TENANTS_FILE_MAX (4 << 20)

enum {
    SP_SCOPE_INFER = 1 << 0,   /* inference routes, model listing */
    SP_SCOPE_ADMIN = 1 << 1,   /* the /v2/repository routes (load, unload, index) */
    SP_SCOPE_METRICS = 1 << 2, /* /metrics, /stats */
};

typedef struct sp_tenant {
    char name[SP_TENANT_NAME_MAX + 1];
    uint32_t scopes;
    int32_t tier;             /* SP_SCHED_PRIO_* */
    double rps;               /* 0 = unlimited */
    double burst;             /* bucket size (default: max(1, rps)) */
    int64_t tpm;              /* tokens per minute; 0 = unlimited */
    int64_t max_concurrent;   /* 0 = unlimited */
    int32_t n_models;         /* 0 = every model */
    char models[SP_TENANT_MODELS_MAX][129];
    int32_t n_keys;
    uint8_t keys[SP_TENANT_KEYS_MAX][32]; /* SHA-256 of each key */
    int slot;                 /* its state slot (sp_auth_t) */
} sp_tenant_t;

typedef struct sp_tenants {
    int32_t n;
    sp_tenant_t *t;
} sp_tenants_t;

/* Parse a tenants file's text; label names it in errors. */
sp_status_t sp_tenants_parse(const char *text, size_t len, const char *label, sp_tenants_t **out,
                             char *err, size_t err_len);
/* Read and parse a file (regular, at most SP_TENANTS_FILE_MAX bytes). */
sp_status_t sp_tenants_load(const char *path, sp_tenants_t **out, char *err, size_t err_len);
/* Write the table as JSON, atomically (temp file + rename), mode 0600. */
sp_status_t sp_tenants_save(const sp_tenants_t *t, const char *path, char *err, size_t err_len);
void sp_tenants_free(sp_tenants_t *t);

/* SHA-256 of a key. */
void sp_tenants_key_hash(const char *key, size_t len, uint8_t out[32]);
/* A new random key ("sk-sampan-" + 43 base64url characters: 256 bits). */
sp_status_t sp_tenants_key_generate(char *out, size_t cap);
/* "sha256:<64 hex>" of a hash, and back (false on a bad string). */
void sp_tenants_key_hash_str(const uint8_t h[32], char out[72]);
bool sp_tenants_key_hash_parse(const char *s, size_t len, uint8_t out[32]);

const char *sp_tenants_scope_name(uint32_t scope);

#endif /* SP_SERVING_TENANTS_H */
