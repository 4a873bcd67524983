"""Tests for lnorm.cost: the traffic model, counted by hand here."""

import inspect

import pytest

import lnorm
from lnorm import bench, cost

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
    # Per element: g, dy*xhat, sum g, 2 for (dy*xhat)@gamma, u, t, v, dx, dgamma, dbeta
    # = 11;
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
    # mean (1), x - mean, square, sum (3), scale by rstd, gamma *, + beta (3) per
    # element;
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
    # sum g (g), (dy*xhat)@gamma (dy_xhat), u=g-mean_g (g), t=xhat*m (xhat), v=u-t (u,
    # t),
    # dx=rstd*v (v), dgamma (dy_xhat), dbeta (dy): 12. Writes: g, dy_xhat, u, t, v, dx:
    # 6.
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
    assert (
        t.bytes_read == 2 * FULL + (12 * full64 + 3 * ROW + 2 * PARAM) + full64 == 744
    )
    assert (
        t.bytes_written == 2 * full64 + (6 * full64 + 2 * ROW + 2 * PARAM) + FULL == 464
    )
    assert t.passes == 18 + 3 * 2
    # Working in the input's own dtype converts nothing: the plain program.
    same = cost.traffic("backward", "numpy", work_itemsize=4, **SMALL)
    assert same == cost.traffic("backward", "numpy", **SMALL)
    assert same.passes == 18


# --- tiled: fused traffic plus per-block parameter traffic --------------------------


def _dram(t):
    return (t.flops, t.bytes_read, t.bytes_written, t.passes)


def test_tiled_one_block_moves_what_fused_moves():
    # Main memory sees the same bytes; the caches see the op-by-op program.
    for direction in cost.DIRECTIONS:
        fused = cost.traffic(direction, "fused", **SMALL)
        for kw in ({}, {"block_rows": 5}):
            tiled = cost.traffic(direction, "tiled", **SMALL, **kw)
            assert _dram(tiled) == _dram(fused)
            numpy = cost.traffic(direction, "numpy", **SMALL)
            assert tiled.bytes_cached == numpy.bytes_read + numpy.bytes_written


# --- the two levels, write-allocate, converted copies ---------------------------------


def test_op_by_op_streams_everything_through_memory():
    for direction in cost.DIRECTIONS:
        t = cost.traffic(direction, "numpy", **SMALL)
        assert t.bytes_cached == t.bytes_read + t.bytes_written == t.bytes


def test_tiled_float64_caches_see_the_upcast_program():
    # lnorm.core's tiled backward: dy and xhat copied to float64 (read 24, write 48
    # each), the 18 passes over float64 blocks, dx rounded back (read 48, write 24).
    t = cost.traffic("backward", "tiled", work_itemsize=8, **SMALL)
    up = cost.traffic("backward", "numpy", work_itemsize=8, **SMALL)
    assert t.bytes_cached == up.bytes_read + up.bytes_written == 744 + 464
    assert _dram(t)[1:] == _dram(cost.traffic("backward", "fused", **SMALL))[1:]


def test_fused_loop_bytes_through_the_caches():
    n = 6  # rows * D of SMALL
    fwd = cost.traffic("forward", "fused", **SMALL)
    # x read three times, y and xhat written (4 B each); gamma, beta read as float64.
    assert fwd.bytes_cached == n * (3 * 4 + 2 * 4 + 2 * 8) == 216
    bwd = cost.traffic("backward", "fused", **SMALL)
    # D = 3 is too short for groups: every row has a first sweep of its own.
    # dy, xhat read twice, dx written (4 B each); gamma read as float64 by both
    # sweeps; the float64 dgamma and dbeta accumulators read and written once
    # per row.
    assert bwd.bytes_cached == n * (5 * 4 + 2 * 8 + 2 * 2 * 8) == 408


def test_fused_loop_model_is_its_own_not_the_loops_tuning():
    # The model's loop takes a row at a time whatever D is: the column sums are
    # read and written once per element, at every row length and row count.
    assert cost.LOOP_SWEEPS == {"forward": 3, "backward": 2}
    assert cost.LOOP_ITEMSIZE == 8
    for rows, D in [(1033, 1024), (1033, 767), (1, 5)]:
        t = cost.traffic("backward", "fused", rows=rows, D=D, itemsize=4)
        # dy, xhat read by both sweeps, dx written (4 B); gamma read by both
        # sweeps, dgamma and dbeta read and written (8 B each).
        assert t.bytes_cached == rows * D * (5 * 4 + (2 + 4) * 8)


def test_write_allocate_reads_every_full_size_output_once():
    for direction, outputs in [("backward", 1), ("forward", 2)]:
        plain = cost.traffic(direction, "fused", **SMALL)
        wa = cost.traffic(direction, "fused", write_allocate=True, **SMALL)
        assert wa.bytes_allocated == outputs * FULL
        assert wa.bytes == plain.bytes + outputs * FULL
        assert _dram(wa) == _dram(plain)
    # Op by op, every temporary written is also allocated: 6 in the backward.
    numpy = cost.traffic("backward", "numpy", write_allocate=True, **SMALL)
    assert numpy.bytes_allocated == 6 * FULL
    # The allocated lines come into the caches too: counted at both levels.
    assert numpy.bytes_cached == numpy.bytes == 360 + 200 + 6 * FULL
    fused_wa = cost.traffic("backward", "fused", write_allocate=True, **SMALL)
    assert fused_wa.bytes_cached == 408 + FULL


