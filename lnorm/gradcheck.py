"""Numerical gradient checks for any scalar loss of NumPy arrays.

A check compares a hand-written gradient with one estimated from the loss
alone. Four tools:

* :func:`central_difference` estimates every element of every argument with

  .. math::

      \\frac{\\partial f}{\\partial a_i} \\approx
      \\frac{f(a + h e_i) - f(a - h e_i)}{2h},

  whose truncation error is :math:`h^2 f'''/6` and whose rounding error is
  about :math:`u\\,|f| / h` (``u`` the unit roundoff of the arguments' dtype);
  the sum is smallest near :math:`h \\approx u^{1/3}`, the default step.
* :func:`complex_step` estimates every element with

  .. math::

      \\frac{\\partial f}{\\partial a_i} \\approx
      \\frac{\\operatorname{Im} f(a + \\mathrm{i}\\,h\\,e_i)}{h},

  which subtracts nothing, so ``h`` can be tiny (default ``1e-30``) and the
  estimate is correct to machine precision. ``f`` must be written with
  complex-safe operations (``x * x``, never ``abs(x)`` or comparisons).
* :func:`directional_check` compares the derivative along one random direction
  ``v`` with :math:`\\langle g, v\\rangle`: two evaluations of ``f`` (one with
  the complex step), whatever the size of the arrays.
* :func:`step_sweep` measures the error of an estimator for each step in a list.

:func:`check_gradients` and :func:`compare_gradients` turn estimates into a
:class:`GradCheckResult`; :func:`directional_check` returns a
:class:`DirectionalResult`, :func:`step_sweep` a :class:`StepSweep`.

Conventions
-----------
``f`` is called as ``f(*arrays)`` and must return a scalar. It always receives
private copies, so the caller's arrays are never modified, even if ``f``
raises or writes into its arguments. A gradient list ``grads`` has one entry
per argument, of the argument's shape; ``None`` means "do not check this
argument" (it is then neither perturbed nor reported).

Relative error
--------------
For one argument with checked gradient ``g`` and reference (or estimate)
``r``, the relative error is

.. math::

    \\mathrm{rel} = \\frac{\\max_i |g_i - r_i|}{\\max(\\max_i |g_i|,\\ \\max_i |r_i|)},

the largest error relative to the largest entry of either gradient (0 when
both are identically zero). An elementwise ratio ``|g_i - r_i| / |r_i|`` is
not safe: a gradient has entries near zero (each row of layer norm's ``dx``
sums to zero) whose finite-difference error does not shrink with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
import numbers

import numpy as np

from .core import forward_formula

__all__ = [
    "StepTooSmallError",
    "GradCheckResult",
    "ArgumentError",
    "DirectionalResult",
    "StepSweep",
    "unit_roundoff",
    "default_step",
    "default_tolerance",
    "layernorm_loss",
    "central_difference",
    "complex_step",
    "compare_gradients",
    "check_gradients",
    "directional_check",
    "step_sweep",
]

#: Step of the complex-step method: small enough that its h**2 truncation
#: error is below every floating-point number, large enough not to underflow.
COMPLEX_STEP = 1e-30

#: Default pass/fail thresholds on the relative error (see the module
#: docstring), by method and by the dtype of the arguments. Central
#: differences at their best reach about u**(2/3) (2e-11 in float64, 2e-5 in
#: float32), the complex step a few u; the thresholds leave a margin of about
#: two to three decades for losses whose third derivative or size is larger.
_TOLERANCES = {
    "central": {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-3, np.dtype(np.float16): 1e-1},
    "complex": {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-5},
}

#: A directional check adds inner products over every element, whose rounding
#: grows with their number (about 1e-14 relative for 4e6 float64 elements):
#: the complex-step threshold is ten times looser there.
_DIRECTIONAL_TOLERANCES = {
    "central": _TOLERANCES["central"],
    "complex": {dt: 10 * tol for dt, tol in _TOLERANCES["complex"].items()},
}

Loss = Callable[..., object]


class StepTooSmallError(ValueError):
    """The step ``h`` vanished when added to an element (``x + h == x``)."""


# --- small helpers -------------------------------------------------------------


def unit_roundoff(dtype) -> float:
    """Unit roundoff ``u = eps / 2`` of a floating dtype (``2**-53`` for float64).

    Every correctly rounded operation satisfies ``fl(a op b) = (a op b)(1 + d)``
    with ``|d| <= u``.
    """
    dtype = np.dtype(dtype)
    if dtype.kind not in "fc":
        raise TypeError(f"dtype must be floating or complex; got {dtype}.")
    return float(np.finfo(dtype).eps) / 2.0


def default_step(method: str, dtype=np.float64) -> float:
    """Default step ``h``: ``u**(1/3)`` for central differences, ``1e-30`` for the complex step.

    The central-difference error ``h**2 |f'''| / 6 + u |f| / h`` is smallest at
    ``h = (3 u |f| / |f'''|)**(1/3)``; for arguments and a loss of order one
    that is ``u**(1/3)``: 4.8e-6 in float64, 3.9e-3 in float32.
    """
    method = _check_method(method)
    if method == "complex":
        return COMPLEX_STEP
    return unit_roundoff(dtype) ** (1.0 / 3.0)


def default_tolerance(method: str, dtype=np.float64, directional: bool = False) -> float:
    """Default pass/fail threshold on the relative error for ``method`` and ``dtype``.

    float64: 1e-8 for central differences, 1e-13 for the complex step
    (1e-12 for a directional complex-step check, whose inner products over
    millions of elements round more).
    """
    method = _check_method(method)
    dtype = np.dtype(dtype)
    table = (_DIRECTIONAL_TOLERANCES if directional else _TOLERANCES)[method]
    if dtype not in table:
        raise TypeError(f"no default tolerance for dtype {dtype}; pass tol= explicitly.")
    return table[dtype]


def _check_method(method) -> str:
    if method not in ("central", "complex"):
        raise ValueError(f"method must be 'central' or 'complex'; got {method!r}.")
    return method


def _check_arrays(arrays) -> list[np.ndarray]:
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(
            "arrays must be a list or tuple of arrays, one per argument of f, "
            f"e.g. [x] or [x, gamma, beta]; got {type(arrays).__name__}."
        )
    if len(arrays) == 0:
        raise ValueError("arrays must hold at least one array (the arguments of f).")
    out = []
    for k, a in enumerate(arrays):
        arr = np.asarray(a)
        if arr.dtype.kind != "f":
            raise TypeError(
                f"arrays[{k}] must have a real floating dtype (float16, float32 or "
                f"float64); got {arr.dtype}. Convert it, e.g. arrays[{k}].astype(np.float64)."
            )
        out.append(arr)
    return out


def _check_grads(grads, arrays: list[np.ndarray]) -> list[np.ndarray | None]:
    if isinstance(grads, np.ndarray) or not isinstance(grads, (list, tuple)):
        raise TypeError(
            "grads must be a list or tuple with one gradient (or None) per array; "
            f"got {type(grads).__name__}."
        )
    if len(grads) != len(arrays):
        raise ValueError(
            f"grads has {len(grads)} entries but arrays has {len(arrays)}; give one "
            "gradient per argument of f (None to skip an argument)."
        )
    out: list[np.ndarray | None] = []
    for k, (g, a) in enumerate(zip(grads, arrays)):
        if g is None:
            out.append(None)
            continue
        g = np.asarray(g)
        if g.dtype.kind not in "fiu":
            raise TypeError(f"grads[{k}] must be a real numeric array; got dtype {g.dtype}.")
        if g.shape != a.shape:
            raise ValueError(
                f"grads[{k}] has shape {g.shape} but arrays[{k}] has shape {a.shape}; "
                "a gradient has the shape of its argument."
            )
        out.append(g)
    if all(g is None for g in out):
        raise ValueError("grads is all None: give at least one gradient to check.")
    return out


def _check_positive(value, name: str, example: str) -> float:
    """A step or a tolerance: a real number, finite and > 0."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number such as {example}; got {type(value).__name__}.")
    value = float(value)
    if not np.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be finite and > 0; got {value!r}. A typical value is {example}.")
    return value


