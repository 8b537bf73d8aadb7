"""The benchmark harness: the CPU smoke run writes results JSON of the documented shape and a
plot; ``tvm-rtask bench`` delegates to it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "bench" / "harness.py"
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402
import plot  # noqa: E402


def _check_shape(doc: dict, models: list[str], configs: list[str]) -> None:
    assert isinstance(doc["device"], str) and doc["device"]
    assert doc["versions"]["apache-tvm"].startswith("0.27")
    assert [m["name"] for m in doc["models"]] == models
    for m in doc["models"]:
        assert m["batch"] == 1
        for name in configs:
            entry = m["configs"][name]
            assert "error" not in entry, (name, entry)
            for key in ("median_ms", "p10_ms", "p90_ms"):
                assert entry[key] > 0
            assert entry["p10_ms"] <= entry["median_ms"] <= entry["p90_ms"]
            assert entry["rel_error"] < 1e-4


def test_smoke_run_writes_results_json_and_plot(tmp_path):
    subprocess.run(
        [sys.executable, str(HARNESS), "--smoke", "--models", "lstm_tc", "--out-dir", tmp_path],
        check=True,
        timeout=900,
    )
    (out,) = tmp_path.glob("*.json")
    assert out.name[:4].isdigit() and out.stem.endswith("-threads")
    doc = json.loads(out.read_text())
    from tvm_rtask.schedule import policy_names

    configs = ["tvm_default", "sequential", "wavefront_fine", "wavefront_global"]
    configs += [c for c in ("ios", "opara") if c in policy_names()]
    _check_shape(doc, ["lstm_tc"], configs + ["onnxruntime"])
    assert doc["mode"] == "smoke"
    skipped = doc["models"][0]["skipped"]
    assert set(skipped) <= {"torch_eager", "torch_compile"}
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_tvm_rtask_bench_delegates_to_the_harness(tmp_path):
    from tvm_rtask import cli

    assert cli.find_harness() == HARNESS
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tvm_rtask.cli",
            "bench",
            "--smoke",
            "--models",
            "lstm_tc",
            "--configs",
            "tvm_default",
            "--no-plot",
            "--out-dir",
            tmp_path,
        ],
        check=True,
        timeout=600,
    )
    (out,) = tmp_path.glob("*.json")
    doc = json.loads(out.read_text())
    _check_shape(doc, ["lstm_tc"], ["tvm_default"])
    assert set(doc["models"][0]["configs"]) == {"tvm_default"}


def test_configurations_cover_the_baselines():
    names = [c["name"] for c in harness.configurations("llvm")]
    assert names[:4] == ["tvm_default", "sequential", "wavefront_fine", "wavefront_global"]
    assert "tvm_cuda_graph" not in names
    assert len(names) == len(set(names))
    cuda = [c["name"] for c in harness.configurations("cuda")]
    assert cuda[:2] == ["tvm_default", "tvm_cuda_graph"]
    assert {"onnxruntime", "torch_eager", "torch_compile"} <= set(names)


def test_plot_skips_failed_configurations(tmp_path):
    doc = {
        "device": "test",
        "models": [
            {
                "name": "a",
                "batch": 1,
                "configs": {
                    "x": {"median_ms": 1.0, "p10_ms": 0.9, "p90_ms": 1.2},
                    "y": {"error": "boom"},
                },
            },
            {"name": "b", "batch": 2, "configs": {}, "error": "worker died"},
        ],
    }
    png = plot.plot_results(doc, tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv", [["--models", "resnet9000"]])
def test_unknown_model_is_a_usage_error(argv, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(HARNESS), *argv, "--out-dir", tmp_path],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "unknown model" in proc.stderr


def test_cuda_compile_time_splits_a_source_into_kernels():
    import cuda_compile_time

    source = "\n".join(
        [
            "#include <cuda_fp16.h>",
            'extern "C" __global__ void __launch_bounds__(256) a_kernel(float* x);',
            'extern "C" __global__ void b_kernel(float* y);',
            'extern "C" __global__ void __launch_bounds__(256) a_kernel(float* x) {',
            "  x[0] = 1.0f;",
            "}",
            "",
            'extern "C" __global__ void b_kernel(float* y) {',
            "  y[0] = 2.0f;",
            "}",
        ]
    )
    preamble, kernels = cuda_compile_time.split_kernels(source)
    assert preamble == "#include <cuda_fp16.h>"
    assert [name for name, _ in kernels] == ["a_kernel", "b_kernel"]
    assert "x[0] = 1.0f;" in kernels[0][1] and "y[0]" not in kernels[0][1]
    assert kernels[1][1].rstrip().endswith("}")
