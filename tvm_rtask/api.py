"""The public entry points: ``compile``, ``plan`` and ``rtask_pipeline``."""

from __future__ import annotations

import tvm

from . import frontend
from .core import Plan
from .errors import PlanError, run_keeping_errors
from .relax_passes import PLAN_ATTR, PlanRPrograms, RTaskPrepare, as_target, rtask_pipeline
from .relax_passes.ios_merge import IOSOperatorMerge
from .runtime import native, threads
from .runtime.config import register_config_options

register_config_options()


def _options(policy, barrier, options) -> dict:
    merged = dict(options)
    if policy is not None:
        merged["policy"] = policy
    if barrier is not None:
        merged["barrier"] = barrier
    return merged


def plan(mod, target="llvm", policy: str | None = None, **options) -> Plan:
    """Plan ``mod`` without building it: the rOperator graph, rPrograms and estimates.

    ``policy`` defaults to ``rtask.policy`` from the PassContext, else ``"wavefront"``.
    """
    mod = frontend.load(mod)
    opts = _options(policy, None, options)
    seq = tvm.transform.Sequential(
        [
            IOSOperatorMerge(target, **opts),
            RTaskPrepare(opts.get("fusion")),
            PlanRPrograms(target, **opts),
        ]
    )
    planned = run_keeping_errors(seq, mod)
    return Plan.from_json(str(planned.attrs[PLAN_ATTR]), shared=True)


def compile(  # noqa: A001 - the name users expect, as tvm.compile
    mod, target="llvm", policy: str | None = None, barrier: str | None = None, **options
):
    """Compile ``mod`` into a Relax executable whose operators run as persistent kernels.

    ``policy`` (default ``"wavefront"``) and ``barrier`` (default ``"fine"``) may also come
    from PassContext keys ``rtask.policy`` / ``rtask.barrier``. The returned executable runs
    with ``tvm.relax.VirtualMachine(ex, tvm.cpu())``. TVM's CPU thread pool is grown to the
    plan's vEU count, because every vEU must have a worker thread running at the same time.
    """
    return compile_with_plan(mod, target, policy, barrier, **options)[0]


def compile_with_plan(
    mod, target="llvm", policy: str | None = None, barrier: str | None = None, **options
):
    """:func:`compile`, also returning the Plan it compiled (no second planning run)."""
    tvm_target = as_target(target)
    return build(lower(mod, tvm_target, policy, barrier, **options), tvm_target)


def lower(
    mod, target="llvm", policy: str | None = None, barrier: str | None = None, **options
) -> tvm.IRModule:
    """The module after :func:`rtask_pipeline`: ``main`` calls one persistent PrimFunc per
    rProgram; the plan is in the module attribute ``rtask.plan``. :func:`build` finishes it."""
    mod = frontend.load(mod)
    native.load()
    opts = _options(policy, barrier, options)
    return run_keeping_errors(rtask_pipeline(as_target(target), **opts), mod)


def build(lowered: tvm.IRModule, target="llvm"):
    """Build a module from :func:`lower` for ``target``: ``(executable, plan)``."""
    tvm_target = as_target(target)
    if lowered.attrs is None or PLAN_ATTR not in lowered.attrs:
        raise PlanError("build needs a module from tvm_rtask.lower (it has no rtask.plan)")
    # (the plan's options are resolved: keywords, then rtask.* PassContext keys, then defaults)
    planned = Plan.from_json(str(lowered.attrs[PLAN_ATTR]), shared=True)
    if tvm_target.kind.name == "cuda":
        from .runtime import cuda_status  # noqa: F401 - registers tvm_rtask.check_status

        tir_pipeline = "default"
        if planned.options.get("cooperative_launch", False):
            from .tir.cooperative import cooperative_pipeline

            tir_pipeline = cooperative_pipeline()
        ex = tvm.compile(
            lowered,
            target=tvm_target,
            relax_pipeline=_finish_pipeline(tvm_target),
            tir_pipeline=tir_pipeline,
        )
        if planned.options.get("verify_occupancy", True) and planned.programs():
            _verify_occupancy(ex, planned, str(tvm_target.arch))
        return ex, planned
    if threads.num_threads() < planned.vdevice.num_veu:
        threads.set_num_threads(planned.vdevice.num_veu)
    return tvm.compile(lowered, target=tvm_target), planned


def cuda_source(ex) -> str:
    """The generated CUDA source of a compiled executable ("" when there is none)."""
    pending = [ex.mod]
    while pending:
        module = pending.pop()
        if module.kind == "cuda":
            return module.inspect_source()
        pending.extend(module.imports)
    return ""


def _verify_occupancy(ex, plan: Plan, arch: str) -> None:
    """ptxas's register and shared-memory counts must let every vEU be resident at once."""
    import logging

    from .tir.occupancy import check_co_residency, find_nvcc, ptxas_usage

    if find_nvcc() is None:
        logging.getLogger(__name__).warning(
            "nvcc not found: co-residency of the persistent kernels was not verified "
            "(ptxas register counts unknown); vEUs were sized from the analytical model"
        )
        return
    usage = ptxas_usage(cuda_source(ex), arch)
    threads = int(plan.options.get("cuda_threads", 256))
    capacities = check_co_residency(plan.vdevice.spec, threads, plan.vdevice.num_veu, usage)
    plan.kernel_usage = {
        name: {"registers": usage[name].registers, "shared_mem": usage[name].shared_mem,
               "capacity": capacity}
        for name, capacity in capacities.items()
    }  # fmt: skip


def _finish_pipeline(target) -> tvm.transform.Pass:
    """The backend's dataflow lowering and finalization, without its legalize/fuse/schedule
    passes: every kernel is already scheduled, and FoldConstant must not evaluate a
    persistent kernel whose inputs happen to be constants."""
    from tvm.relax.backend.cuda import pipeline as cuda_pipeline

    @tvm.transform.module_pass(opt_level=0, name="RTaskFinish")
    def finish(mod, _ctx):
        with target:
            passes = cuda_pipeline.dataflow_lower_passes(target)
            passes += cuda_pipeline.finalize_passes(target)
            return tvm.transform.Sequential(passes)(mod)

    return finish
