"""The CUDA sources, their launch plan, and NVRTC compilation to PTX.

Nothing here needs a GPU or a CUDA driver: the sources are text files next to
this module, the launch plan is arithmetic, and :func:`compile_ptx` calls
NVRTC through ``cupy.cuda.nvrtc``, which runs on the CPU.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..validate import check_eps

__all__ = [
    "SOURCE_DIR",
    "KERNEL_FILES",
    "COMPILE_OPTIONS",
    "ARCHS",
    "MIN_ROWS_PER_GROUP",
    "MAX_ROW_GROUPS",
    "constants",
    "source",
    "kernel_params",
    "compile_ptx",
    "compile_binary",
    "LaunchPlan",
    "plan",
    "max_D",
    "check_forward_args",
    "check_backward_args",
]

SOURCE_DIR = Path(__file__).resolve().parent
COMMON_FILE = "layernorm_common.cu"
#: The kernel files, each compiled as one NVRTC program.
KERNEL_FILES = ("layernorm_forward.cu", "layernorm_backward.cu")
#: ``--fmad=false``: no multiply-add contraction, and ``-ftz=false``: subnormal
#: numbers kept, so every float32 operation rounds exactly as NumPy's does in
#: :mod:`lnorm.gpu.emulate`. The kernels are memory-bound: the extra
#: instructions cost no time.
COMPILE_OPTIONS = ("--fmad=false", "-ftz=false", "-std=c++17")
#: Architectures the PTX is generated and inspected for (A100, H100).
ARCHS = ("sm_80", "sm_90")
#: Backward: every row group takes a strip of at least this many rows (the
#: last strip may be shorter), so the (row_groups, D) float32 partial sums of
#: dgamma and dbeta (written once, read once) add about 2 * 2 * 4 / 16 = 1 byte
#: per element to the traffic at most (:attr:`LaunchPlan.partials_bytes`); and
#: there are at most MAX_ROW_GROUPS row groups.
MIN_ROWS_PER_GROUP = 16
MAX_ROW_GROUPS = 4096

_STORAGE = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
_MAX_VEC = {np.dtype(np.float32): 4, np.dtype(np.float16): 8}


def _read(name: str) -> str:
    return (SOURCE_DIR / name).read_text()


def constants() -> dict[str, int]:
    """The ``#define LN_* <int>`` launch constants of ``layernorm_common.cu``.

    Returns
    -------
    dict
        ``{"LN_ELEMS_PER_THREAD": 16, ...}``: read from the CUDA source, so the
        launcher and the emulation use exactly the values the kernels were
        compiled with.
    """
    return dict(_constants())


@functools.cache
def _constants() -> tuple[tuple[str, int], ...]:
    # Cached: the launch path asks for these on every call, and the file does not change.
    found = re.findall(r"^#define\s+(LN_\w+)\s+(\d+)\b", _read(COMMON_FILE), re.M)
    return tuple((name, int(value)) for name, value in found)


def source(filename: str) -> str:
    """The full source of one kernel file, its ``#include`` of the common file inlined.

    One string is what NVRTC and ``cupy.RawModule`` compile, with no include
    path, and what the PTX inspection describes.
    """
    if filename not in KERNEL_FILES:
        raise ValueError(f"filename must be one of {KERNEL_FILES}; got {filename!r}.")
    include = f'#include "{COMMON_FILE}"'
    text = _read(filename)
    if include not in text:
        raise ValueError(f"{filename} does not include {COMMON_FILE}.")
    return text.replace(include, _read(COMMON_FILE))


def kernel_params(filename: str) -> dict[str, tuple[str, ...]]:
    """Parameter names of every ``extern "C"`` kernel in a file, in order.

    Kernels are written either directly (``extern "C" __global__ ... name(...)``)
    or, one per variant, by a macro ``#define M(SUFFIX, ...)`` declaring
    ``prefix##SUFFIX(...)`` and expanded by ``LN_VARIANTS(M)``; both are read.
    """
    text = re.sub(r"\\\n", " ", source(filename))  # join continuation lines

    def names(params: str) -> tuple[str, ...]:
        return tuple(re.findall(r"(\w+)\s*(?:,|$)", params.strip()))

    out: dict[str, tuple[str, ...]] = {}
    variants = re.search(r"^#define LN_VARIANTS\(K\)(.*)$", text, re.M).group(1)
    suffixes = re.findall(r"\bK\((\w+),", variants)
    made = re.findall(
        r"^#define\s+(\w+)\(SUFFIX[^)]*\).*?\b(\w+)##SUFFIX\s*\(([^)]*)\)", text, re.M
    )
    for macro, prefix, params in made:
        if re.search(rf"^LN_VARIANTS\({macro}\)", text, re.M):
            out.update({prefix + suffix: names(params) for suffix in suffixes})
    direct = re.findall(
        r'^extern "C" __global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?'
        r"(\w+)\s*\(([^)]*)\)",
        text,
        re.M,
    )
    out.update({kernel: names(params) for kernel, params in direct})
    return out


def _arch_number(arch: str) -> int:
    m = re.fullmatch(r"sm_(\d+)", str(arch))
    if not m:
        raise ValueError(f"arch must look like 'sm_90'; got {arch!r}.")
    return int(m.group(1))


def _nvrtc():
    try:
        from cupy.cuda import nvrtc
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        raise RuntimeError(
            f"NVRTC is not available ({type(exc).__name__}: {exc}); "
            "install cupy-cuda12x and nvidia-cuda-nvrtc-cu12 (see requirements.txt)."
        ) from exc
    return nvrtc


def _compile(filename: str, arch: str, output: str) -> bytes:
    return _compile_text(source(filename), filename, _arch_number(arch), output)


@functools.cache
def _compile_text(text: str, filename: str, number: int, output: str) -> bytes:
    # Cached on the source text itself: a compile takes about a second (a
    # cubin two), and the book, the tests and every FusedLayerNorm ask for the
    # same few; an edited .cu file is a new key, so it is never served stale.
    nvrtc = _nvrtc()
    target = f"-arch=compute_{number}" if output == "ptx" else f"-arch=sm_{number}"
    program = nvrtc.createProgram(text, filename, [], [])
    try:
        try:
            nvrtc.compileProgram(program, [target, *COMPILE_OPTIONS])
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(
                f"NVRTC failed to compile {filename} for sm_{number}:\n{nvrtc.getProgramLog(program)}"
            ) from exc
        return nvrtc.getPTX(program) if output == "ptx" else nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)


def compile_ptx(filename: str, arch: str = "sm_90") -> str:
    """Compile one kernel file to PTX with NVRTC; no GPU or driver needed.

    Parameters
    ----------
    filename : str
        One of :data:`KERNEL_FILES`.
    arch : str, default "sm_90"
        Target, as ``"sm_XY"``; the PTX is generated for ``compute_XY``.

    Returns
    -------
    str
        The PTX text.

    Raises
    ------
    RuntimeError
        If CuPy's NVRTC binding cannot be loaded, or compilation fails (the
        NVRTC log is in the message).
    """
    ptx = _compile(filename, arch, "ptx")
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def compile_binary(filename: str, compute_capability: int) -> tuple[bytes, str]:
    """Compile one kernel file for a device: a cubin if NVRTC knows the device, else PTX.

    This is what :class:`lnorm.gpu.run.FusedLayerNorm` loads: the same source
    and :data:`COMPILE_OPTIONS` as :func:`compile_ptx`. (Compiling through
    ``cupy.RawModule(code=...)`` instead would append ``-ftz=true``, flushing
    subnormal numbers to zero, unlike NumPy.)

    Parameters
    ----------
    filename : str
        One of :data:`KERNEL_FILES`.
    compute_capability : int
        The device's, e.g. 90 for an H100.

    Returns
    -------
    (bytes, str)
        The binary and its kind, ``"cubin"`` or ``"ptx"`` (for a device newer
        than this NVRTC: PTX for the newest architecture NVRTC knows, which
        the driver compiles on loading).
    """
    supported = _nvrtc().getSupportedArchs()
    if compute_capability in supported:
        return _compile(filename, f"sm_{compute_capability}", "cubin"), "cubin"
    older = [a for a in supported if a <= compute_capability]
    if not older:
        raise RuntimeError(f"NVRTC supports none of the architectures up to sm_{compute_capability}.")
    return _compile(filename, f"sm_{max(older)}", "ptx"), "ptx"


@dataclass(frozen=True)
class LaunchPlan:
    """How the kernels are launched for ``rows`` rows of length ``D``.

    The plan depends on ``(rows, D, dtype)`` only, never on the device: the
    order of every floating-point sum, hence every bit of the result, is the
    same on any GPU.

    Attributes
    ----------
    rows, D : int
    dtype : numpy.dtype
        Storage type of ``x``, ``dy``, ``gamma``, ``beta``, ``y``, ``dx``.
    vec : int
        Elements per 16-byte vector load: 4 (float32) or 8 (float16) when
        ``D`` is a multiple of it, else 1.
    per_block : bool
        One row per block (long rows) rather than one row per warp.
    threads_per_row : int
        32 for a warp, else the block size.
    block : int
        Threads per block.
    forward_grid : int
        Blocks of the forward launch.
    row_groups, rows_per_group : int
        Backward: the number of row groups (warps or blocks) and the strip of
        consecutive rows each takes; the (row_groups, D) partial-sum buffers.
    backward_grid : int
        Blocks of the backward launch.
    """

    rows: int
    D: int
    dtype: np.dtype
    vec: int
    per_block: bool
    threads_per_row: int
    block: int
    forward_grid: int
    row_groups: int
    rows_per_group: int
    backward_grid: int

    @property
    def partials_bytes(self) -> int:
        """Backward: bytes of the ``(row_groups, D)`` float32 partial sums of dgamma and dbeta.

        Two buffers of ``row_groups * D`` float32 values, each written once by
        the backward kernel and read once by the reduction:
        ``2 * 2 * 4 * row_groups * D``.
        """
        return 2 * 2 * 4 * self.row_groups * self.D

    @property
    def vecs_per_thread(self) -> int:
        """Vectors (loads) per thread per tensor: ``LN_ELEMS_PER_THREAD / vec``."""
        return constants()["LN_ELEMS_PER_THREAD"] // self.vec

    def kernel(self, direction: str) -> str:
        """Name of the forward or backward kernel this plan launches."""
        if direction not in ("forward", "backward"):
            raise ValueError(f"direction must be 'forward' or 'backward'; got {direction!r}.")
        kind = "fwd" if direction == "forward" else "bwd"
        mapping = "block" if self.per_block else "warp"
        return f"ln_{kind}_{mapping}_{_STORAGE[self.dtype]}_v{self.vec}"


def max_D() -> int:
    """The longest row the register-resident kernels hold: elements per thread x largest block."""
    c = constants()
    return c["LN_ELEMS_PER_THREAD"] * c["LN_MAX_ROW_THREADS"]


def _check_dtype(dtype, name: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in _STORAGE:
        raise TypeError(
            f"{name} must be float32 or float16 for the GPU kernels; got {dtype}. "
            f"Convert it first, e.g. {name}.astype(numpy.float32)."
        )
    return dtype


def plan(rows: int, D: int, dtype) -> LaunchPlan:
    """The launch plan for ``rows`` rows of length ``D`` stored as ``dtype``.

    Rows of up to ``32 * LN_ELEMS_PER_THREAD`` elements get one warp each
    (``LN_WARPS_PER_BLOCK`` rows per block); longer rows get one block of the
    fewest warps that hold the row at ``LN_ELEMS_PER_THREAD`` elements per
    thread, up to ``LN_MAX_ROW_THREADS`` threads.

    Raises
    ------
    ValueError
        ``rows < 0``, ``D < 1``, or ``D`` longer than :func:`max_D`.
    TypeError
        ``dtype`` not float32 or float16.
    """
    dtype = _check_dtype(dtype, "dtype")
    rows, D = int(rows), int(D)
    if rows < 0:
        raise ValueError(f"rows must be >= 0; got {rows}.")
    if rows >= 2**31:
        raise ValueError(
            f"rows must be below 2**31 (the kernels take the row count as a 32-bit int); "
            f"got {rows}. Split the batch into launches of fewer rows."
        )
    if not 1 <= D <= max_D():
        raise ValueError(
            f"D must be between 1 and {max_D()} for these kernels (the row is held in "
            f"registers); got D = {D}. Longer rows need a kernel that loops over the row."
        )
    c = constants()
    E = c["LN_ELEMS_PER_THREAD"]
    vec = _MAX_VEC[dtype] if D % _MAX_VEC[dtype] == 0 else 1
    nvec = D // vec
    per_block = D > 32 * E
    if per_block:
        threads = 32 * math.ceil(math.ceil(nvec / (E // vec)) / 32)
        block = threads
        forward_grid = rows
    else:
        threads = 32
        block = 32 * c["LN_WARPS_PER_BLOCK"]
        forward_grid = math.ceil(rows / c["LN_WARPS_PER_BLOCK"])
    # Strips of equal length (the last one shorter), none empty.
    rows_per_group = max(MIN_ROWS_PER_GROUP, math.ceil(rows / MAX_ROW_GROUPS))
    row_groups = math.ceil(rows / rows_per_group)
    groups_per_block = 1 if per_block else c["LN_WARPS_PER_BLOCK"]
    backward_grid = math.ceil(row_groups / groups_per_block)
    return LaunchPlan(
        rows=rows,
        D=D,
        dtype=dtype,
        vec=vec,
        per_block=per_block,
        threads_per_row=threads,
        block=block,
        forward_grid=forward_grid,
        row_groups=row_groups,
        rows_per_group=rows_per_group,
        backward_grid=backward_grid,
    )


def _check_param(p, name: str, D: int, dtype: np.dtype) -> None:
    if tuple(p.shape) != (D,):
        raise ValueError(f"{name} must have shape (D,) = ({D},) to match x; got {tuple(p.shape)}.")
    if np.dtype(p.dtype) != dtype:
        raise TypeError(
            f"{name} must have the dtype of x ({dtype}); got {p.dtype}. "
            f"Convert it with {name}.astype(x.dtype)."
        )


def check_forward_args(x, gamma, beta, eps: float = 1e-5) -> LaunchPlan:
    """Validate forward arguments (NumPy or CuPy arrays) and return the plan.

    ``x`` has shape ``(..., D)``; ``gamma`` and ``beta`` shape ``(D,)``, all of
    one dtype, float32 or float16; ``eps`` finite and > 0, as for
    :func:`lnorm.forward`.
    """
    check_eps(eps)
    if not np.isfinite(np.float32(eps)) or np.float32(eps) <= 0:
        raise ValueError(
            f"eps must be finite and > 0 as a float32, the kernels' arithmetic; "
            f"got {eps!r}, which is {float(np.float32(eps))!r} in float32. "
            "A typical value is 1e-5."
        )
    dtype = _check_dtype(x.dtype, "x")
    if x.ndim < 1:
        raise ValueError("x must have shape (..., D); got a 0-d array.")
    D = x.shape[-1]
    _check_param(gamma, "gamma", D, dtype)
    _check_param(beta, "beta", D, dtype)
    return plan(math.prod(x.shape[:-1]), D, dtype)


def check_backward_args(dy, x, gamma, mean_hi, mean_lo, rstd) -> LaunchPlan:
    """Validate backward arguments and return the plan.

    ``dy`` and ``x`` of one shape ``(..., D)`` and dtype; ``gamma`` ``(D,)`` of
    that dtype; ``mean_hi``, ``mean_lo`` and ``rstd`` float32 of shape
    ``x.shape[:-1]`` (as the forward returns them).

    Examples
    --------
    >>> x = np.zeros((3, 8), np.float32)
    >>> s = np.zeros(3, np.float32)
    >>> check_backward_args(x, x, np.ones(8, np.float32), s, s, s).rows
    3
    """
    p = check_forward_args(x, gamma, gamma)
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"dy must have the shape of x, {tuple(x.shape)}; got {tuple(dy.shape)}.")
    if np.dtype(dy.dtype) != p.dtype:
        raise TypeError(f"dy must have the dtype of x ({p.dtype}); got {dy.dtype}.")
    for name, s in (("mean_hi", mean_hi), ("mean_lo", mean_lo), ("rstd", rstd)):
        if tuple(s.shape) != tuple(x.shape[:-1]):
            raise ValueError(
                f"{name} must have shape x.shape[:-1] = {tuple(x.shape[:-1])}, as the forward "
                f"returns it; got {tuple(s.shape)}."
            )
        if np.dtype(s.dtype) != np.float32:
            raise TypeError(f"{name} must be float32, as the forward returns it; got {s.dtype}.")
    return p
