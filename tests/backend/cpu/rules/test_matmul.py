"""MatmulKN: products with a ``[k, n]`` right operand (dense layers) against TVM's
unscheduled build: a last column tile shifted back, rows tiles, batches, epilogues."""

import pytest

from tests.backend.cpu.rules.common import (
    HASWELL,
    LLVM,
    NATIVE,
    assert_close,
    fused_func,
    matmul_module,
    random_args,
    run,
    stack_reloads,
)
from tvm_rtask.backend.cpu.rules import RULE_ATTR, MatmulKN, schedule_cpu_func
from tvm_rtask.backend.cpu.tuned import make_tuned_cpu_rkernel, outer_parallel_extent

CASES = {
    # name: (m, k, n, batch, bias, relu)
    "dense_1000": (1, 64, 1000, None, True, False),  # Inception's classifier, narrow k
    "rows_odd_n": (4, 37, 20, None, True, True),  # 20 columns: 16 + a shifted 16
    "batched": (3, 16, 24, 2, False, False),
    "narrow": (2, 8, 5, None, True, False),  # fewer columns than a vector
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
def test_rule_matches_unscheduled_build(case, target):
    func = fused_func(matmul_module(*CASES[case]))
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target))


def test_cut_into_rtasks():
    func = fused_func(matmul_module(1, 64, 1000))
    scheduled = schedule_cpu_func(func, LLVM)
    # plain llvm: 8 lanes, 16 registers: 1000 columns in tiles of 2 x 8 lanes
    assert outer_parallel_extent(scheduled) == 63
    kernel = make_tuned_cpu_rkernel(scheduled, 4)
    assert kernel.num_rtasks == 4
    args = random_args(func)
    assert_close(run(kernel.func, args), run(func, args))


def test_declines_other_products():
    from tvm import te, tirx

    x = te.placeholder((2, 16), "float32", "x")
    w = te.placeholder((8, 16), "float32", "w")
    k = te.reduce_axis((0, 16), "k")
    # x @ w.T: the reduction innermost in both operands (dlight's GEMV layout)
    y = te.compute((2, 8), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="nt")
    func = te.create_prim_func([x, w, y])
    assert isinstance(func, tirx.PrimFunc)
    assert MatmulKN().apply(func, LLVM, False) is None


def _packed_func(target, m, k, n, batch=None, lanes=None, registers=None):
    """The fused PrimFunc of ``x @ W + b`` after ``PackMatmulWeights`` (``W`` constant);
    ``batch``: one leading dimension's extent, or a tuple of them."""
    import numpy as np
    from tvm import relax

    from tvm_rtask.backend.cpu.pack_matmul_weights import PackMatmulWeights
    from tvm_rtask.backend.cpu.rules.base import vector_lanes, vector_registers

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    lead = batch if isinstance(batch, tuple) else (batch,) if batch else ()
    x = relax.Var("x", relax.TensorType((*lead, m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((k, n), "float32"))))
            bias = relax.const(rng.standard_normal((n,), "float32"))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, bias)))
        bb.emit_func_output(out)
    lanes = lanes or vector_lanes(target)
    registers = registers or vector_registers(target)
    return fused_func(PackMatmulWeights(lanes, registers)(bb.get()))


@pytest.mark.parametrize(
    "m, k, n, batch",
    [
        (13, 24, 256, None),  # 13 rows: the last row tile overlaps the one before
        (1, 24, 256, 13),  # [13, 1, K]: the batch tiled as rows
        (5, 16, 96, 2),  # batches that read the same weight
        (7, 24, 128, (1, 7)),  # channels-last [1, 7, 7, K]: 49 rows, one matrix
    ],
    ids=["prime_rows", "rows_as_batch", "batched", "channels_last"],
)
@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
def test_packed_weights_are_scheduled_and_match(m, k, n, batch, target):
    func = _packed_func(target, m, k, n, batch)
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target))


@pytest.mark.parametrize("m, prefetched", [(13, True), (50, True), (197, False)])
def test_products_of_few_rows_prefetch_the_next_panel(m, prefetched):
    """Few rows: the loop over k prefetches the next panel, never past the last one."""
    from tvm_rtask.backend.cpu.rules.base import panel_vectors, vector_lanes, vector_registers

    func = _packed_func(NATIVE, m, 24, 256)
    scheduled = schedule_cpu_func(func, NATIVE)
    assert str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    text = scheduled.script()
    assert ("llvm.prefetch" in text) == prefetched
    if prefetched:  # 256 columns in panels, the next one clamped to the last
        panels = 256 // (panel_vectors(vector_registers(NATIVE)) * vector_lanes(NATIVE))
        assert "T.min(" in text and f"T.int64({panels - 1})" in text
        args = random_args(func)
        assert_close(run(scheduled, args, NATIVE), run(func, args, NATIVE))


def test_panels_packed_for_narrower_vectors_are_still_scheduled():
    """A module packed for 8-lane vectors (plain llvm) scheduled for this machine's CPU."""
    func = _packed_func(NATIVE, 3, 16, 1000, lanes=8)  # 1000 columns: panels of 8
    scheduled = schedule_cpu_func(func, NATIVE)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    args = random_args(func)
    assert_close(run(scheduled, args, NATIVE), run(func, args, NATIVE))


