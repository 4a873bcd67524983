// Fused layer-norm forward: y = gamma * (x - mean) * rstd + beta, one row per
// warp (short rows) or per block (long rows). Each element of x is read from
// global memory once and each element of y written once; the row lives in
// registers in between.
//
// The mean is kept as two float32 numbers, mean_hi + mean_lo: mean_hi is the
// rounded sum over D, and mean_lo the mean of x - mean_hi, which is minus
// mean_hi's rounding error (x - mean_hi is exact when the offset dominates
// the row, by Sterbenz's lemma). Centring as (x - mean_hi) - mean_lo keeps the
// float32 error of xhat at the size of the row's spread, not of its mean: the
// accuracy stays flat in the offset. mean_hi, mean_lo and rstd (float32, one
// each per row) are saved for the backward, which centres the same way.
#include "layernorm_common.cu"

// One row of the forward for one thread, which holds vectors t, t + G,
// t + 2G, ... of the row (G threads a row group): `load_row(i, v, xv)` gives
// the thread's i-th vector, vector v of the row, as floats; `row_sum_of`
// sums over the group. A row that is not `active` (v5 pads a block's strips
// to one length) reads and writes nothing and adds zeros to the row sums,
// which every thread of the group still makes. STREAM stores y with the
// streaming cache hint (v5; v4's forward stores it plainly). A thread holds
// E elements of the row (E / VEC vectors): LN_ELEMS_PER_THREAD, or for v5's
// rows longer than that, LN_LONG_ELEMS_PER_THREAD. A block of a v5 cluster
// holds a slice of the row: `cols` elements (default: all D), with gamma,
// beta and y starting at the slice; it saves the statistics if `save`.
template <typename T, int VEC, bool STREAM = false,
          int E = LN_ELEMS_PER_THREAD, typename LoadRow, typename RowSum>
__device__ __forceinline__ void forward_row(
    const T* __restrict__ gamma, const T* __restrict__ beta, T* __restrict__ y,
    float* __restrict__ mean_hi_out, float* __restrict__ mean_lo_out,
    float* __restrict__ rstd_out, long long row, int D, float eps, int t,
    int G, bool active, LoadRow load_row, RowSum row_sum_of, int cols = -1,
    bool save = true)
{
    constexpr int VPT = E / VEC;  // vectors per thread
    const int ncols = cols < 0 ? D : cols;
    const int nvec = row_vectors<T, VEC>(ncols);  // a tail counts as one
    T* yrow = y + row * D;

    // Step 1: the row into registers, one load per vector of VEC elements.
    // Thread t holds vectors t, t + G, t + 2G, ...: neighbouring threads read
    // neighbouring addresses (coalesced). Its partial sum, then the row's.
    float xv[E];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (active && v < nvec) {
            const int n = vector_elements<T, VEC>(v, ncols);
            load_row(i, v, &xv[i * VEC], n);  // zeros past a tail
#pragma unroll
            for (int c = 0; c < VEC; ++c) sum += xv[i * VEC + c];
        }
    }
    const float mean_hi = row_sum_of(sum) / (float)D;

    // Step 2: the correction, mean_lo = mean(x - mean_hi), and the centred
    // row d = (x - mean_hi) - mean_lo, kept in registers in place of x.
    float lo = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        if (active && t + i * G < nvec) {
            const unsigned on = lanes_on<T, VEC>(t + i * G, ncols);
#pragma unroll
            for (int c = 0; c < VEC; ++c)
                if (on >> c & 1u) lo += xv[i * VEC + c] - mean_hi;
        }
    }
    const float mean_lo = row_sum_of(lo) / (float)D;

    // Step 3: the variance as the mean of squared deviations (two-pass),
    // over registers, not over memory.
    float m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        if (active && t + i * G < nvec) {
            const unsigned on = lanes_on<T, VEC>(t + i * G, ncols);
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const int k = i * VEC + c;
                xv[k] = (xv[k] - mean_hi) - mean_lo;
                if (on >> c & 1u) m2 += xv[k] * xv[k];
            }
        }
    }
    // Correctly rounded divide and sqrt (NVRTC's defaults), not rsqrtf.
    const float var = row_sum_of(m2) / (float)D;
    const float rstd = 1.0f / sqrtf(var + eps);

    // Step 4: normalize, scale, shift; y written once, in the storage type.
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (active && v < nvec) {
            const int n = vector_elements<T, VEC>(v, ncols);
            float g[VEC], b[VEC], out[VEC];
            vec_load_aligned<T, VEC>(gamma + v * VEC, g, n);
            vec_load_aligned<T, VEC>(beta + v * VEC, b, n);
#pragma unroll
            for (int c = 0; c < VEC; ++c)
                out[c] = xv[i * VEC + c] * rstd * g[c] + b[c];
            vec_store<T, VEC, STREAM>(yrow + v * VEC, out, n);
        }
    }
    if (active && t == 0 && save) {
        mean_hi_out[row] = mean_hi;
        mean_lo_out[row] = mean_lo;
        rstd_out[row] = rstd;
    }
}

