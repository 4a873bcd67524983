"""Patched copies of lnorm/fused.py, loaded side by side, and a paired timer.

A variant is the source of fused.py at some commit (or in the work tree) with
text replacements applied, each of which must match exactly once; it is
written to a directory outside the package and imported as its own module, so
that two copies run in one process, interleaved. Nothing in lnorm imports this.

Times are the calling thread's CPU time (``time.thread_time``), so the loops
must run on that thread (``threads=1``): on a machine shared with other
processes, a call that is descheduled halfway would otherwise count the time
it waited, and single rounds came out 0.1 to 10 times their neighbours.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lnorm import bench
from lnorm.inputs import make_inputs

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path("/tmp/lnorm_fused_variants")


def source(commit: str | None) -> str:
    """fused.py at ``commit`` (None: the work tree)."""
    if commit is None:
        return (ROOT / "lnorm" / "fused.py").read_text()
    return subprocess.run(["git", "show", f"{commit}:lnorm/fused.py"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout


def build(name: str, text: str, patches=()):
    """Import ``text`` with ``patches`` ((old, new) pairs) as module ``name``."""
    for old, new in patches:
        n = text.count(old)
        if n != 1:
            raise ValueError(f"{name}: {old!r} occurs {n} times")
        text = text.replace(old, new)
    text = text.replace("from .", "from lnorm.")
    BUILD.mkdir(exist_ok=True)
    path = BUILD / f"{name}.py"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def calls(mod, x, gamma, beta, dy, threads=1):
    """Forward and backward of ``mod`` into buffers allocated once (as the bench)."""
    empty = getattr(mod, "empty_apart", lambda shape, dtype, *o: np.empty(shape, dtype))
    _, cache = mod.forward(x, gamma, beta)
    y_buf = empty(x.shape, x.dtype, x)
    xhat_buf = empty(x.shape, x.dtype, x, y_buf)
    dx_buf = empty(x.shape, x.dtype, dy, cache.xhat)
    return {
        "forward": lambda: mod.forward(x, gamma, beta, out=(y_buf, xhat_buf),
                                       threads=threads),
        "backward": lambda: mod.backward(dy, cache, out=dx_buf, threads=threads),
    }


def paired(mods: dict, shape, dtype, rounds: int, seed: int = 0, copy=True):
    """Interleave the forward and backward of each module in ``mods`` with the
    copy, ``rounds`` shuffled rounds; returns {(name, direction): times / floor}
    (one entry per round) and the copy bandwidths. ``copy=False``: no copy,
    and the times themselves (seconds)."""
    x, gamma, beta, dy = make_inputs(shape, dtype, seed)
    fns = {}
    for name, mod in mods.items():
        for direction, fn in calls(mod, x, gamma, beta, dy).items():
            fns[name, direction] = fn
    if copy:
        src, dst = bench.copy_arrays()
        fns["copy"] = lambda: np.copyto(dst, src)
    rng = np.random.default_rng(seed)
    keys = list(fns)
    for fn in fns.values():  # compile, page in
        fn()
    times = {k: [] for k in keys}
    for _ in range(rounds):
        for i in rng.permutation(len(keys)):
            t0 = time.thread_time()
            fns[keys[i]]()
            times[keys[i]].append(time.thread_time() - t0)
    if not copy:
        return {k: np.asarray(ts) for k, ts in times.items()}, None
    bw = 2.0 * src.nbytes / np.asarray(times.pop("copy"))
    out = {}
    for (name, direction), ts in times.items():
        floor = bench.floor_bytes(direction, shape, dtype)
        out[name, direction] = np.asarray(ts) * bw / floor
    return out, bw


def cpu_model() -> str:
    """The CPU model, as the bench records it."""
    return bench.machine(1)["cpu"]
