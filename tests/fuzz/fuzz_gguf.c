/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader (sp_gguf_open_mem).
 *
 * Build with `make fuzz` (or by hand):
 *   mkdir -p build-fuzz
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
 *       -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -pthread \
 *       tests/fuzz/fuzz_gguf.c src/gguf/gguf.c src/kernels/types.c \
 *       src/core/alloc.c src/core/status.c -lm -o build-fuzz/fuzz_gguf
 *   mkdir -p tests/fuzz/corpus-work/gguf
 *   ./build-fuzz/fuzz_gguf -max_total_time=60 -max_len=65536 \
 *       tests/fuzz/corpus-work/gguf tests/fuzz/corpus/gguf
 *
 * The input is copied into an exact-size heap buffer so ASan catches any read
 * past its end. Whatever the reader accepts is then walked through every
 * public getter, touching the first and last byte of every tensor, string and
 * array it hands out.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

static volatile uint8_t sink;

static void
touch(const void *p, size_t n)
{
    if (n > 0) {
        sink ^= ((const uint8_t *)p)[0];
        sink ^= ((const uint8_t *)p)[n - 1];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL) {
        return 0;
    }
    memcpy(buf, data, size);
    char err[256];
    sp_gguf_t *g = NULL;
    if (sp_gguf_open_mem(buf, size, "fuzz", &g, err, sizeof err) == SP_OK) {
        (void)sp_gguf_alignment(g);
        (void)sp_gguf_data_offset(g);
        for (int64_t i = 0; i < sp_gguf_n_kv(g); i++) {
            sp_str_t k = sp_gguf_kv_key(g, i);
            touch(k.ptr, k.len);
            char key[1100];
            if (k.len >= sizeof key) {
                abort(); /* the reader caps keys at 1 KiB */
            }
            memcpy(key, k.ptr, k.len);
            key[k.len] = '\0';
            const void *raw;
            size_t raw_len;
            if (sp_gguf_kv_raw(g, i, &raw, &raw_len) == SP_OK) {
                touch(raw, raw_len);
            }
            int64_t iv;
            double dv;
            bool bv;
            sp_str_t sv;
            sp_gguf_arr_t av;
            (void)sp_gguf_get_int(g, key, &iv, err, sizeof err);
            (void)sp_gguf_get_float(g, key, &dv, err, sizeof err);
            (void)sp_gguf_get_bool(g, key, &bv, err, sizeof err);
            if (sp_gguf_get_str(g, key, &sv, err, sizeof err) == SP_OK) {
                touch(sv.ptr, sv.len);
            }
            if (sp_gguf_get_arr(g, key, &av, err, sizeof err) == SP_OK && av.n > 0) {
                if (av.strs != NULL) {
                    touch(av.strs[0].ptr, av.strs[0].len);
                    touch(av.strs[av.n - 1].ptr, av.strs[av.n - 1].len);
                } else {
                    touch(av.data, (size_t)av.n * sp_gguf_type_size(av.elem_type));
                    (void)sp_gguf_arr_float(&av, av.n - 1);
                    (void)sp_gguf_arr_int(&av, av.n - 1);
                }
            }
        }
        for (int64_t i = 0; i < sp_gguf_n_tensors(g); i++) {
            const sp_gguf_tensor_t *t = sp_gguf_tensor(g, i);
            touch(t->data, t->nbytes);
            char name[SP_GGUF_MAX_NAME];
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = '\0';
            if (strlen(name) == t->name.len && sp_gguf_find_tensor(g, name) != t) {
                abort(); /* lookup must find the tensor it listed */
            }
        }
        sp_gguf_close(g);
    }
    free(buf);
    return 0;
}
