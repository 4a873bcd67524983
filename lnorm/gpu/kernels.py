r"""The CUDA sources, their launch plan, and NVRTC compilation to PTX.

Nothing here needs a GPU or a CUDA driver: the sources are text files next to
this module, the plan is arithmetic, and NVRTC (``cupy.cuda.nvrtc``) runs on
the CPU.

Every kernel is one line of an X-macro table in ``layernorm_common.cu``
(``LN_VARIANTS``, ``LN_LONG_VARIANTS``, ``LN_GROUPED_VARIANTS``,
``LN_GROUPED_LONG_VARIANTS``, ``LN_GROUPED_LONG_FWD_VARIANTS``), or is written
out (the two reductions). :func:`kernel_params` reads them, and the plan picks
its kernels from what it read: a rung asked for a row it has no kernel for
runs v4's kernels, and its plan's ``note`` says so.

The plan depends on ``(rows, D, dtype, rung)`` only, never on the device:
the order of every floating-point sum, hence every bit of the result, is the
same on any GPU.

Examples
--------
>>> p = plan(8192, 1024, "float32")
>>> p.kernel("forward"), p.kernel("backward")
('ln_fwd_block_f32_v4', 'ln_bwd_block_f32_v4')
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..validate import check_eps

__all__ = [
    "SOURCE_DIR", "KERNEL_FILES", "REGISTER_FILES", "LONG_FILE", "MAX_ROW",
    "COMPILE_OPTIONS", "ARCHS", "MIN_ROWS_PER_GROUP", "MAX_ROW_GROUPS", "RUNGS",
    "BACKWARD_KERNELS", "PARTIALS_BUDGET", "WAVE_THREADS",
    "wave_blocks", "constants", "source", "kernel_params", "compile_ptx",
    "compile_binary", "LaunchPlan", "plan", "max_D", "rungs_for",
    "check_forward_args", "check_backward_args",
]

#: The directory of the ``.cu`` files.
SOURCE_DIR = Path(__file__).resolve().parent
COMMON_FILE = "layernorm_common.cu"
#: The file of v4's kernels for rows longer than registers hold.
LONG_FILE = "layernorm_long.cu"
#: The kernel files, each compiled as one NVRTC program.
KERNEL_FILES = ("layernorm_forward.cu", "layernorm_backward.cu", LONG_FILE)
#: The files of the kernels that hold a row in registers or shared memory.
REGISTER_FILES = KERNEL_FILES[:2]
#: The longest row any kernel takes: ``D`` is passed as a 32-bit int.
MAX_ROW = 2**31 - 1
#: No multiply-add contraction and subnormals kept, so that every float32
#: operation rounds as NumPy's does in :mod:`lnorm.gpu.emulate`; the kernels
#: are memory-bound, so the extra instructions cost no time.
COMPILE_OPTIONS = ("--fmad=false", "-ftz=false", "-std=c++17")
#: Architectures the PTX is generated and inspected for (A100, H100).
ARCHS = ("sm_80", "sm_90")
#: v3, v4: every row group's backward strip has at least this many rows, so
#: that the float32 partial sums (written once, read once) add at most
#: 2 * 2 * 4 / 16 = 1 byte per element...
MIN_ROWS_PER_GROUP = 16
#: ... and a launch has at most this many row groups (longer strips past
#: ``16 * MAX_ROW_GROUPS`` rows).
MAX_ROW_GROUPS = 4096
#: The ladder's rungs that are ``.cu`` kernels: ``"v3"`` adds the column sums
#: with atomics; ``"v4"``, the default, writes one partial row per row group
#: and sums them in a fixed order; ``"v5"`` adds a block's groups' column sums
#: first and keeps the next rows' loads in flight. v3's forward is v4's.
RUNGS = ("v3", "v4", "v5")
#: v5: its strips are the shortest, doubled from one row, whose partial sums
#: stay within this fraction of the bytes the backward must move...
PARTIALS_BUDGET = 0.05
#: ... then lengthened to the shortest that fits the launch in one wave of
#: this many threads (128 SMs of 512): every SM busy, no second, partial
#: wave. A constant, not the device's SM count, so the plan is the same on
#: every GPU.
WAVE_THREADS = 128 * 512

_STORAGE = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
#: The middle of each rung's backward kernel names, ``ln_<name>_...``.
BACKWARD_KERNELS = {"v3": "bwd_atomic", "v4": "bwd", "v5": "bwd_grouped"}
_MAX_VEC = {np.dtype(np.float32): 4, np.dtype(np.float16): 8}


def _read(name: str) -> str:
    return (SOURCE_DIR / name).read_text()


def constants() -> dict[str, int]:
    r"""Read the ``#define LN_* <int>`` launch constants of the CUDA sources.

    Those of ``layernorm_common.cu``, then ``layernorm_long.cu``'s: the plan
    and the emulation use the values the kernels were compiled with.

    Examples
    --------
    >>> c = constants()
    >>> c["LN_ELEMS_PER_THREAD"], c["LN_MAX_ROW_THREADS"], c["LN_LONG_STRIP"]
    (16, 512, 16)
    """
    return dict(_constants())


@functools.cache
def _constants() -> tuple[tuple[str, int], ...]:
    text = _read(COMMON_FILE) + _read(LONG_FILE)
    found = re.findall(r"^#define\s+(LN_\w+)\s+(\d+)\b", text, re.M)
    return tuple((name, int(value)) for name, value in found)


def source(filename: str) -> str:
    r"""Return one kernel file's source, its ``#include`` of the common file inlined.

    One string is what NVRTC compiles, with no include path.

    Examples
    --------
    >>> text = source("layernorm_forward.cu")
    >>> '#include "layernorm_common.cu"' in text, "#define LN_REDUCE_SLICES" in text
    (False, True)
    >>> source("other.cu")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: filename must be one of ('layernorm_forward.cu', ...); got 'other.cu'.
    """
    if filename not in KERNEL_FILES:
        raise ValueError(f"filename must be one of {KERNEL_FILES}; got {filename!r}.")
    include = f'#include "{COMMON_FILE}"'
    return _read(filename).replace(include, _read(COMMON_FILE))


def kernel_params(filename: str) -> dict[str, tuple[str, ...]]:
    """Read every ``extern "C"`` kernel of a file and its parameters."""
    text = re.sub(r"\\\n", " ", source(filename))  # join continuation lines

    def names(params: str) -> tuple[str, ...]:
        return tuple(re.findall(r"(\w+)\s*(?:,|$)", params.strip()))

    out: dict[str, tuple[str, ...]] = {}
    lists = {
        name: re.findall(r"\bK\((\w+),", body)
        for name, body in re.findall(r"^#define (LN_\w*VARIANTS)\(K\)(.*)$", text, re.M)
    }
    made = {
        macro: (prefix, params)
        for macro, prefix, params in re.findall(
            r"^#define\s+(\w+)\(SUFFIX[^)]*\).*?\b(\w+)##SUFFIX\s*\(([^)]*)\)",
            text, re.M)
    }
    forwards = dict(re.findall(
        r"^#define\s+(\w+)\(SUFFIX[^)]*\)\s+(\w+)\(SUFFIX\b", text, re.M))
    for name, macro in re.findall(r"^(LN_\w*VARIANTS)\((\w+)\)", text, re.M):
        while macro in forwards:  # to the macro that declares the kernel
            macro = forwards[macro]
        prefix, params = made[macro]
        out.update({prefix + suffix: names(params) for suffix in lists[name]})
    direct = re.findall(
        r'^extern "C" __global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?'
        r"(\w+)\s*\(([^)]*)\)", text, re.M)
    out.update({kernel: names(params) for kernel, params in direct})
    return out


@functools.cache
def _kernels() -> frozenset[str]:
    """Every kernel of every file: what the plan may launch."""
    return frozenset(k for f in KERNEL_FILES for k in kernel_params(f))


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
                f"NVRTC failed to compile {filename} for sm_{number}:\n"
                f"{nvrtc.getProgramLog(program)}"
            ) from exc
        return nvrtc.getPTX(program) if output == "ptx" else nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)


def compile_ptx(filename: str, arch: str = "sm_90") -> str:
    r"""Compile one kernel file to PTX with NVRTC; no GPU or driver needed.

    The source is :func:`lnorm.gpu.kernels.source`, the options
    :data:`lnorm.gpu.kernels.COMPILE_OPTIONS`. Results are cached in the
    process, keyed by the source text, so a second call is free.

    Examples
    --------
    >>> ptx = compile_ptx("layernorm_forward.cu")
    >>> ".target sm_90" in ptx, ".visible .entry ln_fwd_block_f16_v8(" in ptx
    (True, True)
    """
    ptx = _compile(filename, arch, "ptx")
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def compile_binary(filename: str, compute_capability: int) -> tuple[bytes, str]:
    """Compile one kernel file for a device: a cubin if NVRTC knows it, else PTX."""
    supported = _nvrtc().getSupportedArchs()
    if compute_capability in supported:
        return _compile(filename, f"sm_{compute_capability}", "cubin"), "cubin"
    older = [a for a in supported if a <= compute_capability]
    if not older:
        raise RuntimeError(
            f"NVRTC supports none of the architectures up to sm_{compute_capability}."
        )
    return _compile(filename, f"sm_{max(older)}", "ptx"), "ptx"


@dataclass(frozen=True)
class LaunchPlan:
    r"""How the kernels are launched for ``rows`` rows of length ``D`` (:func:`plan`).

    Attributes
    ----------
    rows, D : int
        Rows (the product of the leading axes) and row length.
    dtype : numpy.dtype
        Storage type of ``x``, ``dy``, ``gamma``, ``beta``, ``y``, ``dx``.
    vec : int
        Elements per vector load: 4 (float32) or 8 (float16), 16 bytes, when
        ``D`` is a multiple of it, else 1.
    per_block : bool
        One row per block, not per warp (``D > 32 * LN_ELEMS_PER_THREAD``).
    chunks : int
        Chunks of ``block * LN_ELEMS_PER_THREAD`` elements a row is taken in:
        1 but for v4's long-row kernels (``D > max_D()``).
    threads_per_row : int
        32 for a warp, else the block size.
    block : int
        Threads per block (of the forward, and of the backward of v3 and v4).
    forward_grid : int
        Blocks of the forward launch.
    row_groups, rows_per_group : int
        Backward: the row groups (warps or blocks) and each one's strip of
        consecutive rows.
    backward_grid : int
        Blocks of the backward launch.
    rung : {"v4", "v3", "v5"}, default "v4"
        Whose kernels run (:data:`RUNGS`).
    backward_block : int, default 0
        v5: threads per block of its backward (several row groups).
    forward_rows_per_group : int, default 0
        v5's own forward (long float16 rows): the strip of each row group;
        0 where the forward is v4's, a row per group.
    note : str, default ""
        Why the kernels are not those of the rung asked for, if they are not.

    Examples
    --------
    >>> p = plan(8192, 4096, "float16")
    >>> p.vec, p.per_block, p.block, p.forward_grid, p.row_groups, p.backward_grid
    (8, True, 256, 8192, 512, 512)
    """

    rows: int
    D: int
    dtype: np.dtype
    vec: int
    per_block: bool
    chunks: int
    threads_per_row: int
    block: int
    forward_grid: int
    row_groups: int
    rows_per_group: int
    backward_grid: int
    rung: str = "v4"
    backward_block: int = 0
    forward_rows_per_group: int = 0
    note: str = ""

    @property
    def groups_per_block(self) -> int:
        """Backward: row groups in one block."""
        return (self.backward_block or self.block) // self.threads_per_row

    def with_strip(self, rows_per_group: int) -> LaunchPlan:
        """Return this plan with backward strips of ``rows_per_group`` rows."""
        rows_per_group = int(rows_per_group)
        longest = (constants()["LN_LONG_STRIP"] if self.chunks > 1 and self.rung != "v5"
                   else rows_per_group)
        if not 1 <= rows_per_group <= longest:
            raise ValueError(
                f"rows_per_group must be between 1 and {longest} for this plan; "
                f"got {rows_per_group}.")
        groups = math.ceil(self.rows / rows_per_group)
        return replace(self, rows_per_group=rows_per_group, row_groups=groups,
                       backward_grid=math.ceil(groups / self.groups_per_block))

    @property
    def partial_rows(self) -> int:
        """Backward: rows of partial sums, a group's (v4), a block's (v5), none (v3)."""
        return {"v3": 0, "v4": self.row_groups, "v5": self.backward_grid}[self.rung]

    @property
    def partials_bytes(self) -> int:
        """Backward: bytes of the partial sums, ``2 * 2 * 4 * partial_rows * D``."""
        return 2 * 2 * 4 * self.partial_rows * self.D

    def rows_in_flight(self, direction: str) -> int:
        r"""Rows whose loads a row group keeps in flight: 1 but for v5's own kernels.

        ``LN_FWD_ROWS_IN_FLIGHT``, ``LN_BWD_ROWS_IN_FLIGHT``, or where a warp
        holds a row ``LN_BWD_WARP_ROWS_IN_FLIGHT_F32`` or ``_F16``: one
        shared-memory buffer each.

        Examples
        --------
        >>> p = plan(8192, 1024, "float16", "v5")
        >>> p.rows_in_flight("forward"), p.rows_in_flight("backward")
        (1, 2)
        >>> plan(10**6, 64, "float16", "v5").rows_in_flight("backward")
        4
        """
        c = constants()
        if self.rung != "v5" or (direction == "forward"
                                 and not self.forward_rows_per_group):
            return 1
        if direction == "forward":
            return c["LN_FWD_ROWS_IN_FLIGHT"]
        if self.per_block:
            return c["LN_BWD_ROWS_IN_FLIGHT"]
        return c[f"LN_BWD_WARP_ROWS_IN_FLIGHT_{_STORAGE[self.dtype].upper()}"]

    def _prefetch_bytes(self, direction: str, tensors: int) -> int:
        k = self.rows_in_flight(direction)
        if k == 1:
            return 0
        c = constants()
        per_thread = c["LN_LONG_ELEMS_PER_THREAD" if self.D > max_D()
                       else "LN_ELEMS_PER_THREAD"]
        return k * tensors * 16 * (per_thread // self.vec) * self.backward_block

    @property
    def backward_shared_bytes(self) -> int:
        """Backward: dynamic shared memory a block, v5's buffers of rows in flight."""
        return self._prefetch_bytes("backward", tensors=2)

    @property
    def forward_shared_bytes(self) -> int:
        """Forward: dynamic shared memory a block, v5's buffers of ``x`` (or 0)."""
        return self._prefetch_bytes("forward", tensors=1)

    @property
    def vecs_per_thread(self) -> int:
        """Vector loads a thread makes of a row in one pass."""
        return self.chunks * constants()["LN_ELEMS_PER_THREAD"] // self.vec

    def forward_launch(self, eps: float) -> tuple[str, tuple, tuple, tuple]:
        """Return the forward's launch: ``(kernel, (grid,), (block,), args)``."""
        ints = (np.int32(self.rows), np.int32(self.D))
        if not self.forward_rows_per_group:
            return (self.kernel("forward"), (self.forward_grid,), (self.block,),
                    (*ints, np.float32(eps)))
        return (self.kernel("forward"), (self.forward_grid,), (self.backward_block,),
                (*ints, np.float32(eps), np.int32(self.forward_rows_per_group),
                 np.int32(self.threads_per_row)))

    def backward_launch(self) -> tuple[str, tuple, tuple, tuple]:
        """Return the backward's launch: ``(kernel, (grid,), (block,), ints)``."""
        last = self.threads_per_row if self.rung == "v5" else self.row_groups
        ints = tuple(np.int32(i) for i in (self.rows, self.D, self.rows_per_group,
                                            last))
        return (self.kernel("backward"), (self.backward_grid,),
                (self.backward_block or self.block,), ints)

    def reduce_launch(self) -> tuple[str, tuple, tuple]:
        """Return the second stage's launch, ``(kernel, (grid,), (32, slices))``."""
        wide = self.rung == "v5"
        slices = constants()["LN_REDUCE_SLICES_WIDE" if wide else "LN_REDUCE_SLICES"]
        name = "ln_bwd_reduce_params" + ("_wide" if wide else "")
        return name, (math.ceil(self.D / 32),), (32, slices)

    def kernel(self, direction: str) -> str:
        r"""Return the forward's or the backward's kernel, ``ln_{fwd|bwd}_...``.

        Examples
        --------
        >>> plan(64, 7, "float32").kernel("backward")
        'ln_bwd_warp_f32_v1'
        >>> plan(24, 12288, "float16").kernel("backward")
        'ln_bwd_long_f16_v8'
        >>> plan(64, 7, "float32", rung="v3").kernel("backward")
        'ln_bwd_atomic_warp_f32_v1'
        >>> plan(64, 4096, "float16", rung="v5").kernel("forward")  # v4's forward
        'ln_fwd_block_f16_v8'
        """
        if direction not in ("forward", "backward"):
            raise ValueError(
                f"direction must be 'forward' or 'backward'; got {direction!r}."
            )
        if direction == "forward":
            kind = "fwd_grouped" if self.forward_rows_per_group else "fwd"
        else:
            kind = BACKWARD_KERNELS[self.rung]
        mapping = ("long" if self.D > max_D() else "block" if self.per_block
                   else "warp")
        return f"ln_{kind}_{mapping}_{_STORAGE[self.dtype]}_v{self.vec}"


