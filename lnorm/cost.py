r"""A model of the work and the memory traffic of layer normalization.

Layer normalization does a handful of floating-point operations per element
and moves every element through memory at least twice (read the input, write
the output), so on a CPU or a GPU its time is set by **bytes moved**, not by
FLOPs. This module counts both, for the forward and the backward, under three
schedules of the same arithmetic:

``"numpy"``
    Op by op, as straightforward NumPy runs it: every operator reads its
    operands from memory and writes a new full-size temporary. The program is
    spelled out step by step in :func:`numpy_program`; its steps are the
    lines of :func:`lnorm.core.forward_formula` and
    :func:`lnorm.core.backward_formula`, word for word (a test checks it).
``"tiled"``
    The same steps, applied to a block of ``block_rows`` rows at a time, with
    the block's temporaries small enough to stay in cache. Main memory sees
    each input read once and each output written once; the per-block
    overhead is re-reading the parameter vectors and accumulating the
    ``dgamma``/``dbeta`` partial sums once per block.
``"fused"``
    One loop (CPU) or one kernel (GPU): each input read once, each output
    written once, the rest in registers and the caches. Through the caches
    the model counts a loop of its own, taken a row at a time: the forward
    sweeps a row three times (sum, squared deviations, outputs), the
    backward twice (its row sums with the column sums of ``dgamma`` and
    ``dbeta``, then ``dx``), with ``gamma``, ``beta`` and the column sums
    in float64. A real loop may move less through its caches (one that
    adds a few rows' products before it touches the column sums does); the
    main-memory bytes are the same.

Two levels
----------
Every :class:`Traffic` has the bytes to and from **main memory**
(``bytes_read``, ``bytes_written``) and the bytes of every load and store
the program issues, **cache hits included** (``bytes_cached``), plus the
write-allocate reads when they are counted (below), since those lines come
into the caches too. Op by op the two are equal. Tiled, main memory sees
what the fused loop sees, but the caches still carry the whole op-by-op
program: that traffic moves at the caches' bandwidth instead of main
memory's, and it is part of what a tiled NumPy schedule spends its time on.

Write-allocate
--------------
On a CPU, a plain store to a line that is not in cache first reads the line
(write-allocate), so each full-size output costs a read as well as a write
(``write_allocate=True``, counted in ``bytes_allocated`` and in
``bytes_cached``). Streaming (non-temporal) stores and GPU stores of whole
sectors write without reading; the GPU chapter counts without it.

The floor
---------
The fused schedule's bytes divided by a copy bandwidth is the floor that
:mod:`lnorm.bench` measures against: one core copying with ``np.copyto``.
The floor's bytes count no write-allocate read, and no second core is in
it. Threads can beat it: two cores can move more bytes per second than one.

Sizes: a full-size tensor has ``rows * D`` elements of ``itemsize`` bytes (a
temporary of the op-by-op program has ``work_itemsize`` bytes if one is
given); a per-row statistic (``mean``, ``rstd``) has ``rows`` elements of
``stat_itemsize`` bytes, and a mean saved in ``mean_parts`` pieces counts
that many per-row statistics; a parameter-sized vector (``gamma``, ``beta``,
``dgamma``, ``dbeta``) has ``D`` elements of ``itemsize`` bytes.

FLOPs count each add, subtract, multiply, divide and square root as one,
a sum over ``k`` numbers as ``k`` (one add per element, the initial load
included), and a matrix-vector product over ``k`` entries as ``2 k``. The
arithmetic does not depend on the schedule: fusion saves bytes, not FLOPs.

What the backward needs saved (``saved``)
------------------------------------------
``"xhat_rstd"``
    ``xhat`` (full size) and ``rstd`` (per row): what :func:`lnorm.forward`
    keeps. The forward writes ``xhat`` as a second full-size output.
``"x_mean_rstd"``
    ``x`` with ``mean`` and ``rstd``; the backward recomputes
    ``xhat = (x - mean) * rstd``. This is what PyTorch's layer norm saves
    (``tools/autograd/derivatives.yaml``: its backward takes the input,
    the mean and rstd). The GPU kernels of the GPU chapter save the mean
    in two pieces, ``mean_hi`` and its correction ``mean_lo``: three per-row
    statistics in all (``mean_parts=2``).
    Nothing else in a transformer block saves ``x`` (the residual
    addition's backward needs no input), so it holds a whole activation, as
    ``xhat`` does, unless something else keeps ``x`` until the backward (an
    activation checkpoint at the block's input); the forward writes only
    ``y``.
``"y_rstd"``
    ``y`` with ``rstd``; the backward recovers ``xhat = (y - beta) / gamma``.
    ``y`` is the next layer's input, which that layer (a Linear) saves for
    its own backward anyway. This is Apex's ``memory_efficient=True``
    (NVIDIA/apex 25.09, ``apex/normalization/fused_layer_norm.py`` saves
    ``output``; ``csrc/layer_norm_cuda_kernel.cu`` divides by
    ``clamp_by_magnitude(gamma, eps)``). The clamp keeps the sign of
    ``gamma`` and raises ``|gamma|`` to at least ``eps`` (``+eps`` at zero),
    so where ``|gamma|`` is smaller the recovered ``xhat`` is silently wrong
    (at ``gamma = 0``: zero instead of NaN; see :func:`cache_bytes`).
``"x"``
    Nothing but ``x``: the backward recomputes the statistics and ``xhat``
    from it (recomputation, or
    checkpointing, as in Chen et al., 2016). The forward writes only ``y``;
    the backward pays the forward's statistics again, FLOPs but, fused, no
    extra bytes beyond reading ``x`` instead of ``xhat``.

The cost chapter (``book/05_cost.md``) builds this model step by step and
sets it against measured times.

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
        The expression, as NumPy code (a line of
        :func:`lnorm.core.forward_formula` or
        :func:`lnorm.core.backward_formula`, or a recovery or conversion step).
    reads, writes : tuple of str
        Tensor names it reads from and writes to memory. An operand used twice
        in one expression (``xc * xc``) is read once.
    flops_full : int, default 1
        FLOPs per element of a full-size tensor.
    flops_row : int, default 0
        FLOPs per row.

    See Also
    --------
    numpy_program : The steps of a whole pass.

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
    r"""List the op-by-op NumPy program whose traffic the ``"numpy"`` schedule counts.

    One :class:`Step` per line (per NumPy expression): the lines of
    :func:`lnorm.core.forward_formula` for the forward; for the backward the
    steps that recover ``xhat`` from what was saved, then the lines of
    :func:`lnorm.core.backward_formula`.

    Parameters
    ----------
    direction : {"forward", "backward"}
        Which pass.
    saved : {"xhat_rstd", "x_mean_rstd", "y_rstd", "x"}, default "xhat_rstd"
        What the forward saved; the backward first recovers ``xhat`` from it.
        The forward's op-by-op traffic does not depend on it (``xhat`` is a
        temporary of the forward either way; only what is kept alive differs).
    upcast : bool, default False
        Convert every full-size input to a working dtype first and every
        full-size output back at the end (``a.astype(...)``). With the
        float64 working dtype this is what :func:`lnorm.backward` with
        ``block_rows=`` runs on each block of float16 or float32 input;
        :func:`lnorm.forward` with ``block_rows=`` differs in detail (it also
        clamps the mean to the row's range and forms the variance with
        ``einsum``).

    Returns
    -------
    tuple of Step
        In program order.

    Raises
    ------
    ValueError
        An unknown ``direction`` or ``saved``.

    See Also
    --------
    traffic : Counts the bytes and FLOPs of these steps.

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
        Floating-point operations.
    bytes_read, bytes_written : int
        Bytes read from and written to main memory.
    passes : int
        Full passes over ``(rows, D)``-sized tensors: each full-size tensor
        read or written once counts one.
    rows, D : int
        The problem size the counts are for (used by :meth:`per_element`).
    bytes_allocated : int
        With ``write_allocate=True``: the lines a plain store to memory that
        is not in cache reads before it writes them (one extra read of every
        full-size tensor written to main memory: the outputs, and op by op
        every temporary too). Zero with ``write_allocate=False`` (GPU
        counts, streaming stores).
    bytes_cached : int
        The second level of the model: bytes of every load and store the
        program issues, served by the caches or not, plus
        ``bytes_allocated`` (a write-allocate read passes through the caches
        too). For the op-by-op schedule it equals the main-memory traffic
        (every temporary streams through memory); for the tiled and fused
        schedules it is far larger than it.

    See Also
    --------
    traffic : Builds it.

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
        r"""Bytes moved to and from main memory: read, written and write-allocated.

        Returns
        -------
        int
            ``bytes_read + bytes_written + bytes_allocated``.

        See Also
        --------
        per_element : The same per element of the input.

        Examples
        --------
        >>> traffic("backward", "fused", rows=2, D=4, itemsize=4).bytes
        152
        """
        return self.bytes_read + self.bytes_written + self.bytes_allocated

    def per_element(self) -> float:
        r"""Bytes moved per element of the ``(rows, D)`` input.

        Returns
        -------
        float
            ``bytes / (rows * D)``.

        Raises
        ------
        ValueError
            ``rows * D == 0`` (a Traffic built by hand, or zero rows).

        See Also
        --------
        bytes : The total.

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
        r"""FLOPs per byte moved (``nan`` when nothing moves).

        The roofline's abscissa: far below a machine's FLOPs per byte of
        bandwidth, the pass is memory-bound.

        Returns
        -------
        float
            ``flops / bytes``.

        See Also
        --------
        bytes : The denominator.

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
        Which pass.
    schedule : {"numpy", "tiled", "fused"}
        See the module docstring.
    rows, D : int
        Number of rows (all leading positions, ``B * T``) and row length.
    itemsize : int
        Bytes per element of the input (4 for float32).
    saved : {"xhat_rstd", "x_mean_rstd", "y_rstd", "x"}, default "xhat_rstd"
        What the forward saves for the backward.
    stat_itemsize : int, default 4
        Bytes per element of the per-row statistics (``lnorm.core`` keeps
        ``rstd`` in float64: 8).
    work_itemsize : int, optional
        Compute in a working dtype of this size. ``"numpy"``: every input is
        converted first and every output last, in main memory. ``"tiled"``:
        the same conversions, block by block in cache (they show in
        ``bytes_cached``). ``"fused"``: a loop that cannot read the input
        dtype converts full-size inputs to a copy before the loop and
        outputs back after it, in main memory (a loop that reads the
        input dtype needs none).
        Default: the input dtype. Nothing is counted where it equals
        ``itemsize``.
    block_rows : int, optional
        ``"tiled"`` schedule only: rows per block (default: all rows, one block).
    write_allocate : bool, default False
        Count the CPU's write-allocate: a plain store to a line that is not
        in cache reads the line first, so every full-size tensor written to
        main memory is also read once (``bytes_allocated``). GPUs and
        streaming stores write without reading; leave it False for them.
    mean_parts : int, default 1
        ``saved="x_mean_rstd"`` only: the mean is saved in this many per-row
        pieces (2 for the GPU kernels' ``mean_hi`` and ``mean_lo``).

    Returns
    -------
    Traffic
        FLOPs, main-memory bytes, passes and cached bytes.

    Raises
    ------
    TypeError
        A size that is not an integer.
    ValueError
        An unknown ``direction``, ``schedule`` or ``saved``; ``rows < 0``;
        ``D``, ``itemsize``, ``stat_itemsize``, ``work_itemsize``,
        ``block_rows`` or ``mean_parts`` below 1; ``block_rows`` with a
        schedule other than ``"tiled"``; ``mean_parts`` other than 1 with
        ``saved`` other than ``"x_mean_rstd"``.

    See Also
    --------
    numpy_program : The steps the ``"numpy"`` schedule counts.
    cache_bytes : What the forward keeps for the backward.
    lnorm.bench.floor_bytes : The fused bytes the benchmark measures against.

    Notes
    -----
    For ``rows * D = n`` the three schedules move, to leading order,

    * fused and tiled: ``(inputs + outputs) * n * itemsize`` (3 full-size
      passes for the backward),
    * numpy: one read per operand and one write per temporary of every step
      of :func:`numpy_program` (18 passes for the backward from ``xhat``).

    The FLOPs are the same for all three.

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
    """Loads and stores of the modelled fused loop (the module docstring's).

    forward: ``x`` read by each sweep, ``y`` and ``xhat`` written, ``gamma``
    and ``beta`` read; backward: ``dy`` and ``xhat`` read by each sweep,
    ``dx`` written, ``gamma`` read by each sweep, the column sums of
    ``dgamma`` and ``dbeta`` read and written once per element by the first.
    """
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
    saved : {"xhat_rstd", "x_mean_rstd", "y_rstd", "x"}
        ``xhat`` + ``rstd``; ``x`` + ``mean`` + ``rstd``; ``y`` + ``rstd``;
        ``x`` alone.
    rows, D, itemsize : int
        As in :func:`traffic`.
    stat_itemsize : int, default 4
        As in :func:`traffic`.
    kept_alive : collection of {"x", "y"}, default ()
        Full-size tensors that stay alive until the backward anyway (``y``
        when the next layer saves its input, ``x`` when an activation
        checkpoint holds it); they cost the cache nothing.
    mean_parts : int, default 1
        As in :func:`traffic`.

    Returns
    -------
    int
        ``rows * D * itemsize`` for the saved activation (unless kept alive),
        plus ``rows * stat_itemsize`` per saved statistic. The parameters are
        held by the layer itself and not counted.

    Raises
    ------
    TypeError
        A size that is not an integer.
    ValueError
        An unknown ``saved``, a size out of range, ``mean_parts`` as
        :func:`traffic` refuses it, or ``kept_alive`` naming something
        other than ``"x"`` and ``"y"``.

    See Also
    --------
    traffic : The bytes each choice moves.
    lnorm.cache.LayerNormCache : What :func:`lnorm.forward` keeps
        (``"xhat_rstd"``).

    Notes
    -----
    ``"y_rstd"`` recovers ``xhat = (y - beta) / gamma``. The stored ``y``
    carries a rounding error of about ``u * |y|`` (``u`` the unit roundoff),
    so the recovered ``xhat`` is off by about ``u * |y| / |gamma|``: fine for
    ``gamma`` of order one, useless where ``|gamma|`` is tiny, and undefined
    (0/0) where ``gamma`` is exactly zero, which weight decay and pruning do
    produce. A library offering this variant must keep ``x`` (or ``xhat``)
    for such models.

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
