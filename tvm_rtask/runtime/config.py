"""tvm-rtask options as TVM ``PassContext`` config keys.

After :func:`register_config_options` the ``rtask.*`` keys below are accepted by TVM::

    from tvm_rtask.runtime.config import register_config_options

    register_config_options()
    with tvm.transform.PassContext(config={"rtask.policy": "sequential", "rtask.num_veu": 2}):
        ...  # inside a pass: ctx.config["rtask.policy"] == "sequential"

Without it TVM rejects them (``AttributeError: Invalid config option 'rtask.policy'``): TVM
checks every config key against a C++ registry that has no Python API.  The keys are
registered through the native library ``libtvm_rtask_pass_config.so``
(``src/pass_config.cc``), which calls TVM's
``tvm::transform::PassContext::RegisterConfigOption`` found at run time in
``libtvm_compiler.so``.

Types, as TVM itself registers ``std::string``-like / ``int64_t`` options (type strings
``"str"`` / ``"int"`` in ``PassContext.list_configs()``):

- ``"str"`` keys take a Python ``str``; ``ctx.config[key]`` is a ``tvm_ffi.core.String``
  (a ``str`` subclass, so ``== "sequential"`` holds).
- ``"int"`` keys take a Python ``int`` (a ``bool`` or numpy integer is converted to int);
  ``ctx.config[key]`` is a Python ``int``.
- Any other value type (a ``str`` for an int key, a ``float``, ``None``) makes the
  ``PassContext(...)`` constructor raise ``AttributeError``, as do unknown ``rtask.*`` keys.

The keys are those of every option, the core's and each registered backend's (their
declarations: ``tvm_rtask.options.config_types``); a backend registered later
(``register_backend``) has its keys registered then (:func:`refresh_config_options`).

Registration is process-wide and permanent (TVM has no unregister).  Importing this module
does nothing and imports nothing heavy (:data:`CONFIG_OPTIONS` is computed on first use, as
it imports the backends); :func:`register_config_options` imports TVM, is
idempotent and thread-safe, and never raises for a missing or incompatible TVM: it then logs
a warning and returns ``False``, and the ``rtask.*`` keys stay unusable in ``PassContext``
(use the Python API's arguments instead).  Call it before creating a ``PassContext`` that
uses the keys, and not while other threads create PassContexts (TVM's registry has no lock).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..options import config_types, on_backend_added

__all__ = ["CONFIG_OPTIONS", "refresh_config_options", "register_config_options"]

logger = logging.getLogger(__name__)

#: The config keys tvm-rtask registers, with their TVM value type string (one per option of
#: :class:`tvm_rtask.options.RTaskOptions` and of each registered backend), computed on first
#: use: ``CONFIG_OPTIONS`` is a module attribute (``__getattr__`` below).
CONFIG_OPTIONS: dict[str, str]


def _config_options() -> dict[str, str]:
    if "CONFIG_OPTIONS" not in globals():
        globals()["CONFIG_OPTIONS"] = config_types()
    return globals()["CONFIG_OPTIONS"]


def __getattr__(name: str):
    if name == "CONFIG_OPTIONS":
        return _config_options()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Result codes of tvm_rtask_register_config_options (src/pass_config.cc).
RC_OK = 0
RC_SYMBOL_NOT_FOUND = 1
RC_BAD_ARGUMENT = 2
RC_TVM_ERROR = 3

_LOCK = threading.Lock()
_RESULT: bool | None = None  # None: not tried yet


def _tvm_compiler_path() -> str | None:
    """Path of the loaded ``libtvm_compiler.so`` (TVM loads it ``RTLD_LOCAL``, so its symbols
    are not in the global scope), or None to let the library search the global scope."""
    try:
        import tvm.base

        lib = getattr(tvm.base, "_LOADED_LIBS", {}).get("tvm_compiler")
        name = getattr(lib, "_name", None)
        if name:
            return str(name)
    except (ImportError, AttributeError):  # a TVM without this private table (or tvm.base)
        pass
    try:  # fall back to the process's mappings (Linux)
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6 and Path(parts[-1]).name.startswith("libtvm_compiler."):
                return parts[-1]
    except OSError:
        pass
    return None


def _register(lib, keys: dict[str, str], compiler_path: str | None) -> tuple[int, str]:
    """Call the native registration; returns (result code, error message)."""
    import ctypes

    n = len(keys)
    c_keys = (ctypes.c_char_p * max(n, 1))(*[k.encode() for k in keys])
    c_types = (ctypes.c_char_p * max(n, 1))(*[t.encode() for t in keys.values()])
    path = compiler_path.encode() if compiler_path else None
    rc = int(lib.tvm_rtask_register_config_options(c_keys, c_types, n, path))
    msg = (lib.tvm_rtask_pass_config_last_error() or b"").decode(errors="replace")
    return rc, msg


def _try_register() -> bool:
    try:
        import tvm  # noqa: F401  (loads libtvm_ffi and libtvm_compiler)
        import tvm_ffi

        from .. import native

        lib = native.load_pass_config()
    except Exception as err:  # no TVM, library missing or not loadable
        logger.warning("tvm-rtask: cannot register the rtask.* PassContext config keys: %s", err)
        return False

    built_for = lib.tvm_rtask_pass_config_tvm_ffi_version().decode()
    running = getattr(tvm_ffi, "__version__", "unknown")
    if built_for != running:
        # The library hands tvm_ffi objects (String, Any, std::function) to TVM: only the
        # tvm_ffi it was compiled against is known to have the same layout.
        logger.warning(
            "tvm-rtask: not registering the rtask.* PassContext config keys: %s was built "
            "against tvm_ffi %s but tvm_ffi %s is running; reinstall tvm-rtask "
            "(`pip install -e .`) with the pinned apache-tvm-ffi",
            native.PASS_CONFIG_LIBRARY_NAME,
            built_for,
            running,
        )
        return False

    try:
        keys = _config_options()  # imports the backends, for their options
    except Exception as err:  # a backend that cannot be imported here
        logger.warning("tvm-rtask: cannot list the rtask.* PassContext config keys: %s", err)
        return False
    existing = {str(k): str(v["type"]) for k, v in tvm.transform.PassContext.list_configs().items()}
    clash = {k: existing[k] for k in keys if k in existing and existing[k] != keys[k]}
    if clash:
        logger.warning(
            "tvm-rtask: rtask.* PassContext config keys already registered with other types: %s",
            clash,
        )
        return False
    missing = {k: t for k, t in keys.items() if k not in existing}
    if not missing:
        return True

    rc, msg = _register(lib, missing, _tvm_compiler_path())
    if rc != RC_OK:
        reason = {
            RC_SYMBOL_NOT_FOUND: "TVM's PassContext::RegisterConfigOption was not found",
            RC_BAD_ARGUMENT: "bad arguments",
            RC_TVM_ERROR: "TVM refused a key",
        }.get(rc, f"error code {rc}")
        logger.warning(
            "tvm-rtask: cannot register the rtask.* PassContext config keys (%s): %s", reason, msg
        )
        return False
    return True


def register_config_options() -> bool:
    """Register the :data:`CONFIG_OPTIONS` keys with TVM's PassContext (once per process).

    Returns ``True`` when all keys are (now or already) accepted by
    ``tvm.transform.PassContext(config=...)``.  Returns ``False`` and logs a warning when
    registration is impossible: TVM or ``libtvm_rtask_pass_config.so`` missing, the library
    built against another tvm_ffi version than the running one, TVM's
    ``RegisterConfigOption`` symbol not found, or a key already registered with another
    type.  Never raises for those.  The result is cached: later calls return it at once.
    """
    global _RESULT
    if _RESULT is not None:
        return _RESULT
    with _LOCK:
        if _RESULT is None:
            _RESULT = _try_register()
    return _RESULT


def refresh_config_options() -> bool | None:
    """After a backend is registered: the keys computed again, and registered (the missing
    ones) if registration was tried already; its result, or None if it was not."""
    global _RESULT
    with _LOCK:
        globals().pop("CONFIG_OPTIONS", None)
        tried, _RESULT = _RESULT is not None, None
    return register_config_options() if tried else None


# a backend registered later (register_backend) has its keys registered then
on_backend_added(refresh_config_options)
