"""The CPU rules inside tvm-rtask against ONNX Runtime: one ONNX model whose branches are
convolutions of odd shapes (tails, stride 2, padding, groups, depthwise, 1x1) and a dense
layer, compiled once for this machine's CPU (``llvm-native``); every output within 1e-4 of
ONNX Runtime's, and every branch scheduled by the rule meant for it."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# name: (cin, cout, size, kernel, stride, pad, groups)
CONVS = {
    "c27": (16, 32, 27, 3, 1, 1, 1),  # 27 columns: 16 + a shifted 16
    "c13_1x1": (48, 64, 13, 1, 1, 0, 1),  # one pixel axis of 169
    "c_s2": (3, 16, 35, 3, 2, 0, 1),  # 17 strided columns
    "c_s2_narrow": (64, 32, 14, 1, 2, 0, 1),  # 7 strided columns: de-interleaved copy
    "c_pad2": (8, 24, 11, 5, 1, 2, 1),  # 11 columns, narrower than a vector
    "c_grouped": (16, 32, 19, 3, 1, 1, 4),
    "c_depthwise": (24, 24, 20, 3, 1, 1, 24),
    "c_depthwise_s2": (32, 32, 29, 5, 2, 2, 32),  # 15 strided columns, phase copy
}
DENSE = (1, 96, 250)  # m, k, n: 250 columns, the last tile shifted


def _model():
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], []
    for name, (cin, cout, size, k, s, p, g) in CONVS.items():
        out = (size + 2 * p - k) // s + 1
        w = np.sqrt(2.0 / (cin // g * k * k)) * rng.standard_normal((cout, cin // g, k, k))
        inits += [
            numpy_helper.from_array(w.astype(np.float32), f"{name}_w"),
            numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), f"{name}_b"),
        ]
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, cin, size, size]))
        outputs.append(
            helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, cout, out, out])
        )
        nodes += [
            helper.make_node(
                "Conv",
                [name, f"{name}_w", f"{name}_b"],
                [f"{name}_c"],
                kernel_shape=[k, k],
                strides=[s, s],
                pads=[p] * 4,
                group=g,
            ),
            helper.make_node("Relu", [f"{name}_c"], [f"{name}_y"]),
        ]
    m, k, n = DENSE
    inputs.append(helper.make_tensor_value_info("d", TensorProto.FLOAT, [m, k]))
    outputs.append(helper.make_tensor_value_info("d_y", TensorProto.FLOAT, [m, n]))
    inits += [
        numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "d_w"),
        numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "d_b"),
    ]
    nodes.append(helper.make_node("Gemm", ["d", "d_w", "d_b"], ["d_y"]))
    graph = helper.make_graph(nodes, "odd_shapes", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_odd_shapes_match_onnxruntime_on_this_cpu():
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.backend import as_target
    from tvm_rtask.backend.cpu.rules import RULE_ATTR, schedule_cpu_func
    from tvm_rtask.relax_passes import RTaskPrepare
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs, random_inputs, relative_error

    model = _model()
    inputs = random_inputs(model)
    reference = onnxruntime_outputs(model, inputs)
    mod = tvm_rtask.frontend.load(model)
    target = as_target("llvm-native")
    with target:
        prepared = RTaskPrepare()(mod)
    rules = {}
    for gv, func in prepared.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            scheduled = schedule_cpu_func(func, target)
            rules[gv.name_hint] = None if scheduled is None else str(scheduled.attrs[RULE_ATTR])
    conv_rules = [
        r for r in rules.values() if r in ("Conv2dNCHW", "Conv2dPackedNCHW", "DepthwiseConv2dNCHW")
    ]
    assert len(conv_rules) == len(CONVS) and "MatmulKN" in rules.values(), rules
    # spatial convolutions with whole vectors of output channels went through the packed
    # weights (backend/cpu/pack_conv_weights.py), depthwise ones through their own rule,
    # the others through Conv2dNCHW
    assert {"Conv2dNCHW", "Conv2dPackedNCHW", "DepthwiseConv2dNCHW"} <= set(conv_rules), rules

    ex = tvm_rtask.compile(mod, target, policy="wavefront", num_veu=2)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v) for v in inputs.values()]
    )
    outs = [o.numpy() for o in out]
    assert len(outs) == len(reference)
    for name, actual, expected in zip([*CONVS, "dense"], outs, reference, strict=True):
        assert relative_error(actual, expected) < 1e-4, name
