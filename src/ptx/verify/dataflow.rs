//! The abstract domain and the transfer functions: what a register provably
//! holds, how paths join, and what each instruction does to the state and
//! reports.
//!
//! Invariants:
//! - Joins are sound for pointers: a value that may carry a param's bits
//!   keeps them in its `ParamSet` (`Tainted` at worst); only `Top` and constants
//!   are data, and nothing becomes data by a join.
//! - `guarded` survives a join only when every incoming path has it, so at
//!   an access it means the guard dominates the access.
//! - A predicated instruction's destinations keep the old value or take the
//!   new one; defining anything but data that way is an event.
//! - A value written to a register narrower than its class is data there,
//!   and a pointer so cut is an escape.
//! - The transfer function is an exhaustive `match` on `table::Opcode`: an
//!   opcode added to the table gets no transfer function by default, the
//!   compiler asks for one.
//! - Each instruction has at most one [`Event`], keyed by its pc, which
//!   `decision.rs` turns into the verdict; this module refuses nothing
//!   itself.

use std::collections::BTreeMap;

use crate::ptx::ir::{Base, Inst, Kernel, Opnd, Sreg, Ty};
use crate::ptx::parse::Imm;
use crate::ptx::Families;

use super::arith::{arith, int_ty, is_int};
use super::instructions::destinations;
use super::regs::{JoinMemo, Regs};
use super::table::Opcode as O;
pub(super) use super::value::{first, ParamSet, Sk, V};
use super::SubReason;

/// What the registers hold at one point, and the guard fact there.
#[derive(Clone)]
pub(super) struct State {
    /// One value per register, shared with the states it came from.
    pub(super) regs: Regs<V>,
    /// `Some(n)`: every path here passed the guard `i < param n`.
    pub(super) guarded: Option<u16>,
}

