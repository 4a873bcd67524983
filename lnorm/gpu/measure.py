"""``python -m lnorm.gpu.measure``: check and time the kernels on a GPU, in one run.

On a machine with a CUDA device it

1. checks the kernels against :mod:`lnorm.gpu.emulate` bit for bit at every
   shape of :data:`lnorm.gpu.check.SHAPES`, float32 and float16;
2. measures the error against float64 as the row offset grows
   (:func:`offset_sweep`), the accuracy claim of the corrected mean;
3. times the copy yardstick and every rung (the op-by-op CuPy version ``v1``
   and the fused kernels ``v4``) at :data:`SHAPES`, each time the median of
   CUDA-event timings after warm-up, with L2 flushed before every timed call
   for problems under 200 MB;

and writes everything, with the device and the versions, as JSON.

Without a GPU it makes a *dry run*: it plans every launch of the timed shapes
(grid, block, row groups, bytes) and writes a JSON that says why no GPU was
used, so the command and its output format are tested on any machine.

Other modes, for the device tools: ``--launch-only`` launches every kernel
once at awkward shapes (the program ``compute-sanitizer`` watches) and
``--profile ROWS D DTYPE`` runs the fused backward a few times at one shape
(the program ``ncu`` profiles).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import sys
from pathlib import Path

import numpy as np

from ..cost import traffic
from . import check, emulate
from .kernels import KERNEL_FILES, plan, source

__all__ = [
    "SHAPES", "DTYPES", "L2_FLUSH_BELOW", "source_digest", "plan_launches", "dry_run",
    "measure", "main",
]

#: The timed shapes: 8192 rows of the widths of common transformers.
SHAPES = tuple((8192, D) for D in (768, 1024, 4096, 8192, 12288))
DTYPES = ("float32", "float16")
#: Problems smaller than this (bytes the op moves) are timed with L2 flushed.
L2_FLUSH_BELOW = 200 * 2**20
#: The copy yardstick: a device-to-device copy of this many bytes.
COPY_BYTES = 2**30


def _bytes(direction: str, rows: int, D: int, dtype) -> int:
    """Bytes the op must move: the fused schedule of :func:`lnorm.cost.traffic`."""
    itemsize = np.dtype(dtype).itemsize
    return traffic(direction, "fused", rows=rows, D=D, itemsize=itemsize, saved="x_mean_rstd").bytes


def plan_launches(shapes=SHAPES, dtypes=DTYPES) -> list[dict]:
    """The launch of every timed shape, or why the fused kernels cannot take it.

    Returns
    -------
    list of dict
        One entry per shape and dtype: ``rows``, ``D``, ``dtype``, the bytes
        each direction moves, and either the plan (``kernel_forward``,
        ``kernel_backward``, ``block``, grids, ``row_groups``,
        ``rows_per_group``, ``partials_bytes``) or ``unsupported`` (the
        message of :func:`lnorm.gpu.kernels.plan`).
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
                entry.update(kernel_forward=p.kernel("forward"), kernel_backward=p.kernel("backward"),
                             block=p.block, forward_grid=p.forward_grid,
                             backward_grid=p.backward_grid, row_groups=p.row_groups,
                             rows_per_group=p.rows_per_group, partials_bytes=p.partials_bytes)
            out.append(entry)
    return out


def source_digest() -> str:
    """SHA-256 of the kernel sources as compiled: which kernels a measurement timed."""
    h = hashlib.sha256()
    for filename in KERNEL_FILES:
        h.update(source(filename).encode())
    return h.hexdigest()


