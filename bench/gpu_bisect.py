"""Where a wrong tvm-rtask build goes wrong: one model under several build variants, and the
first intermediate tensor that differs from ONNX Runtime's (TVM's default build's error beside).

Made for the GPU window after light ShuffleNet's wavefront CUDA build gave relative error 1.0
against TVM's CUDA build (bench/results/2026-11-26-h200-w2-summary.md); the third window found
TVM's build the wrong one (docs/gpu.md). Each variant is a worker process of its own (ONNX
Runtime's outputs, TVM's build, its tvm-rtask build, one call), run side by side:

- ``default`` (wavefront, counters on CUDA), ``sequential``, ``fine`` and (llvm) ``global``
  (step-array barriers instead of counters), ``inlined`` (``cuda_body_functions=False``),
  ``rules`` (``cuda_rules=True``: the CUDA rules, off by default), ``one_per_veu``
  (``rtasks_per_veu=1``);
- ``probed``: the default build of the model with the outputs of its joins and pools
  (Concat, Sum, Add, pooling, Gemm) added as graph outputs, compared one by one in graph
  order: the first one off is where the error starts (extra outputs change where the plan
  keeps tensors, so a bug that needs them inside an rProgram may hide: read it with the
  variants).

One JSON line per worker in ``--out`` the moment it finishes, the workers' logs in one
archive beside it (``<out stem>-logs.tar.gz``: a window brings back few files); a summary
on stdout.

    python3 bench/gpu_bisect.py light:shufflenet --out $OUT/bisect.jsonl --deadline 240
    python3 bench/gpu_bisect.py light:squeezenet --target llvm --out /tmp/b.jsonl   # dry run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}
TOLERANCE = 1e-4
# variant -> tvm_rtask.compile options; the CUDA-only ones are left out on llvm
VARIANTS = {
    "default": {},
    "sequential": {"policy": "sequential"},
    "fine": {"barrier": "fine"},
    "global": {"barrier": "global"},
    "inlined": {"cuda_body_functions": False},
    "rules": {"cuda_rules": True},
    "one_per_veu": {"rtasks_per_veu": 1},
    "probed": {},
}
CUDA_ONLY = {"inlined", "rules"}
LLVM_ONLY = {"global"}  # llvm's parallel barrier: an OptionError on CUDA
PROBED_OPS = ("Concat", "Sum", "Add", "AveragePool", "MaxPool", "GlobalAveragePool", "Gemm")


def probed_model(model, ops=PROBED_OPS):
    """A copy of ``model`` whose graph also outputs every tensor made by an ``ops`` node
    (graph order), so each can be compared; returns ``(model, probe names)``."""
    import onnx
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model)
    info = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    probed = onnx.ModelProto()
    probed.CopyFrom(model)
    have = {o.name for o in probed.graph.output}
    names = []
    for node in probed.graph.node:
        if node.op_type in ops and node.output[0] not in have and node.output[0] in info:
            names.append(node.output[0])
            have.add(node.output[0])
            probed.graph.output.append(info[node.output[0]])
    if not names:
        raise ValueError(f"no {'/'.join(ops)} outputs with known shapes to probe")
    return probed, names


def _relative(a, e) -> float:
    from tvm_rtask.testing.onnx_light import max_relative_error

    return max_relative_error([a], [e])


def _describe(a, e) -> dict:
    import numpy as np

    a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
    return {
        "rel_err": _relative(a, e),
        "shape": list(e64.shape),
        "ref_max_abs": float(np.abs(e64).max()) if e64.size else 0.0,
        "max_abs": float(np.abs(a64).max()) if a64.size else 0.0,
        "zero_fraction": float((a64 == 0).mean()) if a64.size else 0.0,
        "ref_zero_fraction": float((e64 == 0).mean()) if e64.size else 0.0,
        "finite": bool(np.isfinite(a64).all()),
        "argmax_equal": bool(a64.size and int(a64.argmax()) == int(e64.argmax())),
    }


def use_nvcc_cache() -> None:
    """tvm-rtask's CUDA sources from the nvcc cache (on the device the pack's, which
    ``make gpu-pack`` fills with these variants' builds); TVM's own go to TVM's compile."""
    from gpu_window import PACK_MANIFEST, _read_json, adopt_pack_nvcc

    from tvm_rtask.backend.cuda import compile_cache

    prep = os.environ.get("TVM_RTASK_GPU_PREP")
    adopt_pack_nvcc(
        _read_json(Path(prep) / PACK_MANIFEST) if prep else {}, compile_cache.nvcc_version()
    )
    compile_cache.install_compile_callback()


