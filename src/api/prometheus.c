/*
 * prometheus.c - GET /metrics: the Prometheus text exposition of the served
 * models' counters and histograms (serving/metrics.h), the schedulers' and
 * batchers' figures, the devices and their budgets, the response cache,
 * tenants, the HTTP transport's counters, tracing and the process (names in
 * docs/metrics.md; with --metrics-compat vllm, vLLM's names too, with
 * --metrics-compat triton Triton's nv_inference_* names).
 *
 * Threads: the route runs on a loop thread. It takes a snapshot of the READY
 * models (each with a reference) and reads every counter as it is at that
 * moment (relaxed atomics); the registry lock is held only while the entries
 * and the device figures are read. Memory: the answer is built in one
 * growing buffer, freed when it is sent.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "api/trace.h"
#include "core/alloc.h"
#include "cuda/loader.h"
#include "sampan/version.h"
#include "sched/batcher.h"
#include "serving/adapters.h"
#include "serving/metrics.h"
#include "serving/registry.h"
#include "serving/serving.h"


static void
family(sp_jbuf_t *b, const char *name, const char *type, const char *help)
{
    sp_jbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value, escaped as the text format wants (\\, \", \n). */
static void
label_value(sp_jbuf_t *b, const char *v)
{
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"') {
            char e[2] = {'\\', *p};
            sp_jbuf_raw(b, e, 2);
        } else if (*p == '\n') {
            sp_jbuf_raw(b, "\\n", 2);
        } else {
            sp_jbuf_raw(b, p, 1);
        }
    }
}

static void
model_labels(sp_jbuf_t *b, const char *key, const char *name, const char *version)
{
    sp_jbuf_printf(b, "%s=\"", key);
    label_value(b, name);
    sp_jbuf_lit(b, "\"");
    if (version) {
        sp_jbuf_printf(b, ",version=\"%s\"", version);
    }
}

static void
fmt_value(sp_jbuf_t *b, double v)
{
    if (isinf(v)) {
        sp_jbuf_lit(b, v > 0 ? "+Inf" : "-Inf");
    } else if (isnan(v)) {
        sp_jbuf_lit(b, "NaN");
    } else if (v == (double)(int64_t)v && fabs(v) < 9e15) {
        sp_jbuf_printf(b, "%lld", (long long)v);
    } else {
        sp_jbuf_printf(b, "%.9g", v);
    }
}

/* name{model="..",version=".."[,extra]} value */
static void
sample(sp_jbuf_t *b, const char *name, const char *key, const char *model, const char *version,
       const char *extra, double v)
{
    sp_jbuf_printf(b, "%s{", name);
    model_labels(b, key, model, version);
    if (extra) {
        sp_jbuf_printf(b, ",%s", extra);
    }
    sp_jbuf_lit(b, "} ");
    fmt_value(b, v);
    sp_jbuf_lit(b, "\n");
}

/* Histogram samples from per-bucket counts (summed over n sources). */
static void
hist_samples(sp_jbuf_t *b, const char *name, const char *key, const char *model,
             const char *version, const sp_hist_t *const *hs, int n)
{
    const sp_hist_t *h0 = hs[0];
    uint64_t cum = 0;
    double sum = 0;
    for (int k = 0; k < n; k++) {
        sum += sp_hist_sum(hs[k]);
    }
    for (int i = 0; i <= h0->n; i++) {
        for (int k = 0; k < n; k++) {
            cum += atomic_load_explicit(&((sp_hist_t *)hs[k])->counts[i], memory_order_relaxed);
        }
        sp_jbuf_printf(b, "%s_bucket{", name);
        model_labels(b, key, model, version);
        if (i < h0->n) {
            sp_jbuf_lit(b, ",le=\"");
            fmt_value(b, h0->le[i]);
            sp_jbuf_lit(b, "\"} ");
        } else {
            sp_jbuf_lit(b, ",le=\"+Inf\"} ");
        }
        sp_jbuf_printf(b, "%llu\n", (unsigned long long)cum);
    }
    sp_jbuf_printf(b, "%s_sum{", name);
    model_labels(b, key, model, version);
    sp_jbuf_lit(b, "} ");
    fmt_value(b, sum);
    sp_jbuf_printf(b, "\n%s_count{", name);
    model_labels(b, key, model, version);
    sp_jbuf_printf(b, "} %llu\n", (unsigned long long)cum);
}

