"""cost="measured" for CUDA without a GPU: the shipped profile of the options' device
(tvm_rtask/runtime/profiles/<device>/), read-only; the export that makes one."""

import json

import pytest
import tvm

import tvm_rtask
from tests.cli.test_profile import tiny  # noqa: F401 - a fixture
from tvm_rtask.backend import as_target, get_backend
from tvm_rtask.core import RGraph
from tvm_rtask.errors import OptionError
from tvm_rtask.runtime import profiler as prof
from tvm_rtask.runtime.sync_bench import SyncCost

from .test_profiler import two_branch_module

no_gpu = pytest.mark.skipif(
    tvm.cuda(0).exist, reason="the shipped profile serves machines without a GPU"
)

TARGET = {"kind": "cuda", "arch": "sm_90"}
GPU = "NVIDIA H100 80GB HBM3"
# per kernel: (total us, blocks, blocks at once); the matmul is left out of the profile
TIMES = {"add@16": (3.0, 16, 528), "multiply_join@16": (5.0, 16, 528)}


def prepared(**options):
    """What PlanRPrograms makes of the module: (module, maker, graph, vdevice, options)."""
    from tvm_rtask import frontend
    from tvm_rtask.relax_passes import RTaskPrepare, extract_graph
    from tvm_rtask.relax_passes.plan_rprograms import plan_options

    target = as_target(TARGET)
    resolved = plan_options({"db": False, **options, "cost": "measured"}, None, target)
    mod = RTaskPrepare(resolved.fusion, target)(frontend.load(two_branch_module()))
    mod, maker = get_backend(target).make_rkernels(mod.clone(), resolved)
    graph = RGraph(extract_graph(mod, maker).operators)
    return mod, maker, graph, maker.vdevice(), resolved


def sync_cost(num_veu, barrier_us, launch_us=4.0, barrier="counter"):
    return SyncCost(barrier_us, launch_us, GPU, str(as_target(TARGET)), barrier, num_veu, "test")


def fake_cache(cache, times=TIMES, name=GPU):
    """A profiler cache as a GPU run leaves it: one entry per kernel (keys made with the
    GPU's name, as ``RKernelProfiler._store`` writes them) and two sync results."""
    mod, maker, graph, vd, _ = prepared()
    keyer = prof.RKernelProfiler(TARGET, shipped=prof.ShippedProfile("h100", cache, name))
    backend = keyer.backend
    cache.mkdir(parents=True, exist_ok=True)
    for op in graph:
        for k in op.rkernels:
            if k.name not in times:
                continue
            total, blocks, concurrent = times[k.name]
            func, _, _ = backend.standalone_rkernel(mod, maker, op.func, k, vd)
            key = keyer.key(func, k.num_rtasks)
            m = prof.Measurement(
                k.name, k.num_rtasks, total, total * blocks / k.num_rtasks, str(keyer.target),
                key, False, blocks, concurrent,
            )  # fmt: skip
            d = {**{f: getattr(m, f) for f in m.__dataclass_fields__ if f != "cached"}}
            (cache / f"{key}.json").write_text(json.dumps({**d, "device": name}))
    for i, c in enumerate([sync_cost(vd.num_veu, 1.5), sync_cost(8, 9.0)]):
        (cache / f"sync-{i}.json").write_text(json.dumps(c.to_dict()))
    # an entry of another GPU is not exported
    (cache / ("f" * 32 + ".json")).write_text(
        json.dumps({"key": "f" * 32, "kernel": "x", "rtask_us": 1.0, "device": "other GPU"})
    )
    return mod, maker, graph, vd


@pytest.fixture
def shipped_root(tmp_path, monkeypatch):
    root = tmp_path / "profiles"
    monkeypatch.setattr(prof, "SHIPPED_DIR", root)
    monkeypatch.setenv(prof.CACHE_ENV, str(tmp_path / "user-cache"))
    return root


def snapshot(path):
    return {str(p): (p.stat().st_mtime_ns, p.is_file() and p.read_bytes()) for p in path.rglob("*")}


def profile_doc():
    return {
        "model": "two_branch",
        "device": GPU,
        "cost_model": {"factors": {"h100": [0.5, 0.25, 2.0]}},
    }


