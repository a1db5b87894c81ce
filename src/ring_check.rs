//! A kernel's launch contract as a ring grant carries it: the front
//! encodes the contract it verified ([`encode`]) and the ring's executor
//! decodes it ([`decode`]) once, at grant time, and then checks every ring
//! launch of the kernel against it with the same terms as the unary path
//! ([`crate::launch::BoundContract`]).
//!
//! Invariants:
//! - `decode(encode(c))` has exactly the launch terms of `c` (params and
//!   their kinds, elements per thread, every footprint's alignment and
//!   expression, every precondition's expression, direction (`<=` or
//!   `>=`) and bound, the Strided family's terms included: the launch's
//!   typed args, division, saturating subtraction, min), so the ring
//!   checks what the front would; a precondition's name outside the ones
//!   ptxd defines is kept as `launch_precondition` (the condition itself is
//!   still evaluated: only its refusal's name is generic).
//! - Anything malformed (an expression that does not reduce to exactly one
//!   value, a step without a kind, an arg the launch does not pass or that
//!   is no 64-bit integer (a `.f32`'s bits read as a count), a param
//!   without a kind) is refused: the kernel is then not
//!   granted to the ring, never checked against less.
//! - Decoding is bounded: an expression has at most [`MAX_STEPS`] steps.

use ptxd_proto::executor as exec;

use crate::ptx::contract::{
    BlockRule, Condition, ContractParam, Expr, Footprint, Geometry, LaunchContract, ParamKind,
    PointerAccess, Precondition, PRECONDITION_NAMES,
};

/// The most steps one encoded expression may have.
pub const MAX_STEPS: usize = 256;

/// The launch path's own precondition on a `.u32` count
/// (`crate::launch`), which the verifier never emits: a decoded contract
/// keeps it as it keeps the verifier's [`PRECONDITION_NAMES`].
const COUNT_FITS_U32: &str = "count_fits_u32";

/// The name a decoded contract gives precondition `stated`: its own when
/// ptxd defines it, else `launch_precondition`.
fn known_name(stated: &str) -> &'static str {
    PRECONDITION_NAMES
        .iter()
        .chain([&COUNT_FITS_U32])
        .find(|k| **k == stated)
        .copied()
        .unwrap_or("launch_precondition")
}

/// The contract as a ring grant carries it.
pub fn encode(contract: &LaunchContract) -> exec::RingContract {
    exec::RingContract {
        params: crate::executor::layout::slots_of(contract),
        param_names: contract.params.iter().map(|p| p.name.clone()).collect(),
        elements_per_thread: contract.geometry.elements_per_thread,
        footprints: contract
            .footprints
            .iter()
            .map(|f| exec::RingFootprint {
                param: u32::from(f.param),
                alignment: f.alignment,
                bytes: steps(&f.bytes),
            })
            .collect(),
        preconditions: contract
            .preconditions
            .iter()
            .map(|p| {
                let (e, bound, at_least) = match &p.condition {
                    Condition::AtMost(e, bound) => (e, *bound, false),
                    Condition::AtLeast(e, bound) => (e, *bound, true),
                };
                exec::RingPrecondition {
                    name: p.name.to_string(),
                    expr: steps(e),
                    bound_low: bound as u64,
                    bound_high: (bound >> 64) as u64,
                    at_least,
                }
            })
            .collect(),
    }
}

