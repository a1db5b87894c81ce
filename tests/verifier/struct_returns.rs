//! Struct returns, carry chains and NVRTC's double `sin` (issue 21): the
//! slow path of `sin` calls `__internal_trig_reduction_slowpathd`, a
//! `.func` returning a 16-byte struct (an f64 and an i32), which fills a
//! 40-byte local frame in a loop bounded by another register and
//! multiplies with carry chains (`mad.lo.cc`/`madc`/`addc`/`subc`). The
//! struct return is inlined as one register per field, the loop is proved
//! inside its frame on every path, the carries become plain instructions
//! with an explicit carry predicate; every kernel runs on the host engine
//! against a reference, and each attack is refused with its exact reason.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::{refusal, rng};
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::Rng;

fn jit(file: &str) -> String {
    let path = format!("{}/tests/corpus/jit/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

/// Runs `entry(x, out, n)` of `text` on the host engine over the 8-byte
/// elements `x`, the output poisoned, and checks the tail past `n` is
/// untouched.
fn run(text: &str, entry: &str, x: &[u64], threads: usize) -> Vec<u64> {
    let k = HostKernel::compile_with(text, entry, Families::ALL)
        .unwrap_or_else(|e| panic!("{entry}: {e}"));
    let n = x.len();
    let mut input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    input.extend([0xAB; 8]);
    let mut out = vec![0xFFu8; (n + 2) * 8];
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
        threads,
        checked: threads > 1,
        control: None,
    };
    // SAFETY: both spans are live Vecs of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(
        out[n * 8..].iter().all(|b| *b == 0xFF),
        "{entry}: tail written"
    );
    out.chunks(8)
        .take(n)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The distance in ulps of `want` between `got` and `want`.
fn ulps(got: f64, want: f64) -> f64 {
    let ulp = (f64::from_bits(want.abs().to_bits() + 1) - want.abs()).max(f64::from_bits(1));
    (got - want).abs() / ulp
}

/// Arguments of both paths: |x| < 2^31 (the fast path: Cody-Waite), past
/// 2^31 up to f64::MAX (the Payne-Hanek slow path, the struct-returning
/// callee), values next to multiples of pi/2, and the special values.
fn arguments(r: &mut rand::rngs::StdRng, n: usize) -> Vec<f64> {
    let mut xs = vec![
        0.0,
        -0.0,
        1.0,
        2147483648.0,
        -2147483648.0,
        2147483647.0,
        1.0e300,
        f64::MAX,
        -f64::MAX,
        f64::MIN_POSITIVE,
        5.0e-324,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1.0e22,
        6381956970095103.0 * 2f64.powi(797),
    ];
    while xs.len() < n {
        let x = match xs.len() % 5 {
            0 => r.random_range(-10.0f64..10.0),
            1 => {
                let k = f64::from(r.random_range(-1_000_000_000i32..1_000_000_000));
                let near = k * std::f64::consts::FRAC_PI_2;
                f64::from_bits(near.to_bits().wrapping_add(r.random_range(0..3)))
            }
            2 => {
                // The slow path: 2^31 <= |x|, every exponent up to 1023.
                let e = r.random_range(31..1024);
                let m = r.random_range(1.0f64..2.0);
                let x = m * 2f64.powi(e);
                if x.is_finite() {
                    x
                } else {
                    f64::MAX
                }
            }
            3 => -r.random_range(2147483648.0f64..1.0e18),
            _ => r.random_range(-2.0e9f64..2.0e9),
        };
        xs.push(x);
    }
    xs
}

/// NVRTC's double `sin` (-O3, --use_fast_math and -G) is accepted, lowered
/// with no call, no local memory and no carry left, and runs on the host
/// engine within 2 ulp of `f64::sin` (CUDA documents 2 ulp for `sin`;
/// `f64::sin` is the platform's, within 1 ulp) on fresh random arguments,
/// about 40 % of them past 2^31 (the slow path); the special values are
/// exact (`sin(±0) = ±0`, `sin(±inf)` and `sin(NaN)` NaN).
#[test]
fn double_sin_matches_the_reference() {
    let mut r = rng("double sin");
    for file in [
        "nvrtc/sin_f64_O3.ptx",
        "nvrtc/sin_f64_fast.ptx",
        "nvrtc/sin_f64_G.ptx",
    ] {
        let text = jit(file);
        assert!(text.contains("func_retval0[16]"), "{file}");
        let canonical = ptx::canonicalize_with(&text, "sin_f64", None, Families::ALL)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        for gone in ["call", ".local", "addc", "madc", ".cc.", "__local_depot"] {
            assert!(!canonical.text.contains(gone), "{file}: `{gone}` left");
        }
        let xs = arguments(&mut r, 600);
        let slow = xs.iter().filter(|x| x.abs() >= 2147483648.0).count();
        assert!(slow >= 200, "{file}: {slow} slow-path arguments");
        for threads in [1, 3] {
            let bits: Vec<u64> = xs.iter().map(|x| x.to_bits()).collect();
            let got = run(&text, "sin_f64", &bits, threads);
            for (x, g) in xs.iter().zip(&got) {
                let g = f64::from_bits(*g);
                let want = x.sin();
                if want.is_nan() {
                    assert!(g.is_nan(), "{file}: sin({x:e}) = {g:e}, want NaN");
                } else if *x == 0.0 {
                    assert_eq!(g.to_bits(), x.to_bits(), "{file}: sin({x:e})");
                } else {
                    let d = ulps(g, want);
                    assert!(
                        d <= 2.0,
                        "{file}: sin({x:e}) = {g:e}, want {want:e} ({d} ulps)"
                    );
                }
            }
        }
    }
}

/// The nvcc corpus's `sin_f64_local` (sm_80, sm_90, sm_100; plain,
/// lineinfo, fastmath) is accepted and runs on the host engine within
/// 2 ulp of `f64::sin`, slow path included (sm_100's loop counts to a
/// constant from `-(e + bound)`, bounded per split value of `e`).
#[test]
fn nvcc_double_sin_matches_the_reference() {
    let mut r = rng("nvcc double sin");
    for sm in ["sm_80", "sm_90", "sm_100"] {
        for v in ["", ".lineinfo", ".fastmath"] {
            let file = format!("../nvcc/refused-ptx/local_memory.{sm}{v}.ptx");
            let text = jit(&file);
            let xs = arguments(&mut r, 150);
            let bits: Vec<u64> = xs.iter().map(|x| x.to_bits()).collect();
            let got = run(&text, "sin_f64_local", &bits, 1);
            for (x, g) in xs.iter().zip(&got) {
                let (g, want) = (f64::from_bits(*g), x.sin());
                let ok = if want.is_nan() {
                    g.is_nan()
                } else {
                    ulps(g, want) <= 2.0 && (*x != 0.0 || g.to_bits() == x.to_bits())
                };
                assert!(ok, "{file}: sin({x:e}) = {g:e}, want {want:e}");
            }
        }
    }
}

/// The double `sin` kernel with `from` replaced by `to`.
fn sin_with(from: &str, to: &str) -> String {
    let text = jit("nvrtc/sin_f64_O3.ptx");
    assert!(text.contains(from), "{from}");
    text.replacen(from, to, 1)
}

/// A struct return read past its 16 bytes, or misaligned, is refused
/// `call_arguments` naming the access.
#[test]
fn a_struct_return_read_past_its_size_is_refused() {
    for (to, why) in [
        (
            "ld.param.b32 \t%r12, [retval0+16];",
            "leaves the struct `retval0` of 16 bytes",
        ),
        (
            "ld.param.b32 \t%r12, [retval0+-4];",
            "leaves the struct `retval0` of 16 bytes",
        ),
        (
            "ld.param.b32 \t%r12, [retval0+6];",
            "is not aligned to its width 4",
        ),
        (
            "ld.param.b32 \t%r12, [retval0+4];",
            "overlaps the field at byte 0",
        ),
    ] {
        let text = sin_with("ld.param.b32 \t%r12, [retval0+8];", to);
        let (reason, explanation) = refusal(&text, "sin_f64");
        assert_eq!(reason, "call_arguments", "{to}");
        assert!(explanation.contains(why), "{to}: {explanation}");
    }
    // A callee writing past its struct return is refused the same way.
    let text = sin_with(
        "st.param.b32 \t[func_retval0+8], %r37;",
        "st.param.b32 \t[func_retval0+16], %r37;",
    );
    let (reason, explanation) = refusal(&text, "sin_f64");
    assert_eq!(reason, "call_arguments");
    assert!(explanation.contains("func_retval0"), "{explanation}");
}

/// A callee that writes only half of its struct return: the caller's read
/// of the other half reads a register no path wrote, refused
/// `undefined_register` (never another kernel's data); so is a read of
/// padding the callee never writes (bytes 12..16).
#[test]
fn a_half_written_struct_return_is_refused() {
    let half = sin_with("st.param.b32 \t[func_retval0+8], %r37;", "");
    let padding = sin_with(
        "ld.param.b32 \t%r12, [retval0+8];",
        "ld.param.b32 \t%r12, [retval0+12];",
    );
    for text in [half, padding] {
        let (reason, explanation) = refusal(&text, "sin_f64");
        assert_eq!(reason, "undefined_register", "{explanation}");
    }
}

/// A scalar-ABI kernel over u32 elements with a 16-byte frame filled in a
/// loop `k < bound` (`frame[k] = x + k`) and read back at index `%r7`;
/// `prelude` computes `%r9` (the bound) and `%r7` from `x` (`%r4`).
fn framed(prelude: &str) -> String {
    framed_sized(16, prelude)
}

/// [`framed`] with a frame of `size` bytes.
fn framed_sized(size: u32, prelude: &str) -> String {
    format!(
        r#".version 9.0
.target sm_90
.address_size 64

.visible .entry framed(
	.param .u64 framed_param_0,
	.param .u64 framed_param_1,
	.param .u64 framed_param_2
)
{{
	.local .align 4 .b8 	__local_depot0[{size}];
	.reg .b64 	%SPL;
	.reg .pred 	%p<8>;
	.reg .b32 	%r<24>;
	.reg .b64 	%rd<32>;

	mov.u64 	%SPL, __local_depot0;
	ld.param.u64 	%rd1, [framed_param_0];
	ld.param.u64 	%rd2, [framed_param_1];
	ld.param.u64 	%rd3, [framed_param_2];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd4, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd5, %r3;
	add.s64 	%rd6, %rd4, %rd5;
	setp.ge.s64 	%p1, %rd6, %rd3;
	@%p1 bra 	$L__END;
	cvta.to.global.u64 	%rd7, %rd1;
	shl.b64 	%rd8, %rd6, 2;
	add.s64 	%rd9, %rd7, %rd8;
	ld.global.u32 	%r4, [%rd9];
	{prelude}
	mov.u32 	%r5, 0;
	add.u64 	%rd10, %SPL, 0;
	setp.ge.u32 	%p3, %r5, %r9;
	@%p3 bra 	$L__READ;
$L__FILL:
	add.s32 	%r6, %r4, %r5;
	st.local.u32 	[%rd10], %r6;
	add.s64 	%rd10, %rd10, 4;
	add.s32 	%r5, %r5, 1;
	setp.lt.u32 	%p2, %r5, %r9;
	@%p2 bra 	$L__FILL;
$L__READ:
	mul.wide.u32 	%rd11, %r7, 4;
	add.s64 	%rd12, %SPL, %rd11;
	ld.local.u32 	%r8, [%rd12];
	cvta.to.global.u64 	%rd13, %rd2;
	add.s64 	%rd14, %rd13, %rd8;
	st.global.u32 	[%rd14], %r8;
$L__END:
	ret;
}}
"#
    )
}

/// Runs `framed` over u32 elements on the host engine.
fn run_framed(text: &str, x: &[u32], threads: usize) -> Vec<u32> {
    let k = HostKernel::compile_with(text, "framed", Families::ALL).unwrap();
    let n = x.len();
    let mut input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; (n + 2) * 4];
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
        threads,
        checked: threads > 1,
        control: None,
    };
    // SAFETY: both spans are live Vecs of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(out[n * 4..].iter().all(|b| *b == 0xFF), "tail written");
    out.chunks(4)
        .take(n)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A loop bounded by another register: accepted when that register has a
