"""The models of the GPU window by spec, for the window's commands (``bench/gpu_window.py``,
``bench/gpu_timelines.py``), which both read them and so share this module rather than
importing each other."""

from __future__ import annotations


def load_model(spec: str):
    """``light:NAME`` (onnx's light models, seeded weights), ``zoo:NAME`` (full size),
    ``zoo:NAME:reduced`` or ``zoo:NAME:smoke`` (the harness's tiny overrides); returns
    ``(onnx model, inputs by name)``."""
    kind, name, *variant = spec.split(":")
    if kind == "light":
        from tvm_rtask.testing.onnx_light import load_light_model, random_inputs

        model = load_light_model(name)
        return model, random_inputs(model)
    import tvm_rtask.models as zoo
    from bench.harness import SMOKE_MODELS

    overrides = SMOKE_MODELS.get(name, {}) if variant and variant[0] == "smoke" else {}
    model = zoo.onnx_model(name, reduced=bool(variant), **overrides)
    return model, zoo.sample_inputs(model)
