r"""``python -m lnorm.gpu.measure``: check and time the kernels on a GPU, in one run.

With a CUDA device it checks the kernels against :mod:`lnorm.gpu.emulate`
bit for bit (:func:`bit_checks`), measures the error against float64 as the
row offset grows (:func:`offset_sweep`), and times the copy yardstick and
every rung (v1, the op-by-op CuPy version; v3, v4, v5) at :data:`SHAPES`:
each timing the median of CUDA-event timings of single calls after warm-up,
queued while the GPU spins (the host's launch time is not counted), L2
flushed before every call under :data:`L2_FLUSH_BELOW` bytes. It writes all
of it, with the device and the versions, as JSON. Without a GPU it writes a
*dry run*: the plan of every launch it would time, and why it could not.

``--launch-only`` launches every kernel once at awkward shapes (for
``compute-sanitizer``), ``--profile ROWS D DTYPE`` runs one shape a few times
(for ``ncu``). :func:`kernels_measured` and :func:`plan_changed` say whether a
data file timed the kernels and launches of this build.

Examples
--------
>>> run = dry_run("no GPU here")
>>> run["gpu"], len(run["launches"]) == len(SHAPES) * len(DTYPES)
(False, True)
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

from ..cost import traffic
from . import check, emulate
from .kernels import (
    KERNEL_FILES,
    REGISTER_FILES,
    RUNGS,
    compile_ptx,
    plan,
    rungs_for,
    source,
)
from .ptx import entries

__all__ = [
    "SHAPES", "LONG_SHAPES", "DTYPES", "L2_FLUSH_BELOW", "COPY_BYTES", "source_digest",
    "ptx_digests",
    "kernels_measured", "plan_changed", "plan_launches", "dry_run", "copy_yardstick",
    "bit_checks", "offset_sweep", "hold_cycles", "time_rungs", "time_shapes",
    "large_rows_check", "launch_only", "measure", "main",
]

#: The timed shapes — 8192 rows of the widths of common transformers.
SHAPES = tuple((8192, D) for D in (768, 1024, 4096, 8192, 12288))
#: Rows past v5's and past a multiple of the vector, for the bit checks.
LONG_SHAPES = ((3, 12290), (2, 65537))
#: The storage types every shape is timed and checked in.
DTYPES = ("float32", "float16")
#: Problems smaller than this (bytes the op moves) are timed with L2 flushed.
L2_FLUSH_BELOW = 200 * 2**20
#: The copy yardstick — a device-to-device copy of this many bytes.
COPY_BYTES = 2**30


def _bytes(direction: str, rows: int, D: int, dtype) -> int:
    """Bytes the op must move: the fused schedule of :func:`lnorm.cost.traffic`
    with the three statistics the kernels save (mean_hi, mean_lo, rstd)."""
    itemsize = np.dtype(dtype).itemsize
    return traffic(direction, "fused", rows=rows, D=D, itemsize=itemsize,
                   saved="x_mean_rstd", mean_parts=2).bytes


def plan_launches(shapes=SHAPES, dtypes=DTYPES) -> list[dict]:
    r"""Plan the launch of every timed shape, or say why the kernels cannot take it.

    Needs no GPU: this is what a dry run writes.

    Examples
    --------
    >>> for e in plan_launches(shapes=((8192, 768),)):
    ...     print(e["dtype"], e["kernel_forward"], e["block"], e["bytes_forward"])
    float32 ln_fwd_block_f32_v4 64 50436096
    float16 ln_fwd_block_f16_v8 64 25267200
    >>> e = plan_launches(((8192, 12288),), ("float32",))[0]
    >>> e["kernel_backward"], list(e["rungs"]), e["rungs"]["v5"]["kernel_backward"]
    ('ln_bwd_long_f32_v4', ['v5'], 'ln_bwd_grouped_long_f32_v4')
    >>> v5 = plan_launches(((8192, 4096),), ("float16",))[0]["rungs"]["v5"]
    >>> v5["kernel_backward"], v5["backward_block"], v5["partials_bytes"]
    ('ln_bwd_grouped_block_f16_v8', 512, 8388608)
    >>> v5["backward_shared_bytes"]  # the prefetch buffers: 512 threads x 128 B
    65536
    >>> plan_launches(((2**31, 64),), ("float32",))[0]["unsupported"][:28]
    'rows must be below 2**31 (th'
    """
    out = []
    for rows, D in shapes:
        for dtype in dtypes:
            entry = {"rows": rows, "D": D, "dtype": dtype,
                     "bytes_forward": _bytes("forward", rows, D, dtype),
                     "bytes_backward": _bytes("backward", rows, D, dtype)}
            try:
                p = plan(rows, D, dtype)
            except ValueError as exc:
                entry["unsupported"] = str(exc)
            else:
                entry.update(kernel_forward=p.kernel("forward"),
                             kernel_backward=p.kernel("backward"),
                             block=p.block, forward_grid=p.forward_grid,
                             backward_grid=p.backward_grid, row_groups=p.row_groups,
                             rows_per_group=p.rows_per_group,
                             partials_bytes=p.partials_bytes)
                others = [r for r in rungs_for(D, dtype) if r != "v4"]
                if others:  # the other rungs' launches
                    entry["rungs"] = {}
                    for rung in others:
                        q = plan(rows, D, dtype, rung)
                        entry["rungs"][rung] = {
                            "kernel_forward": q.kernel("forward"),
                            "forward_grid": q.forward_grid,
                            "forward_rows_per_group": q.forward_rows_per_group,
                            "forward_shared_bytes": q.forward_shared_bytes,
                            "kernel_backward": q.kernel("backward"),
                            "backward_block": q.backward_block or q.block,
                            "backward_grid": q.backward_grid,
                            "rows_per_group": q.rows_per_group,
                            "partials_bytes": q.partials_bytes,
                            "backward_shared_bytes": q.backward_shared_bytes}
            out.append(entry)
    return out


def source_digest(files=KERNEL_FILES) -> str:
    r"""Hash the kernel sources as compiled: which kernels a measurement timed.

    Examples
    --------
    >>> digest = source_digest()
    >>> len(digest), digest == source_digest()
    (64, True)
    >>> from lnorm.gpu.kernels import REGISTER_FILES
    >>> source_digest(REGISTER_FILES) == digest
    False
    """
    h = hashlib.sha256()
    for filename in files:
        h.update(source(filename).encode())
    return h.hexdigest()


def ptx_digests(files=KERNEL_FILES, arch: str = "sm_90",
                canonical: bool = False) -> dict[str, str]:
    r"""Hash the PTX of every kernel, one digest per kernel: what the GPU ran.

    A source edit that leaves a kernel's compiled code alone (a comment, a
    kernel added or removed beside it) changes :func:`source_digest` but not
    this digest. Branch labels, which NVRTC numbers by the kernel's place in
    its file, are renumbered first; with ``canonical``, the declarations of
    shared variables that NVRTC moves into a kernel when no other kernel of
    its file uses them are put back where they were. Needs only NVRTC (pinned
    in ``requirements.txt``; another version may print other PTX).

    Examples
    --------
    >>> digests = ptx_digests(["layernorm_backward.cu"])
    >>> len(digests["ln_bwd_block_f32_v4"]), "ln_bwd_reduce_params" in digests
    (64, True)
    """
    out = {}
    for filename in files:
        for name, text in entries(compile_ptx(filename, arch)).items():
            text = re.sub(r"\$L__BB\d+_", "$L__BB_", text)
            if canonical:
                text = re.sub(r"(\t// demoted variable\n\t\.shared [^\n]*\n)+", "\n",
                              text)
            out[name] = hashlib.sha256(text.encode()).hexdigest()
    return out


def kernels_measured(data: dict, ptx_record: dict | None = None) -> str:
    r"""Say whether a measurement timed the kernels of this build.

    ``"sources"``: the same sources; ``"ptx"``: every kernel of this build
    that the measurement recorded compiles to the PTX it had (either digest
    of :func:`ptx_digests`; kernels since retired are history and do not
    count); ``"changed"`` otherwise. ``ptx_record`` gives the digests of an
    older file that has none.

    Examples
    --------
    >>> from lnorm.gpu.kernels import REGISTER_FILES
    >>> files = list(REGISTER_FILES)
    >>> kernels_measured({"source_sha256": source_digest(files), "source_files": files})
    'sources'
    >>> old = {"source_sha256": "0" * 64, "source_files": files}
    >>> kernels_measured(old)
    'changed'
    >>> now = ptx_digests(files)
    >>> kernels_measured(old, {"source_sha256": "0" * 64, "ptx_sha256": now})
    'ptx'
    >>> gone = {**now, "ln_fwd_retired": "0" * 64}  # a kernel since retired
    >>> kernels_measured({**old, "ptx_sha256": gone})
    'ptx'
    >>> edited = {**now, "ln_fwd_warp_f32_v4": "0" * 64}
    >>> kernels_measured({**old, "ptx_sha256": edited})
    'changed'
    """
    files = data.get("source_files", REGISTER_FILES)
    if data["source_sha256"] == source_digest(files):
        return "sources"
    recorded = data.get("ptx_sha256")
    if recorded is None and ptx_record is not None:
        if ptx_record.get("source_sha256") == data["source_sha256"]:
            recorded = ptx_record["ptx_sha256"]
    if recorded:
        now, canon = ptx_digests(files), ptx_digests(files, canonical=True)
        if all(digest in (now[name], canon[name])
               for name, digest in recorded.items() if name in now):
            return "ptx"
    return "changed"


def plan_changed(data: dict) -> set[tuple]:
    r"""The launches a measurement made that this build would plan differently.

    A timing belongs to the kernels *and* to their launch: the grid, the
    block and the strips. This compares each launch the measurement
    recorded (``data["launches"]``) with :func:`plan_launches` today.

    Examples
    --------
    >>> run = dry_run("no GPU here")
    >>> plan_changed(run)
    set()
    >>> run["launches"][0]["rungs"]["v5"]["forward_grid"] += 1
    >>> sorted(plan_changed(run))
    [(8192, 768, 'float32', 'v5')]
    """
    shapes = [(e["rows"], e["D"]) for e in data["launches"]]
    dtypes = [e["dtype"] for e in data["launches"]]
    now = {(e["rows"], e["D"], e["dtype"]): e
           for e in plan_launches(sorted(set(shapes)), sorted(set(dtypes)))}
    changed = set()
    for e in data["launches"]:
        key = (e["rows"], e["D"], e["dtype"])
        today = now.get(key, {})
        base = {k: v for k, v in e.items() if k != "rungs"}
        if base != {k: v for k, v in today.items() if k != "rungs"}:
            changed.add((*key, "v4"))
        for rung, launch in e.get("rungs", {}).items():
            if launch != today.get("rungs", {}).get(rung):
                changed.add((*key, rung))
    return changed


def _header() -> dict:
    return {
        "date": datetime.date.today().isoformat(),
        "source_sha256": source_digest(),
        "source_files": list(KERNEL_FILES),
        "ptx_sha256": ptx_digests(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "host": platform.node(),
    }


def dry_run(reason: str) -> dict:
    r"""Describe what a run would do, without a GPU: the plans of every timed launch.

    Examples
    --------
    >>> run = dry_run("no GPU here")
    >>> run["gpu"], run["reason"], len(run["launches"])
    (False, 'no GPU here', 10)
    """
    return {**_header(), "gpu": False, "reason": reason, "launches": plan_launches()}


# --------------------------------------------------------------------- GPU part
def _versions(cp) -> dict:
    rt = cp.cuda.runtime
    dev = cp.cuda.Device()
    props = rt.getDeviceProperties(dev.id)
    name = (props["name"].decode() if isinstance(props["name"], bytes)
            else str(props["name"]))
    return {
        "device": name,
        "compute_capability": dev.compute_capability,
        "sm_count": int(props["multiProcessorCount"]),
        "l2_bytes": int(props["l2CacheSize"]),
        "memory_bytes": int(props["totalGlobalMem"]),
        "driver": rt.driverGetVersion(),
        "cuda_runtime": rt.runtimeGetVersion(),
        "cupy": cp.__version__,
    }


#: A kernel that keeps the GPU busy while the host queues the timed calls.
_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def hold_cycles(host_s: float, repeat: int) -> int:
    """Clock cycles to spin while ``repeat`` calls of ``host_s`` seconds of
    host time each are queued: twice that time, with 50 us a call more, plus
    1 ms, at most a second, at 2.5e9 cycles a second, above any GPU's clock
    today, so that the spin lasts at least that long. ``dev/peers.py``
    holds the GPU as long.

    >>> hold_cycles(100e-6, 30) / 2.5e9  # 2 * 30 * 150 us + 1 ms
    0.01
    """
    return int(min(1.0, 2 * repeat * (host_s + 50e-6) + 1e-3) * 2.5e9)


class _Timer:
    """Median of CUDA-event timings, each call alone, after warm-up.

    Each call sits between two events, and every call is queued while the GPU
    is held in a spin kernel: the host's time to launch (Python's, tens of
    microseconds a call) then overlaps the GPU's work instead of being
    counted in it, and the events time the GPU alone. A GPU that finished the
    spin before the host had queued every call would count the host's time
    again; ``queued_ahead`` records that it did not.
    """

    def __init__(self, cp, repeat: int):
        self.cp = cp
        self.repeat = repeat
        # > the L2 of any GPU today
        self.scratch = cp.empty(256 * 2**20, dtype=cp.uint8)
        self.spin = cp.RawKernel(_SPIN, "spin")

    def __call__(self, fn, *args, flush: bool) -> dict:
        cp = self.cp
        t0 = time.perf_counter()
        for _ in range(3):
            fn(*args)
        host_s = (time.perf_counter() - t0) / 3  # per call, launches being async
        cp.cuda.get_current_stream().synchronize()
        self.spin((1,), (1,), (np.int64(hold_cycles(host_s, self.repeat)),))
        released = cp.cuda.Event()
        released.record()
        pairs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(self.repeat)]
        for start, stop in pairs:
            if flush:
                self.scratch.fill(1)
            start.record()
            fn(*args)
            stop.record()
        queued_ahead = not released.done
        pairs[-1][1].synchronize()
        times = [cp.cuda.get_elapsed_time(a, b) * 1e-3 for a, b in pairs]
        return {"median_s": float(np.median(times)), "min_s": float(np.min(times)),
                "max_s": float(np.max(times)), "repeat": self.repeat,
                "l2_flushed": flush, "queued_ahead": queued_ahead}


def copy_yardstick(cp, timer: _Timer) -> dict:
    r"""Time a 1 GiB device-to-device copy: the bandwidth a read-and-write op can reach.

    Needs a GPU. ``cudaMemcpyAsync`` of :data:`lnorm.gpu.measure.COPY_BYTES`
    bytes, timed without flushing L2 (the copy is far larger than any L2);
    the bytes counted are those read plus those written.

    Examples
    --------
    >>> 2 * COPY_BYTES / 2**30  # GiB counted per copy: read once, written once
    2.0
    """
    src = cp.ones(COPY_BYTES, dtype=cp.uint8)
    dst = cp.empty_like(src)

    def copy():
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, COPY_BYTES,
                                    cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)

    t = timer(copy, flush=False)
    return {"bytes": 2 * COPY_BYTES, **t, "bandwidth": 2 * COPY_BYTES / t["median_s"]}


def _launchable(fused, rows: int, D: int, dtype) -> list[str]:
    """The rungs the plan takes at this shape and this GPU can launch."""
    return [r for r in rungs_for(D, dtype) if fused.takes(rows, D, dtype, r)]


def bit_checks(fused) -> list[dict]:
    r"""Compare the kernels with the emulation byte by byte at every checked shape.

    v3's, whose column sums depend on the order of its atomics, as
    :func:`lnorm.gpu.check.atomic_check` compares them.

    Examples
    --------
    >>> from lnorm.gpu import check
    >>> len(((64, 1), (3, 2), *check.SHAPES, *LONG_SHAPES)) * len(DTYPES)
    26
    >>> from lnorm.gpu.run import FusedLayerNorm, available
    >>> if available()[0]:  # a GPU: every bit equal
    ...     assert all(c["equal"] for c in bit_checks(FusedLayerNorm()))
    """
    def differing(inp, rung):
        got = check.forward_backward(fused.forward, fused.backward, inp, rung)
        want = check.forward_backward(emulate.forward, emulate.backward, inp, rung)
        return {k: int(np.sum(got[k].view(np.uint8) != want[k].view(np.uint8)))
                for k in want}

    out = []
    for rows, D in ((64, 1), (3, 2), *check.SHAPES, *LONG_SHAPES):
        for dtype in DTYPES:
            inp = check.make_inputs(rows, D, dtype, seed=rows + D)
            diff = differing(inp, "v4")
            out.append({"rows": rows, "D": D, "dtype": dtype, "bytes_differing": diff,
                        "equal": all(v == 0 for v in diff.values())})
            rungs = _launchable(fused, rows, D, dtype)
            if "v3" in rungs:  # v3: dx bit for bit, dgamma and dbeta to a bound
                out[-1]["v3"] = check.atomic_check(fused.backward, inp)
            if "v5" in rungs:
                out[-1]["v5_equal"] = not any(differing(inp, "v5").values())
    return out


def offset_sweep(run, D: int = 1024, rows: int = 64,
                 offsets=(0.0, 1e2, 1e3, 1e4, 1e5, 1e6)) -> list[dict]:
    r"""Measure the errors against float64 as the rows are shifted by an offset.

    ``x`` has standard-normal rows plus ``offset`` (so the offset is in units
    of the row's standard deviation), ``dy`` is standard normal, float32.
    The errors of ``y``, ``dx``, ``dgamma``, ``dbeta`` are those of
    :func:`lnorm.gpu.check.relative_errors`. Runs on any implementation, the
    NumPy emulation included.

    Examples
    --------
    >>> from lnorm.gpu import emulate
    >>> sweep = offset_sweep((emulate.forward, emulate.backward), D=64, rows=4,
    ...                      offsets=(0.0, 1e4))
    >>> [s["offset"] for s in sweep], all(s["y"] < 1e-6 for s in sweep)
    ([0.0, 10000.0], True)
    """
    forward, backward = run
    rng = np.random.default_rng(0)
    base = rng.standard_normal((rows, D))
    dy = rng.standard_normal((rows, D)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(D)).astype(np.float32)
    out = []
    for offset in offsets:
        inp = {"x": (base + offset).astype(np.float32), "gamma": gamma, "beta": beta,
               "dy": dy}
        got = check.forward_backward(forward, backward, inp)
        out.append({"offset": offset,
                    **check.relative_errors(got, check.reference(inp))})
    return out


def time_rungs(cp, fused, timer: _Timer, shapes=SHAPES, dtypes=DTYPES,
               rungs=("v1", "v3", "v4", "v5")) -> list[dict]:
    r"""Time every rung's forward and backward at every shape.

    L2 is flushed before every call of an op under :data:`L2_FLUSH_BELOW`
    bytes.

    Examples
    --------
    >>> e = plan_launches(((8192, 768),), ("float32",))[0]
    >>> e["kernel_forward"], e["bytes_forward"] < L2_FLUSH_BELOW  # L2 flushed
    ('ln_fwd_block_f32_v4', True)
    """
    from .run import unfused_backward, unfused_forward

    out = []
    for entry in plan_launches(shapes, dtypes):
        rows, D, dtype = entry["rows"], entry["D"], entry["dtype"]
        inp = {k: cp.asarray(v) for k, v in check.make_inputs(rows, D, dtype).items()}
        args_f = (inp["x"], inp["gamma"], inp["beta"])
        todo = {"v1": (unfused_forward, unfused_backward)}
        if "unsupported" not in entry:
            todo["v4"] = (fused.forward, fused.backward)
            rungs_here = _launchable(fused, rows, D, dtype)
            if "v3" in rungs_here:  # its own backward, v4's forward
                todo["v3"] = (fused.forward,
                              functools.partial(fused.backward, rung="v3"))
            if "v5" in rungs_here:  # both
                todo["v5"] = (functools.partial(fused.forward, rung="v5"),
                              functools.partial(fused.backward, rung="v5"))
        for rung, (fwd, bwd) in todo.items():
            if rung not in rungs:
                continue
            y, hi, lo, rstd = fwd(*args_f)
            args_b = (inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd)
            for direction, fn, args in (("forward", fwd, args_f),
                                        ("backward", bwd, args_b)):
                if rung == "v3" and direction == "forward":
                    continue
                nbytes = entry[f"bytes_{direction}"]
                t = timer(fn, *args, flush=nbytes < L2_FLUSH_BELOW)
                out.append({"rung": rung, "direction": direction, "rows": rows, "D": D,
                            "dtype": dtype, "bytes": nbytes, **t,
                            "bandwidth": nbytes / t["median_s"]})
            del y, hi, lo, rstd
        del inp
        cp.get_default_memory_pool().free_all_blocks()
    return out


def time_shapes(cp, fused, timer: _Timer, shapes=SHAPES,
                rungs=("v1", "v3", "v4", "v5")) -> dict:
    r"""Time the copy yardstick, then the rungs at ``shapes``, each timing with
    its share of the copy's bandwidth.

    Needs a GPU.

    Examples
    --------
    >>> from lnorm.gpu.run import available
    >>> if available()[0]:  # a GPU: every timing has its share
    ...     import cupy as cp
    ...     from lnorm.gpu.run import FusedLayerNorm
    ...     out = time_shapes(cp, FusedLayerNorm(), _Timer(cp, 3), SHAPES[:1])
    ...     assert all(0 < t["copy_share"] < 2 for t in out["timings"])
    """
    copy = copy_yardstick(cp, timer)
    timings = time_rungs(cp, fused, timer, shapes, rungs=rungs)
    for t in timings:
        t["copy_share"] = t["bandwidth"] / copy["bandwidth"]
    return {"copy": copy, "timings": timings}


def large_rows_check(cp, fused, rows: int = 524_800, D: int = 4096) -> dict:
    r"""Check more than 2**31 elements (float16): 64-bit offsets, on sampled rows.

    Needs a GPU with tens of GB of memory (``x``, ``dy``, ``y`` and ``dx``
    hold over 2**31 float16 elements each). ``y`` and ``dx`` of the first and
    last 32 rows are compared bit for bit with the emulation (each row
    depends on itself alone); ``dbeta`` with a float64 sum of ``dy`` over all
    rows.

    Examples
    --------
    >>> from lnorm.gpu.kernels import plan
    >>> rows, D = 524_800, 4096
    >>> rows * D > 2**31, plan(rows, D, "float16").kernel("forward")
    (True, 'ln_fwd_block_f16_v8')
    """
    rng = cp.random.default_rng(1)
    x = rng.standard_normal((rows, D), dtype=cp.float32).astype(cp.float16)
    dy = rng.standard_normal((rows, D), dtype=cp.float32).astype(cp.float16)
    gamma = cp.ones(D, dtype=cp.float16)
    beta = cp.zeros(D, dtype=cp.float16)
    y, hi, lo, rstd = fused.forward(x, gamma, beta)
    dx, dgamma, dbeta = fused.backward(dy, x, gamma, hi, lo, rstd)
    sample = np.r_[0:32, rows - 32:rows]
    xs, dys = x[sample].get(), dy[sample].get()
    ey, ehi, elo, ers = emulate.forward(xs, gamma.get(), beta.get())
    edx, _, _ = emulate.backward(dys, xs, gamma.get(), ehi, elo, ers)
    dbeta64 = cp.zeros(D, dtype=cp.float64)
    for start in range(0, rows, 65536):
        dbeta64 += dy[start:start + 65536].astype(cp.float64).sum(axis=0)
    dbeta_err = float(cp.max(cp.abs(dbeta - dbeta64)) / cp.max(cp.abs(dbeta64)))
    return {"rows": rows, "D": D, "elements": rows * D, "dtype": "float16",
            "y_sampled_rows_equal": bool(np.array_equal(
                y[sample].get().view(np.uint16), ey.view(np.uint16))),
            "dx_sampled_rows_equal": bool(np.array_equal(
                dx[sample].get().view(np.uint16), edx.view(np.uint16))),
            "dbeta_relative_error": dbeta_err}


def launch_only(fused) -> int:
    r"""Launch every kernel once at awkward shapes (for ``compute-sanitizer``).

    Examples
    --------
    >>> from lnorm.gpu import check
    >>> from lnorm.gpu.run import FusedLayerNorm, available
    >>> shapes = ((0, 8), (1, 1), (3, 2), (5, 3), *check.SHAPES, *LONG_SHAPES)
    >>> n = len(shapes) * len(DTYPES)
    >>> n
    30
    >>> if available()[0]:  # a GPU: that many pairs launched
    ...     assert launch_only(FusedLayerNorm()) == n
    """
    import cupy as cp

    n = 0
    for rows, D in ((0, 8), (1, 1), (3, 2), (5, 3), *check.SHAPES,
                    *LONG_SHAPES):
        for dtype in DTYPES:
            inp = check.make_inputs(rows, D, dtype, seed=1)
            out = check.forward_backward(fused.forward, fused.backward, inp)
            n += 1
            stats = (out[k] for k in ("mean_hi", "mean_lo", "rstd"))
            args = (inp["dy"], inp["x"], inp["gamma"], *stats)
            for rung in _launchable(fused, rows, D, dtype):
                if rung == "v5":  # v5 has a forward of its own too
                    fused.forward(inp["x"], inp["gamma"], inp["beta"], rung=rung)
                if rung != "v4":
                    fused.backward(*args, rung=rung)
    cp.cuda.get_current_stream().synchronize()
    return n


def measure(*, repeat: int = 20, quick: bool = False, large: bool = True) -> dict:
    r"""Run everything on the GPU: versions, bit checks, offset sweep, copy, timings.

    ``repeat`` timed calls a measurement (the median is kept); ``quick`` times
    only the first two shapes and skips :func:`large_rows_check`, which
    ``large=False`` skips too. Refuses (``RuntimeError``) without a GPU.

    Examples
    --------
    >>> [D for _, D in SHAPES[:2]]  # what quick=True times
    [768, 1024]
    >>> from lnorm.gpu.run import available
    >>> if not available()[0]:  # no GPU: refused before anything runs
    ...     try:
    ...         measure(quick=True)
    ...     except (ImportError, RuntimeError) as exc:
    ...         assert "CuPy" in str(exc) or "CUDA device" in str(exc)
    ...     else:
    ...         raise AssertionError("measure() ran without a GPU")
    """
    import cupy as cp

    from .run import FusedLayerNorm, unfused_backward, unfused_forward

    fused = FusedLayerNorm()
    timer = _Timer(cp, repeat)
    shapes = SHAPES[:2] if quick else SHAPES
    result = {**_header(), "gpu": True, **_versions(cp),
              "launches": plan_launches(shapes)}
    result["bit_checks"] = bit_checks(fused)
    result["offset_sweep"] = {
        "v4": offset_sweep((fused.forward, fused.backward)),
        "emulation": offset_sweep((emulate.forward, emulate.backward)),
        "v1": offset_sweep((unfused_forward, unfused_backward)),
    }
    result.update(time_shapes(cp, fused, timer, shapes))
    if large and not quick:
        result["large_rows"] = large_rows_check(cp, fused)
    return result


def main(argv=None) -> int:
    r"""Run the command line ``python -m lnorm.gpu.measure``.

    With a GPU: the whole run (:func:`lnorm.gpu.measure.measure`) written as
    JSON to ``--out``, or ``--launch-only``, or ``--profile ROWS D DTYPE``.
    Without one: a dry run (:func:`lnorm.gpu.measure.dry_run`) written to
    ``--out``; ``--launch-only`` and ``--profile`` exit with status 2.

    Examples
    --------
    >>> try:
    ...     main(["--help"])
    ... except SystemExit as exc:
    ...     print(exc.code)  # doctest: +ELLIPSIS
    usage: python -m lnorm.gpu.measure [-h]...
    0
    >>> import contextlib, io, json, tempfile
    >>> from pathlib import Path
    >>> from lnorm.gpu.run import available
    >>> if not available()[0]:  # no GPU: a dry run, written as JSON
    ...     with tempfile.TemporaryDirectory() as tmp:
    ...         with contextlib.redirect_stdout(io.StringIO()):
    ...             status = main(["--out", f"{tmp}/m.json"])
    ...         result = json.loads(Path(tmp, "m.json").read_text())
    ...     assert status == 0 and result["gpu"] is False
    """
    parser = argparse.ArgumentParser(prog="python -m lnorm.gpu.measure",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-measurements.json"))
    parser.add_argument("--quick", action="store_true",
                        help="two shapes, no large-row run")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--launch-only", action="store_true")
    parser.add_argument("--profile", nargs=3, metavar=("ROWS", "D", "DTYPE"))
    parser.add_argument("--rung", default="v4", choices=RUNGS,
                        help="the rung --profile runs (default v4)")
    args = parser.parse_args(argv)

    from .run import FusedLayerNorm, available

    ok, reason = available()
    if not ok:
        if args.launch_only or args.profile:
            print(f"no GPU: {reason}", file=sys.stderr)
            return 2
        result = dry_run(reason)
    elif args.launch_only:
        print(f"launched {launch_only(FusedLayerNorm())} forward-backward pairs")
        return 0
    elif args.profile:
        import cupy as cp

        rows, D, dtype = int(args.profile[0]), int(args.profile[1]), args.profile[2]
        fused = FusedLayerNorm()
        inp = {k: cp.asarray(v) for k, v in check.make_inputs(rows, D, dtype).items()}
        for _ in range(3):
            y, hi, lo, rstd = fused.forward(inp["x"], inp["gamma"], inp["beta"],
                                            rung=args.rung)
        for _ in range(3):
            fused.backward(inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd,
                           rung=args.rung)
        cp.cuda.get_current_stream().synchronize()
        return 0
    else:
        result = measure(repeat=args.repeat, quick=args.quick)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} "
          f"({'GPU: ' + result['device'] if result['gpu'] else 'dry run: ' + reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
