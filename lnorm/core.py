r"""Layer normalization over the last axis: forward, backward and the cache between them.

For each row ``x`` of length ``D`` (the last axis), with a bar for the mean
over the row::

    mean = xbar                          var  = mean((x - mean)**2)
    rstd = 1 / sqrt(var + eps)           xhat = (x - mean) * rstd
    y    = gamma * xhat + beta

and, given the upstream gradient ``dy`` and ``g = gamma * dy``::

    dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dgamma = sum over rows of dy * xhat
    dbeta  = sum over rows of dy

:func:`forward_formula` and :func:`backward_formula` are these lines as plain
NumPy, in the arithmetic of their arguments: the reference the derivation
chapter arrives at. :func:`forward` and :func:`backward` are the library
functions, with checks and a dtype policy, and two schedules:

* by default the fused loops of :mod:`lnorm.fused`, one compiled pass per
  row (Numba), the fastest schedule;
* with ``block_rows=n`` the NumPy formulas on blocks of ``n`` rows, whose
  float64 temporaries stay in cache for a modest ``n`` (:func:`tile_rows`
  picks one); ``block_rows`` at least the number of rows is the plain
  op-by-op program over the whole tensor.

Dtype policy
------------
float16, float32 and float64 inputs are accepted. Every statistic, the
centring ``x - mean`` and every reduction are computed in float64, whatever
the input dtype, and results are rounded once to the input dtype. A float32
mean would carry an error of at least ``u32 * |mean|`` (``u32 = 2**-24``),
which ``x - mean`` passes into every ``xhat`` as ``u32 * |mean| / std``; in
float64 that error is below float32's own rounding for any offset a float32
row can carry (the low-precision chapter measures both).

What the cache keeps
--------------------
``LayerNormCache`` keeps ``xhat`` (input dtype, one activation-sized tensor),
``rstd`` (float64, one number per row) and a read-only copy of ``gamma``. The
backward then never repeats the centring; the cost chapter measures this
choice against keeping ``x`` with ``mean`` and ``rstd``, or ``y``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validate import (
    SUPPORTED_DTYPES,
    as_rows,
    check_dy,
    check_eps,
    check_int,
    check_param,
)

__all__ = [
    "LayerNormCache",
    "forward",
    "backward",
    "forward_formula",
    "backward_formula",
    "make_cache",
    "tile_rows",
    "SUPPORTED_DTYPES",
    "ACC_DTYPE",
    "TILE_BYTES",
]

#: Dtype in which statistics and reductions are accumulated on the CPU.
ACC_DTYPE = np.dtype(np.float64)


# --- the formulas -----------------------------------------------------------------

def forward_formula(x, gamma, beta, eps: float = 1e-5):
    """The forward as plain NumPy, one operation per line, in the dtype of ``x``.

    No validation and no dtype policy. It is complex-safe (``xc * xc``,
    never ``abs``), so complex-step differentiation through it is exact.

    Parameters
    ----------
    x : ndarray, shape (..., D)
    gamma, beta : ndarray, shape (D,)
    eps : float

    Returns
    -------
    y, mean, rstd, xhat
        ``mean`` and ``rstd`` have shape ``x.shape[:-1] + (1,)``.

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
    """The compact backward as plain NumPy, in the dtype of its arguments.

    ``g = gamma * dy``; ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``;
    ``dgamma = sum(dy * xhat)`` and ``dbeta = sum(dy)`` over the rows.
    ``dy * xhat`` is formed once and serves both ``dgamma`` and
    ``mean(g * xhat) = (dy * xhat) @ gamma / D``.

    Parameters
    ----------
    dy, xhat : ndarray, shape (..., D)
    gamma : ndarray, shape (D,)
    rstd : ndarray, shape (..., 1)

    Returns
    -------
    dx : ndarray, shape (..., D)
    dgamma, dbeta : ndarray, shape (D,), summed over every leading axis

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


# --- the cache --------------------------------------------------------------------

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


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def make_cache(xhat: np.ndarray, rstd: np.ndarray, gamma: np.ndarray) -> LayerNormCache:
    """The cache of new ``xhat`` and ``rstd`` arrays and a copy of ``gamma``, read-only.

    Examples
    --------
    >>> c = make_cache(np.zeros((2, 3)), np.ones(2), np.ones(3))
    >>> c.shape, c.xhat.flags.writeable
    ((2, 3), False)
    """
    return LayerNormCache(
        xhat=_readonly(xhat), rstd=_readonly(rstd), gamma=_readonly(np.array(gamma, copy=True))
    )


# --- the library functions --------------------------------------------------------

_BLOCK_HINT = "Pass None (fused) or rows per block, e.g. lnorm.core.tile_rows(D)."


def forward(
    x, gamma, beta, eps: float = 1e-5, *, block_rows: int | None = None
) -> tuple[np.ndarray, LayerNormCache]:
    """Layer normalization over the last axis.

    ``y = gamma * (x - mean) / sqrt(var + eps) + beta``, with the mean and
    the (biased) variance of each row.

    Parameters
    ----------
    x : array_like, shape (..., D)
        float16, float32 or float64; at least one dimension; any number of
        leading dimensions, including zero rows. Not modified.
    gamma, beta : array_like, shape (D,)
        Scale and shift, floating. Not modified.
    eps : float, default 1e-5
        Finite and > 0; added to the variance, so ``rstd <= 1/sqrt(eps)``.
    block_rows : int, optional
        None (default): the fused loop of :func:`lnorm.fused.forward`.
        An int: the NumPy formula on blocks of that many rows (bit for bit
        the same results whatever the block size: every step is row by row).

    Returns
    -------
    y : ndarray, shape and dtype of ``x``
    cache : LayerNormCache
        ``xhat`` and ``rstd`` (and ``gamma``), what :func:`backward` needs.

    Raises
    ------
    TypeError
        A non-floating input, or ``eps`` / ``block_rows`` of the wrong type.
    ValueError
        A 0-d ``x``, ``D = 0``, ``gamma``/``beta`` not of shape ``(D,)``,
        ``eps`` not finite and > 0, ``block_rows < 1``.

    See Also
    --------
    backward, forward_formula, lnorm.fused.forward

    Notes
    -----
    Statistics are two-pass (the mean, then the mean of squared deviations)
    in float64. A constant row is exact: ``xhat == 0`` and ``y == beta``.

    Examples
    --------
    >>> import lnorm
    >>> y, cache = lnorm.forward(np.array([[1.0, 2.0, 3.0]]), np.ones(3), np.zeros(3))
    >>> np.round(y, 3)
    array([[-1.225,  0.   ,  1.225]])
    """
    if block_rows is None:
        from . import fused

        return fused.forward(x, gamma, beta, eps)
    x = as_rows(x, "x")
    D = x.shape[-1]
    gamma = check_param(gamma, "gamma", D)
    beta = check_param(beta, "beta", D)
    eps = check_eps(eps)
    block_rows = check_int(block_rows, "block_rows", 1, _BLOCK_HINT)

    x2 = x.reshape(-1, D)
    y = np.empty(x2.shape, dtype=x.dtype)
    xhat = np.empty(x2.shape, dtype=x.dtype)
    rstd = np.empty(x2.shape[0], dtype=ACC_DTYPE)
    gamma64, beta64 = gamma.astype(ACC_DTYPE), beta.astype(ACC_DTYPE)
    # Non-finite values propagate within their row (inf - inf = nan there).
    with np.errstate(invalid="ignore"):
        for r0 in range(0, x2.shape[0], block_rows):
            blk = slice(r0, r0 + block_rows)
            yb, rb, hb = _forward64(x2[blk].astype(ACC_DTYPE), gamma64, beta64, eps)
            y[blk], xhat[blk], rstd[blk] = yb, hb, rb[:, 0]
    return y.reshape(x.shape), make_cache(xhat.reshape(x.shape), rstd.reshape(x.shape[:-1]), gamma)


def _forward64(x64: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float):
    """y, rstd and xhat of float64 rows: :func:`forward_formula` with an exact constant row."""
    mean = x64.mean(axis=-1, keepdims=True)
    # The true mean lies in [min, max]; rounding can push it just outside a
    # constant row's single value, which would make xhat nonzero there.
    np.clip(mean, x64.min(axis=-1, keepdims=True), x64.max(axis=-1, keepdims=True), out=mean)
    xc = x64 - mean
    var = np.einsum("...d,...d->...", xc, xc)[..., None] / x64.shape[-1]
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    return xhat * gamma + beta, rstd, xhat


def backward(
    dy, cache: LayerNormCache, *, block_rows: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of layer normalization, from the upstream gradient ``dy``.

    With ``g = gamma * dy`` and a bar for the mean over the row::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy

    Parameters
    ----------
    dy : array_like, shape of ``x``
        Upstream gradient dL/dy, floating. Not modified.
    cache : LayerNormCache
        From :func:`forward`.
    block_rows : int, optional
        None (default): the fused loop of :func:`lnorm.fused.backward`.
        An int: :func:`backward_formula` in float64 on blocks of that many
        rows, into buffers allocated once.

    Returns
    -------
    dx : ndarray, shape and dtype of ``x``
    dgamma, dbeta : ndarray, shape (D,), dtype of ``gamma``
        Summed over every leading axis (zero rows give zeros), in float64.

    Raises
    ------
    TypeError
        ``cache`` not a LayerNormCache, or a non-floating ``dy``.
    ValueError
        ``dy`` not of the shape of ``x``, ``block_rows < 1``.

    See Also
    --------
    forward, backward_formula, lnorm.fused.backward

    Examples
    --------
    >>> import lnorm
    >>> y, cache = lnorm.forward(np.array([[1.0, 2.0, 3.0]]), np.ones(3), np.zeros(3))
    >>> dx, dgamma, dbeta = lnorm.backward(np.array([[1.0, 0.0, -1.0]]), cache)
    >>> float(dx.sum()) == 0.0 or abs(float(dx.sum())) < 1e-15
    True
    """
    if block_rows is None:
        from . import fused

        return fused.backward(dy, cache)
    dy = check_dy(dy, cache)
    block_rows = check_int(block_rows, "block_rows", 1, _BLOCK_HINT)
    shape, D = cache.shape, cache.shape[-1]
    dy2, xhat2 = dy.reshape(-1, D), cache.xhat.reshape(-1, D)
    rstd = cache.rstd.reshape(-1, 1)
    rows = dy2.shape[0]
    gamma = cache.gamma.astype(ACC_DTYPE)
    dx = np.empty(dy2.shape, dtype=cache.dtype)
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
    return dx.reshape(shape), dgamma.astype(pdt), dbeta.astype(pdt)


