// Fused layer norm for rows longer than a block holds in registers
// (D > LN_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS = 8192): GPT-3's 12288 and
// beyond. One block of LN_MAX_ROW_THREADS threads per row (forward) or per
// strip of rows (backward), as the register kernels' block variants, but the
// row is taken in CHUNKS of LN_ELEMS_PER_THREAD elements per thread and read
// again from memory for every pass instead of being kept in registers.
//
// Thread t's vectors are t, t + G, t + 2G, ... (G threads), exactly as in
// the register kernels; chunk c is its vectors c * VPT .. c * VPT + VPT - 1.
// Every sum therefore adds the same numbers in the same order as a register
// kernel with that many vectors per thread would: lnorm.gpu.emulate, which
// reads the order from the plan, covers these kernels unchanged, and the
// arithmetic of each element is the register kernels' operation for
// operation.
//
// The price is bytes. The forward reads x four times (the sum, the
// correction of the mean, the variance, the output); a block's row is tens
// to hundreds of KB, so while the rows of the blocks in flight fit in L2,
// the re-reads are L2 traffic, not DRAM traffic. The backward takes a strip
// of LN_LONG_STRIP rows in two passes: first the two row sums of each row
// (their means wait in shared memory), then chunk by chunk the strip's rows
// again, writing dx, with gamma and the chunk's dgamma/dbeta column sums in
// registers as the register kernel holds them; at the end of each chunk its
// column sums go to the block's row of the (row_groups, D) buffers, written
// once. So x and dy are read twice: the strip is megabytes, too much for L2
// to keep between the passes, and lnorm.gpu.model counts it as DRAM traffic.
//
// The chunk loops run a number of times known only at run time; they are
// not unrolled (unroll 1), so each pass's loads appear once in the PTX,
// where tests/test_gpu.py counts them.
#include "layernorm_common.cu"

// Rows per strip of the long-row backward: its rows' means wait in shared
// memory between its two passes. (lnorm.gpu.kernels reads this number.)
#define LN_LONG_STRIP 16

// One pass over the row: f(v) for each of thread t's vectors v that lies in
// the row, chunk by chunk (the last chunk is partly empty). In order: a sum
// made in f adds the vectors in the order a register kernel holds them.
template <int VPT, typename F>
__device__ __forceinline__ void for_row(int chunks, int t, int G, int nvec,
                                        F f) {
    #pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
        #pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const long long v = t + (long long)(c * VPT + i) * G;
            if (v < nvec) f(v);
        }
    }
}

// One pass over a row of values: f(xv) for each of thread t's vectors, xv its
// VEC elements as floats.
template <typename T, int VEC, typename F>
__device__ __forceinline__ void over_row(const T* row, int chunks, int t,
                                         int G, int nvec, F f) {
    for_row<LN_ELEMS_PER_THREAD / VEC>(chunks, t, G, nvec, [&](long long v) {
        float xv[VEC];
        Vec<T, VEC>::load(row + v * VEC, xv);
        f(xv);
    });
}

