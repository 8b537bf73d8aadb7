"""A small persistent kernel with the reductions whose warp masks TVM reads with
``__activemask()`` after a divergent branch (docs/gpu.md, "Warp masks").

A depthwise 3x3 convolution and a 3x3 average pool, both of stride 2 (light ShuffleNet's
pattern: dlight accumulates a window of 9 taps under ``if (threadIdx.x < 9)`` in a block of
256 threads, then reduces across the block), joined, then a sum over the spatial axes (a
reduction of 32 threads). :data:`DEPTHWISE` is the Relax module; :func:`persistent_build` is
tvm-rtask's CUDA build of it (one rProgram of 8 vEUs).

Run as a module on a GPU (``python -m tests.cuda.warp_mask_kernel [--build rtask|tvm]``,
``tests/cuda/test_gpu_warp_masks.py`` runs it under ``compute-sanitizer --tool synccheck``): it
runs the build ``--repeat`` times against TVM's CPU build of the same module, prints one JSON
line and exits 0 when every run matches, 3 when one does not.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import tvm
from tvm.script import relax as R

TARGET = {"kind": "cuda", "arch": "sm_90"}
NUM_VEU = 8
TOLERANCE = 1e-4


@tvm.script.ir_module
class DEPTHWISE:
    @R.function
    def main(x: R.Tensor((1, 8, 14, 14), "float32"), w: R.Tensor((8, 1, 3, 3), "float32")):
        with R.dataflow():
            a = R.nn.conv2d(x, w, strides=2, padding=1, groups=8)
            b = R.nn.avg_pool2d(x, pool_size=3, strides=2, padding=1, count_include_pad=False)
            c = R.add(R.nn.relu(a), b)
            d = R.sum(c, axis=[2, 3])
            R.output(d)
        return d


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((1, 8, 14, 14)).astype("float32"),
        "w": rng.standard_normal((8, 1, 3, 3)).astype("float32"),
    }


def persistent_build(target=TARGET, **options):
    """tvm-rtask's CUDA build of :data:`DEPTHWISE` (no occupancy check unless asked)."""
    import tvm_rtask

    options.setdefault("verify_occupancy", False)
    return tvm_rtask.compile(DEPTHWISE, target, num_veu=NUM_VEU, **options)


def tvm_build(target=TARGET):
    """TVM's own CUDA build of :data:`DEPTHWISE` (its masks as TVM emits them)."""
    from tvm_rtask.relax_passes import as_target

    return tvm.compile(DEPTHWISE, as_target(target))


def reference(values: dict[str, np.ndarray]) -> np.ndarray:
    """TVM's CPU build of the same module: no warp, no mask."""
    from tvm_rtask.testing.run import run_executable

    return run_executable(tvm.compile(DEPTHWISE, "llvm"), values)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=("rtask", "tvm"), default="rtask")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    from tvm_rtask.testing.run import run_executable

    values = inputs()
    expected = reference(values)
    # the occupancy check compiles with nvcc: on the device it is there
    ex = persistent_build(verify_occupancy=True) if args.build == "rtask" else tvm_build()
    dev = tvm.cuda(0)
    errors = []
    for _ in range(args.repeat):
        actual = run_executable(ex, values, dev)[0]
        scale = max(float(np.abs(expected).max()), 1e-6)
        errors.append(float(np.abs(actual - expected).max()) / scale)
    ok = max(errors) <= TOLERANCE
    print(json.dumps({"build": args.build, "rel_err": errors, "ok": ok}), flush=True)
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
