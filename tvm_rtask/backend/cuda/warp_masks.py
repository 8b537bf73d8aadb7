"""Warp masks that name the lanes reaching each warp operation (pass :func:`SafeWarpMasks`).

TVM's ``LowerThreadAllreduce`` gives every cross-thread reduction it lowers to warp shuffles
a mask read with ``tvm_warp_activemask()`` (``__activemask()``) just before the shuffles, and
``LowerWarpMemory`` does the same for its shuffles. That reads which lanes happen to execute
together at that instant, not which lanes will execute the shuffle: right after a divergent
branch (``if (threadIdx.x < 9) { ... }`` accumulating a depthwise window, then the
reduction), CUDA does not promise that the lanes have reconverged, so the mask can name half
of the warp while the other half runs the same shuffles later with a mask of its own. Each
half then reads lanes outside its mask: undefined values. Its in-warp stage over shared
memory (the reductions that cannot shuffle) synchronises with ``tvm_storage_sync("warp")``,
which TVM's CUDA code generator prints as nothing.

The pass runs on each device function after ``LowerWarpMemory`` and before ``LowerIntrin``
and decides, from the thread extents it sees, which lanes reach each warp operation:

* the block's threads are numbered as CUDA numbers them (``x + nx * (y + ny * z)``), warp
  ``w`` being threads ``32 w`` to ``32 w + 31``; lanes past the block's last thread do not
  exist;
* a branch whose condition is the same for every thread of the block (it reads no thread
  index, no per-thread register, no per-thread memory, no external function but
  :data:`BLOCK_UNIFORM_HELPERS`; TVM's ``tvm_thread_invariant`` says so explicitly) keeps
  every lane that reached it; so does a loop whose bounds are;
* a branch whose condition depends on the thread indices and constants alone is evaluated
  for every thread: its lanes are known exactly (``tid < n && <uniform>``: the lanes of
  ``tid < n`` in its then branch);
* any other condition that depends on the thread (a value loaded per thread, a loop whose
  trip count depends on the thread, a break or return taken by some lanes) leaves the lanes
  unknown.

Where the lanes are known, each shuffle's mask becomes them: ``0xffffffff`` where every lane
of every warp that gets there reaches it, the constant of the lanes where one set of lanes
does in every such warp (a block of 16 threads: ``0x0000ffff``), or a select on the warp
index where warps differ (the last, partial warp of a 48-thread block). Each
``tvm_warp_activemask()`` becomes the same value, and each ``tvm_storage_sync("warp")`` a
``__syncwarp(mask)`` of the lanes that meet there. Where they are unknown the operation is
left as TVM emitted it (and the ``__activemask()`` its mask is read from), and a fallback is
noted (:data:`WARP_MASK_KEPT`); no light or zoo model has one (the CUDA codegen tests scan
their sources with :func:`activemask_shuffles`).

The rule "a branch on block-uniform values keeps every lane" assumes that threads reading the
same shared or global address read the same value, which a race would break anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import PrimType
from tvm.ir.expr import Call, StringImm, TensorLoad

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
ACTIVEMASK = "tirx.tvm_warp_activemask"
SHUFFLES = (
    "tirx.tvm_warp_shuffle",
    "tirx.tvm_warp_shuffle_down",
    "tirx.tvm_warp_shuffle_up",
    "tirx.tvm_warp_shuffle_xor",
)
STORAGE_SYNC = "tirx.tvm_storage_sync"
THREAD_INVARIANT = "tirx.tvm_thread_invariant"
LIKELY = "prim.likely"
IF_THEN_ELSE = "prim.if_then_else"
THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
# scopes whose every thread holds its own copy: a load from them is per thread
_PER_THREAD_SCOPES = ("local", "warp", "wmma", "m16n8k8")
# calls whose result may differ per thread (TVM's intrinsics and the pure external functions
# otherwise compute from their arguments): external functions with effects (tvm-rtask's
# device helpers are ``tirx.cuda.func_call``), the CUDA/PTX thread and warp operations
_PER_THREAD_CALLS = ("tirx.call_extern", "tirx.call_llvm_intrin", ACTIVEMASK)
_PER_THREAD_PREFIXES = ("tirx.cuda.", "tirx.ptx.", "tirx.nvshmem.")
DEVICE_HELPER = "tirx.cuda.func_call"
# tvm-rtask's device helpers whose result is the same for every thread of a block: the vEU a
# block claimed by SM (device/claim.cuh: a __shared__ id written by thread 0 before a
# __syncthreads), which the task-table loads of cuda_veu_placement="smid" are indexed by
BLOCK_UNIFORM_HELPERS = frozenset({"tvm_rtask_claimed_veu"})


def _per_thread_call(node, name: str) -> bool:
    """Whether a call's result may differ between threads given the same arguments: a call
    of anything but one of TVM's intrinsics, an external function, an atomic, a warp or
    thread operation (but for :data:`BLOCK_UNIFORM_HELPERS`)."""
    if name == DEVICE_HELPER and node.args and isinstance(node.args[0], StringImm):
        if str(node.args[0].value) in BLOCK_UNIFORM_HELPERS:
            return False
    return (
        not name.startswith(("tirx.", "prim."))
        or name in _PER_THREAD_CALLS
        or name.startswith(_PER_THREAD_PREFIXES)
        or "atomic" in name
        or _is_target(node)
    )


_ESCAPES = (tirx.Break, tirx.Continue, tirx.Return)


class _Unknown(Exception):
    """An expression the pass cannot evaluate per thread."""


@dataclass
class WarpMaskReport:
    """What the pass did to one device function."""

    name: str
    threads: int  # threads of the block (0: no thread axis)
    rewritten: dict[str, int] = field(default_factory=dict)  # operation -> count
    unresolved: list[str] = field(default_factory=list)  # why each was left


LAST_REPORTS: list[WarpMaskReport] = []
"""The reports of the functions with warp operations of the last :func:`SafeWarpMasks` run."""
WARP_MASK_KEPT = "warp mask kept"
"""Fallback kind: a warp operation whose lanes the pass cannot tell keeps TVM's mask."""


