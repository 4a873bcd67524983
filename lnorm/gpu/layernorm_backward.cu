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
// Rows of 16-byte vectors are prefetched: the next row's x and dy are copied
// into shared memory (cp.async) while the group works on this one.
// Rows longer than registers hold with x and dy (up to
// LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS, ln_bwd_grouped_long_*) are
// read from that copy twice (backward_row's TWICE).
//
// The row step is v4's arithmetic, written once below for v5 alone: v4's
// kernel keeps its own code, whose compiled form the H100 timed.

// One row of the backward for one thread, which holds E elements of the
// row: take x and dy (`load_row(i, at, xv, dyv)` gives the thread's i-th
// vector, elements at..at+VEC-1 of the arrays), recompute xhat, make both row
// reductions with `row_sum_of`, write dx once, and add this row's dy * xhat
// and dy into the thread's column sums. A row that is not `active` (v5 pads
// a block's strips to one length) reads and writes nothing and adds zeros to
// the row sums, which every thread of the group still makes. dx streams
// (VecStream: written once).
//
// xhat and g wait in registers between the row sums and dx, E of each. For
// rows longer than that leaves registers for (TWICE, E =
// LN_LONG_ELEMS_PER_THREAD), the row waits in shared memory instead, where
// v5's prefetch put it: step 3 takes it again and makes xhat and g again, by
// the same operations, to the same bits; registers then hold only gamma and
// the column sums. A block of a v5 cluster holds a slice of the row: `cols`
// elements (default: all D), with dx starting at the slice.
template <typename T, int VEC, int E, bool TWICE, typename LoadRow,
          typename RowSum>
__device__ __forceinline__ void backward_row(
    const float* __restrict__ mean_hi, const float* __restrict__ mean_lo,
    const float* __restrict__ rstd, T* __restrict__ dx, long long row, int D,
    int t, int G, bool active, const float (&gam)[E], float (&dgamma_acc)[E],
    float (&dbeta_acc)[E], LoadRow load_row, RowSum row_sum_of,
    int cols = -1)
{
    constexpr int VPT = E / VEC;
    // xhat and g kept: one vector, or all
    constexpr int KEPT = TWICE ? VEC : E;
    const int ncols = cols < 0 ? D : cols;
    const int nvec = row_vectors<T, VEC>(ncols);  // a tail counts as one
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
            const int n = vector_elements<T, VEC>(v, ncols);
            float xv[VEC], dyv[VEC];
            load_row(i, offset + v * VEC, xv, dyv, n);
            terms(i, xv, dyv);
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                // past a tail, x, dy and gamma are zeros: g is +0 and adds
                // nothing, and the columns past D are never written
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
            const int n = vector_elements<T, VEC>(v, ncols);
            if constexpr (TWICE) {
                float xv[VEC], dyv[VEC];
                load_row(i, offset + v * VEC, xv, dyv, n);
                terms(i, xv, dyv);
            }
            float out[VEC];
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                const int s = TWICE ? c : i * VEC + c;
                out[c] = ((g[s] - mean_g) - xhat[s] * mean_gxhat) * rs;
            }
            vec_store<T, VEC, true>(dx + offset + v * VEC, out, n);
        }
    }
}

// gamma is the same for every row of a strip: read it once, keep it in
// registers; and zero the column sums. E elements a thread.
template <typename T, int VEC, int E>
__device__ __forceinline__ void start_strip(
    const T* __restrict__ gamma, int D, int t, int G, float (&gam)[E],
    float (&dgamma_acc)[E], float (&dbeta_acc)[E])
{
    constexpr int VPT = E / VEC;
    const int nvec = row_vectors<T, VEC>(D);
#pragma unroll
    for (int k = 0; k < E; ++k) dgamma_acc[k] = dbeta_acc[k] = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (v < nvec)
            vec_load_aligned<T, VEC>(gamma + v * VEC, &gam[i * VEC],
                                     vector_elements<T, VEC>(v, D));
    }
}

