// A grid-stride loop: one thread touches elements i, i + stride, i + 2*stride, ...
// The design accepts one element per thread only, so this must stay refused.

extern "C" __global__ void grid_stride_scale_f32(const float* __restrict__ in0, float* __restrict__ out,
                                                 long long n, float p0)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        out[i] = in0[i] * p0;
}

extern "C" __global__ void grid_stride_add_f32_size_t(const float* in0, const float* in1, float* out, size_t n)
{
    size_t stride = (size_t)blockDim.x * gridDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = in0[i] + in1[i];
}
