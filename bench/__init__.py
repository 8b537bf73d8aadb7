"""tvm-rtask's benchmarks and GPU-window kit, one package run from the checkout's root:
``python -m bench <command> [options]`` (``python -m bench --help`` lists the commands,
``python -m bench <command> --help`` their options). Results go to ``bench/results/``.

The method of the CPU numbers (timing, each runtime in its own process) is :mod:`bench.peers`;
the GPU window (docs/gpu.md) is ``gpu-pack`` here, then ``gpu-window`` on the GPU machine.
"""

import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def read_jsonl(path) -> list[dict]:
    """Every complete JSON line of ``path`` (a line cut by a kill is ignored); [] if none."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
    except FileNotFoundError:
        pass
    return out


def append_jsonl(path, record: dict, default=str) -> None:
    """One JSON line, flushed and synced: it survives the process being killed next."""
    line = json.dumps(record, default=default) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
