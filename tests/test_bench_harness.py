"""The benchmark kit on the CPU (``python -m bench latency``, ``gpu-check``, ``kernels``): harness
records (incremental, resume, failures, timeouts), the pytest plugin of the GPU kit, the kit's
dry run, the kernel report, tables and plots.

Failures and hangs are injected through the harness's test-only configurations
(``test_fail``, ``test_hang``, ...; enabled by ``TVM_RTASK_BENCH_TEST_CONFIGS``), which
compile nothing, so these tests stay fast.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench import harness, kernel_report
from bench import records as plot

ROOT = Path(__file__).resolve().parents[1]
TEST_ENV = {**os.environ, harness.TEST_CONFIGS_ENV: "1"}


def _harness(tmp_path, *argv, results="r.jsonl", wait=True):
    cmd = [sys.executable, "-m", "bench", "latency", "--smoke", "--models", "lstm_tc", "--no-plot"]
    cmd += ["--out-dir", str(tmp_path), "--results", str(tmp_path / results)]
    cmd += ["--cache-dir", str(tmp_path / "cache"), *argv]
    if not wait:
        return subprocess.Popen(cmd, env=TEST_ENV, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=TEST_ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _results(path) -> dict:
    return {r["config"]: r for r in harness.read_records(path) if r.get("type") == "result"}


def test_records_are_written_as_they_happen_and_failures_do_not_stop_the_run(tmp_path):
    configs = ["test_ok", "test_ok2", "test_fail", "test_wrong", "test_hang", "test_crash"]
    proc = _harness(tmp_path, "--configs", *configs, "--timeout", "4", wait=False)
    results = tmp_path / "r.jsonl"
    start = time.time()
    while "test_ok" not in _results(results):
        assert proc.poll() is None, "the run ended before its first record was seen"
        assert time.time() - start < 120
        time.sleep(0.1)
    # The first record is on disk while the run goes on (test_hang is still to come).
    assert proc.poll() is None
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1  # failures are reported in the status, after all ran
    recs = _results(results)
    assert set(recs) == set(configs)
    for name in ("test_ok", "test_ok2"):
        rec = recs[name]
        assert "error" not in rec, rec
        assert rec["repeat"] == 3 and rec["min_ms"] <= rec["median_ms"] <= rec["max_ms"]
        assert rec["compile_s"] == 0.0 and rec["rel_error"] == 0.0
    assert recs["test_fail"]["error"] == "RuntimeError: injected failure"
    assert recs["test_wrong"]["error"].startswith("wrong result: relative error")
    assert "median_ms" not in recs["test_wrong"]
    assert recs["test_hang"]["error"].startswith("timed out after 4")
    assert recs["test_crash"]["error"].startswith("worker died (status 70)")
    env = [r for r in harness.read_records(results) if r.get("type") == "env"]
    assert len(env) == 1 and env[0]["versions"]["apache-tvm"].startswith("0.27")
    assert env[0]["date"] and env[0]["device"] and env[0]["source_hash"]
    assert "FAILED: RuntimeError: injected failure" in out


def test_a_second_run_skips_recorded_configurations(tmp_path):
    first = _harness(tmp_path, "--configs", "test_ok", "test_fail")
    assert first.returncode == 1, first.stdout + first.stderr
    second = _harness(tmp_path, "--configs", "test_ok", "test_ok2", "test_fail")
    assert "2 configuration(s) were recorded by an earlier run and skipped" in second.stdout
    records = [r for r in harness.read_records(tmp_path / "r.jsonl") if r.get("type") == "result"]
    assert sorted(r["config"] for r in records) == ["test_fail", "test_ok", "test_ok2"]
    # A failed configuration is recorded, hence skipped, unless asked to retry it.
    _harness(tmp_path, "--configs", "test_ok", "test_fail", "--retry-failed")
    records = [r for r in harness.read_records(tmp_path / "r.jsonl") if r.get("type") == "result"]
    assert sorted(r["config"] for r in records) == ["test_fail", "test_fail", "test_ok", "test_ok2"]


def test_deadline_stops_cleanly_and_lists_what_was_not_reached(tmp_path):
    run = _harness(
        tmp_path,
        "--configs",
        "test_ok",
        "test_hang",
        "test_slow",
        "--timeout",
        "60",
        "--deadline",
        "8",
        "--min-start-s",
        "1",
    )
    assert run.returncode == 1
    recs = _results(tmp_path / "r.jsonl")
    assert "median_ms" in recs["test_ok"]
    assert "test_hang" not in recs and "test_slow" not in recs  # not recorded: runs next time
    assert "NOT REACHED before the deadline" in run.stdout
    assert "test_hang" in run.stdout and "test_slow" in run.stdout


def test_tvm_configurations_are_checked_timed_and_cached(tmp_path):
    run = _harness(tmp_path, "--configs", "tvm_default", "sequential")
    assert run.returncode == 0, run.stdout + run.stderr
    recs = _results(tmp_path / "r.jsonl")
    assert recs["tvm_default"]["reference"] == "onnxruntime_cpu"
    assert recs["sequential"]["reference"] == "tvm_default"
    for name in ("tvm_default", "sequential"):
        rec = recs[name]
        assert rec["rel_error"] < 1e-4 and rec["median_ms"] > 0 and rec["compile_s"] > 0
    assert recs["sequential"]["cached"] is False
    (first_hash,) = [
        r["source_hash"] for r in harness.read_records(tmp_path / "r.jsonl") if "source_hash" in r
    ]
    again = _harness(tmp_path, "--configs", "tvm_default", "sequential", "--fresh")
    assert again.returncode == 0, again.stdout + again.stderr
    recs = _results(tmp_path / "r.jsonl")
    (second_hash,) = [
        r["source_hash"] for r in harness.read_records(tmp_path / "r.jsonl") if "source_hash" in r
    ]
    # Loaded from the cache, unless the tvm_rtask sources changed in between (the key).
    assert recs["sequential"]["cached"] is (first_hash == second_hash)
    assert recs["sequential"]["rel_error"] < 1e-4
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["models"][0]["configs"]["sequential"]["ratio_to_tvm_default"] > 0
    assert "| lstm_tc (reduced) | 1 |" in (tmp_path / "r.md").read_text()


def test_pytorch_peer_runs_the_zoo_models_twin_checked_against_tvm(tmp_path):
    pytest.importorskip("torch", reason="the PyTorch peers need torch (tvm-rtask[torch])")
    run = _harness(tmp_path, "--configs", "tvm_default", "torch_eager")
    assert run.returncode == 0, run.stdout + run.stderr
    rec = _results(tmp_path / "r.jsonl")["torch_eager"]
    assert rec["torch_source"] == "twin" and rec["reference"] == "tvm_default"
    assert rec["rel_error"] < 1e-4 and rec["median_ms"] > 0 and rec["compile_s"] > 0


def test_a_model_outside_the_zoo_goes_through_onnx2torch_or_says_why_not():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    ctx = type("Ctx", (), {"spec": {"model": "not_in_the_zoo"}, "model": helper.make_model(graph)})
    entry = {}
    try:
        harness._torch_module(ctx, entry)
    except harness._Skip as why:
        assert str(why) == "onnx2torch not installed", why
    else:
        assert entry["torch_source"] == "onnx2torch"


def test_configurations_cover_the_baselines():
    names = [c["name"] for c in harness.configurations("llvm")]
    assert names[:4] == ["tvm_default", "sequential", "wavefront_fine", "wavefront_global"]
    assert "tvm_cuda_graph" not in names and len(names) == len(set(names))
    assert {"onnxruntime", "torch_eager", "torch_compile"} <= set(names)
    cuda = [c["name"] for c in harness.configurations("cuda")]
    assert cuda[:6] == [
        "tvm_default",
        "tvm_cuda_graph",
        "sequential",
        "wavefront_counter",
        "wavefront_fine",
        "ios",
    ]
    assert {"torch_compile_max_autotune", "torch_compile_reduce_overhead"} <= set(cuda)
    modes = {c["name"]: c.get("torch_mode") for c in harness.all_configurations("cuda")}
    assert modes["torch_compile_max_autotune"] == "max-autotune"
    every_llvm = [c["name"] for c in harness.all_configurations("llvm")]
    assert "torch_compile_max_autotune" in every_llvm and "torch_compile_max_autotune" not in names
    with pytest.raises(ValueError, match="unknown configuration"):
        harness.configurations("llvm", ["nope"])


def test_pytorch_peers_on_the_gpu_are_every_fp32_mode_and_a_labelled_tf32_pair():
    peers = {c["name"]: c for c in harness.all_configurations("cuda") if c["kind"] == "peer"}
    fp32 = {n: c["torch_mode"] for n, c in peers.items() if "torch_mode" in c and not c.get("tf32")}
    # issue 49: eager and torch.compile's default, reduce-overhead and max-autotune-no-cudagraphs
    assert {"eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs"} <= set(
        fp32.values()
    )
    tf32 = {n: c for n, c in peers.items() if c.get("tf32")}
    assert set(tf32) == {"torch_eager_tf32", "torch_compile_tf32"}
    for c in tf32.values():  # its own, looser tolerance, and never in the default set
        assert c["tolerance"] == harness.TF32_TOLERANCE > harness.PEER_TOLERANCE
        assert c["default"] is False
    assert not any(c.get("tf32") for c in harness.all_configurations("llvm"))


def test_outputs_reach_the_host_before_numpy():
    class CudaTensor:  # what torch does with .numpy() on a CUDA tensor
        def numpy(self):
            raise TypeError("can't convert cuda:0 device type tensor to numpy")

        def detach(self):
            return self

        def cpu(self):
            import numpy as np

            return type("HostTensor", (), {"numpy": lambda self: np.ones(2)})()

    assert [a.tolist() for a in harness.to_numpy_list((CudaTensor(), [CudaTensor()]))] == [
        [1.0, 1.0],
        [1.0, 1.0],
    ]


def test_markdown_table_and_plot(tmp_path):
    records = [
        {"type": "env", "device": "H100", "mode": "gpu"},
        *[
            {
                "type": "result",
                "model": "a",
                "batch": 1,
                "config": c,
                "median_ms": ms,
                "min_ms": ms,
                "max_ms": ms,
                "repeat": 50,
            }
            for c, ms in (("tvm_default", 2.0), ("tvm_cuda_graph", 1.0), ("sequential", 0.5))
        ],
        {"type": "result", "model": "a", "batch": 1, "config": "ios", "error": "boom"},
        {
            "type": "result",
            "model": "a",
            "batch": 1,
            "config": "torch_eager",
            "skipped": "onnx2torch not installed",
        },
        {"type": "result", "model": "b", "batch": 2, "config": "ios", "error": "died"},
    ]
    table = plot.markdown_table(records)
    assert "| a | 1 | 2.000 (2.00x) | 1.000 (1.00x) | 0.500 (0.50x) | failed | - |" in table
    assert "- a b1 ios: boom" in table and "torch_eager: onnx2torch not installed" in table
    png = plot.plot_results(records, tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_pytest_plugin_records_reasons_resumes_and_keeps_the_deadline(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import os, time, pytest

            def test_a_pass():
                pass

            def test_b_fail():
                assert 1 == 2, "one is not two"

            def test_c_skip():
                pytest.skip("no GPU here")

            def test_d_slow():
                if not os.path.exists("resumed"):
                    time.sleep(30)

            def test_e_late():
                pass
            """
        )
    )
    (tmp_path / "test_broken.py").write_text("import no_such_module_here\n")
    jsonl = tmp_path / "tests.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "RTASK_TESTS_JSONL": str(jsonl),
        "RTASK_TESTS_DEADLINE": str(time.time() + 8),
        "RTASK_TESTS_MIN_S": "3",
    }
    cmd = [sys.executable, "-m", "pytest", "-p", "bench.gpu_pytest_plugin", "-p"]
    cmd += ["no:cacheprovider", "-q", "-c", os.devnull, "--rootdir", str(tmp_path)]
    cmd += ["--continue-on-collection-errors", str(tmp_path)]
    subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, timeout=120)
    recs = {r["nodeid"].split("::")[-1]: r for r in map(json.loads, jsonl.open())}
    assert recs["test_broken.py"]["outcome"] == "collection_error"
    assert "no_such_module_here" in recs["test_broken.py"]["reason"]
    assert recs["test_a_pass"]["outcome"] == "passed"
    assert recs["test_b_fail"]["outcome"] == "failed"
    assert "one is not two" in recs["test_b_fail"]["reason"]
    assert recs["test_c_skip"] == {
        **recs["test_c_skip"],
        "outcome": "skipped",
        "reason": "no GPU here",
    }
    # its timeout came from the deadline: cut, not failed, and run again on resume
    assert recs["test_d_slow"]["outcome"] == "cut" and "Timeout" in recs["test_d_slow"]["reason"]
    assert recs["test_e_late"]["outcome"] == "not_reached"
    assert "one is not two" in (tmp_path / "tests-failures.log").read_text()
    from bench.gpu_pytest_plugin import recorded_nodeids

    done = recorded_nodeids(str(jsonl))
    assert len(done) == 3 and not any("test_e_late" in n or "test_d_slow" in n for n in done)
    # Resume: recorded tests are deselected, the cut one and the one not reached run.
    skip = tmp_path / "skip.txt"
    skip.write_text("\n".join(done))
    (tmp_path / "resumed").write_text("")
    env.update(RTASK_TESTS_SKIP=str(skip), RTASK_TESTS_DEADLINE=str(time.time() + 60))
    subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, timeout=120)
    again = [json.loads(line) for line in jsonl.read_text().splitlines()[6:]]
    assert {r["nodeid"].split("::")[-1]: r["outcome"] for r in again} == {
        "test_broken.py": "collection_error",
        "test_d_slow": "passed",
        "test_e_late": "passed",
    }


