//! Decoding a verified kernel into the engine's compact form: every operand
//! becomes a register-file row (immediates and special registers get rows of
//! their own, filled before the kernel runs), every opcode an [`Op`] with its
//! types and modes resolved. No strings survive into a launch.
//!
//! Invariant: decoding succeeds only if every instruction is one the engine
//! runs with the documented semantics; otherwise it fails with
//! `UnsupportedOnHost` naming the instruction, so a launch never meets an
//! instruction it cannot run.

use std::collections::HashMap;

use super::float::Rnd;
use crate::ptx::contract::{LaunchContract, ParamKind};
use crate::ptx::ir::{Base, Inst, Kernel, Opnd, Sreg, Ty};
use crate::ptx::parse::Imm;
use crate::ptx::PtxError;

/// A register-file row.
pub type Row = u32;

/// A float format the engine computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FTy {
    F16,
    Bf16,
    F32,
    F64,
}

/// Float operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FOp {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
    Copysign,
    Fma,
    Neg,
    Abs,
    Sqrt,
    Rcp,
    Rsqrt,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Tanh,
}

/// Integer operations (`bits` and signedness travel beside them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IOp {
    Add,
    AddSat,
    Sub,
    SubSat,
    MulLo,
    MulHi,
    MulWide,
    MadLo,
    MadHi,
    MadWide,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Neg,
    Abs,
    Not,
    Cnot,
    Popc,
    Clz,
    Brev,
    /// `bfe`: `a`'s bits from `b & 0xff`, `c & 0xff` of them,
    /// sign-extended from the field's top bit for a signed type.
    Bfe,
}

/// A comparison of `setp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// The rounding of `cvt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CvtRnd {
    None,
    Float(Rnd),
    /// `.rni .rzi .rmi .rpi`: to an integral value.
    Int(Rnd),
}

/// A decoded operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// `d = a & mask`.
    Mov {
        d: Row,
        a: Row,
        mask: u64,
    },
    Int {
        op: IOp,
        bits: u32,
        signed: bool,
        d: Row,
        a: Row,
        b: Row,
        c: Row,
    },
    Float {
        op: FOp,
        ty: FTy,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: Row,
        a: Row,
        b: Row,
        c: Row,
    },
    Cvt {
        to: Ty,
        from: Ty,
        rnd: CvtRnd,
        ftz: bool,
        sat: bool,
        relu: bool,
        d: Row,
        a: Row,
    },
    /// `d = cmp(a, b)` (0 or 1); the `.and/.or/.xor` forms are decoded as
    /// a following [`Op::Int`] on predicates.
    Setp {
        cmp: Cmp,
        ty: Ty,
        ftz: bool,
        d: Row,
        a: Row,
        b: Row,
    },
    /// `d = p ? a : b`.
    Selp {
        d: Row,
        a: Row,
        b: Row,
        p: Row,
    },
    /// `d = mem[a + off]`, `width` bytes, sign-extended when `signed`,
    /// masked to the destination's width.
    Ld {
        d: Row,
        a: Row,
        off: i64,
        width: u8,
        signed: bool,
        mask: u64,
    },
    St {
        a: Row,
        off: i64,
        v: Row,
        width: u8,
    },
    Bra {
        target: u32,
    },
    Ret,
}

/// A decoded instruction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DInst {
    pub op: Op,
    /// `@p` / `@!p`: (row, negated).
    pub guard: Option<(Row, bool)>,
    pub line: u32,
}

/// Where a uniform row's value comes from at launch: each param as the
/// contract names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Uniform {
    Const(u64),
    /// The address of launch operand `k` (the inputs in order, then the
    /// output).
    Operand(u32),
    /// A pointer the kernel never dereferences: null, which no span holds,
    /// so checked mode faults on any access through it.
    Null,
    /// The element count `n` (the launch checks it fits the count's type).
    Count,
    /// The contract's `k`-th by-value scalar, as its bits.
    Scalar(u32),
    Ntid,
    Nctaid,
}

/// The decoded program.
#[derive(Debug, Clone)]
pub struct Program {
    pub code: Vec<DInst>,
    pub rows: u32,
    /// Rows filled once per launch.
    pub uniforms: Vec<(Row, Uniform)>,
    pub tid_row: Row,
    pub ctaid_row: Row,
}

fn width_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

struct Decoder<'a> {
    k: &'a Kernel,
    /// Each param's value at launch, by param index.
    params: Vec<Option<Uniform>>,
    rows: u32,
    uniforms: Vec<(Row, Uniform)>,
    uniform_rows: HashMap<Uniform, Row>,
    tid_row: Row,
    ctaid_row: Row,
}

/// A 32-bit unsigned integer operation of two sources.
fn int32(op: IOp, d: Row, a: Row, b: Row) -> Op {
    Op::Int {
        op,
        bits: 32,
        signed: false,
        d,
        a,
        b,
        c: b,
    }
}

