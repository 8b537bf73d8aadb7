"""Hardware-neutral abstractions of Rammer (pure Python, no TVM): rOperator graph, rKernel,
vDevice, rProgram and Plan."""

from .graph import PATTERNS, RGraph, ROperator
from .plan import OrdinaryCall, Plan
from .rkernel import RKernel
from .rprogram import Barrier, RProgram, RTask
from .vdevice import DEVICE_SPECS, DeviceSpec, VDevice, blocks_per_sm, cpu_spec, get_spec

__all__ = [
    "DEVICE_SPECS",
    "PATTERNS",
    "Barrier",
    "DeviceSpec",
    "OrdinaryCall",
    "Plan",
    "RGraph",
    "RKernel",
    "ROperator",
    "RProgram",
    "RTask",
    "VDevice",
    "blocks_per_sm",
    "cpu_spec",
    "get_spec",
]
