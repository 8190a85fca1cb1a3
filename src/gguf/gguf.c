/*
 * gguf.c - the GGUF v2/v3 reader (mmap or caller buffer) and writer.
 *
 * Reader: one pass over the bytes through a bounded cursor that knows how much
 * is left, so every count and length from the file is checked against the
 * remaining bytes (and against overflow) before it sizes a loop or an
 * allocation. The parse fills three compact arrays: kv entries, the parsed
 * strings of ARRAY-of-STRING values, and tensor infos. Key and tensor-name
 * lookups go through small open-addressing hash tables built at open, which
 * also catch duplicates in O(n) (a file with a million keys must not cost
 * n^2 compares).
 *
 * Every allocation is bounded by the file size: n_kv <= bytes left / 14 (the
 * smallest kv), n_tensors <= bytes left / 25 (the smallest tensor info), the
 * strings of one array <= bytes left / 8 (each string has an 8-byte length).
 *
 * Writer: keeps owned copies of the kv values (serialized as in the file) and
 * the tensor infos, and streams the file at write time into a temporary file
 * beside the target, renamed into place once complete, so a reader never sees
 * a half-written model.
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/file.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_VERSION_MIN 2
#define GGUF_VERSION_MAX 3
#define GGUF_MAX_KEY 1024        /* keys are short; RELIABILITY.md asks for <= 1 KiB */
#define GGUF_MIN_KV_BYTES 14     /* u64 len + 1 key byte + u32 type + 1 value byte */
#define GGUF_MIN_TENSOR_BYTES 25 /* u64 len + 1 name byte + u32 n_dims + u32 type + u64 offset */

typedef struct kv_entry {
    sp_str_t key;
    sp_gguf_type_t type;
    const uint8_t *raw; /* the value's bytes in the file (after the type word) */
    size_t raw_len;
    union {
        sp_str_t str;      /* STRING */
        sp_gguf_arr_t arr; /* ARRAY */
    } v;
} kv_entry;

/* Open-addressing table of indices (+1, 0 = empty) keyed by string. */
typedef struct name_index {
    uint32_t *slots;
    size_t mask;
} name_index;

struct sp_gguf {
    char *name;             /* path or caller name, for messages */
    const uint8_t *base;    /* whole file */
    size_t size;            /* bytes */
    void *map;              /* the file's mapping or anonymous copy; NULL for a caller buffer */
    size_t map_len;         /* bytes mapped (size rounded up to pages for a file mapping) */
    bool copied;            /* map is an anonymous private copy of the file */
    int fd;                 /* a mapped file, kept open for the per-step check; else -1 */
    int guard;              /* its SIGBUS guard slot, or -1 */
    bool has_id;            /* the file identity below was recorded at open */
    struct stat id;         /* device, inode, size and mtime of the file as opened */
    sp_gguf_release_fn release; /* owned buffer (decrypted model): released at close */
    void *release_user;
    uint32_t version;
    size_t alignment;       /* bytes, power of two */
    size_t data_offset;     /* bytes from base to tensor data */
    int64_t n_kv;
    kv_entry *kv;
    sp_str_t **str_arrays;  /* owned string arrays, one per ARRAY of STRING */
    int64_t n_str_arrays;
    int64_t n_tensors;
    sp_gguf_tensor_t *tensors;
    name_index kv_index;
    name_index tensor_index;
};

static void guard_drop(int slot);

/* ---- small helpers ------------------------------------------------------- */

static uint64_t
hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int
index_init(name_index *ix, int64_t n)
{
    size_t cap = 8;
    while (cap < (size_t)n * 2) {
        cap *= 2; /* n is bounded by the file size, so this cannot overflow */
    }
    ix->slots = sp_calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : -1;
}

/* Returns the index stored under `s`, or -1; inserts `idx` when absent and idx >= 0. */
static int64_t
index_lookup(const name_index *ix, sp_str_t s, const sp_str_t *names, size_t stride, int64_t idx)
{
    if (ix->slots == NULL) {
        return -1;
    }
    size_t h = (size_t)hash_bytes(s.ptr, s.len) & ix->mask;
    for (;;) {
        uint32_t v = ix->slots[h];
        if (v == 0) {
            if (idx >= 0) {
                ix->slots[h] = (uint32_t)idx + 1;
            }
            return -1;
        }
        const sp_str_t *o = (const sp_str_t *)((const char *)names + (size_t)(v - 1) * stride);
        if (o->len == s.len && (s.len == 0 || memcmp(o->ptr, s.ptr, s.len) == 0)) {
            return (int64_t)(v - 1);
        }
        h = (h + 1) & ix->mask;
    }
}

/* Printable copy of an untrusted string for error messages (no control bytes in logs). */
static const char *
show(sp_str_t s, char *buf, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        bool plain = c >= 0x20 && c < 0x7f && c != '\'' && c != '\\';
        if (o + (plain ? 1 : 4) + 4 > n) { /* keep room for "..." and the NUL */
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (plain) {
            buf[o++] = (char)c;
        } else {
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        }
    }
    buf[o] = '\0';
    return buf;
}

static uint64_t
rd_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t
rd_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

size_t
sp_gguf_type_size(sp_gguf_type_t t)
{
    switch (t) {
    case SP_GGUF_TYPE_UINT8:
    case SP_GGUF_TYPE_INT8:
    case SP_GGUF_TYPE_BOOL:
        return 1;
    case SP_GGUF_TYPE_UINT16:
    case SP_GGUF_TYPE_INT16:
        return 2;
    case SP_GGUF_TYPE_UINT32:
    case SP_GGUF_TYPE_INT32:
    case SP_GGUF_TYPE_FLOAT32:
        return 4;
    case SP_GGUF_TYPE_UINT64:
    case SP_GGUF_TYPE_INT64:
    case SP_GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

const char *
sp_gguf_type_name(sp_gguf_type_t t)
{
    static const char *names[SP_GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
    };
    if ((unsigned)t < SP_GGUF_TYPE_COUNT) {
        return names[t];
    }
    return "unknown";
}

/* ---- bounded cursor ------------------------------------------------------ */

typedef struct cursor {
    const uint8_t *p;
    size_t pos, len;
    const char *name;
    char *err;
    size_t err_len;
} cursor;

static size_t
left(const cursor *c)
{
    return c->len - c->pos;
}

/* `what` names the field for the message. */
static sp_status_t
need(cursor *c, size_t n, const char *what)
{
    if (n > left(c)) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                       "%s: truncated at byte %zu reading %s (%zu bytes needed, %zu left)", c->name,
                       c->pos, what, n, left(c));
    }
    return SP_OK;
}

static sp_status_t
get_u32(cursor *c, uint32_t *v, const char *what)
{
    sp_status_t st = need(c, 4, what);
    if (st == SP_OK) {
        *v = rd_u32(c->p + c->pos);
        c->pos += 4;
    }
    return st;
}

static sp_status_t
get_u64(cursor *c, uint64_t *v, const char *what)
{
    sp_status_t st = need(c, 8, what);
    if (st == SP_OK) {
        *v = rd_u64(c->p + c->pos);
        c->pos += 8;
    }
    return st;
}

/* A GGUF string: u64 length + bytes, capped at `cap` and at the bytes left. */
static sp_status_t
get_str(cursor *c, sp_str_t *s, uint64_t cap, const char *what)
{
    uint64_t n;
    sp_status_t st = get_u64(c, &n, what);
    if (st != SP_OK) {
        return st;
    }
    if (n > cap) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                       "%s: %s length %" PRIu64 " at byte %zu exceeds the limit of %" PRIu64,
                       c->name, what, n, c->pos - 8, cap);
    }
    if (n > left(c)) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                       "%s: %s length %" PRIu64 " at byte %zu runs past end of file "
                       "(%zu bytes left)",
                       c->name, what, n, c->pos - 8, left(c));
    }
    s->ptr = (const char *)c->p + c->pos;
    s->len = (size_t)n;
    c->pos += (size_t)n;
    return SP_OK;
}

