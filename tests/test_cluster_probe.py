"""benchmarks/cluster_probe.py: ncu's details merged into a cluster file, and
the H100 file it made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lnorm.gpu import kernels

ROOT = Path(__file__).parents[1]
CLUSTER_FILE = ROOT / "book" / "data" / "gpu" / "clusters" / "h100-2026-11-27.json"

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context",'
        '"Stream","Block Size","Grid Size","Device","CC","Section Name",'
        '"Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
        '"Rule Description"')


@pytest.fixture(scope="module")
def probe(load_benchmark):
    return load_benchmark("cluster_probe")


def row(kernel, section, metric, value, rule=""):
    cells = ["0", "1", "python3", "h", kernel, "1", "7", "(512, 1, 1)",
             "(256, 1, 1)", "0", "9.0", section, metric, "", value]
    if rule:  # ncu leaves the rule's columns out of a metric's row
        cells += ["WarpStateStats", "OPT", rule]
    return ",".join(f'"{c}"' for c in cells)


def profile(head, kernel, grid, clusters, rule):
    return "\n".join([
        f"#### {head}",
        "==PROF== Connected to process 840",
        HEAD,
        row(kernel, "LaunchStats", "Grid Size", f"{grid:,}"),
        row(kernel, "Occupancy", "Max Active Clusters", str(clusters)),
        row(kernel, "SchedulerStats", "Eligible Warps Per Scheduler", "0.56"),
        row(kernel, "SpeedOfLight", "Duration", "1,664,000"),
        row(kernel, "SpeedOfLight", "Memory Frequency", "2.62"),  # not kept
        row(kernel, "WarpStateStats", "", "", rule),
    ])


RULE = ("On average, each warp of this workload spends 4.8 cycles being stalled "
        "waiting for a scoreboard dependency on a L1TEX (local, global, surface, "
        "texture) operation. ... This stall type represents about 33.3% of the "
        "total average of 14.3 cycles between issuing two instructions.")


def test_each_profile_becomes_one_entry(probe):
    text = "\n".join([
        profile("bwd 2048 65536 float16", "ln_bwd_grouped_cluster8_f16_v8", 256,
                15, RULE),
        profile("fwd 8192 16384 float32", "ln_fwd_grouped_cluster2_f32_v4", 1024,
                132, "Another rule, without the L1TEX sentence."),
    ])
    bwd, fwd = probe.ncu_summary(text)
    assert (bwd["direction"], bwd["rows"], bwd["D"], bwd["dtype"]) == (
        "backward", 2048, 65536, "float16")
    assert bwd["kernel"] == "ln_bwd_grouped_cluster8_f16_v8"
    assert (bwd["grid"], bwd["max_active_clusters"]) == (256, 15)
    assert bwd["duration_ns"] == 1_664_000  # thousands separators read
    assert bwd["eligible_warps_per_scheduler"] == 0.56
    assert bwd["l1tex_wait_share"] == pytest.approx(0.333)
    assert "Memory Frequency" not in bwd and len(bwd) == 10
    assert fwd["direction"] == "forward" and fwd["grid"] == 1024
    assert "l1tex_wait_share" not in fwd


def test_merge_adds_the_sweep_and_the_profiles(probe, tmp_path):
    clusters = tmp_path / "c.json"
    clusters.write_text(json.dumps({"device": "X", "timings": [1]}))
    sweep = tmp_path / "s.json"
    sweep.write_text(json.dumps([{"waves": 4}]))
    ncu = tmp_path / "n.csv"
    ncu.write_text(profile("bwd 64 16384 float32", "ln_bwd_grouped_cluster2_f32_v4",
                           64, 66, RULE))
    probe.merge(str(clusters), str(sweep), str(ncu))
    data = json.loads(clusters.read_text())
    assert data["device"] == "X" and data["timings"] == [1]  # kept
    assert data["strip_sweep"] == [{"waves": 4}]
    assert [p["D"] for p in data["ncu"]] == [16384]


def test_the_h100_profiles_are_of_this_plan():
    """Each profiled launch has the grid and cluster the plan gives its shape,
    and the sweep's row with the plan's constants has the plan's clusters."""
    data = json.loads(CLUSTER_FILE.read_text())
    assert len(data["ncu"]) == 8
    for p in data["ncu"]:
        plan = kernels.plan(p["rows"], p["D"], p["dtype"], "v5")
        direction = "fwd" if p["direction"] == "forward" else "bwd"
        assert p["kernel"] == plan.kernel(p["direction"])
        assert p["kernel"].startswith(f"ln_{direction}_")
        grid = plan.forward_grid if direction == "fwd" else plan.backward_grid
        assert p["grid"] == grid
        assert p["cluster"] == (plan.cluster if plan.cluster > 1 else 0)
    planned = [t for t in data["strip_sweep"]
               if (t["waves"], t["budget"]) == (kernels.CLUSTER_WAVES,
                                                kernels.PARTIALS_BUDGET)]
    assert len(planned) == 12
    for t in planned:
        plan = kernels.plan(t["rows"], t["D"], t["dtype"], "v5")
        assert t["backward_clusters"] == plan.backward_grid // plan.cluster
        assert t["rows_per_group"] == plan.rows_per_group
