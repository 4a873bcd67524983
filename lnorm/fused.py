r"""Layer norm fused on the CPU: one compiled loop per row (Numba).

The NumPy functions of :mod:`lnorm.core` run the formula operator by
operator, and every operator streams a whole tensor through main memory.
Here the same arithmetic runs row by row in a loop that Numba compiles: a
row is read from memory once, its reductions are accumulated in float64
registers, and its outputs are written once while the row is still in
cache. That is the schedule of the GPU kernels of the GPU chapter (one
pass per row, both reductions in registers), on CPU cores.

Per row of length ``D``:

* forward: ``mean = sum(x) / D``, then ``var = sum((x - mean)**2) / D``
  over the row again (from cache), ``rstd = 1 / sqrt(var + eps)``, then
  ``xhat = (x - mean) * rstd`` and ``y = gamma * xhat + beta`` in one sweep
  (from cache), one row after the other;
* backward: ``sum(g)`` and ``sum(g * xhat)`` with ``g = gamma * dy`` in one
  sweep, which also adds ``dy * xhat`` and ``dy`` into the block's
  ``dgamma`` and ``dbeta``; then ``dx = rstd * (g - mean(g) - xhat *
  mean(g * xhat))`` in a second sweep over the row (from cache). Rows of
  at least :data:`GROUP_FROM_D` elements take the first sweep four rows at
  a time, a quarter of a chunk of rows apart, which loads and stores the
  ``dgamma``/``dbeta`` accumulators once per four rows instead of once per
  row; the second sweep then writes the ``dx`` of the four rows, from
  cache, and asks memory for the next group's rows as it goes (software
  prefetch, :data:`STEP`).

Same checks, errors, dtype policy and :class:`lnorm.cache.LayerNormCache`
as :func:`lnorm.core.forward` and :func:`lnorm.core.backward` (``threads=``
takes the place of their ``block_rows=``):

* every statistic and every reduction is accumulated in float64, whatever
  the input dtype; ``y``, ``xhat`` and ``dx`` are rounded once to the
  input dtype, ``dgamma`` and ``dbeta`` once to the dtype of ``gamma``;
* ``dgamma`` and ``dbeta`` are summed in float64 per block of
  :data:`BLOCK_ROWS` rows of a chunk of :data:`CHUNK_ROWS` rows (where rows
  go in groups of four, the four are added pairwise first), then across
  blocks in a fixed order, so the result depends on nothing but the inputs;
* NaN and Inf stay in their row: the fast-math flags are ``reassoc`` (LLVM
  may split a row's sum over vector lanes) and ``contract`` (fused
  multiply-adds), never ``nnan`` or ``ninf``; the sweep that writes ``dx``
  takes no flag: it has no sum to split, ``reassoc`` made LLVM divide by
  ``D`` once per element there, and ``contract`` would keep the rounding
  error of ``g`` in ``g - mean(g)`` (a row with ``D = 1`` would get a
  nonzero ``dx``); its one fused multiply-add is written out
  (``g - xhat * mean(g * xhat)``, ``_mul_add``, where the CPU has one);
* a constant row gives ``xhat = 0`` and ``y = beta`` exactly, and a row of
  one element ``dx = 0``.

float16: Numba has no float16 arrays on the CPU, so the loops read and
write float16 arrays as their bits (a ``uint16`` view) and convert each
element in registers (``_wide``, ``_narrow``): with the CPU's conversion
instructions where LLVM has them (x86 with F16C, 64-bit Arm), else with
integer operations on the bits. No converted copy of any tensor is made.
An output is rounded from float64 to float16 once, to nearest (ties to
even).

The large arrays allocated here (``xhat``, ``y``, ``dx``, and C-ordered
copies of non-contiguous inputs) start :data:`APART_BYTES` or more from the
arrays they are streamed with, modulo 4 KiB, so that rows of 4 KiB do not
send every stream to the same address bits at once (see
:func:`empty_apart`).

Large outputs (``dx``; ``y`` and ``xhat``) are written with non-temporal
(streaming) stores. On a CPU with write-back caches (x86 among them), a
plain store to a line that is not in cache first reads the line
(write-allocate), so a row written plainly moves twice its bytes; a
streaming store goes through a write-combining buffer and, once the whole
64-byte line is written, sends it to memory without reading it. For
outputs that fit in the last-level cache with the inputs plain stores are
faster (the next reader finds them in cache), so streaming is used from
:data:`STREAM_BYTES` of output on, for rows of at least
:data:`GROUP_FROM_D` elements (in the backward, the rows of a chunk left
over after its groups of four are still stored plainly). A span of output
is then computed into a buffer in cache (in the backward, a buffer of four
rows) and streamed out from there in 64-byte vectors, one whole line each.
The fence after them is the x86 intrinsic ``llvm.x86.sse.sfence``, and the
measurements quoted in this module are from one x86-64 machine.

Both functions take ``out=``, arrays to write into instead of new ones
(allocate them with :func:`empty_apart`). A new array of many megabytes is
usually fresh memory from the operating system (glibc maps large blocks
anew), which zeroes each page when it is first touched: a pass over the
output that a training loop reusing its buffers does not pay.

Both take ``threads=`` (default 1), the CPU threads that run the loop; the
loops release the GIL. The forward gives each thread a contiguous range of
rows. The backward runs chunk by chunk, :data:`CHUNK_ROWS` rows each with
``dgamma``/``dbeta`` blocks of its own, and gives each thread a contiguous
range of chunks. The chunks, not the threads, fix the order of every sum:
the results are the same bits on any number of threads.

The cost chapter (``book/05_cost.md``) measures these loops against the
copy bandwidth and explains why each detail above matters.

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

__all__ = [
    "forward",
    "backward",
    "BLOCK_ROWS",
    "GROUP_ROWS",
    "GROUP_FROM_D",
    "STREAM_BYTES",
    "APART_BYTES",
    "APART_FROM_BYTES",
    "SPAN",
    "STEP",
    "CHUNK_ROWS",
    "empty_apart",
]

#: Rows per block of the ``dgamma``/``dbeta`` partial sums.
BLOCK_ROWS = 256

#: Rows whose first sweeps run together in the backward (``_group_sums``, which
#: is written out for four), for rows of at least :data:`GROUP_FROM_D`
#: elements. Four rows share one update of the ``dgamma``/``dbeta``
#: accumulators and keep eight streams of reads in flight; at (4096, 1024)
#: float32 this took the backward from about 1.1 to 0.8 ns per element on the
#: 2-core machine the book is built on (one measurement there, not a
#: property of every CPU). Shorter rows ran slower in groups there, so they
#: go one by one. The rows of a group are a quarter of the
#: chunk apart (``q``, ``q + Q``, ``q + 2Q``, ``q + 3Q`` with ``Q = N // 4``,
#: ``N`` the rows of the chunk, :data:`CHUNK_ROWS` or fewer):
#: each of the four streams then runs on into the next row, where the
#: hardware prefetcher is likely already fetching, instead of into rows
#: already read (about 10 % faster at (4096, 1024) than four neighbouring
#: rows, on the same machine, before the loop prefetched: see :data:`STEP`).
#: With the prefetch, four neighbouring rows (prefetching the next four)
#: took 0.95-0.96 of the time in 80 paired calls, where an identical copy of
#: the loop took 0.97 against itself (2026-11-26 evening): too close to move
#: the rows, and with them the bits of ``dgamma`` and ``dbeta``.
GROUP_ROWS = 4

#: The shortest row that the backward takes in groups of :data:`GROUP_ROWS`,
#: and that the loops write with streaming stores (from :data:`STREAM_BYTES`):
#: at D = 64 streaming rows one by one took twice as long as plain stores
#: (on the book's machine).
GROUP_FROM_D = 768

#: Fast-math flags of the row loops — reassociation lets LLVM split a row's
#: sum over vector lanes (a fixed order for a given build); contraction lets
#: it fuse a multiply and an add. Neither assumes finite values, so NaN and
#: Inf propagate as in NumPy.
FASTMATH = {"reassoc", "contract"}

#: The loop that writes dx takes no fast-math flag. It has no sum to split,
#: so it vectorizes without ``reassoc``; with it, LLVM rewrote
#: ``xhat * (s / D)`` as ``(xhat * s) / D``, a division per element (about
#: 15 % of the backward's time). And contraction would turn ``g - mean(g)``
#: into a fused multiply-add that keeps the rounding error of
#: ``g = dy * gamma``: a row of length one would get a nonzero ``dx``. The
#: one multiply-add the loop wants, ``g - xhat * mean(g * xhat)``, it calls
#: explicitly (``_mul_add``): one operation and one rounding fewer per element
#: than a product and a difference. The backward at (4096, 1024) float32
#: took 0.98 of the separate form's time (mean of nine paired runs,
#: 0.94-1.01, 2026-11-26 evening session).
FASTMATH_DX = False

#: Elements per step of the backward's first sweep over a row or a group of
#: rows (the sums), and per buffer of the forward's streamed output (the
#: backward streams in steps of :data:`STEP`). A step of a group touches
#: 32 KiB of ``dy`` and ``xhat`` (four rows, float32) and 24 KiB of float64
#: ``gamma``, ``dgamma`` and ``dbeta``, about one L1 data cache (48 KiB per
#: core on the book's machine); long enough for whole vector loops and few
#: steps. Chosen by measurement: at (4096, 1024) float32, 1024 took the
#: backward from about 0.54 to 0.47 ns per element against 256 on the 2-core
#: AMD EPYC of the 2026-11-26 session.
SPAN = 1024

#: Elements of ``dx`` per step of the backward's second sweep over a group,
#: which also prefetches the same elements of the next group's rows (software
#: prefetch, ``_prefetch``): the second sweep reads only from cache, and
#: without it main memory would idle while the core computes. Spread in steps
#: of 256, the requests took the backward at (4096, 1024) float32 from about
#: 1.9 to 1.4 times the copy floor on the 2-core AMD EPYC of the 2026-11-26
#: session; 64 and 1024 gained less (presumably a burst of requests stalls
#: the core; not measured directly).
STEP = 256

# What else was tried for the second sweep and its prefetch (kept out of
# STEP's documentation, which the API reference shows):
# Tried on that machine in the 2026-11-26 afternoon session and slower
# (times / copy floor at (8, 512, 1024), same run): half of the next group
# prefetched during the first sweep and half during the second (1.62-1.89
# against 1.43-1.49); the prefetch two groups ahead (1.49-1.57 against
# 1.43-1.48); into L2 only, ``prefetcht1`` (1.76-1.78); the four rows' dx in
# one call (not vectorized, 2-5 times slower in cache); a row's dx in one
# call with its prefetch inside (1.57-1.63 against 1.44). In cache (rows in
# L2) the loop takes about 0.28 ns an element, as much as the copy floor's
# 0.31 out of cache: on that machine the backward's time is its arithmetic
# and the overlap of that arithmetic with memory, not the bytes.
# Tried in the evening session of the same day, not faster (same run, at
# (4096, 1024)): a share of the next group prefetched evenly through the
# first sweep as well (a quarter: 1.54 against 1.37; 40 %: 1.61-1.72
# against 1.37-1.56); only dy, only xhat, or only the first half of each
# row prefetched (1.60-1.76 against 1.34-1.48); rows one at a time,
# streamed, prefetching one or two rows ahead (1.51-1.73 against
# 1.29-1.50); the next row's sums and this row's dx in one loop (2.9-4.9);
# the second sweep a step at a time across the group's four rows instead
# of row by row (0.99-1.10 of the time; with steps of 64 or 128, 1.3-1.5).
# Loops that only move the bytes (add two rows, stream the sum out) show
# what the access pattern alone costs there: rows in order 1.0 times the
# floor, four rows a quarter apart in one sweep 1.11-1.15, those rows one
# at a time 1.35-1.43.

#: Rows per chunk of the backward. The loop runs chunk by chunk, and each
#: chunk fills ``dgamma``/``dbeta`` blocks of its own (its rows grouped as if
#: it were the whole batch), so that threads can take whole chunks
#: (``threads=``) and the sums are the same bits whatever their number.
CHUNK_ROWS = 1024

_F16 = np.dtype(np.float16)
_U16 = np.dtype(np.uint16)  # how the loops see float16: its bits
# Each streaming store the loops emit is a 64-byte vector, one whole cache
# line (one AVX-512 store; LLVM splits it into two 32-byte AVX stores on a
# CPU without AVX-512): a few percent faster than 32-byte vectors on the
# book's machine (an AMD EPYC with AVX-512).
_VECTOR_BYTES = 64


def _last_level_cache_bytes(default: int = 32 * 2**20) -> int:
    """Size of the largest data cache of CPU 0 (Linux sysfs), else ``default``."""
    sizes = []
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        if size.rstrip("KMG").isdigit():
            sizes.append(int(size.rstrip("KMG")) * scale)
    return max(sizes, default=default)


#: Bytes of an output (``dx``, or ``y``) from which the loops write with
#: streaming stores: half the largest data cache of CPU 0 as Linux reports it
#: (32 MiB when sysfs has no answer), taken as the last-level cache. With
#: the arrays it is streamed with, the call then moves at least one and a
#: half times the cache, so the rows written first are evicted by the rows
#: read after them before anyone reads them back; a smaller output is better
#: left in cache for its next reader.
STREAM_BYTES = _last_level_cache_bytes() // 2


# --- float16 as bits -----------------------------------------------------------
#
# Numba has no float16 arrays on the CPU; the loops take float16 arrays as
# uint16 views and convert each element in registers. Where the CPU Numba
# compiles for converts float16 in instructions (x86 with F16C, 64-bit Arm),
# with LLVM's half type; elsewhere with integer operations on the bits of a
# float64 (about two and a half times slower), since there LLVM would call a
# runtime function that Numba's JIT does not have (with NUMBA_CPU_NAME=generic
# the process would crash). Both round each output once and give the same
# bits.


def _has_x86_feature(name: str) -> bool:
    """Whether Numba's target CPU is x86 with feature ``name`` (``"f16c"``).
    With ``NUMBA_CPU_NAME=generic`` it has none."""
    arch = llvm.get_process_triple().split("-")[0]
    if arch not in ("x86_64", "i386", "i686"):
        return False
    features = config.CPU_FEATURES  # '' for NUMBA_CPU_NAME=generic
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    return f"+{name}" in features.split(",")


def _is_arm64() -> bool:
    """Whether this process runs on 64-bit Arm (which has float16 and FMA)."""
    return llvm.get_process_triple().split("-")[0] in ("aarch64", "arm64")


def _native_half() -> bool:
    """Whether LLVM converts float16 in instructions for Numba's target CPU."""
    return _is_arm64() or _has_x86_feature("f16c")


