"""The synchronisation micro-benchmark: what one barrier and one launch cost on the device.

The cost model charges every barrier rTask ``barrier_us`` on top of waiting for its tasks,
and every rProgram or ordinary call ``launch_us``. Both are measured here in the persistent
kernels the backend really generates, not in a hand-written imitation: three tiny models of
``num_ops`` identical elementwise operators (``negative`` on a ``[num_veu, 256]`` tensor,
one rTask per vEU) go through the real path (``RTaskPrepare``, ``backend.make_rkernels``,
``extract_graph``, a validated ``Plan``, ``LowerRPrograms``, ``backend.build``) with the
placement fixed by hand (rTask ``t`` of every operator on vEU ``t % num_veu``):

* ``chain``: each operator reads the previous one's output, one rProgram: every vEU passes
  ``num_ops - 1`` barriers (fine: a step-array wait and signal; counter: an arrival and a
  counter wait; global: a parallel barrier), each on the critical path;
* ``independent``: each operator reads the input, one rProgram: the same tasks, no barrier;
* ``launches``: the independent operators, one rProgram each: ``num_ops - 1`` more launches.

Every operator's output is a model output in all three, so they allocate the same tensors.
The variants are timed in interleaved rounds (``time_evaluator`` of the Relax VM's
``main``), and the costs are differences of medians::

    barrier_us = (median(chain) - median(independent)) / barriers per vEU
    launch_us  = (median(launches) - median(independent)) / (num_ops - 1)

Results are cached on disk (the profiler's cache directory, ``sync-<key>.json``), keyed by
the target, the device's name, the barrier kind, the vEU count and a structural hash of the
three lowered modules (a change in the dispatcher is a new key). This module imports TVM.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..backend import as_target, get_backend, target_dict
from ..core import OrdinaryCall, Plan, RGraph, RProgram, RTask
from ..core.rprogram import Barrier
from ..errors import OptionError

FORMAT = 1
VARIANTS = ("chain", "independent", "launches")
ROW = 256  # elements of one rTask: one row of the [num_veu, ROW] tensor
MINIMAL_BARRIERS_UP_TO = 32  # vEUs; see _program


@dataclass
class SyncCost:
    """Measured synchronisation costs of one device, target, barrier kind and vEU count."""

    barrier_us: float  # one barrier on the critical path (wait + signal / arrive)
    launch_us: float  # one more rProgram launch (VM call_tir + kernel / parallel launch)
    device: str  # the device's name (CPU model, GPU name)
    target: str
    barrier: str  # "fine", "global" or "counter": what barrier_us is the cost of
    num_veu: int
    method: str  # how it was measured, in words
    medians_us: dict[str, float] = field(default_factory=dict)  # one VM call per variant
    quartiles_us: dict[str, list[float]] = field(default_factory=dict)  # [25%, 75%]
    num_ops: int = 0
    barriers_per_veu: int = 0
    rounds: int = 0
    key: str = ""
    measured_at: float = 0.0
    cached: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("cached")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SyncCost:
        known = set(cls.__dataclass_fields__) - {"cached"}
        return cls(**{k: v for k, v in d.items() if k in known})


# -- the synthetic models ---------------------------------------------------------------------
def _module(num_ops: int, rows: int, chain: bool):
    """``num_ops`` negations of a ``[rows, ROW]`` tensor, chained or all reading the input;
    every result is a model output."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, ROW), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs, prev = [], x
            for _ in range(num_ops):
                prev = bb.emit_output(relax.op.negative(prev if chain else x))
                outs.append(prev)
        bb.emit_func_output(relax.Tuple(outs))
    return bb.get()


def _prepare(mod, target, options):
    """The module after ``RTaskPrepare`` and ``make_rkernels``, its graph and vDevice."""
    from ..relax_passes import RTaskPrepare, extract_graph

    backend = get_backend(target)
    prepared = RTaskPrepare(options.fusion, target)(mod)
    prepared, maker = backend.make_rkernels(prepared.clone(), options)
    graph = RGraph(extract_graph(prepared, maker).operators)
    return prepared, graph, maker.vdevice()


def _kernel(op, num_veu: int):
    """The rKernel with one rTask per vEU when the backend made one, else the first."""
    return next((k for k in op.rkernels if k.num_rtasks == num_veu), op.rkernels[0])


