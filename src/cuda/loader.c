/*
 * loader.c - finds libsampan_cuda.so at run time and checks its op table
 * (loader.h, cuda_api.h). sampan never links CUDA: on a machine without the
 * library, the CUDA runtime, a driver or a GPU this only leaves a note saying
 * which, and the GPU backend is unavailable.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/loader.h"
#include "sampan/status.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const sp_cuda_api_t *cached;
static char note[512];

/* Unhealthy devices, one bit per CUDA ordinal (64 is SP_DEVICE_MAX_GPUS). */
static _Atomic uint64_t unhealthy;

const sp_cuda_api_t *
sp_loader_load(const char *path, char *why, size_t why_len)
{
    if (why && why_len) {
        why[0] = '\0';
    }
    /* RTLD_LOCAL: the library's CUDA symbols stay its own. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(why, why_len, "cannot load %s: %s", path, e ? e : "unknown error");
        return NULL;
    }
    sp_cuda_get_api_fn get;
    *(void **)&get = dlsym(h, SP_CUDA_SYMBOL);
    if (get == NULL) {
        snprintf(why, why_len, "%s has no %s: not a sampan CUDA library", path, SP_CUDA_SYMBOL);
        dlclose(h);
        return NULL;
    }
    const sp_cuda_api_t *api = get(SP_CUDA_ABI_VERSION);
    if (api == NULL || api->abi_version != SP_CUDA_ABI_VERSION ||
        api->struct_size < sizeof(sp_cuda_api_t)) {
        snprintf(why, why_len, "%s speaks CUDA ABI version %u (table of %u bytes), sampan wants "
                 "%u (%zu bytes): rebuild it with `make cuda`", path,
                 api ? api->abi_version : 0u, api ? api->struct_size : 0u, SP_CUDA_ABI_VERSION,
                 sizeof(sp_cuda_api_t));
        dlclose(h);
        return NULL;
    }
    int n = 0;
    char e[256] = "";
    if (api->device_count(&n, e, sizeof e) != SP_OK || n < 1) {
        snprintf(why, why_len, "no CUDA device: %s", e[0] ? e : "the runtime reports none");
        dlclose(h);
        return NULL;
    }
    return api; /* the library stays loaded for the life of the process */
}

static void
load_once(void)
{
    const char *env = getenv("SAMPAN_CUDA_LIB");
    if (env != NULL) {
        if (env[0] == '\0') {
            snprintf(note, sizeof note, "GPU backend disabled (SAMPAN_CUDA_LIB is empty)");
            return;
        }
        cached = sp_loader_load(env, note, sizeof note);
        return;
    }
    /* Next to the executable (build/sampan and build/libsampan_cuda.so). */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            char path[PATH_MAX + 32];
            snprintf(path, sizeof path, "%.*s/%s", (int)(slash - exe), exe, SP_CUDA_LIB_NAME);
            if (access(path, R_OK) == 0) {
                cached = sp_loader_load(path, note, sizeof note);
                return;
            }
        }
    }
    char why[sizeof note];
    cached = sp_loader_load(SP_CUDA_LIB_NAME, why, sizeof why);
    if (cached == NULL) {
        if (strstr(why, "cannot load") != NULL && strstr(why, "No such file") != NULL) {
            snprintf(note, sizeof note, "%s not found next to sampan or on the library path "
                     "(build it with `make cuda`)", SP_CUDA_LIB_NAME);
        } else {
            snprintf(note, sizeof note, "%s", why);
        }
    }
}

const sp_cuda_api_t *
sp_loader_api(void)
{
    pthread_once(&once, load_once);
    return cached;
}

const char *
sp_loader_note(void)
{
    pthread_once(&once, load_once);
    return cached ? "" : note;
}

bool
sp_loader_device_healthy(int ordinal)
{
    if (ordinal < 0 || ordinal >= 64) {
        return true;
    }
    return (atomic_load(&unhealthy) & ((uint64_t)1 << ordinal)) == 0;
}

void
sp_loader_device_fail(int ordinal)
{
    if (ordinal >= 0 && ordinal < 64) {
        atomic_fetch_or(&unhealthy, (uint64_t)1 << ordinal);
    }
}
