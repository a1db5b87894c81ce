//! `.func` calls (`src/ptx/inline.rs`): every NVRTC corpus kernel that
//! calls a helper and is accepted runs on the host engine against a Rust
//! reference (fresh random inputs, poisoned outputs, every element
//! compared), and each attack on the inliner is refused with its exact
//! sub_reason.
#![allow(clippy::unwrap_used, clippy::panic)]

use half::{bf16, f16};
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::{Rng, SeedableRng};

fn jit(file: &str) -> String {
    let path = format!("{}/tests/corpus/jit/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

fn reason(text: &str, entry: &str) -> &'static str {
    match ptx::canonicalize_with(text, entry, None, Families::ALL) {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => sub_reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The element type of a corpus kernel's operands.
#[derive(Clone, Copy, Debug)]
enum Dt {
    F32,
    F64,
    F16,
    Bf16,
}

impl Dt {
    fn size(self) -> usize {
        match self {
            Dt::F32 => 4,
            Dt::F64 => 8,
            Dt::F16 | Dt::Bf16 => 2,
        }
    }
    fn encode(self, x: f64) -> Vec<u8> {
        match self {
            Dt::F32 => (x as f32).to_le_bytes().to_vec(),
            Dt::F64 => x.to_le_bytes().to_vec(),
            Dt::F16 => f16::from_f64(x).to_le_bytes().to_vec(),
            Dt::Bf16 => bf16::from_f64(x).to_le_bytes().to_vec(),
        }
    }
    fn decode(self, b: &[u8]) -> f64 {
        match self {
            Dt::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dt::F64 => f64::from_le_bytes(b.try_into().unwrap()),
            Dt::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            Dt::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        }
    }
    /// The representable value nearest `x`.
    fn round(self, x: f64) -> f64 {
        self.decode(&self.encode(x))
    }
}

/// What `entry` computes (from the manifest's source), in f64 over the
/// operands' values, its element type, and its relative tolerance (0:
/// bit-exact after rounding to the element type; else the error bound is
/// `tol × (|result| + |x|)`).
#[allow(clippy::type_complexity)]
fn reference(entry: &str) -> (Dt, f64, fn(&[f64], &[f32]) -> f64) {
    match entry {
        "relu_f32" => (Dt::F32, 0.0, |x, _| x[0].max(0.0)),
        "clamp_f32" => (Dt::F32, 0.0, |x, p| {
            x[0].max(f64::from(p[0])).min(f64::from(p[1]))
        }),
        "sqrt_f32" => (Dt::F32, 0.0, |x, _| x[0].abs().sqrt()),
        "hadd_f16" => (Dt::F16, 0.0, |x, _| x[0] + x[1]),
        "add_bf16" => (Dt::Bf16, 0.0, |x, _| x[0] + x[1]),
        "rsqrt_f32" => (Dt::F32, 4e-7, |x, _| 1.0 / (x[0].abs() + 1.0).sqrt()),
        "exp_f32" => (Dt::F32, 4e-7, |x, _| x[0].exp()),
        "tanh_f32" => (Dt::F32, 4e-7, |x, _| x[0].tanh()),
        "silu_mul_f32" => (Dt::F32, 1e-6, |x, _| x[0] / (1.0 + (-x[0]).exp()) * x[1]),
        "silu_mul_f16" => (Dt::F16, 2e-3, |x, _| x[0] / (1.0 + (-x[0]).exp()) * x[1]),
        "gelu_erf_f32" => (Dt::F32, 1e-6, |x, _| {
            0.5 * x[0] * (1.0 + erf(x[0] * f64::from(std::f32::consts::FRAC_1_SQRT_2)))
        }),
        "pow_f64" => (Dt::F64, 4e-16, |x, _| x[0].abs().powf(2.5)),
        "sin_f32" => (Dt::F32, 4e-7, |x, _| x[0].sin()),
        "cos_f32" => (Dt::F32, 4e-7, |x, _| x[0].cos()),
        // Relative; the slow path (|x| >= 2^31) is in struct_returns.rs.
        "sin_f64" => (Dt::F64, 4e-16, |x, _| x[0].sin()),
        other => panic!("no reference for {other}"),
    }
}

/// erf to ~1e-15 (Abramowitz–Stegun 7.1.26 is too coarse; a series and a
/// continued fraction).
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        // Maclaurin series.
        let (mut term, mut sum, mut k) = (a, a, 0.0f64);
        while term.abs() > 1e-17 * sum.abs() {
            k += 1.0;
            term *= -a * a / k;
            sum += term / (2.0 * k + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc by a continued fraction.
        let mut f = 0.0f64;
        for k in (1..60).rev() {
            f = f64::from(k) / 2.0 / (a + f);
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f)
    };
    r.copysign(x)
}

/// The corpus kernels that call a `.func` and that the verifier accepts,
/// with their input counts.
const ACCEPTED: &[(&str, &str, usize, usize)] = &[
    ("nvrtc/relu_f32_G.ptx", "relu_f32", 1, 0),
    ("nvrtc/clamp_f32_G.ptx", "clamp_f32", 1, 2),
    ("nvrtc/exp_f32_G.ptx", "exp_f32", 1, 0),
    ("nvrtc/gelu_erf_f32_G.ptx", "gelu_erf_f32", 1, 0),
    ("nvrtc/tanh_f32_G.ptx", "tanh_f32", 1, 0),
    ("nvrtc/sqrt_f32_G.ptx", "sqrt_f32", 1, 0),
    ("nvrtc/rsqrt_f32_G.ptx", "rsqrt_f32", 1, 0),
    ("nvrtc/silu_mul_f32_G.ptx", "silu_mul_f32", 2, 0),
    ("nvrtc/silu_mul_f16_G.ptx", "silu_mul_f16", 2, 0),
    ("nvrtc/hadd_f16_G.ptx", "hadd_f16", 2, 0),
    ("nvrtc/add_bf16_G.ptx", "add_bf16", 2, 0),
    ("nvrtc/pow_f64_G.ptx", "pow_f64", 1, 0),
    ("nvrtc/pow_f64_O3.ptx", "pow_f64", 1, 0),
    ("nvrtc/pow_f64_fast.ptx", "pow_f64", 1, 0),
    // `sinf`/`cosf` with their indexed 28-byte frame in the callee.
    ("nvrtc/sin_f32_G.ptx", "sin_f32", 1, 0),
    ("nvrtc/cos_f32_G.ptx", "cos_f32", 1, 0),
    // Double `sin`: its slow path returns a 16-byte struct (one register
    // per field) and multiplies with carry chains (lowered).
    ("nvrtc/sin_f64_G.ptx", "sin_f64", 1, 0),
    ("nvrtc/sin_f64_O3.ptx", "sin_f64", 1, 0),
    ("nvrtc/sin_f64_fast.ptx", "sin_f64", 1, 0),
];

/// The call kernels accepted and run against their reference in another
/// suite: NVRTC -G's `add_f16_vec2` (its `__half2` temporaries' `this`
/// pointers kept in frame slots), in struct_returns.rs.
const ACCEPTED_ELSEWHERE: &[&str] = &["nvrtc/add_f16_vec2_G.ptx"];

/// Every corpus kernel that calls a helper is in [`ACCEPTED`] or
/// [`ACCEPTED_ELSEWHERE`], or refused `local_memory` (none today).
#[test]
fn every_call_kernel_has_its_verdict() {
    let manifest: serde_json::Value = serde_json::from_str(&jit("nvrtc/manifest.json")).unwrap();
    let mut calls = 0;
    for k in manifest["kernels"].as_array().unwrap() {
        let (file, entry) = (k["file"].as_str().unwrap(), k["entry"].as_str().unwrap());
        let text = jit(file);
        if !text.contains("call.uni") && !text.contains("\tcall ") {
            continue;
        }
        calls += 1;
        let got = ptx::canonicalize_with(&text, entry, None, Families::ALL);
        let accepted = ACCEPTED.iter().any(|a| a.0 == file) || ACCEPTED_ELSEWHERE.contains(&file);
        match (accepted, got) {
            (true, Ok(_)) => {}
            (false, Err(PtxError::NonScalarAbi { sub_reason, .. })) => {
                assert_eq!(sub_reason, "local_memory", "{file}");
            }
            (_, other) => panic!("{file}: {other:?}"),
        }
    }
    assert_eq!(calls, 20);
}

#[test]
fn every_accepted_call_kernel_matches_its_reference() {
    let mut r = rand::rngs::StdRng::seed_from_u64(21);
    for &(file, entry, inputs, params) in ACCEPTED {
        let text = jit(file);
        assert!(text.contains("call"), "{file} makes no call");
        let canonical = ptx::canonicalize_with(&text, entry, None, Families::ALL)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!canonical.text.contains("call"), "{file}: a call survived");
        let k = HostKernel::compile_with(&text, entry, Families::ALL).unwrap();
        let (dt, tol, f) = reference(entry);
        for n in [0usize, 1, 255, 257, 1000] {
            for threads in [1, 3] {
                let p: Vec<f32> = (0..params)
                    .map(|k| {
                        if k == 0 {
                            r.random_range(-5.0..0.0)
                        } else {
                            r.random_range(0.0..5.0)
                        }
                    })
                    .collect();
                let xs: Vec<Vec<f64>> = (0..inputs)
                    .map(|_| {
                        (0..n + 2)
                            .map(|_| dt.round(r.random_range(-8.0..8.0)))
                            .collect()
                    })
                    .collect();
                let mut bufs: Vec<Vec<u8>> = xs
                    .iter()
                    .map(|v| v.iter().flat_map(|x| dt.encode(*x)).collect())
                    .collect();
                let mut out = vec![0xFFu8; (n + 2) * dt.size()];
                let spans: Vec<HostSpan> = bufs
                    .iter_mut()
                    .map(|b| HostSpan {
                        ptr: b.as_mut_ptr(),
                        len: b.len(),
                    })
                    .collect();
                let l = HostLaunch {
                    inputs: &spans,
                    args: &[],
                    output: HostSpan {
                        ptr: out.as_mut_ptr(),
                        len: out.len(),
                    },
                    n: n as u64,
                    params: &p,
                    threads,
                    checked: threads == 3,
                    control: None,
                };
                // SAFETY: every span is a live Vec of exactly `len` bytes.
                unsafe { k.launch(&l) }.unwrap();
                for i in 0..n {
                    let args: Vec<f64> = xs.iter().map(|v| v[i]).collect();
                    let want = dt.round(f(&args, &p));
                    let got = dt.decode(&out[i * dt.size()..(i + 1) * dt.size()]);
                    let ok = if tol == 0.0 {
                        got.to_bits() == want.to_bits()
                    } else {
                        // Relative to the result and the input: gelu's
                        // `1 + erf(x)` cancels for negative x, where the
                        // result is far smaller than the terms.
                        (got - want).abs() <= tol * (want.abs() + args[0].abs())
                    };
                    assert!(ok, "{file} n={n} i={i} x={args:?}: got {got}, want {want}");
                }
                assert!(
                    out[n * dt.size()..].iter().all(|b| *b == 0xFF),
                    "{file} n={n}"
                );
            }
        }
    }
}

/// `relu_f32_G.ptx`'s kernel and callee, with the callee's body and the
/// call site given.
fn relu(callee_params: &str, callee_body: &str, call: &str, extra: &str) -> String {
    format!(
        r#".version 9.0
.target sm_90
.address_size 64
{extra}
.func  (.param .b32 func_retval0) fmaxf({callee_params});

.visible .entry relu_f32(
	.param .u64 relu_f32_param_0,
	.param .u64 relu_f32_param_1,
	.param .u64 relu_f32_param_2
)
{{
	.reg .pred 	%p<3>;
	.reg .f32 	%f<3>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<13>;
	ld.param.u64 	%rd2, [relu_f32_param_0];
	ld.param.u64 	%rd3, [relu_f32_param_1];
	ld.param.u64 	%rd4, [relu_f32_param_2];
	mov.u32 	%r1, %ctaid.x;
	cvt.u64.u32 	%rd5, %r1;
	mov.u32 	%r2, %ntid.x;
	cvt.u64.u32 	%rd6, %r2;
	mul.lo.s64 	%rd7, %rd5, %rd6;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd8, %r3;
	add.s64 	%rd1, %rd7, %rd8;
	setp.lt.s64 	%p1, %rd1, %rd4;
	not.pred 	%p2, %p1;
	@%p2 bra 	$L__BB0_2;
	bra.uni 	$L__BB0_1;
$L__BB0_1:
	shl.b64 	%rd9, %rd1, 2;
	add.s64 	%rd10, %rd2, %rd9;
	ld.f32 	%f1, [%rd10];
	{{
	.param .b32 param0;
	st.param.f32 	[param0+0], %f1;
	.param .b32 param1;
	st.param.f32 	[param1+0], 0f00000000;
	.param .b32 retval0;
	{call}
	ld.param.f32 	%f2, [retval0+0];
	}}
	shl.b64 	%rd11, %rd1, 2;
	add.s64 	%rd12, %rd3, %rd11;
	st.f32 	[%rd12], %f2;
	bra.uni 	$L__BB0_2;
$L__BB0_2:
	ret;
}}
.func  (.param .b32 func_retval0) fmaxf({callee_params})
{{
{callee_body}
}}
"#
    )
}

const PARAMS: &str = ".param .b32 fmaxf_param_0, .param .b32 fmaxf_param_1";
const BODY: &str = "
	.reg .f32 	%f<4>;
	ld.param.f32 	%f1, [fmaxf_param_0];
	ld.param.f32 	%f2, [fmaxf_param_1];
	max.f32 	%f3, %f1, %f2;
	st.param.f32 	[func_retval0+0], %f3;
	ret;";
const CALL: &str = "call.uni (retval0), fmaxf, (param0, param1);";

#[test]
fn the_hand_written_relu_is_accepted_and_runs() {
    let text = relu(PARAMS, BODY, CALL, "");
    let c = ptx::canonicalize_with(&text, "relu_f32", None, Families::ALL).unwrap();
    assert!(!c.text.contains("call") && !c.text.contains(".param .b32 param"));
}

#[test]
fn recursion_is_refused() {
    let body = BODY.replace(
        "max.f32 	%f3, %f1, %f2;",
        "{ .param .b32 a; st.param.f32 [a+0], %f1; .param .b32 b; st.param.f32 [b+0], %f2;
           .param .b32 r; call.uni (r), fmaxf, (a, b); ld.param.f32 %f3, [r+0]; }",
    );
    assert_eq!(
        reason(&relu(PARAMS, &body, CALL, ""), "relu_f32"),
        "call_recursion"
    );
}

#[test]
fn an_indirect_call_is_refused() {
    let call = "mov.u64 %rd5, fmaxf; call.uni (retval0), %rd5, (param0, param1), proto;";
    let extra = "";
    let text = relu(PARAMS, BODY, call, extra);
    assert_eq!(reason(&text, "relu_f32"), "call_indirect");
    let call = "call.uni (retval0), fmaxf, (param0, param1), proto;";
    assert_eq!(
        reason(&relu(PARAMS, BODY, call, ""), "relu_f32"),
        "call_indirect"
    );
}

#[test]
fn an_extern_call_is_refused() {
    let text = relu(
        PARAMS,
        BODY,
        &CALL.replace("fmaxf", "fminf"),
        ".extern .func (.param .b32 r) fminf(.param .b32 a, .param .b32 b);",
    );
    assert_eq!(reason(&text, "relu_f32"), "call_extern");
}

#[test]
fn a_callee_reading_a_param_it_was_not_passed_is_refused() {
    // A third param the call does not pass.
    let body = BODY.replace("[fmaxf_param_1]", "[fmaxf_param_2]");
    assert_eq!(
        reason(&relu(PARAMS, &body, CALL, ""), "relu_f32"),
        "call_arguments"
    );
    // The entry's param, read from inside the callee.
    let body = BODY.replace("[fmaxf_param_1]", "[relu_f32_param_0]");
    assert_eq!(
        reason(&relu(PARAMS, &body, CALL, ""), "relu_f32"),
        "call_arguments"
    );
    // An arity mismatch.
    let call = "call.uni (retval0), fmaxf, (param0);";
    assert_eq!(
        reason(&relu(PARAMS, BODY, call, ""), "relu_f32"),
        "call_arguments"
    );
}

#[test]
fn a_callee_naming_a_register_it_does_not_declare_is_refused() {
    // `%rd10` is the caller's pointer: inlined, it would resolve to it.
    let body = BODY.replace("max.f32 	%f3, %f1, %f2;", "ld.f32 %f3, [%rd10+4];");
    assert_eq!(
        reason(&relu(PARAMS, &body, CALL, ""), "relu_f32"),
        "call_arguments"
    );
    // `%f7` is past the callee's `%f<4>` (and the caller declares none).
    let body = BODY.replace("max.f32 	%f3, %f1, %f2;", "max.f32 	%f3, %f1, %f7;");
    assert_eq!(
        reason(&relu(PARAMS, &body, CALL, ""), "relu_f32"),
        "call_arguments"
    );
}

/// A callee given the output pointer and the index stores one element past
/// the caller's footprint: the inlined store is proved like the caller's
/// own, and refused.
#[test]
fn a_callee_storing_outside_the_footprint_is_refused() {
    let params = ".param .b64 fmaxf_param_0, .param .b32 fmaxf_param_1";
    let body = "
	.reg .b64 	%rd<3>;
	.reg .f32 	%f<2>;
	ld.param.u64 	%rd1, [fmaxf_param_0];
	ld.param.f32 	%f1, [fmaxf_param_1];
	st.f32 	[%rd1+4], %f1;
	st.param.f32 	[func_retval0+0], %f1;
	ret;";
    let text = relu(params, body, CALL, "")
        .replace(
            "st.param.f32 	[param0+0], %f1;",
            "shl.b64 %rd11, %rd1, 2; add.s64 %rd12, %rd3, %rd11; st.param.b64 [param0+0], %rd12;",
        )
        .replace(".param .b32 param0;", ".param .b64 param0;")
        .replace(
            "st.param.f32 	[param1+0], 0f00000000;",
            "st.param.f32 	[param1+0], %f1;",
        );
    // The in-bounds store (offset 0) is accepted: the attack is the `+4`.
    let fine = text.replace("[%rd1+4]", "[%rd1]");
    ptx::canonicalize_with(&fine, "relu_f32", None, Families::ALL).unwrap();
    let got = reason(&text, "relu_f32");
    assert_eq!(got, "non_elementwise_address");
}

/// `relu` through a local frame of 8 bytes: `x` is stored at byte 4
/// through the generic `%SP` and read back through `.local` `%SPL`.
fn relu_with_frame(store: &str, load: &str) -> String {
    let text = relu(PARAMS, BODY, CALL, "")
        .replace(
            ".reg .pred \t%p<3>;",
            ".local .align 8 .b8 __local_depot0[8];\n\t.reg .b64 %SP;\n\t.reg .b64 %SPL;\n\t.reg .pred \t%p<3>;",
        )
        .replace(
            "ld.f32 \t%f1, [%rd10];",
            &format!(
                "ld.f32 \t%f1, [%rd10];\n\tmov.u64 %SPL, __local_depot0;\n\tcvta.local.u64 %SP, %SPL;\n\t{store}\n\t{load}"
            ),
        )
        .replace("st.param.f32 \t[param0+0], %f1;", "st.param.f32 \t[param0+0], %f0;");
    assert!(text.contains("__local_depot0[8]") && text.contains(load) && text.contains("%f0;"));
    text
}

/// A local frame whose every access is at a constant offset inside it is
/// promoted to registers (`inline::promote_frame`): accepted, no local
/// memory in the canonical text, and it runs exactly on the host.
#[test]
fn a_local_frame_used_inside_its_bounds_runs_exactly() {
    let text = relu_with_frame("st.f32 [%SP+4], %f1;", "ld.local.f32 %f0, [%SPL+4];");
    let c = ptx::canonicalize_with(&text, "relu_f32", None, Families::ALL).unwrap();
    assert!(
        !c.text.contains("local") && !c.text.contains("call"),
        "{}",
        c.text
    );
    let k = HostKernel::compile_with(&text, "relu_f32", Families::ALL).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(9);
    let n = 777usize;
    let x: Vec<f32> = (0..n).map(|_| r.random_range(-4.0f32..4.0)).collect();
    let mut input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; (n + 1) * 4];
    let spans = [HostSpan {
        ptr: input.as_mut_ptr(),
        len: input.len(),
    }];
    let l = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n: n as u64,
        params: &[],
        threads: 3,
        checked: true,
        control: None,
    };
    // SAFETY: both spans are live Vecs of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    for (i, v) in x.iter().enumerate() {
        let got = f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(got.to_bits(), v.max(0.0).to_bits(), "i={i} x={v}");
    }
    assert!(out[n * 4..].iter().all(|b| *b == 0xFF));
}

