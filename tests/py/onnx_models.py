"""onnx_models.py - ResNet and BERT-encoder graphs with random weights, built with python3-onnx's
helpers, for bench/onnx.py and tests/py/test_onnx_models.py. Both are written the way exporters
write them at opset 13 (torchvision's ResNet: Conv, BatchNormalization, Relu, MaxPool, the
residual Add, GlobalAveragePool, Flatten, Gemm; a BERT encoder as PyTorch exported it before
opset 17: LayerNormalization spelled out as ReduceMean/Sub/Pow/Sqrt/Div, GELU as Erf, attention
as Reshape/Transpose/MatMul/Softmax, the reshape targets computed from Shape(x) per call as
PyTorch writes x.view(x.size(0), x.size(1), heads, -1)). OpenCV 4.6's DNN module runs the ResNet file; it cannot
run the BERT one (it mis-shapes ReduceMean over the last axis of a 3-D tensor and refuses the
broadcasting Sub of LayerNormalization), so numpy_run below, a plain numpy evaluation of the
graph's nodes in float64, is the independent reference for it.

The BERT graph takes the embeddings rather than token ids (the encoder layers are what costs, and
OpenCV's importer has no int64 Gather of embeddings), as "hidden" FLOAT [N, 1, S, H] reshaped to
[N, S, H] first: OpenCV's Python binding reads a 3-D numpy array as an image with channels.

Weights are N(0, 1/fan_in) so activations stay of order 1 through the depth (with BatchNorm's
random statistics near identity), which keeps comparisons between executors meaningful."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


class _G:
    def __init__(self, rng):
        self.rng, self.nodes, self.inits, self.n = rng, [], [], 0

    def name(self, p):
        self.n += 1
        return f"{p}{self.n}"

    def const(self, a, p="w"):
        n = self.name(p)
        self.inits.append(numpy_helper.from_array(np.asarray(a), n))
        return n

    def weight(self, shape, fan_in):
        return self.const((self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))

    def node(self, op, ins, **attrs):
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def model(self, name, inputs, outputs, opset=13):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 7
        return m


def _conv_bn(g, x, cin, cout, k, stride, relu=True):
    w = g.weight((cout, cin, k, k), cin * k * k)
    y = g.node("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    r = g.rng
    c = cout
    bn = [g.const(r.uniform(0.8, 1.2, c).astype(np.float32)), g.const(r.uniform(-0.1, 0.1, c).astype(np.float32)),
          g.const(r.uniform(-0.1, 0.1, c).astype(np.float32)), g.const(r.uniform(0.8, 1.2, c).astype(np.float32))]
    y = g.node("BatchNormalization", [y] + bn, epsilon=1e-5)
    return g.node("Relu", [y]) if relu else y


def build_resnet(path, rng, blocks=(3, 4, 6, 3), width=64, size=224, classes=1000):
    """ResNet-50 by default (bottleneck blocks 3-4-6-3, 224x224, 1000 classes); smaller
    blocks/width/size give the same structure for tests."""
    g = _G(rng)
    x = _conv_bn(g, "image", 3, width, 7, 2)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, n in enumerate(blocks):
        mid = width * 2 ** stage
        cout = mid * 4
        for b in range(n):
            stride = 2 if stage > 0 and b == 0 else 1
            y = _conv_bn(g, x, cin, mid, 1, 1)
            y = _conv_bn(g, y, mid, mid, 3, stride)
            y = _conv_bn(g, y, mid, cout, 1, 1, relu=False)
            sc = _conv_bn(g, x, cin, cout, 1, stride, relu=False) if b == 0 else x
            x = g.node("Relu", [g.node("Add", [y, sc])])
            cin = cout
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    logits = g.node("Gemm", [x, g.weight((classes, cin), cin), g.const(np.zeros(classes, np.float32))],
                    transB=1)
    g.nodes[-1].output[0] = "logits"
    m = g.model("resnet", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, size, size])],
                [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])])
    del logits
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def _layer_norm(g, x, h):
    mean = g.node("ReduceMean", [x], axes=[-1], keepdims=1)
    d = g.node("Sub", [x, mean])
    var = g.node("ReduceMean", [g.node("Pow", [d, g.const(np.float32(2.0))])], axes=[-1], keepdims=1)
    std = g.node("Sqrt", [g.node("Add", [var, g.const(np.float32(1e-12))])])
    y = g.node("Div", [d, std])
    y = g.node("Mul", [y, g.const(g.rng.uniform(0.8, 1.2, h).astype(np.float32))])
    return g.node("Add", [y, g.const(g.rng.uniform(-0.1, 0.1, h).astype(np.float32))])


def _dense(g, x, hin, hout):
    y = g.node("MatMul", [x, g.weight((hin, hout), hin)])
    return g.node("Add", [y, g.const(g.rng.uniform(-0.1, 0.1, hout).astype(np.float32))])


def build_bert(path, rng, layers=12, hidden=768, heads=12, seq=128, ffn=None):
    """A BERT-base encoder by default (12 layers, hidden 768, 12 heads, FFN 3072, 128 tokens)."""
    ffn = ffn or 4 * hidden
    g = _G(rng)
    hd = hidden // heads
    x = g.node("Reshape", ["hidden", g.const(np.array([0, seq, hidden], np.int64), "shape")])

    def dims_of(t, tail):
        # x.view(x.size(0), x.size(1), *tail) as PyTorch exports it: Shape, Gather, Unsqueeze,
        # Concat (the batch size is known only per call; Sampan folds the chain at load).
        sh = g.node("Shape", [t])
        parts = [g.node("Unsqueeze", [g.node("Gather", [sh, g.const(np.array(i, np.int64), "i")], axis=0),
                                      g.const(np.array([0], np.int64), "axes")]) for i in (0, 1)]
        return g.node("Concat", parts + [g.const(np.array(tail, np.int64), "tail")], axis=0)

    for _ in range(layers):
        def heads_of(t, perm=(0, 2, 1, 3)):
            return g.node("Transpose", [g.node("Reshape", [t, dims_of(t, [heads, hd])])], perm=list(perm))
        q = heads_of(_dense(g, x, hidden, hidden))
        k = heads_of(_dense(g, x, hidden, hidden), (0, 2, 3, 1))
        v = heads_of(_dense(g, x, hidden, hidden))
        s = g.node("Div", [g.node("MatMul", [q, k]), g.const(np.float32(np.sqrt(hd)))])
        p = g.node("Softmax", [s], axis=-1)
        a = g.node("Transpose", [g.node("MatMul", [p, v])], perm=[0, 2, 1, 3])
        a = _dense(g, g.node("Reshape", [a, dims_of(x, [hidden])]), hidden, hidden)
        x = _layer_norm(g, g.node("Add", [a, x]), hidden)
        f = _dense(g, x, hidden, ffn)
        # GELU (erf form): 0.5 * f * (1 + erf(f / sqrt(2)))
        e = g.node("Erf", [g.node("Div", [f, g.const(np.float32(np.sqrt(2.0)))])])
        f = g.node("Mul", [g.node("Mul", [f, g.node("Add", [e, g.const(np.float32(1.0))])]),
                           g.const(np.float32(0.5))])
        f = _dense(g, f, ffn, hidden)
        x = _layer_norm(g, g.node("Add", [f, x]), hidden)
    g.nodes[-1].output[0] = "encoded"
    m = g.model("bert", [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", 1, seq, hidden])],
                [helper.make_tensor_value_info("encoded", TensorProto.FLOAT, ["N", seq, hidden])])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def numpy_run(path, feeds):
    """Evaluate the graph at path (the operators these builders use) in float64 with numpy."""
    import math

    import onnx
    m = onnx.load(path)
    env = {t.name: numpy_helper.to_array(t).astype(np.float64) if numpy_helper.to_array(t).dtype.kind == "f"
           else numpy_helper.to_array(t) for t in m.graph.initializer}
    env.update({k: v.astype(np.float64) for k, v in feeds.items()})
    try:  # SciPy's erf is float64-exact and vectorised (BERT-base has 9.4M GELUs per sequence pair)
        from scipy.special import erf
    except ImportError:
        erf = np.vectorize(math.erf)
    for n in m.graph.node:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        i = [env[x] for x in n.input]
        op = n.op_type
        if op in ("Add", "Sub", "Mul", "Div", "Pow"):
            y = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}[op](*i)
        elif op == "MatMul":
            y = np.matmul(i[0], i[1])
        elif op == "Gemm":
            y = i[0] @ (i[1].T if a.get("transB") else i[1]) + (i[2] if len(i) > 2 else 0)
        elif op == "Relu":
            y = np.maximum(i[0], 0)
        elif op in ("Sqrt", "Erf"):
            y = np.sqrt(i[0]) if op == "Sqrt" else erf(i[0])
        elif op == "Shape":
            y = np.array(i[0].shape, np.int64)
        elif op == "Gather":
            y = np.take(i[0], i[1], axis=a.get("axis", 0))
        elif op == "Unsqueeze":
            y = np.expand_dims(i[0], tuple(i[1].tolist()))
        elif op == "Concat":
            y = np.concatenate(i, axis=a["axis"])
        elif op == "Reshape":
            shape = [i[0].shape[k] if d == 0 else d for k, d in enumerate(i[1].tolist())]
            y = i[0].reshape(shape)
        elif op == "Transpose":
            y = np.transpose(i[0], a["perm"])
        elif op == "ReduceMean":
            y = i[0].mean(axis=tuple(a["axes"]), keepdims=bool(a.get("keepdims", 1)))
        elif op == "Softmax":
            e = np.exp(i[0] - i[0].max(axis=a.get("axis", -1), keepdims=True))
            y = e / e.sum(axis=a.get("axis", -1), keepdims=True)
        else:
            raise ValueError(f"numpy_run: no {op}")
        env[n.output[0]] = y
    return {o.name: env[o.name] for o in m.graph.output}
