"""Layer normalization in SymPy for every row length D at once.

:mod:`lnorm.symbolic` writes a row as ``D`` separate symbols, so each of its
proofs is for one concrete ``D``. Here the row length is a positive integer
symbol ``D``, a row is an indexed symbol ``x[k]``, and the mean, the variance
and the loss are ``sympy.Sum`` objects over ``k = 1..D``::

    mu   = Sum(x[l], (l, 1, D)) / D
    var  = Sum((x[k] - mu)**2, (k, 1, D)) / D
    rstd = 1 / sqrt(var + eps)        xhat[i] = (x[i] - mu) * rstd
    y[i] = gamma[i] * xhat[i] + beta[i]

``sympy.diff`` differentiates a ``Sum`` with respect to one entry ``x[j]`` term
by term, with ``d x[k] / d x[j] = KroneckerDelta(j, k)``. :func:`vanishes`
then decides whether an expression is zero in four steps:

1. :func:`expand_sums` writes every ``Sum`` as a combination of sums of
   products (linearity), counts ``Sum(1) = D``, and evaluates
   ``Sum(KroneckerDelta(j, k) * f(k)) = f(j)``, valid because every free
   index ``i``, ``j`` is a position in the row (``1 <= j <= D``);
2. every remaining ``Sum`` becomes an opaque symbol named after its summand,
   so that the same sum written with two dummy indices is one symbol;
3. ``eps = s - var`` turns every root into a power of the one positive
   symbol ``s``, as in :mod:`lnorm.symbolic` (for another variance, such as
   the sum over ``D - 1``, with that variance; when the roots' bases differ,
   ``eps`` stays and step 4 decides alone);
4. ``sympy.expand`` must give 0 (coefficients that are rational functions
   of ``D`` are first put over a common denominator, which holds where the
   denominators are not zero: ``D >= 2`` for a variance over ``D - 1``).

Why a zero is a proof: each step can lose an identity but never create one.
Steps 1, 3 and 4 rewrite the expression into an equal one (step 3 through a
one-to-one change of variable, whatever variance it uses). Step 2 replaces
the sums by independent variables, and an expression that is zero for all
values of those variables is zero for the values the sums do take. So zero
at the end implies zero at the start: a proof for every ``D >= 1`` where
step 4's denominators are not zero. The converse is what fails: a true
identity that needs a relation between two sums (such as
``Sum(x[k] - mu) = 0``, which step 1 gets by linearity) would be reported as
not proved. ``False`` means "not shown", never "shown to be nonzero".

The chapter that uses it: "Deriving the backward" (``book/02_derivation.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import sympy as sp

from .symbolic import IDENTITIES

__all__ = [
    "RowSums",
    "row_sums",
    "expand_sums",
    "vanishes",
    "GENERAL_IDENTITIES",
    "general_residual",
    "prove_for_every_D",
]


@dataclass(frozen=True)
class RowSums:
    """One row of any length ``D``; :func:`row_sums` lists its fields."""

    D: sp.Symbol
    i: sp.Symbol
    j: sp.Symbol
    x: sp.IndexedBase
    gamma: sp.IndexedBase
    beta: sp.IndexedBase
    dy: sp.IndexedBase
    eps: sp.Symbol
    mu: sp.Expr
    var: sp.Expr
    rstd: sp.Expr

    def row_sum(self, summand: sp.Expr, index: sp.Symbol) -> sp.Sum:
        """``Sum(summand, (index, 1, D))``, unevaluated: a sum over the row.

        Examples
        --------
        >>> r = row_sums()
        >>> r.row_sum(r.x[r.j], r.j)
        Sum(x[j], (j, 1, D))
        """
        return sp.Sum(summand, (index, 1, self.D))

    def xhat(self, index: sp.Expr) -> sp.Expr:
        """``(x[index] - mu) * rstd``, with ``mu`` and ``rstd`` written out as sums."""
        return (self.x[index] - self.mu) * self.rstd

    def y(self, index: sp.Expr) -> sp.Expr:
        """``gamma[index] * xhat[index] + beta[index]``: the output at one position.

        Examples
        --------
        >>> r = row_sums()
        >>> sp.diff(r.y(r.i), r.beta[r.i])
        1
        """
        return self.gamma[index] * self.xhat(index) + self.beta[index]


@cache
def row_sums() -> RowSums:
    """The symbols and the statistics of one row of any length ``D``.

    Returns
    -------
    RowSums
        The same object on every call. ``D``, ``i`` and ``j`` are positive
        integer symbols; ``x``, ``gamma``, ``beta`` and ``dy`` real indexed
        symbols; ``eps`` positive; ``mu``, ``var`` and ``rstd`` expressions.

    Examples
    --------
    >>> r = row_sums()
    >>> r.mu
    Sum(x[l], (l, 1, D))/D
    """
    D = sp.Symbol("D", integer=True, positive=True)
    i, j, k, m = sp.symbols("i j k l", integer=True, positive=True)
    x, gamma, beta, dy = (
        sp.IndexedBase(name, real=True) for name in ("x", "gamma", "beta", "dy")
    )
    eps = sp.Symbol("epsilon", positive=True)
    mu = sp.Sum(x[m], (m, 1, D)) / D
    var = sp.Sum((x[k] - mu) ** 2, (k, 1, D)) / D
    rstd = 1 / sp.sqrt(var + eps)
    return RowSums(D, i, j, x, gamma, beta, dy, eps, mu, var, rstd)


def _split_sum(s: sp.Sum) -> sp.Expr:
    """One ``Sum`` as a combination of simpler ones (step 1 of the module doc)."""
    if len(s.limits) != 1:
        return s
    (k, lo, hi), = s.limits
    out = sp.S.Zero
    for term in sp.Add.make_args(sp.expand(s.function)):
        coeff, part = term.as_independent(k, as_Add=False)
        if part == 1:
            out += coeff * (hi - lo + 1)
            continue
        deltas = [
            f for f in sp.Mul.make_args(part)
            if isinstance(f, sp.KroneckerDelta) and k in f.free_symbols
        ]
        if deltas and lo == 1 and hi == row_sums().D:
            # Sum over k of delta(k, p) f(k) = f(p): p is a position in the row.
            (other,) = set(deltas[0].args) - {k}
            out += coeff * (part / deltas[0]).subs(k, other)
        else:
            out += coeff * sp.Sum(part, (k, lo, hi))
    return out


def expand_sums(expr: sp.Expr) -> sp.Expr:
    """Write every ``Sum`` in ``expr`` as a combination of sums of products.

    Step 1 of the module docstring, repeated until nothing changes; the result
    equals ``expr`` for every ``D`` and every position of the free indices.

    Examples
    --------
    >>> r = row_sums()
    >>> expand_sums(r.row_sum(r.x[r.j] - r.mu, r.j))
    Sum(x[j], (j, 1, D)) - Sum(x[l], (l, 1, D))

    The two sums differ only in their dummy index; :func:`vanishes` makes them
    one symbol.

    >>> k = sp.Symbol("k", integer=True, positive=True)
    >>> expand_sums(r.row_sum(sp.KroneckerDelta(k, r.j) * r.x[k] ** 2, k))
    x[j]**2
    """
    while True:
        new = expr.replace(lambda e: isinstance(e, sp.Sum), _split_sum)
        if new == expr:
            return expr
        expr = new


def _opaque_sums(expr: sp.Expr) -> sp.Expr:
    """Each remaining ``Sum`` as a symbol named after its summand (step 2)."""
    n = sp.Symbol("n", integer=True, positive=True)

    def to_symbol(s: sp.Sum) -> sp.Symbol:
        (k, lo, hi), = s.limits
        return sp.Symbol(f"Sum[{s.function.subs(k, n)}, {lo}, {hi}]", real=True)

    return expr.replace(lambda e: isinstance(e, sp.Sum), to_symbol)


def _in_s(expr: sp.Expr) -> sp.Expr:
    """``expr`` with its sums opaque, in ``s`` for ``eps``, expanded (steps 2 to 4)."""
    eps = row_sums().eps
    s = sp.Symbol("s", positive=True)
    e = _opaque_sums(expand_sums(expr))

    def monic(base: sp.Expr) -> sp.Expr | None:
        base = sp.expand(base)
        c = base.coeff(eps)
        if c == 0 or c.has(eps) or sp.expand(base - c * eps).has(eps):
            return None
        return sp.expand(base / c)

    powers = [a for a in e.atoms(sp.Pow) if a.base.has(eps)]
    roots = [a for a in powers if not a.exp.is_integer]
    # A power of eps alone says nothing about the rest; bases of higher degree
    # in eps (squares expanded by expand_sums) have no monic form.
    bases = {monic(a.base) for a in roots or powers} - {None, eps}
    if len(bases) == 1:
        (base,) = bases
        e = e.subs(eps, s - (base - eps))
        # Each base, expanded, is now a multiple of s (the rest cancels), and
        # expand splits (D * s)**r into D**r * s**r: D and s are positive.
        e = e.replace(
            lambda a: isinstance(a, sp.Pow) and a.base.has(s),
            lambda a: sp.Pow(sp.expand(a.base), a.exp),
        )
    e = sp.expand(e)
    # Coefficients that are rational functions of D (from a variance over
    # D - 1) cancel only over a common denominator.
    return e if e == 0 else sp.cancel(sp.together(e))


def vanishes(expr: sp.Expr) -> bool:
    """True when ``expr`` is zero for every ``D``, row, position and ``eps > 0``.

    The four steps of the module docstring: ``False`` means "not shown".

    Examples
    --------
    >>> r = row_sums()
    >>> xhat_sum = r.row_sum(r.xhat(r.j), r.j)
    >>> vanishes(xhat_sum), vanishes(r.row_sum(r.xhat(r.j) ** 2, r.j) - r.D)
    (True, False)
    """
    return _in_s(expr) == 0


#: The identities proved for every ``D`` (see :func:`general_residual`): those
#: :mod:`lnorm.symbolic` proves for one ``D`` at a time.
GENERAL_IDENTITIES = IDENTITIES


def _N(r: RowSums, i: sp.Expr, j: sp.Expr) -> sp.Expr:
    """``d xhat[i] / d x[j]``, by SymPy."""
    return sp.diff(r.xhat(i), r.x[j])


def general_residual(name: str) -> sp.Expr:
    """Residual of ``name`` (as in :func:`lnorm.symbolic.residuals`) for every ``D``."""
    r = row_sums()
    i, j, D = r.i, r.j, r.D
    k = sp.Symbol("k", integer=True, positive=True)
    if name == "closed_form":
        closed = r.gamma[i] * r.rstd * (
            sp.KroneckerDelta(i, j) - 1 / D - r.xhat(i) * r.xhat(j) / D
        )
        return sp.diff(r.y(i), r.x[j]) - closed
    if name == "symmetric":
        return _N(r, i, j) - _N(r, j, i)
    if name == "shift":
        return r.row_sum(_N(r, i, j), j)
    if name == "scale":
        small = r.rstd * r.eps / (r.var + r.eps)
        return r.row_sum(_N(r, i, j) * r.xhat(j), j) - small * r.xhat(i)
    if name == "compact_vjp":
        g = r.gamma[k] * r.dy[k]
        mean_g = r.row_sum(g, k) / D
        mean_gxhat = r.row_sum(g * r.xhat(k), k) / D
        compact = r.rstd * (r.gamma[j] * r.dy[j] - mean_g - r.xhat(j) * mean_gxhat)
        loss = r.row_sum(r.dy[i] * r.y(i), i)
        return sp.diff(loss, r.x[j]) - compact
    if name == "mean_path":
        m = sp.Symbol("m", real=True)
        dvar_dm = sp.diff(r.row_sum((r.x[k] - m) ** 2, k) / D, m)
        return dvar_dm.subs(m, r.mu)
    raise ValueError(f"name must be one of {GENERAL_IDENTITIES}; got {name!r}.")


def prove_for_every_D(name: str) -> bool:
    """True when the identity ``name`` holds for every row length ``D``.

    :func:`vanishes` applied to :func:`general_residual`: a proof for every
    ``D >= 1``, every real row, ``gamma``, ``dy`` and every ``eps > 0``.

    Examples
    --------
    >>> all(prove_for_every_D(name) for name in GENERAL_IDENTITIES)
    True
    """
    return vanishes(general_residual(name))
