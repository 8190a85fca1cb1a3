/* tensor_model.c - backend plugin models behind the dynamic batcher (tensor_model.h). */
#include "serving/tensor_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/pool.h"
#include "core/timer.h"
#include "sampan/log.h"
#include "serving/backends.h"
#include "sched/batcher.h"
#include "serving/serving.h"

#define MIB (1024.0 * 1024.0)

/* ------------------------------------------------------------------ build */

static sp_btype_t
btype_of(sp_repo_dtype_t t)
{
    switch (t) {
    case SP_REPO_TYPE_BOOL: return SP_BT_BOOL;
    case SP_REPO_TYPE_UINT8: return SP_BT_UINT8;
    case SP_REPO_TYPE_UINT16: return SP_BT_UINT16;
    case SP_REPO_TYPE_UINT32: return SP_BT_UINT32;
    case SP_REPO_TYPE_UINT64: return SP_BT_UINT64;
    case SP_REPO_TYPE_INT8: return SP_BT_INT8;
    case SP_REPO_TYPE_INT16: return SP_BT_INT16;
    case SP_REPO_TYPE_INT32: return SP_BT_INT32;
    case SP_REPO_TYPE_INT64: return SP_BT_INT64;
    case SP_REPO_TYPE_FP16: return SP_BT_FP16;
    case SP_REPO_TYPE_FP32: return SP_BT_FP32;
    case SP_REPO_TYPE_FP64: return SP_BT_FP64;
    case SP_REPO_TYPE_STRING: return SP_BT_BYTES;
    case SP_REPO_TYPE_BF16: return SP_BT_BF16;
    default: return SP_BT_COUNT_;
    }
}

/* The config's declared tensors must be what the backend reports. */
static sp_status_t
check_decl(const char *what, const sp_repo_tensor_t *decl, int32_t n_decl,
           const sp_backend_tensor_desc_t *got, int32_t n_got, char *err, size_t err_len)
{
    if (n_decl == 0) {
        return SP_OK; /* the config leaves them to the backend */
    }
    if (n_decl != n_got) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "config.json: %s: declares %d tensors, the model has %d", what, (int)n_decl,
                       (int)n_got);
    }
    for (int32_t i = 0; i < n_decl; i++) {
        const sp_backend_tensor_desc_t *g = NULL;
        for (int32_t k = 0; k < n_got && !g; k++) {
            g = strcmp(got[k].name, decl[i].name) == 0 ? &got[k] : NULL;
        }
        if (g == NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "config.json: %s[%d].name: the model has no tensor \"%s\"", what, (int)i,
                           decl[i].name);
        }
        if (btype_of(decl[i].data_type) != g->dtype) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "config.json: %s[%d].data_type: %s, but the model's is %s", what, (int)i,
                           sp_repo_config_dtype_name(decl[i].data_type), sp_batcher_btype_name(g->dtype));
        }
        bool same = decl[i].n_dims == g->n_dims;
        for (int32_t d = 0; same && d < g->n_dims; d++) {
            same = decl[i].dims[d] == g->dims[d] || decl[i].dims[d] == -1 || g->dims[d] == -1;
        }
        if (!same) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "config.json: %s[%d].dims: do not match the model's (%d dims, first %lld)",
                           what, (int)i, (int)g->n_dims, (long long)(g->n_dims ? g->dims[0] : 0));
        }
    }
    return SP_OK;
}

