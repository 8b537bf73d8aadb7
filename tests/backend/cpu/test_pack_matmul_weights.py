"""PackMatmulWeights: constant matmul weights as column panels, the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.backend.cpu.rules.common import called_names
from tvm_rtask.backend.cpu.pack_matmul_weights import (
    PACKED_NAME,
    PackMatmulWeights,
    pack_weight,
    padded_panels,
    panel_width,
)


def _module(x_shape, weight, transposed=False, weight_param=False):
    """``x @ W`` (+ bias), ``W`` a constant (or ``permute_dims`` of one, or a parameter)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    params = [x]
    if weight_param:
        w = relax.Var("w", relax.TensorType(weight.shape, "float32"))
        params.append(w)
    with bb.function("main", params):
        with bb.dataflow():
            if weight_param:
                rhs = w
            elif transposed:
                rhs = bb.emit(relax.op.permute_dims(relax.const(weight.T.copy()), [1, 0]))
            else:
                rhs = relax.const(weight)
            y = bb.emit(relax.op.matmul(x, rhs))
            bias = relax.const(np.linspace(-1, 1, weight.shape[1], dtype="float32"))
            out = bb.emit_output(relax.op.add(y, bias))
        bb.emit_func_output(out)
    return bb.get()


def test_pack_weight_puts_each_panel_contiguous():
    weight = np.arange(6 * 12, dtype="float32").reshape(6, 12)
    packed = pack_weight(weight, 4)
    assert packed.shape == (3, 6, 4) and packed.flags["C_CONTIGUOUS"]
    for n in range(12):
        for k in range(6):
            assert packed[n // 4, k, n % 4] == weight[k, n]


@pytest.mark.parametrize(
    "n, lanes, width",
    [(3072, 16, 64), (96, 16, 32), (48, 16, 16), (1000, 16, None), (1000, 8, 8), (8, 16, None)],
)
def test_panel_width_is_the_widest_of_four_two_or_one_vectors(n, lanes, width):
    assert panel_width(n, lanes) == width


@pytest.mark.parametrize("transposed", [False, True], ids=["kn", "gemm_transb"])
def test_constant_weights_become_packedcalled_names(transposed):
    weight = np.random.default_rng(0).standard_normal((32, 128)).astype("float32")
    mod = PackMatmulWeights(16)(_module((1, 13, 32), weight, transposed))
    calls = called_names(mod)
    assert PACKED_NAME in calls and "relax.matmul" not in calls
    (call,) = [
        b.value
        for b in mod["main"].body.blocks[0].bindings
        if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir"
    ]
    packed = call.args[1].fields[1]  # call_tir(matmul_packed, (x, Wp))
    assert tuple(int(d) for d in packed.ty.shape) == (2, 32, 64)


@pytest.mark.parametrize(
    "x_shape, weight_shape, weight_param",
    [
        ((1, 13, 32), (32, 64), False),  # one panel: already contiguous
        ((1, 13, 32), (32, 40), False),  # no vector count divides 40 columns
        ((1, 13, 32), (32, 128), True),  # not a constant
    ],
)
def test_weights_it_cannot_or_need_not_pack_are_left_alone(x_shape, weight_shape, weight_param):
    weight = np.ones(weight_shape, "float32")
    mod = _module(x_shape, weight, weight_param=weight_param)
    assert "relax.matmul" in called_names(PackMatmulWeights(16)(mod))


@pytest.mark.parametrize("x_shape", [(1, 13, 32), (13, 1, 32), (13, 32)])
def test_packed_build_gives_bitwise_the_same_outputs(x_shape):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((32, 128)).astype("float32")
    mod = _module(x_shape, weight)
    x = tvm.runtime.tensor(rng.standard_normal(x_shape).astype("float32"))
    outputs = []
    for variant in (mod, PackMatmulWeights(16)(mod)):
        vm = relax.VirtualMachine(tvm.compile(variant, "llvm"), tvm.cpu())
        outputs.append(vm["main"](x).numpy())
    assert np.abs(outputs[0]).max() > 1.0  # alive
    np.testing.assert_array_equal(outputs[0], outputs[1])


@pytest.mark.parametrize(
    "n, lanes, found",
    [(1000, 16, (64, 1024)), (1000, 8, (32, 1024)), (100, 16, (16, 112)), (40, 16, None)],
)
def test_padded_panels_take_the_widest_that_wastes_little(n, lanes, found):
    assert padded_panels(n, lanes) == found


def test_pack_weight_pads_the_last_panel_with_zeros():
    weight = np.arange(3 * 10, dtype="float32").reshape(3, 10) + 1
    packed = pack_weight(weight, 4)
    assert packed.shape == (3, 3, 4)
    assert not packed[2, :, 2:].any() and packed[2, :, :2].all()


@pytest.mark.parametrize("x_shape", [(1, 100), (1, 7, 100)])
def test_padded_weights_are_packed_and_sliced_back(x_shape):
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((100, 1000)).astype("float32")
    mod = _module(x_shape, weight)
    packed = PackMatmulWeights(16)(mod)
    calls = called_names(packed)
    assert PACKED_NAME in calls and "relax.strided_slice" in calls
    assert "relax.matmul" not in calls
    x = tvm.runtime.tensor(rng.standard_normal(x_shape).astype("float32"))
    outputs = []
    for variant in (mod, packed):
        vm = relax.VirtualMachine(tvm.compile(variant, "llvm"), tvm.cpu())
        outputs.append(vm["main"](x).numpy())
    assert outputs[1].shape == (*x_shape[:-1], 1000)
    assert np.abs(outputs[0]).max() > 1.0  # alive
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_padded_product_is_fused_with_nothing():
    """The slice fused into the product is an epilogue MatmulKN cannot inline: the product
    would run unscheduled. The bias add fuses into the slice instead."""
    weight = np.ones((100, 1000), "float32")
    mod = PackMatmulWeights(16)(_module((1, 100), weight))
    mod = tvm.ir.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)
    names = sorted(gv.name_hint for gv, f in mod.functions.items() if gv.name_hint != "main")
    assert PACKED_NAME in names and any("strided_slice" in n and "add" in n for n in names)
    assert not any(PACKED_NAME in n and n != PACKED_NAME for n in names)
