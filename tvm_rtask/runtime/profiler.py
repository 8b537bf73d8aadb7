"""The measured cost model: time every rKernel on the device present, derive the time of one
rTask, measure what a barrier and a launch cost, and calibrate the analytical model.

Each rKernel is timed alone as its backend says it can run alone
(``Backend.standalone_rkernel``): on llvm the rKernel PrimFunc itself, which runs its rTasks
one after the other on one thread, so one rTask takes the measured time / rTasks; on CUDA the
scheduled kernel the rKernel was made from, built by ``tvm.compile`` with its own grid, of
which ``concurrent`` blocks run at once (SMs x blocks per SM at the registers ptxas gives
it), so one block takes the measured time / ``ceil(blocks / concurrent)`` and one rTask its
share of blocks. Timing is TVM's ``time_evaluator`` on random inputs. Measurements are
cached on disk as one JSON file per kernel, keyed by a structural hash of the PrimFunc, the
target, the rTask count and the device (the CPU's model and cores, the GPU's name;
``TVM_RTASK_CACHE`` or ``~/.cache/tvm_rtask/profiles``); a damaged file is measured again.

The synchronisation costs come from :mod:`tvm_rtask.runtime.sync_bench`. Entry points:
:func:`profile_model` (``tvm-rtask profile``), ``cost="measured"`` (``PlanRPrograms`` calls
:func:`measured_model_for`), :func:`measured_cost_model` and :func:`plan_measured`. This
module imports TVM; ``tvm_rtask.policies`` never imports it.

Shipped profiles (``profiles/<device>/``, package data; docs/scheduling.md, "Measured cost
model without a GPU: shipped profiles"): where the target's GPU is absent, ``cost="measured"``
plans with the profile a real GPU run exported for the options' device (one cache entry per
kernel, named by its key, and ``device.json``), read-only: it never measures and never
writes there. :func:`export_shipped` (``tvm-rtask profile --export-shipped DIR``) makes one.
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
from ..backend.base import RKernelMaker
from ..backend.cpu.threads import cpu_model_name  # noqa: F401 - part of this module's API
from ..core import Plan, RGraph, RKernel, ROperator, VDevice
from ..errors import OptionError
from ..policies.cost import CalibratedCostModel, calibrate, register_cost_resolver
from ..policies.planner import make_plan
from .cache import CACHE_ENV, default_cache_dir  # noqa: F401 - part of the API
from .sync_bench import SyncCost

FORMAT = 1
# Shipped profiles: one directory per device the options name (h100, h200), package data.
SHIPPED_DIR = Path(__file__).resolve().parent / "profiles"
SHIPPED_FORMAT = 1
DEVICE_FILE = "device.json"
MISSING_LISTED = 20  # kernels a shipped profile lacks, named in the plan's options


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
    # what the stand-alone run was made of: ``blocks`` units of work (rTasks on llvm, thread
    # blocks on CUDA, where a coarsened rTask is several), ``concurrent`` of them at once
    blocks: int = 0
    concurrent: int = 1

    @property
    def width(self) -> int:
        """Blocks that ran side by side: the width the time was taken at
        (``CalibratedCostModel.measured_width``)."""
        return max(1, min(self.blocks or self.num_rtasks, self.concurrent))


class RKernelProfiler:
    """Times rKernel PrimFuncs on ``target`` (llvm by default), with an on-disk cache."""

    def __init__(
        self,
        target="llvm",
        cache_dir: str | os.PathLike | None = None,
        repeat: int = 5,
        min_repeat_ms: int = 2,
        use_cache: bool = True,
        refresh: bool = False,
        shipped: ShippedProfile | None = None,
    ) -> None:
        """``use_cache``: read and write the disk cache; ``refresh``: measure again and
        overwrite what the cache holds. ``shipped``: read that shipped profile instead (no
        device needed, keys made with its GPU's name; :meth:`measure` never times and never
        writes, and returns None for a kernel the profile lacks, listed in ``missing``)."""
        import tvm

        self.tvm = tvm
        self.target = as_target(target)
        self.shipped = shipped
        if shipped is not None:
            cache_dir, use_cache, refresh = shipped.path, False, False
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.repeat, self.min_repeat_ms, self.use_cache = repeat, min_repeat_ms, use_cache
        self.refresh = refresh
        self.backend = get_backend(self.target)
        self.device = self.backend.device() if shipped is None else None
        self.measured = 0
        self.hits = 0
        self.widths: dict[str, int] = {}  # rKernel -> Measurement.width, of every measure()
        self.missing: list[str] = []  # shipped: the kernels the profile lacks

    def fingerprint(self) -> str:
        """The device a measurement belongs to: the shipped profile's GPU, else the host's."""
        return self.shipped.name if self.shipped is not None else self.backend.host_fingerprint()

    def key(self, func, num_rtasks: int) -> str:
        """Structural hash of the PrimFunc + target + rTask count + host, as hex."""
        import tvm_ffi

        text = "|".join(
            [
                str(FORMAT),
                str(tvm_ffi.structural_hash(func)),
                str(self.target),
                str(num_rtasks),
                self.fingerprint(),
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def measure(
        self,
        func,
        num_rtasks: int,
        name: str = "",
        concurrent: int = 1,
        blocks: int | None = None,
    ) -> Measurement | None:
        """Time ``func`` alone (None: a shipped profile lacks it); ``concurrent``: rTasks (or
        ``blocks``) the stand-alone run executes at once. With ``blocks`` (thread blocks of a
        CUDA kernel whose rTask groups ``blocks / num_rtasks`` of them) one block takes the
        time / ``ceil(blocks / concurrent)`` rounds and one rTask its share of blocks."""
        blocks = num_rtasks if blocks is None else blocks
        key = self.key(func, num_rtasks)
        path = self.cache_dir / f"{key}.json"
        if self.shipped is not None:  # read-only: found, or missing (None)
            found = self._read(path, key, name)
            if found is None:
                self.missing.append(name or key)
            return found
        if self.use_cache and not self.refresh and path.exists():
            found = self._read(path, key, name)  # a damaged entry is measured again
            if found is not None:
                return found
        total = self._time(func)
        rounds = math.ceil(blocks / max(1, concurrent))
        per_rtask = total / rounds * (blocks / num_rtasks)
        m = Measurement(
            name, num_rtasks, total, per_rtask, str(self.target), key, False, blocks, concurrent
        )
        self.measured += 1
        if self.use_cache:
            self._store(path, m)
        self.widths[m.kernel] = m.width
        return m

    def _read(self, path: Path, key: str, name: str) -> Measurement | None:
        """The entry at ``path`` if it is ``key``'s and readable, else None."""
        try:
            d = json.loads(path.read_text())
            if d.get("key") != key:
                return None
            fields = {f: d[f] for f in Measurement.__dataclass_fields__ if f in d}
            m = Measurement(**{**fields, "kernel": name or d["kernel"], "cached": True})
        except (OSError, ValueError, TypeError, KeyError):
            return None
        self.hits += 1
        self.widths[m.kernel] = m.width
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
        d["device"] = self.backend.host_fingerprint()  # what export_shipped selects by
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(d, f)
        os.replace(f.name, path)