def test_fused_float16_counts_its_converted_copies():
    half = dict(rows=2, D=3, itemsize=2, stat_itemsize=8)
    direct = cost.traffic("backward", "fused", **half)
    conv = cost.traffic("backward", "fused", work_itemsize=4, **half)
    # dy and xhat: written as float32 (24 B each) and read by the loop; dx
    # written as float32, read back, and written as float16 (counted in direct).
    wide = 6 * 4
    assert conv.bytes_read == direct.bytes_read + 3 * wide
    assert conv.bytes_written == direct.bytes_written + 3 * wide
    assert conv.passes == direct.passes + 6
    assert conv.flops == direct.flops
    # Through the caches: the loop's five element accesses (dy and xhat twice,
    # dx once) are 4 B instead of 2 on each of the 6 elements, and each of the
    # three conversions reads its 2-byte tensor and writes the 4-byte copy.
    assert conv.bytes_cached == direct.bytes_cached + 6 * 5 * (4 - 2) + 3 * (
        6 * 2 + wide)
    # With write-allocate, each plain store to a full-size tensor reads it
    # first: dx (6 elements x 2 B) and the three float32 copies (3 x 24 B).
    wa = cost.traffic("backward", "fused", work_itemsize=4, write_allocate=True,
                      **half)
    assert wa.bytes_allocated == 6 * 2 + 3 * wide


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
    assert (
        t.bytes_read == 2 * 12 and t.bytes_written == 2 * 12
    )  # gamma twice; dgamma, dbeta


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


# --- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(direction="sideways"), ValueError, "direction"),
        (dict(schedule="magic"), ValueError, "schedule"),
        (dict(saved="y"), ValueError, "saved"),
        (dict(rows=-1), ValueError, "rows"),
        (dict(D=0), ValueError, "D"),
        (dict(itemsize=2.0), TypeError, "itemsize"),
        (dict(work_itemsize=0), ValueError, "work_itemsize"),
        (dict(block_rows=4), ValueError, "block_rows"),
    ],
)
def test_traffic_rejects_bad_arguments(kwargs, exc, match):
    args = (
        dict(direction="backward", schedule="fused", rows=2, D=3, itemsize=4) | kwargs
    )
    direction, schedule = args.pop("direction"), args.pop("schedule")
    with pytest.raises(exc, match=match):
        cost.traffic(direction, schedule, **args)


def test_a_mean_in_two_pieces_is_three_statistics():
    # The GPU kernels save mean_hi, mean_lo and rstd: one row vector more to
    # write in the forward, to read in the backward and to hold.
    kw = dict(saved="x_mean_rstd", **SMALL)
    one, two = ({d: cost.traffic(d, "fused", mean_parts=k, **kw)
                 for d in cost.DIRECTIONS} for k in (1, 2))
    assert two["forward"].bytes_written == one["forward"].bytes_written + ROW
    assert two["forward"].bytes_written == FULL + 3 * ROW
    assert two["backward"].bytes_read == one["backward"].bytes_read + ROW
    assert two["backward"].bytes_written == one["backward"].bytes_written
    assert two["forward"].flops == one["forward"].flops
    held = cost.cache_bytes("x_mean_rstd", kept_alive={"x"}, mean_parts=2,
                            rows=2, D=3, itemsize=4, stat_itemsize=8)
    assert held == 3 * ROW


@pytest.mark.parametrize("saved", ["xhat_rstd", "y_rstd", "x"])
def test_mean_parts_needs_a_saved_mean(saved):
    with pytest.raises(ValueError, match="mean_parts.*x_mean_rstd"):
        cost.traffic("forward", "fused", saved=saved, mean_parts=2, **SMALL)
    with pytest.raises(ValueError, match="mean_parts"):
        cost.cache_bytes(saved, mean_parts=2, rows=2, D=3, itemsize=4)
    with pytest.raises(ValueError, match="mean_parts"):
        cost.traffic("forward", "fused", mean_parts=0, **SMALL)


def test_cache_bytes_rejects_unknown_alive_tensor():
    with pytest.raises(ValueError, match="kept_alive"):
        cost.cache_bytes("x_mean_rstd", rows=2, D=3, itemsize=4, kept_alive={"xhat"})


# --- the model counts the code the benchmark runs ------------------------------------


def test_numpy_program_is_the_benchmark_reference():
    # The reference forward and backward are forward_formula and backward_formula on the
    # rows.
    assert "forward_formula(" in inspect.getsource(bench.reference_forward)
    assert "backward_formula(" in inspect.getsource(bench.reference_backward)
    source = inspect.getsource(lnorm.core.forward_formula) + inspect.getsource(
        lnorm.core.backward_formula
    )
    for direction in cost.DIRECTIONS:
        for step in cost.numpy_program(direction):
            assert step.code in source, step.code


def test_recomputation_saves_nothing_but_x_and_pays_flops():
    kw = dict(rows=2, D=3, itemsize=4, stat_itemsize=8)
    # Nothing but x, which the residual stream holds anyway.
    assert cost.cache_bytes("x", kept_alive={"x"}, **kw) == 0
    assert cost.cache_bytes("x", **kw) == FULL
    fwd = cost.traffic("forward", "fused", saved="x", **kw)
    assert fwd.bytes_written == FULL  # y only
    bwd = cost.traffic("backward", "fused", saved="x", **kw)
    from_xhat = cost.traffic("backward", "fused", **kw)
    # Fused, x is read instead of xhat and rstd is not read at all...
    assert bwd.bytes_read == from_xhat.bytes_read - ROW
    # ... and the statistics are recomputed: the forward's first five FLOPs per
    # element (mean, x - mean, square, mean, scale) and five per row.
    assert bwd.flops - from_xhat.flops == 6 * 5 + 2 * (1 + 1 + 3)
