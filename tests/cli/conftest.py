"""Shared fixtures of the command-line tests: a reduced zoo model exported to ONNX (with
inputs and ONNX Runtime's outputs) and its ``tvmc compile --pass rtask`` package, built once
per test session (per pytest-xdist worker)."""

import numpy as np
import onnx
import pytest

from tests.cli.helpers import run
from tvm_rtask.testing.onnx_light import onnxruntime_outputs


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    """``(directory, expected outputs)``: ``lstm.onnx`` and ``x.npz`` in the directory."""
    d = tmp_path_factory.mktemp("cli")
    run(
        "tvm-rtask",
        "export-onnx",
        "lstm_tc",
        "--reduced",
        "-o",
        "lstm.onnx",
        "--inputs",
        "x.npz",
        cwd=d,
    )
    model = onnx.load(d / "lstm.onnx")
    inputs = dict(np.load(d / "x.npz"))
    return d, onnxruntime_outputs(model, inputs)


@pytest.fixture(scope="session")
def package(work):
    """``tvmc compile --pass rtask`` of the exported model: ``lstm.tar``."""
    d, _ = work
    run(
        "tvmc",
        "compile",
        "lstm.onnx",
        "--target",
        "llvm",
        "--pass",
        "rtask",
        "--pass-config",
        "rtask.num_veu=2",
        "--pass-config",
        "rtask.barrier=global",
        "-o",
        "lstm.tar",
        cwd=d,
    )
    return d / "lstm.tar"


@pytest.fixture(scope="session")
def library(package, tmp_path_factory):
    """The package's ``mod.so`` alone (its metadata is embedded too)."""
    import tarfile

    d = tmp_path_factory.mktemp("lib")
    with tarfile.open(package) as tar:
        tar.extract("mod.so", d)
    return d / "mod.so"


@pytest.fixture
def quiet(monkeypatch):
    """In-process runs print one-line errors, not tracebacks."""
    monkeypatch.delenv("TVM_RTASK_DEBUG", raising=False)
