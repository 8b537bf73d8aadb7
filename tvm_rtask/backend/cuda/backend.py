"""The CUDA backend: options, vDevice, rKernel maker, dispatcher, status check and build."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import tvm
from tvm import relax
from tvm.target import Target

from ...core import RKernel, VDevice, get_spec
from ...core.counters import check_counter_scripts, counter_scripts
from ...errors import CapacityError, OptionError, SpillError, UnsupportedOperator
from ...options import option
from ..arena import arena_of, arena_tensor, plan_arenas
from ..base import Backend, LoweredProgram, ProgramIO, RKernelMaker, TargetOptions, load_tuned
from .body_function import (
    BODY_FUNCTIONS_ATTR,
    DYNAMIC_SHARED_ATTR,
    SHARED_MEMORY_SHORT,
    install_postproc,
)
from .compile_cache import install_compile_callback
from .dispatch import (
    TRACE_WORDS,
    CUDAProgramCode,
    build_cuda_dispatcher,
    counter_table,
    dynamic_shared_bytes,
    operator_index,
    program_table,
    sync_words,
)
from .rkernel import CUDARKernel, make_cuda_rkernel, schedule_for_cuda, schedule_serial_reduction
from .rules import rules_enabled

RKERNEL_SUFFIX = "_rkernel"
ARCH_SPECS = {"sm_70": "v100", "sm_80": "a100", "sm_90": "h100"}
# what a block's static __shared__ arrays may hold (more needs the dynamic opt-in)
STATIC_SHARED_BYTES = 48 * 1024
# The defaults below bound compile and planning time; the measurements that chose them are
# in docs/compile-time.md, "The CUDA backend's limits".
# Distinct rKernels per rProgram: nvcc's time grows faster than linearly with the kernel,
# and each distinct body is emitted once per rProgram.
MAX_KERNELS_PER_PROGRAM = 32
# Operators per rProgram: every intermediate is a parameter of the persistent PrimFunc.
MAX_OPS_PER_PROGRAM = 512
# Registers per thread when nvcc is not there to tell (``__launch_bounds__(threads, blocks
# per SM)`` makes ptxas keep to the budget; with nvcc it is the most any rKernel uses alone
# plus DISPATCH_REGISTERS). Option cuda_registers overrides it.
DEFAULT_REGISTERS = 64
# One rTask is one thread block of the source kernel, as long as an operator has at most
# RTASKS_PER_VEU of them per vEU; beyond that consecutive blocks are grouped into one rTask
# (the planner places every rTask). The vEU count is not known before the rKernels are (it
# follows from their registers): ASSUMED_VEUS_PER_SM stands in for it unless num_veu is
# given.
RTASKS_PER_VEU = 4
ASSUMED_VEUS_PER_SM = 4
DISPATCH_REGISTERS = 8
# what a persistent kernel that spills registers does (option spills)
SPILL_POLICIES = ("split", "replan", "warn", "error")
# with dependency counters, how a block learns its vEU (option cuda_veu_placement): "smid"
# claimed by the SM it runs on (vEU v on SM v % SMs, as the planner assumes), "block"
# blockIdx.x
VEU_PLACEMENTS = ("smid", "block")


@dataclass(frozen=True)
class CUDAOptions(TargetOptions):
    """The CUDA-only options with their defaults filled in (Triton's ``CUDAOptions``): its
    own (declared with their help, rows of docs/options.md) and the target-independent ones
    it defaults."""

    CORE_DEFAULTS: ClassVar[dict[str, Any]] = {
        "barrier": "counter",
        "rtasks_per_veu": RTASKS_PER_VEU,
        "max_ops_per_program": MAX_OPS_PER_PROGRAM,
        "max_kernels_per_program": MAX_KERNELS_PER_PROGRAM,
    }

    rtasks_per_veu: int  # an operator with more thread blocks is coarsened to this many
    threads: int = option(
        256,
        name="cuda_threads",
        bounds=(32, 1024),
        help="threads of a vEU; dlight schedules every operator with at most this many",
    )
    registers: int = option(
        0,
        name="cuda_registers",
        bounds=(0, 255),
        shown=f"`0`: the most an rKernel uses alone (ptxas) + {DISPATCH_REGISTERS}; "
        f"{DEFAULT_REGISTERS} without nvcc",
        help="registers per thread the persistent kernels are compiled for: vEUs per SM "
        "follow from it, and `__launch_bounds__(threads, vEUs per SM)` makes ptxas keep to it",
    )
    device: str | None = option(
        None,
        values="`v100`, `a100`, `h100`, `h200`",
        shown="from the target's arch (`sm_70` v100, `sm_80` a100, else h100)",
        help="the device table entry",
    )
    check_status: bool = option(
        False,
        help="`main` ends with a check of the barrier status words (one blocking "
        "device-to-host copy per call). Off, a timed-out wait prints its vEUs and aborts the "
        "kernel (`__trap`), so the next synchronisation raises and the CUDA context must be "
        "recreated",
    )
    verify_occupancy: bool = option(
        True,
        help="compile once with `ptxas -v` and refuse vEUs that cannot all be resident",
    )
    cooperative_launch: bool = option(
        False,
        help="launch persistent kernels cooperatively, so the driver too refuses a grid that "
        "cannot be co-resident (same results on an H200; its latency is untimed)",
    )
    rules: bool = option(
        default_factory=rules_enabled,
        name="cuda_rules",
        shown="`False` (`TVM_RTASK_CUDA_RULES=0|1` sets a process's)",
        help="tvm-rtask's convolution rules (`backend/cuda/rules/`) before dlight; off until "
        'a GPU has timed them ([cuda-kernels.md](cuda-kernels.md), "Convolution rules"). '
        "`TVM_RTASK_CUDA_RULES=0|1` sets the default of a process",
    )
    spills: str = option(
        "warn",
        choices=SPILL_POLICIES,
        help="with `verify_occupancy`: a persistent kernel that spills registers is reported "
        "(`warn`); planned again (at most 3 times) with half the distinct rKernels per "
        "rProgram (`split`) or the registers one vEU fewer per SM allows (`replan`); or a "
        "`SpillError` (`error`)",
    )
    body_functions: bool = option(
        True,
        name="cuda_body_functions",
        help="each distinct rKernel body that uses shared memory is a `__device__ "
        "__noinline__` function with its own registers, shared by every rProgram that runs "
        'it; False inlines every body ([cuda-kernels.md](cuda-kernels.md), "Body '
        "functions\"). Both match TVM's build on an H200",
    )
    veu_placement: str = option(
        "block",
        name="cuda_veu_placement",
        choices=VEU_PLACEMENTS,
        help="with dependency counters: `smid` has every block claim its vEU from the SM it "
        "runs on at kernel start, so vEU `v` runs on SM `v % SMs` as the planner assumes "
        "(`backend/cuda/veu_claim.py`); `block` takes `blockIdx.x`",
    )

    @classmethod
    def parse(cls, options, target: Target) -> CUDAOptions:
        return cls.from_options(options, device=arch_device(target))


def arch_device(target: Target) -> str:
    """The device table entry of ``target``'s arch (``sm_70`` v100, ``sm_80`` a100, else
    h100): the default of the ``device`` option and of the tuning target's limits."""
    return ARCH_SPECS.get(str(target.arch), "h100")


