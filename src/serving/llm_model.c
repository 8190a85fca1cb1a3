/*
 * llm_model.c - the LLM kind of served model (llm_model.h): a GGUF model on
 * the engine, its tokenizer and chat template, an optional draft model for
 * speculative decoding, and one scheduler per instance sharing the weights.
 *
 * probe maps the weights (and the draft's), compiles the chat template,
 * places the instances (CPU, or one GPU with the layers that fit its budget)
 * and estimates every device's charge: the weights once per device plus each
 * instance's KV pool and scratch. start creates the schedulers once the
 * registry reserved that charge.
 *
 * Threads: probe, start and free on the manager thread; stop at shutdown;
 * stats on any thread holding a reference. Memory: the scheduler parameters
 * kept between probe and start live in m->kind_data (freed by free).
 */
#include "serving/llm_model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/pool.h"
#include "engine/gpu.h"
#include "sampan/log.h"
#include "serving/adapters.h"
#include "serving/serving.h"

#define MIB (1024.0 * 1024.0)

/* A template file (--chat-template-file, or parameters.chat_template_file as
 * `what`): the file's text compiled, or an error naming the file. */
static sp_status_t
template_from_file(const char *what, const char *path, sp_served_model_t *m, char *err,
                   size_t err_len)
{
    char *src = NULL, msg[512];
    size_t len = 0;
    /* sp_file_read's messages name the file; the compiler's do not */
    sp_status_t st = sp_file_read(path, path, SP_CHAT_MAX_TEMPLATE_BYTES, &src, &len, msg,
                                  sizeof msg);
    bool read = st == SP_OK;
    if (read) {
        st = sp_chat_template_compile(src, len, &m->tmpl, msg, sizeof msg);
    }
    sp_free(src);
    if (st != SP_OK) {
        return sp_errf(err, err_len, st == SP_ERR_NOMEM ? SP_ERR_NOMEM : SP_ERR_INVALID,
                       "%s %s%s%s", what, read ? path : "", read ? ": " : "", msg);
    }
    return SP_OK;
}

/* The config's chat_template (a built-in's name or Jinja text) or its
 * chat_template_file; else the server's --chat-template-file, else its
 * --chat-template, else the file's own. */
static sp_status_t
load_template(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
              size_t err_len)
{
    const char *ct = cfg ? cfg->llm.chat_template : NULL;
    sp_status_t st;
    if (ct) {
        st = sp_chat_template_builtin(ct, &m->tmpl, m->tmpl_error, sizeof m->tmpl_error);
        if (st == SP_ERR_NOT_FOUND) {
            st = sp_chat_template_compile(ct, strlen(ct), &m->tmpl, m->tmpl_error,
                                          sizeof m->tmpl_error);
        }
        if (st != SP_OK) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "parameters.chat_template: %s",
                           m->tmpl_error);
        }
        return SP_OK;
    }
    char tpath[PATH_MAX];
    st = sp_repo_config_llm_template_path(cfg, s->cfg.model_repository, m->name, tpath,
                                          sizeof tpath, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    if (tpath[0]) {
        return template_from_file("parameters.chat_template_file", tpath, m, err, err_len);
    }
    if (s->cfg.chat_template_file[0]) {
        return template_from_file("--chat-template-file", s->cfg.chat_template_file, m, err,
                                  err_len);
    }
    const char *tname = s->cfg.chat_template[0] ? s->cfg.chat_template : NULL;
    if (sp_chat_template_from_gguf(sp_model_gguf(m->model), tname, &m->tmpl, m->tmpl_error,
                                   sizeof m->tmpl_error) != SP_OK) {
        if (tname) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "%s", m->tmpl_error);
        }
        SP_LOG_WARN("event=chat_template_unusable model=%s error=%s", sp_log_str(m->name),
                    sp_log_str(m->tmpl_error));
        m->tmpl = NULL;
    }
    return SP_OK;
}

