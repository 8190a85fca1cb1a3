/* auth.c - the server's view of the tenants: key checks, scopes, tiers, rate
 * and token limits, and reloading the file (auth.h). */
#include "serving/auth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "sched/sched.h"

const char *
sp_auth_limit_name(sp_limit_t l)
{
    static const char *const names[] = {"requests_per_second", "tokens_per_minute",
                                        "max_concurrent", "model", "scope"};
    return l >= 0 && l <= SP_LIMIT_SCOPE ? names[l] : "?";
}


static int
slot_for(sp_auth_t *a, const char *name)
{
    pthread_mutex_lock(&a->slots_mu);
    for (int i = 0; i < a->n_slots; i++) {
        if (strcmp(a->slots[i]->name, name) == 0) {
            pthread_mutex_unlock(&a->slots_mu);
            return i;
        }
    }
    int i = -1;
    if (a->n_slots < SP_TENANTS_MAX) {
        sp_tenant_state_t *st = sp_calloc(1, sizeof *st);
        if (st) {
            snprintf(st->name, sizeof st->name, "%s", name);
            pthread_mutex_init(&st->mu, NULL);
            st->bucket.tokens = -1; /* full at first use */
            st->id = a->n_slots;
            i = a->n_slots;
            a->slots[a->n_slots++] = st;
        }
    }
    pthread_mutex_unlock(&a->slots_mu);
    return i;
}

/* Map a table onto the state slots (the limits live in the slots). */
static sp_status_t
attach(sp_auth_t *a, sp_tenants_t *t, char *err, size_t err_len)
{
    for (int32_t i = 0; i < t->n; i++) {
        sp_tenant_t *x = &t->t[i];
        x->slot = slot_for(a, x->name);
        if (x->slot < 0) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "tenants: out of state slots");
        }
        sp_tenant_state_t *st = a->slots[x->slot];
        pthread_mutex_lock(&st->mu);
        st->rps = x->rps;
        st->burst = x->burst;
        st->tpm = x->tpm;
        st->max_concurrent = x->max_concurrent;
        st->tier = x->tier;
        st->n_models = x->n_models;
        memcpy(st->models, x->models, sizeof st->models);
        if (st->bucket.tokens > st->burst) {
            st->bucket.tokens = st->burst;
        }
        pthread_mutex_unlock(&st->mu);
    }
    return SP_OK;
}

static void
stat_file(sp_auth_t *a, int64_t *mtime, int64_t *size, int64_t *ino)
{
    struct stat st;
    if (stat(a->path, &st) == 0) {
        *mtime = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        *size = (int64_t)st.st_size;
        *ino = (int64_t)st.st_ino;
    } else {
        *mtime = *size = *ino = -1;
    }
}

sp_status_t
sp_auth_reload(sp_auth_t *a, char *err, size_t err_len)
{
    if (a->path[0] == '\0') {
        return SP_OK;
    }
    int64_t m, sz, ino;
    stat_file(a, &m, &sz, &ino);
    sp_tenants_t *t = NULL;
    sp_status_t st = sp_tenants_load(a->path, &t, err, err_len);
    if (st == SP_OK) {
        st = attach(a, t, err, err_len);
    }
    /* Remember what was tried, so a bad file is not re-read every second. */
    a->file_mtime_ns = m;
    a->file_size = sz;
    a->file_ino = ino;
    if (st != SP_OK) {
        sp_tenants_free(t);
        return st;
    }
    pthread_rwlock_wrlock(&a->lock);
    sp_tenants_t *old = a->table;
    a->table = t;
    pthread_rwlock_unlock(&a->lock);
    sp_tenants_free(old);
    return SP_OK;
}

bool
sp_auth_file_changed(sp_auth_t *a)
{
    if (a->path[0] == '\0') {
        return false;
    }
    int64_t m, sz, ino;
    stat_file(a, &m, &sz, &ino);
    return m != a->file_mtime_ns || sz != a->file_size || ino != a->file_ino;
}

sp_status_t
sp_auth_init(sp_auth_t *a, const char *path, const char *legacy_key, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    pthread_rwlock_init(&a->lock, NULL);
    pthread_mutex_init(&a->slots_mu, NULL);
    if (legacy_key && legacy_key[0]) {
        sp_tenants_key_hash(legacy_key, strlen(legacy_key), a->legacy_key);
        a->legacy_key_hash_set = 1;
        slot_for(a, "default");
    }
    if (path && path[0]) {
        if (strlen(path) >= sizeof a->path) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "--tenants: path too long");
        }
        snprintf(a->path, sizeof a->path, "%s", path);
        return sp_auth_reload(a, err, err_len);
    }
    return SP_OK;
}

