//! The launch contract: what the verifier proved about a kernel, as data the
//! launch check evaluates before every launch.
//!
//! A contract names, in the kernel's param order, what each param is (a
//! pointer read, written or never dereferenced; the element count; a
//! scalar of a PTX type), the launch geometry (block size, elements per
//! block, grid), for each launch operand the bytes it may touch as a
//! closed-form [`Expr`] of launch values, and the [`Precondition`]s the
//! proof assumed, each with a stable name.
//!
//! Invariants:
//! - A contract comes only from the verifier ([`LaunchContract::scalar`]
//!   over a verified signature, with the preconditions the proof needed);
//!   nothing here widens one to make a launch fit.
//! - Every footprint and precondition is evaluated with checked arithmetic
//!   in `u128`: an overflow is a refusal, never a wrapped bound.
//! - The scalar ABI's contract is exactly the check ptxd always made:
//!   operand k touches `n × element_size(k)` bytes from its offset, its
//!   offset is a multiple of its element size, `n < 2^63`, and the grid is
//!   `ceil(n / block)`.

use std::fmt;

use super::{Signature, DEFAULT_BLOCK};

/// A closed-form expression of launch values, in bytes or elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    Const(u64),
    /// The launch's element count `n`.
    Count,
    /// The number of blocks the launch runs (`ceil(n / elements per block)`).
    Grid,
    /// The block size the launch runs with.
    Block,
    Add(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    /// The expression rounded up to a multiple of `k` (`k >= 1`; `k = 0`
    /// evaluates to `None`): a vector access masked on its first lane
    /// touches up to the end of its vector.
    RoundUp(Box<Expr>, u64),
    /// The `k`-th by-value scalar argument of the launch (in the order of
    /// the contract's `Scalar` params), its bits read as the kernel's
    /// signed 64-bit value: a negative value (or no such argument) has no
    /// value here, so a footprint or precondition reading it refuses.
    Arg(u16),
    /// `a / b` rounded down; `b = 0` has no value.
    Div(Box<Expr>, Box<Expr>),
    /// `max(a - b, 0)`.
    SatSub(Box<Expr>, Box<Expr>),
    Min(Box<Expr>, Box<Expr>),
}

/// The launch values an [`Expr`] is evaluated over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchValues {
    pub count: u64,
    pub grid: u64,
    pub block: u32,
}

impl Expr {
    pub fn product(a: Expr, b: Expr) -> Expr {
        Expr::Mul(Box::new(a), Box::new(b))
    }

    pub fn sum(a: Expr, b: Expr) -> Expr {
        Expr::Add(Box::new(a), Box::new(b))
    }

    /// The value at `v`, or `None` when a step overflows `u128` (an
    /// [`Expr::Arg`] has no value here: see [`Expr::eval_with`]).
    pub fn eval(&self, v: &LaunchValues) -> Option<u128> {
        self.eval_with(v, &[])
    }

    /// The value at `v` with the launch's scalar arguments `args` (each
    /// as its bits zero-extended to 64, in the order of the contract's
    /// `Scalar` params), or `None` when a step overflows `u128`, divides
    /// by zero or reads an argument that is negative or missing.
    pub fn eval_with(&self, v: &LaunchValues, args: &[u64]) -> Option<u128> {
        // Leaves are read in place: a footprint such as `n × 4` is one
        // call, not three (the launch check runs this per operand).
        let operand = |e: &Expr| e.leaf(v).or_else(|| e.eval_with(v, args));
        match self {
            Expr::Add(a, b) => operand(a)?.checked_add(operand(b)?),
            Expr::Mul(a, b) => {
                let (x, y) = (operand(a)?, operand(b)?);
                // Two values of 64 bits cannot overflow 128: the common case
                // skips the checked 128-bit product.
                match (u64::try_from(x), u64::try_from(y)) {
                    (Ok(x), Ok(y)) => Some(u128::from(x) * u128::from(y)),
                    _ => x.checked_mul(y),
                }
            }
            Expr::RoundUp(e, k) => {
                let (x, k) = (operand(e)?, u128::from(*k));
                x.checked_next_multiple_of(k)
            }
            Expr::Arg(k) => {
                let bits = *args.get(usize::from(*k))?;
                // The kernel's arithmetic reads it as a signed 64-bit value.
                (bits <= i64::MAX as u64).then_some(u128::from(bits))
            }
            Expr::Div(a, b) => operand(a)?.checked_div(operand(b)?),
            Expr::SatSub(a, b) => Some(operand(a)?.saturating_sub(operand(b)?)),
            Expr::Min(a, b) => Some(operand(a)?.min(operand(b)?)),
            leaf => leaf.leaf(v),
        }
    }

