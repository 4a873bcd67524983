r"""Run and time the kernels on a GPU through CuPy.

Everything here but :func:`available` and the op-by-op versions (which also
run on NumPy arrays) needs a CUDA device, and raises ``RuntimeError`` with the
reason where there is none. CuPy is imported inside the functions: importing
this module needs no CUDA.

The forward and backward take and return what :func:`lnorm.gpu.emulate.forward`
and :func:`lnorm.gpu.emulate.backward` do (host or device arrays in, CuPy
arrays out), refuse what :func:`lnorm.gpu.kernels.check_forward_args` and
``check_backward_args`` refuse, and raise ``RuntimeError`` for a v5 launch
whose prefetch buffers need more shared memory than the device allows.

Examples
--------
>>> ok, reason = available()
>>> try:
...     fused = FusedLayerNorm()
... except RuntimeError as exc:  # no GPU: refused, with the reason
...     print(not ok and str(exc).startswith("the GPU path needs a CUDA device"))
... else:
...     print(ok)
True
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import backward_formula, forward_formula
from ..cost import traffic
from .check import make_inputs
from .kernels import (
    KERNEL_FILES,
    check_backward_args,
    check_forward_args,
    compile_binary,
    kernel_params,
    plan,
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
    r"""Say whether the kernels can run here, and why not.

    Never raises: every failure to import CuPy or to reach a device becomes
    the reason.

    Examples
    --------
    >>> ok, reason = available()
    >>> isinstance(ok, bool), isinstance(reason, str)
    (True, True)
    """
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library failing to load
        return False, f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
    try:
        if not cupy.cuda.is_available():
            return False, ("CuPy finds no CUDA device "
                           "(cupy.cuda.is_available() is False)")
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
    r"""The fused kernels, compiled for the current device by NVRTC.

    The source and options are those :func:`lnorm.gpu.kernels.compile_ptx`
    inspects; the launches follow :func:`lnorm.gpu.kernels.plan`, so the results
    equal :mod:`lnorm.gpu.emulate` bit for bit.

    Examples
    --------
    >>> from lnorm.gpu import emulate
    >>> from lnorm.gpu.check import forward_backward, make_inputs
    >>> inp = make_inputs(64, 7, "float32")
    >>> if available()[0]:  # a GPU: the kernels equal the emulation, bit for bit
    ...     fused = FusedLayerNorm()
    ...     got = forward_backward(fused.forward, fused.backward, inp)
    ...     want = forward_backward(emulate.forward, emulate.backward, inp)
    ...     assert all(np.array_equal(got[k], want[k]) for k in want)
    """

    def __init__(self) -> None:
        cp = _require_gpu()
        self._cp = cp
        device = cp.cuda.Device()
        cc = int(device.compute_capability)
        # The most shared memory a block may opt in to: 227 KiB on an H100,
        # 163 KiB on an A100 (v5's prefetch buffers take up to 192 KiB).
        self._shared_limit = cp.cuda.runtime.deviceGetAttribute(
            cp.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, device.id)
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

    def forward(self, x, gamma, beta, eps: float = 1e-5, *, rung: str = "v4") -> tuple:
        r"""Run the fused forward: one launch of the plan's kernel.

        ``rung`` picks the kernel: v4's, but v5's own for long float16 rows (the same
        arithmetic in the same order: the same bits).

        Examples
        --------
        >>> from lnorm.gpu import emulate
        >>> from lnorm.gpu.kernels import check_forward_args
        >>> x = np.float32(1e4) + np.arange(16, dtype=np.float32).reshape(2, 8)
        >>> g, b = np.ones(8, np.float32), np.zeros(8, np.float32)
        >>> check_forward_args(x, g, b).kernel("forward")  # what the call launches
        'ln_fwd_warp_f32_v4'
        >>> if available()[0]:  # a GPU: the kernel equals the emulation
        ...     y, hi, lo, rstd = FusedLayerNorm().forward(x, g, b)
        ...     assert np.array_equal(y.get(), emulate.forward(x, g, b)[0])
        """
        cp = self._cp
        x, gamma, beta = (self._as_device(a) for a in (x, gamma, beta))
        p = check_forward_args(x, gamma, beta, eps, rung=rung)
        y = cp.empty_like(x)
        hi, lo, rstd = (cp.empty(x.shape[:-1], dtype=cp.float32) for _ in range(3))
        if p.rows:
            name, grid, block, args = p.forward_launch(eps)
            self._launch(name, grid, block, (x, gamma, beta, y, hi, lo, rstd, *args),
                         p.forward_shared_bytes)
        return y, hi, lo, rstd

    def takes(self, rows: int, D: int, dtype, rung: str = "v4") -> bool:
        r"""Say whether this device can launch a rung's kernels at a shape.

        The device must give each kernel the shared memory it needs: v5's
        prefetch buffers may need more than a GPU allows (on an A100, the
        float32 backward of rows past ``max_D()``).

        Examples
        --------
        >>> if available()[0]:  # v4 takes every shape, on every GPU
        ...     assert FusedLayerNorm().takes(8192, 65536, "float32")
        """
        try:
            p = plan(rows, D, dtype, rung)
        except ValueError:
            return False
        launches = (("forward", p.forward_shared_bytes),
                    ("backward", p.backward_shared_bytes))
        return all(p.kernel(d) in self._functions
                   and self._shared_needed(p.kernel(d), shared) <= self._shared_limit
                   for d, shared in launches)

    def _shared_needed(self, name: str, shared: int) -> int:
        """Dynamic plus static shared memory of one launch, in bytes."""
        return shared + getattr(self._functions[name], "shared_size_bytes", 0)

    def _launch(self, name: str, grid, block, args, shared: int) -> None:
        kernel = self._functions[name]
        needed = self._shared_needed(name, shared)
        if needed > self._shared_limit:
            raise RuntimeError(
                f"{name} needs {needed} bytes of shared memory per block (its "
                f"prefetch buffers), more than this GPU allows ({self._shared_limit}); "
                "rung='v4' takes this shape without them."
            )
        if shared > kernel.max_dynamic_shared_size_bytes:  # above 48 KiB: opt in
            kernel.max_dynamic_shared_size_bytes = shared
        kernel(grid, block, args, shared_mem=shared)

    def backward(self, dy, x, gamma, mean_hi, mean_lo, rstd, *,
                 rung: str = "v4", second_stage: bool = True,
                 rows_per_group: int | None = None) -> tuple:
        r"""Run the fused backward, then the fixed-order reduction of dgamma and dbeta.

        Two launches (v4, v5): the backward kernel writes ``dx`` and the partial
        sums, the second stage adds them in a fixed order. v3: one kernel adds every
        group's column sums into zeroed ``dgamma`` and ``dbeta`` with ``atomicAdd``,
        in the order the groups finish. ``second_stage=False`` (v4, v5) returns the
        partial rows instead (:func:`lnorm.gpu.emulate.column_partials`);
        ``rows_per_group`` launches other strips
        (:meth:`lnorm.gpu.kernels.LaunchPlan.with_strip`).

        Examples
        --------
        >>> from lnorm.gpu.kernels import plan
        >>> p = plan(5000, 64, "float16")  # the launches the call makes
        >>> p.kernel("backward"), p.backward_grid, p.row_groups
        ('ln_bwd_warp_f16_v8', 79, 313)
        >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
        >>> g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
        >>> if available()[0]:  # a GPU: the column sums of dy
        ...     fused = FusedLayerNorm()
        ...     stats = fused.forward(x, g, b)[1:]
        ...     dx, dgamma, dbeta = fused.backward(np.ones_like(x), x, g, *stats)
        ...     assert dbeta.tolist() == [2.0, 2.0, 2.0, 2.0]
        """
        cp = self._cp
        dy, x, gamma, mean_hi, mean_lo, rstd = (
            self._as_device(a) for a in (dy, x, gamma, mean_hi, mean_lo, rstd))
        p = check_backward_args(dy, x, gamma, mean_hi, mean_lo, rstd, rung=rung,
                                rows_per_group=rows_per_group)
        if not second_stage and p.rung == "v3":
            raise ValueError("rung 'v3' has no second stage to leave out.")
        dx = cp.empty_like(x)
        if p.rows == 0:  # sums over no rows (no partial rows)
            shape = p.D if second_stage else (0, p.D)
            return (dx, cp.zeros(shape, dtype=cp.float32),
                    cp.zeros(shape, dtype=cp.float32))
        name, grid, block, ints = p.backward_launch()
        ins = (dy, x, gamma, mean_hi, mean_lo, rstd, dx)
        if p.rung == "v3":  # into dgamma and dbeta, which start at zero
            dgamma = cp.zeros(p.D, dtype=cp.float32)
            dbeta = cp.zeros(p.D, dtype=cp.float32)
            self._functions[name](grid, block, (*ins, dgamma, dbeta, *ints))
            return dx, dgamma, dbeta
        # The reduction kernel writes every column: no zero fill, which would
        # be two more launches inside every timed call.
        dgamma = cp.empty(p.D, dtype=cp.float32)
        dbeta = cp.empty(p.D, dtype=cp.float32)
        dgamma_part = cp.empty((p.partial_rows, p.D), dtype=cp.float32)
        dbeta_part = cp.empty((p.partial_rows, p.D), dtype=cp.float32)
        self._launch(name, grid, block, (*ins, dgamma_part, dbeta_part, *ints),
                     p.backward_shared_bytes)
        if not second_stage:
            return dx, dgamma_part, dbeta_part
        rname, rgrid, rblock = p.reduce_launch()
        self._functions[rname](
            rgrid, rblock,
            (dgamma_part, dbeta_part, np.int32(p.partial_rows), np.int32(p.D), dgamma,
             dbeta),
        )
        return dx, dgamma, dbeta


def unfused_forward(x, gamma, beta, eps: float = 1e-5) -> tuple:
    r"""Compute the forward op by op in float32, for comparison.

    :func:`lnorm.core.forward_formula` on float32 arrays (float16 is converted
    first and last): one kernel launch on the GPU (CuPy arrays) or one loop
    on the CPU (NumPy arrays) and one full-size temporary per operator, the
    ``"numpy"`` schedule of :mod:`lnorm.cost`. Needs no GPU for NumPy input.

    Examples
    --------
    >>> x = np.float32(1e4) + np.arange(8, dtype=np.float32).reshape(1, 8)
    >>> g, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    >>> y, mean_hi, mean_lo, rstd = unfused_forward(x, g, b)
    >>> float(mean_hi[0]), float(mean_lo[0]), y.dtype
    (10003.5, 0.0, dtype('float32'))
    """
    x32 = x.astype("float32", copy=False)  # float32 input: no copy, no extra pass
    y, mean, rstd, _ = forward_formula(
        x32, gamma.astype("float32"), beta.astype("float32"), eps
    )
    mean = mean[..., 0]
    return y.astype(x.dtype, copy=False), mean, mean * 0, rstd[..., 0]


def unfused_backward(dy, x, gamma, mean_hi, mean_lo, rstd) -> tuple:
    r"""Compute the backward op by op in float32, for comparison.

    ``xhat = ((x - mean_hi) - mean_lo) * rstd`` recovered op by op, then
    :func:`lnorm.core.backward_formula` on float32 arrays: the program
    :func:`lnorm.cost.numpy_program` counts for ``saved="x_mean_rstd"``.
    Needs no GPU for NumPy input.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> _, hi, lo, rstd = unfused_forward(x, g, b)
    >>> dx, dgamma, dbeta = unfused_backward(np.ones_like(x), x, g, hi, lo, rstd)
    >>> float(abs(dx).max()), dbeta.tolist()
    (0.0, [2.0, 2.0, 2.0, 2.0])
    """
    D = x.shape[-1]
    x32 = x.reshape(-1, D).astype("float32", copy=False)
    dy32 = dy.reshape(-1, D).astype("float32", copy=False)
    rstd = rstd.reshape(-1, 1)
    xc = (x32 - mean_hi.reshape(-1, 1)) - mean_lo.reshape(-1, 1)
    xhat = xc * rstd
    dx, dgamma, dbeta = backward_formula(
        dy32, xhat, gamma.astype("float32"), rstd
    )
    return dx.astype(x.dtype, copy=False).reshape(x.shape), dgamma, dbeta


def cuda_time(
    fn: Callable, *args, number: int = 10, repeat: int = 5, warmup: int = 2
) -> float:
    r"""Measure the seconds per call of ``fn(*args)`` on the GPU with CUDA events.

    Two events bracket ``number`` calls in a row (the GPU queue stays full, so
    host overhead between calls is hidden when the calls are long enough);
    the median over ``repeat`` such batches is returned. The warm-up calls
    load the kernels and fill CuPy's memory pool first.

    Examples
    --------
    >>> ok, _ = available()
    >>> try:
    ...     t = cuda_time(lambda: None, number=2, repeat=3, warmup=1)
    ... except RuntimeError as exc:  # no GPU
    ...     print(not ok and str(exc).startswith("the GPU path needs a CUDA device"))
    ... else:
    ...     print(ok and t >= 0)
    True
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
    r"""Describe the current device and its theoretical memory bandwidth.

    Made by :func:`lnorm.gpu.run.device_info`.

    Examples
    --------
    >>> clock_hz, bus_bits = 2619e6, 5120  # an H100 SXM's HBM3
    >>> info = DeviceInfo("H100", "90", 132, 2 * clock_hz * bus_bits / 8)
    >>> round(info.peak_bandwidth / 1e12, 2)  # TB/s
    3.35
    """

    name: str
    compute_capability: str
    sm_count: int
    peak_bandwidth: float | None


