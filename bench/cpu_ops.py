"""Per-operator CPU kernel quality: each operator of a model with tvm-rtask's CPU schedule
rules, against ONNX Runtime and against the unscheduled TIR, and whole models.

Usage: python bench/cpu_ops.py [--models squeezenet inception_v1] [--target llvm-native]
       [--threads 1] [--repeat 10] [--only conv] [--json out.json]
       python bench/cpu_ops.py --ort [--models ...] [--threads 2] [--rounds 3] [--json out.json]
       python bench/cpu_ops.py --e2e [--models ...] [--threads 2] [--rounds 3] [--json out.json]

The target (``--target``, default ``llvm-native``: LLVM for this machine's CPU) is the same
for every tvm-rtask and TVM configuration compared; plain ``llvm`` compiles for a generic
x86-64 (SSE2) and is what TVM means by it.

Default mode: each distinct PrimFunc after ``RTaskPrepare`` is built twice with
``tvm.compile`` on the same random inputs: as Relax legalized it (serial loops) and as the
first matching rule schedules it (its ``T.parallel`` loop runs on ``--threads`` workers).
Prints median microseconds of both and the speed-up.

``--ort``: the per-operator report against ONNX Runtime. Each distinct operator of the ONNX
model (a node, or a Conv / Gemm / MatMul with the BatchNormalization, Add / Sum and Relu
that alone consume it in turn, which both TVM and ONNX Runtime fuse) becomes a one-operator
ONNX model with the model's weights; that same file is compiled by
``tvm_rtask.compile(policy="sequential")`` (rules on) and run by ONNX Runtime
(``intra_op_num_threads = --threads``), both checked against each other and timed in
interleaved rounds. Rows sorted by the time tvm-rtask loses to ONNX Runtime over all uses of
the operator in the model; the rule that scheduled it is named. ``--baseline RULES`` builds
each operator a second time with another rule set (e.g. the rule before a change:
``'[Conv2dNCHW(narrow_strided=False), MatmulKN()]'``) and times it in the same interleaved
rounds; ``--markdown FILE`` writes the report as a table.

``--e2e``: whole models under ``tvm_rtask.compile(policy="wavefront")`` with the rules off
and on (option ``cpu_rules``, both with ``db=False``: no tuning records), with the record set
shipped for the target when there is one (``db`` unset, as ``compile`` does by default:
``rtask_wavefront_shipped_set``), and ONNX Runtime on the same threads, each checked against
ONNX Runtime's numbers; the rules-on and shipped-set builds and ONNX Runtime are timed in
interleaved rounds (the medians of all rounds), so that load from other processes hits them
alike, the much slower rules-off build in its own rounds afterwards (``--skip-rules-off``
leaves it out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shlex
import sys
import time

import numpy as np
import tvm
import tvm_ffi

import tvm_rtask
from tvm_rtask.backend import as_target
from tvm_rtask.backend.cpu.rules import RULE_ATTR, schedule_cpu_func
from tvm_rtask.relax_passes import RTaskPrepare
from tvm_rtask.runtime import set_num_threads
from tvm_rtask.testing.onnx_light import load_light_model

# Seconds between the blocks of interleaved calls (see ``interleaved``).
PAUSE_S = 0.1
# One operator of the ONNX model: these start a chain with what alone consumes them in turn
# (FUSED_AFTER, in this order, each at most once: batch norm, the residual add, relu), which
# both TVM (FuseOps) and ONNX Runtime (its Conv fusions) run as one kernel.
FUSES_RELU = ("Conv", "Gemm", "MatMul")
FUSED_AFTER = (("BatchNormalization",), ("Add", "Sum"), ("Relu",))


def load_model(name: str):
    """An onnx light model, or ``real:<name>[:reduced]``: a torchvision architecture of
    ``tvm_rtask.models.real`` (full size unless ``:reduced``), both with seeded weights."""
    if name.startswith("real:"):
        from tvm_rtask.models.real import load_real_model

        arch, _, size = name.removeprefix("real:").partition(":")
        return load_real_model(arch, size=size or "full", seed=0)
    return load_light_model(name)


def prepared_funcs(name_or_mod, target: tvm.target.Target) -> dict:
    """The distinct PrimFuncs of a light model (or a Relax module) after ``RTaskPrepare``."""
    if isinstance(name_or_mod, str):
        mod = tvm_rtask.frontend.load(load_model(name_or_mod))
    else:
        mod = name_or_mod
    with target:
        mod = RTaskPrepare(target=target)(mod)
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


# The clock of ``interleaved``: wall time, or (``--cpu-time``) the calling thread's CPU time,
# which leaves out the time the thread waits while other processes run: with one thread both
# runtimes compute in the calling thread (TVM's pool of one runs the task inline, ONNX
# Runtime's intra-op pool of one is the caller), so on a loaded machine it is the steadier
# measure (min and median a few percent apart where wall times varied 10x).
CLOCK = time.perf_counter


def interleaved(runners: dict, warmup: int, repeat: int, rounds: int) -> dict[str, dict]:
    """Median, p10 and p90 (ms) of each runner: ``warmup`` calls each, then ``rounds`` rounds
    of ``repeat`` calls of every runner in turn (load from other processes hits them alike),
    a pause of ``PAUSE_S`` before each block. Timed with :data:`CLOCK`."""
    samples = {c: [] for c in runners}
    for run_ in runners.values():
        for _ in range(warmup):
            run_()
    for _ in range(rounds):
        for config, run_ in runners.items():
            # let the other runtime's worker threads stop spinning (TVM's pool and ONNX
            # Runtime's both spin after a call) before this one is timed
            time.sleep(PAUSE_S)
            for _ in range(repeat):
                start = CLOCK()
                run_()
                samples[config].append((CLOCK() - start) * 1e3)
    stats = {}
    for config, values in samples.items():
        p10, p50, p90 = np.percentile(values, [10, 50, 90])
        stats[config] = {
            "median_ms": float(p50),
            "p10_ms": float(p10),
            "p90_ms": float(p90),
            "min_ms": float(np.min(values)),
        }
    return stats


def ort_session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _vm_outputs(out) -> list[np.ndarray]:
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


# -- per operator against ONNX Runtime --------------------------------------------------------
def _shapes(model) -> dict[str, list[int]]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model).graph
    shapes = {}
    for value in [*inferred.input, *inferred.value_info, *inferred.output]:
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [d.dim_value for d in dims]
    return shapes


def _folded_constants(model, inits: dict) -> dict:
    """The outputs of nodes that read only constants (e.g. a Reshape of a weight), as
    initializers: TVM folds them at compile time, so they are no operator of the model."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    known, values = set(inits), {}
    for node in model.graph.node:
        if node.input and all(not i or i in known for i in node.input):
            feeds = {i: numpy_helper.to_array(inits[i]) for i in node.input if i in inits}
            feeds.update({i: values[i] for i in node.input if i in values})
            single = _single_node_model(model, node, feeds)
            outputs = ReferenceEvaluator(single).run(None, {})
            for name, value in zip(node.output, outputs, strict=True):
                values[name] = value
                known.add(name)
    return {n: numpy_helper.from_array(np.asarray(v), n) for n, v in values.items()}


