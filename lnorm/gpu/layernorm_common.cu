// Shared pieces of the fused layer-norm kernels: launch constants, float16
// conversion, one-instruction vector loads and stores, row reductions.
//
// Included by layernorm_forward.cu and layernorm_backward.cu; not a kernel
// file on its own. Needs no CUDA header: NVRTC compiles it with no include
// path, on a machine with or without a GPU.
#ifndef LNORM_LAYERNORM_COMMON_CU
#define LNORM_LAYERNORM_COMMON_CU

// Launch constants. lnorm.gpu reads these numbers to plan launches and to
// emulate the kernels, so Python and CUDA cannot disagree.
#define LN_ELEMS_PER_THREAD 16   // row elements a thread holds in registers
#define LN_WARPS_PER_BLOCK 4     // warp-per-row kernels: rows per block
#define LN_MAX_ROW_THREADS 512   // block-per-row kernels: largest block
#define LN_REDUCE_SLICES 8       // dgamma/dbeta reduction: threads per column
#define LN_REDUCE_SLICES_WIDE 32 // the same, v5's reduction
#define LN_REDUCE_BATCH 8        // v5's reduction: loads per thread in flight
// v5's forward: rows whose loads are in flight, and threads an SM holds
// (16-byte vectors); v5's backward: rows in flight (x and dy: twice the bytes)
#define LN_FWD_ROWS_IN_FLIGHT 3
#define LN_FWD_THREADS_PER_SM 1024
#define LN_BWD_ROWS_IN_FLIGHT 2
// ... of rows a warp holds (short rows: more of them; 48 and 32 KiB of buffers
// a block of 128 threads, so that four blocks fit an SM's shared memory)
#define LN_BWD_WARP_ROWS_IN_FLIGHT_F32 3
#define LN_BWD_WARP_ROWS_IN_FLIGHT_F16 4
// ... and one more row (either pass) in float16 clusters of a tail (*_any,
// *_odd), which lnorm.gpu.kernels.plan also gives float16 rows of 16-byte
// vectors that fill their slices only in part: there a thread holds fewer
// bytes of a row, and more rows in flight keep as many bytes in flight.
#define LN_CLUSTER_PART_ROWS_MORE 1
// v5's rows past registers: elements a thread takes
#define LN_LONG_ELEMS_PER_THREAD 24
// v5's rows longer still: a cluster of at most this many blocks (sm_90 and
// later) takes a row, each block a slice of LN_ELEMS_PER_THREAD *
// LN_MAX_ROW_THREADS elements
#define LN_MAX_CLUSTER 8
// Largest block of each kind, for __launch_bounds__.
#define LN_WARP_THREADS (32 * LN_WARPS_PER_BLOCK)
#define LN_BLOCK_THREADS LN_MAX_ROW_THREADS

// The kernel variants, the same for the forward and the backward: name
// suffix, storage type, elements per vector load, one row per block (else
// per warp), largest block. K(...) makes one kernel of a variant.
#define LN_VARIANTS(K)                                      \
    K(warp_f32_v4, float, 4, false, LN_WARP_THREADS)        \
    K(warp_f32_v1, float, 1, false, LN_WARP_THREADS)        \
    K(warp_f16_v8, half_bits, 8, false, LN_WARP_THREADS)    \
    K(warp_f16_v1, half_bits, 1, false, LN_WARP_THREADS)    \
    K(block_f32_v4, float, 4, true, LN_BLOCK_THREADS)       \
    K(block_f32_v1, float, 1, true, LN_BLOCK_THREADS)       \
    K(block_f16_v8, half_bits, 8, true, LN_BLOCK_THREADS)   \
    K(block_f16_v1, half_bits, 1, true, LN_BLOCK_THREADS)

// The variants of the kernels for rows longer than registers hold: a block
// per row group, never a warp. K(suffix, storage type, vector, largest block).
#define LN_LONG_VARIANTS(K)                            \
    K(long_f32_v4, float, 4, LN_BLOCK_THREADS)         \
    K(long_f32_v1, float, 1, LN_BLOCK_THREADS)         \
    K(long_f16_v8, half_bits, 8, LN_BLOCK_THREADS)     \
    K(long_f16_v1, half_bits, 1, LN_BLOCK_THREADS)
// v5's kernels for these rows: 16-byte vectors, and in float16 of even D
// not a multiple of them, a tail (*_any, as below). No scalars: rows of
// scalars this long would not fit a thread's registers without spilling,
// and nor do float32's six vectors a thread with a tail, or float16's
// three of odd D (ptxas 12.9 for sm_90 spilled 36 and 100 stores, and 92 in
// the backward, 2026-11-27); those rows go to a cluster of two blocks
// (lnorm.gpu.kernels.plan).
#define LN_LONG_VECTOR_VARIANTS(K)                     \
    K(long_f32_v4, float, 4, LN_BLOCK_THREADS)         \
    K(long_f16_v8, half_bits, 8, LN_BLOCK_THREADS)     \
    K(long_f16_any, half_any, 8, LN_BLOCK_THREADS)
