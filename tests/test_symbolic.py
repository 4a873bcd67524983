"""lnorm.symbolic: SymPy proves the closed form and the identities; lnorm.backward
matches the symbolic VJP."""

import numpy as np
import pytest
import sympy as sp

import lnorm
from lnorm import symbolic as S

# The smallest D, then an odd and an even one: each step of D costs about
# twice the SymPy time of the one before, and chapter 2 proves D = 2..6 in the
# build; lnorm.symbolic_sums proves every D.
DS = (2, 3, 4)


# --- the identities, proved by SymPy for D = 2..4 -----------------------------


# What each name in S.IDENTITIES claims:
#   closed_form  dy/dx = diag(gamma) rstd (I - 11^T/D - xhat xhat^T/D)
#   symmetric    N = dxhat/dx is symmetric
#   shift        N 1 = 0
#   scale        N xhat = rstd eps/(var + eps) xhat
#   compact_vjp  J^T dy = rstd (g - mean(g) - xhat mean(g xhat))
#   mean_path    d var / d mu = 0 at the mean


@pytest.mark.parametrize("D", DS)
@pytest.mark.parametrize("name", S.IDENTITIES)
def test_identity_is_proved(name, D):
    assert S.prove(D, name) is True


def _stated_by_hand(f, name):
    """Identity ``name`` as the table above states it: (left side, right side),
    built here from SymPy's Jacobians, not from lnorm.symbolic's residuals."""
    sym, D = f.sym, f.sym.D
    ones, eye = sp.ones(D, 1), sp.eye(D)
    J, N = f.y.jacobian(sym.x), f.xhat.jacobian(sym.x)
    g = sym.gamma.multiply_elementwise(sym.dy)
    if name == "closed_form":
        P = eye - ones * ones.T / D - f.xhat * f.xhat.T / D
        return J, sp.diag(*sym.gamma) * f.rstd * P
    if name == "symmetric":
        return N, N.T
    if name == "shift":
        return N * ones, sp.zeros(D, 1)
    if name == "scale":
        return N * f.xhat, f.rstd * sym.eps / (f.var + sym.eps) * f.xhat
    if name == "compact_vjp":
        mean_g = sum(g) / D
        mean_gxhat = sum(g.multiply_elementwise(f.xhat)) / D
        return J.T * sym.dy, f.rstd * (g - mean_g * ones - f.xhat * mean_gxhat)
    m = sp.Symbol("m", real=True)  # mean_path
    var_m = sum((xi - m) ** 2 for xi in sym.x) / D
    return sp.Matrix([sp.diff(var_m, m).subs(m, f.mu)]), sp.zeros(1, 1)


@pytest.mark.parametrize("name", S.IDENTITIES)
def test_each_identity_as_stated_holds_and_its_residual_states_something(name):
    # prove() can only be as good as the residual it expands: an identity
    # stated by hand here must hold, and the module's residual must not be a
    # zero that SymPy sees before any expansion (N - N, N * 0, ...).
    f = S.forward_exprs(3)
    left, right = _stated_by_hand(f, name)
    assert S.is_identically_zero(left - right, f)
    residual = S._residual(f, name)
    assert residual.shape == left.shape
    if name != "mean_path":  # at a concrete D its sum cancels on sight; the
        # derivative it evaluates is tested at and away from the mean below
        assert residual != sp.zeros(*residual.shape)


def test_prove_rejects_an_unknown_identity():
    with pytest.raises(ValueError, match="name must be one of"):
        S.prove(3, "antisymmetric")


@pytest.mark.parametrize("D", DS)
def test_mean_path_term_is_zero_only_at_the_mean(D):
    dvar_dm, at_mean = S.mean_path_term(D)
    assert at_mean == 0
    # From var(x, m) = sum((x_k - m)**2) / D: d var / d m = -(2/D) sum(x_k - m),
    # which is nonzero away from the mean: the cancellation is real.
    names = {s.name: s for s in dvar_dm.free_symbols}
    assert set(names) == {"m"} | {f"x_{k}" for k in range(1, D + 1)}
    m = names["m"]
    by_hand = -sp.Rational(2, D) * sum(names[f"x_{k}"] - m for k in range(1, D + 1))
    assert sp.expand(dvar_dm - by_hand) == 0
    assert dvar_dm.subs({names["x_1"]: m + 1}).subs(
        {names[f"x_{k}"]: m for k in range(2, D + 1)}
    ) == -sp.Rational(2, D)


def test_residuals_are_zero_matrices_of_the_right_shape():
    res = S.residuals(3)
    assert set(res) == set(S.IDENTITIES)
    shapes = {
        "closed_form": (3, 3),
        "symmetric": (3, 3),
        "shift": (3, 1),
        "scale": (3, 1),
        "compact_vjp": (3, 1),
        "mean_path": (1, 1),
    }
    for name, M in res.items():
        assert M.shape == shapes[name]
        assert M == sp.zeros(*shapes[name]), name


