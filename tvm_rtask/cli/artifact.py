"""Artifacts: what ``compile`` writes and ``run`` reads, checked before anything loads them.

An artifact is a shared library exported with :func:`tvm_rtask.runtime.export_library` (it
links the native runtime) that also embeds a small JSON description (inputs, thread count,
target) behind the C symbol ``tvm_rtask_artifact_metadata``, or a ``.tar`` holding ``mod.so``
and ``metadata.json`` (the ``tvmc`` package form).

:func:`load_artifact` checks a file before the dynamic loader sees it: ``dlopen`` of a
truncated library maps pages past the end of the file and the process dies of SIGBUS on the
first touch (exit 135, nothing printed), and a truncated ``.tar`` fails deep in
:mod:`tarfile`. Here the ELF header must be whole, every table and loadable segment it points
to must lie inside the file, a ``.tar`` must read to its end, the metadata must describe
a target tvm-rtask runs, and an llvm artifact's instruction-set features (``cpu_features``,
recorded at compile time) must all be this machine's (:func:`cpu_problem`); each failure is a
:class:`CLIError` of one line, raised before TVM loads the module. (A ``.so``'s embedded
metadata is read with ``dlopen``, which runs none of the model's code; a ``.tar``'s is read
from ``metadata.json``.)
"""

from __future__ import annotations

import functools
import json
import os
import struct
import sys
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..fallbacks import CPU_CHECK_SKIPPED, note_fallback
from .errors import CLIError, first_line
from .paths import check_writable

META_SYMBOL = "tvm_rtask_artifact_metadata"
META_FORMAT = "tvm-rtask-artifact"
META_VERSION = 1
TAR_LIB = "mod.so"
TAR_META = "metadata.json"
SUFFIXES = (".so", ".tar")
TARGET_DEVICES = {"llvm": "cpu", "cuda": "cuda"}

ELF_MAGIC = b"\x7fELF"
_ELF_MACHINES = {
    3: "x86",
    8: "MIPS",
    21: "PowerPC64",
    40: "ARM",
    62: "x86-64",
    183: "AArch64",
    243: "RISC-V",
}


# -- writing --------------------------------------------------------------------------------------
def check_output_path(path: str | os.PathLike, flag: str = "-o") -> str:
    """``path`` names an artifact (``.so`` or ``.tar``) that can be written: checked before a
    build, which can take minutes."""
    return check_writable(path, flag, SUFFIXES)


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


# -- checking a shared library --------------------------------------------------------------------
def _machine_name(code: int) -> str:
    return _ELF_MACHINES.get(code, f"ELF machine {code}")


def _read_ident(f) -> tuple[int, int, int, int] | None:
    """(class, byte order, e_type, e_machine) of an open ELF file, None when it is none."""
    head = f.read(20)
    if len(head) < 20 or head[:4] != ELF_MAGIC or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    order = "<" if head[5] == 1 else ">"
    e_type, e_machine = struct.unpack(order + "HH", head[16:20])
    return head[4], head[5], e_type, e_machine


@functools.cache
def _host_elf() -> tuple[int, int, int] | None:
    """(class, byte order, machine) of this Python interpreter, None where it is not ELF."""
    try:
        with open(sys.executable, "rb") as f:
            ident = _read_ident(f)
    except OSError:
        return None
    return None if ident is None else (ident[0], ident[1], ident[3])


def _cut(size: int, what: str, end: int) -> str:
    return f"is truncated: {size} bytes, but {what} ends at byte {end}"


def elf_problem(path: str) -> str | None:
    """Why the dynamic loader must not see ``path`` (a phrase), or None when it may.

    The checks are those that stop ``dlopen`` from mapping bytes the file does not have: the
    header is whole, it is a shared library for this machine, and the program header table,
    every loadable segment, the section header table and every section with contents end
    inside the file. Truncation anywhere cuts off the section headers, which come last.
    """
    size = os.path.getsize(path)
    if size == 0:
        return "is empty"
    with open(path, "rb") as f:
        ident = _read_ident(f)
        if ident is None:
            f.seek(0)
            if f.read(4) == ELF_MAGIC and size < 20:
                return f"is truncated: {size} bytes, less than an ELF header"
            return "is not an ELF shared library"
        elf_class, byte_order, e_type, e_machine = ident
        order = "<" if byte_order == 1 else ">"
        wide = elf_class == 2
        header = order + ("IQQQIHHHHHH" if wide else "IIIIIHHHHHH")
        raw = f.read(struct.calcsize(header))
        if len(raw) < struct.calcsize(header):
            return f"is truncated: {size} bytes, less than an ELF header"
        _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _ = struct.unpack(header, raw)
        if e_type != 3:  # ET_DYN
            return "is an ELF file but not a shared library"
        host = _host_elf()
        if host is not None and (elf_class, byte_order, e_machine) != host:
            return (
                f"was built for {_machine_name(e_machine)} ({8 * 4 * elf_class}-bit), "
                f"not for this machine ({_machine_name(host[2])}, {8 * 4 * host[0]}-bit)"
            )
        phdr = order + ("IIQQQQQQ" if wide else "IIIIIIII")
        shdr = order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
        if (phnum and phentsize < struct.calcsize(phdr)) or (
            shoff and shentsize < struct.calcsize(shdr)
        ):
            return "has a damaged ELF header (table entries too small)"
        tables = (
            ("program header table", phoff, phentsize * phnum),
            ("section header table", shoff, shentsize * max(shnum, 1) if shoff else 0),
        )
        for what, offset, length in tables:
            if offset + length > size:
                return _cut(size, f"its {what}", offset + length)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            fields = struct.unpack(phdr, f.read(struct.calcsize(phdr)))
            p_type = fields[0]
            p_offset, p_filesz = (fields[2], fields[5]) if wide else (fields[1], fields[4])
            if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD
                return _cut(size, f"segment {i}", p_offset + p_filesz)
        for i in range(shnum if shoff else 0):
            f.seek(shoff + i * shentsize)
            fields = struct.unpack(shdr, f.read(struct.calcsize(shdr)))
            sh_type, sh_offset, sh_size = fields[1], fields[4], fields[5]
            if sh_type not in (0, 8) and sh_offset + sh_size > size:  # SHT_NULL, SHT_NOBITS
                return _cut(size, f"section {i}", sh_offset + sh_size)
    return None


