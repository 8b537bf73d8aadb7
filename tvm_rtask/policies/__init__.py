"""Policies (wavefront, wavefront_global, ios, opara, opara_streams, sequential), cost
models and the vDevice simulator; pure Python (no TVM)."""

from .builder import Placed, ProgramBuilder
from .cost import AnalyticalCostModel, CalibratedCostModel, CostModel, calibrate
from .ios import IOSPolicy
from .opara import OparaPolicy
from .opara_streams import OparaStreamsPolicy
from .planner import make_plan
from .policy import Policy
from .registry import get_policy, policy_names, register_policy
from .sequential import SequentialPolicy
from .simulate import (
    PlanTiming,
    ProgramTiming,
    StepTiming,
    ideal_us,
    simulate,
    simulate_plan,
    simulate_program,
)
from .stage import stage_schedule
from .wavefront import WavefrontGlobalPolicy, WavefrontPolicy

__all__ = [
    "AnalyticalCostModel",
    "CalibratedCostModel",
    "CostModel",
    "IOSPolicy",
    "OparaPolicy",
    "OparaStreamsPolicy",
    "Placed",
    "PlanTiming",
    "Policy",
    "ProgramBuilder",
    "ProgramTiming",
    "SequentialPolicy",
    "StepTiming",
    "WavefrontGlobalPolicy",
    "WavefrontPolicy",
    "calibrate",
    "get_policy",
    "ideal_us",
    "make_plan",
    "policy_names",
    "register_policy",
    "simulate",
    "simulate_plan",
    "simulate_program",
    "stage_schedule",
]
