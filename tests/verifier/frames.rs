//! Indexed local frames (`src/ptx/inline/frame.rs`): the precise
//! `sinf`/`cosf` of NVRTC -O3, whose Payne-Hanek slow path fills a 28-byte
//! frame in a loop and reads it back at computed indices, run on the host
//! engine against a reference (including arguments past 105615 that take
//! the slow path and values near multiples of pi/2), and every attack on
//! the frame proof is refused with its exact sub_reason.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::refusal;
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::{Rng, SeedableRng};

fn jit(file: &str) -> String {
    let path = format!("{}/tests/corpus/jit/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

/// Runs `entry` of `text` on the host engine over `x` (4-byte elements),
/// the output poisoned, and checks the tail past `n` is untouched.
fn run(text: &str, entry: &str, x: &[u32], threads: usize) -> Vec<u32> {
    let k = HostKernel::compile_with(text, entry, Families::ALL)
        .unwrap_or_else(|e| panic!("{entry}: {e}"));
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
    assert!(
        out[n * 4..].iter().all(|b| *b == 0xFF),
        "{entry}: tail written"
    );
    out.chunks(4)
        .take(n)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The distance in f32 ulps between `got` and the f64 `want`, measured in
/// ulps of `want` rounded to f32.
fn ulps(got: f32, want: f64) -> f64 {
    let w = want as f32;
    let ulp = (f32::from_bits(w.abs().to_bits() + 1) - w.abs()).max(f32::from_bits(1));
    (f64::from(got) - want).abs() / f64::from(ulp)
}

/// The arguments: small, near multiples of pi/2, past 105615 (the slow
/// path) up to the largest floats, and the special values.
fn arguments(r: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    let mut xs = vec![
        0.0,
        -0.0,
        105_615.0,
        -105_615.0,
        105_616.0,
        1.0e6,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        3.0e38,
        1.0e20,
    ];
    while xs.len() < n {
        let x = match xs.len() % 4 {
            0 => r.random_range(-10.0f32..10.0),
            1 => {
                let k = f64::from(r.random_range(-1_000_000i32..1_000_000));
                let near = k * std::f64::consts::FRAC_PI_2;
                let x = near as f32;
                f32::from_bits(x.to_bits().wrapping_add(r.random_range(0..3)))
            }
            2 => {
                let e = r.random_range(17.0f32..127.0);
                let m = r.random_range(1.0f32..2.0);
                let x = m * 2f32.powf(e);
                if x.is_finite() {
                    x
                } else {
                    f32::MAX
                }
            }
            _ => -r.random_range(105_615.0f32..1.0e9),
        };
        xs.push(x);
    }
    xs
}

/// NVRTC -O3 `sinf`/`cosf` (precise, Payne-Hanek slow path through a
/// 28-byte indexed local frame) are accepted, lowered with no local memory
/// left, and run on the host engine within CUDA's documented 2-ulp bound of
/// the f64 result, slow path included; the special values are exact
/// (`sin(±0) = ±0`, `sin(±inf)` and `sin(NaN)` NaN).
#[test]
fn precise_sinf_and_cosf_match_the_reference() {
    let mut r = rand::rngs::StdRng::seed_from_u64(29);
    for (file, entry, f) in [
        (
            "nvrtc/sin_f32_O3.ptx",
            "sin_f32",
            f64::sin as fn(f64) -> f64,
        ),
        ("nvrtc/cos_f32_O3.ptx", "cos_f32", f64::cos),
        ("nvrtc/sin_f32_G.ptx", "sin_f32", f64::sin),
        ("nvrtc/cos_f32_G.ptx", "cos_f32", f64::cos),
    ] {
        let text = jit(file);
        assert!(
            text.contains("_depot0[28]") || text.contains("_depot1[28]"),
            "{file}"
        );
        let canonical = ptx::canonicalize_with(&text, entry, None, Families::ALL)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            !canonical.text.contains(".local"),
            "{file}: local memory left"
        );
        for threads in [1, 3] {
            let mut xs = arguments(&mut r, 700);
            xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
            let bits: Vec<u32> = xs.iter().map(|x| x.to_bits()).collect();
            let got = run(&text, entry, &bits, threads);
            let mut slow = 0;
            for (x, g) in xs.iter().zip(&got) {
                let g = f32::from_bits(*g);
                let want = f(f64::from(*x));
                if !x.is_finite() {
                    assert!(g.is_nan(), "{entry}({x}) = {g}");
                    continue;
                }
                if x.abs() >= 105_615.0 {
                    slow += 1;
                }
                if entry == "sin_f32" && *x == 0.0 {
                    assert_eq!(g.to_bits(), x.to_bits(), "{entry}({x})");
                }
                let e = ulps(g, want);
                assert!(e <= 2.0, "{entry}({x:e}) = {g:e}, want {want:e} ({e} ulp)");
            }
            assert!(slow > 100, "{entry}: only {slow} slow-path arguments");
        }
    }
}

/// A hand-written kernel with an indexed frame: `frame[k] = x + k` for `k`
/// in `0..count` (a loop through a pointer bumped by 4, the counter
/// compared with a constant, as NVRTC writes it), then
/// `out = frame[(x & mask) + extra]` read at byte offset `off`.
fn framed(size: u32, count: u32, index: &str, off: i32, after: &str) -> String {
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
	.reg .pred 	%p<4>;
	.reg .b32 	%r<16>;
	.reg .b64 	%rd<24>;

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
	ld.local.u32 	%r8, [%rd12+{off}];
	cvta.to.global.u64 	%rd13, %rd2;
	add.s64 	%rd14, %rd13, %rd8;
	st.global.u32 	[%rd14], %r8;
	{after}
$L__END:
	ret;
}}
"#
    )
}

