"""Benchmark harness: every configuration of every model, each result written as it is timed.

    python -m bench latency --smoke                 # CI: tiny reduced models, few repeats, CPU
    python -m bench latency                         # CPU, the full zoo (long)
    python -m bench latency --gpu --deadline 500    # the GPU machine: target cuda, stop in time
    tvm-rtask bench --smoke                         # the same, through the CLI

Records: one JSON line of ``--results`` (default ``<out-dir>/<date>-<device>.jsonl``) per
(model, batch, configuration), appended the moment it is known, after one ``{"type": "env"}``
line (device, clocks, versions, date, source hash): ``compile_s`` (``cached`` or not), the
relative error, ``median_ms``, ``min_ms``, ``max_ms``, ``p10_ms``, ``p90_ms``, ``mean_ms``,
``repeat`` -- or ``error`` or ``skipped``. A second run with the same ``--results`` skips what
is recorded (``--retry-failed``, ``--fresh``); executables are cached in ``--cache-dir``, keyed
by model, batch, configuration, target and a hash of the tvm_rtask sources.

Isolation: the configurations of one model run one after another in one worker process, each
under ``--timeout``; a failure is recorded and the worker goes on, an overrun or a dead worker
is recorded and a fresh worker goes on. The peers run in workers of their own (Triton and TVM
both carry LLVM). ``--deadline`` stops cleanly in time and lists what was not reached.

Configurations (``--configs`` picks any of them by name)

=================================  =================================================================
``tvm_default``                    ``tvm.compile`` with TVM's default Relax pipeline for the target
``tvm_cuda_graph``                 the same with ``relax.backend.use_cuda_graph`` (cuda only)
``sequential``                     tvm-rtask, policy sequential ("RammerBase"), target's barriers
``wavefront_counter``              tvm-rtask, wavefront, dependency counters (cuda only)
``wavefront_cuda_graph``           the same under ``relax.backend.use_cuda_graph`` (cuda, opt-in)
``opara_streams_cuda_graph``       TVM's kernels on Opara's streams in one CUDA graph (cuda, opt-in)
``wavefront_fine``                 tvm-rtask, Rammer's wavefront policy, fine (step-array) barriers
``wavefront_global``               tvm-rtask, wavefront, global barriers (llvm default set only)
``ios``, ``opara``, ...            tvm-rtask, every other policy with the target's barriers (cuda
                                   default set: ``ios`` only)
``onnxruntime``                    ONNX Runtime (CPU; with ``--gpu`` the CUDA provider, if any)
``torch_eager``                    PyTorch eager (``bench/torch_modules.py``: same weights)
``torch_compile``                  ``torch.compile`` of the same (default mode)
``torch_compile_max_autotune``     ``mode="max-autotune"`` (cuda; llvm: opt-in, ``-no-cudagraphs``)
``torch_compile_reduce_overhead``  ``mode="reduce-overhead"`` (CUDA graphs; cuda only)
``torch_compile_max_autotune_no_cudagraphs``  ``mode="max-autotune-no-cudagraphs"`` (cuda, opt-in)
``torch_eager_tf32``, ``torch_compile_tf32``  as PyTorch runs by default: TF32 in cuDNN's
                                   convolutions (cuda, opt-in; checked at ``TF32_TOLERANCE``)
=================================  =================================================================

The PyTorch peers run torchvision's own module for its classifiers (BatchNorm folded, the ONNX
model's weights), the zoo model's twin (``tvm_rtask.models.torch_twin``), else onnx2torch's
conversion (``skipped`` with the reason where it cannot). Every TVM and
tvm-rtask configuration is checked against ``tvm_default``'s output (``--tolerance``, 1e-4)
before it is timed, the peers with ``--peer-tolerance`` (1e-3; no TF32 in PyTorch);
``tvm_default`` itself against ONNX Runtime on the CPU, also the reference when
``tvm_default`` failed. Timing: ``--warmup`` calls, then ``--repeat`` calls (fewer past
``--max-timing-s``), each followed by a device synchronisation. After every model the records
are gathered into ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` (:mod:`bench.records`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from bench import RESULTS, ROOT, append_jsonl, read_jsonl
from bench.peers import cpu_name, versions
from bench.records import markdown_table, model_id, plot_results, results_document
from tvm_rtask.testing.onnx_light import max_relative_error

DEFAULT_OUT = RESULTS
DEFAULT_CACHE = Path(os.environ.get("TVM_RTASK_BENCH_CACHE", "/tmp/tvm-rtask-cache"))
TOLERANCE = 1e-4
PEER_TOLERANCE = 1e-3
# TF32 keeps 10 mantissa bits: a deep network's outputs drift by about 1e-3-1e-2 relative
TF32_TOLERANCE = 5e-2
TEST_CONFIGS_ENV = "TVM_RTASK_BENCH_TEST_CONFIGS"

# --smoke: tiny reduced models (a few seconds to compile each configuration).
SMOKE_MODELS = {
    "lstm_tc": {"layers": 2, "steps": 2, "hidden": 8},
    "bert_layer": {"seq": 4, "hidden": 8, "heads": 2, "intermediate": 16},
}
CPU_MODELS = ["lstm_tc", "seq2seq", "deepspeech2", "bert_layer", "alexnet", "squeezenet",
              "resnext29", "randwire", "inception_v3", "nasnet_cifar"]  # fmt: skip
# On the GPU, the cheapest CUDA builds first, so a short window times as many as it can.
GPU_MODELS = ["squeezenet", "alexnet", "bert_layer", "resnext29", "lstm_tc", "seq2seq",
              "deepspeech2", "inception_v3", "randwire", "nasnet_cifar"]  # fmt: skip


# -- configurations ---------------------------------------------------------------------------
def _test_configs() -> list[dict]:
    """Configurations that compile nothing, for the harness's own tests (``TEST_CONFIGS_ENV``)."""
    behaviours = ["ok", "ok2", "fail", "wrong", "hang", "crash", "slow"]
    return [{"name": f"test_{b}", "kind": "test", "behaviour": b} for b in behaviours]


