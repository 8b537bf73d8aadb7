"""CPU latency of tvm-rtask and its peers, each runtime at its best, each in its own process:
``python -m bench peers`` (``--threads 1``: one thread each; ``--smoke``: a quick check),
also the method of the demo (``python -m tvm_rtask.demo``).

Models (``--models``): the light models of the onnx package (default ``inception_v1`` and
``squeezenet``), torchvision's architectures of ``tvm_rtask.models.real`` (``--size``), the zoo
of ``tvm_rtask.models``, looked up in that order (``light:``, ``real:``, ``zoo:`` in front of a
name picks one), or ``.onnx`` files; every weight seeded.

Method: for every model and runtime one fresh subprocess (``python -m bench.peers --worker
SPEC``), so that no other runtime's threads are alive in it; every runtime on the same number
of threads. The worker builds the runtime (compile time recorded), checks its outputs against
ONNX Runtime's (a wrong result is recorded, not timed), warms up, then times ``repeat`` calls
back to back (at least :data:`MIN_SAMPLES`; fewer only after ``max_seconds``): median, p10,
p90, N, and how busy the machine was meanwhile (:func:`cpu_sample`). Runtimes
(:data:`RUNTIMES`): ONNX Runtime (its latency settings; the reference, run first), OpenVINO
(``PERFORMANCE_HINT: LATENCY``, f32), TVM's default build, tvm-rtask sequential and
wavefront, PyTorch eager where installed (``bench/torch_modules.py``: torchvision's own module
for its classifiers, BatchNorm folded); every TVM and tvm-rtask build
for the same target, by default ``llvm-native`` (plain ``llvm`` is SSE2 code).

Writes ``bench/results/<date>-cpu-peers-<threads>t[-smoke].json`` and a ``.md`` beside it (the
README's tables: ``python -m tvm_rtask.demo --update-readme FILE`` puts them into README.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from bench import RESULTS, ROOT
from tvm_rtask.testing.onnx_light import max_relative_error

# name -> label; the running order (ONNX Runtime first: it writes the reference outputs).
RUNTIMES = {
    "onnxruntime": "ONNX Runtime (CPUExecutionProvider)",
    "openvino": "OpenVINO (CPU, LATENCY hint)",
    "tvm_default": "TVM default build (`tvm.compile`)",
    "rtask_default": "tvm-rtask default (policy auto)",
    "rtask_sequential": "tvm-rtask sequential",
    "rtask_wavefront": "tvm-rtask wavefront",
    "torch_eager": "PyTorch eager",
}
# tvm-rtask sequential with the CPU backend's schedule rules off (only the threads): opt-in.
RULES_OFF = "rtask_sequential_rules_off"
OPTIONAL = {RULES_OFF: "tvm-rtask sequential, CPU rules off"}
DEFAULT_RUNTIMES = list(RUNTIMES)
REFERENCES = ("onnxruntime", "tvm_default")  # the first that runs writes the reference
# tvm-rtask's builds -> policy (None: the default, what a user gets without naming one)
RTASK = {"rtask_default": None, "rtask_sequential": "sequential", "rtask_wavefront": "wavefront",
         RULES_OFF: "sequential"}  # fmt: skip
TVM_BUILDS = ("tvm_default", *RTASK)
DEFAULT_MODELS = ["inception_v1", "squeezenet"]
DEFAULT_TARGET = "llvm-native"
# Against ONNX Runtime: other kernels, other summation orders, fused BatchNorm, ...
TOLERANCE = 1e-3
MIN_SAMPLES = 10
# Other work on the machine while timing, in cores, above which the results carry a warning.
BUSY_CORES = 0.2
WORKER_TIMEOUT_S = 1800
SMOKE = {"warmup": 2, "repeat": 10, "max_seconds": 3.0}


def label(name: str) -> str:
    return RUNTIMES.get(name) or OPTIONAL.get(name) or name


def default_threads() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# -- statistics and the machine ----------------------------------------------------------------
def stats(samples_ms: list[float]) -> dict:
    """Median, p10, p90, min, mean and N of latencies in milliseconds."""
    p10, p50, p90 = np.percentile(samples_ms, [10, 50, 90])
    low, mean = np.min(samples_ms), np.mean(samples_ms)
    values = {"median_ms": p50, "p10_ms": p10, "p90_ms": p90, "min_ms": low, "mean_ms": mean}
    return {k: round(float(v), 4) for k, v in values.items()} | {"n": len(samples_ms)}


def time_calls(fn, warmup: int, repeat: int, max_seconds: float | None = None,
               min_samples: int = MIN_SAMPLES) -> list[float]:  # fmt: skip
    """``warmup`` calls, then back-to-back timed calls: ``repeat`` of them, or fewer (never
    fewer than ``min_samples``) once ``max_seconds`` of timing have passed. Milliseconds."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    begin = time.perf_counter()
    while len(samples) < max(repeat, 1):
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        samples.append((end - start) * 1e3)
        if max_seconds is not None and len(samples) >= min_samples and end - begin > max_seconds:
            break
    return samples


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, without importing TVM (a driver process
    stays light), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_sample() -> dict | None:
    """A snapshot for :func:`contention`: the machine's busy CPU seconds (``/proc/stat``),
    this process's CPU seconds and its threads' seconds spent runnable but waiting for a CPU
    (``/proc/self/task/*/schedstat``). Linux only; None elsewhere."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat", encoding="utf-8") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        busy = (sum(fields[:8]) - idle) / tick  # guest time is already in user time
        times = os.times()
        waited = 0.0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/schedstat", encoding="utf-8") as f:
                waited += int(f.read().split()[1]) / 1e9
        return {"wall": time.perf_counter(), "busy": busy, "own": times.user + times.system,
                "waited": waited}  # fmt: skip
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def os_threads() -> int | None:
    """Threads of this process (Linux), the calling one included."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def contention(before: dict | None, after: dict | None) -> dict:
    """Between two :func:`cpu_sample` snapshots: ``other_cores``, the cores other processes
    kept busy on average (0 on a quiet machine), and ``wait_threads``, this process's threads
    waiting for a CPU on average (0 when nothing else wanted its cores)."""
    if before is None or after is None:
        return {"other_cores": None, "wait_threads": None}
    wall = after["wall"] - before["wall"]
    if wall <= 0:
        return {"other_cores": None, "wait_threads": None}
    other = (after["busy"] - before["busy"]) - (after["own"] - before["own"])
    return {
        "other_cores": round(max(other, 0.0) / wall, 3),
        "wait_threads": round(max(after["waited"] - before["waited"], 0.0) / wall, 3),
    }


