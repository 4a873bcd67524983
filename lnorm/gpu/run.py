"""Run, check and time the kernels on a GPU through CuPy.

Everything here needs a CUDA device; each entry point checks
:func:`lnorm.gpu.available` first and raises ``RuntimeError`` with the
reason when there is none, so nothing is ever launched on a CPU machine.
CuPy is imported inside the functions: importing this module needs no CUDA.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..bench import reference_backward
from ..core import forward_formula
from ..cost import traffic
from .check import make_inputs
from .kernels import (
    KERNEL_FILES,
    check_backward_args,
    check_forward_args,
    compile_binary,
    constants,
    kernel_params,
)

__all__ = [
    "available",
    "FusedLayerNorm",
    "unfused_forward",
    "unfused_backward",
    "cuda_time",
    "DeviceInfo",
    "device_info",
    "benchmark",
]


def available() -> tuple[bool, str]:
    """Whether the kernels can run here, and why not.

    Returns
    -------
    (bool, str)
        ``(True, "<device name>")`` with a usable CUDA device; otherwise
        ``(False, reason)``: CuPy missing, or no device/driver.
    """
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library failing to load
        return False, f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
    try:
        if not cupy.cuda.is_available():
            return False, "CuPy finds no CUDA device (cupy.cuda.is_available() is False)"
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    except Exception as exc:  # a broken driver install
        return False, f"CUDA is not usable ({type(exc).__name__}: {exc})"
    name = props["name"]
    return True, name.decode() if isinstance(name, bytes) else str(name)


def _require_gpu():
    ok, reason = available()
    if not ok:
        raise RuntimeError(f"the GPU path needs a CUDA device: {reason}.")
    import cupy

    return cupy


class FusedLayerNorm:
    """The fused forward and backward kernels, compiled for the current device.

    Each kernel file is compiled by NVRTC with exactly the source and options
    that :func:`lnorm.gpu.kernels.compile_ptx` inspects
    (:func:`lnorm.gpu.kernels.compile_binary`), and the binary is loaded with
    ``cupy.RawModule(path=...)``.

    Raises
    ------
    RuntimeError
        On construction, if there is no usable CUDA device.
    """

    def __init__(self) -> None:
        cp = _require_gpu()
        self._cp = cp
        cc = int(cp.cuda.Device().compute_capability)
        self._functions = {}
        with tempfile.TemporaryDirectory() as tmp:
            for filename in KERNEL_FILES:
                binary, kind = compile_binary(filename, cc)
                path = Path(tmp) / f"{Path(filename).stem}.{kind}"
                path.write_bytes(binary)
                module = cp.RawModule(path=str(path))
                # get_function loads the module now, while the file exists.
                for name in kernel_params(filename):
                    self._functions[name] = module.get_function(name)

    def _as_device(self, a, dtype=None):
        """A C-contiguous device array, 16-byte aligned (vector loads need it)."""
        cp = self._cp
        a = cp.ascontiguousarray(cp.asarray(a, dtype=dtype))
        if a.data.ptr % 16:
            a = a.copy()  # fresh allocations are 256-byte aligned
        return a

    def forward(self, x, gamma, beta, eps: float = 1e-5) -> tuple:
        """Fused forward: ``y = gamma * (x - mean) * rstd + beta`` over the last axis.

        The mean is returned in two halves, ``mean_hi + mean_lo`` (see
        :func:`lnorm.gpu.emulate.forward`).

        Parameters
        ----------
        x : array, shape (..., D), float32 or float16 (host or device)
        gamma, beta : array, shape (D,), the dtype of ``x``
        eps : float

        Returns
        -------
        y : cupy.ndarray, shape and dtype of ``x``
        mean_hi, mean_lo, rstd : cupy.ndarray, float32, shape ``x.shape[:-1]``
        """
        cp = self._cp
        x, gamma, beta = (self._as_device(a) for a in (x, gamma, beta))
        p = check_forward_args(x, gamma, beta, eps)
        y = cp.empty_like(x)
        hi, lo, rstd = (cp.empty(x.shape[:-1], dtype=cp.float32) for _ in range(3))
        if p.rows:
            self._functions[p.kernel("forward")](
                (p.forward_grid,),
                (p.block,),
                (x, gamma, beta, y, hi, lo, rstd, np.int32(p.rows), np.int32(p.D),
                 np.float32(eps)),
            )
        return y, hi, lo, rstd

    def backward(self, dy, x, gamma, mean_hi, mean_lo, rstd) -> tuple:
        """Fused backward, then the deterministic reduction of dgamma and dbeta.

        Returns
        -------
        dx : cupy.ndarray, shape and dtype of ``x``
        dgamma, dbeta : cupy.ndarray, float32, shape (D,)
        """
        cp = self._cp
        dy, x, gamma, mean_hi, mean_lo, rstd = (
            self._as_device(a) for a in (dy, x, gamma, mean_hi, mean_lo, rstd))
        p = check_backward_args(dy, x, gamma, mean_hi, mean_lo, rstd)
        dx = cp.empty_like(x)
        if p.rows == 0:  # sums over no rows
            return dx, cp.zeros(p.D, dtype=cp.float32), cp.zeros(p.D, dtype=cp.float32)
        # The reduction kernel writes every column: no zero fill, which would
        # be two more launches inside every timed call.
        dgamma = cp.empty(p.D, dtype=cp.float32)
        dbeta = cp.empty(p.D, dtype=cp.float32)
        dgamma_part = cp.empty((p.row_groups, p.D), dtype=cp.float32)
        dbeta_part = cp.empty((p.row_groups, p.D), dtype=cp.float32)
        self._functions[p.kernel("backward")](
            (p.backward_grid,),
            (p.block,),
            (
                dy, x, gamma, mean_hi, mean_lo, rstd, dx, dgamma_part, dbeta_part,
                np.int32(p.rows), np.int32(p.D), np.int32(p.rows_per_group), np.int32(p.row_groups),
            ),
        )
        slices = constants()["LN_REDUCE_SLICES"]
        self._functions["ln_bwd_reduce_params"](
            (math.ceil(p.D / 32),),
            (32, slices),
            (dgamma_part, dbeta_part, np.int32(p.row_groups), np.int32(p.D), dgamma, dbeta),
        )
        return dx, dgamma, dbeta


def unfused_forward(x, gamma, beta, eps: float = 1e-5) -> tuple:
    """The forward written op by op in float32, for comparison.

    :func:`lnorm.core.forward_formula` on float32 arrays (float16 is converted
    first and last): one kernel launch on the GPU (CuPy arrays) or one loop
    on the CPU (NumPy arrays) and one full-size temporary per operator, the
    ``"numpy"`` schedule of :mod:`lnorm.cost`.

    Returns
    -------
    y : array, shape and dtype of ``x``
    mean_hi, mean_lo, rstd : array, float32, shape ``x.shape[:-1]``, as the
        fused backward takes them; ``mean_lo`` is zero (a plain float32 mean)
    """
    x32 = x.astype("float32", copy=False)  # float32 input: no copy, no extra pass
    y, mean, rstd, _ = forward_formula(x32, gamma.astype("float32"), beta.astype("float32"), eps)
    mean = mean[..., 0]
    return y.astype(x.dtype, copy=False), mean, mean * 0, rstd[..., 0]


def unfused_backward(dy, x, gamma, mean_hi, mean_lo, rstd) -> tuple:
    """The backward written op by op in float32, for comparison.

    ``xhat = ((x - mean_hi) - mean_lo) * rstd`` recovered op by op, then
    :func:`lnorm.bench.reference_backward` on float32 arrays: the program
    :func:`lnorm.cost.numpy_program` counts for ``saved="x_mean_rstd"``.

    Returns
    -------
    dx : array, shape and dtype of ``x``
    dgamma, dbeta : array, float32, shape (D,)
    """
    D = x.shape[-1]
    x32 = x.reshape(-1, D).astype("float32", copy=False)
    dy32 = dy.reshape(-1, D).astype("float32", copy=False)
    rstd = rstd.reshape(-1, 1)
    xc = (x32 - mean_hi.reshape(-1, 1)) - mean_lo.reshape(-1, 1)
    xhat = xc * rstd
    dx, dgamma, dbeta = reference_backward(dy32, (xhat, rstd), gamma.astype("float32"))
    return dx.astype(x.dtype, copy=False).reshape(x.shape), dgamma, dbeta


def cuda_time(
    fn: Callable, *args, number: int = 10, repeat: int = 5, warmup: int = 2
) -> float:
    """Seconds per call of ``fn(*args)`` on the GPU, measured with CUDA events.

    Two events bracket ``number`` calls in a row (the GPU queue stays full, so
    host overhead between calls is hidden when the calls are long enough);
    the median over ``repeat`` such batches is returned. The warm-up calls
    load the kernels and fill CuPy's memory pool first.
    """
    cp = _require_gpu()
    for _ in range(warmup):
        fn(*args)
    cp.cuda.get_current_stream().synchronize()
    per_call = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(number):
            fn(*args)
        stop.record()
        stop.synchronize()
        per_call.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / number)
    return float(np.median(per_call))


@dataclass(frozen=True)
class DeviceInfo:
    """The current device and its theoretical memory bandwidth.

    ``peak_bandwidth`` = 2 (double data rate) x memory clock x bus width / 8
    bytes per second, from the device's own attributes; None if the driver
    does not report them.
    """

    name: str
    compute_capability: str
    sm_count: int
    peak_bandwidth: float | None


def device_info() -> DeviceInfo:
    """Name, compute capability, SM count and peak DRAM bandwidth of the current device."""
    cp = _require_gpu()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def attribute(key: str, code: int):
        # CUDA 13 drops these two from the properties; the attribute API keeps them.
        if props.get(key):
            return props[key]
        try:
            return cp.cuda.runtime.deviceGetAttribute(code, dev.id)
        except Exception:
            return None

    clock_khz = attribute("memoryClockRate", 36)  # cudaDevAttrMemoryClockRate
    bus_bits = attribute("memoryBusWidth", 37)  # cudaDevAttrGlobalMemoryBusWidth
    peak = 2.0 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None
    return DeviceInfo(name, dev.compute_capability, int(props["multiProcessorCount"]), peak)


def benchmark(rows: int, D: int, dtype, *, seed: int = 0) -> dict:
    """Time the fused kernels and the op-by-op CuPy version on one problem size.

    Returns
    -------
    dict
        Times in seconds (``fused_forward``, ``fused_backward``,
        ``unfused_forward``, ``unfused_backward``) and ``bytes_forward``,
        ``bytes_backward``: the fused schedule's traffic from
        :func:`lnorm.cost.traffic` (the backward from ``x``, ``mean``,
        ``rstd``, as these kernels save). Bytes over time is the effective
        bandwidth: the least traffic the job needs, per second.
    """
    cp = _require_gpu()
    inp = {k: cp.asarray(v) for k, v in make_inputs(rows, D, dtype, seed).items()}
    fused = FusedLayerNorm()
    y, hi, lo, rstd = fused.forward(inp["x"], inp["gamma"], inp["beta"])
    args_f = (inp["x"], inp["gamma"], inp["beta"])
    args_b = (inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd)
    itemsize = np.dtype(dtype).itemsize
    size = dict(rows=rows, D=D, itemsize=itemsize, saved="x_mean_rstd")
    return {
        "fused_forward": cuda_time(fused.forward, *args_f),
        "fused_backward": cuda_time(fused.backward, *args_b),
        "unfused_forward": cuda_time(unfused_forward, *args_f),
        "unfused_backward": cuda_time(unfused_backward, *args_b),
        "bytes_forward": traffic("forward", "fused", **size).bytes,
        "bytes_backward": traffic("backward", "fused", **size).bytes,
    }
