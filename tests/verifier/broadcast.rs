//! Inductor's 2-D broadcast kernels (`gelu(x + bias)`, the bias indexed
//! `x mod D`): the four corpus builds accepted with their contracts named
//! exactly, run on the host engine against a Rust reference (fresh random
//! inputs and shapes, a poisoned output, every element compared, each
//! buffer exactly its footprint), launches outside the contract refused by
//! name, the idiom accepted as a class (another power of two, the other
//! branch order), and attacks on it refused with their exact reason.
//!
//! The static builds compute `x mod 1024` as LLVM's signed remainder by a
//! power of two (`x - ((x + bias) & -1024)`, `bias` 1023 for a negative
//! `x` from a `bfe` of its sign), without a mask: every block is full. The
//! dynamic builds compute `x mod ks0` (`ks0` a `.u64` param) with LLVM's
//! split: `rem.s64` unless `(x | ks0) >> 32 == 0`, then `rem.u32`.

#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::contract::{LaunchContract, ParamKind, ScalarType};
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::Rng;

const ENTRY: &str = "triton_poi_fused_add_gelu_0";
const KS0: &str = "triton_poi_fused_add_gelu_0_param_3";

fn kernel(build: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit/inductor");
    std::fs::read_to_string(root.join(format!("bias_gelu_2d_f32_{build}.ptx"))).unwrap()
}

/// The contract, or the refusal's sub_reason.
fn verdict(text: &str) -> Result<LaunchContract, &'static str> {
    match ptx::canonicalize_with(text, ENTRY, None, Families::ALL) {
        Ok(c) => Ok(c.contract),
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => Err(sub_reason),
        Err(e) => panic!("not a verdict: {e}"),
    }
}

/// `text` with every `from` replaced by `to` (which must be there).
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the kernel");
    text.replace(from, to)
}

/// The footprints and preconditions as text, arguments by name.
fn terms(c: &LaunchContract) -> (Vec<String>, Vec<String>) {
    let args = c.arg_names();
    (
        c.footprints
            .iter()
            .map(|f| {
                format!(
                    "{}[{}] align {}",
                    f.param,
                    f.bytes.named(&args),
                    f.alignment
                )
            })
            .collect(),
        c.preconditions.iter().map(|p| p.text(&args)).collect(),
    )
}

/// Elements per block of each build (`BLOCK_SIZE`): 128 threads times 4
/// or 2 elements.
fn per_block(build: &str) -> u64 {
    match build {
        "static_0" | "dyn_1" => 512,
        _ => 256,
    }
}

#[test]
fn the_four_builds_are_accepted_with_their_contracts() {
    for build in ["static_0", "static_1"] {
        let c = verdict(&kernel(build)).unwrap_or_else(|r| panic!("{build}: {r}"));
        let e = per_block(build);
        let align = 4 * e / 128;
        let kinds: Vec<ParamKind> = c.params.iter().map(|p| p.kind.clone()).collect();
        assert_eq!(kinds[3], ParamKind::Count(ScalarType::U32), "{build}");
        assert_eq!(c.scalar_params(), 0, "{build}");
        assert_eq!(
            terms(&c),
            (
                vec![
                    format!("0[roundup(n, {e}) × 4] align {align}"),
                    format!("1[4096] align {align}"),
                    format!("2[roundup(n, {e}) × 4] align {align}"),
                ],
                vec![
                    "count_fits_i32: n <= 2147483647".to_string(),
                    format!("index_fits_i32: grid × {e} <= 2^31"),
                ]
            ),
            "{build}"
        );
    }
    for build in ["dyn_0", "dyn_1"] {
        let c = verdict(&kernel(build)).unwrap_or_else(|r| panic!("{build}: {r}"));
        let e = per_block(build);
        let kinds: Vec<ParamKind> = c.params.iter().map(|p| p.kind.clone()).collect();
        assert_eq!(kinds[3], ParamKind::Scalar(ScalarType::U64), "{build}");
        assert_eq!(kinds[4], ParamKind::Count(ScalarType::U32), "{build}");
        assert_eq!(c.arg_names(), [KS0], "{build}");
        assert_eq!(
            terms(&c),
            (
                vec![
                    "0[n × 4] align 4".to_string(),
                    format!("1[{KS0} × 4] align 4"),
                    "2[n × 4] align 4".to_string(),
                ],
                vec![
                    "count_fits_i32: n <= 2147483647".to_string(),
                    format!("index_fits_i32: grid × {e} <= 2^31"),
                    format!("divisor_positive: {KS0} >= 1"),
                ]
            ),
            "{build}"
        );
    }
}

