"""Read regions of blocks that read one buffer through several parameters, made whole again.

``concat((y, y))`` legalizes to a PrimFunc with two parameters, one per tuple field, each with
its own read region (``A[.., v - 1]`` and ``B[.., v]``). When ``FuseTIR`` fuses it with the
operator that makes ``y``, both parameters become the one intermediate buffer and the block
keeps a single read region of it (the first: ``y[.., v - 1]``). A schedule trusts that
region: ``compute_at`` then computes the producer only where ``v - 1`` is in range, and the
other half of the concatenation reads memory nobody wrote (``docs/findings.md``, "Unwritten
memory", found by the differential fuzzer with ``fusion="stitch"``).

:class:`MergedParamReads` runs after ``FuseTIR``: in every block that loads one buffer at
more than one index tuple, the read regions are derived again from the block's body with
TVM's own ``get_sblock_read_write_region``, which covers every load. Other blocks, and the
write regions, are left as they are.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import TensorLoad


def _loads_differ(block: s_tir.SBlock) -> bool:
    """Whether ``block`` loads some buffer at two different index tuples."""
    seen: dict[int, list] = {}
    differ = False

    def visit(load):
        nonlocal differ
        indices = seen.setdefault(load.source.__chandle__(), [])
        if not any(tvm_ffi.structural_equal(list(load.indices), i) for i in indices):
            indices.append(list(load.indices))
            differ = differ or len(indices) > 1
        return load

    tvm_ffi.structural_map(block.body, (TensorLoad, visit))
    return differ


def _outer_buffers(func: tirx.PrimFunc) -> dict:
    """The buffers a block of ``func`` may read: parameters and blocks' allocations."""
    buffers = {p: p for p in func.params}

    def visit(block):
        for b in block.alloc_buffers:
            buffers[b] = b
        return block

    tvm_ffi.structural_map(func.body, (s_tir.SBlock, visit))
    return buffers


def merge_param_reads(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the read regions of every block that loads a buffer at several index
    tuples derived from its body (``func`` itself when there is none)."""
    buffers = None

    def visit(block):
        nonlocal buffers
        if str(block.name_hint) == "root" or not _loads_differ(block):
            return block
        if buffers is None:
            buffers = _outer_buffers(func)
        reads, _writes = s_tir.analysis.get_sblock_read_write_region(block, buffers)
        return s_tir.SBlock(
            block.iter_vars,
            reads,
            block.writes,
            block.name_hint,
            block.body,
            block.init,
            block.alloc_buffers,
            block.match_buffers,
            block.annotations,
        )

    return tvm_ffi.structural_map(func, (s_tir.SBlock, visit))


@tvm.transform.module_pass(opt_level=0, name="MergedParamReads")
class MergedParamReads:
    """:func:`merge_param_reads` on every PrimFunc of the module."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gvar, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                new = merge_param_reads(func)
                if not new.same_as(func):
                    updates[gvar] = new
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod
