"""Tests for lnorm.cost (the traffic model, counted by hand here) and for the
tiled schedules of lnorm.core (equal to the plain ones to rounding)."""

import inspect

import numpy as np
import pytest

import lnorm
from lnorm import bench, cost
from lnorm.core import tile_rows

# A tiny problem where every byte can be counted by hand:
# rows = 2, D = 3, float32 (itemsize 4), per-row statistics in float64 (8).
# Full-size tensor: 2 * 3 * 4 = 24 B; row vector: 2 * 8 = 16 B; parameter: 3 * 4 = 12 B.
FULL, ROW, PARAM = 24, 16, 12
SMALL = dict(rows=2, D=3, itemsize=4, stat_itemsize=8)


# --- fused: each input read once, each output written once ------------------------

def test_fused_backward_counts():
    t = cost.traffic("backward", "fused", **SMALL)
    # reads dy, xhat (full), rstd (row), gamma (param); writes dx (full), dgamma, dbeta.
    assert t.bytes_read == 2 * FULL + ROW + PARAM == 76
    assert t.bytes_written == FULL + 2 * PARAM == 48
    assert t.bytes == 124
    assert t.passes == 3
    # Per element: g, dy*xhat, sum g, 2 for (dy*xhat)@gamma, u, t, v, dx, dgamma, dbeta = 11;
    # per row: the two divisions by D.
    assert t.flops == 11 * 6 + 2 * 2 == 70


@pytest.mark.parametrize(
    "saved, written, passes",
    [
        ("xhat_rstd", 2 * FULL + ROW, 3),  # y, xhat, rstd
        ("x_mean_rstd", FULL + 2 * ROW, 2),  # y, mean, rstd
        ("y_rstd", FULL + ROW, 2),  # y, rstd
    ],
)
def test_fused_forward_counts_depend_on_what_is_saved(saved, written, passes):
    t = cost.traffic("forward", "fused", saved=saved, **SMALL)
    assert t.bytes_read == FULL + 2 * PARAM  # x, gamma, beta
    assert t.bytes_written == written
    assert t.passes == passes
    # mean (1), x - mean, square, sum (3), scale by rstd, gamma *, + beta (3) per element;
    # per row: mean's /D, var's /D, + eps, sqrt, reciprocal.
    assert t.flops == 7 * 6 + 5 * 2 == 52


@pytest.mark.parametrize("saved, extra_read", [("x_mean_rstd", ROW), ("y_rstd", PARAM)])
def test_fused_backward_from_other_saved_tensors(saved, extra_read):
    t = cost.traffic("backward", "fused", saved=saved, **SMALL)
    # x (or y) replaces xhat; it also needs mean (a row vector) or beta (a parameter).
    assert t.bytes_read == 2 * FULL + ROW + PARAM + extra_read
    assert t.passes == 3
    # Recovering xhat costs two more operations per element.
    assert t.flops == 13 * 6 + 2 * 2


# --- numpy: one read per operand, one write per temporary --------------------------

def test_numpy_backward_counts():
    t = cost.traffic("backward", "numpy", **SMALL)
    # Reads of full-size tensors, step by step: g=dy*gamma (dy), dy*xhat (dy, xhat),
    # sum g (g), (dy*xhat)@gamma (dy_xhat), u=g-mean_g (g), t=xhat*m (xhat), v=u-t (u, t),
    # dx=rstd*v (v), dgamma (dy_xhat), dbeta (dy): 12. Writes: g, dy_xhat, u, t, v, dx: 6.
    # Row vectors read: mean_g, mean_gxhat, rstd; written: mean_g, mean_gxhat.
    # Parameters read: gamma twice; written: dgamma, dbeta.
    assert t.bytes_read == 12 * FULL + 3 * ROW + 2 * PARAM == 360
    assert t.bytes_written == 6 * FULL + 2 * ROW + 2 * PARAM == 200
    assert t.passes == 18


def test_numpy_forward_counts():
    t = cost.traffic("forward", "numpy", **SMALL)
    # Full reads: mean (x), x-mean (x), xc*xc (xc), mean (sq), xc*rstd (xc),
    # gamma*xhat (xhat), +beta (scaled): 7. Full writes: xc, sq, xhat, scaled, y: 5.
    # Rows: read mean, var, rstd; written mean, var, rstd. Params: gamma, beta read.
    assert t.bytes_read == 7 * FULL + 3 * ROW + 2 * PARAM == 240
    assert t.bytes_written == 5 * FULL + 3 * ROW == 168
    assert t.passes == 12


