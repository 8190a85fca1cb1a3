/*
 * ollama.c - Ollama's API beside the OpenAI one, so Ollama's clients (the
 * `ollama` npm and Python packages, Open WebUI, Continue) work unchanged:
 * GET /api/version, /api/tags, /api/ps; POST /api/show, /api/embed and the
 * older /api/embeddings.
 *
 * Models are the served ones under their own names; Ollama's default tag
 * ":latest" is accepted on any name (Ollama's clients add it). Errors are
 * Ollama's {"error": "..."}: the Ollama dialect (ollama_chat.c) claims the
 * /api prefix, so sp_api_error writes that shape for the shared parts too
 * (model lookup, admission, 429s). Embeddings run through the one request lifecycle (request.h):
 * the same scheduler, tenants, quotas, metrics, tracing and logs as
 * /v1/embeddings; tokenizing runs on a preparation worker (offload.h).
 *
 * keep_alive: each request sets its model's idle deadline (registry.h,
 * sp_served_keep_alive): the manager unloads the model keep_alive after its
 * last request ends (0: as soon as the requests on it end; negative: never),
 * and the next request loads it again. Absent, the server's --keep-alive
 * applies (never unless set; Ollama's own default is 5 minutes). /api/ps
 * reports the deadline as expires_at.
 *
 * Threads: every handler runs on a loop thread; the tokenizing on a worker
 * touches only its request's holder and model.
 * Memory: one ol_emb_t per embedding request, freed by the lifecycle's
 * sp_api_finish on every path; the answers are built in its jbuf.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "core/utf8.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "sampan/version.h"
#include "text/tokenizer.h"
#include "chat/chat.h"
#include "device/device.h"
#include "engine/encoder.h"
#include "api/api.h"
#include "api/chat_input.h"
#include "api/json_body.h"
#include "api/offload.h"
#include "api/ollama.h"
#include "api/request.h"

/* The Ollama API version whose shapes these routes follow (GET /api/version). */
#define OL_API_VERSION "0.12.0"

/* --------------------------------------------------------------- helpers */