def _single_node_model(model, node, feeds: dict):
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        [node],
        "fold",
        [],
        [helper.make_empty_tensor_value_info(o) for o in node.output],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in feeds.items()],
    )
    return helper.make_model(graph, opset_imports=list(model.opset_import))


def onnx_operators(model) -> list[dict]:
    """Each distinct operator of ``model``: ``{"key", "ops", "nodes", "uses", "model"}``, where
    ``model`` is a one-operator ONNX model (the node, or a Conv / Gemm / MatMul and the Relu
    that alone consumes its output) holding the weights it reads. Operators with the same
    node types, attributes and shapes are counted once, with their number of uses."""
    import onnx
    from onnx import helper

    graph = model.graph
    shapes = _shapes(model)
    inits = {t.name: t for t in graph.initializer}
    inits.update(_folded_constants(model, inits))
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    nodes = [n for n in graph.node if not all(o in inits for o in n.output)]
    groups, i = [], 0
    while i < len(nodes):
        group = [nodes[i]]
        if nodes[i].op_type in FUSES_RELU:
            stage = 0
            while i + len(group) < len(nodes):
                nxt, last = nodes[i + len(group)], group[-1].output[0]
                kinds = [k for k, types in enumerate(FUSED_AFTER) if nxt.op_type in types]
                if (
                    not kinds
                    or kinds[0] < stage
                    or last not in nxt.input
                    or consumers.get(last) != 1
                    or (nxt.op_type == "BatchNormalization" and nxt.input[0] != last)
                ):
                    break
                group.append(nxt)
                stage = kinds[0] + 1
        groups.append(group)
        i += len(group)
    found: dict[str, dict] = {}
    elem = onnx.TensorProto.FLOAT
    for group in groups:
        if group[0].op_type in ("Dropout", "Identity"):
            continue  # nothing to compute at inference
        produced = {o for n in group for o in n.output}
        inputs, weights = [], []
        for n in group:
            for name in n.input:
                if not name or name in produced:
                    continue
                if name in inits:
                    weights.append(inits[name])
                elif name not in [v.name for v in inputs]:
                    inputs.append(helper.make_tensor_value_info(name, elem, shapes[name]))
        out = group[-1].output[0]
        key = json.dumps(
            [
                [n.op_type, sorted(str(helper.get_attribute_value(a)) for a in n.attribute)]
                for n in group
            ]
            + [[shapes.get(v.name) for v in inputs], [list(w.dims) for w in weights]]
        )
        if key in found:
            found[key]["uses"] += 1
            continue
        mini = helper.make_graph(
            group,
            "op",
            inputs,
            [helper.make_tensor_value_info(out, elem, shapes[out])],
            weights,
        )
        mini_model = helper.make_model(mini, opset_imports=list(model.opset_import))
        mini_model.ir_version = model.ir_version
        found[key] = {
            "key": key,
            "ops": "+".join(n.op_type for n in group),
            "nodes": [n.name or n.output[0] for n in group],
            "input_shapes": [shapes.get(v.name) for v in inputs],
            "weight_shapes": [list(w.dims) for w in weights],
            "strides": next(
                (
                    list(helper.get_attribute_value(a))
                    for a in group[0].attribute
                    if a.name == "strides"
                ),
                None,
            ),
            "output_shape": shapes[out],
            "uses": 1,
            "model": mini_model,
        }
    return list(found.values())