/// `gelu(y)` as Inductor writes it: `0.5 · y · (1 + erf(y / √2))`.
fn gelu(y: f32) -> f64 {
    let y = f64::from(y);
    0.5 * y * (1.0 + libm::erf(y / std::f64::consts::SQRT_2))
}

/// Runs `k` on `x` and `bias` (fresh random values, `x_len` and
/// `bias_len` elements), a poisoned output of `out_len`, count `n` and
/// `args`: the inputs and the output, or the engine's refusal.
#[allow(clippy::type_complexity)]
fn run(
    k: &HostKernel,
    lens: [usize; 3],
    n: u64,
    args: &[u64],
    rng: &mut impl Rng,
) -> (Vec<Vec<f32>>, Result<Vec<f32>, String>) {
    let mut ins: Vec<Vec<f32>> = lens[..2]
        .iter()
        .map(|&l| (0..l).map(|_| rng.random_range(-4.0f32..4.0)).collect())
        .collect();
    let mut out = vec![f32::from_bits(0x7fc0_dead); lens[2]];
    let spans: Vec<HostSpan> = ins
        .iter_mut()
        .map(|b| HostSpan {
            ptr: b.as_mut_ptr().cast(),
            len: b.len() * 4,
        })
        .collect();
    let launch = HostLaunch {
        inputs: &spans,
        args,
        output: HostSpan {
            ptr: out.as_mut_ptr().cast(),
            len: out.len() * 4,
        },
        n,
        params: &[],
        threads: 2,
        checked: true,
        control: None,
    };
    // SAFETY: every span points into a live Vec of exactly `len` bytes.
    let result = unsafe { k.launch(&launch) };
    (ins, result.map(|()| out).map_err(|e| e.to_string()))
}

/// Every element `i < len` of `out` is `gelu(x[i] + bias[i mod d])`.
fn compare(what: &str, ins: &[Vec<f32>], out: &[f32], d: usize) {
    for (i, o) in out.iter().enumerate() {
        let y = ins[0][i] + ins[1][i % d];
        let want = gelu(y);
        let err = (f64::from(*o) - want).abs();
        assert!(
            err <= 1e-5 * (1.0 + f64::from(y).abs()),
            "{what} at {i}: {o} != gelu({y}) = {want}"
        );
    }
}

/// The contract's bytes of each operand at count `n` with `args`.
fn footprints(k: &HostKernel, n: u64, args: &[u64]) -> Vec<usize> {
    let c = k.contract();
    let v = c.values(n, k.block_size());
    c.footprints
        .iter()
        .map(|f| f.bytes.eval_with(&v, args).unwrap() as usize)
        .collect()
}

/// The static builds at random row counts and tails (every block is full,
/// so `x` and the output are `roundup(n, E)` elements): every element of
/// the output is `gelu(x + bias[i mod 1024])`.
#[test]
fn the_static_builds_run_on_the_host_engine_against_a_reference() {
    let mut rng = super::rng("static bias_gelu shapes");
    for build in ["static_0", "static_1"] {
        let k = HostKernel::compile_with(&kernel(build), ENTRY, Families::ALL).unwrap();
        let e = per_block(build);
        let mut counts: Vec<u64> = (0..3).map(|_| 1024 * rng.random_range(1..9u64)).collect();
        counts.push(rng.random_range(1..4 * e));
        counts.push(1);
        for n in counts {
            let fp = footprints(&k, n, &[]);
            let rounded = n.div_ceil(e) * e;
            assert_eq!(
                fp,
                [rounded as usize * 4, 4096, rounded as usize * 4],
                "{build} n={n}"
            );
            let lens = [fp[0] / 4, fp[1] / 4, fp[2] / 4];
            let (ins, out) = run(&k, lens, n, &[], &mut rng);
            let out = out.unwrap_or_else(|f| panic!("{build} n={n}: {f}"));
            compare(&format!("{build} n={n}"), &ins, &out, 1024);
        }
    }
}

