//! The integer arithmetic the index and address proofs are built from:
//! `i = ctaid.x × ntid.x + tid.x` in 64 bits, `i × s`, `param + i × s + c`.
//!
//! Proofs of a class, not patterns: under `.reqntid N` the constant `N` is
//! `ntid.x` (and `ctaid << k` is `ctaid × N` when `N = 2^k`); `a | b` is
//! `a + b` when no bit can be set in both (`ctaid × 2^k` has its low k bits
//! clear, `tid < 2^k` has no others); a constant added to an address moves
//! with it (`+ 0` changes nothing), and an access `[reg + o]` through
//! `param + i × s + c` is element i exactly when `c + o == 0`.
//!
//! Invariants: only integer instructions of the exact widths count (a
//! pointer in a float instruction is never an address); a product or sum
//! that may have wrapped in 32 bits is `Narrow`/`NarrowAddr`, never
//! `Index`/`Addr`; an instruction this file does not recognise yields
//! `None`, and the caller treats its pointer operands as a misuse and its
//! result as data.

use crate::ptx::ir::Inst;

use super::value::{Sk, V};

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

/// `ctaid.x × ntid.x`, either order; under `.reqntid` the constant block
/// size is `ntid.x` (a launch with another block size fails).
fn is_block(a: V, b: V, s: fn(Sk) -> V, ntid: Option<i64>) -> bool {
    let is_ntid = |v: V| v == s(Sk::Ntid) || matches!((v, ntid), (V::Const(c), Some(n)) if c == n);
    (a == s(Sk::Ctaid) && is_ntid(b)) || (is_ntid(a) && b == s(Sk::Ctaid))
}

/// `param + i × s + c` + `d`: the constant moves with the address; `None`
/// when it would overflow (the caller falls back to `Derived`).
fn plus_const(base: V, d: i64) -> Option<V> {
    use V::*;
    let with = |m, s, c: i64| {
        let c = c.checked_add(d)?;
        Some(if s == 0 && c == 0 {
            Param(m)
        } else {
            Addr(m, s, c)
        })
    };
    match base {
        Param(m) => with(m, 0, 0),
        Addr(m, s, c) => with(m, s, c),
        _ => None,
    }
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
        (Param(m), Scaled(s)) => Some(Addr(m, s, 0)),
        (Param(m), Index) => Some(Addr(m, 1, 0)),
        // `param + c`, then `+ i × s`: the constant stays.
        (Addr(m, 0, c), Scaled(s)) => Some(Addr(m, s, c)),
        (Addr(m, 0, c), Index) => Some(Addr(m, 1, c)),
        (Param(_) | Addr(..), Const(d)) if plus_const(base, d).is_some() => plus_const(base, d),
        (Param(m) | Addr(m, _, _) | Derived(m), Narrow) | (NarrowAddr(m), _)
            if off.params().is_empty() =>
        {
            Some(NarrowAddr(m))
        }
        (Param(m) | Addr(m, _, _) | Derived(m), y) if y.params().is_empty() => Some(Derived(m)),
        _ => None,
    }
}

