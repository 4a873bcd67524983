r"""Test inputs, a forward-backward run, the float64 reference, and error measures.

Used alike for the NumPy emulation (any machine), the op-by-op version and
the kernels (on a GPU): all three take ``forward(x, gamma, beta)`` and
``backward(dy, x, gamma, mean_hi, mean_lo, rstd)``. Each function is a thin
layer over what :mod:`lnorm` already has, keyed by name (``"x"``, ``"dx"``,
...) so that outputs and the reference line up. The chapter "One kernel: fused layer
norm on the GPU" runs these checks; the error measure is that of the
gradient-check chapter.

Examples
--------
>>> from lnorm.gpu import emulate
>>> inp = make_inputs(16, 64, "float32")
>>> got = forward_backward(emulate.forward, emulate.backward, inp)
>>> errors = relative_errors(got, reference(inp))
>>> all(errors[k] <= error_bounds(64)[k] for k in ("y", "dx"))
True
"""

from __future__ import annotations

import numpy as np

from ..core import backward as core_backward
from ..core import forward as core_forward
from ..gradcheck import compare_gradients
from ..inputs import make_inputs as draw_inputs
from .kernels import LaunchPlan, plan

__all__ = [
    "SHAPES", "make_inputs", "forward_backward", "reference",
    "relative_errors",
    "summation_depth", "error_bounds", "order_bound", "atomic_check", "offset_errors",
]

