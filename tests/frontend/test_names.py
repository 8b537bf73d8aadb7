"""ONNX names that are not C identifiers (``gpu_0/data_0``, ``input.1``) stay the names of
``main``'s inputs, and never reach generated C/CUDA source.

Before the fix, TVM's default CUDA build of ResNet-50, ShuffleNet and ZFNet-512 (input
``gpu_0/data_0``) emitted ``float* __restrict__ gpu_0/data_0_ptr`` as a kernel parameter and
NVRTC failed with ``expected a ")"``. A tiny hand-built model reproduces it in a second.
"""

import shutil
import subprocess

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import tvm_rtask
from tvm_rtask.frontend.names import is_c_identifier, make_names_safe, safe_name, unsafe_names
from tvm_rtask.testing.onnx_light import assert_outputs_match, onnxruntime_outputs
from tvm_rtask.testing.run import run_executable

NVCC = shutil.which("nvcc")
INPUTS = ["gpu_0/data_0", "input.1"]


def _model():
    """Pad (imported as a PrimFunc already) -> Conv -> Add the second input -> Relu."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "W:0")
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], "int64"), "pads")
    nodes = [
        helper.make_node("Pad", ["gpu_0/data_0", "pads"], ["gpu_0/pad"], mode="reflect"),
        helper.make_node("Conv", ["gpu_0/pad", "W:0"], ["gpu_0/conv"]),
        helper.make_node("Add", ["gpu_0/conv", "input.1"], ["gpu_0/add"]),
        helper.make_node("Relu", ["gpu_0/add"], ["gpu_0/out:0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "names",
        [
            helper.make_tensor_value_info("gpu_0/data_0", TensorProto.FLOAT, [1, 3, 8, 8]),
            helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 4, 8, 8]),
        ],
        [helper.make_tensor_value_info("gpu_0/out:0", TensorProto.FLOAT, [1, 4, 8, 8])],
        [weight, pads],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _inputs():
    rng = np.random.default_rng(1)
    return {
        "gpu_0/data_0": rng.standard_normal((1, 3, 8, 8)).astype("float32"),
        "input.1": rng.standard_normal((1, 4, 8, 8)).astype("float32"),
    }


def _prim_func_names(mod):
    """Parameter names of every PrimFunc, and the PrimFuncs' own names."""
    names = []
    for gvar, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            names.append(gvar.name_hint)
            names += [p.name for p in func.params]
    return names


@pytest.mark.parametrize(
    "name,safe",
    [
        ("gpu_0/data_0", "gpu_0_data_0"),
        ("input.1", "input_1"),
        ("onnx::Conv_12", "onnx__Conv_12"),
        ("0", "v_0"),
        ("", "v_"),
        ("int", "int_"),
        ("données", "donn_es"),
        ("already_fine", "already_fine"),
    ],
)
def test_safe_name(name, safe):
    assert safe_name(name) == safe
    assert is_c_identifier(safe)


def test_safe_names_are_distinct():
    used = {"a_b"}
    assert safe_name("a/b", used) == "a_b_1"
    assert safe_name("a.b", used) == "a_b_2"
    assert used == {"a_b", "a_b_1", "a_b_2"}


def test_main_keeps_the_onnx_names_and_everything_else_is_safe():
    mod = tvm_rtask.frontend.load(_model())
    assert [p.name for p in mod["main"].params] == INPUTS
    assert unsafe_names(mod) == []
    # the Pad kernel exists from import on; its parameter was named after the input
    assert any(isinstance(f, tvm.tirx.PrimFunc) for f in mod.functions.values())
    assert all(is_c_identifier(n) for n in _prim_func_names(mod))
    # what TVM's default pipeline makes of it: legalized and fused kernels are safe too
    fused = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)
    assert all(is_c_identifier(n) for n in _prim_func_names(fused)), _prim_func_names(fused)
    assert unsafe_names(fused) == []
    assert [p.name for p in fused["main"].params] == INPUTS


def test_inputs_are_passed_by_their_onnx_names():
    model, inputs = _model(), _inputs()
    expected = onnxruntime_outputs(model, inputs)
    mod = tvm_rtask.frontend.load(model)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    # reversed: only the names can put them in place
    vm.set_input("main", **{k: tvm.runtime.tensor(v) for k, v in reversed(inputs.items())})
    vm.invoke_stateful("main")
    assert_outputs_match([vm.get_outputs("main").numpy()], expected, "tvm default build")
    ex = tvm_rtask.compile(mod, "llvm", policy="wavefront", num_veu=2)
    assert_outputs_match(run_executable(ex, inputs), expected, "rtask wavefront")
    report = tvm_rtask.plan(mod, "llvm", policy="wavefront", num_veu=2).report()
    assert report["ordinary_ops"] == 0, report  # the renaming binding is no operator


def test_safe_modules_are_left_alone():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    mod = tvm_rtask.frontend.load(helper.make_model(graph))
    assert make_names_safe(mod) is mod
    assert len(mod["main"].body.blocks) == 1  # no renaming block


def test_an_irmodule_is_made_safe_too():
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(_model(), keep_params_in_input=False, sanitize_input_names=False)
    assert unsafe_names(mod)  # the Pad kernel's parameter: gpu_0/data_0
    safe = tvm_rtask.frontend.load(mod)
    assert unsafe_names(safe) == []
    assert [p.name for p in safe["main"].params] == INPUTS
    assert unsafe_names(mod)  # the caller's module is unchanged


def test_relax_bindings_with_unsafe_names_are_renamed():
    """A hand-written module: a binding named ``a/b`` would name the relu kernel's input."""
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(relax.op.add(x, x), name_hint="a/b")
            out = bb.emit_output(relax.op.nn.relu(lv))
        bb.emit_func_output(out)
    mod = bb.get()
    assert unsafe_names(mod) == ["main: a/b"]
    safe = tvm_rtask.frontend.load(mod)
    assert unsafe_names(safe) == []
    legalized = relax.transform.LegalizeOps()(safe)
    assert all(is_c_identifier(n) for n in _prim_func_names(legalized))
    value = np.arange(6, dtype="float32").reshape(2, 3) - 2
    out = run_executable(tvm.compile(safe, "llvm"), {"x": value})
    np.testing.assert_array_equal(out[0], np.maximum(2 * value, 0))


def test_tvm_default_cuda_build_compiles_with_nvcc(tmp_path):
    mod = tvm_rtask.frontend.load(_model())
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    source = tvm_rtask.cuda_source(tvm.compile(mod, target=target))
    assert source, "no CUDA module in the executable"
    assert "gpu_0_data_0" in source and "gpu_0/data_0" not in source
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    cu = tmp_path / "kernels.cu"
    cu.write_text(source)
    out = subprocess.run(
        [NVCC, "-w", "-ptx", "-arch=sm_90", "-o", str(tmp_path / "kernels.ptx"), str(cu)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
