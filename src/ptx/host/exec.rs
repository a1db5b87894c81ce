//! The engine's inner loop: runs a decoded program over batches of
//! [`LANES`] consecutive threads, registers stored structure-of-arrays (one
//! row of `LANES` u64 per register), one dispatch per instruction per batch.
//!
//! Divergence: lanes normally share one pc. After a branch that splits them,
//! each lane keeps its own pc and the engine always runs the lanes at the
//! smallest pc together (with a per-lane mask), so forward branches
//! reconverge at their join and backward branches (loops) run until every
//! lane leaves them. A per-batch step budget turns a kernel that never ends
//! into a fault instead of a hung executor, and a launch's [`LaunchControl`]
//! (its deadline, or an abort from another thread or a signal handler) is
//! looked at when a batch starts and every [`POLL_STEPS`] dispatches.
//!
//! Register values are kept zero-extended from their type's width; every
//! operation masks its result to the width it writes.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicU8, Ordering as AtomicOrdering};
use std::time::Instant;

use super::decode::{Cmp, CvtRnd, DInst, FOp, FTy, IOp, Op, Row};
use super::float::{self, decode as fdecode, round, round_f64, Format, Rnd, BF16, F16, F32};
use crate::ptx::ir::Ty;
use crate::ptx::HostFault;

/// Threads per batch.
pub const LANES: usize = 256;
/// Instruction dispatches one batch may take before it is declared hung.
pub const STEP_BUDGET: u64 = 1 << 28;

/// Dispatches between two looks at a launch's [`LaunchControl`]: a clock
/// read per 4096 dispatches of 256 lanes costs nothing measurable, and a
/// loop is stopped within a few milliseconds of its deadline.
pub const POLL_STEPS: u64 = 1 << 12;

/// Why a launch stopped before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// It ran past its deadline.
    Deadline,
    /// Someone aborted it (e.g. a SIGBUS handler: its memory went away).
    Aborted,
}

const RUNNING: u8 = 0;
const PAST_DEADLINE: u8 = 1;
const ABORTED: u8 = 2;

/// A launch's deadline and abort flag, shared by its worker threads and by
/// whoever may stop it. The first reason to stop sticks.
#[derive(Debug)]
pub struct LaunchControl {
    deadline: Option<Instant>,
    state: AtomicU8,
}

impl LaunchControl {
    pub fn new(deadline: Option<Instant>) -> LaunchControl {
        LaunchControl {
            deadline,
            state: AtomicU8::new(RUNNING),
        }
    }

    /// Asks the launch to stop. Async-signal-safe: one atomic operation.
    pub fn abort(&self) {
        let _ = self.state.compare_exchange(
            RUNNING,
            ABORTED,
            AtomicOrdering::AcqRel,
            AtomicOrdering::Relaxed,
        );
    }

    /// Why the launch was stopped, if it was.
    pub fn stopped(&self) -> Option<StopReason> {
        match self.state.load(AtomicOrdering::Acquire) {
            RUNNING => None,
            PAST_DEADLINE => Some(StopReason::Deadline),
            _ => Some(StopReason::Aborted),
        }
    }

    /// True when the launch must stop now (checks the clock).
    fn must_stop(&self) -> bool {
        if self.state.load(AtomicOrdering::Acquire) != RUNNING {
            return true;
        }
        match self.deadline {
            Some(deadline) if Instant::now() >= deadline => {
                let _ = self.state.compare_exchange(
                    RUNNING,
                    PAST_DEADLINE,
                    AtomicOrdering::AcqRel,
                    AtomicOrdering::Relaxed,
                );
                true
            }
            _ => false,
        }
    }

    fn fault(&self, line: u32) -> HostFault {
        let message = match self.stopped() {
            Some(StopReason::Deadline) => "the launch ran past its time budget",
            _ => "the launch was aborted",
        };
        HostFault {
            line,
            message: message.into(),
        }
    }
}

/// Where memory may be touched in checked mode: `(start, len)` ranges; and
/// the launch's control, if it has one.
#[derive(Debug, Clone, Default)]
pub struct Bounds<'a> {
    pub loads: Vec<(usize, usize)>,
    pub stores: Vec<(usize, usize)>,
    pub checked: bool,
    pub control: Option<&'a LaunchControl>,
}