/// A local access one byte past its frame is refused, naming it.
#[test]
fn a_local_access_past_its_frame_is_refused() {
    let past = relu_with_frame("st.f32 [%SP+5], %f1;", "ld.local.f32 %f0, [%SPL+4];");
    match ptx::canonicalize_with(&past, "relu_f32", None, Families::ALL) {
        Err(PtxError::NonScalarAbi {
            sub_reason,
            explanation,
            ..
        }) => {
            assert_eq!(sub_reason, "local_memory");
            assert!(
                explanation.contains("leaves the local frame"),
                "{explanation}"
            );
        }
        other => panic!("{other:?}"),
    }
    let past = relu_with_frame("st.f32 [%SP+4], %f1;", "ld.local.f32 %f0, [%SPL+8];");
    assert_eq!(reason(&past, "relu_f32"), "local_memory");
    let before = relu_with_frame("st.f32 [%SP+4], %f1;", "ld.local.f32 %f0, [%SPL-4];");
    assert_eq!(reason(&before, "relu_f32"), "local_memory");
}

/// CUDA does not zero local memory: a read of local bytes no store wrote
/// is an uninitialised read, refused.
#[test]
fn an_uninitialised_local_read_is_refused() {
    let uninit = relu_with_frame("st.f32 [%SP+4], %f1;", "ld.local.f32 %f0, [%SPL+0];");
    assert_eq!(reason(&uninit, "relu_f32"), "undefined_register");
    // Written on one path only.
    let one_path = relu_with_frame("@%p1 st.f32 [%SP+4], %f1;", "ld.local.f32 %f0, [%SPL+4];");
    assert_ne!(
        ptx::canonicalize_with(&one_path, "relu_f32", None, Families::ALL).map(|_| ()),
        Ok(())
    );
}

