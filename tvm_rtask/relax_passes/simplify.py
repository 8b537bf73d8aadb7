"""Small Relax clean-ups before planning."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple_get_item, rewrite_call, wildcard


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
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gvar] = rewrite_call(pattern, lambda _, m: m[data], func)
        return relax.transform.DeadCodeElimination()(mod)
