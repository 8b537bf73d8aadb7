"""Cost models: how long one rTask, a launch and a barrier take on a vDevice.

Policies only ask these questions, so a measured model (TVM ``time_evaluator``, in
``runtime``) can replace the analytical one without touching any policy.

Co-location: vEU ``v`` runs on SM ``v % SMs`` (``VDevice.sm_of``), and a policy hands an
operator's rTasks to the lowest free vEUs first, so ``width`` rTasks side by side occupy
``min(width, SMs)`` SMs: an rTask shares its SM only once the rTasks running with it
outnumber the SMs. ``rtask_us_at`` is the time of one rTask at a given width (its wave's, as
the builder records it in ``RProgram.widths``); ``rtask_us`` the time with every vEU busy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..core.graph import ROperator
from ..core.rkernel import RKernel
from ..core.vdevice import VDevice
from ..errors import PlanError


class CostModel:
    """Base class: subclasses implement ``rtask_us``; the rest derives from it (the time at
    a width, ``rtask_us_at``, by the share of the device, unless a subclass says better)."""

    name = "base"

    def rtask_us(self, op: ROperator, kernel: RKernel, vdevice: VDevice) -> float:
        """Time of ONE rTask of ``kernel`` running on one vEU while the others are busy."""
        raise NotImplementedError

    def rtask_us_at(
        self, op: ROperator, kernel: RKernel, vdevice: VDevice, width: int | None
    ) -> float:
        """Time of ONE rTask while ``width`` rTasks (None: every vEU) run side by side.

        By default ``rtask_us`` scaled by the share of the device one rTask gets
        (:func:`veu_share`): the same work, a larger slice of an SM when fewer run."""
        t = self.rtask_us(op, kernel, vdevice)
        if width is None:
            return t
        return t * veu_share(vdevice, width) / veu_share(vdevice)

    def launch_us(self, vdevice: VDevice) -> float:
        """Fixed cost of one kernel launch (one rProgram or one ordinary call)."""
        return vdevice.spec.launch_overhead_us

    def barrier_us(self, vdevice: VDevice) -> float:
        """Cost of one barrier rTask on top of waiting for its tasks."""
        return vdevice.spec.barrier_overhead_us

    def kernel_us(self, op: ROperator, kernel: RKernel, vdevice: VDevice) -> float:
        """The kernel alone on the device: its rTasks in rounds of ``num_veu``, as many side
        by side as it has (at most every vEU), no launch."""
        rounds = math.ceil(kernel.num_rtasks / vdevice.num_veu)
        return self.rtask_us_at(op, kernel, vdevice, kernel.num_rtasks) * rounds

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


def veu_share(vdevice: VDevice, width: int | None = None) -> int:
    """Into how many parts the device's FLOP rate and bandwidth are cut while ``width``
    rTasks (None: every vEU) run side by side: ``max(SMs, width)``. Up to one rTask per SM
    each has an SM of its own (the vEU layout of ``VDevice.sm_of``); beyond, they share."""
    busy = vdevice.num_veu if width is None else max(1, min(width, vdevice.num_veu))
    return max(vdevice.spec.num_sms, min(busy, vdevice.capacity))


class _WidthAwareModel(CostModel):
    """A model that computes one rTask's time at any width itself (``_at``). A subclass
    that redefines ``rtask_us`` has a model of its own: ``rtask_us_at`` then scales that
    (``CostModel.rtask_us_at``) instead of bypassing it."""

    def rtask_us(self, op: ROperator, kernel: RKernel, vdevice: VDevice) -> float:
        return self._at(op, kernel, vdevice, None)

    def rtask_us_at(
        self, op: ROperator, kernel: RKernel, vdevice: VDevice, width: int | None
    ) -> float:
        if type(self).rtask_us is not _WidthAwareModel.rtask_us:
            return super().rtask_us_at(op, kernel, vdevice, width)
        return self._at(op, kernel, vdevice, width)

    def _at(self, op: ROperator, kernel: RKernel, vdevice: VDevice, width: int | None) -> float:
        raise NotImplementedError


class AnalyticalCostModel(_WidthAwareModel):
    """Roofline per rTask: max(FLOPs / FLOP rate, bytes / bandwidth) + a fixed overhead.

    A vEU gets the device's peak divided by :func:`veu_share`: with fewer rTasks running
    than SMs each block still has only one SM, and with more they share SMs.
    ``kernel.est_us`` (a measurement, taken with every vEU busy) wins when it is set.
    """

    name = "analytical"

    def __init__(self, task_overhead_us: float = 0.1) -> None:
        self.task_overhead_us = task_overhead_us

    def _at(self, op: ROperator, kernel: RKernel, vdevice: VDevice, width: int | None) -> float:
        if kernel.est_us is not None:
            return float(kernel.est_us) * veu_share(vdevice, width) / veu_share(vdevice)
        return max(roofline_us(op, kernel, vdevice, width)) + self.task_overhead_us

    def __repr__(self) -> str:
        return f"AnalyticalCostModel(task_overhead_us={self.task_overhead_us})"


def roofline_us(
    op: ROperator, kernel: RKernel, vdevice: VDevice, width: int | None = None
) -> tuple[float, float]:
    """(compute time, memory time) of ONE rTask at the device's peak rates, no overhead,
    while ``width`` rTasks (None: every vEU) run side by side."""
    return _roofline(op, kernel, vdevice, veu_share(vdevice, width))


def _roofline(op: ROperator, kernel: RKernel, vdevice: VDevice, share: int) -> tuple[float, float]:
    spec = vdevice.spec
    n = kernel.num_rtasks
    compute = op.flops / n / (spec.peak_gflops * 1e3 / share)
    memory = op.bytes / n / (spec.bandwidth_gbs * 1e3 / share)
    return compute, memory


def _measured_share(vdevice: VDevice, width: int | None) -> int:
    """The share of a measurement taken with ``width`` units busy on the device (None:
    every vEU), not capped by the vDevice's vEUs: a stand-alone run has its own grid."""
    return veu_share(vdevice) if width is None else max(vdevice.spec.num_sms, int(width))


