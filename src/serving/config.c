/* config.c - defaults, the config file (JSON or YAML), the environment and the flags of
 * `sampan serve`: one option table read by all three. */
#include "serving/config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/json.h"
#include "core/yaml.h"
#include "gguf/gguf.h"

const char sp_config_usage[] =
    "usage: sampan serve [--model NAME=FILE.gguf ...] [options]\n"
    "Serves the OpenAI API (and health routes) over HTTP/1.1. With no --model it serves\n"
    "the demo model " SP_SERVE_DEMO_MODEL " as \"" SP_SERVE_DEMO_NAME "\".\n"
    "  -m, --model NAME=FILE     a model to serve (repeatable; NAME defaults to the file name)\n"
    "                            FILE may be hf://ORG/REPO[/FILE.gguf | :QUANT]: downloaded from\n"
    "                            Hugging Face into its cache first (see sampan pull --help)\n"
    "      --model-repository DIR  serve the models of a Triton-style repository\n"
    "                            (a directory, or s3://BUCKET/PREFIX on S3, Ceph RGW or\n"
    "                            MinIO: credentials and endpoint from AWS_* variables)\n"
    "      --repository-cache DIR  where s3:// repositories are mirrored (default\n"
    "                            ~/.cache/sampan/s3)\n"    "      --model-control-mode M  none (load every model at start, default), poll (also\n"
    "                            rescan every --repository-poll-secs and apply what changed)\n"
    "                            or explicit (only through /v2/repository/models/{m}/load)\n"
    "      --repository-poll-secs S  poll mode: seconds between rescans (default 5)\n"
    "      --strict-readiness B  true (default, as Triton): /health and /v2/health/ready\n"
    "                            say 503 while a repository model that should serve is\n"
    "                            not ready or failed to load; false: ready once started\n"
    "      --model-copy-max B    model files up to B bytes are served from a private copy in\n"
    "                            memory that no change to the file reaches; larger ones are\n"
    "                            mapped and guarded (default 17179869184, 16 GiB; 0 maps all)\n"
    "      --key-dir DIR         the directory a load request's encryption_key_file names a\n"
    "                            key in (by file name); without it a load request cannot\n"
    "                            name a key file\n"
    "      --memory-budget B     model memory per device: 60%, 2G, or per device\n"
    "                            cpu=2G,cuda:0=70% (default 80% of each device)\n"
    "      --backends-dir DIR    where backend plugins (libsampan_<name>.so) are looked for\n"
    "                            first (then backends/ next to the binary)\n"
    "      --load-timeout S      how long a request waits for its model to load on demand\n"
    "                            (default 60)\n"
    "      --keep-alive S        unload a model S seconds after its last request (it loads\n"
    "                            again on the next); Ollama's keep_alive sets it per model\n"
    "                            (default -1: never)\n"
    "      --response-cache-bytes N  cache the answers of deterministic requests in N bytes\n"
    "                            (LRU; default 0 = off): --model models, and repository\n"
    "                            models whose config.json has response_cache.enable\n"
    "      --responses-store N   stored Responses API responses (/v1/responses), oldest\n"
    "                            evicted past N (default 1024; 0 = none kept)\n"
    "      --responses-store-bytes N  ... and past N bytes in all (default 67108864)\n"
    "      --config FILE         JSON or YAML (.yaml/.yml) file with any of these options\n"
    "                            (SAMPAN_CONFIG names one when no --config is given)\n"
    "      --host ADDR           address to bind (default 127.0.0.1)\n"
    "  -p, --port N              port (default 8000; 0 = any free port, printed at start)\n"
    "  -t, --threads N           threads per sequence slot (default 0 = one per core)\n"
    "  -c, --ctx-size N          context per slot (default: the model's, at most 4096)\n"
    "      --parallel N          sequences run at once per model (default 4)\n"
    "      --queue N             sequences waiting per model and tier before 429 (default 64)\n"
    "      --queue-premium N     waiting premium sequences (default: --queue); also\n"
    "      --queue-standard N    --queue-standard, --queue-batch\n"
    "      --queue-batch N\n"
    "      --step-tokens N       tokens per engine step: decode rows + prefill chunks (default 256)\n"
    "      --kv-blocks N         KV cache blocks of 16 positions (default: parallel x ctx, <= 2 GiB)\n"
    "      --kv-type T           KV cache type: f32 (default, exact), f16 (half the memory)\n"
    "                            or q8_0 (about a quarter; CPU layers only)\n"
    "      --kv-f16              the same as --kv-type f16\n"
    "      --kv-swa-full         sliding-window layers keep every position (default: their window)\n"
    "      --no-repack           keep the file's weight layout: no load-time interleaving of\n"
    "                            Q4_0 / IQ4_NL rows for the AVX2 kernels (SAMPAN_REPACK=0)\n"
    "      --draft-model FILE    speculative decoding for --model: FILE (same vocabulary)\n"
    "                            proposes tokens the model verifies in one pass\n"
    "      --spec-tokens N       tokens proposed per step (1..16, default 4)\n"
    "      --tpot-target-ms X    adapt the prefill tokens per step to keep the p99 time per\n"
    "                            output token under X ms (default 0 = off: --step-tokens)\n"
    "      --http-threads N      event-loop threads (default 1)\n"
    "      --chat-template NAME  built-in chat template for every model (default: the file's)\n"
    "      --reasoning-format F  chat answers' thinking: auto (default) or deepseek return it\n"
    "                            as reasoning_content, none keeps it in content\n"
    "      --reasoning-budget N  thinking tokens per part when a chat request sets none\n"
    "                            (-1 default: no limit, 0: no thinking)\n"
    "      --chat-template-file FILE  Jinja chat template for every model, instead of the\n"
    "                            one in its GGUF file (a model's chat_template parameter wins)\n"
    "      --max-tokens N        cap on max_tokens per request (default 4096)\n"
    "      --max-n N             cap on n (default 16)\n"
    "      --max-logprobs N      cap on logprobs/top_logprobs (default 20)\n"
    "      --max-embed-inputs N  inputs per embeddings request (default 128)\n"
    "      --json-depth N        nesting limit of request bodies (default 64)\n"
    "      --max-body-bytes N    request body limit, 413 above (default 8388608)\n"
    "      --max-header-bytes N  request head limit, 431 above (default 16384)\n"
    "      --max-headers N       header lines, 431 above (default 100)\n"
    "      --max-url-bytes N     request target, 414 above (default 8192)\n"
    "      --max-connections N   open connections (default 1024)\n"
    "      --max-conns-per-client N  open connections from one address, 429 above\n"
    "                            (default 256, 0 = no cap)\n"
    "      --conn-rate-per-client N  new connections per second from one address, 429\n"
    "                            above (default 1000, 0 = no limit)\n"
    "      --max-output-bytes N  unsent output per stream before it is dropped (default 4194304)\n"
    "      --header-timeout S    seconds for a request head (default 10)\n"
    "      --body-timeout S      seconds for a request body (default 30)\n"
    "      --idle-timeout S      keep-alive idle seconds (default 60)\n"
    "      --write-timeout S     seconds without write progress (default 30)\n"
    "      --request-timeout S   wall-clock limit of one request (default 600, 0 = none)\n"
    "      --drain-timeout S     on SIGTERM/SIGINT, seconds to finish requests (default 30)\n"
    "      --drain-delay S       on SIGTERM, first S seconds not ready (503 on /health) but\n"
    "                            still accepting and serving, so load balancers take the\n"
    "                            endpoint out before it closes (default 0; the Helm chart\n"
    "                            sets it in place of a preStop sleep)\n"
    "      --api-key KEY         require 'Authorization: Bearer KEY' (default: none)\n"
    "      --tenants FILE        API keys (hashed), scopes, QoS tiers and limits per tenant;\n"
    "                            reloaded on SIGHUP and when the file changes (`sampan keys`)\n"
    "      --prefix-cache-scope S\n"
    "                            tenant (default): a cached prompt prefix is reused only by\n"
    "                            the same tenant; global: by every tenant (more hits, but a\n"
    "                            tenant can time another's prompts; docs/security.md)\n"
    "      --insecure-open       allow binding a non-loopback address without keys\n"
    "      --metrics-open        serve /metrics without the metrics scope\n"
    "      --tls-cert FILE       PEM certificate chain: serve HTTPS (TLS 1.2+)\n"
    "      --tls-key FILE        PEM private key of --tls-cert\n"
    "      --tls-client-ca FILE  require client certificates signed by these CAs (mutual TLS)\n"
    "      --tls-port N          HTTPS on this port and plain HTTP on --port (default: HTTPS on\n"
    "                            --port only)\n"
    "      --grpc-port N         the KServe v2 gRPC service on this port (default 8001 when it\n"
    "                            is free; 0 or off: none); TLS with --tls-cert (docs/grpc.md)\n"
    "      --cors-origins LIST   allow these origins (comma-separated; default: CORS off)\n"
    "      --log-format F        kv (key=value, default) or json: one line per event\n"
    "      --log-requests W      which requests get an access-log line: all, models\n"
    "                            (inference requests and errors, default), errors, none\n"
    "      --log-prompts         also log prompts and outputs, masked (e-mail addresses,\n"
    "                            card and phone numbers), cut at 256 bytes\n"
    "      --metrics-compat vllm also export vLLM's metric names (vllm:num_requests_waiting,\n"
    "                            ...) for autoscalers, the inference gateway and dashboards;\n"
    "                            triton: Triton's nv_inference_* names; vllm,triton: both\n"
    "      --otlp-endpoint URL   export OpenTelemetry traces to this OTLP/HTTP collector\n"
    "                            (http://host:port; POST URL/v1/traces; default: tracing off)\n"
    "      --otel-service-name N the spans' service.name (default sampan)\n"
    "      --trace-sample-ratio R  share of new traces sampled, 0..1 (default 1); a request\n"
    "                            with a traceparent follows its sampled flag\n"
    "      --otlp-max-queue N    spans waiting for export before new ones are dropped (2048)\n"
    "      --otlp-timeout S      seconds for one export POST (default 5)\n"
    "  -v, --verbose             log every request (--log-requests all)\n"
    "Every option can also be set in the environment as SAMPAN_<FLAG> (--kv-blocks is\n"
    "SAMPAN_KV_BLOCKS; booleans take true/false; SAMPAN_MODEL takes NAME=FILE[,NAME=FILE]).\n"
    "Flags win over the environment, the environment over the file.\n";