/// The abstract result of an integer instruction over `a`, `b` (and `c`
/// for `mad`), or `None` when it is not one ptxd models (then a pointer
/// operand is a misuse and the result is data).
///
/// With `index32` (the 32-bit-index family), `ctaid × ntid + tid` computed
/// in 32 bits is `Index32`, and `Index32 × s` widened by `mul.wide` is
/// `i × s`: exact under `index_fits_i32`, which the caller records.
/// Without it, every rule is the 64-bit-only one.
pub(super) fn arith(
    inst: &Inst,
    a: V,
    b: V,
    c: Option<V>,
    ntid: Option<i64>,
    index32: bool,
) -> Option<V> {
    use V::*;
    let op = inst.base.as_str();
    let either = |f: &dyn Fn(V, V) -> Option<V>| f(a, b).or_else(|| f(b, a));
    let narrow = |v: V| matches!(v, Narrow | Index32);
    let index32_of = |x: V, y: V| {
        (index32 && matches!((x, y), (Block32, S32(Sk::Tid)) | (S32(Sk::Tid), Block32)))
            .then_some(Index32)
    };
    let widened_scale = |x: V, c: V| match (x, c) {
        (Index32, Const(c)) if index32 && (1..=64).contains(&c) => Some(Scaled(c as u32)),
        _ => None,
    };
    match (op, c) {
        ("mul", None) if wide32(inst) => {
            if is_block(a, b, S32, ntid) {
                Some(Block64)
            } else if let Some(scaled) = either(&widened_scale) {
                Some(scaled)
            } else if matches!(a, Narrow | S32(_) | Block32 | Index32)
                || matches!(b, Narrow | S32(_) | Block32 | Index32)
            {
                Some(Narrow)
            } else {
                None
            }
        }
        // Only the low half is the product: `mul.hi` of the block is
        // another value (0 while the product fits), never `Block32`.
        ("mul", None) if int_ty(inst, 32) && inst.has("lo") => {
            if is_block(a, b, S32, ntid) {
                Some(Block32)
            } else if narrow(a) || narrow(b) {
                Some(Narrow)
            } else {
                None
            }
        }
        ("mul", None) if int_ty(inst, 64) && inst.has("lo") => {
            if is_block(a, b, S64, ntid) {
                Some(Block64)
            } else if a == Narrow || b == Narrow {
                Some(Narrow)
            } else {
                either(&scale_by)
            }
        }
        ("shl", None) if int_ty(inst, 64) => match (a, b) {
            // `ctaid << k` is `ctaid × ntid` when `.reqntid` is `2^k`.
            (S64(Sk::Ctaid), Const(c)) if (0..11).contains(&c) && ntid == Some(1 << c) => {
                Some(Block64)
            }
            (Index, Const(c)) if (0..7).contains(&c) => Some(Scaled(1 << c)),
            (Scaled(s), Const(c)) if (0..7).contains(&c) => Some(Scaled(s.saturating_mul(1 << c))),
            (Narrow, _) => Some(Narrow),
            _ => None,
        },
        ("shl", None) if int_ty(inst, 32) => match a {
            Narrow | S32(_) | Block32 | Index32 => Some(Narrow),
            _ => None,
        },
        ("add", None) if int_ty(inst, 32) => {
            if let Some(i) = index32_of(a, b) {
                Some(i)
            } else if matches!((a, b), (Block32, S32(Sk::Tid)) | (S32(Sk::Tid), Block32))
                || narrow(a)
                || narrow(b)
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
        // `block | tid` is `block + tid` when no bit is set in both: under a
        // `.reqntid` of `2^k`, `block = ctaid × 2^k` has its low k bits
        // clear and `tid < 2^k` has no other bit.
        ("or", None) if int_ty(inst, 64) => {
            let pow2 = ntid.is_some_and(|n| n > 0 && n.count_ones() == 1);
            matches!((a, b), (Block64, S64(Sk::Tid)) | (S64(Sk::Tid), Block64))
                .then_some(Index)
                .filter(|_| pow2)
        }
        ("sub", None) if int_ty(inst, 64) => match (a, b) {
            (Param(_) | Addr(..), Const(d))
                if d.checked_neg().and_then(|d| plus_const(a, d)).is_some() =>
            {
                d.checked_neg().and_then(|d| plus_const(a, d))
            }
            (Param(m) | Addr(m, _, _) | Derived(m), y) if y.params().is_empty() => Some(Derived(m)),
            _ => None,
        },
        ("mad", Some(c)) if wide32(inst) => {
            if is_block(a, b, S32, ntid) && c == S64(Sk::Tid) {
                Some(Index)
            } else if matches!(a, Narrow | S32(_) | Block32 | Index32)
                || matches!(b, Narrow | S32(_) | Block32 | Index32)
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
            let index = is_block(a, b, S32, ntid) && c == S32(Sk::Tid);
            if index && index32 {
                Some(Index32)
            } else {
                (index || narrow(a) || narrow(b)).then_some(Narrow)
            }
        }
        ("mad", Some(c)) if int_ty(inst, 64) && inst.has("lo") => {
            if is_block(a, b, S64, ntid) && c == S64(Sk::Tid) {
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