def all_configurations(target_kind: str) -> list[dict]:
    """Every configuration known for the target, in running order.

    Each is ``{"name", "kind": tvm|rtask|peer|test, ...}``; ``default`` says whether it is in
    the set run when ``--configs`` is not given.
    """
    from tvm_rtask.policies import policy_names

    gpu = target_kind == "cuda"
    policies = policy_names()
    configs = [{"name": "tvm_default", "kind": "tvm"}]
    if gpu:
        configs.append({"name": "tvm_cuda_graph", "kind": "tvm", "cuda_graph": True})
    rtask = []
    # barrier None: the target's default (llvm: step arrays, CUDA: dependency counters)
    if "sequential" in policies:
        rtask.append(("sequential", "sequential", None, True))
    if "wavefront" in policies:
        if gpu:
            rtask.append(("wavefront_counter", "wavefront", "counter", True))
            rtask.append(("wavefront_cuda_graph", "wavefront", "counter", False))
        rtask += [
            ("wavefront_fine", "wavefront", "fine", True),
            ("wavefront_global", "wavefront", "global", not gpu),
        ]
    taken = {c["name"] for c in configs} | {name for name, *_ in rtask}
    for policy in policies:
        if policy in ("sequential", "wavefront"):
            continue
        name = policy if policy not in taken else f"{policy}_policy"
        # opara_streams: opt-in (on the CPU one stream: TVM's kernels in Opara's order)
        default = (not gpu and policy != "opara_streams") or policy == "ios"
        rtask.append((name, policy, None, default))
        taken.add(name)
    if gpu and "opara_streams" in policies:
        # Opara as Opara runs: TVM's kernels on its streams, captured into one CUDA graph
        # (runtime/streams.StreamGraph), beside tvm_cuda_graph (the same kernels, one stream)
        rtask.append(("opara_streams_cuda_graph", "opara_streams", None, False))
    configs += [
        {"name": n, "kind": "rtask", "policy": p, "barrier": b, "default": d}
        # under a CUDA graph: TVM's capture, or for Opara's streams the project's own
        | (
            {("stream_graph" if p == "opara_streams" else "cuda_graph"): True}
            if n.endswith("_cuda_graph")
            else {}
        )
        for n, p, b, d in rtask
    ]
    peers = [("onnxruntime", None), ("torch_eager", "eager"), ("torch_compile", "default")]
    # On the CPU, opt-in (--configs): Inductor's autotuning takes minutes per model. On the GPU
    # PyTorch's own max-autotune (CUDA graphs included); there are no CUDA graphs on the CPU.
    autotune = "max-autotune" if gpu else "max-autotune-no-cudagraphs"
    peers.append(("torch_compile_max_autotune", autotune))
    peers += [("torch_compile_reduce_overhead", "reduce-overhead")] if gpu else []
    for name, mode in peers:
        configs.append({"name": name, "kind": "peer"} | ({"torch_mode": mode} if mode else {}))
    configs[-2 if gpu else -1]["default"] = gpu  # max-autotune
    if gpu:  # opt-in (--configs): each costs a window minutes of compiling
        # the third FP32 mode issue 49 names: autotuned kernels, no CUDA graphs
        mode = "max-autotune-no-cudagraphs"
        configs.append({"name": "torch_compile_max_autotune_no_cudagraphs", "kind": "peer",
                        "torch_mode": mode, "default": False})  # fmt: skip
        # PyTorch as it runs out of the box: TF32 in cuDNN's convolutions (not FP32, a
        # labelled column; compared at TF32_TOLERANCE)
        for name, mode in (("torch_eager_tf32", "eager"), ("torch_compile_tf32", "default")):
            configs.append({"name": name, "kind": "peer", "torch_mode": mode, "tf32": True,
                            "tolerance": TF32_TOLERANCE, "default": False})  # fmt: skip
    if os.environ.get(TEST_CONFIGS_ENV):
        configs += [{**c, "default": False} for c in _test_configs()]
    for c in configs:
        c.setdefault("default", True)
    return configs


def configurations(target_kind: str, names: list[str] | None = None) -> list[dict]:
    """The configurations to run: the default set, or ``names`` (in running order)."""
    known = all_configurations(target_kind)
    if not names:
        return [c for c in known if c["default"]]
    unknown = sorted(set(names) - {c["name"] for c in known})
    if unknown:
        raise ValueError(f"unknown configuration(s) {', '.join(unknown)} for {target_kind}; "
                         f"known: {', '.join(c['name'] for c in known)}")  # fmt: skip
    return [c for c in known if c["name"] in names]


def worker_group(config: dict) -> str:
    """Configurations of one group share a worker process: TVM ones, and the peers apart."""
    return "peer" if config["kind"] == "peer" else "tvm"


# -- records ----------------------------------------------------------------------------------
def record_key(target_kind: str, mid: str, config_name: str) -> str:
    return f"{target_kind}|{mid}|{config_name}"


def append_record(path: str | Path, record: dict) -> None:
    """One JSON line, flushed and synced: it survives the process being killed next."""
    append_jsonl(path, record, default=_json_default)


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)


read_records = read_jsonl  # every complete JSON line of a results file


def recorded_keys(path: str | Path, retry_failed: bool = False) -> set[str]:
    keys = set()
    for rec in read_records(path):
        if rec.get("type") != "result" or "key" not in rec:
            continue
        if retry_failed and "error" in rec:
            continue
        keys.add(rec["key"])
    return keys