typedef enum opt_type { T_INT, T_I64, T_SIZE, T_SEC, T_MS, T_STR, T_BOOL, T_MODEL, T_CONFIG } opt_type_t;

typedef struct opt {
    const char *name;
    char short_name;
    opt_type_t type;
    size_t off;
    double lo, hi;
    size_t cap; /* T_STR */
} opt_t;

#define OFF(f) offsetof(sp_serve_config_t, f)
static const opt_t opts[] = {
    {"model", 'm', T_MODEL, 0, 0, 0, 0},
    {"config", 0, T_CONFIG, 0, 0, 0, 0},
    {"host", 0, T_STR, OFF(host), 0, 0, sizeof(((sp_serve_config_t *)0)->host)},
    {"port", 'p', T_INT, OFF(port), 0, 65535, 0},
    {"threads", 't', T_INT, OFF(threads), 0, 512, 0},
    {"ctx-size", 'c', T_I64, OFF(ctx_size), 0, 1 << 20, 0},
    {"parallel", 0, T_INT, OFF(parallel), 1, 256, 0},
    {"queue", 0, T_INT, OFF(queue), 0, 1000000, 0},
    {"queue-premium", 0, T_I64, OFF(queue_premium), 0, 1000000, 0},
    {"queue-standard", 0, T_I64, OFF(queue_standard), 0, 1000000, 0},
    {"queue-batch", 0, T_I64, OFF(queue_batch), 0, 1000000, 0},
    {"step-tokens", 0, T_INT, OFF(step_tokens), 1, 65536, 0},
    {"kv-blocks", 0, T_I64, OFF(kv_blocks), 1, 1 << 26, 0},
    {"kv-f16", 0, T_BOOL, OFF(kv_f16), 0, 0, 0},
    {"kv-swa-full", 0, T_BOOL, OFF(kv_swa_full), 0, 0, 0},
    {"no-repack", 0, T_BOOL, OFF(no_repack), 0, 0, 0},
    {"kv-type", 0, T_STR, OFF(kv_type), 0, 0, sizeof(((sp_serve_config_t *)0)->kv_type)},
    {"prefix-cache-scope", 0, T_STR, OFF(prefix_cache_scope), 0, 0, sizeof(((sp_serve_config_t *)0)->prefix_cache_scope)},
    {"tpot-target-ms", 0, T_SEC, OFF(tpot_target_ms), 0, 600000, 0}, /* a double, as seconds are */
    {"draft-model", 0, T_STR, OFF(draft_model), 0, 0, sizeof(((sp_serve_config_t *)0)->draft_model)},
    {"spec-tokens", 0, T_INT, OFF(spec_tokens), 1, 16, 0},
    {"http-threads", 0, T_INT, OFF(http_threads), 1, 64, 0},
    {"model-repository", 0, T_STR, OFF(model_repository), 0, 0, sizeof(((sp_serve_config_t *)0)->model_repository)},
    {"repository-cache", 0, T_STR, OFF(repository_cache), 0, 0, sizeof(((sp_serve_config_t *)0)->repository_cache)},
    {"strict-readiness", 0, T_STR, OFF(strict_readiness_str), 0, 0, sizeof(((sp_serve_config_t *)0)->strict_readiness_str)},
    {"model-control-mode", 0, T_STR, OFF(model_control_mode), 0, 0, sizeof(((sp_serve_config_t *)0)->model_control_mode)},
    {"repository-poll-secs", 0, T_SEC, OFF(repository_poll_s), 0.05, 86400, 0},
    {"model-copy-max", 0, T_SIZE, OFF(model_copy_max), 0, 1099511627776.0 * 64, 0},
    {"key-dir", 0, T_STR, OFF(key_dir), 0, 0, sizeof(((sp_serve_config_t *)0)->key_dir)},
    {"memory-budget", 0, T_STR, OFF(memory_budget), 0, 0, sizeof(((sp_serve_config_t *)0)->memory_budget)},
    {"load-timeout", 0, T_SEC, OFF(load_timeout_s), 0, 86400, 0},
    {"keep-alive", 0, T_SEC, OFF(keep_alive_s), -1, 86400 * 365, 0},
    {"backends-dir", 0, T_STR, OFF(backends_dir), 0, 0, sizeof(((sp_serve_config_t *)0)->backends_dir)},
    {"response-cache-bytes", 0, T_SIZE, OFF(response_cache_bytes), 0, 1099511627776.0, 0},
    {"responses-store", 0, T_I64, OFF(responses_store), 0, 1 << 24, 0},
    {"responses-store-bytes", 0, T_SIZE, OFF(responses_store_bytes), 0, 1099511627776.0, 0},
    {"chat-template", 0, T_STR, OFF(chat_template), 0, 0, sizeof(((sp_serve_config_t *)0)->chat_template)},
    {"reasoning-format", 0, T_STR, OFF(reasoning_format), 0, 0, sizeof(((sp_serve_config_t *)0)->reasoning_format)},
    {"reasoning-budget", 0, T_I64, OFF(reasoning_budget), -1, 2147483647, 0},
    {"chat-template-file", 0, T_STR, OFF(chat_template_file), 0, 0, sizeof(((sp_serve_config_t *)0)->chat_template_file)},
    {"max-tokens", 0, T_INT, OFF(max_tokens), 1, 1 << 20, 0},
    {"max-n", 0, T_INT, OFF(max_n), 1, 128, 0},
    {"max-logprobs", 0, T_INT, OFF(max_logprobs), 0, 20, 0},
    {"max-embed-inputs", 0, T_INT, OFF(max_embed_inputs), 1, 128, 0},
    {"json-depth", 0, T_INT, OFF(json_depth), 2, 1000, 0},
    {"max-body-bytes", 0, T_SIZE, OFF(limits.max_body_bytes), 1, 1 << 30, 0},
    {"max-header-bytes", 0, T_SIZE, OFF(limits.max_header_bytes), 256, 1 << 20, 0},
    {"max-headers", 0, T_INT, OFF(limits.max_headers), 1, 10000, 0},
    {"max-url-bytes", 0, T_SIZE, OFF(limits.max_url_bytes), 16, 1 << 20, 0},
    {"max-connections", 0, T_INT, OFF(limits.max_connections), 1, 1000000, 0},
    {"max-conns-per-client", 0, T_INT, OFF(limits.max_conns_per_client), 0, 1000000, 0},
    {"conn-rate-per-client", 0, T_INT, OFF(limits.conn_rate_per_client), 0, 1000000, 0},
    {"max-output-bytes", 0, T_SIZE, OFF(limits.max_output_bytes), 1024, 1 << 30, 0},
    {"header-timeout", 0, T_MS, OFF(limits.header_timeout_ms), 0.001, 3600, 0},
    {"body-timeout", 0, T_MS, OFF(limits.body_timeout_ms), 0.001, 3600, 0},
    {"idle-timeout", 0, T_MS, OFF(limits.idle_timeout_ms), 0.001, 86400, 0},
    {"write-timeout", 0, T_MS, OFF(limits.write_timeout_ms), 0.001, 3600, 0},
    {"request-timeout", 0, T_SEC, OFF(request_timeout_s), 0, 86400 * 7, 0},
    {"drain-timeout", 0, T_SEC, OFF(drain_timeout_s), 0, 86400, 0},
    {"drain-delay", 0, T_SEC, OFF(drain_delay_s), 0, 3600, 0},
    {"api-key", 0, T_STR, OFF(api_key), 0, 0, sizeof(((sp_serve_config_t *)0)->api_key)},
    {"tenants", 0, T_STR, OFF(tenants_file), 0, 0, sizeof(((sp_serve_config_t *)0)->tenants_file)},
    {"insecure-open", 0, T_BOOL, OFF(insecure_open), 0, 0, 0},
    {"metrics-open", 0, T_BOOL, OFF(metrics_open), 0, 0, 0},
    {"tls-cert", 0, T_STR, OFF(tls_cert), 0, 0, sizeof(((sp_serve_config_t *)0)->tls_cert)},
    {"tls-key", 0, T_STR, OFF(tls_key), 0, 0, sizeof(((sp_serve_config_t *)0)->tls_key)},
    {"tls-client-ca", 0, T_STR, OFF(tls_client_ca), 0, 0, sizeof(((sp_serve_config_t *)0)->tls_client_ca)},
    {"tls-port", 0, T_INT, OFF(tls_port), 0, 65535, 0},
    {"grpc-port", 0, T_STR, OFF(grpc_port), 0, 0, sizeof(((sp_serve_config_t *)0)->grpc_port)},
    {"cors-origins", 0, T_STR, OFF(cors_origins), 0, 0, sizeof(((sp_serve_config_t *)0)->cors_origins)},
    {"verbose", 'v', T_BOOL, OFF(verbose), 0, 0, 0},
    {"log-format", 0, T_STR, OFF(log_format), 0, 0, sizeof(((sp_serve_config_t *)0)->log_format)},
    {"log-requests", 0, T_STR, OFF(log_requests), 0, 0, sizeof(((sp_serve_config_t *)0)->log_requests)},
    {"log-prompts", 0, T_BOOL, OFF(log_prompts), 0, 0, 0},
    {"metrics-compat", 0, T_STR, OFF(metrics_compat), 0, 0, sizeof(((sp_serve_config_t *)0)->metrics_compat)},
    {"otlp-endpoint", 0, T_STR, OFF(otlp_endpoint), 0, 0, sizeof(((sp_serve_config_t *)0)->otlp_endpoint)},
    {"otel-service-name", 0, T_STR, OFF(otel_service_name), 0, 0, sizeof(((sp_serve_config_t *)0)->otel_service_name)},
    {"trace-sample-ratio", 0, T_SEC, OFF(trace_sample_ratio), 0, 1, 0}, /* a double, as seconds are */
    {"otlp-max-queue", 0, T_INT, OFF(otlp_max_queue), 1, 1000000, 0},
    {"otlp-timeout", 0, T_SEC, OFF(otlp_timeout_s), 0.001, 600, 0},
};
#undef OFF

