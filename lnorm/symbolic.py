"""Layer normalization in SymPy: the Jacobian for a given D, its closed form, the VJP.

For one row ``x = (x_1, ..., x_D)`` the forward is written as SymPy expressions
in the real symbols ``x_i``, ``gamma_i``, ``beta_i``, ``dy_i`` (the upstream
gradient) and the positive ``epsilon``::

    mu   = sum(x) / D             var  = sum((x - mu)**2) / D
    rstd = 1 / sqrt(var + eps)    xhat = (x - mu) * rstd
    y    = gamma * xhat + beta

Every function that takes ``D`` (the row length, an integer >= 1, or
``TypeError`` / ``ValueError``) builds these expressions afresh; they are
meant for small ``D`` (the book runs 2 to 6), since a Jacobian has ``D**2``
entries, each a sum over the row. SymPy differentiates them
(``Matrix.jacobian``) with no knowledge of the closed forms, and
:func:`prove` shows that the result equals what the book derives by hand::

    d xhat / dx = rstd * (I - 1 1^T / D - xhat xhat^T / D)
    dy / dx     = diag(gamma) * d xhat / dx

How the proofs stay fast
------------------------
Every entry of these Jacobians is a sum of polynomials in ``x`` and ``gamma``
times powers of ``var + eps``. Instead of asking ``sympy.simplify`` to cancel
square roots, each residual is rewritten in ``(x, s)`` with
``s = var(x) + eps``, i.e. ``eps = s - var(x)``: for fixed ``x`` a one-to-one
change of variable (``eps > 0`` exactly when ``s > var(x)``). Every square root
is then a power of the single positive symbol ``s``, and ``sympy.expand``
decides whether the residual is zero: a sum of monomials in ``x_i``,
``gamma_i`` and powers of ``s`` is zero exactly when every coefficient
cancels. A zero is a proof for all real ``x``, ``gamma``, ``dy`` and all
``eps > 0``, for that one ``D`` (:mod:`lnorm.symbolic_sums` proves every
``D``). The derivation is in the chapter "Deriving the backward"
(``book/02_derivation.md``).

The NumPy half (:func:`jacobian_numpy`, :func:`backward_via_jacobian`) builds
the dense D x D Jacobian of every row from the closed form: the *naive*
backward, O(D**2) per row, against which the compact :func:`lnorm.backward`
(O(D) per row) is measured and checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

from .cache import ACC_DTYPE, LayerNormCache
from .validate import (
    as_float_array,
    as_rows,
    check_cache,
    check_dy,
    check_eps,
    check_int,
    check_param,
)

__all__ = [
    "LayerNormSymbols",
    "ForwardExprs",
    "symbols",
    "forward_exprs",
    "jacobian",
    "normalization_jacobian",
    "compact_jacobian",
    "IDENTITIES",
    "residuals",
    "prove",
    "in_x_and_s",
    "is_identically_zero",
    "mean_path_term",
    "vjp",
    "evaluate",
    "evaluate_vjp",
    "jacobian_numpy",
    "backward_via_jacobian",
    "latex",
]

#: Significant digits used when a symbolic expression is evaluated at numbers.
EVAL_DIGITS = 30


@dataclass(frozen=True)
class LayerNormSymbols:
    """One row's symbols: ``D``, ``x``, ``gamma``, ``beta``, ``dy``, ``eps``, ``s``."""

    D: int
    x: sp.Matrix
    gamma: sp.Matrix
    beta: sp.Matrix
    dy: sp.Matrix
    eps: sp.Symbol
    s: sp.Symbol


@dataclass(frozen=True)
class ForwardExprs:
    """One row's forward: ``sym``, ``mu``, ``var``, ``rstd``, ``xhat`` and ``y``."""

    sym: LayerNormSymbols
    mu: sp.Expr
    var: sp.Expr
    rstd: sp.Expr
    xhat: sp.Matrix
    y: sp.Matrix


def _check_D(D) -> int:
    return check_int(D, "D", 1, "D is the row length, such as 3.")