# -- measuring --------------------------------------------------------------------------------
def _stats(samples_ms: list[float]) -> dict:
    p10, p50, p90 = np.percentile(samples_ms, [10, 50, 90])
    low, high, mean = np.min(samples_ms), np.max(samples_ms), np.mean(samples_ms)
    values = {"median_ms": p50, "min_ms": low, "max_ms": high, "p10_ms": p10, "p90_ms": p90}
    out = {k: float(v) for k, v in values.items()}
    return out | {"mean_ms": float(mean), "repeat": len(samples_ms)}


def time_calls(fn, warmup: int, repeat: int, sync=None, max_seconds: float | None = None) -> dict:
    """Warm-up, then ``repeat`` calls, each timed up to its device synchronisation; stops
    early (at least 3 samples) once ``max_seconds`` of timing have passed."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    samples = []
    begin = time.perf_counter()
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        end = time.perf_counter()
        samples.append((end - start) * 1e3)
        if max_seconds is not None and len(samples) >= 3 and end - begin > max_seconds:
            break
    out = _stats(samples)
    out["warmup"] = warmup
    return out


def to_numpy_list(result) -> list[np.ndarray]:
    """Outputs of TVM, PyTorch or ONNX Runtime as host numpy arrays, flattened in order.

    Torch tensors are tested first: they also have ``.numpy()``, which refuses CUDA tensors
    (``.detach().cpu().numpy()`` brings them to the host).
    """
    if hasattr(result, "detach") and hasattr(result, "cpu"):
        return [result.detach().cpu().numpy()]
    if hasattr(result, "numpy"):
        return [result.numpy()]
    if isinstance(result, (list, tuple)) or type(result).__name__ in ("Array", "Tuple"):
        out = []
        for r in result:
            out.extend(to_numpy_list(r))
        return out
    return [np.asarray(result)]


def one_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = (lines[-1] if lines and lines[0].startswith("Traceback") else lines[0]) if lines else ""
    return f"{type(err).__name__}: {text}"[:500]


def source_hash() -> str:
    """sha256 of the tvm_rtask package and native sources that this harness runs with."""
    digest = hashlib.sha256()
    try:
        import tvm_rtask

        pkg = Path(tvm_rtask.__file__).resolve().parent
    except ImportError:
        pkg = ROOT / "tvm_rtask"
    roots = [pkg, pkg.parent / "src"]
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".cc", ".c", ".h", ".cpp") and path.is_file():
                digest.update(str(path.relative_to(root.parent)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class ArtifactCache:
    """Compiled executables on the machine's disk, one ``.so`` + ``.json`` per key.

    The key covers the model, batch, variant, configuration, target, TVM version and the
    tvm_rtask source hash, so an edited source never reuses an old build.
    """

    def __init__(self, root: str | Path | None, salt: str):
        self.root = Path(root) if root else None
        self.salt = salt
        if self.root:
            self.root.mkdir(parents=True, exist_ok=True)

    def key(self, *parts) -> str:
        text = json.dumps([self.salt, *parts], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def has(self, key: str) -> bool:
        return bool(self.root) and (self.root / f"{key}.json").is_file()

    def load(self, key: str):
        """``(runtime module, metadata)`` or None; ``load_error`` says why a cached build
        could not be loaded (it is then compiled again)."""
        self.load_error = None
        if not self.root:
            return None
        lib, meta = self.root / f"{key}.so", self.root / f"{key}.json"
        if not (lib.is_file() and meta.is_file()):
            return None
        import tvm

        try:
            return tvm.runtime.load_module(str(lib)), json.loads(meta.read_text())
        except Exception as err:
            self.load_error = one_line(err)
            return None

    def store(self, key: str, executable, meta: dict, rtask: bool) -> str | None:
        """Export ``executable``; returns None, or why it could not be cached."""
        if not self.root:
            return None
        lib = self.root / f"{key}.so"
        tmp = self.root / f".{key}.{os.getpid()}.so"
        try:
            if rtask:
                from tvm_rtask.runtime import export_library

                export_library(executable, str(tmp))
            else:
                executable.export_library(str(tmp))
            os.replace(tmp, lib)
            (self.root / f"{key}.json").write_text(json.dumps(meta))
            return None
        except Exception as err:
            tmp.unlink(missing_ok=True)
            return one_line(err)

    def ref_path(self, key: str) -> Path | None:
        return self.root / "refs" / f"{key}.npz" if self.root else None


# -- one configuration ------------------------------------------------------------------------
def cuda_target(arch: str | None = None):
    import tvm

    if arch is None:
        dev = tvm.cuda(0)
        arch = "sm_" + dev.compute_version.replace(".", "") if dev.exist else "sm_90"
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")


def make_target(target_kind: str, arch: str | None = None):
    import tvm

    return cuda_target(arch) if target_kind == "cuda" else tvm.target.Target({"kind": "llvm"})


class ModelContext:
    """What the configurations of one model share in a worker."""

    def __init__(self, spec: dict):
        import tvm_rtask.models as zoo

        self.spec = spec
        self.gpu = spec["target"] == "cuda"
        self.model = zoo.onnx_model(spec["model"], batch=spec["batch"], reduced=spec["reduced"],
                                    **spec["overrides"])  # fmt: skip
        self.inputs = zoo.sample_inputs(self.model)
        self._mod = None
        self.cache = ArtifactCache(spec.get("cache_dir"), spec["source_hash"])
        self.ref_key = self.cache.key("reference", spec["target"], spec["model_id"])
        self._ort = None
        self.reference, self.reference_name = self._saved_reference()

    @property
    def mod(self):
        if self._mod is None:
            from tvm_rtask import frontend

            self._mod = frontend.load(self.model)
        return self._mod

    def ort_outputs(self) -> list[np.ndarray]:
        if self._ort is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            cpu = ["CPUExecutionProvider"]
            session = ort.InferenceSession(self.model.SerializeToString(), options, providers=cpu)
            self._ort = [np.asarray(o) for o in session.run(None, self.inputs)]
        return self._ort

    def _saved_reference(self):
        path = self.cache.ref_path(self.ref_key)
        if path and path.is_file():
            with np.load(path) as data:
                return [data[f"out{i}"] for i in range(len(data.files))], "tvm_default"
        return None, None

    def save_reference(self, outputs: list[np.ndarray]) -> None:
        self.reference, self.reference_name = outputs, "tvm_default"
        path = self.cache.ref_path(self.ref_key)
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.npz")
            np.savez(tmp, **{f"out{i}": o for i, o in enumerate(outputs)})
            os.replace(tmp, path)

    def expected(self) -> tuple[list[np.ndarray], str]:
        if self.reference is not None:
            return self.reference, self.reference_name
        return self.ort_outputs(), "onnxruntime_cpu"


def _import_rtask_runtime() -> None:
    """Modules that register what tvm-rtask executables call at run time (the CUDA status
    check): needed when an executable is loaded from the cache, not compiled here."""
    import importlib

    # tvm.support.nvcc registers TVM's tvm_callback_cuda_compile (NVRTC)
    for name in ("tvm.support.nvcc", "tvm_rtask.backend.cuda.status",
                 "tvm_rtask.runtime.cuda_status", "tvm_rtask.api"):  # fmt: skip
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    try:  # tvm-rtask's sources from the nvcc cache (filled by `make gpu-pack`)
        from tvm_rtask.backend.cuda.compile_cache import install_compile_callback

        install_compile_callback()
    except ImportError:
        pass


def build_executable(config: dict, ctx: ModelContext, entry: dict, compile_only: bool = False):
    """The configuration's executable: from the cache, else compiled (and cached).

    ``compile_only``: return None without loading when the cache already has it.
    """
    import tvm

    spec = ctx.spec
    target = make_target(spec["target"], spec.get("arch"))
    options = {}
    if config["kind"] == "rtask":
        options = {"policy": config["policy"], "barrier": config["barrier"]}
        if not ctx.gpu:
            options["num_veu"] = spec["threads"]
    key = ctx.cache.key(spec["model_id"], str(target), config, options, tvm.__version__)
    if compile_only and ctx.cache.has(key):
        return None
    if ctx.gpu and not compile_only:
        _import_rtask_runtime()  # before the load: a CUDA module's source compiles at load
    cached = None if compile_only else ctx.cache.load(key)
    if getattr(ctx.cache, "load_error", None):
        entry["cache_load_error"] = ctx.cache.load_error
    if cached is not None:
        ex, meta = cached
        entry.update(cached=True, compile_s=meta.get("compile_s"))
        if config["kind"] == "rtask":
            _import_rtask_runtime()
        return ex
    mod = ctx.mod  # imported once per model, not part of any configuration's compile time
    start = time.perf_counter()
    if config["kind"] == "rtask":
        import tvm_rtask

        graph = {"relax.backend.use_cuda_graph": True} if config.get("cuda_graph") else {}
        with tvm.transform.PassContext(config=graph):
            ex = tvm_rtask.compile(mod, target, **options)
    elif config.get("cuda_graph"):
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            ex = tvm.compile(mod, target=target)
    else:
        ex = tvm.compile(mod, target=target)
    compile_s = time.perf_counter() - start
    entry.update(cached=False, compile_s=round(compile_s, 3))
    why = ctx.cache.store(key, ex, {"compile_s": round(compile_s, 3)}, config["kind"] == "rtask")
    if why:
        entry["cache_error"] = why
    return ex


def _tvm_runner(config: dict, ctx: ModelContext, entry: dict):
    import tvm
    from tvm import relax

    start = time.perf_counter()
    ex = build_executable(config, ctx, entry)
    if ctx.gpu:
        dev = tvm.cuda(0)
    else:
        from tvm_rtask.runtime import set_num_threads

        set_num_threads(ctx.spec["threads"])
        dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    if entry.get("cached"):
        entry["load_s"] = round(time.perf_counter() - start, 3)
    args = [tvm.runtime.tensor(v, dev) for v in ctx.inputs.values()]
    if config.get("stream_graph"):
        from tvm_rtask.runtime.streams import StreamGraph

        graph = StreamGraph(vm, args)  # replays read args and return the captured outputs
        return graph, graph.synchronize
    return (lambda: vm["main"](*args)), (dev.sync if ctx.gpu else None)


def _onnxruntime_runner(ctx: ModelContext, entry: dict):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = ctx.spec["threads"]
    providers = ["CPUExecutionProvider"]
    if ctx.gpu:
        available = ort.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise _Skip("onnxruntime has no CUDAExecutionProvider here (providers: "
                        f"{', '.join(available)})")  # fmt: skip
        providers = ["CUDAExecutionProvider"]
    start = time.perf_counter()
    session = ort.InferenceSession(ctx.model.SerializeToString(), options, providers=providers)
    entry.update(compile_s=round(time.perf_counter() - start, 3), cached=False)
    return (lambda: session.run(None, ctx.inputs)), None


def _torch_module(ctx: ModelContext, entry: dict):
    """The PyTorch module a peer runs (``bench.torch_modules``: torchvision's own for its
    classifiers, a zoo model's twin, else onnx2torch's conversion); a peer that cannot have
    one is skipped with the reason."""
    from bench.torch_modules import NoTorchModule, torch_module

    try:
        module, entry["torch_source"] = torch_module(ctx.spec["model"], ctx.model)
    except NoTorchModule as err:
        raise _Skip(str(err)) from err
    return module


def _torch_runner(config: dict, ctx: ModelContext, entry: dict):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise _Skip("torch not installed")
    import torch

    if ctx.gpu and not torch.cuda.is_available():
        raise _Skip("torch sees no CUDA device")
    torch.set_num_threads(ctx.spec["threads"])
    # Plain float32 arithmetic, as TVM's: no TF32 in convolutions or matmuls; the ``tf32``
    # configurations as PyTorch's defaults are (cuDNN convolutions in TF32, matmuls not).
    torch.backends.cudnn.allow_tf32 = bool(config.get("tf32"))
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda" if ctx.gpu else "cpu"
    mode = config["torch_mode"]
    start = time.perf_counter()
    module = _torch_module(ctx, entry).to(device)
    if mode != "eager":
        module = torch.compile(module, mode=None if mode == "default" else mode)
    args = [torch.from_numpy(np.ascontiguousarray(v)).to(device) for v in ctx.inputs.values()]
    mark_step = None
    if mode in ("reduce-overhead", "max-autotune"):
        mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", None)

    def call():
        if mark_step:
            mark_step()
        with torch.inference_mode():
            return module(*args)

    sync = torch.cuda.synchronize if ctx.gpu else None
    call()  # torch.compile compiles on the first call
    if sync:
        sync()
    entry.update(compile_s=round(time.perf_counter() - start, 3), cached=False)
    return call, sync


class _Skip(Exception):
    """A peer that cannot run here: recorded as ``skipped`` with the reason, not an error."""


def _test_runner(config: dict, ctx: ModelContext, entry: dict):
    behaviour = config["behaviour"]
    expected, _ = ctx.expected()
    entry.update(compile_s=0.0, cached=False)
    if behaviour == "fail":
        raise RuntimeError("injected failure")
    if behaviour == "hang":
        time.sleep(3600)
    if behaviour == "crash":
        sys.stdout.flush()
        os._exit(70)
    if behaviour == "slow":
        time.sleep(float(os.environ.get("TVM_RTASK_BENCH_TEST_SLOW_S", "2")))
    outputs = [e * 2 + 1 for e in expected] if behaviour == "wrong" else list(expected)
    return (lambda: outputs), None


def run_config(config: dict, ctx: ModelContext) -> dict:
    """Compile, check and time one configuration; the record's measurement fields."""
    entry = {k: config[k] for k in ("kind", "policy", "barrier", "torch_mode") if k in config}
    started = time.perf_counter()
    try:
        if config["kind"] == "test":
            fn, sync = _test_runner(config, ctx, entry)
        elif config["name"] == "onnxruntime":
            fn, sync = _onnxruntime_runner(ctx, entry)
        elif config["kind"] == "peer":
            fn, sync = _torch_runner(config, ctx, entry)
        else:
            fn, sync = _tvm_runner(config, ctx, entry)
        outputs = to_numpy_list(fn())
        if config["name"] == "tvm_default":
            expected, reference = ctx.ort_outputs(), "onnxruntime_cpu"
        else:
            expected, reference = ctx.expected()
        tolerance = ctx.spec["peer_tolerance" if config["kind"] == "peer" else "tolerance"]
        tolerance = config.get("tolerance", tolerance)  # TF32 peers: their own
        error = max_relative_error(outputs, expected)
        entry.update(rel_error=error, reference=reference, tolerance=tolerance)
        if not error < tolerance:
            entry["error"] = f"wrong result: relative error {error:.3g} against {reference}"
        else:
            if config["name"] == "tvm_default":
                ctx.save_reference(outputs)
            spec = ctx.spec
            entry.update(time_calls(fn, spec["warmup"], spec["repeat"], sync, spec["max_timing_s"]))
    except _Skip as why:
        entry["skipped"] = str(why)
    except Exception as err:
        entry["error"] = one_line(err)
        traceback.print_exc()
    entry["elapsed_s"] = round(time.perf_counter() - started, 3)
    return entry


