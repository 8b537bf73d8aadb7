"""Options and targets on the command line."""

import pytest

from tvm_rtask.cli.build import parse_key_values, parse_target, parse_value
from tvm_rtask.cli.errors import CLIError


def test_parse_values_and_targets():
    assert [parse_value(v) for v in ("2", "-1", "true", "False", "x")] == [2, -1, True, False, "x"]
    assert parse_key_values(["a=1", " b = fine "], "--option") == {"a": 1, "b": "fine"}
    with pytest.raises(CLIError, match="name=value"):
        parse_key_values(["novalue"], "--option")
    assert parse_target(" llvm ") == "llvm"
    assert parse_target('{"kind": "llvm", "num-cores": 2}') == {"kind": "llvm", "num-cores": 2}
    with pytest.raises(CLIError, match="not valid JSON"):
        parse_target("{kind")