/// few values, each inside the frame (one path per value), and runs
/// exactly (bytes the loop did not write read 0); refused naming the
/// store when the bound is data (nothing bounds it) or can pass the frame.
#[test]
fn a_register_loop_bound_is_proved_per_value_or_refused() {
    let bounded =
        framed("and.b32 \t%r9, %r4, 3;\n\tshr.u32 \t%r10, %r4, 2;\n\tand.b32 \t%r7, %r10, 3;");
    let mut r = rng("register loop bound");
    let x: Vec<u32> = (0..300).map(|_| r.random()).collect();
    for threads in [1, 3] {
        let got = run_framed(&bounded, &x, threads);
        for (x, g) in x.iter().zip(&got) {
            let (b, i) = (x & 3, (x >> 2) & 3);
            let want = if i < b { x.wrapping_add(i) } else { 0 };
            assert_eq!(*g, want, "x = {x:#x}");
        }
    }
    for (prelude, offsets) in [
        // A bound nothing bounds.
        (
            "mov.u32 \t%r9, %r4;\n\tmov.u32 \t%r7, 0;",
            "may access byte offsets",
        ),
        // A bound of up to 7 slots in a frame of 4.
        (
            "and.b32 \t%r9, %r4, 7;\n\tmov.u32 \t%r7, 0;",
            "byte offsets 16..=16",
        ),
    ] {
        let (reason, explanation) = refusal(&framed(prelude), "framed");
        assert_eq!(reason, "local_memory", "{prelude}");
        assert!(
            explanation.contains("`st.local.u32`") && explanation.contains(offsets),
            "{prelude}: {explanation}"
        );
    }
}

