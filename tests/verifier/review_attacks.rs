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

fn assert_refused(text: &str, entry: &str, sub: &str, needle: &str) {
    let (v, why) = verdict(text, entry);
    let short: String = why.chars().take(400).collect();
    assert_eq!(v, sub, "{short}");
    assert!(why.contains(needle), "{short}");
}

/// `0x7fffffff +sat 1` then `+ 0x80000000`: the frame domain wraps the
/// saturating add (`0x80000000`, then `0`); the original computes
/// `0x7fffffff`, then `0xffffffff`: byte `0x3_ffff_fffc` of the frame.
const SAT_INDEX: &str =
    "mov.u32 	%r9, 2147483647;\n\tadd.sat.s32 	%r10, %r9, 1;\n\tadd.s32 	%r7, %r10, -2147483648;";

/// `|x| < 4 × 2^-149` through `abs.ftz`: a subnormal `x` flushes to 0 and
/// passes the compare, so `x`'s bits are not within `[0, 4]` (with its
/// sign masked off) as the magnitude domain concludes.
const FTZ_INDEX: &str = "abs.ftz.f32 	%f2, %f1;\n\tsetp.lt.f32 	%p3, %f2, 0f00000004;\n\t@!%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tand.b32 	%r7, %r9, 2147483647;";

/// `cvt.u64.u32` of a 64-bit register holding `3·2^32 + 4`: PTX converts
/// its low 32 bits (4); the domain keeps the whole register, so the
/// following `>> 32` is 3 to it and 0 on the GPU, and the index `- 3` is
/// 0 to it and `0xfffffffd` on the GPU.
const CVT_WIDE_INDEX: &str = "mov.u64 	%rd20, 12884901892;\n\tcvt.u64.u32 	%rd21, %rd20;\n\tshr.u64 	%rd22, %rd21, 32;\n\tcvt.u32.u64 	%r9, %rd22;\n\tadd.s32 	%r7, %r9, -3;";

/// Every kernel here whose frame proof accepted an access outside the
/// frame of the text the client wrote. (The canonical text keeps no local
/// memory: such an access reads a slot, see
/// `an_accepted_frame_kernel_keeps_no_local_memory`.)
fn frame_holes() -> Vec<(&'static str, String)> {
    vec![
        ("add.sat", frame_kernel(16, SAT_INDEX)),
        ("abs.ftz", frame_kernel(20, FTZ_INDEX)),
        ("cvt of a wider register", frame_kernel(16, CVT_WIDE_INDEX)),
        ("scoped names conflated", scoped_frame(true)),
        ("v2 at a 4-byte offset", v2_at_4_indexed()),
    ]
}

/// Class: an arithmetic modifier that changes the result (`.sat`) read by
/// the frame's interval domain as plain wrapping arithmetic. The original
/// reads byte `4 × 0xffffffff` of a 16-byte frame.
#[test]
fn a_saturating_add_is_no_wrapping_add_to_the_frame_proof() {
    let original = 0x7fff_ffffu32.wrapping_add(0x8000_0000);
    assert_eq!(original, 0xffff_ffff);
    assert!(u64::from(original) * 4 + 4 > 16);
    assert_refused(
        &frame_kernel(16, SAT_INDEX),
        "framed",
        "local_memory",
        "may access byte offsets",
    );
}

/// Class: float magnitude reasoning broken by flush-to-zero: `abs.ftz`
/// maps every subnormal to 0, so `|x| < c` after it bounds nothing about
/// a subnormal `x`. `x = 0x00400000` (a subnormal) passes the compare and
/// indexes slot `0x400000` of a 5-slot frame.
#[test]
fn a_flushed_abs_bounds_no_subnormal() {
    let x = f32::from_bits(0x0040_0000);
    assert!(x.is_subnormal());
    assert_refused(
        &frame_kernel(20, FTZ_INDEX),
        "framed",
        "local_memory",
        "may access byte offsets",
    );
}

/// Class: an instruction that reads fewer bits of its source register
/// than the register holds (`cvt.u64.u32 %rd, %rd`, which PTX allows for
/// `cvt`) read as the whole register.
#[test]
fn a_cvt_reads_the_low_bits_of_a_wider_register() {
    let original = ((3u64 << 32) + 4) as u32; // the low 32 bits
    assert_eq!(u64::from(original) >> 32, 0);
    assert_refused(
        &frame_kernel(16, CVT_WIDE_INDEX),
        "framed",
        "local_memory",
        "may access byte offsets",
    );
}