def _column(name: str, D: int, **assumptions) -> sp.Matrix:
    return sp.Matrix(sp.symbols(f"{name}_1:{D + 1}", **assumptions))


def symbols(D: int) -> LayerNormSymbols:
    """The symbols of a row of length ``D``; ``epsilon`` and ``s`` positive."""
    D = _check_D(D)
    return LayerNormSymbols(
        D=D,
        x=_column("x", D, real=True),
        gamma=_column("gamma", D, real=True),
        beta=_column("beta", D, real=True),
        dy=_column("dy", D, real=True),
        eps=sp.Symbol("epsilon", positive=True),
        s=sp.Symbol("s", positive=True),
    )


def forward_exprs(D: int) -> ForwardExprs:
    """The forward of one row, as explicit SymPy expressions in ``x`` and ``epsilon``.

    Nothing is an opaque symbol: ``mu`` and ``var`` are written out in the
    ``x_i``, so differentiating ``y`` follows every path the chain rule has.

    Returns
    -------
    ForwardExprs
        ``mu``, ``var`` and ``rstd`` (expressions), ``xhat`` and ``y`` (D x 1
        matrices), and ``sym``, the :class:`LayerNormSymbols` they are written in.

    Examples
    --------
    >>> f = forward_exprs(2)
    >>> f.mu, f.rstd.subs({f.sym.x[0]: 1, f.sym.x[1]: 3, f.sym.eps: 0})
    (x_1/2 + x_2/2, 1)
    """
    sym = symbols(D)
    mu = sum(sym.x) / sym.D
    var = sum((xi - mu) ** 2 for xi in sym.x) / sym.D
    rstd = 1 / sp.sqrt(var + sym.eps)
    xhat = (sym.x - mu * sp.ones(sym.D, 1)) * rstd
    y = sym.gamma.multiply_elementwise(xhat) + sym.beta
    return ForwardExprs(sym=sym, mu=mu, var=var, rstd=rstd, xhat=xhat, y=y)


def jacobian(D: int) -> sp.Matrix:
    """The full Jacobian ``dy/dx`` by ``sympy.Matrix.jacobian``, unsimplified.

    Entry ``(i, j)`` is ``d y_i / d x_j``, an explicit expression in ``x``,
    ``gamma`` and ``epsilon``.

    Examples
    --------
    >>> jacobian(3).shape
    (3, 3)
    """
    f = forward_exprs(D)
    return f.y.jacobian(f.sym.x)


def normalization_jacobian(D: int) -> sp.Matrix:
    """The Jacobian of the normalization alone, ``d xhat / dx``, unsimplified."""
    f = forward_exprs(D)
    return f.xhat.jacobian(f.sym.x)


def _closed_form(gamma: sp.Matrix, rstd: sp.Expr, xhat: sp.Matrix) -> sp.Matrix:
    """``diag(gamma) rstd (I - 11^T/D - xhat xhat^T/D)``, in any ``rstd``, ``xhat``."""
    D = xhat.shape[0]
    centering = sp.eye(D) - sp.ones(D, D) / D
    return sp.diag(*gamma) * rstd * (centering - xhat * xhat.T / D)


def compact_jacobian(D: int) -> sp.Matrix:
    """The closed form of ``dy/dx`` in the plain symbols ``rstd`` and ``xhat_i``."""
    sym = symbols(D)
    rstd = sp.Symbol("rstd", positive=True)
    xhat = _column("xhat", sym.D, real=True)
    return _closed_form(sym.gamma, rstd, xhat)


def in_x_and_s(expr: sp.Basic | sp.MatrixBase,
               f: ForwardExprs) -> sp.Basic | sp.MatrixBase:
    """Rewrite ``expr`` with ``epsilon = s - var(x)``: roots become powers of ``s``.

    No other change, so the result shows the unsimplified structure.

    Parameters
    ----------
    expr : sympy.Expr or sympy.Matrix
        Built from the expressions of ``f``.
    f : ForwardExprs

    Examples
    --------
    >>> f = forward_exprs(2)
    >>> in_x_and_s(f.rstd, f)
    1/sqrt(s)
    """
    return expr.xreplace({f.sym.eps: f.sym.s - f.var})


