"""lnorm.symbolic_sums: SymPy proves the book's identities for every D at once,
refuses wrong formulas, and differentiates the same function that lnorm.backward
implements."""

import numpy as np
import pytest
import sympy as sp
from reference import make_inputs

import lnorm
from lnorm import symbolic as S
from lnorm import symbolic_sums as G

R = G.row_sums()
K = sp.Symbol("k", integer=True, positive=True)


def test_the_identities_are_those_of_the_concrete_D_module():
    assert G.GENERAL_IDENTITIES == S.IDENTITIES


@pytest.mark.parametrize("name", G.GENERAL_IDENTITIES)
def test_identity_is_proved_for_every_D(name):
    assert G.prove_for_every_D(name) is True


@pytest.mark.parametrize("name", G.GENERAL_IDENTITIES)
def test_each_residual_states_something_before_it_is_expanded(name):
    # A residual that SymPy already sees as 0 (N_ij - N_ij, a sum of zeros)
    # would be "proved" whatever the identity; each one has terms to cancel.
    residual = G.general_residual(name)
    assert residual != 0
    assert residual.free_symbols  # in the row's symbols, not a constant


def test_an_unknown_identity_is_refused():
    with pytest.raises(ValueError, match="name must be one of"):
        G.general_residual("antisymmetric")


# --- wrong formulas must not vanish: the proofs can fail ----------------------


UNBIASED = R.row_sum((R.x[K] - R.mu) ** 2, K) / (R.D - 1)


def _rstd(var=None):
    return R.rstd if var is None else 1 / sp.sqrt(var + R.eps)


def _vjp(var=None):
    """SymPy's d(sum dy * y)/dx_j, for the forward with this variance."""
    rstd = _rstd(var)
    y = R.gamma[R.i] * (R.x[R.i] - R.mu) * rstd + R.beta[R.i]
    return sp.diff(R.row_sum(R.dy[R.i] * y, R.i), R.x[R.j])


def _compact(mean_g_scale=1, var=None, last_scale=1):
    """The compact dx, optionally with a fault (or the unbiased factor)."""
    rstd = _rstd(var)
    g = R.gamma[K] * R.dy[K]
    xhat = lambda p: (R.x[p] - R.mu) * rstd  # noqa: E731
    mean_g = mean_g_scale * R.row_sum(g, K) / R.D
    mean_gxhat = R.row_sum(g * xhat(K), K) / R.D
    g_j = R.gamma[R.j] * R.dy[R.j]
    return rstd * (g_j - mean_g - last_scale * xhat(R.j) * mean_gxhat)


def test_the_right_compact_dx_vanishes():
    # The control for the faults below: the same construction, no fault.
    assert G.vanishes(_vjp() - _compact())


def test_dx_without_the_mean_of_g_is_refused():
    assert not G.vanishes(_vjp() - _compact(mean_g_scale=0))


def test_dx_with_the_unbiased_variance_is_refused():
    assert not G.vanishes(_vjp() - _compact(var=UNBIASED))


def test_the_unbiased_formula_is_proved_with_its_own_variance():
    # With sum/(D - 1) in the forward, dx gets a factor D/(D - 1) on its last
    # term (chapter 2, exercise ex-der-unbiased): proved for every D >= 2, and
    # the factor is needed.
    vjp = _vjp(var=UNBIASED)
    right = _compact(var=UNBIASED, last_scale=R.D / (R.D - 1))
    assert G.vanishes(vjp - right)
    assert not G.vanishes(vjp - _compact(var=UNBIASED))


def test_a_closed_form_without_the_mean_term_is_refused():
    wrong = R.gamma[R.i] * R.rstd * (
        sp.KroneckerDelta(R.i, R.j) - R.xhat(R.i) * R.xhat(R.j) / R.D
    )
    assert not G.vanishes(sp.diff(R.y(R.i), R.x[R.j]) - wrong)


def test_the_scale_direction_is_not_in_the_null_space():
    # N xhat = 0 would hold only for eps = 0.
    N_xhat = R.row_sum(sp.diff(R.xhat(R.i), R.x[R.j]) * R.xhat(R.j), R.j)
    assert not G.vanishes(N_xhat)


def test_kronecker_sums_are_evaluated_at_the_position():
    assert G.expand_sums(R.row_sum(sp.KroneckerDelta(K, R.j) * R.x[K] ** 2, K)) == (
        R.x[R.j] ** 2
    )
    # No delta: the sum stays, split by linearity.
    split = G.expand_sums(R.row_sum(2 * R.x[K] + R.eps, K))
    assert split == 2 * R.row_sum(R.x[K], K) + R.D * R.eps


# --- the symbols describe the function lnorm computes -------------------------


def test_the_general_vjp_at_D_3_equals_lnorm_backward():
    # Put numbers into SymPy's derivative of the loss sum(dy * y) for D = 3 and
    # every position j; compare with the hand-written backward.
    D = 3
    x, gamma, beta, dy = make_inputs((1, D), np.float64, seed=3)
    eps = 1e-3
    values = {R.eps: eps}
    for name, row in (("x", x[0]), ("gamma", gamma), ("beta", beta), ("dy", dy[0])):
        base = getattr(R, name)
        values.update({base[p + 1]: sp.Float(v, 30) for p, v in enumerate(row)})
    vjp = _vjp().subs(R.D, D)
    symbolic_dx = [
        float(vjp.subs(R.j, p).doit().subs(values).evalf(30)) for p in range(1, D + 1)
    ]
    _, cache = lnorm.forward(x, gamma, beta, eps=eps)
    dx, _, _ = lnorm.backward(dy, cache)
    np.testing.assert_allclose(dx[0], symbolic_dx, rtol=1e-12, atol=1e-14)
