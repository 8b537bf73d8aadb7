"""bench/cpu_barriers.py: every build of a reduced real model checked and timed."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fine_and_global_builds_are_checked_and_timed(tmp_path):
    out = tmp_path / "barriers.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "cpu_barriers.py"),
        "--models",
        "squeezenet1_1",
        "--size",
        "reduced",
        "--builds",
        "wavefront/fine",
        "wavefront/global",
        "--rounds",
        "2",
        "--block",
        "2",
        "--target",
        "llvm",
        "--json",
        str(out),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    (record,) = json.loads(out.read_text())["models"]
    assert set(record["builds"]) == {"wavefront/fine", "wavefront/global"}
    for build in record["builds"].values():
        assert build["rel_error"] < 1e-3 and build["calls"] == 4 and build["median_ms"] > 0
    assert "squeezenet1_1: wavefront/fine=" in run.stdout
