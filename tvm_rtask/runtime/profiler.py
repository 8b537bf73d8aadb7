"""The measured cost model: time every rKernel on the device present, derive the time of one
rTask, and calibrate the analytical model with per-device efficiency factors.

Each rKernel PrimFunc is built stand-alone with ``tvm.compile`` and timed with TVM's
``time_evaluator`` on random inputs. On llvm a stand-alone rKernel runs its rTasks one after
the other on one thread, so one rTask takes the measured time / rTasks; on a GPU the
stand-alone kernel runs ``concurrent`` rTasks at once (its co-resident blocks), so one rTask
takes the measured time / rounds. Measurements are cached on disk as one JSON file per
kernel, keyed by a structural hash of the PrimFunc, the target, the rTask count and the host
CPU (``TVM_RTASK_CACHE`` or ``~/.cache/tvm_rtask/profiles``).

Optional: ``tvm_rtask.compile`` keeps the analytical model. Use :func:`measured_cost_model`
for a :class:`~tvm_rtask.schedule.CalibratedCostModel` of a model, or :func:`plan_measured`
for a Plan made with it. This module imports TVM; ``tvm_rtask.schedule`` never imports it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..backend import as_target, get_backend
from ..backend.cpu.threads import cpu_model_name  # noqa: F401 - part of this module's API
from ..core import Plan, RGraph, RKernel, ROperator, VDevice
from ..errors import OptionError
from ..schedule.cost import CalibratedCostModel, calibrate
from ..schedule.planner import make_plan

CACHE_ENV = "TVM_RTASK_CACHE"
FORMAT = 1


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tvm_rtask" / "profiles"


@dataclass
class Measurement:
    """One rKernel timed alone: ``total_us`` for all its rTasks, ``rtask_us`` for one."""

    kernel: str
    num_rtasks: int
    total_us: float
    rtask_us: float
    target: str
    key: str
    cached: bool = False


class RKernelProfiler:
    """Times rKernel PrimFuncs on ``target`` (llvm by default), with an on-disk cache."""

    def __init__(
        self,
        target="llvm",
        cache_dir: str | os.PathLike | None = None,
        repeat: int = 5,
        min_repeat_ms: int = 2,
        use_cache: bool = True,
    ) -> None:
        import tvm

        self.tvm = tvm
        self.target = as_target(target)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.repeat, self.min_repeat_ms, self.use_cache = repeat, min_repeat_ms, use_cache
        self.backend = get_backend(self.target)
        self.device = self.backend.device()
        self.measured = 0
        self.hits = 0

    def key(self, func, num_rtasks: int) -> str:
        """Structural hash of the PrimFunc + target + rTask count + host, as hex."""
        import tvm_ffi

        text = "|".join(
            [
                str(FORMAT),
                str(tvm_ffi.structural_hash(func)),
                str(self.target),
                str(num_rtasks),
                self.backend.host_fingerprint(),
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def measure(self, func, num_rtasks: int, name: str = "", concurrent: int = 1) -> Measurement:
        """Time ``func`` alone; ``concurrent``: rTasks the stand-alone run executes at once."""
        key = self.key(func, num_rtasks)
        path = self.cache_dir / f"{key}.json"
        if self.use_cache and path.exists():
            try:
                d = json.loads(path.read_text())
                if d.get("key") == key:
                    self.hits += 1
                    fields = {f: d[f] for f in Measurement.__dataclass_fields__ if f in d}
                    return Measurement(**{**fields, "kernel": name or d["kernel"], "cached": True})
            except (OSError, ValueError, TypeError):
                pass  # a damaged entry is measured again
        total = self._time(func)
        rounds = math.ceil(num_rtasks / max(1, concurrent))
        m = Measurement(name, num_rtasks, total, total / rounds, str(self.target), key)
        self.measured += 1
        if self.use_cache:
            self._store(path, m)
        return m

    def _time(self, func) -> float:
        tvm = self.tvm
        func = func.with_attr("global_symbol", "main")
        lib = tvm.compile(tvm.IRModule({"main": func}), target=self.target)
        mod = lib.jit() if hasattr(lib, "jit") else lib
        rng = np.random.default_rng(0)
        args = []
        for p in func.params:
            shape = [int(x) for x in p.ty.shape]
            dtype = str(p.ty.dtype)
            if dtype.startswith("float"):
                value = rng.standard_normal(shape).astype(dtype)
            else:
                value = np.zeros(shape, dtype=dtype)
            args.append(tvm.runtime.tensor(value, self.device))
        mod["main"](*args)  # warm up, and fail here rather than inside the timer
        timer = mod.time_evaluator(
            "main", self.device, number=1, repeat=self.repeat, min_repeat_ms=self.min_repeat_ms
        )
        return float(timer(*args).median) * 1e6

    def _store(self, path: Path, m: Measurement) -> None:
        """Write atomically, so concurrent profilers never read half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        d = asdict(m)
        d.pop("cached")
        d["measured_at"] = time.time()
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(d, f)
        os.replace(f.name, path)


