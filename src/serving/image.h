/*
 * image.h - image inputs of tensor models: an encoded JPEG or PNG (a KServe
 * BYTES element) decoded, converted, resized and normalised into the FP32
 * tensor a vision model takes (one image per batch row).
 *
 * The spec comes from the model's config (an input entry's "format" and
 * "preprocess": {"image": {...}}, repo_config.c; docs/repository.md). The
 * pipeline, per image:
 *   1. decode (libjpeg-turbo, libpng) to 8-bit RGB; alpha is dropped, a
 *      palette expanded, 16-bit samples scaled to 8 bits with rounding
 *      (v * 255 / 65535), grey replicated; a CMYK or YCCK JPEG (libjpeg
 *      gives CMYK; Adobe's files store the inks inverted) converted with
 *      R = C'K'/255 on the inverted values C' = 255 - C, K' = 255 - K
 *      (as OpenCV and browsers do, no colour profile); a JPEG's EXIF orientation applied
 *      (rotated or mirrored as cameras tag it, as OpenCV and browsers show
 *      it). Bounded before any pixel buffer
 *      is allocated: max_bytes of encoded data, max_pixels of decoded area.
 *      A corrupt, truncated (libjpeg's "premature end" warning included) or
 *      unsupported file is an error with the reason; libjpeg's and libpng's
 *      longjmp never leaves the decode call (an error manager per decode).
 *   2. colour: RGB as decoded, BGR swapped, GRAY = 0.299 R + 0.587 G +
 *      0.114 B (ITU-R BT.601, as OpenCV and libjpeg), rounded to 8 bits.
 *   3. geometry: STRETCH resizes to the model's H x W; SHORTER_CROP scales
 *      the shorter side to `shorter_side` (the aspect ratio kept, each side
 *      rounded half up, never below H or W) and takes the centred H x W
 *      window (offset floor((rw - W) / 2)). Bilinear sampling with
 *      half-pixel centres (OpenCV's INTER_LINEAR, no antialiasing):
 *      src = (dst + 0.5) * (src_len / resized_len) - 0.5, clamped at the
 *      edges. Computed in float, not rounded back to 8 bits.
 *   4. value = (v * scale - mean[c]) / std[c], per channel (c in the
 *      model's colour order), written NCHW or NHWC; for a UINT8 input
 *      (u8) the value is v rounded half up to a byte (0..255), as
 *      uint8 NHWC image models (TF/TFLite exports) take it.
 *
 * Threads: everything here is re-entrant; decoding runs on the request
 * preparation workers, never on an event loop. Memory: the decoded pixels
 * are the caller's (sp_free).
 */
#ifndef SP_SERVING_IMAGE_H
#define SP_SERVING_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

#define SP_IMG_DEFAULT_MAX_PIXELS (40LL * 1000 * 1000)
#define SP_IMG_DEFAULT_MAX_BYTES  ((size_t)64 << 20)
#define SP_IMG_MAX_SIDE           65535 /* either side, decoded or resized */

typedef enum sp_img_color { SP_IMG_RGB = 0, SP_IMG_BGR, SP_IMG_GRAY } sp_img_color_t;
typedef enum sp_img_layout { SP_IMG_NCHW = 0, SP_IMG_NHWC } sp_img_layout_t;
typedef enum sp_img_resize { SP_IMG_STRETCH = 0, SP_IMG_SHORTER_CROP } sp_img_resize_t;

typedef struct sp_img_spec {
    int32_t height, width;  /* the model's H and W */
    sp_img_color_t color;   /* 3 channels (RGB, BGR) or 1 (GRAY) */
    sp_img_layout_t layout;
    sp_img_resize_t resize;
    int32_t shorter_side;   /* SHORTER_CROP: the shorter side before the crop */
    float scale;            /* applied to 0..255 before mean/std (1/255 by default) */
    float mean[3], std[3];  /* per channel, in the colour order; std > 0 */
    bool u8;                /* a UINT8 model input: the resized values rounded to 0..255, one
                             * byte each; no scale, mean or std (repo_config.c refuses them) */
    int64_t max_pixels;     /* decoded width * height */
    size_t max_bytes;       /* encoded bytes */
} sp_img_spec_t;

/* RGB, NCHW, STRETCH, scale 1/255, mean 0, std 1, the default bounds; height
 * and width 0 (to be set). */
sp_img_spec_t sp_img_spec_default(void);

/* Channels of the spec's colour: 3 or 1. */
int sp_img_channels(const sp_img_spec_t *s);

/* The kind of data in buf: "jpeg", "png" or NULL (neither). */
const char *sp_img_sniff(const void *buf, size_t len);

/* Base64 (standard or URL-safe alphabet, padding optional) into *out
 * (sp_free). SP_ERR_INVALID for any other character. */
sp_status_t sp_img_b64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len);

/*
 * Decode buf (JPEG or PNG, by its signature, or base64 text of one: JSON
 * tensors carry BYTES as strings) into 8-bit pixels in the
 * spec's colour (interleaved, sp_img_channels of them per pixel): *pix
 * (sp_free), *w, *h. SP_ERR_INVALID with err saying why (not an image, a
 * truncated or corrupt file, too large), SP_ERR_NOMEM. Never longjmps out.
 */
sp_status_t sp_img_decode(const void *buf, size_t len, const sp_img_spec_t *s, uint8_t **pix,
                          int *w, int *h, char *err, size_t err_len);

/* Resize, crop and normalise pixels (w x h, sp_img_channels(s) interleaved)
 * into out: s->height * s->width * channels floats (bytes when s->u8) in
 * s->layout. SP_ERR_NOMEM (its tap tables) leaves out unwritten. */
sp_status_t sp_img_to_tensor(const uint8_t *pix, int w, int h, const sp_img_spec_t *s, void *out);

/* Bytes of one element of the tensor: 1 (u8) or 4 (float). */
size_t sp_img_elem_size(const sp_img_spec_t *s);

/* decode + to_tensor. */
sp_status_t sp_img_preprocess(const void *buf, size_t len, const sp_img_spec_t *s, void *out,
                              char *err, size_t err_len);

#endif /* SP_SERVING_IMAGE_H */
