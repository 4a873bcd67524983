// Fused layer-norm backward. With g = gamma * dy and a bar for the row mean,
//
//     dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//     dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy.
//
// Kernel 1 (ln_bwd_*): each row group (a warp or a block) takes a strip of
// consecutive rows and holds gamma in registers for all of them. Per row it
// reads x, dy, the two halves of the mean and rstd once, recomputes
// xhat = ((x - mean_hi) - mean_lo) * rstd in registers, as the forward
// centred, makes the two row reductions, and writes dx once. Across its strip it adds dy * xhat and dy into per-thread column
// partial sums, written at the end as one row of a (row_groups, D) buffer.
// Kernel 2 (ln_bwd_reduce_params) sums that buffer over the row groups in a
// fixed order. No atomics: every sum has one order, so every run gives the
// same bits.
//
// The ladder's v3 (ln_bwd_atomic_*) is the same kernel 1 with ATOMIC set:
// each group adds its column sums straight into dgamma and dbeta with
// atomicAdd, and there is no kernel 2. One launch, no partial buffers, but
// the groups add in the order they finish, which changes from run to run,
// and so do the last bits of dgamma and dbeta (dx is unchanged).
#include "layernorm_common.cu"

template <typename T, int VEC, bool PER_BLOCK, bool ATOMIC = false>
__device__ __forceinline__ void layernorm_backward(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ gamma, const float* __restrict__ mean_hi,
    const float* __restrict__ mean_lo, const float* __restrict__ rstd,
    T* __restrict__ dx,
    float* __restrict__ dgamma_part, float* __restrict__ dbeta_part,
    int rows, int D, int rows_per_group, int row_groups)
{
    constexpr int E = LN_ELEMS_PER_THREAD;
    constexpr int VPT = E / VEC;
    const long long group = group_index<PER_BLOCK>();
    if (group >= row_groups) return;  // uniform over the group
    const int t = rank_in_group<PER_BLOCK>(), G = group_size<PER_BLOCK>();
    const int nvec = D / VEC;

    // This thread's columns are the same in every row of the strip, so their
    // dgamma/dbeta partial sums stay in registers for the whole strip.
    float dgamma_acc[E], dbeta_acc[E];
#pragma unroll
    for (int k = 0; k < E; ++k) dgamma_acc[k] = dbeta_acc[k] = 0.0f;

    // gamma is the same for every row of the strip: read it once, keep it in
    // registers.
    float gam[E];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (v < nvec) Vec<T, VEC>::load(gamma + v * VEC, &gam[i * VEC]);
    }

    const long long first = group * rows_per_group;
    const long long last = min(first + rows_per_group, (long long)rows);
    for (long long row = first; row < last; ++row) {
        const float mu_hi = mean_hi[row], mu_lo = mean_lo[row];
        const float rs = rstd[row];
        const long long offset = row * D;

        // Step 1: read x, dy, gamma once; xhat and g into registers; this
        // thread's share of sum(g) and sum(g * xhat); the column partials.
        float xhat[E], g[E];
        float2 part = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec) {
                float xv[VEC], dyv[VEC];
                Vec<T, VEC>::load(x + offset + v * VEC, xv);
                Vec<T, VEC>::load(dy + offset + v * VEC, dyv);
#pragma unroll
                for (int c = 0; c < VEC; ++c) {
                    const int k = i * VEC + c;
                    xhat[k] = ((xv[c] - mu_hi) - mu_lo) * rs;
                    g[k] = gam[k] * dyv[c];
                    part.x += g[k];
                    part.y += g[k] * xhat[k];
                    dgamma_acc[k] += dyv[c] * xhat[k];
                    dbeta_acc[k] += dyv[c];
                }
            }
        }

        // Step 2: both row reductions in one pass of shuffles (and, for a
        // block, one round through shared memory).
        part = row_sum<PER_BLOCK>(part);
        const float mean_g = part.x / (float)D;
        const float mean_gxhat = part.y / (float)D;

        // Step 3: dx from registers, written once.
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec) {
                float out[VEC];
#pragma unroll
                for (int c = 0; c < VEC; ++c) {
                    const int k = i * VEC + c;
                    out[c] = ((g[k] - mean_g) - xhat[k] * mean_gxhat) * rs;
                }
                Vec<T, VEC>::store(dx + offset + v * VEC, out);
            }
        }
    }

    if constexpr (ATOMIC) {  // v3: dgamma_part, dbeta_part are dgamma, dbeta
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec) {
#pragma unroll
                for (int c = 0; c < VEC; ++c) {
                    atomicAdd(dgamma_part + v * VEC + c, dgamma_acc[i * VEC + c]);
                    atomicAdd(dbeta_part + v * VEC + c, dbeta_acc[i * VEC + c]);
                }
            }
        }
        return;
    }
    // Step 4: the strip's column sums, one row of the (row_groups, D)
    // buffers. Every group writes its row, an empty strip included (zeros).
    float* dgamma_row = dgamma_part + group * D;
    float* dbeta_row = dbeta_part + group * D;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (v < nvec) {
            const int k = i * VEC;
            Vec<float, VEC>::store(dgamma_row + v * VEC, dgamma_acc + k);
            Vec<float, VEC>::store(dbeta_row + v * VEC, dbeta_acc + k);
        }
    }
}