/*
 * KIND_GPU placement (docs/cuda.md): bind the model's weights to the one GPU
 * its instances are on and charge that device. The first gpu_layers layers
 * (parameters.gpu_layers; absent or -1: as many as fit the device's free
 * budget, all when the model fits) run on the GPU, the rest on the CPU. The
 * charge of the GPU is its bytes in use after the upload plus, per instance,
 * the GPU layers' share of the KV pool and the scratch estimate; the CPU
 * keeps the mapping and the CPU layers' share. *gd is the GPU's list index,
 * -1 for a CPU-only model (nothing done then).
 */
static sp_status_t
gpu_place(sp_registry_t *r, sp_served_model_t *m, const sp_repo_config_t *cfg,
          const sp_sched_mem_t *mem, uint64_t weights, int *gd, char *err, size_t err_len)
{
    *gd = -1;
    bool cpu = false;
    for (int k = 0; k < m->n_inst; k++) {
        const int d = m->inst_dev[k];
        if (d == 0) {
            cpu = true;
        } else if (*gd < 0) {
            *gd = d;
        } else if (d != *gd) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                           "instance_group: an LLM's instances on several GPUs are not supported "
                           "yet; list one GPU");
        }
    }
    if (*gd < 0) {
        return SP_OK;
    }
    if (cpu) {
        return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                       "instance_group: an LLM on both KIND_CPU and KIND_GPU is not supported "
                       "yet (use gpu_layers for a CPU/GPU split)");
    }
    const sp_device_info_t *di = sp_devices_get(r->devs, *gd);
    if (di->ordinal < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "instance_group: %s has no CUDA ordinal",
                       di->id);
    }
    const sp_hparams_t *hp = sp_model_hparams(m->model);
    int64_t n_gpu = -1;
    const char *gl = cfg ? sp_repo_config_param(cfg, "gpu_layers") : NULL;
    if (gl != NULL) {
        char *end;
        long long v = strtoll(gl, &end, 10);
        if (end == gl || *end != '\0' || v < -1 || v > hp->n_layer) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "parameters.gpu_layers: '%s' is not -1 (auto) or 0..%lld", gl,
                           (long long)hp->n_layer);
        }
        n_gpu = v;
    }
    const uint64_t per_layer = (uint64_t)m->n_inst * mem->kv_bytes / (uint64_t)hp->n_layer;
    if (n_gpu < 0) {
        const uint64_t avail = sp_registry_available(r, *gd);
        /* Fixed costs: the scratch estimate per instance, cuBLAS's workspace
         * and the 64 MiB upload stage. */
        const uint64_t fixed = (uint64_t)m->n_inst * mem->scratch_bytes + ((uint64_t)96 << 20);
        n_gpu = sp_gpu_fit_layers(m->model, avail, fixed, per_layer);
        if (n_gpu == 0) {
            return sp_errf(err, err_len, SP_ERR_TOO_LARGE,
                           "model '%s': not one layer fits the %.1f MiB free in the budget of %s",
                           m->name, (double)avail / MIB, di->id);
        }
    }
    sp_status_t st = sp_gpu_attach(m->model, NULL, di->ordinal, n_gpu, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    const int64_t on_gpu = sp_gpu_model_layers(m->model);
    m->charge[*gd] = sp_gpu_model_device_bytes(m->model) + per_layer * (uint64_t)on_gpu +
                     (uint64_t)m->n_inst * mem->scratch_bytes;
    m->charge[0] = weights + per_layer * (uint64_t)(hp->n_layer - on_gpu) +
                   (uint64_t)m->n_inst * mem->scratch_bytes;
    SP_LOG_INFO("event=gpu_placement model=%s device=%s ordinal=%d gpu_layers=%lld/%lld "
                "gpu_mib=%.1f", sp_log_str(m->name), sp_log_str(di->id), di->ordinal,
                (long long)on_gpu, (long long)hp->n_layer, (double)m->charge[*gd] / MIB);
    return SP_OK;
}

