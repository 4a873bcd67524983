r"""Numerical gradient checks for any scalar loss of NumPy arrays.

A check compares a hand-written gradient ``g`` with one estimated from the
loss ``f`` alone:

* central differences, element by element:
  ``(f(a + h_i e_i) - f(a - h_i e_i)) / (2 h_i)``, with the relative step
  ``h_i = h * max(1, |a_i|)``; error ``O(h**2)`` from truncation plus about
  ``u |f| / h`` from rounding (``u`` the unit roundoff), smallest near
  ``h = u**(1/3)``, the default;
* the complex step, element by element: ``Im f(a + i h_i e_i) / h_i``;
  nothing is subtracted, so ``h = 1e-30`` is exact to rounding, provided ``f``
  is written with complex-safe operations (``x * x``, never ``abs(x)``);
* a directional check along one random direction ``v``, two evaluations
  whatever the size (:func:`directional_check`).

Check in float64: the float32 error of central differences at its best step,
about ``u32**(2/3)``, is too large to tell a subtle bug from rounding.

``f`` is called as ``f(*arrays)`` and returns a scalar. It always receives
private copies, so the caller's arrays are never modified. ``grads`` has one
entry per argument; ``None`` means "do not check this argument".

Relative error, per argument::

    rel = max_i |g_i - r_i| / max(max_i |g_i|, max_i |r_i|)

An elementwise ratio ``|g_i - r_i| / |r_i|`` is not safe: a gradient has
entries near zero (each row of layer norm's ``dx`` sums to zero) whose
estimation error does not shrink with them.

Examples
--------
>>> import numpy as np
>>> from lnorm import gradcheck
>>> f = lambda a: (a ** 3).sum()
>>> a = np.array([0.5, -2.0, 30.0])
>>> r = gradcheck.check_gradients(f, [3 * a ** 2], [a])
>>> r.passed, r.max_rel_error < 1e-9
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .core import forward_formula
from .validate import check_positive

__all__ = [
    "StepTooSmallError",
    "GradCheckResult",
    "DirectionalResult",
    "StepSweep",
    "unit_roundoff",
    "default_step",
    "default_tolerance",
    "relative_steps",
    "layernorm_loss",
    "central_difference",
    "complex_step",
    "compare_gradients",
    "check_gradients",
    "directional_check",
    "step_sweep",
]

#: Step of the complex-step method: its h**2 truncation error is below every
#: floating-point number, and h * max(1, |a|) does not underflow.
COMPLEX_STEP = 1e-30

# Pass/fail thresholds on the relative error, by method and dtype. Central
# differences at their best reach about u**(2/3) (2e-11 in float64), the
# complex step a few u; two to three decades of margin for larger losses.
_TOLERANCES = {
    "central": {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-3,
                np.dtype(np.float16): 1e-1},
    "complex": {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 1e-5,
                np.dtype(np.float16): 1e-5},
}
_LABELS = {"central": "central differences", "complex": "complex step"}

Loss = Callable[..., object]


class StepTooSmallError(ValueError):
    """The step vanished when added to an element (``a + h == a``)."""


def unit_roundoff(dtype) -> float:
    """Unit roundoff ``u = eps / 2`` of a floating dtype.

    Examples
    --------
    >>> unit_roundoff(np.float32) == 2.0 ** -24
    True
    """
    return float(np.finfo(np.dtype(dtype)).eps) / 2.0


def default_step(method: str, dtype=np.float64) -> float:
    """``u**(1/3)`` for central differences, ``1e-30`` for the complex step.

    The central-difference error ``h**2 |f'''| / 6 + u |f| / h`` is smallest
    at ``h = (3 u |f| / |f'''|)**(1/3)``, which is ``u**(1/3)`` for arguments
    and a loss of order one; the relative step extends that to any scale.

    Examples
    --------
    >>> round(default_step("central") / 2.0 ** (-53 / 3), 12)
    1.0
    """
    if _method(method) == "complex":
        return COMPLEX_STEP
    return unit_roundoff(dtype) ** (1.0 / 3.0)


def default_tolerance(method: str, dtype=np.float64, directional: bool = False) -> float:
    """Default threshold on the relative error (float64: 1e-8 central, 1e-13 complex).

    A directional complex-step check is ten times looser: its inner products
    over millions of elements round more.

    Examples
    --------
    >>> default_tolerance("complex", directional=True)
    1e-12
    """
    method = _method(method)
    tol = _TOLERANCES[method].get(np.dtype(dtype))
    if tol is None:
        raise TypeError(f"no default tolerance for dtype {np.dtype(dtype)}; pass tol=.")
    return 10 * tol if directional and method == "complex" else tol


def relative_steps(a: np.ndarray, h: float) -> np.ndarray:
    """The step for each element: ``h * max(1, |a_i|)``.

    An absolute step ``h`` is below the spacing of a large ``a_i`` (where
    ``a_i + h`` rounds to ``a_i``) and needlessly coarse for a small one;
    scaling it with ``|a_i|`` keeps the rounding error ``u |f| / h`` and the
    truncation error in proportion for arguments of any size.

    Examples
    --------
    >>> relative_steps(np.array([0.1, -3.0, 1e8]), 1e-5)
    array([1.e-05, 3.e-05, 1.e+03])
    """
    return h * np.maximum(1.0, np.abs(np.asarray(a, dtype=np.float64)))


def _method(method) -> str:
    if method not in _LABELS:
        raise ValueError(f"method must be 'central' or 'complex'; got {method!r}.")
    return method


def _arrays(arrays) -> list[np.ndarray]:
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError("arrays must be a non-empty list of the arguments of f, "
                        "e.g. [x] or [x, gamma, beta].")
    out = [np.asarray(a) for a in arrays]
    for k, a in enumerate(out):
        if a.dtype.kind != "f":
            raise TypeError(f"arrays[{k}] must have a real floating dtype; got {a.dtype}. "
                            f"Convert it, e.g. arrays[{k}].astype(np.float64).")
    return out


def _grads(grads, arrays: list[np.ndarray]) -> list[np.ndarray | None]:
    if isinstance(grads, np.ndarray) or not isinstance(grads, (list, tuple)):
        raise TypeError("grads must be a list with one gradient (or None) per argument.")
    if len(grads) != len(arrays):
        raise ValueError(f"grads has {len(grads)} entries but arrays has {len(arrays)}; "
                         "give one gradient per argument of f (None to skip one).")
    out = [None if g is None else np.asarray(g, dtype=np.float64) for g in grads]
    for k, (g, a) in enumerate(zip(out, arrays)):
        if g is not None and g.shape != a.shape:
            raise ValueError(f"grads[{k}] has shape {g.shape} but arrays[{k}] has shape "
                             f"{a.shape}; a gradient has the shape of its argument.")
    if all(g is None for g in out):
        raise ValueError("grads is all None: give at least one gradient to check.")
    return out


def _scalar(value, complex_step: bool = False):
    if np.ndim(value) != 0:
        raise ValueError(f"f must return a scalar loss; got shape {np.shape(value)}.")
    if np.iscomplexobj(value) != complex_step:
        raise TypeError(
            "f returned a real number for a complex argument: the imaginary part "
            "that carries the derivative was dropped (abs, .real, a comparison). "
            "Write f with complex-safe operations, e.g. lnorm.core.forward_formula."
            if complex_step
            else "f returned a complex number for real arguments."
        )
    return complex(value) if complex_step else float(value)


def layernorm_loss(dy, eps: float = 1e-5) -> Callable[..., object]:
    """The loss ``L(x, gamma, beta) = sum(dy * y)``, whose gradient is the backward's.

    Since ``dL/dy = dy``, the gradient of ``L`` is exactly ``(dx, dgamma,
    dbeta)`` of ``lnorm.backward(dy, cache)``. ``y`` is
    :func:`lnorm.core.forward_formula`, evaluated in the arithmetic of the
    arguments (complex128 for the complex step). ``dy`` is copied.

    Examples
    --------
    >>> loss = layernorm_loss(np.ones((1, 2)))
    >>> float(loss(np.array([[1.0, 3.0]]), np.ones(2), np.zeros(2)))
    0.0
    """
    dy = np.array(dy, copy=True)
    if dy.dtype.kind != "f":
        raise TypeError(f"dy must have a real floating dtype; got {dy.dtype}.")
    dy.setflags(write=False)

    def loss(x, gamma, beta):
        return (dy * forward_formula(x, gamma, beta, eps)[0]).sum()

    return loss


def _estimate(f: Loss, arrays: list[np.ndarray], h: float, method: str, which) -> list:
    """Elementwise estimate for the arguments in ``which`` (None elsewhere)."""
    out: list[np.ndarray | None] = [None] * len(arrays)
    for k in which:
        dtype = arrays[k].dtype if method == "central" else np.result_type(arrays[k], np.complex64)
        args = [np.array(a, dtype=dtype if j == k else a.dtype, order="C", copy=True)
                for j, a in enumerate(arrays)]
        flat = args[k].reshape(-1)
        steps = relative_steps(arrays[k], h).reshape(-1)
        grad = np.empty(flat.size)
        for i in range(flat.size):
            x0, hi = flat[i], steps[i]
            if method == "central":
                flat[i] = x0 + hi
                upper, f_plus = float(flat[i]), _scalar(f(*args))
                flat[i] = x0 - hi
                lower, f_minus = float(flat[i]), _scalar(f(*args))
                # a_i +- h_i is rounded to the dtype: divide by the step taken.
                difference, step = f_plus - f_minus, upper - lower
            else:
                flat[i] = x0 + 1j * hi
                step = float(flat[i].imag)
                difference = _scalar(f(*args), complex_step=True).imag
            flat[i] = x0
            if step == 0.0:
                where = tuple(int(j) for j in np.unravel_index(i, arrays[k].shape))
                raise StepTooSmallError(
                    f"h = {h:.3g} is below the spacing of {dtype} at arrays[{k}]{where}: "
                    f"a + h rounds to a. Use a larger h "
                    f"(the default is {default_step(method, arrays[k].dtype):.2g})."
                )
            grad[i] = difference / step
        out[k] = grad.reshape(arrays[k].shape)
    return out


def central_difference(f: Loss, arrays: Sequence[np.ndarray], h: float | None = None) -> list:
    """Central-difference gradient of ``f``, element by element, with relative steps.

    ``(f(a + h_i e_i) - f(a - h_i e_i)) / step_i`` with ``h_i = h * max(1, |a_i|)``
    and ``step_i`` the distance actually moved after rounding ``a_i +- h_i``
    to the dtype (``2 h_i`` in exact arithmetic). ``h`` defaults to
    :func:`default_step` of the widest dtype. Returns one float64 gradient
    per argument, after ``2 * sum(a.size)`` evaluations; raises
    :class:`StepTooSmallError` if ``a_i + h_i`` rounds to ``a_i``.

    Examples
    --------
    >>> central_difference(lambda a: (a ** 2).sum(), [np.array([1.0, -4.0])])[0]
    array([ 2., -8.])
    """
    arrays = _arrays(arrays)
    h = default_step("central", np.result_type(*arrays)) if h is None else check_positive(h, "h", "1e-6")
    return _estimate(f, arrays, h, "central", range(len(arrays)))


def complex_step(f: Loss, arrays: Sequence[np.ndarray], h: float = COMPLEX_STEP) -> list:
    """Complex-step gradient of ``f``, element by element.

    ``Im f(a + i h_i e_i) / h_i = df/da_i + O(h**2)``, exact to rounding for
    ``h = 1e-30`` because nothing is subtracted (Martins, Sturdza and Alonso,
    2003). ``f`` must be written with complex-safe operations: ``x * x`` and
    ``np.sqrt`` are fine; ``abs``, ``.real``, comparisons and casts are not.
    Costs ``sum(a.size)`` evaluations.

    Examples
    --------
    >>> complex_step(lambda a: (a ** 3).sum(), [np.array([2.0])])[0]
    array([12.])
    """
    arrays = _arrays(arrays)
    return _estimate(f, arrays, check_positive(h, "h", "1e-30"), "complex", range(len(arrays)))


@dataclass(frozen=True)
class GradCheckResult:
    """Outcome of an elementwise check: one row per checked argument.

    ``rows`` holds ``(name, max_abs_error, max_rel_error, denominator,
    worst_index)``; the check passes when every relative error is at most
    ``tol``.
    """

    method: str
    h: float
    tol: float
    rows: tuple[tuple[str, float, float, float, tuple[int, ...]], ...]
    n_evaluations: int

    @property
    def max_rel_error(self) -> float:
        """Largest relative error over the checked arguments (NaN counts as largest)."""
        return float(np.max([r[2] for r in self.rows]))

    @property
    def rel_errors(self) -> dict[str, float]:
        return {r[0]: r[2] for r in self.rows}

    @property
    def passed(self) -> bool:
        return all(r[2] <= self.tol for r in self.rows)

    def __repr__(self) -> str:
        lines = [f"{_LABELS[self.method]}, h = {self.h:.2g}, {self.n_evaluations} evaluations: "
                 f"{'PASS' if self.passed else 'FAIL'} (tol {self.tol:.0e})",
                 f"  {'argument':<9}{'max abs err':>12}{'rel err':>10}  worst index"]
        for name, abs_err, rel_err, _, worst in self.rows:
            flag = "" if rel_err <= self.tol else "  <- FAIL"
            lines.append(f"  {name:<9}{abs_err:>12.1e}{rel_err:>10.1e}  {list(worst)}{flag}")
        return "\n".join(lines)


def _row(name: str, grad, ref) -> tuple:
    grad, ref = np.asarray(grad, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if grad.size == 0:
        return (name, 0.0, 0.0, 0.0, ())
    err = np.abs(grad - ref)
    worst = np.unravel_index(int(np.argmax(err)), grad.shape)  # a NaN counts as largest
    max_abs = float(err[worst])
    denom = float(max(np.abs(grad).max(), np.abs(ref).max()))
    rel = 0.0 if max_abs == 0.0 else max_abs / max(denom, np.finfo(np.float64).tiny)
    return (name, max_abs, rel, denom, tuple(int(i) for i in worst))


def compare_gradients(grads, estimates, tol: float, *, names=None, method: str = "central",
                      h: float = float("nan"), n_evaluations: int = 0) -> GradCheckResult:
    """Compare gradients with estimates (or a reference), argument by argument.

    Examples
    --------
    >>> r = compare_gradients([np.array([1.0, 2.0])], [np.array([1.0, 2.1])], tol=0.1)
    >>> r.passed, round(r.max_rel_error, 4)
    (True, 0.0476)
    """
    tol = check_positive(tol, "tol", "1e-8")
    if len(grads) != len(estimates):
        raise ValueError(f"grads has {len(grads)} entries but estimates has {len(estimates)}.")
    names = [f"arg{k}" for k in range(len(grads))] if names is None else list(names)
    if len(names) != len(grads):
        raise ValueError(f"names has {len(names)} entries but there are {len(grads)} "
                         "gradients; give one name each.")
    rows = []
    for name, g, r in zip(names, grads, estimates):
        if g is None:
            continue
        if r is None or np.shape(g) != np.shape(r):
            raise ValueError(f"gradient of {name!r} has shape {np.shape(g)} but its estimate "
                             f"{'is None' if r is None else np.shape(r)}.")
        rows.append(_row(name, g, r))
    if not rows:
        raise ValueError("grads is all None: give at least one gradient to check.")
    return GradCheckResult(method, float(h), tol, tuple(rows), int(n_evaluations))


def _setup(method, grads, arrays, h, tol, directional: bool):
    method = _method(method)
    arrays = _arrays(arrays)
    grads = _grads(grads, arrays)
    which = [k for k, g in enumerate(grads) if g is not None]
    dtype = np.result_type(*[arrays[k].dtype for k in which])
    h = default_step(method, dtype) if h is None else check_positive(h, "h", "1e-6")
    tol = default_tolerance(method, dtype, directional) if tol is None else check_positive(tol, "tol", "1e-8")
    return method, arrays, grads, which, h, tol


def check_gradients(f: Loss, grads, arrays, *, method: str = "central", h: float | None = None,
                    tol: float | None = None, names=None) -> GradCheckResult:
    """Check hand-written gradients of ``f`` against an elementwise estimate.

    ``grads`` has one gradient per argument (None skips it); ``h`` is the
    relative step (default :func:`default_step`), ``tol`` the threshold on
    the relative error (default :func:`default_tolerance`), ``names`` label
    the report.

    Examples
    --------
    >>> a = np.array([1.0, 2.0])
    >>> check_gradients(lambda a: (a ** 2).sum(), [2 * a + 1e-3], [a]).passed
    False
    """
    method, arrays, grads, which, h, tol = _setup(method, grads, arrays, h, tol, False)
    estimates = _estimate(f, arrays, h, method, which)
    n_eval = (2 if method == "central" else 1) * sum(arrays[k].size for k in which)
    return compare_gradients(grads, estimates, tol, names=names, method=method, h=h,
                             n_evaluations=n_eval)


@dataclass(frozen=True)
class DirectionalResult:
    """Outcome of a check along one random direction.

    ``numeric`` is the derivative along the direction estimated from ``f``,
    ``analytic`` the same from the gradients, ``scale`` the 2-norm of the
    gradients (the root-mean-square of ``analytic`` over random directions),
    and ``rel_error = |numeric - analytic| / max(scale, |numeric|, |analytic|)``.
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
        return self.rel_error <= self.tol

    @property
    def n_evaluations(self) -> int:
        return 2 if self.method == "central" else 1

    def __repr__(self) -> str:
        return (f"{_LABELS[self.method]} along one random direction: "
                f"{'PASS' if self.passed else 'FAIL'}\n"
                f"  {self.n_elements:,} elements, {self.n_evaluations} evaluation"
                f"{'s' if self.n_evaluations > 1 else ''} of f\n"
                f"  from f {self.numeric: .12e}\n  <g, v>  {self.analytic: .12e}\n"
                f"  rel err {self.rel_error:.1e} (tol {self.tol:.0e}, scale ||g|| = "
                f"{self.scale:.2e})")