/// A frame pointer used other than as an address (here: stored to global
/// memory) leaves the frame unpromoted, refused as local memory.
#[test]
fn an_escaping_frame_pointer_is_refused() {
    let escape = relu_with_frame(
        "st.f32 [%SP+4], %f1;",
        "ld.local.f32 %f0, [%SPL+4];\n\tst.u64 [%rd10], %SP;",
    );
    assert_eq!(reason(&escape, "relu_f32"), "local_memory");
}

/// An argument the caller declares but never stores: the callee's read of
/// it is a read of a register never written.
#[test]
fn an_argument_never_stored_is_an_undefined_read() {
    let text = relu(PARAMS, BODY, CALL, "").replace("st.param.f32 	[param1+0], 0f00000000;", "");
    assert_eq!(reason(&text, "relu_f32"), "undefined_register");
}

/// Nested calls, two call sites of one callee, a guarded early `ret` and
/// labels in the callee: `g(x) = x < 0 ? 0 : fmaxf(x, 0)` inlined twice
/// (`out = g(g(x))`), run on the host against relu.
#[test]
fn nested_calls_with_early_returns_run_exactly() {
    let g = "
.func  (.param .b32 g_ret) g(.param .b32 g_x)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<4>;
	ld.param.f32 	%f1, [g_x];
	setp.lt.f32 	%p1, %f1, 0f00000000;
	@%p1 bra 	$L__neg;
	{
	.param .b32 param0;
	st.param.f32 	[param0+0], %f1;
	.param .b32 param1;
	st.param.f32 [param1+0], 0f00000000; // (kept: the entry's is removed)
	.param .b32 retval0;
	call.uni (retval0), fmaxf, (param0, param1);
	ld.param.f32 	%f2, [retval0+0];
	}
	st.param.f32 	[g_ret+0], %f2;
	ret;
$L__neg:
	mov.f32 	%f3, 0f00000000;
	st.param.f32 	[g_ret+0], %f3;
	ret;
}
";
    let twice = "call.uni (retval0), g, (param0);
	ld.param.f32 	%f2, [retval0+0];
	}
	{
	.param .b32 param0;
	st.param.f32 	[param0+0], %f2;
	.param .b32 retval0;
	call.uni (retval0), g, (param0);";
    let text = relu(PARAMS, BODY, twice, g).replace(
        ".param .b32 param1;\n\tst.param.f32 \t[param1+0], 0f00000000;\n",
        "",
    );
    let c = ptx::canonicalize_with(&text, "relu_f32", None, Families::ALL).unwrap();
    assert!(!c.text.contains("call"));
    let k = HostKernel::compile_with(&text, "relu_f32", Families::ALL).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|_| r.random_range(-4.0f32..4.0)).collect();
    let mut input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; n * 4];
    let spans = [HostSpan {
        ptr: input.as_mut_ptr(),
        len: input.len(),
    }];
    let l = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n: n as u64,
        params: &[],
        threads: 2,
        checked: true,
        control: None,
    };
    // SAFETY: both spans are live Vecs of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    for (i, v) in x.iter().enumerate() {
        let got = f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(got.to_bits(), v.max(0.0).to_bits(), "i={i} x={v}");
    }
}
