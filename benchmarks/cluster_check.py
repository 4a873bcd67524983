"""v5's clusters of blocks on a GPU: bit checks against the emulation and
repeat runs at rows past one block, then v4 and v5 timed at long rows, in one
JSON file (what ``book/data/gpu/clusters/`` keeps).

    python3 benchmarks/cluster_check.py OUT.json
    python3 benchmarks/cluster_check.py --launch-only   # for compute-sanitizer

Runs from the repository root with ``PYTHONPATH=.``; needs CuPy and a GPU of
sm_90 or later.
"""
import json
import sys

import numpy as np

from lnorm.gpu import check, emulate, measure
from lnorm.gpu.kernels import plan
from lnorm.gpu.run import FusedLayerNorm

fused = FusedLayerNorm()
SMALL = ((3, 16384), (2, 20000), (2, 65536))
CHECKED = (*SMALL, (64, 16384), (17, 24576), (9, 40000), (33, 65536))
TIMED = ((8192, 16384), (4096, 32768), (2048, 65536), (8192, 12288))

if sys.argv[1] == "--launch-only":
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
        out["bit_checks"].append({
            "rows": rows, "D": D, "dtype": dt,
            "cluster": plan(rows, D, dt, "v5").cluster,
            "bytes_differing": diff, "equal": not any(diff.values()),
            "repeat_equal": all(got[k].tobytes() == again[k].tobytes() for k in got)})
        print(rows, D, dt, out["bit_checks"][-1]["equal"],
              out["bit_checks"][-1]["repeat_equal"], flush=True)
out.update(measure.time_shapes(cp, fused, measure._Timer(cp, 20), TIMED,
                               rungs=("v4", "v5")))
for t in out["timings"]:
    print(t["rung"], t["direction"], t["rows"], t["D"], t["dtype"],
          f"{t['copy_share']:.3f}", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
