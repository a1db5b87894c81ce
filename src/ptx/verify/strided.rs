//! The Strided family: the seed's Strided schedule, a kernel
//! `(const T* in0, .., T* out, long long n, long long a0, .., float p0, ..)`
//! run one thread per element of `i = ctaid.x × ntid.x + tid.x` (64-bit,
//! guarded `i < n`), whose addresses are broadcast or non-contiguous
//! functions of `i` and the by-value shape and stride args, e.g.
//! `in0[(i / d1) × s0 + i % d1]`.
//!
//! Method: one forward pass in program order (branches go forward, as in
//! the Triton family), each register holding a [`Val`]: data, an exact
//! polynomial ([`Poly`]) with non-negative coefficients over the atoms
//! `i`, `i / d`, `i % d` (`d` a param) and the params' 64-bit values, a
//! 32-bit value that is such a polynomial modulo `2^32`, or a predicate the
//! pass understands (the bounds guard `i < n`; NVRTC's fast-path test
//! `((i | d) & ~0xffffffff) == 0`). Branch edges carry what their predicate
//! proves: `i < param` (the guard) and "`i` and `d` fit 32 bits", which
//! makes `div.u32`/`rem.u32` of the truncated values the exact `i / d`,
//! `i % d` and their zero-extension exact. A polynomial is built by ring
//! operations only (`add`, `mul.lo`, `shl`, `mad.lo`, and `sub` where the
//! result keeps non-negative coefficients, including `i - (i / d) × d =
//! i % d`), so the register holds the polynomial's value modulo `2^64`
//! whatever the intermediate values were.
//!
//! Roles are positional, from the guard: the param `n` the guard compares
//! `i` with is the count; every 64-bit param before it is a pointer (the
//! last the output), every one after it a by-value integer argument, and
//! `.f32` params may follow. The verdict then requires:
//! - one guard param (`param_misuse` for a second), dominating every
//!   access (`unguarded_access`);
//! - every access at `pointer + Σ c × monomial` with exactly one pointer
//!   term of coefficient 1 (`non_elementwise_address` otherwise, or
//!   `param_misuse` for an address based on an argument), every other
//!   atom `i`, `i / a`, `i % a` or `a` for arguments `a` (`param_misuse`
//!   for the count or a pointer in an offset), every coefficient a
//!   multiple of the access width and one offset form per pointer
//!   (`non_elementwise_address`);
//! - a pointer is an address base and nothing else: as an operand of any
//!   other arithmetic `pointer_misuse`, stored or converted
//!   `pointer_escape`; the count is the guard's bound and nothing else
//!   (`param_misuse`);
//! - inputs loaded, the output stored (`pointer_misuse`, `unused_input`,
//!   `no_output_store`).
//!
//! Invariants of an acceptance (what the contract states): with every
//! argument that enters an address non-negative (`arg_nonnegative`) and
//! every divisor at least 1 (`divisor_positive`), every atom is
//! non-negative and at most its value at `i = n - 1` bound (`i <= n - 1`,
//! `i / d <= (n - 1) / d`, `i % d <= min(d, n) - 1`), so an access's
//! element offset is at most the same sum over those bounds; the byte
//! footprint is `width × (that + 1)` (0 when `n = 0`). With that footprint
//! at most `2^63 - 1` (`strided_index_fits_i64`), the true offset lies in
//! `[0, 2^63)`, so the register (equal to it modulo `2^64`) holds it
//! exactly: no product or sum wrapped.

use std::collections::BTreeMap;

use crate::ptx::contract::{
    BlockRule, Condition, ContractParam, Expr, Footprint, Geometry, ParamKind, PointerAccess,
    Precondition, ScalarType, ARG_NONNEGATIVE, COUNT_FITS_I64, DIVISOR_POSITIVE,
    STRIDED_INDEX_FITS_I64,
};
use crate::ptx::ir::{Base, Inst, Kernel, Opnd, Sreg, Ty};
use crate::ptx::parse::Imm;
use crate::ptx::{LaunchContract, PtxError, Signature};

use super::{forward_target, refuse, Role, SubReason, Verified};

/// The work a kernel may take, per instruction (as the Triton family).
const WORK_PER_INSTRUCTION: usize = 4096;
/// The most terms a polynomial keeps; past it a value is data.
const MAX_TERMS: usize = 16;
/// The most atoms in one monomial.
const MAX_DEGREE: usize = 4;

/// Whether `k` may be a Strided-family kernel: 64-bit integer params,
/// then `.f32` params only, no by-value aggregate. (The dispatch tries the
/// family only where the scalar ABI's proof found integer params after
/// its count.)
pub(super) fn shaped(k: &Kernel) -> bool {
    let ints = k
        .params
        .iter()
        .take_while(|p| is_u64(&p.ty) && p.array.is_none())
        .count();
    ints >= 3
        && k.params[ints..]
            .iter()
            .all(|p| p.ty == "f32" && p.array.is_none())
}

fn is_u64(ty: &str) -> bool {
    matches!(ty, "u64" | "b64" | "s64")
}

/// A free variable of a polynomial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Atom {
    /// The 64-bit global thread index `i`.
    Index,
    /// `i / param` (the param a divisor).
    Quot(u16),
    /// `i % param`.
    Rem(u16),
    /// A 64-bit param's value.
    Param(u16),
}

/// `coef × Π atoms` (atoms sorted; none: a constant).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Term {
    atoms: Vec<Atom>,
    coef: u64,
}