/* RFC 3339 time of unix seconds t, as Ollama writes modified_at. */
static void
rfc3339(int64_t t, char *buf, size_t cap)
{
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* llama.cpp's general.file_type values, as Ollama names them in quantization_level. */
static const char *
file_type_name(int64_t ft)
{
    static const struct { int64_t v; const char *name; } names[] = {
        {0, "F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {8, "Q5_0"},
        {9, "Q5_1"}, {10, "Q2_K"}, {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"},
        {14, "Q4_K_S"}, {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},
        {19, "IQ2_XXS"}, {20, "IQ2_XS"}, {21, "Q2_K_S"}, {22, "IQ3_XS"}, {23, "IQ3_XXS"},
        {24, "IQ1_S"}, {25, "IQ4_NL"}, {26, "IQ3_S"}, {27, "IQ3_M"}, {28, "IQ2_S"},
        {29, "IQ2_M"}, {30, "IQ4_XS"}, {31, "IQ1_M"}, {32, "BF16"}, {36, "TQ1_0"},
        {37, "TQ2_0"}, {38, "MXFP4"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (names[i].v == ft) {
            return names[i].name;
        }
    }
    return NULL;
}

/* The weights' type as Ollama reports it: general.file_type when the file
 * names one, else the type of the most bytes of weights. */
static const char *
quant_level(const sp_gguf_t *g)
{
    int64_t ft;
    if (sp_gguf_get_int(g, "general.file_type", &ft, NULL, 0) == SP_OK && file_type_name(ft)) {
        return file_type_name(ft);
    }
    uint64_t bytes[64] = {0};
    int best = -1;
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        if ((unsigned)t->type < 64) {
            bytes[t->type] += t->nbytes;
            if (best < 0 || bytes[t->type] > bytes[best]) {
                best = (int)t->type;
            }
        }
    }
    return best < 0 ? "unknown" : sp_type_name(best);
}

/* "260.0K", "1.1B": the parameter count as Ollama prints parameter_size. */
static void
param_size(const sp_gguf_t *g, char *buf, size_t cap)
{
    double n = 0;
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        double e = 1;
        for (int d = 0; d < t->n_dims; d++) {
            e *= (double)t->ne[d];
        }
        n += e;
    }
    if (n >= 1e9) {
        snprintf(buf, cap, "%.1fB", n / 1e9);
    } else if (n >= 1e6) {
        snprintf(buf, cap, "%.1fM", n / 1e6);
    } else {
        snprintf(buf, cap, "%.1fK", n / 1e3);
    }
}

/* A stable 64-hex identity of a loaded model: its name, version and the
 * stamps of what it was built from (registry.h's sig). Ollama's digest is the
 * blob's sha256; hashing a multi-gigabyte file for a listing is not worth it,
 * and clients only compare digests for equality. */
static void
model_digest(const sp_served_model_t *m, char out[65])
{
    uint64_t h[4] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9e3779b97f4a7c15ull,
                     0xc2b2ae3d27d4eb4full};
    for (int k = 0; k < 4; k++) {
        for (const char *p = m->name; *p; p++) {
            h[k] = (h[k] ^ (uint8_t)*p) * 0x100000001b3ull;
        }
        h[k] ^= m->sig + (uint64_t)m->version * 0x9e3779b97f4a7c15ull + (uint64_t)k;
        h[k] ^= h[k] >> 29;
        h[k] *= 0xbf58476d1ce4e5b9ull;
        h[k] ^= h[k] >> 32;
    }
    snprintf(out, 65, "%016llx%016llx%016llx%016llx", (unsigned long long)h[0],
             (unsigned long long)h[1], (unsigned long long)h[2], (unsigned long long)h[3]);
}

/* Ollama's "details" object of a loaded model. */
static void
write_details(sp_jbuf_t *b, const sp_served_model_t *m)
{
    const sp_gguf_t *g = sp_model_gguf(m->model);
    const char *arch = sp_model_hparams(m->model)->arch;
    char ps[32];
    param_size(g, ps, sizeof ps);
    sp_jbuf_lit(b, "{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":");
    sp_jbuf_cstr(b, arch);
    sp_jbuf_lit(b, ",\"families\":[");
    sp_jbuf_cstr(b, arch);
    sp_jbuf_lit(b, "],\"parameter_size\":");
    sp_jbuf_cstr(b, ps);
    sp_jbuf_lit(b, ",\"quantization_level\":");
    sp_jbuf_cstr(b, quant_level(g));
    sp_jbuf_lit(b, "}");
}

/* The name a request gives, without Ollama's default tag ":latest" unless a
 * model (or adapter) is called that way: "stories260K:latest" is
 * "stories260K". */
static size_t
strip_latest(sp_serving_t *s, const char *name, size_t len)
{
    static const char tag[] = ":latest";
    const size_t tl = sizeof tag - 1;
    if (len <= tl || memcmp(name + len - tl, tag, tl) != 0) {
        return len;
    }
    sp_served_model_t *m = NULL;
    char reason[8];
    bool exact = false;
    if (sp_registry_acquire(s, name, len, NULL, 0, false, &m, reason, sizeof reason) == SP_ACQ_OK) {
        exact = strlen(m->name) == len && memcmp(m->name, name, len) == 0;
        sp_served_release(m);
    }
    return exact ? len : len - tl; /* a model of that very name keeps it */
}

/*
 * The model a request names in `model` (or Ollama's older `name`), with a
 * reference and its LoRA adapter; answers the error itself (or parks the
 * request while the model loads on demand, then runs retry again) and
 * returns NULL. Tensor models are not language models: 400.
 */
static sp_served_model_t *
ol_model(sp_serving_t *s, sp_http_req_t *r, const json_t *body, sp_route_fn retry,
         const sp_route_params_t *p, sp_req_adapter_t *ad, size_t *name_len)
{
    const json_t *mv = json_object_get(body, "model");
    if (mv == NULL || json_is_null(mv)) {
        mv = json_object_get(body, "name");
    }
    if (!json_is_string(mv) || json_string_length(mv) == 0) {
        sp_api_error(r, 400, NULL, "model", NULL, "model is required");
        return NULL;
    }
    const char *name = json_string_value(mv);
    size_t len = strip_latest(s, name, json_string_length(mv));
    if (name_len != NULL) {
        *name_len = len;
    }
    sp_served_model_t *m;
    sp_str_t none = {NULL, 0};
    if (!sp_api_model_for(s, r, name, len, none, retry, p, &m)) {
        return NULL;
    }
    if (m->be != NULL) {
        sp_api_error(r, 400, NULL, "model", NULL,
                     "model %s is a %s model, not a language model: use /v2/models/%s/infer",
                     m->name, m->be->name, m->name);
        sp_served_release(m);
        return NULL;
    }
    memset(ad, 0, sizeof *ad);
    if (!sp_adapter_for(s, r, m, name, len, ad)) {
        sp_served_release(m);
        return NULL;
    }
    return m;
}

sp_served_model_t *
sp_ollama_model(sp_serving_t *s, sp_http_req_t *r, const json_t *body, sp_route_fn retry,
                const sp_route_params_t *p, size_t *name_len)
{
    sp_req_adapter_t ad;
    sp_served_model_t *m = ol_model(s, r, body, retry, p, &ad, name_len);
    if (m != NULL) {
        sp_req_adapter_release(&ad); /* checked; the pipeline takes its own */
    }
    return m;
}

int64_t
sp_ollama_keep_default(const sp_serving_t *s)
{
    return s->cfg.keep_alive_s < 0 ? -1 : (int64_t)(s->cfg.keep_alive_s * 1e9);
}

int
sp_ollama_keep_alive(const json_t *body, int64_t def_ns, int64_t *keep_ns, char *err, size_t cap)
{
    *keep_ns = def_ns;
    const json_t *k = json_object_get(body, "keep_alive");
    if (k == NULL || json_is_null(k)) {
        return 0;
    }
    double secs = 0;
    bool ok = false;
    if (json_is_number(k)) {
        secs = json_number_value(k);
        ok = true;
    } else if (json_is_string(k)) {
        /* A Go duration ("5m", "1h30m", "-1s") or plain seconds ("300", "-1"). */
        const char *p = json_string_value(k);
        char *end;
        double v = strtod(p, &end);
        ok = end != p;
        if (ok && *end != '\0') {
            ok = false;
            const char *q = p;
            double total = 0;
            bool neg = *q == '-';
            q += neg || *q == '+';
            while (*q) {
                double x = strtod(q, &end);
                if (end == q) {
                    break;
                }
                q = end;
                double unit = 0;
                if (strncmp(q, "ms", 2) == 0) {
                    unit = 1e-3, q += 2;
                } else if (*q == 'h') {
                    unit = 3600, q++;
                } else if (*q == 'm') {
                    unit = 60, q++;
                } else if (*q == 's') {
                    unit = 1, q++;
                } else {
                    break;
                }
                total += x * unit;
                ok = *q == '\0';
            }
            v = neg ? -total : total;
        }
        secs = v;
    }
    if (!ok || !isfinite(secs)) {
        snprintf(err, cap, "keep_alive must be a number of seconds or a duration such as \"5m\"");
        return -1;
    }
    /* negative: loaded for good; past ten years: the same in practice */
    *keep_ns = secs < 0 || secs > 315360000.0 ? -1 : (int64_t)(secs * 1e9);
    return 0;
}

/* --------------------------------------------------------- listing routes */

static void
h_version(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)p;
    (void)ud;
    static const char body[] = "{\"version\":\"" OL_API_VERSION "\",\"server\":\"sampan/" SAMPAN_VERSION "\"}";
    sp_http_respond(r, 200, "application/json", body, sizeof body - 1);
}

/*
 * GET /api/tags (every model a request may name: loaded, or loadable on
 * demand) and GET /api/ps (the loaded ones, with their memory). A tenant with
 * a model list sees only those.
 */
static void
list_models(sp_http_req_t *r, sp_serving_t *s, bool ps)
{
    /* A tenant's model list, copied before the registry's lock is taken. */
    sp_tenant_state_t *tenant = sp_http_req_user(r);
    const bool restricted = sp_auth_restricted(tenant);
    char (*names)[129] = NULL;
    int32_t n_names = 0;
    if (restricted) {
        names = sp_malloc(sizeof(char[SP_TENANT_MODELS_MAX][129]));
        if (names == NULL) {
            sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
            return;
        }
        n_names = sp_auth_models(tenant, names, SP_TENANT_MODELS_MAX);
    }
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    sp_jbuf_lit(&b, "{\"models\":[");
    int found = 0;
    sp_registry_t *reg = &s->reg;
    pthread_mutex_lock(&reg->mu);
    for (int i = 0; i < SP_SERVE_MAX_ENTRIES; i++) {
        const sp_model_entry_t *e = &reg->entry[i];
        bool allowed = !restricted;
        for (int32_t k = 0; k < n_names && !allowed; k++) {
            allowed = strcmp(names[k], e->name) == 0;
        }
        if (!e->used || !allowed) {
            continue;
        }
        /* one row per name: its newest ready version, else its first entry */
        const sp_model_entry_t *best = NULL;
        bool first = true;
        for (int k = 0; k < SP_SERVE_MAX_ENTRIES; k++) {
            const sp_model_entry_t *o = &reg->entry[k];
            if (!o->used || strcmp(o->name, e->name) != 0) {
                continue;
            }
            if (k < i) {
                first = false;
                break;
            }
            if (o->live && o->state == SP_REPO_READY && o->live->be == NULL &&
                (best == NULL || o->version > best->version)) {
                best = o;
            }
        }
        bool loadable = e->state == SP_REPO_LOADING || (e->on_demand && !e->demand_failed);
        if (!first || (best == NULL && (ps || !loadable))) {
            continue;
        }
        sp_jbuf_lit(&b, found++ ? ",{\"name\":" : "{\"name\":");
        sp_jbuf_cstr(&b, e->name);
        sp_jbuf_lit(&b, ",\"model\":");
        sp_jbuf_cstr(&b, e->name);
        if (best != NULL) {
            const sp_served_model_t *m = best->live;
            char when[40], dg[65];
            rfc3339(m->created, when, sizeof when);
            model_digest(m, dg);
            /* size: the file (tags), or the memory it holds (ps), as Ollama reports them */
            sp_jbuf_printf(&b, ",\"modified_at\":\"%s\",\"size\":%llu,\"digest\":\"%s\",\"details\":",
                           when, (unsigned long long)(ps ? m->mem_bytes
                                                         : sp_gguf_file_size(sp_model_gguf(m->model))),
                           dg);
            write_details(&b, m);
            if (ps) {
                uint64_t vram = 0;
                for (int d = 0; d < reg->n_dev && d < SP_REG_MAX_DEVICES; d++) {
                    if (sp_devices_get(reg->devs, d)->kind != SP_DEVICE_CPU) {
                        vram += m->charge[d];
                    }
                }
                /* the idle deadline (keep_alive); none: Ollama's "forever", a far date */
                char exp[48] = "2318-01-01T00:00:00Z";
                int64_t now = sp_time_ns();
                int64_t due = sp_served_expiry_locked(m, now);
                if (due != INT64_MAX) {
                    struct timespec wall;
                    clock_gettime(CLOCK_REALTIME, &wall);
                    int64_t at = (int64_t)wall.tv_sec * 1000000000LL + wall.tv_nsec + (due - now);
                    char sec[40];
                    rfc3339(at / 1000000000LL, sec, sizeof sec);
                    snprintf(exp, sizeof exp, "%.19s.%09lldZ", sec, (long long)(at % 1000000000LL));
                }
                sp_jbuf_printf(&b, ",\"expires_at\":\"%s\",\"size_vram\":%llu,"
                               "\"context_length\":%lld",
                               exp, (unsigned long long)vram, (long long)m->n_ctx);
            }
        } else {
            char when[40];
            rfc3339(s->started_unix, when, sizeof when);
            sp_jbuf_printf(&b, ",\"modified_at\":\"%s\",\"size\":0,\"digest\":\"\",\"details\":"
                           "{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":\"\","
                           "\"families\":null,\"parameter_size\":\"\",\"quantization_level\":\"\"}",
                           when);
        }
        sp_jbuf_lit(&b, "}");
    }
    pthread_mutex_unlock(&reg->mu);
    sp_free(names);
    sp_jbuf_lit(&b, "]}");
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
}

static void
h_tags(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)p;
    list_models(r, ud, false);
}