# the distributions a CPU peers record names the versions of
PEER_DISTRIBUTIONS = ("apache-tvm", "tvm-rtask", "numpy", "onnx", "onnxruntime", "openvino",
                      "torch", "torchvision", "onnx2torch")  # fmt: skip


def versions(distributions=PEER_DISTRIBUTIONS) -> dict:
    """Python's version and that of each installed distribution of ``distributions``."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in distributions:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _git(*args: str) -> str | None:
    try:
        cmd = ["git", *args]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


# what a runtime's worker runs: an edit elsewhere (docs, results files) changes no measurement
MEASURED_PATHS = (
    "tvm_rtask", "src", "bench", ":!bench/results", "pyproject.toml", "CMakeLists.txt"
)  # fmt: skip


def source_state() -> str | None:
    """A fingerprint of the uncommitted state of the code (``git status`` and ``git diff`` of
    :data:`MEASURED_PATHS`): a runtime's worker imports tvm_rtask afresh, so an edit of the
    code during a run changes what the later models measure; one of the docs does not."""
    import hashlib

    status = _git("status", "--porcelain", "--", *MEASURED_PATHS)
    diff = _git("diff", "HEAD", "--", *MEASURED_PATHS)
    if status is None or diff is None:
        return None
    return hashlib.sha256((status + "\0" + diff).encode()).hexdigest()[:16]


def environment(threads: int, target: str, command: str) -> dict:
    diff = _git("diff", "--name-only", "HEAD")
    env = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "command": command}
    env.update(cpu=cpu_name(), arch=platform.machine(), cores=os.cpu_count())
    env.update(cores_allowed=default_threads(), threads=threads, target=target)
    env.update(platform=platform.platform(), host=platform.node(), nice=os.nice(0))
    env.update(load_average_start=load_average(), versions=versions())
    env["commit"] = _git("rev-parse", "HEAD") or None
    env["uncommitted_changes"] = diff.split() if diff else [] if diff is not None else None
    return env | {"source_state": source_state()}


def target_label(target) -> str:
    """``llvm, mcpu rocketlake`` (or ``llvm``): how the tables name a TVM target."""
    mcpu = target.attrs.get("mcpu", None)
    return f"{target.kind.name}, mcpu {mcpu}" if mcpu else str(target.kind.name)


# -- models ----------------------------------------------------------------------------------
KINDS = ("light", "real", "zoo", "torchvision", "dense")


def dense_layer(shape: str, seed: int = 0):
    """``dense:MxKxN``: one transformer-style dense layer, ``x[1, M, K] @ W[K, N] + b`` (an
    ONNX ``MatMul`` and ``Add``, as torch exports ``nn.Linear`` on a sequence), He-normal
    weights as the zoo's (``GraphBuilder.linear``): one layer timed against the peers."""
    from tvm_rtask.models._builder import GraphBuilder

    try:
        m, k, n = (int(v) for v in shape.lower().split("x"))
    except ValueError:
        raise SystemExit(f"dense:{shape}: expected dense:MxKxN, e.g. dense:197x768x3072") from None
    builder = GraphBuilder(f"dense_{m}x{k}x{n}", seed)
    builder.output(builder.linear(builder.input("x", (1, m, k)), n))
    return builder.build()


