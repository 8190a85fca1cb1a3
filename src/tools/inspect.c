/*
 * inspect.c - `sampan inspect FILE`: what is in a GGUF file and what it costs to run.
 *
 *   sampan inspect FILE [--tensors] [--json] [--ctx N] [--all]
 *
 * Prints the header, every metadata key (arrays summarised by element type,
 * count and the first few elements), a per-type tensor summary (every tensor
 * with --tensors), the architecture, parameter count, weight bytes and a
 * memory estimate: weights + an F32 KV cache at the model's context length
 * (or --ctx N). A bad file prints the reader's error on stderr and exits 1.
 * Strings from the file are escaped before printing: the file is untrusted
 * and must not be able to drive the terminal.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "tools/tools.h"

#define PREVIEW_ELEMS 6   /* array elements shown */
#define PREVIEW_CHARS 96  /* string bytes shown (without --all) */

typedef struct opts {
    const char *path;
    bool tensors;
    bool json;
    bool all;
    int64_t ctx; /* 0 = the model's context_length */
} opts;

/* ---- escaping ------------------------------------------------------------- */

/* Print s escaped for a JSON string body (also safe for the terminal); at most max bytes
 * of input (SIZE_MAX = all), with "..." when cut. */
static void
put_escaped(FILE *f, sp_str_t s, size_t max)
{
    size_t n = s.len < max ? s.len : max;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                fprintf(f, "\\u%04x", c);
            } else {
                fputc(c, f); /* UTF-8 bytes pass through */
            }
        }
    }
    if (n < s.len) {
        fputs("...", f);
    }
}

static void
put_quoted(FILE *f, sp_str_t s, size_t max)
{
    fputc('"', f);
    put_escaped(f, s, max);
    fputc('"', f);
}

static void
put_human_bytes(FILE *f, double b)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (b >= 1024.0 && u < 5) {
        b /= 1024.0;
        u++;
    }
    if (u == 0) {
        fprintf(f, "%.0f %s", b, units[u]);
    } else {
        fprintf(f, "%.2f %s", b, units[u]);
    }
}

static void
put_human_count(FILE *f, double n)
{
    if (n >= 1e9) {
        fprintf(f, "%.2f B", n / 1e9);
    } else if (n >= 1e6) {
        fprintf(f, "%.2f M", n / 1e6);
    } else if (n >= 1e3) {
        fprintf(f, "%.2f K", n / 1e3);
    } else {
        fprintf(f, "%.0f", n);
    }
}

/* ---- values ----------------------------------------------------------------- */

static void
put_scalar(FILE *f, sp_gguf_type_t t, const uint8_t *p)
{
    switch (t) {
    case SP_GGUF_TYPE_UINT8: fprintf(f, "%u", p[0]); break;
    case SP_GGUF_TYPE_INT8: fprintf(f, "%d", (int8_t)p[0]); break;
    case SP_GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); fprintf(f, "%u", v); break; }
    case SP_GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); fprintf(f, "%d", v); break; }
    case SP_GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); fprintf(f, "%" PRIu32, v); break; }
    case SP_GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); fprintf(f, "%" PRId32, v); break; }
    case SP_GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); fprintf(f, "%" PRIu64, v); break; }
    case SP_GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); fprintf(f, "%" PRId64, v); break; }
    case SP_GGUF_TYPE_FLOAT32: {
        float v;
        memcpy(&v, p, 4);
        if (v != v || v - v != 0) {
            fputs("null", f); /* nan/inf are not JSON */
        } else {
            fprintf(f, "%.9g", v);
        }
        break;
    }
    case SP_GGUF_TYPE_FLOAT64: {
        double v;
        memcpy(&v, p, 8);
        if (v != v || v - v != 0) {
            fputs("null", f);
        } else {
            fprintf(f, "%.17g", v);
        }
        break;
    }
    case SP_GGUF_TYPE_BOOL: fputs(p[0] ? "true" : "false", f); break;
    default: fputs("?", f); break;
    }
}

