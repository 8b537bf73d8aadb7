"""Artifacts are checked before they are loaded: a missing, foreign, truncated or damaged
``.so`` or ``.tar`` is a one-line error with exit status 1, never a crash (``dlopen`` of a
truncated library used to kill ``run`` with SIGBUS, exit 135, nothing printed)."""

import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest

from tests.cli.helpers import assert_one_line_error, in_process, run
from tvm_rtask.cli.artifact import (
    META_FORMAT,
    check_metadata,
    check_output_path,
    elf_problem,
    load_artifact,
)
from tvm_rtask.cli.errors import CLIError


def _cut(src, dst, size: int):
    shutil.copyfile(src, dst)
    os.truncate(dst, size)
    return dst


def _package(path, lib, meta_text: str | None):
    """A ``.tar`` of ``lib`` as mod.so and ``meta_text`` as metadata.json."""
    with tarfile.open(path, "w") as tar:
        tar.add(lib, arcname="mod.so")
        if meta_text is not None:
            data = meta_text.encode()
            info = tarfile.TarInfo("metadata.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_whole_library_passes_and_every_cut_is_found(library, tmp_path):
    assert elf_problem(str(library)) is None
    size = os.path.getsize(library)
    for cut in (0, 3, 10, 40, 63, 64, 1000, size // 3, size // 2, size - 1):
        problem = elf_problem(str(_cut(library, tmp_path / "cut.so", cut)))
        expected = {0: "is empty", 3: "is not an ELF shared library"}.get(cut, "is truncated")
        assert problem is not None and problem.startswith(expected), (cut, problem)


def test_a_library_for_another_machine_is_refused(library, tmp_path):
    other = tmp_path / "arm.so"
    data = bytearray(library.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: AArch64
    other.write_bytes(bytes(data))
    with pytest.raises(CLIError, match="built for AArch64"):
        load_artifact(other)


def test_truncated_so_is_a_one_line_error(work, library, tmp_path):
    d, _ = work
    size = os.path.getsize(library)
    # The old run died of SIGBUS (exit 135, nothing printed) at the first two cuts.
    for cut in (size // 10, size // 4, size // 2, size - 100):
        lib = _cut(library, tmp_path / f"cut{cut}.so", cut)
        for prog in ("tvm-rtask", "tvmc"):
            proc = run(prog, "run", lib, cwd=d, check=False)
            assert_one_line_error(proc, prog, "cut", "truncated")


def test_truncated_tar_is_a_one_line_error(work, package, tmp_path):
    d, _ = work
    with tarfile.open(package) as tar:  # inside each header and each member's data
        cuts = [c for m in tar.getmembers() for c in (m.offset + 100, m.offset_data + m.size - 1)]
    for cut in cuts:
        tar = _cut(package, tmp_path / f"cut{cut}.tar", cut)
        for prog in ("tvm-rtask", "tvmc"):
            proc = run(prog, "run", tar, cwd=d, check=False)
            line = assert_one_line_error(proc, prog, f"cut{cut}.tar")
            assert "truncated" in line and "ReadError" not in line, line


def test_damaged_metadata_is_a_one_line_error(work, package, library, tmp_path, capsys, quiet):
    from tvm_rtask import tvmc
    from tvm_rtask.cli import main

    with tarfile.open(package) as tar:
        good = json.load(tar.extractfile("metadata.json"))
    cases = {
        "notjson": ("{not json", "not valid JSON"),
        "target": (json.dumps({**good, "target": "vulkan"}), "target 'vulkan'"),
        "newer": (json.dumps({**good, "version": 99}), "newer"),
        "inputs": (json.dumps({**good, "inputs": [{"name": "input"}]}), "static shape"),
        "threads": (json.dumps({**good, "threads": 0}), "threads"),
        "list": ("[1, 2]", "not a JSON object"),
    }
    for name, (text, fragment) in cases.items():
        path = _package(tmp_path / f"{name}.tar", library, text)
        in_process(main, ["run", path], capsys, fragment)
        in_process(tvmc.main, ["run", path], capsys, fragment)


def test_check_metadata_passes_sound_and_foreign_descriptions(package):
    with tarfile.open(package) as tar:
        good = json.load(tar.extractfile("metadata.json"))
    assert check_metadata(good, "x") is good
    assert check_metadata({"format": "something-else"}, "x") is None
    assert check_metadata(None, "x") is None
    with pytest.raises(CLIError, match="device"):
        check_metadata({**good, "format": META_FORMAT, "device": "cuda"}, "x")


def test_a_package_without_metadata_json_reads_the_embedded_one(package, library, tmp_path):
    art = load_artifact(_package(tmp_path / "bare.tar", library, None))
    assert art.meta["inputs"] == [{"name": "input", "shape": [3, 1, 8], "dtype": "float32"}]


def test_missing_and_foreign_files(work, package, capsys, quiet, monkeypatch):
    from tvm_rtask.cli import main

    d, _ = work
    monkeypatch.chdir(d)
    in_process(main, ["run", "nothing.so"], capsys, "does not exist")
    (d / "not_a_lib.so").write_text("hello")
    in_process(main, ["run", "not_a_lib.so"], capsys, "neither a shared library")
    (d / "empty.so").write_bytes(b"")
    in_process(main, ["run", "empty.so"], capsys, "is empty")
    (d / "text.tar").write_text("hello")
    in_process(main, ["run", "text.tar"], capsys, "truncated or damaged .tar")
    np.savez(d / "arr.npz", a=np.zeros(3))
    in_process(main, ["run", "arr.npz"], capsys, "neither a shared library")


def test_output_path_must_be_a_writable_so_or_tar(tmp_path):
    assert check_output_path(tmp_path / "m.so") == str(tmp_path / "m.so")
    assert check_output_path(tmp_path / "m.tar")
    for bad, fragment in (
        (tmp_path / "m.bin", "must end with .so or .tar"),
        (tmp_path / "missing" / "m.so", "does not exist"),
        ("/proc/m.so", "cannot write"),
        (tmp_path, "must end with"),
    ):
        with pytest.raises(CLIError, match=fragment):
            check_output_path(bad)
    (tmp_path / "d.so").mkdir()
    with pytest.raises(CLIError, match="is a directory"):
        check_output_path(tmp_path / "d.so")
