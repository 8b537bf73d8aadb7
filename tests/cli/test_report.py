"""``tvm-rtask plan``: one column per policy."""

import json

from tests.cli.helpers import run
from tvm_rtask.cli.report import REPORT_ROWS, format_report_table


def test_format_report_table():
    reports = {
        "wavefront": {"operators": 5, "estimated_us": 12.345, "kernel_launches": 1},
        "sequential": {"operators": 5, "estimated_us": 40.0, "kernel_launches": 5},
    }
    lines = format_report_table("title", reports).splitlines()
    assert lines[0] == "title" and lines[1].split() == ["wavefront", "sequential"]
    assert len(lines) == 2 + len(REPORT_ROWS)
    rows = {ln[:22].strip(): ln[22:].split() for ln in lines[2:]}
    assert rows["estimated (us)"] == ["12.3", "40.0"]
    assert rows["kernel launches"] == ["1", "5"]
    assert rows["barriers"] == []  # missing keys stay empty


def test_tvm_rtask_plan_prints_a_table(work):
    d, _ = work
    proc = run(
        "tvm-rtask",
        "plan",
        "seq2seq",
        "--reduced",
        "--num-veu",
        "2",
        "--policy",
        "wavefront",
        "--policy",
        "sequential",
        "--json",
        "plans.json",
        cwd=d,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("seq2seq on llvm")
    header = lines[1].split()
    assert header == ["wavefront", "sequential"]
    rows = {ln[:22].strip(): ln[22:].split() for ln in lines[2:] if ln[:22].strip()}
    assert int(rows["kernel launches"][0]) < int(rows["kernel launches"][1])
    assert rows["operators"][0] == rows["operators"][1]
    plans = json.load(open(d / "plans.json"))
    assert set(plans) == {"wavefront", "sequential"}