/* ---- reader -------------------------------------------------------------- */

void
sp_gguf_close(sp_gguf_t *g)
{
    if (g == NULL) {
        return;
    }
    for (int64_t i = 0; i < g->n_str_arrays; i++) {
        sp_free(g->str_arrays[i]);
    }
    sp_free(g->str_arrays);
    sp_free(g->kv);
    sp_free(g->tensors);
    sp_free(g->kv_index.slots);
    sp_free(g->tensor_index.slots);
    if (g->guard >= 0) {
        guard_drop(g->guard);
    }
    if (g->map != NULL) {
        munmap(g->map, g->map_len);
    }
    if (g->fd >= 0) {
        close(g->fd);
    }
    if (g->release != NULL) {
        g->release(g->release_user);
    }
    sp_free(g->name);
    sp_free(g);
}

static sp_status_t
parse_kv_value(sp_gguf_t *g, cursor *c, kv_entry *e, const char *key_shown)
{
    sp_status_t st;
    size_t start = c->pos;
    size_t sz = sp_gguf_type_size(e->type);

    if (sz > 0) {
        if ((st = need(c, sz, "kv value")) != SP_OK) {
            return st;
        }
        c->pos += sz;
    } else if (e->type == SP_GGUF_TYPE_STRING) {
        if ((st = get_str(c, &e->v.str, SP_GGUF_MAX_STRING, "string value")) != SP_OK) {
            return st;
        }
    } else if (e->type == SP_GGUF_TYPE_ARRAY) {
        uint32_t et;
        uint64_t n;
        if ((st = get_u32(c, &et, "array element type")) != SP_OK ||
            (st = get_u64(c, &n, "array length")) != SP_OK) {
            return st;
        }
        if (et == SP_GGUF_TYPE_ARRAY) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: key '%s': nested arrays are not supported", c->name, key_shown);
        }
        if (et >= SP_GGUF_TYPE_COUNT) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: key '%s': unknown array element type %" PRIu32, c->name, key_shown,
                           et);
        }
        e->v.arr.elem_type = (sp_gguf_type_t)et;
        e->v.arr.n = n;
        size_t esz = sp_gguf_type_size((sp_gguf_type_t)et);
        if (esz > 0) {
            if (n > left(c) / esz) {
                return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                               "%s: key '%s': array of %" PRIu64 " %s runs past end of file "
                               "(%zu bytes left)",
                               c->name, key_shown, n, sp_gguf_type_name((sp_gguf_type_t)et),
                               left(c));
            }
            e->v.arr.data = c->p + c->pos;
            c->pos += (size_t)n * esz;
        } else {
            /* strings: each takes at least its 8-byte length, which bounds the allocation */
            if (n > left(c) / 8) {
                return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                               "%s: key '%s': array of %" PRIu64 " strings runs past end of file "
                               "(%zu bytes left)",
                               c->name, key_shown, n, left(c));
            }
            sp_str_t *strs = sp_calloc(n > 0 ? (size_t)n : 1, sizeof *strs);
            if (strs == NULL) {
                return sp_errf(c->err, c->err_len, SP_ERR_NOMEM,
                               "%s: key '%s': out of memory for %" PRIu64 " strings", c->name,
                               key_shown, n);
            }
            g->str_arrays[g->n_str_arrays++] = strs;
            e->v.arr.strs = strs;
            for (uint64_t i = 0; i < n; i++) {
                if ((st = get_str(c, &strs[i], SP_GGUF_MAX_STRING, "array string")) != SP_OK) {
                    return st;
                }
            }
        }
    } else {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT, "%s: key '%s': unknown value type %u",
                       c->name, key_shown, (unsigned)e->type);
    }
    e->raw = c->p + start;
    e->raw_len = c->pos - start;
    return SP_OK;
}

static sp_status_t
parse_kvs(sp_gguf_t *g, cursor *c)
{
    sp_status_t st;
    char shown[96];

    for (int64_t i = 0; i < g->n_kv; i++) {
        kv_entry *e = &g->kv[i];
        char what[48];
        snprintf(what, sizeof what, "key of kv %" PRId64, i);
        if ((st = get_str(c, &e->key, GGUF_MAX_KEY, what)) != SP_OK) {
            return st;
        }
        if (e->key.len == 0) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT, "%s: kv %" PRId64 " has an empty key",
                           c->name, i);
        }
        show(e->key, shown, sizeof shown);
        if (index_lookup(&g->kv_index, e->key, &g->kv[0].key, sizeof *g->kv, i) >= 0) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT, "%s: duplicate key '%s'", c->name,
                           shown);
        }
        uint32_t t;
        if ((st = get_u32(c, &t, "kv type")) != SP_OK) {
            return st;
        }
        if (t >= SP_GGUF_TYPE_COUNT) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: key '%s': unknown value type %" PRIu32, c->name, shown, t);
        }
        e->type = (sp_gguf_type_t)t;
        if ((st = parse_kv_value(g, c, e, shown)) != SP_OK) {
            return st;
        }
        if (sp_str_eq_c(e->key, "general.alignment")) {
            if (e->type != SP_GGUF_TYPE_UINT32) {
                return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                               "%s: general.alignment has type %s, expected u32", c->name,
                               sp_gguf_type_name(e->type));
            }
            uint32_t a = rd_u32(e->raw);
            if (a == 0 || (a & (a - 1)) != 0 || a > SP_GGUF_MAX_ALIGNMENT) {
                return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                               "%s: general.alignment %" PRIu32
                               " is not a power of two in [1, %u]",
                               c->name, a, SP_GGUF_MAX_ALIGNMENT);
            }
            g->alignment = a;
        }
    }
    return SP_OK;
}