template <typename T, int VEC, bool PER_BLOCK>
__device__ __forceinline__ void layernorm_forward(
    const T* __restrict__ x, const T* __restrict__ gamma,
    const T* __restrict__ beta, T* __restrict__ y,
    float* __restrict__ mean_hi_out, float* __restrict__ mean_lo_out,
    float* __restrict__ rstd_out, int rows, int D, float eps)
{
    const long long row = group_index<PER_BLOCK>();
    if (row >= rows) return;  // uniform over the group: no shuffle is split
    const int t = rank_in_group<PER_BLOCK>(), G = group_size<PER_BLOCK>();
    forward_row<T, VEC>(
        gamma, beta, y, mean_hi_out, mean_lo_out, rstd_out, row, D, eps, t, G,
        true,
        [x, row, D](int, int v, float* xv, int) {
            Vec<T, VEC>::load(x + row * D + v * VEC, xv);
        },
        [](float v) { return row_sum<PER_BLOCK>(v); });
}

// One kernel per variant (LN_VARIANTS), named ln_fwd_<suffix>.
// __launch_bounds__ gives the largest block and asks for at least one
// resident block per SM: registers stay within what that block may use, and
// ptxas does not spill to squeeze in more blocks.
#define LN_FORWARD_KERNEL(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS)            \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)             \
    ln_fwd_##SUFFIX(const T* __restrict__ x, const T* __restrict__ gamma,    \
                    const T* __restrict__ beta, T* __restrict__ y,           \
                    float* __restrict__ mean_hi, float* __restrict__ mean_lo,\
                    float* __restrict__ rstd, int rows, int D, float eps) {  \
        layernorm_forward<T, VEC, PER_BLOCK>(x, gamma, beta, y, mean_hi,     \
                                             mean_lo, rstd, rows, D, eps);   \
    }

LN_VARIANTS(LN_FORWARD_KERNEL)

// ---- v5: strips of rows, several row groups a block, the next row prefetched
//
// The forward of the ladder's v5, with the launch of v5's backward: a block
// of P = blockDim.x / group_threads row groups, each with a strip of
// rows_per_group consecutive rows, which the groups step through together
// (a row past a group's strip is inactive), so that every thread reaches the
// barriers of the row sums. Rows of 16-byte vectors are prefetched: while a
// thread works on row k, its copies of rows k + 1, ..., k + S - 1 are in
// flight into shared memory (cp.async), S = LN_FWD_ROWS_IN_FLIGHT buffers
// used in turn (three: the forward's three row sums a row expose more
// latency than the backward's one; one more in float16 clusters of a tail,
// part_rows_more); a thread reads back only what its own
// copies wrote, so no barrier is needed. Rows of scalars are
// read from global memory. The arithmetic of a row is forward_row's, so the
// bits are v4's forward's. With E = LN_LONG_ELEMS_PER_THREAD, the same for
// rows longer than a block holds at LN_ELEMS_PER_THREAD elements a thread
// (one group of LN_MAX_ROW_THREADS threads a block): the row still fits in
// registers, as the forward keeps nothing else there, and is read from DRAM
// once, where v4's long-row forward reads it four times.
//
// With CL > 1 (v5's rows past LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS)
// a row group is a cluster of CL blocks of one group each: block r of the
// cluster holds slice r of the row, LN_ELEMS_PER_THREAD elements a thread,
// and the row sums are cluster_sum's. Block 0 of the cluster saves the
// statistics. Every block waits at a last cluster barrier before it exits:
// a defence, not a need of this exchange (every write into a block's slots
// lands before the barrier of its sum, which that block passes only after
// it), kept as the kernels were measured with it.
template <typename T, int VEC, bool PER_BLOCK, int E = LN_ELEMS_PER_THREAD,
          int CL = 1>
