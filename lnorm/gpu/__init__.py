r"""Fused layer-norm kernels in CUDA C: compiled and inspected anywhere, run on a GPU.

The kernels are the ``*.cu`` files next to this module (v3's, v4's and v5's,
listed in :mod:`lnorm.gpu.kernels`); storage is float32 or float16,
arithmetic float32.

Everywhere (no GPU): NVRTC to PTX (:func:`lnorm.gpu.kernels.compile_ptx`), the
PTX read (:mod:`lnorm.gpu.ptx`), the plan (:func:`lnorm.gpu.kernels.plan`),
the bit-faithful emulation (:mod:`lnorm.gpu.emulate`), the time model
(:mod:`lnorm.gpu.model`) and the dry run of ``python -m lnorm.gpu.measure``.
With a CUDA device: :class:`lnorm.gpu.run.FusedLayerNorm` and the measurement.
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
