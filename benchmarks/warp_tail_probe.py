"""Where do the warp kernels of a tail go wrong on a GPU? A probe, ready to run.

v5's kernels of a tail for rows a warp holds (``ln_*_grouped_warp_*_any``)
gave other dgamma and dbeta bits than the emulation on an H100, in float32
at D = 2 and 7, while y and dx matched and the CPU, running the same source,
matched the emulation; so they are not built. This script builds them in a
patched copy of the package (the two variants added to LN_GROUPED_VARIANTS,
the plan's tail opened to rows a warp holds), launches the backward kernel
alone with the emulation's statistics, and prints, per shape, which outputs
differ and, for the partial rows, which (row, column) entries, with the values
and the emulation's. A control shape of every kind runs beside (D = 1, and
float16 at D = 2, which matched).

    python3 benchmarks/warp_tail_probe.py [--cpu] [OUT.json]

Runs from the repository root; needs CuPy and a GPU, or with ``--cpu`` g++
(the CUDA source on the CPU, lnorm.gpu.host), which is how it is tested.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: (rows, D, dtype): the failing shapes first, then controls that matched
SHAPES = ((33, 2, "float32"), (70, 7, "float32"), (33, 6, "float32"),
          (33, 1, "float32"), (33, 2, "float16"), (70, 6, "float16"))
VARIANTS = ("    K(warp_f32_any, float_any, 4, false, LN_WARP_THREADS)       \\\n"
            "    K(warp_f16_any, half_any, 8, false, LN_WARP_THREADS)        \\\n")


def patch(root: Path) -> None:
    """Add the warp variants of a tail to the copy of the package at ``root``."""
    common = root / "lnorm" / "gpu" / "layernorm_common.cu"
    text = common.read_text()
    at = text.index("#define LN_GROUPED_VARIANTS(K)")
    at = text.index("\n", at) + 1
    common.write_text(text[:at] + VARIANTS + text[at:])
    kernels = root / "lnorm" / "gpu" / "kernels.py"
    text = kernels.read_text()
    old = 'tail = rung == "v5" and not aligned and 32 * E < D <= max_D("v5")'
    new = ('tail = (rung == "v5" and not aligned and D <= max_D("v5") and '
           '(32 * E < D or D * dtype.itemsize % 4 == 0))')
    if old not in text:
        raise SystemExit("kernels.plan changed: update the probe's patch")
    kernels.write_text(text.replace(old, new))


def differences(got: dict, want: dict) -> dict:
    out = {}
    for k, w in want.items():
        g = got[k]
        bits = f"uint{8 * w.dtype.itemsize}"
        bad = g.view(bits) != w.view(bits)
        entry = {"bytes_differing": int(bad.sum()) * w.dtype.itemsize}
        if bad.any() and w.ndim == 2:
            where = list(zip(*(a.tolist() for a in bad.nonzero())))[:12]
            entry["first"] = [{"row": r, "col": c, "got": float(g[r, c]),
                               "want": float(w[r, c])} for r, c in where]
            entry["rows_differing"] = sorted(set(bad.nonzero()[0].tolist()))[:40]
            entry["cols_differing"] = sorted(set(bad.nonzero()[1].tolist()))
        out[k] = entry
    return out


def inner(cpu: bool) -> list:
    from lnorm.gpu import check, emulate, kernels

    if cpu:
        from lnorm.gpu.host import HostLayerNorm as Runner
    else:
        from lnorm.gpu.run import FusedLayerNorm as Runner
    runner = Runner()

    results = []
    for rows, D, dtype in SHAPES:
        p = kernels.plan(rows, D, dtype, "v5")
        inp = check.make_inputs(rows, D, dtype, seed=rows + D)
        x, dy, g, b = (inp[k] for k in ("x", "dy", "gamma", "beta"))
        _, *stats = emulate.forward(x, g, b, rung="v5")
        alone = runner.backward(dy, x, g, *stats, rung="v5", second_stage=False)
        got = dict(zip(("dx", "dgamma_part", "dbeta_part"),
                       (a.get() if hasattr(a, "get") else a for a in alone)))
        want = dict(zip(("dx", "dgamma_part", "dbeta_part"),
                        (emulate.backward(dy, x, g, *stats, rung="v5")[0],
                         *emulate.column_partials(dy, x, *stats, rung="v5"))))
        diff = differences(got, want)
        results.append({"rows": rows, "D": D, "dtype": dtype,
                        "kernel": p.kernel("backward"),
                        "rows_per_group": p.rows_per_group,
                        "partial_rows": p.partial_rows, "differences": diff})
        print(rows, D, dtype, p.kernel("backward"),
              {k: v["bytes_differing"] for k, v in diff.items()}, flush=True)
        for k, v in diff.items():
            for e in v.get("first", ())[:4]:
                print("   ", k, e)
    return results


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cpu = "--cpu" in sys.argv
    if "--inner" in sys.argv:
        results = inner(cpu)
        if args:
            Path(args[0]).write_text(json.dumps(results, indent=1))
        return
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(repo / "lnorm", root / "lnorm",
                        ignore=shutil.ignore_patterns("__pycache__"))
        patch(root)
        env = {**os.environ, "PYTHONPATH": str(root)}
        cmd = [sys.executable, __file__, "--inner", *(["--cpu"] if cpu else []),
               *[str(Path(a).resolve()) for a in args]]
        done = subprocess.run(cmd, env=env, cwd=tmp)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