static void
h_ps(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    (void)p;
    list_models(r, ud, true);
}

/* A metadata value for model_info: numbers, strings and booleans as they are;
 * arrays (the vocabulary, merges) as null unless `verbose`, as Ollama does. */
static void
write_kv(sp_jbuf_t *b, const sp_gguf_t *g, int64_t i, bool verbose)
{
    sp_str_t key = sp_gguf_kv_key(g, i);
    char k[256];
    snprintf(k, sizeof k, "%.*s", (int)key.len, key.ptr);
    sp_gguf_type_t t = sp_gguf_kv_type(g, i);
    int64_t iv;
    double dv;
    bool bv;
    sp_str_t sv;
    sp_gguf_arr_t av;
    if (t == SP_GGUF_TYPE_BOOL && sp_gguf_get_bool(g, k, &bv, NULL, 0) == SP_OK) {
        sp_jbuf_lit(b, bv ? "true" : "false");
    } else if ((t == SP_GGUF_TYPE_FLOAT32 || t == SP_GGUF_TYPE_FLOAT64) &&
               sp_gguf_get_float(g, k, &dv, NULL, 0) == SP_OK) {
        sp_jbuf_num(b, dv);
    } else if (t == SP_GGUF_TYPE_STRING && sp_gguf_get_str(g, k, &sv, NULL, 0) == SP_OK) {
        sp_jbuf_str(b, sv.ptr, sv.len);
    } else if (t == SP_GGUF_TYPE_ARRAY && verbose && sp_gguf_get_arr(g, k, &av, NULL, 0) == SP_OK) {
        sp_jbuf_lit(b, "[");
        for (uint64_t j = 0; j < av.n; j++) {
            if (j) {
                sp_jbuf_lit(b, ",");
            }
            if (av.strs) {
                sp_jbuf_str(b, av.strs[j].ptr, av.strs[j].len);
            } else if (av.elem_type == SP_GGUF_TYPE_FLOAT32 || av.elem_type == SP_GGUF_TYPE_FLOAT64) {
                sp_jbuf_num(b, sp_gguf_arr_float(&av, j));
            } else {
                sp_jbuf_int(b, sp_gguf_arr_int(&av, j));
            }
        }
        sp_jbuf_lit(b, "]");
    } else if (t != SP_GGUF_TYPE_ARRAY && sp_gguf_get_int(g, k, &iv, NULL, 0) == SP_OK) {
        sp_jbuf_int(b, iv);
    } else {
        sp_jbuf_lit(b, "null");
    }
}