def _check_step(h, name: str = "h") -> float:
    return _check_positive(h, name, "1e-6")


def _check_tol(tol) -> float:
    return _check_positive(tol, "tol", "1e-8")


def _check_names(names, n: int) -> tuple[str, ...]:
    if names is None:
        return tuple(f"arg{k}" for k in range(n))
    names = tuple(str(s) for s in names)
    if len(names) != n:
        raise ValueError(f"names has {len(names)} entries but there are {n} arrays; give one name each.")
    return names


def _common_dtype(arrays: Sequence[np.ndarray]) -> np.dtype:
    """The widest floating dtype among the arrays: it sets h and tol defaults."""
    return np.result_type(*[a.dtype for a in arrays])


def _real_value(value) -> float:
    if np.ndim(value) != 0:
        raise ValueError(f"f must return a scalar loss; it returned an array of shape {np.shape(value)}.")
    if np.iscomplexobj(value):
        raise TypeError("f returned a complex number for real arguments; central differences need a real loss.")
    return float(value)


def _complex_value(value) -> complex:
    if np.ndim(value) != 0:
        raise ValueError(f"f must return a scalar loss; it returned an array of shape {np.shape(value)}.")
    if not np.iscomplexobj(value):
        raise TypeError(
            "f returned a real number for a complex argument, so the imaginary part that "
            "carries the derivative was discarded (abs, .real, a cast to float, or a "
            "comparison). Write f with complex-safe operations (x * x, not abs(x)**2), "
            "e.g. with lnorm.core.forward_formula."
        )
    return complex(value)


