"""pytest plugin of the GPU kit (``gpu-check``): results as they happen, resume, budget.

Loaded with ``-p bench.gpu_pytest_plugin`` (the checkout's root on ``PYTHONPATH``); driven by
environment variables, so pytest-xdist workers see the same settings:

``RTASK_TESTS_JSONL``
    On the controller: one JSON line per finished test, appended as it is reported --
    ``{"nodeid", "outcome", "reason", "duration_s", "worker", "date"}``; ``outcome`` is
    passed, failed, error, skipped, xfailed, xpassed, not_reached, cut (stopped by a timeout
    the deadline set: run again on resume), interrupted or collection_error (``nodeid``: the
    file); ``reason`` pytest's crash line or the skip reason. Each failure's long report goes
    to ``<stem>-failures.log``, the tests running at any moment to ``<stem>-running.json``.
``RTASK_TESTS_SKIP``
    A file of node ids, one a line, already recorded by an earlier call: deselected.
``RTASK_TESTS_DEADLINE``
    A Unix time. A test that would start less than ``RTASK_TESTS_MIN_S`` (default 5) seconds
    before it is skipped as ``not_reached``; every other test gets a pytest-timeout limit that
    ends it before the deadline (or ``RTASK_TESTS_TIMEOUT`` seconds, if smaller).
"""

from __future__ import annotations

import datetime
import json
import os
import time

import pytest

from bench import append_jsonl

JSONL_ENV = "RTASK_TESTS_JSONL"
SKIP_ENV = "RTASK_TESTS_SKIP"
DEADLINE_ENV = "RTASK_TESTS_DEADLINE"
MIN_ENV = "RTASK_TESTS_MIN_S"
TIMEOUT_ENV = "RTASK_TESTS_TIMEOUT"
NOT_REACHED = "gpu-check: not reached before the phase deadline"
BUDGET_LIMIT = "gpu_check_budget_limit"  # user property: the deadline set the test's timeout
DONE_OUTCOMES = {"passed", "failed", "error", "skipped", "xfailed", "xpassed"}


def recorded_nodeids(path: str, retry_failed: bool = False) -> set[str]:
    """Node ids whose last record in ``path`` is a finished outcome."""
    last: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                    last[rec["nodeid"]] = rec["outcome"]
                except (ValueError, KeyError, TypeError):
                    continue
    except FileNotFoundError:
        return set()
    finished = DONE_OUTCOMES - ({"failed", "error"} if retry_failed else set())
    return {n for n, outcome in last.items() if outcome in finished}


def pytest_collection_modifyitems(config, items):
    path = os.environ.get(SKIP_ENV)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        done = {line.strip() for line in f if line.strip()}
    keep = [item for item in items if item.nodeid not in done]
    dropped = [item for item in items if item.nodeid in done]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _timeout_of(marker) -> float | None:
    if marker is None:
        return None
    value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    return float(value) if value is not None else None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Before pytest-timeout reads the item's limit: skip, or bound it by the deadline."""
    deadline = float(os.environ.get(DEADLINE_ENV, "inf"))
    remaining = deadline - time.time()
    if remaining < float(os.environ.get(MIN_ENV, "5")):
        item.add_marker(pytest.mark.skip(reason=NOT_REACHED))
    elif item.config.pluginmanager.hasplugin("timeout"):
        limit = remaining - 2
        cap = os.environ.get(TIMEOUT_ENV)
        by_deadline = not cap or limit < float(cap)
        if cap:
            limit = min(limit, float(cap))
        marker = item.get_closest_marker("timeout")
        current = _timeout_of(marker)
        if current is None or current <= 0 or current > limit:
            method = marker.kwargs.get("method") if marker is not None else None
            kwargs = {"method": method} if method else {}
            item.add_marker(pytest.mark.timeout(max(1.0, limit), **kwargs))
            if by_deadline:
                item.user_properties.append((BUDGET_LIMIT, round(limit, 1)))
    yield


def _short_reason(report) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = crash.message
    else:
        lines = [ln.strip() for ln in str(longrepr).splitlines() if ln.strip()]
        text = lines[-1] if lines else ""
    return " ".join(text.split())[:600]


class Recorder:
    """On the controller (or a run without xdist): one line per test as it finishes."""

    def __init__(self, path: str):
        self.path = path
        stem = path[:-6] if path.endswith(".jsonl") else path
        self.failures = f"{stem}-failures.log"
        self.running_path = f"{stem}-running.json"
        self.state: dict[str, dict] = {}
        self.running: dict[str, float] = {}

    def _write_running(self) -> None:
        tmp = f"{self.running_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.running, f)
        os.replace(tmp, self.running_path)

    def pytest_runtest_logstart(self, nodeid, location):
        self.running[nodeid] = time.time()
        self._write_running()

    def pytest_runtest_logreport(self, report):
        fresh = {"outcome": "passed", "reason": "", "duration_s": 0.0}
        state = self.state.setdefault(report.nodeid, fresh)
        state["duration_s"] += float(getattr(report, "duration", 0.0) or 0.0)
        worker = getattr(getattr(report, "node", None), "gateway", None)
        if worker is not None:
            state["worker"] = worker.id
        if report.failed:
            if state["outcome"] not in ("failed", "error", "cut"):
                state["outcome"] = "failed" if report.when == "call" else "error"
                if report.when == "???":  # xdist: the worker running it died
                    state["outcome"] = "failed"
                state["reason"] = _short_reason(report) or f"failed in {report.when}"
                budget = dict(getattr(report, "user_properties", ()) or ()).get(BUDGET_LIMIT)
                if budget is not None and "from pytest-timeout" in state["reason"]:
                    state["outcome"] = "cut"
                    state["reason"] = f"cut at the budget ({budget} s): {state['reason']}"
            self._log_failure(report)
        elif report.skipped and state["outcome"] == "passed":
            if hasattr(report, "wasxfail"):
                state["outcome"] = "xfailed"
                state["reason"] = str(report.wasxfail)
            else:
                reason = _short_reason(report)
                state["outcome"] = "not_reached" if NOT_REACHED in reason else "skipped"
                state["reason"] = reason
        elif report.passed and report.when == "call" and hasattr(report, "wasxfail"):
            state["outcome"] = "xpassed"
        if report.when in ("teardown", "???"):
            self._finish(report.nodeid)

    def _finish(self, nodeid: str) -> None:
        state = self.state.pop(nodeid)
        record = {"nodeid": nodeid, **state}
        record["duration_s"] = round(record["duration_s"], 2)
        record["date"] = datetime.datetime.now().isoformat(timespec="seconds")
        append_jsonl(self.path, record)
        self.running.pop(nodeid, None)
        self._write_running()

    def _log_failure(self, report) -> None:
        text = getattr(report, "longreprtext", "") or str(report.longrepr)
        with open(self.failures, "a", errors="replace") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{text[-6000:]}\n\n")

    def pytest_collectreport(self, report):
        """A test file that fails to import: its reason is recorded (not as done: the next
        call collects it again)."""
        if report.failed:
            rec = {"nodeid": report.nodeid, "outcome": "collection_error"}
            rec["reason"] = _short_reason(report) or "collection failed"
            rec["date"] = datetime.datetime.now().isoformat(timespec="seconds")
            append_jsonl(self.path, rec)
            self._log_failure(report)

    def pytest_sessionfinish(self, session):
        for nodeid in list(self.state):  # reported in part only (interrupted)
            self.state[nodeid]["outcome"] = "interrupted"
            self._finish(nodeid)


def pytest_configure(config):
    path = os.environ.get(JSONL_ENV)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(path), "gpu_check_recorder")
