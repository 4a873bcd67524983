r"""The kernels' arithmetic, operation for operation, in NumPy float32 on the CPU.

The kernels add in a fixed order: each thread sums its own elements in
sequence, a warp combines its 32 lanes by a butterfly (lane ``i`` plus lane
``i ^ 16``, then ``^ 8``, ...), a block combines its warps the same way; each
row group sums ``dy * xhat`` and ``dy`` over its strip of rows, and a second
kernel sums the strips. This module makes those float32 operations in that
order, with the same plan (:func:`lnorm.gpu.kernels.plan`). The kernels are
compiled with ``--fmad=false`` and round division and square root correctly,
and NumPy's float32 arithmetic is IEEE round-to-nearest, so the kernels and
the emulation agree to the bit.

Arrays are as the kernels take them: ``x``, ``dy`` of shape ``(..., D)``,
float32 or float16; ``gamma``, ``beta`` of shape ``(D,)`` and that dtype; the
row statistics ``mean_hi``, ``mean_lo``, ``rstd`` float32 of shape
``x.shape[:-1]``. ``rung`` is the kernels' (:data:`lnorm.gpu.kernels.RUNGS`);
what :func:`lnorm.gpu.kernels.check_forward_args` refuses is refused here.

Examples
--------
>>> from lnorm.gpu.check import make_inputs
>>> inp = make_inputs(4, 8, "float16")
>>> y, mean_hi, mean_lo, rstd = forward(inp["x"], inp["gamma"], inp["beta"])
>>> y.dtype, mean_hi.dtype, rstd.shape
(dtype('float16'), dtype('float32'), (4,))
"""

from __future__ import annotations

import numpy as np

from .kernels import (
    LaunchPlan,
    check_backward_args,
    check_forward_args,
    constants,
    plan,
)

__all__ = ["forward", "backward", "row_sum", "strip_sums", "reduce_partials",
           "block_partials", "column_partials", "add_in_order"]

F32 = np.float32



