"""bench/gpu_bisect.py without a GPU: the probed model, a worker's record on llvm, the summary."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu_bisect  # noqa: E402

from tvm_rtask.testing.onnx_light import (  # noqa: E402
    load_light_model,
    onnxruntime_outputs,
    random_inputs,
)


def test_probed_model_outputs_the_joins_and_keeps_the_original_outputs():
    model = load_light_model("squeezenet")
    probed, names = gpu_bisect.probed_model(model)
    concats = [n.output[0] for n in model.graph.node if n.op_type == "Concat"]
    assert set(concats) <= set(names)
    inputs = random_inputs(model)
    plain = onnxruntime_outputs(model, inputs)
    both = onnxruntime_outputs(probed, inputs)
    assert len(both) == len(plain) + len(names)
    for a, e in zip(both, plain, strict=False):
        np.testing.assert_array_equal(a, e)


def test_a_zero_output_is_off_by_one():
    e = np.linspace(-3, 2, 10, dtype="float32")
    described = gpu_bisect._describe(np.zeros_like(e), e)
    assert described["rel_err"] == pytest.approx(1.0)
    assert described["zero_fraction"] == 1.0
    assert gpu_bisect._describe(e, e)["rel_err"] == 0.0


def test_worker_on_llvm_compares_every_probe_with_tvm():
    rec = gpu_bisect.worker("light:squeezenet", "probed", "llvm")
    assert rec["ok"], rec
    assert len(rec["outputs"]) > 2
    # activations alive: the comparison is not between two near-zero tensors
    assert all(o["ref_max_abs"] > 1e-3 for o in rec["outputs"].values())


def test_summary_names_the_first_tensor_off():
    off = {"rel_err": 0.5, "zero_fraction": 1.0, "ref_zero_fraction": 0.1, "max_abs": 0.0}
    off["ref_max_abs"] = 3.0
    good = {**off, "rel_err": 0.0}
    records = [
        {"variant": "probed", "ok": False, "outputs": {"a": good, "b": off}, "first_off": "b"},
        {"variant": "fine", "ok": True, "outputs": {"a": good}, "first_off": None},
        {"variant": "global", "ok": False, "error": "deadline"},
    ]
    lines = gpu_bisect.summary_lines(records)
    assert "WRONG" in lines[0] and "first off: b" in lines[0]
    assert lines[1].split()[:2] == ["fine", "ok"]
    assert "ERROR deadline" in lines[2]


def test_main_writes_records_and_one_archive_of_logs(tmp_path):
    """The whole flow on llvm with one variant: a record per worker in ``--out`` and the
    workers' logs in one archive beside it (nothing else: a window brings back few files)."""
    out = tmp_path / "bisect.jsonl"
    args = ["light:squeezenet", "--target", "llvm", "--variants", "sequential"]
    assert gpu_bisect.main([*args, "--out", str(out), "--jobs", "1", "--deadline", "300"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in records] == ["sequential"] and records[0]["ok"], records
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bisect-logs.tar.gz", "bisect.jsonl"]
