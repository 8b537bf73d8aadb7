"""Running an artifact: its metadata sizes the thread pool, picks the device and arranges
the inputs; then one call for the outputs and timed calls."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .artifact import META_FORMAT, load_artifact, read_embedded_metadata
from .errors import CLIError, first_line
from .inputs import arrange_inputs, flatten_outputs


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

    from ..runtime import native, set_num_threads

    if repeat < 1 or number < 1:
        raise CLIError("--repeat and --number must be at least 1")
    if threads is not None and threads < 1:
        raise CLIError(f"--threads must be at least 1, not {threads}")
    art = load_artifact(path)
    # The exported library links libtvm_rtask_runtime; load it first so a library built on
    # another machine still finds it from this install.
    native.load()
    meta = art.meta or read_embedded_metadata(art.lib_path)
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
    outputs = flatten_outputs(vm["main"](*args))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            vm["main"](*args)
        if device != "cpu":
            dev.sync()
        times.append((time.perf_counter() - start) * 1e3 / number)
    return RunResult(outputs, times, int(n), meta)
