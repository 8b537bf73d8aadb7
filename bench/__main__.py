"""``python -m bench <command> [options]``: one subcommand per benchmark; each command's module
parses its own options (``python -m bench <command> --help``)."""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module of bench, what it does)
COMMANDS = {
    "peers": ("peers", "CPU latency of tvm-rtask and its peers, each in its own process"),
    "real-set": ("real_set_summary", "the real-model set's table from peers results files"),
    "latency": ("harness", "every configuration of every zoo model, CPU or GPU (the harness)"),
    "policy-choice": ("policy_choice", "the default policy against sequential and wavefront"),
    "compile": ("cpu_compile_time", "CPU compile time: TVM's build against tvm-rtask's"),
    "ab": ("cpu_ab_commits", "two commits' compiled models timed against each other"),
    "kernels": ("kernel_report", "per operator: TVM's kernel, tvm-rtask's rKernel, PyTorch"),
    "ship-records": ("ship_records", "tune, compare and ship a record set (CPU or a GPU window)"),
    "sm-map": ("gpu_sm_map", "which SM each block of a co-resident grid runs on (GPU)"),
    "gpu-pack": ("gpu_pack", "the GPU window's two batches, prepared here (make gpu-pack)"),
    "gpu-window": ("gpu_window", "one GPU window; without a GPU its dry run (make gpu-window)"),
    "gpu-timelines": ("gpu_timelines", "one traced call per model on the GPU (window command 3)"),
    "gpu-check": ("gpu_check", "the gpu-marked tests in short calls, resumable (make gpu-check)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    sys.argv = [f"python -m bench {args.command}", *rest]  # the command's usage and help
    module = importlib.import_module(f"bench.{COMMANDS[args.command][0]}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