def test_normalization_jacobian_without_eps_would_kill_the_scale_direction():
    # With eps = 0, N xhat = 0: the scale direction is in the null space only then.
    f = S.forward_exprs(3)
    N = S.normalization_jacobian(3)
    eps0 = (N * f.xhat).xreplace({f.sym.eps: 0}).applyfunc(sp.simplify)
    assert eps0 == sp.zeros(3, 1)


# --- the prover can say no ------------------------------------------------------


@pytest.fixture(scope="module")
def f3():
    return S.forward_exprs(3)


def test_prover_rejects_a_closed_form_missing_the_xhat_term(f3):
    J = S.jacobian(3)
    D, g, r = 3, f3.sym.gamma, f3.rstd
    missing = sp.diag(*g) * r * (sp.eye(D) - sp.ones(D, D) / D)
    assert not S.is_identically_zero(J - missing, f3)


def test_prover_rejects_a_closed_form_with_the_wrong_sign(f3):
    J = S.jacobian(3)
    D, g, r, xh = 3, f3.sym.gamma, f3.rstd, f3.xhat
    flipped = sp.diag(*g) * r * (sp.eye(D) - sp.ones(D, D) / D + xh * xh.T / D)
    assert not S.is_identically_zero(J - flipped, f3)


def test_prover_rejects_the_claim_that_xhat_is_in_the_null_space(f3):
    N = S.normalization_jacobian(3)
    assert not S.is_identically_zero(N * f3.xhat, f3)
    assert not S.is_identically_zero(N, f3)


def test_compact_jacobian_entries():
    C = S.compact_jacobian(3)
    g1, g2 = sp.symbols("gamma_1 gamma_2", real=True)
    r = sp.Symbol("rstd", positive=True)
    x1, x2 = sp.symbols("xhat_1 xhat_2", real=True)
    assert sp.expand(C[0, 0] - g1 * r * (1 - sp.Rational(1, 3) - x1**2 / 3)) == 0
    assert sp.expand(C[1, 0] - g2 * r * (-sp.Rational(1, 3) - x1 * x2 / 3)) == 0


# --- numbers: symbolic VJP against lnorm.backward ----------------------------


def _random_problem(D, rows=3, seed=0):
    rng = np.random.default_rng(seed + D)
    x = rng.normal(loc=0.7, scale=1.3, size=(rows, D))
    gamma = rng.normal(size=D)
    beta = rng.normal(size=D)
    dy = rng.normal(size=(rows, D))
    eps = float(rng.uniform(1e-3, 0.3))  # large enough that eps matters
    return x, gamma, beta, dy, eps


@pytest.mark.parametrize("D", DS)
def test_lnorm_backward_matches_symbolic_vjp(D):
    x, gamma, beta, dy, eps = _random_problem(D)
    dx_ref, dgamma_ref, dbeta_ref = S.evaluate_vjp(x, gamma, dy, eps)
    _, cache = lnorm.forward(x, gamma, beta, eps)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    assert dx.shape == x.shape and dgamma.shape == (D,) and dbeta.shape == (D,)
    np.testing.assert_allclose(dx, dx_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dgamma, dgamma_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dbeta, dbeta_ref, rtol=0, atol=1e-12)


def test_lnorm_backward_matches_symbolic_vjp_for_3d_input():
    rng = np.random.default_rng(7)
    D = 4
    x = rng.normal(size=(2, 3, D))
    dy = rng.normal(size=(2, 3, D))
    gamma, beta = rng.normal(size=D), rng.normal(size=D)
    dx_ref, dgamma_ref, dbeta_ref = S.evaluate_vjp(x, gamma, dy, 1e-2)
    dx, dgamma, dbeta = lnorm.backward(dy, lnorm.forward(x, gamma, beta, 1e-2)[1])
    np.testing.assert_allclose(dx, dx_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dgamma, dgamma_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dbeta, dbeta_ref, rtol=0, atol=1e-12)


def test_evaluate_vjp_matches_an_independent_hand_evaluation():
    # D = 2 has a short answer: x - mu = +-d/2 with d = x1 - x2, var = d^2/4,
    # and the compact formula reduces to dx1 = -dx2 = rstd^3 * eps * (g1 - g2) / 2.
    x = np.array([[0.5, -1.5]])
    gamma = np.array([2.0, -0.5])
    dy = np.array([[0.25, 1.0]])
    eps = 0.5
    var = 1.0  # (x1 - x2)^2 / 4
    rstd = 1.0 / np.sqrt(var + eps)
    g = gamma * dy[0]
    expected_dx1 = rstd**3 * eps * (g[0] - g[1]) / 2
    dx, dgamma, dbeta = S.evaluate_vjp(x, gamma, dy, eps)
    np.testing.assert_allclose(dx[0], [expected_dx1, -expected_dx1], rtol=1e-14, atol=0)
    np.testing.assert_allclose(dgamma, dy[0] * np.array([1.0, -1.0]) * rstd, rtol=1e-14)
    np.testing.assert_allclose(dbeta, dy[0], rtol=0, atol=0)


