r"""Seeded inputs ``x, gamma, beta, dy``, from one generator.

A chapter, ``python -m lnorm.bench``, the GPU checks and the tests draw the
same arrays from the same seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["make_inputs"]


def make_inputs(shape: Sequence[int], dtype, seed: int = 0, *,
                loc: float = 0.5, scale: float = 2.0, param_scale: float = 0.3):
    r"""Draw seeded inputs ``x, gamma, beta, dy`` for a benchmark or a test.

    Normal draws, in this order, from ``numpy.random.default_rng(seed)``:
    ``x`` with mean ``loc`` and deviation ``scale`` (an offset the centring must
    remove), ``gamma`` with mean 1 and ``beta`` with mean 0, both with deviation
    ``param_scale``, then ``dy`` standard; all converted to ``dtype`` last.

    Parameters
    ----------
    shape : sequence of int
        Shape ``(..., D)`` of ``x`` and ``dy``; ``gamma`` and ``beta`` are ``(D,)``.
    dtype : dtype-like
    seed : int, default 0
    loc, scale, param_scale : float, default 0.5, 2.0 and 0.3

    Returns
    -------
    x, gamma, beta, dy : ndarray

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