def _spilling_kernel_count(plan) -> int:
    """Distinct rKernels of the largest spilling rProgram (by spill bytes); 0 if none
    spills. Persistent kernel ``rprogram_<k>_kernel`` runs ``plan.steps[k]``."""
    spilled = [(u["spill_stores"], name) for name, u in plan.kernel_usage.items()
               if u.get("spill_stores")]  # fmt: skip
    if not spilled:
        return 0
    name = max(spilled)[1]
    step = plan.steps[int(name.removeprefix("rprogram_").removesuffix("_kernel"))]
    return len({plan.graph.op(op).func for op in step.ops()})


def schedule_target(target: Target, threads: int) -> Target:
    """The target dlight schedules with: at most ``threads`` threads per block."""
    return Target(dict(target.export(), max_num_threads=threads))


def _apply_tuned(mod: tvm.IRModule, tuned) -> tvm.IRModule:
    """Each PrimFunc with a record replaced by its best schedule, marked scheduled so dlight
    leaves it alone (its code checked in ``tests/backend/cuda/test_tuned_records.py``; its
    results on a GPU by ``tests/cuda/test_gpu.py``, not yet run)."""
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc):
            best = tuned.best(func)
            if best is not None:
                mod[gvar] = best.with_attr("tirx.is_scheduled", True)
    return mod


