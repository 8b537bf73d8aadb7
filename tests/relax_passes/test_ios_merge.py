"""IOSOperatorMerge: convolutions are merged exactly where IOS's dynamic program says so."""

import numpy as np
import tvm

import tvm_rtask
from tests.policies.test_ios import _MergeFriendly
from tests.relax_passes.test_merge_convs import count_convs, inception_block, run
from tvm_rtask.relax_passes.ios_merge import IOSOperatorMerge
from tvm_rtask.relax_passes.merge_convs import merge_candidates


def test_dp_choice_is_applied_and_numerics_hold():
    mod, inputs = inception_block(weights_as_params=False)
    candidates = merge_candidates(mod["main"])
    assert len({g for g, _ in candidates.values()}) == 1  # 1x1, 3x3/p1, 5x5/p2
    # padding the 1x1 to 5x5 makes its FLOPs 25x: merged rTasks must be far cheaper to win
    merge = IOSOperatorMerge("llvm", cost=_MergeFriendly(0.01), policy="ios", num_veu=2)
    merged = merge(mod)
    assert merge.last_chosen == [set(candidates)]
    assert count_convs(merged) == count_convs(mod) - 2
    ex = tvm_rtask.compile(merged, "llvm", policy="ios", num_veu=2, ios_merge=False)
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    got = [o.numpy() for o in vm["main"](*(tvm.runtime.tensor(v) for v in inputs))]
    for g, w in zip(got, run(mod, inputs), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_no_merge_when_the_dp_prefers_side_by_side_or_policy_is_not_ios():
    mod, _ = inception_block(weights_as_params=False)
    hostile = IOSOperatorMerge("llvm", cost=_MergeFriendly(10.0), policy="ios", num_veu=2)
    assert hostile(mod).same_as(mod) and hostile.last_chosen == []
    for options in ({"policy": "wavefront"}, {"policy": "ios", "ios_merge": False}):
        merge = IOSOperatorMerge("llvm", cost=_MergeFriendly(0.1), num_veu=2, **options)
        assert merge(mod).same_as(mod)