/* POST /api/show {"model", "verbose"}: the model's details, metadata,
 * template and capabilities. */
static void
h_show(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    sp_serving_t *s = ud;
    json_t *body = sp_api_json_body(s, r, h_show, p);
    if (body == NULL) {
        return;
    }
    sp_req_adapter_t ad;
    sp_served_model_t *m = ol_model(s, r, body, h_show, p, &ad, NULL);
    if (m == NULL) {
        json_decref(body);
        return;
    }
    sp_json_err_t e = {{0}, NULL};
    bool verbose = false;
    if (sp_json_get_bool(body, "verbose", &verbose, &e) < 0) {
        sp_api_error(r, 400, NULL, e.param, NULL, "%s", e.msg);
        goto out;
    }
    const sp_gguf_t *g = sp_model_gguf(m->model);
    sp_jbuf_t b;
    sp_jbuf_init(&b);
    /* the template in use (the file's, a --chat-template-file, or a built-in) */
    sp_str_t tmpl = {NULL, 0};
    if (m->tmpl != NULL) {
        tmpl.ptr = sp_chat_template_source(m->tmpl, &tmpl.len);
    }
    char when[40];
    rfc3339(m->created, when, sizeof when);
    sp_jbuf_lit(&b, "{\"license\":\"\",\"modelfile\":");
    sp_jbuf_printf(&b, "\"# served by sampan from %s\\nFROM %s\\n\"", m->name, m->name);
    sp_jbuf_printf(&b, ",\"parameters\":\"num_ctx %lld\",\"template\":", (long long)m->n_ctx);
    sp_jbuf_str(&b, tmpl.ptr ? tmpl.ptr : "", tmpl.len);
    sp_jbuf_lit(&b, ",\"details\":");
    write_details(&b, m);
    sp_jbuf_lit(&b, ",\"model_info\":{");
    int n_kv = 0;
    for (int64_t i = 0; i < sp_gguf_n_kv(g); i++) {
        sp_str_t key = sp_gguf_kv_key(g, i);
        if (key.len > 200 || sp_str_eq_c(key, "tokenizer.chat_template")) {
            continue; /* the template is its own field */
        }
        sp_jbuf_lit(&b, n_kv++ ? "," : "");
        sp_jbuf_str(&b, key.ptr, key.len);
        sp_jbuf_lit(&b, ":");
        write_kv(&b, g, i, verbose);
    }
    sp_jbuf_lit(&b, "},\"capabilities\":[");
    bool encoder = sp_model_is_encoder(m->model);
    if (encoder) {
        sp_jbuf_lit(&b, "\"embedding\"");
    } else {
        sp_jbuf_lit(&b, "\"completion\"");
        /* tools: the template renders a tool list (Ollama's test, on its own templates) */
        if (m->tmpl != NULL && tmpl.ptr != NULL && memmem(tmpl.ptr, tmpl.len, "tools", 5) != NULL) {
            sp_jbuf_lit(&b, ",\"tools\"");
        }
        if (m->tmpl != NULL && sp_chat_reasoning_format(m->tmpl) != SP_CHAT_REASONING_NONE) {
            sp_jbuf_lit(&b, ",\"thinking\"");
        }
    }
    sp_jbuf_printf(&b, "],\"modified_at\":\"%s\"}", when);
    sp_api_reply_json(r, 200, &b);
    sp_jbuf_free(&b);
out:
    sp_req_adapter_release(&ad);
    sp_served_release(m);
    json_decref(body);
}

