"""Tests for lnorm.bench: the reference it times is correct, the report is
well formed, and the floor it divides by is the hand-counted byte count.
(No timed assertions: timings are reported, never tested.)"""

import json

import numpy as np
import pytest

import lnorm
from lnorm import bench

SMALL_SHAPE = ["2", "4", "16"]  # 8 rows of D = 16


def _quick_json(capsys, *extra):
    assert bench.main(["--quick", "--json", "--repeat", "1", "--shape", *SMALL_SHAPE, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_quick_json_report_is_well_formed(capsys):
    report = _quick_json(capsys)
    assert set(report) == {"machine", "copy_bandwidth", "repeat", "results"}
    assert report["repeat"] == 1
    assert 1e8 < report["copy_bandwidth"] < 1e13  # bytes/s: a plausible memory system
    rows = report["results"]
    # quick mode: float32 only; 3 implementations x 2 directions for the one shape,
    # and the float32-work backward
    assert len(rows) == 7
    assert {(r["impl"], r["direction"]) for r in rows} == {
        (impl, d) for impl in ("reference", "plain", "tiled") for d in ("forward", "backward")
    } | {("tiled_f32", "backward")}
    for r in rows:
        assert r["shape"] == [2, 4, 16] and r["dtype"] == "float32"
        assert r["median_s"] > 0 and np.isfinite(r["median_s"])
        assert r["floor_s"] == pytest.approx(r["floor_bytes"] / report["copy_bandwidth"])
        assert r["x_floor"] == pytest.approx(r["median_s"] / r["floor_s"])
        assert (r["block_rows"] is None) == (r["impl"] not in ("tiled", "tiled_f32"))
        assert r["page_faults"] is None or (isinstance(r["page_faults"], int) and r["page_faults"] >= 0)
        if r["impl"] == "reference":
            assert r["speedup_vs_reference"] == 1.0
    blocks = {r["impl"]: r["block_rows"] for r in rows if r["block_rows"] is not None}
    assert blocks == {"tiled": lnorm.core.tile_rows(16),
                      "tiled_f32": lnorm.core.tile_rows(16, work_dtype=np.float32)}


def test_floor_bytes_are_the_hand_counted_minimum(capsys):
    report = _quick_json(capsys, "--block-rows", "3")
    rows, D, f32, f64 = 8, 16, 4, 8
    # backward: read dy, xhat (f32), rstd (f64 per row), gamma; write dx, dgamma, dbeta.
    backward = 2 * rows * D * f32 + rows * f64 + D * f32 + rows * D * f32 + 2 * D * f32
    # forward: read x, gamma, beta; write y, xhat (f32), rstd (f64 per row).
    forward = rows * D * f32 + 2 * D * f32 + 2 * rows * D * f32 + rows * f64
    for r in report["results"]:
        assert r["floor_bytes"] == (backward if r["direction"] == "backward" else forward)
        if r["impl"].startswith("tiled"):
            assert r["block_rows"] == 3


def test_table_has_one_line_per_measurement(capsys):
    assert bench.main(["--quick", "--repeat", "1", "--shape", *SMALL_SHAPE, "--dtype", "float64", "float16"]) == 0
    out = capsys.readouterr().out
    assert "copy bandwidth" in out and "xfloor" in out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("(2, 4, 16)")]
    # 3 implementations x 2 directions per dtype, and float32 work for float16 only
    assert len(lines) == 2 * 3 * 2 + 1
    assert sum("float16" in ln for ln in lines) == 7
    assert ["float16" in ln for ln in lines if "tiled_f32" in ln] == [True]


@pytest.mark.parametrize("argv", [["--repeat", "0"], ["--block-rows", "0"], ["--shape", "4", "0"], ["--dtype", "int8"]])
def test_bad_options_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as err:
        bench.main(argv)
    assert err.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_run_rejects_bad_arguments():
    with pytest.raises(ValueError, match="repeat"):
        bench.run([(2, 3)], repeat=0, bandwidth=1e9)
    with pytest.raises(ValueError, match="dtypes"):
        bench.run([(2, 3)], dtypes=("int32",), bandwidth=1e9)


@pytest.mark.parametrize("shape", [(1, 5), (3, 4, 7), (6, 1)])
def test_reference_matches_lnorm_in_float64(shape):
    x, gamma, beta, dy = bench.make_inputs(shape, np.float64, seed=2)
    y_ref, saved = bench.reference_forward(x, gamma, beta)
    y, cache = lnorm.forward(x, gamma, beta)
    np.testing.assert_allclose(y_ref, y.reshape(-1, shape[-1]), rtol=1e-13, atol=1e-13)
    dx_ref, dgamma_ref, dbeta_ref = bench.reference_backward(dy, saved, gamma)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    np.testing.assert_allclose(dx_ref, dx.reshape(-1, shape[-1]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dgamma_ref, dgamma, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dbeta_ref, dbeta, rtol=1e-12, atol=1e-12)


def test_reference_works_in_the_input_dtype():
    x, gamma, beta, dy = bench.make_inputs((4, 8), np.float32)
    y, saved = bench.reference_forward(x, gamma, beta)
    dx, dgamma, dbeta = bench.reference_backward(dy, saved, gamma)
    assert {a.dtype for a in (y, *saved, dx, dgamma, dbeta)} == {np.dtype(np.float32)}


def test_make_inputs_is_seeded():
    a = bench.make_inputs((3, 4), np.float32, seed=5)
    b = bench.make_inputs((3, 4), np.float32, seed=5)
    c = bench.make_inputs((3, 4), np.float32, seed=6)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])


def test_tile_sweep_returns_one_time_per_block_and_work_dtype():
    times = bench.tile_sweep((2, 8, 16), np.float32, [1, 4, 16], repeat=1,
                             work_dtypes=(None, np.float32))
    assert list(times) == [None, np.float32]
    assert all(len(ts) == 3 and all(t > 0 for t in ts) for ts in times.values())


def test_cache_sizes_are_ordered_when_known():
    sizes = bench.cache_sizes()
    assert all(isinstance(v, int) and v > 0 for v in sizes.values())
    levels = [sizes[k] for k in ("L1", "L2", "L3") if k in sizes]
    assert levels == sorted(levels)
