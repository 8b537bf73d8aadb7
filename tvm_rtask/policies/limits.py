"""How large one rProgram may grow before a policy starts the next one.

A persistent kernel holds the code of every distinct kernel in its rProgram, and compilers
pay for that faster than linearly: nvcc took 400 s on DenseNet-121 in few rPrograms, LLVM
over 15 minutes on a 250-operator CPU dispatcher, and TVM crashed on 2,048-operator
rPrograms (docs/compile-time.md). Every policy that packs many operators into one
rProgram accepts the two options in :data:`LIMIT_OPTIONS` and cuts its rPrograms with a
:class:`ProgramLimit`; 0 means no limit.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.graph import RGraph
from ..errors import OptionError

# max_ops_per_program: the most operators in one rProgram.
# max_kernels_per_program: the most distinct kernels (operator functions) in one rProgram.
LIMIT_OPTIONS: dict[str, int] = {"max_ops_per_program": 0, "max_kernels_per_program": 0}


def check_limit_options(policy: str, options: dict) -> None:
    """Refuse a negative or non-integer limit, naming the policy and the option."""
    for key in LIMIT_OPTIONS:
        value = options.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OptionError(
                f"policy {policy!r}: option {key} must be an integer >= 0 (0: no limit), "
                f"not {value!r}"
            )


class ProgramLimit:
    """Counts the operators and distinct kernels of the rProgram being built."""

    def __init__(self, graph: RGraph, options: dict) -> None:
        self.graph = graph
        self.max_ops = options.get("max_ops_per_program", 0)
        self.max_kernels = options.get("max_kernels_per_program", 0)
        self.reset()

    def reset(self) -> None:
        """A new, empty rProgram."""
        self.ops = 0
        self.funcs: set[str] = set()

    def _funcs(self, names: Iterable[str]) -> set[str]:
        return {self.graph.op(n).func or n for n in names}

    def would_exceed(self, names: list[str]) -> bool:
        """Whether adding ``names`` passes a limit. An empty rProgram takes anything: one
        wave or operator larger than the limit still needs a program."""
        if not self.ops:
            return False
        if self.max_ops and self.ops + len(names) > self.max_ops:
            return True
        return bool(self.max_kernels and len(self.funcs | self._funcs(names)) > self.max_kernels)

    def add(self, names: list[str]) -> None:
        self.ops += len(names)
        self.funcs |= self._funcs(names)
