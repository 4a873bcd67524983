"""Numerical gradient checks for any scalar loss of NumPy arrays.

Hand-written gradients are compared with central differences, the complex
step (:mod:`lnorm.finitediff`, whose conventions for ``f``, ``arrays``,
``grads``, ``method`` and ``h`` hold here too) or one random direction.

* The elementwise checks report, per argument, ``max|g - r| / max(max|g|,
  max|r|)`` (:func:`lnorm.finitediff.relative_error`) in a
  :class:`GradCheckResult`: ``method``, ``h``, ``tol``, one row ``(name,
  max_abs_error, max_rel_error, denominator, worst_index)`` per checked
  argument, ``n_evaluations``, and ``max_rel_error``, ``rel_errors`` and
  ``passed`` (every error at most ``tol``; a NaN fails).
* A check passes at ``tol``, by default :func:`default_tolerance` of the
  dtype of the checked arguments.
* The repr of a result is the report a learner reads.

Theory, and the chance that the directional check misses a bug: the
chapter "Checking gradients" (``book/03_gradcheck.md``).

Examples
--------
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
    """Default threshold on the relative error of a check.

    Central differences reach about ``u**(2/3)`` at best, the complex step a few
    ``u`` (of complex64 for float16 and float32); the thresholds leave one to two
    decades for larger losses.

    Parameters
    ----------
    method : {"central", "complex"}
    dtype : float16, float32 or float64, default float64
    directional : bool, default False
        Ten times looser for the complex step.

    Returns
    -------
    float

    Examples
    --------
    >>> default_tolerance("central"), default_tolerance("central", np.float32)
    (1e-08, 0.001)
    >>> default_tolerance("complex", directional=True)
    1e-12
    """
    dtype = as_dtype(dtype, "dtype", SUPPORTED_DTYPES, "float16, float32 or float64")
    tol = _TOLERANCES[check_method(method)][dtype]
    return 10 * tol if directional and method == "complex" else tol


def layernorm_loss(dy, eps: float = 1e-5) -> Callable:
    """The loss ``L(x, gamma, beta) = sum(dy * y)``, whose gradient is the backward's.

    ``y`` is :func:`lnorm.core.forward_formula`'s, so ``L`` is complex-safe.

    Parameters
    ----------
    dy : array_like of float16, float32 or float64
        The upstream gradient ``dL/dy``; copied.
    eps : float, default 1e-5
        Added to the variance (not checked).

    Returns
    -------
    callable

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
    """Outcome of an elementwise check (module docstring); its repr is the report."""

    method: str
    h: float
    tol: float
    rows: tuple[tuple[str, float, float, float, tuple[int, ...]], ...]
    n_evaluations: int

    @property
    def max_rel_error(self) -> float:
        """Largest relative error (NaN counts as largest)."""
        return float(np.max([r[2] for r in self.rows]))

    @property
    def rel_errors(self) -> dict[str, float]:
        """Relative error of each checked argument, by name."""
        return {r[0]: r[2] for r in self.rows}

    @property
    def passed(self) -> bool:
        """True when every relative error is at most ``tol``."""
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
    """Compare gradients with a given reference (``method="reference"``, no step)."""
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
    """Check hand-written gradients of ``f`` against an elementwise estimate.

    Parameters
    ----------
    f, grads, arrays, method, h
        As in :mod:`lnorm.finitediff`; ``h`` by default
        :func:`lnorm.finitediff.default_step` of the dtype.
    tol : float, optional
        Default :func:`default_tolerance` of the dtype.
    names : sequence of str, optional
        One label per argument for the report; default ``arg0, arg1, ...``.

    Returns
    -------
    GradCheckResult

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
    """Outcome of a check along one random direction; its repr is the report."""

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
        """True when ``rel_error <= tol``."""
        return self.rel_error <= self.tol

    @property
    def n_evaluations(self) -> int:
        """Evaluations of ``f``: 2 central, 1 complex step."""
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
    """Check gradients along one random direction, in one or two evaluations of ``f``.

    Each checked element moves by ``h_i v_i``, with ``h_i = h * max(1, |a_i|)``
    and ``v_i`` standard normal. ``numeric`` (from ``f``) and ``analytic``
    (``<g, v>``) are the derivatives along that displacement divided by ``h``;
    ``rel_error = |numeric - analytic| / max(||g||, |numeric|, |analytic|)``.

    Parameters
    ----------
    f, grads, arrays, method, h, tol
        As in :func:`check_gradients`; ``tol`` by default with ``directional=True``.
    rng : numpy.random.Generator
        Draws the direction.

    Returns
    -------
    DirectionalResult
        ``numeric``, ``analytic``, ``scale = ||g||``, ``rel_error``, ``passed``.

    Examples
    --------
    >>> a = np.arange(1.0, 5.0)
    >>> r = directional_check(lambda a: (a**3).sum(), [3 * a**2], [a],
    ...                       np.random.default_rng(0))
    >>> r.passed, r.n_evaluations
    (True, 2)
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