def _program(graph: RGraph, ops: list, num_veu: int, chained: bool, name: str) -> RProgram:
    """rTask ``t`` of each operator on vEU ``t % num_veu``, in operator order; with
    ``chained`` operator ``i``'s tasks wait for all of operator ``i - 1``'s (its wave is
    ``i``: global barriers lower per wave).

    Up to ``MINIMAL_BARRIERS_UP_TO`` vEUs the waits are the minimal ones ``RProgram``
    derives, as the wavefront policy places them (each vEU waits for the others); beyond,
    one barrier object shared by every vEU waits for every task of the operator before, as
    ``ios`` and ``wavefront_global`` place them (minimal per-vEU barriers take time
    quadratic in the vEUs to plan: 10 ms each for 1,056 vEUs)."""
    prog = RProgram(num_veu, name)
    previous: list[RTask] = []
    for wave, op in enumerate(ops):
        kernel = _kernel(op, num_veu)
        tasks = [
            RTask(op.name, t, kernel.name, wave if chained else 0) for t in range(kernel.num_rtasks)
        ]
        shared = None
        if chained and previous and num_veu > MINIMAL_BARRIERS_UP_TO:
            shared = Barrier(tuple((u, prog.count(u) - 1) for u in range(num_veu) if prog.count(u)))
            for veu in sorted({t % num_veu for t in range(len(tasks))}):
                prog.append_barrier(veu, shared)
        for t, task in enumerate(tasks):
            if chained and previous and shared is None:
                prog.wait(task, previous)
            prog.append(task, t % num_veu)
        previous = tasks
    return prog


def _plan(graph: RGraph, vdevice, options, target, variant: str) -> Plan:
    supported = [op for op in graph if op.supported]
    if variant == "launches":
        steps: list = [
            _program(graph, [op], vdevice.num_veu, False, f"sync_{i}")
            for i, op in enumerate(supported)
        ]
    else:
        steps = [_program(graph, supported, vdevice.num_veu, variant == "chain", "sync")]
    steps += [OrdinaryCall(op.name) for op in graph if not op.supported]
    plan = Plan(graph, vdevice, steps, policy="sync-bench")
    backend = get_backend(target)
    plan.validate(backend.sync(options))
    plan.options = options.to_dict()
    plan.target = target_dict(target)
    return plan


def _lowered(variant: str, num_ops: int, target, options, num_veu: int | None):
    """``(lowered module, plan)`` of one variant."""
    from ..relax_passes import with_plan
    from ..relax_passes.lower_rprograms import LowerRPrograms

    rows = num_veu or 1
    prepared, graph, vdevice = _prepare(_module(num_ops, rows, variant == "chain"), target, options)
    plan = _plan(graph, vdevice, options, target, variant)
    lowered = LowerRPrograms()(with_plan(prepared, plan))
    return lowered, plan


def _barriers_per_veu(plan: Plan, barrier: str = "fine") -> int:
    """Barriers each vEU passes on its way through the plan's rPrograms (the most of any);
    with ``barrier="global"`` one between consecutive waves, as the CPU lowers them."""
    total = 0
    for prog in plan.programs():
        if barrier == "global":
            total += len({t.wave for t in prog.tasks()}) - 1
        else:
            total += max(sum(isinstance(e, Barrier) for e in entries) for entries in prog.entries)
    return total