// v5's variants of rows held in registers, K(...) as LN_VARIANTS: 16-byte
// vectors where D is a multiple of them; else, for rows of a block (D >
// 32 * LN_ELEMS_PER_THREAD), the columns and order of the vector kernels
// with a tail, each row's vectors moved in 16 or 4 bytes as its start
// allows (float32 any D, float16 any even D: *_any, VecAny below), or in 16,
// 4 and 2 for float16 rows of odd D, which start on 2 bytes every other row
// (*_odd, VecOdd below); else (rows a warp holds) scalars. (The warp
// variants of a tail, built once, gave other dgamma and dbeta bits than the
// emulation on an H100 in float32, which the CPU did not reproduce: they are
// not built; benchmarks/warp_tail_probe.py builds them to find out why.)
#define LN_GROUPED_VARIANTS(K)                              \
    K(warp_f32_v4, float, 4, false, LN_WARP_THREADS)        \
    K(warp_f32_v1, float, 1, false, LN_WARP_THREADS)        \
    K(warp_f16_v8, half_bits, 8, false, LN_WARP_THREADS)    \
    K(warp_f16_v1, half_bits, 1, false, LN_WARP_THREADS)    \
    K(block_f32_v4, float, 4, true, LN_BLOCK_THREADS)       \
    K(block_f32_any, float_any, 4, true, LN_BLOCK_THREADS)  \
    K(block_f16_v8, half_bits, 8, true, LN_BLOCK_THREADS)   \
    K(block_f16_any, half_any, 8, true, LN_BLOCK_THREADS)   \
    K(block_f16_odd, half_odd, 8, true, LN_BLOCK_THREADS)
// v5's kernels for rows longer than LN_LONG_ELEMS_PER_THREAD *
// LN_MAX_ROW_THREADS: a cluster of 2, 4 or 8 blocks a row group, 16-byte
// vectors, with a tail in the last slice where D is not a multiple of them
// (*_any, *_odd; a slice is a whole number of vectors, so only the last
// slice's last vector is short). K(suffix, storage type, vector, largest block,
// blocks a cluster).
#define LN_CLUSTER_VARIANTS(K)                              \
    K(cluster2_f32_v4, float, 4, LN_BLOCK_THREADS, 2)       \
    K(cluster4_f32_v4, float, 4, LN_BLOCK_THREADS, 4)       \
    K(cluster8_f32_v4, float, 4, LN_BLOCK_THREADS, 8)       \
    K(cluster2_f32_any, float_any, 4, LN_BLOCK_THREADS, 2)  \
    K(cluster4_f32_any, float_any, 4, LN_BLOCK_THREADS, 4)  \
    K(cluster8_f32_any, float_any, 4, LN_BLOCK_THREADS, 8)  \
    K(cluster2_f16_v8, half_bits, 8, LN_BLOCK_THREADS, 2)   \
    K(cluster4_f16_v8, half_bits, 8, LN_BLOCK_THREADS, 4)   \
    K(cluster8_f16_v8, half_bits, 8, LN_BLOCK_THREADS, 8)   \
    K(cluster2_f16_any, half_any, 8, LN_BLOCK_THREADS, 2)   \
    K(cluster4_f16_any, half_any, 8, LN_BLOCK_THREADS, 4)   \
    K(cluster8_f16_any, half_any, 8, LN_BLOCK_THREADS, 8)   \
    K(cluster2_f16_odd, half_odd, 8, LN_BLOCK_THREADS, 2)   \
    K(cluster4_f16_odd, half_odd, 8, LN_BLOCK_THREADS, 4)   \
    K(cluster8_f16_odd, half_odd, 8, LN_BLOCK_THREADS, 8)

// float16 is stored as its 16 raw bits and converted with one PTX instruction
// each way, so no cuda_fp16.h is needed. Arithmetic is always float32. On the
// host (lnorm.gpu.host compiles this file with g++ to run it on the CPU) the
// same IEEE conversions go through _Float16.
typedef unsigned short half_bits;

#ifdef __CUDA_ARCH__
__device__ __forceinline__ float half_to_float(half_bits h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact
    return f;
}

__device__ __forceinline__ half_bits float_to_half(float f) {
    half_bits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));  // to nearest even
    return h;
}
#else
inline float half_to_float(half_bits h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;  // exact
}

inline half_bits float_to_half(float f) {
    const _Float16 v = (_Float16)f;  // to nearest even
    half_bits h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}
#endif

// Vec<T, VEC>::load(p, out): the VEC consecutive elements p[0..VEC-1], as
// floats, with ONE global load instruction (a float4, or a uint4 of eight
// float16: 16 bytes either way); store is the converse. p must be aligned to
// the vector: the launcher picks VEC > 1 only when D is a multiple of VEC,
// so that every row starts aligned.
template <typename T, int VEC> struct Vec;

template <> struct Vec<float, 4> {
    static __device__ __forceinline__ void load(const float* p, float* out) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
    static __device__ __forceinline__ void store(float* p, const float* in) {
        *reinterpret_cast<float4*>(p) =
            make_float4(in[0], in[1], in[2], in[3]);
    }
};

// Used for the float32 dgamma/dbeta partial sums of float16 rows.
template <> struct Vec<float, 2> {
    static __device__ __forceinline__ void load(const float* p, float* out) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        out[0] = v.x; out[1] = v.y;
    }
    static __device__ __forceinline__ void store(float* p, const float* in) {
        *reinterpret_cast<float2*>(p) = make_float2(in[0], in[1]);
    }
};

// Used for the float32 dgamma/dbeta partial sums of float16 rows.
template <> struct Vec<float, 8> {
    static __device__ __forceinline__ void load(const float* p, float* out) {
        Vec<float, 4>::load(p, out);
        Vec<float, 4>::load(p + 4, out + 4);
    }
    static __device__ __forceinline__ void store(float* p, const float* in) {
        Vec<float, 4>::store(p, in);
        Vec<float, 4>::store(p + 4, in + 4);
    }
};

template <> struct Vec<float, 1> {
    static __device__ __forceinline__ void load(const float* p, float* out) {
        out[0] = *p;
    }
    static __device__ __forceinline__ void store(float* p, const float* in) {
        *p = in[0];
    }
};

