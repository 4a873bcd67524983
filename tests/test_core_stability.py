"""Accuracy of lnorm.forward/backward where layer norm is numerically delicate:
large row offsets in float32, float16 inputs, and nearly constant rows (eps).

The reference is independent of lnorm.core: the mean and variance of the
input's values in exact rational arithmetic (lnorm.variance.exact), and the
chain rule of tests/reference.py evaluated from them in float64."""

import numpy as np
import pytest
from reference import (
    EPS,
    chain_rule_backward,
    chain_rule_forward,
    make_inputs,
    max_rel_err,
)

import lnorm
from lnorm.core import backward_formula, forward_formula
from lnorm.variance import exact


def exact_reference(x, gamma, beta, dy, eps=EPS):
    """y, dx, dgamma, dbeta in float64: the chain rule from the exact mean and variance
    of x."""
    stats = exact(x)
    x64, gamma64, beta64, dy64 = (a.astype(np.float64) for a in (x, gamma, beta, dy))
    y, t = chain_rule_forward(
        x64, gamma64, beta64, eps, mean=stats.mean[..., None], var=stats.var[..., None]
    )
    return (y, *chain_rule_backward(dy64, gamma64, t, eps))


def inputs(dtype, offset=0.0, scale=1.0, rows=4, D=1024, seed=0):
    return make_inputs((rows, D), dtype, seed, loc=offset, scale=scale, param_scale=0.1)


@pytest.mark.parametrize("offset", [0.0, 1.0, 1e2, 1e3, 1e4])
def test_float32_forward_and_backward_stay_accurate_up_to_1e4_std_offsets(offset):
    x, gamma, beta, dy = inputs(np.float32, offset=offset)
    y_ref, dx_ref, *_ = exact_reference(x, gamma, beta, dy)
    y, cache = lnorm.forward(x, gamma, beta, EPS)
    dx, _, _ = lnorm.backward(dy, cache)
    assert dx.dtype == y.dtype == np.float32
    assert max_rel_err(dx, dx_ref, axis=-1) < 1e-6
    assert max_rel_err(y, y_ref, axis=-1) < 1e-6


def test_the_1e6_bound_fails_for_float32_statistics_at_1e4_std():
    # The same bound, the same data, but the mean computed in float32 first:
    # xhat then carries u32 * |mean| / std ~ 6e-4, so the bound above is a real test.
    x, gamma, beta, dy = inputs(np.float32, offset=1e4)
    y_ref, dx_ref, *_ = exact_reference(x, gamma, beta, dy)
    y, _, rstd, xhat = forward_formula(x, gamma, beta, EPS)
    dx = backward_formula(dy, xhat, gamma, rstd)[0]
    assert dx.dtype == np.float32
    assert max_rel_err(y, y_ref, axis=-1) > 1e-5
    assert max_rel_err(dx, dx_ref, axis=-1) > 1e-6


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 1e3])
@pytest.mark.parametrize("offset", [0.0, 10.0])
def test_float16_results_are_within_a_few_float16_roundings(scale, offset):
    # scale 30 and 1e3: a sum of squares in float16 would overflow (D * scale^2 >
    # 65504). With float64 statistics each result is one rounding to float16
    # (u16 = 2**-11 of the largest value) away, plus the rounding of the
    # float16 xhat the backward reads: within 4 u16. Float16 statistics would
    # add about u16 * offset / std, 10 u16 at an offset of 10 std.
    x, gamma, beta, dy = inputs(np.float16, offset=offset * scale, scale=scale)
    y_ref, dx_ref, dgamma_ref, dbeta_ref = exact_reference(x, gamma, beta, dy)
    y, cache = lnorm.forward(x, gamma, beta, EPS)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    assert y.dtype == dx.dtype == np.float16
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    bound = 4 * 2.0**-11
    assert max_rel_err(y, y_ref, axis=-1) < bound
    assert max_rel_err(dx, dx_ref, axis=-1) < bound
    assert max_rel_err(dgamma, dgamma_ref, axis=-1) < bound
    assert max_rel_err(dbeta, dbeta_ref, axis=-1) < bound


@pytest.mark.parametrize("sigma", [0.0, 1e-9, 1e-6, 1e-4, 3e-3, 1.0])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_eps_bounds_rstd_and_the_gradient_of_nearly_constant_rows(sigma, eps):
    # |dx_j| <= rstd |gamma|_inf |dy|_inf (2 + sqrt(D-1) var rstd^2), rstd <=
    # 1/sqrt(eps).
    x, gamma, _, dy = inputs(np.float64, scale=sigma, D=256, rows=8, seed=1)
    x = (
        x + 0.75
    )  # the bound is translation invariant; 0.75 + sigma*z is exact enough here
    beta = np.zeros_like(gamma)
    _, cache = lnorm.forward(x, gamma, beta, eps)
    dx, _, _ = lnorm.backward(dy, cache)
    var = exact(x).var
    rstd = 1.0 / np.sqrt(var + eps)
    assert np.all(cache.rstd <= 1.0 / np.sqrt(eps))
    np.testing.assert_allclose(cache.rstd, rstd, rtol=1e-12)
    g_inf = np.abs(gamma).max() * np.abs(dy).max(-1)
    bound = rstd * g_inf * (2.0 + np.sqrt(x.shape[-1] - 1) * var * rstd**2)
    assert np.all(np.abs(dx).max(-1) <= bound)
    # The bound only limits dx; its values match the exact reference too.
    dx_ref = exact_reference(x, gamma, beta, dy, eps)[1]
    assert max_rel_err(dx, dx_ref, axis=-1) < 1e-12
    if sigma == 0.0:
        # A constant row: xhat = 0, so dx = (g - mean(g)) / sqrt(eps) exactly in form.
        g = gamma * dy
        np.testing.assert_allclose(
            dx, (g - g.mean(-1, keepdims=True)) / np.sqrt(eps), rtol=1e-12
        )
        assert np.all(np.abs(dx).max(-1) <= 2.0 * g_inf / np.sqrt(eps))
