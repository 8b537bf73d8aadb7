"""A ``tvmc`` for TVM 0.27, which no longer ships one: ``compile`` and ``run``.

::

    tvmc compile model.onnx --target llvm --pass rtask -o module.tar
    tvmc run module.tar --inputs x.npz --outputs y.npz --print-time

The flags follow the classic ``tvm.driver.tvmc`` where they apply: ``compile`` takes
``FILE``, ``-o/--output`` (default ``module.tar``), ``--target``, ``--input-shapes``
(``"name:[1,3,224,224] other:[1,8]"``), ``--model-format onnx``, ``--pass-config
name=value`` (repeatable), ``-O/--opt-level``, ``--disabled-pass`` and ``--dump-code``;
``run`` takes ``FILE``, ``-i/--inputs``, ``-o/--outputs`` (an ``.npz`` with ``output_0``,
``output_1``, ...), ``--fill-mode``, ``--print-time``, ``--print-top N``, ``--repeat``,
``--number`` and ``--device``. New here: ``--pass rtask`` compiles with tvm-rtask (persistent
kernels; ``--pass none``, the default, is TVM's own build); ``--pass-config rtask.<option>``
sets a tvm-rtask option (``rtask.policy=sequential``, ``rtask.num_veu=2``,
``rtask.barrier=global``, ...). Relay-era flags (AutoTVM records, executors, cross compilers,
RPC, microTVM) do not exist in TVM 0.27 and are not offered.

The package is a tar of ``mod.so`` (exported with the native runtime linked) and
``metadata.json`` (inputs, thread count, target), which ``tvmc run`` and ``tvm-rtask run``
both read.
"""

from __future__ import annotations

import argparse
import sys

from .cli.artifact import check_output_path, save_artifact
from .cli.build import (
    check_options,
    check_target,
    compile_model,
    load_model,
    parse_key_values,
    parse_target,
    pass_context,
    split_pass_config,
)
from .cli.errors import CLIError
from .cli.inputs import FILL_MODES, parse_shapes, read_inputs, save_outputs
from .cli.main import run_main
from .cli.paths import check_writable
from .cli.runner import DEVICES, RunResult, run_artifact

PROG = "tvmc"
DUMP_FORMATS = ("relax", "ll", "asm", "vm", "cu")


def _drive_compile(args) -> int:
    # Everything is checked before the model is imported and built.
    if args.model_format not in (None, "onnx"):
        raise CLIError(f"model format {args.model_format!r} is not supported; use onnx")
    check_output_path(args.output, "-o")
    formats = {f.strip() for f in args.dump_code.split(",") if f.strip()}
    unknown = formats - set(DUMP_FORMATS)
    if unknown:
        raise CLIError(
            f"--dump-code: unknown format(s) {sorted(unknown)}; use {', '.join(DUMP_FORMATS)}"
        )
    for fmt in formats:
        check_writable(f"{args.output}.{fmt}", "--dump-code")
    target = check_target(parse_target(args.target))
    pass_config = parse_key_values(args.pass_config, "--pass-config")
    options, config = split_pass_config(pass_config)
    disabled = [p.strip() for p in (args.disabled_pass or "").split(",") if p.strip()]
    pass_context(args.opt_level, config, disabled)
    use_rtask = args.pass_ == "rtask"
    if use_rtask:
        check_options(options)
    model = load_model(args.FILE, shape_dict=parse_shapes(args.input_shapes))
    ex, meta = compile_model(
        model,
        target,
        use_rtask=use_rtask,
        pass_config=pass_config,
        opt_level=args.opt_level,
        disabled_pass=disabled,
    )
    save_artifact(ex, args.output, meta)
    if formats:
        _dump_code(ex, model, args.output, formats)
    return 0


def _dump_code(ex, model, output: str, formats: set[str]) -> None:
    """Classic tvmc writes ``<output>.<format>`` beside the package."""
    from tvm.error import InternalError

    texts = {}
    if "relax" in formats:
        texts["relax"] = model.mod.script()
    if "vm" in formats:
        texts["vm"] = ex.as_text()
    for lib in ex.mod.imports:
        for fmt in formats & {"ll", "asm", "cu"}:
            try:
                text = lib.inspect_source(fmt)
            except InternalError:  # "Do not know how to get source code with format"
                continue
            if text:
                texts[fmt] = texts.get(fmt, "") + text
    for fmt, text in texts.items():
        with open(f"{output}.{fmt}", "w") as f:
            f.write(text)