// Eight float16 in one 16-byte load (uint4), the lower address in the low
// half of each 32-bit word: the float16 rows move 16 bytes per instruction,
// as the float32 rows do.
__device__ __forceinline__ void unpack_halves(const uint4 v, float* out) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        out[2 * j] = half_to_float((half_bits)(w[j] & 0xffffu));
        out[2 * j + 1] = half_to_float((half_bits)(w[j] >> 16));
    }
}

__device__ __forceinline__ uint4 pack_halves(const float* in) {
    unsigned int w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        w[j] = (unsigned int)float_to_half(in[2 * j])
               | ((unsigned int)float_to_half(in[2 * j + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <> struct Vec<half_bits, 8> {
    static __device__ __forceinline__ void load(const half_bits* p,
                                                float* out) {
        unpack_halves(*reinterpret_cast<const uint4*>(p), out);
    }
    static __device__ __forceinline__ void store(half_bits* p,
                                                 const float* in) {
        *reinterpret_cast<uint4*>(p) = pack_halves(in);
    }
};

template <> struct Vec<half_bits, 1> {
    static __device__ __forceinline__ void load(const half_bits* p,
                                                float* out) {
        out[0] = half_to_float(*p);
    }
    static __device__ __forceinline__ void store(half_bits* p,
                                                 const float* in) {
        *p = float_to_half(in[0]);
    }
};

// Streaming variants of the loads and stores of the rows, for data read or
// written once (x, dy, dx in v5's backward): the same instructions with the
// .cs ("evict first") cache hint, so the rows do not push out of L2 what is
// used again (gamma, the row statistics, the partial sums).
template <typename T, int VEC> struct VecStream;

template <> struct VecStream<float, 4> {
    static __device__ __forceinline__ void load(const float* p, float* out) {
        const float4 v = __ldcs(reinterpret_cast<const float4*>(p));
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
    static __device__ __forceinline__ void store(float* p, const float* in) {
        __stcs(reinterpret_cast<float4*>(p),
               make_float4(in[0], in[1], in[2], in[3]));
    }
};

template <> struct VecStream<float, 1> {
    static __device__ __forceinline__ void load(const float* p, float* out) {
        out[0] = __ldcs(p);
    }
    static __device__ __forceinline__ void store(float* p, const float* in) {
        __stcs(p, in[0]);
    }
};

template <> struct VecStream<half_bits, 8> {
    static __device__ __forceinline__ void load(const half_bits* p,
                                                float* out) {
        unpack_halves(__ldcs(reinterpret_cast<const uint4*>(p)), out);
    }
    static __device__ __forceinline__ void store(half_bits* p,
                                                 const float* in) {
        __stcs(reinterpret_cast<uint4*>(p), pack_halves(in));
    }
};

template <> struct VecStream<half_bits, 1> {
    static __device__ __forceinline__ void load(const half_bits* p,
                                                float* out) {
        out[0] = half_to_float(__ldcs(p));
    }
    static __device__ __forceinline__ void store(half_bits* p,
                                                 const float* in) {
        __stcs(p, float_to_half(in[0]));
    }
};

// Asynchronous copies, global to shared memory (sm_80 and later), which v5's
// backward uses to load the next row while it works on this one: the copy
// needs no register, so the row in flight costs shared memory, not the
// registers a row already fills. copy_async_16 starts a 16-byte copy (both
// addresses aligned to 16; .cg: through L2 only, as the rows are read once);
// async_commit closes a group of copies; async_wait<N> waits until at most N
// groups of this thread are still in flight. A thread reads only what its own
// copies wrote, so no barrier is needed between the copy and the read. On the
// host (cuda_host.h) a copy lands only when a wait lets its group go.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(dst), "l"(gmem) : "memory");
}
// copy_async_4: a copy of 4 bytes (.ca: the only kind for this size), both
// addresses on 4 bytes; for rows that do not start on 16 bytes (v5's
// variants for any D).
__device__ __forceinline__ void copy_async_4(void* smem, const void* gmem) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;"
                 :: "r"(dst), "l"(gmem) : "memory");
}
// copy_async_2of4: the 2 bytes at gmem into smem, zeros into the 2 after
// them (a 4-byte copy of 2 source bytes: nothing is read past them); both
// addresses on 4 bytes. For a float16 row's last element where the word
// would run past the row (v5's rows of odd D).
__device__ __forceinline__ void copy_async_2of4(void* smem,
                                                const void* gmem) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, 2;"
                 :: "r"(dst), "l"(gmem) : "memory");
}
__device__ __forceinline__ void async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
// The kernel's dynamic shared memory (the launch sets its size).
#define LN_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#else
inline void copy_async_16(void* smem, const void* gmem) {
    cuda_host::copy_async(smem, gmem, 16);
}
inline void copy_async_4(void* smem, const void* gmem) {
    cuda_host::copy_async(smem, gmem, 4);
}
inline void copy_async_2of4(void* smem, const void* gmem) {
    cuda_host::copy_async(smem, gmem, 4, 2);
}
inline void async_commit() { cuda_host::copy_commit(); }
template <int N> inline void async_wait() { cuda_host::copy_wait(N); }
#define LN_DYNAMIC_SHARED(T, name) \
    T* name = reinterpret_cast<T*>(cuda_host::dynamic_shared())
#endif

