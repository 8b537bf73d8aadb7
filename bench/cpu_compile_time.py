"""CPU compile time: TVM's default build against tvm-rtask (wavefront, sequential), per model.

Usage: python -m bench compile [--size full|reduced] [--models resnet18 ...]
       [--light inception_v1 ...] [--modes tvm wavefront sequential] [--target llvm-native]
       [--timeout 1800] [--out bench/results] [--tag NAME] [--ready] [--build-jobs auto|N]
       [--repeat 3]

Each (model, mode) compiles in a fresh subprocess, ``--repeat`` times with the modes
interleaved; every number is the median of the repeats (each run kept in the JSON, ``runs``).
Per run: wall and CPU time of the compile call (``tvm.compile`` or ``tvm_rtask.compile``), the
build processes tvm-rtask forks included (the one-time import of ``tvm_rtask.api`` apart, as
``import_cpu_s``), and each tvm-rtask stage's wall time from the progress log; ratios to TVM.
``--ready`` also times the VM's creation (where the JIT makes the machine code: ``ready_s`` =
compile wall + VM creation), a first call and a second. The machine load before and after is
recorded. Models: ``tvm_rtask.models.real`` (all by default, ``--size``) and the onnx light
models named with ``--light``. Writes ``<date>-cpu-compile-time[-<tag>].json/.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(__file__), "..")
MODES = ("tvm", "wavefront", "sequential")
STAGE = re.compile(r"tvm_rtask INFO: (prepare/fuse|plan|lower|build) done in ([\d.]+) s")

CHILD = r"""
import json, os, resource, sys, time
kind, name, size, mode, target, ready, jobs = sys.argv[1:8]
ready = ready == "1"
options = {} if jobs == "auto" else {"cpu_build_jobs": int(jobs)}
import tvm, tvm_rtask
from tvm_rtask import frontend, progress
from tvm_rtask.backend import as_target
progress.enable()
if kind == "light":
    from tvm_rtask.testing.onnx_light import load_light_model
    model = load_light_model(name)
else:
    from tvm_rtask.models.real import load_real_model
    model = load_real_model(name, size=size, seed=0)
mod = frontend.load(model)
target = as_target(target)
# tvm_rtask.compile imports the pipeline on first use (tvm_rtask.api: Relax passes, scipy):
# a once-per-process cost, timed apart
imported = time.process_time()
import tvm_rtask.api  # noqa: F401
imported = time.process_time() - imported
def cpu_s():
    # this process and the build processes it forked and waited for
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
wall, cpu = time.perf_counter(), cpu_s()
if mode == "tvm":
    ex = tvm.compile(mod, target=target)
else:
    ex = tvm_rtask.compile(mod, target, policy=mode, **options)
wall, cpu = time.perf_counter() - wall, cpu_s() - cpu
result = {"wall_s": wall, "cpu_s": cpu, "import_cpu_s": imported}
if ready:
    # the JIT makes the machine code when the VM is created (it resolves the functions):
    # the model is ready after it. The first call's extra over a second is kept apart
    # (a 60 s inference, TVM's ViT-B/16, varies by more than a compile takes)
    from tvm import relax
    from tvm_rtask.testing.onnx_light import random_inputs
    x = [tvm.runtime.tensor(a) for a in random_inputs(model, seed=1).values()]
    created = time.perf_counter()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    created = time.perf_counter() - created
    first = time.perf_counter()
    vm["main"](*x)
    first = time.perf_counter() - first
    second = time.perf_counter()
    vm["main"](*x)
    result.update(vm_s=created, first_call_s=first, second_call_s=time.perf_counter() - second)
