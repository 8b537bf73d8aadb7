"""One tvm-rtask CUDA compile (sm_90, defaults) of a window model, its process CPU seconds,
the register cache's hits and nvcc's misses: run it with ``$TVM_RTASK_CUDA_CACHE`` pointing
at a cache with and without ``registers/`` to see what the register cache saves.

    TVM_RTASK_CUDA_CACHE=DIR python bench/cuda_register_cache_ab.py light:squeezenet
"""

import sys
import time

sys.path.insert(0, "bench")
sys.path.insert(0, ".")
from gpu_window import load_model

import tvm_rtask
import tvm_rtask.api
from tvm_rtask.backend.cuda import compile_cache

compile_cache.install_compile_callback()
m, _ = load_model(sys.argv[1])
mod = tvm_rtask.frontend.load(m)
c = time.process_time()
tvm_rtask.compile(mod, {"kind": "cuda", "arch": "sm_90"})
print(
    "%.2f" % (time.process_time() - c),
    compile_cache.stats()["register_hits"],
    compile_cache.stats()["misses"],
)
