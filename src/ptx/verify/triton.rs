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
//! predicate, the 32-bit integer param it was loaded from, or a step of
//! a remainder (`x mod D`, a pointer plus one, LLVM's tests on the way).
//! A state also carries the 64-bit params its path's branches showed to
//! be below `2^32`.
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
//! - A kernel with no mask at all whose body reads no 32-bit param (a
//!   static shape of full blocks) may access at byte offset `B·ctaid +
//!   b·tid + c` when `b·(block - 1) + c + width <= B`: block `k` touches
//!   only `[B·k, B·(k + 1))`, so the grid bounds the footprint.
//! - Broadcasts: an access at `scale · (x mod D) + c` is a load that ends
//!   by `scale · D` (`c + width <= scale · align`), through a pointer
//!   accessed at no index form. `D` is a power of two (LLVM's signed
//!   remainder of an index whose sign was shown 0, whatever its bits) or a
//!   64-bit param (`rem` of the index by it, 32-bit only on a branch edge
//!   that showed it below `2^32`), then a by-value scalar never
//!   dereferenced (`pointer_misuse`) with `divisor_positive` in the
//!   contract.

use std::collections::{BTreeMap, BTreeSet};

use crate::ptx::contract::{
    BlockRule, Condition, ContractParam, Expr, Footprint, Geometry, ParamKind, PointerAccess,
    Precondition, ScalarType, COUNT_FITS_I32, DIVISOR_POSITIVE, INDEX_FITS_I32,
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
    /// The low 32 bits of a 64-bit param's value (which makes it an
    /// integer, never a pointer).
    ParamLow(u16),
    /// `param | x`, 64 bits: the first step of LLVM's test that a 64-bit
    /// remainder may take the 32-bit path.
    ParamOr(u16),
    /// `(param | x) & m`, `m` keeping every bit from 32 up: zero only when
    /// the param is below `2^32`.
    ParamHigh(u16),
    /// A predicate that, equal to `when`, shows `param < 2^32` (the
    /// param's high half was 0).
    Fits {
        param: u16,
        when: bool,
    },
    /// `x & -2^k` at `x`'s width.
    RoundDown {
        x: Int,
        k: u32,
    },
    /// An integer `scale · r + c` with `r = x mod D` in `[0, D)`.
    Rem(Rem),
    /// Pointer param `param` plus `rem` bytes.
    PtrRem {
        param: u16,
        rem: Rem,
    },
}

/// What a remainder divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Divisor {
    /// A power of two (LLVM's signed remainder of a non-negative index).
    Const(u64),
    /// A 64-bit param the contract requires at least 1
    /// (`divisor_positive`): `rem` by zero has no specified value.
    Param(u16),
}

/// `scale · r + c`, where `r = x mod D` lies in `[0, D)` and is a multiple
/// of `align` (which divides a constant `D`; 1 for a param's). A narrow
/// one is a 32-bit register's value; for a constant `D` its largest value
/// is below `2^31`, for a param's it is `r` itself (below `2^32`: the
/// 32-bit path runs only when the param is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Rem {
    div: Divisor,
    scale: u64,
    c: u64,
    align: u64,
    wide: bool,
}

impl Rem {
    /// `r` itself.
    fn of(div: Divisor, align: u64, wide: bool) -> Rem {
        Rem {
            div,
            scale: 1,
            c: 0,
            align,
            wide,
        }
    }

    /// The largest value, for a constant divisor.
    fn max(self) -> Option<u64> {
        match self.div {
            Divisor::Const(d) => d
                .checked_sub(self.align)?
                .checked_mul(self.scale)?
                .checked_add(self.c),
            Divisor::Param(_) => None,
        }
    }

    /// Whether a 32-bit register holds it exactly as a signed (or, with
    /// `unsigned`, an unsigned) value: then widening it is exact.
    fn exact_narrow(self, unsigned: bool) -> bool {
        match self.div {
            Divisor::Const(_) => self.max().is_some_and(|m| m < 1 << 31),
            Divisor::Param(_) => unsigned && self.scale == 1 && self.c == 0,
        }
    }