/// `Σ terms`, sorted by monomial, each coefficient > 0, monomials
/// distinct.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct Poly(Vec<Term>);

impl Poly {
    fn constant(c: u64) -> Poly {
        Poly::from_terms(vec![Term {
            atoms: vec![],
            coef: c,
        }])
        .unwrap_or_default()
    }

    fn atom(a: Atom) -> Poly {
        Poly(vec![Term {
            atoms: vec![a],
            coef: 1,
        }])
    }

    /// Sorts and merges; `None` past the limits or on a coefficient
    /// overflow.
    fn from_terms(mut terms: Vec<Term>) -> Option<Poly> {
        for t in &mut terms {
            t.atoms.sort_unstable();
            if t.atoms.len() > MAX_DEGREE {
                return None;
            }
        }
        terms.sort_by(|a, b| a.atoms.cmp(&b.atoms));
        let mut out: Vec<Term> = Vec::with_capacity(terms.len());
        for t in terms {
            match out.last_mut() {
                Some(last) if last.atoms == t.atoms => {
                    last.coef = last.coef.checked_add(t.coef)?;
                }
                _ => out.push(t),
            }
        }
        out.retain(|t| t.coef != 0);
        (out.len() <= MAX_TERMS).then_some(Poly(out))
    }

    fn add(&self, o: &Poly) -> Option<Poly> {
        Poly::from_terms(self.0.iter().chain(&o.0).cloned().collect())
    }

    fn mul(&self, o: &Poly) -> Option<Poly> {
        let mut terms = Vec::with_capacity(self.0.len() * o.0.len());
        for a in &self.0 {
            for b in &o.0 {
                terms.push(Term {
                    atoms: a.atoms.iter().chain(&b.atoms).copied().collect(),
                    coef: a.coef.checked_mul(b.coef)?,
                });
            }
        }
        Poly::from_terms(terms)
    }

    /// `self - o` when every term of `o` is in `self` with no larger a
    /// coefficient (the result keeps non-negative coefficients), or the
    /// identity `i - (i / d) × d = i % d`.
    fn sub(&self, o: &Poly) -> Option<Poly> {
        let mut out = self.0.clone();
        for t in &o.0 {
            if let Some(mine) = out
                .iter_mut()
                .find(|m| m.atoms == t.atoms && m.coef >= t.coef)
            {
                mine.coef -= t.coef;
                continue;
            }
            // `c·(i/d)·d` taken from `c·i` leaves `c·(i % d)`.
            let identity = match t.atoms.as_slice() {
                [Atom::Quot(d), Atom::Param(p)] if d == p => Some(*d),
                _ => None,
            };
            let index = out
                .iter_mut()
                .find(|m| m.atoms == [Atom::Index] && m.coef >= t.coef);
            match (identity, index) {
                (Some(d), Some(m)) => {
                    m.coef -= t.coef;
                    out.push(Term {
                        atoms: vec![Atom::Rem(d)],
                        coef: t.coef,
                    });
                }
                _ => return None,
            }
        }
        Poly::from_terms(out)
    }

    /// The one atom of a polynomial that is exactly one atom.
    fn single(&self) -> Option<Atom> {
        match self.0.as_slice() {
            [Term { atoms, coef: 1 }] => match atoms.as_slice() {
                [a] => Some(*a),
                _ => None,
            },
            _ => None,
        }
    }

    fn params(&self) -> impl Iterator<Item = u16> + '_ {
        self.0
            .iter()
            .flat_map(|t| t.atoms.iter())
            .filter_map(|a| match a {
                Atom::Param(p) | Atom::Quot(p) | Atom::Rem(p) => Some(*p),
                Atom::Index => None,
            })
    }
}

/// A condition a predicate may stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Cond {
    /// `i < param`.
    InBounds(u16),
    /// Both atoms' 64-bit values are below `2^32`.
    Fits32(Atom, Atom),
}

/// The special registers the index is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Special {
    Ctaid,
    Ntid,
    Tid,
}

/// What a register provably holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Val {
    Undef,
    Data,
    /// A 32-bit special register.
    Sreg(Special),
    /// A special register zero-extended to 64 bits.
    Wide(Special),
    /// `ctaid.x × ntid.x` in 64 bits.
    CtaBase,
    /// A 64-bit value: the polynomial modulo `2^64`.
    Poly(Poly),
    /// A 32-bit value: the polynomial modulo `2^32`.
    Narrow(Poly),
    /// `a | b` of two atoms (64-bit).
    OrOf(Atom, Atom),
    /// `(a | b) & ~0xffffffff`.
    HighOf(Atom, Atom),
    /// A predicate: the condition, or its negation when `holds` is false.
    Pred {
        cond: Cond,
        holds: bool,
    },
    /// May hold a value carrying these params (a join of unequal values):
    /// never an address, and every use of it is a use of them.
    Tainted(Vec<u16>),
}

impl Val {
    fn join(self, o: Val) -> Val {
        match (self, o) {
            (a, b) if a == b => a,
            (Val::Undef, x) | (x, Val::Undef) => x,
            (a, b) => {
                // A param's value that may reach either way stays visible
                // to the role checks: no join launders a pointer into data.
                let mut ps = a.poly_params().unwrap_or_default();
                ps.extend(b.poly_params().unwrap_or_default());
                ps.sort_unstable();
                ps.dedup();
                if ps.is_empty() {
                    Val::Data
                } else {
                    Val::Tainted(ps)
                }
            }
        }
    }