# -- measuring ----------------------------------------------------------------------------------
def _structural_key(parts: list[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _time_rounds(vms: dict, args: dict, device, rounds: int, min_repeat_ms: int) -> dict:
    """Per variant, the mean time of one VM call in each of ``rounds`` interleaved blocks."""
    samples: dict[str, list[float]] = {v: [] for v in vms}
    timers = {
        v: vm.time_evaluator("main", device, number=1, repeat=1, min_repeat_ms=min_repeat_ms)
        for v, vm in vms.items()
    }
    for v, vm in vms.items():  # warm up (and fail here, not in the timer)
        vm["main"](*args[v])
    for _ in range(rounds):
        for v, timer in timers.items():
            samples[v].append(float(timer(*args[v]).mean) * 1e6)
    return samples


def sync_programs(
    target="llvm", num_veu: int | None = None, barrier: str | None = None, num_ops: int = 16
) -> tuple[dict[str, tuple], object]:
    """The three synthetic models lowered by the backend: ``({variant: (lowered module,
    plan)}, options)``. Needs no device (the CUDA ones lower and build without a GPU)."""
    from ..options import resolve_options

    if num_ops < 2:
        raise OptionError(f"the sync benchmark needs num_ops >= 2, not {num_ops}")
    target = as_target(target)
    backend = get_backend(target)
    explicit = {"num_veu": num_veu, "barrier": barrier, "rtasks_per_veu": 1, "fusion": "none"}
    options = resolve_options(explicit)
    backend.check_options(options)
    if num_veu is None:  # the vDevice's own vEU count, fixed for the three models
        _, _, vdevice = _prepare(_module(1, 1, False), target, options)
        num_veu = vdevice.num_veu
        options = resolve_options({**explicit, "num_veu": num_veu})
    lowered = {v: _lowered(v, num_ops, target, options, num_veu) for v in VARIANTS}
    return lowered, options


def sync_benchmark(
    target="llvm",
    num_veu: int | None = None,
    barrier: str | None = None,
    num_ops: int = 16,
    rounds: int = 15,
    min_repeat_ms: int = 2,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    refresh: bool = False,
) -> SyncCost:
    """Measure ``barrier_us`` and ``launch_us`` of ``target``'s generated persistent kernels
    on the device present (see the module docstring); cached on disk.

    ``num_veu``: vEUs of the synthetic rPrograms (default: the backend's vDevice, every
    worker thread or co-resident block); ``barrier``: the barrier kind (default: the
    backend's). ``num_ops`` operators per model, timed in ``rounds`` interleaved blocks of
    at least ``min_repeat_ms`` each; ``refresh`` measures again and overwrites the cache.
    OptionError when the target's device is not present.
    """
    import tvm
    import tvm_ffi
    from tvm import relax

    from .. import native
    from .cache import default_cache_dir

    target = as_target(target)
    backend = get_backend(target)
    device = backend.device()  # OptionError when the device is not present
    lowered, options = sync_programs(target, num_veu, barrier, num_ops)
    num_veu = options.num_veu
    barrier_kind = backend.barrier(options)
    device_name = backend.device_name()
    key = _structural_key(
        [
            str(FORMAT),
            str(target),
            device_name,
            backend.host_fingerprint(),
            barrier_kind,
            str(num_veu),
            *(str(tvm_ffi.structural_hash(lowered[v][0])) for v in VARIANTS),
        ]
    )
    path = Path(cache_dir or default_cache_dir()) / f"sync-{key}.json"
    if use_cache and not refresh:
        cached = _load(path, key)
        if cached is not None:
            return cached
    native.load()
    vms, args = {}, {}
    x = np.random.default_rng(0).standard_normal((num_veu, ROW)).astype("float32")
    for v, (mod, plan) in lowered.items():
        vms[v] = relax.VirtualMachine(backend.build(mod, plan, options), device)
        args[v] = [tvm.runtime.tensor(x, device)]
    samples = _time_rounds(vms, args, device, rounds, min_repeat_ms)
    medians = {v: float(np.median(s)) for v, s in samples.items()}
    quartiles = {v: [float(q) for q in np.percentile(s, [25, 75])] for v, s in samples.items()}
    barriers = _barriers_per_veu(lowered["chain"][1], barrier_kind) - _barriers_per_veu(
        lowered["independent"][1], barrier_kind
    )
    extra_launches = len(lowered["launches"][1].programs()) - 1
    # one vEU never waits for another: its chain has no barrier, nothing to measure
    barrier_us = (medians["chain"] - medians["independent"]) / barriers if barriers else 0.0
    launch_us = (medians["launches"] - medians["independent"]) / max(extra_launches, 1)
    if not (math.isfinite(barrier_us) and math.isfinite(launch_us)):
        raise RuntimeError(f"the sync benchmark measured non-finite times: {medians}")
    result = SyncCost(
        barrier_us=max(barrier_us, 0.0),
        launch_us=max(launch_us, 0.0),
        device=device_name,
        target=str(target),
        barrier=barrier_kind,
        num_veu=num_veu,
        method=(
            f"{num_ops} elementwise operators of {num_veu} rTasks (one per vEU) lowered by "
            f"the backend: median VM call of a chain in one rProgram ({barriers} "
            f"{barrier_kind} barriers per vEU) minus the same operators independent in one "
            f"rProgram, per barrier; the independent operators in {num_ops} rPrograms minus "
            f"in one, per extra launch; {rounds} interleaved rounds of time_evaluator "
            f"(min_repeat_ms={min_repeat_ms})"
        ),
        medians_us=medians,
        quartiles_us=quartiles,
        num_ops=num_ops,
        barriers_per_veu=barriers,
        rounds=rounds,
        key=key,
        measured_at=time.time(),
    )
    if use_cache:
        _store(path, result)
    return result


def _load(path: Path, key: str) -> SyncCost | None:
    """The cached result at ``path``, or None (missing, unreadable or another key: measured
    again, never an error)."""
    try:
        d = json.loads(path.read_text())
        if d.get("key") != key:
            return None
        result = SyncCost.from_dict(d)
        if not (math.isfinite(result.barrier_us) and math.isfinite(result.launch_us)):
            return None
        result.cached = True
        return result
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _store(path: Path, result: SyncCost) -> None:
    """Write atomically, so concurrent benchmarks never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(result.to_dict(), f, indent=1)
    os.replace(f.name, path)
