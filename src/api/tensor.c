/*
 * tensor.c - typed tensors and the KServe v2 inference request/response codec
 * (see tensor.h for the contract).
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/kernels.h"
#include "api/tensor.h"

/* The binary tail and the fixed-size layouts are little-endian; so is every
 * machine Sampan builds for (x86-64). memcpy between them is exact. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor.c assumes a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[SP_DT_COUNT] = {
    [SP_DT_BOOL] = {"BOOL", 1},   [SP_DT_UINT8] = {"UINT8", 1},   [SP_DT_UINT16] = {"UINT16", 2},
    [SP_DT_UINT32] = {"UINT32", 4}, [SP_DT_UINT64] = {"UINT64", 8}, [SP_DT_INT8] = {"INT8", 1},
    [SP_DT_INT16] = {"INT16", 2}, [SP_DT_INT32] = {"INT32", 4},   [SP_DT_INT64] = {"INT64", 8},
    [SP_DT_FP16] = {"FP16", 2},   [SP_DT_FP32] = {"FP32", 4},     [SP_DT_FP64] = {"FP64", 8},
    [SP_DT_BYTES] = {"BYTES", 0},
};

const char *
sp_tensor_dtype_name(sp_dtype_t t)
{
    return (unsigned)t < SP_DT_COUNT ? dtypes[t].name : "?";
}

int
sp_tensor_dtype_parse(const char *s, size_t len)
{
    for (int i = 0; i < SP_DT_COUNT; i++) {
        if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, s, len) == 0) {
            return i;
        }
    }
    return -1;
}

size_t
sp_tensor_dtype_size(sp_dtype_t t)
{
    return (unsigned)t < SP_DT_COUNT ? dtypes[t].size : 0;
}

/* ------------------------------------------------------------- tensors */

/* Element count of a shape, overflow-checked; -1 when a dimension is negative
 * or the product does not fit (kept well below INT64_MAX so that n * 8 bytes
 * never overflows either). */
static int64_t
shape_count(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n) || n > (INT64_MAX >> 4)) {
            return -1;
        }
    }
    return n;
}

static sp_status_t
tensor_init(sp_tensor_t *t, const char *name, sp_dtype_t dt, int ndim, const int64_t *shape,
            char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    size_t nl = strlen(name);
    if (nl == 0 || nl >= SP_TENSOR_MAX_NAME) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "tensor name must have 1 to %d bytes",
                       SP_TENSOR_MAX_NAME - 1);
    }
    if ((unsigned)dt >= SP_DT_COUNT || ndim < 0 || ndim > SP_TENSOR_MAX_DIMS) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "tensor '%s': bad datatype or rank", name);
    }
    memcpy(t->name, name, nl + 1);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
    }
    t->n = shape_count(ndim, shape);
    if (t->n < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "tensor '%s': the shape has a negative dimension or too many elements", name);
    }
    return SP_OK;
}

sp_status_t
sp_tensor_alloc(sp_tensor_t *t, const char *name, sp_dtype_t dt, int ndim, const int64_t *shape,
                char *err, size_t err_len)
{
    sp_status_t st = tensor_init(t, name, dt, ndim, shape, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    size_t el = dt == SP_DT_BYTES ? sizeof(sp_str_t) : dtypes[dt].size;
    t->data = sp_calloc(t->n ? (size_t)t->n : 1, el);
    if (dt == SP_DT_BYTES) {
        t->store = sp_calloc(1, 1);
        sp_str_t *e = t->data;
        for (int64_t i = 0; e && t->store && i < t->n; i++) {
            e[i].ptr = t->store;
            e[i].len = 0;
        }
    }
    if (t->data == NULL || (dt == SP_DT_BYTES && t->store == NULL)) {
        sp_tensor_free(t);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "tensor '%s' does not fit in memory", name);
    }
    return SP_OK;
}

sp_status_t
sp_tensor_from_strs(sp_tensor_t *t, const char *name, int ndim, const int64_t *shape,
                    const sp_str_t *elems, char *err, size_t err_len)
{
    sp_status_t st = tensor_init(t, name, SP_DT_BYTES, ndim, shape, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    size_t total = 1;
    for (int64_t i = 0; i < t->n; i++) {
        if (sp_add_size(total, elems[i].len + 1, &total) != 0) {
            return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "tensor '%s' is too large", name);
        }
    }
    t->data = sp_calloc(t->n ? (size_t)t->n : 1, sizeof(sp_str_t));
    t->store = sp_malloc(total);
    if (t->data == NULL || t->store == NULL) {
        sp_tensor_free(t);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "tensor '%s' does not fit in memory", name);
    }
    sp_str_t *e = t->data;
    size_t off = 0;
    for (int64_t i = 0; i < t->n; i++) {
        if (elems[i].len) {
            memcpy(t->store + off, elems[i].ptr, elems[i].len);
        }
        t->store[off + elems[i].len] = '\0';
        e[i].ptr = t->store + off;
        e[i].len = elems[i].len;
        off += elems[i].len + 1;
    }
    t->store[off] = '\0';
    t->store_len = off;
    return SP_OK;
}

void
sp_tensor_free(sp_tensor_t *t)
{
    if (t == NULL) {
        return;
    }
    sp_free(t->data);
    sp_free(t->store);
    memset(t, 0, sizeof *t);
}

double
sp_tensor_f64(const sp_tensor_t *t, int64_t i)
{
    const void *p = (const char *)t->data + (size_t)i * dtypes[t->dtype].size;
    switch (t->dtype) {
    case SP_DT_BOOL:
    case SP_DT_UINT8: return *(const uint8_t *)p;
    case SP_DT_UINT16: return *(const uint16_t *)p;
    case SP_DT_UINT32: return *(const uint32_t *)p;
    case SP_DT_UINT64: return (double)*(const uint64_t *)p;
    case SP_DT_INT8: return *(const int8_t *)p;
    case SP_DT_INT16: return *(const int16_t *)p;
    case SP_DT_INT32: return *(const int32_t *)p;
    case SP_DT_INT64: return (double)*(const int64_t *)p;
    case SP_DT_FP16: return sp_fp16_to_fp32(*(const sp_fp16_t *)p);
    case SP_DT_FP32: return *(const float *)p;
    case SP_DT_FP64: return *(const double *)p;
    default: return 0;
    }
}

