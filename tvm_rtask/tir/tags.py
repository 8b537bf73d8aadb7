"""Tags on TIR blocks that survive fusion: a way for a Relax pass to mark an operator and
find it again after ``FuseOps``/``FuseTIR`` renamed and merged its PrimFunc.

Block annotations are kept by ``FuseTIR`` (which copies blocks), unlike PrimFunc attributes.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx

from .schedule import schedule_of


def annotate_blocks(func: tirx.PrimFunc, prefix: str, key: str, value: str) -> tirx.PrimFunc | None:
    """``func`` with every block whose name starts with ``prefix`` annotated ``key=value``;
    None when no block has such a name."""
    sch = schedule_of(func)
    names: list[str] = []

    def visit(node) -> None:
        if isinstance(node, s_tir.SBlock) and node.name_hint.startswith(prefix):
            names.append(node.name_hint)

    tvm_ffi.structural_walk(func.body, visit)
    if not names:
        return None
    for name in names:
        sch.annotate(sch.get_sblock(name), key, value)
    return sch.mod["main"]


def block_annotations(func: tirx.PrimFunc, key: str) -> list[str]:
    """The values of annotation ``key`` on the blocks of ``func``, in walk order."""
    found: list[str] = []

    def visit(node) -> None:
        if isinstance(node, s_tir.SBlock) and key in node.annotations:
            found.append(str(node.annotations[key]))

    tvm_ffi.structural_walk(func.body, visit)
    return found
