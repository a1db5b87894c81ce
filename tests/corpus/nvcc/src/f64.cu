// f64 arithmetic and math library functions.
// sin/cos on double are not here: they keep a local-memory slow path (../refused/local_memory.cu).

extern "C" __global__ void add_f64(const double* __restrict__ in0, const double* __restrict__ in1,
                                   double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] + in1[i];
}

extern "C" __global__ void div_f64(const double* in0, const double* in1, double* out, long long n)
{
    long long i = threadIdx.x + (long long)blockDim.x * blockIdx.x;
    if (i < n) out[i] = in0[i] / in1[i];
}

extern "C" __global__ void fma_f64(const double* __restrict__ in0, const double* __restrict__ in1,
                                   const double* __restrict__ in2, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fma(in0[i], in1[i], in2[i]);
}

extern "C" __global__ void axpb_f64_f32params(const double* __restrict__ in0, double* __restrict__ out, long long n,
                                              float p0, float p1)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] * (double)p0 + (double)p1;
}

extern "C" __global__ void exp_f64(const double* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = exp(in0[i]);
}

extern "C" __global__ void log_f64(const double* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = log(in0[i]);
}

extern "C" __global__ void sqrt_f64_early_return(const double* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = sqrt(in0[i]);
}

extern "C" __global__ void rsqrt_f64(const double* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = rsqrt(in0[i]);
}

extern "C" __global__ void pow_f64(const double* __restrict__ in0, const double* __restrict__ in1,
                                   double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = pow(in0[i], in1[i]);
}

extern "C" __global__ void tanh_f64(const double* __restrict__ in0, double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tanh(in0[i]);
}

extern "C" __global__ void erf_f64_size_t(const double* __restrict__ in0, double* __restrict__ out, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = erf(in0[i]);
}

extern "C" __global__ void __launch_bounds__(256) select_gt0_f64_lb256(const double* __restrict__ in0,
                                                                       const double* __restrict__ in1,
                                                                       const double* __restrict__ in2,
                                                                       double* __restrict__ out, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in0[i] > 0.0 ? in1[i] : in2[i];
}
