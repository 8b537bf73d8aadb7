"""One tvm-rtask CUDA compile (sm_90, defaults) of a window model, its process CPU seconds,
the register cache's hits and nvcc's misses: run it with ``$TVM_RTASK_CUDA_CACHE`` pointing
at a cache with and without ``registers/`` to see what the register cache saves
(``bench/results/2026-11-28-cuda-register-cache.md``).

    TVM_RTASK_CUDA_CACHE=DIR python bench/cuda_register_cache_ab.py light:squeezenet
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main(spec: str) -> int:
    from gpu_window import load_model

    import tvm_rtask
    import tvm_rtask.api  # noqa: F401 - imported before the clock starts
    from tvm_rtask.backend.cuda import compile_cache

    compile_cache.install_compile_callback()
    model, _ = load_model(spec)
    mod = tvm_rtask.frontend.load(model)
    started = time.process_time()
    tvm_rtask.compile(mod, {"kind": "cuda", "arch": "sm_90"})
    stats = compile_cache.stats()
    print(f"{time.process_time() - started:.2f} {stats['register_hits']} {stats['misses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