/// The dynamic builds at random `ks0` (any size, a power of two or not)
/// and counts (rows of `ks0` or any tail): every element below `n` is
/// `gelu(x + bias[i mod ks0])`; the bias buffer is exactly `ks0` elements.
#[test]
fn the_dynamic_builds_run_on_the_host_engine_against_a_reference() {
    let mut rng = super::rng("dynamic bias_gelu shapes");
    for build in ["dyn_0", "dyn_1"] {
        let k = HostKernel::compile_with(&kernel(build), ENTRY, Families::ALL).unwrap();
        let mut shapes: Vec<(u64, u64)> = (0..4)
            .map(|_| {
                let ks0 = rng.random_range(1..3000u64);
                (ks0, ks0 * rng.random_range(1..6u64))
            })
            .collect();
        shapes.push((1, rng.random_range(1..5000)));
        shapes.push((rng.random_range(1..5000), rng.random_range(1..5000)));
        shapes.push((1024, 0));
        for (ks0, n) in shapes {
            let fp = footprints(&k, n, &[ks0]);
            assert_eq!(
                fp,
                [n as usize * 4, ks0 as usize * 4, n as usize * 4],
                "{build}"
            );
            let lens = [n as usize, ks0 as usize, n as usize];
            let (ins, out) = run(&k, lens, n, &[ks0], &mut rng);
            let out = out.unwrap_or_else(|f| panic!("{build} ks0={ks0} n={n}: {f}"));
            compare(
                &format!("{build} ks0={ks0} n={n}"),
                &ins,
                &out,
                ks0 as usize,
            );
        }
    }
}

/// A launch outside the contract is refused by name: `ks0 = 0` (a
/// remainder by zero has no value), a negative `ks0` (the kernel's
/// `rem.s64` reads it signed), a bias one element shorter than `ks0`, an
/// `x` short of a static build's last full block.
#[test]
fn launches_outside_the_contract_are_refused_by_name() {
    let mut rng = super::rng("bias_gelu launches");
    let k = HostKernel::compile_with(&kernel("dyn_0"), ENTRY, Families::ALL).unwrap();
    for (ks0, want) in [
        (0u64, format!("{KS0}=0")),
        ((-5i64) as u64, format!("{KS0}=-5")),
    ] {
        let (_, out) = run(&k, [64, 64, 64], 64, &[ks0], &mut rng);
        let fault = out.unwrap_err();
        assert!(
            fault.contains("divisor_positive") && fault.contains(&want),
            "ks0={ks0}: {fault}"
        );
    }
    let ks0 = rng.random_range(2..2000u64);
    let n = ks0 * 3;
    let (_, out) = run(
        &k,
        [n as usize, ks0 as usize - 1, n as usize],
        n,
        &[ks0],
        &mut rng,
    );
    let fault = out.unwrap_err();
    assert!(fault.contains("fewer than its footprint"), "{fault}");
    let (_, out) = run(
        &k,
        [n as usize, ks0 as usize, n as usize],
        n,
        &[ks0],
        &mut rng,
    );
    out.unwrap();

    let k = HostKernel::compile_with(&kernel("static_0"), ENTRY, Families::ALL).unwrap();
    let n = 512 * rng.random_range(1..8u64) + rng.random_range(1..512u64);
    let full = (n.div_ceil(512) * 512) as usize;
    for lens in [
        [n as usize, 1024, full],
        [full, 1023, full],
        [full, 1024, n as usize],
    ] {
        let (_, out) = run(&k, lens, n, &[], &mut rng);
        let fault = out.unwrap_err();
        assert!(
            fault.contains("fewer than its footprint"),
            "{lens:?}: {fault}"
        );
    }
    let (_, out) = run(&k, [full, 1024, full], n, &[], &mut rng);
    out.unwrap();
}

