"""test_image_inputs.py - image inputs (JPEG/PNG as KServe BYTES) and Triton's classification
extension, through `sampan serve` as a black box.

Two ONNX models are built with python3-onnx's helpers: `echo` (Identity: the model returns the
tensor the server made of the image, so the preprocessing itself is compared) and `avg`
(GlobalAveragePool + Flatten: a per-channel mean as class scores, with a labels file). The
reference is a NumPy float64 version of the pipeline docs/repository.md describes (bilinear with
half-pixel centres, shorter-side resize and centre crop, (v * scale - mean) / std, NCHW/NHWC).

Tolerance: the server computes in float32: |v| <= 255 after interpolation, so a level's rounding
is 255 * 2^-24 * a few operations; after the affine step (factor a = scale/std <= 1/(255*0.2))
that is below 1e-5; we allow 1e-4. JPEG is compared with OpenCV's decoder of the same bytes
(both libjpeg-turbo, islow IDCT: the same pixels; one level of difference is allowed, times a).
16-bit PNG: libpng scales v * 255 / 65535 with rounding; one level is allowed as well.
Last line:
    image-inputs: N passed, N failed, N skipped"""
import http.client
import json
import os
import shutil
import struct
import tempfile
import threading
import time
import zlib

import base64

from common import Server, Suite, binary, free_port, grpc_client, have_grpc_client

s = Suite("image-inputs")
PLUGINS = os.path.join(os.path.dirname(binary() or ""), "backends")
H, W = 16, 16
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def req(srv, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def build_echo(path, c, h, w, nchw, batch=True, elem="FLOAT"):
    from onnx import TensorProto, helper, save
    shape = (["N"] if batch else []) + ([c, h, w] if nchw else [h, w, c])
    et = getattr(TensorProto, elem)
    g = helper.make_graph([helper.make_node("Identity", ["image"], ["out"])], "echo",
                          [helper.make_tensor_value_info("image", et, shape)],
                          [helper.make_tensor_value_info("out", et, shape)])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def build_avg(path):
    from onnx import TensorProto, helper, save
    g = helper.make_graph([helper.make_node("GlobalAveragePool", ["image"], ["p"]),
                           helper.make_node("Flatten", ["p"], ["scores"])], "avg",
                          [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, H, W])],
                          [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 3])])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def taps(src, resized, offset, n):
    import numpy as np
    x = (np.arange(n) + offset + 0.5) * (src / resized) - 0.5
    x = np.maximum(x, 0)
    lo = np.floor(x).astype(int)
    edge = lo >= src - 1
    hi = np.where(edge, src - 1, lo + 1)
    fr = np.where(edge, 0.0, x - lo)
    lo = np.where(edge, src - 1, lo)
    return lo, hi, fr


def reference(rgb, color="RGB", resize="stretch", shorter=None, scale=1 / 255, mean=MEAN, std=STD,
              nchw=True, h=H, w=W):
    """The pipeline in float64 on 8-bit RGB pixels (h x w x 3)."""
    import numpy as np
    px = rgb.astype(np.float64)
    if color == "BGR":
        px = px[:, :, ::-1]
    elif color == "GRAY":
        q = rgb.astype(np.int64)
        g = (19595 * q[:, :, 0] + 38470 * q[:, :, 1] + 7471 * q[:, :, 2] + 32768) >> 16
        px = g[:, :, None].astype(np.float64)
    sh, sw = rgb.shape[:2]
    rh, rw, oy, ox = h, w, 0, 0
    if resize == "shorter_crop":
        f = shorter / min(sh, sw)
        rw, rh = max(w, int(np.floor(sw * f + 0.5))), max(h, int(np.floor(sh * f + 0.5)))
        ox, oy = (rw - w) // 2, (rh - h) // 2
    y0, y1, fy = taps(sh, rh, oy, h)
    x0, x1, fx = taps(sw, rw, ox, w)
    top = px[y0][:, x0] + fx[None, :, None] * (px[y0][:, x1] - px[y0][:, x0])
    bot = px[y1][:, x0] + fx[None, :, None] * (px[y1][:, x1] - px[y1][:, x0])
    v = top + fy[:, None, None] * (bot - top)
    out = (v * scale - np.array(mean)) / np.array(std)
    return out.transpose(2, 0, 1) if nchw else out


