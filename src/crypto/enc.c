/*
 * enc.c - encrypted model files: the chunked AES-256-GCM format, keys, and
 * decryption into locked memory (see enc.h and docs/security.md).
 *
 * Header (80 bytes, integers little-endian):
 *
 *   0  magic "SPENC1\0\0"     8
 *   8  format version (1)     u32
 *  12  chunk size             u32  plaintext bytes per chunk, [4 KiB, 64 MiB]
 *  16  plaintext size         u64
 *  24  chunk count            u64  max(1, ceil(size / chunk)): an empty file still has one chunk
 *  32  salt                   16   random per file: file key = HKDF-SHA256(master, salt)
 *  48  nonce prefix           4    random per file
 *  52  flags                  u32  0 (anything else is refused)
 *  56  key id                 8    SHA-256("sampan-enc key id v1" || master)[0..8]
 *  64  header tag             16   GCM tag over bytes 0..64 (no plaintext), chunk index 2^64-1
 *
 * Then chunk i = ciphertext (chunk size bytes, the last one shorter) + 16-byte tag,
 * nonce = prefix || u64 i, associated data = SHA-256(header) || u64 i || u8 last.
 */
#include "crypto/enc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "core/alloc.h"
#include "sampan/log.h"

#define SALT_BYTES    16
#define PREFIX_BYTES  4
#define HASH_BYTES    32
#define AAD_BYTES     (HASH_BYTES + 8 + 1)
#define HEADER_AUTHED 64 /* header bytes covered by the header tag */
#define KEY_FILE_MAX  4096
#define HEADER_INDEX  UINT64_MAX /* the header tag's nonce index: never a chunk's */

static const char key_id_label[] = "sampan-enc key id v1";
static const char file_key_info[] = "sampan-enc file key v1";

/* ---- little-endian fields ------------------------------------------------ */

static void
put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void
put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t
get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void
to_hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static bool
is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ---- keys ---------------------------------------------------------------- */

void
sp_enc_key_src_default(sp_enc_key_src_t *src)
{
    memset(src, 0, sizeof *src);
    snprintf(src->env, sizeof src->env, "%s", SP_ENC_ENV_DEFAULT);
    src->hint = "set " SP_ENC_ENV_DEFAULT " to its key (64 hex characters)";
}

void
sp_enc_key_wipe(sp_enc_key_t *key)
{
    if (key != NULL) OPENSSL_cleanse(key, sizeof *key);
}

sp_status_t
sp_enc_key_parse(const void *buf, size_t len, const char *what, sp_enc_key_t *out, char *err,
                 size_t err_len)
{
    const uint8_t *p = buf;
    if (len == SP_ENC_KEY_BYTES) {
        /* 32 bytes that are all hex digits are a 128-bit hex key typed by a
         * person, not raw key bytes (a random key is all-hex with odds of about
         * 2^-113): refuse it rather than silently use its ASCII codes. */
        bool all_hex = true;
        for (size_t i = 0; i < len && all_hex; i++) all_hex = OPENSSL_hexchar2int(p[i]) >= 0;
        if (!all_hex) {
            memcpy(out->bytes, p, SP_ENC_KEY_BYTES);
            return SP_OK;
        }
    }
    size_t a = 0, b = len;
    while (a < b && is_space(p[a])) a++;
    while (b > a && is_space(p[b - 1])) b--;
    if (b - a != 2 * SP_ENC_KEY_BYTES) {
        /* Neither the size nor any byte of what was found: the text may be
         * another file's (a secret) named by mistake or on purpose. */
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: a key must be 64 hex characters (256 bits) or 32 raw bytes",
                       what);
    }
    /* Every character is checked first: OpenSSL's parser would skip ':'
     * separators, which a key may not have; the error names neither the
     * character nor where it was (the file may be a secret named by mistake).
     * The parser wants a NUL-terminated string, hence the copy. Either case of
     * hex digit is accepted. */
    char hex[2 * SP_ENC_KEY_BYTES + 1];
    for (size_t i = 0; i < 2 * SP_ENC_KEY_BYTES; i++) {
        if (OPENSSL_hexchar2int(p[a + i]) < 0) {
            OPENSSL_cleanse(hex, sizeof hex);
            OPENSSL_cleanse(out, sizeof *out);
            return sp_errf(err, err_len, SP_ERR_INVALID,
                           "%s: a key must be 64 hex characters (256 bits) or 32 raw bytes "
                           "(a non-hex character was found)",
                           what);
        }
        hex[i] = (char)p[a + i];
    }
    hex[2 * SP_ENC_KEY_BYTES] = '\0';
    size_t got = 0;
    int ok = OPENSSL_hexstr2buf_ex(out->bytes, SP_ENC_KEY_BYTES, &got, hex, '\0') == 1 &&
             got == SP_ENC_KEY_BYTES;
    OPENSSL_cleanse(hex, sizeof hex);
    if (!ok) {
        ERR_clear_error(); /* not left on this thread's queue for a later TLS call */
        OPENSSL_cleanse(out, sizeof *out);
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: the key's hex did not parse", what);
    }
    return SP_OK;
}

