r"""A model of the work and the memory traffic of layer normalization.

Layer normalization does a handful of FLOPs per element and moves every
element through memory at least twice, so its time is set by **bytes
moved**. This module counts both, forward and backward, under three
schedules of the same arithmetic (``SCHEDULES``):

``"numpy"``
    Op by op: every operator reads its operands from memory and writes a
    full-size temporary. :func:`numpy_program` lists the steps, the lines
    of :func:`lnorm.core.forward_formula` and
    :func:`lnorm.core.backward_formula` (a test checks it).
``"tiled"``
    The same steps on blocks of ``block_rows`` rows whose temporaries stay
    in cache: main memory sees each input read and each output written once,
    plus the parameter vectors and ``dgamma``/``dbeta`` partial sums once
    per further block.
``"fused"``
    One loop (CPU) or kernel (GPU): each input read once, each output
    written once. Through the caches the model counts a loop of its own,
    a row at a time: ``LOOP_SWEEPS`` sweeps over each row, with ``gamma``,
    ``beta`` and the column sums of ``LOOP_ITEMSIZE`` bytes. A real loop may
    move less through its caches; its main-memory bytes are the same.

Every :class:`Traffic` has two levels: the bytes to and from **main
memory**, and ``bytes_cached``, every load and store the program issues,
cache hits included. With ``write_allocate=True`` a plain CPU store to a
line not in cache reads it first, so every full-size tensor written to
memory is read once more; streaming stores and GPU stores of whole sectors
do not. The fused bytes over a copy bandwidth are the floor that
:mod:`lnorm.bench` measures against.

Sizes: a full-size tensor is ``rows * D`` elements of ``itemsize`` bytes
(``work_itemsize`` for a temporary computed in a working dtype); a per-row
statistic is ``rows`` elements of ``stat_itemsize`` bytes, and a mean saved
in ``mean_parts`` pieces counts as that many; a parameter vector is ``D``
elements of ``itemsize``. FLOPs: one per add, subtract, multiply, divide or
square root, ``k`` for a sum of ``k`` numbers, ``2 k`` for a dot product;
they do not depend on the schedule. A size argument that is not an integer
raises ``TypeError``; one out of range, or an unknown ``direction``,
``schedule`` or ``saved``, raises ``ValueError``.

What the forward saves for the backward (``SAVED``):

``"xhat_rstd"``
    ``xhat`` and ``rstd``, what :func:`lnorm.forward` keeps; the forward
    writes ``xhat`` as a second full-size output.
``"x_mean_rstd"``
    ``x``, ``mean`` and ``rstd``; the backward recomputes ``xhat``. PyTorch
    saves this (``tools/autograd/derivatives.yaml``); the GPU kernels of
    the GPU chapter save the mean in two pieces (``mean_parts=2``).
``"y_rstd"``
    ``y`` and ``rstd``; the backward recovers ``xhat = (y - beta) / gamma``,
    as Apex's ``memory_efficient=True`` does (NVIDIA/apex 25.09,
    ``csrc/layer_norm_cuda_kernel.cu`` divides by
    ``clamp_by_magnitude(gamma, eps)``): wrong where ``|gamma|`` is tiny.
``"x"``
    ``x`` alone (recomputation, Chen et al., 2016): the backward pays the
    statistics again in FLOPs, and, fused, in no extra bytes.

Examples
--------
>>> from lnorm import cost
>>> for schedule in cost.SCHEDULES:
...     t = cost.traffic("backward", schedule, rows=1024, D=1024, itemsize=4)
...     print(schedule, t.passes, round(t.per_element(), 1))
numpy 18 72.0
tiled 3 12.0
fused 3 12.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from .validate import check_int

__all__ = [
    "DIRECTIONS",
    "SCHEDULES",
    "SAVED",
    "LOOP_ITEMSIZE",
    "LOOP_SWEEPS",
    "Step",
    "Traffic",
    "numpy_program",
    "traffic",
    "cache_bytes",
]

#: The two passes :func:`traffic` counts.
DIRECTIONS = ("forward", "backward")
#: The schedules of the module docstring, slowest first.
SCHEDULES = ("numpy", "tiled", "fused")
#: What the forward can keep for the backward (the module docstring's list).
SAVED = ("xhat_rstd", "x_mean_rstd", "y_rstd", "x")
#: Bytes of an element of the modelled fused loop's float64 vectors
#: (``gamma``, ``beta`` and the column sums of ``dgamma`` and ``dbeta``).
LOOP_ITEMSIZE = 8
#: Sweeps of the modelled fused loop over each row: the forward's sum,
#: squared deviations and outputs; the backward's sums, then ``dx``.
LOOP_SWEEPS = {"forward": 3, "backward": 2}

# Every tensor name the programs use, by kind: "full" is (rows, D), "row" is
# (rows,), "param" is (D,). A name not listed here is a full-size temporary.
_ROW = frozenset({"mean", "var", "rstd", "mean_g", "mean_gxhat"})
_PARAM = frozenset({"gamma", "beta", "dgamma", "dbeta"})

# What each direction reads and writes, for each choice of saved tensors, in
# a schedule that touches every tensor exactly once ("fused").
_IO = {
    ("forward", "xhat_rstd"): (("x", "gamma", "beta"), ("y", "xhat", "rstd")),
    ("forward", "x_mean_rstd"): (("x", "gamma", "beta"), ("y", "mean", "rstd")),
    ("forward", "y_rstd"): (("x", "gamma", "beta"), ("y", "rstd")),
    ("forward", "x"): (("x", "gamma", "beta"), ("y",)),
    ("backward", "xhat_rstd"): (
        ("dy", "xhat", "rstd", "gamma"), ("dx", "dgamma", "dbeta")
    ),
    ("backward", "x_mean_rstd"): (
        ("dy", "x", "mean", "rstd", "gamma"), ("dx", "dgamma", "dbeta")
    ),
    ("backward", "y_rstd"): (
        ("dy", "y", "rstd", "gamma", "beta"), ("dx", "dgamma", "dbeta")
    ),
    ("backward", "x"): (("dy", "x", "gamma"), ("dx", "dgamma", "dbeta")),
}


@dataclass(frozen=True)
class Step:
    r"""One NumPy expression of the op-by-op program.

    Attributes
    ----------
    code : str
        The expression, as NumPy code.
    reads, writes : tuple of str
        Tensors it reads and writes; an operand used twice is read once.
    flops_full, flops_row : int
        FLOPs per element of a full-size tensor, and per row.

    Examples
    --------
    >>> step = numpy_program("forward")[2]
    >>> step.code, step.reads, step.writes
    ('sq = xc * xc', ('xc',), ('sq',))
    """

    code: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    flops_full: int = 1
    flops_row: int = 0


def _s(code, reads, writes, flops_full=1, flops_row=0) -> Step:
    return Step(
        code, tuple(reads.split()), tuple(writes.split()), flops_full, flops_row
    )


# The forward, one temporary per operator: the lines of lnorm.core.forward_formula,
# which lnorm.bench's reference runs.
_FORWARD = (
    _s("mean = x.mean(axis=-1, keepdims=True)", "x", "mean", 1, 1),
    _s("xc = x - mean", "x mean", "xc"),
    _s("sq = xc * xc", "xc", "sq"),
    _s("var = sq.mean(axis=-1, keepdims=True)", "sq", "var", 1, 1),
    _s("rstd = 1.0 / np.sqrt(var + eps)", "var", "rstd", 0, 3),
    _s("xhat = xc * rstd", "xc rstd", "xhat"),
    _s("scaled = gamma * xhat", "gamma xhat", "scaled"),
    _s("y = scaled + beta", "scaled beta", "y"),
)

# The backward from xhat and rstd: the compact formula, dy * xhat formed once
# for both dgamma and mean(g * xhat) = (dy * xhat) @ gamma / D (the lines of
# lnorm.core.backward_formula).
_BACKWARD = (
    _s("g = dy * gamma", "dy gamma", "g"),
    _s("dy_xhat = dy * xhat", "dy xhat", "dy_xhat"),
    _s("mean_g = g.sum(axis=-1, keepdims=True) / D", "g", "mean_g", 1, 1),
    _s(
        "mean_gxhat = (dy_xhat @ gamma)[..., None] / D",
        "dy_xhat gamma", "mean_gxhat", 2, 1,
    ),
    _s("u = g - mean_g", "g mean_g", "u"),
    _s("t = xhat * mean_gxhat", "xhat mean_gxhat", "t"),
    _s("v = u - t", "u t", "v"),
    _s("dx = rstd * v", "rstd v", "dx"),
    _s("dgamma = dy_xhat.sum(axis=lead)", "dy_xhat", "dgamma"),
    _s("dbeta = dy.sum(axis=lead)", "dy", "dbeta"),
)

# How the backward gets xhat back from what was saved.
_RECOVER = {
    "xhat_rstd": (),
    "x_mean_rstd": (
        _s("xc = x - mean", "x mean", "xc"),
        _s("xhat = xc * rstd", "xc rstd", "xhat"),
    ),
    "y_rstd": (
        _s("yc = y - beta", "y beta", "yc"),
        _s("xhat = yc / gamma", "yc gamma", "xhat"),
    ),
    # Recomputation (checkpointing): the statistics again, from x.
    "x": _FORWARD[:6],
}


def _check_choice(value, name: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}.")
    return value


def numpy_program(
    direction: str, saved: str = "xhat_rstd", *, upcast: bool = False
) -> tuple[Step, ...]:
    r"""List the op-by-op NumPy program whose traffic ``"numpy"`` counts.

    Parameters
    ----------
    direction : {"forward", "backward"}
    saved : {"xhat_rstd", "x_mean_rstd", "y_rstd", "x"}, default "xhat_rstd"
        The backward first recovers ``xhat`` from it; the forward's steps
        do not depend on it.
    upcast : bool, default False
        Convert every full-size input to a working dtype first and every
        full-size output back at the end, as :func:`lnorm.backward` with
        ``block_rows=`` does on each block of float16 or float32 input.

    Returns
    -------
    tuple of Step
        In program order.

    Examples
    --------
    >>> [st.code for st in numpy_program("backward", "x_mean_rstd")][:3]
    ['xc = x - mean', 'xhat = xc * rstd', 'g = dy * gamma']
    >>> steps = numpy_program("backward", upcast=True)
    >>> steps[0].code, steps[-1].code
    ('dy_w = dy.astype(work)', 'dx = dx_w.astype(dtype)')
    """
    direction = _check_choice(direction, "direction", DIRECTIONS)
    saved = _check_choice(saved, "saved", SAVED)
    body = _FORWARD if direction == "forward" else _RECOVER[saved] + _BACKWARD
    if not upcast:
        return body
    inputs, outputs = _IO[(direction, saved)]
    full_in = [n for n in inputs if n not in _ROW | _PARAM]
    full_out = [n for n in outputs if n not in _ROW | _PARAM]
    rename = {n: n + "_w" for n in full_in + full_out}
    pattern = re.compile(r"\b(" + "|".join(rename) + r")\b")
    renamed = tuple(
        Step(
            pattern.sub(lambda m: rename[m.group(1)], st.code),
            tuple(rename.get(n, n) for n in st.reads),
            tuple(rename.get(n, n) for n in st.writes),
            st.flops_full,
            st.flops_row,
        )
        for st in body
    )
    to_work = tuple(
        Step(f"{n}_w = {n}.astype(work)", (n,), (n + "_w",), 0) for n in full_in
    )
    to_out = tuple(
        Step(f"{n} = {n}_w.astype(dtype)", (n + "_w",), (n,), 0) for n in full_out
    )
    return to_work + renamed + to_out


@dataclass(frozen=True)
class Traffic:
    r"""FLOPs and memory bytes of one layer-norm pass, as :func:`traffic` counts them.

    Attributes
    ----------
    flops : int
    bytes_read, bytes_written : int
        Bytes read from and written to main memory.
    passes : int
        Full-size tensors read or written, one pass each.
    rows, D : int
        The problem size.
    bytes_allocated : int
        Write-allocate reads (zero without ``write_allocate=True``).
    bytes_cached : int
        Every load and store the program issues, cache hits included, plus
        ``bytes_allocated``; op by op it equals the main-memory bytes.

    Examples
    --------
    >>> t = traffic("forward", "fused", rows=2, D=4, itemsize=4)
    >>> t.bytes_read, t.bytes_written, t.bytes, t.passes
    (64, 72, 136, 3)
    """

    flops: int
    bytes_read: int
    bytes_written: int
    passes: int
    rows: int = 0
    D: int = 0
    bytes_allocated: int = 0
    bytes_cached: int = 0

    @property
    def bytes(self) -> int:
        r"""Bytes to and from main memory: read, written and write-allocated.

        Examples
        --------
        >>> traffic("backward", "fused", rows=2, D=4, itemsize=4).bytes
        152
        """
        return self.bytes_read + self.bytes_written + self.bytes_allocated

    def per_element(self) -> float:
        r"""Bytes moved per element of the input; ``ValueError`` at no elements.

        Examples
        --------
        >>> traffic("backward", "numpy", rows=1024, D=1024, itemsize=4).per_element()
        72.03515625
        """
        n = self.rows * self.D
        if n == 0:
            raise ValueError(
                "per_element needs rows * D > 0; this Traffic has "
                f"rows={self.rows}, D={self.D}. Build it with lnorm.cost.traffic(...)."
            )
        return self.bytes / n

    @property
    def arithmetic_intensity(self) -> float:
        r"""FLOPs per byte of main memory (``nan`` when nothing moves).

        Examples
        --------
        >>> t = traffic("backward", "fused", rows=1024, D=1024, itemsize=4)
        >>> round(t.arithmetic_intensity, 2)
        0.92
        """
        return self.flops / self.bytes if self.bytes else math.nan


def traffic(
    direction: str,
    schedule: str,
    *,
    rows: int,
    D: int,
    itemsize: int,
    saved: str = "xhat_rstd",
    stat_itemsize: int = 4,
    work_itemsize: int | None = None,
    block_rows: int | None = None,
    write_allocate: bool = False,
    mean_parts: int = 1,
) -> Traffic:
    r"""Count the FLOPs and bytes of the forward or backward under one schedule.

    Parameters
    ----------
    direction : {"forward", "backward"}
    schedule : {"numpy", "tiled", "fused"}
    rows, D : int
        Number of rows (all leading positions, ``B * T``) and row length.
    itemsize : int
        Bytes per element of the input (4 for float32).
    saved : {"xhat_rstd", "x_mean_rstd", "y_rstd", "x"}, default "xhat_rstd"
    stat_itemsize : int, default 4
        Bytes per element of a per-row statistic.
    work_itemsize : int, optional
        Compute in a working dtype of this size: op by op, every input is
        converted first and every output last, in main memory; tiled, block
        by block in cache; fused, a loop that cannot read the input dtype
        converts full-size copies before and after it. Nothing is counted
        where it equals ``itemsize``.
    block_rows : int, optional
        ``"tiled"`` only: rows per block (default: one block).
    write_allocate : bool, default False
        Count the CPU's write-allocate reads.
    mean_parts : int, default 1
        ``saved="x_mean_rstd"`` only: the mean is saved in this many per-row
        pieces (2 for the GPU kernels' ``mean_hi`` and ``mean_lo``).

    Returns
    -------
    Traffic

    Examples
    --------
    >>> kw = dict(rows=1024, D=1024, itemsize=4)
    >>> op_by_op = traffic("backward", "numpy", **kw)
    >>> fused = traffic("backward", "fused", **kw)
    >>> op_by_op.passes, fused.passes, op_by_op.flops == fused.flops
    (18, 3, True)
    >>> wa = traffic("backward", "fused", write_allocate=True, **kw)
    >>> wa.bytes_allocated == 1024 * 1024 * 4  # dx read once before it is written
    True
    >>> gpu = dict(saved="x_mean_rstd", mean_parts=2, **kw)  # mean_hi, mean_lo
    >>> traffic("forward", "fused", **gpu).bytes_written // kw["rows"]
    4108
    """
    direction = _check_choice(direction, "direction", DIRECTIONS)
    schedule = _check_choice(schedule, "schedule", SCHEDULES)
    saved = _check_choice(saved, "saved", SAVED)
    rows = check_int(rows, "rows", 0)
    D = check_int(D, "D", 1)
    itemsize = check_int(itemsize, "itemsize", 1)
    stat_itemsize = check_int(stat_itemsize, "stat_itemsize", 1)
    if work_itemsize is not None:
        work_itemsize = check_int(work_itemsize, "work_itemsize", 1)
    if block_rows is not None:
        if schedule != "tiled":
            raise ValueError(
                "block_rows applies to schedule='tiled' only; leave it None."
            )
        block_rows = check_int(block_rows, "block_rows", 1)
    mean_parts = _check_mean_parts(mean_parts, saved)

    n = rows * D
    upcast = work_itemsize is not None and work_itemsize != itemsize
    inputs, outputs = _IO[(direction, saved)]
    program = numpy_program(direction, saved, upcast=upcast and schedule != "fused")
    flops = sum(st.flops_full * n + st.flops_row * rows for st in program)

    def size(name: str) -> int:
        if name == "mean":
            return mean_parts * rows * stat_itemsize
        if name in _ROW:
            return rows * stat_itemsize
        if name in _PARAM:
            return D * itemsize
        if upcast and (name.endswith("_w") or name not in inputs + outputs):
            return n * work_itemsize
        return n * itemsize

    def is_full(name: str) -> bool:
        return name not in _ROW and name not in _PARAM

    # What the program issues, cache hits or not: the op-by-op step list.
    step_reads = [nm for st in program for nm in st.reads]
    step_writes = [nm for st in program for nm in st.writes]
    step_bytes = sum(size(nm) for nm in step_reads + step_writes)

    wide_writes = 0  # full-size float copies at work_itemsize (fused, upcast)
    if schedule == "numpy":
        bytes_read = sum(size(nm) for nm in step_reads)
        bytes_written = sum(size(nm) for nm in step_writes)
        passes = sum(is_full(nm) for nm in step_reads + step_writes)
        full_writes = [nm for nm in step_writes if is_full(nm)]
        cached = bytes_read + bytes_written
    else:
        bytes_read = sum(n * itemsize if is_full(nm) else size(nm) for nm in inputs)
        bytes_written = sum(n * itemsize if is_full(nm) else size(nm) for nm in outputs)
        passes = sum(is_full(nm) for nm in inputs + outputs)
        full_writes = [nm for nm in outputs if is_full(nm)]
        if schedule == "tiled":
            cached = step_bytes
            if rows > 0:
                extra_blocks = -(-rows // (block_rows or rows)) - 1
                # Every further block re-reads the parameter vectors; the backward
                # also reads and rewrites its dgamma and dbeta partial sums.
                params_in = [nm for nm in inputs if nm in _PARAM]
                params_out = [nm for nm in outputs if nm in _PARAM]
                n_params = len(params_in) + len(params_out)
                bytes_read += extra_blocks * D * itemsize * n_params
                bytes_written += extra_blocks * D * itemsize * len(params_out)
        else:
            loop_itemsize = work_itemsize if upcast else itemsize
            cached = _fused_loop_bytes(direction, rows, D, loop_itemsize)
            if upcast:
                # Converted copies: each full-size input read, written wide, read
                # by the loop; each output written wide, read, written narrow.
                full_in = [nm for nm in inputs if is_full(nm)]
                conversions = len(full_in) + len(full_writes)
                wide = n * work_itemsize
                bytes_read += conversions * wide
                bytes_written += conversions * wide
                passes += 2 * conversions
                cached += conversions * (n * itemsize + wide)
                # The wide copies (of the inputs and of the outputs) are
                # written too, at the working itemsize.
                wide_writes = conversions
    allocated = 0
    if write_allocate:
        # One read of every full-size tensor a plain store writes to memory.
        allocated = sum(
            size(nm) if schedule == "numpy" else n * itemsize for nm in full_writes
        ) + (wide_writes * n * work_itemsize if wide_writes else 0)
        cached += allocated
    return Traffic(flops, bytes_read, bytes_written, passes, rows, D, allocated, cached)


def _fused_loop_bytes(direction: str, rows: int, D: int, itemsize: int) -> int:
    """Loads and stores of the modelled fused loop (the module docstring's)."""
    # forward: x read by each sweep, y and xhat written, gamma and beta read;
    # backward: dy, xhat and gamma read by each sweep, dx written, and the
    # column sums of dgamma and dbeta read and written by the first sweep.
    n = rows * D
    sweeps = LOOP_SWEEPS[direction]
    if direction == "forward":
        return n * ((sweeps + 2) * itemsize + 2 * LOOP_ITEMSIZE)
    return n * ((2 * sweeps + 1) * itemsize
                + (sweeps + 2 * 2) * LOOP_ITEMSIZE)


def _check_mean_parts(mean_parts, saved: str) -> int:
    mean_parts = check_int(mean_parts, "mean_parts", 1)
    if mean_parts != 1 and saved != "x_mean_rstd":
        raise ValueError(
            "mean_parts counts the pieces of a saved mean; it applies to "
            f"saved='x_mean_rstd' only, not {saved!r}. Leave it 1."
        )
    return mean_parts


def cache_bytes(
    saved: str,
    *,
    rows: int,
    D: int,
    itemsize: int,
    stat_itemsize: int = 4,
    kept_alive: Collection[str] = (),
    mean_parts: int = 1,
) -> int:
    r"""Count the bytes the forward's cache holds until the backward runs.

    Parameters
    ----------
    saved, rows, D, itemsize, stat_itemsize, mean_parts
        As in :func:`traffic`.
    kept_alive : collection of {"x", "y"}, default ()
        Full-size tensors alive until the backward anyway (``y`` when the
        next layer saves its input, ``x`` under an activation checkpoint):
        they cost the cache nothing.

    Returns
    -------
    int
        The saved activation (unless kept alive) and statistics; the
        parameters belong to the layer and are not counted.

    Examples
    --------
    >>> [cache_bytes(s, rows=2, D=4, itemsize=4) for s in SAVED]
    [40, 48, 40, 32]
    >>> cache_bytes("x_mean_rstd", rows=2, D=4, itemsize=4, kept_alive={"x"})
    16
    >>> cache_bytes("x_mean_rstd", rows=2, D=4, itemsize=4, kept_alive={"x"},
    ...             mean_parts=2)  # mean_hi, mean_lo and rstd
    24
    """
    saved = _check_choice(saved, "saved", SAVED)
    rows = check_int(rows, "rows", 0)
    D = check_int(D, "D", 1)
    itemsize = check_int(itemsize, "itemsize", 1)
    stat_itemsize = check_int(stat_itemsize, "stat_itemsize", 1)
    mean_parts = _check_mean_parts(mean_parts, saved)
    unknown = set(kept_alive) - {"x", "y"}
    if unknown:
        raise ValueError(
            f"kept_alive may name 'x' and 'y' only; got {sorted(unknown)}."
        )
    activations = {"xhat_rstd": "xhat", "x_mean_rstd": "x", "y_rstd": "y", "x": "x"}
    activation = activations[saved]
    n_stats = {"xhat_rstd": 1, "x_mean_rstd": 1 + mean_parts, "y_rstd": 1,
               "x": 0}[saved]
    held = 0 if activation in kept_alive else rows * D * itemsize
    return held + n_stats * rows * stat_itemsize
