/*
 * repo_path.c - names and paths inside a model repository (repo_path.h):
 * the check of a model or file name that may come from a request, and the
 * realpath resolution that refuses anything leaving the repository root.
 *
 * Threads: any; no state.
 */
#include "serving/repo_path.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "serving/repo_config.h"

sp_status_t
sp_repo_path_check_name_n(const char *name, size_t len, char *err, size_t err_len)
{
    if (!name || len == 0) return sp_errf(err, err_len, SP_ERR_INVALID, "name is empty");
    if (len > SP_REPO_NAME_MAX) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "name longer than %d bytes", SP_REPO_NAME_MAX);
    }
    if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.')) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "name \"%.*s\" is not allowed", (int)len, name);
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch == 0) return sp_errf(err, err_len, SP_ERR_INVALID, "name contains a NUL byte");
        if (ch == '/' || ch == '\\') {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "name \"%.*s\" contains a path separator", (int)len, name);
        }
        if (ch < 0x20 || ch == 0x7f) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "name contains a control byte");
        }
    }
    return SP_OK;
}

sp_status_t
sp_repo_path_check_name(const char *name, char *err, size_t err_len)
{
    return sp_repo_path_check_name_n(name, name ? strnlen(name, SP_REPO_NAME_MAX + 1) : 0, err, err_len);
}

sp_status_t
sp_repo_path_resolve(const char *root_real, const char *rel, char *out, size_t out_len, char *err,
                     size_t err_len)
{
    char path[PATH_MAX], res[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", root_real, rel);
    if (n < 0 || (size_t)n >= sizeof path) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: path too long", rel);
    }
    if (!realpath(path, res)) {
        return sp_errf(err, err_len, errno == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "%s: %s", rel,
                       strerror(errno));
    }
    size_t rl = strlen(root_real);
    bool inside = rl == 1 || (strncmp(res, root_real, rl) == 0 && (res[rl] == '/' || !res[rl]));
    if (!inside) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: resolves outside the repository", rel);
    }
    if (strlen(res) >= out_len) return sp_errf(err, err_len, SP_ERR_INVALID, "%s: path too long", rel);
    memcpy(out, res, strlen(res) + 1);
    return SP_OK;
}
