"""Operator fusion that keeps independent branches independent.

TVM's ``FuseOps`` groups an operator with the producers it post-dominates. When an operator
joins two *independent* branches (``add(matmul(x, w1), matmul(x, w2))``) it fuses the join into
one branch, and the other branch becomes a predecessor of that group: the two matmuls can no
longer run side by side (TVM_NOTES.md). Rammer needs those waves.

``FuseKeepingWaves`` runs TVM's own ``FuseOps`` + ``FuseTIR`` but first marks every such join as
opaque (op pattern 8) for that call site only, so nothing is fused into or through it. A join
whose producers are ordered (one is an ancestor of the other, as in softmax or a residual add
after its own branch) loses no parallelism and stays fusable. So does a join whose branches,
since they parted, hold only elementwise and injective operators: GELU's
``0.5 x * (1 + erf(x / sqrt 2))`` joins two such branches of one ``x``, and kept apart it was
four passes over memory after the dense layer instead of its epilogue (DeiT-Tiny: 21% of
the time).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..backend import as_target, get_backend
from ..errors import remember_errors
from ..fallbacks import collecting_fallbacks
from ..options import RTaskOptions, resolve_options
from .dataflow import as_tir_call, handle, with_own_callees
from .fallback_notes import with_notes
from .fold_layout_transforms import FoldConstantLayoutTransforms
from .fold_pad import FoldPadIntoConv
from .merged_reads import MergedParamReads
from .simplify import DivideByConstantAsMultiply, FoldConstantCalls, RemoveInferenceDropout
from .stacked_sum import StackedSumToAdd
from .stitch import StitchFusion
from .stitch_graph import OpGraph

# TVM's op patterns (relax.transform.AnnotateTIROpPattern)
BROADCAST, INJECTIVE, OUT_EWISE_FUSABLE, OPAQUE = 1, 2, 4, 8


def _is_light(mod: tvm.IRModule, value: relax.Expr) -> bool:
    """An elementwise, broadcast or injective kernel call, or no kernel at all (a tuple, a
    shape): nothing a branch of its own would gain from running beside another."""
    call = as_tir_call(value)
    if call is None:
        return not isinstance(value, relax.Call)
    return _pattern(mod, call) <= INJECTIVE


def _pattern(mod: tvm.IRModule, call) -> int:
    return int(mod[call.gvar].attrs.get("op_pattern", OPAQUE))


def _independent_joins(graph: OpGraph, mod: tvm.IRModule) -> set[int]:
    """Indices of call_tir bindings that read from two producers unordered by ancestry, with
    an operator other than a light one (:func:`_is_light`) on either branch since the
    branches parted."""
    bindings = graph.block.bindings
    heavy = 0  # bitset of the bindings that are not light
    for i, binding in enumerate(bindings):
        if not _is_light(mod, binding.value):
            heavy |= 1 << i
    joins = set()
    for node in graph.nodes:
        if as_tir_call(bindings[node.index].value) is None:
            continue
        for a in node.preds:
            for b in node.preds:
                if a < b and not (graph.anc[b] >> a) & 1:
                    # the two branches since they parted: what each has and the other lacks
                    own_a, own_b = graph.anc[a] | (1 << a), graph.anc[b] | (1 << b)
                    if ((own_a ^ own_b) & heavy) != 0:
                        joins.add(node.index)
    return joins


def _epilogue_producers(graph: OpGraph, mod: tvm.IRModule) -> set[int]:
    """Indices of the bindings that end a convolution's or matmul's epilogue: an
    out-ewise-fusable call (pattern 4), or an elementwise or injective call whose one tensor
    input is such a binding's only use. FuseOps makes each one group with its anchor, so a
    join of two of them fuses into one anchor's epilogue and leaves the other whole; a join
    with anything else (a ReLU of a parameter) would pull that into the group, where the
    anchor's schedule rule no longer applies."""
    bindings = graph.block.bindings
    bound = {handle(b.var) for b in bindings}
    ends: set[int] = set()
    for node in graph.nodes:
        call = as_tir_call(bindings[node.index].value)
        if call is None:
            continue
        pattern = _pattern(mod, call)
        if pattern == OUT_EWISE_FUSABLE:
            ends.add(node.index)
        elif pattern <= INJECTIVE and sum(handle(a) in bound for a in call.args) == 1:
            (source,) = node.preds
            if source in ends and len(graph.nodes[source].succs) == 1:
                ends.add(node.index)
    return ends


def _mark_joins_opaque(mod: tvm.IRModule, fuse_elementwise_joins: bool = False) -> tvm.IRModule:
    graph = OpGraph(mod)
    if graph.block is None:
        return mod
    callees = {}
    epilogues = _epilogue_producers(graph, mod) if fuse_elementwise_joins else set()
    for i in sorted(_independent_joins(graph, mod)):
        call = as_tir_call(graph.block.bindings[i].value)
        prim = mod[call.gvar]
        pattern = int(prim.attrs.get("op_pattern", OPAQUE))
        if pattern == OPAQUE:
            continue
        # an elementwise join (a residual add) as a convolution is to FuseOps: nothing fuses
        # into it, its elementwise consumers (the ReLU after it) fuse after it; other joins
        # (concatenations, whose producers write into their blocks) stay whole; with
        # fuse_elementwise_joins, one of two epilogues is left to FuseOps to fuse into
        if pattern <= BROADCAST and all(p in epilogues for p in graph.nodes[i].preds):
            continue
        joined = OUT_EWISE_FUSABLE if pattern <= BROADCAST else OPAQUE
        callees[i] = (prim.with_attr("op_pattern", joined), f"{call.gvar.name_hint}_join")
    return with_own_callees(mod, graph.block_index, callees)


