"""Row-wise mean and variance: five floating-point algorithms and an exact reference.

Every function works over the last axis of ``x`` (rows of length ``D``),
vectorized across rows, and returns :class:`RowStats` ``(mean, var)`` of
shape ``x.shape[:-1]``, with the biased variance ``var = sum((x - mean)**2) / D``.
``x`` holds float16, float32 or float64 values, is never modified, and bad
input raises as in :mod:`lnorm.validate`.

The floating algorithms take ``(x, dtype=None)``: ``dtype`` is the
accumulation dtype (float16, float32 or float64; default that of ``x``). ``x``
is copied into it once, in C order, and every operation after that runs in
it, so the same algorithm can be studied in each precision.

Error bounds relative to the variance, with ``u`` the unit roundoff of the
accumulation dtype and ``kappa = sqrt(1 + mean**2 / var)``
(:func:`condition_number`). NumPy's sums are pairwise, so ``L = log2(D)``
stands where recursive summation would have ``D`` (Chan, Golub and LeVeque
1983; Higham 2002). ``L`` is the order of growth, not an exact count: NumPy
sums blocks of up to 128 elements with eight interleaved accumulators and
splits pairwise only above that.

``naive``
    ``mean(x**2) - mean(x)**2``: one pass, but the subtraction cancels;
    about ``L u kappa**2``.
``two_pass``
    The mean, then the mean of squared deviations: ``L u + (L u kappa)**2``.
``corrected_two_pass``
    Two-pass from the corrected mean ``m_hi + m_lo``: ``L u + L**3 u**3 kappa**2``.
``welford``
    Welford's streaming update, one column at a time (sequential, so ``D``,
    not ``L``): at most about ``D u kappa``.
``chan``
    Chan's pairwise merge of partial ``(n, mean, M2)``, partial ``i`` with
    ``i + h`` (``h`` half the count) at each level as a GPU reduction tree
    does, its weights rounded once to ``dtype``: about ``L u kappa``.
``exact``
    Exact rational arithmetic, rounded once to float64: the reference.

The chapters "The variance problem" (``book/04_stability.md``) and "Layer
norm in low precision" (``book/04b_low_precision.md``) derive and measure them.
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
    """Per-row mean and biased variance, each of shape ``x.shape[:-1]``."""

    mean: np.ndarray
    var: np.ndarray


def _prepare(x: ArrayLike, dtype: DTypeLike | None) -> np.ndarray:
    """Validate ``x`` and ``dtype``; return ``x`` copied into the accumulation dtype."""
    x = as_rows(x, "x")
    if dtype is None:
        acc = x.dtype
    else:
        acc = as_dtype(dtype, "dtype", SUPPORTED_DTYPES,
                        "float16, float32 or float64 (the accumulation dtype)")
    # A copy even when the dtype already matches: inputs are never modified.
    # C order, so that every sum runs along a contiguous row (pairwise, float16
    # added in float32) whatever the input's layout.
    return x.astype(acc, order="C", copy=True)


def naive(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Textbook one-pass variance, ``var = mean(x**2) - mean(x)**2``.

    Both terms are of size ``mean**2 + var`` and their difference is ``var``, so
    a rounding error of ``u (mean**2 + var)`` becomes a relative error of about
    ``u kappa**2``. Once ``kappa**2`` nears ``1/u`` the result can be zero or
    negative; it is returned as computed (no clamp), so that callers see it.

    Examples
    --------
    >>> row = 1e9 + np.array([1.0, -1.0, 2.0, -2.0])
    >>> float(naive(row).var), float(exact(row).var)
    (0.0, 2.5)
    """
    xa = _prepare(x, dtype)
    D = xa.shape[-1]
    mean = xa.sum(axis=-1) / D
    mean_sq = (xa * xa).sum(axis=-1) / D
    return RowStats(mean, mean_sq - mean * mean)


