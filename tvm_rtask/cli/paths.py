"""Output paths checked before any work: a command that will build for a minute must not
find out at the end that it cannot write its result."""

from __future__ import annotations

import os
import tempfile

from .errors import CLIError


def check_writable(path: str | os.PathLike, flag: str, suffixes: tuple[str, ...] = ()) -> str:
    """``path`` can be created or overwritten: its directory exists and takes a new file, it
    is not a directory itself and (when ``suffixes`` is given) it ends with one of them."""
    path = os.fspath(path)
    if suffixes and not path.lower().endswith(suffixes):
        raise CLIError(f"{flag} {path!r} must end with {' or '.join(suffixes)}")
    if os.path.isdir(path):
        raise CLIError(f"{flag} {path!r} is a directory")
    check_directory(os.path.dirname(os.path.abspath(path)), flag)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CLIError(f"{flag} {path!r} exists and cannot be overwritten")
    return path


def check_directory(directory: str | os.PathLike, flag: str, create: bool = False) -> str:
    """``directory`` exists (or, with ``create``, its nearest existing parent does) and a
    file can be created in it; tried for real, since permissions do not tell root."""
    directory = os.path.abspath(os.fspath(directory))
    probe = directory
    if create:
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
    if not os.path.exists(probe):
        raise CLIError(f"{flag}: directory {probe!r} does not exist")
    if not os.path.isdir(probe):
        raise CLIError(f"{flag}: {probe!r} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".tvm-rtask-probe-"):
            pass
    except OSError as err:
        raise CLIError(f"{flag}: cannot write to directory {probe!r} ({err.strerror})") from None
    return directory
