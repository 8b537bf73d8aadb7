"""Artifacts: a missing or foreign file is a one-line error with exit status 1."""

from tests.cli.helpers import in_process


def test_missing_and_foreign_files(work, package, capsys, quiet, monkeypatch):
    from tvm_rtask.cli import main

    d, _ = work
    monkeypatch.chdir(d)
    in_process(main, ["run", "nothing.so"], capsys, "does not exist")
    (d / "not_a_lib.so").write_text("hello")
    in_process(main, ["run", "not_a_lib.so"], capsys, "neither a shared library")