def _native_fma() -> bool:
    """Whether Numba's target CPU has fused multiply-add instructions."""
    return _is_arm64() or _has_x86_feature("fma")


@intrinsic
def _float_bits(typingctx, d):
    """The bits of float64 ``d``, as an int64."""
    if d != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(d), codegen


@intrinsic
def _bits_float(typingctx, b):
    """The float64 whose bits are int64 ``b``."""
    if b != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(b), codegen


@intrinsic
def _mul_add(typingctx, a, b, c):
    """``a * b + c`` in float64: rounded once (``llvm.fma``) where Numba's
    target CPU has fused multiply-add, else a product and a sum. On a CPU
    without it ``llvm.fma`` becomes a call to libm's ``fma`` per element,
    unvectorized: with ``NUMBA_CPU_NAME=generic`` that made the backward
    take 7.1 ms against 3.6 at (4096, 1024) float32, hence the fallback."""
    if not a == b == c == types.float64:
        return None

    def codegen(context, builder, signature, args):
        x, y, z = args
        if not _native_fma():
            return builder.fadd(builder.fmul(x, y), z)
        d = ir.DoubleType()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(d, [d, d, d]), "llvm.fma.f64")
        return builder.call(fn, [x, y, z])

    return types.float64(a, b, c), codegen


