/*
 * backends/onnx/load.c - reading a .onnx file into an sp_ox_graph_t: the file
 * is untrusted, so its size is bounded, protobuf-c decodes it through an
 * allocator that refuses to grow past a multiple of the file size, and
 * every tensor, node and attribute is checked before anything runs on it.
 * External tensor data is read only from files inside the model's folder.
 *
 * Threads: none of its own; called from the backend's load.
 * Memory: the graph owns the decoded ModelProto (node attributes point into
 * it) and a copy of each constant tensor's data.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ox.h"

/* The largest model file read (protobuf's own limit is 2 GiB). */
#define OX_MAX_FILE ((int64_t)2000 << 20)
/* Elements of one tensor: 2^36 (256 GiB of floats) bounds every size product
 * well inside int64 and size_t. */
#define OX_MAX_NUMEL ((int64_t)1 << 36)
#define OX_OPSET_MIN 7
#define OX_OPSET_MAX 21
/* Files of opsets 1 to 6 are read when every node is an operator whose version at that opset
 * is the one this runtime implements for opset 7 (old_opset_ok): before 7, Add/Sub/Mul/Div and
 * Gemm took a `broadcast` attribute, BatchNormalization `is_test`/`spatial`, and the version-1
 * unary operators `consumed_inputs`, which the runtime does not implement. */
#define OX_OPSET_OLDEST 1

/* The operators whose version in force at opsets `since`..6 is unchanged at 7 (ONNX's
 * operator changelog): a node of a file with an opset below 7 must be one of them. */
static bool
old_opset_ok(const char *op, int64_t opset)
{
    static const struct {
        const char *op;
        int since;
    } ok[] = {
        {"GlobalAveragePool", 1}, {"GlobalMaxPool", 1}, {"Identity", 1}, {"MatMul", 1},
        {"Flatten", 1}, {"Transpose", 1}, {"Shape", 1}, {"Squeeze", 1}, {"Unsqueeze", 1},
        {"Gather", 1}, {"Softmax", 1}, {"LogSoftmax", 1}, {"Conv", 1}, {"Concat", 4},
        {"Reshape", 5}, {"HardSigmoid", 6}, {"Relu", 6}, {"LeakyRelu", 6}, {"Sigmoid", 6},
        {"Tanh", 6}, {"Sqrt", 6}, {"Exp", 6}, {"Log", 6}, {"Neg", 6}, {"Abs", 6},
        {"Reciprocal", 6}, {"Cast", 6},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (strcmp(ok[i].op, op) == 0) return opset >= ok[i].since;
    }
    return false;
}

typedef struct bounded {
    size_t used, limit;
} bounded_t;

static void *
bounded_alloc(void *data, size_t size)
{
    bounded_t *b = data;
    if (size > b->limit - b->used) {
        return NULL;
    }
    b->used += size;
    return malloc(size);
}

static void
bounded_free(void *data, void *p)
{
    (void)data;
    free(p);
}

static void
errf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void
errf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

size_t
sp_ox_dtype_size(int32_t dtype)
{
    switch (dtype) {
    case OX_FLOAT: case OX_INT32: return 4;
    case OX_INT64: case OX_DOUBLE: return 8;
    case OX_UINT8: case OX_INT8: case OX_BOOL: return 1;
    case OX_FLOAT16: case OX_INT16: return 2;
    default: return 0;
    }
}

const char *
sp_ox_dtype_name(int32_t dtype)
{
    static const char *const names[] = {
        "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING",
        "BOOL", "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16",
    };
    return dtype >= 0 && dtype < (int32_t)(sizeof names / sizeof names[0]) ? names[dtype] : "?";
}

