// cuda_host.h: just enough of CUDA to compile the kernel sources with g++ and
// run them on the CPU (tests/cuda_host). Include it before a .cu file.
//
// Execution model: a launch runs its blocks one at a time (the blocks of a
// cluster at the same time, below), each with one OS thread per CUDA thread
// (the same team of threads serves every block). So __shared__ can be plain
// static storage; __syncthreads() is a barrier over
// the block's threads and __shfl_xor_sync() an exchange over the 32 lanes of
// a warp. Both check what the hardware assumes and abort (message on stderr)
// when it does not hold: a shuffle by a partial warp, or a barrier that a
// thread of its group never reaches (it exited first, or a time-out of
// LNORM_HOST_TIMEOUT_S seconds, default 20, passed).
//
// atomicAdd on float is a relaxed std::atomic_ref read-modify-write: the
// threads of a block race for it as on the GPU, blocks add in launch order.
//
// Dynamic shared memory is one buffer per launch (per block of a cluster), of
// the launch's size, that the kernel gets from cuda_host::dynamic_shared()
// (the kernel files' macro LN_DYNAMIC_SHARED does that on the host). Like a
// GPU's, it holds no zeros to rely on: every byte is 0xff (a float NaN) when
// a block (a cluster) starts. Asynchronous copies (cp.async, through
// copy_async, copy_commit and copy_wait) land as late as a GPU may land
// them: when a wait lets their group go.
//
// Thread block clusters (__cluster_dims__(CL, 1, 1), one dimension): the CL
// blocks of a cluster run at the same time, CL teams of threads, each block
// with its own dynamic shared memory; cluster_sync() is a barrier over all
// their threads, and in_block(p, r) the address of p (in this block's
// dynamic shared memory) in block r's. Kernels with clusters must keep all
// their shared memory dynamic: __shared__ static storage would be one for
// the cluster's blocks.
//
// Not emulated: other atomics, textures, other shuffles than the xor one,
// warp-synchronous code without a shuffle.
#ifndef LNORM_CUDA_HOST_H
#define LNORM_CUDA_HOST_H

#include <linux/futex.h>
#include <math.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <climits>
#include <ctime>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// ---- keywords ---------------------------------------------------------------
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static  // blocks run one at a time (but for clusters)
// __restrict__ is a g++ keyword already.

// ---- built-in vector types ----------------------------------------------------
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;

// ---- math: IEEE float32, round to nearest (compile with -ffp-contract=off) -----
template <class A, class B> inline auto min(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return (C)fmin((C)a, (C)b);
    else return (C)b < (C)a ? (C)b : (C)a;
}
template <class A, class B> inline auto max(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return (C)fmax((C)a, (C)b);
    else return (C)a < (C)b ? (C)b : (C)a;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
// The GPU's rsqrtf is approximate (not correctly rounded): results differ.
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
// The cache hints of streaming loads and stores mean nothing here.
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value, std::memory_order_relaxed);
}

// ---- the runtime: blocks, warps, barriers ------------------------------------
namespace cuda_host {

[[noreturn]] inline void fail(const char* fmt, ...) {
    std::fprintf(stderr, "cuda_host: ");
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, " (block %u,%u thread %u,%u)\n", blockIdx.x, blockIdx.y,
                 threadIdx.x, threadIdx.y);
    std::fflush(stderr);
    std::abort();
}

inline double timeout_s() {
    static const double t = [] {
        const char* e = std::getenv("LNORM_HOST_TIMEOUT_S");
        return e ? std::atof(e) : 20.0;
    }();
    return t;
}

