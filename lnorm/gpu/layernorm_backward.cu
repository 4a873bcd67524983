// Fused layer-norm backward. With g = gamma * dy and a bar for the row mean,
//
//     dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//     dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy.
//
// Kernel 1 (ln_bwd_*): each row group (a warp or a block) takes a strip of
// consecutive rows and holds gamma in registers for all of them. Per row it
// reads x, dy, the two halves of the mean and rstd once, recomputes
// xhat = ((x - mean_hi) - mean_lo) * rstd in registers, as the forward
// centred, makes the two row reductions, and writes dx once. Across its
// strip it adds dy * xhat and dy into per-thread column partial sums,
// written at the end as one row of a (row_groups, D) buffer.
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
                    atomicAdd(dgamma_part + v * VEC + c,
                              dgamma_acc[i * VEC + c]);
                    atomicAdd(dbeta_part + v * VEC + c,
                              dbeta_acc[i * VEC + c]);
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

// ---- v5: row groups that share a block, and one partial row per block ----
//
// A block of LN_MAX_ROW_THREADS threads (rows held by a block) or of
// LN_WARPS_PER_BLOCK warps (rows held by a warp) holds P = blockDim.x /
// group_threads row groups, each with its strip of rows as in v4. When the
// strips are done, the groups add their column sums in shared memory in the
// order p = 0, 1, ..., P - 1, and the block writes one partial row: P times
// fewer partial sums than v4 for as many groups at once. So that every thread
// of the block reaches the barriers of the row sums, the groups step through
// rows_per_group rows together; a row past a group's strip is inactive.
// The next rows' x and dy are copied into shared memory (cp.async, 16 bytes
// at a time) while the group works on this one. Rows longer than registers
// hold with x and dy (up to LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS,
// ln_bwd_grouped_long_*) are read from that copy twice (backward_row's
// TWICE).
//
// The row step is v4's arithmetic, written again below for v5, so that v4's
// kernel, the lesson, reads on its own.

// One row of the backward for one thread, which holds E elements of the
// row: take x and dy (`load_row(i, xv, dyv)` gives the thread's i-th
// vector), recompute xhat, make both row reductions with `row_sum_of`, write
// dx once, and add this row's dy * xhat and dy into the thread's column
// sums. A row that is not `active` (v5 pads a block's strips to one length)
// reads and writes nothing and adds zeros to the row sums, which every
// thread of the group still makes. dx streams (VecStream: written once).
//
// xhat and g wait in registers between the row sums and dx, E of each. For
// rows longer than that leaves registers for (TWICE, E =
// LN_LONG_ELEMS_PER_THREAD), the row waits in shared memory instead, where
// the prefetch put it: step 3 takes it again and makes xhat and g again, by
// the same operations, to the same bits; registers then hold only gamma and
// the column sums.
template <typename T, int VEC, int E, bool TWICE, typename LoadRow,
          typename RowSum>