def _complex_dtype(dtype: np.dtype) -> np.dtype:
    return np.result_type(dtype, np.complex64)


# --- the loss the book differentiates --------------------------------------------


def layernorm_loss(dy, eps: float = 1e-5) -> Callable[[np.ndarray, np.ndarray, np.ndarray], object]:
    """The scalar loss ``L(x, gamma, beta) = sum(dy * y)`` of layer normalization.

    .. math::

        L(x, \\gamma, \\beta) = \\sum dy \\odot y(x, \\gamma, \\beta),
        \\qquad
        \\Bigl(\\frac{\\partial L}{\\partial x}, \\frac{\\partial L}{\\partial \\gamma},
        \\frac{\\partial L}{\\partial \\beta}\\Bigr) = (dx, d\\gamma, d\\beta),

    so its gradient is exactly what ``lnorm.backward(dy, cache)`` returns.
    ``y`` is :func:`lnorm.core.forward_formula`, evaluated in the arithmetic of
    the arguments (float32 stays float32, complex128 for the complex step): the
    same formula :func:`lnorm.forward` evaluates in float64.

    Parameters
    ----------
    dy : array_like
        The upstream gradient, shape of ``x``; copied (later changes to the
        caller's array do not change the loss).
    eps : float
        As in :func:`lnorm.forward`.
    """
    dy = np.array(dy, copy=True)
    if dy.dtype.kind != "f":
        raise TypeError(f"dy must have a real floating dtype; got {dy.dtype}.")
    dy.setflags(write=False)

    def loss(x, gamma, beta):
        y = forward_formula(x, gamma, beta, eps)[0]
        return (dy * y).sum()

    return loss


# --- estimators --------------------------------------------------------------------


def _central(f: Loss, arrays: list[np.ndarray], h: float, which: Sequence[int]) -> list[np.ndarray | None]:
    work = [a.copy() for a in arrays]
    out: list[np.ndarray | None] = [None] * len(arrays)
    for k in which:
        flat = work[k].reshape(-1)  # a view: work[k] is a fresh contiguous copy
        grad = np.empty(flat.size, dtype=np.float64)
        for i in range(flat.size):
            x0 = flat[i]
            flat[i] = x0 + h
            x_plus = float(flat[i])
            f_plus = _real_value(f(*work))
            flat[i] = x0 - h
            x_minus = float(flat[i])
            f_minus = _real_value(f(*work))
            flat[i] = x0
            # Divide by the step actually taken: x0 + h is rounded to the dtype.
            step = x_plus - x_minus
            if step == 0.0:
                raise StepTooSmallError(
                    f"h = {h:.3g} is below the spacing of {arrays[k].dtype} at "
                    f"arrays[{k}]{tuple(int(j) for j in np.unravel_index(i, arrays[k].shape))} = {float(x0):.6g}: "
                    "x + h rounds to x. Use a larger h (the default is unit_roundoff**(1/3))."
                )
            grad[i] = (f_plus - f_minus) / step
        out[k] = grad.reshape(arrays[k].shape)
    return out


