/* tenants.c - the tenants file: parsing, loading, saving, and key hashing (tenants.h). */
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
sp_tenants_key_hash(const char *key, size_t len, uint8_t out[32])
{
    unsigned int n = 32;
    if (EVP_Digest(key, len, out, &n, EVP_sha256(), NULL) != 1) {
        memset(out, 0, 32); /* cannot happen with the default provider */
    }
}

sp_status_t
sp_tenants_key_generate(char *out, size_t cap)
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
sp_tenants_key_hash_str(const uint8_t h[32], char out[72])
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
sp_tenants_key_hash_parse(const char *s, size_t len, uint8_t out[32])
{
    /* Lowercase hex only (the form sp_tenants_key_hash_str writes), checked before
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
sp_tenants_scope_name(uint32_t scope)
{
    switch (scope) {
    case SP_SCOPE_INFER: return "infer";
    case SP_SCOPE_ADMIN: return "admin";
    case SP_SCOPE_METRICS: return "metrics";
    default: return "?";
    }
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
            !sp_tenants_key_hash_parse(json_string_value(h), json_string_length(h), t->keys[t->n_keys])) {
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
    sp_status_t st = sp_file_read(path, path, SP_TENANTS_FILE_MAX, &text, &len, err, err_len);
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
            sp_tenants_key_hash_str(x->keys[k], h);
            json_array_append_new(keys, json_string(h));
        }
        json_object_set_new(o, "keys", keys);
        for (uint32_t b = 1; b <= SP_SCOPE_METRICS; b <<= 1) {
            if (x->scopes & b) {
                json_array_append_new(scopes, json_string(sp_tenants_scope_name(b)));
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