    /// A leaf's value; `None` for an operation.
    #[inline]
    fn leaf(&self, v: &LaunchValues) -> Option<u128> {
        match self {
            Expr::Const(c) => Some(u128::from(*c)),
            Expr::Count => Some(u128::from(v.count)),
            Expr::Grid => Some(u128::from(v.grid)),
            Expr::Block => Some(u128::from(v.block)),
            Expr::Add(..)
            | Expr::Mul(..)
            | Expr::RoundUp(..)
            | Expr::Arg(_)
            | Expr::Div(..)
            | Expr::SatSub(..)
            | Expr::Min(..) => None,
        }
    }

    /// The expression as text, each argument by its param's name.
    pub fn named<'a>(&'a self, names: &'a [&'a str]) -> Named<'a> {
        Named { expr: self, names }
    }

    fn show(&self, f: &mut fmt::Formatter<'_>, names: &[&str]) -> fmt::Result {
        fn named<'a>(expr: &'a Expr, names: &'a [&'a str]) -> Named<'a> {
            Named { expr, names }
        }
        let named = |e| named(e, names);
        match self {
            Expr::Const(c) if *c >= 1 << 20 && c.is_power_of_two() => {
                write!(f, "2^{}", c.trailing_zeros())
            }
            Expr::Const(c) => write!(f, "{c}"),
            Expr::Count => f.write_str("n"),
            Expr::Grid => f.write_str("grid"),
            Expr::Block => f.write_str("block"),
            Expr::Add(a, b) => write!(f, "({} + {})", named(a), named(b)),
            Expr::Mul(a, b) => write!(f, "{} × {}", named(a), named(b)),
            Expr::RoundUp(e, k) => write!(f, "roundup({}, {k})", named(e)),
            Expr::Arg(k) => match names.get(usize::from(*k)) {
                Some(name) => f.write_str(name),
                None => write!(f, "arg{k}"),
            },
            Expr::Div(a, b) => write!(f, "({} / {})", named(a), named(b)),
            Expr::SatSub(a, b) => write!(f, "({} - {})", named(a), named(b)),
            Expr::Min(a, b) => write!(f, "min({}, {})", named(a), named(b)),
        }
    }
}

/// An [`Expr`] shown with its arguments' names ([`Expr::named`]).
#[derive(Debug)]
pub struct Named<'a> {
    expr: &'a Expr,
    names: &'a [&'a str],
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.expr.show(f, self.names)
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.show(f, &[])
    }
}

/// What the kernel may do through a pointer param.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PointerAccess {
    /// Loads only: a launch input.
    Read,
    /// Stores only: the launch output.
    Written,
    /// Never dereferenced: ptxd passes null.
    UnusedNull,
}

/// A param's PTX type, for the scalars and the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarType {
    U32,
    S32,
    U64,
    S64,
    F32,
    F64,
}

impl ScalarType {
    /// The type of a param declared `.{ptx}`, if it is one a contract names.
    pub fn from_ptx(ptx: &str) -> Option<ScalarType> {
        Some(match ptx {
            "u32" | "b32" => ScalarType::U32,
            "s32" => ScalarType::S32,
            "u64" | "b64" => ScalarType::U64,
            "s64" => ScalarType::S64,
            "f32" => ScalarType::F32,
            "f64" => ScalarType::F64,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ScalarType::U32 => "u32",
            ScalarType::S32 => "s32",
            ScalarType::U64 => "u64",
            ScalarType::S64 => "s64",
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
        }
    }
}

/// What one param of the kernel is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A pointer. `operand` is its place in the launch's operand list
    /// (inputs in order, then the output); `None` for a null-only pointer.
    Pointer {
        access: PointerAccess,
        operand: Option<u32>,
    },
    /// The element count `n`.
    Count(ScalarType),
    /// A by-value scalar argument.
    Scalar(ScalarType),
}

/// One param: its PTX name and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContractParam {
    pub name: String,
    pub kind: ParamKind,
}

