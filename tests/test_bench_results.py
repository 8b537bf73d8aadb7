"""``bench/results/`` keeps only the files README, docs or the code cite (issue 51): a result
nobody points to is a lab notebook page; git keeps older runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def _citing_text() -> str:
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    sources += sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "tvm_rtask").rglob("*.py"))
    sources += sorted((ROOT / "tvm_rtask" / "records").rglob("*.json"))
    return "\n".join(p.read_text(errors="replace") for p in sources)


def test_every_result_file_is_cited():
    text = _citing_text()
    uncited = [p.name for p in sorted(RESULTS.iterdir()) if p.is_file() and p.name not in text]
    assert not uncited, (
        f"bench/results/ holds files nothing cites: {uncited}; cite them from README or docs "
        "(the measurement that shows a fact) or remove them (git keeps them)"
    )


def test_every_cited_result_file_exists():
    text = _citing_text()
    cited = set(re.findall(r"bench/results/([\w.-]+\.(?:jsonl|json|md|png|log|csv))\b", text))
    missing = sorted(n for n in cited if not (RESULTS / n).exists() and "<" not in n)
    assert not missing, f"cited but not in bench/results/: {missing}"
