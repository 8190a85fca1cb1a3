/*
 * fuzz_image.c - libFuzzer target for the image decoders and the
 * resize/normalise step of image inputs (src/serving/image.c).
 *
 * Seeds: tests/fuzz/corpus/image (small JPEGs - baseline, progressive, grey -
 * and PNGs - RGB, RGBA, grey, grey+alpha, 1-bit grey, palette with and
 * without tRNS, 16-bit - written by
 * tests/fuzz/image_seeds.py). Input: byte 0 picks the
 * spec (bits 0-1 colour, bit 2 layout, bit 3 resize mode, bits 4-7 the
 * output side 1..16); the rest is the encoded image, copied into an
 * exact-size heap buffer so ASan catches any read past its end.
 *
 * Checks: a failed decode says why and returns no pixels; a decoded image
 * has sides within the bounds and its pixel buffer is fully readable; every
 * float the tensor step writes is finite and, with scale 1/255, mean 0 and
 * std 1, within [0, 1] (bilinear weights are convex). max_pixels is kept to
 * 4 megapixels so a mutated header cannot make a run slow.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "serving/image.h"

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    sp_img_spec_t s = sp_img_spec_default();
    s.color = (sp_img_color_t)(data[0] & 3) == 3 ? SP_IMG_RGB : (sp_img_color_t)(data[0] & 3);
    s.layout = data[0] & 4 ? SP_IMG_NHWC : SP_IMG_NCHW;
    s.resize = data[0] & 8 ? SP_IMG_SHORTER_CROP : SP_IMG_STRETCH;
    s.height = s.width = 1 + (data[0] >> 4);
    s.shorter_side = s.height + 3;
    s.max_pixels = 4 << 20;
    size_t len = size - 1;
    char *buf = malloc(len ? len : 1);
    if (buf == NULL) {
        return 0;
    }
    memcpy(buf, data + 1, len);
    uint8_t *pix = NULL;
    int w = 0, h = 0;
    char err[256] = "";
    sp_status_t st = sp_img_decode(buf, len, &s, &pix, &w, &h, err, sizeof err);
    if (st != SP_OK) {
        if (pix != NULL || err[0] == '\0') {
            fprintf(stderr, "fuzz harness: failed decode (status %d) left pixels or no reason\n", (int)st);
            abort();
        }
        free(buf);
        return 0;
    }
    if (w < 1 || h < 1 || (int64_t)w * h > s.max_pixels) {
        fprintf(stderr, "fuzz harness: decoded %dx%d outside the bounds\n", w, h);
        abort();
    }
    int c = sp_img_channels(&s);
    uint8_t acc = 0;
    for (size_t i = 0; i < (size_t)w * h * c; i++) {
        acc ^= pix[i];
    }
    sink = acc;
    size_t n = (size_t)s.height * s.width * c;
    float *out = malloc(n * sizeof *out);
    if (out != NULL && sp_img_to_tensor(pix, w, h, &s, out) == SP_OK) {
        for (size_t i = 0; i < n; i++) {
            if (!(out[i] >= -1e-6f && out[i] <= 1.0f + 1e-6f)) {
                fprintf(stderr, "fuzz harness: out[%zu] = %g outside [0, 1]\n", i, out[i]);
                abort();
            }
        }
    }
    free(out);
    sp_free(pix);
    free(buf);
    return 0;
}