def _complex(f: Loss, arrays: list[np.ndarray], h: float, which: Sequence[int]) -> list[np.ndarray | None]:
    work = [a.copy() for a in arrays]
    out: list[np.ndarray | None] = [None] * len(arrays)
    for k in which:
        z = arrays[k].astype(_complex_dtype(arrays[k].dtype))
        flat = z.reshape(-1)
        args = list(work)
        args[k] = z
        grad = np.empty(flat.size, dtype=np.float64)
        for i in range(flat.size):
            x0 = flat[i]
            flat[i] = x0 + 1j * h
            h_taken = float(flat[i].imag)  # h rounded to the complex dtype's parts
            if h_taken == 0.0:
                raise StepTooSmallError(f"h = {h:.3g} underflows to 0 in {z.dtype}; use a larger h.")
            grad[i] = _complex_value(f(*args)).imag / h_taken
            flat[i] = x0
        out[k] = grad.reshape(arrays[k].shape)
    return out


def central_difference(f: Loss, arrays: Sequence[np.ndarray], h: float | None = None) -> list[np.ndarray]:
    """Estimate the gradient of ``f`` with central differences, element by element.

    .. math::

        \\frac{\\partial f}{\\partial a_i} \\approx
        \\frac{f(a + h e_i) - f(a - h e_i)}{(a_i + h) - (a_i - h)},

    where the denominator is the step actually taken after rounding ``a_i ± h``
    to the array's dtype (``2h`` in exact arithmetic). Error: ``O(h**2)``
    truncation plus about ``u |f| / h`` rounding.

    Parameters
    ----------
    f : callable
        ``f(*arrays)`` returns a real scalar. It receives private copies.
    arrays : list or tuple of ndarray
        The arguments of ``f``, real floating; never modified.
    h : float, optional
        Absolute step (arguments of order one are assumed). Default
        ``u**(1/3)`` of the widest dtype among ``arrays``.

    Returns
    -------
    list of ndarray
        One float64 gradient per argument, of its shape. Costs
        ``2 * sum(a.size)`` evaluations of ``f``.

    Raises
    ------
    ValueError
        If ``h <= 0``, or ``h`` is so small that ``a_i + h`` rounds to ``a_i``.
    """
    arrays = _check_arrays(arrays)
    h = default_step("central", _common_dtype(arrays)) if h is None else _check_step(h)
    return _central(f, arrays, h, range(len(arrays)))


def complex_step(f: Loss, arrays: Sequence[np.ndarray], h: float = COMPLEX_STEP) -> list[np.ndarray]:
    """Estimate the gradient of ``f`` with the complex step, element by element.

    .. math::

        \\frac{\\partial f}{\\partial a_i} \\approx
        \\frac{\\operatorname{Im} f(a + \\mathrm{i}\\,h\\,e_i)}{h}
        = f'(a)_i + O(h^2),

    exact to machine precision for ``h = 1e-30`` because nothing is subtracted
    (Martins, Sturdza and Alonso, 2003). ``f`` must be real-analytic and written
    with complex-safe operations: ``x * x`` and ``np.sqrt`` are fine, ``abs``,
    ``.real``, comparisons, ``max`` and casts to float are not. For layer
    normalization use :func:`lnorm.core.forward_formula` (see
    :func:`layernorm_loss`), not :func:`lnorm.forward`, which computes in
    float64 and clamps the mean.

    Parameters
    ----------
    f : callable
        ``f(*arrays)`` with one argument complex returns a complex scalar.
    arrays : list or tuple of ndarray
        The arguments, real floating; never modified. Each is perturbed in
        complex64 (float16, float32) or complex128 (float64).
    h : float, default 1e-30

    Returns
    -------
    list of ndarray
        One float64 gradient per argument. Costs ``sum(a.size)`` evaluations.

    Raises
    ------
    TypeError
        If ``f`` returns a real number (it dropped the imaginary part).
    """
    arrays = _check_arrays(arrays)
    h = _check_step(h)
    return _complex(f, arrays, h, range(len(arrays)))


# --- comparing -------------------------------------------------------------------


@dataclass(frozen=True)
class ArgumentError:
    """How far one argument's gradient is from its reference.

    ``max_rel_error = max_abs_error / denominator`` with
    ``denominator = max(max|grad|, max|reference|)`` (see the module docstring).
    """

    name: str
    max_abs_error: float
    max_rel_error: float
    denominator: float
    worst_index: tuple[int, ...]


