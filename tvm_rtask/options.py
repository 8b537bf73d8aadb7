"""Options of the rTask pipeline: keyword arguments, PassContext ``rtask.*`` keys, defaults.

An explicit keyword wins over the PassContext config key of the same name (``rtask.policy``,
``rtask.num_veu``, ``rtask.barrier``, ...), which wins over the default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .errors import OptionError

POLICIES = ("wavefront", "wavefront_global", "ios", "opara", "sequential")
BARRIERS = ("fine", "global")
FUSIONS = ("fuseops", "stitch", "none")


@dataclass
class RTaskOptions:
    """Everything a user can set; see README for what each changes."""

    policy: str = "wavefront"
    barrier: str = "fine"
    num_veu: int | None = None  # None: the device's capacity (CPU: worker threads)
    rtasks_per_veu: int = 2  # CPU: an operator is cut into up to num_veu * this rTasks
    fusion: str = "fuseops"
    spin_timeout_ms: int = 60_000
    cuda_threads: int = 256  # CUDA: threads of a vEU (dlight schedules at most this many)
    cuda_registers: int = 0  # CUDA: registers per thread assumed for occupancy (0: unknown)
    device: str | None = None  # CUDA: device spec (v100, a100, h100, h200); default from arch
    check_status: bool = True  # CUDA: main checks the barrier status words after the programs
    verify_occupancy: bool = True  # CUDA: ptxas -v registers must let all vEUs be co-resident
    cooperative_launch: bool = False  # CUDA: the driver refuses a grid that is not co-resident
    max_ops_per_program: int | None = None  # rProgram cap (None: 64 llvm, 512 cuda)
    max_kernels_per_program: int | None = None  # distinct kernels (None: 32 cuda, 0 llvm)
    ios_merge: bool = True  # ios: merge convolutions sharing an input where the DP chooses it
    db: str | None = None  # MetaSchedule work directory whose tuned kernels replace the defaults

    def validate(self) -> RTaskOptions:
        from .schedule import policy_names

        if self.policy not in policy_names():
            raise OptionError(
                f"unknown policy {self.policy!r}; choose one of {', '.join(policy_names())}"
            )
        if self.barrier not in BARRIERS:
            raise OptionError(f"barrier must be one of {BARRIERS}, not {self.barrier!r}")
        if self.fusion not in FUSIONS:
            raise OptionError(f"fusion must be one of {FUSIONS}, not {self.fusion!r}")
        if self.num_veu is not None and (not isinstance(self.num_veu, int) or self.num_veu < 1):
            raise OptionError(f"num_veu must be a positive integer, not {self.num_veu!r}")
        if not isinstance(self.rtasks_per_veu, int) or self.rtasks_per_veu < 1:
            raise OptionError(f"rtasks_per_veu must be >= 1, not {self.rtasks_per_veu!r}")
        if not isinstance(self.cuda_threads, int) or not 32 <= self.cuda_threads <= 1024:
            raise OptionError(f"cuda_threads must be in 32..1024, not {self.cuda_threads!r}")
        if not isinstance(self.cuda_registers, int) or not 0 <= self.cuda_registers <= 255:
            raise OptionError(f"cuda_registers must be in 0..255, not {self.cuda_registers!r}")
        for key in ("max_kernels_per_program", "max_ops_per_program"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise OptionError(f"{key} must be >= 0 (0: no limit), not {value!r}")
        if not isinstance(self.cooperative_launch, bool):
            raise OptionError(
                f"cooperative_launch must be True or False, not {self.cooperative_launch!r}"
            )
        if not isinstance(self.ios_merge, bool):
            raise OptionError(f"ios_merge must be True or False, not {self.ios_merge!r}")
        if self.db is not None and not isinstance(self.db, str):
            raise OptionError(f"db must be a directory path (str), not {self.db!r}")
        if not isinstance(self.spin_timeout_ms, int) or self.spin_timeout_ms < 1:
            raise OptionError(f"spin_timeout_ms must be >= 1, not {self.spin_timeout_ms!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_options(explicit: dict, pass_config=None) -> RTaskOptions:
    """Merge explicit keywords, ``rtask.*`` PassContext keys and defaults; reject unknowns."""
    known = {f.name for f in fields(RTaskOptions)}
    unknown = sorted(set(explicit) - known)
    if unknown:
        raise OptionError(f"unknown option(s) {unknown}; known options: {sorted(known)}")
    values = {}
    config = pass_config if pass_config is not None else {}
    for name in known:
        key = f"rtask.{name}"
        if key in config:
            value = config[key]
            values[name] = value if isinstance(value, (bool, type(None))) else _plain(value)
    values.update({k: v for k, v in explicit.items() if v is not None})
    return RTaskOptions(**values).validate()


def _plain(value):
    """FFI strings and integers from a PassContext turned into Python values."""
    if isinstance(value, str):
        return str(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)
