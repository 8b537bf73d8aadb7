"""Compiling for the host CPU, and refusing code built for a CPU the host is not.

Plain ``"llvm"`` stays what TVM means by it: no ``mcpu``, so LLVM compiles for a generic
processor of the triple (SSE2 on x86-64) and the code runs on any machine of that
architecture. Two spellings ask for the machine that compiles instead:

- the target ``"llvm-native"`` (``registry.as_target``), and
- an llvm target whose ``mcpu`` is ``"native"`` (``{"kind": "llvm", "mcpu": "native"}``).

TVM 0.27 accepts ``mcpu: "native"`` in a target, but LLVM 22 does not resolve it: it logs
"``-mcpu=native`` is not valid" and compiles for ``generic``. :func:`resolve_target`
therefore replaces it with LLVM's name of the host CPU (``llvm_get_system_cpu``, e.g.
``rocketlake``) before anything plans, so the plan and the artifact record the concrete CPU.

An artifact records the instruction-set features its code may use
(:func:`target_isa_features`); :func:`missing_host_features` says which of them this host
lacks (from ``/proc/cpuinfo`` on x86, else LLVM's description of the host CPU), so that
``tvm-rtask run`` refuses it in one line instead of dying of SIGILL.
"""

from __future__ import annotations

import functools

from tvm.target import Target

from ...errors import OptionError

NATIVE_ALIAS = "llvm-native"
NATIVE_MCPU = "native"

# LLVM feature name -> /proc/cpuinfo flag (x86): the instruction-set extensions generated
# code may use. Tuning flags (prefer-256-bit, fast-gather, ...) describe no instructions and
# are left out, so they never make an artifact unloadable.
X86_ISA_FLAGS = {
    "sse": "sse",
    "sse2": "sse2",
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "sse4a": "sse4a",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "fma4": "fma4",
    "xop": "xop",
    "f16c": "f16c",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "lzcnt": "abm",
    "popcnt": "popcnt",
    "movbe": "movbe",
    "adx": "adx",
    "aes": "aes",
    "pclmul": "pclmulqdq",
    "sha": "sha_ni",
    "gfni": "gfni",
    "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq",
    "avx512f": "avx512f",
    "avx512cd": "avx512cd",
    "avx512dq": "avx512dq",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    "amx-fp16": "amx_fp16",
}


def host_cpu_name() -> str:
    """LLVM's name of this machine's CPU (``generic`` when LLVM does not know it)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def _system_triple() -> str:
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())


def _mcpu(target: Target) -> str:
    return str(target.attrs.get("mcpu", "") or "")


def resolve_target(target: Target) -> Target:
    """``target`` with ``mcpu: "native"`` replaced by the host CPU's name (dropped when LLVM
    names the host ``generic``: that is plain llvm); an ``mcpu`` LLVM does not know for the
    target's triple is an :class:`OptionError` (LLVM would silently compile for
    ``generic``). Other targets come back unchanged."""
    if str(target.kind.name) != "llvm":
        return target
    mcpu = _mcpu(target)
    if not mcpu:
        return target
    if mcpu == NATIVE_MCPU:
        config = dict(target.export())
        cpu = host_cpu_name()
        if cpu and cpu != "generic":
            config["mcpu"] = cpu
            # LLVM names the CPU from its model number; a virtual machine may not enable all
            # of that CPU's extensions (an "emeraldrapids" guest without AMX or AVX512-FP16):
            # those are turned off, so that the code runs here and the artifact says so
            absent = missing_host_features(
                target_isa_features(Target({"kind": "llvm", "mcpu": cpu}))
            )
            if absent:
                config["mattr"] = [*(config.get("mattr") or []), *(f"-{f}" for f in absent)]
        else:
            config.pop("mcpu")
        return Target(config) if target.host is None else Target(config, host=target.host)
    triple = str(target.attrs.get("mtriple", "") or "") or _system_triple()
    from tvm.error import InternalError
    from tvm.target import codegen

    try:
        valid = bool(codegen.llvm_is_valid_cpu(mcpu, triple))
    except InternalError:  # a triple this LLVM was built without: LLVM will say so itself
        return target
    if not valid:
        raise OptionError(
            f"LLVM knows no CPU {mcpu!r} for {triple} (it would compile for a generic CPU); "
            f"use {NATIVE_ALIAS!r} or mcpu 'native' for this host ({host_cpu_name()})"
        )
    return target


def target_isa_features(target: Target) -> list[str]:
    """The instruction-set features (LLVM names, :data:`X86_ISA_FLAGS`) that code built for
    ``target`` may use: those of its ``mcpu`` and ``mattr``, sorted. Empty for a target that
    is not x86 llvm, or names no CPU and no attributes (plain llvm runs anywhere)."""
    if str(target.kind.name) != "llvm":
        return []
    if not _mcpu(target) and not list(target.attrs.get("mattr", None) or []):
        return []
    triple = str(target.attrs.get("mtriple", "") or "") or _system_triple()
    if not triple.startswith(("x86_64", "i386", "i686")):
        return []
    from tvm.target import codegen

    features = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    return sorted(features & set(X86_ISA_FLAGS))


@functools.cache
def host_isa_features() -> frozenset[str] | None:
    """The :data:`X86_ISA_FLAGS` features this machine has (LLVM names), from the
    ``flags`` line of ``/proc/cpuinfo``; else LLVM's features of the host CPU's name; None
    when neither is known."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return frozenset(k for k, v in X86_ISA_FLAGS.items() if v in flags)
    except OSError:
        pass
    cpu = host_cpu_name()
    if not cpu or cpu == "generic":
        return None
    from tvm.target import codegen

    features = codegen.llvm_get_cpu_features(Target({"kind": "llvm", "mcpu": cpu}))
    return frozenset({str(f) for f in features} & set(X86_ISA_FLAGS))


def missing_host_features(required) -> list[str]:
    """Which of the ``required`` features (LLVM names) this host lacks, sorted; names not in
    :data:`X86_ISA_FLAGS` cannot be checked and are not reported. Empty when the host's
    features are unknown."""
    host = host_isa_features()
    if host is None:
        return []
    return sorted(f for f in required if f in X86_ISA_FLAGS and f not in host)
