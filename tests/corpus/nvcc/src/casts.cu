// Conversions: the input element type differs from the output element type.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void cast_f32_to_f16(const float* __restrict__ in0, __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half(in0[i]);
}

extern "C" __global__ void cast_f16_to_f32(const __half* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half2float(in0[i]);
}

extern "C" __global__ void cast_f32_to_bf16(const float* __restrict__ in0, __nv_bfloat16* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(in0[i]);
}

extern "C" __global__ void cast_bf16_to_f32(const __nv_bfloat16* in0, float* out, long long n)
{
    long long i = threadIdx.x + (long long)blockDim.x * blockIdx.x;
    if (i < n) out[i] = __bfloat162float(in0[i]);
}

extern "C" __global__ void cast_f64_to_f32(const double* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)in0[i];
}

extern "C" __global__ void cast_f32_to_f64(const float* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (double)in0[i];
}

extern "C" __global__ void cast_i32_to_f32(const int* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)in0[i];
}

extern "C" __global__ void cast_f32_to_i32(const float* __restrict__ in0, int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (int)in0[i];
}

extern "C" __global__ void cast_u8_to_f32(const unsigned char* __restrict__ in0, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)in0[i];
}

extern "C" __global__ void cast_f32_to_u8(const float* __restrict__ in0, unsigned char* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (unsigned char)in0[i];
}

extern "C" __global__ void cast_i64_to_f64(const long long* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (double)in0[i];
}

extern "C" __global__ void cast_u64_to_f32(const unsigned long long* __restrict__ in0, float* __restrict__ out,
                                           long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)in0[i];
}

extern "C" __global__ void cast_i8_to_i64(const signed char* __restrict__ in0, long long* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (long long)in0[i];
}

extern "C" __global__ void cast_u16_to_u32_early_return(const unsigned short* __restrict__ in0,
                                                        unsigned int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = (unsigned int)in0[i];
}

extern "C" __global__ void cast_i64_to_i16(const long long* __restrict__ in0, short* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (short)in0[i];
}

extern "C" __global__ void cast_f16_to_f64(const __half* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (double)__half2float(in0[i]);
}

extern "C" __global__ void cast_bf16_to_f16(const __nv_bfloat16* __restrict__ in0, __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half(__bfloat162float(in0[i]));
}

extern "C" __global__ void cast_f64_to_i64_size_t(const double* __restrict__ in0, long long* __restrict__ out, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (long long)in0[i];
}

extern "C" __global__ void cast_u32_to_f64(const unsigned int* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (double)in0[i];
}

extern "C" __global__ void add_i32_f32_to_f64(const int* __restrict__ in0, const float* __restrict__ in1,
                                              double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (double)(in0[i] + in1[i]);
}

extern "C" __global__ void mul_u8_i16_to_i32(const unsigned char* __restrict__ in0, const short* __restrict__ in1,
                                             int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] * in1[i];
}

extern "C" __global__ void fma_f16_f16_f32_to_f32(const __half* __restrict__ in0, const __half* __restrict__ in1,
                                                  const float* __restrict__ in2, float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half2float(in0[i]) * __half2float(in1[i]) + in2[i];
}

extern "C" __global__ void select_nz_i8_f64_i32_to_f32(const signed char* __restrict__ in0,
                                                       const double* __restrict__ in1, const int* __restrict__ in2,
                                                       float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] != 0 ? (float)in1[i] : (float)in2[i];
}

extern "C" __global__ void mul_wide_i32_to_i64(const int* __restrict__ in0, const int* __restrict__ in1,
                                               long long* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (long long)in0[i] * in1[i];
}
