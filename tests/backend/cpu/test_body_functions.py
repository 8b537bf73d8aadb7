"""The llvm dispatcher calls one body function per distinct rKernel (compile time, issue 27)."""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import relax as R

import tvm_rtask
import tvm_rtask.backend.cpu.backend as cpu_backend
from tvm_rtask.backend.cpu import dispatch


@tvm.script.ir_module
class Twice:
    """The same matmul kernel twice (one body function), each split among both vEUs."""

    @R.function
    def main(
        x: R.Tensor((64, 64), "float32"),
        w1: R.Tensor((64, 64), "float32"),
        w2: R.Tensor((64, 64), "float32"),
    ):
        with R.dataflow():
            a = R.matmul(x, w1)
            b = R.nn.relu(a)
            c = R.matmul(b, w2)
            R.output(c)
        return c


def _calls(func) -> list[str]:
    names = []
    tvm_ffi.structural_map(func, (tvm.ir.GlobalVar, lambda g: names.append(g.name_hint) or g))
    return names


def test_runs_call_shared_body_functions():
    mod = tvm_rtask.rtask_pipeline("llvm", num_veu=2)(Twice)
    funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
    bodies = [n for n in funcs if n.endswith("_body")]
    assert bodies
    gvars = {gv.name_hint: gv for gv in mod.get_global_vars()}
    for name, func in funcs.items():
        if name.startswith("rprogram_"):
            called = _calls(func)
            assert called and set(called) <= set(bodies)
            # every call names the module's own GlobalVar
            tvm_ffi.structural_map(
                func, (tvm.ir.GlobalVar, lambda g: g if g.same_as(gvars[g.name_hint]) else 1 / 0)
            )
    for name in bodies:
        assert funcs[name].attrs[dispatch.BODY_ATTR]


@pytest.mark.parametrize("barrier", ["fine", "global"])
def test_body_functions_compute_what_inlined_bodies_do(barrier, monkeypatch):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((64, 64)).astype("float32") for _ in range(3)]
    expected = np.maximum(args[0] @ args[1], 0) @ args[2]
    outs = {}
    for subroutines in (True, False):
        monkeypatch.setattr(
            cpu_backend,
            "build_cpu_dispatcher",
            lambda code, sub=subroutines, **kw: dispatch.build_cpu_dispatcher(
                code, **{**kw, "subroutines": sub}
            ),
        )
        ex = tvm_rtask.compile(Twice, "llvm", barrier=barrier, num_veu=2)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        outs[subroutines] = vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()
    np.testing.assert_allclose(outs[True], expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(outs[True], outs[False])


def test_bodies_stay_functions_of_their_own():
    # each body is a compute scope, which TVM's llvm codegen outlines into a noinline
    # function: LLVM does not inline the bodies into the dispatcher's parallel lambda. One
    # build job: with two (a quiet machine of two cores) the bodies are built into side
    # objects by forked processes and are not in this module's LLVM IR at all
    ex = tvm_rtask.compile(Twice, "llvm", num_veu=2, cpu_build_jobs=1)
    ll = ex.mod.imports[0].inspect_source("ll")
    noinline = {
        m.group(1)
        for m in re.finditer(r"^attributes (#\d+) = \{[^}]*\bnoinline\b", ll, re.MULTILINE)
    }
    computes = re.findall(r"^define [^\n]*@(\w+_body_compute_)\([^\n]*\) [^\n]*?(#\d+)", ll, re.M)
    names = {name for name, _ in computes}
    assert len(names) == 2  # the two distinct kernels: matmul, matmul + relu
    assert all(group in noinline for _, group in computes)


@tvm.script.ir_module
class ShiftThenMatmul:
    """An unscheduled elementwise kernel (called by one operator's runs: 63 x 63 elements, no
    whole vectors for the Elementwise rule) and a rule's matmul."""

    @R.function
    def main(x: R.Tensor((63, 63), "float32"), w: R.Tensor((63, 64), "float32")):
        with R.dataflow():
            a = R.multiply(R.sin(x), x)
            c = R.matmul(a, w)
            R.output(c)
        return c


def test_only_scheduled_or_often_called_bodies_are_outlined():
    # an unscheduled loop nest called by few runs stays inlinable (LLVM specialises it on the
    # run's constant rTask range); the rule's register-tiled matmul is outlined
    ex = tvm_rtask.compile(ShiftThenMatmul, "llvm", num_veu=2, cpu_build_jobs=1)
    ll = ex.mod.imports[0].inspect_source("ll")
    outlined = re.findall(r"^define [^\n]*@(\w+)_body_compute_\(", ll, re.M)
    assert len(outlined) == 1 and "matmul" in outlined[0] and "sin" not in outlined[0]
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(shape).astype("float32") for shape in ((63, 63), (63, 64)))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, (x, w))).numpy()
    np.testing.assert_allclose(out, (np.sin(x) * x) @ w, rtol=1e-4, atol=1e-3)


def _ll(ex) -> str:
    return ex.mod.imports[0].inspect_source("ll")


def test_the_build_leaves_out_what_llvm_does_again():
    # TIR's CommonSubexprElim names what it binds cse_v*: none are left in the IR
    ex = tvm_rtask.compile(Twice, "llvm", num_veu=2, cpu_build_jobs=1)
    assert "cse_v" not in _ll(ex)
    assert set(dispatch.SKIPPED_PASSES) == {"tirx.RemoveNoOp", "s_tir.HoistIfThenElse"}


def test_the_lowering_keeps_the_callers_pass_options():
    seen = {}

    @tvm.transform.module_pass(opt_level=0, name="Probe")
    def probe(mod, _ctx):
        ctx = tvm.transform.PassContext.current()
        seen.update(
            opt_level=ctx.opt_level,
            disabled=set(ctx.disabled_pass),
            config={str(k): v for k, v in ctx.config.items()},
        )
        return mod

    config = {"tirx.instrument_bound_checkers": True}
    outer = tvm.transform.PassContext(
        opt_level=2, disabled_pass=["tirx.LoopPartition"], config=config
    )
    with outer:
        dispatch._lower_for_llvm(probe)(tvm.IRModule({}))
    assert seen["opt_level"] == 2
    assert seen["disabled"] == {"tirx.LoopPartition", *dispatch.SKIPPED_PASSES}
    assert seen["config"]["tirx.instrument_bound_checkers"]
    assert seen["config"]["tirx.disable_cse_tir"]


def test_a_timing_instrument_around_the_build_keeps_its_record():
    timing = tvm.ir.instrument.PassTimingInstrument()
    with tvm.transform.PassContext(instruments=[timing]):
        tvm_rtask.compile(Twice, "llvm", num_veu=2, cpu_build_jobs=1)
        profile = timing.render()
    assert "LowerForLLVM" in profile and "MakePackedAPI" not in profile
