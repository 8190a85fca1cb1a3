/*
 * gguf.h - a validating reader (and a writer) for GGUF v2/v3 model files.
 *
 * The file is untrusted input. sp_gguf_open copies it into anonymous memory
 * (files up to sp_gguf_set_copy_max bytes) or memory-maps it read-only, and checks
 * every count, length, type, shape and offset against the file size and against
 * overflow before anything is allocated or indexed (RELIABILITY.md, GGUF table
 * G1-G18). A bad file gives SP_ERR_FORMAT and an error line naming the file
 * and the field; never a crash and never an allocation sized by the file.
 *
 * Everything returned points into the mapping and is borrowed: valid until
 * sp_gguf_close. Scalars inside arrays may be unaligned: copy them out with
 * memcpy (or the helpers below), never cast.
 */
#ifndef SP_GGUF_GGUF_H
#define SP_GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/str.h"
#include "kernels/kernels.h"
#include "sampan/status.h"

#define SP_GGUF_MAX_DIMS 4
#define SP_GGUF_MAX_STRING (64u << 20)   /* cap on any one string (64 MiB) */
#define SP_GGUF_MAX_NAME 64              /* tensor names are shorter than this */
#define SP_GGUF_MAX_ALIGNMENT (1u << 20) /* general.alignment cap (1 MiB) */
#define SP_GGUF_DEFAULT_ALIGNMENT 32

typedef enum sp_gguf_type {
    SP_GGUF_TYPE_UINT8 = 0,
    SP_GGUF_TYPE_INT8 = 1,
    SP_GGUF_TYPE_UINT16 = 2,
    SP_GGUF_TYPE_INT16 = 3,
    SP_GGUF_TYPE_UINT32 = 4,
    SP_GGUF_TYPE_INT32 = 5,
    SP_GGUF_TYPE_FLOAT32 = 6,
    SP_GGUF_TYPE_BOOL = 7,
    SP_GGUF_TYPE_STRING = 8,
    SP_GGUF_TYPE_ARRAY = 9,
    SP_GGUF_TYPE_UINT64 = 10,
    SP_GGUF_TYPE_INT64 = 11,
    SP_GGUF_TYPE_FLOAT64 = 12,
    SP_GGUF_TYPE_COUNT,
} sp_gguf_type_t;

typedef struct sp_gguf sp_gguf_t;

/* An array value: n elements of elem_type. For fixed-size types `data` points
 * at the packed (possibly unaligned) elements in the file; for strings `strs`
 * holds the n parsed strings. Nested arrays are rejected at open. */
typedef struct sp_gguf_arr {
    sp_gguf_type_t elem_type;
    uint64_t n;
    const void *data;      /* fixed-size elements, or NULL for strings */
    const sp_str_t *strs;  /* strings, or NULL */
} sp_gguf_arr_t;

