"""The llvm backend: options, vDevice, rKernel maker, dispatcher and build in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import tvm
from tvm import relax
from tvm.target import Target

from ...core import RKernel, VDevice, cpu_spec
from ...core.memory import shared_workspaces
from ...core.script import scripts_from_program, waves_from_program
from ...errors import CapacityError, OptionError
from ...options import option
from ...records import TUNED_ATTR
from ..arena import arena_of, arena_tensor, plan_arenas
from ..base import (
    Backend,
    LoweredProgram,
    ProgramIO,
    RKernelMaker,
    TargetOptions,
    is_build_following,
    load_tuned,
)
from . import host, parallel_build
from .concat_views import concat_views
from .dispatch import CPUProgramCode, KernelCall, build_cpu_dispatcher, cpu_pipeline
from .early_build import early_builds
from .rkernel import make_cpu_rkernels
from .rules import RULE_ATTR
from .threads import cpu_model_name
from .tuned import make_tuned_cpu_rkernel, outer_parallel_extent

# The CPU dispatcher inlines each rKernel once per vEU that runs it; LLVM's time grows faster
# than linearly with the function, so rPrograms are capped on llvm (every policy that takes
# the limits of policies/limits.py: wavefront, wavefront_global, ios, opara).
MAX_OPS_PER_PROGRAM = 64
RTASKS_PER_VEU = 2
DEFAULT_LAYOUT = "auto"
CPU_LAYOUTS = ("auto", "nchw", "nchwc")
# cpu_layout="auto" blocks channels where a vector holds this many float32 lanes (AVX-512):
# with AVX2's 8, NCHW16c ran 0.95-1.7x NCHW's time (docs/cpu-kernels.md, "Channel blocks")
BLOCKED_MIN_LANES = 16
VARIANT_INFIX = "_rk"


def channel_layout(layout: str, lanes: int) -> str:
    """The layout ``cpu_layout`` asks for on vectors of ``lanes`` float32 lanes: ``auto`` is
    ``nchwc`` from :data:`BLOCKED_MIN_LANES` lanes on, else ``nchw``."""
    if layout != "auto":
        return layout
    return "nchwc" if lanes >= BLOCKED_MIN_LANES else "nchw"


def _rules_default() -> bool:
    from .rules import rules_enabled

    return rules_enabled()


@dataclass(frozen=True)
class CPUOptions(TargetOptions):
    """The llvm backend's options, defaults filled in: its own (declared with their help,
    rows of docs/options.md) and the target-independent ones it defaults."""

    CORE_DEFAULTS: ClassVar[dict[str, Any]] = {
        "barrier": "fine",
        "rtasks_per_veu": RTASKS_PER_VEU,
        "max_ops_per_program": MAX_OPS_PER_PROGRAM,
        "max_kernels_per_program": 0,
    }

    barrier: str  # "fine" (step arrays) or "global" (TVM's parallel barrier between waves)
    rtasks_per_veu: int  # an operator is cut into at most num_veu x this many rTasks
    rules: bool = option(
        default_factory=_rules_default,
        name="cpu_rules",
        shown="`True` (`TVM_RTASK_CPU_RULES=0|1` sets a process's)",
        help="tvm-rtask's schedule rules (`backend/cpu/rules/`); False leaves operators "
        "without a tuning record to TVM's unscheduled TIR. `TVM_RTASK_CPU_RULES=0|1` sets "
        "the default of a process",
    )
    layout: str = option(
        DEFAULT_LAYOUT,
        name="cpu_layout",
        choices=CPU_LAYOUTS,
        help="`nchwc`: convolutions and the pools and elementwise operators between them run "
        "in channel blocks of the vector width (`NCHW16c` with AVX-512), carried by TVM's "
        "`ConvertLayout` and changed back at the model's edges. A model keeps NCHW where "
        "fewer than 4 convolutions can be blocked, where TVM cannot convert it (a warning), "
        "or where layout changes would remain inside it; `nchw` keeps the model's layout; "
        "`auto`: `nchwc` where a vector holds 16 float32 lanes (AVX-512), else `nchw` (with "
        "AVX2 the blocks were slower on 7 of 9 models) "
        '([cpu-kernels.md](cpu-kernels.md), "Channel blocks (NCHWc)")',
    )
    winograd: bool = option(
        True,
        name="cpu_winograd",
        help="3x3 stride-1 convolutions in channel blocks with a constant weight run as "
        "Winograd convolutions, F(4x4, 3x3) or on small maps F(2x2, 3x3): 2.25-4x fewer "
        "multiplications, outputs equal to the direct convolution's up to rounding; False "
        "keeps them direct "
        '([cpu-kernels.md](cpu-kernels.md), "Winograd convolutions")',
    )
    build_jobs: int | None = option(
        None,
        name="cpu_build_jobs",
        bounds=(1, None),
        shown="the cores this process may run on that other processes' runnable tasks leave "
        "idle (at most 8)",
        help="processes that build the out-of-line kernel bodies at once, into object files "
        "linked into one library; the code is the same as with `1` (one process), and a "
        "process that fails or hangs leaves its share to this one "
        '([compile-time.md](compile-time.md), "The build in forked processes")',
    )


def worker_capacity() -> int:
    """How many worker threads may run vEUs: TVM_NUM_THREADS if set, else the core count."""
    env = os.environ.get("TVM_NUM_THREADS")
    if env:
        try:
            return max(int(env), 1)
        except ValueError as err:
            raise OptionError(f"TVM_NUM_THREADS={env!r} is not an integer") from err
    return os.cpu_count() or 1


def cpu_vdevice(num_veu: int | None) -> VDevice:
    """The CPU vDevice: one vEU per worker thread, never more than can really run."""
    capacity = worker_capacity()
    num_veu = num_veu or capacity
    if num_veu > capacity:
        raise CapacityError(
            f"num_veu={num_veu} exceeds the {capacity} worker threads that can run at once "
            "(TVM_NUM_THREADS or the core count); spin barriers between vEUs that are not "
            "running concurrently would time out. Lower num_veu or raise TVM_NUM_THREADS."
        )
    return VDevice.cpu(num_veu)


def variant_function(func_name: str, num_rtasks: int) -> str:
    """Name of the PrimFunc of a further rKernel variant of ``func_name`` (the first variant
    replaces ``func_name`` itself, so ordinary calls keep working)."""
    return f"{func_name}{VARIANT_INFIX}{num_rtasks}"


def kernel_function(mod: tvm.IRModule, func_name: str, kernel_name: str) -> str:
    """The PrimFunc that implements rKernel ``kernel_name`` (``<func>@<num_rtasks>``)."""
    alternative = variant_function(func_name, int(kernel_name.rpartition("@")[2]))
    return alternative if alternative in mod else func_name


def _candidates(func, tuned, target=None, name: str | None = None) -> list[tuple]:
    """(PrimFunc, measured us of one call, cores it was measured on), best first: the tuned
    schedules when the database has some, else the default schedule with no measurement
    (measured and analytical times are not comparable, so they are never mixed). The
    default schedule is the CPU schedule rules' (``rules/``) where one matches and
    ``target`` is given, else Relax's unscheduled TIR."""
    schedules = tuned.schedules(func) if tuned is not None else []
    if schedules:
        return [(s.func, s.us, s.cores) for s in schedules]
    if target is not None:
        from .rules import schedule_cpu_func

        scheduled = schedule_cpu_func(func, target, name=name)
        if scheduled is not None:
            return [(scheduled, None, 1)]
    return [(func, None, 1)]


