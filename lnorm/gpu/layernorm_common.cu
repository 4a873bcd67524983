// Shared pieces of the fused layer-norm kernels: launch constants, the
// tables of kernel variants, float16 conversion, one-instruction vector loads
// and stores, row reductions.
//
// Included by the kernel files; not a kernel file on its own. Needs no CUDA
// header: NVRTC compiles it with no include path, on a machine with or
// without a GPU.
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
// v5: rows whose loads are in flight, the forward's and the backward's (a
// block's row; a warp's row is short, so more of them)
#define LN_FWD_ROWS_IN_FLIGHT 3
#define LN_BWD_ROWS_IN_FLIGHT 2
#define LN_BWD_WARP_ROWS_IN_FLIGHT_F32 3
#define LN_BWD_WARP_ROWS_IN_FLIGHT_F16 4
// v5's rows past registers: elements a thread takes
#define LN_LONG_ELEMS_PER_THREAD 24
// Largest block of each kind, for __launch_bounds__.
#define LN_WARP_THREADS (32 * LN_WARPS_PER_BLOCK)
#define LN_BLOCK_THREADS LN_MAX_ROW_THREADS

// THE TABLES: every kernel is one line of one of these lists, and
// lnorm.gpu.kernels.kernel_params reads them; the plan, the emulation, the
// CPU harness, the model and the tests take the kernels from there.
// K(name suffix, storage type, elements per vector load, one row per block
// (else per warp), largest block). v3 and v4, forward and backward:
#define LN_VARIANTS(K)                                      \
    K(warp_f32_v4, float, 4, false, LN_WARP_THREADS)        \
    K(warp_f32_v1, float, 1, false, LN_WARP_THREADS)        \
    K(warp_f16_v8, half_bits, 8, false, LN_WARP_THREADS)    \
    K(warp_f16_v1, half_bits, 1, false, LN_WARP_THREADS)    \
    K(block_f32_v4, float, 4, true, LN_BLOCK_THREADS)       \
    K(block_f32_v1, float, 1, true, LN_BLOCK_THREADS)       \
    K(block_f16_v8, half_bits, 8, true, LN_BLOCK_THREADS)   \
    K(block_f16_v1, half_bits, 1, true, LN_BLOCK_THREADS)

// v4's rows longer than registers hold (layernorm_long.cu): a block per row
// group. K(suffix, storage type, vector, largest block).
#define LN_LONG_VARIANTS(K)                            \
    K(long_f32_v4, float, 4, LN_BLOCK_THREADS)         \
    K(long_f32_v1, float, 1, LN_BLOCK_THREADS)         \
    K(long_f16_v8, half_bits, 8, LN_BLOCK_THREADS)     \
    K(long_f16_v1, half_bits, 1, LN_BLOCK_THREADS)

// v5's backward, K(...) as LN_VARIANTS: 16-byte vectors only (the next row
// is copied into shared memory 16 bytes at a time); other rows run v4's.
#define LN_GROUPED_VARIANTS(K)                              \
    K(warp_f32_v4, float, 4, false, LN_WARP_THREADS)        \
    K(warp_f16_v8, half_bits, 8, false, LN_WARP_THREADS)    \
    K(block_f32_v4, float, 4, true, LN_BLOCK_THREADS)       \
    K(block_f16_v8, half_bits, 8, true, LN_BLOCK_THREADS)

// v5's rows past registers, up to LN_LONG_ELEMS_PER_THREAD *
// LN_MAX_ROW_THREADS, K(...) as LN_LONG_VARIANTS: the backward's, and the
// forward's (only float16: there it was measured ahead of v4's forward).
#define LN_GROUPED_LONG_VARIANTS(K)                    \
    K(long_f32_v4, float, 4, LN_BLOCK_THREADS)         \
    K(long_f16_v8, half_bits, 8, LN_BLOCK_THREADS)
#define LN_GROUPED_LONG_FWD_VARIANTS(K)                \
    K(long_f16_v8, half_bits, 8, LN_BLOCK_THREADS)

// float16 is stored as its 16 raw bits and converted with one PTX instruction
// each way, so no cuda_fp16.h is needed. Arithmetic is always float32. On the
// host (tests/cuda_host compiles this file with g++ to run it on the CPU) the
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

// Streaming variants of the 16-byte loads and stores, for rows written once
// (y, dx in v5): the same instructions with the .cs ("evict first") cache
// hint, so the rows do not push out of L2 what is used again.
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

// Asynchronous copies, global to shared memory (sm_80 and later), which v5's
// backward uses to load the next row while it works on this one: the copy
// needs no register, so the row in flight costs shared memory, not the
// registers a row already fills. copy_async_16 starts a 16-byte copy (both
// addresses aligned to 16; .cg: through L2 only, as the rows are read once);
// async_commit closes a group of copies; async_wait<N> waits until at most N
// groups of this thread are still in flight. A thread reads only what its own
// copies wrote, so no barrier is needed between the copy and the read. On the
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
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
inline void async_commit() { cuda_host::copy_commit(); }
template <int N> inline void async_wait() { cuda_host::copy_wait(N); }
#define LN_DYNAMIC_SHARED(T, name) \
    T* name = reinterpret_cast<T*>(cuda_host::dynamic_shared())
#endif


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

// The row loop of v5's kernels over a strip of rows_per_group rows, of which
// rows first .. last - 1 are the group's (the others inactive: the groups of
// a block step together). A block of one group (P == 1) stops at its last
// row: its threads agree on it, so they still meet at every barrier. The
// copies of each row are started S - 1 rows ahead by `prefetch(row, buffer)`
// into buffer row % S of the strip, one commit group per row (empty past the
// strip), and waited for before `step(buffer, row, active)` works on it. An
// inactive row's `row` is 0.
template <int S, typename Prefetch, typename Step>
__device__ __forceinline__ void strip_rows(long long first, long long last,
                                           int rows_per_group, int P,
                                           Prefetch prefetch, Step step) {
    const int steps = P == 1 ? (int)max(0LL, last - first) : rows_per_group;
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
        if (first + j < last) prefetch(first + j, j);
        async_commit();
    }
    for (int k = 0; k < steps; ++k) {
        const bool active = first + k < last;
        if (first + k + S - 1 < last)
            prefetch(first + k + S - 1, (k + S - 1) % S);
        async_commit();
        async_wait<S - 1>();  // row k's copies are done
        step(k % S, active ? first + k : 0, active);
    }
}

#endif  // LNORM_LAYERNORM_COMMON_CU