int64_t
sp_tensor_i64(const sp_tensor_t *t, int64_t i)
{
    const void *p = (const char *)t->data + (size_t)i * dtypes[t->dtype].size;
    switch (t->dtype) {
    case SP_DT_UINT64: {
        uint64_t v = *(const uint64_t *)p;
        return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
    }
    case SP_DT_INT64: return *(const int64_t *)p;
    case SP_DT_FP16:
    case SP_DT_FP32:
    case SP_DT_FP64: {
        double d = sp_tensor_f64(t, i);
        if (d != d) {
            return 0; /* NaN (binary data can hold one) */
        }
        return d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : (int64_t)d;
    }
    default: return (int64_t)sp_tensor_f64(t, i);
    }
}

sp_str_t
sp_tensor_str(const sp_tensor_t *t, int64_t i)
{
    return ((const sp_str_t *)t->data)[i];
}

/* ------------------------------------------------------------- decoding */

/* Error prefix of input i: "inputs[1] ('x')". Formatted only when an error
 * needs it: a well-formed request never pays for the snprintf. */
typedef struct where {
    int i;
    const char *name;
    char s[SP_TENSOR_MAX_NAME + 32];
} where_t;

static void
where_set(where_t *w, int i, const char *name)
{
    w->i = i;
    w->name = name;
}

static const char *
where_str(where_t *w)
{
    const char *name = w->name;
    if (name && name[0]) {
        snprintf(w->s, sizeof w->s, "inputs[%d] ('%.64s%s')", w->i, name, strlen(name) > 64 ? "..." : "");
    } else {
        snprintf(w->s, sizeof w->s, "inputs[%d]", w->i);
    }
    return w->s;
}

/* "[1,30]" into buf (for error messages only: formatting is not free). */
static const char *
format_shape(char *buf, size_t cap, const sp_tensor_t *t)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++) {
        o += (size_t)snprintf(buf + o, cap - o, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    }
    if (o < cap) {
        snprintf(buf + o, cap - o, "]");
    }
    return buf;
}

/* Scalars anywhere under v (lists of lists), or -1 past limit. */
static int64_t
count_leaves(const json_t *v, int64_t limit)
{
    if (!json_is_array(v)) {
        return 1;
    }
    int64_t n = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        int64_t k = count_leaves(json_array_get(v, i), limit - n);
        if (k < 0 || (n += k) > limit) {
            return -1;
        }
    }
    return n;
}

/* Is v a list of exactly n scalars? */
static bool
is_flat(const json_t *v, int64_t n)
{
    if (!json_is_array(v) || (int64_t)json_array_size(v) != n) {
        return false;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        if (json_is_array(json_array_get(v, i))) {
            return false;
        }
    }
    return true;
}

/* Is v nested exactly as shape[depth..]? */
static bool
is_nested(const json_t *v, const sp_tensor_t *t, int depth)
{
    if (depth == t->ndim) {
        return !json_is_array(v);
    }
    if (!json_is_array(v) || (int64_t)json_array_size(v) != t->shape[depth]) {
        return false;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        if (!is_nested(json_array_get(v, i), t, depth + 1)) {
            return false;
        }
    }
    return true;
}

typedef struct fill {
    sp_tensor_t *t;
    int64_t i;       /* next element */
    sp_jbuf_t store; /* BYTES: element bytes; sp_str_t ptrs hold offsets until the end */
    where_t *w;
    char *err;
    size_t err_len;
} fill_t;