/* The batch-size histogram from the scheduler's per-bucket step counts. */
static void
batch_samples(sp_jbuf_t *b, const char *model, const char *version, const sp_sched_stats_t *st)
{
    uint64_t cum = 0;
    for (int i = 0; i <= SP_SCHED_BATCH_BUCKETS; i++) {
        cum += (uint64_t)st->batch_hist[i];
        sp_jbuf_lit(b, "sampan_batch_size_bucket{");
        model_labels(b, "model", model, version);
        if (i < SP_SCHED_BATCH_BUCKETS) {
            sp_jbuf_printf(b, ",le=\"%d\"} %llu\n", 1 << i, (unsigned long long)cum);
        } else {
            sp_jbuf_printf(b, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
        }
    }
    sp_jbuf_lit(b, "sampan_batch_size_sum{");
    model_labels(b, "model", model, version);
    sp_jbuf_printf(b, "} %lld\nsampan_batch_size_count{", (long long)st->step_seqs_total);
    model_labels(b, "model", model, version);
    sp_jbuf_printf(b, "} %llu\n", (unsigned long long)cum);
}

static const char *const tier_names[3] = {"batch", "standard", "premium"};

/* One sample per tier (premium first) of a per-tier gauge. */
static void
tier_samples(sp_jbuf_t *b, const char *name, const sp_served_model_t *m, const int64_t *by_tier)
{
    for (int t = 2; t >= 0; t--) {
        char extra[32];
        snprintf(extra, sizeof extra, "tier=\"%s\"", tier_names[t]);
        sample(b, name, "model", m->name, m->version_str, extra, (double)by_tier[t]);
    }
}

typedef struct model_view {
    sp_served_model_t *m;
    sp_sched_stats_t st;
} model_view_t;

static void
render_models(sp_jbuf_t *b, model_view_t *v, int n)
{
#define EACH for (int i = 0; i < n; i++)
#define M v[i].m
#define ST v[i].st
    family(b, "sampan_request_success_total", "counter", "Requests answered in full, by finish reason.");
    EACH {
        sample(b, "sampan_request_success_total", "model", M->name, M->version_str,
               "finished_reason=\"stop\"", (double)atomic_load(&M->metrics.success[0]));
        sample(b, "sampan_request_success_total", "model", M->name, M->version_str,
               "finished_reason=\"length\"", (double)atomic_load(&M->metrics.success[1]));
    }
    family(b, "sampan_request_failure_total", "counter",
           "Requests that reached a model and did not succeed, by reason.");
    EACH {
        for (int r = 0; r < SP_FAIL_COUNT_; r++) {
            char extra[48];
            snprintf(extra, sizeof extra, "reason=\"%s\"", sp_metrics_fail_reason_name((sp_fail_reason_t)r));
            sample(b, "sampan_request_failure_total", "model", M->name, M->version_str, extra,
                   (double)atomic_load(&M->metrics.failure[r]));
        }
    }
    static const struct {
        const char *name, *help;
        size_t off;
    } hists[] = {
        {"sampan_request_queue_time_seconds", "Submit to first admission into a batch.",
         offsetof(sp_model_metrics_t, queue)},
        {"sampan_request_compute_time_seconds", "First admission to the last event.",
         offsetof(sp_model_metrics_t, compute)},
        {"sampan_e2e_request_latency_seconds", "Request received to last byte queued.",
         offsetof(sp_model_metrics_t, e2e)},
        {"sampan_time_to_first_token_seconds", "Request received to the first token sent.",
         offsetof(sp_model_metrics_t, ttft)},
        {"sampan_time_per_output_token_seconds",
         "Per request: (e2e - ttft) / (generated tokens - 1).",
         offsetof(sp_model_metrics_t, tpot)},
    };
    for (size_t k = 0; k < sizeof hists / sizeof hists[0]; k++) {
        family(b, hists[k].name, "histogram", hists[k].help);
        EACH {
            const sp_hist_t *h = (const sp_hist_t *)((const char *)&M->metrics + hists[k].off);
            hist_samples(b, hists[k].name, "model", M->name, M->version_str, &h, 1);
        }
    }
    family(b, "sampan_prompt_tokens_total", "counter", "Prompt tokens evaluated.");
    EACH sample(b, "sampan_prompt_tokens_total", "model", M->name, M->version_str, NULL,
                (double)ST.prompt_tokens);
    family(b, "sampan_generation_tokens_total", "counter", "Tokens generated.");
    EACH sample(b, "sampan_generation_tokens_total", "model", M->name, M->version_str, NULL,
                (double)ST.tokens_generated);
    family(b, "sampan_requests_running", "gauge", "Sequences in the running batch, by tier.");
    EACH tier_samples(b, "sampan_requests_running", M, ST.running_tier);
    family(b, "sampan_requests_waiting", "gauge", "Sequences queued, by tier.");
    EACH tier_samples(b, "sampan_requests_waiting", M, ST.waiting_tier);
    family(b, "sampan_preemptions_total", "counter", "Sequences preempted (KV blocks reclaimed).");
    EACH sample(b, "sampan_preemptions_total", "model", M->name, M->version_str, NULL,
                (double)ST.preemptions);
    family(b, "sampan_spec_decode_draft_tokens_total", "counter",
           "Speculative decoding: tokens the draft model proposed.");
    EACH sample(b, "sampan_spec_decode_draft_tokens_total", "model", M->name, M->version_str,
                NULL, (double)ST.spec_drafted);
    family(b, "sampan_spec_decode_accepted_tokens_total", "counter",
           "Speculative decoding: proposed tokens the model accepted.");
    EACH sample(b, "sampan_spec_decode_accepted_tokens_total", "model", M->name, M->version_str,
                NULL, (double)ST.spec_accepted);
    family(b, "sampan_spec_decode_verifications_total", "counter",
           "Speculative decoding: verification rows (one model pass over a sequence's proposals).");
    EACH sample(b, "sampan_spec_decode_verifications_total", "model", M->name, M->version_str,
                NULL, (double)ST.spec_rows);
    family(b, "sampan_spec_decode_acceptance_rate", "gauge",
           "Speculative decoding: accepted / proposed tokens since the model loaded.");
    EACH sample(b, "sampan_spec_decode_acceptance_rate", "model", M->name, M->version_str, NULL,
                ST.spec_drafted ? (double)ST.spec_accepted / (double)ST.spec_drafted : 0.0);
    family(b, "sampan_spec_decode_tokens_per_verification", "gauge",
           "Speculative decoding: tokens produced per model pass of a verifying sequence "
           "(1 = no gain; the speed-up's upper bound).");
    EACH sample(b, "sampan_spec_decode_tokens_per_verification", "model", M->name,
                M->version_str, NULL,
                ST.spec_rows ? (double)(ST.spec_accepted + ST.spec_rows) / (double)ST.spec_rows
                             : 0.0);
    family(b, "sampan_batch_size", "histogram", "Sequences per engine step.");
    EACH batch_samples(b, M->name, M->version_str, &ST);
    family(b, "sampan_kv_cache_used_blocks", "gauge", "KV blocks held by running sequences.");
    EACH sample(b, "sampan_kv_cache_used_blocks", "model", M->name, M->version_str, NULL,
                (double)ST.kv_blocks_used);
    family(b, "sampan_kv_cache_capacity_blocks", "gauge", "KV blocks in the pools.");
    EACH sample(b, "sampan_kv_cache_capacity_blocks", "model", M->name, M->version_str, NULL,
                (double)ST.kv_blocks_total);
    family(b, "sampan_kv_cache_sliding_used_blocks", "gauge",
           "Sliding-window layers' KV blocks held by running sequences (a two-part pool; 0 "
           "without one, the blocks above are then all of it).");
    EACH sample(b, "sampan_kv_cache_sliding_used_blocks", "model", M->name, M->version_str, NULL,
                (double)ST.kv_swa_blocks_used);
    family(b, "sampan_kv_cache_sliding_capacity_blocks", "gauge",
           "Sliding-window layers' KV blocks in the pools.");
    EACH sample(b, "sampan_kv_cache_sliding_capacity_blocks", "model", M->name, M->version_str,
                NULL, (double)ST.kv_swa_blocks_total);
    family(b, "sampan_kv_cache_usage_ratio", "gauge", "KV blocks used over total (0..1).");
    EACH sample(b, "sampan_kv_cache_usage_ratio", "model", M->name, M->version_str, NULL,
                ST.kv_blocks_total ? (double)ST.kv_blocks_used / (double)ST.kv_blocks_total : 0);
    family(b, "sampan_prefix_cache_queries_total", "counter",
           "Full prompt blocks looked up in the prefix cache.");
    EACH sample(b, "sampan_prefix_cache_queries_total", "model", M->name, M->version_str, NULL,
                (double)ST.prefix_lookups);
    family(b, "sampan_prefix_cache_hits_total", "counter", "Full prompt blocks found in the prefix cache.");
    EACH sample(b, "sampan_prefix_cache_hits_total", "model", M->name, M->version_str, NULL,
                (double)ST.prefix_hits);
    family(b, "sampan_model_load_time_seconds", "gauge", "Time the model took to load.");
    EACH sample(b, "sampan_model_load_time_seconds", "model", M->name, M->version_str, NULL,
                M->load_ms / 1e3);
    family(b, "sampan_model_memory_bytes", "gauge",
           "Memory reserved against the device budgets (weights, KV cache, scratch).");
    EACH sample(b, "sampan_model_memory_bytes", "model", M->name, M->version_str, NULL,
                (double)M->mem_bytes);
    family(b, "sampan_model_instances", "gauge", "Instances (schedulers) of the model.");
    EACH sample(b, "sampan_model_instances", "model", M->name, M->version_str, NULL,
                (double)M->n_inst);
    family(b, "sampan_response_cache_hits_total", "counter",
           "Requests answered from the response cache (no compute).");
    EACH sample(b, "sampan_response_cache_hits_total", "model", M->name, M->version_str, NULL,
                (double)atomic_load(&M->metrics.cache_hits));
    family(b, "sampan_response_cache_misses_total", "counter",
           "Response cache lookups that found no stored answer.");
    EACH sample(b, "sampan_response_cache_misses_total", "model", M->name, M->version_str, NULL,
                (double)atomic_load(&M->metrics.cache_misses));
#undef EACH
#undef M
#undef ST
}

/* One model name's figures, its versions summed. */
typedef struct name_agg {
    const char *name;
    int first, end; /* its versions: v[first..end) */
    double running, waiting, kv_used, kv_total, prompt, gen, preempt, ok_stop, ok_length, queries,
        hits;
} name_agg_t;

/* The names of the adapters whose ids are in ids (comma-separated, in the
 * order of m's set), into out. Registry lock held (the set's guard). */
static void
lora_names_locked(const sp_served_model_t *m, const uint64_t *ids, int n, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; m->adapters != NULL && i < m->adapters->n; i++) {
        uint64_t id = sp_lora_id(m->adapters->a[i].lora);
        bool in = false;
        for (int k = 0; k < n && !in; k++) {
            in = ids[k] == id;
        }
        if (in) {
            int w = snprintf(out + o, cap - o, "%s%s", o ? "," : "", m->adapters->a[i].name);
            if (w < 0 || (size_t)w >= cap - o) {
                out[o] = '\0';
                return;
            }
            o += (size_t)w;
        }
    }
}

