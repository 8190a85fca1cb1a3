/*
 * fuzz_repo_config.c - libFuzzer target for a model's config.json and the
 * config override of a repository load request (src/serving/repo_config.c):
 * sp_repo_config_parse_text, sp_repo_config_merge, sp_repo_config_from_json.
 *
 * Input: the config text, optionally followed by "\n---\n" and an override
 * text. The config is parsed and validated alone; with an override, both are
 * parsed, merged (as POST /v2/repository/models/{m}/load does) and the result
 * validated again. The texts are copied into exact-size heap buffers so ASan
 * sees any read past their end.
 *
 * Checks: every failure has a message that starts with the file label; every
 * accepted config keeps its documented bounds (counts within the fixed
 * arrays, names NUL-terminated and within SP_REPO_NAME_MAX, specific versions
 * sorted and unique, every parameter findable by key); sp_repo_config_free
 * leaves nothing behind (LeakSanitizer).
 *
 * Seeds: tests/fuzz/corpus/repo_config (the configs of tests/unit/test_repo.c
 * and docs/repository.md, good and bad). Dictionary: tests/fuzz/repo_config.dict.
 *
 *   make fuzz
 *   ./build-fuzz/fuzz_repo_config -dict=tests/fuzz/repo_config.dict \
 *       tests/fuzz/corpus-work/repo_config tests/fuzz/corpus/repo_config
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serving/repo_config.h"
#include "core/json.h"

#define LABEL "models/m/config.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
need(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_repo_config: %s\n", what);
        abort();
    }
}

static void
check_err(sp_status_t st, const char *err)
{
    need(st != SP_OK, "status");
    need(strncmp(err, LABEL, strlen(LABEL)) == 0, "an error message does not name the file");
}

static void
check_name(const char *s)
{
    need(memchr(s, '\0', SP_REPO_NAME_MAX + 1) != NULL, "a name is not NUL-terminated in bounds");
}

static void
check_config(const sp_repo_config_t *c)
{
    check_name(c->name);
    need(c->n_inputs >= 0 && c->n_inputs <= SP_REPO_MAX_TENSORS, "n_inputs");
    need(c->n_outputs >= 0 && c->n_outputs <= SP_REPO_MAX_TENSORS, "n_outputs");
    for (int i = 0; i < c->n_inputs + c->n_outputs; i++) {
        const sp_repo_tensor_t *t = i < c->n_inputs ? &c->input[i] : &c->output[i - c->n_inputs];
        check_name(t->name);
        need(t->n_dims >= 0 && t->n_dims <= SP_REPO_MAX_DIMS, "n_dims");
        need(t->data_type >= 0 && t->data_type < SP_REPO_TYPE_COUNT_, "data_type");
        need(sp_repo_config_dtype_name(t->data_type) != NULL, "dtype name");
    }
    need(c->n_groups >= 0 && c->n_groups <= SP_REPO_MAX_GROUPS, "n_groups");
    for (int i = 0; i < c->n_groups; i++) {
        check_name(c->group[i].name);
        need(c->group[i].n_gpus >= 0 && c->group[i].n_gpus <= SP_REPO_MAX_GPUS, "n_gpus");
        need(c->group[i].count >= 1 && c->group[i].count <= SP_REPO_MAX_INSTANCES, "count");
    }
    const sp_repo_version_policy_t *vp = &c->version_policy;
    need(vp->n_versions >= 0 && vp->n_versions <= SP_REPO_MAX_SPECIFIC, "n_versions");
    for (int i = 1; i < vp->n_versions; i++) {
        need(vp->versions[i - 1] < vp->versions[i], "specific versions not sorted and unique");
    }
    need(c->dynamic_batching.n_preferred >= 0 &&
             c->dynamic_batching.n_preferred <= SP_REPO_MAX_PREFERRED,
         "n_preferred");
    need(c->n_params >= 0 && c->n_params <= SP_REPO_MAX_PARAMS, "n_params");
    for (int i = 0; i < c->n_params; i++) {
        check_name(c->param[i].key);
        need(c->param[i].value != NULL, "a parameter without a value");
        need(strlen(c->param[i].value) <= SP_REPO_PARAM_VALUE_MAX, "a parameter value too long");
        need(sp_repo_config_param(c, c->param[i].key) != NULL, "a parameter not found by key");
    }
    need(sp_repo_config_backend_name(c->backend) != NULL, "backend name");
}

static char *
copy(const uint8_t *p, size_t n)
{
    char *b = malloc(n ? n : 1);
    if (b && n) {
        memcpy(b, p, n);
    }
    return b;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_json_init();
    const uint8_t *sep = memmem(data, size, "\n---\n", 5);
    size_t base_len = sep ? (size_t)(sep - data) : size;
    char *base = copy(data, base_len);
    char *ov = sep ? copy(sep + 5, size - base_len - 5) : NULL;
    size_t ov_len = sep ? size - base_len - 5 : 0;
    char err[1024];
    json_t *j = NULL, *jo = NULL;
    sp_repo_config_t cfg;
    if (base == NULL || (sep && ov == NULL)) {
        goto done;
    }
    err[0] = '\0';
    sp_status_t st = sp_repo_config_parse_text(base, base_len, LABEL, &j, err, sizeof err);
    if (st != SP_OK) {
        check_err(st, err);
        need(j == NULL, "parse_text failed but returned a value");
        goto done;
    }
    err[0] = '\0';
    st = sp_repo_config_from_json(j, LABEL, &cfg, err, sizeof err);
    if (st == SP_OK) {
        check_config(&cfg);
    } else {
        check_err(st, err);
    }
    sp_repo_config_free(&cfg);
    if (!ov) {
        goto done;
    }
    err[0] = '\0';
    st = sp_repo_config_parse_text(ov, ov_len, LABEL " (config override)", &jo, err, sizeof err);
    if (st != SP_OK) {
        check_err(st, err);
        goto done;
    }
    err[0] = '\0';
    st = sp_repo_config_merge(j, jo, LABEL, err, sizeof err);
    if (st != SP_OK) {
        check_err(st, err);
        goto done;
    }
    err[0] = '\0';
    st = sp_repo_config_from_json(j, LABEL, &cfg, err, sizeof err);
    if (st == SP_OK) {
        check_config(&cfg);
    } else {
        check_err(st, err);
    }
    sp_repo_config_free(&cfg);
done:
    json_decref(jo);
    json_decref(j);
    free(base);
    free(ov);
    return 0;
}
