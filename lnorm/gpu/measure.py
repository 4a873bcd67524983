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
    """Bytes the op must move (:func:`lnorm.cost.traffic`, three saved statistics)."""
    itemsize = np.dtype(dtype).itemsize
    return traffic(direction, "fused", rows=rows, D=D, itemsize=itemsize,
                   saved="x_mean_rstd", mean_parts=2).bytes


def plan_launches(shapes=SHAPES, dtypes=DTYPES) -> list[dict]:
    """Plan the launch of every timed shape, or say why the kernels cannot take it."""
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
    """Hash the kernel sources as compiled: which kernels a measurement timed."""
    h = hashlib.sha256()
    for filename in files:
        h.update(source(filename).encode())
    return h.hexdigest()


def ptx_digests(files=KERNEL_FILES, arch: str = "sm_90",
                canonical: bool = False) -> dict[str, str]:
    """Hash the PTX of every kernel, one digest per kernel: what the GPU ran."""
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
    """Say whether a measurement timed the kernels of this build."""
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
    """The launches a measurement made that this build would plan differently."""
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
    """Describe what a run would do, without a GPU: the plans of every timed launch."""
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
    """Clock cycles to spin (at most a second) while ``repeat`` calls are queued."""
    # Twice the host time, 50 us a call more: 2.5e9 Hz, above any GPU clock,
    # makes the spin at least that long. dev/peers.py holds the GPU as long.
    return int(min(1.0, 2 * repeat * (host_s + 50e-6) + 1e-3) * 2.5e9)


class _Timer:
    """Median of CUDA-event timings, each call alone, after warm-up."""

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
    """Time a 1 GiB device-to-device copy: the bandwidth a read-write op can reach."""
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
    """Compare the kernels with the emulation byte by byte at every checked shape."""
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
    """Time every rung's forward and backward at every shape."""
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
    """Time the copy, then the rungs at ``shapes`` with their share of its bandwidth."""
    copy = copy_yardstick(cp, timer)
    timings = time_rungs(cp, fused, timer, shapes, rungs=rungs)
    for t in timings:
        t["copy_share"] = t["bandwidth"] / copy["bandwidth"]
    return {"copy": copy, "timings": timings}


def large_rows_check(cp, fused, rows: int = 524_800, D: int = 4096) -> dict:
    """Check more than 2**31 elements (float16): 64-bit offsets, on sampled rows."""
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
    """Launch every kernel once at awkward shapes (for ``compute-sanitizer``)."""
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
    """Run everything on the GPU: versions, bit checks, offset sweep, copy, timings."""
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
    """Run the command line ``python -m lnorm.gpu.measure``."""
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
