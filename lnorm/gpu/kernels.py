r"""The CUDA sources, their launch plan, and NVRTC compilation to PTX.

Nothing here needs a GPU or a CUDA driver: the sources are text files next to
this module, the launch plan is arithmetic, and
:func:`lnorm.gpu.kernels.compile_ptx` calls NVRTC through
``cupy.cuda.nvrtc``, which runs on the CPU. The chapter "One kernel: fused layer
norm on the GPU" explains the kernels and their plan.

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
    "SOURCE_DIR",
    "KERNEL_FILES",
    "REGISTER_FILES",
    "LONG_FILE",
    "MAX_ROW",
    "COMPILE_OPTIONS",
    "ARCHS",
    "MIN_ROWS_PER_GROUP",
    "MAX_ROW_GROUPS",
    "RUNGS",
    "BACKWARD_KERNELS",
    "FORWARD_KERNELS",
    "PARTIALS_BUDGET",
    "WAVE_THREADS",
    "CLUSTER_WAVES",
    "wave_blocks",
    "constants",
    "source",
    "kernel_params",
    "compile_ptx",
    "compile_binary",
    "LaunchPlan",
    "plan",
    "max_D",
    "max_D_block",
    "cluster_blocks",
    "rungs_for",
    "check_forward_args",
    "check_backward_args",
]

#: The directory of the ``.cu`` files — this package's own.
SOURCE_DIR = Path(__file__).resolve().parent
COMMON_FILE = "layernorm_common.cu"
#: The file of the kernels for rows longer than registers hold.
LONG_FILE = "layernorm_long.cu"
#: The kernel files, each compiled as one NVRTC program.
KERNEL_FILES = ("layernorm_forward.cu", "layernorm_backward.cu", LONG_FILE)
#: The files of the kernels that hold a row in registers (``D <= max_D()``);
#: ``layernorm_long.cu`` has those of longer rows.
REGISTER_FILES = KERNEL_FILES[:2]
#: The longest row any kernel takes: ``D`` is passed as a 32-bit int.
MAX_ROW = 2**31 - 1
#: ``--fmad=false`` — no multiply-add contraction, and ``-ftz=false``: subnormal
#: numbers kept, so every float32 operation rounds exactly as NumPy's does in
#: :mod:`lnorm.gpu.emulate`. The kernels are memory-bound: the extra
#: instructions cost no time.
COMPILE_OPTIONS = ("--fmad=false", "-ftz=false", "-std=c++17")
#: Architectures the PTX is generated and inspected for (A100, H100).
ARCHS = ("sm_80", "sm_90")
#: Backward — every row group takes a strip of at least this many rows (the
#: last strip may be shorter), so the (row_groups, D) float32 partial sums of
#: dgamma and dbeta (written once, read once) add about 2 * 2 * 4 / 16 = 1 byte
#: per element to the traffic at most
#: (:attr:`lnorm.gpu.kernels.LaunchPlan.partials_bytes`); and there are at
#: most MAX_ROW_GROUPS row groups.
MIN_ROWS_PER_GROUP = 16
#: Backward — the most row groups (warps or blocks) a launch of the register
#: kernels has. (The long-row backward has strips of ``LN_LONG_STRIP`` rows,
#: as many as that takes.)
MAX_ROW_GROUPS = 4096

#: The backward's rungs that are ``.cu`` kernels (the GPU chapter's ladder): ``"v3"``
#: adds the column sums into dgamma and dbeta with atomics (one launch, not
#: deterministic); ``"v4"``, the default, writes one partial row per row
#: group and sums them in a fixed order; ``"v5"`` adds the column sums of the
#: row groups of a block in shared memory first, one partial row per block,
#: and prefetches the next row into shared memory. The forward of v3 and v4
#: is the same kernel; v5's takes strips of its own and prefetch (the same
#: bits).
RUNGS = ("v3", "v4", "v5")
#: v5 — its strips are the shortest (1 row, or LN_LONG_STRIP past ``max_D()``,
#: doubled) whose partial sums
#: stay within this fraction of the bytes the backward must move (a block
#: writes one partial row, so v4's floor of MIN_ROWS_PER_GROUP is not
#: needed; on an H100 and an H200 the floor left half the SMs idle at
#: 8192 x 768)...
PARTIALS_BUDGET = 0.05
#: ... and are lengthened further to the shortest that fits the launch in one
#: wave of this many threads: 128 SMs holding 512 threads each (at the
#: registers these kernels use, an H100's 132 SMs hold 512 threads each, one
#: block of 384 or 480). Each strip pays a latency to fill its prefetch
#: pipeline and a partial row to write, so fewer, longer strips are cheaper
#: as long as every SM has a block; and a second, partial wave of blocks
#: would leave most SMs idle while it runs. A constant, not the device's SM
#: count: the plan, and so every bit of the result, stays the same on every
#: GPU. (:func:`lnorm.gpu.kernels.wave_blocks` has the blocks.)
WAVE_THREADS = 128 * 512
# v5's forward takes strips of its own (its bits do not depend on them): the
# shortest, from one row, that fit its launch in one wave
# of ``128 * LN_FWD_THREADS_PER_SM`` threads for its kernels of 16-byte
# vectors in registers (``__launch_bounds__`` holds them to 64 registers a
# thread, so that an SM holds 1024 of their threads, twice the backward's),
# of WAVE_THREADS for its others.

#: v5's clusters of blocks (rows past :func:`lnorm.gpu.kernels.max_D_block`)
#: take strips for this many waves of clusters, not one: a cluster's blocks
#: must run at once on one GPC (a group of SMs), so a GPU may hold fewer
#: clusters at once than its SMs suggest, and one wave of them can leave a
#: tail of clusters for a second wave. In exploratory runs on an H200
#: (2026-11-26, not kept as data: book/data/gpu/clusters/ has the four-wave
#: plan), the float32 backward with clusters of 8 ran well below the same
#: with four times the clusters, and with clusters of 2 a little above. On
#: an H100 (2026-11-27, ``strip_sweep`` in clusters/h100-2026-11-27.json),
#: 2 to 30 times the plan's clusters gained at most 0.06 of the copy
#: bandwidth at any long shape, and the most clusters lost up to 0.22 in the
#: backward. Still a constant: the plan does not ask the device.
CLUSTER_WAVES = 4

_STORAGE = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
#: The name of each rung's backward kernels, ``ln_<name>_{warp|block}_...``;
#: also the key of its registers in :data:`lnorm.gpu.model.REGISTERS`.
BACKWARD_KERNELS = {"v3": "bwd_atomic", "v4": "bwd", "v5": "bwd_grouped"}
#: The name of each rung's forward kernels, likewise.
FORWARD_KERNELS = {"v3": "fwd", "v4": "fwd", "v5": "fwd_grouped"}
_MAX_VEC = {np.dtype(np.float32): 4, np.dtype(np.float16): 8}


def _read(name: str) -> str:
    return (SOURCE_DIR / name).read_text()


def constants() -> dict[str, int]:
    r"""Read the ``#define LN_* <int>`` launch constants of the CUDA sources.

    Those of ``layernorm_common.cu``, then those of ``layernorm_long.cu``.

    Read from the CUDA source, so the launcher and the emulation use exactly
    the values the kernels were compiled with.

    Returns
    -------
    dict of str to int
        ``{"LN_ELEMS_PER_THREAD": 16, ...}``, in the order of the sources:
        row elements per thread, rows per block of the warp-per-row kernels,
        the largest block, threads per column of the dgamma/dbeta reduction
        (v4's; v5's, with the loads each of its threads keeps in flight), the
        rows v5's forward and backward keep in flight, the row elements a
        thread of v5's long-row kernels takes, the most blocks of v5's
        clusters and the shared memory their row sums take, and rows per
        strip of v4's long-row backward.

    See Also
    --------
    lnorm.gpu.kernels.plan : The launch these constants shape.
    lnorm.gpu.kernels.max_D : The longest row they allow.

    Examples
    --------
    >>> for name, value in constants().items():
    ...     print(name, value)
    LN_ELEMS_PER_THREAD 16
    LN_WARPS_PER_BLOCK 4
    LN_MAX_ROW_THREADS 512
    LN_REDUCE_SLICES 8
    LN_REDUCE_SLICES_WIDE 32
    LN_REDUCE_BATCH 8
    LN_FWD_ROWS_IN_FLIGHT 3
    LN_FWD_THREADS_PER_SM 1024
    LN_BWD_ROWS_IN_FLIGHT 2
    LN_BWD_WARP_ROWS_IN_FLIGHT_F32 3
    LN_BWD_WARP_ROWS_IN_FLIGHT_F16 4
    LN_CLUSTER_PART_ROWS_MORE 1
    LN_LONG_ELEMS_PER_THREAD 24
    LN_MAX_CLUSTER 8
    LN_CLUSTER_SCRATCH_BYTES 256
    LN_LONG_STRIP 16
    """
    return dict(_constants())


@functools.cache
def _constants() -> tuple[tuple[str, int], ...]:
    # Cached: the launch path asks for these on every call, and the file does
    # not change.
    text = _read(COMMON_FILE) + _read(LONG_FILE)
    found = re.findall(r"^#define\s+(LN_\w+)\s+(\d+)\b", text, re.M)
    return tuple((name, int(value)) for name, value in found)


def source(filename: str) -> str:
    r"""Return the full source of one kernel file, its common header inlined.

    The file's ``#include "layernorm_common.cu"`` is replaced by that file's
    text. One string is what NVRTC and ``cupy.RawModule`` compile, with no
    include path, and what the PTX inspection describes.

    Parameters
    ----------
    filename : str
        One of :data:`lnorm.gpu.kernels.KERNEL_FILES`.

    Returns
    -------
    str
        The CUDA C++ source, ready to compile on its own.

    Raises
    ------
    ValueError
        If ``filename`` is not a kernel file, or does not include the common
        file.

    See Also
    --------
    lnorm.gpu.kernels.compile_ptx : Compile this source to PTX.
    lnorm.gpu.kernels.kernel_params : The kernels it defines.

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
    text = _read(filename)
    if include not in text:
        raise ValueError(f"{filename} does not include {COMMON_FILE}.")
    return text.replace(include, _read(COMMON_FILE))


