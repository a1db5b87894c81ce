//! The JIT corpus on the host engine: every Triton elementwise kernel and
//! every Inductor pointwise kernel of `tests/corpus/jit` (real Triton 3.6 /
//! torch 2.11 output), run on fresh random inputs with poisoned outputs,
//! every element compared with a Rust reference of what the kernel computes
//! (`tests/corpus/jit/gen/*.py`).
//!
//! The verifier does not prove these families yet, so each kernel is
//! decoded with a hand-written [`LaunchContract`] through
//! [`HostKernel::unverified_for_tests`] (test-only): its params as the PTX
//! declares them (the pointers before the count: the inputs, then the
//! output; those after it: Triton's scratch pointers, passed null; `.f32`
//! and `.u64` by-value scalars; the `.u32` count), its geometry read off the
//! kernel (`.reqntid` threads, and the block's elements from the
//! `ctaid << k` that builds the index), and each operand's footprint.
//!
//! Numerics: add, mul, relu, scale+shift, mul+add and residual add are
//! compared bit for bit. Kernels built on `ex2.approx`, `rcp.approx` and
//! `div.full` (gelu, gelu-tanh, silu, sigmoid, tanh, exp) are compared with
//! an f64 reference within [`approx_tolerance`]: the host computes each
//! approximate op within 1 ulp, the GPU within its ISA bound (2 ulp), and
//! the kernels' own formulas (a polynomial erf, `1 - 2/(e^2x + 1)` for tanh)
//! lose a few more ulp near their cancellations.
#![allow(clippy::unwrap_used, clippy::panic)]

use half::{bf16, f16};
use rand::{Rng, SeedableRng};

use crate::ptx::contract::{
    BlockRule, ContractParam, Expr, Footprint, Geometry, LaunchContract, ParamKind, PointerAccess,
    ScalarType,
};
use crate::ptx::{HostKernel, HostLaunch, HostSpan};

/// The poison every output byte starts as: a NaN in f32, f16 and bf16.
const POISON: u8 = 0xFF;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dt {
    F32,
    F16,
    Bf16,
}

impl Dt {
    fn parse(s: &str) -> Dt {
        match s {
            "f32" => Dt::F32,
            "f16" => Dt::F16,
            "bf16" => Dt::Bf16,
            _ => panic!("dtype {s}"),
        }
    }

    fn size(self) -> usize {
        match self {
            Dt::F32 => 4,
            _ => 2,
        }
    }

    /// The value of raw element bits, exactly.
    fn value(self, bits: u32) -> f64 {
        match self {
            Dt::F32 => f64::from(f32::from_bits(bits)),
            Dt::F16 => f16::from_bits(bits as u16).to_f64(),
            Dt::Bf16 => bf16::from_bits(bits as u16).to_f64(),
        }
    }

    /// `x` (an f32 result) rounded to nearest even into this type's bits.
    fn round(self, x: f32) -> u32 {
        match self {
            Dt::F32 => x.to_bits(),
            Dt::F16 => u32::from(f16::from_f32(x).to_bits()),
            Dt::Bf16 => u32::from(bf16::from_f32(x).to_bits()),
        }
    }

    /// The spacing of this type's values near `x` (0 for f32, whose
    /// rounding the f32 tolerance covers).
    fn ulp(self, x: f64) -> f64 {
        match self {
            Dt::F32 => 0.0,
            Dt::F16 => x.abs() * f64::powi(2.0, -10) + f64::powi(2.0, -24),
            Dt::Bf16 => x.abs() * f64::powi(2.0, -7) + f64::powi(2.0, -126),
        }
    }
}

/// One corpus kernel and how to launch it.
#[derive(Debug)]
struct Case {
    file: String,
    entry: String,
    op: String,
    dt: Dt,
    /// Triton's `n % 16 == 0` specialisation: its vector accesses are
    /// predicated on their first lane, so `n` must be a multiple of 16.
    div16: bool,
    /// Inductor static shapes: the count is a literal in the body.
    static_n: Option<u64>,
    text: String,
}