__device__ __forceinline__ void backward_row(
    const float* __restrict__ mean_hi, const float* __restrict__ mean_lo,
    const float* __restrict__ rstd, T* __restrict__ dx, long long row, int D,
    int t, int G, bool active, const float (&gam)[E], float (&dgamma_acc)[E],
    float (&dbeta_acc)[E], LoadRow load_row, RowSum row_sum_of)
{
    constexpr int VPT = E / VEC;
    // xhat and g kept: one vector, or all
    constexpr int KEPT = TWICE ? VEC : E;
    const int nvec = D / VEC;
    const float mu_hi = mean_hi[row], mu_lo = mean_lo[row];
    const float rs = rstd[row];
    const long long offset = row * D;
    // xhat and g of element c of vector i, into slot s of the kept ones.
    float xhat[KEPT], g[KEPT];
    auto terms = [&](int i, const float* xv, const float* dyv) {
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
            const int s = TWICE ? c : i * VEC + c;
            xhat[s] = ((xv[c] - mu_hi) - mu_lo) * rs;
            g[s] = gam[i * VEC + c] * dyv[c];
        }
    };

    // Step 1: take x, dy; xhat and g; this thread's share of sum(g) and
    // sum(g * xhat); the column partials.
    float2 part = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (active && v < nvec) {
            float xv[VEC], dyv[VEC];
            load_row(i, xv, dyv);
            terms(i, xv, dyv);
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const int k = i * VEC + c, s = TWICE ? c : k;
                part.x += g[s];
                part.y += g[s] * xhat[s];
                dgamma_acc[k] += dyv[c] * xhat[s];
                dbeta_acc[k] += dyv[c];
            }
        }
    }

    // Step 2: both row reductions in one pass of shuffles (and, for a
    // block, one round through shared memory).
    part = row_sum_of(part);
    const float mean_g = part.x / (float)D;
    const float mean_gxhat = part.y / (float)D;

    // Step 3: dx, written once, from the kept xhat and g (TWICE: made again
    // from a second read of the row).
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (active && v < nvec) {
            if constexpr (TWICE) {
                float xv[VEC], dyv[VEC];
                load_row(i, xv, dyv);
                terms(i, xv, dyv);
            }
            float out[VEC];
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const int s = TWICE ? c : i * VEC + c;
                out[c] = ((g[s] - mean_g) - xhat[s] * mean_gxhat) * rs;
            }
            VecStream<T, VEC>::store(dx + offset + v * VEC, out);
        }
    }
}

// v5's backward for one block: gamma into registers and the column sums
// zeroed, then every row of the group's strip (backward_row), the next rows
// in flight; then the groups' column sums into group 0, which writes the
// block's row of the partial buffers. E row elements a thread.
template <typename T, int VEC, bool PER_BLOCK, int E = LN_ELEMS_PER_THREAD>
__device__ __forceinline__ void layernorm_backward_grouped(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ gamma, const float* __restrict__ mean_hi,
    const float* __restrict__ mean_lo, const float* __restrict__ rstd,
    T* __restrict__ dx,
    float* __restrict__ dgamma_part, float* __restrict__ dbeta_part,
    int rows, int D, int rows_per_group, int group_threads)
{
    // Rows longer than registers hold with x and dy (E > LN_ELEMS_PER_THREAD)
    // have one group of LN_MAX_ROW_THREADS threads a block (P = 1).
    constexpr bool LONG = E > LN_ELEMS_PER_THREAD;
    constexpr int VPT = E / VEC;
    // Rows in flight, one shared-memory buffer each, used in turn: the
    // copies into one never race the reads of another (prefetch_slot). A row
    // a warp holds is short, so warps keep more rows in flight.
    constexpr int S = PER_BLOCK ? LN_BWD_ROWS_IN_FLIGHT
                      : sizeof(T) == 2 ? LN_BWD_WARP_ROWS_IN_FLIGHT_F16
                                       : LN_BWD_WARP_ROWS_IN_FLIGHT_F32;
    const int G = group_threads, P = blockDim.x / G;
    const int p = threadIdx.x / G, t = threadIdx.x % G;
    const long long group = (long long)blockIdx.x * P + p;
    const int nvec = D / VEC;
    float dgamma_acc[E], dbeta_acc[E], gam[E];
#pragma unroll
    for (int k = 0; k < E; ++k) dgamma_acc[k] = dbeta_acc[k] = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (v < nvec) Vec<T, VEC>::load(gamma + v * VEC, &gam[i * VEC]);
    }
    const long long first = group * rows_per_group;
    const long long last = min(first + rows_per_group, (long long)rows);
    LN_DYNAMIC_SHARED(uint4, staged);
    auto slot = [&](int buffer, int tensor, int i) {  // x, dy
        return prefetch_slot<2, VPT>(staged, buffer, tensor, i);
    };
    auto prefetch = [&](long long row, int buffer) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec) {
                copy_async_16(slot(buffer, 0, i), x + row * D + v * VEC);
                copy_async_16(slot(buffer, 1, i), dy + row * D + v * VEC);
            }
        }
    };
    strip_rows<S>(first, last, rows_per_group, P, prefetch,
                  [&](int buffer, long long row, bool active) {
        auto load_row = [&](int i, float* xv, float* dyv) {
            Vec<T, VEC>::load(reinterpret_cast<const T*>(slot(buffer, 0, i)),
                              xv);
            Vec<T, VEC>::load(reinterpret_cast<const T*>(slot(buffer, 1, i)),
                              dyv);
        };
        backward_row<T, VEC, E, LONG>(
            mean_hi, mean_lo, rstd, dx, row, D, t, G, active, gam,
            dgamma_acc, dbeta_acc, load_row, [&](float2 v) {
                if constexpr (PER_BLOCK) return group_sum(v, G);
                else return warp_sum(v);
            });
    });

    // Step 4: group q hands its column sums to group 0, q = 1, ..., P - 1 in
    // order; then group 0 writes the block's row of the partial buffers.
    if constexpr (!LONG) {
        // One group's column sums on their way to group 0 (P > 1 only, so a
        // group has at most half the largest block of the variant).
        constexpr int MAX_GROUP =
            (PER_BLOCK ? LN_BLOCK_THREADS : LN_WARP_THREADS) / 2;
        __shared__ float columns[2][E][MAX_GROUP];
        for (int q = 1; q < P; ++q) {
            if (p == q) {
#pragma unroll
                for (int k = 0; k < E; ++k) {
                    columns[0][k][t] = dgamma_acc[k];
                    columns[1][k][t] = dbeta_acc[k];
                }
            }
            __syncthreads();
            if (p == 0) {
#pragma unroll
                for (int k = 0; k < E; ++k) {
                    dgamma_acc[k] += columns[0][k][t];
                    dbeta_acc[k] += columns[1][k][t];
                }
            }
            __syncthreads();
        }
    }
    if (p == 0) {
        float* dgamma_row = dgamma_part + blockIdx.x * (long long)D;
        float* dbeta_row = dbeta_part + blockIdx.x * (long long)D;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec) {
                Vec<float, VEC>::store(dgamma_row + v * VEC, dgamma_acc + i * VEC);
                Vec<float, VEC>::store(dbeta_row + v * VEC, dbeta_acc + i * VEC);
            }
        }
    }
}

