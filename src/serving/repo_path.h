/*
 * repo_path.h - names and paths inside a model repository: what a model or
 * file name may be, and resolving a relative path without leaving the root.
 * Used by the scanner (repo.c), configs (repo_config.c), adapters and the
 * repository routes.
 */
#ifndef SP_SERVING_REPO_PATH_H
#define SP_SERVING_REPO_PATH_H

#include <stddef.h>

#include "sampan/status.h"

/* A valid model name (or file name): 1..SP_REPO_NAME_MAX bytes (repo_config.h), no '/', '\\',
 * control byte or NUL, not "." or "..". len counts bytes as received, so an
 * embedded NUL from a request is caught. */
sp_status_t sp_repo_path_check_name_n(const char *name, size_t len, char *err, size_t err_len);
sp_status_t sp_repo_path_check_name(const char *name, char *err, size_t err_len);

/* Resolve root_real/rel (rel already checked) with realpath into out (PATH_MAX)
 * and refuse a result outside root_real. SP_ERR_NOT_FOUND when it does not exist. */
sp_status_t sp_repo_path_resolve(const char *root_real, const char *rel, char *out, size_t out_len,
                                 char *err, size_t err_len);

#endif /* SP_SERVING_REPO_PATH_H */
