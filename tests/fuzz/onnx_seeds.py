#!/usr/bin/python3
"""onnx_seeds.py - write the seed corpus of fuzz_onnx: small ONNX models (python3-onnx helpers,
random weights from a fixed seed) that load and run in the ONNX backend, covering the graph
features the reader checks: initializers in raw and typed fields, Constant nodes folded at load,
Conv+BatchNormalization+Relu fusion, MatMul+Add fusion, Shape/Gather/Concat/Reshape chains,
pools, Softmax, LayerNormalization, Split, Slice, Pad, Where and Cast.

    tests/fuzz/onnx_seeds.py [OUT_DIR]      # default tests/fuzz/corpus/onnx
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "corpus", "onnx")
rng = np.random.default_rng(1)
F = TensorProto.FLOAT


def t(name, shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def save(name, nodes, inputs, outputs, inits, opset=13):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    with open(os.path.join(OUT, name + ".onnx"), "wb") as f:
        f.write(m.SerializeToString())


os.makedirs(OUT, exist_ok=True)
vi = helper.make_tensor_value_info
save("conv_bn_relu", [
    helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
    helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
    helper.make_node("Relu", ["n"], ["r"]),
    helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2]),
    helper.make_node("GlobalAveragePool", ["p"], ["y"]),
], [vi("x", F, ["N", 2, 6, 6])], [vi("y", F, ["N", 3, 1, 1])],
    [t("w", (3, 2, 3, 3)), t("b", (3,)), t("s", (3,)), t("bb", (3,)), t("m", (3,)),
     numpy_helper.from_array(np.ones(3, np.float32), "v")])
save("mlp_fold", [
    helper.make_node("MatMul", ["x", "w"], ["h"]),
    helper.make_node("Add", ["h", "b"], ["a"]),
    helper.make_node("Shape", ["a"], ["sh"]),
    helper.make_node("Constant", [], ["i0"], value=helper.make_tensor("c", TensorProto.INT64, [1], [0])),
    helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0),
    helper.make_node("Constant", [], ["rest"], value=helper.make_tensor("c", TensorProto.INT64, [1], [4])),
    helper.make_node("Concat", ["n", "rest"], ["shape"], axis=0),
    helper.make_node("Reshape", ["a", "shape"], ["r"]),
    helper.make_node("Softmax", ["r"], ["y"], axis=-1),
], [vi("x", F, ["N", 3])], [vi("y", F, ["N", 4])], [t("w", (3, 4)), t("b", (4,))])
save("layernorm_split", [
    helper.make_node("LayerNormalization", ["x", "g", "b"], ["l"], axis=-1),
    helper.make_node("Split", ["l"], ["s0", "s1"], axis=1),
    helper.make_node("Mul", ["s0", "s1"], ["m"]),
    helper.make_node("Pad", ["m", "pads"], ["y"], mode="reflect"),
], [vi("x", F, ["N", 4])], [vi("y", F, ["N", 4])],
    [t("g", (4,)), t("b", (4,)), numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads")])
save("where_cast_slice", [
    helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
    helper.make_node("Cast", ["xi"], ["xb"], to=TensorProto.BOOL),
    helper.make_node("Where", ["xb", "x", "z"], ["w"]),
    helper.make_node("Slice", ["w", "st", "en", "ax", "sp"], ["s"]),
    helper.make_node("Transpose", ["s"], ["y"], perm=[1, 0]),
], [vi("x", F, ["N", 6])], [vi("y", F, [3, "N"])],
    [t("z", (6,)), numpy_helper.from_array(np.array([5], np.int64), "st"),
     numpy_helper.from_array(np.array([0], np.int64), "en"),
     numpy_helper.from_array(np.array([1], np.int64), "ax"),
     numpy_helper.from_array(np.array([-2], np.int64), "sp")])
save("gemm_typed_fields", [
    helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1, alpha=0.5),
    helper.make_node("Sigmoid", ["g"], ["y"]),
], [vi("x", F, ["N", 3])], [vi("y", F, ["N", 2])],
    [helper.make_tensor("w", F, [2, 3], [0.1, 0.2, 0.3, -0.1, -0.2, -0.3]),
     helper.make_tensor("c", F, [2], [1.0, -1.0])])