    fn poly_params(&self) -> Option<Vec<u16>> {
        match self {
            Val::Poly(p) | Val::Narrow(p) => Some(p.params().collect()),
            Val::Tainted(ps) => Some(ps.clone()),
            Val::OrOf(a, b) | Val::HighOf(a, b) => Some(
                [a, b]
                    .into_iter()
                    .filter_map(|x| match x {
                        Atom::Param(p) | Atom::Quot(p) | Atom::Rem(p) => Some(*p),
                        Atom::Index => None,
                    })
                    .collect(),
            ),
            _ => None,
        }
    }
}

/// Path facts: the guard that dominates, and the atoms known below `2^32`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Facts {
    guard: Option<u16>,
    fits32: Vec<Atom>,
}

impl Facts {
    fn join(&mut self, o: &Facts) {
        if self.guard != o.guard {
            self.guard = None;
        }
        self.fits32.retain(|a| o.fits32.contains(a));
    }

    fn assume(&mut self, cond: Cond) {
        match cond {
            Cond::InBounds(p) => {
                // A second guard against another param is the verdict's
                // to refuse; the path keeps the first.
                self.guard.get_or_insert(p);
            }
            Cond::Fits32(a, b) => {
                for x in [a, b] {
                    if !self.fits32.contains(&x) {
                        self.fits32.push(x);
                    }
                }
            }
        }
    }

    fn fits32(&self, a: Atom) -> bool {
        self.fits32.contains(&a)
            || (matches!(a, Atom::Quot(_) | Atom::Rem(_)) && self.fits32.contains(&Atom::Index))
    }
}

#[derive(Clone)]
struct State {
    regs: Vec<Val>,
    facts: Facts,
}

fn join_into(into: &mut Option<State>, from: State) {
    match into {
        Some(s) => {
            for (a, b) in s.regs.iter_mut().zip(from.regs) {
                *a = std::mem::replace(a, Val::Undef).join(b);
            }
            s.facts.join(&from.facts);
        }
        None => *into = Some(from),
    }
}

/// How a param's value was used outside address arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UseKind {
    /// As an operand of arithmetic or a compare.
    Operand,
    /// Stored, moved or converted as data.
    Escape,
}

struct Access {
    pc: usize,
    store: bool,
    width: u32,
    /// `None`: an address the pass could not express.
    addr: Option<Poly>,
    guard: Option<u16>,
}

#[derive(Default)]
struct Seen {
    accesses: Vec<Access>,
    uses: Vec<(usize, u16, UseKind)>,
    /// Every guard (pc, param).
    guards: Vec<(usize, u16)>,
}

struct Pass<'k> {
    k: &'k Kernel,
    seen: Seen,
}

/// Verifies a kernel [`shaped`] like the seed's Strided schedule.
pub(super) fn verify(k: &Kernel) -> Result<Verified, PtxError> {
    let mut pass = Pass {
        k,
        seen: Seen::default(),
    };
    pass.run()?;
    decide(k, pass.seen)
}

