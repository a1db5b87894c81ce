//! The verdict: from the settled events, the first refusal in instruction
//! order, or the signature and each param's role.
//!
//! Invariants of an acceptance: every bounds guard is against the last
//! integer param (the count), and one dominates every global access; every
//! access goes through an input (a load) or the output (a store) at
//! `param + i × width` with a width of 1, 2, 4 or 8 bytes, one width per
//! pointer; the output is stored through and every input read. A pointer
//! escape of the count is reported as `param_misuse`: the count's bits are
//! no secret.

use std::collections::BTreeMap;

use crate::ptx::contract::{
    Condition, Expr, ParamKind, Precondition, ScalarType, COUNT_FITS_I32, INDEX_FITS_I32,
};
use crate::ptx::ir::Kernel;
use crate::ptx::{LaunchContract, PtxError, Signature};

use super::dataflow::{AccessKind, Event};
use super::layout::Layout;
use super::{refuse, Role, SubReason, Verified};

/// A lane access: (offset in its element, width, line, element size).
type LanePart = (u32, u32, Option<u32>, u32);

/// The verdict from the settled events: the first refusal in instruction
/// order, or the signature and every param's role.
pub(super) fn decide(
    k: &Kernel,
    layout: &Layout,
    events: &BTreeMap<usize, Event>,
    reqntid: Option<u32>,
    maxntid: Option<u32>,
) -> Result<Verified, PtxError> {
    let name = |p: u16| k.params.get(p as usize).map(|x| x.name.as_str());
    let line_of = |pc: usize| k.insts.get(pc).map(|i| i.line);
    let expected_count = u16::try_from(layout.ints - 1).unwrap_or(u16::MAX);
    let output = expected_count - 1;

    let guard = events.iter().find_map(|(pc, e)| match e {
        Event::Guard { count, .. } => Some((*pc, *count)),
        _ => None,
    });
    let count = match guard {
        Some((_, c)) => c,
        None => {
            // A guard that is no guard (computed from a 32-bit index, as a
            // float, under a predicate, against a count read past its
            // param, ..) is reported as what it is.
            if let Some((
                pc,
                Event::Bad {
                    sub_reason,
                    param,
                    explanation,
                },
            )) = events.iter().find(|(_, e)| {
                matches!(
                    e,
                    Event::Bad {
                        sub_reason: SubReason::IndexNot64bit
                            | SubReason::PredicatedDefinition
                            | SubReason::NonIntegerArithmetic
                            | SubReason::DuplicateDestination
                            | SubReason::ParamOutOfRange,
                        ..
                    }
                )
            }) {
                return Err(refuse(
                    *sub_reason,
                    param.and_then(name),
                    line_of(*pc),
                    explanation.clone(),
                ));
            }
            let at = events
                .iter()
                .find(|(_, e)| matches!(e, Event::Access { .. }))
                .map(|(pc, _)| *pc);
            return Err(refuse(
                SubReason::UnguardedAccess,
                None,
                at.and_then(line_of).or(Some(k.line)),
                "no `i < n` bounds guard against the global thread index",
            ));
        }
    };
    if count < expected_count {
        let extra = count + 1;
        return Err(refuse(
            SubReason::ExtraParams,
            name(extra),
            k.params.get(extra as usize).map(|p| p.line),
            format!(
                "{} integer params follow the count `{}`; the scalar ABI has none",
                expected_count - count,
                name(count).unwrap_or("?")
            ),
        ));
    }
    let mut sizes: Vec<Option<u32>> = vec![None; layout.ints - 1];
    // Per param, its lane accesses: (offset in the element, width, line,
    // element size). Lanes must cover their element together (a `float2`
    // read as two lanes), so a lone access at a wider stride (one float of
    // every two) stays refused.
    let mut lane_parts: Vec<Vec<LanePart>> = vec![Vec::new(); layout.ints - 1];
    for (pc, e) in events {
        let line = line_of(*pc);
        match e {
            Event::Guard { count: c, .. } if *c != count => {
                return Err(refuse(
                    SubReason::ParamMisuse,
                    name(*c),
                    line,
                    "a second bounds guard against another param",
                ))
            }
            Event::Guard { .. } | Event::Assume => {}
            Event::Bad {
                sub_reason,
                param,
                explanation,
            } => {
                // The count's bits are no secret: using them is a misuse of
                // the count, not a pointer escape.
                let sub_reason = match (*sub_reason, *param) {
                    (SubReason::PointerEscape, Some(p)) if p == count => SubReason::ParamMisuse,
                    (s, _) => s,
                };
                return Err(refuse(
                    sub_reason,
                    param.and_then(name),
                    line,
                    explanation.clone(),
                ));
            }
            Event::Misuse { param, explanation } => {
                let sub = if *param == count {
                    SubReason::ParamMisuse
                } else {
                    SubReason::PointerMisuse
                };
                return Err(refuse(sub, name(*param), line, explanation.clone()));
            }
            Event::Access {
                params,
                kind,
                width,
                lanes,
                scale,
                guarded,
                lane,
            } => {
                for p in params.iter() {
                    let param = &p;
                    if *guarded != Some(count) {
                        return Err(refuse(
                            SubReason::UnguardedAccess,
                            name(*param),
                            line,
                            "a global access not dominated by the `i < n` guard",
                        ));
                    }
                    if *param >= expected_count {
                        return Err(refuse(
                            SubReason::PointerMisuse,
                            name(*param),
                            line,
                            "the count is used as a pointer",
                        ));
                    }
                    match (kind, *param == output) {
                        (AccessKind::Store, false) => {
                            return Err(refuse(
                                SubReason::PointerMisuse,
                                name(*param),
                                line,
                                "a store through an input pointer",
                            ))
                        }
                        (AccessKind::Load, true) => {
                            return Err(refuse(
                                SubReason::PointerMisuse,
                                name(*param),
                                line,
                                "a load through the output pointer",
                            ))
                        }
                        _ => {}
                    }
                    // A vector access is one element of the Vectorized
                    // family only when the vector is the whole element: a
                    // power of two of at most 16 bytes at its own stride.
                    if *lanes > 1 && (width != scale || !width.is_power_of_two() || *width > 16) {
                        return Err(refuse(
                            SubReason::VectorizedAccess,
                            name(*param),
                            line,
                            format!(
                                "a {lanes}-lane {width}-byte access at a stride of {scale} bytes: \
                                 not one whole vector per thread"
                            ),
                        ));
                    }
                    // One lane of a vector element (the Vectorized family):
                    // a scalar access inside element i at a multiple of its
                    // width, the element a power of two of at most 16 bytes.
                    // Otherwise the access is the whole element, at its
                    // start. Every access is one of the two.
                    let at = lane.unwrap_or(0);
                    let whole = width == scale && at == 0;
                    let lane_of_element = *lanes == 1
                        && lane.is_some()
                        && *width != 0
                        && at % width == 0
                        && at.checked_add(*width).is_some_and(|end| end <= *scale)
                        && scale.is_power_of_two()
                        && *scale <= 16;
                    if !(whole || lane_of_element)
                        || (*lanes == 1 && !matches!(width, 1 | 2 | 4 | 8))
                    {
                        return Err(refuse(
                            SubReason::NonElementwiseAddress,
                            name(*param),
                            line,
                            format!("a {width}-byte access at a stride of {scale} bytes"),
                        ));
                    }
                    if !whole {
                        if let Some(parts) = lane_parts.get_mut(*param as usize) {
                            parts.push((at, *width, line, *scale));
                        }
                    }
                    // The element is `scale` bytes (the access's width
                    // unless it is one lane of it).
                    let slot = &mut sizes[*param as usize];
                    if slot.is_some_and(|s| s != *scale) {
                        return Err(refuse(
                            SubReason::NonElementwiseAddress,
                            name(*param),
                            line,
                            "accesses of different element sizes through one pointer",
                        ));
                    }
                    *slot = Some(*scale);
                }
            }
        }
    }
    for (p, parts) in lane_parts.iter_mut().enumerate() {
        parts.sort_unstable();
        let Some(&(_, width, line, scale)) = parts.first() else {
            continue;
        };
        let mut covered = 0u32;
        for &(at, w, _, _) in parts.iter() {
            if at <= covered {
                covered = covered.max(at + w);
            }
        }
        if covered < scale {
            return Err(refuse(
                SubReason::NonElementwiseAddress,
                name(u16::try_from(p).unwrap_or(u16::MAX)),
                line,
                format!("a {width}-byte access at a stride of {scale} bytes"),
            ));
        }
    }
    let mut element_sizes = Vec::with_capacity(sizes.len());
    for (p, s) in sizes.iter().enumerate() {
        let p16 = u16::try_from(p).unwrap_or(u16::MAX);
        match s {
            Some(s) => element_sizes.push(*s),
            None if p16 == output => {
                return Err(refuse(
                    SubReason::NoOutputStore,
                    name(p16),
                    None,
                    "the output pointer is never stored through",
                ))
            }
            None => {
                return Err(refuse(
                    SubReason::UnusedInput,
                    name(p16),
                    None,
                    "an input pointer is never read",
                ))
            }
        }
    }
    let inputs = u32::from(output);
    let mut roles = Vec::with_capacity(k.params.len());
    for p in 0..k.params.len() {
        let p = u16::try_from(p).unwrap_or(u16::MAX);
        roles.push(if p < output {
            Role::Input(u32::from(p))
        } else if p == output {
            Role::Output
        } else if p == count {
            Role::Count
        } else {
            Role::Scalar(u32::from(p - count - 1))
        });
    }
    let signature = Signature {
        inputs,
        element_sizes,
        scalar_params: u32::try_from(layout.floats).unwrap_or(u32::MAX),
        reqntid,
        maxntid,
    };
    let names: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
    let mut contract = LaunchContract::scalar(&signature, &names);
    // An `int n`: the contract names its type, and a launch's count must
    // fit it (the kernel would read a cut count).
    if let Some(ty) = layout.count32 {
        if let Some(param) = contract.params.get_mut(usize::from(count)) {
            param.kind = ParamKind::Count(if ty == "s32" {
                ScalarType::S32
            } else {
                ScalarType::U32
            });
        }
        contract = contract.assuming(Precondition {
            name: COUNT_FITS_I32,
            condition: Condition::AtMost(Expr::Count, (1 << 31) - 1),
        });
    }
    // A 32-bit index was used as exact (widened, or compared with a 32-bit
    // count): every thread's index must fit.
    if events
        .values()
        .any(|e| matches!(e, Event::Assume | Event::Guard { index32: true, .. }))
    {
        contract = contract.assuming(Precondition {
            name: INDEX_FITS_I32,
            condition: Condition::AtMost(Expr::product(Expr::Grid, Expr::Block), 1 << 31),
        });
    }
    Ok(Verified {
        signature,
        roles,
        contract,
    })
}
