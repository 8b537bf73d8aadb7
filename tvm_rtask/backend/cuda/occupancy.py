"""Registers and shared memory of generated kernels, from ``ptxas -v``, and the vEU check.

The planner assumes a register count (option ``cuda_registers``, 0 = unknown); the real one is
known only after ptxas allocates registers. :func:`ptxas_usage` compiles the generated CUDA
source once and reads what ptxas reports for each kernel; :func:`check_co_residency` then
refuses a persistent kernel whose vEUs could not all be resident at once, which would make
its barriers wait for blocks that never start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...core import DeviceSpec, blocks_per_sm
from ...errors import CapacityError, SpillError
from .compile_cache import (
    compile_source,
    find_nvcc,
    read_registers,
    registers_key,
    tvm_nvcc_command,
    write_registers,
)

__all__ = [
    "KernelUsage",
    "check_co_residency",
    "check_spills",
    "find_nvcc",
    "parse_function_spills",
    "parse_ptxas_report",
    "ptxas_usage",
    "source_kernel_registers",
    "tvm_nvcc_command",
    "with_callees",
]

_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_USAGE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SPILLS = re.compile(r"(\d+) bytes spill stores")


@dataclass(frozen=True)
class KernelUsage:
    """What ptxas reports for one ``__global__`` function."""

    registers: int
    shared_mem: int
    spill_stores: int = 0  # bytes


def ptxas_usage(source: str, arch: str, nvcc: str | None = None) -> dict[str, KernelUsage]:
    """Compile ``source`` for ``arch`` as TVM does (:func:`tvm_nvcc_command`), once: the
    cubin and ptxas' report are cached (``compile_cache``) and the same cubin is what runs
    when tvm-rtask's build loads it; usage per kernel."""
    return parse_ptxas_report(compile_source(source, arch, nvcc).report)


def parse_ptxas_report(text: str) -> dict[str, KernelUsage]:
    """Registers, shared memory and spill stores per kernel from ptxas ``-v`` output."""
    usage: dict[str, KernelUsage] = {}
    current, spills = None, 0
    for line in text.splitlines():
        match = _FUNCTION.search(line)
        if match:
            current, spills = match.group(1), 0
            continue
        match = _SPILLS.search(line)
        if match:
            spills = int(match.group(1))
        match = _USAGE.search(line)
        if match and current is not None:
            usage[current] = KernelUsage(int(match.group(1)), int(match.group(2) or 0), spills)
            current = None
    return usage


_PROPERTIES = re.compile(r"Function properties for (\w+)")


def parse_function_spills(text: str) -> dict[str, int]:
    """Spill-store bytes of every function ptxas reports properties for (device functions
    too, which have no entry of their own in :func:`parse_ptxas_report`)."""
    spills: dict[str, int] = {}
    current = None
    for line in text.splitlines():
        match = _PROPERTIES.search(line)
        if match:
            current = match.group(1)
            continue
        match = _SPILLS.search(line)
        if match and current is not None:
            spills[current] = int(match.group(1))
            current = None
    return spills


def with_callees(
    usage: dict[str, KernelUsage],
    report: str,
    callees: dict[str, list[str]],
    dynamic_shared: dict[str, int],
) -> dict[str, KernelUsage]:
    """Kernel usage counting what the kernel brings along: the spills of the device
    functions it calls (``callees``) and the dynamic shared memory it is launched with."""
    spills = parse_function_spills(report)
    out = dict(usage)
    for name, use in usage.items():
        extra = sum(spills.get(c, 0) for c in callees.get(name, ()))
        dyn = dynamic_shared.get(name, 0)
        if extra or dyn:
            out[name] = KernelUsage(use.registers, use.shared_mem + dyn, use.spill_stores + extra)
    return out


def source_kernel_registers(funcs: dict, target) -> dict[str, int] | None:
    """Registers per thread of each scheduled PrimFunc compiled as TVM compiles it alone
    (``{name: registers}``), or None without nvcc.

    The persistent kernel's register budget, and so its vEUs per SM, is taken from the
    kernels it runs: one nvcc run over all of them, before the rProgram is built. Counts are
    kept in the compile cache by the function's structure (``compile_cache.registers_key``):
    a kernel seen before is not built again (the TVM build of every kernel alone was a
    quarter of a CUDA compile whose nvcc runs all hit the cache).
    """
    import tvm

    if find_nvcc() is None or not funcs:
        return None
    arch = str(target.arch)
    keys = {name: registers_key(f, str(target), arch) for name, f in funcs.items()}
    known = {}
    for name, key in keys.items():
        registers = read_registers(key)
        if registers is not None:
            known[name] = registers
    missing = {name: f for name, f in funcs.items() if name not in known}
    if missing:
        mod = tvm.IRModule(
            {name: f.with_attr("global_symbol", name) for name, f in missing.items()}
        )
        with target:
            lib = tvm.tirx.build(mod, target=target)
        source = next(m.inspect_source() for m in lib.imports if m.kind == "cuda")
        usage = ptxas_usage(source, arch)
        for name in missing:
            known[name] = max(
                (
                    u.registers
                    for k, u in usage.items()
                    if k == f"{name}_kernel" or k.startswith(f"{name}_kernel_")
                ),
                default=0,
            )
            write_registers(keys[name], known[name])
    return {name: known[name] for name in funcs}


def check_co_residency(
    spec: DeviceSpec, threads: int, num_veu: int, usage: dict[str, KernelUsage]
) -> dict[str, int]:
    """Co-resident capacity of every persistent kernel (``rprogram_*``); CapacityError when a
    kernel's vEUs exceed it."""
    capacities = {}
    for name, use in usage.items():
        if not name.startswith("rprogram_"):
            continue
        capacity = spec.num_sms * blocks_per_sm(spec, threads, use.registers, use.shared_mem)
        capacities[name] = capacity
        if num_veu > capacity:
            raise CapacityError(
                f"{name} uses {use.registers} registers per thread and {use.shared_mem} bytes of "
                f"shared memory: only {capacity} blocks of {threads} threads fit on "
                f"{spec.name} at once, fewer than its {num_veu} vEUs. Lower num_veu or "
                "cuda_threads."
            )
    return capacities


def check_spills(usage: dict[str, KernelUsage], threads: int, blocks_per_sm: int) -> None:
    """SpillError when a persistent kernel (``rprogram_*``) spills registers: the plan's
    occupancy (``__launch_bounds__(threads, blocks_per_sm)``) costs more than it gains."""
    spilling = {
        name: use
        for name, use in usage.items()
        if name.startswith("rprogram_") and use.spill_stores
    }
    if spilling:
        name, use = max(spilling.items(), key=lambda item: item[1].spill_stores)
        raise SpillError(
            f"{name} spills {use.spill_stores} bytes of registers to local memory at "
            f"{use.registers} registers per thread (__launch_bounds__({threads}, "
            f"{blocks_per_sm})); {len(spilling)} persistent kernel(s) spill (body functions "
            "included). Give them more registers (cuda_registers, fewer vEUs per SM: num_veu, "
            "spills='replan'), fewer distinct kernels per rProgram (max_kernels_per_program, "
            "spills='split'), or accept the spills with verify_occupancy=False"
        )
