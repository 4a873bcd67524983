"""Tests for lnorm.variance: the exact reference on hand-made rows, each floating
algorithm against it with bounds that tell them apart, agreement on benign data,
shapes, dtypes and validation."""

from fractions import Fraction

import numpy as np
import pytest

from lnorm import variance
from lnorm.finitediff import unit_roundoff
from lnorm.variance import (
    ALGORITHMS,
    RowStats,
    chan,
    condition_number,
    corrected_mean,
    corrected_two_pass,
    exact,
    exact_row,
    naive,
    two_pass,
    welford,
)

FLOATS = (np.float32, np.float64)
# Rows of D = 256 values are summed pairwise: the sums' error constant is log2(D) = 8.
D_SUM_FACTOR = 8


def rows_with_offset(offset, dtype, rows=16, D=256, seed=0):
    """Standard normal rows shifted by offset, rounded to dtype."""
    rng = np.random.default_rng(seed)
    return (offset + rng.standard_normal((rows, D))).astype(dtype)


def rel_var_err(stats, ref):
    """Worst relative error of the variance over the rows."""
    return float(np.max(np.abs(stats.var.astype(np.float64) - ref.var) / ref.var))


# --- exact: hand-made rows ----------------------------------------------------


@pytest.mark.parametrize(
    "row, mean, var",
    [
        ([1.0, 2.0, 3.0, 4.0], Fraction(5, 2), Fraction(5, 4)),
        ([0.0, 1.0, 1.0], Fraction(2, 3), Fraction(2, 9)),
        ([7.25], Fraction(29, 4), Fraction(0)),
        ([-3.5, -3.5, -3.5], Fraction(-7, 2), Fraction(0)),
        # Every float64 algorithm but the naive one gets this; the naive one returns 0.
        ([1e9 + 1, 1e9 - 1, 1e9 + 2, 1e9 - 2], Fraction(10**9), Fraction(5, 2)),
        # Two values: mean (a+b)/2, variance ((a-b)/2)^2, whatever their exponents.
        (
            [2.0**-1074, 2.0**1000],
            (Fraction(2) ** -1074 + Fraction(2) ** 1000) / 2,
            ((Fraction(2) ** 1000 - Fraction(2) ** -1074) / 2) ** 2,
        ),
        ([0.5, -0.25], Fraction(1, 8), Fraction(9, 64)),
    ],
)
def test_exact_row_on_hand_made_rows(row, mean, var):
    assert exact_row(np.array(row)) == (mean, var)


def test_exact_row_of_float16_and_float32_values_uses_their_exact_values():
    # 0.1 is not representable: the exact mean of [0.1, 0.1] is the stored value itself.
    for dtype in (np.float16, np.float32):
        v = dtype(0.1)
        m, s = exact_row(np.array([v, v], dtype=dtype))
        assert m == Fraction(float(v)) and m != Fraction(1, 10)
        assert s == 0


def test_exact_row_matches_the_definition_on_random_rows():
    # Definition: mean of squared deviations, in Fractions, one element at a time.
    rng = np.random.default_rng(1)
    for scale in (1e-300, 1e-3, 1.0, 1e200):
        row = scale * rng.standard_normal(17)
        fr = [Fraction(v) for v in row.tolist()]
        m = sum(fr) / len(fr)
        v = sum((f - m) ** 2 for f in fr) / len(fr)
        assert exact_row(row) == (m, v)


def test_exact_rounds_once_to_float64_for_every_row():
    x = np.array(
        [[[0.0, 1.0, 1.0], [1.0, 2.0, 4.0]], [[3.0, 3.0, 3.0], [0.1, 0.2, 0.7]]]
    )
    out = exact(x)
    assert isinstance(out, RowStats)
    assert out.mean.shape == out.var.shape == (2, 2)
    assert out.mean.dtype == out.var.dtype == np.float64
    assert (
        out.mean[0, 0] == 2 / 3 and out.var[0, 0] == 2 / 9
    )  # Python's int division rounds correctly
    assert out.mean[0, 1] == 7 / 3 and out.var[0, 1] == 14 / 9
    assert out.var[1, 0] == 0.0
    m, v = exact_row(x[1, 1])
    assert (out.mean[1, 1], out.var[1, 1]) == (float(m), float(v))