def load_model(name: str, seed: int = 0, size: str | None = None):
    """An ``onnx.ModelProto`` with seeded weights: a real architecture of
    ``tvm_rtask.models.real`` (torchvision's: ``load_real_model(name, size, seed)``; ``size``:
    its ``"reduced"`` or ``"full"``), a light model of the onnx package (``inception_v1``,
    ``squeezenet``, ...), a model of the zoo (``tvm_rtask.models``), looked up in that order,
    or an ``.onnx`` file. ``light:``, ``real:`` or ``zoo:`` in front of a name picks the kind
    (``light:resnet50``: the onnx package's ResNet-50, not torchvision's); ``torchvision:NAME``
    exports any torchvision classifier (``bench.torch_modules.torchvision_onnx``: models the
    project was not tuned on); ``dense:MxKxN`` is one dense layer (:func:`dense_layer`). Real
    before light: the public set's ``resnet50`` and ``densenet121`` are torchvision's (with
    light first, a table of "torchvision's 15" held the onnx package's two for a while)."""
    import onnx

    if name.endswith(".onnx"):
        return onnx.load(name)
    kind, _, bare = name.rpartition(":")
    if kind and kind not in KINDS:
        raise SystemExit(f"unknown model kind {kind!r} in {name!r}: one of {', '.join(KINDS)}")
    from tvm_rtask.models.real import REAL_MODELS, load_real_model
    from tvm_rtask.testing.onnx_light import LIGHT_MODELS, load_light_model

    if kind == "dense":
        return dense_layer(bare, seed)
    if kind == "torchvision":  # any torchvision classifier, exported here (held-out models)
        from bench.torch_modules import NoTorchModule, torchvision_onnx

        try:
            return torchvision_onnx(bare, seed)
        except (ImportError, NoTorchModule, AttributeError) as err:
            raise SystemExit(f"cannot export {name!r}: {err}") from err
    if kind in ("", "real") and (kind or bare in REAL_MODELS):
        return load_real_model(bare, **({} if size is None else {"size": size}), seed=seed)
    if kind in ("", "light") and bare in LIGHT_MODELS:
        return load_light_model(bare, seed=seed)
    from tvm_rtask import models

    if kind in ("", "zoo") and bare in models.names():
        return models.onnx_model(bare, seed=seed)
    raise SystemExit(f"unknown model {name!r}: not a light model, a real or zoo model, or .onnx")


# -- one runtime, in a worker process --------------------------------------------------------
class Skipped(Exception):
    """The runtime is not installed here."""


def _tvm_outputs(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(_tvm_outputs(r))
    return out


def _build_tvm(name: str, model, feed: dict, threads: int, target):
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.runtime import set_num_threads

    set_num_threads(threads)
    start = time.perf_counter()
    mod = tvm_rtask.frontend.load(model)
    import_s = time.perf_counter() - start
    start = time.perf_counter()
    info = {}
    if name == "tvm_default":
        ex = tvm.compile(mod, target=target)
    else:
        options = {"cpu_rules": False} if name == RULES_OFF else {}
        ex, plan = tvm_rtask.compile_with_plan(
            mod, target, policy=RTASK[name], num_veu=threads, **options
        )
        info["policy"] = plan.policy  # the default's choice
    compile_s = time.perf_counter() - start
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(v) for v in feed.values()]
    main = vm["main"]

    def call():
        return main(*args)

    info.update(import_s=round(import_s, 2), compile_s=round(compile_s, 2))
    return call, lambda out: _tvm_outputs(out), info


