"""The two-reference rule the GPU tests and the GPU window share (ReferenceCheck)."""

import numpy as np

from tvm_rtask.testing.onnx_light import check_against_references

REFERENCE = [np.linspace(-3.0, 5.0, 64, dtype=np.float32).reshape(8, 8)]


def _off(outputs, by):
    return [o + np.float32(by) for o in outputs]


def test_matching_both_references_is_ok():
    check = check_against_references(REFERENCE, REFERENCE, REFERENCE)
    assert check.ok and check.tvm_agrees
    assert check.ort_rel_err == check.rel_err == check.tvm_ort_rel_err == 0.0


def test_off_from_onnx_runtime_fails_even_when_tvm_agrees_with_it():
    off = _off(REFERENCE, 0.1)
    check = check_against_references(off, REFERENCE, off)
    assert not check.ok
    assert check.rel_err == 0.0 and check.ort_rel_err > check.tolerance


def test_off_from_a_tvm_build_that_agrees_with_onnx_runtime_fails():
    # within the tolerance of ONNX Runtime on one side, TVM on the other, but the two
    # tvm-rtask errors add up: the stricter pairing still holds it to TVM's build
    tol = 1e-4
    actual = _off(REFERENCE, 0.9 * tol * 5.0)
    tvm_build = _off(REFERENCE, -0.9 * tol * 5.0)
    check = check_against_references(actual, REFERENCE, tvm_build, tol)
    assert check.tvm_agrees and check.ort_rel_err < tol
    assert check.rel_err > tol and not check.ok


def test_a_wrong_tvm_build_is_not_a_reference():
    check = check_against_references(REFERENCE, REFERENCE, _off(REFERENCE, 50.0))
    assert check.ok and not check.tvm_agrees


def test_missing_or_non_finite_outputs_fail():
    assert not check_against_references([], REFERENCE, REFERENCE).ok
    nan = [np.full_like(REFERENCE[0], np.nan)]
    check = check_against_references(nan, REFERENCE, REFERENCE)
    assert not check.ok and check.ort_rel_err == float("inf")
    wrong_shape = [REFERENCE[0].reshape(4, 16)]
    assert not check_against_references(wrong_shape, REFERENCE, REFERENCE).ok
