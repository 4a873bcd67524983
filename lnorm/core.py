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

Schedules
---------
By default both functions run op by op over the whole tensor, each operator
streaming a full-size float64 temporary through main memory. With
``block_rows=`` they run the same arithmetic on blocks of rows whose float64
temporaries stay in cache (:func:`tile_rows` picks a size): same results (the
forward bit for bit, the backward to float64 rounding), several times less
memory traffic.

One opt-out from the float64 policy: ``backward(..., work_dtype=np.float32)``
does the backward's arithmetic in float32, as the GPU kernels do, about twice
as fast on the CPU. It is accurate to float32 rounding of the *terms* of
``dx``, not of ``dx`` itself: where ``dy`` has a large common part that the
centring in ``g - mean(g)`` cancels, float32 work loses what float64 keeps (the
cost chapter measures it). The forward always centres in float64.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["LayerNormCache", "forward", "backward", "forward_formula", "backward_formula", "tile_rows"]

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


def _as_rows(a, name: str) -> np.ndarray:
    """``a`` as a floating array of rows, shape (..., D) with D >= 1, or raise."""
    arr = _as_float_array(a, name)
    if arr.ndim == 0:
        raise ValueError(
            f"{name} must have at least one dimension, shape (..., D); got a 0-d array. "
            f"Reshape a single value to {name}.reshape(1, 1) if that is what you mean."
        )
    if arr.shape[-1] < 1:
        raise ValueError(f"{name} must have a last axis of length D >= 1; got D = 0.")
    return arr


def _check_cache(cache) -> LayerNormCache:
    if not isinstance(cache, LayerNormCache):
        raise TypeError(
            f"cache must be the LayerNormCache returned by lnorm.forward; got {type(cache).__name__}."
        )
    return cache


def _check_dy(dy, cache) -> np.ndarray:
    """``dy`` as a floating array of the shape the cache records, or raise."""
    _check_cache(cache)
    dy = _as_float_array(dy, "dy")
    if dy.shape != cache.shape:
        raise ValueError(
            f"dy must have the shape of x, {cache.shape}, as recorded in the cache; got {dy.shape}. "
            "Pass the gradient of the loss with respect to this forward's output y."
        )
    return dy


def _check_positive(value, name: str, example: str, why: str = "") -> float:
    """``value`` as a float, finite and > 0, or a TypeError / ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number such as {example}; got {type(value).__name__}.")
    value = float(value)
    if not np.isfinite(value) or value <= 0.0:
        raise ValueError(
            f"{name} must be finite and > 0{why}; got {value!r}. A typical value is {example}."
        )
    return value


def _check_eps(eps) -> float:
    return _check_positive(eps, "eps", "1e-5", " (it bounds rstd by 1/sqrt(eps))")


def _check_int(value, name: str, minimum: int, hint: str = "") -> int:
    """``value`` as an int >= ``minimum``, or a TypeError / ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}. {hint}".rstrip())
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}. {hint}".rstrip())
    return int(value)


def _check_param(p, name: str, D: int) -> np.ndarray:
    arr = _as_float_array(p, name)
    if arr.shape != (D,):
        raise ValueError(
            f"{name} must have shape (D,) = ({D},) to match the last axis of x; "
            f"got shape {arr.shape}."
        )
    return arr


#: Dtypes :func:`backward` can do its arithmetic in (``work_dtype``).
WORK_DTYPES = (np.dtype(np.float32), ACC_DTYPE)


def _as_dtype(value, name: str, allowed: tuple[np.dtype, ...], what: str) -> np.dtype:
    """``value`` as one of the ``allowed`` dtypes, or a TypeError naming ``name``."""
    try:
        dt = np.dtype(value)
    except TypeError as err:
        raise TypeError(f"{name} must be {what}; got {value!r}.") from err
    if dt not in allowed:
        raise TypeError(f"{name} must be {what}; got {dt.name}.")
    return dt


def _check_work_dtype(work_dtype, dtype: np.dtype | None = None) -> np.dtype:
    """``work_dtype`` as float32 or float64 (None: float64), no narrower than ``dtype`` if given."""
    if work_dtype is None:
        return ACC_DTYPE
    work = _as_dtype(work_dtype, "work_dtype", WORK_DTYPES, "None, np.float64 or np.float32")
    if dtype is not None and work.itemsize < dtype.itemsize:
        raise ValueError(
            f"work_dtype={work.name} is narrower than the {dtype.name} input, so the "
            "backward would round its inputs; use work_dtype=None (float64)."
        )
    return work


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

    .. math::

        g = \\gamma \\odot dy, \\qquad
        dx = \\mathrm{rstd}\\,\\bigl(g - \\overline{g} - \\hat x\\,\\overline{g\\hat x}\\bigr),
        \\qquad d\\gamma = \\sum_{\\text{rows}} dy \\odot \\hat x,
        \\qquad d\\beta = \\sum_{\\text{rows}} dy .

    No validation and no dtype policy: :func:`backward` calls it on float64
    copies; the stability chapter and the benchmark's reference call it on
    float32 arrays. ``dy * xhat`` is formed once and serves both ``dgamma`` and
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


