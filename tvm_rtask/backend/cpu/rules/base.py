"""What every CPU schedule rule shares: the rule interface, the target's vector lanes and the
small block analyses (copy producers, epilogues) the rules are built from.

A rule is a dlight-style class: ``apply(func, target, tunable)`` returns a
:class:`tvm.s_tir.Schedule` whose body is one ``T.parallel`` loop over the operator's outer
spatial tiles (holding every block), or ``None`` when the PrimFunc is not what it schedules.
That shape is what the tuned-kernel cutter (``backend/cpu/tuned.py``) cuts into rTasks.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import TensorLoad
from tvm.s_tir.dlight.analysis import get_sblock_info, normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from ....tir.analysis import block_iterator_kinds
from ....tir.common import root_children, substitute_vars
from ....tir.rules import inline_epilogue_chain, loads_of
from ....tir.schedule import schedule_of
from .fast_math import calls_transcendental

# float32 lanes when the target names no CPU (the brief's AVX2 assumption; plain ``llvm``
# actually emits SSE2, so an 8-lane vector becomes two 4-lane instructions).
DEFAULT_LANES = 8


class CPUScheduleRule(ScheduleRule):
    """A schedule rule for llvm targets (``None`` on any other target)."""

    def is_target_available(self, target: Target) -> bool:
        return target is not None and target.kind.name == "llvm"


_CPU_FEATURES: dict[str, frozenset[str] | None] = {}


def _cpu_features(target: Target) -> frozenset[str] | None:
    """The instruction sets LLVM gives ``target`` (``None`` when this LLVM lacks its
    architecture); kept per target, as every rule asks for every operator."""
    key = str(target)
    if key not in _CPU_FEATURES:
        from tvm.target import codegen

        try:
            features = frozenset(str(f) for f in codegen.llvm_get_cpu_features(target))
        except tvm.error.InternalError:  # LLVMTargetInfo's check: an LLVM without this arch
            features = None
        _CPU_FEATURES[key] = features
    return _CPU_FEATURES[key]


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """Lanes of one vector register for ``dtype_bits``-bit elements: from the instruction
    sets LLVM gives the target's ``mcpu`` / ``mattr`` (AVX-512: 512 bits, AVX: 256, SSE /
    NEON: 128), else :data:`DEFAULT_LANES` when the target names neither.
    (``tvm.target.codegen.llvm_get_vector_width`` answers 512 for every x86 target in TVM
    0.27, ``haswell`` included, so it is not used.)"""
    attrs = target.attrs if target is not None else {}
    if not attrs.get("mcpu", None) and not list(attrs.get("mattr", None) or []):
        return DEFAULT_LANES
    features = _cpu_features(target)
    if features is None:
        return DEFAULT_LANES
    if "avx512f" in features:
        bits = 512
    elif "avx" in features:
        bits = 256
    elif features & {"sse", "neon", "altivec", "simd128", "v"}:
        bits = 128
    else:
        return DEFAULT_LANES
    return max(bits // dtype_bits, 1)


def vector_registers(target: Target) -> int:
    """Vector registers of the target: 32 with AVX-512 (``zmm0-31``), else 16 (AVX2's
    ``ymm0-15``, SSE's and NEON's own sixteen or more: 16 is the safe count)."""
    return registers_for_lanes(vector_lanes(target))


def registers_for_lanes(lanes: int) -> int:
    """:func:`vector_registers` from the float32 lanes alone: 32 for 512-bit vectors."""
    return 32 if lanes * 32 >= 512 else 16


def panel_vectors(registers: int) -> int:
    """Vectors in one weight panel (and the most in one row of a register tile): an eighth
    of the vector registers, 4 with AVX-512's 32, 2 with AVX2's 16. A tile of ``r`` rows of
    ``v`` vectors holds ``r * v`` accumulators, ``v`` weight vectors and one broadcast: six
    rows of two fit AVX2's sixteen registers, where four rows of four (16 accumulators
    alone) spilled them inside the reduction loop (``MatmulKN``, docs/cpu-kernels.md)."""
    return max(1, registers // 8)


FMA_BOUND = 2.0  # FMAs per load past which a register tile runs at the FMA units' pace


def capped_tile_score(a: int, b: int, extent: int, tile: int) -> float:
    """How well an ``a x b`` register tile (``a`` values of one operand meet ``b`` of the
    other: ``a*b`` FMAs per ``a+b`` loads) uses the FMA units, when tiles of ``tile`` cover
    ``extent`` with the last one shifted back: FMAs per load, counted up to
    :data:`FMA_BOUND`, times the share of the computed elements that are useful."""
    computed = -(-extent // tile) * tile
    return min(a * b / (a + b), FMA_BOUND) * extent / computed


def flatten_conv_pixels(sch: s_tir.Schedule, conv, width: int) -> list:
    """The loops of convolution block ``conv`` (``n, f, y, x`` spatial, ``rc, ry, rx``
    reduction) with its output pixels on one axis ``p = y*width + x``, as ``[n, f, y, p,
    rc, ry, rx]`` where ``y`` is now a unit loop (a 1x1 convolution's GEMM form)."""
    sch.transform_block_layout(
        conv, lambda n_, f_, y_, x_, c_, i_, j_: (n_, f_, y_ * width + x_, c_, i_, j_)
    )
    n, f, x, rc, ry, rx = sch.get_loops(conv)
    y = sch.add_unit_loop(x)
    sch.reorder(y, x)
    return [n, f, y, x, rc, ry, rx]


def vectorize_whole(sch: s_tir.Schedule, loop, lanes: int) -> None:
    """Split ``loop`` into vectors of ``lanes`` and vectorize them, when its extent is
    constant and a multiple of ``lanes`` (else it is left to LLVM's loop vectorizer)."""
    extent = extent_of(sch, loop)
    if extent is not None and extent % lanes == 0:
        _, vec = sch.split(loop, [None, lanes])
        sch.vectorize(vec)


def is_copy(sch: s_tir.Schedule, block) -> bool:
    """The block stores a plain load of another buffer (a padding block without padding)."""
    stmt = sch.get(block)
    body = stmt.body
    return (
        isinstance(body, tirx.BufferStore)
        and isinstance(body.value, TensorLoad)
        and len(stmt.reads) == 1
        and stmt.init is None
    )


def is_injective(sch: s_tir.Schedule, block) -> bool:
    info = get_sblock_info(sch, block)
    return info.is_injective()


def single_reduction(sch: s_tir.Schedule):
    """The one root block that is not injective, with every other root block injective; or
    None."""
    found = None
    for block in root_children(sch):
        if is_injective(sch, block):
            continue
        if found is not None:
            return None
        found = block
    return found


def only_injective_blocks(func: tirx.PrimFunc) -> bool:
    """Every block of ``func`` has only data-parallel iterators: no rule that schedules a
    reduction applies (checked before a schedule is built: the reduction rules built 1,216 for
    DenseNet-121's 198 operators, most of them elementwise)."""
    return block_iterator_kinds(func) <= {tirx.IterVar.DataPar}


def float32_reduction(rule: CPUScheduleRule, func, target: Target, matches):
    """``(schedule, block, loops, extents)``: the one reduction block of ``func``, its loops
    and their extents, when ``rule`` applies to ``target``, ``matches(sch, block)`` accepts
    the block, it writes float32 and every loop has a constant extent; else None. Every
    other root block must be injective."""
    if not isinstance(func, tirx.PrimFunc) or not rule.is_target_available(target):
        return None
    if only_injective_blocks(func):
        return None
    sch = schedule_of(func)
    block = single_reduction(sch)
    if block is None or not matches(sch, block):
        return None
    if str(sch.get(block).writes[0].source.dtype) != "float32":
        return None
    loops = sch.get_loops(block)
    extents = [extent_of(sch, loop) for loop in loops]
    if any(e is None for e in extents):
        return None
    return sch, block, loops, extents


def normalized_reductions(rule: CPUScheduleRule, func, target: Target):
    """``(schedule, infos, reductions)``: ``func``'s blocks as dlight normalizes them (one
    loop per block iterator) and the non-injective ones among them, when ``rule`` applies
    to ``target``; None when ``func`` is not a PrimFunc or normalization fails."""
    if not isinstance(func, tirx.PrimFunc) or not rule.is_target_available(target):
        return None
    if only_injective_blocks(func):
        return None
    sch = schedule_of(func)
    infos = normalize_prim_func(sch)
    if not infos:
        return None
    return sch, infos, [info for info in infos if not info.is_injective()]


def split_producers(sch: s_tir.Schedule, block) -> list | None:
    """Inline the producers of ``block`` that are plain copies; the others (padding) are
    returned, or None when one of them has producers of its own."""
    pads = []
    for producer in sch.get_producers(block):
        if is_copy(sch, producer):
            sch.compute_inline(producer)
        else:
            pads.append(producer)
    if any(sch.get_producers(p) for p in pads):
        return None
    return pads


def inline_epilogue(sch: s_tir.Schedule, writeback) -> bool:
    """Inline every injective consumer chain of ``writeback`` into it (bias add, relu, ...).
    True when nothing is left after it at the root."""
    return not inline_epilogue_chain(sch, writeback)


def epilogue_tail(sch: s_tir.Schedule, writeback):
    """The epilogue of ``writeback`` that cannot be inlined into it, as one block to compute
    in the same parallel tile (``reverse_compute_at``): the consumer that stops
    :func:`inline_epilogue_chain`, with its own consumer chain inlined into it. Returns
    ``(True, None)`` when the whole epilogue was inlined, ``(True, block)`` for such a tail,
    ``(False, None)`` when the epilogue is neither (several consumers, a reduction)."""
    rest = inline_epilogue_chain(sch, writeback)
    if not rest:
        return True, None
    if len(rest) != 1:
        return False, None
    tail = rest[0]
    if not is_injective(sch, tail) or sch.get(tail).init is not None:
        return False, None
    if any(not sch.get(p).same_as(sch.get(writeback)) for p in sch.get_producers(tail)):
        return False, None
    if inline_epilogue_chain(sch, tail):
        return False, None
    if not _reads_in_place(sch, tail, writeback):
        return False, None
    return True, tail


def _reads_in_place(sch: s_tir.Schedule, tail, writeback) -> bool:
    """Whether ``tail`` reads what ``writeback`` writes only at its own spatial iterators, in
    the order of the buffer's axes (or at a constant): computed in a parallel tile, it then
    reads only what the tile wrote. A relayout (a reshape or transpose stitched after the
    convolution) reads elements other tiles write, before they are written (wrong values;
    found by the differential fuzzer)."""
    buffer = sch.get(writeback).writes[0].source
    stmt = sch.get(tail)
    spatial = [iv.var for iv in stmt.iter_vars if int(iv.iter_type) == 0]
    loads = loads_of(stmt.body, buffer)
    # an axis read at a constant is a broadcast (the squeeze-and-excitation scale [n, c, 0, 0]
    # over the pixels): every instance of the tile reads the one element the tile wrote
    return bool(loads) and all(
        len(load.indices) == len(spatial)
        and all(
            i.same_as(v) or isinstance(i, tirx.IntImm)
            for i, v in zip(load.indices, spatial, strict=True)
        )
        for load in loads
    )


def split_divisible(extent: int, wanted: int) -> int:
    """The largest divisor of ``extent`` that is at most ``wanted``."""
    for factor in range(min(wanted, extent), 0, -1):
        if extent % factor == 0:
            return factor
    return 1


def extent_of(sch: s_tir.Schedule, loop) -> int | None:
    extent = sch.get(loop).extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


def loop_var_of(sch: s_tir.Schedule, loop) -> tirx.Var:
    return sch.get(loop).loop_var


def loops_below(sch: s_tir.Schedule, block, loop) -> list:
    """The loops of ``block`` nested inside ``loop``, outermost first."""
    loops = sch.get_loops(block)
    stmt = sch.get(loop)
    return loops[[sch.get(lp).same_as(stmt) for lp in loops].index(True) + 1 :]


def finish_tile_blocks(sch: s_tir.Schedule, blocks, tile_loop, lanes: int) -> None:
    """The loops of ``blocks`` (a register tile's init and write-back) under ``tile_loop``:
    the innermost vectorised when it is ``lanes`` wide (and not yet; a multiple of ``lanes``
    becomes a loop of vectors), the others unrolled, so
    that the tile's accumulators stay in registers; a write-back whose epilogue computes a
    transcendental function keeps its loops (:func:`unroll_cheap`)."""
    for block in blocks:
        loops = loops_below(sch, block, tile_loop)
        if loops and sch.get(loops[-1]).kind != tirx.ForKind.VECTORIZED:
            extent = extent_of(sch, loops[-1])
            if extent == lanes:
                sch.vectorize(loops[-1])
            elif lanes > 1 and extent is not None and extent > lanes:
                # a flattened pixel axis of several vectors (a 1x1 convolution's tile): a
                # loop of vectors, not a scalar loop for LLVM's vectorizer; not unrolled
                # (unrolled, accumulators left the registers: docs/compile-time.md)
                vectorize_whole(sch, loops[-1], lanes)
        unroll_cheap(sch, block, loops[:-1])


def unroll_cheap(sch: s_tir.Schedule, block, loops) -> None:
    """Unroll ``loops`` unless ``block`` calls ``exp``, ``erf``, ``sigmoid`` or ``tanh`` (a
    SiLU, GELU or softmax epilogue): rewritten by :mod:`.fast_math`, each is dozens of vector
    instructions, and unrolled copies of them cost LLVM more time than the loop costs the
    kernel (ConvNeXt-T's GELU dense layers: 0.85 s of LLVM each unrolled, 0.28 s as loops)."""
    if calls_transcendental(sch.get(block).body):
        return
    for loop in loops:
        sch.unroll(loop)


def uses_any(expr, variables) -> bool:
    """``expr`` reads one of ``variables`` (loop or block iterator variables)."""
    free = tirx.analysis.undefined_vars(expr, [])
    return any(v.same_as(u) for v in variables for u in free)


def overlap_last_tile(func: tirx.PrimFunc, tile_var: tirx.Var, tile: int, extent: int):
    """``func`` with the last tile of a split that does not divide ``extent`` shifted back to
    end at ``extent``: in every block binding ``tile_var * tile`` becomes ``min(tile_var *
    tile, extent - tile)``, and the predicates that mention ``tile_var`` (the split's tail
    guard) are dropped. The last tile then overlaps the one before it instead of running
    with a predicate, which TVM 0.27's ``VectorizeLoop`` scalarizes (docs/findings.md).
    Correct when each element under the tile loop is computed from the inputs alone, so that
    computing it twice writes the same value. Apply after the last schedule primitive: the
    bindings are no longer affine. None when a binding uses ``tile_var`` otherwise, or the
    extent is shorter than one tile."""
    if extent < tile:
        return None
    dtype = str(tile_var.ty)
    start = tirx.Mul(tile_var, tirx.IntImm(dtype, tile))
    shifted = tirx.Min(start, tirx.IntImm(dtype, extent - tile))
    placeholder = tirx.Var("tile_start", dtype)

    def mul(node):
        if isinstance(node.a, tirx.Var) and node.a.same_as(tile_var):
            if isinstance(node.b, tirx.IntImm) and int(node.b.value) == tile:
                return placeholder
        return node

    failed = []

    def realize(node):
        values = []
        for value in node.iter_values:
            value = tvm_ffi.structural_map(value, (tirx.Mul, mul))
            if uses_any(value, [tile_var]):
                failed.append(value)
            values.append(
                tvm_ffi.structural_map(
                    value, (tirx.Var, lambda v: shifted if v.same_as(placeholder) else v)
                )
            )
        predicate = node.predicate
        if uses_any(predicate, [tile_var]):
            predicate = tirx.const(True, "bool")
        return s_tir.SBlockRealize(values, predicate, node.block)

    body = tvm_ffi.structural_map(func.body, (s_tir.SBlockRealize, realize))
    return None if failed else func.with_body(body)


def _only_loop(body, loop_var: tirx.Var):
    found = []

    def find(node):
        if node.loop_var.same_as(loop_var):
            found.append(node)
        return node

    tvm_ffi.structural_map(body, (tirx.For, find))
    return found[0] if len(found) == 1 else None


def narrow_last_tile(func: tirx.PrimFunc, tile_var: tirx.Var, tile: int, extent: int, lanes: int):
    """``func`` (its last tile shifted back by :func:`overlap_last_tile`) with the serial
    tile loop over ``tile_var`` run for every tile but the last, then the last tile once,
    computing only the vectors that reach past the other tiles: where tiles of ``tile`` do
    not divide ``extent``, the shifted last tile recomputed most of the one before it (196
    pixels in tiles of 4 vectors: 256 computed), now one vector more (208).

    The tail is a copy of the loop body with ``tile_var`` set to the last tile, a predicate
    in each block on its position along the tiled axis (in a vectorized loop: the vector's
    first lane, so the predicate of an unrolled loop of vectors folds to a constant; in
    other loops, such as the write-back: the element, only those the other tiles did not
    write) and buffers of its own for what the function allocates (accumulators, input
    strips: each loop keeps its compact, aligned buffer). None when the loop is not one
    serial loop of constant extent 2 or more."""
    loop = _only_loop(func.body, tile_var)
    if loop is None or loop.kind != tirx.ForKind.SERIAL:
        return None
    if not isinstance(loop.extent, tirx.IntImm) or int(loop.extent.value) < 2:
        return None
    tiles = int(loop.extent.value)
    dtype = str(tile_var.ty)
    last = {tile_var: tirx.IntImm(dtype, tiles - 1)}
    vector_vars = []

    def vectorized(node):
        if node.kind == tirx.ForKind.VECTORIZED:
            vector_vars.append(node.loop_var)
        return node

    tvm_ffi.structural_map(loop.body, (tirx.For, vectorized))
    lane_zero = {v: tirx.IntImm(str(v.ty), 0) for v in vector_vars}

    done = (tiles - 1) * tile  # what the other tiles computed: [0, done)

    def realize(node):
        pixel = [v for v in node.iter_values if uses_any(v, [tile_var])]
        if not pixel:
            return node
        start = substitute_vars(pixel[0], {**last, **lane_zero})
        dtype_of = str(start.ty)
        if uses_any(pixel[0], vector_vars):  # a vector: any of its lanes past ``done``
            keep = tirx.GT(start, tirx.IntImm(dtype_of, done - lanes))
        else:  # one element: only those not written yet
            keep = tirx.GE(start, tirx.IntImm(dtype_of, done))
        predicate = node.predicate
        is_true = isinstance(predicate, tirx.IntImm) and int(predicate.value) == 1
        values = [substitute_vars(v, last) for v in node.iter_values]
        predicate = keep if is_true else tirx.And(predicate, keep)
        return s_tir.SBlockRealize(values, predicate, node.block)

    tail = substitute_vars(tvm_ffi.structural_map(loop.body, (s_tir.SBlockRealize, realize)), last)
    allocated: list = []

    def allocations(node):
        allocated.extend(node.alloc_buffers)
        return node

    tvm_ffi.structural_map(func.body, (s_tir.SBlock, allocations))
    used: list = []

    def seen(buffer):
        used.append(buffer)
        return buffer

    tvm_ffi.structural_map(tail, (tirx.Buffer, seen))
    # a buffer also used outside the tile loop (an intermediate the rest of the epilogue reads
    # after it) is shared: a copy of its own left the tail's elements where nothing read them
    # (garbage in a stitched conv + channel shuffle; found by the differential fuzzer)
    nothing = tirx.Evaluate(tirx.IntImm("int32", 0))
    rest = tvm_ffi.structural_map(
        func.body, (tirx.For, lambda n: nothing if n.same_as(loop) else n)
    )
    shared = [a for a in allocated if _used_in(rest, a)]
    copies: list = []
    for buffer in allocated:
        if any(b.same_as(buffer) for b in shared):
            continue
        if any(u.same_as(buffer) for u in used) and not any(o.same_as(buffer) for o, _ in copies):
            copy = tirx.decl_buffer(
                buffer.shape, buffer.dtype, f"{buffer.name}_tail", scope=buffer.scope()
            )
            copies.append((buffer, copy))

    def own(buffer):
        return next((c for o, c in copies if buffer.same_as(o)), buffer)

    tail = tvm_ffi.structural_map(tail, (tirx.Buffer, own))
    head = tirx.For(
        loop.loop_var,
        loop.min,
        tirx.IntImm(dtype, tiles - 1),
        loop.kind,
        loop.body,
        loop.thread_binding,
        loop.annotations,
    )
    both = tirx.SeqStmt([head, tail])
    body = tvm_ffi.structural_map(func.body, (tirx.For, lambda n: both if n.same_as(loop) else n))
    if not isinstance(body, s_tir.SBlockRealize):
        return None
    root = body.block
    root = s_tir.SBlock(
        root.iter_vars,
        root.reads,
        root.writes,
        root.name_hint,
        root.body,
        root.init,
        [*root.alloc_buffers, *(c for _, c in copies)],
        root.match_buffers,
        root.annotations,
    )
    body = s_tir.SBlockRealize(body.iter_values, body.predicate, root)
    # the tail's loop and block variables are the head's: each defined once again
    return tirx.transform.ConvertSSA()(tvm.IRModule({"main": func.with_body(body)}))["main"]


def _used_in(stmt, buffer) -> bool:
    """Whether ``stmt`` loads or stores ``buffer`` (its allocation alone does not count)."""
    stores = []

    def store(node):
        if node.buffer.same_as(buffer):
            stores.append(node)
        return node

    tvm_ffi.structural_map(stmt, (tirx.BufferStore, store))
    return bool(stores or loads_of(stmt, buffer))


def with_last_tile_shifted(sch: s_tir.Schedule, tile_loop, tile: int, extent: int):
    """A rule's result: ``sch`` when tiles of ``tile`` divide ``extent``, else its function
    with the last tile of ``tile_loop`` shifted back to end at ``extent``
    (:func:`overlap_last_tile`; None when it cannot be)."""
    if extent % tile == 0:
        return sch
    return overlap_last_tile(sch.mod["main"], loop_var_of(sch, tile_loop), tile, extent)


def deinterleave_columns(sch: s_tir.Schedule, copy, stride: int) -> None:
    """Lay the buffer that ``copy`` writes (a padding block, or a plain copy of the input)
    out with the columns of each phase of ``stride`` together: column ``w`` goes to ``[w %
    s, w // s]``, so that ``x*s + rx`` is column ``x + rx//s`` of phase ``rx % s`` and a
    vector of strided outputs reads one contiguous vector instead of a gather. The copy
    then walks the new layout, each phase's columns written in turn: walking the old one
    wrote every element to another phase (a 3x3/2 depthwise kernel, 96 channels at 112
    columns: 1150 -> 427 us)."""
    sch.transform_layout(
        copy,
        ("write", 0),
        lambda n_, c_, h_, w_: (n_, c_, h_, w_ % stride, w_ // stride),
        pad_value=0.0,  # an odd width leaves one unused column in a phase
    )
    stmt = sch.get(copy)
    # a ``cache_read`` copy already iterates over the new layout; an odd width cannot be
    # walked phase by phase with an affine map
    if len(stmt.iter_vars) == 4 and extent_of(sch, sch.get_loops(copy)[-1]) % stride == 0:
        sch.transform_block_layout(
            copy, lambda n_, c_, h_, w_: (n_, c_, h_, w_ % stride, w_ // stride)
        )