/* ------------------------------------------------------------ embeddings */

typedef struct ol_emb {
    sp_api_req_t a;      /* the lifecycle (request.h) */
    json_t *body;        /* the request (a reference): the texts point into it */
    bool legacy;         /* /api/embeddings: {"prompt"} in, {"embedding"} out */
    bool truncate;       /* inputs longer than the context are cut (Ollama's default) */
    int n;
    const json_t *texts[SP_SCHED_MAX_N];
    int n_embd;
    int64_t dims;        /* 0: all of n_embd */
    int64_t load_ns;     /* the wait for the model to load (sp_api_model_for's parking) */
    /* the preparation's results (worker) */
    int32_t *toks;       /* n x cap */
    int64_t cap;
    int64_t lens[SP_SCHED_MAX_N];
    int64_t n_prompt;
    char err[512];
    /* the job's */
    float *emb;          /* n x n_embd */
    bool emb_fault;
    sp_jbuf_t out;
} ol_emb_t;

static void
emb_free(sp_api_req_t *a)
{
    ol_emb_t *q = (ol_emb_t *)a;
    json_decref(q->body);
    sp_free(q->toks);
    sp_free(q->emb);
    sp_jbuf_free(&q->out);
    sp_free(q);
}

/* Refusals (429 tokens or queue, scheduler errors) in Ollama's shape: the
 * status carries the meaning, the body says why. */
