"""Test inputs, the float64 reference from :mod:`lnorm.core`, and error measures.

Used alike for the NumPy emulation (any machine) and the kernels (on a GPU).
"""

from __future__ import annotations

import numpy as np

from ..core import backward as core_backward
from ..core import forward as core_forward

__all__ = ["make_inputs", "reference", "relative_errors"]


def make_inputs(rows: int, D: int, dtype, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded ``x``, ``gamma``, ``beta``, ``dy`` of shape ``(rows, D)`` / ``(D,)``, in ``dtype``.

    ``x`` has a nonzero mean (0.5) and spread (2) per row, ``gamma`` is near 1,
    ``beta`` and ``dy`` are of order 0.1 and 1: values a float16 holds with
    room to spare.
    """
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    return {
        "x": (0.5 + 2.0 * rng.standard_normal((rows, D))).astype(dtype),
        "gamma": (1.0 + 0.1 * rng.standard_normal(D)).astype(dtype),
        "beta": (0.1 * rng.standard_normal(D)).astype(dtype),
        "dy": rng.standard_normal((rows, D)).astype(dtype),
    }


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
    """Normwise relative error ``max|result - ref| / max|ref|`` for every key of ``ref``.

    ``result`` values may be NumPy or CuPy arrays (CuPy ones are copied to the host).
    """
    out = {}
    for name, r in ref.items():
        got = result[name]
        got = got.get() if hasattr(got, "get") else got
        got = np.asarray(got, dtype=np.float64)
        scale = np.max(np.abs(r)) if r.size else 0.0
        out[name] = float(np.max(np.abs(got - r)) / scale) if scale > 0 else float(np.max(np.abs(got), initial=0.0))
    return out