def test_gpu_kit_dry_run_says_the_gpu_is_absent_and_resumes(tmp_path):
    """Two calls of ``gpu-check`` as on the GPU machine: each gets an empty $OUT, the state
    folder on the machine's disk carries the test records from one call to the next."""

    def kit(out, *more):
        cmd = [sys.executable, "-m", "bench", "gpu-check", "--workers", "1", "--deadline", "240"]
        cmd += ["--state-dir", str(tmp_path / "state"), *more]
        env = {**os.environ, "OUT": str(out)}
        run = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run.stdout

    out = tmp_path / "out1"
    stdout = kit(out)
    assert "GPU ABSENT" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu_present"] is False and summary["dry_run"] is True
    assert summary["not_reached"] == []
    assert "GPU ABSENT" in (out / "summary.md").read_text()
    tests = [json.loads(line) for line in (out / "tests.jsonl").open()]
    assert tests and all(t["outcome"] == "skipped" for t in tests)
    # Second call, new empty $OUT: every test recorded is skipped, and this $OUT holds the
    # records of both calls (the flags of the kit's old benchmark phase are still accepted).
    again = tmp_path / "out2"
    stdout = kit(again, "--skip-bench", "--skip-kernels")
    assert f"resuming: tests.jsonl copied from {tmp_path / 'state'}" in stdout
    assert f"tests: {len(tests)} recorded before" in stdout
    assert (again / "tests.jsonl").read_text() == (out / "tests.jsonl").read_text()


