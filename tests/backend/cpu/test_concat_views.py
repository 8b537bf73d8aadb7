"""Concatenations whose inputs are written in place inside their output."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_rtask
from tvm_rtask.backend.cpu.concat_views import concat_views
from tvm_rtask.core import RKernel, ROperator
from tvm_rtask.tir.common import TensorDecl


def _op(name, func, inputs, output):
    return ROperator(name, func, list(inputs), [output], rkernels=[RKernel(f"{name}@1", 1)])


def _tensors(**shapes):
    return {n: TensorDecl(n, s, "float32") for n, s in shapes.items()}


@pytest.mark.parametrize("func", ["concatenate2", "concatenate1_join"])
def test_channel_blocks_become_views_at_their_offsets(func):
    tensors = _tensors(a=(1, 2, 3, 3), b=(1, 5, 3, 3), c=(1, 1, 3, 3), o=(1, 8, 3, 3))
    out = concat_views([_op("k", func, "abc", "o")], tensors, "abco")
    assert out.views == {"a": ("o", 0), "b": ("o", 18), "c": ("o", 63)}
    assert out.elided == {"k"}


@pytest.mark.parametrize(
    "case",
    [
        "batch",  # batch 2: each input is two blocks of the output, not one
        "fused",  # a concatenation fused with something else
        "param",  # an input the program does not own (a parameter or constant)
        "twice",  # one tensor passed twice
    ],
)
def test_what_stays_a_copy(case):
    batch = 2 if case == "batch" else 1
    tensors = _tensors(a=(batch, 2, 4), b=(batch, 3, 4), o=(batch, 5, 4))
    func = "fused_concatenate_relu" if case == "fused" else "concatenate"
    inputs = "aa" if case == "twice" else "ab"
    if case == "twice":
        tensors["o"] = TensorDecl("o", (1, 4, 4), "float32")
    local = "bo" if case == "param" else "abo"
    assert concat_views([_op("k", func, inputs, "o")], tensors, local).elided == set()


def test_a_tensor_in_two_concatenations_lives_in_the_first_and_nested_ones_chain():
    tensors = _tensors(a=(1, 2), b=(1, 2), o=(1, 4), p=(1, 6), q=(1, 4))
    ops = [
        _op("k1", "concatenate", "ab", "o"),
        _op("k2", "concatenate1", "oa", "p"),  # a is already a view of o
        _op("k3", "concatenate", "ob", "q"),  # o's block, not o
    ]
    out = concat_views(ops, tensors, "abopq")
    assert out.elided == {"k1"}
    ops = [_op("k1", "concatenate", "ab", "o"), _op("k2", "concatenate1", ["o", "x"], "p")]
    tensors.update(_tensors(x=(1, 2)))
    out = concat_views(ops, tensors, "abopqx")
    assert out.elided == {"k1", "k2"}
    assert out.views == {"a": ("p", 0), "b": ("p", 2), "o": ("p", 0), "x": ("p", 4)}


@tvm.script.ir_module
class Branches:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), "float32"), y: R.Tensor((1, 6, 6, 6), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.add(y, y)
            c = R.multiply(x, x)
            k = R.concat([a, b, c], axis=1)
            m = R.multiply(k, k)
            s = R.add(a, R.sigmoid(c))  # a and c are read again, from inside k
            k2 = R.concat([m, s], axis=1)
            e = R.nn.relu(k2)
            R.output(e)
        return e


@pytest.mark.parametrize("barrier", ["fine", "global"])
def test_views_compute_what_copies_do(barrier):
    mod = tvm_rtask.rtask_pipeline("llvm", barrier=barrier, num_veu=2, fusion="none")(Branches)
    (name,) = [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith("rprog")]
    text = mod[name].script()
    assert "concatenate" not in text  # both copies gone: k's inputs and k2's live in place
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 6, 6)).astype("float32")
    y = rng.standard_normal((1, 6, 6, 6)).astype("float32")
    expected = tvm.compile(Branches, "llvm")
    vm_ref = relax.VirtualMachine(expected, tvm.cpu())
    want = vm_ref["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    assert np.abs(want).max() > 1.0  # alive, not a comparison of zeros
    ex = tvm_rtask.compile(Branches, "llvm", barrier=barrier, num_veu=2, fusion="none")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(5):
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@tvm.script.ir_module
class ConcatOut:
    @R.function
    def main(x: R.Tensor((1, 3, 5), "float32"), y: R.Tensor((1, 2, 5), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.add(y, y)
            k = R.concat([a, b], axis=1)  # the program's output: its inputs live in it
            R.output(k)
        return k


def test_inputs_written_in_place_inside_the_programs_output():
    mod = tvm_rtask.rtask_pipeline("llvm", num_veu=2, fusion="none")(ConcatOut)
    (name,) = [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith("rprog")]
    assert "concatenate" not in mod[name].script()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 5)).astype("float32")
    y = rng.standard_normal((1, 2, 5)).astype("float32")
    ex = tvm_rtask.compile(ConcatOut, "llvm", num_veu=2, fusion="none")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y))
    np.testing.assert_array_equal(got.numpy(), np.concatenate([np.maximum(x, 0), y + y], axis=1))