/// Class: register identity in the frame proof is the register's name;
/// when the scope renaming declines (a name like its own, `%__sc…`,
/// anywhere in the body), a frame inside a `{ }` scope is proved with the
/// names of different scopes conflated: the sibling scope's `%r10 = 0`
/// bounds the outer `%r10 = x` that indexes the frame. Without the
/// reserved name the same kernel is refused (the control).
#[test]
fn a_scoped_frame_is_not_proved_with_conflated_names() {
    assert_refused(
        &scoped_frame(false),
        "framed",
        "local_memory",
        "may access byte offsets",
    );
    assert_refused(&scoped_frame(true), "framed", "local_memory", "");
}

/// A frame read as `.v2.u32` at byte `4 + 4·k` for `k` in `{0, 1}`: every
/// lane is inside the frame and aligned to 4, but a `.v2.u32` access must
/// be aligned to 8 (the GPU faults on the original: misaligned address).
fn v2_at_4_indexed() -> String {
    frame_kernel(16, "and.b32 	%r7, %r4, 1;").replace(
        "ld.local.u32 	%r8, [%rd12];",
        "ld.local.v2.u32 	{%r8, %r12}, [%rd12+4];",
    )
}

/// Class: a vector access of the frame aligned to its lane but not to the
/// whole vector (PTX requires `.v2`/`.v4` addresses aligned to the
/// vector's size), indexed or at a constant offset.
#[test]
fn a_frame_vector_access_must_be_aligned_to_the_vector() {
    assert_refused(&v2_at_4_indexed(), "framed", "local_memory", "");
    // The same at a constant offset (the promoted frame).
    let constant = frame_kernel(16, "mov.u32 	%r7, 0;").replace(
        "ld.local.u32 	%r8, [%rd12];",
        "ld.local.v2.u32 	{%r8, %r12}, [%SPL+4];",
    );
    assert_refused(&constant, "framed", "local_memory", "");
}

/// What bounds the holes above: the canonical text of every accepted
/// frame kernel holds no local memory and no frame symbol (each access is
/// a `selp` over zeroed slot registers), so an access the proof got wrong
/// reads a slot of the thread's own frame, never memory; run on the host
/// engine, the `add.sat` kernel (while accepted) reads slot 0 (`x`).
#[test]
fn an_accepted_frame_kernel_keeps_no_local_memory() {
    for (name, text) in frame_holes() {
        let (v, canonical) = verdict(&text, "framed");
        if v != "accepted" {
            continue;
        }
        for needle in [
            ".local",
            "ld.local",
            "st.local",
            "__local_depot0",
            "cvta.local",
        ] {
            assert!(!canonical.contains(needle), "{name}: {needle} left");
        }
    }
    let sat = frame_kernel(16, SAT_INDEX);
    if verdict(&sat, "framed").0 == "accepted" {
        let mut r = rand::rngs::StdRng::seed_from_u64(0x29);
        let x: Vec<u32> = (0..257).map(|_| r.random()).collect();
        for threads in [1, 3] {
            assert_eq!(run_framed(&sat, &x, threads), x);
        }
    }
}

/// Class: bounded cost. The frame proof's budget counts instruction
/// steps (200 000), but a step costs O(state) (every write scans the
/// state) and a label visit O(states kept × state); `k` data-dependent
/// diamonds after the fill make the proof super-linear in the kernel's
/// size: 80 diamonds (13 KB of PTX) took 6.4 s in a debug build where the
/// same kernel without its frame lowers in 3.5 ms. The issue's goal is
/// 10 ms for a 64 KB kernel.
#[test]
fn the_frame_proof_costs_about_what_lowering_costs() {
    let text = diamonds(80);
    let frameless = text
        .replace(".local .align 4 .b8 	__local_depot0[16];", "")
        .replace("mov.u64 	%SPL, __local_depot0;", "mov.u64 	%SPL, 0;")
        .replace("st.local.u32 	[%rd10], %r6;", "")
        .replace("ld.local.u32 	%r8, [%rd12];", "mov.u32 	%r8, 0;");
    let t = std::time::Instant::now();
    ptx::lower(&frameless, "framed").unwrap();
    let without = t.elapsed();
    let t = std::time::Instant::now();
    let _ = ptx::lower(&text, "framed");
    let with = t.elapsed();
    // The cost bound (`MAX_COST` work units) is what makes this hold; the
    // slack is wide so that a loaded machine (a debug build on 2 busy
    // cores took 0.9 s here) does not fail it, while the unbounded proof
    // (6.4 s on a quiet machine, more on a loaded one) still does.
    assert!(
        with <= without * 50 + std::time::Duration::from_secs(4),
        "{} bytes: the frame proof took {with:?}, lowering without it {without:?}",
        text.len()
    );
}

