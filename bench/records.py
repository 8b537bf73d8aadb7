"""The benchmark's records gathered into one document per (model, batch): what the harness
writes beside its JSON lines and what ``plot.py`` draws. Shared by both, imported by each."""

from __future__ import annotations


def model_id(name: str, batch: int, reduced: bool, overrides: dict) -> str:
    variant = "reduced" if reduced else "full"
    if overrides:
        variant += "+" + ",".join(f"{k}={overrides[k]}" for k in sorted(overrides))
    return f"{name}|b{batch}|{variant}"


def results_document(records: list[dict]) -> dict:
    """The records of a results file gathered per (model, batch): the shape ``plot.py`` and
    older results use. The last record of a key wins (a retried configuration)."""
    envs = [r for r in records if r.get("type") == "env"]
    env = envs[-1] if envs else {}
    doc = {k: v for k, v in env.items() if k != "type"}
    doc.setdefault("device", "unknown")
    doc["runs"] = len(envs)
    models: dict[str, dict] = {}
    for rec in records:
        if rec.get("type") != "result":
            continue
        mid = rec.get("model_id") or model_id(
            rec["model"], rec["batch"], rec.get("reduced", False), rec.get("overrides", {})
        )
        group = models.setdefault(
            mid,
            {
                "name": rec["model"],
                "batch": rec["batch"],
                "reduced": rec.get("reduced", False),
                "overrides": rec.get("overrides", {}),
                "configs": {},
                "skipped": {},
            },
        )
        name = rec["config"]
        if "skipped" in rec:
            group["skipped"][name] = rec["skipped"]
            group["configs"].pop(name, None)
            continue
        group["skipped"].pop(name, None)
        group["configs"][name] = {
            k: v
            for k, v in rec.items()
            if k not in ("type", "key", "model", "batch", "reduced", "overrides", "model_id")
        }
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
