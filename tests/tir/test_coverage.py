"""Blocks that still compute their whole domain after being moved under another block's
loops (issue 47): ``reverse_compute_at`` drops the instances of a consumer that read nothing
the anchor's loop makes, so a ``nn.pad`` fused after a convolution lost its border, which
then held garbage or NaN. ``tvm_rtask.tir.common.covers_domain`` sees it,
``gather_covering`` places the blocks another way, and ``try_rules`` refuses a rule's schedule
that leaves part of an output unwritten.

The modules mirror the first blocks of the real network the defect was found in (a
convolution with batch norm as arithmetic and SiLU, then an explicit bottom/right-only zero
pad); the numbers are compared with TVM's own build of the same module."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.s_tir.dlight.base.common_schedules import try_inline
from tvm.script import tirx as T

import tvm_rtask
from tvm_rtask.relax_passes.fuse import prepare_pipeline
from tvm_rtask.tir.common import gather_covering, gather_under_anchor, root_children
from tvm_rtask.tir.coverage import (
    covers_domain,
    repeated_blocks,
    uncovered_blocks,
    unwritten_outputs,
)

RNG = np.random.default_rng(7)


def conv_silu_pad_module(channels=8, out_channels=6, size=12, then_conv=False):
    """conv 3x3 -> batch norm (arithmetic) -> SiLU -> pad bottom/right by one; with
    ``then_conv`` a stride-2 3x3 convolution without padding reads the padded map."""
    w = (RNG.standard_normal((out_channels, channels, 3, 3)) * (2 / (9 * channels)) ** 0.5).astype(
        "float32"
    )
    mean = RNG.standard_normal((1, out_channels, 1, 1)).astype("float32") * 0.1
    scale = (1 + RNG.random((1, out_channels, 1, 1))).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=[1, 1, 1, 1]))
            y = bb.emit(relax.op.subtract(y, relax.const(mean)))
            y = bb.emit(relax.op.multiply(y, relax.const(scale)))
            y = bb.emit(relax.op.multiply(y, relax.op.sigmoid(y)))
            y = bb.emit(relax.op.nn.pad(y, pad_width=[0, 0, 0, 0, 0, 1, 0, 1], pad_value=0.0))
            if then_conv:
                w2 = (RNG.standard_normal((4, out_channels, 3, 3)) * 0.3).astype("float32")
                y = bb.emit(relax.op.nn.conv2d(y, relax.const(w2), strides=[2, 2]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), RNG.standard_normal((1, channels, size, size)).astype("float32")


def _tvm_reference(mod, x):
    ex = tvm.compile(mod, "llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _fused_pad_func(mod):
    prepared = prepare_pipeline("fuseops", "cpu", [])(mod)
    names = [gv.name_hint for gv in prepared.functions if "pad" in gv.name_hint]
    assert len(names) == 1, names
    return prepared[names[0]]


def _inlined(func):
    sch = s_tir.Schedule(func)
    try_inline(sch, [get_sblock_info(sch, b) for b in root_children(sch)])
    return sch


def test_anchor_placement_loses_the_pad_border_and_is_seen():
    func = _fused_pad_func(conv_silu_pad_module()[0])
    sch = _inlined(func)
    assert gather_under_anchor(sch)  # TVM accepts the move...
    pad = sch.get_sblock("PadInput")
    assert not covers_domain(sch, pad)  # ...but the border is no longer computed
    assert unwritten_outputs(sch.mod["main"]) == ["PadInput"]


def test_gather_covering_places_every_block_whole():
    func = _fused_pad_func(conv_silu_pad_module()[0])
    sch = _inlined(func)
    before = sch.mod["main"]
    sch2, loops = gather_covering(sch)
    assert loops
    assert sch.mod["main"].same_as(before)  # the schedule it was given is left as it was
    assert uncovered_blocks(sch2.mod["main"]) == []
    assert unwritten_outputs(sch2.mod["main"]) == []


def test_an_internal_error_in_one_placement_leaves_the_other_to_try(monkeypatch):
    """TVM's reverse_compute_at raised an InternalError (not a ScheduleError) on a strided
    consumer: the anchor's placement is dropped, the last block's still tried."""
    from tvm.error import InternalError

    from tvm_rtask.tir import common

    def broken(sch):
        raise InternalError("iter-map check failed")

    monkeypatch.setattr(common, "gather_under_anchor", broken)
    sch = _inlined(_fused_pad_func(conv_silu_pad_module()[0]))
    sch2, loops = common.gather_covering(sch)
    assert loops and unwritten_outputs(sch2.mod["main"]) == []


def test_an_elementwise_epilogue_stays_under_the_anchor():
    """The common case keeps the anchor's nest: nothing changes for it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = RNG.standard_normal((4, 4, 3, 3)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=[1, 1, 1, 1]))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    prepared = prepare_pipeline("fuseops", "cpu", [])(bb.get())
    (name,) = [gv.name_hint for gv in prepared.functions if "conv" in gv.name_hint]
    sch = _inlined(prepared[name])
    sch2, loops = gather_covering(sch)
    trial = sch.copy()
    assert [int(trial.get(lp).extent) for lp in gather_under_anchor(trial)] == [
        int(sch2.get(lp).extent) for lp in loops
    ]


def test_a_rule_that_leaves_an_output_unwritten_is_refused(caplog):
    """Conv2dPackedNCHW computes the epilogue per tile; with the pad in it, try_rules
    refuses the schedule (logged) and the next rule is tried."""
    from tvm_rtask.backend import as_target, get_backend
    from tvm_rtask.backend.cpu.rules import schedule_cpu_func
    from tvm_rtask.options import resolve_options

    mod, _ = conv_silu_pad_module(channels=16, out_channels=16, size=16)
    target = as_target("llvm")
    backend = get_backend(target)
    options = resolve_options({}, {})
    prepared = prepare_pipeline("fuseops", "cpu", backend.prepare_passes(options))(mod)
    (name,) = [gv.name_hint for gv in prepared.functions if "pad" in gv.name_hint]
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        scheduled = schedule_cpu_func(prepared[name], target, name=name)
    assert "unwritten" in caplog.text
    assert scheduled is None or unwritten_outputs(scheduled) == []