def test_condition_number_on_hand_made_rows():
    # [1, 2, 3, 4]: mean 5/2, var 5/4, kappa^2 = 1 + (25/4) / (5/4) = 6.
    stats = exact(
        np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 1.0, -1.0, 1.0], [3.0, 3.0, 3.0, 3.0]])
    )
    k = condition_number(stats)
    assert k.dtype == np.float64 and k.shape == (3,)
    assert k[0] == pytest.approx(np.sqrt(6.0), rel=1e-15)
    assert k[1] == 1.0  # centred at zero
    assert k[2] == np.inf  # constant row: no spread left to measure
    # Large offset: kappa ~ |mean| / std.
    big = condition_number(RowStats(np.array(-1e6), np.array(4.0)))
    assert big == pytest.approx(5e5, rel=1e-11)


# --- the floating algorithms against exact ------------------------------------


@pytest.mark.parametrize("dtype, offset", [(np.float32, 1e3), (np.float64, 1e6)])
def test_naive_fails_where_two_pass_passes(dtype, offset):
    x = rows_with_offset(offset, dtype)
    ref = exact(x)
    u = unit_roundoff(dtype)
    # u * kappa^2 is about 0.06 (float32) and 1e-4 (float64) here.
    assert rel_var_err(naive(x, dtype), ref) > 1e3 * u * np.median(
        condition_number(ref)
    )
    assert rel_var_err(two_pass(x, dtype), ref) <= 10 * u


@pytest.mark.parametrize("dtype", FLOATS)
def test_naive_error_grows_like_u_kappa_squared(dtype):
    u = unit_roundoff(dtype)
    for offset in (1e1, 1e2, 1e3):
        x = rows_with_offset(offset, dtype)
        ref = exact(x)
        k2u = u * np.max(condition_number(ref)) ** 2
        err = rel_var_err(naive(x, dtype), ref)
        assert err <= 4 * D_SUM_FACTOR * k2u + 4 * u
        assert err >= 0.05 * k2u


@pytest.mark.parametrize("dtype", FLOATS)
def test_two_pass_error_is_u_plus_u_kappa_squared(dtype):
    u = unit_roundoff(dtype)
    for offset in (0.0, 1e2, 1e4, 1e5):
        x = rows_with_offset(offset, dtype)
        ref = exact(x)
        k = np.max(condition_number(ref))
        assert rel_var_err(two_pass(x, dtype), ref) <= 10 * u + 100 * (u * k) ** 2


@pytest.mark.parametrize("dtype", FLOATS)
def test_welford_and_chan_stay_within_their_linear_in_kappa_bounds(dtype):
    u = unit_roundoff(dtype)
    D = 256
    for offset in (0.0, 1e2, 1e4):
        x = rows_with_offset(offset, dtype, D=D)
        ref = exact(x)
        k = np.max(condition_number(ref))
        assert (
            rel_var_err(welford(x, dtype), ref) <= D * u * k
        )  # Chan et al.: O(D u kappa)
        assert (
            rel_var_err(chan(x, dtype), ref) <= 2 * np.log2(D) * u * k
        )  # O(log2 D u kappa)


def test_welford_and_chan_beat_naive_by_orders_at_large_offset():
    x = rows_with_offset(1e3, np.float32)
    ref = exact(x)
    naive_err = rel_var_err(naive(x, np.float32), ref)
    for algorithm in (welford, chan):
        assert rel_var_err(algorithm(x, np.float32), ref) < naive_err / 100


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "loc, scale", [(0.0, 1.0), (3.0, 1.0), (0.0, 1e-3), (-2.0, 5.0)]
)
def test_welford_and_chan_equal_two_pass_to_a_few_ulps_on_benign_data(
    dtype, loc, scale
):
    rng = np.random.default_rng(2)
    x = rng.normal(loc, scale, (64, 256)).astype(dtype)
    ulp = float(np.finfo(dtype).eps)
    ref = two_pass(x, dtype)
    for algorithm, ulps in ((welford, 16), (chan, 4)):
        out = algorithm(x, dtype)
        var_ulps = np.abs(out.var.astype(np.float64) - ref.var) / ref.var / ulp
        size = np.abs(ref.mean.astype(np.float64)) + np.sqrt(ref.var.astype(np.float64))
        mean_ulps = np.abs(out.mean.astype(np.float64) - ref.mean) / size / ulp
        assert var_ulps.max() <= ulps, algorithm.__name__
        assert mean_ulps.max() <= ulps, algorithm.__name__


