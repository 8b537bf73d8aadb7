"""``PlanRPrograms``: make rKernels, build the rOperator graph and plan rPrograms.

The pass replaces each operator's PrimFunc by its rKernel (still a valid stand-alone PrimFunc)
and stores the plan as JSON in the module attribute ``rtask.plan`` for ``LowerRPrograms``.
"""

from __future__ import annotations

import os

import tvm
from tvm.target import Target

from ..core import RGraph, RKernel, VDevice, get_spec
from ..errors import CapacityError, OptionError, UnsupportedOperator, remember_errors
from ..options import RTaskOptions, resolve_options
from ..schedule import AnalyticalCostModel, make_plan
from ..schedule.limits import LIMIT_OPTIONS
from ..schedule.policy import get_policy
from ..tir.cpu_rkernel import make_cpu_rkernel
from ..tir.cpu_tuned import outer_parallel_extent
from ..tir.cuda_rkernel import make_cuda_rkernel, schedule_for_cuda, schedule_serial_reduction
from .extract import extract_graph

PLAN_ATTR = "rtask.plan"
RKERNEL_SUFFIX = "_rkernel"
VARIANT_INFIX = "_rk"
# The CPU dispatcher inlines each rKernel once per vEU that runs it; LLVM's time grows faster
# than linearly with the function, so rPrograms are capped on llvm (every policy that takes
# the limits of schedule/limits.py: wavefront, wavefront_global, ios, opara).
CPU_MAX_OPS_PER_PROGRAM = 64
# On CUDA every distinct rKernel body is emitted once per rProgram, and nvcc's time grows
# faster than linearly with the persistent kernel: ResNet-50 (173 operators) took 39 s of
# nvcc in one rProgram and 17 s in three, for 5 us more estimated latency (2020.8 us ->
# 2025.8 us on an H100: two more launches). Counting distinct kernels rather than operators
# keeps models of many identical small operators (LSTM-TC: 19,960 operators, 10 kernels) in
# one launch.
CUDA_MAX_KERNELS_PER_PROGRAM = 32
# Every intermediate of an rProgram is a parameter of its persistent PrimFunc (Relax
# allocates workspaces). DeepSpeech2 (5,309 operators, 19 kernels): one rProgram never
# finished building in 30 minutes, rPrograms of 2,048 operators crashed TVM (segmentation
# fault), rPrograms of 512 built in 49 s of CPU for 25 us more estimated latency (0.25%).
CUDA_MAX_OPS_PER_PROGRAM = 512


ARCH_SPECS = {"sm_70": "v100", "sm_80": "a100", "sm_90": "h100"}


def as_target(target) -> Target:
    """A Target from a string, a dict or a Target: llvm, or cuda (bare "cuda" means sm_90).

    A bare ``Target("cuda")`` defaults to sm_50, which CUDA 13 cannot build (TVM_NOTES.md).
    """
    if isinstance(target, Target):
        result = target
    elif isinstance(target, dict):
        result = Target(target)
    elif isinstance(target, str):
        if target in ("llvm", "c"):
            result = Target({"kind": target})
        elif target == "cuda":
            result = Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
        else:
            result = Target(target)
    else:
        raise OptionError(f"target must be a string, dict or tvm.target.Target, not {target!r}")
    if result.kind.name not in ("llvm", "cuda"):
        raise OptionError(f"target kind {result.kind.name!r} is not supported: use llvm or cuda")
    if result.kind.name == "cuda" and result.host is None:
        result = Target(result.export(), host="llvm")
    return result


def program_limits(options: RTaskOptions, target: Target) -> dict[str, int]:
    """The rProgram size limits (schedule/limits.py) for the chosen policy, when it takes
    them: the user's, or this target's defaults."""
    if not set(LIMIT_OPTIONS) <= set(get_policy(options.policy).OPTIONS):
        return {}
    cuda = target.kind.name == "cuda"
    cap = options.max_ops_per_program
    kernel_cap = options.max_kernels_per_program
    if cap is None:
        cap = CUDA_MAX_OPS_PER_PROGRAM if cuda else CPU_MAX_OPS_PER_PROGRAM
    if kernel_cap is None:
        kernel_cap = CUDA_MAX_KERNELS_PER_PROGRAM if cuda else 0
    return {"max_ops_per_program": cap, "max_kernels_per_program": kernel_cap}