sp_status_t
sp_enc_key_read_file(const char *path, sp_enc_key_t *out, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return sp_errf(err, err_len, e == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "key file %s: %s",
                       path, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_INVALID, "key file %s: not a regular file", path);
    }
    if (sb.st_size > KEY_FILE_MAX) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "key file %s: a key must be 64 hex characters (256 bits) or 32 raw bytes",
                       path);
    }
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        /* Refusing would break the default Kubernetes secret mount (0644), so warn. */
        SP_LOG_WARN("event=key_file_mode file=%s mode=%04o hint=\"readable by group or others: "
                    "chmod 600 it (Kubernetes: defaultMode 0400 on the secret volume)\"",
                    sp_log_str(path), (unsigned)(sb.st_mode & 07777));
    }
    uint8_t buf[KEY_FILE_MAX];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t n = read(fd, buf + got, sizeof buf - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            OPENSSL_cleanse(buf, got);
            return sp_errf(err, err_len, SP_ERR_IO, "key file %s: %s", path, strerror(e));
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    char what[SP_ENC_PATH_MAX + 16];
    snprintf(what, sizeof what, "key file %s", path);
    sp_status_t st = sp_enc_key_parse(buf, got, what, out, err, err_len);
    OPENSSL_cleanse(buf, sizeof buf);
    return st;
}

sp_status_t
sp_enc_key_from_env(const char *name, sp_enc_key_t *out, char *err, size_t err_len)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0') {
        return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "environment variable %s is not set",
                       name);
    }
    size_t n = strlen(v);
    char what[SP_ENC_ENV_NAME_MAX + 40];
    snprintf(what, sizeof what, "environment variable %s", name);
    /* Raw bytes cannot pass through an environment variable reliably: hex only. */
    if (n == SP_ENC_KEY_BYTES) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: a key must be 64 hex characters (256 bits), found 32", what);
    }
    return sp_enc_key_parse(v, n, what, out, err, err_len);
}

sp_status_t
sp_enc_key_load(const sp_enc_key_src_t *src, const char *model, sp_enc_key_t *out, char *err,
                size_t err_len)
{
    sp_enc_key_src_t def;
    if (src == NULL) {
        sp_enc_key_src_default(&def);
        src = &def;
    }
    char e[SP_ENC_PATH_MAX + 256];
    sp_status_t st;
    if (src->file[0]) {
        st = sp_enc_key_read_file(src->file, out, e, sizeof e);
    } else if (src->env[0]) {
        st = sp_enc_key_from_env(src->env, out, e, sizeof e);
        if (st == SP_ERR_NOT_FOUND && src->hint) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "%s is encrypted: %s", model, src->hint);
        }
    } else {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s is encrypted: %s", model,
                       src->hint ? src->hint : "no key was given");
    }
    if (st != SP_OK) {
        return sp_errf(err, err_len, st == SP_ERR_NOT_FOUND ? SP_ERR_INVALID : st,
                       "%s is encrypted: %s", model, e);
    }
    return SP_OK;
}

sp_status_t
sp_enc_key_generate(sp_enc_key_t *out, char *err, size_t err_len)
{
    if (RAND_bytes(out->bytes, SP_ENC_KEY_BYTES) != 1) {
        return sp_errf(err, err_len, SP_ERR_IO, "RAND_bytes failed: no randomness for a key");
    }
    return SP_OK;
}

static void
key_id(const sp_enc_key_t *key, uint8_t id[SP_ENC_KEY_ID_BYTES])
{
    uint8_t buf[sizeof key_id_label - 1 + SP_ENC_KEY_BYTES], md[SHA256_DIGEST_LENGTH];
    memcpy(buf, key_id_label, sizeof key_id_label - 1);
    memcpy(buf + sizeof key_id_label - 1, key->bytes, SP_ENC_KEY_BYTES);
    SHA256(buf, sizeof buf, md);
    memcpy(id, md, SP_ENC_KEY_ID_BYTES);
    OPENSSL_cleanse(buf, sizeof buf);
}

void
sp_enc_key_id_hex(const sp_enc_key_t *key, char out[2 * SP_ENC_KEY_ID_BYTES + 1])
{
    uint8_t id[SP_ENC_KEY_ID_BYTES];
    key_id(key, id);
    to_hex(id, sizeof id, out);
}

/* ---- atomic output files ------------------------------------------------- */

/* A temp file beside the target, so that rename (or link) is atomic on one
 * file system and a crash leaves either the old state or the whole new file. */
typedef struct afile {
    int fd;
    char tmp[SP_ENC_PATH_MAX + 16];
    const char *path;
} afile_t;

static sp_status_t
afile_open(afile_t *a, const char *path, char *err, size_t err_len)
{
    a->fd = -1;
    a->path = path;
    int n = snprintf(a->tmp, sizeof a->tmp, "%s.tmp.XXXXXX", path);
    if (n < 0 || (size_t)n >= sizeof a->tmp) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: path too long", path);
    }
    a->fd = mkostemp(a->tmp, O_CLOEXEC); /* mode 0600 */
    if (a->fd < 0) {
        a->tmp[0] = '\0'; /* nothing to remove */
        return sp_errf(err, err_len, SP_ERR_IO, "%s: cannot create a temp file: %s", path,
                       strerror(errno));
    }
    (void)fchmod(a->fd, 0600); /* whatever the umask did */
    return SP_OK;
}

static sp_status_t
afile_write(afile_t *a, const void *buf, size_t n, char *err, size_t err_len)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(a->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            return sp_errf(err, err_len, SP_ERR_IO, "%s: write: %s", a->path,
                           w < 0 ? strerror(errno) : "no progress");
        }
        p += w;
        n -= (size_t)w;
    }
    return SP_OK;
}

static void
afile_abort(afile_t *a)
{
    if (a->fd >= 0) {
        close(a->fd);
        a->fd = -1;
    }
    if (a->tmp[0]) {
        unlink(a->tmp);
        a->tmp[0] = '\0';
    }
}

