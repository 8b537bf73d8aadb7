"""The public entry points: ``compile``, ``plan`` and ``rtask_pipeline``."""

from __future__ import annotations

import tvm

from . import frontend
from .core import Plan
from .errors import run_keeping_errors
from .relax_passes import PLAN_ATTR, PlanRPrograms, RTaskPrepare, as_target, rtask_pipeline
from .runtime import native, threads


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
        [RTaskPrepare(opts.get("fusion")), PlanRPrograms(target, **opts)]
    )
    planned = run_keeping_errors(seq, mod)
    return Plan.from_json(str(planned.attrs[PLAN_ATTR]))


def compile(  # noqa: A001 - the name users expect, as tvm.compile
    mod, target="llvm", policy: str | None = None, barrier: str | None = None, **options
):
    """Compile ``mod`` into a Relax executable whose operators run as persistent kernels.

    ``policy`` (default ``"wavefront"``) and ``barrier`` (default ``"fine"``) may also come
    from PassContext keys ``rtask.policy`` / ``rtask.barrier``. The returned executable runs
    with ``tvm.relax.VirtualMachine(ex, tvm.cpu())``. TVM's CPU thread pool is grown to the
    plan's vEU count, because every vEU must have a worker thread running at the same time.
    """
    mod = frontend.load(mod)
    tvm_target = as_target(target)
    native.load()
    opts = _options(policy, barrier, options)
    lowered = run_keeping_errors(rtask_pipeline(tvm_target, **opts), mod)
    planned = Plan.from_json(str(lowered.attrs[PLAN_ATTR]))
    if threads.num_threads() < planned.vdevice.num_veu:
        threads.set_num_threads(planned.vdevice.num_veu)
    return tvm.compile(lowered, target=tvm_target)
