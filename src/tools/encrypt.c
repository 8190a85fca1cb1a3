/*
 * encrypt.c - `sampan encrypt` and `sampan decrypt`: encrypted model files
 * (crypto/enc.h; the format is in docs/security.md).
 *
 *   sampan encrypt IN.gguf OUT.gguf.enc (--key-file K | --key-env VAR) [--chunk-size N]
 *   sampan encrypt --gen-key K
 *   sampan decrypt IN.gguf.enc (OUT.gguf | --check) (--key-file K | --key-env VAR)
 *
 * encrypt checks that IN is a valid GGUF file first (a broken model should fail
 * here, not at load time on a server), and refuses an already encrypted one.
 * OUT is written atomically with mode 0600. --gen-key writes a new random key
 * (64 hex characters) to a new file of mode 0600 and never replaces one.
 * decrypt --check authenticates every chunk without writing anything; decrypt
 * with OUT writes the plaintext to disk, which defeats the purpose of the
 * encryption: it is meant for key rotation (decrypt, then encrypt under the new
 * key) and debugging. Exit 0 ok, 1 a failure, 2 bad usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "crypto/enc.h"
#include "gguf/gguf.h"
#include "tools/tools.h"

static const char encrypt_usage[] =
    "usage: sampan encrypt IN.gguf OUT.gguf.enc (--key-file K | --key-env VAR) [--chunk-size N]\n"
    "       sampan encrypt --gen-key K\n"
    "  encrypts a GGUF model with AES-256-GCM in authenticated chunks (docs/security.md);\n"
    "  `sampan serve` and `sampan run` load OUT transparently given the key\n"
    "  --key-file K     the key: 64 hex characters (or 32 raw bytes) in a file\n"
    "  --key-env VAR    the key: 64 hex characters in an environment variable\n"
    "  --chunk-size N   plaintext bytes per chunk (4K to 64M, default 1M; K and M suffixes)\n"
    "  --gen-key K      write a new random key to the new file K (mode 0600) and exit\n";

static const char decrypt_usage[] =
    "usage: sampan decrypt IN.gguf.enc (OUT.gguf | --check) (--key-file K | --key-env VAR)\n"
    "  --check          authenticate and decrypt every chunk in memory, write nothing\n"
    "  OUT              write the plaintext model (mode 0600): for key rotation and debugging\n";

typedef struct enc_args {
    const char *pos[2];
    int n_pos;
    const char *key_file, *key_env, *gen_key;
    uint32_t chunk;
    bool check;
} enc_args_t;

static int
parse_size(const char *s, uint32_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno != 0) return -1;
    if (*end == 'K' || *end == 'k') {
        v <<= 10;
        end++;
    } else if (*end == 'M' || *end == 'm') {
        v <<= 20;
        end++;
    }
    if (*end != '\0' || v < SP_ENC_CHUNK_MIN || v > SP_ENC_CHUNK_MAX) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* 0 ok, 2 bad usage (message printed). */
static int
parse_args(int argc, char **argv, const char *usage, bool is_encrypt, enc_args_t *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has_val = i + 1 < argc;
        if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
            fputs(usage, stdout);
            exit(0);
        } else if (strcmp(o, "--key-file") == 0 && has_val) {
            a->key_file = argv[++i];
        } else if (strcmp(o, "--key-env") == 0 && has_val) {
            a->key_env = argv[++i];
        } else if (is_encrypt && strcmp(o, "--gen-key") == 0 && has_val) {
            a->gen_key = argv[++i];
        } else if (is_encrypt && strcmp(o, "--chunk-size") == 0 && has_val) {
            if (parse_size(argv[++i], &a->chunk) != 0) {
                fprintf(stderr, "sampan %s: --chunk-size must be %u to %u bytes (K and M "
                        "suffixes), got '%s'\n", argv[0], SP_ENC_CHUNK_MIN, SP_ENC_CHUNK_MAX,
                        argv[i]);
                return 2;
            }
        } else if (!is_encrypt && strcmp(o, "--check") == 0) {
            a->check = true;
        } else if (o[0] == '-' && o[1] != '\0') {
            fprintf(stderr, "sampan %s: unknown option or missing value: %s\n%s", argv[0], o,
                    usage);
            return 2;
        } else if (a->n_pos < 2) {
            a->pos[a->n_pos++] = o;
        } else {
            fprintf(stderr, "sampan %s: too many arguments\n%s", argv[0], usage);
            return 2;
        }
    }
    if (a->gen_key) {
        if (a->n_pos || a->key_file || a->key_env) {
            fprintf(stderr, "sampan encrypt: --gen-key takes only the new key file\n%s", usage);
            return 2;
        }
        return 0;
    }
    int want = a->check ? 1 : 2;
    if (a->n_pos != want || (a->key_file != NULL) == (a->key_env != NULL)) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    return 0;
}

