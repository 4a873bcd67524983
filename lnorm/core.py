"""Layer normalization over the last axis: the formulas and the library functions.

For each row ``x`` of length ``D`` (the last axis), with ``mean`` the mean
over the row and ``g = gamma * dy``::

    mean = sum(x) / D                    var  = mean((x - mean)**2)
    rstd = 1 / sqrt(var + eps)           xhat = (x - mean) * rstd
    y    = gamma * xhat + beta
    dx   = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy

(derived in the chapter "Deriving the backward", ``book/02_derivation.md``).
:func:`forward_formula` and :func:`backward_formula` are these lines as plain
NumPy, with no checks. :func:`forward` and :func:`backward` (``lnorm.forward``
and ``lnorm.backward``) add the checks of :mod:`lnorm.validate`, the dtype
policy below, a :class:`~lnorm.cache.LayerNormCache` between them, and two
schedules:

* ``block_rows=None`` (default): the fused loops of :mod:`lnorm.fused`, one
  compiled pass per row, the fastest;
* ``block_rows=n``: the formulas in float64 on blocks of ``n`` rows, whose
  temporaries stay in cache for a modest ``n`` (:func:`tile_rows`); ``n`` at
  least the number of rows is the plain op-by-op program.

The schedules agree to float64 rounding before the final rounding (the sums
behind ``dgamma`` and ``dbeta`` are associated differently, so their last bits
can differ; each schedule gives the same bits on every call). Non-finite
values stay in their row; inputs are never modified.

Dtype policy
------------
float16, float32 and float64 inputs are accepted. Every statistic (two-pass:
the mean, then the mean of squared deviations), the centring ``x - mean`` and
every reduction run in float64, and each result is rounded once to the input
dtype (``dgamma`` and ``dbeta`` to that of ``gamma``). A float32 mean would
err by up to about ``u32 * |mean|`` (``u32 = 2**-24``) from its rounding
alone, which ``x - mean`` passes into every ``xhat`` as ``u32 * |mean| /
std``. With a float64 mean that error, measured against the row's largest
``|xhat|``, is below float32's own rounding for any offset a float32 row can
carry; measured against a much smaller ``xhat`` it can be larger. The chapter
"Layer norm in low precision" (``book/04b_low_precision.md``) measures both.
"""

from __future__ import annotations

import numpy as np

from . import fused
from .cache import ACC_DTYPE, LayerNormCache, make_cache
from .validate import (
    SUPPORTED_DTYPES,
    as_rows,
    check_backward_out,
    check_dy,
    check_eps,
    check_forward_out,
    check_int,
    check_param,
)

__all__ = [
    "forward",
    "backward",
    "forward_formula",
    "backward_formula",
    "tile_rows",
    "SUPPORTED_DTYPES",
    "TILE_BYTES",
]

# --- the formulas -----------------------------------------------------------------

def forward_formula(x, gamma, beta, eps: float = 1e-5):
    """Compute the forward as plain NumPy, one operation per line.

    No validation and no dtype policy: every operation runs in the dtype NumPy's
    promotion of the arguments gives. It is complex-safe (``xc * xc``, never
    ``abs``), so the complex step through it is accurate to rounding. The
    chapter "Layer normalization, forward" explains each line.

    Parameters
    ----------
    x : ndarray, shape (..., D)
        Rows to normalize; real or complex.
    gamma, beta : ndarray, shape (D,), or scalars
        Scale and shift, broadcast against ``x``.
    eps : float, default 1e-5
        Added to the variance; zero is allowed here.

    Returns
    -------
    y, mean, rstd, xhat : ndarray
        ``y`` and ``xhat`` of the shape of ``x``; ``mean`` and ``rstd`` with a
        trailing axis of one.

    Examples
    --------
    >>> y, mean, rstd, xhat = forward_formula(np.array([[1.0, 3.0]]), 1.0, 0.0, 0.0)
    >>> y, mean, rstd
    (array([[-1.,  1.]]), array([[2.]]), array([[1.]]))
    """
    # Each full-size operation on a line of its own, with a named temporary:
    # lnorm.cost counts the memory traffic of exactly these lines.
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    sq = xc * xc
    var = sq.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    scaled = gamma * xhat
    y = scaled + beta
    return y, mean, rstd, xhat


