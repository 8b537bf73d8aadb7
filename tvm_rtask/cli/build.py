"""Models and options on the command line: load a model (an ``.onnx`` file or a zoo name),
check the target and options before any work, and compile into an executable with the
metadata an artifact carries."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..options import parse_key_values, parse_value  # noqa: F401  (the command lines' names)
from .artifact import META_FORMAT, META_VERSION
from .errors import CLIError, first_line
from .inputs import InputInfo, model_inputs


@dataclass
class LoadedModel:
    """A model ready to compile: the Relax module, where it came from, its inputs."""

    name: str
    mod: Any  # tvm.IRModule
    inputs: list[InputInfo]
    onnx: Any = None  # onnx.ModelProto when the source was ONNX or the zoo
    source: dict[str, Any] = field(default_factory=dict)


# -- options --------------------------------------------------------------------------------------
def parse_target(text: str):
    """A target name (``llvm``, ``cuda``), a TVM tag, or a JSON dict string."""
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise CLIError(f"--target {text!r} is not valid JSON: {err}") from None
    return text


def check_target(target):
    """The ``tvm.target.Target`` of a parsed ``--target``: llvm or cuda, or a one-line error
    (TVM's own for an unknown kind is several lines and a ValueError)."""
    from ..errors import RTaskError
    from ..relax_passes import as_target

    try:
        return as_target(target)
    except RTaskError as err:
        raise CLIError(f"--target {_show(target)}: {first_line(err)}") from None
    except Exception as err:
        raise CLIError(f"--target {_show(target)} is not a target: {first_line(err)}") from None


def _show(target) -> str:
    return repr(target if isinstance(target, str) else json.dumps(target))


def target_kind(target) -> str:
    return str(check_target(target).kind.name)


def check_options(options: dict) -> dict:
    """Reject what :func:`tvm_rtask.compile` would reject (unknown names, impossible values)
    now rather than after importing the model. Returns ``options``."""
    from ..options import resolve_options

    resolve_options(dict(options))  # raises OptionError, one line
    return options


def split_pass_config(pass_config: dict | None) -> tuple[dict, dict]:
    """``(rtask options, TVM PassContext config)``: ``rtask.<option>`` keys are options."""
    options, config = {}, {}
    for key, value in (pass_config or {}).items():
        if key.startswith("rtask."):
            options[key[len("rtask.") :]] = value
        else:
            config[key] = value
    return options, config


def pass_context(opt_level: int = 3, config: dict | None = None, disabled_pass=None):
    """TVM's PassContext, or a one-line error naming the bad ``--pass-config``."""
    import tvm

    try:
        return tvm.transform.PassContext(
            opt_level=opt_level, config=config or {}, disabled_pass=disabled_pass or []
        )
    except (AttributeError, ValueError, TypeError) as err:
        raise CLIError(f"bad --pass-config: {first_line(err)}") from None


# -- models ---------------------------------------------------------------------------------------
def _shape_hint(model, name: str) -> str:
    """``--input-shapes 'x:[?,16]'``: the input's ONNX dimensions, ``?`` where dynamic."""
    for value in getattr(getattr(model, "graph", None), "input", []):
        if value.name == name:
            dims = value.type.tensor_type.shape.dim
            text = ",".join(str(d.dim_value) if d.HasField("dim_value") else "?" for d in dims)
            return f"--input-shapes '{name}:[{text}]' (a number for each ?)"
    return f"--input-shapes '{name}:[...]'"


def command_line_wording(err: Exception, path: str) -> str:
    """A frontend message for command-line users: the frontend suggests the Python
    ``shape_dict`` argument, the command lines take ``--input-shapes``."""
    message = first_line(err)
    if "shape_dict" not in message:
        return message
    match = re.search(r"input '([^']+)'", message)
    name = match.group(1) if match else "NAME"
    head = re.split(r";?\s*give\b|shape_dict", message)[0].rstrip(" ;,")
    import onnx
    from google.protobuf.message import DecodeError

    model = None
    try:
        model = onnx.load(path, load_external_data=False)
    except (OSError, DecodeError):  # the hint then has no dimensions
        pass
    return f"{head}; give static shapes with {_shape_hint(model, name)}"


def load_model(
    spec: str,
    batch: int = 1,
    reduced: bool = False,
    seed: int = 0,
    shape_dict: dict | None = None,
) -> LoadedModel:
    """``spec`` is an ``.onnx`` path, a zoo name or one of torchvision's classifiers
    (``tvm_rtask.models.real``, batch 1); zoo and torchvision models take reduced/seed, zoo
    models batch too."""
    from .. import frontend, models
    from ..errors import FrontendError
    from ..models.real import REAL_MODELS, load_real_model

    if spec in models.names():
        model = models.onnx_model(spec, batch=batch, reduced=reduced, seed=seed)
        mod = frontend.load(model)
        source = {"zoo": spec, "batch": batch, "reduced": reduced, "seed": seed}
        return LoadedModel(spec, mod, model_inputs(mod), model, source)
    if spec in REAL_MODELS:
        if batch != 1:
            raise CLIError(f"{spec!r} (torchvision's architecture) is committed at batch 1 only")
        model = load_real_model(spec, "reduced" if reduced else "full", seed=seed)
        mod = frontend.load(model)
        source = {"torchvision": spec, "reduced": reduced, "seed": seed}
        return LoadedModel(spec, mod, model_inputs(mod), model, source)
    path = Path(spec)
    if path.suffix.lower() != ".onnx" and not path.exists():
        raise CLIError(
            f"{spec!r} is neither an .onnx file nor a model name; zoo: "
            f"{', '.join(models.names())}; torchvision: {', '.join(REAL_MODELS)}"
        )
    import onnx

    if path.exists() and path.is_dir():
        raise CLIError(f"{spec!r} is a directory, not an .onnx file")
    try:
        mod = frontend.load(str(path), shape_dict)
    except FrontendError as err:
        raise CLIError(command_line_wording(err, str(path))) from None
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path))
    except (OSError, DecodeError):  # read by frontend.load just now: gone or changed since
        model = None
    return LoadedModel(path.stem, mod, model_inputs(mod), model, {"onnx": str(path)})