def _rules_of(mod, target) -> list[str]:
    """The CPU rules that schedule the operators of ``mod`` (a Relax module)."""
    names = []
    for func in prepared_funcs(mod, target).values():
        scheduled = schedule_cpu_func(func, target)
        if scheduled is not None:
            names.append(str(scheduled.attrs[RULE_ATTR]))
    return names


@contextlib.contextmanager
def rule_set(expression: str | None):
    """Within: ``schedule_cpu_func`` tries the rules of ``expression`` (Python, evaluated
    with the names of ``tvm_rtask.backend.cpu.rules``, e.g. ``"[Conv2dNCHW(narrow_strided=
    False), MatmulKN()]"``) instead of its default rules; nothing changes for None."""
    from tvm_rtask.backend.cpu import rules as rules_module

    if expression is None:
        yield
        return
    chosen = eval(expression, dict(vars(rules_module)))  # noqa: S307 (a bench option)
    saved = rules_module.default_rules
    rules_module.default_rules = lambda: list(chosen)
    try:
        yield
    finally:
        rules_module.default_rules = saved


# ``--stacked-sum``: apply relax_passes/stacked_sum.py (not in the pipeline yet) to the
# imported module before tvm-rtask compiles it
PRE_PASSES: list = []


def load_module(model):
    """``tvm_rtask.frontend.load(model)`` with :data:`PRE_PASSES` applied."""
    from tvm import relax

    mod = tvm_rtask.frontend.load(model)
    if PRE_PASSES:
        mod = relax.transform.DeadCodeElimination()(tvm.transform.Sequential(PRE_PASSES)(mod))
    return mod


