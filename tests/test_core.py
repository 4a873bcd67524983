"""Tests for lnorm.core: the compact backward against an independent chain rule,
finite differences, validation, degenerate rows, shapes, dtypes and accuracy."""

import dataclasses

import numpy as np
import pytest
from reference import (
    EPS,
    assert_within_rounding_of_terms,
    chain_rule_backward,
    chain_rule_forward,
    make_inputs,
    max_rel_err,
)

import lnorm
from lnorm.cache import LayerNormCache
from lnorm.core import backward, forward, tile_rows

# --- correctness ----------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (5, 16), (2, 3, 8), (2, 2, 3, 5), (4, 1024)])
def test_backward_matches_step_by_step_chain_rule(shape):
    x, gamma, beta, dy = make_inputs(shape, seed=sum(shape))
    y, cache = forward(x, gamma, beta, eps=EPS)
    dx, dgamma, dbeta = backward(dy, cache)

    y_ref, t = chain_rule_forward(x, gamma, beta)
    dx_ref, dgamma_ref, dbeta_ref = chain_rule_backward(dy, gamma, t)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dgamma, dgamma_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dbeta, dbeta_ref, rtol=1e-12, atol=1e-12)


def test_central_differences_of_all_three_gradients():
    # L = sum(dy * y): its gradient with respect to each input is what backward returns.
    x, gamma, beta, dy = make_inputs((2, 3, 4), seed=11)
    _, cache = forward(x, gamma, beta)
    grads = dict(zip(("x", "gamma", "beta"), backward(dy, cache)))
    args = dict(x=x, gamma=gamma, beta=beta)

    def loss(a):
        return float(np.sum(dy * forward(a["x"], a["gamma"], a["beta"])[0]))

    h = 1e-5
    for name, arr in args.items():
        numeric = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += h
            minus[idx] -= h
            numeric[idx] = (
                loss({**args, name: plus}) - loss({**args, name: minus})
            ) / (2 * h)
        err = max_rel_err(grads[name], numeric)
        assert err < 1e-8, f"d{name}: relative error {err:.2e}"


def test_gradient_of_shift_and_scale_directions():
    # Shifting a row leaves y unchanged, so <dx, 1> = 0 per row; and with eps = 0
    # scaling too, so <dx, x - mu> -> 0. With eps > 0 the latter is eps/(var+eps) small.
    x, gamma, beta, dy = make_inputs((6, 32), seed=3)
    _, cache = forward(x, gamma, beta, eps=1e-12)
    dx, _, _ = backward(dy, cache)
    np.testing.assert_allclose(dx.sum(-1), 0.0, atol=1e-12)
    xc = x - x.mean(-1, keepdims=True)
    np.testing.assert_allclose((dx * xc).sum(-1), 0.0, atol=1e-9)


# --- shapes and dtypes ------------------------------------------------------------


