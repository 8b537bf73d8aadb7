"""Tests of the rtask.* PassContext config keys (tvm_rtask.runtime.config, src/pass_config.cc)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import tvm

from tvm_rtask.runtime import config, native

pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(scope="module")
def registered():
    assert config.register_config_options() is True
    return True


def _probe_pass(seen: dict):
    @tvm.transform.module_pass(opt_level=0, name="rtask_config_probe")
    def probe(mod, ctx):
        for key in config.CONFIG_OPTIONS:
            if key in ctx.config:
                seen[key] = ctx.config[key]
        return mod

    return probe


def test_keys_listed_with_tvm_types(registered):
    listed = tvm.transform.PassContext.list_configs()
    for key, type_str in config.CONFIG_OPTIONS.items():
        assert key in listed
        assert str(listed[key]["type"]) == type_str
    assert config.CONFIG_OPTIONS["rtask.policy"] == "str"
    assert config.CONFIG_OPTIONS["rtask.num_veu"] == "int"


def test_pass_context_accepts_and_pass_sees_values(registered):
    seen: dict = {}
    with tvm.transform.PassContext(config={"rtask.policy": "sequential", "rtask.num_veu": 2}):
        _probe_pass(seen)(tvm.IRModule())
    assert seen["rtask.policy"] == "sequential"
    assert isinstance(seen["rtask.policy"], str)
    assert int(seen["rtask.num_veu"]) == 2
    assert isinstance(seen["rtask.num_veu"], int)
    assert "rtask.barrier" not in seen


def test_all_keys_and_long_string(registered):
    values = {
        "rtask.policy": "wavefront-with-a-policy-name-longer-than-a-small-string",
        "rtask.barrier": "spin",
        "rtask.num_veu": 4,
        "rtask.rtasks_per_veu": 3,
        "rtask.fusion": "none",
        "rtask.spin_timeout_ms": 10_000,
    }
    seen: dict = {}
    with tvm.transform.PassContext(config=values) as ctx:
        _probe_pass(seen)(tvm.IRModule())
        assert ctx.config["rtask.barrier"] == "spin"
    assert seen == values


def test_unknown_key_still_rejected(registered):
    with pytest.raises(AttributeError, match="Invalid config option 'rtask.nope'"):
        tvm.transform.PassContext(config={"rtask.nope": 1})


@pytest.mark.parametrize(
    "bad",
    [{"rtask.num_veu": "two"}, {"rtask.num_veu": 2.5}, {"rtask.policy": 3}],
)
def test_wrong_value_type_rejected(registered, bad):
    (key,) = bad
    with pytest.raises(AttributeError, match=f"Expect config {key} to have type"):
        tvm.transform.PassContext(config=bad)


def test_bool_for_int_key_becomes_int(registered):
    # Same legalization as TVM's int64_t options (try_cast<int64_t> accepts a bool).
    with tvm.transform.PassContext(config={"rtask.num_veu": True}) as ctx:
        value = ctx.config["rtask.num_veu"]
    assert value == 1 and type(value) is int


def test_register_twice_is_fine(registered):
    assert config.register_config_options() is True
    assert config.register_config_options() is True
    # Even when the cached result is dropped: keys TVM already has are skipped.
    assert config._try_register() is True


def test_native_duplicate_key_reports_tvm_error(registered):
    lib = native.load_pass_config()
    rc, msg = config._register(lib, {"rtask.policy": "str"}, config._tvm_compiler_path())
    assert rc == config.RC_TVM_ERROR
    assert "rtask.policy" in msg


def test_native_bad_type_key_registers_nothing(registered):
    lib = native.load_pass_config()
    keys = {"rtask.test_only_a": "int", "rtask.test_only_b": "float"}
    rc, msg = config._register(lib, keys, config._tvm_compiler_path())
    assert rc == config.RC_BAD_ARGUMENT
    assert "float" in msg
    assert "rtask.test_only_a" not in tvm.transform.PassContext.list_configs()


def test_native_symbol_lookup():
    lib = native.load_pass_config()
    path = config._tvm_compiler_path()
    assert path is not None and "libtvm_compiler" in path
    assert lib.tvm_rtask_pass_config_available(path.encode()) == 1
    assert lib.tvm_rtask_pass_config_available(b"/nonexistent/libtvm_compiler.so") == 0
    assert "not loaded" in lib.tvm_rtask_pass_config_last_error().decode()
    import tvm_ffi

    assert lib.tvm_rtask_pass_config_tvm_ffi_version().decode() == tvm_ffi.__version__


def test_missing_symbol_returns_false_and_warns(monkeypatch, caplog):
    monkeypatch.setattr(config, "_RESULT", None)
    monkeypatch.setattr(config, "CONFIG_OPTIONS", {"rtask.test_only_missing": "int"})
    monkeypatch.setattr(config, "_tvm_compiler_path", lambda: "/nonexistent/libtvm_compiler.so")
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        assert config.register_config_options() is False
        assert config.register_config_options() is False  # cached
    assert "RegisterConfigOption was not found" in caplog.text
    assert "rtask.test_only_missing" not in tvm.transform.PassContext.list_configs()


def test_missing_library_returns_false_and_warns(monkeypatch, caplog):
    def no_library():
        raise RuntimeError("libtvm_rtask_pass_config.so was not found")

    monkeypatch.setattr(config, "_RESULT", None)
    monkeypatch.setattr(native, "load_pass_config", no_library)
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        assert config.register_config_options() is False
    assert "was not found" in caplog.text


def test_version_mismatch_returns_false(monkeypatch, caplog):
    import tvm_ffi

    monkeypatch.setattr(config, "_RESULT", None)
    monkeypatch.setattr(tvm_ffi, "__version__", "0.0.0-other")
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        assert config.register_config_options() is False
    assert "0.0.0-other" in caplog.text


def test_fresh_process_rejects_before_and_accepts_after():
    code = textwrap.dedent(
        """
        import tvm
        try:
            tvm.transform.PassContext(config={"rtask.policy": "sequential"})
        except AttributeError as err:
            assert "Invalid config option 'rtask.policy'" in str(err), err
        else:
            raise SystemExit("accepted before registration")
        import tvm_rtask  # registers the keys because tvm is already loaded
        from tvm_rtask.runtime import config
        assert config.register_config_options() is True
        with tvm.transform.PassContext(config={"rtask.policy": "sequential"}) as ctx:
            assert ctx.config["rtask.policy"] == "sequential"
        print("OK")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("OK")
