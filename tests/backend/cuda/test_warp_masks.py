"""Warp masks that name the lanes reaching each shuffle (``backend/cuda/warp_masks.py``; no GPU).

What TVM emits (a mask read with ``__activemask()`` after a divergent branch), what the pass
makes of it in the persistent pipeline (the full mask where whole warps reach the reduction,
the mask of the lanes where a group smaller than a warp does, a select where the warps of a
block differ, ``__syncwarp(mask)`` in the in-warp stage of a shared-memory reduction), what it
leaves alone (lanes that depend on data), and that nvcc compiles the result.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import Call
from tvm.script import tirx as T
from tvm.sym import Analyzer

import tvm_rtask
from tests.cuda.warp_mask_kernel import persistent_build, tvm_build
from tvm_rtask.backend.cuda.cooperative import persistent_pipeline
from tvm_rtask.backend.cuda.source import cuda_source
from tvm_rtask.backend.cuda.warp_masks import (
    FULL_MASK,
    SHUFFLES,
    WARP_MASK_KEPT,
    SafeWarpMasks,
    activemask_shuffles,
    safe_warp_masks,
)
from tvm_rtask.fallbacks import collecting_fallbacks
from tvm_rtask.testing.onnx_light import load_light_model

NVCC = shutil.which("nvcc")
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
CUDA_ATTRS = {
    "target": TARGET,
    "tirx.is_global_func": True,
    "calling_conv": 2,
    "tirx.kernel_launch_params": ["threadIdx.x"],
}


def rows_sum(rows: int, width: int, dtype: str = "float32") -> tirx.PrimFunc:
    """``B[i] = sum(A[i, :])``, one row per ``threadIdx.y``, its ``width`` elements reduced
    across ``threadIdx.x``: a block of ``rows * width`` threads."""
    zero = getattr(T, dtype)(0)

    @T.prim_func(s_tir=True)
    def func(a: T.handle, b: T.handle):
        A = T.match_buffer(a, (rows, width), dtype)
        B = T.match_buffer(b, (rows,), dtype)
        for i in T.thread_binding(rows, thread="threadIdx.y"):
            for k in T.thread_binding(width, thread="threadIdx.x"):
                with T.sblock("sum"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    with T.init():
                        B[vi] = zero
                    B[vi] = B[vi] + A[vi, vk]

    return func.with_attr("global_symbol", "main")


def _source(func: tirx.PrimFunc, pipeline: str) -> str:
    pending = [tvm.tirx.build(tvm.IRModule({"main": func}), target=TARGET, pipeline=pipeline)]
    while pending:
        module = pending.pop()
        if module.kind == "cuda":
            return module.inspect_source()
        pending.extend(module.imports)
    raise AssertionError("no CUDA module")


def _tvm_and_ours(func: tirx.PrimFunc) -> tuple[str, str]:
    return _source(func, "s_tir"), _source(func, persistent_pipeline(0, False))


def _device_function(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The CUDA kernel of ``func`` after TVM's lowering, as the device finalization (where
    the pass runs) gets it."""
    lower, _, _ = tvm.tirx.get_tir_pipeline("s_tir")
    target = TARGET.with_host(tvm.target.Target("llvm"))
    mod = lower(tvm.tirx.transform.BindTarget(target)(tvm.IRModule({"main": func})))
    (kernel,) = [f for gv, f in mod.functions_items() if gv.name_hint.endswith("_kernel")]
    return kernel


def _thread_vars(func: tirx.PrimFunc) -> dict[str, object]:
    found = {}

    def visit(node):
        if str(node.attr_key) == "thread_extent":
            found[str(node.node.thread_tag)] = (node.node.var, int(node.value.value))

    tvm_ffi.structural_walk(func.body, (tirx.AttrStmt, visit))
    return found


def _shuffle_masks(func: tirx.PrimFunc) -> list:
    masks = []

    def visit(node):
        if getattr(node.op, "name", "") in SHUFFLES:
            masks.append(node.args[0])

    tvm_ffi.structural_walk(func.body, (Call, visit))
    return masks