__device__ __forceinline__ void layernorm_forward_grouped(
    const T* __restrict__ x, const T* __restrict__ gamma,
    const T* __restrict__ beta, T* __restrict__ y,
    float* __restrict__ mean_hi_out, float* __restrict__ mean_lo_out,
    float* __restrict__ rstd_out, int rows, int D, float eps,
    int rows_per_group, int group_threads)
{
    constexpr int VPT = E / VEC;
    constexpr bool STAGED = VEC * sizeof(T) == 16;
    constexpr int S = LN_FWD_ROWS_IN_FLIGHT + part_rows_more<T, CL>();
    constexpr int SLICE = LN_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS;
    const int G = group_threads, P = blockDim.x / G;
    const int p = threadIdx.x / G, t = threadIdx.x % G;
    const int rank = CL > 1 ? (int)(blockIdx.x % CL) : 0;
    const long long group = CL > 1 ? (long long)(blockIdx.x / CL)
                                   : (long long)blockIdx.x * P + p;
    const long long first = group * rows_per_group;
    const long long last = min(first + rows_per_group, (long long)rows);
    // This block's columns: all of them, or its slice of the cluster's row
    const int col0 = rank * SLICE;
    const int cols = CL > 1 ? max(0, min(SLICE, D - col0)) : D;
    const int nvec = row_vectors<T, VEC>(cols);

    LN_DYNAMIC_SHARED(uint4, staged);
    float* scratch =
        reinterpret_cast<float*>(past_prefetch<T, S, 1, VPT>(staged));
    int parity = 0;
    auto row_sum_of = [&](float v) {
        if constexpr (CL > 1) return cluster_sum<CL>(v, scratch, parity);
        else if constexpr (PER_BLOCK) return group_sum(v, G);
        else return warp_sum(v);
    };
    auto prefetch = [&](long long row, int buffer) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec)
                copy_vec<T, VEC>(prefetch_slot_of<T, 1, VPT>(staged, buffer,
                                                             0, i),
                                 x + row * D + col0 + v * VEC,
                                 vector_elements<T, VEC>(v, cols));
        }
    };
    strip_rows<STAGED, S>(first, last, rows_per_group, P, prefetch,
                          [&](int buffer, long long row, bool active) {
        forward_row<T, VEC, true, E>(
            gamma + col0, beta + col0, y + col0, mean_hi_out, mean_lo_out,
            rstd_out, row, D, eps, t, G, active,
            [&](int i, int v, float* xv, int n) {
                if constexpr (STAGED)
                    vec_load_slot<T, VEC>(
                        reinterpret_cast<const T*>(prefetch_slot_of<T, 1, VPT>(
                            staged, buffer, 0, i)),
                        xv, n, x + row * D + col0 + v * VEC);
                else
                    vec_load<T, VEC>(x + row * D + col0 + v * VEC, xv, n);
            },
            row_sum_of, cols, rank == 0);
    });
    if constexpr (CL > 1) cluster_sync();
}