def is_identically_zero(expr: sp.Basic | sp.MatrixBase, f: ForwardExprs) -> bool:
    """True when an expression or matrix of ``f``'s row expands to 0 in ``(x, s)``."""
    return all(e == 0 for e in _expanded(expr, f))


def _expanded(expr, f: ForwardExprs) -> sp.Matrix:
    M = expr if isinstance(expr, sp.MatrixBase) else sp.Matrix([expr])
    return in_x_and_s(M, f).applyfunc(sp.expand)


#: The identities the book proves (see :func:`residuals`), in the order it proves
#: them.
IDENTITIES = ("closed_form", "symmetric", "shift", "scale", "compact_vjp", "mean_path")


def _mean_path(f: ForwardExprs) -> tuple[sp.Expr, sp.Expr]:
    """``d var(x, m) / d m`` with ``m`` a free symbol, and the same at ``m = mu(x)``."""
    m = sp.Symbol("m", real=True)
    dvar_dm = sp.diff(sum((xi - m) ** 2 for xi in f.sym.x) / f.sym.D, m)
    return dvar_dm, dvar_dm.xreplace({m: f.mu})


def _residual(f: ForwardExprs, name: str) -> sp.Matrix:
    """The residual of one identity, unsimplified (see :func:`residuals`)."""
    sym = f.sym
    ones = sp.ones(sym.D, 1)
    if name == "closed_form":
        return f.y.jacobian(sym.x) - _closed_form(sym.gamma, f.rstd, f.xhat)
    if name == "compact_vjp":
        g = sym.gamma.multiply_elementwise(sym.dy)
        mean_g = sum(g) / sym.D
        mean_gxhat = sum(g.multiply_elementwise(f.xhat)) / sym.D
        compact_dx = f.rstd * (g - mean_g * ones - f.xhat * mean_gxhat)
        return f.y.jacobian(sym.x).T * sym.dy - compact_dx
    if name == "mean_path":
        return sp.Matrix([_mean_path(f)[1]])
    N = f.xhat.jacobian(sym.x)
    if name == "symmetric":
        return N - N.T
    if name == "shift":
        return N * ones
    if name == "scale":
        return N * f.xhat - f.rstd * sym.eps / (f.var + sym.eps) * f.xhat
    raise ValueError(f"name must be one of {IDENTITIES}; got {name!r}.")


def residuals(D: int) -> dict[str, sp.Matrix]:
    """Every identity the book proves, as a residual that must expand to zero.

    With ``J = dy/dx`` and ``N = d xhat / dx`` computed by SymPy, in the order
    of :data:`IDENTITIES`:

    * ``"closed_form"``: ``J - diag(gamma) rstd (I - 1 1^T/D - xhat xhat^T/D)``;
    * ``"symmetric"``: ``N - N^T``;
    * ``"shift"``: ``N 1`` (adding a constant to a row changes nothing);
    * ``"scale"``: ``N xhat - rstd * eps / (var + eps) * xhat``: with
      ``eps > 0`` the scale direction ``xhat`` is an eigenvector with the small
      eigenvalue ``rstd * eps / (var + eps)``, not in the null space;
    * ``"compact_vjp"``: ``J^T dy - rstd (g - mean(g) - xhat mean(g xhat))``
      with ``g = gamma * dy``;
    * ``"mean_path"``: ``d var / d m`` at ``m = mu`` (1 x 1, see
      :func:`mean_path_term`).

    Returns
    -------
    dict of str to sympy.Matrix
        Each residual rewritten in ``(x, s)`` and expanded: a zero matrix
        exactly when the identity holds.

    Examples
    --------
    >>> residuals(2)["shift"].T
    Matrix([[0, 0]])
    """
    f = forward_exprs(D)
    return {name: _expanded(_residual(f, name), f) for name in IDENTITIES}


def prove(D: int, name: str) -> bool:
    """True when the identity ``name`` (:data:`IDENTITIES`) holds for rows of length D.

    Examples
    --------
    >>> prove(2, "symmetric"), prove(2, "shift")
    (True, True)
    """
    f = forward_exprs(D)
    return is_identically_zero(_residual(f, name), f)


