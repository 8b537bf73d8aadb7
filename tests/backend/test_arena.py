"""Workspace arenas of the CUDA persistent kernels (structure only: no GPU, no nvcc)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.backend.cuda.test_dispatch import _plan_and_lower_target
from tests.relax_passes.models import SharedKernels
from tvm_rtask.backend import arena
from tvm_rtask.backend.arena import ALIGN_BYTES, arena_of, plan_arenas
from tvm_rtask.tir.common import TensorDecl


def _decls():
    return [
        TensorDecl("a", (1, 3, 5), "float32"),
        TensorDecl("b", (7,), "float16"),
        TensorDecl("c", (2, 2), "float32"),
        TensorDecl("d", (100,), "float32"),
        TensorDecl("e", (3,), "float16"),
    ]


def test_workspaces_are_packed_per_dtype_aligned_and_disjoint():
    arenas = plan_arenas(_decls())
    assert [a.dtype for a in arenas] == ["float32", "float16"]
    where = arena_of(arenas)
    assert set(where) == {"a", "b", "c", "d", "e"}
    for a in arenas:
        item = np.dtype(a.dtype).itemsize
        spans = []
        for t, off in a.members:
            assert t.dtype == a.dtype and (off * item) % ALIGN_BYTES == 0
            spans.append((off, off + int(np.prod(t.shape))))
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
        assert a.size == spans[-1][1] and a.decl.shape == (a.size,)
    # first-use order inside an arena
    assert [t.name for t, _ in arenas[0].members] == ["a", "c", "d"]


def test_an_arena_stays_below_int32_indices(monkeypatch):
    monkeypatch.setattr(arena, "MAX_ELEMENTS", 200)
    arenas = plan_arenas(_decls())
    f32 = [a for a in arenas if a.dtype == "float32"]
    assert len(f32) == 2 and all(a.size <= 200 for a in arenas)
    monkeypatch.setattr(arena, "MAX_ELEMENTS", 50)
    assert "d" not in arena_of(plan_arenas(_decls()))  # too big for any arena: a parameter


def test_a_constant_arena_holds_each_member_at_its_offset_and_zeros_between():
    rng = np.random.default_rng(0)
    values = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in _decls()}
    for a in plan_arenas(_decls()):
        got = arena.arena_tensor(a, values).numpy()
        assert got.dtype == np.dtype(a.dtype) and got.shape == (a.size,)
        covered = np.zeros(a.size, dtype=bool)
        for t, off in a.members:
            n = int(np.prod(t.shape))
            np.testing.assert_array_equal(got[off : off + n], values[t.name].reshape(-1))
            covered[off : off + n] = True
        assert covered.any() and not got[~covered].any()  # alignment gaps are zeros


def test_a_constant_is_read_without_a_copy_and_cannot_be_written():
    import tvm
    from tvm import relax

    from tvm_rtask.relax_exprs import constant_array

    const = relax.const(tvm.runtime.tensor(np.arange(6, dtype="float32")))
    view = constant_array(const)
    np.testing.assert_array_equal(view, np.arange(6, dtype="float32"))
    with pytest.raises(ValueError):
        view[0] = 1.0
    assert const.value.numpy()[0] == 0.0


@pytest.fixture(scope="module")
def shared():
    return _plan_and_lower_target(SharedKernels)


def test_the_persistent_kernel_takes_one_arena_instead_of_its_workspaces(shared):
    mod, plan = shared
    (program,) = plan.programs()
    func = mod["rprogram_0"]
    names = [str(p.name) for p in func.params]
    # x, w1, w2; the offset, task, pair tables and the sync words; d; one float32 arena
    assert len(names) == 3 + 4 + 1 + 1, names
    assert names[3] == "rtask_offsets" and names[-1].startswith("rtask_arena_float32")
    text = func.script()
    # the shared convolution writes a, b or c: its output offset comes from the table
    assert "rtask_offsets[" in text


def test_the_offset_table_gives_each_operator_its_workspace(shared):
    from tvm_rtask.backend.cuda.dispatch import CUDAProgramCode, operator_index

    mod, plan = shared
    (program,) = plan.programs()
    graph = plan.graph
    body_of = {op: graph.op(op).func for op in program.ops()}
    calls = {op: (None, [*graph.op(op).inputs, *graph.op(op).outputs]) for op in program.ops()}
    produced = [t for op in program.ops() for t in graph.op(op).outputs]
    workspaces = [TensorDecl(t, (1, 4, 8, 8), "float32") for t in produced[:-1]]
    code = CUDAProgramCode(
        inputs=[], outputs=[], calls=calls, num_veu=8, threads=64,
        op_index=operator_index(program.ops(), body_of), body_of=body_of,
        arenas=plan_arenas(workspaces),
    )  # fmt: skip
    values, slots = code.offset_table
    where = arena_of(code.arenas)
    assert slots, "the convolutions' outputs are arena operands of one shared body"
    for (first, k), slot in slots.items():
        ops = sorted((o for o in program.ops() if body_of[o] == body_of[first]),
                     key=code.op_index.get)  # fmt: skip
        for i, op in enumerate(ops):
            assert values[slot + i] == where[calls[op][1][k]][1]


def test_constant_weights_are_folded_into_one_constant_arena():
    import tvm
    from tvm import relax
    from tvm.ir.expr import Constant

    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal((4, 4, 3, 3)).astype("float32") for n in ("w1", "w2")}
    bound = relax.transform.BindParams("main", {k: tvm.runtime.tensor(v) for k, v in w.items()})(
        SharedKernels
    )
    mod, _ = _plan_and_lower_target(bound)
    func = mod["rprogram_0"]
    names = [str(p.name) for p in func.params]
    # x; the float32 weight arena; four tables; d; the workspace arena
    assert len(names) == 1 + 1 + 4 + 1 + 1, names
    assert names[1].startswith("rtask_weights_float32")
    calls = [
        b.value
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and "rprogram_0" in str(b.value.args[0])
    ]
    (call,) = calls
    packed = call.args[1].fields[1]
    assert isinstance(packed, Constant)
    data = packed.value.numpy()
    # both weights are in it, each at a 256-byte aligned offset
    for v in w.values():
        flat = v.reshape(-1)
        starts = [
            i
            for i in range(0, data.size - flat.size + 1, 64)
            if np.array_equal(data[i : i + flat.size], flat)
        ]
        assert starts, "a weight is missing from the constant arena"


def test_an_int64_constant_arena_stays_int64():
    """relax.const makes an int64 numpy array int32 unless told: the arena must not."""
    import tvm

    import tvm_rtask
    from tvm_rtask import models as zoo

    mod = zoo.get("lstm_tc", reduced=True)[0]
    target = {"kind": "cuda", "arch": "sm_90"}
    lowered = tvm_rtask.lower(mod, target, verify_occupancy=False, num_veu=132, cuda_registers=64)
    int64 = [
        p
        for gv, f in lowered.functions_items()
        if gv.name_hint.startswith("rprogram_")
        for p in f.params
        if str(p.name).startswith("rtask_weights_int64")
    ]
    assert int64, "lstm_tc reads int64 constants (gather indices)"
    tvm.relax.transform.CallTIRRewrite()(lowered)  # checks call_tir argument types