// v5: one per variant, named ln_fwd_grouped_<suffix>, launched in v5's
// backward's blocks (lnorm.gpu.kernels.LaunchPlan.forward_launch). E row
// elements a thread. The variants of 16-byte vectors take
// LN_FWD_ROWS_IN_FLIGHT * 16 * (E / VEC) bytes of dynamic shared memory per
// thread (LaunchPlan.forward_shared_bytes), and those of rows in registers
// ask for MIN_BLOCKS blocks an SM: LN_FWD_THREADS_PER_SM threads, at most 64
// registers each (the plan's forward strips fill one wave of them).
#define LN_FWD_MIN_BLOCKS(T, VEC, MAX_THREADS)                              \
    ((VEC) * sizeof(T) == 16 ? LN_FWD_THREADS_PER_SM / (MAX_THREADS) : 1)
// Every v5 forward kernel: these parameters, handed to CALL (a
// parenthesized device function); its attributes (launch bounds, cluster
// size) last.
#define LN_FORWARD_GROUPED_AS(SUFFIX, T, CALL, ...)                          \
    extern "C" __global__ void __VA_ARGS__                                   \
    ln_fwd_grouped_##SUFFIX(const T* __restrict__ x,                         \
                            const T* __restrict__ gamma,                     \
                            const T* __restrict__ beta, T* __restrict__ y,   \
                            float* __restrict__ mean_hi,                     \
                            float* __restrict__ mean_lo,                     \
                            float* __restrict__ rstd, int rows, int D,       \
                            float eps, int rows_per_group,                   \
                            int group_threads) {                             \
        CALL(x, gamma, beta, y, mean_hi, mean_lo, rstd, rows, D, eps,        \
             rows_per_group, group_threads);                                 \
    }

#define LN_FORWARD_GROUPED_KERNEL_E(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS, \
                                    E, MIN_BLOCKS)                          \
    LN_FORWARD_GROUPED_AS(SUFFIX, T,                                         \
                          (layernorm_forward_grouped<T, VEC, PER_BLOCK, E>), \
                          __launch_bounds__(MAX_THREADS, MIN_BLOCKS))

#define LN_FORWARD_GROUPED_KERNEL(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS)    \
    LN_FORWARD_GROUPED_KERNEL_E(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS,      \
                                LN_ELEMS_PER_THREAD,                         \
                                LN_FWD_MIN_BLOCKS(T, VEC, MAX_THREADS))

LN_GROUPED_VARIANTS(LN_FORWARD_GROUPED_KERNEL)

// v5 for rows longer than a block holds at LN_ELEMS_PER_THREAD elements a
// thread, up to LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS: one name per
// long variant, ln_fwd_grouped_long_<suffix>, launched as the others.
#define LN_FORWARD_GROUPED_LONG_KERNEL(SUFFIX, T, VEC, MAX_THREADS)          \
    LN_FORWARD_GROUPED_KERNEL_E(SUFFIX, T, VEC, true, MAX_THREADS,           \
                                LN_LONG_ELEMS_PER_THREAD, 1)

LN_LONG_VECTOR_VARIANTS(LN_FORWARD_GROUPED_LONG_KERNEL)

// v5 for rows longer than LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS, up
// to LN_MAX_CLUSTER * LN_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS: one name per
// cluster variant, ln_fwd_grouped_<suffix>, with CL blocks a cluster fixed
// at compile time (__cluster_dims__: an ordinary launch makes the clusters;
// the grid is a multiple of CL). sm_90 and later only.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define LN_FORWARD_CLUSTER_KERNEL(SUFFIX, T, VEC, MAX_THREADS, CL)           \
    LN_FORWARD_GROUPED_AS(SUFFIX, T,                                         \
                          (layernorm_forward_grouped<T, VEC, true,           \
                                                     LN_ELEMS_PER_THREAD,    \
                                                     CL>),                   \
                          __cluster_dims__(CL, 1, 1)                         \
                          __launch_bounds__(MAX_THREADS,                     \
                                            LN_FWD_THREADS_PER_SM /          \
                                                (MAX_THREADS)))

LN_CLUSTER_VARIANTS(LN_FORWARD_CLUSTER_KERNEL)
#endif
