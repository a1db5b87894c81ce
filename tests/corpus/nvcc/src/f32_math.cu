// f32 math library functions and intrinsics, one thread per element.
// sinf/cosf are not here: their accurate versions keep a local-memory slow path
// (see ../refused/local_memory.cu); __sinf/__cosf are.

extern "C" __global__ void exp_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = expf(in0[i]);
}

extern "C" __global__ void log_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = logf(in0[i]);
}

extern "C" __global__ void sqrt_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = sqrtf(in0[i]);
}

extern "C" __global__ void rsqrt_f32(const float* in0, float* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = rsqrtf(in0[i]);
}

extern "C" __global__ void tanh_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tanhf(in0[i]);
}

extern "C" __global__ void erf_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = erff(in0[i]);
}

extern "C" __global__ void pow_f32(const float* __restrict__ in0, const float* __restrict__ in1,
                                   float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = powf(in0[i], in1[i]);
}

extern "C" __global__ void pow_p0_f32(const float* __restrict__ in0, float* __restrict__ out, long long n, float p0)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = powf(in0[i], p0);
}

extern "C" __global__ void exp2_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = exp2f(in0[i]);
}

extern "C" __global__ void log1p_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = log1pf(in0[i]);
}

extern "C" __global__ void silu_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = in0[i];
        out[i] = x / (1.0f + expf(-x));
    }
}

extern "C" __global__ void sigmoid_intrin_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __fdividef(1.0f, 1.0f + __expf(-in0[i]));
}

extern "C" __global__ void gelu_erf_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = in0[i];
        out[i] = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    }
}

extern "C" __global__ void softplus_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = log1pf(expf(in0[i]));
}

extern "C" __global__ void sin_intrin_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __sinf(in0[i]);
}

extern "C" __global__ void cos_intrin_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __cosf(in0[i]);
}

extern "C" __global__ void log2_intrin_f32(const float* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __log2f(in0[i]);
}

extern "C" __global__ void silu_mul_f32(const float* __restrict__ in0, const float* __restrict__ in1,
                                        float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = in0[i];
        out[i] = x / (1.0f + __expf(-x)) * in1[i];
    }
}
