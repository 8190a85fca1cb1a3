/* repo.c - scanning the model repository, version policies, diffs and path safety. */
#include "serving/repo.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"

void
sp_repo_limits_default(sp_repo_limits_t *l)
{
    l->max_models = 1024;
    l->max_versions = 256;
    l->max_files = 1024;
    l->max_config_bytes = SP_REPO_CONFIG_MAX;
}

const char *
sp_repo_state_name(sp_repo_state_t s)
{
    switch (s) {
    case SP_REPO_READY: return "READY";
    case SP_REPO_LOADING: return "LOADING";
    default: return "UNAVAILABLE";
    }
}

/* snprintf into a reason buffer; through va_list so that gcc's truncation
 * warning does not fire: reasons are cut at their buffer size on purpose. */
static void SP_PRINTF(3, 4)
say(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

/* ---- versions (names and paths: repo_path.c) */

sp_status_t
sp_repo_parse_version(const char *s, size_t len, int64_t *out, char *err, size_t err_len)
{
    if (len == 0 || len > 15 || s[0] == '0') {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "version \"%.*s\" must be a positive decimal number without leading zeros",
                       (int)(len > 32 ? 32 : len), s);
    }
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "version \"%.*s\" must be a positive decimal number",
                           (int)(len > 32 ? 32 : len), s);
        }
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return SP_OK;
}

/* ---- version selection */

int32_t
sp_repo_select_versions(const sp_repo_version_policy_t *vp, const int64_t *avail, int32_t n_avail,
                        int32_t *idx, int64_t *missing, int32_t *n_missing)
{
    int32_t n = 0, nm = 0;
    switch (vp->kind) {
    case SP_REPO_POLICY_ALL:
        for (int32_t i = 0; i < n_avail; i++) idx[n++] = i;
        break;
    case SP_REPO_POLICY_LATEST: {
        int32_t first = n_avail > vp->num_versions ? n_avail - vp->num_versions : 0;
        for (int32_t i = first; i < n_avail; i++) idx[n++] = i;
        break;
    }
    case SP_REPO_POLICY_SPECIFIC:
        for (int32_t k = 0; k < vp->n_versions; k++) {
            bool found = false;
            for (int32_t i = 0; i < n_avail; i++) {
                if (avail[i] == vp->versions[k]) {
                    idx[n++] = i;
                    found = true;
                    break;
                }
            }
            if (!found && missing) missing[nm++] = vp->versions[k];
        }
        break;
    }
    if (n_missing) *n_missing = nm;
    return n;
}

/* ---- one model */

static uint64_t
mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdULL;
}

static uint64_t
stat_stamp(const struct stat *sb)
{
    uint64_t h = mix(0, (uint64_t)sb->st_size);
    h = mix(h, (uint64_t)sb->st_mtim.tv_sec);
    h = mix(h, (uint64_t)sb->st_mtim.tv_nsec);
    return mix(h, (uint64_t)sb->st_ino);
}

static bool
ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static bool
is_model_file(const sp_repo_config_t *cfg, const char *fname)
{
    if (cfg->backend == SP_REPO_BACKEND_LLM) {
        return ends_with(fname, ".gguf") || ends_with(fname, ".gguf.enc"); /* encrypted: crypto/enc.h */
    }
    return ends_with(fname, ".json") || ends_with(fname, ".ubj");
}

