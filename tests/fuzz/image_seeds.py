#!/usr/bin/env python3
"""image_seeds.py - writes tests/fuzz/corpus/image: small JPEGs and PNGs of every kind the
decoders take, palette (with and without tRNS), grey+alpha and 1-bit grey PNGs written by hand (fuzz_image.c's input: a spec byte, then the file). Run from the repository root."""
import os
import struct
import zlib

import cv2
import numpy as np

out = os.path.join("tests", "fuzz", "corpus", "image")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(3)
img = cv2.GaussianBlur(rng.integers(0, 256, (12, 17, 3), dtype=np.uint8), (5, 5), 1)
gray = img[:, :, 0]
seeds = {
    "jpeg_baseline": (0x50, cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])[1]),
    "jpeg_progressive": (0x58, cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1]),
    "jpeg_gray": (0x72, cv2.imencode(".jpg", gray)[1]),
    "png_rgb": (0x40, cv2.imencode(".png", img)[1]),
    "png_rgba": (0x4c, cv2.imencode(".png", np.dstack([img, gray]))[1]),
    "png_gray": (0x22, cv2.imencode(".png", gray)[1]),
    "png_16bit": (0x61, cv2.imencode(".png", img.astype(np.uint16) * 257)[1]),
}


def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_raw(w, h, depth, ctype, rows, plte=b"", trns=b""):
    """A PNG written by hand (OpenCV writes neither palettes, tRNS nor 1-bit grey)."""
    raw = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
            + (chunk(b"PLTE", plte) if plte else b"") + (chunk(b"tRNS", trns) if trns else b"")
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


pal = png_raw(6, 4, 8, 3, [bytes((x + y) % 4 for x in range(6)) for y in range(4)],
              bytes([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255]))
bits = png_raw(16, 3, 1, 0, [bytes([0xA5, 0x3C]) for _ in range(3)])
seeds["png_palette"] = (0x35, np.frombuffer(pal, np.uint8))
seeds["png_gray_1bit"] = (0x46, np.frombuffer(bits, np.uint8))
# A palette with transparency: libpng's expansion turns tRNS into an alpha channel.
pal_t = png_raw(6, 4, 8, 3, [bytes((x + y) % 4 for x in range(6)) for y in range(4)],
                bytes([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255]), bytes([0, 128]))
ga = png_raw(5, 2, 8, 4, [bytes(range(10)), bytes(range(10, 20))])
seeds["png_palette_trns"] = (0x27, np.frombuffer(pal_t, np.uint8))
seeds["png_gray_alpha"] = (0x3a, np.frombuffer(ga, np.uint8))
for name, (spec, data) in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([spec]) + data.tobytes())
print(f"wrote {len(seeds)} seeds to {out}")
