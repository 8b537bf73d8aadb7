"""Build a shipped record set (``tvm_rtask/records/shipped/<set>/``): tune, compare, prune.

Usage:
    python -m bench ship-records tune --work /tmp/ship-avx2 [--models light:squeezenet
        light:inception_v1 zoo:alexnet ...] [--trials-per-op 16] [--seconds 3600]
    python -m bench ship-records ship --work /tmp/ship-avx2 [--models ...] [--set x86_64-avx2]
        [--repeat 20] [--rounds 3] [--json bench/results/<name>.json]
    python -m bench ship-records recheck [--set x86_64-avx2] [--repeat 10] [--rounds 3]
    python3 -m bench ship-records window --set h100 --work W --out $OUT/records --seconds 240
        [--models zoo:inception_v3 ...]          # in a GPU window: tune, ship, pack W

``tune`` runs :func:`tvm_rtask.tuning.tune` on each model in turn into one scratch work
directory, for the set's tuning target (``x86_64-avx2``: ``{"kind": "llvm", "mcpu":
"haswell", "num-cores": 2}``, AVX2 without AVX-512, so the records run on any AVX2 CPU;
``h100`` / ``h200``: ``{"kind": "cuda", "arch": "sm_90"}``, MetaSchedule's builder on every
core of the machine, its runner on the GPU present). ``--seconds`` is the budget of the whole
command (models share what is left); the work directory is resumable, so run it again (or
carry it into the next GPU window) until every operator is done.

``ship`` takes, for each tuned operator of the models, the best record and times it against
what ``tvm_rtask.compile`` builds for the same operator without records (llvm: the CPU
schedule rules' schedule, or the unscheduled TIR where no rule applies; CUDA: dlight's
schedule at the vEU's 256 threads, ``backend/cuda/rkernel.schedule_for_cuda``), with
``tvm.compile`` for the set's target and, on the CPU when this machine's CPU differs, for
the host CPU too (``llvm-native``), in one process, interleaved, ``--rounds`` rounds of
``--repeat`` calls each (CPU: on 2 worker threads), medians. A record is kept only where it
is faster than the baseline under every target timed (by ``--min-speedup``, default 5 %, a
margin over the noise of a shared machine) and computes the same (relative error < 1e-4);
the kept records (best record only) and their workloads are written as a compact
MetaSchedule JSON database, with ``manifest.json`` saying what was tuned, how, and every
operator's times (kept or not).

``recheck`` times every record of the shipped set again against what ``compile`` builds
today without records, the same way, and drops those no longer faster: the rules improve,
and a record kept against last week's rules may now be slower than they are (SqueezeNet's
first max pool: the record 514 us in the model, the pooling rule 114 us). It needs no work
directory: the set's own database holds each workload and its record.

``window`` is ``tune`` then ``ship`` within ``--seconds`` (ship gets what tune leaves, at
least ``--ship-seconds``), for a GPU window: the set goes to ``--out/<set>/`` and the work
directory is packed into ``--out/work.tar.gz``, to carry into the next window (``--work``
of an unpacked copy resumes it) so that each window adds records.

Model specs: ``light:<name>`` (``tvm_rtask.testing.onnx_light``), ``zoo:<name>``
(``tvm_rtask.models``, batch 1, full size; ``zoo:<name>:reduced`` the reduced variant) or an
``.onnx`` file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# Set name -> the target its records are tuned and compared for.
SET_TARGETS = {
    "x86_64-avx2": {"kind": "llvm", "mcpu": "haswell"},
    "h100": {"kind": "cuda", "arch": "sm_90"},
    "h200": {"kind": "cuda", "arch": "sm_90"},
}
# dlight schedules every CUDA operator for vEUs of this many threads (option cuda_threads)
CUDA_THREADS = 256
DEFAULT_MODELS = ["light:squeezenet", "light:inception_v1"]
NUM_CORES = 2
PAUSE_S = 0.1


def load_spec(spec: str):
    """An ONNX ModelProto for a model spec (see the module docstring)."""
    if spec.endswith(".onnx"):
        import onnx

        return onnx.load(spec)
    kind, _, name = spec.partition(":")
    if kind == "light":
        from tvm_rtask.testing.onnx_light import load_light_model

        return load_light_model(name)
    if kind == "zoo":
        import tvm_rtask.models as zoo

        bare, _, size = name.partition(":")
        return zoo.onnx_model(bare, batch=1, **({"reduced": True} if size == "reduced" else {}))
    raise SystemExit(f"model spec {spec!r} must be light:<name> or zoo:<name>")


def set_target(name: str):
    from tvm.target import Target

    return Target(SET_TARGETS[name])


def is_cuda(name: str) -> bool:
    return SET_TARGETS[name]["kind"] == "cuda"


def num_cores(name: str) -> int | None:
    """Cores MetaSchedule's llvm target says it tunes for; CUDA: None (the builder uses
    every core)."""
    return None if is_cuda(name) else NUM_CORES


# -- tune -------------------------------------------------------------------------------------
def cmd_tune(args) -> None:
    from tvm_rtask.tuning import tune
    from tvm_rtask.tuning.tasks import extract_tasks, preparation_target, prepared

    target = set_target(args.set)
    deadline = time.monotonic() + args.seconds if args.seconds else None
    for spec in args.models:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            print(f"{spec}: no time left", flush=True)
            break
        model = load_spec(spec)
        count = len(extract_tasks(prepared(model, target=preparation_target(target))))
        print(f"{spec}: {count} operators, {args.trials_per_op} trials each", flush=True)
        report = tune(
            model,
            target,
            args.work,
            trials=args.trials_per_op * count,
            seconds=left,
            num_trials_per_iter=args.trials_per_iter,
            num_cores=num_cores(args.set),
            progress=False,
        )
        print(
            f"{spec}: tuned {len(report.tuned)}, reused {report.reused}, "
            f"pending {len(report.pending)} in {report.seconds:.0f} s",
            flush=True,
        )


# -- ship -------------------------------------------------------------------------------------
def _build(func, target):
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    return lib.jit() if hasattr(lib, "jit") else lib


def _args_of(func, device, seed: int = 0) -> list:
    import tvm

    rng = np.random.default_rng(seed)
    return [
        tvm.runtime.tensor(rng.standard_normal([int(s) for s in p.shape]).astype(p.dtype), device)
        for p in func.params
    ]


def baseline_schedule(func, target):
    """What ``compile`` uses for ``func`` without records on ``target``."""
    if target.kind.name == "cuda":
        from tvm.target import Target

        from tvm_rtask.backend.cuda.rkernel import schedule_for_cuda

        limited = Target(dict(target.export(), max_num_threads=CUDA_THREADS))
        return schedule_for_cuda(func, limited, rules=False)
    from tvm_rtask.backend.cpu.backend import _candidates

    return _candidates(func, None, target)[0][0]


def compare(func, tuned, targets: dict, repeat: int, rounds: int) -> dict:
    """Median us of the baseline schedule and of ``tuned`` for each target, interleaved."""
    import tvm

    out = {}
    for label, target in targets.items():
        cuda = target.kind.name == "cuda"
        device = tvm.cuda(0) if cuda else tvm.cpu()
        baseline = baseline_schedule(func, target)
        args = _args_of(func, device)
        libs = {"rules": _build(baseline, target), "tuned": _build(tuned, target)}
        results = {}
        for name, lib in libs.items():
            copy = [tvm.runtime.tensor(a.numpy(), device) for a in args]
            lib["main"](*copy)
            results[name] = copy[-1].numpy()
        expect, got = results["rules"], results["tuned"]
        error = float(np.max(np.abs(got - expect)) / max(np.max(np.abs(expect)), 1e-30))
        samples = {name: [] for name in libs}
        timers = {
            name: lib.time_evaluator("main", device, number=1, repeat=repeat, min_repeat_ms=5)
            for name, lib in libs.items()
        }
        for name in libs:  # warm up
            timers[name](*args)
        for _ in range(rounds):
            for name, timer in timers.items():
                time.sleep(PAUSE_S)
                samples[name].extend(float(r) * 1e6 for r in timer(*args).results)
        medians = {name: float(np.median(v)) for name, v in samples.items()}
        out[label] = {
            "rules_us": round(medians["rules"], 2),
            "tuned_us": round(medians["tuned"], 2),
            "speedup": round(medians["rules"] / medians["tuned"], 3),
            "rel_error": error,
            "rule": "dlight" if cuda else _rule_name(baseline),
        }
    return out


def _rule_name(func) -> str | None:
    from tvm_rtask.backend.cpu.rules import RULE_ATTR

    attrs = func.attrs
    return str(attrs[RULE_ATTR]) if attrs is not None and RULE_ATTR in attrs else None


def cmd_ship(args) -> None:
    import tvm

    import tvm_rtask
    from tvm_rtask.backend.cpu.host import host_cpu_name
    from tvm_rtask.records.database import Ledger, open_database, valid_records
    from tvm_rtask.records.tuned import TunedKernels
    from tvm_rtask.runtime import set_num_threads
    from tvm_rtask.tuning.tasks import (
        extract_tasks,
        preparation_target,
        prepared,
        task_module,
        workload_key,
    )
    from tvm_rtask.tuning.tuner import tuning_target

    set_num_threads(NUM_CORES)
    target = set_target(args.set)
    targets = {"set": target}
    host = host_cpu_name()
    if (
        not is_cuda(args.set)
        and host not in ("generic", target.attrs.get("mcpu"))
        and not args.set_target_only
    ):
        targets["host"] = tvm_rtask.backend.as_target("llvm-native")
    kind = target.kind.name
    work = args.work
    database = open_database(work, readonly=True)
    ledger = Ledger(work)
    tuned = TunedKernels(work, kind, top_k=1)
    deadline = time.monotonic() + args.seconds if getattr(args, "seconds", None) else None
    out_dir = Path(args.out or ROOT / "tvm_rtask" / "records" / "shipped" / args.set)
    reuse, reuse_from = {}, None
    if args.reuse:  # times of a previous ship run, for operators whose best record is the same
        previous = json.loads(Path(args.reuse).read_text())
        reuse, reuse_from = previous["operators"], previous["command"][-1]
        if previous.get("compared_on") != {lbl: str(t) for lbl, t in targets.items()}:
            raise SystemExit(f"--reuse {args.reuse}: compared on other targets")
    keep: list = []  # (workload mod, record)
    operators: dict[str, dict] = {}
    models: dict[str, dict] = {}
    for spec in args.models:
        tasks = extract_tasks(prepared(load_spec(spec), target=preparation_target(target)))
        covered = []
        for task in tasks:
            key = workload_key(task.func)
            entry = operators.get(key)
            if entry is None:
                entry = {"name": task.name, "models": [], "calls": 0}
                records = valid_records(database, task_module(task.func), 1)
                done = ledger.done(key, kind)
                entry["finished"] = done
                late = deadline is not None and time.monotonic() > deadline
                if not records:
                    entry.update(kept=False, reason="not tuned")
                elif late:
                    entry.update(kept=False, reason="not compared: out of time")
                else:
                    record = records[0]
                    schedule = tuned.schedules(task.func)[0]
                    entry["trials"] = len(valid_records(database, task_module(task.func), 10**6))
                    entry["record_us"] = round(schedule.us, 2)
                    old = reuse.get(key, {})
                    if old.get("times") and old.get("record_us") == entry["record_us"]:
                        times = old["times"]  # the same best record, compared before
                        entry["times_from"] = old.get("times_from") or reuse_from
                    else:
                        times = compare(task.func, schedule.func, targets, args.repeat, args.rounds)
                    entry["times"] = times
                    wins = all(t["speedup"] >= args.min_speedup for t in times.values())
                    accurate = all(t["rel_error"] < 1e-4 for t in times.values())
                    entry["kept"] = wins and accurate
                    if not accurate:
                        entry["reason"] = "numbers differ from the rules'"
                    elif not wins:
                        entry["reason"] = "not faster than the rules"
                    if entry["kept"]:
                        keep.append(record)
                    print(f"{spec:20s} {task.name:32s} " + _verdict(times, entry), flush=True)
                operators[key] = entry
            entry["models"].append(spec)
            entry["calls"] += task.calls
            covered.append(key)
        models[spec] = {
            "operators": len(tasks),
            "tuned": sum(1 for k in covered if "times" in operators[k]),
            "kept": sum(1 for k in covered if operators[k]["kept"]),
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_records(out_dir, keep)
    manifest = {
        "format": 1,
        "set": args.set,
        "target": SET_TARGETS[args.set],
        "tuning_target": str(tuning_target(target, num_cores(args.set))),
        "compared_on": {lbl: str(t) for lbl, t in targets.items()},
        "tvm": tvm.__version__,
        "tvm_rtask": tvm_rtask.__version__,
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {_cpu_model()} ({os.cpu_count()} cores), "
        f"LLVM host cpu {host}" + (f", GPU {_gpu_name()}" if is_cuda(args.set) else ""),
        "command": _commands(work, _times_from(operators)),
        "rule": f"a record is kept only where it was at least {args.min_speedup}x as fast as "
        + (
            f"dlight's schedule of the same operator ({CUDA_THREADS} threads) on the GPU"
            if is_cuda(args.set)
            else "the CPU rules' schedule of the same operator (or the unscheduled TIR where "
            f"no rule applies) under every target of compared_on, {NUM_CORES} threads"
        )
        + f", timed in one process, interleaved, {args.rounds} rounds x {args.repeat} "
        "time_evaluator repeats of at least 5 ms, medians",
        "min_speedup": args.min_speedup,
        "models": models,
        "operators": {k: operators[k] for k in sorted(operators)},
    }
    if not keep:
        manifest["note"] = "no tuned record beat the rules: the set is empty"
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(manifest, indent=1) + "\n")
    kept = sum(1 for e in operators.values() if e["kept"])
    tuned_count = sum(1 for e in operators.values() if "times" in e)
    print(f"kept {kept} of {tuned_count} tuned operators ({len(operators)} in all) -> {out_dir}")


def _verdict(times: dict, entry: dict) -> str:
    """One line of rules-against-record times per target, and whether the record stays."""
    return (
        "  ".join(
            f"{lbl}: rules {t['rules_us']:9.1f} tuned {t['tuned_us']:9.1f} us x{t['speedup']:.2f}"
            for lbl, t in times.items()
        )
        + f"  {'KEEP' if entry['kept'] else 'drop'}"
    )


def write_records(out_dir: Path, records: list) -> None:
    """The set's compact database: exactly ``records`` (each with its workload)."""
    from tvm.s_tir import meta_schedule as ms

    for name in ("database_workload.json", "database_tuning_record.json"):
        (out_dir / name).unlink(missing_ok=True)
    shipped = ms.database.JSONDatabase(work_dir=os.fspath(out_dir))
    for record in records:
        workload = shipped.commit_workload(record.workload.mod)
        shipped.commit_tuning_record(
            ms.database.TuningRecord(
                record.trace, workload, record.run_secs, record.target, record.args_info
            )
        )