const MASK3: &str = "and.b32 	%r7, %r4, 3;";

/// The frame proof accepts the in-bounds kernel, and it runs exactly:
/// `out = x + (x & 3)`.
#[test]
fn an_indexed_frame_inside_its_bounds_runs_exactly() {
    let text = framed(16, 4, MASK3, 0, "");
    let c = ptx::canonicalize_with(&text, "framed", None, Families::ALL).unwrap();
    assert!(!c.text.contains(".local") && !c.text.contains("__local_depot0"));
    let mut r = rand::rngs::StdRng::seed_from_u64(2929);
    for threads in [1, 3] {
        let x: Vec<u32> = (0..1000).map(|_| r.random()).collect();
        let got = run(&text, "framed", &x, threads);
        for (x, g) in x.iter().zip(&got) {
            assert_eq!(*g, x.wrapping_add(x & 3), "x={x}");
        }
    }
    // Read one slot lower through a negative displacement, the index
    // bounded away from 0 on the path that reaches the read.
    let guarded = framed(
        16,
        4,
        "and.b32 	%r7, %r4, 3;\n\tsetp.eq.u32 	%p3, %r7, 0;\n\t@%p3 bra 	$L__END;",
        -4,
        "",
    );
    let x: Vec<u32> = (0..500).map(|_| r.random()).collect();
    let got = run(&guarded, "framed", &x, 1);
    for (x, g) in x.iter().zip(&got) {
        let want = if x & 3 == 0 {
            0xFFFF_FFFF
        } else {
            x.wrapping_add((x & 3) - 1)
        };
        assert_eq!(*g, want, "x={x}");
    }
}

fn assert_local(text: &str, needle: &str) {
    let (sub, why) = refusal(text, "framed");
    assert_eq!(sub, "local_memory", "{why}");
    assert!(why.contains(needle), "{why}");
}

/// A read one element past the frame (index 3 at displacement +4 of a
/// 16-byte frame) is refused, naming the access and its offsets.
#[test]
fn an_indexed_access_one_element_past_its_frame_is_refused() {
    assert_local(
        &framed(16, 4, MASK3, 4, ""),
        "`ld.local.u32` may access byte offsets 4..=16",
    );
    // The index one bit too wide.
    assert_local(
        &framed(16, 4, "and.b32 	%r7, %r4, 7;", 0, ""),
        "byte offsets 0..=28",
    );
}

/// A loop whose counter runs one step too far writes past the frame on its
/// last iteration.
#[test]
fn a_loop_escaping_its_frame_on_the_last_iteration_is_refused() {
    assert_local(
        &framed(16, 5, MASK3, 0, ""),
        "`st.local.u32` may access byte offsets 16..=16",
    );
}

/// A negative index (the displacement -4 with index 0 reachable).
#[test]
fn a_negative_index_is_refused() {
    assert_local(&framed(16, 4, MASK3, -4, ""), "byte offsets -4..=8");
}