def _op_name(node) -> str:
    return getattr(node.op, "name", "") if isinstance(node, Call) else ""


def _is_warp_sync(node) -> bool:
    if _op_name(node) != STORAGE_SYNC or not node.args:
        return False
    scope = node.args[0]
    return isinstance(scope, StringImm) and str(scope.value) == "warp"


def _is_target(node) -> bool:
    name = _op_name(node)
    return name == ACTIVEMASK or name in SHUFFLES or _is_warp_sync(node)


def _contains_target(node) -> bool:
    found = [False]

    def visit(n):
        if _is_target(n):
            found[0] = True

    tvm_ffi.structural_walk(node, (Call, visit))
    return found[0]


def _contains_escape(node) -> bool:
    found = [False]

    def visit(n):
        found[0] = True

    tvm_ffi.structural_walk(node, (_ESCAPES, visit))
    return found[0]


def _conjuncts(cond) -> list:
    """``a && b && ...`` as ``[a, b, ...]`` (``likely`` hints removed)."""
    if _op_name(cond) == LIKELY:
        return _conjuncts(cond.args[0])
    if isinstance(cond, tirx.And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _u32(value: int):
    return tirx.IntImm("uint32", value & FULL_MASK)


def _trunc_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((np.asarray(a) < 0) != (np.asarray(b) < 0), -q, q)


def _trunc_mod(a, b):
    return a - b * _trunc_div(a, b)


_BINARY = {
    tirx.Add: lambda a, b: a + b,
    tirx.Sub: lambda a, b: a - b,
    tirx.Mul: lambda a, b: a * b,
    tirx.Div: _trunc_div,
    tirx.Mod: _trunc_mod,
    tirx.FloorDiv: lambda a, b: np.floor_divide(a, b),
    tirx.FloorMod: lambda a, b: np.mod(a, b),
    tirx.Min: np.minimum,
    tirx.Max: np.maximum,
    tirx.EQ: lambda a, b: a == b,
    tirx.NE: lambda a, b: a != b,
    tirx.LT: lambda a, b: a < b,
    tirx.LE: lambda a, b: a <= b,
    tirx.GT: lambda a, b: a > b,
    tirx.GE: lambda a, b: a >= b,
    tirx.And: np.logical_and,
    tirx.Or: np.logical_or,
    tirx.BitwiseAnd: np.bitwise_and,
    tirx.BitwiseOr: np.bitwise_or,
    tirx.BitwiseXor: np.bitwise_xor,
    tirx.LShift: np.left_shift,
    tirx.RShift: np.right_shift,
}


class _Analysis:
    """Which lanes reach each warp operation of one device function (see the module
    docstring); ``masks`` maps each operation's node to the mask that replaces TVM's."""

    def __init__(self, func: tirx.PrimFunc, name: str) -> None:
        self.name = name
        self.extents: dict[str, int] = {}
        self.thread_tag: dict[int, str] = {}  # var handle -> threadIdx tag
        self.uniform: dict[int, bool] = {p.__chandle__(): True for p in func.params}
        self.value: dict[int, object] = {}  # let-bound var handle -> its value
        self.bounds: dict[int, list] = {}  # loop var handle -> the loop's bounds
        self._collect(func.body)
        nx, ny, nz = (self.extents.get(t, 1) for t in THREAD_TAGS)
        self.threads = nx * ny * nz
        flat = np.arange(self.threads, dtype=np.int64)
        self.index = {
            "threadIdx.x": flat % nx,
            "threadIdx.y": flat // nx % ny,
            "threadIdx.z": flat // (nx * ny),
        }
        self.masks: dict[int, object] = {}  # target node handle -> mask expression
        self.specs: dict[int, tuple | None] = {}  # target node handle -> per-warp masks
        self.unresolved: list[str] = []
        self.rewritten: dict[str, int] = {}
        self.escaped = ""  # why every later operation's lanes are unknown
        self.stored_into: dict[int, set[int]] = {}  # mask buffer -> activemask calls stored
        self.kept_buffers: set[int] = set()  # mask buffers an unresolved shuffle reads
        self._memo: dict[int, bool] = {}

    def _collect(self, body) -> None:
        """The thread axes, the let-bound values and the loops' bounds."""

        def launch(node):
            if str(node.attr_key) != "thread_extent":
                return
            tag, var = str(node.node.thread_tag), node.node.var
            if tag not in THREAD_TAGS:  # blockIdx: the same for every thread of a block
                self.uniform[var.__chandle__()] = True
                return
            if not isinstance(node.value, tirx.IntImm):
                raise _Unknown(f"{tag} has the symbolic extent {node.value}")
            extent = int(node.value.value)
            if self.extents.setdefault(tag, extent) != extent:
                raise _Unknown(f"{tag} is launched with extents {self.extents[tag]} and {extent}")
            self.thread_tag[var.__chandle__()] = tag
            self.uniform[var.__chandle__()] = False

        def bind(node):
            self.value[node.var.__chandle__()] = node.value

        def loop(node):
            bounds = [node.min, node.extent] + ([node.step] if node.step is not None else [])
            self.bounds[node.loop_var.__chandle__()] = bounds

        tvm_ffi.structural_walk(
            body,
            [(tirx.AttrStmt, launch), ((tirx.Bind, tirx.Let), bind), (tirx.For, loop)],
        )

    # -- expressions --------------------------------------------------------------------------

    def is_uniform(self, expr) -> bool:
        """Whether ``expr`` has one value for every thread of the block."""
        if isinstance(expr, (tirx.IntImm, tirx.FloatImm, StringImm)):
            return True
        key = expr.__chandle__()
        if key not in self._memo:
            self._memo[key] = self._uniform(expr)
        return self._memo[key]

    def _uniform(self, expr) -> bool:
        result = [True]

        def visit(node):
            if not result[0]:
                return tvm_ffi.WalkResult.SKIP
            if isinstance(node, Call):
                name = _op_name(node)
                if name == THREAD_INVARIANT:
                    return tvm_ffi.WalkResult.SKIP
                if _per_thread_call(node, name):
                    result[0] = False
            elif isinstance(node, TensorLoad):
                if str(node.source.scope()) in _PER_THREAD_SCOPES:
                    result[0] = False
            elif isinstance(node, tirx.Var) and not self._var_uniform(node):
                result[0] = False
            return None

        tvm_ffi.structural_walk(expr, visit, order="pre")
        return result[0]

    def _var_uniform(self, var) -> bool:
        key = var.__chandle__()
        if key not in self.uniform:
            self.uniform[key] = False  # a cycle or an unknown variable: per thread
            if key in self.value:
                self.uniform[key] = self.is_uniform(self.value[key])
            elif key in self.bounds:
                self.uniform[key] = all(self.is_uniform(b) for b in self.bounds[key])
            elif not isinstance(var.ty, PrimType):
                self.uniform[key] = True  # a buffer: what is loaded from it is checked
        return self.uniform[key]

    def lanes(self, expr) -> np.ndarray:
        """``expr`` evaluated for every thread of the block (``_Unknown`` if it reads
        anything but thread indices, constants and let-bound values of those)."""
        value = self._eval(expr)
        return np.broadcast_to(np.asarray(value), (self.threads,))

    def _eval(self, expr):
        if isinstance(expr, tirx.IntImm):
            return np.int64(expr.value)
        if isinstance(expr, tirx.Var):
            key = expr.__chandle__()
            if key in self.thread_tag:
                return self.index[self.thread_tag[key]]
            if key in self.value:
                return self._eval(self.value[key])
            raise _Unknown(f"{expr} is not a thread index")
        op = _BINARY.get(type(expr))
        if op is not None:
            return op(self._eval(expr.a), self._eval(expr.b))
        if isinstance(expr, tirx.Not):
            return np.logical_not(self._eval(expr.a))
        if isinstance(expr, tirx.Select):
            cond = self._eval(expr.condition)
            return np.where(cond, self._eval(expr.true_value), self._eval(expr.false_value))
        if isinstance(expr, tirx.Cast):
            value = np.asarray(self._eval(expr.value))
            return value.astype(bool) if str(expr.ty) == "bool" else value.astype(np.int64)
        if isinstance(expr, Call):
            name = _op_name(expr)
            if name in (LIKELY, THREAD_INVARIANT):
                return self._eval(expr.args[0])
            if name == IF_THEN_ELSE:
                cond, a, b = (self._eval(x) for x in expr.args)
                return np.where(cond, a, b)
        raise _Unknown(f"{type(expr).__name__} {expr} is not a function of the thread indices")

    # -- statements -----------------------------------------------------------------------------

    def run(self, body) -> None:
        everyone = np.ones(self.threads, dtype=bool)
        self.stmt(body, everyone, everyone, {}, "")
        # a shuffle left alone keeps reading its mask variable: so must the variable keep
        # TVM's __activemask() (the mask of the store's position could name more lanes)
        for buffer in self.kept_buffers:
            for key in self.stored_into.get(buffer, ()):
                if self.masks.pop(key, None) is not None:
                    self.rewritten["tvm_warp_activemask"] -= 1
                    self.specs[key] = None
                    self.unresolved.append(
                        f"tvm_warp_activemask in {self.name}: a shuffle reading it is left alone"
                    )

    def stmt(self, s, reach, loop_reach, scope: dict, why: str) -> None:
        """Visit ``s``, reached by the lanes ``reach`` (None: unknown); ``loop_reach`` the
        lanes that entered the innermost loop (a break or return where fewer lanes run leaves
        every later operation's lanes unknown); ``why`` says why the lanes are unknown."""
        if isinstance(s, _ESCAPES):
            if reach is None or loop_reach is None or not np.array_equal(reach, loop_reach):
                self.escaped = self.escaped or f"after a per-thread {type(s).__name__.lower()}"
            return
        if not _contains_target(s) and not _contains_escape(s):
            return
        if isinstance(s, tirx.SeqStmt):
            for child in s.seq:
                self.stmt(child, reach, loop_reach, scope, why)
        elif isinstance(s, tirx.AttrStmt):
            if str(s.attr_key) == "thread_extent" and str(s.node.thread_tag) in THREAD_TAGS:
                scope = {**scope, str(s.node.thread_tag): s.node.var}
            self.stmt(s.body, reach, loop_reach, scope, why)
        elif isinstance(s, tirx.IfThenElse):
            self.leaf(s.condition, reach, scope, why)
            (then, then_why), (other, other_why) = self.split(s.condition, reach)
            self.stmt(s.then_case, then, loop_reach, scope, why or then_why)
            if s.else_case is not None:
                self.stmt(s.else_case, other, loop_reach, scope, why or other_why)
        elif isinstance(s, tirx.For):
            uniform = self._var_uniform(s.loop_var)
            inner = reach if uniform else None
            reason = "" if uniform else f"in the loop over {s.loop_var}, whose bounds vary"
            self.stmt(s.body, inner, inner, scope, why or reason)
        elif isinstance(s, tirx.While):
            self.leaf(s.condition, reach, scope, why)
            inner = reach if self.is_uniform(s.condition) else None
            reason = "" if inner is not None else "in a while loop whose condition varies"
            self.stmt(s.body, inner, inner, scope, why or reason)
        else:
            self.leaf(s, reach, scope, why)

    def split(self, cond, reach):
        """The lanes entering the then and the else branch of ``if cond``, each with why
        they are unknown (None and a reason) where they are. A conjunct of ``cond`` that is
        block-uniform selects no lanes in the then branch (where it holds for every thread);
        in the else branch, it makes the lanes depend on its value."""
        if reach is None or self.is_uniform(cond):
            return (reach, ""), (reach, "")
        conjuncts = _conjuncts(cond)
        varying = [c for c in conjuncts if not self.is_uniform(c)]
        taken = np.ones(self.threads, dtype=bool)
        try:
            for part in varying:
                taken &= self.lanes(part).astype(bool)
        except _Unknown as err:
            unknown = (None, f"under a branch that depends on data ({err})")
            return unknown, unknown
        if len(varying) < len(conjuncts):
            return (reach & taken, ""), (None, "in the else of a branch on data and threads")
        return (reach & taken, ""), (reach & ~taken, "")

    def leaf(self, node, reach, scope: dict, why: str) -> None:
        """Every warp operation in ``node`` (a statement without nested statements, or an
        expression), reached by ``reach``; one inside a per-thread select has unknown lanes."""
        found: list[tuple[object, str]] = []

        def collect(into_why):
            def visit(call):
                if _is_target(call):
                    found.append((call, into_why))

            return visit

        def visit(n):
            if isinstance(n, Call) and _is_target(n):
                found.append((n, ""))
                return None
            branches = None
            if isinstance(n, tirx.Select):
                cond, branches = n.condition, (n.true_value, n.false_value)
            elif _op_name(n) == IF_THEN_ELSE:
                cond, branches = n.args[0], tuple(n.args[1:])
            if branches is None or self.is_uniform(cond) or not _contains_target(n):
                return None
            tvm_ffi.structural_walk(cond, (Call, collect("")))
            for branch in branches:
                tvm_ffi.structural_walk(branch, (Call, collect("in a per-thread select")))
            return tvm_ffi.WalkResult.SKIP

        tvm_ffi.structural_walk(node, visit, order="pre")
        if isinstance(node, tirx.BufferStore) and _op_name(node.value) == ACTIVEMASK:
            stored = self.stored_into.setdefault(node.buffer.__chandle__(), set())
            stored.add(node.value.__chandle__())
        for call, inner in found:
            self.target(call, reach, scope, why or inner or self.escaped)

    def target(self, call, reach, scope: dict, why: str) -> None:
        kind = "__syncwarp" if _is_warp_sync(call) else _op_name(call).removeprefix("tirx.")
        key = call.__chandle__()
        if key in self.specs and self.specs[key] is None:
            return  # already left alone
        spec = None if reach is None or why else self.warp_masks(reach)
        if spec is not None and self.specs.get(key, spec) != spec:
            why = "one node reached by two sets of lanes"
            spec = None
        if spec is not None and key not in self.masks:
            mask = self.mask_expr(spec, scope)
            if mask is None:
                why, spec = "a thread index is out of scope", None
            else:
                self.masks[key] = mask
                self.rewritten[kind] = self.rewritten.get(kind, 0) + 1
        self.specs[key] = spec
        if spec is None:
            if self.masks.pop(key, None) is not None:
                self.rewritten[kind] -= 1
            self.unresolved.append(f"{kind} in {self.name}: lanes unknown, {why}")
            mask = call.args[0] if _op_name(call) in SHUFFLES else None
            if isinstance(mask, TensorLoad):
                self.kept_buffers.add(mask.source.__chandle__())

    # -- masks ----------------------------------------------------------------------------------

    def warp_masks(self, reach: np.ndarray) -> tuple[tuple[int, int], ...]:
        """(warp, mask of its lanes that reach) for each warp with a lane that reaches."""
        masks = []
        for warp in range(-(-self.threads // WARP_SIZE)):
            lanes = reach[warp * WARP_SIZE : (warp + 1) * WARP_SIZE]
            mask = sum(1 << lane for lane in np.flatnonzero(lanes).tolist())
            if mask:
                masks.append((warp, mask))
        return tuple(masks)

    def mask_expr(self, spec, scope: dict):
        """The uint32 mask of ``spec`` for the thread running it: a constant, or a select on
        the thread's warp where the warps that reach differ (None: a thread index needed is
        not in scope)."""
        values = {mask for _, mask in spec}
        if len(values) <= 1:
            return _u32(values.pop() if values else FULL_MASK)
        flat, stride = None, 1
        for tag in THREAD_TAGS:
            extent = self.extents.get(tag, 1)
            if extent == 1:
                continue
            var = scope.get(tag)
            if var is None:
                return None
            term = var if str(var.ty) == "int32" else tirx.Cast("int32", var)
            term = term if stride == 1 else tirx.Mul(term, tirx.IntImm("int32", stride))
            flat = term if flat is None else tirx.Add(flat, term)
            stride *= extent
        # runs of consecutive reaching warps with one mask (a warp that never gets there
        # takes its neighbour's), from the last: select(thread < first of next run, ...)
        runs: list[tuple[int, int]] = []
        for warp, mask in spec:
            if not runs or runs[-1][1] != mask:
                runs.append((warp, mask))
        expr = _u32(runs[-1][1])
        for (_, mask), (next_warp, _) in zip(reversed(runs[:-1]), reversed(runs[1:]), strict=True):
            below = tirx.LT(flat, tirx.IntImm("int32", next_warp * WARP_SIZE))
            expr = tirx.Select(below, _u32(mask), expr)
        return expr


def _rewrite(body, masks: dict):
    def call(node):
        mask = masks.get(node.__chandle__())
        if mask is None:
            return node
        name = _op_name(node)
        if name == ACTIVEMASK:
            return mask
        if name in SHUFFLES:
            return type(node)(node.op, [mask, *list(node.args)[1:]], ret_ty=node.ty)
        return node

    def evaluate(node):
        value = node.value
        if isinstance(value, Call) and _is_warp_sync(value):
            mask = masks.get(value.__chandle__())
            if mask is not None:
                return tirx.Evaluate(tirx.call_extern("int32", "__syncwarp", mask))
        return node

    return tvm_ffi.structural_map(body, [(tirx.Evaluate, evaluate), (Call, call)], order="pre")


def safe_warp_masks(func: tirx.PrimFunc, name: str = "") -> tuple[tirx.PrimFunc, WarpMaskReport]:
    """``func`` with every warp operation's mask naming the lanes that reach it, where the
    pass can tell (see the module docstring), and what it did."""
    name = name or str((func.attrs or {}).get("global_symbol", "") if func.attrs else "")
    if not _contains_target(func.body):
        return func, WarpMaskReport(name, 0)
    try:
        analysis = _Analysis(func, name)
    except _Unknown as why:
        report = WarpMaskReport(name, 0, unresolved=[f"warp operations in {name}: {why}"])
        return func, report
    analysis.run(func.body)
    report = WarpMaskReport(name, analysis.threads, analysis.rewritten, analysis.unresolved)
    if not analysis.masks:
        return func, report
    body = _rewrite(func.body, analysis.masks)
    return func.with_body(body), report


def _is_cuda(func: tirx.PrimFunc) -> bool:
    target = func.attrs.get("target") if func.attrs is not None else None
    return target is not None and str(target.kind.name) == "cuda"


@tvm.transform.module_pass(opt_level=0, name="SafeWarpMasks")
def SafeWarpMasks(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - a TVM pass
    """:func:`safe_warp_masks` on every CUDA device function of ``mod``; each function with an
    operation left alone is noted as a fallback (reports in :data:`LAST_REPORTS`)."""
    from ...fallbacks import note_fallback

    LAST_REPORTS.clear()
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or not _is_cuda(func):
            continue
        new, report = safe_warp_masks(func, gv.name_hint)
        if report.rewritten or report.unresolved:
            LAST_REPORTS.append(report)
        if report.unresolved:
            more = len(report.unresolved) - 1
            reason = report.unresolved[0] + (f" (and {more} more)" if more else "")
            note_fallback(WARP_MASK_KEPT, gv.name_hint, reason)
        if new is not func:
            updates[gv] = new
    for gv, func in updates.items():
        mod[gv] = func
    return mod


# warp operations whose first argument is a mask of lanes
_MASKED_CALL = re.compile(
    r"\b(__shfl(?:_up|_down|_xor)?_sync|__syncwarp|__ballot_sync|__any_sync|__all_sync"
    r"|__uni_sync|__match_(?:any|all)_sync|__reduce_\w+_sync)\("
)
_ACTIVEMASK_STORE = re.compile(r"([\w\[\]\.]+)\s*=\s*__activemask\(\)\s*;")


def _first_argument(text: str, start: int) -> str:
    """The first argument of the call whose ``(`` ends at ``start``."""
    depth = 0
    for at in range(start, len(text)):
        char = text[at]
        if char in "([":
            depth += 1
        elif char in ")]":
            if depth == 0:
                return text[start:at]
            depth -= 1
        elif char == "," and depth == 0:
            return text[start:at]
    return text[start:]


def _bare(expr: str) -> str:
    expr = expr.replace(" ", "")
    while expr.startswith("(") and expr.endswith(")") and _first_argument(expr, 1) == expr[1:-1]:
        expr = expr[1:-1]
    return expr


def activemask_shuffles(source: str) -> list[str]:
    """The lines of CUDA ``source`` where a warp operation (a shuffle, ``__syncwarp``, a vote)
    takes its mask from ``__activemask()``, directly or through a variable assigned from it;
    ``[]`` where every mask names its lanes. Preprocessor lines are skipped (TVM's preamble
    defines the shuffles for old architectures with a parameter named ``mask``)."""
    from_activemask = {_bare(m.group(1)) for m in _ACTIVEMASK_STORE.finditer(source)}
    found = []
    for line in source.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for call in _MASKED_CALL.finditer(line):
            mask = _bare(_first_argument(line, call.end()))
            if "__activemask()" in mask or mask in from_activemask:
                found.append(line.strip())
                break
    return found
