//! An outside review of the verifier's new families (w29r): kernels written
//! as an attacker would, starting from the real corpus, against the
//! indexed local frames (`src/ptx/inline/frame.rs`) and the Strided family.
//! Each attack asserts the exact refusal the verifier must give; a hole
//! still open is `#[ignore = "hole: <class>"]` and runs red with
//! `--ignored`.
#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::{Rng, SeedableRng};

fn jit(file: &str) -> String {
    let path = format!("{}/tests/corpus/jit/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

/// The verdict as (sub_reason, explanation), "accepted" for an acceptance.
fn verdict(text: &str, entry: &str) -> (&'static str, String) {
    match ptx::canonicalize_with(text, entry, None, Families::ALL) {
        Ok(c) => ("accepted", c.text),
        Err(PtxError::NonScalarAbi {
            sub_reason,
            explanation,
            ..
        }) => (sub_reason, explanation),
        Err(e) => ("other", e.to_string()),
    }
}

// ---------------------------------------------------------------------
// Indexed local frames
// ---------------------------------------------------------------------

/// A kernel with a `size`-byte indexed frame: `frame[k] = x + k` for `k`
/// in `0..size / 4` (a loop over a pointer bumped by 4, its counter
/// compared with a constant, as NVRTC writes it), then `index` computes
/// the 32-bit slot index `%r7` from `x` (`%r4`, also in `%f1` as a float),
/// and `out = frame[%r7]`.
fn frame_kernel(size: u32, index: &str) -> String {
    let count = size / 4;
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
	.reg .b64 	%SP;
	.reg .b64 	%SPL;
	.reg .pred 	%p<8>;
	.reg .f32 	%f<8>;
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
	mov.b32 	%f1, %r4;
	mov.u32 	%r5, 0;
	add.u64 	%rd10, %SPL, 0;
$L__FILL:
	add.s32 	%r6, %r4, %r5;
	st.local.u32 	[%rd10], %r6;
	add.s64 	%rd10, %rd10, 4;
	add.s32 	%r5, %r5, 1;
	setp.ne.s32 	%p2, %r5, {count};
	@%p2 bra 	$L__FILL;
	{index}
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

/// Runs `framed` on the host engine over `x`, the output poisoned, and
/// checks the tail past `n` is untouched.
fn run_framed(text: &str, x: &[u32], threads: usize) -> Vec<u32> {
    let k = HostKernel::compile_with(text, "framed", Families::ALL).unwrap();
    let n = x.len();
    let mut input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    input.extend([0xAB; 8]);
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

/// The frame attacks' verdicts, printed (a probe while reviewing).
#[test]
fn probe_frames() {
    let cases: Vec<(&str, String)> = vec![
        ("base", frame_kernel(16, "and.b32 	%r7, %r4, 3;")),
        (
            "add.sat",
            frame_kernel(
                16,
                "mov.u32 	%r9, 2147483647;\n\tadd.sat.s32 	%r10, %r9, 1;\n\tadd.s32 	%r7, %r10, -2147483648;",
            ),
        ),
        (
            "abs.ftz",
            frame_kernel(
                20,
                "abs.ftz.f32 	%f2, %f1;\n\tsetp.lt.f32 	%p3, %f2, 0f00000004;\n\t@!%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tand.b32 	%r7, %r9, 2147483647;",
            ),
        ),
        (
            "cvt.wide",
            frame_kernel(
                16,
                "mov.u64 	%rd20, 12884901892;\n\tcvt.u64.u32 	%rd21, %rd20;\n\tshr.u64 	%rd22, %rd21, 32;\n\tcvt.u32.u64 	%r9, %rd22;\n\tadd.s32 	%r7, %r9, -3;",
            ),
        ),
    ];
    for (name, text) in cases {
        let (v, why) = verdict(&text, "framed");
        println!("{name}: {v}: {}", if v == "accepted" { String::new() } else { why.chars().take(300).collect::<String>() });
    }
}

/// `k` diamonds after the frame's fill, each writing its own register on
/// each side (states that never equal each other), as a cost probe.
fn diamonds(k: usize) -> String {
    let mut body = String::from("mov.u32 	%r7, 0;\n");
    for j in 0..k {
        body.push_str(&format!(
            "\txor.b32 	%r{a}, %r4, {j};\n\tsetp.eq.u32 	%p3, %r{a}, 7;\n\t@%p3 bra 	$L__A{j};\n\tmov.u32 	%r{b}, 1;\n\tbra.uni 	$L__B{j};\n$L__A{j}:\n\tmov.u32 	%r{b}, 2;\n$L__B{j}:\n",
            a = 200 + j,
            b = 300 + j
        ));
    }
    frame_kernel(16, &body)
        .replace(".reg .b32 	%r<24>;", ".reg .b32 	%r<400>;")
}

#[test]
fn probe_cost() {
    for k in [10usize, 20, 40, 80] {
        let text = diamonds(k);
        let t = std::time::Instant::now();
        let lowered = ptx::lower(&text, "framed").map(|_| ());
        let tl = t.elapsed();
        let noframe = text
            .replace(".local .align 4 .b8 	__local_depot0[16];", "")
            .replace("mov.u64 	%SPL, __local_depot0;", "mov.u64 	%SPL, 0;")
            .replace("st.local.u32 	[%rd10], %r6;", "")
            .replace("ld.local.u32 	%r8, [%rd12];", "mov.u32 %r8, 0;");
        let t = std::time::Instant::now();
        let (v, _) = verdict(&noframe, "framed");
        println!("frameless verdict {v} in {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let _ = ptx::lower(&noframe, "framed");
        let tn = t.elapsed();
        println!("k={k} bytes={}: lower {tl:?} ({:?}) vs no frame {tn:?}", text.len(), lowered.err().map(|e| e.to_string().chars().take(120).collect::<String>()));
    }
}

// ---------------------------------------------------------------------
// The Strided family
// ---------------------------------------------------------------------

fn nvrtc(file: &str) -> String {
    jit(&format!("nvrtc/{file}"))
}

fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from}");
    text.replacen(from, to, 1)
}

/// `add_f32_strided` (O3): `out[i] = in0[(i / d1) * s0 + i % d1] +
/// in1[(i % d1) * s1]`, args `s0, s1, d0, d1`.
fn add_o3() -> String {
    nvrtc("add_f32_strided_O3.ptx")
}

/// The fast path's quotient made `((q + (2^31 - 1)) -sat (2^31 - 1))`:
/// the ring reads it as `q`; the GPU saturates to `0x80000000` for every
/// `q >= 1`.
fn strided_sat() -> String {
    replaced(
        &add_o3(),
        "cvt.u64.u32 \t%rd32, %r6;",
        "add.s32 \t%r9, %r6, 2147483647;\n\tsub.sat.s32 \t%r10, %r9, 2147483647;\n\tcvt.u64.u32 \t%rd32, %r10;",
    )
    .replace(".reg .b32 \t%r<9>;", ".reg .b32 \t%r<16>;")
}

#[test]
fn probe_strided() {
    for (name, text) in [("base", add_o3()), ("sat", strided_sat())] {
        let (v, why) = verdict(&text, "add_f32_strided");
        println!("{name}: {v}: {}", if v == "accepted" { String::new() } else { why });
    }
}

#[test]
fn probe_frames2() {
    let fk = |idx: &str| frame_kernel(16, idx);
    let cases: Vec<(&str, String)> = vec![
        ("nan-lt-false", fk("abs.f32 	%f2, %f1;\n\tsetp.lt.f32 	%p3, %f2, 0f40800000;\n\t@%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tshr.u32 	%r7, %r9, 29;")),
        ("ltu-true", fk("abs.f32 	%f2, %f1;\n\tsetp.ltu.f32 	%p3, %f2, 0f40800000;\n\t@!%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tshr.u32 	%r7, %r9, 30;")),
        ("ge-true-ok", fk("abs.f32 	%f2, %f1;\n\tsetp.ge.f32 	%p3, %f2, 0f7F000000;\n\t@!%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tshr.u32 	%r10, %r9, 23;\n\tand.b32 	%r11, %r10, 255;\n\tadd.s32 	%r7, %r11, -254;")),
        ("v2-misaligned", fk("and.b32 	%r7, %r4, 1;").replace("ld.local.u32 	%r8, [%rd12];", "ld.local.v2.u32 	{%r8, %r12}, [%rd12+4];")),
        ("selp-frame", fk("and.b32 	%r7, %r4, 3;\n\tselp.b64 	%rd15, %SPL, %rd1, %p2;")),
        ("atom-local", fk("and.b32 	%r7, %r4, 3;\n\tatom.local.add.u32 	%r13, [%SPL], 1;")),
        ("cvta-to-local", fk("and.b32 	%r7, %r4, 3;\n\tcvta.to.local.u64 	%rd15, %rd1;\n\tld.local.u32 	%r13, [%rd15];")),
        ("cvta-local-global", fk("and.b32 	%r7, %r4, 3;\n\tcvta.local.u64 	%rd15, %rd1;\n\tld.u32 	%r13, [%rd15];")),
        ("ptr-through-frame", fk("and.b32 	%r7, %r4, 3;").replace("st.global.u32 	[%rd14], %r8;", "st.local.u64 	[%SPL], %rd14;\n\tld.local.u64 	%rd15, [%SPL];\n\tst.global.u32 	[%rd15], %r8;")),
        ("b16-mixed", fk("and.b32 	%r7, %r4, 3;").replace("ld.local.u32 	%r8, [%rd12];", "ld.local.u16 	%rs1, [%rd12];\n\tcvt.u32.u16 	%r8, %rs1;").replace(".reg .pred", ".reg .b16 %rs<4>;\n\t.reg .pred")),
        ("u8-frame", fk("and.b32 	%r7, %r4, 3;").replace("st.local.u32 	[%rd10], %r6;", "st.local.u8 	[%rd10], %r6;").replace("add.s64 	%rd10, %rd10, 4;", "add.s64 	%rd10, %rd10, 1;").replace("ld.local.u32 	%r8, [%rd12];", "ld.local.u8 	%r8, [%rd12];").replace("mul.wide.u32 	%rd11, %r7, 4;", "mul.wide.u32 	%rd11, %r7, 1;")),
        ("frame-name-collide", fk("and.b32 	%r7, %r4, 3;\n\tmov.b32 	%__fs3, 77;").replace(".reg .pred", ".reg .b32 %__fs3;\n\t.reg .pred")),
        ("shr-sign", fk("shr.s32 	%r9, %r4, 30;\n\tadd.s32 	%r7, %r9, 2;")),
        ("mul-hi", fk("mul.hi.u32 	%r9, %r4, 4;\n\tmov.u32 	%r7, %r9;")),
        ("setp-and", fk("setp.lt.and.u32 	%p3, %r4, 4, %p1;\n\t@!%p3 bra 	$L__END;\n\tmov.u32 	%r7, %r4;")),
        ("setp-pair", fk("setp.lt.u32 	%p3|%p4, %r4, 4;\n\t@%p4 bra 	$L__END;\n\tmov.u32 	%r7, %r4;")),
        ("setp-swapped", fk("setp.gt.u32 	%p3, 4, %r4;\n\t@!%p3 bra 	$L__END;\n\tmov.u32 	%r7, %r4;")),
        ("s-cmp-unsigned", fk("setp.lt.s32 	%p3, %r4, 4;\n\t@!%p3 bra 	$L__END;\n\tmov.u32 	%r7, %r4;")),
        ("brx", fk("and.b32 	%r7, %r4, 3;")),
    ];
    for (name, text) in cases {
        let (v, why) = verdict(&text, "framed");
        println!("{name}: {v}: {}", if v == "accepted" { String::new() } else { why.chars().take(250).collect() });
    }
}

#[test]
fn probe_frames3() {
    let g = nvrtc("sin_f32_G.ptx");
    let twice = replaced(
        &g,
        "ld.param.f32 	%f2, [retval0+0];\n	} // callseq 0",
        "ld.param.f32 	%f2, [retval0+0];\n	} // callseq 0\n	{ // callseq 9, 0\n	.reg .b32 temp_param_reg;\n	.param .b32 param0;\n	st.param.f32 	[param0+0], %f2;\n	.param .b32 retval0;\n	call.uni (retval0), \n	sinf, \n	(\n	param0\n	);\n	ld.param.f32 	%f2, [retval0+0];\n	} // callseq 9",
    );
    let constant_v2 = frame_kernel(16, "and.b32 	%r7, %r4, 3;")
        .replace("$L__FILL:", "$L__FILL:")
        .replace("ld.local.u32 	%r8, [%rd12];", "ld.local.u32 	%r8, [%rd12];\n\tld.local.v2.u32 	{%r13, %r14}, [%SPL+4];\n\tadd.s32 	%r8, %r8, %r13;");
    let cases: Vec<(&str, String, &str)> = vec![
        ("G", g.clone(), "sin_f32"),
        ("G-twice", twice, "sin_f32"),
        ("G-reserved", g.replace("%rd<28>;", "%rd<28>;\n\t.reg .b32 %__sc9_x;"), "sin_f32"),
        ("v2-misaligned-indexed-mixed", constant_v2, "framed"),
    ];
    for (name, text, entry) in cases {
        let (v, why) = verdict(&text, entry);
        println!("{name}: {v}: {}", if v == "accepted" { String::new() } else { why.chars().take(250).collect() });
    }
}

/// A frame inside a `{ }` scope indexed by an outer register whose name a
/// sibling scope also declares (and bounds); `reserved` adds a register
/// named like the scope renaming's (`%__sc…`), which makes the renaming
/// decline.
fn scoped_frame(reserved: bool) -> String {
    let extra = if reserved { "\t.reg .b32 	%__sc_x;\n" } else { "" };
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
	.reg .pred 	%p<8>;
	.reg .b32 	%r<24>;
	.reg .b64 	%rd<32>;
{extra}
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
	mov.u32 	%r10, %r4;
	{{
	.reg .b32 	%r10;
	mov.u32 	%r10, 0;
	add.s32 	%r11, %r10, 1;
	}}
	{{
	.local .align 4 .b8 	__local_depot0[16];
	.reg .b64 	%SPL;
	mov.u64 	%SPL, __local_depot0;
	st.local.u32 	[%SPL], %r4;
	st.local.u32 	[%SPL+4], %r4;
	st.local.u32 	[%SPL+8], %r4;
	st.local.u32 	[%SPL+12], %r4;
	mul.wide.u32 	%rd11, %r10, 4;
	add.s64 	%rd12, %SPL, %rd11;
	ld.local.u32 	%r8, [%rd12];
	}}
	cvta.to.global.u64 	%rd13, %rd2;
	add.s64 	%rd14, %rd13, %rd8;
	st.global.u32 	[%rd14], %r8;
$L__END:
	ret;
}}
"#
    )
}

#[test]
fn probe_scopes() {
    for reserved in [false, true] {
        let (v, why) = verdict(&scoped_frame(reserved), "framed");
        println!("reserved={reserved}: {v}: {}", if v == "accepted" { String::new() } else { why.chars().take(250).collect() });
    }
}