/// Attacks the frame proof holds, each refused with its exact reason:
/// NaN and unordered compares are no magnitude bound; a signed compare
/// leaves negatives; the frame address in `selp`, an atomic, a `cvta.to`
/// (a generic address of unknown origin read as local); accesses of two
/// widths (a pointer spilled as `.u64`, a `.u16` read); arithmetic the
/// domain does not follow (`shr.s32`, `mul.hi`); predicates it must not
/// refine from (a combined `setp.lt.and`, a predicate pair, a compare with
/// its operands swapped); the scoped frame when renaming runs.
#[test]
fn held_frame_attacks_are_refused_with_their_reason() {
    let fk = |index: &str| frame_kernel(16, index);
    let unbounded = "may access byte offsets -9223372036854775808..=9223372036854775807";
    let escape = "other than to access it: the frame must not escape";
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "|x| < 4 false (NaN passes)",
            fk("abs.f32 	%f2, %f1;\n\tsetp.lt.f32 	%p3, %f2, 0f40800000;\n\t@%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tshr.u32 	%r7, %r9, 29;"),
            "local_memory",
            unbounded,
        ),
        (
            "|x| <u 4 true (NaN passes)",
            fk("abs.f32 	%f2, %f1;\n\tsetp.ltu.f32 	%p3, %f2, 0f40800000;\n\t@!%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tshr.u32 	%r7, %r9, 30;"),
            "local_memory",
            unbounded,
        ),
        (
            "a signed compare leaves negatives",
            fk("setp.lt.s32 	%p3, %r4, 4;\n\t@!%p3 bra 	$L__END;\n\tmov.u32 	%r7, %r4;"),
            "local_memory",
            unbounded,
        ),
        (
            "shr.s32",
            fk("shr.s32 	%r9, %r4, 30;\n\tadd.s32 	%r7, %r9, 2;"),
            "local_memory",
            unbounded,
        ),
        (
            "mul.hi",
            fk("mul.hi.u32 	%r9, %r4, 4;\n\tmov.u32 	%r7, %r9;"),
            "local_memory",
            unbounded,
        ),
        (
            "setp.lt.and",
            fk("setp.lt.and.u32 	%p3, %r4, 4, %p1;\n\t@!%p3 bra 	$L__END;\n\tmov.u32 	%r7, %r4;"),
            "local_memory",
            unbounded,
        ),
        (
            "a predicate pair",
            fk("setp.lt.u32 	%p3|%p4, %r4, 4;\n\t@%p4 bra 	$L__END;\n\tmov.u32 	%r7, %r4;"),
            "local_memory",
            unbounded,
        ),
        (
            "operands swapped",
            fk("setp.gt.u32 	%p3, 4, %r4;\n\t@!%p3 bra 	$L__END;\n\tmov.u32 	%r7, %r4;"),
            "local_memory",
            unbounded,
        ),
        (
            "selp of the frame address",
            fk("and.b32 	%r7, %r4, 3;\n\tselp.b64 	%rd15, %SPL, %rd1, %p2;"),
            "local_memory",
            escape,
        ),
        (
            "atom.local on the frame",
            fk("and.b32 	%r7, %r4, 3;\n\tatom.local.add.u32 	%r13, [%SPL], 1;"),
            "local_memory",
            escape,
        ),
        (
            "cvta.to.local of a global pointer",
            fk("and.b32 	%r7, %r4, 3;\n\tcvta.to.local.u64 	%rd15, %rd1;\n\tld.local.u32 	%r13, [%rd15];"),
            "local_memory",
            "is not provably an access of the local frame",
        ),
        (
            "a pointer spilled to the frame and used as an address",
            fk("and.b32 	%r7, %r4, 3;").replace(
                "st.global.u32 	[%rd14], %r8;",
                "st.local.u64 	[%SPL], %rd14;\n\tld.local.u64 	%rd15, [%SPL];\n\tst.global.u32 	[%rd15], %r8;",
            ),
            "local_memory",
            "at width 8, another access at 4",
        ),
        (
            "a .u16 read of a .u32 frame",
            fk("and.b32 	%r7, %r4, 3;")
                .replace(
                    "ld.local.u32 	%r8, [%rd12];",
                    "ld.local.u16 	%rs1, [%rd12];\n\tcvt.u32.u16 	%r8, %rs1;",
                )
                .replace(".reg .pred", ".reg .b16 	%rs<4>;\n\t.reg .pred"),
            "local_memory",
            "at width 2, another access at 4",
        ),
        (
            "the scoped frame with renaming",
            scoped_frame(false),
            "local_memory",
            unbounded,
        ),
        (
            "cvta.local of a global pointer, then a generic load",
            fk("and.b32 	%r7, %r4, 3;\n\tcvta.local.u64 	%rd15, %rd1;\n\tld.u32 	%r13, [%rd15];"),
            "non_elementwise_address",
            "`ld.u32`",
        ),
    ];
    for (what, text, sub, needle) in cases {
        let (v, why) = verdict(&text, "framed");
        assert_eq!((v, sub), (sub, sub), "{what}: {v}: {why}");
        assert!(why.contains(needle), "{what}: {why}");
    }
}

