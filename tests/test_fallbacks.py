"""tvm_rtask.fallbacks: noting and collecting fallbacks, and no swallowed error in the package.

The last tests read every module of ``tvm_rtask/`` with ``ast``: a handler that catches
everything (``except Exception``, ``except BaseException``, a bare ``except``) must re-raise,
log (``LOGGER.*``, ``logging.*``), note a fallback (``note_fallback``) or hand the error it
caught on (its ``as`` name used: printed, recorded, returned); a handler that only
``pass``es, ``continue``s or returns a default drops the error without a word.
"""

from __future__ import annotations

import ast
import logging
import threading
from pathlib import Path

import pytest

from tvm_rtask.fallbacks import (
    INT32_REFUSED,
    ONE_RTASK,
    RULE_SKIPPED,
    collecting_fallbacks,
    note_fallback,
)

PACKAGE = Path(__file__).resolve().parent.parent / "tvm_rtask"


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tvm_rtask"]


# -- noting and collecting -----------------------------------------------------------------------
def test_a_note_is_one_warning_line_on_the_tvm_rtask_logger(caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"):
        note_fallback(RULE_SKIPPED, "fused_conv2d", "Conv2dNCHW failed:\n  InternalError: x")
    (record,) = caplog.records
    assert record.name == "tvm_rtask" and record.levelno == logging.WARNING
    assert record.getMessage() == (
        "schedule rule skipped for fused_conv2d: Conv2dNCHW failed: InternalError: x"
    )


def test_a_collection_gets_the_notes_made_inside_it_and_keeps_them():
    note_fallback(ONE_RTASK, "before", "not collected")
    with collecting_fallbacks() as notes:
        note_fallback(ONE_RTASK, "fused_add", "blocks under no common loop")
        note_fallback(INT32_REFUSED, "fused_argmax", "an int64 buffer\nkept")
    note_fallback(ONE_RTASK, "after", "not collected")
    assert notes == [
        {"kind": ONE_RTASK, "subject": "fused_add", "reason": "blocks under no common loop"},
        {"kind": INT32_REFUSED, "subject": "fused_argmax", "reason": "an int64 buffer kept"},
    ]


def test_identical_notes_are_collected_and_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_rtask"), collecting_fallbacks() as notes:
        for _ in range(3):
            note_fallback(RULE_SKIPPED, "op", "R failed")
        note_fallback(RULE_SKIPPED, "op", "S failed")  # another reason: another note
    assert [n["reason"] for n in notes] == ["R failed", "S failed"]
    assert len(_messages(caplog)) == 2


def test_collections_nest_and_an_inner_ones_notes_reach_the_outer():
    with collecting_fallbacks() as outer:
        note_fallback(ONE_RTASK, "a", "outer only")
        with collecting_fallbacks() as inner:
            note_fallback(ONE_RTASK, "b", "both")
            note_fallback(ONE_RTASK, "a", "outer only")  # new to the inner one
        note_fallback(ONE_RTASK, "c", "outer only, after the inner block")
    assert [n["subject"] for n in inner] == ["b", "a"]
    assert [n["subject"] for n in outer] == ["a", "b", "c"]  # "a" once: deduplicated


def test_a_raising_block_ends_its_collection_and_the_error_passes(caplog):
    with pytest.raises(KeyError), collecting_fallbacks() as notes:
        note_fallback(ONE_RTASK, "a", "noted before the error")
        raise KeyError("boom")
    note_fallback(ONE_RTASK, "b", "after")
    assert [n["subject"] for n in notes] == ["a"]


def test_another_threads_notes_stay_in_its_own_collections():
    seen: dict[str, list[dict]] = {}
    ready, done = threading.Barrier(2), threading.Barrier(2)

    def compile_like(name: str) -> None:
        with collecting_fallbacks() as notes:
            ready.wait()  # both collections open at once
            note_fallback(ONE_RTASK, name, "in its own thread")
            done.wait()
        seen[name] = notes

    with collecting_fallbacks() as here:
        threads = [threading.Thread(target=compile_like, args=(n,)) for n in ("t1", "t2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [n["subject"] for n in seen["t1"]] == ["t1"]
    assert [n["subject"] for n in seen["t2"]] == ["t2"]
    assert here == []


# -- no swallowed errors -------------------------------------------------------------------------
_CATCH_ALL = {"Exception", "BaseException"}
_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def _catches_everything(kind: ast.expr | None) -> bool:
    """A bare ``except``, ``except Exception`` / ``BaseException`` (alone or in a tuple)."""
    if kind is None:
        return True
    if isinstance(kind, ast.Tuple):
        return any(_catches_everything(k) for k in kind.elts)
    name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", None)
    return name in _CATCH_ALL


def _is_logger(expr: ast.expr) -> bool:
    """``LOGGER`` / ``logger`` / ``_log`` / ``log``, ``logging`` itself, or
    ``logging.getLogger(...)``."""
    if isinstance(expr, ast.Call):
        return isinstance(expr.func, ast.Attribute) and expr.func.attr == "getLogger"
    name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")
    return name.lower().lstrip("_") in {"logger", "log", "logging"}


def _speaks(node: ast.AST, caught: str | None) -> bool:
    """Whether ``node`` re-raises, logs, notes a fallback, or uses the ``caught`` error."""
    if isinstance(node, ast.Raise):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "note_fallback":
            return True
        if isinstance(func, ast.Attribute) and func.attr in _LOG_METHODS:
            return _is_logger(func.value)
    return (
        caught is not None
        and isinstance(node, ast.Name)
        and node.id == caught
        and isinstance(node.ctx, ast.Load)
    )


def silent_handlers(source: str, filename: str = "<source>") -> list[str]:
    """``file:line`` of every handler in ``source`` that catches everything and drops the
    error without a word."""
    found = []
    for handler in ast.walk(ast.parse(source, filename)):
        if not isinstance(handler, ast.ExceptHandler) or not _catches_everything(handler.type):
            continue
        body = [node for stmt in handler.body for node in ast.walk(stmt)]
        if not any(_speaks(node, handler.name) for node in body):
            found.append(f"{filename}:{handler.lineno}")
    return found


SILENT = {
    "pass": "try:\n    f()\nexcept Exception:\n    pass\n",
    "bare": "try:\n    f()\nexcept:\n    x = None\n",
    "default": "def g():\n    try:\n        return f()\n    except Exception as err:\n"
    "        return []\n",
    "continue": "for a in b:\n    try:\n        f(a)\n    except (ValueError, Exception):\n"
    "        continue\n",
    "base": "try:\n    f()\nexcept BaseException:\n    cleanup()\n",
    "other logger": "try:\n    f()\nexcept Exception:\n    result.warning('x')\n",
}
SPOKEN = {
    "raise": "try:\n    f()\nexcept Exception:\n    cleanup()\n    raise\n",
    "translated": "try:\n    f()\nexcept Exception as err:\n    raise E(str(err)) from err\n",
    "logged": "try:\n    f()\nexcept Exception as e:\n    LOGGER.warning('f failed: %s', e)\n",
    "logging": "try:\n    f()\nexcept Exception:\n    logging.getLogger('x').info('f')\n",
    "noted": "try:\n    f()\nexcept Exception as e:\n    note_fallback(K, 'op', one_line(e))\n",
    "handed on": "try:\n    f()\nexcept Exception as err:\n    record['error'] = str(err)\n",
    "printed": "try:\n    f()\nexcept Exception as err:\n    print(err, file=sys.stderr)\n",
    "narrow": "try:\n    f()\nexcept (ValueError, KeyError):\n    pass\n",
}


@pytest.mark.parametrize("name", SILENT)
def test_the_scan_finds_a_silent_handler(name):
    assert silent_handlers(SILENT[name], name) != [], name


@pytest.mark.parametrize("name", SPOKEN)
def test_the_scan_accepts_a_handler_that_speaks(name):
    assert silent_handlers(SPOKEN[name], name) == [], name


def test_no_handler_in_the_package_swallows_an_error():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the package, not an empty directory
    silent = [
        where
        for path in files
        for where in silent_handlers(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not silent, "handlers that drop an error without a word: " + ", ".join(silent)
