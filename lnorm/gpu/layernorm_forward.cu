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
// rows longer than that, LN_LONG_ELEMS_PER_THREAD.
template <typename T, int VEC, bool STREAM = false,
          int E = LN_ELEMS_PER_THREAD, typename LoadRow, typename RowSum>
__device__ __forceinline__ void forward_row(
    const T* __restrict__ gamma, const T* __restrict__ beta, T* __restrict__ y,
    float* __restrict__ mean_hi_out, float* __restrict__ mean_lo_out,
    float* __restrict__ rstd_out, long long row, int D, float eps, int t,
    int G, bool active, LoadRow load_row, RowSum row_sum_of)
{
    constexpr int VPT = E / VEC;  // vectors per thread
    const int nvec = D / VEC;
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
            load_row(i, v, &xv[i * VEC]);
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
#pragma unroll
            for (int c = 0; c < VEC; ++c) lo += xv[i * VEC + c] - mean_hi;
        }
    }
    const float mean_lo = row_sum_of(lo) / (float)D;

    // Step 3: the variance as the mean of squared deviations (two-pass),
    // over registers, not over memory.
    float m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        if (active && t + i * G < nvec) {
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const int k = i * VEC + c;
                xv[k] = (xv[k] - mean_hi) - mean_lo;
                m2 += xv[k] * xv[k];
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
            float g[VEC], b[VEC], out[VEC];
            Vec<T, VEC>::load(gamma + v * VEC, g);
            Vec<T, VEC>::load(beta + v * VEC, b);
#pragma unroll
            for (int c = 0; c < VEC; ++c)
                out[c] = xv[i * VEC + c] * rstd * g[c] + b[c];
            if constexpr (STREAM)
                VecStream<T, VEC>::store(yrow + v * VEC, out);
            else
                Vec<T, VEC>::store(yrow + v * VEC, out);
        }
    }
    if (active && t == 0) {
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
        [x, row, D](int, int v, float* xv) {
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

// ---- v5's forward: rows past registers, the next rows prefetched ----
//
// For rows longer than a block holds at LN_ELEMS_PER_THREAD elements a
// thread, up to LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS: one group of
// group_threads threads a block, each with a strip of rows_per_group
// consecutive rows. While a thread works on row k, its copies of rows
// k + 1, ..., k + S - 1 are in flight into shared memory (cp.async), S =
// LN_FWD_ROWS_IN_FLIGHT buffers used in turn; a thread reads back only what
// its own copies wrote, so no barrier is needed. The row still fits in
// registers (the forward keeps nothing else there) and is read from DRAM
// once, where v4's long-row forward reads it four times. The arithmetic of a
// row is forward_row's, so the bits are v4's forward's.
template <typename T, int VEC>
__device__ __forceinline__ void layernorm_forward_grouped_long(
    const T* __restrict__ x, const T* __restrict__ gamma,
    const T* __restrict__ beta, T* __restrict__ y,
    float* __restrict__ mean_hi_out, float* __restrict__ mean_lo_out,
    float* __restrict__ rstd_out, int rows, int D, float eps,
    int rows_per_group, int group_threads)
{
    constexpr int E = LN_LONG_ELEMS_PER_THREAD, VPT = E / VEC;
    constexpr int S = LN_FWD_ROWS_IN_FLIGHT;
    const int G = group_threads, P = blockDim.x / G;
    const int p = threadIdx.x / G, t = threadIdx.x % G;
    const long long group = (long long)blockIdx.x * P + p;
    const long long first = group * rows_per_group;
    const long long last = min(first + rows_per_group, (long long)rows);
    const int nvec = D / VEC;
    LN_DYNAMIC_SHARED(uint4, staged);
    auto prefetch = [&](long long row, int buffer) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec)
                copy_async_16(prefetch_slot<1, VPT>(staged, buffer, 0, i),
                              x + row * D + v * VEC);
        }
    };
    strip_rows<S>(first, last, rows_per_group, P, prefetch,
                  [&](int buffer, long long row, bool active) {
        forward_row<T, VEC, true, E>(
            gamma, beta, y, mean_hi_out, mean_lo_out, rstd_out, row, D, eps,
            t, G, active,
            [&](int i, int, float* xv) {
                Vec<T, VEC>::load(reinterpret_cast<const T*>(
                                      prefetch_slot<1, VPT>(staged, buffer, 0,
                                                            i)),
                                  xv);
            },
            [&](float v) { return group_sum(v, G); });
    });
}

// One per line of LN_GROUPED_LONG_FWD_VARIANTS, named ln_fwd_grouped_<suffix>:
// LN_FWD_ROWS_IN_FLIGHT * 16 * (E / VEC) bytes of dynamic shared memory a
// thread (lnorm.gpu.kernels.LaunchPlan.forward_shared_bytes).
#define LN_FORWARD_GROUPED_LONG_KERNEL(SUFFIX, T, VEC, MAX_THREADS)          \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)             \
    ln_fwd_grouped_##SUFFIX(const T* __restrict__ x,                         \
                            const T* __restrict__ gamma,                     \
                            const T* __restrict__ beta, T* __restrict__ y,   \
                            float* __restrict__ mean_hi,                     \
                            float* __restrict__ mean_lo,                     \
                            float* __restrict__ rstd, int rows, int D,       \
                            float eps, int rows_per_group,                   \
                            int group_threads) {                             \
        layernorm_forward_grouped_long<T, VEC>(                              \
            x, gamma, beta, y, mean_hi, mean_lo, rstd, rows, D, eps,         \
            rows_per_group, group_threads);                                  \
    }

LN_GROUPED_LONG_FWD_VARIANTS(LN_FORWARD_GROUPED_LONG_KERNEL)
