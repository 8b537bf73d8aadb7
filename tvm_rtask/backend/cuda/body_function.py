"""rKernel bodies as CUDA device functions (option ``cuda_body_functions``).

Inlined into the persistent kernel, every distinct rKernel body shares one register
allocation with all the others, and nvcc keeps values of many bodies live across the whole
entry loop: reduced SqueezeNet's wavefront kernel spills 1,740 bytes at 80 registers although
no body alone spills more than 24 (docs/cuda-kernels.md: what was tried). As a
``__device__ __noinline__`` function, each body gets its own register allocation, and one
function serves every rProgram of the model that runs it. The dispatcher makes functions of
the bodies that use shared memory (``CUDAProgramCode.as_function``); small ones stay inlined.

How, with TVM 0.27 (it has no device-function calls with shared memory):

* :func:`make_body_function` wraps the rKernel into an ordinary one-block kernel: a
  ``threadIdx.x`` loop of the vEU's threads around the body (surplus threads guarded as in
  the dispatcher), the rTask id a scalar parameter. TVM lowers it as any kernel: its own
  ``__syncthreads``, its cross-thread reductions. Its shared buffers are ``shared.dyn``, so
  every body's shared memory is one ``extern __shared__`` array at the same address: bodies
  run one at a time in a vEU, their shared memory overlaps instead of adding up;
* the dispatcher calls it by name (``call_extern``) with the operands' addresses and the
  rTask id, with a ``__syncthreads`` after each call (the next rTask reuses the shared
  memory), and allocates the largest body's dynamic shared memory for its launch;
* :func:`postprocess_source`, TVM's ``tvm_callback_cuda_postproc`` hook (run on the CUDA
  source before it is stored in the module or compiled), turns ``__global__ void
  __launch_bounds__(...) rtask_body_<hash>_kernel(`` into ``__device__ __noinline__ void``.
  TVM still lists the functions in the module's function table; nothing launches them.
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import Call

from ...errors import CapacityError
from ...tir.analysis import allocated_buffers, buffer_bytes
from .rkernel import CUDARKernel, guard_surplus_threads, shared_buffers

BODY_PREFIX = "rtask_body_"
# attribute of a dispatcher PrimFunc: the dynamic shared memory it is launched with; of a
# body function: the dynamic shared memory it uses
DYNAMIC_SHARED_ATTR = "rtask.dynamic_shared_bytes"
# what the shared-memory check's error says (the build re-raises it as a CapacityError)
SHARED_MEMORY_SHORT = "bytes of dynamic shared memory, but its rKernel body"
# attribute of a dispatcher PrimFunc: the device functions (body kernels) it calls
BODY_FUNCTIONS_ATTR = "rtask.body_functions"
DYN_SHARED = "shared.dyn"
ARG_PREFIX = "rtask_arg"
CALL_SUFFIX = "_call"  # the wrapper of TVM's <name>_kernel: <name>_kernel_call
_GLOBAL_BODY = re.compile(
    r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?('
    + BODY_PREFIX
    + r"\w+_kernel)\(([^)]*)\)(;| \{)"
)
_ARG = re.compile(ARG_PREFIX + r"(\d+)")


def body_function_name(kernel: CUDARKernel, threads: int) -> str:
    """A name from the body's content and block size (equal bodies of different rPrograms
    share one function) that also says how many operands it takes."""
    digest = tvm_ffi.structural_hash(kernel.func) ^ (threads * 0x9E3779B97F4A7C15)
    return f"{BODY_PREFIX}{digest & 0xFFFFFFFFFFFF:012x}_a{len(kernel.func.params) - 2}"


def call_name(name: str) -> str:
    """What the dispatcher calls for body function ``name``: a wrapper that takes every
    operand in order (:func:`postprocess_source` writes it next to TVM's ``<name>_kernel``)."""
    return f"{name}_kernel{CALL_SUFFIX}"


def _like(buf, name: str, scope: str):
    """A new buffer of ``buf``'s type under another name and storage scope."""
    ty = buf.ty
    return tirx.decl_buffer(
        ty.shape,
        ty.dtype,
        name,
        strides=list(ty.strides) or None,
        elem_offset=ty.elem_offset,
        scope=scope,
        data_alignment=ty.data_alignment,
        offset_factor=ty.offset_factor,
    )


def _dynamic_shared(body: tirx.Stmt, names: set[str]) -> tirx.Stmt:
    """The ``shared`` buffers ``names`` that ``body`` allocates, as ``shared.dyn`` buffers."""
    renamed: dict = {}
    for buf in allocated_buffers(body):
        if buf.scope() == "shared" and buf.name in names:
            renamed.setdefault(buf.__chandle__(), _like(buf, buf.name, DYN_SHARED))
    if not renamed:
        return body
    return tvm_ffi.structural_map(body, (tirx.Var, lambda v: renamed.get(v.__chandle__(), v)))


def make_body_function(kernel: CUDARKernel, threads: int, name: str) -> tirx.PrimFunc:
    """``kernel`` as a one-block kernel of ``threads`` threads taking its buffers and the
    rTask id (see the module docstring)."""
    func = s_tir.renew_defs(kernel.func)
    *buffer_params, rtask_param, tid_param = func.params
    # parameters named by position: the post-processing finds each in the signature TVM
    # prints, whatever order it puts them in and whichever it leaves out as unused
    tx = tirx.Var("tid", "int32")
    args = [_like(b, f"{ARG_PREFIX}{k}", "global") for k, b in enumerate(buffer_params)]
    rtask = tirx.Var(f"{ARG_PREFIX}{len(args)}", "int32")
    mapping = {b.__chandle__(): a for b, a in zip(buffer_params, args, strict=True)}
    mapping[tid_param.__chandle__()] = tx
    mapping[rtask_param.__chandle__()] = rtask
    body = tvm_ffi.structural_map(func.body, (tirx.Var, lambda v: mapping.get(v.__chandle__(), v)))
    if kernel.threads < threads:
        body = guard_surplus_threads(body, tx, kernel.threads)
    loop = tirx.For(
        tx,
        tirx.IntImm("int32", 0),
        tirx.IntImm("int32", threads),
        tirx.ForKind.THREAD_BINDING,
        body,
        thread_binding=tirx.IterVar(None, tx, 1, "threadIdx.x"),
    )
    # a one-block grid around it, as in any kernel: TVM places what it allocates for a
    # cross-thread reduction inside the outermost launch axis (without one, it became a
    # parameter)
    block = tirx.Var("block", "int32")
    loop = tirx.For(
        block,
        tirx.IntImm("int32", 0),
        tirx.IntImm("int32", 1),
        tirx.ForKind.THREAD_BINDING,
        loop,
        thread_binding=tirx.IterVar(None, block, 1, "blockIdx.x"),
    )
    root = s_tir.SBlock([], [], [], "root", loop)
    new = tirx.PrimFunc(
        [*args, rtask],
        s_tir.SBlockRealize([], True, root),
    )
    # shared buffers of more than one element once compacted become dynamic; TVM's merge
    # of dynamic shared memory fails on one-element buffers (it treats them as scalars),
    # which stay static __shared__ (a few bytes per body)
    buffers = shared_buffers(new)
    dynamic = {n for n, (numel, _) in buffers.items() if numel > 1}
    new = tirx.PrimFunc(new.params, _dynamic_shared(new.body, dynamic))
    attrs = {
        "global_symbol": name,
        "s_tir": True,
        "tirx.is_scheduled": True,
        DYNAMIC_SHARED_ATTR: sum(buffers[n][1] for n in dynamic),
    }
    return new.with_attrs(attrs)


def _wrapper(name: str, params: str) -> str:
    """``<name>_call(void* a0, ..., int a<n>)``, calling ``name`` with the parameters TVM kept
    (``params``, as printed), each cast to its printed type."""
    operands = int(name.rsplit("_a", 1)[1].removesuffix("_kernel"))
    passed = []
    for param in filter(None, (p.strip() for p in params.split(","))):
        ctype, _, pname = param.rpartition(" ")
        found = _ARG.search(pname)
        if found is None:
            raise ValueError(f"unexpected parameter {param!r} of {name} in the CUDA source")
        ctype = ctype.replace("__restrict__", "").strip()
        passed.append(f"({ctype})a{found.group(1)}")
    decls = [f"void* a{k}" for k in range(operands)] + [f"int a{operands}"]
    return (
        f"__device__ __forceinline__ void {call_name(name.removesuffix('_kernel'))}("
        f"{', '.join(decls)}) {{ {name}({', '.join(passed)}); }}\n"
    )


def postprocess_source(code: str) -> str:
    """Body kernels become ``__device__ __noinline__`` functions, each with a wrapper that
    takes its operands in order (after its first declaration, before any caller)."""
    done: set[str] = set()

    def rewrite(match: re.Match) -> str:
        name, params, end = match.group(1), match.group(2), match.group(3)
        head = f'extern "C" __device__ __noinline__ void {name}({params}){end}'
        if name in done:
            return head
        done.add(name)
        if end.strip() == "{":  # a definition first: the wrapper must follow it
            raise ValueError(f"{name} is defined before it is declared in the CUDA source")
        return head + "\n" + _wrapper(name, params)

    return _GLOBAL_BODY.sub(rewrite, code)


_installed = False


def install_postproc() -> None:
    """Register :func:`postprocess_source` as ``tvm_callback_cuda_postproc`` (after any
    post-processing installed before it)."""
    global _installed
    if _installed:
        return
    previous = tvm_ffi.get_global_func("tvm_callback_cuda_postproc", allow_missing=True)

    def postproc(code, *rest):
        text = str(previous(code, *rest)) if previous is not None else str(code)
        return postprocess_source(text)

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", postproc, override=True)
    _installed = True


def _dynamic_shared_bytes(func: tirx.PrimFunc) -> int:
    """Bytes of ``shared.dyn`` memory a lowered device function allocates."""
    return sum(buffer_bytes(b) for b in allocated_buffers(func.body) if b.scope() == DYN_SHARED)


def _called_bodies(func: tirx.PrimFunc) -> set[str]:
    names: set[str] = set()

    def visit(node):
        if isinstance(node, Call) and getattr(node.op, "name", "") == "tirx.call_extern":
            callee = str(node.args[0].value)
            if callee.startswith(BODY_PREFIX) and callee.endswith(f"_kernel{CALL_SUFFIX}"):
                names.add(callee.removesuffix(CALL_SUFFIX))

    tvm_ffi.structural_walk(func.body, visit)
    return names


@tvm.transform.module_pass(opt_level=0, name="CheckBodySharedMemory")
def check_body_shared_memory(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every body function a persistent kernel calls fits in the dynamic shared memory the
    kernel is launched with (the dispatcher sizes it from the rKernels before lowering)."""
    sizes = {
        gv.name_hint: _dynamic_shared_bytes(f)
        for gv, f in mod.functions_items()
        if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith(BODY_PREFIX)
    }
    if not sizes:
        return mod
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or gv.name_hint.startswith(BODY_PREFIX):
            continue
        bodies = _called_bodies(func)
        if not bodies:
            continue
        have = _dynamic_shared_bytes(func)
        for body in bodies:
            if sizes.get(body, 0) > have:
                raise CapacityError(
                    f"{gv.name_hint} is launched with {have} {SHARED_MEMORY_SHORT} {body} uses "
                    f"{sizes[body]}; build with "
                    "cuda_body_functions=False"
                )
    return mod
