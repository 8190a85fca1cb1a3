/*
 * adapters.c - LoRA adapters served next to their base model (adapters.h,
 * docs/lora.md): loading them from the repository, the run-time load and
 * unload of one adapter in a set, the lookup of "<model>:<adapter>" names
 * and their /v1/models entries.
 *
 * An adapter is validated against one loaded model version (its shapes), so
 * each version holds its own copy; a new version built by a reload or a poll
 * loads the directory again. Files are found by name only inside
 * <repository>/<model>/adapters/ and resolved with realpath under the
 * repository root (names come from requests: untrusted).
 *
 * The functions take the set, the base model its adapters are validated
 * against and the lock that guards the set (the registry's); which model
 * versions a command touches is the manager's business (manager.c).
 */
#include "serving/adapters.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "serving/registry.h"
#include "serving/repo.h"
#include "sampan/log.h"

bool
sp_adapters_name_ok(const char *name, size_t len)
{
    if (len == 0 || len > SP_ADAPTER_NAME_MAX || name[0] == '.') {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        const char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-')) {
            return false;
        }
    }
    return true;
}

sp_status_t
sp_adapters_path(const char *repo_real, const char *model, const char *adapter, char *out,
                 size_t out_len, char *err, size_t err_len)
{
    char rel[SP_REPO_NAME_MAX + SP_ADAPTER_NAME_MAX + 32];
    snprintf(rel, sizeof rel, "%s/adapters/%s.gguf", model, adapter);
    sp_status_t st = sp_repo_path_resolve(repo_real, rel, out, out_len, err, err_len);
    if (st == SP_ERR_NOT_FOUND) {
        snprintf(err, err_len, "model '%s' has no adapter '%s' (no file %s)", model, adapter, rel);
    }
    return st;
}

/* Put l into set under name (replacing one of that name; the old reference
 * is returned in *old to release outside the lock). Lock held. false when
 * the set is full. */
static bool
set_put_locked(sp_adapter_set_t *set, const char *name, sp_lora_t *l, sp_lora_t **old)
{
    *old = NULL;
    for (int i = 0; i < set->n; i++) {
        if (strcmp(set->a[i].name, name) == 0) {
            *old = set->a[i].lora;
            set->a[i].lora = l;
            set->a[i].created = (int64_t)time(NULL);
            return true;
        }
    }
    if (set->n == SP_ADAPTERS_MAX) {
        return false;
    }
    sp_served_adapter_t *a = &set->a[set->n++];
    snprintf(a->name, sizeof a->name, "%s", name);
    a->lora = l;
    a->created = (int64_t)time(NULL);
    return true;
}