def _schedule_all(mod: tvm.IRModule, target: Target, rules: bool) -> tvm.IRModule:
    """The CUDA rules' or dlight's schedule for every PrimFunc (ordinary calls need them
    too)."""
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc):
            mod[gvar] = schedule_for_cuda(func, target, rules=rules, name=gvar.name_hint)
    return mod


def _fits(kernel: CUDARKernel, threads: int) -> str:
    """Why ``kernel`` cannot run in a vEU of ``threads`` threads ("" when it can)."""
    if kernel.global_alloc:
        return "allocates global memory inside its kernel"
    if kernel.threads > threads:
        return (
            f"scheduled with {kernel.threads} threads per block, more than the vEU's "
            f"{threads} (option cuda_threads)"
        )
    if kernel.cross_thread_reduction and not kernel.one_dimensional:
        return "reduces across a 2-D or 3-D thread block, which a 1-D vEU cannot host"
    return ""


def _append_status_check(func: relax.Function, sync_constants: list) -> relax.Function:
    """``main`` followed by ``tvm_rtask.check_status(sync words...)`` (impure, after the
    dataflow block): a barrier timeout in any CUDA rProgram becomes a Python exception."""
    return _append_host_call(func, "tvm_rtask.check_status", sync_constants, "status")


def _trace_constants(code) -> list:
    """A traced program's trace table and its record buffer (zeros; the kernel overwrites
    its slots on every call)."""
    info = code.trace_info()
    records = np.zeros(int(info[code.num_veu]) * TRACE_WORDS, "int64")
    return [relax.const(info), relax.const(tvm.runtime.tensor(records))]


def _append_host_call(func: relax.Function, name: str, args: list, what: str) -> relax.Function:
    """``main`` followed by a call of the global function ``name`` on ``args`` (impure,
    after the dataflow block, its result unused)."""
    body = func.body
    check = relax.Call(relax.ExternFunc(name), args, ty_args=[relax.ObjectType()])
    binding = relax.VarBinding(relax.Var(f"rtask_{what}", relax.ObjectType()), check)
    blocks = [*body.blocks, relax.BindingBlock([binding])]
    new_body = relax.SeqExpr(blocks, body.body)
    return relax.Function(func.params, new_body, func.ret_ty, False, func.attrs)


class CUDARKernelMaker(RKernelMaker):
    """The rKernel is added as ``<name>_rkernel`` beside the scheduled operator, which
    stays callable as an ordinary kernel: one rTask per thread block of the source kernel,
    up to ``rtasks_per_veu`` per vEU.

    A kernel that reduces across a number of threads other than the vEU's cannot share
    the vEU's block (the allreduce spans a 2-D block); it is rescheduled with one output
    element per thread and serial reductions, and stays ordinary only if that fails too.
    """

    # a multi-output kernel inside the CUDA dispatcher fails TVM's build (docs/
    # fusion.md, "Kernel counts"): such kernels stay ordinary calls on CUDA
    multi_output = False

    def __init__(
        self,
        backend: CUDABackend,
        mod: tvm.IRModule,
        unscheduled: dict,
        cuda: CUDAOptions,
        num_veu: int | None,
        threads_given: bool = False,
    ) -> None:
        self.backend = backend
        self.threads_given = threads_given  # vEUs of exactly cuda_threads threads
        self.mod = mod
        self.unscheduled = unscheduled
        self.cuda = cuda
        self.spec = get_spec(cuda.device)
        self.num_veu = num_veu  # None: every co-resident vEU (VDevice.cuda)
        self.max_rtasks = (num_veu or self.spec.num_sms * ASSUMED_VEUS_PER_SM) * (
            cuda.rtasks_per_veu
        )
        self.shared: list[int] = []
        self.sources: dict[str, tvm.tirx.PrimFunc] = {}  # the scheduled kernel of each rKernel
        self.threads: list[int] = []
        self.cache: dict[str, list[RKernel]] = {}

    def __call__(self, name: str) -> list[RKernel]:
        if name not in self.cache:
            self.cache[name] = [self._make(name)]
        return self.cache[name]

    def _make(self, name: str) -> RKernel:
        threads = self.cuda.threads
        source, schedule = self.mod[name], ""
        kernel = make_cuda_rkernel(source, self.max_rtasks, name)
        reason = _fits(kernel, threads)
        if reason and name in self.unscheduled:
            serial = schedule_serial_reduction(self.unscheduled[name], threads)
            if serial is not None:
                source, schedule = serial, "serial-reduction"
                kernel = make_cuda_rkernel(serial, self.max_rtasks, name)
                reason = _fits(kernel, threads)
        if reason:
            raise UnsupportedOperator(f"{name} {reason}")
        self.mod[f"{name}{RKERNEL_SUFFIX}"] = kernel.func
        self.shared.append(kernel.shared_mem)
        self.sources[name] = source
        self.threads.append(kernel.threads)
        return RKernel(
            name=f"{name}@{kernel.num_rtasks}",
            num_rtasks=kernel.num_rtasks,
            threads=kernel.threads,
            shared_mem=kernel.shared_mem,
            schedule=schedule,
        )

    def vdevice(self) -> VDevice:
        # a vEU has the block size of its largest rKernel (exactly cuda_threads if set)
        cuda = self.cuda
        block = cuda.threads if self.threads_given else max(self.threads, default=cuda.threads)
        return VDevice.cuda(
            self.spec,
            threads=block,
            registers=cuda.registers or self.backend._register_budget(self.sources, self.cache),
            shared_mem=max(self.shared, default=0),
            num_veu=self.num_veu,
        )


