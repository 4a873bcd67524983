"""Tests of lnorm.gpu: PTX everywhere, the NumPy emulation everywhere, the kernels on a
GPU.


The compilation and PTX tests run on any machine (NVRTC needs no GPU). The
tests that launch kernels skip with the reason lnorm.gpu.available() gives.
"""

import functools
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lnorm import gpu
from lnorm.gpu import check, emulate, kernels, measure, model, ptx

GPU_OK, GPU_REASON = gpu.available()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"needs a CUDA device: {GPU_REASON}")

C = kernels.constants()
E = C["LN_ELEMS_PER_THREAD"]
ALL_KERNELS = {name for f in kernels.KERNEL_FILES for name in kernels.kernel_params(f)}
MAIN = re.compile(r"ln_(fwd|bwd)_(warp|block)_(f32|f16)_v(\d)")
ATOMIC = re.compile(r"ln_bwd_atomic_(warp|block)_(f32|f16)_v(\d)")
GROUPED = re.compile(r"ln_bwd_grouped_(warp|block)_(f32|f16)_v(\d)")
LONG = re.compile(r"ln_(fwd|bwd)_long_(f32|f16)_v(\d)")
GROUPED_LONG = re.compile(r"ln_(fwd|bwd)_grouped_long_(f32|f16)_v(\d)")
ITEMSIZE = {"f32": 4, "f16": 2}


def _budget_strip(p) -> int:
    """v5's backward strip as the partials budget sets it (the plan's, before
    waves): from one row (LN_LONG_STRIP for a block's long rows), doubled
    while a block's partial row is more than PARTIALS_BUDGET of the bytes."""
    strip = C["LN_LONG_STRIP"] if p.chunks > 1 else 1
    while 16 / (p.groups_per_block * strip) > (
            kernels.PARTIALS_BUDGET * 3 * p.dtype.itemsize):
        strip *= 2
    return strip


# The shapes the book checks (every kernel variant), and rows of one element.
SHAPES = [(64, 1), *check.SHAPES]
# Normwise relative error bounds against lnorm's float64 result. float32
# arithmetic: a few units of u32 = 6e-8 (measured: at most 2.0e-7). float16
# outputs are rounded once to float16: u16 = 4.9e-4. dgamma and dbeta are
# float32 in both cases.
BOUND = {
    "float32": {"y": 1e-6, "dx": 1e-6, "dgamma": 1e-6, "dbeta": 1e-6},
    "float16": {"y": 1e-3, "dx": 1e-3, "dgamma": 1e-6, "dbeta": 1e-6},
}


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


# --- importing without CUDA -----------------------------------------------------


def test_import_does_not_import_cupy():
    assert _run("import sys, lnorm.gpu; print('cupy' in sys.modules)") == "False"


def test_without_cupy_available_says_why():
    out = _run(
        "import sys; sys.modules['cupy'] = None\n"
        "import lnorm.gpu as g; ok, why = g.available(); print(ok, '|', why)"
    )
    ok, why = out.split(" | ")
    assert ok == "False"
    assert "CuPy cannot be imported" in why


def test_available_agrees_with_cupy():
    import cupy

    ok, reason = gpu.available()
    assert ok == cupy.cuda.is_available()
    assert isinstance(reason, str) and len(reason) > 3
    if not ok:
        assert "no CUDA device" in reason


@pytest.mark.skipif(GPU_OK, reason="checks the behaviour on a machine without a GPU")
def test_gpu_entry_points_refuse_on_a_cpu_machine():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        gpu.FusedLayerNorm()


def test_constants_are_read_from_the_source():
    assert set(C) == {
        "LN_ELEMS_PER_THREAD",
        "LN_WARPS_PER_BLOCK",
        "LN_MAX_ROW_THREADS",
        "LN_REDUCE_SLICES",
        "LN_REDUCE_SLICES_WIDE",
        "LN_REDUCE_BATCH",
        "LN_FWD_ROWS_IN_FLIGHT",
        "LN_BWD_ROWS_IN_FLIGHT",
        "LN_BWD_WARP_ROWS_IN_FLIGHT_F32",
        "LN_BWD_WARP_ROWS_IN_FLIGHT_F16",
        "LN_LONG_ELEMS_PER_THREAD",
        "LN_LONG_STRIP",
    }
    assert kernels.max_D() == E * C["LN_MAX_ROW_THREADS"] == 8192
    # One block of v5 takes GPT-3's rows (12288), float32 and float16, as
    # 16-byte vectors.
    assert kernels.max_D("v5") == C["LN_LONG_ELEMS_PER_THREAD"] * 512 == 12288
    assert C["LN_LONG_ELEMS_PER_THREAD"] % 8 == 0
    assert kernels.max_D("v3") == kernels.max_D()
    with pytest.raises(ValueError, match="rung must be one of"):
        kernels.max_D("v9")


@pytest.mark.parametrize(
    "D, dtype, vec, per_block, threads",
    [
        (7, np.float32, 1, False, 32),
        (512, np.float32, 4, False, 32),
        (512, np.float16, 8, False, 32),
        (513, np.float16, 1, True, 64),
        (768, np.float32, 4, True, 64),
        (4099, np.float32, 1, True, 288),
        (8192, np.float16, 8, True, 512),
        (8192, np.float32, 4, True, 512),
        (8193, np.float32, 1, True, 512),
        (12288, np.float16, 8, True, 512),
        (65536, np.float32, 4, True, 512),
    ],
)
def test_plan_mapping(D, dtype, vec, per_block, threads):
    p = kernels.plan(1000, D, dtype)
    assert (p.vec, p.per_block, p.threads_per_row) == (vec, per_block, threads)
    # The row fits in the group's registers, or is taken in as few chunks as cover it.
    assert p.chunks == -(-D // (p.threads_per_row * E))
    assert (p.chunks > 1) == (D > kernels.max_D())
    assert (p.kernel("forward").startswith("ln_fwd_long_")) == (p.chunks > 1)
    assert (
        p.kernel("forward").startswith("ln_fwd_") and p.kernel("forward") in ALL_KERNELS
    )
    assert p.kernel("backward") in ALL_KERNELS


def test_checked_shapes_reach_every_kernel():
    """The book's claim for check.SHAPES: both dtypes, every forward and backward
    variant."""
    reached = {
        kernels.plan(rows, D, dtype).kernel(direction)
        for rows, D in check.SHAPES
        for dtype in (np.float32, np.float16)
        for direction in ("forward", "backward")
    }
    assert reached == {
        name for name in ALL_KERNELS if MAIN.fullmatch(name) or LONG.fullmatch(name)
    }
    assert len(reached) == 24
    # and with v3's and v5's, every kernel (the reductions besides)
    for rung in ("v3", "v5"):
        reached |= {kernels.plan(rows, D, dtype, rung).kernel(direction)
                    for rows, D in check.SHAPES for dtype in (np.float32, np.float16)
                    for direction in ("forward", "backward")}
    reduce = {"ln_bwd_reduce_params", "ln_bwd_reduce_params_wide"}
    assert reached | reduce == ALL_KERNELS
    assert len(ALL_KERNELS) == 41


@pytest.mark.parametrize("rows", [0, 1, 15, 16, 17, 1000, 65537, 10**6])
def test_plan_strips_cover_every_row_once(rows):
    p = kernels.plan(rows, 256, np.float32)
    assert p.row_groups <= kernels.MAX_ROW_GROUPS
    if rows:
        assert (
            (p.row_groups - 1) * p.rows_per_group
            < rows
            <= p.row_groups * p.rows_per_group
        )
        assert p.rows_per_group >= kernels.MIN_ROWS_PER_GROUP
        assert p.backward_grid * C["LN_WARPS_PER_BLOCK"] >= p.row_groups
    else:
        assert p.row_groups == 0


@pytest.mark.parametrize("rows", [0, 1, 15, 16, 17, 1000, 10**6])
def test_long_row_strips_cover_every_row_once(rows):
    p = kernels.plan(rows, 12288, np.float32)
    assert p.rows_per_group == C["LN_LONG_STRIP"]  # the means fit in shared memory
    assert p.row_groups == -(-rows // C["LN_LONG_STRIP"]) == p.backward_grid


@pytest.mark.parametrize("rows", [1, 16, 1000, 4096, 10**6])
def test_partial_sums_cost_about_one_byte_per_element_at_most(rows):
    D = 256
    p = kernels.plan(rows, D, np.float16)
    # Two float32 buffers of (row_groups, D), each written once and read once.
    assert p.partials_bytes == 2 * 2 * 4 * p.row_groups * D
    # 16 bytes per column per strip of at least 16 rows; the last strip may be short.
    assert p.partials_bytes <= rows * D + 16 * D
    if (
        rows % kernels.MIN_ROWS_PER_GROUP == 0
        and rows <= kernels.MIN_ROWS_PER_GROUP * kernels.MAX_ROW_GROUPS
    ):
        assert p.partials_bytes == rows * D


def test_plan_rejects_bad_sizes_and_dtypes():
    with pytest.raises(ValueError, match="D must be between 1 and 2147483647"):
        kernels.plan(10, 2**31, np.float32)
    with pytest.raises(ValueError, match="D must be"):
        kernels.plan(10, 0, np.float32)
    with pytest.raises(ValueError, match="rows must be"):
        kernels.plan(-1, 8, np.float32)
    with pytest.raises(TypeError, match="float32 or float16"):
        kernels.plan(10, 8, np.float64)


def test_argument_checks_name_the_argument():
    x = np.zeros((4, 8), np.float32)
    g = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="gamma must have shape"):
        emulate.forward(x, np.ones(7, np.float32), g)
    with pytest.raises(TypeError, match="beta must have the dtype of x"):
        emulate.forward(x, g, g.astype(np.float16))
    with pytest.raises(TypeError, match="x must be float32 or float16"):
        emulate.forward(x.astype(np.float64), g, g)
    m = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="mean_hi must be float32"):
        emulate.backward(x, x, g, m.astype(np.float64), m, m)
    with pytest.raises(ValueError, match="dy must have the shape of x"):
        emulate.backward(x[:2], x, g, m, m, m)
    with pytest.raises(ValueError, match="rstd must have shape x.shape"):
        emulate.backward(x, x, g, m, m, m[:2])
    for bad in (0.0, -1e-5, float("nan")):  # the checks of lnorm.forward
        with pytest.raises(ValueError, match="eps must be finite and > 0"):
            emulate.forward(x, g, g, eps=bad)


