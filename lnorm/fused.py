r"""Layer norm fused on the CPU: one compiled loop per row (Numba).

:mod:`lnorm.core` runs the formula operator by operator, each streaming a
whole tensor through memory. Here a compiled loop reads a row once,
accumulates its reductions in float64 registers and writes its outputs
while the row is still in cache: the schedule of the GPU chapter's kernels,
on CPU cores. The cost chapter (``book/05_cost.md``) measures it.

Per row: the forward sums ``x``, then ``(x - mean)**2`` (from cache), then
writes ``xhat`` and ``y`` in one sweep; the backward sums ``g = gamma * dy``
and ``g * xhat`` in one sweep, which also adds ``dy * xhat`` and ``dy`` into
the block's ``dgamma`` and ``dbeta``, then writes ``dx = rstd * (g - xhat *
mean(g * xhat) - mean(g))`` in a second (from cache).

Rules shared by :func:`forward` and :func:`backward`:

* the checks, errors, dtype policy and :class:`lnorm.cache.LayerNormCache`
  of :func:`lnorm.core.forward` and :func:`lnorm.core.backward`;
* every statistic and every reduction is accumulated in float64, whatever
  the input dtype; ``y``, ``xhat`` and ``dx`` are rounded once to the input
  dtype, ``dgamma`` and ``dbeta`` once to the dtype of ``gamma``;
* a fixed summation order: ``dgamma`` and ``dbeta`` are summed in float64
  per block of :data:`BLOCK_ROWS` rows of a chunk of :data:`CHUNK_ROWS`
  rows, then across blocks in order. Rows of :data:`GROUP_FROM_D` elements
  or more go four at a time, rows ``q + k * Q`` (``k < 4``, ``Q`` a quarter
  of the chunk), ``BLOCK_ROWS // 4`` groups a block, their four terms added
  pairwise; rows left over go one by one in blocks of their own;
* NaN and Inf stay in their row: the sums take the fast-math flags
  ``reassoc`` (split a row's sum over vector lanes) and ``contract`` (fused
  multiply-adds), never ``nnan`` or ``ninf``; the ``dx`` sweep takes none
  (``contract`` would keep the rounding error of ``g`` in ``g - mean(g)``);
* a constant row gives ``xhat = 0`` and ``y = beta`` exactly, and a row of
  one element ``dx = 0``;
* ``out=`` takes arrays to write into, sparing the operating system's
  zeroing of fresh pages that a new array of many megabytes pays;
* ``threads=`` (default 1, in place of ``block_rows=``) runs the loop on CPU
  threads, each on a contiguous range of rows (forward) or chunks
  (backward), which fix the order of every sum: the same bits on any number;
* outputs of :data:`STREAM_BYTES` or more, in rows of :data:`GROUP_FROM_D`
  or more, are computed a row into a buffer in cache and streamed out a
  whole 64-byte line at a time, without the read a plain store makes first;
* float16 is read and written as its bits (Numba has no float16 arrays on
  the CPU), converted in registers by the CPU's instructions (x86 F16C,
  64-bit Arm): no converted copy. Without them the loops run on float64
  copies. Either way an output is rounded from float64 once, to nearest.

Examples
--------
>>> import numpy as np
>>> from lnorm import fused
>>> x = np.arange(6.0).reshape(2, 3)
>>> y, cache = fused.forward(x, np.ones(3), np.zeros(3))
>>> np.round(y, 4)
array([[-1.2247,  0.    ,  1.2247],
       [-1.2247,  0.    ,  1.2247]])
>>> dx, dgamma, dbeta = fused.backward(np.ones((2, 3)), cache)
>>> bool(np.all(dx == 0)), dbeta
(True, array([2., 2., 2.]))
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

from .cache import ACC_DTYPE, LayerNormCache, make_cache
from .validate import (
    as_rows,
    check_backward_out,
    check_dy,
    check_eps,
    check_forward_out,
    check_int,
    check_param,
)

__all__ = ["forward", "backward", "empty_apart", "BLOCK_ROWS", "GROUP_ROWS",
           "GROUP_FROM_D", "CHUNK_ROWS", "STREAM_BYTES", "APART_BYTES",
           "APART_FROM_BYTES"]

#: Rows per block of the ``dgamma``/``dbeta`` partial sums.
BLOCK_ROWS = 256

#: Rows whose first sweeps run together in the backward, which then loads and
#: stores the ``dgamma``/``dbeta`` accumulators once per four rows.
GROUP_ROWS = 4

#: The shortest row the backward takes in groups (shorter ran slower so).
GROUP_FROM_D = 768

#: Rows per chunk of the backward. A chunk fills ``dgamma``/``dbeta`` blocks of
#: its own (grouped as a batch of its own), so threads can take whole chunks.
CHUNK_ROWS = 1024

#: Fast-math flags of the loops that sum (see the module docstring).
FASTMATH = {"reassoc", "contract"}

_F16, _U16 = np.dtype(np.float16), np.dtype(np.uint16)  # uint16: float16's bits


def _last_level_cache_bytes(default: int = 32 * 2**20) -> int:
    """Size of the largest data cache of CPU 0 (Linux sysfs), else ``default``."""
    sizes = [default]
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            kind, size = ((idx / f).read_text().strip() for f in ("type", "size"))
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        if kind != "Instruction" and size.rstrip("KMG").isdigit():
            sizes.append(int(size.rstrip("KMG")) * scale)
    return max(sizes[1:], default=default)


#: Bytes of an output from which the loops stream it, half the largest data
#: cache of CPU 0. A smaller output is better left in cache for its reader.
STREAM_BYTES = _last_level_cache_bytes() // 2


# --- float16 in registers -------------------------------------------------------
# LLVM's half type needs conversion instructions: on x86 without F16C it calls
# a runtime function Numba's JIT lacks, and the process dies.

@functools.cache
def _native_half() -> bool:
    """Whether LLVM converts float16 in instructions for Numba's target CPU."""
    arch = llvm.get_process_triple().split("-")[0]
    if arch not in ("x86_64", "i386", "i686"):
        return arch in ("aarch64", "arm64")
    features = config.CPU_FEATURES  # '' for NUMBA_CPU_NAME=generic
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    return "+f16c" in features.split(",")