def backward_formula(dy, xhat, gamma, rstd):
    """Compute the compact backward as plain NumPy, in the dtype of its arguments.

    ``dy * xhat`` is formed once and serves both ``dgamma`` and
    ``mean(g * xhat) = (dy * xhat) @ gamma / D``.

    Parameters
    ----------
    dy, xhat : ndarray, shape (..., D)
        Upstream gradient dL/dy and the normalized input.
    gamma : ndarray, shape (D,)
        The scale.
    rstd : ndarray, shape (..., 1)
        ``1 / sqrt(var + eps)`` of each row, as :func:`forward_formula` returns it.

    Returns
    -------
    dx : ndarray, shape (..., D)
    dgamma, dbeta : ndarray, shape (D,)
        Summed over every leading axis.

    Examples
    --------
    >>> xhat = np.array([[-1.0, 1.0]])
    >>> dx, dgamma, dbeta = backward_formula(np.array([[0.0, 1.0]]), xhat,
    ...                                      np.ones(2), np.ones((1, 1)))
    >>> dx, dgamma, dbeta
    (array([[0., 0.]]), array([0., 1.]), array([0., 1.]))
    """
    # Each full-size operation on a line of its own, with a named temporary:
    # lnorm.cost counts the memory traffic of exactly these lines.
    D = xhat.shape[-1]
    lead = tuple(range(dy.ndim - 1))
    g = dy * gamma
    dy_xhat = dy * xhat
    mean_g = g.sum(axis=-1, keepdims=True) / D
    mean_gxhat = (dy_xhat @ gamma)[..., None] / D
    u = g - mean_g
    t = xhat * mean_gxhat
    v = u - t
    dx = rstd * v
    dgamma = dy_xhat.sum(axis=lead)
    dbeta = dy.sum(axis=lead)
    return dx, dgamma, dbeta


# --- the library functions --------------------------------------------------------

_BLOCK_HINT = "Pass None (fused) or rows per block, e.g. lnorm.core.tile_rows(D)."


def forward(
    x, gamma, beta, eps: float = 1e-5, *, block_rows: int | None = None, out=None
) -> tuple[np.ndarray, LayerNormCache]:
    """Normalize each row over the last axis, then scale and shift it.

    Parameters
    ----------
    x : array_like, shape (..., D)
        float16, float32 or float64; any number of rows, zero included.
    gamma, beta : array_like, shape (D,)
        Scale and shift, floating.
    eps : float, default 1e-5
        Finite and > 0; added to the variance, so ``rstd <= 1/sqrt(eps)``.
    block_rows : int, optional
        The schedule (see the module docstring); every block size gives the
        same bits, since every step is row by row.
    out : tuple of two ndarrays, optional
        ``(y, xhat)`` to write into, as in :func:`lnorm.fused.forward`; the
        cache then holds a read-only view of ``xhat``.

    Returns
    -------
    y : ndarray, shape and dtype of ``x``
    cache : LayerNormCache
        ``xhat``, ``rstd`` and ``gamma``, all :func:`backward` needs (so it never
        repeats the centring). A constant row gives ``xhat == 0`` exactly.

    Examples
    --------
    >>> import lnorm
    >>> x = np.array([[1.0, 2.0, 3.0]])
    >>> y, cache = lnorm.forward(x, np.ones(3), np.zeros(3))
    >>> np.round(y, 3)
    array([[-1.225,  0.   ,  1.225]])
    >>> y_blocks, _ = lnorm.forward(x, np.ones(3), np.zeros(3), block_rows=1)
    >>> bool(np.allclose(y, y_blocks))
    True
    """
    if block_rows is None:
        return fused.forward(x, gamma, beta, eps, out=out)
    x = as_rows(x, "x")
    D = x.shape[-1]
    gamma = check_param(gamma, "gamma", D)
    beta = check_param(beta, "beta", D)
    eps = check_eps(eps)
    block_rows = check_int(block_rows, "block_rows", 1, _BLOCK_HINT)
    y_out, xhat_out = check_forward_out(out, x)

    x2 = x.reshape(-1, D)
    y, xhat = (np.empty(x2.shape, x.dtype) if buf is None else buf.reshape(x2.shape)
               for buf in (y_out, xhat_out))
    rstd = np.empty(x2.shape[0], dtype=ACC_DTYPE)
    gamma64, beta64 = gamma.astype(ACC_DTYPE), beta.astype(ACC_DTYPE)
    # Non-finite values propagate within their row (inf - inf = nan there).
    with np.errstate(invalid="ignore"):
        for r0 in range(0, x2.shape[0], block_rows):
            blk = slice(r0, r0 + block_rows)
            # C order: each row summed in one order, whatever the input's layout.
            xb = x2[blk].astype(ACC_DTYPE, order="C")
            yb, rb, hb = _forward64(xb, gamma64, beta64, eps)
            y[blk], xhat[blk], rstd[blk] = yb, hb, rb[:, 0]
    cache = make_cache(xhat.reshape(x.shape), rstd.reshape(x.shape[:-1]), gamma)
    return (y.reshape(x.shape) if y_out is None else y_out), cache


def _forward64(x64: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float):
    """y, rstd, xhat of float64 rows: :func:`forward_formula`, constant rows exact."""
    mean = x64.mean(axis=-1, keepdims=True)
    # The true mean lies in [min, max]; rounding can push it just outside a
    # constant row's single value, which would make xhat nonzero there.
    np.clip(
        mean, x64.min(axis=-1, keepdims=True), x64.max(axis=-1, keepdims=True), out=mean
    )
    xc = x64 - mean
    var = np.einsum("...d,...d->...", xc, xc)[..., None] / x64.shape[-1]
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    return xhat * gamma + beta, rstd, xhat


