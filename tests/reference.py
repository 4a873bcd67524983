"""Helpers the core tests share: seeded inputs, an independent float64
reference (the chain rule, node by node) and the max-norm relative error."""

import numpy as np

from lnorm.inputs import make_inputs as draw_inputs

EPS = 1e-5


def make_inputs(shape, dtype=np.float64, seed=0, loc=0.0, scale=1.0, param_scale=0.5):
    """``lnorm.inputs.make_inputs`` with the core tests' defaults: x ~ N(loc, scale),
    gamma ~ N(1, param_scale), beta ~ N(0, param_scale), dy ~ N(0, 1)."""
    return draw_inputs(
        shape, dtype, seed, loc=loc, scale=scale, param_scale=param_scale
    )


def chain_rule_forward(x, gamma, beta, eps=EPS, mean=None, var=None):
    """Forward as a graph of small nodes; returns y and every intermediate.

    ``mean`` and ``var`` (shape ``(..., 1)``), when given, replace the
    computed statistics: the exact ones of lnorm.variance.exact, for example.
    """
    D = x.shape[-1]
    mu = x.sum(-1, keepdims=True) / D if mean is None else mean
    xc = x - mu
    if var is None:
        var = (xc**2).sum(-1, keepdims=True) / D
    std = np.sqrt(var + eps)
    rstd = 1.0 / std
    xhat = xc * rstd
    y = gamma * xhat + beta
    return y, dict(D=D, xc=xc, var=var, rstd=rstd, xhat=xhat)


def chain_rule_backward(dy, gamma, t, eps=EPS):
    """Backpropagate through each node in turn: affine -> normalize -> variance ->
    mean."""
    D, xc, var, rstd, xhat = t["D"], t["xc"], t["var"], t["rstd"], t["xhat"]
    lead = tuple(range(dy.ndim - 1))
    dgamma = (dy * xhat).sum(lead)
    dbeta = dy.sum(lead)
    dxhat = dy * gamma
    # xhat = xc * rstd: two paths, through xc directly and through rstd.
    dxc = dxhat * rstd
    drstd = (dxhat * xc).sum(-1, keepdims=True)
    # rstd = (var + eps) ** -1/2
    dvar = drstd * (-0.5) * (var + eps) ** -1.5
    # var = sum(xc**2) / D
    dxc = dxc + dvar * 2.0 * xc / D
    # xc = x - mu, mu = sum(x) / D
    dmu = -dxc.sum(-1, keepdims=True)
    dx = dxc + dmu / D
    return dx, dgamma, dbeta


def max_rel_err(a, ref, axis=None):
    """Max-norm relative error ||a - ref||_inf / ||ref||_inf.

    With ``axis=-1``: that error for each row, and the worst row.
    """
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(a - ref).max(axis) / np.abs(ref).max(axis)))


def dx_term_sizes(dy, cache):
    """Per element, the size of the terms dx is summed from, in float64:
    rstd * (|g| + mean|g| + |xhat| * mean|g * xhat|) with g = gamma * dy."""
    g = np.abs(dy.astype(np.float64) * cache.gamma)
    xh = np.abs(cache.xhat.astype(np.float64))
    return cache.rstd[..., None] * (
        g + g.mean(-1, keepdims=True) + xh * (g * xh).mean(-1, keepdims=True)
    )


def assert_within_rounding_of_terms(dy, cache, ref, got, dx_factor, param_factor):
    """``got`` = (dx, dgamma, dbeta) is within one unit in the last place of ``ref``
    plus ``dx_factor`` times the size of dx's terms and ``param_factor`` times the
    sums of |dy * xhat| and |dy| that dgamma and dbeta add up."""
    dx, dgamma, dbeta = ref
    ulp = np.spacing(np.abs(dx).astype(dx.dtype)).astype(np.float64)
    bound = ulp + dx_factor * dx_term_sizes(dy, cache)
    assert np.all(np.abs(got[0].astype(np.float64) - dx) <= bound)
    lead = tuple(range(dy.ndim - 1))
    dy64 = dy.astype(np.float64)
    for r, g, terms in [
        (dgamma, got[1], np.abs(dy64 * cache.xhat).sum(lead)),
        (dbeta, got[2], np.abs(dy64).sum(lead)),
    ]:
        ulp = np.spacing(np.abs(r)).astype(np.float64)
        assert np.all(np.abs(g.astype(np.float64) - r) <= ulp + param_factor * terms)


# --- functions with known gradients (tests of finitediff and gradcheck) -------


def cubic(a, b):
    """A polynomial of degree three: sum(a**2 * b) + sum(b**3)."""
    return (a * a * b).sum() + (b * b * b).sum()


def cubic_grad(a, b):
    return [2 * a * b, a * a + 3 * b * b]


def smooth(a, b):
    """Not a polynomial: sum(sin(a) exp(b)) + sum(log(1 + a**2)); complex-safe."""
    return (np.sin(a) * np.exp(b)).sum() + np.log(1 + a * a).sum()


def smooth_grad(a, b):
    return [np.cos(a) * np.exp(b) + 2 * a / (1 + a * a), np.sin(a) * np.exp(b)]


def rel_error(g, r):
    """The chapter's relative error, computed independently of the module."""
    return np.abs(g - r).max() / max(np.abs(g).max(), np.abs(r).max())