def forward(
    x, gamma, beta, eps: float = 1e-5, *, block_rows: int | None = None
) -> tuple[np.ndarray, LayerNormCache]:
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
    block_rows : int, optional
        Run the same arithmetic on blocks of this many rows, so the float64
        temporaries stay in cache (see :func:`backward`). The results are
        identical (every operation is row by row). Default: all rows at once.

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
    x = _as_rows(x, "x")
    D = x.shape[-1]
    gamma = _check_param(gamma, "gamma", D)
    beta = _check_param(beta, "beta", D)
    eps = _check_eps(eps)

    if block_rows is not None:
        block_rows = _check_int(block_rows, "block_rows", 1, _BLOCK_HINT)
        return _forward_tiled(x, gamma, beta, eps, block_rows)
    # Non-finite values propagate within their row (inf - inf = nan there);
    # that is the documented behaviour, not an event worth a warning.
    with np.errstate(invalid="ignore"):
        # No copy for float64 input: _forward64 only reads x64.
        y, mean, rstd, xhat = _forward64(x.astype(ACC_DTYPE, copy=False), gamma, beta, eps)

    to_x = dict(dtype=x.dtype, copy=False)  # y and xhat are new arrays either way
    return y.astype(**to_x), _make_cache(xhat.astype(**to_x), rstd[..., 0], gamma)


def _make_cache(xhat: np.ndarray, rstd: np.ndarray, gamma: np.ndarray) -> LayerNormCache:
    """The cache of new ``xhat`` and ``rstd`` arrays and a copy of ``gamma``, all read-only."""
    return LayerNormCache(
        xhat=_readonly(xhat), rstd=_readonly(rstd), gamma=_readonly(np.array(gamma, copy=True))
    )


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


