/*
 * image.c - JPEG/PNG decoding and the resize/normalise arithmetic of image
 * inputs (image.h says what each step does and why).
 *
 * Both libraries report errors by longjmp. Each decode owns its jmp_buf (in
 * its error manager, on its own stack frame) and every longjmp lands in the
 * function that called setjmp, before anything of the decoder is used
 * again: no jump crosses into the server. Variables changed between setjmp
 * and a longjmp and read after it are volatile.
 */
#include "serving/image.h"

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "core/alloc.h"

sp_img_spec_t
sp_img_spec_default(void)
{
    sp_img_spec_t s;
    memset(&s, 0, sizeof s);
    s.color = SP_IMG_RGB;
    s.layout = SP_IMG_NCHW;
    s.resize = SP_IMG_STRETCH;
    s.scale = 1.0f / 255.0f;
    s.std[0] = s.std[1] = s.std[2] = 1.0f;
    s.max_pixels = SP_IMG_DEFAULT_MAX_PIXELS;
    s.max_bytes = SP_IMG_DEFAULT_MAX_BYTES;
    return s;
}

int
sp_img_channels(const sp_img_spec_t *s)
{
    return s->color == SP_IMG_GRAY ? 1 : 3;
}

const char *
sp_img_sniff(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    if (len >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) {
        return "jpeg";
    }
    if (len >= 8 && png_sig_cmp((png_const_bytep)p, 0, 8) == 0) {
        return "png";
    }
    return NULL;
}

static int
b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62; /* standard or URL-safe alphabet */
    if (c == '/' || c == '_') return 63;
    return -1;
}

sp_status_t
sp_img_b64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    while (len > 0 && in[len - 1] == '=') {
        len--;
    }
    if (len % 4 == 1) {
        return SP_ERR_INVALID;
    }
    uint8_t *o = sp_malloc(len / 4 * 3 + 3);
    if (o == NULL) {
        return SP_ERR_NOMEM;
    }
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_val((unsigned char)in[i]);
        if (v < 0) {
            sp_free(o);
            return SP_ERR_INVALID;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[n++] = (uint8_t)(acc >> bits);
        }
    }
    *out = o;
    *out_len = n;
    return SP_OK;
}

/* The area bound, before a pixel buffer is allocated. */
static sp_status_t
check_dims(const char *kind, uint64_t w, uint64_t h, const sp_img_spec_t *s, char *err,
           size_t err_len)
{
    if (w == 0 || h == 0) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: empty image (%llux%llu)", kind,
                       (unsigned long long)w, (unsigned long long)h);
    }
    if (w > SP_IMG_MAX_SIDE || h > SP_IMG_MAX_SIDE || (int64_t)(w * h) > s->max_pixels) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: %llux%llu pixels is more than the model allows (max_pixels %lld)",
                       kind, (unsigned long long)w, (unsigned long long)h,
                       (long long)s->max_pixels);
    }
    return SP_OK;
}

/* RGB triples in place to the spec's colour (BGR: swapped; GRAY: BT.601
 * luma, rounded, packed to one byte per pixel at the front). */
static void
convert_color(uint8_t *pix, size_t n, sp_img_color_t c)
{
    if (c == SP_IMG_BGR) {
        for (size_t i = 0; i < n; i++) {
            uint8_t t = pix[3 * i];
            pix[3 * i] = pix[3 * i + 2];
            pix[3 * i + 2] = t;
        }
    } else if (c == SP_IMG_GRAY) {
        /* Fixed point (16 fractional bits) with rounding: exact for grey
         * pixels (the weights sum to 65536). */
        for (size_t i = 0; i < n; i++) {
            uint32_t v = 19595u * pix[3 * i] + 38470u * pix[3 * i + 1] + 7471u * pix[3 * i + 2];
            pix[i] = (uint8_t)((v + 32768u) >> 16);
        }
    }
}

/* ------------------------------------------------------------------ JPEG */

typedef struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jerr_t;

static void
jerr_exit(j_common_ptr ci)
{
    jerr_t *e = (jerr_t *)ci->err;
    ci->err->format_message(ci, e->msg);
    longjmp(e->jb, 1);
}

/* Warnings (level -1) are errors here: a bad Huffman code, a premature end
 * of file or a lost restart marker leave libjpeg filling the rest with grey,
 * and stray bytes between markers are how a damaged file usually shows (a
 * zeroed stretch of tables decodes "fine" into noise); a model would classify
 * the grey or the noise. Only the two notes that say nothing about the data
 * (a newer JFIF version, an Adobe transform flag) pass. Trace messages
 * (level >= 0) are ignored. */