static sp_status_t
elem_err(fill_t *f, const char *what, const json_t *v)
{
    const char *got = json_is_string(v) ? "a string" : json_is_integer(v) ? "an integer"
                      : json_is_real(v) ? "a number" : json_is_boolean(v) ? "a boolean"
                      : json_is_null(v) ? "null" : json_is_object(v) ? "an object" : "a list";
    char num[48] = "";
    if (json_is_integer(v)) {
        snprintf(num, sizeof num, " (%lld)", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        snprintf(num, sizeof num, " (%g)", json_real_value(v));
    }
    return sp_errf(f->err, f->err_len, SP_ERR_INVALID, "%s.data[%lld]: expected %s for %s, got %s%s",
                   where_str(f->w), (long long)f->i, what, sp_tensor_dtype_name(f->t->dtype), got, num);
}

/* Convert one JSON scalar into element f->i. */
static sp_status_t
put_elem(fill_t *f, const json_t *v)
{
    sp_tensor_t *t = f->t;
    void *p = (char *)t->data + (size_t)f->i * dtypes[t->dtype].size;
    static const struct {
        int64_t lo, hi;
    } ranges[SP_DT_COUNT] = {
        [SP_DT_UINT8] = {0, UINT8_MAX},          [SP_DT_UINT16] = {0, UINT16_MAX},
        [SP_DT_UINT32] = {0, UINT32_MAX},        [SP_DT_UINT64] = {0, INT64_MAX},
        [SP_DT_INT8] = {INT8_MIN, INT8_MAX},     [SP_DT_INT16] = {INT16_MIN, INT16_MAX},
        [SP_DT_INT32] = {INT32_MIN, INT32_MAX},  [SP_DT_INT64] = {INT64_MIN, INT64_MAX},
    };
    switch (t->dtype) {
    case SP_DT_BOOL:
        if (!json_is_boolean(v)) {
            return elem_err(f, "true or false", v);
        }
        *(uint8_t *)p = json_is_true(v) ? 1 : 0;
        break;
    case SP_DT_UINT8: case SP_DT_UINT16: case SP_DT_UINT32: case SP_DT_UINT64:
    case SP_DT_INT8: case SP_DT_INT16: case SP_DT_INT32: case SP_DT_INT64: {
        int64_t lo = ranges[t->dtype].lo, hi = ranges[t->dtype].hi;
        if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
            char what[80];
            snprintf(what, sizeof what, "an integer in %lld..%lld", (long long)lo, (long long)hi);
            return elem_err(f, what, v);
        }
        int64_t x = json_integer_value(v);
        switch (t->dtype) {
        case SP_DT_UINT8: *(uint8_t *)p = (uint8_t)x; break;
        case SP_DT_UINT16: *(uint16_t *)p = (uint16_t)x; break;
        case SP_DT_UINT32: *(uint32_t *)p = (uint32_t)x; break;
        case SP_DT_UINT64: *(uint64_t *)p = (uint64_t)x; break;
        case SP_DT_INT8: *(int8_t *)p = (int8_t)x; break;
        case SP_DT_INT16: *(int16_t *)p = (int16_t)x; break;
        case SP_DT_INT32: *(int32_t *)p = (int32_t)x; break;
        default: *(int64_t *)p = x; break;
        }
        break;
    }
    case SP_DT_FP16: case SP_DT_FP32: case SP_DT_FP64: {
        if (!json_is_number(v)) {
            return elem_err(f, "a number", v);
        }
        double d = json_number_value(v);
        if (t->dtype == SP_DT_FP64) {
            *(double *)p = d;
        } else if (t->dtype == SP_DT_FP32) {
            if (fabs(d) > FLT_MAX) {
                return elem_err(f, "a number within the FP32 range", v);
            }
            *(float *)p = (float)d;
        } else {
            sp_fp16_t h = fabs(d) > FLT_MAX ? 0x7c00 : sp_fp32_to_fp16((float)d);
            if ((h & 0x7c00) == 0x7c00) {
                return elem_err(f, "a number within the FP16 range (+-65504)", v);
            }
            *(sp_fp16_t *)p = h;
        }
        break;
    }
    case SP_DT_BYTES: {
        if (!json_is_string(v)) {
            return elem_err(f, "a string", v);
        }
        sp_str_t *e = t->data;
        e[f->i].ptr = (const char *)(uintptr_t)f->store.len; /* an offset until the store settles */
        e[f->i].len = json_string_length(v);
        sp_jbuf_raw(&f->store, json_string_value(v), json_string_length(v));
        sp_jbuf_raw(&f->store, "", 1); /* the element's NUL */
        break;
    }
    default:
        return sp_errf(f->err, f->err_len, SP_ERR_INVALID, "%s: bad datatype", where_str(f->w));
    }
    f->i++;
    return SP_OK;
}

/* Elements of v in row-major order (v is flat or nested: both are walked the same way). */
static sp_status_t
fill_from(fill_t *f, const json_t *v)
{
    if (!json_is_array(v)) {
        return put_elem(f, v);
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        sp_status_t st = fill_from(f, json_array_get(v, i));
        if (st != SP_OK) {
            return st;
        }
    }
    return SP_OK;
}

/* Give BYTES elements their final pointers (the store may have moved while growing). */
static sp_status_t
settle_store(sp_tensor_t *t, sp_jbuf_t *store, where_t *w, char *err, size_t err_len)
{
    if (store->oom) {
        sp_jbuf_free(store);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: out of memory", where_str(w));
    }
    sp_jbuf_raw(store, "", 0); /* allocate even when empty */
    if (store->oom || store->p == NULL) {
        sp_jbuf_free(store);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: out of memory", where_str(w));
    }
    sp_str_t *e = t->data;
    for (int64_t i = 0; i < t->n; i++) {
        e[i].ptr = store->p + (uintptr_t)e[i].ptr;
    }
    t->store = store->p;
    t->store_len = store->len;
    return SP_OK;
}

static sp_status_t
decode_json_data(sp_tensor_t *t, const json_t *data, where_t *w, char *err, size_t err_len)
{
    char shp[160];
    const json_t *v = data;
    json_t *wrap = NULL;
    if (!json_is_array(data)) {
        if (t->ndim != 0 || json_is_object(data) || json_is_null(data)) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s.data: must be a list (flat, or nested as the shape %s)", where_str(w), format_shape(shp, sizeof shp, t));
        }
        v = wrap = json_array(); /* a rank-0 tensor may give its one element bare */
        if (wrap == NULL || json_array_append(wrap, (json_t *)data) != 0) {
            json_decref(wrap);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
    }
    sp_status_t st = SP_OK;
    if (!is_flat(v, t->n) && !is_nested(v, t, 0)) {
        int64_t leaves = count_leaves(v, t->n + 1);
        if (leaves != t->n) {
            st = sp_errf(err, err_len, SP_ERR_INVALID,
                         "%s.data: %s%lld elements, the shape %s has %lld", where_str(w),
                         leaves < 0 ? "more than " : "", (long long)(leaves < 0 ? t->n : leaves),
                         format_shape(shp, sizeof shp, t), (long long)t->n);
        } else {
            st = sp_errf(err, err_len, SP_ERR_INVALID,
                         "%s.data: the nesting does not match the shape %s (give a flat list in "
                         "row-major order, or lists nested as the shape)", where_str(w), format_shape(shp, sizeof shp, t));
        }
        json_decref(wrap);
        return st;
    }
    /* The count matches the data, so the allocation is bounded by the body. */
    size_t el = t->dtype == SP_DT_BYTES ? sizeof(sp_str_t) : dtypes[t->dtype].size;
    t->data = sp_calloc(t->n ? (size_t)t->n : 1, el);
    if (t->data == NULL) {
        json_decref(wrap);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: out of memory", where_str(w));
    }
    fill_t f = {t, 0, {NULL, 0, 0, false}, w, err, err_len};
    st = fill_from(&f, v);
    json_decref(wrap);
    if (st != SP_OK) {
        sp_jbuf_free(&f.store);
        return st;
    }
    return t->dtype == SP_DT_BYTES ? settle_store(t, &f.store, w, err, err_len) : SP_OK;
}

static uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* size bytes at p (already checked to lie inside the body) into t. */
static sp_status_t
decode_binary(sp_tensor_t *t, const unsigned char *p, size_t size, where_t *w, char *err,
              size_t err_len)
{
    char shp[160];
    if (t->dtype != SP_DT_BYTES) {
        size_t want;
        if (sp_mul_size((size_t)t->n, dtypes[t->dtype].size, &want) != 0 || want != size) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s.parameters.binary_data_size: %zu bytes, but the shape %s of %s "
                           "needs %lld x %zu", where_str(w), size, format_shape(shp, sizeof shp, t), sp_tensor_dtype_name(t->dtype),
                           (long long)t->n, dtypes[t->dtype].size);
        }
        t->data = sp_malloc(size ? size : 1);
        if (t->data == NULL) {
            return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: out of memory", where_str(w));
        }
        if (size) {
            memcpy(t->data, p, size);
        }
        if (t->dtype == SP_DT_BOOL) {
            for (size_t i = 0; i < size; i++) {
                if (p[i] > 1) {
                    return sp_errf(err, err_len, SP_ERR_INVALID,
                                   "%s: BOOL element %zu is byte %u (must be 0 or 1)", where_str(w), i, p[i]);
                }
            }
        }
        return SP_OK;
    }
    /* BYTES: each element is a 4-byte little-endian length and that many
     * bytes. Every element needs at least 4 bytes: the count is checked
     * against the size before anything is allocated. */
    if ((uint64_t)t->n > size / 4) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s.parameters.binary_data_size: %zu bytes cannot hold the %lld BYTES "
                       "elements of the shape %s (4-byte length each)", where_str(w), size, (long long)t->n, format_shape(shp, sizeof shp, t));
    }
    t->data = sp_calloc(t->n ? (size_t)t->n : 1, sizeof(sp_str_t));
    /* k elements parsed so far hold at most size - 4k bytes plus k NULs, and a
     * malformed element can claim bytes meant for later lengths: size + 1
     * bounds the store at every step, not only for a well-formed tail. */
    t->store = sp_malloc(size + 1);
    if (t->data == NULL || t->store == NULL) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: out of memory", where_str(w));
    }
    sp_str_t *e = t->data;
    size_t off = 0, so = 0;
    for (int64_t i = 0; i < t->n; i++) {
        if (size - off < 4) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s: binary data ends inside the length of BYTES element %lld", where_str(w),
                           (long long)i);
        }
        uint32_t n = le32(p + off);
        off += 4;
        if (n > size - off) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s: BYTES element %lld claims %u bytes, only %zu are left in its "
                           "binary_data_size", where_str(w), (long long)i, n, size - off);
        }
        memcpy(t->store + so, p + off, n);
        t->store[so + n] = '\0';
        e[i].ptr = t->store + so;
        e[i].len = n;
        so += (size_t)n + 1;
        off += n;
    }
    if (off != size) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: %zu bytes of binary data follow its %lld BYTES elements", where_str(w),
                       size - off, (long long)t->n);
    }
    t->store[so] = '\0';
    t->store_len = so;
    return SP_OK;
}

/* Parameters object of an input/output (absent or an object). */
static int
get_params(const json_t *obj, const json_t **out)
{
    const json_t *p = json_object_get(obj, "parameters");
    *out = NULL;
    if (p == NULL || json_is_null(p)) {
        return 0;
    }
    if (!json_is_object(p)) {
        return -1;
    }
    *out = p;
    return 1;
}

static sp_status_t
decode_input(const json_t *in, int idx, const unsigned char *tail, size_t tail_len, size_t *tail_off,
             bool have_header, sp_tensor_t *t, int64_t *bin_size, char *err, size_t err_len)
{
    *bin_size = -1; /* data in the JSON */
    where_t w;
    where_set(&w, idx, NULL);
    memset(t, 0, sizeof *t);
    if (!json_is_object(in)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: must be an object", where_str(&w));
    }
    const json_t *nm = json_object_get(in, "name");
    if (!json_is_string(nm)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s.name: required, a string", where_str(&w));
    }
    size_t nl = json_string_length(nm);
    if (nl == 0 || nl >= SP_TENSOR_MAX_NAME || strlen(json_string_value(nm)) != nl) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s.name: must have 1 to %d bytes and no NUL",
                       where_str(&w), SP_TENSOR_MAX_NAME - 1);
    }
    memcpy(t->name, json_string_value(nm), nl + 1);
    where_set(&w, idx, t->name);
    const json_t *dt = json_object_get(in, "datatype");
    if (!json_is_string(dt)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s.datatype: required, a string", where_str(&w));
    }
    int d = sp_tensor_dtype_parse(json_string_value(dt), json_string_length(dt));
    if (d < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s.datatype: unknown datatype '%.32s' (BOOL, UINT8, UINT16, UINT32, UINT64, "
                       "INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES)", where_str(&w), json_string_value(dt));
    }
    t->dtype = (sp_dtype_t)d;
    const json_t *sh = json_object_get(in, "shape");
    if (!json_is_array(sh)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s.shape: required, a list of integers", where_str(&w));
    }
    if (json_array_size(sh) > SP_TENSOR_MAX_DIMS) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s.shape: more than %d dimensions", where_str(&w),
                       SP_TENSOR_MAX_DIMS);
    }
    t->ndim = (int)json_array_size(sh);
    for (int i = 0; i < t->ndim; i++) {
        const json_t *x = json_array_get(sh, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s.shape[%d]: must be a non-negative integer", where_str(&w), i);
        }
        t->shape[i] = json_integer_value(x);
    }
    t->n = shape_count(t->ndim, t->shape);
    if (t->n < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s.shape: the product of the dimensions is too large", where_str(&w));
    }
    const json_t *params;
    if (get_params(in, &params) < 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s.parameters: must be an object", where_str(&w));
    }
    const json_t *bs = params ? json_object_get(params, "binary_data_size") : NULL;
    const json_t *data = json_object_get(in, "data");
    if (bs && !json_is_null(bs)) {
        if (!json_is_integer(bs) || json_integer_value(bs) < 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s.parameters.binary_data_size: must be a non-negative integer", where_str(&w));
        }
        if (data && !json_is_null(data)) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s: give either 'data' or parameters.binary_data_size, not both", where_str(&w));
        }
        uint64_t size = (uint64_t)json_integer_value(bs);
        size_t left = tail_len - *tail_off;
        if (!have_header && size > 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s.parameters.binary_data_size: binary data needs the "
                           "Inference-Header-Content-Length header", where_str(&w));
        }
        if (size > left) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s.parameters.binary_data_size: %llu bytes, but only %zu bytes of "
                           "binary data are left in the body", where_str(&w), (unsigned long long)size, left);
        }
        sp_status_t st = decode_binary(t, tail + *tail_off, (size_t)size, &w, err, err_len);
        *tail_off += (size_t)size;
        *bin_size = (int64_t)size;
        return st;
    }
    if (data == NULL || json_is_null(data)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s.data: required (or parameters.binary_data_size)", where_str(&w));
    }
    return decode_json_data(t, data, &w, err, err_len);
}

