// __half and __nv_bfloat16 kernels through cuda_fp16.h / cuda_bf16.h, whose
// arithmetic is inline assembly (scoped registers declared inside `{ }`).
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void add_f16(const __half* __restrict__ in0, const __half* __restrict__ in1,
                                   __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hadd(in0[i], in1[i]);
}

extern "C" __global__ void mul_f16_operator(const __half* in0, const __half* in1, __half* out, long long n)
{
    long long i = threadIdx.x + (long long)blockDim.x * blockIdx.x;
    if (i < n) out[i] = in0[i] * in1[i];
}

extern "C" __global__ void fma_f16(const __half* __restrict__ in0, const __half* __restrict__ in1,
                                   const __half* __restrict__ in2, __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hfma(in0[i], in1[i], in2[i]);
}

extern "C" __global__ void max_f16(const __half* __restrict__ in0, const __half* __restrict__ in1,
                                   __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hmax(in0[i], in1[i]);
}

extern "C" __global__ void select_gt0_f16(const __half* __restrict__ in0, const __half* __restrict__ in1,
                                          const __half* __restrict__ in2, __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hgt(in0[i], __float2half(0.0f)) ? in1[i] : in2[i];
}

extern "C" __global__ void exp_f16(const __half* __restrict__ in0, __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = hexp(in0[i]);
}

extern "C" __global__ void sqrt_f16_early_return(const __half* __restrict__ in0, __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = hsqrt(in0[i]);
}

extern "C" __global__ void silu_f16_via_f32(const __half* __restrict__ in0, __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = __half2float(in0[i]);
        out[i] = __float2half(x / (1.0f + expf(-x)));
    }
}

extern "C" __global__ void axpb_f16(const __half* __restrict__ in0, __half* __restrict__ out, long long n,
                                    float p0, float p1)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half(__half2float(in0[i]) * p0 + p1);
}

extern "C" __global__ void add_bf16(const __nv_bfloat16* __restrict__ in0, const __nv_bfloat16* __restrict__ in1,
                                    __nv_bfloat16* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hadd(in0[i], in1[i]);
}

extern "C" __global__ void mul_bf16_operator(const __nv_bfloat16* in0, const __nv_bfloat16* in1,
                                             __nv_bfloat16* out, long long n)
{
    long long i = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) out[i] = in0[i] * in1[i];
}

extern "C" __global__ void fma_bf16(const __nv_bfloat16* __restrict__ in0, const __nv_bfloat16* __restrict__ in1,
                                    const __nv_bfloat16* __restrict__ in2, __nv_bfloat16* __restrict__ out,
                                    long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hfma(in0[i], in1[i], in2[i]);
}

extern "C" __global__ void relu_bf16(const __nv_bfloat16* __restrict__ in0, __nv_bfloat16* __restrict__ out,
                                     long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hmax(in0[i], __float2bfloat16(0.0f));
}

extern "C" __global__ void tanh_bf16_via_f32(const __nv_bfloat16* __restrict__ in0, __nv_bfloat16* __restrict__ out,
                                             long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(tanhf(__bfloat162float(in0[i])));
}

extern "C" __global__ void __launch_bounds__(128, 4) silu_mul_bf16_lb128_4(const __nv_bfloat16* __restrict__ in0,
                                                                           const __nv_bfloat16* __restrict__ in1,
                                                                           __nv_bfloat16* __restrict__ out,
                                                                           long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = __bfloat162float(in0[i]);
        out[i] = __float2bfloat16(x / (1.0f + __expf(-x)) * __bfloat162float(in1[i]));
    }
}
