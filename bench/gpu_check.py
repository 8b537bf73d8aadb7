"""The GPU kit: the ``gpu`` tests, then the benchmark, inside one short call (docs/gpu.md).

Run on the GPU machine after ``source .gpu/b/setup.sh``::

    python3 bench/gpu_check.py --skip-bench     # call 1: the gpu-marked tests
    python3 bench/gpu_check.py --skip-tests     # call 2: the benchmark (+ kernel report)
    make gpu-check ARGS="--skip-bench"          # the same through make

Everything goes to ``--out`` (default ``$OUT``, else ``gpu-results/``) as it happens:

``tests.jsonl``            one line per finished test: outcome, short reason, duration
``tests-failures.log``     the long report of every failure
``pytest.log``             pytest's own output (nvcc warnings included)
``bench.jsonl``            one line per model x configuration (``bench/harness.py``)
``bench.json/.md/.png``    the same gathered: per model, table, plot
``kernels/``               per-operator report of the first models (``bench/kernel_report.py``)
``summary.json/.md``       GPU present or not, counts, failures, what was not reached
``kit.log``                this script's output

Each phase has a time budget inside ``--deadline`` (seconds from ``--since``, default now);
a phase stops cleanly before its end and says what it did not reach. A second call with the
same ``--out`` resumes: tests already recorded are deselected, benchmark configurations
already recorded are skipped, and compiled executables are reused from ``--cache-dir``
(default ``/tmp/tvm-rtask-cache``, keyed by model, configuration and a hash of the
tvm_rtask sources). Without a CUDA device (``tvm.cuda(0).exist`` false) the kit does a dry
run of the whole flow: the gpu tests (which skip), then ``--smoke`` models on llvm, and it
says that the GPU was absent.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from gpu_pytest_plugin import (  # noqa: E402
    DEADLINE_ENV,
    JSONL_ENV,
    MIN_ENV,
    SKIP_ENV,
    TIMEOUT_ENV,
    append_line,
    recorded_nodeids,
)

DEFAULT_CACHE = "/tmp/tvm-rtask-cache"
DEFAULT_STATE = "/tmp/tvm-rtask-gpu-check"
STATE_FILES = ("tests.jsonl", "bench.jsonl")
# Small models first: their CUDA builds take seconds, the large zoo models minutes.
# Full LSTM-TC (~20k operators) and Seq2Seq need many minutes of nvcc: name them explicitly.
GPU_BENCH_MODELS = [
    "squeezenet",
    "alexnet",
    "bert_layer",
    "resnext29",
    "inception_v3",
    "randwire",
    "deepspeech2",
]
SMOKE_BENCH_MODELS = ["lstm_tc"]


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

    # -- environment ----------------------------------------------------------------------
    def probe_gpu(self) -> dict:
        """Whether TVM sees a CUDA device, in a subprocess (importing TVM here would hold it)."""
        try:
            out = subprocess.run(
                [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
            )
            info = json.loads(out.stdout.strip().splitlines()[-1])
        except Exception as err:  # no TVM at all, a crash, ...
            info = {"exist": False, "error": f"{type(err).__name__}: {err}"[:300]}
        sys.path.insert(0, str(HERE))
        from harness import gpu_info

        info["nvidia_smi"] = gpu_info()
        if self.args.force_no_gpu:
            info = {"exist": False, "forced": "--no-gpu"}
        return info

    # -- phase 1: tests -------------------------------------------------------------------
    def test_paths(self) -> list[str]:
        if self.args.tests:
            return self.args.tests
        paths = []
        for path in sorted((ROOT / "tests").rglob("test_*.py")):
            text = path.read_text(errors="replace")
            if "mark.gpu" in text:
                paths.append(str(path.relative_to(ROOT)))
        return paths

    def run_tests(self, budget_end: float) -> None:
        jsonl = self.out / "tests.jsonl"
        done = recorded_nodeids(str(jsonl), self.args.retry_failed)
        skip_file = self.out / ".tests-recorded.txt"
        skip_file.write_text("".join(f"{n}\n" for n in sorted(done)))
        workers = self.args.workers or _default_workers()
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "gpu_pytest_plugin"]
        cmd += ["-p", "no:cacheprovider", "-rfE", "--tb=short", "-q"]
        cmd += ["--continue-on-collection-errors"]  # one broken file does not stop the rest
        try:
            import xdist  # noqa: F401

            cmd += ["-n", str(workers), "--dist", "loadgroup"]
        except ImportError:
            self.say("pytest-xdist is not installed: tests run in one process")
            workers = 1
        cmd += [*self.args.pytest_args, *self.test_paths()]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HERE), str(ROOT), env.get("PYTHONPATH", "")) if p
        )
        env[JSONL_ENV] = str(jsonl)
        env[SKIP_ENV] = str(skip_file)
        env[DEADLINE_ENV] = str(budget_end)
        env[MIN_ENV] = str(self.args.min_test_s)
        if self.args.test_timeout:
            env[TIMEOUT_ENV] = str(self.args.test_timeout)
        self.say(
            f"tests: {len(done)} recorded before; pytest -m gpu on {workers} worker(s), "
            f"budget {budget_end - time.time():.0f} s"
        )
        self.say("  " + shlex.join(cmd[1:]))
        started = time.time()
        before = len(_read_jsonl(jsonl))
        with open(self.out / "pytest.log", "ab") as log:
            log.write(f"\n==== {datetime.datetime.now().isoformat()} {shlex.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=str(ROOT),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            killed = self._wait(proc, budget_end + self.args.grace_s, jsonl, before)
        interrupted = self._record_interrupted(jsonl) if killed else []
        records = _read_jsonl(jsonl)
        new = records[before:]
        counts = _count(r["outcome"] for r in new)
        phase = {
            "seconds": round(time.time() - started, 1),
            "pytest_status": proc.returncode,
            "killed_at_budget": killed,
            "this_call": counts,
            "recorded_before": len(done),
        }
        for r in new:
            if r["outcome"] == "collection_error":
                self.say(f"  COLLECTION ERROR {r['nodeid']}: {r['reason']}")
        not_reached = [r["nodeid"] for r in new if r["outcome"] == "not_reached"]
        not_reached += interrupted
        if not_reached:
            self.not_reached += [f"test {n}" for n in not_reached]
        self.not_reached += [
            f"test {r['nodeid']} (cut at the budget)" for r in new if r["outcome"] == "cut"
        ]
        self.phases["tests"] = phase
        self.say(
            f"tests: {counts or 'nothing ran'} in {phase['seconds']} s (pytest status "
            f"{proc.returncode}{', killed at the budget' if killed else ''})"
        )
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
            records = _read_jsonl(jsonl)
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
        for nodeid in nodeids:
            append_line(
                str(jsonl),
                {
                    "nodeid": nodeid,
                    "outcome": "interrupted",
                    "reason": "killed at the phase budget (runs again next call)",
                    "date": datetime.datetime.now().isoformat(timespec="seconds"),
                },
            )
        running.write_text("{}")
        return nodeids

    # -- phase 2: benchmark ---------------------------------------------------------------
    def run_bench(self, budget_end: float, gpu: bool) -> None:
        args = self.args
        if args.models:
            models = args.models.split(",")
        else:
            models = SMOKE_BENCH_MODELS if args.smoke or not gpu else GPU_BENCH_MODELS
        cmd = [sys.executable, str(HERE / "harness.py")]
        cmd += ["--gpu"] if gpu else []
        cmd += ["--smoke"] if (args.smoke or not gpu) else []
        cmd += ["--models", *models, "--out-dir", str(self.out)]
        cmd += ["--results", str(self.out / "bench.jsonl"), "--deadline-at", str(budget_end)]
        cmd += ["--timeout", str(args.config_timeout)]
        jobs = args.compile_jobs or (_default_workers() if gpu else min(2, os.cpu_count() or 1))
        cmd += ["--compile-jobs", str(jobs)]
        cmd += ["--cache-dir", args.cache_dir] if args.cache_dir else ["--no-cache"]
        if args.configs:
            cmd += ["--configs", *args.configs.split(",")]
        if args.retry_failed:
            cmd.append("--retry-failed")
        cmd += args.bench_args
        self.say(f"bench: budget {budget_end - time.time():.0f} s")
        self.say("  " + shlex.join(cmd[1:]))
        started = time.time()
        status, lines = self._stream(cmd, self.out / "bench.log", budget_end + self.args.grace_s)
        reached = True
        for i, line in enumerate(lines):
            if line.startswith("NOT REACHED"):
                self.not_reached += [
                    f"bench {ln.strip()}" for ln in lines[i + 1 :] if ln.startswith("  ")
                ]
                reached = False
        self.phases["bench"] = {
            "seconds": round(time.time() - started, 1),
            "status": status,
            "models": models,
            "all_reached": reached and status is not None,
        }

    # -- phase 3: kernel report -----------------------------------------------------------
    def run_kernels(self, budget_end: float, gpu: bool) -> None:
        args = self.args
        models = (
            args.kernel_models.split(",")
            if args.kernel_models
            else (["lstm_tc"] if args.smoke or not gpu else ["squeezenet"])
        )
        cmd = [sys.executable, str(HERE / "kernel_report.py"), "--models", *models]
        cmd += ["--target", "cuda" if gpu else "llvm", "--out", str(self.out / "kernels")]
        cmd += ["--deadline-at", str(budget_end)]
        if args.smoke or not gpu:
            cmd += ["--reduced", "--repeat", "3"]
        cmd += args.kernel_args
        self.say(f"kernels: budget {budget_end - time.time():.0f} s")
        self.say("  " + shlex.join(cmd[1:]))
        started = time.time()
        status, lines = self._stream(cmd, self.out / "kernels.log", budget_end + self.args.grace_s)
        self.phases["kernels"] = {"seconds": round(time.time() - started, 1), "status": status}
        for line in lines:
            if line.startswith("NOT REACHED"):
                self.not_reached.append(f"kernels {line}")

    def _stream(self, cmd, log_path: Path, hard_end: float) -> tuple[int | None, list[str]]:
        """Run ``cmd``, its output to the console, kit.log and ``log_path``; killed (status
        None) past ``hard_end``."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        lines: list[str] = []
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=str(ROOT),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            os.set_blocking(proc.stdout.fileno(), False)
            buffer = b""
            while True:
                chunk = None
                try:
                    chunk = proc.stdout.read()
                except BlockingIOError:
                    pass
                if chunk:
                    log.write(chunk)
                    log.flush()
                    buffer += chunk
                    *complete, buffer = buffer.split(b"\n")
                    for raw in complete:
                        line = raw.decode("utf-8", "replace")
                        lines.append(line)
                        print(line, flush=True)
                        self.log.write(line + "\n")
                if proc.poll() is not None and not chunk:
                    break
                if time.time() > hard_end:
                    self.say("budget exhausted, stopping")
                    _kill_group(proc)
                    return None, lines
                if not chunk:
                    time.sleep(0.2)
        return proc.returncode, lines

    # -- summary --------------------------------------------------------------------------
    def summary(self, gpu_info: dict) -> dict:
        self.save_state()
        tests = _read_jsonl(self.out / "tests.jsonl")
        last = {}
        for r in tests:
            last[r["nodeid"]] = r
        for nodeid, r in list(last.items()):  # a file that imports again since
            if r["outcome"] == "collection_error" and any(
                n.startswith(nodeid + "::") and tests.index(o) > tests.index(r)
                for n, o in last.items()
            ):
                del last[nodeid]
        bench = [r for r in _read_jsonl(self.out / "bench.jsonl") if r.get("type") == "result"]
        doc = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "gpu_present": bool(gpu_info.get("exist")),
            "gpu": gpu_info,
            "dry_run": not gpu_info.get("exist"),
            "argv": sys.argv[1:],
            "deadline_s": self.args.deadline,
            "elapsed_s": round(self.elapsed(), 1),
            "phases": self.phases,
            "tests_total": _count(r["outcome"] for r in last.values()),
            "tests_failed": {
                n: r.get("reason", "")
                for n, r in last.items()
                if r["outcome"] in ("failed", "error", "collection_error")
            },
            "bench_records": len(bench),
            "bench_ok": sum(1 for r in bench if "median_ms" in r),
            "bench_failed": {
                f"{r['model']} b{r['batch']} {r['config']}": r["error"]
                for r in bench
                if "error" in r
            },
            "not_reached": self.not_reached,
        }
        (self.out / "summary.json").write_text(json.dumps(doc, indent=1))
        lines = [
            f"# GPU check {doc['date']}",
            "",
            (
                "GPU: " + str(gpu_info.get("device_name"))
                if doc["gpu_present"]
                else "GPU ABSENT (no CUDA device visible to TVM): dry run on llvm, --smoke models"
            ),
            f"elapsed {doc['elapsed_s']} s of {self.args.deadline:.0f}",
            f"tests (all calls): {doc['tests_total']}",
            f"benchmark records (all calls): {doc['bench_records']}, timed {doc['bench_ok']}",
        ]
        if doc["tests_failed"]:
            lines += [
                "",
                "## Failed tests",
                *[f"- {n}: {r}" for n, r in doc["tests_failed"].items()],
            ]
        if doc["bench_failed"]:
            lines += [
                "",
                "## Failed configurations",
                *[f"- {n}: {r}" for n, r in doc["bench_failed"].items()],
            ]
        lines += ["", "## Not reached in this call"]
        lines += [f"- {n}" for n in self.not_reached] or ["- nothing: every phase finished"]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")
        return doc