@dataclass
class ModelProfile:
    """Every distinct rKernel of a model timed alone, the synchronisation benchmark, and the
    cost model fitted to them (``tvm-rtask profile``)."""

    graph: RGraph
    vdevice: VDevice
    measurements: list[Measurement]  # one per distinct rKernel, in graph order
    samples: list[tuple[ROperator, RKernel, float]]  # (operator, rKernel, us per rTask)
    sync: SyncCost | None
    model: CalibratedCostModel
    device: str = ""  # the device's name (CPU model, GPU name)

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "target": self.measurements[0].target if self.measurements else "",
            "vdevice": self.vdevice.to_dict(),
            "kernels": [
                {k: v for k, v in asdict(m).items() if k != "key"} for m in self.measurements
            ],
            "sync": self.sync.to_dict() if self.sync is not None else None,
            "cost_model": self.model.to_dict(),
        }


def measure_rkernels(
    mod,
    maker,
    graph: RGraph,
    vdevice: VDevice,
    profiler: RKernelProfiler,
    all_variants: bool = True,
) -> tuple[list[Measurement], list[tuple[ROperator, RKernel, float]]]:
    """Time every distinct rKernel of ``graph`` (every variant, or each operator's first)
    alone as its backend runs it (``Backend.standalone_rkernel``); ``mod`` and
    ``maker`` are what ``make_rkernels`` returned. Returns the measurements (one per
    rKernel) and one ``(operator, rKernel, us per rTask)`` sample per operator and rKernel.
    With a shipped profile a kernel it lacks has neither (``profiler.missing`` lists it)."""
    backend = profiler.backend
    done: dict[str, Measurement] = {}
    samples = []
    for op in graph:
        if not op.supported or not op.rkernels:
            continue
        for kernel in op.rkernels if all_variants else op.rkernels[:1]:
            if kernel.name not in done:
                func, blocks, concurrent = backend.standalone_rkernel(
                    mod, maker, op.func, kernel, vdevice
                )
                done[kernel.name] = profiler.measure(
                    func, kernel.num_rtasks, kernel.name, concurrent, blocks
                )
            if done[kernel.name] is not None:
                samples.append((op, kernel, done[kernel.name].rtask_us))
    return [m for m in done.values() if m is not None], samples


