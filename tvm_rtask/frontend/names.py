"""Names that reach generated C/CUDA source made C identifiers, the model's own names kept.

TVM's ONNX importer names ``main``'s parameters after the ONNX inputs (its own sanitizer
only replaces ``.``), LegalizeOps names each kernel's buffer after the Relax variable it is
given (``tvm/relax/utils.py``, ``gen_call_tir_inputs``: ``name = arg.name``), FuseOps names
a fused function's parameters after its arguments and FuseTIR keeps those names, and the
CUDA code generator prints them as kernel parameters. ONNX's ``gpu_0/data_0`` (ResNet-50,
ShuffleNet, ZFNet-512) thus became ``float* __restrict__ gpu_0/data_0_ptr``, which NVRTC and
nvcc reject with ``expected a ")"``.

:func:`make_names_safe` keeps every public function's parameters (what a caller passes by
name, e.g. ``vm.set_input("main", **{"gpu_0/data_0": x})``) and binds each one whose name
is not a C identifier to an internal variable with a safe name, ``gpu_0_data_0 =
gpu_0/data_0``, in a binding block before the body. Every other variable with such a name
(Relax bindings, private functions' parameters, PrimFunc parameters, buffers and loop
variables) is renamed. The binding is trivial: TVM's default pipelines legalize it as it is
and the VM only aliases a register. A pass that canonicalizes bindings before LegalizeOps
(``relax.transform.CanonicalizeBindings``) folds it back into the parameter: call
:func:`make_names_safe` again after LegalizeOps in such a pipeline.
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import relax

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INVALID = re.compile(r"[^A-Za-z0-9_]")

# C and C++ keywords (CUDA source is C++) and CUDA's own identifiers: a variable named
# ``int`` or ``threadIdx`` is a valid Relax name and an invalid or shadowing C one.
_RESERVED = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires restrict return short signed sizeof static
    static_assert static_cast struct switch template this thread_local throw true try typedef
    typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq
    threadIdx blockIdx blockDim gridDim warpSize
    """.split()
)


def is_c_identifier(name: str) -> bool:
    """Whether ``name`` can name a variable in generated C, C++ or CUDA source."""
    return bool(_IDENTIFIER.fullmatch(name)) and name not in _RESERVED


def safe_name(name: str, used: set[str] | None = None) -> str:
    """A C identifier made from ``name`` (every other character becomes ``_``), distinct from
    the names in ``used``, to which it is added."""
    base = _INVALID.sub("_", name)
    if not base or base[0].isdigit():
        base = f"v_{base}"
    if base in _RESERVED:
        base = f"{base}_"
    used = set() if used is None else used
    out, k = base, 1
    while out in used:
        out, k = f"{base}_{k}", k + 1
    used.add(out)
    return out


def _vars(node) -> list:
    """Every variable occurrence under ``node`` (Relax and TIR variables are one class)."""
    found = []
    tvm_ffi.structural_walk(node, (tvm.ir.expr.Var, found.append))
    return found


def _public(func) -> bool:
    return func.attrs is not None and "global_symbol" in func.attrs


def unsafe_names(mod: tvm.IRModule) -> list[str]:
    """``"function: name"`` for every variable name in ``mod`` that is not a C identifier,
    except public Relax functions' parameters (the model's input names). Empty after
    :func:`make_names_safe`."""
    out = []
    for gvar, func in mod.functions.items():
        keep = set()
        if isinstance(func, relax.Function) and _public(func):
            keep = {p.__chandle__() for p in func.params}
        names = {v.name for v in _vars(func) if v.__chandle__() not in keep}
        out += [f"{gvar.name_hint}: {n}" for n in sorted(names) if not is_c_identifier(n)]
    return out


def _renamed(func, keep: set[int]):
    """``func`` with every variable whose name is not a C identifier replaced by a safely
    named copy (same class and type), except those in ``keep``; and the replacements."""
    occurrences = _vars(func)
    used = {v.name for v in occurrences}
    fresh: dict[int, object] = {}
    for var in occurrences:
        key = var.__chandle__()
        if key not in fresh and key not in keep and not is_c_identifier(var.name):
            fresh[key] = type(var)(safe_name(var.name, used), var.ty)
    if not fresh:
        return func, fresh

    def visit(var):
        return fresh.get(var.__chandle__(), var)

    return tvm_ffi.structural_map(func, (tvm.ir.expr.Var, visit)), fresh


def _safe_relax_function(func: relax.Function) -> relax.Function:
    if not _public(func):
        return _renamed(func, set())[0]
    # A public function keeps its parameters: rename them everywhere, then put the original
    # parameters back and bind each internal name to its parameter.
    renamed, fresh = _renamed(func, set())
    if not fresh:
        return func
    bindings = [
        relax.VarBinding(fresh[p.__chandle__()], p) for p in func.params if p.__chandle__() in fresh
    ]
    body = renamed.body
    blocks = [relax.BindingBlock(bindings), *body.blocks] if bindings else list(body.blocks)
    return relax.Function(
        func.params,
        relax.BlockBuilder().normalize(relax.SeqExpr(blocks, body.body)),
        func.ret_ty,
        func.is_pure,
        func.attrs,
        func.span,
    )


def make_names_safe(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every name that reaches generated source a C identifier; public Relax
    functions keep their parameters' names. ``mod`` itself when nothing needs renaming."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = _safe_relax_function(func)
        elif isinstance(func, tvm.tirx.PrimFunc):
            new = _renamed(func, set())[0]
        else:
            continue
        if not new.same_as(func):
            updates[gvar] = new
    if not updates:
        return mod
    out = mod.clone()
    for gvar, func in updates.items():
        out[gvar] = func
    return out
