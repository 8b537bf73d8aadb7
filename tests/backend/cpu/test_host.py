"""Compiling for the host CPU: ``"llvm-native"`` and ``mcpu: "native"`` become the host CPU's
name before planning, plain ``"llvm"`` stays portable, an unknown ``mcpu`` is refused, and
the instruction-set features of a target are what an artifact records."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.target import Target

import tvm_rtask
from tests.relax_passes.models import TwoBranches
from tvm_rtask.backend import as_target
from tvm_rtask.backend.cpu import host
from tvm_rtask.backend.cpu.rules import vector_lanes
from tvm_rtask.errors import OptionError

X86 = platform.machine() in ("x86_64", "AMD64")


def test_native_spellings_resolve_to_the_host_cpu():
    cpu = host.host_cpu_name()
    for spelling in ("llvm-native", {"kind": "llvm", "mcpu": "native"}):
        target = as_target(spelling)
        assert target.kind.name == "llvm"
        if cpu != "generic":
            assert str(target.attrs["mcpu"]) == cpu
        assert "native" not in str(target)
    assert "mcpu" not in as_target("llvm").attrs  # plain llvm stays portable
    native = as_target(Target({"kind": "llvm", "mcpu": "native"}))
    assert str(native) == str(as_target("llvm-native"))
    assert as_target("c").kind.name == "c"


def test_an_unknown_host_cpu_is_plain_llvm(monkeypatch):
    monkeypatch.setattr(host, "host_cpu_name", lambda: "generic")
    assert "mcpu" not in as_target("llvm-native").attrs


@pytest.mark.skipif(not X86, reason="x86 feature names")
def test_extensions_the_host_lacks_are_turned_off(monkeypatch):
    # a virtual machine LLVM calls "sapphirerapids" whose guest has no AMX and no AVX512-FP16
    monkeypatch.setattr(host, "host_cpu_name", lambda: "sapphirerapids")
    full = set(host.target_isa_features(Target({"kind": "llvm", "mcpu": "sapphirerapids"})))
    assert {"amx-tile", "avx512fp16", "avx512f"} <= full
    guest = frozenset(full - {"amx-tile", "amx-int8", "amx-bf16", "avx512fp16"})
    monkeypatch.setattr(host, "host_isa_features", lambda: guest)
    target = as_target("llvm-native")
    assert str(target.attrs["mcpu"]) == "sapphirerapids"
    assert {"-amx-tile", "-avx512fp16"} <= {str(a) for a in target.attrs["mattr"]}
    assert set(host.target_isa_features(target)) == guest
    assert host.missing_host_features(host.target_isa_features(target)) == []


def test_an_unknown_mcpu_is_one_line():
    with pytest.raises(OptionError, match="LLVM knows no CPU 'nosuchcpu'") as info:
        as_target({"kind": "llvm", "mcpu": "nosuchcpu"})
    assert "\n" not in str(info.value)
    assert str(as_target({"kind": "llvm", "mcpu": "haswell"}).attrs["mcpu"]) == "haswell"


def test_the_plan_records_the_concrete_cpu():
    plan = tvm_rtask.plan(TwoBranches, "llvm-native", num_veu=2)
    mcpu = plan.target.get("mcpu")
    assert mcpu != "native"
    assert mcpu == as_target("llvm-native").attrs.get("mcpu", None)


def test_native_build_runs_and_matches_plain_llvm():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((1, 4, 8, 8)), rng.standard_normal((4, 4, 3, 3))]
    args = [tvm.runtime.tensor(a.astype("float32")) for a in args]
    outs = []
    for target in ("llvm", "llvm-native"):
        ex = tvm_rtask.compile(TwoBranches, target, num_veu=2)
        outs.append(relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not X86, reason="x86 feature names")
def test_isa_features_of_targets():
    assert host.target_isa_features(as_target("llvm")) == []  # runs on any x86-64
    haswell = host.target_isa_features(Target({"kind": "llvm", "mcpu": "haswell"}))
    assert {"avx2", "fma", "sse4.2"} <= set(haswell) and "avx512f" not in haswell
    assert "prefer-256-bit" not in host.target_isa_features(
        Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    )  # tuning flags describe no instructions
    arm = Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"})
    assert host.target_isa_features(arm) == []
    assert "sse2" in (host.host_isa_features() or {"sse2"})
    # what this host compiles for natively, it has
    assert host.missing_host_features(host.target_isa_features(as_target("llvm-native"))) == []


def test_missing_features(monkeypatch):
    monkeypatch.setattr(host, "host_isa_features", lambda: frozenset({"sse", "sse2", "avx"}))
    assert host.missing_host_features(["avx", "avx512f", "fma", "unknown"]) == ["avx512f", "fma"]


def test_vector_lanes_follow_the_cpu():
    assert vector_lanes(Target({"kind": "llvm", "mcpu": "haswell"})) == 8
    assert vector_lanes(Target({"kind": "llvm", "mcpu": "rocketlake"})) == 16
    assert vector_lanes(Target({"kind": "llvm", "mcpu": "x86-64-v2"})) == 4
