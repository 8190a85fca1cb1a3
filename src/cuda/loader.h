/*
 * loader.h - the loader half of the CUDA code: finds libsampan_cuda.so at run
 * time, checks its op table (cuda_api.h), and keeps which devices have failed.
 * It knows nothing of the engine: engine/gpu.c binds models through the table
 * it returns, and the serving floors ask it whether a device is healthy.
 *
 * Threads: every function may be called from any thread; the library is
 * loaded once (pthread_once) and the health bits are atomic. Memory: the
 * loaded library stays mapped for the life of the process.
 */
#ifndef SP_CUDA_LOADER_H
#define SP_CUDA_LOADER_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda/cuda_api.h"

/* The CUDA op table, loaded once: $SAMPAN_CUDA_LIB when set ("" = no GPU
 * backend), else libsampan_cuda.so next to the executable, else the dynamic
 * linker's search. NULL when unavailable, with the reason in
 * sp_loader_note() ("libsampan_cuda.so not found (build it with `make
 * cuda`)", "no CUDA device: ...", "ABI version 2, sampan wants 1"). */
const sp_cuda_api_t *sp_loader_api(void);
const char *sp_loader_note(void); /* "" when loaded */
/* Load a given library without caching (tests): NULL and why on failure. */
const sp_cuda_api_t *sp_loader_load(const char *path, char *why, size_t why_len);

/* Whether no CUDA error was seen on device ordinal since start. */
bool sp_loader_device_healthy(int ordinal);
/* Mark ordinal unhealthy (a failed step, a failed load). */
void sp_loader_device_fail(int ordinal);

#endif /* SP_CUDA_LOADER_H */
