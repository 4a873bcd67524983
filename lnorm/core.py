"""Layer normalization over the last axis: forward, backward and the cache between them.

The forward computes, for each row ``x`` of length ``D`` (the last axis),

.. math::

    \\mu = \\frac1D \\sum_j x_j, \\qquad
    \\sigma^2 = \\frac1D \\sum_j (x_j - \\mu)^2, \\qquad
    \\mathrm{rstd} = \\frac{1}{\\sqrt{\\sigma^2 + \\varepsilon}},

    \\hat x = (x - \\mu)\\,\\mathrm{rstd}, \\qquad y = \\gamma \\odot \\hat x + \\beta .

The backward is the vector-Jacobian product written in its compact form
(two row reductions, nothing the forward already computed is recomputed):

.. math::

    g = \\gamma \\odot dy, \\qquad
    dx = \\mathrm{rstd}\\,\\bigl(g - \\overline{g} - \\hat x\\,\\overline{g \\hat x}\\bigr),

    d\\gamma = \\sum_{\\text{rows}} dy \\odot \\hat x, \\qquad
    d\\beta = \\sum_{\\text{rows}} dy ,

where a bar is the mean over the row.

Dtype policy
------------
float16, float32 and float64 inputs are accepted. On the CPU every statistic,
the centring ``x - mean`` and every reduction are computed in float64, whatever
the input dtype, and results are rounded once to the input dtype at the end.
Why float64 rather than a compensated float32 mean: a float32 mean carries an
error of about ``u32 * |mean|`` (``u32 = 2**-24``), and ``x - mean`` passes that
error straight into ``xhat`` as ``u32 * |mean| / std``; at a row mean of 1e4
standard deviations that is an error of about 6e-4 in every ``xhat``. In
float64 the same error is about ``1e-16 * |mean| / std``, below float32's own
rounding for any offset a float32 input can carry meaningfully (a float32 row
whose ``|mean| / std`` exceeds ``2**24`` has no information left in its spread).

What the cache keeps
--------------------
``LayerNormCache`` keeps ``xhat`` (in the input dtype: one activation-sized
tensor), ``rstd`` (float64, one number per row) and a read-only copy of
``gamma``. Keeping ``xhat`` rather than ``x`` with the mean means the backward
never repeats the centring, so the accuracy won by the float64 centring is
not lost or paid for twice. The cost chapter measures the alternatives.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["LayerNormCache", "forward", "backward", "forward_formula"]

#: Floating dtypes the public functions accept.
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

#: Dtype in which statistics and reductions are accumulated on the CPU.
ACC_DTYPE = np.dtype(np.float64)


@dataclass(frozen=True)
class LayerNormCache:
    """What the forward saves for the backward (all arrays read-only).

    Attributes
    ----------
    xhat : ndarray, shape (..., D), dtype of ``x``
        The normalized input ``(x - mean) * rstd``.
    rstd : ndarray, shape (...,), float64
        ``1 / sqrt(var + eps)`` for every row.
    gamma : ndarray, shape (D,)
        A read-only copy of the scale, needed for ``g = gamma * dy``.
    """

    xhat: np.ndarray
    rstd: np.ndarray
    gamma: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the input ``x`` (and of ``dy`` and ``dx``)."""
        return self.xhat.shape

    @property
    def dtype(self) -> np.dtype:
        """Dtype of the input ``x`` (and of ``dx``)."""
        return self.xhat.dtype


def _as_float_array(a, name: str) -> np.ndarray:
    """Return ``a`` as an ndarray of a supported floating dtype, or raise."""
    arr = np.asarray(a)
    if arr.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, float32 or float64); "
            f"got {arr.dtype}. Convert it first, e.g. {name}.astype(np.float32)."
        )
    return arr


def _check_eps(eps) -> float:
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number such as 1e-5; got {type(eps).__name__}.")
    eps = float(eps)
    if not np.isfinite(eps) or eps <= 0.0:
        raise ValueError(
            f"eps must be finite and > 0 (it bounds rstd by 1/sqrt(eps)); got {eps!r}. "
            "Use a small positive value such as 1e-5."
        )
    return eps


def _check_param(p, name: str, D: int) -> np.ndarray:
    arr = _as_float_array(p, name)
    if arr.shape != (D,):
        raise ValueError(
            f"{name} must have shape (D,) = ({D},) to match the last axis of x; "
            f"got shape {arr.shape}."
        )
    return arr


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def forward_formula(x, gamma, beta, eps: float = 1e-5):
    """The forward as one plain expression, in the dtype of its arguments.

    No validation and no dtype policy: it evaluates the formula of the module
    docstring in whatever arithmetic ``x`` carries. It is complex-safe
    (``xc * xc``, never ``abs``), so complex-step differentiation through it is
    exact; the gradient-checking chapter differentiates this function, which
    is the same formula :func:`forward` evaluates in float64.

    Returns
    -------
    y, mean, rstd, xhat
        ``mean`` and ``rstd`` have shape ``x.shape[:-1] + (1,)``.
    """
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    return gamma * xhat + beta, mean, rstd, xhat