def test_kernel_report_times_tvm_the_rkernel_and_torch(tmp_path):
    """``python -m bench kernels`` on the CPU: TVM's kernel, the rKernel (or why not), torch
    (or why not), rows sorted by the time lost."""
    cmd = [sys.executable, "-m", "bench", "kernels", "--models", "lstm_tc", "--reduced"]
    cmd += ["--repeat", "3", "--max-ops", "2", "--out", str(tmp_path)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "kernel_report-lstm_tc.json").read_text())
    assert report["rkernel_method"] == kernel_report.RKERNEL_METHOD
    rows = report["operators"]
    assert len(rows) == 2
    for row in rows:
        assert row["tvm_kernel_ms"] > 0 and row["tvm_vm_ms"] > 0
        assert row["rkernel_ms"] is not None or row["rkernel_note"].startswith("not available")
        assert row["torch_ms"] is not None or row["torch_note"]
    lost = [r["lost_ms"] for r in rows if r.get("lost_ms") is not None]
    assert lost == sorted(lost, reverse=True)
    assert "| operator | uses |" in (tmp_path / "kernel_report-lstm_tc.md").read_text()


def test_conv_parameters_inferred_from_shapes():
    assert kernel_report._conv_params((1, 8, 32, 32), (16, 8, 3, 3), (1, 16, 32, 32)) == (
        (1, 1),
        (1, 1),
        1,
    )
    assert kernel_report._conv_params((1, 8, 32, 32), (8, 1, 3, 3), (1, 8, 16, 16))[2] == 8


def test_unknown_model_is_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "latency", "--models", "resnet9000", "--out-dir", tmp_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "unknown model" in proc.stderr


def test_tvm_rtask_bench_delegates_to_the_harness(tmp_path):
    from tvm_rtask import cli

    assert cli.find_harness() == ROOT / "bench" / "harness.py"
    run = subprocess.run(  # from another directory: the CLI finds the checkout's bench package
        [sys.executable, "-m", "tvm_rtask.cli", "bench", "--smoke", "--models", "lstm_tc"]
        + ["--configs", "test_ok", "--no-plot", "--out-dir", str(tmp_path)],
        env=TEST_ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (results,) = tmp_path.glob("*.jsonl")
    assert list(_results(results)) == ["test_ok"]
