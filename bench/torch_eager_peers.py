"""PyTorch eager latency of the public real-model set, as a PyTorch user runs it.

The CPU peer "PyTorch eager" of ``bench/cpu_peers.py`` needs onnx2torch, whose PyPI release
imports torchvision, and the project's venv has neither (PyTorch is not a dependency). This
script runs where torch and torchvision are installed (the environment of
``bench/export_real_models.py``): each model is torchvision's own module, built with the
architecture ``tvm_rtask.models.real`` exported (``models.json``), random weights, eval mode,
``torch.inference_mode``, the same threads as the other runtimes, one fresh process per model
(no other runtime's threads alive), warm-up then back-to-back calls, median. Weights do not
change the time of these dense models; the ONNX twins' numerics are checked against ONNX
Runtime by ``bench/cpu_peers.py`` and the tests, not here.

    /path/to/torch-venv/bin/python bench/torch_eager_peers.py --threads 2 \\
        --json bench/results/2026-11-26-torch-eager-2t.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS_JSON = HERE.parent / "tvm_rtask" / "models" / "real" / "models.json"


def _worker(name: str, threads: int, warmup: int, repeat: int, max_seconds: float) -> dict:
    import torch
    import torchvision

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    info = json.loads(MODELS_JSON.read_text())["models"][name]["full"]
    # the exported architectures have no auxiliary classifiers (models.json)
    aux = name in ("googlenet", "inception_v3")
    kwargs = {"aux_logits": False, "init_weights": True} if aux else {}
    model = torchvision.models.get_model(name, weights=None, **kwargs).eval()
    x = torch.randn(*info["input"])
    samples = []
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        start = time.perf_counter()
        while len(samples) < repeat:
            t0 = time.perf_counter()
            model(x)
            samples.append((time.perf_counter() - t0) * 1e3)
            if len(samples) >= 10 and time.perf_counter() - start > max_seconds:
                break
    samples.sort()
    return {
        "model": name,
        "runtime": "torch_eager",
        "label": "PyTorch eager (torchvision module)",
        "threads": threads,
        "median_ms": statistics.median(samples),
        "p10_ms": samples[len(samples) // 10],
        "p90_ms": samples[(len(samples) * 9) // 10],
        "n": len(samples),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--max-seconds", type=float, default=15.0)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        rec = _worker(args.worker, args.threads, args.warmup, args.repeat, args.max_seconds)
        print(json.dumps(rec))
        return 0
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("torch_eager_peers: needs torch and torchvision in this interpreter", file=sys.stderr)
        return 2
    names = args.models or list(json.loads(MODELS_JSON.read_text())["models"])
    records = []
    for name in names:
        cmd = [sys.executable, __file__, "--worker", name, "--threads", str(args.threads),
               "--warmup", str(args.warmup), "--repeat", str(args.repeat),
               "--max-seconds", str(args.max_seconds)]  # fmt: skip
        load = os.getloadavg()[0]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            rec = {"model": name, "runtime": "torch_eager", "error": out.stderr.strip()[-300:]}
        else:
            rec = json.loads(out.stdout.strip().splitlines()[-1])
        rec["load_before"] = load
        records.append(rec)
        print(json.dumps(rec), flush=True)
    doc = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "records": records,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