/// An index bounded on one path only: `x < 4` on the branch taken, masked
/// with 7 on the other.
#[test]
fn an_index_bounded_on_one_path_only_is_refused() {
    let one_path = |mask: u32| {
        format!(
            "mov.b32 	%r7, %r4;\n\tsetp.lt.u32 	%p3, %r7, 4;\n\t@%p3 bra 	$L__IN;\n\tand.b32 	%r7, %r7, {mask};\n$L__IN:"
        )
    };
    assert_local(&framed(16, 4, &one_path(7), 0, ""), "byte offsets");
    // Bounded on both paths: accepted, and exact.
    let both = framed(16, 4, &one_path(3), 0, "");
    let x: Vec<u32> = (0..300)
        .map(|k| if k % 2 == 0 { k / 100 } else { 0x9000_0000 + k })
        .collect();
    let got = run(&both, "framed", &x, 1);
    for (x, g) in x.iter().zip(&got) {
        let i = if *x < 4 { *x } else { x & 3 };
        assert_eq!(*g, x.wrapping_add(i), "x={x}");
    }
}

/// A frame address stored to global memory escapes: refused.
#[test]
fn a_frame_pointer_stored_to_global_memory_is_refused() {
    assert_local(
        &framed(16, 4, MASK3, 0, "st.global.u64 	[%rd14], %rd12;"),
        "must not escape",
    );
    // Compared, or offset by data (unbounded): refused too.
    assert_local(
        &framed(16, 4, MASK3, 0, "setp.eq.u64 	%p3, %rd12, %rd3;"),
        "must not escape",
    );
}

/// The never-written rule: the frame is zeroed at entry, so a read of a
/// slot no store wrote reads 0 (never another kernel's data): with only
/// `frame[0]` written, `out = x` when `x & 3 == 0`, else 0.
#[test]
fn a_never_written_frame_byte_reads_zero() {
    let text = framed(16, 1, MASK3, 0, "");
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
    let x: Vec<u32> = (0..800).map(|_| r.random()).collect();
    for threads in [1, 3] {
        let got = run(&text, "framed", &x, threads);
        for (x, g) in x.iter().zip(&got) {
            assert_eq!(*g, if x & 3 == 0 { *x } else { 0 }, "x={x}");
        }
    }
}

/// A frame larger than the limit is refused, naming it.
#[test]
fn a_frame_larger_than_the_limit_is_refused() {
    let big = ptx::inline::MAX_INDEXED_FRAME as u32 + 4;
    assert_local(&framed(big, 4, MASK3, 0, ""), "more than the 256");
    // At the limit: accepted.
    let at = ptx::inline::MAX_INDEXED_FRAME as u32;
    ptx::canonicalize_with(&framed(at, 4, MASK3, 0, ""), "framed", None, Families::ALL).unwrap();
}

/// A loop with no constant bound on its counter cannot be unrolled: what it
/// indexes is unbounded, refused.
#[test]
fn an_unbounded_loop_over_the_frame_is_refused() {
    let text = framed(16, 4, MASK3, 0, "")
        .replace("setp.ne.s32 	%p2, %r5, 4;", "setp.ne.s32 	%p2, %r5, %r4;");
    assert_local(&text, "`st.local.u32` may access byte offsets");
}

/// A kernel reading an initialized module table (as `sinf` reads
/// `__cudart_i2opi_f`): `out = tab[x & 3] + x` through `[table + 4 *
/// index + off]`, `extra` right after the read.
fn tabled(index: &str, off: i32, extra: &str) -> String {
    format!(
        r#".version 9.0
.target sm_90
.address_size 64
.global .align 4 .b8 tab[16] = {{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 128, 255, 255, 255, 255}};

.visible .entry tabled(
	.param .u64 tabled_param_0,
	.param .u64 tabled_param_1,
	.param .u64 tabled_param_2
)
{{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<16>;
	.reg .b64 	%rd<24>;

	ld.param.u64 	%rd1, [tabled_param_0];
	ld.param.u64 	%rd2, [tabled_param_1];
	ld.param.u64 	%rd3, [tabled_param_2];
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
	{index}
	mul.wide.u32 	%rd11, %r7, 4;
	mov.u64 	%rd10, tab;
	add.s64 	%rd12, %rd10, %rd11;
	ld.global.nc.u32 	%r8, [%rd12+{off}];
	{extra}
	add.s32 	%r9, %r8, %r4;
	cvta.to.global.u64 	%rd13, %rd2;
	add.s64 	%rd14, %rd13, %rd8;
	st.global.u32 	[%rd14], %r9;
$L__END:
	ret;
}}
"#
    )
}