def _header() -> dict:
    return {
        "date": datetime.date.today().isoformat(),
        "source_sha256": source_digest(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "host": platform.node(),
    }


def dry_run(reason: str) -> dict:
    """What a run would do, without a GPU: the plans of every timed launch."""
    return {**_header(), "gpu": False, "reason": reason, "launches": plan_launches()}


# --------------------------------------------------------------------- GPU part
def _versions(cp) -> dict:
    rt = cp.cuda.runtime
    dev = cp.cuda.Device()
    props = rt.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
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


class _Timer:
    """Median of CUDA-event timings, each call alone, after warm-up."""

    def __init__(self, cp, repeat: int):
        self.cp = cp
        self.repeat = repeat
        self.scratch = cp.empty(256 * 2**20, dtype=cp.uint8)  # > the L2 of any GPU today

    def __call__(self, fn, *args, flush: bool) -> dict:
        cp = self.cp
        for _ in range(3):
            fn(*args)
        times = []
        for _ in range(self.repeat):
            if flush:
                self.scratch.fill(1)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn(*args)
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
        return {"median_s": float(np.median(times)), "min_s": float(np.min(times)),
                "max_s": float(np.max(times)), "repeat": self.repeat, "l2_flushed": flush}


def copy_yardstick(cp, timer: _Timer) -> dict:
    """A 1 GiB device-to-device copy: the bandwidth an op that reads and writes can reach."""
    src = cp.ones(COPY_BYTES, dtype=cp.uint8)
    dst = cp.empty_like(src)

    def copy():
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, COPY_BYTES,
                                    cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)

    t = timer(copy, flush=False)
    del src, dst
    return {"bytes": 2 * COPY_BYTES, **t, "bandwidth": 2 * COPY_BYTES / t["median_s"]}


def bit_checks(fused) -> list[dict]:
    """Kernels against the emulation at every checked shape: are the bits equal?"""
    out = []
    for rows, D in ((64, 1), (3, 2), *check.SHAPES):
        for dtype in DTYPES:
            inp = check.make_inputs(rows, D, dtype, seed=rows + D)
            got = check.forward_backward(fused.forward, fused.backward, inp)
            want = check.forward_backward(emulate.forward, emulate.backward, inp)
            diff = {k: int(np.sum(got[k].view(np.uint8) != want[k].view(np.uint8))) for k in want}
            out.append({"rows": rows, "D": D, "dtype": dtype, "bytes_differing": diff,
                        "equal": all(v == 0 for v in diff.values())})
    return out


def offset_sweep(run, D: int = 1024, rows: int = 64,
                 offsets=(0.0, 1e2, 1e3, 1e4, 1e5, 1e6)) -> list[dict]:
    """Errors of ``y``, ``dx``, ``dgamma``, ``dbeta`` against float64, rows shifted by an offset.

    ``x`` has standard-normal rows plus ``offset`` (so the offset is in units
    of the row's standard deviation), ``dy`` is standard normal, float32.
    ``run`` is ``(forward, backward)``; the errors are those of
    :func:`lnorm.gpu.check.relative_errors`.
    """
    forward, backward = run
    rng = np.random.default_rng(0)
    base = rng.standard_normal((rows, D))
    dy = rng.standard_normal((rows, D)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(D)).astype(np.float32)
    out = []
    for offset in offsets:
        inp = {"x": (base + offset).astype(np.float32), "gamma": gamma, "beta": beta, "dy": dy}
        got = check.forward_backward(forward, backward, inp)
        out.append({"offset": offset, **check.relative_errors(got, check.reference(inp))})
    return out


