"""Cooperative launch of the persistent kernels (option ``cooperative_launch``).

A persistent kernel is correct only if all its vEUs (thread blocks) are resident at once: a
vEU spinning on a barrier must not hold the SM that a vEU it waits for needs. tvm-rtask
checks this at compile time (``tir/occupancy.py``, ``ptxas -v``). A cooperative launch makes
the driver check it too: it refuses a grid that cannot be co-resident
(``CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE``) instead of starting one that could hang until
the spin timeout.

TVM 0.27's CUDA runtime launches a kernel cooperatively when its launch-parameter tags hold
``tirx.use_cooperative_launch``. ``SplitHostDevice`` writes the tags from the thread axes
only, so :class:`MarkCooperativeLaunch` adds the flag to the rProgram kernels in the device
finalization passes of a TIR pipeline registered under :data:`COOPERATIVE_PIPELINE`. A flag
consumes no launch argument, so the host calls that ``SplitHostDevice`` already emitted stay
valid.
"""

from __future__ import annotations

import tvm
from tvm import tirx

COOPERATIVE_TAG = "tirx.use_cooperative_launch"
DYNAMIC_SHARED_TAG = "tirx.use_dyn_shared_memory"  # must stay the last tag
LAUNCH_PARAMS_ATTR = "tirx.kernel_launch_params"
COOPERATIVE_PIPELINE = "tvm_rtask.cooperative"


def is_persistent_kernel(name: str) -> bool:
    """The device kernels of rPrograms (``LowerRPrograms`` names them ``rprogram_<k>``)."""
    return name.startswith("rprogram_") and name.endswith("_kernel")


@tirx.transform.prim_func_pass(opt_level=0, name="MarkCooperativeLaunch")
class MarkCooperativeLaunch:
    """Add the cooperative-launch flag to the launch parameters of persistent kernels."""

    def transform_function(self, func, mod, ctx):
        name = func.attrs.get("global_symbol") if func.attrs else None
        tags = func.attrs.get(LAUNCH_PARAMS_ATTR) if func.attrs else None
        if name is None or tags is None or not is_persistent_kernel(str(name)):
            return func
        tags = [str(t) for t in tags]
        if COOPERATIVE_TAG in tags:
            return func
        # the dynamic shared memory tag must stay last (LaunchParamConfig checks it)
        at = len(tags) - 1 if tags and tags[-1] == DYNAMIC_SHARED_TAG else len(tags)
        return func.with_attr(LAUNCH_PARAMS_ATTR, [*tags[:at], COOPERATIVE_TAG, *tags[at:]])


def _cooperative_pipeline():
    """TVM's default ``s_tir`` pipeline, then :class:`MarkCooperativeLaunch` on device code."""
    lower, finalize_host, finalize_device = tirx.get_tir_pipeline("s_tir")

    def finalize_device_cooperative():
        return tvm.transform.Sequential([finalize_device(), MarkCooperativeLaunch()])

    return lower, finalize_host, finalize_device_cooperative


def cooperative_pipeline() -> str:
    """The name of the TIR pipeline to pass to ``tvm.compile(tir_pipeline=...)``."""
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP, register_tir_pipeline

    if COOPERATIVE_PIPELINE not in PIPELINE_MAP:
        register_tir_pipeline(COOPERATIVE_PIPELINE, _cooperative_pipeline)
    return COOPERATIVE_PIPELINE


MIN_BLOCKS_ATTR = "tirx.launch_bounds_min_blocks_per_sm"


def _mark_min_blocks(blocks_per_sm: int):
    """``__launch_bounds__(threads, blocks_per_sm)`` on persistent kernels: the attribute is
    read by TVM's CUDA codegen from the device function, which SplitHostDevice makes without
    the PrimFunc's own attributes, so it is set after the split."""

    @tirx.transform.prim_func_pass(opt_level=0, name="MarkMinBlocksPerSM")
    def mark(func, _mod, _ctx):
        name = func.attrs.get("global_symbol") if func.attrs else None
        if name is None or not is_persistent_kernel(str(name)):
            return func
        return func.with_attr(MIN_BLOCKS_ATTR, blocks_per_sm)

    return mark


def persistent_pipeline(blocks_per_sm: int, cooperative: bool) -> str:
    """The TIR pipeline for persistent kernels compiled for ``blocks_per_sm`` vEUs per SM
    (0: no bound), cooperative or not; registered once per combination, by name. Every
    shuffle's mask names the lanes that reach it (``warp_masks.py``)."""
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP, register_tir_pipeline

    name = f"tvm_rtask.persistent.v3.b{blocks_per_sm}{'.coop' if cooperative else ''}"
    if name in PIPELINE_MAP:
        return name

    def make():
        lower, finalize_host, finalize_device = tirx.get_tir_pipeline("s_tir")

        def device():
            from .body_function import check_body_shared_memory
            from .warp_masks import SafeWarpMasks

            # the warp masks of every kernel of the module (ordinary calls too): after
            # LowerWarpMemory, which emits shuffles of its own (run again by TVM's
            # finalization, where it finds nothing left), before LowerIntrin
            passes = [
                tirx.transform.LowerWarpMemory(),
                SafeWarpMasks,
                finalize_device(),
                check_body_shared_memory,
            ]
            if cooperative:
                passes.append(MarkCooperativeLaunch())
            if blocks_per_sm > 0:
                passes.append(_mark_min_blocks(blocks_per_sm))
            return tvm.transform.Sequential(passes)

        return lower, finalize_host, device

    register_tir_pipeline(name, make)
    return name