static sp_status_t
parse_tensor_info(sp_gguf_t *g, cursor *c, int64_t i)
{
    sp_gguf_tensor_t *t = &g->tensors[i];
    sp_status_t st;
    char shown[96];
    char what[48];

    snprintf(what, sizeof what, "name of tensor %" PRId64, i);
    if ((st = get_str(c, &t->name, SP_GGUF_MAX_STRING, what)) != SP_OK) {
        return st;
    }
    show(t->name, shown, sizeof shown);
    if (t->name.len == 0) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                       "%s: tensor %" PRId64 " has an empty name", c->name, i);
    }
    if (t->name.len >= SP_GGUF_MAX_NAME) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s': name is %zu bytes, the limit is %d", c->name, shown,
                       t->name.len, SP_GGUF_MAX_NAME - 1);
    }
    if (index_lookup(&g->tensor_index, t->name, &g->tensors[0].name, sizeof *g->tensors, i) >= 0) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT, "%s: duplicate tensor name '%s'", c->name,
                       shown);
    }
    uint32_t n_dims;
    if ((st = get_u32(c, &n_dims, "tensor n_dims")) != SP_OK) {
        return st;
    }
    if (n_dims > SP_GGUF_MAX_DIMS) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s': n_dims %" PRIu32 " exceeds %d", c->name, shown, n_dims,
                       SP_GGUF_MAX_DIMS);
    }
    t->n_dims = (int)n_dims;
    for (int d = 0; d < SP_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
    }
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((st = get_u64(c, &ne, "tensor dimension")) != SP_OK) {
            return st;
        }
        if (ne > (uint64_t)INT64_MAX) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: tensor '%s': ne[%" PRIu32 "] = %" PRId64 " is negative", c->name,
                           shown, d, (int64_t)ne);
        }
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type;
    if ((st = get_u32(c, &type, "tensor type")) != SP_OK) {
        return st;
    }
    const sp_type_traits_t *tr = type < SP_TYPE_COUNT ? sp_type_traits((int)type) : NULL;
    if (tr == NULL) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT, "%s: tensor '%s': unknown type %" PRIu32,
                       c->name, shown, type);
    }
    t->type = (sp_type_t)type;
    if ((st = get_u64(c, &t->offset, "tensor offset")) != SP_OK) {
        return st;
    }

    /* Element count (checked in int64), then bytes (checked in size_t). */
    int64_t n_el = 1;
    for (int d = 0; d < SP_GGUF_MAX_DIMS; d++) {
        if (__builtin_mul_overflow(n_el, t->ne[d], &n_el)) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: tensor '%s': element count overflows int64", c->name, shown);
        }
    }
    if (t->ne[0] % tr->blck_size != 0) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                       "%s: tensor '%s': ne[0] = %" PRId64 " is not a multiple of the %s block "
                       "size %" PRId64,
                       c->name, shown, t->ne[0], tr->name, tr->blck_size);
    }
    size_t nb = (size_t)(t->ne[0] / tr->blck_size);
    if (sp_mul_size(nb, tr->type_size, &nb) != 0 || sp_mul_size(nb, (size_t)t->ne[1], &nb) != 0 ||
        sp_mul_size(nb, (size_t)t->ne[2], &nb) != 0 ||
        sp_mul_size(nb, (size_t)t->ne[3], &nb) != 0) {
        return sp_errf(c->err, c->err_len, SP_ERR_FORMAT, "%s: tensor '%s': byte size overflows",
                       c->name, shown);
    }
    t->nbytes = nb;
    return SP_OK;
}

static size_t
pad_to(size_t x, size_t align, int *overflow)
{
    size_t r = x % align;
    size_t out = x;
    if (r != 0 && sp_add_size(x, align - r, &out) != 0) {
        *overflow = 1;
    }
    return out;
}

/* Offsets must be exactly the running padded sum (no gaps, overlaps or reordering), as
 * llama.cpp's writer lays them out; every tensor must end inside the file. */
static sp_status_t
check_offsets(sp_gguf_t *g, cursor *c)
{
    char shown[96];
    size_t running = 0;

    for (int64_t i = 0; i < g->n_tensors; i++) {
        sp_gguf_tensor_t *t = &g->tensors[i];
        show(t->name, shown, sizeof shown);
        if (t->offset % g->alignment != 0) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: tensor '%s': offset %" PRIu64 " is not a multiple of the alignment "
                           "%zu",
                           c->name, shown, t->offset, g->alignment);
        }
        if (t->offset != running) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: tensor '%s': offset %" PRIu64 ", expected %zu (tensors must be "
                           "packed in order)",
                           c->name, shown, t->offset, running);
        }
        size_t start, end;
        int of = 0;
        if (sp_add_size(g->data_offset, running, &start) != 0 ||
            sp_add_size(start, t->nbytes, &end) != 0 || end > g->size) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: tensor '%s': data at offset %" PRIu64 " (%zu bytes) runs past end "
                           "of file (size %zu)",
                           c->name, shown, t->offset, t->nbytes, g->size);
        }
        t->data = g->base + start;
        size_t next;
        if (sp_add_size(running, t->nbytes, &next) != 0) {
            of = 1;
        }
        running = pad_to(next, g->alignment, &of);
        if (of) {
            return sp_errf(c->err, c->err_len, SP_ERR_FORMAT,
                           "%s: tensor '%s': total tensor size overflows", c->name, shown);
        }
    }
    return SP_OK;
}

static sp_status_t
parse(sp_gguf_t *g, char *err, size_t err_len)
{
    cursor c = {g->base, 0, g->size, g->name, err, err_len};
    sp_status_t st;

    if ((st = need(&c, 4, "magic")) != SP_OK) {
        return st;
    }
    if (memcmp(g->base, GGUF_MAGIC, 4) != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: bad magic %02x %02x %02x %02x (not a GGUF file)", g->name, g->base[0],
                       g->base[1], g->base[2], g->base[3]);
    }
    c.pos = 4;
    if ((st = get_u32(&c, &g->version, "version")) != SP_OK) {
        return st;
    }
    if (g->version != 0 && (g->version & 0xffffu) == 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: version 0x%08" PRIx32 " looks byte-swapped (a big-endian file); only "
                       "little-endian GGUF is supported",
                       g->name, g->version);
    }
    if (g->version == 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: GGUF version 1 is not supported (convert it to v3)", g->name);
    }
    if (g->version < GGUF_VERSION_MIN || g->version > GGUF_VERSION_MAX) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: unsupported GGUF version %" PRIu32 " (supported: %d to %d)", g->name,
                       g->version, GGUF_VERSION_MIN, GGUF_VERSION_MAX);
    }
    uint64_t n_tensors, n_kv;
    if ((st = get_u64(&c, &n_tensors, "tensor count")) != SP_OK ||
        (st = get_u64(&c, &n_kv, "kv count")) != SP_OK) {
        return st;
    }
    /* Bound both counts by what the rest of the file could hold, before allocating. */
    if (n_kv > left(&c) / GGUF_MIN_KV_BYTES || n_kv > UINT32_MAX - 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: kv count %" PRIu64 " is impossible in a file of %zu bytes", g->name,
                       n_kv, g->size);
    }
    if (n_tensors > left(&c) / GGUF_MIN_TENSOR_BYTES || n_tensors > UINT32_MAX - 1) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor count %" PRIu64 " is impossible in a file of %zu bytes", g->name,
                       n_tensors, g->size);
    }
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kv = sp_calloc(n_kv > 0 ? (size_t)n_kv : 1, sizeof *g->kv);
    g->str_arrays = sp_calloc(n_kv > 0 ? (size_t)n_kv : 1, sizeof *g->str_arrays);
    g->tensors = sp_calloc(n_tensors > 0 ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (g->kv == NULL || g->str_arrays == NULL || g->tensors == NULL ||
        index_init(&g->kv_index, g->n_kv) != 0 || index_init(&g->tensor_index, g->n_tensors) != 0) {
        return sp_errf(err, err_len, SP_ERR_NOMEM,
                       "%s: out of memory for %" PRIu64 " kvs and %" PRIu64 " tensors", g->name,
                       n_kv, n_tensors);
    }
    g->alignment = SP_GGUF_DEFAULT_ALIGNMENT;
    if ((st = parse_kvs(g, &c)) != SP_OK) {
        return st;
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        if ((st = parse_tensor_info(g, &c, i)) != SP_OK) {
            return st;
        }
    }
    int of = 0;
    g->data_offset = pad_to(c.pos, g->alignment, &of);
    if (of || (g->n_tensors > 0 && g->data_offset > g->size)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: tensor data would start at byte %zu, past end of file (size %zu)",
                       g->name, of ? c.pos : g->data_offset, g->size);
    }
    if (g->data_offset > g->size) {
        g->data_offset = g->size; /* no tensors: the padding may be absent */
    }
    return check_offsets(g, &c);
}

static sp_status_t
open_common(sp_gguf_t *g, sp_gguf_t **out, char *err, size_t err_len)
{
    sp_status_t st = parse(g, err, err_len);
    if (st != SP_OK) {
        sp_gguf_close(g);
        return st;
    }
    *out = g;
    return SP_OK;
}

