"""Time the peers of the fused kernels on a GPU: PyTorch and the Triton tutorial's
design.


This script is the one place in the project that imports PyTorch and Triton:
``lnorm/`` and ``book/`` never do, and ``requirements.txt`` does not install
them (without them even ``--help`` fails on the import). It runs on a machine
with a GPU::

    PYTHONPATH=. python dev/peers.py --merge-into gpu-measurements.json

and adds to the JSON that ``python -m lnorm.gpu.measure`` wrote:

* ``peer_timings``: PyTorch's ``native_layer_norm`` and
  ``native_layer_norm_backward``, and a Triton layer norm built as the Triton
  tutorial builds it (one program per row; the backward adds each row's
  ``dy * xhat`` and ``dy`` into one of ``GROUP`` partial rows under a spin
  lock, then a second kernel sums the partial rows), at the shapes of
  :data:`lnorm.gpu.measure.SHAPES` in float32, float16 and bfloat16, timed as
  ``lnorm.gpu.measure`` times the rungs (median of CUDA events, L2 flushed
  under 200 MiB);
* ``torch_reference``: PyTorch's ``y``, ``dx``, ``dgamma``, ``dbeta`` in
  float64 and float32 on one small seeded input, as lists, so the book can
  compare :mod:`lnorm` with an independent implementation without PyTorch.

Triton tutorial: https://triton-lang.org/main/getting-started/tutorials/05-layer-norm.html
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

from lnorm.gpu.check import make_inputs
from lnorm.gpu.measure import L2_FLUSH_BELOW, SHAPES, _bytes, hold_cycles

EPS = 1e-5
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


# ------------------------------------------------------------------ Triton
@triton.jit
def _tri_forward(X, Y, W, B, MEAN, RSTD, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(X + row * D + cols, mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / D
    xc = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / D + eps)
    w = tl.load(W + cols, mask=inside).to(tl.float32)
    b = tl.load(B + cols, mask=inside).to(tl.float32)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)
    tl.store(
        Y + row * D + cols, (xc * rstd * w + b).to(Y.dtype.element_ty), mask=inside
    )


@triton.jit
def _tri_backward_dx(
    DX,
    DY,
    X,
    W,
    MEAN,
    RSTD,
    PART_W,
    PART_B,
    LOCKS,
    D,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(X + row * D + cols, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * D + cols, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    xhat = tl.where(inside, (x - tl.load(MEAN + row)) * rstd, 0.0)
    g = tl.where(inside, w * dy, 0.0)
    mean_gx = tl.sum(g * xhat, axis=0) / D
    mean_g = tl.sum(g, axis=0) / D
    tl.store(
        DX + row * D + cols,
        ((g - xhat * mean_gx - mean_g) * rstd).to(DX.dtype.element_ty),
        mask=inside,
    )
    # The tutorial's partial sums: row r adds into partial row r % GROUP under
    # a spin lock; the first writer of a partial row stores instead of adding.
    slot = row % GROUP
    lock = LOCKS + slot
    count = LOCKS + GROUP + slot
    while tl.atomic_cas(lock, 0, 1) == 1:
        pass
    pw = dy * xhat
    pb = dy
    if tl.load(count) == 0:
        tl.atomic_xchg(count, 1)
    else:
        pw += tl.load(PART_W + slot * D + cols, mask=inside, other=0.0)
        pb += tl.load(PART_B + slot * D + cols, mask=inside, other=0.0)
    tl.store(PART_W + slot * D + cols, pw, mask=inside)
    tl.store(PART_B + slot * D + cols, pb, mask=inside)
    tl.atomic_xchg(lock, 0)


@triton.jit
def _tri_backward_params(
    PART_W, PART_B, DW, DB, GROUP, D, BM: tl.constexpr, BN: tl.constexpr
):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    acc_w = tl.zeros((BM, BN), dtype=tl.float32)
    acc_b = tl.zeros((BM, BN), dtype=tl.float32)
    for start in range(0, GROUP, BM):
        rows = start + tl.arange(0, BM)
        mask = (rows[:, None] < GROUP) & (cols[None, :] < D)
        offs = rows[:, None] * D + cols[None, :]
        acc_w += tl.load(PART_W + offs, mask=mask, other=0.0)
        acc_b += tl.load(PART_B + offs, mask=mask, other=0.0)
    tl.store(DW + cols, tl.sum(acc_w, axis=0), mask=cols < D)
    tl.store(DB + cols, tl.sum(acc_b, axis=0), mask=cols < D)


def _block(D: int, itemsize: int) -> tuple[int, int]:
    block = triton.next_power_of_2(D)
    if block * itemsize > 65536:
        raise ValueError(f"the tutorial's design holds a row of at most 64 KB; D = {D}")
    return block, min(max(block // 256, 1), 8)


def triton_forward(x, w, b):
    rows, D = x.shape
    block, warps = _block(D, x.element_size())
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    _tri_forward[(rows,)](x, y, w, b, mean, rstd, D, EPS, BLOCK=block, num_warps=warps)
    return y, mean, rstd


def triton_backward(dy, x, w, mean, rstd):
    rows, D = x.shape
    block, warps = _block(D, x.element_size())
    group = 64 if D > 8192 else 96 if D > 4096 else 128 if D > 1024 else 256
    locks = torch.zeros(2 * group, dtype=torch.int32, device=x.device)
    part_w = torch.empty((group, D), dtype=torch.float32, device=x.device)
    part_b = torch.empty((group, D), dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x)
    dw = torch.empty(D, dtype=torch.float32, device=x.device)
    db = torch.empty(D, dtype=torch.float32, device=x.device)
    _tri_backward_dx[(rows,)](
        dx,
        dy,
        x,
        w,
        mean,
        rstd,
        part_w,
        part_b,
        locks,
        D,
        GROUP=group,
        BLOCK=block,
        num_warps=warps,
    )
    _tri_backward_params[(triton.cdiv(D, 128),)](
        part_w, part_b, dw, db, group, D, BM=32, BN=128
    )
    return dx, dw, db


# ------------------------------------------------------------------ PyTorch
def torch_forward(x, w, b):
    return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, EPS)


def torch_backward(dy, x, w, mean, rstd):
    return torch.ops.aten.native_layer_norm_backward(
        dy, x, [x.shape[-1]], mean, rstd, w, torch.zeros_like(w), [True, True, True]
    )


# ------------------------------------------------------------------ timing
_SCRATCH = None


def timed(fn, *args, flush: bool, repeat: int) -> dict:
    """Median of CUDA-event timings after 3 warm-up calls, as lnorm.gpu.measure times.

    Every timed call is queued while the GPU spins (``torch.cuda._sleep``),
    so the host's launch time overlaps the GPU's work and is not counted.
    """
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    t0 = time.perf_counter()
    for _ in range(3):
        fn(*args)
    host_s = (time.perf_counter() - t0) / 3
    torch.cuda.synchronize()
    torch.cuda._sleep(hold_cycles(host_s, repeat))
    released = torch.cuda.Event()
    released.record()
    pairs = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
             for _ in range(repeat)]
    for start, stop in pairs:
        if flush:
            _SCRATCH.fill_(1)
        start.record()
        fn(*args)
        stop.record()
    queued_ahead = not released.query()
    pairs[-1][1].synchronize()
    times = [start.elapsed_time(stop) * 1e-3 for start, stop in pairs]
    return {
        "median_s": float(np.median(times)),
        "min_s": float(np.min(times)),
        "max_s": float(np.max(times)),
        "repeat": repeat,
        "l2_flushed": flush,
        "queued_ahead": queued_ahead,
    }


def time_peers(repeat: int, shapes=SHAPES) -> list[dict]:
    peers = {
        "torch": (torch_forward, torch_backward),
        "triton": (triton_forward, triton_backward),
    }
    out = []
    for rows, D in shapes:
        for name, dtype in DTYPES.items():
            np_dtype = (
                "float16" if name == "bfloat16" else name
            )  # for the byte count only
            inp = make_inputs(rows, D, "float32")
            x, w, b, dy = (
                torch.from_numpy(inp[k]).cuda().to(dtype)
                for k in ("x", "gamma", "beta", "dy")
            )
            for peer, (fwd, bwd) in peers.items():
                try:
                    _, mean, rstd = fwd(x, w, b)
                except ValueError as exc:
                    out.append(
                        {
                            "peer": peer,
                            "rows": rows,
                            "D": D,
                            "dtype": name,
                            "unsupported": str(exc),
                        }
                    )
                    continue
                for direction, fn, args in (
                    ("forward", fwd, (x, w, b)),
                    ("backward", bwd, (dy, x, w, mean, rstd)),
                ):
                    nbytes = _bytes(direction, rows, D, np_dtype)
                    t = timed(fn, *args, flush=nbytes < L2_FLUSH_BELOW, repeat=repeat)
                    out.append(
                        {
                            "peer": peer,
                            "direction": direction,
                            "rows": rows,
                            "D": D,
                            "dtype": name,
                            "bytes": nbytes,
                            **t,
                            "bandwidth": nbytes / t["median_s"],
                        }
                    )
            del x, w, b, dy
            torch.cuda.empty_cache()
    return out


def peer_errors(rows: int = 64, D: int = 1024) -> dict:
    """The Triton peer's errors against PyTorch in float64, to show it computes layer
    norm."""
    inp = make_inputs(rows, D, "float32")
    x, w, b, dy = (
        torch.from_numpy(inp[k]).cuda() for k in ("x", "gamma", "beta", "dy")
    )
    y, mean, rstd = triton_forward(x, w, b)
    dx, dw, db = triton_backward(dy, x, w, mean, rstd)
    x64, w64, b64, dy64 = (t.double() for t in (x, w, b, dy))
    y64, m64, r64 = torch_forward(x64, w64, b64)
    dx64, dw64, db64 = torch_backward(dy64, x64, w64, m64, r64)

    def rel(a, r):
        return float((a.double() - r).abs().max() / r.abs().max())

    return {
        "y": rel(y, y64),
        "dx": rel(dx, dx64),
        "dgamma": rel(dw, dw64),
        "dbeta": rel(db, db64),
    }


def torch_reference(rows: int = 4, D: int = 16, seed: int = 7) -> dict:
    """PyTorch's outputs on a small seeded input (lnorm.gpu.check.make_inputs), as
    lists."""
    inp = make_inputs(rows, D, "float64", seed=seed)
    out = {
        "rows": rows,
        "D": D,
        "seed": seed,
        "eps": EPS,
        "inputs": {k: v.tolist() for k, v in inp.items()},
    }
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        x, w, b, dy = (
            torch.from_numpy(inp[k]).cuda().to(dtype)
            for k in ("x", "gamma", "beta", "dy")
        )
        y, mean, rstd = torch_forward(x, w, b)
        dx, dw, db = torch_backward(dy, x, w, mean, rstd)
        out[name] = {
            k: v.double().cpu().numpy().tolist()
            for k, v in (("y", y), ("dx", dx), ("dgamma", dw), ("dbeta", db))
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--merge-into", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    data = json.loads(args.merge_into.read_text())
    data["torch"] = torch.__version__
    data["triton"] = triton.__version__
    data["torch_reference"] = torch_reference()
    data["triton_peer_errors"] = peer_errors()
    data["peer_timings"] = time_peers(args.repeat, SHAPES[:2] if args.quick else SHAPES)
    copy = data.get("copy", {}).get("bandwidth")
    if copy:
        for t in data["peer_timings"]:
            if "bandwidth" in t:
                t["copy_share"] = t["bandwidth"] / copy
    args.merge_into.write_text(json.dumps(data, indent=1))
    print(f"merged peers into {args.merge_into}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