/* Fill v (version, dir, model_path, stamp or reason) from <name>/<version>. */
static sp_status_t
scan_version(const char *root_real, const char *label, const sp_repo_model_t *m,
             const sp_repo_limits_t *lim, int64_t version, sp_repo_version_t *v)
{
    char rel[PATH_MAX], vdir[PATH_MAX], e[400];
    v->version = version;
    v->state = SP_REPO_UNAVAILABLE;
    snprintf(rel, sizeof rel, "%s/%lld", m->name, (long long)version);
    sp_status_t st = sp_repo_path_resolve(root_real, rel, vdir, sizeof vdir, e, sizeof e);
    if (st == SP_ERR_NOT_FOUND) {
        say(v->reason, sizeof v->reason, "%s/%s: version %lld not found", label, m->name,
                 (long long)version);
        return SP_OK;
    }
    if (st) {
        say(v->reason, sizeof v->reason, "%s/%s", label, e);
        return SP_OK;
    }
    v->dir = sp_strndup(vdir, strlen(vdir));
    if (!v->dir) return SP_ERR_NOMEM;

    DIR *d = opendir(vdir);
    if (!d) {
        say(v->reason, sizeof v->reason, "%s/%s: %s", label, rel, strerror(errno));
        return SP_OK;
    }
    const char *want = m->cfg.llm.model_file ? m->cfg.llm.model_file
                                             : sp_repo_config_param(&m->cfg, "model_file");
    char found[SP_REPO_NAME_MAX + 1] = "";
    int n_found = 0, n_entries = 0;
    uint64_t stamp = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        if (++n_entries > lim->max_files) {
            closedir(d);
            say(v->reason, sizeof v->reason, "%s/%s: more than %d files", label, rel,
                     lim->max_files);
            return SP_OK;
        }
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, 0) != 0 || !S_ISREG(sb.st_mode)) continue;
        /* Order-independent: readdir order is not stable across scans. */
        uint64_t h = 1469598103934665603ULL;
        for (const char *p = de->d_name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        stamp += mix(h, stat_stamp(&sb));
        bool match = want ? strcmp(de->d_name, want) == 0 : is_model_file(&m->cfg, de->d_name);
        if (match && strlen(de->d_name) <= SP_REPO_NAME_MAX) {
            n_found++;
            memcpy(found, de->d_name, strlen(de->d_name) + 1); /* length checked above */
        }
    }
    closedir(d);
    v->stamp = stamp;
    if (m->cfg.backend == SP_REPO_BACKEND_PLUGIN && want == NULL) {
        /* A plugin without model_file reads its own files: it gets the directory. */
        v->model_path = sp_strndup(vdir, strlen(vdir));
        return v->model_path ? SP_OK : SP_ERR_NOMEM;
    }
    const char *kind = m->cfg.backend == SP_REPO_BACKEND_LLM ? "*.gguf" : "*.json or *.ubj";
    const char *also = m->cfg.backend == SP_REPO_BACKEND_LLM ? " (or *.gguf.enc)" : "";
    if (n_found == 0) {
        if (want) {
            say(v->reason, sizeof v->reason, "%s/%s: model_file \"%s\" not found", label, rel,
                     want);
        } else {
            say(v->reason, sizeof v->reason, "%s/%s: no %s model file%s", label, rel, kind, also);
        }
        return SP_OK;
    }
    if (n_found > 1) {
        say(v->reason, sizeof v->reason,
                 "%s/%s: more than one %s file%s (name one with parameters.model_file)", label,
                 rel, kind, also);
        return SP_OK;
    }
    char frel[PATH_MAX + SP_REPO_NAME_MAX + 2], fpath[PATH_MAX];
    snprintf(frel, sizeof frel, "%s/%s", rel, found);
    st = sp_repo_path_resolve(root_real, frel, fpath, sizeof fpath, e, sizeof e);
    if (st) {
        say(v->reason, sizeof v->reason, "%s/%s", label, e);
        return SP_OK;
    }
    v->model_path = sp_strndup(fpath, strlen(fpath));
    return v->model_path ? SP_OK : SP_ERR_NOMEM;
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Read <root>/<name>: config, versions. Only allocation failure is an error;
 * everything else becomes m->reason or a version's reason. */