fn corpus_dir() -> String {
    format!("{}/tests/corpus/jit", env!("CARGO_MANIFEST_DIR"))
}

fn cases(family: &str) -> Vec<Case> {
    let dir = corpus_dir();
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/{family}/manifest.json")).unwrap(),
    )
    .unwrap();
    let kernels = manifest["kernels"].as_array().unwrap();
    assert!(!kernels.is_empty());
    kernels
        .iter()
        .map(|k| {
            let file = k["file"].as_str().unwrap().to_string();
            let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
            let shape: u64 = k["shape"]
                .get(0)
                .and_then(|s| s.as_array())
                .map_or(0, |s| s.iter().map(|d| d.as_u64().unwrap()).product());
            Case {
                entry: k["entry"].as_str().unwrap().to_string(),
                op: k["op"].as_str().unwrap().to_string(),
                dt: Dt::parse(k["dtype"].as_str().unwrap()),
                div16: file.ends_with("_div16.ptx"),
                static_n: (k["dynamic"] == serde_json::Value::Bool(false)).then_some(shape),
                file,
                text,
            }
        })
        .collect()
}

/// The PTX types of `entry`'s params, in order (`ptr` for a `.ptr` one).
fn param_types(text: &str, entry: &str) -> Vec<String> {
    let start = text.find(&format!(".entry {entry}(")).unwrap();
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with(')'))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            if words.contains(&".ptr") {
                "ptr".to_string()
            } else {
                words[1].trim_start_matches('.').to_string()
            }
        })
        .collect()
}

/// `(threads per block, elements per block)`: `.reqntid`, and `2^k` from
/// the `shl.b32 %r, <ctaid>, k` that starts the index.
fn geometry(text: &str) -> (u32, u32) {
    let threads: u32 = text
        .split(".reqntid ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let ctaid = lines
        .iter()
        .find_map(|l| l.strip_prefix("mov.u32"))
        .filter(|l| l.contains("%ctaid.x"))
        .map(|l| l.split(',').next().unwrap().trim().to_string())
        .unwrap();
    let shift: u32 = lines
        .iter()
        .filter_map(|l| l.strip_prefix("shl.b32"))
        .find_map(|l| {
            let parts: Vec<&str> = l.split(',').map(str::trim).collect();
            (parts.get(1) == Some(&ctaid.as_str()))
                .then(|| parts[2].trim_end_matches(';').parse().unwrap())
        })
        .unwrap();
    (threads, 1 << shift)
}

/// What a launch of a case passes besides its operands.
struct Shape {
    inputs: usize,
    /// Bytes of each input (`None`: `n` elements).
    input_bytes: Vec<Option<u64>>,
    /// The by-value scalars, as the contract's typed bits.
    args: Vec<u64>,
}

/// The contract of `case`, and what its launches pass (`scalars` are the
/// f32 arguments of a Triton scale+shift, the broadcast row of a bias).
fn contract(case: &Case, args: &[u64]) -> (LaunchContract, Shape) {
    let types = param_types(&case.text, &case.entry);
    let count_at = types.iter().position(|t| t == "u32").unwrap();
    let pointers = types[..count_at].iter().filter(|t| *t == "ptr").count();
    let inputs = pointers - 1;
    let size = case.dt.size() as u64;
    let mut params = Vec::new();
    let mut pointer = 0u32;
    let mut scalar_types = Vec::new();
    for (i, t) in types.iter().enumerate() {
        let kind = match t.as_str() {
            "ptr" if i < count_at => {
                pointer += 1;
                ParamKind::Pointer {
                    access: if pointer as usize <= inputs {
                        PointerAccess::Read
                    } else {
                        PointerAccess::Written
                    },
                    operand: Some(pointer - 1),
                }
            }
            "ptr" => ParamKind::Pointer {
                access: PointerAccess::UnusedNull,
                operand: None,
            },
            "u32" => ParamKind::Count(ScalarType::U32),
            other => {
                let t = ScalarType::from_ptx(other).unwrap();
                scalar_types.push(t);
                ParamKind::Scalar(t)
            }
        };
        params.push(ContractParam {
            name: format!("p{i}"),
            kind,
        });
    }
    assert_eq!(scalar_types.len(), args.len(), "{}", case.file);
    // The broadcast bias is one row of `ks0` (the `.u64` arg) or 1024
    // elements; every other operand is `n` elements (a static kernel's
    // footprint is its literal count).
    let bias_row = (case.op == "bias_gelu_2d").then(|| args.first().copied().unwrap_or(1024));
    let bytes = |k: usize| match (k, bias_row) {
        (1, Some(row)) => Expr::Const(row * size),
        _ => match case.static_n {
            Some(n) => Expr::Const(n * size),
            None => Expr::product(Expr::Count, Expr::Const(size)),
        },
    };
    let footprints = (0..=inputs)
        .map(|k| Footprint {
            param: u16::try_from(k).unwrap(),
            alignment: case.dt.size() as u32,
            bytes: bytes(k),
        })
        .collect();
    let (threads, per_block) = geometry(&case.text);
    assert_eq!(per_block % threads, 0, "{}", case.file);
    let contract = LaunchContract {
        params,
        geometry: Geometry {
            block: BlockRule::Required(threads),
            elements_per_thread: per_block / threads,
        },
        footprints,
        preconditions: Vec::new(),
    };
    let shape = Shape {
        inputs,
        input_bytes: (0..inputs)
            .map(|k| bias_row.filter(|_| k == 1).map(|row| row * size))
            .collect(),
        args: args.to_vec(),
    };
    (contract, shape)
}

/// Random element bits of `dt`: finite values in `[-range, range]`, and for
/// `specials` signed zeros, infinities, subnormals and large values too.
fn random_elements(r: &mut impl Rng, dt: Dt, count: usize, range: f32, specials: bool) -> Vec<u32> {
    let special = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        -3e-39,
        6e4,
        -1e30,
    ];
    (0..count)
        .map(|i| {
            let x = if specials && i % 7 == 3 {
                special[r.random_range(0..special.len())]
            } else {
                r.random_range(-range..range)
            };
            dt.round(x)
        })
        .collect()
}