template <typename T, int VEC>
__device__ __forceinline__ void layernorm_forward_long(
    const T* __restrict__ x, const T* __restrict__ gamma,
    const T* __restrict__ beta, T* __restrict__ y,
    float* __restrict__ mean_hi_out, float* __restrict__ mean_lo_out,
    float* __restrict__ rstd_out, int rows, int D, float eps)
{
    constexpr int VPT = LN_ELEMS_PER_THREAD / VEC;
    const long long row = blockIdx.x;
    if (row >= rows) return;  // uniform over the block
    const int t = threadIdx.x, G = blockDim.x;
    const int nvec = D / VEC;
    const int chunks = (nvec - 1) / (VPT * G) + 1;  // nvec >= 1; no overflow
    const T* xrow = x + row * D;
    T* yrow = y + row * D;

    // Pass 1: mean_hi, the rounded mean.
    float sum = 0.0f;
    over_row<T, VEC>(xrow, chunks, t, G, nvec, [&](const float* xv) {
        #pragma unroll
        for (int k = 0; k < VEC; ++k) sum += xv[k];
    });
    const float mean_hi = block_sum(sum) / (float)D;

    // Pass 2: its correction, mean_lo = mean(x - mean_hi).
    float lo = 0.0f;
    over_row<T, VEC>(xrow, chunks, t, G, nvec, [&](const float* xv) {
        #pragma unroll
        for (int k = 0; k < VEC; ++k) lo += xv[k] - mean_hi;
    });
    const float mean_lo = block_sum(lo) / (float)D;

    // Pass 3: the variance of the centred row d = (x - mean_hi) - mean_lo.
    float m2 = 0.0f;
    over_row<T, VEC>(xrow, chunks, t, G, nvec, [&](const float* xv) {
        #pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float d = (xv[k] - mean_hi) - mean_lo;
            m2 += d * d;
        }
    });
    const float var = block_sum(m2) / (float)D;
    const float rstd = 1.0f / sqrtf(var + eps);

    // Pass 4: y, written once.
    for_row<VPT>(chunks, t, G, nvec, [&](long long v) {
        float xv[VEC], g[VEC], b[VEC];
        Vec<T, VEC>::load(xrow + v * VEC, xv);
        Vec<T, VEC>::load(gamma + v * VEC, g);
        Vec<T, VEC>::load(beta + v * VEC, b);
        #pragma unroll
        for (int k = 0; k < VEC; ++k)
            xv[k] = ((xv[k] - mean_hi) - mean_lo) * rstd * g[k] + b[k];
        Vec<T, VEC>::store(yrow + v * VEC, xv);
    });
    if (t == 0) {
        mean_hi_out[row] = mean_hi;
        mean_lo_out[row] = mean_lo;
        rstd_out[row] = rstd;
    }
}

template <typename T, int VEC>
__device__ __forceinline__ void layernorm_backward_long(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ gamma, const float* __restrict__ mean_hi,
    const float* __restrict__ mean_lo, const float* __restrict__ rstd,
    T* __restrict__ dx,
    float* __restrict__ dgamma_part, float* __restrict__ dbeta_part,
    int rows, int D, int rows_per_group, int row_groups)
{
    constexpr int E = LN_ELEMS_PER_THREAD, VPT = E / VEC;
    __shared__ float2 means[LN_LONG_STRIP];  // mean(g), mean(g * xhat) per row
    const long long group = blockIdx.x;
    if (group >= row_groups) return;  // uniform over the block
    const int t = threadIdx.x, G = blockDim.x;
    const int nvec = D / VEC;
    const int chunks = (nvec - 1) / (VPT * G) + 1;  // nvec >= 1; no overflow
    const long long first = group * rows_per_group;
    // rows_per_group <= LN_LONG_STRIP (the plan makes it so)
    const int strip =
        (int)(min(first + rows_per_group, (long long)rows) - first);

    // Pass 1, row by row: sum(g) and sum(g * xhat), as the register kernel's
    // step 1; the two means wait in shared memory for pass 2.
    for (int r = 0; r < strip; ++r) {
        const long long row = first + r;
        const float mu_hi = mean_hi[row], mu_lo = mean_lo[row];
        const float rs = rstd[row];
        const T* xrow = x + row * D;
        const T* dyrow = dy + row * D;
        float2 part = make_float2(0.0f, 0.0f);
        for_row<VPT>(chunks, t, G, nvec, [&](long long v) {
            float xv[VEC], dyv[VEC], gam[VEC];
            Vec<T, VEC>::load(xrow + v * VEC, xv);
            Vec<T, VEC>::load(dyrow + v * VEC, dyv);
            Vec<T, VEC>::load(gamma + v * VEC, gam);
            #pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float xhat = ((xv[k] - mu_hi) - mu_lo) * rs;
                const float g = gam[k] * dyv[k];
                part.x += g;
                part.y += g * xhat;
            }
        });
        part = block_sum(part);
        if (t == 0)
            means[r] = make_float2(part.x / (float)D, part.y / (float)D);
    }
    __syncthreads();  // every row's means, seen by every thread

    // Pass 2, chunk by chunk: the strip's rows read again, dx written once;
    // gamma and the chunk's column sums in registers, as the register
    // kernel holds them for its whole row.
    #pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
        float gam[E], dgamma_acc[E], dbeta_acc[E];
        #pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const long long v = t + (long long)(c * VPT + i) * G;
            #pragma unroll
            for (int k = 0; k < VEC; ++k)
                dgamma_acc[i * VEC + k] = dbeta_acc[i * VEC + k] = 0.0f;
            if (v < nvec) Vec<T, VEC>::load(gamma + v * VEC, &gam[i * VEC]);
        }
        int r = 0;  // a strip has at least one row
        do {
            const long long row = first + r;
            const float mu_hi = mean_hi[row], mu_lo = mean_lo[row];
            const float rs = rstd[row];
            const float2 m = means[r];
            #pragma unroll
            for (int i = 0; i < VPT; ++i) {
                const long long v = t + (long long)(c * VPT + i) * G;
                if (v >= nvec) continue;
                float xv[VEC], dyv[VEC];
                Vec<T, VEC>::load(x + row * D + v * VEC, xv);
                Vec<T, VEC>::load(dy + row * D + v * VEC, dyv);
                #pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const int e = i * VEC + k;
                    const float xhat = ((xv[k] - mu_hi) - mu_lo) * rs;
                    const float g = gam[e] * dyv[k];
                    xv[k] = ((g - m.x) - xhat * m.y) * rs;
                    dgamma_acc[e] += dyv[k] * xhat;
                    dbeta_acc[e] += dyv[k];
                }
                Vec<T, VEC>::store(dx + row * D + v * VEC, xv);
            }
        } while (++r < strip);
        // The chunk's column sums over the strip: its part of the block's row
        // of the (row_groups, D) buffers, written once.
        #pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const long long v = t + (long long)(c * VPT + i) * G;
            if (v < nvec) {
                Vec<float, VEC>::store(dgamma_part + group * D + v * VEC,
                                       &dgamma_acc[i * VEC]);
                Vec<float, VEC>::store(dbeta_part + group * D + v * VEC,
                                       &dbeta_acc[i * VEC]);
            }
        }
    }
}

