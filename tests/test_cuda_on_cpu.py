"""The CUDA sources themselves, compiled by g++ and run on the CPU (tests/cuda_host).

The fast tests compare every kernel's output with lnorm.gpu.emulate bit for
bit, launched exactly as FusedLayerNorm launches them on a GPU. The slow ones
run the same kernels under AddressSanitizer + UndefinedBehaviorSanitizer and
under ThreadSanitizer, and prove, on modified copies of the sources, that each
check can fail: a missing barrier (a data race), a load past the row (a heap
overflow), a misaligned vector load, and a shuffle by a partial warp.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import cuda_host as cpu
import numpy as np
import pytest

from lnorm.gpu import check, emulate, kernels

pytestmark = pytest.mark.cuda_on_cpu

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
#: (rows, D): D of 1, 2, 3, 7 (warp, scalar loads), 512 (warp, vector loads),
#: 513, 1027, 4099 (block, scalar), 8192 (block, vector, the longest row held
#: in registers), then rows taken in chunks: 12288 (vector), 12290 (float32
#: vectors, float16 scalars), 65537 (scalar). Rows leave a short last strip in
#: the backward (rows % 16 != 0) and, for warps, a partly empty last block;
#: few rows where a block has hundreds of threads, and 17 (a strip and a row)
#: at 12288.
SHAPES = (
    (37, 1),
    (21, 2),
    (19, 3),
    (40, 7),
    (19, 512),
    (18, 513),
    (17, 1027),
    (5, 4099),
    (3, 8192),
    (17, 12288),
    (3, 12290),
    (1, 65537),
)
#: Every kernel, under both sanitizers: warps of scalars (7) and of vectors
#: (64), blocks of scalars (513) and vectors (520: v5's blocks, its wide
#: second stage), long rows of vectors whose second chunk is almost empty
#: (8200: v5's rows from shared memory) and of scalars (8201).
SANITIZED_SHAPES = ((18, 7), (5, 64), (3, 513), (3, 520), (2, 8200), (2, 8201))
#: v5 at 8200 under ThreadSanitizer: its second stage has 257 blocks of 1024
#: threads there, a quarter of a minute per dtype; its row loop, prefetch and
#: row sums are those ThreadSanitizer runs at 64 and 520, and
#: AddressSanitizer runs it whole.
SANITIZED_SKIP = {
    "asan": (),
    "tsan": ((8200, "float32", "v5"), (8200, "float16", "v5")),
}
DIRTY = ("ERROR: AddressSanitizer", "runtime error", "WARNING: ThreadSanitizer")


@pytest.fixture(scope="module")
def gxx():
    ok, why = cpu.available()
    if not ok:
        pytest.skip(f"cannot compile the CUDA sources for the CPU: {why}")


@pytest.fixture(scope="module")
def host(gxx):
    return cpu.HostLayerNorm()


def assert_same_bits(
    got: dict, want: dict, what: str, nan_payload: bool = True
) -> None:
    """Every output identical as raw bits; with ``nan_payload=False`` NaNs need only
    sit in the same places (IEEE leaves the sign and payload of a NaN made from
    two NaNs to the implementation: g++ and NumPy may order an addition's operands
    differently)."""
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert (g.shape, g.dtype) == (w.shape, w.dtype), k
        bits = np.dtype(f"uint{8 * w.dtype.itemsize}")
        gb, wb = g.view(bits), w.view(bits)
        if not nan_payload:
            nan = np.isnan(w)
            np.testing.assert_array_equal(
                np.isnan(g), nan, err_msg=f"NaN positions of {k}, {what}"
            )
            gb, wb = np.where(nan, 0, gb), np.where(nan, 0, wb)
        np.testing.assert_array_equal(gb, wb, err_msg=f"{k}, {what}")


def run_both(host, inp: dict, rung: str = "v4") -> tuple[dict, dict]:
    with np.errstate(all="ignore"):
        want = check.forward_backward(emulate.forward, emulate.backward, inp, rung)
    return check.forward_backward(host.forward, host.backward, inp, rung), want


#: v3, the backward with atomics: (rows, D) of every mapping and load width,
#: several row groups each (strips of 16 rows), a short last strip.
ATOMIC_SHAPES = ((70, 7), (37, 512), (35, 1027), (33, 2048))


#: v5, row groups sharing a block: warps (4 a block), blocks of 8, 5 (96
#: threads a row, 480 a block), 2 and 1 group; a last block with empty groups,
#: short last strips, strips of 32 and 64 rows (float16 at 4096 and 8192).
GROUPED_SHAPES = ((70, 64), (37, 512), (150, 768), (40, 4096), (20, 8192),
                  (3, 1024), (60, 1032))
#: v5's rows past registers (the row in shared memory), one dtype each to keep
#: the CPU's time down (512 threads a row): float32 with a second chunk almost
#: empty and a strip of one row after a full one; float16 at the longest row
#: v5 takes, every vector of a thread used.
GROUPED_LONG_CASES = ((33, 8200, F32), (3, 12288, F16))


def test_shapes_reach_every_kernel_variant():
    names = {n for f in kernels.KERNEL_FILES for n in kernels.kernel_params(f)}
    reached = {
        kernels.plan(rows, D, dt).kernel(direction)
        for rows, D in SHAPES
        for dt in (F32, F16)
        for direction in ("forward", "backward")
    } | {
        kernels.plan(rows, D, dt, rung).kernel(direction)
        for rung, shapes in (("v3", ATOMIC_SHAPES), ("v5", GROUPED_SHAPES))
        for rows, D in shapes
        for dt in (F32, F16)
        for direction in ("forward", "backward")
    } | {
        kernels.plan(rows, D, dt, "v5").kernel(direction)
        for rows, D, _ in GROUPED_LONG_CASES
        for dt in (F32, F16)  # the cases' one dtype each reach one variant
        for direction in ("forward", "backward")
    }
    assert reached | {"ln_bwd_reduce_params", "ln_bwd_reduce_params_wide"} == names


@pytest.mark.parametrize("kernel, slices", [
    ("ln_bwd_reduce_params", kernels.constants()["LN_REDUCE_SLICES"]),
    ("ln_bwd_reduce_params_wide", kernels.constants()["LN_REDUCE_SLICES_WIDE"]),
])
def test_second_stages_equal_emulation_bit_for_bit(host, kernel, slices):
    """Both reductions of the partial sums, over counts of rows that leave
    batches of v5's loads full, partial and empty. The two orders differ in
    their last bits, so each kernel is told apart from the other's order."""
    rng = np.random.default_rng(7)
    for rows, D in ((1, 33), (31, 1), (257, 40), (600, 64)):
        parts = [rng.standard_normal((rows, D)).astype(np.float32) * 2.0**20
                 for _ in range(2)]
        with host.buffers() as new:
            ins = [new(a.shape, a.dtype, a) for a in parts]
            outs = [new((D,), np.float32) for _ in range(2)]
            host.launch(kernel, (-(-D // 32),), (32, slices),
                        (*ins, np.int32(rows), np.int32(D), *outs))
            for got, part in zip(outs, parts):
                want = emulate.reduce_partials(part, slices)
                assert got.tobytes() == want.tobytes(), (kernel, rows, D)
    other = {8: 32, 32: 8}[slices]
    assert emulate.reduce_partials(part, other).tobytes() != want.tobytes()


def _slow_from(D: int, longest: int) -> tuple:
    """The slow marker for rows longer than ``longest``: a few seconds each on
    the CPU, they run with the slow tests (`make slow`), not the unit tests."""
    return (pytest.mark.slow,) if D > longest else ()


@pytest.mark.parametrize("rows, D, dtype", [
    pytest.param(rows, D, dt, id=f"{rows}-{D}-{dt}", marks=_slow_from(D, 2048))
    for rows, D, dt in (
        *((rows, D, dt) for rows, D in GROUPED_SHAPES for dt in (F32, F16)),
        *GROUPED_LONG_CASES,
    )
])
def test_grouped_backward_v5_equals_emulation_bit_for_bit(host, rows, D, dtype):
    inp = check.make_inputs(rows, D, dtype, seed=D)
    inp["x"][1, 0] = np.nan  # stays in its row; its column's sums turn NaN
    got, want = run_both(host, inp, "v5")
    assert_same_bits(got, want, f"v5, rows={rows}, D={D}, {dtype}", nan_payload=False)
    with np.errstate(all="ignore"):
        v4 = check.forward_backward(emulate.forward, emulate.backward, inp)
    # dx and the whole forward (v5's own kernel too): v4's arithmetic
    for key in ("y", "mean_hi", "mean_lo", "rstd", "dx"):
        assert got[key].tobytes() == v4[key].tobytes(), key


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("rows, D", ATOMIC_SHAPES)
def test_atomic_backward_v3(host, rows, D, dtype):
    """v3's dx has v4's bits; its dgamma and dbeta are v4's sums in another order,
    within the bound for any two orders. Where a block is one row group, groups
    add one at a time in launch order here, and the bits are those of that order."""
    inp = check.make_inputs(rows, D, dtype, seed=rows)
    p = kernels.plan(rows, D, dtype)
    assert p.row_groups >= 3
    r = check.atomic_check(host.backward, inp)
    assert r["dx_equal"] and r["within"], r
    if p.per_block:
        got, in_order = run_both(host, inp, "v3")
        assert_same_bits(got, in_order, f"v3, rows={rows}, D={D}, {dtype}")


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("rows, D", [
    pytest.param(rows, D, id=f"{rows}-{D}", marks=_slow_from(D, 16384))
    for rows, D in SHAPES
])
def test_source_on_cpu_equals_emulation_bit_for_bit(host, rows, D, dtype):
    p = kernels.plan(rows, D, dtype)
    if rows > p.rows_per_group:
        assert rows % p.rows_per_group
    got, want = run_both(host, check.make_inputs(rows, D, dtype, seed=D))
    assert_same_bits(got, want, f"rows={rows}, D={D}, {dtype}, {p.kernel('forward')}")


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("D", [7, 512, 1027, 12290])
def test_nan_inf_and_constant_rows(host, D, dtype):
    inp = check.make_inputs(21, D, dtype, seed=1)
    x, dy = inp["x"], inp["dy"]
    big = np.finfo(dtype).max / 2
    x[0, D // 2] = np.nan
    x[1, 0] = np.inf
    x[2] = 3  # constant: variance 0, rstd = 1 / sqrt(eps)
    x[3, 0], x[3, -1] = np.inf, -np.inf
    x[4] = -np.inf
    x[5] = big  # constant and huge (in float32 the row sum overflows)
    x[6, ::2], x[6, 1::2] = big, -big
    dy[7, 0] = np.nan
    dy[8, -1] = np.inf
    got, want = run_both(host, inp)
    assert np.isnan(want["y"][0]).all() and np.isfinite(want["y"][9:]).all()
    assert_same_bits(got, want, f"D={D}, {dtype}", nan_payload=False)


def test_leading_dimensions_zero_rows_and_determinism(host):
    inp = check.make_inputs(10, 1027, F32, seed=2)
    inp3 = {k: v.reshape(2, 5, -1) if v.ndim == 2 else v for k, v in inp.items()}
    got, want = run_both(host, inp3)
    assert_same_bits(got, want, "shape (2, 5, 1027)")
    again, _ = run_both(host, inp3)
    assert_same_bits(again, got, "second run")
    empty = np.zeros((0, 7), np.float32)
    y, hi, lo, rstd = host.forward(
        empty, np.ones(7, np.float32), np.zeros(7, np.float32)
    )
    dx, dgamma, dbeta = host.backward(
        empty, empty, np.ones(7, np.float32), hi, lo, rstd
    )
    assert (
        y.shape == (0, 7)
        and hi.shape == (0,)
        and dgamma.shape == dbeta.shape == (7,)
        and (dgamma == 0).all()
        and (dbeta == 0).all()
    )
    # without the second stage: no partial rows, as emulate.column_partials
    for rung in ("v4", "v5"):
        parts = host.backward(empty, empty, np.ones(7, np.float32), hi, lo,
                              rstd, rung=rung, second_stage=False)[1:]
        want = emulate.column_partials(empty, empty, hi, lo, rstd, rung=rung)
        assert [a.shape for a in parts] == [w.shape for w in want] == [(0, 7)] * 2


@pytest.mark.parametrize("D", [1024, 12288])
@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4, 1e6])
def test_accuracy_is_flat_in_the_offset(host, offset, D):
    err = check.offset_errors(host.forward, host.backward, D, offset, rows=4)
    assert err["y"] <= 2e-7 and err["dx"] <= 2e-7, err
    assert err == check.offset_errors(
        emulate.forward, emulate.backward, D, offset, rows=4
    )


def test_build_recompiles_only_the_edited_file(host, tmp_path):
    """Each object is cached under what it reads: an edited copy of the
    long-row file shares the other objects with the package's build (the
    negative controls edit one file each), and an edit of the common file
    changes every kernel object."""
    gxx = shutil.which("g++")
    package = cpu._objects(gxx)
    src = modified_copy(tmp_path, kernels.LONG_FILE,
                        lambda text: text + "\n// an edit\n")
    edited = cpu._objects(gxx, source_dir=src)
    long_unit = kernels.LONG_FILE.removesuffix(".cu")
    assert edited.keys() == package.keys()
    assert {n for n in package if edited[n] != package[n]} == {long_unit}
    lib = cpu.build(source_dir=src)
    assert lib.exists() and all(edited[n].exists() for n in edited)
    assert cpu._objects(gxx, ("-O2",))["alloc"] != package["alloc"]  # flags
    (tmp_path / kernels.COMMON_FILE).write_text(
        (tmp_path / kernels.COMMON_FILE).read_text() + "\n// an edit\n")
    common = cpu._objects(gxx, source_dir=src)
    assert {n for n in package if common[n] != package[n]} == {
        f.removesuffix(".cu") for f in kernels.KERNEL_FILES}


def test_launch_checks_argument_kinds(host):
    with pytest.raises(TypeError, match="NumPy scalar"):
        host.launch("ln_bwd_reduce_params", (1,), (32, 8), (np.zeros(1), 1))


# ---- sanitizers and negative controls (slow) ----------------------------------------


def runtime_present(flags) -> bool:
    preload = cpu.sanitizer_env(flags).get("LD_PRELOAD", "")
    return preload.startswith("/")


def run(code, flags=(), source_dir=None, needed=None) -> tuple[int, str]:
    """Run ``code`` in a child with the library of ``flags``; ``code`` may be
    ``(code, kernels)`` as :func:`selftest` makes it: only those are compiled."""
    if isinstance(code, tuple):
        code, needed = code
    flags = tuple(flags)
    if flags and not runtime_present(flags):
        pytest.skip(f"no sanitizer runtime for {flags}")
    try:
        done = cpu.run_in_subprocess(code, flags, source_dir, needed, timeout=300)
    except RuntimeError as exc:  # g++ without sanitizer support
        pytest.skip(f"cannot build with {flags}: {exc}")
    return done.returncode, done.stdout + done.stderr


def selftest(shapes, flags, source_dir=None, dtypes=("float32", "float16"),
             skip=(), rungs=None) -> tuple[str, tuple]:
    """Code that runs cuda_host.selftest (of ``rungs``, default every rung with
    kernels of its own), except ``(D, dtype, rung)`` in ``skip``, and the
    kernels it launches (the library's, built once)."""
    src = None if source_dir is None else str(source_dir)
    calls, needed = [], set()
    for rows, D in shapes:
        for dtype in dtypes:
            here = tuple(r for r in kernels.rungs_for(D, dtype)
                         if (D, dtype, r) not in skip and (rungs is None or r in rungs))
            needed |= set(cpu.kernels_for(((rows, D),), (dtype,), here))
            calls.append(f"selftest({((rows, D),)!r}, {(dtype,)!r}, "
                         f"{tuple(flags)!r}, {src!r}, {here!r}, KERNELS)")
    needed = tuple(sorted(needed))
    code = f"from cuda_host import selftest\nKERNELS = {needed!r}\n" + "\n".join(calls)
    return code, needed


def modified_copy(tmp_path, filename: str, edit) -> str:
    """Copies of the .cu files in tmp_path, ``filename`` passed through ``edit(text)``.
    """
    for name in (kernels.COMMON_FILE, *kernels.KERNEL_FILES):
        shutil.copy(kernels.SOURCE_DIR / name, tmp_path / name)
    text = (tmp_path / filename).read_text()
    changed = edit(text)
    assert changed != text, (
        f"the edit no longer applies to {filename}: update this control"
    )
    (tmp_path / filename).write_text(changed)
    return str(tmp_path)


def test_sanitized_shapes_reach_every_kernel():
    names = {n for f in kernels.KERNEL_FILES for n in kernels.kernel_params(f)}
    assert set(selftest(SANITIZED_SHAPES, ())[1]) == names
    tsan = selftest(SANITIZED_SHAPES, (), skip=SANITIZED_SKIP["tsan"])[1]
    assert names - set(tsan) == {"ln_bwd_grouped_long_f32_v4",
                                 "ln_bwd_grouped_long_f16_v8",
                                 "ln_fwd_grouped_long_f16_v8"}


RACE = "WARNING: ThreadSanitizer: data race"
OVERFLOW = "ERROR: AddressSanitizer: heap-buffer-overflow"


def _drop_first_block_barrier(text):  # between parking the warp sums and reading them
    at = text.index("block_sum(V v")
    return text[:at] + text[at:].replace("__syncthreads();", "", 1)


def _prefetch_one_past(text):
    at = text.index("auto prefetch = ")
    return text[:at] + text[at:].replace("if (v < nvec)", "if (v <= nvec)", 1)


#: The negative controls: an edit of one file that a check must catch, the
#: selftest that runs it (shape, dtype, rungs), the sanitizer ("" for none)
#: and what the output must say. Each proves that its check can fail.
CONTROLS = {
    # a missing barrier in a block's row sum: a data race
    "missing_barrier": (kernels.COMMON_FILE, _drop_first_block_barrier,
                        (2, 513), "float32", ("v4",), "tsan", (RACE, "block_sum")),
    # the long-row backward without the barrier before its second pass reads
    # the strip's row means while thread 0 may still be writing them
    "long_row_missing_barrier": (
        kernels.LONG_FILE,
        lambda t: t.replace("    __syncthreads();  // every row's means", "    //", 1),
        (2, 8200), "float32", ("v4",), "tsan", (RACE, "layernorm_backward_long")),
    # v3 with a plain += for atomicAdd: the warps of a block (three row groups
    # at 40 x 7) add into the same dgamma words at once
    "plain_add_in_v3": (
        "layernorm_backward.cu",
        lambda t: t.replace("atomicAdd(dgamma_part + v * VEC + c,\n"
                            "                              dgamma_acc[i * VEC + c]);",
                            "dgamma_part[v * VEC + c] += dgamma_acc[i * VEC + c];", 1),
        (40, 7), "float32", ("v3",), "tsan", (RACE, "layernorm_backward")),
    # v5 without the barrier between a group writing its column sums to shared
    # memory and group 0 reading them
    "v5_hand_over_without_barrier": (
        "layernorm_backward.cu",
        lambda t: t.replace("            __syncthreads();\n            if (p == 0) {",
                            "            if (p == 0) {", 1),
        (70, 64), "float32", ("v5",), "tsan", (RACE, "layernorm_backward_grouped")),
    # the forward's row step loading one vector past the row
    "load_past_the_row": (
        "layernorm_forward.cu",
        lambda t: t.replace("if (active && v < nvec)", "if (active && v <= nvec)", 1),
        (3, 7), "float32", ("v4",), "asan", (OVERFLOW, "layernorm_forward")),
    # v5's prefetch copying one vector past the row (read when a wait lands
    # it): at 1028 the 96 threads of a row cover more vectors than it has
    "v5_prefetch_past_the_row": (
        "layernorm_backward.cu", _prefetch_one_past, (3, 1028), "float32", ("v5",),
        "asan", (OVERFLOW, "layernorm_backward_grouped")),
    # the same for v5's forward of long float16 rows: at 8200, 512 threads of
    # 3 vectors cover more than the row's 1025
    "v5_forward_prefetch_past_the_row": (
        "layernorm_forward.cu", _prefetch_one_past, (2, 8200), "float16", ("v5",),
        "asan", (OVERFLOW, "layernorm_forward_grouped")),
    # the long-row kernels reading one vector past the last chunk
    "long_row_read_past_its_end": (
        kernels.LONG_FILE,
        lambda t: t.replace("if (v < nvec) f(v);", "if (v <= nvec) f(v);", 1),
        (2, 8200), "float32", ("v4",), "asan", (OVERFLOW, "layernorm_long")),
    # v5's row loop waiting for all but S copy groups instead of S - 1: the
    # row it reads may still be in flight. On the host a copy lands only when
    # a wait lets its group go, so the slot holds its old bytes (the launch's
    # 0xff, or an earlier row) and the outputs differ from the emulation.
    "v5_wait_one_group_short": (
        kernels.COMMON_FILE,
        lambda t: t.replace("async_wait<S - 1>();  // row k's copies are done",
                            "async_wait<S>();", 1),
        (3, 1028), "float32", ("v5",), "", ("AssertionError",)),
}


@pytest.mark.slow
def test_sanitizers_find_nothing_and_every_control_fails(gxx, tmp_path):
    """Both sanitizers at SANITIZED_SHAPES, clean; then every control of
    CONTROLS, caught. Two at a time (AddressSanitizer beside ThreadSanitizer):
    each builds only the kernels its selftest launches."""
    jobs = {kind: (selftest(SANITIZED_SHAPES, cpu.SANITIZE[kind],
                            skip=SANITIZED_SKIP[kind]), cpu.SANITIZE[kind], None)
            for kind in ("asan", "tsan")}
    for name, (filename, edit, shape, dtype, rungs, kind, _) in CONTROLS.items():
        (tmp_path / name).mkdir()
        src = modified_copy(tmp_path / name, filename, edit)
        flags = cpu.SANITIZE[kind] if kind else ()
        jobs[name] = (selftest((shape,), flags, src, (dtype,), rungs=rungs), flags, src)
    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(jobs, pool.map(lambda job: run(*job), jobs.values())))
    for kind in ("asan", "tsan"):
        rc, out = done[kind]
        assert rc == 0 and out.count("selftest passed") == 2 * len(
            SANITIZED_SHAPES), out[-4000:]
        assert not [d for d in DIRTY if d in out], out[-4000:]
    for name, (*_, expected) in CONTROLS.items():
        rc, out = done[name]
        assert rc != 0 and all(e in out for e in expected), (name, out[-4000:])


