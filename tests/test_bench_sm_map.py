"""``python -m bench sm-map`` without a GPU: the mapping it reports, and that its kernel builds."""

from __future__ import annotations

from bench import gpu_sm_map as sm_map


def test_round_robin_and_consecutive_placements_are_told_apart():
    sms, per_sm = 4, 3
    permutation = [7, 2, 5, 0]  # SM ids need not be 0..n-1 in block order
    round_robin = [permutation[b % sms] for b in range(sms * per_sm)]
    out = sm_map.describe(round_robin, sms, per_sm)
    assert out["round_robin_b_mod_num_sms"] and not out["consecutive_b_div_blocks_per_sm"]
    assert out["blocks_per_sm"] == {3: 4} and out["distinct_sms"] == 4
    consecutive = [permutation[b // per_sm] for b in range(sms * per_sm)]
    out = sm_map.describe(consecutive, sms, per_sm)
    assert out["consecutive_b_div_blocks_per_sm"] and not out["round_robin_b_mod_num_sms"]
    late = round_robin[:-1] + [-1]  # one block never saw the others: not co-resident
    assert sm_map.describe(late, sms, per_sm)["not_resident"] == 1


def test_the_probe_kernel_builds():
    import tvm

    mod = sm_map.probe_module(blocks=8, threads=64, timeout_ns=1_000_000)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    lib = tvm.compile(mod, target)
    from tvm_rtask import cuda_source

    source = cuda_source(lib)
    assert "%%smid" in source and "tvm_rtask_all_arrive(" in source