@intrinsic
def _wide(typingctx, v):
    """``v`` as float64: a float widened, or uint16 bits read as float16 (exact)."""
    if isinstance(v, types.Integer) and v.bitwidth == 16:  # float16 bits
        def codegen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()),
                                 ir.DoubleType())
    elif isinstance(v, types.Float):
        def codegen(context, builder, signature, args):
            return context.cast(builder, args[0], v, types.float64)
    else:
        return None
    return types.float64(v), codegen


def _to_odd_single(builder, d):
    """float64 ``d`` rounded to float32 *to odd* (toward zero, the last bit set
    if inexact): rounded again to float16 it gives ``d`` rounded once."""
    i32 = ir.IntType(32)
    single = builder.fptrunc(d, ir.FloatType())  # to nearest
    back = builder.fpext(single, ir.DoubleType())
    fabs = builder.module.declare_intrinsic("llvm.fabs", [ir.DoubleType()])
    bits = builder.bitcast(single, i32)
    even = builder.icmp_unsigned("==", builder.and_(bits, ir.Constant(i32, 1)),
                                 ir.Constant(i32, 0))
    inexact = builder.fcmp_ordered("!=", back, d)  # false for NaN
    # An even result rounded away from zero steps back toward zero (odd, the
    # truncation); one rounded toward zero steps out (odd).
    below = builder.fcmp_ordered("<", builder.call(fabs, [back]),
                                 builder.call(fabs, [d]))
    step = builder.select(below, ir.Constant(i32, 1), ir.Constant(i32, -1))
    odd = builder.select(builder.and_(even, inexact), builder.add(bits, step), bits)
    return builder.bitcast(odd, ir.FloatType())