# -- compiling ------------------------------------------------------------------------------------
def compile_model(
    model: LoadedModel,
    target,
    use_rtask: bool = True,
    options: dict | None = None,
    pass_config: dict | None = None,
    opt_level: int = 3,
    disabled_pass: list[str] | None = None,
):
    """Compile with tvm-rtask (or TVM's default build when ``use_rtask`` is False).

    ``pass_config`` keys ``rtask.<option>`` become tvm-rtask options (a keyword in
    ``options`` wins); other keys go to TVM's PassContext. Returns ``(executable, metadata)``;
    the metadata's ``compile_seconds`` is the wall time of the build alone.
    """
    import tvm

    import tvm_rtask

    from ..runtime import num_threads

    options = dict(options or {})
    from_config, config = split_pass_config(pass_config)
    for key, value in from_config.items():
        options.setdefault(key, value)
    tvm_target = check_target(target)
    start = time.perf_counter()
    with pass_context(opt_level, config, disabled_pass):
        if use_rtask:
            ex = tvm_rtask.compile(model.mod, tvm_target, **options)
        else:
            ex = tvm.compile(model.mod, target=tvm_target)
    seconds = time.perf_counter() - start
    kind = str(tvm_target.kind.name)
    threads = num_threads() if kind == "llvm" else 1
    if kind == "llvm" and options.get("num_veu"):
        threads = max(threads, int(options["num_veu"]))
    cpu = cpu_metadata(tvm_target) if kind == "llvm" else {}
    meta = {
        "format": META_FORMAT,
        "version": META_VERSION,
        "model": model.name,
        "source": model.source,
        "target": kind,
        "target_full": str(tvm_target),
        **cpu,
        "device": "cuda" if kind == "cuda" else "cpu",
        "pass": "rtask" if use_rtask else "none",
        "options": {k: v for k, v in options.items() if _jsonable(v)},
        "threads": threads,
        "inputs": [i.to_dict() for i in model.inputs],
        "compile_seconds": round(seconds, 3),
        "tvm_rtask": tvm_rtask.__version__,
        "tvm": tvm.__version__,
    }
    return ex, meta


def cpu_metadata(target) -> dict:
    """What an llvm artifact says about the CPU it needs: ``mcpu`` (None: any CPU of the
    architecture) and ``cpu_features``, the instruction-set extensions its code may use,
    which ``run`` checks against the host's before it loads the library."""
    from ..backend.cpu.host import target_isa_features

    mcpu = str(target.attrs.get("mcpu", "") or "") or None
    return {"mcpu": mcpu, "cpu_features": target_isa_features(target)}


def _jsonable(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
