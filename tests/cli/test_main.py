"""The ``tvm-rtask`` command line end to end (by subprocess) and its commands in process:
errors are one line on stderr and exit status 1, never a traceback; everything a user gives
is checked before the model is imported or built."""

import importlib
import json
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from tests.cli.helpers import assert_one_line_error, check_outputs, in_process, run

main_module = importlib.import_module("tvm_rtask.cli.main")
REPO = Path(__file__).resolve().parents[2]


def test_console_scripts_are_declared():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("tvm-rtask") == "tvm_rtask.cli:main"
    assert scripts.get("tvmc") == "tvm_rtask.tvmc:main"


def test_python_dash_m_runs_the_command_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tvm_rtask.cli", "models"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("alexnet")


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
    check_outputs(d / "out.npz", expected)


def test_models_lists_the_zoo(work):
    d, _ = work
    proc = run("tvm-rtask", "models", cwd=d)
    lines = proc.stdout.splitlines()
    assert len(lines) == 11 + 15  # the zoo, then torchvision's 15
    assert proc.stdout.startswith("alexnet")
    assert lines[11].startswith("resnet18") and "torchvision" in lines[11]


def test_errors_are_one_line_without_traceback(work):
    d, _ = work
    assert_one_line_error(
        run("tvm-rtask", "compile", "missing.onnx", cwd=d, check=False),
        "tvm-rtask",
        "missing.onnx",
        "does not exist",
    )
    assert_one_line_error(
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


def test_more_errors_in_process(work, capsys, quiet, monkeypatch):
    from tvm_rtask import tvmc
    from tvm_rtask.cli import main

    d, _ = work
    monkeypatch.chdir(d)
    in_process(main, ["compile", "nosuchmodel"], capsys, "neither an .onnx file nor")
    (d / "garbage.onnx").write_bytes(b"\x00\xffnot onnx" * 10)
    in_process(tvmc.main, ["compile", "garbage.onnx", "--pass", "rtask"], capsys, "garbage")
    in_process(main, ["compile", "lstm_tc", "--reduced", "--num-veu", "999"], capsys, "num_veu=999")
    in_process(main, ["plan", "lstm_tc", "--reduced", "--policy", "nope"], capsys, "unknown policy")
    argv = ["compile", "lstm.onnx", "--pass-config", "novalue"]
    in_process(tvmc.main, argv, capsys, "name=value")


# Each of these used to be found only after the model was imported and built (up to 41 s).
EARLY = [
    ("tvm-rtask", ["compile", "lstm_tc", "--num-veu", "0"], "num_veu must be a positive"),
    ("tvm-rtask", ["compile", "lstm_tc", "--target", "foo"], "--target 'foo'"),
    ("tvm-rtask", ["compile", "lstm_tc", "--target", "vulkan"], "vulkan"),
    ("tvm-rtask", ["compile", "lstm_tc", "--option", "nosuch=1"], "unknown option"),
    ("tvm-rtask", ["compile", "lstm_tc", "-o", "x.bin"], "must end with .so or .tar"),
    ("tvm-rtask", ["compile", "lstm_tc", "-o", "nodir/x.so"], "does not exist"),
    ("tvm-rtask", ["compile", "lstm_tc", "-o", "/proc/x.so"], "cannot write"),
    ("tvm-rtask", ["compile", "lstm_tc", "--report", "nodir/r.json"], "--report"),
    ("tvm-rtask", ["compile", "lstm_tc", "--gantt", "/proc/g.png"], "--gantt"),
    ("tvm-rtask", ["compile", "lstm_tc", "--emit-source", "/proc/src"], "--emit-source"),
    ("tvm-rtask", ["plan", "lstm_tc", "--num-veu", "0"], "num_veu"),
    ("tvm-rtask", ["plan", "lstm_tc", "--target", "foo"], "foo"),
    ("tvm-rtask", ["plan", "lstm_tc", "--json", "nodir/p.json"], "--json"),
    ("tvm-rtask", ["tune", "lstm_tc", "--db", "/proc/db"], "--db"),
    ("tvm-rtask", ["tune", "lstm_tc", "--db", "db", "--target", "foo"], "foo"),
    ("tvmc", ["compile", "lstm.onnx", "-o", "x.bin"], "must end with .so or .tar"),
    ("tvmc", ["compile", "lstm.onnx", "-o", "/proc/x.tar"], "cannot write"),
    ("tvmc", ["compile", "lstm.onnx", "--target", "foo"], "foo"),
    ("tvmc", ["compile", "m.onnx", "--pass", "rtask", "--pass-config", "rtask.num_veu=0"], "veu"),
    ("tvmc", ["compile", "lstm.onnx", "--pass-config", "no.such.key=1"], "--pass-config"),
    ("tvmc", ["compile", "lstm.onnx", "--dump-code", "ll,bogus"], "bogus"),
]


@pytest.mark.parametrize(
    "prog,argv,fragment", EARLY, ids=[f"{p} {a[0]} {' '.join(a[2:])}" for p, a, _ in EARLY]
)
def test_options_and_paths_are_checked_before_the_model_is_loaded(
    prog, argv, fragment, tmp_path, capsys, quiet, monkeypatch
):
    from tvm_rtask import tvmc
    from tvm_rtask.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(main_module, "load_model", no_loading)
    monkeypatch.setattr(tvmc, "load_model", no_loading)
    monkeypatch.chdir(tmp_path)
    in_process(main if prog == "tvm-rtask" else tvmc.main, argv, capsys, fragment)


def test_compile_prints_wall_time(tmp_path, capsys, monkeypatch):
    """ "compiled ... in X s": X covers import, build and export, as a clock on the wall."""

    def slow(result):
        def step(*args, **kwargs):
            time.sleep(0.4)
            return result

        return step

    model = main_module.LoadedModel("m", None, [])
    meta = {"target": "llvm", "pass": "rtask", "compile_seconds": 0.0}
    monkeypatch.setattr(main_module, "load_model", slow(model))
    monkeypatch.setattr(main_module, "compile_model", slow((None, meta)))
    monkeypatch.setattr(main_module, "save_artifact", slow(None))
    monkeypatch.chdir(tmp_path)
    assert main_module.main(["compile", "lstm_tc", "-o", "m.so"]) == 0
    out = capsys.readouterr().out
    seconds = float(re.search(r" in ([\d.]+) s ->", out).group(1))
    assert seconds >= 1.2, out


def _fake_harness(tmp_path, monkeypatch) -> Path:
    record = tmp_path / "argv.json"
    harness = tmp_path / "harness.py"
    harness.write_text(
        "import json\n"
        "def main(argv):\n"
        f"    open({str(record)!r}, 'w').write(json.dumps(argv))\n"
        "    return 0\n"
    )
    monkeypatch.setattr(main_module, "find_harness", lambda: harness)
    return record


def test_bench_writes_where_the_user_says_not_into_the_source_tree(tmp_path, monkeypatch):
    record = _fake_harness(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main_module.main(["bench", "--smoke", "--models", "lstm_tc"]) == 0
    argv = json.loads(record.read_text())
    assert argv[:3] == ["--smoke", "--models", "lstm_tc"]
    out_dir = Path(argv[argv.index("--out-dir") + 1])
    assert out_dir == work / "tvm-rtask-bench"
    assert REPO not in out_dir.parents
    assert main_module.main(["bench", "--out-dir", "mine", "--smoke"]) == 0
    argv = json.loads(record.read_text())
    assert argv == ["--smoke", "--out-dir", str(work / "mine")]
    assert main_module.main(["bench", "--help"]) == 0  # the harness's help, untouched
    assert json.loads(record.read_text()) == ["--help"]


def test_bench_out_dir_is_checked(tmp_path, capsys, quiet, monkeypatch):
    _fake_harness(tmp_path, monkeypatch)
    in_process(main_module.main, ["bench", "--out-dir", "/proc/results"], capsys, "--out-dir")


def test_unknown_arguments_are_an_error_except_for_bench(capsys):
    with pytest.raises(SystemExit) as info:
        main_module.main(["models", "--bogus"])
    assert info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_find_harness_finds_the_checkout():
    assert main_module.find_harness() == REPO / "bench" / "harness.py"


def test_torchvision_names_are_models_too():
    """The public set (tvm_rtask.models.real) by name, as the zoo: loaded with seeded weights
    (reduced or full size), batch 1 only."""
    from tvm_rtask.cli.build import load_model
    from tvm_rtask.cli.errors import CLIError

    loaded = load_model("resnet18", reduced=True)
    assert loaded.source == {"torchvision": "resnet18", "reduced": True, "seed": 0}
    assert [list(i.shape) for i in loaded.inputs] == [[1, 3, 32, 32]]
    with pytest.raises(CLIError, match="batch 1 only"):
        load_model("resnet18", batch=2)
