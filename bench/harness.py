"""Benchmark harness: every configuration of every model, one process per model.

Usage::

    python bench/harness.py --smoke                 # CI: tiny reduced models, few repeats, CPU
    python bench/harness.py                         # CPU, the full zoo (long)
    python bench/harness.py --gpu                   # the GPU machine: target cuda
    python bench/harness.py --models lstm_tc seq2seq --batch 1 4 --repeat 50
    tvm-rtask bench --smoke                         # the same, through the CLI

For each model a worker process (``--worker``) imports the model once and, in that process,
compiles each configuration, checks its outputs against ONNX Runtime (relative error
< 1e-4; a configuration that disagrees is recorded with its error and not timed), warms up
and times ``--repeat`` calls. Configurations:

=====================  =====================================================================
``tvm_default``        ``tvm.compile`` of the imported module (TVM's default build)
``tvm_cuda_graph``     the same with ``relax.backend.use_cuda_graph`` (cuda only)
``sequential``         tvm-rtask, policy sequential ("RammerBase"), fine barriers
``wavefront_fine``     tvm-rtask, Rammer's wavefront policy, fine (step-array) barriers
``wavefront_global``   tvm-rtask, wavefront policy, global barriers between waves
``<policy>``           every other registered policy (``ios``, ``opara``, ...), fine barriers;
                       a policy whose name is taken above gets ``_policy`` appended
``onnxruntime``        ONNX Runtime (CPU, or CUDA provider with ``--gpu``) if installed
``torch_eager``        PyTorch eager, if torch and onnx2torch are installed
``torch_compile``      ``torch.compile`` of the same, likewise
=====================  =====================================================================

Results go to ``<out-dir>/<date>-<device>.json`` shaped ``{"device", "versions", "models":
[{"name", "batch", "configs": {name: {"median_ms", "p10_ms", "p90_ms", ...}}}]}`` (a config
that failed has ``"error"`` instead of times; ``"skipped"`` lists peers that are not
installed) and to a PNG of the medians beside it (``bench/plot.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results"
TOLERANCE = 1e-4

# --smoke: tiny reduced models (a few seconds to compile each configuration).
SMOKE_MODELS = {
    "lstm_tc": {"layers": 2, "steps": 2, "hidden": 8},
    "bert_layer": {"seq": 4, "hidden": 8, "heads": 2, "intermediate": 16},
}
CPU_MODELS = [
    "lstm_tc",
    "seq2seq",
    "deepspeech2",
    "bert_layer",
    "alexnet",
    "squeezenet",
    "resnext29",
    "randwire",
    "inception_v3",
    "nasnet_cifar",
]


# -- configurations ---------------------------------------------------------------------------
def configurations(target_kind: str) -> list[dict]:
    """Each configuration: ``{"name", "kind": tvm|rtask|peer, "policy", "barrier", ...}``."""
    from tvm_rtask.schedule import policy_names

    policies = policy_names()
    configs = [{"name": "tvm_default", "kind": "tvm"}]
    if target_kind == "cuda":
        configs.append({"name": "tvm_cuda_graph", "kind": "tvm", "cuda_graph": True})
    taken = {c["name"] for c in configs}
    rtask = []
    if "sequential" in policies:
        rtask.append(("sequential", "sequential", "fine"))
    if "wavefront" in policies:
        rtask += [
            ("wavefront_fine", "wavefront", "fine"),
            ("wavefront_global", "wavefront", "global"),
        ]
    taken |= {name for name, _, _ in rtask}
    for policy in policies:
        if policy in ("sequential", "wavefront"):
            continue
        name = policy if policy not in taken else f"{policy}_policy"
        rtask.append((name, policy, "fine"))
        taken.add(name)
    configs += [{"name": n, "kind": "rtask", "policy": p, "barrier": b} for n, p, b in rtask]
    configs += [
        {"name": "onnxruntime", "kind": "peer"},
        {"name": "torch_eager", "kind": "peer"},
        {"name": "torch_compile", "kind": "peer"},
    ]
    return configs


def _stats(samples_ms: list[float]) -> dict:
    p10, p50, p90 = np.percentile(samples_ms, [10, 50, 90])
    return {
        "median_ms": float(p50),
        "p10_ms": float(p10),
        "p90_ms": float(p90),
        "mean_ms": float(np.mean(samples_ms)),
        "repeat": len(samples_ms),
    }


def _time(fn, warmup: int, repeat: int, sync=None) -> dict:
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return _stats(samples)


def _flatten(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    if isinstance(result, (list, tuple)):
        out = []
        for r in result:
            out.extend(_flatten(r))
        return out
    if hasattr(result, "detach"):  # torch tensor
        return [result.detach().cpu().numpy()]
    return [np.asarray(result)]


def _max_error(actual, expected) -> float:
    from tvm_rtask.testing.onnx_light import relative_error

    if len(actual) != len(expected):
        return float("inf")
    return max(relative_error(a, e) for a, e in zip(actual, expected, strict=True))


# -- one configuration ------------------------------------------------------------------------
def _tvm_runner(config, mod, target, inputs, threads):
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.runtime import set_num_threads

    start = time.perf_counter()
    if config["kind"] == "rtask":
        kw = {"num_veu": threads} if target.kind.name == "llvm" else {}
        ex = tvm_rtask.compile(
            mod, target, policy=config["policy"], barrier=config["barrier"], **kw
        )
    elif config.get("cuda_graph"):
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            ex = tvm.compile(mod, target=target)
    else:
        ex = tvm.compile(mod, target=target)
    compile_s = time.perf_counter() - start
    if target.kind.name == "llvm":
        set_num_threads(threads)
        dev = tvm.cpu()
    else:
        dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(v, dev) for v in inputs.values()]
    return (
        (lambda: vm["main"](*args)),
        compile_s,
        (dev.sync if target.kind.name == "cuda" else None),
    )


def _onnxruntime_runner(model, inputs, gpu: bool, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    providers = ["CUDAExecutionProvider"] if gpu else ["CPUExecutionProvider"]
    if gpu and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError("onnxruntime has no CUDAExecutionProvider here")
    start = time.perf_counter()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    return (lambda: session.run(None, inputs)), time.perf_counter() - start, None


def _torch_runner(model, inputs, gpu: bool, compiled: bool, threads: int):
    import torch
    from onnx2torch import convert

    torch.set_num_threads(threads)
    device = "cuda" if gpu else "cpu"
    start = time.perf_counter()
    module = convert(model).eval().to(device)
    if compiled:
        module = torch.compile(module)
    args = [torch.from_numpy(v).to(device) for v in inputs.values()]

    def call():
        with torch.no_grad():
            return module(*args)

    call()  # torch.compile compiles on the first call
    sync = torch.cuda.synchronize if gpu else None
    return call, time.perf_counter() - start, sync


def _peer_missing(name: str) -> str | None:
    import importlib.util

    needs = {"onnxruntime": ["onnxruntime"], "torch_eager": ["torch", "onnx2torch"]}
    needs["torch_compile"] = needs["torch_eager"]
    missing = [m for m in needs[name] if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def bench_model(
    name: str,
    batch: int,
    reduced: bool,
    overrides: dict,
    target_kind: str,
    threads: int,
    warmup: int,
    repeat: int,
    only: list[str] | None = None,
) -> dict:
    """All configurations of one model in this process."""
    import tvm_rtask.models as zoo
    from tvm_rtask import frontend
    from tvm_rtask.relax_passes import as_target
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs

    model = zoo.onnx_model(name, batch=batch, reduced=reduced, **overrides)
    inputs = zoo.sample_inputs(model)
    reference = onnxruntime_outputs(model, inputs)
    mod = frontend.load(model)
    target = as_target(target_kind)
    gpu = target_kind == "cuda"
    result = {
        "name": name,
        "batch": batch,
        "reduced": reduced,
        "overrides": overrides,
        "configs": {},
        "skipped": {},
    }
    try:
        import tvm_rtask

        policy = "wavefront"
        kw = {"num_veu": threads} if not gpu else {}
        result["wavefront_report"] = tvm_rtask.plan(mod, target, policy=policy, **kw).report()
    except Exception as err:  # the plan is informative; a failure is recorded, not fatal
        result["wavefront_report"] = {"error": _one_line(err)}
    for config in configurations(target_kind):
        cname = config["name"]
        if only and cname not in only:
            continue
        entry = {k: v for k, v in config.items() if k in ("kind", "policy", "barrier")}
        if config["kind"] == "peer":
            why = _peer_missing(cname)
            if why:
                result["skipped"][cname] = why
                continue
        try:
            if config["kind"] == "peer" and cname == "onnxruntime":
                fn, compile_s, sync = _onnxruntime_runner(model, inputs, gpu, threads)
            elif config["kind"] == "peer":
                compiled = cname == "torch_compile"
                fn, compile_s, sync = _torch_runner(model, inputs, gpu, compiled, threads)
            else:
                fn, compile_s, sync = _tvm_runner(config, mod, target, inputs, threads)
            error = _max_error(_flatten(fn()), reference)
            entry.update(compile_s=round(compile_s, 3), rel_error=error)
            if not error < TOLERANCE:
                entry["error"] = f"relative error {error:.3g} against ONNX Runtime"
            else:
                entry.update(_time(fn, warmup, repeat, sync))
        except Exception as err:
            entry["error"] = _one_line(err)
            if os.environ.get("TVM_RTASK_DEBUG"):
                traceback.print_exc()
        result["configs"][cname] = entry
        shown = (
            f"median {entry['median_ms']:9.3f} ms (p10 {entry['p10_ms']:.3f}, "
            f"p90 {entry['p90_ms']:.3f})"
            if "median_ms" in entry
            else f"FAILED: {entry['error']}"
        )
        print(f"{name:14s} b{batch:<3d} {cname:22s} {shown}", flush=True)
    base = result["configs"].get("tvm_default", {}).get("median_ms")
    if base:
        for entry in result["configs"].values():
            if "median_ms" in entry:
                entry["ratio_to_tvm_default"] = entry["median_ms"] / base
    return result


def _one_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = (lines[-1] if lines and lines[0].startswith("Traceback") else lines[0]) if lines else ""
    return f"{type(err).__name__}: {text}"[:500]


# -- driver -----------------------------------------------------------------------------------
def device_name(target_kind: str, threads: int) -> str:
    if target_kind == "cuda":
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
        return "cuda"
    from tvm_rtask.runtime.profiler import cpu_model_name

    return f"{cpu_model_name()}, {threads} threads"


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in (
        "apache-tvm",
        "apache-tvm-ffi",
        "tvm-rtask",
        "onnx",
        "onnxruntime",
        "torch",
        "onnx2torch",
        "numpy",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "device"


def run_worker(args) -> int:
    overrides = json.loads(args.overrides or "{}")
    only = args.configs or None
    results = [
        bench_model(
            args.worker,
            b,
            args.reduced,
            overrides,
            args.target,
            args.threads,
            args.warmup,
            args.repeat,
            only,
        )
        for b in args.batch
    ]
    with open(args.json, "w") as f:
        json.dump(results, f)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="CI: tiny models, few repeats")
    mode.add_argument("--gpu", action="store_true", help="target cuda (the GPU machine)")
    parser.add_argument("--models", nargs="+", help="zoo models (default: all, or the smoke set)")
    parser.add_argument("--batch", nargs="+", type=int, default=[1], help="batch sizes")
    parser.add_argument("--reduced", action="store_true", help="the zoo's reduced variants")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads = vEUs")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--configs", nargs="+", help="only these configurations")
    parser.add_argument("--out-dir", default=str(DEFAULT_OUT), help="where results go")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per model process")
    # Internal: one model in this process.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--target", default="llvm", help=argparse.SUPPRESS)
    parser.add_argument("--overrides", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    args.threads = args.threads or min(os.cpu_count() or 1, 2 if args.smoke else 64)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 5)
    args.repeat = args.repeat or (3 if args.smoke else 50)
    if args.worker:
        return run_worker(args)

    target_kind = "cuda" if args.gpu else "llvm"
    if args.smoke:
        models = [(m, SMOKE_MODELS.get(m, {})) for m in (args.models or SMOKE_MODELS)]
        reduced = True
    else:
        models = [(m, {}) for m in (args.models or CPU_MODELS)]
        reduced = args.reduced
    import tvm_rtask.models as zoo

    unknown = [m for m, _ in models if m not in zoo.names()]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; the zoo has {', '.join(zoo.names())}")
    device = device_name(target_kind, args.threads)
    doc = {
        "device": device,
        "target": target_kind,
        "mode": "smoke" if args.smoke else ("gpu" if args.gpu else "cpu"),
        "threads": args.threads,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "versions": versions(),
        "warmup": args.warmup,
        "repeat": args.repeat,
        "models": [],
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.date.today().isoformat()}-{_slug(device)}"
    out = out_dir / f"{stem}.json"
    failures = 0
    for name, overrides in models:
        with tempfile.TemporaryDirectory() as tmp:
            part = os.path.join(tmp, "result.json")
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                name,
                "--target",
                target_kind,
                "--threads",
                str(args.threads),
                "--warmup",
                str(args.warmup),
                "--repeat",
                str(args.repeat),
                "--overrides",
                json.dumps(overrides),
                "--json",
                part,
                "--batch",
                *map(str, args.batch),
            ]
            if reduced:
                cmd.append("--reduced")
            if args.configs:
                cmd += ["--configs", *args.configs]
            try:
                proc = subprocess.run(cmd, timeout=args.timeout)
                ok = proc.returncode == 0 and os.path.exists(part)
                why = f"worker exited with status {proc.returncode}"
            except subprocess.TimeoutExpired:
                ok, why = False, f"worker timed out after {args.timeout} s"
            if ok:
                with open(part) as f:
                    doc["models"].extend(json.load(f))
            else:
                failures += 1
                for b in args.batch:
                    doc["models"].append({"name": name, "batch": b, "configs": {}, "error": why})
                print(f"{name}: {why}", file=sys.stderr, flush=True)
        with open(out, "w") as f:  # after every model, so a long run keeps what it has
            json.dump(doc, f, indent=1)
    print(f"results -> {out}")
    if not args.no_plot:
        sys.path.insert(0, str(HERE))
        from plot import plot_results

        png = plot_results(doc, out.with_suffix(".png"))
        print(f"plot -> {png}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
