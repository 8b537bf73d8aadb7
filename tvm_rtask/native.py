"""Locate and load the native runtime library ``libtvm_rtask_runtime.so``.

The library (built from ``src/step_array.c`` by CMake through scikit-build-core) holds the
CPU step-array primitives that TVM-generated code calls with ``T.call_extern``:

- ``int32_t tvm_rtask_cpu_signal(int32_t* step, int32_t value)``
- ``int32_t tvm_rtask_cpu_wait(int32_t* step, int32_t target, int32_t* status,
  int64_t timeout_us, int32_t waiter_veu, int32_t target_veu)``
- ``int32_t tvm_rtask_cpu_status_ok(int32_t* status)``
- ``int32_t tvm_rtask_cpu_publish(void* workspace)``: does nothing LLVM can see; called
  between two runs that nothing else separates, so that the workspace they exchange escapes
- ``int32_t tvm_rtask_cpu_ensure_workers(int32_t num_veu)``: called by every CPU dispatcher
  before its parallel launch; makes the calling thread's TVM thread pool run at least
  ``num_veu`` workers (through TVM's global functions, found with ``dlsym``); 0 when it
  does, else the worker count of a pool that cannot grow
- ``void tvm_rtask_cpu_note_pool_configured(void)`` / ``int32_t
  tvm_rtask_cpu_pool_configured(void)``: set / read the calling thread's "pool sized by
  tvm-rtask" flag (:mod:`tvm_rtask.backend.cpu.threads`)
- ``const char* tvm_rtask_runtime_version(void)``
- ``tvm_rtask_trace_*`` (``src/trace.c``): the timeline of kernels built with ``trace=True``
  (:mod:`tvm_rtask.runtime.trace`)

:func:`load` opens it once with ``RTLD_GLOBAL``, so that its symbols resolve for TVM's LLVM
JIT (``tvm.compile(..., target="llvm")``) and for modules loaded later with
``tvm.runtime.load_module``.  Modules exported with
:func:`tvm_rtask.runtime.export.export_library` link the library themselves and need no
:func:`load`.

A second, small library ``libtvm_rtask_pass_config.so`` (``src/pass_config.cc``, C++)
registers the ``rtask.*`` PassContext config keys with TVM; :func:`load_pass_config` opens it
(``RTLD_LOCAL``) and is used by :mod:`tvm_rtask.runtime.config`.  It is searched in the same
places as the runtime library (``$TVM_RTASK_PASS_CONFIG_LIB`` last).

This module imports neither TVM nor numpy (:func:`load_pass_config` imports ``tvm_ffi``).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

__all__ = [
    "ENV_VAR",
    "LIBRARY_NAME",
    "PASS_CONFIG_ENV_VAR",
    "PASS_CONFIG_LIBRARY_NAME",
    "STATUS_WORDS",
    "candidate_paths",
    "library_path",
    "link_options",
    "load",
    "load_pass_config",
    "pass_config_library_path",
    "runtime_version",
]

#: File name of the native library.
LIBRARY_NAME = (
    "libtvm_rtask_runtime.dylib" if sys.platform == "darwin" else "libtvm_rtask_runtime.so"
)
#: Environment variable naming the library file; searched after the install locations.
ENV_VAR = "TVM_RTASK_RUNTIME_LIB"
#: File name of the library that registers the PassContext config keys.
PASS_CONFIG_LIBRARY_NAME = (
    "libtvm_rtask_pass_config.dylib" if sys.platform == "darwin" else "libtvm_rtask_pass_config.so"
)
#: Environment variable naming that library file; searched after the install locations.
PASS_CONFIG_ENV_VAR = "TVM_RTASK_PASS_CONFIG_LIB"
#: Length of the status array that ``tvm_rtask_cpu_wait`` writes on failure:
#: [failed, waiter_veu, target_veu, target_step, seen_step].
STATUS_WORDS = 5

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_PASS_CONFIG_LIB: ctypes.CDLL | None = None


def _package_dirs() -> list[Path]:
    """Directories of the ``tvm_rtask`` package.

    In a wheel install that is one directory in site-packages.  In a scikit-build-core
    editable (redirect) install ``tvm_rtask.__path__`` lists the install tree in
    site-packages (which holds ``lib/``) first and the source tree second.
    """
    dirs: list[Path] = []
    pkg = sys.modules.get("tvm_rtask")
    for entry in list(getattr(pkg, "__path__", None) or []):
        dirs.append(Path(entry))
    dirs.append(Path(__file__).resolve().parent)
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _build_dirs() -> list[Path]:
    """CMake build trees of a source checkout (``build/{wheel_tag}`` from pyproject.toml,
    or a plain ``cmake -B build``)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "CMakeLists.txt").is_file():
        return []
    build = root / "build"
    dirs = [build]
    if build.is_dir():
        dirs += sorted(p for p in build.iterdir() if p.is_dir())
    return dirs


