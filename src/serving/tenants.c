/* tenants.c - the tenants file, key hashing, authentication and limits (tenants.h). */
#include "serving/tenants.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "core/json.h"
#include "sched/sched.h"

/* ------------------------------------------------------------------ keys */

void
sp_key_hash(const char *key, size_t len, uint8_t out[32])
{
    unsigned int n = 32;
    if (EVP_Digest(key, len, out, &n, EVP_sha256(), NULL) != 1) {
        memset(out, 0, 32); /* cannot happen with the default provider */
    }
}

sp_status_t
sp_key_generate(char *out, size_t cap)
{
    unsigned char raw[32], b64[4 * ((sizeof raw + 2) / 3) + 1];
    if (cap < 10 + 43 + 1 || RAND_bytes(raw, sizeof raw) != 1) {
        return SP_ERR_IO;
    }
    /* base64url without padding (RFC 4648 section 5): OpenSSL's standard
     * alphabet with + and / swapped for - and _, the one '=' dropped. */
    int n = EVP_EncodeBlock(b64, raw, (int)sizeof raw);
    while (n > 0 && b64[n - 1] == '=') {
        n--;
    }
    for (int i = 0; i < n; i++) {
        b64[i] = b64[i] == '+' ? '-' : b64[i] == '/' ? '_' : b64[i];
    }
    snprintf(out, cap, "sk-sampan-%.*s", n, (const char *)b64);
    OPENSSL_cleanse(raw, sizeof raw);
    OPENSSL_cleanse(b64, sizeof b64);
    return SP_OK;
}

void
sp_key_hash_str(const uint8_t h[32], char out[72])
{
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < 32; i++) {
        out[7 + 2 * i] = hex[h[i] >> 4];
        out[8 + 2 * i] = hex[h[i] & 15];
    }
    out[71] = '\0';
}

bool
sp_key_hash_parse(const char *s, size_t len, uint8_t out[32])
{
    /* Lowercase hex only (the form sp_key_hash_str writes), checked before
     * OpenSSL's parser, which also takes uppercase. */
    char hex[65];
    if (len != 71 || memcmp(s, "sha256:", 7) != 0) {
        return false;
    }
    memcpy(hex, s + 7, 64);
    hex[64] = '\0';
    if (strspn(hex, "0123456789abcdef") != 64) {
        return false;
    }
    size_t got = 0;
    if (OPENSSL_hexstr2buf_ex(out, 32, &got, hex, '\0') != 1 || got != 32) {
        ERR_clear_error();
        return false;
    }
    return true;
}

const char *
sp_scope_name(uint32_t scope)
{
    switch (scope) {
    case SP_SCOPE_INFER: return "infer";
    case SP_SCOPE_ADMIN: return "admin";
    case SP_SCOPE_METRICS: return "metrics";
    default: return "?";
    }
}

const char *
sp_limit_name(sp_limit_t l)
{
    static const char *const names[] = {"requests_per_second", "tokens_per_minute",
                                        "max_concurrent", "model", "scope"};
    return l >= 0 && l <= SP_LIMIT_SCOPE ? names[l] : "?";
}

/* ------------------------------------------------------------------ parse */

static bool
name_ok(const char *s, size_t n)
{
    if (n == 0 || n > SP_TENANT_NAME_MAX) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.')) {
            return false;
        }
    }
    return true;
}

#define BAD(...) (snprintf(err, err_len, __VA_ARGS__), SP_ERR_INVALID)

static sp_status_t
num_field(const json_t *lim, const char *key, double lo, double hi, double *out, const char *label,
          int i, char *err, size_t err_len)
{
    const json_t *v = json_object_get(lim, key);
    if (v == NULL || json_is_null(v)) {
        return SP_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi)) {
        return BAD("%s: tenants[%d].limits.%s: must be a number from %g to %g", label, i, key, lo, hi);
    }
    *out = json_number_value(v);
    return SP_OK;
}

