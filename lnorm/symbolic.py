"""Layer normalization in SymPy: the Jacobian for a concrete D, its closed form, the VJP.

For one row ``x = (x_1, ..., x_D)`` the forward is written as SymPy
expressions in the symbols ``x_i``, ``gamma_i``, ``beta_i`` and ``epsilon``:

.. math::

    \\mu = \\frac1D \\sum_k x_k, \\qquad
    \\sigma^2 = \\frac1D \\sum_k (x_k - \\mu)^2, \\qquad
    \\mathrm{rstd} = (\\sigma^2 + \\varepsilon)^{-1/2},

    \\hat x_i = (x_i - \\mu)\\,\\mathrm{rstd}, \\qquad y_i = \\gamma_i \\hat x_i + \\beta_i .

SymPy differentiates these expressions (``Matrix.jacobian``), with no
knowledge of the closed forms; :func:`prove` then shows that the
result equals what the book derives by hand:

.. math::

    \\frac{\\partial \\hat x}{\\partial x}
        = \\mathrm{rstd}\\,\\Bigl(I - \\frac{\\mathbf 1\\mathbf 1^\\top}{D}
          - \\frac{\\hat x \\hat x^\\top}{D}\\Bigr), \\qquad
    \\frac{\\partial y}{\\partial x} = \\operatorname{diag}(\\gamma)\\,
        \\frac{\\partial \\hat x}{\\partial x}.

How the proofs stay fast
------------------------
Every entry of these Jacobians is a polynomial in ``x`` times a power of
``sigma^2 + epsilon``. Asking ``sympy.simplify`` to cancel square roots of a
sum of squares is slow and not guaranteed. Instead, each residual is written
in the variables ``(x, s)`` with ``s = sigma^2(x) + epsilon``, i.e. ``epsilon``
is replaced by ``s - sigma^2(x)``. For fixed ``x`` this is a one-to-one change
of variable (``epsilon > 0`` if and only if ``s > sigma^2(x)``), so a residual
is zero for all ``(x, epsilon)`` with ``epsilon > 0`` exactly when it is zero
for all ``(x, s)`` with ``s > sigma^2(x)``. In the new variables every square
root is a power of the single positive symbol ``s``, and ``sympy.expand``
decides whether the residual is zero: a sum of monomials in ``x_i``,
``gamma_i`` and powers of ``s`` is zero exactly when every coefficient
cancels, and then it is zero for every ``s > 0``, those above ``sigma^2(x)``
included. Each proof is for one concrete ``D``; the book runs D = 2..6.

The NumPy half (:func:`jacobian_numpy`, :func:`backward_via_jacobian`)
builds the dense D x D Jacobian of every row from the closed form: the
*naive* backward, O(D^2) per row, against which the compact
:func:`lnorm.backward` (O(D) per row) is measured and checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

from .core import ACC_DTYPE, LayerNormCache
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
    """The symbols of one row of layer normalization.

    Attributes
    ----------
    D : int
        Row length.
    x, gamma, beta, dy : sympy.Matrix, shape (D, 1)
        Real symbols ``x_i``, ``gamma_i``, ``beta_i`` and the upstream
        gradient ``dy_i`` (named ``dy_i`` in LaTeX as ``dy_{i}``).
    eps : sympy.Symbol
        The positive symbol ``epsilon``.
    s : sympy.Symbol
        The positive symbol ``s`` that stands for ``sigma^2 + epsilon`` in the
        proofs (see the module docstring).
    """

    D: int
    x: sp.Matrix
    gamma: sp.Matrix
    beta: sp.Matrix
    dy: sp.Matrix
    eps: sp.Symbol
    s: sp.Symbol


@dataclass(frozen=True)
class ForwardExprs:
    """The forward of one row as SymPy expressions in ``x`` and ``epsilon``.

    Attributes
    ----------
    sym : LayerNormSymbols
        The symbols the expressions are written in.
    mu, var, rstd : sympy.Expr
        Mean, biased variance and ``1/sqrt(var + epsilon)``.
    xhat, y : sympy.Matrix, shape (D, 1)
        ``(x - mu) * rstd`` and ``gamma * xhat + beta``.
    """

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
    """Symbols ``x_1..x_D``, ``gamma_1..gamma_D``, ``beta_1..beta_D``, ``dy_1..dy_D``, ``epsilon``.

    Parameters
    ----------
    D : int
        Row length, >= 1. The proofs are meant for small D (2 to 6): the
        Jacobian has D^2 entries, each a sum over the row.

    Returns
    -------
    LayerNormSymbols
        All real; ``epsilon`` and ``s`` positive.
    """
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

    .. math::

        \\mu = \\tfrac1D \\textstyle\\sum_k x_k,\\quad
        \\sigma^2 = \\tfrac1D \\textstyle\\sum_k (x_k-\\mu)^2,\\quad
        \\mathrm{rstd} = (\\sigma^2+\\varepsilon)^{-1/2},\\quad
        \\hat x = (x - \\mu)\\,\\mathrm{rstd},\\quad y = \\gamma\\odot\\hat x + \\beta .

    Nothing is an opaque symbol: ``mu`` and ``var`` are written out in the
    ``x_i``, so differentiating ``y`` follows every path the chain rule has.
    """
    sym = symbols(D)
    mu = sum(sym.x) / sym.D
    var = sum((xi - mu) ** 2 for xi in sym.x) / sym.D
    rstd = 1 / sp.sqrt(var + sym.eps)
    xhat = (sym.x - mu * sp.ones(sym.D, 1)) * rstd
    y = sym.gamma.multiply_elementwise(xhat) + sym.beta
    return ForwardExprs(sym=sym, mu=mu, var=var, rstd=rstd, xhat=xhat, y=y)