def _argument_error(name: str, grad, ref) -> ArgumentError:
    grad = np.asarray(grad, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if grad.size == 0:
        return ArgumentError(name, 0.0, 0.0, 0.0, ())
    err = np.abs(grad - ref)
    # A NaN anywhere is the worst error there is.
    err_for_argmax = np.where(np.isnan(err), np.inf, err)
    worst = np.unravel_index(int(np.argmax(err_for_argmax)), grad.shape)
    max_abs = float(err[worst])
    denom = float(max(np.abs(grad).max(), np.abs(ref).max()))
    if max_abs == 0.0:
        rel = 0.0
    else:
        rel = max_abs / max(denom, np.finfo(np.float64).tiny)
    return ArgumentError(name, max_abs, rel, denom, tuple(int(i) for i in worst))


@dataclass(frozen=True)
class GradCheckResult:
    """The outcome of an elementwise gradient check.

    Attributes
    ----------
    method : str
        ``"central"`` or ``"complex"``.
    h : float
        The step used.
    tol : float
        The check passes when every argument's relative error is ``<= tol``.
    arguments : tuple of ArgumentError
        One entry per checked argument.
    n_evaluations : int
        How many times ``f`` was called.
    """

    method: str
    h: float
    tol: float
    arguments: tuple[ArgumentError, ...]
    n_evaluations: int

    @property
    def max_abs_error(self) -> float:
        """Largest absolute error over all checked arguments (NaN counts as largest)."""
        errs = [a.max_abs_error for a in self.arguments]
        return float("nan") if any(np.isnan(errs)) else max(errs)

    @property
    def max_rel_error(self) -> float:
        """Largest relative error over all checked arguments (NaN counts as largest)."""
        rels = [a.max_rel_error for a in self.arguments]
        return float("nan") if any(np.isnan(rels)) else max(rels)

    @property
    def worst(self) -> tuple[str, tuple[int, ...]]:
        """``(argument name, index)`` of the element with the largest relative error."""
        arg = max(self.arguments, key=lambda a: np.inf if np.isnan(a.max_rel_error) else a.max_rel_error)
        return arg.name, arg.worst_index

    @property
    def passed(self) -> bool:
        """True when every argument's relative error is at most ``tol``."""
        return all(a.max_rel_error <= self.tol for a in self.arguments)

    def __repr__(self) -> str:
        label = {"central": "central differences", "complex": "complex step"}.get(self.method, self.method)
        verdict = "PASS" if self.passed else "FAIL"
        sign = "<=" if self.passed else "> "
        name, index = self.worst
        lines = [
            f"GradCheckResult: {label}, h = {self.h:.2g}, {self.n_evaluations} evaluations of f",
            f"  {verdict}: max relative error {self.max_rel_error:.2e} {sign} tol {self.tol:.0e}"
            f"  (worst: {name}{list(index)})",
            f"  {'argument':<10}{'max abs err':>13}{'max rel err':>13}{'denominator':>12}  worst index",
        ]
        for a in self.arguments:
            flag = "" if a.max_rel_error <= self.tol else "  <- FAIL"
            lines.append(
                f"  {a.name:<10}{a.max_abs_error:>13.2e}{a.max_rel_error:>13.2e}"
                f"{a.denominator:>12.2e}  {a.worst_index}{flag}"
            )
        lines.append("  rel err = max|g - estimate| / max(max|g|, max|estimate|) per argument")
        return "\n".join(lines)


def compare_gradients(
    grads: Sequence[np.ndarray | None],
    estimates: Sequence[np.ndarray | None],
    tol: float,
    *,
    names: Sequence[str] | None = None,
    method: str = "central",
    h: float = float("nan"),
    n_evaluations: int = 0,
) -> GradCheckResult:
    """Compare gradients with estimates (or a reference) argument by argument.

    .. math::

        \\mathrm{rel} = \\frac{\\max_i |g_i - r_i|}{\\max(\\max_i |g_i|,\\ \\max_i |r_i|)}
        \\quad\\text{per argument; pass if every } \\mathrm{rel} \\le \\mathrm{tol}.

    Parameters
    ----------
    grads : sequence of ndarray or None
        The gradients under test; None skips an argument.
    estimates : sequence of ndarray or None
        Estimates or reference gradients ``r``, same shapes.
    tol : float
        Threshold on the relative error, > 0.
    names : sequence of str, optional
        One name per entry, for the report.
    method, h, n_evaluations
        How the estimates were made, recorded in the result for the report.

    Returns
    -------
    GradCheckResult
    """
    tol = _check_tol(tol)
    if len(grads) != len(estimates):
        raise ValueError(f"grads has {len(grads)} entries but estimates has {len(estimates)}.")
    names = _check_names(names, len(grads))
    rows = []
    for name, g, r in zip(names, grads, estimates):
        if g is None:
            continue
        if r is None:
            raise ValueError(f"no estimate for argument {name!r}, but a gradient to check.")
        if np.shape(g) != np.shape(r):
            raise ValueError(f"gradient of {name!r} has shape {np.shape(g)} but its estimate {np.shape(r)}.")
        rows.append(_argument_error(name, g, r))
    if not rows:
        raise ValueError("grads is all None: give at least one gradient to check.")
    return GradCheckResult(method, float(h), tol, tuple(rows), int(n_evaluations))


def check_gradients(
    f: Loss,
    grads: Sequence[np.ndarray | None],
    arrays: Sequence[np.ndarray],
    *,
    method: str = "central",
    h: float | None = None,
    tol: float | None = None,
    names: Sequence[str] | None = None,
) -> GradCheckResult:
    """Check hand-written gradients of ``f`` against an elementwise estimate.

    Estimates every element of every argument whose gradient is given (with
    :func:`central_difference` or :func:`complex_step`) and compares.

    Parameters
    ----------
    f : callable
        ``f(*arrays)`` returns a scalar.
    grads : list or tuple
        One gradient per argument, of its shape; None skips the argument.
    arrays : list or tuple of ndarray
        The point at which to check; never modified.
    method : {"central", "complex"}
    h : float, optional
        Default :func:`default_step`.
    tol : float, optional
        Threshold on the relative error; default :func:`default_tolerance`
        (float64: 1e-8 central, 1e-13 complex).
    names : sequence of str, optional
        Argument names for the report, e.g. ``("x", "gamma", "beta")``.
    """
    method = _check_method(method)
    arrays = _check_arrays(arrays)
    grads = _check_grads(grads, arrays)
    dtype = _common_dtype(arrays)
    h = default_step(method, dtype) if h is None else _check_step(h)
    tol = default_tolerance(method, dtype) if tol is None else _check_tol(tol)
    which = [k for k, g in enumerate(grads) if g is not None]
    estimate = _central if method == "central" else _complex
    estimates = estimate(f, arrays, h, which)
    per_element = 2 if method == "central" else 1
    n_eval = per_element * sum(arrays[k].size for k in which)
    return compare_gradients(grads, estimates, tol, names=names, method=method, h=h, n_evaluations=n_eval)


# --- one random direction -------------------------------------------------------


@dataclass(frozen=True)
class DirectionalResult:
    """The outcome of a directional check along one random direction ``v``.

    Attributes
    ----------
    numeric : float
        The directional derivative of ``f`` along ``v``, estimated from ``f``.
    analytic : float
        ``<grads, v>``, summed over the checked arguments.
    scale : float
        ``||grads||_2`` over the checked arguments: the root-mean-square of
        ``<grads, v>`` over random normal directions ``v``.
    rel_error : float
        ``|numeric - analytic| / max(scale, |numeric|, |analytic|)``.
    """

    method: str
    h: float
    tol: float
    numeric: float
    analytic: float
    scale: float
    abs_error: float
    rel_error: float
    n_evaluations: int
    n_elements: int
    names: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """True when ``rel_error <= tol``."""
        return self.rel_error <= self.tol

    def __repr__(self) -> str:
        label = {"central": "central difference", "complex": "complex step"}.get(self.method, self.method)
        verdict = "PASS" if self.passed else "FAIL"
        sign = "<=" if self.passed else "> "
        return "\n".join(
            [
                f"DirectionalResult: {label} along one random direction, h = {self.h:.2g}",
                f"  {self.n_evaluations} evaluation{'s' if self.n_evaluations != 1 else ''} of f "
                f"for {self.n_elements:,} elements ({', '.join(self.names)})",
                f"  {verdict}: relative error {self.rel_error:.2e} {sign} tol {self.tol:.0e}",
                f"  derivative along v from f   {self.numeric: .15e}",
                f"  <grads, v>                  {self.analytic: .15e}",
                f"  abs error {self.abs_error:.2e}; scale ||grads||_2 = {self.scale:.3e}",
                "  rel err = abs error / max(scale, |from f|, |<grads, v>|)",
            ]
        )


def directional_check(
    f: Loss,
    grads: Sequence[np.ndarray | None],
    arrays: Sequence[np.ndarray],
    rng: np.random.Generator,
    *,
    method: str = "central",
    h: float | None = None,
    tol: float | None = None,
    names: Sequence[str] | None = None,
) -> DirectionalResult:
    """Check gradients along one random direction, at the cost of two evaluations.

    Draws ``v`` with independent standard normal entries for every argument
    whose gradient is given (jointly: one direction in the space of all of
    them) and compares

    .. math::

        \\frac{f(a + h v) - f(a - h v)}{2h}
        \\quad\\text{with}\\quad
        \\langle g, v\\rangle = \\sum_k \\sum_i g_{k,i} v_{k,i},

    where, as in :func:`central_difference`, ``<g, v>`` uses the displacement
    actually taken after rounding ``a ± h v``. With ``method="complex"`` the
    left side is ``Im f(a + i h v) / h``: one evaluation, exact to rounding.

    A wrong gradient ``g = g_true + delta`` shows as an error
    ``<delta, v>``, a normal variable of standard deviation ``||delta||_2``:
    the check misses it only if ``|<delta, v>|`` falls below ``tol * scale``,
    which has probability about ``0.8 * tol * ||g||_2 / ||delta||_2``.

    Parameters
    ----------
    f : callable
        ``f(*arrays)`` returns a scalar.
    grads : list or tuple
        One gradient per argument; None leaves the argument unperturbed and unchecked.
    arrays : list or tuple of ndarray
        Never modified.
    rng : numpy.random.Generator
        Draws the direction (seed it for reproducible checks).
    method : {"central", "complex"}
    h : float, optional
        Default :func:`default_step` (``u**(1/3)`` or ``1e-30``).
    tol : float, optional
        Default :func:`default_tolerance` with ``directional=True``: 1e-8
        (central) or 1e-12 (complex) in float64.
    names : sequence of str, optional

    Returns
    -------
    DirectionalResult
    """
    method = _check_method(method)
    arrays = _check_arrays(arrays)
    grads = _check_grads(grads, arrays)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator, e.g. np.random.default_rng(0); got {type(rng).__name__}."
        )
    names_all = _check_names(names, len(arrays))
    which = [k for k, g in enumerate(grads) if g is not None]
    dtype = _common_dtype([arrays[k] for k in which])
    h = default_step(method, dtype) if h is None else _check_step(h)
    tol = default_tolerance(method, dtype, directional=True) if tol is None else _check_tol(tol)

    directions = {k: rng.standard_normal(arrays[k].shape) for k in which}
    g64 = {k: np.asarray(grads[k], dtype=np.float64) for k in which}
    scale = float(np.sqrt(sum(np.vdot(g64[k], g64[k]) for k in which)))

    if method == "central":
        # Each side holds only its own displaced copies, so a large tensor is
        # never held in more than a few copies at once.
        f_side, disp_side = [], []
        for sign in (1.0, -1.0):
            args = [a.copy() for a in arrays]
            disp = 0.0
            for k in which:
                args[k] = (arrays[k] + sign * h * directions[k]).astype(arrays[k].dtype)
                # The displacement actually taken, after rounding to the dtype.
                moved = args[k].astype(np.float64) - arrays[k].astype(np.float64)
                disp += float(np.vdot(g64[k], moved))
            f_side.append(_real_value(f(*args)))
            disp_side.append(disp)
            del args
        numeric = (f_side[0] - f_side[1]) / (2.0 * h)
        analytic = (disp_side[0] - disp_side[1]) / (2.0 * h)
        n_eval = 2
    else:
        args = [a.copy() for a in arrays]
        for k in which:
            args[k] = arrays[k] + 1j * h * directions[k]
        numeric = _complex_value(f(*args)).imag / h
        analytic = float(sum(np.vdot(g64[k], directions[k]) for k in which))
        n_eval = 1

    abs_error = abs(numeric - analytic)
    denom = max(scale, abs(numeric), abs(analytic), np.finfo(np.float64).tiny)
    rel_error = 0.0 if abs_error == 0.0 else abs_error / denom
    if np.isnan(numeric) or np.isnan(analytic):
        rel_error = abs_error = float("nan")
    return DirectionalResult(
        method=method,
        h=h,
        tol=tol,
        numeric=float(numeric),
        analytic=float(analytic),
        scale=scale,
        abs_error=float(abs_error),
        rel_error=float(rel_error),
        n_evaluations=n_eval,
        n_elements=int(sum(arrays[k].size for k in which)),
        names=tuple(names_all[k] for k in which),
    )


