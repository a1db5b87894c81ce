//! The nvcc compatibility corpus (`tests/corpus/nvcc/`): its manifest, the
//! PTX files of every variant, input domains, and an independent Rust
//! reference of every manifest op with the C conversion rules.
//!
//! Shared by `tests/verifier/nvcc_corpus.rs` (verifier verdicts, host engine) and
//! `tests/gpu/nvcc.rs` (the CUDA executor), `#[path]`-included.
//!
//! Values are modelled exactly: every float of f16/bf16/f32/f64 is an `f64`,
//! every integer of i8..u64 an `i128`. Rounding to a float type is round to
//! nearest even (the `half` crate for f16/bf16, Rust's `as` for f32);
//! transcendental functions are `libm`'s f64 ones (within 1 ulp of f64),
//! rounded once to the compute type.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use ptxd::ptx::{PtxError, Signature};
use rand::Rng;
use serde_json::Value;

/// The corpus directory: `$PTXD_NVCC_CORPUS` (the packed `.gpu/nvcc`) or
/// `tests/corpus/nvcc` of the source tree.
pub fn corpus_root() -> PathBuf {
    std::env::var_os("PTXD_NVCC_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/nvcc")))
}

pub const ARCHS: [&str; 3] = ["sm_80", "sm_90", "sm_100"];
pub const VARIANTS: [&str; 3] = ["plain", "lineinfo", "fastmath"];

/// An element type of the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F16,
    Bf16,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
}

impl Ty {
    pub fn parse(s: &str) -> Ty {
        match s {
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "i8" => Ty::I8,
            "i16" => Ty::I16,
            "i32" => Ty::I32,
            "i64" => Ty::I64,
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            other => panic!("manifest: unknown type {other:?}"),
        }
    }

    pub fn bits(self) -> u32 {
        match self {
            Ty::I8 | Ty::U8 => 8,
            Ty::F16 | Ty::Bf16 | Ty::I16 | Ty::U16 => 16,
            Ty::F32 | Ty::I32 | Ty::U32 => 32,
            Ty::F64 | Ty::I64 | Ty::U64 => 64,
        }
    }

    pub fn size(self) -> usize {
        self.bits() as usize / 8
    }

    pub fn is_float(self) -> bool {
        matches!(self, Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64)
    }

    pub fn signed(self) -> bool {
        matches!(self, Ty::I8 | Ty::I16 | Ty::I32 | Ty::I64)
    }

    pub fn mask(self) -> u64 {
        if self.bits() == 64 {
            u64::MAX
        } else {
            (1u64 << self.bits()) - 1
        }
    }
}

/// One element, exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val {
    F(f64),
    I(i128),
}

impl Val {
    fn f(self) -> f64 {
        match self {
            Val::F(x) => x,
            Val::I(i) => i as f64,
        }
    }

    fn i(self) -> i128 {
        match self {
            Val::I(i) => i,
            Val::F(x) => x as i128,
        }
    }

    fn is_zero(self) -> bool {
        match self {
            Val::F(x) => x == 0.0,
            Val::I(i) => i == 0,
        }
    }

    fn gt0(self) -> bool {
        match self {
            Val::F(x) => x > 0.0,
            Val::I(i) => i > 0,
        }
    }

    fn lt(self, other: Val) -> bool {
        match (self, other) {
            (Val::I(a), Val::I(b)) => a < b,
            (a, b) => a.f() < b.f(),
        }
    }
}

/// Rounds `x` to the float type `ty`, to nearest even.
pub fn round_float(x: f64, ty: Ty) -> f64 {
    match ty {
        Ty::F64 => x,
        Ty::F32 => f64::from(x as f32),
        // Not `half`'s `from_f64`: its bf16 one rounds some values the
        // wrong way (0xc0348006 as f32 gives 0xc034, not 0xc035).
        Ty::F16 => round_binary(x, 11, -14, 65504.0),
        Ty::Bf16 => round_binary(x, 8, -126, f64::from(bf16::MAX.to_f32())),
        _ => panic!("round_float to {ty:?}"),
    }
}

