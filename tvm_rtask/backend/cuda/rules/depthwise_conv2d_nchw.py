"""Depthwise NCHW convolution (``group_conv2d_nchw`` with one input channel per group:
``out[n, f, y, x] = sum(data[n, f // FG, y*s + ry*d, x*s + rx*d] * w[f, 0, ry, rx])``), with
its padding producer and fused epilogue.

There is no reduction across channels to tile: each output is a ``KH x KW`` window of one
input plane. A block takes ``TY`` output rows of one (image, channel) plane, stages the input
rows they need (padding inlined into the copy) and the channel's ``KH*KW`` weights in shared
memory, and gives each thread ``XI`` outputs of a row::

    for b in blockIdx.x(N * F * OH/TY):                    # one rTask: independent blocks
      in_s[rows of the TY output rows, padded width] <- data (padding inlined)
      w_s[KH, KW] <- weight[f]
      for t in threadIdx.x(TY * TX):                       # row y = t // TX, column t % TX
        for xi in unroll(XI):                              # x = xi * TX + t % TX
          acc = 0
          for ry, rx in unroll(KH, KW):
            acc += in_s[y*s + ry*d, x*s + rx*d] * w_s[ry, rx]
          out[n, f, y, x] = epilogue(acc)

Consecutive threads take consecutive columns (conflict-free shared reads at stride 1, a
broadcast weight). ``TY`` is the largest divisor of OH whose ``TY x TX`` threads fit the cap.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers
from tvm.target import Target

from ....tir.schedule import schedule_of
from .base import ConvInfo, CUDAScheduleRule, find_conv, inline_epilogue, thread_cap

UNROLL = 64


def depthwise_tile(info: ConvInfo, cap: int) -> tuple[int, int, int]:
    """``(TY, TX, XI)``: output rows a block, threads along a row, outputs a thread along the
    row (strided by TX). A row of more than ``cap`` columns is split into XI parts."""
    xi = -(-info.out_w // cap)
    tx = -(-info.out_w // xi)
    ty = 1
    for rows in range(1, info.out_h + 1):
        if info.out_h % rows == 0 and rows * tx <= cap:
            ty = rows
    return ty, tx, xi


class DepthwiseConv2dNCHW(CUDAScheduleRule):
    """Depthwise convolution, spatially tiled (see the module docstring)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = schedule_of(func)
        info = find_conv(sch)
        if info is None or info.group_channels != 1:
            return None
        return schedule_depthwise(sch, info, *depthwise_tile(info, thread_cap(target)))


def schedule_depthwise(sch: s_tir.Schedule, info: ConvInfo, ty: int, tx: int, xi: int):
    conv = info.block
    n, f, y, x, rc, ry, rx = sch.get_loops(conv)
    yo, yi = sch.split(y, [None, ty])
    xo, xt = sch.split(x, [xi, tx])
    sch.reorder(n, f, yo, yi, xt, xo, rc, ry, rx)
    bx = sch.fuse(n, f, yo)
    t = sch.fuse(yi, xt)
    sch.bind(bx, "blockIdx.x")
    sch.bind(t, "threadIdx.x")
    sch.annotate(t, "pragma_auto_unroll_max_step", UNROLL)
    sch.annotate(t, "pragma_unroll_explicit", 0)  # #pragma unroll: see conv2d_nchw.py
    threads = ty * tx
    acc = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
    copies = []
    for index in sorted((info.data_read, info.weight_read)):
        copies.append(sch.cache_read(conv, index, "shared"))
    for copy in copies:
        sch.compute_at(copy, bx, preserve_unit_loops=True)
        ndim = len(sch.get(copy).writes[0].source.shape)
        fused = sch.fuse(*sch.get_loops(copy)[-ndim:])
        _, tt = sch.split(fused, [None, threads])
        sch.bind(tt, "threadIdx.x")
    for loop in (xo, ry, rx):
        sch.unroll(loop)
    for copy in copies:
        auto_inline_producers(sch, copy)
    if not inline_epilogue(sch, acc):
        return None
    sch.decompose_reduction(conv, rc)
    return sch
