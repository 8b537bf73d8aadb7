"""bench/cpu_model_profile.py: both runtimes profiled in their own processes on a reduced
real model, and the tables made from what they report."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cpu_model_profile  # noqa: E402


def test_markdown_sorts_rows_by_time_per_run():
    results = [
        {
            "runtime": "onnxruntime",
            "rows": [
                {"us": 10.0, "name": "Relu", "shapes": [[1, 8]]},
                {"us": 30.0, "name": "Conv", "shapes": [[1, 8], [8, 8, 1, 1]]},
            ],
        },
        {"runtime": "tvm-rtask sequential", "rows": [{"us": 5.0, "name": "0001_conv", "calls": 2}]},
    ]
    text = cpu_model_profile.markdown("tiny", results, top=5, threads=2)
    assert "## onnxruntime: 0.04 ms in 2 rows" in text
    assert text.index("| 30.0 | Conv |") < text.index("| 10.0 | Relu |")
    assert "| 5.0 | 0001_conv | x2 |" in text


def test_both_runtimes_report_the_operators_of_a_reduced_model(tmp_path):
    out = tmp_path / "profile.md"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "cpu_model_profile.py"),
        "--model",
        "squeezenet1_1",
        "--size",
        "reduced",
        "--threads",
        "1",
        "--calls",
        "3",
        "--markdown",
        str(out),
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    text = out.read_text()
    assert "## onnxruntime:" in text and "## tvm-rtask sequential:" in text
    assert "Conv" in text and "fused_conv2d" in text  # operators of both, not empty tables