static void
fsync_dir_of(const char *path)
{
    char dir[SP_ENC_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) {
        snprintf(dir, sizeof dir, ".");
    } else if (slash == dir) {
        dir[1] = '\0';
    } else {
        *slash = '\0';
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: the data itself is already synced */
        close(fd);
    }
}

/* no_replace: fail when the target exists (link instead of rename). */
static sp_status_t
afile_commit(afile_t *a, bool no_replace, char *err, size_t err_len)
{
    if (fsync(a->fd) != 0 || close(a->fd) != 0) {
        int e = errno;
        a->fd = -1;
        afile_abort(a);
        return sp_errf(err, err_len, SP_ERR_IO, "%s: fsync: %s", a->path, strerror(e));
    }
    a->fd = -1;
    if (no_replace) {
        if (link(a->tmp, a->path) != 0) {
            int e = errno;
            afile_abort(a);
            return sp_errf(err, err_len, e == EEXIST ? SP_ERR_INVALID : SP_ERR_IO, "%s: %s%s",
                           a->path, strerror(e),
                           e == EEXIST ? " (refusing to overwrite an existing key)" : "");
        }
        unlink(a->tmp);
    } else if (rename(a->tmp, a->path) != 0) {
        int e = errno;
        afile_abort(a);
        return sp_errf(err, err_len, SP_ERR_IO, "%s: rename: %s", a->path, strerror(e));
    }
    a->tmp[0] = '\0';
    fsync_dir_of(a->path);
    return SP_OK;
}

sp_status_t
sp_enc_key_write_file(const char *path, const sp_enc_key_t *key, char *err, size_t err_len)
{
    char text[2 * SP_ENC_KEY_BYTES + 2];
    to_hex(key->bytes, SP_ENC_KEY_BYTES, text);
    text[2 * SP_ENC_KEY_BYTES] = '\n';
    text[2 * SP_ENC_KEY_BYTES + 1] = '\0';
    if (access(path, F_OK) == 0) { /* early, clear answer; link() below is the real check */
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: exists (refusing to overwrite an existing key)", path);
    }
    afile_t a;
    sp_status_t st = afile_open(&a, path, err, err_len);
    if (st == SP_OK) st = afile_write(&a, text, 2 * SP_ENC_KEY_BYTES + 1, err, err_len);
    if (st == SP_OK) {
        st = afile_commit(&a, true, err, err_len);
    } else {
        afile_abort(&a);
    }
    OPENSSL_cleanse(text, sizeof text);
    return st;
}

/* ---- the cipher ---------------------------------------------------------- */

typedef struct cipher {
    EVP_CIPHER_CTX *ctx;
    uint8_t prefix[PREFIX_BYTES];
    uint8_t hhash[HASH_BYTES]; /* SHA-256 of the whole header */
} cipher_t;

/* HKDF-SHA256 (RFC 5869, OpenSSL's EVP_KDF): extract with the salt, expand
 * with the info string (without its NUL) to 32 bytes. A fresh salt per file
 * gives each file its own AES key. tests/data/enc holds a file written before
 * this used EVP_KDF (two HMAC calls then): it must keep decrypting. */
static int
derive_file_key(const sp_enc_key_t *key, const uint8_t *salt, uint8_t out[32])
{
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    EVP_KDF_CTX *kctx = kdf != NULL ? EVP_KDF_CTX_new(kdf) : NULL;
    EVP_KDF_free(kdf); /* the context holds its own reference */
    if (kctx == NULL) {
        return -1;
    }
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key->bytes, SP_ENC_KEY_BYTES),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, SALT_BYTES),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)file_key_info,
                                          sizeof file_key_info - 1),
        OSSL_PARAM_construct_end(),
    };
    int ok = EVP_KDF_derive(kctx, out, 32, params) == 1;
    EVP_KDF_CTX_free(kctx);
    return ok ? 0 : -1;
}

static int
cipher_init(cipher_t *c, const sp_enc_key_t *key, const uint8_t *salt, const uint8_t *prefix,
            bool encrypt)
{
    uint8_t fk[32];
    memset(c, 0, sizeof *c);
    memcpy(c->prefix, prefix, PREFIX_BYTES);
    if (derive_file_key(key, salt, fk) != 0 || (c->ctx = EVP_CIPHER_CTX_new()) == NULL) {
        OPENSSL_cleanse(fk, sizeof fk);
        return -1;
    }
    int ok = encrypt ? EVP_EncryptInit_ex(c->ctx, EVP_aes_256_gcm(), NULL, fk, NULL)
                     : EVP_DecryptInit_ex(c->ctx, EVP_aes_256_gcm(), NULL, fk, NULL);
    OPENSSL_cleanse(fk, sizeof fk);
    return ok == 1 ? 0 : -1;
}

static void
cipher_free(cipher_t *c)
{
    EVP_CIPHER_CTX_free(c->ctx); /* cleanses the key schedule */
    c->ctx = NULL;
}

/* One GCM message: in[0..n) -> out, under nonce prefix || index. Encrypting
 * writes the tag to tag; decrypting checks it (-1 when it does not match). */
