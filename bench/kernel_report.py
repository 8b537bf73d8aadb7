"""Per-operator report: TVM's kernel, tvm-rtask's rKernel and PyTorch, operator by operator.

    python -m bench kernels --models squeezenet --target cuda --out kernels/
    python -m bench kernels --models lstm_tc --reduced --target llvm   # CPU smoke

TVM's default pipeline for the target runs up to its scheduled ``call_tir`` PrimFuncs (library
dispatch + legalize passes; dlight on CUDA). Each distinct operator (identical PrimFuncs once,
with their number of uses) is timed: ``tvm_kernel_ms``, the scheduled PrimFunc alone
(``tvm.compile``, ``time_evaluator``: no VM, no allocation); ``tvm_vm_ms``, a one-operator
Relax module (one ``call_tir`` of the unscheduled PrimFunc) through ``tvm.compile`` and its VM;
``rkernel_ms`` (:func:`rkernel_time`), the same module through ``tvm_rtask.compile(...,
policy="sequential")`` (one persistent kernel of one rKernel), or ``None`` and why;
``rules_on_ms`` / ``rules_off_ms`` (CUDA, operators a tvm-rtask CUDA rule takes), the PrimFunc
scheduled with tvm-rtask's CUDA rules and without them (dlight), both at the vEU's 256
threads, each alone (``rules_on_over_off``); ``torch_ms``, the operator's main computation in
``torch.nn.functional`` where it maps (conv2d with stride, padding and groups inferred from the
shapes, epilogue not included; matmul / dense), else ``None`` and why.

Ratios: ``rkernel_ms / tvm_vm_ms``, ``torch_ms / tvm_kernel_ms``; ``lost_ms`` = (rkernel -
tvm_vm) x uses, the time the model loses in that operator; rows sorted by it, largest first.
Writes ``kernel_report-<model>.json`` and ``.md`` to ``--out`` after every operator.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench import RESULTS
from bench.harness import device_name, make_target, one_line, time_calls

RKERNEL_METHOD = (
    "tvm_rtask.compile(one-operator module, policy='sequential'), VM call timed with "
    "time_evaluator (compare with tvm_vm_ms, the same module through tvm.compile)"
)


def _backend(target):
    from tvm.relax.backend import cpu_generic, cuda

    return cuda.pipeline if target.kind.name == "cuda" else cpu_generic.pipeline


def operator_modules(mod, target):
    """``(unscheduled, scheduled)`` modules: TVM's default passes up to FuseTIR, then its
    schedule rules (dlight on CUDA; nothing on CPU), with the same PrimFunc names."""
    import tvm

    backend = _backend(target)
    passes = backend.library_dispatch_passes(target) + backend.legalize_passes(target)
    schedule = [p for p in passes if p.info.name == "ApplyDefaultSchedule"]
    before = [p for p in passes if p.info.name != "ApplyDefaultSchedule"]
    with target:
        unscheduled = tvm.transform.Sequential(before)(mod)
        # on a copy: TVM 0.27's ApplyDefaultSchedule updates the module it is given in place
        copy = tvm.IRModule(dict(unscheduled.functions), attrs=unscheduled.attrs)
        scheduled = tvm.transform.Sequential(schedule)(copy) if schedule else unscheduled
    return unscheduled, scheduled


def distinct_operators(unscheduled) -> list[dict]:
    """Each distinct ``call_tir`` callee of ``main``: name, PrimFunc, uses, output info."""
    import tvm
    import tvm_ffi
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    ops: dict[str, dict] = {}
    by_hash: dict[int, str] = {}
    main = unscheduled["main"]

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
            gvar = expr.args[0]
            func = unscheduled[gvar]
            h = tvm_ffi.structural_hash(func)
            name = by_hash.setdefault(h, gvar.name_hint)
            if name in ops:
                ops[name]["uses"] += 1
            else:
                ops[name] = {"name": name, "gvar": gvar, "func": func, "uses": 1}

    relax.analysis.post_order_visit(main.body, visit)
    return list(ops.values())


def _buffers(func) -> list[tuple[tuple[int, ...], str]]:
    """Shape and dtype of each buffer parameter (TVM 0.27: ``param.ty`` is a BufferType;
    older TVM: ``func.buffer_map``)."""
    out = []
    for param in func.params:
        buf = func.buffer_map[param] if hasattr(func, "buffer_map") else param.ty
        if not hasattr(buf, "shape"):
            continue
        out.append((tuple(int(d) for d in buf.shape), str(buf.dtype)))
    return out


def _random_args(buffers, dev, seed: int = 0):
    import tvm

    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dtype in buffers:
        if dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "bool":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:  # indices: zero is in bounds for every gather
            arrays.append(np.zeros(shape, dtype=dtype))
    return arrays, [tvm.runtime.tensor(a, dev) for a in arrays]


def _median_ms(timer, *args) -> dict:
    samples = [r * 1e3 for r in timer(*args).results]
    values = {"median_ms": np.median(samples), "min_ms": np.min(samples), "max_ms": np.max(samples)}
    return {k: float(v) for k, v in values.items()} | {"repeat": len(samples)}


def tvm_kernel_time(op: dict, scheduled, target, dev, repeat: int) -> dict:
    return kernel_time(scheduled[op["name"]], target, dev, repeat)


def kernel_time(func, target, dev, repeat: int) -> dict:
    """A scheduled PrimFunc alone, timed with ``time_evaluator``."""
    import tvm

    func = func.with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
    lib = lib.jit() if hasattr(lib, "jit") else lib
    _, args = _random_args(_buffers(func), dev)
    timer = lib.time_evaluator("main", dev, number=10, repeat=repeat, min_repeat_ms=1)
    return _median_ms(timer, *args)


def rules_times(op: dict, target, dev, repeat: int) -> dict:
    """``rules_on_ms`` / ``rules_off_ms``: the operator scheduled by tvm-rtask's CUDA rules
    and by dlight (``schedule_for_cuda(rules=False)``) at the vEU's thread cap, timed alone;
    {} when no rule takes the operator."""
    from tvm_rtask.backend.cuda.backend import schedule_target
    from tvm_rtask.backend.cuda.rkernel import schedule_for_cuda
    from tvm_rtask.backend.cuda.rules import RULE_ATTR

    capped = schedule_target(target, 256)
    on = schedule_for_cuda(op["func"], capped, rules=True)
    if on.attrs is None or RULE_ATTR not in on.attrs:
        return {}
    off = schedule_for_cuda(op["func"], capped, rules=False)
    times = {"rule": str(on.attrs[RULE_ATTR])}
    times["rules_on_ms"] = kernel_time(on, capped, dev, repeat)["median_ms"]
    times["rules_off_ms"] = kernel_time(off, capped, dev, repeat)["median_ms"]
    times["rules_on_over_off"] = times["rules_on_ms"] / times["rules_off_ms"]
    return times


def one_operator_module(op: dict):
    """A Relax module whose ``main`` is one ``call_tir`` of ``op``'s unscheduled PrimFunc
    (its last parameter is the output, as ``call_tir`` lowers it)."""
    import tvm
    from tvm import relax

    func = op["func"]
    buffers = _buffers(func)
    *inputs, (out_shape, out_dtype) = buffers
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            gvar = bb.add_func(func.without_attr("global_symbol"), op["name"])
            call = relax.call_tir(gvar, params, relax.TensorType(out_shape, out_dtype))
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    mod = bb.get()
    # FuseTIR's attributes (op pattern) make the operator a candidate for rTask planning.
    return tvm.IRModule(mod.functions), inputs


def _vm_time(ex, inputs, dev, repeat: int) -> dict:
    from tvm import relax

    vm = relax.VirtualMachine(ex, dev)
    _, args = _random_args(inputs, dev)
    timer = vm.time_evaluator("main", dev, number=10, repeat=repeat, min_repeat_ms=1)
    return _median_ms(timer, *args)


def tvm_vm_time(op: dict, target, dev, repeat: int) -> dict:
    import tvm

    mod, inputs = one_operator_module(op)
    return _vm_time(tvm.compile(mod, target=target), inputs, dev, repeat)


def rkernel_time(op: dict, target, dev, repeat: int) -> tuple[dict | None, str]:
    """tvm-rtask's rKernel of ``op`` standalone: ``(timing, method)`` or ``(None, reason)``.

    For now the rKernel is timed as the one-operator module compiled by tvm-rtask with the
    sequential policy (one persistent kernel holding that rKernel), through the VM.
    """
    try:
        import tvm_rtask

        mod, inputs = one_operator_module(op)
        ex = tvm_rtask.compile(mod, target, policy="sequential")
        timing = _vm_time(ex, inputs, dev, repeat)
        try:  # whether the operator became an rKernel or stayed an ordinary kernel
            report = tvm_rtask.plan(mod, target, policy="sequential").report()
            keys = ("rprograms", "kernel_launches", "ordinary_ops")
            timing["plan"] = {k: report.get(k) for k in keys}
        except Exception as err:
            timing["plan"] = {"error": str(err)[:200]}
        return timing, RKERNEL_METHOD
    except Exception as err:
        return None, f"not available: {one_line(err)}"


def _conv_params(x, w, y):
    """stride, padding, groups of a 2-D convolution, inferred from NCHW / OIHW shapes."""
    groups = x[1] // w[1] if w[1] else 1
    found = []
    for dim in (2, 3):
        size, kernel, out = x[dim], w[dim], y[dim]
        pairs = ((s, p) for s in range(1, 5) for p in range(0, kernel + 1))
        match = next(((s, p) for s, p in pairs if (size + 2 * p - kernel) // s + 1 == out), None)
        if match is None:
            return None
        found.append(match)
    return (found[0][0], found[1][0]), (found[0][1], found[1][1]), groups


def torch_equivalent(op: dict):
    """``(callable(torch_tensors) -> tensor, input shapes, description)`` or ``(None, why)``."""
    name = op["name"].removeprefix("fused_")
    buffers = _buffers(op["func"])
    if len(buffers) < 3:
        return None, f"no torch mapping for {op['name']}"
    (a, adt), (b, _), (y, _) = buffers[0], buffers[1], buffers[-1]
    if not adt.startswith("float"):
        return None, f"no torch mapping for {adt} operands"
    if name.startswith("conv2d") and len(a) == 4 and len(b) == 4 and len(y) == 4:
        params = _conv_params(a, b, y)
        if params is None or a[1] != b[1] * params[2]:
            return None, "conv2d: stride/padding not inferable from the shapes"
        stride, padding, groups = params

        def conv(F, x, w):
            return F.conv2d(x, w, stride=stride, padding=padding, groups=groups)

        desc = f"conv2d stride {stride} padding {padding} groups {groups} (epilogue not included)"
        return (conv, [a, b], desc), ""
    if name.startswith(("matmul", "dense", "NT_matmul", "linear")) and len(a) >= 2:
        k = a[-1]
        if len(b) >= 2 and b[-2] == k and b[-1] == y[-1]:
            return (lambda F, x, w: x @ w, [a, b], "matmul (epilogue not included)"), ""
        if len(b) == 2 and b[-1] == k and b[0] == y[-1]:
            return (lambda F, x, w: F.linear(x, w), [a, b], "linear x @ w.T"), ""
        return None, f"matmul shapes {a} x {b} -> {y} not mapped"
    return None, f"no torch mapping for {op['name']}"


def torch_time(op: dict, gpu: bool, repeat: int) -> tuple[dict | None, str]:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed"
    mapped, why = torch_equivalent(op)
    if mapped is None:
        return None, why
    fn, shapes, desc = mapped
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda" if gpu else "cpu"
    if gpu and not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    args = [torch.randn(s, device=device) for s in shapes]

    number = 10  # calls per sample, as time_evaluator(number=10) on TVM's side

    def call():
        with torch.inference_mode():
            for _ in range(number):
                fn(F, *args)

    sync = torch.cuda.synchronize if gpu else None
    stats = time_calls(call, 3, repeat, sync, 5.0)
    for key in ("median_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "mean_ms"):
        stats[key] /= number
    return stats, desc


def _fmt(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict) -> str:
    lines = [f"# Kernel report: {report['model']} on {report['target']} ({report['device']})"]
    lines += ["", f"rKernel column: {report['rkernel_method']}", ""]
    lines.append("| operator | uses | TVM kernel ms | TVM VM ms | rKernel ms | rKernel/TVM VM | "
                 "rules on ms | rules off ms | on/off | torch ms | torch/TVM kernel | lost ms | "
                 "notes |")  # fmt: skip
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in report["operators"]:
        notes = "; ".join(n for n in (row.get("rkernel_note"), row.get("torch_note")) if n)
        if row.get("error"):
            notes = row["error"]
        get = row.get
        lines.append(f"| {row['name']} | {row['uses']} | {_fmt(get('tvm_kernel_ms'))} | "
                     f"{_fmt(get('tvm_vm_ms'))} | {_fmt(get('rkernel_ms'))} | "
                     f"{_fmt(get('rkernel_over_tvm_vm'), 2)} | {_fmt(get('rules_on_ms'))} | "
                     f"{_fmt(get('rules_off_ms'))} | {_fmt(get('rules_on_over_off'), 2)} | "
                     f"{_fmt(get('torch_ms'))} | {_fmt(get('torch_over_tvm_kernel'), 2)} | "
                     f"{_fmt(get('lost_ms'))} | {notes[:160]} |")  # fmt: skip
    if report.get("not_reached"):
        lines += ["", f"Not reached before the deadline: {', '.join(report['not_reached'])}"]
    return "\n".join(lines) + "\n"


def _save(stem: Path, report: dict) -> None:
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(report))


def _sort(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: -(r.get("lost_ms") if r.get("lost_ms") is not None else -1e9))


def report_model(name: str, args, out: Path) -> dict:
    import tvm

    import tvm_rtask.models as zoo
    from tvm_rtask import frontend

    gpu = args.target == "cuda"
    target = make_target(args.target)
    dev = tvm.cuda(0) if gpu else tvm.cpu()
    mod = frontend.load(zoo.onnx_model(name, reduced=args.reduced))
    unscheduled, scheduled = operator_modules(mod, target)
    ops = distinct_operators(unscheduled)
    if args.max_ops:
        ops = ops[: args.max_ops]
    device = device_name(args.target, 1) if gpu else "cpu"
    report = {"model": name, "reduced": args.reduced, "target": str(target), "device": device}
    report["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    report.update(rkernel_method=RKERNEL_METHOD, operators=[], not_reached=[])
    stem = out / f"kernel_report-{name}"
    for op in ops:
        if time.time() > args.deadline_at:
            report["not_reached"].append(op["name"])
            continue
        row = {"name": op["name"], "uses": op["uses"], "shapes": _buffers(op["func"])}
        try:
            kernel = tvm_kernel_time(op, scheduled, target, dev, args.repeat)
            row["tvm_kernel_ms"] = kernel["median_ms"]
            row["tvm_vm_ms"] = tvm_vm_time(op, target, dev, args.repeat)["median_ms"]
        except Exception as err:
            row["error"] = f"TVM build failed: {one_line(err)}"
        rk, note = rkernel_time(op, target, dev, args.repeat)
        row["rkernel_ms"] = rk["median_ms"] if rk else None
        row["rkernel_note"] = None if rk else note
        if rk and rk.get("plan"):
            row["rkernel_plan"] = rk["plan"]
            if rk["plan"].get("rprograms") == 0:
                row["rkernel_note"] = "stays an ordinary kernel (no rProgram)"
        if gpu:
            try:
                row.update(rules_times(op, target, dev, args.repeat))
            except Exception as err:
                row["rules_error"] = f"rules on/off not timed: {one_line(err)}"
        th, tnote = torch_time(op, gpu, args.repeat)
        row["torch_ms"] = th["median_ms"] if th else None
        row["torch_note"] = tnote
        if row.get("rkernel_ms") is not None and row.get("tvm_vm_ms"):
            row["rkernel_over_tvm_vm"] = row["rkernel_ms"] / row["tvm_vm_ms"]
            row["lost_ms"] = (row["rkernel_ms"] - row["tvm_vm_ms"]) * op["uses"]
        if row.get("torch_ms") is not None and row.get("tvm_kernel_ms"):
            row["torch_over_tvm_kernel"] = row["torch_ms"] / row["tvm_kernel_ms"]
        report["operators"] = _sort([*report["operators"], row])
        _save(stem, report)
        print(f"{name:12s} {op['name'][:40]:40s} tvm {_fmt(row.get('tvm_kernel_ms'))} ms, "
              f"rkernel {_fmt(row.get('rkernel_ms'))} ms, torch {_fmt(row.get('torch_ms'))} ms",
              flush=True)  # fmt: skip
    _save(stem, report)
    if report["not_reached"]:
        print(f"NOT REACHED ({name}): {len(report['not_reached'])} operator(s)", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--models", nargs="+", default=["squeezenet"])
    add("--target", choices=["llvm", "cuda"], default="llvm")
    add("--reduced", action="store_true")
    add("--repeat", type=int, default=20, help="time_evaluator repeats")
    add("--max-ops", type=int, default=0, help="only the first N operators")
    add("--out", default=str(RESULTS))
    add("--deadline-at", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        if time.time() > args.deadline_at:
            print(f"NOT REACHED: model {name}", flush=True)
            continue
        report_model(name, args, out)
        print(f"-> {out / f'kernel_report-{name}.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