def cmd_recheck(args) -> None:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    import tvm_rtask
    from tvm_rtask.backend.cpu.host import host_cpu_name
    from tvm_rtask.records.workload import TASK_SYMBOL
    from tvm_rtask.runtime import set_num_threads

    set_num_threads(NUM_CORES)
    target = set_target(args.set)
    targets = {"set": target}
    host = host_cpu_name()
    if not is_cuda(args.set) and host not in ("generic", target.attrs.get("mcpu")):
        targets["host"] = tvm_rtask.backend.as_target("llvm-native")
    out_dir = ROOT / "tvm_rtask" / "records" / "shipped" / args.set
    manifest = json.loads((out_dir / "manifest.json").read_text())
    database = ms.database.JSONDatabase(work_dir=os.fspath(out_dir))
    command = "python -m bench ship-records " + " ".join(sys.argv[1:])
    keep = []
    for record in database.get_all_tuning_records():
        mod = record.workload.mod
        key = f"{tvm_ffi_hash(mod) & (2**64 - 1):016x}"
        sch = tvm.s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        func = mod[TASK_SYMBOL].without_attr("global_symbol")
        tuned = sch.mod[TASK_SYMBOL].without_attr("global_symbol")
        times = compare(func, tuned, targets, args.repeat, args.rounds)
        wins = all(t["speedup"] >= args.min_speedup for t in times.values())
        accurate = all(t["rel_error"] < 1e-4 for t in times.values())
        entry = manifest["operators"].setdefault(key, {"name": key})
        entry.update(times=times, times_from=command, kept=wins and accurate)
        entry.pop("reason", None)
        if not entry["kept"]:
            entry["reason"] = (
                "numbers differ from the rules'" if not accurate else "not faster than the rules"
            )
        else:
            keep.append(record)
        print(f"{entry.get('name', key):40s} " + _verdict(times, entry), flush=True)
    write_records(out_dir, keep)
    for spec, counts in manifest["models"].items():
        counts["kept"] = sum(
            1
            for e in manifest["operators"].values()
            if e.get("kept") and spec in e.get("models", [])
        )
    manifest["command"].append(command)
    manifest["date"] = datetime.date.today().isoformat()
    manifest["tvm_rtask"] = tvm_rtask.__version__
    if not keep:
        manifest["note"] = "no tuned record beat the rules: the set is empty"
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"kept {len(keep)} of the set's records -> {out_dir}")