fn to_bytes(dt: Dt, v: &[u32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| x.to_le_bytes()[..dt.size()].to_vec())
        .collect()
}

fn from_bytes(dt: Dt, b: &[u8]) -> Vec<u32> {
    b.chunks(dt.size())
        .map(|c| {
            let mut x = [0u8; 4];
            x[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(x)
        })
        .collect()
}

/// What one output element must be.
enum Want {
    /// These exact bits.
    Exact(u32),
    /// Within `tol` of `value` (a NaN matches a NaN).
    Near { value: f64, tol: f64 },
}

/// The tolerance of an approximate kernel's element: relative `2^-16`,
/// absolute `2^-20` scaled by the input's magnitude (cancellation in
/// `1 + erf(x)` or `x · sigmoid(x)` for negative `x`), and one ulp of a
/// narrow output type (the f32 result may round either way).
fn approx_tolerance(dt: Dt, want: f64, x: f64) -> f64 {
    want.abs() * f64::powi(2.0, -16) + f64::powi(2.0, -20) * x.abs().max(1.0) + dt.ulp(want)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn gelu_tanh(x: f64) -> f64 {
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// The reference for element `i`: `xs[k][i]` are the inputs' bits (the
/// bias already broadcast), `args` the scalars.
fn reference(case: &Case, xs: &[u32], args: &[u64]) -> Want {
    let dt = case.dt;
    let v: Vec<f64> = xs.iter().map(|b| dt.value(*b)).collect();
    let f: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    let exact = |x: f32| Want::Exact(dt.round(x));
    let near = |value: f64, x: f64| Want::Near {
        value,
        tol: approx_tolerance(dt, value, x),
    };
    match case.op.as_str() {
        "add" => exact(f[0] + f[1]),
        "mul" => exact(f[0] * f[1]),
        "residual_add" => exact((f[0] + f[1]) * 0.5),
        "mul_add" => exact(f[0].mul_add(f[1], 1.0)),
        // Triton: `max.f32 x, 0` (a NaN gives 0, -0 gives +0); Inductor:
        // `x < 0 ? 0 : x` (a NaN and -0 stay).
        "relu" if case.file.starts_with("triton/") => exact(if f[0] > 0.0 { f[0] } else { 0.0 }),
        "relu" => exact(if f[0] < 0.0 { 0.0 } else { f[0] }),
        "scale_shift" if args.is_empty() => exact(f[0].mul_add(1.5, -0.25)),
        "scale_shift" => {
            let (s, t) = (
                f32::from_bits(args[0] as u32),
                f32::from_bits(args[1] as u32),
            );
            exact(f[0].mul_add(s, t))
        }
        "gelu" => near(gelu(v[0]), v[0]),
        "gelu_tanh" => near(gelu_tanh(v[0]), v[0]),
        "silu_mul" => near(v[0] * sigmoid(v[0]) * v[1], v[0] * v[1]),
        "sigmoid_mul" => near(sigmoid(v[0]) * v[0], v[0]),
        "tanh" => near(v[0].tanh(), v[0]),
        "exp" => near(v[0].exp(), v[0].exp()),
        "bias_gelu_2d" => {
            let s = f64::from(f[0] + f[1]);
            near(gelu(s), s)
        }
        op => panic!("no reference for {op}"),
    }
}

/// Whether the op is exact (its inputs may hold specials).
fn exact_op(op: &str) -> bool {
    matches!(
        op,
        "add" | "mul" | "residual_add" | "mul_add" | "relu" | "scale_shift"
    )
}

/// Runs `case` over `n` elements (checked mode, `threads` workers) and
/// compares every element; elements past `n` must keep their poison.
/// Returns the largest error of an approximate element as a fraction of
/// its tolerance.
fn run_case(case: &Case, n: u64, threads: usize, seed: u64) -> f64 {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let args: Vec<u64> = match (case.op.as_str(), param_types(&case.text, &case.entry).len()) {
        ("scale_shift", 7) => vec![
            u64::from(r.random_range(-4.0f32..4.0).to_bits()),
            u64::from(r.random_range(-4.0f32..4.0).to_bits()),
        ],
        ("bias_gelu_2d", 7) => vec![1024],
        _ => Vec::new(),
    };
    let (contract, shape) = contract(case, &args);
    let kernel = HostKernel::unverified_for_tests(&case.text, &case.entry, contract)
        .unwrap_or_else(|e| panic!("{}: {e}", case.file));
    let dt = case.dt;
    let exact = exact_op(&case.op);
    let range = match case.op.as_str() {
        "exp" => 20.0,
        _ if exact => 1000.0,
        _ => 12.0,
    };
    let count = |k: usize| shape.input_bytes[k].map_or(n as usize, |b| b as usize / dt.size());
    let ins: Vec<Vec<u32>> = (0..shape.inputs)
        .map(|k| random_elements(&mut r, dt, count(k), range, exact))
        .collect();
    let mut in_bytes: Vec<Vec<u8>> = ins.iter().map(|v| to_bytes(dt, v)).collect();
    // The output buffer runs 64 elements past `n`, all poisoned; the span
    // covers `n` elements only, so checked mode faults on any store past.
    let tail = 64;
    let mut out = vec![POISON; (n as usize + tail) * dt.size()];
    let spans: Vec<HostSpan> = in_bytes
        .iter_mut()
        .map(|b| HostSpan {
            ptr: b.as_mut_ptr(),
            len: b.len(),
        })
        .collect();
    let launch = HostLaunch {
        inputs: &spans,
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: n as usize * dt.size(),
        },
        n,
        params: &[],
        args: &shape.args,
        threads,
        checked: true,
        control: None,
    };
    // SAFETY: every span is a live Vec of at least `len` bytes.
    unsafe { kernel.launch(&launch) }.unwrap_or_else(|e| panic!("{} n={n}: {e}", case.file));
    let got = from_bytes(dt, &out);
    let mut worst = 0.0f64;
    for i in 0..n as usize {
        let xs: Vec<u32> = ins
            .iter()
            .enumerate()
            .map(|(k, v)| {
                if shape.input_bytes[k].is_some() {
                    v[i % v.len()]
                } else {
                    v[i]
                }
            })
            .collect();
        let g = dt.value(got[i]);
        match reference(case, &xs, &args) {
            Want::Exact(w) => {
                let both_nan = g.is_nan() && dt.value(w).is_nan();
                assert!(
                    got[i] == w || both_nan,
                    "{} n={n} element {i}: inputs {:?} got {:#x} ({g:e}) want {w:#x} ({:e})",
                    case.file,
                    xs.iter().map(|b| dt.value(*b)).collect::<Vec<_>>(),
                    got[i],
                    dt.value(w)
                );
            }
            Want::Near { value, tol } => {
                let ok = (g.is_nan() && value.is_nan()) || (g - value).abs() <= tol || g == value;
                assert!(
                    ok,
                    "{} n={n} element {i}: input {:e} got {g:e} want {value:e} (tolerance {tol:e})",
                    case.file,
                    dt.value(xs[0])
                );
                if value.is_finite() && tol > 0.0 {
                    worst = worst.max((g - value).abs() / tol);
                }
            }
        }
    }
    let poison = from_bytes(dt, &vec![POISON; dt.size()])[0];
    assert!(
        got[n as usize..].iter().all(|x| *x == poison),
        "{} n={n}: an element past n was written",
        case.file
    );
    worst
}

/// The counts a case runs at: a static kernel its literal count; a
/// dynamic one a count that is a multiple of its block and one that is not
/// (a multiple of 16 for a `div16` specialisation), and a single block's
/// worth minus a bit.
fn counts(case: &Case) -> Vec<u64> {
    if let Some(n) = case.static_n {
        return vec![n];
    }
    let (_, per_block) = geometry(&case.text);
    let per_block = u64::from(per_block);
    let ragged = if case.div16 { 16 } else { 3 };
    vec![per_block * 5, per_block * 3 + ragged, ragged * 7]
}

fn run_family(family: &str, expected: usize) {
    let cases = cases(family);
    assert_eq!(cases.len(), expected, "{family} corpus size");
    let mut seed = 0x7217_0000;
    let mut worst = 0.0f64;
    for case in &cases {
        for n in counts(case) {
            seed += 1;
            worst = worst.max(run_case(case, n, 1 + (seed as usize % 3), seed));
        }
    }
    eprintln!("{family}: largest approximate error {worst:.3} of its tolerance");
}

#[test]
fn every_triton_kernel_matches_its_reference() {
    run_family("triton", 60);
}

#[test]
fn every_inductor_kernel_matches_its_reference() {
    run_family("inductor", 80);
}

/// The corpus kernel at `file`.
fn case(file: &str) -> Case {
    let family = file.split('/').next().unwrap();
    cases(family).into_iter().find(|c| c.file == file).unwrap()
}

/// Launches `kernel` (checked) on `n`-element f32 spans of `lens` elements
/// each (inputs, then the output); returns the output.
fn launch_f32(
    kernel: &HostKernel,
    n: u64,
    lens: &[usize],
    args: &[u64],
    params: &[f32],
) -> Result<Vec<u32>, crate::ptx::HostFault> {
    let mut r = rand::rngs::StdRng::seed_from_u64(n ^ 0x51);
    let mut bufs: Vec<Vec<u8>> = lens
        .iter()
        .map(|len| {
            to_bytes(
                Dt::F32,
                &random_elements(&mut r, Dt::F32, *len, 100.0, false),
            )
        })
        .collect();
    let mut out = bufs.pop().unwrap();
    out.fill(POISON);
    let spans: Vec<HostSpan> = bufs
        .iter_mut()
        .map(|b| HostSpan {
            ptr: b.as_mut_ptr(),
            len: b.len(),
        })
        .collect();
    let launch = HostLaunch {
        inputs: &spans,
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n,
        params,
        args,
        threads: 2,
        checked: true,
        control: None,
    };
    // SAFETY: every span is a live Vec of exactly `len` bytes.
    unsafe { kernel.launch(&launch) }?;
    Ok(from_bytes(Dt::F32, &out))
}

/// A pointer the contract passes as null (a Triton scratch pointer) that
/// the kernel does dereference faults in checked mode, naming the access:
/// here Triton's `add` with its second input declared a null pointer.
#[test]
fn a_dereferenced_null_pointer_faults_in_checked_mode() {
    let c = case("triton/add_f32_b1024_w4_nodiv.ptx");
    let (mut contract, _) = contract(&c, &[]);
    contract.params[1].kind = ParamKind::Pointer {
        access: PointerAccess::UnusedNull,
        operand: None,
    };
    contract.params[2].kind = ParamKind::Pointer {
        access: PointerAccess::Written,
        operand: Some(1),
    };
    contract.footprints.remove(1);
    let kernel = HostKernel::unverified_for_tests(&c.text, &c.entry, contract).unwrap();
    let fault = launch_f32(&kernel, 1000, &[1000, 1000], &[], &[]).unwrap_err();
    assert!(
        fault.message.starts_with("4-byte load at 0x")
            && fault.message.ends_with("outside the launch's operands"),
        "{fault}"
    );
    assert!(fault.line > 0, "{fault}");
}

/// The count must fit the count param's type: a `.u32` count refuses
/// `n = 2^32` before any thread runs (and before the spans are looked at).
#[test]
fn a_count_past_its_type_is_refused() {
    let c = case("triton/add_f32_b1024_w4_nodiv.ptx");
    let (contract, _) = contract(&c, &[]);
    let kernel = HostKernel::unverified_for_tests(&c.text, &c.entry, contract.clone()).unwrap();
    let fault = launch_f32(&kernel, 1 << 32, &[4, 4, 4], &[], &[]).unwrap_err();
    assert_eq!(
        fault.message,
        "n = 4294967296 does not fit the kernel's .u32 count"
    );
    let mut signed = contract;
    signed.params[3].kind = ParamKind::Count(ScalarType::S32);
    let kernel = HostKernel::unverified_for_tests(&c.text, &c.entry, signed).unwrap();
    let fault = launch_f32(&kernel, 1 << 31, &[4, 4, 4], &[], &[]).unwrap_err();
    assert_eq!(
        fault.message,
        "n = 2147483648 does not fit the kernel's .s32 count"
    );
}

/// Every operand's span must hold its footprint at the launch's values:
/// one element short is refused, naming the operand.
#[test]
fn a_span_short_of_its_footprint_is_refused() {
    let c = case("triton/add_f32_b1024_w4_nodiv.ptx");
    let (contract, _) = contract(&c, &[]);
    let kernel = HostKernel::unverified_for_tests(&c.text, &c.entry, contract).unwrap();
    let fault = launch_f32(&kernel, 3000, &[3000, 3000, 2999], &[], &[]).unwrap_err();
    assert_eq!(
        fault.message,
        "operand 2 holds 11996 bytes, fewer than its footprint n × 4 at n = 3000"
    );
    let fault = launch_f32(&kernel, 3000, &[2999, 3000, 3000], &[], &[]).unwrap_err();
    assert!(
        fault.message.starts_with("operand 0 holds 11996 bytes"),
        "{fault}"
    );
    assert!(launch_f32(&kernel, 3000, &[3000, 3000, 3000], &[], &[]).is_ok());
}

/// Triton's `n % 16 == 0` specialisation predicates each `.v4` access on
/// its first lane: launched with a count that is no multiple of 16, the
/// last vector reaches past `n`. Checked mode turns that into a fault at
/// the access, never a write past the span.
#[test]
fn a_divisibility_specialisation_run_off_its_count_faults_not_corrupts() {
    let c = case("triton/add_f32_b1024_w4_div16.ptx");
    let (contract, _) = contract(&c, &[]);
    let kernel = HostKernel::unverified_for_tests(&c.text, &c.entry, contract).unwrap();
    let fault = launch_f32(&kernel, 2053, &[2053, 2053, 2053], &[], &[]).unwrap_err();
    assert!(
        fault.message.contains("outside the launch's operands"),
        "{fault}"
    );
    assert!(launch_f32(&kernel, 2064, &[2064, 2064, 2064], &[], &[]).is_ok());
}

/// By-value scalars: typed `args` in the contract's order, or for a kernel
/// whose scalars are all f32, the scalar ABI's `params` (the same values
/// give the same output); a wrong number, or bits above a 32-bit slot, is
/// refused.
#[test]
fn scalar_arguments_come_from_args_or_the_f32_params() {
    let c = case("triton/scale_shift_f32_b1024_w4_nodiv.ptx");
    let (contract, _) = contract(&c, &[0, 0]);
    let kernel = HostKernel::unverified_for_tests(&c.text, &c.entry, contract).unwrap();
    let (s, t) = (0.75f32, -3.5f32);
    let bits = [u64::from(s.to_bits()), u64::from(t.to_bits())];
    let n = 1500;
    let by_args = launch_f32(&kernel, n, &[1500, 1500], &bits, &[]).unwrap();
    let by_params = launch_f32(&kernel, n, &[1500, 1500], &[], &[s, t]).unwrap();
    assert_eq!(by_args, by_params);
    let mut r = rand::rngs::StdRng::seed_from_u64(n ^ 0x51);
    let x = random_elements(&mut r, Dt::F32, 1500, 100.0, false);
    for i in 0..1500 {
        let want = f32::from_bits(x[i]).mul_add(s, t).to_bits();
        assert_eq!(by_args[i], want, "element {i}");
    }
    let fault = launch_f32(&kernel, n, &[1500, 1500], &bits[..1], &[]).unwrap_err();
    assert_eq!(
        fault.message,
        "the kernel takes 2 scalar arguments, the launch passed 1 (and 0 float params)"
    );
    let fault = launch_f32(&kernel, n, &[1500, 1500], &[], &[s]).unwrap_err();
    assert_eq!(
        fault.message,
        "the kernel takes 2 float params, the launch passed 1"
    );
    let fault = launch_f32(&kernel, n, &[1500, 1500], &[bits[0], 1 << 32], &[]).unwrap_err();
    assert_eq!(
        fault.message,
        "scalar argument 1 (.f32) has bits above its 32: 0x100000000"
    );
}

/// A typed `.s32` scalar argument (passed as its zero-extended bits) read
/// by `ld.param.s32` into a 64-bit register is sign-extended, as on the GPU.
#[test]
fn a_signed_scalar_widens_with_its_sign() {
    let text = r#".version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 k_in, .param .u64 k_out, .param .u64 k_n, .param .s32 k_s)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<13>;
	ld.param.u64 	%rd1, [k_in];
	ld.param.u64 	%rd2, [k_out];
	ld.param.u64 	%rd3, [k_n];
	ld.param.s32 	%rd4, [k_s];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd5, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd6, %r3;
	add.s64 	%rd7, %rd5, %rd6;
	setp.ge.s64 	%p1, %rd7, %rd3;
	@%p1 bra 	$L__end;
	shl.b64 	%rd8, %rd7, 3;
	add.s64 	%rd9, %rd1, %rd8;
	ld.global.u64 	%rd10, [%rd9];
	add.s64 	%rd11, %rd10, %rd4;
	add.s64 	%rd12, %rd2, %rd8;
	st.global.u64 	[%rd12], %rd11;
$L__end:
	ret;
}
"#;
    let pointer = |access, operand| ParamKind::Pointer {
        access,
        operand: Some(operand),
    };
    let kinds = [
        pointer(PointerAccess::Read, 0),
        pointer(PointerAccess::Written, 1),
        ParamKind::Count(ScalarType::S64),
        ParamKind::Scalar(ScalarType::S32),
    ];
    let contract = LaunchContract {
        params: kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| ContractParam {
                name: format!("p{i}"),
                kind,
            })
            .collect(),
        geometry: Geometry {
            block: BlockRule::Default,
            elements_per_thread: 1,
        },
        footprints: (0..2)
            .map(|k| Footprint {
                param: k,
                alignment: 8,
                bytes: Expr::product(Expr::Count, Expr::Const(8)),
            })
            .collect(),
        preconditions: Vec::new(),
    };
    let kernel = HostKernel::unverified_for_tests(text, "k", contract).unwrap();
    let n = 700usize;
    let mut r = rand::rngs::StdRng::seed_from_u64(0x5e);
    let input: Vec<u64> = (0..n).map(|_| r.random()).collect();
    let mut in_bytes: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    for s in [-5i32, i32::MIN, 7] {
        let mut out = vec![POISON; n * 8];
        let spans = [HostSpan {
            ptr: in_bytes.as_mut_ptr(),
            len: in_bytes.len(),
        }];
        let launch = HostLaunch {
            inputs: &spans,
            output: HostSpan {
                ptr: out.as_mut_ptr(),
                len: out.len(),
            },
            n: n as u64,
            params: &[],
            args: &[u64::from(s as u32)],
            threads: 1,
            checked: true,
            control: None,
        };
        // SAFETY: both spans are live Vecs of exactly `len` bytes.
        unsafe { kernel.launch(&launch) }.unwrap();
        for (i, chunk) in out.chunks(8).enumerate() {
            let got = u64::from_le_bytes(chunk.try_into().unwrap());
            assert_eq!(
                got,
                input[i].wrapping_add(i64::from(s) as u64),
                "{s} element {i}"
            );
        }
    }
}

