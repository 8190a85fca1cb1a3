/* config.c - config.json: strict parsing into sp_repo_config_t, override merge. */
#include "serving/repo_config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/file.h"
#include "serving/repo_path.h"
#include "serving/repo_pbtxt.h"

static const char *const dtype_names[SP_REPO_TYPE_COUNT_] = {
    "TYPE_BOOL",  "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
    "TYPE_INT8",  "TYPE_INT16", "TYPE_INT32",  "TYPE_INT64",  "TYPE_FP16",
    "TYPE_FP32",  "TYPE_FP64",  "TYPE_STRING", "TYPE_BF16",
};

const char *
sp_repo_config_dtype_name(sp_repo_dtype_t t)
{
    return (unsigned)t < SP_REPO_TYPE_COUNT_ ? dtype_names[t] : "TYPE_INVALID";
}

const char *
sp_repo_config_backend_name(sp_repo_backend_t b)
{
    return b == SP_REPO_BACKEND_XGBOOST ? "xgboost" : b == SP_REPO_BACKEND_PLUGIN ? "plugin" : "llm";
}

/* ---- error context: every message is "<file>: <field path>: <what>" */

typedef struct pctx {
    const char *file;
    char *err;
    size_t err_len;
} pctx_t;

static sp_status_t SP_PRINTF(3, 4)
bad(const pctx_t *c, const char *path, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sp_errf(c->err, c->err_len, SP_ERR_INVALID, "%s: %s: %s", c->file, path, msg);
}

/* Refuse keys not in `allowed` (NULL-terminated): a typo must not be silently ignored. */
static sp_status_t
check_keys(const pctx_t *c, const char *path, const json_t *obj, const char *const *allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        bool ok = false;
        for (int i = 0; allowed[i]; i++) {
            if (strcmp(key, allowed[i]) == 0) {
                ok = true;
                break;
            }
        }
        if (!ok) {
            char p[320];
            if (path[0]) {
                snprintf(p, sizeof p, "%s.%.128s", path, key);
            } else {
                snprintf(p, sizeof p, "%.128s", key);
            }
            return bad(c, p, "unknown field");
        }
    }
    return SP_OK;
}

static void
join(char *out, size_t n, const char *path, const char *key)
{
    if (path[0]) {
        snprintf(out, n, "%s.%s", path, key);
    } else {
        snprintf(out, n, "%s", key);
    }
}

/* Integer field: 1 = set, 0 = absent, SP_ERR_INVALID on a wrong type or range. */
static int
get_int(const pctx_t *c, const json_t *obj, const char *path, const char *key, int64_t lo,
        int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    char p[320];
    join(p, sizeof p, path, key);
    if (!json_is_integer(v)) return bad(c, p, "must be an integer");
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi) {
        return bad(c, p, "must be in [%lld, %lld], got %lld", (long long)lo, (long long)hi,
                   (long long)x);
    }
    *out = x;
    return 1;
}

static int
get_str(const pctx_t *c, const json_t *obj, const char *path, const char *key, size_t max,
        const char **out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    char p[320];
    join(p, sizeof p, path, key);
    if (!json_is_string(v)) return bad(c, p, "must be a string");
    size_t n = json_string_length(v);
    if (n > max) return bad(c, p, "longer than %zu bytes", max);
    if (strlen(json_string_value(v)) != n) return bad(c, p, "contains a NUL byte");
    *out = json_string_value(v);
    return 1;
}

/* ---- input / output */

/* A number field (0 absent, 1 set). */
static int
get_num(const pctx_t *c, const json_t *obj, const char *path, const char *key, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    char p[320];
    join(p, sizeof p, path, key);
    if (!json_is_number(v)) return bad(c, p, "must be a number");
    *out = json_number_value(v);
    if (!isfinite(*out)) return bad(c, p, "must be finite");
    return 1;
}

/* mean / std: one number per channel. */
static sp_status_t
get_chan(const pctx_t *c, const json_t *obj, const char *path, const char *key, int ch, bool pos,
         float *out)
{
    const json_t *a = json_object_get(obj, key);
    if (!a) return SP_OK;
    char p[320];
    join(p, sizeof p, path, key);
    if (!json_is_array(a) || json_array_size(a) != (size_t)ch) {
        return bad(c, p, "must be an array of %d numbers (one per channel)", ch);
    }
    for (int i = 0; i < ch; i++) {
        const json_t *x = json_array_get(a, (size_t)i);
        double v = json_is_number(x) ? json_number_value(x) : NAN;
        if (!isfinite(v) || (pos && !(v > 0))) {
            return bad(c, p, "[%d] must be a finite%s number", i, pos ? " positive" : "");
        }
        out[i] = (float)v;
    }
    return SP_OK;
}

/* The "image" object of an input's preprocess (image.h), for tensor t (its
 * format, data type and dims already parsed). */
static sp_status_t
parse_image(const pctx_t *c, const json_t *o, const char *p, sp_repo_tensor_t *t)
{
    static const char *const keys[] = {"size", "color", "resize", "shorter_side", "scale", "mean",
                                       "std", "max_pixels", "max_bytes", NULL};
    if (!json_is_object(o)) return bad(c, p, "must be an object");
    sp_status_t st = check_keys(c, p, o, keys);
    if (st) return st;
    if (t->format == 0) {
        return bad(c, p, "an image input needs \"format\": FORMAT_NCHW or FORMAT_NHWC");
    }
    if (t->data_type != SP_REPO_TYPE_FP32 && t->data_type != SP_REPO_TYPE_UINT8) {
        return bad(c, p, "an image input must be TYPE_FP32 or TYPE_UINT8");
    }
    sp_img_spec_t s = sp_img_spec_default();
    s.u8 = t->data_type == SP_REPO_TYPE_UINT8;
    for (const char *const *k = (const char *const[]){"scale", "mean", "std", NULL}; s.u8 && *k; k++) {
        if (json_object_get(o, *k)) {
            char kp[320];
            join(kp, sizeof kp, p, *k);
            return bad(c, kp, "a TYPE_UINT8 image input takes the pixels as they are (0..255): no "
                       "scale, mean or std");
        }
    }
    bool nchw = t->format == 2;
    int64_t C = t->dims[nchw ? 0 : 2], H = t->dims[nchw ? 1 : 0], W = t->dims[nchw ? 2 : 1];
    s.layout = nchw ? SP_IMG_NCHW : SP_IMG_NHWC;
    s.color = C == 1 ? SP_IMG_GRAY : SP_IMG_RGB;
    char fp[320];
    const char *str = NULL;
    int r = get_str(c, o, p, "color", 16, &str);
    if (r < 0) return (sp_status_t)r;
    if (r) {
        join(fp, sizeof fp, p, "color");
        if (strcmp(str, "RGB") == 0) s.color = SP_IMG_RGB;
        else if (strcmp(str, "BGR") == 0) s.color = SP_IMG_BGR;
        else if (strcmp(str, "GRAY") == 0) s.color = SP_IMG_GRAY;
        else return bad(c, fp, "must be \"RGB\", \"BGR\" or \"GRAY\"");
    }
    int ch = sp_img_channels(&s);
    if (C != -1 && C != ch) {
        return bad(c, p, "%s has %d channel%s, the dims say %lld", ch == 1 ? "GRAY" : "colour", ch,
                   ch == 1 ? "" : "s", (long long)C);
    }
    const json_t *sz = json_object_get(o, "size");
    if (sz) {
        join(fp, sizeof fp, p, "size");
        const json_t *h = json_array_get(sz, 0), *w = json_array_get(sz, 1);
        if (!json_is_array(sz) || json_array_size(sz) != 2 || !json_is_integer(h) ||
            !json_is_integer(w) || json_integer_value(h) < 1 || json_integer_value(w) < 1 ||
            json_integer_value(h) > 16384 || json_integer_value(w) > 16384) {
            return bad(c, fp, "must be [height, width], each in [1, 16384]");
        }
        if ((H != -1 && H != json_integer_value(h)) || (W != -1 && W != json_integer_value(w))) {
            return bad(c, fp, "[%lld, %lld] differs from the dims' height and width",
                       (long long)json_integer_value(h), (long long)json_integer_value(w));
        }
        H = json_integer_value(h);
        W = json_integer_value(w);
    }
    if (H == -1 || W == -1) return bad(c, p, "variable height or width in dims: give \"size\"");
    if (H > 16384 || W > 16384) return bad(c, p, "height and width must be at most 16384");
    s.height = (int32_t)H;
    s.width = (int32_t)W;
    r = get_str(c, o, p, "resize", 16, &str);
    if (r < 0) return (sp_status_t)r;
    if (r) {
        join(fp, sizeof fp, p, "resize");
        if (strcmp(str, "stretch") == 0) s.resize = SP_IMG_STRETCH;
        else if (strcmp(str, "shorter_crop") == 0) s.resize = SP_IMG_SHORTER_CROP;
        else return bad(c, fp, "must be \"stretch\" or \"shorter_crop\"");
    }
    int64_t v = 0;
    r = get_int(c, o, p, "shorter_side", 1, 16384, &v);
    if (r < 0) return (sp_status_t)r;
    if (r && s.resize != SP_IMG_SHORTER_CROP) {
        join(fp, sizeof fp, p, "shorter_side");
        return bad(c, fp, "applies to \"resize\": \"shorter_crop\" only");
    }
    s.shorter_side = r ? (int32_t)v : (int32_t)(H > W ? H : W);
    if (s.shorter_side < (H < W ? H : W)) {
        join(fp, sizeof fp, p, "shorter_side");
        return bad(c, fp, "%d is smaller than the crop", (int)s.shorter_side);
    }
    double d = 0;
    r = get_num(c, o, p, "scale", &d);
    if (r < 0) return (sp_status_t)r;
    if (r) {
        if (!(d > 0)) {
            join(fp, sizeof fp, p, "scale");
            return bad(c, fp, "must be positive");
        }
        s.scale = (float)d;
    }
    if ((st = get_chan(c, o, p, "mean", ch, false, s.mean)) ||
        (st = get_chan(c, o, p, "std", ch, true, s.std))) {
        return st;
    }
    r = get_int(c, o, p, "max_pixels", 1, (int64_t)SP_IMG_MAX_SIDE * SP_IMG_MAX_SIDE, &v);
    if (r < 0) return (sp_status_t)r;
    if (r) s.max_pixels = v;
    r = get_int(c, o, p, "max_bytes", 1, (int64_t)1 << 32, &v);
    if (r < 0) return (sp_status_t)r;
    if (r) s.max_bytes = (size_t)v;
    t->has_image = true;
    t->image = s;
    return SP_OK;
}

