"""Tests for lnorm.gradcheck: the three gradients of lnorm.backward, wrong
gradients, the report, inputs left unchanged, and clear errors for bad
arguments. The estimates themselves are tested in test_finitediff.py."""

import numpy as np
import pytest
from reference import smooth, smooth_grad

import lnorm
from lnorm import gradcheck
from lnorm.finitediff import (
    central_difference,
    complex_step,
    step_sweep,
)
from lnorm.gradcheck import check_gradients, compare_gradients, directional_check


def sign_bug(grads, arrays, dy):
    """dx with + instead of - before xhat * mean(g * xhat); dgamma, dbeta right."""
    x, gamma, beta = arrays
    cache = lnorm.forward(x, gamma, beta)[1]
    xhat, rstd = cache.xhat, cache.rstd[..., None]
    g = gamma * dy
    wrong = grads[0] + 2 * rstd * xhat * (g * xhat).mean(axis=-1, keepdims=True)
    return [wrong, grads[1], grads[2]]


def test_default_tolerances():
    # (The steps, lnorm.finitediff's, are tested in test_finitediff.py.)
    assert gradcheck.default_tolerance("central") == 1e-8
    assert gradcheck.default_tolerance("complex") == 1e-13
    assert gradcheck.default_tolerance("complex", directional=True) == 1e-12


# --- the three gradients of lnorm.backward --------------------------------------------


def test_layernorm_gradients_pass_central_differences(layernorm_case):
    arrays, dy, grads = layernorm_case
    r = check_gradients(
        gradcheck.layernorm_loss(dy), grads, arrays, names=("x", "gamma", "beta")
    )
    assert r.passed and r.tol == 1e-8
    assert r.n_evaluations == 2 * (48 + 8 + 8)
    assert list(r.rel_errors) == ["x", "gamma", "beta"]
    assert all(e < 1e-8 for e in r.rel_errors.values())


def test_layernorm_gradients_pass_the_complex_step(layernorm_case):
    arrays, dy, grads = layernorm_case
    r = check_gradients(gradcheck.layernorm_loss(dy), grads, arrays, method="complex")
    assert r.passed and r.tol == 1e-13
    assert r.n_evaluations == 48 + 8 + 8
    assert r.max_rel_error < 1e-13


def test_layernorm_float32_loss_passes_central_differences(layernorm_case):
    arrays, dy, _ = layernorm_case
    arrays32 = [a.astype(np.float32) for a in arrays]
    dy32 = dy.astype(np.float32)
    # The float32 loss's own gradient: the float64 backward at its rounded x, gamma,
    # beta and dy.
    up = [a.astype(np.float64) for a in (*arrays32, dy32)]
    exact = lnorm.backward(up[3], lnorm.forward(*up[:3])[1])
    r = check_gradients(gradcheck.layernorm_loss(dy32), list(exact), arrays32)
    assert r.h == pytest.approx(2.0**-8) and r.tol == 1e-3
    # Near the optimum the error is of order u32**(2/3) = 1.5e-5.
    assert r.passed and r.max_rel_error < 2e-4


@pytest.mark.parametrize("method, tol", [("central", 1e-8), ("complex", 1e-12)])
def test_layernorm_gradients_pass_the_directional_check(method, tol):
    rng = np.random.default_rng(12)
    x = rng.normal(size=(4, 16, 64))
    gamma, beta = rng.normal(1.0, 0.5, size=64), rng.normal(size=64)
    dy = rng.normal(size=x.shape)
    grads = list(lnorm.backward(dy, lnorm.forward(x, gamma, beta)[1]))
    r = directional_check(
        gradcheck.layernorm_loss(dy),
        grads,
        [x, gamma, beta],
        np.random.default_rng(0),
        method=method,
    )
    assert r.passed and r.tol == tol
    assert r.rel_error < tol
    assert r.n_elements == x.size + 128
    assert abs(r.analytic) > 0.01 * r.scale  # the direction is not degenerate