def _build_onnxruntime(model, feed: dict, threads: int):
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise Skipped("onnxruntime not installed") from err
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    start = time.perf_counter()
    cpu = ["CPUExecutionProvider"]
    session = ort.InferenceSession(model.SerializeToString(), options, providers=cpu)
    setup_s = time.perf_counter() - start
    settings = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    settings.update(graph_optimization_level="ORT_ENABLE_ALL", execution_mode="ORT_SEQUENTIAL")
    info = {"setup_s": round(setup_s, 2), "settings": settings}
    return (lambda: session.run(None, feed)), list, info


def _build_openvino(model, feed: dict, threads: int):
    try:
        import openvino as ov
    except ImportError as err:
        raise Skipped("openvino not installed") from err
    # f32 like every other runtime here (on CPUs with bf16 or AMX it would default to bf16)
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
    config["INFERENCE_PRECISION_HINT"] = "f32"
    core = ov.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model.SerializeToString())
        start = time.perf_counter()
        compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        setup_s = time.perf_counter() - start
    request = compiled.create_infer_request()
    names = [o.name for o in model.graph.output]
    ports = {}
    for port in compiled.outputs:
        for n in port.get_names():
            ports.setdefault(n, port)
    order = [ports.get(n, compiled.outputs[i]) for i, n in enumerate(names)]
    inputs = dict(feed)

    def outputs(result):
        return [np.array(result[port]) for port in order]

    info = {"setup_s": round(setup_s, 2), "settings": {k: str(v) for k, v in config.items()}}
    return (lambda: request.infer(inputs)), outputs, info


def _build_torch(model, feed: dict, threads: int, model_name: str, seed: int = 0):
    """PyTorch eager on ``bench.torch_modules``' module: torchvision's own for its classifiers."""
    try:
        import torch
    except ImportError as err:
        raise Skipped("no torch") from err
    from bench.torch_modules import NoTorchModule, torch_module

    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        module, source = torch_module(model_name, model, seed)
    except NoTorchModule as err:
        raise Skipped(str(err)) from err
    setup_s = time.perf_counter() - start
    args = [torch.from_numpy(v) for v in feed.values()]

    def call():
        with torch.inference_mode():
            return module(*args)

    def outputs(result):
        result = result if isinstance(result, (list, tuple)) else [result]
        return [r.detach().numpy() for r in result]

    return call, outputs, {"setup_s": round(setup_s, 2), "torch_source": source}


def build(name: str, model, feed: dict, threads: int, target, model_name: str = "",
          seed: int = 0):  # fmt: skip
    """``(call, outputs_of(call's result) -> list of arrays, info)`` for one runtime."""
    if name in TVM_BUILDS:
        return _build_tvm(name, model, feed, threads, target)
    builders = {"onnxruntime": _build_onnxruntime, "openvino": _build_openvino}
    if name == "torch_eager":
        return _build_torch(model, feed, threads, model_name, seed)
    builder = builders.get(name)
    if builder is None:
        raise ValueError(f"unknown runtime {name!r}")
    return builder(model, feed, threads)


def run_worker(spec: dict) -> dict:
    """One runtime on one model: build, check against the reference, time. The record."""
    if spec.get("verbose"):
        from tvm_rtask import progress

        progress.enable()
    record = {"runtime": spec["runtime"], "model": spec["model"], "label": label(spec["runtime"])}
    try:
        from tvm_rtask.testing.onnx_light import random_inputs

        model = load_model(spec["model"], spec.get("seed", 0), spec.get("size"))
        feed = random_inputs(model)
        target = spec.get("target", DEFAULT_TARGET)
        if spec["runtime"] in TVM_BUILDS:
            from tvm_rtask.backend import as_target

            target = as_target(target)
            record["target"] = str(target)
        seed = spec.get("seed", 0)
        call, outputs_of, info = build(
            spec["runtime"], model, feed, spec["threads"], target, spec["model"], seed
        )
        record.update(info)
        out = outputs_of(call())
    except Skipped as why:
        record["skipped"] = str(why)
        return record
    except Exception as err:  # recorded, the driver goes on with the next runtime
        first = (str(err).strip().splitlines() or [""])[0]
        record["error"] = f"{type(err).__name__}: {first[:300]}"
        record["traceback"] = traceback.format_exc()[-2000:]
        return record
    reference = Path(spec["reference"])
    if spec.get("write_reference") and not reference.exists():
        np.savez(reference, *out)
        record["reference"] = True
    if not reference.exists():
        record["error"] = "no reference output to check against (ONNX Runtime failed?)"
        return record
    with np.load(reference) as saved:
        expected = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    error = max_relative_error(out, expected)
    record["relative_error"] = float(f"{error:.3g}")
    if not error <= spec.get("tolerance", TOLERANCE):
        record["error"] = f"wrong result: relative error {error:.3g} against the reference"
        return record
    before, load_before = cpu_sample(), load_average()
    samples = time_calls(call, spec["warmup"], spec["repeat"], spec.get("max_seconds"))
    record.update(stats(samples), samples_ms=[round(s, 4) for s in samples])
    record.update(warmup=spec["warmup"], load_average=[load_before, load_average()])
    record.update(contention(before, cpu_sample()))
    record["os_threads"] = os_threads()  # of this process, while it ran: its runtime's only
    return record


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    record = run_worker(spec)
    Path(spec["out"]).write_text(json.dumps(record), encoding="utf-8")
    return 0