/// The magnitude domain's positive case, run: `|x| >= 2^127` (never NaN)
/// bounds `x`'s exponent field to `{254, 255}`, so `frame[exp - 254]`
/// is accepted and runs exactly (`x + exp - 254`; every other lane
/// leaves its output poisoned).
#[test]
fn a_magnitude_bound_indexes_the_frame_exactly() {
    let text = frame_kernel(
        16,
        "abs.f32 	%f2, %f1;\n\tsetp.ge.f32 	%p3, %f2, 0f7F000000;\n\t@!%p3 bra 	$L__END;\n\tmov.b32 	%r9, %f1;\n\tshr.u32 	%r10, %r9, 23;\n\tand.b32 	%r11, %r10, 255;\n\tadd.s32 	%r7, %r11, -254;",
    );
    let mut r = rand::rngs::StdRng::seed_from_u64(0x7f00);
    let mut x: Vec<u32> = (0..600)
        .map(|k| match k % 4 {
            0 => r.random(),
            1 => 0x7f00_0000 | r.random_range(0..0x0080_0000),
            2 => 0xff00_0000 | r.random_range(0..0x0100_0000),
            _ => 0x7f80_0000 | (r.random_range(0..2u32) << 31),
        })
        .collect();
    x.extend([0x7f7f_ffff, 0xff80_0000, 0x7fc0_0000, 0x7eff_ffff]);
    for threads in [1, 3] {
        let got = run_framed(&text, &x, threads);
        for (x, g) in x.iter().zip(&got) {
            let f = f32::from_bits(*x);
            let want = if f.abs() >= f32::from_bits(0x7f00_0000) {
                x.wrapping_add(((x >> 23) & 255) - 254)
            } else {
                0xFFFF_FFFF
            };
            assert_eq!(*g, want, "x={x:#x}");
        }
    }
}

/// A frame inside a `{ }` scope indexed by an outer register whose name a
/// sibling scope also declares (and bounds); `reserved` adds a register
/// named like the scope renaming's (`%__sc…`), which makes the renaming
/// decline.
fn scoped_frame(reserved: bool) -> String {
    let extra = if reserved {
        "\t.reg .b32 	%__sc_x;\n"
    } else {
        ""
    };
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
    frame_kernel(16, &body).replace(".reg .b32 	%r<24>;", ".reg .b32 	%r<400>;")
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

/// The corpus kernels of the Strided family: (file, entry, op).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    /// `out[i] = in0[r*s0 + c] + in1[c*s1]`, args `s0, s1, d0, d1`.
    Add,
    /// `out[i] = in0[i] + in1[c*s1]`, args `s0, s1, d0, d1`.
    BiasAdd,
    /// `out[i] = in0[c*s0 + r]`, args `s0, d0, d1`.
    Transpose,
}