def test_directional_check_costs_two_evaluations_whatever_the_size():
    calls = []

    def f(a, b):
        calls.append(a.shape)
        return smooth(a, b)

    for shape in [(3,), (64, 256)]:
        rng = np.random.default_rng(1)
        a, b = rng.normal(size=shape), rng.normal(size=shape)
        calls.clear()
        r = directional_check(f, smooth_grad(a, b), [a, b], rng)
        assert len(calls) == 2 and r.n_evaluations == 2
        assert r.passed
        calls.clear()
        r = directional_check(f, smooth_grad(a, b), [a, b], rng, method="complex")
        assert len(calls) == 1 and r.n_evaluations == 1
        assert r.rel_error < 1e-13


def test_directional_check_with_none_perturbs_only_the_other_arguments(ab):
    seen = []

    def f(a, b):
        seen.append((a.copy(), b.copy()))
        return smooth(a, b)

    g = smooth_grad(*ab)
    r = directional_check(f, [None, g[1]], ab, np.random.default_rng(2))
    assert r.passed and r.n_elements == ab[1].size
    for a_seen, b_seen in seen:
        assert np.array_equal(a_seen, ab[0])
        assert not np.array_equal(b_seen, ab[1])


def test_directional_check_is_reproducible_with_a_seeded_rng(ab):
    g = smooth_grad(*ab)
    r1 = directional_check(smooth, g, ab, np.random.default_rng(7))
    r2 = directional_check(smooth, g, ab, np.random.default_rng(7))
    assert r1.numeric == r2.numeric and r1.analytic == r2.analytic
    # ... and the direction is the rng's: another seed, another direction.
    r3 = directional_check(smooth, g, ab, np.random.default_rng(8))
    assert r3.analytic != r1.analytic and r3.passed


# --- wrong gradients fail every method ------------------------------------------------


def test_a_sign_bug_fails_every_method(layernorm_case):
    arrays, dy, grads = layernorm_case
    wrong = sign_bug(grads, arrays, dy)
    loss = gradcheck.layernorm_loss(dy)
    names = ("x", "gamma", "beta")
    for method in ("central", "complex"):
        r = check_gradients(loss, wrong, arrays, method=method, names=names)
        assert not r.passed
        assert r.max_rel_error > 0.1
        by_name = r.rel_errors
        assert by_name["x"] > 0.1  # the bug is in dx ...
        assert by_name["gamma"] < r.tol  # ... and only there
        assert by_name["beta"] < r.tol
        assert "FAIL" in repr(r) and "<- FAIL" in repr(r)
    for method in ("central", "complex"):
        r = directional_check(
            loss, wrong, arrays, np.random.default_rng(3), method=method
        )
        assert not r.passed and r.rel_error > 1e-3
    hs = np.logspace(-1, -10, 10)
    for method in ("central", "complex"):
        sweep = step_sweep(loss, arrays, hs, reference=wrong, method=method)
        assert sweep.best_rel_error > 0.1  # a floor no step moves


def test_a_wrong_gradient_of_a_known_function_fails_every_method(ab):
    g = smooth_grad(*ab)
    wrong = [g[0], 1.01 * g[1]]  # a 1% error in one argument
    assert not check_gradients(smooth, wrong, ab).passed
    assert not check_gradients(smooth, wrong, ab, method="complex").passed
    assert not directional_check(smooth, wrong, ab, np.random.default_rng(4)).passed
    assert not directional_check(
        smooth, wrong, ab, np.random.default_rng(4), method="complex"
    ).passed


def test_a_zero_gradient_has_relative_error_one(ab):
    g = smooth_grad(*ab)
    r = check_gradients(smooth, [np.zeros_like(g[0]), g[1]], ab)
    assert r.rows[0][2] == pytest.approx(1.0)
    d = directional_check(
        smooth, [np.zeros_like(g[0]), None], ab, np.random.default_rng(5)
    )
    assert d.rel_error == pytest.approx(1.0)


# --- the relative error and the report ------------------------------------------------


def test_relative_error_is_against_the_largest_entry_not_elementwise():
    g = [np.array([1.0, 1e-8])]
    r = compare_gradients(g, [np.array([1.0, 2e-8])], tol=1e-6)
    # Elementwise the second entry is 50% off; against the scale of the gradient, 1e-8.
    assert r.max_rel_error == pytest.approx(1e-8)
    assert r.passed and r.rows[0][4] == (1,)