/* Triton's format, reshape and label_filename; Sampan's preprocess. */
static sp_status_t
tensor_triton_fields(const pctx_t *c, const json_t *e, const char *p, sp_repo_tensor_t *t)
{
    char fp[112];
    const json_t *f = json_object_get(e, "format");
    if (f) {
        static const char *const fmts[] = {"FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"};
        snprintf(fp, sizeof fp, "%s.format", p);
        if (!json_is_string(f)) return bad(c, fp, "must be a string");
        t->format = -1;
        for (int k = 0; k < 3; k++) {
            if (strcmp(json_string_value(f), fmts[k]) == 0) t->format = k;
        }
        if (t->format < 0) {
            return bad(c, fp, "\"%.40s\": must be FORMAT_NONE, FORMAT_NHWC or FORMAT_NCHW",
                       json_string_value(f));
        }
        if (t->format > 0) {
            /* Triton's rule: an image format has three dims, C being 1 or 3. */
            int64_t ch = t->n_dims == 3 ? t->dims[t->format == 2 ? 0 : 2] : 0;
            if (t->n_dims != 3 || (ch != 1 && ch != 3 && ch != -1)) {
                return bad(c, fp, "%s needs dims of three sizes with 1 or 3 channels",
                           json_string_value(f));
            }
        }
    }
    const json_t *r = json_object_get(e, "reshape");
    if (r) {
        static const char *const rkeys[] = {"shape", NULL};
        snprintf(fp, sizeof fp, "%s.reshape", p);
        if (!json_is_object(r)) return bad(c, fp, "must be an object");
        sp_status_t st = check_keys(c, fp, r, rkeys);
        if (st) return st;
        const json_t *sh = json_object_get(r, "shape");
        size_t n = json_is_array(sh) ? json_array_size(sh) : 0;
        bool same = sh == NULL ? t->n_dims == 0 : json_is_array(sh) && n == (size_t)t->n_dims;
        for (size_t i = 0; same && i < n; i++) {
            const json_t *x = json_array_get(sh, i);
            same = json_is_integer(x) && json_integer_value(x) == t->dims[i];
        }
        if (!same) {
            return bad(c, fp, "a reshape to another shape than dims is not supported (the "
                       "backends see the tensor as the request sends it)");
        }
    }
    const json_t *lf = json_object_get(e, "label_filename");
    if (lf && !(json_is_string(lf) && json_string_length(lf) == 0)) { /* "": Triton's printed default */
        snprintf(fp, sizeof fp, "%s.label_filename", p);
        char e2[256];
        if (!json_is_string(lf) ||
            sp_repo_path_check_name_n(json_string_value(lf), json_string_length(lf), e2,
                                      sizeof e2) != SP_OK ||
            json_string_length(lf) > SP_REPO_NAME_MAX) {
            return bad(c, fp, "must be a file name in the model directory (no '/')");
        }
        snprintf(t->label_filename, sizeof t->label_filename, "%s", json_string_value(lf));
    }
    const json_t *pre = json_object_get(e, "preprocess");
    if (pre) {
        static const char *const pkeys[] = {"image", NULL};
        snprintf(fp, sizeof fp, "%s.preprocess", p);
        if (!json_is_object(pre)) return bad(c, fp, "must be an object");
        sp_status_t st = check_keys(c, fp, pre, pkeys);
        if (st) return st;
        const json_t *im = json_object_get(pre, "image");
        if (im) {
            snprintf(fp, sizeof fp, "%s.preprocess.image", p);
            return parse_image(c, im, fp, t);
        }
    }
    return SP_OK;
}

/* config.pbtxt cannot extend ModelInput: there the preprocessing is the
 * model parameter image_preprocess.NAME, whose string_value is the JSON of
 * the "image" object. */
static sp_status_t
params_image(const pctx_t *c, sp_repo_config_t *cfg)
{
    static const char pfx[] = "image_preprocess.";
    for (int32_t i = 0; i < cfg->n_params; i++) {
        const char *k = cfg->param[i].key;
        if (strncmp(k, pfx, sizeof pfx - 1) != 0) continue;
        char p[200];
        snprintf(p, sizeof p, "parameters.%.140s", k);
        sp_repo_tensor_t *t = NULL;
        for (int32_t j = 0; j < cfg->n_inputs && !t; j++) {
            t = strcmp(cfg->input[j].name, k + sizeof pfx - 1) == 0 ? &cfg->input[j] : NULL;
        }
        if (t == NULL) return bad(c, p, "no input named \"%.128s\"", k + sizeof pfx - 1);
        if (t->has_image) return bad(c, p, "the input has a preprocess object already");
        json_error_t je;
        json_t *o = json_loads(cfg->param[i].value, JSON_REJECT_DUPLICATES, &je);
        if (o == NULL) return bad(c, p, "string_value is not JSON: %s", je.text);
        snprintf(p, sizeof p, "parameters.%.140s.string_value", k);
        sp_status_t st = parse_image(c, o, p, t);
        json_decref(o);
        if (st) return st;
    }
    return SP_OK;
}

