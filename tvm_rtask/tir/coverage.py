"""Whether each block of a scheduled PrimFunc still computes its whole iteration domain.

``reverse_compute_at`` computes a moved consumer only over the instances that read what the
anchor's loop iteration makes; an instance that reads none of it (the border of a ``nn.pad``
fused after a convolution) belongs to no iteration and is dropped without an error
(``docs/findings.md``, "Unwritten memory"). The check here finds such a block.

For each block its bindings over the loops around it (and its predicate) must reach every
point of its domain:

- first TVM's own ``detect_iter_map`` (surjective: a dense affine map, no value skipped
  inside its range) with ``int_set`` bounds equal to the domain;
- when TVM cannot analyse the bindings (the CPU rules' last tile ``min(t * 32, 89) + i``
  overlaps the one before it), the bindings are evaluated on every point of the loops they
  use (numpy, at most :data:`MAX_POINTS`) and the distinct points reached are counted.

A block the check cannot decide counts as not covering it.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer, IntervalSet, detect_iter_map
from tvm.sym.iter_affine_map import IterMapLevel

# largest loop space evaluated point by point (int64 arrays of this size, a few per binding)
MAX_POINTS = 1 << 22


def block_nests(func: tirx.PrimFunc) -> list[tuple[s_tir.SBlockRealize, list[tirx.For]]]:
    """Every block realize of ``func`` but the root, with the loops around it, outermost
    first (a walk of the function: no Schedule, so an ill-formed function is read too)."""
    found: list[tuple[s_tir.SBlockRealize, list[tirx.For]]] = []
    loops: list[tirx.For] = []

    def on_for(node, visitor):
        loops.append(node)
        visitor.default_visit(node)
        loops.pop()

    def on_realize(node, visitor):
        if str(node.block.name_hint) != "root":
            found.append((node, list(loops)))
        visitor.default_visit(node)

    tvm_ffi.structural_visit(func.body, ((tirx.For, on_for), (s_tir.SBlockRealize, on_realize)))
    return found


def covers(realize: s_tir.SBlockRealize, loops: list[tirx.For]) -> bool:
    """Whether the instances of ``realize``'s block under ``loops`` are its whole domain."""
    iter_vars = list(realize.block.iter_vars)
    if not iter_vars:
        return True
    values = list(realize.iter_values)
    doms = {f.loop_var: tvm.ir.Range.from_min_extent(f.min, f.extent) for f in loops}
    if _affine_covers(iter_vars, values, doms, realize.predicate):
        return True
    return _enumerated_covers(iter_vars, values, loops, realize.predicate)


