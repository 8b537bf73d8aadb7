"""The command line compiles for this machine's CPU by default (``--target llvm-native``), the
artifact records the CPU and its instruction-set features, and ``run`` refuses, in one line
and before TVM loads it, an artifact whose instructions this machine's CPU lacks."""

import io
import json
import tarfile

import pytest

from tests.cli.helpers import in_process
from tvm_rtask.backend import as_target
from tvm_rtask.backend.cpu import host
from tvm_rtask.cli.artifact import cpu_problem, load_artifact
from tvm_rtask.cli.errors import CLIError

SSE2_ONLY = frozenset({"sse", "sse2"})


def _with_metadata(package, path, **changes):
    """A copy of ``package`` whose metadata.json has ``changes`` (None deletes a key)."""
    with tarfile.open(package) as src, tarfile.open(path, "w") as dst:
        meta = json.load(src.extractfile("metadata.json"))
        for key, value in changes.items():
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
        for member in src.getmembers():
            if member.name == "metadata.json":
                data = json.dumps(meta).encode()
                member.size = len(data)
                dst.addfile(member, io.BytesIO(data))
            else:
                dst.addfile(member, src.extractfile(member))
    return path


@pytest.fixture(scope="module")
def native_package(tmp_path_factory):
    """``tvm-rtask compile`` of the reduced LSTM with the default target."""
    from tvm_rtask.cli import main

    d = tmp_path_factory.mktemp("native")
    out = d / "native.tar"
    assert main(["compile", "lstm_tc", "--reduced", "--num-veu", "2", "-o", str(out)]) == 0
    return out


def test_the_default_target_is_the_host_cpu(native_package, capsys):
    from tvm_rtask.cli import main
    from tvm_rtask.cli.main import build_parser

    assert build_parser().parse_args(["compile", "m"]).target == "llvm-native"
    assert build_parser().parse_args(["plan", "m"]).target == "llvm-native"
    meta = load_artifact(native_package).meta
    native = as_target("llvm-native")
    assert meta["mcpu"] == host.host_cpu_name() == str(native.attrs["mcpu"])
    assert meta["cpu_features"] == host.target_isa_features(native)
    assert json.loads(meta["target_full"])["mcpu"] == meta["mcpu"]
    assert cpu_problem(meta) is None  # built here, runs here
    assert main(["run", str(native_package)]) == 0
    assert "ran " in capsys.readouterr().out


def test_an_artifact_for_a_cpu_with_more_instructions_is_refused(
    native_package, package, tmp_path, capsys, quiet, monkeypatch
):
    from tvm_rtask import tvmc
    from tvm_rtask.cli import main

    monkeypatch.setattr(host, "host_isa_features", lambda: SSE2_ONLY)
    if host.target_isa_features(as_target("llvm-native")):
        for prog in (main, tvmc.main):
            line = in_process(prog, ["run", native_package], capsys, "lacks", "avx")
            assert "llvm-native" in line
    old = _with_metadata(
        native_package,
        tmp_path / "old.tar",
        cpu_features=None,
        mcpu=None,
        target_full=json.dumps({"kind": "llvm", "mcpu": "skylake-avx512"}),
    )
    in_process(main, ["run", old], capsys, "avx512f")  # read from target_full
    other = _with_metadata(
        native_package, tmp_path / "spr.tar", mcpu="sapphirerapids", cpu_features=["avx512f"]
    )
    in_process(main, ["run", other], capsys, "sapphirerapids", "avx512f", "lacks")
    # plain llvm needs nothing beyond SSE2: it still runs
    assert main(["run", str(package)]) == 0


def test_unknown_and_unmapped_features():
    meta = {"target": "llvm", "mcpu": "x", "cpu_features": ["avx512f", "not-an-isa"]}
    assert host.missing_host_features(["not-an-isa"]) == []
    assert cpu_problem({**meta, "target": "cuda"}) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host, "host_isa_features", lambda: None)  # unknown host: nothing refused
        assert cpu_problem(meta) is None
        mp.setattr(host, "host_isa_features", lambda: SSE2_ONLY)
        assert "avx512f" in cpu_problem(meta) and "not-an-isa" not in cpu_problem(meta)


def test_damaged_cpu_features_and_unknown_mcpu_are_one_line(
    native_package, tmp_path, capsys, quiet
):
    from tvm_rtask.cli import main

    bad = _with_metadata(native_package, tmp_path / "bad.tar", cpu_features="avx2")
    with pytest.raises(CLIError, match="cpu_features"):
        load_artifact(bad)
    in_process(main, ["run", bad], capsys, "damaged artifact metadata", "cpu_features")
    target = '{"kind": "llvm", "mcpu": "nosuchcpu"}'
    in_process(
        main,
        ["compile", "no_such_model_is_loaded", "--target", target],
        capsys,
        "nosuchcpu",
        "llvm-native",
    )
    in_process(main, ["plan", "lstm_tc", "--target", target], capsys, "LLVM knows no CPU")


@pytest.mark.parametrize(
    ("target_full", "error"),
    [("not json", "JSONDecodeError"), ('{"kind": "nosuchkind"}', "ValueError"), (None, "")],
)
def test_an_unreadable_target_skips_the_cpu_check_with_a_warning(target_full, error, caplog):
    """An artifact written before cpu_features were recorded, whose target_full cannot be
    read: nothing to check, and the warning says so, naming the artifact."""
    meta = {"target": "llvm", "mcpu": "x"}
    if target_full is not None:
        meta["target_full"] = target_full
    with caplog.at_level("WARNING", logger="tvm_rtask"):
        assert cpu_problem(meta, "'old.so'") is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("CPU check skipped for 'old.so': its target_full cannot be read: ")
    assert error in message and "\n" not in message