/// Register rows and a scratch row.
#[derive(Debug)]
pub struct Regs {
    regs: Vec<u64>,
    tmp: Vec<u64>,
}

/// One worker's register file and per-lane control state.
#[derive(Debug)]
pub struct Frame {
    r: Regs,
    pc: Vec<u32>,
    live: Vec<bool>,
    /// Lanes at the current pc (diverged mode).
    mask: Vec<bool>,
    /// `mask` narrowed by an instruction's guard predicate.
    gmask: Vec<bool>,
}

impl Frame {
    pub fn new(rows: u32) -> Frame {
        Frame {
            r: Regs {
                regs: vec![0; rows as usize * LANES],
                tmp: vec![0; LANES],
            },
            pc: vec![0; LANES],
            live: vec![false; LANES],
            mask: vec![false; LANES],
            gmask: vec![false; LANES],
        }
    }

    /// Every row, scratch included, set to `v`.
    pub fn fill_all(&mut self, v: u64) {
        self.r.regs.fill(v);
        self.r.tmp.fill(v);
    }

    pub fn fill(&mut self, row: Row, v: u64) {
        let r = row as usize * LANES;
        self.r.regs[r..r + LANES].fill(v);
    }

    pub fn row_mut(&mut self, row: Row) -> &mut [u64] {
        let r = row as usize * LANES;
        &mut self.r.regs[r..r + LANES]
    }
}

#[inline(always)]
fn sext(v: u64, bits: u32) -> i64 {
    if bits >= 64 {
        v as i64
    } else {
        let s = 64 - bits;
        ((v << s) as i64) >> s
    }
}

#[inline(always)]
fn wmask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[inline(always)]
fn row(regs: &[u64], r: Row) -> &[u64] {
    let s = r as usize * LANES;
    &regs[s..s + LANES]
}

/// Computes `f` lane by lane into the scratch row, then writes the lanes of
/// `mask` (all when `None`) into row `d`.
#[inline(always)]
fn lanes3(
    f: &mut Regs,
    mask: Option<&[bool]>,
    d: Row,
    a: Row,
    b: Row,
    c: Row,
    op: impl Fn(u64, u64, u64) -> u64,
) {
    {
        let (ra, rb, rc) = (row(&f.regs, a), row(&f.regs, b), row(&f.regs, c));
        for (l, t) in f.tmp.iter_mut().enumerate() {
            *t = op(ra[l], rb[l], rc[l]);
        }
    }
    let s = d as usize * LANES;
    let rd = &mut f.regs[s..s + LANES];
    match mask {
        None => rd.copy_from_slice(&f.tmp),
        Some(m) => {
            for ((x, t), on) in rd.iter_mut().zip(&f.tmp).zip(m) {
                if *on {
                    *x = *t;
                }
            }
        }
    }
}

#[inline(always)]
fn lanes2(
    f: &mut Regs,
    mask: Option<&[bool]>,
    d: Row,
    a: Row,
    b: Row,
    op: impl Fn(u64, u64) -> u64,
) {
    {
        let (ra, rb) = (row(&f.regs, a), row(&f.regs, b));
        for (l, t) in f.tmp.iter_mut().enumerate() {
            *t = op(ra[l], rb[l]);
        }
    }
    let s = d as usize * LANES;
    let rd = &mut f.regs[s..s + LANES];
    match mask {
        None => rd.copy_from_slice(&f.tmp),
        Some(m) => {
            for ((x, t), on) in rd.iter_mut().zip(&f.tmp).zip(m) {
                if *on {
                    *x = *t;
                }
            }
        }
    }
}

fn fmt_of(t: FTy) -> Format {
    match t {
        FTy::F16 => F16,
        FTy::Bf16 => BF16,
        _ => F32,
    }
}

const F64_NAN: u64 = 0x7FFF_FFFF_FFFF_FFFF;