def test_numpy_backward_with_float64_working_copies():
    t = cost.traffic("backward", "numpy", work_itemsize=8, **SMALL)
    full64 = 2 * FULL
    # dy and xhat are converted (read 24, write 48 each); the 18 passes of the program
    # are then over 48-byte tensors; dx is converted back (read 48, write 24).
    assert t.bytes_read == 2 * FULL + (12 * full64 + 3 * ROW + 2 * PARAM) + full64 == 744
    assert t.bytes_written == 2 * full64 + (6 * full64 + 2 * ROW + 2 * PARAM) + FULL == 464
    assert t.passes == 18 + 3 * 2
    # Working in the input's own dtype converts nothing: the plain program.
    same = cost.traffic("backward", "numpy", work_itemsize=4, **SMALL)
    assert same == cost.traffic("backward", "numpy", **SMALL)
    assert same.passes == 18


# --- tiled: fused traffic plus per-block parameter traffic --------------------------

def test_tiled_one_block_is_fused():
    for direction in cost.DIRECTIONS:
        fused = cost.traffic(direction, "fused", **SMALL)
        assert cost.traffic(direction, "tiled", **SMALL) == fused
        assert cost.traffic(direction, "tiled", block_rows=5, **SMALL) == fused


def test_tiled_backward_per_block_overhead():
    # Two blocks of one row: the second re-reads gamma and reads + rewrites the
    # dgamma and dbeta partial sums.
    t = cost.traffic("backward", "tiled", block_rows=1, **SMALL)
    assert t.bytes_read == 76 + 3 * PARAM
    assert t.bytes_written == 48 + 2 * PARAM
    assert t.passes == 3


def test_flops_do_not_depend_on_the_schedule_and_bytes_do():
    big = dict(rows=4096, D=1024, itemsize=4)
    for direction in cost.DIRECTIONS:
        ts = {s: cost.traffic(direction, s, **big) for s in cost.SCHEDULES}
        assert len({t.flops for t in ts.values()}) == 1
        assert ts["numpy"].bytes > 3 * ts["fused"].bytes
        assert ts["fused"].arithmetic_intensity > 3 * ts["numpy"].arithmetic_intensity


def test_per_element_and_intensity():
    rows, D = 4096, 1024
    t = cost.traffic("backward", "fused", rows=rows, D=D, itemsize=4)  # stat_itemsize 4
    # 12 bytes per element (dy, xhat read, dx written) plus rstd, gamma, dgamma, dbeta.
    extra = rows * 4 + 3 * D * 4
    assert t.per_element() == pytest.approx(12 + extra / (rows * D), rel=1e-15)
    assert t.arithmetic_intensity == pytest.approx((11 * rows * D + 2 * rows) / t.bytes)
    with pytest.raises(ValueError, match="rows \\* D > 0"):
        cost.traffic("backward", "fused", rows=0, D=4, itemsize=4).per_element()


def test_zero_rows_moves_only_parameters():
    t = cost.traffic("backward", "numpy", rows=0, D=3, itemsize=4)
    assert t.flops == 0 and t.passes == 18
    assert t.bytes_read == 2 * 12 and t.bytes_written == 2 * 12  # gamma twice; dgamma, dbeta


# --- cache memory ---------------------------------------------------------------------

def test_cache_bytes():
    kw = dict(rows=2, D=3, itemsize=4, stat_itemsize=4)
    assert cost.cache_bytes("xhat_rstd", **kw) == 24 + 8
    assert cost.cache_bytes("x_mean_rstd", **kw) == 24 + 16
    assert cost.cache_bytes("y_rstd", **kw) == 24 + 8
    # x alive anyway (residual stream): keeping x costs two row vectors only,
    # while keeping xhat still costs a whole activation.
    assert cost.cache_bytes("x_mean_rstd", kept_alive={"x"}, **kw) == 16
    assert cost.cache_bytes("xhat_rstd", kept_alive={"x"}, **kw) == 32
    assert cost.cache_bytes("y_rstd", kept_alive={"y"}, **kw) == 8


# --- validation -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(direction="sideways"), ValueError, "direction"),
        (dict(schedule="magic"), ValueError, "schedule"),
        (dict(saved="x"), ValueError, "saved"),
        (dict(rows=-1), ValueError, "rows"),
        (dict(D=0), ValueError, "D"),
        (dict(itemsize=2.0), TypeError, "itemsize"),
        (dict(work_itemsize=8), ValueError, "work_itemsize"),
        (dict(block_rows=4), ValueError, "block_rows"),
    ],
)
def test_traffic_rejects_bad_arguments(kwargs, exc, match):
    args = dict(direction="backward", schedule="fused", rows=2, D=3, itemsize=4) | kwargs
    direction, schedule = args.pop("direction"), args.pop("schedule")
    with pytest.raises(exc, match=match):
        cost.traffic(direction, schedule, **args)