static sp_status_t
parse_tensors(const pctx_t *c, const json_t *arr, const char *key, bool is_input,
              sp_repo_tensor_t *t, int32_t *n_out)
{
    static const char *const in_keys[] = {"name", "data_type", "dims", "optional", "format",
                                          "reshape", "preprocess", NULL};
    static const char *const out_keys[] = {"name", "data_type", "dims", "reshape",
                                           "label_filename", NULL};
    if (!json_is_array(arr)) return bad(c, key, "must be an array");
    size_t n = json_array_size(arr);
    if (n > SP_REPO_MAX_TENSORS) return bad(c, key, "more than %d entries", SP_REPO_MAX_TENSORS);
    for (size_t i = 0; i < n; i++) {
        char p[64];
        snprintf(p, sizeof p, "%s[%zu]", key, i);
        const json_t *e = json_array_get(arr, i);
        if (!json_is_object(e)) return bad(c, p, "must be an object");
        sp_status_t st = check_keys(c, p, e, is_input ? in_keys : out_keys);
        if (st) return st;
        const char *s = NULL;
        int r = get_str(c, e, p, "name", SP_REPO_NAME_MAX, &s);
        if (r < 0) return (sp_status_t)r;
        char fp[96];
        snprintf(fp, sizeof fp, "%s.name", p);
        if (r == 0 || !s[0]) return bad(c, fp, "is required");
        for (size_t j = 0; j < i; j++) {
            if (strcmp(t[j].name, s) == 0) return bad(c, fp, "duplicate tensor name \"%s\"", s);
        }
        snprintf(t[i].name, sizeof t[i].name, "%s", s);

        snprintf(fp, sizeof fp, "%s.data_type", p);
        r = get_str(c, e, p, "data_type", 32, &s);
        if (r < 0) return (sp_status_t)r;
        if (r == 0) return bad(c, fp, "is required");
        int dt = -1;
        for (int k = 0; k < SP_REPO_TYPE_COUNT_; k++) {
            if (strcmp(s, dtype_names[k]) == 0) dt = k;
        }
        if (dt < 0) return bad(c, fp, "unknown data type \"%s\" (TYPE_FP32, TYPE_INT64, ...)", s);
        t[i].data_type = (sp_repo_dtype_t)dt;

        snprintf(fp, sizeof fp, "%s.dims", p);
        const json_t *dims = json_object_get(e, "dims");
        if (!dims) return bad(c, fp, "is required");
        if (!json_is_array(dims)) return bad(c, fp, "must be an array");
        size_t nd = json_array_size(dims);
        if (nd > SP_REPO_MAX_DIMS) return bad(c, fp, "more than %d dimensions", SP_REPO_MAX_DIMS);
        for (size_t d = 0; d < nd; d++) {
            const json_t *x = json_array_get(dims, d);
            char dp[112];
            snprintf(dp, sizeof dp, "%s[%zu]", fp, d);
            if (!json_is_integer(x)) return bad(c, dp, "must be an integer");
            json_int_t v = json_integer_value(x);
            if (v < -1 || v == 0 || v > ((json_int_t)1 << 40)) {
                return bad(c, dp, "must be -1 (variable) or a positive size, got %lld",
                           (long long)v);
            }
            t[i].dims[d] = (int64_t)v;
        }
        t[i].n_dims = (int32_t)nd;
        st = tensor_triton_fields(c, e, p, &t[i]);
        if (st) return st;
        if (is_input) {
            const json_t *o = json_object_get(e, "optional");
            if (o) {
                snprintf(fp, sizeof fp, "%s.optional", p);
                if (!json_is_boolean(o)) return bad(c, fp, "must be true or false");
                t[i].optional = json_is_true(o);
            }
        }
    }
    *n_out = (int32_t)n;
    return SP_OK;
}

/* ---- instance_group */

static sp_status_t
parse_groups(const pctx_t *c, const json_t *arr, sp_repo_config_t *cfg)
{
    static const char *const keys[] = {"name", "count", "kind", "gpus", NULL};
    if (!json_is_array(arr)) return bad(c, "instance_group", "must be an array");
    size_t n = json_array_size(arr);
    if (n > SP_REPO_MAX_GROUPS) {
        return bad(c, "instance_group", "more than %d entries", SP_REPO_MAX_GROUPS);
    }
    for (size_t i = 0; i < n; i++) {
        char p[64], fp[96];
        snprintf(p, sizeof p, "instance_group[%zu]", i);
        const json_t *e = json_array_get(arr, i);
        sp_repo_group_t *g = &cfg->group[i];
        if (!json_is_object(e)) return bad(c, p, "must be an object");
        sp_status_t st = check_keys(c, p, e, keys);
        if (st) return st;
        const char *s = NULL;
        int r = get_str(c, e, p, "name", SP_REPO_NAME_MAX, &s);
        if (r < 0) return (sp_status_t)r;
        if (r) snprintf(g->name, sizeof g->name, "%s", s);
        int64_t v = 1;
        r = get_int(c, e, p, "count", 1, SP_REPO_MAX_INSTANCES, &v);
        if (r < 0) return (sp_status_t)r;
        g->count = (int32_t)v;
        g->kind = SP_REPO_KIND_CPU;
        snprintf(fp, sizeof fp, "%s.kind", p);
        const json_t *k = json_object_get(e, "kind");
        if (k) {
            const char *ks = json_is_string(k) ? json_string_value(k) : "";
            if (strcmp(ks, "KIND_CPU") == 0 || strcmp(ks, "KIND_AUTO") == 0) {
                /* KIND_AUTO (Triton's default) is a group without a kind:
                 * the server's own placement (--gpu-layers, --devices). */
                g->kind = SP_REPO_KIND_CPU;
            } else if (strcmp(ks, "KIND_GPU") == 0) {
                g->kind = SP_REPO_KIND_GPU;
            } else {
                return bad(c, fp, "must be KIND_CPU, KIND_GPU or KIND_AUTO");
            }
        }
        const json_t *gpus = json_object_get(e, "gpus");
        if (gpus && !(json_is_array(gpus) && json_array_size(gpus) == 0)) { /* []: none */
            snprintf(fp, sizeof fp, "%s.gpus", p);
            if (!json_is_array(gpus)) return bad(c, fp, "must be an array");
            if (g->kind != SP_REPO_KIND_GPU) return bad(c, fp, "needs kind KIND_GPU");
            size_t ng = json_array_size(gpus);
            if (ng > SP_REPO_MAX_GPUS) return bad(c, fp, "more than %d entries", SP_REPO_MAX_GPUS);
            for (size_t j = 0; j < ng; j++) {
                const json_t *x = json_array_get(gpus, j);
                char gp[112];
                snprintf(gp, sizeof gp, "%s[%zu]", fp, j);
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) > 255) {
                    return bad(c, gp, "must be a GPU index in [0, 255]");
                }
                g->gpus[j] = (int32_t)json_integer_value(x);
                for (size_t q = 0; q < j; q++) {
                    if (g->gpus[q] == g->gpus[j]) return bad(c, gp, "duplicate GPU %d", g->gpus[j]);
                }
            }
            g->n_gpus = (int32_t)ng;
        }
    }
    cfg->n_groups = (int32_t)n;
    return SP_OK;
}

