"""One GPU window: a fresh GPU machine to the project's answer in at most 8 minutes (issue 26).

Command 2 of a window (docs/gpu.md: the steps, their shares of ``--deadline``, the files), after
``source .gpu/b/setup.sh``: ``make gpu-window`` (= ``python3 -m bench gpu-window``, deadline
450 s); without a GPU, ``python3 -m bench gpu-window --out DIR`` is the dry run (GPU ABSENT).

Steps, each cut cleanly at its share of the deadline (what was not reached is listed): 1.
numerics, tvm-rtask's default CUDA build of the light SqueezeNet, Inception v1, ResNet-50 and
the zoo's NASNet, Inception v3, RandWire, ResNeXt-29 against ONNX Runtime on the CPU and TVM's
default build, 20 replays under a CUDA graph, and a forced timeout that must raise a named
error; 2. latency at batch 1 (:mod:`bench.harness`); 3. where the time goes for the model of
the worst ratio (:mod:`bench.kernel_report`); 4. ``tvm-rtask profile`` of the latency models,
kept per device, and the calibrated model's error against step 2; 5. with time left:
:mod:`bench.gpu_sm_map` and compute-sanitizer (racecheck, memcheck).

Output (``--out``, default ``$OUT``; 8 files at most): ``window.jsonl``, ``numerics.jsonl``,
``bench.jsonl``, ``bench.json``/``.md``, ``summary.md``/``.json``, ``details.tar.gz``. The
pack's nvcc cache (``make gpu-pack``) is found through ``$TVM_RTASK_CUDA_CACHE``. Other modes:
``--prepare DIR`` (the pack: fill DIR's nvcc cache, no GPU), ``--publish OUT_DIR`` (a window's
folder to ``bench/results/<date>-<device>.json/.md/.png``), ``--update-readme RESULTS.json``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from bench import RESULTS, ROOT, append_jsonl, read_jsonl
from bench.gpu_check import _kill_group, probe_gpu
from bench.window_models import load_model

ME = [sys.executable, "-m", "bench.gpu_window"]  # this module's workers

# -- what the window runs ---------------------------------------------------------------------
TARGET = {"kind": "cuda", "arch": "sm_90"}
NUMERICS_MODELS = ["light:squeezenet", "light:inception_v1", "light:resnet50", "zoo:nasnet_cifar",
                   "zoo:inception_v3", "zoo:randwire", "zoo:resnext29"]  # fmt: skip
LATENCY_MODELS = ["squeezenet", "nasnet_cifar", "inception_v3", "randwire", "resnext29"]
LATENCY_CONFIGS = ["tvm_default", "tvm_cuda_graph", "sequential", "wavefront_counter",
                   "wavefront_cuda_graph", "opara_streams_cuda_graph", "torch_eager",
                   "torch_compile_reduce_overhead"]  # fmt: skip
# the tvm-rtask builds of step 2 (what the pack compiles through nvcc)
LATENCY_RTASK_CONFIGS = ["sequential", "wavefront_counter", "wavefront_cuda_graph"]
BASELINE = "tvm_cuda_graph"
# the sanitizer's kernel: the reduced zoo SqueezeNet, default CUDA build
SANITIZE_MODEL = "zoo:squeezenet:reduced"
GRAPH_REPLAYS = 20
TOLERANCE = 1e-4
# the dry run (no GPU): tiny models on llvm, and one codegen-only CUDA build through nvcc
SMOKE_NUMERICS = ["zoo:lstm_tc:smoke", "zoo:bert_layer:smoke"]
SMOKE_LATENCY = ["lstm_tc"]
SMOKE_CONFIGS = ["tvm_default", "sequential", "wavefront_fine", "torch_eager"]
SMOKE_CUDA_CODEGEN = "zoo:lstm_tc:smoke"
# shares of the deadline at which steps 1, 2, 3 and 4 must end (the rest: step 5)
STEP_ENDS = {"numerics": 0.35, "latency": 0.75, "where": 0.84, "profile": 0.94}
DETAILS = "details.tar.gz"
PACK_MANIFEST = "manifest.json"


# -- models -----------------------------------------------------------------------------------
def inputs_digest(inputs: dict) -> str:
    """sha256 of the inputs (names, shapes, bytes): the pack records it, the window checks
    that the device made the same inputs from the same seeds."""
    import numpy as np

    digest = hashlib.sha256()
    for name in sorted(inputs):
        value = np.ascontiguousarray(inputs[name])
        digest.update(f"{name}{value.shape}{value.dtype}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()[:16]


def _target(cuda: bool):
    import tvm

    return tvm.target.Target(TARGET, host="llvm") if cuda else tvm.target.Target({"kind": "llvm"})


def _run(ex, inputs: dict, dev):
    """``(vm, device arguments, outputs as numpy)`` of one call of ``ex``."""
    import tvm
    from tvm import relax

    from bench.harness import to_numpy_list

    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(v, dev) for v in inputs.values()]
    return vm, args, to_numpy_list(vm["main"](*args))


# -- step 1's worker: one model -----------------------------------------------------------------
def _harness_builds(spec: str, exe_cache: str):
    """Step 1's three builds of a zoo model made as step 2's harness makes them (TVM default,
    ``wavefront_counter``, ``wavefront_cuda_graph``: the defaults on CUDA), into the
    harness's executable cache, so that step 2 loads them instead of compiling them again."""
    from bench.harness import ModelContext, all_configurations, build_executable, source_hash
    from bench.records import model_id

    name = spec.split(":")[1]
    spec = {"model": name, "batch": 1, "reduced": False, "overrides": {}, "target": "cuda"}
    spec.update(arch=TARGET["arch"], model_id=model_id(name, 1, False, {}), threads=1)
    ctx = ModelContext({**spec, "cache_dir": exe_cache, "source_hash": source_hash()})
    known = {c["name"]: c for c in all_configurations("cuda")}
    return ctx, lambda config: build_executable(known[config], ctx, {})


@contextmanager
def _recorded(out: Path, rec: dict, nvcc_cache: bool = False):
    """Run the ``with`` body as one step's record: an exception is recorded (``ok`` False,
    its type and message) and the window goes on; the seconds taken (and with
    ``nvcc_cache`` the process's nvcc cache hits and misses) are added and the record is
    appended to ``out``. Yields the start time."""
    t0 = time.perf_counter()
    try:
        yield t0
    except Exception as err:  # noqa: BLE001 - recorded; the window goes on
        traceback.print_exc()
        rec.update(ok=False, error=f"{type(err).__name__}: {str(err).strip()[:600]}")
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    if nvcc_cache:
        from tvm_rtask.backend.cuda import compile_cache

        rec["nvcc_cache"] = compile_cache.stats()
    append_jsonl(out, rec)