def test_relative_error_of_two_zero_gradients_is_zero():
    r = compare_gradients([np.zeros(3)], [np.zeros(3)], tol=1e-12)
    assert r.max_rel_error == 0.0 and r.passed


def test_nan_in_a_gradient_fails():
    r = compare_gradients([np.array([1.0, np.nan])], [np.array([1.0, 2.0])], tol=1e-3)
    assert not r.passed and np.isnan(r.max_rel_error)
    assert r.rows[0][4] == (1,)


def test_compare_report_names_its_reference_not_a_step():
    r = compare_gradients([np.array([1.0, 2.0])], [np.array([1.0, 2.5])], tol=0.1)
    heading = repr(r).splitlines()[0]
    assert r.method == "reference" and not r.passed
    assert heading == "against a reference: FAIL (tol 1e-01)"


def test_repr_states_the_verdict_the_tolerance_and_the_denominator(layernorm_case):
    arrays, dy, grads = layernorm_case
    text = repr(
        check_gradients(
            gradcheck.layernorm_loss(dy), grads, arrays, names=("x", "gamma", "beta")
        )
    )
    assert "PASS" in text and "FAIL" not in text
    assert "tol 1e-08" in text and "128 evaluations" in text
    assert "rel err" in text and "worst index" in text
    for name in ("x", "gamma", "beta"):
        assert f"\n  {name} " in text
    d = directional_check(
        smooth,
        smooth_grad(*[np.ones(3), np.ones(3)]),
        [np.ones(3), np.ones(3)],
        np.random.default_rng(0),
    )
    assert "PASS" in repr(d) and "2 evaluations" in repr(d)


# --- inputs are never modified --------------------------------------------------------


def _snapshot(arrays):
    return [a.copy() for a in arrays]


def test_no_method_modifies_its_inputs(layernorm_case):
    arrays, dy, grads = layernorm_case
    before, grads_before = _snapshot(arrays), _snapshot(grads)
    loss = gradcheck.layernorm_loss(dy)
    check_gradients(loss, grads, arrays)
    check_gradients(loss, grads, arrays, method="complex")
    central_difference(loss, arrays)
    complex_step(loss, arrays)
    directional_check(loss, grads, arrays, np.random.default_rng(0))
    directional_check(loss, grads, arrays, np.random.default_rng(0), method="complex")
    step_sweep(loss, arrays, [1e-3, 1e-6])
    for a, b in zip(arrays + grads, before + grads_before):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize(
    "run",
    [
        lambda f, arrays: central_difference(f, arrays),
        lambda f, arrays: complex_step(f, arrays),
        lambda f, arrays: directional_check(
            f, [np.ones(3), np.ones(3)], arrays, np.random.default_rng(0)
        ),
    ],
)
def test_inputs_unchanged_when_f_raises_midway(run):
    arrays = [np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])]
    before = _snapshot(arrays)
    calls = []

    def f(a, b):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("loss failed")
        return (a * b).sum()

    with pytest.raises(RuntimeError, match="loss failed"):
        run(f, arrays)
    for a, b in zip(arrays, before):
        assert np.array_equal(a, b)


