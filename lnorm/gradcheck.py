r"""Numerical gradient checks for any scalar loss of NumPy arrays.

Hand-written gradients are compared with central differences, the complex step
or one random direction. Theory: chapter 3, "Checking gradients".

Examples
--------
>>> import numpy as np
>>> from lnorm.gradcheck import check_gradients
>>> a = np.array([0.5, -2.0, 30.0])
>>> check_gradients(lambda a: (a**3).sum(), [3 * a**2], [a]).passed
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .core import forward_formula
from .validate import SUPPORTED_DTYPES, as_dtype, as_float_array, check_positive

__all__ = [
    "StepTooSmallError", "GradCheckResult", "DirectionalResult", "StepSweep",
    "unit_roundoff", "default_step", "default_tolerance", "relative_steps",
    "layernorm_loss", "central_difference", "complex_step", "compare_gradients",
    "check_gradients", "directional_check", "step_sweep",
]

#: Step of the complex-step method: its h**2 truncation error is below every
#: floating-point number, and h * max(1, |a|) does not underflow.
COMPLEX_STEP = 1e-30

# Thresholds on the relative error for float16, float32, float64: central
# differences reach about u**(2/3) at best, the complex step a few u; two to
# three decades of margin for larger losses.
_TOLERANCES = {"central": dict(zip(SUPPORTED_DTYPES, (1e-1, 1e-3, 1e-8))),
               "complex": dict(zip(SUPPORTED_DTYPES, (1e-5, 1e-5, 1e-13)))}
_LABELS = {"central": "central differences", "complex": "complex step"}


class StepTooSmallError(ValueError):
    r"""A step vanished: ``a_i + h_i`` rounds to ``a_i`` in the dtype.

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


def _method(method) -> str:
    if method not in _LABELS:
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
    default_tolerance : The matching threshold.

    Examples
    --------
    >>> default_step("complex")
    1e-30
    """
    if _method(method) == "complex":
        return COMPLEX_STEP
    return unit_roundoff(dtype) ** (1.0 / 3.0)


def default_tolerance(method: str, dtype=np.float64, directional: bool = False):
    r"""Default threshold on the relative error of a check.

    Parameters
    ----------
    method : {"central", "complex"}
    dtype : float16, float32 or float64, default float64
    directional : bool, default False
        Ten times looser for the complex step.

    Returns
    -------
    float

    Raises
    ------
    ValueError, TypeError
        For an unknown ``method``; for another ``dtype``.

    See Also
    --------
    default_step : The matching step.

    Examples
    --------
    >>> default_tolerance("central"), default_tolerance("complex", directional=True)
    (1e-08, 1e-12)
    """
    dtype = as_dtype(dtype, "dtype", SUPPORTED_DTYPES, "float16, float32 or float64")
    tol = _TOLERANCES[_method(method)][dtype]
    return 10 * tol if directional and method == "complex" else tol


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


def _arrays(arrays) -> list[np.ndarray]:
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError("arrays must be a non-empty list of the arguments of f, "
                        "e.g. [x] or [x, gamma, beta].")
    return [as_float_array(a, f"arrays[{k}]") for k, a in enumerate(arrays)]


def _pair(grads, others, what: str, name: str = "grads") -> list:
    """``grads`` as float64 arrays (None kept), one per entry of ``others``."""
    if not isinstance(grads, (list, tuple)):
        raise TypeError(f"{name} must be a list with one gradient (or None) per "
                        "argument.")
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


def layernorm_loss(dy, eps: float = 1e-5) -> Callable:
    r"""The loss ``L(x, gamma, beta) = sum(dy * y)``, whose gradient is the backward's.

    Parameters
    ----------
    dy : array_like of float16, float32 or float64
        The upstream gradient ``dL/dy``; copied.
    eps : float, default 1e-5

    Returns
    -------
    callable
        ``L(x, gamma, beta)``, a complex-safe scalar (via ``forward_formula``).

    Raises
    ------
    TypeError
        If ``dy`` has no floating dtype.

    See Also
    --------
    check_gradients : Checks ``lnorm.backward`` against this loss.

    Examples
    --------
    >>> loss = layernorm_loss(np.ones((1, 2)))
    >>> float(loss(np.array([[1.0, 3.0]]), np.ones(2), np.zeros(2)))
    0.0
    """
    dy = np.array(as_float_array(dy, "dy"), copy=True)
    dy.setflags(write=False)
    return lambda x, gamma, beta: (dy * forward_formula(x, gamma, beta, eps)[0]).sum()


def _along(f, arrays: list, moves: dict, method: str):
    r"""``f``'s change along ``{k: d_k}`` and the displacement taken after rounding."""
    if method == "central":
        sides = [[(a + sign * moves[k]).astype(a.dtype) if k in moves else a.copy()
                  for k, a in enumerate(arrays)] for sign in (1.0, -1.0)]
        taken = {k: sides[0][k].astype(np.float64) - sides[1][k] for k in moves}
        return _scalar(f(*sides[0])) - _scalar(f(*sides[1])), taken
    args = [(a + 1j * moves[k]).astype(np.result_type(a, np.complex64)) if k in moves
            else a.copy() for k, a in enumerate(arrays)]
    taken = {k: args[k].imag.astype(np.float64) for k in moves}
    return _scalar(f(*args), complex_step=True).imag, taken