/// `mov.b64 {lo, hi}`: the halves of a value the proof bounds are
/// bounded; the high half of `(x << 32) & 0x3_0000_0000` indexes a 4-slot
/// frame exactly, and of `& 0x7_0000_0000` past it (refused naming the
/// load and the offsets).
#[test]
fn split_halves_index_the_frame_exactly_or_are_refused() {
    let halves = |mask: &str| {
        framed(&format!(
            "mov.u32 \t%r9, 4;\n\tcvt.u64.u32 \t%rd20, %r4;\n\tshl.b64 \t%rd21, %rd20, 32;\n\tand.b64 \t%rd22, %rd21, {mask};\n\tmov.b64 \t{{%r11, %r7}}, %rd22;"
        ))
    };
    let inside = halves("12884901888");
    let mut r = rng("halves");
    let x: Vec<u32> = (0..300).map(|_| r.random()).collect();
    let got = run_framed(&inside, &x, 1);
    for (x, g) in x.iter().zip(&got) {
        assert_eq!(*g, x.wrapping_add(x & 3), "x = {x:#x}");
    }
    let (reason, explanation) = refusal(&halves("30064771072"), "framed");
    assert_eq!(reason, "local_memory");
    assert!(
        explanation.contains("`ld.local.u32` may access byte offsets 0..=28"),
        "{explanation}"
    );
}