sp_status_t
sp_gguf_open_mem(const void *buf, size_t len, const char *name, sp_gguf_t **out, char *err,
                 size_t err_len)
{
    *out = NULL;
    if (name == NULL) {
        name = "<memory>";
    }
    if (buf == NULL && len > 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: NULL buffer", name);
    }
    sp_gguf_t *g = sp_calloc(1, sizeof *g);
    if (g != NULL) {
        g->fd = g->guard = -1;
    }
    if (g == NULL || (g->name = sp_strndup(name, strlen(name))) == NULL) {
        sp_free(g);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", name);
    }
    static const uint8_t empty[1];
    g->base = len > 0 ? buf : empty;
    g->size = len;
    return open_common(g, out, err, err_len);
}

sp_status_t
sp_gguf_open_mem_owned(const void *buf, size_t len, const char *name, sp_gguf_release_fn release,
                       void *user, sp_gguf_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (name == NULL) {
        name = "<memory>";
    }
    sp_gguf_t *g = sp_calloc(1, sizeof *g);
    if (g != NULL) {
        g->fd = g->guard = -1;
    }
    if (g == NULL || (g->name = sp_strndup(name, strlen(name))) == NULL) {
        sp_free(g);
        if (release != NULL) {
            release(user);
        }
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", name);
    }
    /* From here sp_gguf_close (also open_common's, on a parse error) releases it. */
    g->release = release;
    g->release_user = user;
    if (buf == NULL && len > 0) {
        sp_gguf_close(g);
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: NULL buffer", name);
    }
    static const uint8_t empty[1];
    g->base = len > 0 ? buf : empty;
    g->size = len;
    return open_common(g, out, err, err_len);
}

/* ---- the file under the reader: copy or guarded mapping ----------------
 *
 * A model file can change while it is served (a deploy copies over it, an
 * operator truncates it). A plain mapping would then crash the process with
 * SIGBUS (pages past the new end) or silently hand the engine other weights
 * (a same-size overwrite shows through a MAP_PRIVATE page that was never
 * written). So files up to sp_gguf_set_copy_max bytes are read once into
 * anonymous private memory that no file operation can reach; larger ones are
 * mapped, and a SIGBUS in such a mapping is caught: the rest of the mapping
 * becomes zero pages (the faulting read completes and sees zeros) and the
 * handle is marked changed, which the server checks after every step
 * (sp_gguf_weights_changed) to fail the step's requests and reload. */

static _Atomic size_t g_copy_max; /* 0: map every file (tools); the server sets its own */
static atomic_bool g_guard_on;    /* guard mappings (the server); tools keep the default crash */

void
sp_gguf_set_copy_max(size_t bytes)
{
    atomic_store(&g_copy_max, bytes);
}

size_t
sp_gguf_copy_max(void)
{
    return atomic_load(&g_copy_max);
}

void
sp_gguf_set_guard(bool on)
{
    atomic_store(&g_guard_on, on);
}

#define GUARD_SLOTS 1024

/* One guarded mapping. lo != 0 marks a slot in use; the handler reads it without locks. */
typedef struct guard_slot {
    _Atomic uintptr_t lo, hi;
    atomic_int hit;
} guard_slot;

static guard_slot g_guard[GUARD_SLOTS];
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_guard_installed;
static struct sigaction g_guard_prev;
static uintptr_t g_page;

static void
guard_handler(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t lo = atomic_load_explicit(&g_guard[i].lo, memory_order_acquire);
        uintptr_t hi = atomic_load_explicit(&g_guard[i].hi, memory_order_acquire);
        if (lo == 0 || a < lo || a >= hi) {
            continue;
        }
        /* The file shrank under the mapping: from the faulting page to the
         * end, zeros instead (mmap is a plain system call, safe here). The
         * faulting instruction runs again and reads them. */
        uintptr_t page = a & ~(g_page - 1);
        if (mmap((void *)page, hi - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                 0) != MAP_FAILED) {
            atomic_store(&g_guard[i].hit, 1);
            return;
        }
        break;
    }
    /* Not a guarded mapping: whoever handled SIGBUS before us, else the default (a crash). */
    if ((g_guard_prev.sa_flags & SA_SIGINFO) && g_guard_prev.sa_sigaction != NULL) {
        g_guard_prev.sa_sigaction(sig, si, uc);
        return;
    }
    if (g_guard_prev.sa_handler != SIG_DFL && g_guard_prev.sa_handler != SIG_IGN &&
        g_guard_prev.sa_handler != NULL) {
        g_guard_prev.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL); /* the fault repeats on return and ends the process as before */
}

/* A slot for [lo, lo + len), installing the handler on first use; -1 when full. */
static int
guard_add(const void *lo, size_t len)
{
    pthread_mutex_lock(&g_guard_mu);
    if (!g_guard_installed) {
        long ps = sysconf(_SC_PAGESIZE);
        g_page = ps > 0 ? (uintptr_t)ps : 4096;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = guard_handler;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &g_guard_prev) != 0) {
            pthread_mutex_unlock(&g_guard_mu);
            return -1;
        }
        g_guard_installed = true;
    }
    int slot = -1;
    for (int i = 0; i < GUARD_SLOTS && slot < 0; i++) {
        if (atomic_load(&g_guard[i].lo) == 0) {
            slot = i;
            atomic_store(&g_guard[i].hit, 0);
            atomic_store_explicit(&g_guard[i].hi, (uintptr_t)lo + len, memory_order_release);
            atomic_store_explicit(&g_guard[i].lo, (uintptr_t)lo, memory_order_release);
        }
    }
    pthread_mutex_unlock(&g_guard_mu);
    return slot;
}

/* Release a slot (before its mapping is unmapped). */
static void
guard_drop(int slot)
{
    pthread_mutex_lock(&g_guard_mu);
    atomic_store_explicit(&g_guard[slot].lo, 0, memory_order_release);
    atomic_store_explicit(&g_guard[slot].hi, 0, memory_order_release);
    pthread_mutex_unlock(&g_guard_mu);
}

/* Read the whole file into a new anonymous private mapping, read-only once filled.
 * Fails when the file changes while it is read (size, inode or mtime). */
static sp_status_t
copy_file(int fd, const char *path, const struct stat *before, void **out, size_t *out_len,
          char *err, size_t err_len)
{
    size_t size = (size_t)before->st_size;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: cannot allocate %zu bytes for its copy: %s",
                       path, size, strerror(errno));
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(m, size, MADV_HUGEPAGE); /* fewer TLB misses over the weights; a hint only */
#endif
    const size_t chunk = (size_t)16 << 20;
    size_t got = 0;
    while (got < size) {
        size_t want = size - got < chunk ? size - got : chunk;
        ssize_t n = pread(fd, (uint8_t *)m + got, want, (off_t)got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int e = n < 0 ? errno : 0;
            munmap(m, size);
            return sp_errf(err, err_len, SP_ERR_IO, "%s: %s", path,
                           e ? strerror(e) : "the file shrank while it was read");
        }
        /* The copy is what serves: the page cache need not keep a second one. */
        (void)posix_fadvise(fd, (off_t)got, (off_t)n, POSIX_FADV_DONTNEED);
        got += (size_t)n;
    }
    struct stat after;
    if (fstat(fd, &after) != 0 || !sp_file_same(before, &after)) {
        munmap(m, size);
        return sp_errf(err, err_len, SP_ERR_IO, "%s: the file changed while it was read", path);
    }
    (void)mprotect(m, size, PROT_READ);
    *out = m;
    *out_len = size;
    return SP_OK;
}