/* Inference-Header-Content-Length: decimal digits, at most the body length. */
static sp_status_t
header_length(sp_str_t h, size_t body_len, size_t *out, char *err, size_t err_len)
{
    uint64_t v = 0;
    if (h.len == 0 || h.len > 19) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "Inference-Header-Content-Length: must be a decimal byte count");
    }
    for (size_t i = 0; i < h.len; i++) {
        if (h.ptr[i] < '0' || h.ptr[i] > '9') {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "Inference-Header-Content-Length: must be a decimal byte count");
        }
        v = v * 10 + (uint64_t)(h.ptr[i] - '0');
    }
    if (v > body_len) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "Inference-Header-Content-Length: %llu is past the end of the body (%zu bytes)",
                       (unsigned long long)v, body_len);
    }
    *out = (size_t)v;
    return SP_OK;
}

/* The whole decoding, given the JSON part's length; bins[i] is the binary
 * byte count input i took, -1 for data in the JSON. */
static sp_status_t
parse_full(const char *body, size_t len, size_t json_len, bool have_header, int max_depth,
           sp_tensor_req_t *out, int64_t *bins, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    if (json_len == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "the request body is empty (an inference request object is expected)");
    }
    sp_status_t st = sp_json_parse(body, json_len, max_depth, &out->root, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    json_t *root = out->root;
    if (!json_is_object(root)) {
        sp_tensor_req_free(out);
        return sp_errf(err, err_len, SP_ERR_INVALID, "the request body must be a JSON object");
    }
    const json_t *id = json_object_get(root, "id");
    if (id && !json_is_null(id)) {
        if (!json_is_string(id) || strlen(json_string_value(id)) != json_string_length(id)) {
            sp_tensor_req_free(out);
            return sp_errf(err, err_len, SP_ERR_INVALID, "id: must be a string (without NUL)");
        }
        out->id = json_string_value(id);
        out->id_len = json_string_length(id);
    }
    if (get_params(root, &out->params) < 0) {
        sp_tensor_req_free(out);
        return sp_errf(err, err_len, SP_ERR_INVALID, "parameters: must be an object");
    }
    if (out->params) {
        const json_t *bo = json_object_get(out->params, "binary_data_output");
        if (bo && !json_is_null(bo) && !json_is_boolean(bo)) {
            sp_tensor_req_free(out);
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "parameters.binary_data_output: must be true or false");
        }
        out->binary_output = bo && json_is_true(bo);
    }
    const json_t *ins = json_object_get(root, "inputs");
    if (!json_is_array(ins) || json_array_size(ins) == 0 ||
        json_array_size(ins) > SP_INFER_MAX_TENSORS) {
        sp_tensor_req_free(out);
        return sp_errf(err, err_len, SP_ERR_INVALID, "inputs: required, a list of 1 to %d inputs",
                       SP_INFER_MAX_TENSORS);
    }
    size_t n_in = json_array_size(ins);
    out->inputs = sp_calloc(n_in, sizeof *out->inputs);
    if (out->inputs == NULL) {
        sp_tensor_req_free(out);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    const unsigned char *tail = (const unsigned char *)body + json_len;
    size_t tail_len = len - json_len, tail_off = 0;
    for (size_t i = 0; i < n_in; i++) {
        out->n_inputs = (int)i + 1; /* so that free releases a partly decoded one */
        st = decode_input(json_array_get(ins, i), (int)i, tail, tail_len, &tail_off, have_header,
                          &out->inputs[i], &bins[i], err, err_len);
        if (st != SP_OK) {
            sp_tensor_req_free(out);
            return st;
        }
        for (size_t k = 0; k < i; k++) {
            if (strcmp(out->inputs[k].name, out->inputs[i].name) == 0) {
                st = sp_errf(err, err_len, SP_ERR_INVALID, "inputs[%zu].name: duplicate input '%.64s'",
                             i, out->inputs[i].name);
                sp_tensor_req_free(out);
                return st;
            }
        }
    }
    if (tail_off != tail_len) {
        st = sp_errf(err, err_len, SP_ERR_INVALID,
                     "%zu bytes of binary data after the JSON part are not claimed by any input "
                     "(parameters.binary_data_size)", tail_len - tail_off);
        sp_tensor_req_free(out);
        return st;
    }
    const json_t *outs = json_object_get(root, "outputs");
    if (outs && !json_is_null(outs)) {
        if (!json_is_array(outs) || json_array_size(outs) > SP_INFER_MAX_TENSORS) {
            sp_tensor_req_free(out);
            return sp_errf(err, err_len, SP_ERR_INVALID, "outputs: must be a list of at most %d outputs",
                           SP_INFER_MAX_TENSORS);
        }
        size_t n_out = json_array_size(outs);
        out->outputs = sp_calloc(n_out ? n_out : 1, sizeof *out->outputs);
        if (out->outputs == NULL) {
            sp_tensor_req_free(out);
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
        for (size_t i = 0; i < n_out; i++) {
            const json_t *o = json_array_get(outs, i);
            const json_t *nm = json_is_object(o) ? json_object_get(o, "name") : NULL;
            const json_t *op = NULL;
            if (!json_is_string(nm) || json_string_length(nm) == 0 ||
                json_string_length(nm) >= SP_TENSOR_MAX_NAME ||
                strlen(json_string_value(nm)) != json_string_length(nm)) {
                sp_tensor_req_free(out);
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "outputs[%zu].name: required, a string of 1 to %d bytes", i,
                               SP_TENSOR_MAX_NAME - 1);
            }
            if (get_params(o, &op) < 0) {
                sp_tensor_req_free(out);
                return sp_errf(err, err_len, SP_ERR_INVALID, "outputs[%zu].parameters: must be an object", i);
            }
            sp_infer_output_t *ro = &out->outputs[i];
            memcpy(ro->name, json_string_value(nm), json_string_length(nm) + 1);
            ro->binary = -1;
            const json_t *bd = op ? json_object_get(op, "binary_data") : NULL;
            if (bd && !json_is_null(bd)) {
                if (!json_is_boolean(bd)) {
                    sp_tensor_req_free(out);
                    return sp_errf(err, err_len, SP_ERR_INVALID,
                                   "outputs[%zu].parameters.binary_data: must be true or false", i);
                }
                ro->binary = json_is_true(bd) ? 1 : 0;
            }
            /* Triton's classification extension: the top K entries instead of the tensor. */
            const json_t *cl = op ? json_object_get(op, "classification") : NULL;
            if (cl && !json_is_null(cl)) {
                if (!json_is_integer(cl) || json_integer_value(cl) < 1 ||
                    json_integer_value(cl) > SP_INFER_MAX_CLASSES) {
                    sp_tensor_req_free(out);
                    return sp_errf(err, err_len, SP_ERR_INVALID,
                                   "outputs[%zu].parameters.classification: must be an integer in "
                                   "[1, %d]", i, SP_INFER_MAX_CLASSES);
                }
                ro->classification = (int32_t)json_integer_value(cl);
            }
            for (size_t k = 0; k < i; k++) {
                if (strcmp(out->outputs[k].name, ro->name) == 0) {
                    st = sp_errf(err, err_len, SP_ERR_INVALID, "outputs[%zu].name: duplicate output '%.64s'",
                                 i, ro->name);
                    sp_tensor_req_free(out);
                    return st;
                }
            }
            out->n_outputs = (int)i + 1;
        }
    }
    return SP_OK;
}