/// The NaN an f64 operation gives: the IEEE arithmetic operations keep the
/// first NaN operand's payload, quieted (as the H200 and x86 do:
/// `sub.f64 0x7ff8000000000001, 1.0` is `0x7ff8000000000001`); a NaN made
/// from non-NaN operands (`inf - inf`) is the GPU's canonical NaN.
fn f64_nan(op: FOp, a: u64, b: u64, c: u64) -> u64 {
    const QUIET: u64 = 1 << 51;
    let is_nan = |v: u64| f64::from_bits(v).is_nan();
    let operands: &[u64] = match op {
        FOp::Add | FOp::Sub | FOp::Mul | FOp::Div => &[a, b],
        FOp::Fma => &[a, b, c],
        _ => &[],
    };
    operands
        .iter()
        .find(|v| is_nan(**v))
        .map_or(F64_NAN, |v| v | QUIET)
}

/// Flushes an f32 subnormal (as f64) to a signed zero.
#[inline]
fn flush32(x: f64) -> f64 {
    if x != 0.0 && x.abs() < f64::from(f32::MIN_POSITIVE) {
        0.0f64.copysign(x)
    } else {
        x
    }
}

fn min_max(x: f64, y: f64, is_max: bool) -> f64 {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => f64::NAN,
        (true, false) => y,
        (false, true) => x,
        _ => {
            if x == y {
                // -0 < +0.
                let neg = if is_max {
                    x.is_sign_negative() && y.is_sign_negative()
                } else {
                    x.is_sign_negative() || y.is_sign_negative()
                };
                if neg {
                    -x.abs()
                } else {
                    x.abs()
                }
            } else if (x > y) == is_max {
                x
            } else {
                y
            }
        }
    }
}

/// The general float path: exact in f64, then correctly rounded.
#[allow(clippy::too_many_arguments)]
pub fn float_op(op: FOp, ty: FTy, rnd: Rnd, ftz: bool, sat: bool, a: u64, b: u64, c: u64) -> u64 {
    let dec = |v: u64| -> f64 {
        match ty {
            FTy::F64 => f64::from_bits(v),
            FTy::F32 => {
                let x = f64::from(f32::from_bits(v as u32));
                if ftz {
                    flush32(x)
                } else {
                    x
                }
            }
            t => fdecode(v, fmt_of(t)),
        }
    };
    let (x, y, z) = (dec(a), dec(b), dec(c));
    let eq = Ordering::Equal;
    let (mut r, eps) = match op {
        FOp::Add => float::two_sum(x, y),
        FOp::Sub => float::two_sum(x, -y),
        FOp::Mul => float::two_prod(x, y),
        FOp::Div => float::div_err(x, y),
        FOp::Fma if ty == FTy::F64 => (x.mul_add(y, z), eq),
        FOp::Fma => {
            // The product of two narrow floats is exact in f64.
            let p = x * y;
            if p.is_finite() {
                float::two_sum(p, z)
            } else {
                (p + z, eq)
            }
        }
        FOp::Min => (min_max(x, y, false), eq),
        FOp::Max => (min_max(x, y, true), eq),
        FOp::Copysign => (y.copysign(x), eq),
        FOp::Neg => (-x, eq),
        FOp::Abs => (x.abs(), eq),
        FOp::Sqrt => float::sqrt_err(x),
        FOp::Rcp => float::div_err(1.0, x),
        FOp::Rsqrt => (1.0 / x.sqrt(), eq),
        FOp::Ex2 => (x.exp2(), eq),
        FOp::Lg2 => (x.log2(), eq),
        FOp::Sin => (x.sin(), eq),
        FOp::Cos => (x.cos(), eq),
        FOp::Tanh => (x.tanh(), eq),
    };
    let mut eps = eps;
    if sat {
        // .sat clamps to [0, 1] and maps NaN to 0.
        if r.is_nan() || r <= 0.0 {
            r = 0.0;
            eps = eq;
        } else if r >= 1.0 {
            r = 1.0;
            eps = eq;
        }
    }
    match ty {
        FTy::F64 => {
            if r.is_nan() {
                f64_nan(op, a, b, c)
            } else {
                round_f64(r, eps, rnd).to_bits()
            }
        }
        FTy::F32 => {
            let bits = round(r, eps, F32, rnd);
            if ftz && bits & 0x7F80_0000 == 0 {
                bits & 0x8000_0000
            } else {
                bits
            }
        }
        t => round(r, eps, fmt_of(t), rnd),
    }
}

