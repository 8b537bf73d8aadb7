"""Shipped record sets: the device key of a target, the ``db`` option's default, bad
manifests, and the set that ships with the package.

The compile tests use a set made here in a temporary directory: one hand-written schedule of
a tiny matmul, committed as a MetaSchedule record (no tuning, so no measurement and no
tensor-intrinsic import), with ``records.sets.SHIPPED_DIR`` pointed at it.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from tvm.target import Target

from tvm_rtask.errors import OptionError
from tvm_rtask.records import sets

HASWELL = {"kind": "llvm", "mcpu": "haswell"}
RECORD_US = 12.5  # the made-up measured time of the tiny set's record


@pytest.fixture(autouse=True)
def _forget_told_sets():
    sets._told.clear()
    yield
    sets._told.clear()


def _needs_avx2():
    from tvm_rtask.backend.cpu.host import missing_host_features

    if missing_host_features(["avx2", "fma"]):
        pytest.skip("this host has no AVX2: code built for haswell cannot run")


# -- device keys ------------------------------------------------------------------------------
def _set_key(target, device=None):
    """The set the target's backend chooses (None for a kind without a backend)."""
    from tvm_rtask.backend import get_backend
    from tvm_rtask.options import resolve_options

    try:
        backend = get_backend(target)
    except OptionError:
        return None
    return backend.record_set(resolve_options({"device": device} if device else {}))


@pytest.mark.parametrize(
    "target, device, key",
    [
        ("llvm", None, None),  # plain llvm: generic x86-64, SSE2
        (HASWELL, None, "x86_64-avx2"),
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, None, "x86_64-avx2"),
        ({"kind": "llvm", "mcpu": "znver3"}, None, "x86_64-avx2"),
        ({"kind": "llvm", "mcpu": "nehalem"}, None, None),  # SSE4.2, no AVX2
        ({"kind": "llvm", "mcpu": "sandybridge"}, None, None),  # AVX without AVX2
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"}, None, None),
        ({"kind": "cuda", "arch": "sm_90"}, None, "h100"),
        ({"kind": "cuda", "arch": "sm_90"}, "h100", "h100"),
        ({"kind": "cuda", "arch": "sm_90"}, "h200", "h200"),
        ({"kind": "cuda", "arch": "sm_80"}, None, None),
        ({"kind": "c"}, None, None),
    ],
)
def test_set_key_of_a_target(target, device, key):
    assert _set_key(Target(target), device) == key


def test_host_cpu_target_maps_to_the_avx2_set_when_the_host_has_avx2():
    from tvm_rtask.backend import as_target
    from tvm_rtask.backend.cpu.host import missing_host_features

    expected = None if missing_host_features(["avx2"]) else "x86_64-avx2"
    assert _set_key(as_target("llvm-native")) == expected


# -- the db option ----------------------------------------------------------------------------
def test_a_path_is_used_as_given_and_false_or_none_turns_records_off(tmp_path):
    name = _set_key(Target(HASWELL))
    assert sets.resolve_db("some/work/dir", name) == "some/work/dir"
    assert sets.resolve_db(tmp_path, name) == str(tmp_path)
    assert sets.resolve_db(False, name) is False
    assert sets.resolve_db("none", name) is False
    assert sets.resolve_db("None", name) is False
    with pytest.raises(OptionError, match="db must be"):
        sets.resolve_db(3, name)


def test_options_accept_a_path_false_and_none_only():
    from tvm_rtask.options import config_types, resolve_options

    assert resolve_options({}).db is None
    assert resolve_options({"db": False}).db is False
    assert resolve_options({"db": "none"}).db == "none"
    assert resolve_options({"db": "work"}).db == "work"
    assert resolve_options({"db": Path("work")}).db == "work"
    for bad in (True, 3):
        with pytest.raises(OptionError, match="db must be"):
            resolve_options({"db": bad})
    assert config_types()["rtask.db"] == "str"  # a PassContext key takes "none" or a path