// ---- v5's rows of any D: 16 bytes where the row allows, a tail for the rest
//
// v5's variants for rows past a warp's whose D is not a multiple of the
// vector (float32 any D, float16 any even D; float16 of odd D below) keep
// the vector kernels' columns and order: thread t still holds vectors t, t + G, ... of VEC elements, the
// last vector of the row holding only D % VEC of them (the tail). What
// changes is how a vector moves. Row r starts r * D elements past an aligned
// base, so its vectors start on 16 bytes or on 4 (8 counts as 4), the same
// for the whole row: each moves as one 16-byte access or four of 4 bytes,
// into the same 16 bytes of registers or of shared memory. The storage
// types float_any and half_any (the bits of float and half_bits) select
// this (VecAny, vec_load, vec_store, copy_vec below); AnyAlign<T> tells the
// kernels that a vector may be a tail.
struct float_any { float v; };
struct half_any { half_bits v; };
template <typename T> struct AnyAlign { static constexpr bool value = false; };
template <> struct AnyAlign<float_any> { static constexpr bool value = true; };
template <> struct AnyAlign<half_any> { static constexpr bool value = true; };
// float16 rows of odd D (half_odd, below): a tail too, and rows on 2 bytes.
struct half_odd { half_bits v; };
template <> struct AnyAlign<half_odd> { static constexpr bool value = true; };
template <typename T> struct OddRows { static constexpr bool value = false; };
template <> struct OddRows<half_odd> { static constexpr bool value = true; };

// The rows in flight v5's kernels of 16-byte vectors add to
// LN_FWD_ROWS_IN_FLIGHT or LN_BWD_ROWS_IN_FLIGHT: LN_CLUSTER_PART_ROWS_MORE
// for float16 clusters of a tail.
template <typename T, int CL>
__device__ constexpr int part_rows_more() {
    return CL > 1 && sizeof(T) == 2 && AnyAlign<T>::value
               ? LN_CLUSTER_PART_ROWS_MORE : 0;
}

// Elements of vector v (of VEC) within a row or slice of `cols`: VEC, or
// the tail's count for the last vector of a row of any D.
template <typename T, int VEC>
__device__ __forceinline__ int vector_elements(int v, int cols) {
    if constexpr (AnyAlign<T>::value) return min(VEC, cols - v * VEC);
    else return VEC;
}

// The same as a mask, bit c for element c of vector v: how the forward's
// two centred sums skip the elements past a tail.
template <typename T, int VEC>
__device__ __forceinline__ unsigned lanes_on(int v, int cols) {
    if constexpr (AnyAlign<T>::value) {
        const int n = cols - v * VEC;
        return n >= VEC ? (1u << VEC) - 1u : (1u << n) - 1u;
    } else {
        return (1u << VEC) - 1u;
    }
}

// Vectors of a row or slice of `cols`: the tail counts as one.
template <typename T, int VEC>
__device__ __forceinline__ int row_vectors(int cols) {
    return AnyAlign<T>::value ? (cols + VEC - 1) / VEC : cols / VEC;
}

// The 16 bytes at p, on 4 bytes at least: one 16-byte access where p is
// on 16 bytes, else four of 4; STREAM adds the streaming hint.
template <bool STREAM>
__device__ __forceinline__ uint4 load16_any(const void* p) {
    const unsigned long long a = (unsigned long long)p;
    if ((a & 15) == 0) {
        const uint4* q = reinterpret_cast<const uint4*>(p);
        return STREAM ? __ldcs(q) : *q;
    }
    const unsigned* q = reinterpret_cast<const unsigned*>(p);
    if constexpr (STREAM)
        return make_uint4(__ldcs(q), __ldcs(q + 1), __ldcs(q + 2),
                          __ldcs(q + 3));
    else return make_uint4(q[0], q[1], q[2], q[3]);
}

// The converse: 16 bytes to p, in the same accesses.
template <bool STREAM>
__device__ __forceinline__ void store16_any(void* p, uint4 v) {
    const unsigned long long a = (unsigned long long)p;
    if ((a & 15) == 0) {
        uint4* q = reinterpret_cast<uint4*>(p);
        if constexpr (STREAM) __stcs(q, v); else *q = v;
    } else {
        unsigned* q = reinterpret_cast<unsigned*>(p);
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if constexpr (STREAM) __stcs(q + j, w[j]); else q[j] = w[j];
        }
    }
}

// One vector of 16 bytes as floats, and back (float32: 4, float16: 8).
__device__ __forceinline__ void unpack16(const uint4 v, float_any*,
                                         float* out) {
    out[0] = __uint_as_float(v.x); out[1] = __uint_as_float(v.y);
    out[2] = __uint_as_float(v.z); out[3] = __uint_as_float(v.w);
}
__device__ __forceinline__ void unpack16(const uint4 v, half_any*,
                                         float* out) {
    unpack_halves(v, out);
}
__device__ __forceinline__ uint4 pack16(const float* in, float_any*) {
    return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]),
                      __float_as_uint(in[2]), __float_as_uint(in[3]));
}
__device__ __forceinline__ uint4 pack16(const float* in, half_any*) {
    return pack_halves(in);
}