static int
get_key(const enc_args_t *a, const char *cmd, sp_enc_key_t *key)
{
    char err[SP_ENC_PATH_MAX + 256];
    sp_status_t st = a->key_file ? sp_enc_key_read_file(a->key_file, key, err, sizeof err)
                                 : sp_enc_key_from_env(a->key_env, key, err, sizeof err);
    if (st != SP_OK) {
        fprintf(stderr, "sampan %s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

static int
gen_key(const char *path)
{
    char err[SP_ENC_PATH_MAX + 256], id[2 * SP_ENC_KEY_ID_BYTES + 1];
    sp_enc_key_t key;
    sp_status_t st = sp_enc_key_generate(&key, err, sizeof err);
    if (st == SP_OK) st = sp_enc_key_write_file(path, &key, err, sizeof err);
    sp_enc_key_id_hex(&key, id);
    sp_enc_key_wipe(&key);
    if (st != SP_OK) {
        fprintf(stderr, "sampan encrypt: %s\n", err);
        return 1;
    }
    fprintf(stderr, "sampan encrypt: wrote a new key to %s (mode 0600, key id %s)\n", path, id);
    return 0;
}

int
sp_cmd_encrypt(int argc, char **argv)
{
    enc_args_t a;
    int rc = parse_args(argc, argv, encrypt_usage, true, &a);
    if (rc != 0) return rc;
    if (a.gen_key) return gen_key(a.gen_key);
    const char *in = a.pos[0], *out = a.pos[1];
    char err[SP_ENC_PATH_MAX + 512];
    if (sp_enc_file_is_encrypted(in)) {
        fprintf(stderr, "sampan encrypt: %s is already encrypted\n", in);
        return 1;
    }
    /* Validate the model now: its bytes are unreadable once encrypted. */
    sp_gguf_t *g;
    if (sp_gguf_open(in, &g, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan encrypt: %s\n", err);
        return 1;
    }
    size_t size = sp_gguf_file_size(g);
    sp_gguf_close(g);
    sp_enc_key_t key;
    if (get_key(&a, "encrypt", &key) != 0) return 1;
    char id[2 * SP_ENC_KEY_ID_BYTES + 1];
    sp_enc_key_id_hex(&key, id);
    int64_t t0 = sp_time_ns();
    sp_status_t st = sp_enc_encrypt_file(in, out, &key, a.chunk, err, sizeof err);
    sp_enc_key_wipe(&key);
    if (st != SP_OK) {
        fprintf(stderr, "sampan encrypt: %s\n", err);
        return 1;
    }
    double s = (double)(sp_time_ns() - t0) / 1e9;
    fprintf(stderr, "sampan encrypt: %s -> %s: %zu bytes, chunks of %u bytes, key id %s, %.3f s "
            "(%.2f GB/s)\n", in, out, size, a.chunk ? a.chunk : SP_ENC_CHUNK_DEFAULT, id, s,
            s > 0 ? (double)size / s / 1e9 : 0.0);
    return 0;
}

int
sp_cmd_decrypt(int argc, char **argv)
{
    enc_args_t a;
    int rc = parse_args(argc, argv, decrypt_usage, false, &a);
    if (rc != 0) return rc;
    sp_enc_key_t key;
    if (get_key(&a, "decrypt", &key) != 0) return 1;
    char err[SP_ENC_PATH_MAX + 512];
    const char *in = a.pos[0];
    int64_t t0 = sp_time_ns();
    sp_status_t st;
    size_t size = 0;
    if (a.check) {
        sp_enc_plain_t *p;
        st = sp_enc_decrypt_file(in, &key, &p, err, sizeof err);
        if (st == SP_OK) size = sp_enc_plain_size(p);
        sp_enc_plain_free(p);
    } else {
        st = sp_enc_decrypt_to_file(in, a.pos[1], &key, err, sizeof err);
    }
    sp_enc_key_wipe(&key);
    if (st != SP_OK) {
        fprintf(stderr, "sampan decrypt: %s\n", err);
        return 1;
    }
    double s = (double)(sp_time_ns() - t0) / 1e9;
    if (a.check) {
        fprintf(stderr, "sampan decrypt: %s: ok, %zu bytes authenticated and decrypted in %.3f s "
                "(%.2f GB/s)\n", in, size, s, s > 0 ? (double)size / s / 1e9 : 0.0);
    } else {
        fprintf(stderr, "sampan decrypt: %s -> %s (%.3f s)\n", in, a.pos[1], s);
    }
    return 0;
}
