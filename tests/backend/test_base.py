"""The backend interface: options checked per target, one place that knows target kinds."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import tvm

import tvm_rtask
from tvm_rtask.backend import as_target, get_backend, supported_kinds, target_dict
from tvm_rtask.errors import OptionError
from tvm_rtask.options import RTaskOptions, backend_options, resolve_options
from tvm_rtask.relax_passes import fuse
from tvm_rtask.relax_passes.plan_rprograms import plan_options
from tvm_rtask.runtime.config import CONFIG_OPTIONS

PACKAGE = Path(tvm_rtask.__file__).parent


def test_cpu_rules_on_cuda_are_refused():
    with pytest.raises(OptionError, match="cpu_rules applies to llvm targets only"):
        plan_options({"cpu_rules": True}, None, as_target("cuda"))


def test_cpu_layout_on_cuda_is_refused():
    with pytest.raises(OptionError, match="cpu_layout applies to llvm targets only"):
        plan_options({"cpu_layout": "nchwc"}, None, as_target("cuda"))


def test_global_barrier_on_cuda_is_refused_not_ignored():
    with pytest.raises(OptionError, match="barrier='global' is not implemented on CUDA"):
        plan_options({"barrier": "global"}, None, as_target("cuda"))
    plan_options({"barrier": "global"}, None, as_target("llvm"))  # llvm implements it


def test_dependency_counters_on_llvm_are_refused_not_ignored():
    with pytest.raises(OptionError, match="barrier='counter'.*CUDA only"):
        plan_options({"barrier": "counter"}, None, as_target("llvm"))
    plan_options({"barrier": "counter"}, None, as_target("cuda"))


@pytest.mark.parametrize("key, value", [("cuda_threads", 128), ("check_status", True)])
def test_cuda_options_on_llvm_are_refused(key, value):
    with pytest.raises(OptionError, match=f"{key} applies to CUDA targets only"):
        plan_options({key: value}, None, as_target("llvm"))


@pytest.mark.parametrize(
    "key, value", [("cuda_rules", True), ("cuda_body_functions", False), ("spills", "error")]
)
def test_every_option_of_another_backend_is_refused(key, value):
    """The refusal comes from the owning backend's OPTIONS, not from a hand list."""
    with pytest.raises(OptionError, match=f"{key} applies to CUDA targets only"):
        plan_options({key: value}, None, as_target("llvm"))


def test_each_backend_declares_its_own_options():
    """A backend's options are the fields of its Options class, none of them a field of
    RTaskOptions (which holds them as given, in target_options)."""
    from tvm_rtask.backend.cpu.backend import CPUBackend, CPUOptions
    from tvm_rtask.backend.cuda.backend import CUDABackend, CUDAOptions

    assert CPUBackend.OPTIONS == ("cpu_rules", "cpu_layout", "cpu_winograd", "cpu_build_jobs")
    assert set(CUDABackend.OPTIONS) == {
        "cuda_threads",
        "cuda_registers",
        "device",
        "check_status",
        "verify_occupancy",
        "spills",
        "cooperative_launch",
        "cuda_rules",
        "cuda_body_functions",
        "cuda_veu_placement",
    }
    assert CPUBackend.Options is CPUOptions and CUDABackend.Options is CUDAOptions
    core = {f.name for f in fields(RTaskOptions)}
    assert not (set(CPUBackend.OPTIONS) | set(CUDABackend.OPTIONS)) & core
    assert set(backend_options()) == {*CPUBackend.OPTIONS, *CUDABackend.OPTIONS}


def test_an_option_is_parsed_from_the_keyword_into_the_backends_field():
    options = resolve_options({"cuda_threads": 128, "cuda_veu_placement": "smid"})
    assert options.target_options == {"cuda_threads": 128, "cuda_veu_placement": "smid"}
    parsed = get_backend("cuda").options_for(options)
    assert (parsed.threads, parsed.veu_placement, parsed.spills) == (128, "smid", "warn")
    cpu = get_backend("llvm").options_for(resolve_options({"cpu_layout": "nchw"}))
    assert (cpu.layout, cpu.barrier, cpu.rtasks_per_veu) == ("nchw", "fine", 2)