void
sp_auth_fini(sp_auth_t *a)
{
    sp_tenants_free(a->table);
    for (int i = 0; i < a->n_slots; i++) {
        pthread_mutex_destroy(&a->slots[i]->mu);
        sp_free(a->slots[i]);
    }
    pthread_rwlock_destroy(&a->lock);
    pthread_mutex_destroy(&a->slots_mu);
    OPENSSL_cleanse(a->legacy_key, sizeof a->legacy_key);
}

bool
sp_auth_enabled(const sp_auth_t *a)
{
    return a->path[0] != '\0' || a->legacy_key_hash_set;
}

/* Tokens charged in the minute ending at second sec; mu held. */
static int64_t
tpm_used(const sp_tenant_state_t *st, int64_t sec)
{
    int64_t used = 0;
    for (int i = 0; i < 60; i++) {
        if (st->tpm_sec[i] > sec - 60) {
            used += st->tpm_bin[i];
        }
    }
    return used;
}

/* Seconds until `need` charged tokens have left the minute's window (the
 * oldest seconds leave first); 60 when the window alone cannot free them
 * (reservations of requests in flight hold the rest); mu held. */
static int
tpm_wait_s(const sp_tenant_state_t *st, int64_t sec, int64_t need)
{
    int64_t freed = 0;
    for (int64_t s = sec - 59; s <= sec; s++) {
        int i = (int)(s % 60);
        if (st->tpm_sec[i] == s) {
            freed += st->tpm_bin[i];
        }
        if (freed >= need) {
            int64_t wait = s - (sec - 60); /* second s leaves the window at s + 60 */
            return (int)(wait > 0 ? wait : 1);
        }
    }
    return 60;
}

/* Token bucket and the tokens-per-minute window; mu held. */
static bool
limits_ok(sp_tenant_state_t *st, int64_t now, sp_auth_result_t *out)
{
    if (st->rps > 0) {
        if (st->bucket.tokens < 0) {
            sp_bucket_fill(&st->bucket, st->burst, now);
        }
        sp_bucket_refill(&st->bucket, st->rps, st->burst, now);
        if (st->bucket.tokens < 1.0) {
            out->status = 429;
            out->retry_after_s = (int)ceil((1.0 - st->bucket.tokens) / st->rps);
            snprintf(out->message, sizeof out->message,
                     "rate limit: tenant '%s' may send %g requests per second (burst %g)", st->name,
                     st->rps, st->burst);
            atomic_fetch_add(&st->rejected[SP_LIMIT_RPS], 1);
            return false;
        }
    }
    if (st->tpm > 0) {
        int64_t sec = now / 1000000000LL;
        int64_t used = tpm_used(st, sec) + st->tpm_reserved;
        if (used >= st->tpm) {
            out->status = 429;
            out->retry_after_s = tpm_wait_s(st, sec, used - st->tpm + 1);
            snprintf(out->message, sizeof out->message,
                     "rate limit: tenant '%s' may use %lld tokens per minute", st->name,
                     (long long)st->tpm);
            atomic_fetch_add(&st->rejected[SP_LIMIT_TPM], 1);
            return false;
        }
    }
    if (st->max_concurrent > 0 && atomic_load(&st->inflight) >= st->max_concurrent) {
        out->status = 429;
        out->retry_after_s = 1;
        snprintf(out->message, sizeof out->message,
                 "concurrency limit: tenant '%s' may have %lld requests in flight", st->name,
                 (long long)st->max_concurrent);
        atomic_fetch_add(&st->rejected[SP_LIMIT_CONCURRENCY], 1);
        return false;
    }
    if (st->rps > 0) {
        st->bucket.tokens -= 1.0;
    }
    return true;
}