static sp_status_t
parse_tenant(const json_t *o, int i, const char *label, sp_tenant_t *t, char *err, size_t err_len)
{
    if (!json_is_object(o)) {
        return BAD("%s: tenants[%d]: must be an object", label, i);
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (strcmp(key, "name") && strcmp(key, "keys") && strcmp(key, "scopes") &&
            strcmp(key, "tier") && strcmp(key, "limits")) {
            return BAD("%s: tenants[%d].%s: unknown field (name, keys, scopes, tier, limits)",
                       label, i, key);
        }
    }
    v = json_object_get(o, "name");
    if (!json_is_string(v) || !name_ok(json_string_value(v), json_string_length(v))) {
        return BAD("%s: tenants[%d].name: required, 1 to %d of [A-Za-z0-9._-]", label, i,
                   SP_TENANT_NAME_MAX);
    }
    snprintf(t->name, sizeof t->name, "%s", json_string_value(v));
    v = json_object_get(o, "keys");
    if (v && !json_is_array(v)) {
        return BAD("%s: tenants[%d].keys: must be a list of \"sha256:<hex>\"", label, i);
    }
    if (json_array_size(v) > SP_TENANT_KEYS_MAX) {
        return BAD("%s: tenants[%d].keys: more than %d keys", label, i, SP_TENANT_KEYS_MAX);
    }
    for (size_t k = 0; k < json_array_size(v); k++) {
        const json_t *h = json_array_get(v, k);
        if (!json_is_string(h) ||
            !sp_key_hash_parse(json_string_value(h), json_string_length(h), t->keys[t->n_keys])) {
            return BAD("%s: tenants[%d].keys[%zu]: must be \"sha256:\" and 64 lowercase hex digits "
                       "(a key's hash, never the key: `sampan keys add`)",
                       label, i, k);
        }
        t->n_keys++;
    }
    t->scopes = SP_SCOPE_INFER;
    v = json_object_get(o, "scopes");
    if (v) {
        if (!json_is_array(v)) {
            return BAD("%s: tenants[%d].scopes: must be a list", label, i);
        }
        t->scopes = 0;
        for (size_t k = 0; k < json_array_size(v); k++) {
            const char *sc = json_string_value(json_array_get(v, k));
            uint32_t bit = !sc ? 0
                           : !strcmp(sc, "infer")   ? SP_SCOPE_INFER
                           : !strcmp(sc, "admin")   ? SP_SCOPE_ADMIN
                           : !strcmp(sc, "metrics") ? SP_SCOPE_METRICS
                                                    : 0;
            if (bit == 0) {
                return BAD("%s: tenants[%d].scopes[%zu]: must be infer, admin or metrics", label, i,
                           k);
            }
            t->scopes |= bit;
        }
    }
    t->tier = SP_SCHED_PRIO_STANDARD;
    v = json_object_get(o, "tier");
    if (v) {
        const char *tr = json_string_value(v);
        if (tr && !strcmp(tr, "premium")) {
            t->tier = SP_SCHED_PRIO_PREMIUM;
        } else if (tr && !strcmp(tr, "batch")) {
            t->tier = SP_SCHED_PRIO_BATCH;
        } else if (!tr || strcmp(tr, "standard")) {
            return BAD("%s: tenants[%d].tier: must be premium, standard or batch", label, i);
        }
    }
    const json_t *lim = json_object_get(o, "limits");
    if (lim) {
        if (!json_is_object(lim)) {
            return BAD("%s: tenants[%d].limits: must be an object", label, i);
        }
        json_object_foreach((json_t *)lim, key, v) {
            if (strcmp(key, "requests_per_second") && strcmp(key, "burst") &&
                strcmp(key, "tokens_per_minute") && strcmp(key, "max_concurrent") &&
                strcmp(key, "models")) {
                return BAD("%s: tenants[%d].limits.%s: unknown field (requests_per_second, burst, "
                           "tokens_per_minute, max_concurrent, models)",
                           label, i, key);
            }
        }
        double d;
        sp_status_t st;
        d = 0;
        if ((st = num_field(lim, "requests_per_second", 0, 1e7, &d, label, i, err, err_len))) return st;
        t->rps = d;
        d = 0;
        if ((st = num_field(lim, "burst", 1, 1e7, &d, label, i, err, err_len))) return st;
        t->burst = d;
        d = 0;
        if ((st = num_field(lim, "tokens_per_minute", 0, 1e15, &d, label, i, err, err_len))) return st;
        t->tpm = (int64_t)d;
        d = 0;
        if ((st = num_field(lim, "max_concurrent", 0, 1e7, &d, label, i, err, err_len))) return st;
        t->max_concurrent = (int64_t)d;
        v = json_object_get(lim, "models");
        if (v) {
            if (!json_is_array(v) || json_array_size(v) > SP_TENANT_MODELS_MAX) {
                return BAD("%s: tenants[%d].limits.models: must be a list of at most %d names",
                           label, i, SP_TENANT_MODELS_MAX);
            }
            for (size_t k = 0; k < json_array_size(v); k++) {
                const json_t *m = json_array_get(v, k);
                if (!json_is_string(m) || json_string_length(m) == 0 || json_string_length(m) > 128 ||
                    strlen(json_string_value(m)) != json_string_length(m)) {
                    return BAD("%s: tenants[%d].limits.models[%zu]: must be a model name", label, i,
                               k);
                }
                snprintf(t->models[t->n_models++], sizeof t->models[0], "%s", json_string_value(m));
            }
        }
    }
    if (t->burst == 0) {
        t->burst = t->rps > 1 ? t->rps : 1;
    }
    return SP_OK;
}