// n floats of a thread's column sums (n = VEC but for a tail) into a row of
// the partial buffers; for rows of any D, that row (D floats past the last)
// is aligned to 4 bytes only, and moves in pieces of 4 floats as VecAny
// moves a row.
template <typename T, int VEC>
__device__ __forceinline__ void store_floats(float* p, const float* in,
                                             int n) {
    if constexpr (AnyAlign<T>::value) {
#pragma unroll
        for (int h = 0; h < VEC; h += 4)
            VecAny<float_any, 4, false>::store(
                reinterpret_cast<float_any*>(p + h), in + h,
                max(0, min(4, n - h)));
    } else {
        Vec<float, VEC>::store(p, in);
    }
}

// A thread's column sums, as one row of the (partial rows, D) buffers.
template <typename T, int VEC, int E>
__device__ __forceinline__ void store_columns(
    float* __restrict__ dgamma_row, float* __restrict__ dbeta_row, int D,
    int t, int G, const float (&dgamma_acc)[E], const float (&dbeta_acc)[E])
{
    constexpr int VPT = E / VEC;
    const int nvec = row_vectors<T, VEC>(D);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = t + i * G;
        if (v < nvec) {
            const int k = i * VEC, n = vector_elements<T, VEC>(v, D);
            store_floats<T, VEC>(dgamma_row + v * VEC, dgamma_acc + k, n);
            store_floats<T, VEC>(dbeta_row + v * VEC, dbeta_acc + k, n);
        }
    }
}

// A row group's strip, for one thread: gamma into registers, then every row
// (backward_row), adding into the thread's column sums `dgamma_acc` and
// `dbeta_acc`. The group is `group`, this thread `t` of its G; it holds
// the columns col0 .. col0 + cols - 1 (all D, or a slice of a cluster's
// row). With CL > 1 (v5's rows past LN_LONG_ELEMS_PER_THREAD *
// LN_MAX_ROW_THREADS) the row sums are cluster_sum's.
template <typename T, int VEC, bool PER_BLOCK, int E, int CL>
__device__ __forceinline__ void backward_strip(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ gamma, const float* __restrict__ mean_hi,
    const float* __restrict__ mean_lo, const float* __restrict__ rstd,
    T* __restrict__ dx, int rows, int D, int rows_per_group, int G, int P,
    long long group, int t, int col0, int cols, float (&dgamma_acc)[E],
    float (&dbeta_acc)[E])
{
    // Rows longer than registers hold with x and dy (E > LN_ELEMS_PER_THREAD)
    // have one group of LN_MAX_ROW_THREADS threads a block (P = 1).
    constexpr bool LONG = E > LN_ELEMS_PER_THREAD;
    float gam[E];
    start_strip<T, VEC, E>(gamma + col0, cols, t, G, gam, dgamma_acc,
                           dbeta_acc);

    const long long first = group * rows_per_group;
    const long long last = min(first + rows_per_group, (long long)rows);

    // Rows of 16-byte vectors are prefetched: while a thread works on row k,
    // its copies of the next rows' x and dy are in flight into shared memory,
    // so the latency of the loads is not waited out once per row. One buffer
    // per row in flight (S = LN_BWD_ROWS_IN_FLIGHT, one more in float16
    // clusters of a tail, part_rows_more; a row a warp holds is
    // short, so warps keep LN_BWD_WARP_ROWS_IN_FLIGHT_F32 or _F16 rows in
    // flight), used in turn: the copies into one never race the reads of
    // another (prefetch_slot). Rows of
    // scalars (D not a multiple of the vector) are read straight from global
    // memory.
    constexpr int VPT = E / VEC;
    constexpr bool STAGED = VEC * sizeof(T) == 16;
    constexpr int S = PER_BLOCK ? LN_BWD_ROWS_IN_FLIGHT +
                                      part_rows_more<T, CL>()
                      : sizeof(T) == 2 ? LN_BWD_WARP_ROWS_IN_FLIGHT_F16
                                       : LN_BWD_WARP_ROWS_IN_FLIGHT_F32;
    LN_DYNAMIC_SHARED(uint4, staged);
    const int nvec = row_vectors<T, VEC>(cols);
    float2* scratch =
        reinterpret_cast<float2*>(past_prefetch<T, S, 2, VPT>(staged));
    int parity = 0;
    auto row_sum_of = [&](float2 v) {
        if constexpr (CL > 1) return cluster_sum<CL>(v, scratch, parity);
        else if constexpr (PER_BLOCK) return group_sum(v, G);
        else return warp_sum(v);
    };
    auto slot = [&](int buffer, int tensor, int i) {
        return prefetch_slot_of<T, 2, VPT>(staged, buffer, tensor,
                                           i);  // x, dy
    };
    auto prefetch = [&](long long row, int buffer) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = t + i * G;
            if (v < nvec) {
                const int n = vector_elements<T, VEC>(v, cols);
                copy_vec<T, VEC>(slot(buffer, 0, i),
                                 x + row * D + col0 + v * VEC, n);
                copy_vec<T, VEC>(slot(buffer, 1, i),
                                 dy + row * D + col0 + v * VEC, n);
            }
        }
    };
    strip_rows<STAGED, S>(first, last, rows_per_group, P, prefetch,
                          [&](int buffer, long long row, bool active) {
        // A row of scalars read twice (LONG) is read the second time from
        // cache: no streaming hint on its loads.
        auto load_row = [&](int i, long long at, float* xv, float* dyv,
                            int n) {
            if constexpr (OddRows<T>::value) {  // the slots need the start
                vec_load_slot<T, VEC>(
                    reinterpret_cast<const T*>(slot(buffer, 0, i)), xv, n,
                    x + col0 + at);
                vec_load_slot<T, VEC>(
                    reinterpret_cast<const T*>(slot(buffer, 1, i)), dyv, n,
                    dy + col0 + at);
            } else if constexpr (STAGED) {
                vec_load_slot<T, VEC>(
                    reinterpret_cast<const T*>(slot(buffer, 0, i)), xv, n);
                vec_load_slot<T, VEC>(
                    reinterpret_cast<const T*>(slot(buffer, 1, i)), dyv, n);
            } else if constexpr (LONG) {
                vec_load<T, VEC>(x + col0 + at, xv, n);
                vec_load<T, VEC>(dy + col0 + at, dyv, n);
            } else {
                vec_load<T, VEC, true>(x + col0 + at, xv, n);
                vec_load<T, VEC, true>(dy + col0 + at, dyv, n);
            }
        };
        backward_row<T, VEC, E, LONG>(
            mean_hi, mean_lo, rstd, dx + col0, row, D, t, G, active, gam,
            dgamma_acc, dbeta_acc, load_row, row_sum_of, cols);
    });
}

