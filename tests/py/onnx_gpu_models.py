"""onnx_gpu_models.py - ONNX graphs with random weights built with python3-onnx's helpers, for the
GPU executor's tests and bench/gpu: ResNet-50 (He et al.'s v1.5 bottlenecks: 3-4-6-3 blocks,
stride on the 3x3 convolution, projection shortcuts; Conv+BatchNormalization+Relu as exported
by PyTorch; 224x224 by default) at any width and input size, so the test can run a narrow
small copy of the same graph on the host emulation in seconds."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def build_resnet50(path, rng, size=224, width=64, classes=1000, blocks=(3, 4, 6, 3), opset=13):
    """Write a ResNet-50-shaped model to path: input "image" [N, 3, size, size], outputs "logits"
    and "probs" [N, classes]. width 64 is ResNet-50 itself; smaller widths keep the shape of the
    graph with fewer channels."""
    inits, nodes = [], []
    count = [0]

    def name(p):
        count[0] += 1
        return f"{p}{count[0]}"

    def const(a, p):
        n = name(p)
        inits.append(numpy_helper.from_array(a.astype(np.float32), n))
        return n

    def conv_bn(x, cin, cout, k, stride, relu=True):
        w = const(rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k), "w")
        c = name("conv")
        nodes.append(helper.make_node("Conv", [x, w], [c], kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4, name=c))
        bn = [const(rng.uniform(0.5, 1.0, cout), "bn_s"), const(rng.uniform(-0.1, 0.1, cout), "bn_b"),
              const(rng.uniform(-0.1, 0.1, cout), "bn_m"), const(rng.uniform(0.5, 1.5, cout), "bn_v")]
        b = name("bn")
        nodes.append(helper.make_node("BatchNormalization", [c] + bn, [b], epsilon=1e-5, name=b))
        if not relu:
            return b
        r = name("relu")
        nodes.append(helper.make_node("Relu", [b], [r], name=r))
        return r

    x = conv_bn("image", 3, width, 7, 2)
    p = name("maxpool")
    nodes.append(helper.make_node("MaxPool", [x], [p], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name=p))
    x, cin = p, width
    for stage, n in enumerate(blocks):
        mid = width * (2 ** stage)
        cout = mid * 4
        for i in range(n):
            stride = 2 if i == 0 and stage > 0 else 1
            y = conv_bn(x, cin, mid, 1, 1)
            y = conv_bn(y, mid, mid, 3, stride)
            y = conv_bn(y, mid, cout, 1, 1, relu=False)
            sc = conv_bn(x, cin, cout, 1, stride, relu=False) if i == 0 else x
            a = name("add")
            nodes.append(helper.make_node("Add", [y, sc], [a], name=a))
            r = name("relu")
            nodes.append(helper.make_node("Relu", [a], [r], name=r))
            x, cin = r, cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flatten"))
    fw = const(rng.standard_normal((classes, cin)) / np.sqrt(cin), "fc_w")
    fb = const(rng.uniform(-0.1, 0.1, classes), "fc_b")
    nodes.append(helper.make_node("Gemm", ["flat", fw, fb], ["logits"], transB=1, name="fc"))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax"))
    graph = helper.make_graph(
        nodes, "resnet50",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])],
        inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def build_encoder(path, rng, seq=16, hidden=32, heads=2, vocab=50):
    """A one-layer BERT-style encoder: Gather embedding of INT64 "ids" [N, seq], LayerNormalization,
    Q/K/V MatMul+Add, Reshape/Transpose into heads, scaled MatMul, Softmax, MatMul, Transpose back,
    output projection, residual Add, LayerNormalization, Gelu MLP, ReduceMean over the sequence.
    Output "pooled" [N, hidden]."""
    inits, nodes = [], []
    hd = hidden // heads

    def const(a, n, dt=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(a).astype(dt), n))
        return n

    const(rng.standard_normal((vocab, hidden)) * 0.5, "emb")
    const(rng.uniform(0.5, 1.5, hidden), "ln1_s")
    const(rng.uniform(-0.1, 0.1, hidden), "ln1_b")
    const(rng.uniform(0.5, 1.5, hidden), "ln2_s")
    const(rng.uniform(-0.1, 0.1, hidden), "ln2_b")
    for p in ("q", "k", "v", "o"):
        const(rng.standard_normal((hidden, hidden)) / np.sqrt(hidden), p + "_w")
        const(rng.uniform(-0.1, 0.1, hidden), p + "_b")
    const(rng.standard_normal((hidden, 2 * hidden)) / np.sqrt(hidden), "f1_w")
    const(rng.uniform(-0.1, 0.1, 2 * hidden), "f1_b")
    const(rng.standard_normal((2 * hidden, hidden)) / np.sqrt(2 * hidden), "f2_w")
    const([0, seq, heads, hd], "split_shape", np.int64)
    const([0, seq, hidden], "merge_shape", np.int64)
    const([1.0 / np.sqrt(hd)], "scale")
    const([1], "axis1", np.int64)
    mk = helper.make_node
    nodes += [
        mk("Gather", ["emb", "ids"], ["e"], axis=0, name="embed"),
        mk("LayerNormalization", ["e", "ln1_s", "ln1_b"], ["h"], axis=-1, epsilon=1e-5, name="ln1"),
    ]
    for p in ("q", "k", "v"):
        nodes += [
            mk("MatMul", ["h", p + "_w"], [p + "0"], name=p + "_mm"),
            mk("Add", [p + "0", p + "_b"], [p + "1"], name=p + "_bias"),
            mk("Reshape", [p + "1", "split_shape"], [p + "2"], name=p + "_split"),
            mk("Transpose", [p + "2"], [p + "3"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3], name=p + "_heads"),
        ]
    nodes += [
        mk("MatMul", ["q3", "k3"], ["s0"], name="scores"),
        mk("Mul", ["s0", "scale"], ["s1"], name="scale"),
        mk("Softmax", ["s1"], ["a"], axis=-1, name="softmax"),
        mk("MatMul", ["a", "v3"], ["c0"], name="context"),
        mk("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3], name="merge_heads"),
        mk("Reshape", ["c1", "merge_shape"], ["c2"], name="merge"),
        mk("MatMul", ["c2", "o_w"], ["o0"], name="o_mm"),
        mk("Add", ["o0", "o_b"], ["o1"], name="o_bias"),
        mk("Add", ["o1", "h"], ["r0"], name="residual"),
        mk("LayerNormalization", ["r0", "ln2_s", "ln2_b"], ["r1"], axis=-1, epsilon=1e-5, name="ln2"),
        mk("MatMul", ["r1", "f1_w"], ["f0"], name="f1"),
        mk("Add", ["f0", "f1_b"], ["f1"], name="f1_bias"),
        mk("Gelu", ["f1"], ["f2"], name="gelu"),
        mk("MatMul", ["f2", "f2_w"], ["f3"], name="f2"),
        mk("Add", ["f3", "r1"], ["f4"], name="residual2"),
        mk("ReduceMean", ["f4", "axis1"], ["pooled"], keepdims=0, name="pool"),
    ]
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", seq])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", hidden])],
        inits)
    # Gelu is in the default domain from opset 20 (ReduceMean's axes are an input since 18)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 8
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