static sp_status_t
scan_one(const char *root_real, const char *label, const char *name, const sp_repo_limits_t *lim,
         const char *ov, size_t ov_len, sp_repo_model_t *m)
{
    char rel[PATH_MAX], path[PATH_MAX], clabel[PATH_MAX + 32], e[600];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    /* config.pbtxt (Triton's text format) or config.json: one of them, so that
     * no file is silently ignored. */
    const char *cfile = "config.json";
    {
        char pj[PATH_MAX], pt[PATH_MAX];
        struct stat ls;
        snprintf(pj, sizeof pj, "%s/%s/config.json", root_real, name);
        snprintf(pt, sizeof pt, "%s/%s/config.pbtxt", root_real, name);
        bool hj = lstat(pj, &ls) == 0, ht = lstat(pt, &ls) == 0;
        if (hj && ht) {
            say(m->reason, sizeof m->reason, "%s/%s: both config.json and config.pbtxt: keep one",
                label, name);
            return SP_OK;
        }
        if (!hj && !ht) {
            say(m->reason, sizeof m->reason, "%s/%s: no config.pbtxt or config.json", label, name);
            return SP_OK;
        }
        if (ht) cfile = "config.pbtxt";
    }
    snprintf(rel, sizeof rel, "%s/%s", name, cfile);
    snprintf(clabel, sizeof clabel, "%s/%s/%s", label, name, cfile);
    sp_status_t st = sp_repo_path_resolve(root_real, rel, path, sizeof path, e, sizeof e);
    if (st) {
        say(m->reason, sizeof m->reason, "%s/%s", label, e);
        return SP_OK;
    }
    struct stat sb;
    if (stat(path, &sb) != 0) {
        say(m->reason, sizeof m->reason, "%s: %s", clabel, strerror(errno));
        return SP_OK;
    }
    m->config_stamp = stat_stamp(&sb);
    if (sb.st_size > (off_t)lim->max_config_bytes) {
        say(m->reason, sizeof m->reason, "%s: larger than %zu bytes", clabel,
                 lim->max_config_bytes);
        return SP_OK;
    }
    st = sp_repo_config_load(path, clabel, ov, ov_len, &m->cfg, e, sizeof e);
    if (st == SP_ERR_NOMEM) return st;
    if (st) {
        say(m->reason, sizeof m->reason, "%s", e);
        return SP_OK;
    }
    if (m->cfg.name[0] && strcmp(m->cfg.name, name) != 0) {
        say(m->reason, sizeof m->reason, "%s: name: \"%s\" does not match the directory \"%s\"",
                 clabel, m->cfg.name, name);
        return SP_OK;
    }

    /* Version directories. */
    snprintf(rel, sizeof rel, "%s/%s", root_real, name);
    DIR *d = opendir(rel);
    if (!d) {
        say(m->reason, sizeof m->reason, "%s/%s: %s", label, name, strerror(errno));
        return SP_OK;
    }
    int64_t *avail = sp_calloc((size_t)lim->max_versions + 1, sizeof *avail);
    int32_t *idx = sp_calloc((size_t)lim->max_versions + SP_REPO_MAX_SPECIFIC, sizeof *idx);
    int64_t missing[SP_REPO_MAX_SPECIFIC];
    if (!avail || !idx) {
        closedir(d);
        sp_free(avail);
        sp_free(idx);
        return SP_ERR_NOMEM;
    }
    int32_t n_avail = 0;
    struct dirent *de;
    bool too_many = false;
    while ((de = readdir(d))) {
        int64_t ver;
        if (sp_repo_parse_version(de->d_name, strlen(de->d_name), &ver, NULL, 0) != SP_OK) {
            continue; /* not a version directory (Triton ignores these too) */
        }
        struct stat vsb;
        if (fstatat(dirfd(d), de->d_name, &vsb, 0) != 0 || !S_ISDIR(vsb.st_mode)) continue;
        if (n_avail == lim->max_versions) {
            too_many = true;
            break;
        }
        avail[n_avail++] = ver;
    }
    closedir(d);
    st = SP_OK;
    if (too_many) {
        say(m->reason, sizeof m->reason, "%s/%s: more than %d version directories", label,
                 name, lim->max_versions);
        goto done;
    }
    qsort(avail, (size_t)n_avail, sizeof *avail, cmp_i64);
    int32_t n_missing = 0;
    int32_t n_sel = sp_repo_select_versions(&m->cfg.version_policy, avail, n_avail, idx, missing,
                                            &n_missing);
    int32_t total = n_sel + n_missing;
    m->ok = true;
    if (total == 0) {
        say(m->reason, sizeof m->reason, "%s/%s: no version directories", label, name);
        goto done;
    }
    m->versions = sp_calloc((size_t)total, sizeof *m->versions);
    if (!m->versions) {
        st = SP_ERR_NOMEM;
        goto done;
    }
    /* Merge the selected and the missing specific versions in ascending order. */
    int32_t a = 0, b = 0;
    while (a < n_sel || b < n_missing) {
        int64_t ver;
        if (b >= n_missing || (a < n_sel && avail[idx[a]] < missing[b])) {
            ver = avail[idx[a++]];
        } else {
            ver = missing[b++];
        }
        st = scan_version(root_real, label, m, lim, ver, &m->versions[m->n_versions++]);
        if (st) break;
    }
done:
    sp_free(avail);
    sp_free(idx);
    return st;
}

void
sp_repo_model_free(sp_repo_model_t *m)
{
    if (!m) return;
    for (int32_t i = 0; i < m->n_versions; i++) {
        sp_free(m->versions[i].dir);
        sp_free(m->versions[i].model_path);
    }
    sp_free(m->versions);
    m->versions = NULL;
    m->n_versions = 0;
    sp_repo_config_free(&m->cfg);
}

void
sp_repo_scan_free(sp_repo_scan_t *s)
{
    if (!s) return;
    for (int32_t i = 0; i < s->n_models; i++) sp_repo_model_free(&s->models[i]);
    sp_free(s->models);
    sp_free(s->root);
    sp_free(s);
}