    /// `self · k`: a narrow one only while its largest value stays below
    /// `2^31`; a wide one with a param's divisor may grow past 64 bits
    /// only where its footprint (`D × scale`) does too, which the launch
    /// check refuses.
    fn scaled(self, k: u64, wide: bool) -> Option<Rem> {
        let r = Rem {
            scale: self.scale.checked_mul(k)?,
            c: self.c.checked_mul(k)?,
            wide,
            ..self
        };
        (wide || r.exact_narrow(false)).then_some(r)
    }

    /// `self + k`, under the same rule as [`Rem::scaled`].
    fn plus(self, k: u64) -> Option<Rem> {
        let r = Rem {
            c: self.c.checked_add(k)?,
            ..self
        };
        (r.wide || r.exact_narrow(false)).then_some(r)
    }
}

impl Val {
    fn pointer(self) -> Option<u16> {
        match self {
            Val::Ptr { param, .. } | Val::PtrAny(param) | Val::PtrRem { param, .. } => Some(param),
            _ => None,
        }
    }

    /// The 64-bit param itself (a pointer param at offset 0), which may
    /// turn out to be an integer param.
    fn raw_param(self) -> Option<u16> {
        match self {
            Val::Ptr { param, off } if off == Lin::constant(0) => Some(param),
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
    /// At `rem` bytes (then `off` is unused) instead.
    rem: Option<Rem>,
    width: u32,
    mask: Option<Mask>,
}

/// What the pass saw.
#[derive(Default)]
struct Facts {
    accesses: Vec<Access>,
    /// 32-bit forms that must be exact, with where.
    exact: Vec<(usize, Lin)>,
    /// 64-bit params read as integers (never dereferenced), with where.
    integers: BTreeMap<u16, usize>,
    /// Those a remainder divides by.
    divisors: BTreeSet<u16>,
    /// Whether the body loads a 32-bit integer param (a count).
    count_read: bool,
}

struct Pass<'k> {
    k: &'k Kernel,
    decls: &'k [Decl],
    block: u32,
    facts: Facts,
}

/// The registers on a path, and the 64-bit params the path's branches
/// showed to be below `2^32` (bit `p` for param `p < 128`).
#[derive(Clone)]
struct State {
    regs: Vec<Val>,
    fits32: u128,
}

impl State {
    fn get(&self, r: usize) -> Option<&Val> {
        self.regs.get(r)
    }

    fn fits32(&self, p: u16) -> bool {
        1u128
            .checked_shl(u32::from(p))
            .is_some_and(|b| self.fits32 & b != 0)
    }

