r"""Layer normalization over the last axis: forward, backward and their cache.

For each row ``x`` of length ``D`` (the last axis), with ``mean`` the mean
over the row::

    mean = sum(x) / D                    var  = mean((x - mean)**2)
    rstd = 1 / sqrt(var + eps)           xhat = (x - mean) * rstd
    y    = gamma * xhat + beta

and, given the upstream gradient ``dy`` and ``g = gamma * dy``::

    dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dgamma = sum over rows of dy * xhat
    dbeta  = sum over rows of dy

The derivation of the backward is in the chapter "Deriving the backward"
(``book/02_derivation.md``).

The module reads from the math to the plumbing:

1. :func:`forward_formula` and :func:`backward_formula` are these lines as
   plain NumPy, in the arithmetic of their arguments: the reference the
   derivation chapter arrives at;
2. :class:`~lnorm.cache.LayerNormCache` and :func:`~lnorm.cache.make_cache`
   (in :mod:`lnorm.cache`): what the forward keeps for the backward;
3. :func:`forward` and :func:`backward` are the library functions, with
   checks and a dtype policy, and two schedules:

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
mean would carry an error of up to about ``u32 * |mean|`` (``u32 = 2**-24``)
from its rounding alone, which ``x - mean`` passes into every ``xhat`` as
``u32 * |mean| / std``; in
float64 that error is below float32's own rounding for any offset a float32
row can carry (the chapter "Layer norm in low precision",
``book/04b_low_precision.md``, measures both).

What the cache keeps
--------------------
``LayerNormCache`` keeps ``xhat`` (input dtype, one activation-sized tensor),
``rstd`` (float64, one number per row) and a read-only copy of ``gamma``. The
backward then never repeats the centring; the cost chapter
(``book/05_cost.md``) measures this choice against keeping ``x`` with
``mean`` and ``rstd``, or ``y``.

Examples
--------
>>> import numpy as np
>>> import lnorm
>>> x = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
>>> y, cache = lnorm.forward(x, np.ones(3), np.zeros(3))
>>> np.round(y, 4)
array([[-1.2247,  0.    ,  1.2247],
       [ 0.    ,  0.    ,  0.    ]])
>>> dx, dgamma, dbeta = lnorm.backward(np.ones((2, 3)), cache)
>>> bool(np.all(dx == 0)), dbeta
(True, array([2., 2., 2.]))
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
    r"""Compute the forward as plain NumPy, one operation per line.

    ``mean = sum(x) / D``, ``var = mean((x - mean)**2)``,
    ``rstd = 1 / sqrt(var + eps)``, ``xhat = (x - mean) * rstd``,
    ``y = gamma * xhat + beta``, over the last axis (the chapter "Layer
    normalization, forward", ``book/01_forward.md``, explains each line).

    No validation and no dtype policy: every operation runs in the dtype
    NumPy's promotion of ``x`` with ``gamma``, ``beta`` and ``eps`` gives. It is
    complex-safe (``xc * xc``, never ``abs``), so complex-step differentiation
    through it has no cancellation and is accurate to rounding.

    Parameters
    ----------
    x : ndarray, shape (..., D)
        Rows to normalize; real or complex.
    gamma, beta : ndarray, shape (D,), or scalars
        Scale and shift, broadcast against ``x``.
    eps : float, default 1e-5
        Added to the variance. Zero is allowed here (a constant row then
        divides by zero).

    Returns
    -------
    y : ndarray, shape of ``x``
        The output.
    mean : ndarray, shape ``x.shape[:-1] + (1,)``
        The mean of each row.
    rstd : ndarray, shape ``x.shape[:-1] + (1,)``
        ``1 / sqrt(var + eps)`` of each row.
    xhat : ndarray, shape of ``x``
        The normalized rows ``(x - mean) * rstd``.

    See Also
    --------
    forward : The library function: checks, float64 statistics, a cache.
    backward_formula : The backward from ``xhat`` and ``rstd``.
    lnorm.cost.numpy_program : The memory traffic of these lines.

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
    r"""Compute the compact backward as plain NumPy, in the dtype of its arguments.

    With ``g = gamma * dy`` and ``mean`` the mean over the row::

        dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dgamma = sum over rows of dy * xhat
        dbeta  = sum over rows of dy

    ``dy * xhat`` is formed once and serves both ``dgamma`` and
    ``mean(g * xhat) = (dy * xhat) @ gamma / D``. The chapter "Deriving the
    backward" (``book/02_derivation.md``) derives the formula and compares
    it with the staged backward.

    Parameters
    ----------
    dy : ndarray, shape (..., D)
        Upstream gradient dL/dy.
    xhat : ndarray, shape (..., D)
        The normalized input, as :func:`forward_formula` returns it.
    gamma : ndarray, shape (D,)
        The scale.
    rstd : ndarray, shape (..., 1)
        ``1 / sqrt(var + eps)`` of each row, with a trailing axis of one.

    Returns
    -------
    dx : ndarray, shape (..., D)
        Gradient with respect to ``x``.
    dgamma, dbeta : ndarray, shape (D,)
        Gradients with respect to ``gamma`` and ``beta``, summed over every
        leading axis.

    See Also
    --------
    backward : The library function: checks, float64 arithmetic, schedules.
    forward_formula : The forward whose ``xhat`` and ``rstd`` this takes.

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
    r"""Normalize each row over the last axis, then scale and shift it.

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
    out : tuple of two ndarrays, optional
        ``(y, xhat)`` to write into instead of new arrays, as in
        :func:`lnorm.fused.forward` (see there); the cache then holds a
        read-only view of the ``xhat`` buffer.

    Returns
    -------
    y : ndarray, shape and dtype of ``x``
        The output (``out[0]`` when given).
    cache : LayerNormCache
        ``xhat`` and ``rstd`` (and ``gamma``), what :func:`backward` needs.

    Raises
    ------
    TypeError
        A non-floating input, or ``eps`` / ``block_rows`` of the wrong type.
    ValueError
        A 0-d ``x``, ``D = 0``, ``gamma``/``beta`` not of shape ``(D,)``,
        ``eps`` not finite and > 0, ``block_rows < 1``.
    TypeError, ValueError
        An ``out`` that :func:`lnorm.validate.check_forward_out` refuses.

    See Also
    --------
    backward : The gradients, from this cache.
    forward_formula : The same arithmetic as plain NumPy, without checks.
    lnorm.fused.forward : The default schedule.
    tile_rows : A ``block_rows`` whose temporaries stay in cache.

    Notes
    -----
    Statistics are two-pass (the mean, then the mean of squared deviations)
    in float64. A constant row is exact: ``xhat == 0`` and ``y`` is ``beta``
    rounded to the dtype of ``x``.
    The two schedules agree to float64 rounding before the final rounding
    to the dtype of ``x``. Non-finite values stay in their row.

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
    r"""Compute the gradients of layer normalization from the upstream gradient ``dy``.

    With ``g = gamma * dy`` and ``mean`` the mean over the row::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy

    (see the chapter "Deriving the backward", ``book/02_derivation.md``).

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
    out : ndarray, optional
        An array of the shape and dtype of ``x`` to write ``dx`` into, as in
        :func:`lnorm.fused.backward`.

    Returns
    -------
    dx : ndarray, shape and dtype of ``x``
        Gradient with respect to ``x`` (``out`` when given).
    dgamma, dbeta : ndarray, shape (D,), dtype of ``gamma``
        Summed over every leading axis (zero rows give zeros); accumulated
        in float64, then rounded once to the dtype of ``gamma``.

    Raises
    ------
    TypeError
        ``cache`` not a LayerNormCache, a non-floating ``dy``, or a
        ``block_rows`` that is not an integer.
    ValueError
        ``dy`` not of the shape of ``x``, ``block_rows < 1``.
    TypeError, ValueError
        An ``out`` that :func:`lnorm.validate.check_backward_out` refuses.

    See Also
    --------
    forward : Makes the cache.
    backward_formula : The same arithmetic as plain NumPy, without checks.
    lnorm.fused.backward : The default schedule.
    lnorm.gradcheck.check_gradients : Checks these gradients numerically.

    Notes
    -----
    The two schedules agree to float64 rounding before the final rounding
    to the dtype of ``x``; the sums behind ``dgamma`` and ``dbeta`` are
    associated differently, so the last bits can differ between them (each
    gives the same bits on every call).

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
    r"""Rows per block so that a tiled function's float64 temporaries fit a budget.

    The tiled forward keeps about four block-sized float64 arrays alive at
    once, the tiled backward six; the result is the largest block whose
    arrays fit ``budget_bytes``.

    Parameters
    ----------
    D : int
        Row length (>= 1).
    direction : {"forward", "backward"}, default "backward"
        Which tiled function the block is for.
    budget_bytes : int, default :data:`TILE_BYTES`
        Bytes of cache the block's temporaries may take.

    Returns
    -------
    int
        ``max(1, budget_bytes // (buffers * 8 * D))``.

    Raises
    ------
    TypeError
        ``D`` or ``budget_bytes`` not an integer.
    ValueError
        ``D < 1``, ``budget_bytes < 1``, or an unknown ``direction``.

    See Also
    --------
    forward, backward : Take the result as ``block_rows=``.
    lnorm.bench.tile_sweep : Times the tiled backward for several sizes.

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