template <typename T, int VEC, bool PER_BLOCK, int E = LN_ELEMS_PER_THREAD>
__device__ __forceinline__ void layernorm_backward_grouped(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ gamma, const float* __restrict__ mean_hi,
    const float* __restrict__ mean_lo, const float* __restrict__ rstd,
    T* __restrict__ dx,
    float* __restrict__ dgamma_part, float* __restrict__ dbeta_part,
    int rows, int D, int rows_per_group, int group_threads)
{
    constexpr bool LONG = E > LN_ELEMS_PER_THREAD;
    const int G = group_threads, P = blockDim.x / G;
    const int p = threadIdx.x / G, t = threadIdx.x % G;
    const long long group = (long long)blockIdx.x * P + p;
    float dgamma_acc[E], dbeta_acc[E];
    backward_strip<T, VEC, PER_BLOCK, E, 1>(
        dy, x, gamma, mean_hi, mean_lo, rstd, dx, rows, D, rows_per_group, G,
        P, group, t, 0, D, dgamma_acc, dbeta_acc);

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
    if (p == 0)
        store_columns<T, VEC, E>(dgamma_part + blockIdx.x * (long long)D,
                              dbeta_part + blockIdx.x * (long long)D, D, t,
                              G, dgamma_acc, dbeta_acc);
}

