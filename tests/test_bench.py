"""Tests for lnorm.bench and its command line (lnorm/bench/__main__.py): the
reference it times is correct, the report is well formed, and the floor it
divides by is the hand-counted byte count. (No timed assertions: timings are
reported, never tested.)"""

import json
from pathlib import Path

import numpy as np
import pytest
from reference import chain_rule_backward, chain_rule_forward, max_rel_err

import lnorm
from lnorm import bench
from lnorm.bench import __main__ as cli
from lnorm.inputs import make_inputs

SMALL_SHAPE = ["2", "4", "16"]  # 8 rows of D = 16


def _quick_json(capsys, *extra):
    assert (
        cli.main(
            ["--quick", "--json", "--repeat", "2", "--shape", *SMALL_SHAPE, *extra]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)


def _scripted(monkeypatch, script):
    """Timings from ``script`` (seconds per round, by key) instead of the clock,
    with a 64-byte copy yardstick."""
    monkeypatch.setattr(bench, "time_round_robin",
                        lambda calls, repeat, seed=0:
                        {key: list(script[key]) for key in calls})
    _small_copy(monkeypatch)


def _small_copy(monkeypatch):
    """A copy yardstick of 64 bytes, for tests that do not look at its size
    (the real one is four times the last-level cache, gigabytes here)."""
    monkeypatch.setattr(bench, "copy_arrays", lambda: (np.ones(8), np.empty(8)))


def test_without_options_the_bench_times_float32_and_float16(monkeypatch, capsys):
    seen = []

    def fake_run(shapes, dtypes, **kwargs):
        seen.append((tuple(shapes), tuple(dtypes), kwargs["repeat"]))
        return {"machine": {"cpu": "x", "blas_threads": 1}, "repeat": 1, "results": []}

    monkeypatch.setattr(cli, "run", fake_run)
    assert cli.main([]) == 0 and cli.main(["--quick"]) == 0
    assert seen == [(bench.DEFAULT_SHAPES, ("float32", "float16"), 7),
                    (cli.QUICK_SHAPES, ("float32",), 5)]
    assert "(no measurements)" in capsys.readouterr().out


def test_quick_json_report_is_well_formed(capsys):
    report = _quick_json(capsys, "--seed", "3")
    assert set(report) == {"machine", "repeat", "seed", "copy_bytes",
                           "fused_threads", "results"}
    assert report["repeat"] == 2 and report["seed"] == 3
    assert report["fused_threads"] == 1
    machine = report["machine"]
    assert (
        machine["blas_threads"] == 1
        and machine["numba"]
        and machine["numpy"] == np.__version__
    )
    assert isinstance(machine["cpu"], str) and machine["cpu"]
    llc = max(machine["cache_bytes"].values(), default=0)
    assert (
        report["copy_bytes"] >= 2 * 4 * llc
    )  # source and destination, each >= 4 x LLC
    rows = report["results"]
    assert {(r["impl"], r["direction"]) for r in rows} == {
        (impl, d) for impl in bench.MEASURED for d in ("forward", "backward")
    }
    assert bench.MEASURED[: len(bench.IMPLEMENTATIONS)] == bench.IMPLEMENTATIONS
    for r in rows:
        assert r["shape"] == [2, 4, 16] and r["dtype"] == "float32"
        s = r["seconds"]
        assert len(s["samples"]) == 2 and s["min"] <= s["median"] <= s["max"]
        assert s["min"] == min(s["samples"]) and s["max"] == max(s["samples"])
        assert 0.1 < r["copy_gbs"] < 1e4  # a plausible memory system
        assert r["gbs"] == pytest.approx(r["floor_bytes"] / s["median"] / 1e9)
        assert r["x_floor"] > 0 and r["speedup_vs_reference"] > 0
        assert (r["block_rows"] is None) == (r["impl"] != "tiled")
    assert {r["block_rows"] for r in rows if r["impl"] == "tiled"} == {
        lnorm.core.tile_rows(16)
    }


def test_ratios_are_taken_within_each_round(monkeypatch):
    # With scripted timings, x_floor and the speed-up are medians of per-round
    # ratios, not ratios of medians.
    script = {"copy": [1.0, 2.0, 4.0]}
    for impl in bench.MEASURED:
        for d in ("forward", "backward"):
            script[(impl, d)] = (
                [1.0, 1.0, 1.0] if impl == "reference" else [0.5, 2.0, 8.0]
            )

    _scripted(monkeypatch, script)
    report = bench.run([(2, 4)], repeat=3, progress=False)
    for r in report["results"]:
        bw = 2 * 64 / np.array(script["copy"])  # bytes/s of each round
        t = np.array(script[(r["impl"], r["direction"])])
        assert r["x_floor"] == pytest.approx(np.median(t * bw / r["floor_bytes"]))
        assert r["speedup_vs_reference"] == pytest.approx(np.median(1.0 / t))
        assert r["copy_gbs"] == pytest.approx(np.median(bw) / 1e9)


def test_floor_bytes_are_the_hand_counted_minimum(capsys, monkeypatch):
    _small_copy(monkeypatch)
    report = _quick_json(capsys, "--block-rows", "3")
    rows, D, f32, f64 = 8, 16, 4, 8
    # backward: read dy, xhat (f32), rstd (f64 per row), gamma; write dx, dgamma, dbeta.
    backward = 2 * rows * D * f32 + rows * f64 + D * f32 + rows * D * f32 + 2 * D * f32
    # forward: read x, gamma, beta; write y, xhat (f32), rstd (f64 per row).
    forward = rows * D * f32 + 2 * D * f32 + 2 * rows * D * f32 + rows * f64
    for r in report["results"]:
        assert r["floor_bytes"] == (
            backward if r["direction"] == "backward" else forward
        )
        if r["impl"] == "tiled":
            assert r["block_rows"] == 3


def test_table_has_one_line_per_measurement(capsys, monkeypatch):
    _small_copy(monkeypatch)
    argv = [
        "--quick",
        "--repeat",
        "1",
        "--shape",
        *SMALL_SHAPE,
        "--dtype",
        "float64",
        "float16",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "xfloor" in out and "GB/s" in out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("(2, 4, 16)")]
    assert len(lines) == 2 * 4 * 2  # 2 dtypes x 4 measured x 2 directions
    assert sum("float16" in ln for ln in lines) == 8


def test_progress_line_appears_only_for_long_runs(capsys):
    fast = bench._Progress(2)
    fast.step("a")
    fast.close()
    assert capsys.readouterr().err == ""
    slow = bench._Progress(2)
    slow.start -= 10.0  # as if the run had taken ten seconds
    slow.step("shape")
    slow.close()
    assert capsys.readouterr().err == "\r[1/2] shape" + " " * 35 + "\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--repeat", "0"],
        ["--block-rows", "0"],
        ["--shape", "4", "0"],
        ["--dtype", "int8"],
        ["--threads", "0"],
        ["--seed", "-1"],
    ],
)
def test_bad_options_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as err:
        cli.main(argv)
    assert err.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_run_rejects_bad_arguments():
    with pytest.raises(ValueError, match="repeat"):
        bench.run([(2, 3)], repeat=0)
    with pytest.raises(ValueError, match="dtypes"):
        bench.run([(2, 3)], dtypes=("int32",))
    with pytest.raises(ValueError, match="threads"):
        bench.run([(2, 3)], threads=0)


