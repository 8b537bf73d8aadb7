"""Policies by name: the built-in ones, and any a user registers.

The built-in policy modules only define their classes; this module collects them, so no
policy module imports the registry back.
"""

from __future__ import annotations

from typing import Any

from ..errors import OptionError
from .auto import AutoPolicy
from .ios import IOSPolicy
from .opara import OparaPolicy
from .opara_streams import OparaStreamsPolicy
from .policy import Policy
from .sequential import SequentialPolicy
from .wavefront import WavefrontGlobalPolicy, WavefrontPolicy

_REGISTRY: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        WavefrontPolicy,
        WavefrontGlobalPolicy,
        IOSPolicy,
        OparaPolicy,
        OparaStreamsPolicy,
        SequentialPolicy,
        AutoPolicy,
    )
}


# the policies that ship with tvm-rtask, by name (register_policy adds others)
BUILTIN_POLICIES = frozenset(_REGISTRY)


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make ``cls`` available to ``get_policy(cls.name)``."""
    if not cls.name:
        raise OptionError(f"policy class {cls.__name__} needs a non-empty name")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def get_policy(name: str, **options: Any) -> Policy:
    cls = _REGISTRY.get(name.strip().lower())
    if cls is None:
        raise OptionError(f"unknown policy {name!r}; known policies: {', '.join(policy_names())}")
    return cls(**options)


# AutoPolicy plans with its candidates through the registry
AutoPolicy.policy_by_name = staticmethod(get_policy)