def two_pass(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Two-pass variance: the mean first, then the mean of squared deviations.

    Nothing large cancels, but the computed mean is off by some ``delta`` and,
    since exact deviations sum to zero, ``sum((x - mean - delta)**2) =
    sum((x - mean)**2) + D delta**2``. With ``delta`` of order ``L u |mean|``
    that adds ``(L u kappa)**2``, which overtakes ``L u`` near
    ``kappa = (L u)**-1/2``.

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


def corrected_mean(x: ArrayLike, dtype: DTypeLike | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The mean of each row as two arrays ``m_hi, m_lo`` of shape ``(..., 1)``.

    ``m_hi = fl(sum(x) / D)`` and ``m_lo = fl(sum(x - m_hi) / D)``: the mean of
    the deviations from ``m_hi`` is minus ``m_hi``'s own error. Where the offset
    dominates the row, ``x - m_hi`` is exact (Sterbenz's lemma), so centring as
    ``(x - m_hi) - m_lo`` leaves an error of order ``u * std``, not
    ``u * |mean|``. The fused GPU kernel centres this way.

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
    """Two-pass variance from the corrected mean of :func:`corrected_mean`.

    ``var = sum(c**2) / D`` with ``c = (x - m_hi) - m_lo``: in exact arithmetic
    the corrected two-pass formula of Chan, Golub and LeVeque (1983),
    ``(sum(d**2) - sum(d)**2 / D) / D`` with ``d = x - m_hi``. The ``D delta**2``
    term of :func:`two_pass` is gone. ``mean`` is ``m_hi + m_lo`` rounded.

    Examples
    --------
    >>> row = np.float32(3e4) + np.array([1.0, -1.0, 2.0, -2.0], np.float32)
    >>> float(corrected_two_pass(row).var), float(two_pass(row).var)
    (2.5, 2.5)
    """
    xa = _prepare(x, dtype)
    D = xa.shape[-1]
    m_hi, m_lo = corrected_mean(xa)
    c = (xa - m_hi) - m_lo
    return RowStats((m_hi + m_lo)[..., 0], (c * c).sum(axis=-1) / D)


def welford(x: ArrayLike, dtype: DTypeLike | None = None) -> RowStats:
    """Welford's one-pass streaming variance, vectorized across rows.

    For ``j = 1 .. D``, one column at a time for every row::

        delta = x_j - m;  m = m + delta / j;  M = M + delta * (x_j - m)

    and ``var = M / D``. Every update works with deviations from the running
    mean, so it never forms ``mean**2`` (Welford 1962).

    Examples
    --------
    >>> s = welford(np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 1.0]]))
    >>> s.mean.tolist(), s.var.tolist()
    ([2.5, 0.25], [1.25, 0.1875])
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
    """Chan's pairwise merge of partial ``(n, mean, M2)``: a reduction tree."""
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
            f"{name} must hold finite values only: the exact variance of inf or nan "
            "is undefined."
        )


def exact_row(row: ArrayLike) -> tuple[Fraction, Fraction]:
    """Exact mean and (biased) variance of one row, as two Fractions.

    Every finite float is a dyadic rational ``N_j / 2**k_j``. Scaled to a common
    denominator ``2**K`` the row becomes integers ``N_j`` and, with
    ``S1 = sum(N_j)`` and ``S2 = sum(N_j**2)``::

        mean = S1 / (D 2**K),    var = (D S2 - S1**2) / (D**2 2**(2K))

    in Python integers, with no rounding at all: in exact arithmetic the
    one-pass formula is safe.

    Examples
    --------
    >>> exact_row(np.array([1.0, 2.0, 4.0]))
    (Fraction(7, 3), Fraction(14, 9))
    """
    row = as_float_array(row, "row")
    if row.ndim != 1 or row.shape[0] < 1:
        raise ValueError("row must be one-dimensional with D >= 1 values; "
                         f"got shape {row.shape}.")
    _check_finite(row, "row")
    return _exact_stats(row.tolist())


def exact(x: ArrayLike) -> RowStats:
    """Exact mean and variance of every row, each rounded once to float64.

    Each result is the correctly rounded value of :func:`exact_row`'s. It loops
    over rows and elements in Python, so keep it to small inputs. Finite values
    only; a variance beyond the largest float64 raises ``OverflowError``.

    Examples
    --------
    >>> s = exact(np.array([[1.0, 2.0, 4.0]]))
    >>> s.mean.round(6).tolist(), s.var.round(6).tolist()
    ([2.333333], [1.555556])
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
    """Condition number of each row's variance, ``kappa = sqrt(1 + mean**2 / var)``.

    A relative perturbation of size ``u`` in every value changes the variance
    by a relative amount of at most about ``2 u kappa``. ``kappa = 1`` for a row
    centred at zero, about ``|mean| / std`` for a large offset; ``inf`` for a
    constant nonzero row and ``nan`` for a row of zeros, without a warning.

    Examples
    --------
    >>> rows = np.array([[1.0, -1.0], [101.0, 99.0], [3.0, 3.0]])
    >>> condition_number(exact(rows)).round(3).tolist()
    [1.0, 100.005, inf]
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