def ort_report(
    name: str,
    target,
    threads: int,
    warmup: int,
    repeat: int,
    rounds: int,
    only=None,
    baseline: str | None = None,
) -> dict:
    """Per operator of light model ``name``: tvm-rtask (sequential, rules on) and ONNX Runtime
    on the same one-operator ONNX model; see the module docstring. ``baseline``: another rule
    set (see :func:`rule_set`) built too, without :data:`PRE_PASSES`, and timed in the same
    interleaved rounds (``rtask_baseline_ms``), for before/after pairs of a change."""
    from tvm import relax

    from tvm_rtask.testing.onnx_light import random_inputs, relative_error

    rows, failed = [], []
    for op in onnx_operators(load_model(name)):
        if only and only not in op["ops"]:
            continue
        inputs = random_inputs(op["model"])
        mod = load_module(op["model"])
        try:
            # the rules alone (db=False): a shipped record set is timed by --e2e
            ex = tvm_rtask.compile(mod, target, policy="sequential", num_veu=threads, db=False)
            if baseline is not None:
                # the state before: the baseline's rules, and no PRE_PASSES
                base_mod = tvm_rtask.frontend.load(op["model"])
                with rule_set(baseline):
                    ex_base = tvm_rtask.compile(
                        base_mod, target, policy="sequential", num_veu=threads, db=False
                    )
                    base_rules = _rules_of(base_mod, target)
        except Exception as err:  # reported, not fatal: the other operators still count
            message = str(err).strip().splitlines()[-1][:200]
            print(f"{name:13s} {op['ops']:10s} {str(op['input_shapes'][:1]):22s} failed: {message}")
            row = {k: v for k, v in op.items() if k not in ("model", "key")}
            failed.append({**row, "error": message})
            continue
        set_num_threads(threads)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        args = [tvm.runtime.tensor(v) for v in inputs.values()]
        session = ort_session(op["model"], threads)
        got = _vm_outputs(vm["main"](*args))
        expected = session.run(None, inputs)
        error = max(relative_error(a, b) for a, b in zip(got, expected, strict=True))
        runners = {
            "rtask": lambda vm=vm, args=args: vm["main"](*args),
            "onnxruntime": lambda s=session, x=inputs: s.run(None, x),
        }
        if baseline is not None:
            vm_base = relax.VirtualMachine(ex_base, tvm.cpu())
            error = max(
                error,
                *(
                    relative_error(a, b)
                    for a, b in zip(_vm_outputs(vm_base["main"](*args)), expected, strict=True)
                ),
            )
            runners["rtask_baseline"] = lambda vm=vm_base, args=args: vm["main"](*args)
        stats = interleaved(runners, warmup, repeat, rounds)
        rt, ort_ms = stats["rtask"]["median_ms"], stats["onnxruntime"]["median_ms"]
        row = {k: v for k, v in op.items() if k not in ("model", "key")}
        row.update(
            rules=_rules_of(mod, target),
            rtask_ms=rt,
            onnxruntime_ms=ort_ms,
            ratio=rt / ort_ms,
            lost_ms=(rt - ort_ms) * op["uses"],
            rel_error=error,
            stats=stats,
        )
        base = ""
        if baseline is not None:
            base_ms = stats["rtask_baseline"]["median_ms"]
            row.update(baseline_rules=base_rules, rtask_baseline_ms=base_ms)
            base = f"  (baseline {base_ms:8.3f} ms, x{base_ms / rt:4.2f})"
        rows.append(row)
        print(
            f"{name:13s} {row['ops']:10s} {str(op['input_shapes'][:1]):22s} x{op['uses']:<2d} "
            f"rtask {rt:8.3f} ms  ORT {ort_ms:8.3f} ms  {rt / ort_ms:5.1f}x  "
            f"{','.join(row['rules']) or '-':14s} err {error:.1e}{base}",
            flush=True,
        )
    rows.sort(key=lambda r: -r["lost_ms"])
    total = {
        "rtask_ms": sum(r["rtask_ms"] * r["uses"] for r in rows),
        "onnxruntime_ms": sum(r["onnxruntime_ms"] * r["uses"] for r in rows),
    }
    if baseline is not None:
        total["rtask_baseline_ms"] = sum(r["rtask_baseline_ms"] * r["uses"] for r in rows)
    print(
        f"{name}: sum over operators x uses: tvm-rtask {total['rtask_ms']:.2f} ms, "
        f"ONNX Runtime {total['onnxruntime_ms']:.2f} ms; largest losses:"
    )
    for r in rows[:8]:
        print(
            f"  {r['ops']:10s} {str(r['input_shapes'][:1]):24s} x{r['uses']:<2d} "
            f"lost {r['lost_ms']:7.3f} ms ({r['ratio']:.1f}x)"
        )
    return {"name": name, "total": total, "operators": rows, "failed": failed}


