"""Cost models: how long one rTask, a launch and a barrier take on a vDevice.

Policies only ask these questions, so a measured model (TVM ``time_evaluator``, in
``runtime``) can replace the analytical one without touching any policy.
"""

from __future__ import annotations

import math

from ..core.graph import ROperator
from ..core.rkernel import RKernel
from ..core.vdevice import VDevice
from ..errors import PlanError


class CostModel:
    """Base class: subclasses implement ``rtask_us``; the rest derives from it."""

    name = "base"

    def rtask_us(self, op: ROperator, kernel: RKernel, vdevice: VDevice) -> float:
        """Time of ONE rTask of ``kernel`` running on one vEU while the others are busy."""
        raise NotImplementedError

    def launch_us(self, vdevice: VDevice) -> float:
        """Fixed cost of one kernel launch (one rProgram or one ordinary call)."""
        return vdevice.spec.launch_overhead_us

    def barrier_us(self, vdevice: VDevice) -> float:
        """Cost of one barrier rTask on top of waiting for its tasks."""
        return vdevice.spec.barrier_overhead_us

    def kernel_us(self, op: ROperator, kernel: RKernel, vdevice: VDevice) -> float:
        """The kernel alone on the device: its rTasks in rounds of ``num_veu``, no launch."""
        rounds = math.ceil(kernel.num_rtasks / vdevice.num_veu)
        return self.rtask_us(op, kernel, vdevice) * rounds

    def work_us(self, op: ROperator, kernel: RKernel, vdevice: VDevice) -> float:
        """vEU-time the kernel occupies: rTasks x time per rTask."""
        return self.rtask_us(op, kernel, vdevice) * kernel.num_rtasks

    def fastest(self, op: ROperator, vdevice: VDevice) -> RKernel:
        """Rammer's fastest rKernel: least time alone on the device (ties: less work)."""
        ks = _kernels(op)
        return min(ks, key=lambda k: (self.kernel_us(op, k, vdevice), self.work_us(op, k, vdevice)))

    def most_efficient(self, op: ROperator, vdevice: VDevice) -> RKernel:
        """Rammer's most efficient rKernel: least rTasks x time (ties: faster)."""
        ks = _kernels(op)
        return min(ks, key=lambda k: (self.work_us(op, k, vdevice), self.kernel_us(op, k, vdevice)))

    def ordinary_us(self, op: ROperator, vdevice: VDevice) -> float:
        """An operator run as an ordinary launch on the whole device (launch excluded).

        With no rKernel (an extern call, say) it is costed as if split into one task per vEU.
        """
        if op.rkernels:
            return self.kernel_us(op, self.fastest(op, vdevice), vdevice)
        whole = RKernel(f"{op.name}@ordinary", num_rtasks=vdevice.num_veu)
        return self.rtask_us(op, whole, vdevice)


def _kernels(op: ROperator) -> list[RKernel]:
    if not op.rkernels:
        raise PlanError(f"operator {op.name!r} has no rKernel to choose from")
    return op.rkernels


class AnalyticalCostModel(CostModel):
    """Roofline per rTask: max(FLOPs / FLOP rate, bytes / bandwidth) + a fixed overhead.

    A vEU gets the device's peak divided by ``max(units, active vEUs)``, where ``units`` is
    the SM (or core) count: with fewer vEUs than SMs each block still has only one SM, and
    with more they share SMs. ``kernel.est_us`` (a measurement) wins when it is set.
    """

    name = "analytical"

    def __init__(self, task_overhead_us: float = 0.1) -> None:
        self.task_overhead_us = task_overhead_us

    def rtask_us(self, op: ROperator, kernel: RKernel, vdevice: VDevice) -> float:
        if kernel.est_us is not None:
            return float(kernel.est_us)
        spec = vdevice.spec
        share = max(spec.num_sms, min(vdevice.num_veu, vdevice.capacity))
        flop_per_us = spec.peak_gflops * 1e3 / share
        byte_per_us = spec.bandwidth_gbs * 1e3 / share
        n = kernel.num_rtasks
        return max(op.flops / n / flop_per_us, op.bytes / n / byte_per_us) + self.task_overhead_us

    def __repr__(self) -> str:
        return f"AnalyticalCostModel(task_overhead_us={self.task_overhead_us})"