sp_status_t
sp_gguf_open(const char *path, sp_gguf_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (path == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "NULL model path");
    }
    /* O_NONBLOCK: opening a FIFO must not hang before the S_ISREG check refuses it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return sp_errf(err, err_len, e == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "%s: %s", path,
                       strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return sp_errf(err, err_len, SP_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: not a regular file", path);
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)SIZE_MAX / 2) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: file too large", path);
    }
    size_t size = (size_t)sb.st_size;
    sp_gguf_t *g = sp_calloc(1, sizeof *g);
    if (g != NULL) {
        g->fd = g->guard = -1;
    }
    if (g == NULL || (g->name = sp_strndup(path, strlen(path))) == NULL) {
        sp_free(g);
        close(fd);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    g->id = sb;
    g->has_id = true;
    if (size == 0) {
        close(fd);
        sp_gguf_close(g);
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: empty file", path);
    }
    if (size <= sp_gguf_copy_max()) {
        void *m = NULL;
        size_t len = 0;
        sp_status_t st = copy_file(fd, path, &sb, &m, &len, err, err_len);
        close(fd);
        if (st != SP_OK) {
            sp_gguf_close(g);
            return st;
        }
        g->map = m;
        g->map_len = len;
        g->copied = true;
    } else {
        void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        int e = errno;
        if (m == MAP_FAILED) {
            close(fd);
            sp_gguf_close(g);
            return sp_errf(err, err_len, SP_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
        g->map = m;
        g->fd = fd;
        long ps = sysconf(_SC_PAGESIZE);
        size_t page = ps > 0 ? (size_t)ps : 4096;
        g->map_len = (size + page - 1) / page * page;
        g->guard = atomic_load(&g_guard_on) ? guard_add(m, g->map_len) : -1;
        if (atomic_load(&g_guard_on) && g->guard < 0) {
            sp_gguf_close(g);
            return sp_errf(err, err_len, SP_ERR_IO,
                           "%s: cannot guard its mapping (more than %d mapped model files)", path,
                           GUARD_SLOTS);
        }
    }
    g->base = g->map;
    g->size = size;
    return open_common(g, out, err, err_len);
}

bool
sp_gguf_is_copy(const sp_gguf_t *g)
{
    return g->copied;
}

bool
sp_gguf_weights_changed(const sp_gguf_t *g)
{
    if (g->guard >= 0 && atomic_load(&g_guard[g->guard].hit)) {
        return true;
    }
    if (g->fd < 0) {
        return false; /* a copy or a caller buffer: nothing outside can change it */
    }
    /* The mapped inode itself written or cut (a rename over the path leaves
     * this inode, and so the mapping, as it was). */
    struct stat now;
    return fstat(g->fd, &now) != 0 || !sp_file_same(&g->id, &now);
}

bool
sp_gguf_file_changed(const sp_gguf_t *g)
{
    if (!g->has_id) {
        return false;
    }
    if (sp_gguf_weights_changed(g)) {
        return true;
    }
    struct stat now;
    return stat(g->name, &now) != 0 || !sp_file_same(&g->id, &now);
}

void
sp_gguf_prefault(const sp_gguf_t *g)
{
    if (g->map == NULL || g->copied) {
        return; /* a copy is resident already */
    }
    /* Map every page now (MADV_POPULATE_READ, Linux 5.14+), so the first
     * token does not pay hundreds of thousands of page faults; older kernels
     * get read-ahead only. Failure is harmless: pages then fault on use. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
    if (madvise(g->map, g->size, MADV_POPULATE_READ) != 0) {
        (void)madvise(g->map, g->size, MADV_WILLNEED);
    }
}

/* [p, p + len) lies in g's own memory (the mapping, the copy or an owned buffer). */
static bool
own_range(const sp_gguf_t *g, const void *p, size_t len)
{
    const bool own = g->map != NULL || g->release != NULL;
    const uintptr_t b = (uintptr_t)g->base, a = (uintptr_t)p;
    return own && len > 0 && a >= b && a - b <= g->size && len <= g->size - (a - b);
}

/* The whole pages inside [p, p + len), if the range is g's own memory; false otherwise. */
static bool
own_pages(const sp_gguf_t *g, const void *p, size_t len, uintptr_t *lo, uintptr_t *hi)
{
    if (!own_range(g, p, len)) {
        return false;
    }
    const uintptr_t a = (uintptr_t)p;
    long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    *lo = (a + page - 1) / page * page;
    *hi = (a + len) / page * page;
    return *hi > *lo;
}

size_t
sp_gguf_release_range(sp_gguf_t *g, const void *p, size_t len, sp_gguf_release_t *how)
{
    uintptr_t lo, hi;
    *how = SP_GGUF_KEPT;
    if (!own_pages(g, p, len, &lo, &hi)) {
        return 0;
    }
    const size_t n = hi - lo;
    if (g->fd >= 0 && !g->copied) { /* the file mapping */
        if (madvise((void *)lo, n, MADV_DONTNEED) != 0) {
            return 0;
        }
        (void)posix_fadvise(g->fd, (off_t)(lo - (uintptr_t)g->base), (off_t)n,
                            POSIX_FADV_DONTNEED);
        *how = SP_GGUF_REFAULTS;
        return n;
    }
    /* Anonymous: a decrypted model's pages are locked (no swap), which MADV_DONTNEED refuses;
     * unlocked pages are unaffected by munlock. */
    (void)munlock((void *)lo, n);
    if (madvise((void *)lo, n, MADV_DONTNEED) != 0) {
        if (g->release != NULL) {
            (void)mlock((void *)lo, n);
        }
        return 0;
    }
    *how = SP_GGUF_ZEROED;
    return n;
}

sp_status_t
sp_gguf_refill_range(sp_gguf_t *g, const void *p, size_t len, void (*fill)(void *user),
                     void *user, char *err, size_t err_len)
{
    long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    if (!own_range(g, p, len) || g->fd >= 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: no released anonymous range to refill",
                       g->name);
    }
    /* the partial pages at both ends were kept; they are rewritten with their own bytes */
    const uintptr_t lo = (uintptr_t)p / page * page;
    const uintptr_t hi = ((uintptr_t)p + len + page - 1) / page * page;
    if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) != 0) {
        return sp_errf(err, err_len, SP_ERR_IO, "%s: cannot rewrite the released weights: %s",
                       g->name, strerror(errno));
    }
    fill(user);
    if (g->release != NULL) {
        (void)mlock((void *)lo, hi - lo); /* best effort, as at decryption */
    }
    (void)mprotect((void *)lo, hi - lo, PROT_READ);
    return SP_OK;
}

const char *
sp_gguf_path(const sp_gguf_t *g)
{
    return g->name;
}

uint32_t
sp_gguf_version(const sp_gguf_t *g)
{
    return g->version;
}

size_t
sp_gguf_file_size(const sp_gguf_t *g)
{
    return g->size;
}

size_t
sp_gguf_alignment(const sp_gguf_t *g)
{
    return g->alignment;
}

size_t
sp_gguf_data_offset(const sp_gguf_t *g)
{
    return g->data_offset;
}

/* ---- metadata ------------------------------------------------------------ */

int64_t
sp_gguf_n_kv(const sp_gguf_t *g)
{
    return g->n_kv;
}

int64_t
sp_gguf_find_key(const sp_gguf_t *g, const char *key)
{
    if (g->n_kv == 0) {
        return -1;
    }
    return index_lookup(&g->kv_index, sp_str_c(key), &g->kv[0].key, sizeof *g->kv, -1);
}

sp_str_t
sp_gguf_kv_key(const sp_gguf_t *g, int64_t i)
{
    sp_str_t none = {"", 0};
    return i >= 0 && i < g->n_kv ? g->kv[i].key : none;
}

sp_gguf_type_t
sp_gguf_kv_type(const sp_gguf_t *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? g->kv[i].type : SP_GGUF_TYPE_COUNT;
}