void
sp_auth_check(sp_auth_t *a, sp_str_t key, uint32_t scope, sp_auth_result_t *out)
{
    out->status = 0;
    out->message[0] = '\0';
    out->retry_after_s = 0;
    out->state = NULL;
    if (!sp_auth_enabled(a)) {
        return;
    }
    uint8_t h[32];
    sp_tenants_key_hash(key.ptr ? key.ptr : "", key.ptr ? key.len : 0, h);
    /* Compare with every stored hash, always, without an early exit. */
    int found_slot = -1;
    uint32_t scopes = 0;
    unsigned hit;
    if (a->legacy_key_hash_set) {
        hit = (unsigned)(CRYPTO_memcmp(h, a->legacy_key, 32) == 0) & (key.ptr != NULL);
        found_slot = hit ? 0 : found_slot;
        scopes = hit ? (SP_SCOPE_INFER | SP_SCOPE_ADMIN | SP_SCOPE_METRICS) : scopes;
    }
    pthread_rwlock_rdlock(&a->lock);
    const sp_tenants_t *t = a->table;
    for (int32_t i = 0; t && i < t->n; i++) {
        for (int32_t k = 0; k < t->t[i].n_keys; k++) {
            hit = (unsigned)(CRYPTO_memcmp(h, t->t[i].keys[k], 32) == 0) & (key.ptr != NULL);
            found_slot = hit ? t->t[i].slot : found_slot;
            scopes = hit ? t->t[i].scopes : scopes;
        }
    }
    pthread_rwlock_unlock(&a->lock);
    OPENSSL_cleanse(h, sizeof h);
    if (found_slot < 0) {
        out->status = 401;
        snprintf(out->message, sizeof out->message, "invalid or missing API key");
        return;
    }
    sp_tenant_state_t *st = a->slots[found_slot];
    if ((scopes & scope) == 0) {
        out->status = 403;
        snprintf(out->message, sizeof out->message, "this key lacks the '%s' scope",
                 sp_tenants_scope_name(scope));
        atomic_fetch_add(&st->rejected[SP_LIMIT_SCOPE], 1);
        return;
    }
    pthread_mutex_lock(&st->mu);
    bool ok = limits_ok(st, sp_time_ns(), out);
    pthread_mutex_unlock(&st->mu);
    if (!ok) {
        return;
    }
    atomic_fetch_add(&st->inflight, 1);
    atomic_fetch_add(&st->requests, 1);
    out->state = st;
}

void
sp_auth_done(sp_tenant_state_t *st)
{
    if (st) {
        atomic_fetch_sub(&st->inflight, 1);
    }
}

void
sp_auth_add_tokens(sp_tenant_state_t *st, int64_t tokens)
{
    if (st == NULL || tokens <= 0) {
        return;
    }
    atomic_fetch_add(&st->tokens, (uint64_t)tokens);
    int64_t sec = sp_time_ns() / 1000000000LL;
    int i = (int)(sec % 60);
    pthread_mutex_lock(&st->mu);
    if (st->tpm_sec[i] != sec) {
        st->tpm_sec[i] = sec;
        st->tpm_bin[i] = 0;
    }
    st->tpm_bin[i] += tokens;
    pthread_mutex_unlock(&st->mu);
}

bool
sp_auth_reserve(sp_tenant_state_t *st, int64_t tokens, sp_tenant_charge_t *c, sp_auth_result_t *out)
{
    c->st = NULL;
    c->reserved = 0;
    out->status = 0;
    out->message[0] = '\0';
    out->retry_after_s = 0;
    out->state = st;
    if (st == NULL || tokens <= 0) {
        return true;
    }
    int64_t now = sp_time_ns(), sec = now / 1000000000LL;
    pthread_mutex_lock(&st->mu);
    bool ok = true;
    if (st->tpm > 0) {
        int64_t held = tpm_used(st, sec) + st->tpm_reserved;
        if (tokens > st->tpm) {
            ok = false;
            out->retry_after_s = 60;
            snprintf(out->message, sizeof out->message,
                     "rate limit: this request may use up to %lld tokens (its prompt plus max_tokens "
                     "for each of its n sequences), more than tenant '%s' may use in a minute (%lld): "
                     "lower max_tokens or n, or shorten the prompt",
                     (long long)tokens, st->name, (long long)st->tpm);
        } else if (held + tokens > st->tpm) {
            ok = false;
            out->retry_after_s = tpm_wait_s(st, sec, held + tokens - st->tpm);
            snprintf(out->message, sizeof out->message,
                     "rate limit: tenant '%s' may use %lld tokens per minute; %lld are used or "
                     "reserved and this request may use up to %lld (its prompt plus max_tokens for "
                     "each sequence)",
                     st->name, (long long)st->tpm, (long long)held, (long long)tokens);
        } else {
            st->tpm_reserved += tokens;
            c->st = st;
            c->reserved = tokens;
        }
    }
    pthread_mutex_unlock(&st->mu);
    if (!ok) {
        out->status = 429;
        atomic_fetch_add(&st->rejected[SP_LIMIT_TPM], 1);
    }
    return ok;
}

