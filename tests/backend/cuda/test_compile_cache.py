"""One nvcc compile per persistent kernel's source (nvcc needed, no GPU)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import tvm

from tvm_rtask.backend.cuda import compile_cache
from tvm_rtask.backend.cuda.compile_cache import RTASK_MARKER, cached_callback, compile_source
from tvm_rtask.backend.cuda.occupancy import KernelUsage, check_spills, ptxas_usage
from tvm_rtask.errors import SpillError

SOURCE = f"""// {RTASK_MARKER}
extern "C" __global__ void __launch_bounds__(128) rprogram_0_kernel(float* a) {{
  a[threadIdx.x] += 1.0f;
}}
"""
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    return tmp_path


@needs_nvcc
def test_a_source_is_compiled_once_and_read_back(cache, monkeypatch):
    first = compile_source(SOURCE, "sm_90")
    assert first.cubin.startswith(b"\x7fELF") and "rprogram_0_kernel" in first.report
    assert len(list(cache.glob("*.cubin"))) == 1

    def no_compile(cmd, *args, **kwargs):
        if "--cubin" in cmd:
            raise AssertionError("compiled again")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(compile_cache.subprocess, "run", no_compile)
    again = compile_source(SOURCE, "sm_90")
    assert again == first
    assert ptxas_usage(SOURCE, "sm_90")["rprogram_0_kernel"].registers > 0


@needs_nvcc
def test_a_damaged_entry_is_compiled_again(cache):
    first = compile_source(SOURCE, "sm_90")
    (entry,) = cache.glob("*.cubin")
    entry.write_bytes(first.cubin[:10])  # truncated
    assert compile_source(SOURCE, "sm_90").cubin == first.cubin  # compiled again
    other_arch = compile_source(SOURCE, "sm_80")
    assert other_arch.cubin != first.cubin and len(list(cache.glob("*.cubin"))) == 2


@needs_nvcc
def test_the_callback_answers_rtask_sources_only(cache):
    seen = []

    def original(code):
        seen.append(code)
        return bytearray(b"//ptx")

    callback = cached_callback(original)
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90"}):
        cubin = callback(SOURCE)
        assert bytes(cubin) == compile_source(SOURCE, "sm_90").cubin
        assert callback('extern "C" __global__ void k() {}') == bytearray(b"//ptx")
    assert len(seen) == 1  # TVM's own kernels are compiled as TVM compiles them


def test_spilling_persistent_kernels_fail_the_build_by_name():
    usage = {
        "rprogram_0_kernel": KernelUsage(64, 0, 0),
        "rprogram_1_kernel": KernelUsage(64, 1024, 1436),
        "fused_conv_kernel": KernelUsage(255, 0, 8),  # an ordinary kernel: not ours to refuse
    }
    with pytest.raises(SpillError, match=r"rprogram_1_kernel spills 1436 bytes.*\(256, 4\)"):
        check_spills(usage, 256, 4)
    check_spills({"rprogram_0_kernel": KernelUsage(64, 0, 0)}, 256, 4)
