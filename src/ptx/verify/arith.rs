//! The integer arithmetic the index and address proofs are built from:
//! `i = ctaid.x × ntid.x + tid.x` in 64 bits, `i × s`, `param + i × s`.
//!
//! Invariants: only integer instructions of the exact widths count (a
//! pointer in a float instruction is never an address); a product or sum
//! that may have wrapped in 32 bits is `Narrow`/`NarrowAddr`, never
//! `Index`/`Addr`; an instruction this file does not recognise yields
//! `None`, and the caller treats its pointer operands as a misuse and its
//! result as data.

use crate::ptx::ir::Inst;

use super::dataflow::{Sk, V};

/// The instruction's first type, when it is an integer type of `bits`.
pub(super) fn int_ty(inst: &Inst, bits: u32) -> bool {
    inst.types()
        .first()
        .is_some_and(|t| t.is_int() && t.bits() == bits)
}

pub(super) fn is_int(inst: &Inst) -> bool {
    inst.types().first().is_some_and(|t| t.is_int())
}

/// `mul.wide`/`mad.wide` with 32-bit integer sources.
fn wide32(inst: &Inst) -> bool {
    inst.has("wide") && int_ty(inst, 32)
}

/// `ctaid.x × ntid.x`, either order.
fn is_block(a: V, b: V, s: fn(Sk) -> V) -> bool {
    (a == s(Sk::Ctaid) && b == s(Sk::Ntid)) || (a == s(Sk::Ntid) && b == s(Sk::Ctaid))
}

fn scale_by(x: V, c: V) -> Option<V> {
    match (x, c) {
        (V::Index, V::Const(c)) if (1..=64).contains(&c) => Some(V::Scaled(c as u32)),
        (V::Scaled(s), V::Const(c)) if (1..=64).contains(&c) => {
            Some(V::Scaled(s.saturating_mul(c as u32)))
        }
        _ => None,
    }
}

/// `base + off` in 64 bits, for a pointer-class `base`.
fn offset_by(base: V, off: V) -> Option<V> {
    use V::*;
    match (base, off) {
        (Param(m), Scaled(s)) => Some(Addr(m, s)),
        (Param(m), Index) => Some(Addr(m, 1)),
        (Param(m) | Addr(m, _) | Derived(m), Narrow) | (NarrowAddr(m), _)
            if off.params().is_empty() =>
        {
            Some(NarrowAddr(m))
        }
        (Param(m) | Addr(m, _) | Derived(m), y) if y.params().is_empty() => Some(Derived(m)),
        _ => None,
    }
}

/// The abstract result of an integer instruction over `a`, `b` (and `c`
/// for `mad`), or `None` when it is not one ptxd models (then a pointer
/// operand is a misuse and the result is data).
pub(super) fn arith(inst: &Inst, a: V, b: V, c: Option<V>) -> Option<V> {
    use V::*;
    let op = inst.base.as_str();
    let either = |f: &dyn Fn(V, V) -> Option<V>| f(a, b).or_else(|| f(b, a));
    match (op, c) {
        ("mul", None) if wide32(inst) => {
            if is_block(a, b, S32) {
                Some(Block64)
            } else if matches!(a, Narrow | S32(_) | Block32)
                || matches!(b, Narrow | S32(_) | Block32)
            {
                Some(Narrow)
            } else {
                None
            }
        }
        ("mul", None) if int_ty(inst, 32) && !inst.has("wide") => {
            if is_block(a, b, S32) {
                Some(Block32)
            } else if a == Narrow || b == Narrow {
                Some(Narrow)
            } else {
                None
            }
        }
        ("mul", None) if int_ty(inst, 64) && inst.has("lo") => {
            if is_block(a, b, S64) {
                Some(Block64)
            } else if a == Narrow || b == Narrow {
                Some(Narrow)
            } else {
                either(&scale_by)
            }
        }
        ("shl", None) if int_ty(inst, 64) => match (a, b) {
            (Index, Const(c)) if (0..7).contains(&c) => Some(Scaled(1 << c)),
            (Scaled(s), Const(c)) if (0..7).contains(&c) => Some(Scaled(s.saturating_mul(1 << c))),
            (Narrow, _) => Some(Narrow),
            _ => None,
        },
        ("shl", None) if int_ty(inst, 32) => match a {
            Narrow | S32(_) | Block32 => Some(Narrow),
            _ => None,
        },
        ("add", None) if int_ty(inst, 32) => {
            if matches!((a, b), (Block32, S32(Sk::Tid)) | (S32(Sk::Tid), Block32))
                || a == Narrow
                || b == Narrow
            {
                Some(Narrow)
            } else {
                None
            }
        }
        ("add", None) if int_ty(inst, 64) => {
            if matches!((a, b), (Block64, S64(Sk::Tid)) | (S64(Sk::Tid), Block64)) {
                Some(Index)
            } else if a.params().has_any() {
                offset_by(a, b)
            } else if b.params().has_any() {
                offset_by(b, a)
            } else {
                None
            }
        }
        ("sub", None) if int_ty(inst, 64) => match (a, b) {
            (Param(m) | Addr(m, _) | Derived(m), y) if y.params().is_empty() => Some(Derived(m)),
            _ => None,
        },
        ("mad", Some(c)) if wide32(inst) => {
            if is_block(a, b, S32) && c == S64(Sk::Tid) {
                Some(Index)
            } else if matches!(a, Narrow | S32(_) | Block32)
                || matches!(b, Narrow | S32(_) | Block32)
            {
                Some(if c.params().has_any() {
                    NarrowAddr(c.params())
                } else {
                    Narrow
                })
            } else {
                None
            }
        }
        ("mad", Some(c)) if int_ty(inst, 32) && inst.has("lo") => {
            let index32 = is_block(a, b, S32) && c == S32(Sk::Tid);
            (index32 || a == Narrow || b == Narrow).then_some(Narrow)
        }
        ("mad", Some(c)) if int_ty(inst, 64) && inst.has("lo") => {
            if is_block(a, b, S64) && c == S64(Sk::Tid) {
                Some(Index)
            } else if c.params().has_any() {
                either(&scale_by).and_then(|sc| offset_by(c, sc))
            } else if a == Narrow || b == Narrow {
                Some(Narrow)
            } else {
                None
            }
        }
        _ => None,
    }
}