def test_absent_set_is_said_once_and_falls_back_to_the_rules(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sets, "SHIPPED_DIR", tmp_path)
    cuda = Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    with caplog.at_level(logging.INFO, logger="tvm_rtask"):
        assert sets.resolve_db(None, _set_key(cuda)) is False
        assert sets.resolve_db(None, _set_key(cuda, "h200")) is False
        assert sets.resolve_db(None, _set_key(cuda)) is False  # said once per set
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "no shipped record set 'h100': the rules' schedules are used",
        "no shipped record set 'h200': the rules' schedules are used",
    ]
    assert sets.resolve_db(None, _set_key(Target("llvm"))) is False  # none for plain llvm


def test_plan_options_resolve_db_for_cuda_without_a_set(tmp_path, monkeypatch):
    from tvm_rtask.backend import as_target
    from tvm_rtask.relax_passes.plan_rprograms import plan_options

    monkeypatch.setattr(sets, "SHIPPED_DIR", tmp_path)
    assert plan_options({}, None, as_target("cuda")).db is False
    assert plan_options({"db": "work"}, None, as_target("cuda")).db == "work"


# -- a tiny set -------------------------------------------------------------------------------
def _tiny_matmul(rows: int = 4, cols: int = 16):
    """``x[rows, 64] @ m[64, cols]``; 16 columns are one weight panel on AVX2 and AVX-512
    alike, so PackMatmulWeights leaves the product as ``matmul`` on either host."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "m"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
        [numpy_helper.from_array(rng.standard_normal((64, cols)).astype("float32"), "m")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def make_tiny_set(root, name: str = "x86_64-avx2") -> dict:
    """A set of one record: the tiny model's matmul, rows parallel, columns vectorized."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from tvm_rtask.tuning.tasks import extract_tasks, prepared, task_module, workload_key

    model = _tiny_matmul()
    (task,) = extract_tasks(prepared(model))
    mod = task_module(task.func)
    sch = s_tir.Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("matmul"))
    jo, ji = sch.split(j, [None, 8])
    sch.reorder(i, jo, k, ji)
    sch.parallel(i)
    sch.vectorize(ji)
    path = root / name
    path.mkdir(parents=True)
    database = ms.database.JSONDatabase(work_dir=str(path))
    database.commit_tuning_record(
        ms.database.TuningRecord(
            sch.trace,
            database.commit_workload(mod),
            [RECORD_US * 1e-6],
            Target({**HASWELL, "num-cores": 2}),
            ms.arg_info.ArgInfo.from_prim_func(task.func),
        )
    )
    key = workload_key(task.func)
    manifest = {
        "format": 1,
        "set": name,
        "target": HASWELL,
        "models": {"tiny": {"operators": 1, "tuned": 1, "kept": 1}},
        "operators": {key: {"name": task.name, "models": ["tiny"], "kept": True}},
    }
    (path / sets.MANIFEST).write_text(json.dumps(manifest))
    return {"model": model, "path": path, "key": key}


@pytest.fixture
def tiny_set(tmp_path, monkeypatch):
    found = make_tiny_set(tmp_path / "shipped")
    monkeypatch.setattr(sets, "SHIPPED_DIR", tmp_path / "shipped")
    return found


def _matmul_kernels(plan):
    return [k for op in plan.graph for k in op.rkernels if k.name.startswith("matmul@")]


