"""Where a whole model's time goes on the CPU, operator by operator, inside the model: ONNX
Runtime's own node profile against tvm-rtask's calls, each runtime in its own process.

Usage: python bench/cpu_model_profile.py --model resnet50 [--size full] [--threads 2]
       [--calls 30] [--top 25] [--markdown out.md]

Why not ``bench/cpu_ops.py``: operators timed alone run on warm caches and, for ONNX
Runtime, behind a session call of their own; in the model both differ. SqueezeNet's 1x1
``128 -> 16`` at 55x55 took 50 us alone and 190 us in the model, while ONNX Runtime's one-node
models added 20-40 us of call overhead to every small operator (docs/kernel-quality.md,
fourth session). Here:

- ONNX Runtime runs the model with ``enable_profiling`` (sequential execution,
  ``ORT_ENABLE_ALL``, ``--threads`` intra-op threads): the median ``kernel_time`` of each
  node over ``--calls`` calls. Its node shapes are those after its own graph rewrites (NCHWc
  blocks of 8 or 16 channels, ``ReorderInput`` / ``ReorderOutput`` at the edges).
- tvm-rtask compiles the model with ``policy="sequential"``, so that every operator is one
  rProgram and one call of the Relax VM, and times each call with ``vm.set_instrument``:
  the median per call times the calls per model run. The instrument adds a Python callback
  per call (about 2 us, most visible on ``vm.builtin.alloc_tensor``).

Rows are sorted by time per model run; the two lists are not joined (the shapes differ).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _model(name: str, size: str):
    from tvm_rtask.models.real import load_real_model

    return load_real_model(name, size=size, seed=0)


def _input(model):
    import numpy as np

    dims = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(0).standard_normal(dims).astype("float32")


def profile_onnxruntime(name: str, size: str, threads: int, calls: int) -> dict:
    import onnxruntime as ort

    model = _model(name, size)
    x = _input(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feed = {session.get_inputs()[0].name: x}
        for _ in range(calls):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    times, info = collections.defaultdict(list), {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"][: -len("_kernel_time")]
            times[node].append(e["dur"])
            args = e.get("args", {})
            shapes = [next(iter(s.values())) for s in args.get("input_type_shape", [])]
            info[node] = (args.get("op_name", "?"), shapes[:2])
    warm = max(1, calls // 5)
    rows = [
        {"us": statistics.median(v[warm:] or v), "name": info[n][0], "shapes": info[n][1]}
        for n, v in times.items()
    ]
    return {"runtime": "onnxruntime", "rows": rows}


def profile_rtask(name: str, size: str, threads: int, calls: int) -> dict:
    import numpy as np
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.backend import as_target

    model = _model(name, size)
    x = tvm.runtime.tensor(_input(model))
    ex, plan = tvm_rtask.compile_with_plan(
        tvm_rtask.frontend.load(model), as_target("llvm-native"), policy="sequential"
    )
    names = {f"rprogram_{i}": ",".join(p.ops()) for i, p in enumerate(plan.programs())}
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(5):
        vm["main"](x)
    spans, started = collections.defaultdict(list), {}

    def instrument(func, call_name, before_run, ret_value, *args):
        if before_run:
            started[call_name] = time.perf_counter()
        else:
            spans[call_name].append(time.perf_counter() - started[call_name])
        return 0

    vm.set_instrument(instrument)
    for _ in range(calls):
        vm["main"](x)
    rows = [
        {
            "us": float(np.median(v)) * 1e6 * len(v) / calls,
            "name": names.get(k, k),
            "calls": len(v) // calls,
        }
        for k, v in spans.items()
    ]
    return {"runtime": "tvm-rtask sequential", "rows": rows}


def _child(args, runtime: str) -> dict:
    """One runtime in a fresh process (no other runtime's threads alive in it)."""
    env = dict(os.environ, TVM_NUM_THREADS=str(args.threads))
    cmd = [
        sys.executable,
        __file__,
        "--model",
        args.model,
        "--size",
        args.size,
        "--threads",
        str(args.threads),
        "--calls",
        str(args.calls),
        "--child",
        runtime,
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(model: str, results: list[dict], top: int, threads: int) -> str:
    lines = [
        f"# {model}: time per operator inside the model ({threads} threads)",
        "",
        f"Command: `python bench/cpu_model_profile.py {' '.join(sys.argv[1:])}`",
        "",
    ]
    for result in results:
        rows = sorted(result["rows"], key=lambda r: -r["us"])
        total = sum(r["us"] for r in rows)
        lines += [f"## {result['runtime']}: {total / 1000:.2f} ms in {len(rows)} rows", ""]
        lines += ["| us per run | operator | detail |", "|---:|---|---|"]
        for r in rows[:top]:
            detail = r.get("shapes") or f"x{r.get('calls', 1)}"
            lines.append(f"| {r['us']:.1f} | {r['name'][:60]} | {detail} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a real (torchvision) model name")
    parser.add_argument("--size", default="full")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--markdown", help="write the tables here too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run = profile_onnxruntime if args.child == "onnxruntime" else profile_rtask
        print(json.dumps(run(args.model, args.size, args.threads, args.calls)))
        return
    results = [_child(args, runtime) for runtime in ("onnxruntime", "rtask")]
    text = markdown(args.model, results, args.top, args.threads)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
