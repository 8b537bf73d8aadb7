"""The vDevice: an accelerator seen as a set of virtual execution units (Rammer section 3.2).

CUDA: one vEU is one persistent thread block, so the number of vEUs that can run at once is
SMs x co-resident blocks per SM (the occupancy of the most demanding rTask). A persistent
kernel with more blocks than that would deadlock on its own barriers, hence CapacityError.
CPU: one vEU is one worker thread.

Device numbers are NVIDIA's public data sheets (SXM parts). Launch and barrier overheads are
estimates (a kernel launch ~3 us, a step-array barrier ~0.5-1 us); a measured cost model
should replace them where the device is present.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import CapacityError, OptionError

_KB = 1024
# Registers are allocated per warp in units of 256 and separately in each of the 4 warp
# scheduler sub-partitions of an SM (sm_70 .. sm_90); shared memory in units of 128 bytes.
_REG_ALLOC_UNIT = 256
_REG_SUBPARTITIONS = 4
_SMEM_ALLOC_UNIT = 128


@dataclass(frozen=True)
class DeviceSpec:
    """Per-device numbers the occupancy calculation and the analytical cost model need.

    For a CPU, ``num_sms`` is the number of cores and the CUDA-only fields are 1 or 0.
    ``reserved_shared_mem_per_block`` is the shared memory the driver keeps per block
    (1 KB on sm_80 and newer).
    """

    name: str
    kind: str
    arch: str
    num_sms: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_thread: int
    shared_mem_per_sm: int
    shared_mem_per_block: int
    max_threads_per_block: int
    warp_size: int
    peak_gflops: float
    bandwidth_gbs: float
    launch_overhead_us: float
    barrier_overhead_us: float
    reserved_shared_mem_per_block: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "cpu"):
            raise OptionError(f"device {self.name!r}: kind must be 'cuda' or 'cpu'")
        if self.num_sms < 1:
            raise OptionError(f"device {self.name!r}: num_sms must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceSpec:
        return cls(**d)


def _cuda(name: str, arch: str, sms: int, smem_sm_kb: int, smem_block_kb: int, **kw) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        kind="cuda",
        arch=arch,
        num_sms=sms,
        max_threads_per_sm=2048,
        max_blocks_per_sm=32,
        registers_per_sm=65536,
        max_registers_per_thread=255,
        shared_mem_per_sm=smem_sm_kb * _KB,
        shared_mem_per_block=smem_block_kb * _KB,
        max_threads_per_block=1024,
        warp_size=32,
        **kw,
    )


DEVICE_SPECS: dict[str, DeviceSpec] = {
    # Tesla V100 SXM2: 15.7 TFLOP/s fp32, HBM2 900 GB/s, 96 KB shared memory per SM.
    "v100": _cuda(
        "v100", "sm_70", 80, 96, 96,
        peak_gflops=15700.0, bandwidth_gbs=900.0,
        launch_overhead_us=3.0, barrier_overhead_us=1.0,
    ),
    # A100 SXM4 80GB (the 40GB part has 1555 GB/s): 19.5 TFLOP/s, 164 KB smem per SM.
    "a100": _cuda(
        "a100", "sm_80", 108, 164, 163,
        peak_gflops=19500.0, bandwidth_gbs=2039.0,
        launch_overhead_us=3.0, barrier_overhead_us=0.7,
        reserved_shared_mem_per_block=_KB,
    ),
    # H100 SXM5: 67 TFLOP/s fp32 (non tensor core), HBM3 3.35 TB/s, 228 KB smem per SM.
    "h100": _cuda(
        "h100", "sm_90", 132, 228, 227,
        peak_gflops=67000.0, bandwidth_gbs=3350.0,
        launch_overhead_us=3.0, barrier_overhead_us=0.5,
        reserved_shared_mem_per_block=_KB,
    ),
    # H200 SXM: the H100 SM array with HBM3e at 4.8 TB/s.
    "h200": _cuda(
        "h200", "sm_90", 132, 228, 227,
        peak_gflops=67000.0, bandwidth_gbs=4800.0,
        launch_overhead_us=3.0, barrier_overhead_us=0.5,
        reserved_shared_mem_per_block=_KB,
    ),
}  # fmt: skip


def cpu_spec(cores: int | None = None) -> DeviceSpec:
    """A generic multicore CPU: ~50 GFLOP/s per core, ~20 GB/s in all (estimates)."""
    if cores is None:
        cores = os.cpu_count() or 1
    if cores < 1:
        raise OptionError(f"a CPU needs at least one core, got cores={cores}")
    return DeviceSpec(
        name="cpu",
        kind="cpu",
        arch="",
        num_sms=cores,
        max_threads_per_sm=1,
        max_blocks_per_sm=1,
        registers_per_sm=0,
        max_registers_per_thread=0,
        shared_mem_per_sm=0,
        shared_mem_per_block=0,
        max_threads_per_block=1,
        warp_size=1,
        peak_gflops=50.0 * cores,
        bandwidth_gbs=20.0,
        launch_overhead_us=5.0,
        barrier_overhead_us=1.0,
    )


def get_spec(name: str) -> DeviceSpec:
    """Look a device up by name, case-insensitively.

    Besides the table keys, a marketing name that contains exactly one of them is accepted
    (``"NVIDIA H100 80GB HBM3"`` -> h100), so a runtime can pass the driver's device name.
    The table holds SXM numbers; a PCIe part has fewer SMs and should get its own spec.
    """
    key = name.strip().lower()
    if key in ("cpu", "llvm"):
        return cpu_spec()
    if key in DEVICE_SPECS:
        return DEVICE_SPECS[key]
    found = {t for t in re.findall(r"[a-z]\d{3}", key) if t in DEVICE_SPECS}
    if len(found) == 1:
        return DEVICE_SPECS[found.pop()]
    known = sorted(DEVICE_SPECS) + ["cpu", "llvm"]
    raise OptionError(f"unknown device {name!r}; known devices: {', '.join(known)}")


def blocks_per_sm(
    spec: DeviceSpec, threads: int, registers_per_thread: int = 0, shared_mem: int = 0
) -> int:
    """How many blocks of this shape one SM keeps resident (the CUDA occupancy calculator).

    ``registers_per_thread=0`` means unknown and does not limit. A block that cannot run at
    all raises CapacityError naming the resource, because a persistent kernel must fit.
    """
    if spec.kind != "cuda":
        return 1
    if threads < 1:
        raise OptionError(f"a block needs at least one thread, got {threads}")
    if threads > spec.max_threads_per_block:
        raise CapacityError(
            f"a block of {threads} threads exceeds the {spec.max_threads_per_block} threads "
            f"per block of {spec.name}"
        )
    if registers_per_thread > spec.max_registers_per_thread:
        raise CapacityError(
            f"{registers_per_thread} registers per thread exceed the "
            f"{spec.max_registers_per_thread} allowed on {spec.name}"
        )
    if shared_mem > spec.shared_mem_per_block:
        raise CapacityError(
            f"{shared_mem} bytes of shared memory per block exceed the "
            f"{spec.shared_mem_per_block} bytes a block may use on {spec.name}"
        )
    warps = math.ceil(threads / spec.warp_size)
    limits = {
        "threads": spec.max_threads_per_sm // (warps * spec.warp_size),
        "blocks": spec.max_blocks_per_sm,
    }
    if registers_per_thread > 0:
        per_warp = _round_up(registers_per_thread * spec.warp_size, _REG_ALLOC_UNIT)
        per_side = (spec.registers_per_sm // _REG_SUBPARTITIONS) // per_warp
        limits["registers"] = (per_side * _REG_SUBPARTITIONS) // warps
    smem = _round_up(shared_mem + spec.reserved_shared_mem_per_block, _SMEM_ALLOC_UNIT)
    if smem > 0:
        limits["shared memory"] = spec.shared_mem_per_sm // smem
    resource, n = min(limits.items(), key=lambda kv: kv[1])
    if n < 1:
        raise CapacityError(
            f"a block of {threads} threads, {registers_per_thread} registers per thread and "
            f"{shared_mem} bytes of shared memory does not fit on one SM of {spec.name}: "
            f"not enough {resource}"
        )
    return n


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@dataclass
class VDevice:
    """``num_veu`` vEUs on ``spec``, of which at most ``capacity`` can be resident at once."""

    spec: DeviceSpec
    num_veu: int
    capacity: int
    threads: int = 1  # threads of one vEU (CUDA: the persistent block size)
    blocks_per_sm: int = 1  # CUDA: co-resident vEUs per SM the kernels are compiled for

    def __post_init__(self) -> None:
        if self.num_veu < 1:
            raise OptionError(f"num_veu must be >= 1, got {self.num_veu}")
        if self.num_veu > self.capacity:
            raise CapacityError(
                f"{self.num_veu} vEUs requested but {self.spec.name} keeps only "
                f"{self.capacity} co-resident; lower num_veu"
            )

    @classmethod
    def cpu(cls, workers: int, spec: DeviceSpec | None = None) -> VDevice:
        """``workers`` worker threads; by default on a CPU with exactly that many cores."""
        if workers < 1:
            raise OptionError(f"a CPU vDevice needs at least one worker, got {workers}")
        return cls(spec or cpu_spec(workers), workers, workers)

    @classmethod
    def cuda(
        cls,
        spec: DeviceSpec | str,
        threads: int,
        registers: int = 0,
        shared_mem: int = 0,
        num_veu: int | None = None,
    ) -> VDevice:
        """vEUs shaped by the most demanding rTask (threads, registers, shared memory)."""
        if isinstance(spec, str):
            spec = get_spec(spec)
        if spec.kind != "cuda":
            raise OptionError(f"VDevice.cuda needs a CUDA device spec, got {spec.name!r}")
        capacity = spec.num_sms * blocks_per_sm(spec, threads, registers, shared_mem)
        if num_veu is None:
            num_veu = capacity
        if num_veu > capacity:
            raise CapacityError(
                f"{num_veu} vEUs requested but {spec.name} keeps only {capacity} blocks of "
                f"{threads} threads, {registers} registers/thread, {shared_mem} B shared "
                f"memory co-resident ({spec.num_sms} SMs x "
                f"{capacity // spec.num_sms} per SM); lower num_veu or the block's resources"
            )
        per_sm = capacity // spec.num_sms
        return cls(spec, num_veu, capacity, threads, per_sm)

    def sm_of(self, veu: int) -> int:
        """The SM (CPU: the core) vEU ``veu`` runs on: ``veu % SMs``. vEUs ``0..SMs-1`` are
        one per SM and the next ``SMs`` a second block on each, so the lowest vEUs, which
        policies fill first, spread over SMs. CUDA: the layout ``cuda_veu_placement="smid"``
        establishes at kernel start, and the hardware's with ``"block"`` if it places
        blocks round robin (``bench/gpu_sm_map.py`` measures it)."""
        if not 0 <= veu < self.num_veu:
            raise OptionError(f"vEU {veu} does not exist ({self.num_veu} vEUs)")
        return veu % self.spec.num_sms

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "num_veu": self.num_veu,
            "capacity": self.capacity,
            "threads": self.threads,
            "blocks_per_sm": self.blocks_per_sm,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VDevice:
        return cls(
            DeviceSpec.from_dict(d["spec"]),
            d["num_veu"],
            d["capacity"],
            d.get("threads", 1),
            d.get("blocks_per_sm", 1),
        )