const sp_repo_model_t *
sp_repo_find(const sp_repo_scan_t *s, const char *name)
{
    for (int32_t i = 0; s && i < s->n_models; i++) {
        if (strcmp(s->models[i].name, name) == 0) return &s->models[i];
    }
    return NULL;
}

static sp_status_t
root_realpath(const char *root, char *out, char *err, size_t err_len)
{
    if (!realpath(root, out)) {
        return sp_errf(err, err_len, errno == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO,
                       "model repository %s: %s", root, strerror(errno));
    }
    struct stat sb;
    if (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "model repository %s: not a directory", root);
    }
    return SP_OK;
}

sp_status_t
sp_repo_scan_model(const char *root, const char *name, size_t name_len, const sp_repo_limits_t *lim,
                   const char *ov, size_t ov_len, sp_repo_model_t *out, char *err, size_t err_len)
{
    char rr[PATH_MAX], e[256], dir[PATH_MAX];
    sp_repo_limits_t dl;
    if (!lim) {
        sp_repo_limits_default(&dl);
        lim = &dl;
    }
    memset(out, 0, sizeof *out);
    if (sp_repo_path_check_name_n(name, name_len, e, sizeof e) != SP_OK) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "model name: %s", e);
    }
    /* A name from a request is a slice of the URL, not NUL-terminated. */
    char nm[SP_REPO_NAME_MAX + 1];
    memcpy(nm, name, name_len);
    nm[name_len] = '\0';
    name = nm;
    sp_status_t st = root_realpath(root, rr, err, err_len);
    if (st) return st;
    st = sp_repo_path_resolve(rr, name, dir, sizeof dir, e, sizeof e);
    if (st == SP_ERR_NOT_FOUND) {
        return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "model \"%s\" not found in %s", name, root);
    }
    if (st) return sp_errf(err, err_len, st, "%s/%s", root, e);
    st = scan_one(rr, root, name, lim, ov, ov_len, out);
    if (st) {
        sp_repo_model_free(out);
        return sp_errf(err, err_len, st, "%s/%s: out of memory", root, name);
    }
    return SP_OK;
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

