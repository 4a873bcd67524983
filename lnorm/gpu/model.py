r"""A time model of the fused kernels: bytes, and the latency each row exposes.

A memory-bound kernel runs at the bandwidth of DRAM only if enough bytes are
*in flight*. Little's law says how many: bytes in flight = bandwidth x
latency, about 3.0 TB/s x 0.6 us = 1.8 MB on an H100, some 14 KB per SM. The
kernels here work row by row. A row group (a warp or a block) issues the loads
of its row, waits for them, reduces (shuffles and barriers), writes, and only
then starts the next row: per row it exposes the latency once. So one step
of a row group costs::

    t_row = C * b_row / B + L

where ``C`` groups run at once on the whole GPU (limited by registers,
threads, shared memory and the grid), ``b_row`` is the bytes one row moves,
``B`` the copy bandwidth and ``L`` the exposed latency: the memory latency
plus the row sums (three in the forward, one in the backward).
The kernel takes ``ceil(groups / C) * rows_per_group`` such steps. The first
term is the bytes; the second is what a design that keeps the next row's
loads in flight hides. With the loads of ``k`` rows in flight (v5's backward
prefetches the next row into shared memory: ``k = 2``, more where a warp
holds a row; v5's forward ``k = 3``; one more in float16's clusters of a
tail), a group issues row
``r + k - 1`` before it waits for row ``r``, so the memory is never idle for
lack of requests and a step costs::

    t_row = max(C * b_row / B, (C * b_row / B + L) / k)

bandwidth-bound as soon as the bytes of the ``k - 1`` rows issued ahead cover
the latency; the first row of each strip still waits ``L`` (the fill). For
``k = 1`` both forms are the same.

Rows longer than a block holds in registers (``D > max_D()``) are taken in
``chunks`` and read again for every pass. The forward makes four passes over
a row of ``x``: while the rows (in and out) of the blocks in flight fit in
L2, its re-reads come from L2 at L2 latency and cost no DRAM bytes; beyond,
they are DRAM traffic. The backward reads a strip's ``x`` and ``dy`` twice,
the second time after the whole strip (megabytes): always DRAM traffic.
Each chunk of each pass exposes a latency. For these rows the model is
optimistic: it charges nothing for L2 traffic, and one latency per chunk
although a thread does not keep a whole chunk of loads in flight. v5's
kernels for these rows (up to ``max_D("v5")``) read a row from DRAM once,
into shared memory ahead of use, and the model counts them as the others of
v5; it charges nothing for the backward's second read of the row from
shared memory (up to ``max_D_block()``). Past ``max_D_block()`` v5's row
group is a cluster of ``C`` blocks on ``C`` SMs: ``C`` times the blocks per
group, and every row sum waits for all of them, which costs
``cluster_reduction`` more per sum (the latency of the exchange, not the
wait for the slowest block).

Constants are an H100 SXM's (CUDA occupancy rules for sm_90) and a latency
chosen once, not fitted per shape; ``book/data/gpu/*.json`` holds what a
real H100 (and an H200) measured, and the chapter "One kernel: fused layer
norm on the GPU" sets the two side by side. The bytes are those of the cost chapter
(:func:`lnorm.cost.traffic`, the fused schedule).

Examples
--------
>>> fwd = predict("forward", 8192, 4096, "float16")
>>> fwd.steps, fwd.time > fwd.bytes / H100.bandwidth
(11, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..cost import traffic
from .kernels import BACKWARD_KERNELS, FORWARD_KERNELS, plan

__all__ = ["H100", "REGISTERS", "SCALAR_REGISTERS", "STATIC_SHARED", "Device",
           "Prediction", "predict", "occupancy"]


@dataclass(frozen=True)
class Device:
    r"""Describe what the model needs of a GPU.

    Attributes
    ----------
    name : str
        A label.
    sm_count : int
        Streaming multiprocessors.
    bandwidth : float
        Bytes per second a device-to-device copy reaches (read plus write).
    latency : float
        Seconds of DRAM latency, exposed once per row step.
    block_reduction : float
        Seconds of one row sum over a block (shuffles, two barriers).
    warp_reduction : float
        Seconds of one row sum over a warp (five shuffles).
    registers_per_sm : int, default 65536
        The register file of one SM.
    max_threads_per_sm : int, default 2048
        Resident threads per SM at most.
    max_blocks_per_sm : int, default 32
        Resident blocks per SM at most.
    launch_overhead : float, default 2e-6
        Seconds per kernel launch, back to back.
    l2_bytes : int, default 50 MiB
        The L2 cache.
    l2_latency : float, default 0.3e-6
        Seconds of L2 latency, exposed per chunk of a re-read.
    shared_per_sm : int, default 228 KiB
        Shared memory of one SM.
    shared_reserved : int, default 1 KiB
        Shared memory the system reserves per resident block.
    cluster_reduction : float, default 1e-6
        Seconds one row sum across a cluster of blocks adds to the block's
        own: the writes to the other SMs' shared memory and the latency of a
        barrier over the cluster. Not the wait for the cluster's slowest
        block, which the model has no term for.

    See Also
    --------
    lnorm.gpu.model.H100 : The device the model is set for.
    lnorm.gpu.run.DeviceInfo : What a real device reports.

    Examples
    --------
    >>> from dataclasses import replace
    >>> half = replace(H100, name="half an H100", sm_count=66)
    >>> half.sm_count, half.registers_per_sm
    (66, 65536)
    """

    name: str
    sm_count: int
    bandwidth: float  # bytes/s a device-to-device copy reaches
    latency: float  # s: DRAM latency, exposed once per row step
    block_reduction: float  # s: one row sum over a block (shuffles, two barriers)
    warp_reduction: float  # s: one row sum over a warp (five shuffles)
    registers_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    launch_overhead: float = 2e-6  # s per kernel launch, back to back
    l2_bytes: int = 50 * 2**20
    l2_latency: float = 0.3e-6  # s: exposed per chunk of a re-read from L2
    shared_per_sm: int = 228 * 1024
    shared_reserved: int = 1024  # per resident block
    cluster_reduction: float = 1e-6  # s: a row sum across a cluster's SMs


#: An H100 SXM — 132 SMs, 3.0 TB/s copy bandwidth (as measured on one: the
#: ``copy`` of ``book/data/gpu/h100-*.json``), and, chosen, not measured: 0.6 us
#: DRAM latency under load, 0.25 us per block reduction, 0.05 us per warp one,
#: 1 us more for one across a cluster of blocks.
H100 = Device("H100 SXM (model)", sm_count=132, bandwidth=3.0e12, latency=0.6e-6,
              block_reduction=0.25e-6, warp_reduction=0.05e-6)

#: Registers per thread of the main kernels on sm_90, as ``ptxas -v`` reported
#: them for the float32 variants of 16-byte vectors (``lnorm.gpu.ptx.ptxas_usage``;
#: a test checks them, and the GPU chapter prints every kernel's current values),
#: which the model takes for every variant of 16-byte vectors.
#: ``"fwd"``, ``"bwd"``: the kernels that hold the row in registers;
#: ``"fwd_long"``, ``"bwd_long"``: those of longer rows; ``"bwd_atomic"``,
#: ``"bwd_grouped"``: the backward of v3 and of v5; ``"fwd_grouped"``: the
#: forward of v5; ``"fwd_grouped_long"``, ``"bwd_grouped_long"``: v5's for
#: rows longer than ``max_D()``; ``"fwd_grouped_cluster<C>"``,
#: ``"bwd_grouped_cluster<C>"``: v5's clusters of ``C`` blocks;
#: A name ending in ``"_any"``: v5's kernel of the same family for rows of
#: any D (a tail, ``LaunchPlan.any_d``), float32's but for
#: ``"_long_any"``, which only float16 has; in ``"_odd"``: float16's of odd
#: D (``LaunchPlan.starts_on_2``).
REGISTERS = {"fwd": 40, "bwd": 112, "fwd_long": 38, "bwd_long": 93,
             "bwd_atomic": 109, "bwd_grouped": 122, "fwd_grouped": 59,
             "fwd_grouped_long": 79, "bwd_grouped_long": 120,
             "fwd_grouped_cluster2": 62, "fwd_grouped_cluster4": 61,
             "fwd_grouped_cluster8": 61, "bwd_grouped_cluster2": 117,
             "bwd_grouped_cluster4": 118, "bwd_grouped_cluster8": 120,
             "fwd_grouped_long_any": 86, "bwd_grouped_long_any": 128,
             # of a tail, a block's and a cluster's alike: the forward at its
             # bound (64), the backward at 128
             **{f"{d}_grouped{family}_{loads}": regs
                for d, regs in (("fwd", 64), ("bwd", 128))
                for family in ("", "_cluster2", "_cluster4", "_cluster8")
                for loads in ("any", "odd")}}

#: The same for the variants of scalars (``D`` not a multiple of the vector),
#: which use more: the most of float32 and float16, per kernel family and
#: mapping (``<family>_warp``, ``<family>_block``, ``<family>_long``).
SCALAR_REGISTERS = {"fwd_warp": 64, "fwd_block": 80, "fwd_long": 56,
                    "bwd_warp": 155, "bwd_block": 128, "bwd_long": 128,
                    "bwd_atomic_warp": 158, "bwd_atomic_block": 128,
                    "bwd_grouped_warp": 141, "fwd_grouped_warp": 109}

#: Static shared memory (bytes per block) of v5's backward, as ``ptxas -v``
#: reports it: the hand-over of the column sums, sized for the largest group
#: of the variant, and the row sums' slots. The other kernels' few hundred
#: bytes never limit their occupancy and are left out.
STATIC_SHARED = {"bwd_grouped_block": 33024, "bwd_grouped_warp": 8192}


def occupancy(threads_per_block: int, registers: int, device: Device = H100,
              shared: int = 0) -> int:
    r"""Count the blocks of ``threads_per_block`` threads that fit on one SM at once.

    Registers are allocated per warp in units of 256 (CUDA occupancy rules);
    the answer is the least of what the registers, the threads, the shared
    memory (``shared`` bytes per block, plus what the system reserves) and
    the block limit allow.

    Parameters
    ----------
    threads_per_block : int
        Block size.
    registers : int
        Registers per thread (as ``ptxas -v`` reports them).
    device : Device, default H100
        The SM's limits.
    shared : int, default 0
        Shared memory per block, static and dynamic, in bytes.

    Returns
    -------
    int
        Resident blocks per SM (0 if one block does not fit).

    See Also
    --------
    lnorm.gpu.model.REGISTERS : The kernels' registers per thread.
    lnorm.gpu.ptx.ptxas_usage : Where those numbers come from.

    Examples
    --------
    >>> occupancy(256, REGISTERS["fwd"]), occupancy(256, REGISTERS["bwd"])
    (6, 2)
    >>> occupancy(1024, 255)  # 1024 x 256 registers: more than the SM has
    0
    >>> occupancy(128, 64), occupancy(128, 64, shared=64 * 1024)  # 64 KiB a block
    (8, 3)
    """
    warps = math.ceil(threads_per_block / 32)
    regs_per_warp = math.ceil(registers * 32 / 256) * 256
    by_registers = device.registers_per_sm // (regs_per_warp * warps)
    by_threads = device.max_threads_per_sm // (32 * warps)
    by_shared = device.shared_per_sm // (shared + device.shared_reserved)
    return max(0, min(by_registers, by_threads, by_shared, device.max_blocks_per_sm))


@dataclass(frozen=True)
class Prediction:
    r"""Hold the model's time for one pass at one shape.

    For the backward the time includes the second stage, the reduction of the
    dgamma/dbeta partial sums. Made by :func:`lnorm.gpu.model.predict`.

    Attributes
    ----------
    direction : str
        ``"forward"`` or ``"backward"``.
    rows, D : int
        The shape.
    dtype : str
        ``"float32"`` or ``"float16"``.
    bytes : int
        What the op must move (:func:`lnorm.cost.traffic`, fused schedule).
    bytes_moved : int
        What the kernels move through DRAM: ``bytes`` plus the dgamma/dbeta
        partial sums, plus the long-row kernels' re-reads where they do not
        fit in L2.
    concurrent_groups : int
        Row groups running at once on the whole GPU, ``C``.
    steps : int
        Row steps of one group, ``ceil(groups / C) * rows_per_group``.
    time : float
        Predicted seconds.
    blocks_per_sm : int
        Blocks of the main kernel resident on one SM
        (:func:`lnorm.gpu.model.occupancy`, with its shared memory).

    See Also
    --------
    lnorm.gpu.model.predict : Makes one.

    Examples
    --------
    >>> from lnorm.gpu.kernels import plan
    >>> bwd = predict("backward", 8192, 4096, "float16")
    >>> bwd.bytes_moved - bwd.bytes == plan(8192, 4096, "float16").partials_bytes
    True
    """

    direction: str
    rows: int
    D: int
    dtype: str
    bytes: int  # what the op must move (lnorm.cost.traffic, fused)
    bytes_moved: int  # through DRAM: + the partial sums, + re-reads past L2
    concurrent_groups: int
    steps: int
    time: float
    blocks_per_sm: int

    @property
    def bandwidth(self) -> float:
        r"""Return the bytes the op must move, per second: ``bytes / time``.

        Returns
        -------
        float
            The effective bandwidth, bytes per second.

        See Also
        --------
        lnorm.gpu.model.Prediction.share : As a fraction of the copy's.

        Examples
        --------
        >>> fwd = predict("forward", 8192, 4096, "float16")
        >>> fwd.bandwidth == fwd.bytes / fwd.time
        True
        """
        return self.bytes / self.time

    def share(self, device: Device = H100) -> float:
        r"""Return the fraction of the copy bandwidth: ``bandwidth / device.bandwidth``.

        Parameters
        ----------
        device : Device, default H100
            Whose copy bandwidth is the yardstick.

        Returns
        -------
        float
            Between 0 and 1 for a time the copy bandwidth allows.

        See Also
        --------
        lnorm.gpu.model.Prediction.bandwidth : The numerator.

        Examples
        --------
        >>> round(predict("forward", 8192, 4096, "float16").share(), 2)
        0.69
        """
        return self.bandwidth / device.bandwidth


def predict(direction: str, rows: int, D: int, dtype, *, device: Device = H100,
            registers: int | None = None, rows_in_flight: int | None = None,
            rung: str = "v4", rows_per_group: int | None = None) -> Prediction:
    r"""Predict the time of the fused forward or backward (both kernels) at one shape.

    ``time = steps * max(C * b_row / B, (C * b_row / B + L) / k)``, plus the
    fill (``L`` per wave of strips when ``k > 1``) and the launch overhead, with the
    terms of the module docstring; the backward adds its second stage,
    reading the partial sums once at copy speed (optimistic for v4's
    second stage, whose threads have few loads in flight; v5's has four
    times the threads per column and eight loads in flight each).

    Parameters
    ----------
    direction : {"forward", "backward"}
        Which pass.
    rows, D : int
        The shape, as :func:`lnorm.gpu.kernels.plan` takes it.
    dtype : dtype-like
        float32 or float16.
    device : Device, default H100
        The GPU modelled.
    registers : int, optional
        Registers per thread of the main kernel; default
        :data:`lnorm.gpu.model.REGISTERS` (rows of 16-byte vectors) or
        :data:`lnorm.gpu.model.SCALAR_REGISTERS` (rows of scalars).
    rows_in_flight : int, optional
        Rows whose loads a group keeps outstanding, ``k``. Default: what the
        kernel does (:meth:`lnorm.gpu.kernels.LaunchPlan.rows_in_flight`: 3
        and 2 for v5's forward and backward of 16-byte vectors, 1 for the
        others). Other values model designs not built.
    rung : {"v4", "v3", "v5"}, default "v4"
        The kernels (:data:`lnorm.gpu.kernels.RUNGS`). v3 adds the
        column sums into dgamma and dbeta by atomics (in L2): no partial sums
        through DRAM and no second stage; the model charges nothing for the
        atomics. v5 has its plan's blocks of several row groups and one
        partial row per block; its forward takes strips of its own
        (``forward_rows_per_group``) in the same blocks. v3's forward is
        v4's.
    rows_per_group : int, optional
        The backward's strip (default: the plan's): fewer, longer strips
        write fewer partial sums but leave fewer row groups to run at once.
        The kernels take any strip; the plan picks
        ``max(MIN_ROWS_PER_GROUP, ceil(rows / MAX_ROW_GROUPS))``.

    Returns
    -------
    Prediction
        Bytes, concurrency, steps and time.

    Raises
    ------
    ValueError, TypeError
        A shape, dtype or rung :func:`lnorm.gpu.kernels.plan` refuses;
        ``rows_per_group`` with the forward, below 1, or with a row longer
        than :func:`lnorm.gpu.kernels.max_D` (but for v5); or ``registers``
        (or shared memory) more than one block of the plan can have.

    See Also
    --------
    lnorm.gpu.model.occupancy : Blocks per SM.
    lnorm.cost.traffic : The bytes.

    Examples
    --------
    >>> fwd = predict("forward", 8192, 4096, "float16")
    >>> fwd.bytes, fwd.concurrent_groups, fwd.steps
    (134299648, 792, 11)
    >>> predict("forward", 8192, 4096, "float16", rows_in_flight=2).time < fwd.time
    True
    >>> v5 = predict("backward", 8192, 4096, "float32", rung="v5")  # prefetches
    >>> v5.time == predict("backward", 8192, 4096, "float32", rung="v5",
    ...                    rows_in_flight=2).time
    True
    >>> v3 = predict("backward", 8192, 4096, "float16", rung="v3")
    >>> v4 = predict("backward", 8192, 4096, "float16")
    >>> v3.bytes_moved == v3.bytes, v3.time < v4.time
    (True, True)
    >>> long = predict("backward", 8192, 4096, "float16", rows_per_group=64)
    >>> (long.bytes_moved - long.bytes) / (v4.bytes_moved - v4.bytes)  # 128 strips
    0.25
    """
    if direction == "forward" and rows_per_group is not None:
        raise ValueError(
            f"rows_per_group is the backward's; got rows_per_group={rows_per_group!r} "
            "for the forward."
        )
    p = plan(rows, D, dtype, rung)
    itemsize = p.dtype.itemsize
    short = (FORWARD_KERNELS if direction == "forward" else BACKWARD_KERNELS)[rung]
    mapping = "long" if p.chunks > 1 else "block" if p.per_block else "warp"
    if registers:
        regs = registers
    elif p.vec == 1:
        regs = SCALAR_REGISTERS[f"{short}_{mapping}"]
    else:
        family = (f"_cluster{p.cluster}" if p.cluster > 1
                  else "_long" if p.chunks > 1 else "")
        loads = ("_odd" if p.starts_on_2 else "_any") if p.any_d else ""
        regs = REGISTERS[short + family + loads]
    must = traffic(direction, "fused", rows=rows, D=D, itemsize=itemsize,
                   saved="x_mean_rstd").bytes
    if rows_per_group is not None:
        if (p.chunks > 1 and rung != "v5") or rows_per_group < 1:
            raise ValueError(
                "rows_per_group must be a positive int, for the backward of rows "
                f"up to max_D(); got {rows_per_group!r} (D = {D})."
            )
        p = p.with_strip(rows_per_group)
    if direction == "forward" and rung != "v5":  # a row per group
        groups, per_group, per_block = rows, 1, (1 if p.per_block else 4)
        block = p.block
    else:  # strips of rows, v5's groups in a block (v5's forward: its own strips)
        per_group = (p.forward_rows_per_group if direction == "forward"
                     else p.rows_per_group)
        groups = math.ceil(rows / per_group)
        per_block, block = p.groups_per_block, p.backward_block or p.block
    extra = p.partials_bytes if direction == "backward" else 0
    prefetch = (p.forward_shared_bytes if direction == "forward"
                else p.backward_shared_bytes)
    shared = STATIC_SHARED.get(f"{short}_{mapping}", 0) + prefetch
    if rows_in_flight is None:
        rows_in_flight = p.rows_in_flight(direction)
    blocks_per_sm = occupancy(block, regs, device, shared)
    if blocks_per_sm == 0:
        raise ValueError(
            f"a block of {block} threads with {regs} registers each and {shared} "
            f"bytes of shared memory does not fit on one SM of {device.name}."
        )
    # a cluster's group spans p.cluster blocks (on as many SMs)
    concurrent = min(groups, blocks_per_sm * per_block * device.sm_count
                     // p.cluster)
    latency = device.latency
    past_l2 = 0  # bytes of re-reads that L2 does not hold
    rereads = p.chunks > 1 and rung != "v5"  # v5 reads a long row from DRAM once
    if rereads and direction == "forward":  # four passes over each row
        row_bytes = D * itemsize
        # x and y rows of the blocks in flight, and gamma and beta
        in_l2 = (2 * concurrent + 2) * row_bytes <= device.l2_bytes
        past_l2 = 0 if in_l2 else rows * 3 * row_bytes
        latency = p.chunks * (latency + 3 * (device.l2_latency if in_l2
                                             else device.latency))
    elif rereads:  # the backward: x and dy of a whole strip, twice
        past_l2 = rows * 2 * D * itemsize
        latency = 2 * p.chunks * latency
    extra += past_l2
    b_row = (must + past_l2) / max(rows, 1)
    # The forward makes three row sums per row (mean_hi, mean_lo, variance), the
    # backward one.
    reduction = device.block_reduction if p.per_block else device.warp_reduction
    if p.cluster > 1:
        reduction += device.cluster_reduction
    exposed = latency + (3 if direction == "forward" else 1) * reduction
    t_bytes = concurrent * b_row / device.bandwidth
    t_step = max(t_bytes, (t_bytes + exposed) / rows_in_flight)
    waves = math.ceil(groups / concurrent) if rows else 0
    fill = device.latency if rows_in_flight > 1 else 0.0  # a strip's first row
    time = waves * (per_group * t_step + fill) + device.launch_overhead
    steps = waves * per_group
    if direction == "backward" and p.partial_rows:
        # Second stage: read the partial sums once, at copy speed, plus its latency.
        time += (p.partials_bytes / 2 / device.bandwidth + device.latency
                 + device.launch_overhead)
    return Prediction(direction, rows, D, str(np.dtype(dtype)), must, must + extra,
                      concurrent, steps, time, blocks_per_sm)
