// Integer kernels, int8..int64 and uint8..uint64. Narrow types promote to int
// as C says and are truncated on the store.

extern "C" __global__ void add_i8(const signed char* __restrict__ in0, const signed char* __restrict__ in1,
                                  signed char* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (signed char)(in0[i] + in1[i]);
}

extern "C" __global__ void mul_u8(const unsigned char* in0, const unsigned char* in1, unsigned char* out, long long n)
{
    long long i = threadIdx.x + (long long)blockDim.x * blockIdx.x;
    if (i < n) out[i] = (unsigned char)(in0[i] * in1[i]);
}

extern "C" __global__ void sub_i16(const short* __restrict__ in0, const short* __restrict__ in1,
                                   short* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (short)(in0[i] - in1[i]);
}

extern "C" __global__ void xor_u16(const unsigned short* __restrict__ in0, const unsigned short* __restrict__ in1,
                                   unsigned short* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] ^ in1[i];
}

extern "C" __global__ void add_i32(const int* __restrict__ in0, const int* __restrict__ in1,
                                   int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] + in1[i];
}

extern "C" __global__ void div_i32(const int* __restrict__ in0, const int* __restrict__ in1,
                                   int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] / in1[i];
}

extern "C" __global__ void rem_u32(const unsigned int* __restrict__ in0, const unsigned int* __restrict__ in1,
                                   unsigned int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] % in1[i];
}

extern "C" __global__ void shl_u32(const unsigned int* __restrict__ in0, const unsigned int* __restrict__ in1,
                                   unsigned int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] << (in1[i] & 31u);
}

extern "C" __global__ void shr_i32_early_return(const int* __restrict__ in0, const int* __restrict__ in1,
                                                int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = in0[i] >> (in1[i] & 31);
}

extern "C" __global__ void abs_i32(const int* __restrict__ in0, int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = abs(in0[i]);
}

extern "C" __global__ void clz_u32(const unsigned int* __restrict__ in0, int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __clz(in0[i]);
}

extern "C" __global__ void brev_u32(const unsigned int* __restrict__ in0, unsigned int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __brev(in0[i]);
}

extern "C" __global__ void mulhi_u32(const unsigned int* __restrict__ in0, const unsigned int* __restrict__ in1,
                                     unsigned int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __umulhi(in0[i], in1[i]);
}

extern "C" __global__ void add_i64(const long long* __restrict__ in0, const long long* __restrict__ in1,
                                   long long* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] + in1[i];
}

extern "C" __global__ void mul_u64_size_t(const unsigned long long* __restrict__ in0,
                                          const unsigned long long* __restrict__ in1,
                                          unsigned long long* __restrict__ out, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] * in1[i];
}

extern "C" __global__ void div_i64(const long long* __restrict__ in0, const long long* __restrict__ in1,
                                   long long* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] / in1[i];
}

extern "C" __global__ void min_i64(const long long* in0, const long long* in1, long long* out, long long n)
{
    long long i = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) out[i] = min(in0[i], in1[i]);
}

extern "C" __global__ void max_u64(const unsigned long long* __restrict__ in0, const unsigned long long* __restrict__ in1,
                                   unsigned long long* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = max(in0[i], in1[i]);
}

extern "C" __global__ void and_or_u64(const unsigned long long* __restrict__ in0,
                                      const unsigned long long* __restrict__ in1,
                                      const unsigned long long* __restrict__ in2,
                                      unsigned long long* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (in0[i] & in1[i]) | in2[i];
}

extern "C" __global__ void popc_u64(const unsigned long long* __restrict__ in0, int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __popcll(in0[i]);
}

extern "C" __global__ void select_gt0_i32(const int* __restrict__ in0, const int* __restrict__ in1,
                                          const int* __restrict__ in2, int* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] > 0 ? in1[i] : in2[i];
}

extern "C" __global__ void __launch_bounds__(256) sum4_i16_lb256(const short* __restrict__ in0,
                                                                 const short* __restrict__ in1,
                                                                 const short* __restrict__ in2,
                                                                 const short* __restrict__ in3,
                                                                 short* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (short)(in0[i] + in1[i] + in2[i] + in3[i]);
}

extern "C" __global__ void scale_i32_by_p0(const int* __restrict__ in0, int* __restrict__ out, long long n, float p0)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (int)((float)in0[i] * p0);
}