def cpu_worker_capacity() -> int:
    """How many worker threads may run vEUs: TVM_NUM_THREADS if set, else the core count."""
    env = os.environ.get("TVM_NUM_THREADS")
    if env:
        try:
            return max(int(env), 1)
        except ValueError as err:
            raise OptionError(f"TVM_NUM_THREADS={env!r} is not an integer") from err
    return os.cpu_count() or 1


def cpu_vdevice(options: RTaskOptions) -> VDevice:
    """The CPU vDevice: one vEU per worker thread, never more than can really run."""
    capacity = cpu_worker_capacity()
    num_veu = options.num_veu or capacity
    if num_veu > capacity:
        raise CapacityError(
            f"num_veu={num_veu} exceeds the {capacity} worker threads that can run at once "
            "(TVM_NUM_THREADS or the core count); spin barriers between vEUs that are not "
            "running concurrently would time out. Lower num_veu or raise TVM_NUM_THREADS."
        )
    return VDevice.cpu(num_veu)


def cuda_schedule_target(target: Target, threads: int) -> Target:
    """The target dlight schedules with: at most ``threads`` threads per block."""
    return Target(dict(target.export(), max_num_threads=threads))


def variant_function(func_name: str, num_rtasks: int) -> str:
    """Name of the PrimFunc of a further rKernel variant of ``func_name`` (the first variant
    replaces ``func_name`` itself, so ordinary calls keep working)."""
    return f"{func_name}{VARIANT_INFIX}{num_rtasks}"


def kernel_function(mod: tvm.IRModule, func_name: str, kernel_name: str) -> str:
    """The PrimFunc that implements rKernel ``kernel_name`` (``<func>@<num_rtasks>``)."""
    alternative = variant_function(func_name, int(kernel_name.rpartition("@")[2]))
    names = {gv.name_hint for gv in mod.get_global_vars()}
    return alternative if alternative in names else func_name


def _cpu_candidates(func, tuned) -> list[tuple]:
    """(PrimFunc, measured us of one call, cores it was measured on), best first: the tuned
    schedules when the database has some, else the default schedule with no measurement
    (measured and analytical times are not comparable, so they are never mixed)."""
    schedules = tuned.schedules(func) if tuned is not None else []
    if schedules:
        return [(s.func, s.us, s.cores) for s in schedules]
    return [(func, None, 1)]


def _cpu_rkernels(mod: tvm.IRModule, vdevice: VDevice, options: RTaskOptions, tuned=None):
    """rKernel maker for llvm: variants with distinct rTask counts, the first in place of the
    operator's PrimFunc and the others beside it (``variant_function``).

    Counts are tried from ``num_veu * rtasks_per_veu`` (fastest when alone) down to one rTask
    (no split overhead, best when a wave already fills the vEUs); with tuning records each
    record's parallel loop gives its own counts, and an rTask's time is the record's time
    times the threads it ran on, divided among the rTasks.
    """
    max_rtasks = vdevice.num_veu * options.rtasks_per_veu
    limits = sorted({max_rtasks, vdevice.num_veu, 1}, reverse=True)
    cache: dict[str, list[RKernel]] = {}

    def rkernels_for(name: str) -> list[RKernel]:
        if name not in cache:
            variants: dict[int, RKernel] = {}
            for func, us, cores in _cpu_candidates(mod[name], tuned):
                for limit in limits:
                    kernel = make_cpu_rkernel(func, limit)
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
            cache[name] = list(variants.values())
        return cache[name]

    return rkernels_for


