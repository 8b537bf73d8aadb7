"""The ``tvm-rtask`` command line: compile, run, plan, bench, list and export models.

::

    tvm-rtask compile MODEL [-o model.so] [--target llvm] [--policy wavefront] [--num-veu N]
                      [--report r.json] [--gantt g.png] [--emit-source DIR]
    tvm-rtask run ARTIFACT [--inputs x.npz] [--outputs y.npz] [--repeat N]
    tvm-rtask plan MODEL [--policy P ...] [--num-veu N] [--json plan.json]
    tvm-rtask tune MODEL --db DIR [--target llvm] [--trials N] [--seconds S] [--rpc H:P:KEY]
    tvm-rtask bench [harness options]        (bench/harness.py of a source checkout)
    tvm-rtask models                         (the zoo)
    tvm-rtask export-onnx NAME -o model.onnx

``MODEL`` is an ``.onnx`` file or a name of :mod:`tvm_rtask.models`. An artifact is a shared
library exported with :func:`tvm_rtask.runtime.export_library` (it links the native runtime)
that also embeds a small JSON description (inputs, thread count, target) behind the C symbol
``tvm_rtask_artifact_metadata``, or a ``.tar`` holding ``mod.so`` and ``metadata.json`` (the
``tvmc`` package form). ``run`` needs nothing else: it sizes TVM's thread pool to the
artifact's vEU count before the first call.

Errors are one line on stderr (``tvm-rtask: error: ...``) and exit status 1; set
``TVM_RTASK_DEBUG=1`` to get the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PROG = "tvm-rtask"
META_SYMBOL = "tvm_rtask_artifact_metadata"
META_FORMAT = "tvm-rtask-artifact"
TAR_LIB = "mod.so"
TAR_META = "metadata.json"
DEBUG_ENV = "TVM_RTASK_DEBUG"


class CLIError(Exception):
    """A user error found by the command line itself (bad file, bad flag value)."""


# -- models ---------------------------------------------------------------------------------
@dataclass
class InputInfo:
    name: str
    shape: list[int]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype}


@dataclass
class LoadedModel:
    """A model ready to compile: the Relax module, where it came from, its inputs."""

    name: str
    mod: Any  # tvm.IRModule
    inputs: list[InputInfo]
    onnx: Any = None  # onnx.ModelProto when the source was ONNX or the zoo
    source: dict[str, Any] = field(default_factory=dict)


def parse_shapes(text: str | None) -> dict[str, list[int]] | None:
    """tvmc's ``--input-shapes`` syntax: ``"data:[1,3,224,224] mask:[1,128]"``."""
    if not text:
        return None
    shapes = {}
    for m in re.finditer(r"([^\s:]+):\[([\d,\s]*)\]", text):
        dims = [d for d in m.group(2).replace(" ", "").split(",") if d]
        shapes[m.group(1)] = [int(d) for d in dims]
    leftover = re.sub(r"([^\s:]+):\[([\d,\s]*)\]", "", text).strip(" ,")
    if not shapes or leftover:
        raise CLIError(
            f"cannot parse --input-shapes {text!r}; expected e.g. 'data:[1,3,224,224] mask:[1,8]'"
        )
    return shapes


def _main_inputs(mod) -> list[InputInfo]:
    from tvm import relax

    infos = []
    for p in mod["main"].params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType):
            raise CLIError(f"input {p.name!r} of the model is not a tensor ({ty})")
        infos.append(InputInfo(p.name, [int(v) for v in ty.shape.values], str(ty.dtype)))
    return infos


def load_model(
    spec: str,
    batch: int = 1,
    reduced: bool = False,
    seed: int = 0,
    shape_dict: dict | None = None,
) -> LoadedModel:
    """``spec`` is an ``.onnx`` path or a zoo name; zoo models take batch/reduced/seed."""
    from . import frontend, models

    if spec in models.names():
        model = models.onnx_model(spec, batch=batch, reduced=reduced, seed=seed)
        mod = frontend.load(model)
        source = {"zoo": spec, "batch": batch, "reduced": reduced, "seed": seed}
        return LoadedModel(spec, mod, _main_inputs(mod), model, source)
    path = Path(spec)
    if path.suffix.lower() != ".onnx" and not path.exists():
        raise CLIError(
            f"{spec!r} is neither an .onnx file nor a zoo model; zoo models: "
            f"{', '.join(models.names())}"
        )
    import onnx

    if path.exists() and path.is_dir():
        raise CLIError(f"{spec!r} is a directory, not an .onnx file")
    mod = frontend.load(str(path), shape_dict)
    try:
        model = onnx.load(str(path))
    except Exception:  # frontend.load has already reported unreadable files
        model = None
    return LoadedModel(path.stem, mod, _main_inputs(mod), model, {"onnx": str(path)})


