r"""Finite-difference estimates of a gradient, and the error against the step.

Central differences and the complex step, with relative steps
``h_i = h * max(1, |a_i|)`` and the step actually taken after rounding; the
step sweep that draws the U-curve of error against step. Theory: the chapter
"Checking gradients" (``book/03_gradcheck.md``); :mod:`lnorm.gradcheck`
compares these estimates with a hand-written gradient.

Examples
--------
>>> import numpy as np
>>> from lnorm.finitediff import central_difference
>>> g = central_difference(lambda a: (a**3).sum(), [np.array([1.0, 2.0])])[0]
>>> np.round(g, 6)
array([ 3., 12.])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .validate import as_float_array, check_positive

__all__ = [
    "METHODS", "COMPLEX_STEP", "StepTooSmallError", "StepSweep", "unit_roundoff",
    "check_method", "default_step", "relative_steps", "as_arguments", "as_gradients",
    "displaced", "estimate", "central_difference", "complex_step", "relative_error",
    "step_sweep",
]

#: The two estimates — central differences and the complex step.
METHODS = ("central", "complex")
#: Step of the complex-step method — its relative truncation error, of order
#: h**2, is far below the unit roundoff of every dtype, and ``h * max(1, |a|)``
#: is a normal number even in complex64 (smallest normal about 1.2e-38).
COMPLEX_STEP = 1e-30



class StepTooSmallError(ValueError):
    r"""A step vanished: ``a_i + h_i`` rounds to ``a_i`` in the dtype.

    For the complex step: the imaginary part ``h_i`` underflows to zero in
    the complex dtype.

    See Also
    --------
    relative_steps : The step of each element.

    Examples
    --------
    >>> try:
    ...     central_difference(lambda a: a.sum(), [np.ones(2, np.float32)], h=1e-12)
    ... except StepTooSmallError as err:
    ...     print(isinstance(err, ValueError))
    True
    """


def unit_roundoff(dtype) -> float:
    r"""Unit roundoff ``u = eps / 2`` of a floating dtype.

    Parameters
    ----------
    dtype : floating dtype-like

    Returns
    -------
    float

    See Also
    --------
    default_step : Derives the central-difference step from ``u``.

    Examples
    --------
    >>> unit_roundoff(np.float32) == 2.0**-24
    True
    """
    return float(np.finfo(np.dtype(dtype)).eps) / 2.0


def check_method(method) -> str:
    r"""``method`` if it is one of :data:`METHODS`.

    Parameters
    ----------
    method : {"central", "complex"}

    Returns
    -------
    str

    Raises
    ------
    ValueError
        For any other value.

    See Also
    --------
    default_step : The step of each method.

    Examples
    --------
    >>> check_method("complex")
    'complex'
    """
    if method not in METHODS:
        raise ValueError(f"method must be 'central' or 'complex'; got {method!r}.")
    return method


def default_step(method: str, dtype=np.float64) -> float:
    r"""Default relative step: ``u**(1/3)`` central, 1e-30 complex.

    Parameters
    ----------
    method : {"central", "complex"}
    dtype : dtype-like, default float64
        Its :func:`unit_roundoff` is ``u``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        For an unknown ``method``.

    See Also
    --------
    lnorm.gradcheck.default_tolerance : The matching threshold.

    Examples
    --------
    >>> default_step("complex")
    1e-30
    """
    if check_method(method) == "complex":
        return COMPLEX_STEP
    return unit_roundoff(dtype) ** (1.0 / 3.0)


def relative_steps(a, h: float) -> np.ndarray:
    r"""The step of each element, ``h_i = h * max(1, |a_i|)``.

    Parameters
    ----------
    a : array_like
    h : float

    Returns
    -------
    ndarray of float64, shape of ``a``

    See Also
    --------
    default_step : The default ``h``.

    Examples
    --------
    >>> relative_steps(np.array([0.1, -3.0, 1e8]), 1e-5)
    array([1.e-05, 3.e-05, 1.e+03])
    """
    return h * np.maximum(1.0, np.abs(np.asarray(a, dtype=np.float64)))


def as_arguments(arrays) -> list[np.ndarray]:
    r"""The arguments of a loss as float arrays, checked.

    Parameters
    ----------
    arrays : list or tuple of array_like
        Non-empty; float16, float32 or float64 each.

    Returns
    -------
    list of ndarray

    Raises
    ------
    TypeError
        If ``arrays`` is not a non-empty list or tuple, or an entry is not float.

    See Also
    --------
    as_gradients : The gradients that go with them.

    Examples
    --------
    >>> [a.dtype.name for a in as_arguments([np.ones(2), np.ones(3, np.float32)])]
    ['float64', 'float32']
    """
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError("arrays must be a non-empty list of the arguments of f, "
                        "e.g. [x] or [x, gamma, beta].")
    return [as_float_array(a, f"arrays[{k}]") for k, a in enumerate(arrays)]


def as_gradients(grads, others, what: str, name: str = "grads") -> list:
    r"""Gradients as float64 arrays, one per entry of ``others`` (None kept).

    Parameters
    ----------
    grads : list or tuple of array_like or None
    others : sequence of array_like
        The arguments (or estimates) the gradients pair with.
    what, name : str
        Names for the messages.

    Returns
    -------
    list of ndarray or None

    Raises
    ------
    TypeError, ValueError
        Not a list; another length or shape; all None.

    See Also
    --------
    as_arguments : The arguments themselves.

    Examples
    --------
    >>> as_gradients([None, [1, 2]], [np.ones(3), np.ones(2)], "arrays")[1]
    array([1., 2.])
    """
    if not isinstance(grads, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple with one gradient (or None) "
                        f"per argument; got {type(grads).__name__}.")
    if len(grads) != len(others):
        raise ValueError(f"{name} has {len(grads)} entries but {what} has "
                         f"{len(others)}; give one per argument of f (None skips one).")
    out = [None if g is None else np.asarray(g, dtype=np.float64) for g in grads]
    for k, (g, a) in enumerate(zip(out, others)):
        if g is not None and g.shape != np.shape(a):
            raise ValueError(f"{name}[{k}] has shape {g.shape} but {what}[{k}] has "
                             f"shape {np.shape(a)}; a gradient has the same shape.")
    if all(g is None for g in out):
        raise ValueError(f"{name} is all None: give at least one gradient to check.")
    return out


def _scalar(value, complex_step: bool = False):
    if np.ndim(value) != 0:
        raise ValueError(f"f must return a scalar loss; got shape {np.shape(value)}.")
    if np.iscomplexobj(value) != complex_step:
        raise TypeError(
            "f returned a real number for a complex argument: the imaginary part was "
            "dropped (abs, .real, a comparison). Write f with complex-safe operations, "
            "e.g. lnorm.core.forward_formula." if complex_step
            else "f returned a complex number for real arguments.")
    return complex(value) if complex_step else float(value)


def displaced(f, arrays: list, moves: dict, method: str):
    r"""The change of ``f`` along a displacement, and the displacement taken.

    Central: ``f(a + d) - f(a - d)``; complex step: ``Im f(a + i d)``, with the
    displaced arguments rounded to their dtype (complex64 for float16 and
    float32). The displacement actually taken is returned, so that a quotient
    divides by what was really added: for central differences it is the whole
    span ``fl(a + d) - fl(a - d)``, about ``2 d``; for the complex step the
    rounded ``d``.

    Parameters
    ----------
    f : callable
        Scalar loss of the arguments.
    arrays : list of ndarray
        The arguments (:func:`as_arguments`).
    moves : dict of int to ndarray
        Displacement ``d`` of argument ``k``; the others stay put.
    method : {"central", "complex"}

    Returns
    -------
    diff : float
        ``f(a + d) - f(a - d)``, or ``Im f(a + i d)``.
    taken : dict of int to ndarray
        The float64 displacement taken for each key of ``moves``.

    Raises
    ------
    ValueError, TypeError
        If ``f`` returns no scalar, drops the imaginary part, or returns a
        complex number for real arguments.

    See Also
    --------
    estimate : One displacement per element.

    Examples
    --------
    >>> a = [np.array([1.0, 2.0])]
    >>> diff, taken = displaced(lambda a: (a**2).sum(), a, {0: np.array([1e-3, 0])},
    ...                         "central")
    >>> round(float(diff / taken[0][0]), 6)  # d(a**2)/da at a = 1
    2.0
    """
    if method == "central":
        sides = [[(a + sign * moves[k]).astype(a.dtype) if k in moves else a.copy()
                  for k, a in enumerate(arrays)] for sign in (1.0, -1.0)]
        taken = {k: sides[0][k].astype(np.float64) - sides[1][k] for k in moves}
        return _scalar(f(*sides[0])) - _scalar(f(*sides[1])), taken
    args = [(a + 1j * moves[k]).astype(np.result_type(a, np.complex64)) if k in moves
            else a.copy() for k, a in enumerate(arrays)]
    taken = {k: args[k].imag.astype(np.float64) for k in moves}
    return _scalar(f(*args), complex_step=True).imag, taken


def estimate(f, arrays: list, h: float, method: str, which) -> list:
    r"""Elementwise gradient estimates for the arguments in ``which``.

    Element ``i`` of argument ``k`` moves by ``h * max(1, |a_i|)``
    (:func:`relative_steps`); the estimate divides the change of ``f`` by the
    displacement actually taken (:func:`displaced`: about ``2 h_i`` for
    central differences, ``h_i`` for the complex step).

    Parameters
    ----------
    f : callable
    arrays : list of ndarray
    h : float
        Relative step.
    method : {"central", "complex"}
    which : iterable of int
        The arguments to estimate; the others get None.

    Returns
    -------
    list of ndarray or None

    Raises
    ------
    StepTooSmallError
        If a step rounds away (or underflows, for the complex step).
    ValueError, TypeError
        As :func:`displaced`.

    See Also
    --------
    central_difference, complex_step : Every argument at once.

    Examples
    --------
    >>> estimate(lambda a, b: (a * b).sum(), [np.ones(2), np.full(2, 3.0)], 1e-30,
    ...          "complex", [1])
    [None, array([1., 1.])]
    """
    out: list = [None] * len(arrays)
    for k in which:
        a, steps = arrays[k], relative_steps(arrays[k], h)
        out[k] = grad = np.empty(a.shape)
        for i in np.ndindex(a.shape):
            move = np.zeros(a.shape)
            move[i] = steps[i]
            diff, taken = displaced(f, arrays, {k: move}, method)
            if taken[k][i] == 0.0:
                what = ("a + h rounds to a" if method == "central" else
                        "the imaginary step underflows to zero")
                raise StepTooSmallError(
                    f"h = {h:.3g} is too small for {a.dtype} at arrays[{k}]"
                    f"{tuple(int(j) for j in i)}: {what}. Use a larger h "
                    f"(the default is {default_step(method, a.dtype):.2g}).")
            grad[i] = diff / taken[k][i]
    return out


def central_difference(f: Callable, arrays, h: float | None = None) -> list:
    r"""Central-difference gradient, ``(f(a + h_i e_i) - f(a - h_i e_i)) / s_i``.

    ``h_i = h * max(1, |a_i|)`` and ``s_i = fl(a_i + h_i) - fl(a_i - h_i)``,
    the span actually taken (``2 h_i`` before rounding). The error is about
    ``h**2`` (truncation) plus ``u / h`` (rounding), smallest near
    ``h = u**(1/3)``.

    Parameters
    ----------
    f : callable
        ``f(*arrays)`` returns a real scalar.
    arrays : list of ndarray
        Arguments of ``f``: float16, float32 or float64; never modified.
    h : float, optional
        Relative step; default :func:`default_step` of the widest dtype.

    Returns
    -------
    list of ndarray
        One float64 gradient per argument.

    Raises
    ------
    StepTooSmallError, TypeError, ValueError
        If a step rounds away; for bad arguments or a non-scalar ``f``.

    See Also
    --------
    complex_step : Exact to rounding for complex-safe ``f``.

    Examples
    --------
    >>> central_difference(lambda a: (a**2).sum(), [np.array([1.0, -4.0])])[0]
    array([ 2., -8.])
    """
    arrays = as_arguments(arrays)
    h = (default_step("central", np.result_type(*arrays)) if h is None
         else check_positive(h, "h", "1e-6"))
    return estimate(f, arrays, h, "central", range(len(arrays)))


def complex_step(f: Callable, arrays, h: float = COMPLEX_STEP) -> list:
    r"""Complex-step gradient, ``Im f(a + i h_i e_i) / h_i``.

    Parameters
    ----------
    f, arrays
        As in :func:`central_difference`; ``f`` must be complex-safe (no ``abs``).
    h : float, default 1e-30
        Relative step.

    Returns
    -------
    list of ndarray
        One float64 gradient per argument.

    Raises
    ------
    TypeError, StepTooSmallError, ValueError
        If ``f`` returns a real number; if a step underflows; for bad arguments.

    See Also
    --------
    central_difference : Needs no complex arithmetic.

    Examples
    --------
    >>> complex_step(lambda a: (a**3).sum(), [np.array([2.0])])[0]
    array([12.])
    """
    arrays = as_arguments(arrays)
    h = check_positive(h, "h", "1e-30")
    return estimate(f, arrays, h, "complex", range(len(arrays)))


def relative_error(grad, ref) -> tuple:
    r"""``(max_abs_error, max_rel_error, denominator, worst_index)`` of two arrays.

    ``max_rel_error = max|g - r| / max(max|g|, max|r|)``; a NaN counts as the
    largest error. Two empty arrays give ``(0.0, 0.0, 0.0, ())``.

    Parameters
    ----------
    grad, ref : array_like
        Same shape. Not checked here (NumPy would broadcast):
        :func:`as_gradients` checks it for the public functions.

    Returns
    -------
    tuple of (float, float, float, tuple of int)

    See Also
    --------
    lnorm.gradcheck.compare_gradients : One such row per argument.

    Examples
    --------
    >>> relative_error([1.0, 2.0], [1.0, 2.5])
    (0.5, 0.2, 2.5, (1,))
    """
    grad, ref = np.asarray(grad, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if grad.size == 0:
        return 0.0, 0.0, 0.0, ()
    err = np.abs(grad - ref)
    worst = np.unravel_index(int(np.argmax(err)), grad.shape)  # a NaN counts as largest
    max_abs = float(err[worst])
    denom = float(max(np.abs(grad).max(), np.abs(ref).max()))
    rel = 0.0 if max_abs == 0.0 else max_abs / max(denom, np.finfo(np.float64).tiny)
    return max_abs, rel, denom, tuple(int(i) for i in worst)


@dataclass(frozen=True)
class StepSweep:
    r"""Relative error of an elementwise estimate for each step in ``hs``.

    Parameters
    ----------
    method : {"central", "complex"}
    dtype : numpy.dtype
    hs, max_rel_error : ndarray of float64
        The steps and the error at each (NaN where a step rounded away).

    See Also
    --------
    step_sweep : Produces it.

    Examples
    --------
    >>> step_sweep(lambda a: (a**3).sum(), [np.ones(3)], [1e-1, 1e-5]).best_h
    1e-05
    """

    method: str
    dtype: np.dtype
    hs: np.ndarray
    max_rel_error: np.ndarray

    @property
    def best_h(self) -> float:
        r"""The step with the smallest error (ValueError if every one is NaN)."""
        return float(self.hs[np.nanargmin(self.max_rel_error)])

    @property
    def best_rel_error(self) -> float:
        r"""The smallest error over the sweep."""
        return float(np.nanmin(self.max_rel_error))


def step_sweep(f: Callable, arrays, hs, *, reference=None,
               method: str = "central") -> StepSweep:
    r"""Error of the elementwise gradient estimate of ``f`` for each step in ``hs``.

    Parameters
    ----------
    f, arrays, method
        As in :func:`lnorm.gradcheck.check_gradients`.
    hs : sequence of float
        Relative steps, each finite and > 0.
    reference : list of array_like or None, optional
        One per argument (None skips one); default the complex step of ``f``
        on the arguments in float64, which needs a complex-safe ``f``: pass
        ``reference`` for any other.

    Returns
    -------
    StepSweep

    Raises
    ------
    TypeError, ValueError
        For bad arguments or steps, or (default ``reference``) an ``f`` that
        is not complex-safe. A step that rounds away gives NaN, not an error.

    See Also
    --------
    central_difference : The estimate at one step.

    Examples
    --------
    >>> s = step_sweep(lambda a: (a**3).sum(), [np.ones(3)], [1e-1, 1e-5])
    >>> s.best_h, bool(s.best_rel_error < 1e-9)
    (1e-05, True)
    """
    method, arrays = check_method(method), as_arguments(arrays)
    hs = np.asarray(hs, dtype=np.float64)
    if hs.ndim != 1 or hs.size == 0:
        raise ValueError(f"hs must be a non-empty 1-d sequence of steps; got shape "
                         f"{hs.shape}.")
    for h in hs:
        check_positive(float(h), "every step in hs", "1e-6")
    if reference is None:
        reference = estimate(f, [a.astype(np.float64) for a in arrays], COMPLEX_STEP,
                              "complex", range(len(arrays)))
    reference = as_gradients(reference, arrays, "arrays", "reference")
    which = [k for k, r in enumerate(reference) if r is not None]
    rel = np.full(hs.size, np.nan)
    for j, h in enumerate(hs):
        try:
            estimates = estimate(f, arrays, float(h), method, which)
        except StepTooSmallError:
            continue
        rel[j] = max(relative_error(estimates[k], reference[k])[1] for k in which)
    return StepSweep(method, np.result_type(*arrays), hs, rel)
