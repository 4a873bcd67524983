r"""Timings of layer normalization against this machine's own copy bandwidth.

The cost chapter (``book/05_cost.md``) runs these measurements against
:mod:`lnorm.cost`'s model; ``python -m lnorm.bench`` prints them (the
command line is ``lnorm/bench/__main__.py``). The rungs
of the ladder (:data:`IMPLEMENTATIONS`), forward and backward: ``reference``
(NumPy in the input dtype, one temporary per operator:
:func:`reference_forward`, :func:`reference_backward`), ``tiled``
(:func:`lnorm.forward` / :func:`lnorm.backward` with
``block_rows=tile_rows(D)``: float64 blocks of rows whose temporaries stay in
cache) and ``fused`` (:mod:`lnorm.fused` writing into outputs allocated once,
as a training loop reuses its buffers); beside them ``default``, the library
call with no options (its time over ``fused`` is the price of fresh pages).

Rules shared by the functions that time:

* the **floor**: a copy (one core) between two arrays of four times the
  last-level cache (:func:`copy_arrays`) gives the bandwidth ``B`` (bytes
  read plus written per second); a pass that must move ``b`` bytes
  (:func:`floor_bytes`) takes at least about ``b / B``, and ``x_floor`` is
  its time over that;
* each repetition calls every timed callable once, in an order shuffled by
  ``seed``, after a warm-up call of each (:func:`time_round_robin`), so that
  other processes' noise falls on all alike; ratios are taken within a
  repetition, and their median reported; ``seconds`` holds ``min``,
  ``median``, ``max`` and the ``samples``;
* ``threads``: the BLAS threads (threadpoolctl) and the fused loop's; the
  copy runs on one core, so threads can beat the floor; ``repeat``,
  ``threads`` (``>= 1``) and ``seed`` (``>= 0``) must be integers.

Nothing in these docstrings is a measurement.

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

import functools
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from .. import fused
from ..core import (
    SUPPORTED_DTYPES,
    backward,
    backward_formula,
    forward,
    forward_formula,
    tile_rows,
)
from ..cost import traffic
from ..inputs import make_inputs
from ..validate import check_int

__all__ = [
    "DEFAULT_SHAPES",
    "IMPLEMENTATIONS",
    "MEASURED",
    "reference_forward",
    "reference_backward",
    "floor_bytes",
    "cache_sizes",
    "copy_arrays",
    "copy_bandwidth",
    "time_round_robin",
    "run",
    "thread_scaling",
    "tile_sweep",
    "size_sweep",
    "peak_bytes",
    "machine",
]

#: Input shapes :func:`run` (and ``python -m lnorm.bench``) times by default;
#: the last is past the last-level caches of common CPUs, where
#: :mod:`lnorm.fused` writes with streaming stores.
DEFAULT_SHAPES = ((8, 512, 1024), (32, 1024, 1024), (64, 1024, 1024))
#: The rungs of the ladder, slowest first.
IMPLEMENTATIONS = ("reference", "tiled", "fused")
#: What :func:`run` times, the ladder and the library's default call.
MEASURED = IMPLEMENTATIONS + ("default",)
EPS = 1e-5
MIB = 2**20


# lnorm.cost.numpy_program spells out, step by step, the lines of
# lnorm.core.forward_formula and backward_formula, so the "numpy" schedule of
# the traffic model counts exactly what these two functions move.

def reference_forward(x, gamma, beta, eps: float = EPS):
    r"""Run :func:`lnorm.core.forward_formula`: NumPy in the input dtype.

    Parameters
    ----------
    x : ndarray, shape (..., D)
        Input; the operations run in its dtype (give the parameters the same).
    gamma, beta : ndarray, shape (D,)
    eps : float, default 1e-5

    Returns
    -------
    y : ndarray, shape (rows, D)
        The output, 2-D.
    saved : tuple of ndarray
        ``(xhat, rstd)`` for :func:`reference_backward`.

    Examples
    --------
    >>> y, (xhat, rstd) = reference_forward(np.array([[1.0, 3.0]]), np.ones(2),
    ...                                     np.zeros(2), eps=0.0)
    >>> y
    array([[-1.,  1.]])
    """
    y, _, rstd, xhat = forward_formula(x.reshape(-1, x.shape[-1]), gamma, beta, eps)
    return y, (xhat, rstd)


def reference_backward(dy, saved, gamma):
    r"""Run :func:`lnorm.core.backward_formula`: NumPy in the input dtype.

    Parameters
    ----------
    dy : ndarray, shape (..., D)
    saved : tuple of ndarray
        The ``(xhat, rstd)`` of :func:`reference_forward`.
    gamma : ndarray, shape (D,)

    Returns
    -------
    dx : ndarray, shape (rows, D)
    dgamma, dbeta : ndarray, shape (D,)

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
    shape : sequence of int
        Shape ``(..., D)`` of ``x``.
    dtype : dtype-like

    Returns
    -------
    int

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


