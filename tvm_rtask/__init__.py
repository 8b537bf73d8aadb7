"""tvm-rtask: Rammer-style persistent kernels for Apache TVM.

Stages: frontend (model -> Relax) -> relax_passes.fuse (prepare) -> backend make_rkernels
(rKernels) -> relax_passes.extract (graph) -> policies (rPrograms) -> relax_passes.
lower_rprograms + backend dispatch (persistent kernels) -> backend build (executable);
docs/design.md, "From model to kernel", names one file per step.

``tvm_rtask.core`` and ``tvm_rtask.policies`` are pure Python; the public API below imports
TVM on first use, so importing the package itself stays cheap.
"""

__version__ = "0.1.0"

_LAZY = {
    "compile": ("api", "compile"),
    "compile_with_plan": ("api", "compile_with_plan"),
    "plan": ("api", "plan"),
    "lower": ("api", "lower"),
    "build": ("api", "build"),
    "cuda_source": ("api", "cuda_source"),
    "rtask_pipeline": ("relax_passes", "rtask_pipeline"),
    "frontend": ("frontend", None),
    "models": ("models", None),
}

__all__ = ["__version__", *_LAZY]


def _register_config_keys_if_tvm_is_loaded() -> None:
    """Make ``PassContext(config={"rtask.policy": ...})`` valid as soon as possible.

    Registration needs TVM; importing it here would make ``tvm_rtask.core`` (pure Python)
    load TVM, so it happens now only when TVM is already imported, else on first API use.
    """
    import sys

    if "tvm" in sys.modules:
        from .runtime import streams  # noqa: F401 - registers tvm_rtask.streams.*
        from .runtime.config import register_config_options

        register_config_options()


_register_config_keys_if_tvm_is_loaded()


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tvm_rtask' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    module = importlib.import_module(f".{module_name}", __name__)
    # the frontend or the zoo may be a user's first use: they load TVM, so the config keys
    # can be registered now (a PassContext with "rtask.policy" failed after frontend.load)
    _register_config_keys_if_tvm_is_loaded()
    return module if attr is None else getattr(module, attr)