@no_gpu
def test_export_writes_the_shipped_format(tmp_path, shipped_root):
    fake_cache(tmp_path / "cache")
    doc = prof.export_shipped(
        shipped_root / "h100", tmp_path / "cache", profiles=[profile_doc()], command="cmd 1",
        target=str(as_target(TARGET)), date="2026-11-27",
    )  # fmt: skip
    files = sorted(p.name for p in (shipped_root / "h100").iterdir())
    assert "device.json" in files and len(files) == 1 + len(TIMES)  # no other GPU's entry
    on_disk = json.loads((shipped_root / "h100" / "device.json").read_text())
    assert on_disk == json.loads(json.dumps(doc))
    assert doc["name"] == GPU and doc["device"] == "h100" and doc["date"] == "2026-11-27"
    assert doc["commands"] == ["cmd 1"] and doc["kernels"] == len(TIMES)
    assert doc["factors"] == {"h100": [0.5, 0.25, 2.0]}
    assert sorted(s["num_veu"] for s in doc["sync"]) == sorted({8, prepared()[3].num_veu})
    # merging a second export: commands appended, factors the median per model
    second = {**profile_doc(), "model": "m2", "cost_model": {"factors": {"h100": [1, 1, 0]}}}
    doc = prof.export_shipped(shipped_root / "h100", tmp_path / "cache", [second], command="c2")
    assert doc["commands"] == ["cmd 1", "c2"] and doc["factors"]["h100"] == [0.75, 0.625, 1.0]
    assert doc["kernels"] == len(TIMES)
    loaded = prof.shipped_profile("h100")
    assert loaded.name == GPU and len(loaded.kernel_files()) == len(TIMES)
    # a profile of h100 cannot go into h200/, nor another GPU's into this one
    with pytest.raises(OptionError, match="device=h200"):
        prof.export_shipped(shipped_root / "h200", tmp_path / "cache", device="h100")
    with pytest.raises(OptionError, match="not 'other'"):
        prof.export_shipped(shipped_root / "h100", tmp_path / "cache", name="other")


@no_gpu
def test_measured_plan_without_a_gpu_uses_the_shipped_profile(tmp_path, shipped_root):
    fake_cache(tmp_path / "cache")
    prof.export_shipped(
        shipped_root / "h100", tmp_path / "cache", [profile_doc()], date="2026-11-27"
    )
    before = snapshot(shipped_root)
    mod, maker, graph, vd, options = prepared()
    model, summary = prof.measured_model_for(mod, maker, graph, vd, options, as_target(TARGET))
    shipped = summary["shipped"]
    assert shipped["device"] == "h100" and shipped["name"] == GPU
    assert shipped["date"] == "2026-11-27" and shipped["factors_from"] == "fit"
    assert (shipped["found"], shipped["missing"]) == (2, 1)
    assert shipped["missing_kernels"] == ["matmul@2"]
    # the shipped kernels cost their measured time per rTask at the width it was taken at
    for op in graph:
        k = op.rkernels[0]
        if k.name in TIMES:
            total, blocks, concurrent = TIMES[k.name]
            width = min(blocks, concurrent)
            assert model.rtask_us_at(op, k, vd, width) == pytest.approx(total)
            assert model.measured[k.name] == pytest.approx(total)
        else:  # the calibrated roofline, factors fitted to the two found
            assert k.name not in model.measured and model.rtask_us(op, k, vd) > 0
    assert vd.spec.name in model.factors
    # barrier and launch from device.json, at the vEU count nearest the plan's
    assert model.barrier_us(vd) == 1.5 and model.launch_us(vd) == 4.0
    assert shipped["sync"]["num_veu"] == vd.num_veu
    # the whole path: tvm_rtask.plan records it in the plan's options
    plan = tvm_rtask.plan(two_branch_module(), TARGET, cost="measured", db=False)
    assert plan.options["cost_model"] == "measured"
    recorded = plan.options["measured_cost"]
    assert recorded["shipped"]["found"] == 2 and recorded["shipped"]["missing"] == 1
    assert recorded["barrier_us"] == 1.5 and recorded["device"] == GPU
    # read-only: nothing written into the shipped directory, nor into the user's cache
    assert snapshot(shipped_root) == before
    assert not (tmp_path / "user-cache").exists() or not any((tmp_path / "user-cache").iterdir())


