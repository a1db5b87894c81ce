//! The Strided family (the seed's Strided schedule): every NVRTC corpus
//! kernel accepted, its contract's footprints exact for contiguous and
//! broadcast shapes, and run on the host engine against a Rust reference
//! at several shapes (fresh random inputs, a poisoned output, every
//! element compared, buffers exactly the contract's footprint with the
//! engine's bounds checks on); and attacks, each refused with its exact
//! reason at load or at launch.

#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::contract::{LaunchContract, ParamKind, PointerAccess, ScalarType};
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::Rng;

fn nvrtc(file: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit/nvrtc");
    std::fs::read_to_string(root.join(file)).unwrap()
}

/// The contract, or the refusal's sub_reason.
fn verdict(text: &str, entry: &str) -> Result<LaunchContract, &'static str> {
    match ptx::canonicalize_with(text, entry, None, Families::ALL) {
        Ok(c) => Ok(c.contract),
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => Err(sub_reason),
        Err(e) => panic!("{entry}: not a verdict: {e}"),
    }
}

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

    /// The launch's args for a shape.
    fn args(self, s: &Shape) -> Vec<i64> {
        match self {
            Op::Add | Op::BiasAdd => vec![s.s0, s.s1, s.d0, s.d1],
            Op::Transpose => vec![s.s0, s.d0, s.d1],
        }
    }

    /// Each input's element index at `i`.
    fn indices(self, s: &Shape, i: i64) -> Vec<i64> {
        let (r, c) = (i / s.d1, i % s.d1);
        match self {
            Op::Add => vec![r * s.s0 + c, c * s.s1],
            Op::BiasAdd => vec![i, c * s.s1],
            Op::Transpose => vec![c * s.s0 + r],
        }
    }

    fn reference(self, s: &Shape, ins: &[Vec<f32>], i: i64) -> f32 {
        let ix = self.indices(s, i);
        match self {
            Op::Add | Op::BiasAdd => ins[0][ix[0] as usize] + ins[1][ix[1] as usize],
            Op::Transpose => ins[0][ix[0] as usize],
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

/// Shapes for `op`: contiguous, broadcast (stride 0), transposed or padded
/// rows, `d1 = 1`, `n` not a multiple of `d1`, `n = 0`, and random ones.
fn shapes(op: Op, rng: &mut impl Rng) -> Vec<Shape> {
    let (d0, d1) = (rng.random_range(2..40), rng.random_range(2..40));
    let n = d0 * d1;
    let mut v = vec![
        // contiguous
        Shape {
            n,
            d0,
            d1,
            s0: if op == Op::Transpose { d0 } else { d1 },
            s1: 1,
        },
        // broadcast: every row the same row, every column the same element
        Shape {
            n,
            d0,
            d1,
            s0: 0,
            s1: 0,
        },
        // padded rows
        Shape {
            n,
            d0,
            d1,
            s0: d1 + 5,
            s1: 3,
        },
        // one column
        Shape {
            n: d0,
            d0,
            d1: 1,
            s0: 1,
            s1: 1,
        },
        // a tail: n not a multiple of d1
        Shape {
            n: n - 1,
            d0,
            d1,
            s0: d1,
            s1: 1,
        },
        Shape {
            n: 0,
            d0,
            d1,
            s0: d1,
            s1: 1,
        },
    ];
    for _ in 0..4 {
        let (d0, d1) = (rng.random_range(1..300), rng.random_range(1..300));
        v.push(Shape {
            n: rng.random_range(0..=d0 * d1),
            d0,
            d1,
            s0: rng.random_range(0..400),
            s1: rng.random_range(0..4),
        });
    }
    v
}

/// The largest element index each input reads, plus one (0 when `n = 0`).
fn reference_footprints(op: Op, s: &Shape) -> Vec<u64> {
    let mut max = vec![0u64; op.inputs()];
    for i in 0..s.n {
        for (m, ix) in max.iter_mut().zip(op.indices(s, i)) {
            *m = (*m).max(ix as u64 + 1);
        }
    }
    max
}

/// The contract's footprints (bytes) at a launch of `n` with `args`.
fn footprints(k: &HostKernel, n: i64, args: &[i64]) -> Vec<Option<u128>> {
    let c = k.contract();
    let v = c.values(n as u64, k.block_size());
    let bits: Vec<u64> = args.iter().map(|a| *a as u64).collect();
    c.footprints
        .iter()
        .map(|f| f.bytes.eval_with(&v, &bits))
        .collect()
}

/// Runs `k` with inputs of `lens` elements (fresh random values), a
/// poisoned output of `n`, and `args`: the output, or the engine's fault.
fn run(
    k: &HostKernel,
    lens: &[usize],
    n: i64,
    args: &[i64],
    rng: &mut impl Rng,
) -> (Vec<Vec<f32>>, Result<Vec<f32>, String>) {
    let mut ins: Vec<Vec<f32>> = lens
        .iter()
        .map(|&l| (0..l).map(|_| rng.random_range(-4.0f32..4.0)).collect())
        .collect();
    let mut out = vec![f32::from_bits(0x7fc0_dead); n.max(0) as usize];
    let spans: Vec<HostSpan> = ins
        .iter_mut()
        .map(|b| HostSpan {
            ptr: b.as_mut_ptr().cast(),
            len: b.len() * 4,
        })
        .collect();
    let bits: Vec<u64> = args.iter().map(|a| *a as u64).collect();
    let launch = HostLaunch {
        inputs: &spans,
        args: &bits,
        output: HostSpan {
            ptr: out.as_mut_ptr().cast(),
            len: out.len() * 4,
        },
        n: n as u64,
        params: &[],
        threads: 2,
        checked: true,
        control: None,
    };
    // SAFETY: every span points into a live Vec of exactly `len` bytes.
    let result = unsafe { k.launch(&launch) };
    (ins, result.map(|()| out).map_err(|e| e.to_string()))
}

const BUILDS: [&str; 3] = ["O3", "G", "fast"];
const OPS: [Op; 3] = [Op::Add, Op::BiasAdd, Op::Transpose];

/// All nine corpus kernels are accepted with the contract the seed's
/// schedule needs: pointers, the output, a `long long n`, the args.
#[test]
fn every_corpus_kernel_is_accepted_with_its_contract() {
    for op in OPS {
        for build in BUILDS {
            let file = format!("{}_{build}.ptx", op.entry());
            let c = verdict(&nvrtc(&file), op.entry()).unwrap_or_else(|r| panic!("{file}: {r}"));
            let kinds: Vec<ParamKind> = c.params.iter().map(|p| p.kind.clone()).collect();
            let mut want: Vec<ParamKind> = (0..op.inputs())
                .map(|k| ParamKind::Pointer {
                    access: PointerAccess::Read,
                    operand: Some(k as u32),
                })
                .collect();
            want.push(ParamKind::Pointer {
                access: PointerAccess::Written,
                operand: Some(op.inputs() as u32),
            });
            want.push(ParamKind::Count(ScalarType::S64));
            want.extend(
                (0..op.args(&shapes(op, &mut rand::rng())[0]).len())
                    .map(|_| ParamKind::Scalar(ScalarType::U64)),
            );
            assert_eq!(kinds, want, "{file}");
            let names: Vec<&str> = c.preconditions.iter().map(|p| p.name).collect();
            assert!(names.contains(&"count_fits_i64"), "{file}: {names:?}");
            assert!(names.contains(&"divisor_positive"), "{file}: {names:?}");
            assert!(
                names.contains(&"strided_index_fits_i64"),
                "{file}: {names:?}"
            );
            // The text names the args by their params' names, and the
            // output's footprint reads as the scalar ABI's.
            let text = c.to_string();
            assert!(text.contains("requires divisor_positive"), "{file}: {text}");
            assert!(
                (0..8).all(|k| !text.contains(&format!("arg{k}"))),
                "{file}: {text}"
            );
            let out = c.params[op.inputs()].name.clone();
            assert!(
                text.contains(&format!("{out}[n × 4] align 4")),
                "{file}: {text}"
            );
        }
    }
}

/// Every corpus kernel on the host engine, at every shape, against the
/// reference, with each input exactly its contract footprint; the
/// footprint is exact (the reference's largest index + 1) for contiguous
/// and broadcast shapes and never below it.
#[test]
fn every_corpus_kernel_runs_on_the_host_engine_against_a_reference() {
    let mut rng = rand::rng();
    for op in OPS {
        for build in BUILDS {
            let file = format!("{}_{build}.ptx", op.entry());
            let k = HostKernel::compile_with(&nvrtc(&file), op.entry(), Families::ALL)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            for (which, s) in shapes(op, &mut rng).iter().enumerate() {
                let args = op.args(s);
                let fps = footprints(&k, s.n, &args);
                let want = reference_footprints(op, s);
                let lens: Vec<usize> = fps[..op.inputs()]
                    .iter()
                    .map(|b| (b.unwrap() / 4) as usize)
                    .collect();
                for (input, (have, want)) in lens.iter().zip(&want).enumerate() {
                    assert!(
                        *have as u64 >= *want,
                        "{file} {s:?} in{input}: {have} < {want}"
                    );
                    if which < 2 {
                        assert_eq!(*have as u64, *want, "{file} {s:?} in{input}: not exact");
                    }
                }
                assert_eq!(fps[op.inputs()], Some(s.n as u128 * 4), "{file} {s:?}");
                let (ins, out) = run(&k, &lens, s.n, &args, &mut rng);
                let out = out.unwrap_or_else(|e| panic!("{file} {s:?}: {e}"));
                for i in 0..s.n {
                    let want = op.reference(s, &ins, i);
                    assert_eq!(
                        out[i as usize].to_bits(),
                        want.to_bits(),
                        "{file} {s:?} at {i}"
                    );
                }
            }
        }
    }
}

fn add_o3() -> String {
    nvrtc("add_f32_strided_O3.ptx")
}

fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from}");
    text.replacen(from, to, 1)
}

