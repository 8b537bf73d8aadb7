"""``policy="auto", choose="measure"``: every candidate policy built and timed on the device
present, the fastest kept.

The cost model ranks the candidates without running anything, and on the CPU at full size it
is no better than a guess between policies whose times differ by a few percent (it puts
wavefront first on every model of the public set, whatever the measurement says). Timing the
builds themselves answers the question for this model on this machine, at the price of one
more build per candidate and a fraction of a second of calls. The builds are timed
interleaved (one call of each in turn, after warm-up calls), so what the machine does
meanwhile falls on all of them alike; the median decides. The kept plan's
``report()["policy_choice"]`` lists every candidate's measured and estimated time.

Where the target's device is absent (a CUDA build on a machine without a GPU) nothing can be
timed: the cost model's choice stands and a fallback note says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..core import Plan
from ..fallbacks import NOT_MEASURED, note_fallback

WARMUP = 2
MIN_CALLS = 3
TRIAL_SECONDS = 1.0  # per candidate, once MIN_CALLS are done


def random_arguments(mod: tvm.IRModule, device: tvm.runtime.Device) -> list:
    """One seeded random tensor per parameter of ``main`` (floats in [-1, 1), integers in
    [0, 8): indices stay in range for the embeddings of real models)."""
    rng = np.random.default_rng(0)
    args = []
    for param in mod["main"].params:
        ty = param.ty
        if not isinstance(ty, relax.TensorType):
            raise TypeError(f"input {param.name!r} is not a tensor ({ty}): nothing to time")
        shape, dtype = [int(v) for v in ty.shape.values], str(ty.dtype)
        if np.issubdtype(np.dtype(dtype), np.integer):
            value = rng.integers(0, 8, shape).astype(dtype)
        else:
            value = rng.uniform(-1, 1, shape).astype(dtype)
        args.append(tvm.runtime.tensor(value, device))
    return args


def interleaved_samples(
    calls: dict[str, Callable[[], Any]],
    sync: Callable[[], None],
    warmup: int,
    min_rounds: int,
    seconds: float,
) -> dict[str, list[float]]:
    """The ms of every call of each of ``calls``: ``warmup`` untimed calls each, then round
    after round one call of each in a rotating order, at least ``min_rounds`` rounds and
    until ``seconds`` have passed (``bench/policy_choice.py`` times its builds so too)."""
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    sync()
    samples: dict[str, list[float]] = {n: [] for n in names}
    begin, rounds = time.perf_counter(), 0
    while rounds < min_rounds or time.perf_counter() - begin < seconds:
        for name in names[rounds % len(names) :] + names[: rounds % len(names)]:
            start = time.perf_counter()
            calls[name]()
            sync()
            samples[name].append((time.perf_counter() - start) * 1e3)
        rounds += 1
    return samples


def time_interleaved(calls: dict[str, Callable[[], Any]], sync: Callable[[], None]) -> dict:
    """Median ms of each call (:func:`interleaved_samples`, about ``TRIAL_SECONDS`` each)."""
    seconds = TRIAL_SECONDS * len(calls)
    samples = interleaved_samples(calls, sync, WARMUP, MIN_CALLS, seconds)
    return {n: float(np.median(s)) for n, s in samples.items()}


def keep_fastest(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    first: tuple[Any, Plan],
    build_with: Callable[[str], tuple[Any, Plan]],
) -> tuple[Any, Plan]:
    """``first`` (the cost model's choice) and every other candidate (``build_with(name)``)
    timed on the device present; the fastest build and its plan, with the measurement in
    ``choice``."""
    ex, plan = first
    choice = dict(plan.choice)
    kind = target.kind.name
    device = tvm.device("cpu" if kind == "llvm" else kind, 0)
    if not device.exist:
        note_fallback(
            NOT_MEASURED,
            "policy auto",
            f"choose='measure' needs the {kind} device here; kept the cost "
            f"model's choice, {plan.policy}",
        )
        return first
    builds = {plan.policy: first}
    for name in choice.get("estimates_us", {}):
        if name not in builds:
            builds[name] = build_with(name)
    args = random_arguments(mod, device)
    calls = {}
    for name, (executable, _) in builds.items():
        main = relax.VirtualMachine(executable, device)["main"]
        calls[name] = lambda main=main: main(*args)
    measured = time_interleaved(calls, device.sync)
    best = min(measured, key=measured.get)
    ms = ", ".join(f"{n} {t:.3f} ms" for n, t in measured.items())
    choice.update(
        chosen=best,
        choose="measure",
        measured_ms={n: round(t, 4) for n, t in measured.items()},
        why=f"{best} took the least time measured here (median of interleaved calls): {ms}",
    )
    ex, kept = builds[best]
    return ex, replace(kept, choice=choice, policy=best)