/* The value of kv i: scalars as numbers, strings quoted, arrays as [first few, ...]. */
static void
put_value(FILE *f, const sp_gguf_t *g, int64_t i, const opts *o, bool json)
{
    sp_gguf_type_t t = sp_gguf_kv_type(g, i);
    const void *raw;
    size_t raw_len;
    if (sp_gguf_kv_raw(g, i, &raw, &raw_len) != SP_OK) {
        return;
    }
    sp_str_t key = sp_gguf_kv_key(g, i);
    char k[1100];
    snprintf(k, sizeof k, "%.*s", (int)key.len, key.ptr);
    size_t max_chars = o->all ? SIZE_MAX : PREVIEW_CHARS;
    if (t == SP_GGUF_TYPE_STRING) {
        sp_str_t s;
        if (sp_gguf_get_str(g, k, &s, NULL, 0) == SP_OK) {
            put_quoted(f, s, json ? SIZE_MAX : max_chars);
        } else {
            fputs("null", f); /* a key with a NUL byte cannot be looked up */
        }
        return;
    }
    if (t != SP_GGUF_TYPE_ARRAY) {
        put_scalar(f, t, raw);
        return;
    }
    sp_gguf_arr_t a;
    if (sp_gguf_get_arr(g, k, &a, NULL, 0) != SP_OK) {
        fputs("null", f);
        return;
    }
    uint64_t show_n = o->all ? a.n : (a.n < PREVIEW_ELEMS ? a.n : PREVIEW_ELEMS);
    if (json) {
        fprintf(f, "{\"elem_type\": \"%s\", \"n\": %" PRIu64 ", \"%s\": [",
                sp_gguf_type_name(a.elem_type), a.n, o->all ? "values" : "first");
    } else {
        fprintf(f, "[%s x %" PRIu64 "] [", sp_gguf_type_name(a.elem_type), a.n);
    }
    size_t esz = sp_gguf_type_size(a.elem_type);
    for (uint64_t j = 0; j < show_n; j++) {
        if (j > 0) {
            fputs(", ", f);
        }
        if (a.strs != NULL) {
            put_quoted(f, a.strs[j], json ? SIZE_MAX : max_chars);
        } else {
            put_scalar(f, a.elem_type, (const uint8_t *)a.data + j * esz);
        }
    }
    if (!json && show_n < a.n) {
        fputs(", ...", f);
    }
    fputs(json ? "]}" : "]", f);
}

/* ---- the model summary -------------------------------------------------------- */

typedef struct summary {
    char arch[64];
    double n_params;
    double weight_bytes;
    int64_t block_count, context_length, n_embd, n_head, n_head_kv; /* -1 = unknown */
    int64_t ctx;          /* context used for the estimate */
    double kv_bytes;      /* -1 = cannot tell */
    int64_t type_count[SP_TYPE_COUNT];
    double type_bytes[SP_TYPE_COUNT];
    double repack_bytes;  /* the packed copies a load makes (engine/repack_weights.c) */
} summary;

/* Whether a load packs this tensor: the projections the engine repacks (attention,
 * dense FFN, output; the MoE router, experts and shared expert, engine/moe.c) in a type the
 * current kernel table has a packed gemm for. */
static bool
repacked_at_load(const sp_gguf_t *g, const sp_gguf_tensor_t *t)
{
    static const char *const names[] = {
        ".attn_q.weight",         ".attn_k.weight",         ".attn_v.weight",
        ".attn_output.weight",    ".ffn_gate.weight",       ".ffn_up.weight",
        ".ffn_down.weight",       ".ffn_gate_inp.weight",   ".ffn_gate_exps.weight",
        ".ffn_up_exps.weight",    ".ffn_down_exps.weight",  ".ffn_gate_up_exps.weight",
        ".ffn_gate_shexp.weight", ".ffn_up_shexp.weight",   ".ffn_down_shexp.weight",
        ".ffn_gate_inp_shexp.weight"};
    sp_str_t arch;
    if (!sp_model_repack_enabled() || t->n_dims < 1 || t->n_dims > 3 || t->type >= SP_TYPE_COUNT ||
        sp_cpu_kernels()->repack_gemm[t->type] == NULL ||
        (sp_gguf_get_str(g, "general.architecture", &arch, NULL, 0) == SP_OK &&
         ((arch.len == 4 && memcmp(arch.ptr, "bert", 4) == 0) ||
          (arch.len == 10 && memcmp(arch.ptr, "nomic-bert", 10) == 0)))) {
        return false;
    }
    const char *nm = t->name.ptr;
    const size_t len = t->name.len;
    if (len == 13 && memcmp(nm, "output.weight", 13) == 0) {
        return true;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const size_t k = strlen(names[i]);
        if (len > k + 4 && memcmp(nm, "blk.", 4) == 0 && memcmp(nm + len - k, names[i], k) == 0) {
            return true;
        }
    }
    return false;
}

