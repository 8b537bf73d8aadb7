"""CPU latency: TVM's default build vs rtask sequential vs rtask wavefront, in one process.

Usage: python bench/cpu_latency.py [--models squeezenet inception_v1] [--threads 2]
       [--repeat 20] [--target llvm-native] [--json out.json]

Every configuration runs the same ONNX model (the onnx package's light architectures with
seeded random weights) on the same input; each is checked against ONNX Runtime before it is
timed. Prints the median, p10 and p90 of ``--repeat`` runs after warm-up, and ratios to TVM's
default build (``tvm.compile`` of the imported module: legalized, unfused, serial loops).
Every configuration, TVM's default build included, is compiled for the same ``--target``:
by default ``llvm-native``, LLVM for this machine's CPU (``llvm`` is a generic x86-64, SSE2).

All configurations share one process (and TVM's thread pool): this compares TVM builds with
each other. For latencies to compare with ONNX Runtime, OpenVINO or PyTorch, each runtime in
its own process at its best, use ``bench/cpu_peers.py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import tvm
from tvm import relax

import tvm_rtask
from tvm_rtask.backend import as_target
from tvm_rtask.runtime import set_num_threads
from tvm_rtask.testing.onnx_light import (
    load_light_model,
    onnxruntime_outputs,
    random_inputs,
    relative_error,
)


def _outputs(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [r.numpy() for r in result]


def _time(vm, args, warmup: int, repeat: int) -> dict:
    for _ in range(warmup):
        vm["main"](*args)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        vm["main"](*args)
        samples.append((time.perf_counter() - start) * 1e3)
    p10, p50, p90 = np.percentile(samples, [10, 50, 90])
    return {"median_ms": float(p50), "p10_ms": float(p10), "p90_ms": float(p90)}


def _configs(threads: int, target):
    yield "tvm_default", lambda mod: tvm.compile(mod, target=target)
    for policy in ("sequential", "wavefront"):
        for barrier in ("fine", "global"):
            yield (
                f"rtask_{policy}_{barrier}",
                lambda mod, p=policy, b=barrier: tvm_rtask.compile(
                    mod, target, policy=p, barrier=b, num_veu=threads
                ),
            )


def bench_model(name: str, threads: int, warmup: int, repeat: int, target="llvm") -> dict:
    model = load_light_model(name)
    inputs = random_inputs(model)
    reference = onnxruntime_outputs(model, inputs)
    mod = tvm_rtask.frontend.load(model)
    args = [tvm.runtime.tensor(v) for v in inputs.values()]
    result = {"name": name, "batch": 1, "configs": {}}
    for config, build in _configs(threads, target):
        start = time.perf_counter()
        ex = build(mod)
        compile_s = time.perf_counter() - start
        set_num_threads(threads)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        error = max(
            relative_error(a, b)
            for a, b in zip(_outputs(vm["main"](*args)), reference, strict=True)
        )
        if error > 1e-4:
            raise RuntimeError(f"{name} {config}: relative error {error:.2e} against ONNX Runtime")
        stats = _time(vm, args, warmup, repeat)
        stats.update(compile_s=round(compile_s, 2), rel_error=error)
        result["configs"][config] = stats
        print(
            f"{name:14s} {config:26s} median {stats['median_ms']:9.2f} ms "
            f"(p10 {stats['p10_ms']:.2f}, p90 {stats['p90_ms']:.2f}) compile {compile_s:.1f} s",
            flush=True,
        )
    plan = tvm_rtask.plan(mod, target, policy="wavefront", num_veu=threads)
    result["wavefront_report"] = plan.report()
    base = result["configs"]["tvm_default"]["median_ms"]
    for stats in result["configs"].values():
        stats["ratio_to_tvm_default"] = stats["median_ms"] / base
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["squeezenet", "inception_v1"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--target",
        default="llvm-native",
        help="target of every configuration, TVM's default build included (default "
        "llvm-native: this machine's CPU; llvm: generic x86-64, SSE2; or a JSON dict)",
    )
    args = parser.parse_args()
    target = as_target(json.loads(args.target) if args.target.startswith("{") else args.target)
    print(f"target {target} for every configuration, TVM's default build included")
    set_num_threads(args.threads)
    results = {
        "device": f"cpu ({platform.processor() or platform.machine()}), {args.threads} threads",
        "target": str(target),
        "versions": {"tvm": tvm.__version__, "tvm_rtask": tvm_rtask.__version__},
        "models": [
            bench_model(m, args.threads, args.warmup, args.repeat, target) for m in args.models
        ],
    }
    print("\nratios to TVM's default build (median latency; < 1 is faster):")
    for model in results["models"]:
        ratios = ", ".join(
            f"{c} {s['ratio_to_tvm_default']:.3f}" for c, s in model["configs"].items()
        )
        print(f"  {model['name']}: {ratios}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