def measure_model(
    mod,
    maker,
    graph: RGraph,
    vdevice: VDevice,
    options,
    profiler: RKernelProfiler,
    sync: bool = True,
) -> ModelProfile:
    """:func:`measure_rkernels` (every variant) and the synchronisation benchmark
    (:func:`~tvm_rtask.runtime.sync_bench.sync_benchmark`, at ``vdevice``'s vEU count and
    ``options``' barrier), fitted into one :class:`CalibratedCostModel`."""
    from .sync_bench import sync_benchmark

    measurements, samples = measure_rkernels(mod, maker, graph, vdevice, profiler)
    model = calibrate(samples, vdevice, widths=profiler.widths)
    model.prefer_measured = True  # timed here and now: wins over tuning records' est_us
    cost = None
    if sync:
        cost = sync_benchmark(
            profiler.target,
            num_veu=vdevice.num_veu,
            barrier=options.barrier,
            cache_dir=profiler.cache_dir,
            use_cache=profiler.use_cache,
            refresh=profiler.refresh,
        )
        model.barrier_overhead_us = cost.barrier_us
        model.launch_overhead_us = cost.launch_us
    name = profiler.backend.device_name()
    return ModelProfile(graph, vdevice, measurements, samples, cost, model, name)


def profile_model(
    mod,
    target="llvm",
    cache_dir: str | os.PathLike | None = None,
    sync: bool = True,
    use_cache: bool = True,
    refresh: bool = False,
    **options,
) -> ModelProfile:
    """Prepare ``mod`` as ``tvm_rtask.plan`` does with ``options`` (the same rKernels, so
    the same cache entries as ``cost="measured"``), time every distinct rKernel and run the
    synchronisation benchmark on the device present."""
    from .. import frontend
    from ..relax_passes import RTaskPrepare, extract_graph
    from ..relax_passes.plan_rprograms import plan_options

    profiler = RKernelProfiler(target, cache_dir=cache_dir, use_cache=use_cache, refresh=refresh)
    resolved = plan_options({**options, "cost": "analytical"}, None, profiler.target)
    prepared = RTaskPrepare(resolved.fusion, profiler.target)(frontend.load(mod))
    prepared, maker = profiler.backend.make_rkernels(prepared.clone(), resolved)
    graph = RGraph(extract_graph(prepared, maker).operators)
    return measure_model(prepared, maker, graph, maker.vdevice(), resolved, profiler, sync)