@pytest.mark.slow
def test_control_misaligned_vector_load(gxx):
    rows, D = 4, 8
    p = kernels.plan(rows, D, F32)
    assert p.vec == 4
    flags = cpu.SANITIZE["asan"]
    code = f"""
import numpy as np
from cuda_host import HostLayerNorm
h = HostLayerNorm({flags!r}, kernels=({p.kernel("forward")!r},))
with h.buffers() as new:
    x = new(({rows * D + 1},), np.float32, 1.0)[1:]  # 4 bytes past a 16-byte boundary
    assert x.ctypes.data % 16 == 4
    params = [new(({D},), np.float32, 1.0) for _ in range(2)]
    outs = [new(({rows * D},), np.float32)]
    outs += [new(({rows},), np.float32) for _ in range(3)]
    h.launch({p.kernel("forward")!r}, ({p.forward_grid},), ({p.block},),
             (x, *params, *outs, np.int32({rows}), np.int32({D}), np.float32(1e-5)))
print("no error")
"""
    rc, out = run(code, flags, needed=(p.kernel("forward"),))
    # "load of" or "reference binding to" misaligned address, by the optimization
    # level, at the line of Vec<float, 4>::load's one load
    source = (kernels.SOURCE_DIR / kernels.COMMON_FILE).read_text().splitlines()
    at = source.index("template <> struct Vec<float, 4> {")
    line = next(i for i in range(at, len(source))
                if "*reinterpret_cast<const float4*>(p)" in source[i]) + 1
    assert rc != 0 and re.search(
        rf"{kernels.COMMON_FILE}:{line}:\d+: runtime error: .* misaligned address "
        r".*float4", out), out[-4000:]
    assert "no error" not in out, out[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["block_of_48", "lane_returns_early"])