impl Pass<'_> {
    fn line(&self, pc: usize) -> Option<u32> {
        self.k.insts.get(pc).map(|i| i.line)
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
        let mut state = Some(State {
            regs: vec![Val::Undef; nregs],
            facts: Facts::default(),
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
            // What the instruction's own predicate proves when it runs.
            let pred = inst.guard.map(|(neg, r)| {
                let v = st.regs.get(r as usize).cloned().unwrap_or(Val::Data);
                match v {
                    Val::Pred { cond, holds } => Some((cond, holds != neg)),
                    _ => None,
                }
            });
            match inst.base.as_str() {
                "bra" => {
                    let t = forward_target(inst, pc, "Strided")?;
                    work = work.saturating_add(nregs);
                    let mut taken = st.clone();
                    if let Some(Some((cond, true))) = pred {
                        self.note_guard(pc, cond);
                        taken.facts.assume(cond);
                    }
                    let mut slot = pending.remove(&t);
                    join_into(&mut slot, taken);
                    if let Some(s) = slot {
                        pending.insert(t, s);
                    }
                    match pred {
                        None => state = None,
                        Some(Some((cond, false))) => {
                            // Falling through, the branch's condition is
                            // false: its negation holds.
                            self.note_guard(pc, cond);
                            st.facts.assume(cond);
                        }
                        Some(_) => {}
                    }
                }
                "ret" | "exit" => {
                    if inst.guard.is_none() {
                        state = None;
                    }
                }
                _ => {
                    let mut facts = st.facts.clone();
                    if let Some(Some((cond, true))) = pred {
                        facts.assume(cond);
                    }
                    let writes = self.step(pc, inst, st, &facts)?;
                    for (r, v) in writes {
                        let Some(slot) = st.regs.get_mut(r as usize) else {
                            continue;
                        };
                        *slot = if inst.guard.is_some() {
                            std::mem::replace(slot, Val::Undef).join(v)
                        } else {
                            v
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// Records a guard that a branch edge proves.
    fn note_guard(&mut self, pc: usize, cond: Cond) {
        if let Cond::InBounds(p) = cond {
            self.seen.guards.push((pc, p));
        }
    }

    fn reg(st: &State, r: u32) -> Val {
        st.regs.get(r as usize).cloned().unwrap_or(Val::Data)
    }

    fn read(st: &State, o: &Opnd) -> Val {
        match o {
            Opnd::Reg(r) => Pass::reg(st, *r),
            Opnd::Imm(Imm::Int(v)) => {
                u64::try_from(*v).map_or(Val::Data, |c| Val::Poly(Poly::constant(c)))
            }
            Opnd::Sreg(Sreg::Ctaid(0)) => Val::Sreg(Special::Ctaid),
            Opnd::Sreg(Sreg::Ntid(0)) => Val::Sreg(Special::Ntid),
            Opnd::Sreg(Sreg::Tid(0)) => Val::Sreg(Special::Tid),
            _ => Val::Data,
        }
    }

    /// Records every param a value read by `inst` carries, as a use of
    /// `kind`, and gives data for its destinations.
    fn opaque(&mut self, pc: usize, inst: &Inst, st: &State, kind: UseKind) -> Vec<(u32, Val)> {
        let sources: &[Opnd] = if inst.base == "st" {
            &inst.ops
        } else {
            inst.ops.get(1..).unwrap_or(&[])
        };
        let push = |o: &Opnd, uses: &mut Vec<(usize, u16, UseKind)>| {
            let regs: Vec<u32> = match o {
                Opnd::Reg(r) | Opnd::Not(r) => vec![*r],
                Opnd::Pair(a, b) => vec![*a, *b],
                Opnd::Addr {
                    base: Base::Reg(r), ..
                } => vec![*r],
                _ => vec![],
            };
            for r in regs {
                if let Some(ps) = Pass::reg(st, r).poly_params() {
                    uses.extend(ps.into_iter().map(|p| (pc, p, kind)));
                }
            }
        };
        for o in sources {
            if let Opnd::List(items) = o {
                for i in items {
                    push(i, &mut self.seen.uses);
                }
            } else {
                push(o, &mut self.seen.uses);
            }
        }
        super::instructions::destinations(inst)
            .into_iter()
            .map(|r| (r, Val::Data))
            .collect()
    }

    fn one(&mut self, pc: usize, inst: &Inst, st: &State, v: Val) -> Vec<(u32, Val)> {
        match inst.ops.first() {
            Some(Opnd::Reg(r)) => vec![(*r, v)],
            _ => self.opaque(pc, inst, st, UseKind::Operand),
        }
    }

    fn step(
        &mut self,
        pc: usize,
        inst: &Inst,
        st: &State,
        facts: &Facts,
    ) -> Result<Vec<(u32, Val)>, PtxError> {
        let types = inst.types();
        let ty = types.last().copied().unwrap_or(Ty::Other);
        let int_ty = ty.is_int() && matches!(ty.bits(), 32 | 64);
        let wide = ty.bits() == 64;
        let src = |i: usize| inst.ops.get(i).map_or(Val::Data, |o| Pass::read(st, o));
        // A polynomial operand at the instruction's width.
        let poly = |v: &Val| match v {
            Val::Poly(p) if wide => Some(p.clone()),
            Val::Narrow(p) if !wide => Some(p.clone()),
            _ => None,
        };
        let wrap = |p: Option<Poly>| match p {
            Some(p) if wide => Val::Poly(p),
            Some(p) => Val::Narrow(p),
            None => Val::Data,
        };
        // An immediate operand, read as a constant of either width.
        let konst = |i: usize| match inst.ops.get(i) {
            Some(Opnd::Imm(Imm::Int(v))) => u64::try_from(*v).ok().map(Poly::constant),
            _ => None,
        };
        let operand = |i: usize| poly(&src(i)).or_else(|| konst(i));
        // A saturating operation is no ring operation: nothing it computes
        // is a polynomial.
        if inst.has("sat") {
            return Ok(self.opaque(pc, inst, st, UseKind::Operand));
        }
        let v = match inst.base.as_str() {
            "ld" | "ldu" if inst.has("param") => return self.param_load(pc, inst),
            "ld" | "ldu" | "st" => return Ok(self.access(pc, inst, st, facts)),
            "mov" if int_ty && matches!(inst.ops.first(), Some(Opnd::Reg(_))) => match src(1) {
                v @ (Val::Sreg(_) | Val::Narrow(_)) if !wide => v,
                v @ (Val::Poly(_) | Val::Wide(_) | Val::CtaBase) if wide => v,
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Escape)),
            },
            "cvta" if inst.has("to") && inst.has("global") && wide => match src(1) {
                // A global address is the same in the generic space.
                v @ Val::Poly(_) => v,
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Escape)),
            },
            "cvt" => {
                let (Some(to), Some(from)) = (types.first(), types.get(1)) else {
                    return Ok(self.opaque(pc, inst, st, UseKind::Escape));
                };
                match (src(1), to.bits(), from.bits(), to.is_int() && from.is_int()) {
                    (Val::Sreg(s), 64, 32, true) if !from.is_signed() => Val::Wide(s),
                    // Zero-extending an atom known below 2^32 is exact.
                    (Val::Narrow(p), 64, 32, true)
                        if !from.is_signed() && p.single().is_some_and(|a| facts.fits32(a)) =>
                    {
                        Val::Poly(p)
                    }
                    // Truncation is a ring map: the value modulo 2^32.
                    (Val::Poly(p), 32, 64, true) if p.single().is_some() => Val::Narrow(p),
                    _ => return Ok(self.opaque(pc, inst, st, UseKind::Escape)),
                }
            }
            "add" if int_ty => match (src(1), src(2)) {
                (Val::CtaBase, Val::Wide(Special::Tid))
                | (Val::Wide(Special::Tid), Val::CtaBase)
                    if wide =>
                {
                    Val::Poly(Poly::atom(Atom::Index))
                }
                _ => match (operand(1), operand(2)) {
                    (Some(a), Some(b)) => wrap(a.add(&b)),
                    // A pointer plus what the pass cannot express is an
                    // address it cannot bound: the access that uses it is
                    // refused (`non_elementwise_address`), naming it.
                    _ => match Val::Data.join(src(1)).join(src(2)) {
                        t @ Val::Tainted(_) => t,
                        _ => Val::Data,
                    },
                },
            },
            "sub" if int_ty => match (operand(1), operand(2)) {
                (Some(a), Some(b)) => {
                    self.arith_use(pc, &b);
                    wrap(a.sub(&b))
                }
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
            },
            "mul" if inst.has("wide") && ty == Ty::U32 => match (src(1), src(2)) {
                (Val::Sreg(Special::Ctaid), Val::Sreg(Special::Ntid))
                | (Val::Sreg(Special::Ntid), Val::Sreg(Special::Ctaid)) => Val::CtaBase,
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
            },
            "mul" if int_ty && inst.has("lo") => match (src(1), src(2)) {
                (Val::Wide(Special::Ctaid), Val::Wide(Special::Ntid))
                | (Val::Wide(Special::Ntid), Val::Wide(Special::Ctaid))
                    if wide =>
                {
                    Val::CtaBase
                }
                _ => match (operand(1), operand(2)) {
                    (Some(a), Some(b)) => {
                        self.arith_use(pc, &a);
                        self.arith_use(pc, &b);
                        wrap(a.mul(&b))
                    }
                    _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
                },
            },
            "mad" if int_ty && inst.has("lo") => match (operand(1), operand(2), operand(3)) {
                (Some(a), Some(b), Some(c)) => {
                    self.arith_use(pc, &a);
                    self.arith_use(pc, &b);
                    wrap(a.mul(&b).and_then(|p| p.add(&c)))
                }
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
            },
            "shl" if int_ty => match (operand(1), inst.ops.get(2)) {
                (Some(a), Some(Opnd::Imm(Imm::Int(k)))) if (0..ty.bits() as i64).contains(k) => {
                    self.arith_use(pc, &a);
                    wrap(a.mul(&Poly::constant(1u64 << *k)))
                }
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
            },
            "div" | "rem" if int_ty => {
                let div = inst.base == "div";
                let exact = |a: Option<Poly>, b: Option<Poly>| match (
                    a.as_ref().and_then(Poly::single),
                    b.as_ref().and_then(Poly::single),
                ) {
                    (Some(Atom::Index), Some(Atom::Param(d))) => Some(d),
                    _ => None,
                };
                let d = match (wide, ty) {
                    // `i` is non-negative, `d >= 1` (a precondition):
                    // truncating division is `i / d` and `i % d`.
                    (true, Ty::S64 | Ty::U64) => exact(operand(1), operand(2)),
                    // Both truncated from values known below 2^32: the
                    // same quotient and remainder.
                    (false, Ty::U32) if facts.fits32(Atom::Index) => {
                        exact(operand(1), operand(2)).filter(|d| facts.fits32(Atom::Param(*d)))
                    }
                    _ => None,
                };
                match d {
                    Some(d) => {
                        self.seen.uses.push((pc, d, UseKind::Operand));
                        wrap(Some(Poly::atom(if div {
                            Atom::Quot(d)
                        } else {
                            Atom::Rem(d)
                        })))
                    }
                    None => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
                }
            }
            "or" if wide && int_ty => match (
                operand(1).and_then(|p| p.single()),
                operand(2).and_then(|p| p.single()),
            ) {
                (Some(a), Some(b)) => {
                    self.arith_use(pc, &Poly::atom(a));
                    self.arith_use(pc, &Poly::atom(b));
                    Val::OrOf(a, b)
                }
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
            },
            "and" if wide && int_ty => match (src(1), inst.ops.get(2)) {
                (Val::OrOf(a, b), Some(Opnd::Imm(Imm::Int(m)))) if *m == -4294967296 => {
                    Val::HighOf(a, b)
                }
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
            },
            "not" if ty == Ty::Pred => match src(1) {
                Val::Pred { cond, holds } => Val::Pred {
                    cond,
                    holds: !holds,
                },
                _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
            },
            "setp" => return Ok(self.setp(pc, inst, st, ty)),
            _ => return Ok(self.opaque(pc, inst, st, UseKind::Operand)),
        };
        Ok(self.one(pc, inst, st, v))
    }

    /// A polynomial entering a product, a difference or a compare: the
    /// params it carries are used as values (legal for arguments only).
    fn arith_use(&mut self, pc: usize, p: &Poly) {
        for q in p.params() {
            self.seen.uses.push((pc, q, UseKind::Operand));
        }
    }

    fn setp(&mut self, pc: usize, inst: &Inst, st: &State, ty: Ty) -> Vec<(u32, Val)> {
        let combined = inst.ops.len() != 3
            || inst
                .mods
                .iter()
                .any(|m| matches!(m.as_str(), "and" | "or" | "xor"));
        let cmp = inst.mods.first().map(String::as_str);
        let (a, b) = (
            inst.ops.get(1).map_or(Val::Data, |o| Pass::read(st, o)),
            inst.ops.get(2).map_or(Val::Data, |o| Pass::read(st, o)),
        );
        let single = |v: &Val| match v {
            Val::Poly(p) => p.single(),
            _ => None,
        };
        let v = match (combined, ty, cmp) {
            (false, Ty::S64 | Ty::U64, Some(c @ ("lt" | "ge" | "gt" | "le"))) => {
                // `i < p`, `i >= p`, `p > i`, `p <= i`.
                let (i, p, holds) = match c {
                    "lt" => (single(&a), single(&b), true),
                    "ge" => (single(&a), single(&b), false),
                    "gt" => (single(&b), single(&a), true),
                    _ => (single(&b), single(&a), false),
                };
                match (i, p) {
                    (Some(Atom::Index), Some(Atom::Param(p))) => Some(Val::Pred {
                        cond: Cond::InBounds(p),
                        holds,
                    }),
                    _ => None,
                }
            }
            (false, Ty::S64 | Ty::U64 | Ty::B64, Some(c @ ("eq" | "ne"))) => {
                match (&a, inst.ops.get(2)) {
                    (Val::HighOf(x, y), Some(Opnd::Imm(Imm::Int(0)))) => Some(Val::Pred {
                        cond: Cond::Fits32(*x, *y),
                        holds: c == "eq",
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        match v {
            Some(v) => self.one(pc, inst, st, v),
            None => self.opaque(pc, inst, st, UseKind::Operand),
        }
    }

    fn param_load(&mut self, pc: usize, inst: &Inst) -> Result<Vec<(u32, Val)>, PtxError> {
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
        let decl = self.k.params.get(usize::from(*p));
        let size = decl.map_or(0, |d| if is_u64(&d.ty) { 8 } else { 4 });
        let ty = inst.types().last().copied().unwrap_or(Ty::Other);
        if *offset != 0 || ty.bytes() != size {
            return Err(refuse(
                SubReason::ParamOutOfRange,
                decl.map(|d| d.name.as_str()),
                self.line(pc),
                format!(
                    "a {}-byte load at offset {offset} of a {size}-byte param: the whole param or nothing",
                    ty.bytes()
                ),
            ));
        }
        // A 64-bit param is its value whatever the load's type (read as a
        // float, its first use as one is a use of the param).
        let v = if size == 8 {
            Val::Poly(Poly::atom(Atom::Param(*p)))
        } else {
            Val::Data
        };
        Ok(match inst.ops.first() {
            Some(Opnd::Reg(r)) => vec![(*r, v)],
            _ => vec![],
        })
    }

    fn access(&mut self, pc: usize, inst: &Inst, st: &State, facts: &Facts) -> Vec<(u32, Val)> {
        let store = inst.base == "st";
        let (addr, data) = if store { (0, 1) } else { (1, 0) };
        if store {
            // A stored value is data: a param's value stored escapes.
            let stored: Vec<Val> = match inst.ops.get(data) {
                Some(Opnd::List(items)) => items.iter().map(|o| Pass::read(st, o)).collect(),
                Some(o) => vec![Pass::read(st, o)],
                None => vec![],
            };
            for v in stored {
                if let Some(ps) = v.poly_params() {
                    self.seen
                        .uses
                        .extend(ps.into_iter().map(|p| (pc, p, UseKind::Escape)));
                }
            }
        }
        let ty = inst.types().last().copied().unwrap_or(Ty::Other);
        let lanes = if inst.has("v4") {
            4
        } else if inst.has("v2") {
            2
        } else {
            1
        };
        let addr = match inst.ops.get(addr) {
            Some(Opnd::Addr {
                base: Base::Reg(r),
                offset,
            }) => match (Pass::reg(st, *r), u64::try_from(*offset)) {
                (Val::Poly(p), Ok(o)) => p.add(&Poly::constant(o)),
                _ => None,
            },
            _ => None,
        };
        self.seen.accesses.push(Access {
            pc,
            store,
            width: lanes * ty.bytes(),
            addr,
            guard: facts.guard,
        });
        if store {
            vec![]
        } else {
            super::instructions::destinations(inst)
                .into_iter()
                .map(|r| (r, Val::Data))
                .collect()
        }
    }
}

/// One pointer's accesses, summed up.
#[derive(Default, Clone)]
struct Uses {
    read: bool,
    written: bool,
    /// The element offset (the address less the pointer, over the width)
    /// and the width.
    form: Option<(Poly, u32)>,
}

fn decide(k: &Kernel, seen: Seen) -> Result<Verified, PtxError> {
    let name = |p: u16| k.params.get(usize::from(p)).map(|x| x.name.as_str());
    let line = |pc: usize| k.insts.get(pc).map(|i| i.line);
    let ints = k.params.iter().take_while(|p| is_u64(&p.ty)).count();
    let Some(&(_, count)) = seen.guards.first() else {
        return Err(refuse(
            SubReason::UnguardedAccess,
            None,
            seen.accesses
                .first()
                .and_then(|a| line(a.pc))
                .or(Some(k.line)),
            "no `i < n` bounds guard against the global thread index",
        ));
    };
    if let Some(&(pc, other)) = seen.guards.iter().find(|(_, p)| *p != count) {
        return Err(refuse(
            SubReason::ParamMisuse,
            name(other),
            line(pc),
            "a second bounds guard against another param",
        ));
    }
    let count_ix = usize::from(count);
    if count_ix < 1 || count_ix >= ints {
        return Err(refuse(
            SubReason::MissingParams,
            name(count),
            line(seen.guards[0].0),
            "the count must follow at least one pointer (the output)",
        ));
    }
    let output = count - 1;
    let is_pointer = |p: u16| p < count;
    let is_arg = |p: u16| p > count && usize::from(p) < ints;
    // Value uses: arguments only.
    for &(pc, p, kind) in &seen.uses {
        if is_pointer(p) {
            let (sub, what) = match kind {
                UseKind::Escape => (SubReason::PointerEscape, "a pointer's bits leave as data"),
                UseKind::Operand => (
                    SubReason::PointerMisuse,
                    "a pointer used as a value (an operand of arithmetic other than its own address)",
                ),
            };
            return Err(refuse(sub, name(p), line(pc), what));
        }
        if p == count {
            return Err(refuse(
                SubReason::ParamMisuse,
                name(p),
                line(pc),
                "the count used as anything but the bound of `i < n`",
            ));
        }
    }
    let mut uses: Vec<Uses> = vec![Uses::default(); count_ix];
    for a in &seen.accesses {
        let at = line(a.pc);
        if a.guard != Some(count) {
            return Err(refuse(
                SubReason::UnguardedAccess,
                None,
                at,
                "an access the `i < n` guard does not dominate",
            ));
        }
        let what = if a.store { "store" } else { "load" };
        let Some(addr) = &a.addr else {
            return Err(refuse(
                SubReason::NonElementwiseAddress,
                None,
                at,
                format!("a {what} at an address that is no pointer param plus a polynomial of `i`, `i / d`, `i % d` and the args"),
            ));
        };
        let mut base = None;
        let mut offset = Vec::new();
        for t in &addr.0 {
            match t.atoms.as_slice() {
                [Atom::Param(p)] if t.coef == 1 && is_pointer(*p) && base.is_none() => {
                    base = Some(*p)
                }
                atoms => {
                    for atom in atoms {
                        let p = match atom {
                            Atom::Index => continue,
                            Atom::Param(p) | Atom::Quot(p) | Atom::Rem(p) => *p,
                        };
                        if !is_arg(p) {
                            return Err(refuse(
                                if is_pointer(p) {
                                    SubReason::PointerMisuse
                                } else {
                                    SubReason::ParamMisuse
                                },
                                name(p),
                                at,
                                format!("a {what} whose offset reads `{}`, which is no by-value argument", name(p).unwrap_or("?")),
                            ));
                        }
                    }
                    offset.push(t.clone());
                }
            }
        }
        let Some(base) = base else {
            let arg = addr.params().find(|p| is_arg(*p));
            return Err(refuse(
                SubReason::ParamMisuse,
                arg.and_then(name),
                at,
                format!(
                    "a {what} through no pointer param (a by-value argument used as an address)"
                ),
            ));
        };
        let width = a.width;
        if width == 0 || offset.iter().any(|t| t.coef % u64::from(width) != 0) {
            return Err(refuse(
                SubReason::NonElementwiseAddress,
                name(base),
                at,
                format!("a {width}-byte {what} at an offset that is no multiple of its width"),
            ));
        }
        let elements = Poly(
            offset
                .into_iter()
                .map(|t| Term {
                    atoms: t.atoms,
                    coef: t.coef / u64::from(width),
                })
                .collect(),
        );
        if (a.store && base != output) || (!a.store && base == output) {
            return Err(refuse(
                SubReason::PointerMisuse,
                name(base),
                at,
                if a.store {
                    "a store through an input"
                } else {
                    "a load through the output"
                },
            ));
        }
        let u = &mut uses[usize::from(base)];
        match &u.form {
            Some(f) if *f != (elements.clone(), width) => {
                return Err(refuse(
                    SubReason::NonElementwiseAddress,
                    name(base),
                    at,
                    "two accesses through one pointer at different offsets or widths",
                ))
            }
            _ => u.form = Some((elements, width)),
        }
        if a.store {
            u.written = true;
        } else {
            u.read = true;
        }
    }
    for p in 0..count {
        let u = &uses[usize::from(p)];
        if p == output && !u.written {
            return Err(refuse(
                SubReason::NoOutputStore,
                name(p),
                Some(k.line),
                "the output is never stored",
            ));
        }
        if p != output && !u.read {
            return Err(refuse(
                SubReason::UnusedInput,
                name(p),
                Some(k.line),
                "an input is never read",
            ));
        }
    }
    contract(k, count, ints, &uses)
}

/// The largest value of `atom` over `0 <= i < n`, for `n >= 1`.
fn atom_max(a: Atom, arg: &impl Fn(u16) -> Expr) -> Expr {
    let last = || Expr::SatSub(Box::new(Expr::Count), Box::new(Expr::Const(1)));
    match a {
        Atom::Index => last(),
        Atom::Quot(d) => Expr::Div(Box::new(last()), Box::new(arg(d))),
        Atom::Rem(d) => Expr::SatSub(
            Box::new(Expr::Min(Box::new(arg(d)), Box::new(Expr::Count))),
            Box::new(Expr::Const(1)),
        ),
        Atom::Param(p) => arg(p),
    }
}

fn contract(k: &Kernel, count: u16, ints: usize, uses: &[Uses]) -> Result<Verified, PtxError> {
    let param_ty = |p: usize| {
        k.params
            .get(p)
            .and_then(|x| ScalarType::from_ptx(&x.ty))
            .unwrap_or(ScalarType::U64)
    };
    let mut params = Vec::with_capacity(k.params.len());
    let mut roles = Vec::with_capacity(k.params.len());
    let output = count - 1;
    // The scalar index of each argument param.
    let mut scalar_of: BTreeMap<u16, u16> = BTreeMap::new();
    let mut scalars = 0u32;
    for (i, p) in k.params.iter().enumerate() {
        let ix = u16::try_from(i).unwrap_or(u16::MAX);
        let kind = if ix < output {
            roles.push(Role::Input(u32::from(ix)));
            ParamKind::Pointer {
                access: PointerAccess::Read,
                operand: Some(u32::from(ix)),
            }
        } else if ix == output {
            roles.push(Role::Output);
            ParamKind::Pointer {
                access: PointerAccess::Written,
                operand: Some(u32::from(output)),
            }
        } else if ix == count {
            roles.push(Role::Count);
            ParamKind::Count(ScalarType::S64)
        } else {
            roles.push(Role::Scalar(scalars));
            scalar_of.insert(ix, u16::try_from(scalars).unwrap_or(u16::MAX));
            scalars += 1;
            ParamKind::Scalar(if i < ints {
                param_ty(i)
            } else {
                ScalarType::F32
            })
        };
        params.push(ContractParam {
            name: p.name.clone(),
            kind,
        });
    }
    let arg = |p: u16| Expr::Arg(scalar_of.get(&p).copied().unwrap_or(u16::MAX));
    let mut footprints = Vec::with_capacity(uses.len());
    let mut divisors: Vec<u16> = Vec::new();
    let mut scaling: Vec<u16> = Vec::new();
    let mut element_sizes = Vec::with_capacity(uses.len());
    let mut fits = Vec::new();
    for (p, u) in uses.iter().enumerate() {
        let (form, width) = u.form.clone().unwrap_or((Poly::default(), 1));
        // Σ coef × Π max(atom) + 1 elements, none when n = 0. A term `i`
        // or `i % d` (coefficient 1) takes the `+ 1` as `n` or
        // `min(d, n)`; when every other term holds an index atom too (0 at
        // n = 0) that is the whole sum, else it is `min(n, 1) × (.. + 1)`.
        let closing = form.0.iter().position(|t| {
            t.coef == 1 && matches!(t.atoms.as_slice(), [Atom::Index] | [Atom::Rem(_)])
        });
        let indexed = form.0.iter().enumerate().all(|(k, t)| {
            Some(k) == closing || t.atoms.iter().any(|a| !matches!(a, Atom::Param(_)))
        });
        let mut max: Option<Expr> = None;
        for (k, t) in form.0.iter().enumerate() {
            for a in &t.atoms {
                match a {
                    Atom::Quot(d) | Atom::Rem(d) => divisors.push(*d),
                    Atom::Param(s) => scaling.push(*s),
                    Atom::Index => {}
                }
            }
            let term = match t.atoms.as_slice() {
                [Atom::Index] if indexed && Some(k) == closing => Expr::Count,
                [Atom::Rem(d)] if indexed && Some(k) == closing => {
                    Expr::Min(Box::new(arg(*d)), Box::new(Expr::Count))
                }
                atoms => atoms.iter().fold(Expr::Const(t.coef), |e, a| {
                    if matches!(e, Expr::Const(1)) {
                        atom_max(*a, &arg)
                    } else {
                        Expr::product(e, atom_max(*a, &arg))
                    }
                }),
            };
            max = Some(match max {
                None => term,
                Some(m) => Expr::sum(m, term),
            });
        }
        let elements = match max {
            Some(sum) if indexed && closing.is_some() => sum,
            max => Expr::product(
                Expr::Min(Box::new(Expr::Count), Box::new(Expr::Const(1))),
                Expr::sum(max.unwrap_or(Expr::Const(0)), Expr::Const(1)),
            ),
        };
        let bytes = Expr::product(elements, Expr::Const(u64::from(width)));
        fits.push(Precondition {
            name: STRIDED_INDEX_FITS_I64,
            condition: Condition::AtMost(bytes.clone(), i64::MAX as u128),
        });
        element_sizes.push(width);
        footprints.push(Footprint {
            param: u16::try_from(p).unwrap_or(u16::MAX),
            alignment: width,
            bytes,
        });
    }
    divisors.sort_unstable();
    divisors.dedup();
    scaling.sort_unstable();
    scaling.dedup();
    scaling.retain(|s| !divisors.contains(s));
    let mut preconditions = vec![Precondition {
        name: COUNT_FITS_I64,
        condition: Condition::AtMost(Expr::Count, i64::MAX as u128),
    }];
    preconditions.extend(divisors.iter().map(|&d| Precondition {
        name: DIVISOR_POSITIVE,
        condition: Condition::AtLeast(arg(d), 1),
    }));
    preconditions.extend(scaling.iter().map(|&s| Precondition {
        name: ARG_NONNEGATIVE,
        condition: Condition::AtLeast(arg(s), 0),
    }));
    for p in fits {
        if !preconditions.contains(&p) {
            preconditions.push(p);
        }
    }
    let block = match (k.reqntid, k.maxntid) {
        (Some([x, 1, 1]), _) => BlockRule::Required(x),
        (None, Some([x, 1, 1])) => BlockRule::AtMost(x),
        _ => BlockRule::Default,
    };
    let signature = Signature {
        inputs: u32::from(output),
        element_sizes,
        scalar_params: scalars,
        reqntid: k.reqntid.map(|r| r[0]),
        maxntid: k.maxntid.map(|r| r[0]),
    };
    Ok(Verified {
        signature,
        roles,
        contract: LaunchContract {
            params,
            geometry: Geometry {
                block,
                elements_per_thread: 1,
            },
            footprints,
            preconditions,
        },
    })
}