class CPURKernelMaker(RKernelMaker):
    """Variants with distinct rTask counts, the first in place of the operator's PrimFunc
    and the others beside it (``variant_function``).

    Counts are tried from ``num_veu * rtasks_per_veu`` (fastest when alone) down to one
    rTask (no split overhead, best when a wave already fills the vEUs); with tuning
    records each record's parallel loop gives its own counts, and an rTask's time is the
    record's time times the threads it ran on, divided among the rTasks.
    """

    def __init__(
        self, mod: tvm.IRModule, vdevice: VDevice, tuned, rule_target, rtasks_per_veu: int
    ) -> None:
        self.mod = mod
        self._vdevice = vdevice
        self.tuned = tuned
        self.rule_target = rule_target
        # called with each operator's name once its variants are made: start building its
        # body as a plan of one rTask per vEU will call it (early_build.py)
        self.early_build = None
        max_rtasks = vdevice.num_veu * rtasks_per_veu
        self.limits = sorted({max_rtasks, vdevice.num_veu, 1}, reverse=True)
        self.cache: dict[str, list[RKernel]] = {}

    def vdevice(self) -> VDevice:
        return self._vdevice

    def __call__(self, name: str) -> list[RKernel]:
        if name not in self.cache:
            self.cache[name] = self._variants(name)
        return self.cache[name]

    def _variants(self, name: str) -> list[RKernel]:
        from .rules import is_rule_scheduled

        mod = self.mod
        variants: dict[int, RKernel] = {}
        for func, us, cores in _candidates(mod[name], self.tuned, self.rule_target, name):
            if is_rule_scheduled(func):  # cut along its parallel loop, like a record's
                kernels = [make_tuned_cpu_rkernel(func, limit) for limit in self.limits]
            else:
                kernels = make_cpu_rkernels(func, self.limits)
            for kernel in kernels:
                n = kernel.num_rtasks
                if n in variants:
                    continue
                if not variants:
                    mod[name] = kernel.func
                else:
                    mod[variant_function(name, n)] = kernel.func
                est = None
                if us is not None:
                    est = us * min(cores, max(outer_parallel_extent(func), 1)) / n
                variants[n] = RKernel(name=f"{name}@{n}", num_rtasks=n, est_us=est)
        if self.early_build is not None:
            self.early_build(name)
        return list(variants.values())

    def one_per_veu(self, name: str) -> tuple[tvm.tirx.PrimFunc, int] | None:
        """The variant of operator ``name`` with one rTask per vEU and its rTask count, when
        it has one and its body is built out of line (a rule or a record scheduled it)."""
        num_veu = self._vdevice.num_veu
        for kernel in self(name):
            if kernel.num_rtasks != num_veu:
                continue
            func = self.mod[kernel_function(self.mod, name, kernel.name)]
            if func.attrs is not None and (RULE_ATTR in func.attrs or TUNED_ATTR in func.attrs):
                return func, num_veu
        return None


