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

template <typename T, int VEC, bool PER_BLOCK>
__device__ __forceinline__ void layernorm_forward(
    const T* __restrict__ x, const T* __restrict__ gamma,
    const T* __restrict__ beta, T* __restrict__ y,
    float* __restrict__ mean_hi_out, float* __restrict__ mean_lo_out,
    float* __restrict__ rstd_out, int rows, int D, float eps)
{
    constexpr int VPT = LN_ELEMS_PER_THREAD / VEC;  // vectors per thread
    const long long row = group_index<PER_BLOCK>();
    if (row >= rows) return;  // uniform over the group: no shuffle is split
    const int t = rank_in_group<PER_BLOCK>(), G = group_size<PER_BLOCK>();
    const int nvec = D / VEC;
    const T* xrow = x + row * D;
    T* yrow = y + row * D;

    // Step 1: the row into registers, one load per vector of VEC elements.
    // Thread t holds vectors t, t + G, t + 2G, ...: neighbouring threads read
    // neighbouring addresses (coalesced). Its partial sum, then the row's.
    float xv[LN_ELEMS_PER_THREAD];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (v < nvec) {
            Vec<T, VEC>::load(xrow + v * VEC, &xv[i * VEC]);
#pragma unroll
            for (int c = 0; c < VEC; ++c) sum += xv[i * VEC + c];
        }
    }
    const float mean_hi = row_sum<PER_BLOCK>(sum) / (float)D;

    // Step 2: the correction, mean_lo = mean(x - mean_hi), and the centred
    // row d = (x - mean_hi) - mean_lo, kept in registers in place of x.
    float lo = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        if (t + i * G < nvec) {
#pragma unroll
            for (int c = 0; c < VEC; ++c) lo += xv[i * VEC + c] - mean_hi;
        }
    }
    const float mean_lo = row_sum<PER_BLOCK>(lo) / (float)D;

    // Step 3: the variance as the mean of squared deviations (two-pass),
    // over registers, not over memory.
    float m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        if (t + i * G < nvec) {
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const int k = i * VEC + c;
                xv[k] = (xv[k] - mean_hi) - mean_lo;
                m2 += xv[k] * xv[k];
            }
        }
    }
    // Correctly rounded divide and sqrt (NVRTC's defaults), not rsqrtf.
    const float var = row_sum<PER_BLOCK>(m2) / (float)D;
    const float rstd = 1.0f / sqrtf(var + eps);

    // Step 4: normalize, scale, shift; y written once, in the storage type.
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (v < nvec) {
            float g[VEC], b[VEC], out[VEC];
            Vec<T, VEC>::load(gamma + v * VEC, g);
            Vec<T, VEC>::load(beta + v * VEC, b);
#pragma unroll
            for (int c = 0; c < VEC; ++c)
                out[c] = xv[i * VEC + c] * rstd * g[c] + b[c];
            Vec<T, VEC>::store(yrow + v * VEC, out);
        }
    }
    if (t == 0) {
        mean_hi_out[row] = mean_hi;
        mean_lo_out[row] = mean_lo;
        rstd_out[row] = rstd;
    }
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