def measured_model_for(mod, maker, graph: RGraph, vdevice: VDevice, options, target):
    """``cost="measured"``: the cost model ``PlanRPrograms`` plans with, from the rKernels
    it has just made (cached measurements where ``$TVM_RTASK_CACHE`` has them, else timed
    now on the device present) and a short summary for ``Plan.options``. Where the target's
    device is absent: the shipped profile of the options' device (:func:`shipped_model_for`),
    or a one-line OptionError when there is none."""
    backend = get_backend(as_target(target))
    try:
        backend.device()
    except OptionError:
        device = backend.device_spec(options).name
        shipped = shipped_profile(device)
        if shipped is None:
            raise OptionError(no_shipped_profile_message(device, backend.name)) from None
        return shipped_model_for(mod, maker, graph, vdevice, options, target, shipped)
    profile = measure_model(mod, maker, graph, vdevice, options, RKernelProfiler(target))
    summary = {
        "device": profile.device,
        "kernels": len(profile.measurements),
        "kernels_cached": sum(m.cached for m in profile.measurements),
        "barrier_us": profile.model.barrier_overhead_us,
        "launch_us": profile.model.launch_overhead_us,
        "factors": {k: list(v) for k, v in profile.model.factors.items()},
    }
    return profile.model, summary


# -- shipped profiles ---------------------------------------------------------------------------
@dataclass
class ShippedProfile:
    """A device's profile shipped as package data (``profiles/<device>/``): the profiler's
    cache entries of one GPU (``<key>.json``) and ``device.json`` (see :func:`export_shipped`)."""

    device: str  # the options' device, the directory's name (h100, h200)
    path: Path
    name: str  # the GPU's name as ``host_fingerprint()`` gave it: the kernels' keys hold it
    target: str = ""
    date: str = ""
    commands: tuple[str, ...] = ()
    sync: tuple[SyncCost, ...] = ()
    factors: dict | None = None  # {spec name: [compute eff., memory eff., overhead us]}

    @classmethod
    def load(cls, path: str | os.PathLike) -> ShippedProfile:
        path = Path(path)
        try:
            d = json.loads((path / DEVICE_FILE).read_text())
            return cls(
                device=str(d.get("device") or path.name),
                path=path,
                name=str(d["name"]),
                target=str(d.get("target", "")),
                date=str(d.get("date", "")),
                commands=tuple(d.get("commands", ())),
                sync=tuple(SyncCost.from_dict(x) for x in d.get("sync") or ()),
                factors={k: [float(x) for x in v] for k, v in (d.get("factors") or {}).items()},
            )
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise OptionError(
                f"the shipped profile {path / DEVICE_FILE} is damaged ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}): export it again"
            ) from None

    def sync_for(self, barrier: str, num_veu: int) -> SyncCost | None:
        """The synchronisation costs measured with ``barrier`` at the vEU count nearest
        ``num_veu`` (None: none with that barrier)."""
        same = [
            c
            for c in self.sync
            if c.barrier == barrier
            and all(math.isfinite(x) and x >= 0 for x in (c.barrier_us, c.launch_us))
        ]
        return min(same, key=lambda c: (abs(c.num_veu - num_veu), -c.num_veu), default=None)

    def kernel_files(self) -> list[Path]:
        return sorted(p for p in self.path.glob("*.json") if p.name != DEVICE_FILE)


def shipped_profile(device: str) -> ShippedProfile | None:
    """The shipped profile of ``device`` (``SHIPPED_DIR/<device>/device.json``), or None."""
    path = Path(SHIPPED_DIR) / device.strip().lower()
    if not (path / DEVICE_FILE).is_file():
        return None
    return ShippedProfile.load(path)


def no_shipped_profile_message(device: str, backend: str = "cuda", lead: str = "") -> str:
    """One line: cost="measured" cannot plan for ``device`` here, and what to do (``lead``:
    the start of the line, by default that no GPU is present)."""
    lead = lead or (
        f"cost='measured' needs a {backend.upper()} GPU to time the rKernels on, and none is "
        "present,"
    )
    return (
        f"{lead} or a shipped profile of device {device!r} ({Path(SHIPPED_DIR) / device} "
        f"has none): run `tvm-rtask profile MODEL --target {backend} --option device={device} "
        f"--export-shipped tvm_rtask/runtime/profiles/{device}` on a machine with that GPU "
        "(docs/scheduling.md, shipped profiles), or use cost='analytical'"
    )