void *
sp_ox_aligned_alloc(size_t bytes)
{
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

/* t->data for bytes bytes, allocated only once the source is known to hold them: a file's
 * dims alone must not make the loader allocate (a few bytes could ask for gigabytes). */
static int
alloc_data(sp_ox_tensor_t *t, size_t bytes, const char *what, char *err, size_t err_len)
{
    t->data = sp_ox_aligned_alloc(bytes);
    t->cap = bytes;
    if (t->data == NULL) {
        errf(err, err_len, "%s: out of memory for %zu bytes", what, bytes);
        return -1;
    }
    return 0;
}

/* Read `len` bytes at `off` of the external file `loc`, which must stay
 * inside dir (no absolute path, no "..", no symlink leading out), into t->data
 * (allocated here, once the file is known to hold them). */
static int
read_external(const char *dir, const char *loc, int64_t off, int64_t len, sp_ox_tensor_t *t,
              const char *what, char *err, size_t err_len)
{
    if (loc == NULL || !loc[0] || loc[0] == '/' || strstr(loc, "..") != NULL) {
        errf(err, err_len, "%s: external data location \"%s\" must be a relative path inside the "
             "model folder", what, loc ? loc : "");
        return -1;
    }
    char base[PATH_MAX], path[2 * PATH_MAX], real[PATH_MAX];
    if (realpath(dir, base) == NULL) {
        errf(err, err_len, "%s: %s: %s", what, dir, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", base, loc);
    if (realpath(path, real) == NULL) {
        errf(err, err_len, "%s: external data \"%s\": %s", what, loc, strerror(errno));
        return -1;
    }
    size_t bl = strlen(base);
    if (strncmp(real, base, bl) != 0 || real[bl] != '/') {
        errf(err, err_len, "%s: external data \"%s\" leads outside the model folder", what, loc);
        return -1;
    }
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        errf(err, err_len, "%s: external data \"%s\": not a readable file", what, loc);
        if (fd >= 0) close(fd);
        return -1;
    }
    if (off < 0 || len < 0 || off > st.st_size || len > st.st_size - off) {
        errf(err, err_len, "%s: external data \"%s\": bytes %lld..%lld past its end (%lld bytes)",
             what, loc, (long long)off, (long long)(off + len), (long long)st.st_size);
        close(fd);
        return -1;
    }
    if (alloc_data(t, (size_t)len, what, err, err_len)) {
        close(fd);
        return -1;
    }
    char *dst = t->data;
    int64_t done = 0;
    while (done < len) {
        ssize_t k = pread(fd, dst + done, (size_t)(len - done), off + done);
        if (k <= 0) {
            errf(err, err_len, "%s: external data \"%s\": short read", what, loc);
            close(fd);
            return -1;
        }
        done += k;
    }
    close(fd);
    return 0;
}

int
sp_ox_tensor_from_proto(const Onnx__TensorProto *tp, const char *dir, const char *what,
                     sp_ox_tensor_t *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    int32_t dt = tp->has_data_type ? tp->data_type : 0;
    size_t es = sp_ox_dtype_size(dt);
    if (es == 0 || dt == OX_INT16) {
        errf(err, err_len, "%s: data type %s (%d) not supported", what, sp_ox_dtype_name(dt), dt);
        return -1;
    }
    if (tp->n_dims > OX_MAX_DIMS) {
        errf(err, err_len, "%s: %zu dimensions (at most %d)", what, tp->n_dims, OX_MAX_DIMS);
        return -1;
    }
    if (tp->segment != NULL) {
        errf(err, err_len, "%s: segmented tensors are not supported", what);
        return -1;
    }
    int64_t numel = 1;
    for (size_t i = 0; i < tp->n_dims; i++) {
        if (tp->dims[i] < 0 || tp->dims[i] > OX_MAX_NUMEL) {
            errf(err, err_len, "%s: dims[%zu] = %lld", what, i, (long long)tp->dims[i]);
            return -1;
        }
        numel *= tp->dims[i];
        if (numel > OX_MAX_NUMEL) {
            errf(err, err_len, "%s: more than 2^36 elements", what);
            return -1;
        }
        t->dims[i] = tp->dims[i];
    }
    t->nd = (int32_t)tp->n_dims;
    t->dtype = dt;
    size_t bytes = (size_t)numel * es;
    bool external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    if (external) {
        const char *loc = NULL;
        int64_t off = 0, len = -1;
        for (size_t i = 0; i < tp->n_external_data; i++) {
            const char *k = tp->external_data[i]->key, *v = tp->external_data[i]->value;
            if (k == NULL || v == NULL) continue;
            char *end = NULL;
            if (strcmp(k, "location") == 0) {
                loc = v;
            } else if (strcmp(k, "offset") == 0) {
                off = strtoll(v, &end, 10);
                if (!*v || *end) off = -1;
            } else if (strcmp(k, "length") == 0) {
                len = strtoll(v, &end, 10);
                if (!*v || *end) len = -2;
            }
        }
        if (len == -1) len = (int64_t)bytes;
        if (len != (int64_t)bytes) {
            errf(err, err_len, "%s: external data length %lld, the dims need %zu bytes", what,
                 (long long)len, bytes);
            goto fail;
        }
        if (read_external(dir, loc, off, len, t, what, err, err_len)) goto fail;
        return 0;
    }
    if (tp->has_raw_data) {
        if (tp->raw_data.len != bytes) {
            errf(err, err_len, "%s: raw_data has %zu bytes, %s %lld elements need %zu", what,
                 tp->raw_data.len, sp_ox_dtype_name(dt), (long long)numel, bytes);
            goto fail;
        }
        if (alloc_data(t, bytes, what, err, err_len)) goto fail;
        if (bytes) memcpy(t->data, tp->raw_data.data, bytes);
        return 0;
    }
    size_t have;
    switch (dt) {
    case OX_FLOAT: have = tp->n_float_data; break;
    case OX_INT64: have = tp->n_int64_data; break;
    case OX_DOUBLE: have = tp->n_double_data; break;
    default: have = tp->n_int32_data; break;
    }
    if (have != (size_t)numel) {
        errf(err, err_len, "%s: %zu values for %s dims of %lld elements", what, have,
             sp_ox_dtype_name(dt), (long long)numel);
        goto fail;
    }
    if (alloc_data(t, bytes, what, err, err_len)) goto fail;
    for (int64_t i = 0; i < numel; i++) {
        switch (dt) {
        case OX_FLOAT: ((float *)t->data)[i] = tp->float_data[i]; break;
        case OX_INT64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
        case OX_DOUBLE: ((double *)t->data)[i] = tp->double_data[i]; break;
        case OX_INT32: ((int32_t *)t->data)[i] = tp->int32_data[i]; break;
        case OX_BOOL: ((uint8_t *)t->data)[i] = tp->int32_data[i] != 0; break;
        case OX_FLOAT16: case OX_INT16: ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i]; break;
        default: ((uint8_t *)t->data)[i] = (uint8_t)tp->int32_data[i]; break;
        }
    }
    return 0;
fail:
    free(t->data);
    t->data = NULL;
    return -1;
}

/* Name -> value index: open addressing over the value array. */
typedef struct names {
    int32_t *slot;
    size_t cap;
} names_t;

static uint64_t
hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int32_t
names_find(const names_t *nm, const sp_ox_value_t *vals, const char *s)
{
    for (size_t i = hash_str(s) & (nm->cap - 1);; i = (i + 1) & (nm->cap - 1)) {
        if (nm->slot[i] < 0) return -1;
        if (strcmp(vals[nm->slot[i]].name, s) == 0) return nm->slot[i];
    }
}

static void
names_put(names_t *nm, const char *s, int32_t v)
{
    size_t i = hash_str(s) & (nm->cap - 1);
    while (nm->slot[i] >= 0) i = (i + 1) & (nm->cap - 1);
    nm->slot[i] = v;
}

void
sp_ox_graph_free(sp_ox_graph_t *g)
{
    if (g == NULL) return;
    for (int32_t i = 0; i < g->n_values; i++) {
        if (g->values[i].is_const) free(g->values[i].t.data);
    }
    free(g->values);
    free(g->nodes);
    free(g->order);
    if (g->proto) onnx__model_proto__free_unpacked(g->proto, NULL);
    free(g);
}

static int
check_name(const char *s, const char *what, const char *file, char *err, size_t err_len)
{
    if (s == NULL || strlen(s) > 4096) {
        errf(err, err_len, "%s: %s has no name (or one over 4096 bytes)", file, what);
        return -1;
    }
    return 0;
}

int
sp_ox_graph_load(const char *path, const char *dir, sp_ox_graph_t **out, char *err, size_t err_len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errf(err, err_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        errf(err, err_len, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_size <= 0 || st.st_size > OX_MAX_FILE) {
        errf(err, err_len, "%s: %lld bytes (a model is 1 byte to 2000 MiB)", path,
             (long long)st.st_size);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *buf = malloc(size);
    size_t got = 0;
    while (buf && got < size) {
        ssize_t k = read(fd, buf + got, size - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (buf == NULL || got != size) {
        errf(err, err_len, "%s: %s", path, buf ? "short read" : "out of memory");
        free(buf);
        return -1;
    }
    /* Decoded messages take more room than their encoding (an empty NodeProto
     * is 2 bytes in the file, about 100 in memory): 64 times the file plus a
     * little bounds the decoder on any input. */
    bounded_t bd = {0, size * 64 + (16u << 20)};
    ProtobufCAllocator alloc = {bounded_alloc, bounded_free, &bd};
    Onnx__ModelProto *mp = onnx__model_proto__unpack(&alloc, size, buf);
    free(buf);
    if (mp == NULL) {
        errf(err, err_len, "%s: not an ONNX model (the protobuf does not decode%s)", path,
             bd.used >= bd.limit / 2 ? ", or it needs too much memory" : "");
        return -1;
    }
    /* The allocator's state lives on this stack frame: free with the default one. */
    sp_ox_graph_t *g = calloc(1, sizeof *g);
    if (g == NULL) {
        onnx__model_proto__free_unpacked(mp, &alloc);
        errf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    g->proto = mp;
    g->max_numel = OX_MAX_RUN_NUMEL;
    names_t nm = {NULL, 0};
    int rc = -1;
    if (!mp->has_ir_version || mp->ir_version < 3 || mp->ir_version > 10) {
        errf(err, err_len, "%s: ir_version %lld not supported (3 to 10)", path,
             (long long)mp->ir_version);
        goto done;
    }
    g->opset = -1;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *os = mp->opset_import[i];
        const char *d = os->domain ? os->domain : "";
        if (d[0] == 0 || strcmp(d, "ai.onnx") == 0) {
            if (!os->has_version || os->version < OX_OPSET_OLDEST || os->version > OX_OPSET_MAX) {
                errf(err, err_len, "%s: opset_import[%zu]: default-domain opset %lld not supported "
                     "(%d to %d)", path, i, (long long)os->version, OX_OPSET_MIN, OX_OPSET_MAX);
                goto done;
            }
            g->opset = os->version;
        }
    }
    if (g->opset < 0) {
        errf(err, err_len, "%s: opset_import: no default-domain (ai.onnx) opset", path);
        goto done;
    }
    const Onnx__GraphProto *gp = mp->graph;
    if (gp == NULL) {
        errf(err, err_len, "%s: no graph", path);
        goto done;
    }
    size_t n_vals = gp->n_initializer + gp->n_input;
    for (size_t i = 0; i < gp->n_node; i++) n_vals += gp->node[i]->n_output;
    if (n_vals > (1u << 24) || gp->n_node > (1u << 22)) {
        errf(err, err_len, "%s: graph too large", path);
        goto done;
    }
    /* Spare slots after the file's values: fusion adds at most one constant per node. */
    g->values = calloc(n_vals + gp->n_node + 1, sizeof *g->values);
    g->nodes = calloc(gp->n_node ? gp->n_node : 1, sizeof *g->nodes);
    nm.cap = 16;
    while (nm.cap < n_vals * 2) nm.cap *= 2;
    nm.slot = malloc(nm.cap * sizeof *nm.slot);
    if (g->values == NULL || g->nodes == NULL || nm.slot == NULL) {
        errf(err, err_len, "%s: out of memory", path);
        goto done;
    }
    memset(nm.slot, 0xff, nm.cap * sizeof *nm.slot);
    /* Initializers: constants. */
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        if (check_name(tp->name, "an initializer", path, err, err_len)) goto done;
        char what[256];
        snprintf(what, sizeof what, "%s: initializer '%.100s'", path, tp->name);
        if (names_find(&nm, g->values, tp->name) >= 0) {
            errf(err, err_len, "%s: defined twice", what);
            goto done;
        }
        sp_ox_value_t *v = &g->values[g->n_values];
        v->name = tp->name;
        v->last_use = -1;
        if (sp_ox_tensor_from_proto(tp, dir, what, &v->t, err, err_len)) goto done;
        v->is_const = true;
        g->const_bytes += v->t.cap;
        names_put(&nm, tp->name, g->n_values++);
    }
    /* Graph inputs that no initializer gives a value: fed by the caller. */
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (check_name(vi->name, "a graph input", path, err, err_len)) goto done;
        if (names_find(&nm, g->values, vi->name) >= 0) continue; /* a constant with a default */
        const Onnx__TypeProto *ty = vi->type;
        if (ty == NULL || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
            ty->tensor_type == NULL) {
            errf(err, err_len, "%s: input '%.100s': non-tensor inputs (sequence, map, optional) are "
                 "not supported", path, vi->name);
            goto done;
        }
        int32_t et = ty->tensor_type->elem_type;
        if (sp_ox_dtype_size(et) == 0 || et == OX_INT16) {
            errf(err, err_len, "%s: input '%.100s': element type %s not supported", path,
                 vi->name, sp_ox_dtype_name(et));
            goto done;
        }
        if (g->n_inputs >= OX_MAX_IO) {
            errf(err, err_len, "%s: more than %d inputs", path, OX_MAX_IO);
            goto done;
        }
        const Onnx__TensorShapeProto *sh = ty->tensor_type->shape;
        if (sh && sh->n_dim > OX_MAX_DIMS) {
            errf(err, err_len, "%s: input '%.100s': %zu dimensions (at most %d)", path, vi->name,
                 sh->n_dim, OX_MAX_DIMS);
            goto done;
        }
        sp_ox_value_t *v = &g->values[g->n_values];
        v->name = vi->name;
        v->is_input = true;
        v->last_use = -1;
        v->t.dtype = et;
        g->inputs[g->n_inputs++] = g->n_values;
        names_put(&nm, vi->name, g->n_values++);
    }
    /* Node outputs (each name defined once), then node inputs resolved. */
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        sp_ox_node_t *n = &g->nodes[i];
        n->p = np;
        n->opset = g->opset;
        n->fused_bias = -1;
        n->fused_add = -1;
        n->fused_add_node = -1;
        snprintf(n->label, sizeof n->label, "node '%.40s' (%.30s)", np->name ? np->name : "",
                 np->op_type ? np->op_type : "");
        if (np->n_input > OX_MAX_IO || np->n_output > OX_MAX_IO) {
            errf(err, err_len, "%s: %s: more than %d inputs or outputs", path, n->label, OX_MAX_IO);
            goto done;
        }
        n->n_out = (int32_t)np->n_output;
        for (size_t k = 0; k < np->n_output; k++) {
            const char *o = np->output[k];
            if (check_name(o, "a node output", path, err, err_len)) goto done;
            if (o[0] && names_find(&nm, g->values, o) >= 0) {
                errf(err, err_len, "%s: %s: output '%.100s' is defined twice", path, n->label, o);
                goto done;
            }
            sp_ox_value_t *v = &g->values[g->n_values];
            v->name = np->output[k];
            v->last_use = -1;
            n->out[k] = g->n_values;
            if (o[0]) names_put(&nm, o, g->n_values);
            g->n_values++;
        }
    }
    g->n_nodes = (int32_t)gp->n_node;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        sp_ox_node_t *n = &g->nodes[i];
        const Onnx__NodeProto *np = n->p;
        n->n_in = (int32_t)np->n_input;
        for (size_t k = 0; k < np->n_input; k++) {
            const char *s = np->input[k];
            if (check_name(s, "a node input", path, err, err_len)) goto done;
            if (!s[0]) {
                n->in[k] = -1;
                continue;
            }
            n->in[k] = names_find(&nm, g->values, s);
            if (n->in[k] < 0) {
                errf(err, err_len, "%s: %s: input '%.100s' is not defined in the graph", path,
                     n->label, s);
                goto done;
            }
        }
        const char *dom = np->domain ? np->domain : "";
        n->op = (dom[0] && strcmp(dom, "ai.onnx") != 0) || np->op_type == NULL
                    ? NULL : sp_ox_op_find(np->op_type);
        if (n->op == NULL) {
            errf(err, err_len, "%s: %s: operator %s%s%s is not supported", path, n->label,
                 dom[0] ? dom : "", dom[0] ? "." : "", np->op_type ? np->op_type : "(none)");
            goto done;
        }
        if (g->opset < OX_OPSET_MIN && !old_opset_ok(np->op_type, g->opset)) {
            errf(err, err_len, "%s: %s: operator %s at opset %lld is not supported (opsets %d to %d; "
                 "below %d only operators unchanged since, e.g. GlobalAveragePool, Relu from 6)", path,
                 n->label, np->op_type, (long long)g->opset, OX_OPSET_MIN, OX_OPSET_MAX, OX_OPSET_MIN);
            goto done;
        }
        const sp_ox_op_t *op = n->op;
        if (n->n_in < op->min_in || n->n_in > op->max_in || n->n_out < op->min_out ||
            n->n_out > op->max_out) {
            errf(err, err_len, "%s: %s: %d inputs and %d outputs (the operator takes %d..%d and "
                 "gives %d..%d)", path, n->label, n->n_in, n->n_out, op->min_in, op->max_in,
                 op->min_out, op->max_out);
            goto done;
        }
        for (int32_t k = 0; k < op->min_in; k++) {
            if (n->in[k] < 0) { /* "" marks an omitted optional input; these are required */
                errf(err, err_len, "%s: %s: input %d is required but its name is empty", path,
                     n->label, k);
                goto done;
            }
        }
        for (size_t a = 0; a < np->n_attribute; a++) {
            const Onnx__AttributeProto *ap = np->attribute[a];
            bool known = false;
            for (const char *const *an = op->attrs; an && *an && ap->name; an++) {
                known |= strcmp(*an, ap->name) == 0;
            }
            if (!known || ap->ref_attr_name) {
                errf(err, err_len, "%s: %s: attribute '%.60s' is not supported", path, n->label,
                     ap->name ? ap->name : "");
                goto done;
            }
        }
        if (op->check && op->check(n, err, err_len)) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s", err);
            errf(err, err_len, "%s: %s: %s", path, n->label, tmp);
            goto done;
        }
    }
    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        if (check_name(vi->name, "a graph output", path, err, err_len)) goto done;
        int32_t v = names_find(&nm, g->values, vi->name);
        if (v < 0) {
            errf(err, err_len, "%s: output '%.100s' is not computed by the graph", path, vi->name);
            goto done;
        }
        if (g->n_outputs >= OX_MAX_IO) {
            errf(err, err_len, "%s: more than %d outputs", path, OX_MAX_IO);
            goto done;
        }
        g->values[v].is_output = true;
        g->outputs[g->n_outputs++] = v;
    }
    if (g->n_outputs == 0) {
        errf(err, err_len, "%s: the graph has no outputs", path);
        goto done;
    }
    rc = 0;
done:
    free(nm.slot);
    if (rc) {
        sp_ox_graph_free(g);
        return -1;
    }
    *out = g;
    return 0;
}
