"""Relax passes of tvm-rtask; each composes inside ``tvm.transform.Sequential``."""

from .extract import ExtractedGraph, extract_graph
from .fuse import FuseKeepingWaves, RTaskPrepare, prepare_pipeline
from .lower_rprograms import LowerRPrograms
from .pipeline import rtask_pipeline
from .plan_rprograms import PLAN_ATTR, PlanRPrograms, as_target, plan_of, with_plan
from .stitch import StitchFusion
from .stitch_patterns import Limits as StitchLimits

__all__ = [
    "PLAN_ATTR",
    "ExtractedGraph",
    "FuseKeepingWaves",
    "LowerRPrograms",
    "PlanRPrograms",
    "RTaskPrepare",
    "StitchFusion",
    "StitchLimits",
    "as_target",
    "extract_graph",
    "plan_of",
    "prepare_pipeline",
    "rtask_pipeline",
    "with_plan",
]