sp_status_t
sp_gguf_kv_raw(const sp_gguf_t *g, int64_t i, const void **raw, size_t *raw_len)
{
    if (i < 0 || i >= g->n_kv) {
        return SP_ERR_NOT_FOUND;
    }
    *raw = g->kv[i].raw;
    *raw_len = g->kv[i].raw_len;
    return SP_OK;
}

/* Integer value of a scalar kv of integer type; false when not an integer or not in int64. */
static bool
scalar_int(sp_gguf_type_t t, const uint8_t *p, int64_t *out, bool *range)
{
    *range = true;
    switch (t) {
    case SP_GGUF_TYPE_UINT8: *out = p[0]; return true;
    case SP_GGUF_TYPE_INT8: *out = (int8_t)p[0]; return true;
    case SP_GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case SP_GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case SP_GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case SP_GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case SP_GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return true; }
    case SP_GGUF_TYPE_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) {
            *range = false;
            return false;
        }
        *out = (int64_t)v;
        return true;
    }
    default:
        return false;
    }
}

static const kv_entry *
lookup(const sp_gguf_t *g, const char *key)
{
    int64_t i = sp_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

static sp_status_t
type_err(const sp_gguf_t *g, const char *key, const kv_entry *e, const char *want, char *err,
         size_t err_len)
{
    return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s' has type %s, expected %s", g->name,
                   key, sp_gguf_type_name(e->type), want);
}

sp_status_t
sp_gguf_get_int(const sp_gguf_t *g, const char *key, int64_t *out, char *err, size_t err_len)
{
    const kv_entry *e = lookup(g, key);
    if (e == NULL) {
        return SP_ERR_NOT_FOUND;
    }
    bool range;
    if (!scalar_int(e->type, e->raw, out, &range)) {
        if (!range) {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: key '%s': value does not fit int64",
                           g->name, key);
        }
        return type_err(g, key, e, "an integer", err, err_len);
    }
    return SP_OK;
}

sp_status_t
sp_gguf_get_float(const sp_gguf_t *g, const char *key, double *out, char *err, size_t err_len)
{
    const kv_entry *e = lookup(g, key);
    if (e == NULL) {
        return SP_ERR_NOT_FOUND;
    }
    if (e->type == SP_GGUF_TYPE_FLOAT32) {
        float f;
        memcpy(&f, e->raw, 4);
        *out = f;
        return SP_OK;
    }
    if (e->type == SP_GGUF_TYPE_FLOAT64) {
        memcpy(out, e->raw, 8);
        return SP_OK;
    }
    if (e->type == SP_GGUF_TYPE_UINT64) {
        uint64_t v;
        memcpy(&v, e->raw, 8);
        *out = (double)v;
        return SP_OK;
    }
    int64_t iv;
    bool range;
    if (scalar_int(e->type, e->raw, &iv, &range)) {
        *out = (double)iv;
        return SP_OK;
    }
    return type_err(g, key, e, "a number", err, err_len);
}

sp_status_t
sp_gguf_get_bool(const sp_gguf_t *g, const char *key, bool *out, char *err, size_t err_len)
{
    const kv_entry *e = lookup(g, key);
    if (e == NULL) {
        return SP_ERR_NOT_FOUND;
    }
    if (e->type != SP_GGUF_TYPE_BOOL) {
        return type_err(g, key, e, "bool", err, err_len);
    }
    *out = e->raw[0] != 0;
    return SP_OK;
}

sp_status_t
sp_gguf_get_str(const sp_gguf_t *g, const char *key, sp_str_t *out, char *err, size_t err_len)
{
    const kv_entry *e = lookup(g, key);
    if (e == NULL) {
        return SP_ERR_NOT_FOUND;
    }
    if (e->type != SP_GGUF_TYPE_STRING) {
        return type_err(g, key, e, "str", err, err_len);
    }
    *out = e->v.str;
    return SP_OK;
}

sp_status_t
sp_gguf_get_arr(const sp_gguf_t *g, const char *key, sp_gguf_arr_t *out, char *err, size_t err_len)
{
    const kv_entry *e = lookup(g, key);
    if (e == NULL) {
        return SP_ERR_NOT_FOUND;
    }
    if (e->type != SP_GGUF_TYPE_ARRAY) {
        return type_err(g, key, e, "arr", err, err_len);
    }
    *out = e->v.arr;
    return SP_OK;
}

double
sp_gguf_arr_float(const sp_gguf_arr_t *a, uint64_t i)
{
    if (i >= a->n || a->data == NULL) {
        return 0.0;
    }
    const uint8_t *p = (const uint8_t *)a->data + i * sp_gguf_type_size(a->elem_type);
    switch (a->elem_type) {
    case SP_GGUF_TYPE_FLOAT32: { float f; memcpy(&f, p, 4); return f; }
    case SP_GGUF_TYPE_FLOAT64: { double d; memcpy(&d, p, 8); return d; }
    case SP_GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    case SP_GGUF_TYPE_BOOL: return p[0] != 0;
    default: {
        int64_t v;
        bool range;
        return scalar_int(a->elem_type, p, &v, &range) ? (double)v : 0.0;
    }
    }
}

int64_t
sp_gguf_arr_int(const sp_gguf_arr_t *a, uint64_t i)
{
    if (i >= a->n || a->data == NULL) {
        return 0;
    }
    const uint8_t *p = (const uint8_t *)a->data + i * sp_gguf_type_size(a->elem_type);
    switch (a->elem_type) {
    case SP_GGUF_TYPE_FLOAT32:
    case SP_GGUF_TYPE_FLOAT64: {
        /* NaN and values outside int64 read as 0 rather than invoking UB in the cast */
        double d = sp_gguf_arr_float(a, i);
        return d == d && d > -9.2e18 && d < 9.2e18 ? (int64_t)d : 0;
    }
    case SP_GGUF_TYPE_BOOL: return p[0] != 0;
    case SP_GGUF_TYPE_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v; /* saturate */
    }
    default: {
        int64_t v;
        bool range;
        return scalar_int(a->elem_type, p, &v, &range) ? v : 0;
    }
    }
}

/* ---- tensors ------------------------------------------------------------- */

int64_t
sp_gguf_n_tensors(const sp_gguf_t *g)
{
    return g->n_tensors;
}

