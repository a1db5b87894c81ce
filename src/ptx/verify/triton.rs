//! The Triton family: elementwise kernels as Triton and Inductor emit them,
//! proven from their dataflow and given a launch contract that states
//! exactly what the proof needs.
//!
//! Shape: pointers (`.u64`), a 32-bit count, by-value scalars (`.f32`,
//! `.f64`, `.u32`, `.s32`) in any order, then Triton's two scratch pointers
//! last; `.reqntid x`; every block covers `E` elements (`E` a multiple of
//! `x`), each thread a few of them, through `ld/st.global{,.v2,.v4}`
//! predicated on a mask `index < n` (or `index < K`, a literal, for a
//! static shape).
//!
//! Method: one forward pass in program order over the kernel's blocks (a
//! branch must go forward, so program order visits every block after all
//! its predecessors; states join at branch targets). Each register holds a
//! [`Val`]: data, an exact integer form over `ctaid.x` and `tid.x`
//! ([`super::affine`]), a param's pointer plus a byte offset form, a mask
//! predicate, or the 32-bit integer param it was loaded from.
//!
//! Invariants of an acceptance (what the contract is built from):
//! - Every global access goes through a pointer param (never a scratch
//!   pointer: `scratch_dereferenced`) at byte offset `s·M + d`, `d >= 0`,
//!   where `M < N` is the mask predicating it (`N` the count or a literal);
//!   `M` is a multiple of a power of two `g` with `d + width <= s·g`, so the
//!   access ends by `s × roundup(N, g)`: the operand's footprint. An access
//!   that fits none of this is `unbounded_access`, naming it; one whose
//!   address is not a multiple of its width is `non_elementwise_address`.
//! - Every 32-bit form that reached a compare, a widening or a narrowing
//!   is at most `2^31 - 1` once `grid × A <= 2^31` (`index_fits_i32`, `A`
//!   the largest `ctaid` coefficient among them): each has its `ctaid`
//!   coefficient at most `A` and its in-block part below `A`, else
//!   `index_not_exact`.
//! - A pointer is read through or written through, never both
//!   (`pointer_misuse`); exactly one is written (none: `no_output_store`;
//!   several: `pointer_misuse`, as the launch has one output); every other
//!   non-scratch pointer is read (`unused_input`). A pointer's bits never
//!   leave as data (`pointer_escape`) or feed anything but address
//!   arithmetic (`pointer_misuse`).
//! - Every mask compares with one bound: the same count param, or the same
//!   literal (`param_misuse`). A static-shape kernel's count param (its
//!   first 32-bit integer param, which the body never reads) is passed `n`.

use std::collections::BTreeMap;

use crate::ptx::contract::{
    BlockRule, Condition, ContractParam, Expr, Footprint, Geometry, ParamKind, PointerAccess,
    Precondition, ScalarType, COUNT_FITS_I32, INDEX_FITS_I32,
};
use crate::ptx::ir::{Base, Inst, Kernel, Opnd, Sreg, Ty};
use crate::ptx::parse::Imm;
use crate::ptx::{LaunchContract, PtxError, Signature};

use super::affine::{gcd, Int, Lin};
use super::{forward_target, refuse, Role, SubReason, Verified};

/// The work (register joins and instruction steps) a kernel may take,
/// per instruction: past it the kernel is `too_complex`.
const WORK_PER_INSTRUCTION: usize = 4096;

/// What a param is, from its declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decl {
    Pointer,
    Int32(ScalarType),
    Float(ScalarType),
    Scratch,
}

/// Whether `k` has the Triton family's shape: `.reqntid`, a 32-bit integer
/// param, and two trailing `.u64` params (the scratch pointers). The
/// scalar ABI's kernels never have it (their integers are 64-bit but for
/// a last `int n`, and nothing follows their floats but floats).
pub(super) fn shaped(k: &Kernel) -> bool {
    let n = k.params.len();
    n >= 3
        && k.reqntid.is_some()
        && k.params[n - 2..]
            .iter()
            .all(|p| is_u64(&p.ty) && p.array.is_none())
        && k.params[..n - 2]
            .iter()
            .any(|p| matches!(p.ty.as_str(), "u32" | "s32" | "b32"))
}

fn is_u64(ty: &str) -> bool {
    matches!(ty, "u64" | "b64" | "s64")
}

