"""Row-wise reductions (softmax, layer norm): TVM's own ``dlight.cpu.Reduction``, kept to the
functions it was written for.

``dlight.cpu.Reduction`` runs the rows in parallel, moves every block under the row loop and
vectorises the injective blocks. It also accepts any other reduction whose blocks share
leading spatial axes, convolutions included, where it is no gain (a strided convolution that
``Conv2dNCHW`` declines on purpose). :class:`RowReduction` applies it only when every block
reduces over at most one axis, its last.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.cpu import Reduction
from tvm.target import Target

from .base import CPUScheduleRule


class RowReduction(CPUScheduleRule):
    """``dlight.cpu.Reduction`` where each block reduces over its last axis only."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        infos = normalize_prim_func(s_tir.Schedule(func))
        if not infos:
            return None
        kinds = [info.dom_kind() for info in infos]
        if not any("R" in k for k in kinds):
            return None
        if any(k.count("R") > 1 or ("R" in k and not k.endswith("R")) for k in kinds):
            return None
        return Reduction().apply(func, target, tunable)
