"""Export compiled modules so that they find the native runtime library by themselves."""

from __future__ import annotations

import os
from typing import Any

from .. import native

__all__ = ["export_library", "link_options"]


def link_options() -> list[str]:
    """Linker options that add ``libtvm_rtask_runtime.so`` to a shared library's link.

    The library goes in by full path after ``-Wl,--no-as-needed`` (TVM's ``cc`` puts the
    options *before* the object files, so a toolchain that links ``--as-needed`` by default
    would otherwise drop it), with an rpath to its directory and ``$ORIGIN`` (so a copy of
    the library placed beside the exported file also works).
    """
    lib = native.library_path()
    libdir = os.path.dirname(lib)
    return ["-Wl,--no-as-needed", lib, f"-Wl,-rpath,{libdir}", "-Wl,-rpath,$ORIGIN"]


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