void
sp_config_defaults(sp_serve_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8000;
    c->parallel = 4;
    c->queue = 64;
    c->queue_premium = c->queue_standard = c->queue_batch = -1;
    c->reasoning_budget = -1;
    c->step_tokens = 256;
    c->http_threads = 1;
    c->spec_tokens = 4;
    c->max_tokens = 4096;
    c->max_n = 16;
    c->max_logprobs = 20;
    c->max_embed_inputs = 128;
    c->json_depth = 64;
    c->drain_timeout_s = 30;
    c->request_timeout_s = 600;
    c->repository_poll_s = 5;
    c->load_timeout_s = 60;
    c->keep_alive_s = -1;
    c->responses_store = 1024;
    c->responses_store_bytes = (size_t)64 << 20;
    c->model_copy_max = SP_GGUF_COPY_MAX_DEFAULT;
    snprintf(c->otel_service_name, sizeof c->otel_service_name, "sampan");
    c->trace_sample_ratio = 1;
    c->otlp_max_queue = 2048;
    c->otlp_timeout_s = 5;
    c->limits = sp_http_default_limits();
}

/* NAME=FILE or FILE (the name is the file name without directory and .gguf). */
static sp_status_t
add_model(sp_serve_config_t *c, const char *spec, const char *src, char *err, size_t err_len)
{
    if (c->n_models >= SP_SERVE_MAX_MODELS) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: at most %d models", src,
                       SP_SERVE_MAX_MODELS);
    }
    sp_serve_model_cfg_t *m = &c->models[c->n_models];
    const char *eq = strchr(spec, '=');
    const char *path = eq ? eq + 1 : spec;
    size_t nl;
    const char *name;
    if (eq) {
        name = spec;
        nl = (size_t)(eq - spec);
    } else {
        const char *slash = strrchr(spec, '/');
        name = slash ? slash + 1 : spec;
        nl = strlen(name);
        if (nl > 9 && strcmp(name + nl - 9, ".gguf.enc") == 0) {
            nl -= 9;
        } else if (nl > 5 && strcmp(name + nl - 5, ".gguf") == 0) {
            nl -= 5;
        }
    }
    if (nl == 0 || nl >= sizeof m->name || *path == '\0' || strlen(path) >= sizeof m->path) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: expected NAME=FILE, got '%s'", src, spec);
    }
    for (size_t i = 0; i < nl; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch <= 0x20 || ch == 0x7F || ch == '/' || ch == '"' || ch == '\\') {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s: model name '%.*s' may not contain spaces, quotes or slashes", src,
                           (int)nl, name);
        }
    }
    memcpy(m->name, name, nl);
    m->name[nl] = '\0';
    for (int i = 0; i < c->n_models; i++) {
        if (strcmp(c->models[i].name, m->name) == 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "%s: model name '%s' given twice", src,
                           m->name);
        }
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    c->n_models++;
    return SP_OK;
}

