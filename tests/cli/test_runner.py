"""Running artifacts: the device is the one the artifact was compiled for."""

import pytest

from tests.cli.helpers import assert_one_line_error, in_process, run
from tvm_rtask.cli.errors import CLIError
from tvm_rtask.cli.runner import RunResult, choose_device

LLVM = {"target": "llvm", "device": "cpu"}
CUDA = {"target": "cuda", "device": "cuda"}


def test_choose_device_follows_the_artifact():
    assert choose_device("a.so", LLVM, None) == "cpu"
    assert choose_device("a.so", LLVM, "cpu") == "cpu"
    assert choose_device("a.so", CUDA, None) == "cuda"
    assert choose_device("a.so", CUDA, "gpu") == "cuda"
    assert choose_device("a.so", None, None) == "cpu"  # a library without metadata
    assert choose_device("a.so", None, "gpu") == "cuda"
    for meta, device in ((LLVM, "cuda"), (LLVM, "gpu"), (CUDA, "cpu")):
        with pytest.raises(CLIError, match=f"compiled for target {meta['target']}"):
            choose_device("a.so", meta, device)
    with pytest.raises(CLIError, match="unknown device"):
        choose_device("a.so", LLVM, "tpu")


def test_tvmc_run_refuses_a_device_the_package_was_not_compiled_for(work, package, capsys, quiet):
    from tvm_rtask import tvmc

    d, _ = work
    for device in ("cuda", "gpu"):
        line = in_process(tvmc.main, ["run", package, "--device", device], capsys, "llvm")
        assert "runs on CUDA" not in line
    proc = run("tvmc", "run", package, "--device", "cuda", cwd=d, check=False)
    assert_one_line_error(proc, "tvmc", "compiled for target llvm", "--device cuda")


def test_run_result_stats():
    s = RunResult([], [1.0, 2.0, 3.0, 4.0], 1, None).stats()
    assert s["median_ms"] == 2.5 and s["min_ms"] == 1.0 and s["max_ms"] == 4.0
