"""Backends by target kind: the built-in ones (llvm, cuda) and any registered later.

The backends only define their classes; this module collects them, so no backend imports the
registry back.
"""

from __future__ import annotations

from tvm.target import Target

from ..errors import OptionError
from ..options import add_backend
from .base import Backend
from .cpu import CPUBackend
from .cuda import CUDABackend

_REGISTRY: dict[str, type[Backend]] = {
    kind: cls for cls in (CPUBackend, CUDABackend) for kind in cls.target_kinds
}


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Class decorator for a backend defined outside this package: make ``cls`` the backend
    of each of its target kinds."""
    for kind in cls.target_kinds:
        _REGISTRY[kind] = cls
    add_backend(cls)  # its options become options (and PassContext keys) of tvm-rtask
    return cls


for _cls in _REGISTRY.values():
    add_backend(_cls)


def supported_kinds() -> list[str]:
    return sorted(_REGISTRY)


def registered_backends() -> list[type[Backend]]:
    """Each backend class once, in registration order (the built-in ones first): whose
    options (``Backend.Options``) are options of tvm-rtask."""
    return list(dict.fromkeys(_REGISTRY.values()))


# The target string for the CPU that compiles: ``{"kind": "llvm", "mcpu": "native"}``, which
# the CPU backend resolves to the host CPU's name (``backend/cpu/host.py``). Plain ``"llvm"``
# stays portable (no mcpu: generic x86-64, SSE2).
NATIVE_LLVM = "llvm-native"


def as_target(target) -> Target:
    """A Target from a string, a dict or a Target (bare ``"cuda"`` means sm_90, with an llvm
    host: a bare ``Target("cuda")`` defaults to sm_50, which CUDA 13 cannot build;
    ``"llvm-native"`` means llvm for this machine's CPU). The backend's
    ``resolve_target`` then makes the target concrete (the CPU backend replaces
    ``mcpu: "native"`` by the host CPU's name)."""
    if isinstance(target, Target):
        result = target
    elif isinstance(target, dict):
        result = Target(target)
    elif isinstance(target, str):
        if target in ("llvm", "c"):
            result = Target({"kind": target})
        elif target == NATIVE_LLVM:
            result = Target({"kind": "llvm", "mcpu": "native"})
        elif target == "cuda":
            result = Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
        else:
            try:
                result = Target(target)
            except Exception as err:  # TVM raises ValueError/TVMError for unknown tags
                raise OptionError(f"unknown target {target!r}: {str(err).splitlines()[0]}") from err
    else:
        raise OptionError(f"target must be a string, dict or tvm.target.Target, not {target!r}")
    kind = str(result.kind.name)
    if kind not in supported_kinds():
        raise OptionError(
            f"target kind {kind!r} is not supported: use one of {', '.join(supported_kinds())}"
        )
    if result.host is None and _REGISTRY[kind].needs_host:
        result = Target(result.export(), host="llvm")
    return _REGISTRY[kind].resolve_target(result)


def get_backend(target) -> Backend:
    """The backend of ``target`` (anything :func:`as_target` accepts)."""
    target = as_target(target)
    return _REGISTRY[str(target.kind.name)](target)