@pytest.mark.parametrize("shape", [(16,), (6, 16), (2, 3, 16), (2, 1, 3, 16)])
def test_leading_shapes_equal_the_flattened_rows(shape):
    x, gamma, beta, dy = make_inputs(shape, seed=5)
    y, cache = forward(x, gamma, beta)
    dx, dgamma, dbeta = backward(dy, cache)
    assert y.shape == dx.shape == shape
    assert dgamma.shape == dbeta.shape == (shape[-1],)
    assert cache.rstd.shape == shape[:-1]

    y2, cache2 = forward(x.reshape(-1, 16), gamma, beta)
    dx2, dgamma2, dbeta2 = backward(dy.reshape(-1, 16), cache2)
    # Same rows, same answer, up to the order a reduction over a different
    # shape happens to sum in.
    np.testing.assert_allclose(y.reshape(-1, 16), y2, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(dx.reshape(-1, 16), dx2, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(dgamma, dgamma2, rtol=1e-14)
    np.testing.assert_allclose(dbeta, dbeta2, rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_results_come_back_in_the_input_dtype(dtype):
    x, gamma, beta, dy = make_inputs((3, 4, 8), dtype=dtype, seed=2)
    y, cache = forward(x, gamma, beta)
    dx, dgamma, dbeta = backward(dy, cache)
    assert y.dtype == dx.dtype == dgamma.dtype == dbeta.dtype == np.dtype(dtype)
    assert cache.xhat.dtype == np.dtype(dtype)
    assert cache.rstd.dtype == np.float64  # statistics accumulate in float64


@pytest.mark.parametrize("block_rows", [None, 2])
def test_parameter_gradients_come_back_in_the_dtype_of_gamma(block_rows):
    # float16 rows with float64 parameters: dgamma and dbeta are rounded once,
    # to gamma's dtype, not to that of x.
    x, gamma, beta, dy = make_inputs((5, 8), np.float64, seed=12)
    x16, dy16 = x.astype(np.float16), dy.astype(np.float16)
    _, cache = forward(x16, gamma, beta, block_rows=block_rows)
    dx, dgamma, dbeta = backward(dy16, cache, block_rows=block_rows)
    assert dx.dtype == np.float16 and cache.gamma.dtype == np.float64
    assert dgamma.dtype == dbeta.dtype == np.float64
    _, t = chain_rule_forward(x16.astype(np.float64), gamma, beta)
    _, dgamma_ref, dbeta_ref = chain_rule_backward(dy16.astype(np.float64), gamma, t)
    # float64 sums of float16 xhat (stored with a rounding of 2**-11)
    assert max_rel_err(dgamma, dgamma_ref) < 2e-3
    assert max_rel_err(dbeta, dbeta_ref) < 1e-12


@pytest.mark.parametrize("dtype, tol", [(np.float16, 2e-3), (np.float32, 1e-6)])
def test_low_precision_matches_float64_on_the_same_values(dtype, tol):
    x, gamma, beta, dy = make_inputs((4, 256), dtype=dtype, seed=8)
    y, cache = forward(x, gamma, beta)
    dx, dgamma, dbeta = backward(dy, cache)
    up = [a.astype(np.float64) for a in (x, gamma, beta, dy)]
    y_ref, t = chain_rule_forward(*up[:3])
    dx_ref, dgamma_ref, dbeta_ref = chain_rule_backward(up[3], up[1], t)
    assert max_rel_err(y, y_ref) < tol
    assert max_rel_err(dx, dx_ref) < tol
    assert max_rel_err(dgamma, dgamma_ref) < tol
    assert max_rel_err(dbeta, dbeta_ref) < tol


def test_float32_stays_accurate_at_large_offset():
    # Rows with mean 1e4 and std 1: a float32 mean would carry an error of about
    # u32 * 1e4 ~ 6e-4 into every xhat. lnorm centres in float64.
    x, gamma, beta, dy = make_inputs(
        (8, 1024), dtype=np.float32, seed=9, loc=1e4, scale=1.0
    )
    y, cache = forward(x, gamma, beta)
    dx, dgamma, dbeta = backward(dy, cache)
    up = [a.astype(np.float64) for a in (x, gamma, beta, dy)]
    y_ref, t = chain_rule_forward(*up[:3])
    dx_ref, dgamma_ref, _ = chain_rule_backward(up[3], up[1], t)
    assert max_rel_err(dx, dx_ref) < 1e-6
    assert max_rel_err(y, y_ref) < 1e-6
    assert max_rel_err(dgamma, dgamma_ref) < 1e-6

    # The same computation with the mean and centring done in float32 is far worse:
    # the bound above is one that naive code fails.
    mean32 = x.mean(-1, keepdims=True, dtype=np.float32)
    xc32 = x - mean32
    xhat32 = xc32 / np.sqrt((xc32 * xc32).mean(-1, keepdims=True) + np.float32(EPS))
    assert max_rel_err(xhat32, t["xhat"]) > 1e-5


# --- degenerate rows ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_d_equals_one_gives_beta_and_zero_gradient(dtype):
    x = np.array([[3.0], [-1.5], [1e3]], dtype=dtype)
    gamma = np.array([2.0], dtype=dtype)
    beta = np.array([0.25], dtype=dtype)
    y, cache = forward(x, gamma, beta)
    assert np.array_equal(y, np.full_like(x, 0.25))
    dx, dgamma, dbeta = backward(np.array([[1.0], [2.0], [-3.0]], dtype=dtype), cache)
    assert np.array_equal(dx, np.zeros_like(x))
    assert np.array_equal(dgamma, np.zeros(1, dtype))
    assert np.array_equal(dbeta, np.array([0.0], dtype))


@pytest.mark.parametrize("value", [0.1, -3.7, 1000.5, 0.0, 1.0 / 3.0])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("D", [7, 4099])  # long rows: the mean's rounding grows
def test_constant_row_gives_xhat_zero_exactly(value, dtype, D):
    x = np.full((2, D), value, dtype=dtype)
    gamma = np.linspace(0.5, 2.0, D).astype(dtype)
    beta = np.linspace(-1.0, 1.0, D).astype(dtype)
    y, cache = forward(x, gamma, beta)
    assert np.array_equal(cache.xhat, np.zeros_like(x))
    assert np.array_equal(y, np.broadcast_to(beta, x.shape))
    assert np.all(cache.rstd == 1.0 / np.sqrt(EPS))
    # With xhat = 0 the backward reduces to rstd * (g - mean(g)): finite, and zero-sum.
    dy = np.ones_like(x)
    dx, _, _ = backward(dy, cache)
    g = gamma.astype(np.float64)
    expected = (g - g.mean()) / np.sqrt(EPS)
    tol = (1e-3 if dtype == np.float16 else 1e-6) * np.abs(expected).max()
    np.testing.assert_allclose(dx[0].astype(np.float64), expected, rtol=0, atol=tol)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8), (0, 0, 1)])
