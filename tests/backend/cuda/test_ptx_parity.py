"""An rKernel compiles to the instruction mix of the TVM kernel it came from (no GPU needed).

For every operator of a light model, the persistent kernel that runs it alone (policy
``sequential``: one rProgram per operator) is compared in PTX with TVM's own kernel of the
same operator: the same number of FMAs and of vector shared-memory loads (schedule
annotations kept: unrolled as TVM unrolls), no 64-bit ``mul.hi`` (index math in int32), and
ptxas reports no spill stores.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import tvm

import tvm_rtask
from tvm_rtask.core import RProgram
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
    reference = tvm_rtask.cuda_source(tvm.compile(mod, target=target))
    ex, plan = tvm_rtask.compile_with_plan(mod, target, policy="sequential")
    ours, report = _ptx(tvm_rtask.cuda_source(ex), tmp_path, "rtask")
    theirs, _ = _ptx(reference, tmp_path, "tvm")
    spills = _spills(report)
    compared = 0
    for k, step in enumerate(plan.steps):
        if not isinstance(step, RProgram):
            continue
        (op,) = step.ops()
        kernel = f"{plan.graph.op(op).func}_kernel"
        if kernel not in theirs or f"rprogram_{k}_kernel" not in ours:
            continue  # TVM split it in several kernels, or identical rPrograms share one
        mine, tvms = _counts(ours[f"rprogram_{k}_kernel"]), _counts(theirs[kernel])
        assert mine["fma"] == tvms["fma"], (op, mine, tvms)
        assert mine["ld.shared.v"] == tvms["ld.shared.v"], (op, mine, tvms)
        assert mine["mul.hi.64"] == 0, (op, mine)
        assert spills.get(f"rprogram_{k}_kernel", 0) == 0, (op, spills)
        compared += 1
    assert compared >= len(plan.programs()) // 2, (compared, len(plan.programs()))
