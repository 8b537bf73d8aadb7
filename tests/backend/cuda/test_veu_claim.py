"""vEU ids claimed by SM (``cuda_veu_placement="smid"``): the protocol in its Python model,
and the dispatcher that calls the device code (no GPU has run it yet: tests/cuda/test_gpu.py)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tvm_rtask
from tests.relax_passes.models import SharedKernels
from tvm_rtask.backend.cuda.dispatch import STATUS_WORDS, sync_words
from tvm_rtask.backend.cuda.veu_claim import claim_veus, claim_words
from tvm_rtask.errors import OptionError
from tvm_rtask.options import RTaskOptions

from .test_dispatch import _helpers_called, _plan_and_lower


@st.composite
def _grids(draw):
    """A device of ``num_sms`` SMs, a grid of ``num_veu`` blocks, the ``%smid`` of each block
    in the order the blocks claim (any: atomics), some beyond the planned SMs."""
    num_sms = draw(st.integers(1, 9))
    num_veu = draw(st.integers(1, 4 * num_sms))
    sms = draw(st.lists(st.integers(0, num_sms + 2), min_size=num_veu, max_size=num_veu))
    return num_sms, num_veu, sms


@settings(max_examples=300, deadline=None)
@given(_grids())
def test_every_veu_is_taken_exactly_once(grid):
    num_sms, num_veu, sms = grid
    assert sorted(claim_veus(sms, num_veu, num_sms)) == list(range(num_veu))


@settings(max_examples=300, deadline=None)
@given(_grids())
def test_a_block_with_a_free_slot_on_its_sm_runs_a_veu_of_that_sm(grid):
    num_sms, num_veu, sms = grid
    veus = claim_veus(sms, num_veu, num_sms)
    planned = [sum(1 for v in range(num_veu) if v % num_sms == s) for s in range(num_sms)]
    seen = [0] * num_sms
    for sm, veu in zip(sms, veus, strict=True):
        if sm < num_sms:
            if seen[sm] < planned[sm]:
                assert veu % num_sms == sm and veu // num_sms == seen[sm]
            seen[sm] += 1


@given(st.integers(1, 9), st.integers(1, 4), st.randoms())
def test_when_the_hardware_places_blocks_as_planned_every_veu_is_on_its_sm(num_sms, per_sm, rnd):
    num_veu = num_sms * per_sm
    sms = [v % num_sms for v in range(num_veu)]
    rnd.shuffle(sms)
    veus = claim_veus(sms, num_veu, num_sms)
    assert all(v % num_sms == sm for sm, v in zip(sms, veus, strict=True))


def test_the_model_refuses_a_grid_that_is_not_one_block_per_veu():
    with pytest.raises(ValueError, match="one block per vEU"):
        claim_veus([0, 1], 3, 2)


def test_claim_words_sit_between_the_epoch_and_the_status_words():
    assert claim_words(0) == 0 and claim_words(132) == 1 + 2 * 133
    assert len(sync_words(8, 5, 132)) == 5 + 2 + claim_words(132) + STATUS_WORDS
    assert len(sync_words(8, 5)) == 5 + 2 + STATUS_WORDS


def test_the_dispatcher_claims_once_and_reads_the_claim_for_its_table_row():
    mod, plan = _plan_and_lower(SharedKernels, cuda_veu_placement="smid")
    func = mod["rprogram_0"]
    assert {"tvm_rtask_claim_veu", "tvm_rtask_claimed_veu"} <= _helpers_called(func)
    script = func.script()
    assert len(re.findall(r'func_call\("tvm_rtask_claim_veu"', script)) == 1
    (program,) = plan.programs()
    counters = len(program.ops())
    sms = plan.vdevice.spec.num_sms
    # the claim words start right after the finish counter and the epoch
    assert re.search(
        rf'func_call\("tvm_rtask_claim_veu", T\.address_of\(rtask_sync\[{counters + 2}\]\)', script
    )
    assert f"T.int32({sms})" in script or f", {sms}," in script


@pytest.mark.parametrize(
    "options",
    [{}, {"cuda_veu_placement": "block"}, {"barrier": "fine", "cuda_veu_placement": "smid"}],
)
def test_block_indices_are_the_veus_by_default_and_with_step_arrays(options):
    mod, _ = _plan_and_lower(SharedKernels, **options)
    assert not {"tvm_rtask_claim_veu", "tvm_rtask_claimed_veu"} & _helpers_called(mod["rprogram_0"])


def test_an_unknown_placement_is_refused():
    with pytest.raises(OptionError, match="cuda_veu_placement must be one of"):
        RTaskOptions(target_options={"cuda_veu_placement": "sm"}).validate()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_the_claiming_kernel_compiles_with_nvcc(tmp_path):
    mod, _ = _plan_and_lower(SharedKernels, cuda_veu_placement="smid")
    ex, _ = tvm_rtask.build(mod, "cuda")
    source = tvm_rtask.cuda_source(ex)
    assert "%%smid" in source and "__shared__ int tvm_rtask_veu_id;" in source
    cu = tmp_path / "claim.cu"
    cu.write_text(source)
    out = subprocess.run(
        ["nvcc", "-ptx", "-arch=sm_90", "-o", str(tmp_path / "claim.ptx"), str(cu)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "%smid" in (tmp_path / "claim.ptx").read_text()


def test_kernels_that_do_not_claim_carry_no_claim_code():
    mod, _ = _plan_and_lower(SharedKernels)
    ex, _ = tvm_rtask.build(mod, "cuda")
    source = tvm_rtask.cuda_source(ex)
    assert "tvm_rtask_wait_count(" in source
    assert "tvm_rtask_claim_veu" not in source and "tvm_rtask_veu_id" not in source


def test_a_claim_timeout_raises_a_named_error():
    import numpy as np
    import tvm

    from tvm_rtask.backend.cuda.status import check_status

    words = sync_words(4, 3, 2)
    words[-STATUS_WORDS:][:5] = [3, 7, 4, 4, 3]
    expected = r"vEU claim by SM timed out .* block 7 .* \(3 started\)"
    with pytest.raises(RuntimeError, match=expected):
        check_status(tvm.runtime.tensor(np.asarray(words)))
