"""Tests for lnorm.fused: the compiled loops equal the NumPy formula of lnorm.core
to rounding, on every awkward shape, dtype and memory layout; same checks and
errors; inputs untouched; dgamma/dbeta deterministic in the documented order;
NaN stays in its row; streaming stores and placement apart change nothing but
speed; out= gives the same bits in the caller's arrays; any number of threads
gives the same bits; float16 without F16C gives the same bits; float32 stays
accurate at large row offsets."""

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import numba as nb
import numpy as np
import pytest
from reference import (
    assert_within_rounding_of_terms,
    chain_rule_backward,
    chain_rule_forward,
    make_inputs,
    max_rel_err,
)

import lnorm
from lnorm import bench, fused

DTYPES = [np.float16, np.float32, np.float64]
# D = 1, one row, zero rows, odd D, rows across a dgamma block boundary, a long
# row, rows long enough to go in groups of four (with a block boundary and
# leftover rows), three leading axes.
SHAPES = [
    (5, 1),
    (1, 9),
    (0, 4),
    (7, 13),
    (fused.BLOCK_ROWS + 3, 6),
    (3, 1027),
    (fused.BLOCK_ROWS + 7, fused.GROUP_FROM_D),
    (2, 1, 3, 8),
]


def _layouts(a: np.ndarray):
    """The same values C-ordered, Fortran-ordered and as a strided view."""
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    wide[..., ::2] = a
    return {"C": a, "F": np.asfortranarray(a), "strided": wide[..., ::2]}