static sp_sched_params_t
sched_params(const sp_serving_t *s, const sp_repo_config_t *cfg, int n_cpu_inst)
{
    sp_sched_params_t sp = sp_sched_default_params();
    sp.n_slots = s->cfg.parallel;
    sp.n_ctx = s->cfg.ctx_size;
    sp.n_threads = s->cfg.threads;
    sp.max_queue = s->cfg.queue;
    sp.prefill_chunk = s->cfg.step_tokens;
    sp.kv_blocks = s->cfg.kv_blocks;
    sp.kv_swa_full = s->cfg.kv_swa_full;
    /* Checked by config.c; "" only where a config skipped it (the --kv-f16 alias then). */
    const int kv_type = sp_kv_type_from_name(s->cfg.kv_type);
    sp.kv_type = kv_type >= 0 ? (sp_kv_type_t)kv_type
                              : s->cfg.kv_f16 ? SP_KV_TYPE_F16 : SP_KV_TYPE_F32;
    sp.tpot_target_ms = s->cfg.tpot_target_ms;
    sp.tier_queue[0] = s->cfg.queue_batch;
    sp.tier_queue[1] = s->cfg.queue_standard;
    sp.tier_queue[2] = s->cfg.queue_premium;
    sp.spec_k = s->cfg.spec_tokens > 0 ? s->cfg.spec_tokens : 4;
    if (cfg) {
        if (cfg->llm.context_length > 0) sp.n_ctx = cfg->llm.context_length;
        if (cfg->llm.kv_blocks > 0) sp.kv_blocks = cfg->llm.kv_blocks;
        if (cfg->llm.kv_cache_type && sp_kv_type_from_name(cfg->llm.kv_cache_type) >= 0) {
            sp.kv_type = (sp_kv_type_t)sp_kv_type_from_name(cfg->llm.kv_cache_type);
        }
        if (cfg->max_batch_size > 0) sp.n_slots = cfg->max_batch_size;
    }
    /* Instances on the CPU share its cores rather than each taking all. */
    if (sp.n_threads == 0 && n_cpu_inst > 1) {
        int cores = sp_pool_cpu_count();
        sp.n_threads = cores > n_cpu_inst ? cores / n_cpu_inst : 1;
    }
    return sp;
}

/* Speculative decoding: load the draft model the configuration names (a
 * repository model by name, its latest selected version; or --draft-model for
 * --model) into m->draft and give its file size in *bytes. OK with no draft. */
static sp_status_t
load_draft(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, uint64_t *bytes,
           char *err, size_t err_len)
{
    *bytes = 0;
    char path[1024];
    if (cfg == NULL) {
        if (s->cfg.draft_model[0] == '\0') {
            return SP_OK;
        }
        snprintf(path, sizeof path, "%s", s->cfg.draft_model);
    } else {
        if (cfg->llm.draft_model == NULL) {
            return SP_OK;
        }
        if (strcmp(cfg->llm.draft_model, m->name) == 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "parameters.draft_model: a model cannot draft for itself");
        }
        sp_repo_limits_t lim;
        sp_repo_limits_default(&lim);
        sp_repo_model_t dm;
        char e[512];
        sp_status_t st = sp_repo_scan_model(s->cfg.model_repository, cfg->llm.draft_model,
                                            strlen(cfg->llm.draft_model), &lim, NULL, 0, &dm, e,
                                            sizeof e);
        if (st != SP_OK || !dm.ok || dm.n_versions == 0 ||
            dm.versions[dm.n_versions - 1].model_path == NULL) {
            /* The scan's own words name the repository's path: not for clients. */
            const char *why = st == SP_ERR_NOT_FOUND ? "no such model in the repository"
                              : st != SP_OK ? "cannot be read" : !dm.ok ? dm.reason
                              : dm.n_versions == 0 ? "no version selected"
                                                   : dm.versions[dm.n_versions - 1].reason;
            if (st == SP_OK) {
                sp_repo_model_free(&dm);
            }
            return sp_errf(err, err_len, SP_ERR_INVALID, "parameters.draft_model '%s': %s",
                           cfg->llm.draft_model, why);
        }
        snprintf(path, sizeof path, "%s", dm.versions[dm.n_versions - 1].model_path);
        sp_repo_model_free(&dm);
    }
    char e[512];
    if (sp_model_load(path, &m->draft, e, sizeof e) != SP_OK) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "draft model: %s", e);
    }
    struct stat fst;
    *bytes = stat(path, &fst) == 0 ? (uint64_t)fst.st_size : 0;
    return SP_OK;
}


