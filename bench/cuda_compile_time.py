"""How long a CUDA build takes, and where: tvm-rtask's pipeline, then nvcc per kernel.

Usage: python bench/cuda_compile_time.py [--models squeezenet lstm_tc ...] [--reduced]
       [--arch sm_90] [--policy wavefront] [--max-ops-per-program N] [--out bench/results]
       [--tag NAME]

For each built-in model: ``tvm_rtask.lower`` + ``tvm_rtask.build`` (without the ptxas check)
is timed as the pipeline; the generated CUDA source is then cut into one file per
``__global__`` definition (the shared preamble kept in each) and every file is compiled
with ``nvcc -ptx``, one at a time, so each kernel's nvcc time and line count are known.
nvcc's time grows faster than a persistent kernel's code (docs/compile-time-notes.md);
this is the measurement behind the rProgram limits. Process CPU time of the pipeline and
wall time of each nvcc run are reported. Writes ``cuda_compile_time-<date>[-<tag>].md``
and ``.json`` to ``--out``.
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tvm_rtask  # noqa: E402
from tvm_rtask import models as zoo  # noqa: E402
from tvm_rtask.backend.cuda.occupancy import find_nvcc  # noqa: E402

_DEFINITION = re.compile(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^;]*\{\s*$")


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


def nvcc_seconds(nvcc: str, code: str, arch: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cu")
        with open(path, "w") as f:
            f.write(code)
        start = time.perf_counter()
        out = subprocess.run(
            [nvcc, "-ptx", f"-arch={arch}", "-o", path + ".ptx", path],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"nvcc failed:\n{out.stderr[-2000:]}")
    return seconds


def measure(name: str, args, nvcc: str) -> dict:
    target = {"kind": "cuda", "arch": args.arch}
    options = {"policy": args.policy, "verify_occupancy": False}
    if args.max_ops_per_program is not None:
        options["max_ops_per_program"] = args.max_ops_per_program
    model = zoo.get(name, reduced=args.reduced)[0]
    cpu = time.process_time()
    ex, plan = tvm_rtask.build(tvm_rtask.lower(model, target, **options), target)
    pipeline_cpu_s = time.process_time() - cpu
    source = tvm_rtask.cuda_source(ex)
    preamble, kernels = split_kernels(source)
    per_kernel = []
    for kernel, code in kernels:
        seconds = nvcc_seconds(nvcc, preamble + "\n" + code, args.arch)
        per_kernel.append({"kernel": kernel, "lines": code.count("\n") + 1, "nvcc_s": seconds})
        print(f"  {name} {kernel}: {per_kernel[-1]['lines']} lines, nvcc {seconds:.1f} s")
    report = plan.report()
    persistent = [k for k in per_kernel if k["kernel"].startswith("rprogram_")]
    return {
        "model": name,
        "operators": report["operators"],
        "rprograms": report["rprograms"],
        "estimated_us": report["estimated_us"],
        "pipeline_cpu_s": pipeline_cpu_s,
        "source_mb": len(source) / 1e6,
        "persistent_kernels": len(persistent),
        "nvcc_s": sum(k["nvcc_s"] for k in per_kernel),
        "largest_kernel_lines": max((k["lines"] for k in persistent), default=0),
        "kernels": per_kernel,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["squeezenet", "inception_v3"])
    parser.add_argument("--reduced", action="store_true", help="the models' reduced configs")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--policy", default="wavefront")
    parser.add_argument("--max-ops-per-program", type=int, default=None)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--tag", default="", help="appended to the result file names")
    args = parser.parse_args()
    nvcc = find_nvcc()
    if nvcc is None:
        sys.exit("nvcc not found (PATH, CUDA_HOME): nothing to measure")
    rows = [measure(name, args, nvcc) for name in args.models]
    stamp = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    meta = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "arch": args.arch,
        "policy": args.policy,
        "reduced": args.reduced,
        "max_ops_per_program": args.max_ops_per_program,
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
        "| model | operators | rPrograms | persistent kernels | largest (lines) "
        "| pipeline CPU s | nvcc s (sum) | source MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['operators']} | {r['rprograms']} | {r['persistent_kernels']} "
            f"| {r['largest_kernel_lines']} | {r['pipeline_cpu_s']:.1f} | {r['nvcc_s']:.1f} "
            f"| {r['source_mb']:.2f} |"
        )
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
