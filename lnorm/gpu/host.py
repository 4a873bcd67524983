"""Run the CUDA kernel sources themselves on the CPU, compiled by g++.

The ``.cu`` files are compiled verbatim after ``host/cuda_host.h``, a small
header that maps CUDA onto the host: one OS thread per CUDA thread, blocks one
after another, ``__syncthreads()`` a barrier over the block's threads and
``__shfl_xor_sync`` an exchange among the 32 lanes of a warp (a partial warp,
or a lane that never arrives, aborts). :class:`HostLayerNorm` launches the
kernels exactly as :class:`lnorm.gpu.run.FusedLayerNorm` does on a GPU (same
plan, grids, blocks and arguments), so its results can be compared bit for
bit with :mod:`lnorm.gpu.emulate`, with no GPU. Compiled with sanitizer flags
(``-fsanitize=address,undefined`` or ``-fsanitize=thread``) the library must
run in a process that preloads the sanitizer runtime: :func:`run_in_subprocess`.

Compiled libraries are cached in ``$LNORM_CUDA_HOST_CACHE`` (default
``~/.cache/lnorm-cuda-host``), keyed by a hash of the sources and flags.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .kernels import (COMMON_FILE, KERNEL_FILES, SOURCE_DIR, check_backward_args,
                      check_forward_args, constants, kernel_params)

__all__ = ["HEADER", "SANITIZE", "available", "build", "HostLayerNorm", "sanitizer_env",
           "run_in_subprocess", "selftest"]

HEADER = Path(__file__).resolve().parent / "host" / "cuda_host.h"
#: No contraction into fused multiply-adds (as ``--fmad=false`` on the GPU).
BASE_FLAGS = ("-std=c++20", "-O1", "-g", "-fPIC", "-pthread", "-ffp-contract=off",
              "-Wno-unknown-pragmas")
#: Extra flags of the sanitizer builds; any error aborts the process.
SANITIZE = {"asan": ("-fsanitize=address,undefined", "-fno-sanitize-recover=all"),
            "tsan": ("-fsanitize=thread",)}
_KEEP = 24  # libraries kept in the cache, the most recently used
_ALLOC_UNIT = """#include <stdlib.h>
extern "C" void* lnorm_host_alloc(size_t n) {  // exactly n bytes (sanitizers see the end)
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


def _unit(filename: str) -> str:  # no path in it: equal sources give one cache entry
    lines = ['#include "cuda_host.h"', f'#include "{filename}"']
    for name in kernel_params(filename):
        lines.append(f'extern "C" void lnorm_launch_{name}(const unsigned* g, const unsigned* b, '
                     f'void** a, const char* s) {{ cuda_host::launch({name}, "{name}", g, b, a, s); }}')
    return "\n".join(lines) + "\n"


def build(flags=(), source_dir=None) -> Path:
    """Compile the kernel files with g++ into a shared library (cached); return its path.

    Parameters
    ----------
    flags : sequence of str
        Extra g++ flags, e.g. ``SANITIZE["tsan"]``.
    source_dir : path, optional
        Where ``layernorm_*.cu`` are read (default: the package's); tests point
        it at modified copies.
    """
    gxx = _gxx()
    if gxx is None:
        raise RuntimeError("g++ is not on PATH")
    source_dir = Path(source_dir or SOURCE_DIR).resolve()
    units = {Path(f).stem: _unit(f) for f in KERNEL_FILES}
    units["alloc"] = _ALLOC_UNIT
    st = os.stat(os.path.realpath(gxx))
    texts = [(source_dir / f).read_text() for f in (COMMON_FILE, *KERNEL_FILES)]
    key = repr((gxx, st.st_size, st.st_mtime, HEADER.read_text(), texts, units, BASE_FLAGS,
                tuple(flags)))
    out = _cache_dir() / f"lnorm-host-{hashlib.sha256(key.encode()).hexdigest()[:24]}.so"
    if out.exists():
        os.utime(out)  # most recently used: kept by the pruning below
        return out
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        def compile_one(name: str) -> Path:
            (Path(tmp) / f"{name}.cpp").write_text(units[name])
            obj = Path(tmp) / f"{name}.o"
            cmd = [gxx, *BASE_FLAGS, *flags, f"-I{HEADER.parent}", f"-I{source_dir}", "-c",
                   f"{tmp}/{name}.cpp", "-o", str(obj)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"g++ failed on {name}:\n{' '.join(cmd)}\n{done.stderr}")
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = list(pool.map(compile_one, units))
        lib = Path(tmp) / "lib.so"
        cmd = [gxx, "-shared", *BASE_FLAGS, *flags, *map(str, objects), "-o", str(lib)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"g++ failed to link:\n{done.stderr}")
        os.replace(lib, out)  # atomic: a concurrent build writes the same file
    with contextlib.suppress(OSError):  # another process may be pruning too
        for old in sorted(out.parent.glob("lnorm-host-*.so"), key=os.path.getmtime)[:-_KEEP]:
            old.unlink(missing_ok=True)
    return out


@functools.cache
def available() -> tuple[bool, str]:
    """Whether the kernels can be compiled for the CPU here, and why not.

    Returns
    -------
    (bool, str)
        ``(True, "<g++ path>")`` if g++ compiles a test program with
        ``cuda_host.h`` (C++20, ``_Float16``); otherwise ``(False, reason)``.
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
    """The fused kernels run on the CPU, launched as :class:`lnorm.gpu.run.FusedLayerNorm` does.

    Parameters
    ----------
    flags : sequence of str
        Extra g++ flags (sanitizers: then use it only in :func:`run_in_subprocess`).
    source_dir : path, optional
        Directory of the ``.cu`` files (default: the package's).
    """

    def __init__(self, flags=(), source_dir=None) -> None:
        self.path = build(tuple(flags), source_dir)
        self._lib = ctypes.CDLL(str(self.path))
        self._lib.lnorm_host_alloc.restype = ctypes.c_void_p
        self._lib.lnorm_host_alloc.argtypes = [ctypes.c_size_t]
        self._lib.lnorm_host_free.argtypes = [ctypes.c_void_p]

    @contextlib.contextmanager
    def buffers(self):
        """Yield ``new(shape, dtype, init=None)``: arrays in exact-size, 16-byte aligned
        allocations of the library (a sanitizer sees their ends), freed on exit.

        Without ``init`` a buffer is filled with 0xff bytes, so an element the
        kernel fails to write shows (as a NaN pattern no arithmetic makes).
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

    def launch(self, kernel: str, grid, block, args) -> None:
        """Run ``kernel<<<grid, block>>>(*args)``, arguments as for a CuPy ``RawKernel``.

        ``args``: arrays (passed as pointers), ``numpy.int32``, ``numpy.int64``,
        ``numpy.float32`` or ``numpy.float64``; the kinds are checked against
        the kernel's parameters. ``grid`` and ``block``: up to 3 numbers.
        """
        kinds = ((np.ndarray, "p", lambda a: ctypes.c_void_p(a.ctypes.data)),
                 (np.float32, "f", ctypes.c_float), (np.float64, "d", ctypes.c_double),
                 (np.int32, "i", ctypes.c_int32), (np.int64, "q", ctypes.c_int64))
        values, sig = [], ""
        for i, a in enumerate(args):
            kind = next((k for k in kinds if isinstance(a, k[0])), None)
            if kind is None:
                raise TypeError(f"argument {i} of {kernel}: pass an array or a NumPy scalar "
                                f"(numpy.int32, numpy.float32, ...); got {type(a).__name__}")
            values.append(kind[2](a.item() if kind[1] != "p" else a))
            sig += kind[1]
        argv = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        dims = [(ctypes.c_uint * 3)(*(tuple(d) + (1, 1, 1))[:3]) for d in (grid, block)]
        getattr(self._lib, f"lnorm_launch_{kernel}")(*dims, argv, sig.encode())

    def forward(self, x, gamma, beta, eps: float = 1e-5) -> tuple:
        """Fused forward on the CPU; as :meth:`lnorm.gpu.run.FusedLayerNorm.forward`.

        Returns
        -------
        y : ndarray, shape and dtype of ``x``
        mean_hi, mean_lo, rstd : ndarray, float32, shape ``x.shape[:-1]``
        """
        x, gamma, beta = (np.asarray(a) for a in (x, gamma, beta))
        p = check_forward_args(x, gamma, beta, eps)
        lead = x.shape[:-1]
        if p.rows == 0:
            return (np.empty_like(x), *(np.empty(lead, np.float32) for _ in range(3)))
        with self.buffers() as new:
            ins = [new(a.shape, a.dtype, a) for a in (x, gamma, beta)]
            outs = [new(x.shape, x.dtype), *(new(lead, np.float32) for _ in range(3))]
            self.launch(p.kernel("forward"), (p.forward_grid,), (p.block,),
                        (*ins, *outs, np.int32(p.rows), np.int32(p.D), np.float32(eps)))
            return tuple(o.copy() for o in outs)

    def backward(self, dy, x, gamma, mean_hi, mean_lo, rstd) -> tuple:
        """Fused backward and the dgamma/dbeta reduction on the CPU.

        Returns
        -------
        dx : ndarray, shape and dtype of ``x``
        dgamma, dbeta : ndarray, float32, shape (D,)
        """
        arrays = [np.asarray(a) for a in (dy, x, gamma, mean_hi, mean_lo, rstd)]
        p = check_backward_args(*arrays)
        if p.rows == 0:
            return np.empty_like(arrays[1]), np.zeros(p.D, np.float32), np.zeros(p.D, np.float32)
        with self.buffers() as new:
            ins = [new(a.shape, a.dtype, a) for a in arrays]
            dx = new(arrays[1].shape, arrays[1].dtype)
            parts = [new((p.row_groups, p.D), np.float32) for _ in range(2)]
            params = [new((p.D,), np.float32) for _ in range(2)]
            self.launch(p.kernel("backward"), (p.backward_grid,), (p.block,),
                        (*ins, dx, *parts, np.int32(p.rows), np.int32(p.D),
                         np.int32(p.rows_per_group), np.int32(p.row_groups)))
            self.launch("ln_bwd_reduce_params", (math.ceil(p.D / 32),),
                        (32, constants()["LN_REDUCE_SLICES"]),
                        (*parts, np.int32(p.row_groups), np.int32(p.D), *params))
            return dx.copy(), params[0].copy(), params[1].copy()


def sanitizer_env(flags=()) -> dict[str, str]:
    """The environment for a process loading a library built with ``flags``.

    Python is not instrumented, so the sanitizer runtime is preloaded
    (``LD_PRELOAD``); leak checking is off (Python keeps memory to the end).
    """
    env = dict(os.environ)
    joined = " ".join(flags)
    runtime = ("libtsan.so" if "thread" in joined else "libasan.so" if "address" in joined
               else "libubsan.so" if "undefined" in joined or "alignment" in joined else None)
    if runtime:
        path = subprocess.run([_gxx(), f"-print-file-name={runtime}"], capture_output=True,
                              text=True).stdout.strip()
        env["LD_PRELOAD"] = path
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    env["TSAN_OPTIONS"] = "halt_on_error=1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_DIR.parents[1]),
                                                      env.get("PYTHONPATH")]))
    return env


