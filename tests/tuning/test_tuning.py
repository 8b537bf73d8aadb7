"""Tuning with MetaSchedule: budget, reuse, resume after SIGKILL, tuned compile, variants, RPC.

MetaSchedule's import costs ~20 s per process, so every test here shares one module-scoped
tuning: the CLI tunes a tiny model (conv2d + relu, reshape, matmul) in a subprocess that is
killed with SIGKILL once the first operator is in the ledger, and this process resumes it.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

TRIALS = 8  # the whole model: 4 per tuned operator
PER_ITER = 4
# the convolution's constant weight is packed into output-channel panels on llvm
# (backend/cpu/pack_conv_weights.py; 8 input channels: fewer, as in an RGB stem, are left
# unpacked): what is tuned, and what compile looks up, is that call
TUNED_OPS = ("fused_conv2d_packed_relu", "matmul")

# The tuned database is a module fixture that takes minutes: one xdist worker builds it once.
pytestmark = pytest.mark.xdist_group("tuning")


def _tiny_onnx(path: str, conv: bool = True) -> str:
    """conv2d + relu, reshape, matmul; or the matmul alone (``conv=False``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype("float32"), "w"),
        numpy_helper.from_array(rng.standard_normal((512, 16)).astype("float32"), "m"),
        numpy_helper.from_array(np.array([1, 512], dtype="int64"), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y"]),
    ]
    x_shape = [1, 8, 8, 8]
    if not conv:
        nodes, inits, x_shape = nodes[3:], inits[1:2], [1, 512]
        nodes[0].input[0] = "x"
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, path)
    return path


