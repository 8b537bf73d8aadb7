"""ONNX ``Sum`` as additions: TVM 0.27's ONNX frontend imports ``Sum(a, b, ...)`` with static
shapes as ``sum(stack([broadcast_to(a, s), broadcast_to(b, s), ...]), axis=0)``. After
legalization that is a copy of every input into a stacked buffer and a reduction over it, two
kernels that FuseOps cannot fuse into the convolution before them (the stack is a join, the
sum a reduction). ResNet-50 from the ONNX model zoo adds its residuals that way: per-operator
against ONNX Runtime, the conv + batch norm + Sum + relu of a bottleneck block ran 1.3-1.5x
ONNX Runtime's time where the same conv without the Sum ran 1.0-1.1x, and the Sum alone
6-10x (docs/cpu-kernels.md, "Relax rewrites").

:class:`StackedSumToAdd` rewrites ``sum(stack(xs, axis=0), axis=[0])`` (no keepdims) into
``x0 + x1 + ...`` when every ``xs[i]`` (a ``broadcast_to`` to the output's shape is looked
through when its input already has that shape) has the output's shape and dtype: the same
values, summed in the same order (float addition of two terms is exact to the same
rounding; three or more are added left to right, as the reduction does). Anything else is left
alone. The residual add then fuses into the convolution's epilogue.

``prepare_pipeline`` (``fuse.py``) runs it on the imported Relax module before
``LegalizeOps``, followed by ``DeadCodeElimination`` to drop the unused ``broadcast_to`` /
``stack`` bindings.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_exprs import bound_value, op_name, rewrite_functions, static_shape_of


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def _bound(self, expr):
        return bound_value(self, expr)

    def _term(self, expr, shape, dtype):
        """``expr`` as a term of the sum (a same-shape ``broadcast_to`` looked through), or
        None when it is not of the output's shape and dtype."""
        value = self._bound(expr)
        if op_name(value) == "relax.broadcast_to" and static_shape_of(value.args[0]) == shape:
            expr = value.args[0]
        if static_shape_of(expr) != shape or str(expr.ty.dtype) != dtype:
            return None
        return expr

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.sum" or call.attrs.keepdims:
            return call
        axis = call.attrs.axis
        if axis is None or [int(a) for a in axis] != [0]:
            return call
        stacked = self._bound(call.args[0])
        if op_name(stacked) != "relax.stack" or int(stacked.attrs.axis) != 0:
            return call
        items = self._bound(stacked.args[0])
        if not isinstance(items, relax.Tuple) or len(items.fields) < 2:
            return call
        shape, dtype = static_shape_of(call), str(getattr(call.ty, "dtype", ""))
        if shape is None:
            return call
        terms = [self._term(item, shape, dtype) for item in items.fields]
        if any(t is None for t in terms):
            return call
        total = terms[0]
        for term in terms[1:]:
            total = relax.op.add(total, term)
        return total


@tvm.transform.module_pass(opt_level=0, name="StackedSumToAdd")
class StackedSumToAdd:
    """``sum(stack(xs), axis=0)`` of same-shape inputs as ``xs[0] + xs[1] + ...``; see the
    module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_functions(mod, _Rewriter(mod))
