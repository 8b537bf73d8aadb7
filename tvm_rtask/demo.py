"""The main job on a built-in example: Inception v1 as persistent CPU kernels.

``python -m tvm_rtask.demo [--model inception_v1] [--threads 2]``

The model is the Inception v1 architecture that ships inside the ``onnx`` package, with seeded
random weights (no download). The demo plans it with the wavefront policy, prints the plan's
report, compiles it, checks the result against TVM's own default build of the same model and
prints both latencies.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _median_ms(fn, repeat: int) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return float(np.median(samples))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v1", help="a light model of onnx")
    parser.add_argument("--threads", type=int, default=2, help="vEUs = CPU worker threads")
    parser.add_argument("--policy", default="wavefront")
    parser.add_argument("--barrier", default="fine")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask.runtime import set_num_threads
    from tvm_rtask.testing.onnx_light import load_light_model, random_inputs, relative_error

    set_num_threads(args.threads)
    model = load_light_model(args.model)
    inputs = [tvm.runtime.tensor(v) for v in random_inputs(model).values()]
    mod = tvm_rtask.frontend.load(model)

    plan = tvm_rtask.plan(mod, "llvm", policy=args.policy, num_veu=args.threads)
    print(f"plan of {args.model} ({args.policy}, {args.threads} vEUs):")
    print(json.dumps(plan.report(), indent=1))

    start = time.perf_counter()
    ex = tvm_rtask.compile(
        mod, "llvm", policy=args.policy, barrier=args.barrier, num_veu=args.threads
    )
    print(f"compiled in {time.perf_counter() - start:.1f} s")
    reference_ex = tvm.compile(mod, target="llvm")

    vm = relax.VirtualMachine(ex, tvm.cpu())
    reference_vm = relax.VirtualMachine(reference_ex, tvm.cpu())
    ours, theirs = vm["main"](*inputs), reference_vm["main"](*inputs)
    ours = [ours.numpy()] if hasattr(ours, "numpy") else [o.numpy() for o in ours]
    theirs = [theirs.numpy()] if hasattr(theirs, "numpy") else [o.numpy() for o in theirs]
    error = max(relative_error(a, b) for a, b in zip(ours, theirs, strict=True))
    print(f"relative error against TVM's default build: {error:.2e}")
    if error > 1e-4:
        raise SystemExit("the persistent kernels disagree with TVM's default build")

    rtask_ms = _median_ms(lambda: vm["main"](*inputs), args.repeat)
    default_ms = _median_ms(lambda: reference_vm["main"](*inputs), args.repeat)
    print(
        f"median latency: TVM default build {default_ms:.1f} ms, "
        f"tvm-rtask {args.policy}/{args.barrier} {rtask_ms:.1f} ms "
        f"(ratio {rtask_ms / default_ms:.2f})"
    )


if __name__ == "__main__":
    main()
