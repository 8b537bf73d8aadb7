"""Running an artifact: its checked metadata sizes the thread pool, picks the device and
arranges the inputs; then one call for the outputs and timed calls."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .artifact import load_artifact
from .errors import CLIError, first_line
from .inputs import arrange_inputs, flatten_outputs

DEVICES = ("cpu", "cuda", "gpu")


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


def choose_device(path: str, meta: dict | None, requested: str | None) -> str:
    """``cpu`` or ``cuda``: the artifact's own device; a requested one must be that device
    (an artifact runs only where it was compiled for). A library without metadata runs on
    the requested device, or the CPU."""
    if requested is not None and requested not in DEVICES:
        raise CLIError(f"unknown device {requested!r}; use cpu or cuda")
    wanted = "cuda" if requested == "gpu" else requested
    if meta is None:
        return wanted or "cpu"
    own = meta["device"]
    if wanted is not None and wanted != own:
        raise CLIError(
            f"{path!r} was compiled for target {meta['target']} and runs on {own} only, "
            f"not on --device {requested}"
        )
    return own


def run_artifact(
    path: str,
    inputs: dict[str, np.ndarray] | None = None,
    fill_mode: str = "random",
    repeat: int = 1,
    number: int = 1,
    threads: int | None = None,
    device: str | None = None,
) -> RunResult:
    """Check and load an artifact, size the thread pool, run it once for the outputs, then
    time ``repeat`` measurements of ``number`` calls each (milliseconds per call)."""
    if repeat < 1 or number < 1:
        raise CLIError("--repeat and --number must be at least 1")
    if threads is not None and threads < 1:
        raise CLIError(f"--threads must be at least 1, not {threads}")
    art = load_artifact(path)
    meta = art.meta
    device = choose_device(path, meta, device)

    import tvm
    from tvm import relax

    from ..runtime import native, set_num_threads

    if device == "cpu":
        n = threads or (meta or {}).get("threads") or 1
        set_num_threads(int(n))
        dev = tvm.cpu()
    else:
        n = 1
        dev = tvm.cuda(0)
        if not dev.exist:
            raise CLIError(f"{path!r} runs on CUDA, and this machine has no CUDA device")
    # The library links libtvm_rtask_runtime: load it from this install first.
    native.load()
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
