r"""Run the CUDA kernel sources themselves on the CPU, compiled by g++.

The ``.cu`` files are compiled verbatim after ``cuda_host.h``, a small
header that maps CUDA onto the host: one OS thread per CUDA thread, blocks one
after another, ``__syncthreads()`` a
barrier over the block's threads and
``__shfl_xor_sync`` an exchange among the 32 lanes of a warp (a partial warp,
or a lane that never arrives, aborts). :class:`HostLayerNorm` launches the
kernels exactly as :class:`lnorm.gpu.run.FusedLayerNorm` does on a GPU (same
plan, grids, blocks and arguments), so its results can be compared bit for
bit with :mod:`lnorm.gpu.emulate`, with no GPU. Compiled with sanitizer flags
(``-fsanitize=address,undefined`` or ``-fsanitize=thread``) the library must
run in a process that preloads the sanitizer runtime:
:func:`cuda_host.run_in_subprocess`.

Compiled libraries, and the object of each kernel file, are cached in
``$LNORM_CUDA_HOST_CACHE`` (default ``~/.cache/lnorm-cuda-host``), keyed by a
hash of the sources and flags.
The chapter "One kernel: fused layer norm on the GPU" says what this run
checks and what only a GPU can.

Examples
--------
>>> ok, reason = available()  # g++ here, able to compile cuda_host.h?
>>> isinstance(ok, bool), isinstance(reason, str)
(True, True)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lnorm.gpu.kernels import (
    COMMON_FILE,
    KERNEL_FILES,
    SOURCE_DIR,
    check_backward_args,
    check_forward_args,
    kernel_params,
    plan,
    rungs_for,
)

__all__ = ["HEADER", "SANITIZE", "available", "build", "HostLayerNorm", "sanitizer_env",
           "run_in_subprocess", "selftest"]

#: The header that maps CUDA onto the host — threads, barriers, warp shuffles.
HEADER = Path(__file__).resolve().parent / "cuda_host.h"
#: No contraction into fused multiply-adds (as ``--fmad=false`` on the GPU).
BASE_FLAGS = ("-std=c++20", "-O1", "-g", "-fPIC", "-pthread", "-ffp-contract=off",
              "-Wno-unknown-pragmas")
#: Extra flags of the sanitizer builds; any error aborts the process.
#: AddressSanitizer's at -O0, which g++ compiles four times as fast there,
#: and which optimizes no access away (its runs are of small shapes);
#: ThreadSanitizer's at -O1, where its negative controls report their races
#: (at -O0 a missing barrier of the long rows showed as wrong bits alone).
SANITIZE = {"asan": ("-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                     "-O0"),
            "tsan": ("-fsanitize=thread",)}
_KEEP = 24  # libraries kept in the cache, the most recently used
_ALLOC_UNIT = """#include <stdlib.h>
extern "C" void* lnorm_host_alloc(size_t n) {  // exactly n bytes: ASan sees the end
    void* p = nullptr;
    return posix_memalign(&p, 16, n ? n : 1) ? nullptr : p;
}
extern "C" void lnorm_host_free(void* p) { free(p); }
"""


def _gxx() -> str | None:
    return shutil.which("g++")


def _cache_dir() -> Path:
    default = Path.home() / ".cache" / "lnorm-cuda-host"
    path = Path(os.environ.get("LNORM_CUDA_HOST_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _filtered(text: str, wanted: set[str]) -> str:
    """``text`` with every table line (``K(suffix, ...)``) of a kernel not wanted
    emptied, keeping the lines where they were (so reports name the same line)."""
    def keep(m):
        return m.group(0) if m.group(1) in wanted else " " * len(m.group(0))
    return re.sub(r"\bK\((\w+),[^)]*\)", keep, text)


def _unit(filename: str, source_dir: Path, kernels) -> str | None:
    """One file's translation unit, with only the table lines ``kernels`` need,
    and a C entry point per kernel; None if it has none of them."""
    names = [k for k in kernel_params(filename) if kernels is None or k in kernels]
    if not names:
        return None
    # a table line's suffix, for any of the prefixes it makes
    suffixes = {re.sub(r"^ln_(fwd|bwd)(_atomic|_grouped)?_", "", k) for k in names}
    common = _filtered((source_dir / COMMON_FILE).read_text(), suffixes)
    text = (source_dir / filename).read_text()
    include = f'#include "{COMMON_FILE}"'
    after = text[:text.index(include)].count("\n") + 2  # the line after it
    text = text.replace(include, f'#line 1 "{COMMON_FILE}"\n{common}\n'
                        f'#line {after} "{filename}"', 1)
    lines = ['#include "cuda_host.h"', f'#line 1 "{filename}"', text]
    for name in names:
        lines.append(f'extern "C" void lnorm_launch_{name}(const unsigned* g, '
                     f'const unsigned* b, void** a, const char* s, unsigned m, '
                     f'unsigned c) '
                     f'{{ cuda_host::launch({name}, "{name}", g, b, a, s, m, c); }}')
    return "\n".join(lines) + "\n"


def kernels_for(shapes, dtypes, rungs=None) -> tuple[str, ...]:
    """The kernels that the forward and backward launch at ``shapes`` x ``dtypes``."""
    out = set()
    for rows, D in shapes:
        for dtype in dtypes:
            for rung in rungs or rungs_for(D, dtype):
                p = plan(rows, D, dtype, rung)
                out |= {p.kernel("forward"), p.kernel("backward")}
                if p.rung != "v3":
                    out.add(p.reduce_launch()[0])
    return tuple(sorted(out))


def _hash(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def _prune(pattern: str, keep: int) -> None:
    with contextlib.suppress(OSError):  # another process may be pruning too
        for old in sorted(_cache_dir().glob(pattern), key=os.path.getmtime)[:-keep]:
            old.unlink(missing_ok=True)


def build(flags=(), source_dir=None, kernels=None) -> Path:
    r"""Compile the kernel files with g++ into a shared library (cached).

    One object per kernel file, each with a C entry point
    ``lnorm_launch_<kernel>`` per kernel, and an allocator; the library is
    cached under a hash of g++, the header, the sources and the flags, so an
    unchanged build costs one hash. Each object is cached too, under the
    hash of what it reads (its file and ``layernorm_common.cu``), so a build
    from an edited copy of one kernel file (the tests' negative controls)
    compiles that file alone.

    Parameters
    ----------
    flags : sequence of str, default ()
        Extra g++ flags, e.g. ``SANITIZE["tsan"]``.
    source_dir : path, optional
        Where ``layernorm_*.cu`` are read (default: the package's); tests point
        it at modified copies.

    Returns
    -------
    pathlib.Path
        The shared library, in the cache directory.

    Raises
    ------
    RuntimeError
        If g++ is not on PATH, or fails to compile or link (its messages are
        in the exception).

    See Also
    --------
    cuda_host.HostLayerNorm : Loads the library.
    cuda_host.available : Whether g++ can build it here.

    Examples
    --------
    >>> try:
    ...     path = build()
    ... except RuntimeError as exc:  # no usable g++ here: it says so
    ...     print(str(exc).startswith("g++"))
    ... else:
    ...     print(path.suffix == ".so" and path == build())  # the second is cached
    True
    """
    gxx = _gxx()
    if gxx is None:
        raise RuntimeError("g++ is not on PATH")
    source_dir = Path(source_dir or SOURCE_DIR).resolve()
    units = _units(source_dir, kernels)
    objects = _objects(gxx, flags, source_dir, kernels)
    out = _cache_dir() / f"lnorm-host-{_hash(*sorted(map(str, objects.values())))}.so"
    if out.exists():
        os.utime(out)  # most recently used: kept by the pruning below
        return out
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        def compile_one(name: str) -> Path:
            obj = objects[name]
            if obj.exists():
                os.utime(obj)
                return obj
            (Path(tmp) / f"{name}.cpp").write_text(units[name][0])
            cmd = [gxx, *BASE_FLAGS, *flags, f"-I{HEADER.parent}", f"-I{source_dir}",
                   "-c", f"{tmp}/{name}.cpp", "-o", f"{tmp}/{name}.o"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(
                    f"g++ failed on {name}:\n{' '.join(cmd)}\n{done.stderr}"
                )
            os.replace(f"{tmp}/{name}.o", obj)  # atomic, as the library below
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            built = list(pool.map(compile_one, units))
        lib = Path(tmp) / "lib.so"
        cmd = [gxx, "-shared", *BASE_FLAGS, *flags, *map(str, built), "-o", str(lib)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"g++ failed to link:\n{done.stderr}")
        os.replace(lib, out)  # atomic: a concurrent build writes the same file
    _prune("lnorm-host-*.so", _KEEP)
    _prune("lnorm-obj-*.o", 2 * _KEEP)
    return out


def _units(source_dir: Path, kernels=None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each unit's text, and the texts it reads besides (header, sources)."""
    units = {Path(f).stem: (unit, (HEADER.read_text(),)) for f in KERNEL_FILES
             if (unit := _unit(f, source_dir, kernels)) is not None}
    units["alloc"] = (_ALLOC_UNIT, ())
    return units


def _objects(gxx: str, flags=(), source_dir=None, kernels=None) -> dict[str, Path]:
    """The cached object of each unit: named by the hash of g++, the flags and
    what the unit reads."""
    st = os.stat(os.path.realpath(gxx))
    fixed = (gxx, st.st_size, st.st_mtime, BASE_FLAGS, tuple(flags))
    units = _units(Path(source_dir or SOURCE_DIR).resolve(), kernels)
    return {name: _cache_dir() / f"lnorm-obj-{_hash(*fixed, *unit)}.o"
            for name, unit in units.items()}


@functools.cache
def available() -> tuple[bool, str]:
    r"""Say whether the kernels can be compiled for the CPU here, and why not.

    Compiles a test program once per process (the answer is cached).

    Returns
    -------
    ok : bool
        True if g++ compiles a test program with ``cuda_host.h`` (C++20,
        ``_Float16``).
    reason : str
        The path of g++ if ``ok``; otherwise why not.

    See Also
    --------
    lnorm.gpu.run.available : Whether the kernels can run on a GPU.

    Examples
    --------
    >>> ok, reason = available()
    >>> isinstance(ok, bool), isinstance(reason, str)
    (True, True)
    """
    gxx = _gxx()
    if gxx is None:
        return False, "g++ is not on PATH"
    test = (f'#include "{HEADER}"\n'
            "int main() { _Float16 h = (_Float16)1.5f; return (float)h != 1.5f; }\n")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.cpp").write_text(test)
        done = subprocess.run([gxx, *BASE_FLAGS, f"{tmp}/t.cpp", "-o", f"{tmp}/t"],
                              capture_output=True, text=True)
    if done.returncode:
        return False, f"g++ cannot compile cuda_host.h: {done.stderr.strip()[-500:]}"
    return True, gxx


class HostLayerNorm:
    r"""Run the fused kernels on the CPU, launched as the GPU class launches them.

    Same plan, grids, blocks and arguments as
    :class:`lnorm.gpu.run.FusedLayerNorm`, so the results equal
    :mod:`lnorm.gpu.emulate` bit for bit. Construction builds (or finds in
    the cache) the library of :func:`cuda_host.build` and loads it.

    Parameters
    ----------
    flags : sequence of str, default ()
        Extra g++ flags (sanitizers: then use it only in
        :func:`cuda_host.run_in_subprocess`).
    source_dir : path, optional
        Directory of the ``.cu`` files (default: the package's).

    Attributes
    ----------
    path : pathlib.Path
        The loaded library.

    Raises
    ------
    RuntimeError
        If the library cannot be built (no g++, or a compile error).

    See Also
    --------
    cuda_host.selftest : Compares it with the emulation.

    Examples
    --------
    >>> from lnorm.gpu import emulate
    >>> from lnorm.gpu.check import forward_backward, make_inputs
    >>> inp = make_inputs(6, 8, "float16")
    >>> if available()[0]:  # g++ here: the CPU run equals the emulation
    ...     host = HostLayerNorm()
    ...     got = forward_backward(host.forward, host.backward, inp)
    ...     want = forward_backward(emulate.forward, emulate.backward, inp)
    ...     assert all(np.array_equal(got[k], want[k]) for k in want)
    """

    def __init__(self, flags=(), source_dir=None, kernels=None) -> None:
        self.path = build(tuple(flags), source_dir, kernels)
        self._lib = ctypes.CDLL(str(self.path))
        self._lib.lnorm_host_alloc.restype = ctypes.c_void_p
        self._lib.lnorm_host_alloc.argtypes = [ctypes.c_size_t]
        self._lib.lnorm_host_free.argtypes = [ctypes.c_void_p]

    @contextlib.contextmanager
    def buffers(self):
        r"""Allocate arrays in the library's memory, freed on leaving the block.

        A context manager that yields ``new(shape, dtype, init=None)``: an
        array in an exact-size, 16-byte aligned allocation of the library (a
        sanitizer sees its end). Without ``init`` a buffer is filled with 0xff
        bytes, so an element the kernel fails to write shows (as a NaN pattern
        no arithmetic makes).

        Yields
        ------
        callable
            ``new(shape, dtype, init=None) -> numpy.ndarray``.

        Raises
        ------
        MemoryError
            If an allocation fails.

        See Also
        --------
        cuda_host.HostLayerNorm.launch : Takes these arrays.

        Examples
        --------
        >>> bool(np.isnan(np.frombuffer(b"\xff" * 4, np.float32)[0]))  # the fill
        True
        >>> if available()[0]:  # g++ here
        ...     with HostLayerNorm().buffers() as new:
        ...         fresh, given = new((2, 3), np.float32), new((3,), np.float32, 1.5)
        ...         assert np.isnan(fresh).all() and given.tolist() == [1.5] * 3
        """
        pointers = []

        def new(shape, dtype, init=None) -> np.ndarray:
            dtype = np.dtype(dtype)
            nbytes = math.prod(shape) * dtype.itemsize
            ptr = self._lib.lnorm_host_alloc(nbytes)
            if not ptr:
                raise MemoryError(f"lnorm_host_alloc({nbytes}) failed")
            pointers.append(ptr)
            raw = (ctypes.c_char * max(nbytes, 1)).from_address(ptr)
            a = np.frombuffer(raw, np.uint8, count=nbytes)
            a[:] = 0xFF
            a = a.view(dtype).reshape(shape)
            if init is not None:
                a[...] = init
            return a

        try:
            yield new
        finally:
            for ptr in pointers:
                self._lib.lnorm_host_free(ptr)

    def launch(self, kernel: str, grid, block, args, shared: int = 0) -> None:
        r"""Run ``kernel<<<grid, block, shared>>>(*args)``, as a CuPy kernel takes them.

        Blocks run one after another, each with one OS thread per CUDA thread;

        Parameters
        ----------
        kernel : str
            A kernel of :func:`lnorm.gpu.kernels.kernel_params`.
        grid, block : sequence of int
            Up to 3 numbers each.
        args : sequence
            Arrays (passed as pointers; allocate them with
            :meth:`cuda_host.HostLayerNorm.buffers`), ``numpy.int32``,
            ``numpy.int64``, ``numpy.float32`` or ``numpy.float64``; the kinds
            are checked against the kernel's parameters.
        shared : int, default 0
            Bytes of dynamic shared memory (as CuPy's ``shared_mem``).

        Raises
        ------
        TypeError
            An argument of another type (a Python int or float, say).

        See Also
        --------
        cuda_host.HostLayerNorm.forward : Launches the forward this way.

        Examples
        --------
        >>> from lnorm.gpu import emulate
        >>> from lnorm.gpu.kernels import check_forward_args
        >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
        >>> g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
        >>> p = check_forward_args(x, g, b)
        >>> p.kernel("forward"), (p.forward_grid,), (p.block,)
        ('ln_fwd_warp_f32_v4', (1,), (128,))
        >>> if available()[0]:  # g++ here: launch it by hand
        ...     host = HostLayerNorm()
        ...     with host.buffers() as new:
        ...         ins = [new(a.shape, a.dtype, a) for a in (x, g, b)]
        ...         y = new(x.shape, x.dtype)
        ...         stats = [new((2,), np.float32) for _ in range(3)]
        ...         host.launch(p.kernel("forward"), (p.forward_grid,), (p.block,),
        ...                     (*ins, y, *stats, np.int32(p.rows), np.int32(p.D),
        ...                      np.float32(1e-5)))
        ...         assert np.array_equal(y, emulate.forward(x, g, b)[0])
        """
        kinds = ((np.ndarray, "p", lambda a: ctypes.c_void_p(a.ctypes.data)),
                 (np.float32, "f", ctypes.c_float), (np.float64, "d", ctypes.c_double),
                 (np.int32, "i", ctypes.c_int32), (np.int64, "q", ctypes.c_int64))
        values, sig = [], ""
        for i, a in enumerate(args):
            kind = next((k for k in kinds if isinstance(a, k[0])), None)
            if kind is None:
                raise TypeError(
                    f"argument {i} of {kernel}: pass an array or a NumPy scalar "
                    f"(numpy.int32, numpy.float32, ...); got {type(a).__name__}"
                )
            values.append(kind[2](a.item() if kind[1] != "p" else a))
            sig += kind[1]
        argv = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        dims = [(ctypes.c_uint * 3)(*(tuple(d) + (1, 1, 1))[:3]) for d in (grid, block)]
        getattr(self._lib, f"lnorm_launch_{kernel}")(
            *dims, argv, sig.encode(), ctypes.c_uint(shared), ctypes.c_uint(1))

    def forward(self, x, gamma, beta, eps: float = 1e-5, *, rung: str = "v4") -> tuple:
        r"""Run the fused forward on the CPU, as the GPU class's forward runs it.

        The launch of :meth:`lnorm.gpu.run.FusedLayerNorm.forward`, on the
        CPU.

        Parameters
        ----------
        x : array_like, shape (..., D), float32 or float16
            The input.
        gamma, beta : array_like, shape (D,), the dtype of ``x``
            Scale and shift.
        eps : float, default 1e-5
            Added to the variance.
        rung : {"v4", "v3", "v5"}, default "v4"
            Whose forward kernel, as for
            :meth:`lnorm.gpu.run.FusedLayerNorm.forward`.

        Returns
        -------
        y : ndarray, shape and dtype of ``x``
            The output.
        mean_hi, mean_lo, rstd : ndarray, float32, shape ``x.shape[:-1]``
            The row statistics the backward takes.

        Raises
        ------
        ValueError, TypeError
            Arguments :func:`lnorm.gpu.kernels.check_forward_args` refuses.

        See Also
        --------
        lnorm.gpu.emulate.forward : Its bit-for-bit twin in NumPy.

        Examples
        --------
        >>> from lnorm.gpu import emulate
        >>> x = np.float32(1e4) + np.arange(8, dtype=np.float32).reshape(1, 8)
        >>> g, b = np.ones(8, np.float32), np.zeros(8, np.float32)
        >>> want = emulate.forward(x, g, b)
        >>> float(want[1][0]), float(want[2][0])  # mean_hi, mean_lo
        (10003.5, 0.0)
        >>> if available()[0]:  # g++ here: the same bits
        ...     got = HostLayerNorm().forward(x, g, b)
        ...     assert all(np.array_equal(a, w) for a, w in zip(got, want))
        """
        x, gamma, beta = (np.asarray(a) for a in (x, gamma, beta))
        p = check_forward_args(x, gamma, beta, eps, rung=rung)
        lead = x.shape[:-1]
        if p.rows == 0:
            return (np.empty_like(x), *(np.empty(lead, np.float32) for _ in range(3)))
        name, grid, block, args = p.forward_launch(eps)
        with self.buffers() as new:
            ins = [new(a.shape, a.dtype, a) for a in (x, gamma, beta)]
            outs = [new(x.shape, x.dtype), *(new(lead, np.float32) for _ in range(3))]
            self.launch(name, grid, block, (*ins, *outs, *args), p.forward_shared_bytes)
            return tuple(o.copy() for o in outs)

    def backward(self, dy, x, gamma, mean_hi, mean_lo, rstd, *,
                 rung: str = "v4", second_stage: bool = True,
                 rows_per_group: int | None = None) -> tuple:
        r"""Run the fused backward and the dgamma/dbeta reduction on the CPU.

        The launches of :meth:`lnorm.gpu.run.FusedLayerNorm.backward`, on
        the CPU.

        Parameters
        ----------
        dy, x : array_like, shape (..., D), float32 or float16
            The upstream gradient and the forward's input, one dtype.
        gamma : array_like, shape (D,), the dtype of ``x``
            The scale.
        mean_hi, mean_lo, rstd : array_like, float32, shape ``x.shape[:-1]``
            As :meth:`cuda_host.HostLayerNorm.forward` returns them.
        rung : {"v4", "v3", "v5"}, default "v4"
            The backward kernel (:data:`lnorm.gpu.kernels.RUNGS`). v3 adds
            every group's column sums into dgamma and dbeta with atomicAdd
            (here blocks run one at a time, in launch order, but the row
            groups of one block run as threads at once and add in any
            order; :func:`lnorm.gpu.check.atomic_check` allows for that).
        second_stage : bool, default True
            False (v4, v5): stop after the backward kernel and return its
            partial rows instead of dgamma and dbeta (over long rows the
            second stage is most of the CPU's time).
        rows_per_group : int, optional
            The backward's strip, if not the plan's
            (:meth:`lnorm.gpu.kernels.LaunchPlan.with_strip`): ``dx`` is the
            same, ``dgamma`` and ``dbeta`` follow the strip's order. For tests
            and experiments; the plan's strips are the fast ones.

        Returns
        -------
        dx : ndarray, shape and dtype of ``x``
            The gradient of the input.
        dgamma, dbeta : ndarray, float32, shape (D,)
            The gradients of the scale and shift; with ``second_stage=False``
            the ``(partial_rows, D)`` partial rows
            (:func:`lnorm.gpu.emulate.column_partials`).

        Raises
        ------
        ValueError, TypeError
            Arguments :func:`lnorm.gpu.kernels.check_backward_args` refuses;
            ``second_stage=False`` with v3, which has none.

        See Also
        --------
        lnorm.gpu.emulate.backward : Its bit-for-bit twin in NumPy.

        Examples
        --------
        >>> from lnorm.gpu import emulate
        >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
        >>> g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
        >>> stats = emulate.forward(x, g, b)[1:]
        >>> want = emulate.backward(np.ones_like(x), x, g, *stats)
        >>> want[2].tolist()  # dbeta: the column sums of dy
        [2.0, 2.0, 2.0, 2.0]
        >>> if available()[0]:  # g++ here: the same bits
        ...     got = HostLayerNorm().backward(np.ones_like(x), x, g, *stats)
        ...     assert all(np.array_equal(a, w) for a, w in zip(got, want))
        """
        arrays = [np.asarray(a) for a in (dy, x, gamma, mean_hi, mean_lo, rstd)]
        p = check_backward_args(*arrays, rung=rung, rows_per_group=rows_per_group)
        if not second_stage and p.rung == "v3":
            raise ValueError("rung 'v3' has no second stage to leave out.")
        if p.rows == 0:  # sums over no rows (no partial rows)
            shape = p.D if second_stage else (0, p.D)
            return (np.empty_like(arrays[1]), np.zeros(shape, np.float32),
                    np.zeros(shape, np.float32))
        name, grid, block, ints = p.backward_launch()
        with self.buffers() as new:
            ins = [new(a.shape, a.dtype, a) for a in arrays]
            dx = new(arrays[1].shape, arrays[1].dtype)
            if p.rung == "v3":  # into dgamma and dbeta, which start at zero
                params = [new((p.D,), np.float32, 0.0) for _ in range(2)]
                self.launch(name, grid, block, (*ins, dx, *params, *ints))
                return dx.copy(), params[0].copy(), params[1].copy()
            parts = [new((p.partial_rows, p.D), np.float32) for _ in range(2)]
            params = [new((p.D,), np.float32) for _ in range(2)]
            self.launch(name, grid, block, (*ins, dx, *parts, *ints),
                        p.backward_shared_bytes)
            if not second_stage:
                return dx.copy(), parts[0].copy(), parts[1].copy()
            self.launch(*p.reduce_launch(),
                        (*parts, np.int32(p.partial_rows), np.int32(p.D), *params))
            return dx.copy(), params[0].copy(), params[1].copy()


def sanitizer_env(flags=()) -> dict[str, str]:
    r"""Make the environment for a process loading a library built with ``flags``.

    Python is not instrumented, so the sanitizer runtime is preloaded
    (``LD_PRELOAD``, found by asking g++); leak checking is off (Python keeps
    memory to the end), and any error halts the process. ``PYTHONPATH``
    starts with the directory holding :mod:`lnorm`, so the child imports this
    copy.

    Parameters
    ----------
    flags : sequence of str, default ()
        The build's extra g++ flags; with no sanitizer among them nothing is
        preloaded.

    Returns
    -------
    dict of str to str
        A copy of ``os.environ`` with those settings.

    See Also
    --------
    cuda_host.run_in_subprocess : Runs a process in it.

    Examples
    --------
    >>> import os
    >>> env = sanitizer_env()
    >>> env["ASAN_OPTIONS"], env["TSAN_OPTIONS"]
    ('detect_leaks=0', 'halt_on_error=1')
    >>> env["PYTHONPATH"].split(os.pathsep)[0] == str(SOURCE_DIR.parents[1])
    True
    """
    env = dict(os.environ)
    joined = " ".join(flags)
    runtime = ("libtsan.so" if "thread" in joined
               else "libasan.so" if "address" in joined
               else "libubsan.so" if "undefined" in joined or "alignment" in joined
               else None)
    if runtime:
        path = subprocess.run([_gxx(), f"-print-file-name={runtime}"],
                              capture_output=True, text=True).stdout.strip()
        env["LD_PRELOAD"] = path
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    env["TSAN_OPTIONS"] = "halt_on_error=1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [
        str(SOURCE_DIR.parents[1]), str(Path(__file__).resolve().parents[1]),
        env.get("PYTHONPATH")]))
    return env


