r"""Row-wise mean and variance: five floating-point algorithms and an exact reference.

Every function works over the last axis of ``x`` (a row of length ``D``),
vectorized across rows, and returns :class:`RowStats` ``(mean, var)`` of shape
``x.shape[:-1]`` with the biased variance ``var = sum((x - mean)**2) / D``.

The floating algorithms take the accumulation dtype ``dtype`` (float16,
float32 or float64; default: the dtype of ``x``). ``x`` is rounded to it once
and every operation after that runs in it, so the same algorithm can be
studied in each precision.

Error bounds, relative to the variance, with ``u`` the unit roundoff of the
accumulation dtype and ``kappa = sqrt(1 + mean**2 / var)`` the condition
number (:func:`condition_number`). The sums here are NumPy's, pairwise along
the row, so ``L = log2(D)`` stands where recursive summation would have ``D``
(Chan, Golub and LeVeque 1983; Higham 2002):

``naive``
    ``mean(x**2) - mean(x)**2``: one pass, but the subtraction cancels;
    about ``L u kappa**2``.
``two_pass``
    The mean, then the mean of squared deviations: about
    ``L u + (L u kappa)**2``. The mean's error ``delta`` adds ``D delta**2``
    to the sum of squared deviations.
``corrected_two_pass``
    Two-pass with the mean corrected by the mean of the deviations (Chan,
    Golub and LeVeque's corrected two-pass algorithm): about
    ``L u + L**3 u**3 kappa**2``; the ``D delta**2`` term is gone.
``welford``
    Welford's streaming update of ``(n, mean, M2)``, one column at a time
    (sequential, so ``D``, not ``L``): at most about ``D u kappa``, in
    practice far less.
``chan``
    Chan's pairwise merge of partial ``(n, mean, M2)``, the shape of a GPU
    reduction tree: at most about ``L u kappa``.
``exact``
    The mean and variance of the given floating values in exact rational
    arithmetic (:class:`fractions.Fraction`), rounded once to float64.

NumPy's ``sum`` along a contiguous axis is pairwise, and for float16 it adds
in float32 internally and rounds the total once; elementwise operations
(``x * x``, ``x - mean``) run in the accumulation dtype.

Examples
--------
>>> import numpy as np
>>> from lnorm import variance
>>> row = 1e9 + np.array([1.0, -1.0, 2.0, -2.0])
>>> float(variance.naive(row).var), float(variance.two_pass(row).var)
(0.0, 2.5)
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from .validate import SUPPORTED_DTYPES, as_dtype, as_float_array, as_rows

__all__ = [
    "RowStats",
    "naive",
    "two_pass",
    "corrected_mean",
    "corrected_two_pass",
    "welford",
    "chan",
    "exact",
    "exact_row",
    "condition_number",
    "ALGORITHMS",
]


class RowStats(NamedTuple):
    """Per-row statistics, each of shape ``x.shape[:-1]``."""

    mean: np.ndarray
    var: np.ndarray


def _prepare(x: ArrayLike, dtype: DTypeLike | None) -> np.ndarray:
    """Validate ``x`` and ``dtype``; return ``x`` as a new array in the accumulation dtype."""
    x = as_rows(x, "x")
    if dtype is None:
        acc = x.dtype
    else:
        acc = as_dtype(dtype, "dtype", SUPPORTED_DTYPES,
                        "float16, float32 or float64 (the accumulation dtype)")
    # A copy even when the dtype already matches: inputs are never modified.
    return x.astype(acc, copy=True)


def naive(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Textbook one-pass variance, :math:`\\overline{x^2} - \\overline{x}^2`.

    Parameters
    ----------
    x : array_like, shape (..., D)
        float16, float32 or float64. Not modified.
    dtype : float16, float32 or float64, optional
        Accumulation dtype (default: the dtype of ``x``).

    Returns
    -------
    RowStats
        ``mean`` and ``var``, shape ``x.shape[:-1]``, in ``dtype``.

    Notes
    -----
    Both sums are of size :math:`\\mu^2 + \\sigma^2`; their difference is
    :math:`\\sigma^2`, so the rounding error :math:`u(\\mu^2+\\sigma^2)` becomes
    a relative error :math:`u\\,\\kappa^2`. The result can be zero or negative
    once :math:`\\kappa^2 \\gtrsim 1/u`. It is returned as computed (no clamp),
    so that callers can see it.
    """
    xa = _prepare(x, dtype)
    D = xa.shape[-1]
    mean = xa.sum(axis=-1) / D
    mean_sq = (xa * xa).sum(axis=-1) / D
    return RowStats(mean, mean_sq - mean * mean)