@nb.njit(cache=True, inline="always")
def _half_to_double(h):
    """float16 bits ``h`` as the float64 of the same value (exact)."""
    b = np.int64(h)
    sign = (b & 0x8000) << 48
    e = (b >> 10) & 0x1F
    m = b & 0x3FF
    # Normal, infinite or NaN: the same significand bits, the exponent moved.
    exp = 0x7FF if e == 0x1F else e + (1023 - 15)
    v = _bits_float(sign | (exp << 52) | (m << 42))
    sub = np.float64(m) * 2.0**-24  # zero or subnormal
    return v if e != 0 else (-sub if sign != 0 else sub)


@nb.njit(cache=True, inline="always")
def _double_to_half(d):
    """float64 ``d`` rounded once to float16 (to nearest, ties to even), as bits."""
    b = _float_bits(d)
    sign = (b >> 48) & 0x8000
    a = b & 0x7FFFFFFFFFFFFFFF
    e = (a >> 52) - 1023
    sig = (a & 0xFFFFFFFFFFFFF) | 0x10000000000000
    # Keep 11 significant bits (a normal half) or the multiples of 2**-24 (a
    # subnormal one); from 54 bits dropped on, nothing is left (zero).
    shift = min(42 if e >= -14 else 28 - e, 54)
    q = sig >> shift
    rem = sig & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    q += (rem > half) | ((rem == half) & ((q & 1) == 1))
    # A carry out of the significand steps the exponent, up to infinity.
    h = ((e + 14) << 10) + q if e >= -14 else q
    h = 0x7C00 if e >= 16 else h  # |d| >= 2**16, or infinite
    h = 0x7E00 if a > 0x7FF0000000000000 else h  # NaN
    return np.uint16(sign | h)


def _is_half(t) -> bool:
    """Whether the Numba type ``t`` is how the loops see float16 (uint16 bits)."""
    return isinstance(t, types.Integer) and t.bitwidth == 16


@intrinsic
def _wide(typingctx, v):
    """``v`` as float64: a float widened (exact), or uint16 bits read as float16."""
    if _is_half(v) and _native_half():
        def codegen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()),
                                 ir.DoubleType())
    elif _is_half(v):
        def codegen(context, builder, signature, args):
            return context.compile_internal(
                builder, _half_to_double.py_func, types.float64(types.uint16), args)
    elif isinstance(v, types.Float):
        def codegen(context, builder, signature, args):
            return context.cast(builder, args[0], v, types.float64)
    else:
        return None
    return types.float64(v), codegen


def _to_odd_single(builder, d):
    """float64 ``d`` rounded to float32 *to odd*: toward zero, then the last
    bit set if that was inexact. Rounded again to float16 (to nearest), it
    gives ``d`` rounded to float16 once (float32 has more than two bits to
    spare), where two roundings to nearest can differ in the last bit."""
    i32 = ir.IntType(32)
    single = builder.fptrunc(d, ir.FloatType())  # to nearest
    back = builder.fpext(single, ir.DoubleType())
    fabs = builder.module.declare_intrinsic("llvm.fabs", [ir.DoubleType()])
    bits = builder.bitcast(single, i32)
    even = builder.icmp_unsigned("==", builder.and_(bits, ir.Constant(i32, 1)),
                                 ir.Constant(i32, 0))
    inexact = builder.fcmp_ordered("!=", back, d)  # false for NaN
    # An even result that was rounded away from zero steps back toward zero
    # (odd, the truncation), one rounded toward zero steps out (odd).
    below = builder.fcmp_ordered("<", builder.call(fabs, [back]),
                                 builder.call(fabs, [d]))
    step = builder.select(below, ir.Constant(i32, 1), ir.Constant(i32, -1))
    odd = builder.select(builder.and_(even, inexact), builder.add(bits, step), bits)
    return builder.bitcast(odd, ir.FloatType())