static int
cipher_run(cipher_t *c, bool encrypt, uint64_t index, const uint8_t *aad, size_t aad_len,
           const uint8_t *in, size_t n, uint8_t *out, uint8_t *tag)
{
    uint8_t iv[PREFIX_BYTES + 8], fin[SP_ENC_TAG_BYTES]; /* GCM's final step outputs nothing */
    int len = 0;
    memcpy(iv, c->prefix, PREFIX_BYTES);
    put_u64(iv + PREFIX_BYTES, index);
    if (n > (size_t)INT_MAX || aad_len > (size_t)INT_MAX) return -1;
    if (encrypt) {
        if (EVP_EncryptInit_ex(c->ctx, NULL, NULL, NULL, iv) != 1 ||
            EVP_EncryptUpdate(c->ctx, NULL, &len, aad, (int)aad_len) != 1 ||
            (n > 0 && EVP_EncryptUpdate(c->ctx, out, &len, in, (int)n) != 1) ||
            EVP_EncryptFinal_ex(c->ctx, fin, &len) != 1 ||
            EVP_CIPHER_CTX_ctrl(c->ctx, EVP_CTRL_GCM_GET_TAG, SP_ENC_TAG_BYTES, tag) != 1) {
            return -1;
        }
        return 0;
    }
    if (EVP_DecryptInit_ex(c->ctx, NULL, NULL, NULL, iv) != 1 ||
        EVP_DecryptUpdate(c->ctx, NULL, &len, aad, (int)aad_len) != 1 ||
        (n > 0 && EVP_DecryptUpdate(c->ctx, out, &len, in, (int)n) != 1) ||
        EVP_CIPHER_CTX_ctrl(c->ctx, EVP_CTRL_GCM_SET_TAG, SP_ENC_TAG_BYTES, tag) != 1 ||
        EVP_DecryptFinal_ex(c->ctx, fin, &len) != 1) {
        return -1;
    }
    return 0;
}

static void
chunk_aad(const cipher_t *c, uint64_t index, bool last, uint8_t aad[AAD_BYTES])
{
    memcpy(aad, c->hhash, HASH_BYTES);
    put_u64(aad + HASH_BYTES, index);
    aad[HASH_BYTES + 8] = last ? 1 : 0;
}

static uint64_t
chunk_count(uint64_t plain, uint32_t chunk)
{
    return plain == 0 ? 1 : plain / chunk + (plain % chunk != 0);
}

/* The bytes of chunk i (the last one may be short; an empty file's only chunk is 0). */
static size_t
chunk_len(uint64_t plain, uint32_t chunk, uint64_t i)
{
    uint64_t start = i * (uint64_t)chunk;
    uint64_t left = plain - start;
    return (size_t)(left < chunk ? left : chunk);
}

/* Build a new header for `plain` bytes and set up c for encryption. */
static sp_status_t
enc_begin(const sp_enc_key_t *key, uint64_t plain, uint32_t chunk, uint8_t hdr[SP_ENC_HEADER_BYTES],
          cipher_t *c, char *err, size_t err_len)
{
    uint8_t rnd[SALT_BYTES + PREFIX_BYTES];
    if (chunk < SP_ENC_CHUNK_MIN || chunk > SP_ENC_CHUNK_MAX) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "chunk size %u out of range [%u, %u]", chunk,
                       SP_ENC_CHUNK_MIN, SP_ENC_CHUNK_MAX);
    }
    if (RAND_bytes(rnd, sizeof rnd) != 1) {
        return sp_errf(err, err_len, SP_ERR_IO, "RAND_bytes failed: no randomness for the salt");
    }
    memset(hdr, 0, SP_ENC_HEADER_BYTES);
    memcpy(hdr, SP_ENC_MAGIC, 8);
    put_u32(hdr + 8, SP_ENC_VERSION);
    put_u32(hdr + 12, chunk);
    put_u64(hdr + 16, plain);
    put_u64(hdr + 24, chunk_count(plain, chunk));
    memcpy(hdr + 32, rnd, SALT_BYTES);
    memcpy(hdr + 48, rnd + SALT_BYTES, PREFIX_BYTES);
    put_u32(hdr + 52, 0);
    key_id(key, hdr + 56);
    if (cipher_init(c, key, hdr + 32, hdr + 48, true) != 0 ||
        cipher_run(c, true, HEADER_INDEX, hdr, HEADER_AUTHED, NULL, 0, NULL, hdr + 64) != 0) {
        cipher_free(c);
        return sp_errf(err, err_len, SP_ERR_IO, "OpenSSL AES-256-GCM setup failed");
    }
    SHA256(hdr, SP_ENC_HEADER_BYTES, c->hhash);
    return SP_OK;
}

static sp_status_t
check_chunk_arg(uint32_t *chunk, char *err, size_t err_len)
{
    if (*chunk == 0) *chunk = SP_ENC_CHUNK_DEFAULT;
    if (*chunk < SP_ENC_CHUNK_MIN || *chunk > SP_ENC_CHUNK_MAX) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "chunk size %u out of range [%u, %u]",
                       *chunk, SP_ENC_CHUNK_MIN, SP_ENC_CHUNK_MAX);
    }
    return SP_OK;
}