void
sp_auth_settle(sp_tenant_charge_t *c, sp_tenant_state_t *st, int64_t used)
{
    if (c->st != NULL) {
        pthread_mutex_lock(&c->st->mu);
        c->st->tpm_reserved -= c->reserved;
        if (c->st->tpm_reserved < 0) {
            c->st->tpm_reserved = 0;
        }
        pthread_mutex_unlock(&c->st->mu);
        if (st == NULL) {
            st = c->st;
        }
    }
    c->st = NULL;
    c->reserved = 0;
    sp_auth_add_tokens(st, used);
}

int64_t
sp_auth_tpm(sp_tenant_state_t *st)
{
    if (st == NULL) {
        return 0;
    }
    pthread_mutex_lock(&st->mu);
    int64_t t = st->tpm;
    pthread_mutex_unlock(&st->mu);
    return t;
}

bool
sp_auth_restricted(sp_tenant_state_t *st)
{
    if (st == NULL) {
        return false;
    }
    pthread_mutex_lock(&st->mu);
    bool r = st->n_models > 0;
    pthread_mutex_unlock(&st->mu);
    return r;
}

int32_t
sp_auth_models(sp_tenant_state_t *st, char (*out)[129], int32_t cap)
{
    if (st == NULL) {
        return 0;
    }
    pthread_mutex_lock(&st->mu);
    int32_t n = st->n_models < cap ? st->n_models : cap;
    memcpy(out, st->models, (size_t)n * sizeof st->models[0]);
    pthread_mutex_unlock(&st->mu);
    return n;
}

uint32_t
sp_auth_prefix_scope(sp_tenant_state_t *st, const char *mode)
{
    if (st == NULL || (mode && strcmp(mode, "global") == 0)) {
        return 0;
    }
    return (uint32_t)st->id + 1;
}

uint32_t
sp_auth_tier_cap_level(int32_t tier, uint32_t asked, uint32_t levels, uint32_t default_level)
{
    if (levels <= 1) {
        return asked; /* one level: nothing to cap */
    }
    /* Levels count down: 1 is the highest; 0 or out of range means the default. */
    if (default_level < 1 || default_level > levels) {
        default_level = levels;
    }
    uint32_t lvl = asked == 0 || asked > levels ? default_level : asked;
    if (tier < SP_SCHED_PRIO_STANDARD) {
        return levels;
    }
    if (tier == SP_SCHED_PRIO_STANDARD && lvl < default_level) {
        return default_level;
    }
    return lvl;
}

uint32_t
sp_auth_tensor_priority(sp_tenant_state_t *st, uint32_t asked, uint32_t levels, uint32_t default_level)
{
    if (st == NULL) {
        return asked;
    }
    return sp_auth_tier_cap_level(sp_auth_tier(st), asked, levels, default_level);
}

bool
sp_auth_model_allowed(sp_tenant_state_t *st, const char *name, size_t len)
{
    if (st == NULL) {
        return true;
    }
    bool ok;
    pthread_mutex_lock(&st->mu);
    ok = st->n_models == 0;
    for (int32_t i = 0; i < st->n_models && !ok; i++) {
        ok = strlen(st->models[i]) == len && memcmp(st->models[i], name, len) == 0;
    }
    pthread_mutex_unlock(&st->mu);
    return ok;
}

int32_t
sp_auth_tier(sp_tenant_state_t *st)
{
    if (st == NULL) {
        return SP_SCHED_PRIO_STANDARD;
    }
    pthread_mutex_lock(&st->mu);
    int32_t t = st->tier;
    pthread_mutex_unlock(&st->mu);
    return t;
}

void
sp_auth_reject(sp_tenant_state_t *st, sp_limit_t why)
{
    if (st) {
        atomic_fetch_add(&st->rejected[why], 1);
    }
}

void
sp_auth_each(sp_auth_t *a, void (*fn)(const sp_tenant_state_t *st, void *ud), void *ud)
{
    pthread_mutex_lock(&a->slots_mu);
    for (int i = 0; i < a->n_slots; i++) {
        fn(a->slots[i], ud);
    }
    pthread_mutex_unlock(&a->slots_mu);
}
