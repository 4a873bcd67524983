"""Fused layer-norm kernels in CUDA C: compiled and inspected anywhere, run where a GPU is.

The kernels are the ``*.cu`` files next to this module:

* ``layernorm_forward.cu``: one row per warp (short rows) or per block (long
  rows), the row read once into registers, mean and variance by two passes
  over registers and shuffle reductions, ``y`` written once, ``mean`` and
  ``rstd`` saved;
* ``layernorm_backward.cu``: ``x``, ``dy``, ``gamma``, ``mean``, ``rstd`` read
  once per row, ``xhat`` recomputed, both row reductions in one shuffle pass,
  ``dx`` written once; ``dgamma``/``dbeta`` summed per row group over a strip
  of rows into a ``(row_groups, D)`` buffer, which a second kernel reduces in a
  fixed order: deterministic, no atomics.

Storage is float32 or float16; arithmetic is always float32.

What works where:

* everywhere (no GPU, no driver): :func:`kernels.compile_ptx` (NVRTC),
  :func:`ptx.inspect_ptx`, :func:`ptx.ptxas_usage`, the launch plan
  :func:`kernels.plan`, and the bit-faithful NumPy emulation
  :func:`emulate.forward` / :func:`emulate.backward`;
* with a CUDA device (:func:`available` says so): :class:`run.FusedLayerNorm`,
  the op-by-op CuPy versions, timing with CUDA events.

Importing this package never imports CuPy.
"""

from . import check, emulate, kernels, ptx, run
from .kernels import compile_ptx, plan
from .run import FusedLayerNorm, available

__all__ = ["available", "FusedLayerNorm", "compile_ptx", "plan", "check", "emulate", "kernels", "ptx", "run"]