/* ---- version_policy: exactly one of latest / all / specific */

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static sp_status_t
parse_policy(const pctx_t *c, const json_t *o, sp_repo_version_policy_t *vp)
{
    static const char *const keys[] = {"latest", "all", "specific", NULL};
    static const char *const latest_keys[] = {"num_versions", NULL};
    static const char *const spec_keys[] = {"versions", NULL};
    static const char *const no_keys[] = {NULL};
    if (!json_is_object(o)) return bad(c, "version_policy", "must be an object");
    sp_status_t st = check_keys(c, "version_policy", o, keys);
    if (st) return st;
    if (json_object_size(o) != 1) {
        return bad(c, "version_policy", "must have exactly one of latest, all, specific");
    }
    const json_t *v;
    if ((v = json_object_get(o, "latest"))) {
        if (!json_is_object(v)) return bad(c, "version_policy.latest", "must be an object");
        st = check_keys(c, "version_policy.latest", v, latest_keys);
        if (st) return st;
        int64_t n = 0;
        int r = get_int(c, v, "version_policy.latest", "num_versions", 1, 1024, &n);
        if (r < 0) return (sp_status_t)r;
        if (r == 0) return bad(c, "version_policy.latest.num_versions", "is required");
        vp->kind = SP_REPO_POLICY_LATEST;
        vp->num_versions = (int32_t)n;
    } else if ((v = json_object_get(o, "all"))) {
        if (!json_is_object(v)) return bad(c, "version_policy.all", "must be an object");
        st = check_keys(c, "version_policy.all", v, no_keys);
        if (st) return st;
        vp->kind = SP_REPO_POLICY_ALL;
    } else {
        v = json_object_get(o, "specific");
        if (!json_is_object(v)) return bad(c, "version_policy.specific", "must be an object");
        st = check_keys(c, "version_policy.specific", v, spec_keys);
        if (st) return st;
        const json_t *arr = json_object_get(v, "versions");
        const char *p = "version_policy.specific.versions";
        if (!arr) return bad(c, p, "is required");
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            return bad(c, p, "must be a non-empty array of version numbers");
        }
        size_t n = json_array_size(arr);
        if (n > SP_REPO_MAX_SPECIFIC) return bad(c, p, "more than %d entries", SP_REPO_MAX_SPECIFIC);
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(arr, i);
            char ip[80];
            snprintf(ip, sizeof ip, "%s[%zu]", p, i);
            if (!json_is_integer(x) || json_integer_value(x) < 1 ||
                json_integer_value(x) > SP_REPO_VERSION_MAX) {
                return bad(c, ip, "must be a version number in [1, %lld]",
                           (long long)SP_REPO_VERSION_MAX);
            }
            vp->versions[i] = (int64_t)json_integer_value(x);
        }
        qsort(vp->versions, n, sizeof vp->versions[0], cmp_i64);
        for (size_t i = 1; i < n; i++) {
            if (vp->versions[i] == vp->versions[i - 1]) {
                return bad(c, p, "duplicate version %lld", (long long)vp->versions[i]);
            }
        }
        vp->kind = SP_REPO_POLICY_SPECIFIC;
        vp->n_versions = (int32_t)n;
    }
    return SP_OK;
}

/* ---- dynamic_batching */

/* Triton's ModelQueuePolicy at path p. */
static sp_status_t
parse_queue_policy(const pctx_t *c, const char *p, const json_t *qp, sp_repo_queue_policy_t *q)
{
    static const char *const qkeys[] = {"timeout_action", "default_timeout_microseconds",
                                        "allow_timeout_override", "max_queue_size", NULL};
    if (!json_is_object(qp)) return bad(c, p, "must be an object");
    sp_status_t st = check_keys(c, p, qp, qkeys);
    if (st) return st;
    char fp[160];
    const json_t *ta = json_object_get(qp, "timeout_action");
    if (ta) {
        const char *tv = json_string_value(ta);
        if (!tv || (strcmp(tv, "REJECT") != 0 && strcmp(tv, "DELAY") != 0)) {
            snprintf(fp, sizeof fp, "%s.timeout_action", p);
            return bad(c, fp, "must be REJECT or DELAY");
        }
        q->delay_on_timeout = strcmp(tv, "DELAY") == 0;
    }
    int64_t v = 0;
    int r = get_int(c, qp, p, "default_timeout_microseconds", 0, (int64_t)3600 * 1000000, &v);
    if (r < 0) return (sp_status_t)r;
    q->default_timeout_us = v;
    const json_t *ao = json_object_get(qp, "allow_timeout_override");
    if (ao) {
        if (!json_is_boolean(ao)) {
            snprintf(fp, sizeof fp, "%s.allow_timeout_override", p);
            return bad(c, fp, "must be true or false");
        }
        q->allow_timeout_override = json_is_true(ao);
    }
    v = 0;
    r = get_int(c, qp, p, "max_queue_size", 0, 1000000, &v);
    if (r < 0) return (sp_status_t)r;
    q->max_queue_size = (int32_t)v;
    return SP_OK;
}

static sp_status_t
parse_batching(const pctx_t *c, const json_t *o, sp_repo_config_t *cfg)
{
    static const char *const keys[] = {"max_queue_delay_microseconds", "preferred_batch_size",
                                       "priority_levels", "default_priority_level",
                                       "default_queue_policy", "priority_queue_policy", NULL};
    const char *p = "dynamic_batching";
    if (!json_is_object(o)) return bad(c, p, "must be an object");
    sp_status_t st = check_keys(c, p, o, keys);
    if (st) return st;
    sp_repo_batching_t *b = &cfg->dynamic_batching;
    b->enabled = true;
    int64_t v = 0;
    int r = get_int(c, o, p, "max_queue_delay_microseconds", 0, 60000000, &v);
    if (r < 0) return (sp_status_t)r;
    b->max_queue_delay_us = v;
    const json_t *arr = json_object_get(o, "preferred_batch_size");
    if (arr) {
        const char *ap = "dynamic_batching.preferred_batch_size";
        if (!json_is_array(arr)) return bad(c, ap, "must be an array");
        size_t n = json_array_size(arr);
        if (n > SP_REPO_MAX_PREFERRED) return bad(c, ap, "more than %d entries", SP_REPO_MAX_PREFERRED);
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(arr, i);
            char ip[80];
            snprintf(ip, sizeof ip, "%s[%zu]", ap, i);
            int64_t hi = cfg->max_batch_size > 0 ? cfg->max_batch_size : 65536;
            if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > hi) {
                return bad(c, ip, "must be an integer in [1, %lld]%s", (long long)hi,
                           cfg->max_batch_size > 0 ? " (max_batch_size)" : "");
            }
            b->preferred[i] = (int32_t)json_integer_value(x);
        }
        b->n_preferred = (int32_t)n;
    }
    v = 0; /* get_int leaves v alone when the key is absent */
    r = get_int(c, o, p, "priority_levels", 0, 32, &v);
    if (r < 0) return (sp_status_t)r;
    b->priority_levels = (int32_t)v;
    v = 0;
    r = get_int(c, o, p, "default_priority_level", 0, 32, &v);
    if (r < 0) return (sp_status_t)r;
    if (b->priority_levels == 0 && v != 0) {
        return bad(c, "dynamic_batching.default_priority_level",
                   "needs priority_levels (there is one level without it)");
    }
    if (b->priority_levels > 0 && r == 0) {
        v = b->priority_levels; /* unspecified: the lowest level, so no request jumps the queue */
    } else if (b->priority_levels > 0 && (v < 1 || v > b->priority_levels)) {
        return bad(c, "dynamic_batching.default_priority_level", "must be in [1, %d] (priority_levels)",
                   (int)b->priority_levels);
    }
    b->default_priority_level = (int32_t)v;
    const json_t *qp = json_object_get(o, "default_queue_policy");
    if (qp) {
        st = parse_queue_policy(c, "dynamic_batching.default_queue_policy", qp,
                                &b->default_queue_policy);
        if (st) return st;
    }
    /* Triton's priority_queue_policy: {"<level>": ModelQueuePolicy, ...} */
    const json_t *pq = json_object_get(o, "priority_queue_policy");
    if (pq) {
        const char *pqp = "dynamic_batching.priority_queue_policy";
        if (!json_is_object(pq)) return bad(c, pqp, "must be an object of levels");
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)pq, key, val) {
            char kp[120];
            snprintf(kp, sizeof kp, "%s.%.20s", pqp, key);
            char *end = NULL;
            long lvl = strtol(key, &end, 10);
            if (end == key || *end != '\0' || lvl < 1 || lvl > b->priority_levels) {
                return bad(c, kp, "the level must be 1 to priority_levels (%d)",
                           (int)b->priority_levels);
            }
            st = parse_queue_policy(c, kp, val, &b->level_policy[lvl - 1]);
            if (st) return st;
            b->has_level_policy[lvl - 1] = true;
        }
    }
    return SP_OK;
}

/* ---- parameters: Triton's {"key": {"string_value": "..."}}; LLM keys typed */

static int
parse_num(const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int
parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = (int64_t)v;
    return 0;
}