def shipped_model_for(
    mod, maker, graph: RGraph, vdevice: VDevice, options, target, shipped: ShippedProfile
):
    """``cost="measured"`` without the device: the shipped measurement of every rKernel the
    profile has (keys made with its GPU's name), the calibrated roofline for the others
    (factors fitted to the kernels found; none found: ``device.json``'s factors, else the
    analytical model's), barrier and launch from ``device.json``. Read-only."""
    profiler = RKernelProfiler(target, shipped=shipped)
    measurements, samples = measure_rkernels(mod, maker, graph, vdevice, profiler)
    model = calibrate(samples, vdevice, widths=profiler.widths)
    model.prefer_measured = True
    factors_from = "fit" if samples else "analytical"
    spec = vdevice.spec.name
    if not samples and shipped.factors and spec in shipped.factors:
        # through the constructor: checked as any calibration (PlanError when impossible)
        model.factors[spec] = CalibratedCostModel({spec: shipped.factors[spec]}).factors[spec]
        factors_from = "device.json"
    sync = shipped.sync_for(profiler.backend.barrier(options), vdevice.num_veu)
    if sync is not None:
        model.barrier_overhead_us = sync.barrier_us
        model.launch_overhead_us = sync.launch_us
    summary = {
        "device": shipped.name,
        "kernels": len(measurements),
        "kernels_cached": len(measurements),
        "barrier_us": model.barrier_overhead_us,
        "launch_us": model.launch_overhead_us,
        "factors": {k: list(v) for k, v in model.factors.items()},
        "shipped": {
            "device": shipped.device,
            "name": shipped.name,
            "date": shipped.date,
            "found": len(measurements),
            "missing": len(profiler.missing),
            "missing_kernels": sorted(profiler.missing)[:MISSING_LISTED],
            "factors_from": factors_from,
            "sync": None
            if sync is None
            else {
                "barrier": sync.barrier,
                "num_veu": sync.num_veu,
                "wanted_num_veu": vdevice.num_veu,
            },
        },
    }
    return model, summary


