"""What the CUDA schedule rules share: the rule interface, the target's limits and the
analysis that recognises an NCHW convolution (direct, grouped or depthwise) as Relax
legalizes it.

A rule is a dlight-style class: ``apply(func, target, tunable)`` returns a
:class:`tvm.s_tir.Schedule` of one kernel whose thread blocks are independent (one
``blockIdx.x`` loop, a 1-D ``threadIdx.x`` block, no cross-thread reduction, no global
intermediates), so the rKernel maker (``backend/cuda/rkernel.py``) can turn every block into
an rTask; or ``None`` when the PrimFunc is not what it schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.s_tir.dlight.base.utils import max_threads_per_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.sym.analyzer import Analyzer
from tvm.target import Target

from ....core import get_spec
from ....tir.common import substitute_vars
from ...cpu.rules.base import single_reduction

# SMs of the device the arch names (tile sizes aim at one block per SM at least); the
# H100's when the arch is not one of these.
_ARCH_DEVICES = {"sm_70": "v100", "sm_80": "a100", "sm_90": "h100"}


class CUDAScheduleRule(GPUScheduleRule):
    """A schedule rule for CUDA targets (``None`` on any other target)."""

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "cuda"


def thread_cap(target: Target) -> int:
    """Threads a block may have: the target's ``max_num_threads`` (the backend passes the
    vEU's size, ``cuda_threads``, 256 by default), at most 1024."""
    return min(int(max_threads_per_block(target)), 1024)


def num_sms(target: Target) -> int:
    arch = str(target.attrs.get("arch", "")) if target is not None else ""
    return get_spec(_ARCH_DEVICES.get(arch, "h100")).num_sms


@dataclass(frozen=True)
class ConvInfo:
    """A 2-D NCHW convolution block ``out[n, f, y, x] += data[n, c, y*s + ry*d, x*s + rx*d] *
    weight[f, rc, ry, rx]`` with ``c = f // (F/G) * (C/G) + rc`` (``G`` groups)."""

    block: s_tir.schedule.SBlockRV
    data_read: int  # index of the data read in the block's reads
    weight_read: int
    batch: int
    out_channels: int  # F
    out_h: int
    out_w: int
    in_channels: int  # C, of the data buffer the block reads (after padding)
    group_channels: int  # CG = C / G: the reduction's channel extent
    kernel_h: int
    kernel_w: int
    groups: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    offset: tuple[int, int]  # constant added to the row and column index (0 after padding)

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def depthwise(self) -> bool:
        return self.group_channels == 1 and self.out_per_group == 1

    @property
    def gemm(self) -> tuple[int, int, int, int]:
        """``(G, M, J, K)`` of the implicit GEMM: per group, pixels x output channels x
        reduction (input channels x kernel window)."""
        return (
            self.groups,
            self.batch * self.out_h * self.out_w,
            self.out_per_group,
            self.group_channels * self.kernel_h * self.kernel_w,
        )


def _int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _linear(analyzer, expr, outer, inner) -> tuple[int, int, int] | None:
    """``(s, d, o)`` with ``expr == outer*s + inner*d + o`` (proved), or None."""

    def at(a: int, b: int):
        dtype = str(outer.ty)
        value = substitute_vars(expr, {outer: tirx.IntImm(dtype, a), inner: tirx.IntImm(dtype, b)})
        return _int(analyzer.simplify(value))

    o, s, d = at(0, 0), at(1, 0), at(0, 1)
    if o is None or s is None or d is None:
        return None
    s, d = s - o, d - o
    if s < 1 or d < 1:
        return None
    dtype = str(outer.ty)
    expected = outer * tirx.IntImm(dtype, s) + inner * tirx.IntImm(dtype, d) + o
    return (s, d, o) if analyzer.can_prove_equal(expr, expected) else None


def _is_multiply_accumulate(block: s_tir.SBlock) -> bool:
    body = block.body
    return (
        isinstance(body, tirx.BufferStore)
        and isinstance(body.value, tirx.Add)
        and isinstance(body.value.b, tirx.Mul)
        and block.init is not None
    )


