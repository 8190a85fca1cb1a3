/*
 * test_enc.c - encrypted model files (src/crypto/enc.c): round trips of every
 * size around the chunk boundaries, wrong keys, a flipped byte anywhere,
 * truncation at every boundary, appended, swapped and replayed chunks, keys
 * from files and the environment, atomic 0600 output, the model loader on an
 * encrypted demo model, and the config.json key parameters.
 */
#include "test.h"

#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include "core/alloc.h"
#include "crypto/enc.h"
#include "engine/model.h"
#include "serving/repo_config.h"
#include "serving/tenants.h"

#define DEMO  "models/stories260K.gguf"
#define CHUNK SP_ENC_CHUNK_MIN /* small chunks: many of them in little data */
#define STRIDE (CHUNK + SP_ENC_TAG_BYTES)
#define HDR   SP_ENC_HEADER_BYTES

#define ASSERT_HAS(s, sub)                                                      \
    do {                                                                        \
        const char *s_ = (s), *sub_ = (sub);                                    \
        if (strstr(s_, sub_) == NULL) SP_TEST_FAIL("\"%s\" lacks \"%s\"", s_, sub_); \
    } while (0)

static sp_enc_key_t
test_key(uint8_t seed)
{
    sp_enc_key_t k;
    for (int i = 0; i < SP_ENC_KEY_BYTES; i++) k.bytes[i] = (uint8_t)(seed * 31 + i * 7 + 1);
    return k;
}

static uint8_t *
random_bytes(size_t n, uint32_t seed)
{
    uint8_t *p = sp_malloc(n > 0 ? n : 1);
    ASSERT(p != NULL);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
    return p;
}

static uint8_t *
encrypt(const void *plain, size_t len, const sp_enc_key_t *k, uint32_t chunk, size_t *out_len)
{
    char err[256];
    void *out;
    ASSERT_OK(sp_enc_encrypt_mem(plain, len, k, chunk, &out, out_len, err, sizeof err));
    return out;
}

/* Decrypt expecting failure; returns the error line (static). */
static const char *
fails(const void *buf, size_t len, const sp_enc_key_t *k)
{
    static char err[512];
    err[0] = '\0';
    sp_enc_plain_t *p = (sp_enc_plain_t *)1;
    sp_status_t st = sp_enc_decrypt_mem(buf, len, "t.gguf.enc", k, &p, err, sizeof err);
    if (st == SP_OK) SP_TEST_FAIL("decryption of a damaged buffer (%zu bytes) succeeded", len);
    ASSERT(p == NULL);
    ASSERT_HAS(err, "t.gguf.enc: ");
    return err;
}

static void
round_trip(size_t len, uint32_t chunk)
{
    char err[256];
    sp_enc_key_t k = test_key(1);
    uint8_t *plain = random_bytes(len, (uint32_t)len);
    size_t n;
    uint8_t *enc = encrypt(plain, len, &k, chunk, &n);
    uint32_t c = chunk ? chunk : SP_ENC_CHUNK_DEFAULT;
    size_t n_chunks = len == 0 ? 1 : (len + c - 1) / c;
    ASSERT_EQ(n, HDR + len + n_chunks * SP_ENC_TAG_BYTES);
    ASSERT(sp_enc_is_encrypted(enc, n));
    sp_enc_plain_t *p;
    ASSERT_OK(sp_enc_decrypt_mem(enc, n, "t", &k, &p, err, sizeof err));
    ASSERT_EQ(sp_enc_plain_size(p), len);
    ASSERT(len == 0 || memcmp(sp_enc_plain_data(p), plain, len) == 0);
    sp_enc_plain_free(p);
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_round_trip_sizes)
{
    const size_t sizes[] = {0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 17,
                            40 * CHUNK + 5 /* enough chunks for several threads */};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) round_trip(sizes[i], CHUNK);
    round_trip(0, 0); /* the default chunk size */
    round_trip(SP_ENC_CHUNK_DEFAULT + 3, 0);
    round_trip(100000, 65536);
}

TEST(enc_fresh_salt_every_time)
{
    sp_enc_key_t k = test_key(1);
    uint8_t plain[100] = {0};
    size_t n1, n2;
    uint8_t *a = encrypt(plain, sizeof plain, &k, CHUNK, &n1);
    uint8_t *b = encrypt(plain, sizeof plain, &k, CHUNK, &n2);
    ASSERT_EQ(n1, n2);
    ASSERT(memcmp(a + 32, b + 32, 20) != 0);          /* salt and nonce prefix */
    ASSERT(memcmp(a + HDR, b + HDR, 100) != 0);       /* so the ciphertext too */
    ASSERT(memcmp(a + 56, b + 56, 8) == 0);           /* the same key id */
    sp_free(a);
    sp_free(b);
}

