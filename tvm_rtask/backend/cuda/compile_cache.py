"""One nvcc compile per persistent kernel's source: the cubin checked is the cubin that runs.

On a machine with a CUDA runtime, TVM compiles a module's CUDA source inside ``tvm.compile``
(the codegen calls the global function ``tvm_callback_cuda_compile``; without a CUDA runtime
the source is kept and compiled when loaded). tvm-rtask's occupancy check
(``verify_occupancy``) needs ptxas' registers and spills of the same source, which used to be
a second full compile (12.5 min for NASNet's step-array kernels). Here the compile is done
once, with TVM's own nvcc flags and ``ptxas -v``, and its cubin and report are kept in a disk
cache keyed by the source, the architecture, nvcc's version and flags. The callback installed by
:func:`install_compile_callback` answers sources that hold tvm-rtask's persistent kernels
from that cache (compiling on a miss); every other source goes to TVM's own callback
unchanged, so TVM's default builds (the baselines) are compiled exactly as TVM compiles them.

The cache lives in ``$TVM_RTASK_CUDA_CACHE`` (default ``~/.cache/tvm-rtask/cuda``); entries are
written atomically and a damaged entry is compiled again. ``make gpu-pack`` fills one on a
machine without a GPU and carries it to the GPU machine (``bench/gpu_pack.py``): the key holds
the last line of ``nvcc --version`` (e.g. ``Build cuda_13.0.r13.0/compiler.36424714_0``), so a
device whose nvcc differs misses every entry unless ``$TVM_RTASK_CUDA_CACHE_NVCC`` names the
version the cache was filled with (``bench/gpu_window.py`` sets it then: an sm_90 cubin runs on
any driver that supports its CUDA version). :func:`stats` counts this process's hits and misses.

Beside the sources, ``registers/`` keeps each scheduled kernel's registers per thread when
TVM builds it alone (the persistent kernels' register budget, ``occupancy.
source_kernel_registers``), keyed by TVM's and nvcc's versions, the flags and the kernel's
structural hash: a kernel seen before is not built again for its count. The final build is
still checked against ptxas' own report of the persistent kernels (``verify_occupancy``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "TVM_RTASK_CUDA_CACHE"
# nvcc version string keyed instead of the local nvcc's (a cache filled by another nvcc)
NVCC_VERSION_ENV = "TVM_RTASK_CUDA_CACHE_NVCC"
_STATS = {"hits": 0, "misses": 0, "compile_s": 0.0, "register_hits": 0, "register_misses": 0}
REGISTERS_DIR = "registers"  # kernels' register counts, beside the compiled sources
# Sources holding this marker are tvm-rtask's (dispatch.SYNC_SOURCE defines it).
RTASK_MARKER = "TVM_RTASK_SYNC_DEFINED"


@dataclass(frozen=True)
class Compiled:
    """A cubin and ptxas' ``-v`` report for it."""

    cubin: bytes
    report: str


