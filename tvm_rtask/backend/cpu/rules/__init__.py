"""Schedule rules for llvm (one rule a file, as ``tvm.s_tir.dlight.cpu``).

:func:`schedule_cpu_func` applies the first rule that matches; its result is a PrimFunc
marked with :data:`tvm_rtask.records.TUNED_ATTR` (one outer ``T.parallel`` loop), so the CPU
rKernel maker cuts it along that loop as it cuts a MetaSchedule record.
"""

from __future__ import annotations

import os

from tvm import s_tir, tirx
from tvm.target import Target

from ....records import TUNED_ATTR
from .base import CPUScheduleRule, vector_lanes
from .conv2d_nchw import Conv2dNCHW

RULE_ATTR = "rtask.cpu_rule"

__all__ = [
    "RULE_ATTR",
    "CPUScheduleRule",
    "Conv2dNCHW",
    "default_rules",
    "rules_enabled",
    "schedule_cpu_func",
    "vector_lanes",
]


def default_rules() -> list[CPUScheduleRule]:
    return [Conv2dNCHW()]


def schedule_cpu_func(
    func: tirx.PrimFunc, target: Target, rules: list[CPUScheduleRule] | None = None
) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first matching rule (marked tuned), or None."""
    if func.attrs is not None and TUNED_ATTR in func.attrs:
        return None
    for rule in default_rules() if rules is None else rules:
        try:
            sch = rule.apply(func, target, False)
        except (s_tir.ScheduleError, ValueError, IndexError, AttributeError):
            sch = None
        if sch is None:
            continue
        result = sch.mod["main"]
        return result.with_attr(TUNED_ATTR, True).with_attr(RULE_ATTR, type(rule).__name__)
    return None


# Whether make_rkernels schedules PrimFuncs with the rules (the option; on since measured
# 2.1x (SqueezeNet) and 2.9x (Inception v1) faster under wavefront): environment variable
# TVM_RTASK_CPU_RULES=0/1 wins over this default.
ENABLED_BY_DEFAULT = True


def rules_enabled() -> bool:
    env = os.environ.get("TVM_RTASK_CPU_RULES")
    if env is not None and env.strip() != "":
        return env.strip().lower() not in ("0", "false", "no", "off")
    return ENABLED_BY_DEFAULT
