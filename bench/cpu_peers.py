"""CPU latency of tvm-rtask and its peers, each runtime at its best, in its own process.

Usage::

    python bench/cpu_peers.py                                # every core, both light models
    python bench/cpu_peers.py --threads 1                    # one thread for every runtime
    python bench/cpu_peers.py --models inception_v1 resnet18 real:resnet50 zoo:resnext29
    python bench/cpu_peers.py --smoke                        # a quick check that it all runs

Models: the light models of the onnx package (default ``inception_v1`` and ``squeezenet``),
torchvision's architectures of ``tvm_rtask.models.real`` (``--size full`` or ``reduced``), the
zoo of ``tvm_rtask.models``, looked up in that order (``light:``, ``real:``, ``zoo:`` in front
of a name picks one), or ``.onnx`` files; every weight seeded (``--seed``).

For every model and runtime, one fresh subprocess (no other runtime's threads alive in it):
ONNX Runtime (CPUExecutionProvider: intra_op_num_threads = threads, inter_op 1,
ORT_ENABLE_ALL, sequential execution; its outputs are the reference), OpenVINO
(``PERFORMANCE_HINT: LATENCY``, ``INFERENCE_NUM_THREADS``, f32), TVM's default build
(``tvm.compile``), tvm-rtask sequential and wavefront (``tvm_rtask.compile(model, target,
policy=..., num_veu=threads)``), PyTorch eager through onnx2torch where both are installed.
Each is built (compile time recorded), checked against ONNX Runtime's outputs (a wrong result
is recorded, not timed), warmed up, then timed over back-to-back calls: median, p10, p90, N.
Every TVM and tvm-rtask build is compiled for ``--target`` (default ``llvm-native``, LLVM for
this machine's CPU). The method and the record format: ``tvm_rtask/testing/peers.py``.

Writes ``bench/results/<date>-cpu-peers-<threads>t[-smoke].json`` (environment, CPU
contention while timing, versions, command, every record) and a ``.md`` beside it (the
README's tables: ``python -m tvm_rtask.demo --update-readme FILE`` puts them into README.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

from tvm_rtask.testing import peers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SMOKE = {"warmup": 2, "repeat": 10, "max_seconds": 3.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=peers.DEFAULT_MODELS,
        help="light models of onnx (inception_v1, squeezenet, ...), real or zoo models, or "
        ".onnx files",
    )
    parser.add_argument(
        "--runtimes",
        nargs="+",
        default=peers.DEFAULT_RUNTIMES,
        choices=[*peers.RUNTIMES, *peers.OPTIONAL],
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=peers.default_threads(),
        help="threads of every runtime (default: every core of this machine)",
    )
    parser.add_argument("--target", default=peers.DEFAULT_TARGET, help="of TVM and tvm-rtask")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=50, help="timed calls per runtime")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=30.0,
        help=f"stop timing a runtime after this long (never under {peers.MIN_SAMPLES} calls)",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the weights")
    parser.add_argument(
        "--size",
        default="full",
        help="of the real (torchvision) models: full (224x224, what a user runs) or reduced",
    )
    parser.add_argument("--smoke", action="store_true", help=f"few calls ({SMOKE}): a check")
    parser.add_argument("--json", help="results file (default under bench/results/)")
    parser.add_argument("--timeout", type=float, default=peers.WORKER_TIMEOUT_S)
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def default_path(threads: int, smoke: bool, date: str | None = None) -> Path:
    date = date or datetime.date.today().isoformat()
    return HERE / "results" / f"{date}-cpu-peers-{threads}t{'-smoke' if smoke else ''}.json"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(
        ["python", "bench/cpu_peers.py", *(sys.argv[1:] if argv is None else argv)]
    )
    print(f"{args.threads} threads for every runtime; TVM and tvm-rtask for {args.target}")
    results = peers.measure(
        args.models,
        args.runtimes,
        args.threads,
        target=args.target,
        warmup=args.warmup,
        repeat=args.repeat,
        max_seconds=args.max_seconds,
        seed=args.seed,
        size=args.size,
        command=command,
        progress=lambda line: print(line, flush=True),
        timeout=args.timeout,
    )
    if args.smoke:
        results["smoke"] = (
            f"`--smoke` ({SMOKE['repeat']} calls after {SMOKE['warmup']} warm-up calls), only "
            "to check that everything runs"
        )
    path = Path(args.json) if args.json else default_path(args.threads, args.smoke)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    try:
        source = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        source = str(path)
    table = peers.markdown(results, source)
    path.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print()
    print(table)
    print(f"\nresults written to {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
