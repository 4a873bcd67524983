"""Timings of layer normalization against this machine's own copy bandwidth.

Run ``python -m lnorm.bench`` (``--help`` for the options). One run measures

* the copy bandwidth: bytes read plus bytes written per second by
  ``np.copyto`` between two arrays far larger than the last-level cache, the
  fastest any pass over memory can go from NumPy;
* the forward and the backward of three implementations:
  ``reference``, the straightforward NumPy code below (one temporary per
  operator, in the input dtype); ``plain``, :func:`lnorm.forward` /
  :func:`lnorm.backward` (op by op, in float64); ``tiled``, the same with
  ``block_rows=tile_rows(D)`` (blocks whose float64 buffers stay in cache);
* and a fourth backward, ``tiled_f32``: the tiled backward with
  ``work_dtype=np.float32`` (float32 arithmetic, as the GPU kernels do; for
  float16 and float32 inputs only, since it would round float64 ones);

and prints, for each, the median time and that time as a multiple of the
**bandwidth floor**: the bytes the operation must move (each input read once,
each output written once, :func:`lnorm.cost.traffic` with the ``"fused"``
schedule) divided by the copy bandwidth. A ratio near 1 means the code runs
at memory speed; nothing that reads and writes memory can go below it by
much.

Implementations are timed in turn within each repetition, so that noise from
other processes on the machine falls on all of them alike; the median over
the repetitions is reported, with the median number of page faults per call
in the JSON output (fresh memory the operating system maps in for new arrays).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

try:  # POSIX only: page faults are counted where it exists
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None

from .core import (
    SUPPORTED_DTYPES,
    _check_int,
    backward,
    backward_formula,
    forward,
    forward_formula,
    tile_rows,
)
from .cost import traffic

__all__ = [
    "DEFAULT_SHAPES",
    "QUICK_SHAPES",
    "IMPLEMENTATIONS",
    "reference_forward",
    "reference_backward",
    "copy_bandwidth",
    "time_round_robin",
    "make_inputs",
    "floor_bytes",
    "run",
    "tile_sweep",
    "cache_sizes",
    "format_table",
    "main",
]

DEFAULT_SHAPES = ((1, 128, 256), (4, 256, 512), (8, 512, 1024))
QUICK_SHAPES = ((1, 128, 256), (8, 512, 1024))
IMPLEMENTATIONS = ("reference", "plain", "tiled", "tiled_f32")
F32 = np.dtype(np.float32)
EPS = 1e-5


# --- the straightforward reference: one temporary per operator --------------------
#
# The program lnorm.cost.numpy_program spells out step by step is the code of
# lnorm.core.forward_formula and lnorm.core.backward_formula (tests/test_cost.py
# checks that every step appears there verbatim), so the "numpy" schedule of
# the traffic model counts exactly what these two functions move.

def reference_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = EPS):
    """Layer norm as straightforward NumPy, in the input dtype.

    :func:`lnorm.core.forward_formula` on the rows of ``x``. Returns ``y`` and
    ``(xhat, rstd)`` (2-D, ``rstd`` of shape ``(rows, 1)``) for
    :func:`reference_backward`.
    """
    y, _, rstd, xhat = forward_formula(x.reshape(-1, x.shape[-1]), gamma, beta, eps)
    return y, (xhat, rstd)


def reference_backward(dy: np.ndarray, saved, gamma: np.ndarray):
    """The compact backward as straightforward NumPy, in the input dtype.

    :func:`lnorm.core.backward_formula` on the rows of ``dy``, from the
    ``(xhat, rstd)`` of :func:`reference_forward`. Returns ``dx`` (2-D),
    ``dgamma``, ``dbeta``.
    """
    xhat, rstd = saved
    return backward_formula(dy.reshape(-1, xhat.shape[-1]), xhat, gamma, rstd)


# --- measuring --------------------------------------------------------------------

def copy_bandwidth(nbytes: int = 64 * 2**20, repeat: int = 7) -> float:
    """Copy bandwidth in bytes per second: ``2 * nbytes / median time`` of ``np.copyto``.

    The arrays must be much larger than the last-level cache for this to
    measure main memory (64 MiB each by default).
    """
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    seconds, _ = time_round_robin({"copy": lambda: np.copyto(dst, src)}, repeat)
    return 2.0 * src.nbytes / seconds["copy"]


def make_inputs(shape: Sequence[int], dtype, seed: int = 0, *,
                loc: float = 0.5, scale: float = 2.0, param_scale: float = 0.3):
    """Seeded ``x, gamma, beta, dy``: ``x`` and ``dy`` of ``shape``, ``gamma`` and ``beta`` of ``(D,)``.

    Normal draws, in this order from ``numpy.random.default_rng(seed)``:
    ``x`` with mean ``loc`` and standard deviation ``scale`` (by default 0.5
    and 2: an offset the centring must remove), ``gamma`` with mean 1 and
    deviation ``param_scale``, ``beta`` with mean 0 and deviation
    ``param_scale`` (0.3 by default), ``dy`` standard. The defaults give
    values a float16 holds with room to spare; converted to ``dtype`` last.
    """
    rng = np.random.default_rng(seed)
    D = shape[-1]
    x = rng.normal(loc, scale, size=shape).astype(dtype)
    gamma = rng.normal(1.0, param_scale, size=D).astype(dtype)
    beta = rng.normal(0.0, param_scale, size=D).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    return x, gamma, beta, dy


def floor_bytes(direction: str, shape: Sequence[int], dtype) -> int:
    """Bytes ``direction`` must move at the least: the fused schedule's count."""
    D = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    itemsize = np.dtype(dtype).itemsize
    return traffic(direction, "fused", rows=rows, D=D, itemsize=itemsize, stat_itemsize=8).bytes