const sp_gguf_tensor_t *
sp_gguf_tensor(const sp_gguf_t *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const sp_gguf_tensor_t *
sp_gguf_find_tensor(const sp_gguf_t *g, const char *name)
{
    if (g->n_tensors == 0) {
        return NULL;
    }
    int64_t i = index_lookup(&g->tensor_index, sp_str_c(name), &g->tensors[0].name,
                             sizeof *g->tensors, -1);
    return i < 0 ? NULL : &g->tensors[i];
}

/* ---- writer -------------------------------------------------------------- */

typedef struct w_kv {
    char *key;
    uint32_t type;
    uint8_t *val; /* serialized value, as in the file */
    size_t val_len;
} w_kv;

typedef struct w_tensor {
    char name[SP_GGUF_MAX_NAME];
    int n_dims;
    int64_t ne[SP_GGUF_MAX_DIMS];
    sp_type_t type;
    size_t nbytes;
    size_t row_bytes;
    int64_t n_rows;
    const void *data;      /* copied at write time, or NULL with fill */
    sp_gguf_fill_fn fill;
    void *user;
} w_tensor;

struct sp_gguf_writer {
    w_kv *kv;
    int64_t n_kv, cap_kv;
    w_tensor *tensors;
    int64_t n_tensors, cap_tensors;
    size_t alignment;
};

sp_status_t
sp_gguf_writer_create(sp_gguf_writer_t **out)
{
    *out = sp_calloc(1, sizeof **out);
    if (*out == NULL) {
        return SP_ERR_NOMEM;
    }
    (*out)->alignment = SP_GGUF_DEFAULT_ALIGNMENT;
    return SP_OK;
}

void
sp_gguf_writer_destroy(sp_gguf_writer_t *w)
{
    if (w == NULL) {
        return;
    }
    for (int64_t i = 0; i < w->n_kv; i++) {
        sp_free(w->kv[i].key);
        sp_free(w->kv[i].val);
    }
    sp_free(w->kv);
    sp_free(w->tensors);
    sp_free(w);
}

/* Set (or replace) key with an owned copy of the serialized value. */
static sp_status_t
w_set(sp_gguf_writer_t *w, const char *key, uint32_t type, const void *val, size_t val_len)
{
    if (key == NULL || key[0] == '\0' || strlen(key) > GGUF_MAX_KEY) {
        return SP_ERR_INVALID;
    }
    uint8_t *copy = sp_malloc(val_len > 0 ? val_len : 1);
    if (copy == NULL) {
        return SP_ERR_NOMEM;
    }
    if (val_len > 0) {
        memcpy(copy, val, val_len);
    }
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            sp_free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = copy;
            w->kv[i].val_len = val_len;
            return SP_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        w_kv *nk = sp_realloc(w->kv, (size_t)cap * sizeof *nk);
        if (nk == NULL) {
            sp_free(copy);
            return SP_ERR_NOMEM;
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    char *k = sp_strndup(key, strlen(key));
    if (k == NULL) {
        sp_free(copy);
        return SP_ERR_NOMEM;
    }
    w->kv[w->n_kv++] = (w_kv){k, type, copy, val_len};
    return SP_OK;
}

sp_status_t
sp_gguf_writer_copy_kv(sp_gguf_writer_t *w, const sp_gguf_t *g)
{
    char key[GGUF_MAX_KEY + 1];
    for (int64_t i = 0; i < g->n_kv; i++) {
        const kv_entry *e = &g->kv[i];
        if (sp_str_eq_c(e->key, "general.alignment") || memchr(e->key.ptr, '\0', e->key.len)) {
            continue;
        }
        memcpy(key, e->key.ptr, e->key.len);
        key[e->key.len] = '\0';
        sp_status_t st = w_set(w, key, e->type, e->raw, e->raw_len);
        if (st != SP_OK) {
            return st;
        }
    }
    return SP_OK;
}

sp_status_t
sp_gguf_writer_set_u32(sp_gguf_writer_t *w, const char *key, uint32_t v)
{
    return w_set(w, key, SP_GGUF_TYPE_UINT32, &v, 4);
}

sp_status_t
sp_gguf_writer_set_i32(sp_gguf_writer_t *w, const char *key, int32_t v)
{
    return w_set(w, key, SP_GGUF_TYPE_INT32, &v, 4);
}

sp_status_t
sp_gguf_writer_set_u64(sp_gguf_writer_t *w, const char *key, uint64_t v)
{
    return w_set(w, key, SP_GGUF_TYPE_UINT64, &v, 8);
}

sp_status_t
sp_gguf_writer_set_f32(sp_gguf_writer_t *w, const char *key, float v)
{
    return w_set(w, key, SP_GGUF_TYPE_FLOAT32, &v, 4);
}

sp_status_t
sp_gguf_writer_set_bool(sp_gguf_writer_t *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return w_set(w, key, SP_GGUF_TYPE_BOOL, &b, 1);
}

sp_status_t
sp_gguf_writer_set_str(sp_gguf_writer_t *w, const char *key, const char *v)
{
    size_t n = strlen(v), len;
    if (n > SP_GGUF_MAX_STRING || sp_add_size(n, 8, &len) != 0) {
        return SP_ERR_INVALID;
    }
    uint8_t *buf = sp_malloc(len);
    if (buf == NULL) {
        return SP_ERR_NOMEM;
    }
    uint64_t n64 = n;
    memcpy(buf, &n64, 8);
    memcpy(buf + 8, v, n);
    sp_status_t st = w_set(w, key, SP_GGUF_TYPE_STRING, buf, len);
    sp_free(buf);
    return st;
}

sp_status_t
sp_gguf_writer_set_arr(sp_gguf_writer_t *w, const char *key, sp_gguf_type_t elem_type, uint64_t n,
                       const void *data)
{
    size_t esz = sp_gguf_type_size(elem_type);
    size_t bytes, len;
    if (esz == 0 || n > SIZE_MAX || sp_mul_size((size_t)n, esz, &bytes) != 0 ||
        sp_add_size(bytes, 12, &len) != 0) {
        return SP_ERR_INVALID;
    }
    uint8_t *buf = sp_malloc(len);
    if (buf == NULL) {
        return SP_ERR_NOMEM;
    }
    uint32_t et = elem_type;
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &n, 8);
    if (bytes > 0) {
        memcpy(buf + 12, data, bytes);
    }
    sp_status_t st = w_set(w, key, SP_GGUF_TYPE_ARRAY, buf, len);
    sp_free(buf);
    return st;
}

sp_status_t
sp_gguf_writer_set_arr_str(sp_gguf_writer_t *w, const char *key, const char *const *strs,
                           uint64_t n)
{
    size_t len = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t sl = strlen(strs[i]);
        if (sl > SP_GGUF_MAX_STRING || sp_add_size(len, 8, &len) != 0 ||
            sp_add_size(len, sl, &len) != 0) {
            return SP_ERR_INVALID;
        }
    }
    uint8_t *buf = sp_malloc(len);
    if (buf == NULL) {
        return SP_ERR_NOMEM;
    }
    uint32_t et = SP_GGUF_TYPE_STRING;
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &n, 8);
    size_t o = 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t sl = strlen(strs[i]);
        memcpy(buf + o, &sl, 8);
        memcpy(buf + o + 8, strs[i], (size_t)sl);
        o += 8 + (size_t)sl;
    }
    sp_status_t st = w_set(w, key, SP_GGUF_TYPE_ARRAY, buf, len);
    sp_free(buf);
    return st;
}

sp_status_t
sp_gguf_writer_set_alignment(sp_gguf_writer_t *w, uint32_t alignment)
{
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 ||
        alignment > SP_GGUF_MAX_ALIGNMENT) {
        return SP_ERR_INVALID;
    }
    sp_status_t st = w_set(w, "general.alignment", SP_GGUF_TYPE_UINT32, &alignment, 4);
    if (st == SP_OK) {
        w->alignment = alignment;
    }
    return st;
}

static sp_status_t
w_add_tensor(sp_gguf_writer_t *w, const char *name, sp_type_t type, int n_dims, const int64_t *ne,
             const void *data, sp_gguf_fill_fn fill, void *user)
{
    const sp_type_traits_t *tr = sp_type_traits((int)type);
    if (name == NULL || name[0] == '\0' || strlen(name) >= SP_GGUF_MAX_NAME || tr == NULL ||
        n_dims < 1 || n_dims > SP_GGUF_MAX_DIMS || ne == NULL) {
        return SP_ERR_INVALID;
    }
    w_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.n_dims = n_dims;
    t.type = type;
    t.data = data;
    t.fill = fill;
    t.user = user;
    int64_t rows = 1;
    for (int d = 0; d < SP_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0 || (d > 0 && __builtin_mul_overflow(rows, t.ne[d], &rows))) {
            return SP_ERR_INVALID;
        }
    }
    if (t.ne[0] % tr->blck_size != 0) {
        return SP_ERR_INVALID;
    }
    t.row_bytes = (size_t)(t.ne[0] / tr->blck_size) * tr->type_size;
    t.n_rows = rows;
    if (sp_mul_size(t.row_bytes, (size_t)rows, &t.nbytes) != 0) {
        return SP_ERR_INVALID;
    }
    for (int64_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            return SP_ERR_INVALID;
        }
    }
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        w_tensor *nt = sp_realloc(w->tensors, (size_t)cap * sizeof *nt);
        if (nt == NULL) {
            return SP_ERR_NOMEM;
        }
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    w->tensors[w->n_tensors++] = t;
    return SP_OK;
}