def directional_check(f: Loss, grads, arrays, rng: np.random.Generator, *,
                      method: str = "central", h: float | None = None,
                      tol: float | None = None) -> DirectionalResult:
    """Check gradients along one random direction, in two evaluations of ``f``.

    Draws ``v`` with standard normal entries for every checked argument and
    moves every element by ``d_i = h_i v_i`` (relative steps, as in
    :func:`central_difference`). Compares ``(f(a + d) - f(a - d)) / 2h``
    with ``<g, (a + d) - (a - d)> / 2h``, both for the displacement actually
    taken after rounding; with ``method="complex"``, ``Im f(a + i d) / h``
    with ``<g, d> / h``, one evaluation. A mistake ``delta`` in ``g`` shows
    as ``<delta, d>``, so it is missed with probability about
    ``0.8 * tol * ||g|| / ||delta||``.

    Examples
    --------
    >>> a = np.arange(1.0, 5.0)
    >>> r = directional_check(lambda a: (a ** 3).sum(), [3 * a ** 2], [a],
    ...                       np.random.default_rng(0))
    >>> r.passed
    True
    """
    method, arrays, grads, which, h, tol = _setup(method, grads, arrays, h, tol, True)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator, e.g. np.random.default_rng(0).")
    moves = {k: relative_steps(arrays[k], h) * rng.standard_normal(arrays[k].shape)
             for k in which}
    scale = float(np.sqrt(sum(np.vdot(grads[k], grads[k]) for k in which)))
    if method == "central":
        sides = []
        for sign in (1.0, -1.0):
            args = [(a + sign * moves[k]).astype(a.dtype) if k in moves else a.copy()
                    for k, a in enumerate(arrays)]
            moved = sum(float(np.vdot(grads[k], args[k].astype(np.float64) - arrays[k]))
                        for k in which)
            sides.append((_scalar(f(*args)), moved))
        numeric = (sides[0][0] - sides[1][0]) / (2 * h)
        analytic = (sides[0][1] - sides[1][1]) / (2 * h)
    else:
        args = [a + 1j * moves[k] if k in moves else a.copy() for k, a in enumerate(arrays)]
        numeric = _scalar(f(*args), complex_step=True).imag / h
        analytic = float(sum(np.vdot(grads[k], moves[k]) for k in which)) / h
    err = abs(numeric - analytic)
    denom = max(scale, abs(numeric), abs(analytic), np.finfo(np.float64).tiny)
    return DirectionalResult(method, h, tol, float(numeric), float(analytic), scale,
                             0.0 if err == 0.0 else float(err / denom),
                             int(sum(arrays[k].size for k in which)))


