"""Test inputs, a forward-backward run, the float64 reference, and error measures.

Used alike for the NumPy emulation (any machine), the op-by-op version and
the kernels (on a GPU): all three take ``forward(x, gamma, beta)`` and
``backward(dy, x, gamma, mean_hi, mean_lo, rstd)``. Each function is a thin layer over
what :mod:`lnorm` already has, keyed by name (``"x"``, ``"dx"``, ...) so that
outputs and the reference line up.
"""

from __future__ import annotations

import numpy as np

from .kernels import LaunchPlan, plan

from ..bench import make_inputs as bench_inputs
from ..core import backward as core_backward
from ..core import forward as core_forward
from ..gradcheck import compare_gradients

__all__ = [
    "SHAPES", "make_inputs", "forward_backward", "reference", "relative_errors",
    "summation_depth", "error_bounds", "offset_errors",
]

#: ``(rows, D)`` at which the book and the tests check the kernels: between
#: them every kernel variant (tests/test_gpu.py asserts it), warp and block
#: per row, ``D`` a multiple of the vector width (512, 8192, 64) and not (7,
#: 513, 1027, 4099), up to the longest row, and many short rows.
SHAPES = ((64, 7), (300, 512), (100, 513), (50, 1027), (40, 4099), (24, 8192), (5000, 64))