def _per_thread(func: tirx.PrimFunc, mask) -> list[int]:
    """``mask`` evaluated for each thread of ``func``'s block, in CUDA's thread order."""
    axes = _thread_vars(func)
    nx = axes.get("threadIdx.x", (None, 1))[1]
    ny = axes.get("threadIdx.y", (None, 1))[1]
    analyzer = Analyzer()
    values = []
    for flat in range(nx * ny):
        at = {"threadIdx.x": flat % nx, "threadIdx.y": flat // nx}
        bound = {
            axes[t][0].__chandle__(): tirx.IntImm("int32", v) for t, v in at.items() if t in axes
        }

        def substitute(var, bound=bound):
            return bound.get(var.__chandle__(), var)

        expr = tvm_ffi.structural_map(mask, (tirx.Var, substitute))
        values.append(int(analyzer.simplify(expr).value))
    return values


def _masks(source: str) -> list[str]:
    """The mask argument of every shuffle of ``source`` (TVM's preamble of ``#define``s for
    old architectures left out)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    return re.findall(r"__shfl\w*_sync\(([^,]+),", code)


def _nvcc_ptx(source: str, tmp_path, name: str) -> None:
    cu, ptx = tmp_path / f"{name}.cu", tmp_path / f"{name}.ptx"
    cu.write_text(source)
    out = subprocess.run(
        [NVCC, "-ptx", "-arch=sm_90", "-o", str(ptx), str(cu)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]


# -- what TVM emits, what the pipeline makes of it ---------------------------------------------


def test_tvm_reads_the_mask_after_the_branch_and_the_persistent_pipeline_names_the_lanes():
    """light ShuffleNet's pattern: a window of 9 taps accumulated under ``if (threadIdx.x <
    9)``, then a reduction across the block with ``mask = __activemask()``."""
    tvm_source = cuda_source(tvm_build())
    assert re.search(r"threadIdx\.x\)* < 9\)", tvm_source)
    assert activemask_shuffles(tvm_source)
    ours = tvm_rtask.cuda_source(persistent_build())
    assert re.search(r"threadIdx\.x\)* < 9\)", ours)
    assert "__activemask" not in ours and activemask_shuffles(ours) == []
    # 256-thread vEUs, every lane at every reduction: the full mask everywhere
    masks = _masks(ours)
    assert masks and set(masks) == {"(uint)4294967295"}


@pytest.mark.parametrize(
    "options",
    [
        {"cuda_body_functions": False},  # the reductions inlined into the dispatcher
        {"cuda_veu_placement": "smid"},  # task-table rows indexed by the vEU claimed by SM
        {"cuda_veu_placement": "smid", "cuda_body_functions": False},
        {"policy": "sequential"},
        {"barrier": "fine"},
    ],
)
def test_every_dispatcher_variant_reaches_its_reductions_with_whole_warps(options):
    """The dispatcher's branches (entry kind, operator, run loop, coarsening) are
    block-uniform: the reductions under them keep the full mask."""
    source = tvm_rtask.cuda_source(persistent_build(**options))
    assert "__activemask" not in source and activemask_shuffles(source) == []
    assert set(_masks(source)) == {"(uint)4294967295"}


def test_a_block_smaller_than_a_warp_shuffles_with_the_mask_of_its_lanes(tmp_path):
    tvm_source, ours = _tvm_and_ours(rows_sum(1, 16))
    assert activemask_shuffles(tvm_source)
    assert activemask_shuffles(ours) == [] and "__activemask" not in ours
    assert ours.count("__shfl_down_sync((uint)65535, ") == 4  # offsets 8, 4, 2, 1
    assert ours.count("__shfl_sync((uint)65535, ") == 1  # the broadcast of lane 0
    if NVCC:
        _nvcc_ptx(ours, tmp_path, "rows16")


def test_whole_warps_of_groups_smaller_than_a_warp_take_the_full_mask():
    """Four rows of 16: each warp holds two groups, every lane shuffles (width 32)."""
    _, ours = _tvm_and_ours(rows_sum(4, 16))
    masks = _masks(ours)
    assert masks and set(masks) == {"(uint)4294967295"}


def test_a_partial_last_warp_gets_a_mask_per_warp(tmp_path):
    """Three rows of 16 (48 threads): warp 0 is whole, warp 1 has lanes 0-15 only."""
    kernel, report = safe_warp_masks(_device_function(rows_sum(3, 16)))
    assert not report.unresolved and report.threads == 48
    masks = _shuffle_masks(kernel)
    assert len(masks) == 5
    for mask in masks:
        assert _per_thread(kernel, mask) == [FULL_MASK] * 32 + [0xFFFF] * 16
    _, ours = _tvm_and_ours(rows_sum(3, 16))
    assert activemask_shuffles(ours) == [] and "__activemask" not in ours
    if NVCC:
        _nvcc_ptx(ours, tmp_path, "rows48")


def test_the_in_warp_stage_of_a_shared_memory_reduction_meets_with_syncwarp(tmp_path):
    """int8 does not shuffle: TVM reduces in shared memory, the last 16 lanes under ``if
    (threadIdx.x < 16)`` with ``tvm_storage_sync("warp")``, which it prints as nothing."""
    tvm_source, ours = _tvm_and_ours(rows_sum(1, 64, "int8"))
    assert "__syncwarp" not in tvm_source
    assert ours.count("__syncwarp((uint)65535);") == 10  # around each of 5 stores
    assert "__syncwarp()" not in ours
    if NVCC:
        _nvcc_ptx(ours, tmp_path, "rows64_int8")


# -- guards: the lanes that reach a reduction ----------------------------------------------------


@T.prim_func(private=True)
def _guarded_16(A_ptr: T.handle("float32", "global"), B_ptr: T.handle("float32", "global")):
    """A body of 16 threads in a vEU of 256: the surplus threads are guarded out."""
    T.func_attr(CUDA_ATTRS)
    A = T.decl_buffer((256,), data=A_ptr)
    B = T.decl_buffer((1,), data=B_ptr)
    with T.launch_thread("threadIdx.x", 256) as tx:
        red = T.alloc_local((1,))
        t0 = T.alloc_local((1,))
        mask = T.alloc_local((1,), "uint32")
        if tx < 16:
            red[0] = A[tx]
            mask[0] = T.tvm_warp_activemask()
            t0[0] = T.tvm_warp_shuffle_down(mask[0], red[0], 8, 32, 32)
            red[0] = red[0] + t0[0]
            red[0] = T.tvm_warp_shuffle(mask[0], red[0], 0, 32, 32)
            if tx == 0:
                B[0] = red[0]


@T.prim_func(private=True)
def _guarded_48(A_ptr: T.handle("float32", "global"), B_ptr: T.handle("float32", "global")):
    """48 threads of 64 reach the shuffle: warp 0 whole, warp 1 lanes 0-15."""
    T.func_attr(CUDA_ATTRS)
    A = T.decl_buffer((64,), data=A_ptr)
    B = T.decl_buffer((2,), data=B_ptr)
    with T.launch_thread("threadIdx.x", 64) as tx:
        red = T.alloc_local((1,))
        mask = T.alloc_local((1,), "uint32")
        cse: T.let[T.int32] = tx // 48
        if cse == 0:
            red[0] = A[tx]
            mask[0] = T.tvm_warp_activemask()
            red[0] = red[0] + T.tvm_warp_shuffle_down(mask[0], red[0], 1, 32, 32)
            if tx % 32 == 0:
                B[tx // 32] = red[0]


@T.prim_func(private=True)
def _uniform_guard(A_ptr: T.handle("float32", "global"), B_ptr: T.handle("float32", "global")):
    """A branch on a value every thread reads at one address keeps every lane."""
    T.func_attr(CUDA_ATTRS)
    A = T.decl_buffer((64,), data=A_ptr)
    B = T.decl_buffer((2,), data=B_ptr)
    with T.launch_thread("threadIdx.x", 64) as tx:
        red = T.alloc_local((1,))
        mask = T.alloc_local((1,), "uint32")
        if A[0] > T.float32(0):
            red[0] = A[tx]
            mask[0] = T.tvm_warp_activemask()
            red[0] = red[0] + T.tvm_warp_shuffle_down(mask[0], red[0], 1, 32, 32)
            if tx % 32 == 0:
                B[tx // 32] = red[0]


@T.prim_func(private=True)
def _mixed_guard(A_ptr: T.handle("float32", "global"), B_ptr: T.handle("float32", "global")):
    """The surplus guard joined with a block-uniform condition: the guard's lanes, or none."""
    T.func_attr(CUDA_ATTRS)
    A = T.decl_buffer((64,), data=A_ptr)
    B = T.decl_buffer((2,), data=B_ptr)
    with T.launch_thread("threadIdx.x", 64) as tx:
        red = T.alloc_local((1,))
        mask = T.alloc_local((1,), "uint32")
        if T.likely(tx < 16 and A[0] > T.float32(0)):
            red[0] = A[tx]
            mask[0] = T.tvm_warp_activemask()
            red[0] = red[0] + T.tvm_warp_shuffle_down(mask[0], red[0], 1, 32, 32)
            if tx == 0:
                B[0] = red[0]