static int
ol_http(sp_status_t st)
{
    return st == SP_ERR_TOO_LARGE ? 400 : sp_status_http(st);
}

static void
emb_refuse(sp_api_req_t *a, sp_api_refusal_t why, sp_status_t st, const char *msg)
{
    int status = why == SP_API_REFUSED_STATUS ? ol_http(st) : 429;
    sp_api_error(a->http, status, NULL, NULL, NULL, "%s", msg);
}

static int
emb_event(sp_api_req_t *a, const sp_sched_event_t *ev)
{
    ol_emb_t *q = (ol_emb_t *)a;
    if (ev->kind == SP_SCHED_EV_EMBEDDING && ev->n_embd == q->n_embd && ev->index >= 0 &&
        ev->index < q->n) {
        memcpy(q->emb + (size_t)ev->index * (size_t)q->n_embd, ev->embedding,
               (size_t)q->n_embd * sizeof(float));
        for (int k = 0; k < q->n_embd; k++) {
            q->emb_fault |= !isfinite(ev->embedding[k]); /* JSON has no NaN */
        }
    }
    return 0;
}

static sp_status_t
emb_outcome(sp_api_req_t *a, sp_status_t st, const char **message)
{
    if (st == SP_OK && ((ol_emb_t *)a)->emb_fault) {
        *message = "the model produced NaN or infinite embeddings";
        return SP_ERR_MODEL_FAULT;
    }
    return st;
}

/* One vector: its first `dims` values, scaled back to unit length when cut
 * (Ollama's `dimensions`, as OpenAI's: a shortened normalised embedding). */
static void
write_vec(sp_jbuf_t *b, const float *e, int n_embd, int64_t dims)
{
    int n = dims > 0 && dims < n_embd ? (int)dims : n_embd;
    double ss = 0, scale = 1;
    if (n < n_embd) {
        for (int k = 0; k < n; k++) {
            ss += (double)e[k] * e[k];
        }
        scale = ss > 0 ? 1.0 / sqrt(ss) : 0;
    }
    sp_jbuf_lit(b, "[");
    for (int k = 0; k < n; k++) {
        if (k) {
            sp_jbuf_lit(b, ",");
        }
        sp_jbuf_num(b, (double)e[k] * scale);
    }
    sp_jbuf_lit(b, "]");
}

static void
emb_done(sp_api_req_t *a, const sp_sched_event_t *ev, sp_status_t st, const char *msg)
{
    ol_emb_t *q = (ol_emb_t *)a;
    sp_http_req_t *r = a->http;
    if (st != SP_OK) {
        sp_api_error(r, ol_http(sp_api_server_status(st)), NULL, NULL, NULL, "%s", msg);
        return;
    }
    sp_jbuf_t *b = &q->out;
    sp_jbuf_reset(b);
    if (q->legacy) {
        sp_jbuf_lit(b, "{\"embedding\":");
        write_vec(b, q->emb, q->n_embd, q->dims);
        sp_jbuf_lit(b, "}");
    } else {
        sp_jbuf_lit(b, "{\"model\":");
        sp_req_adapter_model_name(a->m, &a->ad, b);
        sp_jbuf_lit(b, ",\"embeddings\":[");
        for (int i = 0; i < q->n; i++) {
            sp_jbuf_lit(b, i ? "," : "");
            write_vec(b, q->emb + (size_t)i * (size_t)q->n_embd, q->n_embd, q->dims);
        }
        int64_t total = sp_time_ns() - a->clk.t0_ns;
        sp_jbuf_printf(b, "],\"total_duration\":%lld,\"load_duration\":%lld,\"prompt_eval_count\":%lld}",
                       (long long)total, (long long)q->load_ns, (long long)ev->prompt_tokens);
    }
    sp_api_reply_json(r, 200, b);
}

static const sp_api_ops_t emb_ops = {
    .refuse = emb_refuse,
    .event = emb_event,
    .outcome = emb_outcome,
    .done = emb_done,
    .free = emb_free,
};