static sp_status_t
set_number(sp_serve_config_t *c, const opt_t *o, double v, const char *src, char *err,
           size_t err_len)
{
    if (!isfinite(v) || v < o->lo || v > o->hi) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s must be between %g and %g", src, o->lo,
                       o->hi);
    }
    if (o->type != T_SEC && o->type != T_MS && v != floor(v)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s must be an integer", src);
    }
    char *base = (char *)c;
    switch (o->type) {
    case T_INT: *(int *)(void *)(base + o->off) = (int)v; break;
    case T_I64: *(int64_t *)(void *)(base + o->off) = (int64_t)v; break;
    case T_SIZE: *(size_t *)(void *)(base + o->off) = (size_t)v; break;
    case T_SEC: *(double *)(void *)(base + o->off) = v; break;
    case T_MS: *(int *)(void *)(base + o->off) = (int)ceil(v * 1000.0); break;
    default: break;
    }
    return SP_OK;
}

static sp_status_t
set_string(sp_serve_config_t *c, const opt_t *o, const char *v, const char *src, char *err,
           size_t err_len)
{
    if (strlen(v) >= o->cap) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s is too long", src);
    }
    snprintf((char *)c + o->off, o->cap, "%s", v);
    return SP_OK;
}

static const opt_t *
find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        const char *n = opts[i].name;
        if (strlen(n) != len) {
            continue;
        }
        size_t k = 0;
        while (k < len && (n[k] == name[k] || (n[k] == '-' && name[k] == '_'))) {
            k++;
        }
        if (k == len) {
            return &opts[i];
        }
    }
    return NULL;
}