@T.prim_func(private=True)
def _data_guard(A_ptr: T.handle("float32", "global"), B_ptr: T.handle("float32", "global")):
    """A branch on each thread's own element: which lanes reach is known at run time only."""
    T.func_attr(CUDA_ATTRS)
    A = T.decl_buffer((64,), data=A_ptr)
    B = T.decl_buffer((2,), data=B_ptr)
    with T.launch_thread("threadIdx.x", 64) as tx:
        red = T.alloc_local((1,))
        mask = T.alloc_local((1,), "uint32")
        if A[tx] > T.float32(0):
            red[0] = A[tx]
            mask[0] = T.tvm_warp_activemask()
            red[0] = red[0] + T.tvm_warp_shuffle_down(mask[0], red[0], 1, 32, 32)
            if tx % 32 == 0:
                B[tx // 32] = red[0]


@T.prim_func(private=True)
def _mask_before_the_branch(
    A_ptr: T.handle("float32", "global"), B_ptr: T.handle("float32", "global")
):
    """The mask is read where every lane is, the shuffle runs where the data says."""
    T.func_attr(CUDA_ATTRS)
    A = T.decl_buffer((64,), data=A_ptr)
    B = T.decl_buffer((64,), data=B_ptr)
    with T.launch_thread("threadIdx.x", 64) as tx:
        red = T.alloc_local((1,))
        mask = T.alloc_local((1,), "uint32")
        red[0] = A[tx]
        mask[0] = T.tvm_warp_activemask()
        if A[tx] > T.float32(0):
            red[0] = red[0] + T.tvm_warp_shuffle_down(mask[0], red[0], 1, 32, 32)
        B[tx] = red[0]


def test_a_reduction_under_the_surplus_thread_guard_takes_the_mask_of_the_body():
    kernel, report = safe_warp_masks(_guarded_16, "guarded_16")
    assert not report.unresolved
    assert report.rewritten == {
        "tvm_warp_activemask": 1,
        "tvm_warp_shuffle_down": 1,
        "tvm_warp_shuffle": 1,
    }
    masks = _shuffle_masks(kernel)
    assert [int(m.value) for m in masks] == [0xFFFF, 0xFFFF]
    assert "tvm_warp_activemask" not in kernel.script()


def test_a_guard_that_cuts_a_warp_takes_a_mask_per_warp():
    kernel, report = safe_warp_masks(_guarded_48, "guarded_48")
    assert not report.unresolved
    (mask,) = _shuffle_masks(kernel)
    reached = _per_thread(kernel, mask)[:48]  # threads 48-63 never get there
    assert reached == [FULL_MASK] * 32 + [0xFFFF] * 16


def test_a_branch_on_a_uniform_value_keeps_every_lane():
    kernel, report = safe_warp_masks(_uniform_guard, "uniform_guard")
    assert not report.unresolved
    assert [int(m.value) for m in _shuffle_masks(kernel)] == [FULL_MASK]


def test_a_guard_joined_with_a_uniform_condition_takes_the_guards_lanes():
    kernel, report = safe_warp_masks(_mixed_guard, "mixed_guard")
    assert not report.unresolved
    assert [int(m.value) for m in _shuffle_masks(kernel)] == [0xFFFF]


def test_lanes_that_depend_on_data_are_left_as_tvm_emitted_them_and_reported():
    kernel, report = safe_warp_masks(_data_guard, "data_guard")
    assert report.unresolved and all("data_guard" in u for u in report.unresolved)
    assert not report.rewritten
    assert kernel.same_as(_data_guard)


# -- the scan of generated sources ---------------------------------------------------------------


def test_the_scan_finds_masks_read_with_activemask():
    source = "\n".join(
        [
            "#define __shfl_sync(mask, var, lane, width) __shfl((var), (lane), (width))",
            "  mask_ptr[0] = __activemask();",
            "  t0_ptr[0] = __shfl_down_sync(mask_ptr[0], red_buf0_ptr[0], 16, 32);",
            "  t1 = __shfl_sync(__activemask(), v, 0, 32);",
            "  t2 = __shfl_down_sync((uint)4294967295, v, 1, 32);",
            "  t3 = __shfl_down_sync(((((int)threadIdx.y) < 2) ? (uint)4294967295 : "
            "(uint)65535), v, 1, 32);",
            "  __syncwarp((mask_ptr[0]));",
            "  __syncwarp((uint)65535);",
        ]
    )
    assert activemask_shuffles(source) == [
        "t0_ptr[0] = __shfl_down_sync(mask_ptr[0], red_buf0_ptr[0], 16, 32);",
        "t1 = __shfl_sync(__activemask(), v, 0, 32);",
        "__syncwarp((mask_ptr[0]));",
    ]


def test_light_shufflenet_shuffles_with_the_full_mask():
    """The model where TVM's own build went wrong: 16 reductions (32 masks read with
    ``__activemask()`` in TVM's pipeline), all reached by whole 256-thread vEUs."""
    target = {"kind": "cuda", "arch": "sm_90"}
    lowered = tvm_rtask.lower(
        load_light_model("shufflenet"), target, verify_occupancy=False, num_veu=132
    )
    ex, _ = tvm_rtask.build(lowered, target)
    source = tvm_rtask.cuda_source(ex)
    assert "__activemask" not in source and activemask_shuffles(source) == []
    masks = _masks(source)
    assert len(masks) == 128 and set(masks) == {"(uint)4294967295"}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the masks were checked, not compiled")
def test_nvcc_compiles_the_persistent_kernel_with_its_masks(tmp_path):
    _nvcc_ptx(tvm_rtask.cuda_source(persistent_build()), tmp_path, "depthwise")


def test_the_mask_a_shuffle_left_alone_reads_keeps_activemask():
    """Writing the full mask where it is read would hand it to a shuffle that only the
    lanes with positive data run."""
    kernel, report = safe_warp_masks(_mask_before_the_branch, "mask_before_the_branch")
    assert kernel.same_as(_mask_before_the_branch)
    assert len(report.unresolved) == 2 and not any(report.rewritten.values())


def test_a_kernel_with_an_operation_left_alone_is_noted_as_a_fallback():
    mod = tvm.IRModule({"data_guard": _data_guard.with_attr("global_symbol", "data_guard")})
    with collecting_fallbacks() as notes:
        assert SafeWarpMasks(mod)["data_guard"].same_as(mod["data_guard"])
    assert [(n["kind"], n["subject"]) for n in notes] == [(WARP_MASK_KEPT, "data_guard")]