class CalibratedCostModel(_WidthAwareModel):
    """The roofline of :class:`AnalyticalCostModel` corrected by measurements.

    * ``measured``: time of one rTask per rKernel name, where it was measured (wins);
      ``measured_width``: how many blocks ran side by side in that measurement (absent: every
      vEU), so that the time is rescaled to the width asked (:func:`veu_share`);
    * ``factors``: per device name, ``(compute_efficiency, memory_efficiency,
      task_overhead_us)``: the fraction of peak FLOP rate and bandwidth a real rTask reaches
      and its fixed cost, fitted by :func:`calibrate` from measurements of other kernels.

    * ``barrier_overhead_us`` / ``launch_overhead_us``: the cost of one barrier and of one
      launch measured on the device (``runtime.sync_bench``); None: the device spec's;
    * ``prefer_measured``: a kernel's measurement here wins over its ``est_us`` (a tuning
      record's time, maybe taken on another machine); by default ``est_us`` wins.

    A device without factors is costed like the analytical model. Plain data, JSON-ready.
    """

    name = "calibrated"

    def __init__(
        self,
        factors: dict[str, tuple[float, float, float]] | None = None,
        measured: dict[str, float] | None = None,
        default_overhead_us: float = 0.1,
        barrier_overhead_us: float | None = None,
        launch_overhead_us: float | None = None,
        prefer_measured: bool = False,
        measured_width: dict[str, int] | None = None,
    ) -> None:
        self.factors = {k: tuple(map(float, v)) for k, v in (factors or {}).items()}
        self.measured = dict(measured or {})
        self.measured_width = {k: int(v) for k, v in (measured_width or {}).items()}
        self.default_overhead_us = default_overhead_us
        self.barrier_overhead_us = barrier_overhead_us
        self.launch_overhead_us = launch_overhead_us
        self.prefer_measured = bool(prefer_measured)
        for what, value in (("barrier", barrier_overhead_us), ("launch", launch_overhead_us)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise PlanError(f"a measured {what} cost must be finite and >= 0, got {value}")
        for dev, (ce, me, ov) in self.factors.items():
            if not (ce > 0 and me > 0 and ov >= 0):
                raise PlanError(
                    f"calibration for {dev!r}: efficiencies must be > 0 and overhead >= 0, "
                    f"got {(ce, me, ov)}"
                )

    def _at(self, op: ROperator, kernel: RKernel, vdevice: VDevice, width: int | None) -> float:
        t = self.measured.get(kernel.name)
        share = veu_share(vdevice, width)
        if kernel.est_us is not None and not (self.prefer_measured and t is not None):
            return float(kernel.est_us) * share / veu_share(vdevice)
        if t is not None:
            return t * share / _measured_share(vdevice, self.measured_width.get(kernel.name))
        ce, me, ov = self.factors.get(vdevice.spec.name, (1.0, 1.0, self.default_overhead_us))
        compute, memory = _roofline(op, kernel, vdevice, share)
        return max(compute / ce, memory / me) + ov

    def barrier_us(self, vdevice: VDevice) -> float:
        if self.barrier_overhead_us is not None:
            return self.barrier_overhead_us
        return super().barrier_us(vdevice)

    def launch_us(self, vdevice: VDevice) -> float:
        if self.launch_overhead_us is not None:
            return self.launch_overhead_us
        return super().launch_us(vdevice)

    def to_dict(self) -> dict:
        d = {
            "factors": {k: list(v) for k, v in self.factors.items()},
            "measured": dict(self.measured),
            "default_overhead_us": self.default_overhead_us,
        }
        if self.barrier_overhead_us is not None:
            d["barrier_overhead_us"] = self.barrier_overhead_us
        if self.launch_overhead_us is not None:
            d["launch_overhead_us"] = self.launch_overhead_us
        if self.prefer_measured:
            d["prefer_measured"] = True
        if self.measured_width:
            d["measured_width"] = dict(self.measured_width)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CalibratedCostModel:
        return cls(
            {k: tuple(v) for k, v in d.get("factors", {}).items()},
            d.get("measured", {}),
            d.get("default_overhead_us", 0.1),
            d.get("barrier_overhead_us"),
            d.get("launch_overhead_us"),
            d.get("prefer_measured", False),
            d.get("measured_width"),
        )

    def __repr__(self) -> str:
        sync = ""
        if self.barrier_overhead_us is not None or self.launch_overhead_us is not None:
            sync = (
                f", barrier_overhead_us={self.barrier_overhead_us}, "
                f"launch_overhead_us={self.launch_overhead_us}"
            )
        return (
            f"CalibratedCostModel(factors={self.factors}, measured={len(self.measured)} kernels"
            f"{sync})"
        )


def calibrate(
    samples: list[tuple[ROperator, RKernel, float]],
    vdevice: VDevice,
    into: CalibratedCostModel | None = None,
    widths: dict[str, int] | None = None,
) -> CalibratedCostModel:
    """Fit ``vdevice``'s efficiency factors to measured rTask times and keep the samples.

    Each sample is (operator, rKernel, measured microseconds of ONE rTask); ``widths``: per
    rKernel name, how many blocks ran side by side when it was measured (kept as
    ``measured_width``; the fit takes the roofline at that width; absent: every vEU). The model
    ``t = max(compute / ce, memory / me) + overhead`` is fitted by least squares: a sample
    counts as compute- or memory-bound by its larger term (first at peak rates, then with the
    fitted efficiencies, a few rounds), which makes ``t`` linear in ``1/ce``, ``1/me`` and
    the overhead. A kind without samples takes the other kind's efficiency; a fit that
    would be negative falls back to the median ratio of roofline to measured time.
    """
    model = into or CalibratedCostModel()
    if not samples:
        return model
    widths = widths or {}
    times = np.array([max(float(t), 0.0) for _, _, t in samples])
    terms = np.array(
        [
            _roofline(op, k, vdevice, _measured_share(vdevice, widths.get(k.name)))
            for op, k, _ in samples
        ]
    ).reshape(-1, 2)
    for (_, kernel, _), t in zip(samples, times.tolist(), strict=True):
        model.measured[kernel.name] = t
        if kernel.name in widths:
            model.measured_width[kernel.name] = int(widths[kernel.name])
    inv = np.ones(2)  # 1 / efficiency for compute, memory
    overhead = float(times.min())
    for _ in range(4):
        compute = terms[:, 0] * inv[0] >= terms[:, 1] * inv[1]
        x = np.zeros((len(times), 3))
        x[compute, 0] = terms[compute, 0]
        x[~compute, 1] = terms[~compute, 1]
        x[:, 2] = 1.0
        used = [j for j in range(2) if x[:, j].any()]
        cols = [*used, 2]
        sol, *_ = np.linalg.lstsq(x[:, cols], times, rcond=None)
        fit = dict(zip(cols, sol.tolist(), strict=True))
        if fit[2] < 0:  # no negative overhead: refit through the origin
            sol, *_ = np.linalg.lstsq(x[:, used], times, rcond=None) if used else ([], 0, 0, 0)
            fit = {**dict(zip(used, list(sol), strict=True)), 2: 0.0}
        if not used or any(fit[j] <= 0 for j in used):
            inv, overhead = _median_fit(terms, times)
            break
        for j in range(2):
            inv[j] = fit.get(j, fit[used[0]])
        overhead = fit[2]
    model.factors[vdevice.spec.name] = (1.0 / inv[0], 1.0 / inv[1], max(overhead, 0.0))
    return model


def _median_fit(terms: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, float]:
    """Robust fallback: overhead = the least time; efficiency = median roofline / rest."""
    overhead = float(times.min())
    inv = np.ones(2)
    for j in range(2):
        rows = (terms[:, j] >= terms[:, 1 - j]) & (terms[:, j] > 0) & (times > overhead)
        if rows.any():
            inv[j] = 1.0 / _median((terms[rows, j] / (times[rows] - overhead)).tolist())
    if not ((terms[:, 0] >= terms[:, 1]) & (terms[:, 0] > 0)).any():
        inv[0] = inv[1]
    if not ((terms[:, 1] > terms[:, 0]) & (terms[:, 1] > 0)).any():
        inv[1] = inv[0]
    return inv, overhead


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


# Cost models made from a module's rKernels by a layer above the passes (``cost="measured"``
# is timed by ``runtime.profiler``, which registers itself here on import): PlanRPrograms
# looks the resolver up instead of importing the runtime, which imports the passes.
COST_RESOLVERS: dict[str, Callable[..., tuple[CostModel, dict]]] = {}


def register_cost_resolver(name: str, resolver: Callable[..., tuple[CostModel, dict]]) -> None:
    """Make ``cost=name`` resolvable by ``PlanRPrograms``: ``resolver(mod, maker,
    graph, vdevice, options, target)`` returns the cost model and a summary for the plan."""
    COST_RESOLVERS[name] = resolver
