"""The command lines end to end, by subprocess: ``tvmc compile --pass rtask`` / ``tvmc run`` and
``tvm-rtask compile/run/plan``; outputs must match ONNX Runtime (relative error < 1e-4);
errors are one line on stderr and a non-zero exit, never a traceback."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import pytest

from tvm_rtask.testing.onnx_light import onnxruntime_outputs, relative_error

BIN = Path(sys.executable).parent


def _command(name: str) -> list[str]:
    """The installed console script, or ``python -m`` when the package was installed before
    the scripts were declared (pip install -e . adds them)."""
    script = shutil.which(name, path=str(BIN))
    if script:
        return [script]
    return [sys.executable, "-m", {"tvm-rtask": "tvm_rtask.cli", "tvmc": "tvm_rtask.tvmc"}[name]]


def run(name: str, *args, cwd, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*_command(name), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TVM_RTASK_DEBUG": ""},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {args} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def _assert_one_line_error(proc, prog: str, *fragments: str) -> None:
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A reduced zoo model exported to ONNX with sample inputs and ONNX Runtime's outputs."""
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


def _check_outputs(path: Path, expected) -> None:
    got = np.load(path)
    assert sorted(got.files) == [f"output_{i}" for i in range(len(expected))]
    for i, ref in enumerate(expected):
        assert got[f"output_{i}"].shape == ref.shape
        assert relative_error(got[f"output_{i}"], ref) < 1e-4


def test_console_scripts_are_declared():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("tvm-rtask") == "tvm_rtask.cli:main"
    assert scripts.get("tvmc") == "tvm_rtask.tvmc:main"


@pytest.fixture(scope="module")
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


def test_tvmc_compile_pass_rtask_then_run_matches_onnxruntime(work, package):
    d, expected = work
    with tarfile.open(d / "lstm.tar") as tar:
        assert sorted(tar.getnames()) == ["metadata.json", "mod.so"]
        meta = json.load(tar.extractfile("metadata.json"))
    assert meta["pass"] == "rtask" and meta["threads"] == 2
    assert meta["options"] == {"num_veu": 2, "barrier": "global"}
    assert meta["inputs"] == [{"name": "input", "shape": [3, 1, 8], "dtype": "float32"}]
    proc = run(
        "tvmc",
        "run",
        "lstm.tar",
        "--inputs",
        "x.npz",
        "--outputs",
        "y.npz",
        "--print-time",
        "--repeat",
        "3",
        cwd=d,
    )
    assert "Execution time summary" in proc.stdout and "median (ms)" in proc.stdout
    _check_outputs(d / "y.npz", expected)
    # The package's library alone runs with tvm-rtask run too (metadata embedded).
    with tarfile.open(d / "lstm.tar") as tar:
        tar.extract("mod.so", d / "unpacked")
    run("tvm-rtask", "run", d / "unpacked" / "mod.so", "-i", "x.npz", "-o", "z.npz", cwd=d)
    _check_outputs(d / "z.npz", expected)


def test_tvmc_default_build_runs_too(work):
    d, expected = work
    run("tvmc", "compile", "lstm.onnx", "-o", "plain.tar", cwd=d)
    run("tvmc", "run", "plain.tar", "-i", "x.npz", "-o", "plain.npz", "--print-top", "3", cwd=d)
    _check_outputs(d / "plain.npz", expected)


def test_tvm_rtask_compile_run_with_report_gantt_and_sources(work):
    d, expected = work
    proc = run(
        "tvm-rtask",
        "compile",
        "lstm_tc",
        "--reduced",
        "--num-veu",
        "2",
        "--policy",
        "wavefront",
        "-o",
        "lstm.so",
        "--report",
        "report.json",
        "--gantt",
        "gantt.png",
        "--emit-source",
        "src",
        cwd=d,
    )
    assert "lstm.so" in proc.stdout
    report = json.load(open(d / "report.json"))
    assert report["report"]["policy"] == "wavefront"
    assert report["report"]["veus"] == 2
    assert report["report"]["kernel_launches"] < report["report"]["operators"]
    assert report["plan"]["steps"]
    assert (d / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    emitted = {p.name for p in (d / "src").iterdir()}
    assert {"input.relax.py", "vm.txt", "module0.ll", "module0.s"} <= emitted
    proc = run(
        "tvm-rtask",
        "run",
        "lstm.so",
        "--inputs",
        "x.npz",
        "--outputs",
        "out.npz",
        "--repeat",
        "3",
        cwd=d,
    )
    assert "2 thread(s)" in proc.stdout and "median" in proc.stdout
    _check_outputs(d / "out.npz", expected)


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


def test_models_lists_the_zoo(work):
    d, _ = work
    proc = run("tvm-rtask", "models", cwd=d)
    assert len(proc.stdout.splitlines()) == 10
    assert proc.stdout.startswith("alexnet")


def test_errors_are_one_line_without_traceback(work):
    d, _ = work
    _assert_one_line_error(
        run("tvm-rtask", "compile", "missing.onnx", cwd=d, check=False),
        "tvm-rtask",
        "missing.onnx",
        "does not exist",
    )
    _assert_one_line_error(
        run(
            "tvmc",
            "compile",
            "lstm.onnx",
            "--pass",
            "rtask",
            "--pass-config",
            "rtask.policy=nope",
            cwd=d,
            check=False,
        ),
        "tvmc",
        "unknown policy 'nope'",
    )


def _in_process(main, argv, capsys, *fragments):
    """The same checks as by subprocess, without paying for a new process each time."""
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_more_errors_in_process(work, package, capsys, monkeypatch):
    from tvm_rtask import cli, tvmc

    d, _ = work
    monkeypatch.chdir(d)
    monkeypatch.delenv("TVM_RTASK_DEBUG", raising=False)
    _in_process(cli.main, ["compile", "nosuchmodel"], capsys, "neither an .onnx file nor")
    (d / "garbage.onnx").write_bytes(b"\x00\xffnot onnx" * 10)
    _in_process(tvmc.main, ["compile", "garbage.onnx", "--pass", "rtask"], capsys, "garbage")
    _in_process(
        cli.main, ["compile", "lstm_tc", "--reduced", "--num-veu", "999"], capsys, "num_veu=999"
    )
    _in_process(cli.main, ["run", "nothing.so"], capsys, "does not exist")
    (d / "not_a_lib.so").write_text("hello")
    _in_process(cli.main, ["run", "not_a_lib.so"], capsys, "neither a shared library")
    np.savez(d / "bad.npz", input=np.zeros((2, 2), np.float32))
    _in_process(cli.main, ["run", package, "-i", "bad.npz"], capsys, "shape (2, 2)")
    np.savez(d / "wrong.npz", other=np.zeros((3, 1, 8), np.float32))
    _in_process(tvmc.main, ["run", package, "-i", "wrong.npz"], capsys, "'other'")
    _in_process(
        cli.main, ["plan", "lstm_tc", "--reduced", "--policy", "nope"], capsys, "unknown policy"
    )
    _in_process(
        cli.main, ["compile", "lstm_tc", "--input-shapes", "x:[1,2"], capsys, "--input-shapes"
    )
    _in_process(
        tvmc.main, ["compile", "lstm.onnx", "--pass-config", "novalue"], capsys, "name=value"
    )