/// Throughput of Triton's `add` (f32, BLOCK_SIZE 1024, 4 warps: 8 elements
/// per thread, masked) on one and two worker threads, 16M elements; the
/// figure `cargo bench --bench host_engine` prints for the scalar-ABI add
/// is the one to set it against. Run:
/// `cargo test --release --lib host::jit_tests::triton_add_throughput -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn triton_add_throughput() {
    let c = case("triton/add_f32_b1024_w4_nodiv.ptx");
    let (contract, _) = contract(&c, &[]);
    let kernel = HostKernel::unverified_for_tests(&c.text, &c.entry, contract).unwrap();
    let n = 16usize << 20;
    let mut a: Vec<u8> = (0..n)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let mut b = a.clone();
    let mut out = vec![0u8; n * 4];
    let spans = [
        HostSpan {
            ptr: a.as_mut_ptr(),
            len: a.len(),
        },
        HostSpan {
            ptr: b.as_mut_ptr(),
            len: b.len(),
        },
    ];
    for threads in [1, 2] {
        let launch = HostLaunch {
            inputs: &spans,
            output: HostSpan {
                ptr: out.as_mut_ptr(),
                len: out.len(),
            },
            n: n as u64,
            params: &[],
            args: &[],
            threads,
            checked: false,
            control: None,
        };
        let best = (0..3)
            .map(|_| {
                let t = std::time::Instant::now();
                // SAFETY: the spans are live Vecs of `len` bytes, which hold
                // the kernel's footprint `n × 4` (its accesses are masked by
                // `n`, as the checked runs above show).
                unsafe { kernel.launch(&launch) }.unwrap();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        eprintln!(
            "triton add_f32 b1024, {threads} thread(s): {:.3e} el/s",
            n as f64 / best
        );
    }
}