def test_cache_bytes_rejects_unknown_alive_tensor():
    with pytest.raises(ValueError, match="kept_alive"):
        cost.cache_bytes("x_mean_rstd", rows=2, D=3, itemsize=4, kept_alive={"xhat"})


# --- the model counts the code the benchmark runs ------------------------------------

def test_numpy_program_is_the_benchmark_reference():
    # The reference forward and backward are forward_formula and backward_formula on the rows.
    assert "forward_formula(" in inspect.getsource(bench.reference_forward)
    assert "backward_formula(" in inspect.getsource(bench.reference_backward)
    source = inspect.getsource(lnorm.core.forward_formula) + inspect.getsource(lnorm.core.backward_formula)
    for direction in cost.DIRECTIONS:
        for step in cost.numpy_program(direction):
            assert step.code in source, step.code


# --- tiled schedules in lnorm.core -------------------------------------------------------

# (shape, block_rows): rows not a multiple of the block, one row, D = 1, zero rows,
# a block larger than the tensor, blocks of one row, three dimensions.
AWKWARD = [((7, 5), 3), ((1, 9), 4), ((6, 1), 4), ((0, 4), 2), ((3, 8), 100), ((5, 6), 1), ((2, 3, 10), 4)]


def _dx_term_sizes(dy, cache):
    """Per element, the size of the terms dx is summed from, in float64:
    rstd * (|g| + mean|g| + |xhat| * mean|g * xhat|) with g = gamma * dy."""
    g = np.abs(dy.astype(np.float64) * cache.gamma)
    xh = np.abs(cache.xhat.astype(np.float64))
    return cache.rstd[..., None] * (g + g.mean(-1, keepdims=True)
                                    + xh * (g * xh).mean(-1, keepdims=True))


def _assert_within_rounding_of_terms(dy, cache, ref, got, dx_factor, param_factor):
    """``got`` = (dx, dgamma, dbeta) is within one unit in the last place of ``ref``
    plus ``dx_factor`` times the size of dx's terms and ``param_factor`` times the
    sums of |dy * xhat| and |dy| that dgamma and dbeta add up."""
    dx, dgamma, dbeta = ref
    ulp = np.spacing(np.abs(dx).astype(dx.dtype)).astype(np.float64)
    bound = ulp + dx_factor * _dx_term_sizes(dy, cache)
    assert np.all(np.abs(got[0].astype(np.float64) - dx) <= bound)
    lead = tuple(range(dy.ndim - 1))
    dy64 = dy.astype(np.float64)
    for r, g, terms in [(dgamma, got[1], np.abs(dy64 * cache.xhat).sum(lead)),
                        (dbeta, got[2], np.abs(dy64).sum(lead))]:
        ulp = np.spacing(np.abs(r)).astype(np.float64)
        assert np.all(np.abs(g.astype(np.float64) - r) <= ulp + param_factor * terms)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape, block_rows", AWKWARD)
def test_tiled_backward_equals_plain_to_rounding(shape, block_rows, dtype):
    x, gamma, beta, dy = bench.make_inputs(shape, dtype, seed=sum(shape) + block_rows)
    _, cache = lnorm.forward(x, gamma, beta)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    dx_t, dgamma_t, dbeta_t = lnorm.backward(dy, cache, block_rows=block_rows)
    for a, b in [(dx, dx_t), (dgamma, dgamma_t), (dbeta, dbeta_t)]:
        assert a.shape == b.shape and a.dtype == b.dtype == np.dtype(dtype)

    # Both compute in float64 and round once: they may differ by float64 rounding
    # of the terms (reassociated sums), which can tip the final rounding by one unit.
    D, rows = shape[-1], int(np.prod(shape[:-1]))
    u64 = np.finfo(np.float64).eps
    _assert_within_rounding_of_terms(dy, cache, (dx, dgamma, dbeta), (dx_t, dgamma_t, dbeta_t),
                                     dx_factor=8 * D * u64, param_factor=4 * (rows + D) * u64)


def test_tiled_backward_agrees_closely_on_a_large_float64_problem():
    x, gamma, beta, dy = bench.make_inputs((300, 64), np.float64, seed=3)
    _, cache = lnorm.forward(x, gamma, beta)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    dx_t, dgamma_t, dbeta_t = lnorm.backward(dy, cache, block_rows=7)
    assert np.max(np.abs(dx_t - dx)) <= 1e-14 * np.max(np.abs(dx))
    assert np.max(np.abs(dgamma_t - dgamma)) <= 1e-13 * np.max(np.abs(dgamma))
    assert np.max(np.abs(dbeta_t - dbeta)) <= 1e-13 * np.max(np.abs(dbeta))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape, block_rows", AWKWARD)
