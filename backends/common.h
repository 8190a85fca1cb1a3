/*
 * backends/common.h - what the bundled backends share: reading config.json's
 * Triton fields, error and log formatting.
 *
 * Not part of the interface: an out-of-tree backend needs only
 * include/sampan/backend.h. Each backend .so compiles common.c into itself
 * with hidden visibility, so two backends never clash on these names.
 */
#ifndef SP_BACKENDS_COMMON_H
#define SP_BACKENDS_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/backend.h"

/* The fields of config.json a backend reads. The server has already checked
 * the file (src/serving/repo_config.c), so this parse is lenient where the server is
 * strict and only reports what a backend could not work without. */
typedef struct sp__bk_config {
    int32_t max_batch_size;
    int32_t n_inputs, n_outputs;
    sp_backend_tensor_desc_t inputs[SP_BACKEND_MAX_TENSORS];
    sp_backend_tensor_desc_t outputs[SP_BACKEND_MAX_TENSORS];
    void *root; /* the parsed document (json_t *): parameters are looked up in it */
} sp__bk_config_t;

/* Parse config_json (NULL or "" = an empty config). 0 on success; else -1 and
 * a message naming the field in err. Free with sp__bk_config_free. */
int sp__bk_config_parse(const char *config_json, sp__bk_config_t *cfg, char *err, size_t err_len);
void sp__bk_config_free(sp__bk_config_t *cfg);

/* parameters.<key>.string_value, borrowed from cfg; NULL when absent. */
const char *sp__bk_config_param(const sp__bk_config_t *cfg, const char *key);

/* The first key of `parameters` that is neither one of `known` (NULL-terminated) nor starts
 * with one of `prefixes` (NULL-terminated; may be NULL): borrowed from cfg, NULL when every key
 * is known. A backend refuses such a key rather than ignore a setting the user believes in. */
const char *sp__bk_config_unknown_param(const sp__bk_config_t *cfg, const char *const *known,
                                        const char *const *prefixes);

/* "TYPE_FP32" for SP_BT_FP32 ("TYPE_STRING" for BYTES, as config.json spells it). */
const char *sp__bk_dtype_name(sp_btype_t t);

/* "[30]", "[-1, 4]", "[]": dims for messages. */
void sp__bk_dims_str(const int64_t *dims, int32_t n_dims, char *out, size_t out_len);

/* snprintf into err; returns -1 so `return sp__bk_errf(...)` reads as a failure. */
int sp__bk_errf(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One key=value line through host->log_fn (nothing when the host has none). */
void sp__bk_log(const sp_backend_host_t *host, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* SP_BACKENDS_COMMON_H */