def test_control_partial_warp_shuffle_aborts(gxx, tmp_path, how):
    if how == "block_of_48":  # warp 1 of the block has 16 lanes, and a row
        p = kernels.plan(2, 7, F32)
        assert not p.per_block
        code = f"""
import numpy as np
from cuda_host import HostLayerNorm
h = HostLayerNorm(kernels=({p.kernel("forward")!r},))
with h.buffers() as new:
    args = [new((14,), np.float32, 1.0),
            *(new((7,), np.float32, 1.0) for _ in range(2)),
            new((14,), np.float32), *(new((2,), np.float32) for _ in range(3))]
    h.launch({p.kernel("forward")!r}, (1,), (48,),
             (*args, np.int32(2), np.int32(7), np.float32(1e-5)))
print("no error")
"""
        rc, out = run(code, needed=(p.kernel("forward"),))
        assert "warp 1 has 16 threads" in out, out[-4000:]
    else:  # lane 5 of every warp leaves before the first shuffle

        def lane_returns(text):
            line = re.search(r"^.*= rank_in_group<PER_BLOCK>\(\).*$", text, re.M).group(
                0
            )
            return text.replace(line, line + "\n    if (t == 5) return;", 1)

        src = modified_copy(tmp_path, "layernorm_forward.cu", lane_returns)
        rc, out = run(selftest(((3, 7),), (), src, ("float32",)), (), src)
        assert "1 of 32 threads exited before reaching it" in out, out[-4000:]
    assert (
        rc != 0 and "cuda_host: partial-warp shuffle" in out and "no error" not in out
    )