/// The idiom as a class: another power of two (`x mod 512`: the sign
/// shifted by 23, the mask `-512`) gives a 2048-byte bias; the dynamic
/// split with its branches the other way round (`setp.eq`, the 32-bit path
/// taken) or with a negated guard gives the same contract.
#[test]
fn the_idiom_is_accepted_as_a_class() {
    let s = edit(
        &edit(
            &kernel("static_1"),
            "shr.u32 \t%r18, %r17, 22;",
            "shr.u32 \t%r18, %r17, 23;",
        ),
        "and.b32 \t%r20, %r19, -1024;",
        "and.b32 \t%r20, %r19, -512;",
    );
    let c = verdict(&s).unwrap();
    assert_eq!(terms(&c).0[1], "1[2048] align 8");

    let base = verdict(&kernel("dyn_0")).unwrap();
    let swapped = edit(
        &edit(
            &kernel("dyn_0"),
            "setp.ne.b64 \t%p1, %rd8, 0;",
            "setp.eq.b64 \t%p1, %rd8, 0;",
        ),
        "@%p1 bra \t$L__BB0_2;\n\tbra.uni \t$L__BB0_1;",
        "@%p1 bra \t$L__BB0_1;\n\tbra.uni \t$L__BB0_2;",
    );
    assert!(verdict(&swapped).unwrap().same_terms(&base));
    let negated = edit(
        &edit(
            &kernel("dyn_0"),
            "setp.ne.b64 \t%p2, %rd10, 0;",
            "setp.eq.b64 \t%p2, %rd10, 0;",
        ),
        "@%p2 bra \t$L__BB0_5;",
        "@!%p2 bra \t$L__BB0_5;",
    );
    assert!(verdict(&negated).unwrap().same_terms(&base));
}

/// Attacks on the idiom, each refused with its exact reason.
#[test]
fn attacks_on_the_idiom_are_refused_with_their_reason() {
    let st = kernel("static_0");
    let dy = kernel("dyn_0");
    // The 32-bit path's divisor register, and a spare 64-bit register.
    let dy_regs = edit(&dy, ".reg .b64 \t%rd<26>;", ".reg .b64 \t%rd<28>;");
    let cases: Vec<(&str, String, &str)> =
        vec![
        (
            // x - ((x + 1023) & -1024) lies in (-1024, 0]: bias[-1023..0].
            "a rounding of x + 1023 whatever x's sign",
            edit(&st, "add.s32 \t%r29, %r26, %r28;", "add.s32 \t%r29, %r26, 1023;"),
            "unbounded_access",
        ),
        (
            "x - 1 as the signed 64-bit remainder's dividend (rem of -1 is -1)",
            edit(
                &dy_regs,
                "rem.s64 \t%rd24, %rd1, %rd6;",
                "add.s64 \t%rd26, %rd1, -1;\n\trem.s64 \t%rd24, %rd26, %rd6;",
            ),
            "unbounded_access",
        ),
        (
            "an unmasked store one block on (past its block's elements)",
            edit(
                &st,
                "add.s64 \t%rd8, %rd2, %rd9;",
                "add.s64 \t%rd8, %rd2, %rd9;\n\tadd.s64 \t%rd8, %rd8, 2048;",
            ),
            "unbounded_access",
        ),
        (
            // A count the body reads may feed a mask the pass cannot
            // model: no access is then bounded by the grid alone.
            "an unmasked kernel that reads its count",
            edit(
                &st,
                "ld.param.b64 \t%rd7, [triton_poi_fused_add_gelu_0_param_1];",
                "ld.param.b64 \t%rd7, [triton_poi_fused_add_gelu_0_param_1];\n\tld.param.b32 \t%r0, [triton_poi_fused_add_gelu_0_param_3];",
            ),
            "unguarded_access",
        ),
        (
            "a mask that is no power of two (-1000)",
            edit(&st, "and.b32 \t%r30, %r29, -1024;", "and.b32 \t%r30, %r29, -1000;"),
            "unbounded_access",
        ),
        (
            "the remainder plus 4 elements: past the divisor",
            edit(
                &st,
                "mad.wide.s32 \t%rd5, %r31, 4, %rd7;",
                "add.s32 \t%r31, %r31, 4;\n\tmad.wide.s32 \t%rd5, %r31, 4, %rd7;",
            ),
            "unbounded_access",
        ),
        (
            "the 64-bit remainder one element on",
            edit(
                &dy,
                "add.s64 \t%rd16, %rd4, %rd20;",
                "add.s64 \t%rd16, %rd4, %rd20;\n\tadd.s64 \t%rd16, %rd16, 4;",
            ),
            "unbounded_access",
        ),
        (
            "the cache policy used as the address",
            edit(&st, "[ %rd5 + 0 ], %rd4;", "[ %rd4 + 0 ], %rd4;"),
            "unsupported_instruction",
        ),
        (
            "the cache policy as the bias index",
            edit(
                &dy,
                "shl.b64 \t%rd20, %rd24, 2;",
                "shl.b64 \t%rd20, %rd11, 2;",
            ),
            "unsupported_instruction",
        ),
        (
            "a divisor loaded from the bias buffer",
            edit(
                &edit(
                    &dy_regs,
                    "rem.s64 \t%rd24, %rd1, %rd6;",
                    "ld.global.b64 \t%rd27, [%rd4];\n\trem.s64 \t%rd24, %rd1, %rd27;",
                ),
                "rem.u32 \t%r16, %r54, %r15;",
                "ld.global.b32 \t%r15, [%rd4];\n\trem.u32 \t%r16, %r54, %r15;",
            ),
            "unbounded_access",
        ),
        (
            "the 32-bit path dividing by another value than the 64-bit one",
            edit(
                &dy,
                "cvt.u32.u64 \t%r15, %rd6;",
                "mov.u32 \t%r15, 65536;",
            ),
            "unbounded_access",
        ),
        (
            "the 32-bit path after a test of x | ks0, not of its high half",
            edit(&dy, "setp.ne.b64 \t%p1, %rd8, 0;", "setp.ne.b64 \t%p1, %rd7, 0;"),
            "unbounded_access",
        ),
        (
            "the 32-bit path where the test says ks0 does not fit",
            edit(&dy, "setp.ne.b64 \t%p1, %rd8, 0;", "setp.eq.b64 \t%p1, %rd8, 0;"),
            "unbounded_access",
        ),
        (
            "a pointer (the input x's) as the divisor",
            edit(
                &dy,
                "ld.param.b64 \t%rd6, [triton_poi_fused_add_gelu_0_param_3];",
                "ld.param.b64 \t%rd6, [triton_poi_fused_add_gelu_0_param_0];",
            ),
            "pointer_misuse",
        ),
        (
            "a scratch pointer (passed as null) as the divisor",
            edit(
                &dy,
                "ld.param.b64 \t%rd6, [triton_poi_fused_add_gelu_0_param_3];",
                "ld.param.b64 \t%rd6, [triton_poi_fused_add_gelu_0_param_5];",
            ),
            "param_misuse",
        ),
        (
            "a store at the remainder",
            edit(
                &dy,
                "@%p3 ld.global.L1::evict_last.L2::cache_hint.b32 { %r21 }, [ %rd16 + 0 ], %rd15;",
                "@%p3 st.global.b32 [ %rd16 + 0 ], %r19;",
            ),
            "non_elementwise_address",
        ),
    ];
    for (what, text, reason) in cases {
        assert_eq!(verdict(&text).err(), Some(reason), "{what}");
    }
}