class CPUBackend(Backend):
    """llvm: vEUs are worker threads; fine (step array) or global (parallel barrier) waits."""

    name = "cpu"
    label = "llvm"
    target_kinds = ("llvm", "c")
    rkernels_run_standalone = True
    Options = CPUOptions

    def device(self):
        return tvm.cpu(0)

    @classmethod
    def resolve_target(cls, target: Target) -> Target:
        """``mcpu: "native"`` made the host CPU's name before anything plans
        (``host.resolve_target``; ``registry.as_target`` calls it)."""
        return host.resolve_target(target)

    def host_fingerprint(self) -> str:
        return f"{cpu_model_name()}/{os.cpu_count()}"

    def device_name(self) -> str:
        return cpu_model_name()

    def tuning_target(self, num_cores: int | None = None) -> Target:
        """llvm needs ``num-cores`` for MetaSchedule's parallel rules."""
        config = dict(self.target.export())
        if num_cores is not None or "num-cores" not in config:
            config["num-cores"] = int(num_cores or worker_capacity())
        return Target(config)

    def tuning_preparation(self):
        """The generic llvm preparation, which the llvm records were always keyed on (the
        shipped ``x86_64-avx2`` set), whatever CPU the target names."""
        return "llvm"

    def record_set(self, options) -> str | None:
        """``x86_64-avx2`` for an x86 target whose CPU has AVX2 (plain ``llvm`` is generic
        x86-64, SSE2 only: none)."""
        from .host import target_isa_features

        try:
            features = target_isa_features(self.target)
        except tvm.error.InternalError:  # LLVMTargetInfo's check fails (no x86): no x86 set
            return None
        return "x86_64-avx2" if "avx2" in features else None

    def parse_options(self, options) -> CPUOptions:
        if options.barrier == "counter":
            raise OptionError(
                "barrier='counter' (dependency counters) is implemented on CUDA only; on llvm "
                "use barrier='fine' (step arrays, the default) or 'global'"
            )
        return CPUOptions.from_options(options)

    def barrier(self, options) -> str:
        return self.options_for(options).barrier

    def prepare_passes(self, options) -> list:
        """With the rules on: with ``cpu_layout="nchwc"`` (or ``"auto"`` on AVX-512,
        :func:`channel_layout`), convolutions in channel blocks
        (``blocked_channels.py``); strided 1x1 convolutions as a subsampling copy and a GEMM
        (``subsample_pointwise.py``), constant convolution weights packed into
        output-channel panels (``pack_conv_weights.py``, for ``Conv2dPackedNCHW``) and
        constant matmul weights into column panels (``pack_matmul_weights.py``, which
        ``MatmulKN`` streams)."""
        cpu = self.options_for(options)
        if not cpu.rules:
            return []
        from .blocked_channels import BlockedChannels
        from .pack_conv_weights import PackConvWeights
        from .pack_matmul_weights import PackMatmulWeights
        from .rules.base import vector_lanes, vector_registers
        from .subsample_pointwise import SubsamplePointwiseStride

        lanes, registers = vector_lanes(self.target), vector_registers(self.target)
        # before the strided 1x1 convolutions become a slice and a GEMM: in NCHWc they
        # stay convolutions (a slice would take the layout back to NCHW and again)
        layout = channel_layout(cpu.layout, lanes)
        if layout == "nchwc":
            blocked = [BlockedChannels(lanes, registers, winograd=cpu.winograd)]
        elif cpu.layout == "auto":  # NCHW by auto's choice: said in the plan's report
            why = (
                f"cpu_layout='auto' keeps NCHW where a vector holds {lanes} float32 lanes "
                f"(channel blocks from {BLOCKED_MIN_LANES}, AVX-512); cpu_layout='nchwc' "
                "forces them"
            )
            blocked = [BlockedChannels(lanes, registers, kept_because=why)]
        else:
            blocked = []
        return [
            *blocked,
            SubsamplePointwiseStride(),
            PackConvWeights(lanes, registers),
            PackMatmulWeights(lanes, registers),
        ]

    def device_spec(self, options):
        return cpu_spec(options.num_veu or worker_capacity())

    def program_limits(self, options) -> dict[str, int]:
        cap = options.max_ops_per_program
        kernels = options.max_kernels_per_program
        return {
            "max_ops_per_program": MAX_OPS_PER_PROGRAM if cap is None else cap,
            "max_kernels_per_program": 0 if kernels is None else kernels,
        }

    def make_rkernels(self, mod, options):
        """The rKernel variants of every operator (:class:`CPURKernelMaker`), scheduled by
        a tuning record, else the CPU rules where one matches (option ``cpu_rules``)."""
        cpu = self.options_for(options)
        vdevice = cpu_vdevice(options.num_veu)
        tuned = load_tuned(options.db, "llvm")
        rule_target = self.target if cpu.rules else None
        maker = CPURKernelMaker(mod, vdevice, tuned, rule_target, cpu.rtasks_per_veu)
        if is_build_following() and parallel_build.build_jobs(cpu.build_jobs) >= 2:

            def early(name: str) -> None:
                early_builds().submit(name, maker.one_per_veu, self.target)

            maker.early_build = early
        return mod, maker

    def standalone_rkernel(self, mod, maker, func_name, kernel, vdevice):
        """The rKernel's PrimFunc itself: called alone it runs its rTasks one after the
        other on the calling thread (one at a time)."""
        return mod[kernel_function(mod, func_name, kernel.name)], kernel.num_rtasks, 1

    def lower_program(self, program, plan, options, mod, io: ProgramIO):
        """The llvm persistent PrimFunc: workspaces live inside it, and the weights it reads
        come as one constant per dtype (their views at fixed offsets)."""
        calls = {}
        for op_name in program.ops():
            op = plan.graph.op(op_name)
            func = kernel_function(mod, op.func, program.kernel_of(op_name))
            calls[op_name] = KernelCall(mod[func], [*op.inputs, *op.outputs], name=func)
        # the weights it reads, packed into one constant per dtype: each weight a parameter
        # made the packed entry's argument checks most of a model's LLVM time
        weight_arenas = plan_arenas(
            [t for t in io.inputs if t.name in io.constant_values], prefix="rtask_weights"
        )
        folded = arena_of(weight_arenas)
        passed = [t for t in io.inputs if t.name not in folded]
        code = CPUProgramCode(
            params=[*passed, *(a.decl for a in weight_arenas), *io.outputs],
            weight_arenas=weight_arenas,
            workspaces=list(io.workspaces),
            calls=calls,
            num_veu=program.num_veu,
        )
        if options.trace:
            code.trace_program = next(k for k, s in enumerate(plan.steps) if s is program)
            code.op_ids = {name: plan.graph.index(name) for name in program.ops()}
        tensors = {t.name: t for t in (*io.inputs, *io.outputs, *io.workspaces)}
        ops = [plan.graph.op(name) for name in program.ops()]
        elide = concat_views(ops, tensors, [t.name for t in io.workspaces])
        code.views, code.elided = elide.views, elide.elided
        barrier = self.barrier(options)
        if barrier == "fine":
            code.scripts = scripts_from_program(program)
            code.arenas = shared_workspaces(program, plan.graph, io.workspaces, aliases=code.views)
        else:
            code.waves = waves_from_program(program)
        timeout_us = options.spin_timeout_ms * 1000
        func = build_cpu_dispatcher(
            code,
            barrier=barrier,
            timeout_us=timeout_us,
            subroutines=True,
            nan_fill=options.nan_fill,
        )
        return LoweredProgram(
            func,
            constants=[relax.const(arena_tensor(a, io.constant_values)) for a in weight_arenas],
            results=[t.name for t in io.outputs],
            call_inputs=[t.name for t in passed],
            callees=code.callees,
        )

    def build(self, lowered, plan, options):
        from ... import native
        from . import threads

        # the dispatcher calls the native step-array primitives: their library must be
        # loaded (RTLD_GLOBAL) before LLVM links the module, or the first call crashes
        native.load()

        if threads.num_threads() < plan.vdevice.num_veu:
            threads.set_num_threads(plan.vdevice.num_veu)

        def build_main(mod):
            return tvm.compile(mod, target=self.target, tir_pipeline=cpu_pipeline())

        early = early_builds()
        builder = early.running_pid()
        ignored = () if builder is None else (builder,)
        jobs = parallel_build.build_jobs(self.options_for(options).build_jobs, ignored)
        built = parallel_build.build_with_side_objects(
            build_main, lowered, self.target, jobs, early=early
        )
        return built if built is not None else build_main(lowered)