@intrinsic
def _narrow(typingctx, v, like):
    """float64 ``v`` rounded once to the element type of array ``like`` (uint16:
    float16, as bits; LLVM has no direct float64 to float16 instruction)."""
    dtype = like.dtype
    if isinstance(dtype, types.Integer) and dtype.bitwidth == 16:
        def codegen(context, builder, signature, args):
            single = _to_odd_single(builder, args[0])
            return builder.bitcast(builder.fptrunc(single, ir.HalfType()),
                                   ir.IntType(16))
    elif isinstance(dtype, types.Float):
        def codegen(context, builder, signature, args):
            return context.cast(builder, args[0], types.float64, dtype)
    else:
        return None
    return dtype(types.float64, like), codegen


# --- streaming stores --------------------------------------------------------------
# Numba has no streaming store: these intrinsics emit a store of a 64-byte
# vector (one line) marked !nontemporal, and a fence before the call returns.
_VECTOR_BYTES = 64


@intrinsic
def _stream_vectors(typingctx, dst, src, start, nvec):
    """``dst[start:][:nvec*W] = src[start:][:nvec*W]`` with streaming stores,
    ``W = 64 // itemsize``; ``dst[start]`` 64-byte aligned."""
    sig = types.void(dst, src, start, nvec)

    def codegen(context, builder, signature, args):
        dty, sty, _, _ = signature.args
        d_arr, s_arr, i, n = args
        dptr = cgutils.get_item_pointer(context, builder, dty, context.make_array(
            dty)(context, builder, d_arr), [i], wraparound=False)
        sptr = cgutils.get_item_pointer(context, builder, sty, context.make_array(
            sty)(context, builder, s_arr), [i], wraparound=False)
        width = _VECTOR_BYTES // (dty.dtype.bitwidth // 8)
        vty = ir.VectorType(context.get_value_type(dty.dtype), width)
        dvec = builder.bitcast(dptr, vty.as_pointer())
        svec = builder.bitcast(sptr, vty.as_pointer())
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, n) as loop:
            v = builder.load(builder.gep(svec, [loop.index]),
                             align=dty.dtype.bitwidth // 8)
            st = builder.store(v, builder.gep(dvec, [loop.index]), align=_VECTOR_BYTES)
            st.set_metadata("nontemporal", nontemporal)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _fence(typingctx):
    """Order the streaming stores before everything after them (once a call)."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")  # mfence on x86, which orders them too
        return context.get_dummy_value()

    return types.void(), codegen


@nb.njit(cache=True, inline="always")
def _store_row(dst, buf):
    """``dst[:] = buf``: streaming stores of whole 64-byte lines, plain stores
    before the first line boundary and after the last whole line (no slices:
    a view's reference count is a locked add, which drains the stores)."""
    D, size = buf.shape[0], buf.itemsize
    head = min((-dst.ctypes.data) % _VECTOR_BYTES // size, D)
    nvec = (D - head) // (_VECTOR_BYTES // size)
    for j in range(head):
        dst[j] = buf[j]
    _stream_vectors(dst, buf, head, nvec)
    for j in range(head + nvec * (_VECTOR_BYTES // size), D):
        dst[j] = buf[j]


# --- the row loops ----------------------------------------------------------------

@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _row_sum(x):
    """sum(x) in float64."""
    total = 0.0
    for j in range(x.shape[0]):
        total += _wide(x[j])
    return total


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _row_squares(x, mean):
    """sum((x - mean)**2) in float64."""
    sq = 0.0
    for j in range(x.shape[0]):
        d = _wide(x[j]) - mean
        sq += d * d
    return sq


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _normalize_row(x, gamma, beta, mean, rstd, y, xhat):
    """xhat = (x - mean) * rstd and y = gamma * xhat + beta."""
    for j in range(x.shape[0]):
        h = (_wide(x[j]) - mean) * rstd
        xhat[j] = _narrow(h, xhat)
        y[j] = _narrow(h * gamma[j] + beta[j], y)


@nb.njit(cache=True, inline="always")
def _is_constant(x):
    """Whether every element of ``x`` equals the first."""
    first = _wide(x[0])
    for j in range(1, x.shape[0]):
        if _wide(x[j]) != first:
            return False
    return True


@nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
def _forward_rows(x, gamma, beta, eps, y, xhat, rstd):
    """y, xhat and rstd row by row. (No helper takes ``x`` or a row of it
    across branches: Numba would count its references, a locked add, per row.)"""
    D = x.shape[1]
    for r in range(x.shape[0]):
        mean = _row_sum(x[r]) / D
        sq = _row_squares(x[r], mean)
        if sq <= D * (2.5e-16 * D * mean) ** 2 and _is_constant(x[r]):
            mean, sq = _wide(x[r, 0]), 0.0  # a constant row's value, exactly
        rstd[r] = 1.0 / np.sqrt(sq / D + eps)
        _normalize_row(x[r], gamma, beta, mean, rstd[r], y[r], xhat[r])


@nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
def _forward_rows_streamed(x, gamma, beta, eps, y, xhat, rstd):
    """:func:`_forward_rows`, a row's outputs computed into buffers in cache and
    streamed out from there."""
    D = x.shape[1]
    # The buffers and gamma and beta (read every row) in one block, 64-byte
    # aligned, each a quarter page from the others modulo 4 KiB (empty_apart).
    part = -(-D * 8 // 4096) * 4096 + 1024
    block = np.empty(4 * part + 64, np.uint8)
    at = (-block.ctypes.data) % 64
    held_y = block[at:at + D * y.itemsize].view(y.dtype)
    held_xhat = block[at + part:at + part + D * y.itemsize].view(y.dtype)
    g = block[at + 2 * part:at + 2 * part + 8 * D].view(np.float64)
    b = block[at + 3 * part:at + 3 * part + 8 * D].view(np.float64)
    g[:] = gamma
    b[:] = beta
    for r in range(x.shape[0]):
        mean = _row_sum(x[r]) / D
        sq = _row_squares(x[r], mean)
        if sq <= D * (2.5e-16 * D * mean) ** 2 and _is_constant(x[r]):
            mean, sq = _wide(x[r, 0]), 0.0  # a constant row's value, exactly
        rstd[r] = 1.0 / np.sqrt(sq / D + eps)
        _normalize_row(x[r], g, b, mean, rstd[r], held_y[:D], held_xhat[:D])
        _store_row(y[r], held_y[:D])
        _store_row(xhat[r], held_xhat[:D])
    _fence()


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _row_sums(dy, xhat, gamma, dgamma, dbeta):
    """sum(g), sum(g * xhat) of a row; adds dy * xhat to dgamma, dy to dbeta."""
    sum_g = 0.0
    sum_gxhat = 0.0
    for j in range(dy.shape[0]):
        d = _wide(dy[j])
        p = d * _wide(xhat[j])
        sum_g += d * gamma[j]
        sum_gxhat += p * gamma[j]
        dgamma[j] += p
        dbeta[j] += d
    return sum_g, sum_gxhat


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _group_sums(dy0, dy1, dy2, dy3, xh0, xh1, xh2, xh3, gamma, dgamma, dbeta):
    """:func:`_row_sums` of four rows in one sweep, their terms added pairwise
    into ``dgamma`` and ``dbeta``; returns the four of each sum."""
    g0 = g1 = g2 = g3 = 0.0
    gx0 = gx1 = gx2 = gx3 = 0.0
    for j in range(dy0.shape[0]):
        gj = gamma[j]
        d0, d1 = _wide(dy0[j]), _wide(dy1[j])
        d2, d3 = _wide(dy2[j]), _wide(dy3[j])
        p0, p1 = d0 * _wide(xh0[j]), d1 * _wide(xh1[j])
        p2, p3 = d2 * _wide(xh2[j]), d3 * _wide(xh3[j])
        g0, g1, g2, g3 = g0 + d0 * gj, g1 + d1 * gj, g2 + d2 * gj, g3 + d3 * gj
        gx0, gx1, gx2, gx3 = gx0 + p0 * gj, gx1 + p1 * gj, gx2 + p2 * gj, gx3 + p3 * gj
        dgamma[j] += (p0 + p1) + (p2 + p3)
        dbeta[j] += (d0 + d1) + (d2 + d3)
    return (g0, g1, g2, g3), (gx0, gx1, gx2, gx3)


@nb.njit(cache=True)
def _dx_row(dy, xhat, gamma, rstd, r, mean_g, mean_gxhat, out, out_r):
    """Row ``r`` of dx into row ``out_r`` of ``out``, without fast-math flags
    (not inlined: a function inlined into a loop takes that loop's flags)."""
    for j in range(dy.shape[1]):
        g = _wide(dy[r, j]) * gamma[j]
        rest = g - _wide(xhat[r, j]) * mean_gxhat
        out[out_r, j] = _narrow(rstd[r] * (rest - mean_g), out)


@nb.njit(cache=True)
def _grouping(rows, D):
    """``Q``, the rows in each quarter of the rows taken in groups (0 for short
    rows), and the blocks of partial sums those groups fill."""
    quarter = rows // GROUP_ROWS if D >= GROUP_FROM_D else 0
    return quarter, -(-quarter // (BLOCK_ROWS // GROUP_ROWS))


@nb.njit(cache=True, fastmath=FASTMATH)
def _backward_rows(dy, xhat, gamma, rstd, dx, dgamma, dbeta, stream):
    """dx of one chunk, a group of rows (or a row) at a time, and the sums of
    each block (module docstring); with ``stream``, grouped rows stream dx."""
    rows, D = dy.shape
    quarter, grouped_blocks = _grouping(rows, D)
    held = np.empty((1, D if stream else 0), dx.dtype)
    for q in range(quarter):
        b = q // (BLOCK_ROWS // GROUP_ROWS)
        r0, r1, r2, r3 = q, q + quarter, q + 2 * quarter, q + 3 * quarter
        sg, sgx = _group_sums(dy[r0], dy[r1], dy[r2], dy[r3],
                              xhat[r0], xhat[r1], xhat[r2], xhat[r3],
                              gamma, dgamma[b], dbeta[b])
        for k in range(GROUP_ROWS):
            r = q + k * quarter
            if not stream:
                _dx_row(dy, xhat, gamma, rstd, r, sg[k] / D, sgx[k] / D, dx, r)
                continue
            _dx_row(dy, xhat, gamma, rstd, r, sg[k] / D, sgx[k] / D, held, 0)
            _store_row(dx[r], held[0])
    first = GROUP_ROWS * quarter
    for r in range(first, rows):
        b = grouped_blocks + (r - first) // BLOCK_ROWS
        s, sx = _row_sums(dy[r], xhat[r], gamma, dgamma[b], dbeta[b])
        _dx_row(dy, xhat, gamma, rstd, r, s / D, sx / D, dx, r)
    if stream:
        _fence()


@nb.njit(cache=True)
def _block_count(rows, D):
    """How many ``dgamma``/``dbeta`` partial rows :func:`_backward_rows` fills."""
    quarter, grouped_blocks = _grouping(rows, D)
    return grouped_blocks + -(-(rows - GROUP_ROWS * quarter) // BLOCK_ROWS)


@nb.njit(cache=True)
def _chunked_block_count(rows, D):
    """How many partial rows :func:`_backward_chunks` fills over all chunks."""
    whole, rest = divmod(rows, CHUNK_ROWS)
    return whole * _block_count(CHUNK_ROWS, D) + (_block_count(rest, D) if rest else 0)


@nb.njit(cache=True, nogil=True)
def _backward_chunks(dy, xhat, gamma, rstd, dx, dgamma, dbeta, stream, first, last):
    """:func:`_backward_rows` over chunks ``first`` to ``last - 1``, each into
    partial rows of its own."""
    rows, D = dy.shape
    per_chunk = _block_count(CHUNK_ROWS, D)
    for c in range(first, last):
        a = c * CHUNK_ROWS
        e = min(a + CHUNK_ROWS, rows)
        b = c * per_chunk
        n = _block_count(e - a, D)
        _backward_rows(dy[a:e], xhat[a:e], gamma, rstd[a:e], dx[a:e],
                       dgamma[b:b + n], dbeta[b:b + n], stream)


@nb.njit(cache=True)
def _sum_blocks(partials, total):
    """``total = partials[0] + partials[1] + ...`` in that order in float64,
    rounded once to the dtype of ``total`` (float16 as bits)."""
    acc = np.zeros(partials.shape[1])
    for b in range(partials.shape[0]):  # row by row: unit stride, vectorized
        for j in range(partials.shape[1]):
            acc[j] += partials[b, j]
    for j in range(partials.shape[1]):
        total[j] = _narrow(acc[j], total)


# --- the public functions ---------------------------------------------------------

def _loop_dtype(dtype: np.dtype) -> np.dtype:
    """How the loops hold ``dtype``: float16 as bits (float64 without F16C)."""
    if dtype != _F16:
        return dtype
    return _U16 if _native_half() else np.dtype(ACC_DTYPE)


def _rows_for_loop(a: np.ndarray) -> np.ndarray:
    """``a`` as the C-ordered 2-D rows the loops read (a view where it can be)."""
    rows = np.ascontiguousarray(a.reshape(-1, a.shape[-1]))
    held = _loop_dtype(rows.dtype)
    return rows.view(held) if held == _U16 else rows.astype(held, copy=False)


#: Bytes between the starts of two arrays that one loop streams through
#: together, modulo a 4 KiB page (see :func:`empty_apart`).
APART_BYTES = 256

#: Arrays from this size on are placed :data:`APART_BYTES` apart (moving one
#: costs a page of address space).
APART_FROM_BYTES = 16 * 4096


def empty_apart(shape, dtype, *others: np.ndarray) -> np.ndarray:
    r"""``np.empty(shape, dtype)``, placed in its page away from ``others``.

    Large arrays start at one place in a page (glibc maps them fresh): with
    rows of 4 KiB, element ``j`` of every row of every array has one address
    modulo 4 KiB, the bits that pick an L1 set and that an x86 core compares
    to tell a load from an earlier store. An array of
    :data:`APART_FROM_BYTES` or more starts at a 64-byte line at least
    :data:`APART_BYTES` from each of ``others`` (up to seven) modulo 4 KiB,
    as a view into a slightly larger buffer. The loops place their outputs
    so; use it for ``out=`` buffers, with the arrays the loop streams as
    ``others`` (``x``; ``dy`` and ``cache.xhat``).

    Examples
    --------
    >>> x = np.zeros((2**14, 1024), np.float32)  # 64 MiB
    >>> y = empty_apart(x.shape, x.dtype, x)
    >>> y.shape, (y.ctypes.data - x.ctypes.data) % 4096 >= APART_BYTES
    ((16384, 1024), True)
    """
    shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < APART_FROM_BYTES:
        return np.empty(shape, dtype)
    taken = [o.ctypes.data % 4096 for o in others]

    def nearest(t: int) -> int:
        return min((min((t - a) % 4096, (a - t) % 4096) for a in taken), default=4096)

    # Each other rules out at most 8 of the 64 line starts: seven leave one.
    target = max(range(0, 4096, 64), key=lambda t: (min(nearest(t), APART_BYTES), -t))
    buf = np.empty(nbytes + 4096, dtype=np.uint8)
    start = (target - buf.ctypes.data) % 4096
    return buf[start : start + nbytes].view(dtype).reshape(shape)


def _output(out, shape, dtype, *apart: np.ndarray) -> np.ndarray:
    """Where the loop writes an output: ``out`` where it can, else a new array
    apart from ``apart``."""
    held = _loop_dtype(np.dtype(dtype))
    if held not in (_U16, dtype):
        return np.empty(shape, held)
    a = empty_apart(shape, dtype, *apart) if out is None else out.reshape(shape)
    return a.view(held)


def _deliver(result: np.ndarray, out, shape, dtype) -> np.ndarray:
    """What the caller gets from the loop's ``result``: ``out``, or a new array."""
    result = result.view(_F16) if result.dtype == _U16 else result
    if out is None:
        return result.astype(dtype, copy=False).reshape(shape)
    if not np.may_share_memory(out, result):  # float16 without F16C
        np.copyto(out, result.reshape(out.shape))
    return out


_THREADS_HINT = "threads is how many CPU threads run the loop."


def _streams(out: np.ndarray, D: int) -> bool:
    """Whether the loops write ``out`` with streaming stores."""
    return out.nbytes >= STREAM_BYTES and D >= GROUP_FROM_D


def _in_threads(fn, jobs: list[tuple]) -> None:
    """``fn(*job)`` for every job, the first in this thread, each other in a new
    thread (the loops release the GIL); re-raises their errors."""
    errors: list[BaseException] = []

    def run(job: tuple) -> None:
        try:
            fn(*job)
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    others = [threading.Thread(target=run, args=(job,)) for job in jobs[1:]]
    for t in others:
        t.start()
    run(jobs[0])
    for t in others:
        t.join()
    if errors:
        raise errors[0]


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``range(n)`` in ``min(parts, n)`` contiguous pieces of nearly equal size."""
    parts = max(min(parts, n), 1)
    return [(t * n // parts, (t + 1) * n // parts) for t in range(parts)]


def forward(
    x, gamma, beta, eps: float = 1e-5, *, out=None, threads: int = 1
) -> tuple[np.ndarray, LayerNormCache]:
    r"""Normalize each row over the last axis in one compiled pass per row.

    ``y = gamma * (x - mean) / sqrt(var + eps) + beta`` per row, as
    :func:`lnorm.core.forward`, with the same checks, results (to float64
    rounding before the final rounding to the dtype of ``x``) and cache.
    :func:`lnorm.forward` calls this unless it is given ``block_rows``.

    Parameters
    ----------
    x : array_like, shape (..., D)
        float16, float32 or float64, any number of rows (zero too).
    gamma, beta : array_like, shape (D,)
    eps : float, default 1e-5
        Finite and > 0.
    out : tuple of two ndarrays, optional
        ``(y, xhat)``: C-contiguous arrays of the shape and dtype of ``x`` to
        write into. The cache then holds a read-only view of the ``xhat``
        buffer, which the next forward into it overwrites.
    threads : int, default 1

    Returns
    -------
    y : ndarray, shape and dtype of ``x`` (``out[0]`` when given)
    cache : LayerNormCache
        ``xhat`` (dtype of ``x``), ``rstd`` (float64) and a copy of ``gamma``.

    Raises
    ------
    TypeError, ValueError
        As :func:`lnorm.core.forward`; an ``out`` that
        :func:`lnorm.validate.check_forward_out` refuses; bad ``threads``.

    Examples
    --------
    >>> y, cache = forward(np.array([[1.0, 3.0]]), np.ones(2), np.zeros(2), eps=1e-12)
    >>> y, cache.rstd.dtype
    (array([[-1.,  1.]]), dtype('float64'))
    """
    x = as_rows(x, "x")
    D = x.shape[-1]
    gamma = check_param(gamma, "gamma", D)
    beta = check_param(beta, "beta", D)
    eps = check_eps(eps)
    y_out, xhat_out = check_forward_out(out, x)
    threads = check_int(threads, "threads", 1, _THREADS_HINT)

    x2 = _rows_for_loop(x)
    y = _output(y_out, x2.shape, x.dtype, x2)
    xhat = _output(xhat_out, x2.shape, x.dtype, x2, y)
    rstd = np.empty(x2.shape[0], dtype=ACC_DTYPE)
    g = gamma.astype(ACC_DTYPE, copy=False)
    b = beta.astype(ACC_DTYPE, copy=False)
    if x2.shape[0]:
        loop = _forward_rows_streamed if _streams(y, D) else _forward_rows
        _in_threads(loop, [(x2[a:e], g, b, eps, y[a:e], xhat[a:e], rstd[a:e])
                           for a, e in _split(x2.shape[0], threads)])
    y = _deliver(y, y_out, x.shape, x.dtype)
    xhat = _deliver(xhat, xhat_out, x.shape, x.dtype)
    return y, make_cache(xhat, rstd.reshape(x.shape[:-1]), gamma)


def backward(
    dy, cache: LayerNormCache, *, out=None, threads: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Compute the gradients of layer normalization in one compiled pass per row.

    With ``g = gamma * dy`` and ``mean`` the mean over the row, as
    :func:`lnorm.core.backward`::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy

    :func:`lnorm.backward` calls this unless it is given ``block_rows``.

    Parameters
    ----------
    dy : array_like, shape of ``x``
    cache : LayerNormCache
        From :func:`forward` or :func:`lnorm.core.forward`.
    out : ndarray, optional
        A C-contiguous array of the shape and dtype of ``x`` for ``dx``.
    threads : int, default 1

    Returns
    -------
    dx : ndarray, shape and dtype of ``x`` (``out`` when given)
    dgamma, dbeta : ndarray, shape (D,), dtype of ``gamma``

    Raises
    ------
    TypeError, ValueError
        As :func:`lnorm.core.backward`; an ``out`` that
        :func:`lnorm.validate.check_backward_out` refuses; bad ``threads``.

    Examples
    --------
    >>> y, cache = forward(np.array([[1.0, 2.0, 4.0]]), np.ones(3), np.zeros(3))
    >>> dx, dgamma, dbeta = backward(np.ones((1, 3)), cache)
    >>> float(abs(dx).max()) < 1e-15
    True
    """
    dy = check_dy(dy, cache)
    out = check_backward_out(out, dy, cache)
    threads = check_int(threads, "threads", 1, _THREADS_HINT)
    D = cache.shape[-1]
    dy2 = _rows_for_loop(dy)
    xhat2 = _rows_for_loop(cache.xhat)
    rows = dy2.shape[0]
    dx = _output(out, dy2.shape, cache.dtype, dy2, xhat2)
    partial_dgamma = np.zeros((_chunked_block_count(rows, D), D), dtype=ACC_DTYPE)
    partial_dbeta = np.zeros_like(partial_dgamma)
    args = (dy2, xhat2, cache.gamma.astype(ACC_DTYPE), cache.rstd.reshape(-1), dx,
            partial_dgamma, partial_dbeta, _streams(dx, D))
    _in_threads(_backward_chunks, [
        (*args, a, e) for a, e in _split(-(-rows // CHUNK_ROWS), threads)
    ])
    totals = [_output(None, D, cache.gamma.dtype) for _ in range(2)]
    _sum_blocks(partial_dgamma, totals[0])
    _sum_blocks(partial_dbeta, totals[1])
    dgamma, dbeta = (_deliver(t, None, D, cache.gamma.dtype) for t in totals)
    return _deliver(dx, out, cache.shape, cache.dtype), dgamma, dbeta
