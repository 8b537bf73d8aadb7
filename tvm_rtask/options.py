"""Options of the rTask pipeline: keyword arguments, PassContext ``rtask.*`` keys, defaults.

An explicit keyword wins over the PassContext config key of the same name (``rtask.policy``,
``rtask.num_veu``, ``rtask.barrier``, ...), which wins over the default. Options are resolved
once into a frozen :class:`RTaskOptions`; the chosen target's backend then checks the ones
that only it reads (``tvm_rtask.backend``) and refuses those that do not apply to it.

Target-specific options default to ``None`` ("the backend's default"), so that a backend can
tell an option the user set from one nobody touched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .errors import OptionError

BARRIERS = ("fine", "global", "counter")
FUSIONS = ("fuseops", "stitch", "none")
CPU_LAYOUTS = ("nchw", "nchwc")
# "measured": every rKernel timed alone on the device present and the synchronisation
# benchmark (runtime.profiler, cached on disk), resolved by PlanRPrograms, which has the module
COST_MODELS = ("analytical", "measured")
# CUDA: what a persistent kernel that spills registers does (None: "warn")
SPILL_POLICIES = ("split", "replan", "warn", "error")
# CUDA with dependency counters: how a block learns its vEU ("smid": claimed by the SM it runs
# on, so vEU v is on SM v % SMs as the planner assumes; "block", the default: blockIdx.x)
VEU_PLACEMENTS = ("smid", "block")
# Options that travel outside PassContext config keys (a dict and an object).
_NOT_CONFIG = ("policy_options", "cost")


@dataclass(frozen=True)
class RTaskOptions:
    """Everything a user can set; see docs/options.md for what each changes."""

    policy: str = "wavefront"
    barrier: str | None = None  # None: the backend's default (llvm: fine, CUDA: counter)
    num_veu: int | None = None  # None: the device's capacity (CPU: worker threads)
    rtasks_per_veu: int | None = None  # rTasks per vEU an operator is cut into (CPU: 2)
    fusion: str = "fuseops"
    spin_timeout_ms: int = 60_000
    cuda_threads: int | None = None  # CUDA: threads of a vEU (default: the kernels' own)
    cuda_registers: int | None = None  # CUDA: registers per thread assumed for occupancy
    device: str | None = None  # CUDA: device spec (v100, a100, h100, h200); default from arch
    check_status: bool | None = None  # CUDA: a blocking status check after every call
    verify_occupancy: bool | None = None  # CUDA: ptxas -v registers must fit all vEUs at once
    # CUDA: a spilling persistent kernel is reported ("warn", the default), re-planned with
    # fewer vEUs per SM ("replan") or an error ("error", SpillError)
    spills: str | None = None
    cooperative_launch: bool | None = None  # CUDA: the driver refuses a non-co-resident grid
    cpu_rules: bool | None = None  # llvm: tvm-rtask's schedule rules (convolution); default on
    # llvm: processes that build the kernels at once (None: the usable cores, at most 8)
    cpu_build_jobs: int | None = None
    # llvm: "nchwc" runs convolutions in channel blocks of the vector width, the layout
    # carried between them (backend/cpu/blocked_channels.py); "nchw" keeps the model's
    cpu_layout: str | None = None
    cuda_rules: bool | None = None  # CUDA: tvm-rtask's schedule rules (convolution); default on
    # CUDA: each distinct rKernel body a __device__ __noinline__ function with registers of
    # its own (None: on); False inlines every body into its persistent kernel
    cuda_body_functions: bool | None = None
    # CUDA, counters: "smid" claims vEU ids by SM at kernel start (vEU v on SM v % SMs for
    # sure), "block" (None: the default) takes blockIdx.x (the hardware's placement)
    cuda_veu_placement: str | None = None
    max_ops_per_program: int | None = None  # rProgram cap (None: the backend's default)
    max_kernels_per_program: int | None = None  # distinct kernels (None: backend default)
    ios_merge: bool = True  # ios: merge convolutions sharing an input where the DP chooses it
    # an rProgram the cost model predicts slower than its operators as ordinary kernels is
    # replaced by them (None: on with cost="measured", off with the analytical model)
    ordinary_fallback: bool | None = None
    # MetaSchedule work directory whose tuned kernels replace the defaults; None: the shipped
    # record set matching the target (records/sets.py); False or "none": no records
    db: str | bool | None = None
    # debug: every tensor a kernel writes (intermediates, outputs, arenas) and every
    # workspace filled with NaN before each call, so that a read of memory no kernel wrote
    # shows as NaN instead of passing by luck (relax_passes/nan_fill.py)
    nan_fill: bool = False
    # each vEU records when each rTask and each wait started and ended, and each rProgram
    # call its span, into the timeline read after the call (runtime/trace.py; llvm)
    trace: bool = False
    policy_options: dict = field(default_factory=dict)  # the policy's own (ios: r, s, ...)
    # "analytical", "measured" (timed on the device present, cached) or a schedule.CostModel
    cost: Any = "analytical"

    def validate(self) -> RTaskOptions:
        from .policies import policy_names
        from .policies.cost import CostModel

        if self.policy not in policy_names():
            raise OptionError(
                f"unknown policy {self.policy!r}; choose one of {', '.join(policy_names())}"
            )
        if self.barrier is not None and self.barrier not in BARRIERS:
            raise OptionError(f"barrier must be one of {BARRIERS}, not {self.barrier!r}")
        if self.spills is not None and self.spills not in SPILL_POLICIES:
            raise OptionError(f"spills must be one of {SPILL_POLICIES}, not {self.spills!r}")
        if self.cuda_veu_placement is not None and self.cuda_veu_placement not in VEU_PLACEMENTS:
            raise OptionError(
                f"cuda_veu_placement must be one of {VEU_PLACEMENTS}, "
                f"not {self.cuda_veu_placement!r}"
            )
        if self.cpu_layout is not None and self.cpu_layout not in CPU_LAYOUTS:
            raise OptionError(f"cpu_layout must be one of {CPU_LAYOUTS}, not {self.cpu_layout!r}")
        if self.fusion not in FUSIONS:
            raise OptionError(f"fusion must be one of {FUSIONS}, not {self.fusion!r}")
        for key in ("num_veu", "rtasks_per_veu", "cpu_build_jobs"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value < 1):
                raise OptionError(f"{key} must be a positive integer, not {value!r}")
        if self.cuda_threads is not None and (
            not _is_int(self.cuda_threads) or not 32 <= self.cuda_threads <= 1024
        ):
            raise OptionError(f"cuda_threads must be in 32..1024, not {self.cuda_threads!r}")
        if self.cuda_registers is not None and (
            not _is_int(self.cuda_registers) or not 0 <= self.cuda_registers <= 255
        ):
            raise OptionError(f"cuda_registers must be in 0..255, not {self.cuda_registers!r}")
        for key in ("max_kernels_per_program", "max_ops_per_program"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value < 0):
                raise OptionError(f"{key} must be >= 0 (0: no limit), not {value!r}")
        for key in (
            "check_status",
            "verify_occupancy",
            "cooperative_launch",
            "ios_merge",
            "ordinary_fallback",
            "cpu_rules",
            "cuda_rules",
            "cuda_body_functions",
            "nan_fill",
            "trace",
        ):
            value = getattr(self, key)
            if value is not None and not isinstance(value, bool):
                raise OptionError(f"{key} must be True or False, not {value!r}")
        if self.db is not None and self.db is not False and not isinstance(self.db, str):
            raise OptionError(
                f"db must be a directory path (str), False or 'none' (no records), or unset "
                f"(the shipped record set of the target), not {self.db!r}"
            )
        if not _is_int(self.spin_timeout_ms) or self.spin_timeout_ms < 1:
            raise OptionError(f"spin_timeout_ms must be >= 1, not {self.spin_timeout_ms!r}")
        if not isinstance(self.cost, CostModel) and self.cost not in COST_MODELS:
            raise OptionError(
                f"cost must be one of {COST_MODELS} or a tvm_rtask.policies.CostModel "
                f"(e.g. runtime.measured_cost_model(...)), not {self.cost!r}"
            )
        _check_policy_options(self.policy, self.policy_options)
        return self

    def falls_back_to_ordinary(self) -> bool:
        """Whether ``ordinary_fallback`` applies: by default only with a measured cost model,
        whose predictions can be trusted to rank an rProgram against ordinary kernels."""
        if self.ordinary_fallback is not None:
            return self.ordinary_fallback
        from .policies.cost import CalibratedCostModel

        return self.cost == "measured" or isinstance(self.cost, CalibratedCostModel)

    def cost_model(self):
        """The cost model object the planner uses (``"measured"`` needs the module's
        rKernels: ``PlanRPrograms`` resolves it with ``runtime.profiler``)."""
        from .policies.cost import AnalyticalCostModel

        if self.cost == "measured":
            raise OptionError(
                "cost='measured' is measured from the module's rKernels: PlanRPrograms "
                "resolves it (runtime.profiler.measured_model_for)"
            )
        return AnalyticalCostModel() if self.cost == "analytical" else self.cost

    def to_dict(self) -> dict:
        """Plain data (the cost model by name), as stored in a Plan's JSON."""
        d = asdict(replace(self, cost="analytical"))
        d["cost"] = self.cost if isinstance(self.cost, str) else type(self.cost).__name__
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RTaskOptions:
        """The options a Plan was made with (a measured cost model comes back as its name,
        which only names what planned it: planning is over by then)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_policy_options(policy: str, options: dict) -> None:
    from .policies.registry import get_policy

    if not isinstance(options, dict):
        raise OptionError(f"policy_options must be a dict, not {options!r}")
    get_policy(policy, **options)  # raises OptionError naming an option the policy lacks


def config_types() -> dict[str, str]:
    """``rtask.<name>`` -> TVM config type ("int", "str", "bool"), from the fields above."""
    types = {}
    for f in fields(RTaskOptions):
        if f.name in _NOT_CONFIG:
            continue
        annotation = str(f.type)
        kind = "bool" if "bool" in annotation else "int" if "int" in annotation else "str"
        if annotation.startswith("str"):  # db: a path, or "none" for no records
            kind = "str"
        types[f"rtask.{f.name}"] = kind
    return types


def resolve_options(explicit: dict, pass_config=None) -> RTaskOptions:
    """Merge explicit keywords, ``rtask.*`` PassContext keys and defaults; reject unknowns.

    A keyword that is not an RTaskOptions field but an option of the chosen policy (ios's
    ``r``, ``s``, ...) goes to ``policy_options``.
    """
    known = {f.name for f in fields(RTaskOptions)}
    values: dict[str, Any] = {}
    config = pass_config if pass_config is not None else {}
    for name in known - set(_NOT_CONFIG):
        key = f"rtask.{name}"
        if key in config:
            value = config[key]
            values[name] = value if isinstance(value, (bool, type(None))) else _plain(value)
    values.update({k: v for k, v in explicit.items() if v is not None and k in known})
    extra = {k: v for k, v in explicit.items() if k not in known and v is not None}
    if extra:
        policy = values.get("policy", RTaskOptions.policy)
        accepted = _policy_option_names(policy)
        unknown = sorted(set(extra) - accepted)
        if unknown:
            raise OptionError(
                f"unknown option(s) {unknown}; known options: {sorted(known - {'cost'})} "
                f"and the options of policy {policy!r}: {sorted(accepted) or 'none'}"
            )
        values["policy_options"] = {**values.get("policy_options", {}), **extra}
    return RTaskOptions(**values).validate()


def _policy_option_names(policy: str) -> set[str]:
    from .policies.limits import LIMIT_OPTIONS
    from .policies.registry import get_policy

    try:
        return set(get_policy(policy).OPTIONS) - set(LIMIT_OPTIONS)
    except OptionError:
        return set()


def _plain(value):
    """FFI strings and integers from a PassContext turned into Python values."""
    if isinstance(value, str):
        return str(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)
