//! A kernel's launch contract as a ring grant carries it: the front
//! encodes the contract it verified ([`encode`]) and the ring's executor
//! decodes it ([`decode`]) once, at grant time, and then checks every ring
//! launch of the kernel against it with the same terms as the unary path
//! ([`crate::launch::BoundContract`]).
//!
//! Invariants:
//! - `decode(encode(c))` has exactly the launch terms of `c` (params and
//!   their kinds, elements per thread, every footprint's alignment and
//!   expression, every precondition's expression and bound), so the ring
//!   checks what the front would; a precondition's name outside the ones
//!   ptxd defines is kept as `launch_precondition` (the condition itself is
//!   still evaluated: only its refusal's name is generic).
//! - Anything malformed (an expression that does not reduce to exactly one
//!   value, a param without a kind) is refused: the kernel is then not
//!   granted to the ring, never checked against less.
//! - Decoding is bounded: an expression has at most [`MAX_STEPS`] steps.

use ptxd_proto::executor as exec;

use crate::ptx::contract::{
    BlockRule, Condition, ContractParam, Expr, Footprint, Geometry, LaunchContract, ParamKind,
    PointerAccess, Precondition, COUNT_FITS_I32, COUNT_FITS_I64, INDEX_FITS_I32,
};

/// The most steps one encoded expression may have.
pub const MAX_STEPS: usize = 256;

/// Precondition names a decoded contract keeps as they are.
const KNOWN: [&str; 4] = [
    COUNT_FITS_I32,
    COUNT_FITS_I64,
    INDEX_FITS_I32,
    "count_fits_u32",
];

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
            .map(|p| match &p.condition {
                Condition::AtMost(e, bound) => exec::RingPrecondition {
                    name: p.name.to_string(),
                    expr: steps(e),
                    bound_low: *bound as u64,
                    bound_high: (*bound >> 64) as u64,
                },
                // The wire carries `<=` only: a step without a kind makes
                // the grant undecodable, so the kernel is not granted.
                Condition::AtLeast(..) => exec::RingPrecondition {
                    name: p.name.to_string(),
                    expr: vec![exec::ExprStep { step: None }],
                    bound_low: 0,
                    bound_high: 0,
                },
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
            Expr::Add(a, b) => {
                walk(a, out);
                walk(b, out);
                Step::Add(exec::Empty {})
            }
            Expr::Mul(a, b) => {
                walk(a, out);
                walk(b, out);
                Step::Mul(exec::Empty {})
            }
            Expr::RoundUp(a, k) => {
                walk(a, out);
                Step::RoundUp(*k)
            }
            // The Strided family's terms (the launch's args, division,
            // min) have no step on the wire: a step without a kind makes
            // the grant undecodable, so such a kernel is not granted to a
            // ring (its launches take the unary paths, which carry args).
            Expr::Arg(_) | Expr::Div(..) | Expr::SatSub(..) | Expr::Min(..) => {
                out.push(exec::ExprStep { step: None });
                return;
            }
        };
        out.push(exec::ExprStep { step: Some(step) });
    }
    walk(e, &mut out);
    out
}

fn expr(steps: &[exec::ExprStep]) -> Result<Expr, String> {
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
            Step::Add(_) | Step::Mul(_) => {
                let (Some(b), Some(a)) = (stack.pop(), stack.pop()) else {
                    return Err("an operation without its two operands".into());
                };
                if matches!(step.step, Some(Step::Add(_))) {
                    Expr::sum(a, b)
                } else {
                    Expr::product(a, b)
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
                bytes: expr(&f.bytes)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let preconditions = wire
        .preconditions
        .iter()
        .map(|p| {
            let name = KNOWN
                .iter()
                .find(|k| **k == p.name)
                .copied()
                .unwrap_or("launch_precondition");
            Ok(Precondition {
                name,
                condition: Condition::AtMost(
                    expr(&p.expr)?,
                    u128::from(p.bound_low) | (u128::from(p.bound_high) << 64),
                ),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(LaunchContract {
        params,
        geometry: Geometry {
            // The block is the grant's; the rule does not enter the check.
            block: BlockRule::Default,
            elements_per_thread: wire.elements_per_thread.max(1),
        },
        footprints,
        preconditions,
    })
}

/// Whether a ring can check launches of a kernel with this contract (then
/// the front grants it to its session's ring; see `front::ring`).
pub fn launchable(contract: &LaunchContract) -> bool {
    decode(&encode(contract)).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::launch::{BoundContract, LaunchTerms};

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
            let shift = rand::Rng::random_range(&mut rng, 0..64);
            let n = rand::Rng::random_range(&mut rng, 0..=u64::MAX >> shift);
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