def test_default_compile_uses_the_shipped_set_and_matches_tvm(tiny_set):
    import tvm
    from tvm import relax

    import tvm_rtask
    from tvm_rtask import frontend

    _needs_avx2()
    mod = frontend.load(tiny_set["model"])
    x = np.random.default_rng(1).standard_normal((4, 64)).astype("float32")
    plan = tvm_rtask.plan(mod, HASWELL, num_veu=2)
    assert plan.options["db"] == str(tiny_set["path"])
    # the record's measured time, not the analytical model's: the set was used
    kernels = _matmul_kernels(plan)
    assert kernels and all(k.est_us is not None for k in kernels)
    assert any(k.num_rtasks == 1 and k.est_us == pytest.approx(2 * RECORD_US) for k in kernels)

    ex = tvm_rtask.compile(mod, HASWELL, num_veu=2)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    reference = relax.VirtualMachine(tvm.compile(mod, Target(HASWELL)), tvm.cpu())
    expected = reference["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_db_false_and_none_turn_the_shipped_set_off(tiny_set):
    import tvm_rtask
    from tvm_rtask import frontend

    mod = frontend.load(tiny_set["model"])
    for off in (False, "none"):
        plan = tvm_rtask.plan(mod, HASWELL, num_veu=2, db=off)
        assert plan.options["db"] is False
        assert all(k.est_us is None for k in _matmul_kernels(plan))  # the rules' schedule


def test_pass_context_db_none_turns_the_shipped_set_off(tiny_set):
    import tvm

    import tvm_rtask
    from tvm_rtask import frontend

    mod = frontend.load(tiny_set["model"])
    with tvm.transform.PassContext(config={"rtask.db": "none"}):
        plan = tvm_rtask.plan(mod, HASWELL, num_veu=2)
    assert plan.options["db"] is False


def test_plain_llvm_never_uses_the_avx2_set(tiny_set):
    import tvm_rtask
    from tvm_rtask import frontend

    plan = tvm_rtask.plan(frontend.load(tiny_set["model"]), "llvm", num_veu=2)
    assert plan.options["db"] is False


def test_cli_db_none_is_no_records():
    from tvm_rtask.cli.build import check_options
    from tvm_rtask.cli.main import _options_from, build_parser

    args = build_parser().parse_args(["compile", "squeezenet", "--db", "none"])
    options = check_options(_options_from(args))
    assert sets.resolve_db(options["db"], _set_key(Target(HASWELL))) is False


# -- bad sets ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: (p / sets.MANIFEST).unlink(), "no manifest.json"),
        (lambda p: (p / sets.MANIFEST).write_text('{"set": "x86'), "manifest.json is unreadable"),
        (lambda p: (p / sets.MANIFEST).write_text("[]"), "has no 'operators' table"),
        (
            lambda p: (p / sets.MANIFEST).write_text('{"set": "h100", "operators": {}}'),
            "names set 'h100'",
        ),
        (lambda p: (p / "database_tuning_record.json").unlink(), "missing"),
    ],
)
def test_a_damaged_set_is_one_warning_and_the_rules(tiny_set, caplog, damage, message):
    damage(tiny_set["path"])
    with pytest.raises(sets.RecordSetError, match=message) as err:
        sets.read_manifest(tiny_set["path"])
    assert "\n" not in str(err.value)
    with caplog.at_level(logging.INFO, logger="tvm_rtask"):
        assert sets.resolve_db(None, _set_key(Target(HASWELL))) is False
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and message in record.getMessage()
    assert "ignored, the rules' schedules are used" in record.getMessage()


# -- the set in the package ---------------------------------------------------------------------
def _workload_keys(path) -> dict[int, str]:
    """Index of each workload in the set's database -> its key (``workload_key``'s hex)."""
    keys = {}
    lines = (path / "database_workload.json").read_text().splitlines()
    for index, line in enumerate(lines):
        shash = int(json.loads(line)[0])
        keys[index] = f"{shash & (2**64 - 1):016x}"
    return keys


@pytest.mark.parametrize("name", sets.available() or ["x86_64-avx2"])
def test_shipped_set_manifest_matches_its_database(name):
    path = sets.set_dir(name)
    if not path.is_dir():
        pytest.skip(f"no shipped set {name!r}")
    manifest = sets.read_manifest(path)
    assert manifest["set"] == name == _set_key(Target(manifest["target"]))
    kept = {k for k, e in manifest["operators"].items() if e["kept"]}
    for entry in manifest["operators"].values():
        assert entry["models"] and set(entry["models"]) <= set(manifest["models"])
        if entry["kept"]:  # only where it beat the rules under every target compared
            least = max(manifest.get("min_speedup", 1.0), 1.0)
            assert all(t["speedup"] >= least for t in entry["times"].values())
            assert set(entry["times"]) == set(manifest["compared_on"])
    if not kept:
        assert "note" in manifest
        return
    workloads = _workload_keys(path)
    records = [json.loads(line) for line in (path / "database_tuning_record.json").open()]
    recorded = [workloads[r[0]] for r in records]
    assert sorted(recorded) == sorted(kept)  # exactly one record per kept operator
    for record in records:
        target = record[1][2]
        assert target["kind"] == "llvm" and target["mcpu"] == manifest["target"]["mcpu"]
        # the workload decodes (a MetaSchedule JSON graph, base64)
        assert base64.b64decode(
            (path / "database_workload.json").read_text().splitlines()[record[0]].split('"')[3]
        )