def test_eps_must_be_positive_as_a_float32():
    """1e-46 is > 0 in float64 but 0 in float32: a constant row would give NaN."""
    x = np.ones((2, 8), np.float32)
    g = np.ones(8, np.float32)
    for bad in (1e-46, 1e39):  # 0 and inf in float32
        with (
            pytest.raises(ValueError, match="as a float32"),
            np.errstate(over="ignore"),
        ):
            emulate.forward(x, g, g, eps=bad)
    y, _, _, rstd = emulate.forward(x, g, g, eps=1e-44)  # subnormal, still > 0
    assert np.isfinite(rstd).all() and (y == 1).all()


def test_plan_rejects_rows_past_int32():
    with pytest.raises(ValueError, match="below 2\\*\\*31"):
        kernels.plan(2**31, 8, np.float32)
    assert kernels.plan(2**31 - 1, 8, np.float32).rows == 2**31 - 1


@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4, 1e6])
def test_accuracy_is_flat_in_the_offset(offset):
    """The target of the corrected mean: D = 1024, standard-normal dy, float32."""
    err = measure.offset_sweep(
        (emulate.forward, emulate.backward), D=1024, rows=32, offsets=(offset,)
    )[0]
    assert err["y"] <= 2e-7 and err["dx"] <= 2e-7, err
    # The plain float32 mean of the op-by-op version loses digits with the offset.
    plain = measure.offset_sweep(
        (gpu.run.unfused_forward, gpu.run.unfused_backward),
        D=1024,
        rows=32,
        offsets=(offset,),
    )[0]
    if offset >= 1e4:
        assert plain["y"] > 100 * err["y"]