def worker(spec: str, variant: str, target_kind: str, codegen_only: bool = False) -> dict:
    """One variant: TVM's default build and tvm-rtask's of the (probed) model, one call each.
    ``codegen_only``: tvm-rtask's CUDA build alone, through nvcc into the cache (the pack)."""
    import tvm
    from gpu_window import _run, load_model

    import tvm_rtask
    from tvm_rtask.backend.cuda import compile_cache
    from tvm_rtask.relax_passes import as_target
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs

    rec: dict = {"spec": spec, "variant": variant, "target": target_kind}
    started = time.time()
    if target_kind == "cuda":
        use_nvcc_cache()
    model, inputs = load_model(spec)
    names = [o.name for o in model.graph.output]
    probes: list[str] = []
    if variant == "probed":
        model, probes = probed_model(model)
        names += probes
    options = dict(VARIANTS[variant])
    rec["options"] = options
    target = CUDA_TARGET if target_kind == "cuda" else {"kind": "llvm"}
    dev = tvm.cuda(0) if target_kind == "cuda" else tvm.cpu()
    mod = tvm_rtask.frontend.load(model)
    if codegen_only:
        tvm_rtask.compile(mod, target, **options)
        rec.update(
            ok=True, total_s=round(time.time() - started, 1), nvcc_cache=compile_cache.stats()
        )
        return rec

    # ONNX Runtime on the CPU is the reference: TVM's own CUDA build of light ShuffleNet was
    # the wrong one in the third window (docs/gpu.md); its errors are recorded beside
    reference = onnxruntime_outputs(model, inputs)
    tvm_outputs = _run(tvm.compile(mod, as_target(target)), inputs, dev)[2]
    rec["tvm_s"] = round(time.time() - started, 1)
    actual = _run(tvm_rtask.compile(mod, target, **options), inputs, dev)[2]
    rec["total_s"] = round(time.time() - started, 1)
    rec["nvcc_cache"] = compile_cache.stats()
    rec["tvm_rel_err"] = {
        n: _relative(t, e) for n, t, e in zip(names, tvm_outputs, reference, strict=True)
    }
    rec["outputs"] = {n: _describe(a, e) for n, a, e in zip(names, actual, reference, strict=True)}
    # graph order first: the earliest probe off is where the error starts
    order = probes + names[: len(names) - len(probes)]
    off = [n for n in order if not rec["outputs"][n]["rel_err"] < TOLERANCE]
    rec["ok"] = not off
    rec["first_off"] = off[0] if off else None
    rec["off"] = off
    return rec


def _worker_main(spec: str, variant: str, target_kind: str, out: str, codegen_only: bool) -> int:
    try:
        rec = worker(spec, variant, target_kind, codegen_only)
    except Exception as err:  # noqa: BLE001 - the record says what broke
        rec = {
            "spec": spec,
            "variant": variant,
            "target": target_kind,
            "ok": False,
            "error": f"{type(err).__name__}: {str(err)[:500]}",
            "traceback": traceback.format_exc()[-3000:],
        }
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0