static int64_t
arch_int(const sp_gguf_t *g, const char *arch, const char *suffix)
{
    char key[160];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (sp_gguf_get_int(g, key, &v, NULL, 0) != SP_OK) {
        return -1;
    }
    return v;
}

static void
summarize(const sp_gguf_t *g, const opts *o, summary *s)
{
    memset(s, 0, sizeof *s);
    sp_str_t arch;
    if (sp_gguf_get_str(g, "general.architecture", &arch, NULL, 0) == SP_OK && arch.len > 0 &&
        arch.len < sizeof s->arch && memchr(arch.ptr, '\0', arch.len) == NULL) {
        memcpy(s->arch, arch.ptr, arch.len);
        s->arch[arch.len] = '\0';
    }
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        s->n_params += (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
        s->weight_bytes += (double)t->nbytes;
        s->type_count[t->type]++;
        s->type_bytes[t->type] += (double)t->nbytes;
        if (repacked_at_load(g, t)) {
            /* each copy starts 64-byte aligned, as the loader lays them out: a 3-D expert
             * tensor one copy per expert, a fused gate_up tensor (gemma4) two views of half
             * the rows each */
            static const char fused_name[] = ".ffn_gate_up_exps.weight";
            const size_t fl = sizeof fused_name - 1;
            const int64_t views =
                t->name.len > fl && memcmp(t->name.ptr + t->name.len - fl, fused_name, fl) == 0
                    ? 2
                    : 1;
            s->repack_bytes +=
                (double)((sp_repack_bytes_in(sp_cpu_kernels()->repack_layout[t->type],
                                             (sp_type_t)t->type, t->ne[0], t->ne[1] / views) +
                          63) &
                         ~(size_t)63) *
                (double)(t->ne[2] * views);
        }
    }
    s->block_count = s->context_length = s->n_embd = s->n_head = s->n_head_kv = -1;
    s->kv_bytes = -1;
    if (s->arch[0] == '\0') {
        return;
    }
    s->block_count = arch_int(g, s->arch, "block_count");
    s->context_length = arch_int(g, s->arch, "context_length");
    s->n_embd = arch_int(g, s->arch, "embedding_length");
    s->n_head = arch_int(g, s->arch, "attention.head_count");
    s->n_head_kv = arch_int(g, s->arch, "attention.head_count_kv");
    if (s->n_head_kv < 0) {
        s->n_head_kv = s->n_head; /* absent means no grouped-query attention */
    }
    s->ctx = o->ctx > 0 ? o->ctx : s->context_length;
    if (s->block_count > 0 && s->ctx > 0 && s->n_embd > 0 && s->n_head > 0 && s->n_head_kv >= 0) {
        /* the engine keeps K and V in F32: 2 * layers * ctx * head_dim * kv_heads * 4 bytes */
        double head_dim = (double)(s->n_embd / s->n_head);
        /* key_length when the file has one (a deepseek2 file's is its latent width, with
         * head_count_kv 1: the engine's latent cache, engine/mla.h) */
        const int64_t key_len = arch_int(g, s->arch, "attention.key_length");
        if (key_len > 0) {
            head_dim = (double)key_len;
        }
        s->kv_bytes = 2.0 * (double)s->block_count * (double)s->ctx * head_dim *
                      (double)s->n_head_kv * 4.0;
    }
}

static void
put_shape(FILE *f, const sp_gguf_tensor_t *t)
{
    fputc('[', f);
    int n = t->n_dims > 0 ? t->n_dims : 1;
    for (int d = 0; d < n; d++) {
        fprintf(f, "%s%" PRId64, d ? ", " : "", t->ne[d]);
    }
    fputc(']', f);
}

