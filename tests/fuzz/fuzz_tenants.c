/*
 * fuzz_tenants.c - libFuzzer target for the tenants file parser
 * (sp_tenants_parse in src/serving/tenants.c): API key hashes, scopes, tiers
 * and limits per tenant.
 *
 * Input: the file's text, copied into an exact-size heap buffer so ASan sees
 * any read past its end. Checks: a failure names the file (its message starts
 * with the label) and returns no table; an accepted table keeps its bounds
 * (at most SP_TENANTS_MAX tenants, names of [A-Za-z0-9._-] and unique, at most
 * SP_TENANT_KEYS_MAX keys, scopes among the three known bits, a known tier,
 * limits within their documented ranges, model names NUL-terminated in their
 * slots), every stored key hash prints as "sha256:<64 hex>" and parses back to
 * the same bytes, and sp_tenants_free leaves nothing behind (LeakSanitizer).
 *
 * Seeds: tests/fuzz/corpus/tenants. Dictionary: tests/fuzz/tenants.dict.
 *
 *   make fuzz
 *   ./build-fuzz/fuzz_tenants -dict=tests/fuzz/tenants.dict \
 *       tests/fuzz/corpus-work/tenants tests/fuzz/corpus/tenants
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "sched/sched.h"
#include "serving/tenants.h"

#define LABEL "tenants.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
need(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_tenants: %s\n", what);
        abort();
    }
}

static bool
name_ok(const char *s)
{
    size_t n = strnlen(s, SP_TENANT_NAME_MAX + 1);
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

static void
check_table(const sp_tenants_t *t)
{
    need(t->n >= 0 && t->n <= SP_TENANTS_MAX, "tenant count");
    for (int32_t i = 0; i < t->n; i++) {
        const sp_tenant_t *x = &t->t[i];
        need(name_ok(x->name), "a tenant name outside [A-Za-z0-9._-]{1,64}");
        for (int32_t k = 0; k < i; k++) {
            need(strcmp(t->t[k].name, x->name) != 0, "two tenants with one name");
        }
        need((x->scopes & ~(uint32_t)(SP_SCOPE_INFER | SP_SCOPE_ADMIN | SP_SCOPE_METRICS)) == 0,
             "unknown scope bits");
        need(x->tier == SP_SCHED_PRIO_PREMIUM || x->tier == SP_SCHED_PRIO_STANDARD ||
                 x->tier == SP_SCHED_PRIO_BATCH,
             "unknown tier");
        need(x->rps >= 0 && x->rps <= 1e7, "requests_per_second out of range");
        need(x->burst >= 1 && x->burst <= 1e7, "burst out of range");
        need(x->tpm >= 0 && x->max_concurrent >= 0, "negative limit");
        need(x->n_keys >= 0 && x->n_keys <= SP_TENANT_KEYS_MAX, "key count");
        need(x->n_models >= 0 && x->n_models <= SP_TENANT_MODELS_MAX, "model count");
        for (int32_t k = 0; k < x->n_models; k++) {
            need(memchr(x->models[k], '\0', sizeof x->models[k]) != NULL, "model name unterminated");
            need(x->models[k][0] != '\0', "empty model name");
        }
        for (int32_t k = 0; k < x->n_keys; k++) {
            char s[72];
            uint8_t back[32];
            sp_tenants_key_hash_str(x->keys[k], s);
            need(strlen(s) == 7 + 64 && strncmp(s, "sha256:", 7) == 0, "key hash string");
            need(sp_tenants_key_hash_parse(s, strlen(s), back) && memcmp(back, x->keys[k], 32) == 0,
                 "a key hash does not round-trip");
        }
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_json_init();
    char *text = malloc(size ? size : 1);
    if (text == NULL) {
        return 0;
    }
    memcpy(text, data, size);
    char err[1024] = "";
    sp_tenants_t *t = (sp_tenants_t *)1; /* must be reset to NULL on failure */
    sp_status_t st = sp_tenants_parse(text, size, LABEL, &t, err, sizeof err);
    if (st == SP_OK) {
        need(t != NULL, "no table");
        check_table(t);
        sp_tenants_free(t);
    } else {
        need(t == NULL, "a failed parse returned a table");
        need(strncmp(err, LABEL ": ", strlen(LABEL) + 2) == 0,
             "an error message does not name the file");
    }
    /* The key-hash parser alone, on the raw bytes (it sees header values). */
    uint8_t h[32];
    (void)sp_tenants_key_hash_parse(text, size, h);
    free(text);
    return 0;
}