// One kernel per variant (LN_VARIANTS), named ln_bwd_<suffix>.
#define LN_BACKWARD_KERNEL(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS)           \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)             \
    ln_bwd_##SUFFIX(const T* __restrict__ dy, const T* __restrict__ x,       \
                    const T* __restrict__ gamma,                             \
                    const float* __restrict__ mean_hi,                       \
                    const float* __restrict__ mean_lo,                       \
                    const float* __restrict__ rstd, T* __restrict__ dx,      \
                    float* __restrict__ dgamma_part,                         \
                    float* __restrict__ dbeta_part,                          \
                    int rows, int D, int rows_per_group, int row_groups) {   \
        layernorm_backward<T, VEC, PER_BLOCK>(                               \
            dy, x, gamma, mean_hi, mean_lo, rstd, dx, dgamma_part,           \
            dbeta_part,                                                      \
            rows, D, rows_per_group, row_groups);                            \
    }

LN_VARIANTS(LN_BACKWARD_KERNEL)

// v3: one per variant, named ln_bwd_atomic_<suffix>; dgamma and dbeta, shape
// (D,), must hold zeros before the launch.
#define LN_BACKWARD_ATOMIC_KERNEL(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS)    \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)             \
    ln_bwd_atomic_##SUFFIX(const T* __restrict__ dy,                         \
                           const T* __restrict__ x,                          \
                           const T* __restrict__ gamma,                      \
                           const float* __restrict__ mean_hi,                \
                           const float* __restrict__ mean_lo,                \
                           const float* __restrict__ rstd,                   \
                           T* __restrict__ dx, float* __restrict__ dgamma,   \
                           float* __restrict__ dbeta,                        \
                           int rows, int D, int rows_per_group,              \
                           int row_groups) {                                 \
        layernorm_backward<T, VEC, PER_BLOCK, true>(                         \
            dy, x, gamma, mean_hi, mean_lo, rstd, dx, dgamma, dbeta,         \
            rows, D, rows_per_group, row_groups);                            \
    }

LN_VARIANTS(LN_BACKWARD_ATOMIC_KERNEL)

// Second kernel: dgamma[j] = sum over p of dgamma_part[p, j] (dbeta alike).
// A block is 32 columns x LN_REDUCE_SLICES threads: thread (j, s) sums rows
// p = s, s + SLICES, ... in order (reads coalesced along j); then the slices
// are added in order s = 0, 1, ..., through shared memory.
extern "C" __global__ void __launch_bounds__(32 * LN_REDUCE_SLICES, 1)
ln_bwd_reduce_params(const float* __restrict__ dgamma_part,
                     const float* __restrict__ dbeta_part,
                     int row_groups, int D,
                     float* __restrict__ dgamma, float* __restrict__ dbeta)
{
    __shared__ float slice_dgamma[LN_REDUCE_SLICES][32];
    __shared__ float slice_dbeta[LN_REDUCE_SLICES][32];
    const int col = blockIdx.x * 32 + threadIdx.x;
    float a = 0.0f, b = 0.0f;
    if (col < D) {
        for (int p = threadIdx.y; p < row_groups; p += LN_REDUCE_SLICES) {
            a += dgamma_part[(long long)p * D + col];
            b += dbeta_part[(long long)p * D + col];
        }
    }
    slice_dgamma[threadIdx.y][threadIdx.x] = a;
    slice_dbeta[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < D) {
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int s = 0; s < LN_REDUCE_SLICES; ++s) {
            sa += slice_dgamma[s][threadIdx.x];
            sb += slice_dbeta[s][threadIdx.x];
        }
        dgamma[col] = sa;
        dbeta[col] = sb;
    }
}