@pytest.mark.parametrize("shape", [(1, 5), (3, 4, 7), (6, 1)])
def test_reference_matches_lnorm_in_float64(shape):
    x, gamma, beta, dy = make_inputs(shape, np.float64, seed=2)
    y_ref, saved = bench.reference_forward(x, gamma, beta)
    y, cache = lnorm.forward(x, gamma, beta)
    np.testing.assert_allclose(y_ref, y.reshape(-1, shape[-1]), rtol=1e-13, atol=1e-13)
    dx_ref, dgamma_ref, dbeta_ref = bench.reference_backward(dy, saved, gamma)
    dx, dgamma, dbeta = lnorm.backward(dy, cache)
    np.testing.assert_allclose(
        dx_ref, dx.reshape(-1, shape[-1]), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(dgamma_ref, dgamma, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dbeta_ref, dbeta, rtol=1e-12, atol=1e-12)


def test_reference_works_in_the_input_dtype():
    x, gamma, beta, dy = make_inputs((4, 8), np.float32)
    y, saved = bench.reference_forward(x, gamma, beta)
    dx, dgamma, dbeta = bench.reference_backward(dy, saved, gamma)
    assert {a.dtype for a in (y, *saved, dx, dgamma, dbeta)} == {np.dtype(np.float32)}
    # float32 arithmetic on rows of 8 centred values: within a few dozen u32
    # (6e-8) of the float64 chain rule on the same stored values.
    up = [a.astype(np.float64) for a in (x, gamma, beta, dy)]
    y_ref, t = chain_rule_forward(*up[:3])
    for got, want in zip((y, dx, dgamma, dbeta),
                         (y_ref, *chain_rule_backward(up[3], up[1], t))):
        assert max_rel_err(got, want) < 2e-6


def test_make_inputs_is_seeded():
    a = make_inputs((3, 4), np.float32, seed=5)
    b = make_inputs((3, 4), np.float32, seed=5)
    c = make_inputs((3, 4), np.float32, seed=6)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])