impl Op {
    fn entry(self) -> &'static str {
        match self {
            Op::Add => "add_f32_strided",
            Op::BiasAdd => "bias_add_f32_strided",
            Op::Transpose => "transpose_copy_f32_strided",
        }
    }
    fn inputs(self) -> usize {
        if self == Op::Transpose {
            1
        } else {
            2
        }
    }
    fn args(self, s: &Shape) -> Vec<i64> {
        match self {
            Op::Add | Op::BiasAdd => vec![s.s0, s.s1, s.d0, s.d1],
            Op::Transpose => vec![s.s0, s.d0, s.d1],
        }
    }
    /// Each input's element index at `i`, as the CUDA source computes it.
    fn indices(self, s: &Shape, i: i64) -> Vec<i64> {
        let (r, c) = (i / s.d1, i % s.d1);
        match self {
            Op::Add => vec![r * s.s0 + c, c * s.s1],
            Op::BiasAdd => vec![i, c * s.s1],
            Op::Transpose => vec![c * s.s0 + r],
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    n: i64,
    d0: i64,
    d1: i64,
    s0: i64,
    s1: i64,
}

fn random_shape(r: &mut impl Rng) -> Shape {
    let (d0, d1) = (r.random_range(1..24), r.random_range(1..24));
    Shape {
        n: r.random_range(0..=d0 * d1 + 3),
        d0,
        d1,
        s0: r.random_range(0..40),
        s1: r.random_range(0..5),
    }
}

/// The brute-force oracle: `text` (an accepted Strided kernel computing
/// `op`) run on the host engine at `shapes`, each input exactly its
/// contract footprint at that launch (the engine's bounds checks on) and
/// followed by canary bytes, the output poisoned: the contract's footprint
/// is at least the largest index any `i < n` reads plus one (by brute
/// force), the launch runs without a fault, no canary changes, and every
/// output element is the reference's.
fn oracle(text: &str, op: Op, shapes: &[Shape], r: &mut impl Rng) {
    let k = HostKernel::compile_with(text, op.entry(), Families::ALL).unwrap();
    const CANARY: usize = 64;
    for s in shapes {
        let args = op.args(s);
        let bits: Vec<u64> = args.iter().map(|a| *a as u64).collect();
        let c = k.contract();
        let values = c.values(s.n as u64, k.block_size());
        let fps: Vec<u128> = c
            .footprints
            .iter()
            .map(|f| f.bytes.eval_with(&values, &bits).unwrap())
            .collect();
        let mut brute = vec![0u128; op.inputs()];
        for i in 0..s.n {
            for (m, ix) in brute.iter_mut().zip(op.indices(s, i)) {
                *m = (*m).max((ix as u128 + 1) * 4);
            }
        }
        for (input, (fp, b)) in fps.iter().zip(&brute).enumerate() {
            assert!(fp >= b, "{s:?} in{input}: footprint {fp} < {b}");
        }
        let mut ins: Vec<Vec<u8>> = fps[..op.inputs()]
            .iter()
            .map(|fp| {
                let mut v: Vec<u8> = (0..*fp as usize / 4)
                    .flat_map(|_| r.random_range(-4.0f32..4.0).to_le_bytes())
                    .collect();
                v.extend([0xC5; CANARY]);
                v
            })
            .collect();
        let mut out = vec![0xEEu8; s.n as usize * 4 + CANARY];
        let spans: Vec<HostSpan> = ins
            .iter_mut()
            .map(|b| HostSpan {
                ptr: b.as_mut_ptr(),
                len: b.len() - CANARY,
            })
            .collect();
        let launch = HostLaunch {
            inputs: &spans,
            args: &bits,
            output: HostSpan {
                ptr: out.as_mut_ptr(),
                len: out.len() - CANARY,
            },
            n: s.n as u64,
            params: &[],
            threads: 2,
            checked: true,
            control: None,
        };
        // SAFETY: every span is a prefix of a live Vec.
        let result = unsafe { k.launch(&launch) };
        result.unwrap_or_else(|e| panic!("{} {s:?}: {e}", op.entry()));
        for b in ins.iter().chain([&out]) {
            assert!(
                b[b.len() - CANARY..]
                    .iter()
                    .all(|x| *x == 0xC5 || *x == 0xEE),
                "{s:?}: canary"
            );
        }
        let f = |b: &[u8], ix: i64| {
            let at = ix as usize * 4;
            f32::from_le_bytes(b[at..at + 4].try_into().unwrap())
        };
        for i in 0..s.n {
            let ix = op.indices(s, i);
            let want = match op {
                Op::Add | Op::BiasAdd => f(&ins[0], ix[0]) + f(&ins[1], ix[1]),
                Op::Transpose => f(&ins[0], ix[0]),
            };
            assert_eq!(f(&out, i).to_bits(), want.to_bits(), "{s:?} at {i}");
        }
    }
}

/// The oracle over all nine corpus kernels and the accepted mutants whose
/// meaning is the corpus's (`div.u64` for `div.s64`, a saturating
/// truncation, `+sat 0`), at random small shapes including `d1 = 1`, `n`
/// not a multiple of `d1`, broadcast strides and `n = 0`.
#[test]
fn accepted_strided_kernels_stay_inside_their_footprints() {
    let mut r = rand::rngs::StdRng::seed_from_u64(0x29ad);
    let shapes: Vec<Shape> = (0..24).map(|_| random_shape(&mut r)).collect();
    for op in [Op::Add, Op::BiasAdd, Op::Transpose] {
        for build in ["O3", "G", "fast"] {
            oracle(
                &nvrtc(&format!("{}_{build}.ptx", op.entry())),
                op,
                &shapes,
                &mut r,
            );
        }
    }
    let a = add_o3();
    for (from, to) in [
        (
            "div.s64 \t%rd32, %rd1, %rd13;",
            "div.u64 \t%rd32, %rd1, %rd13;",
        ),
        ("cvt.u32.u64 \t%r5, %rd1;", "cvt.sat.u32.u64 \t%r5, %rd1;"),
        (
            "cvt.u64.u32 \t%rd33, %r8;",
            "add.sat.s32 \t%r8, %r8, 0;\n\tcvt.u64.u32 \t%rd33, %r8;",
        ),
    ] {
        let text = replaced(&a, from, to);
        // Saturating forms are refused since the Strided family stopped
        // reading `.sat` as ring arithmetic (sound, if conservative); what
        // is accepted must stay inside its footprints.
        match verdict(&text, Op::Add.entry()).0 {
            "accepted" => oracle(&text, Op::Add, &shapes, &mut r),
            other => assert_eq!(other, "non_elementwise_address", "{to}"),
        }
    }
}

/// Class: an arithmetic modifier that changes the result (`.sat`) read as
/// ring arithmetic — the Strided family's polynomials hold a register's
/// value modulo `2^32` only for wrapping `add`/`sub`. NVRTC's fast path
/// made `q' = (q + (2^31 - 1)) -sat (2^31 - 1)`: the ring reads `q`; the
/// GPU computes `0x80000000` for every `q >= 1` (the signed difference is
/// below `i32::MIN`). At `n = 8, d1 = 4, s0 = 4` the contract grants in0
/// 32 bytes and thread 4 reads byte `4 × (2^31 × 4)` = 32 GiB past it; the
/// host engine's bounds check faults where the GPU would read another
/// allocation. The right verdict: refused at load, the address no
/// polynomial.
#[test]
fn a_saturating_sub_in_the_fast_path_is_no_ring_arithmetic() {
    let text = strided_sat();
    if verdict(&text, Op::Add.entry()).0 == "accepted" {
        let k = HostKernel::compile_with(&text, Op::Add.entry(), Families::ALL).unwrap();
        let c = k.contract();
        let v = c.values(8, k.block_size());
        let in0 = c.footprints[0].bytes.eval_with(&v, &[4, 1, 2, 4]);
        assert_eq!(in0, Some(32));
        let mut r = rand::rngs::StdRng::seed_from_u64(1);
        let shape = Shape {
            n: 8,
            d0: 2,
            d1: 4,
            s0: 4,
            s1: 1,
        };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            oracle(&text, Op::Add, &[shape], &mut r)
        }));
        assert!(ran.is_err(), "the fast path read inside in0");
    }
    assert_refused(&text, Op::Add.entry(), "non_elementwise_address", "");
}

