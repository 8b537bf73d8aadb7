"""How long a CUDA build takes, and where: tvm-rtask's pipeline, then nvcc per kernel.

Usage: python bench/cuda_compile_time.py [--models squeezenet lstm_tc ...] [--reduced]
       [--arch sm_90] [--policy wavefront] [--max-ops-per-program N] [--barrier counter|fine]
       [--inline-bodies] [--no-nvcc] [--out bench/results] [--tag NAME]
       python bench/cuda_compile_time.py --real reduced|full [--models resnet18 ...]

For each built-in model (or, with ``--real``, each torchvision architecture of
``tvm_rtask.models.real`` at that size, all of them by default): ``tvm_rtask.lower`` +
``tvm_rtask.build`` (without the ptxas check)
is timed as the pipeline; the generated CUDA source is then compiled once as the build
compiles it (``compile_cache.tvm_nvcc_command``: TVM's flags, a cubin, ``ptxas -v``; no
cache), and the wall time, registers and spill stores of every persistent kernel (with the
rKernel body functions it calls) are reported. nvcc's time grows faster than a persistent
kernel's code (docs/compile-time-notes.md); this is the measurement behind the rProgram
limits and the body functions. ``--inline-bodies`` builds with ``cuda_body_functions=False``
(every body inlined into its persistent kernel) for comparison. Process CPU time of the
pipeline, the wall time of each of its stages (prepare/fuse, plan, lower, build = TVM's
codegen; from the ``tvm_rtask`` progress log), the synchronisation the plan needs
(step-array pairs against dependency-counter waits) and the wall time of nvcc are reported.
``--no-nvcc`` measures the pipeline alone (no GPU and no nvcc needed: what CI's machines can time).
Writes ``cuda_compile_time-<date>[-<tag>].md`` and ``.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tvm_rtask  # noqa: E402
from tvm_rtask import models as zoo  # noqa: E402
from tvm_rtask.backend.cuda.occupancy import (  # noqa: E402
    find_nvcc,
    parse_function_spills,
    parse_ptxas_report,
    tvm_nvcc_command,
)
from tvm_rtask.core.counters import counter_stats  # noqa: E402
from tvm_rtask.models.real import REAL_MODELS, load_real_model  # noqa: E402

_DEFINITION = re.compile(r"__global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\([^;]*\{\s*$")


def split_kernels(source: str) -> tuple[str, list[tuple[str, str]]]:
    """The preamble (everything before the first ``__global__``) and each kernel definition
    with its name; a definition runs to the next one or to the end."""
    lines = source.split("\n")
    first = next((i for i, line in enumerate(lines) if "__global__" in line), len(lines))
    starts = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _DEFINITION.search(line))]
    bounds = [i for i, _ in starts] + [len(lines)]
    kernels = [
        (name, "\n".join(lines[bounds[k] : bounds[k + 1]])) for k, (_, name) in enumerate(starts)
    ]
    return "\n".join(lines[:first]), kernels


def compile_whole(nvcc: str, source: str, arch: str) -> tuple[float, dict[str, dict]]:
    """Wall seconds of the build's own nvcc command on ``source``, and per persistent kernel
    its registers and spill stores (its body functions' included)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.cu")
        with open(path, "w") as f:
            f.write(source)
        start = time.perf_counter()
        out = subprocess.run(
            tvm_nvcc_command(nvcc, arch, path, path + ".cubin"),
            capture_output=True,
            text=True,
            timeout=3600,
        )
        seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"nvcc failed:\n{out.stderr[-2000:]}")
    usage = parse_ptxas_report(out.stderr)
    spills = parse_function_spills(out.stderr)
    bodies = set(re.findall(r"\b(rtask_body_\w+_kernel)\(", source))
    kernels = {}
    for name, use in usage.items():
        if name.startswith("rprogram_"):
            kernels[name] = {"registers": use.registers, "spill_stores": use.spill_stores}
    body_spills = sum(spills.get(b, 0) for b in bodies)
    return seconds, {"kernels": kernels, "body_spill_stores": body_spills}