def _scripted_rounds(monkeypatch, seconds):
    """time_round_robin replaced: each callable called once (its result kept in
    ``seen``), and the seconds ``seconds(key)`` reported for its rounds."""
    seen = {}

    def fake(calls, repeat, seed=0):
        seen.update({key: fn() for key, fn in calls.items()})
        return {key: list(seconds(key)) for key in calls}

    monkeypatch.setattr(bench, "time_round_robin", fake)
    return seen


def test_tile_sweep_returns_the_median_time_of_each_block(monkeypatch):
    # On the real clock: one positive time per block size.
    times = bench.tile_sweep((2, 8, 16), np.float32, [1, 4, 16], repeat=1)
    assert len(times) == 3 and all(0 < t < 10 for t in times)
    # Scripted: the medians, in the order of block_rows, of the backward with
    # that block size.
    script = {1: [3.0, 1.0, 2.0], 4: [0.5, 0.25, 4.0], 16: [7.0, 9.0, 8.0]}
    seen = _scripted_rounds(monkeypatch, script.get)
    assert bench.tile_sweep((2, 8, 16), np.float32, [16, 1, 4], repeat=3) == [
        8.0, 2.0, 0.5]
    assert sorted(seen) == [1, 4, 16]
    x, gamma, beta, dy = make_inputs((2, 8, 16), np.float32)
    want = lnorm.backward(dy, lnorm.forward(x, gamma, beta)[1])
    for dx, dgamma, dbeta in seen.values():
        assert max_rel_err(dx, want[0]) < 1e-6
        assert max_rel_err(dgamma, want[1]) < 1e-6
        assert max_rel_err(dbeta, want[2]) < 1e-6


def test_size_sweep_reports_floor_bytes_per_median_second(monkeypatch):
    # On the real clock: one plausible rate per implementation and size.
    gbs = bench.size_sweep(16, [2, 64], np.float32, repeat=1)
    assert set(gbs) == set(bench.IMPLEMENTATIONS)
    assert all(len(v) == 2 and all(0 < g < 1e4 for g in v) for v in gbs.values())
    # Scripted: GB/s = floor bytes x calls per sample / median seconds / 1e9.
    # Backward float32, rows n of D = 16: dy, xhat, dx (3 n D 4 B), rstd (n 8 B),
    # gamma, dgamma, dbeta (3 D 4 B). Calls per sample: 2e6 // (n D), from 1 to
    # 200: 200 at n = 2 (62500), 5 at n = 25000 (400000 elements).
    D, rows, inner = 16, [2, 25000], [200, 5]
    medians = {impl: 1e-3 * (i + 1) for i, impl in enumerate(bench.IMPLEMENTATIONS)}
    seen = _scripted_rounds(
        monkeypatch, lambda impl: [medians[impl] / 2, medians[impl], 9.0])
    gbs = bench.size_sweep(D, rows, np.float32, repeat=3)
    for impl in bench.IMPLEMENTATIONS:
        want = [(3 * n * D * 4 + n * 8 + 3 * D * 4) * k / medians[impl] / 1e9
                for n, k in zip(rows, inner)]
        assert gbs[impl] == pytest.approx(want, rel=1e-12)
        assert len(seen[impl]) == inner[-1]  # the batch of the last size


def test_peak_bytes_leaves_a_callers_trace_running():
    import tracemalloc

    tracemalloc.start()
    try:
        assert bench.peak_bytes(lambda: np.ones(1000)) >= 8000
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    bench.peak_bytes(lambda: None)
    assert not tracemalloc.is_tracing()  # one it started, it stops


