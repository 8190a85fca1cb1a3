/*
 * config.h - `sampan serve` settings: defaults, a JSON config file, flags.
 *
 * Precedence: built-in defaults < the file given with --config < flags. The
 * file uses the long flag names as keys (either "max-tokens" or "max_tokens"),
 * plus "models": {"name": "FILE", ...}. Every value is range-checked; an
 * error names the flag or key.
 */
#ifndef SP_SERVING_CONFIG_H
#define SP_SERVING_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"
#include "http/http.h"

#define SP_SERVE_MAX_MODELS 16   /* --model flags */
#define SP_SERVE_MAX_ENTRIES 256 /* model versions known to the registry at once */
#define SP_SERVE_DEMO_MODEL "models/stories260K.gguf"
#define SP_SERVE_DEMO_NAME "stories260K"

typedef struct sp_serve_model_cfg {
    char name[128];
    char path[1024];
} sp_serve_model_cfg_t;

typedef struct sp_serve_config {
    char host[256];
    char env_unknown[512];    /* SAMPAN_* variables that name no option (comma-separated), for a warning */
    int port;
    sp_serve_model_cfg_t models[SP_SERVE_MAX_MODELS];
    int n_models;
    char model_repository[1024]; /* "" = none; <repo>/<model>/<version>/ (docs/repository.md),
                                  * or s3://BUCKET/PREFIX (mirrored locally: s3repo.h) */
    char repository_cache[1024]; /* where s3:// repositories are mirrored ("" = ~/.cache/sampan/s3) */
    char strict_readiness_str[8]; /* --strict-readiness true|false ("" = true) */
    bool strict_readiness;        /* resolved from it */
    char model_control_mode[16]; /* "none" (load all at start), "poll" or "explicit" (API) */
    double repository_poll_s; /* poll mode: seconds between rescans */
    size_t model_copy_max;    /* model files up to this size are served from a private copy */
    char key_dir[1024];       /* "" = none; where a load request's encryption_key_file is found */
    char memory_budget[256];  /* "" = 80% of every device; "60%", "2G", "cpu=2G,cuda:0=70%" */
    double load_timeout_s;    /* a request's wait for an on-demand load */
    double keep_alive_s;      /* idle unload after this many seconds without a request
                                 (Ollama's keep_alive default); < 0 = never (the default) */
    char backends_dir[1024];  /* "" = backends/ next to the binary, then /usr/lib/sampan/backends */
    size_t response_cache_bytes; /* the response cache's bound; 0 = no cache (respcache.h) */
    int64_t responses_store;  /* stored /v1/responses answers at most (resp_store.h) */
    size_t responses_store_bytes; /* ... and their bytes at most */
    char chat_template[64];   /* built-in template name for every model, "" = the file's */
    char reasoning_format[16]; /* "auto"/"deepseek": thinking apart, "none": inline */
    int64_t reasoning_budget; /* chat requests' default reasoning budget (api/budget.h); -1 none */
    char chat_template_file[1024]; /* Jinja template file for every model, "" = none */
    int threads;              /* per slot context; 0 = one per core */
    int64_t ctx_size;         /* per slot; 0 = the model's, at most 4096 */
    int parallel;             /* slots per model */
    int http_threads;         /* event-loop threads */
    int queue;                /* waiting sequences per model and tier */
    int64_t queue_premium, queue_standard, queue_batch; /* per-tier bounds; -1 = queue */
    int step_tokens;          /* tokens per engine step (decode rows + prefill chunks) */
    int64_t kv_blocks;        /* KV pool blocks of 16 positions; 0 = sized from parallel x ctx */
    bool kv_f16;              /* --kv-f16: the old spelling of --kv-type f16 */
    bool kv_swa_full;         /* --kv-swa-full: sliding-window layers keep every position */
    bool no_repack;           /* --no-repack: no load-time weight repack (A/B) */
    char kv_type[8];          /* --kv-type f32|f16|q8_0 (validated; "" = f32, or f16 with
                                 --kv-f16); repository models: parameters.kv_cache_type */
    double tpot_target_ms;    /* adaptive step budget: p99 time per output token target; 0 = off */
    char draft_model[1024];   /* --draft-model: speculative decoding for --model; "" = off */
    int spec_tokens;          /* --spec-tokens: proposals per step (default 4) */
    int max_tokens;           /* cap on max_tokens of one request */
    int max_n;                /* cap on n */
    int max_logprobs;         /* cap on logprobs / top_logprobs */
    int max_embed_inputs;     /* inputs per /v1/embeddings request */
    int json_depth;           /* nesting limit of request bodies */
    double drain_timeout_s;   /* SIGTERM: time to finish requests in flight */
    double drain_delay_s;     /* SIGTERM: seconds not ready but still serving, before the drain */
    double request_timeout_s; /* per request wall-clock limit (0 = none) */
    char api_key[256];        /* "" = no authentication (one key, tenant "default") */
    char tenants_file[1024];  /* "" = none; API keys, scopes, tiers, limits (docs/security.md) */
    char prefix_cache_scope[8]; /* "tenant" (default): prefix-cache blocks shared within a
                                   tenant only; "global": across tenants (docs/security.md) */
    bool insecure_open;       /* allow a non-loopback bind without keys */
    bool metrics_open;        /* /metrics without the metrics scope */
    char tls_cert[1024];      /* PEM certificate chain; "" = no TLS */
    char tls_key[1024];       /* PEM private key */
    char tls_client_ca[1024]; /* PEM CA bundle: require client certificates (mutual TLS) */
    int tls_port;             /* 0 = TLS on --port; else plain HTTP on --port and TLS here */
    char grpc_port[16];       /* --grpc-port: "" = 8001 when free, N, "0" or "off" = no gRPC */
    char cors_origins[1024];  /* "" = CORS off; comma-separated allowed origins */
    bool verbose;
    char log_format[8];       /* "kv" or "json" */
    char log_requests[8];     /* "all", "models", "errors", "none" */
    bool log_prompts;         /* log prompts and outputs, masked */
    char metrics_compat[16];  /* "none", "vllm", "triton" or "vllm,triton" */
    char otlp_endpoint[512];  /* "" = tracing off; OTLP/HTTP collector (docs/tracing.md) */
    char otel_service_name[128]; /* resource service.name of the spans (default "sampan") */
    double trace_sample_ratio; /* new traces (no incoming traceparent) sampled: 0..1 (default 1) */
    int otlp_max_queue;       /* spans waiting for export; more are dropped (default 2048) */
    double otlp_timeout_s;    /* one export POST (default 5) */
    sp_http_limits_t limits;
} sp_serve_config_t;

void sp_config_defaults(sp_serve_config_t *c);
/* Parse argv (argv[0] = "serve"). Returns SP_OK, or an error with err set;
 * *help is set when --help was given. */
sp_status_t sp_config_parse(int argc, char **argv, sp_serve_config_t *c, bool *help, char *err,
                            size_t err_len);
/* The usage text. */
extern const char sp_config_usage[];

#endif /* SP_SERVING_CONFIG_H */