#: ``(rows, D)`` at which the book and the tests check the kernels — between
#: them every kernel variant (tests/test_gpu.py asserts it), warp and block
#: per row, ``D`` a multiple of the vector width (512, 8192, 64, 12288) and
#: not (7, 513, 1027, 4099, 12289), up to the longest row held in registers,
#: rows longer than that (in chunks), and many short rows.
SHAPES = (
    (64, 7), (300, 512), (100, 513), (50, 1027), (40, 4099), (24, 8192), (5000, 64),
    (20, 12288), (6, 12289),
)
def _host(a) -> np.ndarray:
    """A NumPy array; CuPy arrays are copied from the device."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def make_inputs(rows: int, D: int, dtype, seed: int = 0) -> dict[str, np.ndarray]:
    r"""Seeded inputs ``x``, ``gamma``, ``beta``, ``dy`` for ``(rows, D)``, as a dict.

    Examples
    --------
    >>> for name, a in make_inputs(3, 8, "float16").items():
    ...     print(name, a.shape, a.dtype)
    x (3, 8) float16
    gamma (8,) float16
    beta (8,) float16
    dy (3, 8) float16
    """
    return dict(zip(("x", "gamma", "beta", "dy"), draw_inputs((rows, D), dtype, seed)))


def forward_backward(forward, backward, inputs: dict,
                     rung: str = "v4") -> dict[str, np.ndarray]:
    """Run ``forward`` then ``backward`` on ``inputs``; every result on the host."""
    x, gamma = inputs["x"], inputs["gamma"]
    rung_arg = {} if rung == "v4" else {"rung": rung}
    fwd_arg = rung_arg if rung == "v5" else {}
    y, hi, lo, rstd = forward(x, gamma, inputs["beta"], **fwd_arg)
    dx, dgamma, dbeta = backward(inputs["dy"], x, gamma, hi, lo, rstd, **rung_arg)
    out = {"y": y, "mean_hi": hi, "mean_lo": lo, "rstd": rstd, "dx": dx,
           "dgamma": dgamma, "dbeta": dbeta}
    return {k: _host(v) for k, v in out.items()}


def reference(
    inputs: dict[str, np.ndarray], eps: float = 1e-5
) -> dict[str, np.ndarray]:
    """Compute ``y``, ``dx``, ``dgamma``, ``dbeta`` in float64 for the stored inputs."""
    as64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    y, cache = core_forward(as64["x"], as64["gamma"], as64["beta"], eps)
    dx, dgamma, dbeta = core_backward(as64["dy"], cache)
    return {"y": y, "dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def relative_errors(result: dict, ref: dict) -> dict[str, float]:
    """Return the normwise relative error of ``result`` for every key of ``ref``."""
    names = tuple(ref)
    got = [_host(result[k]) for k in names]
    # tol only sets the pass/fail flag, which is not used here.
    compared = compare_gradients(got, [ref[k] for k in names], tol=1.0, names=names)
    return compared.rel_errors


def summation_depth(p: LaunchPlan) -> int:
    """Count the additions on the longest path of the kernels' row sums, ``k``."""
    nvec = p.D // p.vec
    serial = -(-nvec // p.threads_per_row) * p.vec
    return serial + 5 + (5 if p.per_block else 0)


def error_bounds(D: int, rung: str = "v4") -> dict[str, float]:
    r"""Bound the first-order error of the float32 kernels, for any row offset.

    With ``u = 2**-24`` and ``k`` the :func:`lnorm.gpu.check.summation_depth`
    of the plan:

    * ``mean_hi`` may be off by any amount as long as ``x - mean_hi`` is
      exact (Sterbenz's lemma, once the offset dominates the spread); then
      ``mean_lo`` is a ``k``-deep sum of the centred values, off by at most
      ``k u`` in units of the row's spread, and so is every ``d = (x -
      mean_hi) - mean_lo`` (plus one rounding);
    * the variance, a ``k``-deep sum of squares and one division, is off by
      ``(k + 2) u`` relative; ``rstd`` by half of that plus the square root
      and division, ``(k/2 + 3) u``;
    * ``xhat = d * rstd`` then carries ``(1.5 k + 5) u`` relative to
      ``max |xhat|`` and ``y = gamma * xhat + beta`` three roundings more:
      ``max_i |y_i - y_exact_i| / max_i |y_i| <= (1.5 k + 8) u``.

    The backward's ``dx = rstd (g - mean(g) - xhat mean(g xhat))`` subtracts
    terms of size ``rstd max|g|`` (``g = gamma dy``); the same count gives,
    relative to that scale, ``(2k + 12) u`` (the ``dx`` measure of
    :func:`lnorm.gpu.check.offset_errors`). Up to ``D = max_D()``, ``k <= 16 +
    ceil(log2 D)`` and both are of the form ``c u (1 + log2 D)``. Longer rows are
    summed by 512 threads, the busiest adding ``vec * ceil(D / vec / 512)``
    elements in sequence, so there ``k = vec * ceil(D / vec / 512) + 10 <= 16
    ceil(D / 8192) + 10`` grows linearly in ``D`` (34 at ``D = 12288``, 138 at
    65536). Nothing depends on the offset of ``x``:
    that is the point of the corrected mean. Measured errors sit far below (random
    rounding errors grow like ``sqrt(k)``, not ``k``).

    Examples
    --------
    >>> b = error_bounds(1024)
    >>> b["depth"], b["y"] * 2**24, b["dx"] * 2**24  # (1.5 k + 8) u, (2 k + 12) u
    (26, 47.0, 64.0)
    """
    k = summation_depth(plan(1, D, np.float32, rung))
    u = float(np.finfo(np.float32).eps) / 2
    return {"y": (1.5 * k + 8) * u, "dx": (2 * k + 12) * u, "depth": k}


def order_bound(part: np.ndarray) -> np.ndarray:
    r"""Bound how far two float32 sums of the same terms in two orders can differ.

    Adding ``n`` terms in sequence into zero rounds ``n - 1`` times, so in any
    order the float32 sum is within ``gamma_{n-1} sum_p |part_p|`` of the exact
    one, with ``gamma_m = m u / (1 - m u)`` and ``u = 2**-24`` (Higham,
    *Accuracy and Stability of Numerical Algorithms*, section 4.2). Two orders
    are within twice that of each other: how far v3's dgamma (atomics, any
    order) can be from v4's (a fixed order).

    Examples
    --------
    >>> from lnorm.gpu.emulate import add_in_order
    >>> part = np.array([[1.0], [1.0], [2.0**24]], np.float32)
    >>> gap = abs(float(add_in_order(part)[0] - add_in_order(part, [2, 0, 1])[0]))
    >>> gap, bool(gap <= order_bound(part)[0])
    (2.0, True)
    """
    part = np.asarray(part, dtype=np.float64)
    mu = max(part.shape[0] - 1, 0) * float(np.finfo(np.float32).eps) / 2
    return 2 * mu / (1 - mu) * np.abs(part).sum(axis=0)

def atomic_check(backward, inp: dict) -> dict:
    r"""Check the ladder's v3 (atomics) against v4's emulation.

    v3 changes only the order in which the row groups' column sums are added,
    so its ``dx`` must equal v4's bit for bit, and its ``dgamma`` and
    ``dbeta`` must lie within :func:`lnorm.gpu.check.order_bound` of v4's.

    Examples
    --------
    >>> from lnorm.gpu import emulate
    >>> r = atomic_check(emulate.backward, make_inputs(40, 64, "float32"))
    >>> r["dx_equal"], r["within"], r["gap"] <= r["bound"]
    (True, True, True)
    """
    from . import emulate

    stats = emulate.forward(inp["x"], inp["gamma"], inp["beta"])[1:]
    args = (inp["dy"], inp["x"], inp["gamma"], *stats)
    v4 = emulate.backward(*args)
    v3 = [_host(a) for a in backward(*args, rung="v3")]
    parts = emulate.column_partials(inp["dy"], inp["x"], *stats)
    within, worst = True, (0.0, 0.0)
    for got, want, part in zip(v3[1:], v4[1:], parts):
        gap = np.abs(got.astype(np.float64) - want)
        bound = order_bound(part)
        within &= bool((gap <= bound).all())
        j = int(np.argmax(gap))
        worst = max(worst, (float(gap[j]), float(bound[j])))
    return {"dx_equal": v3[0].tobytes() == v4[0].tobytes(), "gap": worst[0],
            "bound": worst[1], "within": within}

def offset_errors(forward, backward, D: int, offset: float, dy_offset: float = 0.0,
                  rows: int = 16, seed: int = 0) -> dict[str, float]:
    """Measure the error of float32 ``y`` and ``dx`` for rows shifted by ``offset``."""
    rng = np.random.default_rng(seed)
    inp = {"x": (rng.standard_normal((rows, D)) + offset).astype(np.float32),
           "gamma": (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
           "beta": (0.1 * rng.standard_normal(D)).astype(np.float32),
           "dy": (rng.standard_normal((rows, D)) + dy_offset).astype(np.float32)}
    got = forward_backward(forward, backward, inp)
    ref = reference(inp)
    x64 = inp["x"].astype(np.float64)
    rstd = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)
    scale = rstd * np.abs(inp["dy"].astype(np.float64) * inp["gamma"]).max(
        axis=1, keepdims=True)
    return {"y": float(np.abs(got["y"] - ref["y"]).max() / np.abs(ref["y"]).max()),
            "dx": float((np.abs(got["dx"] - ref["dx"]) / scale).max())}
