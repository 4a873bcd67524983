r"""Input checks shared by every public function of ``lnorm``.

Each check returns the value it accepted (converted, where that is its job)
or raises a ``TypeError`` / ``ValueError`` whose message names the argument
and says how to fix it. Nothing here copies or modifies an array.

The checks, in the order a public function calls them:

* :func:`as_float_array`, :func:`as_rows`: arrays of float16, float32 or
  float64 (:data:`SUPPORTED_DTYPES`), and rows of shape ``(..., D)``;
* :func:`check_param`: a parameter vector of shape ``(D,)``;
* :func:`check_positive`, :func:`check_eps`, :func:`check_int`: scalars;
* :func:`check_cache`, :func:`check_dy`: the arguments of a backward;
* :func:`check_out`, :func:`check_forward_out`, :func:`check_backward_out`:
  arrays given to be written into (``out=``);
* :func:`as_dtype`: a dtype argument.

Examples
--------
>>> import numpy as np
>>> as_rows(np.ones((2, 3), np.float32), "x").shape
(2, 3)
>>> check_eps(1e-5)
1e-05
>>> check_eps(0.0)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: eps must be finite and > 0 (it bounds rstd by 1/sqrt(eps)); got 0.0. ...
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
    r"""Return ``a`` as an ndarray of dtype float16, float32 or float64.

    Parameters
    ----------
    a : array_like
        The value to check. An ndarray of a supported dtype is returned as
        it is (no copy).
    name : str
        The argument's name, for the error message.

    Returns
    -------
    ndarray
        ``np.asarray(a)``.

    Raises
    ------
    TypeError
        The dtype is not one of :data:`SUPPORTED_DTYPES` (integers, complex,
        object arrays); the message suggests ``name.astype(np.float32)``.

    See Also
    --------
    as_rows : The same, and a shape of rows ``(..., D)``.

    Examples
    --------
    >>> as_float_array([1.0, 2.0], "x").dtype
    dtype('float64')
    >>> as_float_array(np.arange(3), "x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: x must have a floating dtype (float16, float32 or float64); got ...
    """
    arr = np.asarray(a)
    if arr.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, float32 or float64); "
            f"got {arr.dtype}. Convert it first, e.g. {name}.astype(np.float32)."
        )
    return arr


def as_rows(a, name: str) -> np.ndarray:
    r"""Return ``a`` as a floating array of rows, shape ``(..., D)`` with ``D >= 1``.

    Zero rows (a leading axis of length 0) are allowed; a 0-d array and
    ``D = 0`` are not.

    Parameters
    ----------
    a : array_like
        The value to check; float16, float32 or float64.
    name : str
        The argument's name, for the error message.

    Returns
    -------
    ndarray
        ``np.asarray(a)``, not copied.

    Raises
    ------
    TypeError
        A dtype that is not floating (see :func:`as_float_array`).
    ValueError
        A 0-d array, or a last axis of length 0.

    See Also
    --------
    as_float_array : The dtype check alone.

    Examples
    --------
    >>> as_rows(np.zeros((0, 4)), "x").shape
    (0, 4)
    >>> as_rows(np.zeros((3, 0)), "x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: x must have a last axis of length D >= 1; got D = 0. ...
    """
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
    r"""Return ``value`` as one of the ``allowed`` dtypes.

    Parameters
    ----------
    value : dtype-like
        Anything ``np.dtype`` accepts: ``np.float32``, ``"float32"``, a dtype.
        As in NumPy, ``None`` means float64.
    name : str
        The argument's name, for the error message.
    allowed : tuple of numpy.dtype
        The dtypes to accept, e.g. :data:`SUPPORTED_DTYPES`.
    what : str
        What ``value`` must be, in words, for the error message
        (``"a floating dtype"``).

    Returns
    -------
    numpy.dtype

    Raises
    ------
    TypeError
        ``value`` is not a dtype, or not one of ``allowed``.

    See Also
    --------
    as_float_array : The same check on an array's dtype.

    Examples
    --------
    >>> as_dtype("float32", "dtype", SUPPORTED_DTYPES, "a floating dtype")
    dtype('float32')
    >>> as_dtype("int8", "dtype", SUPPORTED_DTYPES, "a floating dtype")
    Traceback (most recent call last):
    ...
    TypeError: dtype must be a floating dtype; got int8.
    """
    try:
        dt = np.dtype(value)
    except TypeError as err:
        raise TypeError(f"{name} must be {what}; got {value!r}.") from err
    if dt not in allowed:
        raise TypeError(f"{name} must be {what}; got {dt.name}.")
    return dt


def check_param(p, name: str, D: int) -> np.ndarray:
    r"""Return a parameter vector (``gamma``, ``beta``) of shape ``(D,)``, floating.

    Parameters
    ----------
    p : array_like
        The parameter; float16, float32 or float64.
    name : str
        The argument's name, for the error message.
    D : int
        The row length it must match (the last axis of ``x``).

    Returns
    -------
    ndarray
        ``np.asarray(p)``, not copied.

    Raises
    ------
    TypeError
        A dtype that is not floating.
    ValueError
        A shape other than ``(D,)``.

    See Also
    --------
    as_rows : The check of ``x``, which gives ``D``.

    Examples
    --------
    >>> check_param(np.ones(3), "gamma", 3).shape
    (3,)
    >>> check_param(np.ones(3), "gamma", 4)
    Traceback (most recent call last):
    ...
    ValueError: gamma must have shape (D,) = (4,) to match the last axis of x; ...
    """
    arr = as_float_array(p, name)
    if arr.shape != (D,):
        raise ValueError(
            f"{name} must have shape (D,) = ({D},) to match the last axis of x; "
            f"got shape {arr.shape}."
        )
    return arr


def check_positive(value, name: str, example: str, why: str = "") -> float:
    r"""Return ``value`` as a float, finite and > 0.

    Parameters
    ----------
    value : real number
        Python or NumPy; ``bool`` is refused. An integer too large for a
        float raises the ``OverflowError`` of ``float(value)``.
    name : str
        The argument's name, for the error message.
    example : str
        A typical value, quoted in the error message (``"1e-6"``).
    why : str, optional
        Appended to "must be finite and > 0" in the message, e.g.
        ``" (it bounds rstd by 1/sqrt(eps))"``.

    Returns
    -------
    float

    Raises
    ------
    TypeError
        Not a real number (a string, None, a bool, a complex number).
    ValueError
        NaN, an infinity, zero or a negative number.

    See Also
    --------
    check_eps : This check for ``eps``.
    check_int : The check of integer arguments.

    Examples
    --------
    >>> check_positive(2, "h", "1e-6")
    2.0
    >>> check_positive(-1.0, "h", "1e-6")
    Traceback (most recent call last):
    ...
    ValueError: h must be finite and > 0; got -1.0. A typical value is 1e-6.
    """
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
    r"""Return ``eps`` as a float, finite and > 0.

    ``eps`` is added to the variance, so it bounds ``rstd`` by ``1/sqrt(eps)``.

    Parameters
    ----------
    eps : real number
        The constant added to the variance.

    Returns
    -------
    float

    Raises
    ------
    TypeError
        Not a real number.
    ValueError
        NaN, an infinity, zero or a negative number.

    See Also
    --------
    check_positive : The general check this calls.

    Examples
    --------
    >>> check_eps(1e-12)
    1e-12
    >>> check_eps("1e-5")
    Traceback (most recent call last):
    ...
    TypeError: eps must be a real number such as 1e-5; got str.
    """
    return check_positive(eps, "eps", "1e-5", " (it bounds rstd by 1/sqrt(eps))")


def check_int(value, name: str, minimum: int, hint: str = "") -> int:
    r"""Return ``value`` as an int ``>= minimum`` (NumPy integers, no bools).

    Parameters
    ----------
    value : integer
        Python or NumPy integer; a float such as ``2.0`` is refused.
    name : str
        The argument's name, for the error message.
    minimum : int
        The smallest accepted value.
    hint : str, optional
        A sentence appended to the error message (how to choose a value).

    Returns
    -------
    int

    Raises
    ------
    TypeError
        Not an integer, or a bool.
    ValueError
        Below ``minimum``.

    See Also
    --------
    check_positive : The check of real-valued arguments.

    Examples
    --------
    >>> check_int(np.int64(3), "D", 1)
    3
    >>> check_int(0, "D", 1, "D is the row length.")
    Traceback (most recent call last):
    ...
    ValueError: D must be >= 1; got 0. D is the row length.
    """
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
    r"""Return ``cache`` if it is the :class:`lnorm.LayerNormCache` a forward returned.

    Parameters
    ----------
    cache : object
        The value passed as a backward's ``cache``.

    Returns
    -------
    LayerNormCache
        ``cache`` itself.

    Raises
    ------
    TypeError
        ``cache`` is not a :class:`lnorm.LayerNormCache` (a common slip:
        passing the whole ``(y, cache)`` tuple).

    See Also
    --------
    check_dy : The check of the backward's other argument.
    lnorm.cache.make_cache : How the forwards build the cache.

    Examples
    --------
    >>> check_cache("x")
    Traceback (most recent call last):
    ...
    TypeError: cache must be the LayerNormCache returned by lnorm.forward; got str.
    """
    if not isinstance(cache, LayerNormCache):
        raise TypeError(
            "cache must be the LayerNormCache returned by lnorm.forward; "
            f"got {type(cache).__name__}."
        )
    return cache


def check_dy(dy, cache) -> np.ndarray:
    r"""Return ``dy`` as a floating array with the shape of the forward's ``x``.

    Parameters
    ----------
    dy : array_like
        The upstream gradient passed to a backward.
    cache : LayerNormCache
        The forward's cache, which records the shape of ``x``.

    Returns
    -------
    ndarray
        ``np.asarray(dy)``, not copied.

    Raises
    ------
    TypeError
        ``cache`` is not a LayerNormCache, or ``dy`` is not floating.
    ValueError
        ``dy`` does not have the shape of ``x``.

    See Also
    --------
    check_cache : The first check this makes.

    Examples
    --------
    >>> import lnorm
    >>> _, cache = lnorm.forward(np.ones((2, 3)), np.ones(3), np.zeros(3))
    >>> check_dy(np.ones((2, 3)), cache).shape
    (2, 3)
    >>> check_dy(np.ones((3, 2)), cache)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: dy must have the shape of x, (2, 3), as recorded in the cache; ...
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


def check_out(out, name: str, shape: tuple[int, ...], dtype, *inputs) -> np.ndarray:
    r"""Return ``out`` if a result of ``shape`` and ``dtype`` may be written into it.

    Parameters
    ----------
    out : object
        The array passed to be written into.
    name : str
        Its name in messages.
    shape : tuple of int
        The shape of the result.
    dtype : dtype
        The dtype of the result.
    *inputs : ndarray
        Arrays the function reads while it writes ``out``.

    Returns
    -------
    ndarray
        ``out`` itself.

    Raises
    ------
    TypeError
        ``out`` is not a NumPy array, or not of ``dtype``.
    ValueError
        ``out`` is not of ``shape``, not C-contiguous, read-only, or may
        share memory with one of ``inputs`` (the function would overwrite what
        it has still to read). The test is ``numpy.may_share_memory``,
        which compares address ranges, so interleaved views of one buffer
        are refused too.

    See Also
    --------
    lnorm.fused.forward, lnorm.fused.backward : Take ``out=``.

    Examples
    --------
    >>> x = np.ones((2, 3), np.float32)
    >>> check_out(np.empty((2, 3), np.float32), "out", x.shape, x.dtype, x).shape
    (2, 3)
    >>> check_out(x, "out", x.shape, x.dtype, x)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: out shares memory with an input; ...
    """
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
    r"""Return the ``(y, xhat)`` buffers of a forward's ``out=``, or ``(None, None)``.

    Parameters
    ----------
    out : None or tuple of two ndarrays
        The forward's ``out`` argument.
    x : ndarray
        The forward's input (as :func:`as_rows` returned it).

    Returns
    -------
    y, xhat : ndarray or None
        The two buffers, each accepted by :func:`check_out` (shape and dtype
        of ``x``, sharing no memory with ``x`` or with each other).

    Raises
    ------
    TypeError
        ``out`` is not a tuple of two, or :func:`check_out` refuses one.
    ValueError
        :func:`check_out` refuses one.

    See Also
    --------
    check_out : The check of each buffer.

    Examples
    --------
    >>> x = np.ones((2, 3))
    >>> y, xhat = check_forward_out((np.empty((2, 3)), np.empty((2, 3))), x)
    >>> y.shape, check_forward_out(None, x)
    ((2, 3), (None, None))
    """
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
    r"""Return a backward's ``out=`` buffer for ``dx``, or None.

    Parameters
    ----------
    out : None or ndarray
        The backward's ``out`` argument.
    dy : ndarray
        The upstream gradient (as :func:`check_dy` returned it).
    cache : LayerNormCache
        The forward's cache.

    Returns
    -------
    ndarray or None
        ``out``, accepted by :func:`check_out`: the shape and dtype of ``x``,
        sharing no memory with ``dy`` or ``cache.xhat``.

    Raises
    ------
    TypeError, ValueError
        :func:`check_out` refuses ``out``.

    See Also
    --------
    check_forward_out : The same for a forward.

    Examples
    --------
    >>> import lnorm
    >>> _, cache = lnorm.forward(np.ones((2, 3)), np.ones(3), np.zeros(3))
    >>> check_backward_out(np.empty((2, 3)), np.ones((2, 3)), cache).shape
    (2, 3)
    >>> check_backward_out(None, np.ones((2, 3)), cache) is None
    True
    """
    if out is None:
        return None
    return check_out(out, "out", cache.shape, cache.dtype, dy, cache.xhat)