def _ulps(a, b, dtype):
    """Largest difference of a and b in units of the last place of dtype."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    spacing = np.spacing(np.maximum(np.abs(a), np.abs(b)).astype(dtype)).astype(
        np.float64
    )
    tiny = np.finfo(dtype).smallest_subnormal
    return float(np.max(np.abs(a - b) / np.maximum(spacing, tiny), initial=0.0))


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_equals_the_numpy_formula_to_rounding(shape, dtype, layout):
    x, gamma, beta, dy = make_inputs(shape, dtype, seed=len(shape) + shape[-1])
    x, dy = _layouts(x)[layout], _layouts(dy)[layout]
    y, cache = fused.forward(x, gamma, beta)
    y_np, cache_np = lnorm.forward(x, gamma, beta, block_rows=3)
    # Both forwards compute in float64 and round once: float16 and float32
    # results are at most one unit apart; float64 ones differ by the float64
    # rounding of the sums, at most a few D units of the row's largest value.
    assert y.dtype == cache.xhat.dtype == np.dtype(dtype) and y.shape == shape
    for a, b in [(y, y_np), (cache.xhat, cache_np.xhat)]:
        if dtype == np.float64:
            bound = (
                4 * shape[-1] * np.finfo(dtype).eps * np.abs(b).max(-1, keepdims=True)
            )
            assert np.all(np.abs(a - b) <= bound)
        else:
            assert _ulps(a, b, dtype) <= 1
    np.testing.assert_allclose(cache.rstd, cache_np.rstd, rtol=1e-14)

    ref = lnorm.backward(dy, cache, block_rows=3)
    got = fused.backward(dy, cache)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
    D, rows = shape[-1], int(np.prod(shape[:-1]))
    u64 = np.finfo(np.float64).eps
    assert_within_rounding_of_terms(
        dy, cache, ref, got, dx_factor=8 * D * u64, param_factor=4 * (rows + D) * u64
    )


def test_fused_float64_matches_the_chain_rule():
    x, gamma, beta, dy = make_inputs((fused.BLOCK_ROWS * 2 + 1, 64), seed=21)
    y, cache = fused.forward(x, gamma, beta)
    dx, dgamma, dbeta = fused.backward(dy, cache)
    y_ref, t = chain_rule_forward(x, gamma, beta)
    dx_ref, dgamma_ref, dbeta_ref = chain_rule_backward(dy, gamma, t)
    assert max_rel_err(y, y_ref) < 1e-14
    assert max_rel_err(dx, dx_ref) < 1e-13
    assert max_rel_err(dgamma, dgamma_ref) < 1e-13
    assert max_rel_err(dbeta, dbeta_ref) < 1e-13


@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4, 1e6])
def test_float32_is_accurate_to_1e7_at_large_row_offsets(offset):
    # dx within 1e-7 (max-norm relative) of float64 on the same float32 inputs,
    # at row offsets up to 1e6 standard deviations: the statistics and the
    # centring are float64, so the offset costs nothing.
    x, gamma, beta, dy = make_inputs(
        (16, 1024), np.float32, seed=5, loc=offset, scale=1.0
    )
    y, cache = fused.forward(x, gamma, beta)
    dx, dgamma, _ = fused.backward(dy, cache)
    up = [a.astype(np.float64) for a in (x, gamma, beta, dy)]
    y_ref, t = chain_rule_forward(*up[:3])
    dx_ref, dgamma_ref, _ = chain_rule_backward(up[3], up[1], t)
    assert max_rel_err(dx, dx_ref) < 1e-7
    assert max_rel_err(y, y_ref) < 1e-7
    assert max_rel_err(dgamma, dgamma_ref) < 1e-7


def test_dgamma_and_dbeta_are_the_same_bits_on_every_call():
    x, gamma, beta, dy = make_inputs(
        (3 * fused.BLOCK_ROWS + 17, 33), np.float32, seed=8
    )
    _, cache = fused.forward(x, gamma, beta)
    first = fused.backward(dy, cache)
    for _ in range(3):
        again = fused.backward(dy, cache)
        for a, b in zip(first, again):
            assert np.array_equal(a, b)


def _documented_blocks(rows: int, D: int) -> list[np.ndarray]:
    """The rows of each dgamma/dbeta block, in the order fused.py documents:
    chunk by chunk of CHUNK_ROWS rows, each grouped as a batch of its own."""
    if rows > fused.CHUNK_ROWS:
        return [block + c for c in range(0, rows, fused.CHUNK_ROWS)
                for block in _documented_blocks(min(fused.CHUNK_ROWS, rows - c), D)]
    if D < fused.GROUP_FROM_D:
        return [np.arange(b, min(b + fused.BLOCK_ROWS, rows))
                for b in range(0, rows, fused.BLOCK_ROWS)]
    quarter = rows // 4
    per_block = fused.BLOCK_ROWS // 4
    grouped = [
        np.concatenate([np.arange(q0, min(q0 + per_block, quarter)) + k * quarter
                        for k in range(4)])
        for q0 in range(0, quarter, per_block)
    ]
    rest = range(4 * quarter, rows, fused.BLOCK_ROWS)
    return grouped + [np.arange(b, min(b + fused.BLOCK_ROWS, rows)) for b in rest]


@pytest.mark.parametrize("rows", [2 * fused.BLOCK_ROWS + 5,
                                  fused.CHUNK_ROWS + fused.BLOCK_ROWS + 6])
@pytest.mark.parametrize("D", [16, fused.GROUP_FROM_D + 1])
def test_dgamma_is_summed_per_block_then_across_blocks(D, rows):
    # The documented order: float64 sums over each block, then block 0 +
    # block 1 + ... Short rows: blocks of BLOCK_ROWS neighbouring rows. Long
    # rows go in groups of four rows a quarter of the chunk apart, BLOCK_ROWS/4
    # groups per block, and the rows left over after them in blocks of their
    # own. More than CHUNK_ROWS rows: the same, chunk by chunk. Rebuilt here
    # with NumPy in float64.
    x, gamma, beta, dy = make_inputs((rows, D), np.float64, seed=9)
    _, cache = fused.forward(x, gamma, beta)
    _, dgamma, dbeta = fused.backward(dy, cache)
    p = dy * cache.xhat
    blocks = _documented_blocks(rows, D)
    assert sorted(np.concatenate(blocks)) == list(range(rows))
    assert len(blocks) == fused._chunked_block_count(rows, D)
    dgamma_ref = np.zeros(D)
    dbeta_ref = np.zeros(D)
    for block in blocks:
        dgamma_ref += p[block].sum(0)
        dbeta_ref += dy[block].sum(0)
    # The loop and NumPy associate the sums differently: they differ by
    # float64 rounding only.
    scale = np.abs(p).sum(0)
    assert np.all(np.abs(dgamma - dgamma_ref) <= 4 * rows * np.finfo(float).eps * scale)
    assert np.all(
        np.abs(dbeta - dbeta_ref) <= 4 * rows * np.finfo(float).eps * np.abs(dy).sum(0)
    )


@pytest.mark.parametrize("rows", [2 * fused.BLOCK_ROWS + 5,
                                  fused.CHUNK_ROWS + fused.BLOCK_ROWS + 6])
@pytest.mark.parametrize("D", [16, fused.GROUP_FROM_D + 1])
def test_each_block_of_dbeta_holds_the_documented_rows(D, rows):
    # The test above cannot see which rows share a block (any grouping gives
    # the same sum to rounding); this one can. dy is 1 in a row of block 0,
    # 2**-53 in two rows of block 1 and 0 elsewhere: block 1's sum is 2**-52
    # exactly, and 1 + 2**-52 is a float64. Had either small row gone into
    # block 0, 1 + 2**-53 would have rounded back to 1 (a tie, to even), and
    # the total would be 1. Exact whatever the order inside a block. The two
    # rows are block 1's first and last, so that no grouping of neighbouring
    # rows puts them in one group (which would add them first, exactly).
    blocks = _documented_blocks(rows, D)
    small = [min(blocks[1]), max(blocks[1])]
    x, gamma, beta, _ = make_inputs((rows, D), np.float64, seed=10)
    dy = np.zeros((rows, D))
    dy[blocks[0][0]] = 1.0
    dy[small] = 2.0**-53
    _, cache = fused.forward(x, gamma, beta)
    _, _, dbeta = fused.backward(dy, cache)
    assert np.all(dbeta == 1.0 + 2.0**-52)


def test_partial_sums_are_added_block_after_block_then_rounded_once():
    # 1 + 2**-53 + 2**-53: block after block, each addition is a tie that
    # rounds back to 1 (to even); the other way round the two small ones
    # make 2**-52 first, and it stays.
    partials = np.array([[1.0, 3.0], [2.0**-53, 0.5], [2.0**-53, 0.25]])
    total = np.empty(2)
    fused._sum_blocks(partials, total)
    assert total.tolist() == [1.0, 3.75]
    assert partials[::-1].sum(axis=0)[0] == 1.0 + 2.0**-52
    # float16 (as bits): 1 + 2**-11 + 2**-30 is just above the midpoint of 1
    # and 1 + 2**-10. Rounded once it goes up; through float32 (which drops
    # the 2**-30) it would be a tie and go to even, 1.
    half = np.empty(1, np.float16)
    fused._sum_blocks(np.array([[1.0], [2.0**-11], [2.0**-30]]), half.view(np.uint16))
    assert half[0] == np.float16(1 + 2.0**-10)
    assert np.float16(np.float32(1 + 2.0**-11 + 2.0**-30)) == 1


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("D", [fused.GROUP_FROM_D, fused.GROUP_FROM_D + 9, 2053])
def test_streaming_stores_give_the_same_bits(monkeypatch, dtype, D):
    # 23 rows: five groups of four (each row's dx streamed out after the
    # group's sums) and three rows one by one (plain stores); the forward
    # streams y and xhat row by row. Rows of odd length start at every
    # alignment, so the plain stores before and after the whole lines run.
    # (Shorter rows never stream.)
    x, gamma, beta, dy = make_inputs((23, D), dtype, seed=D)
    plain = fused.forward(x, gamma, beta)
    plain_b = fused.backward(dy, plain[1])
    assert not fused._streams(plain[0], D)
    monkeypatch.setattr(fused, "STREAM_BYTES", 0)
    assert fused._streams(plain[0], D)
    # Outputs that start one element past a line: C-ordered views one in.
    y_buf, xhat_buf, dx_buf = (np.zeros(23 * D + 1, dtype)[1:].reshape(23, D)
                               for _ in range(3))
    streamed = fused.forward(x, gamma, beta, out=(y_buf, xhat_buf))
    streamed_b = fused.backward(dy, streamed[1], out=dx_buf)
    assert np.array_equal(streamed[0], plain[0])
    assert np.array_equal(streamed[1].xhat, plain[1].xhat)
    for a, b in zip(streamed_b, plain_b):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("D", [5, 1027, fused.GROUP_FROM_D + 5])
def test_each_rows_results_are_its_own(D):
    # The backward takes rows in groups of four, and both loops carry a
    # row's statistics from one sweep to the next. Change every other row:
    # the rows kept must give the same bits as before.
    rows = 4 * 5 + 3  # five groups of four, and three rows one by one
    x, gamma, beta, dy = make_inputs((rows, D), np.float32, seed=D)
    y, cache = fused.forward(x, gamma, beta)
    dx, _, _ = fused.backward(dy, cache)
    kept = np.arange(rows) % 2 == 0
    x2, dy2 = x.copy(), dy.copy()
    noise = np.random.default_rng(D).standard_normal((2, rows, D)).astype(np.float32)
    x2[~kept] = 50 + 100 * noise[0, ~kept]
    dy2[~kept] = 10 * noise[1, ~kept]
    y2, cache2 = fused.forward(x2, gamma, beta)
    dx2, _, _ = fused.backward(dy2, cache2)
    assert not np.array_equal(cache2.rstd[~kept], cache.rstd[~kept])
    assert np.array_equal(cache2.rstd[kept], cache.rstd[kept])
    assert np.array_equal(y2[kept], y[kept])
    assert np.array_equal(cache2.xhat[kept], cache.xhat[kept])
    assert np.array_equal(dx2[kept], dx[kept])


@pytest.mark.parametrize("D", [16, fused.GROUP_FROM_D])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_values_stay_in_their_row(bad, D):
    # When D is long, rows 1 and 3 share a group of four with rows 5 and 7
    # (groups are rows q, q + 2, q + 4, q + 6 here; row 8 goes alone).
    x, gamma, beta, dy = make_inputs((9, D), np.float32, seed=4)
    x_bad = x.copy()
    x_bad[3, 5] = bad
    dy_bad = dy.copy()
    dy_bad[1, 2] = bad
    y, cache = fused.forward(x_bad, gamma, beta)
    dx, dgamma, dbeta = fused.backward(dy_bad, cache)
    assert not np.isfinite(y[3]).any() and not np.isfinite(dx[3]).any()
    assert not np.isfinite(dx[1]).any()
    good = [0, 2, 4, 5, 6, 7, 8]
    y_ref, cache_ref = fused.forward(x, gamma, beta)
    assert np.array_equal(y[good], y_ref[good])
    assert np.array_equal(dx[good], fused.backward(dy, cache_ref)[0][good])
    # The column sums see every row, so they are not finite.
    assert not np.isfinite(dbeta).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_degenerate_rows_are_exact(dtype):
    D = 9
    x = np.stack([np.full(D, 0.1), np.full(D, -3.7), np.arange(D, dtype=float)]).astype(
        dtype
    )
    gamma = np.linspace(0.5, 2.0, D).astype(dtype)
    beta = np.linspace(-1.0, 1.0, D).astype(dtype)
    y, cache = fused.forward(x, gamma, beta)
    assert np.array_equal(cache.xhat[:2], np.zeros((2, D), dtype))
    assert np.array_equal(y[:2], np.broadcast_to(beta, (2, D)))
    one = fused.forward(x[:, :1], gamma[:1], beta[:1])
    assert np.array_equal(one[0], np.broadcast_to(beta[:1], (3, 1)))
    dx, _, _ = fused.backward(np.ones((3, 1), dtype), one[1])
    assert np.array_equal(dx, np.zeros((3, 1), dtype))


def test_inputs_are_not_modified():
    x, gamma, beta, dy = make_inputs((5, 2, 16), np.float16, seed=6)
    originals = [a.copy() for a in (x, gamma, beta, dy)]
    for a in (x, gamma, beta, dy):
        a.setflags(write=False)
    _, cache = fused.forward(x, gamma, beta)
    fused.backward(dy, cache)
    for a, orig in zip((x, gamma, beta, dy), originals):
        assert np.array_equal(a, orig)
    assert not cache.xhat.flags.writeable and not cache.gamma.flags.writeable


BAD_FORWARD = [
    dict(x=np.ones((2, 3), np.int64)),
    dict(x=np.float32(1.0)),
    dict(x=np.ones((2, 0))),
    dict(gamma=np.ones(4)),
    dict(beta=np.ones((1, 3))),
    dict(eps=0.0),
    dict(eps=float("nan")),
    dict(eps="1e-5"),
]


@pytest.mark.parametrize("bad", BAD_FORWARD)
def test_bad_forward_input_raises_what_core_raises(bad):
    args = dict(x=np.ones((2, 3)), gamma=np.ones(3), beta=np.zeros(3), eps=1e-5) | bad
    with pytest.raises((TypeError, ValueError)) as core_err:
        lnorm.forward(**args, block_rows=2)
    with pytest.raises(type(core_err.value)) as fused_err:
        fused.forward(**args)
    assert str(fused_err.value) == str(core_err.value)


@pytest.mark.parametrize(
    "dy, cache",
    [
        (np.ones((2, 4)), "cache"),
        (np.ones((3, 3)), None),
        (np.ones((2, 3), np.int32), None),
    ],
)
def test_bad_backward_input_raises_what_core_raises(dy, cache):
    if cache is None:
        cache = lnorm.forward(np.arange(6.0).reshape(2, 3), np.ones(3), np.zeros(3))[1]
    with pytest.raises((TypeError, ValueError)) as core_err:
        lnorm.backward(dy, cache, block_rows=2)
    with pytest.raises(type(core_err.value)) as fused_err:
        fused.backward(dy, cache)
    assert str(fused_err.value) == str(core_err.value)


def test_the_default_schedule_is_fused():
    x, gamma, beta, dy = make_inputs((4, 5), np.float32, seed=1)
    y, cache = lnorm.forward(x, gamma, beta)
    y_f, cache_f = fused.forward(x, gamma, beta)
    assert np.array_equal(y, y_f) and np.array_equal(cache.xhat, cache_f.xhat)
    for a, b in zip(lnorm.backward(dy, cache), fused.backward(dy, cache)):
        assert np.array_equal(a, b)


def _page_distance(a: np.ndarray, b: np.ndarray) -> int:
    """How far apart the starts of a and b are, modulo 4 KiB (0 to 2048)."""
    d = (a.ctypes.data - b.ctypes.data) % 4096
    return min(d, 4096 - d)


@pytest.mark.parametrize("offsets", [(16,), (16, 16), (0, 272, 2064), (4032, 64, 512)])
def test_arrays_are_placed_apart_modulo_a_page(monkeypatch, offsets):
    # Arrays at chosen places in a page stand for the inputs a loop streams.
    monkeypatch.setattr(fused, "APART_FROM_BYTES", 0)
    buf = np.empty(3 * 8192, np.uint8)
    base = (-buf.ctypes.data) % 4096
    others = [buf[base + 4096 * i + o :][:64] for i, o in enumerate(offsets)]
    a = fused.empty_apart((3, 5), np.float32, *others)
    assert a.shape == (3, 5) and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.ctypes.data % 64 == 0
    assert all(_page_distance(a, o) >= fused.APART_BYTES for o in others)
    assert fused.empty_apart((0, 4), np.float64, *others).shape == (0, 4)


def test_placement_with_more_others_than_always_fit(monkeypatch):
    # 64 line-aligned starts; eight others ruling out 7 each leave 8 free, but
    # 16 others spread over the page can rule out all: take the farthest.
    monkeypatch.setattr(fused, "APART_FROM_BYTES", 0)
    buf = np.empty(17 * 4096, np.uint8)
    base = (-buf.ctypes.data) % 4096
    others = [buf[base + 4096 * i + 256 * i :][:64] for i in range(16)]
    a = fused.empty_apart(7, np.float32, *others)
    assert a.shape == (7,) and a.ctypes.data % 64 == 0
    # Every 256th byte is taken: the best start is 128 bytes from its neighbours.
    assert min(_page_distance(a, o) for o in others) == 128


def test_only_large_arrays_are_moved():
    # From APART_FROM_BYTES on (np.empty touches no memory: this is cheap).
    others = [np.empty(fused.APART_FROM_BYTES // 4, np.float32)]
    big = fused.empty_apart((fused.APART_FROM_BYTES // 4,), np.float32, *others)
    assert _page_distance(big, others[0]) >= fused.APART_BYTES
    small = fused.empty_apart((16,), np.float32, *others)
    assert small.flags.owndata


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_outputs_are_apart_from_the_arrays_they_are_streamed_with(
    monkeypatch, dtype
):
    # Rows of 4 KiB (D = 1024 float32) put element j of every row of every
    # array at the same place in a page; the library's own arrays move apart
    # (from APART_FROM_BYTES on: set to 0 here to keep the arrays small).
    monkeypatch.setattr(fused, "APART_FROM_BYTES", 0)
    x, gamma, beta, dy = make_inputs((8, 1024), dtype, seed=2)
    y, cache = fused.forward(x, gamma, beta)
    dx, _, _ = fused.backward(dy, cache)
    assert _page_distance(y, x) >= fused.APART_BYTES
    assert _page_distance(cache.xhat, x) >= fused.APART_BYTES
    assert _page_distance(cache.xhat, y) >= fused.APART_BYTES
    assert _page_distance(dx, dy) >= fused.APART_BYTES
    assert _page_distance(dx, cache.xhat) >= fused.APART_BYTES
    assert y.flags.c_contiguous and dx.flags.c_contiguous


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(5, 1), (0, 4), (fused.BLOCK_ROWS + 7, 800), (2, 3, 8)]
)
def test_out_gives_the_same_bits_in_the_given_arrays(dtype, shape):
    x, gamma, beta, dy = make_inputs(shape, dtype, seed=11)
    y_new, cache_new = fused.forward(x, gamma, beta)
    dx_new, dg_new, db_new = fused.backward(dy, cache_new)
    y_buf = np.full(shape, 7, dtype)  # stale values must all be overwritten
    xhat_buf = np.full(shape, 7, dtype)
    dx_buf = np.full(shape, 7, dtype)
    y, cache = fused.forward(x, gamma, beta, out=(y_buf, xhat_buf))
    dx, dg, db = fused.backward(dy, cache, out=dx_buf)
    assert y is y_buf and dx is dx_buf
    assert x.size == 0 or np.shares_memory(cache.xhat, xhat_buf)
    assert np.array_equal(y, y_new, equal_nan=True)
    assert np.array_equal(cache.xhat, cache_new.xhat, equal_nan=True)
    assert np.array_equal(cache.rstd, cache_new.rstd)
    for a, b in [(dx, dx_new), (dg, dg_new), (db, db_new)]:
        assert np.array_equal(a, b, equal_nan=True)
    # The cache's view is read-only; the caller's buffer stays writeable, so
    # the next step can reuse it.
    assert not cache.xhat.flags.writeable and xhat_buf.flags.writeable
    fused.forward(x, gamma, beta, out=(y_buf, xhat_buf))


def test_out_with_another_input_dtype_is_converted_into():
    # A float64 dy with a float32 forward: dx is computed in float64 and
    # delivered in float32, in the caller's array.
    x, gamma, beta, dy = make_inputs((6, 10), np.float32, seed=3)
    _, cache = fused.forward(x, gamma, beta)
    dx_new, _, _ = fused.backward(dy.astype(np.float64), cache)
    out = np.empty((6, 10), np.float32)
    dx, _, _ = fused.backward(dy.astype(np.float64), cache, out=out)
    assert dx is out and np.array_equal(out, dx_new)


def _bad_outs(x):
    shape, dt = x.shape, x.dtype
    return [
        ([1.0] * shape[-1], TypeError, "NumPy array"),
        (np.empty(shape, np.float64), TypeError, "dtype float32"),
        (np.empty(shape[::-1], dt), ValueError, "shape"),
        (np.empty(shape, dt, order="F"), ValueError, "C-contiguous"),
        (np.empty(shape, dt)[...].view(), ValueError, "read-only"),
        (x, ValueError, "shares memory"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_bad_out_is_refused_before_anything_is_written(case):
    x, gamma, beta, dy = make_inputs((4, 6), np.float32, seed=5)
    bad, err, words = _bad_outs(x)[case]
    if words == "read-only":
        bad.flags.writeable = False
    good = np.empty_like(x)
    with pytest.raises(err, match=words):
        fused.forward(x, gamma, beta, out=(bad, good))
    with pytest.raises(err, match=words):
        fused.forward(x, gamma, beta, out=(good, bad))
    _, cache = fused.forward(x, gamma, beta)
    if words == "shares memory":
        bad = dy  # dx may not overwrite the dy it reads
    with pytest.raises(err, match=words):
        fused.backward(dy, cache, out=bad)


def test_forward_out_must_be_two_separate_arrays():
    x, gamma, beta, _ = make_inputs((4, 6), np.float32, seed=6)
    buf = np.empty_like(x)
    with pytest.raises(TypeError, match="tuple"):
        fused.forward(x, gamma, beta, out=buf)
    with pytest.raises(ValueError, match="shares memory"):
        fused.forward(x, gamma, beta, out=(buf, buf))
    # dx may not overwrite the xhat it reads, which the cache holds in the
    # caller's buffer.
    xhat_buf = np.empty_like(x)
    _, cache = fused.forward(x, gamma, beta, out=(buf, xhat_buf))
    with pytest.raises(ValueError, match="shares memory"):
        fused.backward(x, cache, out=xhat_buf)


# Zero rows, fewer rows than threads, one chunk, several chunks with a short
# last one, rows in groups of four over chunks, float16 (read as its bits),
# three leading axes. Any number of threads fills the same partial rows,
# summed after the threads in the same order.
THREAD_CASES = [
    ((0, 5), np.float32),
    ((1, 7), np.float64),
    ((3, 1), np.float32),
    ((fused.CHUNK_ROWS // 2, 33), np.float32),
    ((2 * fused.CHUNK_ROWS + 37, 33), np.float64),
    ((2 * fused.CHUNK_ROWS + 5, fused.GROUP_FROM_D + 3), np.float32),
    ((fused.CHUNK_ROWS + 9, 40), np.float16),
    ((3, 5, 200, 9), np.float32),
]


@pytest.mark.parametrize("threads", [2, 3, 8])
@pytest.mark.parametrize("shape, dtype", THREAD_CASES)
def test_any_number_of_threads_gives_the_same_bits(shape, dtype, threads):
    # The forward splits rows, which are independent. The backward splits
    # chunks, whose dgamma/dbeta blocks are summed in an order fixed by the
    # chunks alone; threads only decide who computes which chunk.
    x, gamma, beta, dy = make_inputs(shape, dtype, seed=threads)
    y1, cache1 = fused.forward(x, gamma, beta)
    yn, cachen = fused.forward(x, gamma, beta, threads=threads)
    assert np.array_equal(yn, y1)
    assert np.array_equal(cachen.xhat, cache1.xhat)
    assert np.array_equal(cachen.rstd, cache1.rstd)
    for one, many in zip(fused.backward(dy, cache1),
                         fused.backward(dy, cache1, threads=threads)):
        assert many.dtype == one.dtype
        assert np.array_equal(many, one)


def test_threads_write_into_out_too():
    x, gamma, beta, dy = make_inputs((2 * fused.CHUNK_ROWS + 3, 24), np.float32)
    y1, cache1 = fused.forward(x, gamma, beta)
    dx1, _, _ = fused.backward(dy, cache1)
    y_buf, xhat_buf, dx_buf = (np.full_like(x, np.nan) for _ in range(3))
    y, cache = fused.forward(x, gamma, beta, out=(y_buf, xhat_buf), threads=2)
    dx, _, _ = fused.backward(dy, cache, out=dx_buf, threads=2)
    assert y is y_buf and dx is dx_buf
    assert np.array_equal(y_buf, y1) and np.array_equal(dx_buf, dx1)


def test_each_thread_takes_its_own_contiguous_range(monkeypatch):
    # Three threads over five chunks: jobs of 1, 2 and 2 chunks in order, each
    # run by a different thread, the first by the caller's.
    seen = []
    loop = fused._backward_chunks

    def spy(*args):
        # The Thread object, not its ident: a thread that has finished can
        # hand its ident on to one started after it (seen here with an empty
        # Numba cache: two idents for the three threads).
        seen.append((args[-2], args[-1], threading.current_thread()))
        return loop(*args)

    monkeypatch.setattr(fused, "_backward_chunks", spy)
    x, gamma, beta, dy = make_inputs((5 * fused.CHUNK_ROWS - 1, 8), np.float64)
    _, cache = fused.forward(x, gamma, beta)
    fused.backward(dy, cache, threads=3)
    ranges = sorted((first, last) for first, last, _ in seen)
    assert ranges == [(0, 1), (1, 3), (3, 5)]
    assert len({thread for *_, thread in seen}) == 3
    assert threading.current_thread() in {thread for *_, thread in seen}


@pytest.mark.parametrize("bad, err", [(0, ValueError), (-2, ValueError),
                                      (1.0, TypeError), (True, TypeError),
                                      ("2", TypeError), (None, TypeError)])
def test_bad_threads_are_refused(bad, err):
    x, gamma, beta, dy = make_inputs((4, 6), np.float32, seed=7)
    with pytest.raises(err, match="threads"):
        fused.forward(x, gamma, beta, threads=bad)
    _, cache = fused.forward(x, gamma, beta)
    with pytest.raises(err, match="threads"):
        fused.backward(dy, cache, threads=bad)


def test_an_error_in_another_thread_reaches_the_caller():
    def loop(i):
        if i == 2:
            raise RuntimeError("job 2 failed")

    with pytest.raises(RuntimeError, match="job 2"):
        fused._in_threads(loop, [(0,), (1,), (2,)])


@nb.njit
def _narrow_all(d, out):
    for i in range(d.shape[0]):
        out[i] = fused._narrow(d[i], out)


def test_float16_outputs_are_rounded_once():
    # Halfway between two float16 values, and a hair to either side: rounded
    # to float32 first, the hair is lost and the tie goes to even; the loops
    # round the float64 once, as NumPy does.
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 0x7C00, 5000).astype(np.uint16)  # finite halves
    lo = bits.view(np.float16).astype(np.float64)
    hi = (bits + 1).view(np.float16).astype(np.float64)
    mid = (lo + hi) / 2
    d = np.concatenate([mid, mid * (1 + 2.0**-40), mid * (1 - 2.0**-40),
                        rng.standard_normal(5000) * np.exp(rng.uniform(-20, 12, 5000)),
                        [0.0, np.inf, 65504.0, 65519.99, 65520.0, 1e300, 2.0**-25,
                         1.5 * 2.0**-24, 2.0**-26]])
    d = np.concatenate([d, -d])
    got = np.empty(d.size, np.uint16)
    _narrow_all(d, got)
    with np.errstate(over="ignore"):
        want = d.astype(np.float16)
        twice = d.astype(np.float32).astype(np.float16)
    assert np.array_equal(got, want.view(np.uint16))
    assert np.count_nonzero(twice != want) > 1000  # what rounding twice gives
    nan = np.empty(1, np.uint16)
    _narrow_all(np.array([np.nan]), nan)
    assert np.isnan(nan.view(np.float16)).all()


def test_float16_makes_no_converted_copy():
    # The loops read and write float16 as bits: the forward allocates its two
    # outputs and rstd, the backward dx and the dgamma/dbeta partial rows,
    # and no float32 copy of any tensor (each would be twice the input, 2 MiB).
    if not fused._native_half():
        pytest.skip("without F16C the loops run on float64 copies")
    x, gamma, beta, dy = make_inputs((512, 1024), np.float16, seed=9)
    n = x.size
    slack = 64 * 1024
    assert bench.peak_bytes(lambda: fused.forward(x, gamma, beta)) < 2 * 2 * n + slack
    _, cache = fused.forward(x, gamma, beta)
    partials = 2 * 8 * 1024 * fused._chunked_block_count(512, 1024)
    peak = bench.peak_bytes(lambda: fused.backward(dy, cache))
    assert peak < 2 * n + partials + slack


@nb.njit
def _wide_all(h, out):
    for i in range(h.shape[0]):
        out[i] = fused._wide(h[i])


def test_float16_inputs_are_read_exactly():
    every = np.arange(2**16, dtype=np.uint16)
    got = np.empty(every.size)
    _wide_all(every, got)
    want = every.view(np.float16).astype(np.float64)
    nan = np.isnan(want)
    assert np.array_equal(got[~nan].view(np.int64), want[~nan].view(np.int64))
    assert np.isnan(got[nan]).all()
    assert np.array_equal(np.signbit(got), np.signbit(want))


def _cpuinfo_flags() -> set[str] | None:
    """The CPU flags Linux lists for an x86 CPU, or None elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None  # not x86 (Arm lists "Features")