def _host(a) -> np.ndarray:
    """A NumPy array; CuPy arrays are copied from the device."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def make_inputs(rows: int, D: int, dtype, seed: int = 0) -> dict[str, np.ndarray]:
    """:func:`lnorm.bench.make_inputs` of shape ``(rows, D)``, as a dict.

    Returns
    -------
    dict
        ``x`` and ``dy`` of shape ``(rows, D)``, ``gamma`` and ``beta`` of
        shape ``(D,)``, all in ``dtype``.
    """
    return dict(zip(("x", "gamma", "beta", "dy"), bench_inputs((rows, D), dtype, seed)))


def forward_backward(forward, backward, inputs: dict) -> dict[str, np.ndarray]:
    """Run ``forward`` then ``backward`` on ``inputs``; every result on the host.

    Parameters
    ----------
    forward : callable
        ``forward(x, gamma, beta) -> (y, mean_hi, mean_lo, rstd)``, e.g.
        :func:`lnorm.gpu.emulate.forward` or ``FusedLayerNorm().forward``.
    backward : callable
        ``backward(dy, x, gamma, mean_hi, mean_lo, rstd) -> (dx, dgamma, dbeta)``.
    inputs : dict
        ``x``, ``gamma``, ``beta``, ``dy`` (NumPy or CuPy arrays), as
        :func:`make_inputs` makes them.

    Returns
    -------
    dict
        ``y``, ``mean_hi``, ``mean_lo``, ``rstd``, ``dx``, ``dgamma``,
        ``dbeta`` as NumPy arrays.
    """
    x, gamma = inputs["x"], inputs["gamma"]
    y, hi, lo, rstd = forward(x, gamma, inputs["beta"])
    dx, dgamma, dbeta = backward(inputs["dy"], x, gamma, hi, lo, rstd)
    out = {"y": y, "mean_hi": hi, "mean_lo": lo, "rstd": rstd, "dx": dx, "dgamma": dgamma,
           "dbeta": dbeta}
    return {k: _host(v) for k, v in out.items()}


def reference(inputs: dict[str, np.ndarray], eps: float = 1e-5) -> dict[str, np.ndarray]:
    """``y``, ``dx``, ``dgamma``, ``dbeta`` from :func:`lnorm.forward` / :func:`lnorm.backward` in float64.

    The stored inputs are converted to float64 exactly, so this is the answer
    for the very numbers the kernel read, with errors of order 1e-16.
    """
    as64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    y, cache = core_forward(as64["x"], as64["gamma"], as64["beta"], eps)
    dx, dgamma, dbeta = core_backward(as64["dy"], cache)
    return {"y": y, "dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def relative_errors(result: dict, ref: dict) -> dict[str, float]:
    """The relative error of :mod:`lnorm.gradcheck` for every key of ``ref``.

    .. math::

        \\mathrm{rel} = \\frac{\\max_i |a_i - r_i|}{\\max(\\max_i |a_i|,\\ \\max_i |r_i|)}

    with ``a = result[key]`` and ``r = ref[key]`` (see
    :func:`lnorm.gradcheck.compare_gradients`). ``result`` values may be NumPy
    or CuPy arrays (CuPy ones are copied to the host).
    """
    names = tuple(ref)
    got = [_host(result[k]) for k in names]
    # tol only sets the pass/fail flag, which is not used here.
    compared = compare_gradients(got, [ref[k] for k in names], tol=1.0, names=names)
    return compared.rel_errors


def summation_depth(p: LaunchPlan) -> int:
    """Additions on the longest path of the kernels' row sums, ``k``.

    Each thread adds its elements (at most ``vecs_per_thread * vec``) in sequence, then
    a warp's 32 partial sums meet in 5 shuffle rounds, and a block's warps in
    5 more. ``k <= LN_ELEMS_PER_THREAD + log2(threads)``.
    """
    nvec = p.D // p.vec
    serial = -(-nvec // p.threads_per_row) * p.vec
    return serial + 5 + (5 if p.per_block else 0)


def error_bounds(D: int) -> dict[str, float]:
    """Worst-case first-order error bounds of the float32 kernels, any row offset.

    With ``u = 2**-24`` and ``k`` the :func:`summation_depth` of the plan:

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

    .. math::

        \\frac{\\max_i |y_i - y_i^{\\text{exact}}|}{\\max_i |y_i|} \\le (1.5k + 8)\\,u

    The backward's ``dx = rstd (g - mean(g) - xhat mean(g xhat))`` subtracts
    terms of size ``rstd max|g|`` (``g = gamma dy``); the same count gives,
    relative to that scale, ``(2k + 12) u`` (the ``dx`` measure of
    :func:`offset_errors`). With ``k <= 16 + log2 D`` both are of the form
    ``c u (1 + log2 D)``. Nothing depends on the offset of ``x``: that is the
    point of the corrected mean. Measured errors sit far below (random
    rounding errors grow like ``sqrt(k)``, not ``k``).

    Returns
    -------
    dict
        ``{"y": ..., "dx": ..., "depth": k}`` for float32 rows of length ``D``.
    """
    k = summation_depth(plan(1, D, np.float32))
    u = float(np.finfo(np.float32).eps) / 2
    return {"y": (1.5 * k + 8) * u, "dx": (2 * k + 12) * u, "depth": k}


def offset_errors(forward, backward, D: int, offset: float, dy_offset: float = 0.0,
                  rows: int = 16, seed: int = 0) -> dict[str, float]:
    """Errors of float32 ``y`` and ``dx`` against float64 for rows shifted by ``offset``.

    ``x`` is standard normal plus ``offset`` (so the offset is in units of
    the row's spread); ``dy`` is standard normal plus ``dy_offset``. ``y`` is
    measured relative to ``max |y|``; ``dx`` relative to ``rstd max |gamma
    dy|`` per row, the size of the terms its formula subtracts (which is
    ``max |dx|`` when ``dy_offset`` is 0, and much more when it is large).
    """
    rng = np.random.default_rng(seed)
    inp = {"x": (rng.standard_normal((rows, D)) + offset).astype(np.float32),
           "gamma": (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
           "beta": (0.1 * rng.standard_normal(D)).astype(np.float32),
           "dy": (rng.standard_normal((rows, D)) + dy_offset).astype(np.float32)}
    got = forward_backward(forward, backward, inp)
    ref = reference(inp)
    x64 = inp["x"].astype(np.float64)
    rstd = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)
    scale = rstd * np.abs(inp["dy"].astype(np.float64) * inp["gamma"]).max(axis=1, keepdims=True)
    return {"y": float(np.abs(got["y"] - ref["y"]).max() / np.abs(ref["y"]).max()),
            "dx": float((np.abs(got["dx"] - ref["dx"]) / scale).max())}