def _candidates(name: str, env_var: str) -> list[Path]:
    paths = [d / "lib" / name for d in _package_dirs()]
    paths += [d / name for d in _build_dirs()]
    env = os.environ.get(env_var)
    if env:
        paths.append(Path(env))
    return paths


def _find(name: str, env_var: str) -> str:
    paths = _candidates(name, env_var)
    for path in paths:
        if path.is_file():
            return str(path.resolve())
    searched = "\n  ".join(str(p) for p in paths)
    raise RuntimeError(
        f"tvm-rtask: the native library {name} was not found. Searched:\n"
        f"  {searched}\n"
        f"Reinstall the package so that CMake builds it: `pip install -e .` in the source "
        f"checkout (or `make venv`), or set {env_var} to the library file."
    )


def candidate_paths() -> list[Path]:
    """Every place :func:`library_path` looks, in order."""
    return _candidates(LIBRARY_NAME, ENV_VAR)


def library_path() -> str:
    """Absolute path of the native library.

    Searched in order: the package's ``lib/`` directory (wheel install, or the install
    tree of an editable install), the CMake build trees under ``build/`` of a source
    checkout, then the file named by ``$TVM_RTASK_RUNTIME_LIB``.

    Raises
    ------
    RuntimeError
        When no candidate exists; the message lists the paths searched.
    """
    return _find(LIBRARY_NAME, ENV_VAR)


def link_options() -> list[str]:
    """Linker options that add the library to a shared library's link.

    The library goes in by full path after ``-Wl,--no-as-needed`` (TVM's ``cc`` puts the
    options *before* the object files, so a toolchain that links ``--as-needed`` by default
    would otherwise drop it), with an rpath to its directory and ``$ORIGIN`` (so a copy of
    the library placed beside the exported file also works).
    """
    lib = library_path()
    libdir = os.path.dirname(lib)
    return ["-Wl,--no-as-needed", lib, f"-Wl,-rpath,{libdir}", "-Wl,-rpath,$ORIGIN"]


def pass_config_library_path() -> str:
    """Absolute path of ``libtvm_rtask_pass_config.so``; searched like :func:`library_path`
    (``$TVM_RTASK_PASS_CONFIG_LIB`` last).  Raises ``RuntimeError`` when absent."""
    return _find(PASS_CONFIG_LIBRARY_NAME, PASS_CONFIG_ENV_VAR)