/* vllm:lora_requests_info, which the Gateway API inference extension reads to
 * route adapter requests: per LLM model name, the adapters with requests
 * running and waiting now (summed over versions) and the most adapters it
 * runs at once, valued at the scrape time as vLLM does (the newest wins). */
static void
render_lora_info(sp_jbuf_t *b, model_view_t *v, int n, pthread_mutex_t *mu)
{
    family(b, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    for (int i = 0; i < n;) {
        int end = i + 1;
        while (end < n && strcmp(v[end].m->name, v[i].m->name) == 0) {
            end++;
        }
        if (v[i].m->be == NULL) { /* LLMs only: tensor models have no adapters */
            char rn[2048], wn[2048], all_r[2048] = "", all_w[2048] = "";
            pthread_mutex_lock(mu);
            for (int k = i; k < end; k++) {
                lora_names_locked(v[k].m, v[k].st.lora_running, v[k].st.n_lora_running, rn,
                                  sizeof rn);
                lora_names_locked(v[k].m, v[k].st.lora_waiting, v[k].st.n_lora_waiting, wn,
                                  sizeof wn);
                /* versions: their lists joined (a name once) */
                const char *src[2] = {rn, wn};
                char *dst[2] = {all_r, all_w};
                for (int d = 0; d < 2; d++) {
                    char tmp[2048];
                    snprintf(tmp, sizeof tmp, "%s", src[d]);
                    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t;
                         t = strtok_r(NULL, ",", &save)) {
                        size_t dl = strlen(dst[d]), tl = strlen(t);
                        bool dup = false;
                        for (const char *q = dst[d]; (q = strstr(q, t)) != NULL; q += tl) {
                            if ((q == dst[d] || q[-1] == ',') && (q[tl] == ',' || q[tl] == '\0')) {
                                dup = true;
                                break;
                            }
                        }
                        if (!dup && dl + tl + 2 < sizeof all_r) {
                            snprintf(dst[d] + dl, sizeof all_r - dl, "%s%s", dl ? "," : "", t);
                        }
                    }
                }
            }
            pthread_mutex_unlock(mu);
            sp_jbuf_t ex;
            sp_jbuf_init(&ex);
            sp_jbuf_printf(&ex, "max_lora=\"%d\",running_lora_adapters=\"", SP_ADAPTERS_MAX);
            label_value(&ex, all_r);
            sp_jbuf_lit(&ex, "\",waiting_lora_adapters=\"");
            label_value(&ex, all_w);
            sp_jbuf_lit(&ex, "\"");
            if (ex.oom) {
                b->oom = true;
            } else {
                sample(b, "vllm:lora_requests_info", "model_name", v[i].m->name, NULL, ex.p, now);
            }
            sp_jbuf_free(&ex);
        }
        i = end;
    }
}

