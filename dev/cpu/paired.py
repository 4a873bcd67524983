"""The fused loops of the work tree against main's (c504527), paired, in one run.

At each shape ``python -m lnorm.bench`` runs, in float32 and float16, the
forward and backward of both copies and the bench's copy yardstick are called
in shuffled rounds (thread CPU time, see variants.py). Prints, per direction,
the median over rounds of new/main with its range, and each copy's median
time over the copy floor (bytes the pass must move / copy bandwidth of the
same round). Run it three times; the JOURNAL quotes all three.

    .venv/bin/python dev/cpu/paired.py --out dev/cpu/paired_1.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import variants as V

from lnorm.bench import DEFAULT_SHAPES as SHAPES


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--main", default="c504527")
    args = p.parse_args()
    # main2 is main again, built as another module: how far two identical
    # copies of the loop drift apart in one process (code placement, noise).
    mods = {"main": V.build("fused_main", V.source(args.main)),
            "main2": V.build("fused_main2", V.source(args.main) + "\n# again\n"),
            "new": V.build("fused_new", V.source(None))}
    rows = []
    for shape in SHAPES:
        for dtype in ("float32", "float16"):
            t, _ = V.paired(mods, shape, dtype, args.rounds)
            for direction in ("forward", "backward"):
                r = t["new", direction] / t["main", direction]
                r2 = t["main2", direction] / t["main", direction]
                row = {"shape": list(shape), "dtype": dtype, "direction": direction,
                       "new_over_main": float(np.median(r)), "min": float(r.min()),
                       "max": float(r.max()), "rounds": len(r),
                       "main2_over_main": float(np.median(r2)),
                       "main_x_floor": float(np.median(t["main", direction])),
                       "new_x_floor": float(np.median(t["new", direction]))}
                rows.append(row)
                print(f"{str(shape):16} {dtype:8} {direction:8} new/main "
                      f"{row['new_over_main']:.3f} ({row['min']:.3f}-{row['max']:.3f})"
                      f" main2/main {row['main2_over_main']:.3f}"
                      f"  x floor: main {row['main_x_floor']:.2f} new "
                      f"{row['new_x_floor']:.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": V.cpu_model(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
