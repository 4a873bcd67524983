r"""Fused layer-norm kernels in CUDA C: compiled and inspected anywhere, run on a GPU.

The kernels are the ``*.cu`` files next to this module:

* ``layernorm_forward.cu``: one row per warp (short rows) or per block (long
  rows), the row read once into registers in 16-byte vectors, the corrected
  mean ``mean_hi + mean_lo`` and the two-pass variance from registers by
  shuffle reductions, ``y`` written once, ``mean_hi``, ``mean_lo`` and
  ``rstd`` saved;
* ``layernorm_backward.cu``: ``gamma`` in registers for a strip of rows;
  ``x``, ``dy`` and the row statistics read once per row, ``xhat``
  recomputed, both row reductions in one shuffle pass, ``dx`` written once;
  ``dgamma``/``dbeta`` summed per row group over its strip into a
  ``(row_groups, D)`` buffer, which a second kernel reduces in a fixed order:
  deterministic, no atomics. Two more rungs of the GPU chapter's ladder, chosen
  with ``rung=``: ``ln_bwd_atomic_*`` (v3) adds the column sums into
  ``dgamma`` and ``dbeta`` with ``atomicAdd``, in the order the groups
  finish; ``ln_bwd_grouped_*`` (v5) lets the row groups of a block add their
  column sums in shared memory first, one partial row per block, and copies
  the next row into shared memory (``cp.async``) while it works on this one
  (``ln_bwd_grouped_long_*``: rows up to ``max_D_block()`` that registers
  do not hold with ``x`` and ``dy``, read from that copy twice;
  ``ln_bwd_grouped_cluster*``: longer rows, up to ``max_D("v5")``, shared by
  a cluster of 2, 4 or 8 blocks, sm_90 and later; ``*_any`` and
  ``*_odd``: rows past a warp's of a D not a multiple of the vector, which
  keep the vectors with a tail; the forward files hold v5's forward kernels
  likewise);
* ``layernorm_long.cu``: both passes for rows longer than a block holds in
  registers (``D > max_D()``), taken in chunks and read again for every pass
  over the row, with the same order of every sum (the emulation covers them
  unchanged).

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
* with g++ (:func:`lnorm.gpu.host.available` says so): the CUDA source itself
  run on the CPU, :class:`lnorm.gpu.host.HostLayerNorm`;
* with a CUDA device (:func:`lnorm.gpu.run.available` says so):
  :class:`lnorm.gpu.run.FusedLayerNorm`, the op-by-op CuPy versions, timing
  with CUDA events, and ``python -m lnorm.gpu.measure``, which checks and
  times everything in one run and writes JSON (``book/data/gpu`` holds one
  such file).

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