def mean_path_term(D: int) -> tuple[sp.Expr, sp.Expr]:
    """The derivative of the variance through the mean, before and after ``m = mu``.

    With ``var(x, m) = sum((x_k - m)**2) / D`` and ``m`` a free symbol, returns
    ``d var / d m = -(2/D) sum(x_k - m)`` and its value at ``m = mu(x)``,
    expanded: 0, because the deviations from the mean sum to zero.

    Examples
    --------
    >>> mean_path_term(2)
    (2*m - x_1 - x_2, 0)
    """
    dvar_dm, at_mean = _mean_path(forward_exprs(D))
    return dvar_dm, sp.expand(at_mean)


def vjp(D: int) -> tuple[sp.Matrix, sp.Matrix, sp.Matrix]:
    """The vector-Jacobian products of one row, computed by SymPy from the forward.

    Returns ``dx = (dy/dx)^T dy``, ``dgamma = (dy/dgamma)^T dy`` and
    ``dbeta = (dy/dbeta)^T dy``, each D x 1, in the symbols of :func:`symbols`.

    Examples
    --------
    >>> vjp(2)[2].T
    Matrix([[dy_1, dy_2]])
    """
    f = forward_exprs(D)
    sym = f.sym
    dx = f.y.jacobian(sym.x).T * sym.dy
    dgamma = f.y.jacobian(sym.gamma).T * sym.dy
    dbeta = f.y.jacobian(sym.beta).T * sym.dy
    return dx, dgamma, dbeta


def evaluate(
    expr: sp.Basic | sp.MatrixBase,
    sym: LayerNormSymbols,
    *,
    x,
    gamma,
    eps: float,
    beta=None,
    dy=None,
) -> np.ndarray:
    """Evaluate an expression of the symbols ``sym`` at float64 values, to 30 digits."""
    values = {sym.eps: sp.Rational(float(eps))}
    named = (("x", sym.x, x), ("gamma", sym.gamma, gamma), ("beta", sym.beta, beta),
             ("dy", sym.dy, dy))
    for name, column, arr in named:
        if arr is not None:
            flat = np.ravel(arr)
            if flat.size != len(column):
                raise ValueError(
                    f"evaluate: {name} has {flat.size} values, but the symbols are "
                    f"for rows of D = {len(column)}"
                )
            values.update({s: sp.Rational(float(v)) for s, v in zip(column, flat)})
    if isinstance(expr, sp.MatrixBase):
        out = [
            [float(e.xreplace(values).evalf(EVAL_DIGITS)) for e in expr.row(i)]
            for i in range(expr.rows)
        ]
        return np.array(out, dtype=np.float64)
    return np.array(float(expr.xreplace(values).evalf(EVAL_DIGITS)))


