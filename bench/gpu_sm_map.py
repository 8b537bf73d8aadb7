"""Which SM each block of a co-resident grid runs on: the fact vEU placement by SM needs.

tvm-rtask's planner treats vEUs (thread blocks of a persistent kernel) as independent; the
dependency-counter issue asks that vEUs sharing an SM be planned as such, from ``%smid`` read
at kernel start "or an equivalent". The equivalent is free if the hardware places block
``b`` of a co-resident grid on a predictable SM (round robin: ``b % num_sms``; or in
blocks: ``b // blocks_per_sm``). This probe launches, for each blocks-per-SM count asked,
a grid of exactly ``num_sms x blocks_per_sm`` blocks whose blocks all stay resident until
every one has started (a bounded spin on an arrival counter), each writing its ``%smid``;
then it reports the blocks per SM and which simple mapping, if any, holds.

    python3 -m bench sm-map --out $OUT/sm_map.json            # on the GPU machine
    python3 -m bench sm-map --dry-run                          # builds only (no GPU)

The kernel is built with TVM (``tvm.compile``) like every other kernel here; ``%smid`` is
read by inline PTX through a device helper. A block that waits more than ``--timeout-ms``
for the others (a grid that is not co-resident) records -1 and stops waiting.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

HELPERS = r"""
#ifndef TVM_RTASK_SMID_DEFINED
#define TVM_RTASK_SMID_DEFINED
__device__ __forceinline__ int tvm_rtask_smid() {
  unsigned int r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ long long tvm_rtask_clock_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return (long long)t;
}
// Thread 0: arrive, then wait (bounded) until all `blocks` arrived; 1 if everyone came.
__device__ __noinline__ int tvm_rtask_all_arrive(int* counter, int blocks, long long timeout) {
  __threadfence();
  atomicAdd(counter, 1);
  long long start = tvm_rtask_clock_ns();
  while (*(volatile int*)counter < blocks) {
    if (tvm_rtask_clock_ns() - start > timeout) return 0;
    __nanosleep(256);
  }
  return 1;
}
#endif
"""


def probe_module(blocks: int, threads: int, timeout_ns: int):
    """A PrimFunc ``probe(smid: int32[blocks], arrived: int32[1])``: block ``b`` writes its
    SM to ``smid[b]`` (-1 if the grid was not all resident within the timeout)."""
    import tvm
    from tvm import s_tir, tirx
    from tvm.ir.expr import StringImm

    def helper(name, *args):
        return tirx.call_intrin("int32", "tirx.cuda.func_call", StringImm(name), *args,
                                StringImm(HELPERS))  # fmt: skip

    def i32(v):
        return tirx.IntImm("int32", v)

    smid = tirx.decl_buffer([blocks], "int32", "smid")
    arrived = tirx.decl_buffer([1], "int32", "arrived")
    bx, tx = tirx.Var("bx", "int32"), tirx.Var("tx", "int32")
    counter = tirx.address_of(tirx.BufferLoad(arrived, [i32(0)]))
    came = helper("tvm_rtask_all_arrive", counter, i32(blocks), tirx.IntImm("int64", timeout_ns))
    value = tirx.Select(tirx.EQ(came, i32(1)), helper("tvm_rtask_smid"), i32(-1))
    body = tirx.IfThenElse(tirx.EQ(tx, i32(0)), tirx.BufferStore(smid, value, [bx]), None)
    bind = tirx.ForKind.THREAD_BINDING
    threads_loop = tirx.For(tx, i32(0), i32(threads), bind, body,
                            thread_binding=tirx.IterVar(None, tx, 1, "threadIdx.x"))  # fmt: skip
    grid = tirx.For(bx, i32(0), i32(blocks), bind, threads_loop,
                    thread_binding=tirx.IterVar(None, bx, 1, "blockIdx.x"))  # fmt: skip
    root = s_tir.SBlock([], [], [], "root", grid)
    func = tirx.PrimFunc([smid, arrived], s_tir.SBlockRealize([], True, root))
    func = func.with_attrs({"global_symbol": "probe", "s_tir": True, "tirx.noalias": False})
    return tvm.IRModule({"probe": func})


def describe(smids: list[int], num_sms: int, per_sm: int) -> dict:
    """Blocks per SM and which simple block -> SM mapping holds (as far as SM ids go)."""
    placed = [s for s in smids if s >= 0]
    counts = Counter(placed)
    blocks = range(len(smids))
    # an SM id may be a permutation of 0..num_sms-1: compare groupings, not ids
    round_robin = all(
        smids[b] == smids[b % num_sms] for b in blocks if smids[b] >= 0 and smids[b % num_sms] >= 0
    )
    in_blocks = all(smids[b] == smids[(b // per_sm) * per_sm] for b in blocks if smids[b] >= 0)
    out = {"blocks": len(smids), "not_resident": len(smids) - len(placed)}
    per = dict(sorted(Counter(counts.values()).items()))
    out.update(distinct_sms=len(counts), blocks_per_sm=per)
    out.update(round_robin_b_mod_num_sms=round_robin, consecutive_b_div_blocks_per_sm=in_blocks)
    return out | {"first_64": smids[:64]}


def _nvcc_check(lib) -> str:
    """Without a GPU TVM keeps the CUDA source: compile it with the build's nvcc command."""
    from tvm_rtask import cuda_source
    from tvm_rtask.backend.cuda.compile_cache import compile_source, find_nvcc

    if find_nvcc() is None:
        return "nvcc not found"
    compile_source(cuda_source(lib), "sm_90")
    return "compiles"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-sm", default="1,2,3,4", help="blocks per SM to launch")
    parser.add_argument("--threads", type=int, default=256)
    parser.add_argument("--timeout-ms", type=int, default=2000)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    parser.add_argument("--dry-run", action="store_true", help="build only, no GPU needed")
    args = parser.parse_args(argv)

    import tvm

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    dev = None if args.dry_run else tvm.cuda(0)
    if dev is not None and not dev.exist:
        sys.exit("no CUDA device: use --dry-run to build only")
    num_sms = 132 if dev is None else int(dev.multi_processor_count)
    results = {"device": None if dev is None else str(dev.device_name), "num_sms": num_sms}
    for per_sm in (int(p) for p in args.per_sm.split(",")):
        blocks = num_sms * per_sm
        lib = tvm.compile(probe_module(blocks, args.threads, args.timeout_ms * 1_000_000), target)
        if dev is None:
            results[str(per_sm)] = {"built": True, "blocks": blocks, "nvcc": _nvcc_check(lib)}
            continue
        smid = tvm.runtime.tensor(np.full(blocks, -2, "int32"), dev)
        arrived = tvm.runtime.tensor(np.zeros(1, "int32"), dev)
        lib["probe"](smid, arrived)
        dev.sync()
        results[str(per_sm)] = found = describe([int(v) for v in smid.numpy()], num_sms, per_sm)
        print(per_sm, json.dumps({k: v for k, v in found.items() if k != "first_64"}))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results)[:2000])


if __name__ == "__main__":
    main()
