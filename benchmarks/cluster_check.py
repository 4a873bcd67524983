"""v5's kernels of rows past one block (clusters of blocks) or of any D (a
tail) on a GPU: bit checks against the emulation and repeat runs, then v4 and
v5 timed, in one JSON file (what ``book/data/gpu/clusters/`` and
``book/data/gpu/tails/`` keep).

    python3 benchmarks/cluster_check.py OUT.json            # the clusters
    python3 benchmarks/cluster_check.py --tails OUT.json    # rows of any D
    python3 benchmarks/cluster_check.py --launch-only [--tails]  # compute-sanitizer

Runs from the repository root with ``PYTHONPATH=.``; needs CuPy and a GPU (of
sm_90 or later for the clusters).
"""
import json
import sys

import numpy as np

from lnorm.gpu import check, emulate, measure
from lnorm.gpu.kernels import plan
from lnorm.gpu.run import FusedLayerNorm

#: (launched under compute-sanitizer, checked bit for bit, timed)
SETS = {
    # every slice full (16384, 32768, 65536), and slices filled in part (float16:
    # the clusters' kernels of a tail, with a row more in flight); checked
    # with enough rows for backward strips of 4 and 5 rows (fewer rows take
    # strips of one, a cluster each)
    "clusters": (((3, 16384), (2, 20000), (2, 32768), (2, 65536)),
                 ((200, 16384), (100, 24576), (100, 32768), (64, 40000),
                  (66, 65536)),
                 ((8192, 16384), (4096, 32768), (2048, 65536), (8192, 12288),
                  (8192, 20000))),
    # rows that start on 16, 12, 8 and 4 bytes; a tail of every length; float16
    # of odd D (rows on 2 bytes every other row) beside; past one block's
    # registers, a tail in one block (float16 9002) and in clusters of 2, 4
    # and 8 (12290, 20002, 65530, and of odd D 9001, 20001, 65531; float32
    # 9001 and 9002 go to a cluster of two)
    "tails": (((5, 7), (3, 1030), (2, 4100), (3, 1031), (2, 9002), (3, 9001),
               (2, 20002)),
              ((64, 1), (33, 2), (70, 7), (40, 1030), (17, 4099), (9, 4100),
               (5, 8190), (9, 9002), (200, 12290), (100, 20002), (66, 65530),
               (200, 9001), (100, 20001), (66, 65531)),
              ((8192, 1024), (8192, 1030), (8192, 4096), (8192, 4100),
               (8192, 4095), (8192, 8190), (8192, 9002), (8192, 12290),
               (8192, 9001), (4096, 32770))),
}
args = [a for a in sys.argv[1:] if a != "--tails"]
SMALL, CHECKED, TIMED = SETS["tails" if "--tails" in sys.argv else "clusters"]
fused = FusedLayerNorm()

if args[0] == "--launch-only":
    for rows, D in SMALL:
        for dt in ("float32", "float16"):
            inp = check.make_inputs(rows, D, dt, seed=1)
            check.forward_backward(fused.forward, fused.backward, inp, "v5")
    print("launched", 2 * len(SMALL))
    sys.exit(0)

import cupy as cp  # noqa: E402

out = {**measure._header(), **measure._versions(cp), "bit_checks": []}
for rows, D in CHECKED:
    for dt in ("float32", "float16"):
        inp = check.make_inputs(rows, D, dt, seed=rows + D)
        inp["x"][0] = 7.0  # a constant row
        want = check.forward_backward(emulate.forward, emulate.backward, inp, "v5")
        got = check.forward_backward(fused.forward, fused.backward, inp, "v5")
        again = check.forward_backward(fused.forward, fused.backward, inp, "v5")
        diff = {k: int(np.sum(got[k].view(np.uint8) != want[k].view(np.uint8)))
                for k in want}
        p = plan(rows, D, dt, "v5")
        out["bit_checks"].append({
            "rows": rows, "D": D, "dtype": dt, "cluster": p.cluster,
            "rows_per_group": p.rows_per_group,
            "kernel_forward": p.kernel("forward"),
            "kernel_backward": p.kernel("backward"),
            "bytes_differing": diff, "equal": not any(diff.values()),
            "repeat_equal": all(got[k].tobytes() == again[k].tobytes() for k in got)})
        print(rows, D, dt, p.kernel("forward"), out["bit_checks"][-1]["equal"],
              out["bit_checks"][-1]["repeat_equal"], flush=True)
out.update(measure.time_shapes(cp, fused, measure._Timer(cp, 20), TIMED,
                               rungs=("v4", "v5")))
for t in out["timings"]:
    print(t["rung"], t["direction"], t["rows"], t["D"], t["dtype"],
          f"{t['copy_share']:.3f}", flush=True)
with open(args[0], "w") as f:
    json.dump(out, f, indent=1)
