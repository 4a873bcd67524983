r"""Timings of layer normalization against this machine's own copy bandwidth.

Run ``python -m lnorm.bench`` (``--help`` for the options; ``--quick`` takes
a few seconds). It times the rungs of the cost chapter's ladder, forward and
backward:

``reference``
    Straightforward NumPy in the input dtype, one temporary per operator
    (:func:`reference_forward`, :func:`reference_backward`): the code a
    tutorial writes.
``tiled``
    :func:`lnorm.forward` / :func:`lnorm.backward` with
    ``block_rows=tile_rows(D)``: the NumPy formula in float64 on blocks of
    rows whose temporaries stay in cache.
``fused``
    :mod:`lnorm.fused`, one compiled pass per row, writing into output arrays
    allocated once (``out=``), as the copy writes into its destination and a
    training loop reuses its buffers;

and, beside the ladder, ``default``: :func:`lnorm.forward` /
:func:`lnorm.backward` with no options, which run the fused loop into new
arrays, on one thread. With ``--threads 1`` its time over ``fused`` is the
price of fresh memory (the operating system zeroes each new page when it
is first touched); with more threads it also includes the threads that
``fused`` has and ``default`` does not.

In every repetition, the **floor**: a copy (``np.copyto``) between two
arrays of at least four times the last-level cache, which gives the copy
bandwidth ``B`` (bytes read plus written per second). An operation that must
move ``b`` bytes (each input read once, each output written once:
:func:`floor_bytes`) cannot take much less than ``b / B``; ``x_floor`` is the
measured time over that.

Every repetition calls the copy and each implementation once, in a shuffled
order (seeded), so that noise from other processes falls on all of them
alike; ratios are taken within a repetition and their median reported.
``--threads`` (default 1: every rung runs on one core) pins the BLAS threads
with threadpoolctl, and is recorded; the fused rung runs its loop on as many
threads. The copy always runs on one core, so the floor is one core's, and
threads can beat it (:func:`thread_scaling` measures how far).

The cost chapter (``book/05_cost.md``) runs these measurements and reads them
against :mod:`lnorm.cost`'s model. Timings depend on the machine and its
load; nothing in these docstrings is a measurement.

Examples
--------
>>> import numpy as np
>>> from lnorm import bench
>>> bench.IMPLEMENTATIONS
('reference', 'tiled', 'fused')
>>> bench.floor_bytes("forward", (2, 4), np.float32)  # x, gamma, beta; y, xhat, rstd
144
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from . import fused
from .core import (
    SUPPORTED_DTYPES,
    backward,
    backward_formula,
    forward,
    forward_formula,
    tile_rows,
)
from .cost import traffic
from .inputs import make_inputs
from .validate import check_int

__all__ = [
    "DEFAULT_SHAPES",
    "QUICK_SHAPES",
    "IMPLEMENTATIONS",
    "MEASURED",
    "reference_forward",
    "reference_backward",
    "floor_bytes",
    "copy_arrays",
    "copy_bandwidth",
    "time_round_robin",
    "run",
    "thread_scaling",
    "tile_sweep",
    "size_sweep",
    "peak_bytes",
    "cache_sizes",
    "machine",
    "format_table",
    "main",
]

#: Input shapes ``python -m lnorm.bench`` times by default.
DEFAULT_SHAPES = ((8, 512, 1024), (32, 1024, 1024))
#: The shape of ``--quick``.
QUICK_SHAPES = ((8, 512, 1024),)
#: The rungs of the ladder, slowest first.
IMPLEMENTATIONS = ("reference", "tiled", "fused")
#: What :func:`run` times: the ladder and the library's default call.
MEASURED = IMPLEMENTATIONS + ("default",)
EPS = 1e-5
MIB = 2**20


# --- the straightforward reference: one temporary per operator --------------------
#
# lnorm.cost.numpy_program spells out, step by step, the lines of
# lnorm.core.forward_formula and backward_formula, so the "numpy" schedule of
# the traffic model counts exactly what these two functions move.

def reference_forward(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = EPS
):
    r"""Run layer norm as straightforward NumPy, in the input dtype.

    :func:`lnorm.core.forward_formula` on the rows of ``x``: one temporary
    per operator, the code a tutorial writes (the ``reference`` rung).

    Parameters
    ----------
    x : ndarray, shape (..., D)
        Input; the operations run in its dtype (give the parameters the same).
    gamma, beta : ndarray, shape (D,)
        Scale and shift.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    y : ndarray, shape (rows, D)
        The output, 2-D.
    saved : tuple of ndarray
        ``(xhat, rstd)``, ``xhat`` of shape ``(rows, D)`` and ``rstd`` of
        shape ``(rows, 1)``, for :func:`reference_backward`.

    See Also
    --------
    reference_backward : The backward from ``saved``.
    lnorm.cost.numpy_program : The traffic of these operations.

    Examples
    --------
    >>> y, (xhat, rstd) = reference_forward(np.array([[1.0, 3.0]]), np.ones(2),
    ...                                     np.zeros(2), eps=0.0)
    >>> y
    array([[-1.,  1.]])
    """
    y, _, rstd, xhat = forward_formula(x.reshape(-1, x.shape[-1]), gamma, beta, eps)
    return y, (xhat, rstd)


def reference_backward(dy: np.ndarray, saved, gamma: np.ndarray):
    r"""Run the compact backward as straightforward NumPy, in the input dtype.

    :func:`lnorm.core.backward_formula` on the rows of ``dy``:
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with
    ``g = gamma * dy``, one temporary per operator.

    Parameters
    ----------
    dy : ndarray, shape (..., D)
        Upstream gradient.
    saved : tuple of ndarray
        The ``(xhat, rstd)`` of :func:`reference_forward`.
    gamma : ndarray, shape (D,)
        The scale.

    Returns
    -------
    dx : ndarray, shape (rows, D)
        Gradient with respect to ``x``, 2-D.
    dgamma, dbeta : ndarray, shape (D,)
        Gradients with respect to ``gamma`` and ``beta``.

    See Also
    --------
    reference_forward : Makes ``saved``.
    lnorm.backward : The library backward these are timed against.

    Examples
    --------
    >>> _, saved = reference_forward(np.array([[1.0, 3.0]]), np.ones(2), np.zeros(2))
    >>> dx, dgamma, dbeta = reference_backward(np.ones((1, 2)), saved, np.ones(2))
    >>> dbeta
    array([1., 1.])
    """
    xhat, rstd = saved
    return backward_formula(dy.reshape(-1, xhat.shape[-1]), xhat, gamma, rstd)


def floor_bytes(direction: str, shape: Sequence[int], dtype) -> int:
    r"""Count the bytes a pass must move at the least: inputs once, outputs once.

    The fused schedule of :func:`lnorm.cost.traffic`, with ``rstd`` in
    float64 as :mod:`lnorm.core` keeps it, and no write-allocate.

    Parameters
    ----------
    direction : {"forward", "backward"}
        Which pass.
    shape : sequence of int
        Shape ``(..., D)`` of ``x``.
    dtype : dtype-like
        Dtype of ``x``.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        An unknown ``direction`` (from :func:`lnorm.cost.traffic`).

    See Also
    --------
    lnorm.cost.traffic : The model this reads.
    copy_bandwidth : The bandwidth the floor divides by.

    Examples
    --------
    >>> floor_bytes("backward", (2, 4), np.float32)  # 3 x 32 + rstd 16 + 3 params x 16
    160
    """
    D = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    itemsize = np.dtype(dtype).itemsize
    t = traffic(direction, "fused", rows=rows, D=D, itemsize=itemsize, stat_itemsize=8)
    return t.bytes


# --- measuring --------------------------------------------------------------------

def cache_sizes() -> dict[str, int]:
    r"""Read the data-cache sizes of CPU 0 in bytes (``{"L1": ..., "L2": ...}``).

    Read from Linux's sysfs (``/sys/devices/system/cpu/cpu0/cache``);
    instruction caches are left out.

    Returns
    -------
    dict of str to int
        Bytes per level; empty where sysfs is not available.

    See Also
    --------
    copy_arrays : Sizes the copy yardstick from the last level.
    machine : Records these with the measurements.

    Examples
    --------
    >>> all(v > 0 for v in cache_sizes().values())
    True
    """
    sizes = {}
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
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


def _page_aligned(nbytes: int) -> np.ndarray:
    """A float64 array of ``nbytes`` starting on a 4 KiB boundary.

    glibc's ``memcpy`` may copy large blocks with ``rep movsb``, which some
    CPUs (AMD Zen among them) run much slower when source and destination
    are misaligned with each other; aligning both keeps the copy a measure
    of memory, not of that.
    """
    buf = np.empty(nbytes + 4096, dtype=np.uint8)
    start = (-buf.ctypes.data) % 4096
    return buf[start:start + nbytes].view(np.float64)


@functools.cache
def copy_arrays(min_bytes: int = 64 * MIB) -> tuple[np.ndarray, np.ndarray]:
    r"""Allocate the source and destination of the copy yardstick.

    Each is ``max(4 x last-level cache, min_bytes)`` long and starts on a
    4 KiB page boundary; the source is filled with ones. Four times the
    last-level cache is large enough that the copy measures main memory.
    Cached: every call in a process with the same ``min_bytes`` returns the
    same two arrays, since
    allocating and first touching them takes seconds where the last-level
    cache is hundreds of MiB. Write into ``dst`` only.

    Parameters
    ----------
    min_bytes : int, default 64 MiB
        The smallest size of each array.

    Returns
    -------
    src, dst : ndarray, float64
        Two arrays of the same size.

    See Also
    --------
    copy_bandwidth : A copy of a given size, timed.
    run : Times ``np.copyto(dst, src)`` in every repetition.

    Examples
    --------
    >>> src, dst = copy_arrays()
    >>> src.nbytes >= 4 * max(cache_sizes().values(), default=0)
    True
    >>> src.nbytes == dst.nbytes, src.ctypes.data % 4096, dst.ctypes.data % 4096
    (True, 0, 0)
    """
    nbytes = max(4 * max(cache_sizes().values(), default=0), min_bytes) // 8 * 8
    src, dst = _page_aligned(nbytes), _page_aligned(nbytes)
    src[:] = 1.0
    return src, dst


def copy_bandwidth(nbytes: int, repeat: int = 5) -> float:
    r"""Time ``np.copyto`` of ``nbytes``: bytes read plus written per second (median).

    Small sizes are copied many times per sample, so that an array which
    fits in a cache measures that cache's bandwidth.

    Parameters
    ----------
    nbytes : int
        Size of the array copied (rounded down to whole float64 elements,
        at least one).
    repeat : int, default 5
        Timed samples; the median is returned.

    Returns
    -------
    float
        ``2 * nbytes * copies / seconds``, in bytes per second.

    See Also
    --------
    copy_arrays : The arrays of the yardstick :func:`run` uses.
    time_round_robin : The timer.

    Examples
    --------
    >>> bw = copy_bandwidth(2**12, repeat=1)
    >>> isinstance(bw, float), bw > 0
    (True, True)
    """
    nbytes = max(8, nbytes // 8 * 8)
    src, dst = _page_aligned(nbytes), _page_aligned(nbytes)
    src[:] = 1.0
    inner = max(1, int(2**26 // src.nbytes))
    copies = {"copy": lambda: [np.copyto(dst, src) for _ in range(inner)]}
    times = time_round_robin(copies, repeat)["copy"]
    return 2.0 * src.nbytes * inner / float(np.median(times))


def time_round_robin(
    calls: dict[object, Callable[[], object]], repeat: int, seed: int = 0
) -> dict[object, list[float]]:
    r"""Time each callable once per repetition, in a shuffled order.

    After one warm-up call of each (it also compiles and pages in), every
    repetition calls each callable once, in an order shuffled by
    ``numpy.random.default_rng(seed)``, so that load from other processes
    falls on all of them alike.

    Parameters
    ----------
    calls : dict of key to callable
        Zero-argument callables; their results are discarded.
    repeat : int
        Timed repetitions.
    seed : int, default 0
        Seeds the order.

    Returns
    -------
    dict of key to list of float
        ``{key: [seconds of repetition 0, 1, ...]}``.

    See Also
    --------
    run : The ladder, timed this way with the copy among the calls.

    Examples
    --------
    >>> t = time_round_robin({"a": lambda: None, "b": lambda: None}, repeat=3)
    >>> sorted(t), len(t["a"])
    (['a', 'b'], 3)
    """
    rng = np.random.default_rng(seed)
    keys = list(calls)
    for fn in calls.values():
        fn()
    times: dict[object, list[float]] = {key: [] for key in keys}
    for _ in range(repeat):
        for i in rng.permutation(len(keys)):
            key = keys[i]
            t0 = time.perf_counter()
            calls[key]()
            times[key].append(time.perf_counter() - t0)
    return times


def _fused_buffers(x, dy, cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fused loop's ``out=`` arrays (y, xhat, dx), allocated once, each apart
    from the arrays its loop streams with (:func:`lnorm.fused.empty_apart`)."""
    y_buf = fused.empty_apart(x.shape, x.dtype, x)
    xhat_buf = fused.empty_apart(x.shape, x.dtype, x, y_buf)
    return y_buf, xhat_buf, fused.empty_apart(x.shape, x.dtype, dy, cache.xhat)