fn declarations(k: &Kernel) -> Result<Vec<Decl>, PtxError> {
    let n = k.params.len();
    k.params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if p.array.is_some() {
                return Err(refuse(
                    SubReason::ParamType,
                    Some(&p.name),
                    Some(p.line),
                    "a by-value aggregate param",
                ));
            }
            Ok(match p.ty.as_str() {
                _ if i + 2 >= n => Decl::Scratch,
                "u64" | "b64" | "s64" => Decl::Pointer,
                "u32" | "b32" => Decl::Int32(ScalarType::U32),
                "s32" => Decl::Int32(ScalarType::S32),
                "f32" => Decl::Float(ScalarType::F32),
                "f64" => Decl::Float(ScalarType::F64),
                other => {
                    return Err(refuse(
                        SubReason::ParamType,
                        Some(&p.name),
                        Some(p.line),
                        format!("a `.{other}` param: the Triton family takes pointers, 32-bit integers and floats"),
                    ))
                }
            })
        })
        .collect()
}

/// What a mask compares its index with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Bound {
    /// A 32-bit integer param (the count).
    Param(u16),
    /// A literal (a static shape), clamped at 0.
    Const(u64),
}

/// `index < bound`, per lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Mask {
    index: Lin,
    bound: Bound,
}

/// What a register provably holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Val {
    /// Never written on the path (defined-before-use is `defined.rs`'s).
    Undef,
    Data,
    Int(Int),
    /// The value of a 32-bit integer param.
    ParamInt(u16),
    /// Pointer param `param` plus `off` bytes.
    Ptr {
        param: u16,
        off: Lin,
    },
    /// May hold pointer `param`'s bits at an unknown offset: never an
    /// address, never data.
    PtrAny(u16),
    Mask(Mask),
}

impl Val {
    fn pointer(self) -> Option<u16> {
        match self {
            Val::Ptr { param, .. } | Val::PtrAny(param) => Some(param),
            _ => None,
        }
    }

    fn join(self, o: Val) -> Val {
        match (self, o) {
            (a, b) if a == b => a,
            (Val::Undef, x) | (x, Val::Undef) => x,
            (a, b) => match a.pointer().or(b.pointer()) {
                Some(p) => Val::PtrAny(p),
                None => Val::Data,
            },
        }
    }
}

/// One global access.
struct Access {
    pc: usize,
    param: u16,
    store: bool,
    off: Lin,
    width: u32,
    mask: Option<Mask>,
}

/// What the pass saw.
#[derive(Default)]
struct Facts {
    accesses: Vec<Access>,
    /// 32-bit forms that must be exact, with where.
    exact: Vec<(usize, Lin)>,
}

struct Pass<'k> {
    k: &'k Kernel,
    decls: &'k [Decl],
    block: u32,
    facts: Facts,
}

type State = Vec<Val>;

fn join_into(into: &mut Option<State>, from: State) {
    match into {
        Some(s) => {
            for (a, b) in s.iter_mut().zip(from) {
                *a = a.join(b);
            }
        }
        None => *into = Some(from),
    }
}

/// Verifies a kernel [`shaped`] like Triton's; `block` is its `.reqntid`.
pub(super) fn verify(k: &Kernel, block: u32) -> Result<Verified, PtxError> {
    let decls = declarations(k)?;
    let mut pass = Pass {
        k,
        decls: &decls,
        block,
        facts: Facts::default(),
    };
    pass.run()?;
    decide(k, &decls, block, pass.facts)
}