def max_D(rung: str = "v4") -> int:
    r"""Return the longest row the rung has kernels of its own for.

    ``max_D() = LN_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS`` (v3, v4); longer
    rows go to v4's long-row kernels, which read the row again for every
    pass. v5's kernels hold rows up to ``LN_LONG_ELEMS_PER_THREAD *
    LN_MAX_ROW_THREADS``. Past its limit a rung runs v4's kernels.

    Examples
    --------
    >>> max_D(), max_D("v5")
    (8192, 12288)
    """
    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {RUNGS}; got {rung!r}.")
    c = constants()
    per_thread = c["LN_LONG_ELEMS_PER_THREAD" if rung == "v5"
                   else "LN_ELEMS_PER_THREAD"]
    return per_thread * c["LN_MAX_ROW_THREADS"]


def rungs_for(D: int, dtype) -> tuple[str, ...]:
    """Return the rungs that have kernels of their own for rows of length ``D``."""
    return tuple(r for r in RUNGS if plan(0, D, dtype, r).rung == r)


def _check_dtype(dtype, name: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in _STORAGE:
        raise TypeError(
            f"{name} must be float32 or float16 for the GPU kernels; got {dtype}. "
            f"Convert it first, e.g. {name}.astype(numpy.float32)."
        )
    return dtype


def wave_blocks(block: int, threads: int = WAVE_THREADS) -> int:
    """Blocks of ``block`` threads in one wave of ``threads``, on 128 SMs."""
    return 128 * max(1, threads // 128 // block)


def plan(rows: int, D: int, dtype, rung: str = "v4") -> LaunchPlan:
    r"""Plan the launches for ``rows`` rows of length ``D`` stored as ``dtype``.

    v3 and v4: rows of up to ``32 * LN_ELEMS_PER_THREAD`` elements get a warp
    each (``LN_WARPS_PER_BLOCK`` rows a block); longer ones a block of the
    fewest warps that hold the row at ``LN_ELEMS_PER_THREAD`` elements a
    thread; past ``max_D()``, a block of ``LN_MAX_ROW_THREADS`` threads takes
    the row in ``chunks``. The backward gives each row group a strip of
    ``max(MIN_ROWS_PER_GROUP, ceil(rows / MAX_ROW_GROUPS))`` rows, or of
    ``LN_LONG_STRIP`` past ``max_D()``.

    v5 (rows of 16-byte vectors up to ``max_D("v5")``) puts as many row
    groups in a block as ``LN_MAX_ROW_THREADS`` threads hold (or
    ``LN_WARPS_PER_BLOCK`` warps), and doubles the strip from one row
    (``LN_LONG_STRIP`` past ``max_D()``) until the partial sums, one row a
    block, are within :data:`PARTIALS_BUDGET` of the bytes the backward must
    move; then lengthens it to the shortest strip that fits one wave of
    :data:`WAVE_THREADS` threads, or, where the budget's strip leaves
    ``k >= 1`` whole waves and some over, to the shortest that fits ``k``.
    Its forward is v4's but where it has its own kernel (long float16 rows),
    with strips for one wave.

    A rung with no kernel for the row runs v4's plan, and says so in ``note``.

    Raises
    ------
    ValueError
        ``rows < 0``, ``rows >= 2**31``, ``D < 1``, ``D > MAX_ROW``, or a rung
        not in :data:`RUNGS`.
    TypeError
        ``dtype`` not float32 or float16.

    Examples
    --------
    >>> p = plan(300, 512, "float32")  # short rows: one warp each
    >>> p.per_block, p.threads_per_row, p.block, p.forward_grid, p.vec
    (False, 32, 128, 75, 4)
    >>> p = plan(300, 513, "float32")  # longer: a block each, scalar loads
    >>> p.per_block, p.threads_per_row, p.forward_grid, p.vec, p.rows_per_group
    (True, 64, 300, 1, 16)
    >>> p = plan(300, 12288, "float32")  # longer than registers hold: in chunks
    >>> p.kernel("forward"), p.threads_per_row, p.chunks
    ('ln_fwd_long_f32_v4', 512, 2)
    >>> p = plan(8192, 4096, "float16", rung="v5")  # two groups of 256 a block
    >>> p.backward_block, p.rows_per_group, p.backward_grid, p.partial_rows
    (512, 32, 128, 128)
    >>> p = plan(64, 513, "float32", rung="v5")
    >>> p.rung, p.note
    ('v4', "v5 has no kernel for rows of 513 float32: v4's kernels run")
    """
    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {RUNGS}; got {rung!r}.")
    dtype = _check_dtype(dtype, "dtype")
    rows, D = int(rows), int(D)
    if rows < 0:
        raise ValueError(f"rows must be >= 0; got {rows}.")
    if rows >= 2**31:
        raise ValueError(
            f"rows must be below 2**31 (the kernels take the row count as a 32-bit "
            f"int); got {rows}. Split the batch into launches of fewer rows."
        )
    if not 1 <= D <= MAX_ROW:
        raise ValueError(
            f"D must be between 1 and {MAX_ROW} for these kernels (they take D as "
            f"a 32-bit int); got D = {D}."
        )
    c = constants()
    E = c["LN_ELEMS_PER_THREAD"]
    vec = _MAX_VEC[dtype] if D % _MAX_VEC[dtype] == 0 else 1
    nvec = D // vec
    per_block = D > 32 * E
    chunks = 1
    if per_block:
        threads = 32 * math.ceil(math.ceil(nvec / (E // vec)) / 32)
        if threads > c["LN_MAX_ROW_THREADS"]:  # the long-row kernels
            threads = c["LN_MAX_ROW_THREADS"]
            chunks = math.ceil(nvec / (threads * (E // vec)))
        block = threads
        forward_grid = rows
    else:
        threads = 32
        block = 32 * c["LN_WARPS_PER_BLOCK"]
        forward_grid = math.ceil(rows / c["LN_WARPS_PER_BLOCK"])
    if chunks > 1:  # the long-row backward keeps a strip's row means in shared memory
        rows_per_group = c["LN_LONG_STRIP"]
    else:
        rows_per_group = max(MIN_ROWS_PER_GROUP, math.ceil(rows / MAX_ROW_GROUPS))
    v4 = LaunchPlan(rows=rows, D=D, dtype=dtype, vec=vec, per_block=per_block,
                    chunks=chunks, threads_per_row=threads, block=block,
                    forward_grid=forward_grid, row_groups=0,
                    rows_per_group=rows_per_group, backward_grid=0)
    if rung == "v4":
        return v4.with_strip(rows_per_group)
    mapping = "long" if D > max_D() else "block" if per_block else "warp"
    own = f"ln_{BACKWARD_KERNELS[rung]}_{mapping}_{_STORAGE[dtype]}_v{vec}"
    if D > max_D(rung) or own not in _kernels():  # the tables have none
        note = f"{rung} has no kernel for rows of {D} {dtype}: v4's kernels run"
        return replace(v4, note=note).with_strip(rows_per_group)
    if rung == "v3":
        return replace(v4, rung="v3").with_strip(rows_per_group)
    # v5: a block of several row groups; past max_D(), one group of the
    # largest block, the row held at LN_LONG_ELEMS_PER_THREAD a thread.
    groups_per_block = (c["LN_MAX_ROW_THREADS"] // threads if per_block
                        else c["LN_WARPS_PER_BLOCK"])
    backward_block = groups_per_block * threads
    rows_per_group = c["LN_LONG_STRIP"] if D > max_D() else 1
    # 16 bytes per column per partial row, against 3 * itemsize per element
    while 16 / (groups_per_block * rows_per_group) > (
            PARTIALS_BUDGET * 3 * dtype.itemsize):
        rows_per_group *= 2
    wave = groups_per_block * wave_blocks(backward_block)
    one_wave = math.ceil(rows / wave)  # the shortest strip in one wave
    whole = rows // (rows_per_group * wave)  # waves the budget fills
    if rows_per_group > one_wave and whole:
        # The budget set the strip: lengthen it until the groups fill those
        # waves, so that no last wave of a few groups takes as long as a full one.
        rows_per_group = math.ceil(rows / (whole * wave))
    rows_per_group = max(rows_per_group, one_wave)
    forward_rows_per_group = 0
    forward = f"ln_fwd_grouped_long_{_STORAGE[dtype]}_v{vec}"
    if D > max_D() and forward in _kernels():
        forward_rows_per_group = max(1, one_wave)
        forward_grid = math.ceil(rows / forward_rows_per_group)
    return replace(v4, rung="v5", backward_block=backward_block,
                   forward_grid=forward_grid,
                   forward_rows_per_group=forward_rows_per_group,
                   ).with_strip(rows_per_group)


def _check_param(p, name: str, D: int, dtype: np.dtype) -> None:
    if tuple(p.shape) != (D,):
        raise ValueError(
            f"{name} must have shape (D,) = ({D},) to match x; got {tuple(p.shape)}."
        )
    if np.dtype(p.dtype) != dtype:
        raise TypeError(
            f"{name} must have the dtype of x ({dtype}); got {p.dtype}. "
            f"Convert it with {name}.astype(x.dtype)."
        )


def check_forward_args(x, gamma, beta, eps: float = 1e-5, *,
                       rung: str = "v4") -> LaunchPlan:
    """Validate the forward's arguments (NumPy or CuPy arrays) and return their plan."""
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
    return plan(math.prod(x.shape[:-1]), D, dtype, rung)


def check_backward_args(dy, x, gamma, mean_hi, mean_lo, rstd,
                        rung: str = "v4",
                        rows_per_group: int | None = None) -> LaunchPlan:
    """Validate the backward's arguments and return their plan (and strip)."""
    p = check_forward_args(x, gamma, gamma)
    if rung != p.rung:
        p = plan(p.rows, p.D, p.dtype, rung)
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(
            f"dy must have the shape of x, {tuple(x.shape)}; got {tuple(dy.shape)}."
        )
    if np.dtype(dy.dtype) != p.dtype:
        raise TypeError(f"dy must have the dtype of x ({p.dtype}); got {dy.dtype}.")
    for name, s in (("mean_hi", mean_hi), ("mean_lo", mean_lo), ("rstd", rstd)):
        if tuple(s.shape) != tuple(x.shape[:-1]):
            raise ValueError(
                f"{name} must have shape x.shape[:-1] = {tuple(x.shape[:-1])}, as the "
                f"forward returns it; got {tuple(s.shape)}."
            )
        if np.dtype(s.dtype) != np.float32:
            raise TypeError(
                f"{name} must be float32, as the forward returns it; got {s.dtype}."
            )
    return p if rows_per_group is None else p.with_strip(rows_per_group)