/// Attacks the Strided family holds, each refused at load with its exact
/// reason: the fast-path test made on another arg, with the wrong mask,
/// its branch inverted or its compare negated; a signed 32-bit division;
/// a sign-extended quotient; `q × q` for `q × d`; the slow path dividing
/// by another arg; a quotient of `i + 1`; a product that wraps 2^64 in a
/// coefficient; params read past the modelled set (past the last param,
/// the high half of an arg, a param symbol taken as an address).
#[test]
fn held_strided_attacks_are_refused_with_their_reason() {
    let a = add_o3();
    let r = |from: &str, to: &str| replaced(&a, from, to);
    let cases: Vec<(&str, String, &str)> = vec![
        ("fits32 on (i | s0)", r("or.b64  \t%rd17, %rd1, %rd13;", "or.b64  \t%rd17, %rd1, %rd11;"), "non_elementwise_address"),
        ("the wrong mask", r("and.b64  \t%rd18, %rd17, -4294967296;", "and.b64  \t%rd18, %rd17, -4294967295;"), "non_elementwise_address"),
        ("the branch inverted", r("@%p2 bra \t$L__BB0_3;", "@!%p2 bra \t$L__BB0_3;"), "non_elementwise_address"),
        ("the compare negated", r("setp.eq.s64 \t%p2, %rd18, 0;", "setp.ne.s64 \t%p2, %rd18, 0;"), "non_elementwise_address"),
        ("div.s32", r("div.u32 \t%r6, %r5, %r4;", "div.s32 \t%r6, %r5, %r4;"), "non_elementwise_address"),
        ("a sign-extended quotient", r("cvt.u64.u32 \t%rd32, %r6;", "cvt.s64.s32 \t%rd32, %r6;"), "non_elementwise_address"),
        ("q × q for q × d", r("mul.lo.s32 \t%r7, %r6, %r4;", "mul.lo.s32 \t%r7, %r6, %r6;"), "non_elementwise_address"),
        ("the slow path divides by s1", r("div.s64 \t%rd32, %rd1, %rd13;", "div.s64 \t%rd32, %rd1, %rd12;"), "non_elementwise_address"),
        ("(i + 1) / d", r("div.s64 \t%rd32, %rd1, %rd13;", "add.s64 \t%rd19, %rd1, 1;\n\tdiv.s64 \t%rd32, %rd19, %rd13;"), "non_elementwise_address"),
        (
            "a coefficient wrapping 2^64",
            r("shl.b64 \t%rd23, %rd21, 2;", "shl.b64 \t%rd23, %rd21, 63;\n\tadd.s64 \t%rd23, %rd23, %rd23;\n\tshl.b64 \t%rd24, %rd21, 2;\n\tadd.s64 \t%rd23, %rd23, %rd24;"),
            "non_elementwise_address",
        ),
        (
            "a param load past the last param",
            r(
                "ld.param.u64 \t%rd13, [add_f32_strided_param_7];",
                "ld.param.u64 \t%rd13, [add_f32_strided_param_7+8];",
            ),
            "param_out_of_range",
        ),
        (
            "the high half of an arg",
            r(
                "ld.param.u64 \t%rd13, [add_f32_strided_param_7];",
                "ld.param.u32 \t%r1, [add_f32_strided_param_7+4];\n\tld.param.u64 \t%rd13, [add_f32_strided_param_7];",
            ),
            "param_out_of_range",
        ),
        (
            "a param load through a register",
            r(
                "ld.param.u64 \t%rd13, [add_f32_strided_param_7];",
                "mov.u64 \t%rd13, add_f32_strided_param_6;\n\tld.param.u64 \t%rd13, [%rd13];",
            ),
            "global_variable",
        ),
        ("the fast path always", r("@%p2 bra \t$L__BB0_3;", "bra.uni \t$L__BB0_3;"), "unreachable_code"),
    ];
    for (what, text, want) in cases {
        let (v, why) = verdict(&text, Op::Add.entry());
        assert_eq!(v, want, "{what}: {why}");
    }
}