impl Pass<'_> {
    fn line(&self, pc: usize) -> Option<u32> {
        self.k.insts.get(pc).map(|i| i.line)
    }

    fn name(&self, p: u16) -> Option<&str> {
        self.k.params.get(usize::from(p)).map(|x| x.name.as_str())
    }

    fn run(&mut self) -> Result<(), PtxError> {
        let nregs = self.k.reg_types.len();
        let budget = self
            .k
            .insts
            .len()
            .saturating_add(1)
            .saturating_mul(WORK_PER_INSTRUCTION);
        let mut work = 0usize;
        let mut state: Option<State> = Some(vec![Val::Undef; nregs]);
        let mut pending: BTreeMap<usize, State> = BTreeMap::new();
        for (pc, inst) in self.k.insts.iter().enumerate() {
            if let Some(s) = pending.remove(&pc) {
                work = work.saturating_add(nregs);
                join_into(&mut state, s);
            }
            work = work.saturating_add(1);
            if work > budget {
                return Err(refuse(
                    SubReason::TooComplex,
                    None,
                    Some(inst.line),
                    "the analysis does not settle within work linear in the kernel's size",
                ));
            }
            let Some(st) = state.as_mut() else {
                continue;
            };
            match inst.base.as_str() {
                "bra" => {
                    let t = forward_target(inst, pc, "Triton")?;
                    work = work.saturating_add(nregs);
                    let mut slot = pending.remove(&t);
                    join_into(&mut slot, st.clone());
                    if let Some(s) = slot {
                        pending.insert(t, s);
                    }
                    if inst.guard.is_none() {
                        state = None;
                    }
                }
                "ret" | "exit" => {
                    if inst.guard.is_none() {
                        state = None;
                    }
                }
                _ => {
                    let guard = inst
                        .guard
                        .map(|(neg, r)| (neg, st.get(r as usize).copied().unwrap_or(Val::Data)));
                    let writes = self.step(pc, inst, st, guard)?;
                    for (r, v) in writes {
                        let Some(slot) = st.get_mut(r as usize) else {
                            continue;
                        };
                        *slot = if inst.guard.is_some() {
                            slot.join(v)
                        } else {
                            v
                        };
                    }
                }
            }
        }
        Ok(())
    }

    fn read(&self, st: &State, o: &Opnd) -> Val {
        read(self.block, st, o)
    }

    /// Every register an instruction reads (its sources, address bases,
    /// the parts of a vector or pair it reads), with its value.
    fn reads(&self, st: &State, inst: &Inst) -> Vec<Val> {
        let sources: &[Opnd] = if inst.base == "st" {
            &inst.ops
        } else {
            inst.ops.get(1..).unwrap_or(&[])
        };
        let mut out = Vec::new();
        let mut push = |o: &Opnd| match o {
            Opnd::Reg(r) | Opnd::Not(r) => {
                out.push(st.get(*r as usize).copied().unwrap_or(Val::Data))
            }
            Opnd::Pair(a, b) => {
                out.push(st.get(*a as usize).copied().unwrap_or(Val::Data));
                out.push(st.get(*b as usize).copied().unwrap_or(Val::Data));
            }
            Opnd::Addr {
                base: Base::Reg(r), ..
            } => out.push(st.get(*r as usize).copied().unwrap_or(Val::Data)),
            _ => {}
        };
        for o in sources {
            if let Opnd::List(items) = o {
                items.iter().for_each(&mut push);
            } else {
                push(o);
            }
        }
        out
    }

    /// The destinations of a data result.
    fn data_writes(inst: &Inst) -> Vec<(u32, Val)> {
        super::instructions::destinations(inst)
            .into_iter()
            .map(|r| (r, Val::Data))
            .collect()
    }

    fn one(inst: &Inst, v: Val) -> Vec<(u32, Val)> {
        match inst.ops.first() {
            Some(Opnd::Reg(r)) => vec![(*r, v)],
            _ => Pass::data_writes(inst),
        }
    }

    /// A pointer read anywhere by an instruction the pass does not model
    /// as address arithmetic: refused.
    fn no_pointer(&self, pc: usize, inst: &Inst, st: &State) -> Result<(), PtxError> {
        if let Some(p) = self.reads(st, inst).iter().find_map(|v| v.pointer()) {
            let escape = matches!(inst.base.as_str(), "st" | "mov" | "cvt");
            return Err(refuse(
                if escape {
                    SubReason::PointerEscape
                } else {
                    SubReason::PointerMisuse
                },
                self.name(p),
                self.line(pc),
                format!(
                    "`{}` reads a pointer as {}",
                    inst.opcode,
                    if escape { "data" } else { "an operand" }
                ),
            ));
        }
        Ok(())
    }

    /// Records that the 32-bit form `i` must be exact.
    fn exact(&mut self, pc: usize, i: Int) {
        if !i.wide {
            self.facts.exact.push((pc, i.lin));
        }
    }

    fn step(
        &mut self,
        pc: usize,
        inst: &Inst,
        st: &State,
        guard: Option<(bool, Val)>,
    ) -> Result<Vec<(u32, Val)>, PtxError> {
        let types = inst.types();
        let ty = types.last().copied().unwrap_or(Ty::Other);
        let wide = ty.bits() == 64;
        let int_ty = ty.is_int() && matches!(ty.bits(), 32 | 64);
        let block = self.block;
        let src = |i: usize| inst.ops.get(i).map_or(Val::Data, |o| read(block, st, o));
        // An integer operand at this instruction's width (immediates take
        // it).
        let int = |v: Val, wide: bool| match v {
            Val::Int(i) if i.wide == wide => Some(i),
            // A literal fits the width it is read at.
            Val::Int(i) if i.lin.is_constant() && (wide || i.lin.c <= u64::from(u32::MAX)) => {
                i.with_width(wide)
            }
            _ => None,
        };
        let imm = |i: usize| match inst.ops.get(i) {
            Some(Opnd::Imm(Imm::Int(v))) => u64::try_from(*v).ok(),
            _ => None,
        };
        match inst.base.as_str() {
            "ld" | "ldu" if inst.has("param") => self.param_load(pc, inst, ty),
            "ld" | "ldu" | "st" => self.access(pc, inst, st, guard),
            "mov" if int_ty && matches!(inst.ops.first(), Some(Opnd::Reg(_))) => {
                let v = src(1);
                let out = match v {
                    Val::Ptr { .. } | Val::PtrAny(_) if wide => v,
                    Val::Ptr { .. } | Val::PtrAny(_) => {
                        self.no_pointer(pc, inst, st)?;
                        Val::Data
                    }
                    Val::ParamInt(_) if !wide => v,
                    _ => int(v, wide).map_or(Val::Data, Val::Int),
                };
                Ok(Pass::one(inst, out))
            }
            "cvt" => {
                self.no_pointer(pc, inst, st)?;
                let (Some(to), Some(from)) = (types.first(), types.get(1)) else {
                    return Ok(Pass::data_writes(inst));
                };
                let ints = to.is_int() && from.is_int();
                let v = match (src(1), ints, to.bits(), from.bits()) {
                    (Val::Int(i), true, 64, 32) if !i.wide => {
                        self.exact(pc, i);
                        i.with_width(true).map_or(Val::Data, Val::Int)
                    }
                    (Val::Int(i), true, 32, 64) if i.wide => match i.with_width(false) {
                        Some(n) => {
                            self.exact(pc, n);
                            Val::Int(n)
                        }
                        None => Val::Data,
                    },
                    _ => Val::Data,
                };
                Ok(Pass::one(inst, v))
            }
            "shl" if int_ty => {
                self.no_pointer(pc, inst, st)?;
                let v = match (int(src(1), wide), imm(2)) {
                    (Some(a), Some(k)) => u32::try_from(k)
                        .ok()
                        .and_then(|k| a.shl(k))
                        .map_or(Val::Data, Val::Int),
                    _ => Val::Data,
                };
                Ok(Pass::one(inst, v))
            }
            "and" | "or" if int_ty => {
                self.no_pointer(pc, inst, st)?;
                let (a, b) = (int(src(1), wide), int(src(2), wide));
                let v = match (inst.base.as_str(), a, b) {
                    ("and", Some(a), Some(b)) if b.lin.is_constant() => a.and(b.lin.c),
                    ("and", Some(a), Some(b)) if a.lin.is_constant() => b.and(a.lin.c),
                    ("or", Some(a), Some(b)) => a.or(b),
                    _ => None,
                };
                Ok(Pass::one(inst, v.map_or(Val::Data, Val::Int)))
            }
            "add" if int_ty => {
                let (a, b) = (src(1), src(2));
                let v = match (a, b) {
                    (Val::Ptr { param, off }, o) | (o, Val::Ptr { param, off }) if wide => {
                        match int(o, true)
                            .and_then(|i| off.add(i.lin))
                            .filter(|l| l.small())
                        {
                            Some(off) => Val::Ptr { param, off },
                            None => Val::PtrAny(param),
                        }
                    }
                    (Val::PtrAny(p), _) | (_, Val::PtrAny(p)) if wide => Val::PtrAny(p),
                    _ => {
                        self.no_pointer(pc, inst, st)?;
                        match (int(a, wide), int(b, wide)) {
                            (Some(a), Some(b)) => a.add(b).map_or(Val::Data, Val::Int),
                            _ => Val::Data,
                        }
                    }
                };
                Ok(Pass::one(inst, v))
            }
            "mul" | "mad" if ty.is_int() && (inst.has("lo") || inst.has("wide")) => {
                let widening = inst.has("wide");
                let source_wide = wide && !widening;
                let product = match (int(src(1), source_wide), imm(2)) {
                    (Some(a), Some(k)) if !widening || ty.bits() == 32 => {
                        if widening {
                            self.exact(pc, a);
                        }
                        a.mul(k, widening || wide)
                    }
                    _ => None,
                };
                let v = if inst.base == "mul" {
                    self.no_pointer(pc, inst, st)?;
                    product.map_or(Val::Data, Val::Int)
                } else {
                    match (product, src(3)) {
                        (Some(p), Val::Ptr { param, off }) if p.wide => {
                            match off.add(p.lin).filter(|l| l.small()) {
                                Some(off) => Val::Ptr { param, off },
                                None => Val::PtrAny(param),
                            }
                        }
                        (_, Val::Ptr { param, .. } | Val::PtrAny(param)) => Val::PtrAny(param),
                        (Some(p), c) => {
                            self.no_pointer(pc, inst, st)?;
                            match int(c, p.wide) {
                                Some(c) => p.add(c).map_or(Val::Data, Val::Int),
                                None => Val::Data,
                            }
                        }
                        (None, _) => {
                            self.no_pointer(pc, inst, st)?;
                            Val::Data
                        }
                    }
                };
                Ok(Pass::one(inst, v))
            }
            "setp" => {
                self.no_pointer(pc, inst, st)?;
                // A combined compare (`setp.lt.or.s32 p, a, b, q` is
                // `(a < b) || q`; `.xor` may invert it, `.and` narrows it)
                // is no mask: only the plain three-operand form is `a < b`.
                let combined = inst.ops.len() != 3
                    || inst
                        .mods
                        .iter()
                        .any(|m| matches!(m.as_str(), "and" | "or" | "xor"));
                let v = match (inst.mods.first().map(String::as_str), ty) {
                    _ if combined => Val::Data,
                    (Some("lt"), Ty::S32 | Ty::U32) => match (int(src(1), false), src(2)) {
                        (Some(a), Val::ParamInt(p)) => {
                            self.exact(pc, a);
                            Val::Mask(Mask {
                                index: a.lin,
                                bound: Bound::Param(p),
                            })
                        }
                        (Some(a), b) => match (b, inst.ops.get(2)) {
                            (Val::Int(_), Some(Opnd::Imm(Imm::Int(k)))) => {
                                self.exact(pc, a);
                                // The literal as the compare reads it.
                                let k = if ty == Ty::S32 {
                                    i64::from(*k as i32)
                                } else {
                                    i64::from(*k as u32)
                                };
                                Val::Mask(Mask {
                                    index: a.lin,
                                    bound: Bound::Const(u64::try_from(k).unwrap_or(0)),
                                })
                            }
                            _ => Val::Data,
                        },
                        _ => Val::Data,
                    },
                    _ => Val::Data,
                };
                Ok(Pass::one(inst, v))
            }
            _ => {
                self.no_pointer(pc, inst, st)?;
                Ok(Pass::data_writes(inst))
            }
        }
    }

    fn param_load(&mut self, pc: usize, inst: &Inst, ty: Ty) -> Result<Vec<(u32, Val)>, PtxError> {
        let Some(Opnd::Addr {
            base: Base::Param(p),
            offset,
        }) = inst.ops.get(1)
        else {
            return Err(refuse(
                SubReason::ParamOutOfRange,
                None,
                self.line(pc),
                "a param load whose address is no param",
            ));
        };
        let decl = self.decls.get(usize::from(*p)).copied();
        let size = match decl {
            Some(Decl::Pointer | Decl::Scratch) => 8,
            Some(Decl::Int32(_)) => 4,
            Some(Decl::Float(ScalarType::F64)) => 8,
            Some(Decl::Float(_)) => 4,
            None => 0,
        };
        if *offset != 0 || ty.bytes() != size {
            return Err(refuse(
                SubReason::ParamOutOfRange,
                self.name(*p),
                self.line(pc),
                format!(
                    "a {}-byte load at offset {offset} of a {size}-byte param: the whole param or nothing",
                    ty.bytes()
                ),
            ));
        }
        let v = match decl {
            Some(Decl::Pointer | Decl::Scratch) => Val::Ptr {
                param: *p,
                off: Lin::constant(0),
            },
            Some(Decl::Int32(_)) => Val::ParamInt(*p),
            _ => Val::Data,
        };
        Ok(Pass::one(inst, v))
    }

    fn access(
        &mut self,
        pc: usize,
        inst: &Inst,
        st: &State,
        guard: Option<(bool, Val)>,
    ) -> Result<Vec<(u32, Val)>, PtxError> {
        let store = inst.base == "st";
        if !inst.has("global") {
            return Err(refuse(
                SubReason::NonGlobalMemory,
                None,
                self.line(pc),
                format!(
                    "`{}`: the Triton family accesses global memory only",
                    inst.opcode
                ),
            ));
        }
        let (addr, data) = if store { (0, 1) } else { (1, 0) };
        if store {
            // The stored values: data, never a pointer's bits.
            let stored = match inst.ops.get(data) {
                Some(Opnd::List(items)) => items.iter().map(|o| self.read(st, o)).collect(),
                Some(o) => vec![self.read(st, o)],
                None => vec![],
            };
            if let Some(p) = stored.iter().find_map(|v| v.pointer()) {
                return Err(refuse(
                    SubReason::PointerEscape,
                    self.name(p),
                    self.line(pc),
                    "a pointer stored as data",
                ));
            }
        }
        let Some(Opnd::Addr {
            base: Base::Reg(r),
            offset,
        }) = inst.ops.get(addr)
        else {
            return Err(refuse(
                SubReason::UnboundedAccess,
                None,
                self.line(pc),
                format!("`{}` at an address that is no register", inst.opcode),
            ));
        };
        let lanes = if inst.has("v4") {
            4
        } else if inst.has("v2") {
            2
        } else {
            1
        };
        let ty = inst.types().last().copied().unwrap_or(Ty::Other);
        let width = lanes * ty.bytes();
        let (param, off) = match st.get(*r as usize).copied() {
            Some(Val::Ptr { param, off }) => match u64::try_from(*offset)
                .ok()
                .and_then(|o| off.add(Lin::constant(o)))
            {
                Some(off) => (param, off),
                None => {
                    return Err(refuse(
                        SubReason::UnboundedAccess,
                        self.name(param),
                        self.line(pc),
                        format!("`{}` at a negative or unbounded offset", inst.opcode),
                    ))
                }
            },
            other => {
                return Err(refuse(
                    SubReason::UnboundedAccess,
                    other.and_then(Val::pointer).and_then(|p| self.name(p)),
                    self.line(pc),
                    format!(
                        "`{}` at an address the proof cannot bound (not a pointer param plus an index form)",
                        inst.opcode
                    ),
                ))
            }
        };
        if width == 0 {
            return Err(refuse(
                SubReason::UnboundedAccess,
                self.name(param),
                self.line(pc),
                format!("`{}`: an access of no modelled width", inst.opcode),
            ));
        }
        let mask = match guard {
            Some((false, Val::Mask(m))) => Some(m),
            _ => None,
        };
        self.facts.accesses.push(Access {
            pc,
            param,
            store,
            off,
            width,
            mask,
        });
        Ok(if store {
            vec![]
        } else {
            Pass::data_writes(inst)
        })
    }
}