/// A branch-free static bias add (the static build's index and remainder
/// idiom without gelu's branches): the Triton oracle interprets only
/// branch-free kernels.
const STATIC_SEED: &str = "\
.version 8.4
.target sm_90a
.address_size 64

.visible .entry bias_add(
\t.param .u64 .ptr .global .align 1 bias_add_param_0,
\t.param .u64 .ptr .global .align 1 bias_add_param_1,
\t.param .u64 .ptr .global .align 1 bias_add_param_2,
\t.param .u32 bias_add_param_3,
\t.param .u64 .ptr .global .align 1 bias_add_param_4,
\t.param .u64 .ptr .global .align 1 bias_add_param_5
)
.reqntid 128
{
\t.reg .b32 \t%r<32>;
\t.reg .b64 \t%rd<10>;
\tld.param.b64 \t%rd6, [bias_add_param_0];
\tld.param.b64 \t%rd7, [bias_add_param_1];
\tmov.u32 \t%r21, %ctaid.x;
\tshl.b32 \t%r22, %r21, 9;
\tmov.u32 \t%r23, %tid.x;
\tshl.b32 \t%r24, %r23, 2;
\tand.b32 \t%r25, %r24, 508;
\tor.b32 \t%r26, %r25, %r22;
\tbfe.s32 \t%r27, %r21, 22, 1;
\tshr.u32 \t%r28, %r27, 22;
\tadd.s32 \t%r29, %r26, %r28;
\tand.b32 \t%r30, %r29, -1024;
\tsub.s32 \t%r31, %r26, %r30;
\tmad.wide.s32 \t%rd3, %r26, 4, %rd6;
\tld.global.v4.b32 \t{ %r13, %r14, %r15, %r16 }, [ %rd3 + 0 ];
\tmad.wide.s32 \t%rd5, %r31, 4, %rd7;
\tld.global.v4.b32 \t{ %r17, %r18, %r19, %r20 }, [ %rd5 + 0 ];
\tadd.f32 \t%r1, %r13, %r17;
\tadd.f32 \t%r2, %r14, %r18;
\tadd.f32 \t%r3, %r15, %r19;
\tadd.f32 \t%r4, %r16, %r20;
\tld.param.b64 \t%rd2, [bias_add_param_2];
\tcvt.s64.s32 \t%rd1, %r26;
\tshl.b64 \t%rd9, %rd1, 2;
\tadd.s64 \t%rd8, %rd2, %rd9;
\tst.global.v4.b32 \t[ %rd8 + 0 ], { %r1, %r2, %r3, %r4 };
\tret;
}
";