@pytest.mark.parametrize("D", [1, 2, 7, 64, 513, 1027, 4099, 8192, 12288, 16387])
def test_errors_stay_within_the_derived_bound(D):
    bound = check.error_bounds(D)
    if D <= kernels.max_D():
        assert bound["depth"] <= 16 + np.log2(max(D, 32))
    else:  # the long-row kernels: 16 elements a thread per chunk, 5 + 5 rounds
        assert bound["depth"] <= 16 * -(-D // kernels.max_D()) + 10
    assert bound["y"] < bound["dx"]
    for offset in (0.0, 1e3, 1e6):
        for dy_offset in (0.0, 1e3):
            err = check.offset_errors(
                emulate.forward, emulate.backward, D, offset, dy_offset
            )
            assert err["y"] <= bound["y"] and err["dx"] <= bound["dx"], (
                offset,
                dy_offset,
                err,
            )


def test_measure_dry_run_plans_every_timed_launch(tmp_path):
    if GPU_OK:
        pytest.skip("a GPU is present: the dry run is what a machine without one does")
    out = tmp_path / "m.json"
    assert measure.main(["--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["gpu"] is False and data["reason"] == GPU_REASON
    launches = data["launches"]
    assert {(e["rows"], e["D"], e["dtype"]) for e in launches} == {
        (r, D, dt) for r, D in measure.SHAPES for dt in measure.DTYPES
    }
    for e in launches:
        assert "unsupported" not in e  # every timed shape has a kernel now
        long_row = e["D"] > kernels.max_D()
        assert e["kernel_forward"].startswith("ln_fwd_long_") == long_row
        itemsize = np.dtype(e["dtype"]).itemsize
        n = e["rows"] * e["D"]
        # forward: read x, write y; backward: read x, dy, write dx (plus small vectors)
        assert 2 * n * itemsize < e["bytes_forward"] < 2 * n * itemsize * 1.05
        assert 3 * n * itemsize < e["bytes_backward"] < 3 * n * itemsize * 1.05
        assert e["row_groups"] * e["rows_per_group"] >= e["rows"]
        assert e["partials_bytes"] <= n  # at most 1 byte per element
    assert measure.main(["--launch-only"]) == 2  # nothing to launch without a GPU


def test_emulation_does_not_modify_inputs():
    inp = check.make_inputs(8, 12, np.float16, seed=3)
    before = {k: v.copy() for k, v in inp.items()}
    check.forward_backward(emulate.forward, emulate.backward, inp)
    for k in inp:
        np.testing.assert_array_equal(inp[k], before[k])


# --- NVRTC compilation and PTX, on any machine ----------------------------------------


@pytest.fixture(scope="module", params=kernels.ARCHS)
def compiled(request):
    reports, usage = ptx.inspect_kernels(request.param)
    return request.param, reports, usage


def test_every_kernel_compiles(compiled):
    arch, reports, _ = compiled
    assert set(reports) == ALL_KERNELS
    for name, r in reports.items():
        assert r.max_threads is not None, f"{name} has no __launch_bounds__"


def test_no_local_memory_and_no_atomics(compiled):
    """No atomic instruction outside the ladder's v3, which is atomic by design."""
    _, reports, _ = compiled
    for name, r in reports.items():
        assert (
            r.local_bytes == 0 and r.count("ld.local") == 0 and r.count("st.local") == 0
        ), name
        if not ATOMIC.fullmatch(name):
            assert r.count("atom") == 0 and r.count("red.") == 0, name


def test_atomic_backward_is_v4_with_one_atomic_add_per_column(compiled):
    """v3: v4's loads and dx stores; instead of the partial rows, one float32
    atomicAdd per column a thread holds, into dgamma and into dbeta."""
    _, reports, _ = compiled
    atomic = {n: r for n, r in reports.items() if ATOMIC.fullmatch(n)}
    assert len(atomic) == 8
    for name, r in atomic.items():
        v4 = reports[name.replace("_atomic", "")]
        for in_loop in (True, False):
            assert r.per_argument("ld", in_loop=in_loop) == v4.per_argument(
                "ld", in_loop=in_loop), name
        assert r.per_argument("st") == {"dx": v4.per_argument("st")["dx"]}, name
        assert r.count("atom.global.add.f32") == r.count("atom") == 2 * E, name
        assert r.count("red.") == 0 and r.count("bar.sync") == v4.count("bar.sync")


def test_arithmetic_rounds_like_the_emulation(compiled):
    """No contracted multiply-adds, no approximate division or square root."""
    _, reports, _ = compiled
    for name, r in reports.items():
        assert (
            r.count("fma") == 0
            and r.count("mad.f32") == 0
            and r.count("mad.rn.f32") == 0
        ), name
        assert not any(".approx" in op or ".full" in op for op in r.opcodes), name
        if name.startswith("ln_fwd"):
            # mean_hi, mean_lo and the variance: three divisions by D.
            assert r.count("sqrt.rn.f32") == 1 and r.count("div.rn.f32") == 3, name


def _main_kernels(reports):
    """(name, report, direction, mapping, storage, vec) of every forward/backward
    kernel."""
    for name, r in reports.items():
        m = MAIN.fullmatch(name)
        if m:
            yield name, r, m.group(1), m.group(2), m.group(3), int(m.group(4))


def test_main_kernels_touch_each_element_once(compiled):
    _, reports, _ = compiled
    for name, r, direction, _, storage, vec in _main_kernels(reports):
        row = (
            E // vec,
            E * ITEMSIZE[storage],
        )  # instructions and bytes per thread per row
        stat = (1, 4)  # one float32 per row
        if direction == "fwd":
            assert r.per_argument("ld") == {"x": row, "gamma": row, "beta": row}, name
            assert r.per_argument("st") == {
                "y": row,
                "mean_hi": stat,
                "mean_lo": stat,
                "rstd": stat,
            }, name
        else:
            assert r.per_argument("ld", in_loop=True) == {
                "x": row,
                "dy": row,
                "mean_hi": stat,
                "mean_lo": stat,
                "rstd": stat,
            }, name
            # gamma once per strip, into registers
            assert r.per_argument("ld", in_loop=False) == {"gamma": row}, name
            assert r.per_argument("st", in_loop=True) == {"dx": row}, name
            # float32 column sums, written after the strip, at most 16 bytes per store
            partial = (E // min(vec, 4), E * 4)
            assert r.per_argument("st", in_loop=False) == {
                "dgamma_part": partial,
                "dbeta_part": partial,
            }, name


def test_grouped_backward_is_v4_with_block_partials(compiled):
    """v5: v4's loads, stores and shuffles per row, the rows' with a streaming
    hint; the partial row written once per block (after the groups' hand-over,
    outside the row loop); two barriers per row sum, and two per hand-over
    round; the hand-over buffer in shared memory. The variants of 16-byte
    vectors copy x and dy into shared memory with cp.async instead of loading
    them: the first rows before the loop, the next row in it, the same
    instructions and bytes as v4's loads; one wait per row."""
    _, reports, _ = compiled
    grouped = {n: r for n, r in reports.items() if GROUPED.fullmatch(n)}
    assert len(grouped) == 4  # 16-byte vectors only
    rows = {"x", "dy"}
    for name, r in grouped.items():
        mapping, _, vec = GROUPED.fullmatch(name).groups()
        staged = vec != "1"
        v4 = reports[name.replace("_grouped", "")]
        v4_loads = v4.per_argument("ld", in_loop=True)
        for kind in ("ld", "st"):
            for in_loop in (True, False):
                want = v4.per_argument(kind, in_loop=in_loop)
                if staged and kind == "ld":
                    want = {a: n for a, n in want.items() if a not in rows}
                assert r.per_argument(kind, in_loop=in_loop) == want, (
                    name, kind, in_loop)
        copies = {a: n for a, n in v4_loads.items() if a in rows} if staged else {}
        assert r.per_argument("cp", in_loop=True) == copies, name
        # the rows before the loop: all in flight but the one the loop adds
        # (a warp's rows are short: it keeps more of them in flight)
        in_flight = C["LN_BWD_ROWS_IN_FLIGHT"] if mapping == "block" else C[
            "LN_BWD_WARP_ROWS_IN_FLIGHT_" + ("F16" if "_f16_" in name else "F32")]
        ahead = in_flight - 1
        assert r.per_argument("cp", in_loop=False) == {
            a: (ahead * n, ahead * b) for a, (n, b) in copies.items()}, name
        assert r.count("cp.async.wait_group") == (1 if staged else 0), name
        assert r.count("shfl.sync.bfly") == v4.count("shfl.sync.bfly"), name
        # x, dy and dx, read or written once, with the streaming hint (the
        # copies: .cg, through L2 only); nothing else (gamma, the statistics,
        # the partial sums), and nothing in v4
        loads = r.per_argument("ld", in_loop=True)
        streamed = 0 if staged else loads["x"][0] + loads["dy"][0]
        assert r.count("ld.global.cs") == streamed, name
        assert r.count("cp.async.ca") == 0, name
        assert r.count("st.global.cs") == r.per_argument("st", in_loop=True)["dx"][0]
        assert v4.count("ld.global.cs") == v4.count("st.global.cs") == 0
        largest = C["LN_MAX_ROW_THREADS"] if mapping == "block" else 32 * C[
            "LN_WARPS_PER_BLOCK"]
        hand_over = 2 * 4 * C["LN_ELEMS_PER_THREAD"] * largest // 2
        if mapping == "block":
            assert r.count("bar.sync") == 2 + 2, name
            assert r.shared_bytes == hand_over + 2 * 8 * C["LN_MAX_ROW_THREADS"] // 32
        else:
            assert r.count("bar.sync") == 2 and r.shared_bytes == hand_over, name


def _rows_in_flight(name: str) -> int:
    """Rows in flight of a v5 kernel of a block, by its name."""
    fwd = name.startswith("ln_fwd")
    return C["LN_FWD_ROWS_IN_FLIGHT" if fwd else "LN_BWD_ROWS_IN_FLIGHT"]


def test_reductions_use_shuffles_and_little_shared_memory(compiled):
    _, reports, _ = compiled
    for name, r, direction, mapping, _, _ in _main_kernels(reports):
        # Forward: three float row sums (mean_hi, mean_lo, variance); backward:
        # one float2 (two floats). Each 5 butterfly steps per warp level.
        levels = 2 if mapping == "block" else 1
        floats = 3 if direction == "fwd" else 2
        assert r.count("shfl.sync.bfly") == floats * 5 * levels, name
        if mapping == "warp":
            assert r.shared_bytes == 0 and r.count("bar.sync") == 0, name
        else:
            value_bytes = (
                4 if direction == "fwd" else 8
            )  # float, or float2 for the backward
            # 33 slots: one per warp, and one for the result
            assert r.shared_bytes == 33 * value_bytes, name
            # two barriers per row sum, not three
            assert r.count("bar.sync") == 2 * (3 if direction == "fwd" else 1), name


def test_long_row_kernels_read_the_row_once_per_pass(compiled):
    """The long-row kernels re-read the row: the passes the model counts, and
    their row sums as the block kernels make them."""
    _, reports, _ = compiled
    seen = 0
    for name, r in reports.items():
        m = LONG.fullmatch(name)
        if not m:
            continue
        seen += 1
        direction, storage, vec = m.group(1), m.group(2), int(m.group(3))
        # One chunk of one pass, per thread: instructions and bytes.
        row = (E // vec, E * ITEMSIZE[storage])
        stat = (1, 4)

        def passes(n):
            return (n * row[0], n * row[1])

        if direction == "fwd":
            # x: the sum, the correction of the mean, the variance, the output.
            assert r.per_argument("ld", in_loop=True) == {
                "x": passes(4), "gamma": row, "beta": row}, name
            assert r.per_argument("st", in_loop=True) == {"y": row}, name
            assert r.per_argument("st", in_loop=False) == {
                "mean_hi": stat, "mean_lo": stat, "rstd": stat}, name
        else:
            # x, dy and gamma: the two row sums, then dx (gamma once a chunk);
            # the row statistics in both passes; the strip's float32 column
            # sums written once per chunk, never read, at most 16 bytes an
            # instruction.
            partial = (E // min(vec, 4), E * 4)
            twice = (2, 8)
            assert r.per_argument("ld", in_loop=True) == {
                "x": passes(2), "dy": passes(2), "gamma": passes(2),
                "mean_hi": twice, "mean_lo": twice, "rstd": twice}, name
            assert r.per_argument("st", in_loop=True) == {
                "dx": row, "dgamma_part": partial, "dbeta_part": partial}, name
        floats = 3 if direction == "fwd" else 2
        assert r.count("shfl.sync.bfly") == floats * 5 * 2, name
        if direction == "fwd":  # three row sums of two barriers
            assert r.count("bar.sync") == 6 and r.shared_bytes == 33 * 4, name
        else:  # one row sum, and one barrier before the strip's means are read
            assert r.count("bar.sync") == 3, name
            assert r.shared_bytes == 33 * 8 + C["LN_LONG_STRIP"] * 8, name
    assert seen == 8


def test_grouped_long_kernels_read_the_row_from_dram_once(compiled):
    """v5 past max_D(): x (and dy) copied into shared memory once a row, the
    rows in flight but one before the loop, one in the loop, where v4's
    long-row kernels load x four times (forward) or x and dy twice (backward)
    from global memory. The backward reads its copy from shared memory twice
    (the row sums, then dx); gamma is loaded once a strip, the column sums
    stored once a strip. Two barriers per row sum, none other."""
    _, reports, _ = compiled
    long_e = C["LN_LONG_ELEMS_PER_THREAD"]
    found = {n: r for n, r in reports.items() if GROUPED_LONG.fullmatch(n)}
    assert len(found) == 3  # the backward of both dtypes, the forward of float16
    for name, r in found.items():
        direction, storage, vec = GROUPED_LONG.fullmatch(name).groups()
        vec = int(vec)
        assert vec * ITEMSIZE[storage] == 16, name
        row = (long_e // vec, long_e * ITEMSIZE[storage])  # a thread's vectors
        stat = (1, 4)
        if direction == "fwd":
            ahead = C["LN_FWD_ROWS_IN_FLIGHT"] - 1
            rows = ("x",)
            assert r.per_argument("ld", in_loop=True) == {
                "gamma": row, "beta": row}, name
            assert r.per_argument("st", in_loop=True) == {
                "y": row, "mean_hi": stat, "mean_lo": stat, "rstd": stat}, name
            assert r.count("bar.sync") == 2 * 3 and r.shared_bytes == 4 * 32, name
            assert r.count("ld.shared.v4") == row[0], name  # the row, once
        else:
            ahead = C["LN_BWD_ROWS_IN_FLIGHT"] - 1
            rows = ("x", "dy")
            assert r.per_argument("ld", in_loop=True) == {
                "mean_hi": stat, "mean_lo": stat, "rstd": stat}, name
            assert r.per_argument("ld", in_loop=False) == {"gamma": row}, name
            assert r.per_argument("st", in_loop=True) == {"dx": row}, name
            partial = (long_e // 4, long_e * 4)
            assert r.per_argument("st", in_loop=False) == {
                "dgamma_part": partial, "dbeta_part": partial}, name
            assert r.count("bar.sync") == 2 and r.shared_bytes == 8 * 32, name
            # x and dy from shared memory, twice
            assert r.count("ld.shared.v4") == 2 * 2 * row[0], name
        assert r.per_argument("cp", in_loop=True) == {a: row for a in rows}, name
        assert r.per_argument("cp", in_loop=False) == {
            a: (ahead * row[0], ahead * row[1]) for a in rows}, name
        assert r.count("cp.async.wait_group") == 1 and r.count("cp.async.ca") == 0
        assert r.count("st.global.cs") == row[0], name  # y or dx, streamed
        assert r.count("shfl.sync.bfly") == (3 if direction == "fwd" else 2) * 5 * 2


def test_parameter_reduction_kernel(compiled):
    _, reports, _ = compiled
    for name, slices in (("ln_bwd_reduce_params", C["LN_REDUCE_SLICES"]),
                         ("ln_bwd_reduce_params_wide", C["LN_REDUCE_SLICES_WIDE"])):
        r = reports[name]
        assert set(r.per_argument("ld")) == {"dgamma_part", "dbeta_part"}
        assert r.per_argument("st") == {"dgamma": (1, 4), "dbeta": (1, 4)}
        assert r.shared_bytes == 2 * slices * 32 * 4
        assert r.max_threads == 32 * slices
        assert r.count("atom") == 0


def test_wide_second_stage_batches_its_loads(compiled):
    """v5's second stage: LN_REDUCE_BATCH loads of each array side by side in
    its loop, before the adds; v4's loop as NVRTC unrolls it, four loads and
    one in the loop of the remaining rows."""
    _, reports, _ = compiled
    r = reports["ln_bwd_reduce_params_wide"]
    wide = r.per_argument("ld", in_loop=True)
    assert C["LN_REDUCE_BATCH"] == wide["dgamma_part"][0] == wide["dbeta_part"][0]
    # every load of a batch before the first float add (the loads sit in
    # blocks of their own, behind the guard p < row_groups)
    lines = [ln for ln in r.lines
             if ln.startswith("ld.global") or re.match(r"add(\.rn)?\.f32", ln)]
    first_add = next(i for i, ln in enumerate(lines) if ln.startswith("add"))
    assert first_add == 2 * C["LN_REDUCE_BATCH"], lines[:20]
    v4 = reports["ln_bwd_reduce_params"].per_argument("ld", in_loop=True)
    assert v4["dgamma_part"][0] == v4["dbeta_part"][0] == 4 + 1


def test_registers_fit_the_block_and_nothing_spills(compiled):
    arch, reports, usage = compiled
    if usage is None:
        pytest.skip("ptxas (nvidia-cuda-nvcc-cu12) is not installed")
    assert set(usage) == ALL_KERNELS
    for name, u in usage.items():
        assert u.spill_stores == 0 and u.spill_loads == 0 and u.stack_frame == 0, (
            arch,
            name,
            u,
        )
        # 65536 registers per SM: the largest block must still launch.
        assert u.registers * reports[name].max_threads <= 65536, (arch, name, u)
        # ptxas rounds up to 16 bytes in the backward's module, which declares
        # v5's 16-byte aligned dynamic buffer.
        assert 0 <= u.shared_bytes - reports[name].shared_bytes < 16, (arch, name, u)


def test_ptx_attributes_loads_to_arguments():
    """The address tracing on a tiny hand-checked kernel."""
    src = """
.visible .entry k(
	.param .u64 k_param_0,
	.param .u64 k_param_1,
	.param .u32 k_param_2
)
.maxntid 64, 1, 1
{
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	ld.param.u32 	%r1, [k_param_2];
	cvta.to.global.u64 	%rd3, %rd1;
	cvta.to.global.u64 	%rd4, %rd2;
	mul.wide.s32 	%rd5, %r1, 4;
	add.s64 	%rd6, %rd3, %rd5;
$L__BB0_1:
	ld.global.nc.v4.f32 	{%f1, %f2, %f3, %f4}, [%rd6];
	add.s64 	%rd7, %rd4, %rd5;
	st.global.u16 	[%rd7+2], %rs1;
	@%p1 bra 	$L__BB0_1;
	st.global.f32 	[%rd3], %f1;
	ret;
}
"""
    r = ptx.inspect_ptx(src, {"k": ("src", "dst", "n")})["k"]
    assert r.max_threads == 64
    assert [
        (o.kind, o.argument, o.vector, o.bits, o.in_loop, o.offset)
        for o in r.memory_ops
    ] == [
        ("ld", "src", 4, 32, True, 0),
        ("st", "dst", 1, 16, True, 2),
        ("st", "src", 1, 32, False, 0),
    ]
    assert r.per_argument("st") == {"dst": (1, 2), "src": (1, 4)}
    assert r.per_argument("st", in_loop=False) == {"src": (1, 4)}
    assert r.lines[0] == "ld.param.u64 \t%rd1, [k_param_0];" and r.lines[-1] == "ret;"
    assert "bra \t$L__BB0_1;" in r.lines  # the guard @%p1 is removed


# --- the NumPy emulation, on any machine ----------------------------------------------


def _lane_by_lane_row_sum(row: np.ndarray, p) -> np.float32:
    """The kernels' row sum simulated one lane at a time, straight from the CUDA
    source."""
    G, vec, nvec = p.threads_per_row, p.vec, -(-p.D // p.vec)  # a tail: one
    partial = [np.float32(0)] * G
    vpt = E // vec
    for t in range(G):
        for c in range(p.chunks):  # the long-row kernels' chunks, in order
            for i in range(vpt):
                v = t + (c * vpt + i) * G
                if v >= nvec:
                    continue
                for k in range(min(vec, p.D - v * vec)):  # a tail: its own
                    partial[t] = np.float32(partial[t] + row[v * vec + k])

    def warp_sum(lanes):
        lanes = list(lanes)
        for offset in (16, 8, 4, 2, 1):
            lanes = [np.float32(lanes[i] + lanes[i ^ offset]) for i in range(32)]
        assert len({float(v) for v in lanes}) == 1  # every lane holds the same sum
        return lanes[0]

    warps = [warp_sum(partial[w : w + 32]) for w in range(0, G, 32)]
    if not p.per_block:
        return warps[0]
    return warp_sum(warps + [np.float32(0)] * (32 - len(warps)))


@pytest.mark.parametrize("D", [7, 100, 512, 1027, 4096, 12288, 16387])
def test_emulated_row_sum_follows_the_kernel_order(D):
    rng = np.random.default_rng(D)
    # Magnitudes over 16 decades: the sum depends on the order of additions.
    a = (rng.standard_normal((6, D)) * 10.0 ** rng.uniform(-8, 8, (6, D))).astype(
        np.float32
    )
    p = kernels.plan(6, D, np.float32)
    got = emulate.row_sum(a, p)
    want = np.array([_lane_by_lane_row_sum(row, p) for row in a], dtype=np.float32)
    np.testing.assert_array_equal(got, want)
    sequential = np.array([np.cumsum(row, dtype=np.float32)[-1] for row in a])
    if D >= 100:  # the order matters here: the comparison above has teeth
        assert np.any(got != sequential)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows, D", SHAPES)
def test_emulation_matches_lnorm(rows, D, dtype):
    inp = check.make_inputs(rows, D, dtype, seed=rows + D)
    got = check.forward_backward(emulate.forward, emulate.backward, inp)
    assert got["y"].dtype == got["dx"].dtype == np.dtype(dtype)
    assert {
        got[k].dtype for k in ("dgamma", "dbeta", "mean_hi", "mean_lo", "rstd")
    } == {np.dtype(np.float32)}
    err = check.relative_errors(got, check.reference(inp))
    for name, bound in BOUND[dtype].items():
        assert err[name] <= bound, (name, err[name])


def test_emulation_keeps_leading_dimensions_and_zero_rows():
    inp = check.make_inputs(6, 20, np.float32, seed=5)
    x3 = inp["x"].reshape(2, 3, 20)
    y, hi, lo, rstd = emulate.forward(x3, inp["gamma"], inp["beta"])
    assert y.shape == (2, 3, 20) and hi.shape == lo.shape == rstd.shape == (2, 3)
    y2, _, _, _ = emulate.forward(inp["x"], inp["gamma"], inp["beta"])
    np.testing.assert_array_equal(y.reshape(6, 20), y2)
    empty = np.zeros((0, 20), np.float32)
    none = np.zeros(0, np.float32)
    dx, dgamma, dbeta = emulate.backward(empty, empty, inp["gamma"], none, none, none)
    assert dx.shape == (0, 20) and not dgamma.any() and not dbeta.any()


def test_float16_outputs_past_the_range_round_to_inf_without_a_warning():
    # cvt.rn.f16.f32 rounds a float32 past 65504 to +-inf; so does the
    # emulation, quietly (NumPy would warn about the overflowing cast).
    x = np.zeros((2, 8), np.float16)
    x[0, :2] = 60000, -60000
    gamma = np.full(8, 60000, np.float16)
    dy = np.zeros_like(x)
    dy[0, 2] = 60000  # dx[0, 2] = rstd * (g - mean(g) - ...) is about 1.3e5
    with np.errstate(over="raise"):
        y, hi, lo, rstd = emulate.forward(x, gamma, np.zeros(8, np.float16))
        dx, _, _ = emulate.backward(dy, x, gamma, hi, lo, rstd)
    assert y.dtype == np.float16 and y[0, 0] == np.inf and y[0, 1] == -np.inf
    assert dx[0, 2] == np.inf and np.all(np.isfinite(np.delete(dx[0], 2)))


def test_v3_order_of_the_atomics():
    """Any finishing order of the row groups stays within order_bound of v4's
    fixed order; some orders change the bits; a wrong sum is caught."""
    inp = check.make_inputs(300, 64, "float32", seed=5)
    stats = emulate.forward(inp["x"], inp["gamma"], inp["beta"])[1:]
    args = (inp["dy"], inp["x"], inp["gamma"], *stats)
    v4 = emulate.backward(*args)
    part = emulate.column_partials(inp["dy"], inp["x"], *stats)[0]
    bound = check.order_bound(part)
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(20):
        order = rng.permutation(part.shape[0])
        got = emulate.backward(*args, rung="v3", order=order)[1]
        assert (np.abs(got.astype(np.float64) - v4[1]) <= bound).all()
        differ += got.tobytes() != v4[1].tobytes()
    assert differ > 0
    assert check.atomic_check(emulate.backward, inp)["within"]

    def off_by_bound(*a, rung):
        dx, dgamma, dbeta = emulate.backward(*a, rung=rung)
        return dx, dgamma + np.float32(2 * bound.max()), dbeta

    r = check.atomic_check(off_by_bound, inp)
    assert r["dx_equal"] and not r["within"] and r["gap"] > r["bound"]
    with pytest.raises(ValueError, match="permutation"):
        emulate.add_in_order(part, [0, 0, *range(2, part.shape[0])])


def test_atomic_kernel_name():
    assert kernels.plan(33, 2048, "float16", "v3").kernel("backward") == (
        "ln_bwd_atomic_block_f16_v8")
    assert kernels.plan(33, 2048, "float16", "v3").kernel("forward") == (
        "ln_fwd_block_f16_v8")  # the forward is the same for every rung


@pytest.mark.parametrize("rows, D, dtype, rung", [
    (4, 8200, "float32", "v3"),  # past registers
    (4, 12296, "float32", "v5"),  # past v5's
    (4, 65537, "float16", "v5"),
    (4, 4097, "float16", "v5"),  # not a multiple of the vector
    (4, 513, "float32", "v5"),
    (300, 7, "float32", "v5"),
])
def test_a_rung_without_a_kernel_runs_v4_and_says_so(rows, D, dtype, rung):
    p, v4 = kernels.plan(rows, D, dtype, rung), kernels.plan(rows, D, dtype)
    assert p.rung == "v4" and p.note == (
        f"{rung} has no kernel for rows of {D} {dtype}: v4's kernels run")
    assert replace(p, note="") == v4 and v4.note == ""
    assert rung not in kernels.rungs_for(D, dtype)
    inp = check.make_inputs(3, D, dtype, seed=1)
    got = check.forward_backward(emulate.forward, emulate.backward, inp, rung)
    want = check.forward_backward(emulate.forward, emulate.backward, inp)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_v5_kernels_by_shape():
    """v5's own kernels: rows of 16-byte vectors up to max_D("v5"); its
    forward only for float16 rows past max_D()."""
    for rows, D, dtype, direction, name in (
            (4, 12288, "float32", "backward", "ln_bwd_grouped_long_f32_v4"),
            (4, 12288, "float32", "forward", "ln_fwd_long_f32_v4"),
            (4, 12288, "float16", "forward", "ln_fwd_grouped_long_f16_v8"),
            (4, 8200, "float16", "forward", "ln_fwd_grouped_long_f16_v8"),
            (4, 4096, "float16", "forward", "ln_fwd_block_f16_v8"),
            (4, 4096, "float16", "backward", "ln_bwd_grouped_block_f16_v8"),
            (4, 64, "float32", "backward", "ln_bwd_grouped_warp_f32_v4")):
        p = kernels.plan(rows, D, dtype, "v5")
        assert p.rung == "v5" and p.note == "" and p.kernel(direction) == name
    with pytest.raises(ValueError, match="rung must be one of"):
        kernels.plan(4, 64, "float32", "v6")


@pytest.mark.parametrize("rung", ["v4", "v5"])
def test_emulated_backward_takes_other_strips(rung):
    """``rows_per_group``: the same dx bits; dgamma and dbeta the second stage's
    sums of that strip's partial rows, which the plan's strip orders otherwise."""
    rows, D = 70, 1030
    inp = check.make_inputs(rows, D, "float32", seed=3)
    x, dy, g, b = (inp[k] for k in ("x", "dy", "gamma", "beta"))
    stats = emulate.forward(x, g, b, rung=rung)[1:]
    base = emulate.backward(dy, x, g, *stats, rung=rung)
    p = kernels.plan(rows, D, "float32", rung)
    for r in (1, 7, rows):
        q = p.with_strip(r)
        assert (q.rows_per_group, q.row_groups) == (r, -(-rows // r))
        assert q.partial_rows == (q.row_groups if rung == "v4"
                                  else -(-q.row_groups // q.groups_per_block))
        got = emulate.backward(dy, x, g, *stats, rung=rung, rows_per_group=r)
        parts = emulate.column_partials(dy, x, *stats, rung=rung, rows_per_group=r)
        assert parts[0].shape == (q.partial_rows, D)
        slices = q.reduce_launch()[2][1]
        assert got[0].tobytes() == base[0].tobytes()
        for k in (1, 2):
            want = emulate.reduce_partials(parts[k - 1], slices)
            assert got[k].tobytes() == want.tobytes()
            np.testing.assert_allclose(got[k], base[k], rtol=1e-5, atol=1e-4)
    assert not np.array_equal(
        emulate.backward(dy, x, g, *stats, rung=rung, rows_per_group=1)[1], base[1])
    with pytest.raises(ValueError, match="rows_per_group"):
        p.with_strip(0)


@pytest.fixture(scope="module")
def fused():
    if not GPU_OK:
        pytest.skip(f"needs a CUDA device: {GPU_REASON}")
    return gpu.FusedLayerNorm()


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows, D", SHAPES + [(4096, 768), (20000, 100)])
def test_kernels_match_lnorm_and_the_emulation_bit_for_bit(fused, rows, D, dtype):
    inp = check.make_inputs(rows, D, dtype, seed=rows + D)
    got = check.forward_backward(fused.forward, fused.backward, inp)
    err = check.relative_errors(got, check.reference(inp))
    for name, bound in BOUND[dtype].items():
        assert err[name] <= bound, (name, err[name])
    want = check.forward_backward(emulate.forward, emulate.backward, inp)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows, D", [(5000, 64), (300, 512), (100, 1027), (8192, 4096)])
def test_atomic_backward_v3_on_the_gpu(fused, rows, D, dtype):
    r = check.atomic_check(fused.backward, check.make_inputs(rows, D, dtype, seed=D))
    assert r["dx_equal"] and r["within"], r


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows, D", [(5000, 64), (300, 768), (100, 1027), (8192, 4096),
                                     (300, 12288), (3, 12290), (64, 40000)])
def test_grouped_backward_v5_on_the_gpu(fused, rows, D, dtype):
    if not fused.takes(rows, D, dtype, "v5"):
        pytest.skip(f"this GPU cannot launch v5 at {rows} x {D} {dtype} (clusters "
                    "need sm_90, prefetch buffers the shared memory)")
    inp = check.make_inputs(rows, D, dtype, seed=D)
    got = check.forward_backward(fused.forward, fused.backward, inp, "v5")
    want = check.forward_backward(emulate.forward, emulate.backward, inp, "v5")
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@needs_gpu
def test_kernels_are_deterministic(fused):
    inp = check.make_inputs(30000, 1000, "float32", seed=11)
    first, second = (
        check.forward_backward(fused.forward, fused.backward, inp) for _ in range(2)
    )
    for name in first:
        assert first[name].tobytes() == second[name].tobytes(), name


@needs_gpu
def test_misaligned_and_strided_inputs_give_the_same_result(fused):
    import cupy as cp

    inp = check.make_inputs(64, 256, "float32", seed=2)
    flat = cp.zeros(64 * 256 + 1, dtype=cp.float32)
    flat[1:] = cp.asarray(inp["x"]).ravel()
    x_misaligned = flat[1:].reshape(64, 256)  # 4 bytes past a 16-byte boundary
    y1 = fused.forward(x_misaligned, inp["gamma"], inp["beta"])[0]
    y2 = fused.forward(inp["x"], inp["gamma"], inp["beta"])[0]
    np.testing.assert_array_equal(y1.get(), y2.get())


@needs_gpu
def test_kernels_take_zero_rows(fused):
    x = np.zeros((0, 64), np.float32)
    g = np.ones(64, np.float32)
    y, hi, lo, rstd = fused.forward(x, g, g)
    assert y.shape == (0, 64) and hi.shape == lo.shape == rstd.shape == (0,)
    dx, dgamma, dbeta = fused.backward(x, x, g, hi, lo, rstd)
    assert dx.shape == (0, 64) and not dgamma.get().any() and not dbeta.get().any()


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_strided_and_misaligned_backward_inputs(fused, dtype):
    import cupy as cp

    inp = check.make_inputs(48, 264, dtype, seed=8)
    want = check.forward_backward(fused.forward, fused.backward, inp)
    wide = cp.zeros((48, 2 * 264), dtype=dtype)
    wide[:, ::2] = cp.asarray(inp["dy"])  # strided: every other column
    flat = cp.zeros(48 * 264 + 1, dtype=dtype)
    flat[1:] = cp.asarray(inp["x"]).ravel()  # one element past an aligned start
    x_off = flat[1:].reshape(48, 264)
    dx, dgamma, dbeta = fused.backward(
        wide[:, ::2],
        x_off,
        inp["gamma"],
        *(cp.asarray(want[k]) for k in ("mean_hi", "mean_lo", "rstd")),
    )
    for name, got in (("dx", dx), ("dgamma", dgamma), ("dbeta", dbeta)):
        np.testing.assert_array_equal(got.get(), want[name], err_msg=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=needs_gpu)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_unfused_version_matches_lnorm(device, dtype):
    """The op-by-op comparison code: NumPy arrays on the CPU, CuPy arrays on a GPU."""
    inp = check.make_inputs(300, 1027, dtype, seed=4)
    if device == "gpu":
        import cupy as cp

        inp_dev = {k: cp.asarray(v) for k, v in inp.items()}
    else:
        inp_dev = inp
    got = check.forward_backward(
        gpu.run.unfused_forward, gpu.run.unfused_backward, inp_dev
    )
    assert (
        got["y"].dtype == got["dx"].dtype == np.dtype(dtype)
        and got["dgamma"].dtype == np.float32
    )
    err = check.relative_errors(got, check.reference(inp))
    # Twice the kernels' bounds: its column sums go over the rows in the
    # library's order, not the kernels' (on the CPU at most 0.71 of BOUND);
    # an eps of 1e-12 instead of 1e-5 moves float32 y by about 5e-6.
    for name, bound in BOUND[dtype].items():
        assert err[name] <= 2 * bound, (name, err[name])


def test_unfused_version_keeps_leading_dimensions():
    inp = check.make_inputs(6, 20, "float16", seed=6)
    x3, dy3 = inp["x"].reshape(2, 3, 20), inp["dy"].reshape(2, 3, 20)
    y, hi, lo, rstd = gpu.run.unfused_forward(x3, inp["gamma"], inp["beta"])
    assert y.shape == (2, 3, 20) and hi.shape == lo.shape == rstd.shape == (2, 3)
    dx, dgamma, dbeta = gpu.run.unfused_backward(dy3, x3, inp["gamma"], hi, lo, rstd)
    assert dx.shape == (2, 3, 20) and dx.dtype == np.float16 and dgamma.shape == (20,)
    y2, hi2, lo2, rstd2 = gpu.run.unfused_forward(inp["x"], inp["gamma"], inp["beta"])
    dx2, dgamma2, dbeta2 = gpu.run.unfused_backward(
        inp["dy"], inp["x"], inp["gamma"], hi2, lo2, rstd2
    )
    for a, b in ((y, y2), (dx, dx2), (dgamma, dgamma2), (dbeta, dbeta2)):
        np.testing.assert_array_equal(a.reshape(b.shape), b)


# --- the launch code, with a stand-in for CuPy ----------------------------------------


class _HostArray(np.ndarray):
    """A NumPy array posing as a device array: it has ``.data.ptr`` like CuPy's."""

    @property
    def data(self):
        return type("Mem", (), {"ptr": self.__array_interface__["data"][0]})()


def _fake_cupy(launches, ptx_types):
    """A stand-in ``cupy`` whose kernels check their arguments and run the emulation."""
    import types

    from cupy.cuda import nvrtc as real_nvrtc

    def host(a):
        return np.asarray(a).view(_HostArray)

    class Kernel:
        """A RawKernel: CUDA refuses more dynamic shared memory than the
        kernel's attribute allows (48 KiB unless raised)."""

        def __init__(self, name):
            self.name, self.max_dynamic_shared_size_bytes = name, 48 * 1024
            self.shared = []

        def __call__(self, grid, block, args, shared_mem=0):
            assert shared_mem <= self.max_dynamic_shared_size_bytes, self.name
            self.shared.append(shared_mem)
            launch(self.name, grid, block, args)

    def launch(name, grid, block, args):
        types_ = ptx_types[name]
        assert len(args) == len(types_), name
        for a, t in zip(args, types_):
            if t == "u64":
                assert isinstance(a, _HostArray) and a.flags.c_contiguous, (
                    name,
                    t,
                    type(a),
                )
                assert a.__array_interface__["data"][0] % 16 == 0 or a.size == 0
            else:
                assert type(a) is {"u32": np.int32, "f32": np.float32}[t], (
                    name,
                    t,
                    type(a),
                )
        launches.append((name, grid, block, args))

    cuda = types.ModuleType("cupy.cuda")
    cuda.nvrtc = real_nvrtc
    cuda.is_available = lambda: True
    cuda.Device = lambda: types.SimpleNamespace(id=0, compute_capability="80")
    cuda.runtime = types.SimpleNamespace(
        getDeviceProperties=lambda i: {"name": b"stand-in"},
        cudaDevAttrMaxSharedMemoryPerBlockOptin=97,
        # an A100's opt-in limit, 163 KiB
        deviceGetAttribute=lambda attr, i: {97: 163 * 1024}[attr],
    )
    cp = types.ModuleType("cupy")
    cp.cuda = cuda
    cp.float32 = np.float32
    cp.asarray = lambda a, dtype=None: host(np.asarray(a, dtype=dtype))
    cp.ascontiguousarray = lambda a: host(np.ascontiguousarray(a))
    cp.empty_like = lambda a: host(np.empty_like(a))
    cp.empty = lambda shape, dtype: host(np.empty(shape, dtype))
    cp.zeros = lambda shape, dtype: host(np.zeros(shape, dtype))
    cp.RawModule = lambda path: types.SimpleNamespace(get_function=Kernel)
    return cp, cuda


def test_launch_arguments_match_the_kernel_signatures(monkeypatch):
    """FusedLayerNorm's launches, checked against the PTX parameter list and the plan.
    """
    ptx_types = {}
    params = {}  # every kernel of every file: its argument names
    for f in kernels.KERNEL_FILES:
        params.update(kernels.kernel_params(f))
        for name, r in ptx.inspect_ptx(kernels.compile_ptx(f, "sm_80")).items():
            ptx_types[name] = r.param_types
    launches = []
    cp, cuda = _fake_cupy(launches, ptx_types)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    assert gpu.available() == (True, "stand-in")
    fused = gpu.FusedLayerNorm()
    for rows, D, dtype in [
        (37, 7, np.float16),
        (37, 1027, np.float32),
        (40, 8192, np.float16),
        (24, 12288, np.float16),  # a long-row kernel (v4), in shared memory (v5)
        (24, 65537, np.float16),  # a long-row kernel of scalars: v4 only
        (24, 9002, np.float16),  # a tail past registers (v5: one block)
    ]:
        inp = check.make_inputs(rows, D, dtype, seed=1)
        p = kernels.plan(rows, D, dtype)
        launches.clear()
        y, hi, lo, rstd = fused.forward(inp["x"], inp["gamma"], inp["beta"], eps=1e-3)
        name, grid, block, args = launches[0]
        assert (
            name == p.kernel("forward")
            and block == (p.block,)
            and grid == (p.forward_grid,)
        )
        rows_per_block = p.block // p.threads_per_row
        assert grid[0] * rows_per_block >= rows > (grid[0] - 1) * rows_per_block
        named = dict(zip(params[name], args))
        np.testing.assert_array_equal(named["x"], inp["x"])
        assert named["y"] is y and named["mean_hi"] is hi and named["mean_lo"] is lo
        assert named["rstd"] is rstd
        assert (named["rows"], named["D"], named["eps"]) == (rows, D, np.float32(1e-3))

        launches.clear()
        dx, dgamma, dbeta = fused.backward(
            inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd
        )
        (name, grid, block, args), (rname, rgrid, rblock, rargs) = launches
        assert (
            name == p.kernel("backward")
            and block == (p.block,)
            and grid == (p.backward_grid,)
        )
        named = dict(zip(params[name], args))
        np.testing.assert_array_equal(named["dy"], inp["dy"])
        np.testing.assert_array_equal(named["x"], inp["x"])
        assert named["dx"] is dx and named["dgamma_part"].shape == (p.row_groups, D)
        assert (named["rows_per_group"], named["row_groups"]) == (
            p.rows_per_group,
            p.row_groups,
        )
        groups_per_block = p.block // p.threads_per_row
        assert grid[0] * groups_per_block >= p.row_groups
        reduce_named = dict(zip(params[rname], rargs))
        assert rname == "ln_bwd_reduce_params" and rblock == (32, C["LN_REDUCE_SLICES"])
        assert rgrid[0] * 32 >= D > (rgrid[0] - 1) * 32
        assert reduce_named["dgamma_part"] is named["dgamma_part"]
        assert reduce_named["dgamma"] is dgamma and reduce_named["dbeta"] is dbeta

        rungs = kernels.rungs_for(D, dtype)
        if "v3" in rungs:  # rows held in registers
            launches.clear()
            dx, dgamma, dbeta = fused.backward(
                inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd, rung="v3"
            )
            ((name, grid, block, args),) = launches  # one launch, into dgamma itself
            p3 = kernels.plan(rows, D, dtype, "v3")
            assert name == p3.kernel("backward") and grid == (p3.backward_grid,)
            named = dict(zip(params[name], args))
            assert named["dx"] is dx and named["dgamma"] is dgamma
            assert named["dbeta"] is dbeta and named["row_groups"] == p.row_groups
            assert not dgamma.any() and not dbeta.any()  # zeros before the launch
        if "v5" not in rungs:  # long rows of scalars, or longer than v5 takes
            continue

        launches.clear()
        dx, dgamma, dbeta = fused.backward(
            inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd, rung="v5"
        )
        (name, grid, block, args), (rname, rgrid, rblock, rargs) = launches
        p5 = kernels.plan(rows, D, dtype, "v5")
        assert name == p5.kernel("backward") and grid == (p5.backward_grid,)
        # a block holds whole groups of threads_per_row threads, within the bounds
        assert block[0] % p.threads_per_row == 0
        assert block[0] <= C["LN_MAX_ROW_THREADS"] and block[0] >= p.block
        named = dict(zip(params[name], args))
        assert named["group_threads"] == p.threads_per_row
        assert named["dgamma_part"].shape == (p5.backward_grid, D)
        assert named["rows_per_group"] * block[0] // p.threads_per_row * grid[0] >= rows
        reduce_named = dict(zip(params[rname], rargs))
        assert reduce_named["row_groups"] == p5.backward_grid  # one row per block
        assert reduce_named["dgamma_part"] is named["dgamma_part"]
        # the prefetch buffers: float16 rows of 16-byte vectors only, here
        assert fused._functions[name].shared == [p5.backward_shared_bytes]
        assert (p5.backward_shared_bytes > 0) == (p5.vec > 1)
        # without the second stage: the backward kernel alone, its partial rows
        launches.clear()
        _, part_g, part_b = fused.backward(inp["dy"], inp["x"], inp["gamma"], hi,
                                           lo, rstd, rung="v5", second_stage=False)
        ((alone, *_, alone_args),) = launches
        alone_named = dict(zip(params[alone], alone_args))
        assert alone == name and part_g.shape == (p5.partial_rows, D)
        assert alone_named["dgamma_part"] is part_g
        assert alone_named["dbeta_part"] is part_b
        # another strip: the kernel's argument, grid and partial rows follow
        launches.clear()
        _, part_g, _ = fused.backward(inp["dy"], inp["x"], inp["gamma"], hi, lo,
                                      rstd, rung="v5", second_stage=False,
                                      rows_per_group=1)
        ((alone, grid1, _, args1),) = launches
        q = p5.with_strip(1)
        assert dict(zip(params[alone], args1))["rows_per_group"] == 1
        assert grid1 == (q.backward_grid,) and part_g.shape == (q.partial_rows, D)
        if "v3" in rungs:  # which has no second stage to leave out
            launches.clear()
            with pytest.raises(ValueError, match="no second stage"):
                fused.backward(inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd,
                               rung="v3", second_stage=False)
            assert launches == []

        # v5's forward: v4's, but for long float16 rows: v5's backward's
        # blocks, strips of its own
        launches.clear()
        fused.forward(inp["x"], inp["gamma"], inp["beta"], eps=1e-3, rung="v5")
        ((fname, fgrid, fblock, fargs),) = launches
        assert fname == p5.kernel("forward")
        if not fname.startswith("ln_fwd_grouped_"):
            assert (fgrid, fblock) == ((p.forward_grid,), (p.block,))
            assert fname == p.kernel("forward") and len(fargs) == 10
            continue
        assert (fgrid, fblock) == ((p5.forward_grid,), block)
        fnamed = dict(zip(params[fname], fargs))
        assert (fnamed["rows"], fnamed["D"]) == (rows, D)
        assert fnamed["eps"] == np.float32(1e-3)
        strip = fnamed["rows_per_group"]
        assert strip == p5.forward_rows_per_group >= 1
        groups = -(-rows // strip)  # every row in a strip, no block without one
        assert fgrid[0] == -(-groups // p5.groups_per_block)
        assert fnamed["group_threads"] == named["group_threads"]
        assert fused._functions[fname].shared == [p5.forward_shared_bytes]

    # The stand-in is an A100 (163 KiB of shared memory a block at most): v5's
    # float32 backward at 12288 (192 KiB of prefetch buffers) is refused with
    # a message, not launched; its forward (144 KiB) and v4 run.
    inp = check.make_inputs(4, 12288, np.float32, seed=1)
    y, hi, lo, rstd = fused.forward(inp["x"], inp["gamma"], inp["beta"], rung="v5")
    launches.clear()
    with pytest.raises(RuntimeError, match=r"196608 bytes of shared memory.*rung='v4'"):
        fused.backward(inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd, rung="v5")
    assert launches == []
    fused.backward(inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd)
    assert not fused.takes(4, 12288, "float32", "v5")
    assert fused.takes(4, 12288, "float16", "v5") and fused.takes(4, 12288, "float32")
    assert fused.takes(4, 12288, "float32", "v3")  # v4's kernels

    # No rows: no launch; sums over no rows, or no partial rows at all
    empty, none = np.zeros((0, 7), np.float32), np.zeros(0, np.float32)
    launches.clear()
    for rung in ("v4", "v5"):
        for second_stage, shape in ((True, (7,)), (False, (0, 7))):
            dx, dgamma, dbeta = fused.backward(
                empty, empty, np.ones(7, np.float32), none, none, none,
                rung=rung, second_stage=second_stage)
            assert dx.shape == (0, 7)
            assert dgamma.shape == dbeta.shape == shape
            assert not dgamma.any() and not dbeta.any()
    assert launches == []


# --- the time model ------------------------------------------------------------------


def test_model_of_v3_drops_the_partials_and_the_second_stage():
    v4 = model.predict("backward", 8192, 4096, "float16")
    v3 = model.predict("backward", 8192, 4096, "float16", rung="v3")
    p = kernels.plan(8192, 4096, "float16")
    assert v4.bytes_moved - v3.bytes_moved == p.partials_bytes and v3.bytes == v4.bytes
    # v3's first kernel moves less; the second stage (a launch, a latency) is gone
    assert v3.time < v4.time - model.H100.launch_overhead - model.H100.latency
    # v3's forward is v4's; past registers, v3 is v4
    assert model.predict("forward", 8192, 4096, "float32", rung="v3") == (
        model.predict("forward", 8192, 4096, "float32"))
    assert model.predict("backward", 8192, 12288, "float32", rung="v3") == (
        model.predict("backward", 8192, 12288, "float32"))
    with pytest.raises(ValueError, match="rows_per_group"):
        model.predict("forward", 8192, 4096, "float32", rows_per_group=32)


@pytest.mark.parametrize("rows, D, dtype", [
    (3000, 12288, "float32"), (5000, 4096, "float16"), (9000, 12288, "float16"),
    (4096, 8192, "float16")])
def test_v5_budget_strips_fill_whole_waves(rows, D, dtype):
    """Where the partials budget sets v5's backward strip and leaves k >= 1
    whole waves of row groups and some over, the strip is lengthened to the
    shortest whose groups fit in k waves: no last wave of a few groups. The
    budget still holds, and by the model the backward is at least as fast as
    with the budget's strip. Fewer groups than a wave keep the budget's."""
    p = kernels.plan(rows, D, dtype, "v5")
    v5 = model.predict("backward", rows, D, dtype, rung="v5")
    assert p.partials_bytes <= kernels.PARTIALS_BUDGET * v5.bytes
    budget_strip = _budget_strip(p)
    wave = p.groups_per_block * kernels.wave_blocks(p.backward_block)
    whole = rows // (budget_strip * wave)
    if whole == 0:
        assert p.rows_per_group == budget_strip
        return
    assert p.row_groups <= whole * wave < -(-rows // (p.rows_per_group - 1))
    assert p.rows_per_group >= budget_strip
    before = model.predict("backward", rows, D, dtype, rung="v5",
                           rows_per_group=budget_strip)
    assert v5.time <= before.time


def test_model_trades_strip_length_for_parallelism():
    """Longer strips: partial sums in proportion to 1/strip; groups at once limited
    by the groups there are."""
    base = model.predict("backward", 8192, 4096, "float16")
    p = kernels.plan(8192, 4096, "float16")
    for r in (16, 32, 64, 128):
        pr = model.predict("backward", 8192, 4096, "float16", rows_per_group=r)
        groups = -(-8192 // r)
        assert pr.bytes_moved - pr.bytes == 2 * 2 * 4 * groups * 4096
        assert pr.concurrent_groups == min(groups, base.concurrent_groups)
    same = model.predict("backward", 8192, 4096, "float16",
                         rows_per_group=p.rows_per_group)
    assert same == base
    for direction, D, r in (("forward", 4096, 32), ("backward", 12288, 32),
                            ("backward", 4096, 0)):
        with pytest.raises(ValueError, match="rows_per_group"):
            model.predict(direction, 8192, D, "float32", rows_per_group=r)


def test_model_refuses_a_block_that_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        model.predict("backward", 8192, 8192, "float32", registers=200)


def test_v5_meets_the_partials_budget_and_the_model_prefers_it():
    for D in (768, 1024, 4096, 8192):
        for dtype in ("float32", "float16"):
            v4 = model.predict("backward", 8192, D, dtype)
            v5 = model.predict("backward", 8192, D, dtype, rung="v5")
            p = kernels.plan(8192, D, dtype, "v5")
            assert p.partials_bytes <= kernels.PARTIALS_BUDGET * v5.bytes
            assert v5.bytes_moved - v5.bytes == p.partials_bytes
            assert v5.time < v4.time, (D, dtype)


@pytest.mark.parametrize("rows, D", [(8192, 1024), (24576, 1024), (8192, 4096),
                                     (16384, 2048), (32768, 1536), (65536, 768),
                                     (8192, 12288), (10**6, 64), (12345, 2560)])
def test_v5_strips_fill_one_wave(rows, D):
    """Past the partials budget, v5's backward strip is the shortest that fits
    its launch in one wave (WAVE_THREADS); its forward's (long float16
    rows), from one row, the shortest in one wave. By the model the backward
    is at least as fast as with the strips doubled from the budget's, the
    rule this one replaced, which left 205 blocks at 32768 x 1536 (two
    waves)."""
    for dtype in ("float32", "float16"):
        p = kernels.plan(rows, D, dtype, "v5")
        v5 = model.predict("backward", rows, D, dtype, rung="v5")
        assert p.partials_bytes <= kernels.PARTIALS_BUDGET * v5.bytes
        budget_strip = _budget_strip(p)
        block = p.backward_block or p.block

        def blocks(strip):
            return -(-(-(-rows // strip)) // p.groups_per_block)

        wave = kernels.wave_blocks(block)
        assert p.backward_grid == blocks(p.rows_per_group)
        assert p.rows_per_group >= budget_strip
        if p.rows_per_group > budget_strip:  # lengthened to fit one wave
            assert blocks(p.rows_per_group) <= wave < blocks(p.rows_per_group - 1)
        doubled = budget_strip  # the rule replaced
        while -(-rows // (2 * doubled * p.groups_per_block)) * block >= 128 * 512:
            doubled *= 2
        old = model.predict("backward", rows, D, dtype, rung="v5",
                            rows_per_group=doubled)
        # within 0.5%: a wave is 128 blocks, an H100 has 132 SMs
        assert v5.time <= old.time * 1.005, (D, dtype)
        # the forward's strips (its own kernel: long float16 rows)
        f_strip = p.forward_rows_per_group
        assert (f_strip > 0) == (dtype == "float16" and D > kernels.max_D())
        if f_strip:
            assert p.forward_grid == blocks(f_strip) <= wave
            assert f_strip == 1 or blocks(f_strip - 1) > wave


@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_v5_short_rows_keep_more_rows_in_flight(D, dtype):
    """A row a warp holds is short: v5's backward keeps 3 (float32) or 4
    (float16) of them in flight, where two left the model at 0.56 of the
    bandwidth at a million rows of 64 halves; its buffers still let four
    blocks of 128 threads share an SM, as the registers allow."""
    p = kernels.plan(10**6, D, dtype, "v5")
    k = p.rows_in_flight("backward")
    assert not p.per_block and k == {"float32": 3, "float16": 4}[dtype]
    assert p.backward_shared_bytes == k * 2 * 16 * (C["LN_ELEMS_PER_THREAD"]
                                                    // p.vec) * p.block
    v5 = model.predict("backward", 10**6, D, dtype, rung="v5")
    assert v5.blocks_per_sm == 4
    assert v5.share() >= 0.9
    two = model.predict("backward", 10**6, D, dtype, rung="v5", rows_in_flight=2)
    assert two.share() <= v5.share()
    if D == 64:  # two rows were too few
        assert two.share() < 0.9


def test_emulated_v5_adds_the_groups_of_a_block_in_order():
    p = kernels.plan(40, 64, "float32", "v5")  # 5 strips, 4 warps a block
    assert (p.row_groups, p.groups_per_block) == (5, 4)
    part = np.array([[1.0], [2.0**24], [1.0], [1.0], [3.0]], np.float32)
    part = np.repeat(part, 64, axis=1)
    got = emulate.block_partials(part, p)[:, 0]
    # ((1 + 2**24) + 1) + 1 rounds twice to 2**24; the last block: 3 + 0 + 0 + 0
    assert got.tolist() == [2.0**24, 3.0]


def test_occupancy_follows_the_register_file():
    # 512 threads of 112 registers: 16 warps x 3584 registers = 57344 <= 65536; two
    # would not fit.
    assert model.occupancy(512, 112) == 1
    # 64 threads of 40 registers: 1280 per warp, 2560 per block: 25 blocks.
    assert model.occupancy(64, 40) == 25
    # Threads, not registers, limit tiny kernels: 2048 / 1024.
    assert model.occupancy(1024, 16) == 2


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("D", [768, 4096, 8192, 12288, 65536])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_model_time_is_at_least_bytes_over_bandwidth(direction, D, dtype):
    p = model.predict(direction, 8192, D, dtype)
    floor = p.bytes / model.H100.bandwidth
    assert p.time > floor and 0 < p.share() < 1
    prefetch = model.predict(direction, 8192, D, dtype, rows_in_flight=2)
    assert prefetch.time < p.time
    extra = (
        kernels.plan(8192, D, dtype).partials_bytes if direction == "backward" else 0
    )
    item = np.dtype(dtype).itemsize
    if D <= kernels.max_D():
        assert p.bytes_moved == p.bytes + extra
    elif direction == "backward":  # x and dy read twice
        assert p.bytes_moved == p.bytes + extra + 8192 * D * 2 * item
    else:  # three re-reads of x, from L2 or through DRAM
        assert p.bytes_moved in (p.bytes, p.bytes + 8192 * D * 3 * item)
    # More latency per row, more time.
    slow = model.Device("slow", 132, 3.0e12, 2e-6, 0.25e-6, 0.05e-6)
    assert model.predict(direction, 8192, D, dtype, device=slow).time > p.time


def test_model_counts_the_rereads_of_long_rows():
    rows = 8192
    # The backward reads a strip's x and dy again after the whole strip: DRAM.
    for D in (12288, 65536):
        bwd = model.predict("backward", rows, D, "float32")
        partials = kernels.plan(rows, D, "float32").partials_bytes
        assert bwd.bytes_moved - bwd.bytes - partials == rows * D * 2 * 4
    # The forward's x and y rows of the blocks in flight, with gamma and beta:
    # 396 blocks of 48 KiB rows fit in 50 MiB of L2; of 256 KiB rows they do not.
    fwd = model.predict("forward", rows, 12288, "float32")
    assert (2 * fwd.concurrent_groups + 2) * 12288 * 4 <= model.H100.l2_bytes
    assert fwd.bytes_moved == fwd.bytes
    fwd = model.predict("forward", rows, 65536, "float32")
    assert (2 * fwd.concurrent_groups + 2) * 65536 * 4 > model.H100.l2_bytes
    assert fwd.bytes_moved - fwd.bytes == rows * 65536 * 4 * 3
    # A row that fits in registers costs less per element than one read in chunks.
    short = model.predict("backward", rows, 8192, "float32")
    assert short.share() > model.predict("backward", rows, 12288, "float32").share()


def test_occupancy_follows_shared_memory():
    # v5's float32 block: 33024 static + 131072 prefetch bytes, and 1 KiB the
    # system keeps: one block of 228 KiB; registers allow one anyway.
    p = kernels.plan(8192, 4096, "float32", "v5")
    usage = model.kernel_usage(p.kernel("backward"))
    shared = usage.shared_bytes + p.backward_shared_bytes
    assert usage.shared_bytes == 33024
    assert model.occupancy(512, usage.registers, shared=shared) == 1
    # 100 KiB blocks of 128 threads: registers would allow 8, shared memory 2.
    assert model.occupancy(128, 64) == 8
    assert model.occupancy(128, 64, shared=100 * 1024) == 2
    assert model.occupancy(128, 64, shared=228 * 1024) == 0


def test_model_prefetch_makes_a_step_bandwidth_bound():
    h = model.H100
    # k = 1 is the serial step: bytes, then the latency and the row sum.
    one = model.predict("backward", 8192, 4096, "float32", rung="v5", rows_in_flight=1)
    two = model.predict("backward", 8192, 4096, "float32", rung="v5")
    p = kernels.plan(8192, 4096, "float32", "v5")
    b_row = (two.bytes + p.partials_bytes / 2) / 8192  # the partials' writes too
    t_bytes = two.concurrent_groups * b_row / h.bandwidth
    exposed = h.latency + h.block_reduction
    assert t_bytes > exposed  # so with the next row in flight the bytes bind
    second = p.partials_bytes / 2 / h.bandwidth + h.latency + h.launch_overhead
    waves = -(-p.row_groups // two.concurrent_groups)
    assert one.time == pytest.approx(
        waves * p.rows_per_group * (t_bytes + exposed) + h.launch_overhead + second)
    assert two.time == pytest.approx(
        waves * (p.rows_per_group * t_bytes + h.latency) + h.launch_overhead + second)
    # Three rows in flight gain nothing more once the bytes bind.
    three = model.predict("backward", 8192, 4096, "float32", rung="v5",
                          rows_in_flight=3)
    assert three.time == pytest.approx(two.time)
    # Rows of scalars run v4's kernels, which do not prefetch.
    for D in (511, 4095):
        assert model.predict("backward", 8192, D, "float16", rung="v5") == (
            model.predict("backward", 8192, D, "float16"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_model_v5_backward_ahead_of_v4(dtype):
    """By the model, v5's backward (the next row in flight) is ahead of v4's at
    every timed width, and below the copy bandwidth."""
    for D in (768, 1024, 4096, 8192, 12288):
        v5 = model.predict("backward", 8192, D, dtype, rung="v5").share()
        assert model.predict("backward", 8192, D, dtype).share() < v5 < 1, D


def test_model_forward_of_v5_takes_its_strips():
    h = model.H100
    p = kernels.plan(8192, 12288, "float16", "v5")
    fwd = model.predict("forward", 8192, 12288, "float16", rung="v5")
    assert fwd.steps == p.forward_rows_per_group  # one wave of strips
    assert fwd.bytes_moved == fwd.bytes  # no partial sums
    # a step moves the concurrent groups' rows, or waits for the latency
    # shared by the rows in flight, whichever is longer
    k = p.rows_in_flight("forward")
    t_bytes = fwd.concurrent_groups * fwd.bytes / 8192 / h.bandwidth
    exposed = h.latency + 3 * h.block_reduction
    step = max(t_bytes, (t_bytes + exposed) / k)
    assert fwd.time == pytest.approx(
        p.forward_rows_per_group * step + h.latency + h.launch_overhead)
    one = model.predict("forward", 8192, 12288, "float16", rung="v5", rows_in_flight=1)
    assert one.time > fwd.time  # the prefetch pays, by the model


GPU_DATA = sorted((Path(__file__).parents[1] / "book" / "data" / "gpu").glob("*.json"))


@pytest.mark.parametrize("path", GPU_DATA, ids=[p.stem for p in GPU_DATA])
def test_recorded_gpu_measurements_are_complete(path):
    """The data files the GPU chapter reads: every check passed, every shape timed."""
    data = json.loads(path.read_text())
    assert data["gpu"] is True and data["device"] and data["date"] in path.name
    assert all(b["equal"] for b in data["bit_checks"])
    assert {s["errors"] for s in data["sanitizers"].values()} == {0}
    large = data["large_rows"]
    assert large["elements"] > 2**31 and large["y_sampled_rows_equal"]
    assert large["dx_sampled_rows_equal"] and large["dbeta_relative_error"] < 1e-5
    for r in data["offset_sweep"]["v4"]:
        assert r["y"] <= 2e-7 and r["dx"] <= 2e-7
    timed = {(t["rung"], t["direction"], t["D"], t["dtype"]) for t in data["timings"]}
    # Every launch the measurement planned: the shapes its kernels took were
    # timed fused too (rows longer than registers hold were not supported then).
    assert [(e["rows"], e["D"], e["dtype"]) for e in data["launches"]] == [
        (e["rows"], e["D"], e["dtype"]) for e in measure.plan_launches()
    ]
    for e in data["launches"]:
        rungs = ["v1"] if "unsupported" in e else ["v1", "v4"]
        for rung in rungs:
            for direction in ("forward", "backward"):
                assert (rung, direction, e["D"], e["dtype"]) in timed
    assert 1e12 < data["copy"]["bandwidth"] < 1e13
    ref = data["torch_reference"]
    # PyTorch's float64 results on the stored inputs agree with lnorm's.
    inp = {k: np.array(v) for k, v in ref["inputs"].items()}
    ours = check.reference(inp, eps=ref["eps"])
    for k in ("y", "dx", "dgamma", "dbeta"):
        np.testing.assert_allclose(
            ours[k], np.array(ref["float64"][k]), rtol=1e-12, atol=1e-12
        )
    if any("v5_equal" in b for b in data["bit_checks"]):  # v5 was checked too
        assert all(b.get("v5_equal", True) for b in data["bit_checks"])
        assert all(t["queued_ahead"] for t in data["timings"])


def test_the_gpu_chapter_has_an_h100_file_and_another_device():
    """Chapter 6 reads the newest H100 file and the newest of another device."""
    names = [p.stem for p in GPU_DATA]
    assert any(n.startswith("h100-") for n in names)
    assert any(not n.startswith("h100-") for n in names)


class _FakeCuPy:
    """Just enough of CuPy to watch the order in which _Timer queues work."""

    def __init__(self):
        self.log = []
        fake = self

        class Event:
            done = False  # the spin is still running when the host finishes

            def record(self):
                fake.log.append("event")

            def synchronize(self):
                fake.log.append("wait")

        class Stream:
            def synchronize(self):
                fake.log.append("sync")

        class Cuda:
            @staticmethod
            def get_current_stream():
                return Stream()

            @staticmethod
            def get_elapsed_time(a, b):
                return 2.0  # ms

        Cuda.Event = Event
        self.cuda = Cuda
        self.uint8 = np.uint8

    def empty(self, n, dtype):
        fake = self

        class Scratch:
            def fill(self, value):
                fake.log.append("flush")

        return Scratch()

    def RawKernel(self, code, name):  # noqa: N802 (CuPy's name)
        assert "clock64" in code and name == "spin"
        return lambda grid, block, args: self.log.append(("spin", int(args[0])))


def test_timer_queues_every_call_behind_a_spin():
    """The host's launch time is hidden: the GPU spins while every timed call
    is queued, each between its two events, and the times are the events'."""
    cp = _FakeCuPy()
    timer = measure._Timer(cp, repeat=4)
    out = timer(lambda: cp.log.append("call"), flush=True)
    log = cp.log
    spin = next(i for i, e in enumerate(log) if isinstance(e, tuple))
    assert log[:spin] == ["call"] * 3 + ["sync"]  # warm-up, then an idle GPU
    cycles = log[spin][1]
    assert 1e-3 * 2.5e9 <= cycles <= 1.0 * 2.5e9  # at least 1 ms, at most 1 s
    assert log[spin + 1] == "event"  # the moment the spin ends
    assert log[spin + 2:] == ["flush", "event", "call", "event"] * 4 + ["wait"]
    assert out["median_s"] == 2e-3 and out["queued_ahead"] is True
    assert out["repeat"] == 4 and out["l2_flushed"] is True



# --- what the measurements timed stays true of this code ------------------------------

DATA = Path(__file__).parents[1] / "book" / "data" / "gpu"
MEASURED = ("h100-2026-11-26.json", "h200-2026-11-26.json")
#: The H100 file's own note: v5's strips at D <= 1024 changed after its run
#: (its v5 backward there is not today's launch; the H200 file has today's).
STALE_V5 = {"h100-2026-11-26.json": (768, 1024)}
@functools.cache
def _ptx_now() -> dict[str, set[str]]:
    """Each kernel's PTX digests (measure.ptx_digests): as printed, and canonical."""
    raw, canon = measure.ptx_digests(), measure.ptx_digests(canonical=True)
    return {name: {raw[name], canon[name]} for name in raw}


def _kept_launches(entry: dict):
    """(rung, direction, recorded launch, today's plan) for every launch a
    measurement timed whose kernels this build still has."""
    rows, D, dtype = entry["rows"], entry["D"], entry["dtype"]
    p = kernels.plan(rows, D, dtype)
    yield "v4", "forward", {k: entry[k] for k in (
        "kernel_forward", "block", "forward_grid")}, {
        "kernel_forward": p.kernel("forward"), "block": p.block,
        "forward_grid": p.forward_grid}
    yield "v4", "backward", {k: entry[k] for k in (
        "kernel_backward", "backward_grid", "row_groups", "rows_per_group",
        "partials_bytes")}, {
        "kernel_backward": p.kernel("backward"), "backward_grid": p.backward_grid,
        "row_groups": p.row_groups, "rows_per_group": p.rows_per_group,
        "partials_bytes": p.partials_bytes}
    for rung, rec in entry.get("rungs", {}).items():
        q = kernels.plan(rows, D, dtype, rung)
        assert q.rung == rung, (rung, D, dtype)
        back = ("kernel_backward", "backward_block", "backward_grid",
                "rows_per_group", "partials_bytes", "backward_shared_bytes")
        today = {"kernel_backward": q.kernel("backward"),
                 "backward_block": q.backward_block or q.block,
                 "backward_grid": q.backward_grid, "rows_per_group": q.rows_per_group,
                 "partials_bytes": q.partials_bytes,
                 "backward_shared_bytes": q.backward_shared_bytes}
        yield rung, "backward", {k: rec[k] for k in back}, today
        if q.forward_rows_per_group:  # v5's own forward, kept where it led
            fwd = ("kernel_forward", "forward_grid", "forward_rows_per_group",
                   "forward_shared_bytes")
            yield rung, "forward", {k: rec[k] for k in fwd}, {
                "kernel_forward": q.kernel("forward"), "forward_grid": q.forward_grid,
                "forward_rows_per_group": q.forward_rows_per_group,
                "forward_shared_bytes": q.forward_shared_bytes}
        else:  # retired: v4's forward runs (the plan of v4's, above)
            assert q.kernel("forward") == p.kernel("forward")


@pytest.mark.parametrize("name", MEASURED)
def test_timed_launches_keep_their_ptx_and_their_plan(name):
    """Every launch the two newest measurements timed that this build still
    makes has the plan it had, and its kernels the PTX they had (modulo branch
    labels and where a shared variable is declared): their timings stay true
    of this code. What was retired (v5's forward but at long float16 rows, the
    tails, the clusters) is history, in dev/JOURNAL.md."""
    assert measure.kernels_measured(json.loads((DATA / name).read_text())) == "ptx"
    data = json.loads((DATA / name).read_text())
    stale = STALE_V5.get(name, ())
    if stale:
        assert any("D <= 1024 changed" in note for note in data["notes"])
    checked = set()
    for entry in data["launches"]:
        for rung, direction, recorded, today in _kept_launches(entry):
            if rung == "v5" and entry["D"] in stale:
                continue
            assert recorded == today, (name, entry["D"], entry["dtype"], rung,
                                       direction)
            for k, kernel in today.items():
                if k.startswith("kernel_"):
                    assert data["ptx_sha256"][kernel] in _ptx_now()[kernel], kernel
                    checked.add(kernel)
    for kernel in ("ln_bwd_reduce_params", "ln_bwd_reduce_params_wide"):  # timed too
        assert data["ptx_sha256"][kernel] in _ptx_now()[kernel], kernel
        checked.add(kernel)
    # v3, v4 (register and long rows), v5's backward and its long float16 forward
    assert "ln_fwd_grouped_long_f16_v8" in checked
    assert {"ln_bwd_atomic_block_f32_v4", "ln_bwd_long_f16_v8",
            "ln_bwd_grouped_long_f32_v4", "ln_bwd_grouped_block_f16_v8"} <= checked
    assert len(checked) == 17
