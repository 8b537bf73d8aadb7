"""The demo (``python -m tvm_rtask.demo``), the README's "Numbers" table it generates, and the
progress log lines and warning filter of ``tvm_rtask.progress`` that it and the tutorials use."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tvm_rtask import demo, progress  # noqa: E402
from tvm_rtask.testing import peers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def tiny_model(gather: bool = False):
    """Two independent matmuls joined by an add; with ``gather``, a Gather with constant
    indices in front (ONNX Gather -> relax take -> TVM's "fast mode" warning)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), name)
        for name in ("w1", "w2")
    ]
    nodes = [
        helper.make_node("MatMul", ["h", "w1"], ["a"]),
        helper.make_node("MatMul", ["h", "w2"], ["b"]),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Add", ["ra", "b"], ["y"]),
    ]
    if gather:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1, 32])
        inits.append(numpy_helper.from_array(np.array(1, np.int64), "step"))
        nodes.insert(0, helper.make_node("Gather", ["x", "step"], ["h"], axis=0))
    else:
        x = helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])
    graph = helper.make_graph(nodes, "tiny", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# -- the README's numbers ------------------------------------------------------------------------
def test_readme_numbers_are_rendered_from_the_committed_results():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = demo.readme_numbers(readme)
    assert found is not None, "README.md has no generated numbers block"
    block, path = found
    assert re.fullmatch(
        r"bench/results/\d{4}-\d\d-\d\d-cpu-(peers|demo)(-[a-z0-9-]+)?\.json", path
    ), path
    assert (ROOT / path).is_file(), path
    assert block == demo.readme_block(ROOT / path, ROOT), (
        "README's numbers differ from what the committed results file gives: run "
        f"`python -m tvm_rtask.demo --update-readme {path}`"
    )
    assert "## Numbers" in readme and "no GPU table" in readme


def test_committed_results_time_every_runtime_in_its_own_process():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    _, path = demo.readme_numbers(readme)
    results = json.loads((ROOT / path).read_text(encoding="utf-8"))
    assert "inception_v1" in results["models"]
    assert "its own process" in results["what"]
    for entry in results["models"].values():
        runtimes = entry["runtimes"]
        for name in ("onnxruntime", "openvino", "tvm_default", "rtask_sequential"):
            assert "median_ms" in runtimes[name], (name, runtimes[name])
        assert "median_ms" in runtimes["rtask_wavefront"]
        for record in peers.timed(runtimes).values():
            assert len(record["samples_ms"]) == record["n"] >= peers.MIN_SAMPLES
            assert record["median_ms"] == pytest.approx(np.median(record["samples_ms"]), 1e-3)
            assert record["relative_error"] <= results["tolerance"]


def _results(ms: dict, threads: int = 2) -> dict:
    runtimes = {}
    for name, value in ms.items():
        if isinstance(value, str):
            runtimes[name] = {"skipped": value} if value.startswith("no ") else {"error": value}
        else:
            runtimes[name] = {"median_ms": value, "p10_ms": value, "p90_ms": value, "n": 10}
    return {"threads": threads, "models": {"m": {"runtimes": runtimes}}}


def test_sentences_follow_the_numbers():
    """No fixed claim: whoever is faster, the text says so, and by how much."""
    slow = _results(
        {
            "onnxruntime": 37.3,
            "openvino": 27.2,
            "tvm_default": 1281.0,
            "rtask_sequential": 60.0,
            "rtask_wavefront": 54.4,
            "torch_eager": "no torch",
        }
    )
    text = peers.summary("m", slow["models"]["m"], 2)
    assert "the fastest is OpenVINO (27.2 ms)" in text
    assert "tvm-rtask's fastest build (wavefront, 54.4 ms) is 1.5x slower than ONNX Runtime" in text
    assert "2.0x slower than OpenVINO (27.2 ms)" in text
    assert "24x faster than TVM's default build (1281.0 ms" in text
    assert "Wavefront packing is 1.1x faster than sequential" in text
    assert "PyTorch eager: skipped (no torch)" in text
    fast = _results({"onnxruntime": 40.0, "openvino": 41.0, "rtask_sequential": 20.0})
    text = peers.summary("m", fast["models"]["m"], 2)
    assert "the fastest is tvm-rtask sequential (20.0 ms)" in text
    assert "2.0x faster than ONNX Runtime (40.0 ms) and 2.0x faster than OpenVINO" in text
    even = _results({"onnxruntime": 10.0, "rtask_wavefront": 10.2, "openvino": "wrong result: x"})
    text = peers.summary("m", even["models"]["m"], 2)
    assert "as fast as (within 5%) ONNX Runtime" in text
    assert "OpenVINO: not timed (wrong result: x)" in text


# -- the demo itself -----------------------------------------------------------------------------
def test_demo_on_a_tiny_model(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    out_json = tmp_path / "results.json"
    runtimes = ["onnxruntime", "tvm_default", "rtask_sequential", "rtask_wavefront", "openvino"]
    demo.main(
        ["--model", str(path), "--threads", "2", "--repeat", "2", "--warmup", "1"]
        + ["--runtimes", *runtimes, "--json", str(out_json)]
    )
    printed = capsys.readouterr().out
    results = json.loads(out_json.read_text(encoding="utf-8"))
    records = results["models"][str(path)]["runtimes"]
    assert list(records) == runtimes
    # every build, TVM's default included, for this machine's CPU, and the output says so
    from tvm_rtask.backend import as_target

    label = demo.target_label(as_target("llvm-native"))
    assert results["target_label"] == label and f"target {label} for every" in printed
    assert results["threads"] == 2 and "plan of" in printed
    for name, record in records.items():
        if name == "openvino" and "skipped" in record:
            assert record["skipped"] == "openvino not installed"
            continue
        assert "error" not in record, record
        assert record["label"] in printed
        assert record["n"] == len(record["samples_ms"]) == 2
        assert record["relative_error"] <= peers.TOLERANCE
        assert record["other_cores"] is not None
    assert records["onnxruntime"]["settings"]["intra_op_num_threads"] == 2
    assert records["onnxruntime"]["reference"] is True
    for name in ("tvm_default", "rtask_sequential", "rtask_wavefront"):
        assert records[name]["compile_s"] >= 0
    assert peers.summary(str(path), results["models"][str(path)], 2) in printed
    table = peers.markdown(results, "results.json")
    # the latency table (header, a row per runtime), the build-time table (header, a model)
    assert table.count("\n| ") == 1 + len(runtimes) + 2


# -- progress ------------------------------------------------------------------------------------
STAGE = re.compile(
    r"^(?P<stage>[a-z/_]+)(?: (?P<end>done in|failed after) (?P<s>\d+\.\d\d) s| \.\.\.)$"
)


def _stages(records):
    """(stage, "start" | seconds) for every stage line, in order."""
    found = []
    for record in records:
        match = STAGE.match(record.getMessage())
        if record.name == "tvm_rtask" and match:
            end = match.group("end")
            found.append((match.group("stage"), float(match.group("s")) if end else "start"))
    return found


def test_compile_logs_its_stages_in_order_with_wall_times(caplog):
    import tvm_rtask

    with caplog.at_level(logging.INFO, logger="tvm_rtask"):
        tvm_rtask.compile(tiny_model(), "llvm", policy="wavefront", num_veu=2)
    stages = _stages(caplog.records)
    names = [name for name, _ in stages]
    assert names == [
        name
        for stage in ("import", "prepare/fuse", "plan", "lower", "build")
        for name in (stage, stage)
    ], names
    assert all(isinstance(t, float) and t >= 0 for _, t in stages[1::2]), stages
    assert all(t == "start" for _, t in stages[0::2]), stages
    messages = [r.getMessage() for r in caplog.records]
    assert any(re.match(r"build: rprogram_\d+: \d+ operators, \d+ rTasks", m) for m in messages)


def test_plan_logs_and_keeps_the_pass_context(caplog):
    import tvm

    import tvm_rtask

    mod = tvm_rtask.frontend.load(tiny_model())
    with caplog.at_level(logging.INFO, logger="tvm_rtask"):
        with tvm.transform.PassContext(config={"rtask.policy": "sequential"}):
            plan = tvm_rtask.plan(mod, "llvm", num_veu=2)
    assert plan.policy == "sequential"  # the config key reached planning through the logging
    names = [name for name, _ in _stages(caplog.records)]
    assert names == ["prepare/fuse", "prepare/fuse", "plan", "plan"], names  # IRModule: no import
    assert any(m.startswith("plan: 3 operators") for m in caplog.messages), caplog.messages


def test_silent_unless_enabled(caplog):
    import tvm_rtask

    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        tvm_rtask.plan(tiny_model(), "llvm", num_veu=2)
    assert not [r for r in caplog.records if r.name == "tvm_rtask"]


def test_stage_logs_a_failure(caplog):
    with caplog.at_level(logging.INFO, logger="tvm_rtask"), pytest.raises(ValueError):
        with progress.stage("work"):
            raise ValueError("no")
    assert caplog.messages[0] == "work ..."
    assert re.fullmatch(r"work failed after \d+\.\d\d s", caplog.messages[1]), caplog.messages


def test_quiet_tvm_warnings_drops_only_the_known_lines(capfd):
    with progress.quiet_tvm_warnings():
        os.write(2, b"[12:00:00] x.cc:1: Warning: Scope Saving:global\n")
        os.write(2, b"something else\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "something else\nafter\n"


def test_quiet_tvm_warnings_on_tvm_itself(capfd):
    """The filtered text is what this TVM writes: a Gather makes it warn, unless quieted."""
    import tvm_rtask

    mod = tvm_rtask.frontend.load(tiny_model(gather=True))
    tvm_rtask.plan(mod, "llvm", num_veu=2)
    assert "Fast mode segfaults when there are out-of-bounds indices" in capfd.readouterr().err
    with progress.quiet_tvm_warnings():
        tvm_rtask.plan(mod, "llvm", num_veu=2)
    assert capfd.readouterr().err == ""


def test_a_pass_that_raises_is_logged_as_failed(caplog):
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="PlanRPrograms")
    def broken(mod, _ctx):
        raise ValueError("broken plan")

    mod = tvm.IRModule()
    with (
        caplog.at_level(logging.INFO, logger="tvm_rtask"),
        pytest.raises(Exception, match="broken"),
    ):
        with progress.pass_stages():
            broken(mod)
    assert _stages(caplog.records)[0] == ("plan", "start")
    assert re.fullmatch(r"plan failed after \d+\.\d\d s", caplog.messages[-1]), caplog.messages
