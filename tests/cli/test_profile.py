"""``tvm-rtask profile`` and ``--cost measured`` in process, on a tiny ONNX model: the table,
the JSON, the cache (reused, and measured again when damaged), plans that differ only by
their cost model, and one-line errors."""

import importlib
import json

import numpy as np
import pytest
import tvm

from tests.cli.helpers import in_process
from tvm_rtask.runtime.profiler import CACHE_ENV

main_module = importlib.import_module("tvm_rtask.cli.main")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``x[8, 32] @ w + b -> relu`` beside ``x * x``, joined by an add: three operators."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype("float32"), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["lin"]),
        helper.make_node("Relu", ["lin"], ["act"]),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Add", ["act", "sq"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("profile") / "tiny.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh profile cache; TVM_RTASK_CACHE (which --cache sets) restored afterwards."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "unused"))
    return tmp_path / "cache"


def _profile(tiny, cache, *extra):
    args = ["profile", tiny, "--target", "llvm", "--num-veu", "2", "--db", "none"]
    return main_module.main([str(a) for a in [*args, "--cache", cache, *extra]])


def test_profile_prints_the_table_and_writes_json(tiny, cache, tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert _profile(tiny, cache, "--json", out) == 0
    text = capsys.readouterr().out
    assert "rKernel" in text and "us/rTask" in text and "cached" in text
    assert "sync (fine barriers, 2 vEUs): barrier" in text and "fitted model (cpu)" in text
    doc = json.loads(out.read_text())
    kernels = doc["kernels"]
    assert kernels and all(k["rtask_us"] > 0 and not k["cached"] for k in kernels)
    assert f"{len(kernels)} distinct rKernels (0 from the cache)" in text
    assert doc["device"] and doc["sync"]["barrier"] == "fine" and doc["sync"]["num_veu"] == 2
    model = doc["cost_model"]
    assert model["barrier_overhead_us"] == doc["sync"]["barrier_us"]
    assert model["launch_overhead_us"] == doc["sync"]["launch_us"]
    assert set(model["measured"]) == {k["kernel"] for k in kernels}

    # again: everything from the cache
    assert _profile(tiny, cache) == 0
    text = capsys.readouterr().out
    assert f"{len(kernels)} distinct rKernels ({len(kernels)} from the cache)" in text
    assert "us (cached)" in text

    # --remeasure: measured again, the cache overwritten
    assert _profile(tiny, cache, "--remeasure") == 0
    text = capsys.readouterr().out
    assert f"{len(kernels)} distinct rKernels (0 from the cache)" in text

    # unreadable cache files are measured again, never an error
    for path in cache.glob("*.json"):
        path.write_text("{not json")
    assert _profile(tiny, cache) == 0
    text = capsys.readouterr().out
    assert f"{len(kernels)} distinct rKernels (0 from the cache)" in text
    assert "us (cached)" not in text


def test_plan_with_the_measured_cost_model(tiny, cache, tmp_path, capsys):
    """--cost measured changes the cost model and nothing else the plan was made with."""
    plans = {}
    for cost in ("analytical", "measured"):
        out = tmp_path / f"{cost}.json"
        args = ["plan", tiny, "--target", "llvm", "--num-veu", "2", "--db", "none"]
        args += ["--policy", "wavefront", "--cost", cost, "--cache", cache, "--json", out]
        assert main_module.main([str(a) for a in args]) == 0
        plans[cost] = json.loads(out.read_text())["wavefront"]["plan"]
    capsys.readouterr()
    analytical, measured = plans["analytical"], plans["measured"]
    assert analytical["options"]["cost"] == "analytical"
    assert measured["options"]["cost"] == "measured"
    assert measured["options"]["cost_model"] == "measured"
    assert measured["options"]["measured_cost"]["kernels"] > 0
    extra = ("cost", "cost_model", "measured_cost")
    assert {k: v for k, v in measured["options"].items() if k not in extra} == {
        k: v for k, v in analytical["options"].items() if k not in extra
    }
    assert measured["graph"] == analytical["graph"]
    assert list(cache.glob("sync-*.json")) and len(list(cache.glob("*.json"))) > 1


def test_compile_with_the_measured_cost_model(tiny, cache, tmp_path, capsys):
    out = tmp_path / "tiny.so"
    report = tmp_path / "report.json"
    args = ["compile", tiny, "--target", "llvm", "--num-veu", "2", "--db", "none"]
    args += ["--cost", "measured", "--cache", cache, "-o", out, "--report", report]
    assert main_module.main([str(a) for a in args]) == 0
    assert out.exists()
    options = json.loads(report.read_text())["plan"]["options"]
    assert options["cost"] == "measured" and options["cost_model"] == "measured"
    capsys.readouterr()


def test_one_line_errors(tiny, cache, capsys, quiet):
    main = main_module.main
    in_process(main, ["profile", tiny, "--target", "nonsense"], capsys, "--target 'nonsense'")
    in_process(main, ["profile", tiny, "--target", "llvm", "--num-veu", "0"], capsys, "num_veu")
    if tvm.cuda(0).exist:
        return
    in_process(
        main,
        ["profile", tiny, "--target", "cuda"],
        capsys,
        "no CUDA device: profile needs the device it measures",
    )
    in_process(
        main,
        ["plan", tiny, "--target", "cuda", "--cost", "measured"],
        capsys,
        "no CUDA device: --cost measured needs the device it measures",
    )