// ln_fwd_long_<suffix> and ln_bwd_long_<suffix>: the arguments of the
// register kernels, so one launch path serves both.
#define LN_FORWARD_LONG_KERNEL(SUFFIX, T, VEC, MAX_THREADS)                  \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)             \
    ln_fwd_##SUFFIX(const T* __restrict__ x, const T* __restrict__ gamma,    \
                    const T* __restrict__ beta, T* __restrict__ y,           \
                    float* __restrict__ mean_hi, float* __restrict__ mean_lo,\
                    float* __restrict__ rstd, int rows, int D, float eps) {  \
        layernorm_forward_long<T, VEC>(x, gamma, beta, y, mean_hi, mean_lo,  \
                                       rstd, rows, D, eps);                  \
    }

#define LN_BACKWARD_LONG_KERNEL(SUFFIX, T, VEC, MAX_THREADS)                 \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)             \
    ln_bwd_##SUFFIX(const T* __restrict__ dy, const T* __restrict__ x,       \
                    const T* __restrict__ gamma,                             \
                    const float* __restrict__ mean_hi,                       \
                    const float* __restrict__ mean_lo,                       \
                    const float* __restrict__ rstd, T* __restrict__ dx,      \
                    float* __restrict__ dgamma_part,                         \
                    float* __restrict__ dbeta_part,                          \
                    int rows, int D, int rows_per_group, int row_groups) {   \
        layernorm_backward_long<T, VEC>(dy, x, gamma, mean_hi, mean_lo,      \
                                        rstd, dx, dgamma_part, dbeta_part,   \
                                        rows, D, rows_per_group,             \
                                        row_groups);                         \
    }

LN_LONG_VARIANTS(LN_FORWARD_LONG_KERNEL)
LN_LONG_VARIANTS(LN_BACKWARD_LONG_KERNEL)