inline void futex_wait(std::atomic<unsigned>* word, unsigned expected, double seconds) {
    timespec ts{(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    syscall(SYS_futex, reinterpret_cast<unsigned*>(word), FUTEX_WAIT_PRIVATE, expected, &ts,
            nullptr, 0);
}
inline void futex_wake(std::atomic<unsigned>* word) {
    syscall(SYS_futex, reinterpret_cast<unsigned*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
}
static_assert(sizeof(std::atomic<unsigned>) == 4 && std::atomic<unsigned>::is_always_lock_free);

struct NoOp { void operator()() const {} };

// Threads that synchronise together: a warp or a whole block. A barrier of
// atomics (release/acquire: what one thread wrote before it arrived is seen by
// all after it, and ThreadSanitizer knows) and a futex to sleep on.
struct Group {
    int size = 0;
    std::atomic<int> arrived{0}, exited{0};
    std::atomic<unsigned> gen{0};  // completed steps; the futex word
    alignas(16) unsigned char slot[2][32][16];  // shuffle values, double-buffered by gen

    // After this thread's part of the step: wait until all `size` threads
    // have arrived; the last one runs `last()` first. Aborts if a thread of
    // the group exits instead of arriving, or none comes within the time-out.
    template <class F = NoOp>
    void arrive(const char* what, F last = {}) {
        const unsigned mine = gen.load(std::memory_order_acquire);
        if (exited.load())
            fail("%s: %d of %d threads exited before reaching it", what, exited.load(), size);
        if (arrived.fetch_add(1) + 1 == size) {
            last();
            arrived.store(0, std::memory_order_relaxed);
            gen.fetch_add(1, std::memory_order_release);
            futex_wake(&gen);
            return;
        }
        const auto start = std::chrono::steady_clock::now();
        while (gen.load(std::memory_order_acquire) == mine) {
            // An exit is an error only while the step is still open: once the
            // last thread has arrived, the others may run on and leave the
            // block before this one sees the new step.
            if (exited.load() && gen.load(std::memory_order_acquire) == mine)
                fail("%s: %d of %d threads exited before reaching it", what, exited.load(), size);
            const double left = timeout_s() - std::chrono::duration<double>(
                std::chrono::steady_clock::now() - start).count();
            if (left <= 0)
                fail("%s: only %d of %d threads arrived within %g s", what, arrived.load(), size,
                     timeout_s());
            futex_wait(&gen, mine, left < 1.0 ? left : 1.0);
        }
    }
    void exit() {  // seq_cst, with arrive's: either a waiter sees the exit or it is woken
        exited.fetch_add(1);
        if (arrived.load()) futex_wake(&gen);
    }
    void reset() { exited.store(0, std::memory_order_relaxed); }
};

struct Block {
    Group all;
    std::vector<Group> warps;
};

inline thread_local Block* this_block = nullptr;
inline thread_local int lane_id = 0, warp_id = 0;
// The block's dynamic shared memory (blocks of a cluster: one buffer each;
// other blocks run one at a time: one buffer a launch).
inline thread_local unsigned char* dynamic_shared_bytes = nullptr;
inline thread_local unsigned dynamic_shared_size = 0;
// The cluster's barrier and its blocks' dynamic shared memory (null: none).
inline thread_local Group* this_cluster = nullptr;
inline thread_local unsigned char* const* cluster_shared = nullptr;
inline thread_local unsigned cluster_blocks = 1;

inline unsigned char* dynamic_shared() { return dynamic_shared_bytes; }

inline void cluster_sync() {
    if (!this_cluster) fail("cluster_sync() in a launch without clusters");
    this_cluster->arrive("cluster barrier");
}

// p, an address in this block's dynamic shared memory, in block `rank`'s.
template <class T> inline T* in_block(T* p, int rank) {
    if (!this_cluster) fail("a cluster's shared memory read in a launch without clusters");
    if (rank < 0 || (unsigned)rank >= cluster_blocks)
        fail("shared memory of block %d of a cluster of %u", rank, cluster_blocks);
    const auto offset = reinterpret_cast<const unsigned char*>(p) - dynamic_shared_bytes;
    if (offset < 0 || (std::size_t)offset + sizeof(T) > dynamic_shared_size)
        fail("a cluster's shared memory: %p is not in this block's dynamic shared "
             "memory", static_cast<const void*>(p));
    return reinterpret_cast<T*>(cluster_shared[rank] + offset);
}

inline Group& this_warp() { return this_block->warps[warp_id]; }

// cp.async: a copy lands as late as the GPU may land it, when async_wait
// lets its group go, not when it is issued; a kernel that reads a slot
// before waiting for the copy into it reads the slot's old bytes here.
struct PendingCopy {
    void* to;
    const void* from;
    unsigned bytes;
    unsigned src_bytes;  // read from `from`; the rest of `bytes` are zeros
};
inline thread_local std::vector<PendingCopy> open_copies;  // not committed
inline thread_local std::vector<std::vector<PendingCopy>> copy_groups;

// cp.async with a source size: src_bytes read, zeros up to `bytes`. Both
// addresses must be aligned to `bytes`, as on a GPU.
inline void copy_async(void* to, const void* from, unsigned bytes,
                       unsigned src_bytes) {
    if (src_bytes > bytes) fail("cp.async: %u source bytes of %u", src_bytes, bytes);
    if (reinterpret_cast<std::uintptr_t>(to) % bytes != 0 ||
        reinterpret_cast<std::uintptr_t>(from) % bytes != 0)
        fail("cp.async of %u bytes from %p to %p: not aligned to its size", bytes,
             from, to);
    open_copies.push_back({to, from, bytes, src_bytes});
}
inline void copy_async(void* to, const void* from, unsigned bytes) {
    copy_async(to, from, bytes, bytes);
}
inline void copy_commit() {
    copy_groups.push_back(std::move(open_copies));
    open_copies.clear();
}
// Land every committed group but the newest `pending`, oldest first.
inline void copy_wait(unsigned pending) {
    while (copy_groups.size() > pending) {
        for (const PendingCopy& c : copy_groups.front()) {
            std::memcpy(c.to, c.from, c.src_bytes);
            std::memset(static_cast<unsigned char*>(c.to) + c.src_bytes, 0,
                        c.bytes - c.src_bytes);
        }
        copy_groups.erase(copy_groups.begin());
    }
}

}  // namespace cuda_host

inline void __syncthreads() {
    cuda_host::this_block->all.arrive("__syncthreads()");
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) cuda_host::fail("__syncwarp: mask %#x is not the full warp", mask);
    cuda_host::Group& g = cuda_host::this_warp();
    if (g.size != 32) cuda_host::fail("partial-warp __syncwarp: the warp has %d threads", g.size);
    g.arrive("partial-warp __syncwarp");
}

// Lane i gets lane (i ^ lane_mask)'s v. All 32 lanes must take part.
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "shuffle of a big type");
    if (mask != 0xffffffffu)
        cuda_host::fail("__shfl_xor_sync: mask %#x is not 0xffffffff (only full-warp shuffles "
                        "are emulated)", mask);
    if (width != 32 || lane_mask < 0 || lane_mask > 31)
        cuda_host::fail("__shfl_xor_sync: lane mask %d, width %d not emulated", lane_mask, width);
    cuda_host::Group& g = cuda_host::this_warp();
    if (g.size != 32)
        cuda_host::fail("partial-warp shuffle: warp %d has %d threads", cuda_host::warp_id, g.size);
    unsigned char(*slot)[16] = g.slot[g.gen.load(std::memory_order_acquire) & 1];
    std::memcpy(slot[cuda_host::lane_id], &v, sizeof(T));
    g.arrive("partial-warp shuffle (__shfl_xor_sync)");
    T out;  // the other buffer takes the next shuffle: this one stays until all have read
    std::memcpy(&out, slot[cuda_host::lane_id ^ lane_mask], sizeof(T));
    return out;
}

