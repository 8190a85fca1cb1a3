/*
 * test_image.c - image inputs (src/serving/image.c): the resize / crop /
 * normalise arithmetic on hand-made pixels with values worked out by hand,
 * and the decoders on images encoded here with libpng and libjpeg (valid,
 * truncated, oversized).
 *
 * Tolerances: the arithmetic runs in float on values <= 255, so a result is
 * within a few float ulps of 255 (1e-4 absolute is generous); JPEG is lossy,
 * so decoded pixels are compared with their source within the codec's error
 * at quality 100 on a smooth image (a few levels).
 */
#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>
#include <png.h>

#include "core/alloc.h"
#include "serving/image.h"
#include "test.h"

#define NEAR(a, b, tol)                                                                  \
    do {                                                                                 \
        double a_ = (a), b_ = (b);                                                       \
        if (!(fabs(a_ - b_) <= (tol))) SP_TEST_FAIL("%s ~ %s: %.9g vs %.9g", #a, #b, a_, b_); \
    } while (0)

static sp_img_spec_t
raw_spec(int h, int w, sp_img_color_t c)
{
    sp_img_spec_t s = sp_img_spec_default();
    s.height = h;
    s.width = w;
    s.color = c;
    s.scale = 1.0f; /* raw 0..255: the arithmetic shows through */
    return s;
}

TEST(image_same_size_is_exact)
{
    uint8_t px[3 * 4 * 5];
    for (int i = 0; i < 60; i++) px[i] = (uint8_t)(i * 4);
    sp_img_spec_t s = raw_spec(4, 5, SP_IMG_RGB);
    float out[60];
    ASSERT_OK(sp_img_to_tensor(px, 5, 4, &s, out));
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 5; x++)
            for (int c = 0; c < 3; c++) NEAR(out[c * 20 + y * 5 + x], px[(y * 5 + x) * 3 + c], 0);
}

TEST(image_halving_averages_pairs)
{
    /* 4x4 grey to 2x2: src = (d + 0.5) * 2 - 0.5 = 0.5, 2.5: the mean of each 2x2 block. */
    uint8_t px[16];
    for (int i = 0; i < 16; i++) px[i] = (uint8_t)(i * i);
    sp_img_spec_t s = raw_spec(2, 2, SP_IMG_GRAY);
    float out[4];
    ASSERT_OK(sp_img_to_tensor(px, 4, 4, &s, out));
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 2; x++) {
            int a = (2 * y) * 4 + 2 * x;
            NEAR(out[y * 2 + x], (px[a] + px[a + 1] + px[a + 4] + px[a + 5]) / 4.0, 1e-4);
        }
}

TEST(image_doubling_clamps_edges)
{
    /* 2 -> 4 columns: src = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (past the last: the edge). */
    uint8_t px[2] = {10, 50};
    sp_img_spec_t s = raw_spec(1, 4, SP_IMG_GRAY);
    float out[4];
    ASSERT_OK(sp_img_to_tensor(px, 2, 1, &s, out));
    NEAR(out[0], 10, 1e-5);
    NEAR(out[1], 20, 1e-5);
    NEAR(out[2], 40, 1e-5);
    NEAR(out[3], 50, 1e-5);
}

