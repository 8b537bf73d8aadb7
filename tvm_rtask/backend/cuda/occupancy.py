"""Registers and shared memory of generated kernels, from ``ptxas -v``, and the vEU check.

The planner assumes a register count (option ``cuda_registers``, 0 = unknown); the real one is
known only after ptxas allocates registers. :func:`ptxas_usage` compiles the generated CUDA
source once and reads what ptxas reports for each kernel; :func:`check_co_residency` then
refuses a persistent kernel whose vEUs could not all be resident at once, which would make
its barriers wait for blocks that never start.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ...core import DeviceSpec, blocks_per_sm
from ...errors import CapacityError

_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_USAGE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SPILLS = re.compile(r"(\d+) bytes spill stores")


@dataclass(frozen=True)
class KernelUsage:
    """What ptxas reports for one ``__global__`` function."""

    registers: int
    shared_mem: int
    spill_stores: int = 0  # bytes


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


def ptxas_usage(source: str, arch: str, nvcc: str | None = None) -> dict[str, KernelUsage]:
    """Compile ``source`` for ``arch`` as TVM does (:func:`tvm_nvcc_command`); usage per
    kernel."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (PATH, CUDA_HOME)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.cu")
        with open(path, "w") as f:
            f.write(source)
        out = subprocess.run(
            tvm_nvcc_command(nvcc, arch, path, path + ".cubin"),
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if out.returncode != 0:
        raise RuntimeError(f"nvcc failed on the generated CUDA source:\n{out.stderr[-3000:]}")
    return parse_ptxas_report(out.stderr)


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


def source_kernel_registers(funcs: dict, target) -> dict[str, int] | None:
    """Registers per thread of each scheduled PrimFunc compiled as TVM compiles it alone
    (``{name: registers}``), or None without nvcc.

    The persistent kernel's register budget, and so its vEUs per SM, is taken from the
    kernels it runs: one nvcc run over all of them, before the rProgram is built.
    """
    import tvm

    if find_nvcc() is None or not funcs:
        return None
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with target:
        lib = tvm.tirx.build(mod, target=target)
    source = next(m.inspect_source() for m in lib.imports if m.kind == "cuda")
    usage = ptxas_usage(source, str(target.arch))
    return {
        name: max(
            (
                u.registers
                for k, u in usage.items()
                if k == f"{name}_kernel" or k.startswith(f"{name}_kernel_")
            ),
            default=0,
        )
        for name in funcs
    }


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
