r"""A time model of the fused kernels: bytes over bandwidth, plus Little's law.

A memory-bound kernel runs at the bandwidth of DRAM only if enough bytes are
*in flight*: bytes in flight = bandwidth x latency (Little's law). The
kernels work row by row. A row group (a warp or a block) issues the loads of
its row, waits for them, reduces, writes, and only then starts the next row:
per row it exposes the latency once. One step of a row group costs::

    t_row = C * b_row / B + L

where ``C`` groups run at once on the whole GPU (limited by registers,
threads, shared memory and the grid), ``b_row`` is the bytes one row moves
(the partial sums' writes included), ``B`` the copy bandwidth and ``L`` the
exposed latency: the memory latency plus the row sums (three in the forward,
one in the backward). The kernel takes ``ceil(groups / C) * rows_per_group``
steps. With the loads of ``k`` rows in flight (v5), a group issues row
``r + k - 1`` before it waits for row ``r``, and a step costs::

    t_row = max(C * b_row / B, (C * b_row / B + L) / k)

plus one ``L`` per strip to fill the pipeline. v4's rows past ``max_D()`` are
read again for every pass: the forward's re-reads come from L2 while the
rows in flight fit there, the backward's (a whole strip later) from DRAM.
The backward's second stage reads the partial sums once.

The registers and static shared memory of each kernel, which set ``C``, are
``ptxas -v``'s (:func:`lnorm.gpu.ptx.ptxas_usage`, from the pinned
``nvidia-cuda-nvcc-cu12``). The device's constants are in :data:`H100`, each
labelled as measured or assumed. The bytes are those of the cost chapter
(:func:`lnorm.cost.traffic`, the fused schedule).

Examples
--------
>>> fwd = predict("forward", 8192, 4096, "float16")
>>> fwd.steps, fwd.time > fwd.bytes / H100.bandwidth
(11, True)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..cost import traffic
from .kernels import KERNEL_FILES, compile_ptx, kernel_params, plan

__all__ = ["H100", "Device", "Prediction", "predict", "occupancy", "kernel_usage"]


@dataclass(frozen=True)
class Device:
    r"""What the model needs of a GPU (seconds, bytes, bytes per second).

    ``bandwidth`` is what a device-to-device copy reaches (read plus write);
    ``latency`` the DRAM latency one row step exposes; ``block_reduction``
    and ``warp_reduction`` one row sum over a block or a warp; the others
    are the SM's limits (CUDA's occupancy rules), the launch overhead, and
    the L2 cache with its latency.

    Examples
    --------
    >>> H100.sm_count, H100.registers_per_sm
    (132, 65536)
    """

    name: str
    sm_count: int
    bandwidth: float
    latency: float
    block_reduction: float
    warp_reduction: float
    registers_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    launch_overhead: float = 2e-6
    l2_bytes: int = 50 * 2**20
    l2_latency: float = 0.3e-6
    shared_per_sm: int = 228 * 1024
    shared_reserved: int = 1024


#: An H100 SXM. Facts of the part: 132 SMs, 50 MiB of L2, and the SM's limits
#: (65536 registers, 2048 threads, 32 blocks, 228 KiB of shared memory, 1 KiB
#: reserved a block), from NVIDIA's CUDA occupancy rules for sm_90. Measured:
#: 3.0 TB/s, the 1 GiB device-to-device copy that ``python -m
#: lnorm.gpu.measure`` times as its yardstick (the HBM3's rated 3.35 TB/s is
#: not reached by a copy). Assumed, not measured: 0.6 us of DRAM latency under
#: load, 0.3 us of L2 latency, 0.25 us a row sum over a block, 0.05 us over a
#: warp, 2 us a launch.
H100 = Device("H100 SXM (model)", sm_count=132, bandwidth=3.0e12, latency=0.6e-6,
              block_reduction=0.25e-6, warp_reduction=0.05e-6)


@functools.cache
def _usage(filename: str, arch: str) -> dict:
    from .ptx import ptxas_usage

    return ptxas_usage(compile_ptx(filename, arch), arch)


def kernel_usage(kernel: str, arch: str = "sm_90"):
    """Return ``ptxas -v``'s registers, spills and shared memory of one kernel."""
    for filename in KERNEL_FILES:
        if kernel in kernel_params(filename):
            return _usage(filename, arch)[kernel]
    raise ValueError(f"kernel must be one of the kernels of {KERNEL_FILES}; "
                     f"got {kernel!r}.")


def occupancy(threads_per_block: int, registers: int, device: Device = H100,
              shared: int = 0) -> int:
    """Count the blocks of ``threads_per_block`` threads that fit on one SM at once."""
    warps = math.ceil(threads_per_block / 32)
    regs_per_warp = math.ceil(registers * 32 / 256) * 256
    by_registers = device.registers_per_sm // (regs_per_warp * warps)
    by_threads = device.max_threads_per_sm // (32 * warps)
    by_shared = device.shared_per_sm // (shared + device.shared_reserved)
    return max(0, min(by_registers, by_threads, by_shared, device.max_blocks_per_sm))