def check_library(path: str, name: str | None = None) -> None:
    """Raise a one-line :class:`CLIError` unless ``path`` is a whole shared library for this
    machine. ``name`` is what the message calls it (default: the path)."""
    problem = elf_problem(path)
    if problem is not None:
        raise CLIError(f"{name or path!r} {problem}; it cannot be loaded")


# -- metadata -------------------------------------------------------------------------------------
def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _metadata_problem(meta: dict) -> str | None:
    version = meta.get("version")
    if not _is_int(version) or version < 1:
        return f"version {version!r} is not a positive integer"
    if version > META_VERSION:
        return (
            f"format version {version} is newer than this tvm-rtask reads ({META_VERSION}); "
            "upgrade tvm-rtask"
        )
    target = meta.get("target")
    if target not in TARGET_DEVICES:
        return f"target {target!r} is not one tvm-rtask runs ({', '.join(TARGET_DEVICES)})"
    if meta.get("device") != TARGET_DEVICES[target]:
        return f"device {meta.get('device')!r} does not match target {target!r}"
    threads = meta.get("threads")
    if not _is_int(threads) or threads < 1:
        return f"threads {threads!r} is not a positive integer"
    features = meta.get("cpu_features", [])
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        return f"cpu_features {features!r} is not a list of names"
    inputs = meta.get("inputs")
    if not isinstance(inputs, list):
        return "'inputs' is not a list"
    for i, info in enumerate(inputs):
        if not isinstance(info, dict) or not isinstance(info.get("name"), str):
            return f"input {i} has no name"
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            return f"input {info['name']!r} has no static shape ({shape!r})"
        try:
            np.dtype(info.get("dtype"))
        except TypeError:
            return f"input {info['name']!r} has an unknown dtype {info.get('dtype')!r}"
    return None


def check_metadata(meta: Any, where: str) -> dict | None:
    """``meta`` when it is a sound tvm-rtask description, None when it is another tool's;
    a damaged or newer one is a :class:`CLIError` naming ``where``."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise CLIError(f"{where}: its metadata is not a JSON object")
    if meta.get("format") != META_FORMAT:
        return None
    problem = _metadata_problem(meta)
    if problem is not None:
        raise CLIError(f"{where}: damaged artifact metadata ({problem})")
    return meta


def _required_features(meta: dict, where: str) -> list[str]:
    """The instruction-set features an llvm artifact's code may use: its ``cpu_features``,
    else (an artifact written before they were recorded) those of its ``target_full``. A
    ``target_full`` that is no JSON (ValueError, TypeError) or no target (Target's
    ValueError, LLVM's InternalError) leaves nothing to check: said, as the check is
    skipped."""
    if "cpu_features" in meta:
        return list(meta["cpu_features"])
    from tvm.error import InternalError
    from tvm.target import Target

    from ..backend.cpu.host import target_isa_features

    text = meta.get("target_full", "")
    try:
        return target_isa_features(Target(json.loads(text)))
    except (ValueError, TypeError, InternalError) as err:
        reason = f"its target_full cannot be read: {type(err).__name__}: {first_line(err)}"
        note_fallback(CPU_CHECK_SKIPPED, where, reason)
        return []


def cpu_problem(meta: dict | None, where: str = "the artifact") -> str | None:
    """Why this machine's CPU cannot run an artifact (a phrase), or None: an llvm artifact
    built for a CPU whose instructions this one lacks would die of SIGILL mid-run.
    ``where`` names the artifact in the warning when its target cannot be read."""
    if meta is None or meta.get("target") != "llvm":
        return None
    from ..backend.cpu.host import host_cpu_name, missing_host_features

    missing = missing_host_features(_required_features(meta, where))
    if not missing:
        return None
    built_for = meta.get("mcpu") or "a CPU named by its attributes"
    return (
        f"was compiled for CPU {built_for} and uses {', '.join(missing)}, which this "
        f"machine's CPU ({host_cpu_name()}) lacks; compile it here (--target llvm-native) "
        "or for a CPU both have (--target llvm runs on any x86-64)"
    )


def check_host_cpu(meta: dict | None, where: str) -> None:
    """A one-line :class:`CLIError` when this machine's CPU cannot run the artifact."""
    problem = cpu_problem(meta, where)
    if problem is not None:
        raise CLIError(f"{where} {problem}")


def read_embedded_metadata(lib_path: str) -> dict | str | None:
    """The JSON behind ``tvm_rtask_artifact_metadata`` of a checked library: a dict, the raw
    text when it is not JSON, None when the library has no such symbol."""
    import ctypes

    import tvm  # noqa: F401  (loads libtvm_ffi, whose symbols the library needs)

    from ..runtime import native

    # The library links libtvm_rtask_runtime: load it first, so that a library built on
    # another machine still finds it from this install.
    native.load()
    try:
        lib = ctypes.CDLL(os.path.abspath(lib_path))
    except OSError as err:
        # Not "no metadata": a tvm-rtask artifact read as a foreign library would run with
        # one thread, and its vEUs would wait for each other until the barrier timeout.
        raise CLIError(f"cannot load {lib_path!r}: {first_line(err)}") from None
    func = getattr(lib, META_SYMBOL, None)
    if func is None:
        return None
    func.restype = ctypes.c_char_p
    raw = func()
    try:
        return json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError, AttributeError):
        return repr(raw)[:60]