# --- block sizes ------------------------------------------------------------------

#: Bytes of float64 block temporaries :func:`tile_rows` aims for: well inside
#: the last-level cache, and large enough that NumPy's per-call overhead
#: (about a microsecond per operation) is small against a block's work.
TILE_BYTES = 4 * 2**20

# Block-sized float64 arrays live at once in each tiled function (inputs
# copied to float64 and the formula's temporaries that are still referenced).
_TILE_BUFFERS = {"forward": 4, "backward": 6}


def tile_rows(D: int, *, direction: str = "backward", budget_bytes: int = TILE_BYTES) -> int:
    """Rows per block so that a tiled function's float64 temporaries fit ``budget_bytes``.

    Parameters
    ----------
    D : int
        Row length (>= 1).
    direction : {"forward", "backward"}
    budget_bytes : int, default :data:`TILE_BYTES`

    Returns
    -------
    int
        ``max(1, budget_bytes // (buffers * 8 * D))``.

    Examples
    --------
    >>> tile_rows(1024)
    85
    """
    D = check_int(D, "D", 1, "D is the row length.")
    if direction not in _TILE_BUFFERS:
        raise ValueError(f"direction must be 'forward' or 'backward'; got {direction!r}.")
    budget_bytes = check_int(budget_bytes, "budget_bytes", 1)
    return max(1, budget_bytes // (_TILE_BUFFERS[direction] * ACC_DTYPE.itemsize * D))
