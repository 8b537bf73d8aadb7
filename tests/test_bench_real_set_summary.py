"""``python -m bench real-set``: the real-set table and its geometric means, from results files."""

import math

from bench.real_set_summary import markdown, summarize


def _peers(times: dict) -> dict:
    return {
        "cpu": "test",
        "threads": 2,
        "command": "python -m bench peers",
        "models": {
            model: {"runtimes": {k: {"median_ms": v} for k, v in runtimes.items()}}
            for model, runtimes in times.items()
        },
    }


def test_best_policy_ratios_geomeans_and_eager():
    peers = _peers(
        {
            "resnet18": {"onnxruntime": 10.0, "rtask_sequential": 20.0, "rtask_wavefront": 15.0},
            "vit_b_16": {
                "onnxruntime": 100.0,
                "openvino": 80.0,
                "rtask_default": 60.0,
                "rtask_sequential": 50.0,
            },
        }
    )
    torch = {"records": [{"model": "resnet18", "median_ms": 12.0}]}
    summary = summarize(peers, torch)
    rows = {r["model"]: r for r in summary["rows"]}
    assert rows["resnet18"]["best"] == "rtask_wavefront" and rows["resnet18"]["ratio"] == 1.5
    assert rows["vit_b_16"]["ratio"] == 0.5
    assert math.isclose(summary["geomean_all"], math.sqrt(1.5 * 0.5))
    assert summary["geomean_first_nine"] == 1.5  # vit_b_16 is not among the first nine
    assert summary["slower_than_eager"] == ["resnet18"]  # 15 ms against eager's 12
    # the default build against the faster of ONNX Runtime and OpenVINO (issue 50's measure)
    assert rows["vit_b_16"]["default_vs_faster"] == 60.0 / 80.0
    assert rows["resnet18"]["default_vs_faster"] is None  # no default build timed
    assert summary["geomean_default_vs_faster"] == 0.75
    table = markdown(summary, peers, ["x.json"])
    assert "| resnet18 | 10.00 | - | 12.00 | - | 20.00 | 15.00 | 1.50x | - |" in table
    assert "| vit_b_16 | 100.00 | 80.00 | - | 60.00 | 50.00 | - | 0.50x | 0.75x |" in table
