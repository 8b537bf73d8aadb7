"""bench/peers.py (``python -m bench peers``): the parts that time nothing (statistics,
the timing loop's bounds, contention, errors, records of failures and skips, the tables), and
one worker on a tiny model in its own process."""

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from bench import peers

ROOT = Path(__file__).resolve().parents[1]


def test_stats_are_median_p10_p90_and_n():
    out = peers.stats([float(x) for x in range(1, 12)])
    assert out["median_ms"] == 6.0 and out["n"] == 11
    assert out["p10_ms"] == pytest.approx(2.0) and out["p90_ms"] == pytest.approx(10.0)
    assert out["min_ms"] == 1.0 and out["mean_ms"] == 6.0


def test_time_calls_warms_up_then_times_back_to_back():
    calls = []
    samples = peers.time_calls(lambda: calls.append(1), warmup=3, repeat=12)
    assert len(calls) == 15 and len(samples) == 12 and all(s >= 0 for s in samples)


def test_time_calls_stops_after_max_seconds_but_never_under_the_minimum():
    import time

    samples = peers.time_calls(lambda: time.sleep(0.002), 0, 1000, max_seconds=0.0)
    assert len(samples) == peers.MIN_SAMPLES
    assert len(peers.time_calls(lambda: None, 0, 4, max_seconds=0.0)) == 4  # repeat is less


def test_relative_error():
    a = [np.array([1.0, 2.0, 4.0], np.float32)]
    assert peers.max_relative_error(a, a) == 0
    assert peers.max_relative_error([a[0] + 0.04], a) == pytest.approx(0.01)
    assert peers.max_relative_error([np.array([np.nan, 1, 1])], a) == float("inf")
    assert peers.max_relative_error(a, a + a) == float("inf")  # output counts differ
    assert peers.max_relative_error([a[0][:2]], a) == float("inf")  # shapes differ


def test_contention_counts_other_processes_and_waiting_threads():
    before = {"wall": 0.0, "busy": 10.0, "own": 1.0, "waited": 0.0}
    after = {"wall": 2.0, "busy": 14.0, "own": 3.0, "waited": 0.5}
    assert peers.contention(before, after) == {"other_cores": 1.0, "wait_threads": 0.25}
    assert peers.contention(None, after)["other_cores"] is None
    sample = peers.cpu_sample()
    if sample is not None:  # Linux
        assert peers.contention(sample, peers.cpu_sample())["other_cores"] >= 0