/* ---- the parsed-header cache
 *
 * A client of the binary tensor extension sends the same JSON part with
 * every request (the names, datatypes and shapes of its tensors and their
 * byte counts; the values are in the binary tail), and parsing it with
 * jansson was the largest single cost of a small request on the loop (about
 * 3 us of 19 in the fraud benchmark's profile). So the decoded JSON part of
 * such a request is kept, keyed by its exact bytes, and a request whose JSON
 * part is byte-identical reuses it and decodes only its tail. Exact bytes
 * give exactly the parse the full path would (same JSON text, same
 * decoding), so nothing is trusted that was not checked. Only requests whose
 * every input is binary are kept (inline JSON data varies per request), and
 * only JSON parts up to HC_MAX_KEY bytes. One cache per event loop: no
 * locking. */

#define HC_SLOTS 8
#define HC_MAX_KEY 1024

typedef struct hc_entry {
    char *key;            /* the JSON part's bytes; NULL: empty slot */
    size_t key_len;
    int max_depth;
    size_t tail_len;      /* binary bytes the inputs take, in total */
    sp_tensor_req_t tmpl;  /* root shared (a reference); inputs without data */
    int64_t bins[SP_INFER_MAX_TENSORS];
    uint64_t used;        /* last use, for replacement */
} hc_entry_t;

struct sp_tensor_hcache {
    hc_entry_t e[HC_SLOTS];
    uint64_t tick;
    uint64_t hits, misses;
};

sp_tensor_hcache_t *
sp_tensor_hcache_new(void)
{
    return sp_calloc(1, sizeof(sp_tensor_hcache_t));
}

static void
hc_clear(hc_entry_t *e)
{
    sp_free(e->key);
    sp_free(e->tmpl.inputs); /* metadata only: the data pointers are NULL */
    sp_free(e->tmpl.outputs);
    json_decref(e->tmpl.root);
    memset(e, 0, sizeof *e);
}

void
sp_tensor_hcache_free(sp_tensor_hcache_t *hc)
{
    if (hc == NULL) {
        return;
    }
    for (int i = 0; i < HC_SLOTS; i++) {
        hc_clear(&hc->e[i]);
    }
    sp_free(hc);
}

void
sp_tensor_hcache_counts(const sp_tensor_hcache_t *hc, uint64_t *hits, uint64_t *misses)
{
    *hits = hc ? hc->hits : 0;
    *misses = hc ? hc->misses : 0;
}

