"""``python -m bench policy-choice``: the table of the default against the better policy."""

from __future__ import annotations

from bench.policy_choice import WITHIN, markdown


def _record(model: str, seq: float, wave: float, default: float, chose: str) -> dict:
    builds = {"sequential": seq, "wavefront": wave, "default": default}
    record = {"model": model, "builds": {b: {"median_ms": ms} for b, ms in builds.items()}}
    record["builds"]["default"]["policy"] = chose
    record["default_over_better"] = round(default / min(seq, wave), 4)
    return record


def test_the_table_names_each_choice_and_every_model_over_the_bound():
    results = {
        "cpu": "test", "threads": 1, "target": "llvm", "size": "full", "seconds": 2.0,
        "command": "python -m bench policy-choice", "commit": "abc",
        "records": [
            _record("a", 10.0, 9.0, 9.1, "wavefront"),
            _record("b", 10.0, 12.0, 11.0, "wavefront"),  # 1.10x the better: over 1.03x
            {"model": "c", "error": "worker exited 1"},
        ],
    }  # fmt: skip
    table = markdown(results, "x.json")
    assert "1 thread and as many vEUs" in table
    assert "| a | 10.00 | 9.00 | 9.10 | wavefront | 1.011x |" in table
    assert "| b | 10.00 | 12.00 | 11.00 | wavefront | 1.100x |" in table
    assert "| c | error: worker exited 1 |" in table
    assert f"more than {WITHIN:.2f}x: b." in table
