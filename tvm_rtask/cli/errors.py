"""The command lines' own error and how any error becomes one line."""

from __future__ import annotations

DEBUG_ENV = "TVM_RTASK_DEBUG"


class CLIError(Exception):
    """A user error found by the command line itself (bad file, bad flag value)."""


def first_line(err: BaseException) -> str:
    """The message of ``err`` on one line (TVM errors carry multi-line tracebacks)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    # Errors that crossed TVM's FFI carry a traceback and end with the useful line.
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]