    fn with_fits32(mut self, p: u16) -> State {
        self.fits32 |= 1u128.checked_shl(u32::from(p)).unwrap_or(0);
        self
    }
}

fn join_into(into: &mut Option<State>, from: State) {
    match into {
        Some(s) => {
            for (a, b) in s.regs.iter_mut().zip(from.regs) {
                *a = a.join(b);
            }
            s.fits32 &= from.fits32;
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
        let mut state: Option<State> = Some(State {
            regs: vec![Val::Undef; nregs],
            fits32: 0,
        });
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
                    // A branch on a `Fits` test tells one of its edges
                    // that the param is below 2^32: the taken edge when
                    // the guard's truth (`!neg`) is the test's `when`.
                    let fits = inst.guard.and_then(|(neg, r)| match st.get(r as usize) {
                        Some(Val::Fits { param, when }) => Some((*param, neg != *when)),
                        _ => None,
                    });
                    let taken = match fits {
                        Some((p, true)) => st.clone().with_fits32(p),
                        _ => st.clone(),
                    };
                    let mut slot = pending.remove(&t);
                    join_into(&mut slot, taken);
                    if let Some(s) = slot {
                        pending.insert(t, s);
                    }
                    if inst.guard.is_none() {
                        state = None;
                    } else if let Some((p, false)) = fits {
                        *st = st.clone().with_fits32(p);
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
                        let Some(slot) = st.regs.get_mut(r as usize) else {
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

    /// `r + o`: a pointer at a constant offset plus a wide `r` is an
    /// address; a literal moves `r`. `None` for anything else.
    fn plus_rem(&self, r: Rem, o: Val) -> Option<Val> {
        match o {
            Val::Ptr { param, off } if r.wide && off.is_constant() => {
                r.plus(off.c).map(|rem| Val::PtrRem { param, rem })
            }
            Val::Int(i) if i.wide == r.wide && i.lin.is_constant() => r.plus(i.lin.c).map(Val::Rem),
            _ => None,
        }
    }

    /// Records that 64-bit param `p` is read as an integer at `pc`.
    fn integer(&mut self, pc: usize, p: u16) {
        self.facts.integers.entry(p).or_insert(pc);
    }

    /// `rem`: by a 64-bit param (`divisor_positive` makes it at least 1),
    /// 64-bit or, where a branch showed the param below `2^32`, its low
    /// half in 32 bits; a signed one only of an exact index (never
    /// negative). The result lies in `[0, param)`. Anything else is data.
    fn rem(
        &mut self,
        pc: usize,
        inst: &Inst,
        st: &State,
        ty: Ty,
    ) -> Result<Vec<(u32, Val)>, PtxError> {
        let wide = ty.bits() == 64;
        let signed = matches!(ty, Ty::S32 | Ty::S64);
        let (a, b) = (
            inst.ops.get(1).map_or(Val::Data, |o| self.read(st, o)),
            inst.ops.get(2).map_or(Val::Data, |o| self.read(st, o)),
        );
        let divisor = match b {
            Val::Ptr { .. } if wide => b.raw_param(),
            Val::ParamLow(p) if !wide && st.fits32(p) => Some(p),
            _ => None,
        };
        if let Some(p) = b.raw_param().filter(|_| wide) {
            self.integer(pc, p);
        }
        if a.pointer().is_some() || (b.pointer().is_some() && divisor.is_none()) {
            self.no_pointer(pc, inst, st)?;
        }
        let dividend = match a {
            Val::Int(i) if i.wide == wide => {
                self.exact(pc, i);
                true
            }
            _ => !signed,
        };
        let v = match divisor {
            Some(p) if dividend => {
                self.facts.divisors.insert(p);
                Val::Rem(Rem::of(Divisor::Param(p), 1, wide))
            }
            _ => Val::Data,
        };
        Ok(Pass::one(inst, v))
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
                    Val::ParamInt(_) | Val::ParamLow(_) if !wide => v,
                    Val::Rem(r) if r.wide == wide => v,
                    _ => int(v, wide).map_or(Val::Data, Val::Int),
                };
                Ok(Pass::one(inst, out))
            }
            "cvt" => {
                let (Some(to), Some(from)) = (types.first(), types.get(1)) else {
                    self.no_pointer(pc, inst, st)?;
                    return Ok(Pass::data_writes(inst));
                };
                let ints = to.is_int() && from.is_int();
                // A 64-bit param narrowed to its low half: an integer
                // (the 32-bit path of a remainder by it).
                if let (Some(p), true, 32, 64) = (src(1).raw_param(), ints, to.bits(), from.bits())
                {
                    self.integer(pc, p);
                    return Ok(Pass::one(inst, Val::ParamLow(p)));
                }
                self.no_pointer(pc, inst, st)?;
                let v = match (src(1), ints, to.bits(), from.bits()) {
                    (Val::Rem(r), true, 64, 32)
                        if !r.wide && r.exact_narrow(!matches!(from, Ty::S32)) =>
                    {
                        Val::Rem(Rem { wide: true, ..r })
                    }
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
                    (None, Some(k)) => match src(1) {
                        Val::Rem(r) if r.wide == wide && k < 32 => {
                            r.scaled(1 << k, wide).map_or(Val::Data, Val::Rem)
                        }
                        _ => Val::Data,
                    },
                    (Some(a), Some(k)) => u32::try_from(k)
                        .ok()
                        .and_then(|k| a.shl(k))
                        .map_or(Val::Data, Val::Int),
                    _ => Val::Data,
                };
                Ok(Pass::one(inst, v))
            }
            "and" | "or" if int_ty => {
                // The literal operand's bits at this width (`-1024` too).
                let width_mask = if wide { u64::MAX } else { u64::from(u32::MAX) };
                let mask = match inst.ops.get(2) {
                    Some(Opnd::Imm(Imm::Int(m))) => Some(*m as u64 & width_mask),
                    _ => None,
                };
                let high = 0xffff_ffff_0000_0000u64;
                match (inst.base.as_str(), src(1), src(2)) {
                    // LLVM's test that a 64-bit remainder may take the
                    // 32-bit path: `(x | param) & ~(2^32 - 1)`.
                    ("or", a, b)
                        if wide && (a.raw_param().is_some() || b.raw_param().is_some()) =>
                    {
                        let (p, other) = match a.raw_param() {
                            Some(p) => (p, b),
                            None => (b.raw_param().unwrap_or(0), a),
                        };
                        if let Some(q) = other.pointer() {
                            return Err(refuse(
                                SubReason::PointerMisuse,
                                self.name(q),
                                self.line(pc),
                                format!("`{}` reads a pointer as an operand", inst.opcode),
                            ));
                        }
                        self.integer(pc, p);
                        return Ok(Pass::one(inst, Val::ParamOr(p)));
                    }
                    ("and", Val::ParamOr(p), _)
                        if wide && mask.is_some_and(|m| m & high == high) =>
                    {
                        return Ok(Pass::one(inst, Val::ParamHigh(p)));
                    }
                    _ => {}
                }
                self.no_pointer(pc, inst, st)?;
                let (a, b) = (int(src(1), wide), int(src(2), wide));
                let v = match (inst.base.as_str(), a, b) {
                    ("and", Some(a), Some(b)) if b.lin.is_constant() => a.and(b.lin.c),
                    ("and", Some(a), Some(b)) if a.lin.is_constant() => b.and(a.lin.c),
                    ("or", Some(a), Some(b)) => a.or(b),
                    _ => None,
                };
                // `x & -2^k` that is not the identity: a rounding down
                // (the half of LLVM's remainder by `2^k` that `sub` ends).
                let round = match (inst.base.as_str(), a, mask) {
                    ("and", Some(x), Some(m)) if v.is_none() && m != 0 => {
                        let k = m.trailing_zeros();
                        (m == width_mask & !((1u64 << k) - 1)).then_some(Val::RoundDown { x, k })
                    }
                    _ => None,
                };
                Ok(Pass::one(
                    inst,
                    round.unwrap_or(v.map_or(Val::Data, Val::Int)),
                ))
            }
            // `x - (x & -2^k)` is `x mod 2^k`, whatever `x`'s bits (the
            // sign of LLVM's signed remainder is in the `x + bias` that
            // fed the rounding: only a bias shown to be 0 gives the same
            // `x` on both sides).
            "sub" if int_ty => {
                self.no_pointer(pc, inst, st)?;
                let v = match (int(src(1), wide), src(2)) {
                    (Some(a), Val::RoundDown { x, k }) if x == a && k < 63 => {
                        let d = 1u64 << k;
                        let low = a.bits & (d - 1);
                        let align = if low == 0 {
                            d
                        } else {
                            1 << low.trailing_zeros()
                        };
                        Val::Rem(Rem::of(Divisor::Const(d), align, wide))
                    }
                    _ => Val::Data,
                };
                Ok(Pass::one(inst, v))
            }
            // `bfe a, pos, len` of an index below `2^pos` is 0: LLVM's
            // sign of a non-negative index (`a` shifted to bit 31 is
            // exact, so at most `2^31 - 1`).
            "bfe" if matches!(ty, Ty::S32 | Ty::U32) => {
                self.no_pointer(pc, inst, st)?;
                let v = match (int(src(1), false), imm(2), imm(3)) {
                    (Some(a), Some(pos), Some(len)) if pos <= 31 && len >= 1 => {
                        match a.shl(31 - pos as u32) {
                            Some(top) => {
                                self.exact(pc, top);
                                Int::constant(0, false).map_or(Val::Data, Val::Int)
                            }
                            None => Val::Data,
                        }
                    }
                    _ => Val::Data,
                };
                Ok(Pass::one(inst, v))
            }
            // A literal shifted; the sign of an exact index (0).
            "shr" if int_ty => {
                self.no_pointer(pc, inst, st)?;
                let bits = if wide { 64 } else { 32 };
                let v = match (int(src(1), wide), imm(2)) {
                    // A signed shift fills with the sign bit: a literal
                    // with it set (`0x80000000`, `1 << 31`) shifts to a
                    // negative value, which is no form.
                    (Some(a), Some(k)) if a.lin.is_constant() && k < bits => {
                        let sign = a.lin.c >> (bits - 1) & 1 == 1;
                        if sign && matches!(ty, Ty::S32 | Ty::S64) {
                            Val::Data
                        } else {
                            Int::constant((a.lin.c >> k) as i64, wide).map_or(Val::Data, Val::Int)
                        }
                    }
                    (Some(a), Some(k)) if !wide && ty == Ty::S32 && k == 31 => {
                        self.exact(pc, a);
                        Int::constant(0, false).map_or(Val::Data, Val::Int)
                    }
                    _ => Val::Data,
                };
                Ok(Pass::one(inst, v))
            }
            "rem" if int_ty => self.rem(pc, inst, st, ty),
            "add" if int_ty => {
                let (a, b) = (src(1), src(2));
                let rem = match (a, b) {
                    (Val::Rem(r), o) | (o, Val::Rem(r)) if r.wide == wide => self.plus_rem(r, o),
                    (Val::PtrRem { param, rem }, o) | (o, Val::PtrRem { param, rem }) if wide => {
                        match int(o, true) {
                            Some(i) if i.lin.is_constant() => {
                                rem.plus(i.lin.c).map(|rem| Val::PtrRem { param, rem })
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                if let Some(v) = rem {
                    return Ok(Pass::one(inst, v));
                }
                let v = match (a, b) {
                    (Val::PtrRem { param, .. }, _) | (_, Val::PtrRem { param, .. }) if wide => {
                        Val::PtrAny(param)
                    }
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
                // The literal multiplier as the instruction reads it: at a
                // 32-bit type its low 32 bits, signed for `.s32` (a
                // `mad.wide.s32` by `0xFFFFFFFC` multiplies by -4). One
                // that reads otherwise than as the value it is makes no
                // product.
                let imm = |i: usize| {
                    imm(i).filter(|&k| match ty {
                        Ty::S32 => k <= i32::MAX as u64,
                        Ty::U32 | Ty::B32 => k <= u64::from(u32::MAX),
                        _ => true,
                    })
                };
                if let (Val::Rem(r), Some(k)) = (src(1), imm(2)) {
                    let scaled = match (r.wide == source_wide, widening) {
                        (true, true) if ty.bits() == 32 && r.exact_narrow(ty == Ty::U32) => {
                            r.scaled(k, true)
                        }
                        (true, false) => r.scaled(k, wide),
                        _ => None,
                    };
                    let added = match (scaled, inst.base.as_str()) {
                        (Some(r), "mul") => Some(Val::Rem(r)),
                        (Some(r), _) => self.plus_rem(r, src(3)),
                        (None, _) => None,
                    };
                    if let Some(v) = added {
                        return Ok(Pass::one(inst, v));
                    }
                    return match src(3).pointer() {
                        Some(p) if inst.base == "mad" => Ok(Pass::one(inst, Val::PtrAny(p))),
                        _ => {
                            self.no_pointer(pc, inst, st)?;
                            Ok(Pass::data_writes(inst))
                        }
                    };
                }
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
                    // `(x | param) & ~(2^32 - 1)` compared with 0.
                    (Some(cmp @ ("eq" | "ne")), _) if wide => match (src(1), int(src(2), true)) {
                        (Val::ParamHigh(param), Some(z)) if z.lin == Lin::constant(0) => {
                            Val::Fits {
                                param,
                                when: cmp == "eq",
                            }
                        }
                        _ => Val::Data,
                    },
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
            Some(Decl::Int32(_)) => {
                self.facts.count_read = true;
                Val::ParamInt(*p)
            }
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
        let unbounded = |param: u16| {
            refuse(
                SubReason::UnboundedAccess,
                self.name(param),
                self.line(pc),
                format!("`{}` at a negative or unbounded offset", inst.opcode),
            )
        };
        let offset = u64::try_from(*offset).ok();
        let (param, off, rem) = match st.get(*r as usize).copied() {
            Some(Val::PtrRem { param, rem }) => match offset.and_then(|o| rem.plus(o)) {
                Some(rem) => (param, Lin::constant(0), Some(rem)),
                None => return Err(unbounded(param)),
            },
            Some(Val::Ptr { param, off }) => match offset.and_then(|o| off.add(Lin::constant(o))) {
                Some(off) => (param, off, None),
                None => return Err(unbounded(param)),
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
            rem,
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
    /// What its accesses' remainder divides by; `None` for index forms.
    rem: Option<Divisor>,
    /// Whether it is accessed at an index form.
    linear: bool,
}

fn decide(k: &Kernel, decls: &[Decl], block: u32, facts: Facts) -> Result<Verified, PtxError> {
    let name = |p: u16| k.params.get(usize::from(p)).map(|x| x.name.as_str());
    let line = |pc: usize| k.insts.get(pc).map(|i| i.line);
    let mut uses = vec![Use::default(); decls.len()];
    let mut bound: Option<Bound> = None;
    let mut elements_per_block = 0u64;
    // The largest `ctaid` coefficient of a form that must be exact.
    let a_max = facts.exact.iter().map(|(_, l)| l.ctaid).max().unwrap_or(0);
    // A static shape without masks (every block full): each access at an
    // index form stays inside its own block's elements, so the grid
    // bounds it. Only where no mask exists and the body reads no count,
    // so a mask the pass cannot model is never read as "no mask".
    let grid_bound = !facts.count_read
        && !facts
            .accesses
            .iter()
            .any(|a| a.rem.is_none() && a.mask.is_some());
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
        let unbounded = |why: String| refuse(SubReason::UnboundedAccess, name(a.param), at, why);
        let misaligned = |off: String| {
            refuse(
                SubReason::NonElementwiseAddress,
                name(a.param),
                at,
                format!(
                    "a {}-byte {what} at byte offset {off}: not a multiple of its width",
                    a.width
                ),
            )
        };
        let width = u64::from(a.width);
        let (s, granule) = if let Some(r) = a.rem {
            // `scale · r + c` with `r` in `[0, D)` a multiple of `align`:
            // it ends by `scale · D` when `c + width <= scale · align`.
            if a.store {
                return Err(refuse(
                    SubReason::NonElementwiseAddress,
                    name(a.param),
                    at,
                    "a store at a remainder: threads would store one element together",
                ));
            }
            let room = r.scale.checked_mul(r.align);
            if room.is_none_or(|room| r.c.saturating_add(width) > room) {
                return Err(unbounded(format!(
                    "a {}-byte {what} at {} × (x mod {}) + {} runs past the remainder's last element",
                    a.width,
                    r.scale,
                    match r.div {
                        Divisor::Const(d) => d.to_string(),
                        Divisor::Param(p) => name(p).unwrap_or("?").to_string(),
                    },
                    r.c
                )));
            }
            let align = gcd(room.unwrap_or(0), r.c);
            if !a.width.is_power_of_two() || !align.is_multiple_of(width) {
                return Err(misaligned(format!("{} × r + {}", r.scale, r.c)));
            }
            let u = &mut uses[usize::from(a.param)];
            if u.linear || u.rem.is_some_and(|d| d != r.div) {
                return Err(refuse(
                    SubReason::NonElementwiseAddress,
                    name(a.param),
                    at,
                    "accesses at different index forms through one pointer",
                ));
            }
            u.rem = Some(r.div);
            (r.scale, 1)
        } else if let Some(m) = a.mask {
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
            (s, granule)
        } else if grid_bound {
            // Block `b`'s accesses lie in `[B·b, B·(b + 1))`, `B` the
            // offset's `ctaid` coefficient, when the rest of the offset
            // plus the width is at most `B`: the footprint is
            // `B × grid`, `roundup(n, E) × s` for `E = A` elements per
            // block (the index's coefficient) of `s = B / A` bytes.
            let o = a.off;
            let s = (a_max > 0 && o.ctaid.is_multiple_of(a_max)).then(|| o.ctaid / a_max);
            let Some(s) = s.filter(|&s| s >= 1) else {
                return Err(unbounded(format!(
                    "an unmasked {what} at byte offset {}: no multiple of the index's {a_max} elements per block",
                    show(o)
                )));
            };
            if o.within_block(block)
                .and_then(|w| w.checked_add(width))
                .is_none_or(|end| end > o.ctaid)
            {
                return Err(unbounded(format!(
                    "an unmasked {}-byte {what} at byte offset {} runs past its block's elements",
                    a.width,
                    show(o)
                )));
            }
            let align = gcd(gcd(o.ctaid, o.tid), o.c);
            if !a.width.is_power_of_two() || !align.is_multiple_of(width) {
                return Err(misaligned(show(o)));
            }
            elements_per_block = a_max;
            (s, 1)
        } else {
            return Err(refuse(
                SubReason::UnguardedAccess,
                name(a.param),
                at,
                format!("a {what} not predicated on an `index < n` mask"),
            ));
        };
        let u = &mut uses[usize::from(a.param)];
        if a.rem.is_none() {
            if u.rem.is_some() {
                return Err(refuse(
                    SubReason::NonElementwiseAddress,
                    name(a.param),
                    at,
                    "accesses at different index forms through one pointer",
                ));
            }
            u.linear = true;
        }
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
    // A 64-bit param read as an integer is a by-value scalar: never
    // dereferenced, never one of ptxd's null scratch pointers.
    for (&p, &pc) in &facts.integers {
        let u = uses.get(usize::from(p)).copied().unwrap_or_default();
        if decls.get(usize::from(p)) == Some(&Decl::Scratch) {
            return Err(refuse(
                SubReason::ParamMisuse,
                name(p),
                line(pc),
                "a scratch pointer (passed as null) read as an integer",
            ));
        }
        if u.read || u.written {
            return Err(refuse(
                SubReason::PointerMisuse,
                name(p),
                line(pc),
                "a pointer param also read as an integer",
            ));
        }
    }
    let mut params = Vec::with_capacity(decls.len());
    let mut roles = Vec::with_capacity(decls.len());
    let (mut inputs, mut outputs, mut scalars) = (Vec::new(), Vec::new(), 0u32);
    for (i, d) in decls.iter().enumerate() {
        let p = u16::try_from(i).unwrap_or(u16::MAX);
        let u = uses[i];
        let kind = match d {
            Decl::Pointer if facts.integers.contains_key(&p) => {
                scalars += 1;
                let declared = k.params.get(i).map(|x| x.ty.as_str()).unwrap_or("u64");
                ParamKind::Scalar(ScalarType::from_ptx(declared).unwrap_or(ScalarType::U64))
            }
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
    // A param's place among the by-value scalars (what `Expr::Arg` reads).
    let scalars_before: Vec<u16> = params
        .iter()
        .scan(0u16, |k, c| {
            let here = *k;
            if matches!(c.kind, ParamKind::Scalar(_)) {
                *k = k.saturating_add(1);
            }
            Some(here)
        })
        .collect();
    let arg = |p: u16| {
        Expr::Arg(
            scalars_before
                .get(usize::from(p))
                .copied()
                .unwrap_or(u16::MAX),
        )
    };
    let divisor_args: Vec<Expr> = facts.divisors.iter().map(|&p| arg(p)).collect();
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
        let bytes = match (u.rem, bound) {
            // `scale · r + c` ends by `scale · D` (checked per access).
            (Some(Divisor::Const(d)), _) => match d.checked_mul(s) {
                Some(b) => Expr::Const(b),
                None => {
                    return Err(refuse(
                        SubReason::UnboundedAccess,
                        name(*p),
                        None,
                        "a remainder's footprint past 2^64 bytes",
                    ))
                }
            },
            (Some(Divisor::Param(d)), _) => Expr::product(arg(d), Expr::Const(s)),
            (None, None) if grid_bound => Expr::product(
                Expr::RoundUp(Box::new(Expr::Count), elements_per_block),
                Expr::Const(s),
            ),
            (None, Some(Bound::Const(n))) => {
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
            (None, _) if u.granule == 1 => Expr::product(Expr::Count, Expr::Const(s)),
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
    // `rem` by zero has no specified value; `Arg` reads the param signed,
    // so this also keeps a signed `rem`'s divisor positive.
    for d in divisor_args {
        preconditions.push(Precondition {
            name: DIVISOR_POSITIVE,
            condition: Condition::AtLeast(d, 1),
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