@dataclass(frozen=True)
class Prediction:
    r"""The model's time for one pass (the backward with its second stage) at one shape.

    ``bytes`` is what the op must move (:func:`lnorm.cost.traffic`);
    ``bytes_moved`` what the kernels move through DRAM: that, the partial
    sums (written and read), and the long-row re-reads that L2 does not hold.
    ``concurrent_groups`` is ``C``, ``steps`` the row steps of one group,
    ``time`` seconds, ``blocks_per_sm`` the main kernel's resident blocks.
    """

    direction: str
    rows: int
    D: int
    dtype: str
    bytes: int
    bytes_moved: int
    concurrent_groups: int
    steps: int
    time: float
    blocks_per_sm: int

    @property
    def bandwidth(self) -> float:
        """The bytes the op must move per second, ``bytes / time``."""
        return self.bytes / self.time

    def share(self, device: Device = H100) -> float:
        r"""Return the fraction of the copy bandwidth, ``bandwidth / device.bandwidth``.

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
        Registers a thread of the main kernel; default ``ptxas -v``'s
        (:func:`kernel_usage`).
    rows_in_flight : int, optional
        ``k``; default what the kernel does
        (:meth:`lnorm.gpu.kernels.LaunchPlan.rows_in_flight`). Other values
        model designs not built.
    rung : {"v4", "v3", "v5"}, default "v4"
        The kernels. v3 adds its column sums by atomics (in L2): no partial
        sums, no second stage, nothing charged for the atomics.
    rows_per_group : int, optional
        The backward's strip, if not the plan's.

    Raises
    ------
    ValueError, TypeError
        What :func:`lnorm.gpu.kernels.plan` or
        :meth:`lnorm.gpu.kernels.LaunchPlan.with_strip` refuses;
        ``rows_per_group`` with the forward; a block that does not fit an SM.

    Examples
    --------
    >>> fwd = predict("forward", 8192, 4096, "float16")
    >>> fwd.bytes, fwd.concurrent_groups, fwd.steps
    (134332416, 792, 11)
    >>> predict("forward", 8192, 4096, "float16", rows_in_flight=2).time < fwd.time
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
    if rows_per_group is not None:
        p = p.with_strip(rows_per_group)
    itemsize = p.dtype.itemsize
    usage = kernel_usage(p.kernel(direction))
    regs = registers or usage.registers
    must = traffic(direction, "fused", rows=rows, D=D, itemsize=itemsize,
                   saved="x_mean_rstd", mean_parts=2).bytes
    if direction == "forward" and not p.forward_rows_per_group:  # a row a group
        groups, per_group = rows, 1
        per_block, block = (1 if p.per_block else 4), p.block
        shared = 0
    else:  # strips of rows, v5's groups in a block
        per_group = (p.forward_rows_per_group if direction == "forward"
                     else p.rows_per_group)
        groups = math.ceil(rows / per_group)
        per_block, block = p.groups_per_block, p.backward_block or p.block
        shared = (p.forward_shared_bytes if direction == "forward"
                  else p.backward_shared_bytes)
    shared += usage.shared_bytes
    if rows_in_flight is None:
        rows_in_flight = p.rows_in_flight(direction)
    blocks_per_sm = occupancy(block, regs, device, shared)
    if blocks_per_sm == 0:
        raise ValueError(
            f"a block of {block} threads with {regs} registers each and {shared} "
            f"bytes of shared memory does not fit on one SM of {device.name}."
        )
    concurrent = min(groups, blocks_per_sm * per_block * device.sm_count)
    latency = device.latency
    past_l2 = 0  # bytes of re-reads that L2 does not hold
    rereads = p.chunks > 1 and p.rung != "v5"  # v5 reads a long row from DRAM once
    if rereads and direction == "forward":  # four passes over each row
        row_bytes = D * itemsize
        in_l2 = (2 * concurrent + 2) * row_bytes <= device.l2_bytes
        past_l2 = 0 if in_l2 else rows * 3 * row_bytes
        latency = p.chunks * (latency + 3 * (device.l2_latency if in_l2
                                             else device.latency))
    elif rereads:  # the backward: x and dy of a whole strip, twice
        past_l2 = rows * 2 * D * itemsize
        latency = 2 * p.chunks * latency
    partials = p.partials_bytes if direction == "backward" else 0
    # The main kernel writes the partial sums (half their bytes), the second
    # stage reads them (the other half).
    b_row = (must + past_l2 + partials / 2) / max(rows, 1)
    reduction = device.block_reduction if p.per_block else device.warp_reduction
    exposed = latency + (3 if direction == "forward" else 1) * reduction
    t_bytes = concurrent * b_row / device.bandwidth
    t_step = max(t_bytes, (t_bytes + exposed) / rows_in_flight)
    waves = math.ceil(groups / concurrent) if rows else 0
    fill = device.latency if rows_in_flight > 1 else 0.0  # a strip's first row
    time = waves * (per_group * t_step + fill) + device.launch_overhead
    if partials:  # second stage: read the partial sums once, at copy speed
        time += (partials / 2 / device.bandwidth + device.latency
                 + device.launch_overhead)
    return Prediction(direction, rows, D, str(np.dtype(dtype)), must,
                      must + partials + past_l2, concurrent, waves * per_group,
                      time, blocks_per_sm)
