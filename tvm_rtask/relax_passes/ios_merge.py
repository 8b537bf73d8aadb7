"""``IOSOperatorMerge``: IOS's operator merge applied where IOS's dynamic program chooses it.

IOS (Ding et al., MLSys 2021, section 4.2) gives each stage two strategies: run its
operators side by side, or, when they are convolutions sharing an input, run them as one
wider convolution. Planning happens on the fused operator graph, the merge is a rewrite of
the high-level module, so this pass works in two steps on a copy:

1. tag each mergeable convolution (``merge_convs.merge_candidates``) with a block
   annotation that survives legalization and fusion, prepare and plan the copy, and let
   ``schedule.ios.choose_merges`` run the dynamic program with the merge strategy;
2. merge exactly the sets of convolutions it chose (``MergeConvs(select=...)``) in the
   original module, which the rest of the pipeline then prepares and plans as usual.

It does nothing unless the policy is ``"ios"`` and the option ``ios_merge`` is on.
"""

from __future__ import annotations

from dataclasses import replace

import tvm
from tvm import relax

from ..backend import as_target, get_backend
from ..core import Plan
from ..errors import remember_errors
from ..policies import AnalyticalCostModel, CostModel
from ..policies.ios import choose_merges
from ..tir.tags import annotate_blocks, block_annotations
from .dataflow import as_tir_call, main_dataflow, with_own_callees
from .fuse import RTaskPrepare
from .merge_convs import MergeConvs, merge_candidates

MERGE_TAG = "rtask_merge"


def _tag_candidates(mod: tvm.IRModule, candidates: dict[int, tuple[int, float]]) -> tvm.IRModule:
    """Legalized ``mod`` whose candidate convolutions carry ``MERGE_TAG`` on their blocks."""
    names = {}
    index, block = main_dataflow(mod["main"])
    for i, binding in enumerate(block.bindings):
        if i in candidates:
            names[binding.var.name] = i
    if len(names) != len(candidates):
        return relax.transform.LegalizeOps()(mod)  # names repeat: nothing can be tracked
    mod = relax.transform.LegalizeOps()(mod)
    index, block = main_dataflow(mod["main"])
    callees = {}
    for k, binding in enumerate(block.bindings):
        i = names.get(binding.var.name)
        call = as_tir_call(binding.value)
        if i is None or call is None:
            continue
        group, scale = candidates[i]
        tagged = annotate_blocks(mod[call.gvar], "conv2d", MERGE_TAG, f"{group}:{i}:{scale}")
        if tagged is not None:
            callees[k] = (tagged, f"{call.gvar.name_hint}_merge{i}")
    return with_own_callees(mod, index, callees)


def _operator_tags(prepared: tvm.IRModule, plan: Plan) -> dict[str, tuple[str, float, int]]:
    """Planned operator -> (merge group, FLOP scale, binding index), read from the block tags
    of the prepared (fused, not yet scheduled) module."""
    names = {gv.name_hint for gv in prepared.get_global_vars()}
    out = {}
    for op in plan.graph.ops:
        if not op.supported or op.func not in names:
            continue
        tags = block_annotations(prepared[op.func], MERGE_TAG)
        if len(tags) == 1:  # a fused kernel holding two tagged convolutions cannot merge
            group, index, scale = tags[0].split(":")
            out[op.name] = (group, float(scale), int(index))
    return out


@tvm.transform.module_pass(opt_level=0, name="IOSOperatorMerge")
class IOSOperatorMerge:
    """Merge the convolutions that IOS's DP runs merged; options as in ``PlanRPrograms``,
    ``cost`` the model the DP compares the two strategies with (default analytical).

    After the pass, ``last_chosen`` holds the merged sets (binding indices of ``main``).
    """

    def __init__(self, target="llvm", cost: CostModel | None = None, **options) -> None:
        self.target = as_target(target)
        self.cost = cost or AnalyticalCostModel()
        self.options = options.pop("options", None) or options
        self.last_chosen: list[set[int]] = []

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from .plan_rprograms import PlanRPrograms, plan_of, plan_options

        self.last_chosen = []
        options = plan_options(self.options, ctx, self.target)
        if options.policy != "ios" or not options.ios_merge:
            return mod
        if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        candidates = merge_candidates(mod["main"])
        if not candidates:
            return mod
        tagged = _tag_candidates(mod, candidates)
        prepared = RTaskPrepare(target=self.target, options=options)(tagged)
        # this plan only gives the DP its graph and vDevice (it compares with self.cost):
        # cost="measured" would time the tagged copy's kernels for nothing
        planned = PlanRPrograms(self.target, options=replace(options, cost="analytical"))(prepared)
        plan = plan_of(planned)
        tags = _operator_tags(prepared, plan)
        merges = {op: (group, scale) for op, (group, scale, _) in tags.items()}
        # the DP sees the segments the final plan will have (the same rProgram limits)
        limits = get_backend(self.target).program_limits(options)
        chosen = choose_merges(plan.graph, plan.vdevice, self.cost, merges, **limits)
        self.last_chosen = [{tags[op][2] for op in stage} for stage in chosen]
        if not self.last_chosen:
            return mod
        return MergeConvs(select=self.last_chosen)(mod)
