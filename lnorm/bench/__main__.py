r"""The command line ``python -m lnorm.bench``: the ladder timed against the copy floor.

``--help`` lists the options; ``--quick`` times one shape in float32 in a few
seconds. Without options it times :data:`lnorm.bench.DEFAULT_SHAPES` in
float32 and float16 and prints a table (``--json``: the report of
:func:`lnorm.bench.run`, which says what is measured and how).

Examples
--------
>>> QUICK_SHAPES, DEFAULT_DTYPES
(((8, 512, 1024),), ('float32', 'float16'))
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from lnorm.bench import DEFAULT_SHAPES, run

__all__ = ["QUICK_SHAPES", "DEFAULT_DTYPES", "format_table", "main"]

#: The shape of ``--quick`` (float32 only, 5 rounds).
QUICK_SHAPES = ((8, 512, 1024),)
#: The dtypes timed without ``--dtype`` (``--quick``: float32).
DEFAULT_DTYPES = ("float32", "float16")


def format_table(report: dict) -> str:
    r"""Format a report of :func:`lnorm.bench.run` as a table, one line per result.

    Examples
    --------
    A report with made-up numbers:

    >>> row = {"shape": [64, 1024], "dtype": "float32", "direction": "backward",
    ...        "impl": "fused", "seconds": {"median": 0.002}, "gbs": 10.0,
    ...        "copy_gbs": 20.0, "x_floor": 2.0, "speedup_vs_reference": 5.0}
    >>> report = {"machine": {"cpu": "Some CPU", "blas_threads": 1}, "repeat": 7,
    ...           "results": [row]}
    >>> print(format_table(report))
    Some CPU, 1 thread(s); 7 shuffled rounds
    floor: bytes the op must move (inputs once, outputs once) / copy bandwidth
    <BLANKLINE>
               shape   dtype     pass      impl       ms   GB/s   copy xfloor  x ref
          (64, 1024) float32 backward     fused    2.000   10.0   20.0   2.00   5.00
    <BLANKLINE>
    ms: median; GB/s: floor bytes / median time; copy: copy bandwidth (GB/s);
    xfloor, x ref: medians over rounds of time / floor and reference / time.
    """
    lines = [
        f"{report['machine']['cpu']}, {report['machine']['blas_threads']} thread(s); "
        f"{report['repeat']} shuffled rounds",
        "floor: bytes the op must move (inputs once, outputs once) / copy bandwidth",
        "",
        f"{'shape':>16} {'dtype':>7} {'pass':>8} {'impl':>9} {'ms':>8} "
        f"{'GB/s':>6} {'copy':>6} {'xfloor':>6} {'x ref':>6}",
    ]
    for r in report["results"]:
        lines.append(
            f"{str(tuple(r['shape'])):>16} {r['dtype']:>7} {r['direction']:>8} "
            f"{r['impl']:>9} {r['seconds']['median'] * 1e3:8.3f} {r['gbs']:6.1f} "
            f"{r['copy_gbs']:6.1f} {r['x_floor']:6.2f} {r['speedup_vs_reference']:6.2f}"
        )
    lines += [
        "",
        "ms: median; GB/s: floor bytes / median time; copy: copy bandwidth (GB/s);",
        "xfloor, x ref: medians over rounds of time / floor and reference / time.",
    ]
    if not report["results"]:
        lines.append("(no measurements)")
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line's options, with usage errors for values below their minimum."""
    p = argparse.ArgumentParser(
        prog="python -m lnorm.bench",
        description="Time the layer-norm ladder (reference, tiled, fused) against "
        "the copy-bandwidth floor.",
    )
    p.add_argument(
        "--shape", type=int, nargs="+", action="append", metavar="N",
        help="an input shape, e.g. --shape 8 512 1024 (repeatable; default: "
        + ", ".join(str(s) for s in DEFAULT_SHAPES) + ")",
    )
    p.add_argument("--dtype", nargs="+", choices=("float16", "float32", "float64"),
                   help="dtypes to time (default: " + " ".join(DEFAULT_DTYPES)
                   + "; quick: float32)")
    p.add_argument("--repeat", type=int, help="timed rounds (default 7, quick 5)")
    p.add_argument("--block-rows", type=int,
                   help="rows per block of tiled (default tile_rows(D))")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS threads and fused-loop threads (default 1; the "
                   "copy runs on one)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of inputs and order (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quick", action="store_true",
                   help="the shape " + ", ".join(str(s) for s in QUICK_SHAPES)
                   + ", float32, 5 rounds")
    args = p.parse_args(argv)
    for name in ("repeat", "block_rows", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.seed < 0:
        p.error("--seed must be >= 0")
    for shape in args.shape or ():
        if min(shape) < 1:
            p.error(f"--shape sizes must be >= 1; got {shape}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    r"""Run ``python -m lnorm.bench`` with ``argv`` (default ``sys.argv[1:]``).

    Returns the exit status, 0; invalid arguments and ``--help`` exit through
    argparse (``SystemExit``).

    Examples
    --------
    >>> import contextlib, io
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     status = main(["--shape", "4", "8", "--repeat", "1", "--json"])
    >>> report = json.loads(out.getvalue())
    >>> status, sorted(report), len(report["results"])
    (0, ['copy_bytes', 'fused_threads', 'machine', 'repeat', 'results', 'seed'], 16)
    """
    args = _parse(argv)
    shapes = args.shape or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    dtypes = args.dtype or (("float32",) if args.quick else DEFAULT_DTYPES)
    repeat = args.repeat or (5 if args.quick else 7)
    report = run(shapes, dtypes, repeat=repeat, block_rows=args.block_rows,
                 threads=args.threads, seed=args.seed)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