@tvm.transform.module_pass(opt_level=0, name="FuseKeepingWaves")
class FuseKeepingWaves:
    """FuseOps + FuseTIR without chaining independent branches (expects annotated patterns).

    ``fuse_elementwise_joins``: leave elementwise joins (residual adds) of convolutions' or
    matmuls' epilogues to FuseOps, which fuses each into one producer's epilogue
    (:func:`_epilogue_producers`). On a CPU every operator of a wave runs on every
    vEU anyway, and the join kept apart is a pass over memory (ResNet-50's first: the two
    3.2 MB branch outputs read back, 0.6 ms of 40 at 2 threads)."""

    def __init__(self, fuse_elementwise_joins: bool = False) -> None:
        self.fuse_elementwise_joins = fuse_elementwise_joins

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = _mark_joins_opaque(mod, self.fuse_elementwise_joins)
        mod = relax.transform.FuseOps()(mod)
        mod = MergedParamReads()(relax.transform.FuseTIR()(mod))
        return relax.transform.DeadCodeElimination()(mod)


@tvm.transform.module_pass(opt_level=0, name="SafeNames")
class SafeNames:
    """Names that are not C identifiers made safe again after LegalizeOps: kernels' buffer
    parameters are named after Relax variables, and the binding ``frontend.load`` adds to
    rename an input (``gpu_0/data_0``) may have been folded away by then (seen on the ONNX
    ResNet-50: the CUDA source did not compile)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from ..frontend.names import make_names_safe

        return make_names_safe(mod)


def prepare_pipeline(
    fusion: str = "fuseops", device: str = "cpu", target_passes=()
) -> tvm.transform.Pass:
    """Legalize, annotate, fold constants and fuse: the Relax module the planner expects.

    ``fusion`` is ``"fuseops"`` (TVM's FuseOps kept from chaining branches), ``"stitch"``
    (FusionStitching, scored for ``device``'s table entry) or ``"none"``. ``target_passes``:
    the backend's own rewrites of Relax operators (``Backend.prepare_passes``), run before
    legalization.
    """
    passes = [
        RemoveInferenceDropout(),
        # ``(y, mean, var)[0]`` as ``y``: the ONNX importer's BatchNormalization returns a
        # tuple, and FuseOps does not fuse through it (DenseNet-121: every batch norm and
        # its ReLU were two passes over memory)
        relax.transform.CanonicalizeBindings(),
        # ONNX Sum (residual adds) as additions that fuse into the producer's epilogue
        StackedSumToAdd(),
        # an explicit zero pad of a convolution's input as the convolution's own padding
        FoldPadIntoConv(),
        # GELU's x / sqrt(2) as a multiply: no vector division per element in the epilogue
        DivideByConstantAsMultiply(),
        *target_passes,
        FoldConstantLayoutTransforms(),
        relax.transform.DeadCodeElimination(),
        relax.transform.LegalizeOps(),
        SafeNames(),
        relax.transform.AnnotateTIROpPattern(),
        FoldConstantCalls(),
        relax.transform.FoldConstant(),
    ]
    if fusion == "fuseops":
        passes.append(FuseKeepingWaves(fuse_elementwise_joins=device == "cpu"))
    elif fusion == "stitch":
        passes.append(StitchFusion(device))
    elif fusion != "none":
        from ..errors import OptionError
        from ..options import FUSIONS

        raise OptionError(f"fusion must be one of {FUSIONS}, not {fusion!r}")
    return tvm.transform.Sequential(passes, name="RTaskPrepare")


@tvm.transform.module_pass(opt_level=0, name="RTaskPrepare")
class RTaskPrepare:
    """Legalize, annotate patterns, fold constants and fuse with the ``fusion`` option;
    FusionStitching (``fusion="stitch"``) scores its patterns with the device the options
    name for ``target`` (``device=``, else the target's default).

    ``options``: an :class:`RTaskOptions` already resolved (what the pipeline's phases pass);
    otherwise ``fusion`` and any other option keywords (``device=``) are resolved with the
    PassContext the pass runs in."""

    def __init__(
        self,
        fusion: str | None = None,
        target="llvm",
        options: RTaskOptions | None = None,
        **more,
    ) -> None:
        self.target = as_target(target)
        self.options = options
        self.explicit = {"fusion": fusion, **more}

    @remember_errors
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        backend = get_backend(self.target)
        options = self.options or resolve_options(self.explicit, ctx.config, backend)
        device = backend.device_spec(options).name
        # what the backend's rewrites fall back on reaches the plan through the module
        with collecting_fallbacks() as notes:
            prepared = prepare_pipeline(options.fusion, device, backend.prepare_passes(options))(
                mod
            )
        return with_notes(prepared, notes)
