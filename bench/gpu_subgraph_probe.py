"""One piece of a model (ONNX ``extract_model`` between named tensors; every node's output a
graph output unless ``--outputs-only``), TVM's default build and tvm-rtask's (default and
sequential) against ONNX Runtime on the CPU: which build is off, and from which node.

Found in the third GPU window (docs/gpu.md) that TVM's CUDA build of light ShuffleNet's first
stride-2 unit is wrong only when its intermediate tensors are not outputs::

    python3 bench/gpu_subgraph_probe.py light:shufflenet --inputs r51 --outputs r64 \
        --outputs-only --out $OUT/sub.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def full_warp_masks(code: str, *_) -> str:
    """TVM's CUDA source with every ``__activemask()`` (the mask its cross-thread reductions
    give their shuffles) replaced by the full mask: right where the whole warp reaches the
    shuffles, as in the dlight reductions read in docs/gpu.md's third window."""
    return code.replace("__activemask()", "0xffffffffu")


def _with_cuda_postproc(postproc, build):
    """``build()`` with TVM's CUDA source passed through ``postproc`` (TVM's
    ``tvm_callback_cuda_postproc`` hook), the hook made the identity again afterwards."""
    import tvm_ffi

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", postproc, override=True)
    try:
        return build()
    finally:
        tvm_ffi.register_global_func(
            "tvm_callback_cuda_postproc", lambda code, *_: code, override=True
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("--inputs", required=True, help="comma-separated tensor names")
    p.add_argument("--outputs", required=True, help="comma-separated tensor names")
    p.add_argument("--target", choices=("cuda", "llvm"), default="cuda")
    p.add_argument("--out", required=True)
    p.add_argument("--outputs-only", action="store_true", help="no intermediate outputs")
    p.add_argument("--calls", type=int, default=1, help="calls of each build (does it vary?)")
    p.add_argument(
        "--tvm-full-warp-mask",
        action="store_true",
        help="also TVM's build with its shuffles' __activemask() replaced by the full mask",
    )
    args = p.parse_args(argv)
    import numpy as np
    import onnx
    import tvm
    from gpu_bisect import CUDA_TARGET, _describe, _relative, use_nvcc_cache
    from gpu_window import _run, load_model
    from harness import to_numpy_list
    from onnx import shape_inference, utils

    import tvm_rtask
    from tvm_rtask.relax_passes import as_target
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs

    model, _ = load_model(args.spec)
    tmp = Path(tempfile.mkdtemp())
    onnx.save(model, tmp / "m.onnx")
    utils.extract_model(
        str(tmp / "m.onnx"), str(tmp / "s.onnx"), args.inputs.split(","), args.outputs.split(",")
    )
    sub = shape_inference.infer_shapes(onnx.load(tmp / "s.onnx"))
    info = {v.name: v for v in sub.graph.value_info}
    have = {o.name for o in sub.graph.output}
    for node in [] if args.outputs_only else sub.graph.node:
        for o in node.output:
            if o not in have and o in info:
                sub.graph.output.append(info[o])
                have.add(o)
    rng = np.random.default_rng(0)
    inputs = {}
    for i in sub.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        inputs[i.name] = (rng.random(shape, dtype=np.float32) * 100).astype("float32")
    names = [o.name for o in sub.graph.output]
    ops = {o: f"{n.op_type}:{n.name}" for n in sub.graph.node for o in n.output}
    if args.target == "cuda":
        use_nvcc_cache()
    target = CUDA_TARGET if args.target == "cuda" else {"kind": "llvm"}
    dev = tvm.cuda(0) if args.target == "cuda" else tvm.cpu()
    mod = tvm_rtask.frontend.load(sub)
    ref = onnxruntime_outputs(sub, inputs)
    builds = {
        "tvm_default": lambda: tvm.compile(mod, as_target(target)),
        "default": lambda: tvm_rtask.compile(mod, target),
        "sequential": lambda: tvm_rtask.compile(mod, target, policy="sequential"),
    }
    if args.tvm_full_warp_mask and args.target == "cuda":
        builds["tvm_full_warp_mask"] = lambda: _with_cuda_postproc(
            full_warp_masks, lambda: tvm.compile(mod, as_target(target))
        )
    recs = []
    for variant, build in builds.items():
        vm, call_args, act = _run(build(), inputs, dev)
        worst_call, identical = 0.0, True
        for _ in range(args.calls - 1):  # does the same build give the same outputs each call?
            again = to_numpy_list(vm["main"](*call_args))
            identical &= all((x == y).all() for x, y in zip(again, act, strict=True))
            worst_call = max(
                worst_call, *(_relative(x, e) for x, e in zip(again, ref, strict=True))
            )
        for n, a, e in zip(names, act, ref, strict=True):
            rec = {"variant": variant, "name": n, "op": ops.get(n), **_describe(a, e)}
            if args.calls > 1:
                rec.update(
                    calls=args.calls, calls_identical=identical, worst_call_rel_err=worst_call
                )
            recs.append(rec)
            print(json.dumps(rec), flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")
    with open(Path(args.out).with_suffix(".txt"), "w") as f:
        f.write(onnx.printer.to_text(sub.graph))
    return 0


if __name__ == "__main__":
    sys.exit(main())
