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


class SpillError(RTaskError):
    """A persistent kernel spills registers to local memory at the planned occupancy."""


class BarrierTimeout(RTaskError):
    """A step-array wait at run time exceeded its bound instead of hanging."""


_last_error: list[RTaskError] = []


def remember_errors(transform_module):
    """Decorate a pass's ``transform_module`` so its RTaskError survives TVM's FFI.

    An exception raised inside a Python pass crosses C++ and comes back as a plain
    RuntimeError; the public API calls :func:`reraise_remembered` to raise the original.
    """
    import functools

    @functools.wraps(transform_module)
    def wrapper(*args, **kwargs):
        try:
            return transform_module(*args, **kwargs)
        except RTaskError as err:
            _last_error[:] = [err]
            raise

    return wrapper


def run_keeping_errors(fn, *args, **kwargs):
    """Call ``fn``; if a remembered RTaskError caused its failure, raise that instead."""
    _last_error.clear()
    try:
        return fn(*args, **kwargs)
    except RTaskError:
        raise
    except Exception as err:
        if _last_error and str(_last_error[0]) in str(err):
            original = _last_error.pop()
            raise original from None
        raise