// v5 past LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS: a row group is a
// cluster of CL blocks of one group each, block r holding slice r of every
// row of the strip (and of gamma and the column sums), as in the forward.
// The cluster's partial row is written slice by slice, each by its block.
// A last cluster barrier before the block exits, as in the forward: a
// defence, which the exchange of the row sums does not need.
template <typename T, int VEC, int CL>
__device__ __forceinline__ void layernorm_backward_cluster(
    const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ gamma, const float* __restrict__ mean_hi,
    const float* __restrict__ mean_lo, const float* __restrict__ rstd,
    T* __restrict__ dx,
    float* __restrict__ dgamma_part, float* __restrict__ dbeta_part,
    int rows, int D, int rows_per_group, int group_threads)
{
    constexpr int E = LN_ELEMS_PER_THREAD;
    constexpr int SLICE = E * LN_MAX_ROW_THREADS;
    const int rank = (int)(blockIdx.x % CL), t = threadIdx.x;
    const long long group = blockIdx.x / CL;
    const int col0 = rank * SLICE, cols = max(0, min(SLICE, D - col0));
    float dgamma_acc[E], dbeta_acc[E];
    backward_strip<T, VEC, true, E, CL>(
        dy, x, gamma, mean_hi, mean_lo, rstd, dx, rows, D, rows_per_group,
        group_threads, 1, group, t, col0, cols, dgamma_acc, dbeta_acc);
    store_columns<T, VEC, E>(dgamma_part + group * D + col0,
                             dbeta_part + group * D + col0, cols, t,
                             group_threads, dgamma_acc, dbeta_acc);
    cluster_sync();
}

// v5: one per variant, named ln_bwd_grouped_<suffix>; blocks of P groups of
// group_threads threads; the partial buffers have one row per block. E row
// elements a thread. The variants of 16-byte vectors take
// S * 2 * 16 * (E / VEC) bytes of dynamic shared memory per thread, S =
// LN_BWD_ROWS_IN_FLIGHT (LN_BWD_WARP_ROWS_IN_FLIGHT_F32 or _F16 for rows a
// warp holds),
// (the prefetch buffers;
// lnorm.gpu.kernels.LaunchPlan.backward_shared_bytes), the others none.
// Every v5 backward kernel: these parameters, handed to CALL (a
// parenthesized device function); its attributes (launch bounds, cluster
// size) last.
#define LN_BACKWARD_GROUPED_AS(SUFFIX, T, CALL, ...)                         \
    extern "C" __global__ void __VA_ARGS__                                   \
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
        CALL(dy, x, gamma, mean_hi, mean_lo, rstd, dx, dgamma_part,          \
             dbeta_part, rows, D, rows_per_group, group_threads);            \
    }

#define LN_BACKWARD_GROUPED_KERNEL_E(SUFFIX, T, VEC, PER_BLOCK, MAX_THREADS, \
                                     E)                                      \
    LN_BACKWARD_GROUPED_AS(SUFFIX, T,                                        \
                           (layernorm_backward_grouped<T, VEC, PER_BLOCK,    \
                                                       E>),                  \
                           __launch_bounds__(MAX_THREADS, 1))

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

LN_LONG_VECTOR_VARIANTS(LN_BACKWARD_GROUPED_LONG_KERNEL)

// v5 for rows longer than LN_LONG_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS, up
// to LN_MAX_CLUSTER * LN_ELEMS_PER_THREAD * LN_MAX_ROW_THREADS: one name per
// cluster variant, ln_bwd_grouped_<suffix>, CL blocks a cluster (as the
// forward's); one partial row per cluster. sm_90 and later only.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define LN_BACKWARD_CLUSTER_KERNEL(SUFFIX, T, VEC, MAX_THREADS, CL)          \
    LN_BACKWARD_GROUPED_AS(SUFFIX, T,                                        \
                           (layernorm_backward_cluster<T, VEC, CL>),         \
                           __cluster_dims__(CL, 1, 1)                        \
                           __launch_bounds__(MAX_THREADS, 1))

LN_CLUSTER_VARIANTS(LN_BACKWARD_CLUSTER_KERNEL)
#endif

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

// v3 has none; v4's second kernel, as the H100 timed it.
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
