"""dev/collect.py: a GPU session's output merged into one data file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def collect(load_dev):
    return load_dev("collect")


HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
        '"Metric Unit","Metric Value"')


def ncu_row(launch, kernel, metric, value):
    return (f'"{launch}","1","python3","h","{kernel}","1","7","(512, 1, 1)",'
            f'"(128, 1, 1)","0","9.0","Command line profiler metrics","{metric}",'
            f'"byte","{value}"')


LOG = "\n".join([
    "== memcheck (limit 90 s): compute-sanitizer --tool memcheck ...",
    "========= COMPUTE-SANITIZER",
    "========= ERROR SUMMARY: 0 errors",
    "== memcheck: rc 0 in 2 s",
    "== racecheck (limit 90 s): compute-sanitizer --tool racecheck ...",
    "========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warnings)",
    "== racecheck: rc 0 in 7 s",
    "== tests (limit 150 s): python3 -m pytest ...",
    "_____________ test_something[8192-1024] _____________",
    "3 failed, 213 passed, 5 skipped in 34.85s",
    "== tests: rc 1 in 37 s",
    "== ncu_8192x8192_float32_v5 (limit 60 s): ncu --csv ...",
    "==PROF== Connected to process 840",
    HEAD,
    *(ncu_row(i, "ln_bwd_x", "dram__bytes_read.sum", f"{v:,}")
      for i, v in ((1, 1000), (3, 3_000_000), (5, 5000))),
    "== ncu_8192x8192_float32_v5: rc 0 in 7 s",
])


def test_a_session_becomes_one_file(collect, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3",
                                            "date": "2026-01-02", "timings": []}))
    (out / "session.log").write_text(LOG)
    (out / "long.json").write_text(json.dumps({"timings": [{"rung": "v4"}]}))
    monkeypatch.setattr(sys, "argv", ["collect.py", str(out), "--into", str(tmp_path),
                                      "--note", "a note"])
    collect.main()
    data = json.loads((tmp_path / "h100-2026-01-02.json").read_text())
    assert data["sanitizers"]["memcheck"]["errors"] == 0
    assert data["sanitizers"]["racecheck"]["errors"] == 2  # errors, not hazards
    assert "synccheck" not in data["sanitizers"]  # not run: not claimed clean
    tests = data["gpu_tests"]
    assert (tests["failed"], tests["passed"], tests["skipped"]) == (3, 213, 5)
    assert tests["failed_tests"] == ["test_something[8192-1024]"]
    (profile,) = data["ncu_profiles"]
    assert (profile["rows"], profile["D"], profile["dtype"], profile["rung"]) == (
        8192, 8192, "float32", "v5")
    # the middle of three launches, its thousands separators read
    assert profile["kernels"]["ln_bwd_x"]["dram__bytes_read.sum"] == 3e6
    assert data["more_timings"] == {"timings": [{"rung": "v4"}]}
    assert data["notes"] == ["a note"]


def test_an_earlier_folder_wins(collect, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, errors in ((first, 0), (second, 5)):
        folder.mkdir()
        (folder / "m.json").write_text(json.dumps({"device": "NVIDIA H200",
                                                   "date": "2026-01-02"}))
        (folder / "session.log").write_text(
            "== memcheck (limit 9 s): x\n"
            f"========= ERROR SUMMARY: {errors} errors\n== memcheck: rc 0 in 1 s\n")
    data = collect.collect([first, second])
    assert data["sanitizers"]["memcheck"]["errors"] == 0
    assert collect.collect([second, first])["sanitizers"]["memcheck"]["errors"] == 5