def _read_json(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _write_json_atomic(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(f.name, path)


def export_shipped(
    dest: str | os.PathLike,
    cache_dir: str | os.PathLike,
    profiles: list = (),
    name: str | None = None,
    device: str | None = None,
    target: str | None = None,
    command: str = "",
    date: str | None = None,
    device_name: str | None = None,
) -> dict:
    """Copy one GPU's profile from a profiler cache into ``dest`` in the shipped format
    (``tvm_rtask/runtime/profiles/<device>/``) and return ``device.json``'s content.

    ``cache_dir``: a profiler cache (``tvm-rtask profile --cache``, the window's
    ``profiles/<device>/``); every kernel entry of the GPU ``name`` (entries that name no
    device are taken too) becomes ``dest/<key>.json``, unchanged; every ``sync-*.json`` of
    that GPU joins ``device.json``'s ``sync`` (one per barrier kind, target and vEU count,
    the newest). ``profiles``: ``tvm-rtask profile --json`` documents (dicts or paths):
    their fitted factors are kept per model and their median is ``device.json``'s
    ``factors``; they name the GPU when ``name`` is None. ``device``: the options' device
    (default: ``dest``'s name). ``name`` is the device's ``host_fingerprint()`` (a GPU's
    name), ``device_name`` its ``device_name()`` as the sync results record it (default
    ``name``: the same on CUDA). An existing ``dest`` is merged into (commands appended)."""
    from ..core.vdevice import DEVICE_SPECS

    dest, cache_dir = Path(dest), Path(cache_dir)
    docs = [p if isinstance(p, dict) else _read_json(Path(p)) or {} for p in (profiles or ())]
    device = (device or dest.name).strip().lower()
    if dest.name.lower() in DEVICE_SPECS and dest.name.lower() != device:
        raise OptionError(
            f"a profile of device {device!r} cannot be shipped as {dest.name!r}: profile with "
            f"--option device={dest.name.lower()}"
        )
    syncs = [
        SyncCost.from_dict(d)
        for d in map(_read_json, sorted(cache_dir.glob("sync-*.json")))
        if d is not None and "barrier_us" in d
    ]
    names = {d["device"] for d in docs if d.get("device")}
    if name is None:
        names = names or {c.device for c in syncs}
        if len(names) != 1:
            raise OptionError(
                f"cannot tell which GPU {cache_dir} profiled ({sorted(names) or 'no name'}): "
                "give its name"
            )
        name = names.pop()
    sync_names = {name, device_name or name}
    old = _read_json(dest / DEVICE_FILE) or {}
    if old and old.get("name") != name:
        raise OptionError(
            f"{dest} holds a profile of {old.get('name')!r}, not {name!r}: export into an empty "
            "directory"
        )
    kernels = 0
    for path in sorted(cache_dir.glob("*.json")):
        d = _read_json(path)
        if path.name.startswith("sync-") or d is None or d.get("key") != path.stem:
            continue
        if "rtask_us" not in d or d.get("device", name) != name:
            continue
        if target is not None and d.get("target") != target:
            continue
        _write_json_atomic(dest / path.name, d)
        kernels += 1
    sync = {}
    for c in [*(SyncCost.from_dict(x) for x in old.get("sync") or ()), *syncs]:
        if c.device in sync_names and (target is None or c.target == target):
            k = (c.target, c.barrier, c.num_veu)
            if k not in sync or c.measured_at >= sync[k].measured_at:
                sync[k] = c
    by_model = dict(old.get("factors_by_model") or {})
    for i, d in enumerate(docs):
        factors = (d.get("cost_model") or {}).get("factors")
        if factors:
            by_model[str(d.get("model") or f"profile{i}")] = factors
    specs = sorted({s for f in by_model.values() for s in f})
    factors = {
        s: [float(np.median([f[s][j] for f in by_model.values() if s in f])) for j in range(3)]
        for s in specs
    }
    commands = [*old.get("commands", []), *([command] if command else [])]
    doc = {
        "format": SHIPPED_FORMAT,
        "device": device,
        "name": name,
        "target": target or old.get("target") or next((c.target for c in syncs), ""),
        "date": date or time.strftime("%Y-%m-%d"),
        "commands": commands,
        "sync": [c.to_dict() for _, c in sorted(sync.items())],
        "factors": factors,
        "factors_by_model": by_model,
        "kernels": len(list(dest.glob("*.json"))) - ((dest / DEVICE_FILE).exists()),
    }
    doc["exported_kernels"] = kernels
    _write_json_atomic(dest / DEVICE_FILE, doc)
    return doc


class _FirstVariant(RKernelMaker):
    """The most parallel rKernel of each operator only (it replaces the operator's PrimFunc
    in the module), with the wrapped maker's traits."""

    def __init__(self, maker: RKernelMaker) -> None:
        self.maker = maker
        self.multi_output = maker.multi_output

    def __call__(self, name: str) -> list[RKernel]:
        return self.maker(name)[:1]

    def vdevice(self) -> VDevice:
        return self.maker.vdevice()


def profile_module(
    mod,
    target="llvm",
    num_veu: int | None = None,
    rtasks_per_veu: int = 2,
    profiler: RKernelProfiler | None = None,
    fusion: str | None = None,
) -> tuple[RGraph, VDevice, list[tuple[ROperator, RKernel, float]]]:
    """Prepare ``mod`` as ``tvm_rtask.compile`` does, make its rKernels and time each
    operator's first (most parallel) one.

    Returns the rOperator graph (rKernel names as ``PlanRPrograms`` gives them), the
    vDevice and one ``(operator, rKernel, us per rTask)`` sample per operator.
    """
    from .. import frontend
    from ..options import resolve_options
    from ..relax_passes import RTaskPrepare, extract_graph

    profiler = profiler or RKernelProfiler(target)
    backend = profiler.backend
    options = resolve_options({"num_veu": num_veu, "rtasks_per_veu": rtasks_per_veu})
    backend.check_options(options)
    prepared = RTaskPrepare(fusion, profiler.target)(frontend.load(mod))
    prepared, maker = backend.make_rkernels(prepared.clone(), options)
    graph = RGraph(extract_graph(prepared, _FirstVariant(maker)).operators)
    vdevice = maker.vdevice()
    _, samples = measure_rkernels(prepared, maker, graph, vdevice, profiler, False)
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
    return calibrate(samples, vdevice, widths=profiler.widths)


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
    cost = calibrate(samples, vdevice, widths=profiler.widths)
    plan = make_plan(graph, vdevice, policy, cost=cost, **policy_options)
    plan.options = {**plan.options, "cost_model": "calibrated"}
    return plan


register_cost_resolver("measured", measured_model_for)