def test_zero_rows(shape):
    x = np.zeros(shape)
    D = shape[-1]
    y, cache = forward(x, np.ones(D), np.zeros(D))
    dx, dgamma, dbeta = backward(np.zeros(shape), cache)
    assert y.shape == dx.shape == shape
    assert cache.rstd.shape == shape[:-1]
    assert np.array_equal(dgamma, np.zeros(D)) and np.array_equal(dbeta, np.zeros(D))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_values_stay_in_their_row(bad):
    x, gamma, beta, dy = make_inputs((4, 16), seed=4)
    x_bad = x.copy()
    x_bad[1, 5] = bad
    y, cache = forward(x_bad, gamma, beta)
    dx, _, _ = backward(dy, cache)
    assert not np.isfinite(y[1]).all()
    good = [0, 2, 3]
    y_ref, cache_ref = forward(x[good], gamma, beta)
    dx_ref, _, _ = backward(dy[good], cache_ref)
    assert np.array_equal(y[good], y_ref)
    assert np.array_equal(dx[good], dx_ref)


# --- inputs are never modified; the cache is immutable ---------------------------


def test_inputs_are_not_modified():
    # float64: the one dtype whose gamma and beta reach the fused loops
    # uncopied (tests/test_fused.py passes read-only float16). Every read-only
    # dtype is a Numba compilation of seconds on a clean machine.
    x, gamma, beta, dy = make_inputs((3, 5, 8), dtype=np.float64, seed=6)
    originals = [a.copy() for a in (x, gamma, beta, dy)]
    for a in (x, gamma, beta, dy):
        a.setflags(write=False)  # any in-place write would now raise
    _, cache = forward(x, gamma, beta)
    backward(dy, cache)
    for a, orig in zip((x, gamma, beta, dy), originals):
        assert np.array_equal(a, orig)


def test_cache_is_frozen_and_does_not_alias_gamma():
    x, gamma, beta, _ = make_inputs((2, 4), seed=1)
    _, cache = forward(x, gamma, beta)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cache.rstd = None
    with pytest.raises(ValueError):
        cache.xhat[0, 0] = 1.0
    gamma[0] += 1.0  # the caller's array changes later; the cache must not
    assert cache.gamma[0] != gamma[0]
    assert set(f.name for f in dataclasses.fields(LayerNormCache)) == {
        "xhat",
        "rstd",
        "gamma",
    }


# --- bad input -----------------------------------------------------------------------


def test_public_api_is_reexported():
    assert lnorm.forward is forward and lnorm.backward is backward
    assert lnorm.LayerNormCache is LayerNormCache


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(gamma=np.ones(3)), ValueError, ["gamma", "(4,)"]),
        (dict(beta=np.ones((1, 4))), ValueError, ["beta", "(4,)"]),
        (
            dict(x=np.ones((2, 4), dtype=np.int64)),
            TypeError,
            ["x", "floating", "astype"],
        ),
        (dict(x=np.ones((2, 4), dtype=np.complex128)), TypeError, ["x", "floating"]),
        (dict(gamma=np.ones(4, dtype=np.int32)), TypeError, ["gamma", "floating"]),
        (dict(x=np.array(1.0)), ValueError, ["x", "0-d"]),
        (dict(x=np.ones((2, 0))), ValueError, ["D >= 1"]),
        (dict(eps=0.0), ValueError, ["eps", "> 0"]),
        (dict(eps=-1e-5), ValueError, ["eps", "> 0"]),
        (dict(eps=float("nan")), ValueError, ["eps", "finite"]),
        (dict(eps=float("inf")), ValueError, ["eps", "finite"]),
        (dict(eps="1e-5"), TypeError, ["eps"]),
        (dict(eps=True), TypeError, ["eps"]),
    ],
)
def test_forward_rejects_bad_input_with_a_clear_message(kwargs, exc, words):
    args = dict(x=np.ones((2, 4)), gamma=np.ones(4), beta=np.zeros(4), eps=1e-5)
    args.update(kwargs)
    with pytest.raises(exc) as info:
        forward(**args)
    for w in words:
        assert w in str(info.value)


