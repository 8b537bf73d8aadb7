"""Export compiled modules so that they find the native runtime library by themselves."""

from __future__ import annotations

import os
from typing import Any

from ..native import link_options

__all__ = ["export_library", "link_options"]


def export_library(executable: Any, path: str | os.PathLike, **kwargs: Any) -> str:
    """Export a Relax executable or runtime module to a shared library that links the
    native runtime library.

    The result resolves the ``tvm_rtask_cpu_*`` symbols when loaded with
    ``tvm.runtime.load_module`` in a process that never imported ``tvm_rtask``.

    Parameters
    ----------
    executable
        ``tvm.runtime.Executable`` returned by ``tvm.compile`` (Relax or TIR), or a
        ``tvm.runtime.Module``: anything with TVM's ``export_library(file_name, **kwargs)``.
    path
        Output file (``.so``).  A ``.tar`` output is passed through unchanged (no link
        happens there).
    kwargs
        Forwarded to ``export_library``; an ``options`` list is kept and extended.

    Returns
    -------
    str
        The path written.
    """
    path = os.fspath(path)
    if not path.endswith(".tar"):
        options = kwargs.pop("options", None) or []
        if isinstance(options, str):
            options = [options]
        kwargs["options"] = [*options, *link_options()]
    executable.export_library(path, **kwargs)
    return path
