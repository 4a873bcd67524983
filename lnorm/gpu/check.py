"""Test inputs, a forward-backward run, the float64 reference, and error measures.

Used alike for the NumPy emulation (any machine), the op-by-op version and
the kernels (on a GPU): all three take ``forward(x, gamma, beta)`` and
``backward(dy, x, gamma, mean, rstd)``. Each function is a thin layer over
what :mod:`lnorm` already has, keyed by name (``"x"``, ``"dx"``, ...) so that
outputs and the reference line up.
"""

from __future__ import annotations

import numpy as np

from ..bench import make_inputs as bench_inputs
from ..core import backward as core_backward
from ..core import forward as core_forward
from ..gradcheck import compare_gradients

__all__ = ["SHAPES", "make_inputs", "forward_backward", "reference", "relative_errors"]

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
        ``forward(x, gamma, beta) -> (y, mean, rstd)``, e.g.
        :func:`lnorm.gpu.emulate.forward` or ``FusedLayerNorm().forward``.
    backward : callable
        ``backward(dy, x, gamma, mean, rstd) -> (dx, dgamma, dbeta)``.
    inputs : dict
        ``x``, ``gamma``, ``beta``, ``dy`` (NumPy or CuPy arrays), as
        :func:`make_inputs` makes them.

    Returns
    -------
    dict
        ``y``, ``mean``, ``rstd``, ``dx``, ``dgamma``, ``dbeta`` as NumPy arrays.
    """
    x, gamma = inputs["x"], inputs["gamma"]
    y, mean, rstd = forward(x, gamma, inputs["beta"])
    dx, dgamma, dbeta = backward(inputs["dy"], x, gamma, mean, rstd)
    out = {"y": y, "mean": mean, "rstd": rstd, "dx": dx, "dgamma": dgamma, "dbeta": dbeta}
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
