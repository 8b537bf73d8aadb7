"""vEU ids claimed by SM at kernel start (option ``cuda_veu_placement="smid"``; dependency
counters only).

The planner puts vEU ``v`` on SM ``v % num_sms`` (``VDevice.sm_of``): vEUs ``0..num_sms-1``
are one per SM, the next ``num_sms`` a second block on each SM, and so on, so an operator
with fewer rTasks than vEUs is spread over SMs before any SM gets two. With the default
``"block"``, vEU = ``blockIdx.x`` and the layout is the hardware's block placement, which
CUDA does not specify (``bench/gpu_sm_map.py`` measures it). With ``"smid"`` it holds by
construction: thread 0 of each block reads ``%smid`` and claims the next slot of that SM.
A block whose SM got more blocks than the plan has vEUs there (or whose ``%smid`` is not
below ``num_sms``) waits until every block has claimed and takes the ``rank``-th vEU nobody
claimed, in ascending order, ``rank`` being its place among such blocks: every vEU is taken
exactly once. :func:`claim_veus` is the same protocol in Python, for the tests (no GPU has
run it yet). The wait is bounded (the spin timeout; status kind 3), and needs every block
co-resident, which a persistent kernel needs anyway.

Why it is not the default: a claimed id is a value loaded from memory, where ``blockIdx.x``
is a special register that ptxas can read again at any time (and, we suppose, keeps in
uniform registers). The table addressing of every entry then costs ordinary registers:
reduced SqueezeNet's
wavefront kernel (sm_90, ptxas -v, 80 registers) spills 264 bytes with the claim against 32
with ``blockIdx.x``. Which costs more on a GPU, those spills or an unknown placement, is
unmeasured (docs/gpu.md).

Words (``claim_words``), after the operator counters, the finish counter and the epoch: an
arrival counter that only grows (launch ``e`` waits for ``(e + 1) * num_veu`` arrivals),
then two banks of ``num_sms`` claim counters and one overflow counter. Launch ``e`` uses bank
``e & 1`` and block 0 zeroes the other one for launch ``e + 1``; launches on one stream do
not overlap, so nothing is reset at the end and a CUDA graph can replay the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

from .device import device_source

# Device code, emitted after the dispatcher's SYNC_SOURCE (it uses tvm_rtask_wait_epoch from
# there) only in kernels that claim (dispatch.CLAIM_HELPERS_SOURCE).
CLAIM_SOURCE = device_source("claim.cuh")


def claim_words(num_sms: int) -> int:
    """Sync words of the claim: an arrival counter and two banks of ``num_sms`` claim
    counters plus an overflow counter; 0 without a claim (``num_sms == 0``)."""
    return 1 + 2 * (num_sms + 1) if num_sms else 0


def claim_veus(block_sms: Sequence[int], num_veu: int, num_sms: int) -> list[int]:
    """The vEU each block gets from ``tvm_rtask_claim_veu``: ``block_sms[i]`` is the ``%smid``
    of the ``i``-th block to claim (claims are atomic, so any order is one of these).

    Mirrors the device code step by step: first claims per SM, then the blocks left without
    a vEU take the unclaimed ones in the order of their overflow ranks.
    """
    if len(block_sms) != num_veu:
        raise ValueError(f"{len(block_sms)} blocks for {num_veu} vEUs: one block per vEU")
    bank = [0] * (num_sms + 1)
    veus: list[int] = []
    for sm in block_sms:
        veu = -1
        if 0 <= sm < num_sms:
            c = bank[sm]
            bank[sm] += 1
            if c * num_sms + sm < num_veu:
                veu = c * num_sms + sm
        veus.append(veu)
    # every block has arrived: the overflow blocks, in rank order, take what nobody claimed
    unclaimed = [v for v in range(num_veu) if bank[v % num_sms] <= v // num_sms]
    ranks = iter(unclaimed)
    return [v if v >= 0 else next(ranks) for v in veus]