OPTIONS = [
    {},
    {"cpu_layout": "nchw"},
    {"cpu_rules": False},
    {"num_veu": 1},
    {"policy": "wavefront", "barrier": "global"},
    {"fusion": "stitch"},
]


@pytest.mark.parametrize("then_conv", [False, True], ids=["pad-output", "pad-then-conv"])
@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(map(str, o.values())) or "default"
)
def test_conv_silu_pad_matches_tvm_with_nan_fill(options, then_conv):
    mod, x = conv_silu_pad_module(then_conv=then_conv)
    expected = _tvm_reference(mod, x)
    assert np.abs(expected).max() > 0.5  # activations alive
    ex = tvm_rtask.compile(mod, "llvm", **{"policy": "sequential", "nan_fill": True, **options})
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(2):  # a second call meets the first call's memory
        actual = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert not np.isnan(actual).any()
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


# Hand-written schedules of the shapes the CPU rules emit: a last tile that overlaps the one
# before it (min), a loop split into a main part and a tail (two blocks), and a tail missing.


@T.prim_func(private=True, s_tir=True)
def overlapping_last_tile(x: T.Buffer((121,), "float32"), y: T.Buffer((121,), "float32")):
    for t, i in T.grid(4, 32):
        with T.sblock("tile"):
            v = T.axis.spatial(121, T.min(t * 32, 89) + i)
            y[v] = x[v]


@T.prim_func(private=True, s_tir=True)
def main_part_and_tail(x: T.Buffer((121,), "float32"), y: T.Buffer((121,), "float32")):
    for t, i in T.grid(3, 32):
        with T.sblock("main"):
            v = T.axis.spatial(121, t * 32 + i)
            y[v] = x[v]
    for i in range(25):
        with T.sblock("tail"):
            v = T.axis.spatial(121, 96 + i)
            y[v] = x[v]


@T.prim_func(private=True, s_tir=True)
def tail_missing(x: T.Buffer((121,), "float32"), y: T.Buffer((121,), "float32")):
    for t, i in T.grid(3, 32):
        with T.sblock("main"):
            v = T.axis.spatial(121, t * 32 + i)
            y[v] = x[v]


def test_an_overlapping_last_tile_covers_its_domain():
    assert uncovered_blocks(overlapping_last_tile) == []
    assert unwritten_outputs(overlapping_last_tile) == []


def test_a_main_part_and_a_tail_write_the_output_together():
    assert sorted(uncovered_blocks(main_part_and_tail)) == ["main", "tail"]
    assert unwritten_outputs(main_part_and_tail) == []


def test_a_missing_tail_is_an_unwritten_output():
    assert unwritten_outputs(tail_missing) == ["main"]


@T.prim_func(s_tir=True)
def _row_max_then_strided(a: T.Buffer((2, 4, 4), "float32"), c: T.Buffer((2, 2, 2), "float32")):
    """A maximum over the channels read at every other row and column, per channel: a
    softmax's statistics read by the strided slice the CPU backend makes of a stride-2 1x1
    convolution (the defect found by the differential fuzzer)."""
    m = T.sblock_alloc_buffer((4, 4))
    for h, w, k in T.grid(4, 4, 2):
        with T.sblock("channel_max"):
            vh, vw, vk = T.axis.remap("SSR", [h, w, k])
            with T.init():
                m[vh, vw] = T.float32(-1e30)
            m[vh, vw] = T.max(m[vh, vw], a[vk, vh, vw])
    for ch, y, x in T.grid(2, 2, 2):
        with T.sblock("strided"):
            vc, vy, vx = T.axis.remap("SSS", [ch, y, x])
            c[vc, vy, vx] = a[vc, vy * 2, vx * 2] - m[vy * 2, vx * 2]


def test_a_strided_consumer_under_the_anchor_repeats_and_is_seen():
    sch = s_tir.Schedule(_row_max_then_strided)
    assert gather_under_anchor(sch)  # TVM accepts the move...
    func = sch.mod["main"]
    assert uncovered_blocks(func) == []  # ...every output element is written...
    # ...but each is written in two iterations, one of which did not make its input
    assert repeated_blocks(func, {"strided"}) == ["strided"]
    assert repeated_blocks(func, {"channel_max"}) == []
    a = RNG.standard_normal((2, 4, 4)).astype("float32")
    c = tvm.runtime.tensor(np.zeros((2, 2, 2), "float32"))
    tvm.compile(func, "llvm")(tvm.runtime.tensor(a), c)
    wrong = c.numpy() != (a - a.max(axis=0))[:, ::2, ::2]
    assert wrong.any()  # TVM allocates the maxima inside the loop: a repeat reads a stale one


def test_gather_covering_puts_a_strided_consumer_last():
    sch, loops = gather_covering(s_tir.Schedule(_row_max_then_strided))
    func = sch.mod["main"]
    assert loops and unwritten_outputs(func) == []
    assert repeated_blocks(func, {"strided"}) == []
    a = RNG.standard_normal((2, 4, 4)).astype("float32")
    c = tvm.runtime.tensor(np.zeros((2, 2, 2), "float32"))
    tvm.compile(func, "llvm")(tvm.runtime.tensor(a), c)
    np.testing.assert_array_equal(c.numpy(), (a - a.max(axis=0))[:, ::2, ::2])