/// A scalar-ABI kernel `out[i] = f(a[i], b[i])` over u64 elements: `body`
/// reads `%rd10` (a), `%rd11` (b), their halves `%r10`/`%r11` (a lo/hi)
/// and `%r12`/`%r13` (b lo/hi), and leaves the result in `%rd20`.
fn carried(body: &str) -> String {
    format!(
        r#".version 9.0
.target sm_90
.address_size 64

.visible .entry carried(
	.param .u64 carried_param_0,
	.param .u64 carried_param_1,
	.param .u64 carried_param_2,
	.param .u64 carried_param_3
)
{{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<40>;
	.reg .b64 	%rd<40>;

	ld.param.u64 	%rd1, [carried_param_0];
	ld.param.u64 	%rd2, [carried_param_1];
	ld.param.u64 	%rd3, [carried_param_2];
	ld.param.u64 	%rd4, [carried_param_3];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd5, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd6, %r3;
	add.s64 	%rd7, %rd5, %rd6;
	setp.ge.s64 	%p1, %rd7, %rd4;
	@%p1 bra 	$L__END;
	shl.b64 	%rd8, %rd7, 3;
	cvta.to.global.u64 	%rd12, %rd1;
	add.s64 	%rd13, %rd12, %rd8;
	ld.global.u64 	%rd10, [%rd13];
	cvta.to.global.u64 	%rd14, %rd2;
	add.s64 	%rd15, %rd14, %rd8;
	ld.global.u64 	%rd11, [%rd15];
	mov.b64 	{{%r10, %r11}}, %rd10;
	mov.b64 	{{%r12, %r13}}, %rd11;
	{body}
	cvta.to.global.u64 	%rd16, %rd3;
	add.s64 	%rd17, %rd16, %rd8;
	st.global.u64 	[%rd17], %rd20;
$L__END:
	ret;
}}
"#
    )
}