sp_status_t
sp_enc_encrypt_mem(const void *plain, size_t len, const sp_enc_key_t *key, uint32_t chunk_bytes,
                   void **out, size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    *out_len = 0;
    sp_status_t st = check_chunk_arg(&chunk_bytes, err, err_len);
    if (st != SP_OK) return st;
    uint64_t n_chunks = chunk_count(len, chunk_bytes);
    size_t total, tags;
    if (sp_mul_size((size_t)n_chunks, SP_ENC_TAG_BYTES, &tags) != 0 ||
        sp_add_size(len, tags, &total) != 0 ||
        sp_add_size(total, SP_ENC_HEADER_BYTES, &total) != 0) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%zu bytes: too large to encrypt", len);
    }
    uint8_t *buf = sp_malloc(total);
    if (buf == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory for %zu bytes", total);
    }
    cipher_t c;
    if ((st = enc_begin(key, len, chunk_bytes, buf, &c, err, err_len)) != SP_OK) {
        sp_free(buf);
        return st;
    }
    const uint8_t *in = plain;
    uint8_t *o = buf + SP_ENC_HEADER_BYTES;
    for (uint64_t i = 0; i < n_chunks; i++) {
        size_t n = chunk_len(len, chunk_bytes, i);
        uint8_t aad[AAD_BYTES];
        chunk_aad(&c, i, i + 1 == n_chunks, aad);
        if (cipher_run(&c, true, i, aad, sizeof aad, in, n, o, o + n) != 0) {
            cipher_free(&c);
            sp_free(buf);
            return sp_errf(err, err_len, SP_ERR_IO, "AES-256-GCM failed at chunk %llu",
                           (unsigned long long)i);
        }
        if (n > 0) in += n; /* in may be NULL for an empty input */
        o += n + SP_ENC_TAG_BYTES;
    }
    cipher_free(&c);
    *out = buf;
    *out_len = total;
    return SP_OK;
}

/* Open a regular file for reading: *fd and its size, or an error naming it. */
static sp_status_t
open_regular(const char *path, int *fd_out, size_t *size, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return sp_errf(err, err_len, e == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "%s: %s", path,
                       strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: not a regular file", path);
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: file too large", path);
    }
    *fd_out = fd;
    *size = (size_t)sb.st_size;
    return SP_OK;
}

/* Map a whole regular file read-only (*map NULL and *size 0 for an empty one). */
static sp_status_t
map_file(const char *path, const void **map, size_t *size, char *err, size_t err_len)
{
    *map = NULL;
    *size = 0;
    int fd;
    size_t fsize;
    sp_status_t st = open_regular(path, &fd, &fsize, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    if (fsize > 0) {
        void *m = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return sp_errf(err, err_len, SP_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
        (void)madvise(m, fsize, MADV_SEQUENTIAL);
        *map = m;
        *size = fsize;
    }
    close(fd);
    return SP_OK;
}

sp_status_t
sp_enc_encrypt_file(const char *in_path, const char *out_path, const sp_enc_key_t *key,
                    uint32_t chunk_bytes, char *err, size_t err_len)
{
    sp_status_t st = check_chunk_arg(&chunk_bytes, err, err_len);
    if (st != SP_OK) return st;
    const void *map;
    size_t len;
    if ((st = map_file(in_path, &map, &len, err, err_len)) != SP_OK) return st;
    uint8_t *buf = sp_malloc((size_t)chunk_bytes + SP_ENC_TAG_BYTES);
    uint8_t hdr[SP_ENC_HEADER_BYTES];
    cipher_t c = {0};
    afile_t a = {.fd = -1};
    bool began = false;
    if (buf == NULL) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = enc_begin(key, len, chunk_bytes, hdr, &c, err, err_len)) != SP_OK) goto done;
    began = true;
    if ((st = afile_open(&a, out_path, err, err_len)) != SP_OK ||
        (st = afile_write(&a, hdr, sizeof hdr, err, err_len)) != SP_OK) {
        goto done;
    }
    uint64_t n_chunks = chunk_count(len, chunk_bytes);
    const uint8_t *in = map;
    for (uint64_t i = 0; i < n_chunks; i++) {
        size_t n = chunk_len(len, chunk_bytes, i);
        uint8_t aad[AAD_BYTES];
        chunk_aad(&c, i, i + 1 == n_chunks, aad);
        if (cipher_run(&c, true, i, aad, sizeof aad, in, n, buf, buf + n) != 0) {
            st = sp_errf(err, err_len, SP_ERR_IO, "%s: AES-256-GCM failed at chunk %llu", in_path,
                         (unsigned long long)i);
            goto done;
        }
        if ((st = afile_write(&a, buf, n + SP_ENC_TAG_BYTES, err, err_len)) != SP_OK) goto done;
        if (n > 0) in += n; /* in is NULL for an empty input */
    }
    st = afile_commit(&a, false, err, err_len);
done:
    if (st != SP_OK) afile_abort(&a);
    if (began) cipher_free(&c);
    sp_free(buf);
    if (map != NULL) munmap((void *)map, len);
    return st;
}

/* ---- locked plaintext ---------------------------------------------------- */

struct sp_enc_plain {
    uint8_t *map;    /* anonymous private mapping */
    size_t map_len;  /* whole pages */
    size_t size;     /* plaintext bytes */
    bool locked;
};

static atomic_flag mlock_warned = ATOMIC_FLAG_INIT;

static sp_status_t
plain_alloc(size_t size, const char *name, sp_enc_plain_t **out, char *err, size_t err_len)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096, map_len;
    if (sp_add_size(size > 0 ? size : 1, pg - 1, &map_len) != 0) {
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: %zu bytes: too large", name, size);
    }
    map_len -= map_len % pg;
    sp_enc_plain_t *p = sp_calloc(1, sizeof *p);
    if (p == NULL) return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", name);
    void *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        sp_free(p);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: cannot map %zu bytes for the decrypted "
                       "model: %s", name, map_len, strerror(e));
    }
#ifdef MADV_DONTDUMP
    (void)madvise(m, map_len, MADV_DONTDUMP); /* keep the weights out of core dumps */