def cache_sizes() -> dict[str, int]:
    r"""Read the data-cache sizes of CPU 0 in bytes (``{"L1": ..., "L2": ...}``).

    Returns
    -------
    dict of str to int
        From Linux's sysfs; empty where it is not available.

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
    """A float64 array of ``nbytes`` starting on a 4 KiB boundary."""
    # glibc's rep movsb copy runs slower on some CPUs when source and
    # destination are misaligned with each other.
    buf = np.empty(nbytes + 4096, dtype=np.uint8)
    start = (-buf.ctypes.data) % 4096
    return buf[start:start + nbytes].view(np.float64)


@functools.cache
def copy_arrays(min_bytes: int = 64 * MIB) -> tuple[np.ndarray, np.ndarray]:
    """The copy's page-aligned source and destination, 4 x the last-level cache."""
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
        Size of the array copied (whole float64 elements, at least one).
    repeat : int, default 5

    Returns
    -------
    float
        ``2 * nbytes * copies / seconds``.

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
    """``{key: [seconds of each repetition]}`` of ``calls``, shuffled, warmed up."""
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


def _fused_buffers(x, dy, cache):
    """The fused rung's ``out=`` arrays (y, xhat, dx), each apart from the arrays
    its loop streams with (:func:`lnorm.fused.empty_apart`)."""
    y_buf = fused.empty_apart(x.shape, x.dtype, x)
    xhat_buf = fused.empty_apart(x.shape, x.dtype, x, y_buf)
    return y_buf, xhat_buf, fused.empty_apart(x.shape, x.dtype, dy, cache.xhat)


def _calls(shape, dtype, block_rows: int | None, seed: int, threads: int = 1):
    """Callables for every (implementation, direction), and the tiled block."""
    x, gamma, beta, dy = make_inputs(shape, dtype, seed)
    br = tile_rows(shape[-1]) if block_rows is None else block_rows
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


def _with_copy(calls: dict, src, dst, repeat: int, seed: int):
    """The times of ``calls`` and the copy bandwidth of each round (B/s)."""
    times = time_round_robin({**calls, "copy": lambda: np.copyto(dst, src)},
                             repeat, seed)
    return times, 2.0 * src.nbytes / np.asarray(times.pop("copy"))


def _stats(samples: Sequence[float]) -> dict:
    """``min``, ``median``, ``max`` and the ``samples``."""
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
    """Where the numbers were measured: CPU model, caches, versions, BLAS threads."""
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
    return {"cpu": model, "cache_bytes": cache_sizes(),
            "python": platform.python_version(), "numpy": np.__version__,
            "numba": numba.__version__, "blas": blas, "blas_threads": threads}


def run(shapes: Sequence[Sequence[int]] = DEFAULT_SHAPES,
        dtypes: Sequence[str] = ("float32",), repeat: int = 7,
        block_rows: int | None = None, threads: int = 1, seed: int = 0,
        progress: bool = True) -> dict:
    r"""Measure the ladder against the copy floor; return a JSON-ready dict.

    Every repetition times the copy and each entry of :data:`MEASURED` in
    both directions, in a shuffled order.

    Parameters
    ----------
    shapes : sequence of shapes, default :data:`DEFAULT_SHAPES`
    dtypes : sequence of {"float16", "float32", "float64"}, default ("float32",)
    repeat : int, default 7
    block_rows : int, optional
        Rows per block of ``tiled`` (default ``tile_rows(D)``).
    threads : int, default 1
    seed : int, default 0
    progress : bool, default True
        A progress line on stderr once the run takes over two seconds.

    Returns
    -------
    dict
        ``{"machine", "repeat", "seed", "copy_bytes", "fused_threads",
        "results"}``; a result per (shape, dtype, direction, impl) with
        ``seconds``, ``floor_bytes``, ``copy_gbs`` (the copy bandwidth,
        GB/s), ``gbs`` (floor bytes per median second), ``x_floor``,
        ``speedup_vs_reference`` and ``block_rows`` (None but for ``tiled``).

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
                        "shape": list(shape), "dtype": np.dtype(dt).name,
                        "direction": direction, "impl": impl,
                        "block_rows": br if impl == "tiled" else None,
                        "seconds": _stats(t), "floor_bytes": fb,
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

    Its outputs go into arrays allocated once.

    Parameters
    ----------
    shape : sequence of int
    dtype : dtype-like
    threads : sequence of int, default (1, 2)
        The thread counts (at least one); the first is the baseline.
    repeat : int, default 5
    seed : int, default 0

    Returns
    -------
    dict
        ``{(direction, n): result}`` with ``seconds``, ``x_floor`` and
        ``speedup`` (the median of the baseline's time over this one's).

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
    r"""Time the tiled backward for each ``block_rows``; return the median seconds.

    Parameters
    ----------
    shape : sequence of int
    dtype : dtype-like
    block_rows : sequence of int
        The block sizes (integers >= 1), timed in turn in each repetition.
    repeat : int, default 5
    threads : int, default 1

    Returns
    -------
    list of float
        One per entry of ``block_rows``.

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
    r"""Time each rung as the problem grows through the caches: GB/s per size.

    GB/s is floor bytes per median second; small sizes run many calls per
    sample.

    Parameters
    ----------
    D : int
        Row length.
    rows : sequence of int
        Row counts to time.
    dtype : dtype-like
    direction : {"forward", "backward"}, default "backward"
    repeat : int, default 3
    threads : int, default 1

    Returns
    -------
    dict of str to list of float
        ``{implementation: [GB/s at each row count]}``.

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

    With ``tracemalloc`` (which sees NumPy's allocations), from what was
    allocated before the call; a trace the caller had started keeps running.

    Parameters
    ----------
    fn : callable
        Called once, without arguments.

    Returns
    -------
    int

    Examples
    --------
    >>> peak_bytes(lambda: np.ones(1_000_000)) >= 8_000_000
    True
    """
    tracing = tracemalloc.is_tracing()
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
