"""``tvm-rtask trace``: a traced warm call, its breakdown, the timeline and both charts."""

from __future__ import annotations

import json

import pytest
import tvm

from tests.cli.helpers import in_process, run
from tvm_rtask.cli.main import main


def test_trace_writes_the_timeline_and_both_charts(tmp_path):
    proc = run(
        "tvm-rtask",
        "trace",
        "squeezenet",
        "--reduced",
        "--num-veu",
        "2",
        "--target",
        "llvm",
        "--json",
        "timeline.json",
        "--gantt",
        "measured.svg",
        "--simulated",
        "simulated.png",
        cwd=tmp_path,
    )
    first = proc.stdout.splitlines()[0]
    assert first.startswith("squeezenet: wavefront:") and "us measured" in first
    assert "rprogram_0" in proc.stdout and "cost model / measured" in proc.stdout
    doc = json.load(open(tmp_path / "timeline.json"))
    assert doc["format"] == "tvm-rtask timeline 1" and doc["records"]
    assert "time (us, measured" in (tmp_path / "measured.svg").read_text()
    assert (tmp_path / "simulated.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(tvm.cuda(0).exist, reason="a GPU is here: the CUDA trace would run")
def test_trace_without_the_gpu_says_so_in_one_line(tmp_path, capsys):
    argv = ["trace", "squeezenet", "--reduced", "--target", "cuda"]
    in_process(main, argv, capsys, "no cuda device here")


def test_trace_refuses_a_target_it_cannot_run_in_one_line(capsys):
    argv = ["trace", "squeezenet", "--reduced", "--target", "c"]
    in_process(main, argv, capsys, "llvm and cuda targets")
