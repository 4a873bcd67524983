"""Merge what dev/gpu_session.sh brought back into one data file.

    python dev/collect.py OUT_DIR [OUT_DIR ...] --into book/data/gpu/

Each OUT_DIR holds the session's files: ``m.json`` (``python -m
lnorm.gpu.measure``, with the peers merged in), ``long.json`` and
``session.log``. The first folder's ``m.json`` is the base; from every folder
(in order, later ones filling only what is still missing) it adds the
sanitizers' verdicts, ``ncu``'s metrics, the GPU tests' summary and the
timings of ``long.json``, and writes ``<device>-<date>.json`` (``h100``,
``h200``, ...) into ``--into``; the device is the first A, H or B name of two
or three digits in ``m.json``'s ``device`` (any other name stops with an
error). ``--note`` may be repeated: each is a line of the file's ``notes``.
Needs no GPU.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
from pathlib import Path

NCU_STEP = re.compile(r"^== ncu_(\d+)x(\d+)_(float\d+)_(v\d) ")
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


def _steps(log: str) -> dict[str, str]:
    """The log's output per step: ``== name (limit ...)`` up to the next step."""
    out, name = {}, None
    for line in log.splitlines():
        m = re.match(r"^== (\S+) \(limit", line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name and not line.startswith(f"== {name}:"):
            out[name] += line + "\n"
    return out


def sanitizers(steps: dict[str, str]) -> dict:
    """Each tool's summary line and error count."""
    out = {}
    for tool in TOOLS:
        text = steps.get(tool, "")
        m = re.search(r"(ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: .*\((\d+) "
                      r"errors?.*\))", text)
        if m:
            errors = int(m.group(2) if m.group(2) is not None else m.group(3))
            out[tool] = {"summary": m.group(1), "errors": errors,
                         "program": "python -m lnorm.gpu.measure --launch-only"}
    return out


def ncu_profiles(steps: dict[str, str]) -> list[dict]:
    """Per profiled shape: each kernel's metrics, from its middle launch."""
    out = []
    for name, text in steps.items():
        m = NCU_STEP.match(f"== {name} ")
        if not m:
            continue
        rows = [line for line in text.splitlines() if line.startswith('"')]
        if not rows:
            continue
        table = list(csv.reader(io.StringIO("\n".join(rows))))
        head = table[0]
        col = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name",
                                          "Metric Value")}
        launches: dict[str, dict[str, dict]] = {}
        for r in table[1:]:
            per = launches.setdefault(r[col["Kernel Name"]], {})
            metrics = per.setdefault(r[col["ID"]], {})
            value = r[col["Metric Value"]].replace(",", "")
            metrics[r[col["Metric Name"]]] = float(value)
        kernels = {}
        for kernel, per in launches.items():
            ids = sorted(per, key=int)
            kernels[kernel] = per[ids[len(ids) // 2]]
        out.append({"rows": int(m.group(1)), "D": int(m.group(2)),
                    "dtype": m.group(3), "rung": m.group(4), "kernels": kernels,
                    "note": "the middle of three profiled launches per kernel"})
    return out


def gpu_tests(steps: dict[str, str]) -> dict | None:
    """The GPU tests' last line, and its counts."""
    text = steps.get("tests") or steps.get("gpu_tests")  # the step's earlier name
    if not text:
        return None
    last = [line for line in text.splitlines() if " in " in line and "passed" in line]
    if not last:
        return None
    counts = {k: int(n)
              for n, k in re.findall(r"(\d+) (passed|failed|skipped)", last[-1])}
    failed = re.findall(r"^_{3,} (test\S+) _{3,}$", text, flags=re.M)
    return {"summary": last[-1].strip("= "), **counts, "failed_tests": failed,
            "command": "python -m pytest tests/test_gpu.py -m 'not slow'"}


def collect(folders: list[Path]) -> dict:
    data = json.loads((folders[0] / "m.json").read_text())
    for folder in folders:
        log = folder / "session.log"
        steps = _steps(log.read_text()) if log.exists() else {}
        found = {"sanitizers": sanitizers(steps), "ncu_profiles": ncu_profiles(steps),
                 "gpu_tests": gpu_tests(steps)}
        long = folder / "long.json"
        if long.exists():
            found["more_timings"] = json.loads(long.read_text())
        for key, value in found.items():
            if value and key not in data:
                data[key] = value
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--into", type=Path, required=True)
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the file's 'notes'")
    args = parser.parse_args()
    data = collect(args.folders)
    if args.note:
        data["notes"] = args.note
    device = re.search(r"\b([AHB]\d{2,3})\b", data["device"]).group(1).lower()
    path = args.into / f"{device}-{data['date']}.json"
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
