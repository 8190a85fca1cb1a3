/*
 * keys.c - `sampan keys add|list|revoke`: manage the tenants file.
 *
 * The file holds only SHA-256 hashes of keys: `add` makes a random key,
 * prints it once (it cannot be recovered later) and stores its hash; `list`
 * shows each key by its fingerprint (the first 12 hex digits of the hash);
 * `revoke` removes one key by fingerprint, or a whole tenant. Every change
 * rewrites the file atomically (mode 0600); a running server picks it up
 * within a second or on SIGHUP.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "sched/sched.h"
#include "serving/tenants.h"
#include "tools/tools.h"

static const char usage[] =
    "usage: sampan keys add    --tenants FILE --name NAME [--scopes infer,metrics,admin]\n"
    "                          [--tier premium|standard|batch] [--rps N] [--burst N]\n"
    "                          [--tpm N] [--concurrency N] [--models a,b]\n"
    "       sampan keys list   --tenants FILE [--json]\n"
    "       sampan keys revoke --tenants FILE --name NAME [--key FINGERPRINT]\n"
    "add creates the file or the tenant when missing (a tenant's settings change only when\n"
    "given), makes a new key, prints it once and stores its SHA-256 hash. revoke without\n"
    "--key removes the tenant and all its keys.\n";

typedef struct keys_opts {
    const char *file, *name, *scopes, *tier, *models, *key;
    double rps, burst, tpm, conc;
    bool json;
} keys_opts_t;

static int
parse(int argc, char **argv, keys_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->rps = o->burst = o->tpm = o->conc = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "sampan keys: %s needs a value\n%s", a, usage);
            return 2;
        }
        const char *v = argv[++i];
        double *num = !strcmp(a, "--rps") ? &o->rps
                      : !strcmp(a, "--burst") ? &o->burst
                      : !strcmp(a, "--tpm") ? &o->tpm
                      : !strcmp(a, "--concurrency") ? &o->conc
                                                    : NULL;
        if (num) {
            char *end;
            errno = 0;
            *num = strtod(v, &end);
            if (errno || *end || !(*num >= 0)) {
                fprintf(stderr, "sampan keys: %s expects a number >= 0, got '%s'\n", a, v);
                return 2;
            }
        } else if (!strcmp(a, "--tenants")) {
            o->file = v;
        } else if (!strcmp(a, "--name")) {
            o->name = v;
        } else if (!strcmp(a, "--scopes")) {
            o->scopes = v;
        } else if (!strcmp(a, "--tier")) {
            o->tier = v;
        } else if (!strcmp(a, "--models")) {
            o->models = v;
        } else if (!strcmp(a, "--key")) {
            o->key = v;
        } else {
            fprintf(stderr, "sampan keys: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (o->file == NULL) {
        fprintf(stderr, "sampan keys: --tenants FILE is required\n%s", usage);
        return 2;
    }
    return 0;
}

/* Apply the options to a tenant (validated again when the file is parsed back). */
static int
apply(sp_tenant_t *t, const keys_opts_t *o)
{
    if (o->scopes) {
        t->scopes = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", o->scopes);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            uint32_t b = !strcmp(tok, "infer")   ? SP_SCOPE_INFER
                         : !strcmp(tok, "admin") ? SP_SCOPE_ADMIN
                         : !strcmp(tok, "metrics") ? SP_SCOPE_METRICS
                                                   : 0;
            if (b == 0) {
                fprintf(stderr, "sampan keys: --scopes: '%s' is not infer, admin or metrics\n", tok);
                return 2;
            }
            t->scopes |= b;
        }
    }
    if (o->tier) {
        if (!strcmp(o->tier, "premium")) t->tier = SP_SCHED_PRIO_PREMIUM;
        else if (!strcmp(o->tier, "standard")) t->tier = SP_SCHED_PRIO_STANDARD;
        else if (!strcmp(o->tier, "batch")) t->tier = SP_SCHED_PRIO_BATCH;
        else {
            fprintf(stderr, "sampan keys: --tier must be premium, standard or batch\n");
            return 2;
        }
    }
    if (o->rps >= 0) t->rps = o->rps;
    if (o->burst >= 0) t->burst = o->burst;
    else if (o->rps >= 0) t->burst = o->rps > 1 ? o->rps : 1;
    if (o->tpm >= 0) t->tpm = (int64_t)o->tpm;
    if (o->conc >= 0) t->max_concurrent = (int64_t)o->conc;
    if (o->models) {
        t->n_models = 0;
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", o->models);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (t->n_models >= SP_TENANT_MODELS_MAX || strlen(tok) > 128) {
                fprintf(stderr, "sampan keys: --models: at most %d names of 128 bytes\n",
                        SP_TENANT_MODELS_MAX);
                return 2;
            }
            snprintf(t->models[t->n_models++], sizeof t->models[0], "%s", tok);
        }
    }
    return 0;
}

