"""FuseKeepingWaves keeps independent branches independent, unlike plain FuseOps."""

import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_rtask.core import RGraph
from tvm_rtask.relax_passes import FuseKeepingWaves, extract_graph


@tvm.script.ir_module
class TwoBranches:
    @R.function
    def main(
        x: R.Tensor((8, 8), "float32"),
        w1: R.Tensor((8, 8), "float32"),
        w2: R.Tensor((8, 8), "float32"),
    ):
        with R.dataflow():
            a = R.matmul(x, w1)
            b = R.matmul(x, w2)
            c = R.add(a, b)
            d = R.nn.relu(c)
            R.output(d)
        return d


@tvm.script.ir_module
class Softmaxish:
    @R.function
    def main(x: R.Tensor((4, 16), "float32")):
        with R.dataflow():
            m = R.max(x, axis=1, keepdims=True)
            e = R.exp(R.subtract(x, m))
            s = R.sum(e, axis=1, keepdims=True)
            y = R.divide(e, s)
            R.output(y)
        return y


@tvm.script.ir_module
class DenseGelu:
    @R.function
    def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((16, 32), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            half = R.multiply(y, R.const(0.5, "float32"))
            e = R.erf(R.multiply(y, R.const(0.7071067811865476, "float32")))
            g = R.multiply(half, R.add(e, R.const(1.0, "float32")))
            R.output(g)
        return g


def _annotated(mod):
    seq = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()]
    return tvm.transform.Sequential(seq)(mod)


def _waves(mod):
    return RGraph(extract_graph(mod).operators).waves()


def test_plain_fuseops_chains_independent_branches():
    """The defect we work around: FuseOps puts one matmul behind the other."""
    fused = relax.transform.FuseTIR()(relax.transform.FuseOps()(_annotated(TwoBranches)))
    waves = _waves(fused)
    assert max(len(w) for w in waves) == 1


def test_fuse_keeping_waves_keeps_both_matmuls_in_one_wave():
    fused = FuseKeepingWaves()(_annotated(TwoBranches))
    waves = _waves(fused)
    assert len(waves[0]) == 2
    funcs = {op.func for op in extract_graph(fused).operators if op.name in waves[0]}
    assert all("matmul" in f for f in funcs)


def test_ordered_joins_still_fuse():
    """Softmax joins an op with its own ancestor: no parallelism to lose, so it fuses."""
    plain = _annotated(Softmaxish)
    fused = FuseKeepingWaves()(plain)
    assert len(extract_graph(fused).operators) < len(extract_graph(plain).operators)


def test_the_relu_after_an_elementwise_join_fuses_with_it():
    """The join stays out of both branches, and what follows it elementwise joins it: the
    ReLU is not a pass of its own (ResNet's downsampling blocks)."""
    fused = FuseKeepingWaves()(_annotated(TwoBranches))
    ops = extract_graph(fused).operators
    names = [op.name for op in ops]
    assert len(ops) == 3, names
    assert sum("matmul" in n for n in names) == 2
    (join,) = [n for n in names if "matmul" not in n]
    assert "add" in join and "relu" in join, names


def test_a_join_of_elementwise_branches_fuses_gelu_into_the_dense_layer():
    """GELU joins ``0.5 y`` and ``1 + erf(y / sqrt 2)``: unordered producers, but only
    elementwise operators since the branches parted, so nothing runs beside anything and the
    whole of it is the dense layer's epilogue (kept apart: four passes over memory)."""
    plain = _annotated(DenseGelu)
    ops = extract_graph(FuseKeepingWaves()(plain)).operators
    assert len(ops) == 1, [op.name for op in ops]
    assert "matmul" in ops[0].func and "erf" in ops[0].func


def test_on_a_cpu_the_elementwise_join_is_a_producers_epilogue():
    """``fuse_elementwise_joins`` (the CPU's pipeline): the residual add and its ReLU fuse
    into one matmul, not a pass of their own; a concatenation join would still stay apart."""
    fused = FuseKeepingWaves(fuse_elementwise_joins=True)(_annotated(TwoBranches))
    funcs = [op.func for op in extract_graph(fused).operators]
    assert len(funcs) == 2, funcs
    assert sum("add" in f and "relu" in f and "matmul" in f for f in funcs) == 1, funcs


def test_on_a_cpu_a_join_with_a_plain_elementwise_branch_stays_apart():
    """``relu(conv(x)) + relu(x)``: fused, the ReLU of ``x`` would enter the convolution's
    group and the convolution rules would decline it; the join stays a kernel of its own."""
    from tests.relax_passes.models import TwoBranches as ConvAndRelu

    fused = FuseKeepingWaves(fuse_elementwise_joins=True)(_annotated(ConvAndRelu))
    funcs = [op.func for op in extract_graph(fused).operators]
    assert any("join" in f for f in funcs), funcs
    assert not any("conv2d" in f and "add" in f for f in funcs), funcs
