"""The GPU kit's test suite: every ``gpu``-marked test inside short calls, resumable (docs/gpu.md).

On the GPU machine after ``source .gpu/b/setup.sh``: ``python3 -m bench gpu-check`` (= ``make
gpu-check``; ``--tests``, ``--deadline``, ``--workers``, ``--test-timeout``). The benchmark this
kit once ran after the tests is ``gpu-window``'s step 2 (``python -m bench latency --gpu``):
``--skip-bench`` and ``--skip-kernels`` are still accepted and change nothing.

Into ``--out`` (default ``$OUT``, else ``gpu-results/``), as it happens: ``tests.jsonl`` (one
line per finished test: outcome, short reason, duration), ``tests-failures.log``, ``pytest.log``
(pytest's own output), ``summary.json/.md`` (GPU present or not, counts, failures, what was not
reached) and ``kit.log``. The tests stop cleanly before ``--deadline`` (seconds from
``--since``) and say what they did not reach. A second call with the same ``--out`` (with
``$OUT`` set: the same ``--state-dir``) resumes: tests already recorded are deselected.
Without a CUDA device the tests skip, and the kit says that the GPU was absent.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench import ROOT, append_jsonl, read_jsonl
from bench.gpu_pytest_plugin import (
    DEADLINE_ENV,
    JSONL_ENV,
    MIN_ENV,
    SKIP_ENV,
    TIMEOUT_ENV,
    recorded_nodeids,
)

DEFAULT_STATE = "/tmp/tvm-rtask-gpu-check"
STATE_FILES = ("tests.jsonl",)


# Whether TVM sees a CUDA device, and what it says of it (a subprocess: no CUDA context here).
_PROBE = """
import json
info = {"exist": False}
try:
    import tvm
    d = tvm.cuda(0)
    info["exist"] = bool(d.exist)
    if info["exist"]:
        for attr in ("device_name", "compute_version", "multi_processor_count",
                     "total_global_memory", "max_clock_rate", "driver_version"):
            try:
                info[attr] = getattr(d, attr)
            except Exception as err:
                info[attr] = None
except Exception as err:
    info["error"] = (type(err).__name__ + ": " + str(err))[:300]
print(json.dumps(info))
"""


def probe_gpu(force_absent: bool = False) -> dict:
    """Whether TVM sees a CUDA device, from a subprocess (a CUDA context in this driver process
    would hold the GPU through every step), and nvidia-smi's view of GPU 0."""
    if force_absent:
        return {"exist": False, "forced": "--no-gpu"}
    from bench.harness import gpu_info

    try:
        cmd = [sys.executable, "-c", _PROBE]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as err:  # noqa: BLE001 - no TVM at all, a crash, ...
        info = {"exist": False, "error": f"{type(err).__name__}: {err}"[:300]}
    info["nvidia_smi"] = gpu_info()
    return info


