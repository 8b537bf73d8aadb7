"""rKernel: one implementation of an rOperator, split into homogeneous rTasks (Rammer section 3.1).

An rOperator may carry several rKernels (tilings); the policy picks one per operator. The
resource fields decide how many vEUs fit on a device (see ``vdevice.blocks_per_sm``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import OptionError


@dataclass
class RKernel:
    """A variant of an operator, e.g. ``RKernel("fused_conv2d@16", num_rtasks=16, threads=256)``.

    ``est_us`` is the time of ONE rTask in microseconds when it was measured or estimated
    elsewhere; ``None`` lets the cost model decide. ``schedule`` says where the kernel's
    schedule comes from when it is not the target's default one for the operator (for
    example ``"serial-reduction"``: rescheduled to fit a vEU); "" for the default.
    """

    name: str
    num_rtasks: int
    threads: int = 1
    shared_mem: int = 0
    registers: int = 0
    est_us: float | None = None
    schedule: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.num_rtasks, int) or self.num_rtasks < 1:
            raise OptionError(
                f"rKernel {self.name!r}: num_rtasks must be an integer >= 1, "
                f"got {self.num_rtasks!r}"
            )
        if self.threads < 1:
            raise OptionError(f"rKernel {self.name!r}: threads must be >= 1, got {self.threads}")
        if self.shared_mem < 0 or self.registers < 0:
            raise OptionError(
                f"rKernel {self.name!r}: shared_mem and registers must be >= 0, "
                f"got {self.shared_mem} and {self.registers}"
            )
        if self.est_us is not None and self.est_us < 0:
            raise OptionError(f"rKernel {self.name!r}: est_us must be >= 0, got {self.est_us}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RKernel:
        return cls(**d)
