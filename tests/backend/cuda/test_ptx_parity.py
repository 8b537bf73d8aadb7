"""An rKernel compiles to the instruction mix of the TVM kernel it came from (no GPU needed).

For every distinct operator of a light model, the persistent kernel that runs it alone
(policy ``sequential``: one rProgram per operator) is compared in PTX with the kernel TVM
builds from the same PrimFunc with its default GPU schedules (dlight, as TVM's own build
applies them) at the vEU's thread cap (``cuda_threads``, 256; uncapped, dlight gives
elementwise kernels 1024 threads, a different schedule): the same number of FMAs and of
vector shared-memory loads (schedule annotations kept: unrolled as TVM unrolls), no 64-bit
``mul.hi`` (index math in int32), and ptxas reports no spill stores. Operators whose rKernel
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
_ENTRY = re.compile(r"\.visible \.entry (\w+)\(")


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


def _counts(body: str) -> dict[str, int]:
    return {
        "fma": len(re.findall(r"\bfma\.rn\.f32", body)),
        "ld.shared.v": len(re.findall(r"\bld\.shared\.v\d", body)),
        "mul.hi.64": len(re.findall(r"\bmul\.hi\.[us]64", body)),
    }


def _spills(report: str) -> dict[str, int]:
    spills, current = {}, None
    for line in report.splitlines():
        found = re.search(r"Compiling entry function '(\w+)'", line)
        if found:
            current = found.group(1)
        found = re.search(r"(\d+) bytes spill stores", line)
        if found and current:
            spills[current] = int(found.group(1))
    return spills


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("name", ["squeezenet", "inception_v1", "resnet50"])
def test_rkernels_match_tvm_kernels_in_ptx(name, tmp_path):
    mod = tvm_rtask.frontend.load(load_light_model(name))
    target = tvm.target.Target({"kind": "cuda", "arch": ARCH}, host="llvm")
    # one rTask per thread block (no coarsening: a loop over blocks that nvcc unrolls would
    # multiply the counts without changing the instruction mix per block)
    ex, plan = tvm_rtask.compile_with_plan(
        mod, target, policy="sequential", verify_occupancy=False, rtasks_per_veu=10_000
    )
    reference = _tvm_kernels(mod, target, {op.func for op in plan.graph.ops if op.supported})
    ours, report = _ptx(tvm_rtask.cuda_source(ex), tmp_path, "rtask")
    theirs, _ = _ptx(reference, tmp_path, "tvm")
    spills = _spills(report)
    candidates, compared = set(), set()
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
        mine, tvms = _counts(ours[f"rprogram_{k}_kernel"]), _counts(theirs[f"{func}_kernel"])
        assert mine["fma"] == tvms["fma"], (op, mine, tvms)
        assert mine["ld.shared.v"] == tvms["ld.shared.v"], (op, mine, tvms)
        assert mine["mul.hi.64"] == 0, (op, mine)
        assert spills.get(f"rprogram_{k}_kernel", 0) == 0, (op, spills)
        compared.add(func)
    assert compared == candidates and len(compared) >= 10, (len(compared), len(candidates))