/// An index one past the schedule's (`in0[r*s0 + c + 1]`) is accepted
/// with a footprint one element larger: a buffer of the original
/// footprint is refused, one more element runs (and matches a reference
/// shifted by one).
#[test]
fn a_footprint_one_element_larger_is_held_at_launch() {
    let text = replaced(
        &add_o3(),
        "add.s64 \t%rd21, %rd20, %rd33;",
        "add.s64 \t%rd21, %rd20, %rd33;\n\tadd.s64 \t%rd21, %rd21, 1;",
    );
    let plus = HostKernel::compile_with(&text, "add_f32_strided", Families::ALL).unwrap();
    let base = HostKernel::compile_with(&add_o3(), "add_f32_strided", Families::ALL).unwrap();
    let mut rng = rand::rng();
    for s in shapes(Op::Add, &mut rng).into_iter().filter(|s| s.n > 0) {
        let args = Op::Add.args(&s);
        let (a, b) = (footprints(&base, s.n, &args), footprints(&plus, s.n, &args));
        assert_eq!(b[0], a[0].map(|x| x + 4), "{s:?}");
        assert_eq!(b[1], a[1]);
        let exact = [(a[0].unwrap() / 4) as usize, (a[1].unwrap() / 4) as usize];
        let (_, refused) = run(&plus, &exact, s.n, &args, &mut rng);
        let fault = refused.unwrap_err();
        assert!(fault.contains("fewer than its footprint"), "{fault}");
        let (ins, out) = run(&plus, &[exact[0] + 1, exact[1]], s.n, &args, &mut rng);
        let out = out.unwrap();
        for i in 0..s.n {
            let (r, c) = (i / s.d1, i % s.d1);
            let want = ins[0][(r * s.s0 + c + 1) as usize] + ins[1][(c * s.s1) as usize];
            assert_eq!(out[i as usize].to_bits(), want.to_bits(), "{s:?} {i}");
        }
    }
}