/// A constant table read at proven offsets becomes a `selp` chain of its
/// words (no global variable left), and runs exactly.
#[test]
fn a_constant_table_read_in_bounds_runs_exactly() {
    let text = tabled(MASK3, 0, "");
    let c = ptx::canonicalize_with(&text, "tabled", None, Families::ALL).unwrap();
    assert!(
        !c.text.contains("tab[") && !c.text.contains(", tab;"),
        "{}",
        c.text
    );
    let words = [1u32, 2, 0x8000_0003, 0xFFFF_FFFF];
    let mut r = rand::rngs::StdRng::seed_from_u64(99);
    let x: Vec<u32> = (0..700).map(|_| r.random()).collect();
    for threads in [1, 3] {
        let got = run(&text, "tabled", &x, threads);
        for (x, g) in x.iter().zip(&got) {
            assert_eq!(*g, words[(x & 3) as usize].wrapping_add(*x), "x={x}");
        }
    }
}

/// A table read past its end, or a table written, stays a global variable
/// (refused as before: `global_variable`).
#[test]
fn a_table_read_past_its_end_or_written_is_refused() {
    let (sub, why) = refusal(&tabled(MASK3, 4, ""), "tabled");
    assert_eq!(sub, "global_variable", "{why}");
    let (sub, why) = refusal(&tabled("and.b32 	%r7, %r4, 7;", 0, ""), "tabled");
    assert_eq!(sub, "global_variable", "{why}");
    let (sub, why) = refusal(&tabled(MASK3, 0, "st.global.u32 	[%rd12], %r4;"), "tabled");
    assert_eq!(sub, "global_variable", "{why}");
}

/// The frame proof against ground truth over mutated frame sizes, loop
/// bounds, index masks and displacements of [`framed`]: accepted exactly
/// when every store (`0..count`) and every read (`4 × (x & mask) + off`)
/// is inside the frame, and then the host result is the reference (slots
/// never written read 0).
#[test]
fn mutated_frame_indices_are_accepted_exactly_when_in_bounds() {
    let mut r = rand::rngs::StdRng::seed_from_u64(0xF4A3);
    let mut accepted = 0;
    let mut refused = 0;
    for size in [8u32, 16, 28, 32] {
        for count in 1..=size / 4 + 1 {
            for mask in [0u32, 1, 3, 7] {
                for off in [-8i32, -4, 0, 4, 8, 12] {
                    let index = format!("and.b32 \t%r7, %r4, {mask};");
                    let text = framed(size, count, &index, off, "");
                    let stores_in = count * 4 <= size;
                    let reads_in = off >= 0 && 4 * mask as i32 + off + 4 <= size as i32;
                    let got = ptx::canonicalize_with(&text, "framed", None, Families::ALL);
                    let what = format!("size {size} count {count} mask {mask} off {off}");
                    if !(stores_in && reads_in) {
                        match got {
                            Err(PtxError::NonScalarAbi { sub_reason, .. }) => {
                                assert_eq!(sub_reason, "local_memory", "{what}")
                            }
                            other => panic!("{what}: accepted out of bounds: {other:?}"),
                        }
                        refused += 1;
                        continue;
                    }
                    got.unwrap_or_else(|e| panic!("{what}: {e}"));
                    accepted += 1;
                    let x: Vec<u32> = (0..64).map(|_| r.random()).collect();
                    let out = run(&text, "framed", &x, 1);
                    for (x, g) in x.iter().zip(&out) {
                        let k = (x & mask) + (off / 4) as u32;
                        let want = if k < count { x.wrapping_add(k) } else { 0 };
                        assert_eq!(*g, want, "{what} x={x}");
                    }
                }
            }
        }
    }
    assert!(
        accepted > 20 && refused > 20,
        "{accepted} accepted, {refused} refused"
    );
}

/// The slow path's guard is what bounds `sinf`'s frame index: with the
/// threshold lowered to 1.0 (exponents from 127, so `exponent - 128` may be
/// -1 and the index wraps) or the guard's branch removed, the reads are
/// refused, naming the access.
#[test]
fn sinf_without_its_magnitude_guard_is_refused() {
    let text = jit("nvrtc/sin_f32_O3.ptx");
    for broken in [
        text.replace(
            "setp.ltu.f32 \t%p2, %f3, 0f47CE4780;",
            "setp.ltu.f32 \t%p2, %f3, 0f3F800000;",
        ),
        text.replace("@%p2 bra \t$L__BB0_9;", ""),
    ] {
        assert_ne!(broken, text);
        let (sub, why) = refusal(&broken, "sin_f32");
        assert_eq!(sub, "local_memory", "{why}");
        assert!(
            why.contains("`ld.local.u32` may access byte offsets"),
            "{why}"
        );
    }
}

