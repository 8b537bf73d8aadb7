"""What the cost model estimates for plans with more or fewer vEUs per SM, with and without
widths (no GPU needed).

Usage: python bench/cost_widths.py [--models squeezenet nasnet_cifar ...] [--device h100]
       [--out bench/results] [--tag NAME]

For each built-in model (full size) and configuration (sequential; wavefront at 132 x 256,
every co-resident vEU x 256 and x 128 threads) the plan is made with the analytical model,
then simulated twice in the same process: as planned (each rTask at its wave's width,
``CostModel.rtask_us_at``) and with every rTask costed as if every vEU were busy (the model
before widths, ``rtask_us``). The dependency-counter issue measured on an H100 that the
second ranks plans with more vEUs per SM wrongly; this shows what each model predicts, not
what a GPU measures. Writes ``cost_widths-<date>[-<tag>].json`` and ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

CONFIGS = [
    ("sequential", None, 256),
    ("wavefront", 132, 256),
    ("wavefront", None, 256),
    ("wavefront", None, 128),
]


def _every_veu_busy():
    from tvm_rtask.policies import AnalyticalCostModel

    class EveryVEUBusy(AnalyticalCostModel):
        """The analytical model without widths: one share for every rTask."""

        def rtask_us_at(self, op, kernel, vdevice, width):
            return self.rtask_us(op, kernel, vdevice)

    return EveryVEUBusy()


def measure(name: str, device: str) -> list[dict]:
    import tvm_rtask
    from tvm_rtask import models as zoo
    from tvm_rtask.policies import simulate

    mod, _ = zoo.get(name)
    busy = _every_veu_busy()
    rows = []
    for policy, veus, threads in CONFIGS:
        options = {"cuda_threads": threads, "verify_occupancy": False, "device": device}
        if veus:
            options["num_veu"] = veus
        start = time.perf_counter()
        plan = tvm_rtask.plan(mod, {"kind": "cuda", "arch": "sm_90"}, policy=policy, **options)
        rows.append(
            {
                "model": name,
                "policy": policy,
                "veus": plan.vdevice.num_veu,
                "threads": threads,
                "estimated_us": round(simulate(plan).total_us, 1),
                "every_veu_busy_us": round(simulate(plan, cost=busy).total_us, 1),
                "plan_s": round(time.perf_counter() - start, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _markdown(rows: list[dict], device: str) -> str:
    lines = [
        f"# Cost-model estimates with and without widths ({device} spec, analytical)",
        "",
        "| model | policy | vEUs x threads | estimated us (widths) | every vEU busy us |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['policy']} | {r['veus']} x {r['threads']} | "
            f"{r['estimated_us']:,} | {r['every_veu_busy_us']:,} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["squeezenet", "nasnet_cifar"])
    parser.add_argument("--device", default="h100")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    rows = [row for name in args.models for row in measure(name, args.device)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"cost_widths-{datetime.date.today().isoformat()}" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps({"device": args.device, "rows": rows}, indent=1))
    (out / f"{stem}.md").write_text(_markdown(rows, args.device))
    print(f"wrote {out / stem}.json and .md")


if __name__ == "__main__":
    main()
