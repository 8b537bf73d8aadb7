"""Policies (wavefront, sequential), cost models and the vDevice simulator; pure Python."""

from .cost import AnalyticalCostModel, CostModel
from .planner import make_plan
from .policy import Policy, get_policy, policy_names, register_policy
from .sequential import SequentialPolicy
from .simulate import ProgramTiming, ideal_us, simulate_plan, simulate_program
from .wavefront import WavefrontPolicy

__all__ = [
    "AnalyticalCostModel",
    "CostModel",
    "Policy",
    "ProgramTiming",
    "SequentialPolicy",
    "WavefrontPolicy",
    "get_policy",
    "ideal_us",
    "make_plan",
    "policy_names",
    "register_policy",
    "simulate_plan",
    "simulate_program",
]