def _estimate(f, arrays: list, h: float, method: str, which) -> list:
    """Elementwise estimates for the arguments in ``which`` (None elsewhere)."""
    out: list = [None] * len(arrays)
    for k in which:
        a, steps = arrays[k], relative_steps(arrays[k], h)
        out[k] = grad = np.empty(a.shape)
        for i in np.ndindex(a.shape):
            move = np.zeros(a.shape)
            move[i] = steps[i]
            diff, taken = _along(f, arrays, {k: move}, method)
            if taken[k][i] == 0.0:
                raise StepTooSmallError(
                    f"h = {h:.3g} is below the spacing of {a.dtype} at arrays[{k}]"
                    f"{tuple(int(j) for j in i)}: a + h rounds to a. Use a larger h "
                    f"(the default is {default_step(method, a.dtype):.2g}).")
            grad[i] = diff / taken[k][i]
    return out


def central_difference(f: Callable, arrays, h: float | None = None) -> list:
    r"""Central-difference gradient, ``(f(a + h_i e_i) - f(a - h_i e_i)) / step_i``.

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
    arrays = _arrays(arrays)
    h = (default_step("central", np.result_type(*arrays)) if h is None
         else check_positive(h, "h", "1e-6"))
    return _estimate(f, arrays, h, "central", range(len(arrays)))


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
    arrays = _arrays(arrays)
    h = check_positive(h, "h", "1e-30")
    return _estimate(f, arrays, h, "complex", range(len(arrays)))


@dataclass(frozen=True)
class GradCheckResult:
    r"""Outcome of an elementwise check; its repr is the report.

    Parameters
    ----------
    method : {"central", "complex"}
    h, tol : float
        Relative step (NaN if none) and threshold on the relative error.
    rows : tuple of (name, max_abs_error, max_rel_error, denominator, worst_index)
        One per checked argument; ``denominator = max(max|g|, max|r|)``.
    n_evaluations : int

    See Also
    --------
    check_gradients : Produces it.

    Examples
    --------
    >>> compare_gradients([np.ones(2)], [np.ones(2)], tol=1e-8).rel_errors
    {'arg0': 0.0}
    """

    method: str
    h: float
    tol: float
    rows: tuple[tuple[str, float, float, float, tuple[int, ...]], ...]
    n_evaluations: int

    @property
    def max_rel_error(self) -> float:
        r"""Largest relative error (NaN counts as largest)."""
        return float(np.max([r[2] for r in self.rows]))

    @property
    def rel_errors(self) -> dict[str, float]:
        r"""Relative error of each checked argument, by name."""
        return {r[0]: r[2] for r in self.rows}

    @property
    def passed(self) -> bool:
        r"""True when every relative error is at most ``tol``."""
        return all(r[2] <= self.tol for r in self.rows)

    def __repr__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        lines = [f"{_LABELS[self.method]}, h = {self.h:.2g}, {self.n_evaluations} "
                 f"evaluations: {verdict} (tol {self.tol:.0e})",
                 f"  {'argument':<9}{'max abs err':>12}{'rel err':>10}  worst index"]
        for name, abs_err, rel_err, _, worst in self.rows:
            flag = "" if rel_err <= self.tol else "  <- FAIL"
            lines.append(f"  {name:<9}{abs_err:>12.1e}{rel_err:>10.1e}  "
                         f"{list(worst)}{flag}")
        return "\n".join(lines)


def _rel_error(grad, ref) -> tuple:
    """``(max_abs_error, max_rel_error, denominator, worst_index)`` of two arrays."""
    grad, ref = np.asarray(grad, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if grad.size == 0:
        return 0.0, 0.0, 0.0, ()
    err = np.abs(grad - ref)
    worst = np.unravel_index(int(np.argmax(err)), grad.shape)  # a NaN counts as largest
    max_abs = float(err[worst])
    denom = float(max(np.abs(grad).max(), np.abs(ref).max()))
    rel = 0.0 if max_abs == 0.0 else max_abs / max(denom, np.finfo(np.float64).tiny)
    return max_abs, rel, denom, tuple(int(i) for i in worst)


def compare_gradients(grads, estimates, tol: float, *, names=None) -> GradCheckResult:
    r"""Compare gradients with estimates (or any reference), argument by argument.

    Parameters
    ----------
    grads, estimates : list of array_like
        One pair of equal shapes per argument; ``None`` in ``grads`` skips one.
    tol : float
        Threshold on ``max|g - r| / max(max|g|, max|r|)``.
    names : sequence of str, optional
        One label per argument; default ``arg0, arg1, ...``.

    Returns
    -------
    GradCheckResult
        With ``h=nan`` and ``n_evaluations=0``.

    Raises
    ------
    ValueError
        If counts or shapes differ, every gradient is None, or ``tol <= 0``.

    See Also
    --------
    check_gradients : Estimates, then compares.

    Examples
    --------
    >>> r = compare_gradients([np.array([1.0, 2.0])], [np.array([1.0, 2.1])], tol=0.1)
    >>> r.passed, round(r.max_rel_error, 4)
    (True, 0.0476)
    """
    tol = check_positive(tol, "tol", "1e-8")
    grads = _pair(grads, estimates, "estimates")
    names = [f"arg{k}" for k in range(len(grads))] if names is None else list(names)
    if len(names) != len(grads):
        raise ValueError(f"names has {len(names)} entries but there are {len(grads)} "
                         "gradients; give one name each.")
    rows = tuple((name, *_rel_error(g, r))
                 for name, g, r in zip(names, grads, estimates) if g is not None)
    return GradCheckResult("central", float("nan"), tol, rows, 0)


def _setup(method, grads, arrays, h, tol, directional: bool):
    arrays = _arrays(arrays)
    grads = _pair(grads, arrays, "arrays")
    which = [k for k, g in enumerate(grads) if g is not None]
    dtype = np.result_type(*[arrays[k] for k in which])
    h = default_step(method, dtype) if h is None else check_positive(h, "h", "1e-6")
    tol = (default_tolerance(method, dtype, directional) if tol is None
           else check_positive(tol, "tol", "1e-8"))
    return arrays, grads, which, h, tol


def check_gradients(f: Callable, grads, arrays, *, method: str = "central",
                    h: float | None = None, tol: float | None = None,
                    names=None) -> GradCheckResult:
    r"""Check hand-written gradients of ``f`` against an elementwise estimate.

    Parameters
    ----------
    f, arrays
        As in :func:`central_difference` (complex-safe ``f`` for the complex step).
    grads : list of array_like or None
        One gradient per argument; None skips it.
    method : {"central", "complex"}, default "central"
    h, tol : float, optional
        Default :func:`default_step` and :func:`default_tolerance` of the dtype.
    names : sequence of str, optional

    Returns
    -------
    GradCheckResult

    Raises
    ------
    TypeError, ValueError
        For bad arguments (counts, shapes, dtypes, steps) or a non-scalar ``f``.

    See Also
    --------
    directional_check : Two evaluations whatever the size.

    Examples
    --------
    >>> a = np.array([1.0, 2.0])
    >>> check_gradients(lambda a: (a**2).sum(), [2 * a + 1e-3], [a]).passed
    False
    """
    arrays, grads, which, h, tol = _setup(_method(method), grads, arrays, h, tol, False)
    estimates = _estimate(f, arrays, h, method, which)
    n_eval = (2 if method == "central" else 1) * sum(arrays[k].size for k in which)
    result = compare_gradients(grads, estimates, tol, names=names)
    return replace(result, method=method, h=h, n_evaluations=n_eval)


@dataclass(frozen=True)
class DirectionalResult:
    r"""Outcome of a check along one random direction; its repr is the report.

    Parameters
    ----------
    method : {"central", "complex"}
    h, tol : float
    numeric, analytic : float
        Derivative along the direction, from ``f`` and from the gradients.
    scale, rel_error : float
        ``||g||_2``, and ``|numeric - analytic| / max(scale, |numeric|, |analytic|)``.
    n_elements : int

    See Also
    --------
    directional_check : Produces it.

    Examples
    --------
    >>> f, a, rng = lambda a: (a**2).sum(), np.ones(3), np.random.default_rng(0)
    >>> directional_check(f, [2 * a], [a], rng).n_evaluations
    2
    """

    method: str
    h: float
    tol: float
    numeric: float
    analytic: float
    scale: float
    rel_error: float
    n_elements: int

    @property
    def passed(self) -> bool:
        r"""True when ``rel_error <= tol``."""
        return self.rel_error <= self.tol

    @property
    def n_evaluations(self) -> int:
        r"""Evaluations of ``f``: 2 central, 1 complex step."""
        return 2 if self.method == "central" else 1

    def __repr__(self) -> str:
        n = self.n_evaluations
        return (f"{_LABELS[self.method]} along one random direction: "
                f"{'PASS' if self.passed else 'FAIL'}\n"
                f"  {self.n_elements:,} elements, {n} evaluation{'s' * (n > 1)} of f\n"
                f"  from f {self.numeric: .12e}\n  <g, v>  {self.analytic: .12e}\n"
                f"  rel err {self.rel_error:.1e} (tol {self.tol:.0e}, "
                f"scale ||g|| = {self.scale:.2e})")


def directional_check(f: Callable, grads, arrays, rng: np.random.Generator, *,
                      method: str = "central", h: float | None = None,
                      tol: float | None = None) -> DirectionalResult:
    r"""Check gradients along one random direction, in two evaluations of ``f``.

    Each checked element moves by ``h_i v_i`` with ``v_i`` standard normal; the
    chance of missing a bug is derived in chapter 3.

    Parameters
    ----------
    f, grads, arrays, method, h, tol
        As in :func:`check_gradients`; default ``tol`` has ``directional=True``.
    rng : numpy.random.Generator
        Draws the direction.

    Returns
    -------
    DirectionalResult

    Raises
    ------
    TypeError, ValueError
        As :func:`check_gradients`, or if ``rng`` is not a Generator.

    See Also
    --------
    check_gradients : Element by element.

    Examples
    --------
    >>> a = np.arange(1.0, 5.0)
    >>> directional_check(lambda a: (a**3).sum(), [3 * a**2], [a],
    ...                   np.random.default_rng(0)).passed
    True
    """
    arrays, grads, which, h, tol = _setup(_method(method), grads, arrays, h, tol, True)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator, "
                        "e.g. np.random.default_rng(0).")
    moves = {k: relative_steps(arrays[k], h) * rng.standard_normal(arrays[k].shape)
             for k in which}
    diff, taken = _along(f, arrays, moves, method)
    span = 2 * h if method == "central" else h
    numeric = diff / span
    analytic = float(sum(np.vdot(grads[k], taken[k]) for k in which)) / span
    scale = float(np.sqrt(sum(np.vdot(grads[k], grads[k]) for k in which)))
    err = abs(numeric - analytic)
    denom = max(scale, abs(numeric), abs(analytic), np.finfo(np.float64).tiny)
    return DirectionalResult(method, h, tol, float(numeric), float(analytic), scale,
                             0.0 if err == 0.0 else float(err / denom),
                             int(sum(arrays[k].size for k in which)))


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
        r"""The step with the smallest error."""
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
        As in :func:`check_gradients`.
    hs : sequence of float
        Relative steps, each finite and > 0.
    reference : list of array_like or None, optional
        One per argument (None skips one); default the float64 complex step.

    Returns
    -------
    StepSweep

    Raises
    ------
    TypeError, ValueError
        For bad arguments or steps.

    See Also
    --------
    central_difference : The estimate at one step.

    Examples
    --------
    >>> s = step_sweep(lambda a: (a**3).sum(), [np.ones(3)], [1e-1, 1e-5])
    >>> s.best_h, bool(s.best_rel_error < 1e-9)
    (1e-05, True)
    """
    method, arrays = _method(method), _arrays(arrays)
    hs = np.asarray(hs, dtype=np.float64)
    if hs.ndim != 1 or hs.size == 0:
        raise ValueError(f"hs must be a non-empty 1-d sequence of steps; got shape "
                         f"{hs.shape}.")
    for h in hs:
        check_positive(float(h), "every step in hs", "1e-6")
    if reference is None:
        reference = _estimate(f, [a.astype(np.float64) for a in arrays], COMPLEX_STEP,
                              "complex", range(len(arrays)))
    reference = _pair(reference, arrays, "arrays", "reference")
    which = [k for k, r in enumerate(reference) if r is not None]
    rel = np.full(hs.size, np.nan)
    for j, h in enumerate(hs):
        try:
            estimates = _estimate(f, arrays, float(h), method, which)
        except StepTooSmallError:
            continue
        rel[j] = max(_rel_error(estimates[k], reference[k])[1] for k in which)
    return StepSweep(method, np.result_type(*arrays), hs, rel)