def _format_times(result: RunResult) -> str:
    s = result.stats()
    header = (
        "Execution time summary:\n mean (ms)   median (ms)    max (ms)     min (ms)     std (ms)"
    )
    values = "".join(
        f"{s[k]:>12.4f} " for k in ("mean_ms", "median_ms", "max_ms", "min_ms", "std_ms")
    )
    return f"{header}\n{values}"


def _format_top(result: RunResult, n: int) -> str:
    import numpy as np

    out = result.outputs[0].reshape(result.outputs[0].shape[0], -1)
    lines = []
    for row, values in enumerate(out):
        order = np.argsort(values)[::-1][:n]
        lines.append(f"output_0[{row}] top {n}: indices {order.tolist()}")
        lines.append(f"{'':{len(str(row)) + 13}}values  {[float(values[i]) for i in order]}")
    return "\n".join(lines)


def _drive_run(args) -> int:
    if args.outputs:
        check_writable(args.outputs, "-o")
    result = run_artifact(
        args.FILE,
        inputs=read_inputs(args.inputs),
        fill_mode=args.fill_mode,
        repeat=args.repeat,
        number=args.number,
        device=args.device,
    )
    if args.print_time:
        print(_format_times(result))
    if args.print_top:
        print(_format_top(result, args.print_top))
    if args.outputs:
        save_outputs(args.outputs, result.outputs)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="TVM compiler driver (tvm-rtask's, for TVM 0.27)"
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"tvmc (tvm-rtask {__version__})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("compile", help="compile a model.")
    p.add_argument("FILE", help="path to the input model file (.onnx) or a zoo model name.")
    p.add_argument(
        "-o", "--output", default="module.tar", help="output package. Defaults to 'module.tar'."
    )
    p.add_argument("--target", default="llvm", help="compilation target (llvm, cuda, JSON).")
    p.add_argument(
        "--pass",
        dest="pass_",
        choices=("rtask", "none"),
        default="none",
        help="'rtask' compiles into persistent kernels; 'none' is TVM's default build.",
    )
    p.add_argument("--model-format", choices=("onnx",), help="specify input model format.")
    p.add_argument(
        "--input-shapes",
        help='non-generic input shapes, format "input_name:[dim1,dim2,...] input2:[...]".',
    )
    p.add_argument(
        "--pass-config",
        action="append",
        metavar="name=value",
        help="PassContext configuration, repeatable; rtask.<option> sets a tvm-rtask option.",
    )
    p.add_argument(
        "-O",
        "--opt-level",
        type=int,
        default=3,
        choices=range(0, 4),
        metavar="[0-3]",
        help="optimization level. Defaults to '3'.",
    )
    p.add_argument("--disabled-pass", help="comma-separated list of passes to disable.")
    p.add_argument(
        "--dump-code",
        metavar="FORMAT",
        default="",
        help="comma-separated formats to write beside the package: relax, vm, ll, asm, cu.",
    )
    p.set_defaults(func=_drive_compile)

    p = sub.add_parser("run", help="run a compiled module.")
    p.add_argument("FILE", help="path to the compiled package (.tar) or library (.so).")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="device to run on: the package's own (cpu for llvm, cuda for cuda), the default.",
    )
    p.add_argument(
        "--fill-mode",
        choices=FILL_MODES,
        default="random",
        help="values of inputs not given with --inputs. Defaults to 'random'.",
    )
    p.add_argument("-i", "--inputs", help="path to the .npz input file.")
    p.add_argument("-o", "--outputs", help="path to the .npz output file.")
    p.add_argument("--print-time", action="store_true", help="record and print execution times.")
    p.add_argument("--print-top", metavar="N", type=int, help="print the top N of output_0.")
    p.add_argument("--repeat", metavar="N", type=int, default=1, help="timed runs (default 1).")
    p.add_argument(
        "--number", metavar="N", type=int, default=1, help="calls per timed run (default 1)."
    )
    p.set_defaults(func=_drive_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