/// One pointer's accesses, summed up.
#[derive(Default, Clone, Copy)]
struct Use {
    read: bool,
    written: bool,
    element: Option<u64>,
    granule: u64,
    align: u32,
}

fn decide(k: &Kernel, decls: &[Decl], block: u32, facts: Facts) -> Result<Verified, PtxError> {
    let name = |p: u16| k.params.get(usize::from(p)).map(|x| x.name.as_str());
    let line = |pc: usize| k.insts.get(pc).map(|i| i.line);
    let mut uses = vec![Use::default(); decls.len()];
    let mut bound: Option<Bound> = None;
    let mut elements_per_block = 0u64;
    for a in &facts.accesses {
        let at = line(a.pc);
        let what = if a.store { "store" } else { "load" };
        if decls.get(usize::from(a.param)) == Some(&Decl::Scratch) {
            return Err(refuse(
                SubReason::ScratchDereferenced,
                name(a.param),
                at,
                format!("a {what} through a scratch pointer, which ptxd passes as null"),
            ));
        }
        let Some(m) = a.mask else {
            return Err(refuse(
                SubReason::UnguardedAccess,
                name(a.param),
                at,
                format!("a {what} not predicated on an `index < n` mask"),
            ));
        };
        let unbounded = |why: String| refuse(SubReason::UnboundedAccess, name(a.param), at, why);
        // The offset as `s·M + d`.
        let (mi, o) = (m.index, a.off);
        let s = match (mi.ctaid, mi.tid) {
            (0, 0) => None,
            (c, _) if c != 0 => (o.ctaid % c == 0).then(|| o.ctaid / c),
            (_, t) => (o.tid % t == 0).then(|| o.tid / t),
        };
        let s = s.filter(|&s| {
            s >= 1
                && mi.ctaid.checked_mul(s) == Some(o.ctaid)
                && mi.tid.checked_mul(s) == Some(o.tid)
        });
        let Some(s) = s else {
            return Err(unbounded(format!(
                "a {what} at byte offset {} that is no multiple of its mask's index {}",
                show(o),
                show(mi)
            )));
        };
        let Some(d) = mi.c.checked_mul(s).and_then(|sc| o.c.checked_sub(sc)) else {
            return Err(unbounded(format!(
                "a {what} before its mask's element (offset {} for index {})",
                show(o),
                show(mi)
            )));
        };
        let g = mi.stride_gcd();
        let h = gcd(g, mi.c % g.max(1));
        let end = d.saturating_add(u64::from(a.width));
        let mut granule = 1u64;
        while end > s.saturating_mul(granule) {
            granule = granule.saturating_mul(2);
            if !h.is_multiple_of(granule) || granule > 1 << 20 {
                return Err(unbounded(format!(
                    "a {}-byte {what} runs past its masked element: the mask `{} < n` does not bound it",
                    a.width,
                    show(mi)
                )));
            }
        }
        let align = gcd(gcd(o.ctaid, o.tid), o.c);
        if !a.width.is_power_of_two() || !align.is_multiple_of(u64::from(a.width)) {
            return Err(refuse(
                SubReason::NonElementwiseAddress,
                name(a.param),
                at,
                format!(
                    "a {}-byte {what} at byte offset {}: not a multiple of its width",
                    a.width,
                    show(o)
                ),
            ));
        }
        match bound {
            Some(b) if b != m.bound => {
                return Err(refuse(
                    SubReason::ParamMisuse,
                    match m.bound {
                        Bound::Param(p) => name(p),
                        Bound::Const(_) => None,
                    },
                    at,
                    "masks compare with different bounds",
                ))
            }
            _ => bound = Some(m.bound),
        }
        elements_per_block = elements_per_block.max(mi.ctaid);
        let u = &mut uses[usize::from(a.param)];
        if u.element.is_some_and(|e| e != s) {
            return Err(refuse(
                SubReason::NonElementwiseAddress,
                name(a.param),
                at,
                "accesses of different element sizes through one pointer",
            ));
        }
        u.element = Some(s);
        u.granule = u.granule.max(granule);
        u.align = u.align.max(a.width);
        if a.store {
            u.written = true;
        } else {
            u.read = true;
        }
        if u.read && u.written {
            return Err(refuse(
                SubReason::PointerMisuse,
                name(a.param),
                at,
                "a pointer both read and written: the launch's operands are inputs and one output",
            ));
        }
    }
    // Exactness of every 32-bit form that was compared, widened or narrowed.
    let a_max = facts.exact.iter().map(|(_, l)| l.ctaid).max().unwrap_or(0);
    for (pc, l) in &facts.exact {
        let limit = if a_max == 0 { (1 << 31) - 1 } else { a_max - 1 };
        if l.within_block(block).is_none_or(|r| r > limit) || a_max > 1 << 31 {
            return Err(refuse(
                SubReason::IndexNotExact,
                None,
                line(*pc),
                format!(
                    "the 32-bit index {} cannot be shown exact by `grid × {a_max} <= 2^31`",
                    show(*l)
                ),
            ));
        }
    }
    if elements_per_block == 0 || !elements_per_block.is_multiple_of(u64::from(block)) {
        return Err(refuse(
            SubReason::NonElementwiseAddress,
            None,
            Some(k.line),
            format!(
                "a block covers {elements_per_block} elements: not a multiple of its {block} threads"
            ),
        ));
    }
    let ept = u32::try_from(elements_per_block / u64::from(block)).unwrap_or(u32::MAX);
    // The count: the masks' param, or (static shapes) the first 32-bit
    // integer param.
    let count = match bound {
        Some(Bound::Param(p)) => Some(p),
        _ => decls
            .iter()
            .position(|d| matches!(d, Decl::Int32(_)))
            .and_then(|p| u16::try_from(p).ok()),
    };
    let Some(count) = count else {
        return Err(refuse(
            SubReason::MissingParams,
            None,
            Some(k.line),
            "no 32-bit count param",
        ));
    };
    let mut params = Vec::with_capacity(decls.len());
    let mut roles = Vec::with_capacity(decls.len());
    let (mut inputs, mut outputs, mut scalars) = (Vec::new(), Vec::new(), 0u32);
    for (i, d) in decls.iter().enumerate() {
        let p = u16::try_from(i).unwrap_or(u16::MAX);
        let u = uses[i];
        let kind = match d {
            Decl::Scratch => ParamKind::Pointer {
                access: PointerAccess::UnusedNull,
                operand: None,
            },
            Decl::Pointer if u.read => {
                inputs.push(p);
                ParamKind::Pointer {
                    access: PointerAccess::Read,
                    operand: None,
                }
            }
            Decl::Pointer if u.written => {
                outputs.push(p);
                ParamKind::Pointer {
                    access: PointerAccess::Written,
                    operand: None,
                }
            }
            Decl::Pointer => {
                return Err(refuse(
                    SubReason::UnusedInput,
                    name(p),
                    k.params.get(i).map(|x| x.line),
                    "a pointer param never read or written",
                ))
            }
            Decl::Int32(t) if p == count => ParamKind::Count(*t),
            Decl::Int32(t) | Decl::Float(t) => {
                scalars += 1;
                ParamKind::Scalar(*t)
            }
        };
        params.push(ContractParam {
            name: name(p).unwrap_or("?").to_string(),
            kind,
        });
    }
    let output = match outputs.as_slice() {
        [o] => *o,
        [] => {
            return Err(refuse(
                SubReason::NoOutputStore,
                None,
                Some(k.line),
                "no pointer is stored through",
            ))
        }
        [_, second, ..] => {
            return Err(refuse(
                SubReason::PointerMisuse,
                name(*second),
                None,
                "several pointers are stored through: the launch has one output",
            ))
        }
    };
    let operands: Vec<u16> = inputs.iter().copied().chain([output]).collect();
    let mut footprints = Vec::with_capacity(operands.len());
    let mut element_sizes = Vec::with_capacity(operands.len());
    for (k_op, p) in operands.iter().enumerate() {
        let u = uses[usize::from(*p)];
        let s = u.element.unwrap_or(1);
        if let Some(ParamKind::Pointer { operand, .. }) =
            params.get_mut(usize::from(*p)).map(|c| &mut c.kind)
        {
            *operand = u32::try_from(k_op).ok();
        }
        let bytes = match bound {
            Some(Bound::Const(n)) => {
                let rounded = n.div_ceil(u.granule).checked_mul(u.granule);
                match rounded.and_then(|r| r.checked_mul(s)) {
                    Some(b) => Expr::Const(b),
                    None => {
                        return Err(refuse(
                            SubReason::UnboundedAccess,
                            name(*p),
                            None,
                            "a static footprint past 2^64 bytes",
                        ))
                    }
                }
            }
            _ if u.granule == 1 => Expr::product(Expr::Count, Expr::Const(s)),
            _ => Expr::product(
                Expr::RoundUp(Box::new(Expr::Count), u.granule),
                Expr::Const(s),
            ),
        };
        element_sizes.push(u32::try_from(s).unwrap_or(u32::MAX));
        footprints.push(Footprint {
            param: *p,
            alignment: u.align,
            bytes,
        });
    }
    let mut scalar_k = 0u32;
    for (i, c) in params.iter().enumerate() {
        let p = u16::try_from(i).unwrap_or(u16::MAX);
        match c.kind {
            ParamKind::Pointer {
                access: PointerAccess::UnusedNull,
                ..
            } => {}
            ParamKind::Pointer { .. } if p == output => roles.push(Role::Output),
            ParamKind::Pointer { operand, .. } => roles.push(Role::Input(operand.unwrap_or(0))),
            ParamKind::Count(_) => roles.push(Role::Count),
            ParamKind::Scalar(_) => {
                roles.push(Role::Scalar(scalar_k));
                scalar_k += 1;
            }
        }
    }
    let mut preconditions = vec![Precondition {
        name: COUNT_FITS_I32,
        condition: Condition::AtMost(Expr::Count, (1 << 31) - 1),
    }];
    if a_max > 0 {
        preconditions.push(Precondition {
            name: INDEX_FITS_I32,
            condition: Condition::AtMost(Expr::product(Expr::Grid, Expr::Const(a_max)), 1 << 31),
        });
    }
    let contract = LaunchContract {
        params,
        geometry: Geometry {
            block: BlockRule::Required(block),
            elements_per_thread: ept,
        },
        footprints,
        preconditions,
    };
    let signature = Signature {
        inputs: u32::try_from(inputs.len()).unwrap_or(u32::MAX),
        element_sizes,
        scalar_params: scalars,
        reqntid: Some(block),
        maxntid: None,
    };
    Ok(Verified {
        signature,
        roles,
        contract,
    })
}

/// A source operand's value.
fn read(block: u32, st: &State, o: &Opnd) -> Val {
    match o {
        Opnd::Reg(r) => st.get(*r as usize).copied().unwrap_or(Val::Data),
        Opnd::Imm(Imm::Int(v)) => Int::constant(*v, true).map_or(Val::Data, Val::Int),
        Opnd::Sreg(Sreg::Ctaid(0)) => Val::Int(Int::ctaid()),
        Opnd::Sreg(Sreg::Tid(0)) => Val::Int(Int::tid(block)),
        _ => Val::Data,
    }
}

fn show(l: Lin) -> String {
    format!("{}·ctaid + {}·tid + {}", l.ctaid, l.tid, l.c)
}