def _cuda_rkernels(
    mod: tvm.IRModule,
    unscheduled: dict[str, tvm.tirx.PrimFunc],
    target: Target,
    options: RTaskOptions,
    shared: list[int],
    max_rtasks: int,
):
    """rKernel maker for cuda: the rKernel is added as ``<name>_rkernel`` beside the scheduled
    operator, which stays callable as an ordinary kernel.

    A kernel that reduces across a number of threads other than the vEU's cannot share the
    vEU's block (the allreduce spans a 2-D block); it is rescheduled with one output element
    per thread and serial reductions, and stays ordinary only if that fails too.
    """
    threads = options.cuda_threads
    cache: dict[str, list[RKernel]] = {}

    def fits(kernel) -> str:
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

    def rkernels_for(name: str) -> list[RKernel]:
        if name not in cache:
            kernel = make_cuda_rkernel(mod[name], max_rtasks)
            reason = fits(kernel)
            if reason and name in unscheduled:
                serial = schedule_serial_reduction(unscheduled[name], threads)
                if serial is not None:
                    kernel = make_cuda_rkernel(serial, max_rtasks)
                    reason = fits(kernel)
            if reason:
                raise UnsupportedOperator(f"{name} {reason}")
            mod[f"{name}{RKERNEL_SUFFIX}"] = kernel.func
            shared.append(kernel.shared_mem)
            cache[name] = [
                RKernel(
                    name=f"{name}@{kernel.num_rtasks}",
                    num_rtasks=kernel.num_rtasks,
                    threads=kernel.threads,
                    shared_mem=kernel.shared_mem,
                )
            ]
        return cache[name]

    # A multi-output kernel inside the CUDA dispatcher failed TVM's build (buffer rank
    # mismatch, stitched BERT layer); such kernels stay ordinary calls on CUDA for now.
    rkernels_for.multi_output = False
    return rkernels_for


def _tuned_kernels(db: str | None, kind: str):
    """The ``kind`` tuning records of work directory ``db`` (MetaSchedule is imported only
    then)."""
    if db is None:
        return None
    from ..tuning.apply import load_tuned

    return load_tuned(db, kind)


def _apply_tuned(mod: tvm.IRModule, tuned) -> tvm.IRModule:
    """Each PrimFunc with a record replaced by its best schedule, marked scheduled so dlight
    leaves it alone (cuda; not verified on a GPU yet)."""
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc):
            best = tuned.best(func)
            if best is not None:
                mod[gvar] = best.with_attr("tirx.is_scheduled", True)
    return mod


def _schedule_all(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    """dlight's default GPU schedules for every PrimFunc (ordinary calls need them too)."""
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc):
            mod[gvar] = schedule_for_cuda(func, target)
    return mod


@tvm.transform.module_pass(opt_level=0, name="PlanRPrograms")
class PlanRPrograms:
    """Plan ``main`` into rPrograms with the chosen policy; options as in :class:`RTaskOptions`."""

    def __init__(self, target="llvm", **options) -> None:
        self.target = target
        self.options = options

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        options = resolve_options(self.options, ctx.config)
        target = as_target(self.target)
        # Work on a copy: rKernels replace or join functions, and a pass must leave its input
        # module as it was (planning one module under two policies must work).
        mod = mod.clone()
        if target.kind.name == "cuda":
            schedule_target = cuda_schedule_target(target, options.cuda_threads)
            unscheduled = {
                gv.name_hint: f
                for gv, f in mod.functions.items()
                if isinstance(f, tvm.tirx.PrimFunc)
            }
            tuned = _tuned_kernels(options.db, "cuda")
            if tuned is not None:
                mod = _apply_tuned(mod, tuned)
            mod = _schedule_all(mod, schedule_target)
            shared: list[int] = []
            spec = get_spec(options.device or ARCH_SPECS.get(str(target.arch), "h100"))
            num_veu = options.num_veu or spec.num_sms
            max_rtasks = num_veu * options.rtasks_per_veu
            extracted = extract_graph(
                mod, _cuda_rkernels(mod, unscheduled, schedule_target, options, shared, max_rtasks)
            )
            vdevice = VDevice.cuda(
                spec,
                threads=options.cuda_threads,
                registers=options.cuda_registers,
                shared_mem=max(shared, default=0),
                num_veu=num_veu,
            )
        else:
            vdevice = cpu_vdevice(options)
            tuned = _tuned_kernels(options.db, "llvm")
            extracted = extract_graph(mod, _cpu_rkernels(mod, vdevice, options, tuned))
        graph = RGraph(extracted.operators)
        policy_options = program_limits(options, target)
        plan = make_plan(
            graph, vdevice, policy=options.policy, cost=AnalyticalCostModel(), **policy_options
        )
        plan.options = options.to_dict()
        return mod.with_attr(PLAN_ATTR, plan.to_json())
