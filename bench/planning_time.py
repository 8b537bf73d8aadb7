"""Planning time of every policy on large synthetic rOperator graphs (no TVM involved).

Usage: python bench/planning_time.py [--sizes 100 1000 10000] [--policies wavefront ios ...]
       [--devices cpu8 h100] [--ios-max 10000] [--out bench/results]

A graph of N operators is a random layered DAG (layers of 1-8 operators, each reading 1-3
operators of the previous layer; 4 rTasks per operator, seeded FLOPs and bytes), like a
wide CNN. ``make_plan`` is timed as a whole: the policy, ``Plan.validate`` (deadlock and
dependency checks) and the simulation that gives ``estimated_us``. Wall time and process
CPU time are both reported: on a shared machine the CPU time is the steadier number. The
targets of the issue: wavefront plans 1,000 operators in under 1 s and 10,000 in under 10 s.
Writes ``planning_time-<date>.md`` and ``.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm_rtask.core import RGraph, RKernel, ROperator, VDevice  # noqa: E402
from tvm_rtask.policies import make_plan, policy_names  # noqa: E402

DEVICES = {
    "cpu8": lambda: VDevice.cpu(8),
    "h100": lambda: VDevice.cuda("h100", threads=256, registers=64, num_veu=132),
}
TARGETS = {1000: 1.0, 10000: 10.0}


def layered_graph(n: int, seed: int = 0, width: int = 8, rtasks: int = 4) -> RGraph:
    """A random layered DAG of ``n`` operators (see module docstring)."""
    rng = random.Random(seed)
    ops: list[ROperator] = []
    prev: list[str] = []
    k = 0
    while k < n:
        layer = []
        for _ in range(min(rng.randint(1, width), n - k)):
            name = f"op{k}"
            inputs = rng.sample(prev, min(len(prev), rng.randint(1, 3))) if prev else ["x"]
            ops.append(
                ROperator(
                    name,
                    "f",
                    inputs,
                    [name],
                    pattern=rng.choice(["out_ewise_fusable", "elemwise", "injective"]),
                    flops=rng.uniform(1e5, 1e8),
                    bytes=rng.uniform(1e4, 1e7),
                    rkernels=[RKernel(f"{name}@{rtasks}", rtasks, threads=256)],
                )
            )
            layer.append(name)
            k += 1
        prev = layer
    return RGraph(ops)


def measure(graph: RGraph, device: str, policy: str) -> dict:
    vd = DEVICES[device]()
    wall, cpu = time.perf_counter(), time.process_time()
    plan = make_plan(graph, vd, policy)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    r = plan.report()
    return {
        "operators": len(graph),
        "device": device,
        "veus": vd.num_veu,
        "policy": policy,
        "wall_s": wall,
        "cpu_s": cpu,
        "rtasks": r["rtasks"],
        "rprograms": r["rprograms"],
        "barriers": r["barriers"],
        "estimated_us": r["estimated_us"],
        "ideal_us": r["ideal_us"],
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# Planning time ({meta['date']})",
        "",
        f"Command: `{meta['command']}`",
        f"Machine: {meta['machine']}, load average at start {meta['load']}.",
        "Random layered DAGs, 4 rTasks per operator; `make_plan` = policy + validate + "
        "simulate. Targets (wavefront): 1,000 ops < 1 s, 10,000 ops < 10 s.",
        "",
        "| operators | device | vEUs | policy | wall s | CPU s | rTasks | rPrograms | barriers "
        "| estimated us | ideal us |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        target = TARGETS.get(r["operators"]) if r["policy"] == "wavefront" else None
        mark = ""
        if target is not None:
            mark = " (ok)" if r["wall_s"] < target else f" (over {target:g} s)"
        lines.append(
            f"| {r['operators']} | {r['device']} | {r['veus']} | {r['policy']} | "
            f"{r['wall_s']:.3f}{mark} | {r['cpu_s']:.3f} | {r['rtasks']} | {r['rprograms']} | "
            f"{r['barriers']} | {r['estimated_us']:.1f} | {r['ideal_us']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--policies", nargs="+", default=sorted(policy_names()))
    ap.add_argument("--devices", nargs="+", default=["cpu8", "h100"], choices=sorted(DEVICES))
    ap.add_argument("--ios-max", type=int, default=10000, help="largest graph given to ios")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    meta = {
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(sys.argv),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    rows = []
    for n in args.sizes:
        graph = layered_graph(n)
        for device in args.devices:
            for policy in args.policies:
                if policy == "ios" and n > args.ios_max:
                    continue
                row = measure(graph, device, policy)
                rows.append(row)
                print(
                    f"{n:>6} ops {device:>5} {policy:>16}: wall {row['wall_s']:7.3f} s, "
                    f"cpu {row['cpu_s']:7.3f} s, {row['rtasks']} rTasks, "
                    f"{row['barriers']} barriers",
                    flush=True,
                )
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"planning_time-{meta['date']}")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(rows, meta))
    print(f"wrote {base}.md and {base}.json")


if __name__ == "__main__":
    main()