def png(rgb_or_gray):
    import cv2
    a = rgb_or_gray
    if a.ndim == 3 and a.shape[2] >= 3:
        a = a[:, :, [2, 1, 0] + ([3] if a.shape[2] == 4 else [])]  # cv2 writes BGR(A)
    ok, b = cv2.imencode(".png", a)
    assert ok
    return b.tobytes()


def infer_json(images, name="image", outputs=None):
    import base64
    body = {"inputs": [{"name": name, "datatype": "BYTES", "shape": [len(images), 1],
                        "data": [base64.b64encode(x).decode() for x in images]}]}
    if outputs:
        body["outputs"] = outputs
    return body


def infer_binary(images, name="image"):
    tail = b"".join(struct.pack("<I", len(x)) + x for x in images)
    head = json.dumps({"inputs": [{"name": name, "datatype": "BYTES", "shape": [len(images)],
                                   "parameters": {"binary_data_size": len(tail)}}],
                       "outputs": [{"name": "out", "parameters": {"binary_data": False}}]}).encode()
    return head + tail, {"Inference-Header-Content-Length": str(len(head)),
                         "Content-Type": "application/octet-stream"}


def out_of(b, name="out"):
    import numpy as np
    for o in json.loads(b)["outputs"]:
        if o["name"] == name:
            return np.array(o["data"], dtype=np.float64).reshape(o["shape"]), o
    return None, None


def close(got, ref, tol):
    import numpy as np
    if got is None or got.shape != ref.shape:
        return False, f"shape {None if got is None else got.shape} vs {ref.shape}"
    d = float(np.abs(got - ref).max())
    return d <= tol, f"max diff {d:.3g} (tol {tol:.3g})"


def write_model(repo, name, cfg, build, *args):
    d = os.path.join(repo, name, "1")
    os.makedirs(d)
    build(os.path.join(d, "model.onnx"), *args)
    with open(os.path.join(repo, name, "config.json"), "w") as f:
        json.dump(dict({"name": name, "backend": "onnx"}, **cfg), f)


def image_input(fmt, dims, **pre):
    return {"name": "image", "data_type": "TYPE_FP32", "dims": dims, "format": fmt,
            "preprocess": {"image": pre}}


def with_exif_orientation(jpg, o):
    """The JPEG with an APP1 EXIF marker (big-endian TIFF) whose IFD0 says orientation o."""
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) + \
        struct.pack(">HHIHH", 0x0112, 3, 1, o, 0) + struct.pack(">I", 0)
    app1 = b"Exif\x00\x00" + tiff
    return jpg[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + jpg[2:]


def png_palette_trns(idx, plte, trns):
    """A palette PNG with a tRNS chunk, written by hand (OpenCV writes no palettes)."""
    def chunk(k, b):
        return struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b) & 0xFFFFFFFF)
    h, w = idx.shape
    raw = b"".join(b"\0" + bytes(r) for r in idx.astype("uint8"))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
            + chunk(b"PLTE", bytes(plte.astype("uint8").ravel())) + chunk(b"tRNS", bytes(trns))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def png_bomb():
    """A valid 1x1 PNG whose IHDR claims 60000 x 60000 pixels (3.6 gigapixels, 70 bytes)."""
    b = bytearray(png(__import__("numpy").zeros((1, 1, 3), dtype="uint8")))
    assert b[12:16] == b"IHDR"
    b[16:24] = struct.pack(">II", 60000, 60000)
    b[29:33] = struct.pack(">I", zlib.crc32(bytes(b[12:29])) & 0xFFFFFFFF)
    return bytes(b)