def tvm_ffi_hash(mod) -> int:
    import tvm_ffi

    return int(tvm_ffi.structural_hash(mod))


def _gpu_name() -> str:
    import tvm

    device = tvm.cuda(0)
    return str(device.device_name) if device.exist else "none"


def _cpu_model() -> str:
    from tvm_rtask.backend.cpu.threads import cpu_model_name

    return cpu_model_name()


def _times_from(operators: dict) -> list[str]:
    """The earlier ship runs whose times the manifest reuses, in first-use order."""
    found = [e["times_from"] for e in operators.values() if e.get("times_from")]
    return list(dict.fromkeys(found))


def _commands(work: str, reused: list[str]) -> list[str]:
    """The commands that made the set: the tune runs logged in the work directory, the ship
    run whose times were reused, and this one."""
    log = Path(work, "ship_commands.txt")
    done = log.read_text().splitlines() if log.exists() else []
    return [*done, *reused, "python -m bench ship-records " + " ".join(sys.argv[1:])]


def cmd_window(args) -> None:
    """``tune`` then ``ship`` within ``--seconds``; the work directory packed for the next
    window."""
    import tarfile

    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _log_command(args.work)
    args.seconds = max(1.0, args.seconds - args.ship_seconds)
    cmd_tune(args)
    left = args.ship_seconds + max(0.0, args.seconds - (time.monotonic() - start))
    ship = argparse.Namespace(**vars(args), json=None, reuse=None, set_target_only=True)
    ship.out, ship.seconds = str(out / args.set), left
    cmd_ship(ship)
    with tarfile.open(out / "work.tar.gz", "w:gz") as tar:
        tar.add(args.work, arcname="work")
    print(f"window: {time.monotonic() - start:.0f} s; work directory -> {out / 'work.tar.gz'}")