fn unsupported(inst: &Inst) -> PtxError {
    PtxError::UnsupportedOnHost {
        opcode: inst.opcode.clone(),
        line: inst.line,
    }
}

impl Decoder<'_> {
    fn fresh(&mut self) -> Row {
        let r = self.rows;
        self.rows += 1;
        r
    }

    fn uniform(&mut self, u: Uniform) -> Row {
        if let Some(r) = self.uniform_rows.get(&u) {
            return *r;
        }
        let r = self.fresh();
        self.uniforms.push((r, u));
        self.uniform_rows.insert(u, r);
        r
    }

    fn imm_bits(v: Imm, ty: Ty) -> u64 {
        use super::float::{round, round_int, BF16, F16, F32};
        use std::cmp::Ordering::Equal;
        let as_f64 = match v {
            Imm::Int(i) => i as f64,
            Imm::F32(b) => f64::from(f32::from_bits(b)),
            Imm::F64(b) => f64::from_bits(b),
        };
        match (ty, v) {
            (Ty::F64, _) => as_f64.to_bits(),
            (Ty::F32, Imm::Int(i)) => round_int(i128::from(i), F32, Rnd::Rn),
            (Ty::F32, _) => round(as_f64, Equal, F32, Rnd::Rn),
            (Ty::F16, Imm::Int(i)) => round_int(i128::from(i), F16, Rnd::Rn),
            (Ty::F16, _) => round(as_f64, Equal, F16, Rnd::Rn),
            (Ty::Bf16, Imm::Int(i)) => round_int(i128::from(i), BF16, Rnd::Rn),
            (Ty::Bf16, _) => round(as_f64, Equal, BF16, Rnd::Rn),
            (_, Imm::Int(i)) => (i as u64) & width_mask(ty.bits().max(1)),
            (_, Imm::F32(b)) => u64::from(b),
            (_, Imm::F64(b)) => b & width_mask(ty.bits().max(1)),
        }
    }

    /// A source operand as a row; `ty` types an immediate.
    fn src(&mut self, inst: &Inst, o: Option<&Opnd>, ty: Ty) -> Result<Row, PtxError> {
        Ok(match o {
            Some(Opnd::Reg(r)) => *r,
            Some(Opnd::Imm(v)) => self.uniform(Uniform::Const(Self::imm_bits(*v, ty))),
            Some(Opnd::Sreg(s)) => match s {
                Sreg::Tid(0) => self.tid_row,
                Sreg::Ctaid(0) => self.ctaid_row,
                Sreg::Ntid(0) => self.uniform(Uniform::Ntid),
                Sreg::Nctaid(0) => self.uniform(Uniform::Nctaid),
                Sreg::Tid(_) | Sreg::Ctaid(_) => self.uniform(Uniform::Const(0)),
                Sreg::Ntid(_) | Sreg::Nctaid(_) => self.uniform(Uniform::Const(1)),
                Sreg::Other(_) => return Err(unsupported(inst)),
            },
            _ => return Err(unsupported(inst)),
        })
    }

    /// A predicate source, possibly negated (`!%p`) → a row holding 0/1.
    fn pred_src(
        &mut self,
        inst: &Inst,
        o: Option<&Opnd>,
        out: &mut Vec<DInst>,
    ) -> Result<Row, PtxError> {
        match o {
            Some(Opnd::Not(r)) => {
                let t = self.fresh();
                let one = self.uniform(Uniform::Const(1));
                out.push(DInst {
                    op: Op::Int {
                        op: IOp::Xor,
                        bits: 1,
                        signed: false,
                        d: t,
                        a: *r,
                        b: one,
                        c: one,
                    },
                    guard: None,
                    line: inst.line,
                });
                Ok(t)
            }
            other => self.src(inst, other, Ty::Pred),
        }
    }

    /// `d = halves[1] << 16 | halves[0]` (each half holds 16 bits).
    fn pack_halves(&mut self, halves: [Row; 2], d: Row, mask: u64, emit: &mut impl FnMut(Op)) {
        let sixteen = self.uniform(Uniform::Const(16));
        let high = self.fresh();
        emit(int32(IOp::Shl, high, halves[1], sixteen));
        let joined = self.fresh();
        emit(int32(IOp::Or, joined, high, halves[0]));
        emit(Op::Mov { d, a: joined, mask });
    }

    fn dst(&self, inst: &Inst, o: Option<&Opnd>) -> Result<(Row, u64), PtxError> {
        match o {
            Some(Opnd::Reg(r)) => {
                let ty = self
                    .k
                    .reg_types
                    .get(*r as usize)
                    .copied()
                    .unwrap_or(Ty::Other);
                if ty == Ty::Other {
                    return Err(unsupported(inst));
                }
                Ok((*r, width_mask(if ty == Ty::Pred { 1 } else { ty.bits() })))
            }
            _ => Err(unsupported(inst)),
        }
    }

    fn decode(&mut self, inst: &Inst, out: &mut Vec<DInst>) -> Result<(), PtxError> {
        let guard = inst.guard.map(|(neg, r)| (r, neg));
        let tys = inst.types();
        let ty = tys.first().copied().unwrap_or(Ty::Other);
        let ops = &inst.ops;
        let line = inst.line;
        let emit = |op: Op, out: &mut Vec<DInst>| out.push(DInst { op, guard, line });
        let b = inst.base.as_str();
        let rnd = [
            ("rn", Rnd::Rn),
            ("rz", Rnd::Rz),
            ("rm", Rnd::Rm),
            ("rp", Rnd::Rp),
        ]
        .iter()
        .find(|(m, _)| inst.has(m))
        .map(|(_, r)| *r);
        let ftz = inst.has("ftz");
        let sat = inst.has("sat");
        match b {
            "ld" | "ldu" if inst.has("param") => {
                let Some(Opnd::Addr {
                    base: Base::Param(p),
                    offset: 0,
                }) = ops.get(1)
                else {
                    return Err(unsupported(inst));
                };
                let Some(u) = self.params.get(*p as usize).copied().flatten() else {
                    return Err(unsupported(inst));
                };
                // A load narrower than its destination zero-extends, or
                // sign-extends for a signed type (an `.s32` scalar into a
                // 64-bit register).
                let lty = tys.last().copied().unwrap_or(Ty::Other);
                let (d, dmask) = self.dst(inst, ops.first())?;
                if lty == Ty::Other || lty == Ty::Pred {
                    return Err(unsupported(inst));
                }
                let a = self.uniform(u);
                let mask = dmask & width_mask(lty.bits());
                if lty.is_signed() && mask < dmask {
                    let wide = match dmask.count_ones() {
                        16 => Ty::S16,
                        32 => Ty::S32,
                        _ => Ty::S64,
                    };
                    let narrow = self.fresh();
                    emit(Op::Mov { d: narrow, a, mask }, out);
                    let widen = Op::Cvt {
                        to: wide,
                        from: lty,
                        rnd: CvtRnd::None,
                        ftz: false,
                        sat: false,
                        relu: false,
                        d,
                        a: narrow,
                    };
                    emit(widen, out);
                } else {
                    emit(Op::Mov { d, a, mask }, out);
                }
            }
            "ld" | "ldu" | "st" => {
                let lty = tys.last().copied().unwrap_or(Ty::Other);
                let width = u8::try_from(lty.bytes()).unwrap_or(0);
                if !matches!(width, 1 | 2 | 4 | 8) || lty == Ty::Pred {
                    return Err(unsupported(inst));
                }
                let (ai, vi) = if b == "st" { (0, 1) } else { (1, 0) };
                let Some(Opnd::Addr {
                    base: Base::Reg(a),
                    offset,
                }) = ops.get(ai)
                else {
                    return Err(unsupported(inst));
                };
                // A `.v2`/`.v4` access is one scalar access per register of
                // its list, lane j at `offset + j × width`.
                let lanes: Vec<&Opnd> = match ops.get(vi) {
                    Some(Opnd::List(items)) => items.iter().collect(),
                    Some(o) => vec![o],
                    None => return Err(unsupported(inst)),
                };
                let lane_offset = |j: usize| {
                    i64::try_from(j)
                        .ok()
                        .and_then(|j| j.checked_mul(i64::from(width)))
                        .and_then(|d| offset.checked_add(d))
                        .ok_or_else(|| unsupported(inst))
                };
                if b == "st" {
                    for (j, o) in lanes.iter().enumerate() {
                        let v = self.src(inst, Some(o), lty)?;
                        emit(
                            Op::St {
                                a: *a,
                                off: lane_offset(j)?,
                                v,
                                width,
                            },
                            out,
                        );
                    }
                } else {
                    // The lane that overwrites the address register loads
                    // last, so every lane reads through the address as the
                    // instruction found it (the list names no register twice).
                    let mut order: Vec<usize> = (0..lanes.len()).collect();
                    order.sort_by_key(|j| matches!(lanes[*j], Opnd::Reg(r) if r == a));
                    for j in order {
                        if matches!(lanes[j], Opnd::Sink) {
                            continue;
                        }
                        let (d, mask) = self.dst(inst, Some(lanes[j]))?;
                        emit(
                            Op::Ld {
                                d,
                                a: *a,
                                off: lane_offset(j)?,
                                width,
                                signed: lty.is_signed(),
                                mask,
                            },
                            out,
                        );
                    }
                }
            }
            // `shf.{l,r}.{wrap,clamp}.b32 d, a, b, c`: the funnel shift of
            // the 64-bit `b:a` by `n = c & 31` (wrap) or `min(c, 32)`
            // (clamp); `.l` keeps the high word of `(b:a) << n`, `.r` the
            // low word of `(b:a) >> n`.
            "shf"
                if ty.bits() == 32 && ops.len() == 4 && (inst.has("wrap") || inst.has("clamp")) =>
            {
                let left = inst.has("l");
                if left == inst.has("r") {
                    return Err(unsupported(inst));
                }
                let a = self.src(inst, ops.get(1), ty)?;
                let bb = self.src(inst, ops.get(2), ty)?;
                let c = self.src(inst, ops.get(3), Ty::U32)?;
                let word = self.uniform(Uniform::Const(0xFFFF_FFFF));
                let k31 = self.uniform(Uniform::Const(31));
                let k32 = self.uniform(Uniform::Const(32));
                let mut int = |op, bits, a, b, out: &mut Vec<DInst>| {
                    let d = self.fresh();
                    emit(
                        Op::Int {
                            op,
                            bits,
                            signed: false,
                            d,
                            a,
                            b,
                            c: b,
                        },
                        out,
                    );
                    d
                };
                let n = if inst.has("wrap") {
                    int(IOp::And, 32, c, k31, out)
                } else {
                    int(IOp::Min, 32, c, k32, out)
                };
                let lo = int(IOp::And, 64, a, word, out);
                let hi32 = int(IOp::And, 64, bb, word, out);
                let hi = int(IOp::Shl, 64, hi32, k32, out);
                let t = int(IOp::Or, 64, hi, lo, out);
                let f = if left {
                    let up = int(IOp::Shl, 64, t, n, out);
                    int(IOp::Shr, 64, up, k32, out)
                } else {
                    let down = int(IOp::Shr, 64, t, n, out);
                    int(IOp::And, 64, down, word, out)
                };
                let (d, dmask) = self.dst(inst, ops.first())?;
                emit(
                    Op::Mov {
                        d,
                        a: f,
                        mask: dmask,
                    },
                    out,
                );
            }
            // `bfi.bN f, a, b, pos, len`: `b` with `len` bits of `a` put at
            // `pos` (both `& 0xff`); bits past the word are dropped, so
            // `pos >= N` leaves `b` and `len >= N` takes every bit from
            // `pos` up. As integer ops: `mask = ((1 << len) - 1) << pos`
            // (a shift by N or more is 0, so `len >= N` makes all ones),
            // `f = (b & !mask) | ((a << pos) & mask)`.
            "bfi" if matches!(ty.bits(), 32 | 64) && ops.len() == 5 => {
                let bits = ty.bits();
                let a = self.src(inst, ops.get(1), ty)?;
                let bb = self.src(inst, ops.get(2), ty)?;
                let pos_in = self.src(inst, ops.get(3), Ty::U32)?;
                let len_in = self.src(inst, ops.get(4), Ty::U32)?;
                let byte = self.uniform(Uniform::Const(0xff));
                let one = self.uniform(Uniform::Const(1));
                let mut int = |op, a, b, out: &mut Vec<DInst>| {
                    let d = self.fresh();
                    emit(
                        Op::Int {
                            op,
                            bits,
                            signed: false,
                            d,
                            a,
                            b,
                            c: b,
                        },
                        out,
                    );
                    d
                };
                let pos = int(IOp::And, pos_in, byte, out);
                let len = int(IOp::And, len_in, byte, out);
                let top = int(IOp::Shl, one, len, out);
                let ones = int(IOp::Sub, top, one, out);
                let mask = int(IOp::Shl, ones, pos, out);
                let moved = int(IOp::Shl, a, pos, out);
                let inserted = int(IOp::And, moved, mask, out);
                let holes = int(IOp::Not, mask, mask, out);
                let kept = int(IOp::And, bb, holes, out);
                let f = int(IOp::Or, kept, inserted, out);
                let (d, dmask) = self.dst(inst, ops.first())?;
                emit(
                    Op::Mov {
                        d,
                        a: f,
                        mask: dmask,
                    },
                    out,
                );
            }
            // `mov.b64 {lo, hi}, x`: split into equal parts, low first.
            "mov" if matches!(ops.first(), Some(Opnd::List(_))) => {
                let Some(Opnd::List(parts)) = ops.first() else {
                    return Err(unsupported(inst));
                };
                let total = ty.bits();
                let k = u32::try_from(parts.len()).unwrap_or(0);
                if k == 0 || total == 0 || total % k != 0 {
                    return Err(unsupported(inst));
                }
                let w = total / k;
                let x = self.src(inst, ops.get(1), ty)?;
                for (i, part) in (0u32..).zip(parts) {
                    if matches!(part, Opnd::Sink) {
                        continue;
                    }
                    let (d, mask) = self.dst(inst, Some(part))?;
                    let shift = self.uniform(Uniform::Const(u64::from(i * w)));
                    let t = self.fresh();
                    let shr = Op::Int {
                        op: IOp::Shr,
                        bits: total,
                        signed: false,
                        d: t,
                        a: x,
                        b: shift,
                        c: shift,
                    };
                    emit(shr, out);
                    emit(
                        Op::Mov {
                            d,
                            a: t,
                            mask: mask & width_mask(w),
                        },
                        out,
                    );
                }
            }
            // `mov.b32 d, {lo, hi}`: join equal parts, low first.
            "mov" if matches!(ops.get(1), Some(Opnd::List(_))) => {
                let Some(Opnd::List(parts)) = ops.get(1) else {
                    return Err(unsupported(inst));
                };
                let total = ty.bits();
                let k = u32::try_from(parts.len()).unwrap_or(0);
                if k == 0 || total == 0 || total % k != 0 {
                    return Err(unsupported(inst));
                }
                let w = total / k;
                let part_ty = match w {
                    8 => Ty::B8,
                    16 => Ty::B16,
                    32 => Ty::B32,
                    _ => return Err(unsupported(inst)),
                };
                let (d, mask) = self.dst(inst, ops.first())?;
                let mut acc = self.uniform(Uniform::Const(0));
                for (i, part) in (0u32..).zip(parts) {
                    let v = self.src(inst, Some(part), part_ty)?;
                    let low = self.fresh();
                    let keep = self.uniform(Uniform::Const(width_mask(w)));
                    let int = |op, d, a, b| Op::Int {
                        op,
                        bits: total,
                        signed: false,
                        d,
                        a,
                        b,
                        c: b,
                    };
                    emit(int(IOp::And, low, v, keep), out);
                    let shift = self.uniform(Uniform::Const(u64::from(i * w)));
                    let shifted = self.fresh();
                    emit(int(IOp::Shl, shifted, low, shift), out);
                    let next = self.fresh();
                    emit(int(IOp::Or, next, acc, shifted), out);
                    acc = next;
                }
                emit(Op::Mov { d, a: acc, mask }, out);
            }
            // `set.cmp.dtype.stype`: 1.0 (float dtype) or all ones, else 0.
            "set" => {
                let (dty, cty) = match tys.as_slice() {
                    [d, c] if *c != Ty::Other && *c != Ty::Pred => (*d, *c),
                    _ => return Err(unsupported(inst)),
                };
                let cmp = comparison(inst).ok_or_else(|| unsupported(inst))?;
                if ops.len() != 3 {
                    return Err(unsupported(inst));
                }
                let true_bits = match dty {
                    Ty::F16 => 0x3C00,
                    Ty::Bf16 => 0x3F80,
                    Ty::F32 => 0x3F80_0000,
                    t if t.is_int() => width_mask(t.bits()),
                    _ => return Err(unsupported(inst)),
                };
                let a = self.src(inst, ops.get(1), cty)?;
                let bb = self.src(inst, ops.get(2), cty)?;
                let raw = self.fresh();
                emit(
                    Op::Setp {
                        cmp,
                        ty: cty,
                        ftz,
                        d: raw,
                        a,
                        b: bb,
                    },
                    out,
                );
                let yes = self.uniform(Uniform::Const(true_bits));
                let no = self.uniform(Uniform::Const(0));
                let (d, _) = self.dst(inst, ops.first())?;
                emit(
                    Op::Selp {
                        d,
                        a: yes,
                        b: no,
                        p: raw,
                    },
                    out,
                );
            }
            // A cache policy is opaque: only `.L2::cache_hint` accesses read
            // one, and the IR drops that hint with its operand.
            "createpolicy" => {
                let (d, mask) = self.dst(inst, ops.first())?;
                let a = self.uniform(Uniform::Const(0));
                emit(Op::Mov { d, a, mask }, out);
            }
            // `cvt.rn.{f16x2,bf16x2}.f32 d, a, b`: `a` rounded into the
            // upper half, `b` into the lower.
            "cvt" if inst.has("f16x2") || inst.has("bf16x2") => {
                let half = if inst.has("f16x2") { Ty::F16 } else { Ty::Bf16 };
                if inst.types() != [Ty::Other, Ty::F32]
                    || rnd != Some(Rnd::Rn)
                    || inst.has("satfinite")
                    || ops.len() != 3
                {
                    return Err(unsupported(inst));
                }
                let mut halves = [0; 2];
                for (h, o) in halves.iter_mut().zip([ops.get(2), ops.get(1)]) {
                    let a = self.src(inst, o, Ty::F32)?;
                    *h = self.fresh();
                    let cvt = Op::Cvt {
                        to: half,
                        from: Ty::F32,
                        rnd: CvtRnd::Float(Rnd::Rn),
                        ftz,
                        sat,
                        relu: inst.has("relu"),
                        d: *h,
                        a,
                    };
                    emit(cvt, out);
                }
                let (d, mask) = self.dst(inst, ops.first())?;
                self.pack_halves(halves, d, mask, &mut |op| emit(op, out));
            }
            // Packed `.f16x2`/`.bf16x2` arithmetic: each half on its own,
            // low half from the low halves.
            _ if inst.has("f16x2") || inst.has("bf16x2") => {
                let fty = if inst.has("f16x2") {
                    FTy::F16
                } else {
                    FTy::Bf16
                };
                let (fop, sources) = match b {
                    "add" => (FOp::Add, 2),
                    "sub" => (FOp::Sub, 2),
                    "mul" => (FOp::Mul, 2),
                    "fma" => (FOp::Fma, 3),
                    "min" => (FOp::Min, 2),
                    "max" => (FOp::Max, 2),
                    "neg" => (FOp::Neg, 1),
                    "abs" => (FOp::Abs, 1),
                    _ => return Err(unsupported(inst)),
                };
                // `.ftz` on a half type and directed rounding are not built.
                if ops.len() != sources + 1 || ftz || rnd.is_some_and(|r| r != Rnd::Rn) {
                    return Err(unsupported(inst));
                }
                let mut srcs = Vec::with_capacity(sources);
                for i in 1..=sources {
                    srcs.push(self.src(inst, ops.get(i), Ty::B32)?);
                }
                let sixteen = self.uniform(Uniform::Const(16));
                let mut halves = [0; 2];
                for (h, half) in halves.iter_mut().enumerate() {
                    let mut parts = [0; 3];
                    for (part, &src) in parts.iter_mut().zip(&srcs) {
                        let shifted = if h == 0 {
                            src
                        } else {
                            let t = self.fresh();
                            emit(int32(IOp::Shr, t, src, sixteen), out);
                            t
                        };
                        *part = self.fresh();
                        emit(
                            Op::Mov {
                                d: *part,
                                a: shifted,
                                mask: 0xFFFF,
                            },
                            out,
                        );
                    }
                    let [a, bb, c] = match sources {
                        1 => [parts[0]; 3],
                        2 => [parts[0], parts[1], parts[0]],
                        _ => parts,
                    };
                    *half = self.fresh();
                    emit(
                        Op::Float {
                            op: fop,
                            ty: fty,
                            rnd: Rnd::Rn,
                            ftz: false,
                            sat,
                            d: *half,
                            a,
                            b: bb,
                            c,
                        },
                        out,
                    );
                }
                let (d, mask) = self.dst(inst, ops.first())?;
                self.pack_halves(halves, d, mask, &mut |op| emit(op, out));
            }
            "mov" | "cvta" => {
                let sty = if b == "cvta" { Ty::U64 } else { ty };
                let a = self.src(inst, ops.get(1), sty)?;
                let (d, mask) = self.dst(inst, ops.first())?;
                emit(Op::Mov { d, a, mask }, out);
            }
            "cvt" => {
                let (to, from) = match tys.as_slice() {
                    [to, from]
                        if *to != Ty::Other
                            && *from != Ty::Other
                            && *to != Ty::Pred
                            && *from != Ty::Pred =>
                    {
                        (*to, *from)
                    }
                    _ => return Err(unsupported(inst)),
                };
                let irnd = [
                    ("rni", Rnd::Rn),
                    ("rzi", Rnd::Rz),
                    ("rmi", Rnd::Rm),
                    ("rpi", Rnd::Rp),
                ]
                .iter()
                .find(|(m, _)| inst.has(m))
                .map(|(_, r)| *r);
                let rnd = match (irnd, rnd) {
                    (Some(r), _) => CvtRnd::Int(r),
                    (None, Some(r)) => CvtRnd::Float(r),
                    (None, None) => CvtRnd::None,
                };
                let a = self.src(inst, ops.get(1), from)?;
                let (d, _) = self.dst(inst, ops.first())?;
                emit(
                    Op::Cvt {
                        to,
                        from,
                        rnd,
                        ftz,
                        sat,
                        relu: inst.has("relu"),
                        d,
                        a,
                    },
                    out,
                );
            }
            "setp" => {
                let cty = *tys.last().unwrap_or(&Ty::Other);
                if cty == Ty::Other || cty == Ty::Pred {
                    return Err(unsupported(inst));
                }
                let cmp = comparison(inst).ok_or_else(|| unsupported(inst))?;
                let bool_op = [("and", IOp::And), ("or", IOp::Or), ("xor", IOp::Xor)]
                    .iter()
                    .find(|(m, _)| inst.has(m))
                    .map(|(_, o)| *o);
                let a = self.src(inst, ops.get(1), cty)?;
                let bb = self.src(inst, ops.get(2), cty)?;
                let (p, q) = match ops.first() {
                    Some(Opnd::Reg(p)) => (*p, None),
                    Some(Opnd::Pair(p, q)) => (*p, Some(*q)),
                    _ => return Err(unsupported(inst)),
                };
                let raw = self.fresh();
                emit(
                    Op::Setp {
                        cmp,
                        ty: cty,
                        ftz,
                        d: raw,
                        a,
                        b: bb,
                    },
                    out,
                );
                let one = self.uniform(Uniform::Const(1));
                let zero = self.uniform(Uniform::Const(0));
                let c = match bool_op {
                    Some(_) => self.pred_src(inst, ops.get(3), out)?,
                    None => zero,
                };
                let combine = bool_op.unwrap_or(IOp::Or);
                let pred = |op, d, a, b| Op::Int {
                    op,
                    bits: 1,
                    signed: false,
                    d,
                    a,
                    b,
                    c: b,
                };
                if let Some(q) = q {
                    let nraw = self.fresh();
                    emit(pred(IOp::Xor, nraw, raw, one), out);
                    emit(pred(combine, p, raw, c), out);
                    emit(pred(combine, q, nraw, c), out);
                } else {
                    emit(pred(combine, p, raw, c), out);
                }
            }
            "selp" => {
                let a = self.src(inst, ops.get(1), ty)?;
                let bb = self.src(inst, ops.get(2), ty)?;
                let p = self.pred_src(inst, ops.get(3), out)?;
                let (d, _) = self.dst(inst, ops.first())?;
                out.push(DInst {
                    op: Op::Selp { d, a, b: bb, p },
                    guard,
                    line,
                });
            }
            "bra" => match ops.first() {
                Some(Opnd::Label(t)) => emit(Op::Bra { target: *t }, out),
                _ => return Err(unsupported(inst)),
            },
            "ret" | "exit" => emit(Op::Ret, out),
            _ if ty.is_float() => {
                let fty = match ty {
                    Ty::F16 => FTy::F16,
                    Ty::Bf16 => FTy::Bf16,
                    Ty::F32 => FTy::F32,
                    _ => FTy::F64,
                };
                let fop = match b {
                    "add" => FOp::Add,
                    "sub" => FOp::Sub,
                    "mul" => FOp::Mul,
                    "div" => FOp::Div,
                    "min" => FOp::Min,
                    "max" => FOp::Max,
                    "copysign" => FOp::Copysign,
                    "fma" | "mad" => FOp::Fma,
                    "neg" => FOp::Neg,
                    "abs" => FOp::Abs,
                    "sqrt" => FOp::Sqrt,
                    "rcp" => FOp::Rcp,
                    "rsqrt" => FOp::Rsqrt,
                    "ex2" => FOp::Ex2,
                    "lg2" => FOp::Lg2,
                    "sin" => FOp::Sin,
                    "cos" => FOp::Cos,
                    "tanh" => FOp::Tanh,
                    _ => return Err(unsupported(inst)),
                };
                let transcendental = matches!(
                    fop,
                    FOp::Ex2 | FOp::Lg2 | FOp::Sin | FOp::Cos | FOp::Tanh | FOp::Rsqrt
                );
                // Directed f64 fma needs a triple-length sum; not built.
                let directed = rnd.is_some_and(|r| r != Rnd::Rn);
                if (fop == FOp::Fma && fty == FTy::F64 && directed)
                    || (transcendental
                        && fty != FTy::F32
                        && !(fop == FOp::Rsqrt && fty == FTy::F64))
                    || (matches!(fty, FTy::F16 | FTy::Bf16)
                        && !matches!(
                            fop,
                            FOp::Add
                                | FOp::Sub
                                | FOp::Mul
                                | FOp::Fma
                                | FOp::Neg
                                | FOp::Abs
                                | FOp::Min
                                | FOp::Max
                        ))
                {
                    return Err(unsupported(inst));
                }
                let a = self.src(inst, ops.get(1), ty)?;
                let bb = if ops.len() > 2 {
                    self.src(inst, ops.get(2), ty)?
                } else {
                    a
                };
                let c = if ops.len() > 3 {
                    self.src(inst, ops.get(3), ty)?
                } else {
                    a
                };
                let (d, _) = self.dst(inst, ops.first())?;
                emit(
                    Op::Float {
                        op: fop,
                        ty: fty,
                        rnd: rnd.unwrap_or(Rnd::Rn),
                        ftz,
                        sat,
                        d,
                        a,
                        b: bb,
                        c,
                    },
                    out,
                );
            }
            _ if ty.is_int() || ty == Ty::Pred => {
                let wide = inst.has("wide");
                let hi = inst.has("hi");
                let iop = match b {
                    "add" if sat => IOp::AddSat,
                    "add" => IOp::Add,
                    "sub" if sat => IOp::SubSat,
                    "sub" => IOp::Sub,
                    "mul" if wide => IOp::MulWide,
                    "mul" if hi => IOp::MulHi,
                    "mul" => IOp::MulLo,
                    "mad" if wide => IOp::MadWide,
                    "mad" if hi => IOp::MadHi,
                    "mad" => IOp::MadLo,
                    "div" => IOp::Div,
                    "rem" => IOp::Rem,
                    "min" => IOp::Min,
                    "max" => IOp::Max,
                    "and" => IOp::And,
                    "or" => IOp::Or,
                    "xor" => IOp::Xor,
                    "shl" => IOp::Shl,
                    "shr" => IOp::Shr,
                    "neg" => IOp::Neg,
                    "abs" => IOp::Abs,
                    "not" if ty == Ty::Pred => IOp::Xor,
                    "not" => IOp::Not,
                    "cnot" => IOp::Cnot,
                    "popc" => IOp::Popc,
                    "clz" => IOp::Clz,
                    "brev" => IOp::Brev,
                    "bfe" if matches!(ty.bits(), 32 | 64) => IOp::Bfe,
                    _ => return Err(unsupported(inst)),
                };
                if (sat && !(ty == Ty::S32 && matches!(iop, IOp::AddSat | IOp::SubSat)))
                    || (wide && ty.bits() > 32)
                {
                    return Err(unsupported(inst));
                }
                let bits = if ty == Ty::Pred { 1 } else { ty.bits() };
                let shift_ty = if matches!(iop, IOp::Shl | IOp::Shr | IOp::Bfe) {
                    Ty::U32
                } else {
                    ty
                };
                let wide_ty = match ty {
                    Ty::S16 => Ty::S32,
                    Ty::U16 => Ty::U32,
                    Ty::S32 => Ty::S64,
                    _ => Ty::U64,
                };
                let a = self.src(inst, ops.get(1), ty)?;
                let (bb, c) = if iop == IOp::Xor && b == "not" {
                    let one = self.uniform(Uniform::Const(1));
                    (one, one)
                } else {
                    let bb = if ops.len() > 2 {
                        self.src(inst, ops.get(2), shift_ty)?
                    } else {
                        a
                    };
                    let cty = match iop {
                        IOp::MadWide => wide_ty,
                        IOp::Bfe => Ty::U32,
                        _ => ty,
                    };
                    let c = if ops.len() > 3 {
                        self.src(inst, ops.get(3), cty)?
                    } else {
                        a
                    };
                    (bb, c)
                };
                let (d, _) = self.dst(inst, ops.first())?;
                emit(
                    Op::Int {
                        op: iop,
                        bits,
                        signed: ty.is_signed(),
                        d,
                        a,
                        b: bb,
                        c,
                    },
                    out,
                );
            }
            _ => return Err(unsupported(inst)),
        }
        Ok(())
    }
}