/* "true"/"1"/"yes"/"on" or "false"/"0"/"no"/"off" (environment values of boolean options). */
static int
parse_bool_word(const char *v)
{
    static const char *const yes[] = {"1", "true", "yes", "on", "TRUE", "True", "YES", "Yes", "ON", "On"};
    static const char *const no[] = {"0", "false", "no", "off", "FALSE", "False", "NO", "No", "OFF", "Off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcmp(v, yes[i]) == 0) {
            return 1;
        }
        if (strcmp(v, no[i]) == 0) {
            return 0;
        }
    }
    return -1;
}

/* One option's value given as text (a flag's argument or an environment
 * variable): the same checks whichever way it came. */
static sp_status_t
set_text(sp_serve_config_t *c, const opt_t *o, const char *val, const char *src, char *err,
         size_t err_len)
{
    if (o->type == T_STR) {
        return set_string(c, o, val, src, err, err_len);
    }
    if (o->type == T_BOOL) {
        int b = parse_bool_word(val);
        if (b < 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "%s expects true or false, got '%s'", src, val);
        }
        *(bool *)(void *)((char *)c + o->off) = b == 1;
        return SP_OK;
    }
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno != 0 || end == val || *end != '\0') {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s expects a number, got '%s'", src, val);
    }
    return set_number(c, o, v, src, err, err_len);
}