def jacobian(D: int) -> sp.Matrix:
    """The full Jacobian ``dy/dx`` (D x D), by ``sympy.Matrix.jacobian``.

    Entry ``(i, j)`` is ``d y_i / d x_j``, an explicit expression in ``x``,
    ``gamma`` and ``epsilon``; no simplification is applied.
    """
    f = forward_exprs(D)
    return f.y.jacobian(f.sym.x)


def normalization_jacobian(D: int) -> sp.Matrix:
    """The Jacobian of the normalization alone, ``d xhat / dx`` (D x D), by ``Matrix.jacobian``."""
    f = forward_exprs(D)
    return f.xhat.jacobian(f.sym.x)


def _closed_form(gamma: sp.Matrix, rstd: sp.Expr, xhat: sp.Matrix) -> sp.Matrix:
    """``diag(gamma) rstd (I - 11^T/D - xhat xhat^T/D)``, in whatever ``rstd`` and ``xhat`` are."""
    D = xhat.shape[0]
    centering = sp.eye(D) - sp.ones(D, D) / D
    return sp.diag(*gamma) * rstd * (centering - xhat * xhat.T / D)


def compact_jacobian(D: int) -> sp.Matrix:
    """The closed form of ``dy/dx`` with ``rstd`` and ``xhat_1..xhat_D`` as plain symbols (for display).

    Printed with ``sympy.latex`` it shows the structure the book derives:
    entry ``(i, j)`` is ``gamma_i rstd (delta_ij - 1/D - xhat_i xhat_j / D)``.
    """
    sym = symbols(D)
    rstd = sp.Symbol("rstd", positive=True)
    xhat = _column("xhat", sym.D, real=True)
    return _closed_form(sym.gamma, rstd, xhat)


def in_x_and_s(expr: sp.Basic | sp.MatrixBase, f: ForwardExprs) -> sp.Basic | sp.MatrixBase:
    """Rewrite ``expr`` with ``epsilon = s - var(x)``: every square root becomes a power of ``s``.

    Parameters
    ----------
    expr : sympy.Expr or sympy.Matrix
        Built from the expressions of ``f``.
    f : ForwardExprs

    Returns
    -------
    The same object type, in ``x`` and the positive symbol ``s = var(x) + epsilon``
    (``f.sym.s``); no other change, so it prints the unsimplified structure.
    """
    return expr.xreplace({f.sym.eps: f.sym.s - f.var})