def _ledger(db: str) -> dict:
    path = os.path.join(db, "rtask_tuning.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)["tasks"]
    except ValueError:
        return {}


def _tune(model, db, out, **kw):
    from tvm_rtask.tuning import tune

    return tune(
        model,
        "llvm",
        db,
        trials=TRIALS,
        num_trials_per_iter=PER_ITER,
        num_cores=2,
        progress=False,
        out=out,
        **kw,
    )


def _record_counts(model, db) -> dict[str, int]:
    from tvm_rtask.records.database import open_database, valid_records
    from tvm_rtask.tuning import extract_tasks
    from tvm_rtask.tuning.tasks import prepared, task_module

    database = open_database(db)
    return {
        t.name: len(valid_records(database, task_module(t.func), 1000))
        for t in extract_tasks(prepared(model))
    }


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Kill a CLI tuning run after its first operator, then resume it here."""
    root = tmp_path_factory.mktemp("tuning")
    model = _tiny_onnx(str(root / "tiny.onnx"))
    db = str(root / "db")
    cmd = [
        sys.executable,
        "-m",
        "tvm_rtask.cli",
        "tune",
        model,
        "--db",
        db,
        "--trials",
        str(TRIALS),
        "--trials-per-iter",
        str(PER_ITER),
        "--num-cores",
        "2",
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # MetaSchedule's tensor intrinsics take ~20 s to import: load them here meanwhile.
    importer = threading.Thread(target=importlib.import_module, args=("tvm.s_tir.tensor_intrin",))
    importer.start()
    deadline = time.monotonic() + 300
    while not _ledger(db) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    output = proc.communicate()[0].decode()
    importer.join()
    assert proc.returncode == -signal.SIGKILL, output
    killed = {"ledger": _ledger(db), "records": _record_counts(model, db)}
    out = io.StringIO()
    report = _tune(model, db, out)
    return {"model": model, "db": db, "killed": killed, "resumed": report, "out": out.getvalue()}


def test_killed_run_resumes_without_losing_work(tuned):
    killed, resumed = tuned["killed"], tuned["resumed"]
    assert len(killed["ledger"]) == 1, "the kill should land after exactly one operator"
    (first,) = (entry["name"] for entry in killed["ledger"].values())
    (second,) = set(TUNED_OPS) - {first}
    # the finished operator is reused, the other one gets exactly its remaining trials
    assert first not in resumed.tuned
    assert resumed.reused >= 1
    per_op = TRIALS // len(TUNED_OPS)
    assert resumed.trials_run == per_op - killed["records"][second]
    after = _record_counts(tuned["model"], tuned["db"])
    assert after[first] == killed["records"][first]
    assert after[second] == per_op
    assert tuned["out"].strip().splitlines()[-1] == (
        f"trials run: {resumed.trials_run}, reused: {resumed.reused}"
    )


def test_budget_and_second_run_reuses_everything(tuned):
    ledger = _ledger(tuned["db"])
    assert sorted(e["name"] for e in ledger.values()) == sorted(TUNED_OPS)
    assert sum(e["trials"] for e in ledger.values()) <= 32
    out = io.StringIO()
    report = _tune(tuned["model"], tuned["db"], out)
    assert (report.trials_run, report.reused) == (0, len(TUNED_OPS))
    assert out.getvalue().strip().splitlines()[-1] == "trials run: 0, reused: 2"


def test_compile_uses_tuned_kernels_and_numerics_match(tuned):
    import onnx

    import tvm_rtask
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs
    from tvm_rtask.testing.run import run_executable

    inputs = {"x": np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype("float32")}
    (expected,) = onnxruntime_outputs(onnx.load(tuned["model"]), inputs)
    (plain,) = run_executable(tvm_rtask.compile(tuned["model"], "llvm", num_veu=2), inputs)
    (with_db,) = run_executable(
        tvm_rtask.compile(tuned["model"], "llvm", num_veu=2, db=tuned["db"]), inputs
    )
    # the default plan runs variants other than the first, so the numerics cover the
    # lowering of a chosen variant too
    default = tvm_rtask.plan(tuned["model"], "llvm", num_veu=2)
    assert any(
        program.kernel_of(op) != default.graph.op(op).rkernels[0].name
        for program in default.programs()
        for op in program.ops()
    )
    np.testing.assert_allclose(with_db, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(with_db, plain, rtol=1e-4, atol=1e-4)
    plan = tvm_rtask.plan(tuned["model"], "llvm", num_veu=2, db=tuned["db"])
    for op in plan.graph.ops:
        measured = [k.est_us is not None for k in op.rkernels]
        assert all(measured) == any(name in op.func for name in TUNED_OPS), op.name


def _planned(model, **options):

    from tvm_rtask.relax_passes import PlanRPrograms
    from tvm_rtask.tuning.tasks import prepared

    fused = prepared(model)
    return fused, PlanRPrograms("llvm", num_veu=2, **options)(fused)


@pytest.mark.parametrize("use_db", [False, True], ids=["default", "tuned"])
def test_matmul_and_conv_get_variants_with_distinct_rtask_counts(tuned, use_db):
    from tvm_rtask.backend.cpu.backend import kernel_function
    from tvm_rtask.core import Plan
    from tvm_rtask.records import TUNED_ATTR
    from tvm_rtask.relax_passes import PLAN_ATTR

    fused, mod = _planned(tuned["model"], **({"db": tuned["db"]} if use_db else {}))
    plan = Plan.from_json(str(mod.attrs[PLAN_ATTR]))
    rng = np.random.default_rng(2)
    for op in plan.graph.ops:
        if op.func not in TUNED_OPS:
            continue
        counts = [k.num_rtasks for k in op.rkernels]
        assert len(set(counts)) == len(counts), (op.name, counts)
        if use_db:
            # a record splits along its own parallel loop: what MetaSchedule found in a few
            # trials decides the counts (a record with no parallel loop is one rTask)
            assert set(counts) == _record_rtask_counts(tuned["db"], fused[op.func]), op.name
        else:
            assert len(counts) >= 2, (op.name, counts)
        # each variant is the function the lowering will inline, and computes the operator
        args = [
            rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
            for p in fused[op.func].params
        ]
        expected = _call(fused[op.func], args)
        for kernel in op.rkernels:
            func = mod[kernel_function(mod, op.func, kernel.name)]
            assert int(func.attrs["rtask.num_rtasks"]) == kernel.num_rtasks
            assert (TUNED_ATTR in func.attrs) == use_db
            np.testing.assert_allclose(_call(func, args), expected, rtol=1e-4, atol=1e-4)


def _record_rtask_counts(db: str, func) -> set[int]:
    """The rTask counts a tuned operator's records allow on 2 vEUs (at most 4, 2 or 1)."""
    from tvm_rtask.backend.cpu.tuned import chunk_count, outer_parallel_extent
    from tvm_rtask.tuning import load_tuned

    extents = [outer_parallel_extent(s.func) for s in load_tuned(db).schedules(func)]
    assert extents, "the operator was tuned"
    return {chunk_count(extent, limit) for extent in extents for limit in (4, 2, 1)}


def _call(func, args) -> np.ndarray:
    """Run a PrimFunc stand-alone (its chunk loop runs every rTask); the last arg is the output."""
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")
    tensors = [tvm.runtime.tensor(a) for a in args]
    tensors[-1] = tvm.runtime.empty(args[-1].shape, "float32", tvm.cpu())
    lib["main"](*tensors)
    return tensors[-1].numpy()


def test_rpc_tracker_and_server_on_loopback(tmp_path):
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    tracker = Tracker("127.0.0.1", port=9190, port_end=9290, silent=True)
    server = Server(
        host="127.0.0.1",
        port=9300,
        port_end=9400,
        key="rtask-test",
        silent=True,
        tracker_addr=("127.0.0.1", tracker.port),
    )
    try:
        db = str(tmp_path / "db")
        model = _tiny_onnx(str(tmp_path / "matmul.onnx"), conv=False)
        from tvm_rtask.tuning import tune

        report = tune(
            model,
            "llvm",
            db,
            trials=2,
            num_trials_per_iter=2,
            num_cores=2,
            rpc=f"127.0.0.1:{tracker.port}:rtask-test",
            progress=False,
            out=io.StringIO(),
        )
    finally:
        server.terminate()
        tracker.terminate()
    assert report.trials_run == 2
    # measured on the server: the records built and ran
    assert _record_counts(model, db) == {"matmul": 2}


def test_compile_reads_a_torn_database_without_writing_it(tuned, tmp_path):
    import shutil

    from tvm_rtask.tuning import extract_tasks, load_tuned
    from tvm_rtask.tuning.tasks import prepared

    db = tmp_path / "db"
    shutil.copytree(tuned["db"], db)
    records = db / "database_tuning_record.json"
    torn = records.read_text() + '[0, [[["GetSBlock"'  # a tuner is appending right now
    records.write_text(torn)
    kernels = load_tuned(db)
    assert all(kernels.schedules(t.func) for t in extract_tasks(prepared(tuned["model"])))
    assert records.read_text() == torn


def test_torn_database_line_is_dropped(tmp_path):
    from tvm_rtask.records.database import repair

    records = tmp_path / "database_tuning_record.json"
    records.write_text("[0, [1]]\n[0, [2]]\n[0, [3")  # a write cut short by SIGKILL
    assert repair(tmp_path, dry_run=True) == 1
    assert records.read_text().endswith("[3")
    assert repair(tmp_path) == 1
    assert records.read_text() == "[0, [1]]\n[0, [2]]\n"
    assert repair(tmp_path) == 0


def test_bad_budgets_and_rpc_addresses_are_refused():
    from tvm_rtask.errors import OptionError
    from tvm_rtask.tuning import RPCSettings, tune

    assert RPCSettings.parse("10.0.0.1:9190:cpu") == RPCSettings("10.0.0.1", 9190, "cpu")
    for text in ("10.0.0.1:cpu", "host:port:key", ":9190:cpu"):
        with pytest.raises(OptionError, match="HOST:PORT:KEY"):
            RPCSettings.parse(text)
    with pytest.raises(OptionError, match="budget"):
        tune("unused.onnx", trials=None, seconds=None)
    with pytest.raises(OptionError, match="trials"):
        tune("unused.onnx", trials=0)


@pytest.mark.slow
def test_zoo_model_tuned_within_a_time_budget_matches_onnxruntime(tmp_path):
    """SqueezeNet (reduced): 22 tuned operators, 2 trials each, at most 10 minutes."""
    import tvm_rtask
    import tvm_rtask.models as zoo
    from tvm_rtask.testing.onnx_light import onnxruntime_outputs, relative_error
    from tvm_rtask.testing.run import run_executable
    from tvm_rtask.tuning import extract_tasks, tune
    from tvm_rtask.tuning.tasks import prepared

    model = zoo.onnx_model("squeezenet", reduced=True)
    db = str(tmp_path / "db")
    report = tune(
        model,
        "llvm",
        db,
        trials=44,
        seconds=600,
        num_trials_per_iter=2,
        num_cores=2,
        progress=False,
        out=io.StringIO(),
    )
    assert 0 < report.trials_run <= 44
    tasks = extract_tasks(prepared(model))
    assert sorted(report.tuned + report.pending) == sorted(t.name for t in tasks)
    inputs = zoo.sample_inputs(model)
    (expected,) = onnxruntime_outputs(model, inputs)
    (actual,) = run_executable(tvm_rtask.compile(model, "llvm", num_veu=2, db=db), inputs)
    assert relative_error(actual, expected) < 1e-4


def test_ship_records_keeps_a_record_only_where_it_wins(tuned, tmp_path):
    """``python -m bench ship-records window`` on the tuned work directory (nothing left to
    tune): every operator compared with the rules, kept exactly where it is faster by the
    margin and computes the same, the set readable, the work directory packed."""
    import shutil
    import tarfile

    from bench import ship_records
    from tvm_rtask.records.sets import read_manifest

    work = tmp_path / "work"
    shutil.copytree(tuned["db"], work)
    out = tmp_path / "out"
    argv = ["window", "--set", "x86_64-avx2", "--work", str(work), "--models", tuned["model"],
            "--out", str(out), "--seconds", "120", "--ship-seconds", "100", "--repeat", "2",
            "--rounds", "1"]  # fmt: skip
    assert ship_records.main(argv) == 0
    manifest = read_manifest(out / "x86_64-avx2")
    entries = list(manifest["operators"].values())
    assert sorted(e["name"] for e in entries) == sorted(TUNED_OPS)
    for entry in entries:
        times = entry["times"]["set"]
        wins = times["speedup"] >= manifest["min_speedup"] and times["rel_error"] < 1e-4
        assert entry["kept"] == wins, entry
        assert entry["kept"] or entry["reason"]
    assert manifest["models"][tuned["model"]]["tuned"] == len(TUNED_OPS)
    with tarfile.open(out / "work.tar.gz") as tar:
        assert "work/rtask_tuning.json" in tar.getnames()
