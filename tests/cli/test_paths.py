"""Output paths are checked before any work."""

import pytest

from tvm_rtask.cli.errors import CLIError
from tvm_rtask.cli.paths import check_directory, check_writable


def test_check_writable(tmp_path):
    assert check_writable(tmp_path / "r.json", "--report") == str(tmp_path / "r.json")
    assert check_writable(tmp_path / "a.SO", "-o", (".so", ".tar"))
    with pytest.raises(CLIError, match=r"--report: directory .* does not exist"):
        check_writable(tmp_path / "no" / "r.json", "--report")
    with pytest.raises(CLIError, match="-o 'x.bin' must end with .so or .tar"):
        check_writable("x.bin", "-o", (".so", ".tar"))
    with pytest.raises(CLIError, match="cannot write to directory '/proc'"):
        check_writable("/proc/r.json", "--report")
    (tmp_path / "file").write_text("")
    with pytest.raises(CLIError, match="is not a directory"):
        check_writable(tmp_path / "file" / "r.json", "--report")
    with pytest.raises(CLIError, match="is a directory"):
        check_writable(tmp_path, "--report")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # the probe leaves nothing


def test_check_directory_to_be_created(tmp_path):
    assert check_directory(tmp_path / "a" / "b", "--out-dir", create=True)
    assert not (tmp_path / "a").exists()  # checked, not created
    with pytest.raises(CLIError, match="does not exist"):
        check_directory(tmp_path / "a", "--db")
    with pytest.raises(CLIError, match="cannot write"):
        check_directory("/proc/new/dir", "--out-dir", create=True)