#endif
    /* Locked before any plaintext is written, so no page of it can reach swap. */
    if (mlock(m, map_len) == 0) {
        p->locked = true;
    } else if (!atomic_flag_test_and_set(&mlock_warned)) {
        int e = errno;
        struct rlimit rl = {0};
        (void)getrlimit(RLIMIT_MEMLOCK, &rl);
        char lim[32];
        if (rl.rlim_cur == RLIM_INFINITY) {
            snprintf(lim, sizeof lim, "unlimited");
        } else {
            snprintf(lim, sizeof lim, "%llu", (unsigned long long)rl.rlim_cur);
        }
        SP_LOG_WARN("event=enc_mlock_failed file=%s bytes=%zu memlock_limit_bytes=%s error=%s "
                    "hint=\"decrypted weights may be swapped out: raise RLIMIT_MEMLOCK (ulimit -l, "
                    "LimitMEMLOCK=, or CAP_IPC_LOCK); warned once per process\"",
                    sp_log_str(name), map_len, lim, sp_log_str(strerror(e)));
    }
    p->map = m;
    p->map_len = map_len;
    p->size = size;
    *out = p;
    return SP_OK;
}

void
sp_enc_plain_free(sp_enc_plain_t *p)
{
    if (p == NULL) return;
    if (p->map != NULL) {
        if (mprotect(p->map, p->map_len, PROT_READ | PROT_WRITE) == 0) {
            OPENSSL_cleanse(p->map, p->size);
        }
        if (p->locked) munlock(p->map, p->map_len);
        munmap(p->map, p->map_len);
    }
    sp_free(p);
}

const void *
sp_enc_plain_data(const sp_enc_plain_t *p)
{
    return p->map;
}

size_t
sp_enc_plain_size(const sp_enc_plain_t *p)
{
    return p->size;
}

bool
sp_enc_plain_locked(const sp_enc_plain_t *p)
{
    return p->locked;
}

/* ---- decryption ---------------------------------------------------------- */

bool
sp_enc_is_encrypted(const void *buf, size_t len)
{
    return len >= 8 && memcmp(buf, SP_ENC_MAGIC, 8) == 0;
}

bool
sp_enc_file_is_encrypted(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    struct stat sb;
    uint8_t m[8];
    bool yes = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && pread(fd, m, sizeof m, 0) == 8 &&
               sp_enc_is_encrypted(m, sizeof m);
    close(fd);
    return yes;
}

/*
 * Chunk decryption, split over threads: every chunk is an independent GCM
 * message, and one core decrypts at about 3 GB/s, below what a page-cached
 * file or NVMe delivers. Each worker has its own cipher context and takes a
 * contiguous range of chunks; the first failure publishes its index so the
 * others stop at it, and the lowest failing index is the one reported, so the
 * message does not depend on thread timing.
 *
 * A file is read with pread into a per-worker buffer rather than mapped: a
 * mapping faults once per page (costly on virtual machines), and a file cut
 * short while it is read would raise SIGBUS in a mapping but is only a short
 * read here.
 */
#define DEC_MAX_THREADS    8
#define DEC_MIN_PER_THREAD 8 /* chunks: below this a thread costs more than it saves */

enum { DEC_OK = 0, DEC_AUTH = -1, DEC_SETUP = -2, DEC_IO = -3, DEC_NOMEM = -4 };

typedef struct dec_src {
    const uint8_t *mem; /* the whole encrypted file, or NULL */
    int fd;             /* else read from here */
} dec_src_t;

typedef struct dec_job {
    const dec_src_t *src;
    const uint8_t *hdr;       /* the authenticated header */
    const sp_enc_key_t *key;
    const uint8_t *hhash;
    uint8_t *dst;             /* plaintext of the whole file */
    uint64_t i0, i1;          /* chunks [i0, i1) */
    _Atomic uint64_t *first_bad; /* lowest failing chunk so far, UINT64_MAX = none */
    int rc;                   /* DEC_* */
    int err_no;               /* DEC_IO: errno, 0 = the file got shorter */
    uint64_t bad;             /* the chunk this job failed at */
} dec_job_t;