/// Where the block size comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockRule {
    /// `.reqntid x`: exactly x, or the launch fails.
    Required(u32),
    /// `.maxntid x`: `min(x, DEFAULT_BLOCK)` on the host; the executor may
    /// choose less on a GPU.
    AtMost(u32),
    /// Neither: ptxd's [`DEFAULT_BLOCK`] (or less, as the executor chooses).
    Default,
}

impl BlockRule {
    /// The block size the host engine launches with.
    pub fn host_block(self) -> u32 {
        match self {
            BlockRule::Required(x) => x,
            BlockRule::AtMost(x) => x.min(DEFAULT_BLOCK),
            BlockRule::Default => DEFAULT_BLOCK,
        }
    }
}

/// The launch geometry: block size, and how many elements each thread
/// covers, so `grid = ceil(n / (block × elements_per_thread))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub block: BlockRule,
    pub elements_per_thread: u32,
}

/// One launch operand's bytes: an alignment its offset must honour and
/// the bytes it may touch from its offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Footprint {
    /// The contract param the operand is passed as.
    pub param: u16,
    /// The element size, which the operand's offset must be a multiple of.
    pub alignment: u32,
    pub bytes: Expr,
}

/// A fact about launch values the proof assumed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Condition {
    /// `expr <= bound`.
    AtMost(Expr, u128),
    /// `expr >= bound` (an expression without a value, e.g. a negative
    /// argument, is not).
    AtLeast(Expr, u128),
}

/// A named precondition: a launch where it is false is refused, naming it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Precondition {
    /// Stable, snake_case: what a refusal's metadata names.
    pub name: &'static str,
    pub condition: Condition,
}

/// The count must fit the kernel's `long long` (today's `CountTooLarge`).
pub const COUNT_FITS_I64: &str = "count_fits_i64";
/// A 32-bit count (`int n`) holds the launch's count: `n <= 2^31 - 1`.
pub const COUNT_FITS_I32: &str = "count_fits_i32";
/// Every thread's 32-bit index is exact: `grid × block <= 2^31`.
pub const INDEX_FITS_I32: &str = "index_fits_i32";
/// The Strided family: a divisor argument `d` of `i / d`, `i % d` is at
/// least 1.
pub const DIVISOR_POSITIVE: &str = "divisor_positive";
/// The Strided family: an argument that scales an index (a stride, a
/// shape) is not negative.
pub const ARG_NONNEGATIVE: &str = "arg_nonnegative";
/// The Strided family: the largest byte offset any thread computes fits
/// the kernel's signed 64-bit arithmetic, so no product or sum wraps.
pub const STRIDED_INDEX_FITS_I64: &str = "strided_index_fits_i64";

/// Every precondition name the verifier emits. [`Precondition::name`] is a
/// `&'static str`, so a contract decoded from elsewhere (a kept verdict, a
/// ring grant) takes its names from this list; a name the verifier
/// emits that is missing here makes such a decode lose it
/// (`every_name_the_verifier_emits_is_listed` finds one).
pub const PRECONDITION_NAMES: &[&str] = &[
    COUNT_FITS_I64,
    COUNT_FITS_I32,
    INDEX_FITS_I32,
    DIVISOR_POSITIVE,
    ARG_NONNEGATIVE,
    STRIDED_INDEX_FITS_I64,
];

impl Precondition {
    /// Whether it holds at `v`; an overflow is "does not hold".
    pub fn holds(&self, v: &LaunchValues) -> bool {
        self.holds_with(v, &[])
    }

    /// Whether it holds at `v` with the launch's scalar `args` (bits, in
    /// the contract's `Scalar` order); an overflow is "does not hold".
    pub fn holds_with(&self, v: &LaunchValues, args: &[u64]) -> bool {
        match &self.condition {
            Condition::AtMost(e, bound) => e.eval_with(v, args).is_some_and(|x| x <= *bound),
            Condition::AtLeast(e, bound) => e.eval_with(v, args).is_some_and(|x| x >= *bound),
        }
    }

    fn expr(&self) -> &Expr {
        match &self.condition {
            Condition::AtMost(e, _) | Condition::AtLeast(e, _) => e,
        }
    }

    /// `name=value` for every launch value the condition reads, for a
    /// refusal's metadata.
    pub fn values(&self, v: &LaunchValues) -> String {
        self.values_with(v, &[], &[])
    }

