// Ordinary f32 elementwise kernels in the scalar ABI: arithmetic, selects,
// index written in several orders, guards written as `i < n` and as early return.

extern "C" __global__ void add_f32(const float* __restrict__ in0, const float* __restrict__ in1,
                                   float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] + in1[i];
}

extern "C" __global__ void sub_f32_norestrict(const float* in0, const float* in1, float* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] - in1[i];
}

extern "C" __global__ void mul_f32_tid_first(const float* __restrict__ in0, const float* __restrict__ in1,
                                             float* __restrict__ out, long long n)
{
    long long i = threadIdx.x + (long long)blockDim.x * blockIdx.x;
    if (i < n) out[i] = in0[i] * in1[i];
}

extern "C" __global__ void div_f32_dim_first(const float* __restrict__ in0, const float* __restrict__ in1,
                                             float* __restrict__ out, long long n)
{
    long long i = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) out[i] = in0[i] / in1[i];
}

extern "C" __global__ void neg_f32_early_return(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = -in0[i];
}

extern "C" __global__ void fma_f32(const float* __restrict__ in0, const float* __restrict__ in1,
                                   const float* __restrict__ in2, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaf(in0[i], in1[i], in2[i]);
}

extern "C" __global__ void sum4_f32(const float* __restrict__ in0, const float* __restrict__ in1,
                                    const float* __restrict__ in2, const float* __restrict__ in3,
                                    float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = ((in0[i] + in1[i]) + in2[i]) + in3[i];
}

extern "C" __global__ void axpb_f32(const float* __restrict__ in0, float* __restrict__ out, long long n,
                                    float p0, float p1)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] * p0 + p1;
}

extern "C" __global__ void lin2_f32(const float* __restrict__ in0, const float* __restrict__ in1,
                                    float* __restrict__ out, long long n, float p0, float p1, float p2)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] * p0 + in1[i] * p1 + p2;
}

extern "C" __global__ void relu_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(in0[i], 0.0f);
}

extern "C" __global__ void clamp_f32(const float* __restrict__ in0, float* __restrict__ out, long long n,
                                     float p0, float p1)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fminf(fmaxf(in0[i], p0), p1);
}

extern "C" __global__ void abs_f32(const float* in0, float* out, long long n)
{
    long long i = threadIdx.x + (long long)blockIdx.x * blockDim.x;
    if (i < n) out[i] = fabsf(in0[i]);
}

extern "C" __global__ void select_gt0_f32(const float* __restrict__ in0, const float* __restrict__ in1,
                                          const float* __restrict__ in2, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] > 0.0f ? in1[i] : in2[i];
}

extern "C" __global__ void select_lt_f32_early_return(const float* in0, const float* in1, float* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = in0[i] < in1[i] ? in0[i] : in1[i];
}

extern "C" __global__ void select_nz_u8_f32(const unsigned char* __restrict__ in0, const float* __restrict__ in1,
                                            const float* __restrict__ in2, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] ? in1[i] : in2[i];
}

extern "C" __global__ void addp_f32_size_t(const float* __restrict__ in0, float* __restrict__ out, size_t n, float p0)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] + p0;
}

extern "C" __global__ void add_mul_f32_size_t_early_return(const float* in0, const float* in1, const float* in2,
                                                           float* out, size_t n)
{
    size_t i = threadIdx.x + blockDim.x * (size_t)blockIdx.x;
    if (i >= n) return;
    out[i] = (in0[i] + in1[i]) * in2[i];
}

extern "C" __global__ void __launch_bounds__(256) scale_f32_lb256(const float* __restrict__ in0,
                                                                  float* __restrict__ out, long long n, float p0)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] * p0;
}

extern "C" __global__ void __launch_bounds__(128, 4) max_f32_lb128_4(const float* __restrict__ in0,
                                                                     const float* __restrict__ in1,
                                                                     float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(in0[i], in1[i]);
}