// v5: one per variant, named ln_bwd_grouped_<suffix>; blocks of P groups of
// group_threads threads; the partial buffers have one row per block. They
// take S * 2 * 16 * (E / VEC) bytes of dynamic shared memory per thread
// (lnorm.gpu.kernels.LaunchPlan.backward_shared_bytes).
#define LN_BACKWARD_GROUPED_KERNEL_E(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS, \
                                     E)                                      \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1)             \
    ln_bwd_grouped_##SUFFIX(const T* __restrict__ dy,                        \
                            const T* __restrict__ x,                         \
                            const T* __restrict__ gamma,                     \
                            const float* __restrict__ mean_hi,               \
                            const float* __restrict__ mean_lo,               \
                            const float* __restrict__ rstd,                  \
                            T* __restrict__ dx,                              \
                            float* __restrict__ dgamma_part,                 \
                            float* __restrict__ dbeta_part,                  \
                            int rows, int D, int rows_per_group,             \
                            int group_threads) {                             \
        layernorm_backward_grouped<T, VEC, PER_BLOCK, E>(                    \
            dy, x, gamma, mean_hi, mean_lo, rstd, dx, dgamma_part,           \
            dbeta_part, rows, D, rows_per_group, group_threads);             \
    }
#define LN_BACKWARD_GROUPED_KERNEL(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS)   \
    LN_BACKWARD_GROUPED_KERNEL_E(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS,     \
                                 LN_ELEMS_PER_THREAD)

LN_GROUPED_VARIANTS(LN_BACKWARD_GROUPED_KERNEL)

// v5 for rows longer than registers hold with x and dy, up to
// LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS: ln_bwd_grouped_long_<suffix>,
// one group of LN_MAX_ROW_THREADS threads a block, launched as the others.
#define LN_BACKWARD_GROUPED_LONG_KERNEL(SUFFIX, T, VEC, MAX_THREADS)         \
    LN_BACKWARD_GROUPED_KERNEL_E(SUFFIX, T, VEC, true, MAX_THREADS,          \
                                 LN_LONG_ELEMS_PER_THREAD)