def backward(
    dy, cache: LayerNormCache, *, block_rows: int | None = None, out=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute the gradients of layer normalization from the upstream gradient ``dy``.

    Parameters
    ----------
    dy : array_like, shape of ``x``
        Upstream gradient dL/dy, floating.
    cache : LayerNormCache
        From :func:`forward`.
    block_rows : int, optional
        The schedule (see the module docstring).
    out : ndarray, optional
        An array of the shape and dtype of ``x`` to write ``dx`` into.

    Returns
    -------
    dx : ndarray, shape and dtype of ``x``
    dgamma, dbeta : ndarray, shape (D,), dtype of ``gamma``
        Summed over every leading axis (zero rows give zeros).

    Examples
    --------
    >>> import lnorm
    >>> y, cache = lnorm.forward(np.array([[1.0, 2.0, 3.0]]), np.ones(3), np.zeros(3))
    >>> dx, dgamma, dbeta = lnorm.backward(np.array([[1.0, 0.0, 0.0]]), cache)
    >>> np.round(dx, 4)
    array([[ 0.2041, -0.4082,  0.2041]])
    >>> np.round(dgamma, 4), dbeta
    (array([-1.2247,  0.    ,  0.    ]), array([1., 0., 0.]))
    """
    if block_rows is None:
        return fused.backward(dy, cache, out=out)
    dy = check_dy(dy, cache)
    block_rows = check_int(block_rows, "block_rows", 1, _BLOCK_HINT)
    out = check_backward_out(out, dy, cache)
    shape, D = cache.shape, cache.shape[-1]
    dy2, xhat2 = dy.reshape(-1, D), cache.xhat.reshape(-1, D)
    rstd = cache.rstd.reshape(-1, 1)
    rows = dy2.shape[0]
    gamma = cache.gamma.astype(ACC_DTYPE)
    dx = np.empty(dy2.shape, cache.dtype) if out is None else out.reshape(dy2.shape)
    dgamma = np.zeros(D, dtype=ACC_DTYPE)
    dbeta = np.zeros(D, dtype=ACC_DTYPE)
    m = max(1, min(block_rows, rows))
    dy_buf = np.empty((m, D), dtype=ACC_DTYPE)
    xhat_buf = np.empty((m, D), dtype=ACC_DTYPE)
    with np.errstate(invalid="ignore"):  # non-finite rows stay non-finite, silently
        for r0 in range(0, rows, m):
            b = min(m, rows - r0)
            blk = slice(r0, r0 + b)
            np.copyto(dy_buf[:b], dy2[blk])
            np.copyto(xhat_buf[:b], xhat2[blk])
            dxb, dgb, dbb = backward_formula(dy_buf[:b], xhat_buf[:b], gamma, rstd[blk])
            dx[blk] = dxb
            dgamma += dgb
            dbeta += dbb
    pdt = cache.gamma.dtype
    dx = dx.reshape(shape) if out is None else out
    return dx, dgamma.astype(pdt), dbeta.astype(pdt)


# --- block sizes ------------------------------------------------------------------

#: Bytes of float64 block temporaries :func:`tile_rows` aims for — well inside
#: the last-level cache, and large enough that NumPy's per-call overhead
#: (about a microsecond per operation) is small against a block's work.
TILE_BYTES = 4 * 2**20

# Block-sized float64 arrays live at once in each tiled function (inputs
# copied to float64 and the formula's temporaries that are still referenced).
_TILE_BUFFERS = {"forward": 4, "backward": 6}


def tile_rows(
    D: int, *, direction: str = "backward", budget_bytes: int = TILE_BYTES
) -> int:
    """Rows per block so that a tiled function's float64 temporaries fit a budget.

    The tiled forward keeps four block-sized float64 arrays alive at once, the
    tiled backward six: the result is ``max(1, budget_bytes // (arrays * 8 * D))``.

    Parameters
    ----------
    D : int
        Row length (>= 1).
    direction : {"forward", "backward"}, default "backward"
    budget_bytes : int, default :data:`TILE_BYTES`

    Returns
    -------
    int

    Examples
    --------
    >>> tile_rows(1024), tile_rows(1024, direction="forward")
    (85, 128)
    >>> tile_rows(2**20)  # a row too long for the budget: one row per block
    1
    """
    D = check_int(D, "D", 1, "D is the row length.")
    if direction not in _TILE_BUFFERS:
        raise ValueError(
            f"direction must be 'forward' or 'backward'; got {direction!r}."
        )
    budget_bytes = check_int(budget_bytes, "budget_bytes", 1)
    return max(1, budget_bytes // (_TILE_BUFFERS[direction] * ACC_DTYPE.itemsize * D))
