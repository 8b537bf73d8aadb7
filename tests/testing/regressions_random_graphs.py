"""Failures the random-graph fuzzer found, kept as regression tests.

``tests/testing/test_random_graphs.py`` runs every entry of :data:`REGRESSIONS` (the file
name does not start with ``test_``, so pytest does not collect it by itself). Each entry is
the graph hypothesis shrank (printed as ``graph=GraphSpec(...)``, pasted here unchanged),
the options and target it failed with, and where it was found. ``xfail`` names a bug not
fixed yet: the entry is then a strict expected failure, which fails the moment the bug is
fixed (drop ``xfail`` then, and its entry in ``KNOWN_BAD_GRAPHS`` or
``KNOWN_BAD_OPTIONS`` of ``tvm_rtask.testing.random_graphs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tvm_rtask.testing.random_graphs import FAST_TARGET, GraphSpec, Step


def _conv(**attrs: Any) -> Step:
    """A convolution step: a dense, unpadded 1x1 one without bias, batch norm or activation,
    but for ``attrs`` (``src`` and ``out`` always)."""
    return Step("conv", **{**_CONV_DEFAULTS, **attrs})


_CONV_DEFAULTS: dict[str, Any] = {
    "kernel": (1, 1), "stride": 1, "dilation": 1, "pad": (0, 0, 0, 0), "pad_kind": "same",
    "explicit_pad": False, "groups": 1, "groups_kind": "dense", "bias": False, "bn": False,
    "act": None,
}  # fmt: skip


@dataclass(frozen=True)
class Regression:
    name: str
    spec: GraphSpec
    options: dict[str, Any]
    found: str
    target: Any = field(default_factory=lambda: dict(FAST_TARGET))
    xfail: str | None = None


REGRESSIONS: list[Regression] = [
    # /work/shared/repro/nan_fragment.json in small: an explicit bottom/right-only zero pad
    # after conv + batch norm (arithmetic) + SiLU, read by a stride-2 convolution without
    # padding. FuseOps fused the pad into the first convolution's epilogue, whose
    # per-tile schedule never wrote the border: garbage (1e29) and NaN in every output
    # element that reads it. Found on ac18016 (issue 47); fixed in ef9904e (FoldPadIntoConv,
    # and a block moved under another's loops must still compute its whole domain).
    Regression(
        name="pad_bottom_right_after_conv_bn_silu_into_stride2_conv",
        spec=GraphSpec(
            input_shape=(1, 3, 8, 8),
            steps=(
                _conv(src=0, out=8, kernel=(3, 3), pad=(1, 1, 1, 1), bn=True, act="silu"),
                Step("pad", src=1, pad=(0, 0, 1, 1), value=0.0),
                _conv(src=2, out=8, kernel=(3, 3), stride=2, pad_kind="none"),
            ),
            outputs=(3,),
            seed=1,
        ),
        options={
            "fusion": "fuseops",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 2,
            "barrier": "fine",
        },
        found="issue 47, written by hand from nan_fragment.json; fails on ac18016, fixed in "
        "ef9904e",
    ),
    # The same defect, as hypothesis shrank it on ac18016 (400 image graphs, derandomized):
    # a bottom/right-only zero pad fused into a global average pool's epilogue. Without
    # nan_fill the first call passed on fresh (zero) memory and the second read what the
    # first left in the unwritten border, so hypothesis also reported it as flaky.
    Regression(
        name="pad_bottom_right_after_global_pool",
        spec=GraphSpec(
            input_shape=(1, 1, 3, 11),
            steps=(
                Step("gpool", src=0, mode="mean"),
                Step("pad", src=1, pad=(0, 0, 1, 1), value=0.0),
            ),
            outputs=(2,),
            seed=0,
        ),
        options={
            "policy": "ios",
            "fusion": "fuseops",
            "cpu_layout": "nchw",
            "num_veu": 1,
            "barrier": "fine",
        },
        found="issue 47, hypothesis on ac18016 (test_fuzz_image_graphs' strategy, shrunk); "
        "fixed in ef9904e",
    ),
    # fusion="stitch": 1x1 conv -> channel shuffle (reshape, transpose, reshape) -> 1x1 conv
    # gives a wrong last output element (row 2, column 2; garbage up to 1e29, so it reads
    # memory nobody wrote) with every policy and both cpu_layouts; fuseops and none are
    # right. Here the shuffle is even the identity (2 channels, 2 groups). Fixed in fa227ef
    # (the CPU convolution rule's last tile wrote to its own copy of the output). Found by
    # test_fuzz_many (RTASK_FUZZ_SEED=1) in a 9-step MBConv graph that hypothesis could not
    # shrink within 5 minutes (input (1, 20, 3, 3), se -> conv 1x1 20->24 + BN + SiLU ->
    # shuffle(2) -> conv 1x1 24->2, options
    # stitch / ios / nchw / 1 vEU / fine); reduced by hand to this. Fails on ac18016 too.
    Regression(
        name="stitch_conv_shuffle_conv",
        spec=GraphSpec(
            input_shape=(1, 1, 3, 3),
            steps=(
                _conv(src=0, out=2, pad_kind="none"),
                Step("shuffle", src=1, groups=2),
                _conv(src=2, out=1, pad_kind="none"),
            ),
            outputs=(3,),
            seed=0,
        ),
        options={
            "fusion": "stitch",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 1,
            "barrier": "fine",
        },
        found="issue 47, test_fuzz_many with RTASK_FUZZ_SEED=1 (ac18016); fixed in fa227ef",
    ),
    # The same family, from campaign seed 1550 (`python -m tvm_rtask.testing.random_graphs
    # --start 1000 --count 600 --max-steps 10`), reduced by hand: with fusion="stitch",
    # 1x1 conv -> image to tokens (reshape + permute) -> token reshape does not compile
    # ("variable ax1_ax2_fused has been used before definition") with 2 vEUs; with 4
    # channels instead of 2 it compiles and returns garbage (1e35) in 6 of 16 elements.
    # Fixed in fa227ef (a relayout in the convolution rule's epilogue tail, computed per
    # parallel tile, read what other tiles write later).
    Regression(
        name="stitch_conv_to_tokens_reshape",
        spec=GraphSpec(
            input_shape=(1, 2, 2, 2),
            steps=(
                _conv(src=0, out=2),
                Step("to_tokens", src=1, mode="tokens"),
                Step("reshape", src=2, features=4),
            ),
            outputs=(3,),
            seed=0,
        ),
        options={
            "fusion": "stitch",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 2,
            "barrier": "fine",
        },
        found="issue 47, campaign seed 1550 (ac18016), reduced by hand; fixed in fa227ef",
    ),
    # Seed 1550 itself in small: a stride-2 depthwise conv, to tokens, a token reshape, layer
    # norm; wrong in about a third of the outputs with one vEU (fuseops and none are right).
    # Fixed in fa227ef.
    Regression(
        name="stitch_dwconv_to_tokens_reshape_layer_norm",
        spec=GraphSpec(
            input_shape=(1, 4, 5, 5),
            steps=(
                _conv(
                    src=0,
                    out=4,
                    kernel=(3, 3),
                    stride=2,
                    pad=(1, 1, 1, 1),
                    groups=4,
                    groups_kind="depthwise",
                ),
                Step("to_tokens", src=1, mode="tokens"),
                Step("reshape", src=2, features=2),
                Step("layer_norm", src=3, eps=1e-06),
            ),
            outputs=(4,),
            seed=0,
        ),
        options={
            "fusion": "stitch",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 1,
            "barrier": "fine",
        },
        found="issue 47, campaign seed 1550 (ac18016), reduced by hand; fixed in fa227ef",
    ),
    # Softmax over the channels of a (1, 8, 8, 8) image: backend/cpu/rules/row_softmax.py
    # (_softmax_shape) decides "over the last axis" by comparing the row maxima's shape with
    # the input's shape without its last axis, which holds for axis 1 too when C == W (here
    # (1, 8, 8) either way), and then normalises the wrong rows: 510 of 512 elements off by
    # up to 56%. Any fusion, policy, layout; cpu_rules=False is right. Campaign seed 1414
    # (conv, conv, softmax over 17 channels of 17x17), reduced by hand; fails on ac18016,
    # fixed in ba58adf.
    Regression(
        name="softmax_over_channels_as_long_as_rows",
        spec=GraphSpec(
            input_shape=(1, 8, 8, 8),
            steps=(Step("softmax", src=0, axis=1),),
            outputs=(1,),
            seed=0,
        ),
        options={
            "fusion": "none",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 1,
            "barrier": "fine",
        },
        found="issue 47, campaign seed 1414 (ac18016), reduced by hand; fixed in ba58adf",
    ),
    # fusion="stitch": softmax over the channels, then a stride-2 1x1 convolution, 2 vEUs:
    # 2 of the 4 outputs wrong (rows 0 and 1, column 0). Right with 1 vEU, with stride 1,
    # with a 3x3 kernel, with cpu_rules=False, with fuseops or none. Campaign seed 5086
    # (`--start 5000 --count 700 --max-steps 12`: softmax over 14 channels of (2, 14, 12,
    # 12), 1x1 stride-2 conv + GELU, wavefront_global / nchwc / global), reduced by hand;
    # fails on ac18016 too. Cause: the strided slice the CPU backend makes of the stride-2
    # 1x1 conv, moved with reverse_compute_at under the softmax's loops, ran each instance
    # in several iterations and TVM allocated the softmax's row statistics inside the loop,
    # so the repeats read another row's; fixed by refusing repeated consumers
    # (tir.coverage.repeated_blocks) and computing the softmax under the slice's loops.
    Regression(
        name="stitch_softmax_over_channels_into_strided_1x1_conv",
        spec=GraphSpec(
            input_shape=(1, 2, 4, 4),
            steps=(
                Step("softmax", src=0, axis=1),
                _conv(src=1, out=1, stride=2, pad_kind="none"),
            ),
            outputs=(2,),
            seed=0,
        ),
        options={
            "fusion": "stitch",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 2,
            "barrier": "fine",
        },
        found="issue 47, campaign seed 5086 (ac18016 and the working tree), reduced by hand",
    ),
    # fusion="stitch": a matmul (torch's linear without bias) concatenated with itself, 2
    # vEUs: half the elements garbage (up to 7e20; on ac18016 one element, on the second
    # call only, without nan_fill). Right with 1 vEU, with fuseops, with two different
    # matmuls or with a sigmoid between. Found by test_fuzz_many (RTASK_FUZZ_EXAMPLES=400
    # RTASK_FUZZ_SEED=3), shrunk by hypothesis to exactly this ("the test always failed when
    # policy, cpu_layout, barrier and target were varied"). Cause: FuseTIR gave the fused
    # concat block one read region of the matmul's output (``y[.., v - 1]``, the first of
    # the two parameters it merged), so compute_at computed the matmul for half of what the
    # concat reads; fixed by relax_passes.merged_reads.MergedParamReads.
    Regression(
        name="stitch_matmul_concat_with_itself",
        spec=GraphSpec(
            input_shape=(1, 2, 1),
            steps=(
                Step("dense", src=0, out=1, style="torch", bias=False, act=None),
                Step("concat", src=1, other=1),
            ),
            outputs=(2,),
            seed=0,
        ),
        options={
            "fusion": "stitch",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 2,
            "barrier": "fine",
        },
        found="issue 47, test_fuzz_many with RTASK_FUZZ_SEED=3 (working tree at 18aad2c and "
        "ac18016), shrunk by hypothesis",
    ),
    # One vEU, any policy that puts two dependent operators in one rProgram (wavefront, auto),
    # fusion="none": every output 6.0 (relu -> relu6; fine or global barriers). The shared
    # workspace was a stack allocation that never escaped the persistent kernel and no call
    # separated the two runs: LLVM inlined both body functions and, trusting TVM's
    # per-buffer alias metadata, folded relu6's loads to the uninitialised workspace (the
    # generated function stored splat(6.0)). Fixed by tvm_rtask_cpu_publish between runs
    # (backend/cpu/dispatch.py). Found by test_fuzz_many (RTASK_FUZZ_SEED=11).
    Regression(
        name="one_veu_relu_then_relu6",
        spec=GraphSpec(
            input_shape=(1, 4, 8),
            steps=(
                Step("act", src=0, name="relu"),
                Step("add", src=1, other=0),
                Step("act", src=2, name="relu6"),
            ),
            outputs=(3,),
            seed=0,
        ),
        options={
            "fusion": "none",
            "policy": "auto",
            "cpu_layout": "nchw",
            "num_veu": 1,
            "barrier": "fine",
        },
        found="issue 47, test_fuzz_many RTASK_FUZZ_SEED=11 RTASK_FUZZ_EXAMPLES=2500 (5cf7d41)",
        target="llvm",  # LLVM's optimisations are the point: at opt-level 0 it is right
    ),
    # The same defect with fuseops: a softmax over channels between two 1x1 convolutions, one
    # vEU: every output NaN (with the NaN fill). Found by RTASK_FUZZ_SEED=12.
    Regression(
        name="one_veu_softmax_between_convs",
        spec=GraphSpec(
            input_shape=(1, 6, 3, 3),
            steps=(
                Step("act", src=0, name="relu"),
                Step("softmax", src=1, axis=1),
                *(_conv(src=src, out=1) for src in (2, 3)),
            ),
            outputs=(4,),
            seed=0,
        ),
        options={
            "fusion": "fuseops",
            "policy": "auto",
            "cpu_layout": "nchw",
            "num_veu": 1,
            "barrier": "fine",
        },
        found="issue 47, test_fuzz_many RTASK_FUZZ_SEED=12 RTASK_FUZZ_EXAMPLES=2500 (5cf7d41)",
        target="llvm",  # LLVM's optimisations are the point: at opt-level 0 it is right
    ),
    # fusion="stitch", 2 vEUs: a batch-2 1x1 convolution (batch norm as arithmetic) turned
    # into tokens and reshaped twice, stitched into one kernel cut along the batch: the
    # build fails in TVM's FlattenBuffer ("Divide by zero" in const folding) after
    # CompactBufferAllocation shrank the convolution's intermediate to (2, 4, 1, 1) under
    # the reshape's folded indices. Loud (the compile raises), not a wrong answer; open.
    # Found by test_fuzz_many RTASK_FUZZ_SEED=14 (cc1cab8), shrunk by hypothesis; fails on
    # 3b24697 too.
    Regression(
        name="stitch_batched_conv_to_tokens_reshaped",
        spec=GraphSpec(
            input_shape=(2, 1, 3, 3),
            steps=(
                _conv(src=0, out=1),
                _conv(
                    src=1,
                    out=1,
                    kernel=(3, 3),
                    pad=(1, 1, 1, 1),
                    bn=True,
                    act="silu",
                    block="mbconv",
                ),
                _conv(src=2, out=4, pad_kind="none", bn=True),
                Step("to_tokens", src=3, mode="tokens"),
                Step("reshape", src=4, features=3),
                Step("reshape", src=5, features=1),
            ),
            outputs=(6,),
            seed=0,
        ),
        options={
            "fusion": "stitch",
            "policy": "auto",
            "cpu_layout": "nchw",
            "num_veu": 2,
            "barrier": "fine",
        },
        found="issue 47, test_fuzz_many RTASK_FUZZ_SEED=14 RTASK_FUZZ_EXAMPLES=2500 (cc1cab8)",
        xfail="stitch fusion of a batched conv to tokens + reshape, 2 vEUs: build fails",
    ),
    # Any graph: one vEU with global barriers did not build on llvm ("Cannot find parallel
    # loop within parallel launch", CodeGenCPU::CreateParallelLaunch). Fixed in e4b7a66.
    Regression(
        name="one_veu_global_barrier",
        spec=GraphSpec(
            input_shape=(1, 15, 24),
            steps=(Step("act", src=0, name="relu"),),
            outputs=(1,),
            seed=2,
        ),
        options={
            "fusion": "fuseops",
            "policy": "sequential",
            "cpu_layout": "nchw",
            "num_veu": 1,
            "barrier": "global",
        },
        found="issue 47, the first seeded graphs of the option sweep (ac18016); fixed in e4b7a66",
    ),
]