def _calls(shape, dtype, block_rows: int | None, seed: int, threads: int = 1):
    """Zero-argument callables for every (implementation, direction); tiled block.

    The fused rung runs on ``threads`` threads."""
    x, gamma, beta, dy = make_inputs(shape, dtype, seed)
    D = shape[-1]
    br = tile_rows(D) if block_rows is None else block_rows
    _, saved = reference_forward(x, gamma, beta)
    _, cache = forward(x, gamma, beta)
    y_buf, xhat_buf, dx_buf = _fused_buffers(x, dy, cache)
    calls = {
        ("reference", "forward"): lambda: reference_forward(x, gamma, beta),
        ("reference", "backward"): lambda: reference_backward(dy, saved, gamma),
        ("tiled", "forward"): lambda: forward(x, gamma, beta, block_rows=br),
        ("tiled", "backward"): lambda: backward(dy, cache, block_rows=br),
        ("fused", "forward"): lambda: fused.forward(
            x, gamma, beta, out=(y_buf, xhat_buf), threads=threads),
        ("fused", "backward"): lambda: fused.backward(
            dy, cache, out=dx_buf, threads=threads),
        ("default", "forward"): lambda: forward(x, gamma, beta),
        ("default", "backward"): lambda: backward(dy, cache),
    }
    return calls, br