def two_pass(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Two-pass variance: the mean first, then the mean of squared deviations.

    ``mean = fl(sum(x) / D)``, ``var = sum((x - mean)**2) / D``. Parameters
    and returns as in :func:`naive`.

    Notes
    -----
    The squares are of deviations, so nothing large cancels. The computed
    mean is off by some ``delta`` (of order ``log2(D) u |mean|``), and since
    the exact deviations sum to zero,
    ``sum((x - mean - delta)**2) = sum((x - mean)**2) + D delta**2``: the
    *sum* gains ``D delta**2`` (no single term gains exactly ``delta**2``),
    a relative error of ``(delta / std)**2``, about ``(log2(D) u kappa)**2``,
    on top of the ``log2(D) u`` of rounding the squares and their sum. It is
    invisible until ``kappa`` nears ``u**-1/2`` (Chan, Golub and LeVeque 1983).

    Examples
    --------
    >>> float(two_pass(np.array([1.0, 2.0, 3.0, 4.0])).var)
    1.25
    """
    xa = _prepare(x, dtype)
    D = xa.shape[-1]
    mean = xa.sum(axis=-1, keepdims=True) / D
    dev = xa - mean
    return RowStats(mean[..., 0], (dev * dev).sum(axis=-1) / D)


def corrected_mean(x: ArrayLike, dtype: DTypeLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The mean of each row as two numbers, ``m_hi + m_lo``, in ``dtype``.

    ``m_hi = fl(sum(x) / D)`` and ``m_lo = fl(sum(x - m_hi) / D)``: the mean
    of the deviations from ``m_hi`` is minus ``m_hi``'s own error. Where the
    offset dominates the row (every ``x_j`` within a factor of two of
    ``m_hi``), ``x_j - m_hi`` is exact by Sterbenz's lemma, so ``m_lo``
    carries ``m_hi``'s error to a relative accuracy of ``log2(D) u``.
    Centring as ``(x - m_hi) - m_lo`` then leaves an error of order
    ``u * std``, not ``u * |mean|``. This is the mean of the fused GPU kernel.

    Returns
    -------
    m_hi, m_lo : ndarray, shape ``x.shape[:-1] + (1,)``, in ``dtype``

    Examples
    --------
    >>> row = np.float32(1e4) + np.arange(4, dtype=np.float32)
    >>> m_hi, m_lo = corrected_mean(row)
    >>> float(m_hi[0] + m_lo[0])
    10001.5
    """
    xa = _prepare(x, dtype)
    D = xa.shape[-1]
    m_hi = xa.sum(axis=-1, keepdims=True) / D
    m_lo = (xa - m_hi).sum(axis=-1, keepdims=True) / D
    return m_hi, m_lo


def corrected_two_pass(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Two-pass variance from the corrected mean ``m_hi + m_lo``.

    ``c = (x - m_hi) - m_lo`` (:func:`corrected_mean`), ``var = sum(c**2) / D``.
    In exact arithmetic this is the corrected two-pass formula of Chan, Golub
    and LeVeque (1983), ``(sum(d**2) - sum(d)**2 / D) / D`` with
    ``d = x - m_hi``: both subtract ``D m_lo**2`` from ``sum(d**2)``. The
    ``D delta**2`` term of :func:`two_pass` is gone, and what is left is of
    order ``log2(D) u`` until ``kappa`` nears ``1 / u``. Parameters and
    returns as in :func:`naive`; ``mean`` is ``m_hi + m_lo`` rounded to
    ``dtype``.

    Examples
    --------
    >>> row = np.float32(3e4) + np.array([1.0, -1.0, 2.0, -2.0], np.float32)
    >>> float(corrected_two_pass(row).var)
    2.5
    """
    xa = _prepare(x, dtype)
    D = xa.shape[-1]
    m_hi, m_lo = corrected_mean(xa)
    c = (xa - m_hi) - m_lo
    return RowStats((m_hi + m_lo)[..., 0], (c * c).sum(axis=-1) / D)


def welford(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Welford's one-pass streaming variance, vectorized across rows.

    For ``j = 1 .. D`` (one loop iteration per column, every row at once):

    .. math::

        \\delta = x_j - m_{j-1}, \\qquad m_j = m_{j-1} + \\delta / j, \\qquad
        M_j = M_{j-1} + \\delta\\,(x_j - m_j),

    and :math:`\\sigma^2 = M_D / D`.

    Parameters and returns as in :func:`naive`.

    Notes
    -----
    Every update works with deviations from the running mean, so it never
    forms :math:`\\mu^2`; Welford (1962). Its error bound grows like
    :math:`D\\,u\\,\\kappa` (Chan, Golub and LeVeque 1983).
    """
    xa = _prepare(x, dtype)
    acc = xa.dtype.type
    D = xa.shape[-1]
    mean = np.zeros(xa.shape[:-1], dtype=xa.dtype)
    m2 = np.zeros(xa.shape[:-1], dtype=xa.dtype)
    for j in range(D):
        xj = xa[..., j]
        delta = xj - mean
        mean = mean + delta / acc(j + 1)
        m2 = m2 + delta * (xj - mean)
    return RowStats(mean, m2 / acc(D))


def chan(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Chan's pairwise merge of partial ``(n, mean, M2)``: a reduction tree.

    Every element starts as a partial ``(1, x_j, 0)``. Each level merges
    partial ``i`` with partial ``i + h`` (``h`` = half the count, the pattern
    of a warp-shuffle or shared-memory tree; an odd one out waits a level):

    .. math::

        n = n_a + n_b, \\qquad \\delta = m_b - m_a, \\qquad
        m = m_a + \\delta\\,\\frac{n_b}{n}, \\qquad
        M = M_a + M_b + \\delta^2\\,\\frac{n_a n_b}{n},

    and :math:`\\sigma^2 = M / D` after :math:`\\lceil\\log_2 D\\rceil` levels.

    Parameters and returns as in :func:`naive`.

    Notes
    -----
    Chan, Golub and LeVeque (1983). The weights :math:`n_b/n` and
    :math:`n_a n_b/n` are the same for every row; they are formed in float64
    and rounded once to ``dtype``, as a kernel would hold them as constants.
    """
    xa = _prepare(x, dtype)
    D = xa.shape[-1]
    n = np.ones(D, dtype=np.int64)
    mean = xa
    m2 = np.zeros_like(xa)
    while mean.shape[-1] > 1:
        L = mean.shape[-1]
        h = L // 2
        na, nb = n[:h], n[h:2 * h]
        nab = na + nb
        w_mean = (nb / nab).astype(xa.dtype)
        w_m2 = (na * nb / nab).astype(xa.dtype)
        delta = mean[..., h:2 * h] - mean[..., :h]
        merged_mean = mean[..., :h] + delta * w_mean
        merged_m2 = m2[..., :h] + m2[..., h:2 * h] + delta * delta * w_m2
        # An odd count leaves the last partial unmerged; it joins the next level.
        mean = np.concatenate([merged_mean, mean[..., 2 * h:]], axis=-1)
        m2 = np.concatenate([merged_m2, m2[..., 2 * h:]], axis=-1)
        n = np.concatenate([nab, n[2 * h:]])
    return RowStats(mean[..., 0], m2[..., 0] / xa.dtype.type(D))


def _exact_stats(values: list[float]) -> tuple[Fraction, Fraction]:
    """Exact mean and variance of finite Python floats (see :func:`exact_row`)."""
    ratios = [v.as_integer_ratio() for v in values]
    K = max(den.bit_length() - 1 for _, den in ratios)  # denominators are powers of two
    ints = [num << (K - (den.bit_length() - 1)) for num, den in ratios]
    D = len(ints)
    s1 = sum(ints)
    s2 = sum(v * v for v in ints)
    scale = 1 << K
    return Fraction(s1, D * scale), Fraction(D * s2 - s1 * s1, D * D * scale * scale)


def _check_finite(x: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(x)):
        raise ValueError(
            f"{name} must hold finite values only: the exact variance of inf or nan is undefined."
        )


def exact_row(row: ArrayLike) -> tuple[Fraction, Fraction]:
    """Exact mean and (biased) variance of one row of floating values.

    Every finite float is a dyadic rational :math:`N_j / 2^{k_j}`. Scaled to a
    common denominator :math:`2^K`, the row becomes integers :math:`N_j`, and

    .. math::

        \\mu = \\frac{S_1}{D\\,2^K}, \\qquad
        \\sigma^2 = \\frac{D S_2 - S_1^2}{D^2\\,2^{2K}}, \\qquad
        S_1 = \\sum_j N_j,\\; S_2 = \\sum_j N_j^2,

    computed in Python integers, with no rounding at all. The one-pass
    formula is safe here: in exact arithmetic nothing cancels badly.

    Parameters
    ----------
    row : array_like, shape (D,)
        Finite float16, float32 or float64 values, D >= 1.

    Returns
    -------
    mean, var : fractions.Fraction
    """
    row = as_float_array(row, "row")
    if row.ndim != 1 or row.shape[0] < 1:
        raise ValueError(f"row must be one-dimensional with D >= 1 values; got shape {row.shape}.")
    _check_finite(row, "row")
    return _exact_stats(row.tolist())


def exact(x: ArrayLike) -> RowStats:
    """Exact mean and variance of every row, each rounded once to float64.

    Parameters
    ----------
    x : array_like, shape (..., D)
        Finite float16, float32 or float64 values. Not modified.

    Returns
    -------
    RowStats
        float64 ``mean`` and ``var``, each the correctly rounded value of the
        exact rational result of :func:`exact_row`.

    Notes
    -----
    The reference for the floating algorithms. It runs a Python loop over rows
    and elements, so keep it to small inputs (thousands of rows of a few
    hundred values take well under a second).
    """
    x = as_rows(x, "x")  # read only (tolist), so no copy
    _check_finite(x, "x")
    rows = x.reshape(-1, x.shape[-1]).tolist()
    mean = np.empty(len(rows))
    var = np.empty(len(rows))
    for i, row in enumerate(rows):
        m, v = _exact_stats(row)
        # float(Fraction) divides two Python ints: correctly rounded.
        mean[i], var[i] = float(m), float(v)
    return RowStats(mean.reshape(x.shape[:-1]), var.reshape(x.shape[:-1]))


def condition_number(stats: RowStats) -> np.ndarray:
    """Condition number of the variance of each row, :math:`\\kappa = \\sqrt{1 + \\mu^2/\\sigma^2}`.

    A relative perturbation of size :math:`u` in every value changes the
    variance by a relative amount of at most about :math:`2u\\kappa`; the naive
    formula's rounding error is about :math:`u\\kappa^2` (Chan, Golub and
    LeVeque 1983). :math:`\\kappa = 1` for a row centred at zero and about
    :math:`|\\mu|/\\sigma` for a row whose mean is large against its spread.

    Parameters
    ----------
    stats : RowStats
        The mean and variance of the rows, usually :func:`exact`'s.

    Returns
    -------
    ndarray, float64, shape of ``stats.var``
        ``inf`` for a constant nonzero row (:math:`\\sigma^2 = 0`), ``nan``
        for a row of zeros; no warning is raised for either.
    """
    mean = np.asarray(stats.mean, dtype=np.float64)
    var = np.asarray(stats.var, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(1.0 + mean * mean / var)


#: The floating algorithms by name, each ``f(x, dtype) -> RowStats``.
ALGORITHMS: dict[str, Callable[..., RowStats]] = {
    "naive": naive,
    "two-pass": two_pass,
    "corrected two-pass": corrected_two_pass,
    "Welford": welford,
    "Chan": chan,
}
