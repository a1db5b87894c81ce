"""PTX kernels the tests generate: ``out[i] = in0[i] + in1[i]`` per dtype.

The text follows nvcc's output for the scalar ABI (see tests/corpus/README.md):
``(const T* in0, const T* in1, T* out, long long n)``, one thread per element,
guarded by ``i < n``. f16 and bf16 add in f32 and round to nearest even, as
torch does for ``(a.float() + b.float()).to(dtype)``.
"""

HEADER = """.version 8.0
.target sm_90
.address_size 64

.visible .entry {name}(
\t.param .u64 {name}_param_0,
\t.param .u64 {name}_param_1,
\t.param .u64 {name}_param_2,
\t.param .u64 {name}_param_3
)
{{
\t.reg .pred \t%p<2>;
\t.reg .b16 \t%rs<4>;
\t.reg .f32 \t%f<4>;
\t.reg .f64 \t%fd<4>;
\t.reg .b32 \t%r<8>;
\t.reg .b64 \t%rd<15>;

\tld.param.u64 \t%rd2, [{name}_param_0];
\tld.param.u64 \t%rd3, [{name}_param_1];
\tld.param.u64 \t%rd4, [{name}_param_2];
\tld.param.u64 \t%rd5, [{name}_param_3];
\tmov.u32 \t%r1, %ctaid.x;
\tmov.u32 \t%r2, %ntid.x;
\tmul.wide.u32 \t%rd6, %r1, %r2;
\tmov.u32 \t%r3, %tid.x;
\tcvt.u64.u32 \t%rd7, %r3;
\tadd.s64 \t%rd1, %rd6, %rd7;
\tsetp.ge.s64 \t%p1, %rd1, %rd5;
\t@%p1 bra \t$L__BB0_2;

\tcvta.to.global.u64 \t%rd8, %rd2;
\tshl.b64 \t%rd9, %rd1, {shift};
\tadd.s64 \t%rd10, %rd8, %rd9;
\tcvta.to.global.u64 \t%rd11, %rd3;
\tadd.s64 \t%rd12, %rd11, %rd9;
\tcvta.to.global.u64 \t%rd13, %rd4;
\tadd.s64 \t%rd14, %rd13, %rd9;
{body}
$L__BB0_2:
\tret;

}}
"""

BODIES = {
    "f32": (2, """\tld.global.f32 \t%f1, [%rd10];
\tld.global.f32 \t%f2, [%rd12];
\tadd.f32 \t%f3, %f1, %f2;
\tst.global.f32 \t[%rd14], %f3;
"""),
    "f64": (3, """\tld.global.f64 \t%fd1, [%rd10];
\tld.global.f64 \t%fd2, [%rd12];
\tadd.f64 \t%fd3, %fd1, %fd2;
\tst.global.f64 \t[%rd14], %fd3;
"""),
    "i32": (2, """\tld.global.u32 \t%r4, [%rd10];
\tld.global.u32 \t%r5, [%rd12];
\tadd.s32 \t%r6, %r4, %r5;
\tst.global.u32 \t[%rd14], %r6;
"""),
    "f16": (1, """\tld.global.u16 \t%rs1, [%rd10];
\tld.global.u16 \t%rs2, [%rd12];
\tcvt.f32.f16 \t%f1, %rs1;
\tcvt.f32.f16 \t%f2, %rs2;
\tadd.f32 \t%f3, %f1, %f2;
\tcvt.rn.f16.f32 \t%rs3, %f3;
\tst.global.u16 \t[%rd14], %rs3;
"""),
    "bf16": (1, """\tld.global.u16 \t%rs1, [%rd10];
\tld.global.u16 \t%rs2, [%rd12];
\tcvt.f32.bf16 \t%f1, %rs1;
\tcvt.f32.bf16 \t%f2, %rs2;
\tadd.f32 \t%f3, %f1, %f2;
\tcvt.rn.bf16.f32 \t%rs3, %f3;
\tst.global.u16 \t[%rd14], %rs3;
"""),
}

#: Element size in bytes per dtype name.
ITEMSIZE = {"f32": 4, "f64": 8, "i32": 4, "f16": 2, "bf16": 2}


def add_kernel(dtype: str) -> tuple:
    """``(ptx, symbol)`` of ``out[i] = in0[i] + in1[i]`` for ``dtype``."""
    shift, body = BODIES[dtype]
    name = f"add_{dtype}_gen"
    return HEADER.format(name=name, shift=shift, body=body), name