# -- worker process ---------------------------------------------------------------------------
def _write_status(path: str, **status) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({**status, "t": time.time()}, f)
    os.replace(tmp, path)


def base_record(spec: dict, config_name: str) -> dict:
    rec = {"type": "result", "key": record_key(spec["target"], spec["model_id"], config_name)}
    keys = ("model_id", "model", "batch", "reduced", "overrides", "target")
    rec.update({k: spec[k] for k in keys})
    return rec | {"config": config_name}


def run_worker(spec_path: str) -> int:
    """Run the configurations of ``spec`` one after another, appending each record."""
    with open(spec_path) as f:
        spec = json.load(f)
    known = {c["name"]: c for c in all_configurations(spec["target"])}
    _write_status(spec["status"], config=None, phase="setup")
    try:
        ctx = ModelContext(spec)
    except Exception as err:
        traceback.print_exc()
        for name in spec["configs"]:
            rec = base_record(spec, name)
            rec["error"] = f"model setup failed: {one_line(err)}"
            append_record(spec["results"], rec)
        return 0
    if spec.get("compile_only"):
        return _compile_only(spec, ctx, known)
    for name in spec["configs"]:
        if time.time() > spec["deadline"]:
            break
        _write_status(spec["status"], config=name, phase="run")
        print(f"[worker] {spec['model_id']} {name} ...", flush=True)
        entry = run_config(known[name], ctx)
        rec = base_record(spec, name)
        rec.update(entry)
        rec["date"] = datetime.datetime.now().isoformat(timespec="seconds")
        append_record(spec["results"], rec)
    _write_status(spec["status"], config=None, phase="done")
    return 0


