"""TunedKernels: records found by the workload hashes of the database's workload file, and
the database itself opened only when an operator has one."""

from __future__ import annotations

import pytest

from tests.records.test_sets import _tiny_matmul, make_tiny_set
from tvm_rtask.records.database import FILES
from tvm_rtask.records.tuned import TunedKernels, workload_hashes


@pytest.fixture
def tiny(tmp_path):
    from tvm_rtask.tuning.tasks import extract_tasks, prepared

    made = make_tiny_set(tmp_path)
    (task,) = extract_tasks(prepared(made["model"]))
    return made["path"], task.func


def _other_func():
    """A matmul of other shapes: a workload the tiny set never saw."""
    from tvm_rtask.tuning.tasks import extract_tasks, prepared

    (task,) = extract_tasks(prepared(_tiny_matmul(rows=3, cols=16)))
    return task.func


def test_a_tuned_operator_is_found_through_the_workload_hashes(tiny):
    path, func = tiny
    tuned = TunedKernels(path)
    (schedule,) = tuned.schedules(func)
    assert schedule.us == pytest.approx(12.5)


def test_an_operator_without_records_leaves_the_database_closed(tiny):
    path, _ = tiny
    tuned = TunedKernels(path)
    assert tuned.schedules(_other_func()) == []
    assert tuned._database is None


def test_workload_lines_of_another_form_leave_the_lookup_to_the_database(
    tiny, tmp_path, monkeypatch
):
    other = tmp_path / "other"
    other.mkdir()
    (other / FILES[0]).write_bytes(b'["123", "a"]\n\n[12, "not MetaSchedule\'s form"]\n')
    assert workload_hashes(other) is None
    assert workload_hashes(tmp_path / "absent") == set()
    path, func = tiny
    assert workload_hashes(path)  # the tiny set's one workload
    monkeypatch.setattr("tvm_rtask.records.tuned.workload_hashes", lambda _dir: None)
    tuned = TunedKernels(path)
    assert tuned._hashes is None and len(tuned.schedules(func)) == 1
