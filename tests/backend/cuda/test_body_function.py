"""rKernel bodies as CUDA device functions (``cuda_body_functions``), without a GPU."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import tvm_rtask
from tvm_rtask import models as zoo
from tvm_rtask.backend.cuda import dispatch
from tvm_rtask.backend.cuda.body_function import postprocess_source
from tvm_rtask.backend.cuda.occupancy import KernelUsage, parse_function_spills, with_callees
from tvm_rtask.errors import CapacityError

TARGET = {"kind": "cuda", "arch": "sm_90"}

# What TVM prints for a body kernel whose parameters it sorted and pruned (rtask_arg1 unused)
SOURCE = """\
extern "C" __global__ void __launch_bounds__(256) rtask_body_0123456789ab_a3_kernel(\
float* __restrict__ rtask_arg2_ptr, float* __restrict__ rtask_arg0_ptr, int rtask_arg3);
extern "C" __global__ void __launch_bounds__(256, 3) rprogram_0_kernel(float* __restrict__ x_ptr, \
float* __restrict__ y_ptr, int n);
extern "C" __global__ void __launch_bounds__(256) rtask_body_0123456789ab_a3_kernel(\
float* __restrict__ rtask_arg2_ptr, float* __restrict__ rtask_arg0_ptr, int rtask_arg3) {
  rtask_arg2_ptr[threadIdx.x + rtask_arg3] = rtask_arg0_ptr[threadIdx.x] * 2.0f;
}
extern "C" __global__ void __launch_bounds__(256, 3) rprogram_0_kernel(float* __restrict__ x_ptr, \
float* __restrict__ y_ptr, int n) {
  for (int r = 0; r < n; ++r) {
    rtask_body_0123456789ab_a3_kernel_call((&(x_ptr[0])), (&(x_ptr[8])), (&(y_ptr[0])), r);
    __syncthreads();
  }
}
"""


def test_body_kernels_become_device_functions_called_through_ordered_wrappers():
    out = postprocess_source(SOURCE)
    assert "__global__ void __launch_bounds__(256) rtask_body" not in out
    assert (
        out.count('extern "C" __device__ __noinline__ void rtask_body_0123456789ab_a3_kernel(') == 2
    )
    # the persistent kernel stays a kernel
    assert out.count('extern "C" __global__ void __launch_bounds__(256, 3) rprogram_0_kernel(') == 2
    # the wrapper takes every operand in order and passes those TVM kept, by position
    wrapper = re.search(r"void rtask_body_0123456789ab_a3_kernel_call\(([^)]*)\) \{ (.*) \}", out)
    assert wrapper.group(1) == "void* a0, void* a1, void* a2, int a3"
    assert wrapper.group(2) == "rtask_body_0123456789ab_a3_kernel((float*)a2, (float*)a0, (int)a3);"
    # declared after the body's declaration, before its caller
    assert out.index("_kernel_call(void*") < out.index("rprogram_0_kernel(")
    assert postprocess_source(out) == out  # idempotent: nothing left to rewrite


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_the_rewritten_source_compiles(tmp_path):
    cu = tmp_path / "k.cu"
    cu.write_text(postprocess_source(SOURCE))
    out = subprocess.run(
        ["nvcc", "-ptx", "-arch=sm_90", "-o", str(tmp_path / "k.ptx"), str(cu)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    assert ".func rtask_body_0123456789ab_a3_kernel(" in ptx  # a device function, not inlined
    assert re.search(r"call\.uni[^;]*rtask_body_0123456789ab_a3_kernel", ptx, re.S)


def test_a_definition_before_its_declaration_is_refused():
    definition_first = SOURCE.split("\n", 1)[1]
    with pytest.raises(ValueError, match="defined before it is declared"):
        postprocess_source(definition_first)


def test_kernel_usage_counts_its_body_functions():
    report = """\
ptxas info    : Compiling entry function 'rprogram_0_kernel' for 'sm_90'
ptxas info    : Function properties for rprogram_0_kernel
    64 bytes stack frame, 32 bytes spill stores, 284 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 64 bytes cumulative stack size, 128 bytes smem
ptxas info    : Function properties for rtask_body_a_a2_kernel
    0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Function properties for rtask_body_b_a2_kernel
    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
"""
    assert parse_function_spills(report)["rtask_body_b_a2_kernel"] == 8
    usage = {"rprogram_0_kernel": KernelUsage(80, 128, 32)}
    callees = {"rprogram_0_kernel": ["rtask_body_a_a2_kernel"]}
    out = with_callees(usage, report, callees, {"rprogram_0_kernel": 7168})
    assert out["rprogram_0_kernel"] == KernelUsage(80, 128 + 7168, 32 + 4)


def test_the_source_has_one_device_function_per_distinct_rkernel():
    mod = zoo.get("squeezenet", reduced=True)[0]
    ex, plan = tvm_rtask.compile_with_plan(mod, TARGET, verify_occupancy=False)
    source = tvm_rtask.cuda_source(ex)
    bodies = set(re.findall(r"__device__ __noinline__ void (rtask_body_\w+_kernel)\(", source))
    # one per distinct rKernel that uses shared memory (the others stay inlined)
    distinct = {
        plan.graph.op(op).func
        for p in plan.programs()
        for op in p.ops()
        if plan.graph.op(op).kernel(p.kernel_of(op)).shared_mem > 0
    }
    assert len(bodies) == len(distinct) > 5
    assert "__global__ void __launch_bounds__(256) rtask_body" not in source
    # the persistent kernels launch with the dynamic shared memory of their bodies
    launched = source.count("extern __shared__ __align__(64) uchar rtask_dynamic_shared_ptr[];")
    assert 1 <= launched <= len(plan.programs())
    inlined = tvm_rtask.cuda_source(
        tvm_rtask.compile(mod, TARGET, verify_occupancy=False, cuda_body_functions=False)
    )
    assert "rtask_body_" not in inlined


def test_too_little_dynamic_shared_memory_is_refused(monkeypatch):
    mod = zoo.get("squeezenet", reduced=True)[0]
    monkeypatch.setattr(dispatch, "DYNAMIC_SHARED_SLACK", -4096)
    with pytest.raises(CapacityError, match="dynamic shared memory"):
        tvm_rtask.compile(mod, TARGET, verify_occupancy=False)
