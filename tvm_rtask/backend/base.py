"""The backend interface: everything tvm-rtask knows about one target kind lives behind it.

As in TVM's ``relax/backend/<target>/pipeline.py`` and Triton's ``backends/<name>``, every
target exports the same small interface and ``registry.get_backend`` picks one by target
kind; the
passes (``PlanRPrograms``, ``LowerRPrograms``), ``api.build``, the profiler and the tuner ask
the backend instead of testing the kind. ``docs/adding-a-backend.md`` walks through a new one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import tvm
from tvm.target import Target

from ..core import DeviceSpec, Plan, RKernel, RProgram, VDevice
from ..errors import OptionError
from ..options import RTaskOptions, check_option_value, declared_options, registered_backends
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


@dataclass
class LoweredProgram:
    """What :meth:`Backend.lower_program` makes of one rProgram, for ``LowerRPrograms``."""

    # the persistent PrimFunc
    func: tvm.tirx.PrimFunc
    # the constants it takes after the program's inputs (Relax constants)
    constants: list = field(default_factory=list)
    # what it returns: the program's outputs by name first (``io.outputs`` order), then any
    # further tensor Relax must allocate for it, by name (a workspace) or as a TensorDecl of
    # a buffer of its own (an arena)
    results: list = field(default_factory=list)
    # the inputs the call passes, in order (before the constants); None: every input. A
    # backend that folded constant inputs into constants of its own leaves them out
    call_inputs: list[str] | None = None
    # functions the PrimFunc calls by name; each joins the module once per name (CUDA:
    # rKernel bodies as device functions, shared by rPrograms)
    callees: dict[str, tvm.tirx.PrimFunc] = field(default_factory=dict)


class RKernelMaker(ABC):
    """What :meth:`Backend.make_rkernels` hands the planner: ``maker(func_name)`` adds the
    operator's rKernels to the module (``extract_graph`` calls it) and returns them, or
    raises ``UnsupportedOperator``; ``maker.vdevice()`` is the vDevice once every rKernel
    is made (CUDA sizes vEUs from the largest)."""

    # whether an operator with several outputs may become an rKernel
    multi_output: ClassVar[bool] = True

    @abstractmethod
    def __call__(self, func_name: str) -> list[RKernel]: ...

    @abstractmethod
    def vdevice(self) -> VDevice: ...


@dataclass(frozen=True)
class TargetOptions:
    """A backend's own options with its defaults filled in (Triton's ``CUDAOptions``):
    parsed once from the resolved :class:`RTaskOptions` by :meth:`Backend.parse_options`.

    A subclass declares the backend's user options as fields made by
    ``tvm_rtask.options.option`` (default, one-line help, the keyword when it is not the
    field's name): each is then a keyword of ``tvm_rtask.compile``, a PassContext key
    ``rtask.<keyword>``, a row of docs/options.md, and refused on other targets, with no list
    to keep elsewhere. Its other fields are what the backend derives; one named after a
    target-independent option in :attr:`CORE_DEFAULTS` is that option, or its default."""

    # the defaults this backend gives target-independent options left unset (None), e.g.
    # ``barrier``: fields of the same name are filled from them, docs/options.md shows them
    CORE_DEFAULTS: ClassVar[dict[str, Any]] = {}

    @classmethod
    def declared(cls) -> dict[str, Any]:
        """The user options this class declares, by keyword (``dataclasses.Field``s)."""
        return declared_options(cls)

    @classmethod
    def from_options(cls, options: RTaskOptions, **values) -> TargetOptions:
        """An instance from ``options``: the declared options the user gave
        (``options.target_options``, checked), else ``values`` (what the backend derives, or
        defaults that need the target), else the fields' defaults; a field in
        :attr:`CORE_DEFAULTS` takes the target-independent option or that default."""
        names = {f.name for f in fields(cls)}
        filled = {
            name: default if getattr(options, name) is None else getattr(options, name)
            for name, default in cls.CORE_DEFAULTS.items()
            if name in names
        }
        filled.update(values)
        for name, f in cls.declared().items():
            if name in options.target_options:
                check_option_value(name, f, options.target_options[name])
                filled[f.name] = options.target_options[name]
        return cls(**filled)


class Backend(ABC):
    """One target kind: the abstract methods are what a new target implements; the driver
    knows no target.

    A backend is built per target (``get_backend(target)``). Methods take the resolved
    :class:`RTaskOptions`; the options only this backend reads, declared by its
    :attr:`Options` class, are parsed once per options object into an instance of it
    (:meth:`options_for`).
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""  # how messages name the targets (``"CUDA"``, ``"llvm"``)
    target_kinds: ClassVar[tuple[str, ...]] = ()
    needs_host: ClassVar[bool] = False  # device code: the target gets an llvm host
    rkernels_run_standalone: ClassVar[bool] = False  # an rKernel is a callable PrimFunc
    # the options only this backend reads: a TargetOptions subclass declaring them; set
    # for another target, they are refused there (OptionError), never silently ignored
    Options: ClassVar[type[TargetOptions]] = TargetOptions
    OPTIONS: ClassVar[tuple[str, ...]] = ()  # their keywords (from Options)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "Options" in cls.__dict__:
            cls.OPTIONS = tuple(cls.Options.declared())

    def __init__(self, target: Target) -> None:
        self.target = target
        self._parsed: tuple[RTaskOptions, TargetOptions] | None = None

    @classmethod
    def resolve_target(cls, target: Target) -> Target:
        """The concrete target ``as_target`` hands on (the CPU backend names the host's
        CPU for ``mcpu: "native"``); by default ``target`` itself."""
        return target

    # -- options ---------------------------------------------------------------------------
    def check_options(self, options: RTaskOptions) -> None:
        """Raise OptionError for an option that does not apply to this target: another
        backend's own option that is set, or a value :meth:`parse_options` refuses."""
        own = self.Options.declared()
        for key in options.target_options:
            if key not in own:
                owners = [b.label for b in registered_backends() if key in b.Options.declared()]
                applies = f"applies to {', '.join(owners)} targets only" if owners else "unknown"
                raise OptionError(f"option {key} {applies}, not to {self.target.kind.name}")
        self.options_for(options)

    def parse_options(self, options: RTaskOptions) -> TargetOptions:
        """This backend's options from ``options``, defaults filled in; OptionError for a
        value it cannot take. By default :meth:`TargetOptions.from_options` of
        :attr:`Options`; a backend overrides it to refuse values of target-independent
        options or to give defaults that need the target."""
        return self.Options.from_options(options)

    def options_for(self, options: RTaskOptions) -> TargetOptions:
        """:meth:`parse_options`, once per options object."""
        if self._parsed is None or self._parsed[0] is not options:
            self._parsed = (options, self.parse_options(options))
        return self._parsed[1]

    def barrier(self, options: RTaskOptions) -> str:
        """How the rPrograms' waits are implemented, ``options.barrier`` or the default."""
        return options.barrier or self.Options.CORE_DEFAULTS.get("barrier", "fine")

    def sync(self, options: RTaskOptions) -> str:
        """What the plan's rPrograms synchronise with (``Plan.sync``): dependency counters
        for ``barrier="counter"``, else their step barriers."""
        return "counters" if self.barrier(options) == "counter" else "steps"

    def prepare_passes(self, options: RTaskOptions) -> list:
        """Relax passes of this target that RTaskPrepare runs before legalization (operator
        rewrites its schedule rules rely on); none by default."""
        del options
        return []

    @abstractmethod
    def device_spec(self, options: RTaskOptions) -> DeviceSpec:
        """The device table entry that scores plans and fusion patterns for this target."""

    @abstractmethod
    def program_limits(self, options: RTaskOptions) -> dict[str, int]:
        """rProgram size limits (``policies/limits.py``): the user's or this target's."""

    @abstractmethod
    def device(self):
        """The TVM device this target runs on (OptionError when none is present)."""

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

    def tuning_preparation(self):
        """The target a model is prepared for when its operators are tuned for this one (the
        PrimFuncs whose records compile looks up); this target by default."""
        return self.target

    # -- planning --------------------------------------------------------------------------
    @abstractmethod
    def make_rkernels(
        self, mod: tvm.IRModule, options: RTaskOptions
    ) -> tuple[tvm.IRModule, RKernelMaker]:
        """Prepare ``mod`` (schedule its PrimFuncs) and return it with the
        :class:`RKernelMaker` that adds each operator's rKernels to it."""

    def standalone_rkernel(
        self, mod: tvm.IRModule, maker: RKernelMaker, func_name: str, kernel, vdevice: VDevice
    ) -> tuple[tvm.tirx.PrimFunc, int, int]:
        """What times rKernel ``kernel`` of ``func_name`` alone (``runtime.profiler``):
        ``(PrimFunc, blocks, concurrent)``, a callable PrimFunc that runs all its rTasks as
        one ordinary call, made of ``blocks`` units of work (rTasks, or thread blocks when
        an rTask groups several) of which ``concurrent`` run at once. ``mod`` and
        ``maker`` are what :meth:`make_rkernels` returned."""
        raise OptionError(f"the {self.name} backend cannot time its rKernels alone")

    # -- lowering --------------------------------------------------------------------------
    @abstractmethod
    def lower_program(
        self, program: RProgram, plan: Plan, options: RTaskOptions, mod: tvm.IRModule, io: ProgramIO
    ) -> LoweredProgram:
        """The persistent PrimFunc of one rProgram and how ``main`` calls it."""

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
    @abstractmethod
    def build(self, lowered: tvm.IRModule, plan: Plan, options: RTaskOptions):
        """The Relax executable of a lowered module."""


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


_BUILD_FOLLOWS: ContextVar[bool] = ContextVar("tvm_rtask_build_follows", default=False)


@contextmanager
def build_follows() -> Iterator[None]:
    """Within it, every lowering is built at once (``tvm_rtask.compile``): a backend may
    start building what it can while the plan is made. A lowering alone (``lower``,
    ``plan``) starts nothing that might never be used."""
    token = _BUILD_FOLLOWS.set(True)
    try:
        yield
    finally:
        _BUILD_FOLLOWS.reset(token)


def is_build_following() -> bool:
    """Whether the lowering under way will be built at once (:func:`build_follows`)."""
    return _BUILD_FOLLOWS.get()