/// Runs `carried` over `a`, `b` on the host engine.
fn run_carried(text: &str, a: &[u64], b: &[u64], threads: usize) -> Vec<u64> {
    let k = HostKernel::compile_with(text, "carried", Families::ALL)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let n = a.len();
    let mut ia: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut ib: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; (n + 2) * 8];
    let spans = [
        HostSpan {
            ptr: ia.as_mut_ptr(),
            len: ia.len(),
        },
        HostSpan {
            ptr: ib.as_mut_ptr(),
            len: ib.len(),
        },
    ];
    let l = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n: n as u64,
        params: &[],
        threads,
        checked: threads > 1,
        control: None,
    };
    // SAFETY: every span is a live Vec of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(out[n * 8..].iter().all(|b| *b == 0xFF), "tail written");
    out.chunks(8)
        .take(n)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Each carry instruction, lowered, runs exactly: every kernel below is
/// checked on fresh random operands (and the edge values 0, 1, 2^32 - 1,
/// 2^64 - 1 paired with each other) against a u128 reference, every
/// element; the canonical text keeps no carry.
#[test]
fn carry_chains_match_a_u128_reference() {
    type Reference = fn(u64, u64) -> u64;
    let cases: &[(&str, &str, Reference)] = &[
        // 64-bit add through a 32-bit chain: add.cc, addc.
        (
            "add.cc/addc.u32",
            "add.cc.u32 \t%r20, %r10, %r12;\n\taddc.u32 \t%r21, %r11, %r13;\n\tmov.b64 \t%rd20, {%r20, %r21};",
            |a, b| a.wrapping_add(b),
        ),
        // The carry out of a 64-bit add: add.cc.u64, addc.u64 of zeros.
        (
            "add.cc/addc.u64",
            "add.cc.u64 \t%rd21, %rd10, %rd11;\n\taddc.u64 \t%rd20, 0, 0;",
            |a, b| ((u128::from(a) + u128::from(b)) >> 64) as u64,
        ),
        // A three-word chain: addc.cc passes its carry on.
        (
            "addc.cc.u32",
            "add.cc.u32 \t%r20, %r10, %r12;\n\taddc.cc.u32 \t%r21, %r11, %r13;\n\taddc.u32 \t%r22, 0, 0;\n\tmov.b64 \t%rd20, {%r21, %r22};",
            |a, b| ((u128::from(a) + u128::from(b)) >> 32) as u64,
        ),
        // 64-bit subtract through a 32-bit chain: sub.cc, subc.cc, subc.
        (
            "sub.cc/subc.u32",
            "sub.cc.u32 \t%r20, %r10, %r12;\n\tsubc.cc.u32 \t%r21, %r11, %r13;\n\tsubc.u32 \t%r22, 0, 0;\n\tmov.b64 \t%rd20, {%r21, %r22};",
            |a, b| (u128::from(a).wrapping_sub(u128::from(b)) >> 32) as u64,
        ),
        // The borrow of a 64-bit subtract: 0 or 2^64 - 1.
        (
            "sub.cc/subc.s64",
            "sub.cc.s64 \t%rd21, %rd10, %rd11;\n\tsubc.s64 \t%rd20, 0, 0;",
            |a, b| if a < b { u64::MAX } else { 0 },
        ),
        // double sin's 64 x 64 + 64 -> 128 multiply (its loop body), low and
        // high words summed: mad.lo.cc, madc.hi.cc, madc.hi, madc.lo.cc, addc.
        (
            "mad.cc/madc.u32",
            "mov.b64 \t{%r14, %r15}, %rd11;\n\tmad.lo.cc.u32 \t%r0, %r10, %r12, %r14;\n\tmadc.hi.cc.u32 \t%r1, %r10, %r12, %r15;\n\tmadc.hi.u32 \t%r2, %r10, %r13, 0;\n\tmad.lo.cc.u32 \t%r1, %r10, %r13, %r1;\n\tmadc.hi.cc.u32 \t%r2, %r11, %r12, %r2;\n\tmadc.hi.u32 \t%r3, %r11, %r13, 0;\n\tmad.lo.cc.u32 \t%r1, %r11, %r12, %r1;\n\tmadc.lo.cc.u32 \t%r2, %r11, %r13, %r2;\n\taddc.u32 \t%r3, %r3, 0;\n\tmov.b64 \t%rd21, {%r0, %r1};\n\tmov.b64 \t%rd22, {%r2, %r3};\n\txor.b64 \t%rd20, %rd21, %rd22;",
            |a, b| {
                let p = u128::from(a) * u128::from(b) + u128::from(b);
                (p as u64) ^ ((p >> 64) as u64)
            },
        ),
        // The signed high half: mad.hi.cc.s32 multiplies signed, adds
        // unsigned with a carry out.
        (
            "mad.hi.cc.s32",
            "mad.hi.cc.s32 \t%r20, %r10, %r12, %r11;\n\taddc.u32 \t%r21, 0, 0;\n\tmov.b64 \t%rd20, {%r20, %r21};",
            |a, b| {
                let m = ((i64::from(a as u32 as i32) * i64::from(b as u32 as i32)) >> 32) as u32;
                let s = u64::from(m) + (a >> 32);
                (s & 0xFFFF_FFFF) | ((s >> 32) << 32)
            },
        ),
        // madc.lo on 64 bits, carry in from add.cc.u64.
        (
            "madc.lo.u64",
            "add.cc.u64 \t%rd21, %rd10, %rd11;\n\tmadc.lo.u64 \t%rd20, %rd10, %rd11, %rd10;",
            |a, b| {
                let c = ((u128::from(a) + u128::from(b)) >> 64) as u64;
                a.wrapping_mul(b).wrapping_add(a).wrapping_add(c)
            },
        ),
    ];
    let mut r = rng("carry chains");
    let edges = [0u64, 1, 0xFFFF_FFFF, 0x1_0000_0000, u64::MAX, u64::MAX - 1];
    let mut a: Vec<u64> = Vec::new();
    let mut b: Vec<u64> = Vec::new();
    for x in edges {
        for y in edges {
            a.push(x);
            b.push(y);
        }
    }
    while a.len() < 500 {
        a.push(r.random());
        b.push(if r.random_bool(0.2) {
            a[a.len() - 1]
        } else {
            r.random()
        });
    }
    for (name, body, f) in cases {
        let text = carried(body);
        let canonical = ptx::canonicalize_with(&text, "carried", None, Families::ALL)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for gone in [".cc.", "addc", "subc", "madc"] {
            assert!(!canonical.text.contains(gone), "{name}: `{gone}` left");
        }
        for threads in [1, 3] {
            let got = run_carried(&text, &a, &b, threads);
            for ((x, y), g) in a.iter().zip(&b).zip(&got) {
                assert_eq!(*g, f(*x, *y), "{name}: a = {x:#x}, b = {y:#x}");
            }
        }
    }
}

