/* backends.c - backend plugins: lookup, dlopen, the host callbacks (backends.h). */
#include "serving/backends.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "sampan/log.h"

#define MAX_BACKENDS 32

typedef struct loaded {
    char name[40];
    void *lib;
    const sp_backend_api_t *api;
} loaded_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static loaded_t loaded[MAX_BACKENDS];
static int n_loaded;

static void *
host_alloc(size_t n)
{
    return sp_malloc(n ? n : 1);
}

static void
host_free(void *p)
{
    sp_free(p);
}

static void
host_log(int level, const char *line)
{
    sp_log_level_t l = level <= 0 ? SP_LOG_LEVEL_DEBUG
                       : level == 1 ? SP_LOG_LEVEL_INFO
                       : level == 2 ? SP_LOG_LEVEL_WARN
                                    : SP_LOG_LEVEL_ERROR;
    SP_LOG(l, "event=backend %s", line ? line : "");
}

static const sp_backend_host_t host = {
    .abi_version = SP_BACKEND_ABI_VERSION,
    .alloc_fn = host_alloc,
    .free_fn = host_free,
    .log_fn = host_log,
};

const sp_backend_host_t *
sp_backends_host(void)
{
    return &host;
}

/* The directory of the running binary (for <exe dir>/backends). */
static void
exe_dir(char *out, size_t cap)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) {
        out[0] = '\0';
        return;
    }
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash) {
        *slash = '\0';
    }
    snprintf(out, cap, "%s", buf);
}

static sp_status_t
try_open(const char *dir, const char *name, loaded_t *l, char *why, size_t why_len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.3000s/libsampan_%.40s.so", dir, name);
    if (access(path, R_OK) != 0) {
        snprintf(why, why_len, "%.400s: not found", path);
        return SP_ERR_NOT_FOUND;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *e = dlerror();
        snprintf(why, why_len, "%.300s: %.200s", path, e ? e : "cannot load");
        return SP_ERR_INVALID;
    }
    sp_backend_init_fn init;
    *(void **)&init = dlsym(lib, SP_BACKEND_INIT_SYMBOL);
    const sp_backend_api_t *api = init ? init(SP_BACKEND_ABI_VERSION) : NULL;
    if (api == NULL || api->abi_version != SP_BACKEND_ABI_VERSION || api->name == NULL ||
        strcmp(api->name, name) != 0 || !api->load || !api->execute || !api->unload) {
        snprintf(why, why_len,
                 "%.400s: %s", path,
                 init == NULL  ? "no " SP_BACKEND_INIT_SYMBOL " symbol"
                 : api == NULL ? "does not support backend ABI version 1"
                               : "its table is incomplete or names another backend");
        dlclose(lib);
        return SP_ERR_INVALID;
    }
    snprintf(l->name, sizeof l->name, "%s", name);
    l->lib = lib;
    l->api = api;
    SP_LOG_INFO("event=backend_loaded name=%s file=%s", name, sp_log_str(path));
    return SP_OK;
}

sp_status_t
sp_backends_find(const char *name, const char *dir, const sp_backend_api_t **out, char *err,
                 size_t err_len)
{
    *out = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_loaded; i++) {
        if (strcmp(loaded[i].name, name) == 0) {
            *out = loaded[i].api;
            pthread_mutex_unlock(&mu);
            return SP_OK;
        }
    }
    char dirs[3][1100];
    int nd = 0;
    if (dir && dir[0]) {
        snprintf(dirs[nd++], sizeof dirs[0], "%.1000s", dir);
    }
    char ed[PATH_MAX];
    exe_dir(ed, sizeof ed);
    if (ed[0]) {
        snprintf(dirs[nd++], sizeof dirs[0], "%.1000s/backends", ed);
    }
    snprintf(dirs[nd++], sizeof dirs[0], "/usr/lib/sampan/backends");
    char why[3][512];
    sp_status_t st = SP_ERR_NOT_FOUND;
    if (n_loaded >= MAX_BACKENDS) {
        pthread_mutex_unlock(&mu);
        return sp_errf(err, err_len, SP_ERR_INVALID, "more than %d backends", MAX_BACKENDS);
    }
    for (int i = 0; i < nd; i++) {
        st = try_open(dirs[i], name, &loaded[n_loaded], why[i], sizeof why[i]);
        if (st == SP_OK) {
            *out = loaded[n_loaded++].api;
            pthread_mutex_unlock(&mu);
            return SP_OK;
        }
        if (st != SP_ERR_NOT_FOUND) { /* found but broken: say so, do not look further */
            pthread_mutex_unlock(&mu);
            return sp_errf(err, err_len, SP_ERR_INVALID, "backend \"%s\": %s", name, why[i]);
        }
    }
    pthread_mutex_unlock(&mu);
    /* onnx is what Triton's onnxruntime names map to (repo_config.c): say
     * plainly that this server has no such backend built. */
    return sp_errf(err, err_len, SP_ERR_NOT_FOUND,
                   "%s%s%s%s not found (looked for libsampan_%s.so in %s%s%s%s%s; "
                   "--backends-dir sets the first place)",
                   strcmp(name, "onnx") == 0 ? "onnx backend not built: " : "",
                   "backend \"", name, "\"", name, dirs[0], nd > 1 ? ", " : "",
                   nd > 1 ? dirs[1] : "", nd > 2 ? ", " : "", nd > 2 ? dirs[2] : "");
}
