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


def _scaled(factor: float):
    """A one-block CUDA kernel ``b = a * factor`` (scheduled: one thread per element)."""
    from tvm import s_tir, te

    a = te.placeholder((256,), name="a")
    b = te.compute((256,), lambda i: a[i] * factor, name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    sch.bind(sch.get_loops(sch.get_sblock("b"))[0], "threadIdx.x")
    return sch.mod["main"]


@needs_nvcc
def test_kernel_registers_are_built_once_and_kept_by_structure(cache, monkeypatch):
    """``source_kernel_registers`` builds only the kernels the cache has not seen; the key is
    the function's structure (its name apart), so a changed constant is a new entry."""
    from tvm_rtask.backend.cuda import occupancy

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    builds = []
    real_build = tvm.tirx.build

    def counting_build(mod, *args, **kwargs):
        builds.append(sorted(gv.name_hint for gv in mod.functions))
        return real_build(mod, *args, **kwargs)

    monkeypatch.setattr(tvm.tirx, "build", counting_build)
    first = occupancy.source_kernel_registers({"k": _scaled(2.0)}, target)
    assert first["k"] > 0 and builds == [["k"]]
    renamed = occupancy.source_kernel_registers({"other_name": _scaled(2.0)}, target)
    assert renamed == {"other_name": first["k"]} and len(builds) == 1  # from the cache
    occupancy.source_kernel_registers({"k": _scaled(2.0), "m": _scaled(3.0)}, target)
    assert builds[-1] == ["m"]  # only the new structure is built
    assert len(list((cache / compile_cache.REGISTERS_DIR).glob("*.json"))) == 2


def test_registers_key_follows_the_structure_and_the_compiler(monkeypatch):
    monkeypatch.setenv(compile_cache.NVCC_VERSION_ENV, "Build cuda_13.0.test")

    def key(factor=2.0, arch="sm_90"):
        return compile_cache.registers_key(_scaled(factor), f"cuda -arch={arch}", arch, "nvcc")

    first = key()
    assert first == key() and first != key(factor=3.0) and first != key(arch="sm_80")
    monkeypatch.setenv(compile_cache.NVCC_VERSION_ENV, "Build cuda_13.1.test")
    assert first != key()


def test_a_damaged_registers_entry_is_a_miss(cache):
    compile_cache.write_registers("abc", 40)
    assert compile_cache.read_registers("abc") == 40
    (cache / compile_cache.REGISTERS_DIR / "abc.json").write_text("{not json")
    assert compile_cache.read_registers("abc") is None
    assert compile_cache.read_registers("missing") is None
