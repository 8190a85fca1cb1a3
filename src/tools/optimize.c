/*
 * optimize.c - `sampan optimize MODEL.onnx ...`: FP16 and calibrated INT8 copies of an ONNX
 * model, with their accuracy and speed on a held-out set. The work is in the ONNX backend
 * plugin (backends/onnx/optimize.c): this binary does not link the ONNX protobuf tables or the
 * graph runtime, so it finds libsampan_onnx.so where serving looks for backends (--backends-dir,
 * <exe dir>/backends, /usr/lib/sampan/backends), loads it and hands it the arguments.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tools/tools.h"

typedef int (*optimize_fn)(int argc, char **argv);

int
sp_cmd_optimize(int argc, char **argv)
{
    const char *bdir = NULL;
    char *args[256];
    int n = 0;
    for (int i = 0; i < argc && n < 255; i++) {
        if (strcmp(argv[i], "--backends-dir") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sampan optimize: --backends-dir needs a folder\n");
                return 2;
            }
            bdir = argv[++i];
            continue;
        }
        args[n++] = argv[i];
    }
    args[n] = NULL;
    char exe[PATH_MAX], dirs[3][1100];
    int nd = 0;
    if (bdir) snprintf(dirs[nd++], sizeof dirs[0], "%.1000s", bdir);
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = 0;
        char *s = strrchr(exe, '/');
        if (s) *s = 0;
        snprintf(dirs[nd++], sizeof dirs[0], "%.1000s/backends", exe);
    }
    snprintf(dirs[nd++], sizeof dirs[0], "/usr/lib/sampan/backends");
    for (int i = 0; i < nd; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%.1100s/libsampan_onnx.so", dirs[i]);
        if (access(path, R_OK) != 0) continue;
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            const char *e = dlerror();
            fprintf(stderr, "sampan optimize: %s: %s\n", path, e ? e : "cannot load");
            return 1;
        }
        optimize_fn fn;
        *(void **)&fn = dlsym(lib, "sp_onnx_optimize_main");
        if (fn == NULL) {
            fprintf(stderr, "sampan optimize: %s has no sp_onnx_optimize_main (an older plugin?)\n", path);
            dlclose(lib);
            return 1;
        }
        int rc = fn(n, args);
        fflush(stdout);
        dlclose(lib);
        return rc;
    }
    fprintf(stderr, "sampan optimize: libsampan_onnx.so not found in %s%s%s%s%s (build it with make, or "
            "give --backends-dir)\n", dirs[0], nd > 1 ? ", " : "", nd > 1 ? dirs[1] : "", nd > 2 ? ", " : "",
            nd > 2 ? dirs[2] : "");
    return 1;
}
