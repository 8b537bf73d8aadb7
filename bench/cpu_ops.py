"""Per-operator CPU kernel quality: each PrimFunc of a model unscheduled vs scheduled by the
CPU rules (``tvm_rtask.backend.cpu.rules``), checked against each other, in one process.

Usage: python bench/cpu_ops.py [--models squeezenet inception_v1] [--target llvm]
       [--threads 1] [--repeat 10] [--only conv] [--json out.json]
       python bench/cpu_ops.py --e2e [--models ...] [--threads 2] [--rounds 3] [--json out.json]

Each distinct PrimFunc after ``RTaskPrepare`` is built twice with ``tvm.compile`` on the
same random inputs: as Relax legalized it (serial loops, what the llvm path compiled before
the rules) and as the first matching rule schedules it (its ``T.parallel`` loop runs on
``--threads`` workers). Prints median microseconds of both and the speed-up.

``--e2e``: whole models under ``tvm_rtask.compile(policy="wavefront")`` with the rules off
and on (``TVM_RTASK_CPU_RULES``), and ONNX Runtime on the same threads, each checked against
ONNX Runtime's numbers and timed in interleaved rounds (the medians of all rounds), so that
load from other processes hits every configuration alike.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import tvm
import tvm_ffi

import tvm_rtask
from tvm_rtask.backend.cpu.rules import RULE_ATTR, schedule_cpu_func
from tvm_rtask.relax_passes import RTaskPrepare
from tvm_rtask.runtime import set_num_threads
from tvm_rtask.testing.onnx_light import load_light_model


def prepared_funcs(name: str, target: tvm.target.Target) -> dict:
    mod = tvm_rtask.frontend.load(load_light_model(name))
    with target:
        mod = RTaskPrepare()(mod)
    funcs, seen = {}, set()
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            key = tvm_ffi.structural_hash(func)
            if key not in seen:
                seen.add(key)
                funcs[gv.name_hint] = func
    return funcs


def random_args(func, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    args = []
    for param in func.params:
        buf = param  # TVM 0.27: a PrimFunc's params are the buffers
        shape = [int(s) for s in buf.shape]
        args.append(tvm.runtime.tensor(rng.standard_normal(shape).astype(buf.dtype)))
    return args


def run(func, target, args, repeat: int) -> tuple[float, np.ndarray]:
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    lib = lib.jit() if hasattr(lib, "jit") else lib
    out = [tvm.runtime.tensor(np.zeros(a.shape, a.dtype)) for a in args[-1:]]
    call_args = [*args[:-1], *out]
    lib["main"](*call_args)
    timer = lib.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat, min_repeat_ms=20)
    us = float(timer(*call_args).median) * 1e6
    return us, out[0].numpy()


def bench_model(name: str, target, repeat: int, only: str | None) -> list[dict]:
    rows = []
    for fname, func in prepared_funcs(name, target).items():
        if only and only not in fname:
            continue
        scheduled = schedule_cpu_func(func, target)
        if scheduled is None:
            continue
        args = random_args(func)
        base_us, expect = run(func, target, args, repeat)
        rule_us, got = run(scheduled, target, args, repeat)
        err = float(np.max(np.abs(got - expect)) / max(np.max(np.abs(expect)), 1e-30))
        row = {
            "model": name,
            "func": fname,
            "rule": str(scheduled.attrs[RULE_ATTR]),
            "default_us": base_us,
            "rule_us": rule_us,
            "speedup": base_us / rule_us,
            "rel_error": err,
        }
        rows.append(row)
        print(
            f"{name:13s} {fname:36s} {row['rule']:12s} {base_us:10.1f} -> {rule_us:9.1f} us "
            f"x{row['speedup']:6.1f} err {err:.1e}",
            flush=True,
        )
    return rows


def _e2e_model(
    name: str, threads: int, warmup: int, repeat: int, rounds: int, target="llvm"
) -> dict:
    import os
    import time

    import onnxruntime as ort
    from tvm import relax

    from tvm_rtask.testing.onnx_light import (
        onnxruntime_outputs,
        random_inputs,
        relative_error,
    )

    model = load_light_model(name)
    inputs = random_inputs(model)
    reference = onnxruntime_outputs(model, inputs)
    mod = tvm_rtask.frontend.load(model)
    args = [tvm.runtime.tensor(v) for v in inputs.values()]
    runners, result = {}, {"name": name, "target": str(target), "configs": {}}
    for config, flag in (("rtask_wavefront_rules_off", "0"), ("rtask_wavefront_rules_on", "1")):
        os.environ["TVM_RTASK_CPU_RULES"] = flag
        start = time.perf_counter()
        ex = tvm_rtask.compile(mod, target, policy="wavefront", num_veu=threads)
        compile_s = time.perf_counter() - start
        set_num_threads(threads)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        out = vm["main"](*args)
        outs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
        error = max(relative_error(a, b) for a, b in zip(outs, reference, strict=True))
        if error > 1e-4:
            raise RuntimeError(f"{name} {config}: relative error {error:.2e} against ORT")
        result["configs"][config] = {"compile_s": round(compile_s, 2), "rel_error": error}
        runners[config] = lambda vm=vm: vm["main"](*args)
    os.environ.pop("TVM_RTASK_CPU_RULES", None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    runners["onnxruntime"] = lambda: session.run(None, inputs)
    result["configs"]["onnxruntime"] = {}
    samples = {c: [] for c in runners}
    for run_ in runners.values():
        for _ in range(warmup):
            run_()
    for _ in range(rounds):
        for config, run_ in runners.items():
            for _ in range(repeat):
                start = time.perf_counter()
                run_()
                samples[config].append((time.perf_counter() - start) * 1e3)
    for config, values in samples.items():
        p10, p50, p90 = np.percentile(values, [10, 50, 90])
        result["configs"][config].update(median_ms=p50, p10_ms=p10, p90_ms=p90)
        print(f"{name:13s} {config:28s} median {p50:9.2f} ms (p10 {p10:.2f}, p90 {p90:.2f})")
    ort_ms = result["configs"]["onnxruntime"]["median_ms"]
    for stats in result["configs"].values():
        stats["ratio_to_onnxruntime"] = stats["median_ms"] / ort_ms
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["squeezenet", "inception_v1"])
    parser.add_argument("--target", default="llvm", help="llvm or a JSON target dict")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--only", help="only PrimFuncs whose name contains this")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--e2e", action="store_true", help="whole models: rules off/on, ORT")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    target = tvm.target.Target(
        json.loads(args.target) if args.target.startswith("{") else args.target
    )
    if args.e2e:
        import platform

        threads = max(args.threads, 2) if args.threads == 1 else args.threads
        set_num_threads(threads)
        models = [
            _e2e_model(m, threads, args.warmup, args.repeat, args.rounds, target)
            for m in args.models
        ]
        for m in models:
            ratios = ", ".join(
                f"{c} {s['ratio_to_onnxruntime']:.1f}x" for c, s in m["configs"].items()
            )
            print(f"  {m['name']} vs ONNX Runtime: {ratios}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "device": f"cpu ({platform.processor() or platform.machine()}), "
                        f"{threads} threads",
                        "versions": {"tvm": tvm.__version__, "tvm_rtask": tvm_rtask.__version__},
                        "models": models,
                    },
                    f,
                    indent=1,
                )
        return
    set_num_threads(args.threads)
    rows = [r for m in args.models for r in bench_model(m, target, args.repeat, args.only)]
    total_base = sum(r["default_us"] for r in rows)
    total_rule = sum(r["rule_us"] for r in rows)
    print(f"sum over distinct scheduled PrimFuncs: {total_base:.0f} -> {total_rule:.0f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": str(target), "threads": args.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