fn int_op(op: IOp, bits: u32, signed: bool, a: u64, b: u64, c: u64) -> u64 {
    let m = wmask(bits);
    let (sa, sb) = (sext(a, bits), sext(b, bits));
    let (ua, ub) = (a & m, b & m);
    let wide = |x: u64| -> i128 {
        if signed {
            i128::from(sext(x, bits))
        } else {
            i128::from(x & m)
        }
    };
    match op {
        IOp::Add => a.wrapping_add(b) & m,
        IOp::Sub => a.wrapping_sub(b) & m,
        IOp::AddSat => {
            (sa.saturating_add(sb)).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as u64 & m
        }
        IOp::SubSat => {
            (sa.saturating_sub(sb)).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as u64 & m
        }
        IOp::MulLo => a.wrapping_mul(b) & m,
        IOp::MulHi => ((wide(a).wrapping_mul(wide(b)) >> bits) as u64) & m,
        IOp::MulWide => (wide(a).wrapping_mul(wide(b)) as u64) & wmask(2 * bits),
        IOp::MadLo => a.wrapping_mul(b).wrapping_add(c) & m,
        IOp::MadHi => (((wide(a).wrapping_mul(wide(b)) >> bits) as u64).wrapping_add(c)) & m,
        IOp::MadWide => (wide(a).wrapping_mul(wide(b)) as u64).wrapping_add(c) & wmask(2 * bits),
        // Division by zero yields all ones, as the GPU does for unsigned.
        IOp::Div if ub == 0 => m,
        IOp::Div if signed => sa.wrapping_div(sb) as u64 & m,
        IOp::Div => ua / ub,
        IOp::Rem if ub == 0 => ua,
        IOp::Rem if signed => sa.wrapping_rem(sb) as u64 & m,
        IOp::Rem => ua % ub,
        IOp::Min if signed => sa.min(sb) as u64 & m,
        IOp::Min => ua.min(ub),
        IOp::Max if signed => sa.max(sb) as u64 & m,
        IOp::Max => ua.max(ub),
        IOp::And => a & b & m,
        IOp::Or => (a | b) & m,
        IOp::Xor => (a ^ b) & m,
        IOp::Shl => {
            let s = b as u32;
            if s >= bits {
                0
            } else {
                (a << s) & m
            }
        }
        IOp::Shr => {
            let s = (b as u32).min(bits.saturating_sub(1).max(if signed { 0 } else { bits }));
            if signed {
                (sa >> s.min(63)) as u64 & m
            } else if b as u32 >= bits {
                0
            } else {
                ua >> s
            }
        }
        IOp::Neg => a.wrapping_neg() & m,
        IOp::Abs => sa.wrapping_abs() as u64 & m,
        IOp::Not => !a & m,
        IOp::Cnot => u64::from(ua == 0),
        IOp::Popc => u64::from(ua.count_ones()),
        IOp::Clz => u64::from(ua.leading_zeros() - (64 - bits)),
        IOp::Brev => ua.reverse_bits() >> (64 - bits),
        IOp::Bfe => bfe(bits, signed, ua, b, c),
    }
}

/// `bfe` as the PTX ISA defines it: bit `i < len` of the result is bit
/// `pos + i` of `a` while that is inside the type; every other bit is the
/// sign bit `a[min(pos + len - 1, msb)]` for a signed type (0 for an
/// unsigned one, or when `len` is 0).
fn bfe(bits: u32, signed: bool, a: u64, b: u64, c: u64) -> u64 {
    let msb = u64::from(bits - 1);
    let (pos, len) = (b & 0xff, c & 0xff);
    let sbit = if !signed || len == 0 {
        0
    } else {
        (a >> (pos + len - 1).min(msb)) & 1
    };
    let mut d = 0;
    for i in 0..=msb {
        let bit = if i < len && pos + i <= msb {
            (a >> (pos + i)) & 1
        } else {
            sbit
        };
        d |= bit << i;
    }
    d
}