@no_gpu
def test_a_profile_without_the_kernels_falls_back(tmp_path, shipped_root):
    """No kernel found: device.json's factors, else the analytical roofline."""
    fake_cache(tmp_path / "cache", times={})
    prof.export_shipped(shipped_root / "h100", tmp_path / "cache", [profile_doc()])
    mod, maker, graph, vd, options = prepared()
    model, summary = prof.measured_model_for(mod, maker, graph, vd, options, as_target(TARGET))
    assert summary["shipped"]["found"] == 0 and summary["shipped"]["missing"] == 3
    assert summary["shipped"]["factors_from"] == "device.json"
    assert model.factors["h100"] == (0.5, 0.25, 2.0) and not model.measured
    (shipped_root / "h100" / "device.json").write_text(
        json.dumps({"name": GPU, "device": "h100", "sync": []})
    )
    model, summary = prof.measured_model_for(mod, maker, graph, vd, options, as_target(TARGET))
    assert summary["shipped"]["factors_from"] == "analytical" and not model.factors
    assert summary["barrier_us"] is None and summary["shipped"]["sync"] is None
    assert model.barrier_us(vd) == vd.spec.barrier_overhead_us


@no_gpu
def test_no_gpu_and_no_shipped_profile_is_one_clear_line(tmp_path, shipped_root):
    with pytest.raises(OptionError) as err:
        tvm_rtask.plan(two_branch_module(), TARGET, cost="measured", db=False)
    text = str(err.value)
    assert "\n" not in text and "'h100'" in text and "tvm-rtask profile" in text
    assert "cost='analytical'" in text
    # the options' device names the profile: an h100 profile does not serve device=h200
    fake_cache(tmp_path / "cache")
    prof.export_shipped(shipped_root / "h100", tmp_path / "cache")
    with pytest.raises(OptionError, match="'h200'"):
        tvm_rtask.plan(two_branch_module(), TARGET, cost="measured", device="h200", db=False)
    assert tvm_rtask.plan(two_branch_module(), TARGET, cost="measured", db=False)


@no_gpu
def test_the_cli_device_check_accepts_a_shipped_profile(tmp_path, shipped_root):
    from tvm_rtask.cli.errors import CLIError
    from tvm_rtask.cli.profile import check_device

    target = as_target(TARGET)
    with pytest.raises(CLIError, match="needs the device"):
        check_device(target, "profile")
    with pytest.raises(CLIError, match="shipped profile of device 'h100'"):
        check_device(target, "--cost measured", options={"cost": "measured"})
    fake_cache(tmp_path / "cache")
    prof.export_shipped(shipped_root / "h100", tmp_path / "cache")
    check_device(target, "--cost measured", options={"cost": "measured"})
    with pytest.raises(CLIError, match="'h200'"):
        check_device(target, "--cost measured", options={"device": "h200"})


def test_profile_export_shipped_round_trip(tiny, tmp_path, monkeypatch, capsys):  # noqa: F811
    """``tvm-rtask profile --export-shipped DIR`` (llvm here, the same code on a GPU): DIR
    holds every kernel the profile measured, and a profiler reading DIR as a shipped
    profile finds them all without measuring."""
    from tvm_rtask.cli.main import main
    from tvm_rtask.relax_passes import RTaskPrepare, extract_graph
    from tvm_rtask.relax_passes.plan_rprograms import plan_options

    monkeypatch.setenv(prof.CACHE_ENV, str(tmp_path / "unused"))
    out = tmp_path / "shipped" / "cpu-test"
    args = ["profile", tiny, "--target", "llvm", "--num-veu", "2", "--db", "none"]
    args += ["--cache", tmp_path / "cache", "--export-shipped", out]
    assert main([str(a) for a in args]) == 0
    text = capsys.readouterr().out
    assert f"-> {out}" in text
    doc = json.loads((out / "device.json").read_text())
    command = doc["commands"][0]
    assert command.startswith("tvm-rtask profile ") and "--export-shipped" in command
    assert doc["sync"][0]["barrier"] == "fine" and doc["factors"]
    shipped = prof.ShippedProfile.load(out)
    assert len(shipped.kernel_files()) == doc["kernels"] > 0
    # the same rKernels, keyed with the shipped name: all found, nothing measured or written
    from tvm_rtask import frontend

    target = as_target("llvm")
    options = plan_options({"num_veu": 2, "db": "none"}, None, target)
    mod = RTaskPrepare(options.fusion, target)(frontend.load(str(tiny)))
    mod, maker = get_backend(target).make_rkernels(mod.clone(), options)
    graph = RGraph(extract_graph(mod, maker).operators)
    before = snapshot(out)
    reader = prof.RKernelProfiler(target, shipped=shipped)
    found, _ = prof.measure_rkernels(mod, maker, graph, maker.vdevice(), reader)
    assert len(found) == doc["kernels"] and not reader.missing and reader.measured == 0
    assert snapshot(out) == before
