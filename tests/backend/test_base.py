"""The backend interface: options checked per target, one place that knows target kinds."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import tvm

import tvm_rtask
from tvm_rtask.backend import as_target, get_backend, supported_kinds, target_dict
from tvm_rtask.errors import OptionError
from tvm_rtask.options import RTaskOptions, resolve_options
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


def test_target_specific_options_have_one_owner_each():
    from tvm_rtask.backend.base import Backend
    from tvm_rtask.backend.cpu.backend import CPUBackend
    from tvm_rtask.backend.cuda.backend import CUDABackend

    owned = [*CPUBackend.OPTIONS, *CUDABackend.OPTIONS]
    assert len(owned) == len(set(owned))
    known = {f.name for f in fields(RTaskOptions)}
    assert set(owned) <= known
    assert {k: c.__name__ for k, c in Backend._option_owners.items() if k in owned} == {
        **{k: "CPUBackend" for k in CPUBackend.OPTIONS},
        **{k: "CUDABackend" for k in CUDABackend.OPTIONS},
    }


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


def test_config_keys_are_the_option_fields():
    names = {f"rtask.{f.name}" for f in fields(RTaskOptions)} - {
        "rtask.policy_options",
        "rtask.cost",
    }
    assert set(CONFIG_OPTIONS) == names
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