/// At launch: an arg whose bits are past `i64::MAX` (a `.u64` divisor of
/// `2^63`, which `div.s64` reads as negative) holds no value, so the
/// divisor precondition refuses it; a coefficient of `2^62 + 4` (accepted
/// at load) is held by `strided_index_fits_i64` at any shape where it
/// scales a non-zero index, and runs where it scales only zeros.
#[test]
fn args_past_i64_and_huge_coefficients_are_held_at_launch() {
    let k = HostKernel::compile_with(&add_o3(), Op::Add.entry(), Families::ALL).unwrap();
    let c = k.contract();
    let v = c.values(8, k.block_size());
    let failing: Vec<&str> = c
        .preconditions
        .iter()
        .filter(|p| !p.holds_with(&v, &[4, 1, 2, 1 << 63]))
        .map(|p| p.name)
        .collect();
    assert!(failing.contains(&"divisor_positive"), "{failing:?}");
    let huge = replaced(
        &add_o3(),
        "shl.b64 \t%rd23, %rd21, 2;",
        "mul.lo.s64 \t%rd23, %rd21, 4611686018427387908;",
    );
    let k = HostKernel::compile_with(&huge, Op::Add.entry(), Families::ALL).unwrap();
    let c = k.contract();
    let v = c.values(8, k.block_size());
    let failing: Vec<&str> = c
        .preconditions
        .iter()
        .filter(|p| !p.holds_with(&v, &[4, 1, 2, 4]))
        .map(|p| p.name)
        .collect();
    assert_eq!(failing, ["strided_index_fits_i64"]);
    // s0 = 0 and d1 = 1: every in0 index is 0.
    let mut r = rand::rngs::StdRng::seed_from_u64(3);
    let shape = Shape {
        n: 5,
        d0: 5,
        d1: 1,
        s0: 0,
        s1: 1,
    };
    let v = c.values(5, k.block_size());
    assert!(c.preconditions.iter().all(|p| p.holds_with(
        &v,
        &Op::Add
            .args(&shape)
            .iter()
            .map(|a| *a as u64)
            .collect::<Vec<_>>()
    )));
    oracle(&huge, Op::Add, &[shape], &mut r);
}