/* vLLM's names, one series per model name (versions summed). */
static void
render_vllm(sp_jbuf_t *b, model_view_t *v, int n)
{
    name_agg_t *ag = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *ag);
    if (ag == NULL) {
        b->oom = true;
        return;
    }
    int ng = 0;
    for (int i = 0; i < n; i++) { /* snapshot order: a name's versions are consecutive */
        if (i == 0 || strcmp(v[i].m->name, v[i - 1].m->name) != 0) {
            ag[ng].name = v[i].m->name;
            ag[ng].first = i;
            ng++;
        }
        name_agg_t *a = &ag[ng - 1];
        const sp_sched_stats_t *st = &v[i].st;
        a->end = i + 1;
        a->running += (double)st->active;
        a->waiting += (double)st->queued;
        a->kv_used += (double)st->kv_blocks_used;
        a->kv_total += (double)st->kv_blocks_total;
        a->prompt += (double)st->prompt_tokens;
        a->gen += (double)st->tokens_generated;
        a->preempt += (double)st->preemptions;
        a->ok_stop += (double)atomic_load(&v[i].m->metrics.success[0]);
        a->ok_length += (double)atomic_load(&v[i].m->metrics.success[1]);
        a->queries += (double)st->prefix_lookups;
        a->hits += (double)st->prefix_hits;
    }
    static const struct {
        const char *name, *type, *help;
        size_t off;
        const char *extra;
    } simple[] = {
        {"vllm:num_requests_running", "gauge", "Requests in the running batch.", offsetof(name_agg_t, running), NULL},
        {"vllm:num_requests_waiting", "gauge", "Requests waiting.", offsetof(name_agg_t, waiting), NULL},
        {"vllm:prompt_tokens_total", "counter", "Prompt tokens processed.", offsetof(name_agg_t, prompt), NULL},
        {"vllm:generation_tokens_total", "counter", "Generation tokens processed.", offsetof(name_agg_t, gen), NULL},
        {"vllm:num_preemptions_total", "counter", "Preemptions.", offsetof(name_agg_t, preempt), NULL},
        {"vllm:prefix_cache_queries_total", "counter", "Prefix-cache queries (blocks).", offsetof(name_agg_t, queries), NULL},
        {"vllm:prefix_cache_hits_total", "counter", "Prefix-cache hits (blocks).", offsetof(name_agg_t, hits), NULL},
        {"vllm:gpu_prefix_cache_queries_total", "counter", "Prefix-cache queries (blocks).", offsetof(name_agg_t, queries), NULL},
        {"vllm:gpu_prefix_cache_hits_total", "counter", "Prefix-cache hits (blocks).", offsetof(name_agg_t, hits), NULL},
    };
    for (size_t k = 0; k < sizeof simple / sizeof simple[0]; k++) {
        family(b, simple[k].name, simple[k].type, simple[k].help);
        for (int g = 0; g < ng; g++) {
            double val = *(const double *)((const char *)&ag[g] + simple[k].off);
            sample(b, simple[k].name, "model_name", ag[g].name, NULL, NULL, val);
        }
    }
    static const char *const usage[] = {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"};
    for (int u = 0; u < 2; u++) {
        family(b, usage[u], "gauge", "KV-cache usage, a fraction 0..1.");
        for (int g = 0; g < ng; g++) {
            sample(b, usage[u], "model_name", ag[g].name, NULL, NULL,
                   ag[g].kv_total > 0 ? ag[g].kv_used / ag[g].kv_total : 0);
        }
    }
    family(b, "vllm:request_success_total", "counter", "Successful requests.");
    for (int g = 0; g < ng; g++) {
        sample(b, "vllm:request_success_total", "model_name", ag[g].name, NULL,
               "finished_reason=\"stop\"", ag[g].ok_stop);
        sample(b, "vllm:request_success_total", "model_name", ag[g].name, NULL,
               "finished_reason=\"length\"", ag[g].ok_length);
    }
    static const struct {
        const char *name;
        size_t off;
    } hists[] = {
        {"vllm:time_to_first_token_seconds", offsetof(sp_model_metrics_t, ttft)},
        {"vllm:e2e_request_latency_seconds", offsetof(sp_model_metrics_t, e2e)},
        {"vllm:request_queue_time_seconds", offsetof(sp_model_metrics_t, queue)},
        {"vllm:inter_token_latency_seconds", offsetof(sp_model_metrics_t, tpot)},
        {"vllm:time_per_output_token_seconds", offsetof(sp_model_metrics_t, tpot)},
        {"vllm:request_prefill_time_seconds", offsetof(sp_model_metrics_t, prefill)},
        {"vllm:request_decode_time_seconds", offsetof(sp_model_metrics_t, decode)},
        {"vllm:request_prompt_tokens", offsetof(sp_model_metrics_t, prompt_tokens)},
        {"vllm:request_generation_tokens", offsetof(sp_model_metrics_t, gen_tokens)},
    };
    const sp_hist_t **hs = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *hs);
    for (size_t k = 0; hs && k < sizeof hists / sizeof hists[0]; k++) {
        family(b, hists[k].name, "histogram", "See the sampan_ family of the same meaning.");
        for (int g = 0; g < ng; g++) {
            int nh = 0;
            for (int i = ag[g].first; i < ag[g].end; i++) {
                hs[nh++] = (const sp_hist_t *)((const char *)&v[i].m->metrics + hists[k].off);
            }
            hist_samples(b, hists[k].name, "model_name", ag[g].name, NULL, hs, nh);
        }
    }
    family(b, "vllm:cache_config_info", "gauge", "KV cache configuration.");
    for (int g = 0; g < ng; g++) {
        char extra[96];
        snprintf(extra, sizeof extra, "block_size=\"16\",num_gpu_blocks=\"%lld\"",
                 (long long)ag[g].kv_total);
        sample(b, "vllm:cache_config_info", "model_name", ag[g].name, NULL, extra, 1);
    }
    if (hs == NULL) {
        b->oom = true;
    }
    sp_free(hs);
    sp_free(ag);
}