fn steps(e: &Expr) -> Vec<exec::ExprStep> {
    use exec::expr_step::Step;
    let mut out = Vec::new();
    fn walk(e: &Expr, out: &mut Vec<exec::ExprStep>) {
        let step = match e {
            Expr::Const(c) => Step::Constant(*c),
            Expr::Count => Step::Count(exec::Empty {}),
            Expr::Grid => Step::Grid(exec::Empty {}),
            Expr::Block => Step::Block(exec::Empty {}),
            Expr::Arg(k) => Step::Arg(u32::from(*k)),
            Expr::Add(a, b)
            | Expr::Mul(a, b)
            | Expr::Div(a, b)
            | Expr::SatSub(a, b)
            | Expr::Min(a, b) => {
                walk(a, out);
                walk(b, out);
                match e {
                    Expr::Add(..) => Step::Add(exec::Empty {}),
                    Expr::Mul(..) => Step::Mul(exec::Empty {}),
                    Expr::Div(..) => Step::Div(exec::Empty {}),
                    Expr::SatSub(..) => Step::SatSub(exec::Empty {}),
                    _ => Step::Min(exec::Empty {}),
                }
            }
            Expr::RoundUp(a, k) => {
                walk(a, out);
                Step::RoundUp(*k)
            }
        };
        out.push(exec::ExprStep { step: Some(step) });
    }
    walk(e, &mut out);
    out
}

/// The expression `steps` spell, over a launch with `args` typed scalars.
fn expr(steps: &[exec::ExprStep], args: usize) -> Result<Expr, String> {
    use exec::expr_step::Step;
    if steps.len() > MAX_STEPS {
        return Err(format!(
            "an expression of {} steps, more than {MAX_STEPS}",
            steps.len()
        ));
    }
    let mut stack: Vec<Expr> = Vec::new();
    for step in steps {
        let value = match step
            .step
            .as_ref()
            .ok_or("an expression step without a kind")?
        {
            Step::Constant(c) => Expr::Const(*c),
            Step::Count(_) => Expr::Count,
            Step::Grid(_) => Expr::Grid,
            Step::Block(_) => Expr::Block,
            // An arg the launch does not pass is malformed, not a term
            // that refuses every launch.
            Step::Arg(k) => match u16::try_from(*k) {
                Ok(k) if usize::from(k) < args => Expr::Arg(k),
                _ => return Err(format!("an arg step naming arg {k} of {args}")),
            },
            Step::Add(_) | Step::Mul(_) | Step::Div(_) | Step::SatSub(_) | Step::Min(_) => {
                let (Some(b), Some(a)) = (stack.pop(), stack.pop()) else {
                    return Err("an operation without its two operands".into());
                };
                let (a, b) = (Box::new(a), Box::new(b));
                match step.step {
                    Some(Step::Add(_)) => Expr::Add(a, b),
                    Some(Step::Mul(_)) => Expr::Mul(a, b),
                    Some(Step::Div(_)) => Expr::Div(a, b),
                    Some(Step::SatSub(_)) => Expr::SatSub(a, b),
                    _ => Expr::Min(a, b),
                }
            }
            Step::RoundUp(k) => {
                let a = stack.pop().ok_or("a roundup without its operand")?;
                Expr::RoundUp(Box::new(a), *k)
            }
        };
        stack.push(value);
    }
    match (stack.pop(), stack.is_empty()) {
        (Some(e), true) => Ok(e),
        _ => Err("an expression that is not exactly one value".into()),
    }
}