# --- error against step size --------------------------------------------------------


@dataclass(frozen=True)
class StepSweep:
    """Error of an elementwise estimator for each step ``h``.

    Attributes
    ----------
    method : str
    dtype : numpy.dtype
        The arguments' dtype (it sets the rounding regime).
    hs : ndarray
        The steps, as given.
    max_abs_error, max_rel_error : ndarray
        Per step, over all arguments (relative error as in the module
        docstring). NaN where ``h`` was too small to move an element.
    """

    method: str
    dtype: np.dtype
    hs: np.ndarray
    max_abs_error: np.ndarray
    max_rel_error: np.ndarray

    @property
    def best_h(self) -> float:
        """The step with the smallest relative error."""
        return float(self.hs[np.nanargmin(self.max_rel_error)])

    @property
    def best_rel_error(self) -> float:
        """The smallest relative error over the sweep."""
        return float(np.nanmin(self.max_rel_error))

    @property
    def predicted_h(self) -> float:
        """``u**(1/3)`` (central) or the complex default ``1e-30``: :func:`default_step`."""
        return default_step(self.method, self.dtype)

    def __repr__(self) -> str:
        label = {"central": "central differences", "complex": "complex step"}.get(self.method, self.method)
        lines = [
            f"StepSweep: {label} in {self.dtype}, {len(self.hs)} steps; best h = {self.best_h:.2g} "
            f"(rel err {self.best_rel_error:.2e}); predicted optimum {self.predicted_h:.2g}",
            f"  {'h':>9}{'max rel err':>13}",
        ]
        lines += [f"  {h:>9.1e}{e:>13.2e}" for h, e in zip(self.hs, self.max_rel_error)]
        return "\n".join(lines)