/// A branch-free dynamic bias add: the dynamic build's index, `rem.s64`
/// and `rem.u64` by the `.u64` param (no 32-bit path: no branch), masked
/// loads and stores.
const DYNAMIC_SEED: &str = "\
.version 8.4
.target sm_90a
.address_size 64

.visible .entry bias_add(
\t.param .u64 .ptr .global .align 1 bias_add_param_0,
\t.param .u64 .ptr .global .align 1 bias_add_param_1,
\t.param .u64 .ptr .global .align 1 bias_add_param_2,
\t.param .u64 bias_add_param_3,
\t.param .u32 bias_add_param_4,
\t.param .u64 .ptr .global .align 1 bias_add_param_5,
\t.param .u64 .ptr .global .align 1 bias_add_param_6
)
.reqntid 128
{
\t.reg .pred \t%p<3>;
\t.reg .b32 \t%r<23>;
\t.reg .b64 \t%rd<26>;
\tld.param.b64 \t%rd6, [bias_add_param_3];
\tmov.u32 \t%r8, %ctaid.x;
\tshl.b32 \t%r9, %r8, 8;
\tmov.u32 \t%r10, %tid.x;
\tshl.b32 \t%r11, %r10, 1;
\tand.b32 \t%r12, %r11, 254;
\tor.b32 \t%r13, %r12, %r9;
\tor.b32 \t%r14, %r13, 1;
\tcvt.s64.s32 \t%rd1, %r13;
\tcvt.s64.s32 \t%rd2, %r14;
\trem.s64 \t%rd24, %rd1, %rd6;
\trem.u64 \t%rd25, %rd2, %rd6;
\tld.param.b32 \t%r7, [bias_add_param_4];
\tld.param.b64 \t%rd4, [bias_add_param_1];
\tld.param.b64 \t%rd3, [bias_add_param_0];
\tsetp.lt.s32 \t%p1, %r13, %r7;
\tsetp.lt.s32 \t%p2, %r14, %r7;
\tshl.b64 \t%rd19, %rd1, 2;
\tadd.s64 \t%rd12, %rd3, %rd19;
\tadd.s64 \t%rd14, %rd12, 4;
\tmov.u32 \t%r19, 0x0;
\t@%p1 ld.global.b32 \t%r19, [ %rd12 + 0 ];
\tmov.u32 \t%r20, 0x0;
\t@%p2 ld.global.b32 \t%r20, [ %rd14 + 0 ];
\tshl.b64 \t%rd20, %rd24, 2;
\tadd.s64 \t%rd16, %rd4, %rd20;
\tshl.b64 \t%rd21, %rd25, 2;
\tadd.s64 \t%rd18, %rd4, %rd21;
\tmov.u32 \t%r21, 0x0;
\t@%p1 ld.global.b32 \t%r21, [ %rd16 + 0 ];
\tmov.u32 \t%r22, 0x0;
\t@%p2 ld.global.b32 \t%r22, [ %rd18 + 0 ];
\tadd.f32 \t%r1, %r19, %r21;
\tadd.f32 \t%r2, %r20, %r22;
\tld.param.b64 \t%rd5, [bias_add_param_2];
\tadd.s64 \t%rd22, %rd5, %rd19;
\tadd.s64 \t%rd23, %rd22, 4;
\t@%p1 st.global.b32 \t[ %rd22 + 0 ], %r1;
\t@%p2 st.global.b32 \t[ %rd23 + 0 ], %r2;
\tret;
}
";