# -- reading --------------------------------------------------------------------------------------
@dataclass
class Artifact:
    lib_path: str
    meta: dict | None
    tmp: Any = None  # TemporaryDirectory kept alive while the library is in use


def _unpack(path: str, tmp: str) -> str | None:
    """Extract ``mod.so`` (and ``metadata.json``) of the package at ``path`` into ``tmp``,
    reading every member to its end; returns the metadata text, if any."""
    meta_text = None
    try:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            # tarfile ends its member list quietly at a cut-off header: the archive must
            # go on with its end marker (zero blocks) where the last member ends.
            tar.fileobj.seek(tar.offset)
            marker = tar.fileobj.read(tarfile.BLOCKSIZE)
            if len(marker) < tarfile.BLOCKSIZE or marker.strip(b"\0"):
                raise tarfile.ReadError(f"cut off after byte {tar.offset}")
            if TAR_LIB not in [m.name for m in members]:
                raise CLIError(f"{path!r} is a tar without {TAR_LIB}: not a compiled package")
            for member in members:
                wanted = member.name in (TAR_LIB, TAR_META)
                if wanted and not member.isfile():
                    raise CLIError(f"{path!r}: {member.name} is not a regular file")
                if not member.isfile():
                    continue
                with tar.extractfile(member) as src:
                    data = src.read()
                if len(data) != member.size:
                    raise tarfile.ReadError(f"{member.name} is cut short")
                if member.name == TAR_LIB:
                    with open(os.path.join(tmp, TAR_LIB), "wb") as dst:
                        dst.write(data)
                elif member.name == TAR_META:
                    meta_text = data.decode("utf-8", errors="replace")
    except CLIError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise CLIError(
            f"{path!r} is a truncated or damaged .tar package ({first_line(err).rstrip(':')})"
        ) from None
    return meta_text


def load_artifact(path: str | os.PathLike) -> Artifact:
    """Open and check a ``.so`` or ``.tar`` artifact. Its metadata is None for a library that
    another tool exported; anything truncated, damaged or for another machine is a
    :class:`CLIError`, found before the dynamic loader sees the library."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CLIError(f"artifact {path!r} does not exist")
    if os.path.getsize(path) == 0:
        raise CLIError(f"artifact {path!r} is empty")
    with open(path, "rb") as f:
        is_elf = f.read(4) == ELF_MAGIC
    if is_elf:
        check_library(path)
        meta = read_embedded_metadata(path)
        if isinstance(meta, str):
            raise CLIError(f"{path!r}: its embedded metadata is not JSON ({meta})")
        meta = check_metadata(meta, repr(path))
        check_host_cpu(meta, repr(path))
        return Artifact(os.path.abspath(path), meta)
    if not (path.lower().endswith(".tar") or tarfile.is_tarfile(path)):
        raise CLIError(f"{path!r} is neither a shared library nor a .tar package")
    tmp = tempfile.TemporaryDirectory(prefix="tvm-rtask-run-")
    meta_text = _unpack(path, tmp.name)
    lib = os.path.join(tmp.name, TAR_LIB)
    check_library(lib, f"{path}:{TAR_LIB}")
    if meta_text is None:
        meta = read_embedded_metadata(lib)
        if isinstance(meta, str):
            raise CLIError(f"{path!r}: the embedded metadata of {TAR_LIB} is not JSON ({meta})")
    else:
        try:
            meta = json.loads(meta_text)
        except ValueError as err:
            raise CLIError(f"{path!r}: {TAR_META} is not valid JSON ({err})") from None
    meta = check_metadata(meta, repr(path))
    check_host_cpu(meta, repr(path))
    return Artifact(lib, meta, tmp)