/* A parsed configuration document (JSON or YAML): the same keys as the flags. */
static sp_status_t
apply_document(sp_serve_config_t *c, const char *path, json_t *root, char *err, size_t err_len)
{
    if (!json_is_object(root)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "--config %s: expected an object of options", path);
    }
    const char *key;
    json_t *v;
    sp_status_t st = SP_OK;
    json_object_foreach(root, key, v) {
        char src[300];
        snprintf(src, sizeof src, "%s: \"%s\"", path, key);
        if (strcmp(key, "models") == 0 || strcmp(key, "model") == 0) {
            if (json_is_object(v)) {
                const char *mk;
                json_t *mv;
                json_object_foreach(v, mk, mv) {
                    char spec[1200];
                    if (!json_is_string(mv)) {
                        st = sp_errf(err, err_len, SP_ERR_INVALID, "%s.%s must be a file name", src, mk);
                        break;
                    }
                    snprintf(spec, sizeof spec, "%s=%s", mk, json_string_value(mv));
                    if ((st = add_model(c, spec, src, err, err_len)) != SP_OK) {
                        break;
                    }
                }
            } else if (json_is_string(v)) {
                st = add_model(c, json_string_value(v), src, err, err_len);
            } else {
                st = sp_errf(err, err_len, SP_ERR_INVALID, "%s must be an object {name: file}", src);
            }
        } else {
            const opt_t *o = find_opt(key, strlen(key));
            if (o == NULL || o->type == T_CONFIG || o->type == T_MODEL) {
                st = sp_errf(err, err_len, SP_ERR_INVALID, "%s: unknown option", src);
            } else if (o->type == T_STR) {
                st = json_is_string(v) ? set_string(c, o, json_string_value(v), src, err, err_len)
                                       : sp_errf(err, err_len, SP_ERR_INVALID, "%s must be a string", src);
            } else if (o->type == T_BOOL) {
                if (json_is_boolean(v)) {
                    *(bool *)(void *)((char *)c + o->off) = json_is_true(v);
                } else {
                    st = sp_errf(err, err_len, SP_ERR_INVALID, "%s must be true or false", src);
                }
            } else {
                st = json_is_number(v) ? set_number(c, o, json_number_value(v), src, err, err_len)
                                       : sp_errf(err, err_len, SP_ERR_INVALID, "%s must be a number", src);
            }
        }
        if (st != SP_OK) {
            break;
        }
    }
    return st;
}

static bool
ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* --config FILE: JSON, or YAML when the name ends in .yaml or .yml. */
static sp_status_t
load_file(sp_serve_config_t *c, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return sp_errf(err, err_len, SP_ERR_IO, "--config %s: %s", path, strerror(errno));
    }
    char *buf = sp_malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    bool too_big = buf && n == (1 << 20);
    fclose(f);
    if (buf == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "--config: out of memory");
    }
    if (too_big) {
        sp_free(buf);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "--config %s: larger than 1 MiB", path);
    }
    json_t *root = NULL;
    char perr[256];
    bool yaml = ends_with(path, ".yaml") || ends_with(path, ".yml");
    sp_status_t st = yaml ? sp_yaml_parse(buf, n, 32, &root, perr, sizeof perr)
                          : sp_json_parse(buf, n, 32, &root, perr, sizeof perr);
    sp_free(buf);
    if (st != SP_OK) {
        return sp_errf(err, err_len, st, "--config %s: %s", path, perr);
    }
    st = apply_document(c, path, root, err, err_len);
    json_decref(root);
    return st;
}