def markdown_report(doc: dict, top: int = 15) -> str:
    """The ``--ort`` report as Markdown: per model the sums and the ``top`` operators by time
    lost to ONNX Runtime (with the baseline rule set's time when there is one)."""
    machine = doc["machine"]
    lines = [
        f"# Per-operator CPU report against ONNX Runtime ({doc['date']})",
        "",
        "**Measured under load from other jobs; ratios only.** The machine "
        f"({machine['cpu']}, LLVM `{machine['llvm_host_cpu']}`) was shared with other "
        f"sessions' builds and tests (load average {machine['load_average']} before, "
        f"{machine.get('load_average_after')} after, on 2 cores): absolute times are "
        "inflated and noisy; tvm-rtask, its baseline and ONNX Runtime were timed interleaved "
        "in one process, so their ratios are what to read.",
        "",
        f"Command: `{doc['command']}`; target `{doc['target']}`, {machine['threads']} "
        f"thread(s) for both runtimes; medians of {doc.get('clock', 'wall time')}. "
        "Each row is one distinct operator of the ONNX model as a one-operator ONNX model "
        "(a Conv / Gemm with the batch norm, residual add "
        "and relu that alone consume it in turn, as both runtimes fuse them), built by "
        '`tvm_rtask.compile(policy="sequential", db=False)` (rules only) and run by ONNX '
        "Runtime; `lost` is (tvm-rtask - ONNX Runtime) x uses."
        + (
            f" Relax passes applied before compiling: {', '.join(doc['pre_passes'])}."
            if doc.get("pre_passes")
            else ""
        )
        + (f" Code: {doc['code']}." if doc.get("code") else ""),
    ]
    for model in doc["models"]:
        total = model["total"]
        has_base = "rtask_baseline_ms" in total
        lines += [
            "",
            f"## {model['name']}",
            "",
            f"Sum over operators x uses: tvm-rtask {total['rtask_ms']:.2f} ms, ONNX Runtime "
            f"{total['onnxruntime_ms']:.2f} ms ({total['rtask_ms'] / total['onnxruntime_ms']:.2f}x)"
            + (f"; baseline rules {total['rtask_baseline_ms']:.2f} ms" if has_base else ""),
            "",
            "| operator | input | weight / stride | output | uses | rule | tvm-rtask ms | "
            + ("baseline ms | " if has_base else "")
            + "ORT ms | ratio | lost ms | rel. error |",
            "|---|---|---|---|---:|---|---:|"
            + ("---:|" if has_base else "")
            + "---:|---:|---:|---:|",
        ]
        for r in model["operators"][:top]:
            shape = "x".join(str(d) for d in r["input_shapes"][0][1:]) if r["input_shapes"] else ""
            out = "x".join(str(d) for d in r["output_shape"][1:])
            base = f"{r['rtask_baseline_ms']:.3f} | " if has_base else ""
            weights = r.get("weight_shapes") or []
            weight = "x".join(str(d) for d in weights[0]) if weights else ""
            if r.get("strides") and max(r["strides"]) > 1:
                weight += f" /{r['strides'][0]}"
            lines.append(
                f"| {r['ops']} | {shape} | {weight} | {out} | {r['uses']} | "
                f"{','.join(r['rules']) or 'none'} | {r['rtask_ms']:.3f} | {base}"
                f"{r['onnxruntime_ms']:.3f} | {r['ratio']:.2f}x | {r['lost_ms']:.3f} | "
                f"{r['rel_error']:.1e} |"
            )
        rest = model["operators"][top:]
        if rest:
            lines.append(
                f"\n{len(rest)} more operators: {sum(r['lost_ms'] for r in rest):.3f} ms lost "
                "in all (negative: faster than ONNX Runtime); all rows in the JSON file."
            )
        for f in model["failed"]:
            lines.append(f"\nFailed: {f['ops']} {f['input_shapes']}: {f['error']}")
    return "\n".join(lines) + "\n"


