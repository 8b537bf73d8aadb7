"""Runtime support: the native step-array library, exporting, the CPU thread pool.

Importing this package is cheap: it imports neither TVM nor the native library.
"""

from .. import native
from ..native import ENV_VAR, LIBRARY_NAME, STATUS_WORDS, library_path, load, runtime_version

__all__ = [
    "native",
    "ENV_VAR",
    "LIBRARY_NAME",
    "STATUS_WORDS",
    "export_library",
    "library_path",
    "load",
    "num_threads",
    "runtime_version",
    "set_num_threads",
]


def __getattr__(name: str):
    # Lazy: these import TVM.
    if name == "export_library":
        from .export import export_library

        return export_library
    if name in ("set_num_threads", "num_threads"):
        from ..backend.cpu import threads

        return getattr(threads, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
