"""The GPU timelines (issue 48): one traced call of each model's default build, where its time
goes, for a window's third command (docs/gpu.md).

    python -m bench gpu-timelines --out $OUT/timelines --deadline 240
    python -m bench gpu-timelines --out DIR --no-gpu --models zoo:lstm_tc:smoke   # dry run

Each model runs in its own process, cut at its share of the deadline: ``tvm_rtask.compile``
with ``trace=True`` (the default policy and barriers), warm-up calls, one traced call
(``runtime/trace.py``). Written per model: ``<model>.timeline.json`` (records and plan),
``<model>.gantt.png`` (measured) and ``<model>.simulated.png`` (the plan's simulation), and
one line of ``timelines.jsonl``: the breakdown's shares of vEU time (rTask bodies, waits,
idle, launch and join, gaps between rPrograms), the three largest of those that are not
bodies, and the operators with the most measured time. ``timelines.md`` tabulates them.
Without a GPU (``--no-gpu``, or none present) the same runs on llvm: a check of the flow.
``make gpu-pack`` compiles the traced builds into the pack's nvcc cache (``--compile-only``,
from ``gpu_window.prepare``), so that the window mostly loads them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import ROOT

MODELS = ["zoo:squeezenet", "zoo:nasnet_cifar", "zoo:inception_v3", "zoo:randwire",
          "zoo:resnext29", "real:resnet50", "real:mobilenet_v2"]  # fmt: skip
TARGET = {"kind": "cuda", "arch": "sm_90"}
WARMUP = 5
MAX_ROWS = 64  # vEU rows drawn per chart
LOSSES = ("waits", "idle", "launch_join", "gaps")


def load(spec: str):
    """``(onnx model, inputs)`` of ``real:NAME`` (torchvision's, full size) or a spec of
    ``bench.window_models.load_model`` (``zoo:NAME[:reduced|:smoke]``, ``light:NAME``)."""
    kind, name, *_ = spec.split(":")
    if kind == "real":
        from tvm_rtask.models.onnx_light import random_inputs
        from tvm_rtask.models.real import load_real_model

        model = load_real_model(name, size="full", seed=0)
        return model, random_inputs(model)
    from bench.window_models import load_model

    return load_model(spec)


def summarize(spec: str, timeline, top: int = 5) -> dict:
    """The record of one model's timeline: shares, the three largest losses, top operators."""
    breakdown = timeline.breakdown()
    share = breakdown["share"]
    losses = sorted(LOSSES, key=lambda k: -share[k])[:3]
    per_op: dict[str, float] = {}
    for (op, _), (_, a, b) in (
        item for st in timeline.timing().steps if st.program for item in st.program.spans.items()
    ):
        per_op[op] = per_op.get(op, 0.0) + (b - a)
    busiest = sorted(per_op.items(), key=lambda kv: -kv[1])[:top]
    return {
        "model": spec,
        "policy": timeline.plan.policy,
        "total_us": round(breakdown["total_us"], 1),
        "rprograms": len(breakdown["programs"]),
        "share": {k: round(v, 4) for k, v in share.items()},
        "largest_losses": [[k, round(share[k], 4)] for k in losses],
        "busiest_operators_us": [[op, round(us, 1)] for op, us in busiest],
        "dropped": timeline.dropped,
    }


def worker(spec: str, out: Path, gpu: bool) -> int:
    """One model: build traced, trace one call, write its files and its record."""
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.runtime.trace import trace_call
    from tvm_rtask.viz import gantt

    model, inputs = load(spec)
    target = tvm.target.Target(TARGET, host="llvm") if gpu else "llvm"
    dev = tvm.cuda(0) if gpu else tvm.cpu()
    started = time.perf_counter()
    ex, plan = tvm_rtask.compile_with_plan(tvm_rtask.frontend.load(model), target, trace=True)
    compile_s = time.perf_counter() - started
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(v, dev) for v in inputs.values()]
    timeline = trace_call(lambda: vm["main"](*args), plan, warmup=WARMUP)
    stem = spec.replace(":", "_")
    timeline.save(str(out / f"{stem}.timeline.json"))
    title = f"{spec}: {plan.policy}, {'H200' if gpu else 'llvm'}"
    rows = {"max_veus": MAX_ROWS}  # a GPU plan has hundreds of vEUs
    gantt(plan, str(out / f"{stem}.gantt.png"), title=title, timing=timeline.timing(), **rows)
    gantt(plan, str(out / f"{stem}.simulated.png"), title=f"{title} (simulated)", **rows)
    record = summarize(spec, timeline) | {"compile_s": round(compile_s, 1), "gpu": gpu}
    with open(out / "timelines.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
    return 0


def compile_only(spec: str) -> int:
    """The pack: the traced CUDA build of ``spec`` for sm_90 through nvcc and the cache."""
    import tvm_rtask

    model, _ = load(spec)
    tvm_rtask.compile(tvm_rtask.frontend.load(model), TARGET, trace=True)
    return 0


def markdown(records: list[dict]) -> str:
    rows = ["| model | policy | call us | rTask bodies | largest losses (share of vEU time) | "
            "busiest operators (us) |", "|---|---|---:|---:|---|---|"]  # fmt: skip
    for r in records:
        if "error" in r:
            rows.append(f"| {r['model']} | error: {r['error']} | | | | |")
            continue
        losses = ", ".join(f"{k} {v:.1%}" for k, v in r["largest_losses"])
        ops = ", ".join(f"{op} {us:.0f}" for op, us in r["busiest_operators_us"][:3])
        rows.append(f"| {r['model']} | {r['policy']} | {r['total_us']:.0f} | "
                    f"{r['share']['rtasks']:.1%} | {losses} | {ops} |")  # fmt: skip
    return "\n".join(rows) + "\n"


def run_all(models: list[str], out: Path, deadline: float, gpu: bool) -> list[dict]:
    """Each model in its own process, cut at its share of what is left of ``deadline``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "timelines.jsonl").unlink(missing_ok=True)
    end = time.time() + deadline
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    failures = []
    for k, spec in enumerate(models):
        budget = (end - time.time()) / (len(models) - k)
        if budget < 10:
            failures.append({"model": spec, "error": "not reached: no time left"})
            continue
        cmd = [sys.executable, "-m", "bench.gpu_timelines", "--worker", spec, "--out", str(out)]
        cmd += [] if gpu else ["--no-gpu"]
        log = out / f"{spec.replace(':', '_')}.log"
        with open(log, "w") as f:
            try:
                proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                      timeout=budget, cwd=str(ROOT))  # fmt: skip
                if proc.returncode:
                    error = f"exit {proc.returncode} ({log.name})"
                    failures.append({"model": spec, "error": error})
            except subprocess.TimeoutExpired:
                failures.append({"model": spec, "error": f"cut at {budget:.0f} s"})
        print(f"{spec}: done ({time.time() - end + deadline:.0f} s)", flush=True)
    path = out / "timelines.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    records += failures
    (out / "timelines.md").write_text(markdown(records))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--out", default=os.environ.get("OUT", "gpu-results") + "/timelines")
    add("--models", nargs="+", default=MODELS)
    add("--deadline", type=float, default=240.0, help="seconds for all models")
    add("--no-gpu", action="store_true", help="trace on llvm: the dry run")
    add("--worker", help=argparse.SUPPRESS)
    add("--compile-only", help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.compile_only:
        return compile_only(args.compile_only)
    import tvm

    gpu = not args.no_gpu and tvm.cuda(0).exist
    if args.worker:
        return worker(args.worker, Path(args.out), gpu)
    records = run_all(args.models, Path(args.out), args.deadline, gpu)
    print((Path(args.out) / "timelines.md").read_text())
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
