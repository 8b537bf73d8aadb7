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


@dataclass(frozen=True)
class KernelUsage:
    """What ptxas reports for one ``__global__`` function."""

    registers: int
    shared_mem: int


def find_nvcc() -> str | None:
    """nvcc from PATH or CUDA_HOME, or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = os.path.join(home, "bin", "nvcc") if home else ""
    return candidate if candidate and os.path.exists(candidate) else None


def ptxas_usage(source: str, arch: str, nvcc: str | None = None) -> dict[str, KernelUsage]:
    """Compile ``source`` for ``arch`` with ``nvcc -cubin -Xptxas -v``; usage per kernel."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (PATH, CUDA_HOME)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.cu")
        with open(path, "w") as f:
            f.write(source)
        out = subprocess.run(
            [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", path + ".cubin", path],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if out.returncode != 0:
        raise RuntimeError(f"nvcc failed on the generated CUDA source:\n{out.stderr[-3000:]}")
    usage: dict[str, KernelUsage] = {}
    current = None
    for line in out.stderr.splitlines():
        match = _FUNCTION.search(line)
        if match:
            current = match.group(1)
            continue
        match = _USAGE.search(line)
        if match and current is not None:
            usage[current] = KernelUsage(int(match.group(1)), int(match.group(2) or 0))
            current = None
    return usage


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