def test_tiled_forward_is_identical(shape, block_rows, dtype):
    x, gamma, beta, _ = bench.make_inputs(shape, dtype, seed=len(shape) + block_rows)
    y, cache = lnorm.forward(x, gamma, beta)
    y_t, cache_t = lnorm.forward(x, gamma, beta, block_rows=block_rows)
    np.testing.assert_array_equal(y_t, y)
    np.testing.assert_array_equal(cache_t.xhat, cache.xhat)
    np.testing.assert_array_equal(cache_t.rstd, cache.rstd)
    assert y_t.dtype == y.dtype and cache_t.rstd.dtype == np.float64
    assert not cache_t.xhat.flags.writeable and not cache_t.rstd.flags.writeable


def test_float64_work_keeps_what_float32_work_cancels():
    # dy = 1000 + small noise and gamma = 1: g - mean(g) cancels the 1000, so float32
    # arithmetic leaves an error of about u32 * 1000 * rstd in every dx, while
    # float64 arithmetic rounded once is good to float32's last bit. All start
    # from the same float32 cache (xhat, rstd).
    rng = np.random.default_rng(7)
    rows, D = 64, 256
    x = rng.normal(size=(rows, D)).astype(np.float32)
    gamma = np.ones(D, np.float32)
    beta = np.zeros(D, np.float32)
    dy = (1000.0 + 1e-2 * rng.normal(size=(rows, D))).astype(np.float32)
    _, cache = lnorm.forward(x, gamma, beta)
    xh, rstd, g = cache.xhat.astype(np.float64), cache.rstd[:, None], dy.astype(np.float64)
    exact = rstd * (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True))
    dx_t, _, _ = lnorm.backward(dy, cache, block_rows=16)
    saved32 = (cache.xhat, cache.rstd[:, None].astype(np.float32))
    dx_f32, _, _ = bench.reference_backward(dy, saved32, gamma)
    err_tiled = np.max(np.abs(dx_t - exact))
    err_f32 = np.max(np.abs(dx_f32 - exact))
    assert err_tiled <= np.max(np.spacing(np.abs(exact).astype(np.float32)))
    assert err_f32 > 100 * err_tiled
    # work_dtype=float32 is the reference's arithmetic: it loses the same digits,
    # within the documented u32 times the size of the terms (D of them per sum).
    u32 = np.finfo(np.float32).eps / 2
    terms = _dx_term_sizes(dy, cache)
    for block_rows in (None, 16):
        dx_w, _, _ = lnorm.backward(dy, cache, block_rows=block_rows, work_dtype=np.float32)
        err_w = np.max(np.abs(dx_w - exact))
        assert 100 * err_tiled < err_w <= (D + 4) * u32 * np.max(terms)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("block_rows", [None, 3, 1])
@pytest.mark.parametrize("shape", [(7, 5), (1, 9), (6, 1), (0, 4), (2, 3, 10), (40, 33)])
def test_float32_work_is_float32_rounding_of_the_terms(shape, block_rows, dtype):
    x, gamma, beta, dy = bench.make_inputs(shape, dtype, seed=sum(shape))
    _, cache = lnorm.forward(x, gamma, beta)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    dx_w, dgamma_w, dbeta_w = lnorm.backward(dy, cache, block_rows=block_rows, work_dtype=np.float32)
    for a, b in [(dx, dx_w), (dgamma, dgamma_w), (dbeta, dbeta_w)]:
        assert a.shape == b.shape and a.dtype == b.dtype == np.dtype(dtype)
    # Each dx is off by float32 rounding of its terms (each row sum of D of them
    # rounds up to D times), plus the final rounding to the input dtype.
    D, rows = shape[-1], int(np.prod(shape[:-1]))
    u32 = np.finfo(np.float32).eps / 2
    _assert_within_rounding_of_terms(dy, cache, (dx, dgamma, dbeta), (dx_w, dgamma_w, dbeta_w),
                                     dx_factor=(D + 4) * u32, param_factor=(rows + 4) * u32)