def run_in_subprocess(code: str, flags=(), source_dir=None, kernels=None,
                      timeout: float = 600) -> subprocess.CompletedProcess:
    r"""Run Python ``code`` in a fresh process set up for the library of ``flags``.

    The library is built here first, so the child finds it in the cache and
    runs no compiler. The code may construct ``HostLayerNorm(flags,
    source_dir)``. The environment is :func:`cuda_host.sanitizer_env`.

    Parameters
    ----------
    code : str
        Python source, run as ``python -c code``.
    flags : sequence of str, default ()
        Extra g++ flags of the library, e.g. ``SANITIZE["asan"]``.
    source_dir : path, optional
        Directory of the ``.cu`` files (default: the package's).
    timeout : float, default 600
        Seconds before the child is killed (and ``subprocess.TimeoutExpired``
        raised).

    Returns
    -------
    subprocess.CompletedProcess
        With ``returncode``, and ``stdout``/``stderr`` as text.

    Raises
    ------
    RuntimeError
        If the library cannot be built.

    See Also
    --------
    cuda_host.selftest : What ``python -m cuda_host`` runs this way.

    Examples
    --------
    >>> try:
    ...     done = run_in_subprocess("print(6 * 7)")
    ... except RuntimeError as exc:  # no usable g++ here: nothing built or run
    ...     print(str(exc).startswith("g++"))
    ... else:
    ...     print(done.returncode == 0 and done.stdout == "42\n")
    True
    """
    build(tuple(flags), source_dir, kernels)
    return subprocess.run([sys.executable, "-c", code], env=sanitizer_env(flags),
                          capture_output=True, text=True, timeout=timeout)