static void
print_text(FILE *f, const sp_gguf_t *g, const opts *o, const summary *s)
{
    fprintf(f, "file:          %s\n", sp_gguf_path(g));
    fprintf(f, "gguf version:  %" PRIu32 "\n", sp_gguf_version(g));
    fprintf(f, "file size:     %zu bytes (", sp_gguf_file_size(g));
    put_human_bytes(f, (double)sp_gguf_file_size(g));
    fprintf(f, ")\n");
    fprintf(f, "alignment:     %zu\n", sp_gguf_alignment(g));
    fprintf(f, "data offset:   %zu\n", sp_gguf_data_offset(g));

    fprintf(f, "\nmetadata (%" PRId64 " keys):\n", sp_gguf_n_kv(g));
    for (int64_t i = 0; i < sp_gguf_n_kv(g); i++) {
        sp_str_t k = sp_gguf_kv_key(g, i);
        sp_gguf_type_t t = sp_gguf_kv_type(g, i);
        fputs("  ", f);
        put_escaped(f, k, SIZE_MAX);
        int pad = 40 - (int)k.len;
        fprintf(f, "%*s %-4s = ", pad > 0 ? pad : 0, "", sp_gguf_type_name(t));
        put_value(f, g, i, o, false);
        fputc('\n', f);
    }

    fprintf(f, "\ntensors (%" PRId64 "):\n", sp_gguf_n_tensors(g));
    for (int t = 0; t < SP_TYPE_COUNT; t++) {
        if (s->type_count[t] > 0) {
            fprintf(f, "  %-6s %6" PRId64 " tensors  ", sp_type_name(t), s->type_count[t]);
            put_human_bytes(f, s->type_bytes[t]);
            fputc('\n', f);
        }
    }
    if (o->tensors) {
        fputc('\n', f);
        for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
            const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
            fputs("  ", f);
            put_escaped(f, t->name, SIZE_MAX);
            int pad = 36 - (int)t->name.len;
            fprintf(f, "%*s %-6s ", pad > 0 ? pad : 0, "", sp_type_name(t->type));
            put_shape(f, t);
            fprintf(f, "  %zu bytes\n", t->nbytes);
        }
    }

    fprintf(f, "\nmodel:\n");
    fprintf(f, "  architecture:  %s\n", s->arch[0] ? s->arch : "(none)");
    fprintf(f, "  parameters:    %.0f (", s->n_params);
    put_human_count(f, s->n_params);
    fprintf(f, ")\n  weight bytes:  %.0f (", s->weight_bytes);
    put_human_bytes(f, s->weight_bytes);
    fprintf(f, ")\n");
    if (s->repack_bytes > 0) {
        fprintf(f, "  repacked:      %.0f (", s->repack_bytes);
        put_human_bytes(f, s->repack_bytes);
        fprintf(f, ") more at load: rows interleaved for the %s kernels (--no-repack: none)\n",
                sp_cpu_kernels()->name);
    }
    if (s->block_count >= 0) {
        fprintf(f, "  layers:        %" PRId64 "\n", s->block_count);
    }
    if (s->n_embd >= 0) {
        fprintf(f, "  embedding:     %" PRId64 "\n", s->n_embd);
    }
    if (s->n_head >= 0) {
        fprintf(f, "  heads:         %" PRId64 " (kv %" PRId64 ")\n", s->n_head, s->n_head_kv);
    }
    if (s->context_length >= 0) {
        fprintf(f, "  context:       %" PRId64 "\n", s->context_length);
    }
    if (s->kv_bytes >= 0) {
        fprintf(f, "  kv cache:      %.0f (", s->kv_bytes);
        put_human_bytes(f, s->kv_bytes);
        fprintf(f, ") at %" PRId64 " tokens, f32\n", s->ctx);
        fprintf(f, "  memory:        ");
        put_human_bytes(f, s->weight_bytes + s->kv_bytes);
        fprintf(f, " (weights + kv cache, before activations)\n");
    } else {
        fprintf(f, "  memory:        ");
        put_human_bytes(f, s->weight_bytes);
        fprintf(f, " (weights; no kv estimate: hyperparameters missing)\n");
    }
}