def uncovered_blocks(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks of ``func`` that do not compute their whole domain."""
    return [str(r.block.name_hint) for r, loops in block_nests(func) if not covers(r, loops)]


def repeated_blocks(func: tirx.PrimFunc, names: set[str]) -> list[str]:
    """Names (of ``names``) of the blocks of ``func`` some instance of which runs more than
    once, or whose count of instances cannot be told.

    ``reverse_compute_at`` places a consumer whose reads do not map one to one onto the
    anchor's iterations (a strided slice of a softmax) in every iteration that might make
    its input, so an instance runs again in iterations that do not; TVM then allocates the
    intermediate inside the loop (``PlanAndUpdateBufferAllocationLocation``), and the repeat
    reads what another iteration left there (``docs/findings.md``, "Unwritten memory")."""
    found = []
    for realize, loops in block_nests(func):
        name = str(realize.block.name_hint)
        if name in names and _instances(realize, loops) != _domain_size(realize.block):
            found.append(name)
    return found


def _domain_size(block) -> int | None:
    extents = [_int(iv.dom.extent) for iv in block.iter_vars]
    return None if None in extents else int(np.prod(extents, dtype=np.int64))


def _instances(realize, loops) -> int | None:
    """How many times ``realize``'s block runs under ``loops`` (its predicate counted)."""
    extents = [_int(f.extent) for f in loops]
    if None in extents:
        return None
    total = int(np.prod(extents, dtype=np.int64))
    predicate = realize.predicate
    if isinstance(predicate, tirx.IntImm) and predicate.value:
        return total
    grid = _loop_grid(loops, [predicate])
    if grid is None:
        return None
    env, full = grid
    try:
        kept = int(np.broadcast_to(np.asarray(_evaluate(predicate, env), dtype=bool), full).sum())
    except NotImplementedError:
        return None
    used = int(np.prod(full, dtype=np.int64)) if full else 1
    return kept * (total // used)


def unwritten_outputs(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks of a scheduled ``func`` that write one of its parameters where,
    together with the other blocks writing it, they leave part of it unwritten. A block that
    covers its own domain is whole; blocks that each cover a part (a loop partitioned into a
    main part and a tail) are whole when the points they store to make up the buffer.
    ``[]``: every output is written whole."""
    params = {p.__chandle__(): p for p in func.params}
    writers: dict[int, list] = {}
    for realize, loops in block_nests(func):
        for w in realize.block.writes:
            key = w.source.__chandle__()
            if key in params:
                writers.setdefault(key, []).append((realize, loops))
    missing = []
    for key, blocks in writers.items():
        if all(covers(r, loops) for r, loops in blocks):
            continue
        if not _written_whole(params[key], blocks):
            missing += [str(r.block.name_hint) for r, _ in blocks]
    return missing


def _written_whole(buffer, blocks) -> bool:
    """Whether the stores of ``blocks`` to ``buffer`` reach every element of it."""
    shape = [_int(d) for d in buffer.ty.shape] if hasattr(buffer, "ty") else None
    if not shape or None in shape:
        return False
    size = int(np.prod(shape, dtype=np.int64))
    if size > MAX_POINTS:
        return False
    seen = np.zeros(size, dtype=bool)
    for realize, loops in blocks:
        flat = _stored_points(realize, loops, buffer, shape)
        if flat is None:
            return False
        seen[flat] = True
    return bool(seen.all())


def _stored_points(realize, loops, buffer, shape) -> np.ndarray | None:
    """Flat indices of ``buffer`` that ``realize``'s block stores to, over its loops."""
    store = realize.block.body
    if not isinstance(store, tirx.BufferStore) or not store.buffer.same_as(buffer):
        return None
    values = list(realize.iter_values)
    grid = _loop_grid(loops, [*values, realize.predicate])
    if grid is None:
        return None
    env, full = grid
    try:
        keep = np.broadcast_to(np.asarray(_evaluate(realize.predicate, env), dtype=bool), full)
        for iv, v in zip(realize.block.iter_vars, values, strict=True):
            env[iv.var.__chandle__()] = np.broadcast_to(_evaluate(v, env), full)
        flat = np.zeros(full, dtype=np.int64)
        for index, extent in zip(store.indices, shape, strict=True):
            point = np.broadcast_to(_evaluate(index, env), full)
            if point.size and (point.min() < 0 or point.max() >= extent):
                return None
            flat = flat * extent + point
    except NotImplementedError:
        return None
    return flat[keep]


def covers_domain(sch: s_tir.Schedule, block) -> bool:
    """:func:`covers` for ``block`` of the function ``sch`` works on."""
    target = sch.get(block)
    for realize, loops in block_nests(sch.mod["main"]):
        if realize.block.same_as(target):
            return covers(realize, loops)
    return False


def _int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _affine_covers(iter_vars, values, doms, predicate) -> bool:
    result = detect_iter_map(
        values, doms, predicate, IterMapLevel.Surjective, simplify_trivial_iterators=False
    )
    if len(result.indices) != len(values):
        return False
    analyzer = Analyzer()
    intervals = {v: IntervalSet(r.min, r.min + r.extent - 1) for v, r in doms.items()}
    for iv, value in zip(iter_vars, values, strict=True):
        bound = analyzer.int_set(value, intervals)
        lo, hi = _int(bound.min_value), _int(bound.max_value)
        first, extent = _int(iv.dom.min), _int(iv.dom.extent)
        if None in (lo, hi, first, extent) or lo > first or hi < first + extent - 1:
            return False
    return True


def _loop_grid(loops, exprs) -> tuple[dict[int, np.ndarray], tuple[int, ...]] | None:
    """Broadcastable grids of the loops ``exprs`` use (by variable handle) and their full
    shape; None when a loop is not constant or the space is larger than MAX_POINTS."""
    used = _vars_in(exprs)
    axes = [f for f in loops if f.loop_var.__chandle__() in used]
    extents = [_int(f.extent) for f in axes]
    mins = [_int(f.min) for f in axes]
    if None in extents or None in mins:
        return None
    if int(np.prod(extents, dtype=np.int64)) > MAX_POINTS:
        return None
    env = {}
    for k, (f, lo, n) in enumerate(zip(axes, mins, extents, strict=True)):
        shape = [1] * len(axes)
        shape[k] = n
        env[f.loop_var.__chandle__()] = np.arange(lo, lo + n, dtype=np.int64).reshape(shape)
    return env, tuple(extents)


def _enumerated_covers(iter_vars, values, loops, predicate) -> bool:
    """Count the distinct points the bindings reach over the loops they use."""
    grid = _loop_grid(loops, [*values, predicate])
    if grid is None:
        return False
    env, full = grid
    try:
        keep = np.broadcast_to(np.asarray(_evaluate(predicate, env), dtype=bool), full)
        points = [np.broadcast_to(_evaluate(v, env), full)[keep] for v in values]
    except NotImplementedError:
        return False
    domain = []
    for iv, p in zip(iter_vars, points, strict=True):
        first, extent = _int(iv.dom.min), _int(iv.dom.extent)
        if first is None or extent is None:
            return False
        if p.size and (p.min() < first or p.max() >= first + extent):
            return False
        domain.append((p - first, extent))
    total = int(np.prod([e for _, e in domain], dtype=np.int64))
    if total > MAX_POINTS:
        return False
    flat = np.zeros(points[0].shape if points else (), dtype=np.int64)
    for p, extent in domain:
        flat = flat * extent + p
    # every point of the domain reached: marked in one pass (np.unique sorted the points:
    # 0.12 s for each of ConvNeXt-T's dense layers of 1.2 M outputs, 1.5 s of its compile)
    reached = np.zeros(total, dtype=bool)
    reached[flat] = True
    return bool(reached.all())


def _vars_in(exprs) -> set[int]:
    found: set[int] = set()

    def visit(var):
        found.add(var.__chandle__())
        return var

    for e in exprs:
        tvm_ffi.structural_map(e, (tirx.Var, visit))
    return found


_BINARY = {
    tirx.Add: np.add,
    tirx.Sub: np.subtract,
    tirx.Mul: np.multiply,
    tirx.FloorDiv: np.floor_divide,
    tirx.FloorMod: np.mod,
    tirx.Min: np.minimum,
    tirx.Max: np.maximum,
    tirx.LT: np.less,
    tirx.LE: np.less_equal,
    tirx.GT: np.greater,
    tirx.GE: np.greater_equal,
    tirx.EQ: np.equal,
    tirx.NE: np.not_equal,
    tirx.And: np.logical_and,
    tirx.Or: np.logical_or,
}


def _evaluate(expr, env: dict[int, np.ndarray]):
    """An integer TIR expression over the loop grids in ``env`` (by variable handle)."""
    if isinstance(expr, (tirx.IntImm,)):
        return np.int64(expr.value)
    if isinstance(expr, tirx.Var):
        value = env.get(expr.__chandle__())
        if value is None:
            raise NotImplementedError(f"free variable {expr}")
        return value
    op = _BINARY.get(type(expr))
    if op is not None:
        return op(_evaluate(expr.a, env), _evaluate(expr.b, env))
    if isinstance(expr, tirx.Not):
        return np.logical_not(_evaluate(expr.a, env))
    if isinstance(expr, tirx.Cast):
        return _evaluate(expr.value, env)
    if isinstance(expr, tirx.Select):
        cond = _evaluate(expr.condition, env)
        return np.where(cond, _evaluate(expr.true_value, env), _evaluate(expr.false_value, env))
    raise NotImplementedError(type(expr).__name__)
