"""Models, targets and options on the command line."""

import pytest

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
    with pytest.raises(CLIError, match="name=value"):
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