static void
jerr_emit(j_common_ptr ci, int level)
{
    if (level >= 0) {
        return;
    }
    int code = ci->err->msg_code;
    if (code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM) {
        return;
    }
    jerr_exit(ci);
}

/* A progressive JPEG may hold thousands of tiny scans, each a full pass over
 * the coefficients: a few kilobytes that cost minutes. Real files have a
 * dozen. */
#define JPEG_MAX_SCANS 256

static void
jpeg_progress(j_common_ptr ci)
{
    j_decompress_ptr d = (j_decompress_ptr)ci;
    if (d->input_scan_number > JPEG_MAX_SCANS) {
        jerr_t *e = (jerr_t *)ci->err;
        snprintf(e->msg, sizeof e->msg, "more than %d progressive scans", JPEG_MAX_SCANS);
        longjmp(e->jb, 1);
    }
}

static void
jerr_output(j_common_ptr ci)
{
    (void)ci; /* never to stderr */
}

/* EXIF orientation (tag 0x0112 of IFD0 in an APP1 "Exif" marker): 1..8, or
 * 1 when absent or unreadable. Every offset is checked against the marker. */
static int
exif_orientation(j_decompress_ptr ci)
{
    for (jpeg_saved_marker_ptr mk = ci->marker_list; mk != NULL; mk = mk->next) {
        const unsigned char *p = mk->data;
        size_t n = mk->data_length;
        if (mk->marker != JPEG_APP0 + 1 || n < 14 || memcmp(p, "Exif\0\0", 6) != 0) {
            continue;
        }
        p += 6;
        n -= 6;
        bool le = p[0] == 'I' && p[1] == 'I';
        if (!le && !(p[0] == 'M' && p[1] == 'M')) {
            return 1;
        }
#define RD16(q) (le ? (unsigned)(q)[0] | (unsigned)(q)[1] << 8 : (unsigned)(q)[0] << 8 | (unsigned)(q)[1])
#define RD32(q) (le ? (uint32_t)RD16(q) | (uint32_t)RD16((q) + 2) << 16 \
                    : (uint32_t)RD16(q) << 16 | (uint32_t)RD16((q) + 2))
        uint32_t ifd = RD32(p + 4);
        if (ifd > n - 2) {
            return 1;
        }
        unsigned count = RD16(p + ifd);
        for (unsigned e = 0; e < count; e++) {
            size_t at = (size_t)ifd + 2 + (size_t)e * 12;
            if (at + 12 > n) {
                return 1;
            }
            if (RD16(p + at) == 0x0112 && RD16(p + at + 2) == 3) {
                unsigned v = RD16(p + at + 8);
                return v >= 1 && v <= 8 ? (int)v : 1;
            }
        }
#undef RD16
#undef RD32
        return 1;
    }
    return 1;
}

/* The picture as EXIF orientation o says it is to be shown (OpenCV and
 * browsers do the same): a new buffer for o in 2..8 (sides swapped for
 * 5..8), *pix replaced; false when memory ran out. */
static bool
apply_orientation(uint8_t **pix, int *w, int *h, int o)
{
    if (o <= 1) {
        return true;
    }
    const int sw = *w, sh = *h;
    const int dw = o >= 5 ? sh : sw, dh = o >= 5 ? sw : sh;
    uint8_t *src = *pix, *dst = sp_malloc((size_t)sw * sh * 3);
    if (dst == NULL) {
        return false;
    }
    for (int y = 0; y < dh; y++) {
        for (int x = 0; x < dw; x++) {
            int sx, sy;
            switch (o) {
            case 2: sx = sw - 1 - x; sy = y; break;
            case 3: sx = sw - 1 - x; sy = sh - 1 - y; break;
            case 4: sx = x; sy = sh - 1 - y; break;
            case 5: sx = y; sy = x; break;
            case 6: sx = y; sy = sh - 1 - x; break;
            case 7: sx = sw - 1 - y; sy = sh - 1 - x; break;
            default: sx = sw - 1 - y; sy = x; break; /* 8 */
            }
            memcpy(dst + ((size_t)y * dw + x) * 3, src + ((size_t)sy * sw + sx) * 3, 3);
        }
    }
    sp_free(src);
    *pix = dst;
    *w = dw;
    *h = dh;
    return true;
}