@pytest.mark.parametrize("D", [1, 2, 3, 5, 7, 13, 100, 257])
def test_chan_tree_handles_any_row_length(D):
    rng = np.random.default_rng(D)
    x = rng.normal(1.0, 2.0, (4, D))
    ref = exact(x)
    out = chan(x, np.float64)
    np.testing.assert_allclose(
        out.mean, ref.mean, rtol=8 * unit_roundoff(np.float64), atol=1e-15
    )
    np.testing.assert_allclose(
        out.var, ref.var, rtol=16 * unit_roundoff(np.float64), atol=0
    )


def test_only_naive_goes_negative():
    # float32 rows at 1e4 standard deviations: naive cancels to zero or below.
    x = rows_with_offset(1e4, np.float32, rows=64)
    assert (naive(x, np.float32).var < 0).any()
    for algorithm in (two_pass, welford, chan):
        assert (algorithm(x, np.float32).var >= 0).all(), algorithm.__name__


def test_float16_accumulation_overflows_and_upcasting_fixes_it():
    rng = np.random.default_rng(3)
    x = (10.0 * rng.standard_normal((4, 1024))).astype(
        np.float16
    )  # sum of squares ~ 1e5 > 65504
    ref = exact(x)
    with np.errstate(over="ignore", invalid="ignore"):
        for algorithm in (naive, two_pass):
            assert not np.isfinite(algorithm(x, np.float16).var).all()
    out = two_pass(x, np.float32)
    assert rel_var_err(out, ref) <= 10 * unit_roundoff(np.float32)


# --- shapes, dtypes, inputs ---------------------------------------------------


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_leading_axes_are_independent_rows(name):
    algorithm = ALGORITHMS[name]
    rng = np.random.default_rng(4)
    x = rng.normal(5.0, 2.0, (2, 3, 33))
    out = algorithm(x)
    assert out.mean.shape == out.var.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            one = algorithm(x[i, j])
            assert one.mean.shape == ()
            np.testing.assert_allclose(out.mean[i, j], one.mean, rtol=4e-16)
            np.testing.assert_allclose(out.var[i, j], one.var, rtol=4e-16)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_memory_layout_does_not_change_the_result(name):
    # A row of 4096 float16 ones: summed along a strided axis element by
    # element in float16, the running sum stalls at 2048 (its spacing there is
    # 2) and the mean comes out 0.5; summed along a contiguous row it is 1.
    algorithm = ALGORITHMS[name]
    x = np.ones((2, 4096), np.float16)
    for layout in (np.asfortranarray(x), np.ones((4096, 2), np.float16).T):
        out = algorithm(layout)
        np.testing.assert_array_equal(out.mean, [1.0, 1.0])
        np.testing.assert_array_equal(out.var, [0.0, 0.0])
    rng = np.random.default_rng(5)
    y = rng.normal(3.0, 1.0, (3, 1000)).astype(np.float32)
    c, f = algorithm(y), algorithm(np.asfortranarray(y))
    np.testing.assert_array_equal(c.mean, f.mean)
    np.testing.assert_array_equal(c.var, f.var)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_degenerate_shapes(name):
    algorithm = ALGORITHMS[name]
    one = algorithm(np.array([[2.5], [-1.0]]))
    np.testing.assert_array_equal(one.mean, [2.5, -1.0])
    np.testing.assert_array_equal(one.var, [0.0, 0.0])
    empty = algorithm(np.zeros((0, 5)))
    assert empty.mean.shape == empty.var.shape == (0,)


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("x_dtype", [np.float16, np.float32, np.float64])
def test_results_are_in_the_accumulation_dtype(name, x_dtype):
    algorithm = ALGORITHMS[name]
    x = np.linspace(-1, 1, 12, dtype=x_dtype).reshape(3, 4)
    assert algorithm(x).var.dtype == x_dtype  # default: the dtype of x
    for acc in (np.float16, np.float32, np.float64):
        out = algorithm(x, acc)
        assert out.mean.dtype == out.var.dtype == acc


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_inputs_are_not_modified(name):
    x = np.random.default_rng(5).normal(size=(3, 9))
    x.setflags(write=False)
    before = x.copy()
    ALGORITHMS[name](x, np.float32)
    exact(x)
    np.testing.assert_array_equal(x, before)


def test_array_likes_are_accepted():
    out = two_pass([[1.0, 2.0, 3.0]], np.float64)
    assert out.var[0] == pytest.approx(2 / 3, rel=1e-15)


