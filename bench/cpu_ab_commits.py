"""Two commits' compiled models, timed against each other in one process (llvm).

Usage: python -m bench ab --base REV [--models resnet18 ...] [--size full]
       [--seconds 10] [--target llvm-native] [--json OUT.json]
       [--base-option KEY=VALUE ...] [--head-option KEY=VALUE ...]

``--base HEAD`` with options on one side compares two settings of one commit (for example
``--base-option cpu_layout=nchw``: the default layout against NCHW); each option is passed to
``tvm_rtask.compile`` as a keyword, its value read as ``tvm-rtask --option`` reads one
(``4``, ``true``; anything else a string).

A model is any name ``python -m bench peers`` takes (torchvision's at ``--size``, a zoo or
light model, an ``.onnx`` file); it is written once as an ONNX file, with seeded weights,
that both sides compile.

A change to the compiler should leave the kernels it makes as fast as they were; separate
processes drift 5-18% on a shared machine, so this compares within one. The base commit is
checked out in a temporary git worktree (its native library taken from this install), each
side compiles and exports every model in its own process (``tvm_rtask.runtime.export_library``;
compile CPU seconds, forked build processes included, and wall seconds recorded), and a third
process loads both libraries and runs them
interleaved, three calls each in turn, for ``--seconds`` per model. Reported per model: each
side's median latency and compile CPU seconds, and the largest output difference between them
(the same seeded weights and input).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# a child run in another source tree (its cwd, first on sys.path) imports tvm_rtask from there,
# not through the editable install (a meta-path finder)
USE_TREE = r"""
import sys
if sys.argv.pop(1) != "-":
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
"""

EXPORT = (
    USE_TREE
    + r"""
import json, os, time
import tvm_rtask, tvm_rtask.api
from tvm_rtask import frontend
from tvm_rtask.backend import as_target
import onnx
from tvm_rtask.runtime.export import export_library
outdir, models, target, options, *names = sys.argv[1:]
target = as_target(target)
options = json.loads(options)
def cpu_s():
    # this process and the build processes it forked and waited for
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
for name in names:
    mod = frontend.load(onnx.load(os.path.join(models, name + ".onnx")))
    cpu, wall = cpu_s(), time.perf_counter()
    ex = tvm_rtask.compile(mod, target, **options)
    cpu, wall = cpu_s() - cpu, time.perf_counter() - wall
    export_library(ex, os.path.join(outdir, name + ".so"))
    with open(os.path.join(outdir, name + ".json"), "w") as f:
        json.dump({"compile_cpu_s": cpu, "compile_wall_s": wall}, f)
"""
)

TIME = r"""
import json, os, sys, time
import numpy as np
import tvm
from tvm import relax
from tvm_rtask import native
import onnx
from tvm_rtask.models.onnx_light import random_inputs
from tvm_rtask.runtime import set_num_threads
from bench.peers import stats, time_calls
from tvm_rtask.testing.run import run_executable
name, models, seconds, base, head = sys.argv[1:]
native.load()
set_num_threads(int(os.environ["TVM_NUM_THREADS"]))
feed = random_inputs(onnx.load(f"{models}/{name}.onnx"), seed=1)
x = [tvm.runtime.tensor(v) for v in feed.values()]
sides = {"base": base, "head": head}
libs = {k: tvm.runtime.load_module(f"{d}/{name}.so") for k, d in sides.items()}
outs = {k: run_executable(lib, feed)[0] for k, lib in libs.items()}
mains = {k: relax.VirtualMachine(lib, tvm.cpu())["main"] for k, lib in libs.items()}
for m in mains.values():
    for _ in range(5):
        m(*x)
times = {k: [] for k in mains}
deadline = time.perf_counter() + float(seconds)
while time.perf_counter() < deadline:
    for k, m in mains.items():
        times[k] += time_calls(lambda m=m: m(*x), warmup=0, repeat=3, min_samples=3)