/// The contract a grant carries, or why it cannot be checked (then the
/// kernel is not granted).
pub fn decode(wire: &exec::RingContract) -> Result<LaunchContract, String> {
    if wire.param_names.len() != wire.params.len() {
        return Err("a name per param".into());
    }
    // The layout's own checks: every operand passed once, one count at
    // most, the scalars the contract takes.
    let operands = wire.footprints.len();
    let inputs = u32::try_from(
        operands
            .checked_sub(1)
            .ok_or("a contract without an output")?,
    )
    .map_err(|_| "too many operands".to_string())?;
    let scalar_params = wire
        .params
        .iter()
        .filter(|p| matches!(p.slot, Some(exec::param_slot::Slot::Scalar(_))))
        .count();
    let load = exec::LoadModule {
        inputs,
        scalar_params: u32::try_from(scalar_params).map_err(|_| "too many scalars")?,
        params: wire.params.clone(),
        ..Default::default()
    };
    let layout = crate::executor::layout::decode(&load)?;
    use crate::executor::layout::Slot;
    let params = layout
        .iter()
        .zip(&wire.param_names)
        .map(|(slot, name)| ContractParam {
            name: name.clone(),
            kind: match *slot {
                // The access does not enter the check; operand k < inputs
                // reads, the last writes.
                Slot::Operand(k) => ParamKind::Pointer {
                    access: if k == inputs {
                        PointerAccess::Written
                    } else {
                        PointerAccess::Read
                    },
                    operand: Some(k),
                },
                Slot::Null => ParamKind::Pointer {
                    access: PointerAccess::UnusedNull,
                    operand: None,
                },
                Slot::Count(ty) => ParamKind::Count(ty),
                Slot::Scalar(ty) => ParamKind::Scalar(ty),
            },
        })
        .collect();
    let footprints = wire
        .footprints
        .iter()
        .map(|f| {
            Ok(Footprint {
                param: u16::try_from(f.param).map_err(|_| "a footprint's param past u16")?,
                alignment: f.alignment,
                bytes: expr(&f.bytes, scalar_params)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let preconditions = wire
        .preconditions
        .iter()
        .map(|p| {
            let name = known_name(&p.name);
            let (e, bound) = (
                expr(&p.expr, scalar_params)?,
                u128::from(p.bound_low) | (u128::from(p.bound_high) << 64),
            );
            Ok(Precondition {
                name,
                condition: if p.at_least {
                    Condition::AtLeast(e, bound)
                } else {
                    Condition::AtMost(e, bound)
                },
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let contract = LaunchContract {
        params,
        geometry: Geometry {
            // The block is the grant's; the rule does not enter the check.
            block: BlockRule::Default,
            elements_per_thread: wire.elements_per_thread.max(1),
        },
        footprints,
        preconditions,
    };
    if !contract.reads_only_integer_args() {
        return Err("an arg step naming a scalar that is no 64-bit integer".into());
    }
    Ok(contract)
}

/// Whether a ring can check launches of a kernel with this contract (then
/// the front grants it to its session's ring; see `front::ring`).
pub fn launchable(contract: &LaunchContract) -> bool {
    decode(&encode(contract)).is_ok()
}

/// How a ring checks launches of a kernel with `contract` (verified with
/// `signature`) at `block`: the grant's `max_count`, `limit_*`, `contract`
/// and `block` fields, or `None` when a ring cannot check it.
///
/// A contract the signature checks exactly is checked against the
/// signature (the cheapest check on the drain); a contract that is the
/// signature's but for preconditions on the count is held to the largest
/// count that keeps them, at the block the executor launches with, and
/// travels too, so a launch past the limit is refused with the unary
/// path's words; any other contract (the Triton and Strided families)
/// travels whole, and the ring checks every launch against it, bound to
/// that block, as the unary path does.
pub fn grant_terms(
    contract: &LaunchContract,
    signature: &crate::ptx::Signature,
    block: u32,
) -> Option<exec::RingKernel> {
    // A contract the ring decodes travels whole and is checked in the
    // unary path's order (arity and scalars before preconditions); the
    // count limit is only for one it cannot decode.
    let limit = if contract.checked_by_signature(signature) || launchable(contract) {
        None
    } else if contract.checked_by_signature_and_max_count(signature) {
        contract.max_count(block)
    } else {
        None
    };
    let contract = if contract.checked_by_signature(signature) {
        None
    } else if launchable(contract) {
        Some(encode(contract))
    } else if limit.is_some() {
        None
    } else {
        return None;
    };
    Some(exec::RingKernel {
        max_count: limit.map(|(max, _)| max),
        limit_precondition: limit.map(|(_, p)| p.name.to_string()).unwrap_or_default(),
        limit_condition: limit.map(|(_, p)| p.to_string()).unwrap_or_default(),
        contract,
        block,
        ..Default::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::launch::{BoundContract, LaunchTerms, ScalarArg};
    use crate::ptx::contract::INDEX_FITS_I32;
    use rand::Rng;

    /// A decoded precondition keeps every name ptxd defines (the
    /// verifier's list and the launch path's `count_fits_u32`, which
    /// `crate::launch` states for a `.u32` count) and is called
    /// `launch_precondition` otherwise.
    #[test]
    fn a_decoded_precondition_keeps_the_names_ptxd_defines() {
        for name in PRECONDITION_NAMES {
            assert_eq!(known_name(name), *name);
        }
        assert_eq!(known_name("count_fits_u32"), "count_fits_u32");
        for other in ["", "count_fits_u16", "COUNT_FITS_I32", "count_fits_i32 "] {
            assert_eq!(known_name(other), "launch_precondition", "{other:?}");
        }
    }

    fn triton() -> LaunchContract {
        let mut c = crate::executor::layout::tests_support::triton_like();
        c.geometry.elements_per_thread = 4;
        c.footprints[0].bytes =
            Expr::product(Expr::RoundUp(Box::new(Expr::Count), 4), Expr::Const(4));
        c.assuming(Precondition {
            name: INDEX_FITS_I32,
            condition: Condition::AtMost(Expr::product(Expr::Grid, Expr::Block), 1 << 31),
        })
    }

    #[test]
    fn a_contract_round_trips_with_its_terms() {
        let c = triton();
        let back = decode(&encode(&c)).unwrap();
        // Every param's name and kind; a pointer's access does not enter
        // the check.
        let strip = |c: &LaunchContract| -> Vec<(String, ParamKind)> {
            c.params
                .iter()
                .map(|p| {
                    let kind = match p.kind.clone() {
                        ParamKind::Pointer { operand, .. } => ParamKind::Pointer {
                            access: PointerAccess::Read,
                            operand,
                        },
                        k => k,
                    };
                    (p.name.clone(), kind)
                })
                .collect()
        };
        assert_eq!(strip(&back), strip(&c));
        assert_eq!(back.footprints, c.footprints);
        assert_eq!(back.preconditions, c.preconditions);
        assert_eq!(back.geometry.elements_per_thread, 4);
        // The same values and footprints at random counts.
        let mut rng = rand::rng();
        for _ in 0..1000 {
            let shift = rng.random_range(0..64);
            let n = rng.random_range(0..=u64::MAX >> shift);
            let (a, b) = (
                BoundContract {
                    contract: &c,
                    block: 128,
                },
                BoundContract {
                    contract: &back,
                    block: 128,
                },
            );
            let (va, vb) = (a.values(n, &[]), b.values(n, &[]));
            assert_eq!(va, vb);
            if let Ok(v) = va {
                for k in 0..c.footprints.len() {
                    assert_eq!(a.footprint(k, &v, &[]), b.footprint(k, &v, &[]));
                }
            }
        }
    }

    /// The 9 Strided kernels of the NVRTC corpus (3 kernels × -O3, -G,
    /// fast math), as the verifier proves them.
    pub(crate) fn strided_corpus() -> Vec<(String, LaunchContract)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit/nvrtc");
        let mut out = Vec::new();
        for entry in [
            "add_f32_strided",
            "bias_add_f32_strided",
            "transpose_copy_f32_strided",
        ] {
            for build in ["O3", "G", "fast"] {
                let file = format!("{entry}_{build}.ptx");
                let text = std::fs::read_to_string(dir.join(&file)).unwrap();
                let canonical = crate::ptx::canonicalize(&text, entry, None).unwrap();
                out.push((file, canonical.contract));
            }
        }
        out
    }

    /// A random typed arg's bits: 0, 1, small, negative, or huge (past
    /// any buffer, or past i64 in a product).
    pub(crate) fn strided_arg(rng: &mut impl rand::Rng) -> u64 {
        match rng.random_range(0..8) {
            0 => 0,
            1 => 1,
            2 => rng.random_range(0..=u64::MAX),
            3 => (-rng.random_range(1i64..1000)) as u64,
            4 => 1 << rng.random_range(31..63),
            _ => rng.random_range(1..200),
        }
    }

    /// Every corpus Strided contract comes back from the wire with its
    /// launch terms: the same params, footprints (args, division,
    /// saturating subtraction and min included) and preconditions (`>=`
    /// ones included, by their names), and at random counts and args the
    /// same values, refusals and footprints as the verifier's contract.
    #[test]
    fn every_strided_contract_round_trips_with_its_terms() {
        let mut rng = rand::rng();
        let corpus = strided_corpus();
        assert_eq!(corpus.len(), 9);
        for (file, c) in &corpus {
            assert!(c.reads_args(), "{file}: {c}");
            assert!(launchable(c), "{file}: {c}");
            let back = decode(&encode(c)).unwrap();
            assert_eq!(back.footprints, c.footprints, "{file}");
            assert_eq!(back.preconditions, c.preconditions, "{file}");
            assert!(
                c.preconditions
                    .iter()
                    .any(|p| matches!(p.condition, Condition::AtLeast(..))),
                "{file}: {c}"
            );
            assert_eq!(back.arg_names(), c.arg_names(), "{file}");
            assert_eq!(
                back.geometry.elements_per_thread, c.geometry.elements_per_thread,
                "{file}"
            );
            let scalars = c.scalar_params();
            let block = c.geometry.block.host_block();
            for _ in 0..2000 {
                let n = match rng.random_range(0..3) {
                    0 => rng.random_range(0..4096),
                    1 => rng.random_range(0..=u64::MAX),
                    _ => 1 << rng.random_range(0..64),
                };
                let args: Vec<u64> = (0..scalars).map(|_| strided_arg(&mut rng)).collect();
                let (a, b) = (
                    BoundContract { contract: c, block },
                    BoundContract {
                        contract: &back,
                        block,
                    },
                );
                let (va, vb) = (a.values(n, &args), b.values(n, &args));
                assert_eq!(va, vb, "{file}: n {n}, args {args:?}");
                if let Ok(v) = va {
                    for k in 0..c.footprints.len() {
                        assert_eq!(a.footprint(k, &v, &args), b.footprint(k, &v, &args));
                    }
                }
            }
        }
    }

    /// Every kernel of `tests/corpus` (every entry of every file) the
    /// verifier accepts: (where, contract, signature).
    pub(crate) fn accepted_corpus() -> Vec<(String, LaunchContract, crate::ptx::Signature)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
        let mut out = Vec::new();
        for path in crate::ptx::files_under(&root, "ptx") {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let entries: Vec<String> = text
                .lines()
                .filter_map(|l| l.split(".entry ").nth(1))
                .filter_map(|rest| rest.split(['(', ' ']).next())
                .map(str::to_owned)
                .collect();
            for symbol in entries {
                if let Ok(c) = crate::ptx::canonicalize(&text, &symbol, None) {
                    let name = path.file_name().unwrap().to_string_lossy();
                    out.push((format!("{name}:{symbol}"), c.contract, c.signature));
                }
            }
        }
        out
    }

    /// A hostile typed arg for a param of type `ty`: mostly of its own
    /// type (so the contract's terms are reached) with boundary bits (0,
    /// 1, -1, 2^31, 2^32, 2^63, u64::MAX, NaN and infinity bits), now and
    /// then of another type.
    fn hostile_arg(rng: &mut impl rand::Rng, ty: crate::ptx::contract::ScalarType) -> ScalarArg {
        use crate::ptx::contract::ScalarType as T;
        let ty = if rng.random_range(0..12) == 0 {
            [T::U32, T::S32, T::U64, T::S64, T::F32, T::F64][rng.random_range(0..6)]
        } else {
            ty
        };
        let bits: u64 = match rng.random_range(0..10) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => 1 << rng.random_range(0..64),
            4 => (1 << rng.random_range(0..64)) - 1,
            5 => (-rng.random_range(1i64..1000)) as u64,
            6 => rng.random_range(0..=u64::MAX),
            _ => rng.random_range(0..300),
        };
        match ty {
            T::U32 => ScalarArg::U32(bits as u32),
            T::S32 => ScalarArg::I32(bits as i32),
            T::U64 => ScalarArg::U64(bits),
            T::S64 => ScalarArg::I64(bits as i64),
            T::F32 => ScalarArg::F32(f32::from_bits(bits as u32)),
            T::F64 => ScalarArg::F64(f64::from_bits(bits)),
        }
    }

    /// A hostile count: the boundaries of every precondition the families
    /// carry (2^31, 2^32, 2^63, u64::MAX and their neighbours), 0, small
    /// and random ones.
    fn hostile_count(rng: &mut impl rand::Rng) -> u64 {
        let edge = [
            0u64,
            1,
            (1 << 31) - 1,
            1 << 31,
            (1 << 31) + 1,
            u64::from(u32::MAX),
            1 << 32,
            i64::MAX as u64,
            1 << 63,
            u64::MAX,
        ];
        match rng.random_range(0..6) {
            0 => edge[rng.random_range(0..edge.len())],
            1 => edge[rng.random_range(0..edge.len())].wrapping_add(rng.random_range(0..3)),
            2 => 1 << rng.random_range(0..64),
            3 => rng.random_range(0..=u64::MAX),
            _ => rng.random_range(0..5000),
        }
    }

    /// The ring never passes what the unary path refuses, and refuses with
    /// the unary path's words: for every kernel of the corpus the verifier
    /// accepts (every family: the scalar ABI, 32-bit indices, Vectorized,
    /// Strided, Triton, Inductor, NVRTC frames and calls), granted as the
    /// front grants it ([`grant_terms`]) and checked as the ring's
    /// executor checks it (the whole decoded contract, the signature and
    /// its count limit, or the signature alone), against `check_with_args`
    /// over the verified contract at hostile counts, typed args (wrong
    /// types, wrong numbers, NaN bits read as a count, negative and huge
    /// strides and divisors), f32 params, offsets near 2^64, misaligned,
    /// and buffers of 0 to 2^64 - 1 bytes. Ring more permissive than unary
    /// is a hole; any other difference is a wording mismatch.
    #[test]
    fn the_ring_refuses_what_the_unary_path_refuses_for_every_corpus_kernel() {
        use crate::executor::ring::RingTable;
        use crate::launch::{check_with_args, KernelCap, LaunchShape, Placement};
        use ptxd_ipc::ring::OperandRef;
        use rand::SeedableRng;
        let seed: u64 = rand::random();
        eprintln!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let corpus = accepted_corpus();
        assert!(corpus.len() >= 200, "{}", corpus.len());
        let here = Placement {
            device_index: 0,
            generation: crate::handles::DeviceGeneration(0),
        };
        let (mut ring_only, mut compared, mut passed) = (0usize, 0usize, 0usize);
        let mut paths = [0usize; 3];
        for (name, contract, signature) in &corpus {
            let block = match contract.geometry.block {
                BlockRule::Required(x) => x,
                rule => {
                    [rule.host_block(), 32, 96, 1024][rng.random_range(0..4)].min(rule.host_block())
                }
            };
            let Some(grant) = grant_terms(contract, signature, block) else {
                // Not granted: every ring launch of it is refused.
                ring_only += 1;
                continue;
            };
            let decoded = grant
                .contract
                .as_ref()
                .filter(|_| grant.max_count.is_none())
                .map(|wire| decode(wire).unwrap());
            let ring_signature = crate::ptx::Signature {
                reqntid: None,
                maxntid: None,
                ..signature.clone()
            };
            let unary_terms = BoundContract { contract, block };
            let operands = contract.footprints.len();
            let scalar_types = contract.scalar_types();
            for _ in 0..200 {
                // A count limit's edge: the last count it passes and the
                // first it refuses.
                let n = match grant.max_count {
                    Some(max) if rng.random_range(0..4) == 0 => {
                        max.saturating_add(rng.random_range(0..2))
                    }
                    _ => hostile_count(&mut rng),
                };
                // Buffers: mostly exactly a footprint's size or one byte
                // less (the edge), else anything.
                let values = contract.values(n, block);
                let mut args: Vec<ScalarArg> = scalar_types
                    .iter()
                    .map(|t| hostile_arg(&mut rng, *t))
                    .collect();
                match rng.random_range(0..30) {
                    0 => {
                        args.pop();
                    }
                    1 => args.push(ScalarArg::U64(rng.random())),
                    _ => {}
                }
                let (scalars, args) = if rng.random_range(0..10) == 0 && !args.is_empty() {
                    (args.len(), Vec::new())
                } else {
                    (0, args)
                };
                let bits: Vec<u64> = args.iter().map(|a| a.bits()).collect();
                let mut grant_buffers = Vec::new();
                let mut refs = Vec::new();
                for k in 0..operands {
                    let alignment = u64::from(contract.footprints[k].alignment.max(1));
                    let footprint = contract.footprints[k]
                        .bytes
                        .eval_with(&values, &bits)
                        .and_then(|f| u64::try_from(f).ok());
                    let offset = match rng.random_range(0..8) {
                        0 => u64::MAX - rng.random_range(0..64),
                        1 => alignment * rng.random_range(0..64) + rng.random_range(0..alignment),
                        2 => (u64::MAX / alignment) * alignment,
                        _ => alignment * rng.random_range(0..4),
                    };
                    let size = match (rng.random_range(0..4), footprint) {
                        (0, _) => rng.random_range(0..=u64::MAX),
                        (1, _) => u64::MAX,
                        (_, Some(f)) => f
                            .saturating_add(offset)
                            .saturating_sub(rng.random_range(0..2)),
                        (_, None) => rng.random_range(0..1 << 20),
                    };
                    grant_buffers.push(ptxd_proto::executor::RingBuffer {
                        ring_index: k as u32 + 1,
                        buffer_id: 100 + k as u64,
                        size,
                    });
                    refs.push(OperandRef {
                        buffer: k as u32 + 1,
                        offset,
                    });
                }
                let mut table: RingTable<(), u64> = RingTable::default();
                table.apply(
                    &exec::RingGrant {
                        buffers: grant_buffers,
                        ..Default::default()
                    },
                    |_| Some(()),
                    Some,
                );
                let shape = LaunchShape {
                    inputs: &refs[..operands - 1],
                    output: refs.last(),
                    n,
                    scalars,
                    wait: None,
                    signal: None,
                };
                let unary = check_with_args(
                    &table,
                    KernelCap {
                        signature: &unary_terms,
                        placement: here,
                    },
                    &shape,
                    &args,
                )
                .map_err(|e: crate::error::Error| e.refusal());
                let (path, ring) = match (grant.max_count, &decoded) {
                    (Some(max), _) if n > max => {
                        // Refused by the limit, before anything else.
                        assert!(unary.is_err(), "{name} block {block}: n {n} past {max}");
                        compared += 1;
                        continue;
                    }
                    (limit, None) => (
                        usize::from(limit.is_some()),
                        check_with_args(
                            &table,
                            KernelCap {
                                signature: &ring_signature,
                                placement: here,
                            },
                            &shape,
                            &args,
                        ),
                    ),
                    (_, Some(decoded)) => (
                        2,
                        check_with_args(
                            &table,
                            KernelCap {
                                signature: &BoundContract {
                                    contract: decoded,
                                    block: grant.block,
                                },
                                placement: here,
                            },
                            &shape,
                            &args,
                        ),
                    ),
                };
                paths[path] += 1;
                let mut ring = ring.map_err(|e: crate::error::Error| e.refusal());
                // A signature carries no param names: the ring names a
                // scalar `p<k>` where the contract names it (documented;
                // the ring's client sees only the reason).
                if let (0 | 1, Err(r), Err(u)) = (path, &mut ring, &unary) {
                    if r.metadata.get("param").is_some_and(|p| p.starts_with('p')) {
                        r.metadata
                            .insert("param".into(), u.metadata["param"].clone());
                        r.message = u.message.clone();
                    }
                }
                assert_eq!(
                    ring, unary,
                    "{name} block {block}: n {n}, args {args:?}, scalars {scalars}, operands {refs:?}"
                );
                compared += 1;
                passed += usize::from(ring.is_ok());
            }
        }
        eprintln!(
            "{} kernels ({ring_only} not granted), {compared} launches compared, {passed} passed, paths {paths:?}",
            corpus.len()
        );
        assert!(passed > compared / 20, "{passed} of {compared}");
    }

    #[test]
    fn a_malformed_strided_step_refuses_the_grant() {
        use exec::expr_step::Step;
        let corpus = strided_corpus();
        let (file, c) = &corpus[0];
        let good = encode(c);
        assert!(decode(&good).is_ok(), "{file}");
        // Where the first arg step is in a footprint.
        let (f, at) = good
            .footprints
            .iter()
            .enumerate()
            .find_map(|(f, fp)| {
                fp.bytes
                    .iter()
                    .position(|s| matches!(s.step, Some(Step::Arg(_))))
                    .map(|at| (f, at))
            })
            .unwrap();
        // An arg the launch does not pass.
        let mut wire = good.clone();
        wire.footprints[f].bytes[at].step = Some(Step::Arg(c.scalar_params() as u32));
        assert!(decode(&wire).unwrap_err().contains("arg step"), "{file}");
        let mut wire = good.clone();
        wire.footprints[f].bytes[at].step = Some(Step::Arg(u32::MAX));
        assert!(decode(&wire).is_err());
        // A step without a kind.
        let mut wire = good.clone();
        wire.footprints[f].bytes[at].step = None;
        assert!(decode(&wire).unwrap_err().contains("without a kind"));
        // Each binary operation without its operands.
        for op in [
            Step::Div(exec::Empty {}),
            Step::SatSub(exec::Empty {}),
            Step::Min(exec::Empty {}),
        ] {
            let mut wire = good.clone();
            wire.preconditions[0].expr = vec![
                exec::ExprStep {
                    step: Some(Step::Arg(0)),
                },
                exec::ExprStep { step: Some(op) },
            ];
            assert!(decode(&wire).unwrap_err().contains("two operands"));
            let mut wire = good.clone();
            wire.preconditions[0].expr.push(exec::ExprStep {
                step: Some(Step::Arg(0)),
            });
            assert!(decode(&wire).unwrap_err().contains("exactly one value"));
        }
    }

    #[test]
    fn a_malformed_expression_is_refused() {
        use exec::expr_step::Step;
        let mut wire = encode(&triton());
        wire.footprints[0].bytes.push(exec::ExprStep {
            step: Some(Step::Add(exec::Empty {})),
        });
        assert!(decode(&wire).is_err());
        let mut wire = encode(&triton());
        wire.footprints[0].bytes.insert(
            0,
            exec::ExprStep {
                step: Some(Step::Count(exec::Empty {})),
            },
        );
        assert!(decode(&wire).unwrap_err().contains("exactly one value"));
        let mut wire = encode(&triton());
        wire.preconditions[0].expr.clear();
        assert!(decode(&wire).is_err());
        let mut wire = encode(&triton());
        wire.param_names.pop();
        assert!(decode(&wire).is_err());
        let mut wire = encode(&triton());
        wire.footprints[0].bytes = vec![
            exec::ExprStep {
                step: Some(Step::Count(exec::Empty {}))
            };
            MAX_STEPS + 1
        ];
        assert!(decode(&wire).unwrap_err().contains("more than"));
    }
}