# -- the driver ------------------------------------------------------------------------------
def worker_env(threads: int) -> dict:
    """The worker's environment: every pool sized to ``threads`` from the start."""
    env = dict(os.environ)
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    return env


def run_one(spec: dict, timeout: float = WORKER_TIMEOUT_S) -> dict:
    """:func:`run_worker` in a fresh subprocess; a crash or a timeout becomes an error record."""
    with tempfile.TemporaryDirectory(prefix="tvm-rtask-peer-") as tmp:
        spec = {**spec, "out": str(Path(tmp) / "record.json")}
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        cmd = [sys.executable, "-m", "bench.peers", "--worker", str(spec_path)]
        base = {"runtime": spec["runtime"], "model": spec["model"], "label": label(spec["runtime"])}
        start = time.perf_counter()
        try:
            quiet = not spec.get("verbose")
            env = worker_env(spec["threads"])
            proc = subprocess.run(cmd, env=env, capture_output=quiet, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {**base, "error": f"timed out after {timeout:.0f} s"}
        out = Path(spec["out"])
        if not out.exists():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
            return {**base, "error": f"worker exited {proc.returncode}: " + " | ".join(tail)}
        record = json.loads(out.read_text(encoding="utf-8"))
        record["process_s"] = round(time.perf_counter() - start, 1)
        return record


def pool_rounds(first: dict | None, record: dict) -> dict:
    """One runtime's record over rounds: the first round's record with every round's samples
    pooled (median and the rest over all of them) and each round's median kept; a round that
    failed makes the whole record that round's."""
    if first is None or "samples_ms" not in first or "samples_ms" not in record:
        return record if first is None or "samples_ms" in first else first
    samples = first["samples_ms"] + record["samples_ms"]
    medians = first.get("round_medians_ms", [first["median_ms"]]) + [record["median_ms"]]
    return {**first, **stats(samples), "samples_ms": samples, "round_medians_ms": medians}


def describe(record: dict) -> str:
    head = f"{record['model']:14s} {record['label']:36s}"
    if "skipped" in record:
        return f"{head} skipped: {record['skipped']}"
    if "error" in record:
        return f"{head} error: {record['error']}"
    build_s = record.get("compile_s", record.get("setup_s"))
    return (f"{head} median {record['median_ms']:9.2f} ms (p10 {record['p10_ms']:.2f}, p90 "
            f"{record['p90_ms']:.2f}, N {record['n']}), rel. error {record['relative_error']:.1e}, "
            f"build {build_s} s, other work {record.get('other_cores')} cores")  # fmt: skip


def measure(models: list[str], runtimes: list[str], threads: int, target: str = DEFAULT_TARGET,
            warmup: int = 5, repeat: int = 30, max_seconds: float | None = 20.0, seed: int = 0,
            size: str | None = None, command: str = "", progress=print,
            timeout: float = WORKER_TIMEOUT_S, verbose: bool = False,
            rounds: int = 1) -> dict:  # fmt: skip
    """Every runtime on every model, one subprocess each, one after another, ``rounds``
    times per model (runtimes interleaved, so a slow spell of the machine falls on all of
    them; :func:`pool_rounds`); the results."""
    results = environment(threads, target, command)
    if any(r in TVM_BUILDS for r in runtimes):
        from tvm_rtask.backend import as_target

        results["target_label"] = target_label(as_target(target))
    results["what"] = ("median latency of one call, batch 1, each runtime warm, back-to-back "
                       "calls, in its own process")  # fmt: skip
    results.update(warmup=warmup, repeat=repeat, max_seconds=max_seconds, seed=seed, rounds=rounds)
    # real_model_size: of the real (torchvision) models among them, if any
    results.update(real_model_size=size, weights="seeded random", tolerance=TOLERANCE, models={})
    order = [r for r in REFERENCES if r in runtimes] + [r for r in runtimes if r not in REFERENCES]
    with tempfile.TemporaryDirectory(prefix="tvm-rtask-peers-") as tmp:
        for model in models:
            reference = Path(tmp) / f"{Path(model).stem}-reference.npz"
            records: dict[str, dict] = {}
            for _ in range(rounds):
                for runtime in order:
                    spec = {"runtime": runtime, "model": model, "seed": seed, "size": size}
                    spec.update(threads=threads, target=target, warmup=warmup, repeat=repeat)
                    spec.update(max_seconds=max_seconds, reference=str(reference))
                    spec.update(write_reference=runtime in REFERENCES, tolerance=TOLERANCE)
                    record = run_one({**spec, "verbose": verbose}, timeout)
                    if record.get("reference"):
                        results["models"].setdefault(model, {})["reference"] = runtime
                    progress(describe(record))
                    records[runtime] = pool_rounds(records.get(runtime), record)
            entry = results["models"].setdefault(model, {})
            entry["runtimes"] = {r: records[r] for r in runtimes}
    results["load_average_end"] = load_average()
    if source_state() != results["source_state"]:
        results["source_changed_during_run"] = True
        progress("warning: the checkout changed during the run; later models measured other code")
    return results


# -- reporting -------------------------------------------------------------------------------
def rounds_note(results: dict) -> str:
    rounds = results.get("rounds", 1)
    return f" ({rounds} rounds, runtimes interleaved, samples pooled)" if rounds > 1 else ""


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def _times(factor: float) -> str:
    return f"{factor:.0f}x" if factor >= 10 else f"{factor:.1f}x"


def timed(runtimes: dict) -> dict:
    return {n: r for n, r in runtimes.items() if "median_ms" in r}


# How the sentences name each runtime.
SHORT = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO", "torch_eager": "PyTorch eager",
         "tvm_default": "TVM's default build", "rtask_sequential": "tvm-rtask sequential",
         "rtask_wavefront": "tvm-rtask wavefront", "rtask_default": "tvm-rtask's default build",
         RULES_OFF: "tvm-rtask sequential without the CPU rules"}  # fmt: skip