static sp_status_t
decode_jpeg(const unsigned char *buf, size_t len, const sp_img_spec_t *s, uint8_t **pix, int *w,
            int *h, char *err, size_t err_len)
{
    struct jpeg_decompress_struct ci;
    jerr_t je;
    uint8_t *volatile out = NULL;
    uint8_t *volatile row4 = NULL; /* a CMYK decode's row, before conversion */
    memset(&ci, 0, sizeof ci);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    je.pub.emit_message = jerr_emit;
    je.pub.output_message = jerr_output;
    je.msg[0] = '\0';
    if (setjmp(je.jb)) {
        jpeg_destroy_decompress(&ci);
        sp_free(row4);
        sp_free(out);
        return sp_errf(err, err_len, SP_ERR_INVALID, "jpeg: %s", je.msg);
    }
    jpeg_create_decompress(&ci);
    struct jpeg_progress_mgr prog = {.progress_monitor = jpeg_progress};
    ci.progress = &prog;
    jpeg_mem_src(&ci, buf, (unsigned long)len);
    jpeg_save_markers(&ci, JPEG_APP0 + 1, 0xFFFF); /* EXIF, for the orientation */
    jpeg_read_header(&ci, TRUE);
    const int orient = exif_orientation(&ci); /* the markers live until finish_decompress */
    sp_status_t st = check_dims("jpeg", ci.image_width, ci.image_height, s, err, err_len);
    const bool cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
    if (st == SP_OK && !cmyk && ci.jpeg_color_space != JCS_GRAYSCALE &&
        ci.jpeg_color_space != JCS_YCbCr && ci.jpeg_color_space != JCS_RGB) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "jpeg: colour space %d is not supported",
                     (int)ci.jpeg_color_space);
    }
    if (st != SP_OK) {
        jpeg_destroy_decompress(&ci);
        return st;
    }
    /* CMYK and YCCK come out as CMYK (libjpeg undoes YCCK's transform); Adobe's files (an
     * APP14 marker: Photoshop's and libjpeg's own CMYK output) store the inks inverted. */
    const bool inverted = cmyk && ci.saw_Adobe_marker;
    ci.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    ci.dct_method = JDCT_ISLOW; /* libjpeg's default and OpenCV's: the exact IDCT */
    jpeg_start_decompress(&ci);
    size_t stride = (size_t)ci.output_width * 3;
    out = sp_malloc(stride * ci.output_height);
    row4 = cmyk ? sp_malloc((size_t)ci.output_width * 4) : NULL;
    if (out == NULL || (cmyk && row4 == NULL)) {
        sp_free(row4);
        row4 = NULL;
        jpeg_destroy_decompress(&ci);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory decoding a %ux%u jpeg",
                       ci.output_width, ci.output_height);
    }
    while (ci.output_scanline < ci.output_height) {
        uint8_t *dst = out + stride * ci.output_scanline;
        JSAMPROW row = cmyk ? row4 : dst;
        if (jpeg_read_scanlines(&ci, &row, 1) != 1 || !cmyk) {
            continue;
        }
        /* R = C'K'/255 with C' = 255 - C (the ink's complement), rounded: no colour profile,
         * as OpenCV and browsers without one. */
        for (size_t x = 0; x < ci.output_width; x++) {
            const uint8_t *q = row4 + 4 * x;
            unsigned k = inverted ? q[3] : 255u - q[3];
            for (int c = 0; c < 3; c++) {
                unsigned v = inverted ? q[c] : 255u - q[c];
                dst[3 * x + c] = (uint8_t)((v * k + 127u) / 255u);
            }
        }
    }
    sp_free(row4);
    row4 = NULL;
    jpeg_finish_decompress(&ci);
    *w = (int)ci.output_width;
    *h = (int)ci.output_height;
    jpeg_destroy_decompress(&ci);
    *pix = out;
    if (!apply_orientation(pix, w, h, orient)) {
        sp_free(*pix);
        *pix = NULL;
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory rotating a jpeg");
    }
    return SP_OK;
}

/* ------------------------------------------------------------------ PNG */

typedef struct pread {
    const unsigned char *p;
    size_t len, off;
    jmp_buf jb;
    char msg[200];
} pread_t;

static void
png_err(png_structp png, png_const_charp msg)
{
    pread_t *r = png_get_error_ptr(png);
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    longjmp(r->jb, 1);
}

static void
png_warn(png_structp png, png_const_charp msg)
{
    (void)png, (void)msg; /* ancillary problems (a bad text chunk): the pixels are fine */
}