def _default_workers() -> int:
    """One per core, two left for the controller and the driver, at most 14."""
    return max(1, min(14, (os.cpu_count() or 2) - 2))


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


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
    p.add_argument(
        "--out", default=default_out, help="results folder (default $OUT, else gpu-results/)"
    )
    p.add_argument("--deadline", type=float, default=540, help="seconds from --since to stop by")
    p.add_argument(
        "--since", type=float, default=None, help="Unix time the call began (default now)"
    )
    p.add_argument("--smoke", action="store_true", help="tiny models")
    p.add_argument("--models", help="benchmark models, comma-separated")
    p.add_argument("--configs", help="benchmark configurations, comma-separated")
    p.add_argument("--kernel-models", help="kernel report models, comma-separated")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--skip-kernels", action="store_true")
    p.add_argument("--tests", nargs="+", help="test paths (default: files with gpu marks)")
    p.add_argument("--workers", type=int, help="pytest-xdist workers (default cores - 2, <= 14)")
    p.add_argument("--test-budget", type=float, help="seconds for the tests when bench runs too")
    p.add_argument("--test-timeout", type=float, help="cap on one test's seconds")
    p.add_argument(
        "--min-test-s",
        type=float,
        default=5,
        help="no test starts later than this before the budget end",
    )
    p.add_argument(
        "--config-timeout", type=float, default=240, help="seconds per benchmark configuration"
    )
    p.add_argument(
        "--compile-jobs",
        type=int,
        help="benchmark builds compiled side by side before the timings (default: as --workers)",
    )
    p.add_argument(
        "--kernel-share",
        type=float,
        default=0.0,
        help="fraction of the bench budget reserved for the kernel report (default: what is left)",
    )
    p.add_argument("--cache-dir", default=DEFAULT_CACHE)
    p.add_argument(
        "--state-dir",
        default=DEFAULT_STATE if os.environ.get("OUT") else None,
        help="records of earlier calls, kept on the machine's disk and copied into an empty "
        f"--out (default {DEFAULT_STATE} when $OUT is set, else none: --out itself persists)",
    )
    p.add_argument(
        "--retry-failed", action="store_true", help="rerun failed tests and configurations"
    )
    p.add_argument(
        "--grace-s", type=float, default=15, help="a phase is killed this long after its budget"
    )
    p.add_argument(
        "--no-gpu", dest="force_no_gpu", action="store_true", help="act as without a GPU"
    )
    p.add_argument("--pytest-args", default="", help="more pytest arguments, one string")
    p.add_argument("--bench-args", default="", help="more harness.py arguments, one string")
    p.add_argument("--kernel-args", default="", help="more kernel_report.py arguments")
    args = p.parse_args(argv)
    args.since = args.since or time.time()
    args.pytest_args = shlex.split(args.pytest_args)
    args.bench_args = shlex.split(args.bench_args)
    args.kernel_args = shlex.split(args.kernel_args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kit = Kit(args)
    end = kit.deadline - 5  # room for the summary
    kit.say(
        f"gpu_check: out {kit.out}, deadline {args.deadline:.0f} s, {kit.remaining():.0f} s left"
    )
    if kit.seeded:
        kit.say(f"resuming: {', '.join(kit.seeded)} copied from {kit.state}")
    gpu = kit.probe_gpu()
    if gpu.get("exist"):
        kit.say(
            f"GPU: {gpu.get('device_name')} (compute {gpu.get('compute_version')}, "
            f"{gpu.get('multi_processor_count')} SMs; nvidia-smi: {gpu.get('nvidia_smi')})"
        )
    else:
        kit.say(
            "GPU ABSENT: no CUDA device visible (tvm.cuda(0).exist is False); dry run: "
            "the gpu tests skip, the benchmark runs --smoke models on llvm"
            + (f" [{gpu['error']}]" if gpu.get("error") else "")
            + (
                f"; nvidia-smi sees {gpu['nvidia_smi']['name']}"
                if gpu.get("nvidia_smi", {}).get("name")
                else ""
            )
        )
    kit.summary(gpu)
    if not args.skip_tests:
        if args.skip_bench:
            test_end = end
        else:
            share = args.test_budget if args.test_budget else (end - time.time()) / 2
            test_end = min(end, time.time() + share)
        kit.run_tests(test_end)
        kit.summary(gpu)
    if not args.skip_bench:
        bench_end = end - args.kernel_share * max(0.0, end - time.time())
        if bench_end - time.time() > 20:
            kit.run_bench(bench_end, bool(gpu.get("exist")))
        else:
            kit.not_reached.append("bench (no time left)")
        kit.summary(gpu)
        if not args.skip_kernels:
            if end - time.time() > 30:
                kit.run_kernels(end, bool(gpu.get("exist")))
            else:
                kit.not_reached.append("kernel report (no time left)")
    doc = kit.summary(gpu)
    kit.say(f"summary -> {kit.out / 'summary.md'}")
    print((kit.out / "summary.md").read_text(), flush=True)
    if (kit.out / "bench.md").is_file() and not args.skip_bench:
        print((kit.out / "bench.md").read_text(), flush=True)
    if not doc["gpu_present"]:
        print("GPU ABSENT: this was a dry run on llvm.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
