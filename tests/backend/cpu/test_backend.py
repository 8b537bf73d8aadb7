"""The llvm backend: the cpu_rules option decides whether convolutions get the CPU rules."""

from __future__ import annotations

import pytest

from tests.relax_passes.models import TwoBranches
from tvm_rtask.backend import get_backend
from tvm_rtask.backend.cpu.rules import is_rule_scheduled
from tvm_rtask.options import resolve_options
from tvm_rtask.relax_passes import RTaskPrepare


@pytest.mark.parametrize("cpu_rules", [True, False])
def test_cpu_rules_option_decides(cpu_rules, monkeypatch):
    monkeypatch.setenv("TVM_RTASK_CPU_RULES", "0" if cpu_rules else "1")  # the option wins
    options = resolve_options({"num_veu": 2, "cpu_rules": cpu_rules})
    mod, maker = get_backend("llvm").make_rkernels(RTaskPrepare()(TwoBranches).clone(), options)
    conv = next(gv.name_hint for gv in mod.get_global_vars() if "conv2d" in gv.name_hint)
    maker(conv)
    assert is_rule_scheduled(mod[conv]) == cpu_rules