def _compile_only(spec: dict, ctx: ModelContext, known: dict) -> int:
    """Fill the cache; a configuration that fails to compile is recorded as failed."""
    for name in spec["configs"]:
        _write_status(spec["status"], config=name, phase="compile")
        entry: dict = {}
        try:
            build_executable(known[name], ctx, entry, compile_only=True)
        except Exception as err:
            traceback.print_exc()
            rec = base_record(spec, name)
            rec.update(entry)
            rec["error"] = f"compile failed: {one_line(err)}"
            rec["date"] = datetime.datetime.now().isoformat(timespec="seconds")
            append_record(spec["results"], rec)
    _write_status(spec["status"], config=None, phase="done")
    return 0


# -- driver -----------------------------------------------------------------------------------
def _run(cmd: list[str], timeout: float = 30) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def gpu_info() -> dict:
    """Name, driver, clocks and memory of GPU 0 from nvidia-smi; nvcc's version."""
    fields = ["name", "driver_version", "clocks.max.sm", "clocks.sm", "memory.total",
              "compute_cap", "pci.bus_id"]  # fmt: skip
    info = {}
    out = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"])
    if out:
        values = [v.strip() for v in out.splitlines()[0].split(",")]
        info.update(dict(zip(fields, values, strict=False)))
    nvcc = _run(["nvcc", "--version"]) or _run(["/usr/local/cuda/bin/nvcc", "--version"])
    if nvcc:
        info["nvcc"] = nvcc.splitlines()[-1]
    return info


