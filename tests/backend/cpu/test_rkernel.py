"""CPU rKernels: chunk loops, rTask counts, and numerics equal to the original operator."""

import numpy as np
import pytest
import tvm
from tvm.script import relax as R

from tvm_rtask.backend.cpu.rkernel import CHUNK_ANNOTATION, make_cpu_rkernel, make_cpu_rkernels
from tvm_rtask.relax_passes import prepare_pipeline


@tvm.script.ir_module
class ConvBiasRelu:
    @R.function
    def main(
        x: R.Tensor((1, 8, 12, 12), "float32"),
        w: R.Tensor((16, 8, 3, 3), "float32"),
        b: R.Tensor((1, 16, 1, 1), "float32"),
    ):
        with R.dataflow():
            y = R.nn.relu(R.add(R.nn.conv2d(x, w, padding=1), b))
            R.output(y)
        return y


def _fused_func():
    mod = prepare_pipeline()(ConvBiasRelu)
    (name,) = [g.name_hint for g in mod.get_global_vars() if g.name_hint != "main"]
    return mod[name]


@pytest.mark.parametrize("max_rtasks", [1, 3, 4, 16, 1000])
def test_rkernel_matches_operator(max_rtasks):
    func = _fused_func()
    kernel = make_cpu_rkernel(func, max_rtasks)
    assert 1 <= kernel.num_rtasks <= max(max_rtasks, 1)
    if max_rtasks > 1:
        assert kernel.num_rtasks > 1
        assert CHUNK_ANNOTATION in kernel.func.script()
    _assert_same_numbers(func, kernel.func)


def _assert_same_numbers(func, cut):
    """``cut`` computes what ``func`` computes (its output starts as NaN, so an element it
    does not write fails)."""
    rng = np.random.default_rng(0)
    args = [
        rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params
    ]
    args[-1][...] = np.nan
    results = []
    for f in (func, cut):
        lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), "llvm")
        tensors = [tvm.runtime.tensor(a) for a in args]
        lib["main"](*tensors)
        results.append(tensors[-1].numpy())
    assert not np.isnan(results[0]).any()
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-5)


def test_rtask_count_bounded_by_spatial_extent_and_request():
    spatial = 1 * 16 * 12 * 12  # N*C*H*W of the output
    kernel = make_cpu_rkernel(_fused_func(), 1000)
    assert kernel.num_rtasks <= 1000
    chunk = -(-spatial // 1000)
    assert kernel.num_rtasks == -(-spatial // chunk)
    assert make_cpu_rkernel(_fused_func(), 10**6).num_rtasks == spatial


def _pool_and_join(second_pool: bool):
    """avg_pool(a) joined with avg_pool(b) (two unrelated reductions) or with b itself."""
    from tvm import te, topi

    a = te.placeholder((1, 4, 8, 8), name="a")
    b = te.placeholder((1, 4, 8, 8), name="b")
    p1 = topi.nn.pool2d(a, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "avg", layout="NCHW")
    other = b
    if second_pool:
        other = topi.nn.pool2d(b, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "avg", layout="NCHW")
    out = te.compute(p1.shape, lambda *i: p1(*i) + other(*i), name="join")
    return te.create_prim_func([a, b, out])


@pytest.mark.parametrize("second_pool", [False, True])
def test_unrelated_reductions_are_cut_under_their_join(second_pool):
    # the second pooling neither feeds nor follows the first: cutting along the first one's
    # loop computed it over the wrong region per rTask (NASNet, FusionStitching groups); both
    # are computed under the join's loops instead, each over the region the join's rTask reads
    func = _pool_and_join(second_pool=second_pool)
    kernel = make_cpu_rkernel(func, 4)
    assert kernel.num_rtasks == 4
    _assert_same_numbers(func, kernel.func)


def test_one_rtask_has_its_injective_blocks_inlined_as_several():
    """The one-rTask variant (one vEU, or a wave that already fills them) inlines the bias
    add and relu into the write-back as the cut variants do: not three passes over memory."""
    func = _fused_func()
    one, cut = make_cpu_rkernel(func, 1), make_cpu_rkernel(func, 4)
    assert one.num_rtasks == 1 and cut.num_rtasks > 1
    blocks = one.func.script().count("T.sblock(")
    assert blocks == cut.func.script().count("T.sblock(")
    assert blocks < func.script().count("T.sblock(")


def test_one_preparation_cuts_every_bound_as_alone():
    """The inlined, gathered schedule serves every bound: each cut starts from it, not from
    the previous bound's fused and split loops."""
    import tvm_ffi

    func = _fused_func()
    bounds = [16, 4, 1, 3, 1000]
    together = make_cpu_rkernels(func, bounds)
    for bound, kernel in zip(bounds, together, strict=True):
        alone = make_cpu_rkernels(func, [bound])[0]
        assert kernel.num_rtasks == alone.num_rtasks
        assert tvm_ffi.structural_equal(kernel.func, alone.func)
    assert [k.num_rtasks for k in together][:3] == [16, 4, 1]
    assert func.script().count("T.sblock(") > together[0].func.script().count("T.sblock(")
