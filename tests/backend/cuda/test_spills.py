"""What a spilling persistent kernel does (option ``spills``), without nvcc or a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tvm_rtask.backend import as_target, get_backend
from tvm_rtask.core import VDevice, blocks_per_sm
from tvm_rtask.errors import OptionError
from tvm_rtask.options import resolve_options

CUDA = get_backend(as_target({"kind": "cuda", "arch": "sm_90"}))


def _plan(registers: int, spill: int):
    vd = VDevice.cuda("h100", threads=256, registers=registers)
    usage = {"rprogram_0_kernel": {"registers": registers, "shared_mem": 7008,
                                   "spill_stores": spill, "capacity": vd.capacity}}  # fmt: skip
    return SimpleNamespace(vdevice=vd, kernel_usage=usage)


def test_replan_gives_the_most_registers_of_one_vEU_fewer_per_SM():
    plan = _plan(80, 2140)
    assert plan.vdevice.blocks_per_sm == 3
    more = CUDA.replan_options(plan, resolve_options({"spills": "replan"}))
    assert more == {"cuda_registers": 128}
    assert blocks_per_sm(plan.vdevice.spec, 256, 128, 7008) == 2
    assert blocks_per_sm(plan.vdevice.spec, 256, 136, 7008) == 1


def test_no_replan_when_not_asked_not_spilling_or_fixed_by_the_user():
    replan = resolve_options({"spills": "replan"})
    assert CUDA.replan_options(_plan(80, 2140), resolve_options({})) is None  # default: warn
    assert CUDA.replan_options(_plan(80, 0), replan) is None
    assert CUDA.replan_options(_plan(255, 744), replan) is None  # one vEU per SM already
    for key in ("num_veu", "cuda_registers"):
        assert CUDA.replan_options(_plan(80, 2140), replan, frozenset({key})) is None


def test_the_spills_option_is_checked():
    with pytest.raises(OptionError, match="spills must be one of"):
        resolve_options({"spills": "ignore"})
    cpu = get_backend(as_target("llvm"))
    with pytest.raises(OptionError, match="spills applies to CUDA targets only"):
        cpu.check_options(resolve_options({"spills": "error"}))


def _split_plan(funcs: list[str], spill: int):
    plan = _plan(80, spill)
    ops = {f"op{k}": SimpleNamespace(func=f) for k, f in enumerate(funcs)}
    plan.steps = [SimpleNamespace(ops=lambda: list(ops))]
    plan.graph = SimpleNamespace(op=ops.__getitem__)
    return plan


def test_split_halves_the_distinct_rkernels_of_the_spilling_rprogram():
    split = resolve_options({"spills": "split"})
    # 7 operators, 5 distinct rKernels: at most 2 per rProgram next time
    plan = _split_plan(["conv", "conv", "relu", "pool", "dense", "relu", "softmax"], 2140)
    assert CUDA.replan_options(plan, split) == {"max_kernels_per_program": 2}
    # nothing to split: one distinct rKernel already, no spill, or the user's own limit
    assert CUDA.replan_options(_split_plan(["conv", "conv"], 2140), split) is None
    assert CUDA.replan_options(_split_plan(["conv", "relu"], 0), split) is None
    given = frozenset({"max_kernels_per_program"})
    assert CUDA.replan_options(plan, split, given) is None