static void
print_json(FILE *f, const sp_gguf_t *g, const opts *o, const summary *s)
{
    fprintf(f, "{\n  \"file\": ");
    put_quoted(f, sp_str_c(sp_gguf_path(g)), SIZE_MAX);
    fprintf(f, ",\n  \"version\": %" PRIu32 ",\n  \"file_size\": %zu,\n  \"alignment\": %zu,\n"
               "  \"data_offset\": %zu,\n  \"metadata\": {",
            sp_gguf_version(g), sp_gguf_file_size(g), sp_gguf_alignment(g),
            sp_gguf_data_offset(g));
    for (int64_t i = 0; i < sp_gguf_n_kv(g); i++) {
        fprintf(f, "%s\n    ", i ? "," : "");
        put_quoted(f, sp_gguf_kv_key(g, i), SIZE_MAX);
        fputs(": ", f);
        put_value(f, g, i, o, true);
    }
    fprintf(f, "\n  },\n  \"tensors\": [");
    for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
        const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        put_quoted(f, t->name, SIZE_MAX);
        fprintf(f, ", \"type\": \"%s\", \"shape\": ", sp_type_name(t->type));
        put_shape(f, t);
        fprintf(f, ", \"offset\": %" PRIu64 ", \"bytes\": %zu}", t->offset, t->nbytes);
    }
    fprintf(f, "\n  ],\n  \"architecture\": ");
    if (s->arch[0]) {
        put_quoted(f, sp_str_c(s->arch), SIZE_MAX);
    } else {
        fputs("null", f);
    }
    fprintf(f, ",\n  \"n_params\": %.0f,\n  \"weight_bytes\": %.0f,\n"
               "  \"repack_bytes\": %.0f,\n", s->n_params, s->weight_bytes, s->repack_bytes);
    if (s->kv_bytes >= 0) {
        fprintf(f, "  \"kv_context\": %" PRId64 ",\n  \"kv_cache_bytes\": %.0f,\n"
                   "  \"memory_bytes\": %.0f\n}\n",
                s->ctx, s->kv_bytes, s->weight_bytes + s->kv_bytes);
    } else {
        fprintf(f, "  \"kv_context\": null,\n  \"kv_cache_bytes\": null,\n"
                   "  \"memory_bytes\": %.0f\n}\n",
                s->weight_bytes);
    }
}

static const char inspect_usage[] =
    "usage: sampan inspect FILE [--tensors] [--json] [--ctx N] [--all]\n"
    "  --tensors  list every tensor (name, type, shape, bytes)\n"
    "  --json     one JSON document on stdout (every tensor included)\n"
    "  --ctx N    context length for the KV-cache estimate (default: the model's)\n"
    "  --all      print whole strings and arrays instead of the first few elements\n";

int
sp_cmd_inspect(int argc, char **argv)
{
    opts o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--tensors") == 0) {
            o.tensors = true;
        } else if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--all") == 0) {
            o.all = true;
        } else if (strcmp(a, "--ctx") == 0 && i + 1 < argc) {
            char *end;
            long long v = strtoll(argv[++i], &end, 10);
            if (*end != '\0' || v <= 0) {
                fprintf(stderr, "sampan inspect: --ctx wants a positive integer\n");
                return 2;
            }
            o.ctx = v;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(inspect_usage, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "sampan inspect: unknown option '%s'\n%s", a, inspect_usage);
            return 2;
        } else if (o.path == NULL) {
            o.path = a;
        } else {
            fprintf(stderr, "sampan inspect: one file at a time\n%s", inspect_usage);
            return 2;
        }
    }
    if (o.path == NULL) {
        fputs(inspect_usage, stderr);
        return 2;
    }
    char err[512];
    sp_gguf_t *g = NULL;
    if (sp_gguf_open(o.path, &g, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan inspect: %s\n", err);
        return 1;
    }
    summary s;
    summarize(g, &o, &s);
    if (o.json) {
        print_json(stdout, g, &o, &s);
    } else {
        print_text(stdout, g, &o, &s);
    }
    int rc = fflush(stdout) == 0 ? 0 : 1;
    sp_gguf_close(g);
    return rc;
}