/* Triton's names (--metrics-compat triton), one series per model version
 * with Triton's labels (model, version), from the same counters as GET
 * /v2/models/{m}/stats. Durations are cumulative microseconds, as Triton's. */
static void
render_triton(sp_jbuf_t *b, model_view_t *v, int n)
{
    static const struct {
        const char *name, *type, *help;
        size_t off; /* of the sp_tstat_dur_t in sp_tstats_t */
        bool ns;    /* its nanoseconds (as us), else its count */
    } fam[] = {
        {"nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
         offsetof(sp_tstats_t, success), false},
        {"nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
         offsetof(sp_tstats_t, fail), false},
        {"nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds (includes cached requests)",
         offsetof(sp_tstats_t, success), true},
        {"nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
         offsetof(sp_tstats_t, queue), true},
        {"nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds",
         offsetof(sp_tstats_t, compute_input), true},
        {"nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds",
         offsetof(sp_tstats_t, compute_infer), true},
        {"nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration in microseconds",
         offsetof(sp_tstats_t, compute_output), true},
    };
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        family(b, fam[k].name, fam[k].type, fam[k].help);
        for (int i = 0; i < n; i++) {
            sp_tstat_dur_t *d = (sp_tstat_dur_t *)((char *)&v[i].m->metrics.tstats + fam[k].off);
            uint64_t x = fam[k].ns ? atomic_load_explicit(&d->ns, memory_order_relaxed) / 1000
                                   : atomic_load_explicit(&d->count, memory_order_relaxed);
            sample(b, fam[k].name, "model", v[i].m->name, v[i].m->version_str, NULL, (double)x);
        }
    }
    family(b, "nv_inference_count", "counter",
           "Number of inferences performed (does not include cached requests)");
    for (int i = 0; i < n; i++) {
        sample(b, "nv_inference_count", "model", v[i].m->name, v[i].m->version_str, NULL,
               (double)atomic_load(&v[i].m->metrics.tstats.inference_count));
    }
    family(b, "nv_inference_exec_count", "counter",
           "Number of model executions performed (does not include cached requests)");
    for (int i = 0; i < n; i++) {
        sample(b, "nv_inference_exec_count", "model", v[i].m->name, v[i].m->version_str, NULL,
               (double)atomic_load(&v[i].m->metrics.tstats.execution_count));
    }
    family(b, "nv_inference_pending_request_count", "gauge",
           "Instantaneous number of pending requests awaiting execution per-model.");
    for (int i = 0; i < n; i++) {
        double pending = (double)v[i].st.queued;
        if (v[i].m->batcher != NULL) {
            sp_batcher_stats_t bs;
            sp_batcher_get_stats(v[i].m->batcher, &bs);
            pending += (double)bs.queued;
        }
        sample(b, "nv_inference_pending_request_count", "model", v[i].m->name,
               v[i].m->version_str, NULL, pending);
    }
}