/* SAMPAN_ + the long flag in capitals with '-' as '_': --kv-blocks is SAMPAN_KV_BLOCKS. */
static void
env_name(const opt_t *o, char *out, size_t cap)
{
    size_t k = (size_t)snprintf(out, cap, "SAMPAN_");
    for (const char *p = o->name; *p && k + 1 < cap; p++) {
        out[k++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
    }
    out[k] = '\0';
}

/* SAMPAN_* variables that are not flags: read elsewhere (kernels, CUDA, the
 * encryption key, build and test scripts), so no warning names them. */
static const char *const env_other[] = {
    "SAMPAN_CPU", "SAMPAN_MODEL_KEY", "SAMPAN_CUDA_LIB", "SAMPAN_CUDA_WEIGHTS",
    "SAMPAN_CUDA_CANDIDATES", "SAMPAN_CUDA_PINNED", "SAMPAN_CUDA_GRAPHS", "SAMPAN_NVML_LIB",
    "SAMPAN_ONNX_CUDA_LIB", "SAMPAN_ONNX_ENGINE", "SAMPAN_ONNX_ARENA",
    "SAMPAN_VERSION", "SAMPAN_BIN", "SAMPAN_LLAMACPP_DIR", NULL,
};

/* The environment layer: every option as SAMPAN_<FLAG>, over the file and under
 * the flags. SAMPAN_MODEL holds one or more NAME=FILE separated by commas (a
 * path with a comma goes in a flag or the file). SAMPAN_* variables that name
 * no option are listed in c->env_unknown for serve to warn about. */
static sp_status_t
apply_env(sp_serve_config_t *c, char *err, size_t err_len)
{
    extern char **environ;
    c->env_unknown[0] = '\0';
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "SAMPAN_", 7) != 0) {
            continue;
        }
        const char *eq = strchr(*e, '=');
        if (eq == NULL) {
            continue;
        }
        char name[128];
        size_t nl = (size_t)(eq - *e);
        if (nl >= sizeof name) {
            nl = sizeof name - 1;
        }
        memcpy(name, *e, nl);
        name[nl] = '\0';
        const char *val = eq + 1;
        const opt_t *o = NULL;
        for (size_t i = 0; i < sizeof opts / sizeof opts[0] && o == NULL; i++) {
            char en[128];
            env_name(&opts[i], en, sizeof en);
            if (strcmp(en, name) == 0) {
                o = &opts[i];
            }
        }
        bool other = false;
        for (const char *const *k = env_other; *k && !other; k++) {
            other = strcmp(*k, name) == 0;
        }
        if (o == NULL || o->type == T_CONFIG) {
            if (o == NULL && !other) {
                size_t used = strlen(c->env_unknown);
                snprintf(c->env_unknown + used, sizeof c->env_unknown - used, "%s%s", used ? "," : "",
                         name);
            }
            continue;
        }
        char src[160];
        snprintf(src, sizeof src, "environment %s", name);
        sp_status_t st = SP_OK;
        if (o->type == T_MODEL) {
            c->n_models = 0; /* the environment's list replaces the file's */
            char spec[1200];
            for (const char *p = val; *p && st == SP_OK;) {
                const char *comma = strchr(p, ',');
                size_t sl = comma ? (size_t)(comma - p) : strlen(p);
                if (sl >= sizeof spec) {
                    return sp_errf(err, err_len, SP_ERR_INVALID, "%s: an entry is too long", src);
                }
                memcpy(spec, p, sl);
                spec[sl] = '\0';
                if (sl > 0) {
                    st = add_model(c, spec, src, err, err_len);
                }
                p = comma ? comma + 1 : p + sl;
            }
        } else {
            st = set_text(c, o, val, src, err, err_len);
        }
        if (st != SP_OK) {
            return st;
        }
    }
    return SP_OK;
}

/* The demo model next to the binary (build/sampan -> ../models) when the
 * working directory is not the repository. */
static void
default_model(sp_serve_config_t *c)
{
    sp_serve_model_cfg_t *m = &c->models[0];
    snprintf(m->name, sizeof m->name, "%s", SP_SERVE_DEMO_NAME);
    snprintf(m->path, sizeof m->path, "%s", SP_SERVE_DEMO_MODEL);
    c->n_models = 1;
    if (access(m->path, R_OK) == 0) {
        return;
    }
    char exe[900];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        return;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL) {
        return;
    }
    *slash = '\0';
    char alt[1024];
    snprintf(alt, sizeof alt, "%s/../%s", exe, SP_SERVE_DEMO_MODEL);
    if (access(alt, R_OK) == 0) {
        snprintf(m->path, sizeof m->path, "%s", alt);
    }
}

