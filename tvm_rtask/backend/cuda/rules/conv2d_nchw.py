"""Direct and grouped NCHW convolution as an implicit GEMM per group (``conv2d_nchw`` or
``group_conv2d_nchw``: n, f, y, x spatial; rc, ry, rx reduction), with its padding producer
and fused epilogue (bias, batch norm, relu).

The convolution block is re-indexed (``transform_block_layout``) as ``C[g, m, j] += A[g, k, m]
* B[g, j, k]``: ``m`` the output pixel (n, y, x), ``j`` the output channel within group ``g``,
``k`` the reduction (input channel of the group, kernel row, kernel column). ``A`` is the
im2col view of the (padded) input, never materialised: its producers are inlined into the
shared-memory fetch. Schedule (``BM = TM*MI`` pixels x ``BJ = TJ*JI`` channels a block)::

    for b in blockIdx(M/BM, G * J/BJ):                    # one rTask: independent blocks
      for t in threadIdx.x(TJ * TM):                      # t = tj*TM + tm: 1-D
        acc[JI, MI] = 0                                   # registers
        for ko in range(K / KT):
          A_s[KT, BM] <- input (im2col, padding inlined)  # coalesced along pixels
          B_s[BJ, KT] <- weight                           # coalesced along k (float4 if legal)
          for k4 in range(KT / 4):
            a[4, MI] <- A_s   (MI-wide vector loads)      # shared -> registers
            b[JI, 4] <- B_s   (4-wide vector loads)
            for k in unroll(4), j in unroll(JI), m in unroll(MI):
              acc[j, m] += a[k, m] * b[j, k]
        out[..] = epilogue(acc)                           # MI-wide stores where contiguous

Pixels are the fast thread axis: within each 8-thread phase of a 128-bit shared load the
pixel reads are consecutive (conflict-free) and the channel reads are one broadcast. Tiles
(MI, JI, TM, TJ) come from :func:`choose_tile`; the thread count stays within the target's
``max_num_threads`` (the vEU size). M, J, K that the tile does not divide are padded
(``pad_einsum``): the padding is zero-filled in the fetch and masked in the write-back.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers
from tvm.target import Target

from ....tir.schedule import schedule_of
from .base import ConvInfo, CUDAScheduleRule, find_conv, inline_epilogue, num_sms, thread_cap

UNROLL = 256  # pragma_auto_unroll_max_step on the thread loop, as dlight's Matmul
# 0: unrolled loops stay loops under ``#pragma unroll`` (nvcc unrolls them: the same PTX)
# instead of TVM writing every iteration out. Written out, SqueezeNet's 18 kernels were 2.0 MB
# of CUDA source instead of 80 KB, and whole models built twice as slowly (Inception v3:
# 179 s against dlight's 94 s, 61.6 MB of source against 24.7 MB).
UNROLL_EXPLICIT = 0
# Cost model constants (cycles), see choose_tile.
LATENCY = 800  # one reduction step's global load -> shared -> compute round trip
LANES = 128  # FP32 FMAs per SM per cycle (sm_70 .. sm_90)
REGISTERS = 64  # per thread, assumed for the resident-blocks estimate
MAX_WASTE = 1.25  # padded / real output elements a tile may compute
# Elements of one operand a thread copies to shared memory per step: the copy is unrolled,
# and nasnet's 3x3 stem (64 threads each fetching 112 im2col elements) took 128 registers.
MAX_FETCH = 32


@dataclass(frozen=True)
class Tile:
    """One block's tile: ``tm x tj`` threads, each ``mi`` pixels x ``ji`` channels, the
    reduction staged ``kt`` at a time."""

    mi: int
    ji: int
    tm: int
    tj: int
    kt: int

    @property
    def threads(self) -> int:
        return self.tm * self.tj

    @property
    def bm(self) -> int:
        return self.tm * self.mi

    @property
    def bj(self) -> int:
        return self.tj * self.ji


def reduction_step(k: int) -> int:
    """Reduction elements staged per step, a multiple of 4 (the register loads are 4 wide):
    32 or 16 when it divides K, else all of a small K (up to 48) rounded up to 4 in one step,
    else 32 (padded). (24, which divides some K that 32 does not, made ptxas use 95 registers
    instead of 59 on SqueezeNet's 3x3 convolutions; 48 in one step, 768 FMAs unrolled, spilled
    on SqueezeNet's 48 -> 192 1x1.)"""
    if k % 32 == 0:
        return 32
    if k % 16 == 0:
        return 16
    return -(-k // 4) * 4 if k <= 48 else 32


def estimate_cycles(tile: Tile, gemm: tuple[int, int, int, int], sms: int) -> float:
    """A coarse time in cycles: waves of resident blocks x reduction steps x per-step cost.

    A step costs its FMAs over the SM's lanes plus its fetch (one load per element a warp
    lane), and at least LATENCY: with no software pipelining a lone block waits for its
    loads every step, and co-resident blocks overlap those waits.
    """
    groups, m, j, k = gemm
    blocks = groups * -(-m // tile.bm) * -(-j // tile.bj)
    resident = min(2048 // tile.threads, 65536 // (tile.threads * REGISTERS), 32)
    per_sm = -(-blocks // sms)
    waves = -(-per_sm // resident)
    on_sm = min(per_sm, resident)
    compute = tile.bm * tile.bj * tile.kt / LANES + (tile.bm + tile.bj) * tile.kt / 32
    steps = -(-k // tile.kt)
    return waves * steps * max(LATENCY, on_sm * compute)


def choose_tile(gemm: tuple[int, int, int, int], cap: int, sms: int) -> Tile:
    """The tile with the least estimated time (:func:`estimate_cycles`) among those that
    compute at most MAX_WASTE times the real outputs; ties (within 5%) go to the larger
    per-thread tile (fewer shared loads per FMA), then to the larger block tile (less
    global traffic). Threads: 32 .. ``cap``; pixels per phase of 8 threads consecutive; at
    most MAX_FETCH elements of each operand copied per thread and step."""
    _, m, j, k = gemm
    kt = reduction_step(k)
    tiles, heavy = [], []
    for mi in (4, 2, 1):
        for ji in (4, 2, 1):
            for tm in (1, 2, 4, 8, 16, 32, 64, 128, 256):
                for tj in (1, 2, 4, 8, 16, 32, 64, 128, 256):
                    tile = Tile(mi, ji, tm, tj, kt)
                    if not 32 <= tile.threads <= cap or (tm < 8 and tile.bm < m):
                        continue
                    waste = (-(-m // tile.bm) * tile.bm) * (-(-j // tile.bj) * tile.bj) / (m * j)
                    fetch = max(kt * mi // tj, kt * ji // tm)
                    (tiles if fetch <= MAX_FETCH else heavy).append((waste, tile))
    tiles = tiles or heavy
    best_waste = min(w for w, _ in tiles)
    allowed = [t for w, t in tiles if w <= max(MAX_WASTE, best_waste)]
    timed = [(estimate_cycles(t, gemm, sms), t) for t in allowed]
    fastest = min(c for c, _ in timed)
    near = [t for c, t in timed if c <= fastest * 1.05]
    return max(near, key=lambda t: (t.mi * t.ji, t.bm * t.bj, t.mi, -t.threads))


def _contiguous_pixels(info: ConvInfo, count: int) -> bool:
    """``count`` consecutive output pixels (aligned) are consecutive in memory: one image
    plane holds a whole number of them."""
    return (info.out_h * info.out_w) % count == 0


def _input_contiguous(info: ConvInfo) -> bool:
    """The im2col view reads consecutive pixels from consecutive addresses: a 1x1, stride-1
    convolution that reads the input itself (no padding, no offset)."""
    return info.kernel_h == info.kernel_w == 1 and info.stride == (1, 1) and info.offset == (0, 0)


class Conv2dNCHW(CUDAScheduleRule):
    """Implicit-GEMM convolution, direct or grouped (see the module docstring). Depthwise
    convolutions (one input channel per group) are left to :class:`DepthwiseConv2dNCHW`."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = schedule_of(func)
        info = find_conv(sch)
        if info is None or info.group_channels == 1:
            return None
        tile = choose_tile(info.gemm, thread_cap(target), num_sms(target))
        return schedule_conv_gemm(sch, info, tile)


def _gemm_layout(sch: s_tir.Schedule, info: ConvInfo) -> None:
    """The block as ``C[g, m, j] += A[g, m, k] * B[g, j, k]`` over re-indexed buffers, A
    stored k-major (``A[g, k, m]``: pixels contiguous) and B as the weight is (k
    contiguous)."""
    fg, oh, ow = info.out_per_group, info.out_h, info.out_w
    kh, kw = info.kernel_h, info.kernel_w
    conv = info.block
    sch.transform_block_layout(
        conv,
        lambda n, f, y, x, rc, ry, rx: (
            f // fg,
            (n * oh + y) * ow + x,
            f % fg,
            (rc * kh + ry) * kw + rx,
        ),
    )
    a = sch.reindex(conv, ("read", info.data_read))
    sch.reindex(conv, ("read", info.weight_read))
    sch.reindex(conv, ("write", 0))
    # with one group the group index is dropped from A's re-index: (m, k), else (g, m, k)
    if len(sch.get(a).writes[0].source.shape) == 2:
        sch.transform_layout(a, ("write", 0), lambda m, k: (k, m))
    else:
        sch.transform_layout(a, ("write", 0), lambda g, m, k: (g, k, m))


def _fetch(sch, conv, index: int, at, threads: int, vector: int, inner_first: bool):
    """Cooperative copy of operand ``index`` into shared memory at loop ``at``: the copy's
    loops fused (innermost axis fastest: ``inner_first`` reverses the buffer's last two),
    split over the threads, ``vector`` elements a thread a trip."""
    block = sch.cache_read(conv, index, "shared")
    sch.compute_at(block, at, preserve_unit_loops=True)
    ndim = len(sch.get(block).writes[0].source.shape)
    loops = sch.get_loops(block)[-ndim:]
    if inner_first:
        sch.reorder(loops[-1], loops[-2])
        loops = sch.get_loops(block)[-ndim:]
    fused = sch.fuse(*loops)
    if vector > 1:
        _, tx, vec = sch.split(fused, [None, threads, vector])
        sch.vectorize(vec)
    else:
        _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")
    return block


def schedule_conv_gemm(sch: s_tir.Schedule, info: ConvInfo, tile: Tile):
    _, m, j, k = info.gemm
    conv = info.block
    _gemm_layout(sch, info)
    pads = (-(-m // tile.bm) * tile.bm != m, -(-j // tile.bj) * tile.bj != j, k % tile.kt != 0)
    sch.pad_einsum(conv, [1, tile.bm, tile.bj, tile.kt])
    loops = sch.get_loops(conv)
    if len(loops) == 4:
        g, lm, lj, lk = loops
    else:  # one group: the group loop is a unit loop kept by transform_block_layout or not
        g, (lm, lj, lk) = None, loops[-3:]
    bm, tm, mi = sch.split(lm, [None, tile.tm, tile.mi])
    bj, tj, ji = sch.split(lj, [None, tile.tj, tile.ji])
    ko, k4, ki = sch.split(lk, [None, tile.kt // 4, 4])
    outer = [g] if g is not None else []
    sch.reorder(*outer, bj, bm, tj, tm, ko, k4, ki, ji, mi)
    # two grid axes, as dlight binds them: fused into one, the block's pixel and channel
    # offsets are a floordiv / floormod of blockIdx.x, and inside a persistent kernel (block
    # index read from a task table) CompactBufferAllocation could not prove the accumulator
    # region non-negative: it clamped it with max(0, ...) and the accumulators' indices
    # stopped being constants (Inception v1: 11,592 clamped register-array indices)
    by = sch.fuse(*outer, bj) if outer else bj
    sch.bind(bm, "blockIdx.x")
    sch.bind(by, "blockIdx.y")
    tx = sch.fuse(tj, tm)
    sch.bind(tx, "threadIdx.x")
    sch.annotate(tx, "pragma_auto_unroll_max_step", UNROLL)
    # one step (small K): written out, as dlight does (under #pragma unroll, ptxas took 80
    # registers for SqueezeNet's 16 -> 64 1x1 instead of 64)
    sch.annotate(tx, "pragma_unroll_explicit", 1 if k <= tile.kt else UNROLL_EXPLICIT)
    acc = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(acc, tx, preserve_unit_loops=True)
    # operands: A pixels fastest (coalesced along the row), B k fastest (the weight's order)
    contiguous_a = _input_contiguous(info) and _contiguous_pixels(info, 4) and tile.bm % 4 == 0
    vec_a = 4 if contiguous_a and not pads[0] and not pads[2] else 1
    vec_a = vec_a if (tile.bm * tile.kt) % (tile.threads * vec_a) == 0 else 1
    vec_b = 4 if not pads[1] and not pads[2] and k % 4 == 0 else 1
    vec_b = vec_b if (tile.bj * tile.kt) % (tile.threads * vec_b) == 0 else 1
    a_shared = _fetch(sch, conv, 0, ko, tile.threads, vec_a, inner_first=False)
    b_shared = _fetch(sch, conv, 1, ko, tile.threads, vec_b, inner_first=False)
    # shared -> registers, 128-bit loads: A[k4 .. k4+3, pixels of the thread], B[channels
    # of the thread, k4 .. k4+3]
    for index in (0, 1):
        local = sch.cache_read(conv, index, "local")
        sch.compute_at(local, k4, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(local)[-1])
    for loop in (k4, ki, ji, mi):
        sch.unroll(loop)
    auto_inline_producers(sch, a_shared)
    auto_inline_producers(sch, b_shared)
    if not inline_epilogue(sch, acc):
        return None
    # write-back: channels outer, the thread's pixels inner (contiguous in NCHW)
    wb = sch.get_loops(acc)[-2:]
    sch.reorder(wb[1], wb[0])
    if not pads[0] and _contiguous_pixels(info, tile.mi) and tile.mi > 1:
        sch.vectorize(sch.get_loops(acc)[-1])
    sch.decompose_reduction(conv, ko)
    return sch
