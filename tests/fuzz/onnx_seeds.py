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

# Quantized graphs (backends/onnx/ops_quant.c, qdq.c): the QDQ form `sampan optimize` writes
# (fused into integer Conv/MatMul at load), QLinear operators with constant parameters (checked
# at load), DynamicQuantizeLinear + MatMulInteger, FLOAT16 weights widened by Cast.
U8, I8 = TensorProto.UINT8, TensorProto.INT8


def c(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


save("qdq_conv_bn_relu", [
    helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
    helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
    helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
    helper.make_node("Conv", ["xd", "w", "b"], ["cv"], pads=[1, 1, 1, 1]),
    helper.make_node("BatchNormalization", ["cv", "s", "bb", "m", "v"], ["n"]),
    helper.make_node("Relu", ["n"], ["r"]),
    helper.make_node("Flatten", ["r"], ["f"]),
    helper.make_node("QuantizeLinear", ["f", "fs", "fz"], ["fq"]),
    helper.make_node("DequantizeLinear", ["fq", "fs", "fz"], ["fd"]),
    helper.make_node("DequantizeLinear", ["mq", "ms"], ["mw"], axis=1),
    helper.make_node("MatMul", ["fd", "mw"], ["mm"]),
    helper.make_node("Add", ["mm", "mb"], ["y"]),
], [vi("x", F, ["N", 2, 4, 4])], [vi("y", F, ["N", 5])],
    [c("xs", np.float32(0.05)), c("xz", np.uint8(128)),
     c("wq", rng.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8)), c("ws", np.full(3, 0.01, np.float32)),
     c("wz", np.zeros(3, np.int8)), t("b", (3,)), t("s", (3,)), t("bb", (3,)), t("m", (3,)),
     c("v", np.ones(3, np.float32)), c("fs", np.float32(0.02)), c("fz", np.int8(0)),
     c("mq", rng.integers(-127, 128, (48, 5)).astype(np.int8)), c("ms", np.full(5, 0.01, np.float32)),
     t("mb", (5,))])
save("qlinear_ops", [
    helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
    helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"], ["cq"],
                     pads=[0, 1, 0, 1], strides=[1, 2]),
    helper.make_node("Flatten", ["cq"], ["fq"]),
    helper.make_node("QLinearMatMul", ["fq", "ys", "yz", "w2", "w2s", "w2z", "y2s", "y2z"], ["mq"]),
    helper.make_node("DequantizeLinear", ["mq", "y2s", "y2z"], ["y"]),
], [vi("x", F, ["N", 2, 3, 4])], [vi("y", F, ["N", 3])],
    [c("xs", np.float32(0.1)), c("xz", np.uint8(10)),
     c("w", rng.integers(0, 256, (2, 2, 2, 3)).astype(np.uint8)), c("ws", np.array([0.01, 0.02], np.float32)),
     c("wz", np.array([120, 130], np.uint8)), c("ys", np.float32(0.5)), c("yz", np.uint8(100)),
     c("bias", np.array([5, -5], np.int32)), c("w2", rng.integers(0, 256, (8, 3)).astype(np.uint8)),
     c("w2s", np.float32(0.03)), c("w2z", np.uint8(127)), c("y2s", np.float32(0.2)), c("y2z", np.uint8(50))])
save("dynquant_matmulinteger_fp16", [
    helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
    helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
    helper.make_node("Cast", ["acc"], ["accf"], to=F),
    helper.make_node("Cast", ["h16"], ["h"], to=F),
    helper.make_node("Mul", ["accf", "h"], ["y"]),
], [vi("x", F, ["N", 4])], [vi("y", F, ["N", 3])],
    [c("w", rng.integers(0, 256, (4, 3)).astype(np.uint8)), c("wz", np.uint8(128)),
     c("h16", rng.standard_normal(3).astype(np.float16))])
save("convtranspose_resize", [
    helper.make_node("ConvTranspose", ["x", "w", "b"], ["ct"], strides=[2, 2], pads=[1, 0, 1, 0],
                     output_padding=[1, 1]),
    helper.make_node("Resize", ["ct", "", "sc"], ["rl"], mode="linear",
                     coordinate_transformation_mode="align_corners"),
    helper.make_node("Resize", ["rl", "", "", "sz"], ["y"], mode="nearest",
                     coordinate_transformation_mode="asymmetric", nearest_mode="round_prefer_ceil"),
], [vi("x", F, [2, 2, 3, 3])], [vi("y", F, [2, 2, 5, 7])],
    [t("w", (2, 2, 3, 3)), t("b", (2,)), c("sc", np.array([1, 1, 1.5, 0.75], np.float32)),
     c("sz", np.array([2, 2, 5, 7], np.int64))])
save("maxpool_u8_opset6", [
    helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
    helper.make_node("MaxPool", ["q"], ["p"], kernel_shape=[2, 2], pads=[1, 1, 0, 0], strides=[2, 1]),
    helper.make_node("DequantizeLinear", ["p", "s", "z"], ["y"]),
], [vi("x", F, ["N", 2, 4, 4])], [vi("y", F, ["N", 2, 2, 4])],
    [c("s", np.float32(0.05)), c("z", np.uint8(128))])
save("opset6_unchanged", [
    helper.make_node("Relu", ["x"], ["r"]),
    helper.make_node("GlobalAveragePool", ["r"], ["g"]),
    helper.make_node("Flatten", ["g"], ["y"]),
], [vi("x", F, ["N", 3, 2, 2])], [vi("y", F, ["N", 3])], [], opset=6)