def time_rungs(cp, fused, timer: _Timer, shapes=SHAPES, dtypes=DTYPES,
               rungs=("v1", "v4")) -> list[dict]:
    """Every rung at every shape: seconds, GB/s of the bytes the op must move."""
    from .run import unfused_backward, unfused_forward

    out = []
    for entry in plan_launches(shapes, dtypes):
        rows, D, dtype = entry["rows"], entry["D"], entry["dtype"]
        inp = {k: cp.asarray(v) for k, v in check.make_inputs(rows, D, dtype).items()}
        args_f = (inp["x"], inp["gamma"], inp["beta"])
        todo = {"v1": (unfused_forward, unfused_backward)}
        if "unsupported" not in entry:
            todo["v4"] = (fused.forward, fused.backward)
        for rung, (fwd, bwd) in todo.items():
            if rung not in rungs:
                continue
            y, hi, lo, rstd = fwd(*args_f)
            args_b = (inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd)
            for direction, fn, args in (("forward", fwd, args_f), ("backward", bwd, args_b)):
                nbytes = entry[f"bytes_{direction}"]
                t = timer(fn, *args, flush=nbytes < L2_FLUSH_BELOW)
                out.append({"rung": rung, "direction": direction, "rows": rows, "D": D,
                            "dtype": dtype, "bytes": nbytes, **t,
                            "bandwidth": nbytes / t["median_s"]})
            del y, hi, lo, rstd
        del inp
        cp.get_default_memory_pool().free_all_blocks()
    return out


def large_rows_check(cp, fused, rows: int = 524_800, D: int = 4096) -> dict:
    """More than 2**31 elements (float16): 64-bit offsets, checked on sampled rows.

    ``y`` and ``dx`` of the first and last 32 rows are compared bit for bit
    with the emulation (each row depends on itself alone); ``dbeta`` with a
    float64 sum of ``dy`` over all rows.
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
            "y_sampled_rows_equal": bool(np.array_equal(y[sample].get().view(np.uint16),
                                                        ey.view(np.uint16))),
            "dx_sampled_rows_equal": bool(np.array_equal(dx[sample].get().view(np.uint16),
                                                         edx.view(np.uint16))),
            "dbeta_relative_error": dbeta_err}


def launch_only(fused) -> int:
    """Launch every kernel once at awkward shapes (for ``compute-sanitizer``)."""
    import cupy as cp

    n = 0
    for rows, D in ((0, 8), (1, 1), (3, 2), (5, 3), *check.SHAPES):
        for dtype in DTYPES:
            inp = check.make_inputs(rows, D, dtype, seed=1)
            check.forward_backward(fused.forward, fused.backward, inp)
            n += 1
    cp.cuda.get_current_stream().synchronize()
    return n


def measure(*, repeat: int = 20, quick: bool = False, large: bool = True) -> dict:
    """The whole GPU run: versions, bit checks, offset sweep, copy yardstick, rung timings."""
    import cupy as cp

    from .run import FusedLayerNorm, unfused_backward, unfused_forward

    fused = FusedLayerNorm()
    timer = _Timer(cp, repeat)
    shapes = SHAPES[:2] if quick else SHAPES
    result = {**_header(), "gpu": True, **_versions(cp), "launches": plan_launches(shapes)}
    result["bit_checks"] = bit_checks(fused)
    result["offset_sweep"] = {
        "v4": offset_sweep((fused.forward, fused.backward)),
        "emulation": offset_sweep((emulate.forward, emulate.backward)),
        "v1": offset_sweep((unfused_forward, unfused_backward)),
    }
    result["copy"] = copy_yardstick(cp, timer)
    result["timings"] = time_rungs(cp, fused, timer, shapes)
    for t in result["timings"]:
        t["copy_share"] = t["bandwidth"] / result["copy"]["bandwidth"]
    if large and not quick:
        result["large_rows"] = large_rows_check(cp, fused)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lnorm.gpu.measure", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-measurements.json"))
    parser.add_argument("--quick", action="store_true", help="two shapes, no large-row run")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--launch-only", action="store_true")
    parser.add_argument("--profile", nargs=3, metavar=("ROWS", "D", "DTYPE"))
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
        y, hi, lo, rstd = fused.forward(inp["x"], inp["gamma"], inp["beta"])
        for _ in range(3):
            fused.backward(inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd)
        cp.cuda.get_current_stream().synchronize()
        return 0
    else:
        result = measure(repeat=args.repeat, quick=args.quick)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} ({'GPU: ' + result['device'] if result['gpu'] else 'dry run: ' + reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