# -- whole models -------------------------------------------------------------------------------
def _e2e_model(
    name: str,
    threads: int,
    warmup: int,
    repeat: int,
    rounds: int,
    target,
    skip_rules_off: bool = False,
) -> dict:
    from tvm import relax

    from tvm_rtask.records.sets import resolve_db
    from tvm_rtask.testing.onnx_light import (
        onnxruntime_outputs,
        random_inputs,
        relative_error,
    )

    model = load_model(name)
    inputs = random_inputs(model)
    reference = onnxruntime_outputs(model, inputs)
    mod = load_module(model)
    args = [tvm.runtime.tensor(v) for v in inputs.values()]
    runners, result = {}, {"name": name, "target": str(target), "configs": {}}
    configs = [
        ("rtask_wavefront_rules_off", False, False),
        ("rtask_wavefront_rules_on", True, False),
    ]
    if skip_rules_off:
        configs = configs[1:]
    from tvm_rtask.backend import get_backend
    from tvm_rtask.options import resolve_options

    shipped = resolve_db(None, get_backend(target).record_set(resolve_options({})))
    if shipped:  # the record set shipped for this target, as compile uses it by default
        configs.append(("rtask_wavefront_shipped_set", True, None))
        result["shipped_set"] = shipped
    for config, rules, db in configs:
        start = time.perf_counter()
        ex = tvm_rtask.compile(
            mod, target, policy="wavefront", num_veu=threads, cpu_rules=rules, db=db
        )
        compile_s = time.perf_counter() - start
        set_num_threads(threads)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        error = max(
            relative_error(a, b)
            for a, b in zip(_vm_outputs(vm["main"](*args)), reference, strict=True)
        )
        if error > 1e-4:
            raise RuntimeError(f"{name} {config}: relative error {error:.2e} against ORT")
        result["configs"][config] = {"compile_s": round(compile_s, 2), "rel_error": error}
        runners[config] = lambda vm=vm: vm["main"](*args)
    session = ort_session(model, threads)
    runners["onnxruntime"] = lambda: session.run(None, inputs)
    result["configs"]["onnxruntime"] = {}
    # the rules-off build is 30x slower: timed in its own rounds after the others, so that
    # its seconds of two busy threads do not sit between the runs compared with ONNX Runtime
    slow = {k: runners.pop(k) for k in ["rtask_wavefront_rules_off"] if k in runners}
    stats_of = interleaved(runners, warmup, repeat, rounds)
    if slow:
        stats_of.update(interleaved(slow, 1, repeat, rounds))
    for config, stats in stats_of.items():
        result["configs"][config].update(stats)
        print(
            f"{name:13s} {config:28s} median {stats['median_ms']:9.2f} ms "
            f"(p10 {stats['p10_ms']:.2f}, p90 {stats['p90_ms']:.2f})"
        )
    ort_ms = result["configs"]["onnxruntime"]["median_ms"]
    for stats in result["configs"].values():
        stats["ratio_to_onnxruntime"] = stats["median_ms"] / ort_ms
    return result


