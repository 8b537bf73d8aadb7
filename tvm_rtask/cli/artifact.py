"""Artifacts: what ``compile`` writes and ``run`` reads.

An artifact is a shared library exported with :func:`tvm_rtask.runtime.export_library` (it
links the native runtime) that also embeds a small JSON description (inputs, thread count,
target) behind the C symbol ``tvm_rtask_artifact_metadata``, or a ``.tar`` holding ``mod.so``
and ``metadata.json`` (the ``tvmc`` package form).
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Any

from .errors import CLIError

META_SYMBOL = "tvm_rtask_artifact_metadata"
META_FORMAT = "tvm-rtask-artifact"
META_VERSION = 1
TAR_LIB = "mod.so"
TAR_META = "metadata.json"


def metadata_c_source(meta: dict) -> str:
    """A C source defining ``const char* tvm_rtask_artifact_metadata(void)``."""
    data = json.dumps(meta, sort_keys=True).encode()
    body = ",".join(str(b) for b in data)
    return (
        "/* tvm-rtask artifact metadata (JSON), linked into the exported library. */\n"
        '#ifdef __cplusplus\nextern "C" {\n#endif\n'
        f"static const unsigned char rtask_meta[] = {{{body},0}};\n"
        '__attribute__((visibility("default"))) const char* '
        f"{META_SYMBOL}(void) {{ return (const char*)rtask_meta; }}\n"
        "#ifdef __cplusplus\n}\n#endif\n"
    )


def save_artifact(ex, path: str | os.PathLike, meta: dict) -> str:
    """Export ``ex`` to ``path``: a ``.so`` with the metadata linked in, or a ``.tar`` with
    ``mod.so`` and ``metadata.json``."""
    from ..runtime import export_library

    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CLIError(f"output directory {parent!r} does not exist")
    with tempfile.TemporaryDirectory(prefix="tvm-rtask-") as tmp:
        src = os.path.join(tmp, "rtask_meta.c")
        with open(src, "w") as f:
            f.write(metadata_c_source(meta))
        if path.endswith(".tar"):
            lib = os.path.join(tmp, TAR_LIB)
            export_library(ex, lib, options=[src])
            meta_path = os.path.join(tmp, TAR_META)
            with open(meta_path, "w") as f:
                json.dump(meta, f, indent=1, sort_keys=True)
            with tarfile.open(path, "w") as tar:
                tar.add(lib, arcname=TAR_LIB)
                tar.add(meta_path, arcname=TAR_META)
        else:
            export_library(ex, path, options=[src])
    return path


@dataclass
class Artifact:
    lib_path: str
    meta: dict | None
    tmp: Any = None  # TemporaryDirectory kept alive while the library is in use


def load_artifact(path: str | os.PathLike) -> Artifact:
    """Open a ``.so`` or ``.tar`` artifact; its metadata is None for a foreign library."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CLIError(f"artifact {path!r} does not exist")
    if tarfile.is_tarfile(path):
        tmp = tempfile.TemporaryDirectory(prefix="tvm-rtask-run-")
        with tarfile.open(path) as tar:
            names = tar.getnames()
            if TAR_LIB not in names:
                raise CLIError(f"{path!r} is a tar without {TAR_LIB}: not a compiled package")
            for name in (TAR_LIB, TAR_META):
                if name in names:
                    member = tar.getmember(name)
                    if not member.isfile():
                        raise CLIError(f"{path!r}: {name} is not a regular file")
                    with (
                        tar.extractfile(member) as src,
                        open(os.path.join(tmp.name, name), "wb") as dst,
                    ):
                        dst.write(src.read())
        meta = None
        meta_path = os.path.join(tmp.name, TAR_META)
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
        return Artifact(os.path.join(tmp.name, TAR_LIB), meta, tmp)
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise CLIError(f"{path!r} is neither a shared library nor a .tar package")
    return Artifact(os.path.abspath(path), None)


def read_embedded_metadata(lib_path: str) -> dict | None:
    """The JSON behind ``tvm_rtask_artifact_metadata``, None when it cannot be read."""
    import ctypes

    try:
        lib = ctypes.CDLL(lib_path)
        func = getattr(lib, META_SYMBOL)
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_char_p
    try:
        return json.loads(func().decode())
    except (ValueError, UnicodeDecodeError):
        return None
