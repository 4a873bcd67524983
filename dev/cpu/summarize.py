"""Tables for dev/JOURNAL.md from the JSON files of devices.py and paired.py.

    .venv/bin/python dev/cpu/summarize.py devices dev/cpu/devices_*.json
    .venv/bin/python dev/cpu/summarize.py paired dev/cpu/paired_*.json
"""

import json
import sys

import numpy as np


def main() -> None:
    kind, paths = sys.argv[1], sys.argv[2:]
    runs = [json.load(open(p)) for p in paths]
    print("CPU:", {r["cpu"] for r in runs})
    key = "on_over_off" if kind == "devices" else "new_over_main"
    table: dict = {}
    for run in runs:
        for row in run["rows"]:
            k = (row.get("device", ""), tuple(row["shape"]), row["dtype"],
                 row["direction"])
            table.setdefault(k, []).append(row)
    if kind == "devices":
        print("| device | shape | dtype | pass | on/off, median of 3 runs "
              "| the 3 runs | rounds' range |")
        print("|---|---|---|---|---:|---|---|")
    else:
        print("| shape | dtype | pass | new/main, median of 3 | the 3 runs "
              "| rounds' range "
              "| x floor main | x floor new |")
        print("|---|---|---|---:|---|---|---:|---:|")
    for (device, shape, dtype, direction), rows in table.items():
        r = [row[key] for row in rows]
        lo, hi = min(row["min"] for row in rows), max(row["max"] for row in rows)
        runs_s = ", ".join(f"{v:.3f}" for v in r)
        if kind == "devices":
            print(f"| {device} | {shape} | {dtype} | {direction} | {np.median(r):.3f} "
                  f"| {runs_s} | {lo:.2f}-{hi:.2f} |")
        else:
            m = np.median([row["main_x_floor"] for row in rows])
            n = np.median([row["new_x_floor"] for row in rows])
            print(f"| {shape} | {dtype} | {direction} | {np.median(r):.3f} | {runs_s} "
                  f"| {lo:.2f}-{hi:.2f} | {m:.2f} | {n:.2f} |")


if __name__ == "__main__":
    main()
