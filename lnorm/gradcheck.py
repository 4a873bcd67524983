"""Numerical gradient checks for any scalar loss of NumPy arrays.

A check compares a hand-written gradient with one estimated from the loss
alone, element by element with

.. math::

    \\text{central differences}\\quad
    \\frac{\\partial f}{\\partial a_i} \\approx \\frac{f(a + h e_i) - f(a - h e_i)}{2h},
    \\qquad
    \\text{the complex step}\\quad
    \\frac{\\partial f}{\\partial a_i} \\approx \\frac{\\operatorname{Im} f(a + \\mathrm{i}\\,h\\,e_i)}{h},

or along one random direction ``v`` (:func:`directional_check`, two
evaluations whatever the size). Central differences carry a truncation error
:math:`h^2 f'''/6` and a rounding error of about :math:`u\\,|f|/h` (``u`` the
unit roundoff), smallest near :math:`h \\approx u^{1/3}`, the default step;
:func:`step_sweep` measures that trade-off. The complex step subtracts
nothing, so ``h`` can be tiny (``1e-30``) and the estimate is exact to
machine precision, provided ``f`` is written with complex-safe operations
(``x * x``, never ``abs(x)`` or comparisons).

Conventions
-----------
``f`` is called as ``f(*arrays)`` and returns a scalar. It always receives
private copies, so the caller's arrays are never modified, even if ``f``
raises or writes into its arguments. A gradient list ``grads`` has one entry
per argument, of the argument's shape; ``None`` means "do not check this
argument" (it is then neither perturbed nor reported). The dtype of the
checked arguments sets the default step and tolerance.

Relative error
--------------
For one argument with checked gradient ``g`` and reference (or estimate)
``r``,

.. math::

    \\mathrm{rel} = \\frac{\\max_i |g_i - r_i|}{\\max(\\max_i |g_i|,\\ \\max_i |r_i|)},

the largest error relative to the largest entry of either gradient (0 when
both are identically zero, NaN if either holds a NaN). An elementwise ratio
``|g_i - r_i| / |r_i|`` is not safe: a gradient has entries near zero (each
row of layer norm's ``dx`` sums to zero) whose estimation error does not
shrink with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .core import forward_formula
from .validate import check_positive

__all__ = [
    "StepTooSmallError",
    "ArgumentError",
    "GradCheckResult",
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

#: Default pass/fail thresholds on the relative error, by method and dtype.
#: Central differences at their best reach about u**(2/3) (2e-11 in float64,
#: 2e-5 in float32), the complex step a few u; the thresholds leave two to
#: three decades of margin for losses whose third derivative or size is larger.
_TOLERANCES = {
    "central": {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-3, np.dtype(np.float16): 1e-1},
    "complex": {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-5},
}

_LABELS = {"central": "central differences", "complex": "complex step"}

Loss = Callable[..., object]


class StepTooSmallError(ValueError):
    """The step ``h`` vanished when added to an element (``x + h == x``)."""


# --- defaults -------------------------------------------------------------------


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
    if _method(method) == "complex":
        return COMPLEX_STEP
    return unit_roundoff(dtype) ** (1.0 / 3.0)


def default_tolerance(method: str, dtype=np.float64, directional: bool = False) -> float:
    """Default pass/fail threshold on the relative error for ``method`` and ``dtype``.

    float64: 1e-8 for central differences, 1e-13 for the complex step. A
    directional complex-step check is ten times looser (1e-12): its inner
    products over millions of elements round more (about 1e-14 relative for
    4e6 float64 elements).
    """
    method = _method(method)
    tol = _TOLERANCES[method].get(np.dtype(dtype))
    if tol is None:
        raise TypeError(f"no default tolerance for dtype {np.dtype(dtype)}; pass tol= explicitly.")
    return 10 * tol if directional and method == "complex" else tol


# --- argument checks ---------------------------------------------------------------


def _method(method) -> str:
    if method not in _LABELS:
        raise ValueError(f"method must be 'central' or 'complex'; got {method!r}.")
    return method


def _list_or_tuple(value, name: str, what: str) -> None:
    # An ndarray is a sequence too, but [x] and x mean different things here.
    if isinstance(value, np.ndarray) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of {what}; got {type(value).__name__}.")


def _arrays(arrays) -> list[np.ndarray]:
    _list_or_tuple(arrays, "arrays", "arrays, one per argument of f, e.g. [x] or [x, gamma, beta]")
    if len(arrays) == 0:
        raise ValueError("arrays must hold at least one array (the arguments of f).")
    out = [np.asarray(a) for a in arrays]
    for k, a in enumerate(out):
        if a.dtype.kind != "f":
            raise TypeError(
                f"arrays[{k}] must have a real floating dtype (float16, float32 or "
                f"float64); got {a.dtype}. Convert it, e.g. arrays[{k}].astype(np.float64)."
            )
    return out


def _grads(grads, arrays: list[np.ndarray]) -> list[np.ndarray | None]:
    _list_or_tuple(grads, "grads", "gradients, one (or None) per array")
    if len(grads) != len(arrays):
        raise ValueError(
            f"grads has {len(grads)} entries but arrays has {len(arrays)}; give one "
            "gradient per argument of f (None to skip an argument)."
        )
    out = [None if g is None else np.asarray(g) for g in grads]
    for k, (g, a) in enumerate(zip(out, arrays)):
        if g is None:
            continue
        if g.dtype.kind not in "fiu":
            raise TypeError(f"grads[{k}] must be a real numeric array; got dtype {g.dtype}.")
        if g.shape != a.shape:
            raise ValueError(
                f"grads[{k}] has shape {g.shape} but arrays[{k}] has shape {a.shape}; "
                "a gradient has the shape of its argument."
            )
    if all(g is None for g in out):
        raise ValueError("grads is all None: give at least one gradient to check.")
    return out


def _names(names, n: int) -> tuple[str, ...]:
    if names is None:
        return tuple(f"arg{k}" for k in range(n))
    names = tuple(str(s) for s in names)
    if len(names) != n:
        raise ValueError(f"names has {len(names)} entries but there are {n} arrays; give one name each.")
    return names


def _check_setup(method, grads, arrays, h, tol, names, directional: bool):
    """Validate the arguments shared by the two checks and fill in the defaults."""
    method = _method(method)
    arrays = _arrays(arrays)
    grads = _grads(grads, arrays)
    names = _names(names, len(arrays))
    which = [k for k, g in enumerate(grads) if g is not None]
    dtype = np.result_type(*[arrays[k].dtype for k in which])
    h = default_step(method, dtype) if h is None else check_positive(h, "h", "1e-6")
    tol = default_tolerance(method, dtype, directional) if tol is None else check_positive(tol, "tol", "1e-8")
    return method, arrays, grads, names, which, h, tol


def _scalar(value, complex_step: bool = False):
    """The loss value as a Python float (or complex, for the complex step)."""
    if np.ndim(value) != 0:
        raise ValueError(f"f must return a scalar loss; it returned an array of shape {np.shape(value)}.")
    if np.iscomplexobj(value) != complex_step:
        raise TypeError(
            "f returned a real number for a complex argument, so the imaginary part that "
            "carries the derivative was discarded (abs, .real, a cast to float, or a "
            "comparison). Write f with complex-safe operations (x * x, not abs(x)**2), "
            "e.g. with lnorm.core.forward_formula."
            if complex_step
            else "f returned a complex number for real arguments; central differences need a real loss."
        )
    return complex(value) if complex_step else float(value)


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


# --- elementwise estimates -----------------------------------------------------------


def _central_quotient(f: Loss, args: list, flat: np.ndarray, i: int, h: float) -> tuple[float, float]:
    """``f(a + h e_i) - f(a - h e_i)`` and the step actually taken between the two points."""
    x0 = flat[i]
    flat[i] = x0 + h
    x_plus, f_plus = float(flat[i]), _scalar(f(*args))
    flat[i] = x0 - h
    x_minus, f_minus = float(flat[i]), _scalar(f(*args))
    flat[i] = x0
    # x0 ± h is rounded to the dtype: divide by the distance actually moved, not 2h.
    return f_plus - f_minus, x_plus - x_minus


def _complex_quotient(f: Loss, args: list, flat: np.ndarray, i: int, h: float) -> tuple[float, float]:
    """``Im f(a + i h e_i)`` and the imaginary step as stored in the complex dtype."""
    x0 = flat[i]
    flat[i] = x0 + 1j * h
    step = float(flat[i].imag)
    value = _scalar(f(*args), complex_step=True).imag
    flat[i] = x0
    return value, step


def _estimate(f: Loss, arrays: list[np.ndarray], h: float, method: str, which: Sequence[int]) -> list:
    """Elementwise estimate of the gradient for the arguments in ``which`` (None elsewhere)."""
    quotient = _central_quotient if method == "central" else _complex_quotient
    out: list[np.ndarray | None] = [None] * len(arrays)
    for k in which:
        dtype = arrays[k].dtype if method == "central" else np.result_type(arrays[k].dtype, np.complex64)
        # Private copies (f may write into them); argument k a fresh C-ordered
        # one, so that reshape(-1) below is a view into it.
        args = [np.array(a, dtype=dtype, order="C", copy=True) if j == k else a.copy()
                for j, a in enumerate(arrays)]
        flat = args[k].reshape(-1)
        grad = np.empty(flat.size, dtype=np.float64)
        for i in range(flat.size):
            difference, step = quotient(f, args, flat, i, h)
            if step == 0.0:
                where = tuple(int(j) for j in np.unravel_index(i, arrays[k].shape))
                raise StepTooSmallError(
                    f"h = {h:.3g} is below the spacing of {dtype} at arrays[{k}]{where} = "
                    f"{float(arrays[k][where]):.6g}: x + h rounds to x. Use a larger h "
                    f"(the default is {default_step(method, arrays[k].dtype):.2g})."
                )
            grad[i] = difference / step
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
        If ``h <= 0``, or ``h`` is so small that ``a_i + h`` rounds to ``a_i``
        (:class:`StepTooSmallError`).
    """
    arrays = _arrays(arrays)
    h = default_step("central", np.result_type(*arrays)) if h is None else check_positive(h, "h", "1e-6")
    return _estimate(f, arrays, h, "central", range(len(arrays)))


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
    :func:`layernorm_loss`), not :func:`lnorm.forward`, which refuses complex
    input (it computes in float64) and clamps the mean.

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
    arrays = _arrays(arrays)
    return _estimate(f, arrays, check_positive(h, "h", "1e-6"), "complex", range(len(arrays)))