sp_status_t
sp_config_parse(int argc, char **argv, sp_serve_config_t *c, bool *help, char *err,
                size_t err_len)
{
    *help = false;
    sp_config_defaults(c);
    /* The config file first (--config, else SAMPAN_CONFIG), then the environment,
     * then the flags: each layer overrides the one before wherever it speaks. */
    bool config_flag = false;
    for (int i = 1; i < argc; i++) {
        config_flag |= strncmp(argv[i], "--config=", 9) == 0 || strcmp(argv[i], "--config") == 0;
    }
    const char *env_config = getenv("SAMPAN_CONFIG");
    if (!config_flag && env_config != NULL && env_config[0] != '\0') {
        sp_status_t st = load_file(c, env_config, err, err_len);
        if (st != SP_OK) {
            return st;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--config=", 9) == 0) {
            sp_status_t st = load_file(c, a + 9, err, err_len);
            if (st != SP_OK) {
                return st;
            }
        } else if (strcmp(a, "--config") == 0 && i + 1 < argc) {
            sp_status_t st = load_file(c, argv[++i], err, err_len);
            if (st != SP_OK) {
                return st;
            }
        }
    }
    sp_status_t env_st = apply_env(c, err, err_len);
    if (env_st != SP_OK) {
        return env_st;
    }
    int file_models = c->n_models;
    bool flag_models = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *help = true;
            return SP_OK;
        }
        const opt_t *o = NULL;
        const char *val = NULL;
        if (a[0] == '-' && a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t nl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            o = find_opt(a + 2, nl);
            val = eq ? eq + 1 : NULL;
        } else if (a[0] == '-' && a[1] && !a[2]) {
            for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
                if (opts[k].short_name == a[1]) {
                    o = &opts[k];
                }
            }
        }
        if (o == NULL) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "unknown option '%s'", a);
        }
        if (o->type == T_BOOL) {
            if (val) {
                return sp_errf(err, err_len, SP_ERR_INVALID, "--%s takes no value", o->name);
            }
            *(bool *)(void *)((char *)c + o->off) = true;
            continue;
        }
        if (val == NULL) {
            if (i + 1 >= argc) {
                return sp_errf(err, err_len, SP_ERR_INVALID, "--%s needs a value", o->name);
            }
            val = argv[++i];
        }
        char src[64];
        snprintf(src, sizeof src, "--%s", o->name);
        sp_status_t st = SP_OK;
        switch (o->type) {
        case T_CONFIG:
            break; /* loaded above */
        case T_MODEL:
            if (!flag_models) {
                /* Flags replace the file's model list rather than add to it. */
                c->n_models -= file_models;
                flag_models = true;
            }
            st = add_model(c, val, src, err, err_len);
            break;
        default:
            st = set_text(c, o, val, src, err, err_len);
        }
        if (st != SP_OK) {
            return st;
        }
    }
    if (c->strict_readiness_str[0] == '\0' || strcmp(c->strict_readiness_str, "true") == 0) {
        c->strict_readiness = true;
    } else if (strcmp(c->strict_readiness_str, "false") == 0) {
        c->strict_readiness = false;
    } else {
        return sp_errf(err, err_len, SP_ERR_INVALID, "--strict-readiness must be true or false, "
                       "got '%s'", c->strict_readiness_str);
    }
    if (c->model_control_mode[0] == '\0') {
        snprintf(c->model_control_mode, sizeof c->model_control_mode, "none");
    } else if (strcmp(c->model_control_mode, "none") != 0 &&
               strcmp(c->model_control_mode, "poll") != 0 &&
               strcmp(c->model_control_mode, "explicit") != 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "--model-control-mode must be none, poll or explicit, got '%s'",
                       c->model_control_mode);
    }
    static const char *const formats[] = {"kv", "json", NULL};
    static const char *const requests[] = {"all", "models", "errors", "none", NULL};
    static const char *const compat[] = {"none", "vllm", "triton", "vllm,triton", "triton,vllm", NULL};
    static const char *const kv_types[] = {"f32", "f16", "q8_0", NULL};
    static const char *const scopes[] = {"tenant", "global", NULL};
    static const char *const reasoning[] = {"auto", "deepseek", "none", NULL};
    if (c->kv_f16 && c->kv_type[0] != '\0' && strcmp(c->kv_type, "f16") != 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "--kv-f16 (the same as --kv-type f16) contradicts --kv-type %s", c->kv_type);
    }
    struct { const char *flag; char *val; size_t cap; const char *const *ok; const char *def; } en[] = {
        {"--log-format", c->log_format, sizeof c->log_format, formats, "kv"},
        {"--log-requests", c->log_requests, sizeof c->log_requests, requests, c->verbose ? "all" : "models"},
        {"--metrics-compat", c->metrics_compat, sizeof c->metrics_compat, compat, "none"},
        {"--kv-type", c->kv_type, sizeof c->kv_type, kv_types, c->kv_f16 ? "f16" : "f32"},
        {"--prefix-cache-scope", c->prefix_cache_scope, sizeof c->prefix_cache_scope, scopes, "tenant"},
        {"--reasoning-format", c->reasoning_format, sizeof c->reasoning_format, reasoning, "auto"},
    };
    for (size_t k = 0; k < sizeof en / sizeof en[0]; k++) {
        if (en[k].val[0] == '\0') {
            snprintf(en[k].val, en[k].cap, "%s", en[k].def);
        }
        bool found = false;
        for (const char *const *o = en[k].ok; *o; o++) {
            found |= strcmp(*o, en[k].val) == 0;
        }
        if (!found) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "%s: unknown value '%s'", en[k].flag,
                           en[k].val);
        }
    }
    if (c->n_models == 0 && c->model_repository[0] == '\0') {
        default_model(c);
    }
    return SP_OK;
}
