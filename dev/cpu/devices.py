"""Each tuning device of lnorm/fused.py at c504527, on against off, in one run.

For each device, a patched copy of main's fused.py with the device switched
(off, or on where main leaves it off at the bench's shapes) is timed against
main's own copy, interleaved in shuffled rounds, at the shapes ``python -m
lnorm.bench`` runs, in float32 and float16. Prints and writes (``--out``) the
median over rounds of (time with the device) / (time without it), per round
pair, with the range over rounds. Run it three times; the JOURNAL quotes all
three.

    .venv/bin/python dev/cpu/devices.py --out dev/cpu/devices_1.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import variants as V

MAIN = "c504527"
SHAPES = [(8, 512, 1024), (32, 1024, 1024)]
DTYPES = ["float32", "float16"]
BIG = (65536, 1024)  # 256 MiB of float32 per array: past half the 480 MiB L3

# name: (patches, which copy has the device: "variant" or "main", dtypes, shapes)
DEVICES = {
    "streaming stores (forced on)": (
        [("STREAM_BYTES = _last_level_cache_bytes() // 2", "STREAM_BYTES = 0")],
        "variant", DTYPES, SHAPES),
    "streaming stores (past the L3)": (
        [("STREAM_BYTES = _last_level_cache_bytes() // 2", "STREAM_BYTES = 2**62")],
        "main", ["float32"], [BIG]),
    "software prefetch": (
        [("if (r + 1) * D + a < rows * D:", "if False:")], "main", DTYPES, SHAPES),
    "arrays 4 KiB apart (empty_apart)": (
        [("APART_FROM_BYTES = 16 * 4096", "APART_FROM_BYTES = 2**62")],
        "main", DTYPES, SHAPES),
    "scratch block (utag)": (
        [("""    block = _scratch((at_b + 8 * D) // 8)
    held_y = block[at_y // 8:(at_y + held) // 8].view(y.dtype)
    held_xhat = block[at_xhat // 8:(at_xhat + held) // 8].view(y.dtype)
    g = block[at_g // 8:at_g // 8 + D]
    b = block[at_b // 8:at_b // 8 + D]
    g[:] = gamma
    b[:] = beta
""", """    held_y = np.empty(SPAN, y.dtype)
    held_xhat = np.empty(SPAN, y.dtype)
    g = gamma
    b = beta
""")], "main", DTYPES, SHAPES),
    "groups of four rows": (
        [("quarter = rows // GROUP_ROWS if D >= GROUP_FROM_D else 0", "quarter = 0")],
        "main", DTYPES, SHAPES),
    "fast-math flags": (
        [('FASTMATH = {"reassoc", "contract"}', "FASTMATH = False")],
        "main", DTYPES, SHAPES),
    "fused multiply-add (_mul_add)": (
        [("        if not _native_fma():\n", "        if True:\n")],
        "main", DTYPES, SHAPES),
    "float16 by F16C (vs integer bits)": (
        [('return _is_arm64() or _has_x86_feature("f16c")', "return False")],
        "main", ["float16"], SHAPES),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--only", nargs="*")
    args = p.parse_args()
    text = V.source(MAIN)
    base = V.build("fused_main", text)
    rows = []
    for i, (device, (patches, has, dtypes, shapes)) in enumerate(DEVICES.items()):
        if args.only and not any(o in device for o in args.only):
            continue
        var = V.build(f"fused_dev{i}", text, patches)
        for shape in shapes:
            for dtype in dtypes:
                t, _ = V.paired({"main": base, "var": var}, shape, dtype,
                                args.rounds, copy=False)
                for direction in ("forward", "backward"):
                    on, off = (("var", "main") if has == "variant" else
                               ("main", "var"))
                    r = t[on, direction] / t[off, direction]  # per round
                    row = {"device": device, "shape": list(shape), "dtype": dtype,
                           "direction": direction, "on_over_off": float(np.median(r)),
                           "min": float(r.min()), "max": float(r.max()),
                           "rounds": len(r),
                           "best_on_over_best_off": float(t[on, direction].min()
                                                          / t[off, direction].min()),
                           "on_seconds": t[on, direction].tolist(),
                           "off_seconds": t[off, direction].tolist()}
                    rows.append(row)
                    print(f"{device:36} {str(shape):16} {dtype:8} {direction:8} "
                          f"{row['on_over_off']:.3f} "
                          f"({row['min']:.3f}-{row['max']:.3f}) "
                          f"best {row['best_on_over_best_off']:.3f}",
                          flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": V.cpu_model(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
