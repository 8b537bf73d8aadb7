"""The real-model set's table against ONNX Runtime, OpenVINO and PyTorch eager, from results
files (issue 28's done-when): one row per model, tvm-rtask's best policy over ONNX Runtime,
the geometric mean over all models and over the issue's first nine, and the models slower than
PyTorch eager.

    python -m bench real-set bench/results/<date>-cpu-peers-real-2t.json \\
        --torch bench/results/2026-11-26-torch-eager-real-2t.json --out SUMMARY.md

``python -m bench peers`` writes the first file; ``python -m bench torch-eager`` (run where
torch is installed) the second. Nothing here measures: it only reads.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench.peers import rounds_note

# the classifiers issue 28 lists first, in its order (its geomean is over these)
FIRST_NINE = ["resnet18", "mobilenet_v2", "squeezenet1_1", "googlenet", "shufflenet_v2_x1_0",
              "densenet121", "mnasnet0_5", "inception_v3", "resnext50_32x4d"]  # fmt: skip
RTASK = ("rtask_default", "rtask_sequential", "rtask_wavefront")
COLUMNS = [
    ("onnxruntime", "ONNX Runtime ms"),
    ("openvino", "OpenVINO ms"),
    ("torch_eager", "PyTorch eager ms"),
    ("rtask_default", "tvm-rtask default ms"),
    ("rtask_sequential", "tvm-rtask sequential ms"),
    ("rtask_wavefront", "tvm-rtask wavefront ms"),
]


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(peers: dict, torch: dict | None = None) -> dict:
    """Per model: each runtime's median ms, the best tvm-rtask policy and its ratio to ONNX
    Runtime; the geometric means; the models slower than PyTorch eager."""
    eager = {r["model"]: r["median_ms"] for r in (torch or {}).get("records", [])}
    rows = []
    for model, entry in peers["models"].items():
        runtimes = entry.get("runtimes", {})
        ms = {k: v.get("median_ms") for k, v in runtimes.items() if v.get("median_ms")}
        if model in eager:
            ms["torch_eager"] = eager[model]
        rtask = {k: ms[k] for k in RTASK if k in ms}
        best = min(rtask, key=rtask.get) if rtask else None
        ort = ms.get("onnxruntime")
        slower = bool(best and "torch_eager" in ms) and ms[best] > ms["torch_eager"]
        ratio = ms[best] / ort if best and ort else None
        faster_peer = min((ms[k] for k in ("onnxruntime", "openvino") if k in ms), default=None)
        default = ms.get("rtask_default")
        # issue 50's measure: the default build over the faster of ONNX Runtime and OpenVINO
        vs_faster = default / faster_peer if default and faster_peer else None
        row = {
            "model": model,
            "ms": ms,
            "best": best,
            "ratio": ratio,
            "default_vs_faster": vs_faster,
        }
        rows.append(row | {"slower_than_eager": slower})
    ratios = {r["model"]: r["ratio"] for r in rows if r["ratio"]}
    versus = [r["default_vs_faster"] for r in rows if r["default_vs_faster"]]
    return {
        "geomean_default_vs_faster": _geomean(versus),
        "rows": rows,
        "geomean_all": _geomean(list(ratios.values())),
        "geomean_first_nine": _geomean([ratios[m] for m in FIRST_NINE if m in ratios]),
        "slower_than_eager": [r["model"] for r in rows if r["slower_than_eager"]],
    }


def markdown(summary: dict, peers: dict, sources: list[str]) -> str:
    head = (f"CPU {peers.get('cpu')}, {peers.get('threads')} threads for every runtime, batch 1, "
            f"full size, each runtime warm in its own process{rounds_note(peers)}; "
            f"`{peers.get('command')}` "
            f"(commit {peers.get('commit', '?')}). Medians in ms; last column: tvm-rtask's faster "
            f"policy over ONNX Runtime. From {', '.join(f'`{s}`' for s in sources)}.")  # fmt: skip
    lines = [head, ""]
    lines.append("| model | " + " | ".join(t for _, t in COLUMNS) + " | best tvm-rtask / ORT | "
                 "default / faster of ORT and OpenVINO |")  # fmt: skip
    lines.append("|---|" + "---:|" * (len(COLUMNS) + 2))
    for row in summary["rows"]:
        cells = [f"{row['ms'][k]:.2f}" if k in row["ms"] else "-" for k, _ in COLUMNS]
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
        versus = f"{row['default_vs_faster']:.2f}x" if row["default_vs_faster"] else "-"
        lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {ratio} | {versus} |")
    lines.append("")

    def fmt(value):
        return f"{value:.2f}x" if value else "-"

    if any("torch_eager" in row["ms"] for row in summary["rows"]):
        eager = f"Slower than PyTorch eager: {summary['slower_than_eager'] or 'none'}."
    else:
        eager = "PyTorch eager: not in these files."
    lines.append(f"Geometric mean of best tvm-rtask / ONNX Runtime: {fmt(summary['geomean_all'])} "
                 f"over all {len(summary['rows'])}, {fmt(summary['geomean_first_nine'])} over the "
                 f"issue's first nine. Geometric mean of the default build over the faster of "
                 f"ONNX Runtime and OpenVINO: {fmt(summary['geomean_default_vs_faster'])}. "
                 f"{eager}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peers", help="a results file of python -m bench peers")
    parser.add_argument("--torch", help="one of python -m bench torch-eager")
    parser.add_argument("--out", help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    peers = json.loads(Path(args.peers).read_text())
    torch = json.loads(Path(args.torch).read_text()) if args.torch else None
    sources = [args.peers] + ([args.torch] if args.torch else [])
    text = markdown(summarize(peers, torch), peers, sources)
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