namespace cuda_host {

template <class P> constexpr char arg_code() {
    if constexpr (std::is_pointer_v<P>) return 'p';
    else if constexpr (std::is_same_v<P, float>) return 'f';
    else if constexpr (std::is_same_v<P, double>) return 'd';
    else if constexpr (std::is_integral_v<P> && sizeof(P) == 4) return 'i';
    else if constexpr (std::is_integral_v<P> && sizeof(P) == 8) return 'q';
    else return '?';
}

template <class... P, std::size_t... I>
inline void call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<P>*>(args[I])...);
}

// Run kernel<<<grid, block, shared>>>(args...). args[i] points at the i-th
// argument (as for cuLaunchKernel); sig has one letter per parameter
// (p pointer, f float, d double, i 32-bit integer, q 64-bit integer) and must
// match; shared is the bytes of dynamic shared memory; cluster the blocks
// of a cluster along x (1: no clusters), which must divide grid.x.
template <class... P>
void launch(void (*kernel)(P...), const char* name, const unsigned* grid3,
            const unsigned* block3, void** args, const char* sig, unsigned shared,
            unsigned cluster = 1) {
    static constexpr char want[] = {arg_code<std::remove_cv_t<P>>()..., '\0'};
    if (std::strcmp(sig, want) != 0)
        fail("%s takes arguments of kinds \"%s\", got \"%s\"", name, want, sig);
    const dim3 grid(grid3[0], grid3[1], grid3[2]), block(block3[0], block3[1], block3[2]);
    const unsigned n = block.x * block.y * block.z;
    const unsigned long long nblocks = 1ull * grid.x * grid.y * grid.z;
    if (n == 0 || n > 1024) fail("%s: %u threads per block", name, n);
    if (cluster == 0 || cluster > 8 || grid.x % cluster != 0)
        fail("%s: clusters of %u blocks for a grid of %u", name, cluster, grid.x);
    // One block (its barriers, its dynamic shared memory) per block of a
    // cluster; all of them run at once, a team of n threads each.
    std::vector<Block> blocks(cluster);
    for (Block& b : blocks) {
        b.all.size = (int)n;
        b.warps = std::vector<Group>((n + 31) / 32);
        for (unsigned w = 0; w < b.warps.size(); ++w)
            b.warps[w].size = (int)(n - 32 * w < 32 ? n - 32 * w : 32);  // the last may be partial
    }
    Group done;  // end of a cluster: everyone waits, the last one resets the blocks
    done.size = (int)(n * cluster);
    Group barrier;
    barrier.size = (int)(n * cluster);
    // 16-byte aligned, rounded up to 16 bytes (ASan sees a read past it).
    std::vector<std::vector<uint4>> dynamic(cluster, std::vector<uint4>((shared + 15) / 16));
    std::vector<unsigned char*> bases(cluster);
    for (unsigned r = 0; r < cluster; ++r)
        bases[r] = reinterpret_cast<unsigned char*>(dynamic[r].data());
    auto garble = [&] {  // no zeros left by a block for the next to rely on
        for (auto& buffer : dynamic)
            if (!buffer.empty())  // (no buffer: no pointer to pass)
                std::memset(buffer.data(), 0xff, buffer.size() * sizeof(uint4));
    };
    garble();
    std::vector<std::thread> team;
    team.reserve(n * cluster);
    for (unsigned u = 0; u < n * cluster; ++u) {
        team.emplace_back([&, u] {
            const unsigned r = u / n, t = u % n;  // block r of the cluster, thread t
            Block& b = blocks[r];
            this_block = &b;
            dynamic_shared_bytes = bases[r];
            dynamic_shared_size = shared;
            if (cluster > 1) {
                this_cluster = &barrier;
                cluster_shared = bases.data();
                cluster_blocks = cluster;
            }
            warp_id = (int)(t / 32);
            lane_id = (int)(t % 32);
            threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
            blockDim = block;
            gridDim = grid;
            for (unsigned long long first = 0; first < nblocks; first += cluster) {
                const unsigned long long id = first + r;
                blockIdx = {(unsigned)(id % grid.x), (unsigned)(id / grid.x % grid.y),
                            (unsigned)(id / (1ull * grid.x * grid.y))};
                call(kernel, args, std::index_sequence_for<P...>{});
                open_copies.clear();  // a block's copies end with it
                copy_groups.clear();
                b.all.exit();
                this_warp().exit();
                if (cluster > 1) barrier.exit();
                done.arrive("end of block", [&] {
                    for (Block& each : blocks) {
                        each.all.reset();
                        for (Group& w : each.warps) w.reset();
                    }
                    barrier.reset();
                    garble();
                });
            }
            this_cluster = nullptr;
            cluster_shared = nullptr;
            cluster_blocks = 1;
        });
    }
    for (std::thread& th : team) th.join();
}

}  // namespace cuda_host

#endif  // LNORM_CUDA_HOST_H
