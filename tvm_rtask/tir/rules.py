"""Trying schedule rules, for every target (issue 29), and the check the rules make before
reverse-inlining an epilogue (issue 27).

The contract is TVM dlight's: a rule's ``apply(func, target, tunable)`` returns a schedule
(or a PrimFunc it rewrote), or ``None`` when it does not apply. :func:`try_rules` tries the
rules in order and returns the first result. A rule that raises instead (a bug in the rule,
or a schedule primitive failing on a PrimFunc the rule did not foresee, including TVM's
``InternalError`` / ``TVMError`` / ``ScheduleError``) must not fail a compile: the error is
noted as a fallback (``tvm_rtask.fallbacks.note_fallback``: one WARNING line on the
``tvm_rtask`` logger with the operator's and the rule's names, and an entry in the plan's
``fallbacks``), and the next rule (in the end the target's fallback schedule) is tried.

:func:`can_reverse_inline` says whether ``reverse_compute_inline`` may be called on an
epilogue block. TVM 0.27's primitive does not check everything it needs: a consumer that
reads its producer at a constant index (the squeeze-and-excitation scale ``s[n, c, 0, 0]``
broadcast over ``x[n, c, h, w]``) leaves some of the consumer's iterators without a value
in the producer's, and the primitive stops in an ``InternalError`` ("Cannot dispatch a null
expression") instead of a ``ScheduleError``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import TensorLoad
from tvm.target import Target

from ..fallbacks import RULE_SKIPPED, note_fallback
from .coverage import unwritten_outputs

LOGGER = logging.getLogger("tvm_rtask")

_DATA_PAR = 0  # tirx.IterVar's kind of a spatial iterator


def operator_name(func: tirx.PrimFunc, name: str | None = None) -> str:
    """``name``, else the PrimFunc's ``global_symbol``, else its blocks' names (fused
    PrimFuncs are private: ``conv2d_nchw+T_add+compute``)."""
    if name:
        return name
    if func.attrs is not None and "global_symbol" in func.attrs:
        return str(func.attrs["global_symbol"])
    names: list[str] = []

    def visit(block):
        names.append(str(block.name_hint))
        return block

    tvm_ffi.structural_map(func.body, (s_tir.SBlock, visit))
    return "+".join(n for n in names if n != "root") or "<PrimFunc>"


# lines of TVMScript a TVM error may carry after its message ("The function is" + the whole
# PrimFunc, from LOG(FATAL) << func): never the line that says what went wrong
_CODE_LINE = ("#", "@", "def ", "class ", "with ", "for ", "if ", "T.")
_SCRIPT_TAIL = re.compile(r"\s*(The function is\s*)?# from tvm\.script\b.*$")


def one_line(error: BaseException) -> str:
    """The line of a (TVM) error that says what went wrong, with the error's type: a
    ``Check failed`` or ``Error message:`` line, else the last line that is not code."""
    raw = [line for line in str(error).splitlines() if line.strip()]
    lines = [line.strip() for line in raw]
    line = next((ln for ln in lines if ln.startswith(("Error message:", "Check failed"))), None)
    if line is None:
        prose = [ln.strip() for ln in raw if ln[0] not in " \t" and not ln.startswith(_CODE_LINE)]
        line = _SCRIPT_TAIL.sub("", (prose or lines or [""])[-1])
    line = line.removeprefix("Error message:").strip()
    if len(line) > 240:
        line = line[:237] + "..."
    return f"{type(error).__name__}: {line}"


def try_rules(
    func: tirx.PrimFunc, target: Target, rules: Iterable, name: str | None = None
) -> tuple[object, tirx.PrimFunc] | None:
    """``(rule, scheduled PrimFunc)`` of the first of ``rules`` that applies to ``func``, or
    None when none does. A rule that raises is noted (see the module docstring) and skipped."""
    for rule in rules:
        try:
            result = rule.apply(func, target, False)
            if result is None:
                continue
            scheduled = result.mod["main"] if isinstance(result, s_tir.Schedule) else result
            if not isinstance(scheduled, tirx.PrimFunc):
                raise TypeError(f"returned a {type(result).__name__}, not a schedule")
            unwritten = unwritten_outputs(scheduled)
            if unwritten:  # a moved epilogue lost part of its domain (a padding border)
                raise ValueError(f"the schedule leaves part of {', '.join(unwritten)} unwritten")
        except Exception as error:  # a rule must never fail a compile: noted, skipped
            note_fallback(
                RULE_SKIPPED,
                operator_name(func, name),
                f"{type(rule).__name__} failed: {one_line(error)}",
            )
            continue
        return rule, scheduled
    return None


def loads_of(expr, buffer) -> list:
    """Every load of ``buffer`` in ``expr`` (a statement or an expression)."""
    found = []

    def visit(load):
        if load.source.same_as(buffer):
            found.append(load)
        return load

    tvm_ffi.structural_map(expr, (TensorLoad, visit))
    return found


def _int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _trivial_predicate(sch: s_tir.Schedule, block) -> bool:
    loops = sch.get_loops(block)
    if not loops:
        return True
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return False
    return _int(realize.predicate) == 1


def _writes_whole(block: s_tir.SBlock, shape: list) -> bool:
    """The block's store is indexed by its spatial iterators, each over a whole dimension."""
    region = block.writes[0].region
    if len(region) != len(shape):
        return False
    domains = {iv.var: iv.dom for iv in block.iter_vars if int(iv.iter_type) == _DATA_PAR}
    for r, extent in zip(region, shape, strict=True):
        dom = next((d for v, d in domains.items() if r.min.same_as(v)), None)
        if dom is None or _int(r.extent) != 1 or extent is None:
            return False
        if _int(dom.min) != 0 or _int(dom.extent) != extent:
            return False
    return True