/* Worker: tokenize the inputs; an input longer than the context is cut to
 * it when truncate is on, else refused. Writes only toks, lens, n_prompt, err. */
static void
emb_prep_run(sp_offload_t *job)
{
    ol_emb_t *q = SP_OFFLOAD_HOLDER(job, ol_emb_t, a.off);
    const sp_tokenizer_t *tok = q->a.m->tok;
    bool bos = sp_chat_add_bos(tok, NULL, 0);
    for (int i = 0; i < q->n; i++) {
        const char *t = json_string_value(q->texts[i]);
        size_t len = json_string_length(q->texts[i]);
        int32_t *dst = q->toks + (size_t)i * (size_t)q->cap;
        int64_t nt = sp_tokenizer_encode(tok, t, len, bos, false, dst, q->cap);
        if (nt < 0) {
            snprintf(q->err, sizeof q->err, "input %d: cannot tokenize: %s", i,
                     sp_status_str((sp_status_t)nt));
            return;
        }
        if (nt > q->cap) {
            if (!q->truncate) {
                snprintf(q->err, sizeof q->err,
                         "input %d has %lld tokens, more than the context length %lld "
                         "(truncate is false)", i, (long long)nt, (long long)q->cap);
                return;
            }
            nt = q->cap; /* the first cap tokens, as encoded */
        }
        if (nt == 0) {
            snprintf(q->err, sizeof q->err, "input %d has no tokens", i);
            return;
        }
        q->lens[i] = nt;
        q->n_prompt += nt;
    }
}

static void
emb_prep_drop(sp_offload_t *job)
{
    sp_api_finish(&SP_OFFLOAD_HOLDER(job, ol_emb_t, a.off)->a);
}

static void
emb_prep_refuse(sp_http_req_t *r, int status, const char *message)
{
    sp_api_error(r, status, NULL, NULL, NULL, "%s", message);
}

static void
emb_prep_done(sp_offload_t *job, sp_http_req_t *r)
{
    ol_emb_t *q = SP_OFFLOAD_HOLDER(job, ol_emb_t, a.off);
    if (q->n > 0) {
        sp_metrics_clock_text(&q->a.clk, false, json_string_value(q->texts[0]),
                              json_string_length(q->texts[0]));
    }
    if (q->err[0]) {
        sp_api_error(r, 400, NULL, "input", NULL, "%s", q->err);
        sp_api_finish(&q->a);
        return;
    }
    const int32_t *prompts[SP_SCHED_MAX_N];
    for (int i = 0; i < q->n; i++) {
        prompts[i] = q->toks + (size_t)i * (size_t)q->cap;
    }
    sp_sched_request_t er;
    memset(&er, 0, sizeof er);
    er.prompts = prompts;
    er.n_prompts = q->lens;
    er.n = q->n;
    er.embed = true;
    bool ok = sp_api_admit(&q->a, &er, q->n_prompt, q->n_prompt);
    sp_free(q->toks); /* the scheduler copied the prompts */
    q->toks = NULL;
    if (!ok) {
        sp_api_finish(&q->a);
    }
}

static const sp_offload_ops_t emb_prep_ops = {
    .stage = "prepare",
    .work = emb_prep_run,
    .done = emb_prep_done,
    .drop = emb_prep_drop,
    .refuse = emb_prep_refuse,
};

static void h_embed(sp_http_req_t *r, const sp_route_params_t *p, void *ud);
static void h_embeddings_legacy(sp_http_req_t *r, const sp_route_params_t *p, void *ud);