def device_name(target_kind: str, threads: int) -> str:
    if target_kind == "cuda":
        return gpu_info().get("name", "cuda")
    return f"{cpu_name()}, {threads} threads"


# the distributions a benchmark record names the versions of (peers.versions reads them)
DISTRIBUTIONS = ("apache-tvm", "apache-tvm-ffi", "tvm-rtask", "onnx", "onnxruntime", "torch",
                 "torchvision", "onnx2torch", "numpy")  # fmt: skip


def environment(target_kind: str, threads: int, args) -> dict:
    mode = ("smoke-" if args.smoke else "") + ("gpu" if target_kind == "cuda" else "cpu")
    env = {"type": "env", "device": device_name(target_kind, threads), "target": target_kind}
    date = datetime.datetime.now().isoformat(timespec="seconds")
    env.update(mode=mode, threads=threads, date=date, host=platform.node())
    env.update(platform=platform.platform(), versions=versions(DISTRIBUTIONS))
    env.update(source_hash=source_hash(), warmup=args.warmup, repeat=args.repeat)
    env["timeout_s"] = args.timeout
    if target_kind == "cuda":
        env["gpu"] = gpu_info()
    commit = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    if commit:
        env["commit"] = commit
    return env


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "device"


def _kill(proc: subprocess.Popen) -> None:
    """The worker and everything it started (nvcc, compile threads): its process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _spawn_worker(spec_path: Path, log) -> subprocess.Popen:
    """``python -m bench.harness --worker SPEC`` in its own process group, output to ``log``."""
    cmd = [sys.executable, "-m", "bench.harness", "--worker", str(spec_path)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=str(ROOT))  # fmt: skip


def _tail(path: Path, since: int = 0, lines: int = 3) -> str:
    """The last lines a worker wrote to its log (from byte ``since``): why it died."""
    try:
        with open(path, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - 8000))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("[worker]")]
    return " | ".join(kept[-lines:])[:600]


class Runner:
    """Runs the workers of one harness invocation and keeps the results file up to date."""

    def __init__(self, args, target_kind: str, results: Path, deadline: float):
        self.args = args
        self.target_kind = target_kind
        self.results = results
        self.deadline = deadline
        logs_dir = getattr(args, "logs_dir", None)
        self.logs = Path(logs_dir) if logs_dir else results.parent / f"{results.stem}.logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.not_reached: list[str] = []
        self.printed = len(read_records(results))

    def _print_new(self) -> None:
        records = read_records(self.results)
        for rec in records[self.printed :]:
            if rec.get("type") == "result":
                print(describe_record(rec), flush=True)
        self.printed = len(records)

    def run_group(self, spec: dict, todo: list[str]) -> None:
        mid = spec["model_id"]
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{spec['model_id']}-{spec['group']}")
        log = self.logs / f"{tag}.log"
        spec_path = self.logs / f"{tag}.spec.json"
        status_path = self.logs / f"{tag}.status.json"
        while todo:
            if time.time() > self.deadline - self.args.min_start_s:
                self.not_reached += [f"{spec['model_id']} {c}" for c in todo]
                return
            spec = {**spec, "configs": todo, "status": str(status_path)}
            spec["deadline"] = self.deadline
            spec_path.write_text(json.dumps(spec))
            if status_path.exists():
                status_path.unlink()
            with open(log, "ab") as out:
                log_start = out.tell()
                proc = _spawn_worker(spec_path, out)
                failed, why = self._watch(proc, status_path, spec)
            self._print_new()
            done = recorded_keys(self.results)

            def key(name: str, mid: str = mid) -> str:
                return record_key(self.target_kind, mid, name)

            if failed and key(failed) not in done:
                if why == "deadline":
                    self.not_reached += [
                        f"{spec['model_id']} {c}" for c in todo if key(c) not in done
                    ]
                    return
                rec = base_record(spec, failed)
                if why == "exit":
                    code = proc.returncode
                    rec["error"] = f"worker died (status {code}) during this configuration"
                    tail = _tail(log, log_start)
                    if tail:
                        rec["error"] += f": {tail}"
                else:
                    rec["error"] = why
                rec["date"] = datetime.datetime.now().isoformat(timespec="seconds")
                append_record(self.results, rec)
                self._print_new()
                done.add(key(failed))
            remaining = [c for c in todo if key(c) not in done]
            if remaining == todo:  # no progress and nothing to blame: do not loop
                self.not_reached += [
                    f"{spec['model_id']} {c} (worker made no progress)" for c in todo
                ]
                return
            todo = remaining

    def precompile(self, jobs: list[tuple[dict, str]], parallel: int, end: float) -> None:
        """Compile ``jobs`` (spec, configuration) ``parallel`` at a time into the cache, before
        any timing: compiles are CPU-bound and independent, timings must run alone. A job that
        fails is recorded as failed; one cut by ``end`` is compiled again by the timing pass."""
        pending = list(jobs)
        running: list[tuple] = []
        started_at = time.time()
        print(f"compiling {len(pending)} configuration(s), {parallel} at a time", flush=True)
        while pending or running:
            now = time.time()
            while pending and len(running) < parallel and now < end - self.args.min_start_s:
                spec, name = pending.pop(0)
                tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"compile-{spec['model_id']}-{name}")
                spec = {**spec, "configs": [name], "compile_only": True, "deadline": end}
                spec["status"] = str(self.logs / f"{tag}.status.json")
                spec_path = self.logs / f"{tag}.spec.json"
                spec_path.write_text(json.dumps(spec))
                log = self.logs / f"{tag}.log"
                with open(log, "ab") as out:
                    offset = out.tell()
                    proc = _spawn_worker(spec_path, out)
                running.append((proc, spec, name, now, log, offset))
            if pending and now >= end - self.args.min_start_s:
                pending = []  # left to the timing pass
            still = []
            for proc, spec, name, began, log, offset in running:
                code = proc.poll()
                why = None
                if code is not None and code != 0:
                    why = f"worker died (status {code}) while compiling: {_tail(log, offset)}"
                elif code is None and now - began > self.args.timeout:
                    _kill(proc)
                    why = f"timed out after {self.args.timeout} s (compiling; worker killed)"
                elif code is None and now > end:
                    _kill(proc)  # not recorded: the timing pass compiles it if time is left
                elif code is None:
                    still.append((proc, spec, name, began, log, offset))
                if why:
                    rec = base_record(spec, name)
                    rec["error"] = why
                    rec["date"] = datetime.datetime.now().isoformat(timespec="seconds")
                    append_record(self.results, rec)
            running = still
            self._print_new()
            time.sleep(0.2)
        print(f"compiled in {time.time() - started_at:.1f} s", flush=True)

    def _watch(self, proc, status_path: Path, spec: dict) -> tuple[str | None, str | None]:
        """Wait for the worker; kill it when a configuration overruns its timeout or the
        deadline comes. Returns ``(configuration at fault, why)``; ``(None, None)`` when
        the worker finished by itself after recording everything it started."""
        current, since = "<setup>", time.time()
        while True:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            try:
                status = json.loads(status_path.read_text())
                name = status.get("config") or ("<setup>" if status["phase"] == "setup" else None)
                if name != current:
                    current, since = name, status["t"]
            except (OSError, ValueError, KeyError):
                pass
            self._print_new()
            if proc.returncode is not None:
                if proc.returncode == 0 and current in (None, "<setup>"):
                    return None, None
                blamed = current if current not in (None, "<setup>") else spec["configs"][0]
                if current == "<setup>" and proc.returncode != 0:
                    return self._setup_failed(spec, proc.returncode)
                return blamed, "exit"
            now = time.time()
            if now > self.deadline:
                _kill(proc)
                return (current if current != "<setup>" else spec["configs"][0]), "deadline"
            limit = self.args.setup_timeout if current == "<setup>" else self.args.timeout
            if current is not None and now - since > limit:
                _kill(proc)
                if current == "<setup>":
                    return self._setup_failed(spec, None)
                return current, f"timed out after {self.args.timeout} s (worker killed)"

    def _setup_failed(self, spec: dict, code: int | None) -> tuple[None, None]:
        why = f"worker died (status {code}) while loading the model"
        if code is None:
            why = f"model setup timed out after {self.args.setup_timeout} s"
        for name in spec["configs"]:
            rec = base_record(spec, name)
            rec["error"] = why
            append_record(self.results, rec)
        return None, None


def describe_record(rec: dict) -> str:
    head = f"{rec['model']:14s} b{rec['batch']:<3d} {rec['config']:30s}"
    if "median_ms" in rec:
        cached = " cached" if rec.get("cached") else ""
        return (
            f"{head} median {rec['median_ms']:9.3f} ms (min {rec['min_ms']:.3f}, max "
            f"{rec['max_ms']:.3f}, N={rec['repeat']}), compile {rec.get('compile_s')} s{cached}"
        )
    if "skipped" in rec:
        return f"{head} skipped: {rec['skipped']}"
    return f"{head} FAILED: {rec.get('error')}"


def write_summaries(results: Path, plot_png: bool) -> dict:
    """``<stem>.json`` (per model), ``<stem>.md`` (table) and, if asked, ``<stem>.png``."""
    doc = results_document(read_records(results))
    results.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=_json_default))
    results.with_suffix(".md").write_text(markdown_table(doc))
    if plot_png and doc["models"]:
        try:
            plot_results(doc, results.with_suffix(".png"))
        except Exception as err:  # matplotlib missing or broken: the numbers matter more
            print(f"plot failed: {one_line(err)}", file=sys.stderr)
    return doc


def _split_names(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [n for v in values for n in v.split(",") if n]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--smoke", action="store_true", help="tiny models, few repeats")
    add("--gpu", action="store_true", help="target cuda (the GPU machine)")
    add("--models", nargs="+", help="zoo models (default: all, or the smoke set)")
    add("--batch", nargs="+", type=int, default=[1], help="batch sizes")
    add("--reduced", action="store_true", help="the zoo's reduced variants")
    add("--threads", type=int, default=None, help="CPU threads = vEUs")
    add("--warmup", type=int, default=None)
    add("--repeat", type=int, default=None)
    add("--max-timing-s", type=float, default=20.0, help="timing cap per config")
    add("--configs", nargs="+", help="only these configurations")
    add("--out-dir", default=str(DEFAULT_OUT), help="where results go")
    add("--results", help="results JSON lines (default <out-dir>/<date>-<device>.jsonl)")
    add("--no-plot", action="store_true")
    add("--timeout", type=float, default=None, help="seconds per configuration")
    add("--setup-timeout", type=float, default=120, help="extra for model import")
    add("--deadline", type=float, help="stop cleanly within this many seconds")
    add("--deadline-at", type=float, help="the same as a Unix time")
    add("--min-start-s", type=float, default=10, help="no worker starts later")
    add("--cache-dir", default=str(DEFAULT_CACHE), help="compiled executables")
    add("--no-cache", action="store_true")
    add("--fresh", action="store_true", help="ignore configurations recorded")
    add("--retry-failed", action="store_true", help="run failed ones again")
    add("--compile-jobs", type=int, default=1, help="compile the TVM configurations this many "
        "at a time first (cache needed); the timings then run one at a time")  # fmt: skip
    add("--compile-share", type=float, default=0.7, help="of the time to the deadline, at most")
    add("--tolerance", type=float, default=TOLERANCE)
    add("--peer-tolerance", type=float, default=PEER_TOLERANCE)
    add("--logs-dir", help="workers' logs and specs (default <results stem>.logs beside it)")
    add("--compile-only", action="store_true", help="fill --cache-dir with the TVM and "
        "tvm-rtask builds (--compile-jobs at a time) and stop: what `make gpu-pack` prepares "
        "without a GPU")  # fmt: skip
    add("--worker", help=argparse.SUPPRESS)
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    if args.worker:
        return run_worker(args.worker)
    args.threads = args.threads or min(os.cpu_count() or 1, 2 if args.smoke else 64)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 10)
    args.repeat = args.repeat or (3 if args.smoke else 100)
    target_kind = "cuda" if args.gpu else "llvm"
    args.timeout = args.timeout or (300 if args.smoke else 600)
    start = time.time()
    deadline = args.deadline_at or float("inf")
    if args.deadline:
        deadline = min(deadline, start + args.deadline)
    models_arg = _split_names(args.models)
    if args.smoke:
        models = [(m, SMOKE_MODELS.get(m, {})) for m in (models_arg or SMOKE_MODELS)]
        reduced = True
    else:
        default = GPU_MODELS if args.gpu else CPU_MODELS
        models = [(m, {}) for m in (models_arg or default)]
        reduced = args.reduced
    import tvm_rtask.models as zoo

    unknown = [m for m, _ in models if m not in zoo.names()]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; the zoo has {', '.join(zoo.names())}")
    try:
        configs = configurations(target_kind, _split_names(args.configs))
    except ValueError as err:
        parser.error(str(err))
    env = environment(target_kind, args.threads, args)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.results:
        results = Path(args.results)
        results.parent.mkdir(parents=True, exist_ok=True)
    else:
        results = out_dir / f"{datetime.date.today().isoformat()}-{_slug(env['device'])}.jsonl"
    if args.fresh and results.exists():
        results.unlink()
    append_record(results, env)
    done = recorded_keys(results, args.retry_failed)
    runner = Runner(args, target_kind, results, deadline)
    print(f"results -> {results} ({env['device']}; {len(done)} configurations recorded before)")
    arch = None
    if target_kind == "cuda":
        cap = env.get("gpu", {}).get("compute_cap", "")
        arch = f"sm_{cap.replace('.', '')}" if re.fullmatch(r"\d+\.\d+", cap) else None
    plan = []  # (spec, group, todo)
    skipped_before = 0
    for name, overrides in models:
        for batch in args.batch:
            mid = model_id(name, batch, reduced, overrides)
            spec = {"model": name, "batch": batch, "reduced": reduced, "overrides": overrides}
            spec.update(model_id=mid, target=target_kind, arch=arch, threads=args.threads)
            spec.update(warmup=args.warmup, repeat=args.repeat, max_timing_s=args.max_timing_s)
            spec.update(tolerance=args.tolerance, peer_tolerance=args.peer_tolerance)
            spec.update(results=str(results), source_hash=env["source_hash"])
            spec["cache_dir"] = None if args.no_cache else args.cache_dir
            for group in ("tvm", "peer"):
                names = [c["name"] for c in configs if worker_group(c) == group]
                todo = [n for n in names if record_key(target_kind, mid, n) not in done]
                skipped_before += len(names) - len(todo)
                if todo:
                    plan.append(({**spec, "group": group}, todo))
    if (args.compile_jobs > 1 or args.compile_only) and not args.no_cache:
        kinds = {c["name"]: c["kind"] for c in configs}
        jobs = [(spec, n) for spec, todo in plan for n in todo if kinds[n] in ("tvm", "rtask")]
        if jobs:
            end = deadline
            if deadline < float("inf"):
                end = start + args.compile_share * (deadline - start)
            runner.precompile(jobs, args.compile_jobs, end)
            done = recorded_keys(results, args.retry_failed)
    if args.compile_only:
        failed = [r for r in read_records(results) if r.get("type") == "result" and "error" in r]
        print("".join(describe_record(rec) + "\n" for rec in failed), end="")
        return 1 if failed else 0
    # Every model's TVM configurations first, then the peers (torch.compile takes minutes).
    plan.sort(key=lambda item: item[0]["group"] != "tvm")
    for spec, todo in plan:
        todo = [c for c in todo if record_key(target_kind, spec["model_id"], c) not in done]
        if todo:
            runner.run_group(spec, todo)
        write_summaries(results, plot_png=False)
    doc = write_summaries(results, plot_png=not args.no_plot)
    failures = sum(1 for m in doc["models"] for e in m["configs"].values() if "error" in e)
    print(f"results -> {results} (+ .json, .md{'' if args.no_plot else ', .png'})")
    if skipped_before:
        print(f"{skipped_before} configuration(s) were recorded by an earlier run and skipped")
    if runner.not_reached:
        print(f"NOT REACHED before the deadline ({len(runner.not_reached)}):")
        print("".join(f"  {item}\n" for item in runner.not_reached), end="")
    if failures:
        print(f"{failures} configuration(s) failed (see 'error' in the records)")
    return 1 if failures or runner.not_reached else 0


if __name__ == "__main__":
    sys.exit(main())