def kernel_params(filename: str) -> dict[str, tuple[str, ...]]:
    r"""Read the parameter names of every ``extern "C"`` kernel in a file, in order.

    Kernels are written either directly (``extern "C" __global__ ...
    name(...)``) or, one per variant, by a macro ``#define M(SUFFIX, ...)``
    declaring ``prefix##SUFFIX(...)``, or forwarding to such a macro, and
    expanded by a list of variants, ``LN_VARIANTS(M)``,
    ``LN_LONG_VARIANTS(M)``, ``LN_LONG_VECTOR_VARIANTS(M)``,
    ``LN_GROUPED_VARIANTS(M)`` or ``LN_CLUSTER_VARIANTS(M)``; all are read
    (the kernels of clusters too, which a GPU before sm_90 does not have).

    Parameters
    ----------
    filename : str
        One of :data:`lnorm.gpu.kernels.KERNEL_FILES`.

    Returns
    -------
    dict of str to tuple of str
        ``{kernel name: argument names}``: the variants of the main kernel
        first (``ln_fwd_warp_f32_v4``, ...), then any kernel written directly.

    Raises
    ------
    ValueError
        If ``filename`` is not a kernel file (from
        :func:`lnorm.gpu.kernels.source`).

    See Also
    --------
    lnorm.gpu.ptx.inspect_ptx : Names PTX arguments with these.

    Examples
    --------
    >>> params = kernel_params("layernorm_backward.cu")
    >>> len(params), params["ln_bwd_reduce_params"]
    (45, ('dgamma_part', 'dbeta_part', 'row_groups', 'D', 'dgamma', 'dbeta'))
    >>> kernel_params("layernorm_forward.cu")["ln_fwd_warp_f16_v8"][:4]
    ('x', 'gamma', 'beta', 'y')
    """
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
    # A macro that only forwards to another one (fixing an argument of it).
    forwards = dict(re.findall(
        r"^#define\s+(\w+)\(SUFFIX[^)]*\)\s+(\w+)\(SUFFIX\b", text, re.M))
    for name, macro in re.findall(r"^(LN_\w*VARIANTS)\((\w+)\)", text, re.M):
        while macro in forwards:  # to the macro that declares the kernel
            macro = forwards[macro]
        prefix, params = made[macro]
        out.update({prefix + suffix: names(params) for suffix in lists[name]})
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

    Parameters
    ----------
    filename : str
        One of :data:`lnorm.gpu.kernels.KERNEL_FILES`.
    arch : str, default "sm_90"
        Target, as ``"sm_XY"``; the PTX is generated for ``compute_XY``.

    Returns
    -------
    str
        The PTX text.

    Raises
    ------
    ValueError
        If ``filename`` is not a kernel file or ``arch`` is not ``"sm_XY"``.
    RuntimeError
        If CuPy's NVRTC binding cannot be loaded, or compilation fails (the
        NVRTC log is in the message).

    See Also
    --------
    lnorm.gpu.ptx.inspect_ptx : Read the PTX: loads, stores, shuffles.
    lnorm.gpu.kernels.compile_binary : The binary a GPU loads.

    Examples
    --------
    >>> ptx = compile_ptx("layernorm_forward.cu")
    >>> ".target sm_90" in ptx, ".visible .entry ln_fwd_block_f16_v8(" in ptx
    (True, True)
    """
    ptx = _compile(filename, arch, "ptx")
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def compile_binary(filename: str, compute_capability: int) -> tuple[bytes, str]:
    r"""Compile one kernel file for a device: a cubin if NVRTC knows it, else PTX.

    This is what :class:`lnorm.gpu.run.FusedLayerNorm` loads: the same source
    and :data:`lnorm.gpu.kernels.COMPILE_OPTIONS` as
    :func:`lnorm.gpu.kernels.compile_ptx`. (Compiling through
    ``cupy.RawModule(code=...)`` instead would append ``-ftz=true``, flushing
    subnormal numbers to zero, unlike NumPy.) NVRTC runs on the CPU: no GPU is
    needed to compile.

    Parameters
    ----------
    filename : str
        One of :data:`lnorm.gpu.kernels.KERNEL_FILES`.
    compute_capability : int
        The device's, e.g. 90 for an H100.

    Returns
    -------
    binary : bytes
        The compiled module.
    kind : str
        ``"cubin"``, or ``"ptx"`` for a device newer than this NVRTC: PTX for
        the newest architecture NVRTC knows, which the driver compiles on
        loading.

    Raises
    ------
    RuntimeError
        If NVRTC cannot be loaded, knows no architecture up to
        ``compute_capability``, or fails to compile.

    See Also
    --------
    lnorm.gpu.run.FusedLayerNorm : Loads the result on a GPU.

    Examples
    --------
    >>> binary, kind = compile_binary("layernorm_forward.cu", 90)
    >>> kind, binary[:4]
    ('cubin', b'\x7fELF')
    """
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
    r"""How the kernels are launched for ``rows`` rows of length ``D``.

    Made by :func:`lnorm.gpu.kernels.plan`. The plan depends on
    ``(rows, D, dtype)`` only, never on the device: the order of every
    floating-point sum, hence every bit of the result, is the same on any
    GPU.

    Attributes
    ----------
    rows, D : int
        Rows (the product of the leading axes) and row length.
    dtype : numpy.dtype
        Storage type of ``x``, ``dy``, ``gamma``, ``beta``, ``y``, ``dx``.
    vec : int
        Elements per 16-byte vector load: 4 (float32) or 8 (float16) when
        ``D`` is a multiple of it, or for v5's rows of any D (``aligned``
        False), else 1.
    per_block : bool
        One row per block (rows longer than a warp holds) rather than one row
        per warp.
    chunks : int
        Chunks of ``block * LN_ELEMS_PER_THREAD`` elements a row is taken in:
        1 for the kernels that hold the row in registers (``D <= max_D()``),
        more for the long-row kernels of ``layernorm_long.cu``, which walk the
        row chunk by chunk and read it again for every pass over it (four in
        the forward, two in the backward). For v5's clusters, the slices of
        the row, one a block (``cluster`` rounds it up).
    threads_per_row : int
        32 for a warp, else the block size (v5's clusters: of each block,
        which holds one slice).
    block : int
        Threads per block.
    forward_grid : int
        Blocks of the forward launch.
    row_groups, rows_per_group : int
        Backward: the number of row groups (warps or blocks) and the strip of
        consecutive rows each takes.
    backward_grid : int
        Blocks of the backward launch.
    rung : {"v4", "v3", "v5"}, default "v4"
        The backward kernel (:data:`lnorm.gpu.kernels.RUNGS`).
    backward_block : int, default 0
        Threads per block of the backward launch, if not ``block``: v5 puts
        several row groups in a block.
    forward_rows_per_group : int, default 0
        v5: the strip of each row group of the forward, which is launched in
        the backward's blocks (0 for the other rungs, whose forward takes a
        row per group).
    cluster : int, default 1
        v5, rows past ``LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS``: the
        blocks of a thread block cluster that together hold a row, 2, 4 or 8
        (the power of two that covers ``chunks`` slices of ``max_D()``
        elements); a row group is then a cluster, and the grids count its
        blocks. 1 for every other plan.
    aligned : bool, default True
        Every row starts on a vector (``D`` a multiple of ``vec``, or
        ``vec == 1``). False for v5's kernels of rows of any D past what a
        warp holds (``32 * LN_ELEMS_PER_THREAD < D <= max_D("v5")``): the
        vector kernels' columns and order, the row's last vector a tail of
        ``D % vec`` elements, each row's vectors moved in 16 or 4 bytes as
        its start allows (``ln_*_grouped_{block|long|cluster<C>}_*_any``),
        or for float16 rows of odd ``D`` in 16, 4 and 2
        (``ln_*_grouped_{block|cluster<C>}_f16_odd``, :attr:`starts_on_2`).
    any_d : bool, default False
        v5's kernels of rows of any D take the rows (``*_any``, ``*_odd``):
        where ``aligned`` is False, and for float16 rows of 16-byte vectors
        that fill a cluster's slices only in part (``D < cluster *
        max_D()``), for the row more those kernels keep in flight
        (:meth:`rows_in_flight`).

    See Also
    --------
    lnorm.gpu.kernels.plan : Makes the plan.
    lnorm.gpu.emulate.row_sum : Sums a row in the order the plan implies.

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
    cluster: int = 1
    aligned: bool = True
    any_d: bool = False

    @property
    def groups_per_block(self) -> int:
        r"""Backward: row groups in one block (a group is ``threads_per_row`` threads).

        Returns
        -------
        int
            ``backward_block // threads_per_row`` (or ``block // ...``).

        Examples
        --------
        >>> plan(8192, 1024, "float32").groups_per_block  # 64 threads a row
        1
        >>> plan(8192, 1024, "float32", rung="v5").groups_per_block
        8
        """
        return (self.backward_block or self.block) // self.threads_per_row

    def with_strip(self, rows_per_group: int) -> LaunchPlan:
        r"""Return this plan with backward strips of ``rows_per_group`` rows.

        The row groups, the backward's grid and the partial rows follow the
        strip: ``row_groups = ceil(rows / rows_per_group)``, the groups in
        blocks of :attr:`groups_per_block` (clusters: ``cluster`` blocks a
        group). The kernels take any strip; the bits of ``dgamma`` and
        ``dbeta`` follow it (the order of the column sums), ``dx``'s do not.
        For designs the plan does not choose (:func:`lnorm.gpu.model.predict`),
        and for tests that want strips of several rows where the plan's are
        of one.

        Parameters
        ----------
        rows_per_group : int
            Rows of each strip, at least 1.

        Returns
        -------
        LaunchPlan
            A copy; ``self`` is unchanged.

        Raises
        ------
        ValueError
            ``rows_per_group`` below 1.

        Examples
        --------
        >>> p = plan(2048, 16384, "float16", "v5")  # strips of 32: 64 clusters
        >>> p.rows_per_group, p.partial_rows
        (32, 64)
        >>> q = p.with_strip(64)
        >>> q.rows_per_group, q.row_groups, q.backward_grid, q.partial_rows
        (64, 32, 64, 32)
        """
        rows_per_group = int(rows_per_group)
        if rows_per_group < 1:
            raise ValueError(f"rows_per_group must be >= 1; got {rows_per_group}.")
        groups = math.ceil(self.rows / rows_per_group)
        return replace(self, rows_per_group=rows_per_group, row_groups=groups,
                       backward_grid=self.cluster * math.ceil(
                           groups / self.groups_per_block))

    @property
    def partial_rows(self) -> int:
        r"""Backward: rows of the float32 partial-sum buffers.

        One per row group (v4), one per block (v5; one per cluster of
        blocks), none (v3, whose groups add into dgamma and dbeta directly).

        Returns
        -------
        int
            The first dimension of the ``(partial_rows, D)`` buffers.

        Examples
        --------
        >>> [plan(8192, 4096, "float16", rung=r).partial_rows for r in RUNGS]
        [0, 512, 128]
        """
        return {"v3": 0, "v4": self.row_groups,
                "v5": self.backward_grid // self.cluster}[self.rung]

    @property
    def starts_on_2(self) -> bool:
        r"""Whether rows start on 2 bytes every other row: v5's float16 rows of odd D.

        Row ``r`` starts ``r * D`` elements past the (aligned) base. v5's
        kernels of such rows (``ln_*_grouped_*_f16_odd``) copy the words
        around a vector that starts on 2 bytes into its 16-byte prefetch slot
        and a word after it, and take 20 bytes of shared memory a vector
        where the others take 16.

        Returns
        -------
        bool
            True for a plan of v5's vectors (``vec > 1``) in float16 of odd
            ``D``.

        Examples
        --------
        >>> plan(64, 4097, "float16", "v5").starts_on_2
        True
        >>> plan(64, 4097, "float16").starts_on_2  # v4: scalars
        False
        """
        return self.vec > 1 and self.D * self.dtype.itemsize % 4 != 0

    @property
    def partials_bytes(self) -> int:
        r"""Backward: bytes of the float32 partial sums of dgamma and dbeta.

        Two buffers of ``partial_rows * D`` float32 values, each written once
        by the backward kernel and read once by the reduction:
        ``2 * 2 * 4 * partial_rows * D``.

        Returns
        -------
        int
            Bytes moved through the ``(partial_rows, D)`` buffers.

        See Also
        --------
        lnorm.gpu.kernels.MIN_ROWS_PER_GROUP : Bounds these bytes per element.

        Examples
        --------
        >>> p = plan(8192, 4096, "float16")
        >>> p.partials_bytes, p.partials_bytes / (p.rows * p.D)
        (33554432, 1.0)
        """
        return 2 * 2 * 4 * self.partial_rows * self.D

    @property
    def backward_shared_bytes(self) -> int:
        r"""Backward: bytes of dynamic shared memory per block of the launch.

        v5's kernels of 16-byte vectors prefetch the next rows of ``x`` and
        ``dy`` into shared memory, one buffer per row in flight
        (:meth:`rows_in_flight`): ``rows_in_flight * 2 * 16 *
        (LN_ELEMS_PER_THREAD / vec)`` bytes per thread
        (``LN_LONG_ELEMS_PER_THREAD`` past ``max_D()`` but for clusters; 20
        bytes a vector where rows start on 2 bytes, :attr:`starts_on_2`),
        and a cluster's blocks ``LN_CLUSTER_SCRATCH_BYTES`` more for the row
        sums they exchange. The other kernels take none.

        Returns
        -------
        int
            The launch's ``shared_mem``.

        See Also
        --------
        lnorm.gpu.model.occupancy : Counts it against the SM's shared memory.

        Examples
        --------
        >>> plan(8192, 4096, "float32", rung="v5").backward_shared_bytes  # 512 x 256
        131072
        >>> plan(8192, 4096, "float16", rung="v5").backward_shared_bytes  # 512 x 128
        65536
        >>> plan(8192, 4096, "float32").backward_shared_bytes  # v4: none
        0
        >>> plan(64, 7, "float32", rung="v5").backward_shared_bytes  # scalars: none
        0
        >>> plan(10**6, 64, "float16", rung="v5").backward_shared_bytes  # 128 x 4 x 64
        32768
        >>> plan(64, 65536, "float32", rung="v5").backward_shared_bytes  # + 256
        131328
        >>> plan(64, 4097, "float16", rung="v5").backward_shared_bytes  # 288 x 160
        46080
        """
        return self._prefetch_bytes("backward", tensors=2)

    @property
    def forward_shared_bytes(self) -> int:
        r"""Forward: bytes of dynamic shared memory per block of the launch.

        v5's forward kernels of 16-byte vectors prefetch the next rows of
        ``x``, one buffer per row in flight: ``LN_FWD_ROWS_IN_FLIGHT * 16 *
        (LN_ELEMS_PER_THREAD / vec)`` bytes per thread
        (``LN_LONG_ELEMS_PER_THREAD`` past ``max_D()`` but for clusters),
        and a cluster's blocks ``LN_CLUSTER_SCRATCH_BYTES`` more. The other
        kernels take none.

        Returns
        -------
        int
            The launch's ``shared_mem``.

        Examples
        --------
        >>> plan(8192, 4096, "float32", rung="v5").forward_shared_bytes  # 512 x 192
        98304
        >>> plan(8192, 4096, "float32").forward_shared_bytes
        0
        """
        return self._prefetch_bytes("forward", tensors=1)

    def rows_in_flight(self, direction: str) -> int:
        r"""Rows whose loads a row group of the kernel keeps in flight.

        v5's kernels of 16-byte vectors prefetch: ``LN_FWD_ROWS_IN_FLIGHT``
        rows in the forward, ``LN_BWD_ROWS_IN_FLIGHT`` in the backward (and
        ``LN_BWD_WARP_ROWS_IN_FLIGHT_F32`` or ``_F16`` where a warp holds a
        row: short rows, so more of them keep as many bytes in flight), one
        shared-memory buffer each; float16 clusters of a tail (``any_d``:
        rows that fill their slices in part, so a thread holds fewer
        bytes of a row) ``LN_CLUSTER_PART_ROWS_MORE`` more. The other
        kernels load one row at a time.

        Parameters
        ----------
        direction : {"forward", "backward"}
            Which kernel.

        Returns
        -------
        int
            1 for the kernels that do not prefetch.

        See Also
        --------
        lnorm.gpu.model.predict : Its default ``rows_in_flight``.

        Examples
        --------
        >>> p = plan(8192, 1024, "float16", "v5")
        >>> p.rows_in_flight("forward"), p.rows_in_flight("backward")
        (3, 2)
        >>> plan(8192, 1024, "float16").rows_in_flight("forward")
        1
        >>> plan(10**6, 64, "float16", "v5").rows_in_flight("backward")  # warps
        4
        >>> p = plan(8192, 20000, "float16", "v5")  # 4 slices, the last empty
        >>> p.cluster, p.aligned, p.any_d
        (4, True, True)
        >>> p.rows_in_flight("forward"), p.rows_in_flight("backward")
        (4, 3)
        >>> plan(8192, 20001, "float16", "v5").rows_in_flight("forward")  # odd D
        4
        """
        if self.rung != "v5" or self.vec == 1:
            return 1
        c = constants()
        if direction == "forward":
            key = "LN_FWD_ROWS_IN_FLIGHT"
        elif self.per_block:
            key = "LN_BWD_ROWS_IN_FLIGHT"
        else:
            key = f"LN_BWD_WARP_ROWS_IN_FLIGHT_{_STORAGE[self.dtype].upper()}"
        more = self.cluster > 1 and self.dtype == np.float16 and self.any_d
        return c[key] + (c["LN_CLUSTER_PART_ROWS_MORE"] if more else 0)

    def _prefetch_bytes(self, direction: str, tensors: int) -> int:
        k = self.rows_in_flight(direction)
        if k == 1:
            return 0
        c = constants()
        per_thread = "LN_LONG_ELEMS_PER_THREAD" if (
            self.chunks > 1 and self.cluster == 1) else "LN_ELEMS_PER_THREAD"
        vectors = c[per_thread] // self.vec
        # 16 bytes a vector, and half_odd's word after it (odd_word)
        slot = 20 if self.starts_on_2 else 16
        scratch = c["LN_CLUSTER_SCRATCH_BYTES"] if self.cluster > 1 else 0
        return (k * tensors * slot * vectors * (self.backward_block or self.block)
                + scratch)

    def forward_launch(self, eps: float) -> tuple[str, tuple, tuple, tuple]:
        r"""Return the forward kernel's launch: name, grid, block, trailing arguments.

        The arguments follow the arrays (``x, gamma, beta, y, mean_hi,
        mean_lo, rstd``): ``rows, D`` (``np.int32``) and ``eps``
        (``np.float32``), and for v5 ``rows_per_group, group_threads``.
        v5's forward is launched in the backward's blocks, with strips of
        its own (``forward_rows_per_group``).

        Parameters
        ----------
        eps : float
            Added to the variance.

        Returns
        -------
        tuple
            ``(kernel, (grid,), (block,), args)``.

        See Also
        --------
        lnorm.gpu.kernels.LaunchPlan.backward_launch : The backward's.

        Examples
        --------
        >>> p = plan(8192, 4096, "float16", "v5")
        >>> name, grid, block, args = p.forward_launch(1e-5)
        >>> name, grid, block  # two blocks an SM: 256 blocks in one wave
        ('ln_fwd_grouped_block_f16_v8', (256,), (512,))
        >>> [a.item() for a in args]  # doctest: +ELLIPSIS
        [8192, 4096, 9.99...e-06, 16, 256]
        >>> plan(8192, 4096, "float16").forward_launch(1e-5)[:3]
        ('ln_fwd_block_f16_v8', (8192,), (256,))
        """
        ints = (np.int32(self.rows), np.int32(self.D))
        if self.rung != "v5":
            return (self.kernel("forward"), (self.forward_grid,), (self.block,),
                    (*ints, np.float32(eps)))
        return (self.kernel("forward"), (self.forward_grid,),
                (self.backward_block or self.block,),
                (*ints, np.float32(eps), np.int32(self.forward_rows_per_group),
                 np.int32(self.threads_per_row)))

    @property
    def vecs_per_thread(self) -> int:
        r"""Vectors (loads) per thread per row: ``chunks * LN_ELEMS_PER_THREAD / vec``.

        Returns
        -------
        int
            How many ``vec``-element loads each thread makes of a row, in one
            pass over it (v5's clusters: of its block's slice,
            ``LN_ELEMS_PER_THREAD / vec``).

        See Also
        --------
        lnorm.gpu.kernels.constants : ``LN_ELEMS_PER_THREAD``.

        Examples
        --------
        >>> plan(8192, 4096, "float16").vecs_per_thread  # 16 elements, 8 per load
        2
        >>> plan(64, 7, "float32").vecs_per_thread  # D not a multiple of 4: scalars
        16
        >>> plan(8, 12288, "float32").vecs_per_thread  # two chunks of four vectors
        8
        >>> plan(8, 65536, "float32", "v5").vecs_per_thread  # of its block's slice
        4
        """
        per_thread = constants()["LN_ELEMS_PER_THREAD"] // self.vec
        return per_thread if self.cluster > 1 else self.chunks * per_thread

    def backward_launch(self) -> tuple[str, tuple, tuple, tuple]:
        r"""Return the backward kernel's launch: name, grid, block, integer arguments.

        The integer arguments follow the arrays (``dy, x, gamma, mean_hi,
        mean_lo, rstd, dx`` and the two outputs: the partial buffers, or for
        v3 ``dgamma`` and ``dbeta``): ``rows, D, rows_per_group`` and
        ``row_groups`` (v3, v4) or ``group_threads`` (v5), as ``np.int32``.

        Returns
        -------
        tuple
            ``(kernel, (grid,), (block,), ints)``.

        See Also
        --------
        lnorm.gpu.run.FusedLayerNorm.backward : Launches it on a GPU.
        lnorm.gpu.host.HostLayerNorm.backward : Launches it on the CPU.

        Examples
        --------
        >>> p = plan(8192, 4096, "float16", "v5")
        >>> name, grid, block, ints = p.backward_launch()
        >>> name, grid, block, [int(i) for i in ints]
        ('ln_bwd_grouped_block_f16_v8', (128,), (512,), [8192, 4096, 32, 256])
        """
        last = self.threads_per_row if self.rung == "v5" else self.row_groups
        ints = tuple(np.int32(i) for i in (self.rows, self.D, self.rows_per_group,
                                            last))
        return (self.kernel("backward"), (self.backward_grid,),
                (self.backward_block or self.block,), ints)

    def reduce_launch(self) -> tuple[str, tuple, tuple]:
        r"""Return the second stage's launch (v4, v5): name, grid, block.

        Its arguments are ``dgamma_part, dbeta_part``, ``partial_rows`` and
        ``D`` (``np.int32``), ``dgamma, dbeta``. v4's kernel has
        ``LN_REDUCE_SLICES`` threads per column; v5's
        (``ln_bwd_reduce_params_wide``) ``LN_REDUCE_SLICES_WIDE``, each with
        ``LN_REDUCE_BATCH`` loads in flight.

        Returns
        -------
        tuple
            ``(kernel, (grid,), (32, slices))``: 32 columns a block.

        See Also
        --------
        lnorm.gpu.emulate.reduce_partials : The order of its sums.

        Examples
        --------
        >>> plan(8192, 4096, "float32").reduce_launch()
        ('ln_bwd_reduce_params', (128,), (32, 8))
        >>> plan(8192, 4096, "float32", "v5").reduce_launch()
        ('ln_bwd_reduce_params_wide', (128,), (32, 32))
        """
        wide = self.rung == "v5"
        slices = constants()["LN_REDUCE_SLICES_WIDE" if wide else "LN_REDUCE_SLICES"]
        name = "ln_bwd_reduce_params" + ("_wide" if wide else "")
        return name, (math.ceil(self.D / 32),), (32, slices)

    def kernel(self, direction: str) -> str:
        r"""Return the name of the forward or backward kernel this plan launches.

        The name is ``ln_{fwd|bwd}_{warp|block|long}_{f32|f16}_v{vec}``; the
        backward of v3 is ``ln_bwd_atomic_...``; v5's are ``ln_bwd_grouped_...``
        and ``ln_fwd_grouped_...``.

        Parameters
        ----------
        direction : {"forward", "backward"}
            Which pass.

        Returns
        -------
        str
            A kernel of :func:`lnorm.gpu.kernels.kernel_params`.

        Raises
        ------
        ValueError
            If ``direction`` is neither ``"forward"`` nor ``"backward"``.

        See Also
        --------
        lnorm.gpu.kernels.kernel_params : Every kernel and its arguments.

        Examples
        --------
        >>> plan(64, 7, "float32").kernel("backward")
        'ln_bwd_warp_f32_v1'
        >>> plan(24, 8192, "float16").kernel("forward")
        'ln_fwd_block_f16_v8'
        >>> plan(24, 12288, "float16").kernel("backward")
        'ln_bwd_long_f16_v8'
        >>> plan(64, 7, "float32", rung="v3").kernel("backward")
        'ln_bwd_atomic_warp_f32_v1'
        >>> plan(64, 4096, "float16", rung="v5").kernel("forward")
        'ln_fwd_grouped_block_f16_v8'
        >>> plan(64, 4100, "float16", rung="v5").kernel("forward")  # a tail
        'ln_fwd_grouped_block_f16_any'
        >>> plan(64, 65536, "float16", rung="v5").kernel("backward")
        'ln_bwd_grouped_cluster8_f16_v8'
        """
        if direction not in ("forward", "backward"):
            raise ValueError(
                f"direction must be 'forward' or 'backward'; got {direction!r}."
            )
        kind = (FORWARD_KERNELS if direction == "forward" else BACKWARD_KERNELS)[
            self.rung]
        mapping = (f"cluster{self.cluster}" if self.cluster > 1 else "long"
                   if self.chunks > 1 else "block" if self.per_block else "warp")
        loads = ("odd" if self.starts_on_2 else "any") if self.any_d else f"v{self.vec}"
        return f"ln_{kind}_{mapping}_{_STORAGE[self.dtype]}_{loads}"


def max_D(rung: str = "v4") -> int:
    r"""Return the longest row a block holds in registers, or that v5's kernels take.

    ``max_D() = LN_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS``: elements per
    thread times the largest block. Longer rows (up to :data:`MAX_ROW`) go to
    v4's long-row kernels, which read the row from memory again for every
    pass. v5's kernels take rows of any length up to ``max_D("v5") =
    LN_MAX_CLUSTER * max_D()``: up to
    ``LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS``
    (:func:`lnorm.gpu.kernels.max_D_block`) one block
    holds the row, its backward keeping it in shared memory, where its
    prefetch put it, and reading it from there twice; past that a cluster
    of 2, 4 or 8 blocks holds it, a slice of ``max_D()`` elements each (and
    a row of a tail past ``max_D()``: see
    :func:`lnorm.gpu.kernels.plan`).

    Parameters
    ----------
    rung : {"v3", "v4", "v5"}, default "v4"
        Whose limit. (v3's is ``max_D()``.)

    Returns
    -------
    int
        The largest ``D`` whose row one block holds in registers, or (v5) the
        largest ``D`` v5's kernels take.

    Raises
    ------
    ValueError
        ``rung`` not in :data:`RUNGS`.

    See Also
    --------
    lnorm.gpu.kernels.constants : The constants.

    Examples
    --------
    >>> max_D(), max_D("v5")
    (8192, 65536)
    """
    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {RUNGS}; got {rung!r}.")
    c = constants()
    slice_ = c["LN_ELEMS_PER_THREAD"] * c["LN_MAX_ROW_THREADS"]
    return c["LN_MAX_CLUSTER"] * slice_ if rung == "v5" else slice_


def max_D_block() -> int:
    r"""Return the longest row one block of v5 holds: past it, a cluster of blocks does.

    ``LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS``. Why v5 stops at 24
    elements a thread (12288): with 32 (16384) its backward keeps gamma and
    both column sums, 96 floats, in registers, and ptxas 12.9 for sm_90 gave
    it 128 registers and 56 spill stores in float32, 20 in float16
    (2026-11-26); its forward would fit (80 and 87 registers, no spills).
    And two buffers of a float32 row outgrow shared memory there. Longer
    rows go to a cluster of blocks (``plan(...).cluster``).

    Returns
    -------
    int
        12288 with the constants of ``layernorm_common.cu``.

    See Also
    --------
    lnorm.gpu.kernels.max_D : The longest rows of each rung.

    Examples
    --------
    >>> max_D_block(), plan(8, max_D_block() + 4, "float32", "v5").cluster
    (12288, 2)
    """
    c = constants()
    return c["LN_LONG_ELEMS_PER_THREAD"] * c["LN_MAX_ROW_THREADS"]


def cluster_blocks(kernel: str) -> int:
    r"""Return the blocks of a cluster a kernel is compiled for (1: no clusters).

    v5's ``ln_{fwd|bwd}_grouped_cluster<CL>_*`` kernels fix ``CL`` with
    ``__cluster_dims__``; every other kernel runs its blocks alone.

    Parameters
    ----------
    kernel : str
        A kernel name.

    Returns
    -------
    int
        ``CL``, or 1.

    Examples
    --------
    >>> cluster_blocks("ln_bwd_grouped_cluster4_f16_v8")
    4
    >>> cluster_blocks("ln_fwd_warp_f32_v4")
    1
    """
    found = re.search(r"_cluster(\d+)_", kernel)
    return int(found.group(1)) if found else 1


def rungs_for(D: int, dtype) -> tuple[str, ...]:
    r"""Return the rungs whose kernels take rows of length ``D`` stored as ``dtype``.

    v4 takes any ``D``; v3 rows up to ``max_D()``; v5 any row up to
    ``max_D("v5")``.

    Parameters
    ----------
    D : int
        Row length, ``1 <= D <= MAX_ROW``.
    dtype : dtype-like
        float32 or float16.

    Returns
    -------
    tuple of str
        In the order of :data:`lnorm.gpu.kernels.RUNGS`.

    Raises
    ------
    ValueError, TypeError
        A ``D`` or ``dtype`` that :func:`lnorm.gpu.kernels.plan` refuses for
        every rung.

    See Also
    --------
    lnorm.gpu.kernels.plan : Refuses the others.

    Examples
    --------
    >>> rungs_for(4096, "float16"), rungs_for(12288, "float16")
    (('v3', 'v4', 'v5'), ('v4', 'v5'))
    >>> rungs_for(12292, "float32"), rungs_for(65540, "float32")
    (('v4', 'v5'), ('v4',))
    >>> rungs_for(16383, "float32"), rungs_for(16383, "float16")  # tails
    (('v4', 'v5'), ('v4', 'v5'))
    """
    plan(0, D, dtype)  # raises for a D or dtype that no rung takes
    out = []
    for rung in RUNGS:
        try:
            plan(0, D, dtype, rung)
        except ValueError:
            continue
        out.append(rung)
    return tuple(out)


def _check_dtype(dtype, name: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in _STORAGE:
        raise TypeError(
            f"{name} must be float32 or float16 for the GPU kernels; got {dtype}. "
            f"Convert it first, e.g. {name}.astype(numpy.float32)."
        )
    return dtype


def wave_blocks(block: int, threads: int = WAVE_THREADS) -> int:
    r"""Blocks of ``block`` threads in one wave of ``threads`` threads.

    ``128 * (threads // 128 // block)``: 128 SMs, each holding as many whole
    blocks as fit in its share of the threads (at least one).

    Parameters
    ----------
    block : int
        Threads per block.
    threads : int, default WAVE_THREADS
        Threads of one wave (:data:`WAVE_THREADS`, or
        ``128 * LN_FWD_THREADS_PER_SM`` for v5's forward of 16-byte vectors).

    Returns
    -------
    int
        The most blocks a launch of one wave has.

    Examples
    --------
    >>> wave_blocks(512), wave_blocks(480), wave_blocks(128)  # 512 threads an SM
    (128, 128, 512)
    >>> wave_blocks(480, 128 * 1024)  # 1024 threads an SM
    256
    """
    return 128 * max(1, threads // 128 // block)


def plan(rows: int, D: int, dtype, rung: str = "v4") -> LaunchPlan:
    r"""Plan the launches for ``rows`` rows of length ``D`` stored as ``dtype``.

    Rows of up to ``32 * LN_ELEMS_PER_THREAD`` elements get one warp each
    (``LN_WARPS_PER_BLOCK`` rows per block); longer rows get one block of the
    fewest warps that hold the row at ``LN_ELEMS_PER_THREAD`` elements per
    thread, up to ``LN_MAX_ROW_THREADS`` threads. Rows longer than that block
    holds (``D > max_D()``) get a block of ``LN_MAX_ROW_THREADS`` threads that
    takes the row in ``chunks`` chunks (the long-row kernels). The backward
    gives each row group a strip of ``rows_per_group = max(MIN_ROWS_PER_GROUP,
    ceil(rows / MAX_ROW_GROUPS))`` consecutive rows, or of ``LN_LONG_STRIP``
    rows for the long-row kernels (as many row groups as that takes).

    The backward of v5 (``rung="v5"``) puts as many row groups in a block as
    ``LN_MAX_ROW_THREADS`` threads hold (rows held by a block) or
    ``LN_WARPS_PER_BLOCK`` (rows held by a warp), and doubles the strip from
    one row (``LN_LONG_STRIP`` rows past ``max_D()``) until the partial sums,
    one row per block, are at most :data:`lnorm.gpu.kernels.PARTIALS_BUDGET`
    of the bytes the backward must move (``x`` and ``dy`` read, ``dx``
    written), then lengthens it to the shortest strip (any number of rows)
    that keeps the launch within one wave of
    :data:`lnorm.gpu.kernels.WAVE_THREADS` threads; where the budget's strip
    already leaves ``k >= 1`` whole waves of row groups and some over, to
    the shortest whose groups fit in those ``k`` waves (a last wave of a few
    groups would take as long as a full one); where the budget's strip
    leaves clusters (below) for less than one wave, to the longest whose
    groups fill it (few long rows: idle SMs would cost more than the partial
    sums, which then pass the budget). v3 has v4's strips. For
    rows past ``max_D()`` v5 has a block per row group, the row in ``chunks``
    as v4's long-row kernels take it (the same order of every sum), and takes
    rows of any length up to ``max_D("v5")``: past
    :func:`lnorm.gpu.kernels.max_D_block` a row group is a ``cluster`` of 2,
    4 or 8 blocks (``chunks`` rounded up to a power of two), block ``r``
    holding the row's slice ``r`` of ``max_D()`` elements (rows of a tail
    already past ``max_D()``, but for float16 of even ``D``: one block's
    kernel of a tail would spill there; float16 rows of 16-byte vectors that
    fill the slices only in part take the cluster's kernels of a tail,
    ``any_d``, for the row more they keep in flight). Its row sums
    then add the slices' sums in order, each summed as a row of ``max_D()``
    is: an order of its own, not v4's.

    Parameters
    ----------
    rows : int
        Number of rows, ``0 <= rows < 2**31``.
    D : int
        Row length, ``1 <= D <= MAX_ROW``.
    dtype : dtype-like
        Storage type: float32 or float16.
    rung : {"v4", "v3", "v5"}, default "v4"
        The kernels (:data:`lnorm.gpu.kernels.RUNGS`); v3 only for rows held
        in registers (``D <= max_D()``), v5 for rows up to
        ``max_D("v5")``.

    Returns
    -------
    LaunchPlan
        Grids, blocks, vector width and row groups of both passes.

    Raises
    ------
    ValueError
        ``rows < 0``, ``rows >= 2**31``, ``D < 1``, or ``D > MAX_ROW``; a rung
        not in ``RUNGS``; v3 for ``D > max_D()``; v5 for ``D > max_D("v5")``.
    TypeError
        ``dtype`` not float32 or float16.

    See Also
    --------
    lnorm.gpu.kernels.LaunchPlan : The fields.
    lnorm.gpu.kernels.check_forward_args : The plan for given arrays.

    Examples
    --------
    >>> p = plan(300, 512, "float32")  # short rows: one warp each
    >>> p.per_block, p.threads_per_row, p.block, p.forward_grid, p.vec
    (False, 32, 128, 75, 4)
    >>> p = plan(300, 513, "float32")  # longer: a block each, scalar loads
    >>> p.per_block, p.threads_per_row, p.forward_grid, p.vec
    (True, 64, 300, 1)
    >>> p.row_groups, p.rows_per_group
    (19, 16)
    >>> p = plan(300, 12288, "float32")  # longer than registers hold: in chunks
    >>> p.kernel("forward"), p.threads_per_row, p.chunks
    ('ln_fwd_long_f32_v4', 512, 2)
    >>> p = plan(8192, 4096, "float16", rung="v5")  # two groups of 256 a block
    >>> p.backward_block, p.rows_per_group, p.backward_grid, p.partial_rows
    (512, 32, 128, 128)
    >>> p = plan(8192, 12288, "float32", rung="v5")  # past registers: one group a block
    >>> p.kernel("backward"), p.backward_block, p.rows_per_group, p.backward_grid
    ('ln_bwd_grouped_long_f32_v4', 512, 64, 128)
    >>> p = plan(2048, 65536, "float32", rung="v5")  # clusters of 8 blocks
    >>> p.cluster, p.rows_per_group, p.backward_grid, p.partial_rows
    (8, 32, 512, 64)
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
    # v5 takes rows past what a warp holds of any D with 16-byte vectors and
    # a tail (float16 rows of odd D start on 2 bytes every other row)
    aligned = D % _MAX_VEC[dtype] == 0
    tail = rung == "v5" and not aligned and 32 * E < D <= max_D("v5")
    vec = _MAX_VEC[dtype] if aligned or tail else 1
    nvec = -(-D // vec)  # the tail counts as one
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
    # Strips of equal length (the last one shorter), none empty. The long-row
    # backward keeps a strip's row means in shared memory: LN_LONG_STRIP rows.
    if chunks > 1:
        rows_per_group = c["LN_LONG_STRIP"]
    else:
        rows_per_group = max(MIN_ROWS_PER_GROUP, math.ceil(rows / MAX_ROW_GROUPS))
    if rung == "v3" and chunks > 1:
        raise ValueError(
            f"rung {rung!r} has kernels for rows of at most max_D() = {max_D()}; "
            f"got D = {D}. Use rung='v4', whose long-row kernels take any D."
        )
    if rung == "v5" and D > max_D("v5"):
        raise ValueError(
            f"rung 'v5' has kernels for rows of at most max_D('v5') = "
            f"{max_D('v5')}; got D = {D}. Use rung='v4', whose long-row kernels "
            "take any D."
        )
    # v5 past one block: a cluster of blocks, a power of two, one slice each
    cluster = 1
    if rung == "v5" and (D > max_D_block() or (
            tail and chunks > 1 and (dtype == np.float32 or D % 2))):
        # (a row of a tail past max_D(), but float16 of even D: one block's
        # kernel spilled, so a cluster of two takes it)
        cluster = 1 << (chunks - 1).bit_length()
    if cluster > 1 and dtype == np.float16 and D < cluster * max_D():
        # float16 rows that fill their slices in part: the kernels of a tail,
        # which keep one more row in flight (LN_CLUSTER_PART_ROWS_MORE)
        tail = True
    groups_per_block = 1 if per_block else c["LN_WARPS_PER_BLOCK"]
    backward_block = forward_rows_per_group = 0
    if rung == "v5":
        if per_block:
            groups_per_block = c["LN_MAX_ROW_THREADS"] // threads
            backward_block = groups_per_block * threads
        if chunks == 1 or cluster > 1:  # one partial row a block (cluster): no floor
            rows_per_group = 1
        # 16 bytes per column per partial row, against 3 * itemsize per element
        while 16 / (groups_per_block * rows_per_group) > (
                PARTIALS_BUDGET * 3 * dtype.itemsize):
            rows_per_group *= 2
        block = groups_per_block * threads

        def one_wave(wave_threads: int) -> int:  # the shortest strip in a wave
            # (clusters: in CLUSTER_WAVES waves)
            groups = wave_blocks(block, wave_threads) // cluster
            waves = CLUSTER_WAVES if cluster > 1 else 1
            return math.ceil(rows / (groups_per_block * groups * waves))

        if (chunks == 1 or cluster > 1) and vec > 1:  # 64 registers a thread
            wave_threads = 128 * c["LN_FWD_THREADS_PER_SM"]
        else:
            wave_threads = WAVE_THREADS
        forward_rows_per_group = max(1, one_wave(wave_threads))
        forward_grid = cluster * math.ceil(
            math.ceil(rows / forward_rows_per_group) / groups_per_block)
        wave = groups_per_block * (wave_blocks(block, WAVE_THREADS) // cluster)
        whole = rows // (rows_per_group * wave)  # waves the budget fills
        if rows_per_group > one_wave(WAVE_THREADS) and whole:
            # The budget, not the wave, set the strip: lengthen it until the
            # groups fill those waves, so that no last wave of a few groups
            # takes as long as a full one.
            rows_per_group = math.ceil(rows / (whole * wave))
        elif cluster > 1 and math.ceil(rows / rows_per_group) < wave:
            # Few long rows: the budget's clusters would leave SMs of the
            # wave idle, which costs more than the partial rows.
            rows_per_group = max(1, math.ceil(rows / wave))
        rows_per_group = max(rows_per_group, one_wave(WAVE_THREADS))
    return LaunchPlan(  # the row groups and the grid of the strip: with_strip
        rows=rows,
        D=D,
        dtype=dtype,
        vec=vec,
        per_block=per_block,
        chunks=chunks,
        threads_per_row=threads,
        block=block,
        forward_grid=forward_grid,
        row_groups=0,
        rows_per_group=rows_per_group,
        backward_grid=0,
        rung=rung,
        backward_block=backward_block,
        forward_rows_per_group=forward_rows_per_group,
        cluster=cluster,
        aligned=D % vec == 0,
        any_d=tail,
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
    r"""Validate forward arguments (NumPy or CuPy arrays) and return the plan.

    Every forward (the kernels, the emulation, the CPU-run CUDA source) calls
    this first, so all of them accept and refuse the same arguments.

    Parameters
    ----------
    x : array, shape (..., D), float32 or float16
        The input; its leading axes are flattened into rows.
    gamma, beta : array, shape (D,)
        Scale and shift, of the dtype of ``x``.
    eps : float, default 1e-5
        Finite and > 0, as for :func:`lnorm.forward`, also once rounded to
        float32.
    rung : {"v4", "v3", "v5"}, default "v4"
        Whose forward (:data:`lnorm.gpu.kernels.RUNGS`; v3's is v4's).

    Returns
    -------
    LaunchPlan
        :func:`lnorm.gpu.kernels.plan` of ``(prod(x.shape[:-1]), D, x.dtype,
        rung)``.

    Raises
    ------
    ValueError
        Bad ``eps``, ``x`` of no axes, a shape that does not match, or a shape
        :func:`lnorm.gpu.kernels.plan` refuses.
    TypeError
        A dtype other than float32 or float16, or dtypes that differ.

    See Also
    --------
    lnorm.gpu.kernels.check_backward_args : The same for the backward.

    Examples
    --------
    >>> x = np.zeros((2, 3, 8), np.float32)
    >>> p = check_forward_args(x, np.ones(8, np.float32), np.zeros(8, np.float32))
    >>> p.rows, p.D
    (6, 8)
    >>> x64 = np.zeros((2, 8))
    >>> check_forward_args(x64, x64[0], x64[0])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: x must be float32 or float16 for the GPU kernels; got float64. ...
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
    return plan(math.prod(x.shape[:-1]), D, dtype, rung)


def check_backward_args(dy, x, gamma, mean_hi, mean_lo, rstd,
                        rung: str = "v4",
                        rows_per_group: int | None = None) -> LaunchPlan:
    r"""Validate backward arguments and return the plan.

    Parameters
    ----------
    dy, x : array, shape (..., D), float32 or float16
        The upstream gradient and the forward's input, of one shape and dtype.
    gamma : array, shape (D,)
        The scale, of the dtype of ``x``.
    mean_hi, mean_lo, rstd : array, float32, shape ``x.shape[:-1]``
        The row statistics, as the forward returns them.
    rung : {"v4", "v3", "v5"}, default "v4"
        The backward kernel, as :func:`lnorm.gpu.kernels.plan` takes it.
    rows_per_group : int, optional
        The backward's strip, if not the plan's
        (:meth:`lnorm.gpu.kernels.LaunchPlan.with_strip`).

    Returns
    -------
    LaunchPlan
        The plan of ``x`` for ``rung`` (with that strip).

    Raises
    ------
    ValueError
        A shape that does not match, or a shape or rung
        :func:`lnorm.gpu.kernels.plan` refuses; ``rows_per_group`` below 1.
    TypeError
        A dtype other than float32 or float16, a dtype that does not match,
        or statistics not float32.

    See Also
    --------
    lnorm.gpu.kernels.check_forward_args : The same for the forward.

    Examples
    --------
    >>> x = np.zeros((3, 8), np.float32)
    >>> s = np.zeros(3, np.float32)
    >>> check_backward_args(x, x, np.ones(8, np.float32), s, s, s).rows
    3
    >>> check_backward_args(x, x, np.ones(8, np.float32), s, s, s[:2])
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: rstd must have shape x.shape[:-1] = (3,), ...; got (2,).
    """
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