typedef struct tenant_pass {
    sp_jbuf_t *b;
    int family; /* which of the tenant families this pass writes */
} tenant_pass_t;

static void
tenant_samples(const sp_tenant_state_t *st, void *ud)
{
    tenant_pass_t *tp = ud;
    sp_jbuf_t *b = tp->b;
    switch (tp->family) {
    case 0:
        sample(b, "sampan_tenant_requests_total", "tenant", st->name, NULL, NULL,
               (double)atomic_load(&((sp_tenant_state_t *)st)->requests));
        break;
    case 1:
        sample(b, "sampan_tenant_tokens_total", "tenant", st->name, NULL, NULL,
               (double)atomic_load(&((sp_tenant_state_t *)st)->tokens));
        break;
    case 2:
        sample(b, "sampan_tenant_requests_inflight", "tenant", st->name, NULL, NULL,
               (double)atomic_load(&((sp_tenant_state_t *)st)->inflight));
        break;
    default:
        for (int l = 0; l <= SP_LIMIT_SCOPE; l++) {
            char extra[48];
            snprintf(extra, sizeof extra, "limit=\"%s\"", sp_auth_limit_name((sp_limit_t)l));
            sample(b, "sampan_tenant_rejected_total", "tenant", st->name, NULL, extra,
                   (double)atomic_load(&((sp_tenant_state_t *)st)->rejected[l]));
        }
    }
}