row = {"model": name, "runs": len(times["base"]),
       "max_abs_diff": float(np.abs(outs["head"] - outs["base"]).max()),
       "max_abs_output": float(np.abs(outs["base"]).max())}
for k, d in sides.items():
    row[k + "_ms"] = stats(times[k])["median_ms"]
    with open(f"{d}/{name}.json") as f:
        compiled = json.load(f)
    row[k + "_compile_cpu_s"] = compiled["compile_cpu_s"]
    row[k + "_compile_wall_s"] = compiled.get("compile_wall_s")
print("RESULT " + json.dumps(row), flush=True)
"""


def _run(args: list[str], cwd: str = ROOT, threads: int | None = None) -> str:
    env = None if threads is None else {**os.environ, "TVM_NUM_THREADS": str(threads)}
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(args[:3])} ...\n{proc.stderr[-3000:]}")
    return proc.stdout


def main(argv: list[str] | None = None) -> None:
    import onnx

    from bench.peers import load_model
    from tvm_rtask import native
    from tvm_rtask.errors import OptionError
    from tvm_rtask.models.real import REAL_MODELS
    from tvm_rtask.options import parse_key_values

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare with")
    parser.add_argument("--models", nargs="+", default=list(REAL_MODELS))
    parser.add_argument("--size", default="full", choices=("full", "reduced"))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--target", default="llvm-native")
    parser.add_argument("--threads", type=int, default=2, help="vEUs and worker threads")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--base-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a compile option of the base side (repeatable)",
    )
    parser.add_argument(
        "--head-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a compile option of the head side (repeatable)",
    )
    args = parser.parse_args(argv)
    try:  # as the command line reads --option
        options = {
            side: parse_key_values(pairs, f"--{side}-option")
            for side, pairs in (("base", args.base_option), ("head", args.head_option))
        }
    except OptionError as err:
        sys.exit(str(err))

    with tempfile.TemporaryDirectory(prefix="rtask-ab-") as tmp:
        models = os.path.join(tmp, "models")
        os.makedirs(models)
        for name in args.models:
            onnx.save(load_model(name, seed=0, size=args.size), f"{models}/{name}.onnx")
        tree = os.path.join(tmp, "tree")
        _run(["git", "worktree", "add", "--detach", tree, args.base])
        try:
            # the base tree has no built native library: this install's serves both
            lib = os.path.dirname(native.library_path())
            shutil.copytree(lib, os.path.join(tree, "tvm_rtask", "lib"), dirs_exist_ok=True)
            out = {side: os.path.join(tmp, side) for side in ("base", "head")}
            for side, source in (("base", tree), ("head", "-")):
                os.makedirs(out[side])
                _run([sys.executable, "-c", EXPORT, source, out[side], models, args.target,
                      json.dumps(options[side]), *args.models],
                     cwd=ROOT if source == "-" else source,
                     threads=args.threads)  # fmt: skip
            rows = []
            for name in args.models:
                text = _run([sys.executable, "-c", TIME, name, models, str(args.seconds),
                             out["base"], out["head"]], threads=args.threads)  # fmt: skip
                row = json.loads(text.split("RESULT ", 1)[1])
                rows.append(row)
                print(f"{name}: base {row['base_ms']:.3f} ms, head {row['head_ms']:.3f} ms "
                      f"({row['head_ms'] / row['base_ms'] - 1:+.1%}); compile CPU s "
                      f"{row['base_compile_cpu_s']:.1f} -> {row['head_compile_cpu_s']:.1f}, "
                      f"wall s {row['base_compile_wall_s'] or 0:.1f} -> "
                      f"{row['head_compile_wall_s'] or 0:.1f}; max |diff| "
                      f"{row['max_abs_diff']:.2g} (outputs up to {row['max_abs_output']:.3g}); "
                      f"{row['runs']} runs each",
                      flush=True)  # fmt: skip
        finally:
            _run(["git", "worktree", "remove", "--force", tree])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "base": args.base,
                    "target": args.target,
                    "threads": args.threads,
                    "options": options,
                    "command": " ".join(sys.argv),
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