def evaluate_vjp(
    x, gamma, dy, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The symbolic VJP of :func:`vjp`, evaluated row by row at numbers.

    Each input is converted exactly to a rational and every expression
    evaluated with ``EVAL_DIGITS`` (30) significant digits: a reference for
    :func:`lnorm.backward` independent of NumPy's arithmetic.

    Parameters
    ----------
    x, dy : array_like, shape (..., D)
        Floating; a small ``D``.
    gamma : array_like, shape (D,)
    eps : float, default 1e-5

    Returns
    -------
    dx, dgamma, dbeta : ndarray of float64
        ``dgamma`` and ``dbeta`` summed over the rows, as :func:`lnorm.backward`.

    Examples
    --------
    >>> import lnorm
    >>> x, dy = np.array([[1.0, 2.0, 4.0]]), np.array([[0.5, -1.0, 2.0]])
    >>> gamma = np.array([1.0, 2.0, 3.0])
    >>> symbolic = evaluate_vjp(x, gamma, dy)
    >>> numeric = lnorm.backward(dy, lnorm.forward(x, gamma, np.zeros(3))[1])
    >>> all(bool(np.allclose(a, b)) for a, b in zip(symbolic, numeric))
    True
    """
    x = as_rows(x, "x")
    D = x.shape[-1]
    gamma = check_param(gamma, "gamma", D)
    dy = as_float_array(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x, {x.shape}; got {dy.shape}.")
    eps = check_eps(eps)

    sym = symbols(D)
    dx_expr, dgamma_expr, dbeta_expr = vjp(D)
    stacked = dx_expr.row_join(dgamma_expr).row_join(dbeta_expr)
    rows_x, rows_dy = x.reshape(-1, D), dy.reshape(-1, D)
    dx = np.empty(rows_x.shape, dtype=np.float64)
    dgamma = np.zeros(D, dtype=np.float64)
    dbeta = np.zeros(D, dtype=np.float64)
    for r, (xr, dyr) in enumerate(zip(rows_x, rows_dy)):
        vals = evaluate(stacked, sym, x=xr, gamma=gamma, eps=eps, dy=dyr)
        dx[r] = vals[:, 0]
        dgamma += vals[:, 1]
        dbeta += vals[:, 2]
    return dx.reshape(x.shape), dgamma, dbeta


def jacobian_numpy(cache: LayerNormCache) -> np.ndarray:
    """The dense Jacobian ``dy/dx`` of every row, from the closed form, in NumPy.

    ``J[..., i, j] = gamma_i * rstd * (delta_ij - 1/D - xhat_i * xhat_j / D)``,
    in float64 from a :class:`lnorm.LayerNormCache`: D**2 numbers per row.

    Examples
    --------
    >>> import lnorm
    >>> cache = lnorm.forward(np.array([[1.0, 2.0, 4.0]]), np.ones(3), np.zeros(3))[1]
    >>> J = jacobian_numpy(cache)
    >>> J.shape, bool(np.allclose(J.sum(axis=-1), 0.0))
    ((1, 3, 3), True)
    """
    cache = check_cache(cache)
    D = cache.shape[-1]
    xhat = cache.xhat.astype(ACC_DTYPE)
    rstd = cache.rstd[..., None, None]
    gamma = cache.gamma.astype(ACC_DTYPE)[:, None]
    outer = xhat[..., :, None] * xhat[..., None, :]
    return gamma * rstd * (np.eye(D) - 1.0 / D - outer / D)


def backward_via_jacobian(
    dy, cache: LayerNormCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The naive backward: every row's D x D Jacobian, then ``dx = J^T dy``.

    The arguments and results of :func:`lnorm.backward`, but all three results
    in float64, at O(D**2) time and memory per row instead of O(D).

    Examples
    --------
    >>> import lnorm
    >>> x, dy = np.array([[1.0, 2.0, 4.0]]), np.array([[0.5, -1.0, 2.0]])
    >>> cache = lnorm.forward(x, np.ones(3), np.zeros(3))[1]
    >>> naive, compact = backward_via_jacobian(dy, cache), lnorm.backward(dy, cache)
    >>> all(bool(np.allclose(a, b)) for a, b in zip(naive, compact))
    True
    """
    dy = check_dy(dy, cache)
    dy64 = dy.astype(ACC_DTYPE)
    J = jacobian_numpy(cache)
    dx = np.einsum("...ij,...i->...j", J, dy64)
    lead = tuple(range(dy.ndim - 1))
    dgamma = (dy64 * cache.xhat.astype(ACC_DTYPE)).sum(axis=lead)
    dbeta = dy64.sum(axis=lead)
    return dx, dgamma, dbeta


def latex(expr: sp.Basic | sp.MatrixBase) -> str:
    r"""``sympy.latex`` with the book's notation for ``rstd`` and ``epsilon``.

    Examples
    --------
    >>> print(latex(compact_jacobian(2)[0, 0]))
    \gamma_{1} \operatorname{rstd} \left(\frac{1}{2} - \frac{\hat{x}_{1}^{2}}{2}\right)
    """
    names = {
        sp.Symbol("rstd", positive=True): r"\operatorname{rstd}",
        sp.Symbol("epsilon", positive=True): r"\varepsilon",
    }
    return sp.latex(expr, symbol_names=names)
