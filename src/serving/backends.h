/*
 * backends.h - finding backend plugins (include/sampan/backend.h).
 *
 * A model's config.json names its backend; `llm` is built in (the engine and
 * the scheduler), every other name is a shared library
 * `libsampan_<name>.so` looked up in, in order: --backends-dir, the
 * `backends/` directory next to the sampan binary, then
 * /usr/lib/sampan/backends. A library is opened once (RTLD_NOW|RTLD_LOCAL),
 * its sp_backend_init(SP_BACKEND_ABI_VERSION) must return a table whose
 * abi_version and name match, and it stays loaded until the process exits
 * (models may still be draining on it). Thread-safe.
 */
#ifndef SP_SERVING_BACKENDS_H
#define SP_SERVING_BACKENDS_H

#include <stddef.h>

#include "sampan/backend.h"
#include "sampan/status.h"

/* The backend called name; err says where it looked and why it failed. */
sp_status_t sp_backends_find(const char *name, const char *dir, const sp_backend_api_t **out,
                             char *err, size_t err_len);
/* The host callbacks the server gives every backend. */
const sp_backend_host_t *sp_backends_host(void);

#endif /* SP_SERVING_BACKENDS_H */