sp_status_t
sp_tenants_parse(const char *text, size_t len, const char *label, sp_tenants_t **out, char *err,
                 size_t err_len)
{
    *out = NULL;
    json_t *root = NULL;
    char jerr[256];
    if (len > SP_TENANTS_FILE_MAX) {
        return BAD("%s: larger than %d bytes", label, SP_TENANTS_FILE_MAX);
    }
    if (sp_json_parse(text, len, 16, &root, jerr, sizeof jerr) != SP_OK) {
        return BAD("%s: %s", label, jerr);
    }
    sp_status_t st = SP_OK;
    sp_tenants_t *t = NULL;
    const json_t *arr = json_object_get(root, "tenants");
    if (!json_is_object(root) || json_object_size(root) != 1 || !json_is_array(arr)) {
        st = BAD("%s: must be {\"tenants\": [...]}", label);
        goto done;
    }
    size_t n = json_array_size(arr);
    if (n > SP_TENANTS_MAX) {
        st = BAD("%s: tenants: more than %d", label, SP_TENANTS_MAX);
        goto done;
    }
    t = sp_calloc(1, sizeof *t);
    if (t == NULL || (n && (t->t = sp_calloc(n, sizeof *t->t)) == NULL)) {
        st = BAD("%s: out of memory", label);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if ((st = parse_tenant(json_array_get(arr, i), (int)i, label, &t->t[i], err, err_len))) {
            goto done;
        }
        for (size_t k = 0; k < i; k++) {
            if (strcmp(t->t[k].name, t->t[i].name) == 0) {
                st = BAD("%s: tenants[%zu].name: \"%s\" is used twice", label, i, t->t[i].name);
                goto done;
            }
        }
        t->n++;
    }
    /* A key that opens two tenants would make the tenant depend on order. */
    for (int32_t a = 0; a < t->n; a++) {
        for (int32_t ka = 0; ka < t->t[a].n_keys; ka++) {
            for (int32_t b = a; b < t->n; b++) {
                for (int32_t kb = b == a ? ka + 1 : 0; kb < t->t[b].n_keys; kb++) {
                    if (memcmp(t->t[a].keys[ka], t->t[b].keys[kb], 32) == 0) {
                        st = BAD("%s: tenants[%d].keys[%d]: the same key hash appears twice", label,
                                 (int)b, (int)kb);
                        goto done;
                    }
                }
            }
        }
    }
done:
    json_decref(root);
    if (st != SP_OK) {
        sp_tenants_free(t);
        return st;
    }
    *out = t;
    return SP_OK;
}