    /// [`Self::values`], each argument by its name in `names` (as the
    /// kernel reads it, signed) from `args`.
    pub fn values_with(&self, v: &LaunchValues, args: &[u64], names: &[&str]) -> String {
        let mut out = Vec::new();
        self.expr().visit(&mut |e| match e {
            Expr::Count => out.push(format!("n={}", v.count)),
            Expr::Grid => out.push(format!("grid={}", v.grid)),
            Expr::Block => out.push(format!("block={}", v.block)),
            Expr::Arg(k) => {
                let k = usize::from(*k);
                let name = names
                    .get(k)
                    .map_or_else(|| format!("arg{k}"), |n| n.to_string());
                match args.get(k) {
                    Some(bits) => out.push(format!("{name}={}", *bits as i64)),
                    None => out.push(format!("{name}=missing")),
                }
            }
            _ => {}
        });
        out.dedup();
        out.join(",")
    }

    /// The condition as text, each argument by its name in `names`.
    pub fn text(&self, names: &[&str]) -> String {
        let (e, op, bound) = match &self.condition {
            Condition::AtMost(e, b) => (e, "<=", b),
            Condition::AtLeast(e, b) => (e, ">=", b),
        };
        let bound = match u64::try_from(*bound) {
            Ok(b) => Expr::Const(b).to_string(),
            Err(_) => bound.to_string(),
        };
        format!("{}: {} {op} {bound}", self.name, e.named(names))
    }
}

impl Expr {
    fn visit(&self, f: &mut impl FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Add(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::SatSub(a, b)
            | Expr::Min(a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::RoundUp(e, _) => e.visit(f),
            Expr::Const(_) | Expr::Count | Expr::Grid | Expr::Block | Expr::Arg(_) => {}
        }
    }
}

impl fmt::Display for Precondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text(&[]))
    }
}

impl Expr {
    /// Whether the expression reads a scalar argument (then it needs the
    /// launch's args: [`Expr::eval_with`]).
    pub fn reads_args(&self) -> bool {
        let mut reads = false;
        self.visit(&mut |e| reads |= matches!(e, Expr::Arg(_)));
        reads
    }
}

/// What the verifier proved about a kernel, as the launch check reads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaunchContract {
    /// Every param, in the kernel's order.
    pub params: Vec<ContractParam>,
    pub geometry: Geometry,
    /// One per launch operand: the inputs in order, then the output.
    pub footprints: Vec<Footprint>,
    pub preconditions: Vec<Precondition>,
}

impl LaunchContract {
    /// The scalar ABI's contract for a verified `signature` with params
    /// named `names` (`inputs + 2 + scalar_params` of them; missing names
    /// are made up): exactly the check ptxd made before contracts existed.
    pub fn scalar(signature: &Signature, names: &[&str]) -> LaunchContract {
        let name = |i: usize, fallback: String| names.get(i).map_or(fallback, |n| (*n).to_string());
        let inputs = signature.inputs as usize;
        let mut params = Vec::with_capacity(inputs + 2 + signature.scalar_params as usize);
        for k in 0..inputs {
            params.push(ContractParam {
                name: name(k, format!("in{k}")),
                kind: ParamKind::Pointer {
                    access: PointerAccess::Read,
                    operand: Some(k as u32),
                },
            });
        }
        params.push(ContractParam {
            name: name(inputs, "out".into()),
            kind: ParamKind::Pointer {
                access: PointerAccess::Written,
                operand: Some(signature.inputs),
            },
        });
        params.push(ContractParam {
            name: name(inputs + 1, "n".into()),
            kind: ParamKind::Count(ScalarType::S64),
        });
        for k in 0..signature.scalar_params as usize {
            params.push(ContractParam {
                name: name(inputs + 2 + k, format!("p{k}")),
                kind: ParamKind::Scalar(ScalarType::F32),
            });
        }
        let footprints = signature
            .element_sizes
            .iter()
            .enumerate()
            .map(|(k, &size)| Footprint {
                param: u16::try_from(k).unwrap_or(u16::MAX),
                alignment: size,
                bytes: Expr::product(Expr::Count, Expr::Const(u64::from(size))),
            })
            .collect();
        let block = match (signature.reqntid, signature.maxntid) {
            (Some(x), _) => BlockRule::Required(x),
            (None, Some(x)) => BlockRule::AtMost(x),
            (None, None) => BlockRule::Default,
        };
        LaunchContract {
            params,
            geometry: Geometry {
                block,
                elements_per_thread: 1,
            },
            footprints,
            preconditions: vec![Precondition {
                name: COUNT_FITS_I64,
                condition: Condition::AtMost(Expr::Count, i64::MAX as u128),
            }],
        }
    }