TEST(image_shorter_side_then_centre_crop)
{
    /* 40x20 ramp (value = column), shorter side 10: resized 20x10, crop 10x10 at x offset 5;
     * output x samples src (x + 5 + 0.5) * 2 - 0.5 = 2x + 10.5: the mean of 2x+10 and 2x+11. */
    uint8_t px[40 * 20];
    for (int y = 0; y < 20; y++)
        for (int x = 0; x < 40; x++) px[y * 40 + x] = (uint8_t)x;
    sp_img_spec_t s = raw_spec(10, 10, SP_IMG_GRAY);
    s.resize = SP_IMG_SHORTER_CROP;
    s.shorter_side = 10;
    float out[100];
    ASSERT_OK(sp_img_to_tensor(px, 40, 20, &s, out));
    for (int y = 0; y < 10; y++)
        for (int x = 0; x < 10; x++) NEAR(out[y * 10 + x], 2 * x + 10.5, 1e-4);
    /* A margin: shorter side 16 of a 20x20 image, crop 10: resized 16x16, offset 3. */
    uint8_t sq[400];
    for (int i = 0; i < 400; i++) sq[i] = (uint8_t)(i % 20);
    s.shorter_side = 16;
    ASSERT_OK(sp_img_to_tensor(sq, 20, 20, &s, out));
    for (int x = 0; x < 10; x++) {
        double src = (x + 3 + 0.5) * (20.0 / 16.0) - 0.5;
        NEAR(out[x], src, 1e-4); /* a ramp interpolates to its coordinate */
    }
}

TEST(image_normalise_and_layouts)
{
    uint8_t px[2 * 2 * 3];
    for (int i = 0; i < 12; i++) px[i] = (uint8_t)(20 * i + 1);
    sp_img_spec_t s = sp_img_spec_default();
    s.height = s.width = 2;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    memcpy(s.mean, mean, sizeof mean);
    memcpy(s.std, std, sizeof std);
    float nchw[12], nhwc[12];
    ASSERT_OK(sp_img_to_tensor(px, 2, 2, &s, nchw));
    s.layout = SP_IMG_NHWC;
    ASSERT_OK(sp_img_to_tensor(px, 2, 2, &s, nhwc));
    for (int p = 0; p < 4; p++)
        for (int c = 0; c < 3; c++) {
            double want = (px[p * 3 + c] / 255.0 - mean[c]) / std[c];
            NEAR(nchw[c * 4 + p], want, 1e-5);
            NEAR(nhwc[p * 3 + c], want, 1e-5);
        }
}

/* ---- decoders, on images encoded here */

static uint8_t *
make_png(const uint8_t *rgb, int w, int h, int format, size_t *len)
{
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)w;
    im.height = (png_uint_32)h;
    im.format = (png_uint_32)format;
    png_alloc_size_t n = 0;
    ASSERT(png_image_write_to_memory(&im, NULL, &n, 0, rgb, 0, NULL));
    uint8_t *buf = malloc(n);
    ASSERT(png_image_write_to_memory(&im, buf, &n, 0, rgb, 0, NULL));
    *len = n;
    return buf;
}

TEST(image_png_rgb_bgr_gray_alpha)
{
    enum { W = 7, H = 5 };
    uint8_t rgba[W * H * 4], rgb[W * H * 3];
    for (int i = 0; i < W * H; i++) {
        for (int c = 0; c < 3; c++) rgb[i * 3 + c] = rgba[i * 4 + c] = (uint8_t)(i * 7 + c * 50);
        rgba[i * 4 + 3] = (uint8_t)(i * 3); /* alpha: dropped, not composited */
    }
    size_t n;
    uint8_t *png = make_png(rgba, W, H, PNG_FORMAT_RGBA, &n);
    ASSERT(strcmp(sp_img_sniff(png, n), "png") == 0);
    sp_img_spec_t s = sp_img_spec_default();
    uint8_t *pix;
    int w, h;
    char err[256];
    ASSERT_OK(sp_img_decode(png, n, &s, &pix, &w, &h, err, sizeof err));
    ASSERT_EQ(w, W);
    ASSERT_EQ(h, H);
    ASSERT(memcmp(pix, rgb, sizeof rgb) == 0);
    sp_free(pix);
    s.color = SP_IMG_BGR;
    ASSERT_OK(sp_img_decode(png, n, &s, &pix, &w, &h, err, sizeof err));
    for (int i = 0; i < W * H; i++) ASSERT_EQ(pix[i * 3], rgb[i * 3 + 2]);
    sp_free(pix);
    s.color = SP_IMG_GRAY;
    ASSERT_OK(sp_img_decode(png, n, &s, &pix, &w, &h, err, sizeof err));
    for (int i = 0; i < W * H; i++) {
        double y = 0.299 * rgb[i * 3] + 0.587 * rgb[i * 3 + 1] + 0.114 * rgb[i * 3 + 2];
        NEAR(pix[i], y, 0.51);
    }
    sp_free(pix);
    /* Truncated: an error naming PNG, never a partial picture. */
    s.color = SP_IMG_RGB;
    ASSERT(sp_img_decode(png, n - 20, &s, &pix, &w, &h, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "png") != NULL);
    ASSERT(pix == NULL);
    /* Over max_pixels: refused before decoding. */
    s.max_pixels = W * H - 1;
    ASSERT(sp_img_decode(png, n, &s, &pix, &w, &h, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "max_pixels") != NULL);
    free(png);
}