def test_backward_rejects_bad_input_with_a_clear_message():
    _, cache = forward(np.ones((2, 4)), np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match=r"dy.*\(2, 4\).*\(4, 2\)"):
        backward(np.ones((4, 2)), cache)
    with pytest.raises(TypeError, match="dy.*floating"):
        backward(np.ones((2, 4), dtype=np.int64), cache)
    with pytest.raises(TypeError, match="cache.*LayerNormCache"):
        backward(np.ones((2, 4)), (cache.xhat, cache.rstd))
    # a cache from another forward whose shape does not match dy
    _, other = forward(np.ones((3, 4)), np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match="dy must have the shape of x"):
        backward(np.ones((2, 4)), other)


def test_array_likes_are_accepted():
    y, cache = forward([[1.0, 2.0, 4.0]], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    dx, dgamma, dbeta = backward([[1.0, 0.0, 0.0]], cache)
    assert y.shape == dx.shape == (1, 3) and y.dtype == dx.dtype == np.float64
    # By hand: mean 7/3, x - mean = (-4, -1, 5)/3, var = (16 + 1 + 25)/27 = 14/9.
    y_hand = np.array([[-4.0, -1.0, 5.0]]) / 3 / np.sqrt(14 / 9 + EPS)
    np.testing.assert_allclose(y, y_hand, rtol=1e-14, atol=0)
    # The gradients equal those of the same values given as arrays, by the
    # independent chain rule.
    x = np.array([[1.0, 2.0, 4.0]])
    _, t = chain_rule_forward(x, np.ones(3), np.zeros(3))
    dx_ref, dgamma_ref, dbeta_ref = chain_rule_backward(np.array([[1.0, 0, 0]]),
                                                        np.ones(3), t)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dgamma, dgamma_ref, rtol=1e-12, atol=1e-15)
    assert np.array_equal(dbeta, [1.0, 0.0, 0.0])


# --- the NumPy schedules (block_rows=): tiles of the formula --------------------

# (shape, block_rows): rows not a multiple of the block, one row, D = 1, zero rows,
# a block larger than the tensor, blocks of one row, three dimensions.
AWKWARD = [
    ((7, 5), 3),
    ((1, 9), 4),
    ((6, 1), 4),
    ((0, 4), 2),
    ((3, 8), 100),
    ((5, 6), 1),
    ((2, 3, 10), 4),
]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape, block_rows", AWKWARD)
def test_tiled_backward_equals_the_default_to_rounding(shape, block_rows, dtype):
    x, gamma, beta, dy = make_inputs(shape, dtype, seed=sum(shape) + block_rows)
    _, cache = forward(x, gamma, beta)
    ref = backward(dy, cache)
    tiled = backward(dy, cache, block_rows=block_rows)
    for a, b in zip(ref, tiled):
        assert a.shape == b.shape and a.dtype == b.dtype == np.dtype(dtype)
    # Both compute in float64 and round once: they may differ by float64 rounding
    # of the terms (sums associated differently), which can tip the final
    # rounding by one unit.
    D, rows = shape[-1], int(np.prod(shape[:-1]))
    u64 = np.finfo(np.float64).eps
    assert_within_rounding_of_terms(
        dy, cache, ref, tiled, dx_factor=8 * D * u64, param_factor=4 * (rows + D) * u64
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape, block_rows", AWKWARD)
def test_tiled_forward_is_the_same_for_every_block_size(shape, block_rows, dtype):
    x, gamma, beta, _ = make_inputs(shape, dtype, seed=len(shape) + block_rows)
    y1, cache1 = forward(x, gamma, beta, block_rows=1)
    y, cache = forward(x, gamma, beta, block_rows=block_rows)
    # Equal to each other, and right: within a few roundings of the dtype of
    # the chain rule in float64 (statistics in float64, one final rounding).
    y_ref, t = chain_rule_forward(*(a.astype(np.float64) for a in (x, gamma, beta)))
    u = np.finfo(dtype).eps
    for got, ref in ((y1, y_ref), (cache1.xhat, t["xhat"])):
        scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2 * u,
                                   atol=16 * u * scale)
    np.testing.assert_array_equal(y, y1)
    np.testing.assert_array_equal(cache.xhat, cache1.xhat)
    np.testing.assert_array_equal(cache.rstd, cache1.rstd)
    assert y.dtype == np.dtype(dtype) and cache.rstd.dtype == np.float64
    assert not cache.xhat.flags.writeable and not cache.rstd.flags.writeable