// Vec and VecStream for rows of any D: a whole vector as above, or, with
// n < VEC (the tail, n * sizeof(T) a multiple of 4), its n elements in words
// of 4 bytes, and zeros for the rest: a sum that adds them is the sum that
// skips them (a float sum that starts at +0 is never -0, so x + 0 is x). ALIGNED: p is
// known to be 16-byte aligned where n == VEC (gamma, beta and the prefetch
// slots, whose vectors start on 16 bytes whatever D is).
template <typename T, int VEC, bool STREAM, bool ALIGNED = false>
struct VecAny {
    static __device__ __forceinline__ void load(const T* p, float* out,
                                                int n = VEC) {
        if (n == VEC && ALIGNED) {
            unpack16(*reinterpret_cast<const uint4*>(p), (T*)nullptr, out);
        } else if (n == VEC) {
            unpack16(load16_any<STREAM>(p), (T*)nullptr, out);
        } else {  // a tail: whole words of 4 bytes, zeros past them
            const unsigned* q = reinterpret_cast<const unsigned*>(p);
            const int words = n * (int)sizeof(T) / 4;
            unsigned w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                w[j] = j < words ? (STREAM ? __ldcs(q + j) : q[j]) : 0u;
            unpack16(make_uint4(w[0], w[1], w[2], w[3]), (T*)nullptr, out);
        }
    }
    static __device__ __forceinline__ void store(T* p, const float* in,
                                                 int n = VEC) {
        const uint4 v = pack16(in, (T*)nullptr);
        if (n == VEC) {
            store16_any<STREAM>(p, v);
        } else {
            unsigned* q = reinterpret_cast<unsigned*>(p);
            const int words = n * (int)sizeof(T) / 4;
            const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (j < words) {
                    if constexpr (STREAM) __stcs(q + j, w[j]); else q[j] = w[j];
                }
            }
        }
    }
};

// ---- v5's float16 rows of odd D: rows that start on 2 bytes
//
// Row r of odd D starts r * D halves past the base (on 16 bytes): on 4
// bytes for even r, on 2 for odd r. cp.async copies 4 bytes at least, from
// an address on 4, so half_odd moves the vectors of a row on 2 bytes as the
// words around them: the 16 bytes that start one half before the vector
// (one copy of 16 where that is on 16 bytes, else four of 4) into its
// prefetch slot, and the word after them (the vector's last half and the
// next vector's first) into a word of its own (odd_word: half_odd's slots
// are 20 bytes a thread, a row of 16-byte slots and then a row of words,
// odd_slot_row). A tail of n halves (n odd) needs (n + 1) / 2 words
// there and no word after. A row on 4 bytes moves as half_any's, but for
// its tail: the word of its last half would run past the row, so that one
// copies 2 bytes and zeros (copy_async_2of4). The slot's reader shifts the
// halves of a row on 2 bytes into place. Stores and the loads of gamma and
// beta go to global memory by the same rule: 2-byte accesses for a half on
// its own, 4-byte ones for two, 16-byte ones for a whole vector on 16
// bytes. The columns, the order and the bits are half_any's (and the vector
// kernels').

// The word after the 16-byte slot at p: in the row of words that follows
// the row of slots p is in (this thread's, blockDim.x of them).
__device__ __forceinline__ unsigned* odd_word(void* p) {
    return reinterpret_cast<unsigned*>(reinterpret_cast<uint4*>(p) -
                                       threadIdx.x + blockDim.x) +
           threadIdx.x;
}

// Halves j and j + 1 of a vector's words w (j even: a word; odd: across two).
__device__ __forceinline__ unsigned halves_at(const unsigned (&w)[5], int j) {
    return j % 2 == 0 ? w[j / 2] : (w[j / 2] >> 16) | (w[j / 2 + 1] << 16);
}

template <bool STREAM>
struct VecOdd {
    // The n halves at p (on 2 bytes), as floats, zeros past them.
    static __device__ __forceinline__ void load(const half_odd* p, float* out,
                                                int n) {
        const unsigned long long a = (unsigned long long)p;
        const half_bits* h = reinterpret_cast<const half_bits*>(p);
        if (n == 8 && (a & 15) == 0) {
            const uint4* q = reinterpret_cast<const uint4*>(p);
            unpack_halves(STREAM ? __ldcs(q) : *q, out);
            return;
        }
        unsigned hv[9] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        if (a & 2) load_from<1>(h, hv, n);
        else load_from<0>(h, hv, n);
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = hv[2 * k] | (hv[2 * k + 1] << 16);
        unpack_halves(make_uint4(w[0], w[1], w[2], w[3]), out);
    }
    // The converse: the first n of 8 floats as halves at p.
    static __device__ __forceinline__ void store(half_odd* p, const float* in,
                                                 int n) {
        const unsigned long long a = (unsigned long long)p;
        half_bits* h = reinterpret_cast<half_bits*>(p);
        const uint4 v = pack_halves(in);
        if (n == 8 && (a & 15) == 0) {
            if constexpr (STREAM) __stcs(reinterpret_cast<uint4*>(p), v);
            else *reinterpret_cast<uint4*>(p) = v;
            return;
        }
        const unsigned w[5] = {v.x, v.y, v.z, v.w, 0u};
        if (a & 2) store_from<1>(h, w, n);
        else store_from<0>(h, w, n);
    }

  private:
    // Halves of h into hv, as load and store_from take them.
    template <int FIRST>
    static __device__ __forceinline__ void load_from(const half_bits* h,
                                                     unsigned (&hv)[9],
                                                     int n) {
        if (FIRST) hv[0] = ld16(h);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int j = 2 * k + FIRST;
            if (j + 1 < n) {
                const unsigned v = ld32(h + j);
                hv[j] = v & 0xffffu;
                hv[j + 1] = v >> 16;
            } else if (j < n) {
                hv[j] = ld16(h + j);
            }
        }
    }
    // Halves FIRST.. of w to h + FIRST..: a half on its own first if FIRST,
    // then words, then a half on its own where one is left (every index
    // known at compile time: w stays in registers).
    template <int FIRST>
    static __device__ __forceinline__ void store_from(half_bits* h,
                                                      const unsigned (&w)[5],
                                                      int n) {
        if (FIRST) st16(h, (half_bits)(w[0] & 0xffffu));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int j = 2 * k + FIRST;
            if (j + 1 < n) st32(h + j, halves_at(w, j));
            else if (j < n) st16(h + j, (half_bits)(halves_at(w, j) & 0xffffu));
        }
    }
    static __device__ __forceinline__ unsigned ld16(const half_bits* q) {
        if constexpr (STREAM) return __ldcs(q); else return *q;
    }
    static __device__ __forceinline__ unsigned ld32(const half_bits* q) {
        const unsigned* u = reinterpret_cast<const unsigned*>(q);
        if constexpr (STREAM) return __ldcs(u); else return *u;
    }
    static __device__ __forceinline__ void st16(half_bits* q, half_bits v) {
        if constexpr (STREAM) __stcs(q, v); else *q = v;
    }
    static __device__ __forceinline__ void st32(half_bits* q, unsigned v) {
        unsigned* u = reinterpret_cast<unsigned*>(q);
        if constexpr (STREAM) __stcs(u, v); else *u = v;
    }
};