/// The branch-free seeds are accepted with the broadcast footprints, and
/// the Triton oracle judges them in bounds (and catches a grant one element
/// short: the oracle can fail here).
#[test]
fn the_branch_free_seeds_are_judged_by_the_oracle() {
    let mut r = super::rng("broadcast seeds");
    for (seed, bias) in [
        (STATIC_SEED, "1[4096] align 16"),
        (DYNAMIC_SEED, "1[bias_add_param_3 × 4] align 4"),
    ] {
        let c = ptx::canonicalize_with(seed, "bias_add", None, Families::ALL).unwrap();
        assert_eq!(terms(&c.contract).0[1], bias);
        let judged = (0..40)
            .filter(|_| {
                super::support::mutants::triton_oracle(&c.text, "bias_add", &mut r).unwrap()
            })
            .count();
        assert!(judged > 0);
        let caught = (0..400).any(|_| {
            super::support::mutants::triton_oracle_granting_less(&c.text, "bias_add", &mut r, 4)
                .is_err()
        });
        assert!(caught);
    }
}

/// Random mutants of the branch-free seeds: whatever the proof accepts,
/// interpreted thread by thread at launches whose preconditions hold
/// (the divisor drawn at random), touches only the bytes its contract
/// grants. `PTXD_TRITON_MUTANTS=N` for a longer run, `PTXD_TRITON_SEED=S`
/// to repeat one.
#[test]
fn accepted_broadcast_mutants_stay_inside_their_contract() {
    use rand::seq::IndexedRandom;
    let mut r = super::support::mutants::seeded_rng("PTXD_TRITON_SEED");
    let seeds: Vec<String> = [STATIC_SEED, DYNAMIC_SEED]
        .iter()
        .map(|s| {
            ptx::canonicalize_with(s, "bias_add", None, Families::ALL)
                .unwrap()
                .text
        })
        .collect();
    let rounds = super::support::mutants::count_from("PTXD_TRITON_MUTANTS").unwrap_or(1000);
    let (mut accepted, mut tried) = (0, 0);
    for _ in 0..rounds {
        let text = seeds.choose(&mut r).unwrap();
        let mutant = super::support::mutants::mutate_triton(text, &mut r);
        tried += 1;
        match super::support::mutants::triton_oracle(&mutant, "bias_add", &mut r) {
            Ok(true) => accepted += 1,
            Ok(false) => {}
            Err(e) => panic!("{e}\n{mutant}"),
        }
    }
    eprintln!("{accepted} of {tried} broadcast mutants accepted and in bounds");
    assert!(accepted > 0);
}

/// A `createpolicy` nothing or only a cache hint reads is dropped with the
/// hint, and a branch to one then lands on the instruction after it (every
/// target moved past the dropped ones); one whose result
/// is also read elsewhere stays (the attacks above: then the kernel is
/// `unsupported_instruction`).
#[test]
fn a_policy_only_a_cache_hint_reads_is_dropped_and_branches_follow() {
    let text = "\
.version 8.4
.target sm_90a
.address_size 64

.visible .entry k(
\t.param .u64 k_p0
)
{
\t.reg .pred \t%p<2>;
\t.reg .b32 \t%r<4>;
\t.reg .b64 \t%rd<4>;
\tld.param.b64 \t%rd1, [k_p0];
\tcreatepolicy.fractional.L2::evict_first.b64 %rd3, 1.0;
\tmov.u32 \t%r1, %tid.x;
\tsetp.eq.s32 \t%p1, %r1, 0;
\t@%p1 bra \t$L_pol;
\tmov.u32 \t%r2, 1;
$L_pol:
\tcreatepolicy.fractional.L2::evict_last.b64 %rd2, 1.0;
\tld.global.L2::cache_hint.b32 \t%r3, [%rd1], %rd2;
\tret;
}
";
    let k = ptx::lower(text, "k").unwrap();
    let bases: Vec<&str> = k.insts.iter().map(|i| i.base.as_str()).collect();
    assert_eq!(bases, ["ld", "mov", "setp", "bra", "mov", "ld", "ret"]);
    let target = k.insts[3]
        .ops
        .iter()
        .find_map(|o| match o {
            ptx::ir::Opnd::Label(pc) => Some(*pc as usize),
            _ => None,
        })
        .unwrap();
    assert_eq!(target, 5);
    assert!(k.insts[5].ops.len() == 2 && !k.insts[5].opcode.contains("cache_hint"));
    // Read also as an address: kept.
    let read = edit(text, "\tret;", "\tst.global.b32 \t[%rd2], %r3;\n\tret;");
    let k = ptx::lower(&read, "k").unwrap();
    assert!(k.insts.iter().any(|i| i.base == "createpolicy"));
}