/* Keep the decoded request r (all inputs binary) under its JSON part. */
static void
hc_store(sp_tensor_hcache_t *hc, const char *key, size_t key_len, int max_depth,
         const sp_tensor_req_t *r, const int64_t *bins)
{
    hc_entry_t *e = &hc->e[0];
    for (int i = 1; i < HC_SLOTS && e->key; i++) {
        if (hc->e[i].key == NULL || hc->e[i].used < e->used) {
            e = &hc->e[i];
        }
    }
    hc_clear(e);
    e->key = sp_malloc(key_len);
    e->tmpl.inputs = sp_calloc((size_t)r->n_inputs, sizeof *e->tmpl.inputs);
    e->tmpl.outputs = r->n_outputs ? sp_calloc((size_t)r->n_outputs, sizeof *e->tmpl.outputs) : NULL;
    if (e->key == NULL || e->tmpl.inputs == NULL || (r->n_outputs && e->tmpl.outputs == NULL)) {
        hc_clear(e); /* no room: simply not cached */
        return;
    }
    memcpy(e->key, key, key_len);
    e->key_len = key_len;
    e->max_depth = max_depth;
    e->tmpl.root = json_incref(r->root);
    e->tmpl.id = r->id;
    e->tmpl.id_len = r->id_len;
    e->tmpl.params = r->params;
    e->tmpl.binary_output = r->binary_output;
    e->tmpl.n_inputs = r->n_inputs;
    e->tail_len = 0;
    for (int i = 0; i < r->n_inputs; i++) {
        sp_tensor_t *t = &e->tmpl.inputs[i];
        *t = r->inputs[i];
        t->data = NULL;
        t->store = NULL;
        t->store_len = 0;
        e->bins[i] = bins[i];
        e->tail_len += (size_t)bins[i];
    }
    e->tmpl.n_outputs = r->n_outputs;
    if (r->n_outputs) {
        memcpy(e->tmpl.outputs, r->outputs, (size_t)r->n_outputs * sizeof *r->outputs);
    }
    e->used = ++hc->tick;
}

/* A request from entry e and the tail: SP_OK, an error decoding the tail
 * (the same message the full path gives), or 1 when the tail's length does
 * not match (the full path then says what is wrong). */
static int
hc_build(hc_entry_t *e, const unsigned char *tail, size_t tail_len, sp_tensor_req_t *out, char *err,
         size_t err_len)
{
    if (tail_len != e->tail_len) {
        return 1;
    }
    memset(out, 0, sizeof *out);
    out->inputs = sp_calloc((size_t)e->tmpl.n_inputs, sizeof *out->inputs);
    out->outputs = e->tmpl.n_outputs ? sp_calloc((size_t)e->tmpl.n_outputs, sizeof *out->outputs)
                                     : NULL;
    if (out->inputs == NULL || (e->tmpl.n_outputs && out->outputs == NULL)) {
        sp_free(out->inputs);
        sp_free(out->outputs);
        memset(out, 0, sizeof *out);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    out->root = json_incref(e->tmpl.root);
    out->id = e->tmpl.id;
    out->id_len = e->tmpl.id_len;
    out->params = e->tmpl.params;
    out->binary_output = e->tmpl.binary_output;
    out->n_outputs = e->tmpl.n_outputs;
    if (out->n_outputs) {
        memcpy(out->outputs, e->tmpl.outputs, (size_t)out->n_outputs * sizeof *out->outputs);
    }
    size_t off = 0;
    for (int i = 0; i < e->tmpl.n_inputs; i++) {
        sp_tensor_t *t = &out->inputs[i];
        *t = e->tmpl.inputs[i];
        out->n_inputs = i + 1;
        where_t w;
        where_set(&w, i, t->name);
        sp_status_t st = decode_binary(t, tail + off, (size_t)e->bins[i], &w, err, err_len);
        if (st != SP_OK) {
            sp_tensor_req_free(out);
            return st;
        }
        off += (size_t)e->bins[i];
    }
    return SP_OK;
}

sp_status_t
sp_tensor_req_parse_cached(sp_tensor_hcache_t *hc, const char *body, size_t len, sp_str_t header_len,
                           int max_depth, sp_tensor_req_t *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    size_t json_len = len;
    bool have_header = header_len.ptr != NULL;
    if (have_header) {
        sp_status_t st = header_length(header_len, len, &json_len, err, err_len);
        if (st != SP_OK) {
            return st;
        }
    }
    bool cacheable = hc != NULL && have_header && json_len > 0 && json_len <= HC_MAX_KEY;
    if (cacheable) {
        for (int i = 0; i < HC_SLOTS; i++) {
            hc_entry_t *e = &hc->e[i];
            if (e->key && e->key_len == json_len && e->max_depth == max_depth &&
                memcmp(e->key, body, json_len) == 0) {
                int r = hc_build(e, (const unsigned char *)body + json_len, len - json_len, out,
                                 err, err_len);
                if (r <= 0) {
                    e->used = ++hc->tick;
                    hc->hits++;
                    return (sp_status_t)r;
                }
                break;
            }
        }
    }
    int64_t bins[SP_INFER_MAX_TENSORS];
    sp_status_t st = parse_full(body, len, json_len, have_header, max_depth, out, bins, err, err_len);
    if (st == SP_OK && cacheable) {
        hc->misses++;
        bool all_binary = true;
        for (int i = 0; i < out->n_inputs; i++) {
            all_binary &= bins[i] >= 0;
        }
        if (all_binary) {
            hc_store(hc, body, json_len, max_depth, out, bins);
        }
    }
    return st;
}

sp_status_t
sp_tensor_req_parse(const char *body, size_t len, sp_str_t header_len, int max_depth,
                    sp_tensor_req_t *out, char *err, size_t err_len)
{
    return sp_tensor_req_parse_cached(NULL, body, len, header_len, max_depth, out, err, err_len);
}

void
sp_tensor_req_free(sp_tensor_req_t *r)
{
    if (r == NULL) {
        return;
    }
    for (int i = 0; r->inputs && i < r->n_inputs; i++) {
        sp_tensor_free(&r->inputs[i]);
    }
    sp_free(r->inputs);
    sp_free(r->outputs);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

const sp_tensor_t *
sp_tensor_req_input(const sp_tensor_req_t *r, const char *name)
{
    for (int i = 0; i < r->n_inputs; i++) {
        if (strcmp(r->inputs[i].name, name) == 0) {
            return &r->inputs[i];
        }
    }
    return NULL;
}

sp_status_t
sp_tensor_req_select_outputs(const sp_tensor_req_t *r, const char *const *names, int n_names,
                             bool *want, char *err, size_t err_len)
{
    for (int k = 0; k < n_names; k++) {
        want[k] = r->n_outputs == 0;
    }
    for (int i = 0; i < r->n_outputs; i++) {
        int k = 0;
        while (k < n_names && strcmp(names[k], r->outputs[i].name) != 0) {
            k++;
        }
        if (k == n_names) {
            char list[256] = "";
            size_t o = 0;
            for (int j = 0; j < n_names && o < sizeof list; j++) {
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", j ? ", " : "", names[j]);
            }
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "outputs[%d].name: the model has no output '%.64s' (outputs: %s)", i,
                           r->outputs[i].name, list);
        }
        want[k] = true;
    }
    return SP_OK;
}

sp_status_t
sp_tensor_req_no_classification(const sp_tensor_req_t *r, char *err, size_t err_len)
{
    for (int i = 0; i < r->n_outputs; i++) {
        if (r->outputs[i].classification > 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "outputs[%d].parameters.classification: output '%.64s' is not a tensor "
                           "of scores (classification applies to tensor models)", i,
                           r->outputs[i].name);
        }
    }
    return SP_OK;
}

