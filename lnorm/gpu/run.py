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
from pathlib import Path

import numpy as np

from ..core import backward_formula, forward_formula
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
        """Run the fused forward: one launch of the plan's kernel."""
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
        """Say whether this device can launch a rung's kernels at a shape."""
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
        """Run the fused backward, then the fixed-order sum of dgamma and dbeta."""
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
    """Compute the forward op by op in float32, for comparison."""
    x32 = x.astype("float32", copy=False)  # float32 input: no copy, no extra pass
    y, mean, rstd, _ = forward_formula(
        x32, gamma.astype("float32"), beta.astype("float32"), eps
    )
    mean = mean[..., 0]
    return y.astype(x.dtype, copy=False), mean, mean * 0, rstd[..., 0]


def unfused_backward(dy, x, gamma, mean_hi, mean_lo, rstd) -> tuple:
    """Compute the backward op by op in float32, for comparison."""
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
