"""TIR helpers shared by the backends: program tensors as buffers, variable substitution."""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir, tirx
from tvm.error import InternalError
from tvm.s_tir.dlight.analysis import get_sblock_info
from tvm.tirx import IntImm

from .coverage import repeated_blocks, uncovered_blocks, unwritten_outputs


@dataclass
class TensorDecl:
    """A tensor of the program: a parameter of the persistent function or a workspace."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def tensor_buffer(tensor: TensorDecl, narrow: bool = False) -> tirx.Var:
    """A buffer with int64 extents, as Relax's legalized kernels declare theirs; int32 ones
    with ``narrow`` when the tensor has fewer than 2**31 elements (GPU kernels: an int64
    extent makes every flattened index 64-bit).

    Its name must be a C identifier: CUDA source names kernel parameters after buffers, and
    model inputs such as ONNX's ``gpu_0/data_0`` are not.
    """
    numel = 1
    for n in tensor.shape:
        numel *= int(n)
    dtype = "int32" if narrow and numel < 2**31 else "int64"
    shape = [IntImm(dtype, int(n)) for n in tensor.shape]
    name = re.sub(r"\W", "_", tensor.name)
    if not name or name[0].isdigit():
        name = f"t_{name}"
    return tirx.decl_buffer(shape, tensor.dtype, name)


def substitute_vars(node, mapping: dict) -> object:
    """Replace every occurrence of the Vars in ``mapping`` (buffers included)."""
    by_handle = {id_of(k): v for k, v in mapping.items()}

    def visit(var):
        return by_handle.get(id_of(var), var)

    return tvm_ffi.structural_map(node, (tirx.Var, visit))


def id_of(obj) -> int:
    """A stable identity for an FFI object (``==`` on Vars builds an expression)."""
    return obj.__chandle__()


def root_children(sch: s_tir.Schedule) -> list:
    return sch.get_child_blocks(sch.get_sblock("root"))


def _leading_spatial_loops(sch: s_tir.Schedule, block) -> list:
    """Outermost loops of ``block`` that each bind one spatial iterator, outermost first."""
    info = get_sblock_info(sch, block)
    loops = sch.get_loops(block)
    prefix = []
    for loop, it in zip(loops, info.iters, strict=False):
        if it.kind != "S" or not sch.get(loop).same_as(sch.get(it.loop_rv)):
            break
        prefix.append(loop)
    return prefix


def gather_covering(sch: s_tir.Schedule) -> tuple[s_tir.Schedule, list] | None:
    """Every root block of ``sch`` under one spatial loop nest, each block still computing its
    whole iteration domain: ``(schedule, loops)`` (the schedule is a copy, ``sch`` is left as
    it is) or None when no placement keeps every block whole.

    The nest is the anchor's (:func:`gather_under_anchor`). ``reverse_compute_at`` computes
    a moved consumer only over the instances that read what the anchor's loop makes, so an
    instance that reads none of it is lost: a ``nn.pad`` fused after a convolution writes a
    border that reads no convolution output, and that border was never written (garbage and
    NaN in a real model, ``docs/findings.md``, "Unwritten memory"). When a block no longer
    covers its domain, or a moved consumer runs an instance more than once (its reads do not
    map one to one onto the anchor's iterations, and the repeats read stale values:
    :func:`~.coverage.repeated_blocks`), the nest is the last block's instead and every other
    block is moved before it with ``compute_at``, which computes the region its consumers
    need (only that: a producer of an intermediate may compute part of its domain, so there
    only the function's outputs must be written whole).
    """
    blocks = root_children(sch)
    consumers = {str(sch.get(b).name_hint) for b in blocks[_anchor_index(sch, blocks) + 1 :]}

    def anchored_whole(func) -> bool:
        return not uncovered_blocks(func) and not repeated_blocks(func, consumers)

    def outputs_whole(func) -> bool:
        return not unwritten_outputs(func)

    for gather, whole in (
        (gather_under_anchor, anchored_whole),
        (gather_under_last, outputs_whole),
    ):
        trial = sch.copy()
        try:
            loops = gather(trial)
        # a primitive's own check may fail as an InternalError instead (reverse_compute_at's
        # iter-map check on a strided consumer, seen by the fuzzer): that trial is dropped
        # and the next placement is tried on a fresh copy
        except (s_tir.ScheduleError, InternalError):
            continue
        if loops and whole(trial.mod["main"]):
            return trial, loops
    return None


def gather_under_anchor(sch: s_tir.Schedule) -> list | None:
    """Put every root block under the anchor's spatial loops; return those loops or None.

    The anchor is the first block that is not injective (the reduction that cannot be
    inlined); consumers are moved after it with ``reverse_compute_at`` and producers before it
    with ``compute_at``, each at the deepest spatial loop that accepts it. A moved consumer
    may no longer cover its domain: :func:`gather_covering` checks.
    """
    blocks = root_children(sch)
    return _gather_under(sch, blocks, _anchor_index(sch, blocks))


def _anchor_index(sch: s_tir.Schedule, blocks: list) -> int:
    """The first root block that is not injective (0 when all are)."""
    infos = [get_sblock_info(sch, b) for b in blocks]
    return next((i for i, b in enumerate(infos) if not b.is_injective()), 0)


def gather_under_last(sch: s_tir.Schedule) -> list | None:
    """Put every root block under the last block's spatial loops with ``compute_at``; return
    those loops or None. Every block then computes what the last one needs of it."""
    blocks = root_children(sch)
    return _gather_under(sch, blocks, len(blocks) - 1)


def _gather_under(sch: s_tir.Schedule, blocks: list, anchor_index: int) -> list | None:
    anchor = blocks[anchor_index]
    prefix = _leading_spatial_loops(sch, anchor)
    if not prefix:
        return None
    if len(blocks) == 1:
        return prefix
    if not _linked_to_anchor(sch, blocks, anchor_index):
        return None
    depth = len(prefix)
    # producers nearest first (compute_at wants a block's consumers already under the loop),
    # then consumers nearest first (reverse_compute_at wants its producers there)
    order = [*range(anchor_index - 1, -1, -1), *range(anchor_index + 1, len(blocks))]
    for i in order:
        block = blocks[i]
        move = sch.reverse_compute_at if i > anchor_index else sch.compute_at
        for d in range(depth - 1, -1, -1):
            try:
                move(block, prefix[d], preserve_unit_loops=True)
            except s_tir.ScheduleError:
                continue
            depth = d + 1
            break
        else:
            return None
    return prefix[:depth]


def _buffers(regions) -> set[int]:
    return {r.source.__chandle__() for r in regions}


def _linked_to_anchor(sch: s_tir.Schedule, blocks: list, anchor_index: int) -> bool:
    """Whether every block after the anchor consumes (through the blocks before it) what the
    anchor writes, and every block before it produces what the anchor (or a later producer)
    reads.

    ``compute_at`` / ``reverse_compute_at`` compute a moved block only over the region the
    anchor's chunk needs or makes. A block unrelated to the anchor, e.g. a second pooling of
    another input that a final add joins with the first, is still accepted by
    ``reverse_compute_at`` but then computed per chunk over the wrong region: rTasks read
    values other rTasks write (seen on NASNet with fused pooling branches). Such a kernel
    stays one rTask.
    """
    stmts = [sch.get(b) for b in blocks]
    made = _buffers(stmts[anchor_index].writes)
    for stmt in stmts[anchor_index + 1 :]:
        if not _buffers(stmt.reads) & made:
            return False
        made |= _buffers(stmt.writes)
    needed = _buffers(stmts[anchor_index].reads)
    for stmt in reversed(stmts[:anchor_index]):
        if not _buffers(stmt.writes) & needed:
            return False
        needed |= _buffers(stmt.reads)
    return True