static sp_status_t
llm_param(const pctx_t *c, const char *path, const char *key, const char *val, sp_repo_llm_t *l)
{
    static const struct {
        const char *key;
        int is_int;
        double lo, hi;
    } nums[] = {
        {"context_length", 1, 1, 1 << 22},
        {"kv_blocks", 1, 1, 1 << 24},
        {"max_tokens", 1, 1, 1 << 22},
        {"top_k", 1, 0, 1 << 20},
        {"seed", 1, 0, 9007199254740991.0},
        {"temperature", 0, 0, 100},
        {"top_p", 0, 0, 1},
        {"min_p", 0, 0, 1},
        {"repeat_penalty", 0, 0, 100},
        {"frequency_penalty", 0, -2, 2},
        {"presence_penalty", 0, -2, 2},
        {"num_speculative_tokens", 1, 1, 16},
    };
    if (strcmp(key, "chat_template") == 0) {
        l->chat_template = val;
        return SP_OK;
    }
    if (strcmp(key, "chat_template_file") == 0) {
        if (!val[0] || val[0] == '/') {
            return bad(c, path, "must be a path relative to the model directory");
        }
        if (strlen(val) >= PATH_MAX / 2) return bad(c, path, "longer than %d bytes", PATH_MAX / 2 - 1);
        l->chat_template_file = val;
        return SP_OK;
    }
    if (strcmp(key, "model_file") == 0) {
        char e[256];
        if (sp_repo_path_check_name(val, e, sizeof e) != SP_OK) return bad(c, path, "%s", e);
        l->model_file = val;
        return SP_OK;
    }
    if (strcmp(key, "encryption_key_file") == 0) {
        if (!val[0]) return bad(c, path, "must be a path to a key file");
        if (strlen(val) >= SP_ENC_PATH_MAX) {
            return bad(c, path, "longer than %d bytes", SP_ENC_PATH_MAX - 1);
        }
        l->encryption_key_file = val;
        return SP_OK;
    }
    if (strcmp(key, "encryption_key_env") == 0) {
        /* A plain variable name: it is looked up, never expanded by a shell. */
        size_t n = strlen(val);
        bool ok = n > 0 && n <= SP_ENC_ENV_NAME_MAX && !(val[0] >= '0' && val[0] <= '9');
        for (size_t i = 0; ok && i < n; i++) {
            char ch = val[i];
            ok = ch == '_' || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                 (ch >= '0' && ch <= '9');
        }
        if (!ok) {
            return bad(c, path, "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at "
                       "most %d bytes)", SP_ENC_ENV_NAME_MAX);
        }
        l->encryption_key_env = val;
        return SP_OK;
    }
    if (strcmp(key, "draft_model") == 0) {
        /* Another model of the repository, by name (serving/registry.c loads it). */
        char e[256];
        if (sp_repo_path_check_name(val, e, sizeof e) != SP_OK) return bad(c, path, "%s", e);
        l->draft_model = val;
        return SP_OK;
    }
    if (strcmp(key, "kv_cache_type") == 0) {
        /* The engine's names (engine/model.h, sp_kv_type_from_name); the repository
         * module does not include the engine, so the list is spelled here. */
        if (strcmp(val, "f32") != 0 && strcmp(val, "f16") != 0 && strcmp(val, "q8_0") != 0) {
            return bad(c, path, "must be f32, f16 or q8_0, got \"%.40s\"", val);
        }
        l->kv_cache_type = val;
        return SP_OK;
    }
    if (strcmp(key, "gpu_layers") == 0) {
        /* Layers on the GPU (docs/cuda.md): checked against the model's layer
         * count where it is placed (serving/registry.c). */
        return SP_OK;
    }
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if (strcmp(key, nums[i].key) != 0) continue;
        if (nums[i].is_int) {
            int64_t v;
            if (parse_i64(val, (int64_t)nums[i].lo, (int64_t)nums[i].hi, &v)) {
                return bad(c, path, "must be an integer in [%lld, %lld], got \"%.40s\"",
                           (long long)nums[i].lo, (long long)nums[i].hi, val);
            }
            switch (i) {
            case 0: l->context_length = (int32_t)v; break;
            case 1: l->kv_blocks = (int32_t)v; break;
            case 2: l->max_tokens = (int32_t)v; break;
            case 3: l->top_k = (int32_t)v; break;
            case 4: l->seed = v; break;
            default: l->num_speculative_tokens = (int32_t)v; break;
            }
        } else {
            double v;
            if (parse_num(val, nums[i].lo, nums[i].hi, &v)) {
                return bad(c, path, "must be a number in [%g, %g], got \"%.40s\"", nums[i].lo,
                           nums[i].hi, val);
            }
            double *dst[] = {&l->temperature, &l->top_p, &l->min_p, &l->repeat_penalty,
                             &l->frequency_penalty, &l->presence_penalty};
            *dst[i - 5] = v;
        }
        return SP_OK;
    }
    return bad(c, path,
               "unknown parameter for backend llm (context_length, kv_blocks, chat_template, "
               "chat_template_file, model_file, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, "
               "frequency_penalty, presence_penalty, seed, encryption_key_file, "
               "encryption_key_env, gpu_layers, draft_model, num_speculative_tokens, "
               "kv_cache_type)");
}

static sp_status_t
parse_params(const pctx_t *c, const json_t *o, sp_repo_config_t *cfg)
{
    static const char *const keys[] = {"string_value", NULL};
    if (!json_is_object(o)) return bad(c, "parameters", "must be an object");
    if (json_object_size(o) > SP_REPO_MAX_PARAMS) {
        return bad(c, "parameters", "more than %d entries", SP_REPO_MAX_PARAMS);
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        char p[320];
        snprintf(p, sizeof p, "parameters.%.128s", key);
        if (strlen(key) == 0 || strlen(key) > SP_REPO_NAME_MAX) {
            return bad(c, p, "key must be 1 to %d bytes", SP_REPO_NAME_MAX);
        }
        if (!json_is_object(v)) return bad(c, p, "must be an object {\"string_value\": \"...\"}");
        sp_status_t st = check_keys(c, p, v, keys);
        if (st) return st;
        const char *s = NULL;
        int r = get_str(c, v, p, "string_value", SP_REPO_PARAM_VALUE_MAX, &s);
        if (r < 0) return (sp_status_t)r;
        char sp_[352];
        snprintf(sp_, sizeof sp_, "%s.string_value", p);
        if (r == 0) return bad(c, sp_, "is required");
        sp_repo_param_t *pr = &cfg->param[cfg->n_params];
        pr->value = sp_strndup(s, strlen(s));
        if (!pr->value) return sp_errf(c->err, c->err_len, SP_ERR_NOMEM, "%s: out of memory", c->file);
        snprintf(pr->key, sizeof pr->key, "%s", key);
        cfg->n_params++;
        if (cfg->backend == SP_REPO_BACKEND_LLM) {
            st = llm_param(c, sp_, key, pr->value, &cfg->llm);
            if (st) return st;
        }
    }
    if (cfg->llm.encryption_key_file && cfg->llm.encryption_key_env) {
        return bad(c, "parameters",
                   "set only one of encryption_key_file and encryption_key_env");
    }
    if (cfg->llm.chat_template && cfg->llm.chat_template_file) {
        return bad(c, "parameters", "set only one of chat_template and chat_template_file");
    }
    return SP_OK;
}

/* ---- Triton's platform and backend names */

/* Triton's platforms and backends that have no Sampan backend, with why. */
static const struct {
    const char *name;
    const char *why;
} refused_names[] = {
    {"python", "Python models (model.py) are not run by Sampan: serve the model with the llm or "
               "xgboost backend, or a C backend plugin (docs/backends.md)"},
    {"tensorrt", "TensorRT engines are not supported (the CUDA backend runs GGUF models)"},
    {"tensorrt_plan", "TensorRT engines are not supported (the CUDA backend runs GGUF models)"},
    {"tensorflow_graphdef", "TensorFlow models have no Sampan backend"},
    {"tensorflow_savedmodel", "TensorFlow models have no Sampan backend"},
    {"pytorch_libtorch", "TorchScript models have no Sampan backend"},
    {"ensemble", "ensembles are not supported (ensemble_scheduling)"},
};

