"""benchmarks/warp_tail_probe.py: its patch still applies and builds the warp
kernels of a tail, its report names what differs, and on the CPU (the CUDA
source under g++) every probed shape equals the emulation."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def probe(load_benchmark):
    return load_benchmark("warp_tail_probe")


def test_patch_builds_the_warp_kernels_of_a_tail(probe, tmp_path):
    shutil.copytree(ROOT / "lnorm", tmp_path / "lnorm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    probe.patch(tmp_path)
    code = (
        "from lnorm.gpu import kernels\n"
        "names = {n for f in kernels.KERNEL_FILES for n in kernels.kernel_params(f)}\n"
        "print(sorted(n for n in names if '_warp_' in n and n.endswith('_any')))\n"
        f"print([kernels.plan(r, D, t, 'v5').kernel('backward') "
        f"for r, D, t in {probe.SHAPES!r}])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env={"PYTHONPATH": str(tmp_path)},
                          cwd=tmp_path, check=True)  # the copy, not this tree
    built, launched = (eval(line) for line in done.stdout.splitlines())
    assert built == [f"ln_{d}_grouped_warp_{s}_any" for d in ("bwd", "fwd")
                     for s in ("f16", "f32")]
    assert launched == [f"ln_bwd_grouped_warp_f{t[len('float'):]}_any"
                        for _, _, t in probe.SHAPES]
    # this build has none of them
    from lnorm.gpu import kernels
    assert not any("_warp_" in n and n.endswith("_any")
                   for f in kernels.KERNEL_FILES for n in kernels.kernel_params(f))


def test_differences_name_the_entries_that_differ(probe):
    want = {"dx": np.ones(3, np.float32),
            "dgamma_part": np.zeros((2, 3), np.float32)}
    got = {"dx": want["dx"].copy(), "dgamma_part": want["dgamma_part"].copy()}
    got["dgamma_part"][1, 2] = -0.0  # one bit
    diff = probe.differences(got, want)
    assert diff["dx"] == {"bytes_differing": 0}
    part = diff["dgamma_part"]
    assert part["bytes_differing"] == 4 and part["rows_differing"] == [1]
    assert part["cols_differing"] == [2]
    assert part["first"] == [{"row": 1, "col": 2, "got": -0.0, "want": 0.0}]


@pytest.mark.cuda_on_cpu
@pytest.mark.slow
def test_on_the_cpu_every_probed_shape_equals_the_emulation(tmp_path):
    from lnorm.gpu import host

    ok, why = host.available()
    if not ok:
        pytest.skip(f"cannot compile the CUDA sources for the CPU: {why}")
    out = tmp_path / "probe.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "warp_tail_probe.py"),
                    "--cpu", str(out)], check=True, capture_output=True)
    results = json.loads(out.read_text())
    assert len(results) == 6
    for r in results:
        assert r["kernel"].endswith("_any")
        assert all(d["bytes_differing"] == 0 for d in r["differences"].values())