    /// The same contract with one more precondition (the verifier adds
    /// what its proof assumed).
    pub fn assuming(mut self, precondition: Precondition) -> LaunchContract {
        if !self
            .preconditions
            .iter()
            .any(|p| p.name == precondition.name)
        {
            self.preconditions.push(precondition);
        }
        self
    }

    /// Whether `other` is the same contract but for the params' names
    /// (the canonical text renames every param).
    pub fn same_terms(&self, other: &LaunchContract) -> bool {
        self.geometry == other.geometry
            && self.footprints == other.footprints
            && self.preconditions == other.preconditions
            && self.params.len() == other.params.len()
            && self
                .params
                .iter()
                .zip(&other.params)
                .all(|(a, b)| a.kind == b.kind)
    }

    /// Whether a check against `signature` alone (the [`Signature`] terms
    /// the launch ring evaluates, which carry no preconditions beyond the
    /// count's) checks exactly this contract. A kernel for which it does
    /// not (a 32-bit index's `index_fits_i32`) must not be launched through
    /// a path that knows only its signature.
    pub fn checked_by_signature(&self, signature: &Signature) -> bool {
        self.same_terms(&LaunchContract::scalar(signature, &[]))
    }

    /// Whether this contract is the signature's but for preconditions on
    /// the launch values: then a check against `signature` that also
    /// holds the count to [`Self::max_count`] checks exactly this contract
    /// (the ring's check, for a 32-bit index).
    pub fn checked_by_signature_and_max_count(&self, signature: &Signature) -> bool {
        let with = self
            .preconditions
            .iter()
            .fold(LaunchContract::scalar(signature, &[]), |c, p| {
                c.assuming(p.clone())
            });
        self.same_terms(&with)
    }

    /// How many launch inputs (read pointers) the contract takes.
    pub fn inputs(&self) -> usize {
        self.footprints.len().saturating_sub(1)
    }