// ---------------------------------------------------------------------
// Frame holes of the same classes found while closing the above (w29f)
// ---------------------------------------------------------------------

/// `cvt.s32.s8` into a 64-bit register: PTX sign-extends the `.s32`
/// result to the register (`-1` becomes `2^64 - 1`); read as the `.s32`
/// value `0xffffffff`, `+ 1` then `>> 32` is 1 to the domain and 0 on
/// the GPU, so the index `- 1` is 0 to it and `0xffffffff` on the GPU.
const CVT_SEXT_INDEX: &str = "mov.u32 	%r9, 255;\n\tcvt.s32.s8 	%rd20, %r9;\n\tadd.s64 	%rd21, %rd20, 1;\n\tshr.u64 	%rd22, %rd21, 32;\n\tcvt.u32.u64 	%r10, %rd22;\n\tadd.s32 	%r7, %r10, -1;";

/// Class: a write of fewer bits than the register holds (the relaxed
/// rule of `cvt`'s destination): a negative signed result is
/// sign-extended to the register, not kept as its `.sN` bits.
#[test]
fn a_signed_cvt_into_a_wider_register_is_sign_extended() {
    let gpu = i64::from(i32::from(0xffu8 as i8)) as u64; // the register
    assert_eq!((gpu.wrapping_add(1) >> 32) as u32, 0);
    assert_refused(
        &frame_kernel(16, CVT_SEXT_INDEX),
        "framed",
        "local_memory",
        "may access byte offsets",
    );
}

/// Class: a compare at a type the domain does not model (`.bf16`) must
/// leave both of its edges open. It closed both: the code past the
/// branch, and the frame access there, were never checked (the access was
/// then refused only because the lowering left it as local memory).
#[test]
fn an_unmodelled_compare_type_leaves_both_edges_open() {
    let text = frame_kernel(
        16,
        "mov.b16 	%rs1, 16256;\n\tsetp.lt.bf16 	%p3, %rs1, %rs1;\n\t@%p3 bra 	$L__END;\n\tmov.u32 	%r7, %r4;",
    )
    .replace(".reg .b32 	%r<24>;", ".reg .b32 	%r<24>;\n\t.reg .b16 	%rs<4>;");
    assert_refused(&text, "framed", "local_memory", "may access byte offsets");
}

/// Class: no panic on any path a kernel reaches. Types past 64 bits
/// (`.b128`, `mul.wide.u64`, `.u128`) overflowed the domain's shifts
/// (a panic in a debug build); they are unmodelled (unknown) now, and the
/// verifier downstream gives each its own verdict.
#[test]
fn types_past_64_bits_do_not_panic_the_frame_proof() {
    let with_q = |index: &str| {
        frame_kernel(16, index).replace(
            ".reg .b32 	%r<24>;",
            ".reg .b32 	%r<24>;\n\t.reg .b128 	%q<4>;",
        )
    };
    let (v, why) = verdict(&with_q("mov.b128 	%q1, 5;\n\tmov.u32 	%r7, 0;"), "framed");
    assert_eq!(v, "accepted", "{why}");
    assert_refused(
        &with_q("mov.u64 	%rd20, 3;\n\tmul.wide.u64 	%q1, %rd20, %rd20;\n\tmov.u32 	%r7, 0;"),
        "framed",
        "operand_type",
        "`.wide` of `.u64`",
    );
    assert_refused(
        &with_q("setp.lt.u128 	%p3, 5, %q1;\n\tmov.u32 	%r7, 0;"),
        "framed",
        "unsupported_instruction",
        "`.u128`",
    );
}
