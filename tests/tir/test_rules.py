"""tvm_rtask.tir.rules: trying schedule rules (issue 29: a rule that raises is logged and
skipped, never fails a compile) and the legality checks made before inlining an epilogue
(issue 27: TVM 0.27's reverse_compute_inline stops in an InternalError on the
squeeze-and-excitation multiply)."""

from __future__ import annotations

import logging

import pytest
import tvm
from tvm import relax, s_tir

from tests.backend.cpu.rules.common import (
    LLVM,
    assert_close,
    conv_module,
    fused_func,
    random_args,
    run,
)
from tvm_rtask.backend.cpu.rules import RULE_ATTR, Conv2dNCHW, schedule_cpu_func
from tvm_rtask.tir.rules import (
    can_compute_inline,
    can_reverse_inline,
    inline_epilogue_chain,
    one_line,
    operator_name,
    try_rules,
)


def se_scale_module(channels=16, squeeze=4, size=14):
    """The SE block's second 1x1 conv on the pooled 1x1 map, bias, sigmoid, and the multiply
    of the main branch by that scale: one fused PrimFunc whose epilogue reads the conv's
    output at ``[n, c, 0, 0]``."""
    bb = relax.BlockBuilder()
    s = relax.Var("s", relax.TensorType((1, squeeze, 1, 1), "float32"))
    w = relax.Var("w", relax.TensorType((channels, squeeze, 1, 1), "float32"))
    b = relax.Var("b", relax.TensorType((1, channels, 1, 1), "float32"))
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    with bb.function("main", [s, w, b, x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(s, w))
            y = bb.emit(relax.op.sigmoid(relax.op.add(y, b)))
            out = bb.emit_output(relax.op.multiply(x, y))
        bb.emit_func_output(out)
    return bb.get()


class Raising(Conv2dNCHW):
    """A rule that hits TVM's InternalError: the multiply reverse-inlined blindly."""

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        acc = sch.cache_write(sch.get_sblock("conv2d_nchw"), 0, "local")
        while sch.get_consumers(acc):
            sch.reverse_compute_inline(sch.get_consumers(acc)[0])
        return sch


class Declining(Conv2dNCHW):
    def apply(self, func, target, tunable):
        return None


@pytest.fixture(scope="module")
def se_func():
    return fused_func(se_scale_module())


def _epilogue(sch):
    acc = sch.cache_write(sch.get_sblock("conv2d_nchw"), 0, "local")
    return acc


def test_the_broadcast_multiply_is_not_reverse_inlined(se_func):
    sch = s_tir.Schedule(se_func)
    acc = _epilogue(sch)
    rest = inline_epilogue_chain(sch, acc)  # bias and sigmoid inlined, the multiply left
    assert [sch.get(b).name_hint for b in rest] == ["T_multiply"]
    assert not can_reverse_inline(sch, acc, rest[0])
    with pytest.raises((tvm.error.InternalError, s_tir.ScheduleError)):
        sch.reverse_compute_inline(rest[0])  # what the check spares the rules


def test_a_plain_epilogue_is_reverse_inlined():
    func = fused_func(conv_module(8, 16, 12, 3, 1, 1))  # bias add, relu
    sch = s_tir.Schedule(func)
    acc = _epilogue(sch)
    (consumer,) = sch.get_consumers(acc)
    assert can_reverse_inline(sch, acc, consumer)
    assert not can_compute_inline(sch, sch.get_sblock("conv2d_nchw"))  # a reduction
    assert inline_epilogue_chain(sch, acc) == []


def test_a_raising_rule_is_logged_and_the_next_rule_applies(se_func, caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        scheduled = schedule_cpu_func(se_func, LLVM, [Raising(), Conv2dNCHW()], name="op_se")
    assert scheduled is not None and str(scheduled.attrs[RULE_ATTR]) == "Conv2dNCHW"
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelno == logging.WARNING and record.name == "tvm_rtask"
    assert "Raising" in message and "op_se" in message and "\n" not in message
    assert "InternalError" in message and "null expression" in message
    args = random_args(se_func)
    expected = run(se_func, [a.copy() for a in args])
    assert_close(run(scheduled, [a.copy() for a in args]), expected)


def test_no_rule_applies_is_none_and_silent(se_func, caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        assert schedule_cpu_func(se_func, LLVM, [Declining()]) is None
        assert schedule_cpu_func(se_func, LLVM, [Raising()]) is None  # logged, then None
    assert len(caplog.records) == 1
    assert try_rules(se_func, LLVM, []) is None


def test_a_raising_rule_does_not_fail_a_compile(monkeypatch, caplog):
    """Through the whole pipeline: the rule raises on the SE PrimFunc, the warning names it
    and the operator, the plan lists the fallback, the model compiles (the next rule or the
    unscheduled TIR) and runs."""
    import numpy as np

    import tvm_rtask
    from tvm_rtask.backend.cpu import rules
    from tvm_rtask.fallbacks import RULE_SKIPPED

    monkeypatch.setattr(rules, "default_rules", lambda: [Raising(), Conv2dNCHW()])
    mod = se_scale_module()
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        ex, plan = tvm_rtask.compile_with_plan(mod, "llvm", policy="wavefront", num_veu=2)
    warned = [r.getMessage() for r in caplog.records if "Raising" in r.getMessage()]
    assert warned
    # the warning names the operator by its fused function, as the module calls it
    functions = {gv.name_hint for gv in tvm_rtask.relax_passes.RTaskPrepare()(mod).functions}
    assert any(f"{RULE_SKIPPED} for {name}: " in m for m in warned for name in functions), warned
    skipped = [f for f in plan.report()["fallbacks"] if f["kind"] == RULE_SKIPPED]
    assert skipped and all(f["subject"] in functions for f in skipped), skipped
    assert all(f["reason"].startswith("Raising failed: InternalError") for f in skipped)
    # the plan in the lowered module says so too, read back from its JSON
    again = tvm_rtask.core.Plan.from_json(plan.to_json())
    assert again.fallbacks == plan.fallbacks
    rng = np.random.default_rng(0)
    args = [
        rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
        for p in mod["main"].params
    ]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    s, w, b, x = args
    scale = 1 / (1 + np.exp(-(np.einsum("fc,c->f", w[:, :, 0, 0], s[0, :, 0, 0]) + b[0, :, 0, 0])))
    assert_close(out.numpy(), x * scale[None, :, None, None], 1e-5)


def test_one_line_and_operator_name(se_func):
    try:
        Raising().apply(se_func, LLVM, False)
    except Exception as error:  # noqa: BLE001
        line = one_line(error)
    assert "\n" not in line and len(line) < 300
    assert "T_multiply" in operator_name(se_func)
    assert operator_name(se_func, "fused_x") == "fused_x"


def test_one_line_skips_the_tvmscript_an_error_carries():
    """LOG(FATAL) << func: the message, then the whole PrimFunc; the line kept is the
    message's, not a line of the function."""
    error = tvm.error.InternalError(
        "The buffer parameter T_add has dtype T.int64. The function is # from tvm.script\n"
        "# from tvm.tirx.layout import Axis\n\n@T.prim_func(private=True)\n"
        'def main(a: T.Buffer((T.int64(4),), "int64")):\n    T_add[v0] = a[v0] + a[v0]'
    )
    assert one_line(error) == "InternalError: The buffer parameter T_add has dtype T.int64."
    plain = ValueError("first\nsecond: the reason")
    assert one_line(plain) == "ValueError: second: the reason"