/* 0, or -1 with errno (0 for end of file). */
static int
read_at(int fd, uint8_t *buf, size_t n, uint64_t off)
{
    while (n > 0) {
        ssize_t r = pread(fd, buf, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        buf += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static void
dec_fail(dec_job_t *j, int rc, uint64_t i)
{
    uint64_t cur = atomic_load(j->first_bad);
    while (i < cur && !atomic_compare_exchange_weak(j->first_bad, &cur, i)) {
    }
    j->rc = rc;
    j->bad = i;
}

static void *
dec_worker(void *arg)
{
    dec_job_t *j = arg;
    const uint8_t *h = j->hdr;
    uint32_t chunk = get_u32(h + 12);
    uint64_t plain = get_u64(h + 16), n_chunks = get_u64(h + 24);
    uint64_t stride = (uint64_t)chunk + SP_ENC_TAG_BYTES;
    uint8_t *buf = NULL;
    cipher_t c;
    j->rc = DEC_OK;
    if (cipher_init(&c, j->key, h + 32, h + 48, false) != 0) {
        cipher_free(&c);
        dec_fail(j, DEC_SETUP, j->i0);
        return NULL;
    }
    if (j->src->mem == NULL && (buf = sp_malloc((size_t)stride)) == NULL) {
        cipher_free(&c);
        dec_fail(j, DEC_NOMEM, j->i0);
        return NULL;
    }
    memcpy(c.hhash, j->hhash, HASH_BYTES);
    for (uint64_t i = j->i0; i < j->i1; i++) {
        if (i > atomic_load_explicit(j->first_bad, memory_order_relaxed)) break;
        uint64_t off = SP_ENC_HEADER_BYTES + i * stride;
        size_t n = chunk_len(plain, chunk, i);
        const uint8_t *in = j->src->mem ? j->src->mem + off : buf;
        if (buf != NULL && read_at(j->src->fd, buf, n + SP_ENC_TAG_BYTES, off) != 0) {
            j->err_no = errno;
            dec_fail(j, DEC_IO, i);
            break;
        }
        uint8_t aad[AAD_BYTES], tag[SP_ENC_TAG_BYTES];
        chunk_aad(&c, i, i + 1 == n_chunks, aad);
        memcpy(tag, in + n, sizeof tag);
        if (cipher_run(&c, false, i, aad, sizeof aad, in, n, j->dst + i * (uint64_t)chunk, tag) !=
            0) {
            dec_fail(j, DEC_AUTH, i);
            break;
        }
    }
    cipher_free(&c);
    if (buf != NULL) {
        OPENSSL_cleanse(buf, (size_t)stride); /* ciphertext only, but keep the habit cheap */
        sp_free(buf);
    }
    return NULL;
}

/* Decrypt every chunk into dst; DEC_OK or the failure of the lowest failing chunk
 * (*bad, and *err_no for DEC_IO). */
static int
decrypt_chunks(const dec_src_t *src, const uint8_t *hdr, const sp_enc_key_t *key,
               const uint8_t *hhash, uint8_t *dst, uint64_t *bad, int *err_no)
{
    uint64_t n_chunks = get_u64(hdr + 24);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t nt = cpus > 0 ? (uint64_t)cpus : 1;
    if (nt > DEC_MAX_THREADS) nt = DEC_MAX_THREADS;
    if (nt > n_chunks / DEC_MIN_PER_THREAD) nt = n_chunks / DEC_MIN_PER_THREAD;
    if (nt < 1) nt = 1;
    _Atomic uint64_t first_bad = UINT64_MAX;
    dec_job_t jobs[DEC_MAX_THREADS];
    pthread_t tid[DEC_MAX_THREADS];
    bool started[DEC_MAX_THREADS] = {false};
    for (uint64_t t = 0; t < nt; t++) {
        jobs[t] = (dec_job_t){.src = src, .hdr = hdr, .key = key, .hhash = hhash, .dst = dst,
                              .i0 = n_chunks * t / nt, .i1 = n_chunks * (t + 1) / nt,
                              .first_bad = &first_bad};
    }
    /* Job 0 runs here; a thread that cannot start runs here too, afterwards. */
    for (uint64_t t = 1; t < nt; t++) {
        started[t] = pthread_create(&tid[t], NULL, dec_worker, &jobs[t]) == 0;
    }
    dec_worker(&jobs[0]);
    for (uint64_t t = 1; t < nt; t++) {
        if (started[t]) {
            pthread_join(tid[t], NULL);
        } else {
            dec_worker(&jobs[t]);
        }
    }
    /* The job that failed at the lowest chunk decides the message. */
    int rc = DEC_OK;
    for (uint64_t t = 0; t < nt; t++) {
        if (jobs[t].rc != DEC_OK && (rc == DEC_OK || jobs[t].bad < *bad)) {
            rc = jobs[t].rc;
            *bad = jobs[t].bad;
            *err_no = jobs[t].err_no;
        }
    }
    return rc;
}

/*
 * Check a header (hdr: the first min(len, 80) bytes of a file of file_len bytes)
 * and the file's length against it; on success c is ready with the header hash.
 * Everything before the header tag is checked is a sanity bound only.
 */
static sp_status_t
check_header(const uint8_t *h, size_t file_len, const char *name, const sp_enc_key_t *key,
             cipher_t *c, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    if (!sp_enc_is_encrypted(h, file_len < 8 ? file_len : 8)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: bad header: not an encrypted model file (no SPENC1 magic)", name);
    }
    if (file_len < SP_ENC_HEADER_BYTES) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: truncated: %zu bytes, shorter than the %d-byte header", name, file_len,
                       SP_ENC_HEADER_BYTES);
    }
    uint32_t version = get_u32(h + 8), chunk = get_u32(h + 12), flags = get_u32(h + 52);
    uint64_t plain = get_u64(h + 16), n_chunks = get_u64(h + 24);
    if (version != SP_ENC_VERSION) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: bad header: format version %u (this build reads version %d)", name,
                       version, SP_ENC_VERSION);
    }
    if (flags != 0) {
        return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: bad header: unknown flags 0x%x", name,
                       flags);
    }
    if (chunk < SP_ENC_CHUNK_MIN || chunk > SP_ENC_CHUNK_MAX) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: bad header: chunk size %u out of range [%u, %u]", name, chunk,
                       SP_ENC_CHUNK_MIN, SP_ENC_CHUNK_MAX);
    }
    /* plain <= 2^62 keeps every size below from overflowing 64 bits. */
    if (plain > (UINT64_C(1) << 62) || n_chunks != chunk_count(plain, chunk)) {
        return sp_errf(err, err_len, SP_ERR_FORMAT,
                       "%s: bad header: %llu chunks of %u bytes cannot hold %llu bytes", name,
                       (unsigned long long)n_chunks, chunk, (unsigned long long)plain);
    }
    uint8_t id[SP_ENC_KEY_ID_BYTES];
    key_id(key, id);
    if (CRYPTO_memcmp(id, h + 56, sizeof id) != 0) {
        char want[2 * SP_ENC_KEY_ID_BYTES + 1], have[2 * SP_ENC_KEY_ID_BYTES + 1];
        to_hex(h + 56, SP_ENC_KEY_ID_BYTES, want);
        to_hex(id, SP_ENC_KEY_ID_BYTES, have);
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: wrong key (the file was encrypted with key id %s, the key given has "
                       "id %s)",
                       name, want, have);
    }
    sp_status_t st;
    uint8_t tag[SP_ENC_TAG_BYTES];
    memcpy(tag, h + 64, sizeof tag);
    if (cipher_init(c, key, h + 32, h + 48, false) != 0) {
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: OpenSSL AES-256-GCM setup failed", name);
        goto fail;
    }
    if (cipher_run(c, false, HEADER_INDEX, h, HEADER_AUTHED, NULL, 0, NULL, tag) != 0) {
        st = sp_errf(err, err_len, SP_ERR_FORMAT,
                     "%s: bad header: failed authentication (tampered or corrupt)", name);
        goto fail;
    }
    SHA256(h, SP_ENC_HEADER_BYTES, c->hhash);
    /* The header is genuine from here on, so its sizes can be trusted. */
    uint64_t stride = (uint64_t)chunk + SP_ENC_TAG_BYTES;
    uint64_t want = SP_ENC_HEADER_BYTES + plain + n_chunks * SP_ENC_TAG_BYTES;
    if ((uint64_t)file_len < want) {
        uint64_t found = ((uint64_t)file_len - SP_ENC_HEADER_BYTES) / stride;
        st = sp_errf(err, err_len, SP_ERR_FORMAT,
                     "%s: truncated: expected %llu chunks, found %llu whole chunks (%zu of %llu "
                     "bytes)",
                     name, (unsigned long long)n_chunks, (unsigned long long)found, file_len,
                     (unsigned long long)want);
        goto fail;
    }
    if ((uint64_t)file_len > want) {
        st = sp_errf(err, err_len, SP_ERR_FORMAT,
                     "%s: %llu bytes of trailing data after the last chunk (tampered or corrupt)",
                     name, (unsigned long long)((uint64_t)file_len - want));
        goto fail;
    }
    return SP_OK;