static sp_batcher_params_t
batcher_params(const sp_repo_config_t *cfg)
{
    sp_batcher_params_t p = sp_batcher_default_params();
    p.max_batch_size = cfg->max_batch_size;
    p.enabled = cfg->dynamic_batching.enabled && cfg->max_batch_size > 0;
    p.max_queue_delay_us = (uint64_t)cfg->dynamic_batching.max_queue_delay_us;
    p.n_preferred = cfg->dynamic_batching.n_preferred;
    for (int32_t i = 0; i < p.n_preferred && i < SP_BATCHER_MAX_PREFERRED; i++) {
        p.preferred_batch_size[i] = cfg->dynamic_batching.preferred[i];
    }
    const sp_repo_batching_t *db = &cfg->dynamic_batching;
    p.priority_levels = (uint32_t)db->priority_levels;
    p.default_priority_level = (uint32_t)db->default_priority_level;
    p.default_queue_policy.timeout_action = db->default_queue_policy.delay_on_timeout
                                                ? SP_BATCHER_TIMEOUT_DELAY
                                                : SP_BATCHER_TIMEOUT_REJECT;
    p.default_queue_policy.default_timeout_us = (uint64_t)db->default_queue_policy.default_timeout_us;
    p.default_queue_policy.allow_timeout_override = db->default_queue_policy.allow_timeout_override;
    p.default_queue_policy.max_queue_size = (uint32_t)db->default_queue_policy.max_queue_size;
    for (int l = 0; l < db->priority_levels && l < SP_BATCHER_MAX_LEVELS; l++) {
        const sp_repo_queue_policy_t *q = &db->level_policy[l];
        p.has_level_policy[l] = db->has_level_policy[l];
        p.level_policy[l].timeout_action = q->delay_on_timeout ? SP_BATCHER_TIMEOUT_DELAY
                                                               : SP_BATCHER_TIMEOUT_REJECT;
        p.level_policy[l].default_timeout_us = (uint64_t)q->default_timeout_us;
        p.level_policy[l].allow_timeout_override = q->allow_timeout_override;
        p.level_policy[l].max_queue_size = (uint32_t)q->max_queue_size;
    }
    const char *t = sp_repo_config_param(cfg, "target_p99_ms");
    if (t && p.enabled) {
        p.adaptive = true;
        p.target_p99_ms = atof(t);
        p.external_latency = true; /* respond() reports what the client saw */
    }
    return p;
}

/* The load arguments of m's instances (dir: storage for the version directory). */
static sp_backend_load_args_t
load_args(const sp_served_model_t *m, const sp_repo_config_t *cfg, char *dir, size_t dir_len)
{
    int cores = sp_pool_cpu_count();
    sp_backend_load_args_t a = {
        .model_name = m->name,
        .version = m->version,
        .version_dir = m->path,
        .model_file = NULL,
        .config_json = cfg->json ? cfg->json : "{}",
        .max_batch_size = cfg->max_batch_size,
        .n_threads = cores > m->n_inst ? cores / m->n_inst : 1,
    };
    /* m->path is the model file, or the version directory for a backend that
     * reads its own files (repo.c). */
    snprintf(dir, dir_len, "%s", m->path);
    const char *slash = strrchr(m->path, '/');
    if (cfg->backend != SP_REPO_BACKEND_PLUGIN || sp_repo_config_param(cfg, "model_file")) {
        a.model_file = m->path;
        if (slash) {
            dir[slash - m->path] = '\0';
        }
    }
    a.version_dir = dir;
    return a;
}

/* The labels file of an output: one label per line (class i on line i),
 * "\r\n" or "\n". The name was checked to be a plain file name. */
static sp_status_t
load_labels(sp_tensor_io_t *io, int32_t k, const char *model_dir, const char *file, char *err,
            size_t err_len)
{
    char path[1400], label[400];
    snprintf(path, sizeof path, "%s/%s", model_dir, file);
    snprintf(label, sizeof label, "label_filename \"%s\"", file);
    char *text = NULL;
    size_t len = 0;
    sp_status_t st = sp_file_read(path, label, SP_TENSOR_LABELS_MAX_BYTES, &text, &len, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    int32_t n = 0;
    for (size_t i = 0; i < len; i++) {
        n += text[i] == '\n';
    }
    n += len > 0 && text[len - 1] != '\n';
    const char **lines = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *lines);
    if (lines == NULL) {
        sp_free(text);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory reading %s", label);
    }
    int32_t at = 0;
    char *p = text, *end = text + len;
    while (p < end && at < n) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        if (e > p && e[-1] == '\r') {
            e[-1] = '\0';
        }
        if (nl) {
            *nl = '\0';
        }
        lines[at++] = p;
        p = nl ? nl + 1 : end;
    }
    io->label_store[k] = text; /* sp_file_read leaves a NUL after the bytes */
    io->labels[k] = lines;
    io->n_labels[k] = at;
    return SP_OK;
}