def forward(x, gamma, beta, eps: float = 1e-5) -> tuple[np.ndarray, LayerNormCache]:
    """Layer normalization over the last axis.

    .. math::

        y = \\gamma \\odot \\frac{x - \\mu}{\\sqrt{\\sigma^2 + \\varepsilon}} + \\beta,
        \\qquad \\mu, \\sigma^2 \\text{ the mean and (biased) variance of each row.}

    Parameters
    ----------
    x : array_like, shape (..., D)
        float16, float32 or float64; at least one dimension; any number of
        leading dimensions, including zero rows. Not modified.
    gamma, beta : array_like, shape (D,)
        Scale and shift, floating. Not modified.
    eps : float, default 1e-5
        Finite and > 0; added to the variance, so ``rstd <= 1/sqrt(eps)``.

    Returns
    -------
    y : ndarray, shape and dtype of ``x``
    cache : LayerNormCache
        ``xhat`` and ``rstd`` (and ``gamma``), what :func:`backward` needs.

    Notes
    -----
    Statistics are two-pass (mean, then the mean of squared deviations) in
    float64; the mean is clamped to the row's [min, max], which makes a
    constant row exact (``xhat == 0``, ``y == beta``) and never moves a
    correctly rounded mean. See the module docstring for the dtype policy.
    """
    x = _as_float_array(x, "x")
    if x.ndim == 0:
        raise ValueError(
            "x must have at least one dimension, shape (..., D); got a 0-d array. "
            "Reshape a single value to x.reshape(1, 1) if that is what you mean."
        )
    D = x.shape[-1]
    if D < 1:
        raise ValueError("x must have a last axis of length D >= 1; got D = 0.")
    gamma = _check_param(gamma, "gamma", D)
    beta = _check_param(beta, "beta", D)
    eps = _check_eps(eps)

    # Non-finite values propagate within their row (inf - inf = nan there);
    # that is the documented behaviour, not an event worth a warning.
    with np.errstate(invalid="ignore"):
        y, mean, rstd, xhat = _forward64(x.astype(ACC_DTYPE), gamma, beta, eps)

    cache = LayerNormCache(
        xhat=_readonly(xhat.astype(x.dtype)),
        rstd=_readonly(rstd[..., 0]),
        gamma=_readonly(np.array(gamma, copy=True)),
    )
    return y.astype(x.dtype), cache


def _forward64(x64: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float):
    """Two-pass statistics, xhat and y of float64 rows; the arithmetic of :func:`forward`."""
    D = x64.shape[-1]
    mean = x64.mean(axis=-1, keepdims=True)
    # The true mean lies in [min, max]; rounding can push it just outside a
    # constant row's single value, which would make xhat nonzero there.
    np.clip(mean, x64.min(axis=-1, keepdims=True), x64.max(axis=-1, keepdims=True), out=mean)
    xc = x64 - mean
    var = np.einsum("...d,...d->...", xc, xc)[..., None] / D
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    y = xhat * gamma.astype(ACC_DTYPE) + beta.astype(ACC_DTYPE)
    return y, mean, rstd, xhat


def backward(dy, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of layer normalization, from the upstream gradient ``dy``.

    With ``g = gamma * dy`` and a bar for the mean over the row,

    .. math::

        dx = \\mathrm{rstd}\\,\\bigl(g - \\overline{g} - \\hat x\\,\\overline{g\\hat x}\\bigr),
        \\qquad d\\gamma = \\sum_{\\text{rows}} dy \\odot \\hat x,
        \\qquad d\\beta = \\sum_{\\text{rows}} dy .

    Parameters
    ----------
    dy : array_like, shape of ``x``
        Upstream gradient dL/dy, floating. Not modified.
    cache : LayerNormCache
        From :func:`forward`.

    Returns
    -------
    dx : ndarray, shape and dtype of ``x``
    dgamma, dbeta : ndarray, shape (D,), dtype of ``gamma``
        Summed over every leading axis (zero rows give zeros).

    Notes
    -----
    Two row reductions (``mean(g)`` and ``mean(g * xhat)``) and the two column
    sums; ``dy * xhat`` is formed once and serves both ``dgamma`` and
    ``mean(g * xhat) = mean(gamma * (dy * xhat))``. All arithmetic is float64.
    """
    if not isinstance(cache, LayerNormCache):
        raise TypeError(
            f"cache must be the LayerNormCache returned by lnorm.forward; got {type(cache).__name__}."
        )
    dy = _as_float_array(dy, "dy")
    if dy.shape != cache.shape:
        raise ValueError(
            f"dy must have the shape of x, {cache.shape}, as recorded in the cache; got {dy.shape}. "
            "Pass the gradient of the loss with respect to this forward's output y."
        )
    D = cache.shape[-1]
    gamma = cache.gamma.astype(ACC_DTYPE)
    xhat = cache.xhat.astype(ACC_DTYPE)
    dy64 = dy.astype(ACC_DTYPE)

    with np.errstate(invalid="ignore"):  # non-finite rows stay non-finite, silently
        dy_xhat = dy64 * xhat
        g = dy64 * gamma
        mean_g = g.sum(axis=-1, keepdims=True) / D
        mean_gxhat = (dy_xhat @ gamma)[..., None] / D
        dx = cache.rstd[..., None] * (g - mean_g - xhat * mean_gxhat)

    lead = tuple(range(dy.ndim - 1))
    dgamma = dy_xhat.sum(axis=lead)
    dbeta = dy64.sum(axis=lead)
    pdt = cache.gamma.dtype
    return dx.astype(cache.dtype), dgamma.astype(pdt), dbeta.astype(pdt)