/// Rounds `x` to nearest even in a binary format with a `p`-bit significand,
/// smallest normal exponent `emin` (subnormals below) and largest finite
/// `max`; exact in f64 for the half types.
fn round_binary(x: f64, p: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let e = (((x.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    // The spacing of the format's values at x: a power of two, so the
    // scaling is exact and only `round_ties_even` rounds.
    let quantum = 2f64.powi(e - (p - 1));
    let r = (x / quantum).round_ties_even() * quantum;
    if r.abs() > max {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

/// Keeps the low bits of `i` as the integer type `ty`.
pub fn wrap(i: i128, ty: Ty) -> i128 {
    let low = (i as u64) & ty.mask();
    if ty.signed() && (low >> (ty.bits() - 1)) & 1 == 1 {
        i128::from(low) - (1i128 << ty.bits())
    } else {
        i128::from(low)
    }
}

fn int_min_max(ty: Ty) -> (i128, i128) {
    if ty.signed() {
        (-(1i128 << (ty.bits() - 1)), (1i128 << (ty.bits() - 1)) - 1)
    } else {
        (0, (1i128 << ty.bits()) - 1)
    }
}

/// C conversion of `v` to `to`: floats round to nearest even, floats to
/// integers truncate toward zero (out of range, undefined in C, saturates
/// and NaN gives 0 as PTX `cvt.rzi` does; the domains keep clear of it),
/// integers to integers keep the low bits.
pub fn convert(v: Val, to: Ty) -> Val {
    match v {
        Val::F(x) if to.is_float() => Val::F(round_float(x, to)),
        Val::F(x) => {
            if x.is_nan() {
                return Val::I(0);
            }
            let (lo, hi) = int_min_max(to);
            let t = x.trunc();
            Val::I(if t <= lo as f64 {
                lo
            } else if t >= hi as f64 {
                hi
            } else {
                t as i128
            })
        }
        Val::I(i) if to.is_float() => Val::F(int_to_float(i, to)),
        Val::I(i) => Val::I(wrap(i, to)),
    }
}

/// An integer (at most 64 bits, signed or not) rounded once to a float type.
fn int_to_float(i: i128, to: Ty) -> f64 {
    // Rust's integer-to-float `as` rounds to nearest even, in one step.
    let as_f32 = |i: i128| {
        if let Ok(s) = i64::try_from(i) {
            s as f32
        } else {
            i as u64 as f32
        }
    };
    let as_f64 = |i: i128| {
        if let Ok(s) = i64::try_from(i) {
            s as f64
        } else {
            i as u64 as f64
        }
    };
    match to {
        Ty::F32 => f64::from(as_f32(i)),
        Ty::F64 => as_f64(i),
        // Exact in f64 below 2^53, so one rounding; the corpus converts no
        // wider integer to a half type.
        _ => round_float(as_f64(i), to),
    }
}

/// The little-endian bits of `v` (already of type `ty`).
pub fn encode(v: Val, ty: Ty) -> u64 {
    match (v, ty) {
        (Val::F(x), Ty::F16) => u64::from(f16::from_f32(x as f32).to_bits()),
        (Val::F(x), Ty::Bf16) => u64::from(bf16::from_f32(x as f32).to_bits()),
        (Val::F(x), Ty::F32) => u64::from((x as f32).to_bits()),
        (Val::F(x), Ty::F64) => x.to_bits(),
        (Val::I(i), t) if !t.is_float() => (i as u64) & t.mask(),
        (v, t) => panic!("encode {v:?} as {t:?}"),
    }
}

pub fn decode(bits: u64, ty: Ty) -> Val {
    match ty {
        Ty::F16 => Val::F(f16::from_bits(bits as u16).to_f64()),
        Ty::Bf16 => Val::F(bf16::from_bits(bits as u16).to_f64()),
        Ty::F32 => Val::F(f64::from(f32::from_bits(bits as u32))),
        Ty::F64 => Val::F(f64::from_bits(bits)),
        t => Val::I(wrap(i128::from(bits), t)),
    }
}

pub fn to_bytes(vals: &[Val], ty: Ty) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * ty.size());
    for v in vals {
        out.extend_from_slice(&encode(*v, ty).to_le_bytes()[..ty.size()]);
    }
    out
}

/// The bits of element `i` of a little-endian buffer of `ty`.
pub fn element_bits(bytes: &[u8], ty: Ty, i: usize) -> u64 {
    let s = ty.size();
    let mut b = [0u8; 8];
    b[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    u64::from_le_bytes(b)
}

/// One value of `ty` from the manifest domain `domain`, converted to `ty`.
pub fn draw(r: &mut impl Rng, ty: Ty, domain: &str) -> Val {
    if ty.is_float() {
        let x: f64 = match domain {
            "any" => r.random_range(-8.0..=8.0),
            "small" => r.random_range(-3.0..=3.0),
            "pos" => r.random_range(0.125..=8.0),
            "nonzero" => {
                let m: f64 = r.random_range(0.125..=8.0);
                if r.random() {
                    m
                } else {
                    -m
                }
            }
            "wide" => r.random_range(-1e6..=1e6),
            "byte" => r.random_range(0.0..=255.75),
            other => panic!("manifest: unknown float domain {other:?}"),
        };
        return convert(Val::F(x), ty);
    }
    let (lo, hi) = int_min_max(ty);
    let i: i128 = match domain {
        "any" => decode(r.random::<u64>(), ty).i(),
        "small" => r.random_range(lo.max(-1000)..=1000),
        "pos" => {
            if hi > i128::from(i64::MAX) {
                i128::from(r.random_range(1..=u64::MAX))
            } else {
                i128::from(r.random_range(1..=hi as i64))
            }
        }
        "byte" => r.random_range(0..=255),
        other => panic!("manifest: unknown int domain {other:?}"),
    };
    Val::I(i)
}

/// A tolerance class of the manifest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tol {
    Exact,
    Ulps(u64),
    Rel(f64),
}

impl Tol {
    pub fn parse(s: &str) -> Tol {
        if s == "exact" {
            Tol::Exact
        } else if let Some(n) = s.strip_prefix("ulps:") {
            Tol::Ulps(n.parse().unwrap())
        } else if let Some(x) = s.strip_prefix("rel:") {
            Tol::Rel(x.parse().unwrap())
        } else {
            panic!("manifest: unknown tolerance {s:?}")
        }
    }
}

/// The position of a float's bits on the number line (monotone, +0 == -0).
fn ordered(bits: u64, ty: Ty) -> i128 {
    let sign = 1u64 << (ty.bits() - 1);
    if bits & sign != 0 {
        -i128::from(bits & !sign & ty.mask())
    } else {
        i128::from(bits)
    }
}

/// Whether `got` (bits of `ty`) matches the reference `want` within `tol`.
pub fn matches(tol: Tol, got: u64, want: Val, ty: Ty) -> bool {
    let want_bits = encode(want, ty);
    if ty.is_float() {
        let g = decode(got, ty).f();
        let w = want.f();
        if g.is_nan() || w.is_nan() {
            return g.is_nan() && w.is_nan();
        }
        match tol {
            Tol::Exact => got == want_bits,
            Tol::Ulps(n) => {
                (ordered(got, ty) - ordered(want_bits, ty)).unsigned_abs() <= u128::from(n)
            }
            Tol::Rel(x) => (g - w).abs() <= x * w.abs().max(1.0),
        }
    } else {
        let (g, w) = (decode(got, ty).i(), want.i());
        match tol {
            Tol::Exact => g == w,
            Tol::Ulps(n) => (g - w).unsigned_abs() <= u128::from(n),
            Tol::Rel(x) => ((g - w) as f64).abs() <= x * (w as f64).abs().max(1.0),
        }
    }
}

/// How a manifest kernel is computed and checked.
#[derive(Debug, Clone)]
pub struct Reference {
    pub op: String,
    /// None: `compute: none`.
    pub compute: Option<Ty>,
    pub domains: Vec<String>,
    pub param_values: Vec<f32>,
    pub tol: Tol,
    pub tol_fastmath: Tol,
}

/// A manifest kernel: its signature, and its reference where it runs.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    /// `src/casts.cu` (relative to the corpus root).
    pub file: String,
    pub inputs: Vec<Ty>,
    pub output: Ty,
    pub params: u32,
    /// `refused` kernels: the expected sub_reason per variant (`accept`
    /// for an ordinary variant). Empty for `kernels`.
    pub expect: BTreeMap<String, String>,
    /// `kernels`: always; `refused`: the `fastmath_reference` when a variant
    /// is accepted.
    pub reference: Option<Reference>,
}

impl Kernel {
    /// The PTX file of `arch` and `variant`.
    pub fn ptx_path(&self, arch: &str, variant: &str) -> PathBuf {
        let stem = Path::new(&self.file)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let dir = if self.file.starts_with("refused/") {
            "refused-ptx"
        } else {
            "ptx"
        };
        let suffix = match variant {
            "plain" => String::new(),
            v => format!(".{v}"),
        };
        corpus_root()
            .join(dir)
            .join(format!("{stem}.{arch}{suffix}.ptx"))
    }

    /// The expected verdict for `variant`: None to accept, else the sub_reason.
    pub fn expected_refusal(&self, variant: &str) -> Option<&str> {
        match self.expect.get(variant).map(String::as_str) {
            None | Some("accept") => None,
            Some(r) => Some(r),
        }
    }

    pub fn tol(&self, variant: &str) -> Tol {
        let r = self.reference.as_ref().unwrap();
        if variant == "fastmath" {
            r.tol_fastmath
        } else {
            r.tol
        }
    }

    /// The element sizes the signature must report: inputs, then output.
    pub fn element_sizes(&self) -> Vec<u32> {
        self.inputs
            .iter()
            .chain(std::iter::once(&self.output))
            .map(|t| t.size() as u32)
            .collect()
    }

    /// `__launch_bounds__(N, ..)` on the kernel's definition in its `.cu`,
    /// which nvcc emits as `.maxntid N, 1, 1`.
    pub fn launch_bounds(&self) -> Option<u32> {
        let src = std::fs::read_to_string(corpus_root().join(&self.file)).ok()?;
        let needle = format!(" {}(", self.name);
        let line = src
            .lines()
            .find(|l| l.contains("__global__") && l.contains(&needle))?;
        let rest = line.split("__launch_bounds__(").nth(1)?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    }

    /// Draws one element per input from the manifest domains.
    pub fn draw_inputs(&self, r: &mut impl Rng) -> Vec<Val> {
        let rf = self.reference.as_ref().unwrap();
        self.inputs
            .iter()
            .zip(&rf.domains)
            .map(|(t, d)| draw(r, *t, d))
            .collect()
    }

    /// The reference result of one element, in the output type.
    pub fn eval(&self, xs: &[Val]) -> Result<Val, String> {
        let rf = self.reference.as_ref().unwrap();
        eval(&rf.op, rf.compute, self.output, xs, &rf.param_values)
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn reference(v: &Value) -> Reference {
    let compute = match v["compute"].as_str().unwrap() {
        "none" => None,
        t => Some(Ty::parse(t)),
    };
    let tol = Tol::parse(v["tol"].as_str().unwrap());
    Reference {
        op: v["op"].as_str().unwrap().to_string(),
        compute,
        domains: strings(&v["domains"]),
        param_values: v["param_values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap() as f32)
            .collect(),
        tol,
        tol_fastmath: v["tol_fastmath"].as_str().map(Tol::parse).unwrap_or(tol),
    }
}

fn kernel(v: &Value, refused: bool) -> Kernel {
    let expect: BTreeMap<String, String> = if refused {
        v["expect"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, s)| (k.clone(), s.as_str().unwrap().to_string()))
            .collect()
    } else {
        BTreeMap::new()
    };
    let reference = if refused {
        v.get("fastmath_reference").map(reference)
    } else {
        Some(reference(v))
    };
    let k = Kernel {
        name: v["name"].as_str().unwrap().to_string(),
        file: v["file"].as_str().unwrap().to_string(),
        inputs: strings(&v["inputs"]).iter().map(|s| Ty::parse(s)).collect(),
        output: Ty::parse(v["output"].as_str().unwrap()),
        params: v["params"].as_u64().unwrap() as u32,
        expect,
        reference,
    };
    if let Some(r) = &k.reference {
        assert_eq!(r.domains.len(), k.inputs.len(), "{}: domains", k.name);
        assert_eq!(
            r.param_values.len(),
            k.params as usize,
            "{}: params",
            k.name
        );
    }
    k
}

/// The manifest's `kernels` and `refused`, in order.
pub fn manifest() -> (Vec<Kernel>, Vec<Kernel>) {
    let path = corpus_root().join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let m: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(m["schema"], 1);
    let kernels = m["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| kernel(v, false))
        .collect();
    let refused = m["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| kernel(v, true))
        .collect();
    (kernels, refused)
}

/// Evaluates `op` on `xs` (each of its own input type) in `compute`, and
/// converts the result to `out`.
pub fn eval(
    op: &str,
    compute: Option<Ty>,
    out: Ty,
    xs: &[Val],
    params: &[f32],
) -> Result<Val, String> {
    let x = |k: usize| {
        xs.get(k)
            .copied()
            .ok_or_else(|| format!("{op} needs input {k}"))
    };
    let Some(c) = compute else {
        // No intermediate type: the chosen input goes straight to `out`.
        let v = match op {
            "cast" => x(0)?,
            "select_gt0" => {
                if x(0)?.gt0() {
                    x(1)?
                } else {
                    x(2)?
                }
            }
            "select_nz" => {
                if !x(0)?.is_zero() {
                    x(1)?
                } else {
                    x(2)?
                }
            }
            "select_lt" => {
                if x(0)?.lt(x(1)?) {
                    x(0)?
                } else {
                    x(1)?
                }
            }
            other => return Err(format!("op {other} with compute none")),
        };
        return Ok(convert(v, out));
    };
    let a: Vec<Val> = xs.iter().map(|v| convert(*v, c)).collect();
    let p: Vec<Val> = params
        .iter()
        .map(|v| convert(Val::F(f64::from(*v)), c))
        .collect();
    let r = if c.is_float() {
        eval_float(op, c, &a, &p)?
    } else {
        eval_int(op, c, &a)?
    };
    Ok(convert(r, out))
}

fn eval_float(op: &str, c: Ty, a: &[Val], p: &[Val]) -> Result<Val, String> {
    let get = |v: &[Val], k: usize| {
        v.get(k)
            .map(|v| v.f())
            .ok_or_else(|| format!("{op} needs operand {k}"))
    };
    let x = |k| get(a, k);
    let q = |k| get(p, k);
    // One IEEE operation in `c`: computed exactly or in f64 and rounded
    // once (f64 has more than 2p+2 bits for f32 and the half types, so
    // + - * / sqrt round as if directly).
    let r = |v: f64| round_float(v, c);
    let fma = |a: f64, b: f64, d: f64| match c {
        Ty::F32 => f64::from((a as f32).mul_add(b as f32, d as f32)),
        _ => r(a.mul_add(b, d)),
    };
    let fmax = |a: f64, b: f64| a.max(b);
    let fmin = |a: f64, b: f64| a.min(b);
    // Transcendental ops: the exact function (libm in f64), rounded once.
    let v = match op {
        "abs" => x(0)?.abs(),
        "add" => r(x(0)? + x(1)?),
        "add_mul" => r(r(x(0)? + x(1)?) * x(2)?),
        "addp" => r(x(0)? + q(0)?),
        "axpb" => r(r(x(0)? * q(0)?) + q(1)?),
        "cast" => x(0)?,
        "clamp" => fmin(fmax(x(0)?, q(0)?), q(1)?),
        "div" => r(x(0)? / x(1)?),
        "fma" => fma(x(0)?, x(1)?, x(2)?),
        "lin2" => r(r(r(x(0)? * q(0)?) + r(x(1)? * q(1)?)) + q(2)?),
        "max" => fmax(x(0)?, x(1)?),
        "min" => fmin(x(0)?, x(1)?),
        "mul" => r(x(0)? * x(1)?),
        "neg" => -x(0)?,
        "relu" => fmax(x(0)?, 0.0),
        "scale" => r(x(0)? * q(0)?),
        "sub" => r(x(0)? - x(1)?),
        "sum4" => r(r(r(x(0)? + x(1)?) + x(2)?) + x(3)?),
        "sqrt" => r(x(0)?.sqrt()),
        "rsqrt" => r(1.0 / x(0)?.sqrt()),
        "cos" => r(libm::cos(x(0)?)),
        "sin" => r(libm::sin(x(0)?)),
        "tanh" => r(libm::tanh(x(0)?)),
        "erf" => r(libm::erf(x(0)?)),
        "exp" => r(libm::exp(x(0)?)),
        "exp2" => r(libm::exp2(x(0)?)),
        "log" => r(libm::log(x(0)?)),
        "log1p" => r(libm::log1p(x(0)?)),
        "log2" => r(libm::log2(x(0)?)),
        "pow" => r(libm::pow(x(0)?, x(1)?)),
        "pow_p0" => r(libm::pow(x(0)?, q(0)?)),
        "sigmoid" => r(1.0 / (1.0 + libm::exp(-x(0)?))),
        "silu" => r(x(0)? / (1.0 + libm::exp(-x(0)?))),
        "silu_mul" => r(x(0)? / (1.0 + libm::exp(-x(0)?)) * x(1)?),
        "softplus" => r(libm::log1p(libm::exp(x(0)?))),
        "gelu_erf" => r(0.5 * x(0)? * (1.0 + libm::erf(x(0)? / std::f64::consts::SQRT_2))),
        other => return Err(format!("op {other} in a float compute type")),
    };
    Ok(Val::F(v))
}

fn eval_int(op: &str, c: Ty, a: &[Val]) -> Result<Val, String> {
    let x = |k: usize| {
        a.get(k)
            .map(|v| v.i())
            .ok_or_else(|| format!("{op} needs operand {k}"))
    };
    let w = |v: i128| wrap(v, c);
    let bits = c.bits();
    let unsigned = |v: i128| (v as u64) & c.mask();
    let v = match op {
        "abs" => w(x(0)?.abs()),
        "add" => w(x(0)? + x(1)?),
        "sub" => w(x(0)? - x(1)?),
        "mul" => w(x(0)?.wrapping_mul(x(1)?)),
        "sum4" => w(x(0)? + x(1)? + x(2)? + x(3)?),
        "div" | "rem" => {
            let (n, d) = (x(0)?, x(1)?);
            if d == 0 {
                return Err(format!("{op} by zero (the domain must exclude it)"));
            }
            w(if op == "div" { n / d } else { n % d })
        }
        "xor" => w(x(0)? ^ x(1)?),
        "and_or" => w((x(0)? & x(1)?) | x(2)?),
        "min" => x(0)?.min(x(1)?),
        "max" => x(0)?.max(x(1)?),
        "shl_mask" => w(x(0)? << (x(1)? & i128::from(bits - 1))),
        // A signed value shifts arithmetically, an unsigned one (never
        // negative here) logically.
        "shr_mask" => w(x(0)? >> (x(1)? & i128::from(bits - 1))),
        "clz" => i128::from(unsigned(x(0)?).leading_zeros() - (64 - bits)),
        "popc" => i128::from(unsigned(x(0)?).count_ones()),
        "brev" => w(i128::from(unsigned(x(0)?).reverse_bits() >> (64 - bits))),
        "mulhi" => {
            let (m, n) = (x(0)?, x(1)?);
            if c.signed() || bits < 64 {
                w((m * n) >> bits)
            } else {
                w(((m as u128 * n as u128) >> 64) as i128)
            }
        }
        other => return Err(format!("op {other} in an integer compute type")),
    };
    Ok(Val::I(v))
}

/// Renders a value of `ty` for a failure message.
pub fn show(bits: u64, ty: Ty) -> String {
    match decode(bits, ty) {
        Val::F(x) => format!("{x:e} ({bits:#x})"),
        Val::I(i) => format!("{i}"),
    }
}

/// One failure: the kernel, the variant (`sm_90.fastmath`), what was
/// expected, what happened, and the PTX line to blame.
pub struct Row {
    pub kernel: String,
    pub variant: String,
    pub expected: String,
    pub got: String,
    pub line: Option<u32>,
    pub text: String,
}

pub fn print_table(title: &str, mut rows: Vec<Row>) -> String {
    rows.sort_by(|a, b| (&a.got, &a.kernel, &a.variant).cmp(&(&b.got, &b.kernel, &b.variant)));
    let mut s = format!("{title}: {} failures\n", rows.len());
    let _ = writeln!(
        s,
        "{:<34} {:<18} {:<24} {:<32} {:>5}  ptx line",
        "kernel", "variant", "expected", "got", "line"
    );
    for r in &rows {
        let _ = writeln!(
            s,
            "{:<34} {:<18} {:<24} {:<32} {:>5}  {}",
            r.kernel,
            r.variant,
            r.expected,
            r.got,
            r.line.map(|l| l.to_string()).unwrap_or_default(),
            r.text
        );
    }
    s
}

/// The PTX files, read once.
#[derive(Default)]
pub struct Files(HashMap<PathBuf, Option<String>>);

impl Files {
    pub fn get(&mut self, path: PathBuf) -> Option<&str> {
        self.0
            .entry(path.clone())
            .or_insert_with(|| std::fs::read_to_string(&path).ok())
            .as_deref()
    }
}

pub fn line_text(text: &str, line: Option<u32>) -> String {
    line.and_then(|l| text.lines().nth(l.checked_sub(1)? as usize))
        .map(|t| t.trim().chars().take(90).collect())
        .unwrap_or_default()
}

/// What `canonicalize` must return for an accepted kernel.
pub fn expected_signature(k: &Kernel) -> Signature {
    Signature {
        inputs: k.inputs.len() as u32,
        element_sizes: k.element_sizes(),
        scalar_params: k.params,
        reqntid: None,
        // `__launch_bounds__(256)` is `.maxntid 256, 1, 1`.
        maxntid: k.launch_bounds(),
    }
}

pub fn describe(e: &PtxError) -> (String, Option<u32>) {
    match e {
        PtxError::NonScalarAbi {
            sub_reason, line, ..
        } => (sub_reason.to_string(), *line),
        PtxError::Parse { line, message, .. } => (format!("parse: {message}"), Some(*line)),
        PtxError::UnsupportedOnHost { opcode, line } => {
            (format!("unsupported on host: {opcode}"), Some(*line))
        }
        other => (format!("{other}"), None),
    }
}

/// Poison for an output element: a quiet NaN with a payload for floats (no
/// reference of the corpus is NaN), 0xA5.. for integers.
pub fn poison(ty: Ty) -> u64 {
    match ty {
        Ty::F16 => 0x7e5a,
        Ty::Bf16 => 0x7fda,
        Ty::F32 => 0x7fc0_dead,
        Ty::F64 => 0x7ff8_dead_dead_dead,
        _ => 0xa5a5_a5a5_a5a5_a5a5,
    }
}

/// The random operands of one launch: `n` elements per input, and the
/// reference result of each element.
pub struct Case {
    pub n: usize,
    pub inputs: Vec<Vec<u8>>,
    pub input_vals: Vec<Vec<Val>>,
    pub want: Vec<Val>,
}

pub fn make_case(k: &Kernel, n: usize, r: &mut impl Rng) -> Result<Case, String> {
    let mut input_vals = vec![Vec::with_capacity(n); k.inputs.len()];
    let mut want = Vec::with_capacity(n);
    for _ in 0..n {
        let xs = k.draw_inputs(r);
        want.push(k.eval(&xs)?);
        for (col, x) in input_vals.iter_mut().zip(xs) {
            col.push(x);
        }
    }
    let inputs = input_vals
        .iter()
        .zip(&k.inputs)
        .map(|(v, t)| to_bytes(v, *t))
        .collect();
    Ok(Case {
        n,
        inputs,
        input_vals,
        want,
    })
}

/// Elements past `n` in the output buffer, which must stay poisoned.
pub const TAIL: usize = 37;

/// Compares the output buffer with the case; a description of the first
/// few mismatches, or None.
pub fn compare(k: &Kernel, variant: &str, case: &Case, out: &[u8]) -> Option<String> {
    let ty = k.output;
    let tol: Tol = k.tol(variant);
    let mut bad = 0usize;
    let mut first = String::new();
    for i in 0..case.n {
        let got = element_bits(out, ty, i);
        if !matches(tol, got, case.want[i], ty) {
            bad += 1;
            if bad <= 2 {
                let ins: Vec<String> = case
                    .input_vals
                    .iter()
                    .zip(&k.inputs)
                    .map(|(col, t)| show(encode(col[i], *t), *t))
                    .collect();
                let _ = write!(
                    first,
                    " [{i}] in=({}) got {} want {};",
                    ins.join(", "),
                    show(got, ty),
                    show(encode(case.want[i], ty), ty)
                );
            }
        }
    }
    let tail_ok =
        (case.n..case.n + TAIL).all(|i| element_bits(out, ty, i) == poison(ty) & ty.mask());
    match (bad, tail_ok) {
        (0, true) => None,
        (0, false) => Some("wrote past n".into()),
        _ => Some(format!(
            "{bad}/{} outside {tol:?}{}:{first}",
            case.n,
            if tail_ok { "" } else { ", wrote past n" }
        )),
    }
}

pub fn poisoned(ty: Ty, len: usize) -> Vec<u8> {
    let p = poison(ty).to_le_bytes();
    (0..len).flat_map(|_| p[..ty.size()].to_vec()).collect()
}