TEST(enc_bad_chunk_size_refused)
{
    char err[256];
    sp_enc_key_t k = test_key(1);
    void *out;
    size_t n;
    ASSERT(sp_enc_encrypt_mem("x", 1, &k, 100, &out, &n, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "chunk size 100 out of range");
    ASSERT(sp_enc_encrypt_mem("x", 1, &k, SP_ENC_CHUNK_MAX + 1, &out, &n, err, sizeof err) ==
           SP_ERR_INVALID);
}

TEST(enc_wrong_key)
{
    sp_enc_key_t k = test_key(1), other = test_key(2);
    uint8_t *plain = random_bytes(3 * CHUNK, 5);
    size_t n;
    uint8_t *enc = encrypt(plain, 3 * CHUNK, &k, CHUNK, &n);
    const char *e = fails(enc, n, &other);
    char want[32], have[32];
    sp_enc_key_id_hex(&k, want);
    sp_enc_key_id_hex(&other, have);
    ASSERT_HAS(e, "wrong key");
    ASSERT_HAS(e, want);
    ASSERT_HAS(e, have);
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_flipped_header_byte)
{
    sp_enc_key_t k = test_key(1);
    uint8_t *plain = random_bytes(2 * CHUNK + 9, 6);
    size_t n;
    uint8_t *enc = encrypt(plain, 2 * CHUNK + 9, &k, CHUNK, &n);
    for (size_t i = 0; i < HDR; i++) {
        for (int bit = 0; bit < 8; bit += 7) {
            enc[i] ^= (uint8_t)(1u << bit);
            const char *e = fails(enc, n, &k);
            /* The key id is the one field checked before authentication. */
            ASSERT_HAS(e, i >= 56 && i < 64 ? "wrong key" : "bad header");
            enc[i] ^= (uint8_t)(1u << bit);
        }
    }
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_flipped_chunk_and_tag_bytes)
{
    sp_enc_key_t k = test_key(1);
    size_t len = 3 * CHUNK - 100;
    uint8_t *plain = random_bytes(len, 7);
    size_t n;
    uint8_t *enc = encrypt(plain, len, &k, CHUNK, &n);
    for (int c = 0; c < 3; c++) {
        size_t clen = c < 2 ? CHUNK : CHUNK - 100;
        size_t at[] = {0, clen / 2, clen - 1, clen, clen + 15}; /* ciphertext, then tag */
        for (size_t j = 0; j < sizeof at / sizeof at[0]; j++) {
            size_t off = HDR + (size_t)c * STRIDE + at[j];
            enc[off] ^= 0x40;
            char want[64];
            snprintf(want, sizeof want, "chunk %d of 3 failed authentication (tampered", c);
            ASSERT_HAS(fails(enc, n, &k), want);
            enc[off] ^= 0x40;
        }
    }
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_lowest_bad_chunk_reported_with_threads)
{
    sp_enc_key_t k = test_key(1);
    size_t len = 64 * CHUNK;
    uint8_t *plain = random_bytes(len, 8);
    size_t n;
    uint8_t *enc = encrypt(plain, len, &k, CHUNK, &n);
    enc[HDR + 50 * STRIDE + 3] ^= 1;
    enc[HDR + 9 * STRIDE + 3] ^= 1;
    ASSERT_HAS(fails(enc, n, &k), "chunk 9 of 64 failed authentication");
    enc[HDR + 9 * STRIDE + 3] ^= 1;
    ASSERT_HAS(fails(enc, n, &k), "chunk 50 of 64 failed authentication");
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_truncated_everywhere)
{
    sp_enc_key_t k = test_key(1);
    size_t len = 3 * CHUNK + 10;
    uint8_t *plain = random_bytes(len, 9);
    size_t n;
    uint8_t *enc = encrypt(plain, len, &k, CHUNK, &n);
    /* Inside the header: no magic, or a header too short to read. */
    for (size_t cut = 0; cut < HDR; cut++) {
        const char *e = fails(enc, cut, &k);
        ASSERT_HAS(e, cut < 8 ? "bad header" : "truncated");
    }
    /* At every chunk boundary, inside every chunk and inside every tag. */
    for (size_t c = 0; c < 4; c++) {
        size_t base = HDR + c * STRIDE;
        size_t cuts[] = {base, base + 1, base + CHUNK / 2, base + CHUNK, base + CHUNK + 8};
        for (size_t j = 0; j < sizeof cuts / sizeof cuts[0]; j++) {
            if (cuts[j] >= n) continue;
            const char *e = fails(enc, cuts[j], &k);
            char want[64];
            snprintf(want, sizeof want, "truncated: expected 4 chunks, found %zu whole chunks", c);
            ASSERT_HAS(e, want);
        }
    }
    ASSERT_HAS(fails(enc, n - 1, &k), "found 3 whole chunks");
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_appended_garbage)
{
    sp_enc_key_t k = test_key(1);
    uint8_t *plain = random_bytes(2 * CHUNK, 10);
    size_t n;
    uint8_t *enc = encrypt(plain, 2 * CHUNK, &k, CHUNK, &n);
    uint8_t *big = sp_malloc(n + STRIDE);
    memcpy(big, enc, n);
    memset(big + n, 0xAB, STRIDE);
    ASSERT_HAS(fails(big, n + 1, &k), "1 bytes of trailing data");
    ASSERT_HAS(fails(big, n + 16, &k), "16 bytes of trailing data");
    memcpy(big + n, enc + HDR, STRIDE); /* a genuine chunk appended again */
    ASSERT_HAS(fails(big, n + STRIDE, &k), "trailing data");
    sp_free(big);
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_swapped_dropped_and_foreign_chunks)
{
    sp_enc_key_t k = test_key(1);
    size_t len = 3 * CHUNK;
    uint8_t *plain = random_bytes(len, 11);
    size_t n;
    uint8_t *enc = encrypt(plain, len, &k, CHUNK, &n);
    uint8_t *tmp = sp_malloc(n);
    /* Swap chunks 0 and 1. */
    memcpy(tmp, enc, n);
    memcpy(tmp + HDR, enc + HDR + STRIDE, STRIDE);
    memcpy(tmp + HDR + STRIDE, enc + HDR, STRIDE);
    ASSERT_HAS(fails(tmp, n, &k), "chunk 0 of 3 failed authentication");
    /* Chunk 1 in place of the last chunk (same length): its index and last flag differ. */
    memcpy(tmp, enc, n);
    memcpy(tmp + HDR + 2 * STRIDE, enc + HDR + STRIDE, STRIDE);
    ASSERT_HAS(fails(tmp, n, &k), "chunk 2 of 3 failed authentication");
    /* Chunk 1 dropped: the header's size no longer matches. */
    memcpy(tmp, enc, HDR + STRIDE);
    memcpy(tmp + HDR + STRIDE, enc + HDR + 2 * STRIDE, STRIDE);
    ASSERT_HAS(fails(tmp, HDR + 2 * STRIDE, &k), "truncated: expected 3 chunks, found 2 whole chunks");
    /* The same plaintext encrypted again with the same key: its chunk 1 is not ours. */
    size_t n2;
    uint8_t *enc2 = encrypt(plain, len, &k, CHUNK, &n2);
    memcpy(tmp, enc, n);
    memcpy(tmp + HDR + STRIDE, enc2 + HDR + STRIDE, STRIDE);
    ASSERT_HAS(fails(tmp, n, &k), "chunk 1 of 3 failed authentication");
    /* The other file's header on our chunks. */
    memcpy(tmp, enc2, HDR);
    memcpy(tmp + HDR, enc + HDR, n - HDR);
    ASSERT_HAS(fails(tmp, n, &k), "chunk 0 of 3 failed authentication");
    sp_free(enc2);
    sp_free(tmp);
    sp_free(enc);
    sp_free(plain);
}

TEST(enc_empty_plaintext_still_authenticated)
{
    sp_enc_key_t k = test_key(1);
    size_t n;
    uint8_t *enc = encrypt("", 0, &k, CHUNK, &n);
    ASSERT_EQ(n, HDR + SP_ENC_TAG_BYTES);
    ASSERT_HAS(fails(enc, HDR, &k), "truncated: expected 1 chunks, found 0 whole chunks");
    enc[HDR + 3] ^= 1;
    ASSERT_HAS(fails(enc, n, &k), "chunk 0 of 1 failed authentication");
    sp_free(enc);
}

TEST(enc_not_encrypted)
{
    sp_enc_key_t k = test_key(1);
    const char gguf[] = "GGUF\3\0\0\0 and the rest of a plain model";
    ASSERT(!sp_enc_is_encrypted(gguf, sizeof gguf));
    ASSERT_HAS(fails(gguf, sizeof gguf, &k), "bad header: not an encrypted model file");
}

/* ---- keys */

TEST(enc_key_parse)
{
    char err[256];
    sp_enc_key_t k, want = test_key(3);
    char hex[80];
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", want.bytes[i]);
    ASSERT_OK(sp_enc_key_parse(hex, 64, "k", &k, err, sizeof err));
    ASSERT(memcmp(k.bytes, want.bytes, 32) == 0);
    strcat(hex, "\r\n");
    ASSERT_OK(sp_enc_key_parse(hex, strlen(hex), "k", &k, err, sizeof err));
    ASSERT(memcmp(k.bytes, want.bytes, 32) == 0);
    for (int i = 0; i < 64; i++) hex[i] = (char)(hex[i] >= 'a' ? hex[i] - 32 : hex[i]);
    ASSERT_OK(sp_enc_key_parse(hex, 64, "k", &k, err, sizeof err)); /* upper case */
    ASSERT(memcmp(k.bytes, want.bytes, 32) == 0);
    ASSERT_OK(sp_enc_key_parse(want.bytes, 32, "k", &k, err, sizeof err)); /* raw bytes */
    ASSERT(memcmp(k.bytes, want.bytes, 32) == 0);

    ASSERT(sp_enc_key_parse(hex, 63, "mykey", &k, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "mykey: a key must be 64 hex characters (256 bits) or 32 raw bytes");
    ASSERT(strstr(err, "63") == NULL); /* the size found is never told */
    ASSERT(sp_enc_key_parse(hex, 32, "k", &k, err, sizeof err) == SP_ERR_INVALID); /* 128-bit hex */
    ASSERT(strstr(err, "32 raw") != NULL && strstr(err, "found") == NULL);
    ASSERT(sp_enc_key_parse("", 0, "k", &k, err, sizeof err) == SP_ERR_INVALID);
    hex[10] = 'g';
    ASSERT(sp_enc_key_parse(hex, 64, "k", &k, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "a non-hex character was found");
    ASSERT(strstr(err, "10") == NULL); /* nor where */
    ASSERT(strstr(err, hex) == NULL); /* never echoed */
    /* OpenSSL's hex parser would skip ':' separators: the key's stays strict. */
    hex[10] = 'A';
    hex[11] = ':';
    ASSERT(sp_enc_key_parse(hex, 64, "k", &k, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "a non-hex character was found");
}

/* A file written by an earlier build (HKDF from two HMAC calls then, EVP_KDF
 * now): the key is 00 01 .. 1f, the plaintext 5000 bytes of "sampan test
 * vector " repeated, in 4 KiB chunks. It must decrypt to the same bytes. */
TEST(enc_known_vector_still_decrypts)
{
    char err[512];
    sp_enc_key_t k;
    ASSERT_OK(sp_enc_key_parse("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                               64, "k", &k, err, sizeof err));
    sp_enc_plain_t *pl = NULL;
    ASSERT_OK(sp_enc_decrypt_file("tests/data/enc/v1-chunk4096-5000.spenc", &k, &pl, err,
                                  sizeof err));
    ASSERT_EQ(sp_enc_plain_size(pl), 5000);
    const char *pat = "sampan test vector ";
    const uint8_t *d = sp_enc_plain_data(pl);
    for (size_t i = 0; i < 5000; i++) {
        ASSERT_EQ(d[i], (uint8_t)pat[i % 19]);
    }
    sp_enc_plain_free(pl);
    k.bytes[31] ^= 1; /* and another key is told apart */
    ASSERT(sp_enc_decrypt_file("tests/data/enc/v1-chunk4096-5000.spenc", &k, &pl, err,
                               sizeof err) != SP_OK);
}

/* The API-key helpers of serving/tenants.c that use OpenSSL's encoders: a
 * generated key is "sk-sampan-" and 43 base64url characters (no padding);
 * a key hash parses only as "sha256:" and 64 lowercase hex digits. */
TEST(enc_tenant_key_encodings)
{
    char key[128];
    ASSERT_OK(sp_tenants_key_generate(key, sizeof key));
    ASSERT_EQ(strlen(key), 10 + 43);
    ASSERT(strncmp(key, "sk-sampan-", 10) == 0);
    ASSERT_EQ(strspn(key + 10, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
              43);
    char other[128];
    ASSERT_OK(sp_tenants_key_generate(other, sizeof other));
    ASSERT(strcmp(key, other) != 0);
    ASSERT(sp_tenants_key_generate(key, 53) != SP_OK); /* too small for the key and its NUL */

    uint8_t h[32], back[32];
    char text[72];
    sp_tenants_key_hash(key, strlen(key), h);
    sp_tenants_key_hash_str(h, text);
    ASSERT(sp_tenants_key_hash_parse(text, 71, back));
    ASSERT(memcmp(h, back, 32) == 0);
    char bad[72];
    memcpy(bad, text, sizeof bad);
    bad[20] = bad[20] >= 'a' ? (char)(bad[20] - 32) : 'A'; /* uppercase: refused */
    ASSERT(!sp_tenants_key_hash_parse(bad, 71, back));
    memcpy(bad, text, sizeof bad);
    bad[30] = ':';
    ASSERT(!sp_tenants_key_hash_parse(bad, 71, back));
    ASSERT(!sp_tenants_key_hash_parse(text, 70, back));
    ASSERT(!sp_tenants_key_hash_parse("sha512:00", 9, back));
}

TEST(enc_key_env)
{
    char err[256];
    sp_enc_key_t k;
    unsetenv("SP_TEST_KEY");
    ASSERT(sp_enc_key_from_env("SP_TEST_KEY", &k, err, sizeof err) == SP_ERR_NOT_FOUND);
    ASSERT_HAS(err, "SP_TEST_KEY is not set");
    setenv("SP_TEST_KEY", "abc", 1);
    ASSERT(sp_enc_key_from_env("SP_TEST_KEY", &k, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "environment variable SP_TEST_KEY: a key must be 64 hex characters");
    setenv("SP_TEST_KEY", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", 1);
    ASSERT_OK(sp_enc_key_from_env("SP_TEST_KEY", &k, err, sizeof err));
    for (int i = 0; i < 32; i++) ASSERT_EQ(k.bytes[i], i);
}

static size_t
count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ASSERT(d != NULL);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

TEST(enc_key_file_generate_write_read)
{
    char err[512], path[512];
    const char *dir = sp_test_tmpdir();
    snprintf(path, sizeof path, "%s/model.key", dir);
    sp_enc_key_t k, back;
    ASSERT_OK(sp_enc_key_generate(&k, err, sizeof err));
    ASSERT_OK(sp_enc_key_write_file(path, &k, err, sizeof err));
    struct stat sb;
    ASSERT(stat(path, &sb) == 0);
    ASSERT_EQ(sb.st_mode & 0777, 0600);
    ASSERT_EQ(sb.st_size, 65);
    ASSERT_OK(sp_enc_key_read_file(path, &back, err, sizeof err));
    ASSERT(memcmp(k.bytes, back.bytes, 32) == 0);
    /* Never replaced: that would orphan every file encrypted with it. */
    sp_enc_key_t k2;
    ASSERT_OK(sp_enc_key_generate(&k2, err, sizeof err));
    ASSERT(memcmp(k.bytes, k2.bytes, 32) != 0);
    ASSERT(sp_enc_key_write_file(path, &k2, err, sizeof err) != SP_OK);
    ASSERT_HAS(err, "refusing to overwrite an existing key");
    ASSERT_OK(sp_enc_key_read_file(path, &back, err, sizeof err));
    ASSERT(memcmp(k.bytes, back.bytes, 32) == 0);
    ASSERT_EQ(count_entries(dir), 1); /* no temp file left */
    /* A missing file and a wrong-sized one are named. */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/none.key", dir);
    ASSERT(sp_enc_key_read_file(bad, &back, err, sizeof err) == SP_ERR_NOT_FOUND);
    ASSERT_HAS(err, "none.key");
    FILE *f = fopen(bad, "w");
    fputs("0123", f);
    fclose(f);
    ASSERT(sp_enc_key_read_file(bad, &back, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "none.key: a key must be 64 hex characters");
    ASSERT(sp_enc_key_read_file(dir, &back, err, sizeof err) == SP_ERR_INVALID);
}

/* ---- files and the model loader */

static void
write_key(const char *path, const sp_enc_key_t *k)
{
    char err[512];
    unlink(path);
    ASSERT_OK(sp_enc_key_write_file(path, k, err, sizeof err));
}

TEST(enc_file_round_trip_atomic_0600)
{
    char err[512], in[512], out[512], back[512];
    const char *dir = sp_test_tmpdir();
    snprintf(in, sizeof in, "%s/plain.bin", dir);
    snprintf(out, sizeof out, "%s/plain.bin.enc", dir);
    snprintf(back, sizeof back, "%s/back.bin", dir);
    size_t len = 5 * CHUNK + 77;
    uint8_t *plain = random_bytes(len, 12);
    FILE *f = fopen(in, "wb");
    ASSERT(fwrite(plain, 1, len, f) == len);
    fclose(f);
    sp_enc_key_t k = test_key(4), other = test_key(5);
    ASSERT_OK(sp_enc_encrypt_file(in, out, &k, CHUNK, err, sizeof err));
    struct stat sb;
    ASSERT(stat(out, &sb) == 0);
    ASSERT_EQ(sb.st_mode & 0777, 0600);
    ASSERT_EQ(sb.st_size, HDR + len + 6 * SP_ENC_TAG_BYTES);
    ASSERT(sp_enc_file_is_encrypted(out));
    ASSERT(!sp_enc_file_is_encrypted(in));
    sp_enc_plain_t *p;
    ASSERT_OK(sp_enc_decrypt_file(out, &k, &p, err, sizeof err));
    ASSERT_EQ(sp_enc_plain_size(p), len);
    ASSERT(memcmp(sp_enc_plain_data(p), plain, len) == 0);
    sp_enc_plain_free(p);
    ASSERT_OK(sp_enc_decrypt_to_file(out, back, &k, err, sizeof err));
    ASSERT(stat(back, &sb) == 0 && sb.st_size == (off_t)len && (sb.st_mode & 0777) == 0600);
    /* A failing decryption leaves nothing behind. */
    unlink(back);
    ASSERT(sp_enc_decrypt_to_file(out, back, &other, err, sizeof err) != SP_OK);
    ASSERT_HAS(err, "wrong key");
    ASSERT(access(back, F_OK) != 0);
    /* A failing encryption (missing input) neither creates nor touches the output. */
    char missing[512];
    snprintf(missing, sizeof missing, "%s/missing.bin", dir);
    ASSERT(sp_enc_encrypt_file(missing, out, &k, CHUNK, err, sizeof err) == SP_ERR_NOT_FOUND);
    ASSERT_OK(sp_enc_decrypt_file(out, &k, &p, err, sizeof err)); /* still the old file */
    sp_enc_plain_free(p);
    ASSERT_EQ(count_entries(dir), 2); /* plain.bin, plain.bin.enc: no temp files */
    ASSERT(sp_enc_decrypt_file(missing, &k, &p, err, sizeof err) == SP_ERR_NOT_FOUND);
    ASSERT_HAS(err, "missing.bin");
    sp_free(plain);
}

static void
copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    ASSERT(a != NULL && b != NULL);
    static char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) ASSERT(fwrite(buf, 1, n, b) == n);
    fclose(a);
    fclose(b);
}

/* The demo model, encrypted with small chunks into dir/name; returns its key. */
static sp_enc_key_t
encrypt_demo(const char *path)
{
    char err[512];
    sp_enc_key_t k = test_key(6);
    ASSERT_OK(sp_enc_encrypt_file(DEMO, path, &k, 64 << 10, err, sizeof err));
    return k;
}

static void
logits_of(sp_model_t *m, float *out, int64_t n_vocab)
{
    char err[256];
    sp_ctx_params_t cp = sp_ctx_default_params();
    cp.n_ctx = 32;
    cp.n_threads = 1;
    sp_ctx_t *c;
    ASSERT_OK(sp_ctx_create(m, &cp, &c, err, sizeof err));
    const int32_t toks[] = {1, 403, 407, 261, 378};
    ASSERT_OK(sp_ctx_eval(c, toks, 5, 0));
    memcpy(out, sp_ctx_logits(c), (size_t)n_vocab * sizeof(float));
    sp_ctx_destroy(c);
}

TEST(enc_model_load)
{
    char err[1024], path[512], keyf[512];
    const char *dir = sp_test_tmpdir();
    snprintf(path, sizeof path, "%s/demo.gguf.enc", dir);
    snprintf(keyf, sizeof keyf, "%s/demo.key", dir);
    sp_enc_key_t k = encrypt_demo(path);
    write_key(keyf, &k);

    sp_model_t *plain, *enc;
    ASSERT_OK(sp_model_load(DEMO, &plain, err, sizeof err));
    sp_enc_key_src_t src = {0};
    snprintf(src.file, sizeof src.file, "%s", keyf);
    ASSERT_OK(sp_model_load_ex(path, &src, &enc, err, sizeof err));
    const sp_hparams_t *a = sp_model_hparams(plain), *b = sp_model_hparams(enc);
    ASSERT_EQ(a->n_layer, b->n_layer);
    ASSERT_EQ(a->n_vocab, b->n_vocab);
    ASSERT_EQ(sp_model_weight_bytes(plain), sp_model_weight_bytes(enc));
    float *la = sp_calloc((size_t)a->n_vocab, sizeof(float));
    float *lb = sp_calloc((size_t)a->n_vocab, sizeof(float));
    logits_of(plain, la, a->n_vocab);
    logits_of(enc, lb, a->n_vocab);
    ASSERT(memcmp(la, lb, (size_t)a->n_vocab * sizeof(float)) == 0); /* bit-identical */
    sp_free(la);
    sp_free(lb);
    sp_model_free(enc);
    sp_model_free(plain);

    /* The key from an environment variable, and from SAMPAN_MODEL_KEY by default. */
    char hex[65];
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", k.bytes[i]);
    setenv("SP_TEST_MODEL_KEY", hex, 1);
    sp_enc_key_src_t env = {0};
    snprintf(env.env, sizeof env.env, "SP_TEST_MODEL_KEY");
    ASSERT_OK(sp_model_load_ex(path, &env, &enc, err, sizeof err));
    sp_model_free(enc);
    unsetenv(SP_ENC_ENV_DEFAULT);
    sp_model_t *m = (sp_model_t *)1;
    ASSERT(sp_model_load(path, &m, err, sizeof err) != SP_OK);
    ASSERT(m == NULL);
    ASSERT_HAS(err, "demo.gguf.enc is encrypted: set SAMPAN_MODEL_KEY");
    setenv(SP_ENC_ENV_DEFAULT, hex, 1);
    ASSERT_OK(sp_model_load(path, &enc, err, sizeof err));
    sp_model_free(enc);
    unsetenv(SP_ENC_ENV_DEFAULT);
    /* A plain model ignores any key source. */
    ASSERT_OK(sp_model_load_ex(DEMO, &env, &plain, err, sizeof err));
    sp_model_free(plain);
}

TEST(enc_model_load_failures)
{
    char err[1024], path[512], keyf[512], wrongf[512];
    const char *dir = sp_test_tmpdir();
    snprintf(path, sizeof path, "%s/demo.gguf.enc", dir);
    snprintf(keyf, sizeof keyf, "%s/demo.key", dir);
    snprintf(wrongf, sizeof wrongf, "%s/wrong.key", dir);
    sp_enc_key_t k = encrypt_demo(path), wrong = test_key(9);
    write_key(keyf, &k);
    write_key(wrongf, &wrong);
    sp_enc_key_src_t src = {0}, none = {0};
    sp_model_t *m = (sp_model_t *)1;

    snprintf(src.file, sizeof src.file, "%s", wrongf);
    ASSERT(sp_model_load_ex(path, &src, &m, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(m == NULL);
    ASSERT_HAS(err, "demo.gguf.enc: wrong key");

    none.hint = "set parameters.encryption_key_file";
    ASSERT(sp_model_load_ex(path, &none, &m, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "demo.gguf.enc is encrypted: set parameters.encryption_key_file");

    snprintf(src.file, sizeof src.file, "%s/nokey", dir);
    ASSERT(sp_model_load_ex(path, &src, &m, err, sizeof err) != SP_OK);
    ASSERT_HAS(err, "demo.gguf.enc is encrypted: key file ");
    ASSERT_HAS(err, "nokey: No such file");

    /* Flip one byte of chunk 3, then cut the file. */
    snprintf(src.file, sizeof src.file, "%s", keyf);
    FILE *f = fopen(path, "r+b");
    ASSERT(f != NULL);
    long off = HDR + 3 * ((64 << 10) + SP_ENC_TAG_BYTES) + 100;
    fseek(f, off, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(ch ^ 0x10, f);
    fclose(f);
    ASSERT(sp_model_load_ex(path, &src, &m, err, sizeof err) == SP_ERR_FORMAT);
    ASSERT_HAS(err, "demo.gguf.enc: chunk 3 of 19 failed authentication (tampered or corrupt)");
    ASSERT(truncate(path, off) == 0);
    ASSERT(sp_model_load_ex(path, &src, &m, err, sizeof err) == SP_ERR_FORMAT);
    ASSERT_HAS(err, "demo.gguf.enc: truncated: expected 19 chunks, found 3 whole chunks");

    /* A plain GGUF renamed to .gguf.enc, and a missing .gguf.enc. */
    char fake[512];
    snprintf(fake, sizeof fake, "%s/fake.gguf.enc", dir);
    copy_file(DEMO, fake);
    ASSERT(sp_model_load_ex(fake, &src, &m, err, sizeof err) == SP_ERR_FORMAT);
    ASSERT_HAS(err, "fake.gguf.enc: bad header: not an encrypted model file");
    snprintf(fake, sizeof fake, "%s/missing.gguf.enc", dir);
    ASSERT(sp_model_load_ex(fake, &src, &m, err, sizeof err) == SP_ERR_NOT_FOUND);
    ASSERT_HAS(err, "missing.gguf.enc");
    ASSERT(m == NULL);
}

/* A truncated GGUF inside a genuine encrypted file: the decrypted bytes get the
 * same validation as a mapped file, and the plaintext is released on failure. */
TEST(enc_model_invalid_gguf_inside)
{
    char err[1024], path[512];
    snprintf(path, sizeof path, "%s/cut.gguf.enc", sp_test_tmpdir());
    FILE *f = fopen(DEMO, "rb");
    ASSERT(f != NULL);
    static uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    sp_enc_key_t k = test_key(6);
    void *enc;
    size_t enc_len;
    ASSERT_OK(sp_enc_encrypt_mem(buf, n, &k, 0, &enc, &enc_len, err, sizeof err));
    f = fopen(path, "wb");
    ASSERT(fwrite(enc, 1, enc_len, f) == enc_len);
    fclose(f);
    sp_free(enc);
    char hex[65];
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", k.bytes[i]);
    setenv(SP_ENC_ENV_DEFAULT, hex, 1);
    sp_model_t *m = (sp_model_t *)1;
    ASSERT(sp_model_load(path, &m, err, sizeof err) == SP_ERR_FORMAT);
    ASSERT(m == NULL);
    ASSERT_HAS(err, "cut.gguf.enc");
}

/* ---- config.json */

static sp_status_t
cfg_from(const char *text, sp_repo_config_t *c, char *err, size_t err_len)
{
    json_t *j;
    sp_status_t st = sp_repo_config_parse_text(text, strlen(text), "m/config.json", &j, err,
                                               err_len);
    if (st != SP_OK) return st;
    st = sp_repo_config_from_json(j, "m/config.json", c, err, err_len);
    json_decref(j);
    return st;
}

TEST(enc_config_parameters)
{
    char err[1024];
    sp_repo_config_t c;
    ASSERT_OK(cfg_from("{\"parameters\": {\"encryption_key_env\": {\"string_value\": \"MY_KEY_1\"}}}",
                       &c, err, sizeof err));
    ASSERT_STR_EQ(c.llm.encryption_key_env, "MY_KEY_1");
    ASSERT(c.llm.encryption_key_file == NULL);
    sp_enc_key_src_t src;
    ASSERT_OK(sp_repo_config_llm_keys(&c, NULL, "m", &src, err, sizeof err));
    ASSERT_STR_EQ(src.env, "MY_KEY_1");
    ASSERT_STR_EQ(src.file, "");
    sp_repo_config_free(&c);

    ASSERT_OK(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": "
                       "\"/run/secrets/model.key\"}}}", &c, err, sizeof err));
    ASSERT_OK(sp_repo_config_llm_keys(&c, NULL, "m", &src, err, sizeof err));
    ASSERT_STR_EQ(src.file, "/run/secrets/model.key"); /* absolute: as is, not read yet */
    sp_repo_config_free(&c);

    ASSERT_OK(cfg_from("{}", &c, err, sizeof err));
    ASSERT_OK(sp_repo_config_llm_keys(&c, NULL, "m", &src, err, sizeof err));
    ASSERT(src.file[0] == '\0' && src.env[0] == '\0');
    ASSERT_HAS(src.hint, "parameters.encryption_key_file or parameters.encryption_key_env");
    sp_repo_config_free(&c);

    ASSERT_OK(sp_repo_config_llm_keys(NULL, NULL, "m", &src, err, sizeof err)); /* --model */
    ASSERT_STR_EQ(src.env, "SAMPAN_MODEL_KEY");

    ASSERT(cfg_from("{\"parameters\": {\"encryption_key_env\": {\"string_value\": \"1BAD\"}}}",
                    &c, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "parameters.encryption_key_env.string_value: must be an environment variable");
    sp_repo_config_free(&c);
    ASSERT(cfg_from("{\"parameters\": {\"encryption_key_env\": {\"string_value\": \"A;rm\"}}}",
                    &c, err, sizeof err) == SP_ERR_INVALID);
    sp_repo_config_free(&c);
    ASSERT(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": \"\"}}}", &c,
                    err, sizeof err) == SP_ERR_INVALID);
    sp_repo_config_free(&c);
    ASSERT(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": \"/k\"}, "
                    "\"encryption_key_env\": {\"string_value\": \"K\"}}}", &c, err,
                    sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "set only one of encryption_key_file and encryption_key_env");
    sp_repo_config_free(&c);
}

TEST(enc_config_relative_key_file)
{
    char err[1024], p[600];
    const char *root = sp_test_tmpdir();
    snprintf(p, sizeof p, "%s/m", root);
    ASSERT(mkdir(p, 0700) == 0);
    snprintf(p, sizeof p, "%s/m/keys", root);
    ASSERT(mkdir(p, 0700) == 0);
    snprintf(p, sizeof p, "%s/m/keys/k", root);
    sp_enc_key_t k = test_key(1);
    write_key(p, &k);
    snprintf(p, sizeof p, "%s/outside.key", root);
    write_key(p, &k);

    sp_repo_config_t c;
    sp_enc_key_src_t src;
    ASSERT_OK(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": "
                       "\"keys/k\"}}}", &c, err, sizeof err));
    ASSERT_OK(sp_repo_config_llm_keys(&c, root, "m", &src, err, sizeof err));
    ASSERT_HAS(src.file, "/m/keys/k");
    ASSERT(src.file[0] == '/');
    ASSERT(sp_repo_config_llm_keys(&c, NULL, "m", &src, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "a relative path needs the model repository");
    sp_repo_config_free(&c);

    /* Out of the model directory but inside the repository: allowed. */
    ASSERT_OK(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": "
                       "\"../outside.key\"}}}", &c, err, sizeof err));
    ASSERT_OK(sp_repo_config_llm_keys(&c, root, "m", &src, err, sizeof err));
    sp_repo_config_free(&c);

    /* Out of the repository, by .. or by a symlink: refused, like any repository path. */
    snprintf(p, sizeof p, "%s/m/keys/evil", root);
    ASSERT(symlink("/etc/passwd", p) == 0);
    ASSERT_OK(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": "
                       "\"keys/evil\"}}}", &c, err, sizeof err));
    ASSERT(sp_repo_config_llm_keys(&c, root, "m", &src, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "parameters.encryption_key_file: m/keys/evil: resolves outside the repository");
    sp_repo_config_free(&c);
    ASSERT_OK(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": "
                       "\"../../../../../../../../etc/passwd\"}}}", &c, err, sizeof err));
    ASSERT(sp_repo_config_llm_keys(&c, root, "m", &src, err, sizeof err) == SP_ERR_INVALID);
    ASSERT_HAS(err, "resolves outside the repository");
    sp_repo_config_free(&c);
    ASSERT_OK(cfg_from("{\"parameters\": {\"encryption_key_file\": {\"string_value\": "
                       "\"keys/none\"}}}", &c, err, sizeof err));
    ASSERT(sp_repo_config_llm_keys(&c, root, "m", &src, err, sizeof err) == SP_ERR_NOT_FOUND);
    sp_repo_config_free(&c);
}
