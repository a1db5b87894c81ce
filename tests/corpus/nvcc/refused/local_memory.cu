// Local-memory paths: a per-thread array indexed by data, and the accurate
// trigonometric functions, whose huge-argument reduction (Payne-Hanek) keeps a
// per-thread array in local memory.

extern "C" __global__ void local_table_f32(const float* __restrict__ in0, const int* __restrict__ in1,
                                           float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float t[32];
        float x = in0[i];
#pragma unroll
        for (int j = 0; j < 32; j++) t[j] = x * (float)(j + 1);
        out[i] = t[in1[i] & 31];
    }
}

extern "C" __global__ void sin_f64_local(const double* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = sin(in0[i]);
}

// Under -use_fast_math sinf becomes sin.approx.f32 and has no slow path: the
// .fastmath variants of this kernel are ordinary (see the manifest).
extern "C" __global__ void sin_f32_local(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = sinf(in0[i]);
}
