"""One home per target: each backend holds its options, device table, limits, rKernel maker,
dispatcher, occupancy and status checks and its build; :func:`get_backend` picks one."""

from .base import Backend, ProgramIO, target_dict
from .registry import as_target, get_backend, register_backend, supported_kinds

__all__ = [
    "Backend",
    "ProgramIO",
    "as_target",
    "get_backend",
    "register_backend",
    "supported_kinds",
    "target_dict",
]
