"""The harness's records gathered into one document per (model, batch), and that document as a
Markdown table (README's GPU table) and a figure (latency per configuration on a log scale
with min-max error bars, and each median's ratio to ``tvm_cuda_graph``, else ``tvm_default``):
what the harness writes beside its JSON lines and the GPU window publishes.
"""

from __future__ import annotations

from pathlib import Path

BASELINES = ("tvm_cuda_graph", "tvm_default")


def model_id(name: str, batch: int, reduced: bool, overrides: dict) -> str:
    variant = "reduced" if reduced else "full"
    if overrides:
        variant += "+" + ",".join(f"{k}={overrides[k]}" for k in sorted(overrides))
    return f"{name}|b{batch}|{variant}"


def results_document(records: list[dict]) -> dict:
    """The records of a results file gathered per (model, batch): the shape the tables, the
    figure and older results use. The last record of a key wins (a retried configuration)."""
    envs = [r for r in records if r.get("type") == "env"]
    env = envs[-1] if envs else {}
    doc = {k: v for k, v in env.items() if k != "type"}
    doc.setdefault("device", "unknown")
    doc["runs"] = len(envs)
    models: dict[str, dict] = {}
    for rec in records:
        if rec.get("type") != "result":
            continue
        variant = rec.get("reduced", False), rec.get("overrides", {})
        mid = rec.get("model_id") or model_id(rec["model"], rec["batch"], *variant)
        new = {"name": rec["model"], "batch": rec["batch"], "reduced": variant[0]}
        new.update(overrides=variant[1], configs={}, skipped={})
        group = models.setdefault(mid, new)
        name = rec["config"]
        if "skipped" in rec:
            group["skipped"][name] = rec["skipped"]
            group["configs"].pop(name, None)
            continue
        group["skipped"].pop(name, None)
        shared = ("type", "key", "model", "batch", "reduced", "overrides", "model_id")
        group["configs"][name] = {k: v for k, v in rec.items() if k not in shared}
    for group in models.values():
        configs = group["configs"]
        for base in ("tvm_default", "tvm_cuda_graph"):
            ms = configs.get(base, {}).get("median_ms")
            if ms:
                for entry in configs.values():
                    if "median_ms" in entry:
                        entry[f"ratio_to_{base}"] = entry["median_ms"] / ms
    doc["models"] = list(models.values())
    return doc


def _as_document(results) -> dict:
    """A per-model document from a document or a list of records."""
    return results_document(results) if isinstance(results, list) else results


def baseline_of(model: dict) -> str | None:
    """The configuration ratios are taken to: the first of BASELINES that was timed."""
    for name in BASELINES:
        if "median_ms" in model.get("configs", {}).get(name, {}):
            return name
    return None


def _config_order(groups: list[dict]) -> list[str]:
    configs = [(n, e) for m in groups for n, e in m.get("configs", {}).items()]
    return list(dict.fromkeys(n for n, e in configs if "median_ms" in e))


def markdown_table(results) -> str:
    """One row per (model, batch), one column per configuration: ``median ms (ratio)``,
    the ratio to the row's baseline (``tvm_cuda_graph``, else ``tvm_default``). A failed
    configuration shows ``failed``, one not installed ``-``; notes below the table give
    the device, the repeat count and the failure reasons."""
    doc = _as_document(results)
    groups = [m for m in doc.get("models", []) if m.get("configs") or m.get("skipped")]
    seen = [n for m in groups for n in [*m.get("configs", {}), *m.get("skipped", {})]]
    names = list(dict.fromkeys(seen))
    lines = [f"Median latency in ms (ratio to {' or '.join(BASELINES)}, lower is faster); "
             f"device: {doc.get('device', '?')}", ""]  # fmt: skip
    lines += ["| model | batch | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
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
    entries = [e for m in groups for e in m["configs"].values()]
    repeats = sorted({e.get("repeat") for e in entries if e.get("repeat")})
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