def main():
    cv2, np, _ = s.need("image inputs", ("cv2", "numpy", "onnx"), (os.path.join(PLUGINS, "libsampan_onnx.so"),),
                        "python3-onnx python3-opencv")
    rng = np.random.default_rng(11)
    tmp = tempfile.mkdtemp(prefix="sampan-image-")
    repo = os.path.join(tmp, "repo")
    try:
        write_model(repo, "echo", {
            "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 300000,
                                                      "preferred_batch_size": [4]},
            "input": [image_input("FORMAT_NCHW", [3, H, W], mean=MEAN, std=STD)],
            "output": [{"name": "out", "data_type": "TYPE_FP32", "dims": [3, H, W]}]},
            build_echo, 3, H, W, True)
        write_model(repo, "crop", {
            "max_batch_size": 4,
            "input": [image_input("FORMAT_NHWC", [H, W, 3], color="BGR", resize="shorter_crop",
                                  shorter_side=20, scale=1.0, mean=[100, 110, 120],
                                  std=[50, 60, 70])]},
            build_echo, 3, H, W, False)
        write_model(repo, "gray", {
            "max_batch_size": 4, "input": [image_input("FORMAT_NCHW", [1, H, W], max_pixels=10000,
                                                       max_bytes=20000)]},
            build_echo, 1, H, W, True)
        write_model(repo, "avg", {
            "max_batch_size": 4, "input": [image_input("FORMAT_NCHW", [3, H, W], scale=1.0)],
            "output": [{"name": "scores", "data_type": "TYPE_FP32", "dims": [3],
                        "label_filename": "labels.txt"}]}, build_avg)
        with open(os.path.join(repo, "avg", "labels.txt"), "w") as f:
            f.write("red\r\ngreen\nblue\n")
        # A UINT8 NHWC model (TF-style): the pixels as they are, resized and rounded.
        write_model(repo, "u8", {
            "max_batch_size": 4, "input": [dict(image_input("FORMAT_NHWC", [H, W, 3]),
                                                data_type="TYPE_UINT8")],
            "output": [{"name": "out", "data_type": "TYPE_UINT8", "dims": [H, W, 3]}]},
            build_echo, 3, H, W, False, True, "UINT8")
        write_model(repo, "u8mean", {
            "max_batch_size": 4, "input": [dict(image_input("FORMAT_NHWC", [H, W, 3], mean=[1, 2, 3]),
                                                data_type="TYPE_UINT8")]},
            build_echo, 3, H, W, False, True, "UINT8")
        write_model(repo, "badcfg", {
            "max_batch_size": 4, "input": [image_input("FORMAT_NCHW", [3, H, W], color="GRAY")]},
            build_echo, 3, H, W, True)
        write_model(repo, "nobatch", {
            "max_batch_size": 0, "input": [image_input("FORMAT_NCHW", [3, H, W])]},
            build_echo, 3, H, W, True, False)
        write_model(repo, "nolabels", {
            "max_batch_size": 4, "input": [image_input("FORMAT_NCHW", [3, H, W])],
            "output": [{"name": "scores", "data_type": "TYPE_FP32", "dims": [3],
                        "label_filename": "missing.txt"}]}, build_avg)
        gport = free_port()
        srv = Server("--model-repository", repo, "--grpc-port", str(gport), model=None)
        try:
            st, b = req(srv, "POST", "/v2/repository/index")
            ix = {e["name"]: e for e in json.loads(b)} if st == 200 else {}
            s.case("image models load", all(ix.get(n, {}).get("state") == "READY"
                                            for n in ("echo", "crop", "gray", "avg", "u8")), str(ix)[:600])
            why = ix.get("u8mean", {}).get("reason", "")
            s.case("a TYPE_UINT8 image input with mean is a load error naming the field",
                   ix.get("u8mean", {}).get("state") == "UNAVAILABLE" and
                   "input[0].preprocess.image.mean" in why and "UINT8" in why, why)
            why = ix.get("badcfg", {}).get("reason", "")
            s.case("GRAY with 3 channels in dims is a load error naming the field",
                   ix.get("badcfg", {}).get("state") == "UNAVAILABLE" and
                   "input[0].preprocess.image" in why and "channel" in why, why)
            why = ix.get("nobatch", {}).get("reason", "")
            s.case("an image input without a batch dimension is a load error",
                   ix.get("nobatch", {}).get("state") == "UNAVAILABLE" and "max_batch_size" in why, why)
            why = ix.get("nolabels", {}).get("reason", "")
            s.case("a missing label_filename is a load error naming it",
                   ix.get("nolabels", {}).get("state") == "UNAVAILABLE" and "missing.txt" in why, why)
            st, b = req(srv, "GET", "/v2/models/echo")
            meta = json.loads(b) if st == 200 else {}
            s.case("metadata: the image input is BYTES [-1, 1]",
                   meta.get("inputs") == [{"name": "image", "datatype": "BYTES", "shape": [-1, 1]}],
                   str(meta))

            st, b = req(srv, "GET", "/v2/models/crop/config")
            cfg = json.loads(b) if st == 200 else {}
            pre = cfg.get("parameters", {}).get("image_preprocess.image", {}).get("string_value", "")
            s.case("Triton's config view carries preprocess as the image_preprocess.NAME parameter",
                   st == 200 and cfg["input"][0].get("format") == "FORMAT_NHWC" and
                   json.loads(pre or "{}").get("shorter_side") == 20, f"{st} {str(cfg)[:400]}")
            st, b = req(srv, "GET", "/v2/models/avg/config")
            cfg = json.loads(b) if st == 200 else {}
            s.case("label_filename in the config view",
                   st == 200 and cfg["output"][0].get("label_filename") == "labels.txt", f"{st}")

            tol = 1e-4
            lvl = 1.0 / 255 / min(STD) * 1.01  # one 8-bit level after normalisation
            # PNG, RGB, stretch (not square: both axes resample), JSON base64, batch of 2.
            a = rng.integers(0, 256, (23, 37, 3), dtype=np.uint8)
            b2 = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)  # upscaled
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(a), png(b2)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, np.stack([reference(a), reference(b2)]), tol)
            s.case("PNG RGB stretch (down and up) matches the NumPy pipeline", ok, f"status {st} {d}")

            # The binary extension, [N] shape.
            body, hdr = infer_binary([png(a)])
            st, b = req(srv, "POST", "/v2/models/echo/infer", body, hdr)
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(a)[None], tol)
            s.case("PNG through the binary tensor extension", ok, f"status {st} {d}")

            # RGBA (alpha dropped), grey, palette-free 16-bit.
            rgba = rng.integers(0, 256, (20, 24, 4), dtype=np.uint8)
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(rgba)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(rgba[:, :, :3])[None], tol)
            s.case("RGBA PNG: alpha dropped", ok, f"status {st} {d}")
            g = rng.integers(0, 256, (18, 18), dtype=np.uint8)
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(g)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(np.repeat(g[:, :, None], 3, 2))[None], tol)
            s.case("grey PNG into an RGB model: replicated", ok, f"status {st} {d}")
            plte = rng.integers(0, 256, (8, 3), dtype=np.uint8)
            idx = rng.integers(0, 8, (14, 21))
            st, b = req(srv, "POST", "/v2/models/echo/infer",
                        infer_json([png_palette_trns(idx, plte, [0, 64, 128])]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(plte[idx])[None], tol)
            s.case("palette PNG with tRNS: expanded, alpha dropped", ok, f"status {st} {d}")
            p16 = rng.integers(0, 65536, (17, 19, 3), dtype=np.uint16)
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(p16)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(np.round(p16 / 257.0).astype(np.uint8))[None], lvl)
            s.case("16-bit PNG scaled to 8 bits", ok, f"status {st} {d}")

            # Grey with alpha (8 and 16 bits) and 16-bit grey: alpha dropped, scaled, replicated.
            g16 = rng.integers(0, 65536, (15, 17), dtype=np.uint16)
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(g16)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            g8 = np.round(g16 / 257.0).astype(np.uint8)
            ok, d = close(got, reference(np.repeat(g8[:, :, None], 3, 2))[None], lvl)
            s.case("16-bit grey PNG: scaled and replicated", ok, f"status {st} {d}")
            try:
                import io
                from PIL import Image
            except ImportError as e:
                Image = None
                s.skip("grey+alpha PNG and CMYK JPEG", f"python3-pil missing: {e}")
            if Image is not None:
                la = rng.integers(0, 256, (13, 19, 2), dtype=np.uint8)
                bio = io.BytesIO()
                Image.fromarray(la, "LA").save(bio, "PNG")
                st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([bio.getvalue()]))
                got, _ = out_of(b) if st == 200 else (None, None)
                ok, d = close(got, reference(np.repeat(la[:, :, :1], 3, 2))[None], tol)
                s.case("grey+alpha PNG: alpha dropped, grey replicated", ok, f"status {st} {d}")
                # CMYK JPEG (PIL writes Adobe's inverted convention, with the APP14 marker)
                # against OpenCV's decode of the same bytes. OpenCV converts with
                # R = K' - ((255 - C') K' >> 8), we with round(C' K' / 255): the two differ by
                # (255 - C') K' / 65280 < 1 plus one rounding step, so 2 levels are allowed.
                cm = cv2.GaussianBlur(rng.integers(0, 256, (24, 30, 4), dtype=np.uint8), (5, 5), 2)
                bio = io.BytesIO()
                Image.fromarray(cm, "CMYK").save(bio, "JPEG", quality=95)
                cj = bio.getvalue()
                decc = cv2.imdecode(np.frombuffer(cj, np.uint8), cv2.IMREAD_COLOR)
                st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([cj]))
                got, _ = out_of(b) if st == 200 else (None, None)
                ok, d = close(got, reference(decc[:, :, ::-1])[None], 2 * lvl)
                s.case("CMYK JPEG (Adobe, inverted) matches OpenCV's decode", ok and b"\xff\xee" in cj,
                       f"status {st} {d}")
                st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([cj[:len(cj) // 2]]))
                s.case("truncated CMYK JPEG: 400 with a JSON error",
                       st == 400 and "error" in json.loads(b), f"{st} {b[:200]}")

            # UINT8 model: the resized pixels rounded (the float pipeline with scale 1, no
            # normalisation: |float - rounded| <= 0.5, plus float32 noise); same size: exact.
            u = rng.integers(0, 256, (20, 26, 3), dtype=np.uint8)
            st, b = req(srv, "POST", "/v2/models/u8/infer", infer_json([png(u)]))
            got, o = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(u, scale=1.0, mean=[0, 0, 0], std=[1, 1, 1], nchw=False)[None],
                          0.5 + 1e-3)
            s.case("UINT8 NHWC model: resized pixels rounded, datatype UINT8",
                   ok and o is not None and o["datatype"] == "UINT8", f"status {st} {d}")
            u16 = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
            st, b = req(srv, "POST", "/v2/models/u8/infer", infer_json([png(u16)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            s.case("UINT8 model, image of the model's size: the pixels exactly",
                   got is not None and np.array_equal(got[0], u16), f"status {st}")

            # JPEG against OpenCV's decode of the same bytes.
            smooth = cv2.GaussianBlur(rng.integers(0, 256, (40, 52, 3), dtype=np.uint8), (7, 7), 2)
            ok_, jb = cv2.imencode(".jpg", smooth, [cv2.IMWRITE_JPEG_QUALITY, 90])
            jpg = jb.tobytes()
            dec = cv2.imdecode(jb, cv2.IMREAD_COLOR)[:, :, ::-1]
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([jpg]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(dec)[None], lvl)
            s.case("JPEG matches OpenCV's decode through the NumPy pipeline", ok, f"status {st} {d}")
            for o in (3, 6, 8):
                jo = with_exif_orientation(jpg, o)
                deco = cv2.imdecode(np.frombuffer(jo, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
                st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([jo]))
                got, _ = out_of(b) if st == 200 else (None, None)
                ok, d = close(got, reference(deco)[None], lvl)
                s.case(f"JPEG with EXIF orientation {o}: turned as OpenCV turns it",
                       ok and deco.shape[:2] == (smooth.shape[:2] if o == 3 else smooth.shape[1::-1]),
                       f"status {st} {d}")

            # Shorter side + centre crop, BGR, NHWC, raw scale with mean/std in 0..255 units.
            c = rng.integers(0, 256, (30, 45, 3), dtype=np.uint8)
            st, b = req(srv, "POST", "/v2/models/crop/infer", infer_json([png(c)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ref = reference(c, color="BGR", resize="shorter_crop", shorter=20, scale=1.0,
                            mean=[100, 110, 120], std=[50, 60, 70], nchw=False)
            ok, d = close(got, ref[None], 1e-4 * 255)
            s.case("shorter_crop + BGR + NHWC + raw scale", ok, f"status {st} {d}")
            st, b = req(srv, "POST", "/v2/models/gray/infer", infer_json([png(c)]))
            got, _ = out_of(b) if st == 200 else (None, None)
            ok, d = close(got, reference(c, color="GRAY", mean=[0], std=[1])[None], tol)
            s.case("GRAY model: BT.601 luma", ok, f"status {st} {d}")

            # Classification: top-2 with labels, per batch row, against argsort.
            imgs = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(3)]
            st, b = req(srv, "POST", "/v2/models/avg/infer", infer_json(
                [png(x) for x in imgs], outputs=[{"name": "scores", "parameters": {"classification": 2}}]))
            o = json.loads(b)["outputs"][0] if st == 200 else {}
            labels = ["red", "green", "blue"]
            good = o.get("datatype") == "BYTES" and o.get("shape") == [3, 2]
            for r, x in enumerate(imgs):
                m = x.reshape(-1, 3).astype(np.float64).mean(0)
                want = np.argsort(-m, kind="stable")[:2]
                row = o.get("data", [])[2 * r:2 * r + 2] if good else []
                parts = [e.split(":") for e in row]
                good = good and len(parts) == 2 and all(
                    len(p) == 3 and int(p[1]) == want[j] and p[2] == labels[want[j]] and
                    abs(float(p[0]) - m[want[j]]) < 1e-3 and len(p[0].split(".")[1]) == 6
                    for j, p in enumerate(parts))
            s.case("classification 2: 'value:index:label' per row, top by argsort", good,
                   f"status {st} {o}")
            st, b = req(srv, "POST", "/v2/models/avg/infer", infer_json(
                [png(imgs[0])], outputs=[{"name": "scores", "parameters": {"classification": 10}}]))
            o = json.loads(b)["outputs"][0] if st == 200 else {}
            s.case("classification larger than the classes: all of them", o.get("shape") == [1, 3],
                   f"status {st} {o}")
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json(
                [png(a)], outputs=[{"name": "out", "parameters": {"classification": 3}}]))
            o = json.loads(b)["outputs"][0] if st == 200 else {}
            ok = o.get("shape") == [1, 3] and all(len(e.split(":")) == 2 for e in o.get("data", []))
            s.case("classification without labels: 'value:index'", ok, f"status {st} {str(o)[:200]}")
            st, b = req(srv, "POST", "/v2/models/avg/infer", infer_json(
                [png(imgs[0])], outputs=[{"name": "scores", "parameters": {"classification": 0}}]))
            s.case("classification 0 is a 400", st == 400 and b"classification" in b, b[:200])

            # The same over gRPC: the image as bytes_contents, classification as an int64_param.
            if not have_grpc_client():
                s.skip("gRPC: image in, classification out", "node or @grpc/grpc-js missing (npm ci in tests/node)")
            else:
                rq = {"model_name": "avg", "inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1],
                                                       "contents": {"bytes_contents": [base64.b64encode(png(imgs[1])).decode()]}}],
                      "outputs": [{"name": "scores", "parameters": {"classification": {"int64_param": 2}}}]}
                r = grpc_client(gport, [{"method": "ModelInfer", "request": rq}])[0]
                raw = base64.b64decode((r.get("response", {}).get("raw_output_contents") or [""])[0])
                els, off = [], 0
                while off + 4 <= len(raw):
                    n = struct.unpack_from("<I", raw, off)[0]
                    els.append(raw[off + 4:off + 4 + n].decode())
                    off += 4 + n
                m = imgs[1].reshape(-1, 3).astype(np.float64).mean(0)
                want = np.argsort(-m, kind="stable")[:2]
                s.case("gRPC: image in, classification out ('value:index:label')",
                       r.get("code") == 0 and [e.split(":")[1:] for e in els] ==
                       [[str(i), labels[i]] for i in want], f"{str(r)[:300]} {els}")

            # The dynamic batcher merges decoded images (preferred size 4, long delay).
            res = [None] * 4

            def one(i):
                res[i] = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(imgs[i % 3])]))
            th = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            [t.start() for t in th]
            [t.join(60) for t in th]
            st, b = req(srv, "GET", "/v2/models/echo/stats")
            ms = json.loads(b)["model_stats"][0] if st == 200 else {}
            bs = {e["batch_size"]: e["compute_infer"]["count"] for e in ms.get("batch_stats", [])}
            oks = all(r is not None and r[0] == 200 for r in res)
            s.case("four concurrent image requests run as one batch of 4", oks and bs.get(4) == 1,
                   f"batch_stats {bs}")

            # Bad images: 400 naming the input and the reason; the model keeps serving.
            bad = [
                ("truncated JPEG", [jpg[:len(jpg) // 2]], "jpeg"),
                ("corrupt JPEG", [jpg[:200] + bytes(300) + jpg[500:]], "jpeg"),
                ("truncated PNG", [png(a)[:100]], "png"),
                ("PNG bomb (60000 x 60000, 70 bytes)", [png_bomb()], "max_pixels"),
                ("non-image bytes", [b"GIF89a not supported"], "not a JPEG or PNG"),
                ("an empty element", [b""], "not a JPEG or PNG"),
                ("one bad image of two", [png(a), b"junk"], "'image'[1]"),
            ]
            for what, imgs_, needle in bad:
                st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json(imgs_))
                s.case(f"{what}: 400 naming input and reason",
                       st == 400 and b"image" in b and needle.encode() in b, f"{st} {b[:300]}")
            st, b = req(srv, "POST", "/v2/models/gray/infer", infer_json([png(np.zeros((240, 360, 3), np.uint8))]))
            s.case("an image over the model's max_pixels: 400", st == 400 and b"max_pixels" in b,
                   f"{st} {b[:300]}")
            big = rng.integers(0, 256, (90, 90, 3), dtype=np.uint8)
            st, b = req(srv, "POST", "/v2/models/gray/infer", infer_json([png(big)]))
            s.case("an image over the model's max_bytes: 400", st == 400 and b"max_bytes" in b,
                   f"{st} {b[:300]}")
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(a)] * 9))
            s.case("9 images for max_batch_size 8: 400", st == 400 and b"image" in b, f"{st} {b[:300]}")
            x = np.zeros((1, 3, H, W), dtype=np.float32)
            st, b = req(srv, "POST", "/v2/models/echo/infer", {"inputs": [{
                "name": "image", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]})
            s.case("FP32 instead of an image: 400", st == 400 and b"BYTES" in b, f"{st} {b[:300]}")
            st, b = req(srv, "POST", "/v2/models/echo/infer", {"inputs": [{
                "name": "image", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]})
            s.case("[1, 2] BYTES: 400 on the shape", st == 400 and b"shape" in b, f"{st} {b[:300]}")
            st, b = req(srv, "POST", "/v2/models/echo/infer", infer_json([png(a)]))
            s.case("still serving after the bad inputs", st == 200, f"{st}")
            rc = srv.stop()
            time.sleep(0.3)  # the stderr reader's last lines (a report comes before the exit)
            san = [l for l in srv.log if "Sanitizer" in l or "runtime error" in l]
            s.case("the server exits 0 on SIGTERM with no sanitizer report (ASan builds: no leak)",
                   rc == 0 and not san, f"rc {rc} {''.join(san[:5])[:600]}")
        finally:
            srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s.finish()


main()
