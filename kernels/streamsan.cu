// streamsan device kernels, compiled at run time with NVRTC.
//
// Memory is viewed as little-endian 32-bit words. Every kernel is bit for bit equal to its CPU
// reference in src/kernels.rs; tests/cuda_device.rs compares them word for word. Every kernel uses
// a grid-stride loop, so any grid size is correct; the host picks one that fills the device.
//
// No standard headers: NVRTC compiles this alone.

// ---- the hash (src/kernels.rs: mix, fmix) ----------------------------------------------------

__device__ __forceinline__ unsigned int ss_rotl32(unsigned int x, unsigned int r) {
    return (x << r) | (x >> (32u - r));
}

// One MurmurHash3 body round: folds v into h.
__device__ __forceinline__ unsigned int ss_mix(unsigned int h, unsigned int v) {
    unsigned int x = h ^ (v * 0xcc9e2d51u);
    return ss_rotl32(x, 13u) * 5u + 0xe6546b64u;
}

// The MurmurHash3 finalizer.
__device__ __forceinline__ unsigned int ss_fmix(unsigned int h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

#define SS_HASH_SEED 0x5eed5a17u
#define SS_MISSING_READ 0xdeadbeefu

// ---- waiting ---------------------------------------------------------------------------------

// The global nanosecond timer, shared by all SMs.
__device__ __forceinline__ unsigned long long ss_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Busy-waits until the global timer has advanced by ns nanoseconds.
__device__ void ss_wait_ns(unsigned long long ns) {
    unsigned long long start = ss_globaltimer();
    while (ss_globaltimer() - start < ns) {
#if __CUDA_ARCH__ >= 700
        __nanosleep(1000);
#endif
    }
}

// Thread 0 of each block waits spin_ns, then the whole block goes on.
__device__ __forceinline__ void ss_block_wait(unsigned long long spin_ns) {
    if (spin_ns > 0ull) {
        if (threadIdx.x == 0) {
            ss_wait_ns(spin_ns);
        }
        __syncthreads();
    }
}

__device__ __forceinline__ unsigned long long ss_first_index() {
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned long long ss_stride() {
    return (unsigned long long)gridDim.x * blockDim.x;
}

// ---- kernels ---------------------------------------------------------------------------------

// Write region j of launch op_id: out[i] = hash_word(op_id, j, i, r_k[i] for k < n_reads), where
// r_k[i] is SS_MISSING_READ past r_k's end (i >= n_k). If spin_ns > 0, each block first waits
// spin_ns nanoseconds, which widens race windows without changing the result.
extern "C" __global__ void hash_launch(unsigned int* out, unsigned int n_out, unsigned int op_id,
                                       unsigned int j, const unsigned int* r0, unsigned int n0,
                                       const unsigned int* r1, unsigned int n1,
                                       const unsigned int* r2, unsigned int n2,
                                       const unsigned int* r3, unsigned int n3,
                                       unsigned int n_reads, unsigned long long spin_ns) {
    ss_block_wait(spin_ns);
    const unsigned int* reads[4] = {r0, r1, r2, r3};
    const unsigned int lens[4] = {n0, n1, n2, n3};
    const unsigned int k_end = n_reads < 4u ? n_reads : 4u;
    const unsigned int base = ss_mix(ss_mix(SS_HASH_SEED, op_id), j);
    for (unsigned long long i = ss_first_index(); i < n_out; i += ss_stride()) {
        unsigned int h = ss_mix(base, (unsigned int)i);
#pragma unroll
        for (unsigned int k = 0; k < 4u; ++k) {
            if (k < k_end) {
                h = ss_mix(h, i < lens[k] ? reads[k][i] : SS_MISSING_READ);
            }
        }
        out[i] = ss_fmix(h);
    }
}

// p[i] = value for i < n.
extern "C" __global__ void fill(unsigned int* p, unsigned int n, unsigned int value) {
    for (unsigned long long i = ss_first_index(); i < n; i += ss_stride()) {
        p[i] = value;
    }
}

// dst[i] = src[i] for i < n. The regions must not overlap.
extern "C" __global__ void copy_words(unsigned int* dst, const unsigned int* src, unsigned int n) {
    for (unsigned long long i = ss_first_index(); i < n; i += ss_stride()) {
        dst[i] = src[i];
    }
}

// Only waits: keeps its stream busy for ns nanoseconds.
extern "C" __global__ void spin(unsigned long long ns) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ss_wait_ns(ns);
    }
}

// Only waits: keeps its stream busy for *ns nanoseconds, read when it starts (a delay a captured
// graph takes from memory, so that each replay may wait differently).
extern "C" __global__ void spin_at(const unsigned int* ns) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ss_wait_ns((unsigned long long)*((volatile const unsigned int*)ns));
    }
}

// *out += sum over i < n of fmix(p[i] ^ i), wrapping; the host zeroes *out first.
// blockDim.x must be a multiple of 32.
extern "C" __global__ void checksum(const unsigned int* p, unsigned int n,
                                    unsigned long long* out) {
    unsigned long long acc = 0ull;
    for (unsigned long long i = ss_first_index(); i < n; i += ss_stride()) {
        acc += (unsigned long long)ss_fmix(p[i] ^ (unsigned int)i);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        acc += __shfl_down_sync(0xffffffffu, acc, offset);
    }
    if ((threadIdx.x & 31u) == 0u && acc != 0ull) {
        atomicAdd(out, acc);
    }
}

// *mismatches += the number of i < n with a[i] != b[i]; the host zeroes *mismatches first.
// blockDim.x must be a multiple of 32.
extern "C" __global__ void compare(const unsigned int* a, const unsigned int* b, unsigned int n,
                                   unsigned int* mismatches) {
    unsigned int count = 0u;
    for (unsigned long long i = ss_first_index(); i < n; i += ss_stride()) {
        count += a[i] != b[i] ? 1u : 0u;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        count += __shfl_down_sync(0xffffffffu, count, offset);
    }
    if ((threadIdx.x & 31u) == 0u && count != 0u) {
        atomicAdd(mismatches, count);
    }
}
