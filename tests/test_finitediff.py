"""Tests for lnorm.finitediff: central differences and the complex step on
functions with known gradients, the step actually taken, relative steps, and
the step sweep's U-curve."""

import numpy as np
import pytest
from reference import cubic, cubic_grad, rel_error, smooth, smooth_grad

from lnorm import finitediff, gradcheck
from lnorm.finitediff import (
    StepTooSmallError,
    central_difference,
    complex_step,
    step_sweep,
)

U64 = 2.0**-53


# --- unit roundoff and default steps ---------------------------------------------


def test_unit_roundoff_and_default_steps():
    # u = 2**-53 and 2**-24 (half the machine epsilon); the central step that
    # balances truncation (h**2) against rounding (u / h) is u**(1/3).
    assert finitediff.unit_roundoff(np.float64) == U64 == np.finfo(np.float64).eps / 2
    assert finitediff.unit_roundoff(np.float32) == 2.0**-24
    assert finitediff.default_step("central", np.float64) == pytest.approx(
        U64 ** (1 / 3), rel=1e-12
    )
    assert finitediff.default_step("central", np.float32) == pytest.approx(
        2.0**-8, rel=1e-12
    )
    assert finitediff.default_step("complex") == 1e-30


# --- central differences ----------------------------------------------------------


@pytest.mark.parametrize("f, grad", [(cubic, cubic_grad), (smooth, smooth_grad)])
def test_central_difference_matches_known_gradients(ab, f, grad):
    est = central_difference(f, ab)
    for e, g in zip(est, grad(*ab)):
        assert e.shape == g.shape and e.dtype == np.float64
        assert rel_error(g, e) < 1e-9


def test_central_difference_error_falls_as_h_squared():
    a = [np.array([0.3, 1.1, -0.7])]
    exact = np.cos(a[0])
    err = [
        np.abs(central_difference(lambda v: np.sin(v).sum(), a, h)[0] - exact).max()
        for h in (1e-2, 1e-3)
    ]
    # Truncation h**2 |sin'''| / 6: a tenth of the step, a hundredth of the error.
    assert 80 < err[0] / err[1] < 120


def test_central_difference_is_exact_for_a_quadratic_even_with_a_large_step():
    # The h**2 term needs a third derivative; a one-sided quotient would be off by h/2 *
    # f''.
    a = [np.array([0.5, -2.0, 3.0])]
    est = central_difference(lambda v: (v * v).sum(), a, h=0.5)[0]
    np.testing.assert_allclose(est, 2 * a[0], rtol=0, atol=1e-14)


def test_central_difference_divides_by_the_step_actually_taken():
    # In float32, a + h is rounded; dividing by 2h instead would not give exactly 1.
    a = [np.array([1.1, 3.7, 100.3], dtype=np.float32)]
    est = central_difference(lambda v: v.astype(np.float64).sum(), a, h=1e-3)[0]
    assert np.all(est == 1.0)
    naive = (
        np.float64(a[0] + np.float32(1e-3)) - np.float64(a[0] - np.float32(1e-3))
    ) / 2e-3
    assert np.any(naive != 1.0)  # the correction matters for these values


def test_central_difference_refuses_a_step_below_the_spacing():
    a = [np.array([1.0, 2.0], dtype=np.float32)]
    with pytest.raises(StepTooSmallError, match="rounds to a"):
        central_difference(lambda v: v.sum(), a, h=1e-12)
    assert issubclass(StepTooSmallError, ValueError)




# --- complex step --------------------------------------------------------------------


@pytest.mark.parametrize("f, grad", [(cubic, cubic_grad), (smooth, smooth_grad)])
def test_complex_step_matches_known_gradients_to_machine_precision(ab, f, grad):
    for e, g in zip(complex_step(f, ab), grad(*ab)):
        assert rel_error(g, e) < 8 * U64


def test_complex_step_does_not_depend_on_a_tiny_h(ab):
    ref = complex_step(smooth, ab, h=1e-30)
    for h in (1e-100, 1e-200):
        for e, r in zip(complex_step(smooth, ab, h=h), ref):
            assert rel_error(r, e) < 4 * U64


def test_complex_step_refuses_a_loss_that_drops_the_imaginary_part(ab):
    with pytest.raises(TypeError, match="complex-safe"):
        complex_step(lambda a, b: (np.abs(a) ** 2).sum() + b.sum(), ab)


@pytest.mark.parametrize("layout", ["fortran", "strided"])
def test_estimates_do_not_depend_on_the_memory_layout(layout):
    # The perturbed copy must be the array f sees, whatever the caller's layout.
    base = np.random.default_rng(9).normal(size=(3, 8))
    a = np.asfortranarray(base) if layout == "fortran" else base[:, ::2]
    exact = np.cos(a)
    f = lambda v: np.sin(v).sum()  # noqa: E731
    assert rel_error(exact, complex_step(f, [a])[0]) < 4 * U64
    assert rel_error(exact, central_difference(f, [a])[0]) < 1e-9


