"""An rKernel compiles to the instruction mix of the TVM kernel it came from (no GPU needed).

For every distinct operator of a light model, the persistent kernel that runs it alone
(policy ``sequential``: one rProgram per operator) is compared in PTX with the kernel TVM
builds from the same PrimFunc with its default GPU schedules (dlight, as TVM's own build
applies them) at the vEU's thread cap (``cuda_threads``, 256; uncapped, dlight gives
elementwise kernels 1024 threads, a different schedule): the same number of FMAs and of
bytes loaded from shared memory in vector loads as many (schedule annotations kept: unrolled
as TVM unrolls; with body functions, whose shared memory is dynamic, up to 15% more vector
loads of the same bytes), no 64-bit ``mul.hi`` (index math in int32), and ptxas reports no
spill stores in the kernel or the body functions it calls (a kernel that calls them stores
at most 64 bytes across the calls). Operators whose rKernel
had to be rescheduled (a 2-D cross-thread reduction a 1-D vEU cannot host) are left out:
there is no TVM kernel to match.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import tvm

import tvm_rtask
from tvm_rtask.backend.cuda.backend import CUDAOptions, schedule_target
from tvm_rtask.backend.cuda.rkernel import schedule_for_cuda
from tvm_rtask.core import RProgram
from tvm_rtask.options import RTaskOptions
from tvm_rtask.relax_passes import RTaskPrepare
from tvm_rtask.testing.onnx_light import load_light_model

NVCC = shutil.which("nvcc")
ARCH = "sm_90"
_ENTRY = re.compile(r"^(?:\.visible |\.weak )?\.(?:entry|func) (\w+)\(", re.M)
_BODY_CALL = re.compile(r"call\.uni[^;]*?\b(rtask_body_\w+)", re.S)
# Spill stores ptxas reports in a body function, known and written down
# (docs/cuda-kernels.md, "Known spills"): any other spill, or one of these gone, fails.
KNOWN_BODY_SPILLS = {("resnet50", "fused_conv2d20_add14"): 4}


def _ptx(source: str, tmp_path, name: str) -> tuple[dict[str, str], str]:
    cu = tmp_path / f"{name}.cu"
    cu.write_text(source)
    ptx = tmp_path / f"{name}.ptx"
    subprocess.run(
        ["nvcc", "-ptx", f"-arch={ARCH}", "-o", str(ptx), str(cu)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    text = ptx.read_text()
    report = subprocess.run(
        ["ptxas", "-v", f"-arch={ARCH}", str(ptx), "-o", str(tmp_path / f"{name}.o")],
        capture_output=True,
        text=True,
        timeout=900,
    ).stderr
    starts = [(m.group(1), m.start()) for m in _ENTRY.finditer(text)]
    bodies = {
        fn: text[at : starts[i + 1][1] if i + 1 < len(starts) else len(text)]
        for i, (fn, at) in enumerate(starts)
    }
    return bodies, report


def _tvm_kernels(mod, target, funcs: set[str]) -> str:
    """CUDA source of TVM's kernel of each PrimFunc in ``funcs`` of the prepared module."""
    capped = schedule_target(target, CUDAOptions.parse(RTaskOptions(), target).threads)
    prepared = RTaskPrepare(None, target)(mod)
    kernels = {
        name: schedule_for_cuda(prepared[name], capped).with_attr("global_symbol", name)
        for name in sorted(funcs)
    }
    with capped:
        lib = tvm.tirx.build(tvm.IRModule(kernels), target=capped)
    return next(m.inspect_source() for m in lib.imports if m.kind == "cuda")


def _with_callees(functions: dict[str, str], name: str) -> str:
    """The PTX of ``name`` and of the rKernel body functions it calls (bodies compiled as
    device functions, ``cuda_body_functions``)."""
    text = functions[name]
    return text + "".join(functions[c] for c in sorted(set(_BODY_CALL.findall(text))))


def _counts(body: str) -> dict[str, int]:
    v4 = len(re.findall(r"\bld\.shared\.v4\.[bf]32", body))
    v2 = len(re.findall(r"\bld\.shared\.v2\.[bf]32", body))
    scalar = len(re.findall(r"\bld\.shared\.[bf]32", body))
    return {
        "fma": len(re.findall(r"\bfma\.rn\.f32", body)),
        "ld.shared.v": len(re.findall(r"\bld\.shared\.v\d", body)),
        "ld.shared.bytes": 16 * v4 + 8 * v2 + 4 * scalar,
        "mul.hi.64": len(re.findall(r"\bmul\.hi\.[us]64", body)),
    }


