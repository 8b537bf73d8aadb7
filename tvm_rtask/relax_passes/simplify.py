"""Small Relax clean-ups before planning."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.dpl import is_op, is_tuple_get_item, rewrite_call, wildcard

from ..relax_exprs import constant_array, op_name, rewrite_functions
from .dataflow import as_tir_call, handle, static_shape


@tvm.transform.module_pass(opt_level=0, name="RemoveInferenceDropout")
class RemoveInferenceDropout:
    """``dropout(x)[0]`` is ``x`` at inference.

    ONNX importers keep Dropout as ``R.nn.dropout`` returning ``(output, mask)``; its
    legalized kernel has two outputs, which cannot be an rKernel and so would split the
    rProgram around it. The unused mask then disappears with dead-code elimination.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        data = wildcard()
        pattern = is_tuple_get_item(is_op("relax.nn.dropout")(data), 0)
        mod = mod.clone()  # a pass leaves the module it was given as it was
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gvar] = rewrite_call(pattern, lambda _, m: m[data], func)
        return relax.transform.DeadCodeElimination()(mod)


@relax.expr_functor.mutator
class _DivisionRewriter(relax.PyExprMutator):
    """``divide(x, c)`` with ``c`` a float32 constant without zeros as ``multiply(x, 1/c)``."""

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.divide" or not isinstance(call.args[1], Constant):
            return call
        value = constant_array(call.args[1])
        if value.dtype != np.float32 or not np.all(np.isfinite(value)) or not value.all():
            return call
        reciprocal = relax.const((np.float32(1.0) / value).astype("float32"))
        return relax.op.multiply(call.args[0], reciprocal)


@tvm.transform.module_pass(opt_level=0, name="DivideByConstantAsMultiply")
class DivideByConstantAsMultiply:
    """``x / c`` with ``c`` a float32 constant without zeros as ``x * (1 / c)``.

    Exporters write GELU as ``x * 0.5 * (1 + erf(x / 1.4142135))`` (torch's exporter: ViT,
    ConvNeXt, Swin): in a dense layer's epilogue, one vector division per element (about ten
    times an FMA's cost on AVX-512) beside the erf polynomial. The product differs from the
    quotient by at most one rounding (exact for powers of two), as in any compiler's
    reciprocal rewrite under fast math. A mutator, not TVM's ``rewrite_call`` with
    ``is_const()``: that took 1.04 s on ViT-B/16 (86 M weights in constants), this 7 ms.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_functions(mod, _DivisionRewriter(mod))


@relax.expr_functor.mutator
class _ConstantCallFolder(relax.PyExprMutator):
    """Evaluates ``call_tir`` bindings whose tensor arguments are all constants."""

    def __init__(self, mod: tvm.IRModule, library: tvm.runtime.Module | None) -> None:
        super().__init__(mod)
        self.mod = mod
        self.folded: dict[int, Constant] = {}
        self.library = library
        self.functions: dict[str, object] = {}

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.folded.get(handle(var), var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.folded.get(handle(var), var)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self.visit_expr(binding.value)
        # a variable bound to a constant (a weight that FoldConstantLayoutTransforms reshaped)
        # is that constant to every call that reads it
        constant = value if isinstance(value, Constant) else self._evaluate(value)
        if constant is None:
            self.builder_.emit_normalized(relax.VarBinding(binding.var, value))
        else:
            self.folded[handle(binding.var)] = constant

    def _evaluate(self, value: relax.Expr) -> Constant | None:
        call = as_tir_call(value)
        if call is None or call.has_tir_vars:
            return None
        if not all(isinstance(a, Constant) for a in call.args):  # none at all: constant too
            return None
        shape = static_shape(call.out_ty)
        if shape is None:
            return None
        if self.library is None:
            return None
        out = tvm.runtime.empty(shape, call.out_ty.dtype, tvm.cpu())
        self._function(call.gvar)(*(a.value for a in call.args), out)
        return relax.const(out)

    def _function(self, gvar: tvm.ir.GlobalVar):
        """The built PrimFunc, looked up once: each lookup in the JIT costs milliseconds."""
        name = _symbol(gvar)
        if name not in self.functions:
            self.functions[name] = self.library[name]
        return self.functions[name]


def _symbol(gvar: tvm.ir.GlobalVar) -> str:
    return f"rtask_fold_{gvar.name_hint}"


def _foldable_functions(mod: tvm.IRModule) -> list[tvm.ir.GlobalVar]:
    """PrimFuncs that some ``call_tir`` reaches with only constants (or values that fold
    before it) as arguments, so that one llvm build serves every fold. A call without
    arguments is constant too: ONNX shape computations legalize to ``shape_to_tensor``
    calls of none, and the ``reshape`` / ``less`` chains after them were left to Relax's
    ``FoldConstant``, one build each (148 builds, 3.9 s of ViT-B/16's 5.4 s preparation)."""
    found: dict[str, tvm.ir.GlobalVar] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        constant: set[int] = set()
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding, relax.VarBinding) and isinstance(binding.value, Constant):
                    constant.add(handle(binding.var))
                    continue
                call = as_tir_call(binding.value)
                if call is None or call.has_tir_vars:
                    continue
                if all(
                    isinstance(a, Constant) or (isinstance(a, relax.Var) and handle(a) in constant)
                    for a in call.args
                ) and isinstance(mod[call.gvar], tvm.tirx.PrimFunc):
                    constant.add(handle(binding.var))
                    found[call.gvar.name_hint] = call.gvar
    return list(found.values())


# each folded function runs once, on weights: LLVM's optimisation would cost more time than
# it saves (SqueezeNet 1.1: 0.8 -> 0.5 s for the pass; the values are the same)
FOLD_TARGET = {"kind": "llvm", "opt-level": 0}


@tvm.transform.module_pass(opt_level=0, name="FoldConstantCalls")
class FoldConstantCalls:
    """``call_tir`` with only constant inputs replaced by its value, each PrimFunc built once.

    Relax's ``FoldConstant`` builds a PrimFunc for every call site it folds; ONNX models
    apply the same ``expand_dims`` or ``reshape`` to hundreds of weights, so that took 30 s
    on ShuffleNet. This pass builds every PrimFunc it needs in one llvm module and evaluates
    every call of it; run ``FoldConstant`` after it for whatever else is foldable.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = mod.clone()  # a pass leaves the module it was given as it was
        gvars = _foldable_functions(mod)
        library = None
        if gvars:
            funcs = {_symbol(g): mod[g].with_attr("global_symbol", _symbol(g)) for g in gvars}
            library = tvm.compile(tvm.IRModule(funcs), target=FOLD_TARGET)  # one LLVM run for all
        folder = _ConstantCallFolder(mod, library)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gvar] = folder.visit_expr(func)
        return relax.transform.DeadCodeElimination()(mod)
