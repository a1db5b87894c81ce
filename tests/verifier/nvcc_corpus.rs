//! The nvcc compatibility corpus of issue 8 (`tests/corpus/nvcc/`, see its
//! README and manifest.json): 7 sources × sm_80/sm_90/sm_100 ×
//! plain/-lineinfo/-use_fast_math.
//!
//! - `nvcc_corpus_verdicts`: every manifest kernel in every variant
//!   canonicalizes to exactly the signature the manifest implies, and every
//!   `refused` one is refused with its exact `NON_SCALAR_ABI` sub_reason.
//! - `nvcc_corpus_runs_on_the_host_engine`: every accepted kernel's canonical
//!   text runs on the host engine (checked mode) on random inputs from the
//!   manifest domains, into a poisoned output, and matches the Rust reference
//!   (`tests/support/nvcc_ref.rs`) element by element within the manifest
//!   tolerance; nothing past `n` is written.
//!
//! Both collect every failure and print one table before failing, so one run
//! shows the whole picture.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::support::nvcc_ref;

use nvcc_ref::{
    compare, describe, expected_signature, line_text, make_case, poisoned, print_table, Files,
    Kernel, Row, Tol, Ty, Val, ARCHS, TAIL, VARIANTS,
};
use ptxd::ptx::{self, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::{Rng, SeedableRng};

fn all_kernels() -> Vec<Kernel> {
    let (kernels, refused) = nvcc_ref::manifest();
    assert!(kernels.len() >= 60, "only {} kernels", kernels.len());
    kernels.into_iter().chain(refused).collect()
}

#[test]
fn nvcc_corpus_verdicts() {
    let kernels = all_kernels();
    let mut files = Files::default();
    let mut rows = Vec::new();
    let mut checked = 0;
    for k in &kernels {
        for arch in ARCHS {
            for variant in VARIANTS {
                let path = k.ptx_path(arch, variant);
                let row = |expected: String, got: String, line, text: String| Row {
                    kernel: k.name.clone(),
                    variant: format!("{arch}.{variant}"),
                    expected,
                    got,
                    line,
                    text,
                };
                let expected = k.expected_refusal(variant).map(str::to_string);
                let expected_text = expected.clone().unwrap_or_else(|| "accept".into());
                let Some(text) = files.get(path.clone()) else {
                    rows.push(row(
                        expected_text,
                        "missing file".into(),
                        None,
                        path.display().to_string(),
                    ));
                    continue;
                };
                if !text.contains(&format!(".entry {}(", k.name)) {
                    rows.push(row(
                        expected_text,
                        "no such entry".into(),
                        None,
                        path.display().to_string(),
                    ));
                    continue;
                }
                checked += 1;
                match (ptx::canonicalize(text, &k.name, None), expected) {
                    (Ok(c), None) => {
                        let want = expected_signature(k);
                        if c.signature != want {
                            rows.push(row(
                                format!("{want:?}"),
                                format!("{:?}", c.signature),
                                None,
                                String::new(),
                            ));
                        }
                    }
                    (Ok(c), Some(_)) => rows.push(row(
                        expected_text,
                        format!("accepted {:?}", c.signature),
                        None,
                        String::new(),
                    )),
                    (Err(e), expected) => {
                        let (got, line) = describe(&e);
                        if expected.as_deref() != Some(got.as_str())
                            || !matches!(e, PtxError::NonScalarAbi { .. })
                        {
                            rows.push(row(expected_text, got, line, line_text(text, line)));
                        }
                    }
                }
            }
        }
    }
    let expected_count = kernels.len() * ARCHS.len() * VARIANTS.len();
    assert!(
        rows.is_empty() && checked == expected_count,
        "{}\n{checked} of {expected_count} kernel variants checked",
        print_table("nvcc corpus verdicts", rows)
    );
}

/// The variants whose host results are checked: all nine.
fn host_variants() -> Vec<(&'static str, &'static str)> {
    ARCHS
        .iter()
        .flat_map(|a| VARIANTS.iter().map(move |v| (*a, *v)))
        .collect()
}

#[test]
fn nvcc_corpus_runs_on_the_host_engine() {
    let seed: u64 = std::env::var("PTXD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("seed {seed} (PTXD_TEST_SEED reruns it)");
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut files = Files::default();
    let mut rows = Vec::new();
    let mut ran = 0;
    for k in all_kernels().iter().filter(|k| k.reference.is_some()) {
        for (arch, variant) in host_variants() {
            if k.expected_refusal(variant).is_some() {
                continue;
            }
            let mut row = |got: String, line: Option<u32>, text: String| {
                rows.push(Row {
                    kernel: k.name.clone(),
                    variant: format!("{arch}.{variant}"),
                    expected: format!("{:?}", k.tol(variant)),
                    got,
                    line,
                    text,
                })
            };
            let Some(text) = files.get(k.ptx_path(arch, variant)) else {
                row("missing file".into(), None, String::new());
                continue;
            };
            let canonical = match ptx::canonicalize(text, &k.name, None) {
                Ok(c) => c,
                Err(e) => {
                    let (got, line) = describe(&e);
                    row(format!("refused: {got}"), line, line_text(text, line));
                    continue;
                }
            };
            let hk = match HostKernel::compile(&canonical.text, &k.name) {
                Ok(hk) => hk,
                Err(e) => {
                    // The line is one of the canonical text.
                    let (got, line) = describe(&e);
                    row(
                        format!("compile: {got}"),
                        line,
                        line_text(&canonical.text, line),
                    );
                    continue;
                }
            };
            let block = k.launch_bounds().map_or(256, |m| m.min(256));
            if hk.block_size() != block {
                row(
                    format!("block size {} (want {block})", hk.block_size()),
                    None,
                    String::new(),
                );
            }
            // Random, and never a multiple of the block.
            let mut n = r.random_range(700..3000usize);
            if n % block as usize == 0 {
                n += 1;
            }
            let case = match make_case(k, n, &mut r) {
                Ok(c) => c,
                Err(e) => {
                    row(format!("reference: {e}"), None, String::new());
                    continue;
                }
            };
            let mut inputs = case.inputs.clone();
            let mut out = poisoned(k.output, n + TAIL);
            let spans: Vec<HostSpan> = inputs
                .iter_mut()
                .map(|b| HostSpan {
                    ptr: b.as_mut_ptr(),
                    len: b.len(),
                })
                .collect();
            let params = &k.reference.as_ref().unwrap().param_values;
            let launch = HostLaunch {
                inputs: &spans,
                args: &[],
                output: HostSpan {
                    ptr: out.as_mut_ptr(),
                    len: out.len(),
                },
                n: n as u64,
                params,
                threads: r.random_range(1..=4),
                checked: true,
                control: None,
            };
            // SAFETY: every span is a live Vec of exactly `len` bytes, and
            // the Vecs outlive the call.
            if let Err(e) = unsafe { hk.launch(&launch) } {
                row(
                    format!("fault: {}", e.message),
                    Some(e.line),
                    line_text(&canonical.text, Some(e.line)),
                );
                continue;
            }
            ran += 1;
            if let Some(what) = compare(k, variant, &case, &out) {
                row(what, None, String::new());
            }
        }
    }
    assert!(
        rows.is_empty(),
        "{}\n{ran} kernel variants ran (seed {seed})",
        print_table("nvcc corpus on the host engine", rows)
    );
    eprintln!("{ran} kernel variants ran and matched");
}

/// The reference itself, on values whose answer is known.
#[test]
fn nvcc_reference_follows_the_c_rules() {
    use nvcc_ref::{convert, eval, wrap};
    // Floats to integers truncate toward zero; integers keep the low bits.
    assert_eq!(convert(Val::F(-2.75), Ty::I32), Val::I(-2));
    assert_eq!(convert(Val::F(255.75), Ty::U8), Val::I(255));
    assert_eq!(convert(Val::I(300), Ty::I8), Val::I(44));
    assert_eq!(convert(Val::I(-1), Ty::U16), Val::I(65535));
    assert_eq!(wrap(0x1_8000_0000, Ty::I32), -0x8000_0000);
    // Integers to floats round to nearest even, once.
    assert_eq!(
        convert(Val::I((1 << 24) + 1), Ty::F32),
        Val::F(16_777_216.0)
    );
    assert_eq!(
        convert(Val::I((1 << 24) + 3), Ty::F32),
        Val::F(16_777_220.0)
    );
    assert_eq!(
        convert(Val::I(i128::from(u64::MAX)), Ty::F32),
        Val::F(18_446_744_073_709_551_616.0)
    );
    // Floats to narrower floats round to nearest even.
    assert_eq!(convert(Val::F(1.0 + 2f64.powi(-11)), Ty::F16), Val::F(1.0));
    assert_eq!(
        convert(Val::F(1.0 + 3.0 * 2f64.powi(-11)), Ty::F16),
        Val::F(1.0 + 2f64.powi(-9))
    );
    assert_eq!(convert(Val::F(1.0 + 2f64.powi(-8)), Ty::Bf16), Val::F(1.0));
    assert_eq!(convert(Val::F(1e6), Ty::F16), Val::F(f64::INFINITY));
    assert_eq!(convert(Val::F(65520.0), Ty::F16), Val::F(f64::INFINITY));
    assert_eq!(convert(Val::F(65519.0), Ty::F16), Val::F(65504.0));
    assert_eq!(
        convert(Val::F(2f64.powi(-25)), Ty::F16),
        Val::F(0.0),
        "tie to even"
    );
    assert_eq!(
        convert(Val::F(3.0 * 2f64.powi(-25)), Ty::F16),
        Val::F(2f64.powi(-23))
    );
    // Every f32 rounds to the half types as `half`'s (correct) f32
    // conversions do; its f64 conversion to bf16 is off.
    assert_eq!(
        nvcc_ref::encode(
            convert(Val::F(f64::from(f32::from_bits(0xc034_8006))), Ty::Bf16),
            Ty::Bf16
        ),
        0xc035
    );
    for i in 0..200_000u32 {
        let f = f32::from_bits(i.wrapping_mul(21_477));
        if f.is_nan() {
            continue;
        }
        let x = Val::F(f64::from(f));
        assert_eq!(
            nvcc_ref::encode(convert(x, Ty::F16), Ty::F16),
            u64::from(half::f16::from_f32(f).to_bits()),
            "{f:e} to f16"
        );
        assert_eq!(
            nvcc_ref::encode(convert(x, Ty::Bf16), Ty::Bf16),
            u64::from(half::bf16::from_f32(f).to_bits()),
            "{f:e} to bf16"
        );
    }
    assert_eq!(nvcc_ref::encode(Val::F(1.0), Ty::F16), 0x3c00);
    assert_eq!(nvcc_ref::encode(Val::F(1.0), Ty::Bf16), 0x3f80);
    // Integer ops wrap in the compute type.
    let e = |op, c, out, xs: &[Val]| eval(op, Some(c), out, xs, &[]).unwrap();
    assert_eq!(
        e("add", Ty::I32, Ty::I8, &[Val::I(127), Val::I(1)]),
        Val::I(-128)
    );
    assert_eq!(
        e("abs", Ty::I32, Ty::I32, &[Val::I(-(1 << 31))]),
        Val::I(-(1 << 31))
    );
    assert_eq!(e("clz", Ty::U32, Ty::I32, &[Val::I(0)]), Val::I(32));
    assert_eq!(e("clz", Ty::U32, Ty::I32, &[Val::I(1)]), Val::I(31));
    assert_eq!(
        e("brev", Ty::U32, Ty::U32, &[Val::I(1)]),
        Val::I(0x8000_0000)
    );
    assert_eq!(e("popc", Ty::U64, Ty::I32, &[Val::I(-1)]), Val::I(64));
    assert_eq!(
        e(
            "mulhi",
            Ty::U32,
            Ty::U32,
            &[Val::I(0xffff_ffff), Val::I(0xffff_ffff)]
        ),
        Val::I(0xffff_fffe)
    );
    assert_eq!(
        e("shr_mask", Ty::I32, Ty::I32, &[Val::I(-8), Val::I(33)]),
        Val::I(-4)
    );
    assert_eq!(
        e("shl_mask", Ty::U32, Ty::U32, &[Val::I(3), Val::I(31)]),
        Val::I(0x8000_0000)
    );
    assert_eq!(
        e("div", Ty::I32, Ty::I32, &[Val::I(-7), Val::I(2)]),
        Val::I(-3)
    );
    assert_eq!(
        e("rem", Ty::I32, Ty::I32, &[Val::I(-7), Val::I(2)]),
        Val::I(-1)
    );
    assert_eq!(
        e(
            "mul",
            Ty::U64,
            Ty::U64,
            &[Val::I(i128::from(u64::MAX)), Val::I(i128::from(u64::MAX))]
        ),
        Val::I(1)
    );
    // Float ops round in the compute type: 1 + 2^-30 is 1 in f32.
    assert_eq!(
        e(
            "add",
            Ty::F32,
            Ty::F64,
            &[Val::F(1.0), Val::F(2f64.powi(-30))]
        ),
        Val::F(1.0)
    );
    assert_eq!(
        e(
            "add",
            Ty::F64,
            Ty::F64,
            &[Val::F(1.0), Val::F(2f64.powi(-30))]
        ),
        Val::F(1.0 + 2f64.powi(-30))
    );
    // fma rounds once: (1 + 2^-12)^2 - 1 keeps the 2^-24 term in f32.
    let a = 1.0 + 2f64.powi(-12);
    assert_eq!(
        e(
            "fma",
            Ty::F32,
            Ty::F32,
            &[Val::F(a), Val::F(a), Val::F(-1.0)]
        ),
        Val::F(2f64.powi(-11) + 2f64.powi(-24))
    );
    // Selects pass the chosen input straight to the output type.
    assert_eq!(
        eval(
            "select_nz",
            None,
            Ty::F32,
            &[Val::I(0), Val::F(1.5), Val::I(-3)],
            &[]
        )
        .unwrap(),
        Val::F(-3.0)
    );
    // Tolerances.
    use nvcc_ref::matches;
    assert!(matches(Tol::Ulps(1), 0x3c01, Val::F(1.0), Ty::F16));
    assert!(!matches(Tol::Ulps(1), 0x3c02, Val::F(1.0), Ty::F16));
    assert!(
        matches(Tol::Ulps(2), 0x8001, Val::F(2f64.powi(-24)), Ty::F16),
        "across zero"
    );
    assert!(
        !matches(Tol::Exact, 0x8000, Val::F(0.0), Ty::F16),
        "-0 is not +0"
    );
    assert!(matches(Tol::Exact, 0x7fc0_0001, Val::F(f64::NAN), Ty::F32));
    assert!(
        !matches(Tol::Rel(1e-3), 0x7fc0_dead, Val::F(1.0), Ty::F32),
        "poison never matches"
    );
    // The launch bounds come from the .cu: `__launch_bounds__(128, 4)`.
    let ks = all_kernels();
    let lb = |name: &str| ks.iter().find(|k| k.name == name).unwrap().launch_bounds();
    assert_eq!(lb("max_f32_lb128_4"), Some(128));
    assert_eq!(lb("scale_f32_lb256"), Some(256));
    assert_eq!(lb("add_f32"), None);
}

/// The comparison fails on an output left poisoned, on one element off by
/// one ulp, and on a write past n.
#[test]
fn nvcc_host_comparison_catches_wrong_outputs() {
    let (kernels, _) = nvcc_ref::manifest();
    let k = kernels.iter().find(|k| k.name == "add_f32").unwrap();
    let text = std::fs::read_to_string(k.ptx_path("sm_90", "plain")).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
    let n = 1001;
    let case = make_case(k, n, &mut r).unwrap();
    let untouched = poisoned(k.output, n + TAIL);
    assert!(compare(k, "plain", &case, &untouched).is_some());
    // The reference's own output passes, and fails once perturbed.
    let mut good = nvcc_ref::to_bytes(&case.want, k.output);
    good.extend_from_slice(&untouched[n * 4..]);
    assert_eq!(compare(k, "plain", &case, &good), None);
    let mut off = good.clone();
    off[500 * 4] ^= 1;
    assert!(compare(k, "plain", &case, &off)
        .unwrap()
        .starts_with("1/1001"));
    let mut past = good.clone();
    past[n * 4 + 2] ^= 1;
    assert_eq!(
        compare(k, "plain", &case, &past).as_deref(),
        Some("wrote past n")
    );
    // And the kernel itself, when accepted, produces `good` on the host.
    if let Ok(hk) = HostKernel::compile(&text, &k.name) {
        let mut inputs = case.inputs.clone();
        let mut out = untouched.clone();
        let spans: Vec<HostSpan> = inputs
            .iter_mut()
            .map(|b| HostSpan {
                ptr: b.as_mut_ptr(),
                len: b.len(),
            })
            .collect();
        let launch = HostLaunch {
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
        // SAFETY: every span is a live Vec of exactly `len` bytes.
        unsafe { hk.launch(&launch) }.unwrap();
        assert_eq!(out, good);
    }
}
