// Cache-operator loads and stores (__ldg, __ldcs, __ldlu, __ldcv, __ldca, __ldcg,
// __stcs, __stwt, __stcg, __stwb) and `::` cache qualifiers from inline assembly.
#include <cuda_fp16.h>

extern "C" __global__ void add_f32_ldg(const float* __restrict__ in0, const float* __restrict__ in1,
                                       float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __ldg(&in0[i]) + __ldg(&in1[i]);
}

extern "C" __global__ void mul_f32_ldcs_stcs(const float* in0, const float* in1, float* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) __stcs(&out[i], __ldcs(&in0[i]) * __ldcs(in1 + i));
}

extern "C" __global__ void sub_f32_ldlu_stwt(const float* in0, const float* in1, float* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) __stwt(out + i, __ldlu(in0 + i) - __ldlu(in1 + i));
}

extern "C" __global__ void add_i32_ldcv_stcg(const int* in0, const int* in1, int* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) __stcg(&out[i], __ldcv(&in0[i]) + __ldcv(&in1[i]));
}

extern "C" __global__ void fma_f64_ldca_ldcg_stwb(const double* in0, const double* in1, const double* in2,
                                                  double* out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) __stwb(&out[i], fma(__ldca(&in0[i]), __ldcg(&in1[i]), __ldg(&in2[i])));
}

extern "C" __global__ void add_f16_ldg(const __half* __restrict__ in0, const __half* __restrict__ in1,
                                       __half* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hadd(__ldg(&in0[i]), __ldg(&in1[i]));
}

extern "C" __global__ void cast_u16_to_u64_ldg_size_t(const unsigned short* __restrict__ in0,
                                                      unsigned long long* __restrict__ out, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __ldg(&in0[i]);
}

extern "C" __global__ void copy_f32_asm_l1_no_allocate(const float* __restrict__ in0, float* __restrict__ out,
                                                       long long n, float p0)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v;
        asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(in0 + i));
        out[i] = v * p0;
    }
}

extern "C" __global__ void add_f32_asm_l2_256b(const float* __restrict__ in0, const float* __restrict__ in1,
                                               float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float a, b;
        asm volatile("ld.global.L2::256B.f32 %0, [%1];" : "=f"(a) : "l"(in0 + i));
        asm volatile("ld.global.L1::evict_last.f32 %0, [%1];" : "=f"(b) : "l"(in1 + i));
        out[i] = a + b;
    }
}

extern "C" __global__ void add_f32_asm_st_evict_first(const float* __restrict__ in0, const float* __restrict__ in1,
                                                      float* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = in0[i] + in1[i];
        asm volatile("st.global.L1::evict_first.f32 [%0], %1;" :: "l"(out + i), "f"(v) : "memory");
    }
}