class CUDABackend(Backend):
    """cuda: vEUs are co-resident thread blocks synchronised through global memory."""

    name = "cuda"
    label = "CUDA"
    target_kinds = ("cuda",)
    needs_host = True
    Options = CUDAOptions

    def device(self):
        dev = tvm.cuda(0)
        if not dev.exist:
            raise OptionError(
                "running or profiling a CUDA target needs a CUDA GPU; none is present"
            )
        return dev

    def host_fingerprint(self) -> str:
        """The GPU's name: a measured time belongs to the device that ran it."""
        return self.device_name()

    def device_name(self) -> str:
        return str(self.device().device_name)

    def tuning_target(self, num_cores: int | None = None) -> Target:
        """The target with the per-block limits MetaSchedule's CUDA rules require (AutoBind
        refuses a target without ``max_threads_per_block``), from the arch's device table
        entry where the target does not give them; shared memory at the 48 KB a block's
        static ``__shared__`` arrays may hold, as TVM's ``nvidia/nvidia-h100`` tag says."""
        del num_cores  # the builder uses every core; the GPU measures
        spec = get_spec(arch_device(self.target))
        limits = {
            "max_threads_per_block": spec.max_threads_per_block,
            "max_shared_memory_per_block": min(spec.shared_mem_per_block, STATIC_SHARED_BYTES),
            "registers_per_block": spec.registers_per_sm,
            "thread_warp_size": spec.warp_size,
        }
        return Target({**limits, **self.target.export()})

    def parse_options(self, options) -> CUDAOptions:
        if options.barrier == "global":
            raise OptionError(
                "barrier='global' is not implemented on CUDA (it is llvm's parallel barrier); "
                "use barrier='counter' (dependency counters, the default) or 'fine' (step "
                "arrays), or policy='wavefront_global' for a barrier between waves"
            )
        cuda = CUDAOptions.parse(options, self.target)
        get_spec(cuda.device)  # an unknown name raises
        return cuda

    def barrier(self, options) -> str:
        return options.barrier or "counter"

    def record_set(self, options) -> str | None:
        """``h100`` on sm_90, or ``h200`` when the device option says so."""
        if not str(self.target.attrs.get("arch", "") or "").startswith("sm_90"):
            return None
        return "h200" if self.options_for(options).device.lower() == "h200" else "h100"

    def device_spec(self, options):
        return get_spec(self.options_for(options).device)

    def program_limits(self, options) -> dict[str, int]:
        cap, kernels = options.max_ops_per_program, options.max_kernels_per_program
        return {
            "max_ops_per_program": MAX_OPS_PER_PROGRAM if cap is None else cap,
            "max_kernels_per_program": MAX_KERNELS_PER_PROGRAM if kernels is None else kernels,
        }

    def make_rkernels(self, mod, options):
        """Every PrimFunc scheduled (tuning records, the CUDA rules, dlight), and the
        :class:`CUDARKernelMaker` that adds each operator's rKernel beside it."""
        cuda = self.options_for(options)
        unscheduled = {
            gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)
        }
        tuned = load_tuned(options.db, "cuda")
        if tuned is not None:
            mod = _apply_tuned(mod, tuned)
        mod = _schedule_all(mod, schedule_target(self.target, cuda.threads), cuda.rules)
        given = "cuda_threads" in options.target_options
        return mod, CUDARKernelMaker(self, mod, unscheduled, cuda, options.num_veu, given)

    def standalone_rkernel(self, mod, maker, func_name, kernel, vdevice):
        """The scheduled kernel the rKernel was made from, as TVM builds it alone (grid =
        its thread blocks; an rTask is ``blocks / num_rtasks`` of them when coarsened), and
        the blocks that run at once: SMs x blocks per SM at the registers ptxas gives that
        kernel (the rKernel's own count, else DEFAULT_REGISTERS, without nvcc)."""
        from ...core import blocks_per_sm
        from .occupancy import source_kernel_registers
        from .rkernel import _extents

        source = maker.sources[func_name].with_attr("global_symbol", "main")
        grid, _ = _extents(source)
        blocks = 1
        for extent in grid.values():
            blocks *= extent
        measured = source_kernel_registers({func_name: source}, self.target) or {}
        registers = measured.get(func_name) or kernel.registers or DEFAULT_REGISTERS
        spec = vdevice.spec
        dev = tvm.cuda(0)
        sms = int(dev.multi_processor_count) if dev.exist else spec.num_sms
        per_sm = blocks_per_sm(spec, kernel.threads, registers, kernel.shared_mem)
        return source, blocks, max(sms * per_sm, 1)

    def _register_budget(self, sources: dict, rkernels: dict) -> int:
        """Registers per thread for the persistent kernels (see DISPATCH_REGISTERS); each
        rKernel's own count is recorded on it (``RKernel.registers``)."""
        from .occupancy import source_kernel_registers

        measured = source_kernel_registers(sources, self.target)
        if not measured:
            return DEFAULT_REGISTERS
        for name, registers in measured.items():
            for kernel in rkernels.get(name, []):
                kernel.registers = registers
        return min(max(measured.values()) + DISPATCH_REGISTERS, 255)

    def lower_program(self, program, plan, options, mod, io: ProgramIO):
        """The persistent kernel: workspaces are extra outputs (no device malloc inside a
        kernel); the task table, barrier pairs and sync words are constant inputs."""
        cuda = self.options_for(options)
        # operators with the same scheduled PrimFunc share one rKernel body
        body_of = {op: plan.graph.op(op).func for op in program.ops()}
        op_index = operator_index(program.ops(), body_of)
        calls = {}
        for op_name in program.ops():
            op = plan.graph.op(op_name)
            meta = op.kernel(program.kernel_of(op_name))
            kernel = CUDARKernel(
                mod[f"{op.func}{RKERNEL_SUFFIX}"],
                meta.num_rtasks,
                meta.threads,
                meta.shared_mem,
                False,
            )
            calls[op_name] = (kernel, [*op.inputs, *op.outputs])
        sync = self.sync(options)
        if sync == "counters":
            scripts = counter_scripts(program, plan.graph)
            check_counter_scripts(program, plan.graph, scripts)
            table, pairs = counter_table(program, plan.graph, op_index, scripts)
            claim = plan.vdevice.spec.num_sms if cuda.veu_placement == "smid" else 0
            words = sync_words(program.num_veu, len(op_index), claim)
        else:
            table, pairs = program_table(program, op_index)
            words = sync_words(program.num_veu)
            claim = 0
        arenas = plan_arenas(list(io.workspaces))
        packed = arena_of(arenas)
        loose = [t for t in io.workspaces if t.name not in packed]
        weights = [t for t in io.inputs if t.name in io.constant_values]
        weight_arenas = plan_arenas(weights, prefix="rtask_weights")
        folded = arena_of(weight_arenas)
        passed = [t for t in io.inputs if t.name not in folded]
        code = CUDAProgramCode(
            inputs=passed,
            outputs=[*io.outputs, *loose],
            arenas=arenas,
            weight_arenas=weight_arenas,
            calls=calls,
            num_veu=program.num_veu,
            threads=plan.vdevice.threads,
            table=table,
            pairs=pairs,
            op_index=op_index,
            sync=sync,
            body_of=body_of,
            body_functions=cuda.body_functions,
            claim_sms=claim,
        )
        if options.trace:
            code.trace_program = next(k for k, s in enumerate(plan.steps) if s is program)
            code.graph_index = {op: plan.graph.index(op) for op in program.ops()}
        func = build_cuda_dispatcher(
            code,
            timeout_ns=options.spin_timeout_ms * 1_000_000,
            trap_on_timeout=not cuda.check_status,
        )
        if code.bodies:
            # from here on, any CUDA build in this process (tvm_rtask.build, or tvm.compile
            # of the lowered module) turns the body kernels into device functions
            install_postproc()
            func = func.with_attrs(
                {
                    DYNAMIC_SHARED_ATTR: dynamic_shared_bytes(code),
                    BODY_FUNCTIONS_ATTR: [f"{n}_kernel" for n in code.bodies],
                }
            )
        constants = [
            # tensors: relax.const keeps their dtype (it narrows an int64 numpy array)
            *(relax.const(arena_tensor(a, io.constant_values)) for a in weight_arenas),
            relax.const(code.offset_table[0]),
            relax.const(table),
            relax.const(pairs),
            *(_trace_constants(code) if options.trace else ()),
            relax.const(words),
        ]
        results = [*(t.name for t in (*io.outputs, *loose)), *(a.decl for a in arenas)]
        return LoweredProgram(func, constants, results, [t.name for t in passed], code.bodies)

    def finish_main(self, main, rprogram_calls, options):
        if options.trace and rprogram_calls:
            # each traced call's records leave the device after the call (runtime/trace.py)
            buffers = [call.args[1].fields[-2] for call in rprogram_calls]
            main = _append_host_call(main, "tvm_rtask.collect_cuda_trace", buffers, "trace")
        if not self.options_for(options).check_status or not rprogram_calls:
            return main
        return _append_status_check(main, [call.args[1].fields[-1] for call in rprogram_calls])

    def build(self, lowered, plan, options):
        from . import status  # noqa: F401 - registers tvm_rtask.check_status

        cuda = self.options_for(options)
        from .cooperative import persistent_pipeline

        tir_pipeline = persistent_pipeline(plan.vdevice.blocks_per_sm, cuda.cooperative_launch)
        # where TVM compiles at build time (a CUDA runtime is present), the persistent
        # kernels' cubin comes from the cache the occupancy check reads: one nvcc run
        install_compile_callback()
        install_postproc()
        try:
            ex = tvm.compile(
                lowered,
                target=self.target,
                relax_pipeline=self._finish_pipeline(),
                tir_pipeline=tir_pipeline,
            )
        except RuntimeError as err:  # the FFI turns the pass's CapacityError into this
            found = re.search(f"[^\n]*{re.escape(SHARED_MEMORY_SHORT)}[^\n]*", str(err))
            if found is None:
                raise
            raise CapacityError(found.group(0).removeprefix("RuntimeError: ")) from None
        if cuda.verify_occupancy and plan.programs():
            self._verify_occupancy(ex, plan, cuda, options, lowered)
        return ex

    def _finish_pipeline(self) -> tvm.transform.Pass:
        """The backend's dataflow lowering and finalization, without its legalize/fuse/
        schedule passes: every kernel is already scheduled, and FoldConstant must not
        evaluate a persistent kernel whose inputs happen to be constants."""
        from tvm.relax.backend.cuda import pipeline as cuda_pipeline

        target = self.target

        @tvm.transform.module_pass(opt_level=0, name="RTaskFinish")
        def finish(mod, _ctx):
            with target:
                passes = cuda_pipeline.dataflow_lower_passes(target)
                passes += cuda_pipeline.finalize_passes(target)
                return tvm.transform.Sequential(passes)(mod)

        return finish

    def replan_options(self, plan, options, given=frozenset()) -> dict | None:
        """After a spill, what to plan again with.

        ``spills="split"``: at most half the distinct rKernels of the largest spilling
        rProgram per rProgram (``max_kernels_per_program``), so that fewer bodies share one
        register allocation (unless the user gave that option, or the spilling rProgram has
        one distinct rKernel already). ``spills="replan"``: the most registers per thread that
        one vEU fewer per SM allows (unless the user gave the registers or the vEU count, or
        one vEU per SM already spills)."""
        spills = self.options_for(options).spills
        if spills == "split":
            if "max_kernels_per_program" in given:
                return None
            kernels = _spilling_kernel_count(plan)
            return None if kernels <= 1 else {"max_kernels_per_program": kernels // 2}
        if spills != "replan":
            return None
        if given & {"cuda_registers", "num_veu"}:
            return None
        registers = self._spill_registers(plan)
        return None if registers is None else {"cuda_registers": registers}

    @staticmethod
    def _spill_registers(plan) -> int | None:
        """Registers per thread for one vEU fewer per SM than ``plan``'s, if it spilled."""
        from ...core import blocks_per_sm

        spilled = [u for u in plan.kernel_usage.values() if u.get("spill_stores")]
        if not spilled:
            return None
        vd = plan.vdevice
        now = vd.blocks_per_sm
        if now <= 1:
            return None
        shared = max((u.get("shared_mem", 0) for u in plan.kernel_usage.values()), default=0)
        best = None
        for registers in range(8, vd.spec.max_registers_per_thread + 1, 8):
            fits = blocks_per_sm(vd.spec, vd.threads, registers, shared)
            if fits < now:
                if fits < now - 1:
                    break
                best = registers
        return best

    def _verify_occupancy(self, ex, plan, cuda: CUDAOptions, options, lowered) -> None:
        """ptxas's register and shared-memory counts must let every vEU be resident at once
        (a kernel's own, plus its body functions' spills and its dynamic shared memory)."""
        from .compile_cache import compile_source
        from .occupancy import (
            check_co_residency,
            check_spills,
            find_nvcc,
            parse_ptxas_report,
            with_callees,
        )
        from .source import cuda_source

        if find_nvcc() is None:
            logging.getLogger(__name__).warning(
                "nvcc not found: co-residency of the persistent kernels was not verified "
                "(ptxas register counts unknown); vEUs were sized from the analytical model"
            )
            return
        report = compile_source(cuda_source(ex), str(self.target.arch)).report
        callees, dynamic = {}, {}
        for gv, func in lowered.functions_items():
            attrs = getattr(func, "attrs", None)
            if attrs is not None and BODY_FUNCTIONS_ATTR in attrs:  # a dispatcher
                kernel = f"{gv.name_hint}_kernel"
                dynamic[kernel] = int(attrs[DYNAMIC_SHARED_ATTR])
                callees[kernel] = [str(n) for n in attrs[BODY_FUNCTIONS_ATTR]]
        usage = with_callees(parse_ptxas_report(report), report, callees, dynamic)
        capacities = check_co_residency(
            plan.vdevice.spec, plan.vdevice.threads, plan.vdevice.num_veu, usage
        )
        plan.kernel_usage = {
            name: {"registers": usage[name].registers, "shared_mem": usage[name].shared_mem,
                   "spill_stores": usage[name].spill_stores, "capacity": capacity}
            for name, capacity in capacities.items()
        }  # fmt: skip
        try:
            check_spills(usage, plan.vdevice.threads, plan.vdevice.blocks_per_sm)
        except SpillError as err:
            # "replan": api.compile plans again with fewer vEUs per SM (replan_options);
            # not the default, as fewer vEUs per SM did not remove the spills measured
            # (docs/cuda-kernels.md, "Body functions")
            if cuda.spills == "error":
                raise
            if (
                cuda.spills == "warn"
                or (cuda.spills == "replan" and self._spill_registers(plan) is None)
                or (cuda.spills == "split" and _spilling_kernel_count(plan) <= 1)
            ):
                logging.getLogger(__name__).warning("%s", err)