def _batched_product(batch, m, k, n):
    """``a[1, batch, m, k] @ b[1, batch, k, n]``: attention's products, no operand shared."""
    from tvm import relax

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((1, batch, m, k), "float32"))
    b = relax.Var("b", relax.TensorType((1, batch, k, n), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, b))
        bb.emit_func_output(out)
    return fused_func(bb.get())


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
@pytest.mark.parametrize(
    "batch, m, k, n, by_batch",
    [(6, 13, 8, 37, True), (6, 37, 37, 16, True), (2, 13, 8, 37, False)],
    ids=["scores", "values", "two_batches"],
)
def test_products_of_many_batches_run_by_batch_and_match(batch, m, k, n, by_batch, target):
    func = _batched_product(batch, m, k, n)
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    if by_batch:
        assert outer_parallel_extent(scheduled) == batch
    else:
        assert outer_parallel_extent(scheduled) != batch
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target))


def test_a_transcendental_epilogue_keeps_its_write_back_loops():
    # GELU's erf, rewritten by fast_math, is dozens of vector instructions: unrolled over a
    # 6-row tile of 4 vectors it was 0.85 s of LLVM per dense layer (ConvNeXt-T)
    import tvm_ffi
    from tvm import tirx

    func = fused_func(matmul_module(12, 64, 96, bias=False, gelu=True))
    scheduled = schedule_cpu_func(func, NATIVE)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    unrolled_math = []

    def visit(loop):
        if loop.kind == tirx.ForKind.UNROLLED:
            tvm_ffi.structural_walk(loop.body, (tirx.Let, unrolled_math.append))

    tvm_ffi.structural_walk(scheduled.body, (tirx.For, visit))
    assert unrolled_math == []
    args = random_args(func)
    assert_close(run(scheduled, args, NATIVE), run(func, args, NATIVE), tol=1e-4)


def _row_tiles(scheduled) -> list[int]:
    """Extents of the loops the rule made over row tiles (``*_0`` under the parallel one)."""
    from tvm import tirx

    found = []

    def visit(loop):
        if loop.kind == tirx.ForKind.SERIAL and loop.loop_var.name.endswith("_0"):
            found.append(int(loop.extent))

    import tvm_ffi

    tvm_ffi.structural_walk(scheduled.body, (tirx.For, visit))
    return found


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain"])
def test_channels_last_rows_are_tiled_as_one_matrix(packed):
    """``x[1, 7, 7, K] @ W``: 49 rows in tiles of six (nine tiles, the last overlapping),
    not two overlapping tiles for each 7 rows (14 tiles: 12 rows computed for 7)."""
    if packed:
        func = _packed_func(NATIVE, 7, 24, 128, (1, 7))
    else:
        func = fused_func(matmul_module(7, 24, 128, batch=7, gelu=True))
    scheduled = schedule_cpu_func(func, NATIVE)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    assert -(-49 // 6) in _row_tiles(scheduled), scheduled.script()
    args = random_args(func)
    assert_close(run(scheduled, args, NATIVE), run(func, args, NATIVE), tol=1e-4)


@pytest.mark.parametrize("target", [LLVM, NATIVE], ids=["llvm", "native"])
def test_channels_last_column_tiles_are_the_packed_panels(target):
    """``x[1, 4, 4, K] @ W`` with ``W`` packed in panels of four vectors: the flattened rows
    keep the panel as the column tile, so the parallel loop runs one iteration a panel.
    Read after flattening, the panel width was lost and the tiles were chosen as for an
    unpacked weight (three vectors across four-vector panels: ConvNeXt-T's 768 -> 192 layer
    4.2x slower in the model)."""
    from tvm_rtask.backend.cpu.rules.base import panel_vectors, vector_lanes, vector_registers

    panel = panel_vectors(vector_registers(target)) * vector_lanes(target)
    n = 3 * panel  # a tile of three vectors would be chosen for an unpacked weight
    func = _packed_func(target, 4, 24, n, (1, 4))
    scheduled = schedule_cpu_func(func, target)
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "MatmulKN"
    assert outer_parallel_extent(scheduled) == 3
    args = random_args(func)
    assert_close(run(scheduled, args, target), run(func, args, target), tol=1e-4)


@pytest.mark.parametrize("m, k, n", [(49, 512, 768), (197, 384, 1536)])
def test_avx2_tile_fits_its_sixteen_registers(m, k, n):
    """On a 16-register target the panels and the tile leave the accumulators in registers:
    no ymm reload from the stack. The tile of four rows of four vectors (16 accumulators,
    the limits before) reloads them; the check would see it."""
    from tvm_rtask.backend.cpu.rules.base import vector_lanes, vector_registers

    assert (vector_lanes(HASWELL), vector_registers(HASWELL)) == (8, 16)
    func = _packed_func(HASWELL, m, k, n)
    assert stack_reloads(MatmulKN().apply(func, HASWELL, False), HASWELL) == 0
    # the old limits on panels of four vectors: the check is not blind
    wide = _packed_func(HASWELL, m, k, n, lanes=8, registers=32)
    old = MatmulKN(acc_vectors=16, max_rows=4, max_col_vectors=4).apply(wide, HASWELL, False)
    assert stack_reloads(old, HASWELL) > 0