class Kit:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "kit.log", "a", buffering=1)
        self.deadline = args.since + args.deadline
        self.not_reached: list[str] = []
        self.phases: dict[str, dict] = {}
        self.state = Path(args.state_dir) if args.state_dir else None
        self.seeded = self._seed()

    def _seed(self) -> list[str]:
        """Each call on the GPU machine gets an empty ``$OUT``: the records of earlier calls
        come from the state folder on the machine's disk, so that the call resumes and its
        ``$OUT`` holds every record so far."""
        seeded = []
        if not self.state:
            return seeded
        for name in STATE_FILES:
            src, dst = self.state / name, self.out / name
            if src.is_file() and not dst.exists():
                shutil.copyfile(src, dst)
                seeded.append(name)
        return seeded

    def save_state(self) -> None:
        if not self.state:
            return
        self.state.mkdir(parents=True, exist_ok=True)
        for name in STATE_FILES:
            src = self.out / name
            if src.is_file():
                tmp = self.state / f".{name}.tmp"
                shutil.copyfile(src, tmp)
                os.replace(tmp, self.state / name)

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{self.elapsed():5.0f}s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def elapsed(self) -> float:
        return time.time() - self.args.since

    def remaining(self) -> float:
        return self.deadline - time.time()

    def test_paths(self) -> list[str]:
        if self.args.tests:
            return self.args.tests
        files = sorted((ROOT / "tests").rglob("test_*.py"))
        marked = [p for p in files if "mark.gpu" in p.read_text(errors="replace")]
        return [str(p.relative_to(ROOT)) for p in marked]

    def run_tests(self, budget_end: float) -> None:
        jsonl = self.out / "tests.jsonl"
        done = recorded_nodeids(str(jsonl), self.args.retry_failed)
        skip_file = self.out / ".tests-recorded.txt"
        skip_file.write_text("".join(f"{n}\n" for n in sorted(done)))
        workers = self.args.workers or _default_workers()
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "bench.gpu_pytest_plugin"]
        cmd += ["-p", "no:cacheprovider", "-rfE", "--tb=short", "-q"]
        cmd += ["--continue-on-collection-errors"]  # one broken file does not stop the rest
        try:
            import xdist  # noqa: F401

            cmd += ["-n", str(workers), "--dist", "loadgroup"]
        except ImportError:
            self.say("pytest-xdist is not installed: tests run in one process")
            workers = 1
        cmd += [*self.args.pytest_args, *self.test_paths()]
        env = dict(os.environ, **{JSONL_ENV: str(jsonl), SKIP_ENV: str(skip_file)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env.update({DEADLINE_ENV: str(budget_end), MIN_ENV: str(self.args.min_test_s)})
        if self.args.test_timeout:
            env[TIMEOUT_ENV] = str(self.args.test_timeout)
        self.say(f"tests: {len(done)} recorded before; pytest -m gpu on {workers} worker(s), "
                 f"budget {budget_end - time.time():.0f} s")  # fmt: skip
        self.say("  " + shlex.join(cmd[1:]))
        started = time.time()
        before = len(read_jsonl(jsonl))
        with open(self.out / "pytest.log", "ab") as log:
            log.write(f"\n==== {datetime.datetime.now().isoformat()} {shlex.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            killed = self._wait(proc, budget_end + self.args.grace_s, jsonl, before)
        interrupted = self._record_interrupted(jsonl) if killed else []
        records = read_jsonl(jsonl)
        new = records[before:]
        counts = _count(r["outcome"] for r in new)
        phase = {"seconds": round(time.time() - started, 1), "pytest_status": proc.returncode}
        phase.update(killed_at_budget=killed, this_call=counts, recorded_before=len(done))
        for r in new:
            if r["outcome"] == "collection_error":
                self.say(f"  COLLECTION ERROR {r['nodeid']}: {r['reason']}")
        not_reached = [r["nodeid"] for r in new if r["outcome"] == "not_reached"] + interrupted
        self.not_reached += [f"test {n}" for n in not_reached]
        cut = [r["nodeid"] for r in new if r["outcome"] == "cut"]
        self.not_reached += [f"test {n} (cut at the budget)" for n in cut]
        self.phases["tests"] = phase
        self.say(f"tests: {counts or 'nothing ran'} in {phase['seconds']} s (pytest status "
                 f"{proc.returncode}{', killed at the budget' if killed else ''})")  # fmt: skip
        for r in new:
            if r["outcome"] in ("failed", "error"):
                self.say(f"  FAILED {r['nodeid']}: {r['reason']}")

    def _wait(self, proc, hard_end: float, jsonl: Path, shown: int) -> bool:
        """Wait for pytest, echoing each recorded test; kill it (group) past ``hard_end``."""
        while True:
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            records = read_jsonl(jsonl)
            for r in records[shown:]:
                if r.get("outcome") not in ("passed", "skipped", "not_reached"):
                    self.say(f"  {r['outcome']:8s} {r['nodeid']} {r.get('reason', '')[:200]}")
            shown = len(records)
            if proc.returncode is not None:
                return False
            if time.time() > hard_end:
                self.say("tests: budget exhausted, stopping pytest")
                _kill_group(proc)
                return True

    def _record_interrupted(self, jsonl: Path) -> list[str]:
        running = jsonl.with_name(jsonl.stem + "-running.json")
        try:
            nodeids = list(json.loads(running.read_text()))
        except (OSError, ValueError):
            return []
        why = "killed at the phase budget (runs again next call)"
        for nodeid in nodeids:
            date = datetime.datetime.now().isoformat(timespec="seconds")
            rec = {"nodeid": nodeid, "outcome": "interrupted", "reason": why, "date": date}
            append_jsonl(jsonl, rec)
        running.write_text("{}")
        return nodeids

    # -- summary --------------------------------------------------------------------------
    def summary(self, gpu_info: dict) -> dict:
        self.save_state()
        tests = read_jsonl(self.out / "tests.jsonl")
        last = {}
        for r in tests:
            last[r["nodeid"]] = r
        for nodeid, r in list(last.items()):  # a file that imports again since
            if r["outcome"] == "collection_error" and any(
                n.startswith(nodeid + "::") and tests.index(o) > tests.index(r)
                for n, o in last.items()
            ):
                del last[nodeid]
        present = bool(gpu_info.get("exist"))
        doc = {"date": datetime.datetime.now().isoformat(timespec="seconds")}
        doc.update(gpu_present=present, gpu=gpu_info, dry_run=not present, argv=sys.argv[1:])
        doc.update(deadline_s=self.args.deadline, elapsed_s=round(self.elapsed(), 1))
        doc.update(phases=self.phases, tests_total=_count(r["outcome"] for r in last.values()))
        failed = ("failed", "error", "collection_error")
        bad = {n: r for n, r in last.items() if r["outcome"] in failed}
        doc["tests_failed"] = {n: r.get("reason", "") for n, r in bad.items()}
        doc["not_reached"] = self.not_reached
        (self.out / "summary.json").write_text(json.dumps(doc, indent=1))
        lines = [f"# GPU check {doc['date']}", ""]
        lines.append(f"GPU: {gpu_info.get('device_name')}" if present else
                     "GPU ABSENT (no CUDA device visible to TVM): the gpu tests skip")  # fmt: skip
        lines.append(f"elapsed {doc['elapsed_s']} s of {self.args.deadline:.0f}")
        lines.append(f"tests (all calls): {doc['tests_total']}")
        if doc["tests_failed"]:
            lines += ["", "## Failed tests"]
            lines += [f"- {n}: {r}" for n, r in doc["tests_failed"].items()]
        lines += ["", "## Not reached in this call"]
        lines += [f"- {n}" for n in self.not_reached] or ["- nothing: every test was reached"]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")
        return doc


def _default_workers() -> int:
    """One per core, two left for the controller and the driver, at most 14."""
    return max(1, min(14, (os.cpu_count() or 2) - 2))


def _count(outcomes) -> dict:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o] = counts.get(o, 0) + 1
    return counts


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def parse_args(argv):
    default_out = os.environ.get("OUT") or str(ROOT / "gpu-results")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--out", default=default_out, help="results folder (default $OUT, else gpu-results/)")
    add("--deadline", type=float, default=540, help="seconds from --since to stop by")
    add("--since", type=float, default=None, help="Unix time the call began (default now)")
    add("--tests", nargs="+", help="test paths (default: files with gpu marks)")
    add("--workers", type=int, help="pytest-xdist workers (default cores - 2, <= 14)")
    add("--test-timeout", type=float, help="cap on one test's seconds")
    add("--min-test-s", type=float, default=5,
        help="no test starts later than this before the budget end")  # fmt: skip
    add("--state-dir", default=DEFAULT_STATE if os.environ.get("OUT") else None,
        help="records of earlier calls, kept on the machine's disk and copied into an empty "
        f"--out (default {DEFAULT_STATE} when $OUT is set, else none: --out itself "
        "persists)")  # fmt: skip
    add("--retry-failed", action="store_true", help="rerun failed tests")
    add("--grace-s", type=float, default=15, help="pytest is killed this long after the budget")
    add("--no-gpu", dest="force_no_gpu", action="store_true", help="act as without a GPU")
    add("--pytest-args", default="", help="more pytest arguments, one string")
    for gone in ("--skip-bench", "--skip-kernels"):  # the benchmark is gpu-window's now
        add(gone, action="store_true", help="accepted, changes nothing")
    args = p.parse_args(argv)
    args.since = args.since or time.time()
    args.pytest_args = shlex.split(args.pytest_args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kit = Kit(args)
    end = kit.deadline - 5  # room for the summary
    left = kit.remaining()
    kit.say(f"gpu_check: out {kit.out}, deadline {args.deadline:.0f} s, {left:.0f} s left")
    if kit.seeded:
        kit.say(f"resuming: {', '.join(kit.seeded)} copied from {kit.state}")
    gpu = probe_gpu(args.force_no_gpu)
    if gpu.get("exist"):
        sms, smi = gpu.get("multi_processor_count"), gpu.get("nvidia_smi")
        kit.say(f"GPU: {gpu.get('device_name')} (compute {gpu.get('compute_version')}, "
                f"{sms} SMs; nvidia-smi: {smi})")  # fmt: skip
    else:
        smi = gpu.get("nvidia_smi", {}).get("name")
        kit.say("GPU ABSENT: no CUDA device visible (tvm.cuda(0).exist is False); dry run: "
                "the gpu tests skip" + (f" [{gpu['error']}]" if gpu.get("error") else "")
                + (f"; nvidia-smi sees {smi}" if smi else ""))  # fmt: skip
    kit.summary(gpu)
    kit.run_tests(end)
    doc = kit.summary(gpu)
    kit.say(f"summary -> {kit.out / 'summary.md'}")
    print((kit.out / "summary.md").read_text(), flush=True)
    if not doc["gpu_present"]:
        print("GPU ABSENT: this was a dry run.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