sp_status_t
sp_repo_scan(const char *root, const sp_repo_limits_t *lim, sp_repo_scan_t **out, char *err,
             size_t err_len)
{
    sp_repo_limits_t dl;
    if (!lim) {
        sp_repo_limits_default(&dl);
        lim = &dl;
    }
    *out = NULL;
    char rr[PATH_MAX];
    sp_status_t st = root_realpath(root, rr, err, err_len);
    if (st) return st;
    DIR *d = opendir(rr);
    if (!d) {
        return sp_errf(err, err_len, SP_ERR_IO, "model repository %s: %s", root, strerror(errno));
    }
    char **names = sp_calloc((size_t)lim->max_models + 1, sizeof *names);
    sp_repo_scan_t *s = sp_calloc(1, sizeof *s);
    int32_t n = 0;
    st = SP_OK;
    if (!names || !s) st = SP_ERR_NOMEM;
    struct dirent *de;
    while (!st && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue; /* ., .., and hidden entries are never models */
        if (sp_repo_path_check_name(de->d_name, NULL, 0) != SP_OK) continue;
        struct stat sb;
        /* A symlink that resolves outside still gets an entry so the index says why. */
        struct stat lsb;
        bool link = fstatat(dirfd(d), de->d_name, &lsb, AT_SYMLINK_NOFOLLOW) == 0 &&
                    S_ISLNK(lsb.st_mode);
        bool dir = fstatat(dirfd(d), de->d_name, &sb, 0) == 0 && S_ISDIR(sb.st_mode);
        /* Every directory is a model, as in Triton: one without a config is
         * listed with that reason, never skipped in silence. */
        if (!dir && !link) continue;
        if (n == lim->max_models) {
            st = sp_errf(err, err_len, SP_ERR_TOO_LARGE, "model repository %s: more than %d models",
                         root, lim->max_models);
            break;
        }
        names[n] = sp_strndup(de->d_name, strlen(de->d_name));
        if (!names[n]) {
            st = SP_ERR_NOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (!st) {
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        s->root = sp_strndup(rr, strlen(rr));
        s->models = sp_calloc((size_t)(n ? n : 1), sizeof *s->models);
        if (!s->root || !s->models) st = SP_ERR_NOMEM;
    }
    for (int32_t i = 0; !st && i < n; i++) {
        st = scan_one(rr, root, names[i], lim, NULL, 0, &s->models[i]);
        s->n_models = i + 1;
    }
    for (int32_t i = 0; names && i < n; i++) sp_free(names[i]);
    sp_free(names);
    if (st) {
        if (st == SP_ERR_NOMEM) sp_errf(err, err_len, st, "model repository %s: out of memory", root);
        sp_repo_scan_free(s);
        return st;
    }
    *out = s;
    return SP_OK;
}

/* ---- diff */

typedef struct chlist {
    sp_repo_change_t *v;
    int32_t n, cap;
} chlist_t;

static int
ch_push(chlist_t *l, sp_repo_change_kind_t k, const char *name, int64_t version)
{
    if (l->n == l->cap) {
        int32_t cap = l->cap ? l->cap * 2 : 16;
        sp_repo_change_t *v = sp_realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    sp_repo_change_t *c = &l->v[l->n++];
    c->kind = k;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->version = version;
    return 0;
}

static bool
same_str(const char *a, const char *b)
{
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

static int
diff_versions(chlist_t *l, const sp_repo_model_t *a, const sp_repo_model_t *b)
{
    int32_t i = 0, j = 0;
    int32_t na = a ? a->n_versions : 0, nb = b ? b->n_versions : 0;
    while (i < na || j < nb) {
        const sp_repo_version_t *va = i < na ? &a->versions[i] : NULL;
        const sp_repo_version_t *vb = j < nb ? &b->versions[j] : NULL;
        int r;
        if (va && (!vb || va->version < vb->version)) {
            r = ch_push(l, SP_REPO_REMOVED, a->name, va->version);
            i++;
        } else if (vb && (!va || vb->version < va->version)) {
            r = ch_push(l, SP_REPO_ADDED, b->name, vb->version);
            j++;
        } else {
            bool same = va->stamp == vb->stamp && same_str(va->model_path, vb->model_path) &&
                        strcmp(va->reason, vb->reason) == 0;
            r = same ? 0 : ch_push(l, SP_REPO_CHANGED, b->name, vb->version);
            i++;
            j++;
        }
        if (r) return r;
    }
    return 0;
}

sp_status_t
sp_repo_diff(const sp_repo_scan_t *old, const sp_repo_scan_t *cur, sp_repo_change_t **out,
             int32_t *n_out)
{
    chlist_t l = {0};
    int32_t i = 0, j = 0;
    int32_t na = old ? old->n_models : 0, nb = cur ? cur->n_models : 0;
    int r = 0;
    while (!r && (i < na || j < nb)) {
        const sp_repo_model_t *a = i < na ? &old->models[i] : NULL;
        const sp_repo_model_t *b = j < nb ? &cur->models[j] : NULL;
        int c = !a ? 1 : !b ? -1 : strcmp(a->name, b->name);
        if (c < 0) {
            r = ch_push(&l, SP_REPO_REMOVED, a->name, 0);
            if (!r) r = diff_versions(&l, a, NULL);
            i++;
        } else if (c > 0) {
            r = ch_push(&l, SP_REPO_ADDED, b->name, 0);
            if (!r) r = diff_versions(&l, NULL, b);
            j++;
        } else {
            bool same = a->ok == b->ok && a->config_stamp == b->config_stamp &&
                        strcmp(a->reason, b->reason) == 0;
            if (!same) r = ch_push(&l, SP_REPO_CHANGED, b->name, 0);
            if (!r) r = diff_versions(&l, a, b);
            i++;
            j++;
        }
    }
    if (r) {
        sp_free(l.v);
        *out = NULL;
        *n_out = 0;
        return SP_ERR_NOMEM;
    }
    *out = l.v;
    *n_out = l.n;
    return SP_OK;
}

/* ---- index */

sp_status_t
sp_repo_index(const sp_repo_scan_t *s, sp_repo_index_entry_t **out, int32_t *n_out)
{
    size_t total = 0;
    for (int32_t i = 0; i < s->n_models; i++) {
        const sp_repo_model_t *m = &s->models[i];
        total += (m->ok && m->n_versions > 0) ? (size_t)m->n_versions : 1;
    }
    sp_repo_index_entry_t *e = sp_calloc(total ? total : 1, sizeof *e);
    if (!e) return SP_ERR_NOMEM;
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_models; i++) {
        const sp_repo_model_t *m = &s->models[i];
        if (!m->ok || m->n_versions == 0) {
            e[n++] = (sp_repo_index_entry_t){m->name, 0, SP_REPO_UNAVAILABLE, m->reason};
            continue;
        }
        for (int32_t k = 0; k < m->n_versions; k++) {
            const sp_repo_version_t *v = &m->versions[k];
            e[n++] = (sp_repo_index_entry_t){m->name, v->version, v->state, v->reason};
        }
    }
    *out = e;
    *n_out = n;
    return SP_OK;
}