bool
sp_tensor_req_output_binary(const sp_tensor_req_t *r, const char *name)
{
    for (int i = 0; i < r->n_outputs; i++) {
        if (strcmp(r->outputs[i].name, name) == 0 && r->outputs[i].binary >= 0) {
            return r->outputs[i].binary == 1;
        }
    }
    return r->binary_output;
}

/* ------------------------------------------------------------- encoding */

static void
write_elem(sp_jbuf_t *b, const sp_tensor_t *t, int64_t i)
{
    switch (t->dtype) {
    case SP_DT_BOOL:
        sp_jbuf_lit(b, ((const uint8_t *)t->data)[i] ? "true" : "false");
        break;
    case SP_DT_UINT64:
        sp_jbuf_printf(b, "%llu", (unsigned long long)((const uint64_t *)t->data)[i]);
        break;
    case SP_DT_FP16:
    case SP_DT_FP32:
        sp_jbuf_num(b, sp_tensor_f64(t, i)); /* %.9g: exact for every float */
        break;
    case SP_DT_FP64: {
        double d = ((const double *)t->data)[i];
        if (isfinite(d)) {
            sp_jbuf_printf(b, "%.17g", d);
        } else {
            sp_jbuf_lit(b, "null");
        }
        break;
    }
    case SP_DT_BYTES: {
        sp_str_t s = sp_tensor_str(t, i);
        sp_jbuf_str(b, s.ptr, s.len);
        break;
    }
    default:
        sp_jbuf_int(b, sp_tensor_i64(t, i));
        break;
    }
}

static void
write_binary(sp_jbuf_t *bin, const sp_tensor_t *t)
{
    if (t->dtype != SP_DT_BYTES) {
        sp_jbuf_raw(bin, t->data, (size_t)t->n * dtypes[t->dtype].size);
        return;
    }
    for (int64_t i = 0; i < t->n; i++) {
        sp_str_t s = sp_tensor_str(t, i);
        uint32_t n = (uint32_t)s.len;
        unsigned char le[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                               (unsigned char)(n >> 24)};
        sp_jbuf_raw(bin, (const char *)le, 4);
        sp_jbuf_raw(bin, s.ptr, s.len);
    }
}

void
sp_tensor_resp_write(sp_jbuf_t *json, sp_jbuf_t *bin, const char *model, const char *version,
                     const sp_tensor_req_t *req, const char *params_json, const sp_tensor_t *outs,
                     int n_outs)
{
    sp_jbuf_lit(json, "{\"model_name\":");
    sp_jbuf_cstr(json, model);
    if (version) {
        sp_jbuf_lit(json, ",\"model_version\":");
        sp_jbuf_cstr(json, version);
    }
    if (req && req->id) {
        sp_jbuf_lit(json, ",\"id\":");
        sp_jbuf_str(json, req->id, req->id_len);
    }
    if (params_json) {
        sp_jbuf_lit(json, ",\"parameters\":");
        sp_jbuf_lit(json, params_json);
    }
    sp_jbuf_lit(json, ",\"outputs\":[");
    for (int k = 0; k < n_outs; k++) {
        const sp_tensor_t *t = &outs[k];
        sp_jbuf_lit(json, k ? ",{\"name\":" : "{\"name\":");
        sp_jbuf_cstr(json, t->name);
        sp_jbuf_printf(json, ",\"datatype\":\"%s\",\"shape\":[", sp_tensor_dtype_name(t->dtype));
        for (int i = 0; i < t->ndim; i++) {
            sp_jbuf_printf(json, i ? ",%lld" : "%lld", (long long)t->shape[i]);
        }
        sp_jbuf_lit(json, "]");
        if (req && sp_tensor_req_output_binary(req, t->name)) {
            size_t before = bin->len;
            write_binary(bin, t);
            sp_jbuf_printf(json, ",\"parameters\":{\"binary_data_size\":%zu}}", bin->len - before);
            continue;
        }
        sp_jbuf_lit(json, ",\"data\":[");
        for (int64_t i = 0; i < t->n; i++) {
            if (i) {
                sp_jbuf_lit(json, ",");
            }
            write_elem(json, t, i);
        }
        sp_jbuf_lit(json, "]}");
    }
    sp_jbuf_lit(json, "]}");
}