static void
embed(sp_http_req_t *r, const sp_route_params_t *p, sp_serving_t *s, bool legacy)
{
    sp_route_fn self = legacy ? h_embeddings_legacy : h_embed;
    json_t *body = sp_api_json_body(s, r, self, p);
    if (body == NULL) {
        return;
    }
    sp_req_adapter_t ad;
    sp_served_model_t *m = ol_model(s, r, body, self, p, &ad, NULL);
    if (m == NULL) {
        json_decref(body);
        return;
    }
    ol_emb_t *q = sp_calloc(1, sizeof *q);
    if (q == NULL) {
        sp_req_adapter_release(&ad);
        sp_served_release(m);
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        json_decref(body);
        return;
    }
    sp_api_begin(&q->a, &emb_ops, s, r, m, &ad);
    q->body = body; /* the request's reference from here */
    q->legacy = legacy;
    q->load_ns = sp_time_ns() - q->a.clk.t0_ns;
    q->n_embd = (int)sp_model_hparams(m->model)->n_embd;
    sp_json_err_t e = {{0}, NULL};
    char err[512];
    q->truncate = true;
    if (sp_json_get_bool(body, "truncate", &q->truncate, &e) < 0 ||
        sp_json_get_int(body, "dimensions", 1, q->n_embd, &q->dims, &e) < 0) {
        sp_api_error(r, 400, NULL, e.param, NULL, "%s", e.msg);
        goto fail;
    }
    int64_t keep_ns;
    if (sp_ollama_keep_alive(body, sp_ollama_keep_default(s), &keep_ns, err, sizeof err) != 0) {
        sp_api_error(r, 400, NULL, "keep_alive", NULL, "%s", err);
        goto fail;
    }
    sp_served_keep_alive(m, keep_ns);
    /* options: num_ctx is the length inputs are cut to (or refused at);
     * the sampling options do not apply to embeddings. */
    q->cap = m->n_ctx;
    const json_t *opts = json_object_get(body, "options");
    int64_t num_ctx = 0;
    if (opts != NULL && !json_is_null(opts) && !json_is_object(opts)) {
        sp_api_error(r, 400, NULL, "options", NULL, "options must be an object");
        goto fail;
    }
    if (json_is_object(opts) && sp_json_get_int(opts, "num_ctx", 1, INT32_MAX, &num_ctx, &e) < 0) {
        sp_api_error(r, 400, NULL, "options", NULL, "options.%s", e.msg);
        goto fail;
    }
    if (num_ctx > m->n_ctx) {
        sp_api_error(r, 400, NULL, "options", NULL,
                     "options.num_ctx %lld is more than the context of %s (%lld tokens)",
                     (long long)num_ctx, m->name, (long long)m->n_ctx);
        goto fail;
    }
    if (num_ctx > 0) {
        q->cap = num_ctx;
    }
    const json_t *in = json_object_get(body, legacy ? "prompt" : "input");
    if (json_is_string(in)) {
        q->texts[q->n++] = in;
    } else if (!legacy && json_is_array(in)) {
        size_t i;
        const json_t *x;
        json_array_foreach(in, i, x) {
            if (!json_is_string(x) || i >= SP_SCHED_MAX_N || i >= (size_t)s->cfg.max_embed_inputs) {
                break;
            }
            q->texts[q->n++] = x;
        }
        if ((size_t)q->n != json_array_size(in)) {
            sp_api_error(r, 400, NULL, "input", NULL,
                         "input must be a string or a list of at most %d strings",
                         s->cfg.max_embed_inputs < SP_SCHED_MAX_N ? s->cfg.max_embed_inputs : SP_SCHED_MAX_N);
            goto fail;
        }
    }
    if (q->n == 0) {
        sp_api_error(r, 400, NULL, "input", NULL, legacy ? "prompt must be a non-empty string"
                                                          : "input must be a string or a non-empty list of strings");
        goto fail;
    }
    for (int i = 0; i < q->n; i++) {
        size_t len = json_string_length(q->texts[i]);
        if (len == 0) {
            sp_api_error(r, 400, NULL, "input", NULL, "input %d is empty", i);
            goto fail;
        }
        if (sp_utf8_invalid_at(json_string_value(q->texts[i]), len) < len) {
            sp_api_error(r, 400, NULL, "input", NULL, "input %d is not valid UTF-8", i);
            goto fail;
        }
    }
    q->toks = sp_malloc((size_t)q->n * (size_t)q->cap * sizeof(int32_t));
    q->emb = sp_calloc((size_t)q->n * (size_t)q->n_embd, sizeof(float));
    if (q->toks == NULL || q->emb == NULL) {
        sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
        goto fail;
    }
    if (!sp_offload_start(&q->a.off, &emb_prep_ops, s->prep, &q->a.http, m, &q->a.clk)) {
        goto fail;
    }
    return;
fail:
    sp_api_finish(&q->a);
}

static void
h_embed(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    embed(r, p, ud, false);
}

static void
h_embeddings_legacy(sp_http_req_t *r, const sp_route_params_t *p, void *ud)
{
    embed(r, p, ud, true);
}

void
sp_ollama_register(sp_router_t *rt, sp_serving_t *s)
{
    sp_router_add(rt, SP_HTTP_GET, "/api/version", h_version, s);
    sp_router_add(rt, SP_HTTP_GET, "/api/tags", h_tags, s);
    sp_router_add(rt, SP_HTTP_GET, "/api/ps", h_ps, s);
    sp_router_add(rt, SP_HTTP_POST, "/api/show", h_show, s);
    sp_router_add(rt, SP_HTTP_POST, "/api/embed", h_embed, s);
    sp_router_add(rt, SP_HTTP_POST, "/api/embeddings", h_embeddings_legacy, s);
}