def summary_lines(records: list[dict]) -> list[str]:
    """One line per variant: ok, the worst output's error (and TVM's build's) against ONNX
    Runtime, the first output off."""
    lines = []
    for rec in records:
        if "error" in rec:
            lines.append(f"{rec['variant']:12s} ERROR {rec['error'][:200]}")
            continue
        if "outputs" not in rec:  # --codegen-only
            lines.append(f"{rec['variant']:12s} built in {rec.get('total_s')} s")
            continue
        worst = max((o["rel_err"] for o in rec["outputs"].values()), default=0.0)
        first = rec.get("first_off")
        where = ""
        if first:
            o = rec["outputs"][first]
            where = (
                f" first off: {first} (rel {o['rel_err']:.3g}, zeros {o['zero_fraction']:.2f}"
                f" vs {o['ref_zero_fraction']:.2f}, max {o['max_abs']:.3g} vs"
                f" {o['ref_max_abs']:.3g})"
            )
        status = "ok" if rec["ok"] else "WRONG"
        tvm_worst = max(rec.get("tvm_rel_err", {}).values(), default=0.0)
        lines.append(
            f"{rec['variant']:12s} {status:5s} worst {worst:.3g} (TVM's {tvm_worst:.3g}){where}"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="light:NAME or zoo:NAME (as bench/gpu_window.py)")
    p.add_argument("--out", default=os.environ.get("OUT", ".") + "/bisect.jsonl")
    p.add_argument("--target", choices=("cuda", "llvm"), default="cuda")
    p.add_argument("--variants", help="comma-separated (default: all for the target)")
    p.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 2)))
    p.add_argument("--deadline", type=float, default=300, help="seconds for all workers")
    p.add_argument("--worker", nargs=2, metavar=("VARIANT", "TARGET"), help=argparse.SUPPRESS)
    p.add_argument(
        "--codegen-only",
        action="store_true",
        help="build only (the pack fills the nvcc cache so): no reference, no run",
    )
    args = p.parse_args(argv)
    if args.worker:
        return _worker_main(args.spec, *args.worker, args.out, args.codegen_only)
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    left_out = CUDA_ONLY if args.target != "cuda" else LLVM_ONLY
    variants = [v for v in variants if v not in left_out]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    before = out.read_text().count("\n") if out.exists() else 0
    end = time.time() + args.deadline
    pending = list(variants)
    running: dict[str, subprocess.Popen] = {}
    # the workers' logs stay out of ``--out``'s folder (a GPU window brings back few files):
    # one archive of them goes there at the end
    logs = Path(tempfile.mkdtemp(prefix="bisect-logs-"))
    while pending or running:
        while pending and len(running) < args.jobs:
            v = pending.pop(0)
            cmd = [sys.executable, __file__, args.spec, "--out", str(out)]
            cmd += ["--worker", v, args.target] + (["--codegen-only"] if args.codegen_only else [])
            log = open(logs / f"{v}.log", "w")  # noqa: SIM115 - closed with the process
            running[v] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            print(f"[{time.strftime('%H:%M:%S')}] {v}: started", flush=True)
        for v, proc in list(running.items()):
            if proc.poll() is not None:
                print(f"[{time.strftime('%H:%M:%S')}] {v}: done ({proc.returncode})", flush=True)
                del running[v]
            elif time.time() > end:
                proc.kill()
                proc.wait()
                with open(out, "a") as f:
                    f.write(json.dumps({"variant": v, "ok": False, "error": "deadline"}) + "\n")
                del running[v]
        if time.time() > end and pending:
            for v in pending:
                with open(out, "a") as f:
                    f.write(json.dumps({"variant": v, "ok": False, "error": "not reached"}) + "\n")
            pending = []
        time.sleep(0.5)
    with tarfile.open(out.parent / f"{out.stem}-logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname=f"{out.stem}-logs")
    records = [json.loads(line) for line in out.read_text().splitlines()[before:] if line]
    print("\n".join(summary_lines(records)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