def _rounded(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` rounded to ``dtype``; past float16's range +-inf, as ``cvt.rn.f16.f32``."""
    with np.errstate(over="ignore"):
        return a.astype(dtype)

def _lanes(a: np.ndarray, p: LaunchPlan) -> np.ndarray:
    """Arrange rows as the threads hold them: ``[row, i, thread, c]``, zero-padded."""
    G, vec, vpt = p.threads_per_row, p.vec, p.vecs_per_thread
    padded = np.zeros((a.shape[0], vpt * G * vec), dtype=F32)
    padded[:, : a.shape[1]] = a
    return padded.reshape(a.shape[0], vpt, G, vec)


def _butterfly(s: np.ndarray) -> np.ndarray:
    """Sum the last axis (32 lanes) as ``__shfl_xor_sync`` with offsets 16 to 1 does."""
    while s.shape[-1] > 1:
        half = s.shape[-1] // 2
        # lane i (< half) adds lane i ^ half = i + half
        s = s[..., :half] + s[..., half:]
    return s[..., 0]


def row_sum(a: np.ndarray, p: LaunchPlan) -> np.ndarray:
    """Sum each row of ``a`` (float32, shape ``(rows, D)``) in the kernels' order."""
    lanes = _lanes(a, p)
    per_thread = np.zeros((a.shape[0], p.threads_per_row), dtype=F32)
    for i in range(p.vecs_per_thread):  # each thread: its elements in sequence
        for c in range(p.vec):
            per_thread += lanes[:, i, :, c]
    # (rows, warps)
    warps = _butterfly(per_thread.reshape(a.shape[0], p.threads_per_row // 32, 32))
    if not p.per_block:
        return warps[:, 0]
    # warp 0 reads 32 slots, zeros past the warps
    padded = np.zeros((a.shape[0], 32), dtype=F32)
    padded[:, : warps.shape[1]] = warps
    return _butterfly(padded)


def forward(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5, *,
    rung: str = "v4",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r"""Emulate the fused forward: ``y, mean_hi, mean_lo, rstd``.

    In float32, in the kernel's order: ``mean_hi = sum(x) / D``, ``mean_lo =
    sum(x - mean_hi) / D``, ``d = (x - mean_hi) - mean_lo``, ``var = sum(d * d) /
    D``, ``rstd = 1 / sqrt(var + eps)``, ``y = d * rstd * gamma + beta`` rounded
    once to the dtype of ``x``; every sum is :func:`row_sum`. ``mean_lo`` recovers
    what rounding ``mean_hi`` lost: ``mean_hi + mean_lo`` is the corrected mean.
    Every rung makes the same sums in the same order.

    Examples
    --------
    >>> x = np.float32(1e4) + np.arange(8, dtype=np.float32).reshape(1, 8)
    >>> y, hi, lo, rstd = forward(x, np.ones(8, np.float32), np.zeros(8, np.float32))
    >>> float(hi[0]), float(lo[0])
    (10003.5, 0.0)
    """
    p = check_forward_args(x, gamma, beta, eps, rung=rung)
    x32 = np.asarray(x, dtype=F32).reshape(p.rows, p.D)
    D = F32(p.D)
    mean_hi = row_sum(x32, p) / D
    mean_lo = row_sum(x32 - mean_hi[:, None], p) / D
    d = (x32 - mean_hi[:, None]) - mean_lo[:, None]
    rstd = F32(1) / np.sqrt(row_sum(d * d, p) / D + F32(eps))
    y = d * rstd[:, None] * np.asarray(gamma, F32) + np.asarray(beta, F32)
    lead = x.shape[:-1]
    return (_rounded(y, x.dtype).reshape(x.shape), mean_hi.reshape(lead),
            mean_lo.reshape(lead), rstd.reshape(lead))


def strip_sums(a: np.ndarray, p: LaunchPlan) -> np.ndarray:
    """Sum columns over strips of rows, as the backward writes ``dgamma_part``."""
    padded = np.zeros((p.row_groups * p.rows_per_group, p.D), dtype=F32)
    padded[: p.rows] = a
    strips = padded.reshape(p.row_groups, p.rows_per_group, p.D)
    acc = np.zeros((p.row_groups, p.D), dtype=F32)
    for k in range(p.rows_per_group):
        acc += strips[:, k]
    return acc


def reduce_partials(part: np.ndarray, slices: int | None = None) -> np.ndarray:
    r"""Sum the partial sums over row groups, as ``ln_bwd_reduce_params`` does.

    Slice ``s`` of ``S = LN_REDUCE_SLICES`` sums rows ``s, s + S, s + 2S, ...``
    of ``part`` in order; the ``S`` slices are then added in order. A fixed
    order, no atomics: the result is the same on every run. v5's
    ``ln_bwd_reduce_params_wide`` is the same with ``LN_REDUCE_SLICES_WIDE``
    slices (its batches of loads do not change the order).

    Examples
    --------
    >>> reduce_partials(np.ones((20, 3), np.float32)).tolist()
    [20.0, 20.0, 20.0]
    """
    S = slices or constants()["LN_REDUCE_SLICES"]
    sums = np.zeros((S, part.shape[1]), dtype=F32)
    for r in range(part.shape[0]):
        sums[r % S] += part[r]
    total = np.zeros(part.shape[1], dtype=F32)
    for s in range(S):
        total += sums[s]
    return total


def _terms(p: LaunchPlan, dy, x, mean_hi, mean_lo, rstd):
    """dy, xhat = ((x - mean_hi) - mean_lo) * rstd and rstd, float32, as rows."""
    x32 = np.asarray(x, dtype=F32).reshape(p.rows, p.D)
    dy32 = np.asarray(dy, dtype=F32).reshape(p.rows, p.D)
    hi, lo, rs = (np.asarray(a, F32).reshape(p.rows, 1)
                  for a in (mean_hi, mean_lo, rstd))
    return dy32, ((x32 - hi) - lo) * rs, rs


def _partials(p: LaunchPlan, dy32: np.ndarray, xhat: np.ndarray) -> tuple:
    """The backward kernel's partial rows of dgamma and dbeta under plan p."""
    parts = strip_sums(dy32 * xhat, p), strip_sums(dy32, p)
    if p.rung == "v5":  # a block's groups add theirs first
        parts = tuple(block_partials(part, p) for part in parts)
    return parts


def column_partials(dy, x, mean_hi, mean_lo, rstd, *, rung: str = "v4",
                    rows_per_group: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    r"""Return the partial rows of ``dy * xhat`` and ``dy`` the backward kernel writes.

    The row groups' column sums over their strips (v3: what its atomics
    add; v4: the ``(row_groups, D)`` buffers), or for v5 those of each block's
    groups added first: one partial row per block, what its second stage sums.

    Examples
    --------
    >>> x = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
    >>> _, hi, lo, rstd = forward(x, np.ones(4, np.float32), np.zeros(4, np.float32))
    >>> dgamma_part, dbeta_part = column_partials(np.ones_like(x), x, hi, lo, rstd)
    >>> dbeta_part[:, 0].tolist()  # strips of 16, 16 and 8 rows
    [16.0, 16.0, 8.0]
    >>> column_partials(np.ones_like(x), x, hi, lo, rstd,
    ...                 rows_per_group=32)[1][:, 0].tolist()
    [32.0, 8.0]
    """
    p = plan(int(np.prod(np.shape(x)[:-1])), np.shape(x)[-1], np.asarray(x).dtype,
             rung)
    if rows_per_group is not None:
        p = p.with_strip(rows_per_group)
    dy32, xhat, _ = _terms(p, dy, x, mean_hi, mean_lo, rstd)
    return _partials(p, dy32, xhat)


def add_in_order(part: np.ndarray, order=None) -> np.ndarray:
    r"""Add the partial sums into zeros one row at a time, as v3's atomics do.

    The ladder's v3 (``ln_bwd_atomic_*``) adds each row group's column sums
    into ``dgamma`` with ``atomicAdd`` when the group finishes. The order
    changes from run to run on a GPU; this is the sum for one order.

    Examples
    --------
    >>> part = np.array([[1.0], [1.0], [2.0**24]], np.float32)
    >>> add_in_order(part).tolist(), add_in_order(part, [2, 0, 1]).tolist()
    ([16777218.0], [16777216.0])
    """
    order = range(part.shape[0]) if order is None else list(order)
    if sorted(order) != list(range(part.shape[0])):
        raise ValueError(
            f"order must be a permutation of range({part.shape[0]}); got {order!r}."
        )
    total = np.zeros(part.shape[1], dtype=F32)
    for r in order:
        total += part[r]
    return total


def block_partials(part: np.ndarray, p: LaunchPlan) -> np.ndarray:
    """Add the column sums of the row groups of each block, as v5 does."""
    P = p.groups_per_block
    padded = np.zeros((p.partial_rows * P, p.D), dtype=F32)
    padded[: part.shape[0]] = part
    blocks = padded.reshape(p.partial_rows, P, p.D)
    acc = blocks[:, 0].copy()
    for q in range(1, P):
        acc += blocks[:, q]
    return acc


def backward(
    dy: np.ndarray, x: np.ndarray, gamma: np.ndarray, mean_hi: np.ndarray,
    mean_lo: np.ndarray, rstd: np.ndarray, *, rung: str = "v4", order=None,
    rows_per_group: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Emulate the fused backward and the reduction: ``dx, dgamma, dbeta``.

    In float32: ``xhat = ((x - mean_hi) - mean_lo) * rstd``, ``g = gamma * dy``,
    ``dx = ((g - mean(g)) - xhat * mean(g * xhat)) * rstd`` with the row means
    summed in the kernel's order; ``dgamma = sum(dy * xhat)`` and ``dbeta =
    sum(dy)`` over rows, by strips (:func:`strip_sums`), then over strips
    (:func:`reduce_partials`); v5 adds a block's strips first
    (:func:`block_partials`); v3 adds them into zeros in the order ``order`` of
    its row groups (:func:`add_in_order`; default, index order). ``dx`` is the
    same for every rung; ``rows_per_group`` emulates other strips.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> _, hi, lo, rstd = forward(x, g, b)
    >>> dx, dgamma, dbeta = backward(np.ones_like(x), x, g, hi, lo, rstd)
    >>> float(abs(dx).max()), dbeta.tolist()
    (0.0, [2.0, 2.0, 2.0, 2.0])
    """
    p = check_backward_args(dy, x, gamma, mean_hi, mean_lo, rstd, rung=rung,
                            rows_per_group=rows_per_group)
    if order is not None and p.rung != "v3":
        raise ValueError(f"order is for rung='v3' (atomics); got rung={rung!r}.")
    dy32, xhat, rs = _terms(p, dy, x, mean_hi, mean_lo, rstd)
    g = np.asarray(gamma, F32) * dy32
    D = F32(p.D)
    mean_g = (row_sum(g, p) / D)[:, None]
    mean_gxhat = (row_sum(g * xhat, p) / D)[:, None]
    dx = ((g - mean_g) - xhat * mean_gxhat) * rs
    parts = _partials(p, dy32, xhat)
    if p.rung == "v3":
        dgamma, dbeta = (add_in_order(part, order) for part in parts)
    else:  # v5's reduction has more slices
        slices = p.reduce_launch()[2][1]
        dgamma, dbeta = (reduce_partials(part, slices) for part in parts)
    return _rounded(dx, x.dtype).reshape(x.shape), dgamma, dbeta