def test_float32_work_is_not_float64_work():
    # The option changes the arithmetic: on ordinary data the two differ, by about
    # float32 rounding, and float64 work named explicitly is the default, bit for bit.
    x, gamma, beta, dy = bench.make_inputs((64, 256), np.float32, seed=4)
    _, cache = lnorm.forward(x, gamma, beta)
    for block_rows in (None, 16):
        dx, dgamma, _ = lnorm.backward(dy, cache, block_rows=block_rows)
        dx64, dgamma64, _ = lnorm.backward(dy, cache, block_rows=block_rows, work_dtype=np.float64)
        np.testing.assert_array_equal(dx64, dx)
        np.testing.assert_array_equal(dgamma64, dgamma)
        dx32, _, _ = lnorm.backward(dy, cache, block_rows=block_rows, work_dtype="float32")
        rel = np.max(np.abs(dx32 - dx)) / np.max(np.abs(dx))
        assert 1e-9 < rel < 1e-5


def test_float32_work_keeps_bad_rows_to_themselves_and_inputs_unmodified():
    x, gamma, beta, dy = bench.make_inputs((6, 8), np.float32, seed=11)
    dy[2, 3] = np.nan
    _, cache = lnorm.forward(x, gamma, beta)
    copies = [a.copy() for a in (dy, cache.xhat, cache.rstd, cache.gamma)]
    dx, _, _ = lnorm.backward(dy, cache)
    dx_w, _, _ = lnorm.backward(dy, cache, block_rows=4, work_dtype=np.float32)
    assert np.all(np.isnan(dx_w[2]))
    others = np.arange(6) != 2
    np.testing.assert_allclose(dx_w[others], dx[others], rtol=1e-5, atol=1e-6)
    for a, c in zip((dy, cache.xhat, cache.rstd, cache.gamma), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("block_rows", [None, 2])
@pytest.mark.parametrize("work, dtype, exc, match", [
    (np.float32, np.float64, ValueError, "narrower than the float64 input"),
    (np.float16, np.float16, TypeError, "work_dtype must be"),
    ("int32", np.float32, TypeError, "work_dtype must be"),
    (np.complex128, np.float32, TypeError, "work_dtype must be"),
    (object(), np.float32, TypeError, "work_dtype must be"),
])
def test_work_dtype_is_validated(block_rows, work, dtype, exc, match):
    x, gamma, beta, dy = bench.make_inputs((4, 3), dtype)
    _, cache = lnorm.forward(x, gamma, beta)
    with pytest.raises(exc, match=match):
        lnorm.backward(dy, cache, block_rows=block_rows, work_dtype=work)


def test_tiled_backward_keeps_bad_rows_to_themselves():
    x, gamma, beta, dy = bench.make_inputs((6, 8), np.float32, seed=11)
    dy[2, 3] = np.nan
    _, cache = lnorm.forward(x, gamma, beta)
    dx, _, _ = lnorm.backward(dy, cache)
    dx_t, _, _ = lnorm.backward(dy, cache, block_rows=4)
    assert np.all(np.isnan(dx_t[2]))
    others = np.arange(6) != 2
    assert np.all(np.isfinite(dx_t[others]))
    np.testing.assert_allclose(dx_t[others], dx[others], rtol=1e-6, atol=1e-6)


def test_tiled_does_not_modify_inputs():
    x, gamma, beta, dy = bench.make_inputs((5, 7), np.float32)
    copies = [a.copy() for a in (x, gamma, beta, dy)]
    _, cache = lnorm.forward(x, gamma, beta, block_rows=2)
    lnorm.backward(dy, cache, block_rows=2)
    for a, c in zip((x, gamma, beta, dy), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)])
def test_block_rows_is_validated(bad, exc):
    x, gamma, beta, dy = bench.make_inputs((4, 3), np.float64)
    _, cache = lnorm.forward(x, gamma, beta)
    with pytest.raises(exc, match="block_rows"):
        lnorm.backward(dy, cache, block_rows=bad)
    with pytest.raises(exc, match="block_rows"):
        lnorm.forward(x, gamma, beta, block_rows=bad)


def test_tile_rows():
    # Four float64 planes of block_rows * D elements in a 4 MiB budget.
    assert tile_rows(1024) == 4 * 2**20 // (4 * 8 * 1024) == 128
    assert tile_rows(1024, budget_bytes=2**20) == 32
    assert tile_rows(10**7) == 1  # never zero
    with pytest.raises(ValueError, match="D"):
        tile_rows(0)
    with pytest.raises(ValueError, match="direction"):
        tile_rows(8, direction="up")
    # float32 planes are half the size: twice the rows in the same budget.
    assert tile_rows(1024, work_dtype=np.float32) == 4 * 2**20 // (4 * 4 * 1024) == 256
    with pytest.raises(ValueError, match="forward always works in float64"):
        tile_rows(8, direction="forward", work_dtype=np.float32)
    with pytest.raises(TypeError, match="work_dtype"):
        tile_rows(8, work_dtype=np.float16)