/// A carry read where no `.cc` instruction wrote the flag on some path
/// reads a register never written: refused `undefined_register`; a
/// predicated carry instruction is left as it is and refused by the table.
#[test]
fn an_unset_carry_is_refused() {
    for body in [
        "addc.u32 \t%r20, %r10, %r12;\n\tcvt.u64.u32 \t%rd20, %r20;",
        "setp.eq.u32 \t%p2, %r10, 0;\n\t@%p2 bra \t$L__SKIP;\n\tadd.cc.u32 \t%r21, %r10, %r12;\n$L__SKIP:\n\tmadc.lo.u32 \t%r20, %r10, %r12, 0;\n\tcvt.u64.u32 \t%rd20, %r20;",
    ] {
        let (reason, explanation) = refusal(&carried(body), "carried");
        assert_eq!(reason, "undefined_register", "{body}: {explanation}");
    }
    let guarded = carried(
        "setp.eq.u32 \t%p2, %r10, 0;\n\t@%p2 add.cc.u32 \t%r21, %r10, %r12;\n\taddc.u32 \t%r20, %r10, %r12;\n\tcvt.u64.u32 \t%rd20, %r20;",
    );
    let (reason, explanation) = refusal(&guarded, "carried");
    assert_eq!(reason, "unsupported_instruction");
    assert!(explanation.contains(".cc"), "{explanation}");
}