fail:
    cipher_free(c);
    return st;
}

/* Header, then chunks from src, into a new locked buffer. */
static sp_status_t
decrypt_src(const dec_src_t *src, const uint8_t *h, size_t file_len, const char *name,
            const sp_enc_key_t *key, sp_enc_plain_t **out, char *err, size_t err_len)
{
    *out = NULL;
    cipher_t c;
    sp_status_t st = check_header(h, file_len, name, key, &c, err, err_len);
    if (st != SP_OK) return st;
    cipher_free(&c); /* the workers have their own; the header hash stays in c */
    uint64_t plain = get_u64(h + 16), n_chunks = get_u64(h + 24), bad = 0;
    int err_no = 0;
    sp_enc_plain_t *p = NULL;
    if ((st = plain_alloc((size_t)plain, name, &p, err, err_len)) != SP_OK) return st;
    switch (decrypt_chunks(src, h, key, c.hhash, p->map, &bad, &err_no)) {
    case DEC_OK:
        /* Weights are never written after load: make a stray write fault. */
        (void)mprotect(p->map, p->map_len, PROT_READ);
        *out = p;
        return SP_OK;
    case DEC_AUTH:
        st = sp_errf(err, err_len, SP_ERR_FORMAT,
                     "%s: chunk %llu of %llu failed authentication (tampered or corrupt)", name,
                     (unsigned long long)bad, (unsigned long long)n_chunks);
        break;
    case DEC_IO:
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: reading chunk %llu: %s", name,
                     (unsigned long long)bad,
                     err_no ? strerror(err_no) : "the file got shorter while it was read");
        break;
    case DEC_NOMEM:
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", name);
        break;
    default:
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: OpenSSL AES-256-GCM setup failed", name);
        break;
    }
    sp_enc_plain_free(p); /* zeroes whatever was decrypted before the failure */
    return st;
}

sp_status_t
sp_enc_decrypt_mem(const void *buf, size_t len, const char *name, const sp_enc_key_t *key,
                   sp_enc_plain_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (name == NULL) name = "<memory>";
    static const uint8_t none[1];
    dec_src_t src = {.mem = len > 0 ? buf : none, .fd = -1};
    return decrypt_src(&src, src.mem, len, name, key, out, err, err_len);
}

sp_status_t
sp_enc_decrypt_file(const char *path, const sp_enc_key_t *key, sp_enc_plain_t **out, char *err,
                    size_t err_len)
{
    *out = NULL;
    int fd;
    size_t len;
    sp_status_t st = open_regular(path, &fd, &len, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint8_t h[SP_ENC_HEADER_BYTES] = {0};
    size_t hn = len < sizeof h ? len : sizeof h;
    if (read_at(fd, h, hn, 0) != 0) {
        int e = errno;
        st = sp_errf(err, err_len, SP_ERR_IO, "%s: %s", path,
                     e ? strerror(e) : "the file got shorter while it was read");
    } else {
        dec_src_t src = {.mem = NULL, .fd = fd};
        st = decrypt_src(&src, h, len, path, key, out, err, err_len);
    }
    close(fd);
    return st;
}

sp_status_t
sp_enc_decrypt_to_file(const char *in_path, const char *out_path, const sp_enc_key_t *key,
                       char *err, size_t err_len)
{
    sp_enc_plain_t *p;
    sp_status_t st = sp_enc_decrypt_file(in_path, key, &p, err, err_len);
    if (st != SP_OK) return st;
    afile_t a;
    st = afile_open(&a, out_path, err, err_len);
    if (st == SP_OK) st = afile_write(&a, p->map, p->size, err, err_len);
    if (st == SP_OK) {
        st = afile_commit(&a, false, err, err_len);
    } else {
        afile_abort(&a);
    }
    sp_enc_plain_free(p);
    return st;
}
