r"""The kernels' arithmetic, operation for operation, in NumPy float32 on the CPU.

The fused kernels add in a fixed order (the mean as two halves, ``mean_hi``
and its correction ``mean_lo``, each a row sum): each thread sums its own elements in
sequence, a warp combines its 32 lanes by a butterfly (lane ``i`` plus lane
``i ^ 16``, then ``^ 8``, ...), a block combines its warps the same way; each
row group sums ``dy * xhat`` and ``dy`` over its strip of rows, and a second
kernel sums the strips. This module performs exactly those float32 operations
in exactly that order, with the same launch plan
(:func:`lnorm.gpu.kernels.plan`). The kernels are compiled with
``--fmad=false`` and use correctly rounded division and square root, and
NumPy's float32 arithmetic is IEEE round-to-nearest, so on a GPU the kernels
and this emulation agree to the bit. Here it lets a machine without a GPU
check the algorithm against :mod:`lnorm.core`. The chapter "One kernel: fused layer
norm on the GPU" derives the order and checks the bits.

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
    """``a`` (float32) rounded to the output dtype. A value past float16's range
    becomes +-inf, as the kernels' ``cvt.rn.f16.f32`` makes it: no warning."""
    with np.errstate(over="ignore"):
        return a.astype(dtype)

def _lanes(a: np.ndarray, p: LaunchPlan) -> np.ndarray:
    """Arrange rows as the threads hold them: ``[row, i, thread, c]``, zero-padded.

    Thread ``t`` holds vectors ``t, t + G, t + 2G, ...`` of ``VEC`` elements,
    so element ``((i * G) + t) * VEC + c`` sits at ``[:, i, t, c]``.
    """
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
    r"""Sum each row of ``a`` (float32, shape ``(rows, D)``) in the kernels' order.

    Each thread adds its own elements in sequence (vector ``t``, ``t + G``,
    ... of ``vec`` elements, ``G`` threads per row), a warp's 32 lanes meet in
    a butterfly (lane ``i`` plus lane ``i ^ 16``, then ``^ 8``, ..., ``^ 1``),
    and for one row per block, warp 0 combines the warps' sums the same way.

    Parameters
    ----------
    a : ndarray, float32, shape (rows, D)
        Entries outside the row (beyond ``D``) count as exact zeros, which is
        what skipping them in the kernel amounts to.
    p : LaunchPlan
        The plan of ``(rows, D)`` (:func:`lnorm.gpu.kernels.plan`).

    Returns
    -------
    ndarray, float32, shape (rows,)
        The row sums, rounded at every addition as the kernel rounds.

    See Also
    --------
    lnorm.gpu.check.summation_depth : The additions on the longest path.

    Examples
    --------
    >>> from lnorm.gpu.kernels import plan
    >>> a = np.arange(2 * 600, dtype=np.float32).reshape(2, 600)
    >>> row_sum(a, plan(2, 600, np.float32)).tolist()
    [179700.0, 539700.0]
    """
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
    r"""Emulate the fused forward kernel.

    In float32, in the kernel's order: ``mean_hi = sum(x) / D``,
    ``mean_lo = sum(x - mean_hi) / D``, ``d = (x - mean_hi) - mean_lo``,
    ``var = sum(d * d) / D``, ``rstd = 1 / sqrt(var + eps)``,
    ``y = d * rstd * gamma + beta``, rounded once to the dtype of ``x``; every
    sum is :func:`lnorm.gpu.emulate.row_sum`. ``mean_hi + mean_lo`` is the
    corrected mean: ``mean_lo`` recovers what rounding ``mean_hi`` lost.

    Parameters
    ----------
    x : ndarray, shape (..., D), float32 or float16
        The input; the statistics are taken over the last axis.
    gamma, beta : ndarray, shape (D,), the dtype of ``x``
        Scale and shift.
    eps : float, default 1e-5
        Added to the variance.
    rung : {"v4", "v3", "v5"}, default "v4"
        Whose forward kernel. They make the same sums in the same order, so
        the result does not depend on it.

    Returns
    -------
    y : ndarray, shape and dtype of ``x``
        The normalized, scaled and shifted rows.
    mean_hi, mean_lo, rstd : ndarray, float32, shape ``x.shape[:-1]``
        The row statistics the backward takes.

    Raises
    ------
    ValueError, TypeError
        Arguments :func:`lnorm.gpu.kernels.check_forward_args` refuses.

    See Also
    --------
    lnorm.gpu.emulate.backward : The backward that takes these statistics.
    lnorm.gpu.run.FusedLayerNorm.forward : The kernel it emulates.
    lnorm.core.forward : The float64 reference.

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
    r"""Sum columns over strips of rows, as the backward kernel writes ``dgamma_part``.

    Parameters
    ----------
    a : ndarray, float32, shape (rows, D)
        The per-element terms, ``dy * xhat`` (for dgamma) or ``dy`` (for dbeta).
    p : LaunchPlan
        The plan of ``(rows, D)``: ``row_groups`` strips of
        ``rows_per_group`` rows.

    Returns
    -------
    ndarray, float32, shape (row_groups, D)
        Row ``k``: the sum of ``a`` over the ``k``-th strip of
        ``rows_per_group`` rows, added in row order.

    See Also
    --------
    lnorm.gpu.emulate.reduce_partials : The second stage, over the strips.

    Examples
    --------
    >>> from lnorm.gpu.kernels import plan
    >>> p = plan(40, 4, np.float32)  # strips of 16 rows: 16, 16 and 8
    >>> strip_sums(np.ones((40, 4), np.float32), p)[:, 0].tolist()
    [16.0, 16.0, 8.0]
    """
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

    Parameters
    ----------
    part : ndarray, float32, shape (row_groups, D)
        What :func:`lnorm.gpu.emulate.strip_sums` returns.
    slices : int, optional
        ``S``; default ``LN_REDUCE_SLICES``.

    Returns
    -------
    ndarray, float32, shape (D,)
        ``dgamma`` or ``dbeta``.

    See Also
    --------
    lnorm.gpu.emulate.strip_sums : The first stage.

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

    Parameters
    ----------
    dy, x : ndarray, shape (..., D), float32 or float16, one dtype
        The upstream gradient and the forward's input.
    mean_hi, mean_lo, rstd : ndarray, float32, shape ``x.shape[:-1]``
        As :func:`lnorm.gpu.emulate.forward` returns them.
    rung : {"v4", "v3", "v5"}, default "v4"
        Whose partial rows.
    rows_per_group : int, optional
        The strip, if not the plan's
        (:meth:`lnorm.gpu.kernels.LaunchPlan.with_strip`): the partial rows
        of a launch with other strips.

    Returns
    -------
    dgamma_part, dbeta_part : ndarray, float32, shape (partial rows, D)
        :func:`lnorm.gpu.emulate.strip_sums` of the two terms (v5: then
        :func:`lnorm.gpu.emulate.block_partials`).

    See Also
    --------
    lnorm.gpu.check.order_bound : How far two orders of their sum can differ.

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

    Parameters
    ----------
    part : ndarray, float32, shape (row_groups, D)
        What :func:`lnorm.gpu.emulate.strip_sums` returns.
    order : sequence of int, optional
        The order the groups finish in, a permutation of
        ``range(row_groups)``; default: in index order.

    Returns
    -------
    ndarray, float32, shape (D,)
        ``0 + part[order[0]] + part[order[1]] + ...``, rounded after every
        addition.

    Raises
    ------
    ValueError
        If ``order`` is not a permutation of the row groups.

    See Also
    --------
    lnorm.gpu.emulate.reduce_partials : v4's fixed order.

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
    r"""Add the column sums of the row groups of each block, as v5 does.

    Group ``q`` of a block hands its sums to group 0, for ``q = 1, ...,
    P - 1`` in order (``P = p.groups_per_block``); groups past the last row
    hold zeros.

    Parameters
    ----------
    part : ndarray, float32, shape (row_groups, D)
        What :func:`lnorm.gpu.emulate.strip_sums` returns for the v5 plan.
    p : LaunchPlan
        The v5 plan (``plan(rows, D, dtype, rung="v5")``).

    Returns
    -------
    ndarray, float32, shape (partial_rows, D)
        One partial row per block, what the reduction
        then sums.

    See Also
    --------
    lnorm.gpu.emulate.reduce_partials : The second stage.

    Examples
    --------
    >>> from lnorm.gpu.kernels import plan
    >>> p = plan(40, 64, np.float32, rung="v5")  # 5 warps' strips, 4 a block
    >>> block_partials(np.ones((5, 64), np.float32), p)[:, 0].tolist()
    [4.0, 1.0]
    """
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
    r"""Emulate the fused backward kernel and the dgamma/dbeta reduction.

    In float32: ``xhat = ((x - mean_hi) - mean_lo) * rstd``, ``g = gamma * dy``,
    ``dx = ((g - mean(g)) - xhat * mean(g * xhat)) * rstd`` with the row means
    summed in the kernel's order; ``dgamma = sum(dy * xhat)`` and
    ``dbeta = sum(dy)`` over rows, by strips (:func:`strip_sums`) and then
    over strips (:func:`reduce_partials`); for v5, the strips of a block added
    first (:func:`block_partials`); for v3, added into zeros in the order the
    groups finish (:func:`add_in_order`).

    Parameters
    ----------
    dy, x : ndarray, shape (..., D), float32 or float16, one dtype
        The upstream gradient and the forward's input.
    gamma : ndarray, shape (D,), the dtype of ``x``
        The scale.
    mean_hi, mean_lo, rstd : ndarray, float32, shape ``x.shape[:-1]``
        As :func:`lnorm.gpu.emulate.forward` returns them.
    rung : {"v4", "v3", "v5"}, default "v4"
        The backward kernel emulated (:data:`lnorm.gpu.kernels.RUNGS`); ``dx``
        is the same for all three.
    order : sequence of int, optional
        v3: the order the row groups finish in (default: index order, as the
        CPU-run kernels of one group per block add).
    rows_per_group : int, optional
        The backward's strip, if not the plan's
        (:meth:`lnorm.gpu.kernels.LaunchPlan.with_strip`): ``dx`` is the
        same, ``dgamma`` and ``dbeta`` follow the strip's order.

    Returns
    -------
    dx : ndarray, shape and dtype of ``x``
        The gradient of the input.
    dgamma, dbeta : ndarray, float32, shape (D,)
        The gradients of the scale and shift, summed over all rows.

    Raises
    ------
    ValueError, TypeError
        Arguments :func:`lnorm.gpu.kernels.check_backward_args` refuses.
    ValueError
        ``order`` with a rung other than v3, or an ``order`` that is not a
        permutation of the row groups.

    See Also
    --------
    lnorm.gpu.emulate.forward : Makes the statistics.
    lnorm.gpu.run.FusedLayerNorm.backward : The kernels it emulates.
    lnorm.core.backward : The float64 reference.

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