/// Each param's launch value as `contract` names it; `None` for a pointer
/// whose operand the launch does not pass (no param load may read it).
fn param_values(contract: &LaunchContract) -> Vec<Option<Uniform>> {
    let operands = contract.footprints.len();
    let mut scalars = 0u32;
    contract
        .params
        .iter()
        .map(|p| match p.kind {
            ParamKind::Pointer {
                operand: Some(k), ..
            } => (usize::try_from(k).is_ok_and(|k| k < operands)).then_some(Uniform::Operand(k)),
            ParamKind::Pointer { operand: None, .. } => Some(Uniform::Null),
            ParamKind::Count(_) => Some(Uniform::Count),
            ParamKind::Scalar(_) => {
                scalars += 1;
                Some(Uniform::Scalar(scalars - 1))
            }
        })
        .collect()
}

/// Decodes `k` for the engine, each param read as `contract` (the
/// verifier's, for the same kernel) names it.
pub fn decode(k: &Kernel, contract: &LaunchContract) -> Result<Program, PtxError> {
    let nregs = u32::try_from(k.reg_types.len()).map_err(|_| PtxError::UnsupportedOnHost {
        opcode: "(register file)".into(),
        line: k.line,
    })?;
    let mut d = Decoder {
        k,
        params: param_values(contract),
        rows: nregs + 2,
        uniforms: Vec::new(),
        uniform_rows: HashMap::new(),
        tid_row: nregs,
        ctaid_row: nregs + 1,
    };
    // Branch targets are instruction indices; decoding may expand one
    // instruction into several, so remap them afterwards.
    let mut code = Vec::with_capacity(k.insts.len());
    let mut start_of = Vec::with_capacity(k.insts.len() + 1);
    for inst in &k.insts {
        start_of.push(u32::try_from(code.len()).unwrap_or(u32::MAX));
        d.decode(inst, &mut code)?;
    }
    start_of.push(u32::try_from(code.len()).unwrap_or(u32::MAX));
    for di in &mut code {
        if let Op::Bra { target } = &mut di.op {
            *target = start_of.get(*target as usize).copied().unwrap_or(u32::MAX);
        }
    }
    Ok(Program {
        code,
        rows: d.rows,
        uniforms: d.uniforms,
        tid_row: d.tid_row,
        ctaid_row: d.ctaid_row,
    })
}

/// The comparison of a `setp`/`set` (its first modifier).
fn comparison(inst: &Inst) -> Option<Cmp> {
    Some(match inst.mods.first().map(String::as_str) {
        Some("eq") => Cmp::Eq,
        Some("ne") => Cmp::Ne,
        Some("lt") => Cmp::Lt,
        Some("le") => Cmp::Le,
        Some("gt") => Cmp::Gt,
        Some("ge") => Cmp::Ge,
        Some("lo") => Cmp::Lo,
        Some("ls") => Cmp::Ls,
        Some("hi") => Cmp::Hi,
        Some("hs") => Cmp::Hs,
        Some("equ") => Cmp::Equ,
        Some("neu") => Cmp::Neu,
        Some("ltu") => Cmp::Ltu,
        Some("leu") => Cmp::Leu,
        Some("gtu") => Cmp::Gtu,
        Some("geu") => Cmp::Geu,
        Some("num") => Cmp::Num,
        Some("nan") => Cmp::Nan,
        _ => return None,
    })
}