static void
io_free(sp_tensor_io_t *io)
{
    if (io == NULL) {
        return;
    }
    for (int k = 0; k < SP_BACKEND_MAX_TENSORS; k++) {
        sp_free(io->label_store[k]);
        sp_free((void *)io->labels[k]);
    }
    sp_free(io);
}

/* Image inputs and labels from the config, matched to the backend's tensors
 * by name. dir: the version directory (the model directory is its parent). */
static sp_status_t
build_io(sp_served_model_t *m, const sp_repo_config_t *cfg, const char *dir, char *err,
         size_t err_len)
{
    bool any = false;
    for (int32_t i = 0; i < cfg->n_inputs; i++) {
        any |= cfg->input[i].has_image;
    }
    for (int32_t i = 0; i < cfg->n_outputs; i++) {
        any |= cfg->output[i].label_filename[0] != '\0';
    }
    if (!any) {
        return SP_OK;
    }
    sp_tensor_io_t *io = sp_calloc(1, sizeof *io);
    if (io == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    m->io = io;
    const sp_backend_model_info_t *info = &m->be_info;
    for (int32_t i = 0; i < cfg->n_inputs; i++) {
        if (!cfg->input[i].has_image) {
            continue;
        }
        if (cfg->max_batch_size < 1) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "config.json: input[%d].preprocess: image inputs need max_batch_size "
                           ">= 1 (one image per batch row)", (int)i);
        }
        for (int32_t k = 0; k < info->n_inputs; k++) {
            if (strcmp(info->inputs[k].name, cfg->input[i].name) == 0) {
                io->has_image[k] = true;
                io->image[k] = cfg->input[i].image;
                io->any_image = true;
            }
        }
    }
    char model_dir[1024];
    snprintf(model_dir, sizeof model_dir, "%s", dir);
    char *slash = strrchr(model_dir, '/');
    if (slash) {
        *slash = '\0';
    }
    for (int32_t i = 0; i < cfg->n_outputs; i++) {
        if (!cfg->output[i].label_filename[0]) {
            continue;
        }
        for (int32_t k = 0; k < info->n_outputs; k++) {
            if (strcmp(info->outputs[k].name, cfg->output[i].name) == 0) {
                sp_status_t st = load_labels(io, k, model_dir, cfg->output[i].label_filename, err,
                                             err_len);
                if (st != SP_OK) {
                    return st;
                }
            }
        }
    }
    return SP_OK;
}

/* Place the instances, find the backend and load one instance: its info
 * sizes the charge of all of them. */
static sp_status_t
tensor_probe(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
             size_t err_len)
{
    m->max_batch_size = cfg->max_batch_size;
    sp_status_t st = sp_registry_place(&s->reg, m, cfg, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    st = sp_backends_find(cfg->backend_name, s->cfg.backends_dir, &m->be, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    int gpu_dev = 0; /* the GPU the instances are on (the backend reads instance_group itself) */
    for (int k = 0; k < m->n_inst; k++) {
        if (m->inst_dev[k] != 0 && gpu_dev != 0 && m->inst_dev[k] != gpu_dev) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "instance_group: a tensor model's instances on several devices are not "
                           "supported; place them on one");
        }
        if (m->inst_dev[k] != 0) {
            gpu_dev = m->inst_dev[k];
        }
    }
    char dir[1024];
    sp_backend_load_args_t a = load_args(m, cfg, dir, sizeof dir);
    memset(&m->be_info, 0, sizeof m->be_info);
    if (m->be->load(sp_backends_host(), &a, &m->be_inst[0], &m->be_info, err, err_len) != 0) {
        m->be_inst[0] = NULL;
        return SP_ERR_INVALID;
    }
    if (gpu_dev != 0 && m->be_info.device_bytes == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "instance_group: backend %s runs on the CPU (KIND_CPU)", m->be->name);
    }
    if ((st = check_decl("input", cfg->input, cfg->n_inputs, m->be_info.inputs,
                         m->be_info.n_inputs, err, err_len)) != SP_OK ||
        (st = check_decl("output", cfg->output, cfg->n_outputs, m->be_info.outputs,
                         m->be_info.n_outputs, err, err_len)) != SP_OK ||
        (st = build_io(m, cfg, dir, err, err_len)) != SP_OK) {
        return st;
    }
    uint64_t per = m->be_info.memory_bytes + (64u << 10); /* + the batcher's queue and buffers */
    m->charge[0] = per * (uint64_t)m->n_inst;
    if (gpu_dev != 0) {
        m->charge[gpu_dev] = m->be_info.device_bytes * (uint64_t)m->n_inst;
    }
    return SP_OK;
}