fn setp(cmp: Cmp, ty: Ty, ftz: bool, a: u64, b: u64) -> u64 {
    let r = if ty.is_float() {
        let dec = |v: u64| match ty {
            Ty::F64 => f64::from_bits(v),
            Ty::F32 if ftz => flush32(f64::from(f32::from_bits(v as u32))),
            Ty::F32 => f64::from(f32::from_bits(v as u32)),
            Ty::F16 => fdecode(v, F16),
            _ => fdecode(v, BF16),
        };
        let (x, y) = (dec(a), dec(b));
        let un = x.is_nan() || y.is_nan();
        match cmp {
            Cmp::Eq => x == y,
            Cmp::Ne => !un && x != y,
            Cmp::Lt | Cmp::Lo => x < y,
            Cmp::Le | Cmp::Ls => x <= y,
            Cmp::Gt | Cmp::Hi => x > y,
            Cmp::Ge | Cmp::Hs => x >= y,
            Cmp::Equ => un || x == y,
            Cmp::Neu => un || x != y,
            Cmp::Ltu => un || x < y,
            Cmp::Leu => un || x <= y,
            Cmp::Gtu => un || x > y,
            Cmp::Geu => un || x >= y,
            Cmp::Num => !un,
            Cmp::Nan => un,
        }
    } else {
        let bits = ty.bits();
        let m = wmask(bits);
        let (ua, ub) = (a & m, b & m);
        let (sa, sb) = (sext(a, bits), sext(b, bits));
        let s = ty.is_signed();
        match cmp {
            Cmp::Eq | Cmp::Equ => ua == ub,
            Cmp::Ne | Cmp::Neu => ua != ub,
            Cmp::Lt | Cmp::Ltu if s => sa < sb,
            Cmp::Le | Cmp::Leu if s => sa <= sb,
            Cmp::Gt | Cmp::Gtu if s => sa > sb,
            Cmp::Ge | Cmp::Geu if s => sa >= sb,
            Cmp::Lt | Cmp::Ltu | Cmp::Lo => ua < ub,
            Cmp::Le | Cmp::Leu | Cmp::Ls => ua <= ub,
            Cmp::Gt | Cmp::Gtu | Cmp::Hi => ua > ub,
            Cmp::Ge | Cmp::Geu | Cmp::Hs => ua >= ub,
            Cmp::Num => true,
            Cmp::Nan => false,
        }
    };
    u64::from(r)
}

fn float_fmt(t: Ty) -> Option<Format> {
    match t {
        Ty::F16 => Some(F16),
        Ty::Bf16 => Some(BF16),
        Ty::F32 => Some(F32),
        _ => None,
    }
}