print("RESULT " + json.dumps(result), flush=True)
"""


def run_one(kind: str, name: str, size: str, mode: str, target: str, timeout: float,
            ready: bool, jobs: str = "auto") -> dict:  # fmt: skip
    before = os.times()
    start = time.perf_counter()
    cmd = [sys.executable, "-c", CHILD, kind, name, size, mode, target, str(int(ready)), jobs]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    after = os.times()
    row: dict = {"process_wall_s": time.perf_counter() - start}
    row["process_cpu_s"] = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    out = proc.stdout + proc.stderr
    for line in out.splitlines():
        if line.startswith("RESULT "):
            row.update(json.loads(line[7:]))
    row["stages"] = {m.group(1): float(m.group(2)) for m in STAGE.finditer(out)}
    if proc.returncode != 0 or "cpu_s" not in row:
        row["error"] = out.strip().splitlines()[-1][:300] if out.strip() else "no output"
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="full", choices=("full", "reduced"))
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--light", nargs="*", default=[])
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--target", default="llvm-native")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--build-jobs", default="auto", help="tvm-rtask's cpu_build_jobs "
                        "(processes that build the kernels; auto: the cores)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="fresh-process compiles per model "
                        "and mode, the modes interleaved (medians)")  # fmt: skip
    parser.add_argument("--ready", action="store_true", help="also time the first call (the "
                        "JIT's machine code) and a second one")  # fmt: skip
    args = parser.parse_args(argv)

    from tvm_rtask.models.real import REAL_MODELS

    models = [("real", m) for m in (REAL_MODELS if args.models is None else args.models)]
    models += [("light", m) for m in args.light]
    load_before = os.getloadavg()
    rows: list[dict] = []
    for kind, name in models:
        runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
        for _ in range(args.repeat):  # the modes interleaved: a slow stretch hits both
            for mode in args.modes:
                run = run_one(kind, name, args.size, mode, args.target, args.timeout,
                              args.ready, args.build_jobs)  # fmt: skip
                runs[mode].append(run)
                print(json.dumps({"model": name, "mode": mode, **run}), flush=True)
        for mode in args.modes:
            row = median_row(runs[mode])
            row.update(model=name, kind=kind, size=args.size if kind == "real" else "light")
            row["build_jobs"] = args.build_jobs if mode != "tvm" else None
            row["mode"] = mode
            rows.append(row)
        # written after every model: a long run stopped early keeps what it measured
        write(args, rows, load_before, os.getloadavg())


def median_row(runs: list[dict]) -> dict:
    """One row from repeated runs: the median of each number (each stage's too), the runs
    kept as they were; an error if any run failed."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return {"error": failed[0]["error"], "runs": runs}
    row: dict = {"repeats": len(runs), "runs": runs}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            row[key] = statistics.median(r[key] for r in runs)
    stages = {k for r in runs for k in r["stages"]}
    row["stages"] = {
        k: statistics.median(r["stages"][k] for r in runs if k in r["stages"]) for k in stages
    }
    return row


def write(args, rows: list[dict], load_before, load_after) -> None:
    """The .json and .md files of the runs so far (ratios to TVM's build on CPU time)."""
    for row in rows:
        if "vm_s" in row:
            row["ready_s"] = row["wall_s"] + row["vm_s"]
        base = next((r for r in rows if r["model"] == row["model"] and r["mode"] == "tvm"), None)
        if base and "cpu_s" in base and "cpu_s" in row:
            row["ratio_cpu_to_tvm"] = row["cpu_s"] / base["cpu_s"]
            row["ratio_wall_to_tvm"] = row["wall_s"] / base["wall_s"]
        if base and "ready_s" in base and "ready_s" in row:
            row["ratio_ready_to_tvm"] = row["ready_s"] / base["ready_s"]

    date = datetime.date.today().isoformat()
    stem = f"{date}-cpu-compile-time" + (f"-{args.tag}" if args.tag else "")
    meta = {"date": date, "target": args.target, "size": args.size, "machine": platform.node()}
    meta.update(cpu_count=os.cpu_count(), loadavg_before=load_before, loadavg_after=load_after)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [
        f"# CPU compile time ({date}, {args.target}, {args.size})",
        "",
        f"{os.cpu_count()} cores; load average before {load_before[0]:.1f} / "
        f"{load_before[1]:.1f} / {load_before[2]:.1f}, after {load_after[0]:.1f} / "
        f"{load_after[1]:.1f} / {load_after[2]:.1f} (1/5/15 min). CPU s of the compile call "
        f"in a fresh process, median of {args.repeat} runs per model and mode (interleaved), "
        "with the build processes it forks (the first import of "
        f"tvm_rtask.api apart, last column); tvm-rtask's cpu_build_jobs: {args.build_jobs}; "
        "stages are wall s from the progress log; ready s: the compile's wall time plus "
        "the VM's creation, where the JIT makes the machine code; first call extra s: the "
        "first call's time less the second's (noise where one call takes seconds).",
        "",
        "| model | mode | CPU s | wall s | x TVM (CPU) | x TVM (wall) | prepare | plan "
        "| lower | build | import CPU s | ready s (x TVM) | first call extra s | one call s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mode']} | error: {r['error']} |" + " |" * 11)
            continue
        st = r["stages"]
        ratio, wall_ratio = r.get("ratio_cpu_to_tvm"), r.get("ratio_wall_to_tvm")
        cells = [r["model"], r["mode"], f"{r['cpu_s']:.1f}", f"{r['wall_s']:.1f}"]
        cells += [f"{x:.1f}" if x is not None else "-" for x in (ratio, wall_ratio)]
        stages = ("prepare/fuse", "plan", "lower", "build")
        cells += [f"{st[s]:.1f}" if s in st else "-" for s in stages]
        cells.append(f"{r['import_cpu_s']:.1f}" if "import_cpu_s" in r else "-")
        ready = r.get("ready_s"), r.get("ratio_ready_to_tvm")
        cells.append(f"{ready[0]:.1f} ({ready[1]:.1f})" if "ratio_ready_to_tvm" in r else "-")
        cells.append(f"{r['first_call_s'] - r['second_call_s']:.2f}" if "vm_s" in r else "-")
        cells.append(f"{r['second_call_s']:.3f}" if "second_call_s" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
