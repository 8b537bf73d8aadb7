"""Models, targets and options on the command line."""

import onnx
import pytest
from onnx import TensorProto, helper

from tests.cli.helpers import in_process
from tvm_rtask.cli.build import (
    check_options,
    check_target,
    parse_key_values,
    parse_target,
    parse_value,
    split_pass_config,
)
from tvm_rtask.cli.errors import CLIError
from tvm_rtask.errors import OptionError


def test_parse_values_and_targets():
    assert [parse_value(v) for v in ("2", "-1", "true", "False", "x")] == [2, -1, True, False, "x"]
    assert parse_key_values(["a=1", " b = fine "], "--option") == {"a": 1, "b": "fine"}
    with pytest.raises(OptionError, match="name=value"):
        parse_key_values(["novalue"], "--option")
    assert parse_target(" llvm ") == "llvm"
    assert parse_target('{"kind": "llvm", "num-cores": 2}') == {"kind": "llvm", "num-cores": 2}
    with pytest.raises(CLIError, match="not valid JSON"):
        parse_target("{kind")


def test_check_target_is_one_line():
    assert check_target("llvm").kind.name == "llvm"
    assert check_target("cuda").kind.name == "cuda"
    for bad, fragment in (("foo", "--target 'foo'"), ("vulkan", "--target 'vulkan'")):
        with pytest.raises(CLIError, match=fragment) as info:
            check_target(bad)
        assert "\n" not in str(info.value)


def test_check_options_and_pass_config():
    assert check_options({"num_veu": 2, "policy": "sequential"}) == {
        "num_veu": 2,
        "policy": "sequential",
    }
    for bad in ({"num_veu": 0}, {"policy": "nope"}, {"nosuch": 1}, {"barrier": "x"}):
        with pytest.raises(OptionError):
            check_options(bad)
    assert split_pass_config({"rtask.num_veu": 2, "tirx.noalias": True}) == (
        {"num_veu": 2},
        {"tirx.noalias": True},
    )


def _dynamic_onnx(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_dynamic_shape_error_names_the_flag(tmp_path, capsys, quiet, monkeypatch):
    """The frontend suggests the Python ``shape_dict``; a command-line user needs the flag."""
    from tvm_rtask import tvmc
    from tvm_rtask.cli import main

    monkeypatch.chdir(tmp_path)
    model = _dynamic_onnx(tmp_path / "dyn.onnx")
    for run_main, argv in (
        (main, ["compile", model]),
        (main, ["plan", model]),
        (tvmc.main, ["compile", model, "--pass", "rtask"]),
    ):
        line = in_process(run_main, argv, capsys, "dynamic shape", "--input-shapes 'x:[?,4]'")
        assert "shape_dict" not in line
    # ... and the flag it names works.
    argv = ["plan", model, "--input-shapes", "x:[2,4]", "--policy", "sequential"]
    assert main([str(a) for a in argv]) == 0
    assert capsys.readouterr().out.startswith("dyn on llvm")
