"""The default policy against the better of sequential and wavefront, model by model (issues
48 and 50: the default within 3% of the better policy measured by hand).

    python -m bench policy-choice --models resnet18 googlenet --threads 2 --seconds 20

Each model runs in a fresh process with ``--threads`` worker threads and as many vEUs. There
the three builds (``sequential``, ``wavefront`` and the default, whatever
``tvm_rtask.compile`` picks without a ``policy``) are timed *interleaved*: round after round,
one call of each, in a rotating order, so that what the machine does meanwhile and what the
process's memory layout costs fall on all three alike. Runs of separate processes differ by
5-10% on this machine (a policy's separate-process median moved that much from run to run),
more than the 3% being checked; interleaving in one process removes that. Reported: each
build's median, the policy the default chose (``Plan.report()["policy_choice"]``) and the
default's median over the better of the other two. Numerics are ``bench peers``' and the
test suite's business, not this file's.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench import RESULTS
from bench.peers import (
    DEFAULT_TARGET,
    environment,
    load_average,
    load_model,
    stats,
    worker_env,
    write_results,
)
from tvm_rtask.models.onnx_light import random_inputs

PUBLIC_SET = [
    "resnet18", "resnet50", "resnext50_32x4d", "mobilenet_v2", "mobilenet_v3_small",
    "efficientnet_b0", "regnet_y_400mf", "shufflenet_v2_x1_0", "squeezenet1_1", "densenet121",
    "googlenet", "inception_v3", "mnasnet0_5", "convnext_tiny", "vit_b_16",
]  # fmt: skip
BUILDS = ("sequential", "wavefront", "default")
WITHIN = 1.03  # the issues' bound: the default at most 3% over the better policy
WARMUP = 3
MIN_ROUNDS = 10


def run_model(name: str, threads: int, target: str, seconds: float, size: str) -> dict:
    """In this process: the three builds of ``name``, timed interleaved."""
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.runtime.policy_trial import interleaved_samples

    model = load_model(name, size=size)
    mod = tvm_rtask.frontend.load(model)
    args = [tvm.runtime.tensor(v) for v in random_inputs(model).values()]
    calls, record = {}, {"model": name, "builds": {}}
    for build in BUILDS:
        policy = {} if build == "default" else {"policy": build}
        start = time.perf_counter()
        ex, plan = tvm_rtask.compile_with_plan(mod, target, num_veu=threads, **policy)
        compile_s = time.perf_counter() - start
        main = relax.VirtualMachine(ex, tvm.cpu())["main"]
        calls[build] = main
        entry = {"policy": plan.policy, "compile_s": round(compile_s, 2)}
        if build == "default":
            entry["choice"] = plan.report().get("policy_choice")
        record["builds"][build] = entry
    runs = {build: (lambda call=call: call(*args)) for build, call in calls.items()}
    samples = interleaved_samples(runs, lambda: None, WARMUP, MIN_ROUNDS, seconds)
    for build in BUILDS:
        record["builds"][build].update(stats(samples[build]))
    ms = {b: record["builds"][b]["median_ms"] for b in BUILDS}
    better = min(("sequential", "wavefront"), key=ms.get)
    record.update(better=better, default_over_better=round(ms["default"] / ms[better], 4))
    return record


def run_in_process(name: str, args: argparse.Namespace) -> dict:
    """:func:`run_model` in a fresh process with every thread pool sized to ``--threads``."""
    cmd = [sys.executable, "-m", "bench.policy_choice", "--worker", name,
           "--threads", str(args.threads), "--target", args.target,
           "--seconds", str(args.seconds), "--size", args.size]  # fmt: skip
    proc = subprocess.run(cmd, env=worker_env(args.threads), capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return {"model": name, "error": f"worker exited {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def markdown(results: dict, source: str) -> str:
    threads = results["threads"]
    head = (f"{results['cpu']} ({results.get('target_label', results['target'])}), {threads} "
            f"thread{'s' if threads > 1 else ''} and as many vEUs, batch 1, {results['size']} "
            f"size; the three builds of a model timed interleaved in one fresh process for "
            f"{results['seconds']:g} s; "
            f"`{results['command']}` (commit {results['commit']}). Medians in ms (interleaved "
            f"calls start on caches the other builds used: absolute times run higher than "
            f"back-to-back calls of one build). From `{source}`.")  # fmt: skip
    rows = ["| model | sequential | wavefront | default | default chose | default / better |",
            "|---|---:|---:|---:|---|---:|"]  # fmt: skip
    ratios = []
    for rec in results["records"]:
        if "error" in rec:
            rows.append(f"| {rec['model']} | error: {rec['error']} | | | | |")
            continue
        b = rec["builds"]
        ratios.append(rec["default_over_better"])
        rows.append(f"| {rec['model']} | {b['sequential']['median_ms']:.2f} | "
                    f"{b['wavefront']['median_ms']:.2f} | {b['default']['median_ms']:.2f} | "
                    f"{b['default']['policy']} | {rec['default_over_better']:.3f}x |")  # fmt: skip
    over = [r["model"] for r in results["records"] if r.get("default_over_better", 0) > WITHIN]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    tail = (f"Default over the better policy: geometric mean {geo:.3f}x, worst "
            f"{max(ratios, default=float('nan')):.3f}x; more than {WITHIN:.2f}x: "
            f"{', '.join(over) or 'none'}.")  # fmt: skip
    return "\n".join([head, "", *rows, "", tail])


def _target_label(target: str) -> str:
    """``llvm, mcpu rocketlake``: which CPU the code was made for (the CPU's name alone does
    not say: ``Intel(R) Xeon(R) Processor`` on several generations)."""
    from bench.peers import target_label
    from tvm_rtask.backend import as_target

    return target_label(as_target(target))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--models", nargs="+", default=PUBLIC_SET, help="default: torchvision's 15")
    add("--threads", type=int, default=2, help="worker threads, and vEUs")
    add("--target", default=DEFAULT_TARGET)
    add("--seconds", type=float, default=20.0, help="of interleaved calls per model")
    add("--size", default="full", help="of the real models: full or reduced")
    add("--json", help="results file (default under bench/results/)")
    add("--worker", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_model(args.worker, args.threads, args.target, args.seconds,
                                   args.size)))  # fmt: skip
        return 0
    command = shlex.join(["python", "-m", "bench", "policy-choice", *argv])
    results = environment(args.threads, args.target, command)
    results.update(target_label=_target_label(args.target))
    results.update(size=args.size, seconds=args.seconds, records=[])
    for name in args.models:
        record = run_in_process(name, args)
        results["records"].append(record)
        line = record.get("error") or (
            ", ".join(f"{b} {record['builds'][b]['median_ms']:.2f} ms" for b in BUILDS)
            + f"; default chose {record['builds']['default']['policy']}, "
            f"{record['default_over_better']:.3f}x the better"
        )
        print(f"{name}: {line}", flush=True)
    results["load_average_end"] = load_average()
    stamp = time.strftime("%Y-%m-%d")
    path = Path(args.json or RESULTS / f"{stamp}-cpu-policy-choice-{args.threads}t.json")
    write_results(path, results, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