def test_the_core_options_a_backend_defaults_are_its_declared_defaults():
    """CORE_DEFAULTS (shown in docs/options.md) are what the backend uses."""
    unset = resolve_options({})
    for target in ("llvm", "cuda"):
        backend = get_backend(target)
        defaults = backend.Options.CORE_DEFAULTS
        assert backend.barrier(unset) == defaults["barrier"]
        assert backend.options_for(unset).rtasks_per_veu == defaults["rtasks_per_veu"]
        assert backend.program_limits(unset) == {
            k: defaults[k] for k in ("max_ops_per_program", "max_kernels_per_program")
        }


def test_an_unknown_option_lists_the_core_and_the_targets_options():
    with pytest.raises(OptionError, match=r"unknown option.*policy.*cpu_rules") as err:
        plan_options({"nosuch": 1}, None, as_target("llvm"))
    assert "cpu_rules" in str(err.value) and "cuda_threads" not in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(OptionError, match="unknown option") as err:
        resolve_options({"nosuch": 1})  # no target known: every backend's
    assert "cpu_rules" in str(err.value) and "cuda_threads" in str(err.value)


def test_pass_context_keys_reach_the_backends_options():
    from tvm_rtask.runtime.config import register_config_options

    assert register_config_options()
    config = {"rtask.cuda_threads": 128, "rtask.spills": "error", "rtask.policy": "sequential"}
    with tvm.transform.PassContext(config=config) as ctx:
        options = plan_options({"cuda_threads": 64}, ctx, as_target("cuda"))
    assert options.policy == "sequential"
    assert options.target_options == {"cuda_threads": 64, "spills": "error"}  # keyword wins
    with tvm.transform.PassContext(config={"rtask.cpu_rules": False}) as ctx:
        with pytest.raises(OptionError, match="cpu_rules applies to llvm targets only"):
            plan_options({}, ctx, as_target("cuda"))


def test_a_registered_backends_options_are_options_everywhere(monkeypatch):
    """A backend outside the package declares an option in its Options class only: it is
    then a keyword, a PassContext key, a row of the table, and refused on other targets."""
    from tvm_rtask import options as options_module
    from tvm_rtask.backend import registry
    from tvm_rtask.backend.base import TargetOptions
    from tvm_rtask.backend.cpu.backend import CPUBackend
    from tvm_rtask.options import option, option_table_markdown
    from tvm_rtask.runtime import config

    @dataclass(frozen=True)
    class FakeOptions(TargetOptions):
        fake_level: int = option(3, bounds=(0, 9), help="how fake the fake target is")

    class FakeBackend(CPUBackend):
        label = "fake"
        target_kinds = ("ext_dev",)
        Options = FakeOptions

    assert config.register_config_options()
    try:
        with monkeypatch.context() as m:
            m.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
            m.setattr(options_module, "_BACKENDS", list(options_module._BACKENDS))
            registry.register_backend(FakeBackend)
            options = resolve_options({"fake_level": 5})
            assert FakeOptions.from_options(options).fake_level == 5
            assert FakeOptions.from_options(resolve_options({})).fake_level == 3
            with pytest.raises(OptionError, match="fake_level must be in 0..9"):
                resolve_options({"fake_level": 10})
            with pytest.raises(OptionError, match="fake_level applies to fake targets only"):
                get_backend("llvm").check_options(options)
            assert "| `fake_level` | int, 0..9 | `3` | fake | how fake" in option_table_markdown()
            assert config.CONFIG_OPTIONS["rtask.fake_level"] == "int"
            with tvm.transform.PassContext(config={"rtask.fake_level": 4}) as ctx:
                assert resolve_options({}, ctx.config).target_options == {"fake_level": 4}
    finally:
        config.refresh_config_options()
    assert "rtask.fake_level" not in config.CONFIG_OPTIONS
    assert "fake_level" not in backend_options()