sp_status_t
sp_gguf_writer_add_tensor(sp_gguf_writer_t *w, const char *name, sp_type_t type, int n_dims,
                          const int64_t *ne, const void *data)
{
    return w_add_tensor(w, name, type, n_dims, ne, data, NULL, NULL);
}

sp_status_t
sp_gguf_writer_add_tensor_fill(sp_gguf_writer_t *w, const char *name, sp_type_t type, int n_dims,
                               const int64_t *ne, sp_gguf_fill_fn fill, void *user)
{
    if (fill == NULL) {
        return SP_ERR_INVALID;
    }
    return w_add_tensor(w, name, type, n_dims, ne, NULL, fill, user);
}

/* Output sink: a FILE or a growable memory buffer. */
typedef struct sink {
    FILE *f;
    uint8_t *buf;
    size_t len, cap;
    size_t written;
    bool failed;
} sink;

static void
put(sink *s, const void *p, size_t n)
{
    if (s->failed || n == 0) {
        return;
    }
    if (s->f != NULL) {
        if (fwrite(p, 1, n, s->f) != n) {
            s->failed = true;
        }
    } else {
        size_t need_len;
        if (sp_add_size(s->len, n, &need_len) != 0) {
            s->failed = true;
            return;
        }
        if (need_len > s->cap) {
            size_t cap = s->cap ? s->cap : 4096;
            while (cap < need_len) {
                if (sp_mul_size(cap, 2, &cap) != 0) {
                    s->failed = true;
                    return;
                }
            }
            uint8_t *nb = sp_realloc(s->buf, cap);
            if (nb == NULL) {
                s->failed = true;
                return;
            }
            s->buf = nb;
            s->cap = cap;
        }
        memcpy(s->buf + s->len, p, n);
        s->len = need_len;
    }
    s->written += n;
}

static void
put_u32(sink *s, uint32_t v)
{
    put(s, &v, 4);
}

static void
put_u64(sink *s, uint64_t v)
{
    put(s, &v, 8);
}

static void
put_zeros(sink *s, size_t n)
{
    static const uint8_t z[64];
    while (n > 0) {
        size_t k = n < sizeof z ? n : sizeof z;
        put(s, z, k);
        n -= k;
    }
}

static size_t
pad_len(size_t x, size_t align)
{
    return (align - x % align) % align;
}

/* Rows per fill call: about 16 MiB of output, at least one row. */
#define FILL_CHUNK_BYTES ((size_t)16 << 20)

static sp_status_t
w_emit(sp_gguf_writer_t *w, sink *s, const char *name, char *err, size_t err_len)
{
    put(s, GGUF_MAGIC, 4);
    put_u32(s, 3);
    put_u64(s, (uint64_t)w->n_tensors);
    put_u64(s, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        put_u64(s, strlen(w->kv[i].key));
        put(s, w->kv[i].key, strlen(w->kv[i].key));
        put_u32(s, w->kv[i].type);
        put(s, w->kv[i].val, w->kv[i].val_len);
    }
    size_t offset = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const w_tensor *t = &w->tensors[i];
        put_u64(s, strlen(t->name));
        put(s, t->name, strlen(t->name));
        put_u32(s, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) {
            put_u64(s, (uint64_t)t->ne[d]);
        }
        put_u32(s, (uint32_t)t->type);
        put_u64(s, offset);
        if (sp_add_size(offset, t->nbytes, &offset) != 0 ||
            sp_add_size(offset, pad_len(offset, w->alignment), &offset) != 0) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "%s: total tensor size overflows", name);
        }
    }
    put_zeros(s, pad_len(s->written, w->alignment));

    uint8_t *chunk = NULL;
    size_t chunk_cap = 0;
    sp_status_t st = SP_OK;
    for (int64_t i = 0; i < w->n_tensors && st == SP_OK && !s->failed; i++) {
        const w_tensor *t = &w->tensors[i];
        if (t->fill == NULL) {
            put(s, t->data, t->nbytes);
        } else if (t->row_bytes > 0) {
            int64_t rows_per = (int64_t)(FILL_CHUNK_BYTES / t->row_bytes);
            if (rows_per < 1) {
                rows_per = 1;
            }
            if (rows_per > t->n_rows) {
                rows_per = t->n_rows;
            }
            size_t want = (size_t)rows_per * t->row_bytes;
            if (want > chunk_cap) {
                sp_free(chunk);
                chunk = sp_malloc(want);
                chunk_cap = chunk ? want : 0;
                if (chunk == NULL) {
                    st = sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", name);
                    break;
                }
            }
            for (int64_t r = 0; r < t->n_rows && !s->failed; r += rows_per) {
                int64_t nr = t->n_rows - r < rows_per ? t->n_rows - r : rows_per;
                st = t->fill(t->user, r, nr, chunk, err, err_len);
                if (st != SP_OK) {
                    break;
                }
                put(s, chunk, (size_t)nr * t->row_bytes);
            }
        }
        put_zeros(s, pad_len(t->nbytes, w->alignment));
    }
    sp_free(chunk);
    if (st == SP_OK && s->failed) {
        st = sp_errf(err, err_len, s->f ? SP_ERR_IO : SP_ERR_NOMEM, "%s: write failed: %s", name,
                     s->f ? strerror(errno) : "out of memory");
    }
    return st;
}

sp_status_t
sp_gguf_writer_write_mem(sp_gguf_writer_t *w, void **out, size_t *out_len, char *err,
                         size_t err_len)
{
    sink s = {0};
    *out = NULL;
    *out_len = 0;
    sp_status_t st = w_emit(w, &s, "<memory>", err, err_len);
    if (st != SP_OK) {
        sp_free(s.buf);
        return st;
    }
    *out = s.buf;
    *out_len = s.len;
    return SP_OK;
}

sp_status_t
sp_gguf_writer_write(sp_gguf_writer_t *w, const char *path, char *err, size_t err_len)
{
    size_t plen = strlen(path);
    char *tmp = sp_malloc(plen + 16);
    if (tmp == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        sp_free(tmp);
        return sp_errf(err, err_len, SP_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    }
    /* mkstemp makes the file 0600; give it the usual mode under the umask. */
    mode_t um = umask(0);
    umask(um);
    if (fchmod(fd, 0666 & ~um) != 0) {
        /* not fatal: the file is still usable by its owner */
    }
    sink s = {0};
    s.f = fdopen(fd, "wb");
    if (s.f == NULL) {
        int e = errno;
        close(fd);
        unlink(tmp);
        sp_free(tmp);
        return sp_errf(err, err_len, SP_ERR_IO, "%s: %s", path, strerror(e));
    }
    setvbuf(s.f, NULL, _IOFBF, 1 << 20);
    sp_status_t st = w_emit(w, &s, path, err, err_len);
    if (fflush(s.f) != 0 && st == SP_OK) {
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    if (fclose(s.f) != 0 && st == SP_OK) {
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    }
    if (st == SP_OK && rename(tmp, path) != 0) {
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: rename: %s", path, strerror(errno));
    }
    if (st != SP_OK) {
        unlink(tmp);
    }
    sp_free(tmp);
    return st;
}
