"""Running the command lines in tests: by subprocess (the installed console scripts) or in
process, and the one-line-error check both share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from tvm_rtask.testing.onnx_light import relative_error

BIN = Path(sys.executable).parent


def command(name: str) -> list[str]:
    """The installed console script, or ``python -m`` when the package was installed before
    the scripts were declared (pip install -e . adds them)."""
    script = shutil.which(name, path=str(BIN))
    if script:
        return [script]
    return [sys.executable, "-m", {"tvm-rtask": "tvm_rtask.cli", "tvmc": "tvm_rtask.tvmc"}[name]]


def run(name: str, *args, cwd, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*command(name), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TVM_RTASK_DEBUG": ""},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {args} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def assert_one_line_error(proc, prog: str, *fragments: str) -> str:
    """Exit status 1 (not a signal), one ``PROG: error:`` line, no traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def in_process(main, argv, capsys, *fragments) -> str:
    """The same checks as by subprocess, without paying for a new process each time."""
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def check_outputs(path: Path, expected) -> None:
    got = np.load(path)
    assert sorted(got.files) == [f"output_{i}" for i in range(len(expected))]
    for i, ref in enumerate(expected):
        assert got[f"output_{i}"].shape == ref.shape
        assert relative_error(got[f"output_{i}"], ref) < 1e-4
