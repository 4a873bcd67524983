"""Probe (2026-11-28, quiet machine): main at c504527, fused.py at 3efaef3
(before the fix) and two patched copies of it, paired at the two entries
that missed in the quiet runs. ``fwdA`` puts gamma and beta into the
streamed forward's block of row buffers, each a quarter page from the
others modulo 4 KiB; ``bwdS`` reads ``rstd[r]`` once per row in the dx
sweep. Output: probe_placement.log (11 rounds).

    .venv/bin/python dev/cpu/probe_placement.py 11
"""

import sys

import numpy as np
import variants as V

new = V.source("3efaef3")
FWD_OLD = """    block = np.empty(2 * part + 64, np.uint8)
    at = (-block.ctypes.data) % 64
    held_y = block[at:at + D * y.itemsize].view(y.dtype)
    held_xhat = block[at + part:at + part + D * y.itemsize].view(y.dtype)
"""
FWD_NEW = """    pg = -(-D * 8 // 4096) * 4096 + 2048
    block = np.empty(2 * part + 2 * pg + 1088, np.uint8)
    at = (-block.ctypes.data) % 64
    held_y = block[at:at + D * y.itemsize].view(y.dtype)
    held_xhat = block[at + part:at + part + D * y.itemsize].view(y.dtype)
    at_g = at + 2 * part + 1024
    g = block[at_g:at_g + 8 * D].view(np.float64)
    b = block[at_g + pg:at_g + pg + 8 * D].view(np.float64)
    g[:] = gamma
    b[:] = beta
"""
FWD_CALL = ("_normalize_row(x[r], gamma, beta, mean, rstd[r], held_y",
            "_normalize_row(x[r], g, b, mean, rstd[r], held_y")
BWD = [("""    for j in range(dy.shape[1]):
        g = _wide(dy[r, j]) * gamma[j]
        rest = g - _wide(xhat[r, j]) * mean_gxhat
        out[out_r, j] = _narrow(rstd[r] * (rest - mean_g), out)""",
"""    s = rstd[r]
    for j in range(dy.shape[1]):
        g = _wide(dy[r, j]) * gamma[j]
        rest = g - _wide(xhat[r, j]) * mean_gxhat
        out[out_r, j] = _narrow(s * (rest - mean_g), out)""")]
mods = {"main": V.build("p_main", V.source("c504527")),
        "new": V.build("p_new", new),
        "fwdA": V.build("p_fwdA", new, [(FWD_OLD, FWD_NEW), FWD_CALL]),
        "bwdS": V.build("p_bwdS", new, BWD)}
for shape, dtype, d in [((64, 1024, 1024), "float32", "forward"),
                        ((8, 512, 1024), "float16", "backward")]:
    t, _ = V.paired(mods, shape, dtype, int(sys.argv[1]))
    for name in mods:
        r = t[name, d] / t["main", d]
        print(shape, dtype, d, name,
              f"{np.median(r):.3f} ({r.min():.3f}-{r.max():.3f})",
              f"x floor {np.median(t[name, d]):.2f}", flush=True)
