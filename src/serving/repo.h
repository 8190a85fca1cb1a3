/*
 * repo.h - the model repository on disk: scan, version selection, diff, path safety.
 *
 * Layout (Triton's): <root>/<model>/config.json and <root>/<model>/<version>/<files>,
 * versions being positive decimal directory names. A scan reads the tree once
 * and produces a self-contained snapshot (sp_repo_scan_t): every model with its
 * parsed config or the error that makes it unavailable, and the versions its
 * version_policy selects, each with its model file or the reason it has none.
 * One broken model never fails the scan. Two snapshots diff into the changes
 * that poll mode acts on. Nothing here loads weights: the registry (next
 * layer) does, and sets the READY / LOADING states this module only declares.
 *
 * Path safety: every name that becomes a path (model names and versions from
 * requests or directory entries, the model_file parameter) is checked first,
 * and every path is resolved with realpath and must stay under the
 * repository's resolved root, so `..`, absolute names and symlinks out of the
 * repository are refused while symlinks inside it are fine.
 */
#ifndef SP_SERVING_REPO_H
#define SP_SERVING_REPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serving/repo_config.h"
#include "serving/repo_path.h"
#include "sampan/status.h"

typedef struct sp_repo_limits {
    int32_t max_models;       /* model directories per repository (default 1024) */
    int32_t max_versions;     /* version directories per model (default 256) */
    int32_t max_files;        /* directory entries looked at per version (default 1024) */
    size_t max_config_bytes;  /* config.json size (default and cap SP_REPO_CONFIG_MAX) */
} sp_repo_limits_t;

void sp_repo_limits_default(sp_repo_limits_t *l);

/* Triton's /v2/repository/index states. */
typedef enum sp_repo_state {
    SP_REPO_UNAVAILABLE = 0,
    SP_REPO_LOADING,
    SP_REPO_READY,
} sp_repo_state_t;

const char *sp_repo_state_name(sp_repo_state_t s); /* "READY" */

typedef struct sp_repo_version {
    int64_t version;
    char *dir;          /* resolved absolute version directory */
    char *model_path;   /* resolved absolute model file; NULL when error */
    uint64_t stamp;     /* hash of the names, sizes and mtimes of the files */
    sp_repo_state_t state; /* a scan leaves UNAVAILABLE; the registry moves it */
    char reason[512];   /* "" or why it cannot be served */
} sp_repo_version_t;

typedef struct sp_repo_model {
    char name[SP_REPO_NAME_MAX + 1];
    bool ok;               /* config parsed and valid */
    char reason[512];      /* when !ok: the config or directory error */
    sp_repo_config_t cfg;  /* valid when ok */
    uint64_t config_stamp; /* size and mtime of config.json */
    int32_t n_versions;    /* selected by the version policy */
    sp_repo_version_t *versions; /* ascending */
} sp_repo_model_t;

typedef struct sp_repo_scan {
    char *root;            /* resolved absolute root */
    int32_t n_models;
    sp_repo_model_t *models; /* sorted by name */
} sp_repo_scan_t;


/* A version string: 1..15 decimal digits, no sign or leading zero, > 0. */
sp_status_t sp_repo_parse_version(const char *s, size_t len, int64_t *out, char *err,
                                  size_t err_len);


/* Scan a repository. Fails only when the root itself is unusable or holds more
 * than max_models model directories; per-model problems land in the models. */
sp_status_t sp_repo_scan(const char *root, const sp_repo_limits_t *lim, sp_repo_scan_t **out,
                         char *err, size_t err_len);

/* Re-read one model (a load request, with an optional config override). The
 * name is checked; *out is a self-contained model to free with
 * sp_repo_model_free. SP_ERR_NOT_FOUND when the directory does not exist;
 * other problems are reported in out->reason like a scan does. */
sp_status_t sp_repo_scan_model(const char *root, const char *name, size_t name_len,
                               const sp_repo_limits_t *lim, const char *override_json,
                               size_t override_len, sp_repo_model_t *out, char *err,
                               size_t err_len);

void sp_repo_model_free(sp_repo_model_t *m);
void sp_repo_scan_free(sp_repo_scan_t *s);
const sp_repo_model_t *sp_repo_find(const sp_repo_scan_t *s, const char *name);

/* Choose versions from the available ones (ascending, unique) by the policy:
 * writes indices into avail to idx and returns their count. Specific versions
 * that do not exist are reported through missing (may be NULL). */
int32_t sp_repo_select_versions(const sp_repo_version_policy_t *vp, const int64_t *avail,
                                int32_t n_avail, int32_t *idx, int64_t *missing,
                                int32_t *n_missing);

/* ---- poll mode */

typedef enum sp_repo_change_kind {
    SP_REPO_ADDED = 0,
    SP_REPO_CHANGED,
    SP_REPO_REMOVED,
} sp_repo_change_kind_t;

typedef struct sp_repo_change {
    sp_repo_change_kind_t kind;
    char name[SP_REPO_NAME_MAX + 1];
    int64_t version; /* 0 = the model itself (its config or availability) */
} sp_repo_change_t;

/* Changes from old (may be NULL: everything is added) to cur, models sorted by
 * name and, within one, the model entry first then versions ascending.
 * *out is heap (sp_free). A model whose config changed is CHANGED and its
 * versions are listed only when they themselves changed. */
sp_status_t sp_repo_diff(const sp_repo_scan_t *old, const sp_repo_scan_t *cur,
                         sp_repo_change_t **out, int32_t *n_out);

/* ---- /v2/repository/index */

typedef struct sp_repo_index_entry {
    const char *name;   /* borrowed from the scan */
    int64_t version;    /* 0 = no version (a model-level error) */
    sp_repo_state_t state;
    const char *reason; /* borrowed; "" when none */
} sp_repo_index_entry_t;

/* One entry per selected version, or one model-level entry when the model has
 * no servable version. *out is heap (sp_free); entries borrow from s. */
sp_status_t sp_repo_index(const sp_repo_scan_t *s, sp_repo_index_entry_t **out, int32_t *n_out);

#endif /* SP_SERVING_REPO_H */
