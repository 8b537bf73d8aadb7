"""Plans on the command line: one plan per policy, the side-by-side table ``plan`` prints,
and the Gantt chart of ``--gantt``."""

from __future__ import annotations

from .errors import CLIError

REPORT_ROWS = (
    ("operators", "operators"),
    ("rtasks", "rTasks"),
    ("rprograms", "rPrograms"),
    ("kernel_launches", "kernel launches"),
    ("barriers", "barriers"),
    ("veus", "vEUs"),
    ("max_ops_side_by_side", "max ops side by side"),
    ("ordinary_ops", "ordinary ops"),
    ("estimated_us", "estimated (us)"),
    ("ideal_us", "ideal bound (us)"),
)


def plan_policies(model, target, policies: list[str], options: dict) -> dict:
    """``{policy: Plan}`` of a :class:`~tvm_rtask.cli.build.LoadedModel`; the model is
    legalized, folded and fused once for all policies."""
    import tvm

    from ..core import Plan
    from ..errors import run_keeping_errors
    from ..relax_passes import PLAN_ATTR, PlanRPrograms, RTaskPrepare

    prepared = run_keeping_errors(RTaskPrepare(options.get("fusion")), model.mod)
    plans = {}
    for policy in policies:
        opts = {**options, "policy": policy}
        # A fresh module per policy: PlanRPrograms replaces operators by their rKernels in
        # the module it is given (seen in TVM 0.27 / relax_passes/plan_rprograms.py), so a second
        # policy planned on the same module would re-split already split loops.
        fresh = tvm.IRModule(dict(prepared.functions), attrs=prepared.attrs)
        planned = run_keeping_errors(
            tvm.transform.Sequential([PlanRPrograms(target, **opts)]), fresh
        )
        plans[policy] = Plan.from_json(str(planned.attrs[PLAN_ATTR]))
    return plans


def format_report_table(title: str, reports: dict[str, dict]) -> str:
    """Rows: the report's counts and estimates; columns: policies."""
    cols = list(reports)
    width = max([12, *(len(c) + 2 for c in cols)])
    lines = [title, f"{'':22s}" + "".join(f"{c:>{width}s}" for c in cols)]
    for key, label in REPORT_ROWS:
        cells = []
        for c in cols:
            v = reports[c].get(key, "")
            cells.append(f"{v:>{width}.1f}" if isinstance(v, float) else f"{v!s:>{width}s}")
        lines.append(f"{label:22s}" + "".join(cells))
    return "\n".join(lines)


def gantt_function():
    """``tvm_rtask.viz.gantt`` or None while it does not exist."""
    try:
        from .. import viz
    except ImportError:
        return None
    return getattr(viz, "gantt", None)


def require_gantt():
    """``tvm_rtask.viz.gantt``, or a one-line error where it cannot be had."""
    fn = gantt_function()
    if fn is None:
        raise CLIError("Gantt charts are not available yet (tvm_rtask.viz.gantt is missing)")
    return fn