sp_status_t
sp_tenants_load(const char *path, sp_tenants_t **out, char *err, size_t err_len)
{
    char *text = NULL;
    size_t len = 0;
    sp_status_t st = sp_read_file(path, path, SP_TENANTS_FILE_MAX, &text, &len, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    st = sp_tenants_parse(text, len, path, out, err, err_len);
    sp_free(text);
    return st;
}

sp_status_t
sp_tenants_save(const sp_tenants_t *t, const char *path, char *err, size_t err_len)
{
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "tenants", arr);
    for (int32_t i = 0; i < t->n; i++) {
        const sp_tenant_t *x = &t->t[i];
        json_t *o = json_object(), *keys = json_array(), *scopes = json_array(), *lim = json_object();
        json_object_set_new(o, "name", json_string(x->name));
        for (int32_t k = 0; k < x->n_keys; k++) {
            char h[72];
            sp_key_hash_str(x->keys[k], h);
            json_array_append_new(keys, json_string(h));
        }
        json_object_set_new(o, "keys", keys);
        for (uint32_t b = 1; b <= SP_SCOPE_METRICS; b <<= 1) {
            if (x->scopes & b) {
                json_array_append_new(scopes, json_string(sp_scope_name(b)));
            }
        }
        json_object_set_new(o, "scopes", scopes);
        json_object_set_new(o, "tier", json_string(x->tier > 0   ? "premium"
                                                   : x->tier < 0 ? "batch"
                                                                 : "standard"));
        if (x->rps > 0) json_object_set_new(lim, "requests_per_second", json_real(x->rps));
        if (x->rps > 0 && x->burst != (x->rps > 1 ? x->rps : 1)) {
            json_object_set_new(lim, "burst", json_real(x->burst));
        }
        if (x->tpm > 0) json_object_set_new(lim, "tokens_per_minute", json_integer(x->tpm));
        if (x->max_concurrent > 0) json_object_set_new(lim, "max_concurrent", json_integer(x->max_concurrent));
        if (x->n_models > 0) {
            json_t *ms = json_array();
            for (int32_t k = 0; k < x->n_models; k++) {
                json_array_append_new(ms, json_string(x->models[k]));
            }
            json_object_set_new(lim, "models", ms);
        }
        json_object_set_new(o, "limits", lim);
        json_array_append_new(arr, o);
    }
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    sp_status_t st = SP_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL || json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 ||
        fputc('\n', f) == EOF || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    }
    if (f) {
        fclose(f);
    } else if (fd >= 0) {
        close(fd);
    }
    if (st == SP_OK && rename(tmp, path) != 0) {
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: cannot replace: %s", path, strerror(errno));
    }
    if (st != SP_OK) {
        unlink(tmp);
    }
    json_decref(root);
    return st;
}

void
sp_tenants_free(sp_tenants_t *t)
{
    if (t) {
        sp_free(t->t);
        sp_free(t);
    }
}

/* ------------------------------------------------------------------ auth */

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
        sp_key_hash(legacy_key, strlen(legacy_key), a->legacy_key);
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
    sp_key_hash(key.ptr ? key.ptr : "", key.ptr ? key.len : 0, h);
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
                 sp_scope_name(scope));
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
sp_tier_cap_level(int32_t tier, uint32_t asked, uint32_t levels, uint32_t default_level)
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
    return sp_tier_cap_level(sp_auth_tier(st), asked, levels, default_level);
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