static bool
ensure_set(sp_adapter_set_t **set, pthread_mutex_t *lock)
{
    if (*set != NULL) {
        return true;
    }
    sp_adapter_set_t *n = sp_calloc(1, sizeof *n);
    if (n == NULL) {
        return false;
    }
    pthread_mutex_lock(lock);
    *set = n;
    pthread_mutex_unlock(lock);
    return true;
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void
sp_adapters_load_dir(sp_adapter_set_t **set, const sp_model_t *base, pthread_mutex_t *lock,
                     const char *repo_real, const char *model, int64_t version)
{
    if (base == NULL || repo_real[0] == '\0') {
        return;
    }
    char rel[SP_REPO_NAME_MAX + 16], dir[4096], err[1024];
    snprintf(rel, sizeof rel, "%s/adapters", model);
    if (sp_repo_path_resolve(repo_real, rel, dir, sizeof dir, err, sizeof err) != SP_OK) {
        return; /* no adapters directory: nothing to do */
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    /* Names first, sorted, so the order (and which fit the cap) is stable. */
    char *names[SP_ADAPTERS_MAX];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len <= 5 || strcmp(de->d_name + len - 5, ".gguf") != 0) {
            continue;
        }
        if (!sp_adapters_name_ok(de->d_name, len - 5)) {
            SP_LOG_WARN("event=adapter_skipped model=%s file=%s reason=\"not a valid adapter name "
                        "([A-Za-z0-9._-], at most %d)\"", sp_log_str(model),
                        sp_log_str(de->d_name), SP_ADAPTER_NAME_MAX);
            continue;
        }
        if (n == SP_ADAPTERS_MAX) {
            SP_LOG_WARN("event=adapter_skipped model=%s file=%s reason=\"more than %d adapters\"",
                        sp_log_str(model), sp_log_str(de->d_name), SP_ADAPTERS_MAX);
            continue;
        }
        names[n] = sp_strndup(de->d_name, len - 5);
        if (names[n] != NULL) {
            n++;
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        char path[4096];
        sp_lora_t *l = NULL, *old = NULL;
        if (sp_adapters_path(repo_real, model, names[i], path, sizeof path, err, sizeof err) ==
                SP_OK &&
            sp_lora_load(base, path, &l, err, sizeof err) == SP_OK && ensure_set(set, lock)) {
            pthread_mutex_lock(lock);
            set_put_locked(*set, names[i], l, &old); /* n <= SP_ADAPTERS_MAX: always fits */
            pthread_mutex_unlock(lock);
            sp_lora_info_t info;
            sp_lora_get_info(l, &info);
            SP_LOG_INFO("event=adapter_loaded model=%s version=%lld adapter=%s rank=%lld "
                        "projections=%lld bytes=%zu", sp_log_str(model), (long long)version,
                        sp_log_str(names[i]), (long long)info.rank_max, (long long)info.n_pairs,
                        info.bytes);
            sp_lora_release(old);
        } else {
            SP_LOG_ERROR("event=adapter_load_failed model=%s adapter=%s error=%s",
                         sp_log_str(model), sp_log_str(names[i]), sp_log_str(err));
            sp_lora_release(l);
        }
        sp_free(names[i]);
    }
}

sp_status_t
sp_adapters_put(sp_adapter_set_t **set, const sp_model_t *base, pthread_mutex_t *lock,
                const char *model, const char *path, const char *adapter, bool *replaced, char *err,
                size_t err_len)
{
    sp_lora_t *l = NULL, *old = NULL;
    *replaced = false;
    sp_status_t st = sp_lora_load(base, path, &l, err, err_len);
    if (st != SP_OK) {
        return st == SP_ERR_NOMEM ? SP_ERR_NOMEM : SP_ERR_INVALID;
    }
    if (!ensure_set(set, lock)) {
        sp_lora_release(l);
        snprintf(err, err_len, "out of memory");
        return SP_ERR_NOMEM;
    }
    pthread_mutex_lock(lock);
    bool ok = set_put_locked(*set, adapter, l, &old);
    pthread_mutex_unlock(lock);
    if (!ok) {
        sp_lora_release(l);
        snprintf(err, err_len, "model '%s' already serves %d adapters", model, SP_ADAPTERS_MAX);
        return SP_ERR_INVALID;
    }
    *replaced = old != NULL;
    sp_lora_release(old); /* requests using it hold their own references */
    return SP_OK;
}

bool
sp_adapters_remove(sp_adapter_set_t *set, pthread_mutex_t *lock, const char *adapter)
{
    sp_lora_t *gone = NULL;
    pthread_mutex_lock(lock);
    for (int k = 0; set && k < set->n; k++) {
        if (strcmp(set->a[k].name, adapter) == 0) {
            gone = set->a[k].lora;
            set->a[k] = set->a[--set->n];
            break;
        }
    }
    pthread_mutex_unlock(lock);
    sp_lora_release(gone); /* freed when the last request using it ends */
    return gone != NULL;
}

void
sp_adapters_free(sp_adapter_set_t *set)
{
    for (int i = 0; set && i < set->n; i++) {
        sp_lora_release(set->a[i].lora);
    }
    sp_free(set);
}

bool
sp_adapters_find(sp_adapter_set_t *const *setp, pthread_mutex_t *lock, const char *base_name,
                 const char *name, size_t len, sp_req_adapter_t *out)
{
    memset(out, 0, sizeof *out);
    const size_t nl = strlen(base_name);
    if (len == nl && memcmp(name, base_name, nl) == 0) {
        return true;
    }
    /* The registry only falls back to a base name "<model>:..." (registry.c). */
    const char *ad = len > nl + 1 && memcmp(name, base_name, nl) == 0 && name[nl] == ':'
                         ? name + nl + 1 : NULL;
    const size_t alen = ad ? len - nl - 1 : 0;
    if (ad && sp_adapters_name_ok(ad, alen)) {
        pthread_mutex_lock(lock);
        const sp_adapter_set_t *set = *setp;
        for (int i = 0; set && i < set->n; i++) {
            if (strlen(set->a[i].name) == alen && memcmp(set->a[i].name, ad, alen) == 0) {
                out->lora = set->a[i].lora;
                sp_lora_ref(out->lora);
                memcpy(out->name, ad, alen);
                break;
            }
        }
        pthread_mutex_unlock(lock);
    }
    return out->lora != NULL;
}

bool
sp_adapters_prefix(sp_str_t want, const char *name)
{
    const size_t nl = strlen(name);
    return want.ptr && want.len > nl + 1 && memcmp(want.ptr, name, nl) == 0 && want.ptr[nl] == ':';
}

void
sp_adapters_list_locked(const sp_served_model_t *m, sp_str_t want, sp_jbuf_t *b, int *found)
{
    const sp_adapter_set_t *set = m->adapters;
    const size_t nl = strlen(m->name);
    for (int i = 0; set && i < set->n; i++) {
        const sp_served_adapter_t *a = &set->a[i];
        if (want.ptr && !(want.len == nl + 1 + strlen(a->name) && sp_adapters_prefix(want, m->name) &&
                          memcmp(want.ptr + nl + 1, a->name, strlen(a->name)) == 0)) {
            continue;
        }
        sp_jbuf_lit(b, (*found)++ ? ",{\"id\":" : "{\"id\":");
        sp_req_adapter_t ra = {a->lora, {0}};
        snprintf(ra.name, sizeof ra.name, "%s", a->name);
        sp_req_adapter_model_name(m, &ra, b);
        sp_lora_info_t info;
        sp_lora_get_info(a->lora, &info);
        sp_jbuf_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"sampan\","
                       "\"parent\":", (long long)a->created);
        sp_jbuf_cstr(b, m->name);
        sp_jbuf_printf(b, ",\"max_model_len\":%lld,\"ready\":true,\"lora_rank\":%lld}",
                       (long long)m->n_ctx, (long long)info.rank_max);
    }
}