def numerics_worker(spec: str, gpu: bool, out: Path, exe_cache: str | None = None) -> int:
    """TVM's default build and tvm-rtask's default build of ``spec`` on the same inputs; on a
    GPU also the default build under a CUDA graph, replayed; one JSON line to ``out``."""
    import tvm

    import tvm_rtask
    from bench.harness import max_relative_error, to_numpy_list
    from tvm_rtask.backend.cuda import compile_cache
    from tvm_rtask.testing.onnx_light import check_against_references, onnxruntime_outputs

    rec: dict = {"step": "numerics", "model": spec, "target": "cuda" if gpu else "llvm"}
    with _recorded(out, rec, nvcc_cache=True) as t0:
        model, inputs = load_model(spec)
        rec["inputs_sha"] = inputs_digest(inputs)
        mod = tvm_rtask.frontend.load(model)
        rec["load_s"] = round(time.perf_counter() - t0, 2)
        target = _target(gpu)
        dev = tvm.cuda(0) if gpu else tvm.cpu()
        compile_cache.install_compile_callback()

        def plain_graph_build():
            with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
                return tvm_rtask.compile(mod, target, policy="wavefront")

        builds = {
            "tvm_default": lambda: tvm.compile(mod, target=target),
            "wavefront_counter": lambda: tvm_rtask.compile(
                mod, target if gpu else "llvm", policy="wavefront"
            ),
            "wavefront_cuda_graph": plain_graph_build,
        }
        if gpu and exe_cache and spec.startswith("zoo:"):
            _, build = _harness_builds(spec, exe_cache)
            rec["builds"] = "harness executable cache (shared with step 2)"
            builds = {name: (lambda n=name: build(n)) for name in builds}
        t = time.perf_counter()
        reference_ex = builds["tvm_default"]()
        rec["tvm_compile_s"] = round(time.perf_counter() - t, 2)
        _, _, reference = _run(reference_ex, inputs, dev)
        t = time.perf_counter()
        ex = builds["wavefront_counter"]()
        rec["rtask_compile_s"] = round(time.perf_counter() - t, 2)
        _, _, actual = _run(ex, inputs, dev)
        # ONNX Runtime on the CPU is the independent reference: TVM's own CUDA build was found
        # wrong (and varying from run to run) on light ShuffleNet (docs/gpu.md, "What holds now")
        expected = onnxruntime_outputs(model, inputs)
        check = check_against_references(actual, expected, reference, TOLERANCE)
        rec.update(rel_err=check.rel_err, ort_rel_err=check.ort_rel_err)
        rec.update(tvm_ort_rel_err=check.tvm_ort_rel_err, ok=check.ok)
        if gpu:
            graph_ex = builds["wavefront_cuda_graph"]()
            vm, args, first = _run(graph_ex, inputs, dev)  # the capture
            worst, identical = max_relative_error(first, expected), True
            for _ in range(GRAPH_REPLAYS):
                outs = to_numpy_list(vm["main"](*args))
                worst = max(worst, max_relative_error(outs, expected))
                identical &= all((a == b).all() for a, b in zip(outs, first, strict=True))
            rec.update(graph_replays=GRAPH_REPLAYS, graph_rel_err=worst, graph_identical=identical)
            rec["ok"] = rec["ok"] and worst < TOLERANCE and identical
        else:
            rec["graph_replays"] = "skipped: no GPU (CUDA graphs need one)"
    return 0


def timeout_worker(out: Path) -> int:
    """The forced timeout: a plan whose vEU waits for a step never reached must come back
    as a named error (tests/cuda/test_gpu.py's test, run here as a function)."""
    rec: dict = {"step": "numerics", "model": "forced_timeout"}
    with _recorded(out, rec):  # tests/ is importable: the worker runs from the checkout's root
        from tests.cuda.test_gpu import test_broken_plan_times_out_with_an_error

        test_broken_plan_times_out_with_an_error()
        rec.update(ok=True, note="check_status raised RuntimeError 'timed out'")
    return 0


def codegen_worker(spec: str, out: Path) -> int:
    """Without a GPU: tvm-rtask's CUDA build of ``spec`` for sm_90 through nvcc and the
    cache (codegen only, nothing runs), as the pack does for the window's models."""
    rec: dict = {"step": "numerics", "model": spec, "target": "cuda (codegen only)"}
    with _recorded(out, rec, nvcc_cache=True):
        import tvm_rtask

        model, inputs = load_model(spec)
        rec["inputs_sha"] = inputs_digest(inputs)
        tvm_rtask.compile(tvm_rtask.frontend.load(model), TARGET)
        rec["ok"] = True
        rec["note"] = "built for sm_90 (nvcc, ptxas checked); not run: GPU ABSENT"
    return 0


def sanitize_worker() -> int:
    """One call of the reduced SqueezeNet's default CUDA build (run under compute-sanitizer)."""
    import tvm

    import tvm_rtask
    from tvm_rtask.backend.cuda import compile_cache

    compile_cache.install_compile_callback()
    model, inputs = load_model(SANITIZE_MODEL)
    ex = tvm_rtask.compile(tvm_rtask.frontend.load(model), TARGET)
    _run(ex, inputs, tvm.cuda(0))
    tvm.cuda(0).sync()
    print("sanitize worker: one call done", flush=True)
    return 0


def adopt_pack_nvcc(manifest: dict, device_nvcc: str | None) -> str | None:
    """Key the nvcc cache by the pack's nvcc where the device's differs (the pack's cubins are
    sm_90 code: the driver runs them whatever nvcc made them); returns a note when it does."""
    from tvm_rtask.backend.cuda import compile_cache

    if not (manifest and manifest.get("nvcc")) or device_nvcc == manifest["nvcc"]:
        return None
    os.environ[compile_cache.NVCC_VERSION_ENV] = manifest["nvcc"]
    return (f"nvcc differs (pack: {manifest['nvcc']}; device: {device_nvcc}): the pack's "
            f"cubins are used ({compile_cache.NVCC_VERSION_ENV} set)")  # fmt: skip


