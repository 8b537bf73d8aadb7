"""``python -m bench gpu-timelines`` without a GPU: the window's third command traces a tiny
model on llvm through the same code, and names where the time went."""

from __future__ import annotations

import json

import pytest

from bench import gpu_timelines


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("timelines")
    code = gpu_timelines.main(
        ["--out", str(out), "--no-gpu", "--models", "zoo:lstm_tc:smoke", "--deadline", "300"]
    )
    return code, out


def test_the_dry_run_writes_a_timeline_and_both_charts(dry_run):
    code, out = dry_run
    assert code == 0, (out / "zoo_lstm_tc_smoke.log").read_text()[-2000:]
    doc = json.loads((out / "zoo_lstm_tc_smoke.timeline.json").read_text())
    assert doc["format"] == "tvm-rtask timeline 1" and doc["records"]
    for chart in ("gantt", "simulated"):
        assert (out / f"zoo_lstm_tc_smoke.{chart}.png").read_bytes()[:4] == b"\x89PNG"


def test_the_record_names_the_largest_losses_and_busiest_operators(dry_run):
    _, out = dry_run
    (record,) = [json.loads(x) for x in (out / "timelines.jsonl").read_text().splitlines()]
    assert record["gpu"] is False and record["model"] == "zoo:lstm_tc:smoke"
    share = record["share"]
    assert sum(share.values()) == pytest.approx(1.0, abs=0.05)
    losses = [k for k, _ in record["largest_losses"]]
    assert len(losses) == 3 and "rtasks" not in losses
    assert sorted(losses, key=lambda k: -share[k]) == losses
    assert record["busiest_operators_us"][0][1] > 0
    assert "zoo:lstm_tc:smoke" in (out / "timelines.md").read_text()