def _machine(threads: int) -> dict:
    from tvm_rtask.backend.cpu.host import host_cpu_name
    from tvm_rtask.backend.cpu.threads import cpu_model_name

    try:
        import os

        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": cpu_model_name(),
        "llvm_host_cpu": host_cpu_name(),
        "threads": threads,
        "load_average": load,
    }


def _versions() -> dict:
    import onnxruntime as ort

    return {
        "tvm": tvm.__version__,
        "tvm_rtask": tvm_rtask.__version__,
        "onnxruntime": ort.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["squeezenet", "inception_v1"])
    parser.add_argument(
        "--target",
        default="llvm-native",
        help="llvm-native (default: this machine's CPU), llvm (generic x86-64, SSE2) or a JSON "
        "target dict; the same for every configuration compared",
    )
    parser.add_argument("--threads", type=int, default=None, help="default 1, --ort/--e2e 2")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--only", help="only PrimFuncs (--ort: ONNX op types) containing this")
    parser.add_argument("--json", help="write the rows here")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--e2e", action="store_true", help="whole models: rules off/on, ORT")
    mode.add_argument("--ort", action="store_true", help="per operator against ONNX Runtime")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--skip-rules-off", action="store_true", help="--e2e: leave out the rules-off build"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--baseline",
        help="--ort: also build with this rule set (and without --stacked-sum) and time it in "
        "the same rounds, e.g. "
        "'[Conv2dNCHW(narrow_strided=False), MatmulKN()]' (names of backend.cpu.rules)",
    )
    parser.add_argument("--markdown", help="--ort: write the report as Markdown here")
    parser.add_argument(
        "--stacked-sum",
        action="store_true",
        help="--ort/--e2e: rewrite ONNX Sum into adds before compiling (StackedSumToAdd)",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the calling thread's CPU time (only with --threads 1; see CLOCK)",
    )
    args = parser.parse_args()
    target = as_target(json.loads(args.target) if args.target.startswith("{") else args.target)
    threads = args.threads or (2 if args.e2e or args.ort else 1)
    if args.stacked_sum:
        from tvm_rtask.relax_passes.stacked_sum import StackedSumToAdd

        PRE_PASSES.append(StackedSumToAdd())
    if args.cpu_time:
        if threads != 1:
            parser.error("--cpu-time measures the calling thread: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    set_num_threads(threads)
    print(
        f"target {target} (the same for every tvm-rtask and TVM configuration), "
        f"{threads} thread(s); ONNX Runtime on {threads} intra-op thread(s)",
        flush=True,
    )
    doc = {
        "command": "python bench/cpu_ops.py " + shlex.join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "target": str(target),
        "device": f"cpu ({platform.processor() or platform.machine()}), {threads} threads",
        "machine": _machine(threads),
        "clock": "thread CPU time" if args.cpu_time else "wall time",
        "pre_passes": ["StackedSumToAdd"] if args.stacked_sum else [],
    }
    if args.e2e or args.ort:
        doc["versions"] = _versions()
    if args.e2e:
        models = [
            _e2e_model(
                m, threads, args.warmup, args.repeat, args.rounds, target, args.skip_rules_off
            )
            for m in args.models
        ]
        for m in models:
            ratios = ", ".join(
                f"{c} {s['ratio_to_onnxruntime']:.1f}x" for c, s in m["configs"].items()
            )
            print(f"  {m['name']} vs ONNX Runtime: {ratios}")
        doc["models"] = models
    elif args.ort:
        doc["models"] = [
            ort_report(
                m, target, threads, args.warmup, args.repeat, args.rounds, args.only, args.baseline
            )
            for m in args.models
        ]
    else:
        rows = [r for m in args.models for r in bench_model(m, target, args.repeat, args.only)]
        total_base = sum(r["default_us"] for r in rows)
        total_rule = sum(r["rule_us"] for r in rows)
        print(f"sum over distinct scheduled PrimFuncs: {total_base:.0f} -> {total_rule:.0f} us")
        doc["rows"] = rows
    doc["machine"]["load_average_after"] = _machine(threads)["load_average"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if args.ort and args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_report(doc))


if __name__ == "__main__":
    main()
