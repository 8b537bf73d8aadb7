"""Plot and tabulate the results of ``bench/harness.py``: latency per model per configuration.

Usage: ``python bench/plot.py bench/results/<date>-<device>.json [-o out.png] [--markdown t.md]``
(a ``.jsonl`` results file works too).

The figure has two panels: the median latency of each configuration per (model, batch), on
a log scale with the min-max range as error bars, and each median as a ratio to the
baseline (``tvm_cuda_graph`` where it was timed, else ``tvm_default``; below 1 is faster).
Configurations that failed or were skipped have no bar. :func:`markdown_table` gives the
same numbers as a Markdown table (what README's table is generated from). Uses matplotlib's
object API with the Agg canvas (no display, no pyplot state).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BASELINES = ("tvm_cuda_graph", "tvm_default")


def _as_document(results) -> dict:
    """A per-model document from a document, a list of records, or a path to either."""
    if isinstance(results, (str, Path)):
        path = Path(results)
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            return _as_document(records)
        return json.loads(path.read_text())
    if isinstance(results, list):
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from records import results_document

        return results_document(results)
    return results


def baseline_of(model: dict) -> str | None:
    """The configuration ratios are taken to: the first of BASELINES that was timed."""
    for name in BASELINES:
        if "median_ms" in model.get("configs", {}).get(name, {}):
            return name
    return None


def _config_order(groups: list[dict]) -> list[str]:
    names: list[str] = []
    for m in groups:
        for name, entry in m.get("configs", {}).items():
            if "median_ms" in entry and name not in names:
                names.append(name)
    return names


def markdown_table(results) -> str:
    """One row per (model, batch), one column per configuration: ``median ms (ratio)``,
    the ratio to the row's baseline (``tvm_cuda_graph``, else ``tvm_default``). A failed
    configuration shows ``failed``, one not installed ``-``; notes below the table give
    the device, the repeat count and the failure reasons."""
    doc = _as_document(results)
    groups = [m for m in doc.get("models", []) if m.get("configs") or m.get("skipped")]
    names: list[str] = []
    for m in groups:
        for name in [*m.get("configs", {}), *m.get("skipped", {})]:
            if name not in names:
                names.append(name)
    lines = [
        f"Median latency in ms (ratio to {' or '.join(BASELINES)}, lower is faster); "
        f"device: {doc.get('device', '?')}",
        "",
        "| model | batch | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    notes = []
    for m in groups:
        base = baseline_of(m)
        base_ms = m["configs"][base]["median_ms"] if base else None
        cells = []
        for name in names:
            entry = m.get("configs", {}).get(name)
            if entry is None:
                cells.append("-")
            elif "median_ms" in entry:
                cell = f"{entry['median_ms']:.3f}"
                if base_ms:
                    cell += f" ({entry['median_ms'] / base_ms:.2f}x)"
                cells.append(cell)
            else:
                cells.append("failed")
                notes.append(f"- {m['name']} b{m['batch']} {name}: {entry.get('error', '?')}")
        variant = " (reduced)" if m.get("reduced") else ""
        lines.append(f"| {m['name']}{variant} | {m['batch']} | " + " | ".join(cells) + " |")
    repeats = sorted(
        {e.get("repeat") for m in groups for e in m["configs"].values() if e.get("repeat")}
    )
    lines.append("")
    if repeats:
        lines.append(f"N = {', '.join(map(str, repeats))} timed calls per configuration.")
    skipped = sorted({f"{n}: {why}" for m in groups for n, why in m.get("skipped", {}).items()})
    if skipped:
        lines.append("Not run: " + "; ".join(skipped) + ".")
    if notes:
        lines += ["", "Failures:", *notes]
    return "\n".join(lines) + "\n"


def plot_results(results, path: str | Path, title: str | None = None) -> Path:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    doc = _as_document(results)
    groups = [m for m in doc["models"] if m.get("configs")]
    configs = _config_order(groups)
    width_in = max(6.0, 1.2 + 0.35 * len(configs) * max(len(groups), 1))
    fig = Figure(figsize=(width_in, 8.0))
    FigureCanvasAgg(fig)
    ax, rx = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    width = 0.8 / max(len(configs), 1)
    cmap = colormaps["tab20"]
    for k, name in enumerate(configs):
        xs, ys, lo, hi, rxs, rys = [], [], [], [], [], []
        for g, m in enumerate(groups):
            entry = m["configs"].get(name, {})
            if "median_ms" not in entry:
                continue
            x = g + (k - (len(configs) - 1) / 2) * width
            med = entry["median_ms"]
            xs.append(x)
            ys.append(med)
            lo.append(med - entry.get("min_ms", entry.get("p10_ms", med)))
            hi.append(entry.get("max_ms", entry.get("p90_ms", med)) - med)
            base = baseline_of(m)
            if base:
                rxs.append(x)
                rys.append(med / m["configs"][base]["median_ms"])
        color = cmap(k % 20)
        ax.bar(xs, ys, width, yerr=[lo, hi], label=name, color=color, capsize=2)
        rx.bar(rxs, rys, width, color=color)
    labels = [f"{m['name']}\nbatch {m['batch']}" for m in groups]
    for axis in (ax, rx):
        axis.set_xticks(range(len(groups)))
        axis.set_xticklabels(labels, fontsize=8)
        axis.grid(axis="y", alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("median latency (ms, log)")
    rx.axhline(1.0, color="black", linewidth=0.8)
    rx.set_ylabel("ratio to tvm_cuda_graph\n(else tvm_default)")
    ax.set_title(title or f"{doc.get('device', '')} ({doc.get('mode', '')})", fontsize=10)
    if configs:
        ax.legend(fontsize=7, ncol=min(len(configs), 4), loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results .json or .jsonl of bench/harness.py")
    parser.add_argument("-o", "--output", help="PNG (default: beside the results)")
    parser.add_argument("--markdown", help="also write the Markdown table here ('-': print)")
    args = parser.parse_args(argv)
    doc = _as_document(args.results)
    out = args.output or str(Path(args.results).with_suffix(".png"))
    print(plot_results(doc, out))
    if args.markdown == "-":
        print(markdown_table(doc))
    elif args.markdown:
        Path(args.markdown).write_text(markdown_table(doc))
        print(args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