# --- bad arguments ------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize(
    "x, dtype, exc, words",
    [
        (np.arange(6).reshape(2, 3), None, TypeError, "x must have a floating dtype"),
        (
            np.ones((2, 3)),
            np.int32,
            TypeError,
            "dtype must be float16, float32 or float64",
        ),
        (
            np.ones((2, 3)),
            "not-a-dtype",
            TypeError,
            "dtype must be float16, float32 or float64",
        ),
        (
            np.ones((2, 3)),
            np.complex128,
            TypeError,
            "dtype must be float16, float32 or float64",
        ),
        (np.float64(1.0), None, ValueError, "at least one dimension"),
        (np.ones((2, 0)), None, ValueError, "D >= 1"),
    ],
)
def test_bad_arguments_get_clear_errors(name, x, dtype, exc, words):
    with pytest.raises(exc, match=words):
        ALGORITHMS[name](x, dtype)


def test_exact_rejects_non_finite_values_and_bad_rows():
    with pytest.raises(ValueError, match="x must hold finite values"):
        exact(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="finite"):
        exact_row(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="one-dimensional"):
        exact_row(np.ones((2, 2)))
    with pytest.raises(TypeError, match="row must have a floating dtype"):
        exact_row(np.arange(3))


def test_module_exports():
    assert set(ALGORITHMS.values()) == {
        naive,
        two_pass,
        corrected_two_pass,
        welford,
        chan,
    }
    for name in variance.__all__:
        assert hasattr(variance, name)


# --- the corrected two-pass algorithm and the corrected mean -----------------------


@pytest.mark.parametrize("offset", [1e2, 1e4, 1e6])
def test_corrected_two_pass_is_flat_in_the_offset_in_float32(offset):
    # Two-pass loses (log2(D) u kappa)**2 to its mean's rounding; the corrected
    # algorithm subtracts that term and stays at a few log2(D) u.
    rng = np.random.default_rng(7)
    x = (offset + rng.standard_normal((32, 256))).astype(np.float32)
    ref = exact(x)
    u, L = 2.0**-24, np.log2(256)
    result = corrected_two_pass(x)
    corrected = result.var.astype(np.float64)
    err = np.abs(corrected - ref.var) / ref.var
    assert err.max() < 4 * L * u
    # Its mean, m_hi + m_lo, is one rounding of |mean| plus m_lo's own sum
    # (L u of the spread) away from the exact mean; m_hi alone is not.
    mean_err = np.abs(result.mean.astype(np.float64) - ref.mean)
    assert np.all(mean_err <= u * np.abs(ref.mean) + L * u * np.sqrt(ref.var))
    if offset >= 1e6:  # where (L u kappa)**2 far exceeds L u, two-pass is worse
        plain = two_pass(x).var.astype(np.float64)
        assert (np.abs(plain - ref.var) / ref.var).max() > 100 * err.max()


def test_corrected_two_pass_equals_chan_golub_leveque_formula():
    # (sum d^2 - (sum d)^2 / D) / D with d = x - m_hi: the same quantity.
    rng = np.random.default_rng(8)
    x = 1e3 + rng.standard_normal((5, 64))
    m_hi = x.mean(-1, keepdims=True)
    d = x - m_hi
    cgl = ((d * d).sum(-1) - d.sum(-1) ** 2 / 64) / 64
    np.testing.assert_allclose(corrected_two_pass(x).var, cgl, rtol=1e-12)


def test_corrected_mean_carries_the_error_of_the_first_mean():
    rng = np.random.default_rng(9)
    x = (1e5 + rng.standard_normal((16, 512))).astype(np.float32)
    ref = exact(x).mean
    m_hi, m_lo = corrected_mean(x)
    assert m_hi.shape == m_lo.shape == (16, 1) and m_hi.dtype == np.float32
    err_hi = np.abs(m_hi[:, 0].astype(np.float64) - ref)
    err_two = np.abs(m_hi[:, 0].astype(np.float64) + m_lo[:, 0] - ref)
    # m_hi alone is off by up to ulp-sized amounts of 1e5; the pair by far less.
    assert err_two.max() < 1e-3 * max(err_hi.max(), 2.0**-24 * 1e5)
    # And centring with the pair is as good as float64 centring, to float32.
    xhat_pair = (x - m_hi) - m_lo
    true_dev = x.astype(np.float64) - ref[:, None]
    assert np.abs(xhat_pair - true_dev).max() < 1e-5