def find_nvcc() -> str | None:
    """nvcc from PATH or CUDA_HOME, or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = os.path.join(home, "bin", "nvcc") if home else ""
    return candidate if candidate and os.path.exists(candidate) else None


def tvm_nvcc_command(nvcc: str, arch: str, source: str, output: str) -> list[str]:
    """The nvcc command TVM itself compiles CUDA with (``tvm.support.nvcc``: ``-O3``,
    ``--use_fast_math``, ptxas ``--register-usage-level=10``, ...), to a cubin, with the
    ptxas report (``-v``) on: registers counted as for the kernel that will run.

    TVM 0.27 compiles the CUDA source only when the module is loaded on a device (the
    runtime's ``tvm_callback_cuda_compile``), so a build on a machine without a GPU never
    runs nvcc: the occupancy checks compile the source themselves, with these flags.
    """
    try:
        from tvm.support.nvcc import _ptxas_option_flags

        ptxas = list(_ptxas_option_flags())
    except ImportError:
        ptxas = ["-v"]
    if "-v" not in ptxas:
        ptxas.append("-v")
    fast_math = [] if os.environ.get("TVM_CUDA_NVCC_NO_FAST_MATH") else ["--use_fast_math"]
    suffix = arch.removeprefix("sm_")
    return [
        nvcc,
        "--cubin",
        "-O3",
        "-gencode",
        f"arch=compute_{suffix},code=sm_{suffix}",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        *fast_math,
        f"--ptxas-options={','.join(ptxas)}",
        "-o",
        output,
        source,
    ]


def cache_dir() -> Path:
    """Where compiled sources are kept (``$TVM_RTASK_CUDA_CACHE``)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "tvm-rtask" / "cuda"


@functools.lru_cache(maxsize=4)
def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else nvcc


def nvcc_version(nvcc: str | None = None) -> str | None:
    """The last line of ``nvcc --version`` (what the cache key holds), or None without nvcc."""
    nvcc = nvcc or find_nvcc()
    return _nvcc_version(nvcc) if nvcc else None


def stats() -> dict:
    """This process's cache hits, misses and seconds spent in nvcc on misses."""
    return {**_STATS, "compile_s": round(_STATS["compile_s"], 2)}


def _key(source: str, arch: str, nvcc: str) -> str:
    flags = " ".join(tvm_nvcc_command(nvcc, arch, "in.cu", "out.cubin")[1:])
    version = os.environ.get(NVCC_VERSION_ENV) or _nvcc_version(nvcc)
    text = "\0".join([version, flags, source])
    return hashlib.sha256(text.encode()).hexdigest()


def _read(base: Path) -> Compiled | None:
    """The entry at ``base``, or None if missing or damaged (the report's first line holds
    the cubin's sha256)."""
    try:
        data = base.with_suffix(".cubin").read_bytes()
        digest, _, report = base.with_suffix(".ptxas").read_text().partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    if digest != hashlib.sha256(data).hexdigest():
        return None
    return Compiled(data, report)


def _touch(base: Path) -> None:
    """Mark an entry used now (its mtime): ``make gpu-pack`` carries only the entries its
    builds used, from a cache that it keeps between packs."""
    for suffix in (".cubin", ".ptxas"):
        try:
            os.utime(base.with_suffix(suffix))
        except OSError:
            pass


def _write(base: Path, compiled: Compiled) -> None:
    """Write both files through temporary names, the cubin first, so a reader sees whole
    files; the digest in the report catches a cubin replaced in between."""
    report = hashlib.sha256(compiled.cubin).hexdigest() + "\n" + compiled.report
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for suffix, data in ((".cubin", compiled.cubin), (".ptxas", report.encode())):
            fd, tmp = tempfile.mkstemp(dir=base.parent, suffix=suffix + ".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, base.with_suffix(suffix))
    except OSError:
        pass  # a read-only cache only costs the next compile


def compile_source(source: str, arch: str, nvcc: str | None = None) -> Compiled:
    """``source`` compiled for ``arch`` with TVM's nvcc flags, from the cache when it holds it."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (PATH, CUDA_HOME)")
    base = cache_dir() / _key(source, arch, nvcc)
    cached = _read(base)
    if cached is not None:
        _STATS["hits"] += 1
        _touch(base)
        return cached
    _STATS["misses"] += 1
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.cu")
        with open(path, "w") as f:
            f.write(source)
        out = subprocess.run(
            tvm_nvcc_command(nvcc, arch, path, path + ".cubin"),
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if out.returncode != 0:
            raise RuntimeError(f"nvcc failed on the generated CUDA source:\n{out.stderr[-3000:]}")
        compiled = Compiled(Path(path + ".cubin").read_bytes(), out.stderr)
    _STATS["compile_s"] += time.perf_counter() - started
    _write(base, compiled)
    return compiled


def registers_key(func, target: str, arch: str, nvcc: str | None = None) -> str | None:
    """The cache key of a scheduled PrimFunc's registers per thread when TVM builds it alone
    for ``target`` (its text) and ``arch`` (:func:`occupancy.source_kernel_registers`): TVM's
    version, nvcc's version and flags, and the function's structural hash (its name apart).
    None without nvcc."""
    import tvm
    import tvm_ffi

    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return None
    flags = " ".join(tvm_nvcc_command(nvcc, arch, "in.cu", "out.cubin")[1:])
    version = os.environ.get(NVCC_VERSION_ENV) or _nvcc_version(nvcc)
    func_hash = tvm_ffi.structural_hash(func.without_attr("global_symbol"))
    text = "\0".join([REGISTERS_DIR, tvm.__version__, version, flags, target, str(func_hash)])
    return hashlib.sha256(text.encode()).hexdigest()


def read_registers(key: str) -> int | None:
    """The registers cached under ``key`` (an entry read is marked used), or None."""
    path = cache_dir() / REGISTERS_DIR / f"{key}.json"
    try:
        registers = int(json.loads(path.read_text())["registers"])
    except (OSError, ValueError, KeyError, TypeError):
        _STATS["register_misses"] += 1
        return None
    _STATS["register_hits"] += 1
    try:
        os.utime(path)
    except OSError:
        pass
    return registers


def write_registers(key: str, registers: int) -> None:
    """Keep ``registers`` under ``key`` (written through a temporary name)."""
    folder = cache_dir() / REGISTERS_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".json.tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"registers": int(registers)}, f)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass  # a read-only cache only costs the next compile


def _current_arch() -> str | None:
    """The architecture being compiled for: the target in scope, else the device's."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    if target is not None and target.kind.name == "cuda" and target.attrs.get("arch"):
        return str(target.attrs["arch"])
    dev = tvm.cuda(0)
    if dev.exist:
        return "sm_" + str(dev.compute_version).replace(".", "")
    return None


def cached_callback(original):
    """A ``tvm_callback_cuda_compile`` that compiles tvm-rtask's sources through the cache
    and hands every other source to ``original``."""

    def compile_with_cache(code):
        text = str(code)
        arch = _current_arch() if RTASK_MARKER in text else None
        if arch is None:
            return original(code)
        return bytearray(compile_source(text, arch).cubin)

    return compile_with_cache


_installed = False


def install_compile_callback() -> bool:
    """Answer tvm-rtask's sources from :func:`compile_source`; others go to TVM's callback.

    Returns False (and installs nothing) without nvcc: TVM's own callback then compiles
    everything, and the occupancy check, if on, compiles once more.
    """
    global _installed
    if _installed:
        return True
    if find_nvcc() is None:
        return False
    import tvm_ffi
    from tvm.support import nvcc as tvm_nvcc  # registers TVM's callback first

    callback = cached_callback(tvm_nvcc.tvm_callback_cuda_compile)
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", callback, override=True)
    _installed = True
    return True
