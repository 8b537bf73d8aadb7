"""Where measurements are cached: one directory for the rKernel profiles and the
synchronisation benchmark (``$TVM_RTASK_CACHE``, else ``~/.cache/tvm_rtask/profiles``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TVM_RTASK_CACHE"


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tvm_rtask" / "profiles"
