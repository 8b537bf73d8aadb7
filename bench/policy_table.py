"""Every policy on the built-in models, simulated on an H100 with the analytical cost model.

Usage: python bench/policy_table.py [--models squeezenet ...] [--policies ...]
       [--num-veu 132] [--cache DIR] [--out bench/results]

For each model of ``tvm_rtask.models`` (or, without the zoo, the onnx package's light
models), the rOperator graph comes from ``tvm_rtask.plan`` for a CUDA sm_90 target: the
operators' dlight schedules become rKernels (their real rTask counts and thread counts), on
an H100 vDevice of ``--num-veu`` vEUs (default: one per SM, what ``compile`` uses). No GPU is
needed: nothing runs, every policy's plan is simulated with the analytical cost model
(roofline per rTask from the H100 data sheet, 3 us per launch, 0.5 us per barrier). Should
CUDA planning fail for a model, its llvm graph is used with dlight-like rKernels (256
threads, one rTask per 256 output elements). Graphs are cached (``--cache``) so the table
is quick to redo. Writes ``policy_table-<date>-simulated-h100.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm_rtask.core import RGraph, RKernel, VDevice  # noqa: E402
from tvm_rtask.policies import AnalyticalCostModel, make_plan, policy_names, simulate  # noqa: E402
from tvm_rtask.policies.simulate import ideal_us  # noqa: E402
from tvm_rtask.policies.streams import simulate_streams  # noqa: E402

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}


def model_names(requested: list[str] | None) -> tuple[str, list[str]]:
    try:
        import tvm_rtask.models as zoo

        source, names = "tvm_rtask.models", zoo.names()
    except ImportError:
        from tvm_rtask.testing.onnx_light import LIGHT_MODELS

        source, names = "onnx light models", list(LIGHT_MODELS)
    return source, (requested or names)


def load_module(name: str):
    try:
        import tvm_rtask.models as zoo

        if name in zoo.names():
            return zoo.get(name, batch=1)[0]
    except ImportError:
        pass
    from tvm_rtask import frontend
    from tvm_rtask.testing.onnx_light import load_light_model

    return frontend.load(load_light_model(name, seed=0))


def fallback_graph(mod, num_veu: int) -> tuple[RGraph, VDevice]:
    """The llvm graph with dlight-like CUDA rKernels: 256 threads, output elements / 256."""
    import tvm_rtask
    from tvm_rtask.relax_passes import RTaskPrepare, extract_graph
    from tvm_rtask.relax_passes.dataflow import static_shape

    prepared = RTaskPrepare()(mod)
    extracted = extract_graph(prepared)
    ops = []
    for op in extracted.operators:
        if op.supported:
            ty = extracted.bindings[op.name].var.ty
            elements = math.prod(static_shape(ty) or (256,))
            n = max(1, math.ceil(elements / 256))
            op.rkernels = [RKernel(f"{op.func}@{n}", n, threads=256)]
        ops.append(op)
    del tvm_rtask
    return RGraph(ops), VDevice.cuda("h100", threads=256, num_veu=num_veu)


def cuda_graph(name: str, num_veu: int, cache: str) -> tuple[RGraph, VDevice, str, float]:
    """The model's graph and vDevice (cached as JSON); how it was made; seconds it took."""
    path = os.path.join(cache, f"{name}-h100-{num_veu}.json")
    if os.path.exists(path):
        with open(path) as f:
            d = json.load(f)
        return RGraph.from_dict(d["graph"]), VDevice.from_dict(d["vdevice"]), d["how"], d["s"]
    import tvm_rtask

    mod = load_module(name)
    start = time.perf_counter()
    try:
        plan = tvm_rtask.plan(mod, CUDA_TARGET, policy="sequential", num_veu=num_veu)
        graph, vd, how = plan.graph, plan.vdevice, "dlight rKernels (CUDA sm_90)"
    except Exception as err:  # keep the table going; say so in it
        print(f"  {name}: CUDA planning failed ({type(err).__name__}: {err}); fallback graph")
        traceback.print_exc(limit=2)
        graph, vd = fallback_graph(mod, num_veu)
        how = "fallback: 256 threads, output/256 rTasks"
    seconds = time.perf_counter() - start
    os.makedirs(cache, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"graph": graph.to_dict(), "vdevice": vd.to_dict(), "how": how, "s": seconds}, f)
    return graph, vd, how, seconds


def row(name: str, graph: RGraph, vd: VDevice, policy: str) -> dict:
    cost = AnalyticalCostModel()
    start = time.perf_counter()
    plan = make_plan(graph, vd, policy, cost=cost)
    planning = time.perf_counter() - start
    timing = simulate(plan, cost=cost)
    r = plan.report()
    s = timing.summary()
    return {
        "model": name,
        "policy": policy,
        "operators": r["operators"],
        "rtasks": r["rtasks"],
        "veus": r["veus"],
        "estimated_us": r["estimated_us"],
        "ideal_us": r["ideal_us"],
        "kernel_launches": r["kernel_launches"],
        "rprograms": r["rprograms"],
        "barriers": r["barriers"],
        "launch_us": s["launch_us"],
        "barrier_us": s["barrier_us"],
        "utilisation": s["utilisation"],
        "planning_s": planning,
    }