def device_info() -> DeviceInfo:
    r"""Read the name, compute capability, SM count and peak bandwidth of the device.

    Examples
    --------
    >>> ok, reason = available()
    >>> try:
    ...     info = device_info()
    ... except RuntimeError as exc:  # no GPU
    ...     print(not ok and str(exc).startswith("the GPU path needs a CUDA device"))
    ... else:
    ...     print(ok and info.name == reason and info.sm_count > 0)
    True
    """
    cp = _require_gpu()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = (props["name"].decode() if isinstance(props["name"], bytes)
            else str(props["name"]))

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
    return DeviceInfo(
        name, dev.compute_capability, int(props["multiProcessorCount"]), peak
    )


def benchmark(rows: int, D: int, dtype, *, seed: int = 0) -> dict:
    r"""Time the fused kernels and the op-by-op version at one size (:func:`cuda_time`).

    Examples
    --------
    >>> ok, _ = available()
    >>> try:
    ...     result = benchmark(256, 64, "float32")
    ... except RuntimeError as exc:  # no GPU
    ...     print(not ok and str(exc).startswith("the GPU path needs a CUDA device"))
    ... else:
    ...     print(ok and result["bytes_forward"] == 133632)
    True
    """
    cp = _require_gpu()
    inp = {k: cp.asarray(v) for k, v in make_inputs(rows, D, dtype, seed).items()}
    fused = FusedLayerNorm()
    y, hi, lo, rstd = fused.forward(inp["x"], inp["gamma"], inp["beta"])
    args_f = (inp["x"], inp["gamma"], inp["beta"])
    args_b = (inp["dy"], inp["x"], inp["gamma"], hi, lo, rstd)
    itemsize = np.dtype(dtype).itemsize
    size = dict(rows=rows, D=D, itemsize=itemsize, saved="x_mean_rstd",
                mean_parts=2)
    return {
        "fused_forward": cuda_time(fused.forward, *args_f),
        "fused_backward": cuda_time(fused.backward, *args_b),
        "unfused_forward": cuda_time(unfused_forward, *args_f),
        "unfused_backward": cuda_time(unfused_backward, *args_b),
        "bytes_forward": traffic("forward", "fused", **size).bytes,
        "bytes_backward": traffic("backward", "fused", **size).bytes,
    }