def _threads(n: int) -> str:
    return "1 thread" if n == 1 else f"{n} threads"


def relation(a: float, b: float) -> str:
    """How a latency ``a`` compares with ``b``: "1.5x slower than", "2.0x faster than" or
    "as fast as (within 5%)"."""
    if abs(a / b - 1) < 0.05:
        return "as fast as (within 5%)"
    if a > b:
        return f"{_times(a / b)} slower than"
    return f"{_times(b / a)} faster than"


def summary(model: str, entry: dict, threads: int, quiet: frozenset = frozenset()) -> str:
    """Sentences on one model's numbers, whatever they say (``quiet``: runtimes not to
    mention when skipped: said once elsewhere)."""
    runs = entry["runtimes"]
    ms = {n: r["median_ms"] for n, r in timed(runs).items()}
    sentences = []
    if ms:
        fastest = min(ms, key=ms.get)
        name, took = SHORT.get(fastest, fastest), _ms(ms[fastest])
        sentences.append(f"{model}, {_threads(threads)}: the fastest is {name} ({took} ms).")
    else:
        sentences.append(f"{model}: nothing was timed.")
    rtask = [n for n in ms if n in RTASK and n != RULES_OFF]
    if rtask:
        best = min(rtask, key=ms.get)
        head = f"tvm-rtask's fastest build ({RTASK[best] or 'default'}, {_ms(ms[best])} ms) is"
        peers = [p for p in ("onnxruntime", "openvino", "torch_eager") if p in ms]
        others = [f"{relation(ms[best], ms[p])} {SHORT[p]} ({_ms(ms[p])} ms)" for p in peers]
        if "tvm_default" in ms:
            tvm = ms["tvm_default"]
            others.append(f"{relation(ms[best], tvm)} TVM's default build ({_ms(tvm)} ms, "
                          "unscheduled operators, same target)")  # fmt: skip
        if others:
            joined = ", ".join(others[:-1]) + (" and " if others[:-1] else "") + others[-1]
            sentences.append(f"{head} {joined}.")
        if RULES_OFF in ms and "rtask_sequential" in ms:
            off = ms[RULES_OFF]
            sentences.append("Without the CPU schedule rules (threads only), tvm-rtask sequential "
                             f"takes {_ms(off)} ms: the rules make it "
                             f"{relation(ms['rtask_sequential'], off)} that.")  # fmt: skip
        if "rtask_default" in ms:
            chose = runs["rtask_default"].get("policy", "?")
            sentences.append(f"The default build (policy auto) chose {chose}.")
        if "rtask_sequential" in ms and "rtask_wavefront" in ms:
            packing = relation(ms["rtask_wavefront"], ms["rtask_sequential"])
            one = "one operator per launch"
            sentences.append(f"Wavefront packing is {packing} sequential ({one}).")
    for n, r in runs.items():
        if "skipped" in r and n in quiet:
            continue
        if "skipped" in r:
            sentences.append(f"{SHORT.get(n, n)}: skipped ({r['skipped']}).")
        elif "error" in r:
            sentences.append(f"{SHORT.get(n, n)}: not timed ({r['error']}).")
    return " ".join(sentences)


