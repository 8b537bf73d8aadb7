"""The operator graph FusionStitching reasons about: one node per binding of ``main``'s block.

Nodes carry their kind (from TVM's op pattern kinds, set by ``AnnotateTIROpPattern``), the
bytes of their output, and reachability as Python-int bitsets, so that convexity and
"no new dependency" checks of a candidate pattern are a few integer operations. Bindings
that are not fusable (tuple plumbing, packed calls, multi-output or symbolic kernels) stay
nodes: they carry dependencies but never join a pattern.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.ir.expr import Constant

from .dataflow import as_tir_call, handle, main_dataflow, static_shape, used_vars

# TVM's OpPatternKind (include/tvm/relax/op_attr_types.h):
# elementwise 0, broadcast 1, injective 2, comm-reduce 3, out-elemwise-fusable 4, tuple 7,
# opaque 8. Kinds 0-3 are memory-bound; 4 (matmul, conv, pooling) is compute-bound.
LIGHT, REDUCE, COMPUTE, OPAQUE = "light", "reduce", "compute", "opaque"
_KINDS = {0: LIGHT, 1: LIGHT, 2: LIGHT, 3: REDUCE, 4: COMPUTE}


@dataclass
class Node:
    """One binding: what it reads, what it costs in memory, and how it may be fused."""

    index: int
    name: str
    kind: str
    func: str = ""  # callee PrimFunc name ("" when not a call_tir)
    out_bytes: int = 0
    escaping: bool = False  # visible after the dataflow block (a non-dataflow Var)
    preds: list[int] = field(default_factory=list)
    succs: list[int] = field(default_factory=list)
    inputs: dict[int, int] = field(default_factory=dict)  # external tensor handle -> bytes

    @property
    def fusable(self) -> bool:
        return self.kind != OPAQUE

    @property
    def memory_bound(self) -> bool:
        return self.kind in (LIGHT, REDUCE)


def tensor_bytes(ty) -> int:
    """Bytes of a static-shape tensor type (0 when not static)."""
    shape = static_shape(ty)
    if shape is None:
        return 0
    size = 1
    for dim in shape:
        size *= dim
    return size * tvm.runtime.DataType(ty.dtype).bits // 8


def _kind(mod: tvm.IRModule, value: relax.Expr) -> tuple[str, str]:
    """(kind, callee name) of a binding; anything the fused PrimFunc could not hold is opaque."""
    call = as_tir_call(value)
    if call is None or call.has_tir_vars:
        return OPAQUE, ""
    name = call.gvar.name_hint
    prim = mod[call.gvar]
    if not isinstance(prim, tvm.tirx.PrimFunc) or static_shape(call.out_ty) is None:
        return OPAQUE, name
    for arg in call.args:
        if not isinstance(arg, (relax.Var, Constant)) or static_shape(arg.ty) is None:
            return OPAQUE, name
    return _KINDS.get(int(prim.attrs.get("op_pattern", 8)), OPAQUE), name


class OpGraph:
    """Nodes of ``main``'s largest dataflow block with reachability and wave windows."""

    def __init__(self, mod: tvm.IRModule) -> None:
        found = main_dataflow(mod["main"])
        self.block_index, self.block = found if found is not None else (-1, None)
        self.nodes: list[Node] = []
        if self.block is None:
            return
        producer: dict[int, int] = {}
        for i, binding in enumerate(self.block.bindings):
            kind, func = _kind(mod, binding.value)
            node = Node(i, binding.var.name, kind, func)
            node.escaping = not isinstance(binding.var, relax.DataflowVar)
            if kind != OPAQUE:
                node.out_bytes = tensor_bytes(as_tir_call(binding.value).out_ty)
            for var in used_vars(binding.value):
                j = producer.get(handle(var))
                if j is None:
                    node.inputs[handle(var)] = tensor_bytes(var.ty)
                elif j not in node.preds:
                    node.preds.append(j)
                    self.nodes[j].succs.append(i)
            call = as_tir_call(binding.value)
            for arg in call.args if call is not None else []:
                if isinstance(arg, Constant):
                    node.inputs[handle(arg)] = tensor_bytes(arg.ty)
            producer[handle(binding.var)] = i
            self.nodes.append(node)
        self._reachability()
        self._windows()

    def __len__(self) -> int:
        return len(self.nodes)

    def _reachability(self) -> None:
        """``desc[i]`` / ``anc[i]``: bitsets of strict descendants / ancestors of node i."""
        n = len(self.nodes)
        self.anc = [0] * n
        for node in self.nodes:  # bindings are in topological order
            for p in node.preds:
                self.anc[node.index] |= self.anc[p] | (1 << p)
        self.desc = [0] * n
        for node in reversed(self.nodes):
            for s in node.succs:
                self.desc[node.index] |= self.desc[s] | (1 << s)

    def _windows(self) -> None:
        """ASAP and ALAP wave of every node: an operator can run in any wave in between."""
        n = len(self.nodes)
        self.asap = [0] * n
        for node in self.nodes:
            self.asap[node.index] = max((self.asap[p] + 1 for p in node.preds), default=0)
        depth = max(self.asap, default=0)
        self.alap = [depth] * n
        for node in reversed(self.nodes):
            if node.succs:
                self.alap[node.index] = min(self.alap[s] - 1 for s in node.succs)

    def reaches(self, a: int, b: int) -> bool:
        """A path from a to b in the original graph (a != b)."""
        return bool((self.desc[a] >> b) & 1)

    def independent(self, a: int, b: int) -> bool:
        return a != b and not self.reaches(a, b) and not self.reaches(b, a)

    def windows_overlap(self, a: int, b: int) -> bool:
        """Some wave schedule runs a and b in the same wave."""
        return max(self.asap[a], self.asap[b]) <= min(self.alap[a], self.alap[b])