def backward(
    dy, cache: LayerNormCache, *, block_rows: int | None = None, work_dtype=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    block_rows : int, optional
        Process the rows in blocks of this many, reusing a few preallocated
        buffers of ``block_rows * D`` elements in ``work_dtype``: a tiled schedule, the
        CPU's form of kernel fusion (see :func:`_backward_tiled`). Choose it
        so the buffers fit in cache; :func:`tile_rows` does. Default: all
        rows at once, op by op.
    work_dtype : {None, float64, float32}, optional
        Dtype of the arithmetic. Default (None): float64, rounded once to
        the input dtype at the end. ``np.float32`` (for float16 or float32
        inputs; a float64 input would lose precision, so it is refused)
        does the elementwise work and the row reductions in float32, as the
        GPU kernels do: roughly half the bytes through the cache, and the
        choice behind the fastest CPU backward of the cost chapter. Each
        ``dx`` is then accurate to about ``u32 = 2**-24`` times the size of
        the terms it is made of, ``rstd * |g|``, ``rstd * |mean(g)|`` and
        ``rstd * |xhat * mean(g * xhat)|``, not of ``dx`` itself: when ``dy`` carries a common offset much larger than
        its spread, ``g - mean(g)`` cancels it and float32 work loses the
        digits float64 keeps. ``dgamma`` and ``dbeta`` are summed in float32
        within a block and in float64 across blocks.

    Returns
    -------
    dx : ndarray, shape and dtype of ``x``
    dgamma, dbeta : ndarray, shape (D,), dtype of ``gamma``
        Summed over every leading axis (zero rows give zeros).

    Notes
    -----
    Two row reductions (``mean(g)`` and ``mean(g * xhat)``) and the two column
    sums; ``dy * xhat`` is formed once and serves both ``dgamma`` and
    ``mean(g * xhat) = mean(gamma * (dy * xhat))``. All arithmetic is in
    ``work_dtype`` (float64 by default).

    With ``block_rows`` the same quantities are computed block by block, also
    in ``work_dtype``; they agree with the default schedule to that dtype's
    rounding before the final cast, not bit for bit, because the sums are
    associated differently.
    """
    dy = _check_dy(dy, cache)
    work = _check_work_dtype(work_dtype, cache.dtype)
    if block_rows is not None:
        block_rows = _check_int(block_rows, "block_rows", 1, _BLOCK_HINT)
        with np.errstate(invalid="ignore"):
            return _backward_tiled(dy, cache, block_rows, work)
    with np.errstate(invalid="ignore"):  # non-finite rows stay non-finite, silently
        dx, dgamma, dbeta = backward_formula(
            # No copies where the dtype matches: backward_formula only reads.
            dy.astype(work, copy=False),
            cache.xhat.astype(work, copy=False),
            cache.gamma.astype(work, copy=False),
            cache.rstd.astype(work, copy=False)[..., None],
        )
    pdt = cache.gamma.dtype
    return dx.astype(cache.dtype), dgamma.astype(pdt), dbeta.astype(pdt)


# --- tiled schedules ------------------------------------------------------------
#
# The plain functions above run op by op over the whole tensor: every operator
# streams a full-size float64 temporary through main memory. The tiled ones run
# the same arithmetic on blocks of rows small enough that the float64
# temporaries stay in cache, so main memory sees each input read once and each
# output written once. That is what keeps the float64 policy affordable: the
# upcast copies live and die in cache (they still cost time there, which the
# backward's work_dtype=float32 saves).

#: Bytes of block buffers :func:`tile_rows` aims for. Measured on a
#: 2-core machine with 512 KiB of L2 per core and a 32 MiB L3 (the cost
#: chapter's sweep): blocks that fit in L2 are dominated by NumPy's per-call
#: overhead (about a microsecond per operation), so the best blocks are the
#: largest that stay well inside the last-level cache.
TILE_BYTES = 4 * 2**20

# OpenBLAS runs a matrix-vector product on several threads from 115200 * 4
# entries on; the reductions are issued in chunks below that, so that they stay
# on one core (threads spinning against other work on a busy machine cost far
# more than they save on a block that is already in cache).
_BLAS_SERIAL = 2**18

_BLOCK_HINT = "Pass None (all rows at once) or rows per block, e.g. lnorm.core.tile_rows(D)."

# Buffers of block_rows * D elements each tiled function keeps live.
_TILE_BUFFERS = {"forward": 4, "backward": 4}


def tile_rows(
    D: int, *, direction: str = "backward", budget_bytes: int = TILE_BYTES, work_dtype=None
) -> int:
    """Rows per block so that the tiled block buffers fit in ``budget_bytes``.

    Parameters
    ----------
    D : int
        Row length (>= 1).
    direction : {"forward", "backward"}
        The tiled backward keeps four planes of ``block_rows * D`` elements
        (``dy * xhat`` then ``dx``, ``g``, ``xhat``, ones), the tiled forward
        about four float64 temporaries of that size.
    budget_bytes : int, default :data:`TILE_BYTES`
        Cache budget for those buffers.
    work_dtype : {None, float64, float32}, optional
        The backward's ``work_dtype``, the dtype of its planes (None:
        float64). The forward always works in float64.

    Returns
    -------
    int
        ``max(1, budget_bytes // (buffers * itemsize * D))``.
    """
    D = _check_int(D, "D", 1, "D is the row length.")
    if direction not in _TILE_BUFFERS:
        raise ValueError(f"direction must be 'forward' or 'backward'; got {direction!r}.")
    work = _check_work_dtype(work_dtype)
    if direction == "forward" and work != ACC_DTYPE:
        raise ValueError("The forward always works in float64; leave work_dtype None.")
    per_row = _TILE_BUFFERS[direction] * work.itemsize * D
    return max(1, int(budget_bytes) // per_row)


def _forward_tiled(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float, block_rows: int
):
    """:func:`forward` on blocks of rows: :func:`_forward64` on each block.

    Every operation of the forward is row by row, so running it on blocks
    gives bit-identical results; only the size of the float64 temporaries
    changes (a block instead of the whole tensor).
    """
    shape, D = x.shape, x.shape[-1]
    x2 = x.reshape(-1, D)
    y = np.empty(shape, dtype=x.dtype)
    xhat = np.empty(shape, dtype=x.dtype)
    rstd = np.empty(shape[:-1], dtype=ACC_DTYPE)
    y2, xhat2, rstd1 = y.reshape(-1, D), xhat.reshape(-1, D), rstd.reshape(-1)
    with np.errstate(invalid="ignore"):
        for r0 in range(0, x2.shape[0], block_rows):
            blk = slice(r0, r0 + block_rows)
            yb, _, rs, xb = _forward64(x2[blk].astype(ACC_DTYPE), gamma, beta, eps)
            y2[blk], xhat2[blk], rstd1[blk] = yb, xb, rs[:, 0]
    return y, _make_cache(xhat, rstd, gamma)


def _backward_tiled(dy: np.ndarray, cache: LayerNormCache, block_rows: int, work: np.dtype):
    """:func:`backward` on blocks of rows, with preallocated buffers of dtype ``work``.

    Per row, with ``k = rstd * mean(g * xhat)`` and ``c = rstd * mean(g)``,

    .. math::

        dx = \\mathrm{rstd}\\,g - k\\,\\hat x - c
           = [\\mathrm{rstd},\\ -k,\\ -c] \\cdot [g;\\ \\hat x;\\ 1],

    so a row of ``dx`` is one small matrix product of a 1x3 coefficient row
    with a 3xD stack ``[g; xhat; 1]``: one pass instead of four elementwise
    ones (scale, scale, subtract, subtract). The block lives in one buffer of
    four planes, ``[dy * xhat, dy (then g), xhat, 1]``, so that the
    reductions are two matrix-vector products over adjacent planes:
    ``[dy * xhat; dy] @ gamma`` along the rows gives ``D * mean(g * xhat)``
    and ``D * mean(g)``, and ``ones @ [dy * xhat; dy]`` down the columns gives
    the block's share of ``dgamma`` and ``dbeta``, which are added up across
    blocks in float64.

    Unlike :func:`_forward_tiled`, which runs the plain forward's
    :func:`_forward64` on each block, this is a second form of the backward's
    arithmetic, kept for speed: the plain backward's steps on a block make
    thirteen passes over it and allocate eight fresh arrays of its size;
    this form makes eight passes, into buffers allocated once. In the cost
    chapter's setting ((8, 512, 1024), float32, each at its best block size)
    that made it 1.5 to 1.8 times faster than the plain steps run block by
    block. ``tests/test_cost.py`` keeps the two forms equal to rounding.
    """
    shape, D = cache.shape, cache.shape[-1]
    dy2 = dy.reshape(-1, D)
    xhat2 = cache.xhat.reshape(-1, D)
    rows = dy2.shape[0]
    gamma = cache.gamma.astype(work)
    dx = np.empty(shape, dtype=cache.dtype)
    dx2 = dx.reshape(-1, D)
    dgamma_dbeta = np.zeros((2, D), dtype=ACC_DTYPE)
    # Per-row coefficients [rstd, -k, -c]; the last two are filled per block.
    coef = np.empty((rows, 1, 3), dtype=work)
    coef[:, 0, 0] = cache.rstd.reshape(-1)
    minus_rstd_over_d = cache.rstd.reshape(-1, 1) * (-1.0 / D)
    # For float32 work on float32 data, einsum writes each row's 1x3 @ 3xD
    # product straight into dx, faster than matmul plus a copy. In float64
    # einsum is slower than matmul plus a copy (measured: about 8 against
    # 6 ms at the cost chapter's size), so float64 work goes through matmul
    # into a buffer, rounded to dx's dtype in one more pass.
    direct = work == dx.dtype == np.dtype(np.float32)

    m = max(1, min(block_rows, rows))
    planes = np.empty((4, m, D), dtype=work)
    planes[3] = 1.0
    row_sums = np.empty((2, m), dtype=work)
    chunk = max(1, _BLAS_SERIAL // D)
    ones = np.ones(min(m, chunk), dtype=work)
    for r0 in range(0, rows, m):
        b = min(m, rows - r0)
        blk = slice(r0, r0 + b)
        dy_xhat, dyb, xb = planes[0, :b], planes[1, :b], planes[2, :b]
        np.copyto(dyb, dy2[blk])
        np.copyto(xb, xhat2[blk])
        np.multiply(dyb, xb, out=dy_xhat)
        for s0 in range(0, b, chunk):
            s = slice(s0, min(b, s0 + chunk))
            # Along the rows [sum(g * xhat), sum(g)]; down the columns
            # this block's share of [dgamma, dbeta].
            np.matmul(planes[:2, s], gamma, out=row_sums[:, s])
            dgamma_dbeta += ones[: s.stop - s0] @ planes[:2, s]
        np.multiply(dyb, gamma, out=dyb)  # dy -> g in place: dy is used up
        np.multiply(row_sums[:, :b].T, minus_rstd_over_d[blk],
                    out=coef[blk, 0, 1:])
        # Per row [rstd, -k, -c] @ [g; xhat; 1], rounded once to dx's dtype.
        if direct:
            np.einsum("rk,krd->rd", coef[blk, 0], planes[1:, :b], out=dx2[blk])
        else:  # into the first plane (dy * xhat is used up), then cast
            stack = planes[1:, :b].transpose(1, 0, 2)  # (b, 3, D)
            np.matmul(coef[blk], stack, out=dy_xhat[:, None, :])
            np.copyto(dx2[blk], dy_xhat, casting="same_kind")
    pdt = cache.gamma.dtype
    return dx, dgamma_dbeta[0].astype(pdt), dgamma_dbeta[1].astype(pdt)