def busy_note(results: dict) -> str | None:
    runs = [r for entry in results["models"].values() for r in entry["runtimes"].values()]
    worst = [r.get("other_cores") for r in runs if r.get("other_cores") is not None]
    if not worst or max(worst) < BUSY_CORES:
        return None
    return (f"other processes kept up to {max(worst):.2f} cores busy while a runtime was being "
            "timed: these numbers are slower than on a quiet machine, and not a measurement to "
            "publish")  # fmt: skip


def cell(record: dict, base: float | None) -> str:
    if "skipped" in record:
        return f"skipped: {record['skipped']}"
    if "error" in record:
        return "wrong result" if record["error"].startswith("wrong") else "failed"
    text = f"{_ms(record['median_ms'])} ({_ms(record['p10_ms'])}-{_ms(record['p90_ms'])})"
    if not base:
        return text
    ratio = record["median_ms"] / base
    return text + (f", {ratio:.2f}" if ratio < 10 else f", {ratio:.0f}")


def markdown(results: dict, source: str) -> str:
    """The README's tables and sentences of a results file that lies at ``source``."""
    models = list(results["models"])
    threads = results["threads"]
    n = sorted({r["n"] for e in results["models"].values() for r in timed(e["runtimes"]).values()})
    count = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}" if n else "no"
    smoke = results.get("smoke")
    lines = []
    if smoke:
        lines += [f"**Smoke run, not a measurement**: {smoke}", ""]
    if results.get("source_changed_during_run"):
        lines += ["**The checkout changed during this run: not a measurement of one commit.**", ""]
    lines += [
        f"`{results['command']}` on {results['date'][:10]}: batch 1, {_threads(threads)} for "
        f"every runtime on {results['cpu']} ({results['cores']} cores), each runtime warm in "
        f"its own process{rounds_note(results)}, median (p10-p90) of {count} back-to-back "
        f"calls after {results['warmup']} warm-up calls, {results['weights']} weights, every "
        f"output checked against ONNX Runtime's (relative error < {results['tolerance']:g}); "
        f"TVM and tvm-rtask compiled for `{results['target']}`{_resolved(results)}; "
        f"from `{source}`.",
        "",
        "| runtime | " + " | ".join(f"{m}: ms, ratio to ONNX Runtime" for m in models) + " |",
        "|---|" + "---:|" * len(models),
    ]
    names = list(dict.fromkeys(r for e in results["models"].values() for r in e["runtimes"]))
    absent = skipped_everywhere(results)
    for name in (n for n in names if n not in absent):
        cells = []
        for m in models:
            runs = results["models"][m]["runtimes"]
            base = runs.get("onnxruntime", {}).get("median_ms")
            cells.append(cell(runs[name], base) if name in runs else "")
        lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    for m in models:  # a paragraph each
        lines += ["", summary(m, results["models"][m], threads, quiet=frozenset(absent))]
    if absent:
        lines += [
            "",
            "Not run here: " + "; ".join(f"{label(n)} ({why})" for n, why in absent.items()),
        ]
    lines += ["", compile_table(results)]
    note = busy_note(results)
    if note:
        lines += ["", f"Note: {note}."]
    return "\n".join(lines)