static sp_tenant_t *
find(sp_tenants_t *t, const char *name)
{
    for (int32_t i = 0; i < t->n; i++) {
        if (strcmp(t->t[i].name, name) == 0) {
            return &t->t[i];
        }
    }
    return NULL;
}

/* Load the file; a missing file is an empty table for `add`. */
static int
load(const char *path, bool may_be_missing, sp_tenants_t **out)
{
    char err[1024];
    struct stat st;
    if (may_be_missing && stat(path, &st) != 0 && errno == ENOENT) {
        *out = sp_calloc(1, sizeof **out);
        return *out ? 0 : 1;
    }
    if (sp_tenants_load(path, out, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan keys: %s\n", err);
        return 1;
    }
    return 0;
}

static int
save(sp_tenants_t *t, const char *path)
{
    char err[1024];
    if (sp_tenants_save(t, path, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan keys: %s\n", err);
        return 1;
    }
    /* Parse what was written: the same checks the server makes. */
    sp_tenants_t *back = NULL;
    if (sp_tenants_load(path, &back, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan keys: the written file does not validate: %s\n", err);
        return 1;
    }
    sp_tenants_free(back);
    return 0;
}

static int
cmd_add(const keys_opts_t *o)
{
    if (o->name == NULL) {
        fprintf(stderr, "sampan keys add: --name is required\n");
        return 2;
    }
    sp_tenants_t *t = NULL;
    if (load(o->file, true, &t) != 0) {
        return 1;
    }
    int rc = 1;
    sp_tenant_t *x = find(t, o->name);
    if (x == NULL) {
        sp_tenant_t *grown = sp_realloc(t->t, (size_t)(t->n + 1) * sizeof *grown);
        if (grown == NULL) {
            goto done;
        }
        t->t = grown;
        x = &t->t[t->n++];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", o->name);
        x->scopes = SP_SCOPE_INFER;
        x->tier = SP_SCHED_PRIO_STANDARD;
        x->burst = 1;
    }
    if ((rc = apply(x, o)) != 0) {
        goto done;
    }
    rc = 1;
    if (x->n_keys >= SP_TENANT_KEYS_MAX) {
        fprintf(stderr, "sampan keys add: tenant '%s' already has %d keys\n", x->name,
                SP_TENANT_KEYS_MAX);
        goto done;
    }
    char key[80];
    if (sp_tenants_key_generate(key, sizeof key) != SP_OK) {
        fprintf(stderr, "sampan keys add: no random bytes\n");
        goto done;
    }
    sp_tenants_key_hash(key, strlen(key), x->keys[x->n_keys++]);
    if (save(t, o->file) == 0) {
        char h[72];
        sp_tenants_key_hash_str(x->keys[x->n_keys - 1], h);
        fprintf(stderr, "added a key for tenant '%s' (fingerprint %.12s); it is shown only once:\n",
                x->name, h + 7);
        printf("%s\n", key);
        rc = 0;
    }
done:
    sp_tenants_free(t);
    return rc;
}

static const char *
tier_name(int32_t t)
{
    return t > 0 ? "premium" : t < 0 ? "batch" : "standard";
}

static int
cmd_list(const keys_opts_t *o)
{
    sp_tenants_t *t = NULL;
    if (load(o->file, false, &t) != 0) {
        return 1;
    }
    if (o->json) {
        printf("{\"tenants\":[");
    } else {
        printf("%-20s %-22s %-9s %-10s %-10s %-6s %-20s %s\n", "TENANT", "SCOPES", "TIER", "RPS",
               "TPM", "CONC", "MODELS", "KEYS");
    }
    for (int32_t i = 0; i < t->n; i++) {
        const sp_tenant_t *x = &t->t[i];
        char scopes[64] = "", models[256] = "", keys[1024] = "";
        for (uint32_t b = 1; b <= SP_SCOPE_METRICS; b <<= 1) {
            if (x->scopes & b) {
                snprintf(scopes + strlen(scopes), sizeof scopes - strlen(scopes), "%s%s",
                         scopes[0] ? "," : "", sp_tenants_scope_name(b));
            }
        }
        for (int32_t k = 0; k < x->n_models; k++) {
            snprintf(models + strlen(models), sizeof models - strlen(models), "%s%s",
                     k ? "," : "", x->models[k]);
        }
        for (int32_t k = 0; k < x->n_keys; k++) {
            char h[72];
            sp_tenants_key_hash_str(x->keys[k], h);
            snprintf(keys + strlen(keys), sizeof keys - strlen(keys),
                     o->json ? "%s\"%.12s\"" : "%s%.12s", k ? "," : "", h + 7);
        }
        if (o->json) {
            printf("%s{\"name\":\"%s\",\"scopes\":\"%s\",\"tier\":\"%s\",\"requests_per_second\":%g,"
                   "\"tokens_per_minute\":%lld,\"max_concurrent\":%lld,\"models\":\"%s\","
                   "\"keys\":[%s]}",
                   i ? "," : "", x->name, scopes, tier_name(x->tier), x->rps, (long long)x->tpm,
                   (long long)x->max_concurrent, models, keys);
        } else {
            char rps[16], tpm[24], conc[16];
            snprintf(rps, sizeof rps, x->rps > 0 ? "%g" : "-", x->rps);
            snprintf(tpm, sizeof tpm, x->tpm > 0 ? "%lld" : "-", (long long)x->tpm);
            snprintf(conc, sizeof conc, x->max_concurrent > 0 ? "%lld" : "-",
                     (long long)x->max_concurrent);
            printf("%-20s %-22s %-9s %-10s %-10s %-6s %-20s %s\n", x->name, scopes,
                   tier_name(x->tier), rps, tpm, conc, models[0] ? models : "*",
                   keys[0] ? keys : "(none)");
        }
    }
    if (o->json) {
        printf("]}\n");
    }
    sp_tenants_free(t);
    return 0;
}

static int
cmd_revoke(const keys_opts_t *o)
{
    if (o->name == NULL) {
        fprintf(stderr, "sampan keys revoke: --name is required\n");
        return 2;
    }
    sp_tenants_t *t = NULL;
    if (load(o->file, false, &t) != 0) {
        return 1;
    }
    int rc = 1;
    sp_tenant_t *x = find(t, o->name);
    if (x == NULL) {
        fprintf(stderr, "sampan keys revoke: no tenant '%s' in %s\n", o->name, o->file);
        goto done;
    }
    if (o->key == NULL) {
        int32_t i = (int32_t)(x - t->t);
        memmove(&t->t[i], &t->t[i + 1], (size_t)(t->n - i - 1) * sizeof *x);
        t->n--;
    } else {
        int32_t hit = -1, hits = 0;
        size_t fl = strlen(o->key);
        for (int32_t k = 0; k < x->n_keys; k++) {
            char h[72];
            sp_tenants_key_hash_str(x->keys[k], h);
            if (fl >= 6 && fl <= 64 && strncmp(h + 7, o->key, fl) == 0) {
                hit = k;
                hits++;
            }
        }
        if (hits != 1) {
            fprintf(stderr, "sampan keys revoke: %s key of '%s' has fingerprint '%s' (give 6 or more "
                            "hex digits from `sampan keys list`)\n",
                    hits ? "more than one" : "no", o->name, o->key);
            goto done;
        }
        memmove(&x->keys[hit], &x->keys[hit + 1], (size_t)(x->n_keys - hit - 1) * sizeof x->keys[0]);
        x->n_keys--;
    }
    rc = save(t, o->file);
    if (rc == 0) {
        fprintf(stderr, "revoked %s\n", o->key ? "the key" : "the tenant and its keys");
    }
done:
    sp_tenants_free(t);
    return rc;
}

int
sp_cmd_keys(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    keys_opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc != 0) {
        return rc;
    }
    if (!strcmp(argv[1], "add")) return cmd_add(&o);
    if (!strcmp(argv[1], "list")) return cmd_list(&o);
    if (!strcmp(argv[1], "revoke")) return cmd_revoke(&o);
    fprintf(stderr, "sampan keys: unknown action '%s'\n%s", argv[1], usage);
    return 2;
}