/// A frame accessed one byte at a time is refused `operand_type` naming
/// the client's first byte access (line and opcode), not the `mov.b8` the
/// lowering would write.
#[test]
fn a_byte_frame_is_refused_naming_the_clients_access() {
    let text = framed("and.b32 \t%r9, %r4, 3;\n\tmov.u32 \t%r7, 1;")
        .replace("st.local.u32", "st.local.u8")
        .replace("ld.local.u32", "ld.local.u8")
        .replace("add.s64 \t%rd10, %rd10, 4;", "add.s64 \t%rd10, %rd10, 1;")
        .replace(
            "mul.wide.u32 \t%rd11, %r7, 4;",
            "mul.wide.u32 \t%rd11, %r7, 1;",
        );
    let line = text
        .lines()
        .position(|l| l.contains("st.local.u8"))
        .unwrap() as u32
        + 1;
    match ptx::canonicalize_with(&text, "framed", None, Families::ALL) {
        Err(PtxError::NonScalarAbi {
            sub_reason,
            explanation,
            line: got,
            ..
        }) => {
            assert_eq!(sub_reason, "operand_type");
            assert_eq!(got, Some(line));
            assert!(
                explanation.starts_with("`st.local.u8` accesses the local frame"),
                "{explanation}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// Ground truth for the split: a fill loop bounded by `x & mask` over a
/// frame of `slots` 4-byte slots, read back at `(x >> 4) % slots`, is
/// accepted exactly when every bound fits the frame (`mask <= slots`),
/// refused `local_memory` naming the loop's store otherwise, and every
/// accepted variant runs exactly on the host engine.
#[test]
fn register_bounds_are_accepted_exactly_when_inside_the_frame() {
    let mut r = rng("register bound sweep");
    let x: Vec<u32> = (0..200).map(|_| r.random()).collect();
    for slots in [2u32, 4, 8] {
        for mask in [1u32, 3, 7, 15, 31] {
            let text = framed_sized(
                slots * 4,
                &format!(
                    "and.b32 \t%r9, %r4, {mask};\n\tshr.u32 \t%r10, %r4, 4;\n\tand.b32 \t%r7, %r10, {};",
                    slots - 1
                ),
            );
            let verdict = ptx::canonicalize_with(&text, "framed", None, Families::ALL);
            if mask <= slots {
                assert!(
                    verdict.is_ok(),
                    "{slots} slots, mask {mask}: {:?}",
                    verdict.err()
                );
                let got = run_framed(&text, &x, 1);
                for (x, g) in x.iter().zip(&got) {
                    let (b, i) = (x & mask, (x >> 4) % slots);
                    let want = if i < b { x.wrapping_add(i) } else { 0 };
                    assert_eq!(*g, want, "{slots} slots, mask {mask}, x = {x:#x}");
                }
            } else {
                let (reason, explanation) = refusal(&text, "framed");
                assert_eq!(reason, "local_memory", "{slots} slots, mask {mask}");
                assert!(
                    explanation.contains("`st.local.u32`"),
                    "{slots} slots, mask {mask}: {explanation}"
                );
            }
        }
    }
}

/// Runs entry `entry(in0, in1, out, n)` over u32 elements.
fn run_pairs(text: &str, entry: &str, a: &[u32], b: &[u32], threads: usize) -> Vec<u32> {
    let k = HostKernel::compile_with(text, entry, Families::ALL)
        .unwrap_or_else(|e| panic!("{entry}: {e}"));
    let n = a.len();
    let bytes = |v: &[u32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (mut ia, mut ib) = (bytes(a), bytes(b));
    let mut out = vec![0xFFu8; (n + 2) * 4];
    let spans = [
        HostSpan {
            ptr: ia.as_mut_ptr(),
            len: ia.len(),
        },
        HostSpan {
            ptr: ib.as_mut_ptr(),
            len: ib.len(),
        },
    ];
    let l = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n: n as u64,
        params: &[],
        threads,
        checked: threads > 1,
        control: None,
    };
    // SAFETY: every span is a live Vec of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(
        out[n * 4..].iter().all(|b| *b == 0xFF),
        "{entry}: tail written"
    );
    out.chunks(4)
        .take(n)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// NVRTC -G's `add_f16_vec2`: its `__half2` temporaries live in a 40-byte
/// frame and their `this` pointers are stored in it and loaded back. Each
/// slot holding a frame address is proved to be touched by nothing else
/// and becomes a register; the kernel runs on the host engine bit for bit
/// against `__hadd2` (each lane rounded once, from the exact f64 sum), the
/// tail untouched; its element is the 4-byte pair.
#[test]
fn add_f16_vec2_debug_build_matches_the_reference() {
    let text = jit("nvrtc/add_f16_vec2_G.ptx");
    let (sig, _) = ptx::verify_contract(&text, "add_f16_vec2", None, Families::ALL)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(sig.element_sizes.iter().all(|s| *s == 4), "{sig:?}");
    let canonical = ptx::canonicalize_with(&text, "add_f16_vec2", None, Families::ALL).unwrap();
    for gone in [".local", "__local_depot0", "call"] {
        assert!(!canonical.text.contains(gone), "`{gone}` left");
    }
    let mut r = rng("add_f16_vec2 -G");
    let half = |r: &mut rand::rngs::StdRng| -> u32 {
        loop {
            let h: u16 = r.random();
            if !half::f16::from_bits(h).is_nan() {
                return u32::from(h);
            }
        }
    };
    let lane = |x: u32, y: u32| -> u32 {
        let (x, y) = (
            half::f16::from_bits(x as u16),
            half::f16::from_bits(y as u16),
        );
        u32::from(half::f16::from_f64(f64::from(x) + f64::from(y)).to_bits())
    };
    for (n, threads) in [(1usize, 1usize), (257, 3), (1000, 2)] {
        let a: Vec<u32> = (0..n).map(|_| half(&mut r) | half(&mut r) << 16).collect();
        let b: Vec<u32> = (0..n).map(|_| half(&mut r) | half(&mut r) << 16).collect();
        let got = run_pairs(&text, "add_f16_vec2", &a, &b, threads);
        for ((x, y), g) in a.iter().zip(&b).zip(&got) {
            let want = lane(x & 0xFFFF, y & 0xFFFF) | lane(x >> 16, y >> 16) << 16;
            let nan = |v: u32| half::f16::from_bits(v as u16).is_nan();
            let ok = *g == want
                || (nan(want & 0xFFFF) && nan(g & 0xFFFF) && (g >> 16 == want >> 16))
                || (nan(want >> 16) && nan(g >> 16) && (g & 0xFFFF == want & 0xFFFF));
            assert!(ok, "a = {x:#x}, b = {y:#x}: got {g:#x}, want {want:#x}");
        }
    }
}

/// The slots that hold `add_f16_vec2 -G`'s frame addresses, attacked:
/// each is refused `local_memory` with its exact reason.
#[test]
fn frame_address_slots_are_held_to_their_proof() {
    let with = |from: &str, to: &str| {
        let text = jit("nvrtc/add_f16_vec2_G.ptx");
        assert!(text.contains(from), "{from}");
        text.replacen(from, to, 1)
    };
    for (text, why) in [
        // Half of a slot holding a frame address read as data.
        (
            with("ld.u64 \t%rd18, [%SP+24];", "ld.u32 \t%r3, [%SP+28];"),
            "`ld.u32` may access bytes 28..32 of the local frame `__local_depot0`, which overlap the slot at byte 24 that holds a frame address",
        ),
        // A frame address loaded back from its slot and stored to memory.
        (
            with(
                "ld.u64 \t%rd18, [%SP+24];",
                "ld.u64 \t%rd18, [%SP+24];\n\tst.global.u64 \t[%rd4], %rd18;",
            ),
            "must not escape",
        ),
        // A frame address stored where a slot does not fit.
        (
            with("st.u64 \t[%SP+8], %rd13;", "st.u64 \t[%SP+36], %rd13;"),
            "must not escape",
        ),
        // The address a slot holds, past the frame: the callee's store
        // through it is refused.
        (
            with("add.u64 \t%rd12, %SP, 4;", "add.u64 \t%rd12, %SP, 38;"),
            "may access byte offsets 38..=38",
        ),
    ] {
        let (reason, explanation) = refusal(&text, "add_f16_vec2");
        assert_eq!(reason, "local_memory", "{why}: {explanation}");
        assert!(explanation.contains(why), "{why}: {explanation}");
    }
}

/// An inlined callee's scoped `%r7` is not the entry's `%r7`: with the
/// entry's own frame, the callee's `mov.u32 %r7, 0` must not make the
/// caller's data-dependent `%r7` look like index 0 (before every scope was
/// renamed apart whenever the body has a frame, this was accepted).
#[test]
fn a_callees_register_is_not_the_callers_in_the_frame_proof() {
    let callee = ".func zero()\n{\n\t.reg .b32 \t%r<8>;\n\tmov.u32 \t%r7, 0;\n\tret;\n}\n\n.visible .entry framed(";
    let text = framed("mov.u32 \t%r9, 4;\n\tmov.u32 \t%r7, %r4;\n\tcall.uni \tzero;").replacen(
        ".visible .entry framed(",
        callee,
        1,
    );
    let (reason, explanation) = refusal(&text, "framed");
    assert_eq!(reason, "local_memory");
    assert!(
        explanation.contains("`ld.local.u32` may access byte offsets"),
        "{explanation}"
    );
}