/* The other instances, then the batcher in front of them all. */
static sp_status_t
tensor_start(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
             size_t err_len)
{
    (void)s;
    char dir[1024];
    sp_backend_load_args_t a = load_args(m, cfg, dir, sizeof dir);
    const sp_backend_host_t *host = sp_backends_host();
    for (int k = 1; k < m->n_inst; k++) {
        sp_backend_model_info_t info;
        if (m->be->load(host, &a, &m->be_inst[k], &info, err, err_len) != 0) {
            m->be_inst[k] = NULL;
            return SP_ERR_INVALID;
        }
    }
    sp_batcher_params_t bp = batcher_params(cfg);
    m->prio_levels = bp.priority_levels;
    m->prio_default = bp.default_priority_level;
    sp_status_t st = sp_batcher_create(&bp, m->be, m->be_inst, m->n_inst, &m->be_info, host,
                                       &m->batcher, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    SP_LOG_INFO("event=tensor_model_ready model=%s version=%lld backend=%s instances=%d "
                "max_batch_size=%d dynamic_batching=%s adaptive=%s memory_mib=%.2f",
                sp_log_str(m->name), (long long)m->version, m->be->name, m->n_inst,
                (int)cfg->max_batch_size, bp.enabled ? "on" : "off", bp.adaptive ? "on" : "off",
                (double)m->mem_bytes / MIB);
    return SP_OK;
}

/* Stop the batcher: queued requests end with an error. */
static void
tensor_stop(sp_served_model_t *m)
{
    if (m->batcher) {
        sp_batcher_stop(m->batcher, false);
    }
}

static void
tensor_free(sp_served_model_t *m)
{
    sp_batcher_destroy(m->batcher);
    m->batcher = NULL;
    io_free(m->io);
    m->io = NULL;
    for (int k = 0; k < m->n_inst; k++) {
        if (m->be && m->be_inst[k]) {
            m->be->unload(m->be_inst[k]);
            m->be_inst[k] = NULL;
        }
    }
}

/* The batcher's figures in the scheduler's shape (a step is a batch, a
 * sequence a row). */
static void
tensor_stats(const sp_served_model_t *m, sp_sched_stats_t *o)
{
    sp_batcher_stats_t b;
    sp_batcher_get_stats(m->batcher, &b);
    memset(o, 0, sizeof *o);
    o->queued = b.queued;
    o->waiting_tier[1] = b.queued;
    o->jobs_done = (int64_t)b.completed;
    o->jobs_cancelled = (int64_t)b.cancelled;
    o->steps = (int64_t)b.batches;
    o->step_seqs_total = (int64_t)b.rows;
    o->mean_step_seqs = b.batches ? (double)b.rows / (double)b.batches : 0;
    for (int i = 0; i < b.n_hist; i++) {
        int k = 0;
        while (k < SP_SCHED_BATCH_BUCKETS && ((int64_t)1 << k) < b.hist_le[i]) {
            k++;
        }
        o->batch_hist[k] += (int64_t)b.hist[i];
    }
}

const sp_model_kind_t sp_tensor_model_kind = {
    .name = "tensor",
    .probe = tensor_probe,
    .start = tensor_start,
    .stop = tensor_stop,
    .free = tensor_free,
    .stats = tensor_stats,
};