def is_identically_zero(expr: sp.Basic | sp.MatrixBase, f: ForwardExprs) -> bool:
    """Decide whether an expression (or matrix) in ``x``, ``gamma``, ``dy``, ``epsilon`` is zero.

    Parameters
    ----------
    expr : sympy.Expr or sympy.Matrix
        Built from the expressions of ``f`` (and any of its symbols).
    f : ForwardExprs
        The forward the expression was built from.

    Returns
    -------
    bool
        True when every entry, rewritten in ``(x, s)`` with
        ``s = var(x) + epsilon`` and expanded, is the number 0. This is a
        proof for all real ``x``, ``gamma``, ``dy`` and all ``epsilon > 0``
        (see the module docstring for why the change of variable is valid).
        False when terms survive the expansion: for the polynomials in ``x``
        times powers of ``s`` that these residuals are, ``expand`` is a
        canonical form, so surviving terms disprove the identity.
    """
    return all(e == 0 for e in _expanded(expr, f))


def _expanded(expr, f: ForwardExprs) -> sp.Matrix:
    M = expr if isinstance(expr, sp.MatrixBase) else sp.Matrix([expr])
    return in_x_and_s(M, f).applyfunc(sp.expand)


#: The identities the book proves (see :func:`residuals`), in the order it proves them.
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
    """Every identity the book proves, as a residual that must simplify to zero.

    With ``J = dy/dx`` and ``N = d xhat / dx`` computed by SymPy:

    * ``"closed_form"``: ``J - diag(gamma) rstd (I - 11^T/D - xhat xhat^T/D)``,
    * ``"symmetric"``: ``N - N^T``,
    * ``"shift"``: ``N 1`` (adding a constant to a row changes nothing),
    * ``"scale"``: ``N xhat - rstd * eps / (var + eps) * xhat``; with
      ``eps = 0`` the scale direction ``xhat`` would be in the null space,
      with ``eps > 0`` it is an eigenvector with the small eigenvalue
      ``rstd * eps / (var + eps)``,
    * ``"compact_vjp"``: ``J^T dy - rstd (g - mean(g) - xhat mean(g xhat))``
      with ``g = gamma * dy``,
    * ``"mean_path"``: ``d var / d m`` at ``m = mu`` (1 x 1), the path from
      ``x`` through the mean into the variance (see :func:`mean_path_term`).

    Returns
    -------
    dict of str to sympy.Matrix
        Each residual after the rewrite to ``(x, s)`` and ``sympy.expand``:
        a zero matrix exactly when the identity holds.
    """
    f = forward_exprs(D)
    return {name: _expanded(_residual(f, name), f) for name in IDENTITIES}


def prove(D: int, name: str) -> bool:
    """True when the identity ``name`` (one of :data:`IDENTITIES`) holds for rows of length ``D``.

    One residual of :func:`residuals`, decided by :func:`is_identically_zero`:
    for this ``D``, a proof for all real ``x``, ``gamma``, ``dy`` and all
    ``epsilon > 0`` (not a proof for every ``D``).
    """
    f = forward_exprs(D)
    return is_identically_zero(_residual(f, name), f)


def mean_path_term(D: int) -> tuple[sp.Expr, sp.Expr]:
    """The derivative of the variance through the mean, before and after ``m = mu``.

    Writes ``var(x, m) = (1/D) sum_k (x_k - m)^2`` with ``m`` a free symbol.

    Returns
    -------
    dvar_dm : sympy.Expr
        ``d var / d m = -(2/D) sum_k (x_k - m)``, in ``x`` and ``m``.
    at_mean : sympy.Expr
        The same at ``m = mu(x)``, expanded: 0, because the deviations from
        the mean sum to zero.
    """
    dvar_dm, at_mean = _mean_path(forward_exprs(D))
    return dvar_dm, sp.expand(at_mean)


def vjp(D: int) -> tuple[sp.Matrix, sp.Matrix, sp.Matrix]:
    """The vector-Jacobian products of one row, computed by SymPy from the forward.

    .. math::

        dx = \\Bigl(\\frac{\\partial y}{\\partial x}\\Bigr)^{\\!\\top} dy, \\qquad
        d\\gamma = \\Bigl(\\frac{\\partial y}{\\partial \\gamma}\\Bigr)^{\\!\\top} dy, \\qquad
        d\\beta = \\Bigl(\\frac{\\partial y}{\\partial \\beta}\\Bigr)^{\\!\\top} dy .

    Returns
    -------
    dx, dgamma, dbeta : sympy.Matrix, shape (D, 1)
        Expressions in the symbols of :func:`symbols` (``dy_i`` included).
    """
    f = forward_exprs(D)
    sym = f.sym
    dx = f.y.jacobian(sym.x).T * sym.dy
    dgamma = f.y.jacobian(sym.gamma).T * sym.dy
    dbeta = f.y.jacobian(sym.beta).T * sym.dy
    return dx, dgamma, dbeta


