// An internal, non-inlined device function call.

__device__ __noinline__ float square_plus_one(float x)
{
    return x * x + 1.0f;
}

extern "C" __global__ void call_noinline_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = square_plus_one(in0[i]);
}