def _with_copy(calls: dict, src: np.ndarray, dst: np.ndarray, repeat: int,
               seed: int) -> tuple[dict, np.ndarray]:
    """:func:`time_round_robin` of ``calls`` with the copy ``dst <- src`` among
    them; returns the calls' times and the copy bandwidth (B/s) of each round."""
    times = time_round_robin({**calls, "copy": lambda: np.copyto(dst, src)},
                             repeat, seed)
    return times, 2.0 * src.nbytes / np.asarray(times.pop("copy"))


def _stats(samples: Sequence[float]) -> dict:
    a = np.asarray(samples, dtype=float)
    return {"min": float(a.min()), "median": float(np.median(a)), "max": float(a.max()),
            "samples": [float(s) for s in a]}


class _Progress:
    """A progress line on stderr, shown once a run has taken more than two seconds."""

    def __init__(self, total: int, stream=None) -> None:
        self.total, self.done = total, 0
        self.stream = sys.stderr if stream is None else stream
        self.start = time.perf_counter()
        self.shown = False

    def step(self, label: str) -> None:
        self.done += 1
        if time.perf_counter() - self.start > 2.0:
            self.stream.write(f"\r[{self.done}/{self.total}] {label:<40}")
            self.stream.flush()
            self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")


def machine(threads: int) -> dict:
    r"""Describe where the numbers were measured: CPU, caches, versions, threads.

    Parameters
    ----------
    threads : int
        The BLAS threads the measurements ran with (recorded as given).

    Returns
    -------
    dict
        ``cpu`` (the model name from ``/proc/cpuinfo``, else the platform's),
        ``cache_bytes`` (:func:`cache_sizes`), ``python``, ``numpy``,
        ``numba``, ``blas`` (threadpoolctl's description of each BLAS
        library) and ``blas_threads``.

    See Also
    --------
    run : Puts this in its report.

    Examples
    --------
    >>> m = machine(1)
    >>> m["blas_threads"], "numba" in m
    (1, True)
    """
    import numba

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = [
        {k: info.get(k) for k in ("internal_api", "version", "architecture")}
        for info in threadpool_info() if info.get("user_api") == "blas"
    ]
    return {
        "cpu": model,
        "cache_bytes": cache_sizes(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "blas": blas,
        "blas_threads": threads,
    }


def run(
    shapes: Sequence[Sequence[int]] = DEFAULT_SHAPES,
    dtypes: Sequence[str] = ("float32",),
    repeat: int = 7,
    block_rows: int | None = None,
    threads: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    r"""Measure the ladder against the copy floor; return a JSON-ready dict.

    Every repetition times the copy yardstick (:func:`copy_arrays`) and each
    entry of :data:`MEASURED` in both directions, in a
    shuffled order (:func:`time_round_robin`).

    Parameters
    ----------
    shapes : sequence of shapes
        Input shapes ``(..., D)``.
    dtypes : sequence of dtype names, default ("float32",)
        float16, float32 or float64.
    repeat : int, default 7
        Timed repetitions of the round robin.
    block_rows : int, optional
        Rows per block of ``tiled`` (default ``tile_rows(D)``).
    threads : int, default 1
        BLAS threads while timing (threadpoolctl), and the threads of the
        fused rung's loop. The copy runs on one thread.
    seed : int, default 0
        Seeds the inputs and the shuffled order.
    progress : bool, default True
        Show a progress line on stderr once the run takes over two seconds.

    Returns
    -------
    dict
        ``{"machine", "repeat", "seed", "copy_bytes", "fused_threads",
        "results"}``; a result
        per (shape, dtype, direction, impl) with ``seconds`` (min, median,
        max, samples), ``floor_bytes``, ``copy_gbs`` (the copy bandwidth of
        the same repetitions, GB/s), ``gbs`` (floor bytes per median second),
        ``x_floor`` and ``speedup_vs_reference`` (medians over repetitions of
        the ratio within a repetition), and ``block_rows`` (the block size
        for ``tiled``, None for the others).

    Raises
    ------
    TypeError
        ``repeat``, ``threads`` or ``seed`` not an integer.
    ValueError
        ``repeat`` or ``threads`` below 1, a negative ``seed``, or a dtype
        that is not float16, float32 or float64. A ``block_rows`` that
        :func:`lnorm.forward` refuses raises its error once timing starts.

    See Also
    --------
    format_table : The report as text.
    main : The command line around this.

    Examples
    --------
    >>> r = run([(4, 8)], repeat=1, progress=False)
    >>> sorted({row["impl"] for row in r["results"]})
    ['default', 'fused', 'reference', 'tiled']
    """
    repeat = check_int(repeat, "repeat", 1)
    threads = check_int(threads, "threads", 1)
    seed = check_int(seed, "seed", 0)
    for dt in dtypes:
        if np.dtype(dt) not in SUPPORTED_DTYPES:
            raise ValueError(f"dtypes must be float16, float32 or float64; got {dt!r}.")
    src, dst = copy_arrays()
    results = []
    bar = _Progress(len(shapes) * len(dtypes)) if progress else None
    with threadpool_limits(limits=threads, user_api="blas"):
        for shape in shapes:
            shape = tuple(int(s) for s in shape)
            for dt in dtypes:
                calls, br = _calls(shape, dt, block_rows, seed, threads)
                times, bw = _with_copy(calls, src, dst, repeat, seed)
                for (impl, direction), ts in times.items():
                    fb = floor_bytes(direction, shape, dt)
                    t = np.asarray(ts)
                    ref = np.asarray(times[("reference", direction)])
                    results.append({
                        "shape": list(shape),
                        "dtype": np.dtype(dt).name,
                        "direction": direction,
                        "impl": impl,
                        "block_rows": br if impl == "tiled" else None,
                        "seconds": _stats(t),
                        "floor_bytes": fb,
                        "copy_gbs": float(np.median(bw)) / 1e9,
                        "gbs": fb / float(np.median(t)) / 1e9,
                        "x_floor": float(np.median(t * bw / fb)),
                        "speedup_vs_reference": float(np.median(ref / t)),
                    })
                if bar:
                    bar.step(f"{shape} {np.dtype(dt).name}")
    if bar:
        bar.close()
    return {"machine": machine(threads), "repeat": repeat, "seed": seed,
            "copy_bytes": int(2 * src.nbytes), "fused_threads": threads,
            "results": results}


def thread_scaling(shape: Sequence[int], dtype, threads: Sequence[int] = (1, 2),
                   repeat: int = 5, seed: int = 0) -> dict:
    r"""Time the fused loop on several thread counts against the one-core floor.

    Every repetition calls the copy yardstick (:func:`copy_arrays`, one core)
    and :func:`lnorm.fused.forward` and :func:`lnorm.fused.backward` with
    each thread count, in a shuffled order (:func:`time_round_robin`), all
    writing into output arrays allocated once.

    Parameters
    ----------
    shape : sequence of int
        Input shape ``(..., D)``.
    dtype : dtype-like
        float16, float32 or float64.
    threads : sequence of int, default (1, 2)
        The thread counts; the first is the baseline of ``speedup``.
    repeat : int, default 5
        Timed repetitions.
    seed : int, default 0
        Seeds the inputs and the order.

    Returns
    -------
    dict
        ``{(direction, n): result}`` for each direction and thread count,
        with ``seconds`` (min, median, max, samples), ``x_floor`` (the
        median over repetitions of time / floor within a repetition) and
        ``speedup`` (the median of the baseline's time over this one's).

    Raises
    ------
    TypeError, ValueError
        A thread count, ``repeat`` or ``seed`` that is not an integer, or
        below 1 (``seed`` below 0); no thread counts.

    See Also
    --------
    run : The ladder; its ``threads`` sets the BLAS threads and the fused
        rung's.

    Examples
    --------
    >>> r = thread_scaling((4, 8), np.float32, threads=(1, 2), repeat=1)
    >>> sorted(r), r["backward", 1]["speedup"]
    ([('backward', 1), ('backward', 2), ('forward', 1), ('forward', 2)], 1.0)
    """
    counts = [check_int(n, "threads", 1) for n in threads]
    if not counts:
        raise ValueError("threads must name at least one thread count; got none.")
    repeat = check_int(repeat, "repeat", 1)
    seed = check_int(seed, "seed", 0)
    x, gamma, beta, dy = make_inputs(shape, dtype, seed)
    _, cache = fused.forward(x, gamma, beta)
    y_buf, xhat_buf, dx_buf = _fused_buffers(x, dy, cache)
    calls = {}
    for n in counts:
        calls["forward", n] = lambda n=n: fused.forward(
            x, gamma, beta, out=(y_buf, xhat_buf), threads=n)
        calls["backward", n] = lambda n=n: fused.backward(
            dy, cache, out=dx_buf, threads=n)
    times, bw = _with_copy(calls, *copy_arrays(), repeat, seed)
    out = {}
    for (direction, n), ts in times.items():
        t = np.asarray(ts)
        base = np.asarray(times[direction, counts[0]])
        out[direction, n] = {
            "seconds": _stats(t),
            "x_floor": float(np.median(t * bw / floor_bytes(direction, shape, dtype))),
            "speedup": float(np.median(base / t)),
        }
    return out


def tile_sweep(shape: Sequence[int], dtype, block_rows: Sequence[int], repeat: int = 5,
               threads: int = 1) -> list[float]:
    r"""Time the tiled backward for each ``block_rows``; return the medians.

    Parameters
    ----------
    shape : sequence of int
        Input shape ``(..., D)``.
    dtype : dtype-like
        Input dtype.
    block_rows : sequence of int
        The block sizes to time, in turn within each repetition.
    repeat : int, default 5
        Timed repetitions.
    threads : int, default 1
        BLAS threads while timing.

    Returns
    -------
    list of float
        Median seconds, one per entry of ``block_rows``.

    Raises
    ------
    TypeError, ValueError
        A block size that :func:`lnorm.backward` refuses (not an integer
        >= 1).

    See Also
    --------
    lnorm.core.tile_rows : The block size the library picks.

    Examples
    --------
    >>> len(tile_sweep((4, 8), np.float32, [1, 4], repeat=1))
    2
    """
    x, gamma, beta, dy = make_inputs(shape, dtype)
    _, cache = forward(x, gamma, beta)
    calls = {
        br: (lambda br=br: backward(dy, cache, block_rows=br)) for br in block_rows
    }
    with threadpool_limits(limits=threads, user_api="blas"):
        times = time_round_robin(calls, repeat)
    return [float(np.median(times[br])) for br in block_rows]


def size_sweep(D: int, rows: Sequence[int], dtype, direction: str = "backward",
               repeat: int = 3, threads: int = 1) -> dict[str, list[float]]:
    r"""Time each implementation as the problem grows; return GB/s per size.

    GB/s is floor bytes per median second. The problem grows through the
    caches into main memory, so the curves show where each implementation
    falls off the cache cliff.

    Parameters
    ----------
    D : int
        Row length.
    rows : sequence of int
        Row counts to time.
    dtype : dtype-like
        Input dtype.
    direction : {"forward", "backward"}, default "backward"
        Which pass.
    repeat : int, default 3
        Timed repetitions; small sizes run many calls per sample.
    threads : int, default 1
        BLAS threads while timing.

    Returns
    -------
    dict of str to list of float
        ``{implementation: [GB/s at each row count]}``.

    See Also
    --------
    floor_bytes : The bytes in the numerator.

    Examples
    --------
    >>> gbs = size_sweep(8, [2, 4], np.float32, repeat=1)
    >>> sorted(gbs), len(gbs["fused"])
    (['fused', 'reference', 'tiled'], 2)
    """
    out: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
    with threadpool_limits(limits=threads, user_api="blas"):
        for n in rows:
            calls, _ = _calls((int(n), D), dtype, None, 0)
            calls = {impl: calls[impl, direction] for impl in IMPLEMENTATIONS}
            # Enough calls per sample that small sizes are not all timer noise.
            inner = max(1, min(200, int(2e6 // (n * D))))
            batched = {
                k: (lambda f=f: [f() for _ in range(inner)]) for k, f in calls.items()
            }
            times = time_round_robin(batched, repeat)
            fb = floor_bytes(direction, (int(n), D), dtype)
            for impl in IMPLEMENTATIONS:
                out[impl].append(fb * inner / float(np.median(times[impl])) / 1e9)
    return out


def peak_bytes(fn: Callable[[], object]) -> int:
    r"""Measure the peak bytes allocated while ``fn()`` ran, its result included.

    Uses ``tracemalloc``, which sees NumPy's array allocations; the
    count starts from what was allocated before the call. It starts
    ``tracemalloc`` and stops it on return; a trace the caller had already
    started is left running (its peak is reset for the measurement).

    Parameters
    ----------
    fn : callable
        Called once, without arguments.

    Returns
    -------
    int
        Peak bytes above the starting point.

    See Also
    --------
    lnorm.cost.cache_bytes : What the forward's cache holds, by the model.

    Examples
    --------
    >>> peak_bytes(lambda: np.ones(1_000_000)) >= 8_000_000
    True
    """
    tracing = tracemalloc.is_tracing()  # a caller's trace is left running
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not tracing:
            tracemalloc.stop()
    del result
    return int(peak)


# --- reporting --------------------------------------------------------------------

def format_table(report: dict) -> str:
    r"""Format a report of :func:`run` as a plain-text table, one line per measurement.

    Parameters
    ----------
    report : dict
        As :func:`run` returns it (only the keys the table shows are read).

    Returns
    -------
    str

    See Also
    --------
    run : Makes the report.

    Examples
    --------
    A report with made-up numbers:

    >>> row = {"shape": [64, 1024], "dtype": "float32", "direction": "backward",
    ...        "impl": "fused", "seconds": {"median": 0.002}, "gbs": 10.0,
    ...        "copy_gbs": 20.0, "x_floor": 2.0, "speedup_vs_reference": 5.0}
    >>> report = {"machine": {"cpu": "Some CPU", "blas_threads": 1}, "repeat": 7,
    ...           "results": [row]}
    >>> print(format_table(report))
    Some CPU, 1 thread(s); 7 shuffled rounds
    floor: bytes the op must move (inputs once, outputs once) / copy bandwidth
    <BLANKLINE>
               shape   dtype     pass      impl       ms   GB/s   copy xfloor  x ref
          (64, 1024) float32 backward     fused    2.000   10.0   20.0   2.00   5.00
    <BLANKLINE>
    ms: median; GB/s: floor bytes / median time; copy: copy bandwidth (GB/s);
    xfloor, x ref: medians over rounds of time / floor and reference / time.
    """
    r0 = report["results"][0] if report["results"] else None
    lines = [
        f"{report['machine']['cpu']}, {report['machine']['blas_threads']} thread(s); "
        f"{report['repeat']} shuffled rounds",
        "floor: bytes the op must move (inputs once, outputs once) / copy bandwidth",
        "",
        f"{'shape':>16} {'dtype':>7} {'pass':>8} {'impl':>9} {'ms':>8} "
        f"{'GB/s':>6} {'copy':>6} {'xfloor':>6} {'x ref':>6}",
    ]
    for r in report["results"]:
        lines.append(
            f"{str(tuple(r['shape'])):>16} {r['dtype']:>7} {r['direction']:>8} "
            f"{r['impl']:>9} {r['seconds']['median'] * 1e3:8.3f} {r['gbs']:6.1f} "
            f"{r['copy_gbs']:6.1f} {r['x_floor']:6.2f} {r['speedup_vs_reference']:6.2f}"
        )
    lines += [
        "",
        "ms: median; GB/s: floor bytes / median time; copy: copy bandwidth (GB/s);",
        "xfloor, x ref: medians over rounds of time / floor and reference / time.",
    ]
    if r0 is None:
        lines.append("(no measurements)")
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m lnorm.bench",
        description="Time the layer-norm ladder (reference, tiled, fused) against "
        "the copy-bandwidth floor.",
    )
    p.add_argument(
        "--shape", type=int, nargs="+", action="append", metavar="N",
        help="an input shape, e.g. --shape 8 512 1024 (repeatable; default: "
        + ", ".join(str(s) for s in DEFAULT_SHAPES) + ")",
    )
    p.add_argument("--dtype", nargs="+", choices=("float16", "float32", "float64"),
                   help="dtypes to time (default: float32)")
    p.add_argument("--repeat", type=int, help="timed rounds (default 7, quick 5)")
    p.add_argument("--block-rows", type=int,
                   help="rows per block of tiled (default tile_rows(D))")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS threads and fused-loop threads (default 1; the "
                   "copy runs on one)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of inputs and order (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quick", action="store_true",
                   help="the shape " + ", ".join(str(s) for s in QUICK_SHAPES)
                   + ", 5 rounds")
    args = p.parse_args(argv)
    for name in ("repeat", "block_rows", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.seed < 0:
        p.error("--seed must be >= 0")
    for shape in args.shape or ():
        if min(shape) < 1:
            p.error(f"--shape sizes must be >= 1; got {shape}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    r"""Run the command line ``python -m lnorm.bench``.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (default: ``sys.argv[1:]``); ``--help`` lists them.

    Returns
    -------
    int
        The exit status, 0.

    Raises
    ------
    SystemExit
        For ``--help`` and for invalid arguments (argparse's exit).

    See Also
    --------
    run : What it measures.
    format_table : What it prints (``--json``: the report itself).

    Examples
    --------
    >>> import contextlib, io
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     status = main(["--shape", "4", "8", "--repeat", "1", "--json"])
    >>> report = json.loads(out.getvalue())
    >>> status, sorted(report), len(report["results"])
    (0, ['copy_bytes', 'fused_threads', 'machine', 'repeat', 'results', 'seed'], 8)
    """
    args = _parse(argv)
    shapes = args.shape or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    dtypes = args.dtype or ("float32",)
    repeat = args.repeat or (5 if args.quick else 7)
    report = run(shapes, dtypes, repeat=repeat, block_rows=args.block_rows,
                 threads=args.threads, seed=args.seed)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
