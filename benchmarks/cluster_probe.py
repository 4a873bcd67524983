"""Where v5's clusters lose time: a strip sweep on a GPU, and the profiler's
numbers merged into the cluster file that ``cluster_check.py`` wrote.

    python3 benchmarks/cluster_probe.py sweep SWEEP.json           # needs a GPU
    python3 benchmarks/cluster_probe.py merge CLUSTERS.json SWEEP.json NCU.csv

``sweep`` times v5 at the long rows of ``cluster_check.py`` with the plan's
strips changed: ``CLUSTER_WAVES`` times more clusters, with and without the
budget of the partial sums (``PARTIALS_BUDGET``). It patches the two
constants of :mod:`lnorm.gpu.kernels` in this process only; the forward's
bits do not depend on its strips, the backward's do, so these runs are
timings, not bit checks. ``merge`` needs no GPU: it adds ``strip_sweep`` and
``ncu`` (each profiled kernel's launch, occupancy, DRAM and scheduler numbers)
to CLUSTERS.json. NCU.csv is what this loop writes, on the GPU::

    S="--section WarpStateStats --section SchedulerStats --section SpeedOfLight \\
       --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
    for p in "bwd 8192 16384 float32" "bwd 2048 65536 float16"; do  # ...
      set -- $p; echo "#### $p" >> ncu.csv
      ncu --csv --page details $S -k regex:ln_$1_grouped --launch-skip 2 \\
          --launch-count 1 python3 -m lnorm.gpu.measure --profile $2 $3 $4 \\
          --rung v5 >> ncu.csv
    done

Runs from the repository root with ``PYTHONPATH=.``.
"""
import csv
import io
import json
import re
import sys

SHAPES = ((8192, 16384), (4096, 32768), (2048, 65536))
#: (CLUSTER_WAVES, PARTIALS_BUDGET): the plan's first, then more clusters
#: and no budget (1.0 never binds)
SETTINGS = ((4, 0.05), (4, 1.0), (8, 1.0), (16, 1.0), (8, 0.05), (30, 1.0))
#: ncu's names (details page) -> the file's
NCU_METRICS = {
    "Duration": "duration_ns", "DRAM Throughput": "dram_pct",
    "Grid Size": "grid", "Block Size": "block", "Cluster Size": "cluster",
    "Max Active Clusters": "max_active_clusters", "Waves Per SM": "waves_per_sm",
    "Registers Per Thread": "registers",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Warp Cycles Per Issued Instruction": "cycles_per_issue",
    "Eligible Warps Per Scheduler": "eligible_warps_per_scheduler",
    "Issued Warp Per Scheduler": "issued_per_scheduler_cycle",
}
L1TEX_RULE = re.compile(r"L1TEX .*? about ([\d.]+)% of the total average of "
                        r"([\d.]+) cycles")


def sweep(path: str) -> None:
    import cupy as cp

    from lnorm.gpu import kernels, measure
    from lnorm.gpu.run import FusedLayerNorm

    fused, timer, out = FusedLayerNorm(), measure._Timer(cp, 15), []
    for waves, budget in SETTINGS:
        kernels.CLUSTER_WAVES, kernels.PARTIALS_BUDGET = waves, budget
        for t in measure.time_shapes(cp, fused, timer, SHAPES,
                                     rungs=("v5",))["timings"]:
            p = kernels.plan(t["rows"], t["D"], t["dtype"], "v5")
            t.update(waves=waves, budget=budget, cluster=p.cluster,
                     forward_clusters=p.forward_grid // p.cluster,
                     backward_clusters=p.backward_grid // p.cluster,
                     rows_per_group=p.rows_per_group)
            print(waves, budget, t["direction"], t["rows"], t["D"], t["dtype"],
                  f"{t['copy_share']:.3f}", flush=True)
            out.append(t)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def ncu_summary(text: str) -> list[dict]:
    """One entry per ``#### direction rows D dtype`` block of ncu's CSV."""
    out = []
    for block in re.split(r"^#### ", text, flags=re.M)[1:]:
        head, _, body = block.partition("\n")
        direction, rows, D, dtype = head.split()
        table = list(csv.reader(io.StringIO(body[body.index('"ID"'):])))
        col = {k: table[0].index(k) for k in (
            "Kernel Name", "Metric Name", "Metric Value", "Rule Description")}
        entry = {"direction": {"fwd": "forward", "bwd": "backward"}[direction],
                 "rows": int(rows), "D": int(D), "dtype": dtype}
        for r in table[1:]:
            r += [""] * (len(table[0]) - len(r))
            entry["kernel"] = r[col["Kernel Name"]]
            name = NCU_METRICS.get(r[col["Metric Name"]])
            if name and r[col["Metric Value"]]:
                entry[name] = float(r[col["Metric Value"]].replace(",", ""))
            m = L1TEX_RULE.search(r[col["Rule Description"]])
            if m:
                entry["l1tex_wait_share"] = float(m.group(1)) / 100
        out.append(entry)
    return out


def merge(clusters: str, sweep_path: str, ncu_csv: str) -> None:
    with open(clusters) as f:
        data = json.load(f)
    with open(sweep_path) as f:
        data["strip_sweep"] = json.load(f)
    with open(ncu_csv) as f:
        data["ncu"] = ncu_summary(f.read())
    with open(clusters, "w") as f:
        json.dump(data, f, indent=1)
    print(f"{clusters}: {len(data['strip_sweep'])} sweep timings, "
          f"{len(data['ncu'])} profiles")


if __name__ == "__main__":
    if sys.argv[1] == "sweep":
        sweep(sys.argv[2])
    elif sys.argv[1] == "merge":
        merge(*sys.argv[2:5])
    else:
        sys.exit(__doc__)