# -- options ----------------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """``2`` -> 2, ``true`` -> True, anything else stays a string."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_key_values(items: list[str] | None, flag: str) -> dict[str, Any]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise CLIError(f"{flag} expects name=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = parse_value(value.strip())
    return out


def parse_target(text: str):
    """A target name (``llvm``, ``cuda``), a TVM tag, or a JSON dict string."""
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise CLIError(f"--target {text!r} is not valid JSON: {err}") from None
    return text


def target_kind(target) -> str:
    from .relax_passes import as_target

    return str(as_target(target).kind.name)


# -- compiling and artifacts ---------------------------------------------------------------------
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
    ``options`` wins); other keys go to TVM's PassContext. Returns ``(executable, metadata)``.
    """
    import tvm

    import tvm_rtask

    from .relax_passes import as_target
    from .runtime import num_threads

    options = dict(options or {})
    config = {}
    for key, value in (pass_config or {}).items():
        if key.startswith("rtask."):
            options.setdefault(key[len("rtask.") :], value)
        else:
            config[key] = value
    tvm_target = as_target(target)
    start = time.perf_counter()
    try:
        ctx = tvm.transform.PassContext(
            opt_level=opt_level, config=config, disabled_pass=disabled_pass or []
        )
    except (AttributeError, ValueError, TypeError) as err:
        raise CLIError(f"bad --pass-config: {err}") from None
    with ctx:
        if use_rtask:
            ex = tvm_rtask.compile(model.mod, tvm_target, **options)
        else:
            ex = tvm.compile(model.mod, target=tvm_target)
    seconds = time.perf_counter() - start
    kind = str(tvm_target.kind.name)
    threads = num_threads() if kind == "llvm" else 1
    if kind == "llvm" and options.get("num_veu"):
        threads = max(threads, int(options["num_veu"]))
    meta = {
        "format": META_FORMAT,
        "version": 1,
        "model": model.name,
        "source": model.source,
        "target": str(tvm_target.kind.name),
        "target_full": str(tvm_target),
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


def _jsonable(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _meta_source(meta: dict) -> str:
    """A C source defining ``const char* tvm_rtask_artifact_metadata(void)``."""
    data = json.dumps(meta, sort_keys=True).encode()
    body = ",".join(str(b) for b in data)
    return (
        "/* tvm-rtask artifact metadata (JSON), linked into the exported library. */\n"
        '#ifdef __cplusplus\nextern "C" {\n#endif\n'
        f"static const unsigned char rtask_meta[] = {{{body},0}};\n"
        '__attribute__((visibility("default"))) const char* '
        f"{META_SYMBOL}(void) {{ return (const char*)rtask_meta; }}\n"
        "#ifdef __cplusplus\n}\n#endif\n"
    )


def save_artifact(ex, path: str | os.PathLike, meta: dict) -> str:
    """Export ``ex`` to ``path``: a ``.so`` with the metadata linked in, or a ``.tar`` with
    ``mod.so`` and ``metadata.json``."""
    from .runtime import export_library

    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CLIError(f"output directory {parent!r} does not exist")
    with tempfile.TemporaryDirectory(prefix="tvm-rtask-") as tmp:
        src = os.path.join(tmp, "rtask_meta.c")
        with open(src, "w") as f:
            f.write(_meta_source(meta))
        if path.endswith(".tar"):
            lib = os.path.join(tmp, TAR_LIB)
            export_library(ex, lib, options=[src])
            meta_path = os.path.join(tmp, TAR_META)
            with open(meta_path, "w") as f:
                json.dump(meta, f, indent=1, sort_keys=True)
            with tarfile.open(path, "w") as tar:
                tar.add(lib, arcname=TAR_LIB)
                tar.add(meta_path, arcname=TAR_META)
        else:
            export_library(ex, path, options=[src])
    return path


@dataclass
class Artifact:
    lib_path: str
    meta: dict | None
    _tmp: Any = None  # TemporaryDirectory kept alive while the library is in use


def load_artifact(path: str | os.PathLike) -> Artifact:
    """Open a ``.so`` or ``.tar`` artifact; its metadata is None for a foreign library."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CLIError(f"artifact {path!r} does not exist")
    if tarfile.is_tarfile(path):
        tmp = tempfile.TemporaryDirectory(prefix="tvm-rtask-run-")
        with tarfile.open(path) as tar:
            names = tar.getnames()
            if TAR_LIB not in names:
                raise CLIError(f"{path!r} is a tar without {TAR_LIB}: not a compiled package")
            for name in (TAR_LIB, TAR_META):
                if name in names:
                    member = tar.getmember(name)
                    if not member.isfile():
                        raise CLIError(f"{path!r}: {name} is not a regular file")
                    with (
                        tar.extractfile(member) as src,
                        open(os.path.join(tmp.name, name), "wb") as dst,
                    ):
                        dst.write(src.read())
        meta = None
        meta_path = os.path.join(tmp.name, TAR_META)
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
        return Artifact(os.path.join(tmp.name, TAR_LIB), meta, tmp)
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise CLIError(f"{path!r} is neither a shared library nor a .tar package")
    return Artifact(os.path.abspath(path), None)