TEST(image_base64_of_an_image)
{
    uint8_t rgb[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    size_t n;
    uint8_t *png = make_png(rgb, 2, 2, PNG_FORMAT_RGB, &n);
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *b64 = malloc(n / 3 * 4 + 8);
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)png[i] << 16 | (i + 1 < n ? png[i + 1] : 0) << 8 | (i + 2 < n ? png[i + 2] : 0);
        b64[k++] = tab[v >> 18 & 63];
        b64[k++] = tab[v >> 12 & 63];
        b64[k++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        b64[k++] = i + 2 < n ? tab[v & 63] : '=';
    }
    sp_img_spec_t s = sp_img_spec_default();
    uint8_t *pix;
    int w, h;
    char err[256];
    ASSERT_OK(sp_img_decode(b64, k, &s, &pix, &w, &h, err, sizeof err));
    ASSERT(memcmp(pix, rgb, sizeof rgb) == 0);
    sp_free(pix);
    b64[5] = '*';
    ASSERT(sp_img_decode(b64, k, &s, &pix, &w, &h, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "not a JPEG or PNG") != NULL);
    free(b64);
    free(png);
}

TEST(image_jpeg_decode_and_truncation)
{
    enum { W = 32, H = 24 };
    uint8_t rgb[W * H * 3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) rgb[(y * W + x) * 3 + c] = (uint8_t)(60 + 3 * x + 2 * y + 20 * c);
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr je;
    ci.err = jpeg_std_error(&je);
    jpeg_create_compress(&ci);
    unsigned char *buf = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&ci, &buf, &n);
    ci.image_width = W;
    ci.image_height = H;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 100, TRUE);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < H) {
        JSAMPROW row = rgb + ci.next_scanline * W * 3;
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    ASSERT(strcmp(sp_img_sniff(buf, n), "jpeg") == 0);
    sp_img_spec_t s = sp_img_spec_default();
    uint8_t *pix;
    int w, h;
    char err[256];
    ASSERT_OK(sp_img_decode(buf, n, &s, &pix, &w, &h, err, sizeof err));
    ASSERT_EQ(w, W);
    ASSERT_EQ(h, H);
    for (int i = 0; i < W * H * 3; i++) NEAR(pix[i], rgb[i], 4); /* chroma subsampling of a ramp */
    sp_free(pix);
    /* Truncated: libjpeg's "premature end" warning is an error here. */
    ASSERT(sp_img_decode(buf, n / 2, &s, &pix, &w, &h, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "jpeg") != NULL);
    ASSERT(pix == NULL);
    /* Only the header: no image. */
    ASSERT(sp_img_decode(buf, 20, &s, &pix, &w, &h, err, sizeof err) == SP_ERR_INVALID);
    s.max_pixels = 100;
    ASSERT(sp_img_decode(buf, n, &s, &pix, &w, &h, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "max_pixels") != NULL);
    s.max_pixels = SP_IMG_DEFAULT_MAX_PIXELS;
    s.max_bytes = n - 1;
    ASSERT(sp_img_decode(buf, n, &s, &pix, &w, &h, err, sizeof err) == SP_ERR_INVALID);
    ASSERT(strstr(err, "max_bytes") != NULL);
    free(buf);
}