def streams_row(name: str, graph: RGraph, vd: VDevice) -> dict:
    """Opara's streams as a multi-stream run (one launch per operator), simulated: TVM's VM
    has one stream, so this baseline exists only here (tvm_rtask.policies.streams)."""
    cost = AnalyticalCostModel()
    start = time.perf_counter()
    t = simulate_streams(graph, vd, cost)
    planning = time.perf_counter() - start
    work = sum(cost.work_us(op, cost.fastest(op, vd), vd) for op in graph if op.rkernels)
    return {
        "model": name,
        "policy": "opara_streams",
        "operators": len(graph),
        "rtasks": sum(cost.fastest(op, vd).num_rtasks for op in graph if op.rkernels),
        "veus": vd.num_veu,
        "estimated_us": t.total_us,
        "ideal_us": ideal_us(graph, vd, cost),
        "kernel_launches": t.launches,
        "rprograms": 0,
        "barriers": 0,
        "launch_us": t.launches * cost.launch_us(vd),
        "barrier_us": 0.0,
        "utilisation": work / (t.total_us * vd.num_veu) if t.total_us else 0.0,
        "planning_s": planning,
        "streams": t.streams,
    }


def markdown(rows: list[dict], meta: dict, graphs: dict) -> str:
    policies = sorted({r["policy"] for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["policy"]): r for r in rows}
    lines = [
        f"# Policies on the built-in models, simulated H100 ({meta['date']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Models: {meta['source']}, batch 1. Graphs: {meta['graphs']}. vDevice: H100 "
        "(132 SMs, 67 TFLOP/s fp32, 3.35 TB/s), "
        f"{meta['num_veu']} vEUs of {meta['threads']} threads. Analytical cost model: roofline "
        "per rTask + 0.1 us, 3 us per kernel launch, 0.5 us per barrier. Nothing ran on a GPU. "
        "`opara_streams` is Opara's multi-stream run (one launch per operator on its stream, "
        "launch order from Opara's Algorithm 2), simulated: TVM's VM cannot launch on streams.",
        "",
        "## Estimated latency (us) and speed-up over sequential",
        "",
        "| model | ops | rTasks | ideal | " + " | ".join(policies) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(policies),
    ]
    for m in models:
        seq = by.get((m, "sequential"))
        any_row = next(by[(m, p)] for p in policies if (m, p) in by)
        cells = []
        for p in policies:
            r = by.get((m, p))
            if r is None:
                cells.append("-")
                continue
            speed = f" ({seq['estimated_us'] / r['estimated_us']:.2f}x)" if seq else ""
            cells.append(f"{r['estimated_us']:.1f}{speed}")
        lines.append(
            f"| {m} | {any_row['operators']} | {any_row['rtasks']} | "
            f"{any_row['ideal_us']:.1f} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "## Launches, barriers, utilisation, planning time",
        "",
        "| model | policy | launches | rPrograms | barriers | launch us | barrier us | "
        "utilisation | planning s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in models:
        for p in policies:
            r = by.get((m, p))
            if r is None:
                continue
            lines.append(
                f"| {m} | {p} | {r['kernel_launches']} | {r['rprograms']} | {r['barriers']} | "
                f"{r['launch_us']:.1f} | {r['barrier_us']:.1f} | {100 * r['utilisation']:.0f}% | "
                f"{r['planning_s']:.2f} |"
            )
    lines += ["", "Graphs: " + "; ".join(f"{m}: {how}" for m, how in graphs.items()), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--policies", nargs="+", default=sorted(policy_names()))
    ap.add_argument("--num-veu", type=int, default=132)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/tvm_rtask/graphs"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    source, names = model_names(args.models)
    meta = {
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(sys.argv),
        "source": source,
        "num_veu": args.num_veu,
        "threads": 256,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
    }
    rows, graphs = [], {}
    for name in names:
        print(f"{name}: building the graph ...", flush=True)
        graph, vd, how, seconds = cuda_graph(name, args.num_veu, args.cache)
        meta["threads"] = max(k.threads for op in graph for k in op.rkernels) if len(graph) else 0
        graphs[name] = f"{how} ({seconds:.0f} s)"
        for policy in [*args.policies, "opara_streams"]:
            r = (
                streams_row(name, graph, vd)
                if policy == "opara_streams"
                else row(name, graph, vd, policy)
            )
            rows.append(r)
            print(
                f"  {policy:>16}: {r['estimated_us']:9.1f} us (ideal {r['ideal_us']:.1f}), "
                f"{r['kernel_launches']} launches, {r['barriers']} barriers, "
                f"planned in {r['planning_s']:.2f} s",
                flush=True,
            )
    meta["graphs"] = "dlight rKernels from tvm_rtask.plan for CUDA sm_90 (see the last line)"
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"policy_table-{meta['date']}-simulated-h100")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "graphs": graphs, "rows": rows}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(rows, meta, graphs))
    print(f"wrote {base}.md and {base}.json")


if __name__ == "__main__":
    main()