def run_in_subprocess(code: str, flags=(), source_dir=None,
                      timeout: float = 600) -> subprocess.CompletedProcess:
    """Run Python ``code`` in a fresh process set up for a library built with ``flags``.

    The library is built here first, so the child finds it in the cache and
    runs no compiler. The code may construct ``HostLayerNorm(flags, source_dir)``.

    Returns
    -------
    subprocess.CompletedProcess
        With ``returncode``, and ``stdout``/``stderr`` as text.
    """
    build(tuple(flags), source_dir)
    return subprocess.run([sys.executable, "-c", code], env=sanitizer_env(flags),
                          capture_output=True, text=True, timeout=timeout)


def selftest(shapes=((20, 7), (3, 513)), dtypes=("float32", "float16"), flags=(),
             source_dir=None) -> None:
    """Assert that the CPU-run kernels equal :mod:`lnorm.gpu.emulate` bit for bit.

    Raises
    ------
    AssertionError
        On the first output that differs.
    """
    from . import emulate
    from .check import forward_backward, make_inputs
    host = HostLayerNorm(flags, source_dir)
    for rows, D in shapes:
        for dtype in dtypes:
            inp = make_inputs(rows, D, dtype)
            got = forward_backward(host.forward, host.backward, inp)
            want = forward_backward(emulate.forward, emulate.backward, inp)
            for k, w in want.items():
                bits = np.dtype(f"uint{8 * w.dtype.itemsize}")
                np.testing.assert_array_equal(got[k].view(bits), w.view(bits),
                                              err_msg=f"{k}, rows={rows}, D={D}, {dtype}")
    print(f"selftest passed: {shapes} x {dtypes}, flags {list(flags)}")


if __name__ == "__main__":  # python -m lnorm.gpu.host [asan|tsan]
    extra = SANITIZE[sys.argv[1]] if len(sys.argv) > 1 else ()
    done = run_in_subprocess(f"from lnorm.gpu.host import selftest; selftest(flags={extra!r})",
                             extra)
    print(done.stdout + done.stderr, end="")
    sys.exit(done.returncode)
