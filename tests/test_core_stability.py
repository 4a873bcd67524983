"""Accuracy of lnorm.forward/backward where layer norm is numerically delicate:
large row offsets in float32, float16 inputs, and nearly constant rows (eps).

The reference is independent of lnorm.core: the mean and variance of the
input's values in exact rational arithmetic (lnorm.variance.exact), and the
forward and compact backward evaluated from them in float64."""

import numpy as np
import pytest

import lnorm
from lnorm.core import forward_formula
from lnorm.variance import exact

EPS = 1e-5


def reference(x, gamma, beta, dy, eps=EPS):
    """y, dx and xhat in float64 from the exact statistics of x's values."""
    stats = exact(x)
    rstd = 1.0 / np.sqrt(stats.var[..., None] + eps)
    xhat = (x.astype(np.float64) - stats.mean[..., None]) * rstd
    gamma64, dy64 = gamma.astype(np.float64), dy.astype(np.float64)
    g = gamma64 * dy64
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return gamma64 * xhat + beta.astype(np.float64), dx, xhat


def inputs(dtype, offset=0.0, scale=1.0, rows=4, D=1024, seed=0):
    rng = np.random.default_rng(seed)
    x = (offset + scale * rng.standard_normal((rows, D))).astype(dtype)
    gamma = rng.normal(1.0, 0.1, D).astype(dtype)
    beta = rng.normal(0.0, 0.1, D).astype(dtype)
    dy = rng.standard_normal((rows, D)).astype(dtype)
    return x, gamma, beta, dy


def max_norm_rel_err(a, ref):
    """max over rows of max|a - ref| / max|ref|."""
    a = np.asarray(a, np.float64)
    return float(np.max(np.abs(a - ref).max(-1) / np.abs(ref).max(-1)))


def centred_backward(dy, xhat, gamma, rstd):
    """The compact backward in the dtype of its arguments (no accuracy policy)."""
    g = gamma * dy
    return rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


@pytest.mark.parametrize("offset", [0.0, 1.0, 1e2, 1e3, 1e4])
def test_float32_forward_and_backward_stay_accurate_up_to_1e4_std_offsets(offset):
    x, gamma, beta, dy = inputs(np.float32, offset=offset)
    y_ref, dx_ref, _ = reference(x, gamma, beta, dy)
    y, cache = lnorm.forward(x, gamma, beta, EPS)
    dx, _, _ = lnorm.backward(dy, cache)
    assert dx.dtype == y.dtype == np.float32
    assert max_norm_rel_err(dx, dx_ref) < 1e-6
    assert max_norm_rel_err(y, y_ref) < 1e-6


def test_the_1e6_bound_fails_for_float32_statistics_at_1e4_std():
    # The same bound, the same data, but the mean computed in float32 first:
    # xhat then carries u32 * |mean| / std ~ 6e-4, so the bound above is a real test.
    x, gamma, beta, dy = inputs(np.float32, offset=1e4)
    y_ref, dx_ref, _ = reference(x, gamma, beta, dy)
    y, _, rstd, xhat = forward_formula(x, gamma, beta, EPS)
    dx = centred_backward(dy, xhat, gamma, rstd)
    assert dx.dtype == np.float32
    assert max_norm_rel_err(y, y_ref) > 1e-5
    assert max_norm_rel_err(dx, dx_ref) > 1e-6


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 1e3])
@pytest.mark.parametrize("offset", [0.0, 10.0])
def test_float16_inputs_stay_within_1e2(scale, offset):
    # scale 30 and 1e3: a sum of squares in float16 would overflow (D * scale^2 > 65504).
    x, gamma, beta, dy = inputs(np.float16, offset=offset * scale, scale=scale)
    y_ref, dx_ref, xhat_ref = reference(x, gamma, beta, dy)
    y, cache = lnorm.forward(x, gamma, beta, EPS)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    assert y.dtype == dx.dtype == np.float16
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    assert max_norm_rel_err(y, y_ref) < 1e-2
    assert max_norm_rel_err(dx, dx_ref) < 1e-2
    dgamma_ref = (dy.astype(np.float64) * xhat_ref).sum(0)
    dbeta_ref = dy.astype(np.float64).sum(0)
    assert max_norm_rel_err(dgamma, dgamma_ref) < 1e-2
    assert max_norm_rel_err(dbeta, dbeta_ref) < 1e-2


@pytest.mark.parametrize("sigma", [0.0, 1e-9, 1e-6, 1e-4, 3e-3, 1.0])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_eps_bounds_rstd_and_the_gradient_of_nearly_constant_rows(sigma, eps):
    # |dx_j| <= rstd |gamma|_inf |dy|_inf (2 + sqrt(D-1) var rstd^2), rstd <= 1/sqrt(eps).
    x, gamma, _, dy = inputs(np.float64, scale=sigma, D=256, rows=8, seed=1)
    x = x + 0.75  # the bound is translation invariant; 0.75 + sigma*z is exact enough here
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
    if sigma == 0.0:
        # A constant row: xhat = 0, so dx = (g - mean(g)) / sqrt(eps) exactly in form.
        g = gamma * dy
        np.testing.assert_allclose(dx, (g - g.mean(-1, keepdims=True)) / np.sqrt(eps), rtol=1e-12)
        assert np.all(np.abs(dx).max(-1) <= 2.0 * g_inf / np.sqrt(eps))
