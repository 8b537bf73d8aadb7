"""``PlanRPrograms``: make rKernels, build the rOperator graph and plan rPrograms.

The pass replaces each operator's PrimFunc by its rKernel (still a valid stand-alone PrimFunc)
and stores the plan as JSON in the module attribute ``rtask.plan`` for ``LowerRPrograms``.
"""

from __future__ import annotations

import os

import tvm
from tvm.target import Target

from ..core import RGraph, RKernel, VDevice
from ..errors import CapacityError, OptionError, remember_errors
from ..options import RTaskOptions, resolve_options
from ..schedule import AnalyticalCostModel, make_plan
from ..tir.cpu_rkernel import make_cpu_rkernel
from .extract import extract_graph

PLAN_ATTR = "rtask.plan"


def as_target(target) -> Target:
    """A Target from a string, a dict or a Target; CPU targets only for now."""
    if isinstance(target, Target):
        result = target
    elif isinstance(target, dict):
        result = Target(target)
    elif isinstance(target, str):
        result = Target({"kind": target}) if target in ("llvm", "c") else Target(target)
    else:
        raise OptionError(f"target must be a string, dict or tvm.target.Target, not {target!r}")
    if result.kind.name != "llvm":
        raise OptionError(
            f"target kind {result.kind.name!r} is not supported yet: the persistent CUDA "
            "dispatcher is not built; use an llvm target"
        )
    return result


def cpu_worker_capacity() -> int:
    """How many worker threads may run vEUs: TVM_NUM_THREADS if set, else the core count."""
    env = os.environ.get("TVM_NUM_THREADS")
    if env:
        try:
            return max(int(env), 1)
        except ValueError as err:
            raise OptionError(f"TVM_NUM_THREADS={env!r} is not an integer") from err
    return os.cpu_count() or 1


def cpu_vdevice(options: RTaskOptions) -> VDevice:
    """The CPU vDevice: one vEU per worker thread, never more than can really run."""
    capacity = cpu_worker_capacity()
    num_veu = options.num_veu or capacity
    if num_veu > capacity:
        raise CapacityError(
            f"num_veu={num_veu} exceeds the {capacity} worker threads that can run at once "
            "(TVM_NUM_THREADS or the core count); spin barriers between vEUs that are not "
            "running concurrently would time out. Lower num_veu or raise TVM_NUM_THREADS."
        )
    return VDevice.cpu(num_veu)


@tvm.transform.module_pass(opt_level=0, name="PlanRPrograms")
class PlanRPrograms:
    """Plan ``main`` into rPrograms with the chosen policy; options as in :class:`RTaskOptions`."""

    def __init__(self, target="llvm", **options) -> None:
        self.target = target
        self.options = options

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        options = resolve_options(self.options, ctx.config)
        as_target(self.target)
        vdevice = cpu_vdevice(options)
        max_rtasks = vdevice.num_veu * options.rtasks_per_veu
        rkernel_funcs: dict[str, tvm.tirx.PrimFunc] = {}
        variants: dict[str, list[RKernel]] = {}

        def rkernels_for(name: str) -> list[RKernel]:
            if name not in variants:
                kernel = make_cpu_rkernel(mod[name], max_rtasks)
                rkernel_funcs[name] = kernel.func
                variants[name] = [
                    RKernel(name=f"{name}@{kernel.num_rtasks}", num_rtasks=kernel.num_rtasks)
                ]
            return variants[name]

        extracted = extract_graph(mod, rkernels_for)
        for name, func in rkernel_funcs.items():
            mod[name] = func
        graph = RGraph(extracted.operators)
        plan = make_plan(graph, vdevice, policy=options.policy, cost=AnalyticalCostModel())
        plan.options = options.to_dict()
        return mod.with_attr(PLAN_ATTR, plan.to_json())
