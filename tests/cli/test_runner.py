"""Running artifacts."""

from tvm_rtask.cli.runner import RunResult


def test_run_result_stats():
    s = RunResult([], [1.0, 2.0, 3.0, 4.0], 1, None).stats()
    assert s["median_ms"] == 2.5 and s["min_ms"] == 1.0 and s["max_ms"] == 4.0