/* A backend or platform name as Sampan's backend name; NULL (with *why) when refused. */
static const char *
map_backend_name(const char *s, bool platform, const char **why)
{
    *why = NULL;
    for (size_t i = 0; i < sizeof refused_names / sizeof refused_names[0]; i++) {
        if (strcmp(s, refused_names[i].name) == 0) {
            *why = refused_names[i].why;
            return NULL;
        }
    }
    if (strcmp(s, "onnxruntime_onnx") == 0 || (!platform && strcmp(s, "onnxruntime") == 0)) {
        return "onnx";
    }
    if (!platform && strcmp(s, "fil") == 0) return "xgboost";
    if (platform) {
        *why = "unknown platform (Sampan maps onnxruntime_onnx; give the backend instead: llm, "
               "xgboost, fil, or a plugin's name)";
        return NULL;
    }
    return s;
}

static sp_status_t
set_param(const pctx_t *c, json_t *params, const char *key, const char *value)
{
    json_t *v = json_pack("{s:s}", "string_value", value);
    if (!v || json_object_set_new(params, key, v)) {
        return sp_errf(c->err, c->err_len, SP_ERR_NOMEM, "%s: out of memory", c->file);
    }
    return SP_OK;
}

static const char *
param_str(const json_t *params, const char *key)
{
    const json_t *sv = json_object_get(json_object_get(params, key), "string_value");
    return json_is_string(sv) ? json_string_value(sv) : NULL;
}

/* Triton FIL's parameters, for the xgboost backend: model_type names the file
 * Triton's FIL would read; output_class / predict_proba must ask for what the
 * xgboost backend returns (the objective's output: scores, or probabilities);
 * storage_type and algo are accepted with their AUTO values, which leave the
 * choice to the backend, as the xgboost backend does. Each mapped key is
 * removed; anything else stays for the backend to check. */
static sp_status_t
map_fil_params(const pctx_t *c, json_t *root)
{
    json_t *params = json_object_get(root, "parameters");
    if (params && !json_is_object(params)) return SP_OK; /* the checks below say so */
    if (!params) {
        params = json_object();
        if (!params || json_object_set_new(root, "parameters", params)) {
            return sp_errf(c->err, c->err_len, SP_ERR_NOMEM, "%s: out of memory", c->file);
        }
    }
    const char *mt = param_str(params, "model_type");
    const char *file = NULL;
    if (mt == NULL || strcmp(mt, "xgboost") == 0) {
        file = "xgboost.model";
    } else if (strcmp(mt, "xgboost_json") == 0) {
        file = "xgboost.json";
    } else if (strcmp(mt, "xgboost_ubj") == 0) {
        file = "xgboost.ubj";
    } else {
        return bad(c, "parameters.model_type", "\"%.40s\": the fil backend maps to Sampan's xgboost "
                   "backend, which reads xgboost, xgboost_json and xgboost_ubj models only", mt);
    }
    sp_status_t st = SP_OK;
    if (!param_str(params, "model_file")) st = set_param(c, params, "model_file", file);
    if (st) return st;
    json_object_del(params, "model_type");
    const char *oc = param_str(params, "output_class"), *pp = param_str(params, "predict_proba");
    bool cls = oc && strcmp(oc, "true") == 0, proba = pp && strcmp(pp, "true") == 0;
    if (oc && !cls && strcmp(oc, "false") != 0) {
        return bad(c, "parameters.output_class", "must be \"true\" or \"false\"");
    }
    if (pp && !proba && strcmp(pp, "false") != 0) {
        return bad(c, "parameters.predict_proba", "must be \"true\" or \"false\"");
    }
    if (cls && !proba) {
        return bad(c, "parameters.output_class", "FIL's class-index output (output_class without "
                   "predict_proba) is not produced by the xgboost backend: set predict_proba "
                   "\"true\" for the probabilities");
    }
    if (proba && !cls) {
        return bad(c, "parameters.predict_proba", "needs output_class \"true\"");
    }
    if (param_str(params, "threshold")) {
        return bad(c, "parameters.threshold", "applies to FIL's class-index output only, which "
                   "the xgboost backend does not produce");
    }
    static const struct {
        const char *key, *value;
    } autos[] = {{"storage_type", "AUTO"}, {"algo", "ALGO_AUTO"}};
    for (size_t i = 0; i < 2; i++) {
        const char *v = param_str(params, autos[i].key);
        if (!v) continue;
        if (strcmp(v, autos[i].value) != 0) {
            char p[64];
            snprintf(p, sizeof p, "parameters.%s", autos[i].key);
            return bad(c, p, "\"%.40s\": a FIL GPU layout choice; only %s (the backend's own "
                       "choice) is accepted", v, autos[i].value);
        }
        json_object_del(params, autos[i].key);
    }
    json_object_del(params, "output_class");
    json_object_del(params, "predict_proba");
    return SP_OK;
}

/* platform / backend as Triton writes them, onto Sampan's backend (in root). */
static sp_status_t
map_triton_names(const pctx_t *c, json_t *root)
{
    static const struct {
        const char *key, *why;
    } refused_keys[] = {
        {"sequence_batching", "stateful models (the sequence batcher) are not supported: Sampan's "
                              "LLM backend keeps its own per-request state"},
        {"ensemble_scheduling", "ensembles are not supported (chain the models in the client)"},
    };
    for (size_t i = 0; i < 2; i++) {
        if (json_object_get(root, refused_keys[i].key)) {
            return bad(c, refused_keys[i].key, "%s", refused_keys[i].why);
        }
    }
    const json_t *pj = json_object_get(root, "platform"), *bj = json_object_get(root, "backend");
    const char *why = NULL, *from_platform = NULL, *from_backend = NULL;
    if (pj) {
        if (!json_is_string(pj)) return bad(c, "platform", "must be a string");
        const char *ps = json_string_value(pj);
        if (ps[0]) {
            from_platform = map_backend_name(ps, true, &why);
            if (!from_platform) return bad(c, "platform", "\"%.40s\": %s", ps, why);
        }
    }
    if (bj && json_is_string(bj) && json_string_value(bj)[0]) {
        const char *bs = json_string_value(bj);
        bool fil = strcmp(bs, "fil") == 0;
        from_backend = map_backend_name(bs, false, &why);
        if (!from_backend) return bad(c, "backend", "\"%.40s\": %s", bs, why);
        if (from_platform && strcmp(from_platform, from_backend) != 0) {
            return bad(c, "backend", "\"%.40s\" does not match platform \"%s\"", bs,
                       json_string_value(pj));
        }
        if (fil) {
            sp_status_t st = map_fil_params(c, root);
            if (st) return st;
        }
    }
    const char *b = from_backend ? from_backend : from_platform;
    if (b && (!bj || strcmp(json_string_value(bj), b) != 0)) {
        json_t *v = json_string(b);
        if (!v || json_object_set_new(root, "backend", v)) {
            return sp_errf(c->err, c->err_len, SP_ERR_NOMEM, "%s: out of memory", c->file);
        }
    }
    return SP_OK;
}

/* model_transaction_policy.decoupled: whether a request may get several
 * responses. The llm backend always is (streaming); the others never are. */
static sp_status_t
parse_transaction(const pctx_t *c, const json_t *o, const sp_repo_config_t *cfg)
{
    static const char *const keys[] = {"decoupled", NULL};
    if (!json_is_object(o)) return bad(c, "model_transaction_policy", "must be an object");
    sp_status_t st = check_keys(c, "model_transaction_policy", o, keys);
    if (st) return st;
    const json_t *d = json_object_get(o, "decoupled");
    if (d && !json_is_boolean(d)) {
        return bad(c, "model_transaction_policy.decoupled", "must be true or false");
    }
    bool dec = json_is_true(d);
    if (cfg->backend == SP_REPO_BACKEND_LLM && d && !dec) {
        return bad(c, "model_transaction_policy.decoupled", "an llm model is decoupled (its "
                   "tokens stream as several responses): leave this out or set it true");
    }
    if (cfg->backend != SP_REPO_BACKEND_LLM && dec) {
        return bad(c, "model_transaction_policy.decoupled", "the %s backend answers each request "
                   "with one response: leave this out or set it false", cfg->backend_name);
    }
    return SP_OK;
}

