"""One exception family for tvm-rtask; every message names what is at fault and what to do."""


class RTaskError(Exception):
    """Base class of every error tvm-rtask raises on purpose."""


class OptionError(RTaskError, ValueError):
    """An option has an impossible value (unknown policy, non-positive vEU count, ...)."""


class FrontendError(RTaskError):
    """A model could not be read: malformed, truncated or with dynamic shapes."""


class UnsupportedOperator(RTaskError):
    """An operator cannot become an rKernel (callers usually keep it as an ordinary kernel)."""


class PlanError(RTaskError):
    """A plan is inconsistent: a dependency is not covered, a task is missing or repeated."""


class DeadlockError(PlanError):
    """A barrier can never be satisfied (its waits form a cycle or name a task that never runs)."""


class CapacityError(PlanError):
    """More vEUs are requested than the device can keep running at once."""


class BarrierTimeout(RTaskError):
    """A step-array wait at run time exceeded its bound instead of hanging."""
