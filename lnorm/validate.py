r"""Input checks shared by every public function of ``lnorm``.

Each check returns the value it accepted (converted, where that is its job)
or raises a ``TypeError`` / ``ValueError`` whose message names the argument
and says how to fix it. Nothing here copies or modifies an array.

Examples
--------
>>> import numpy as np
>>> as_rows(np.ones((2, 3), np.float32), "x").shape
(2, 3)
>>> check_eps(1e-5)
1e-05
>>> check_eps(0.0)
Traceback (most recent call last):
...
ValueError: eps must be finite and > 0 (it bounds rstd by 1/sqrt(eps)); got 0.0. A typical value is 1e-5.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = [
    "SUPPORTED_DTYPES",
    "as_float_array",
    "as_rows",
    "as_dtype",
    "check_param",
    "check_positive",
    "check_eps",
    "check_int",
    "check_cache",
    "check_dy",
]

#: Floating dtypes the public functions accept.
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(a, name: str) -> np.ndarray:
    """``a`` as an ndarray of dtype float16, float32 or float64, or a TypeError.

    Examples
    --------
    >>> as_float_array([1.0, 2.0], "x").dtype
    dtype('float64')
    """
    arr = np.asarray(a)
    if arr.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, float32 or float64); "
            f"got {arr.dtype}. Convert it first, e.g. {name}.astype(np.float32)."
        )
    return arr


def as_rows(a, name: str) -> np.ndarray:
    """``a`` as a floating array of rows, shape ``(..., D)`` with ``D >= 1``.

    Zero rows (a leading axis of length 0) are allowed; a 0-d array and
    ``D = 0`` are not.

    Examples
    --------
    >>> as_rows(np.zeros((0, 4)), "x").shape
    (0, 4)
    """
    arr = as_float_array(a, name)
    if arr.ndim == 0:
        raise ValueError(
            f"{name} must have at least one dimension, shape (..., D); got a 0-d array. "
            f"Reshape a single value to {name}.reshape(1, 1) if that is what you mean."
        )
    if arr.shape[-1] < 1:
        raise ValueError(f"{name} must have a last axis of length D >= 1; got D = 0.")
    return arr


def as_dtype(value, name: str, allowed: tuple[np.dtype, ...], what: str) -> np.dtype:
    """``value`` as one of the ``allowed`` dtypes, or a TypeError naming ``name``.

    Examples
    --------
    >>> as_dtype("float32", "dtype", SUPPORTED_DTYPES, "a floating dtype")
    dtype('float32')
    """
    try:
        dt = np.dtype(value)
    except TypeError as err:
        raise TypeError(f"{name} must be {what}; got {value!r}.") from err
    if dt not in allowed:
        raise TypeError(f"{name} must be {what}; got {dt.name}.")
    return dt


def check_param(p, name: str, D: int) -> np.ndarray:
    """A parameter vector (``gamma``, ``beta``) of shape ``(D,)``, floating.

    Examples
    --------
    >>> check_param(np.ones(3), "gamma", 3).shape
    (3,)
    """
    arr = as_float_array(p, name)
    if arr.shape != (D,):
        raise ValueError(
            f"{name} must have shape (D,) = ({D},) to match the last axis of x; "
            f"got shape {arr.shape}."
        )
    return arr


def check_positive(value, name: str, example: str, why: str = "") -> float:
    """``value`` as a float, finite and > 0.

    Examples
    --------
    >>> check_positive(2, "h", "1e-6")
    2.0
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number such as {example}; got {type(value).__name__}."
        )
    value = float(value)
    if not np.isfinite(value) or value <= 0.0:
        raise ValueError(
            f"{name} must be finite and > 0{why}; got {value!r}. A typical value is {example}."
        )
    return value


def check_eps(eps) -> float:
    """``eps`` as a float, finite and > 0 (it bounds ``rstd`` by ``1/sqrt(eps)``).

    Examples
    --------
    >>> check_eps(1e-12)
    1e-12
    """
    return check_positive(eps, "eps", "1e-5", " (it bounds rstd by 1/sqrt(eps))")


def check_int(value, name: str, minimum: int, hint: str = "") -> int:
    """``value`` as an int ``>= minimum`` (NumPy integers accepted, bools refused).

    Examples
    --------
    >>> check_int(np.int64(3), "D", 1)
    3
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}. {hint}".rstrip())
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}. {hint}".rstrip())
    return int(value)


def check_cache(cache):
    """``cache`` if it is the :class:`lnorm.LayerNormCache` a forward returned.

    Examples
    --------
    >>> check_cache("x")
    Traceback (most recent call last):
    ...
    TypeError: cache must be the LayerNormCache returned by lnorm.forward; got str.
    """
    from .core import LayerNormCache  # core imports this module: resolve at call time

    if not isinstance(cache, LayerNormCache):
        raise TypeError(
            "cache must be the LayerNormCache returned by lnorm.forward; "
            f"got {type(cache).__name__}."
        )
    return cache


def check_dy(dy, cache) -> np.ndarray:
    """``dy`` as a floating array with the shape of the forward's ``x``.

    Examples
    --------
    >>> import lnorm
    >>> _, cache = lnorm.forward(np.ones((2, 3)), np.ones(3), np.zeros(3))
    >>> check_dy(np.ones((2, 3)), cache).shape
    (2, 3)
    """
    check_cache(cache)
    dy = as_float_array(dy, "dy")
    if dy.shape != cache.shape:
        raise ValueError(
            f"dy must have the shape of x, {cache.shape}, as recorded in the cache; "
            f"got {dy.shape}. Pass the gradient of the loss with respect to this "
            "forward's output y."
        )
    return dy