/* ---- top level */

static sp_status_t from_json_mapped(const json_t *root, const char *file, sp_repo_config_t *cfg,
                                    char *err, size_t err_len);

sp_status_t
sp_repo_config_from_json(const json_t *root, const char *file, sp_repo_config_t *cfg, char *err,
                         size_t err_len)
{
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(root)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be a JSON object", file);
    }
    /* Triton's names are mapped on a copy, so that cfg->json (what backends and
     * /v2/models/{m}/config see) holds the backend that runs the model. */
    json_t *copy = json_deep_copy(root);
    if (!copy) return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", file);
    pctx_t c = {file, err, err_len};
    sp_status_t st = map_triton_names(&c, copy);
    if (!st) st = from_json_mapped(copy, file, cfg, err, err_len);
    json_decref(copy);
    return st;
}

static sp_status_t
from_json_mapped(const json_t *root, const char *file, sp_repo_config_t *cfg, char *err,
                 size_t err_len)
{
    static const char *const keys[] = {
        "name",           "backend",          "max_batch_size", "input",
        "output",         "instance_group",   "version_policy", "dynamic_batching",
        "parameters",     "load_on_demand",   "response_cache", "platform",
        "model_transaction_policy", NULL,
    };
    pctx_t c = {file, err, err_len};
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->backend_name, sizeof cfg->backend_name, "llm");
    cfg->version_policy.kind = SP_REPO_POLICY_LATEST;
    cfg->version_policy.num_versions = 1;
    sp_repo_llm_t *l = &cfg->llm;
    l->context_length = l->kv_blocks = l->max_tokens = l->top_k = -1;
    l->seed = -1;
    l->temperature = l->top_p = l->min_p = NAN;
    l->repeat_penalty = l->frequency_penalty = l->presence_penalty = NAN;

    if (!json_is_object(root)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be a JSON object", file);
    }
    sp_status_t st = check_keys(&c, "", root, keys);
    if (st) return st;

    const char *s = NULL;
    int r = get_str(&c, root, "", "name", SP_REPO_NAME_MAX, &s);
    if (r < 0) return (sp_status_t)r;
    if (r) {
        char e[256];
        if (sp_repo_path_check_name(s, e, sizeof e) != SP_OK) return bad(&c, "name", "%s", e);
        snprintf(cfg->name, sizeof cfg->name, "%s", s);
    }
    r = get_str(&c, root, "", "backend", 32, &s);
    if (r < 0) return (sp_status_t)r;
    if (r && s[0]) { /* "" is Triton's printed default: none */
        if (strcmp(s, "llm") == 0) {
            cfg->backend = SP_REPO_BACKEND_LLM;
        } else if (strcmp(s, "xgboost") == 0) {
            cfg->backend = SP_REPO_BACKEND_XGBOOST;
        } else {
            /* A plugin (docs/backends.md): found as libsampan_<name>.so at load time. */
            size_t n = strlen(s);
            bool ok = n > 0 && n <= 32;
            for (size_t i = 0; ok && i < n; i++) {
                ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_';
            }
            if (!ok) {
                return bad(&c, "backend", "\"%.40s\" is not a backend name ([a-z0-9_], 1 to 32)", s);
            }
            cfg->backend = SP_REPO_BACKEND_PLUGIN;
        }
        /* Triton's names (onnxruntime, fil, the platforms) were mapped before: map_triton_names. */
        snprintf(cfg->backend_name, sizeof cfg->backend_name, "%s", s);
    }
    int64_t v = 0;
    r = get_int(&c, root, "", "max_batch_size", 0, 65536, &v);
    if (r < 0) return (sp_status_t)r;
    cfg->max_batch_size = (int32_t)v;

    const json_t *o;
    if ((o = json_object_get(root, "input"))) {
        st = parse_tensors(&c, o, "input", true, cfg->input, &cfg->n_inputs);
        if (st) return st;
    }
    if ((o = json_object_get(root, "output"))) {
        st = parse_tensors(&c, o, "output", false, cfg->output, &cfg->n_outputs);
        if (st) return st;
    }
    if ((o = json_object_get(root, "instance_group"))) {
        st = parse_groups(&c, o, cfg);
        if (st) return st;
    }
    if ((o = json_object_get(root, "version_policy"))) {
        st = parse_policy(&c, o, &cfg->version_policy);
        if (st) return st;
    }
    if ((o = json_object_get(root, "dynamic_batching"))) {
        st = parse_batching(&c, o, cfg);
        if (st) return st;
    }
    if ((o = json_object_get(root, "parameters"))) {
        st = parse_params(&c, o, cfg);
        if (st) return st;
        st = params_image(&c, cfg);
        if (st) return st;
    }
    if ((o = json_object_get(root, "model_transaction_policy"))) {
        st = parse_transaction(&c, o, cfg);
        if (st) return st;
    }
    if ((o = json_object_get(root, "load_on_demand"))) {
        if (!json_is_boolean(o)) return bad(&c, "load_on_demand", "must be true or false");
        cfg->load_on_demand = json_is_true(o);
    }
    if ((o = json_object_get(root, "response_cache"))) {
        /* Triton's {"enable": true}; the size is the server's (--response-cache-bytes). */
        static const char *const rc_keys[] = {"enable", NULL};
        if (!json_is_object(o)) return bad(&c, "response_cache", "must be an object");
        st = check_keys(&c, "response_cache", o, rc_keys);
        if (st) return st;
        const json_t *en = json_object_get(o, "enable");
        if (en && !json_is_boolean(en)) return bad(&c, "response_cache.enable", "must be true or false");
        cfg->response_cache = json_is_true(en);
    }
    /* The whole (merged) config as text, for backend plugins. */
    char *txt = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (txt) {
        cfg->json = sp_strndup(txt, strlen(txt));
        /* jansson's own free: the server routes jansson through sp_malloc (json.c). */
        json_free_t jfree = NULL;
        json_get_alloc_funcs(NULL, &jfree);
        jfree(txt);
    }
    if (cfg->json == NULL) {
        return sp_errf(c.err, c.err_len, SP_ERR_NOMEM, "%s: out of memory", c.file);
    }
    return SP_OK;
}

void
sp_repo_config_free(sp_repo_config_t *c)
{
    if (!c) return;
    for (int32_t i = 0; i < c->n_params; i++) {
        sp_free(c->param[i].value);
        c->param[i].value = NULL;
    }
    c->n_params = 0;
    sp_free(c->json);
    c->json = NULL;
    c->llm.chat_template = c->llm.model_file = NULL;
    c->llm.encryption_key_file = c->llm.encryption_key_env = NULL;
}

sp_status_t
sp_repo_config_llm_keys(const sp_repo_config_t *cfg, const char *root, const char *model,
                        sp_enc_key_src_t *out, char *err, size_t err_len)
{
    return sp_repo_config_llm_keys_ex(cfg, root, model, NULL, out, err, err_len);
}