static void
h_metrics(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)p;
    sp_serving_t *s = ud;
    sp_served_model_t **ms = NULL;
    int n = sp_registry_snapshot(s, &ms);
    model_view_t *v = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *v);
    if (v == NULL || (n > 0 && ms == NULL)) {
        for (int i = 0; i < n; i++) sp_served_release(ms[i]);
        sp_free(ms);
        sp_free(v);
        sp_api_error(r, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    for (int i = 0; i < n; i++) {
        v[i].m = ms[i];
        sp_served_stats(ms[i], &v[i].st);
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    render_models(&b, v, n);

    /* Every known version's readiness, loaded or not. */
    sp_registry_t *reg = &s->reg;
    family(&b, "sampan_model_ready", "gauge", "1 when the model version is READY, else 0.");
    pthread_mutex_lock(&reg->mu);
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        const sp_model_entry_t *e = &reg->entry[i];
        if (e->used) {
            sample(&b, "sampan_model_ready", "model", e->name, e->version_str, NULL,
                   e->live && e->state == SP_REPO_READY ? 1 : 0);
        }
    }
    static const char *const dev_fam[][3] = {
        {"sampan_device_memory_total_bytes", "gauge", "Memory of the device."},
        {"sampan_device_memory_budget_bytes", "gauge", "Memory models may reserve on the device."},
        {"sampan_device_memory_reserved_bytes", "gauge", "Memory reserved by loaded models."},
        {"sampan_device_memory_used_bytes", "gauge", "Memory in use by anyone, as the device reports it."},
    };
    for (int k = 0; k < 4; k++) {
        family(&b, dev_fam[k][0], dev_fam[k][1], dev_fam[k][2]);
        for (int d = 0; d < reg->n_dev; d++) {
            const sp_device_info_t *di = sp_devices_get(reg->devs, d);
            char extra[64];
            snprintf(extra, sizeof extra, "kind=\"%s\"", sp_device_kind_name(di->kind));
            double val = k == 0   ? (double)di->total_bytes
                         : k == 1 ? (double)reg->budget[d]
                         : k == 2 ? (double)reg->used[d]
                                  : (double)di->used_bytes;
            sample(&b, dev_fam[k][0], "device", di->id, NULL, extra, val);
        }
    }
    family(&b, "sampan_device_healthy", "gauge",
           "1, or 0 once a CUDA error marked the GPU unhealthy (its models fail; /health is 503).");
    for (int d = 0; d < reg->n_dev; d++) {
        const sp_device_info_t *di = sp_devices_get(reg->devs, d);
        char extra[64];
        snprintf(extra, sizeof extra, "kind=\"%s\"", sp_device_kind_name(di->kind));
        sample(&b, "sampan_device_healthy", "device", di->id, NULL, extra,
               di->ordinal >= 0 && !sp_loader_device_healthy(di->ordinal) ? 0 : 1);
    }
    family(&b, "sampan_device_utilization_ratio", "gauge", "GPU busy fraction where reported.");
    for (int d = 0; d < reg->n_dev; d++) {
        const sp_device_info_t *di = sp_devices_get(reg->devs, d);
        if (di->util_percent >= 0) {
            char extra[64];
            snprintf(extra, sizeof extra, "kind=\"%s\"", sp_device_kind_name(di->kind));
            sample(&b, "sampan_device_utilization_ratio", "device", di->id, NULL, extra,
                   di->util_percent / 100.0);
        }
    }
    int64_t evictions = reg->evictions;
    pthread_mutex_unlock(&reg->mu);
    family(&b, "sampan_model_evictions_total", "counter", "Models unloaded to make room (LRU).");
    sp_jbuf_printf(&b, "sampan_model_evictions_total %lld\n", (long long)evictions);
    sp_respcache_stats_t rcs; /* all zero without a cache */
    sp_respcache_get_stats(s->rcache, &rcs);
    family(&b, "sampan_response_cache_capacity_bytes", "gauge",
           "The response cache's bound (--response-cache-bytes).");
    sp_jbuf_printf(&b, "sampan_response_cache_capacity_bytes %llu\n",
                   (unsigned long long)rcs.capacity_bytes);
    family(&b, "sampan_response_cache_bytes", "gauge",
           "Bytes held by the response cache (keys, answers, entry headers).");
    sp_jbuf_printf(&b, "sampan_response_cache_bytes %llu\n", (unsigned long long)rcs.bytes);
    family(&b, "sampan_response_cache_entries", "gauge", "Answers held by the response cache.");
    sp_jbuf_printf(&b, "sampan_response_cache_entries %llu\n", (unsigned long long)rcs.entries);
    family(&b, "sampan_response_cache_evictions_total", "counter",
           "Answers dropped from the response cache to make room (LRU).");
    sp_jbuf_printf(&b, "sampan_response_cache_evictions_total %llu\n",
                   (unsigned long long)rcs.evictions);

    if (sp_auth_enabled(&s->auth)) {
        static const struct {
            const char *name, *type, *help;
        } tf[] = {
            {"sampan_tenant_requests_total", "counter", "Requests admitted per tenant."},
            {"sampan_tenant_tokens_total", "counter", "Prompt and generated tokens per tenant."},
            {"sampan_tenant_requests_inflight", "gauge", "Requests in flight per tenant."},
            {"sampan_tenant_rejected_total", "counter", "Requests refused per tenant, by limit."},
        };
        for (int k = 0; k < 4; k++) {
            family(&b, tf[k].name, tf[k].type, tf[k].help);
            tenant_pass_t tp = {&b, k};
            sp_auth_each(&s->auth, tenant_samples, &tp);
        }
    }
    family(&b, "sampan_build_info", "gauge", "Build information.");
    sp_jbuf_printf(&b, "sampan_build_info{version=\"%s\"} 1\n", SAMPAN_VERSION);
    family(&b, "sampan_http_connections", "gauge", "Open client connections.");
    sp_jbuf_printf(&b, "sampan_http_connections %lld\n",
                   (long long)sp_http_server_connections(s->http));
    family(&b, "sampan_http_requests_inflight", "gauge", "Requests being handled.");
    sp_jbuf_printf(&b, "sampan_http_requests_inflight %lld\n",
                   (long long)sp_http_server_inflight(s->http));
    family(&b, "sampan_http_responses_total", "counter", "Responses by status code.");
    for (int code = 100; code < 600; code++) {
        uint64_t c = sp_http_server_status_count(s->http, code);
        if (c) {
            sp_jbuf_printf(&b, "sampan_http_responses_total{code=\"%d\"} %llu\n", code,
                           (unsigned long long)c);
        }
    }
    sp_trace_stats_t ts; /* tracing (docs/tracing.md); zeros when it is off */
    sp_trace_get_stats(&ts);
    family(&b, "sampan_trace_spans_exported_total", "counter",
           "Spans the OTLP collector accepted.");
    sp_jbuf_printf(&b, "sampan_trace_spans_exported_total %llu\n",
                   (unsigned long long)ts.spans_exported);
    family(&b, "sampan_trace_spans_dropped_total", "counter",
           "Spans not exported: the export queue was full, or the collector refused or missed them.");
    sp_jbuf_printf(&b, "sampan_trace_spans_dropped_total{reason=\"queue_full\"} %llu\n"
                       "sampan_trace_spans_dropped_total{reason=\"export_failed\"} %llu\n",
                   (unsigned long long)ts.spans_dropped_queue,
                   (unsigned long long)ts.spans_dropped_export);
    family(&b, "sampan_trace_spans_queued", "gauge", "Spans waiting for export.");
    sp_jbuf_printf(&b, "sampan_trace_spans_queued %llu\n", (unsigned long long)ts.queued);
    family(&b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    sp_jbuf_printf(&b, "process_resident_memory_bytes %llu\n",
                   (unsigned long long)sp_metrics_rss_bytes());
    family(&b, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch.");
    sp_jbuf_printf(&b, "process_start_time_seconds %lld\n", (long long)s->started_unix);

    if (strstr(s->cfg.metrics_compat, "vllm") != NULL) {
        render_vllm(&b, v, n);
        render_lora_info(&b, v, n, &s->reg.mu);
    }
    if (strstr(s->cfg.metrics_compat, "triton") != NULL) {
        render_triton(&b, v, n);
    }
    for (int i = 0; i < n; i++) {
        sp_served_release(ms[i]);
    }
    sp_free(ms);
    sp_free(v);
    if (b.oom) {
        sp_api_error(r, 500, NULL, NULL, NULL, "out of memory while writing the metrics");
    } else {
        sp_http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
    }
    sp_jbuf_free(&b);
}

void
sp_prometheus_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_GET, "/metrics", h_metrics, s);
}