def test_tiled_backward_keeps_bad_rows_to_themselves():
    x, gamma, beta, dy = make_inputs((6, 8), np.float32, seed=11)
    dy[2, 3] = np.nan
    _, cache = forward(x, gamma, beta)
    dx, _, _ = backward(dy, cache)
    dx_t, _, _ = backward(dy, cache, block_rows=4)
    assert np.all(np.isnan(dx_t[2]))
    others = np.arange(6) != 2
    assert np.all(np.isfinite(dx_t[others]))
    np.testing.assert_allclose(dx_t[others], dx[others], rtol=1e-6, atol=1e-6)


def test_tiled_does_not_modify_inputs():
    x, gamma, beta, dy = make_inputs((5, 7), np.float32)
    copies = [a.copy() for a in (x, gamma, beta, dy)]
    for a in (x, gamma, beta, dy):
        a.setflags(write=False)  # any in-place write would now raise
    y, cache = forward(x, gamma, beta, block_rows=2)
    grads = backward(dy, cache, block_rows=2)
    # ... and the results are those of writable copies.
    y_c, cache_c = forward(*copies[:3], block_rows=2)
    grads_c = backward(copies[3], cache_c, block_rows=2)
    for got, want in zip((y, *grads), (y_c, *grads_c)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "bad, exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_block_rows_is_validated(bad, exc):
    x, gamma, beta, dy = make_inputs((4, 3), np.float64)
    _, cache = forward(x, gamma, beta)
    with pytest.raises(exc, match="block_rows"):
        backward(dy, cache, block_rows=bad)
    with pytest.raises(exc, match="block_rows"):
        forward(x, gamma, beta, block_rows=bad)


def test_tile_rows():
    # Six float64 block arrays of block_rows * D elements in a 4 MiB budget.
    assert tile_rows(1024) == 4 * 2**20 // (6 * 8 * 1024) == 85
    assert tile_rows(1024, direction="forward") == 4 * 2**20 // (4 * 8 * 1024) == 128
    assert tile_rows(1024, budget_bytes=2**20) == 21
    assert tile_rows(10**7) == 1  # never zero
    with pytest.raises(ValueError, match="D"):
        tile_rows(0)
    with pytest.raises(ValueError, match="direction"):
        tile_rows(8, direction="up")


# --- out= -------------------------------------------------------------------------


@pytest.mark.parametrize("block_rows", [None, 3])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_out_writes_the_same_values_into_the_given_arrays(block_rows, dtype):
    # Both schedules: the fused default and NumPy blocks.
    x, gamma, beta, dy = make_inputs((7, 12), dtype, seed=8)
    y_new, c_new = forward(x, gamma, beta, block_rows=block_rows)
    dx_new, dg_new, db_new = backward(dy, c_new, block_rows=block_rows)
    y_buf, xhat_buf, dx_buf = (np.full(x.shape, 9, dtype) for _ in range(3))
    y, c = forward(x, gamma, beta, block_rows=block_rows, out=(y_buf, xhat_buf))
    dx, dg, db = backward(dy, c, block_rows=block_rows, out=dx_buf)
    assert y is y_buf and dx is dx_buf and np.shares_memory(c.xhat, xhat_buf)
    assert not c.xhat.flags.writeable and xhat_buf.flags.writeable
    for a, b in [(y, y_new), (c.xhat, c_new.xhat), (c.rstd, c_new.rstd),
                 (dx, dx_new), (dg, dg_new), (db, db_new)]:
        assert np.array_equal(a, b)


@pytest.mark.parametrize("block_rows", [None, 3])
def test_out_is_checked_by_both_schedules(block_rows):
    x, gamma, beta, dy = make_inputs((4, 6), seed=9)
    with pytest.raises(ValueError, match="shares memory"):
        forward(x, gamma, beta, block_rows=block_rows, out=(x, np.empty_like(x)))
    with pytest.raises(TypeError, match="tuple"):
        forward(x, gamma, beta, block_rows=block_rows, out=np.empty_like(x))
    _, cache = forward(x, gamma, beta)
    with pytest.raises(ValueError, match="shape"):
        backward(dy, cache, block_rows=block_rows, out=np.empty((6, 4)))
    with pytest.raises(ValueError, match="shares memory"):
        backward(dy, cache, block_rows=block_rows, out=dy)