# --- comparing -------------------------------------------------------------------


def _relative(abs_error: float, scale: float) -> float:
    """``abs_error / scale``; 0 for an exact match, NaN stays NaN."""
    return 0.0 if abs_error == 0.0 else abs_error / max(scale, np.finfo(np.float64).tiny)


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
    worst = np.unravel_index(int(np.argmax(err)), grad.shape)  # argmax takes a NaN as the largest
    max_abs = float(err[worst])
    denom = float(max(np.abs(grad).max(), np.abs(ref).max()))
    return ArgumentError(name, max_abs, _relative(max_abs, denom), denom, tuple(int(i) for i in worst))


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
        return float(np.max([a.max_abs_error for a in self.arguments]))

    @property
    def max_rel_error(self) -> float:
        """Largest relative error over all checked arguments (NaN counts as largest)."""
        return float(np.max([a.max_rel_error for a in self.arguments]))

    @property
    def worst(self) -> tuple[str, tuple[int, ...]]:
        """``(argument name, index)`` of the element with the largest relative error."""
        arg = self.arguments[int(np.argmax([a.max_rel_error for a in self.arguments]))]
        return arg.name, arg.worst_index

    @property
    def passed(self) -> bool:
        """True when every argument's relative error is at most ``tol``."""
        return all(a.max_rel_error <= self.tol for a in self.arguments)

    def __repr__(self) -> str:
        sign = "<=" if self.passed else "> "
        name, index = self.worst
        lines = [
            f"GradCheckResult: {_LABELS.get(self.method, self.method)}, h = {self.h:.2g}, "
            f"{self.n_evaluations} evaluations of f",
            f"  {'PASS' if self.passed else 'FAIL'}: max relative error "
            f"{self.max_rel_error:.2e} {sign} tol {self.tol:.0e}  (worst: {name}{list(index)})",
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
    tol = check_positive(tol, "tol", "1e-8")
    if len(grads) != len(estimates):
        raise ValueError(f"grads has {len(grads)} entries but estimates has {len(estimates)}.")
    rows = []
    for name, g, r in zip(_names(names, len(grads)), grads, estimates):
        if g is None:
            continue
        if r is None or np.shape(g) != np.shape(r):
            raise ValueError(f"gradient of {name!r} has shape {np.shape(g)} but its estimate "
                             f"{'is None' if r is None else np.shape(r)}.")
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
    :func:`central_difference` or :func:`complex_step`) and compares with
    :func:`compare_gradients`.

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
    method, arrays, grads, names, which, h, tol = _check_setup(method, grads, arrays, h, tol, names, False)
    estimates = _estimate(f, arrays, h, method, which)
    n_eval = (2 if method == "central" else 1) * sum(arrays[k].size for k in which)
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
        sign = "<=" if self.passed else "> "
        return "\n".join(
            [
                f"DirectionalResult: {_LABELS.get(self.method, self.method)} along one random direction",
                f"  h = {self.h:.2g}, {self.n_evaluations} evaluation{'s' if self.n_evaluations != 1 else ''} "
                f"for {self.n_elements:,} elements ({', '.join(self.names)})",
                f"  {'PASS' if self.passed else 'FAIL'}: relative error {self.rel_error:.2e} {sign} "
                f"tol {self.tol:.0e}",
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
    method, arrays, grads, names, which, h, tol = _check_setup(method, grads, arrays, h, tol, names, True)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator, e.g. np.random.default_rng(0); got {type(rng).__name__}."
        )
    directions = {k: rng.standard_normal(arrays[k].shape) for k in which}
    g64 = {k: np.asarray(grads[k], dtype=np.float64) for k in which}
    scale = float(np.sqrt(sum(np.vdot(g64[k], g64[k]) for k in which)))

    if method == "central":
        # One side at a time, so a large tensor is held in few copies at once.
        f_side, moved_side = [], []
        for sign in (1.0, -1.0):
            # Perturbed arguments are new arrays already; only the others need a copy.
            args = [(a + sign * h * directions[k]).astype(a.dtype, copy=False) if k in directions
                    else a.copy() for k, a in enumerate(arrays)]
            # <g, displacement actually taken>, after rounding a ± h v to the dtype.
            moved_side.append(sum(float(np.vdot(g64[k], args[k].astype(np.float64, copy=False) - arrays[k]))
                                  for k in which))
            f_side.append(_scalar(f(*args)))
            del args
        numeric = (f_side[0] - f_side[1]) / (2.0 * h)
        analytic = (moved_side[0] - moved_side[1]) / (2.0 * h)
    else:
        args = [a + 1j * h * directions[k] if k in directions else a.copy()
                for k, a in enumerate(arrays)]
        numeric = _scalar(f(*args), complex_step=True).imag / h
        analytic = float(sum(np.vdot(g64[k], directions[k]) for k in which))

    abs_error = abs(numeric - analytic)
    return DirectionalResult(
        method=method,
        h=h,
        tol=tol,
        numeric=float(numeric),
        analytic=float(analytic),
        scale=scale,
        abs_error=float(abs_error),
        rel_error=float(_relative(abs_error, max(scale, abs(numeric), abs(analytic)))),
        n_evaluations=2 if method == "central" else 1,
        n_elements=int(sum(arrays[k].size for k in which)),
        names=tuple(names[k] for k in which),
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
    method = _method(method)
    arrays = _arrays(arrays)
    hs = np.asarray(hs, dtype=np.float64)
    if hs.ndim != 1 or hs.size == 0:
        raise ValueError(f"hs must be a non-empty 1-d sequence of steps; got shape {hs.shape}.")
    for h in hs:
        check_positive(float(h), "every step in hs", "1e-6")
    every = range(len(arrays))
    if reference is None:
        reference = _estimate(f, [a.astype(np.float64) for a in arrays], COMPLEX_STEP, "complex", every)
    else:
        reference = _grads(reference, arrays)
        if any(r is None for r in reference):
            raise ValueError("reference needs a gradient for every argument.")
    abs_err = np.full(hs.size, np.nan)
    rel_err = np.full(hs.size, np.nan)
    for j, h in enumerate(hs):
        try:
            estimates = _estimate(f, arrays, float(h), method, every)
        except StepTooSmallError:
            continue
        rows = [_argument_error("", e, r) for e, r in zip(estimates, reference)]
        abs_err[j] = np.max([r.max_abs_error for r in rows])
        rel_err[j] = np.max([r.max_rel_error for r in rows])
    return StepSweep(method, np.result_type(*arrays), hs, abs_err, rel_err)