/// A precondition that fails at launch is refused by name, with the
/// values it read: a divisor of 0, a negative stride, a stride whose
/// product would wrap the kernel's 64-bit arithmetic.
#[test]
fn a_false_precondition_is_refused_at_launch_by_name() {
    let k = HostKernel::compile_with(&add_o3(), "add_f32_strided", Families::ALL).unwrap();
    let mut rng = rand::rng();
    let cases: [(&[i64], i64, &str, &str); 4] = [
        (&[4, 1, 4, 0], 16, "divisor_positive", "param_7=0"),
        (&[-1, 1, 4, 4], 16, "arg_nonnegative", "param_4=-1"),
        (&[4, -3, 4, 4], 16, "arg_nonnegative", "param_5=-3"),
        (
            &[1 << 61, 1, 4, 4],
            12,
            "strided_index_fits_i64",
            "param_4=2305843009213693952",
        ),
    ];
    for (args, n, name, value) in cases {
        let (_, refused) = run(&k, &[64, 64], n, args, &mut rng);
        let fault = refused.unwrap_err();
        assert!(
            fault.contains(name) && fault.contains(value),
            "{args:?}: {fault}"
        );
    }
    // The same shapes with the precondition kept run.
    let (_, ok) = run(&k, &[64, 64], 16, &[4, 1, 4, 4], &mut rng);
    ok.unwrap();
}

