"""Plot a results JSON of ``bench/harness.py``: median latency per configuration, per model.

Usage: ``python bench/plot.py bench/results/<date>-<device>.json [-o out.png]``

One group of bars per (model, batch), one bar per configuration, on a log scale, with the
p10-p90 range as error bars; configurations that failed or were skipped have no bar. Uses
matplotlib's object API with the Agg canvas (no display, no pyplot state).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def plot_results(doc: dict, path: str | Path, title: str | None = None) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = [m for m in doc["models"] if m.get("configs")]
    configs: list[str] = []
    for m in groups:
        for name, entry in m["configs"].items():
            if "median_ms" in entry and name not in configs:
                configs.append(name)
    fig = Figure(figsize=(max(6.0, 1.2 + 0.35 * len(configs) * max(len(groups), 1)), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(len(configs), 1)
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    for k, name in enumerate(configs):
        xs, ys, lo, hi = [], [], [], []
        for g, m in enumerate(groups):
            entry = m["configs"].get(name, {})
            if "median_ms" not in entry:
                continue
            xs.append(g + (k - (len(configs) - 1) / 2) * width)
            ys.append(entry["median_ms"])
            lo.append(entry["median_ms"] - entry.get("p10_ms", entry["median_ms"]))
            hi.append(entry.get("p90_ms", entry["median_ms"]) - entry["median_ms"])
        ax.bar(xs, ys, width, yerr=[lo, hi], label=name, color=cmap(k % 20), capsize=2)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{m['name']}\nbatch {m['batch']}" for m in groups], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median latency (ms, log)")
    ax.set_title(title or f"{doc.get('device', '')} ({doc.get('mode', '')})", fontsize=10)
    if configs:
        ax.legend(fontsize=7, ncol=min(len(configs), 4), loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results JSON of bench/harness.py")
    parser.add_argument("-o", "--output", help="PNG (default: beside the JSON)")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        doc = json.load(f)
    out = args.output or str(Path(args.results).with_suffix(".png"))
    print(plot_results(doc, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