def test_inputs_unchanged_when_f_writes_into_its_arguments():
    arrays = [np.array([1.0, 2.0, 3.0])]

    def f(a):
        value = (a * a).sum()
        a[...] = 0.0  # a badly behaved loss
        return value

    # Each evaluation sees the unperturbed values but for its own step: the
    # estimates are those of sum(a**2), 2a (exact for a quadratic, up to rounding).
    est = central_difference(f, arrays)[0]
    np.testing.assert_allclose(est, [2.0, 4.0, 6.0], rtol=1e-9)
    r = directional_check(
        f, [2 * np.array([1.0, 2.0, 3.0])], arrays, np.random.default_rng(0)
    )
    assert r.passed and r.rel_error < 1e-8
    assert np.array_equal(arrays[0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize("method", ["central", "complex"])
def test_directional_check_gives_f_copies_of_the_unperturbed_arguments(method):
    arrays = [np.array([1.0, 2.0]), np.array([3.0, 4.0])]

    def f(a, b):
        value = (a * b).sum()
        a[...] = -1.0  # a badly behaved loss writes into both arguments
        b[...] = -1.0
        return value

    r = directional_check(
        f, [None, np.array([1.0, 2.0])], arrays, np.random.default_rng(0), method=method
    )
    assert r.passed
    assert np.array_equal(arrays[0], [1.0, 2.0]) and np.array_equal(
        arrays[1], [3.0, 4.0]
    )


def test_layernorm_loss_copies_dy():
    dy = np.array([[1.0, 0.0, 0.0, 0.0]])
    loss = gradcheck.layernorm_loss(dy)
    args = [np.array([[1.0, 2.0, 4.0, 8.0]]), np.full(4, 2.0), np.full(4, 0.5)]
    before = loss(*args)
    # By hand: L = sum(dy * y) = y_0 = 2 xhat_0 + 0.5, with mean 3.75,
    # x_0 - mean = -2.75 and var = (2.75^2 + 1.75^2 + 0.25^2 + 4.25^2) / 4 = 7.1875.
    assert before == pytest.approx(2 * -2.75 / np.sqrt(7.1875 + 1e-5) + 0.5, rel=1e-14)
    dy[...] = 5.0  # would make L = 5 sum(y) = 10 if the loss kept a view of dy
    assert loss(*args) == before


# --- bad arguments get clear errors ---------------------------------------------------


@pytest.mark.parametrize("h", [0.0, -1e-6, np.nan, np.inf])
def test_bad_step_is_a_value_error(ab, h):
    with pytest.raises(ValueError, match="h must be finite and > 0"):
        central_difference(smooth, ab, h=h)
    with pytest.raises(ValueError, match="h must be finite and > 0"):
        complex_step(smooth, ab, h=h)
    with pytest.raises(ValueError, match="h must be finite and > 0"):
        directional_check(smooth, smooth_grad(*ab), ab, np.random.default_rng(0), h=h)


def test_step_of_the_wrong_type_is_a_type_error(ab):
    with pytest.raises(TypeError, match="h must be a real number"):
        central_difference(smooth, ab, h="1e-6")


def test_gradient_shape_mismatch_names_the_argument(ab):
    g = smooth_grad(*ab)
    with pytest.raises(ValueError, match=r"grads\[1\] has shape \(4, 3\)"):
        check_gradients(smooth, [g[0], g[1].T], ab)
    with pytest.raises(ValueError, match=r"grads\[1\] has shape"):
        directional_check(smooth, [g[0], g[1][:2]], ab, np.random.default_rng(0))


def test_wrong_number_of_gradients_is_a_value_error(ab):
    with pytest.raises(ValueError, match="grads has 1 entries but arrays has 2"):
        check_gradients(smooth, [smooth_grad(*ab)[0]], ab)
    with pytest.raises(ValueError, match="all None"):
        check_gradients(smooth, [None, None], ab)


def test_arrays_must_be_a_list_of_floating_arrays(ab):
    with pytest.raises(TypeError, match="non-empty list of the arguments"):
        central_difference(lambda a: a.sum(), ab[0])
    with pytest.raises(TypeError, match=r"arrays\[0\] must have a floating dtype"):
        central_difference(lambda a: a.sum(), [np.arange(3)])
    with pytest.raises(TypeError, match="non-empty list"):
        central_difference(lambda: 0.0, [])


def test_f_must_return_a_scalar(ab):
    with pytest.raises(ValueError, match="scalar loss"):
        central_difference(lambda a, b: a * b, ab)
    with pytest.raises(ValueError, match="scalar loss"):
        complex_step(lambda a, b: a * b, ab)


def test_bad_tolerance_method_rng_and_sweep_arguments(ab):
    g = smooth_grad(*ab)
    with pytest.raises(ValueError, match="tol must be finite and > 0"):
        check_gradients(smooth, g, ab, tol=0.0)
    with pytest.raises(ValueError, match="method must be 'central' or 'complex'"):
        check_gradients(smooth, g, ab, method="forward")
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        directional_check(smooth, g, ab, 0)
    with pytest.raises(ValueError, match="non-empty"):
        step_sweep(smooth, ab, [])
    with pytest.raises(ValueError, match="every step in hs must be finite and > 0"):
        step_sweep(smooth, ab, [1e-3, 0.0])
    with pytest.raises(ValueError, match="names has 1 entries"):
        check_gradients(smooth, g, ab, names=("a",))
