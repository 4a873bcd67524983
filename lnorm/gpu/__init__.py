r"""Fused layer-norm kernels in CUDA C: compiled and inspected anywhere, run on a GPU.

The kernels are the ``*.cu`` files next to this module:

* ``layernorm_forward.cu``: v4's forward, a row per warp (short rows) or per
  block, read once into registers in 16-byte vectors (scalars where ``D`` is
  not a multiple of the vector), the corrected mean ``mean_hi + mean_lo`` and
  the two-pass variance by shuffle reductions, ``y`` written once; and v5's
  forward of long float16 rows, the next rows' loads in flight;
* ``layernorm_backward.cu``: v4's backward, ``gamma`` in registers for a
  strip of rows, ``xhat`` recomputed, both row sums in one shuffle pass,
  ``dx`` written once, ``dgamma``/``dbeta`` summed per row group into a
  ``(row_groups, D)`` buffer that a second kernel reduces in a fixed order;
  v3 (``ln_bwd_atomic_*``) adds them with ``atomicAdd`` instead; v5
  (``ln_bwd_grouped_*``) adds a block's groups' sums first and copies the
  next rows into shared memory while it works on this one;
* ``layernorm_long.cu``: v4 for rows longer than a block holds in registers
  (``D > max_D()``), in chunks, read again for every pass.

Storage is float32 or float16; arithmetic is always float32. The chapter "One kernel:
fused layer norm on the GPU" derives and measures them.

What works where:

* everywhere (no GPU, no driver): :func:`lnorm.gpu.kernels.compile_ptx`
  (NVRTC), :func:`lnorm.gpu.ptx.inspect_ptx`, :func:`lnorm.gpu.ptx.ptxas_usage`,
  the launch plan :func:`lnorm.gpu.kernels.plan`, and the bit-faithful NumPy
  emulation :func:`lnorm.gpu.emulate.forward` /
  :func:`lnorm.gpu.emulate.backward`;
* everywhere: the time model :mod:`lnorm.gpu.model` (bytes, and the latency
  each row exposes) and the dry run of ``python -m lnorm.gpu.measure``;
* with a CUDA device (:func:`lnorm.gpu.run.available` says so):
  :class:`lnorm.gpu.run.FusedLayerNorm`, the op-by-op CuPy versions, timing
  with CUDA events, and ``python -m lnorm.gpu.measure``, which checks and
  times everything in one run and writes JSON.

The tests also run the ``.cu`` files on the CPU with g++ (``tests/cuda_host``).

Importing this package never imports CuPy.

Examples
--------
>>> from lnorm import gpu
>>> gpu.plan(8192, 1024, "float16").kernel("forward")
'ln_fwd_block_f16_v8'
>>> isinstance(gpu.available()[0], bool)
True
"""

from . import check, emulate, kernels, model, ptx, run
from .kernels import compile_ptx, plan
from .run import FusedLayerNorm, available

__all__ = [
    "available", "FusedLayerNorm", "compile_ptx", "plan",
    "check", "emulate", "kernels", "model", "ptx", "run",
]