static void
png_read_mem(png_structp png, png_bytep data, size_t n)
{
    pread_t *r = png_get_io_ptr(png);
    if (n > r->len - r->off) {
        png_error(png, "truncated file");
    }
    memcpy(data, r->p + r->off, n);
    r->off += n;
}

static sp_status_t
decode_png(const unsigned char *buf, size_t len, const sp_img_spec_t *s, uint8_t **pix, int *w,
           int *h, char *err, size_t err_len)
{
    pread_t rd = {.p = buf, .len = len};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &rd, png_err, png_warn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (info == NULL) {
        png_destroy_read_struct(&png, NULL, NULL);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    uint8_t *volatile out = NULL;
    png_bytep *volatile rows = NULL;
    volatile sp_status_t st = SP_OK;
    if (setjmp(rd.jb)) {
        png_destroy_read_struct(&png, &info, NULL);
        sp_free(out);
        sp_free(rows);
        return st != SP_OK ? st : sp_errf(err, err_len, SP_ERR_INVALID, "png: %s", rd.msg);
    }
    png_set_read_fn(png, &rd, png_read_mem);
    png_set_user_limits(png, SP_IMG_MAX_SIDE, SP_IMG_MAX_SIDE);
    png_set_chunk_malloc_max(png, (png_alloc_size_t)8 << 20); /* one ancillary chunk */
    png_read_info(png, info);
    png_uint_32 pw = png_get_image_width(png, info), ph = png_get_image_height(png, info);
    int depth = png_get_bit_depth(png, info), ctype = png_get_color_type(png, info);
    if (check_dims("png", pw, ph, s, err, err_len) != SP_OK) {
        st = SP_ERR_INVALID;
        longjmp(rd.jb, 1);
    }
    /* To 8-bit RGB: palette and low-bit grey expanded, 16 bits scaled with
     * rounding, alpha (and tRNS) dropped, grey replicated. */
    if (ctype == PNG_COLOR_TYPE_PALETTE) {
        png_set_palette_to_rgb(png);
    }
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) {
        png_set_expand_gray_1_2_4_to_8(png);
    }
    if (depth == 16) {
        png_set_scale_16(png);
    }
    if ((ctype & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) {
        png_set_strip_alpha(png);
    }
    if (!(ctype & PNG_COLOR_MASK_COLOR)) {
        png_set_gray_to_rgb(png);
    }
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    /* 3 channels, or 4 where libpng's expansion made an alpha channel of a
     * tRNS chunk after the strip was decided: dropped below. */
    size_t stride = png_get_rowbytes(png, info);
    int chans = png_get_channels(png, info);
    if ((chans != 3 && chans != 4) || stride != (size_t)pw * (size_t)chans) {
        png_error(png, "unexpected row layout after conversion");
    }
    out = sp_malloc(stride * ph);
    rows = sp_malloc(sizeof(png_bytep) * ph);
    if (out == NULL || rows == NULL) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory decoding a %ux%u png", pw, ph);
        longjmp(rd.jb, 1);
    }
    for (png_uint_32 y = 0; y < ph; y++) {
        rows[y] = out + stride * y;
    }
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    sp_free(rows);
    if (chans == 4) {
        for (size_t i = 0; i < (size_t)pw * ph; i++) {
            memmove(out + 3 * i, out + 4 * i, 3);
        }
    }
    *pix = out;
    *w = (int)pw;
    *h = (int)ph;
    return SP_OK;
}

sp_status_t
sp_img_decode(const void *buf, size_t len, const sp_img_spec_t *s, uint8_t **pix, int *w, int *h,
              char *err, size_t err_len)
{
    *pix = NULL;
    *w = *h = 0;
    if (len > s->max_bytes) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%zu bytes is more than the model allows for an image (max_bytes %zu)", len,
                       s->max_bytes);
    }
    const char *kind = sp_img_sniff(buf, len);
    sp_status_t st;
    if (kind == NULL) {
        /* JSON tensors carry bytes as strings: base64 of an image (a raw JPEG
         * or PNG cannot be a JSON string, its first byte is not UTF-8). */
        uint8_t *raw;
        size_t n;
        if (len > 0 && sp_img_b64_decode(buf, len, &raw, &n) == SP_OK) {
            if (sp_img_sniff(raw, n) != NULL) {
                st = sp_img_decode(raw, n, s, pix, w, h, err, err_len);
                sp_free(raw);
                return st;
            }
            sp_free(raw);
        }
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "not a JPEG or PNG image, nor base64 of one (%zu bytes)", len);
    } else if (kind[0] == 'j') {
        st = decode_jpeg(buf, len, s, pix, w, h, err, err_len);
    } else {
        st = decode_png(buf, len, s, pix, w, h, err, err_len);
    }
    if (st == SP_OK) {
        convert_color(*pix, (size_t)*w * (size_t)*h, s->color);
    }
    return st;
}