# --- the NumPy closed form against SymPy's Jacobian -------------------------


@pytest.mark.parametrize("D", DS)
def test_numpy_jacobian_equals_sympy_jacobian_evaluated(D):
    x, gamma, beta, _, eps = _random_problem(D, rows=2)
    J_sym = S.jacobian(D)
    sym = S.symbols(D)
    J_np = S.jacobian_numpy(lnorm.forward(x, gamma, beta, eps)[1])
    assert J_np.shape == (2, D, D)
    for r in range(2):
        J_ref = S.evaluate(J_sym, sym, x=x[r], gamma=gamma, eps=eps)
        np.testing.assert_allclose(J_np[r], J_ref, rtol=0, atol=1e-12)


def test_numpy_jacobian_structure():
    rng = np.random.default_rng(3)
    D, eps = 8, 1e-5
    x = rng.normal(size=(5, D))
    _, cache = lnorm.forward(x, np.ones(D), np.zeros(D), eps)
    N = S.jacobian_numpy(cache)  # gamma = 1: the normalization Jacobian
    np.testing.assert_allclose(N, np.swapaxes(N, -1, -2), rtol=0, atol=1e-14)
    np.testing.assert_allclose(N @ np.ones(D), 0.0, atol=1e-13)
    var = x.var(axis=-1)
    rstd = 1.0 / np.sqrt(var + eps)
    expected = (rstd * eps / (var + eps))[:, None] * cache.xhat
    np.testing.assert_allclose(
        np.einsum("rij,rj->ri", N, cache.xhat), expected, rtol=1e-6, atol=1e-12
    )


def test_backward_via_jacobian_matches_lnorm_backward_on_bt_d():
    rng = np.random.default_rng(11)
    B, T, D = 2, 5, 16
    x = rng.normal(size=(B, T, D))
    gamma, beta = rng.normal(size=D), rng.normal(size=D)
    dy = rng.normal(size=(B, T, D))
    _, cache = lnorm.forward(x, gamma, beta)
    naive = S.backward_via_jacobian(dy, cache)
    compact = lnorm.backward(dy, cache)
    for a, b in zip(naive, compact):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# --- input checks --------------------------------------------------------------


def test_bad_D_is_rejected():
    with pytest.raises(ValueError, match="D must be >= 1"):
        S.symbols(0)
    with pytest.raises(TypeError, match="D must be an int"):
        S.jacobian(2.0)


def test_evaluate_vjp_rejects_bad_shapes_and_does_not_modify_inputs():
    x = np.arange(6.0).reshape(2, 3)
    gamma = np.ones(3)
    dy = np.ones((2, 3))
    with pytest.raises(ValueError, match="dy must have the shape of x"):
        S.evaluate_vjp(x, gamma, np.ones((2, 2)))
    with pytest.raises(ValueError, match="gamma must have shape"):
        S.evaluate_vjp(x, np.ones(2), dy)
    with pytest.raises(ValueError, match="eps must be finite and > 0"):
        S.evaluate_vjp(x, gamma, dy, eps=0.0)
    x0 = x.copy()
    S.evaluate_vjp(x, gamma, dy)
    np.testing.assert_array_equal(x, x0)


def test_numpy_routes_reject_a_foreign_cache():
    with pytest.raises(TypeError, match="LayerNormCache"):
        S.jacobian_numpy(np.ones((2, 3)))
    _, cache = lnorm.forward(np.ones((2, 3)) * np.arange(3.0), np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="dy must have the shape of x"):
        S.backward_via_jacobian(np.ones((3, 3)), cache)


def test_latex_uses_book_notation():
    out = S.latex(S.compact_jacobian(2)[0, 0] + S.symbols(2).eps)
    assert (
        r"\operatorname{rstd}" in out
        and r"\varepsilon" in out
        and r"\hat{x}_{1}" in out
    )


def test_evaluate_refuses_arrays_of_the_wrong_length():
    f = S.forward_exprs(2)
    assert float(S.evaluate(f.mu, f.sym, x=[1.0, 3.0], gamma=[1.0, 1.0],
                            eps=1e-5)) == 2.0
    for kw in (dict(x=[1.0, 3.0, 5.0], gamma=[1.0, 1.0]),
               dict(x=[1.0], gamma=[1.0, 1.0]),
               dict(x=[1.0, 3.0], gamma=[1.0, 1.0, 1.0])):
        with pytest.raises(ValueError, match="rows of D = 2"):
            S.evaluate(f.mu, f.sym, eps=1e-5, **kw)