def evaluate(
    expr: sp.Basic | sp.MatrixBase, sym: LayerNormSymbols, *, x, gamma, eps: float, beta=None, dy=None
) -> np.ndarray:
    """Evaluate a SymPy expression or matrix at numbers, to ``EVAL_DIGITS`` digits, as float64.

    Every float64 input is converted exactly (a float64 is a binary
    fraction) and the expression is evaluated by ``evalf`` with 30
    significant digits, so the result is a reference accurate far beyond
    float64, independent of NumPy.

    Parameters
    ----------
    expr : sympy.Expr or sympy.Matrix
    sym : LayerNormSymbols
        The symbols ``expr`` is written in.
    x, gamma : array_like, shape (D,)
    eps : float
    beta, dy : array_like, shape (D,), optional
        Needed only when ``expr`` contains them.

    Returns
    -------
    ndarray of float64, the shape of ``expr`` (a 0-d array for a scalar).
    """
    values = {sym.eps: sp.Rational(float(eps))}
    for column, arr in ((sym.x, x), (sym.gamma, gamma), (sym.beta, beta), (sym.dy, dy)):
        if arr is not None:
            values.update({s: sp.Rational(float(v)) for s, v in zip(column, np.ravel(arr))})
    if isinstance(expr, sp.MatrixBase):
        out = [[float(e.xreplace(values).evalf(EVAL_DIGITS)) for e in expr.row(i)] for i in range(expr.rows)]
        return np.array(out, dtype=np.float64)
    return np.array(float(expr.xreplace(values).evalf(EVAL_DIGITS)))


def evaluate_vjp(x, gamma, dy, eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The symbolic VJP of :func:`vjp`, evaluated row by row at numbers (a reference for :func:`lnorm.backward`).

    Parameters
    ----------
    x, dy : array_like, shape (..., D)
        Floating; small D (the expressions grow as D^2). Not modified.
    gamma : array_like, shape (D,)
    eps : float, default 1e-5

    Returns
    -------
    dx : ndarray, shape of ``x``, float64
    dgamma, dbeta : ndarray, shape (D,), float64
        Summed over the rows, like :func:`lnorm.backward`.
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

    .. math::

        J_{ij} = \\gamma_i\\,\\mathrm{rstd}\\,\\Bigl(\\delta_{ij} - \\frac1D
                 - \\frac{\\hat x_i \\hat x_j}{D}\\Bigr).

    Parameters
    ----------
    cache : LayerNormCache
        From :func:`lnorm.forward` (``xhat``, ``rstd``, ``gamma``).

    Returns
    -------
    ndarray, shape (..., D, D), float64
        ``J[..., i, j] = d y_i / d x_j``. Memory is D^2 numbers per row: this
        is the naive route, for teaching and checking, not for use.
    """
    cache = check_cache(cache)
    D = cache.shape[-1]
    xhat = cache.xhat.astype(ACC_DTYPE)
    rstd = cache.rstd[..., None, None]
    gamma = cache.gamma.astype(ACC_DTYPE)[:, None]
    outer = xhat[..., :, None] * xhat[..., None, :]
    return gamma * rstd * (np.eye(D) - 1.0 / D - outer / D)


def backward_via_jacobian(dy, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The naive backward: materialize every row's D x D Jacobian and multiply, ``dx = J^T dy``.

    Same arguments and results as :func:`lnorm.backward` (``dx`` in float64),
    at O(D^2) time and memory per row instead of O(D).
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
    """``sympy.latex`` with the book's notation: ``\\operatorname{rstd}`` and ``\\varepsilon``."""
    names = {
        sp.Symbol("rstd", positive=True): r"\operatorname{rstd}",
        sp.Symbol("epsilon", positive=True): r"\varepsilon",
    }
    return sp.latex(expr, symbol_names=names)