impl State {
    /// Joins `other` in; whether anything changed. `memo` counts the
    /// register-file nodes visited (see `regs.rs`), which the caller bounds.
    pub(super) fn join(&mut self, other: &State, memo: &mut JoinMemo<V>) -> bool {
        let mut changed = self.regs.join_with(&other.regs, V::join, memo);
        if self.guarded != other.guarded && self.guarded.is_some() {
            self.guarded = None;
            changed = true;
        }
        changed
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AccessKind {
    Load,
    Store,
}

#[derive(Debug, Clone)]
pub(super) enum Event {
    Access {
        params: ParamSet,
        kind: AccessKind,
        /// Bytes the access moves: its type's size times `lanes`.
        width: u32,
        /// Registers a `.v2`/`.v4` access moves (1 for a scalar access).
        lanes: u32,
        scale: u32,
        guarded: Option<u16>,
        /// With the Vectorized family, the access's byte offset inside
        /// element i (`param + i × scale + lane`): a vector built lane by
        /// lane; `None` without the family (the access must be the whole
        /// element, at offset 0).
        lane: Option<u32>,
    },
    Bad {
        sub_reason: SubReason,
        param: Option<u16>,
        explanation: String,
    },
    Misuse {
        param: u16,
        explanation: String,
    },
    Guard {
        count: u16,
        /// Against the 32-bit index: the guard assumes `index_fits_i32`.
        index32: bool,
    },
    /// The proof used a 32-bit index (or block offset) as exact: the
    /// contract needs `index_fits_i32`.
    Assume,
}

/// The guard fact a predicate gives when it holds (`when_true`) or not:
/// `Some(count)` when that outcome implies `i < count`.
pub(super) fn guard_fact(st: &State, p: u32, negated: bool, when_true: bool) -> Option<u16> {
    match st.regs.get(p as usize) {
        Some(V::Guard { count, in_range }) if (in_range != negated) == when_true => Some(count),
        _ => None,
    }
}

/// A predicated non-branch instruction: each destination keeps its old
/// value or takes the new one. Only data may be defined that way.
pub(super) fn predicated(
    k: &Kernel,
    pc: usize,
    inst: &Inst,
    st: &mut State,
    events: &mut BTreeMap<usize, Event>,
    families: Families,
) {
    let dests = destinations(inst);
    let before: Vec<V> = dests
        .iter()
        .map(|r| st.regs.get(*r as usize).unwrap_or(V::Top))
        .collect();
    step(k, pc, inst, st, events, families);
    for (r, old) in dests.iter().zip(before) {
        let Some(new) = st.regs.get(*r as usize) else {
            continue;
        };
        if new == old {
            continue;
        }
        if !old.is_data() || !new.is_data() {
            events.insert(
                pc,
                Event::Bad {
                    sub_reason: SubReason::PredicatedDefinition,
                    param: first(old.params() | new.params()),
                    explanation: format!(
                        "`{}` is predicated: it may not run, and it defines an index, address, \
                         pointer or guard",
                        inst.opcode
                    ),
                },
            );
        }
        st.regs.set(*r as usize, old.join(new));
    }
}

/// A comparison of the index with the count `count` (`index_first`: the
/// index is the first operand): the guard `i < n` or its negation, or a
/// misuse of the count when it is another comparison.
fn guard(
    events: &mut BTreeMap<usize, Event>,
    pc: usize,
    inst: &Inst,
    count: Option<u16>,
    index_first: bool,
    count_value: V,
) -> V {
    let count = count.unwrap_or(u16::MAX);
    let cmp = inst.mods.first().map(String::as_str).unwrap_or("");
    // `n > i` is `i < n`: read the comparison with the index first.
    let cmp = match (index_first, cmp) {
        (true, c) => c,
        (false, "le") => "ge",
        (false, "ls") => "hs",
        (false, "gt") => "lt",
        (false, "hi") => "lo",
        (false, _) => "",
    };
    match cmp {
        "ge" | "hs" => V::Guard {
            count,
            in_range: false,
        },
        "lt" | "lo" => V::Guard {
            count,
            in_range: true,
        },
        _ => {
            misuse(
                events,
                pc,
                count_value,
                format!("`{}` compares the count other than as `i < n`", inst.opcode),
            );
            V::Top
        }
    }
}

fn val(st: &State, o: &Opnd) -> V {
    match o {
        Opnd::Reg(r) => st.regs.get(*r as usize).unwrap_or(V::Top),
        // A vector or pair source (`{%a, %b}`, `%a|%b`) packs its parts: it
        // carries every part's pointer bits (a `.b128` pack holds two whole
        // 64-bit pointers), and is never a value ptxd relies on.
        Opnd::List(items) => {
            let m = items
                .iter()
                .fold(ParamSet::EMPTY, |m, it| m | val(st, it).params());
            if !m.is_empty() {
                V::Tainted(m)
            } else {
                V::Top
            }
        }
        Opnd::Pair(a, b) => {
            let m = val(st, &Opnd::Reg(*a)).params() | val(st, &Opnd::Reg(*b)).params();
            if !m.is_empty() {
                V::Tainted(m)
            } else {
                V::Top
            }
        }
        Opnd::Imm(Imm::Int(v)) => V::Const(*v),
        Opnd::Sreg(Sreg::Tid(0)) => V::S32(Sk::Tid),
        Opnd::Sreg(Sreg::Ntid(0)) => V::S32(Sk::Ntid),
        Opnd::Sreg(Sreg::Ctaid(0)) => V::S32(Sk::Ctaid),
        _ => V::Top,
    }
}

fn escape(events: &mut BTreeMap<usize, Event>, pc: usize, v: V, what: String) {
    if let Some(p) = v.pointer() {
        events.insert(
            pc,
            Event::Bad {
                sub_reason: SubReason::PointerEscape,
                param: Some(p),
                explanation: what,
            },
        );
    }
}

/// Writes `v` to destination `o`, as the hardware would: a value wider than
/// its register is cut, so it is data there (and a pointer cut is an escape).
fn set(
    k: &Kernel,
    pc: usize,
    st: &mut State,
    o: Option<&Opnd>,
    v: V,
    events: &mut BTreeMap<usize, Event>,
) {
    match o {
        Some(Opnd::Reg(r)) => {
            let reg_bits = k.reg_types.get(*r as usize).map_or(0, |t| t.bits());
            let fits = match v {
                V::Guard { .. } => k.reg_types.get(*r as usize) == Some(&Ty::Pred),
                _ => v.width() == 0 || v.width() == reg_bits,
            };
            let v = if fits {
                v
            } else {
                escape(
                    events,
                    pc,
                    v,
                    format!(
                        "`{}` puts a pointer into a {reg_bits}-bit register",
                        k.insts.get(pc).map_or("", |i| i.opcode.as_str())
                    ),
                );
                V::Top
            };
            st.regs.set(*r as usize, v);
        }
        Some(Opnd::Pair(a, b)) => {
            let negated = match v {
                V::Guard { count, in_range } => V::Guard {
                    count,
                    in_range: !in_range,
                },
                _ => V::Top,
            };
            set(k, pc, st, Some(&Opnd::Reg(*a)), v, events);
            set(k, pc, st, Some(&Opnd::Reg(*b)), negated, events);
        }
        Some(Opnd::List(items)) => {
            escape(
                events,
                pc,
                v,
                "a pointer is unpacked into parts".to_string(),
            );
            for it in items {
                set(k, pc, st, Some(it), V::Top, events);
            }
        }
        _ => {}
    }
}

fn misuse(events: &mut BTreeMap<usize, Event>, pc: usize, v: V, what: String) {
    if let Some(p) = v.pointer() {
        events.entry(pc).or_insert(Event::Misuse {
            param: p,
            explanation: what,
        });
    }
}

/// `ld.param` of `width` bytes at `[param p + offset]`: the bytes must lie
/// inside that param's own declared size (ptxas wraps an access past the
/// param space onto other params), and only a whole 64-bit integer param
/// is a pointer or the count.
fn load_param(
    k: &Kernel,
    pc: usize,
    inst: &Inst,
    p: u16,
    offset: i64,
    events: &mut BTreeMap<usize, Event>,
) -> V {
    let pty = k.params.get(usize::from(p)).map(|x| x.ty.as_str());
    // `layout` admits only these param types, and no arrays.
    let size: u64 = match pty {
        Some("u64" | "s64" | "b64") => 8,
        // A 32-bit integer param passes `layout` only as the 32-bit count.
        Some("f32" | "u32" | "s32" | "b32") => 4,
        _ => 0,
    };
    let lty = inst.types().last().copied();
    let width = u64::from(lty.map_or(0, |t| t.bytes()));
    let inside = u64::try_from(offset)
        .ok()
        .and_then(|o| o.checked_add(width))
        .is_some_and(|end| width > 0 && end <= size);
    let out_of_range = |why: String| Event::Bad {
        sub_reason: SubReason::ParamOutOfRange,
        param: None,
        explanation: why,
    };
    if !inside {
        events.insert(
            pc,
            out_of_range(format!(
                "`{}` reads {width} bytes at offset {offset} of param {p}, which holds {size}",
                inst.opcode
            )),
        );
        return V::Top;
    }
    if size == 4 && pty != Some("f32") {
        // The 32-bit count, read whole at a 32-bit integer type.
        return match (offset, lty) {
            (0, Some(Ty::U32 | Ty::S32 | Ty::B32)) => V::Count32(p),
            _ => {
                events.entry(pc).or_insert(Event::Misuse {
                    param: p,
                    explanation: format!("`{}` loads the count at another width", inst.opcode),
                });
                V::Top
            }
        };
    }
    if size == 4 {
        // A float param: its bits are data; only a part of it is refused,
        // as before.
        return match (offset, lty) {
            (0, Some(Ty::F32 | Ty::B32 | Ty::U32 | Ty::S32)) => V::Top,
            (0, _) => {
                events.entry(pc).or_insert(Event::Misuse {
                    param: p,
                    explanation: format!("`{}` loads the param at another width", inst.opcode),
                });
                V::Top
            }
            _ => {
                events.insert(
                    pc,
                    Event::Bad {
                        sub_reason: SubReason::PointerEscape,
                        param: Some(p),
                        explanation: format!("`{}` loads part of the param", inst.opcode),
                    },
                );
                V::Top
            }
        };
    }
    let Some(set) = ParamSet::single(p) else {
        events.insert(
            pc,
            out_of_range(format!(
                "param {p} is past the {} params the model represents",
                ParamSet::CAPACITY
            )),
        );
        return V::Top;
    };
    match (offset, lty) {
        (0, Some(Ty::U64 | Ty::S64 | Ty::B64)) => V::Param(set),
        (0, _) => {
            escape(
                events,
                pc,
                V::Param(set),
                format!("`{}` loads the pointer param at another width", inst.opcode),
            );
            V::Top
        }
        _ => {
            escape(
                events,
                pc,
                V::Param(set),
                format!("`{}` loads part of the param", inst.opcode),
            );
            V::Top
        }
    }
}

/// The block size `.reqntid` fixes (`layout` checked it is `x,1,1`): under
/// it `%ntid.x` is that constant, so the constant may stand for it.
fn reqntid(k: &Kernel) -> Option<i64> {
    k.reqntid.map(|[x, _, _]| i64::from(x))
}

/// Interprets one non-branch instruction.
pub(super) fn step(
    k: &Kernel,
    pc: usize,
    inst: &Inst,
    st: &mut State,
    events: &mut BTreeMap<usize, Event>,
    families: Families,
) {
    let ops = &inst.ops;
    // Past `instructions::structure` every instruction is a table form.
    let Some(op) = O::from_name(&inst.base) else {
        return compute(k, pc, inst, st, events, families);
    };
    // An integer literal is that integer only in an integer-typed
    // instruction; in `mov.f32 %f, 4` it is the float 4.0, whose bits are
    // anything but 4.
    let int_inst = is_int(inst);
    let src = |i: usize| match ops.get(i).map_or(V::Top, |o| val(st, o)) {
        V::Const(_) if !int_inst => V::Top,
        v => v,
    };
    match op {
        O::Ld | O::Ldu if inst.has("param") => {
            let v = match ops.get(1) {
                Some(Opnd::Addr {
                    base: Base::Param(p),
                    offset,
                }) => load_param(k, pc, inst, *p, *offset, events),
                _ => {
                    events.entry(pc).or_insert(Event::Bad {
                        sub_reason: SubReason::ParamMisuse,
                        param: None,
                        explanation: "a param-space load not from a named param".into(),
                    });
                    V::Top
                }
            };
            set(k, pc, st, ops.first(), v, events);
        }
        O::Ld | O::Ldu | O::St => {
            let (addr_i, data_i) = if op == O::St { (0, 1) } else { (1, 0) };
            // No third operand: the table admits `ld`/`st` with exactly an
            // address and a value, and `ir` dropped any cache-policy one.
            // A `.v2`/`.v4` access moves one value per register of its list
            // (the table ties the list's length to the vector modifier).
            let lanes = match ops.get(data_i) {
                Some(Opnd::List(items)) => u32::try_from(items.len()).unwrap_or(u32::MAX),
                _ => 1,
            };
            let width = inst
                .types()
                .last()
                .map_or(0, |t| t.bytes())
                .saturating_mul(lanes);
            let pred_guard = inst.guard.and_then(|(neg, p)| guard_fact(st, p, neg, true));
            let guarded = st.guarded.or(pred_guard);
            let kind = if op == O::St {
                AccessKind::Store
            } else {
                AccessKind::Load
            };
            let ev = match ops.get(addr_i) {
                Some(Opnd::Addr {
                    base: Base::Reg(r),
                    offset,
                }) => match (st.regs.get(*r as usize), *offset) {
                    // `[reg + o]` with `reg = param + i × s + c`: element i
                    // exactly when the constants cancel.
                    (Some(V::Addr(m, scale, c)), o)
                        if scale != 0 && c.checked_add(o) == Some(0) =>
                    {
                        Event::Access {
                            params: m,
                            kind,
                            width,
                            lanes,
                            scale,
                            guarded,
                            lane: families.vectorized.then_some(0),
                        }
                    }
                    // `[reg + o]` inside element i, past its start: one lane
                    // of a vector element (the Vectorized family's `-G`
                    // builds load a `float2` as two 4-byte accesses);
                    // `decision` holds it inside the element.
                    (Some(V::Addr(m, scale, c)), o)
                        if families.vectorized
                            && scale != 0
                            && c.checked_add(o)
                                .is_some_and(|l| l > 0 && l < i64::from(scale)) =>
                    {
                        Event::Access {
                            params: m,
                            kind,
                            width,
                            lanes,
                            scale,
                            guarded,
                            lane: c.checked_add(o).and_then(|l| u32::try_from(l).ok()),
                        }
                    }
                    (Some(V::NarrowAddr(m)), _) => Event::Bad {
                        sub_reason: SubReason::IndexNot64bit,
                        param: first(m),
                        explanation: "the element index is computed in 32 bits and wraps".into(),
                    },
                    (Some(v), _) if v.params().has_any() => Event::Bad {
                        sub_reason: SubReason::NonElementwiseAddress,
                        param: v.pointer(),
                        explanation: format!(
                            "`{}` does not access element i of its operand (broadcast, offset, gather or strided)",
                            inst.opcode
                        ),
                    },
                    _ => Event::Bad {
                        sub_reason: SubReason::NonElementwiseAddress,
                        param: None,
                        explanation: format!(
                            "`{}` accesses an address not derived from a pointer param",
                            inst.opcode
                        ),
                    },
                },
                _ => Event::Bad {
                    sub_reason: SubReason::NonElementwiseAddress,
                    param: None,
                    explanation: format!("`{}` uses an absolute or symbolic address", inst.opcode),
                },
            };
            events.entry(pc).or_insert(ev);
            if op == O::St {
                let data = match ops.get(data_i) {
                    Some(Opnd::List(items)) => items
                        .iter()
                        .map(|o| val(st, o))
                        .fold(V::Top, |acc, v| if v.params().has_any() { v } else { acc }),
                    _ => src(data_i),
                };
                escape(
                    events,
                    pc,
                    data,
                    "a pointer param is stored to memory".into(),
                );
            } else {
                set(k, pc, st, ops.first(), V::Top, events);
            }
        }
        O::Mov => {
            let v = src(1);
            let r = if v.width() != 0 && !int_ty(inst, v.width()) {
                escape(
                    events,
                    pc,
                    v,
                    format!("`{}` moves a pointer at another type", inst.opcode),
                );
                V::Top
            } else {
                v
            };
            // Packing parts into a value: a part with pointer bits escapes
            // (it arrives here as `Tainted`); otherwise the result is data.
            let r = if matches!(ops.get(1), Some(Opnd::List(_))) {
                escape(
                    events,
                    pc,
                    v,
                    format!("`{}` packs a pointer into a wider value", inst.opcode),
                );
                V::Top
            } else {
                r
            };
            set(k, pc, st, ops.first(), r, events);
        }
        O::Cvta => {
            let v = src(1);
            let r = if v.params().has_any() && int_ty(inst, 64) {
                v
            } else {
                misuse(
                    events,
                    pc,
                    v,
                    format!("`{}` converts a pointer", inst.opcode),
                );
                V::Top
            };
            set(k, pc, st, ops.first(), r, events);
        }
        O::Cvt => {
            let tys = inst.types();
            let v = src(1);
            let widen = matches!(tys.as_slice(), [Ty::U64 | Ty::S64, Ty::U32 | Ty::S32]);
            let r = match v {
                V::S32(sk) if widen => V::S64(sk),
                // Under `index_fits_i32` both are below 2^31: sign- and
                // zero-extension give the same, exact, value.
                V::Index32 if widen && families.index32 => {
                    events.entry(pc).or_insert(Event::Assume);
                    V::Index
                }
                V::Block32 if widen && families.index32 => {
                    events.entry(pc).or_insert(Event::Assume);
                    V::Block64
                }
                V::Narrow | V::Block32 | V::Index32 if widen => V::Narrow,
                // A constant is its bits at the source type's width: the
                // register holds only 32 of them (`mov.u32 %r, -8` is
                // 0xfffffff8), which `cvt` zero- or sign-extends. Read
                // as the literal's 64-bit value, `-8` zero-extended would
                // cancel a `+8` offset that really lands 4 GiB past it.
                // A literal no 32-bit value spells is no constant here.
                V::Const(c) if widen => {
                    let bits = u32::try_from(c)
                        .ok()
                        .or_else(|| i32::try_from(c).ok().map(|x| x as u32));
                    match (bits, tys.get(1)) {
                        (Some(b), Some(Ty::S32)) => V::Const(i64::from(b as i32)),
                        (Some(b), _) => V::Const(i64::from(b)),
                        (None, _) => V::Top,
                    }
                }
                other => {
                    escape(
                        events,
                        pc,
                        other,
                        format!("`{}` converts a pointer or the count", inst.opcode),
                    );
                    V::Top
                }
            };
            set(k, pc, st, ops.first(), r, events);
        }
        O::Setp
            if !inst
                .mods
                .iter()
                .any(|m| matches!(m.as_str(), "and" | "or" | "xor")) =>
        {
            let (a, b) = (src(1), src(2));
            let single = |m: ParamSet| (m.len() == 1).then(|| first(m)).flatten();
            let r = match (a, b) {
                _ if !is_int(inst) => {
                    if (a.params() | b.params()).has_any() {
                        events.entry(pc).or_insert(Event::Bad {
                            sub_reason: SubReason::NonIntegerArithmetic,
                            param: first(a.params() | b.params()),
                            explanation: format!("`{}` compares a pointer as a float", inst.opcode),
                        });
                    }
                    V::Top
                }
                // `i < n` with the 64-bit index and count, or (the 32-bit
                // index family) the exact 32-bit index and a 32-bit count.
                (V::Index, V::Param(m)) | (V::Param(m), V::Index)
                    if int_ty(inst, 64) && single(m).is_some() =>
                {
                    guard(events, pc, inst, single(m), a == V::Index, V::Param(m))
                }
                (V::Index32, V::Count32(p)) | (V::Count32(p), V::Index32) if int_ty(inst, 32) => {
                    guard(events, pc, inst, Some(p), a == V::Index32, V::Count32(p))
                }
                (V::Narrow | V::Index32, o) | (o, V::Narrow | V::Index32)
                    if matches!(o, V::Param(_) | V::Count32(_)) =>
                {
                    events.entry(pc).or_insert(Event::Bad {
                        sub_reason: SubReason::IndexNot64bit,
                        param: o.pointer(),
                        explanation: "the bounds guard compares a 32-bit index".into(),
                    });
                    V::Top
                }
                (x, y) => {
                    misuse(
                        events,
                        pc,
                        x,
                        "compares a param other than as `i < n`".into(),
                    );
                    misuse(
                        events,
                        pc,
                        y,
                        "compares a param other than as `i < n`".into(),
                    );
                    V::Top
                }
            };
            if let V::Guard { count, .. } = r {
                // A guard on the 32-bit index is `i < n` only while that
                // index is exact.
                let index32 = a == V::Index32 || b == V::Index32;
                events.entry(pc).or_insert(Event::Guard { count, index32 });
            }
            set(k, pc, st, ops.first(), r, events);
        }
        O::Not if inst.has("pred") => {
            let r = match src(1) {
                V::Guard { count, in_range } => V::Guard {
                    count,
                    in_range: !in_range,
                },
                _ => V::Top,
            };
            set(k, pc, st, ops.first(), r, events);
        }
        O::Selp if ops.len() == 4 => {
            let (a, b) = (src(1), src(2));
            let r = if a == b {
                a
            } else {
                match (a, b) {
                    // `c ? in0 : in1`, then `[p + i × s]`: either operand's
                    // element i.
                    (V::Param(x), V::Param(y)) => V::Param(x | y),
                    (V::Addr(x, s, c), V::Addr(y, t, d)) if s == t && c == d => {
                        V::Addr(x | y, s, c)
                    }
                    _ => {
                        misuse(
                            events,
                            pc,
                            a,
                            format!("`{}` selects a pointer", inst.opcode),
                        );
                        misuse(
                            events,
                            pc,
                            b,
                            format!("`{}` selects a pointer", inst.opcode),
                        );
                        V::Top
                    }
                }
            };
            let r = if r.width() != 0 && !int_ty(inst, r.width()) {
                V::Top
            } else {
                r
            };
            if r == V::Top {
                misuse(
                    events,
                    pc,
                    a,
                    format!("`{}` selects a pointer", inst.opcode),
                );
                misuse(
                    events,
                    pc,
                    b,
                    format!("`{}` selects a pointer", inst.opcode),
                );
            }
            set(k, pc, st, ops.first(), r, events);
        }
        // Control flow is interpreted by `cfg.rs`; it defines nothing.
        O::Bra | O::Ret | O::Exit => {}
        // Every other opcode of the table computes: `arith` says what it
        // proves, anything else is data (and a pointer operand a misuse).
        O::Add
        | O::Sub
        | O::Mul
        | O::Mad
        | O::Fma
        | O::Div
        | O::Rem
        | O::Neg
        | O::Abs
        | O::Min
        | O::Max
        | O::Copysign
        | O::And
        | O::Or
        | O::Xor
        | O::Not
        | O::Cnot
        | O::Shl
        | O::Shr
        | O::Setp
        | O::Selp
        | O::Set
        | O::Slct
        | O::Ex2
        | O::Lg2
        | O::Rcp
        | O::Sqrt
        | O::Rsqrt
        | O::Sin
        | O::Cos
        | O::Tanh
        | O::Popc
        | O::Clz
        | O::Brev
        | O::Bfe
        | O::Bfi
        | O::Bfind
        | O::Prmt
        | O::Lop3
        | O::Shf
        | O::Testp
        | O::Mul24
        | O::Mad24
        | O::Sad
        | O::Fns
        | O::Dp4a
        | O::Dp2a => compute(k, pc, inst, st, events, families),
    }
}

/// An ALU instruction: the index and address arithmetic `arith` models,
/// else data, with every pointer operand a misuse.
fn compute(
    k: &Kernel,
    pc: usize,
    inst: &Inst,
    st: &mut State,
    events: &mut BTreeMap<usize, Event>,
    families: Families,
) {
    let ops = &inst.ops;
    let int_inst = is_int(inst);
    let src = |i: usize| match ops.get(i).map_or(V::Top, |o| val(st, o)) {
        V::Const(_) if !int_inst => V::Top,
        v => v,
    };
    let (a, b) = (src(1), src(2));
    let r = match ops.len() {
        3 => arith(inst, a, b, None, reqntid(k), families.index32),
        4 => arith(inst, a, b, Some(src(3)), reqntid(k), families.index32),
        _ => None,
    };
    // A 64-bit index or offset computed from the 32-bit index is exact only
    // under `index_fits_i32`.
    let exact64 = matches!(r, Some(V::Index | V::Block64 | V::Scaled(_) | V::Addr(..)));
    let from32 = [a, b, src(3)]
        .iter()
        .any(|v| matches!(v, V::Index32 | V::Block32));
    if families.index32 && exact64 && from32 {
        events.entry(pc).or_insert(Event::Assume);
    }
    let r = match r {
        Some(v) => v,
        None => {
            let float = inst.types().first().is_some_and(|t| !t.is_int());
            for o in ops.iter().skip(1) {
                let v = val(st, o);
                if float && v.params().has_any() {
                    events.entry(pc).or_insert(Event::Bad {
                        sub_reason: SubReason::NonIntegerArithmetic,
                        param: v.pointer(),
                        explanation: format!(
                            "`{}` computes with a pointer at a non-integer type",
                            inst.opcode
                        ),
                    });
                }
                misuse(
                    events,
                    pc,
                    v,
                    format!("`{}` computes with a pointer or count param", inst.opcode),
                );
            }
            V::Top
        }
    };
    set(k, pc, st, ops.first(), r, events);
}

#[cfg(test)]
mod tests {
    use super::ParamSet;

    /// Every index the set admits keeps its own bit; every other index is
    /// refused rather than silently dropped (the old `u128` mask gave index
    /// 128 and up no bit at all).
    #[test]
    fn a_param_set_keeps_every_index_it_admits_and_refuses_the_rest() {
        for p in 0..ParamSet::CAPACITY {
            let s = ParamSet::single(p).unwrap_or_else(|| panic!("{p} has no bit"));
            assert_eq!(s.iter().collect::<Vec<_>>(), vec![p]);
            assert_eq!((s.first(), s.len(), s.contains(p)), (Some(p), 1, true));
        }
        for p in [ParamSet::CAPACITY, 129, 130, u16::MAX] {
            assert!(ParamSet::single(p).is_none(), "{p}");
        }
        let both =
            ParamSet::single(3).unwrap_or_default() | ParamSet::single(127).unwrap_or_default();
        assert_eq!(both.iter().collect::<Vec<_>>(), vec![3, 127]);
        assert!(ParamSet::EMPTY.is_empty() && both.has_any());
    }
}