def can_reverse_inline(sch: s_tir.Schedule, producer, consumer) -> bool:
    """Whether ``reverse_compute_inline(consumer)`` into ``producer`` is legal: ``consumer``
    is the only consumer of ``producer`` and has no other producer in the function, it is a
    spatial block with one store, no init and no predicate, and every load of the producer's
    buffer in it is indexed by all of the consumer's iterators, in the same order as the
    buffer's dimensions (no broadcast, no transpose), over the buffer's whole extent, which
    the producer writes whole."""
    prod, cons = sch.get(producer), sch.get(consumer)
    consumers = sch.get_consumers(producer)
    if len(consumers) != 1 or not sch.get(consumers[0]).same_as(cons):
        return False
    if any(not sch.get(p).same_as(prod) for p in sch.get_producers(consumer)):
        return False
    if len(prod.writes) != 1 or len(cons.writes) != 1 or cons.init is not None:
        return False
    if not isinstance(cons.body, tirx.BufferStore) or not _trivial_predicate(sch, consumer):
        return False
    if any(int(iv.iter_type) != _DATA_PAR for iv in cons.iter_vars):
        return False
    buffer = prod.writes[0].source
    shape = [_int(d) for d in buffer.shape]
    if not _writes_whole(prod, shape):
        return False
    loads = loads_of(cons.body, buffer)
    if not loads or len(cons.iter_vars) != len(shape):
        return False
    for load in loads:
        if len(load.indices) != len(shape):
            return False
        for index, iv, extent in zip(load.indices, cons.iter_vars, shape, strict=True):
            if not index.same_as(iv.var):
                return False
            if _int(iv.dom.min) != 0 or _int(iv.dom.extent) != extent:
                return False
    return True


def can_compute_inline(sch: s_tir.Schedule, block) -> bool:
    """Whether ``compute_inline(block)`` (into its consumers) is legal and leaves nothing
    behind: a spatial block with one store to an intermediate buffer (not a parameter of the
    function), indexed by all its iterators in order over the whole buffer, no init, no
    predicate, and consumers to inline it into."""
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or stmt.init is not None or not sch.get_consumers(block):
        return False
    if not isinstance(stmt.body, tirx.BufferStore) or not _trivial_predicate(sch, block):
        return False
    if any(int(iv.iter_type) != _DATA_PAR for iv in stmt.iter_vars):
        return False
    buffer = stmt.writes[0].source
    if any(buffer.same_as(param) for param in sch.mod["main"].params):
        return False
    shape = [_int(d) for d in buffer.shape]
    indices = stmt.body.indices
    if len(indices) != len(stmt.iter_vars) or not _writes_whole(stmt, shape):
        return False
    return all(i.same_as(iv.var) for i, iv in zip(indices, stmt.iter_vars, strict=True))


def inline_epilogue_chain(sch: s_tir.Schedule, writeback) -> list:
    """Inline the epilogue of ``writeback`` into it (bias add, batch norm, relu, sigmoid,
    SiLU's ``x * sigmoid(x)``, hard-swish's ``x * clip(x + 3, 0, 6) / 6``, a residual add)
    while each step is legal, checked before the primitive is called
    (:mod:`tvm_rtask.tir.rules`: TVM 0.27's ``reverse_compute_inline`` can stop in an
    ``InternalError`` instead of refusing). A consumer that has consumers of its own is
    first inlined into them (``compute_inline``), so that an epilogue that reads the
    write-back twice (hard-swish) becomes one block. Returns the consumers of ``writeback``
    left (``[]``: the whole epilogue is inlined), e.g. the multiply by a
    squeeze-and-excitation scale broadcast over the pixels, which cannot be inlined into
    the producer of the scale."""
    while True:
        consumers = sch.get_consumers(writeback)
        if not consumers:
            return []
        if len(consumers) == 1 and can_reverse_inline(sch, writeback, consumers[0]):
            try:
                sch.reverse_compute_inline(consumers[0])
                continue
            except s_tir.ScheduleError:  # refused after all: the schedule is unchanged
                return list(consumers)
        if not _inline_forward(sch, consumers):
            return list(consumers)


def _inline_forward(sch: s_tir.Schedule, blocks) -> bool:
    """``compute_inline`` the first of ``blocks`` that can be inlined into its consumers."""
    for block in blocks:
        if can_compute_inline(sch, block):
            try:
                sch.compute_inline(block)
                return True
            except s_tir.ScheduleError:
                continue
    return False