def analyse_conv(sch: s_tir.Schedule, block) -> ConvInfo | None:
    """The convolution ``block`` computes, or None when it is not an NCHW convolution."""
    if get_sblock_info(sch, block).dom_kind() != "SSSSRRR":
        return None
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) not in (2, 3):
        return None
    if not _is_multiply_accumulate(stmt):
        return None
    ivars = [iv.var for iv in stmt.iter_vars]
    extents = [_int(iv.dom.extent) for iv in stmt.iter_vars]
    if any(e is None for e in extents) or any(_int(iv.dom.min) != 0 for iv in stmt.iter_vars):
        return None
    n, f, y, x, rc, ry, rx = ivars
    out = stmt.writes[0]
    if len(out.region) != 4 or not all(
        r.min.same_as(v) for r, v in zip(out.region, ivars[:4], strict=True)
    ):
        return None
    # reads: the accumulator itself, the weight [f, rc, ry, rx] and the data
    weight_read = data_read = None
    for i, read in enumerate(stmt.reads):
        if read.source.same_as(out.source):
            continue
        region = [r.min for r in read.region]
        if len(region) != 4:
            return None
        if all(m.same_as(v) for m, v in zip(region, (f, rc, ry, rx), strict=True)):
            weight_read = i
        else:
            data_read = i
    if weight_read is None or data_read is None:
        return None
    data = stmt.reads[data_read]
    batch, channels, out_h, out_w, cg, kh, kw = extents
    in_channels = _int(data.source.shape[1])
    if in_channels is None or in_channels % cg or channels % (in_channels // cg):
        return None
    groups = in_channels // cg
    fg = channels // groups
    analyzer = Analyzer()
    for var, extent in zip(ivars, extents, strict=True):
        analyzer.bind(var, ir.Range(0, extent))
    n_index, c_index, y_index, x_index = (r.min for r in data.region)
    dtype = str(f.ty)
    expected_c = tirx.floordiv(f, tirx.IntImm(dtype, fg)) * tirx.IntImm(dtype, cg) + rc
    if not n_index.same_as(n) or not analyzer.can_prove_equal(c_index, expected_c):
        return None
    rows, cols = _linear(analyzer, y_index, y, ry), _linear(analyzer, x_index, x, rx)
    if rows is None or cols is None:
        return None
    return ConvInfo(
        block=block,
        data_read=data_read,
        weight_read=weight_read,
        batch=batch,
        out_channels=channels,
        out_h=out_h,
        out_w=out_w,
        in_channels=in_channels,
        group_channels=cg,
        kernel_h=kh,
        kernel_w=kw,
        groups=groups,
        stride=(rows[0], cols[0]),
        dilation=(rows[1], cols[1]),
        offset=(rows[2], cols[2]),
    )


def find_conv(sch: s_tir.Schedule) -> ConvInfo | None:
    """The PrimFunc's one convolution (every other root block injective: padding,
    epilogue) in float32, or None."""
    block = single_reduction(sch)
    if block is None:
        return None
    info = analyse_conv(sch, block)
    if info is None:
        return None
    stmt = sch.get(block)
    if any(str(r.source.dtype) != "float32" for r in (*stmt.reads, *stmt.writes)):
        return None
    return info


def inline_epilogue(sch: s_tir.Schedule, writeback) -> bool:
    """Inline the injective consumers of ``writeback`` into it (bias, batch norm, relu),
    as dlight's ``auto_inline_consumer_chain``; True when nothing is left after it.

    dlight tries each primitive under a bare ``except``, which also swallows TVM 0.27's
    ``InternalError`` of ``reverse_compute_inline`` on a consumer that reads the write-back
    broadcast (the squeeze-and-excitation multiply, issue 27): that epilogue is left, the
    chain's assertion fails and the rule declines (dlight schedules the PrimFunc). The
    CPU rules' stricter check (``tir.rules.can_reverse_inline``) is not used here: the
    write-back of the implicit GEMM goes through ``reindex`` blocks whose indices are not
    the consumer's iterators."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain

    try:
        auto_inline_consumer_chain(sch, writeback)
    except (AssertionError, s_tir.ScheduleError):
        return False
    return not sch.get_consumers(writeback)


def largest_divisor(extent: int, at_most: int, multiple_of: int = 1) -> int | None:
    """The largest divisor of ``extent`` that is at most ``at_most`` and a multiple of
    ``multiple_of``; None if there is none."""
    for d in range(min(at_most, extent), 0, -1):
        if extent % d == 0 and d % multiple_of == 0:
            return d
    return None