// The copies of a vector of n halves at gmem (on 2 bytes) into its slot
// and, for a whole vector on 2 bytes, the word after it (see above).
__device__ __forceinline__ void copy_async_odd(void* smem, const half_odd* gmem,
                                               int n) {
    const unsigned long long a = (unsigned long long)gmem;
    char* d = reinterpret_cast<char*>(smem);
    if (a & 2) {  // the words from one half before it
        const char* g = reinterpret_cast<const char*>(gmem) - 2;
        const int words = n == 8 ? 4 : (n + 1) / 2;
        if (words == 4 && ((a - 2) & 15) == 0) {
            copy_async_16(d, g);
        } else {
            for (int k = 0; k < words; ++k) copy_async_4(d + 4 * k, g + 4 * k);
        }
        if (n == 8) copy_async_4(odd_word(smem), g + 16);
    } else {
        const char* g = reinterpret_cast<const char*>(gmem);
        if (n == 8 && (a & 15) == 0) {
            copy_async_16(d, g);
        } else {
            for (int k = 0; 2 * k + 1 < n; ++k)
                copy_async_4(d + 4 * k, g + 4 * k);
            if (n % 2) copy_async_2of4(d + 2 * (n - 1), g + 2 * (n - 1));
        }
    }
}

// A vector from its slots, copied from `from` by copy_async_odd.
__device__ __forceinline__ void load_slot_odd(const half_odd* p,
                                              const half_odd* from,
                                              float* out, int n) {
    const uint4 m = *reinterpret_cast<const uint4*>(p);
    unsigned w[5] = {m.x, m.y, m.z, m.w, 0u};
    if ((unsigned long long)from & 2) {  // one half early: shift it out
        w[4] = *odd_word(const_cast<half_odd*>(p));
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = halves_at(w, 2 * k + 1);
    }
    unpack_halves(make_uint4(w[0], w[1], w[2], w[3]), out);
#pragma unroll
    for (int c = 0; c < 8; ++c)
        if (c >= n) out[c] = 0.0f;
}

// A vector of n elements (n = VEC but for a tail) by Vec, VecStream (STREAM)
// or, for rows of any D, VecAny (VecOdd): what the kernels shared by both
// call.
template <typename T, int VEC, bool STREAM = false>
__device__ __forceinline__ void vec_load(const T* p, float* out, int n) {
    if constexpr (OddRows<T>::value) VecOdd<STREAM>::load(p, out, n);
    else if constexpr (AnyAlign<T>::value) VecAny<T, VEC, STREAM>::load(p, out, n);
    else if constexpr (STREAM) VecStream<T, VEC>::load(p, out);
    else Vec<T, VEC>::load(p, out);
}
// A vector from its prefetch slot (16 bytes of shared memory, written by
// this thread's copies of its n elements, from `from`, which only half_odd
// needs): all 16 bytes at once, then zeros past a tail.
template <typename T, int VEC>
__device__ __forceinline__ void vec_load_slot(const T* p, float* out, int n,
                                              const T* from = nullptr) {
    if constexpr (OddRows<T>::value) {
        load_slot_odd(p, from, out, n);
    } else if constexpr (AnyAlign<T>::value) {
        unpack16(*reinterpret_cast<const uint4*>(p), (T*)nullptr, out);
#pragma unroll
        for (int c = 0; c < VEC; ++c)
            if (c >= n) out[c] = 0.0f;
    } else {
        Vec<T, VEC>::load(p, out);
    }
}
// A vector known to start on 16 bytes (gamma, beta).
template <typename T, int VEC>
__device__ __forceinline__ void vec_load_aligned(const T* p, float* out,
                                                 int n) {
    if constexpr (OddRows<T>::value) VecOdd<false>::load(p, out, n);
    else if constexpr (AnyAlign<T>::value) VecAny<T, VEC, false, true>::load(p, out, n);
    else Vec<T, VEC>::load(p, out);
}
template <typename T, int VEC, bool STREAM = false>
__device__ __forceinline__ void vec_store(T* p, const float* in, int n) {
    if constexpr (OddRows<T>::value) VecOdd<STREAM>::store(p, in, n);
    else if constexpr (AnyAlign<T>::value) VecAny<T, VEC, STREAM>::store(p, in, n);
    else if constexpr (STREAM) VecStream<T, VEC>::store(p, in);
    else Vec<T, VEC>::store(p, in);
}

// The copy of vector v's n elements (n * sizeof(T) a multiple of 4) into a
// 16-byte prefetch slot: one copy of 16 bytes where the vector is whole and
// on 16 bytes, else copies of 4 bytes.
template <typename T>
__device__ __forceinline__ void copy_async_any(void* smem, const T* gmem,
                                               int n) {
    const unsigned long long a = (unsigned long long)gmem;
    const int bytes = n * (int)sizeof(T);
    char* d = reinterpret_cast<char*>(smem);
    const char* g = reinterpret_cast<const char*>(gmem);
    if (bytes == 16 && (a & 15) == 0) {
        copy_async_16(smem, gmem);
    } else {
        for (int b = 0; b < bytes; b += 4) copy_async_4(d + b, g + b);
    }
}