def _log_command(work: str) -> None:
    os.makedirs(work, exist_ok=True)
    with open(Path(work, "ship_commands.txt"), "a") as f:
        f.write("python -m bench ship-records " + " ".join(sys.argv[1:]) + "\n")


def _ship_options(p) -> None:
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--min-speedup",
        type=float,
        default=1.05,
        help="keep a record only this much faster than the baseline (default 1.05: "
        "a margin over the noise of a shared machine)",
    )


def _tune_options(p) -> None:
    p.add_argument("--trials-per-op", type=int, default=16)
    p.add_argument("--trials-per-iter", type=int, default=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench ship-records", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tune", "ship", "window"):
        p = sub.add_parser(name)
        p.add_argument("--work", required=True, help="scratch tuning work directory")
        p.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
        p.add_argument("--set", default="x86_64-avx2", choices=sorted(SET_TARGETS))
        if name in ("tune", "window"):
            _tune_options(p)
        if name in ("ship", "window"):
            _ship_options(p)
        if name == "tune":
            p.add_argument("--seconds", type=float, default=None, help="budget of this run")
        elif name == "window":
            p.add_argument("--out", required=True, help="the set and work.tar.gz go here")
            p.add_argument("--seconds", type=float, required=True, help="budget of it all")
            p.add_argument("--ship-seconds", type=float, default=60.0,
                           help="of --seconds, kept for comparing the records")  # fmt: skip
        else:
            p.add_argument("--out", help="default tvm_rtask/records/shipped/<set>")
            p.add_argument("--json", help="also write the manifest here")
            p.add_argument(
                "--reuse",
                help="a previous run's manifest.json: its times are reused for operators whose "
                "best record is unchanged (their entries say times_from)",
            )
            p.add_argument(
                "--set-target-only",
                action="store_true",
                help="time under the set's target only (not the host CPU's too)",
            )
    p = sub.add_parser("recheck")
    p.add_argument("--set", default="x86_64-avx2", choices=sorted(SET_TARGETS))
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-speedup", type=float, default=1.05)
    p.add_argument("--json", help="also write the manifest here")
    args = parser.parse_args(argv)
    if args.command == "recheck":
        cmd_recheck(args)
    elif args.command == "tune":
        _log_command(args.work)
        cmd_tune(args)
    elif args.command == "window":
        cmd_window(args)
    else:
        cmd_ship(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