def profile_module(
    mod,
    target="llvm",
    num_veu: int | None = None,
    rtasks_per_veu: int = 2,
    profiler: RKernelProfiler | None = None,
    fusion: str | None = None,
) -> tuple[RGraph, VDevice, list[tuple[ROperator, RKernel, float]]]:
    """Prepare ``mod`` as ``tvm_rtask.compile`` does, make its CPU rKernels and time each.

    Returns the rOperator graph (rKernel names as ``PlanRPrograms`` gives them), the CPU
    vDevice and one ``(operator, rKernel, us per rTask)`` sample per distinct rKernel.
    """
    from .. import frontend
    from ..options import resolve_options
    from ..relax_passes import RTaskPrepare, extract_graph

    profiler = profiler or RKernelProfiler(target)
    backend = profiler.backend
    if not backend.rkernels_run_standalone:
        raise OptionError(
            f"the {backend.name} backend's rKernels cannot run alone (they take the "
            "dispatcher's task and thread ids): profile_module cannot time them"
        )
    options = resolve_options({"num_veu": num_veu, "rtasks_per_veu": rtasks_per_veu})
    backend.check_options(options)
    prepared = RTaskPrepare(fusion, profiler.target)(frontend.load(mod))
    prepared, variants_for, vdevice_of = backend.make_rkernels(prepared.clone(), options)
    funcs: dict[str, tuple[object, RKernel]] = {}

    def rkernels_for(name: str) -> list[RKernel]:
        if name not in funcs:
            kernel = variants_for(name)[0]  # the most parallel variant, in place of ``name``
            funcs[name] = (prepared[name], kernel)
        return [funcs[name][1]]

    graph = RGraph(extract_graph(prepared, rkernels_for).operators)
    vdevice = vdevice_of()
    samples = []
    done: dict[str, float] = {}
    for op in graph:
        if not op.supported:
            continue
        kernel = op.rkernels[0]
        if kernel.name not in done:
            func, _ = funcs[op.func]
            done[kernel.name] = profiler.measure(func, kernel.num_rtasks, kernel.name).rtask_us
        samples.append((op, kernel, done[kernel.name]))
    return graph, vdevice, samples


def measured_cost_model(
    mod,
    target="llvm",
    num_veu: int | None = None,
    rtasks_per_veu: int = 2,
    cache_dir: str | os.PathLike | None = None,
    profiler: RKernelProfiler | None = None,
) -> CalibratedCostModel:
    """A cost model with the measured rTask time of every rKernel of ``mod`` and the
    device's efficiency factors fitted to them (for kernels it has not measured)."""
    profiler = profiler or RKernelProfiler(target, cache_dir=cache_dir)
    _, vdevice, samples = profile_module(mod, target, num_veu, rtasks_per_veu, profiler)
    return calibrate(samples, vdevice)


def plan_measured(
    mod,
    target="llvm",
    policy: str = "wavefront",
    num_veu: int | None = None,
    rtasks_per_veu: int = 2,
    cache_dir: str | os.PathLike | None = None,
    **policy_options,
) -> Plan:
    """Plan ``mod`` like ``tvm_rtask.plan`` but with the measured cost model."""
    profiler = RKernelProfiler(target, cache_dir=cache_dir)
    graph, vdevice, samples = profile_module(mod, target, num_veu, rtasks_per_veu, profiler)
    cost = calibrate(samples, vdevice)
    plan = make_plan(graph, vdevice, policy, cost=cost, **policy_options)
    plan.options = {**plan.options, "cost_model": "calibrated"}
    return plan
