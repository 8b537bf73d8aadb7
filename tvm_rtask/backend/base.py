"""The backend interface: everything tvm-rtask knows about one target kind lives behind it.

As in TVM's ``relax/backend/<target>/pipeline.py`` and Triton's ``backends/<name>``, every
target exports the same small interface and ``registry.get_backend`` picks one by target
kind; the
passes (``PlanRPrograms``, ``LowerRPrograms``), ``api.build``, the profiler and the tuner ask
the backend instead of testing the kind. ``docs/adding-a-backend.md`` walks through a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import tvm
from tvm.target import Target

from ..core import DeviceSpec, Plan, RProgram, VDevice
from ..errors import OptionError
from ..options import RTaskOptions
from ..tir.common import TensorDecl


@dataclass
class ProgramIO:
    """The tensors of one rProgram, each in first-use order: what it reads, what later
    steps read from it, and what lives and dies inside it."""

    inputs: list[TensorDecl]
    outputs: list[TensorDecl]
    workspaces: list[TensorDecl]
    # the inputs that are constants of the model (weights), by name: a backend may fold
    # them into constants of its own and leave them out of the call (``lower_program``)
    constant_values: dict[str, Any] = field(default_factory=dict)


class Backend:
    """One target kind. Subclasses implement every method; the driver knows no target.

    A backend is built per target (``get_backend(target)``); ``options`` methods take the
    resolved :class:`RTaskOptions` and read only the fields they understand.
    """

    name: ClassVar[str] = ""
    target_kinds: ClassVar[tuple[str, ...]] = ()
    needs_host: ClassVar[bool] = False  # device code: the target gets an llvm host
    rkernels_run_standalone: ClassVar[bool] = False  # an rKernel is a callable PrimFunc

    def __init__(self, target: Target) -> None:
        self.target = target

    # -- options ---------------------------------------------------------------------------
    def check_options(self, options: RTaskOptions) -> None:
        """Raise OptionError for an option that does not apply to this target."""
        raise NotImplementedError

    def barrier(self, options: RTaskOptions) -> str:
        """How the rPrograms' waits are implemented, ``options.barrier`` or the default."""
        return options.barrier or "fine"

    def sync(self, options: RTaskOptions) -> str:
        """What the plan's rPrograms synchronise with (``Plan.sync``): dependency counters
        for ``barrier="counter"``, else their step barriers."""
        return "counters" if self.barrier(options) == "counter" else "steps"

    def device_spec(self, options: RTaskOptions) -> DeviceSpec:
        """The device table entry that scores plans and fusion patterns for this target."""
        raise NotImplementedError

    def program_limits(self, options: RTaskOptions) -> dict[str, int]:
        """rProgram size limits (``schedule/limits.py``): the user's or this target's."""
        raise NotImplementedError

    def device(self):
        """The TVM device this target runs on (OptionError when none is present)."""
        raise NotImplementedError

    def host_fingerprint(self) -> str:
        """What besides the target decides a measured time (a CPU's model and cores), for
        measurement caches; "" when the target says it all."""
        return ""

    def device_name(self) -> str:
        """The name of the device present (a CPU's model, a GPU's name), which profiles
        and the synchronisation benchmark record (and key their caches by)."""
        return self.host_fingerprint() or str(self.target.kind.name)

    def tuning_target(self, num_cores: int | None = None) -> Target:
        """The target MetaSchedule tunes for."""
        return self.target

    # -- planning --------------------------------------------------------------------------
    def make_rkernels(
        self, mod: tvm.IRModule, options: RTaskOptions
    ) -> tuple[tvm.IRModule, Callable, Callable[[], VDevice]]:
        """Prepare ``mod`` (schedule its PrimFuncs) and return ``(mod, rkernels_for,
        vdevice)``: ``rkernels_for(func_name) -> [RKernel]`` adds the rKernels to ``mod``
        (``extract_graph`` calls it), ``vdevice()`` is the vDevice once it has run."""
        raise NotImplementedError

    def standalone_rkernel(
        self, mod: tvm.IRModule, rkernels_for: Callable, func_name: str, kernel, vdevice: VDevice
    ) -> tuple[tvm.tirx.PrimFunc, int, int]:
        """What times rKernel ``kernel`` of ``func_name`` alone (``runtime.profiler``):
        ``(PrimFunc, blocks, concurrent)``, a callable PrimFunc that runs all its rTasks as
        one ordinary call, made of ``blocks`` units of work (rTasks, or thread blocks when
        an rTask groups several) of which ``concurrent`` run at once. ``mod`` and
        ``rkernels_for`` are what :meth:`make_rkernels` returned."""
        raise OptionError(f"the {self.name} backend cannot time its rKernels alone")

    # -- lowering --------------------------------------------------------------------------
    def lower_program(
        self, program: RProgram, plan: Plan, options: RTaskOptions, mod: tvm.IRModule, io: ProgramIO
    ) -> tuple[tvm.tirx.PrimFunc, list, list[str]]:
        """The persistent PrimFunc of one rProgram, the constant inputs it takes after the
        program's inputs, and what it returns: the names of the program's outputs first (in
        ``io.outputs`` order), then any further tensor Relax must allocate for it, by name
        (a workspace) or as a ``TensorDecl`` of a buffer of its own (e.g. an arena).

        A fourth element, when returned, lists the inputs the call passes (in order, before
        the constants): a backend that folded constant inputs (``io.constant_values``) into
        its own constants leaves them out; without it every input is passed. A fifth, the
        functions the PrimFunc calls by name (``{name: PrimFunc}``), joins the module once
        per name (CUDA: rKernel bodies as device functions, shared by rPrograms)."""
        raise NotImplementedError

    def record_set(self, options: RTaskOptions) -> str | None:
        """The shipped tuned-record set (``records/shipped/<name>``) that fits this target,
        or None (``db`` left unset uses it)."""
        return None

    def finish_main(self, main, rprogram_calls: list, options: RTaskOptions):
        """``main`` after lowering, given the ``call_tir`` of every rProgram (a hook for
        host-side checks after the programs)."""
        return main

    def replan_options(
        self, plan: Plan, options: RTaskOptions, given: frozenset[str] = frozenset()
    ) -> dict | None:
        """Options to plan again with after ``build`` found the plan's kernels wanting
        (CUDA: a persistent kernel that spills gets fewer vEUs per SM), or None. ``given``:
        the options the user set (never overridden)."""
        return None

    # -- building --------------------------------------------------------------------------
    def build(self, lowered: tvm.IRModule, plan: Plan, options: RTaskOptions):
        """The Relax executable of a lowered module."""
        raise NotImplementedError


def load_tuned(db: str | bool | None, kind: str):
    """The ``kind`` tuning records of work directory ``db`` (MetaSchedule is imported only
    then); None when ``db`` is None or False (no records)."""
    if db is None or db is False:
        return None
    from ..records import load_tuned as load

    return load(db, kind)


def target_dict(target: Target) -> dict:
    """``target.export()`` as plain JSON-able Python data (a Plan keeps its target so)."""

    def plain(value):
        if isinstance(value, (str, int, float, bool)) or value is None:
            return value if not isinstance(value, str) else str(value)
        if hasattr(value, "items"):
            return {str(k): plain(v) for k, v in value.items()}
        return [plain(v) for v in value]

    return plain(target.export())
