r"""Numerical gradient checks for any scalar loss of NumPy arrays.

Hand-written gradients are compared with central differences, the complex step
or one random direction. Theory: the chapter "Checking gradients"
(``book/03_gradcheck.md``).

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
from .finitediff import (
    as_arguments,
    as_gradients,
    check_method,
    default_step,
    displaced,
    estimate,
    relative_error,
    relative_steps,
)
from .validate import SUPPORTED_DTYPES, as_dtype, as_float_array, check_positive

__all__ = [
    "GradCheckResult", "DirectionalResult", "default_tolerance", "layernorm_loss",
    "compare_gradients", "check_gradients", "directional_check",
]

# Thresholds on the relative error for float16, float32, float64: central
# differences reach about u**(2/3) at best (6e-3, 1.5e-5, 2.3e-11), the complex
# step a few u (of complex64 for float16 and float32); the margin for larger
# losses is about one decade for float16 central differences, two for the rest.
_TOLERANCES = {"central": dict(zip(SUPPORTED_DTYPES, (1e-1, 1e-3, 1e-8))),
               "complex": dict(zip(SUPPORTED_DTYPES, (1e-5, 1e-5, 1e-13)))}
_LABELS = {"central": "central differences", "complex": "complex step",
           "reference": "against a reference"}



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
    lnorm.finitediff.default_step : The matching step.

    Examples
    --------
    >>> default_tolerance("central"), default_tolerance("complex", directional=True)
    (1e-08, 1e-12)
    """
    dtype = as_dtype(dtype, "dtype", SUPPORTED_DTYPES, "float16, float32 or float64")
    tol = _TOLERANCES[check_method(method)][dtype]
    return 10 * tol if directional and method == "complex" else tol


def layernorm_loss(dy, eps: float = 1e-5) -> Callable:
    r"""The loss ``L(x, gamma, beta) = sum(dy * y)``, whose gradient is the backward's.

    Parameters
    ----------
    dy : array_like of float16, float32 or float64
        The upstream gradient ``dL/dy``; copied.
    eps : float, default 1e-5
        Added to the variance, as in :func:`lnorm.core.forward_formula`
        (not checked there or here).

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


@dataclass(frozen=True)
class GradCheckResult:
    r"""Outcome of an elementwise check; its repr is the report.

    Parameters
    ----------
    method : {"central", "complex", "reference"}
        How the reference was made; ``"reference"``: given by the caller
        (:func:`compare_gradients`), with no step and no evaluations.
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
        how = _LABELS[self.method]
        if self.method != "reference":
            how += f", h = {self.h:.2g}, {self.n_evaluations} evaluations"
        lines = [f"{how}: {verdict} (tol {self.tol:.0e})",
                 f"  {'argument':<9}{'max abs err':>12}{'rel err':>10}  worst index"]
        for name, abs_err, rel_err, _, worst in self.rows:
            flag = "" if rel_err <= self.tol else "  <- FAIL"
            lines.append(f"  {name:<9}{abs_err:>12.1e}{rel_err:>10.1e}  "
                         f"{list(worst)}{flag}")
        return "\n".join(lines)


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
        With ``method="reference"``, ``h=nan`` and ``n_evaluations=0``; its
        repr's heading reads "against a reference" (:func:`check_gradients`
        replaces the three with its own).

    Raises
    ------
    TypeError
        If ``grads`` is not a list or tuple, or ``tol`` not a real number.
    ValueError
        If counts or shapes differ, every gradient is None, or ``tol`` is not
        finite and > 0.

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
    grads = as_gradients(grads, estimates, "estimates")
    names = [f"arg{k}" for k in range(len(grads))] if names is None else list(names)
    if len(names) != len(grads):
        raise ValueError(f"names has {len(names)} entries but there are {len(grads)} "
                         "gradients; give one name each.")
    rows = tuple((name, *relative_error(g, r))
                 for name, g, r in zip(names, grads, estimates) if g is not None)
    return GradCheckResult("reference", float("nan"), tol, rows, 0)


def _setup(method, grads, arrays, h, tol, directional: bool):
    arrays = as_arguments(arrays)
    grads = as_gradients(grads, arrays, "arrays")
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
        As in :func:`lnorm.finitediff.central_difference` (a complex-safe ``f``
        for the complex step).
    grads : list of array_like or None
        One gradient per argument; None skips it.
    method : {"central", "complex"}, default "central"
    h, tol : float, optional
        Default :func:`lnorm.finitediff.default_step` and :func:`default_tolerance`
        of the dtype.
    names : sequence of str, optional

    Returns
    -------
    GradCheckResult

    Raises
    ------
    TypeError, ValueError
        For bad arguments (counts, shapes, dtypes, steps) or a non-scalar ``f``.
    StepTooSmallError
        If a step rounds away (a :class:`ValueError`; see
        :func:`lnorm.finitediff.estimate`).

    See Also
    --------
    directional_check : One or two evaluations whatever the size.

    Examples
    --------
    >>> a = np.array([1.0, 2.0])
    >>> check_gradients(lambda a: (a**2).sum(), [2 * a + 1e-3], [a]).passed
    False
    """
    method = check_method(method)
    arrays, grads, which, h, tol = _setup(method, grads, arrays, h, tol, False)
    estimates = estimate(f, arrays, h, method, which)
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
        Derivative along the direction ``v_i max(1, |a_i|)`` (the
        displacement divided by ``h``), from ``f`` and from the gradients.
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
    r"""Check gradients along one random direction, in one or two evaluations of ``f``.

    Each checked element moves by ``h_i v_i`` with ``h_i = h * max(1, |a_i|)``
    and ``v_i`` standard normal; ``f`` is evaluated twice for central
    differences, once for the complex step. The chance of missing a bug is
    derived in the chapter "Checking gradients".

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
    method = check_method(method)
    arrays, grads, which, h, tol = _setup(method, grads, arrays, h, tol, True)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator, "
                        "e.g. np.random.default_rng(0).")
    moves = {k: relative_steps(arrays[k], h) * rng.standard_normal(arrays[k].shape)
             for k in which}
    diff, taken = displaced(f, arrays, moves, method)
    span = 2 * h if method == "central" else h
    numeric = diff / span
    analytic = float(sum(np.vdot(grads[k], taken[k]) for k in which)) / span
    scale = float(np.sqrt(sum(np.vdot(grads[k], grads[k]) for k in which)))
    err = abs(numeric - analytic)
    denom = max(scale, abs(numeric), abs(analytic), np.finfo(np.float64).tiny)
    return DirectionalResult(method, h, tol, float(numeric), float(analytic), scale,
                             0.0 if err == 0.0 else float(err / denom),
                             int(sum(arrays[k].size for k in which)))