def test_cpu_features_are_those_the_kernel_lists():
    # The loops pick their float16 conversion from this answer; checked
    # against an independent source, Linux's /proc/cpuinfo, so that a wrong
    # feature name cannot quietly select the slow path.
    flags = _cpuinfo_flags()
    if flags is None or {"NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"} & set(os.environ):
        pytest.skip("needs an x86 Linux /proc/cpuinfo and Numba's host CPU")
    assert fused._native_half() == ("f16c" in flags)


def test_float16_conversions_need_no_cpu_feature(tmp_path):
    # LLVM's half type needs F16C on x86: for a generic CPU, LLVM calls a
    # runtime function the JIT does not have, and the process would die.
    # There the loops run on float64 copies, which NumPy rounds to the same
    # bits.
    code = (
        "import hashlib, numpy as np\n"
        "from lnorm import fused\n"
        "assert not fused._native_half()\n"
        "x = np.linspace(-3, 3, 4 * 777, dtype=np.float16).reshape(4, 777)\n"
        "g = np.linspace(0.5, 2, 777).astype(x.dtype)\n"
        "y, c = fused.forward(x, g, np.zeros(777, x.dtype))\n"
        "out = np.empty_like(x)\n"
        "dx, dg, db = fused.backward(x[::-1].copy(), c, out=out)\n"
        "assert dx is out and dg.dtype == x.dtype\n"
        "print(hashlib.sha256(y.tobytes() + dx.tobytes() + dg.tobytes()).hexdigest())\n"
    )
    env = {**os.environ, "NUMBA_CPU_NAME": "generic",
           "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    x = np.linspace(-3, 3, 4 * 777, dtype=np.float16).reshape(4, 777)
    g = np.linspace(0.5, 2, 777).astype(x.dtype)
    y, c = fused.forward(x, g, np.zeros(777, x.dtype))
    dx, dg, _ = fused.backward(x[::-1].copy(), c)
    here = hashlib.sha256(y.tobytes() + dx.tobytes() + dg.tobytes()).hexdigest()
    assert run.stdout.split() == [here]
