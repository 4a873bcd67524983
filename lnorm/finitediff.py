"""Finite-difference estimates of a gradient, and their error against the step.

The shared conventions (also those of :mod:`lnorm.gradcheck`):

* ``f(*arrays)`` returns a real scalar loss; ``arrays`` is a non-empty list
  of float16, float32 or float64 arrays, never modified. Gradients and
  estimates are float64, one per argument; ``None`` skips an argument.
* ``method`` is ``"central"``, ``(f(a + h_i e_i) - f(a - h_i e_i)) / s_i``,
  or ``"complex"``, the complex step ``Im f(a + i h_i e_i) / h_i``, which
  needs a complex-safe ``f`` (no ``abs``, no ``.real``; float16 and float32
  arguments move in complex64).
* Steps are relative, ``h_i = h * max(1, |a_i|)``, and every quotient divides
  by the displacement actually taken after rounding: ``s_i = fl(a_i + h_i) -
  fl(a_i - h_i)``, about ``2 h_i``, for central differences.
* A step that rounds away (or underflows, for the complex step) raises
  :class:`StepTooSmallError`, a ``ValueError``; bad arguments or an ``f``
  that returns no real scalar raise ``TypeError`` or ``ValueError`` naming
  the argument.

With ``F`` the size of the loss and ``M`` that of its third derivative, the
central error is about ``M h**2 / 6`` (truncation) plus ``u F / h``
(rounding), smallest at ``h = (3 u F / M)**(1/3)``, of order ``u**(1/3)``;
the complex step has no rounding term. Theory: the chapter "Checking
gradients" (``book/03_gradcheck.md``).

Examples
--------
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
    """A step vanished: ``a_i + h_i`` rounds to ``a_i``, or ``h_i`` underflows."""


def unit_roundoff(dtype) -> float:
    """Unit roundoff ``u = eps / 2`` of a floating dtype.

    Parameters
    ----------
    dtype : floating dtype-like

    Returns
    -------
    float

    Examples
    --------
    >>> unit_roundoff(np.float32) == 2.0**-24, unit_roundoff(np.float64) == 2.0**-53
    (True, True)
    """
    return float(np.finfo(np.dtype(dtype)).eps) / 2.0


def check_method(method) -> str:
    """``method`` if it is one of :data:`METHODS`."""
    if method not in METHODS:
        raise ValueError(f"method must be 'central' or 'complex'; got {method!r}.")
    return method


def default_step(method: str, dtype=np.float64) -> float:
    """Default relative step: ``u**(1/3)`` for central differences, 1e-30 complex.

    Parameters
    ----------
    method : {"central", "complex"}
    dtype : dtype-like, default float64
        Its :func:`unit_roundoff` is ``u``.

    Returns
    -------
    float

    Examples
    --------
    >>> default_step("central", np.float32) == unit_roundoff(np.float32) ** (1 / 3)
    True
    >>> default_step("complex")
    1e-30
    """
    if check_method(method) == "complex":
        return COMPLEX_STEP
    return unit_roundoff(dtype) ** (1.0 / 3.0)


def relative_steps(a, h: float) -> np.ndarray:
    """The step of each element, ``h_i = h * max(1, |a_i|)``, in float64."""
    return h * np.maximum(1.0, np.abs(np.asarray(a, dtype=np.float64)))


def as_arguments(arrays) -> list[np.ndarray]:
    """The arguments of a loss as float arrays, checked."""
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError("arrays must be a non-empty list of the arguments of f, "
                        "e.g. [x] or [x, gamma, beta].")
    return [as_float_array(a, f"arrays[{k}]") for k, a in enumerate(arrays)]


def as_gradients(grads, others, what: str, name: str = "grads") -> list:
    """Gradients as float64 arrays, one per entry of ``others`` (None kept), checked."""
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
    """``f(a + d) - f(a - d)`` or ``Im f(a + i d)``, and the displacement taken."""
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
    """Elementwise gradient estimates of the arguments in ``which``, None elsewhere."""
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
    """Central-difference gradient of ``f`` with respect to every argument.

    Parameters
    ----------
    f : callable
        ``f(*arrays)`` returns a real scalar.
    arrays : list of ndarray
    h : float, optional
        Relative step; default :func:`default_step` of the widest dtype.

    Returns
    -------
    list of ndarray
        One float64 gradient per argument.

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
    """Complex-step gradient of a complex-safe ``f``, as :func:`central_difference`."""
    arrays = as_arguments(arrays)
    h = check_positive(h, "h", "1e-30")
    return estimate(f, arrays, h, "complex", range(len(arrays)))


def relative_error(grad, ref) -> tuple:
    """``(max_abs_error, max_rel_error, denominator, worst_index)`` of two arrays.

    ``max_rel_error = max|g - r| / max(max|g|, max|r|)``; a NaN counts as the
    largest error. Two empty arrays give ``(0.0, 0.0, 0.0, ())``. The shapes are
    not checked (NumPy would broadcast): the public functions check them.

    Parameters
    ----------
    grad, ref : array_like

    Returns
    -------
    tuple of (float, float, float, tuple of int)

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
    """The relative error of an estimate at each step of ``hs``."""

    method: str
    dtype: np.dtype
    hs: np.ndarray
    max_rel_error: np.ndarray

    @property
    def best_h(self) -> float:
        """The step with the smallest error (ValueError if every one is NaN)."""
        return float(self.hs[np.nanargmin(self.max_rel_error)])

    @property
    def best_rel_error(self) -> float:
        """The smallest error over the sweep."""
        return float(np.nanmin(self.max_rel_error))


def step_sweep(f: Callable, arrays, hs, *, reference=None,
               method: str = "central") -> StepSweep:
    """Error of the elementwise gradient estimate of ``f`` for each step in ``hs``.

    A step that rounds away gives NaN there, not an error.

    Parameters
    ----------
    f, arrays, method
        As in the module docstring.
    hs : sequence of float
        Relative steps, each finite and > 0.
    reference : list of array_like or None, optional
        One per argument; default the complex step of ``f`` on the arguments in
        float64 (so pass one for an ``f`` that is not complex-safe).

    Returns
    -------
    StepSweep
        ``method``, ``dtype``, ``hs``, ``max_rel_error``, ``best_h`` and
        ``best_rel_error``.

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
