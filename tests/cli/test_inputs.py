"""Inputs on the command line: ``--input-shapes``, ``.npz`` files, the arguments of main."""

import numpy as np
import pytest

from tests.cli.helpers import in_process
from tvm_rtask.cli.errors import CLIError
from tvm_rtask.cli.inputs import arrange_inputs, parse_shapes, read_inputs, save_outputs

INFOS = [
    {"name": "x", "shape": [2, 3], "dtype": "float32"},
    {"name": "ids", "shape": [4], "dtype": "int64"},
]


def test_parse_shapes():
    assert parse_shapes(None) is None
    assert parse_shapes("data:[1,3,224,224] mask:[1, 8]") == {
        "data": [1, 3, 224, 224],
        "mask": [1, 8],
    }
    assert parse_shapes("scalar:[]") == {"scalar": []}
    for bad in ("x:[1,2", "x:[a]", "x", "x:[1] junk"):
        with pytest.raises(CLIError, match="--input-shapes"):
            parse_shapes(bad)


def test_arrange_inputs_by_name_position_and_fill():
    x = np.ones((2, 3), np.float64)
    args = arrange_inputs(INFOS, {"x": x}, "zeros")
    assert [a.dtype for a in args] == [np.float32, np.int64]
    assert args[0].sum() == 6 and not args[1].any()
    by_position = arrange_inputs(INFOS, {"arr_1": np.arange(4)}, "ones")
    assert by_position[0].sum() == 6 and by_position[1].tolist() == [0, 1, 2, 3]
    rand = arrange_inputs(INFOS, {}, "random")
    assert (np.abs(rand[0]) <= 1).all() and ((rand[1] >= 0) & (rand[1] < 128)).all()
    with pytest.raises(CLIError, match="shape"):
        arrange_inputs(INFOS, {"x": np.ones((3, 2))}, "zeros")
    with pytest.raises(CLIError, match="'y'"):
        arrange_inputs(INFOS, {"y": x}, "zeros")
    with pytest.raises(CLIError, match="no tvm-rtask metadata"):
        arrange_inputs(None, {}, "zeros")
    assert [a.shape for a in arrange_inputs(None, {"arr_10": x, "arr_2": x}, "zeros")] == [
        (2, 3),
        (2, 3),
    ]


def test_read_inputs_and_save_outputs(tmp_path):
    assert read_inputs(None) == {}
    with pytest.raises(CLIError, match="does not exist"):
        read_inputs(str(tmp_path / "none.npz"))
    (tmp_path / "bad.npz").write_text("not an npz")
    with pytest.raises(CLIError, match="cannot read"):
        read_inputs(str(tmp_path / "bad.npz"))
    save_outputs(str(tmp_path / "y.npz"), [np.zeros(2), np.ones(3)])
    got = read_inputs(str(tmp_path / "y.npz"))
    assert sorted(got) == ["output_0", "output_1"] and got["output_1"].sum() == 3


def test_input_errors_in_process(work, package, capsys, quiet, monkeypatch):
    from tvm_rtask import tvmc
    from tvm_rtask.cli import main

    d, _ = work
    monkeypatch.chdir(d)
    np.savez(d / "bad.npz", input=np.zeros((2, 2), np.float32))
    in_process(main, ["run", package, "-i", "bad.npz"], capsys, "shape (2, 2)")
    np.savez(d / "wrong.npz", other=np.zeros((3, 1, 8), np.float32))
    in_process(tvmc.main, ["run", package, "-i", "wrong.npz"], capsys, "'other'")
    in_process(main, ["compile", "lstm_tc", "--input-shapes", "x:[1,2"], capsys, "--input-shapes")
