r"""Property-based tests (Hypothesis) of the three implementations of layer norm.

* ``default``: :func:`lnorm.forward` / :func:`lnorm.backward` as called
  (the fused Numba loops of :mod:`lnorm.fused`);
* ``blocks``: the same with ``block_rows=b`` (the NumPy formula of
  :mod:`lnorm.core` on blocks of ``b`` rows);
* ``gpu-emulation``: :func:`lnorm.gpu.emulate.forward` / ``backward``, the
  float32 arithmetic of the CUDA kernels (float32 and float16 only).

Every example is drawn from :func:`conftest.make_inputs`: shapes with up to
four leading axes (zero rows and ``D = 1`` included), every supported dtype,
row offsets up to ``1e6`` times the spread, spreads from ``1e-3`` to ``1e3``,
``eps`` from ``1e-12`` to ``1``, and (for the non-finite test) rows with NaN
or Inf. The invariants:

1. each row of ``dx`` sums to zero;
2. ``sum(dx * xhat) = D rstd mean(g xhat) eps rstd**2`` per row (zero as
   ``eps -> 0``);
3. ``y`` and ``dx`` agree with the chain rule of ``tests/reference.py`` in
   float64 on the same stored values;
4. ``dgamma`` and ``dbeta`` agree with their float64 sums;
5. no input is modified;
6. a NaN or Inf stays in its row;
7. C-ordered, Fortran-ordered and strided inputs give the same bits.

Error bounds
------------
Notation, per row: ``u_w`` the unit roundoff of the arithmetic (``2**-53``
on the CPU, ``2**-24`` in the GPU emulation), ``u_o`` that of the output
dtype, ``g = gamma * dy``, ``G = max|g|``, ``rstd`` and ``xhat`` the float64
reference ones, ``X = max|xhat|``, ``M = max|x|``, and the scale of ``dx``::

    S = rstd * G.

Two facts of exact arithmetic bound the sizes: ``mean(xhat**2) = var /
(var + eps) = rho <= 1``, so ``mean|xhat| <= 1`` and ``|mean(g xhat)| <= G``;
and every term of ``dx_j = rstd (g_j - mean(g) - xhat_j mean(g xhat))`` is
at most ``S``, ``S`` and ``S |xhat_j|``, so ``|dx_j| <= S (2 + |xhat_j|)``.

The implementations' errors (first order, worst case; :class:`ErrorModel`):

* ``h``, the error of the ``xhat`` the backward uses, in units of ``xhat``.
  CPU (float64 statistics): the float64 mean of the row is off by at most
  ``(D + 1) u64 M`` (a ``D``-term sum and a division), which shifts every
  ``xhat`` by ``c = (D + 1) u64 M rstd``; ``x - mean`` and ``* rstd`` round
  twice more; ``rstd`` is off by ``r = (D + 4) u64 + c**2 / 2`` relative
  (the variance is a ``D``-term sum; the shifted mean adds ``c**2`` to
  ``var / (var + eps)``); then ``xhat`` is stored in the input dtype
  (``u_o``, float16 rounded twice, via float32: ``u_o (1 + 2**-12)``). So
  ``h = c + (r + 2 u64) X + u_o X + tiny``.
  GPU (float32, summation depth ``k`` of the launch plan): ``mean_hi`` is off
  by ``(k + 1) u32 M``, i.e. ``shift = (k + 1) u32 M rstd`` in units of
  ``xhat``; ``mean_lo`` corrects it to ``(k + 2) u32 (1 + shift)`` (a
  ``k``-deep sum of ``|x - mean_hi| <= |x - mean| + |mean - mean_hi|`` and a
  division), and the two subtractions round: ``h0 = (k + 3)(1 + shift) u32 +
  2 u32 X``; ``rstd`` from a ``k``-deep sum of ``d**2``: ``r = h0 + (k/2 + 4)
  u32``; ``h = h0 + (r + 2 u32) X``. (Nothing grows with the offset but the
  second-order ``shift``: that is what the corrected mean buys.)
* ``w``, the error of the row means ``mean(g)`` and ``mean(g xhat)``
  relative to ``G``: ``(D + 1) u64`` on the CPU, ``(k + 2) u32`` on the GPU.
* each ``dx_j`` takes at most five roundings of terms of size ``<= S (2 +
  |xhat_j|)`` (``u_w`` each), and one to the output dtype (``u_o``).

Propagated through ``dx`` (an error ``eta`` in ``xhat`` moves ``dx_j /
rstd`` by ``eta_j m2 + xhat_j mean(g eta) + ...``, at most ``G h (1 +
|xhat_j| + h)``), and adding the float64 reference's own errors (the same
analysis without the rounding to a storage dtype: ``h64``, ``r64``, and
``(2 D + 4) u64`` for its sums), the element-wise bound of invariant 3 is::

    |dx_j - dx_ref_j| <= S [(h + h64)(1 + |xhat_j| + h)
                            + (w + (2D + 4) u64)(1 + |xhat_j|)
                            + (5 u_w + u_o + r + r64 + 8 u64)(2 + |xhat_j|)] + 2 tiny

and the others follow in their tests. With ``u_w = u64`` and ``u_o`` the
float16 or float32 roundoff, the bound is a few ``u_o`` times ``S (2 +
|xhat_j|)``: a wrong term (a sign flip, a missing ``1/D``) moves ``dx`` by
order ``S`` and fails it. Checked by hand on deliberately broken copies: a
flipped sign of ``mean(g)`` or of ``xhat mean(g xhat)``, ``mean(g xhat)``
without its ``1/D``, ``dgamma = sum(dy)``, a forward without ``eps``, and in
the GPU emulation ``mean_lo`` added instead of subtracted or left out: each
fails at least one of invariants 1 to 4 within the default 100 examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import layouts, make_inputs
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from reference import chain_rule_backward, chain_rule_forward

import lnorm
from lnorm import fused
from lnorm.gpu import check as gpu_check
from lnorm.gpu import emulate, kernels

U64 = 2.0**-53
U32 = 2.0**-24
UNIT_ROUNDOFF = {
    np.dtype(np.float16): 2.0**-11,
    np.dtype(np.float32): U32,
    np.dtype(np.float64): U64,
}
CPU_DTYPES = (np.float16, np.float32, np.float64)
GPU_DTYPES = (np.float16, np.float32)
IMPLS = ("default", "blocks", "gpu-emulation")
#: Invariants 5 and 6 break on almost any example with a row or two (a write
#: into an input, a bad value leaking into its neighbours): a quarter of the
#: profile's examples. The others keep them all: their faults may show only
#: at some sizes, dtypes and offsets (a layout-dependent float64 sum order
#: fails invariant 7 in about a third of runs of 25 examples, in every run of 100).
FEWER = settings(max_examples=max(10, settings.default.max_examples // 4))
#: float16 dx of a near-constant row with a tiny eps may overflow to Inf (a
#: correct rounding of a value above 65504): harmless where bits are compared.
OVERFLOW_OK = "ignore:overflow encountered in cast:RuntimeWarning"


# --- the examples ---------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One drawn example: everything :func:`conftest.make_inputs` and the call need."""

    shape: tuple[int, ...]
    dtype: type
    seed: int
    offset: float
    scale: float
    eps: float
    block_rows: int

    @property
    def D(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    def inputs(self):
        return make_inputs(self.shape, self.dtype, self.seed, self.offset, self.scale)


@st.composite
def cases(draw, dtypes=CPU_DTYPES) -> Case:
    lead = draw(st.lists(st.integers(0, 3), max_size=4), label="leading axes")
    D = draw(st.one_of(st.integers(1, 40), st.sampled_from([64, 129, 513])), label="D")
    dtype = draw(st.sampled_from(dtypes))
    scale = 10.0 ** draw(st.floats(-3, 3), label="log10 scale")
    ratio = draw(
        st.one_of(st.just(0.0), st.floats(-2, 6).map(lambda e: 10.0**e)),
        label="offset / scale",
    )
    offset = draw(st.sampled_from([1.0, -1.0])) * ratio * scale
    if dtype == np.float16:  # keep offset + 6 scale inside float16's range (65504)
        offset = float(np.clip(offset, -3e4, 3e4))
    eps = 10.0 ** draw(st.floats(-12, 0), label="log10 eps")
    seed = draw(st.integers(0, 2**32 - 1))
    block_rows = draw(st.integers(1, 8))
    return Case(tuple(lead) + (D,), dtype, seed, offset, scale, eps, block_rows)


def cases_for(impl: str):
    return cases(GPU_DTYPES if impl == "gpu-emulation" else CPU_DTYPES)


# --- the implementations, behind one signature ------------------------------------


def run(impl: str, x, gamma, beta, dy, eps: float, block_rows: int = 1) -> dict:
    """``y``, ``dx``, ``dgamma``, ``dbeta`` of one implementation."""
    if impl == "gpu-emulation":
        y, hi, lo, rstd = emulate.forward(x, gamma, beta, eps)
        dx, dgamma, dbeta = emulate.backward(dy, x, gamma, hi, lo, rstd)
    else:
        kw = {} if impl == "default" else {"block_rows": block_rows}
        y, cache = lnorm.forward(x, gamma, beta, eps, **kw)
        dx, dgamma, dbeta = lnorm.backward(dy, cache, **kw)
    return {"y": y, "dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def run_case(impl: str, case: Case, inputs=None) -> dict:
    x, gamma, beta, dy = case.inputs() if inputs is None else inputs
    return run(impl, x, gamma, beta, dy, case.eps, case.block_rows)


# --- the float64 reference and the error model ------------------------------------


def _row_max(a):
    return np.abs(a).max(axis=-1, keepdims=True, initial=0.0)


@dataclass
class Reference:
    """The chain rule of tests/reference.py in float64 on the stored values; row sizes.

    Per-row arrays have shape ``x.shape[:-1] + (1,)``.
    """

    y: np.ndarray
    dx: np.ndarray
    dgamma: np.ndarray
    dbeta: np.ndarray
    xhat: np.ndarray
    rstd: np.ndarray
    g: np.ndarray
    S: np.ndarray  # rstd * max|gamma * dy|
    X: np.ndarray  # max|xhat|
    M: np.ndarray  # max|x|

    @classmethod
    def of(cls, case: Case, inputs) -> "Reference":
        x, gamma, beta, dy = (a.astype(np.float64) for a in inputs)
        y, t = chain_rule_forward(x, gamma, beta, case.eps)
        dx, dgamma, dbeta = chain_rule_backward(dy, gamma, t, case.eps)
        g = gamma * dy
        rstd = np.broadcast_to(t["rstd"], x.shape[:-1] + (1,))
        return cls(
            y,
            dx,
            dgamma,
            dbeta,
            t["xhat"],
            rstd,
            g,
            rstd * _row_max(g),
            _row_max(t["xhat"]),
            _row_max(x),
        )


@dataclass
class ErrorModel:
    """First-order error bounds of one implementation (see the module docstring).

    ``h``: error of the ``xhat`` the backward uses, absolute, per row;
    ``r``: relative error of ``rstd``, per row; ``w``: relative error of the
    row means, relative to ``G``; ``u_w``: roundoff of the arithmetic;
    ``u_o``: of the rounding of ``y`` and ``dx`` to the output dtype;
    ``u_p``: of ``dgamma``/``dbeta`` to theirs; ``depth``: additions on the
    longest path of the sums over rows; ``tiny``: half the smallest subnormal
    step the results may be rounded to (absolute).
    """

    h: np.ndarray
    r: np.ndarray
    w: float
    u_w: float
    u_o: float
    u_p: float
    depth: int
    tiny: float

    @staticmethod
    def float64(ref: Reference, D: int, u_store: float = 0.0) -> "ErrorModel":
        """The CPU schedules (and the float64 reference itself, ``u_store = 0``)."""
        c = (D + 1) * U64 * ref.M * ref.rstd
        r = (D + 4) * U64 + c * c / 2
        h = c + (r + 2 * U64) * ref.X + u_store * ref.X
        return ErrorModel(
            h=h,
            r=r,
            w=(D + 1) * U64,
            u_w=U64,
            u_o=u_store,
            u_p=u_store,
            depth=0,
            tiny=0.0,
        )

    @classmethod
    def of(cls, impl: str, case: Case, ref: Reference) -> "ErrorModel":
        dtype = np.dtype(case.dtype)
        tiny = float(np.finfo(dtype).smallest_subnormal)
        if impl != "gpu-emulation":
            # float16 results are rounded twice, via float32
            u_o = UNIT_ROUNDOFF[dtype] * (1 + 2.0**-12)
            m = cls.float64(ref, case.D, u_store=u_o)
            m.h = m.h + tiny
            m.depth, m.tiny = case.rows, tiny
            return m
        k = gpu_check.summation_depth(kernels.plan(case.rows, case.D, dtype))
        shift = (k + 1) * U32 * ref.M * ref.rstd
        h0 = (k + 3) * (1 + shift) * U32 + 2 * U32 * ref.X
        r = h0 + (k / 2 + 4) * U32
        h = h0 + (r + 2 * U32) * ref.X + tiny
        u_o = UNIT_ROUNDOFF[dtype] if dtype == np.float16 else 0.0
        depth = case.rows + kernels.constants()["LN_REDUCE_SLICES"]
        return cls(
            h=h,
            r=r,
            w=(k + 2) * U32,
            u_w=U32,
            u_o=u_o,
            u_p=0.0,
            depth=depth,
            tiny=max(tiny, float(np.finfo(np.float32).smallest_subnormal)),
        )


def dx_bound(case: Case, ref: Reference, m: ErrorModel) -> np.ndarray:
    """Element-wise bound on ``|dx - dx_ref|`` (invariant 3, module docstring)."""
    D = case.D
    r64 = ErrorModel.float64(ref, D)
    ax = np.abs(ref.xhat)
    rounding = 5 * m.u_w + m.u_o + m.r + r64.r + 8 * U64
    return (
        ref.S
        * (
            (m.h + r64.h) * (1 + ax + m.h)
            + (m.w + (2 * D + 4) * U64) * (1 + ax)
            + rounding * (2 + ax)
        )
        + 2 * m.tiny
    )


def setup(impl: str, case: Case):
    """Inputs, results, reference and error model of one example.

    Examples whose exact results overflow the output dtype (float16 ``dx``
    of a near-constant row with a tiny ``eps`` can exceed 65504) are
    rejected: there the rounding is to infinity, not to the nearest.
    """
    inputs = case.inputs()
    ref = Reference.of(case, inputs)
    big = np.finfo(case.dtype).max / 2
    assume(np.all(np.abs(ref.dx) < big) and np.all(np.abs(ref.y) < big))
    m = ErrorModel.of(impl, case, ref)
    got = run_case(impl, case, inputs)
    for k in ("y", "dx"):
        assert got[k].shape == case.shape and got[k].dtype == np.dtype(case.dtype)
    note(
        f"rows={case.rows} D={case.D} max S={float(ref.S.max(initial=0)):.3g} "
        f"max M*rstd={float((ref.M * ref.rstd).max(initial=0)):.3g}"
    )
    return inputs, got, ref, m


def assert_within(name: str, got, want, bound):
    err = np.abs(np.asarray(got, np.float64) - want)
    ratio = err / np.maximum(bound, np.finfo(np.float64).tiny)
    worst = float(ratio.max(initial=0.0))
    assert np.all(err <= bound), (
        f"{name}: error {float(err.max()):.3g} exceeds its bound by {worst:.3g}x "
        f"at {np.unravel_index(int(np.argmax(ratio)), np.shape(ratio))}"
    )


# --- 1. dx sums to zero in every row ------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_dx_rows_sum_to_zero(impl, data):
    # In exact arithmetic, for the xhat' and row means the backward computed:
    #   sum_j dx_j = rstd' [D (mean(g) - mean(g)') - mean(g xhat')' sum_j xhat'_j],
    # with |mean(g) - mean(g)'| <= w G, |mean(g xhat')| <= G (1 + h) and
    # |sum_j xhat'_j| <= D h (the exact xhat sums to zero). Every dx_j also
    # takes five roundings of terms <= S (2 + |xhat_j|) and one to the output:
    #   |sum_j dx_j| <= S (1 + r) D (w + h (1 + h))
    #                   + (5 u_w + u_o) S sum_j (2 + |xhat_j|) + D tiny.
    case = data.draw(cases_for(impl))
    _, got, ref, m = setup(impl, case)
    D = case.D
    total = got["dx"].astype(np.float64).sum(-1, keepdims=True)
    ax = np.abs(ref.xhat)
    bound = (
        ref.S * (1 + m.r) * D * (m.w + m.h * (1 + m.h))
        + (5 * m.u_w + m.u_o) * ref.S * (2 + ax).sum(-1, keepdims=True)
        + D * m.tiny
    )
    assert_within("sum(dx)", total, 0.0, bound)


# --- 2. dx is orthogonal to xhat, up to the eps term --------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_dx_is_orthogonal_to_xhat_up_to_the_eps_term(impl, data):
    # Exact arithmetic: sum(xhat) = 0 and sum(xhat**2) = D rho with
    # rho = var / (var + eps) = 1 - eps rstd**2, so with m2 = mean(g xhat)
    #   sum_j dx_j xhat_j = rstd (D m2 - 0 - m2 D rho) = D rstd m2 eps rstd**2,
    # zero as eps -> 0 (scaling a row does not change y). Bound: the dx error of
    # invariant 3 weighted by |xhat_j|, plus the float64 reference's own xhat
    # error h64 weighting dx (|dx_j| <= S (2 + |xhat_j|)) and moving m2 (by <= G h64).
    case = data.draw(cases_for(impl))
    _, got, ref, m = setup(impl, case)
    D = case.D
    ax = np.abs(ref.xhat)
    h64 = ErrorModel.float64(ref, D).h
    m2 = (ref.g * ref.xhat).mean(-1, keepdims=True)
    expected = D * ref.rstd * m2 * case.eps * ref.rstd**2
    lhs = (got["dx"].astype(np.float64) * ref.xhat).sum(-1, keepdims=True)
    bound = (
        (dx_bound(case, ref, m) * ax).sum(-1, keepdims=True)
        + h64 * ref.S * (2 + ax).sum(-1, keepdims=True)
        + D * ref.S * h64
        + (D + 8) * U64 * np.abs(expected)
    )
    assert_within("sum(dx * xhat) - D rstd m2 eps rstd^2", lhs, expected, bound)


# --- 3. y and dx agree with the independent chain rule ------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_y_and_dx_agree_with_the_chain_rule(impl, data):
    # dx: the bound of the module docstring. y = gamma xhat + beta: the xhat
    # errors h (ours) and h64 (the reference's) times |gamma|, two roundings of
    # the affine step (u_w each, terms <= |gamma xhat| + |beta|), the rounding
    # of y to the output dtype.
    case = data.draw(cases_for(impl))
    inputs, got, ref, m = setup(impl, case)
    gamma, beta = (a.astype(np.float64) for a in inputs[1:3])
    h64 = ErrorModel.float64(ref, case.D).h
    affine = np.abs(gamma * ref.xhat) + np.abs(beta)
    y_bound = (
        np.abs(gamma) * (m.h + h64)
        + 2 * (m.u_w + U64) * affine
        + m.u_o * np.abs(ref.y)
        + 2 * m.tiny
    )
    assert_within("y", got["y"], ref.y, y_bound)
    assert_within("dx", got["dx"], ref.dx, dx_bound(case, ref, m))


# --- 4. dgamma and dbeta against float64 sums ---------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_dgamma_and_dbeta_agree_with_float64_sums(impl, data):
    # dgamma = sum over rows of dy xhat': each term off by |dy| (h + h64) (ours and
    # the reference's xhat), one product rounding and a sum over rows of depth
    # <= `depth` (u_w each; the reference's float64 sum: rows u64), relative to
    # sum |dy xhat|; then rounded to the parameters' dtype (u_p). dbeta the same
    # without the xhat and product terms.
    case = data.draw(cases_for(impl))
    inputs, got, ref, m = setup(impl, case)
    dy = inputs[3].astype(np.float64)
    lead = tuple(range(dy.ndim - 1))
    h64 = ErrorModel.float64(ref, case.D).h
    sum_w = (m.depth + 2) * m.u_w + (case.rows + 2) * U64
    dg_bound = (
        (np.abs(dy) * (m.h + h64)).sum(lead)
        + sum_w * np.abs(dy * ref.xhat).sum(lead)
        + m.u_p * np.abs(ref.dgamma)
        + 2 * m.tiny
    )
    db_bound = sum_w * np.abs(dy).sum(lead) + m.u_p * np.abs(ref.dbeta) + 2 * m.tiny
    for name in ("dgamma", "dbeta"):
        assert got[name].shape == (case.D,)
    assert_within("dgamma", got["dgamma"], ref.dgamma, dg_bound)
    assert_within("dbeta", got["dbeta"], ref.dbeta, db_bound)


# --- 5. no input is modified ---------------------------------------------------------


@pytest.mark.filterwarnings(OVERFLOW_OK)
@pytest.mark.parametrize("impl", IMPLS)
@FEWER
@given(data=st.data(), layout=st.sampled_from(["C", "F", "strided"]))
def test_no_input_is_modified(impl, data, layout):
    case = data.draw(cases_for(impl))
    x, gamma, beta, dy = case.inputs()
    x, dy = layouts(x)[layout], layouts(dy)[layout]
    arrays = (x, gamma, beta, dy)
    before = [a.tobytes() for a in arrays]
    # Read-only, an in-place write raises where it happens. Not for the fused
    # loops: Numba would compile a read-only variant of each for every dtype
    # (seconds each on a clean machine); the bytes below catch a write, and
    # tests/test_core.py and tests/test_fused.py pass them read-only arrays.
    if impl != "default":
        for a in arrays:
            a.setflags(write=False)
    run_case(impl, case, arrays)
    assert [a.tobytes() for a in arrays] == before


# --- 6. a NaN or Inf stays in its row -------------------------------------------------


@st.composite
def poisoned(draw, case: Case):
    """``{row: (tensor, column, value)}`` for some rows: NaN, +-Inf in x or dy."""
    if case.rows == 0:
        return {}
    rows = draw(st.sets(st.integers(0, case.rows - 1), min_size=1, max_size=3))
    return {
        r: (
            draw(st.sampled_from(["x", "dy"])),
            draw(st.integers(0, case.D - 1)),
            draw(st.sampled_from([np.nan, np.inf, -np.inf])),
        )
        for r in sorted(rows)
    }


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # GPU emulation
@pytest.mark.filterwarnings(OVERFLOW_OK)  # in the poisoned run; clean rows are finite
@pytest.mark.parametrize("impl", IMPLS)
@FEWER
@given(data=st.data())
def test_nonfinite_values_stay_in_their_row(impl, data):
    # A row with a NaN or Inf in x: its y and dx are non-finite everywhere (its
    # mean is); in dy: its dx is (mean(g) is). Every other row has the bits it
    # has without the bad values, finite.
    case = data.draw(cases_for(impl))
    bad = data.draw(poisoned(case))
    x, gamma, beta, dy = case.inputs()
    clean = run_case(impl, case, (x, gamma, beta, dy))
    assume(all(np.isfinite(clean[k]).all() for k in ("y", "dx")))  # see setup()
    x2, dy2 = x.reshape(-1, case.D).copy(), dy.reshape(-1, case.D).copy()
    for r, (tensor, col, value) in bad.items():
        (x2 if tensor == "x" else dy2)[r, col] = value
    x2, dy2 = x2.reshape(case.shape), dy2.reshape(case.shape)
    got = run_case(impl, case, (x2, gamma, beta, dy2))
    y, dx = got["y"].reshape(-1, case.D), got["dx"].reshape(-1, case.D)
    bad_x = [r for r, (tensor, _, _) in bad.items() if tensor == "x"]
    assert not np.isfinite(y[bad_x]).any()
    assert not np.isfinite(dx[sorted(bad)]).any()
    good = np.setdiff1d(np.arange(case.rows), sorted(bad))
    for k, a in (("y", y), ("dx", dx)):
        want = clean[k].reshape(-1, case.D)[good]
        assert a[good].tobytes() == want.tobytes(), f"{k}: a good row changed"


# --- 7. memory layout does not matter -------------------------------------------------


@pytest.mark.filterwarnings(OVERFLOW_OK)
@pytest.mark.parametrize("impl", ["default", "gpu-emulation", "blocks"])
@given(data=st.data())
def test_c_fortran_and_strided_inputs_give_the_same_bits(impl, data):
    case = data.draw(cases_for(impl))
    x, gamma, beta, dy = case.inputs()
    want = run_case(impl, case, (x, gamma, beta, dy))
    if impl == "default":  # lnorm.forward/backward without block_rows are lnorm.fused's
        y, cache = fused.forward(x, gamma, beta, case.eps)
        assert y.tobytes() == want["y"].tobytes()
        assert fused.backward(dy, cache)[0].tobytes() == want["dx"].tobytes()
    for layout in ("F", "strided"):
        params = [layouts(p)[layout] for p in (gamma, beta)]  # strided parameters too
        got = run_case(impl, case, (layouts(x)[layout], *params, layouts(dy)[layout]))
        for k in want:
            assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
            same = got[k].tobytes() == want[k].tobytes()
            assert same, f"{k} differs for {layout} inputs"


def test_blocks_forward_bits_do_not_depend_on_layout_or_block_size():
    # Blocks were once converted keeping their layout, so a Fortran-ordered
    # float64 row was summed in another order: last-bit differences.
    x, gamma, beta, _ = make_inputs((6, 64), np.float64)
    xf = np.asfortranarray(x)
    y, _ = lnorm.forward(x, gamma, beta, block_rows=2)
    y_f1, _ = lnorm.forward(xf, gamma, beta, block_rows=1)
    y_f2, _ = lnorm.forward(xf, gamma, beta, block_rows=2)
    assert y.tobytes() == y_f1.tobytes() == y_f2.tobytes()