# -- the pack's preparation (no GPU needed) ----------------------------------------------------
def prepare(prep: Path, jobs: int, smoke: bool = False) -> int:
    """Fill ``prep/nvcc`` with the nvcc builds (cubin + ptxas report) of every tvm-rtask CUDA
    build the window makes, for sm_90, and write ``prep/manifest.json`` (nvcc's version,
    the inputs' digests, the entries, the times). ``smoke``: the dry run's one tiny build."""
    from tvm_rtask.backend.cuda import compile_cache

    prep.mkdir(parents=True, exist_ok=True)
    # kept between packs: an unchanged source is not compiled again; the pack carries only
    # the entries this pack's builds wrote or read (compile_cache marks a hit by its mtime)
    nvcc_dir = prep / "nvcc"
    env = dict(os.environ, **{compile_cache.CACHE_ENV: str(nvcc_dir)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    started = time.time()
    used_since = started - 2  # mtime granularity
    manifest: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds")}
    manifest.update(arch=TARGET["arch"], nvcc=compile_cache.nvcc_version() or "none")
    manifest.update(source_hash=_source_hash(), builds=[])
    specs = [SMOKE_CUDA_CODEGEN] if smoke else NUMERICS_MODELS + [SANITIZE_MODEL]
    log = prep / "prepare.log"
    worker_out = prep / "prepare.jsonl"
    worker_out.unlink(missing_ok=True)
    # step 1 and 5: tvm-rtask's default build of each model (wavefront, counters); the CUDA
    # graph variant compiles the same kernels (checked by the window's cache statistics)
    cmds = [ME + ["--codegen-worker", s, "--worker-out", str(worker_out)] for s in specs]
    if not smoke:  # step 2: the harness's tvm-rtask configurations, exactly as it builds them
        harness = [sys.executable, "-m", "bench.harness", "--gpu", "--compile-only", "--models"]
        harness += [*LATENCY_MODELS, "--configs", *LATENCY_RTASK_CONFIGS, "--compile-jobs", "1"]
        harness += ["--cache-dir", str(prep / "harness-cache"), "--results"]
        harness += [str(prep / "harness.jsonl"), "--fresh", "--no-plot", "--timeout", "3000"]
        cmds.append(harness)
        # command 3 (bench/gpu_timelines.py): the traced default builds
        from bench.gpu_timelines import MODELS as TIMELINE_MODELS

        timelines = [sys.executable, "-m", "bench.gpu_timelines", "--compile-only"]
        cmds += [timelines + [spec] for spec in TIMELINE_MODELS]
    failed = _run_parallel(cmds, jobs, env, log)
    keys = ("model", "ok", "seconds", "inputs_sha", "error")
    for rec in read_jsonl(worker_out):
        manifest["builds"].append({k: rec.get(k) for k in keys if k in rec})
    if not smoke:  # the harness records only what failed to compile
        records = [r for r in read_jsonl(prep / "harness.jsonl") if r.get("type") == "result"]
        failed_builds = {(r["model"], r["config"]): r.get("error") for r in records}
        for model in LATENCY_MODELS:
            for config in LATENCY_RTASK_CONFIGS:
                error = failed_builds.get((model, config))
                build = {"model": model, "config": config, "ok": error is None}
                manifest["builds"].append(build | ({"error": error} if error else {}))
    shutil.rmtree(prep / "harness-cache", ignore_errors=True)  # executables hold the weights

    def used(paths) -> list[str]:
        return sorted(p.stem for p in paths if p.stat().st_mtime >= used_since)

    manifest["nvcc_entries"] = entries = used(nvcc_dir.glob("*.cubin"))
    # the kernels' register counts (occupancy.source_kernel_registers), read or written here
    manifest["register_entries"] = used((nvcc_dir / compile_cache.REGISTERS_DIR).glob("*.json"))
    files = [nvcc_dir / f"{e}{suffix}" for e in entries for suffix in (".cubin", ".ptxas")]
    manifest["nvcc_bytes"] = sum(f.stat().st_size for f in files)
    manifest["seconds"] = round(time.time() - started, 1)
    manifest["failed_commands"] = failed
    (prep / PACK_MANIFEST).write_text(json.dumps(manifest, indent=1))
    mib, seconds = manifest["nvcc_bytes"] / 2**20, manifest["seconds"]
    print(f"prepared {len(entries)} nvcc build(s), {mib:.1f} MiB, in {seconds} s ({jobs} at a "
          f"time); failed commands: {failed or 'none'}")  # fmt: skip
    return 1 if failed else 0


def _run_parallel(cmds: list[list[str]], jobs: int, env: dict, log: Path) -> list[str]:
    pending, running, failed = list(cmds), [], []
    with open(log, "ab") as out:
        while pending or running:
            while pending and len(running) < jobs:
                cmd = pending.pop(0)
                out.write(f"$ {shlex.join(cmd[1:])}\n".encode())
                out.flush()
                kw = {"cwd": str(ROOT), "env": env, "stdout": out, "stderr": subprocess.STDOUT}
                running.append((subprocess.Popen(cmd, **kw), cmd))
            still = []
            for proc, cmd in running:
                if proc.poll() is None:
                    still.append((proc, cmd))
                elif proc.returncode != 0:
                    failed.append(shlex.join(cmd[1:]))
            running = still
            time.sleep(0.5)
    return failed


def _source_hash() -> str:
    from bench.harness import source_hash

    return source_hash()


# -- the window ---------------------------------------------------------------------------------
class Window:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.start = args.since
        self.deadline = self.start + args.deadline
        self.steps: dict[str, dict] = {}
        self.start_margin = 10.0  # no worker starts later than this before its step's end
        self.not_reached: list[str] = []
        self.lines: list[str] = []
        self.gpu: dict = {}

    # time
    def left(self) -> float:
        return self.deadline - time.time()

    def step_end(self, step: str) -> float:
        if not self.gpu_present:
            return self.deadline - 5
        return self.start + STEP_ENDS[step] * self.args.deadline

    @property
    def gpu_present(self) -> bool:
        return bool(self.gpu.get("exist"))

    def say(self, text: str) -> None:
        line = f"[{time.time() - self.start:6.1f} s] {text}"
        print(line, flush=True)
        with open(self.work / "window.log", "a") as f:
            f.write(line + "\n")

    def record(self, rec: dict) -> None:
        rec = {"t_s": round(time.time() - self.start, 1), **rec}
        append_jsonl(self.out / "window.jsonl", rec)

    # subprocesses
    @staticmethod
    def _env(env: dict | None = None) -> dict:
        """The environment of a step's process: the tree importable, output unbuffered."""
        full = dict(os.environ, PYTHONUNBUFFERED="1")
        full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH")) if p)
        full.update(env or {})
        return full

    @staticmethod
    def _popen(cmd: list[str], env: dict, log) -> subprocess.Popen:
        """``cmd`` in its own process group (killable as a whole), output into ``log``."""
        return subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip

    def run(self, cmd: list[str], name: str, end: float, env: dict | None = None) -> int | None:
        """``cmd`` with its output in ``work/<name>.log``; killed (None) at ``end``."""
        self.say(f"{name}: {shlex.join(cmd[1:] if cmd[0] == sys.executable else cmd)}")
        with open(self.work / f"{name}.log", "ab") as log:
            proc = self._popen(cmd, self._env(env), log)
            while proc.poll() is None:
                if time.time() > end:
                    _kill_group(proc)
                    self.say(f"{name}: stopped at its budget")
                    return None
                time.sleep(0.3)
        return proc.returncode

    def run_many(
        self, cmds: list[tuple[str, list[str]]], parallel: int, end: float, keep=None
    ) -> list[str]:
        """Commands ``parallel`` at a time; the names of those cut at ``end`` or not started.
        With a list ``keep``, those still running at ``end`` go on, appended to it as
        ``(name, process)``, instead of being cut."""
        pending, running, cut = list(cmds), [], []
        env = self._env()
        while pending or running:
            while pending and len(running) < parallel and time.time() < end - self.start_margin:
                name, cmd = pending.pop(0)
                log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 - closed below
                proc = self._popen(cmd, env, log)
                running.append((name, proc, log))
            if pending and time.time() >= end - self.start_margin:
                cut += [name for name, _ in pending]
                pending = []
            still = []
            for name, proc, log in running:
                if proc.poll() is None and time.time() > end and keep is not None:
                    keep.append((name, proc))
                    log.close()
                    continue
                if proc.poll() is None and time.time() > end:
                    _kill_group(proc)
                    cut.append(name)
                if proc.poll() is None:
                    still.append((name, proc, log))
                else:
                    log.close()
            running = still
            time.sleep(0.3)
        return cut

    # the steps
    def probe(self) -> None:
        self.gpu = probe_gpu(self.args.no_gpu)
        from tvm_rtask.backend.cuda import compile_cache

        manifest = _read_json(Path(self.args.prep) / PACK_MANIFEST) if self.args.prep else {}
        device_nvcc = compile_cache.nvcc_version()
        rec = {"step": "env", "gpu": self.gpu, "device_nvcc": device_nvcc}
        rec.update(pack_nvcc=manifest.get("nvcc"), pack_source_hash=manifest.get("source_hash"))
        rec.update(source_hash=_source_hash(), nvcc_cache=os.environ.get(compile_cache.CACHE_ENV))
        rec["date"] = datetime.datetime.now().isoformat(timespec="seconds")
        note = adopt_pack_nvcc(manifest, device_nvcc)
        if note:
            rec["note"] = note
        if manifest and manifest.get("source_hash") != rec["source_hash"]:
            rec["warning"] = "the sources changed since the pack: its nvcc cache may miss"
        self.manifest = manifest
        self.record(rec)
        self.env_rec = rec
        absent = "GPU ABSENT: dry run (tiny models on llvm, one codegen-only CUDA build)"
        self.say(("GPU: " + str(self.gpu.get("device_name"))) if self.gpu_present else absent)

    def start_background(self) -> None:
        """On a GPU, while step 1 runs (no timing there): compile step 2's builds that step 1
        does not make into the executable cache, and warm Inductor's on-disk caches with one
        ``torch.compile`` of each twin, so that step 2 mostly loads and times. Stopped before
        step 2 times anything (:meth:`stop_background`)."""
        self.background: list[tuple[str, subprocess.Popen]] = []
        if not self.gpu_present or "background" in self.args.skip:
            return
        models = self.args.latency_models or LATENCY_MODELS
        in_step_1 = {s.split(":")[1] for s in self.args.numerics if s.startswith("zoo:")}
        harness = [sys.executable, "-m", "bench.harness", "--gpu", "--no-plot", "--fresh"]
        harness += ["--cache-dir", str(self.work / "exe-cache"), "--timeout", "400"]
        harness += ["--deadline-at", str(self.step_end("latency") - 60), "--compile-share", "1"]
        shared = [m for m in models if m in in_step_1]
        alone = [m for m in models if m not in in_step_1]
        tvm_configs = [c for c in LATENCY_CONFIGS if not c.startswith("torch")]
        jobs = [("precompile-shared", shared, ["tvm_cuda_graph", "sequential"])]
        for name, group, configs in jobs + [("precompile-alone", alone, tvm_configs)]:
            if not group:
                continue
            cmd = harness + ["--compile-only", "--compile-jobs", "3", "--models", *group]
            cmd += ["--configs", *configs, "--results", str(self.work / f"{name}.jsonl")]
            cmd += ["--logs-dir", str(self.work / f"{name}.logs")]
            self.background.append((name, self._spawn(cmd, name)))
        peers = [c for c in LATENCY_CONFIGS if c.startswith("torch_compile")]
        if peers:
            cmd = harness + ["--models", *models, "--configs", *peers, "--repeat", "3"]
            cmd += ["--warmup", "1", "--results", str(self.work / "torch-warm.jsonl")]
            cmd += ["--logs-dir", str(self.work / "torch-warm.logs")]
            self.background.append(("torch-warm", self._spawn(cmd, "torch-warm")))

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        """``cmd`` in the background, its output in ``work/<name>.log``."""
        self.say(f"background {name}: {shlex.join(cmd[1:])}")
        with open(self.work / f"{name}.log", "ab") as log:
            return self._popen(cmd, self._env(), log)

    def stop_background(self, wait_until: float) -> None:
        """Let the background compiles finish until ``wait_until``, then stop them all (the
        torch warm-up at once): step 2's timings run alone."""
        background = getattr(self, "background", [])
        late = [(n, p) for n, p in background if n.startswith("numerics")]
        for name, proc in late + [b for b in background if b not in late]:
            while name != "torch-warm" and proc.poll() is None and time.time() < wait_until:
                time.sleep(0.5)
            if proc.poll() is None:
                _kill_group(proc)
                self.say(f"background {name}: stopped")
                if name.startswith("numerics"):
                    self.not_reached.append(f"numerics {name} (cut before step 2's timings)")
            self.record({"step": "background", "what": name, "status": proc.returncode})
        self.background = []
        if late and "numerics" in self.steps:  # their records, written since step 1 ended
            known = len(self.steps["numerics"]["records"])
            recs = read_jsonl(self.out / "numerics.jsonl")
            for rec in recs[known:]:
                self.record({**rec, "late": True})
            self.steps["numerics"]["records"] = recs

    def step_numerics(self) -> None:
        end = self.step_end("numerics")
        out = self.out / "numerics.jsonl"
        me, cmds = ME, []
        if self.gpu_present:
            for spec in self.args.numerics:
                worker = ["--numerics-worker", spec, "--worker-out", str(out)]
                worker += ["--exe-cache", str(self.work / "exe-cache")]
                cmds.append((f"numerics-{_slug(spec)}", me + worker))
            cmds.append(("numerics-timeout", me + ["--timeout-worker", "--worker-out", str(out)]))
        else:
            for spec in self.args.numerics:
                worker = ["--numerics-worker", spec, "--no-gpu", "--worker-out", str(out)]
                cmds.append((f"numerics-{_slug(spec)}", me + worker))
            if shutil.which("nvcc") or os.environ.get("CUDA_HOME"):
                worker = ["--codegen-worker", SMOKE_CUDA_CODEGEN, "--worker-out", str(out)]
                cmds.append(("codegen-cuda", me + worker))
            else:
                self.not_reached.append("numerics: CUDA codegen (no nvcc here)")
        parallel = self.args.jobs or (len(cmds) if self.gpu_present else 2)
        t0 = time.time()
        # on a GPU, a model still building at the step's end goes on beside step 2's
        # background compiles, until step 2 times anything (stop_background)
        late: list = []
        cut = self.run_many(cmds, parallel, end, keep=late if self.gpu_present else None)
        self.not_reached += [f"numerics {c}" for c in cut]
        self.background = getattr(self, "background", []) + late
        recs = read_jsonl(out)
        packed = {b["model"]: b.get("inputs_sha") for b in self.manifest.get("builds", [])}
        for rec in recs:
            if packed.get(rec.get("model")) and rec.get("inputs_sha"):
                rec["inputs_match_pack"] = packed[rec["model"]] == rec["inputs_sha"]
            self.record(rec)
        self.steps["numerics"] = {"seconds": round(time.time() - t0, 1), "records": recs}
        self.steps["numerics"].update(cut=cut, continuing=[name for name, _ in late])

    def step_latency(self) -> None:
        end = self.step_end("latency")
        self.stop_background(time.time() + 0.25 * max(0.0, end - time.time()))
        gpu = self.gpu_present
        models = self.args.latency_models or (LATENCY_MODELS if gpu else SMOKE_LATENCY)
        configs = self.args.latency_configs or (LATENCY_CONFIGS if gpu else SMOKE_CONFIGS)
        cmd = [sys.executable, "-m", "bench.harness", "--models", *models, "--configs", *configs]
        jobs = str(self.args.jobs or max(1, (os.cpu_count() or 2) - 2))
        gpu_args = ["--gpu", "--repeat", "100", "--warmup", "10", "--compile-jobs", jobs]
        cmd += gpu_args if gpu else ["--smoke"]
        cmd += ["--results", str(self.out / "bench.jsonl"), "--out-dir", str(self.work)]
        cmd += ["--logs-dir", str(self.work / "bench.logs"), "--no-plot", "--fresh"]
        cmd += ["--deadline-at", str(end), "--timeout", str(self.args.config_timeout)]
        # numerics are step 1's (1e-4 against TVM's build); here tvm_default is checked
        # against ONNX Runtime on the CPU, which full-size models on a GPU may miss by more
        cmd += ["--tolerance", "1e-3"] if gpu else []
        cmd += ["--cache-dir", str(self.work / "exe-cache")]
        t0 = time.time()
        status = self.run(cmd, "latency", end + 20)
        from bench.harness import write_summaries

        results = self.out / "bench.jsonl"
        doc = write_summaries(results, plot_png=False) if results.exists() else {"models": []}
        log = (self.work / "latency.log").read_text(errors="replace").splitlines()
        for i, line in enumerate(log):
            if line.startswith("NOT REACHED"):
                later = log[i + 1 :]
                self.not_reached += [f"latency {ln.strip()}" for ln in later if ln.startswith("  ")]
        if status is None:
            self.not_reached.append("latency: the harness was stopped at its budget")
        slower = slower_than_baseline(doc)
        for line in slower:
            self.record({"step": "latency", "slower_than_tvm_cuda_graph": line})
        latency = {"seconds": round(time.time() - t0, 1), "status": status}
        self.steps["latency"] = latency | {"doc": doc, "slower": slower}

    def step_where(self) -> None:
        end = self.step_end("where")
        doc = self.steps.get("latency", {}).get("doc", {"models": []})
        worst = worst_ratio_model(doc)
        gpu = self.gpu_present
        model = worst[0] if worst else (LATENCY_MODELS[0] if gpu else "lstm_tc")
        cmd = [sys.executable, "-m", "bench.kernel_report", "--models", model]
        cmd += ["--target", "cuda" if gpu else "llvm", "--out", str(self.work / "kernels")]
        cmd += ["--deadline-at", str(end - 5)]
        if not gpu:
            cmd += ["--reduced", "--repeat", "3", "--max-ops", "3"]
        t0 = time.time()
        status = self.run(cmd, "kernels", end)
        report = _read_json(self.work / "kernels" / f"kernel_report-{model}.json")
        keys = ("name", "op", "uses", "tvm_vm_ms", "rkernel_ms", "lost_ms")
        rows = (report.get("rows") or report.get("operators") or [])[:5]
        top = [{k: row.get(k) for k in keys if k in row} for row in rows]
        rec = {"step": "where", "model": model, "worst": worst, "status": status}
        rec["top_operators"] = top
        rec["timeline"] = ("skipped: the generated code has no per-rTask %globaltimer trace "
                           "(tvm_rtask_now_ns serves the wait timeouts only)")  # fmt: skip
        self.record(rec)
        if status is None:
            self.not_reached.append("where: kernel report cut at its budget")
        self.steps["where"] = {"seconds": round(time.time() - t0, 1), **rec}

    def step_profile(self) -> None:
        end = self.step_end("profile")
        gpu = self.gpu_present
        device = _device_slug(self.gpu.get("device_name")) if gpu else "cpu-dry-run"
        cache = self.work / "profiles" / device
        # the shipped format (tvm_rtask/runtime/profiles/<device>/, docs/scheduling.md):
        # ``shipped/<device>/`` in details.tar.gz is copied into the package as it is
        shipped = self.work / "shipped" / device
        # the options' device names the shipped profile: h200 only when the options say so
        option = ["--option", f"device={device}"] if device in ("h100", "h200") else []
        models = self.args.latency_models or (LATENCY_MODELS if gpu else ["lstm_tc"])
        t0 = time.time()
        measured = _medians(self.steps.get("latency", {}).get("doc", {"models": []}))
        for model in models:
            if time.time() > end - 15:
                self.not_reached.append(f"profile {model}")
                continue
            target = "cuda" if gpu else "llvm"
            extra = [*option] + ([] if gpu else ["--reduced"])
            base = [sys.executable, "-m", "tvm_rtask.cli"]
            prof = base + ["profile", model, "--target", target, "--cache", str(cache), "--json"]
            prof += [str(self.work / f"profile-{model}.json"), "--export-shipped", str(shipped)]
            status = self.run(prof + extra, f"profile-{model}", end)
            rec = {"step": "profile", "model": model, "device": device, "status": status}
            if status == 0:
                plan_json = self.work / f"plan-measured-{model}.json"
                plan = base + ["plan", model, "--target", target, "--policy", "wavefront"]
                plan += ["--cost", "measured", "--cache", str(cache), "--json", str(plan_json)]
                if self.run(plan + extra, f"plan-{model}", end) == 0:
                    est = _estimate_ms(_read_json(plan_json).get("wavefront", {}))
                    rec["estimated_ms"] = est
                    real = measured.get((model, "wavefront_counter"))
                    if est and real:
                        rec["measured_ms"] = real
                        rec["error"] = round((est - real) / real, 3)
            self.record(rec)
            self.steps.setdefault("profile", {"records": []})["records"].append(rec)
        self.steps.setdefault("profile", {"records": []})["seconds"] = round(time.time() - t0, 1)
        self.steps["profile"]["cache"] = str(cache)
        self.steps["profile"]["shipped"] = str(shipped)

    def step_extras(self) -> None:
        if not self.gpu_present:
            self.not_reached.append("sm map and compute-sanitizer: need a GPU (skipped)")
            self.steps["extras"] = {"skipped": "GPU ABSENT"}
            return
        end = self.deadline - 8
        recs = []
        cmd = [sys.executable, "-m", "bench.gpu_sm_map", "--out", str(self.work / "sm_map.json")]
        status = self.run(cmd, "sm_map", min(end, time.time() + 60))
        result = _read_json(self.work / "sm_map.json").get("summary")
        recs.append({"step": "extras", "what": "sm_map", "status": status, "result": result})
        sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        for tool in ("racecheck", "memcheck"):
            if time.time() > end - 20 or not os.path.exists(sanitizer):
                self.not_reached.append(f"compute-sanitizer {tool}")
                continue
            cmd = [sanitizer, "--tool", tool, "--error-exitcode", "9", *ME, "--sanitize-worker"]
            status = self.run(cmd, f"sanitizer-{tool}", end)
            tail = _tail_text(self.work / f"sanitizer-{tool}.log")
            what = f"compute-sanitizer {tool}"
            recs.append({"step": "extras", "what": what, "status": status, "tail": tail})
            if status is None:
                self.not_reached.append(f"compute-sanitizer {tool} (cut)")
        for rec in recs:
            self.record(rec)
        self.steps["extras"] = {"records": recs}

    # summaries
    def summary(self) -> None:
        doc = {"date": datetime.datetime.now().isoformat(timespec="seconds")}
        doc.update(gpu_present=self.gpu_present, gpu=self.gpu)
        doc.update(elapsed_s=round(time.time() - self.start, 1), deadline_s=self.args.deadline)
        doc["env"] = getattr(self, "env_rec", {})
        doc["steps"] = {k: {n: v for n, v in step.items() if n != "doc"}
                        for k, step in self.steps.items()}  # fmt: skip
        doc["not_reached"] = self.not_reached
        (self.out / "summary.json").write_text(json.dumps(doc, indent=1, default=str))
        (self.out / "summary.md").write_text(render_summary(doc, self.steps))
        self._details()

    def _details(self) -> None:
        tmp = self.out / f".{DETAILS}.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(self.work.rglob("*")):
                rel = path.relative_to(self.work)
                if path.is_file() and not str(rel).startswith("exe-cache"):
                    if path.stat().st_size < 8 * 2**20:
                        tar.add(path, arcname=str(rel))
        os.replace(tmp, self.out / DETAILS)


def slower_than_baseline(doc: dict) -> list[str]:
    """``"model config: 2.06 ms, 4.29x TVM + CUDA graph (0.48 ms)"`` for every timed
    configuration slower than TVM + CUDA graph (``tvm_default`` where no graph was timed)."""
    out = []
    for m in doc.get("models", []):
        configs = m.get("configs", {})
        base_name = BASELINE if "median_ms" in configs.get(BASELINE, {}) else "tvm_default"
        base = configs.get(base_name, {}).get("median_ms")
        if not base:
            continue
        for name, entry in configs.items():
            ms = entry.get("median_ms")
            if name != base_name and ms and ms > base:
                out.append(f"{m['name']} {name}: {ms:.3f} ms, {ms / base:.2f}x {base_name} "
                           f"({base:.3f} ms), +{ms - base:.3f} ms")  # fmt: skip
    return out


def worst_ratio_model(doc: dict) -> tuple[str, float] | None:
    """The model whose best tvm-rtask configuration is furthest behind the baseline."""
    worst = None
    for m in doc.get("models", []):
        configs = m.get("configs", {})
        base = (configs.get(BASELINE) or configs.get("tvm_default") or {}).get("median_ms")
        rtask = [
            e["median_ms"]
            for n, e in configs.items()
            if e.get("kind") == "rtask" and e.get("median_ms")
        ]
        if base and rtask:
            ratio = min(rtask) / base
            if worst is None or ratio > worst[1]:
                worst = (m["name"], round(ratio, 3))
    return worst


def _medians(doc: dict) -> dict:
    return {
        (m["name"], name): e["median_ms"]
        for m in doc.get("models", [])
        for name, e in m.get("configs", {}).items()
        if e.get("median_ms")
    }


def _estimate_ms(entry: dict) -> float | None:
    report = entry.get("report", {}) if isinstance(entry, dict) else {}
    for key, value in report.items():
        if "estimat" in key and isinstance(value, (int, float)):
            return value / 1e3 if key.endswith("_us") else value
    plan = entry.get("plan", {}) if isinstance(entry, dict) else {}
    if isinstance(plan.get("estimated_us"), (int, float)):
        return plan["estimated_us"] / 1e3
    return None


def render_summary(doc: dict, steps: dict) -> str:
    gpu = doc["gpu_present"]
    lines = [
        f"# GPU window {doc['date']}",
        "",
        ("GPU: " + str(doc["gpu"].get("device_name")))
        if gpu
        else "GPU ABSENT (no CUDA device visible to TVM): dry run, tiny models on llvm and "
        "one codegen-only CUDA build",
        f"elapsed {doc['elapsed_s']} s of {doc['deadline_s']:.0f}",
    ]
    env = doc.get("env", {})
    if env:
        lines.append(f"nvcc: device {env.get('device_nvcc')}; pack {env.get('pack_nvcc')}")
        for key in ("note", "warning"):
            if env.get(key):
                lines.append(f"{key}: {env[key]}")
    num = steps.get("numerics")
    lines += ["", "## 1. Numerics (tvm-rtask's default build vs ONNX Runtime on the CPU, and "
              "vs TVM's)"]  # fmt: skip
    if num:
        head = ("| model | target | ok | rel. error vs ORT | vs TVM | TVM vs ORT | graph replays "
                "| graph rel. error vs ORT | TVM compile s | rtask compile s | nvcc cache "
                "hits/misses |")  # fmt: skip
        lines += ["", head, "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in num["records"]:
            cache = r.get("nvcc_cache") or {}
            lines.append(f"| {r.get('model')} | {r.get('target', 'cuda')} | "
                         f"{'yes' if r.get('ok') else 'NO'} | {_fmt(r.get('ort_rel_err'))} | "
                         f"{_fmt(r.get('rel_err'))} | {_fmt(r.get('tvm_ort_rel_err'))} | "
                         f"{r.get('graph_replays', '')} | {_fmt(r.get('graph_rel_err'))} | "
                         f"{r.get('tvm_compile_s', '')} | {r.get('rtask_compile_s', '')} | "
                         f"{cache.get('hits', '')}/{cache.get('misses', '')} |")  # fmt: skip
        for r in num["records"]:
            if r.get("error"):
                lines.append(f"- {r['model']}: {r['error'][:300]}")
    else:
        lines.append("not reached")
    lat = steps.get("latency")
    lines += ["", "## 2. Latency at batch 1 (median ms; ratio to TVM + CUDA graph)"]
    if lat:
        from bench.records import markdown_table

        lines += ["", markdown_table(lat["doc"]).strip()] if lat["doc"].get("models") else []
        lines += ["", "Slower than TVM + CUDA graph:"]
        lines += [f"- {s}" for s in lat["slower"]] or ["- none"]
        models = lat["doc"].get("models", [])
        configs = [(m, n, e) for m in models for n, e in m.get("configs", {}).items()]
        failed = [f"- {m['name']} {n}: {e['error'][:200]}" for m, n, e in configs if e.get("error")]
        if failed:
            lines += ["", "Failed:", *failed]
    else:
        lines.append("not reached")
    where = steps.get("where")
    lines += ["", "## 3. Where the time goes"]
    if where:
        lines.append(f"model {where['model']} (worst ratio {where.get('worst')}); kernel report "
                     f"status {where['status']}; timeline {where['timeline']}")  # fmt: skip
        lines += [f"- {json.dumps(r)}" for r in where.get("top_operators", [])]
    else:
        lines.append("not reached")
    prof = steps.get("profile")
    lines += ["", "## 4. Device profile (tvm-rtask profile; calibrated model vs step 2)"]
    if prof:
        lines.append(f"cache: {prof.get('cache')} (in {DETAILS})")
        if prof.get("shipped"):
            lines.append(f"shipped format: {prof['shipped']} (in {DETAILS}; docs/gpu.md, step 4: "
                         "copied into tvm_rtask/runtime/profiles/)")  # fmt: skip
        for r in prof.get("records", []):
            lines.append(f"- {r['model']}: status {r['status']}, estimated "
                         f"{_fmt(r.get('estimated_ms'))} ms, measured {_fmt(r.get('measured_ms'))} "
                         f"ms, error {_fmt(r.get('error'))}")  # fmt: skip
    else:
        lines.append("not reached")
    ext = steps.get("extras")
    lines += ["", "## 5. SM map, compute-sanitizer"]
    if ext:
        if ext.get("skipped"):
            lines.append(f"skipped: {ext['skipped']}")
        for r in ext.get("records", []):
            detail = r.get("result") or r.get("tail") or ""
            lines.append(f"- {r['what']}: status {r['status']} {detail}")
    else:
        lines.append("not reached")
    lines += ["", "## Not reached"]
    lines += [f"- {n}" for n in doc["not_reached"]] or ["- nothing: every step finished"]
    return "\n".join(lines) + "\n"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


# -- publishing ---------------------------------------------------------------------------------
README_BEGIN = (
    "<!-- gpu numbers: generated by `python -m bench gpu-window --update-readme {path}` -->"
)
README_END = "<!-- /gpu numbers -->"
README_PLACEHOLDER = re.compile(r"^GPU: no GPU table yet.*?(?=\n\n|\Z)", re.S | re.M)


def publish(window_out: Path, results_dir: Path = RESULTS) -> Path:
    """A window's folder to ``bench/results/<date>-<device>.json`` (+ ``.md``, ``.png``): the
    harness's document of step 2 with the window's numerics, slower-than lines and summary."""
    from bench.records import markdown_table, plot_results, results_document

    doc = results_document(read_jsonl(window_out / "bench.jsonl"))
    summary = _read_json(window_out / "summary.json")
    window = {"numerics": read_jsonl(window_out / "numerics.jsonl")}
    window["slower_than_tvm_cuda_graph"] = slower_than_baseline(doc)
    window.update(not_reached=summary.get("not_reached", []), gpu=summary.get("gpu", {}))
    doc["window"] = window
    device = _device_slug(summary.get("gpu", {}).get("device_name") or doc.get("device"))
    date = (summary.get("date") or doc.get("date") or datetime.date.today().isoformat())[:10]
    path = results_dir / f"{date}-{device}.json"
    path.write_text(json.dumps(doc, indent=1))
    path.with_suffix(".md").write_text(markdown_table(doc))
    if doc["models"]:
        try:
            plot_results(doc, path.with_suffix(".png"))
        except Exception as err:  # noqa: BLE001 - the numbers matter more
            print(f"plot failed: {err}", file=sys.stderr)
    return path


def readme_block(path: str | Path, root: Path = ROOT) -> str:
    """README's GPU table from a published results file, between its markers."""
    from bench.records import markdown_table

    try:
        source = Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        source = str(path)
    doc = json.loads(Path(path).read_text())
    head = f"GPU: {doc.get('device', 'GPU')}, batch 1, median ms (ratio to TVM + CUDA graph)"
    slower = doc.get("window", {}).get("slower_than_tvm_cuda_graph", [])
    body = [head + f", from `{source}`:", "", markdown_table(doc).strip()]
    if slower:
        body += ["", f"{len(slower)} configuration(s) slower than TVM + CUDA graph (see the file)."]
    return "\n".join([README_BEGIN.format(path=source), *body, README_END])


def update_readme(path: str | Path, readme: Path = ROOT / "README.md") -> None:
    """Put the GPU table of ``path`` into ``readme``: between the GPU markers, or in place
    of the paragraph 'GPU: no GPU table yet ...' the first time."""
    text = readme.read_text(encoding="utf-8")
    block = readme_block(path, readme.parent)
    # any generating command before the path: the block written by bench/gpu_window.py too
    marked = re.compile(r"<!-- gpu numbers: generated by .*?" + re.escape(README_END), re.S)
    if marked.search(text):
        text = marked.sub(lambda _: block, text, count=1)
    elif README_PLACEHOLDER.search(text):
        text = README_PLACEHOLDER.sub(lambda _: block, text, count=1)
    else:
        raise SystemExit(f"{readme} has neither GPU markers nor the 'GPU: no GPU table yet' line")
    readme.write_text(text, encoding="utf-8")


# -- helpers ------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _tail_text(path: Path, lines: int = 6) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in text[-lines:] if ln.strip())[:600]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def _device_slug(name: str | None) -> str:
    """``h100`` / ``h200`` for those GPUs, else a slug of the name."""
    text = (name or "gpu").lower()
    for short in ("h200", "h100", "a100"):
        if short in text:
            return short
    return _slug(text)[:40] or "gpu"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--out", default=os.environ.get("OUT") or str(ROOT / "gpu-results" / "window"))
    add("--work", default=None, help="logs and builds (default /tmp/tvm-rtask-window)")
    add("--deadline", type=float, default=450, help="seconds from --since")
    add("--since", type=float, default=None, help="Unix time the call began")
    add("--prep", default=os.environ.get("TVM_RTASK_GPU_PREP"),
        help="the pack's prepared folder (manifest.json, nvcc/)")  # fmt: skip
    add("--no-gpu", action="store_true", help="act as without a GPU")
    add("--jobs", type=int, default=None, help="processes side by side")
    add("--numerics", help="step 1's models, comma-separated (light:X, zoo:X)")
    add("--latency-models", help="step 2's zoo models, comma-separated")
    add("--latency-configs", help="step 2's configurations, comma-separated")
    add("--config-timeout", type=float, default=150)
    add("--skip", default="", help="steps to leave out: numerics,latency,where,...")
    add("--prepare", metavar="DIR", help="the pack: fill DIR's nvcc cache, no GPU")
    add("--smoke", action="store_true", help="--prepare: the dry run's tiny build")
    add("--publish", metavar="OUT_DIR", help="a window's folder to bench/results/")
    add("--update-readme", metavar="JSON", help="README's GPU table from a file")
    for hidden in ("--numerics-worker", "--codegen-worker", "--worker-out", "--exe-cache"):
        add(hidden, help=argparse.SUPPRESS)
    add("--timeout-worker", action="store_true", help=argparse.SUPPRESS)
    add("--sanitize-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.since = args.since or time.time()
    work = "/tmp/tvm-rtask-window" if os.environ.get("OUT") else str(Path(args.out) / ".work")
    args.work = args.work or work
    args.latency_models = args.latency_models.split(",") if args.latency_models else None
    args.latency_configs = args.latency_configs.split(",") if args.latency_configs else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.numerics_worker:
        out = Path(args.worker_out)
        return numerics_worker(args.numerics_worker, not args.no_gpu, out, args.exe_cache)
    if args.codegen_worker:
        return codegen_worker(args.codegen_worker, Path(args.worker_out))
    if args.timeout_worker:
        return timeout_worker(Path(args.worker_out))
    if args.sanitize_worker:
        return sanitize_worker()
    if args.prepare:
        return prepare(Path(args.prepare), args.jobs or 2, args.smoke)
    if args.publish:
        print(publish(Path(args.publish)))
        return 0
    if args.update_readme:
        update_readme(args.update_readme)
        return 0
    window = Window(args)
    for name in ("numerics.jsonl", "bench.jsonl", "window.jsonl"):
        (window.out / name).unlink(missing_ok=True)
    window.probe()
    gpu = window.gpu_present
    default = NUMERICS_MODELS if gpu else SMOKE_NUMERICS
    args.numerics = args.numerics.split(",") if args.numerics else default
    window.summary()
    skip = set(filter(None, args.skip.split(",")))
    window.start_background()
    steps = [("numerics", window.step_numerics, 30), ("latency", window.step_latency, 40),
             ("where", window.step_where, 25), ("profile", window.step_profile, 25),
             ("extras", window.step_extras, 20)]  # fmt: skip
    for name, step, needs in steps:
        if name in skip:
            window.not_reached.append(f"{name} (skipped by --skip)")
            continue
        if window.left() < needs:
            window.not_reached.append(f"{name} (no time left: {window.left():.0f} s)")
            continue
        window.say(f"step {name}: {window.left():.0f} s left")
        try:
            step()
        except Exception as err:  # noqa: BLE001 - a broken step must not lose the others
            traceback.print_exc()
            window.not_reached.append(f"{name}: {type(err).__name__}: {str(err)[:300]}")
        window.summary()
    window.stop_background(time.time())
    window.say(f"summary -> {window.out / 'summary.md'}")
    print((window.out / "summary.md").read_text(), flush=True)
    if not gpu:
        print("GPU ABSENT: this was a dry run.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