def test_worker_env_sizes_every_pool():
    env = peers.worker_env(3)
    assert env["TVM_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "3"


def test_arguments_and_default_path():
    args = peers.parse_args([])
    assert args.threads == peers.default_threads() and args.models == peers.DEFAULT_MODELS
    assert args.runtimes == peers.DEFAULT_RUNTIMES and args.repeat >= peers.MIN_SAMPLES
    smoke = peers.parse_args(["--smoke", "--threads", "1", "--models", "squeezenet"])
    assert smoke.repeat == peers.SMOKE["repeat"] and smoke.threads == 1 and not smoke.worker
    path = peers.default_path(1, True, "2026-01-02")
    assert path == ROOT / "bench" / "results" / "2026-01-02-cpu-peers-1t-smoke.json"
    with pytest.raises(SystemExit):
        peers.parse_args(["--threads", "0"])


def _spec(tmp_path, runtime, model="m.onnx"):
    return {
        "runtime": runtime,
        "model": model,
        "threads": 1,
        "warmup": 1,
        "repeat": 2,
        "reference": str(tmp_path / "ref.npz"),
        "write_reference": runtime in peers.REFERENCES,
    }


def test_a_failing_worker_is_an_error_record(tmp_path):
    record = peers.run_one(_spec(tmp_path, "onnxruntime", str(tmp_path / "missing.onnx")))
    assert record["runtime"] == "onnxruntime" and "error" in record
    assert "median_ms" not in record


def test_a_wrong_result_is_recorded_not_timed(tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx

    from tests.test_demo import tiny_model

    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    spec = _spec(tmp_path, "onnxruntime", str(path))
    np.savez(spec["reference"], np.zeros((1, 32), np.float32) + 1)  # not what it computes
    record = peers.run_worker({**spec, "write_reference": False})
    assert record["error"].startswith("wrong result") and record["relative_error"] > 1
    assert "median_ms" not in record and "samples_ms" not in record
    (tmp_path / "ref.npz").unlink()
    record = peers.run_one(spec)  # in its own process: writes the reference, then times
    assert record["reference"] is True and record["relative_error"] == 0
    assert record["n"] == 2 and record["settings"]["intra_op_num_threads"] == 1
    assert record["os_threads"] >= 1 and record["other_cores"] is not None


def test_markdown_renders_every_kind_of_record():
    def ok(ms):
        return {"median_ms": ms, "p10_ms": ms - 1, "p90_ms": ms + 1, "n": 10, "compile_s": 2.0}

    results = {
        "command": "python -m bench peers",
        "date": "2026-01-02T03:04:05",
        "threads": 2,
        "cpu": "Some CPU",
        "cores": 2,
        "warmup": 5,
        "weights": "seeded random",
        "tolerance": 1e-3,
        "target": "llvm-native",
        "target_label": "llvm, mcpu rocketlake",
        "models": {
            "m": {
                "runtimes": {
                    "onnxruntime": {**ok(20.0), "setup_s": 0.1},
                    "openvino": {"error": "wrong result: relative error 0.1"},
                    "rtask_wavefront": ok(40.0),
                    "torch_eager": {"skipped": "no torch"},
                }
            }
        },
    }
    text = peers.markdown(results, "bench/results/x.json")
    assert "| ONNX Runtime (CPUExecutionProvider) | 20.0 (19.0-21.0), 1.00 |" in text
    assert "| tvm-rtask wavefront | 40.0 (39.0-41.0), 2.00 |" in text
    assert "| OpenVINO (CPU, LATENCY hint) | wrong result |" in text
    # skipped on every model: named once, no row, no sentence per model
    assert "| PyTorch eager |" not in text
    assert "Not run here: PyTorch eager (no torch)" in text
    assert "skipped (no torch)" not in text
    assert "`llvm-native` (llvm, mcpu rocketlake)" in text and "of 10 back-to-back" in text
    assert "is 2.0x slower than ONNX Runtime (20.0 ms)" in text
    assert "Smoke run" not in text and "Note:" not in text
    results["smoke"] = "a check"
    results["models"]["m"]["runtimes"]["onnxruntime"]["other_cores"] = 1.5
    text = peers.markdown(results, "x.json")
    assert text.startswith("**Smoke run, not a measurement**") and "Note: other processes" in text
    json.dumps(results)  # plain data


def test_model_names_pick_their_kind():
    light = peers.load_model("light:squeezenet")
    assert light.graph.name and peers.load_model("squeezenet") == light
    for bad in ("foo:bar", "no_such_model"):
        with pytest.raises(SystemExit):
            peers.load_model(bad)
    real = peers.load_model("real:resnet18", size="reduced")  # torchvision's architecture
    assert real.graph.input[0].name == "input"
    # a name of both kinds is torchvision's unless light: is asked for (the public set)
    both = peers.load_model("resnet50", size="reduced")
    assert both == peers.load_model("real:resnet50", size="reduced")
    assert peers.load_model("light:resnet50").graph.input[0].name != "input"


def test_dense_kind_is_one_layer_that_onnxruntime_runs_as_numpy_does():
    model = peers.load_model("dense:5x32x48", seed=1)
    weight, bias = (numpy_helper.to_array(t) for t in model.graph.initializer)
    assert weight.shape == (32, 48) and bias.shape == (48,)
    x = np.random.default_rng(2).standard_normal((1, 5, 32)).astype("float32")
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ weight + bias, rtol=1e-5, atol=1e-5)
    assert np.abs(got).mean() > 0.3  # outputs alive, not near zero
    with pytest.raises(SystemExit, match="MxKxN"):
        peers.load_model("dense:5x32")


def test_a_checkout_changed_during_the_run_is_flagged(monkeypatch):
    real = peers.source_state()
    assert real is None or len(real) == 16
    states = iter(["before", "after"])
    monkeypatch.setattr(peers, "source_state", lambda: next(states))
    warnings = []
    results = peers.measure([], [], threads=1, progress=warnings.append)
    assert results["source_state"] == "before" and results["source_changed_during_run"]
    assert warnings and "changed during the run" in warnings[0]
    results.update(warmup=5, cores=2, cpu="c", date="2026-01-02", target="llvm", tolerance=1e-3)
    text = peers.markdown(results, "x.json")
    assert "not a measurement of one commit" in text


def test_rounds_interleave_runtimes_and_pool_their_samples(monkeypatch):
    order = []

    def fake_run_one(spec, timeout):
        order.append(spec["runtime"])
        base = 10.0 if spec["runtime"] == "onnxruntime" else 20.0
        samples = [base + len(order)] * 3
        return {"runtime": spec["runtime"], "model": spec["model"], "label": spec["runtime"],
                "samples_ms": samples, **peers.stats(samples), "relative_error": 0.0}  # fmt: skip

    monkeypatch.setattr(peers, "run_one", fake_run_one)
    results = peers.measure(["m"], ["openvino", "onnxruntime"], threads=1, rounds=2,
                            progress=lambda line: None)  # fmt: skip
    assert order == ["onnxruntime", "openvino"] * 2  # the reference first, every round
    ort = results["models"]["m"]["runtimes"]["onnxruntime"]
    assert ort["n"] == 6 and ort["round_medians_ms"] == [11.0, 13.0]
    assert ort["median_ms"] == 12.0 and results["rounds"] == 2


def test_a_failed_round_fails_the_record():
    good = {"samples_ms": [1.0, 2.0], "median_ms": 1.5}
    failed = {"error": "wrong result"}
    assert peers.pool_rounds(good, failed) is failed
    assert peers.pool_rounds(failed, good) is failed
    assert peers.pool_rounds(None, good) is good


def test_the_fingerprint_covers_the_code_and_not_the_docs(monkeypatch):
    """An edit of the docs during a run measures the same code; one of tvm_rtask does not."""
    calls = []

    def git(*args):
        calls.append(args)
        return ""

    monkeypatch.setattr(peers, "_git", git)
    assert peers.source_state() is not None
    for args in calls:
        paths = args[args.index("--") + 1 :]
        assert "tvm_rtask" in paths and "src" in paths and ":!bench/results" in paths
        assert not any(p.startswith("docs") or p == "README.md" for p in paths)