def test_complex_step_on_float32_inputs_uses_complex64():
    a = [np.array([0.3, -1.2, 2.0], dtype=np.float32)]
    seen = []

    def f(v):
        seen.append(v.dtype)
        return np.sin(v).sum()

    est = complex_step(f, a)[0]
    assert set(seen) == {np.dtype(np.complex64)}
    assert rel_error(np.cos(a[0].astype(np.float64)), est) < 1e-6


# --- the step sweep -------------------------------------------------------------------


def test_step_sweep_shows_the_u_curve_near_the_predicted_optimum(layernorm_case):
    arrays, dy, grads = layernorm_case
    hs = np.logspace(0, -12, 25)
    sweep = step_sweep(gradcheck.layernorm_loss(dy), arrays, hs, reference=grads)
    assert finitediff.default_step("central") == pytest.approx(U64 ** (1 / 3))
    assert 1e-7 <= sweep.best_h <= 1e-4
    assert sweep.best_rel_error < 1e-9
    # Both walls of the U: truncation on the right, rounding on the left.
    assert sweep.max_rel_error[0] > 1e4 * sweep.best_rel_error
    assert sweep.max_rel_error[-1] > 1e3 * sweep.best_rel_error


def test_step_sweep_default_reference_is_the_complex_step(layernorm_case):
    arrays, dy, grads = layernorm_case
    hs = [1e-2, 1e-5]
    loss = gradcheck.layernorm_loss(dy)
    default = step_sweep(loss, arrays, hs)
    explicit = step_sweep(loss, arrays, hs, reference=grads)
    np.testing.assert_allclose(
        default.max_rel_error, explicit.max_rel_error, rtol=1e-3, atol=1e-14
    )


def test_step_sweep_in_float32_marks_too_small_steps_as_nan(layernorm_case):
    arrays, dy, grads = layernorm_case
    arrays32 = [a.astype(np.float32) for a in arrays]
    hs = np.array([1e-2, 1e-4, 1e-12])
    sweep = step_sweep(
        gradcheck.layernorm_loss(dy.astype(np.float32)), arrays32, hs, reference=grads
    )
    assert np.isnan(sweep.max_rel_error[-1])
    assert np.all(np.isfinite(sweep.max_rel_error[:2]))
    assert sweep.best_h == 1e-2  # near u32**(1/3) = 3.9e-3, not at the small step
    assert sweep.dtype == np.float32


# --- relative steps -------------------------------------------------------------------


def test_relative_steps_scale_with_the_element():
    steps = finitediff.relative_steps(np.array([0.0, 0.5, -3.0, 1e6]), 1e-5)
    np.testing.assert_allclose(steps, [1e-5, 1e-5, 3e-5, 10.0], rtol=1e-15)


def test_relative_steps_keep_large_float32_arguments_accurate():
    # At |a| ~ 1e4 a float32 loss sum(a**2) ~ 5e8 rounds to about 32, so an
    # absolute step of u32**(1/3) = 3.9e-3 leaves a rounding error of order
    # 32 / 8e-3 in the quotient; the relative step 39 keeps it below 1.
    a = np.array([1.0e4, -2.0e4, 3.0], dtype=np.float32)
    f = lambda v: (v * v).sum()  # noqa: E731  (float32 throughout)
    exact = 2 * a.astype(np.float64)
    assert rel_error(exact, central_difference(f, [a])[0]) < 1e-3
    h = np.float32(finitediff.default_step("central", np.float32))
    absolute = []
    for i in range(3):
        up, down = a.copy(), a.copy()
        up[i] += h
        down[i] -= h
        absolute.append((float(f(up)) - float(f(down))) / float(up[i] - down[i]))
    assert rel_error(exact, np.array(absolute)) > 1e-2  # why the step is relative


def test_the_helpers_keep_dtypes_skip_arguments_and_divide_by_the_step_taken():
    # What the helpers' docstring examples showed before they became one line.
    args = finitediff.as_arguments([np.ones(2), np.ones(3, np.float32)])
    assert [a.dtype for a in args] == [np.float64, np.float32]
    grads = finitediff.as_gradients([None, [1, 2]], [np.ones(3), np.ones(2)], "arrays")
    assert grads[0] is None and grads[1].dtype == np.float64
    est = finitediff.estimate(lambda a, b: (a * b).sum(), [np.ones(2), np.full(2, 3.0)],
                              1e-30, "complex", [1])
    assert est[0] is None and np.array_equal(est[1], [1.0, 1.0])
    a = [np.array([1.0, 2.0])]
    diff, taken = finitediff.displaced(lambda a: (a**2).sum(), a,
                                       {0: np.array([1e-3, 0.0])}, "central")
    assert diff / taken[0][0] == pytest.approx(2.0, rel=1e-9)  # d(a**2)/da at a = 1
    with pytest.raises(ValueError, match="method must be 'central' or 'complex'"):
        finitediff.check_method("forward")
