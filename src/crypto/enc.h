/*
 * enc.h - encrypted model files (*.gguf.enc): AES-256-GCM in authenticated
 * chunks, keys, and decryption into locked memory.
 *
 * Why chunks: one GCM tag over a 70 GB file would mean decrypting everything
 * before knowing whether any of it is genuine, and GCM's 64 GiB message limit.
 * Each chunk (1 MiB by default) carries its own tag; its nonce is the file's
 * random prefix and the chunk index, and its associated data binds the header
 * hash, the index and a last-chunk flag, so a flipped byte, a dropped, reordered
 * or duplicated chunk, a cut-off tail and appended bytes all fail with a message
 * naming the file and the chunk. The layout is in docs/security.md ("Encrypted
 * model files"); the byte offsets are the constants below.
 *
 * Keys are 32 bytes, stored as 64 hex characters (or 32 raw bytes) in a file,
 * or as 64 hex characters in an environment variable. Every file gets its own
 * key derived from the master key and a random salt (HKDF-SHA256), so one
 * master key may encrypt any number of files without a nonce ever repeating.
 * The header carries a key id (8 bytes of a SHA-256 of the key) so a wrong key
 * is reported as "wrong key" before anything is decrypted.
 *
 * Decrypted bytes live only in memory: an anonymous private mapping, locked
 * with mlock where RLIMIT_MEMLOCK allows (a warning is logged once otherwise),
 * excluded from core dumps, read-only once filled, and zeroed before it is
 * unmapped. Nothing here writes plaintext to disk except sp_enc_decrypt_to_file,
 * which exists for `sampan decrypt` only.
 *
 * This module depends on core and OpenSSL only. All functions are thread-safe.
 */
#ifndef SP_CRYPTO_ENC_H
#define SP_CRYPTO_ENC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

#define SP_ENC_KEY_BYTES      32
#define SP_ENC_KEY_ID_BYTES   8
#define SP_ENC_TAG_BYTES      16
#define SP_ENC_HEADER_BYTES   80
#define SP_ENC_MAGIC          "SPENC1\0\0" /* 8 bytes */
#define SP_ENC_VERSION        1
#define SP_ENC_CHUNK_DEFAULT  (1u << 20)  /* plaintext bytes per chunk */
#define SP_ENC_CHUNK_MIN      (4u << 10)
#define SP_ENC_CHUNK_MAX      (64u << 20)
#define SP_ENC_ENV_DEFAULT    "SAMPAN_MODEL_KEY" /* --model and `sampan run` */
#define SP_ENC_PATH_MAX       4096
#define SP_ENC_ENV_NAME_MAX   128

typedef struct sp_enc_key {
    uint8_t bytes[SP_ENC_KEY_BYTES];
} sp_enc_key_t;

/*
 * Where a model's key comes from. Read only when the model file turns out to
 * be encrypted, so a key source on a plain model costs nothing. At most one of
 * file and env is set; neither means "no key": loading an encrypted file then
 * fails with "<file> is encrypted: <hint>".
 */
typedef struct sp_enc_key_src {
    char file[SP_ENC_PATH_MAX];      /* "" or a key file path (used as is) */
    char env[SP_ENC_ENV_NAME_MAX + 1]; /* "" or an environment variable name */
    const char *hint;                /* static text: how to give a key; NULL = generic */
} sp_enc_key_src_t;

/* The key source of models given on the command line (`--model`, `sampan run`):
 * the environment variable SAMPAN_MODEL_KEY. */
void sp_enc_key_src_default(sp_enc_key_src_t *src);

/* ---- keys ---------------------------------------------------------------- */

/* A key from text: exactly 32 raw bytes, or 64 hex characters with optional
 * surrounding whitespace (a trailing newline). `what` names the source in err
 * ("keys/m.key", "SAMPAN_MODEL_KEY"). Anything else is SP_ERR_INVALID with the
 * size found; the text is never echoed. */
sp_status_t sp_enc_key_parse(const void *buf, size_t len, const char *what, sp_enc_key_t *out,
                             char *err, size_t err_len);
/* Read a key file (a regular file of at most 4 KiB; symlinks are followed, as
 * Kubernetes secret mounts need). A file readable by group or others is
 * accepted with a logged warning (event=key_file_mode). */
sp_status_t sp_enc_key_read_file(const char *path, sp_enc_key_t *out, char *err, size_t err_len);
/* A key from an environment variable holding 64 hex characters. SP_ERR_NOT_FOUND
 * when the variable is unset or empty. */