def _read_embedded_meta(lib_path: str) -> dict | None:
    import ctypes

    try:
        lib = ctypes.CDLL(lib_path)
        func = getattr(lib, META_SYMBOL)
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_char_p
    try:
        return json.loads(func().decode())
    except (ValueError, UnicodeDecodeError):
        return None


# -- running --------------------------------------------------------------------------------------
def _flatten(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(_flatten(r))
    return out


def _fill(shape, dtype, mode: str, rng) -> np.ndarray:
    if mode == "zeros":
        return np.zeros(shape, dtype)
    if mode == "ones":
        return np.ones(shape, dtype)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(0, 128, shape).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def read_inputs(path: str | None) -> dict[str, np.ndarray]:
    if not path:
        return {}
    if not os.path.isfile(path):
        raise CLIError(f"inputs file {path!r} does not exist")
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except Exception as err:
        raise CLIError(f"cannot read inputs file {path!r} (expected .npz): {err}") from None


def arrange_inputs(
    infos: list[dict] | None, given: dict[str, np.ndarray], fill_mode: str, seed: int = 0
) -> list[np.ndarray]:
    """The arguments of ``main`` in order: given arrays by name (or by position when the
    npz uses numpy's ``arr_0`` names), the rest filled with ``fill_mode``."""
    rng = np.random.default_rng(seed)
    if infos is None:
        if not given:
            raise CLIError("this library has no tvm-rtask metadata: give every input with --inputs")
        return [given[k] for k in sorted(given, key=_natural_key)]
    names = [i["name"] for i in infos]
    positional = given and all(re.fullmatch(r"arr_\d+", k) for k in given)
    if positional:
        given = {names[int(k[4:])]: v for k, v in given.items() if int(k[4:]) < len(names)}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise CLIError(f"input(s) {unknown} are not inputs of the model; its inputs: {names}")
    args = []
    for info in infos:
        shape, dtype = tuple(info["shape"]), info["dtype"]
        value = given.get(info["name"])
        if value is None:
            value = _fill(shape, dtype, fill_mode, rng)
        if tuple(value.shape) != shape:
            raise CLIError(
                f"input {info['name']!r} has shape {tuple(value.shape)}, the model expects {shape}"
            )
        args.append(np.ascontiguousarray(value.astype(dtype, copy=False)))
    return args


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


@dataclass
class RunResult:
    outputs: list[np.ndarray]
    times_ms: list[float]
    threads: int
    meta: dict | None

    def stats(self) -> dict[str, float]:
        t = np.asarray(self.times_ms)
        p10, p50, p90 = np.percentile(t, [10, 50, 90])
        return {
            "mean_ms": float(t.mean()),
            "median_ms": float(p50),
            "p10_ms": float(p10),
            "p90_ms": float(p90),
            "min_ms": float(t.min()),
            "max_ms": float(t.max()),
            "std_ms": float(t.std()),
        }


def run_artifact(
    path: str,
    inputs: dict[str, np.ndarray] | None = None,
    fill_mode: str = "random",
    repeat: int = 1,
    number: int = 1,
    threads: int | None = None,
    device: str | None = None,
) -> RunResult:
    """Load an artifact, size the thread pool, run it once for the outputs, then time
    ``repeat`` measurements of ``number`` calls each (milliseconds per call)."""
    import tvm
    from tvm import relax

    from .runtime import native, set_num_threads

    if repeat < 1 or number < 1:
        raise CLIError("--repeat and --number must be at least 1")
    if threads is not None and threads < 1:
        raise CLIError(f"--threads must be at least 1, not {threads}")
    art = load_artifact(path)
    # The exported library links libtvm_rtask_runtime; load it first so a library built on
    # another machine still finds it from this install.
    native.load()
    meta = art.meta or _read_embedded_meta(art.lib_path)
    if meta is not None and meta.get("format") != META_FORMAT:
        meta = None
    device = device or (meta or {}).get("device", "cpu")
    if device == "cpu":
        n = threads or (meta or {}).get("threads") or 1
        set_num_threads(int(n))
        dev = tvm.cpu()
    elif device in ("cuda", "gpu"):
        device, n = "cuda", 1
        dev = tvm.cuda(0)
        if not dev.exist:
            raise CLIError(f"{path!r} runs on CUDA, and this machine has no CUDA device")
    else:
        raise CLIError(f"unknown device {device!r}; use cpu or cuda")
    try:
        lib = tvm.runtime.load_module(art.lib_path)
    except Exception as err:
        raise CLIError(f"cannot load {path!r}: {first_line(err)}") from None
    args_np = arrange_inputs((meta or {}).get("inputs"), inputs or {}, fill_mode)
    vm = relax.VirtualMachine(lib, dev)
    args = [tvm.runtime.tensor(a, dev) for a in args_np]
    outputs = _flatten(vm["main"](*args))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            vm["main"](*args)
        if device != "cpu":
            dev.sync()
        times.append((time.perf_counter() - start) * 1e3 / number)
    return RunResult(outputs, times, int(n), meta)


def save_outputs(path: str, outputs: list[np.ndarray]) -> None:
    np.savez(path, **{f"output_{i}": o for i, o in enumerate(outputs)})


# -- plans ----------------------------------------------------------------------------------------
REPORT_ROWS = (
    ("operators", "operators"),
    ("rtasks", "rTasks"),
    ("rprograms", "rPrograms"),
    ("kernel_launches", "kernel launches"),
    ("barriers", "barriers"),
    ("veus", "vEUs"),
    ("max_ops_side_by_side", "max ops side by side"),
    ("ordinary_ops", "ordinary ops"),
    ("estimated_us", "estimated (us)"),
    ("ideal_us", "ideal bound (us)"),
)


def plan_policies(model: LoadedModel, target, policies: list[str], options: dict) -> dict:
    """``{policy: Plan}``; the model is legalized, folded and fused once for all policies."""
    import tvm

    from .core import Plan
    from .errors import run_keeping_errors
    from .relax_passes import PLAN_ATTR, PlanRPrograms, RTaskPrepare

    prepared = run_keeping_errors(RTaskPrepare(options.get("fusion")), model.mod)
    plans = {}
    for policy in policies:
        opts = {**options, "policy": policy}
        # A fresh module per policy: PlanRPrograms replaces operators by their rKernels in
        # the module it is given (seen in TVM 0.27 / relax_passes/plan.py), so a second
        # policy planned on the same module would re-split already split loops.
        fresh = tvm.IRModule(dict(prepared.functions), attrs=prepared.attrs)
        planned = run_keeping_errors(
            tvm.transform.Sequential([PlanRPrograms(target, **opts)]), fresh
        )
        plans[policy] = Plan.from_json(str(planned.attrs[PLAN_ATTR]))
    return plans


def format_report_table(title: str, reports: dict[str, dict]) -> str:
    """Rows: the report's counts and estimates; columns: policies."""
    cols = list(reports)
    width = max([12, *(len(c) + 2 for c in cols)])
    lines = [title, f"{'':22s}" + "".join(f"{c:>{width}s}" for c in cols)]
    for key, label in REPORT_ROWS:
        cells = []
        for c in cols:
            v = reports[c].get(key, "")
            cells.append(f"{v:>{width}.1f}" if isinstance(v, float) else f"{v!s:>{width}s}")
        lines.append(f"{label:22s}" + "".join(cells))
    return "\n".join(lines)


def gantt_function():
    """``tvm_rtask.viz.gantt`` or None while it does not exist."""
    try:
        from . import viz
    except ImportError:
        return None
    return getattr(viz, "gantt", None)


def _require_gantt():
    fn = gantt_function()
    if fn is None:
        raise CLIError("Gantt charts are not available yet (tvm_rtask.viz.gantt is missing)")
    return fn


# -- commands -------------------------------------------------------------------------------------
def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an .onnx file or a zoo model name")
    p.add_argument("--batch", type=int, default=1, help="batch size of a zoo model (default 1)")
    p.add_argument(
        "--reduced", action="store_true", help="the zoo model's small variant (fast to compile)"
    )
    p.add_argument("--seed", type=int, default=0, help="weights seed of a zoo model")
    p.add_argument(
        "--input-shapes",
        metavar="SHAPES",
        help="static shapes of an ONNX model's inputs, e.g. 'data:[1,3,224,224]'",
    )
    p.add_argument("--target", default="llvm", help="llvm (default), cuda, or a JSON target")


def _option_args(p: argparse.ArgumentParser, policy: bool = True) -> None:
    if policy:
        p.add_argument("--policy", default=None, help="wavefront (default), sequential, ...")
    p.add_argument("--barrier", default=None, choices=("fine", "global"), help="default fine")
    p.add_argument("--num-veu", type=int, default=None, help="vEUs (CPU: worker threads)")
    p.add_argument("--db", default=None, help="tuning work directory (tvm-rtask tune --db)")
    p.add_argument(
        "--option",
        action="append",
        metavar="NAME=VALUE",
        help="any other tvm-rtask option, e.g. rtasks_per_veu=4 (repeatable)",
    )


def _options_from(args, policy: bool = True) -> dict:
    opts = parse_key_values(args.option, "--option")
    for key in ("barrier", "num_veu", "db") + (("policy",) if policy else ()):
        value = getattr(args, key, None)
        if value is not None:
            opts[key] = value
    return opts


def _load_from_args(args) -> LoadedModel:
    return load_model(
        args.model,
        batch=args.batch,
        reduced=args.reduced,
        seed=args.seed,
        shape_dict=parse_shapes(args.input_shapes),
    )


def cmd_tune(args) -> int:
    from .tuning import tune

    model = _load_from_args(args)
    trials = args.trials
    if trials is None and args.seconds is None:
        trials = 64
    tune(
        model.mod,
        parse_target(args.target),
        args.db,
        trials=trials,
        seconds=args.seconds,
        num_trials_per_iter=args.trials_per_iter,
        rpc=args.rpc,
        fusion=args.fusion,
        include_injective=args.all_ops,
        num_cores=args.num_cores,
        seed=args.tune_seed,
        progress=not args.no_progress,
    )
    return 0


def cmd_compile(args) -> int:
    if args.gantt:
        _require_gantt()
    output = args.output or f"{Path(args.model).stem}.so"
    model = _load_from_args(args)
    target = parse_target(args.target)
    options = _options_from(args)
    ex, meta = compile_model(model, target, options=options)
    save_artifact(ex, output, meta)
    print(
        f"compiled {model.name} for {meta['target']} ({meta['pass']}, "
        f"{options.get('policy', 'wavefront')}) in {meta['compile_seconds']:.1f} s -> {output}"
    )
    plan = None
    if args.report or args.gantt:
        policy = options.get("policy", "wavefront")
        plan = plan_policies(model, target, [policy], options)[policy]
    if args.report:
        doc = {**meta, "report": plan.report(), "plan": plan.to_dict()}
        with open(args.report, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"report -> {args.report}")
    if args.gantt:
        _require_gantt()(plan, args.gantt, title=f"{model.name}: {plan.policy}")
        print(f"gantt chart -> {args.gantt}")
    if args.emit_source:
        written = emit_source(ex, model, args.emit_source)
        print(f"sources -> {args.emit_source} ({', '.join(written)})")
    return 0


def emit_source(ex, model: LoadedModel, directory: str) -> list[str]:
    """Write the imported Relax module, the VM program and the generated code (LLVM IR and
    assembly, or CUDA source) of ``ex`` into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def write(name: str, text: str) -> None:
        (out / name).write_text(text)
        written.append(name)

    write("input.relax.py", model.mod.script())
    write("vm.txt", ex.as_text())
    for i, lib in enumerate(ex.mod.imports):
        kind = str(lib.kind)
        formats = {"llvm": (("ll", "ll"), ("asm", "s")), "cuda": (("cu", "cu"), ("ptx", "ptx"))}
        for fmt, ext in formats.get(kind, (("", kind),)):
            try:
                text = lib.inspect_source(fmt)
            except Exception:  # a format this module kind cannot show
                continue
            if text:
                write(f"module{i}.{ext}", text)
        for j, sub in enumerate(lib.imports):
            try:
                text = sub.inspect_source("")
            except Exception:
                continue
            if text:
                ext = {"cuda": "cu"}.get(str(sub.kind), str(sub.kind))
                write(f"module{i}_{j}.{ext}", text)
    return written


def cmd_run(args) -> int:
    result = run_artifact(
        args.artifact,
        inputs=read_inputs(args.inputs),
        fill_mode=args.fill_mode,
        repeat=args.repeat,
        number=args.number,
        threads=args.threads,
    )
    if args.outputs:
        save_outputs(args.outputs, result.outputs)
    shapes = ", ".join(str(tuple(o.shape)) for o in result.outputs)
    s = result.stats()
    print(
        f"ran {args.artifact} on {result.threads} thread(s): outputs {shapes}; "
        f"median {s['median_ms']:.3f} ms (p10 {s['p10_ms']:.3f}, p90 {s['p90_ms']:.3f}) "
        f"over {len(result.times_ms)} run(s)"
    )
    if args.outputs:
        print(f"outputs -> {args.outputs}")
    return 0


def cmd_plan(args) -> int:
    from .schedule import policy_names

    if args.gantt:
        _require_gantt()
    model = _load_from_args(args)
    target = parse_target(args.target)
    options = _options_from(args, policy=False)
    policies = args.policy or policy_names()
    unknown = [p for p in policies if p not in policy_names()]
    if unknown:
        raise CLIError(f"unknown policy {unknown[0]!r}; choose from {', '.join(policy_names())}")
    plans = plan_policies(model, target, policies, options)
    reports = {p: plan.report() for p, plan in plans.items()}
    first = next(iter(reports.values()))
    title = (
        f"{model.name} on {target_kind(target)} ({first['device']}), "
        f"{first['veus']} vEUs of capacity {first['capacity']}"
    )
    print(format_report_table(title, reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {p: {"report": reports[p], "plan": plans[p].to_dict()} for p in plans}, f, indent=1
            )
        print(f"plans -> {args.json}")
    if args.gantt:
        policy = policies[0]
        _require_gantt()(plans[policy], args.gantt, title=f"{model.name}: {policy}")
        print(f"gantt chart ({policy}) -> {args.gantt}")
    return 0


def find_harness() -> Path | None:
    """``bench/harness.py`` of the source checkout this package runs from, if any."""
    candidate = Path(__file__).resolve().parents[1] / "bench" / "harness.py"
    return candidate if candidate.is_file() else None


def cmd_bench(args) -> int:
    import importlib.util

    harness = find_harness()
    if harness is None:
        raise CLIError(
            "the benchmark harness (bench/harness.py) ships with the source checkout only; "
            "run tvm-rtask bench from an editable install"
        )
    spec = importlib.util.spec_from_file_location("tvm_rtask_bench_harness", harness)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rest = [a for a in args.harness_args if a != "--"]
    return int(module.main(rest) or 0)


def cmd_models(args) -> int:
    from . import models

    for name in models.names():
        print(f"{name:14s} {models.describe(name)}")
    return 0


def cmd_export_onnx(args) -> int:
    import onnx

    from . import models

    model = models.onnx_model(args.name, batch=args.batch, reduced=args.reduced, seed=args.seed)
    output = args.output or f"{args.name}.onnx"
    onnx.save(model, output)
    if args.inputs:
        np.savez(args.inputs, **models.sample_inputs(model, seed=args.seed + 1))
    print(f"{args.name} -> {output}" + (f", sample inputs -> {args.inputs}" if args.inputs else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Rammer-style persistent kernels for Apache TVM: compile, run, plan, bench.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("compile", help="compile a model into persistent kernels")
    _model_args(p)
    _option_args(p)
    p.add_argument("-o", "--output", help="artifact: .so (default MODEL.so) or .tar")
    p.add_argument("--report", metavar="JSON", help="write the plan's report and plan here")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of the plan here")
    p.add_argument("--emit-source", metavar="DIR", help="write Relax, VM and generated code here")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a compiled artifact (.so or .tar)")
    p.add_argument("artifact", metavar="ARTIFACT")
    p.add_argument("-i", "--inputs", help=".npz of inputs by name (missing ones are filled)")
    p.add_argument("-o", "--outputs", help="write the outputs here (.npz, output_0, ...)")
    p.add_argument("--repeat", type=int, default=1, help="timed runs (default 1)")
    p.add_argument("--number", type=int, default=1, help="calls per timed run (default 1)")
    p.add_argument(
        "--fill-mode",
        choices=("random", "zeros", "ones"),
        default="random",
        help="values of inputs not in --inputs (default random)",
    )
    p.add_argument("--threads", type=int, help="CPU threads (default: the artifact's vEUs)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("plan", help="plan a model and print a summary table (no build)")
    _model_args(p)
    p.add_argument(
        "--policy", action="append", help="policy to plan (repeatable; default: all policies)"
    )
    _option_args(p, policy=False)
    p.add_argument("--json", metavar="JSON", help="write the reports and plans here")
    p.add_argument("--gantt", metavar="PNG", help="Gantt chart of the first policy's plan")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("tune", help="tune the operators with MetaSchedule into a database")
    _model_args(p)
    p.add_argument("--db", required=True, help="work directory of the tuning database")
    p.add_argument("--trials", type=int, default=None, help="trials for the model (default 64)")
    p.add_argument("--seconds", type=float, default=None, help="stop measuring after this")
    p.add_argument("--trials-per-iter", type=int, default=16, help="batch size (default 16)")
    p.add_argument("--rpc", metavar="HOST:PORT:KEY", help="measure through an RPC tracker")
    p.add_argument("--num-cores", type=int, default=None, help="llvm: cores (default: all)")
    p.add_argument("--fusion", default=None, help="fusion the model is compiled with")
    p.add_argument("--all-ops", action="store_true", help="tune injective operators too")
    p.add_argument("--tune-seed", type=int, default=0, help="seed of the search")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser(
        "bench",
        help="run the benchmark harness (bench/harness.py; see its --help)",
        add_help=False,
    )
    p.set_defaults(func=cmd_bench, harness_args=[])

    p = sub.add_parser("models", help="list the model zoo")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("export-onnx", help="write a zoo model as an .onnx file")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-o", "--output", help="output .onnx (default NAME.onnx)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--reduced", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inputs", metavar="NPZ", help="also write seeded sample inputs here")
    p.set_defaults(func=cmd_export_onnx)
    return parser


def first_line(err: BaseException) -> str:
    """The message of ``err`` on one line (TVM errors carry multi-line tracebacks)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    # Errors that crossed TVM's FFI carry a traceback and end with the useful line.
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def run_main(parser: argparse.ArgumentParser, argv: list[str] | None, prog: str) -> int:
    """Parse, dispatch, and turn every expected failure into one line on stderr."""
    # ``bench`` hands every argument after it to the harness, options included.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "func", None) is not cmd_bench:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.harness_args = extra
    from .errors import RTaskError

    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if os.environ.get(DEBUG_ENV):
            raise
        if isinstance(err, (CLIError, RTaskError)):
            message = first_line(err)
        elif isinstance(err, (OSError, ValueError, KeyError)):
            message = f"{type(err).__name__}: {first_line(err)}"
        else:
            message = f"{type(err).__name__}: {first_line(err)} (set {DEBUG_ENV}=1 for details)"
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
