"""The convolution PrimFuncs of the models the CUDA rules are checked on, as tvm-rtask's
prepare step (legalize, fuse) gives them, and a CPU run of a scheduled GPU PrimFunc."""

from __future__ import annotations

import functools

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.target import Target

import tvm_rtask
from tvm_rtask import models as zoo
from tvm_rtask.backend.cuda.backend import schedule_target
from tvm_rtask.relax_passes import RTaskPrepare
from tvm_rtask.testing.onnx_light import load_light_model

ARCH = "sm_90"
TARGET = Target({"kind": "cuda", "arch": ARCH}, host="llvm")
CAPPED = schedule_target(TARGET, 256)  # the vEU's thread cap, as the backend passes it

# (name, model loader): SqueezeNet (light ONNX), the zoo's ResNeXt-29 (branches, and the
# grouped form), NASNet-CIFAR (separable = depthwise + 1x1), reduced unless "full"
MODELS = {
    "squeezenet": lambda: tvm_rtask.frontend.load(load_light_model("squeezenet")),
    "resnext29": lambda: zoo.get("resnext29", reduced=True)[0],
    "resnext29_grouped": lambda: zoo.get("resnext29", reduced=True, grouped=True)[0],
    "nasnet_cifar": lambda: zoo.get("nasnet_cifar", reduced=True)[0],
    "resnext29_full": lambda: zoo.get("resnext29")[0],
    "resnext29_grouped_full": lambda: zoo.get("resnext29", grouped=True)[0],
}


@functools.cache
def convs(model: str) -> dict[str, tirx.PrimFunc]:
    """Every distinct convolution PrimFunc of ``model``, by name."""
    prepared = RTaskPrepare(None, TARGET)(MODELS[model]())
    return {
        gv.name_hint: f
        for gv, f in prepared.functions.items()
        if isinstance(f, tirx.PrimFunc) and "conv2d" in gv.name_hint
    }


def serial_on_cpu(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A GPU-scheduled PrimFunc made runnable on llvm without changing what it computes:
    every shared/local buffer set to global scope (``set_scope``, a schedule primitive) and
    every thread-bound loop made serial. Each thread loop is its own loop nest in TIR, so
    running the nests one after the other is what ``__syncthreads`` between them ensures."""
    sch = s_tir.Schedule(func)
    names: list[str] = []
    tvm_ffi.structural_walk(
        func.body,
        lambda n: (
            names.append(n.name_hint)
            if isinstance(n, s_tir.SBlock) and n.name_hint != "root"
            else None
        ),
    )
    for name in names:
        block = sch.get_sblock(name)
        for i, write in enumerate(sch.get(block).writes):
            if str(write.source.scope()) != "global":
                sch.set_scope(block, i, "global")
    scheduled = sch.mod["main"]

    def unbind(loop):
        if loop.thread_binding is None:
            return loop
        return tirx.For(
            loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, None,
            dict(loop.annotations),
        )  # fmt: skip

    return scheduled.with_body(tvm_ffi.structural_map(scheduled.body, (tirx.For, unbind)))


def run_on_cpu(func: tirx.PrimFunc, args: list[np.ndarray]) -> np.ndarray:
    """Run ``func`` on llvm; the last argument is the output."""
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    lib = tvm.tirx.build(mod, target="llvm")
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def random_args(func: tirx.PrimFunc, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params
    ]