    /// How many by-value scalar arguments the launch passes.
    pub fn scalar_params(&self) -> usize {
        self.params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Scalar(_)))
            .count()
    }

    /// The types of the by-value scalar arguments, in the launch's order
    /// (the order [`Expr::Arg`] indexes).
    pub fn scalar_types(&self) -> Vec<ScalarType> {
        self.params
            .iter()
            .filter_map(|p| match p.kind {
                ParamKind::Scalar(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    /// The launch values for `count` elements with blocks of `block`
    /// threads: the grid is `ceil(count / (block × elements per thread))`.
    pub fn values(&self, count: u64, block: u32) -> LaunchValues {
        let per_block = (u64::from(block) * u64::from(self.geometry.elements_per_thread)).max(1);
        // Blocks are nearly always a power of two: a shift, not a division,
        // on the launch path.
        let grid = if per_block.is_power_of_two() {
            (count >> per_block.trailing_zeros()) + u64::from(count & (per_block - 1) != 0)
        } else {
            count.div_ceil(per_block)
        };
        LaunchValues { count, grid, block }
    }

    /// The largest count whose launch, with blocks of `block` threads, keeps
    /// every precondition, and the precondition that fails just past it
    /// (every precondition is monotone in the count: the grid grows with
    /// it). `None` when no count breaks one. A path that checks launches
    /// against the signature only (the ring) holds them to this count.
    pub fn max_count(&self, block: u32) -> Option<(u64, &Precondition)> {
        let holds = |n: u64| {
            let v = self.values(n, block);
            self.preconditions.iter().all(|p| p.holds(&v))
        };
        if holds(u64::MAX) {
            return None;
        }
        // holds(lo) (or lo = 0 when nothing holds), !holds(hi).
        let (mut lo, mut hi) = (0u64, u64::MAX);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if holds(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let past = self.values(hi, block);
        let failing = self.preconditions.iter().find(|p| !p.holds(&past))?;
        Some((if holds(lo) { lo } else { 0 }, failing))
    }

    /// The names of the by-value scalar params, in their order (what
    /// [`Expr::Arg`] indexes).
    pub fn arg_names(&self) -> Vec<&str> {
        self.params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Scalar(_)))
            .map(|p| p.name.as_str())
            .collect()
    }

    /// Whether a footprint or precondition reads a scalar argument.
    pub fn reads_args(&self) -> bool {
        self.footprints.iter().any(|f| f.bytes.reads_args())
            || self.preconditions.iter().any(|p| p.expr().reads_args())
    }

    /// Whether every argument a footprint or precondition reads is a
    /// 64-bit integer scalar of this contract ([`Expr::Arg`] reads its bits
    /// as the kernel's signed 64-bit value: a `.f32`'s bits are no count,
    /// and a 32-bit integer's sign is not where a 64-bit read finds it).
    /// The verifier's contracts keep it; a contract decoded from elsewhere
    /// (a ring grant, a kept verdict) that does not is refused there.
    pub fn reads_only_integer_args(&self) -> bool {
        let scalars = self.scalar_types();
        let mut ok = true;
        let mut check = |e: &Expr| {
            if let Expr::Arg(k) = e {
                ok &= matches!(
                    scalars.get(usize::from(*k)),
                    Some(ScalarType::U64 | ScalarType::S64)
                );
            }
        };
        for f in &self.footprints {
            f.bytes.visit(&mut check);
        }
        for p in &self.preconditions {
            p.expr().visit(&mut check);
        }
        ok
    }

    /// The param an operand is passed as, by name.
    pub fn operand_name(&self, operand: usize) -> &str {
        self.footprints
            .get(operand)
            .and_then(|f| self.params.get(usize::from(f.param)))
            .map_or("?", |p| p.name.as_str())
    }
}

impl fmt::Display for LaunchContract {
    /// One readable text: `params; geometry; footprints; preconditions`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("params(")?;
        for (i, p) in self.params.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match &p.kind {
                ParamKind::Pointer { access, .. } => {
                    let a = match access {
                        PointerAccess::Read => "read",
                        PointerAccess::Written => "written",
                        PointerAccess::UnusedNull => "null",
                    };
                    write!(f, "{}: ptr {a}", p.name)?;
                }
                ParamKind::Count(t) => write!(f, "{}: count .{}", p.name, t.as_str())?,
                ParamKind::Scalar(t) => write!(f, "{}: .{}", p.name, t.as_str())?,
            }
        }
        let block = match self.geometry.block {
            BlockRule::Required(x) => format!("{x} (.reqntid)"),
            BlockRule::AtMost(x) => format!("<= {} (.maxntid {x})", x.min(DEFAULT_BLOCK)),
            BlockRule::Default => format!("<= {DEFAULT_BLOCK}"),
        };
        let ept = self.geometry.elements_per_thread;
        let per_block = if ept == 1 {
            "block".to_string()
        } else {
            format!("block × {ept}")
        };
        write!(f, "); block {block}; grid ceil(n / {per_block})")?;
        let args = self.arg_names();
        for fp in &self.footprints {
            let name = self
                .params
                .get(usize::from(fp.param))
                .map_or("?", |p| p.name.as_str());
            write!(
                f,
                "; {name}[{}] align {}",
                fp.bytes.named(&args),
                fp.alignment
            )?;
        }
        for p in &self.preconditions {
            write!(f, "; requires {}", p.text(&args))?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Every `Precondition { .. }` the verifier builds (outside tests)
    /// names a constant [`PRECONDITION_NAMES`] holds, so a new name (a
    /// literal, or a constant left out of the list) fails here.
    #[test]
    fn every_name_the_verifier_emits_is_listed() {
        let own = include_str!("contract.rs");
        let listed = own
            .split("pub const PRECONDITION_NAMES: &[&str] = &[")
            .nth(1)
            .and_then(|rest| rest.split("];").next())
            .unwrap();
        let listed: Vec<&str> = listed
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        assert_eq!(listed.len(), PRECONDITION_NAMES.len(), "{listed:?}");
        let distinct: std::collections::BTreeSet<&str> =
            PRECONDITION_NAMES.iter().copied().collect();
        assert_eq!(distinct.len(), PRECONDITION_NAMES.len());
        let mut built = 0;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ptx");
        for path in crate::ptx::files_under(&root, "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for after in code.split("Precondition {").skip(1) {
                // A struct literal's first field; a type's `impl` or
                // a pattern has none.
                let Some(name) = after
                    .trim_start()
                    .strip_prefix("name:")
                    .and_then(|n| n.split(',').next())
                    .map(str::trim)
                else {
                    continue;
                };
                assert!(
                    listed.contains(&name),
                    "{}: a precondition named `{name}` is not in PRECONDITION_NAMES",
                    path.display()
                );
                built += 1;
            }
        }
        // The decision, Triton and Strided families' and the scalar contract's.
        assert!(built >= 9, "only {built} preconditions found");
    }

    fn sig(element_sizes: Vec<u32>, scalar_params: u32, reqntid: Option<u32>) -> Signature {
        Signature {
            inputs: element_sizes.len() as u32 - 1,
            element_sizes,
            scalar_params,
            reqntid,
            maxntid: None,
        }
    }

    #[test]
    fn the_scalar_contract_is_todays_check() {
        let c = LaunchContract::scalar(&sig(vec![4, 2, 8], 1, None), &[]);
        assert_eq!(c.inputs(), 2);
        assert_eq!(c.scalar_params(), 1);
        let v = c.values(1000, 256);
        assert_eq!(v.grid, 4);
        let bytes: Vec<u128> = c
            .footprints
            .iter()
            .map(|f| f.bytes.eval(&v).unwrap())
            .collect();
        assert_eq!(bytes, vec![4000, 2000, 8000]);
        let aligns: Vec<u32> = c.footprints.iter().map(|f| f.alignment).collect();
        assert_eq!(aligns, vec![4, 2, 8]);
        assert_eq!(c.preconditions.len(), 1);
        assert!(c.preconditions[0].holds(&c.values(i64::MAX as u64, 256)));
        assert!(!c.preconditions[0].holds(&c.values(i64::MAX as u64 + 1, 256)));
    }

    /// The largest count a launch may have is the last one every
    /// precondition holds at, for each block; the one that fails past it
    /// is named.
    #[test]
    fn the_largest_count_is_where_the_first_precondition_breaks() {
        let scalar = LaunchContract::scalar(&sig(vec![4, 4], 0, None), &[]);
        let (max, p) = scalar.max_count(256).unwrap();
        assert_eq!((max, p.name), (i64::MAX as u64, COUNT_FITS_I64));
        let index32 = scalar.clone().assuming(Precondition {
            name: INDEX_FITS_I32,
            condition: Condition::AtMost(Expr::product(Expr::Grid, Expr::Block), 1 << 31),
        });
        for block in [1u32, 96, 128, 256, 1000, 1024] {
            let (max, p) = index32.max_count(block).unwrap();
            assert_eq!(p.name, INDEX_FITS_I32, "{block}");
            let fits = |n: u64| {
                index32
                    .preconditions
                    .iter()
                    .all(|p| p.holds(&index32.values(n, block)))
            };
            assert!(fits(max) && !fits(max + 1), "{block}: {max}");
            assert_eq!(
                max,
                (1u64 << 31) / u64::from(block) * u64::from(block),
                "{block}"
            );
        }
        let int_n = index32.clone().assuming(Precondition {
            name: COUNT_FITS_I32,
            condition: Condition::AtMost(Expr::Count, (1 << 31) - 1),
        });
        let (max, p) = int_n.max_count(256).unwrap();
        assert_eq!((max, p.name), ((1 << 31) - 1, COUNT_FITS_I32));
    }

    /// The grid is `ceil(n / (block × elements per thread))` for every
    /// block, a power of two or not.
    #[test]
    fn the_grid_is_the_ceiling_of_n_over_a_block() {
        let mut c = LaunchContract::scalar(&sig(vec![4, 4], 0, None), &[]);
        for ept in [1, 2, 3, 8] {
            c.geometry.elements_per_thread = ept;
            for block in [1, 3, 32, 96, 256, 1000, 1024] {
                for n in [0u64, 1, 255, 256, 257, 1 << 40, u64::MAX - 1, u64::MAX] {
                    let per = u64::from(block) * u64::from(ept);
                    assert_eq!(
                        c.values(n, block).grid,
                        n.div_ceil(per),
                        "{n} {block} {ept}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_text_form_names_every_part() {
        let c = LaunchContract::scalar(&sig(vec![4, 4], 1, Some(128)), &["a", "b", "n", "s"]);
        let c = c.assuming(Precondition {
            name: INDEX_FITS_I32,
            condition: Condition::AtMost(Expr::product(Expr::Grid, Expr::Block), 1 << 31),
        });
        assert_eq!(
            c.to_string(),
            "params(a: ptr read, b: ptr written, n: count .s64, s: .f32); \
             block 128 (.reqntid); grid ceil(n / block); a[n × 4] align 4; b[n × 4] align 4; \
             requires count_fits_i64: n <= 9223372036854775807; \
             requires index_fits_i32: grid × block <= 2^31"
        );
        assert_eq!(c.operand_name(1), "b");
    }

    /// `roundup(n, k) × s` is the next multiple of k, times s, for every
    /// n; past `u128` it is `None`, and `k = 0` has no value.
    #[test]
    fn a_rounded_footprint_is_the_next_multiple() {
        let e = Expr::product(Expr::RoundUp(Box::new(Expr::Count), 4), Expr::Const(4));
        for (n, want) in [(0u64, 0u128), (1, 16), (4, 16), (5, 32), (1023, 4096)] {
            let v = LaunchValues {
                count: n,
                grid: 1,
                block: 1,
            };
            assert_eq!(e.eval(&v), Some(want), "{n}");
        }
        let v = LaunchValues {
            count: u64::MAX,
            grid: 1,
            block: 1,
        };
        assert_eq!(e.eval(&v), Some((u128::from(u64::MAX) + 1) * 4));
        let huge = Expr::RoundUp(
            Box::new(Expr::product(
                Expr::product(Expr::Count, Expr::Count),
                Expr::Const(u64::MAX),
            )),
            3,
        );
        assert_eq!(huge.eval(&v), None);
        assert_eq!(Expr::RoundUp(Box::new(Expr::Count), 0).eval(&v), None);
        assert_eq!(e.to_string(), "roundup(n, 4) × 4");
    }

    /// The Strided family's terms: an arg is its signed value (none when
    /// negative or missing), division by zero and overflow have no value,
    /// `SatSub` stops at 0; `AtLeast` is false without a value; the text
    /// and the refusal's values name the args.
    #[test]
    fn args_division_and_saturation_evaluate_exactly() {
        let v = LaunchValues {
            count: 10,
            grid: 1,
            block: 1,
        };
        let last = Expr::SatSub(Box::new(Expr::Count), Box::new(Expr::Const(1)));
        let q = Expr::Div(Box::new(last.clone()), Box::new(Expr::Arg(1)));
        assert_eq!(q.eval_with(&v, &[7, 4]), Some(2));
        assert_eq!(q.eval_with(&v, &[7, 0]), None);
        assert_eq!(q.eval_with(&v, &[7, (-4i64) as u64]), None);
        assert_eq!(q.eval_with(&v, &[7]), None);
        assert_eq!(q.eval(&v), None);
        let zero = LaunchValues { count: 0, ..v };
        assert_eq!(last.eval(&zero), Some(0));
        let min = Expr::Min(Box::new(Expr::Arg(0)), Box::new(Expr::Count));
        assert_eq!(min.eval_with(&v, &[3]), Some(3));
        assert_eq!(min.eval_with(&v, &[30]), Some(10));
        let wide = Expr::product(Expr::Arg(0), Expr::Arg(0));
        assert_eq!(
            wide.eval_with(&v, &[i64::MAX as u64]),
            Some(u128::from(i64::MAX as u64) * u128::from(i64::MAX as u64))
        );
        let positive = Precondition {
            name: DIVISOR_POSITIVE,
            condition: Condition::AtLeast(Expr::Arg(1), 1),
        };
        assert!(positive.holds_with(&v, &[0, 1]));
        assert!(!positive.holds_with(&v, &[0, 0]));
        assert!(!positive.holds_with(&v, &[0, u64::MAX]));
        assert!(!positive.holds(&v));
        let names = ["s0", "d1"];
        assert_eq!(positive.text(&names), "divisor_positive: d1 >= 1");
        assert_eq!(positive.values_with(&v, &[0, u64::MAX], &names), "d1=-1");
        assert_eq!(q.named(&names).to_string(), "((n - 1) / d1)");
        assert_eq!(q.to_string(), "((n - 1) / arg1)");
    }

    #[test]
    fn an_overflowing_expression_is_none_and_its_precondition_false() {
        let big = Expr::product(Expr::Count, Expr::Const(u64::MAX));
        let v = LaunchValues {
            count: u64::MAX,
            grid: 1,
            block: 1,
        };
        assert!(Expr::product(big.clone(), big.clone()).eval(&v).is_none());
        let p = Precondition {
            name: "x",
            condition: Condition::AtMost(Expr::product(big.clone(), big), u128::MAX),
        };
        assert!(!p.holds(&v));
        assert_eq!(p.values(&v), format!("n={}", u64::MAX));
    }
}
