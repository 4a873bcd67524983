r"""Input checks shared by every public function of ``lnorm``.

Each check returns the value it accepted (as an ndarray, float or int where
that is its job, never a copy) or raises an error whose message names the
argument, says what it got and how to fix it: ``TypeError`` for a wrong type
or dtype (integers, complex and object arrays are not floating; a bool is
not a number), ``ValueError`` for a wrong value or shape. Rows have shape
``(..., D)``: any number of rows, zero included, but not a 0-d array and not
``D = 0``. An ``out=`` buffer must be a writeable, C-contiguous ndarray of the
result's shape and dtype that shares no memory with an input
(``numpy.may_share_memory``, so interleaved views of one buffer are refused
too): the function would overwrite what it has still to read.

Examples
--------
>>> as_rows(np.ones((2, 3), np.float32), "x").shape
(2, 3)
>>> check_eps(0.0)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: eps must be finite and > 0 (it bounds rstd by 1/sqrt(eps)); got 0.0. ...
>>> as_rows(np.arange(3), "x")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
TypeError: x must have a floating dtype (float16, float32 or float64); got ...
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .cache import LayerNormCache

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
    "check_out",
    "check_forward_out",
    "check_backward_out",
]

#: Floating dtypes the public functions accept.
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(a, name: str) -> np.ndarray:
    r"""``np.asarray(a)`` if its dtype is one of :data:`SUPPORTED_DTYPES`."""
    arr = np.asarray(a)
    if arr.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, float32 or float64); "
            f"got {arr.dtype}. Convert it first, e.g. {name}.astype(np.float32)."
        )
    return arr


def as_rows(a, name: str) -> np.ndarray:
    r"""``np.asarray(a)``, floating, as rows of shape ``(..., D)`` with ``D >= 1``."""
    arr = as_float_array(a, name)
    if arr.ndim == 0:
        raise ValueError(
            f"{name} must have at least one dimension, shape (..., D); "
            "got a 0-d array. "
            f"Reshape a single value to {name}.reshape(1, 1) if that is what you mean."
        )
    if arr.shape[-1] < 1:
        raise ValueError(
            f"{name} must have a last axis of length D >= 1; got D = 0. Rows lie "
            "along the last axis: give each row at least one value, shape (..., D)."
        )
    return arr


def as_dtype(value, name: str, allowed: tuple[np.dtype, ...], what: str) -> np.dtype:
    r"""``np.dtype(value)`` if it is one of ``allowed`` (``what``, in words)."""
    try:
        dt = np.dtype(value)
    except TypeError as err:
        raise TypeError(f"{name} must be {what}; got {value!r}.") from err
    if dt not in allowed:
        raise TypeError(f"{name} must be {what}; got {dt.name}.")
    return dt


def check_param(p, name: str, D: int) -> np.ndarray:
    r"""A parameter vector (``gamma``, ``beta``): floating, of shape ``(D,)``."""
    arr = as_float_array(p, name)
    if arr.shape != (D,):
        raise ValueError(
            f"{name} must have shape (D,) = ({D},) to match the last axis of x; "
            f"got shape {arr.shape}."
        )
    return arr


def check_positive(value, name: str, example: str, why: str = "") -> float:
    r"""``value`` as a float, finite and > 0; ``example``, ``why``: for the message."""
    if type(value) is float and 0.0 < value < math.inf:
        return value  # the common case, before the slower checks of an ABC
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number such as {example}; "
            f"got {type(value).__name__}."
        )
    value = float(value)
    if not np.isfinite(value) or value <= 0.0:
        raise ValueError(
            f"{name} must be finite and > 0{why}; got {value!r}. "
            f"A typical value is {example}."
        )
    return value


def check_eps(eps) -> float:
    r"""``eps`` as a float, finite and > 0 (it bounds ``rstd`` by ``1/sqrt(eps)``)."""
    return check_positive(eps, "eps", "1e-5", " (it bounds rstd by 1/sqrt(eps))")


def check_int(value, name: str, minimum: int, hint: str = "") -> int:
    r"""``value`` as an int ``>= minimum`` (a float such as 2.0 is refused)."""
    if type(value) is int and value >= minimum:
        return value  # the common case, before the slower checks of an ABC
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer; got {type(value).__name__}. {hint}".rstrip()
        )
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}. {hint}".rstrip())
    return int(value)


def check_cache(cache):
    r"""``cache`` if it is a :class:`lnorm.LayerNormCache`, not ``(y, cache)``."""
    if not isinstance(cache, LayerNormCache):
        raise TypeError(
            "cache must be the LayerNormCache returned by lnorm.forward; "
            f"got {type(cache).__name__}."
        )
    return cache


def check_dy(dy, cache) -> np.ndarray:
    r"""``dy``, floating, of the shape of the forward's ``x`` recorded in ``cache``."""
    check_cache(cache)
    dy = as_float_array(dy, "dy")
    if dy.shape != cache.shape:
        raise ValueError(
            f"dy must have the shape of x, {cache.shape}, as recorded in the cache; "
            f"got {dy.shape}. Pass the gradient of the loss with respect to this "
            "forward's output y."
        )
    return dy


def check_out(out, name: str, shape: tuple[int, ...], dtype, *inputs) -> np.ndarray:
    r"""``out`` if a result may be written into it while ``inputs`` are read."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array; got {type(out).__name__}.")
    if out.dtype != np.dtype(dtype):
        raise TypeError(
            f"{name} must have dtype {np.dtype(dtype).name}, the dtype of the result; "
            f"got {out.dtype.name}."
        )
    if out.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}; got {out.shape}.")
    if not out.flags.c_contiguous:
        raise ValueError(
            f"{name} must be C-contiguous; pass a buffer made by "
            f"np.empty({tuple(shape)}, np.{out.dtype.name})."
        )
    if not out.flags.writeable:
        raise ValueError(
            f"{name} is read-only. An array held by a LayerNormCache is: "
            "pass a buffer of your own."
        )
    if any(np.may_share_memory(out, a) for a in inputs):
        raise ValueError(
            f"{name} shares memory with an input; the function would overwrite "
            "values it has still to read. Pass a separate array."
        )
    return out


def check_forward_out(out, x: np.ndarray):
    r"""The ``(y, xhat)`` buffers of a forward's ``out=``, or ``(None, None)``."""
    if out is None:
        return None, None
    if not isinstance(out, tuple) or len(out) != 2:
        got = (f"a tuple of {len(out)}" if isinstance(out, tuple)
               else type(out).__name__)
        raise TypeError(f"out must be a tuple (y, xhat) of two arrays; got {got}.")
    y = check_out(out[0], "out[0] (y)", x.shape, x.dtype, x)
    xhat = check_out(out[1], "out[1] (xhat)", x.shape, x.dtype, x, y)
    return y, xhat


def check_backward_out(out, dy: np.ndarray, cache):
    r"""A backward's ``out=`` buffer for ``dx``, or None."""
    if out is None:
        return None
    return check_out(out, "out", cache.shape, cache.dtype, dy, cache.xhat)