// The prefetch of vector v's n elements (n = VEC but for a tail) into its
// 16-byte slot.
template <typename T, int VEC>
__device__ __forceinline__ void copy_vec(void* smem, const T* gmem, int n) {
    if constexpr (OddRows<T>::value) copy_async_odd(smem, gmem, n);
    else if constexpr (AnyAlign<T>::value) copy_async_any(smem, gmem, n);
    else copy_async_16(smem, gmem);
}

// Row reductions. A butterfly (xor) shuffle leaves the sum in every lane, and
// every lane adds the same two numbers at every step, so all lanes agree to
// the bit. The order is fixed: lane i + lane i^16, then ^8, ^4, ^2, ^1.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float2 warp_sum(float2 v) {
    return make_float2(warp_sum(v.x), warp_sum(v.y));
}

__device__ __forceinline__ float zero_like(float) { return 0.0f; }
__device__ __forceinline__ float2 zero_like(float2) {
    return make_float2(0.0f, 0.0f);
}

// Sum over the whole block: each warp reduces by shuffles, lane 0 parks the
// warp's sum in shared memory, warp 0 reduces those (padded with zeros to 32
// lanes, so the order is the same tree as a warp's), and everyone reads it.
// Two barriers per sum. No third one is needed before the next sum reuses
// the slots: its writes go to partial[warp], which nobody reads any more once
// the second barrier has passed, and partial[32] is written again only after
// the next sum's first barrier, which every thread reaches after its read.
template <typename V>
__device__ __forceinline__ V block_sum(V v) {
    __shared__ V partial[33];  // one slot per warp, and one for the result
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        V w = lane < nwarps ? partial[lane] : zero_like(v);
        w = warp_sum(w);
        if (lane == 0) partial[32] = w;
    }
    __syncthreads();
    return partial[32];
}

// A row is reduced by its own warp, or by the whole block.
template <bool PER_BLOCK, typename V>
__device__ __forceinline__ V row_sum(V v) {
    if constexpr (PER_BLOCK) return block_sum(v);
    else return warp_sum(v);
}

// The row group (a warp or a block) a thread belongs to, and its rank in it.
template <bool PER_BLOCK>
__device__ __forceinline__ long long group_index() {
    if constexpr (PER_BLOCK) return blockIdx.x;
    else return (long long)blockIdx.x * (blockDim.x >> 5)
                + (threadIdx.x >> 5);
}

template <bool PER_BLOCK>
__device__ __forceinline__ int rank_in_group() {
    return PER_BLOCK ? (int)threadIdx.x : (int)(threadIdx.x & 31);
}

template <bool PER_BLOCK>
__device__ __forceinline__ int group_size() {
    return PER_BLOCK ? (int)blockDim.x : 32;
}

// The row sum of one group of group_threads threads (whole warps) inside a
// block of several: block_sum's order and its two barriers, with a slot per
// warp and a result per group.
template <typename V>
__device__ __forceinline__ V group_sum(V v, int group_threads) {
    __shared__ V warp_part[LN_MAX_ROW_THREADS / 32];
    __shared__ V group_part[LN_MAX_ROW_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wpg = group_threads >> 5, group = warp / wpg;
    const int first = group * wpg;
    v = warp_sum(v);
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == first) {
        V w = lane < wpg ? warp_part[first + lane] : zero_like(v);
        w = warp_sum(w);
        if (lane == 0) group_part[group] = w;
    }
    __syncthreads();
    return group_part[group];
}

// v5's prefetch buffers in dynamic shared memory: one per row in flight,
// used in turn, each with TENSORS rows (x; or x and dy), each row VPT
// 16-byte vectors per thread, laid out [buffer][tensor][VPT][blockDim.x] so
// that a warp's accesses to one vector are 512 consecutive bytes. This
// thread's slot.
template <int TENSORS, int VPT>
__device__ __forceinline__ uint4* prefetch_slot(uint4* staged, int buffer,
                                                int tensor, int i) {
    return staged + ((buffer * TENSORS + tensor) * VPT + i) * blockDim.x
           + threadIdx.x;
}
// half_odd's slots are 20 bytes a thread: each row of 16-byte slots is
// followed by a row of 4-byte words (odd_word), 20 * blockDim.x bytes in
// all, a multiple of 16. Where row `row` of them starts.
__device__ __forceinline__ uint4* odd_slot_row(uint4* staged, int row) {
    return reinterpret_cast<uint4*>(reinterpret_cast<unsigned*>(staged) +
                                    row * 5 * blockDim.x);
}
// prefetch_slot for storage type T (the others' layout kept as it was
// measured).
template <typename T, int TENSORS, int VPT>
__device__ __forceinline__ uint4* prefetch_slot_of(uint4* staged, int buffer,
                                                   int tensor, int i) {
    if constexpr (OddRows<T>::value)
        return odd_slot_row(staged, (buffer * TENSORS + tensor) * VPT + i) +
               threadIdx.x;
    else return prefetch_slot<TENSORS, VPT>(staged, buffer, tensor, i);
}
// Past the S buffers of TENSORS rows: the scratch of a cluster's row sums.
template <typename T, int S, int TENSORS, int VPT>
__device__ __forceinline__ uint4* past_prefetch(uint4* staged) {
    if constexpr (OddRows<T>::value)
        return odd_slot_row(staged, S * TENSORS * VPT);
    else return staged + S * TENSORS * VPT * blockDim.x;
}