/// Attacks on the proof, each refused at load with its exact sub_reason.
#[test]
fn attacks_are_refused_at_load_with_their_reason() {
    let g = nvrtc("add_f32_strided_G.ptx");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "an arg (s0) used as a pointer",
            replaced(
                &add_o3(),
                "cvta.to.global.u64 \t%rd22, %rd8;",
                "cvta.to.global.u64 \t%rd22, %rd11;",
            ),
            "param_misuse",
        ),
        (
            "a pointer (in1) used as a multiplier",
            replaced(
                &add_o3(),
                "mul.lo.s64 \t%rd25, %rd33, %rd12;",
                "mul.lo.s64 \t%rd25, %rd33, %rd9;",
            ),
            "pointer_misuse",
        ),
        (
            "a stride arg (s0) flowing into the guard",
            replaced(
                &add_o3(),
                "@%p1 bra \t$L__BB0_5;",
                "@%p1 bra \t$L__BB0_5;\n\tsetp.ge.s64 \t%p2, %rd1, %rd11;\n\t@%p2 bra \t$L__BB0_5;",
            ),
            "param_misuse",
        ),
        (
            "i % d with d no arg (a literal)",
            replaced(
                &g,
                "rem.s64 \t%rd16, %rd1, %rd9;",
                "rem.s64 \t%rd16, %rd1, 7;",
            ),
            "non_elementwise_address",
        ),
        (
            "i % n (the count as a divisor)",
            replaced(
                &g,
                "rem.s64 \t%rd16, %rd1, %rd9;",
                "rem.s64 \t%rd16, %rd1, %rd5;",
            ),
            "param_misuse",
        ),
        (
            "a pointer stored as data",
            replaced(
                &g,
                "st.f32 \t[%rd25], %f3;",
                "st.f32 \t[%rd25], %f3;\n\tst.u64 \t[%rd25], %rd3;",
            ),
            "pointer_escape",
        ),
        (
            "the index less one (negative at i = 0)",
            replaced(
                &g,
                "add.s64 \t%rd18, %rd17, %rd16;",
                "add.s64 \t%rd18, %rd17, %rd16;\n\tsub.s64 \t%rd18, %rd18, 1;",
            ),
            "non_elementwise_address",
        ),
        (
            "an access before the guard",
            replaced(
                &g,
                "setp.lt.s64 \t%p1, %rd1, %rd5;",
                "ld.f32 \t%f1, [%rd2];\n\tsetp.lt.s64 \t%p1, %rd1, %rd5;",
            ),
            "unguarded_access",
        ),
        (
            "a store through an input",
            replaced(
                &g,
                "add.s64 \t%rd25, %rd4, %rd24;",
                "add.s64 \t%rd25, %rd3, %rd24;",
            ),
            "pointer_misuse",
        ),
    ];
    for (what, text, want) in cases {
        assert_eq!(
            verdict(&text, "add_f32_strided").err(),
            Some(want),
            "{what}"
        );
    }
}

/// Without the family the corpus is refused as before (`extra_params`),
/// and a scalar-ABI kernel keeps its scalar contract with it.
#[test]
fn the_family_is_switched_by_families() {
    let without = Families {
        strided: false,
        ..Families::ALL
    };
    let text = add_o3();
    match ptx::canonicalize_with(&text, "add_f32_strided", None, without) {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => assert_eq!(sub_reason, "extra_params"),
        other => panic!("{other:?}"),
    }
    assert!(ptx::canonicalize_with(&text, "add_f32_strided", None, Families::ALL).is_ok());
}