static sp_status_t
llm_probe(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
          size_t err_len)
{
    sp_registry_t *r = &s->reg;
    sp_enc_key_src_t keys; /* cfg NULL (--model): SAMPAN_MODEL_KEY; else config.json's */
    sp_status_t st = sp_repo_config_llm_keys_ex(cfg, s->cfg.model_repository, m->name,
                                                s->cfg.key_dir, &keys, err, err_len);
    /* The file as it is before it is read: a change from here on (also to an
     * encrypted file, whose plaintext handle knows no file) reloads it. */
    m->has_file_id = stat(m->path, &m->file_id) == 0;
    sp_model_set_repack(!s->cfg.no_repack); /* this model's and its draft's loads */
    if (st == SP_OK) st = sp_model_load_ex(m->path, &keys, &m->model, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    m->tok = sp_model_tokenizer(m->model);
    if ((st = load_template(s, m, cfg, err, err_len)) != SP_OK ||
        (st = sp_registry_place(r, m, cfg, err, err_len)) != SP_OK) {
        return st;
    }
    int n_cpu = 0;
    for (int k = 0; k < m->n_inst; k++) {
        n_cpu += m->inst_dev[k] == 0;
    }
    sp_sched_params_t *sp = sp_calloc(1, sizeof *sp);
    if (sp == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    m->kind_data = sp;
    *sp = sched_params(s, cfg, n_cpu);
    uint64_t draft_bytes = 0;
    if ((st = load_draft(s, m, cfg, &draft_bytes, err, err_len)) != SP_OK) {
        return st;
    }
    sp->draft = m->draft;
    if (cfg && cfg->llm.num_speculative_tokens > 0) {
        sp->spec_k = cfg->llm.num_speculative_tokens;
    }
    /* The estimate: every instance's KV pool and scratch, plus the weights
     * once per device (one mmap shared by the CPU instances); a draft's weights
     * count with the model's. */
    sp_sched_mem_t mem;
    if ((st = sp_sched_estimate(m->model, sp, &mem, err, err_len)) != SP_OK) {
        return st;
    }
    struct stat fst;
    /* the packed copies are extra, less the file's pages of them the load gave back */
    uint64_t weights = (stat(m->path, &fst) == 0 ? (uint64_t)fst.st_size : 0) + draft_bytes +
                       sp_model_repack_bytes(m->model) -
                       sp_model_repack_released_bytes(m->model);
    int gd;
    if ((st = gpu_place(r, m, cfg, &mem, weights, &gd, err, err_len)) != SP_OK) {
        return st;
    }
    for (int k = 0; gd < 0 && k < m->n_inst; k++) {
        int d = m->inst_dev[k];
        if (m->charge[d] == 0) {
            m->charge[d] += weights;
        }
        m->charge[d] += mem.kv_bytes + mem.scratch_bytes;
    }
    return SP_OK;
}

static sp_status_t
llm_start(sp_serving_t *s, sp_served_model_t *m, const sp_repo_config_t *cfg, char *err,
          size_t err_len)
{
    (void)s;
    (void)cfg;
    const sp_sched_params_t *sp = m->kind_data;
    for (int k = 0; k < m->n_inst; k++) {
        sp_status_t st = sp_sched_create(m->model, sp, &m->inst[k], err, err_len);
        if (st != SP_OK) {
            return st;
        }
    }
    m->n_ctx = sp_sched_n_ctx(m->inst[0]);
    m->n_slots = sp->n_slots;
    return SP_OK;
}

static void
llm_stop(sp_served_model_t *m)
{
    for (int k = 0; k < m->n_inst; k++) {
        sp_sched_stop(m->inst[k]);
    }
}

static void
llm_free(sp_served_model_t *m)
{
    for (int k = 0; k < m->n_inst; k++) {
        sp_sched_destroy(m->inst[k]);
    }
    sp_adapters_free(m->adapters); /* requests still using one hold their own references */
    m->adapters = NULL;
    sp_chat_template_destroy(m->tmpl);
    m->tmpl = NULL;
    sp_model_free(m->model);
    sp_model_free(m->draft);
    m->model = m->draft = NULL;
    sp_free(m->kind_data);
    m->kind_data = NULL;
}

/* The union of two sets of adapter ids (bounded as sp_sched_stats_t's). */
static void
ids_merge(uint64_t *ids, int *n, const uint64_t *add, int n_add)
{
    for (int i = 0; i < n_add; i++) {
        bool have = false;
        for (int j = 0; j < *n && !have; j++) {
            have = ids[j] == add[i];
        }
        if (!have && *n < SP_SCHED_STATS_LORAS) {
            ids[(*n)++] = add[i];
        }
    }
}

/* The instances' figures summed (steps and step timings: the busiest one's). */
static void
llm_stats(const sp_served_model_t *m, sp_sched_stats_t *o)
{
    sp_sched_get_stats(m->inst[0], o);
    for (int k = 1; k < m->n_inst; k++) {
        sp_sched_stats_t t;
        sp_sched_get_stats(m->inst[k], &t);
        o->active += t.active;
        o->queued += t.queued;
        for (int i = 0; i < 3; i++) {
            o->running_tier[i] += t.running_tier[i];
            o->waiting_tier[i] += t.waiting_tier[i];
        }
        o->jobs_done += t.jobs_done;
        o->jobs_cancelled += t.jobs_cancelled;
        o->tokens_generated += t.tokens_generated;
        o->prompt_tokens += t.prompt_tokens;
        o->prompt_tokens_cached += t.prompt_tokens_cached;
        o->preemptions += t.preemptions;
        o->prefix_lookups += t.prefix_lookups;
        o->prefix_hits += t.prefix_hits;
        o->kv_blocks_total += t.kv_blocks_total;
        o->kv_blocks_used += t.kv_blocks_used;
        o->kv_blocks_cached += t.kv_blocks_cached;
        o->kv_blocks_free += t.kv_blocks_free;
        o->kv_swa_blocks_total += t.kv_swa_blocks_total;
        o->kv_swa_blocks_used += t.kv_swa_blocks_used;
        o->kv_swa_blocks_cached += t.kv_swa_blocks_cached;
        o->prefix_swa_cut_blocks += t.prefix_swa_cut_blocks;
        o->kv_evictions += t.kv_evictions;
        o->budget_decreases += t.budget_decreases;
        o->step_seqs_total += t.step_seqs_total;
        for (int i = 0; i <= SP_SCHED_BATCH_BUCKETS; i++) {
            o->batch_hist[i] += t.batch_hist[i];
        }
        o->budget_increases += t.budget_increases;
        if (t.steps > o->steps) {
            o->steps = t.steps;
            o->last_step_seqs = t.last_step_seqs;
            o->last_step_rows = t.last_step_rows;
            o->mean_step_seqs = t.mean_step_seqs;
            o->mean_step_rows = t.mean_step_rows;
            o->step_budget = t.step_budget;
        }
        if (t.step_p99_ms > o->step_p99_ms) {
            o->step_p99_ms = t.step_p99_ms;
        }
        ids_merge(o->lora_running, &o->n_lora_running, t.lora_running, t.n_lora_running);
        ids_merge(o->lora_waiting, &o->n_lora_waiting, t.lora_waiting, t.n_lora_waiting);
    }
}


const sp_model_kind_t sp_llm_model_kind = {
    .name = "llm",
    .probe = llm_probe,
    .start = llm_start,
    .stop = llm_stop,
    .free = llm_free,
    .stats = llm_stats,
};