// The row loop of v5's kernels over a strip of rows_per_group rows, of which
// rows first .. last - 1 are the group's (the others inactive: the groups of
// a block step together). A block of one group (P == 1) stops at its last
// row: its threads agree on it, so they still meet at every barrier. With
// STAGED, the copies of each row are started S - 1 rows ahead by
// `prefetch(row, buffer)` into buffer row % S of the strip, one commit group
// per row (empty past the strip), and waited for before `step(buffer, row,
// active)` works on it; without, `step` reads global memory itself (buffer
// unused). An inactive row's `row` is 0.
template <bool STAGED, int S, typename Prefetch, typename Step>
__device__ __forceinline__ void strip_rows(long long first, long long last,
                                           int rows_per_group, int P,
                                           Prefetch prefetch, Step step) {
    const int steps = P == 1 ? (int)max(0LL, last - first) : rows_per_group;
    if constexpr (STAGED) {
#pragma unroll
        for (int j = 0; j < S - 1; ++j) {
            if (first + j < last) prefetch(first + j, j);
            async_commit();
        }
    }
    for (int k = 0; k < steps; ++k) {
        const bool active = first + k < last;
        if constexpr (STAGED) {
            if (first + k + S - 1 < last)
                prefetch(first + k + S - 1, (k + S - 1) % S);
            async_commit();
            async_wait<S - 1>();  // row k's copies are done
        }
        step(k % S, active ? first + k : 0, active);
    }
}

// ---- v5's clusters: a row too long for one block, shared by several ----
//
// Thread block clusters (sm_90 and later) let the blocks of a cluster, which
// the GPU runs at the same time on neighbouring SMs, wait for one another
// (barrier.cluster) and write into one another's shared memory (mapa, then
// st.shared::cluster). v5 gives a row too long for one block to a cluster of
// CL blocks, block r of the cluster holding the row's slice r of
// LN_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS elements in registers, as a
// block holds a whole row of that length. On the host (lnorm.gpu.host) a
// cluster's blocks run at the same time, each with its own dynamic shared
// memory, and cuda_host.h provides the two operations (cluster_sync,
// cluster_store).
#ifdef __CUDA_ARCH__
// Every thread of every block of the cluster arrives; what any of them wrote
// to shared memory before is then visible to all (release, acquire).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Store v at `p` (an address in this block's shared memory) in block
// `rank`'s copy: the write reaches the other SM's shared memory, and is seen
// there after the next cluster barrier.
__device__ __forceinline__ void cluster_store(float* p, float v, int rank) {
    const unsigned here = (unsigned)__cvta_generic_to_shared(p);
    unsigned there;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(there) : "r"(here), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;"
                 :: "r"(there), "f"(v) : "memory");
}
#else
inline void cluster_sync() { cuda_host::cluster_sync(); }
inline void cluster_store(float* p, float v, int rank) {
    *cuda_host::in_block(p, rank) = v;
}
#endif
__device__ __forceinline__ void cluster_store(float2* p, float2 v, int rank) {
    float* f = reinterpret_cast<float*>(p);
    cluster_store(f, v.x, rank);
    cluster_store(f + 1, v.y, rank);
}
__device__ __forceinline__ float add_like(float a, float b) { return a + b; }
__device__ __forceinline__ float2 add_like(float2 a, float2 b) {
    return make_float2(a.x + b.x, a.y + b.y);
}

// Shared memory a cluster's row sums use, after a block's prefetch buffers:
// a slot per warp, and twice a slot per block of the cluster (float2: the
// backward's two sums at once; the forward uses half of each).
#define LN_CLUSTER_SCRATCH_BYTES 256
static_assert(LN_CLUSTER_SCRATCH_BYTES
                  == 8 * (LN_MAX_ROW_THREADS / 32 + 2 * LN_MAX_CLUSTER),
              "a float2 slot per warp, and two per block of a cluster");

// The row sum of a cluster of CL blocks. Each block sums its slice as
// block_sum sums a row (the same order); lane r < CL of warp 0 then writes
// that sum into block r's slot for this block, so that after one cluster
// barrier every block holds all CL sums in its own shared memory, and every
// thread adds them in rank order, 0, 1, ..., CL - 1: every block gets the
// same bits. Writing to the other blocks, not reading from them, puts the
// other SMs' latency before the barrier, where all the blocks' writes are
// under way at once, and not after it, where every thread would wait for
// its reads (measured on an H200: the writes were faster). The slots alternate
// (`parity`), so one barrier a sum is enough: a block's slot is written
// again two sums later, after the barrier of the sum between, which no block
// passes before every block has read this one. `scratch` is dynamic shared
// memory (LN_CLUSTER_SCRATCH_BYTES); nothing here is __shared__ static, so
// that the host can run a cluster's blocks at once.
template <int CL, typename V>
__device__ __forceinline__ V cluster_sum(V v, V* scratch, int& parity) {
    constexpr int WARPS = LN_MAX_ROW_THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    V* slots = scratch + WARPS + parity * LN_MAX_CLUSTER;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        V w = lane < nwarps ? scratch[lane] : zero_like(v);
        w = warp_sum(w);  // every lane has the block's sum
        if (lane < CL) cluster_store(slots + blockIdx.x % CL, w, lane);
    }
    cluster_sync();
    V total = slots[0];
#pragma unroll
    for (int r = 1; r < CL; ++r) total = add_like(total, slots[r]);
    parity ^= 1;
    return total;
}
// (end of v5's clusters)

#endif  // LNORM_LAYERNORM_COMMON_CU