class _StageTimes(logging.Handler):
    """Collects ``"<stage> done in X s"`` lines of the ``tvm_rtask`` progress log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = re.fullmatch(r"(.+) done in ([\d.]+) s", record.getMessage())
        if m and not m.group(1).startswith("rprogram"):
            self.seconds[m.group(1)] = self.seconds.get(m.group(1), 0.0) + float(m.group(2))


def _sync_counts(plan) -> dict[str, int | None]:
    """Step-array (vEU, step) pairs the plan's barriers list (None for a plan made for
    counters: it has no barriers; ``--barrier fine`` gives them), and the dependency-counter
    waits and (vEU, operator) pairs."""
    step_pairs = sum(
        len(e.waits) for p in plan.programs() for es in p.entries for e in es if hasattr(e, "waits")
    )
    stats = [counter_stats(p, plan.graph) for p in plan.programs()]
    return {
        "sync": plan.sync,
        "step_pairs": step_pairs if plan.sync == "steps" else None,
        "counter_waits": sum(s["counter_waits"] for s in stats),
        "counter_pairs": sum(s["wait_pairs"] for s in stats),
        "dependency_edges": sum(s["edges"] for s in stats),
    }


def measure(name: str, args, nvcc: str | None) -> dict:
    target = {"kind": "cuda", "arch": args.arch}
    options = {
        "policy": args.policy,
        "verify_occupancy": False,
        "barrier": args.barrier,
        "cuda_body_functions": not args.inline_bodies,
    }
    if args.max_ops_per_program is not None:
        options["max_ops_per_program"] = args.max_ops_per_program
    if args.real:
        model = load_real_model(name, args.real)
    else:
        model = zoo.get(name, reduced=args.reduced)[0]
    stages = _StageTimes()
    log = logging.getLogger("tvm_rtask")
    log.addHandler(stages)
    log.setLevel(logging.INFO)
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        ex, plan = tvm_rtask.build(tvm_rtask.lower(model, target, **options), target)
    finally:
        log.removeHandler(stages)
    pipeline_cpu_s = time.process_time() - cpu
    pipeline_wall_s = time.perf_counter() - wall
    source = tvm_rtask.cuda_source(ex)
    print(f"  {name}: pipeline {pipeline_wall_s:.1f} s wall, stages {stages.seconds}")
    _, kernels = split_kernels(source)
    nvcc_s, compiled = compile_whole(nvcc, source, args.arch) if nvcc else (None, {})
    if nvcc:
        print(f"  {name}: nvcc {nvcc_s:.1f} s, {compiled}")
    report = plan.report()
    return {
        "model": name,
        "operators": report["operators"],
        "rprograms": report["rprograms"],
        "estimated_us": report["estimated_us"],
        "barrier": args.barrier,
        "pipeline_cpu_s": pipeline_cpu_s,
        "pipeline_wall_s": pipeline_wall_s,
        "stages_s": stages.seconds,
        **_sync_counts(plan),
        "source_mb": len(source) / 1e6,
        "source_lines": source.count("\n") + 1,
        "persistent_kernels": len([k for k, _ in kernels if k.startswith("rprogram_")]),
        "body_functions": not args.inline_bodies,
        "nvcc_s": nvcc_s,
        "largest_kernel_lines": max(
            (code.count("\n") + 1 for k, code in kernels if k.startswith("rprogram_")), default=0
        ),
        **compiled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument(
        "--real",
        choices=("reduced", "full"),
        default=None,
        help="torchvision's architectures (tvm_rtask.models.real) at this size",
    )
    parser.add_argument("--reduced", action="store_true", help="the models' reduced configs")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--policy", default="wavefront")
    parser.add_argument("--max-ops-per-program", type=int, default=None)
    parser.add_argument("--barrier", default="counter", choices=("counter", "fine"))
    parser.add_argument("--no-nvcc", action="store_true", help="time the pipeline only")
    parser.add_argument(
        "--inline-bodies", action="store_true", help="cuda_body_functions=False (for comparison)"
    )
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--tag", default="", help="appended to the result file names")
    args = parser.parse_args()
    if args.models is None:
        args.models = list(REAL_MODELS) if args.real else ["squeezenet", "inception_v3"]
    nvcc = None if args.no_nvcc else find_nvcc()
    if nvcc is None and not args.no_nvcc:
        sys.exit("nvcc not found (PATH, CUDA_HOME): use --no-nvcc to time the pipeline alone")
    rows = [measure(name, args, nvcc) for name in args.models]
    stamp = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    meta = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "arch": args.arch,
        "policy": args.policy,
        "barrier": args.barrier,
        "reduced": args.reduced,
        "real": args.real,
        "max_ops_per_program": args.max_ops_per_program,
        "body_functions": not args.inline_bodies,
        "command": " ".join(sys.argv),
    }
    tag = f"-{args.tag}" if args.tag else ""
    base = os.path.join(args.out, f"cuda_compile_time-{stamp}{tag}")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [
        f"# CUDA compile time ({args.arch}, {args.policy}, {stamp})",
        "",
        f"`{meta['command']}` on {meta['machine']} ({meta['cpus']} CPUs).",
        "",
        "| model | operators | rPrograms | largest kernel (lines) | plan s | lower s "
        "| build s | pipeline wall s | step pairs | counter pairs | edges | nvcc s "
        "| most spill stores (kernel + bodies) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        st = r["stages_s"]
        nv = "-" if r["nvcc_s"] is None else f"{r['nvcc_s']:.1f}"
        spill = max((k["spill_stores"] for k in r.get("kernels", {}).values()), default=None)
        spill = "-" if spill is None else f"{spill} + {r.get('body_spill_stores', 0)}"
        lines.append(
            f"| {r['model']} | {r['operators']} | {r['rprograms']} | {r['largest_kernel_lines']} "
            f"| {st.get('plan', 0):.1f} | {st.get('lower', 0):.1f} | {st.get('build', 0):.1f} "
            f"| {r['pipeline_wall_s']:.1f} | {r['step_pairs']} | {r['counter_pairs']} "
            f"| {r['dependency_edges']} | {nv} | {spill} |"
        )
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