LN_GROUPED_LONG_VARIANTS(LN_BACKWARD_GROUPED_LONG_KERNEL)

// Second kernel: dgamma[j] = sum over p of dgamma_part[p, j] (dbeta alike).
// A block is 32 columns x SLICES threads: thread (j, s) sums rows
// p = s, s + SLICES, ... in order (reads coalesced along j); then the slices
// are added in order s = 0, 1, ..., through shared memory. BATCH > 1 loads
// BATCH of a thread's rows before adding them (in the same order), so that
// BATCH loads per thread are in flight instead of what the compiler's
// unrolling gives.
// The kernel declares the shared slices (so that their names, and v4's
// PTX, are the kernel's own).
template <int SLICES, int BATCH>
__device__ __forceinline__ void reduce_params(
    const float* __restrict__ dgamma_part,
    const float* __restrict__ dbeta_part, int row_groups, int D,
    float* __restrict__ dgamma,
    float* __restrict__ dbeta, float (&slice_dgamma)[SLICES][32],
    float (&slice_dbeta)[SLICES][32])
{
    const int col = blockIdx.x * 32 + threadIdx.x;
    float a = 0.0f, b = 0.0f;
    if (col < D) {
        if constexpr (BATCH == 1) {
            for (int p = threadIdx.y; p < row_groups; p += SLICES) {
                a += dgamma_part[(long long)p * D + col];
                b += dbeta_part[(long long)p * D + col];
            }
        } else {
            for (int p0 = threadIdx.y; p0 < row_groups; p0 += BATCH * SLICES) {
                float ga[BATCH], gb[BATCH];
#pragma unroll
                for (int j = 0; j < BATCH; ++j) {
                    const int p = p0 + j * SLICES;
                    if (p < row_groups) {
                        ga[j] = dgamma_part[(long long)p * D + col];
                        gb[j] = dbeta_part[(long long)p * D + col];
                    }
                }
#pragma unroll
                for (int j = 0; j < BATCH; ++j) {
                    if (p0 + j * SLICES < row_groups) {
                        a += ga[j];
                        b += gb[j];
                    }
                }
            }
        }
    }
    slice_dgamma[threadIdx.y][threadIdx.x] = a;
    slice_dbeta[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < D) {
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int s = 0; s < SLICES; ++s) {
            sa += slice_dgamma[s][threadIdx.x];
            sb += slice_dbeta[s][threadIdx.x];
        }
        dgamma[col] = sa;
        dbeta[col] = sb;
    }
}

// v4's second kernel (v3 has none).
extern "C" __global__ void __launch_bounds__(32 * LN_REDUCE_SLICES, 1)
ln_bwd_reduce_params(const float* __restrict__ dgamma_part,
                     const float* __restrict__ dbeta_part,
                     int row_groups, int D,
                     float* __restrict__ dgamma, float* __restrict__ dbeta)
{
    __shared__ float slice_dgamma[LN_REDUCE_SLICES][32];
    __shared__ float slice_dbeta[LN_REDUCE_SLICES][32];
    reduce_params<LN_REDUCE_SLICES, 1>(dgamma_part, dbeta_part, row_groups, D,
                                       dgamma, dbeta, slice_dgamma,
                                       slice_dbeta);
}

// v5's: four times the slices and a batch of loads per thread, so that
// enough bytes are in flight for the copy bandwidth (Little's law).
extern "C" __global__ void __launch_bounds__(32 * LN_REDUCE_SLICES_WIDE, 1)
ln_bwd_reduce_params_wide(const float* __restrict__ dgamma_part,
                          const float* __restrict__ dbeta_part,
                          int row_groups, int D,
                          float* __restrict__ dgamma,
                          float* __restrict__ dbeta)
{
    __shared__ float slice_dgamma[LN_REDUCE_SLICES_WIDE][32];
    __shared__ float slice_dbeta[LN_REDUCE_SLICES_WIDE][32];
    reduce_params<LN_REDUCE_SLICES_WIDE, LN_REDUCE_BATCH>(
        dgamma_part, dbeta_part, row_groups, D, dgamma, dbeta, slice_dgamma,
        slice_dbeta);
}
