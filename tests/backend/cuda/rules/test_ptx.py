"""The CUDA rules' kernels against dlight's for the same PrimFunc, in PTX and ptxas' report
(nvcc, no GPU): per convolution of SqueezeNet, ResNeXt-29 (branches and grouped) and NASNet,
reduced (the full ResNeXt-29 is a slow test).

* ptxas: no spill stores, and no more registers than dlight's kernel of the same PrimFunc or
  :data:`REGISTERS` (72, what dlight's heaviest convolution needs), so the persistent
  kernels' register budget (the most any rKernel needs, docs/cuda-kernels.md) and
  with it the vEUs per SM do not get worse;
* no 64-bit ``mul.hi`` (index math in int32);
* 128-bit shared loads in every implicit-GEMM kernel;
* FMAs per thread per reduction step (the loop that holds the most FMAs; the whole kernel
  when the reduction is unrolled) at least dlight's: always against dlight's
  GeneralReduction (grouped) and Fallback (depthwise); against its Matmul rule where both
  run several steps (K >= 64) and its 32-pixel x 64-channel tile is not padded (a padded
  tile's FMAs are partly on zeros), and more there when K is a multiple of 32 (512 against
  256: 4x4 registers x 32 staged elements, dlight's 4x4 x 16).

``pytest -s`` prints the table (docs/cuda-kernels.md quotes it).
"""

from __future__ import annotations

import re
import shutil

import pytest
import tvm
from tvm import s_tir

from tvm_rtask.backend.cuda.occupancy import parse_ptxas_report
from tvm_rtask.backend.cuda.rkernel import schedule_for_cuda
from tvm_rtask.backend.cuda.rules import RULE_ATTR, find_conv, schedule_cuda_func

from ..test_ptx_parity import _counts, _ptx
from .convs import CAPPED, convs

NVCC = shutil.which("nvcc")
REGISTERS = 72


def fma_per_step(body: str) -> int:
    """FMAs in the innermost PTX loop that holds the most of them (a loop: a label and the
    last branch back to it); all of the kernel's when no loop holds any."""
    fma = re.compile(r"\bfma\.rn(?:\.ftz)?\.f32")
    best = (0, 0)  # (count, -length): the most FMAs, then the shortest body
    for label in re.finditer(r"^(\$L__BB\d+_\d+):", body, re.M):
        back = [
            b.start()
            for b in re.finditer(rf"bra(?:\.uni)?\s+{re.escape(label.group(1))};", body)
            if b.start() > label.end()
        ]
        if back:
            text = body[label.end() : back[-1]]
            best = max(best, (len(fma.findall(text)), -len(text)))
    return best[0] or len(fma.findall(body))


def _source(funcs: dict) -> str:
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with CAPPED:
        lib = tvm.tirx.build(mod, target=CAPPED)
    return next(m.inspect_source() for m in lib.imports if m.kind == "cuda")


def compare(models, tmp_path) -> list[dict]:
    """One row per convolution: the rules' kernel and dlight's, compiled in one nvcc run
    each."""
    ours, theirs, meta = {}, {}, {}
    for model in models:
        for name, func in convs(model).items():
            key = f"{model}__{name}"
            ours[key] = schedule_cuda_func(func, CAPPED)
            theirs[key] = schedule_for_cuda(func, CAPPED, rules=False)
            meta[key] = find_conv(s_tir.Schedule(func))
    our_ptx, our_report = _ptx(_source(ours), tmp_path, "rules")
    their_ptx, their_report = _ptx(_source(theirs), tmp_path, "dlight")
    our_use, their_use = parse_ptxas_report(our_report), parse_ptxas_report(their_report)
    rows = []
    for key, func in ours.items():
        kernel = f"{key}_kernel"
        mine, tvms = _counts(our_ptx[kernel]), _counts(their_ptx[kernel])
        rows.append(
            {
                "conv": key,
                "rule": str(func.attrs[RULE_ATTR]),
                "gemm": meta[key].gemm,
                "registers": (our_use[kernel].registers, their_use[kernel].registers),
                "spills": our_use[kernel].spill_stores,
                "fma_step": (fma_per_step(our_ptx[kernel]), fma_per_step(their_ptx[kernel])),
                "ld.shared.v": (mine["ld.shared.v"], tvms["ld.shared.v"]),
                "mul.hi.64": mine["mul.hi.64"],
                "dlight_matmul": "blockIdx.y" in _source_of(theirs[key]),
            }
        )
    return rows


def _source_of(func) -> str:
    return func.script()


def _print(rows) -> None:
    print(f"\n{'convolution':58s} {'rule':20s} {'G, M, J, K':22s} regs   fma/step  ld.shared.v")
    for r in rows:
        print(
            f"{r['conv'][:58]:58s} {r['rule']:20s} {str(r['gemm']):22s} "
            f"{r['registers'][0]:3d}/{r['registers'][1]:3d} {r['fma_step'][0]:4d}/"
            f"{r['fma_step'][1]:4d}  {r['ld.shared.v'][0]:3d}/{r['ld.shared.v'][1]:3d}"
        )


def _check(rows) -> None:
    _print(rows)
    for r in rows:
        ours, theirs = r["registers"]
        assert r["spills"] == 0, r
        assert ours <= max(REGISTERS, theirs), r
        assert r["mul.hi.64"] == 0, r
        _, m, j, k = r["gemm"]
        if r["rule"] == "Conv2dNCHW":
            assert r["ld.shared.v"][0] > 0, r
        if not r["dlight_matmul"]:  # GeneralReduction / Fallback: grouped and depthwise
            assert r["fma_step"][0] >= r["fma_step"][1], r
        elif k >= 64 and m % 32 == 0 and j % 64 == 0:  # dlight's 32x64 tile not padded
            assert r["fma_step"][0] >= r["fma_step"][1], r
            if k % 32 == 0:
                assert r["fma_step"][0] > r["fma_step"][1], r


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_rule_kernels_against_dlight_in_ptx(tmp_path):
    _check(compare(["squeezenet", "resnext29", "resnext29_grouped", "nasnet_cifar"], tmp_path))


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_full_size_resnext_rule_kernels_against_dlight_in_ptx(tmp_path):
    _check(compare(["resnext29_full", "resnext29_grouped_full"], tmp_path))
