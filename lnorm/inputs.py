r"""Seeded inputs ``x, gamma, beta, dy`` for a chapter, a benchmark or a test.

One generator, so that a chapter, ``python -m lnorm.bench``, the GPU checks
and the tests draw the same arrays from the same seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["make_inputs"]


def make_inputs(shape: Sequence[int], dtype, seed: int = 0, *,
                loc: float = 0.5, scale: float = 2.0, param_scale: float = 0.3):
    r"""Draw seeded inputs ``x, gamma, beta, dy`` for a benchmark or a test.

    Normal draws, in this order from ``numpy.random.default_rng(seed)``:
    ``x`` with mean ``loc`` and standard deviation ``scale`` (an offset the
    centring must remove), ``gamma`` with mean 1 and deviation
    ``param_scale``, ``beta`` with mean 0 and deviation ``param_scale``,
    ``dy`` standard; converted to ``dtype`` last.

    Parameters
    ----------
    shape : sequence of int
        Shape ``(..., D)`` of ``x`` and ``dy``.
    dtype : dtype-like
        Dtype of all four arrays.
    seed : int, default 0
        Seed of the generator.
    loc, scale : float, default 0.5 and 2.0
        Mean and standard deviation of ``x``.
    param_scale : float, default 0.3
        Standard deviation of ``gamma`` and ``beta``.

    Returns
    -------
    x, gamma, beta, dy : ndarray
        ``x`` and ``dy`` of ``shape``, ``gamma`` and ``beta`` of ``(D,)``.

    See Also
    --------
    lnorm.bench.run : Times the ladder on these inputs.

    Examples
    --------
    >>> x, gamma, beta, dy = make_inputs((2, 3), np.float32, seed=1)
    >>> x.shape, gamma.shape, x.dtype
    ((2, 3), (3,), dtype('float32'))
    """
    rng = np.random.default_rng(seed)
    D = shape[-1]
    x = rng.normal(loc, scale, size=shape).astype(dtype)
    gamma = rng.normal(1.0, param_scale, size=D).astype(dtype)
    beta = rng.normal(0.0, param_scale, size=D).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    return x, gamma, beta, dy
