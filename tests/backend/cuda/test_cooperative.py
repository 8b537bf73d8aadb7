"""Cooperative launch: the flag reaches the persistent kernels' launch tags, and only them."""

import re

import pytest
import tvm
from tvm import tirx
from tvm.runtime import _ffi_api as runtime_api

import tvm_rtask
from tvm_rtask import models as zoo
from tvm_rtask.backend.cuda.cooperative import (
    COOPERATIVE_TAG,
    DYNAMIC_SHARED_TAG,
    LAUNCH_PARAMS_ATTR,
    MarkCooperativeLaunch,
)
from tvm_rtask.errors import OptionError

TARGET = {"kind": "cuda", "arch": "sm_90"}


def _kernel(name: str, tags: list[str]) -> tirx.PrimFunc:
    a = tirx.Var("a", "handle")
    func = tirx.PrimFunc([a], tirx.Evaluate(0))
    return func.with_attr({"global_symbol": name, LAUNCH_PARAMS_ATTR: tags})


def _tags(mod: tvm.IRModule, name: str) -> list[str]:
    return [str(t) for t in mod[name].attrs[LAUNCH_PARAMS_ATTR]]


def test_flag_goes_before_the_dynamic_shared_memory_tag_of_persistent_kernels_only():
    threads = ["blockIdx.x", "threadIdx.x"]
    mod = tvm.IRModule(
        {
            "rprogram_0_kernel": _kernel("rprogram_0_kernel", [*threads, DYNAMIC_SHARED_TAG]),
            "rprogram_1_kernel": _kernel("rprogram_1_kernel", threads),
            "fused_conv2d_kernel": _kernel("fused_conv2d_kernel", threads),
        }
    )
    marked = MarkCooperativeLaunch()(mod)
    assert _tags(marked, "rprogram_0_kernel") == [*threads, COOPERATIVE_TAG, DYNAMIC_SHARED_TAG]
    assert _tags(marked, "rprogram_1_kernel") == [*threads, COOPERATIVE_TAG]
    assert _tags(marked, "fused_conv2d_kernel") == threads
    again = MarkCooperativeLaunch()(marked)  # idempotent
    assert _tags(again, "rprogram_1_kernel") == [*threads, COOPERATIVE_TAG]


def _serialized_cooperative_kernels(ex) -> tuple[list[str], set[str]]:
    """From the module as it would be exported (the CUDA module's function table), the kernel
    whose launch tags hold the flag, for each occurrence of the flag, and every kernel name.

    In the table each function's name comes before its argument types and launch tags, so
    the last kernel name before a flag is the function it belongs to."""
    text = runtime_api.ModulePackImportsToC(ex.mod, False, "")
    data = text.split("library_bin[", 1)[1]
    blob = bytes(int(h, 16) for h in re.findall(r"0x([0-9a-f]{2})", data))
    names = [(m.start(), m.group().decode()) for m in re.finditer(rb"[A-Za-z_]\w*_kernel", blob)]
    owners = []
    for flag in re.finditer(re.escape(COOPERATIVE_TAG.encode()), blob):
        owners.append([n for at, n in names if at < flag.start()][-1])
    return owners, {n for _, n in names}


def test_compiled_model_launches_its_rprograms_cooperatively():
    model = zoo.get("squeezenet", reduced=True)[0]
    ex = tvm_rtask.compile(model, TARGET, cooperative_launch=True, verify_occupancy=False)
    owners, kernels = _serialized_cooperative_kernels(ex)
    programs = {k for k in kernels if k.startswith("rprogram_")}
    assert programs and sorted(owners) == sorted(programs)
    plain = tvm_rtask.compile(model, TARGET, verify_occupancy=False)
    assert _serialized_cooperative_kernels(plain)[0] == []


def test_cooperative_launch_must_be_a_bool():
    with pytest.raises(OptionError, match="cooperative_launch"):
        tvm_rtask.plan(zoo.get("squeezenet", reduced=True)[0], "cuda", cooperative_launch="yes")