sp_status_t
sp_repo_config_llm_keys_ex(const sp_repo_config_t *cfg, const char *root, const char *model,
                           const char *key_dir, sp_enc_key_src_t *out, char *err,
                           size_t err_len)
{
    if (cfg == NULL) {
        sp_enc_key_src_default(out);
        return SP_OK;
    }
    memset(out, 0, sizeof *out);
    const char *kf = cfg->llm.encryption_key_file, *ke = cfg->llm.encryption_key_env;
    if (ke) {
        snprintf(out->env, sizeof out->env, "%s", ke);
        return SP_OK;
    }
    if (kf == NULL) {
        out->hint = "set parameters.encryption_key_file or parameters.encryption_key_env in its "
                    "config.json";
        return SP_OK;
    }
    if (cfg->llm.key_from_request) {
        /* A client's choice: only a key the operator put in --key-dir. */
        char kd_real[PATH_MAX], e[PATH_MAX + 64];
        if (key_dir == NULL || key_dir[0] == '\0') {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "parameters.encryption_key_file: a load request may name a key file "
                           "only when the server has a key directory (--key-dir)");
        }
        if (realpath(key_dir, kd_real) == NULL ||
            sp_repo_path_resolve(kd_real, kf, out->file, sizeof out->file, e, sizeof e) != SP_OK) {
            out->file[0] = '\0';
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "parameters.encryption_key_file \"%s\": no such key in the server's "
                           "key directory", kf);
        }
        return SP_OK;
    }
    if (kf[0] == '/') {
        snprintf(out->file, sizeof out->file, "%s", kf);
        return SP_OK;
    }
    /* Relative: under the model directory, and never out of the repository. */
    char root_real[PATH_MAX], rel[PATH_MAX], e[PATH_MAX + 64];
    if (root == NULL || root[0] == '\0' || realpath(root, root_real) == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "parameters.encryption_key_file \"%s\": a relative path needs the model "
                       "repository", kf);
    }
    int n = snprintf(rel, sizeof rel, "%s/%s", model, kf);
    if (n < 0 || (size_t)n >= sizeof rel) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "parameters.encryption_key_file: too long");
    }
    sp_status_t st = sp_repo_path_resolve(root_real, rel, out->file, sizeof out->file, e, sizeof e);
    if (st != SP_OK) {
        return sp_errf(err, err_len, st, "parameters.encryption_key_file: %s", e);
    }
    return SP_OK;
}

sp_status_t
sp_repo_config_llm_template_path(const sp_repo_config_t *cfg, const char *root, const char *model,
                                 char *out, size_t out_len, char *err, size_t err_len)
{
    out[0] = '\0';
    const char *tf = cfg ? cfg->llm.chat_template_file : NULL;
    if (tf == NULL) {
        return SP_OK;
    }
    char root_real[PATH_MAX], rel[PATH_MAX], e[PATH_MAX + 64];
    if (root == NULL || root[0] == '\0' || realpath(root, root_real) == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "parameters.chat_template_file \"%s\": needs the model repository", tf);
    }
    int n = snprintf(rel, sizeof rel, "%s/%s", model, tf);
    if (n < 0 || (size_t)n >= sizeof rel) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "parameters.chat_template_file: too long");
    }
    sp_status_t st = sp_repo_path_resolve(root_real, rel, out, out_len, e, sizeof e);
    if (st != SP_OK) {
        out[0] = '\0';
        return sp_errf(err, err_len, st, "parameters.chat_template_file: %s", e);
    }
    return SP_OK;
}

const char *
sp_repo_config_param(const sp_repo_config_t *c, const char *key)
{
    for (int32_t i = 0; i < c->n_params; i++) {
        if (strcmp(c->param[i].key, key) == 0) return c->param[i].value;
    }
    return NULL;
}

sp_status_t
sp_repo_config_parse_text(const char *text, size_t len, const char *file, json_t **out, char *err,
                          size_t err_len)
{
    *out = NULL;
    if (len > SP_REPO_CONFIG_MAX) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: larger than %d bytes", file,
                       SP_REPO_CONFIG_MAX);
    }
    /* Nesting is bounded by jansson itself (2048 levels) and by the size cap. */
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: invalid JSON at line %d, column %d: %s",
                       file, je.line, je.column, je.text);
    }
    *out = j;
    return SP_OK;
}

sp_status_t
sp_repo_config_merge(json_t *base, const json_t *ov, const char *file, char *err, size_t err_len)
{
    pctx_t c = {file, err, err_len};
    if (!json_is_object(base)) return sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be a JSON object", file);
    if (!json_is_object(ov)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: config override: must be a JSON object",
                       file);
    }
    const json_t *on = json_object_get(ov, "name"), *bn = json_object_get(base, "name");
    if (on && bn && !json_equal((json_t *)on, (json_t *)bn)) {
        return bad(&c, "name", "the config override names another model");
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)ov, key, v) {
        json_t *bp = json_object_get(base, "parameters");
        if (strcmp(key, "parameters") == 0 && json_is_object(v) && !bp) {
            /* Merge into an empty object so that null entries are dropped here too. */
            if (json_object_set_new(base, "parameters", json_object())) {
                return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", file);
            }
            bp = json_object_get(base, "parameters");
        }
        if (strcmp(key, "parameters") == 0 && json_is_object(v) && json_is_object(bp)) {
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                int rc = json_is_null(pv) ? (json_object_del(bp, pk), 0)
                                          : json_object_set(bp, pk, pv);
                if (rc) return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", file);
            }
            continue;
        }
        if (json_object_set(base, key, v)) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", file);
        }
    }
    return SP_OK;
}

/* What a load request's override may say about keys (sp_repo_config_load). */
static sp_status_t
check_override(const json_t *ov, const char *label, bool *key_from_request, char *err,
               size_t err_len)
{
    const json_t *params = json_is_object(ov) ? json_object_get(ov, "parameters") : NULL;
    if (!json_is_object(params)) {
        return SP_OK;
    }
    const json_t *tf = json_object_get(params, "chat_template_file");
    if (tf && !json_is_null(tf)) {
        /* the file is compiled and its errors quote it: a client must not read
         * the repository's files through them */
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: parameters.chat_template_file: a load request may not name a file "
                       "(give the template as parameters.chat_template)", label);
    }
    const json_t *env = json_object_get(params, "encryption_key_env");
    if (env && !json_is_null(env)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: parameters.encryption_key_env: a load request may not choose an "
                       "environment variable (set it in config.json)", label);
    }
    const json_t *kf = json_object_get(params, "encryption_key_file");
    if (kf == NULL || json_is_null(kf)) {
        return SP_OK;
    }
    const json_t *sv = json_is_object(kf) ? json_object_get(kf, "string_value") : NULL;
    char e[256];
    if (!json_is_string(sv) ||
        sp_repo_path_check_name_n(json_string_value(sv), json_string_length(sv), e, sizeof e) !=
            SP_OK) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: parameters.encryption_key_file: a load request names a key by its "
                       "file name in the server's key directory (--key-dir): "
                       "{\"string_value\": \"NAME\"} with no '/'", label);
    }
    *key_from_request = true;
    return SP_OK;
}

sp_status_t
sp_repo_config_load(const char *path, const char *label, const char *override_json,
                    size_t override_len, sp_repo_config_t *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t len = 0;
    sp_status_t st = sp_file_read(path, label, SP_REPO_CONFIG_MAX, &text, &len, err, err_len);
    if (st) return st;
    json_t *j = NULL, *ov = NULL;
    /* config.pbtxt: the text format, read into the same JSON (repo_pbtxt.h);
     * its positions let a check below name the line. */
    size_t pl = strlen(path);
    bool pbtxt = pl >= 6 && strcmp(path + pl - 6, ".pbtxt") == 0;
    sp_pbtxt_posmap_t pos = {0};
    if (pbtxt) {
        st = sp_repo_pbtxt_parse(text, len, label, &j, &pos, err, err_len);
    } else {
        st = sp_repo_config_parse_text(text, len, label, &j, err, err_len);
    }
    sp_free(text);
    if (st) {
        sp_pbtxt_posmap_free(&pos);
        return st;
    }
    bool key_from_request = false;
    if (override_json) {
        char ol[300];
        snprintf(ol, sizeof ol, "%s (config override)", label);
        st = sp_repo_config_parse_text(override_json, override_len, ol, &ov, err, err_len);
        if (!st) st = check_override(ov, ol, &key_from_request, err, err_len);
        if (!st) st = sp_repo_config_merge(j, ov, label, err, err_len);
    }
    if (!st) {
        st = sp_repo_config_from_json(j, label, out, err, err_len);
        /* Located in the file only when nothing was merged over it. */
        if (st && pbtxt && !override_json) sp_repo_pbtxt_locate(&pos, label, err, err_len);
    }
    sp_pbtxt_posmap_free(&pos);
    if (!st) out->llm.key_from_request = key_from_request;
    json_decref(ov);
    json_decref(j);
    return st;
}