@intrinsic
def _narrow(typingctx, v, like):
    """float64 ``v`` rounded once to the element type of array ``like``
    (uint16: float16, as bits)."""
    dtype = like.dtype
    if _is_half(dtype) and _native_half():
        def codegen(context, builder, signature, args):
            single = _to_odd_single(builder, args[0])
            return builder.bitcast(builder.fptrunc(single, ir.HalfType()),
                                   ir.IntType(16))
    elif _is_half(dtype):
        def codegen(context, builder, signature, args):
            return context.compile_internal(
                builder, _double_to_half.py_func, types.uint16(types.float64),
                args[:1])
    elif isinstance(dtype, types.Float):
        def codegen(context, builder, signature, args):
            return context.cast(builder, args[0], types.float64, dtype)
    else:
        return None
    return dtype(types.float64, like), codegen


# --- streaming stores and prefetch ----------------------------------------------
#
# Numba has no streaming store and no prefetch, so these intrinsics emit the
# LLVM IR for them: a store of a 64-byte vector marked !nontemporal
# (vmovntps/vmovntpd/vmovntdq on x86), the x86 sfence that orders such
# stores before the function returns, and llvm.prefetch (prefetcht0 on
# x86).

@intrinsic
def _stream_vectors(typingctx, dst, dst_start, src, nvec):
    """``dst[dst_start:][:nvec*W] = src[:nvec*W]`` with streaming stores.

    ``W = 64 // itemsize`` elements per store; ``dst[dst_start]`` must be
    64-byte aligned (the caller checks), ``src`` any alignment.
    """
    sig = types.void(dst, dst_start, src, nvec)

    def codegen(context, builder, signature, args):
        dty, _, sty, _ = signature.args
        d_arr, d_start, s_arr, n = args
        dptr = cgutils.get_item_pointer(
            context, builder, dty, context.make_array(dty)(context, builder, d_arr),
            [d_start], wraparound=False,
        )
        sptr = cgutils.get_item_pointer(
            context, builder, sty, context.make_array(sty)(context, builder, s_arr),
            [context.get_constant(types.intp, 0)], wraparound=False,
        )
        width = _VECTOR_BYTES // (dty.dtype.bitwidth // 8)
        vty = ir.VectorType(context.get_value_type(dty.dtype), width)
        dvec = builder.bitcast(dptr, vty.as_pointer())
        svec = builder.bitcast(sptr, vty.as_pointer())
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, n) as loop:
            v = builder.load(
                builder.gep(svec, [loop.index]), align=dty.dtype.bitwidth // 8
            )
            st = builder.store(v, builder.gep(dvec, [loop.index]), align=_VECTOR_BYTES)
            st.set_metadata("nontemporal", nontemporal)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _prefetch(typingctx, arr, start, nbytes):
    """Prefetch the lines of ``nbytes`` from element ``start`` of the C-ordered
    ``arr`` (flat index) into cache: a hint, which never faults."""
    sig = types.void(arr, start, nbytes)

    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        a, first, n = args
        i64 = ir.IntType(64)
        data = context.make_array(aty)(context, builder, a).data
        itemsize = ir.Constant(i64, aty.dtype.bitwidth // 8)
        base = builder.add(builder.ptrtoint(data, i64), builder.mul(first, itemsize))
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] +
                            [ir.IntType(32)] * 3),
            "llvm.prefetch.p0",
        )
        lines = builder.udiv(builder.add(n, ir.Constant(i64, 63)), ir.Constant(i64, 64))
        with cgutils.for_range(builder, lines) as loop:
            at = builder.add(base, builder.mul(loop.index, ir.Constant(i64, 64)))
            # read (0), keep in all levels (3), data (1)
            builder.call(fn, [builder.inttoptr(at, ir.IntType(8).as_pointer()),
                              ir.Constant(ir.IntType(32), 0),
                              ir.Constant(ir.IntType(32), 3),
                              ir.Constant(ir.IntType(32), 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _address(typingctx, arr):
    """The address of ``arr``'s first element, as an integer."""
    sig = types.intp(arr)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, ir.IntType(64))

    return sig, codegen


@intrinsic
def _sfence(typingctx):
    """Order the streaming stores before everything after them."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence"
        )
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, inline="always")
def _store_row(dst, buf, address):
    """Copy the row ``buf`` into ``dst`` (at memory ``address``) with streaming stores.

    Plain stores for the elements before the first 64-byte boundary and
    after the last whole vector.
    """
    D = buf.shape[0]
    size = buf.itemsize
    head = min(((_VECTOR_BYTES - address % _VECTOR_BYTES) % _VECTOR_BYTES) // size, D)
    for j in range(head):
        dst[j] = buf[j]
    width = _VECTOR_BYTES // size
    nvec = (D - head) // width
    _stream_vectors(dst, head, buf[head:], nvec)
    for j in range(head + nvec * width, D):
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
    first = _wide(x[0])
    for j in range(1, x.shape[0]):
        if _wide(x[j]) != first:
            return False
    return True


#: The most bytes :func:`_scratch` aligns its block to (a power of two).
SCRATCH_ALIGN = 64 * 1024


@nb.njit(cache=True, inline="always")
def _scratch(n):
    """``n`` float64 in one block that starts at a multiple of the smallest
    power of two that holds it (at most :data:`SCRATCH_ALIGN` bytes).

    Why one aligned block: see the comment above :func:`_forward_rows`.
    """
    align = 64
    while align < 8 * n and align < SCRATCH_ALIGN:
        align *= 2
    block = np.empty(n + align // 8, dtype=np.float64)
    start = (-_address(block)) % align // 8
    return block[start:start + n]


@nb.njit(cache=True, inline="always")
def _quarter_into_page(offset, k):
    """The first byte offset from ``offset`` on that lies ``k`` quarters of a
    4 KiB page into its page."""
    return offset + (k * _PAGE // 4 - offset) % _PAGE


# What the forward keeps in L1 for every row -- gamma and beta as float64,
# and the two buffers its output spans are streamed from -- lies in one block
# (``_scratch``), filled at the start of the call. As four arrays placed
# wherever the heap put them, they made the forward take about twice its
# usual time in some processes (2.0-2.4 times the copy floor against
# 1.1-1.4, in about one process in ten on the 2-core AMD EPYC (Zen 5) of the
# 2026-11-26 sessions). The cause is the L1 data cache's way predictor:
# AMD's L1D finds the way of a line by a "utag", a hash of bits 12-27 of the
# virtual address (reverse-engineered on Zen to Zen 2: bit 12 XOR 27, 13 XOR
# 26, 14 XOR 25, 15 XOR 20, 16 XOR 21, ..., 19 XOR 24; Lipp et al., "Take A
# Way", AsiaCCS 2020), and two lines of one set with one utag cannot both
# stay in L1. Measured on the Zen 5 at (4096, 1024) float32 with beta moved
# a page at a time over 16 MiB and gamma fixed: the loop took 1.5-2.0 times
# as long at 34 of 4093 positions (the sweep run twice, with gamma and beta
# at other addresses), and that hash put a page of beta and a page of gamma
# in one set with one utag at every one of them; it did so at 26 more, at
# the edges of those runs of slow pages, which were not slower than 1.5.
# gamma and beta are read every row, so the two evicted each other row
# after row. Within a 1 MiB-aligned stretch no two pages share a utag (bits
# 20-27 are the same, so the tag is bits 12-19 in disguise), and a block of
# up to SCRATCH_ALIGN bytes aligned as ``_scratch`` aligns it never leaves
# such a stretch; a longer one (rows past 2688, 3200 or 3712 elements in
# float64, float32 or float16) can, rarely. A row of x can share a utag
# with the block: that row pays.
# Inside the block each array starts its own quarter of a page into its
# page: all four at one offset in their pages, as whole pages of a block
# put them, took 1.05-1.20 times as long (shuffled calls in one process, at
# (4096, 1024) and (32768, 1024) float32; presumably gamma and beta, 8 KiB
# apart to the byte at D = 1024, then load from one L1 bank each step).
#
# Also measured (2026-11-26): a copy of this loop that took the span buffers
# as arguments made Numba count references around the stores of every span
# (a locked add, which on x86 also orders the streaming stores before it):
# twice the time, in every process. And the forward leaves the next row to
# the hardware prefetcher: asking for it in software, as the backward does,
# took 1.02 to 1.13 times as long in paired calls at (4096, 1024) and
# (32768, 1024).
@nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
def _forward_rows(x, gamma, beta, eps, y, xhat, rstd, stream):
    """y, xhat and rstd row by row: three sweeps over each row, the first
    from memory, the other two from cache.

    With ``stream``, the outputs of a span of :data:`SPAN` elements are
    computed into buffers in cache and streamed out from there.
    """
    rows, D = x.shape
    size = y.itemsize
    y_address, xhat_address = _address(y), _address(xhat)
    # Byte offsets in the block (its start is a multiple of 4 KiB): each
    # array starts its own quarter of a page into its page (see above).
    held = SPAN * size
    at_y = 0
    at_xhat = _quarter_into_page(at_y + held, 2)
    at_g = _quarter_into_page(at_xhat + held, 1)
    at_b = _quarter_into_page(at_g + 8 * D, 3)
    block = _scratch((at_b + 8 * D) // 8)
    held_y = block[at_y // 8:(at_y + held) // 8].view(y.dtype)
    held_xhat = block[at_xhat // 8:(at_xhat + held) // 8].view(y.dtype)
    g = block[at_g // 8:at_g // 8 + D]
    b = block[at_b // 8:at_b // 8 + D]
    g[:] = gamma
    b[:] = beta
    for r in range(rows):
        mean = _row_sum(x[r]) / D
        sq = _row_squares(x[r], mean)
        if sq <= D * (1e-15 * mean) ** 2 and _is_constant(x[r]):
            # The rounded mean of a constant row can miss its value by an
            # ulp; take the value itself, so that xhat = 0 and y = beta.
            mean = _wide(x[r, 0])
            sq = 0.0
        rstd[r] = 1.0 / np.sqrt(sq / D + eps)
        if not stream:
            _normalize_row(x[r], g, b, mean, rstd[r], y[r], xhat[r])
            continue
        for a in range(0, D, SPAN):
            e = min(a + SPAN, D)
            _normalize_row(x[r, a:e], g[a:e], b[a:e], mean, rstd[r],
                           held_y[:e - a], held_xhat[:e - a])
            offset = (r * D + a) * size
            _store_row(y[r, a:e], held_y[:e - a], y_address + offset)
            _store_row(xhat[r, a:e], held_xhat[:e - a], xhat_address + offset)
    if stream:
        _sfence()


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _row_sums(dy, xhat, gamma, dgamma, dbeta):
    """sum(g), sum(g * xhat) of a row (or span); adds to dgamma and dbeta."""
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
    """:func:`_row_sums` of four rows (or the same span of four rows) in one sweep.

    Returns the four ``sum(g)`` and the four ``sum(g * xhat)``. The rows' four
    ``dy * xhat`` (and ``dy``) are added pairwise before they go into
    ``dgamma`` (``dbeta``): one load and one store of each accumulator per
    four rows instead of per row.
    """
    g0 = g1 = g2 = g3 = 0.0
    gx0 = gx1 = gx2 = gx3 = 0.0
    for j in range(dy0.shape[0]):
        gj = gamma[j]
        d0, d1 = _wide(dy0[j]), _wide(dy1[j])
        d2, d3 = _wide(dy2[j]), _wide(dy3[j])
        p0, p1 = d0 * _wide(xh0[j]), d1 * _wide(xh1[j])
        p2, p3 = d2 * _wide(xh2[j]), d3 * _wide(xh3[j])
        g0 += d0 * gj
        g1 += d1 * gj
        g2 += d2 * gj
        g3 += d3 * gj
        gx0 += p0 * gj
        gx1 += p1 * gj
        gx2 += p2 * gj
        gx3 += p3 * gj
        dgamma[j] += (p0 + p1) + (p2 + p3)
        dbeta[j] += (d0 + d1) + (d2 + d3)
    return (g0, g1, g2, g3), (gx0, gx1, gx2, gx3)


@nb.njit(cache=True, fastmath=FASTMATH_DX, inline="always")
def _dx_span(dy, xhat, gamma, rstd, mean_g, mean_gxhat, dx):
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), per element.

    ``g - xhat * mean(g * xhat)`` is one fused multiply-add, rounded once
    (where the CPU has the instruction, :func:`_mul_add`); ``mean(g)`` comes
    off after it, so a constant row (``xhat = 0``, finite sums) keeps ``g``
    exactly, and a row of one element gets ``dx = 0``.
    """
    for j in range(dy.shape[0]):
        g = _wide(dy[j]) * gamma[j]
        rest = _mul_add(-_wide(xhat[j]), mean_gxhat, g)
        dx[j] = _narrow(rstd * (rest - mean_g), dx)


@nb.njit(cache=True, fastmath=FASTMATH_DX)
def _dx_row_span(dy, xhat, gamma, rstd, r, mean_g, mean_gxhat, a, e, out, out_r):
    """:func:`_dx_span` of ``dy[r, a:e]`` into ``out[out_r, a:e]``.

    Not inlined: a function inlined into a loop with :data:`FASTMATH` takes
    that loop's flags (see :data:`FASTMATH_DX`).
    """
    _dx_span(dy[r, a:e], xhat[r, a:e], gamma[a:e], rstd[r], mean_g, mean_gxhat,
             out[out_r, a:e])


@nb.njit(cache=True)
def _grouping(rows, D):
    """``Q``, the rows in each quarter of the rows taken in groups (0 for
    short rows), and the blocks of partial sums those groups fill."""
    quarter = rows // GROUP_ROWS if D >= GROUP_FROM_D else 0
    return quarter, -(-quarter // (BLOCK_ROWS // GROUP_ROWS))


@nb.njit(cache=True, fastmath=FASTMATH)
def _backward_rows(dy, xhat, gamma, rstd, dx, dgamma, dbeta, stream):
    """dx row by row; ``dgamma[b]``, ``dbeta[b]``: the sums over block ``b``.

    A group of rows (or one row) at a time: a first sweep, :data:`SPAN`
    elements at a time, takes its sums (from memory), and a second writes
    its ``dx`` (from cache), :data:`STEP` elements at a time, each step
    prefetching the same elements of the next group.

    With groups (see :data:`GROUP_ROWS`), group ``q`` is the rows ``q + k * Q``
    (``k = 0..3``, ``Q = rows // 4``) and block ``b`` holds groups ``b * G`` to
    ``b * G + G - 1``, ``G = BLOCK_ROWS // 4``; the rows from ``4 * Q`` on go
    one by one, in blocks of their own after those (``_block_count``). A
    row's sums are taken a span at a time and added in order.
    """
    rows, D = dy.shape
    size = dx.itemsize
    dx_address = _address(dx)
    quarter, grouped_blocks = _grouping(rows, D)
    # With streaming stores, a span of a group's dx is computed into `held`
    # and then streamed out from there.
    held = np.empty((GROUP_ROWS, D), dtype=dx.dtype)
    for q in range(quarter):
        b = q // (BLOCK_ROWS // GROUP_ROWS)
        group = (q, q + quarter, q + 2 * quarter, q + 3 * quarter)
        r0, r1, r2, r3 = group
        g0 = g1 = g2 = g3 = 0.0
        gx0 = gx1 = gx2 = gx3 = 0.0
        for a in range(0, D, SPAN):
            e = min(a + SPAN, D)
            sg, sgx = _group_sums(
                dy[r0, a:e], dy[r1, a:e], dy[r2, a:e], dy[r3, a:e],
                xhat[r0, a:e], xhat[r1, a:e], xhat[r2, a:e], xhat[r3, a:e],
                gamma[a:e], dgamma[b, a:e], dbeta[b, a:e],
            )
            g0, g1, g2, g3 = g0 + sg[0], g1 + sg[1], g2 + sg[2], g3 + sg[3]
            gx0, gx1 = gx0 + sgx[0], gx1 + sgx[1]
            gx2, gx3 = gx2 + sgx[2], gx3 + sgx[3]
        means_g = (g0 / D, g1 / D, g2 / D, g3 / D)
        means_gxhat = (gx0 / D, gx1 / D, gx2 / D, gx3 / D)
        for k in range(GROUP_ROWS):
            r = group[k]
            for a in range(0, D, STEP):
                e = min(a + STEP, D)
                # The next group's row k starts where row r ends: ask for the
                # same elements of it now, so that memory works while the core
                # computes this dx from cache.
                if (r + 1) * D + a < rows * D:
                    _prefetch(dy, (r + 1) * D + a, (e - a) * dy.itemsize)
                    _prefetch(xhat, (r + 1) * D + a, (e - a) * xhat.itemsize)
                if stream:
                    _dx_row_span(dy, xhat, gamma, rstd, r, means_g[k],
                                 means_gxhat[k], a, e, held, k)
                    address = dx_address + (r * D + a) * size
                    _store_row(dx[r, a:e], held[k, a:e], address)
                else:
                    _dx_row_span(dy, xhat, gamma, rstd, r, means_g[k],
                                 means_gxhat[k], a, e, dx, r)
    # Plain stores: rows too short for groups are too short to stream (at
    # D = 64, streaming them one by one took twice as long).
    first = GROUP_ROWS * quarter
    for r in range(first, rows):
        b = grouped_blocks + (r - first) // BLOCK_ROWS
        sum_g = sum_gxhat = 0.0
        for a in range(0, D, SPAN):
            e = min(a + SPAN, D)
            s, sx = _row_sums(dy[r, a:e], xhat[r, a:e], gamma[a:e],
                              dgamma[b, a:e], dbeta[b, a:e])
            sum_g, sum_gxhat = sum_g + s, sum_gxhat + sx
        _dx_row_span(dy, xhat, gamma, rstd, r, sum_g / D, sum_gxhat / D, 0, D,
                     dx, r)
    if stream:
        _sfence()


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


@nb.njit(cache=True)
def _sum_blocks(partials, total):
    """``total = partials[0] + partials[1] + ...`` (block after block, in that
    order) in float64, rounded once to the dtype of ``total`` (float16 as
    bits)."""
    acc = np.zeros(partials.shape[1])
    for b in range(partials.shape[0]):  # row by row: unit stride, vectorized
        for j in range(partials.shape[1]):
            acc[j] += partials[b, j]
    for j in range(partials.shape[1]):
        total[j] = _narrow(acc[j], total)


@nb.njit(cache=True, nogil=True)
def _backward_chunks(dy, xhat, gamma, rstd, dx, dgamma, dbeta, stream, first,
                     last):
    """:func:`_backward_rows` over chunks ``first`` to ``last - 1``.

    Chunk ``c`` is the rows ``c * CHUNK_ROWS`` up to the next chunk's; it
    fills the partial rows from ``c * _block_count(CHUNK_ROWS, D)`` on, so
    chunks taken by different threads never share one.
    """
    rows, D = dy.shape
    per_chunk = _block_count(CHUNK_ROWS, D)
    for c in range(first, last):
        a = c * CHUNK_ROWS
        e = min(a + CHUNK_ROWS, rows)
        b = c * per_chunk
        n = _block_count(e - a, D)
        _backward_rows(dy[a:e], xhat[a:e], gamma, rstd[a:e], dx[a:e],
                       dgamma[b:b + n], dbeta[b:b + n], stream)


# --- where large arrays start ----------------------------------------------------

#: Bytes between the starts of two arrays that one loop streams through
#: together, modulo a 4 KiB page (see ``empty_apart``).
APART_BYTES = 256

#: Arrays from this size on are placed :data:`APART_BYTES` apart. glibc maps
#: large blocks fresh from the kernel, so they all start at the same place in
#: a page, and where a smaller one starts depends on the heap's history: two
#: arrays of any size can collide. Moving one costs one more page of address
#: space, which for arrays under 16 pages is not worth it. Since the backward
#: writes a group's ``dx`` while it reads the next group, a collision between
#: ``dx`` and ``dy`` or ``xhat`` costs more than it did: at (4096, 1024)
#: float32, 1.44 against 2.33 times the floor in one run where the heap had
#: put them at the same offset.
APART_FROM_BYTES = 16 * 4096
_PAGE = 4096


def empty_apart(shape, dtype, *others: np.ndarray) -> np.ndarray:
    r"""``np.empty(shape, dtype)``, placed in its page away from ``others``.

    An array of :data:`APART_FROM_BYTES` or more starts at least
    :data:`APART_BYTES` from each of ``others``, modulo 4 KiB; a smaller one
    is plain ``np.empty``. Use it for the ``out=`` buffers of :func:`forward`
    and :func:`backward`, with the arrays the loop streams through together
    as ``others``: ``x`` (and the other output) for the forward, ``dy`` and
    ``cache.xhat`` for the backward.

    Parameters
    ----------
    shape : int or tuple of int
        Shape of the array.
    dtype : dtype
        Its dtype.
    *others : ndarray
        Arrays to keep away from (up to seven are always honoured; with more,
        the start farthest from the nearest of them).

    Returns
    -------
    ndarray
        Uninitialized, C-contiguous, writeable; a view into a slightly larger
        buffer when it was moved.

    Notes
    -----
    Why: large arrays start at the same place in a page (glibc maps them
    fresh), and when a row is a multiple of 4 KiB long (``D = 1024``
    float32) element ``j`` of every row of every array then sits at the same
    address modulo 4 KiB. Those are the bits that pick a line's set in an
    L1 data cache of 64 sets (typical x86 cores: 32 or 48 KiB, 8 to 12
    ways, against eight or more streams), and the bits an x86 core compares
    to tell a load from an earlier store ("4K aliasing"): the loop's
    streams then all land in one L1 set and can alias each other. Arrays
    this module allocates (``xhat``, ``y``, ``dx`` and C-ordered copies of
    non-contiguous inputs) are moved apart from the ones they are streamed
    with; at (32768, 1024) float32 that took the backward loop from 1.34 to
    1.00 ns per element on the machine the book is built on.

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
    taken = [o.ctypes.data % _PAGE for o in others]

    def nearest(t: int) -> int:
        distances = (min((t - a) % _PAGE, (a - t) % _PAGE) for a in taken)
        return min(distances, default=_PAGE)

    # Each other rules out at most 2 * APART_BYTES / 64 = 8 of the 64
    # line-aligned starts (7 when it is itself line-aligned), so for up to
    # seven others at least 8 are free.
    starts = range(0, _PAGE, 64)
    target = next((t for t in starts if nearest(t) >= APART_BYTES), None)
    if target is None:
        target = max(starts, key=nearest)
    buf = np.empty(nbytes + _PAGE, dtype=np.uint8)
    start = (target - buf.ctypes.data) % _PAGE
    return buf[start : start + nbytes].view(dtype).reshape(shape)


# --- the public functions ---------------------------------------------------------


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` as the loops see it: float16 as its bits (a uint16 view)."""
    return a.view(_U16) if a.dtype == _F16 else a


def _rows_for_loop(a: np.ndarray, *apart: np.ndarray) -> np.ndarray:
    """``a`` as C-ordered 2-D rows the loops read (float16 as its bits).

    A view of ``a`` when it is C-ordered; else a copy, placed apart from
    ``apart``.
    """
    rows = a.reshape(-1, a.shape[-1])
    if not rows.flags.c_contiguous:
        copy = empty_apart(rows.shape, rows.dtype, *apart)
        np.copyto(copy, rows)
        rows = copy
    return _bits(rows)


def _output(out, shape, dtype, *apart: np.ndarray) -> np.ndarray:
    """Where the loop writes an output of ``shape`` (its rows) and ``dtype``, as
    the loop sees it (float16 as bits): ``out`` itself, else a new array
    apart from ``apart``."""
    if out is None:
        out = empty_apart(shape, dtype, *apart)
    return _bits(out.reshape(shape))


def _deliver(result: np.ndarray, out, shape) -> np.ndarray:
    """What the caller gets: ``out`` when one was given (the loop wrote into
    it), else the loop's ``result`` in ``shape``, float16 bits as float16."""
    if out is not None:
        return out
    return (result.view(_F16) if result.dtype == _U16 else result).reshape(shape)


def _streams(out: np.ndarray, D: int) -> bool:
    """Whether the loops write ``out`` with streaming stores: from
    :data:`STREAM_BYTES` on, for rows of :data:`GROUP_FROM_D` or more."""
    return out.nbytes >= STREAM_BYTES and D >= GROUP_FROM_D


_THREADS_HINT = "threads is how many CPU threads run the loop."


def _in_threads(fn, jobs: list[tuple]) -> None:
    """``fn(*job)`` for every job, the first in this thread, the others each in a
    new thread of its own (the loops release the GIL); re-raises their errors."""
    if len(jobs) == 1:  # no thread to start, wait for or collect errors from
        fn(*jobs[0])
        return
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
    rounding before the final rounding to the dtype of ``x``) and cache;
    ``threads`` instead of ``block_rows``. :func:`lnorm.forward` calls this
    unless it is given ``block_rows``.

    Per row: ``mean = sum(x) / D`` and ``var = sum((x - mean)**2) / D`` in
    float64, ``rstd = 1 / sqrt(var + eps)``, then ``xhat = (x - mean) * rstd``
    and ``y = gamma * xhat + beta`` in one sweep, rounded once to the dtype of
    ``x``.

    Parameters
    ----------
    x : array_like, shape (..., D)
        float16, float32 or float64; any number of leading dimensions,
        including zero rows. Not modified.
    gamma, beta : array_like, shape (D,)
        Scale and shift, floating. Not modified.
    eps : float, default 1e-5
        Finite and > 0.
    out : tuple of two ndarrays, optional
        ``(y, xhat)``: C-contiguous arrays of the shape and dtype of ``x`` to
        write the output and ``xhat`` into, instead of new arrays. A
        training loop that passes the same buffers every step saves the
        kernel the zeroing of fresh pages (see Notes). The cache then holds a
        read-only view of the ``xhat`` buffer: writing into that buffer again
        (the next step's forward) changes what the cache holds.
    threads : int, default 1
        CPU threads that run the loop, each on a contiguous range of rows.
        Every row is computed the same way whatever their number: the results
        are the same bits.

    Returns
    -------
    y : ndarray, shape and dtype of ``x``
        The output (``out[0]`` when given).
    cache : LayerNormCache
        ``xhat`` (dtype of ``x``), ``rstd`` (float64) and a copy of ``gamma``.

    Raises
    ------
    TypeError
        A non-floating input, or an ``eps`` that is not a real number.
    ValueError
        A 0-d ``x``, ``D = 0``, ``gamma``/``beta`` not of shape ``(D,)``,
        ``eps`` not finite and > 0.
    TypeError, ValueError
        An ``out`` that :func:`lnorm.validate.check_forward_out` refuses
        (two arrays of the shape and dtype of ``x``, C-contiguous, writeable,
        sharing no memory with ``x`` or with each other).
    TypeError, ValueError
        ``threads`` not an integer, or below 1.

    See Also
    --------
    backward : The fused gradients, from this cache.
    lnorm.core.forward : The library entry point; NumPy blocks with
        ``block_rows=``.
    lnorm.core.forward_formula : The same arithmetic as plain NumPy.

    Notes
    -----
    The first call in a fresh process loads (or compiles) the Numba loops.
    From :data:`STREAM_BYTES` of output on, rows of :data:`GROUP_FROM_D`
    elements or more are written with streaming stores. A new output array
    of many megabytes is usually memory the operating system has not handed
    out yet (glibc maps large blocks anew): the first store to each page
    faults, and the kernel zeroes the page before the loop may write it, a
    pass over the output the loop cannot avoid unless it is given ``out``.

    Examples
    --------
    >>> import numpy as np
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
    # float64 for the loop, which copies them into its own block
    g = gamma.astype(ACC_DTYPE, copy=False)
    b = beta.astype(ACC_DTYPE, copy=False)
    if x2.shape[0]:
        stream = _streams(y, D)
        _in_threads(_forward_rows, [
            (x2[a:e], g, b, eps, y[a:e], xhat[a:e], rstd[a:e], stream)
            for a, e in _split(x2.shape[0], threads)
        ])
    y = _deliver(y, y_out, x.shape)
    xhat = _deliver(xhat, xhat_out, x.shape)
    return y, make_cache(xhat, rstd.reshape(x.shape[:-1]), gamma)


def backward(
    dy, cache: LayerNormCache, *, out=None, threads: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Compute the gradients of layer normalization in one compiled pass per row.

    With ``g = gamma * dy`` and ``mean`` the mean over the row, as
    :func:`lnorm.core.backward`::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy

    A first sweep over the row accumulates ``sum(g)`` and ``sum(g * xhat)``
    in float64 and adds ``dy * xhat`` and ``dy`` into the block's ``dgamma``
    and ``dbeta``; a second sweep writes ``dx``. :func:`lnorm.backward`
    calls this unless it is given ``block_rows``.

    Parameters
    ----------
    dy : array_like, shape of ``x``
        Upstream gradient, floating. Not modified.
    cache : LayerNormCache
        From :func:`forward` or :func:`lnorm.core.forward`.
    out : ndarray, optional
        A C-contiguous array of the shape and dtype of ``x`` to write ``dx``
        into, instead of a new array (see :func:`forward`'s Notes).
    threads : int, default 1
        CPU threads that run the loop, each on a contiguous range of the
        chunks of :data:`CHUNK_ROWS` rows. The chunks, and so the order of
        every sum, do not depend on ``threads``: the results are the same
        bits whatever their number.

    Returns
    -------
    dx : ndarray, shape and dtype of ``x``
        Gradient with respect to ``x`` (``out`` when given).
    dgamma, dbeta : ndarray, shape (D,), dtype of ``gamma``
        Summed in float64 per block of :data:`BLOCK_ROWS` rows of a chunk,
        then over the blocks in order, and rounded once to the dtype of
        ``gamma``: the same bits on every call and for any ``threads``.

    Raises
    ------
    TypeError
        ``cache`` not a LayerNormCache, or a non-floating ``dy``.
    ValueError
        ``dy`` not of the shape of ``x``.
    TypeError, ValueError
        An ``out`` that :func:`lnorm.validate.check_backward_out` refuses (it
        must not share memory with ``dy`` or the cache's ``xhat``).
    TypeError, ValueError
        ``threads`` not an integer, or below 1.

    See Also
    --------
    forward : Makes the cache.
    lnorm.core.backward : The library entry point; NumPy blocks with
        ``block_rows=``.
    lnorm.core.backward_formula : The same arithmetic as plain NumPy.

    Notes
    -----
    From :data:`STREAM_BYTES` of ``dx`` on, rows of :data:`GROUP_FROM_D`
    elements or more are written with streaming stores.

    Examples
    --------
    >>> import numpy as np
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
    xhat2 = _rows_for_loop(cache.xhat, dy2)
    rows = dy2.shape[0]
    dx = _output(out, dy2.shape, cache.dtype, dy2, xhat2)
    args = (dy2, xhat2, cache.gamma.astype(ACC_DTYPE), cache.rstd.reshape(-1), dx)
    stream = _streams(dx, D)
    dgamma = np.empty(D, dtype=cache.gamma.dtype)
    dbeta = np.empty(D, dtype=cache.gamma.dtype)
    if threads == 1:  # one compiled call, from the partial sums to the result
        _backward_all(*args, stream, _bits(dgamma), _bits(dbeta))
    else:
        blocks = _chunked_block_count(rows, D)
        partial_dgamma = np.zeros((blocks, D), dtype=ACC_DTYPE)
        partial_dbeta = np.zeros((blocks, D), dtype=ACC_DTYPE)
        chunks = -(-rows // CHUNK_ROWS)
        _in_threads(_backward_chunks, [
            (*args, partial_dgamma, partial_dbeta, stream, a, e)
            for a, e in _split(chunks, threads)
        ])
        _sum_blocks(partial_dgamma, _bits(dgamma))
        _sum_blocks(partial_dbeta, _bits(dbeta))
    return _deliver(dx, out, cache.shape), dgamma, dbeta


@nb.njit(cache=True, nogil=True)
def _backward_all(dy, xhat, gamma, rstd, dx, stream, dgamma, dbeta):
    """:func:`_backward_chunks` over every chunk, then :func:`_sum_blocks` of
    the partial sums into ``dgamma`` and ``dbeta``: the backward on one thread
    in one compiled call. Each step of Python around the loop (allocate the
    partial sums, add them up, round them) costs microseconds when the caches
    are cold, as they are after a kernel that streamed megabytes."""
    rows, D = dy.shape
    blocks = _chunked_block_count(rows, D)
    partial_dgamma = np.zeros((blocks, D))
    partial_dbeta = np.zeros((blocks, D))
    _backward_chunks(dy, xhat, gamma, rstd, dx, partial_dgamma, partial_dbeta,
                     stream, 0, -(-rows // CHUNK_ROWS))
    _sum_blocks(partial_dgamma, dgamma)
    _sum_blocks(partial_dbeta, dbeta)