def step_sweep(
    f: Loss,
    arrays: Sequence[np.ndarray],
    hs: Sequence[float],
    *,
    reference: Sequence[np.ndarray] | None = None,
    method: str = "central",
) -> StepSweep:
    """Error of the elementwise estimate of ``f``'s gradient for each step in ``hs``.

    Parameters
    ----------
    f : callable
        ``f(*arrays)`` returns a scalar.
    arrays : list or tuple of ndarray
        The point; its dtype sets the arithmetic of the estimates. Never modified.
    hs : sequence of float
        Steps, each finite and > 0.
    reference : list of ndarray, optional
        The gradient to measure against, one per argument. Default: the
        complex-step gradient of ``f`` at the arrays converted to float64
        (``f`` must then be complex-safe); it depends on ``f`` alone.
    method : {"central", "complex"}

    Returns
    -------
    StepSweep
        A step too small to move some element (``x + h == x``) gives NaN.
    """
    method = _check_method(method)
    arrays = _check_arrays(arrays)
    hs_arr = np.asarray(hs, dtype=np.float64)
    if hs_arr.ndim != 1 or hs_arr.size == 0:
        raise ValueError(f"hs must be a non-empty 1-d sequence of steps; got shape {hs_arr.shape}.")
    for h in hs_arr:
        _check_step(float(h), "every step in hs")
    if reference is None:
        reference = _complex(f, [a.astype(np.float64) for a in arrays], COMPLEX_STEP, range(len(arrays)))
    else:
        reference = _check_grads(reference, arrays)
        if any(r is None for r in reference):
            raise ValueError("reference needs a gradient for every argument.")
    estimate = _central if method == "central" else _complex
    abs_err = np.full(hs_arr.size, np.nan)
    rel_err = np.full(hs_arr.size, np.nan)
    for j, h in enumerate(hs_arr):
        try:
            est = estimate(f, arrays, float(h), range(len(arrays)))
        except StepTooSmallError:
            continue
        rows = [_argument_error("", e, r) for e, r in zip(est, reference)]
        abs_err[j] = max(r.max_abs_error for r in rows)
        rel_err[j] = max(r.max_rel_error for r in rows)
    return StepSweep(method, _common_dtype(arrays), hs_arr, abs_err, rel_err)
