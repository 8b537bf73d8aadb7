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
    assert re.fullmatch(r"bench/results/\d{4}-\d\d-\d\d-cpu-demo(-[a-z0-9-]+)?\.json", path), path
    assert (ROOT / path).is_file(), path
    assert block == demo.readme_block(ROOT / path, ROOT), (
        "README's numbers differ from what the committed results file gives: run "
        f"`python -m tvm_rtask.demo --update-readme {path}`"
    )
    assert "## Numbers" in readme and "no GPU table" in readme


def test_committed_results_have_every_configuration():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    _, path = demo.readme_numbers(readme)
    results = json.loads((ROOT / path).read_text(encoding="utf-8"))
    assert list(results["configs"]) == [
        "tvm_default",
        demo.RULES_OFF,
        "rtask_sequential",
        "rtask_wavefront",
        "onnxruntime",
    ]
    assert results["model"] == "inception_v1"
    for config in results["configs"].values():
        assert len(config["samples_ms"]) == results["repeat"]
        assert config["median_ms"] == pytest.approx(float(np.median(config["samples_ms"])), 1e-3)


def _results(default, sequential, wavefront, ort=None, rules_off=None):
    configs = {"tvm_default": {"median_ms": default}}
    if rules_off is not None:
        configs[demo.RULES_OFF] = {"median_ms": rules_off}
    configs["rtask_sequential"] = {"median_ms": sequential}
    configs["rtask_wavefront"] = {"median_ms": wavefront}
    if ort is not None:
        configs["onnxruntime"] = {"median_ms": ort}
    for config in configs.values():
        config["ratio"] = config["median_ms"] / default
    return {"threads": 2, "configs": configs, "machine": {"arch": "x86_64"}}


def test_explanation_follows_the_numbers():
    text = demo.explanation(_results(700.0, 252.0, 250.0, ort=10.0, rules_off=350.0))
    assert "no schedule rules, tvm-rtask has ratio 0.50: every" in text
    assert "split over the 2 worker threads" in text
    assert "change the time by a factor 0.72" in text
    assert "wavefront packing by 0.99 (not where the gain comes from)" in text
    assert "SSE2), is 25x faster than the fastest tvm-rtask build" in text
    text = demo.explanation(_results(700.0, 357.0, 200.0))
    assert "(sequential), tvm-rtask has ratio 0.51: every" in text
    assert "schedule rules" not in text and "ONNX Runtime" not in text
    assert "wavefront packing changes the time by a factor 0.56." in text
    text = demo.explanation(_results(1.0, 3.0, 2.0, ort=4.0))
    assert "has ratio 3.00, although every" in text and "2.0x slower" in text
    # every build compiled for the host CPU: the instruction set is not the difference
    host = {**_results(700.0, 30.0, 25.0, ort=50.0), "target_label": "llvm, mcpu rocketlake"}
    text = demo.explanation(host)
    assert "SSE2" not in text and "2.0x slower than the fastest" in text
    assert "compiled for this CPU (llvm, mcpu rocketlake)" in text
    assert "every TVM and tvm-rtask build compiled for llvm, mcpu rocketlake" in demo._target_note(
        host
    )


# -- the demo itself -----------------------------------------------------------------------------
def test_demo_on_a_tiny_model(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    out_json = tmp_path / "results.json"
    demo.main(["--model", str(path), "--repeat", "2", "--json", str(out_json)])
    printed = capsys.readouterr().out
    results = json.loads(out_json.read_text(encoding="utf-8"))
    rules = [demo.RULES_OFF] if demo._cpu_rules_on() else []
    assert list(results["configs"]) == [
        "tvm_default",
        *rules,
        "rtask_sequential",
        "rtask_wavefront",
        "onnxruntime",
    ]
    assert results["configs"]["onnxruntime"]["intra_op_num_threads"] == 2
    # every build, TVM's default included, for this machine's CPU, and the output says so
    from tvm_rtask.backend import as_target

    label = demo.target_label(as_target("llvm-native"))
    assert results["target_label"] == label and f"target {label} for every build" in printed
    assert results["configs"]["tvm_default"]["label"].endswith(f"{label})")
    for name, config in results["configs"].items():
        assert config["label"] in printed
        assert f"(ratio {config['ratio']:.2f})" in printed
        assert len(config["samples_ms"]) == 2
        if name != "tvm_default":
            assert config["relative_error"] < 1e-4
    assert demo.explanation(results) in printed
    table = demo.markdown(results, "results.json")
    assert table.count("\n| ") == 1 + len(results["configs"])  # header and configurations


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
