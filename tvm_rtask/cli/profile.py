"""``tvm-rtask profile`` and ``--cost measured``: the device check, the cache directory and
the table of a measured profile."""

from __future__ import annotations

import os
import shlex

from .errors import CLIError
from .paths import check_directory

COST_CHOICES = ("analytical", "measured")


def check_device(target, what: str, options: dict | None = None) -> None:
    """A measurement needs the device it measures: one line when it is not present. With
    ``options`` (``--cost measured``) a shipped profile of the options' device will do
    (``tvm_rtask/runtime/profiles/<device>/``, docs/scheduling.md)."""
    from ..backend import get_backend
    from ..errors import OptionError

    backend = get_backend(target)
    try:
        backend.device()
    except OptionError:
        lead = f"no {backend.name.upper()} device: {what} needs the device it measures"
        if options is None:
            raise CLIError(lead) from None
        from ..options import resolve_options
        from ..runtime.profiler import no_shipped_profile_message, shipped_profile

        device = backend.device_spec(resolve_options(dict(options))).name
        if shipped_profile(device) is None:
            raise CLIError(no_shipped_profile_message(device, backend.name, lead + ",")) from None


def use_cache_directory(directory: str | None) -> str | None:
    """``--cache DIR``: checked (created when missing) and made the profiler's cache for
    this process (``TVM_RTASK_CACHE``, which ``cost="measured"`` reads too)."""
    if directory is None:
        return None
    from ..runtime.profiler import CACHE_ENV

    path = check_directory(directory, "--cache", create=True)
    os.makedirs(path, exist_ok=True)
    os.environ[CACHE_ENV] = path
    return path


def format_profile(title: str, profile) -> str:
    """One row per distinct rKernel (rTasks, us per rTask, from the cache or not), then the
    synchronisation costs and the fitted model."""
    ms = profile.measurements
    blocks = any(m.blocks not in (0, m.num_rtasks) or m.concurrent != 1 for m in ms)
    width = max([24, *(len(m.kernel) + 2 for m in ms)])
    head = f"{'rKernel':{width}s}{'rTasks':>8s}{'us/rTask':>12s}"
    if blocks:
        head += f"{'blocks':>9s}{'at once':>9s}"
    lines = [title, head + f"{'cached':>8s}"]
    for m in ms:
        row = f"{m.kernel:{width}s}{m.num_rtasks:>8d}{m.rtask_us:>12.3f}"
        if blocks:
            row += f"{m.blocks:>9d}{m.concurrent:>9d}"
        lines.append(row + f"{'yes' if m.cached else 'no':>8s}")
    cached = sum(m.cached for m in ms)
    lines.append(f"{len(ms)} distinct rKernels ({cached} from the cache)")
    sync = profile.sync
    if sync is not None:
        lines.append(
            f"sync ({sync.barrier} barriers, {sync.num_veu} vEUs): barrier {sync.barrier_us:.3f} "
            f"us, launch {sync.launch_us:.3f} us" + (" (cached)" if sync.cached else "")
        )
    for device, (ce, me, ov) in profile.model.factors.items():
        lines.append(
            f"fitted model ({device}): compute efficiency {ce:.4g}, memory efficiency "
            f"{me:.4g}, task overhead {ov:.3f} us"
        )
    return "\n".join(lines)


def profile_command(args) -> str:
    """The ``tvm-rtask profile`` command ``args`` stand for (what device.json records)."""
    words = ["tvm-rtask", "profile", args.model, "--target", args.target]
    if args.batch != 1:
        words += ["--batch", str(args.batch)]
    if args.reduced:
        words.append("--reduced")
    if args.input_shapes:
        words += ["--input-shapes", args.input_shapes]
    for flag in ("barrier", "num_veu", "db"):
        if getattr(args, flag, None) is not None:
            words += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for option in args.option or ():
        words += ["--option", option]
    if args.remeasure:
        words.append("--remeasure")
    return shlex.join([*words, "--export-shipped", args.export_shipped])


def export_shipped_profile(args, model: str, profile, cache) -> str:
    """``--export-shipped DIR``: the profile just made (its cache entries, sync costs and
    fitted factors) merged into DIR in the shipped format; one line saying so."""
    from ..backend import get_backend
    from ..runtime.profiler import export_shipped

    target = profile.measurements[0].target if profile.measurements else None
    doc = export_shipped(
        args.export_shipped,
        cache,
        profiles=[{"model": model, **profile.to_dict()}],
        name=get_backend(target or args.target).host_fingerprint(),
        device_name=profile.device,
        device=profile.vdevice.spec.name,
        target=target,
        command=profile_command(args),
    )
    return (
        f"shipped profile of {doc['device']} ({doc['name']}) -> {args.export_shipped}: "
        f"{doc['kernels']} kernels, {len(doc['sync'])} sync results"
    )