@dataclass(frozen=True)
class StepSweep:
    """The relative error of an elementwise estimate for each step in ``hs``.

    NaN where a step was too small to move some element.
    """

    method: str
    dtype: np.dtype
    hs: np.ndarray
    max_rel_error: np.ndarray

    @property
    def best_h(self) -> float:
        """The step with the smallest error."""
        return float(self.hs[np.nanargmin(self.max_rel_error)])

    @property
    def best_rel_error(self) -> float:
        """The smallest error over the sweep."""
        return float(np.nanmin(self.max_rel_error))


def step_sweep(f: Loss, arrays, hs, *, reference=None, method: str = "central") -> StepSweep:
    """Error of the elementwise estimate of ``f``'s gradient for each step in ``hs``.

    ``reference`` is the gradient to measure against, one per argument;
    default the complex-step gradient of ``f`` at the arrays converted to
    float64 (then ``f`` must be complex-safe).

    Examples
    --------
    >>> s = step_sweep(lambda a: (a ** 3).sum(), [np.ones(3)], [1e-1, 1e-5])
    >>> s.best_h
    1e-05
    """
    method = _method(method)
    arrays = _arrays(arrays)
    hs = np.asarray(hs, dtype=np.float64)
    if hs.ndim != 1 or hs.size == 0:
        raise ValueError(f"hs must be a non-empty 1-d sequence of steps; got shape {hs.shape}.")
    for h in hs:
        check_positive(float(h), "every step in hs", "1e-6")
    every = range(len(arrays))
    if reference is None:
        reference = _estimate(f, [a.astype(np.float64) for a in arrays], COMPLEX_STEP,
                              "complex", every)
    elif len(reference) != len(arrays) or any(r is None for r in reference):
        raise ValueError("reference needs a gradient for every argument.")
    rel = np.full(hs.size, np.nan)
    for j, h in enumerate(hs):
        try:
            estimates = _estimate(f, arrays, float(h), method, every)
        except StepTooSmallError:
            continue
        rel[j] = max(_row("", e, r)[2] for e, r in zip(estimates, reference))
    return StepSweep(method, np.result_type(*arrays), hs, rel)