def _spills(report: str) -> dict[str, int]:
    """Spill stores per function, entry or device function."""
    spills, current = {}, None
    for line in report.splitlines():
        found = re.search(r"Function properties for (\w+)", line)
        if found:
            current = found.group(1)
        found = re.search(r"(\d+) bytes spill stores", line)
        if found and current:
            spills[current] = int(found.group(1))
            current = None
    return spills


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize(
    "name, body_functions",
    [
        ("squeezenet", True),
        # on a CI core: 215 s of nvcc (slow: make test-all)
        pytest.param("inception_v1", True, marks=pytest.mark.slow),
        pytest.param("resnet50", True, marks=pytest.mark.slow),  # 118 s of nvcc
        ("squeezenet", False),  # bodies inlined into the persistent kernel
    ],
)
def test_rkernels_match_tvm_kernels_in_ptx(name, body_functions, tmp_path):
    mod = tvm_rtask.frontend.load(load_light_model(name))
    target = tvm.target.Target({"kind": "cuda", "arch": ARCH}, host="llvm")
    # one rTask per thread block (no coarsening: a loop over blocks that nvcc unrolls would
    # multiply the counts without changing the instruction mix per block)
    ex, plan = tvm_rtask.compile_with_plan(
        mod,
        target,
        policy="sequential",
        verify_occupancy=False,
        rtasks_per_veu=10_000,
        cuda_body_functions=body_functions,
    )
    reference = _tvm_kernels(mod, target, {op.func for op in plan.graph.ops if op.supported})
    ours, report = _ptx(tvm_rtask.cuda_source(ex), tmp_path, "rtask")
    theirs, _ = _ptx(reference, tmp_path, "tvm")
    spills = _spills(report)
    candidates, compared, seen_known = set(), set(), set()
    for k, step in enumerate(plan.steps):
        if not isinstance(step, RProgram):
            continue
        (op,) = step.ops()
        func = plan.graph.op(op).func
        if plan.graph.op(op).kernel(step.kernel_of(op)).schedule:
            continue  # rescheduled to fit a vEU: not TVM's kernel, nothing to match
        if f"{func}_kernel" not in theirs:
            continue  # dlight made it several kernels (an ordinary call then)
        candidates.add(func)
        if func in compared or f"rprogram_{k}_kernel" not in ours:
            continue  # identical rPrograms share the kernel of the first one
        kernel = f"rprogram_{k}_kernel"
        mine, tvms = _counts(_with_callees(ours, kernel)), _counts(theirs[f"{func}_kernel"])
        assert mine["fma"] == tvms["fma"], (op, mine, tvms)
        if tvms["ld.shared.bytes"]:
            # (a kernel TVM gives fewer threads than the vEU's reduces across warps in
            # shared memory, where TVM's own reduces within a warp: nothing to compare)
            assert mine["ld.shared.bytes"] == tvms["ld.shared.bytes"], (op, mine, tvms)
        if body_functions:
            # dynamic shared memory: nvcc proves less alignment and splits up to one in
            # nine 128-bit loads into two 64-bit ones (docs/cuda-kernels.md)
            assert tvms["ld.shared.v"] <= mine["ld.shared.v"] <= tvms["ld.shared.v"] * 1.15
        else:
            assert mine["ld.shared.v"] == tvms["ld.shared.v"], (op, mine, tvms)
        assert mine["mul.hi.64"] == 0, (op, mine)
        callees = set(_BODY_CALL.findall(ours[kernel]))
        # bodies that use shared memory are device functions; the others stay inlined
        uses_shared = plan.graph.op(op).kernel(step.kernel_of(op)).shared_mem > 0
        assert bool(callees) == (body_functions and uses_shared), (op, callees)
        for fn in callees:
            assert spills.get(fn, 0) == KNOWN_BODY_SPILLS.get((name, func), 0), (op, fn, spills)
            seen_known.add((name, func))
        # a kernel calling body functions saves the values live across each call (the call
        # ABI's caller-saved registers): ptxas counts those few bytes as spill stores
        assert spills.get(kernel, 0) <= (64 if body_functions else 0), (op, spills[kernel])
        compared.add(func)
    assert compared == candidates and len(compared) >= 10, (len(compared), len(candidates))
    assert {k for k in KNOWN_BODY_SPILLS if k[0] == name} <= seen_known  # still there