sp_status_t sp_enc_key_from_env(const char *name, sp_enc_key_t *out, char *err, size_t err_len);
/* Resolve src (NULL = sp_enc_key_src_default) for the encrypted file `model`:
 * the key file, else the variable, else "<model> is encrypted: <hint>". */
sp_status_t sp_enc_key_load(const sp_enc_key_src_t *src, const char *model, sp_enc_key_t *out,
                            char *err, size_t err_len);
/* A new random key (OpenSSL RAND_bytes). */
sp_status_t sp_enc_key_generate(sp_enc_key_t *out, char *err, size_t err_len);
/* Write a key as 64 hex characters and a newline to a new file of mode 0600,
 * atomically (temp file, fsync, link). An existing file is never replaced:
 * overwriting a key would make every file encrypted with it unreadable. */
sp_status_t sp_enc_key_write_file(const char *path, const sp_enc_key_t *key, char *err,
                                  size_t err_len);
/* The key id stored in headers: the first 8 bytes of
 * SHA-256("sampan-enc key id v1" || key), as 16 hex characters plus NUL. */
void sp_enc_key_id_hex(const sp_enc_key_t *key, char out[2 * SP_ENC_KEY_ID_BYTES + 1]);
/* Zero a key (OPENSSL_cleanse: not optimised away). NULL is a no-op. */
void sp_enc_key_wipe(sp_enc_key_t *key);

/* ---- files --------------------------------------------------------------- */

/* Does the buffer start with the encrypted-file magic? */
bool sp_enc_is_encrypted(const void *buf, size_t len);
/* Does the file start with it? false when it cannot be read (the caller's
 * open then reports why). */
bool sp_enc_file_is_encrypted(const char *path);

/* Encrypt plain[0..len) into a new heap buffer (*out, sp_free) of *out_len bytes.
 * chunk_bytes 0 = SP_ENC_CHUNK_DEFAULT, else in [SP_ENC_CHUNK_MIN, SP_ENC_CHUNK_MAX]. */
sp_status_t sp_enc_encrypt_mem(const void *plain, size_t len, const sp_enc_key_t *key,
                               uint32_t chunk_bytes, void **out, size_t *out_len, char *err,
                               size_t err_len);
/* Encrypt the file in_path to out_path, streamed one chunk at a time. out_path is
 * written atomically (a temp file in its directory, fsync, rename) with mode
 * 0600; on failure it is untouched and the temp file removed. */
sp_status_t sp_enc_encrypt_file(const char *in_path, const char *out_path,
                                const sp_enc_key_t *key, uint32_t chunk_bytes, char *err,
                                size_t err_len);

/* Decrypted bytes in locked memory (see the file comment). */
typedef struct sp_enc_plain sp_enc_plain_t;

/* Check and decrypt buf[0..len) (an encrypted file's bytes; `name` labels
 * errors). On failure *out is NULL, nothing is left allocated, and err is one
 * line naming the file and what failed: "bad header: ...", "wrong key (...)",
 * "header failed authentication", "truncated: expected N chunks, found M",
 * "chunk N failed authentication (tampered or corrupt)", "N bytes of trailing
 * data". */
sp_status_t sp_enc_decrypt_mem(const void *buf, size_t len, const char *name,
                               const sp_enc_key_t *key, sp_enc_plain_t **out, char *err,
                               size_t err_len);
/* The same for a file (mapped read-only while it is decrypted). */
sp_status_t sp_enc_decrypt_file(const char *path, const sp_enc_key_t *key, sp_enc_plain_t **out,
                                char *err, size_t err_len);
/* Decrypt in_path and write the plaintext to out_path (atomically, mode 0600). */
sp_status_t sp_enc_decrypt_to_file(const char *in_path, const char *out_path,
                                   const sp_enc_key_t *key, char *err, size_t err_len);

const void *sp_enc_plain_data(const sp_enc_plain_t *p); /* read-only; valid until free */
size_t sp_enc_plain_size(const sp_enc_plain_t *p);
bool sp_enc_plain_locked(const sp_enc_plain_t *p);      /* mlock succeeded */
/* Zero, unlock and unmap. NULL is a no-op. */
void sp_enc_plain_free(sp_enc_plain_t *p);

#endif /* SP_CRYPTO_ENC_H */
