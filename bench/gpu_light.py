"""GPU latency of the ONNX light models under TVM's build and tvm-rtask, one process per run.

For each model (SqueezeNet, Inception v1, ResNet-50 from the onnx package's test data,
seeded random weights, batch 1): TVM's default build, TVM + CUDA graph, tvm-rtask
``sequential`` and ``wavefront`` (dependency counters, the CUDA default), ``wavefront``
with step arrays (``rtask_wavefront_fine``), ``wavefront`` with every rKernel body inlined
(``rtask_wavefront_inlined``: ``cuda_body_functions=False``, against the default's device
functions), ``wavefront`` with vEU ids claimed by SM (``rtask_wavefront_smid``:
``cuda_veu_placement="smid"``, against ``blockIdx.x``) and ``wavefront`` under a CUDA graph.
Every
configuration is checked against TVM's default output before it is timed; times are
medians of ``--repeat`` calls after warm-up, each call synchronised. One JSON line per
configuration is appended to ``--out`` the moment it is known (compile time included), so
a run cut short keeps what it measured.

    python3 bench/gpu_light.py --out $OUT/light.jsonl --deadline 500
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("squeezenet", "inception_v1", "resnet50")
CONFIGS = (
    "tvm_default",
    "tvm_cuda_graph",
    "rtask_sequential",
    "rtask_wavefront",
    "rtask_wavefront_fine",
    "rtask_wavefront_inlined",
    "rtask_wavefront_smid",
    "rtask_wavefront_cuda_graph",
)


def _build(config: str, mod, target):
    import tvm

    import tvm_rtask

    if config == "tvm_default":
        return tvm.compile(mod, target=target)
    if config == "tvm_cuda_graph":
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            return tvm.compile(mod, target=target)
    if config == "rtask_wavefront_fine":  # the step arrays, for comparison
        return tvm_rtask.compile(mod, target, policy="wavefront", barrier="fine")
    if config == "rtask_wavefront_inlined":  # bodies inlined, not device functions
        return tvm_rtask.compile(mod, target, policy="wavefront", cuda_body_functions=False)
    if config == "rtask_wavefront_smid":  # vEU v on SM v % SMs by a claim at kernel start
        return tvm_rtask.compile(mod, target, policy="wavefront", cuda_veu_placement="smid")
    if config == "rtask_wavefront_cuda_graph":
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            return tvm_rtask.compile(mod, target, policy="wavefront")
    policy = config.removeprefix("rtask_")
    return tvm_rtask.compile(mod, target, policy=policy)


def _time(vm, inputs, dev, warmup: int, repeat: int) -> list[float]:
    for _ in range(warmup):
        vm["main"](*inputs)
    dev.sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        vm["main"](*inputs)
        dev.sync()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _outputs(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [r.numpy() for r in result]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-results/light.jsonl")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--deadline", type=float, default=500.0, help="seconds from start")
    args = p.parse_args(argv)
    start = time.monotonic()

    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.testing.onnx_light import load_light_model

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dev = tvm.cuda(0)
    target = tvm.target.Target("cuda", host="llvm") if not dev.exist else None
    if dev.exist:
        arch = "sm_" + dev.compute_version.replace(".", "")
        target = tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")

    def write(record: dict) -> None:
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        print(json.dumps(record), flush=True)

    write({"type": "env", "device": dev.device_name if dev.exist else "none",
           "tvm": tvm.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "repeat": args.repeat, "warmup": args.warmup})  # fmt: skip
    for name in args.models.split(","):
        mod = tvm_rtask.frontend.load(load_light_model(name))
        rng = np.random.default_rng(0)
        shapes = [
            ([int(d) for d in p.ty.shape.values], str(p.ty.dtype)) for p in mod["main"].params
        ]
        host = [rng.standard_normal(s).astype(t) for s, t in shapes]
        inputs = [tvm.runtime.tensor(x, dev) for x in host]
        reference = None
        for config in args.configs.split(","):
            record = {"type": "result", "model": name, "config": config}
            if time.monotonic() - start > args.deadline:
                write({**record, "status": "not_reached"})
                continue
            try:
                t0 = time.monotonic()
                ex = _build(config, mod, target)
                record["compile_s"] = round(time.monotonic() - t0, 2)
                vm = relax.VirtualMachine(ex, dev)
                outs = _outputs(vm["main"](*inputs))
                if reference is None:
                    reference = outs
                err = max(
                    float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12))
                    for a, b in zip(outs, reference, strict=True)
                )
                record["rel_err"] = err
                if err > 1e-3:
                    write({**record, "status": "wrong", "reason": f"rel. error {err:.2e}"})
                    continue
                times = _time(vm, inputs, dev, args.warmup, args.repeat)
                record.update(
                    status="ok",
                    median_ms=float(np.median(times)),
                    min_ms=float(np.min(times)),
                    max_ms=float(np.max(times)),
                )
            except Exception as err:  # noqa: BLE001 - recorded, the next configuration goes on
                record.update(status="error", reason=f"{type(err).__name__}: {str(err)[:500]}")
                traceback.print_exc()
            write(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