def test_plan_options_round_trip_and_old_plans_still_load():
    options = resolve_options({"cuda_threads": 128, "num_veu": 4})
    data = json.loads(json.dumps(options.to_dict()))
    assert data["target_options"] == {"cuda_threads": 128}
    assert RTaskOptions.from_dict(data) == options
    # a plan's JSON from before target_options: every option at the top level, None unset
    old = {k: v for k, v in data.items() if k != "target_options"}
    old.update(cuda_threads=128, cpu_rules=None, device=None, gone_option=1)
    assert RTaskOptions.from_dict(old) == options


def test_each_backend_parses_its_options_once_per_options_object():
    backend = get_backend("cuda")
    options = resolve_options({"cuda_threads": 128})
    parsed = backend.options_for(options)
    assert parsed.threads == 128 and backend.options_for(options) is parsed
    other = resolve_options({"cuda_threads": 256})
    assert backend.options_for(other).threads == 256
    assert get_backend("llvm").options_for(resolve_options({"barrier": "global"})).barrier == (
        "global"
    )


def test_a_backend_must_implement_the_abstract_methods():
    from tvm_rtask.backend.base import Backend

    class Partial(Backend):
        name = "partial"

        def device(self):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Partial(as_target("llvm"))


def test_policy_options_reach_the_policy():
    options = resolve_options({"policy": "ios", "r": 2, "s": 4})
    assert options.policy_options == {"r": 2, "s": 4}
    with pytest.raises(OptionError, match="unknown option"):
        resolve_options({"policy": "wavefront", "r": 2})
    with pytest.raises(OptionError, match="cost must be"):
        resolve_options({"cost": "magic"})


def test_stitch_fusion_scores_with_the_targets_device(monkeypatch):
    seen = []

    def fake(fusion, device="cpu", target_passes=()):
        seen.append((fusion, device))
        return tvm.transform.Sequential([])

    monkeypatch.setattr(fuse, "prepare_pipeline", fake)
    mod = tvm.IRModule()
    fuse.RTaskPrepare("stitch", "cuda")(mod)
    fuse.RTaskPrepare("stitch", {"kind": "cuda", "arch": "sm_80"})(mod)
    fuse.RTaskPrepare("stitch", "llvm")(mod)
    assert seen == [("stitch", "h100"), ("stitch", "a100"), ("stitch", "cpu")]


def test_config_keys_are_the_core_and_the_backends_options():
    names = {f"rtask.{f.name}" for f in fields(RTaskOptions)} - {
        "rtask.policy_options",
        "rtask.cost",
        "rtask.target_options",
    }
    assert set(CONFIG_OPTIONS) == names | {f"rtask.{n}" for n in backend_options()}
    assert "rtask.cuda_threads" in CONFIG_OPTIONS and "rtask.cpu_layout" in CONFIG_OPTIONS
    assert CONFIG_OPTIONS["rtask.num_veu"] == "int" and CONFIG_OPTIONS["rtask.db"] == "str"
    assert CONFIG_OPTIONS["rtask.check_status"] == "bool"


def test_targets_round_trip_through_plain_data():
    for target in ("llvm", "cuda", {"kind": "cuda", "arch": "sm_80"}):
        t = as_target(target)
        assert str(tvm.target.Target(target_dict(t))) == str(t)
        assert get_backend(t).name in ("cpu", "cuda")
    assert supported_kinds() == ["c", "cuda", "llvm"]
    with pytest.raises(OptionError, match="not supported"):
        as_target({"kind": "opencl"})


def test_only_the_backends_test_the_target_kind():
    pattern = re.compile(r'kind\.name\s*[!=]=\s*"(cuda|llvm)"')
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "backend" not in path.relative_to(PACKAGE).parts and pattern.search(path.read_text())
    ]
    assert offenders == []
