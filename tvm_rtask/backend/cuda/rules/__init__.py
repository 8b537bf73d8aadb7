"""Schedule rules for CUDA (one rule a file, as ``tvm.s_tir.dlight.gpu``), tried before
dlight's by :func:`tvm_rtask.backend.cuda.rkernel.schedule_for_cuda`."""

from __future__ import annotations

import os

from tvm import tirx
from tvm.target import Target

from ....tir.rules import try_rules
from .base import ConvInfo, CUDAScheduleRule, analyse_conv, find_conv
from .conv2d_nchw import Conv2dNCHW, Tile, choose_tile
from .depthwise_conv2d_nchw import DepthwiseConv2dNCHW

RULE_ATTR = "rtask.cuda_rule"

__all__ = [
    "RULE_ATTR",
    "CUDAScheduleRule",
    "Conv2dNCHW",
    "ConvInfo",
    "DepthwiseConv2dNCHW",
    "Tile",
    "analyse_conv",
    "choose_tile",
    "default_rules",
    "find_conv",
    "rules_enabled",
    "schedule_cuda_func",
]

# Whether schedule_for_cuda tries these rules when the option cuda_rules is not given; the
# environment variable TVM_RTASK_CUDA_RULES=0/1 changes it for a process, the option wins
# over both. Off until a GPU has timed them (why: docs/cuda-kernels.md, "Convolution rules").
ENABLED_BY_DEFAULT = False


def default_rules() -> list[CUDAScheduleRule]:
    return [Conv2dNCHW(), DepthwiseConv2dNCHW()]


def schedule_cuda_func(
    func: tirx.PrimFunc,
    target: Target,
    rules: list[CUDAScheduleRule] | None = None,
    name: str | None = None,
) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first rule that applies, marked ``tirx.is_scheduled`` and
    :data:`RULE_ATTR` (the rule's name); None when none applies. Rules are tried by
    :func:`tvm_rtask.tir.rules.try_rules`: a rule that raises is logged (``name``: the
    operator's, for the log) and the next one is tried."""
    found = try_rules(func, target, default_rules() if rules is None else rules, name)
    if found is None:
        return None
    rule, scheduled = found
    return scheduled.with_attr("tirx.is_scheduled", True).with_attr(RULE_ATTR, type(rule).__name__)


def rules_enabled() -> bool:
    env = os.environ.get("TVM_RTASK_CUDA_RULES")
    if env is not None and env.strip() != "":
        return env.strip().lower() not in ("0", "false", "no", "off")
    return ENABLED_BY_DEFAULT