def selftest(shapes=((20, 7), (3, 513)), dtypes=("float32", "float16"), flags=(),
             source_dir=None, rungs=None, kernels=None) -> None:
    r"""Assert that the CPU-run kernels equal :mod:`lnorm.gpu.emulate` bit for bit.

    Every output of the forward and the backward, at every shape and dtype;
    where they exist, v5's backward bit for bit, and v3's (the backward with
    atomics) as :func:`lnorm.gpu.check.atomic_check` checks it: ``dx`` bit
    for bit, ``dgamma`` and ``dbeta`` within the bound for any order.
    Prints one line when all hold.

    Parameters
    ----------
    shapes : sequence of (int, int), default ((20, 7), (3, 513))
        ``(rows, D)`` pairs: a warp-per-row and a block-per-row shape.
    dtypes : sequence of str, default ("float32", "float16")
        Storage types.
    flags : sequence of str, default ()
        Extra g++ flags (sanitizers: run this in
        :func:`cuda_host.run_in_subprocess`).
    source_dir : path, optional
        Directory of the ``.cu`` files (default: the package's).
    rungs : sequence of str, optional
        Only these rungs (default: every rung with kernels of its own for the
        shape, :func:`lnorm.gpu.kernels.rungs_for`).
    kernels : sequence of str, optional
        The kernels to compile (default: those the shapes launch).

    Raises
    ------
    AssertionError
        On the first output that differs.
    RuntimeError
        If the library cannot be built.

    See Also
    --------
    cuda_host.HostLayerNorm : What is tested.

    Examples
    --------
    >>> import contextlib, io
    >>> try:
    ...     with contextlib.redirect_stdout(io.StringIO()) as out:
    ...         selftest(shapes=((4, 8),), dtypes=("float32",))
    ... except RuntimeError as exc:  # no usable g++ here: nothing built or run
    ...     print(str(exc).startswith("g++"))
    ... else:
    ...     print(out.getvalue().startswith("selftest passed"))
    True
    """
    from lnorm.gpu import emulate
    from lnorm.gpu.check import atomic_check, forward_backward, make_inputs
    host = HostLayerNorm(flags, source_dir,
                         kernels or kernels_for(shapes, dtypes, rungs))
    for rows, D in shapes:
        for dtype in dtypes:
            inp = make_inputs(rows, D, dtype)
            here = [r for r in rungs_for(D, dtype) if rungs is None or r in rungs]
            for rung in (r for r in here if r != "v3"):
                got = forward_backward(host.forward, host.backward, inp, rung)
                want = forward_backward(emulate.forward, emulate.backward, inp, rung)
                for k, w in want.items():
                    bits = np.dtype(f"uint{8 * w.dtype.itemsize}")
                    np.testing.assert_array_equal(
                        got[k].view(bits), w.view(bits),
                        err_msg=f"{rung} {k}, rows={rows}, D={D}, {dtype}")
            if "v3" in here:  # v3, the atomics: dx bit for bit, dgamma to a bound
                v3 = atomic_check(host.backward, inp)
                assert v3["dx_equal"] and v3["within"], (rows, D, dtype, v3)
    print(f"selftest passed: {shapes} x {dtypes}, flags {list(flags)}")


if __name__ == "__main__":  # cd tests; python -m cuda_host [asan|tsan]
    extra = SANITIZE[sys.argv[1]] if len(sys.argv) > 1 else ()
    done = run_in_subprocess(
        f"from cuda_host import selftest; selftest(flags={extra!r})", extra
    )
    print(done.stdout + done.stderr, end="")
    sys.exit(done.returncode)
