"""Schedule rules for llvm (one rule a file, as ``tvm.s_tir.dlight.cpu``).

:func:`schedule_cpu_func` applies the first rule that matches; its result is a PrimFunc
marked with :data:`RULE_ATTR` whose body is one outer ``T.parallel`` loop, so the CPU backend
cuts it along that loop with the tuned-kernel cutter (``tuned.make_tuned_cpu_rkernel``), as
it cuts a MetaSchedule record. It is not marked :data:`tvm_rtask.records.TUNED_ATTR`: that
attribute means "from a tuning database" (measured times, ``tvm-rtask tune``).
"""

from __future__ import annotations

import os

from tvm import tirx
from tvm.target import Target

from ....records import TUNED_ATTR
from ....tir.rules import try_rules
from .base import CPUScheduleRule, vector_lanes
from .conv2d_nchw import Conv2dNCHW
from .conv2d_packed import Conv2dPackedNCHW
from .depthwise_conv2d import DepthwiseConv2dNCHW
from .elementwise import Elementwise
from .fast_math import vectorizable_math
from .matmul import MatmulKN
from .pool2d_nchw import Pool2dNCHW
from .row_partials import RowPartials
from .row_reduction import RowReduction
from .row_softmax import RowSoftmax
from .row_sum import RowSum
from .window_nchwc import WindowNCHWc
from .winograd_nchwc import WinogradNCHWc

RULE_ATTR = "rtask.cpu_rule"

__all__ = [
    "RULE_ATTR",
    "CPUScheduleRule",
    "Conv2dNCHW",
    "Conv2dPackedNCHW",
    "DepthwiseConv2dNCHW",
    "Elementwise",
    "WindowNCHWc",
    "WinogradNCHWc",
    "MatmulKN",
    "Pool2dNCHW",
    "RowPartials",
    "RowReduction",
    "RowSoftmax",
    "RowSum",
    "default_rules",
    "is_rule_scheduled",
    "rules_enabled",
    "schedule_cpu_func",
    "vector_lanes",
]


def default_rules() -> list[CPUScheduleRule]:
    """Winograd convolutions (their own PrimFunc: only this rule schedules it), convolutions
    (packed weights and channel blocks first, depthwise before the general
    direct rule), window
    pooling (before RowReduction, which takes a 3x3 average pool too, up to 3.5x slower),
    matrix products, then sums over trailing axes with the adds vectorised (global pooling,
    squeeze-and-excitation means), softmax rows and other row normalizations (layer norm) with
    vector partial results, and the row reductions left (rows that are not whole vectors:
    TVM's ``dlight.cpu.Reduction``); last, elementwise and other injective operators in
    vectors."""
    return [
        WinogradNCHWc(),
        Conv2dPackedNCHW(),
        WindowNCHWc(),
        DepthwiseConv2dNCHW(),
        Conv2dNCHW(),
        Pool2dNCHW(),
        MatmulKN(),
        RowSum(),
        RowSoftmax(),
        RowPartials(),
        RowReduction(),
        Elementwise(),
    ]


def schedule_cpu_func(
    func: tirx.PrimFunc,
    target: Target,
    rules: list[CPUScheduleRule] | None = None,
    name: str | None = None,
) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first rule that applies (marked :data:`RULE_ATTR`), or
    None. Rules are tried by :func:`tvm_rtask.tir.rules.try_rules`: a rule that raises is
    logged (``name``: the operator's, for the log) and the next one is tried."""
    if func.attrs is not None and (TUNED_ATTR in func.attrs or RULE_ATTR in func.attrs):
        return None
    found = try_rules(func, target, default_rules() if rules is None else rules, name)
    if found is None:
        return None
    rule, scheduled = found
    # the rules vectorise; TVM's exp and erf would still call libm once per element
    return vectorizable_math(scheduled).with_attr(RULE_ATTR, type(rule).__name__)


def is_rule_scheduled(func: tirx.PrimFunc) -> bool:
    """Scheduled by a rule here: one outer parallel loop, for the tuned-kernel cutter."""
    return func.attrs is not None and RULE_ATTR in func.attrs


# Whether make_rkernels schedules PrimFuncs with the rules when the option cpu_rules is not
# given (on: measured in docs/compile-time.md, "The CUDA backend's limits"); the
# environment variable TVM_RTASK_CPU_RULES=0/1 changes this default for a process, the
# option wins over both.
ENABLED_BY_DEFAULT = True


def rules_enabled() -> bool:
    env = os.environ.get("TVM_RTASK_CPU_RULES")
    if env is not None and env.strip() != "":
        return env.strip().lower() not in ("0", "false", "no", "off")
    return ENABLED_BY_DEFAULT