def _calls(shape, dtype, block_rows: int | None):
    """Zero-argument callables for every (implementation, direction) that applies.

    Also returns the rows per block of each tiled implementation.
    """
    x, gamma, beta, dy = make_inputs(shape, dtype)
    D = shape[-1]
    br = tile_rows(D) if block_rows is None else block_rows
    _, saved = reference_forward(x, gamma, beta)
    _, cache = forward(x, gamma, beta)
    calls = {
        ("reference", "forward"): lambda: reference_forward(x, gamma, beta),
        ("reference", "backward"): lambda: reference_backward(dy, saved, gamma),
        ("plain", "forward"): lambda: forward(x, gamma, beta),
        ("plain", "backward"): lambda: backward(dy, cache),
        ("tiled", "forward"): lambda: forward(x, gamma, beta, block_rows=br),
        ("tiled", "backward"): lambda: backward(dy, cache, block_rows=br),
    }
    blocks = {"tiled": br}
    if np.dtype(dtype).itemsize <= F32.itemsize:
        br32 = tile_rows(D, work_dtype=F32) if block_rows is None else block_rows
        calls["tiled_f32", "backward"] = lambda: backward(
            dy, cache, block_rows=br32, work_dtype=F32
        )
        blocks["tiled_f32"] = br32
    return calls, blocks


def _page_faults() -> int | None:
    """Minor page faults of this process so far (None where not measurable)."""
    if resource is None:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_round_robin(
    calls: dict[object, Callable[[], object]], repeat: int
) -> tuple[dict, dict]:
    """Median time and median page faults of each callable, timed in turn.

    ``calls`` maps keys to zero-argument callables. After one warm-up call of
    each, every repetition calls each once, in order, so that load from
    other processes falls on all of them alike. Returns two dicts keyed like
    ``calls``: median seconds, and median minor page faults (None where they
    cannot be counted). Page faults count the fresh memory a call maps in:
    every new array that the allocator takes from the operating system costs
    one fault per page on first touch.
    """
    for fn in calls.values():
        fn()  # warm-up: page in the outputs, load BLAS
    times = {key: [] for key in calls}
    faults = {key: [] for key in calls}
    for _ in range(repeat):
        for key, fn in calls.items():
            f0 = _page_faults()
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
            if f0 is not None:
                faults[key].append(_page_faults() - f0)
    median_times = {key: float(np.median(ts)) for key, ts in times.items()}
    median_faults = {key: (int(np.median(fs)) if fs else None) for key, fs in faults.items()}
    return median_times, median_faults


def run(
    shapes: Sequence[Sequence[int]] = DEFAULT_SHAPES,
    dtypes: Sequence[str] = ("float32", "float64"),
    repeat: int = 7,
    block_rows: int | None = None,
    bandwidth: float | None = None,
) -> dict:
    """Measure everything; return a JSON-ready dict.

    Parameters
    ----------
    shapes : sequence of shapes
        Input shapes ``(..., D)``.
    dtypes : sequence of dtype names
    repeat : int
        Timed repetitions per measurement (the median is kept).
    block_rows : int, optional
        Rows per block of the tiled implementations (default ``tile_rows(D)``,
        with ``work_dtype=np.float32`` for ``tiled_f32``).
    bandwidth : float, optional
        Copy bandwidth in bytes/s; measured (``repeat`` times) if not given.

    Returns
    -------
    dict
        ``{"machine": {...}, "copy_bandwidth": B/s, "results": [row, ...]}``;
        each row has ``shape, dtype, direction, impl, block_rows, median_s,
        floor_bytes, floor_s, x_floor, speedup_vs_reference, page_faults``
        (the median number of minor page faults per call; None where the
        ``resource`` module is missing).
    """
    repeat = _check_int(repeat, "repeat", 1)
    for dt in dtypes:
        if np.dtype(dt) not in SUPPORTED_DTYPES:
            raise ValueError(f"dtypes must be float16, float32 or float64; got {dt!r}.")
    if bandwidth is None:
        bandwidth = copy_bandwidth(repeat=repeat)
    results = []
    for shape in shapes:
        shape = tuple(int(s) for s in shape)
        for dt in dtypes:
            calls, blocks = _calls(shape, dt, block_rows)
            medians, faults = time_round_robin(calls, repeat)
            for (impl, direction), t in medians.items():
                fb = floor_bytes(direction, shape, dt)
                results.append(
                    {
                        "shape": list(shape),
                        "dtype": np.dtype(dt).name,
                        "direction": direction,
                        "impl": impl,
                        "block_rows": blocks.get(impl),
                        "median_s": t,
                        "floor_bytes": fb,
                        "floor_s": fb / bandwidth,
                        "x_floor": t / (fb / bandwidth),
                        "speedup_vs_reference": medians[("reference", direction)] / t,
                        "page_faults": faults[(impl, direction)],
                    }
                )
    return {
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "processor": platform.processor() or platform.machine(),
            "cache_bytes": cache_sizes(),
            "page_bytes": resource.getpagesize() if resource is not None else None,
        },
        "copy_bandwidth": bandwidth,
        "repeat": repeat,
        "results": results,
    }