/// NVRTC `-G` Vectorized{2,4} builds (a generic `ld.v4`/`st.v4` through
/// the param, or a `float2` loaded and stored as two 4-byte lanes; the
/// vector built lane by lane in a promoted frame) are accepted with the
/// vector as the element, and run on the host against the reference, every
/// lane bit for bit (`-G` contracts no `fma`: `a × p0 + p1` rounds twice),
/// the tail untouched.
#[test]
fn vectorized_debug_builds_match_the_reference() {
    let mut r = rand::rngs::StdRng::seed_from_u64(4);
    for (file, entry, width) in [
        ("nvrtc/add_f32_vec4_G.ptx", "add_f32_vec4", 4usize),
        ("nvrtc/affine_f32_vec4_G.ptx", "affine_f32_vec4", 4),
        ("nvrtc/add_f32_vec2_G.ptx", "add_f32_vec2", 2),
        ("nvrtc/affine_f32_vec2_G.ptx", "affine_f32_vec2", 2),
    ] {
        let text = jit(file);
        let (sig, _) = ptx::verify_contract(&text, entry, None, Families::ALL)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            sig.element_sizes.iter().all(|s| *s as usize == 4 * width),
            "{file}: {sig:?}"
        );
        let k = HostKernel::compile_with(&text, entry, Families::ALL)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let affine = entry.starts_with("affine");
        assert!(!text.contains("fma.rn.f32"), "{file}");
        for (n, threads) in [(1usize, 1usize), (129, 3), (1000, 2)] {
            let count = n * width;
            let a: Vec<f32> = (0..count).map(|_| r.random_range(-100.0..100.0)).collect();
            let b: Vec<f32> = (0..count).map(|_| r.random_range(-100.0..100.0)).collect();
            let (p0, p1) = (r.random_range(-4f32..4.0), r.random_range(-4f32..4.0));
            let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let mut bufs = if affine {
                vec![bytes(&a)]
            } else {
                vec![bytes(&a), bytes(&b)]
            };
            let params = if affine { vec![p0, p1] } else { vec![] };
            let mut out = vec![0xFFu8; count * 4 + 16];
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
                params: &params,
                threads,
                checked: threads > 1,
                control: None,
            };
            // SAFETY: every span is a live Vec of exactly `len` bytes.
            unsafe { k.launch(&l) }.unwrap();
            for j in 0..count {
                let got = f32::from_le_bytes(out[j * 4..j * 4 + 4].try_into().unwrap());
                let want = if affine { a[j] * p0 + p1 } else { a[j] + b[j] };
                assert_eq!(got.to_bits(), want.to_bits(), "{file} n={n} [{j}]");
            }
            assert!(out[count * 4..].iter().all(|b| *b == 0xFF), "{file} n={n}");
        }
    }
}

/// A generic vector access is held to the Vectorized family's rule like a
/// global one: the `float4` read at a stride of 8 bytes (threads overlap)
/// is refused, and so is a generic `.v4` read with the family off.
#[test]
fn a_generic_vector_access_is_held_to_one_whole_vector_per_thread() {
    let text = jit("nvrtc/add_f32_vec4_G.ptx");
    let strided = text.replacen("shl.b64 \t%rd10, %rd1, 4;", "shl.b64 \t%rd10, %rd1, 3;", 1);
    assert_ne!(strided, text);
    let (sub, why) = refusal(&strided, "add_f32_vec4");
    assert_eq!(sub, "vectorized_access", "{why}");
    match ptx::canonicalize_with(&text, "add_f32_vec4", None, Families::SCALAR) {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => {
            assert_eq!(sub_reason, "vectorized_access")
        }
        other => panic!("{other:?}"),
    }
}

/// A lane of a `float2` element is held inside its element: a lane at byte
/// 8 of an 8-byte element (the next thread's) or at a misaligned byte 6 is
/// refused, lanes that do not cover their element together (lane 0 read
/// twice: one float of every two) are refused, and without the Vectorized
/// family any lane access is.
#[test]
fn a_lane_outside_its_vector_element_is_refused() {
    let text = jit("nvrtc/add_f32_vec2_G.ptx");
    assert!(text.contains("[%rd11+4]"));
    for lane in ["[%rd11+8]", "[%rd11+6]", "[%rd11+-4]", "[%rd11+0]"] {
        let (sub, why) = refusal(&text.replace("[%rd11+4]", lane), "add_f32_vec2");
        assert_eq!(sub, "non_elementwise_address", "{lane}: {why}");
    }
    match ptx::canonicalize_with(&text, "add_f32_vec2", None, Families::SCALAR) {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => {
            assert_eq!(sub_reason, "non_elementwise_address")
        }
        other => panic!("{other:?}"),
    }
}