def skipped_everywhere(results: dict) -> dict[str, str]:
    """Runtimes skipped on every model (not installed here), with the reason: the README
    names them once instead of a row and a sentence per model."""
    entries = [e["runtimes"] for e in results["models"].values()]
    names = dict.fromkeys(n for runs in entries for n in runs)
    return {
        n: entries[0][n]["skipped"]
        for n in names
        if all("skipped" in runs.get(n, {}) for runs in entries)
    }


def _resolved(results: dict) -> str:
    resolved = results.get("target_label")
    return f" ({resolved})" if resolved and resolved != results["target"] else ""


def compile_table(results: dict) -> str:
    """Compile (TVM, tvm-rtask) and set-up (ONNX Runtime session, OpenVINO compile_model)
    seconds per model."""
    names = (*TVM_BUILDS, "onnxruntime", "openvino", "torch_eager")
    cols = [n for n in names if any(n in e["runtimes"] for e in results["models"].values())]
    cols = [c for c in cols if c not in skipped_everywhere(results)]
    lines = ["Build time in seconds (TVM and tvm-rtask: compile of the imported module; ONNX "
             "Runtime, OpenVINO, PyTorch: session creation, model compilation, conversion), in "
             "the same processes:", ""]  # fmt: skip
    lines += ["| model | " + " | ".join(map(label, cols)) + " |", "|---|" + "---:|" * len(cols)]
    for model, entry in results["models"].items():
        values = [entry["runtimes"].get(c, {}) for c in cols]
        values = [r.get("compile_s", r.get("setup_s")) for r in values]
        cells = ["" if value is None else f"{value:.1f}" for value in values]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- the command -----------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--models", nargs="+", default=DEFAULT_MODELS,
        help="light models of onnx (inception_v1, squeezenet, ...), real or zoo models, or "
        ".onnx files")  # fmt: skip
    add("--runtimes", nargs="+", default=DEFAULT_RUNTIMES,
        choices=[*RUNTIMES, *OPTIONAL])  # fmt: skip
    add("--threads", type=int, default=default_threads(),
        help="threads of every runtime (default: every core of this machine)")  # fmt: skip
    add("--target", default=DEFAULT_TARGET, help="of TVM and tvm-rtask")
    add("--warmup", type=int, default=5)
    add("--rounds", type=int, default=1, help="runs of every runtime per model, interleaved, "
        "each in a fresh process; the samples of all rounds pooled")  # fmt: skip
    add("--repeat", type=int, default=50, help="timed calls per runtime")
    add("--max-seconds", type=float, default=30.0, help="stop timing a runtime after this "
        f"long (never under {MIN_SAMPLES} calls)")  # fmt: skip
    add("--seed", type=int, default=0, help="of the weights")
    add("--size", default="full", help="of the real (torchvision) models: full (224x224, "
        "what a user runs) or reduced")  # fmt: skip
    add("--smoke", action="store_true", help=f"few calls ({SMOKE}): a check")
    add("--json", help="results file (default under bench/results/)")
    add("--timeout", type=float, default=WORKER_TIMEOUT_S)
    add("--worker", metavar="SPEC", help=argparse.SUPPRESS)  # one runtime, in its own process
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def default_path(threads: int, smoke: bool, date: str | None = None) -> Path:
    date = date or datetime.date.today().isoformat()
    return RESULTS / f"{date}-cpu-peers-{threads}t{'-smoke' if smoke else ''}.json"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    command = shlex.join(["python", "-m", "bench", "peers", *argv])
    print(f"{args.threads} threads for every runtime; TVM and tvm-rtask for {args.target}")
    results = measure(
        args.models, args.runtimes, args.threads, target=args.target, warmup=args.warmup,
        repeat=args.repeat, max_seconds=args.max_seconds, seed=args.seed, size=args.size,
        command=command, progress=lambda line: print(line, flush=True), timeout=args.timeout,
        rounds=args.rounds,
    )  # fmt: skip
    if args.smoke:
        results["smoke"] = (f"`--smoke` ({SMOKE['repeat']} calls after {SMOKE['warmup']} warm-up "
                            "calls), only to check that everything runs")  # fmt: skip
    path = Path(args.json) if args.json else default_path(args.threads, args.smoke)
    write_results(path, results, markdown)
    return 0


def write_results(path: Path, results: dict, render) -> None:
    """``results`` as JSON at ``path`` and ``render(results, source)``, the table naming the
    file as the repository does, beside it as ``.md``; both printed where they went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    try:
        source = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        source = str(path)
    table = render(results, source)
    path.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(f"\n{table}\n\nresults written to {path} and {path.with_suffix('.md')}")


if __name__ == "__main__":
    sys.exit(main())
