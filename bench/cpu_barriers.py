"""Fine against global barriers on the CPU: the same model's builds timed interleaved.

Usage::

    python bench/cpu_barriers.py --models mobilenet_v2 squeezenet1_1 resnet50
    python bench/cpu_barriers.py --models googlenet --builds wavefront/fine wavefront/global

Each ``policy/barrier`` build of a model (real models at ``--size``, light ones, ``.onnx``
files: ``tvm_rtask.testing.peers.load_model``) is compiled for ``--target`` with
``num_veu = --threads``, checked against ONNX Runtime's outputs (relative error < 1e-3;
ONNX Runtime's session is gone before timing starts), then all builds are called in
alternating blocks of ``--block`` calls for ``--rounds`` rounds, so that a noisy neighbour
slows every build alike. Prints and writes (``--json``) the median of each build.

This compares tvm-rtask's own builds with each other; for latencies against ONNX Runtime,
OpenVINO and PyTorch, each in its own process, use ``bench/cpu_peers.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import tvm
from tvm import relax

import tvm_rtask
from tvm_rtask.runtime import set_num_threads
from tvm_rtask.testing.onnx_light import onnxruntime_outputs, random_inputs, relative_error
from tvm_rtask.testing.peers import environment, load_model
from tvm_rtask.testing.run import run_executable

DEFAULT_BUILDS = ["wavefront/fine", "wavefront/global", "sequential/fine"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2", "squeezenet1_1"])
    parser.add_argument("--builds", nargs="+", default=DEFAULT_BUILDS, help="policy/barrier")
    parser.add_argument("--size", default="full", choices=["full", "reduced"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", default="llvm-native")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the results here")
    return parser.parse_args(argv)


def measure(name: str, args: argparse.Namespace) -> dict:
    model = load_model(name, seed=args.seed, size=args.size)
    feed = random_inputs(model, args.seed)
    (expected, *_) = onnxruntime_outputs(model, feed)
    mod = tvm_rtask.frontend.load(model)
    tensors = [tvm.runtime.tensor(v) for v in feed.values()]
    calls, record = {}, {"model": name, "builds": {}}
    for build in args.builds:
        policy, barrier = build.split("/")
        start = time.perf_counter()
        ex = tvm_rtask.compile(
            mod, args.target, policy=policy, barrier=barrier, num_veu=args.threads
        )
        compile_s = time.perf_counter() - start
        error = relative_error(run_executable(ex, feed)[0], expected)
        if not error < 1e-3:
            raise SystemExit(f"{name} {build}: relative error {error:.3g} against ONNX Runtime")
        main = relax.VirtualMachine(ex, tvm.cpu())["main"]
        for _ in range(3):
            main(*tensors)
        calls[build] = main
        record["builds"][build] = {"compile_s": round(compile_s, 1), "rel_error": error}
    samples = {b: [] for b in calls}
    for _ in range(args.rounds):
        for build, main in calls.items():
            for _ in range(args.block):
                start = time.perf_counter()
                main(*tensors)
                samples[build].append((time.perf_counter() - start) * 1e3)
    for build, ms in samples.items():
        record["builds"][build]["median_ms"] = float(np.median(ms))
        record["builds"][build]["calls"] = len(ms)
    return record


def main(argv=None) -> int:
    args = parse_args(argv)
    set_num_threads(args.threads)
    command = "python bench/cpu_barriers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results = {"environment": environment(args.threads, args.target, command), "models": []}
    for name in args.models:
        record = measure(name, args)
        results["models"].append(record)
        cells = " ".join(f"{b}={r['median_ms']:.2f}" for b, r in record["builds"].items())
        print(f"{name}: {cells} (ms, median)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
