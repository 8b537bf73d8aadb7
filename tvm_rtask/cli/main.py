"""The ``tvm-rtask`` command line: the parser, one function per command, and
:func:`run_main`, which turns every expected failure into one line on stderr.

Every command checks what it was given (options, target, output paths) before it imports or
builds anything, so a mistake costs a second, not the minute a build can take.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from .artifact import check_output_path, save_artifact
from .build import (
    LoadedModel,
    check_options,
    check_target,
    compile_model,
    load_model,
    parse_key_values,
    parse_target,
    target_kind,
)
from .errors import DEBUG_ENV, CLIError, first_line
from .inputs import FILL_MODES, arrange_inputs, parse_shapes, read_inputs, save_outputs
from .paths import check_directory, check_writable
from .profile import (
    COST_CHOICES,
    check_device,
    export_shipped_profile,
    format_profile,
    use_cache_directory,
)
from .report import format_report_table, plan_policies, require_gantt
from .runner import run_artifact

PROG = "tvm-rtask"
# Where ``tvm-rtask bench`` writes unless --out-dir says otherwise: the current directory,
# never the source tree the harness comes from.
DEFAULT_BENCH_DIR = "tvm-rtask-bench"
# Compile for the CPU of the machine that compiles (``llvm-native``: mcpu = the host CPU's
# name, recorded in the artifact, which then refuses to run on a CPU that lacks its
# instructions); ``--target llvm`` builds portable, SSE2-only code.
DEFAULT_TARGET = "llvm-native"


# -- arguments ------------------------------------------------------------------------------------
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
    p.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"{DEFAULT_TARGET} (default: llvm for this machine's CPU), llvm (any x86-64: SSE2), "
        "cuda, or a JSON target",
    )


def _option_args(p: argparse.ArgumentParser, policy: bool = True, cost: bool = True) -> None:
    if policy:
        p.add_argument(
            "--policy",
            default=None,
            help="auto (default: sequential or wavefront, as the cost model ranks them), "
            "wavefront, sequential, ...",
        )
    if cost:
        p.add_argument(
            "--cost",
            default=None,
            choices=COST_CHOICES,
            help="cost model the policy plans with: analytical (default) or measured (every "
            "rKernel and the barrier/launch costs timed on the device present, cached: "
            "tvm-rtask profile)",
        )
    p.add_argument(
        "--cache",
        metavar="DIR",
        default=None,
        help="profile cache of the measured cost model (default $TVM_RTASK_CACHE or "
        "~/.cache/tvm_rtask/profiles)",
    )
    p.add_argument(
        "--barrier",
        default=None,
        choices=("fine", "global", "counter"),
        help="default: fine on llvm, counter on CUDA",
    )
    p.add_argument("--num-veu", type=int, default=None, help="vEUs (CPU: worker threads)")
    p.add_argument(
        "--db",
        default=None,
        help="tuning work directory (tvm-rtask tune --db); default: the shipped record set "
        "of the target (llvm with AVX2: x86_64-avx2), 'none': no records",
    )
    p.add_argument(
        "--option",
        action="append",
        metavar="NAME=VALUE",
        help="any other tvm-rtask option, e.g. rtasks_per_veu=4 (repeatable)",
    )


def _options_from(args, policy: bool = True) -> dict:
    opts = parse_key_values(args.option, "--option")
    for key in ("barrier", "num_veu", "db", "cost") + (("policy",) if policy else ()):
        value = getattr(args, key, None)
        if value is not None:
            opts[key] = value
    return opts


def _check_files(*pairs: tuple[str | None, str]) -> None:
    """Each given output file (path, flag) can be written."""
    for path, flag in pairs:
        if path:
            check_writable(path, flag)


def _load_from_args(args) -> LoadedModel:
    return load_model(
        args.model,
        batch=args.batch,
        reduced=args.reduced,
        seed=args.seed,
        shape_dict=parse_shapes(args.input_shapes),
    )


# -- commands -------------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    from ..tuning import tune

    target = parse_target(args.target)
    check_target(target)
    check_directory(args.db, "--db", create=True)
    parse_shapes(args.input_shapes)
    model = _load_from_args(args)
    trials = args.trials
    if trials is None and args.seconds is None:
        trials = 64
    tune(
        model.mod,
        target,
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
    start = time.perf_counter()
    # Everything the user gave is checked before the model is imported and built.
    output = check_output_path(args.output or f"{Path(args.model).stem}.so", "-o")
    _check_files((args.report, "--report"), (args.gantt, "--gantt"))
    if args.emit_source:
        check_directory(args.emit_source, "--emit-source", create=True)
    if args.gantt:
        require_gantt()
    target = check_target(parse_target(args.target))
    options = check_options(_options_from(args))
    _check_measured(options, target, args)
    parse_shapes(args.input_shapes)
    model = _load_from_args(args)
    ex, meta = compile_model(model, target, options=options)
    save_artifact(ex, output, meta)
    seconds = time.perf_counter() - start  # wall time: import, build and export
    print(
        f"compiled {model.name} for {meta['target']} ({meta['pass']}, "
        f"{options.get('policy', 'wavefront')}) in {seconds:.1f} s -> {output}"
    )
    plan = None
    if args.report or args.gantt:
        policy = options.get("policy", "wavefront")
        plan = plan_policies(model, target, [policy], options)[policy]
    if args.report:
        doc = {**meta, "report": plan.report(), "plan": plan.to_dict()}
        _write_json(args.report, doc, "report")
    if args.gantt:
        require_gantt()(plan, args.gantt, title=f"{model.name}: {plan.policy}")
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

    from tvm.error import InternalError

    write("input.relax.py", model.mod.script())
    write("vm.txt", ex.as_text())
    for i, lib in enumerate(ex.mod.imports):
        kind = str(lib.kind)
        formats = {"llvm": (("ll", "ll"), ("asm", "s")), "cuda": (("cu", "cu"), ("ptx", "ptx"))}
        for fmt, ext in formats.get(kind, (("", kind),)):
            try:
                text = lib.inspect_source(fmt)
            except InternalError:  # "Do not know how to get source code with format"
                continue
            if text:
                write(f"module{i}.{ext}", text)
        for j, sub in enumerate(lib.imports):
            try:
                text = sub.inspect_source("")
            except InternalError:  # a module kind that cannot show its source
                continue
            if text:
                ext = {"cuda": "cu"}.get(str(sub.kind), str(sub.kind))
                write(f"module{i}_{j}.{ext}", text)
    return written


def cmd_trace(args) -> int:
    """Compile with trace=True, run warm, trace one call: the breakdown, the cost model's
    error per operator, and the measured and simulated Gantt charts."""
    _check_files((args.json, "--json"), (args.gantt, "--gantt"), (args.simulated, "--simulated"))
    if args.gantt or args.simulated:
        require_gantt()
    target = check_target(parse_target(args.target))
    kind = target_kind(target)
    if kind not in ("llvm", "cuda"):
        raise CLIError(f"trace runs on llvm and cuda targets, not {kind}")
    options = check_options({**_options_from(args), "trace": True})
    _check_measured(options, target, args)
    parse_shapes(args.input_shapes)
    model = _load_from_args(args)
    import tvm
    from tvm import relax

    import tvm_rtask

    from ..runtime.trace import trace_call

    device = tvm.device("cpu" if kind == "llvm" else kind, 0)
    if not device.exist:
        raise CLIError(f"trace runs the model: no {kind} device here")
    ex, plan = tvm_rtask.compile_with_plan(model.mod, target, **options)
    inputs = arrange_inputs([i.to_dict() for i in model.inputs], {}, "random", args.seed)
    vm = relax.VirtualMachine(ex, device)
    tensors = [tvm.runtime.tensor(a, device) for a in inputs]
    timeline = trace_call(lambda: vm["main"](*tensors), plan, warmup=args.warmup)
    print(format_breakdown(f"{model.name}: {plan.policy}", timeline))
    if args.json:
        timeline.save(args.json)
        print(f"timeline -> {args.json}")
    title = f"{model.name}: {plan.policy}"
    if args.gantt:
        require_gantt()(plan, args.gantt, title=title, timing=timeline.timing())
        print(f"measured gantt chart -> {args.gantt}")
    if args.simulated:
        require_gantt()(plan, args.simulated, title=title)
        print(f"simulated gantt chart -> {args.simulated}")
    return 0


def format_breakdown(title: str, timeline, top: int = 8) -> str:
    """The timeline's breakdown as lines a person reads: total, shares of vEU time, the
    rPrograms, and the operators the cost model misjudges most."""
    b = timeline.breakdown()
    share = ", ".join(f"{k} {100 * v:.1f}%" for k, v in b["share"].items())
    lines = [f"{title}: {b['total_us']:.1f} us measured; vEU time: {share}"]
    for p in b["programs"]:
        busy = "/".join(f"{x:.0f}" for x in p["busy_us"])
        wait = "/".join(f"{x:.0f}" for x in p["wait_us"])
        idle = "/".join(f"{x:.0f}" for x in p["idle_us"])
        lines.append(
            f"  {p['name']}: {p['wall_us']:.1f} us ({p['rtasks']} rTasks, {p['waits']} waits); "
            f"per vEU busy {busy}, waiting {wait}, idle {idle} us"
        )
    errors = timeline.operator_errors()
    worst = sorted(errors.items(), key=lambda kv: -abs(math.log(max(kv[1]["ratio"], 1e-9))))
    if worst:
        lines.append("  cost model / measured, per rTask (worst first):")
    for op, e in worst[:top]:
        lines.append(
            f"    {op}: {e['simulated_us']:.1f} / {e['measured_us']:.1f} us = {e['ratio']:.2f}"
        )
    return "\n".join(lines)


def cmd_run(args) -> int:
    _check_files((args.outputs, "-o"))
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
    from ..policies import policy_names

    policies = args.policy or policy_names()
    unknown = [p for p in policies if p not in policy_names()]
    if unknown:
        raise CLIError(f"unknown policy {unknown[0]!r}; choose from {', '.join(policy_names())}")
    _check_files((args.json, "--json"), (args.gantt, "--gantt"))
    if args.gantt:
        require_gantt()
    target = check_target(parse_target(args.target))
    options = _options_from(args, policy=False)
    for policy in policies:
        check_options({**options, "policy": policy})
    _check_measured(options, target, args)
    parse_shapes(args.input_shapes)
    model = _load_from_args(args)
    plans = plan_policies(model, target, policies, options)
    reports = {p: plan.report() for p, plan in plans.items()}
    first = next(iter(reports.values()))
    title = (
        f"{model.name} on {target_kind(target)} ({first['device']}), "
        f"{first['veus']} vEUs of capacity {first['capacity']}"
    )
    print(format_report_table(title, reports))
    if args.json:
        doc = {p: {"report": reports[p], "plan": plans[p].to_dict()} for p in plans}
        _write_json(args.json, doc, "plans")
    if args.gantt:
        policy = policies[0]
        require_gantt()(plans[policy], args.gantt, title=f"{model.name}: {policy}")
        print(f"gantt chart ({policy}) -> {args.gantt}")
    return 0


def _write_json(path: str, doc: dict, what: str) -> None:
    """Write ``doc`` to ``path`` and say so (``what -> path``)."""
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{what} -> {path}")


def _check_measured(options: dict, target, args) -> None:
    """``--cost measured``: the device is present, or a shipped profile of the options'
    device, and the cache directory usable."""
    if options.get("cost") == "measured":
        check_device(target, "--cost measured", options)
    use_cache_directory(args.cache)


def cmd_profile(args) -> int:
    _check_files((args.json, "--json"))
    target = check_target(parse_target(args.target))
    options = check_options(_options_from(args, policy=False))
    check_device(target, "profile")
    if args.export_shipped:
        check_directory(args.export_shipped, "--export-shipped", create=True)
    cache = use_cache_directory(args.cache)
    parse_shapes(args.input_shapes)
    model = _load_from_args(args)
    from ..runtime.profiler import default_cache_dir, profile_model

    profile = profile_model(model.mod, target, cache_dir=cache, refresh=args.remeasure, **options)
    title = (
        f"{model.name} on {target_kind(target)} ({profile.device}), "
        f"{profile.vdevice.num_veu} vEUs; cache {cache or default_cache_dir()}"
    )
    print(format_profile(title, profile))
    if args.json:
        _write_json(args.json, {"model": model.name, **profile.to_dict()}, "profile")
    if args.export_shipped:
        print(export_shipped_profile(args, model.name, profile, cache or default_cache_dir()))
    return 0


def find_harness() -> Path | None:
    """``bench/harness.py`` of the source checkout this package runs from, if any."""
    candidate = Path(__file__).resolve().parents[2] / "bench" / "harness.py"
    return candidate if candidate.is_file() else None


def cmd_bench(args) -> int:
    import importlib.util

    harness = find_harness()
    if harness is None:
        raise CLIError(
            "the benchmark harness (bench/harness.py) ships with the source checkout only; "
            "run tvm-rtask bench from an editable install"
        )
    rest = [a for a in args.extra_args if a != "--"]
    if not {"-h", "--help"} & set(rest):
        # The harness's own default is bench/results inside the source tree: results go
        # where the user runs the command instead, or where --out-dir says.
        out_dir = check_directory(args.out_dir or DEFAULT_BENCH_DIR, "--out-dir", create=True)
        rest += ["--out-dir", out_dir]
    bench = harness.parent
    if "bench" not in sys.modules and (bench / "__init__.py").is_file():
        # the checkout's package bench (the harness imports its siblings from it), from
        # wherever this runs
        spec = importlib.util.spec_from_file_location(
            "bench", bench / "__init__.py", submodule_search_locations=[str(bench)]
        )
        sys.modules["bench"] = package = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(package)
    # the harness found, by its path: not whichever bench.harness this process imported
    spec = importlib.util.spec_from_file_location("bench.harness", harness)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(rest) or 0)


def cmd_models(args) -> int:
    from .. import models
    from ..models.real import REAL_MODELS
    from ..models.real import describe as describe_real

    for name in models.names():
        print(f"{name:14s} {models.describe(name)}")
    for name in REAL_MODELS:
        print(f"{name:14s} torchvision: {describe_real(name)['summary']}")
    return 0


def cmd_export_onnx(args) -> int:
    import onnx

    from .. import models

    output = args.output or f"{args.name}.onnx"
    _check_files((output, "-o"), (args.inputs, "--inputs"))
    model = models.onnx_model(args.name, batch=args.batch, reduced=args.reduced, seed=args.seed)
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
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log the compiler's stages with their wall times (else: a progress bar on a "
        "terminal for compiles of more than a few seconds)",
    )
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
        choices=FILL_MODES,
        default="random",
        help="values of inputs not in --inputs (default random)",
    )
    p.add_argument("--threads", type=int, help="CPU threads (default: the artifact's vEUs)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "trace",
        help="compile with trace=True and record one warm call: where the time goes in each "
        "rProgram, the cost model's error per operator, measured and simulated Gantt charts",
    )
    _model_args(p)
    _option_args(p)
    p.add_argument("--warmup", type=int, default=3, help="untraced calls first (default 3)")
    p.add_argument("--json", metavar="JSON", help="write the timeline (records and plan) here")
    p.add_argument("--gantt", metavar="PNG", help="Gantt chart of the measured call (.png/.svg)")
    p.add_argument("--simulated", metavar="PNG", help="Gantt chart of the simulated plan")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("plan", help="plan a model and print a summary table (no build)")
    _model_args(p)
    p.add_argument(
        "--policy", action="append", help="policy to plan (repeatable; default: all policies)"
    )
    _option_args(p, policy=False)
    p.add_argument("--json", metavar="JSON", help="write the reports and plans here")
    p.add_argument("--gantt", metavar="PNG", help="Gantt chart of the first policy's plan")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "profile",
        help="time every distinct rKernel and the barrier and launch costs on the device "
        "present (the measured cost model, cached; used by --cost measured)",
    )
    _model_args(p)
    _option_args(p, policy=False, cost=False)
    p.add_argument("--json", metavar="JSON", help="write the measurements and the model here")
    p.add_argument("--remeasure", action="store_true", help="measure again and overwrite the cache")
    p.add_argument(
        "--export-shipped",
        metavar="DIR",
        help="also copy this GPU's profile (kernels, sync costs, fitted factors) into DIR in "
        "the shipped format, merging: tvm_rtask/runtime/profiles/<device> is what "
        "--cost measured reads without a GPU (docs/scheduling.md)",
    )
    p.set_defaults(func=cmd_profile)

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
    p.add_argument(
        "--out-dir",
        metavar="DIR",
        default=None,
        help=f"where results go (default ./{DEFAULT_BENCH_DIR})",
    )
    # Every other argument goes to the harness (run_main hands them over in extra_args).
    p.set_defaults(func=cmd_bench, extra_args=[])

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


def run_main(parser: argparse.ArgumentParser, argv: list[str] | None, prog: str) -> int:
    """Parse, dispatch to ``args.func``, and turn every expected failure into one line on
    stderr. A command that sets an ``extra_args`` default receives the arguments the parser
    does not know (``bench`` hands them to the harness); for any other they are an error."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "extra_args"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.extra_args = extra
    from .. import progress
    from ..errors import RTaskError

    if getattr(args, "verbose", False):
        progress.enable()
    try:
        with progress.stage_bar():
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
    """The ``tvm-rtask`` console script."""
    return run_main(build_parser(), argv, PROG)