def test_peak_bytes_sees_the_arrays_a_call_allocates():
    n = 1_000_000
    assert 8 * n <= bench.peak_bytes(lambda: np.ones(n)) < 8 * n + 4096
    # Two live temporaries at once: twice the memory.
    assert bench.peak_bytes(lambda: (np.ones(n), np.ones(n))) >= 16 * n


def test_time_round_robin_shuffles_the_order():
    order = []
    calls = {k: (lambda k=k: order.append(k)) for k in "abcdef"}
    bench.time_round_robin(calls, repeat=4, seed=1)
    rounds = [order[6 + 6 * i : 12 + 6 * i] for i in range(4)]  # after the warm-up
    assert all(sorted(r) == list("abcdef") for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1


def test_cache_sizes_are_ordered_when_known():
    sizes = bench.cache_sizes()
    assert all(isinstance(v, int) and v > 0 for v in sizes.values())
    sysfs = Path("/sys/devices/system/cpu/cpu0/cache")
    if any(sysfs.glob("index*/size")):
        # Linux with sysfs: at least a level-1 data cache of a plausible size.
        assert 4 * 2**10 <= sizes["L1"] <= 2**20, sizes
    levels = [sizes[k] for k in ("L1", "L2", "L3") if k in sizes]
    assert levels == sorted(levels)


def test_the_fused_rung_writes_into_buffers_and_default_into_new_arrays():
    # The fused rung and the floor both write into arrays allocated once; the
    # default call allocates its outputs. Both give the same values.
    calls, _ = bench._calls((3, 1024), np.float32, None, 0)
    y1, c1 = calls["fused", "forward"]()
    y2, c2 = calls["fused", "forward"]()
    assert y1 is y2 and np.shares_memory(c1.xhat, c2.xhat)
    dx1, dg1, _ = calls["fused", "backward"]()
    dx2, _, _ = calls["fused", "backward"]()
    assert dx1 is dx2
    y3, c3 = calls["default", "forward"]()
    y4, _ = calls["default", "forward"]()
    dx3, dg3, _ = calls["default", "backward"]()
    assert y3 is not y4 and not np.shares_memory(y3, y4)
    assert np.array_equal(y3, y1) and np.array_equal(c3.xhat, c1.xhat)
    assert np.array_equal(dx3, dx1) and np.array_equal(dg3, dg1)


def test_thread_scaling_takes_its_ratios_within_each_round(monkeypatch):
    # Scripted timings: x_floor is the median of per-round time / floor, the
    # speed-up the median of per-round baseline / time, per thread count.
    script = {"copy": [1.0, 2.0, 4.0]}
    for d in ("forward", "backward"):
        script[d, 1] = [2.0, 2.0, 2.0]
        script[d, 3] = [0.5, 1.0, 4.0]

    _scripted(monkeypatch, script)
    r = bench.thread_scaling((2, 4), np.float32, threads=(1, 3), repeat=3)
    assert sorted(r) == [("backward", 1), ("backward", 3),
                         ("forward", 1), ("forward", 3)]
    bw = 2 * 64 / np.array(script["copy"])
    for (d, n), v in r.items():
        t = np.array(script[d, n])
        fb = bench.floor_bytes(d, (2, 4), np.float32)
        assert v["x_floor"] == pytest.approx(np.median(t * bw / fb))
        assert v["speedup"] == pytest.approx(np.median(2.0 / t))
        assert v["seconds"]["samples"] == list(t)


def test_thread_scaling_and_run_refuse_bad_thread_counts():
    with pytest.raises(ValueError, match="threads"):
        bench.thread_scaling((2, 3), np.float32, threads=())
    with pytest.raises(ValueError, match="threads"):
        bench.thread_scaling((2, 3), np.float32, threads=(1, 0))
    with pytest.raises(TypeError, match="threads"):
        bench.thread_scaling((2, 3), np.float32, threads=(1, 2.0))


def test_the_fused_rung_runs_on_the_threads_it_is_given(monkeypatch):
    seen = []
    real = lnorm.fused.backward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("threads"))
        return real(*args, **kwargs)

    monkeypatch.setattr(lnorm.fused, "backward", spy)
    calls, _ = bench._calls((3, 16), np.float32, None, 0, threads=2)
    calls["fused", "backward"]()
    assert seen == [2]