fn int_range(t: Ty) -> (i128, i128) {
    let bits = t.bits();
    if t.is_signed() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

#[allow(clippy::too_many_arguments)]
pub fn cvt(to: Ty, from: Ty, rnd: CvtRnd, ftz: bool, sat: bool, relu: bool, a: u64) -> u64 {
    let eq = Ordering::Equal;
    if from.is_int() && to.is_int() {
        let v: i128 = if from.is_signed() {
            i128::from(sext(a, from.bits()))
        } else {
            i128::from(a & wmask(from.bits()))
        };
        let v = if sat {
            let (lo, hi) = int_range(to);
            v.clamp(lo, hi)
        } else {
            v
        };
        return (v as u64) & wmask(to.bits());
    }
    if from.is_int() {
        let v: i128 = if from.is_signed() {
            i128::from(sext(a, from.bits()))
        } else {
            i128::from(a & wmask(from.bits()))
        };
        let mode = match rnd {
            CvtRnd::Float(r) => r,
            _ => Rnd::Rn,
        };
        let mut bits = match float_fmt(to) {
            Some(f) => float::round_int(v, f, mode),
            None => float::round_int_f64(v, mode).to_bits(),
        };
        if sat {
            bits = cvt(to, to, CvtRnd::None, false, true, false, bits);
        }
        return bits;
    }
    // Float source, exactly in f64.
    let mut x = match from {
        Ty::F64 => f64::from_bits(a),
        Ty::F32 => {
            let v = f64::from(f32::from_bits(a as u32));
            if ftz {
                flush32(v)
            } else {
                v
            }
        }
        Ty::F16 => fdecode(a, F16),
        _ => fdecode(a, BF16),
    };
    if let CvtRnd::Int(r) = rnd {
        x = match r {
            Rnd::Rn => x.round_ties_even(),
            Rnd::Rz => x.trunc(),
            Rnd::Rm => x.floor(),
            Rnd::Rp => x.ceil(),
        };
    }
    if to.is_int() {
        if x.is_nan() {
            return 0;
        }
        // Without an integer rounding mode PTX requires one; treat as rzi.
        let x = if matches!(rnd, CvtRnd::Int(_)) {
            x
        } else {
            x.trunc()
        };
        let (lo, hi) = int_range(to);
        let v = if x <= lo as f64 {
            lo
        } else if x >= hi as f64 {
            hi
        } else {
            x as i128
        };
        return (v as u64) & wmask(to.bits());
    }
    if sat {
        x = if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
    }
    if relu && !x.is_nan() && x < 0.0 {
        x = 0.0;
    }
    let mode = match rnd {
        CvtRnd::Float(r) => r,
        _ => Rnd::Rn,
    };
    match float_fmt(to) {
        Some(f) => {
            let bits = round(x, eq, f, mode);
            if ftz && to == Ty::F32 && bits & 0x7F80_0000 == 0 {
                bits & 0x8000_0000
            } else {
                bits
            }
        }
        None if x.is_nan() => F64_NAN,
        None => x.to_bits(),
    }
}

/// Executes one (possibly masked) non-control instruction.
#[inline(always)]
fn exec(
    f: &mut Regs,
    op: &Op,
    mask: Option<&[bool]>,
    bounds: &Bounds,
    line: u32,
) -> Result<(), HostFault> {
    match *op {
        Op::Mov { d, a, mask: m } => lanes2(f, mask, d, a, a, move |x, _| x & m),
        Op::Int {
            op,
            bits,
            signed,
            d,
            a,
            b,
            c,
        } => match op {
            IOp::Add => {
                let m = wmask(bits);
                lanes2(f, mask, d, a, b, move |x, y| x.wrapping_add(y) & m)
            }
            IOp::Shl if bits == 64 => lanes2(f, mask, d, a, b, |x, y| {
                let s = y as u32;
                if s >= 64 {
                    0
                } else {
                    x << s
                }
            }),
            IOp::MulWide if !signed => lanes2(f, mask, d, a, b, move |x, y| {
                (x & wmask(bits)).wrapping_mul(y & wmask(bits))
            }),
            _ => lanes3(f, mask, d, a, b, c, move |x, y, z| {
                int_op(op, bits, signed, x, y, z)
            }),
        },
        Op::Float {
            op,
            ty: FTy::F32,
            rnd: Rnd::Rn,
            ftz: false,
            sat: false,
            d,
            a,
            b,
            c,
        } => {
            let f32_of = |x: u64| f32::from_bits(x as u32);
            let canon = |v: f32| -> u64 {
                if v.is_nan() {
                    0x7FFF_FFFF
                } else {
                    u64::from(v.to_bits())
                }
            };
            match op {
                FOp::Add => lanes2(f, mask, d, a, b, move |x, y| canon(f32_of(x) + f32_of(y))),
                FOp::Sub => lanes2(f, mask, d, a, b, move |x, y| canon(f32_of(x) - f32_of(y))),
                FOp::Mul => lanes2(f, mask, d, a, b, move |x, y| canon(f32_of(x) * f32_of(y))),
                FOp::Div => lanes2(f, mask, d, a, b, move |x, y| canon(f32_of(x) / f32_of(y))),
                FOp::Fma => lanes3(f, mask, d, a, b, c, move |x, y, z| {
                    canon(f32_of(x).mul_add(f32_of(y), f32_of(z)))
                }),
                FOp::Ex2 => lanes2(f, mask, d, a, a, move |x, _| {
                    canon(f64::from(f32_of(x)).exp2() as f32)
                }),
                _ => lanes3(f, mask, d, a, b, c, move |x, y, z| {
                    float_op(op, FTy::F32, Rnd::Rn, false, false, x, y, z)
                }),
            }
        }
        Op::Float {
            op,
            ty,
            rnd,
            ftz,
            sat,
            d,
            a,
            b,
            c,
        } => lanes3(f, mask, d, a, b, c, move |x, y, z| {
            float_op(op, ty, rnd, ftz, sat, x, y, z)
        }),
        Op::Cvt {
            to: Ty::F32,
            from: Ty::F16,
            rnd: CvtRnd::None,
            ftz: false,
            sat: false,
            relu: false,
            d,
            a,
        } => lanes2(f, mask, d, a, a, |x, _| {
            u64::from((fdecode(x & 0xFFFF, F16) as f32).to_bits())
        }),
        Op::Cvt {
            to,
            from,
            rnd,
            ftz,
            sat,
            relu,
            d,
            a,
        } => lanes2(f, mask, d, a, a, move |x, _| {
            cvt(to, from, rnd, ftz, sat, relu, x)
        }),
        Op::Setp {
            cmp,
            ty,
            ftz,
            d,
            a,
            b,
        } => lanes2(f, mask, d, a, b, move |x, y| setp(cmp, ty, ftz, x, y)),
        Op::Selp { d, a, b, p } => lanes3(
            f,
            mask,
            d,
            a,
            b,
            p,
            |x, y, q| if q & 1 != 0 { x } else { y },
        ),
        Op::Ld {
            d,
            a,
            off,
            width,
            signed,
            mask: m,
        } => {
            let base = a as usize * LANES;
            let dst = d as usize * LANES;
            for l in 0..LANES {
                if mask.is_some_and(|mm| !mm[l]) {
                    continue;
                }
                let addr = (f.regs[base + l] as usize).wrapping_add(off as usize);
                if bounds.checked && !within(&bounds.loads, addr, width) {
                    return Err(fault(line, "load", addr, width));
                }
                // SAFETY: in checked mode `addr..addr+width` lies inside an
                // input span (checked just above). In unchecked mode the
                // verifier proved every load lies inside its operand's
                // footprint (the contract's bytes from the operand's
                // address, e.g. `i × size + j × width < n × size` for the
                // scalar ABI), the launch checked that each span holds its
                // footprint at this launch's values, and the caller of
                // `launch` guarantees each span is readable for its `len`.
                let raw = unsafe { load(addr, width) };
                let v = if signed {
                    sext(raw, u32::from(width) * 8) as u64
                } else {
                    raw
                };
                f.regs[dst + l] = v & m;
            }
        }
        Op::St { a, off, v, width } => {
            let base = a as usize * LANES;
            let src = v as usize * LANES;
            for l in 0..LANES {
                if mask.is_some_and(|mm| !mm[l]) {
                    continue;
                }
                let addr = (f.regs[base + l] as usize).wrapping_add(off as usize);
                if bounds.checked && !within(&bounds.stores, addr, width) {
                    return Err(fault(line, "store", addr, width));
                }
                // SAFETY: as for loads, with the output span, which the
                // caller of `launch` guarantees writable for its `len`.
                unsafe { store(addr, width, f.regs[src + l]) };
            }
        }
        Op::Bra { .. } | Op::Ret => {}
    }
    Ok(())
}

fn within(spans: &[(usize, usize)], addr: usize, width: u8) -> bool {
    spans.iter().any(|(start, len)| {
        addr >= *start
            && addr
                .checked_add(usize::from(width))
                .is_some_and(|end| end <= start + len)
    })
}

fn fault(line: u32, what: &str, addr: usize, width: u8) -> HostFault {
    HostFault {
        line,
        message: format!("{width}-byte {what} at {addr:#x} is outside the launch's operands"),
    }
}

/// # Safety
/// `addr..addr + width` must be readable.
#[inline(always)]
unsafe fn load(addr: usize, width: u8) -> u64 {
    let p = addr as *const u8;
    // SAFETY: readable per this function's contract; unaligned reads are
    // used because shared-memory offsets need not be aligned.
    unsafe {
        match width {
            1 => u64::from(p.read()),
            2 => u64::from(p.cast::<u16>().read_unaligned()),
            4 => u64::from(p.cast::<u32>().read_unaligned()),
            _ => p.cast::<u64>().read_unaligned(),
        }
    }
}

/// # Safety
/// `addr..addr + width` must be writable.
#[inline(always)]
unsafe fn store(addr: usize, width: u8, v: u64) {
    let p = addr as *mut u8;
    // SAFETY: writable per this function's contract.
    unsafe {
        match width {
            1 => p.write(v as u8),
            2 => p.cast::<u16>().write_unaligned(v as u16),
            4 => p.cast::<u32>().write_unaligned(v as u32),
            _ => p.cast::<u64>().write_unaligned(v),
        }
    }
}

#[allow(clippy::needless_range_loop)] // One lane index walks several rows.
/// Runs one batch whose lanes `0..active` are live; the caller filled the
/// thread-id rows.
pub fn run_batch(
    f: &mut Frame,
    code: &[DInst],
    active: usize,
    bounds: &Bounds,
) -> Result<(), HostFault> {
    let end = u32::try_from(code.len()).unwrap_or(u32::MAX);
    for l in 0..LANES {
        f.live[l] = l < active;
        f.pc[l] = 0;
    }
    let mut converged = true;
    let mut all_live = active == LANES;
    let mut pc: u32 = 0;
    let mut steps: u64 = 0;
    if let Some(control) = bounds.control.filter(|c| c.must_stop()) {
        return Err(control.fault(0));
    }
    loop {
        steps += 1;
        if steps.is_multiple_of(POLL_STEPS) {
            if let Some(control) = bounds.control.filter(|c| c.must_stop()) {
                return Err(control.fault(code.get(pc as usize).map_or(0, |i| i.line)));
            }
        }
        if steps > STEP_BUDGET {
            let line = code.get(pc as usize).map_or(0, |i| i.line);
            return Err(HostFault {
                line,
                message: format!(
                    "a batch ran past {STEP_BUDGET} steps; the kernel does not terminate"
                ),
            });
        }
        if !converged {
            // Lowest pc among live lanes; its lanes run together.
            let mut min = u32::MAX;
            let mut same = true;
            let mut first = None;
            for l in 0..LANES {
                if f.live[l] {
                    min = min.min(f.pc[l]);
                    match first {
                        None => first = Some(f.pc[l]),
                        Some(p) if p != f.pc[l] => same = false,
                        _ => {}
                    }
                }
            }
            if min == u32::MAX {
                return Ok(());
            }
            pc = min;
            converged = same;
            for l in 0..LANES {
                f.mask[l] = f.live[l] && f.pc[l] == pc;
            }
        } else if !all_live {
            f.mask.copy_from_slice(&f.live);
        }
        if pc >= end {
            // Falling off the end exits, like `ret`.
            if converged {
                return Ok(());
            }
            for l in 0..LANES {
                if f.mask[l] {
                    f.live[l] = false;
                }
            }
            continue;
        }
        let inst = &code[pc as usize];
        let full = converged && all_live;
        // Lanes that execute: the group, narrowed by the guard predicate.
        let guarded = match inst.guard {
            None => false,
            Some((p, neg)) => {
                let r = row(&f.r.regs, p);
                for ((g, &m), &v) in f.gmask.iter_mut().zip(f.mask.iter()).zip(r.iter()) {
                    *g = (full || m) && ((v & 1 != 0) != neg);
                }
                true
            }
        };
        match inst.op {
            Op::Bra { target } => {
                let mut any_taken = false;
                let mut any_not = false;
                for l in 0..LANES {
                    if (full || f.mask[l]) && f.live[l] {
                        if !guarded || f.gmask[l] {
                            any_taken = true;
                        } else {
                            any_not = true;
                        }
                    }
                }
                if converged && !(any_taken && any_not) {
                    pc = if any_taken { target } else { pc + 1 };
                    continue;
                }
                for l in 0..LANES {
                    if (full || f.mask[l]) && f.live[l] {
                        f.pc[l] = if !guarded || f.gmask[l] {
                            target
                        } else {
                            pc + 1
                        };
                    }
                }
                converged = false;
            }
            Op::Ret => {
                let mut remaining = false;
                for l in 0..LANES {
                    let group = full || f.mask[l];
                    let exits = group && (!guarded || f.gmask[l]);
                    if exits {
                        f.live[l] = false;
                    } else if group && f.live[l] {
                        remaining = true;
                    }
                }
                all_live = false;
                if converged {
                    if !remaining {
                        return Ok(());
                    }
                    pc += 1;
                } else {
                    for l in 0..LANES {
                        if f.mask[l] && f.live[l] {
                            f.pc[l] = pc + 1;
                        }
                    }
                }
            }
            ref op => {
                let m: Option<&[bool]> = if guarded {
                    Some(&f.gmask)
                } else if full {
                    None
                } else {
                    Some(&f.mask)
                };
                exec(&mut f.r, op, m, bounds, inst.line)?;
                if converged {
                    pc += 1;
                } else {
                    for l in 0..LANES {
                        if f.mask[l] {
                            f.pc[l] = pc + 1;
                        }
                    }
                }
            }
        }
    }
}