/* ------------------------------------------------------------------ resize */

/* Source taps of one axis: dst i samples lo[i] and lo[i] + step[i] with
 * weight frac[i] on the second. */
typedef struct taps {
    int lo;
    int hi;
    float frac;
} taps_t;

static void
axis_taps(int src_len, int resized_len, int offset, int n, taps_t *t)
{
    double f = (double)src_len / (double)resized_len;
    for (int i = 0; i < n; i++) {
        double x = ((double)(i + offset) + 0.5) * f - 0.5;
        if (x < 0) {
            x = 0;
        }
        int x0 = (int)x;
        if (x0 >= src_len - 1) {
            t[i].lo = t[i].hi = src_len - 1;
            t[i].frac = 0;
        } else {
            t[i].lo = x0;
            t[i].hi = x0 + 1;
            t[i].frac = (float)(x - x0);
        }
    }
}

size_t
sp_img_elem_size(const sp_img_spec_t *s)
{
    return s->u8 ? 1 : sizeof(float);
}

sp_status_t
sp_img_to_tensor(const uint8_t *pix, int w, int h, const sp_img_spec_t *s, void *out)
{
    const int C = sp_img_channels(s), H = s->height, W = s->width;
    int rw = W, rh = H, ox = 0, oy = 0;
    if (s->resize == SP_IMG_SHORTER_CROP) {
        double f = (double)s->shorter_side / (double)(w < h ? w : h);
        rw = (int)floor(w * f + 0.5);
        rh = (int)floor(h * f + 0.5);
        rw = rw < W ? W : rw;
        rh = rh < H ? H : rh;
        ox = (rw - W) / 2;
        oy = (rh - H) / 2;
    }
    taps_t *tx = sp_malloc(sizeof *tx * (size_t)(W + H));
    if (tx == NULL) {
        return SP_ERR_NOMEM;
    }
    taps_t *ty = tx + W;
    axis_taps(w, rw, ox, W, tx);
    axis_taps(h, rh, oy, H, ty);
    float a[3], b[3];
    for (int c = 0; c < C; c++) {
        a[c] = s->scale / s->std[c];
        b[c] = -s->mean[c] / s->std[c];
    }
    const size_t stride = (size_t)w * C, plane = (size_t)H * W;
    for (int y = 0; y < H; y++) {
        const uint8_t *r0 = pix + stride * ty[y].lo, *r1 = pix + stride * ty[y].hi;
        const float fy = ty[y].frac;
        for (int x = 0; x < W; x++) {
            const int x0 = tx[x].lo * C, x1 = tx[x].hi * C;
            const float fx = tx[x].frac;
            for (int c = 0; c < C; c++) {
                float top = r0[x0 + c] + fx * (float)(r0[x1 + c] - r0[x0 + c]);
                float bot = r1[x0 + c] + fx * (float)(r1[x1 + c] - r1[x0 + c]);
                float v = top + fy * (bot - top);
                size_t at = s->layout == SP_IMG_NCHW ? (size_t)c * plane + (size_t)y * W + x
                                                     : ((size_t)y * W + x) * C + c;
                if (s->u8) {
                    /* v is a convex mix of bytes: within [0, 255] up to rounding */
                    float q = floorf(v + 0.5f);
                    ((uint8_t *)out)[at] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
                } else {
                    ((float *)out)[at] = v * a[c] + b[c];
                }
            }
        }
    }
    sp_free(tx);
    return SP_OK;
}

sp_status_t
sp_img_preprocess(const void *buf, size_t len, const sp_img_spec_t *s, void *out, char *err,
                  size_t err_len)
{
    uint8_t *pix;
    int w, h;
    sp_status_t st = sp_img_decode(buf, len, s, &pix, &w, &h, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    st = sp_img_to_tensor(pix, w, h, s, out);
    sp_free(pix);
    return st == SP_OK ? SP_OK : sp_errf(err, err_len, st, "out of memory resizing an image");
}