typedef struct sp_gguf_tensor {
    sp_str_t name;
    int n_dims;
    int64_t ne[SP_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    sp_type_t type;
    uint64_t offset;              /* from the start of the data section */
    size_t nbytes;
    const void *data;             /* inside the mapping */
} sp_gguf_tensor_t;

/* Map and validate a file. On failure *out is NULL and err names the file and field. */
sp_status_t sp_gguf_open(const char *path, sp_gguf_t **out, char *err, size_t err_len);
/* Same over a caller buffer (tests, decrypted files); the buffer must outlive the handle.
 * `name` is used in error messages. */
sp_status_t sp_gguf_open_mem(const void *buf, size_t len, const char *name, sp_gguf_t **out,
                             char *err, size_t err_len);
/* Same, and the handle owns the buffer: release(user) runs at sp_gguf_close, or
 * before this returns when it fails, so the caller never frees it (decrypted
 * models: the plaintext lives exactly as long as the model). release may be NULL. */
typedef void (*sp_gguf_release_fn)(void *user);
sp_status_t sp_gguf_open_mem_owned(const void *buf, size_t len, const char *name,
                                   sp_gguf_release_fn release, void *user, sp_gguf_t **out,
                                   char *err, size_t err_len);
void sp_gguf_close(sp_gguf_t *g); /* NULL is a no-op */
/*
 * A model file may change while it is open. Files up to `bytes` (process-wide;
 * 0, the default, maps every file) are read into anonymous private memory at
 * open, which nothing done to the file can change or take away. Larger files
 * are mapped, and (with sp_gguf_set_guard) a SIGBUS in such a mapping (the
 * file was truncated) is caught: the rest of the mapping reads as zeros from then on, and
 * sp_gguf_weights_changed says so. Set before opening the files it is for.
 */
void sp_gguf_set_copy_max(size_t bytes);
/* The server's default limit (--model-copy-max), which `sampan eval` / `generate` use too: a
 * copy is in memory that can be given huge pages (gguf.c asks for them), where a mapping of
 * the file is the page cache's 4 KiB pages, and decode streams every weight byte each step. */
#define SP_GGUF_COPY_MAX_DEFAULT ((size_t)16 << 30)
size_t sp_gguf_copy_max(void);
/* Guard the mappings opened from now on (the server turns it on; off by default,
 * so a short-lived tool whose file is cut still stops rather than computing on zeros). */
void sp_gguf_set_guard(bool on);
/* The handle holds a private copy of its file (see above). */
bool sp_gguf_is_copy(const sp_gguf_t *g);
/* What the tensors point at may no longer be what was validated at open: a
 * mapped file was cut (the guard above fired) or written (its size or mtime
 * changed). Always false for a copy or a caller buffer. One fstat: cheap
 * enough to ask after every evaluation step. */
bool sp_gguf_weights_changed(const sp_gguf_t *g);
/* The file at the handle's path is not the one opened any more (another
 * inode, size or mtime, or gone), or the weights changed: the model should be
 * reloaded. false for a caller buffer. */
bool sp_gguf_file_changed(const sp_gguf_t *g);
/* Fault the whole mapping in now (model load), instead of page by page on first use. */
void sp_gguf_prefault(const sp_gguf_t *g);

/*
 * Give back the memory of the whole pages inside [p, p + len) of the tensor data (the
 * load-time repack keeps its own copy of those weights). How the range reads afterwards:
 *   SP_GGUF_KEPT      nothing released: a caller's buffer (not ours to drop), or no whole page
 *   SP_GGUF_REFAULTS  a file mapping: the pages leave the process (MADV_DONTNEED) and the page
 *                     cache (POSIX_FADV_DONTNEED); a later read faults the file's bytes back
 *   SP_GGUF_ZEROED    anonymous memory (the file's private copy, a decrypted model): the
 *                     pages are freed and read as zeros until sp_gguf_refill_range rewrites
 *                     them, so the caller must do that before anything reads them again
 * Returns the bytes released (whole pages). Not thread-safe against readers of the range.
 */
typedef enum { SP_GGUF_KEPT, SP_GGUF_REFAULTS, SP_GGUF_ZEROED } sp_gguf_release_t;
size_t sp_gguf_release_range(sp_gguf_t *g, const void *p, size_t len, sp_gguf_release_t *how);
/* Rewrite [p, p + len) of an anonymous tensor data range that sp_gguf_release_range zeroed:
 * the pages are made writable, fill(user) writes the bytes, and they are made read-only
 * (and locked again, for a decrypted model) afterwards. */
sp_status_t sp_gguf_refill_range(sp_gguf_t *g, const void *p, size_t len, void (*fill)(void *user),
                                 void *user, char *err, size_t err_len);

const char *sp_gguf_path(const sp_gguf_t *g);
uint32_t sp_gguf_version(const sp_gguf_t *g);
size_t sp_gguf_file_size(const sp_gguf_t *g);
size_t sp_gguf_alignment(const sp_gguf_t *g);
size_t sp_gguf_data_offset(const sp_gguf_t *g); /* start of tensor data in the file */

/* ---- metadata ---------------------------------------------------------- */
int64_t sp_gguf_n_kv(const sp_gguf_t *g);
int64_t sp_gguf_find_key(const sp_gguf_t *g, const char *key); /* index or -1 */
sp_str_t sp_gguf_kv_key(const sp_gguf_t *g, int64_t i);
sp_gguf_type_t sp_gguf_kv_type(const sp_gguf_t *g, int64_t i);
/* The value bytes of kv i exactly as stored after its type word (for copying and dumping). */
sp_status_t sp_gguf_kv_raw(const sp_gguf_t *g, int64_t i, const void **raw, size_t *raw_len);

/*
 * Typed getters by key. SP_ERR_NOT_FOUND (err untouched) when the key is absent,
 * so optional keys read as `if (st == SP_ERR_NOT_FOUND) use default`.
 * SP_ERR_FORMAT with err naming file and key when the stored type does not fit:
 *   get_int    any integer type whose value fits int64 (not bool, not float)
 *   get_float  FLOAT32 or FLOAT64 (integers are accepted and converted)
 *   get_bool   BOOL
 *   get_str    STRING
 *   get_arr    ARRAY
 */
sp_status_t sp_gguf_get_int(const sp_gguf_t *g, const char *key, int64_t *out, char *err, size_t err_len);
sp_status_t sp_gguf_get_float(const sp_gguf_t *g, const char *key, double *out, char *err, size_t err_len);
sp_status_t sp_gguf_get_bool(const sp_gguf_t *g, const char *key, bool *out, char *err, size_t err_len);
sp_status_t sp_gguf_get_str(const sp_gguf_t *g, const char *key, sp_str_t *out, char *err, size_t err_len);
sp_status_t sp_gguf_get_arr(const sp_gguf_t *g, const char *key, sp_gguf_arr_t *out, char *err, size_t err_len);

/* Element i of a fixed-size numeric array converted to double / int64 (memcpy, no alignment assumed). */
double sp_gguf_arr_float(const sp_gguf_arr_t *a, uint64_t i);
int64_t sp_gguf_arr_int(const sp_gguf_arr_t *a, uint64_t i);
size_t sp_gguf_type_size(sp_gguf_type_t t); /* 0 for STRING, ARRAY and unknown */
const char *sp_gguf_type_name(sp_gguf_type_t t);

/* ---- tensors ----------------------------------------------------------- */
int64_t sp_gguf_n_tensors(const sp_gguf_t *g);
const sp_gguf_tensor_t *sp_gguf_tensor(const sp_gguf_t *g, int64_t i);
const sp_gguf_tensor_t *sp_gguf_find_tensor(const sp_gguf_t *g, const char *name); /* NULL if absent */

/* ---- writer -------------------------------------------------------------
 * Builds a GGUF v3 file: metadata first (copied from a reader or set one by
 * one), then tensor infos, then data, each tensor padded to the alignment.
 * Used by `sampan quantize`, the test generators and corrupt-file tests. */
typedef struct sp_gguf_writer sp_gguf_writer_t;

sp_status_t sp_gguf_writer_create(sp_gguf_writer_t **out);
void sp_gguf_writer_destroy(sp_gguf_writer_t *w);
/* Copy every key/value of g except general.alignment (the writer keeps its own). */
sp_status_t sp_gguf_writer_copy_kv(sp_gguf_writer_t *w, const sp_gguf_t *g);
sp_status_t sp_gguf_writer_set_u32(sp_gguf_writer_t *w, const char *key, uint32_t v);
sp_status_t sp_gguf_writer_set_i32(sp_gguf_writer_t *w, const char *key, int32_t v);
sp_status_t sp_gguf_writer_set_f32(sp_gguf_writer_t *w, const char *key, float v);
sp_status_t sp_gguf_writer_set_bool(sp_gguf_writer_t *w, const char *key, bool v);
sp_status_t sp_gguf_writer_set_str(sp_gguf_writer_t *w, const char *key, const char *v);
/* Add a tensor whose bytes (nbytes = row size * rows) are copied at write time from `data`,
 * which must stay valid until sp_gguf_writer_write returns. */
sp_status_t sp_gguf_writer_add_tensor(sp_gguf_writer_t *w, const char *name, sp_type_t type,
                                      int n_dims, const int64_t *ne, const void *data);
sp_status_t sp_gguf_writer_write(sp_gguf_writer_t *w, const char *path, char *err, size_t err_len);

/* Additions (gguf.c owner): more setters, streamed tensors, in-memory output. */
sp_status_t sp_gguf_writer_set_u64(sp_gguf_writer_t *w, const char *key, uint64_t v);
/* An array of n fixed-size elements (elem_type must not be STRING or ARRAY), copied now. */
sp_status_t sp_gguf_writer_set_arr(sp_gguf_writer_t *w, const char *key, sp_gguf_type_t elem_type,
                                   uint64_t n, const void *data);
sp_status_t sp_gguf_writer_set_arr_str(sp_gguf_writer_t *w, const char *key,
                                       const char *const *strs, uint64_t n);
/* Power of two <= SP_GGUF_MAX_ALIGNMENT; also stored as general.alignment (u32). */
sp_status_t sp_gguf_writer_set_alignment(sp_gguf_writer_t *w, uint32_t alignment);
/* Produce rows [row0, row0 + n_rows) of a tensor (a row = ne[0] elements in its type) into dst.
 * Called at write time, in row order, with chunks of about 16 MiB, so a whole model never has
 * to sit in memory. A non-OK status aborts the write (err is passed through). */
typedef sp_status_t (*sp_gguf_fill_fn)(void *user, int64_t row0, int64_t n_rows, void *dst,
                                       char *err, size_t err_len);
sp_status_t sp_gguf_writer_add_tensor_fill(sp_gguf_writer_t *w, const char *name, sp_type_t type,
                                           int n_dims, const int64_t *ne, sp_gguf_fill_fn fill,
                                           void *user);
/* The whole file into a new buffer (free with sp_free): tests and fuzz seeds. */
sp_status_t sp_gguf_writer_write_mem(sp_gguf_writer_t *w, void **out, size_t *out_len, char *err,
                                     size_t err_len);

#endif /* SP_GGUF_GGUF_H */