def tile_sweep(
    shape: Sequence[int],
    dtype,
    block_rows: Sequence[int],
    repeat: int = 5,
    work_dtypes: Sequence = (None,),
) -> dict:
    """Median time of the tiled backward for each work dtype and ``block_rows`` (seconds).

    Returns ``{work_dtype: [seconds for each block_rows]}``, every
    measurement timed in turn with all the others.
    """
    x, gamma, beta, dy = make_inputs(shape, dtype)
    _, cache = forward(x, gamma, beta)
    calls = {
        (wd, br): (lambda br=br, wd=wd: backward(dy, cache, block_rows=br, work_dtype=wd))
        for wd in work_dtypes
        for br in block_rows
    }
    medians, _ = time_round_robin(calls, repeat)
    return {wd: [medians[wd, br] for br in block_rows] for wd in work_dtypes}


def cache_sizes() -> dict[str, int]:
    """Data-cache sizes in bytes per core (``{"L1": ..., "L2": ..., "L3": ...}``).

    Read from Linux's sysfs; empty where that is not available.
    """
    sizes = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            kind = (idx / "type").read_text().strip()
            level = (idx / "level").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        if digits.isdigit():
            sizes[f"L{level}"] = int(digits) * scale
    return sizes


# --- reporting --------------------------------------------------------------------

def format_table(report: dict) -> str:
    """The report as a plain-text table (one line per measurement, 80 columns)."""
    bw = report["copy_bandwidth"]
    lines = [
        f"copy bandwidth {bw / 1e9:.1f} GB/s (read + write, np.copyto); "
        f"medians of {report['repeat']} runs",
        "floor: bytes the op must move (inputs read once, outputs written once)",
        "  divided by the copy bandwidth",
        "",
        f"{'shape':>14} {'dtype':>7} {'pass':>8} {'impl':>9} {'block':>5} "
        f"{'ms':>7} {'floor':>6} {'xfloor':>6} {'x ref':>5}",
    ]
    for r in report["results"]:
        block = "" if r["block_rows"] is None else str(r["block_rows"])
        lines.append(
            f"{str(tuple(r['shape'])):>14} {r['dtype']:>7} {r['direction']:>8} {r['impl']:>9} "
            f"{block:>5} {r['median_s'] * 1e3:7.3f} {r['floor_s'] * 1e3:6.3f} "
            f"{r['x_floor']:6.2f} {r['speedup_vs_reference']:5.2f}"
        )
    lines.append("")
    lines.append("ms: median time; floor: bandwidth floor in ms; xfloor = ms / floor;")
    lines.append("x ref = reference ms / ms (how many times faster than the reference).")
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m lnorm.bench",
        description="Time layer norm (reference, plain, tiled, tiled_f32) against the copy-bandwidth floor.",
    )
    p.add_argument(
        "--shape", type=int, nargs="+", action="append", metavar="N",
        help="an input shape, e.g. --shape 8 512 1024 (repeatable; default: "
        + ", ".join(str(s) for s in DEFAULT_SHAPES) + ")",
    )
    p.add_argument(
        "--dtype", nargs="+", choices=("float16", "float32", "float64"),
        help="dtypes to time (default: float32 float64)",
    )
    p.add_argument("--repeat", type=int, help="timed runs per measurement (default 7, quick 3)")
    p.add_argument("--block-rows", type=int, help="rows per block of the tiled versions (default tile_rows(D))")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument(
        "--quick", action="store_true",
        help="fewer shapes " + ", ".join(str(s) for s in QUICK_SHAPES) + ", float32, 3 runs",
    )
    args = p.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.block_rows is not None and args.block_rows < 1:
        p.error("--block-rows must be >= 1")
    for shape in args.shape or ():
        if min(shape) < 1:
            p.error(f"--shape sizes must be >= 1; got {shape}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``python -m lnorm.bench``)."""
    args = _parse(argv)
    shapes = args.shape or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    dtypes = args.dtype or (("float32",) if args.quick else ("float32", "float64"))
    repeat = args.repeat or (3 if args.quick else 7)
    report = run(shapes, dtypes, repeat=repeat, block_rows=args.block_rows)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