def _declare(lib: ctypes.CDLL) -> None:
    i32, i64, p32 = ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_int32)
    lib.tvm_rtask_cpu_signal.argtypes = [p32, i32]
    lib.tvm_rtask_cpu_signal.restype = i32
    lib.tvm_rtask_cpu_wait.argtypes = [p32, i32, p32, i64, i32, i32]
    lib.tvm_rtask_cpu_wait.restype = i32
    lib.tvm_rtask_cpu_status_ok.argtypes = [p32]
    lib.tvm_rtask_cpu_status_ok.restype = i32
    lib.tvm_rtask_cpu_ensure_workers.argtypes = [i32]
    lib.tvm_rtask_cpu_ensure_workers.restype = i32
    lib.tvm_rtask_cpu_note_pool_configured.argtypes = []
    lib.tvm_rtask_cpu_note_pool_configured.restype = None
    lib.tvm_rtask_cpu_pool_configured.argtypes = []
    lib.tvm_rtask_cpu_pool_configured.restype = i32
    lib.tvm_rtask_runtime_version.argtypes = []
    lib.tvm_rtask_runtime_version.restype = ctypes.c_char_p
    # the timeline of traced kernels (src/trace.c, runtime/trace.py)
    lib.tvm_rtask_trace_reset.argtypes = [i64]
    lib.tvm_rtask_trace_reset.restype = i32
    lib.tvm_rtask_trace_begin.argtypes = []
    lib.tvm_rtask_trace_begin.restype = i32
    lib.tvm_rtask_trace_end.argtypes = [i32, i32, i32, i32, i32]
    lib.tvm_rtask_trace_end.restype = i32
    lib.tvm_rtask_trace_count.argtypes = []
    lib.tvm_rtask_trace_count.restype = i64
    lib.tvm_rtask_trace_dropped.argtypes = []
    lib.tvm_rtask_trace_dropped.restype = i64
    lib.tvm_rtask_trace_copy.argtypes = [ctypes.POINTER(i64), i64]
    lib.tvm_rtask_trace_copy.restype = i64


def load() -> ctypes.CDLL:
    """Load the native library once (``RTLD_GLOBAL``) and return it.

    The returned ``ctypes.CDLL`` has argument and result types declared for the exported
    functions, so it can be called directly from Python (tests, host checks).
    """
    global _LIB
    if _LIB is not None:
        return _LIB
    with _LOCK:
        if _LIB is None:
            path = library_path()
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as err:
                raise RuntimeError(
                    f"tvm-rtask: could not load the native runtime library {path}: {err}. "
                    "Reinstall with `pip install -e .`."
                ) from err
            _declare(lib)
            _LIB = lib
    return _LIB


def runtime_version() -> str:
    """Version string compiled into the native library."""
    return load().tvm_rtask_runtime_version().decode()


def _declare_pass_config(lib: ctypes.CDLL) -> None:
    c_str, c_int = ctypes.c_char_p, ctypes.c_int
    lib.tvm_rtask_register_config_options.argtypes = [
        ctypes.POINTER(c_str),
        ctypes.POINTER(c_str),
        c_int,
        c_str,
    ]
    lib.tvm_rtask_register_config_options.restype = c_int
    lib.tvm_rtask_pass_config_available.argtypes = [c_str]
    lib.tvm_rtask_pass_config_available.restype = c_int
    lib.tvm_rtask_pass_config_last_error.argtypes = []
    lib.tvm_rtask_pass_config_last_error.restype = c_str
    lib.tvm_rtask_pass_config_tvm_ffi_version.argtypes = []
    lib.tvm_rtask_pass_config_tvm_ffi_version.restype = c_str


def load_pass_config() -> ctypes.CDLL:
    """Load ``libtvm_rtask_pass_config.so`` once (``RTLD_LOCAL``) and return it.

    The library uses a few ``libtvm_ffi`` symbols that it does not link: they come from the
    process, so ``tvm_ffi`` is imported first (it loads ``libtvm_ffi.so`` ``RTLD_GLOBAL``).
    The library is never unloaded: TVM keeps the legalization functions it registers.
    Raises ``RuntimeError`` when the library is missing or cannot be loaded.
    """
    global _PASS_CONFIG_LIB
    if _PASS_CONFIG_LIB is not None:
        return _PASS_CONFIG_LIB
    import tvm_ffi  # noqa: F401  (loads libtvm_ffi.so RTLD_GLOBAL)

    with _LOCK:
        if _PASS_CONFIG_LIB is None:
            path = pass_config_library_path()
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
            except OSError as err:
                raise RuntimeError(
                    f"tvm-rtask: could not load {path}: {err}. Reinstall with `pip install -e .`."
                ) from err
            _declare_pass_config(lib)
            _PASS_CONFIG_LIB = lib
    return _PASS_CONFIG_LIB
