/*
 * nvml_abi.h - the part of NVML's C API that device.c calls through dlopen,
 * declared by hand (device.c and tests/unit/test_device.c include it).
 *
 * The few NVML types used: an opaque handle, 0 = success, NOT_FOUND for an
 * empty MIG slot, and two plain structs whose layout is NVML's stable ABI.
 *
 * They are declared by hand because nvml.h is not to be had where Sampan is
 * built and tested: the CUDA toolkit's packages that carry it are outside
 * Debian main, and the library is dlopen'ed anyway (no link-time
 * dependency). Where nvml.h is on the include path (a machine with NVIDIA's
 * toolkit or driver development files), the checks below compare these
 * declarations with NVIDIA's at compile time: a mismatch fails the build.
 * tests/unit/test_device.c compares them with Debian's Rust bindings of
 * nvml.h (librust-nvml-wrapper-sys-dev) where that package is installed.
 */
#ifndef SP_DEVICE_NVML_ABI_H
#define SP_DEVICE_NVML_ABI_H

typedef struct sp_nvml_device *sp_nvml_dev_t;
#define SP_NVML_SUCCESS 0
#define SP_NVML_ERROR_NOT_FOUND 6
#define SP_NVML_MIG_ENABLE 1
#define SP_NVML_NAME_LEN 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define SP_NVML_UUID_LEN 96 /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */

typedef struct {
    unsigned long long total, free, used;
} sp_nvml_memory_t;

typedef struct {
    unsigned int gpu, memory;
} sp_nvml_util_t;

#if defined(__has_include)
#if __has_include(<nvml.h>)
#include <nvml.h>
#include <stddef.h>
#define SP_SAME_FIELD(a, b, f) (offsetof(a, f) == offsetof(b, f) && sizeof(((a *)0)->f) == sizeof(((b *)0)->f))
_Static_assert(sizeof(sp_nvml_memory_t) == sizeof(nvmlMemory_t) &&
                   SP_SAME_FIELD(sp_nvml_memory_t, nvmlMemory_t, total) &&
                   SP_SAME_FIELD(sp_nvml_memory_t, nvmlMemory_t, free) &&
                   SP_SAME_FIELD(sp_nvml_memory_t, nvmlMemory_t, used),
               "sp_nvml_memory_t differs from nvmlMemory_t");
_Static_assert(sizeof(sp_nvml_util_t) == sizeof(nvmlUtilization_t) &&
                   SP_SAME_FIELD(sp_nvml_util_t, nvmlUtilization_t, gpu) &&
                   SP_SAME_FIELD(sp_nvml_util_t, nvmlUtilization_t, memory),
               "sp_nvml_util_t differs from nvmlUtilization_t");
_Static_assert(SP_NVML_SUCCESS == NVML_SUCCESS && SP_NVML_ERROR_NOT_FOUND == NVML_ERROR_NOT_FOUND &&
                   SP_NVML_MIG_ENABLE == NVML_DEVICE_MIG_ENABLE &&
                   SP_NVML_NAME_LEN == NVML_DEVICE_NAME_V2_BUFFER_SIZE &&
                   SP_NVML_UUID_LEN == NVML_DEVICE_UUID_V2_BUFFER_SIZE,
               "an NVML constant differs from nvml.h");
/* The return type is an enum of non-negative values (returned as an int) and
 * the handle a pointer: the function pointers in sp_nvml_t match when
 * NVIDIA's prototypes have exactly these forms. */
_Static_assert(sizeof(nvmlReturn_t) == sizeof(int) && sizeof(nvmlDevice_t) == sizeof(sp_nvml_dev_t),
               "nvmlReturn_t or nvmlDevice_t has another size");
#define SP_NVML_PROTO(fn, type) _Static_assert(_Generic(&fn, type: 1, default: 0), #fn " changed")
SP_NVML_PROTO(nvmlInit_v2, nvmlReturn_t (*)(void));
SP_NVML_PROTO(nvmlShutdown, nvmlReturn_t (*)(void));
SP_NVML_PROTO(nvmlErrorString, const char *(*)(nvmlReturn_t));
SP_NVML_PROTO(nvmlDeviceGetCount_v2, nvmlReturn_t (*)(unsigned int *));
SP_NVML_PROTO(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t (*)(unsigned int, nvmlDevice_t *));
SP_NVML_PROTO(nvmlDeviceGetName, nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned int));
SP_NVML_PROTO(nvmlDeviceGetUUID, nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned int));
SP_NVML_PROTO(nvmlDeviceGetMemoryInfo, nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *));
SP_NVML_PROTO(nvmlDeviceGetUtilizationRates, nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t *));
SP_NVML_PROTO(nvmlDeviceGetMigMode, nvmlReturn_t (*)(nvmlDevice_t, unsigned int *, unsigned int *));
SP_NVML_PROTO(nvmlDeviceGetMaxMigDeviceCount, nvmlReturn_t (*)(nvmlDevice_t, unsigned int *));
SP_NVML_PROTO(nvmlDeviceGetMigDeviceHandleByIndex,
              nvmlReturn_t (*)(nvmlDevice_t, unsigned int, nvmlDevice_t *));
#undef SP_NVML_PROTO
#undef SP_SAME_FIELD
#endif
#endif

#endif /* SP_DEVICE_NVML_ABI_H */
