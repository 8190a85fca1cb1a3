"""onnx_plugin.py - drives build/backends/libsampan_onnx.so in-process through the backend ABI
(include/sampan/backend.h) with ctypes: load a model folder, execute numpy arrays, unload. Used by
test_onnx_node.py (ONNX's operator test cases), so thousands of small graphs run without a server."""
import ctypes as C
import json
import os

import numpy as np

# As `sampan` does in main(): oneDNN's OpenMP threads wait passively. libgomp reads this once, when
# it is first loaded (by the plugin, or by another library imported before it: import this module
# first).
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

MAX_DIMS = 8
MAX_TENSORS = 16
# sp_btype_t order
BT = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
      "FP32", "FP64", "BYTES", "BF16"]
NP = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
      "FP32": np.float32, "UINT16": np.uint16, "INT16": np.int16, "UINT32": np.uint32,
      "UINT64": np.uint64, "FP16": np.float16, "FP64": np.float64}


class Desc(C.Structure):
    _fields_ = [("name", C.c_char * 64), ("dtype", C.c_int), ("n_dims", C.c_int32),
                ("dims", C.c_int64 * MAX_DIMS)]


class Tensor(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int), ("n_dims", C.c_int32),
                ("dims", C.c_int64 * MAX_DIMS), ("data", C.c_void_p), ("bytes", C.c_size_t)]


ALLOC = C.CFUNCTYPE(C.c_void_p, C.c_size_t)
FREE = C.CFUNCTYPE(None, C.c_void_p)
LOG = C.CFUNCTYPE(None, C.c_int, C.c_char_p)


class Host(C.Structure):
    _fields_ = [("abi_version", C.c_uint32), ("alloc_fn", ALLOC), ("free_fn", FREE),
                ("log_fn", LOG)]


class LoadArgs(C.Structure):
    _fields_ = [("model_name", C.c_char_p), ("version", C.c_int64), ("version_dir", C.c_char_p),
                ("model_file", C.c_char_p), ("config_json", C.c_char_p),
                ("max_batch_size", C.c_int32), ("n_threads", C.c_int32)]


class Info(C.Structure):
    _fields_ = [("n_inputs", C.c_int32), ("n_outputs", C.c_int32),
                ("inputs", Desc * MAX_TENSORS), ("outputs", Desc * MAX_TENSORS),
                ("memory_bytes", C.c_uint64), ("device_bytes", C.c_uint64)]


LOADF = C.CFUNCTYPE(C.c_int, C.POINTER(Host), C.POINTER(LoadArgs), C.POINTER(C.c_void_p),
                    C.POINTER(Info), C.c_char_p, C.c_size_t)
EXECF = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(Tensor), C.c_int32, C.POINTER(Tensor), C.c_int32,
                    C.c_char_p, C.c_size_t)
UNLOADF = C.CFUNCTYPE(None, C.c_void_p)


class Api(C.Structure):
    _fields_ = [("abi_version", C.c_uint32), ("name", C.c_char_p), ("load", LOADF),
                ("execute", EXECF), ("unload", UNLOADF)]


class BackendError(Exception):
    pass


class Plugin:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        self.lib.sp_backend_init.restype = C.POINTER(Api)
        self.lib.sp_backend_init.argtypes = [C.c_uint32]
        self.api = self.lib.sp_backend_init(1).contents
        libc = C.CDLL(None)
        libc.malloc.restype = C.c_void_p
        libc.malloc.argtypes = [C.c_size_t]
        libc.free.argtypes = [C.c_void_p]
        self.libc = libc
        self._alloc = ALLOC(lambda n: libc.malloc(n))
        self._free = FREE(lambda p: libc.free(p))
        self.log = []  # the backend's log lines (bytes decoded), newest last
        self._log = LOG(lambda lvl, line: self.log.append(line.decode(errors="replace")))
        self.host = Host(1, self._alloc, self._free, self._log)

    def load(self, version_dir, config=None, max_batch_size=0, model_file=None, n_threads=1):
        cfg = json.dumps(config or {}).encode()
        args = LoadArgs(b"m", 1, version_dir.encode(), model_file.encode() if model_file else None,
                        cfg, max_batch_size, n_threads)
        handle = C.c_void_p()
        info = Info()
        err = C.create_string_buffer(1024)
        if self.api.load(C.byref(self.host), C.byref(args), C.byref(handle), C.byref(info), err,
                         1024):
            raise BackendError(err.value.decode(errors="replace"))
        return Model(self, handle, info)


class Model:
    def __init__(self, plugin, handle, info):
        self.p, self.h, self.info = plugin, handle, info
        self.inputs = [(info.inputs[i].name.decode(), BT[info.inputs[i].dtype],
                        list(info.inputs[i].dims[:info.inputs[i].n_dims]))
                       for i in range(info.n_inputs)]
        self.outputs = [(info.outputs[i].name.decode(), BT[info.outputs[i].dtype],
                         list(info.outputs[i].dims[:info.outputs[i].n_dims]))
                        for i in range(info.n_outputs)]

    def run(self, arrays, output_names=None):
        """arrays: numpy arrays in the reported input order. Returns {name: array}."""
        names = output_names or [o[0] for o in self.outputs]
        keep = []
        ins = (Tensor * max(1, len(arrays)))()
        for i, a in enumerate(arrays):
            a = np.require(a, requirements="C")  # keeps 0-d arrays 0-d
            keep.append(a)
            t = ins[i]
            t.name = self.inputs[i][0].encode()
            # The tensor's own type (not the declared one), so wrong types reach the backend.
            t.dtype = BT.index(next(k for k, v in NP.items() if np.dtype(v) == a.dtype))
            t.n_dims = a.ndim
            for k, d in enumerate(a.shape):
                t.dims[k] = d
            t.data = a.ctypes.data if a.size else None
            t.bytes = a.nbytes
        outs = (Tensor * len(names))()
        enc = [n.encode() for n in names]
        for i, n in enumerate(enc):
            outs[i].name = n
        err = C.create_string_buffer(1024)
        rc = self.p.api.execute(self.h, ins, len(arrays), outs, len(names), err, 1024)
        res = {}
        for i, n in enumerate(names):
            t = outs[i]
            if t.data:
                if rc == 0:
                    dt = np.dtype(NP[BT[t.dtype]])
                    shape = tuple(t.dims[:t.n_dims])
                    buf = C.string_at(t.data, t.bytes)
                    res[n] = np.frombuffer(buf, dtype=dt).reshape(shape).copy()
                self.p.libc.free(t.data)
        if rc:
            raise BackendError(err.value.decode(errors="replace"))
        return res

    def close(self):
        if self.h:
            self.p.api.unload(self.h)
            self.h = None
