r"""What the forward keeps for the backward: :class:`LayerNormCache`.

The cache type, its constructor :func:`make_cache` and the accumulation dtype
:data:`ACC_DTYPE` sit below every module that builds or reads a cache
(:mod:`lnorm.validate`, :mod:`lnorm.core`, :mod:`lnorm.fused`), so that
imports only go down. The cache holds read-only views of ``xhat`` and
``rstd``, not copies: the arrays passed in keep their flags, so writing them
changes the cache (a forward given ``out=`` buffers does that on purpose).
``gamma`` is copied, so that the caller may go on updating its parameters
before the backward runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ACC_DTYPE", "LayerNormCache", "make_cache"]

#: Dtype in which statistics and reductions are accumulated on the CPU.
ACC_DTYPE = np.dtype(np.float64)


@dataclass(frozen=True)
class LayerNormCache:
    r"""What the forward saves for the backward (all arrays read-only).

    Built by :func:`lnorm.forward` through :func:`make_cache`; pass it to
    :func:`lnorm.backward` unchanged.

    Attributes
    ----------
    xhat : ndarray, shape (..., D), dtype of ``x``
        The normalized input ``(x - mean) * rstd``.
    rstd : ndarray, shape (...,), float64
        ``1 / sqrt(var + eps)`` for every row.
    gamma : ndarray, shape (D,)
        A copy of the scale, needed for ``g = gamma * dy``.

    Examples
    --------
    >>> import lnorm
    >>> _, cache = lnorm.forward(np.ones((2, 3), np.float32), np.ones(3), np.zeros(3))
    >>> cache.shape, cache.dtype, cache.rstd.dtype, cache.xhat.flags.writeable
    ((2, 3), dtype('float32'), dtype('float64'), False)
    """

    xhat: np.ndarray
    rstd: np.ndarray
    gamma: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        r"""Shape of the input ``x`` (and of ``dy`` and ``dx``)."""
        return self.xhat.shape

    @property
    def dtype(self) -> np.dtype:
        r"""Dtype of the input ``x`` (and of ``dx``)."""
        return self.xhat.dtype


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``; ``a`` itself keeps its flags."""
    view = a.view()
    view.setflags(write=False)
    return view


def make_cache(
    xhat: np.ndarray, rstd: np.ndarray, gamma: np.ndarray
) -> LayerNormCache:
    r"""The read-only cache of ``xhat``, ``rstd`` and ``gamma`` (views, see above)."""
    return LayerNormCache(
        xhat=_readonly(xhat),
        rstd=_readonly(rstd),
        gamma=_readonly(np.array(gamma, copy=True)),
    )
