//! The instruction set the verifier accepts, as a typed table: every
//! accepted opcode and modifier is a variant, and every operand of every
//! accepted form has a declared [`OperandRole`].
//!
//! Invariants:
//! - An instruction past [`classify`] has an [`Opcode`], only [`Modifier`]s,
//!   and operands that match one of its opcode's forms role for role; so no
//!   operand reaches ptxas in a position the verifier did not model (a data
//!   value in a cache-policy slot, a register as a branch target, ..).
//!   The canonical printer prints only verified kernels, so only these forms.
//! - `.L2::cache_hint` and its policy operand never get here: `ir` drops
//!   both from the IR (the hint does not change results), so the canonical
//!   text carries no policy operand at all.
//! - A modifier's meaning for the proof is the opcode's: the table says
//!   which spellings exist, the dataflow says what they compute.

use crate::ptx::ir::{Inst, Kernel, Opnd, Ty};
use crate::ptx::PtxError;

use super::{refuse, SubReason};

/// An opcode the verifier models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opcode {
    Add,
    Sub,
    Mul,
    Mad,
    Fma,
    Div,
    Rem,
    Neg,
    Abs,
    Min,
    Max,
    Copysign,
    And,
    Or,
    Xor,
    Not,
    Cnot,
    Shl,
    Shr,
    Cvt,
    Mov,
    Setp,
    Selp,
    Set,
    Slct,
    Ex2,
    Lg2,
    Rcp,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Popc,
    Clz,
    Brev,
    Bfe,
    Bfi,
    Bfind,
    Prmt,
    Lop3,
    Shf,
    Testp,
    Mul24,
    Mad24,
    Sad,
    Fns,
    Dp4a,
    Dp2a,
    Ld,
    Ldu,
    St,
    Cvta,
    Bra,
    Ret,
    Exit,
}

/// What an operand is, in one form of an opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OperandRole {
    /// A written register (or `_`).
    Dest,
    /// `%p|%q`: both halves of a `setp` result.
    PredPair,
    /// `{%a, %b}` written by `mov` (unpacking a wide value).
    Unpack,
    /// A value read: a register, an immediate or a special register.
    Data,
    /// `{%a, %b}` read by `mov` (packing parts into a wide value).
    Pack,
    /// A predicate read as a condition: `%p` or `!%p` of a `.pred` register.
    Guard,
    /// A memory address `[base + offset]`.
    Address,
    /// A label.
    Target,
    /// An integer immediate (a `lop3` truth table).
    Immediate,
}

use OperandRole::*;

impl Opcode {
    pub(crate) fn from_name(s: &str) -> Option<Opcode> {
        Some(match s {
            "add" => Opcode::Add,
            "sub" => Opcode::Sub,
            "mul" => Opcode::Mul,
            "mad" => Opcode::Mad,
            "fma" => Opcode::Fma,
            "div" => Opcode::Div,
            "rem" => Opcode::Rem,
            "neg" => Opcode::Neg,
            "abs" => Opcode::Abs,
            "min" => Opcode::Min,
            "max" => Opcode::Max,
            "copysign" => Opcode::Copysign,
            "and" => Opcode::And,
            "or" => Opcode::Or,
            "xor" => Opcode::Xor,
            "not" => Opcode::Not,
            "cnot" => Opcode::Cnot,
            "shl" => Opcode::Shl,
            "shr" => Opcode::Shr,
            "cvt" => Opcode::Cvt,
            "mov" => Opcode::Mov,
            "setp" => Opcode::Setp,
            "selp" => Opcode::Selp,
            "set" => Opcode::Set,
            "slct" => Opcode::Slct,
            "ex2" => Opcode::Ex2,
            "lg2" => Opcode::Lg2,
            "rcp" => Opcode::Rcp,
            "sqrt" => Opcode::Sqrt,
            "rsqrt" => Opcode::Rsqrt,
            "sin" => Opcode::Sin,
            "cos" => Opcode::Cos,
            "tanh" => Opcode::Tanh,
            "popc" => Opcode::Popc,
            "clz" => Opcode::Clz,
            "brev" => Opcode::Brev,
            "bfe" => Opcode::Bfe,
            "bfi" => Opcode::Bfi,
            "bfind" => Opcode::Bfind,
            "prmt" => Opcode::Prmt,
            "lop3" => Opcode::Lop3,
            "shf" => Opcode::Shf,
            "testp" => Opcode::Testp,
            "mul24" => Opcode::Mul24,
            "mad24" => Opcode::Mad24,
            "sad" => Opcode::Sad,
            "fns" => Opcode::Fns,
            "dp4a" => Opcode::Dp4a,
            "dp2a" => Opcode::Dp2a,
            "ld" => Opcode::Ld,
            "ldu" => Opcode::Ldu,
            "st" => Opcode::St,
            "cvta" => Opcode::Cvta,
            "bra" => Opcode::Bra,
            "ret" => Opcode::Ret,
            "exit" => Opcode::Exit,
            _ => return None,
        })
    }

    /// The operand forms the opcode is accepted in, one role per operand.
    pub(crate) fn forms(self) -> &'static [&'static [OperandRole]] {
        match self {
            Opcode::Add => &[&[Dest, Data, Data]],
            Opcode::Sub => &[&[Dest, Data, Data]],
            Opcode::Mul => &[&[Dest, Data, Data]],
            Opcode::Mad => &[&[Dest, Data, Data, Data]],
            Opcode::Fma => &[&[Dest, Data, Data, Data]],
            Opcode::Div => &[&[Dest, Data, Data]],
            Opcode::Rem => &[&[Dest, Data, Data]],
            Opcode::Neg => &[&[Dest, Data]],
            Opcode::Abs => &[&[Dest, Data]],
            Opcode::Min => &[&[Dest, Data, Data]],
            Opcode::Max => &[&[Dest, Data, Data]],
            Opcode::Copysign => &[&[Dest, Data, Data]],
            Opcode::And => &[&[Dest, Data, Data]],
            Opcode::Or => &[&[Dest, Data, Data]],
            Opcode::Xor => &[&[Dest, Data, Data]],
            Opcode::Not => &[&[Dest, Data]],
            Opcode::Cnot => &[&[Dest, Data]],
            Opcode::Shl => &[&[Dest, Data, Data]],
            Opcode::Shr => &[&[Dest, Data, Data]],
            Opcode::Cvt => &[
                &[Dest, Data],
                &[Dest, Data, Data],
                &[Dest, Data, Data, Data],
            ],
            Opcode::Mov => &[&[Dest, Data], &[Dest, Pack], &[Unpack, Data]],
            Opcode::Setp => &[
                &[Dest, Data, Data],
                &[Dest, Data, Data, Guard],
                &[PredPair, Data, Data],
                &[PredPair, Data, Data, Guard],
            ],
            Opcode::Selp => &[&[Dest, Data, Data, Guard]],
            Opcode::Set => &[&[Dest, Data, Data], &[Dest, Data, Data, Guard]],
            Opcode::Slct => &[&[Dest, Data, Data, Data]],
            Opcode::Ex2 => &[&[Dest, Data]],
            Opcode::Lg2 => &[&[Dest, Data]],
            Opcode::Rcp => &[&[Dest, Data]],
            Opcode::Sqrt => &[&[Dest, Data]],
            Opcode::Rsqrt => &[&[Dest, Data]],
            Opcode::Sin => &[&[Dest, Data]],
            Opcode::Cos => &[&[Dest, Data]],
            Opcode::Tanh => &[&[Dest, Data]],
            Opcode::Popc => &[&[Dest, Data]],
            Opcode::Clz => &[&[Dest, Data]],
            Opcode::Brev => &[&[Dest, Data]],
            Opcode::Bfe => &[&[Dest, Data, Data, Data]],
            Opcode::Bfi => &[&[Dest, Data, Data, Data, Data]],
            Opcode::Bfind => &[&[Dest, Data]],
            Opcode::Prmt => &[&[Dest, Data, Data, Data]],
            Opcode::Lop3 => &[&[Dest, Data, Data, Data, Immediate]],
            Opcode::Shf => &[&[Dest, Data, Data, Data]],
            Opcode::Testp => &[&[Dest, Data]],
            Opcode::Mul24 => &[&[Dest, Data, Data]],
            Opcode::Mad24 => &[&[Dest, Data, Data, Data]],
            Opcode::Sad => &[&[Dest, Data, Data, Data]],
            Opcode::Fns => &[&[Dest, Data, Data, Data]],
            Opcode::Dp4a => &[&[Dest, Data, Data, Data]],
            Opcode::Dp2a => &[&[Dest, Data, Data, Data]],
            Opcode::Ld => &[&[Dest, Address]],
            Opcode::Ldu => &[&[Dest, Address]],
            Opcode::St => &[&[Address, Data]],
            Opcode::Cvta => &[&[Dest, Data]],
            Opcode::Bra => &[&[Target]],
            Opcode::Ret => &[&[]],
            Opcode::Exit => &[&[]],
        }
    }
}

/// A modifier the verifier models (types included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Modifier {
    Rn,
    Rz,
    Rm,
    Rp,
    Rna,
    Rni,
    Rzi,
    Rmi,
    Rpi,
    Ftz,
    Sat,
    Satfinite,
    Approx,
    Full,
    Hi,
    Lo,
    Wide,
    Relu,
    NaN,
    Xorsign,
    Abs,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Ls,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
    And,
    Or,
    Xor,
    L,
    R,
    Wrap,
    Clamp,
    F4e,
    B4e,
    Rc8,
    Ecl,
    Ecr,
    Rc16,
    Shiftamt,
    Finite,
    Infinite,
    Number,
    Notanumber,
    Normal,
    Subnormal,
    Pack,
    Uni,
    To,
    Global,
    Param,
    Local,
    Shared,
    Const,
    SharedCta,
    SharedCluster,
    V2,
    V4,
    V8,
    Ca,
    Cg,
    Cs,
    Lu,
    Cv,
    Wb,
    Wt,
    Nc,
    Volatile,
    Relaxed,
    Acquire,
    Release,
    Weak,
    Mmio,
    Cta,
    Gpu,
    Sys,
    Cluster,
    L1EvictNormal,
    L1EvictUnchanged,
    L1EvictFirst,
    L1EvictLast,
    L1NoAllocate,
    L2EvictNormal,
    L2EvictFirst,
    L2EvictLast,
    L2Prefetch64B,
    L2Prefetch128B,
    L2Prefetch256B,
    B8,
    B16,
    B32,
    B64,
    B128,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    F16,
    F16x2,
    Bf16,
    Bf16x2,
    F32,
    F64,
    Pred,
    Tf32,
    E4m3,
    E5m2,
    E4m3x2,
    E5m2x2,
}

impl Modifier {
    pub(crate) fn from_name(s: &str) -> Option<Modifier> {
        Some(match s {
            "rn" => Modifier::Rn,
            "rz" => Modifier::Rz,
            "rm" => Modifier::Rm,
            "rp" => Modifier::Rp,
            "rna" => Modifier::Rna,
            "rni" => Modifier::Rni,
            "rzi" => Modifier::Rzi,
            "rmi" => Modifier::Rmi,
            "rpi" => Modifier::Rpi,
            "ftz" => Modifier::Ftz,
            "sat" => Modifier::Sat,
            "satfinite" => Modifier::Satfinite,
            "approx" => Modifier::Approx,
            "full" => Modifier::Full,
            "hi" => Modifier::Hi,
            "lo" => Modifier::Lo,
            "wide" => Modifier::Wide,
            "relu" => Modifier::Relu,
            "NaN" => Modifier::NaN,
            "xorsign" => Modifier::Xorsign,
            "abs" => Modifier::Abs,
            "eq" => Modifier::Eq,
            "ne" => Modifier::Ne,
            "lt" => Modifier::Lt,
            "le" => Modifier::Le,
            "gt" => Modifier::Gt,
            "ge" => Modifier::Ge,
            "ls" => Modifier::Ls,
            "hs" => Modifier::Hs,
            "equ" => Modifier::Equ,
            "neu" => Modifier::Neu,
            "ltu" => Modifier::Ltu,
            "leu" => Modifier::Leu,
            "gtu" => Modifier::Gtu,
            "geu" => Modifier::Geu,
            "num" => Modifier::Num,
            "nan" => Modifier::Nan,
            "and" => Modifier::And,
            "or" => Modifier::Or,
            "xor" => Modifier::Xor,
            "l" => Modifier::L,
            "r" => Modifier::R,
            "wrap" => Modifier::Wrap,
            "clamp" => Modifier::Clamp,
            "f4e" => Modifier::F4e,
            "b4e" => Modifier::B4e,
            "rc8" => Modifier::Rc8,
            "ecl" => Modifier::Ecl,
            "ecr" => Modifier::Ecr,
            "rc16" => Modifier::Rc16,
            "shiftamt" => Modifier::Shiftamt,
            "finite" => Modifier::Finite,
            "infinite" => Modifier::Infinite,
            "number" => Modifier::Number,
            "notanumber" => Modifier::Notanumber,
            "normal" => Modifier::Normal,
            "subnormal" => Modifier::Subnormal,
            "pack" => Modifier::Pack,
            "uni" => Modifier::Uni,
            "to" => Modifier::To,
            "global" => Modifier::Global,
            "param" => Modifier::Param,
            "local" => Modifier::Local,
            "shared" => Modifier::Shared,
            "const" => Modifier::Const,
            "shared::cta" => Modifier::SharedCta,
            "shared::cluster" => Modifier::SharedCluster,
            "v2" => Modifier::V2,
            "v4" => Modifier::V4,
            "v8" => Modifier::V8,
            "ca" => Modifier::Ca,
            "cg" => Modifier::Cg,
            "cs" => Modifier::Cs,
            "lu" => Modifier::Lu,
            "cv" => Modifier::Cv,
            "wb" => Modifier::Wb,
            "wt" => Modifier::Wt,
            "nc" => Modifier::Nc,
            "volatile" => Modifier::Volatile,
            "relaxed" => Modifier::Relaxed,
            "acquire" => Modifier::Acquire,
            "release" => Modifier::Release,
            "weak" => Modifier::Weak,
            "mmio" => Modifier::Mmio,
            "cta" => Modifier::Cta,
            "gpu" => Modifier::Gpu,
            "sys" => Modifier::Sys,
            "cluster" => Modifier::Cluster,
            "L1::evict_normal" => Modifier::L1EvictNormal,
            "L1::evict_unchanged" => Modifier::L1EvictUnchanged,
            "L1::evict_first" => Modifier::L1EvictFirst,
            "L1::evict_last" => Modifier::L1EvictLast,
            "L1::no_allocate" => Modifier::L1NoAllocate,
            "L2::evict_normal" => Modifier::L2EvictNormal,
            "L2::evict_first" => Modifier::L2EvictFirst,
            "L2::evict_last" => Modifier::L2EvictLast,
            "L2::64B" => Modifier::L2Prefetch64B,
            "L2::128B" => Modifier::L2Prefetch128B,
            "L2::256B" => Modifier::L2Prefetch256B,
            "b8" => Modifier::B8,
            "b16" => Modifier::B16,
            "b32" => Modifier::B32,
            "b64" => Modifier::B64,
            "b128" => Modifier::B128,
            "u8" => Modifier::U8,
            "u16" => Modifier::U16,
            "u32" => Modifier::U32,
            "u64" => Modifier::U64,
            "s8" => Modifier::S8,
            "s16" => Modifier::S16,
            "s32" => Modifier::S32,
            "s64" => Modifier::S64,
            "f16" => Modifier::F16,
            "f16x2" => Modifier::F16x2,
            "bf16" => Modifier::Bf16,
            "bf16x2" => Modifier::Bf16x2,
            "f32" => Modifier::F32,
            "f64" => Modifier::F64,
            "pred" => Modifier::Pred,
            "tf32" => Modifier::Tf32,
            "e4m3" => Modifier::E4m3,
            "e5m2" => Modifier::E5m2,
            "e4m3x2" => Modifier::E4m3x2,
            "e5m2x2" => Modifier::E5m2x2,
            _ => return None,
        })
    }
}

/// Which opcodes a modifier may appear on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModifierClass {
    /// A type: any opcode.
    Type,
    /// A state space, vector width, cache operator, ordering, scope or
    /// eviction priority: loads and stores (`.global` also on `cvta`).
    Memory,
    /// `.to`: `cvta` only.
    Conversion,
    /// `.uni`: branches and returns only.
    Control,
    /// Rounding, comparisons, and every other ALU modifier.
    Alu,
}

impl Modifier {
    fn class(self) -> ModifierClass {
        use Modifier::*;
        match self {
            B8 | B16 | B32 | B64 | B128 | U8 | U16 | U32 | U64 | S8 | S16 | S32 | S64 | F16
            | F16x2 | Bf16 | Bf16x2 | F32 | F64 | Pred | Tf32 | E4m3 | E5m2 | E4m3x2 | E5m2x2 => {
                ModifierClass::Type
            }
            Global | Param | Local | Shared | Const | SharedCta | SharedCluster | V2 | V4 | V8
            | Ca | Cg | Cs | Lu | Cv | Wb | Wt | Nc | Volatile | Relaxed | Acquire | Release
            | Weak | Mmio | Cta | Gpu | Sys | Cluster | L1EvictNormal | L1EvictUnchanged
            | L1EvictFirst | L1EvictLast | L1NoAllocate | L2EvictNormal | L2EvictFirst
            | L2EvictLast | L2Prefetch64B | L2Prefetch128B | L2Prefetch256B => {
                ModifierClass::Memory
            }
            To => ModifierClass::Conversion,
            Uni => ModifierClass::Control,
            Rn | Rz | Rm | Rp | Rna | Rni | Rzi | Rmi | Rpi | Ftz | Sat | Satfinite | Approx
            | Full | Hi | Lo | Wide | Relu | NaN | Xorsign | Abs | Eq | Ne | Lt | Le | Gt | Ge
            | Ls | Hs | Equ | Neu | Ltu | Leu | Gtu | Geu | Num | Nan | And | Or | Xor | L | R
            | Wrap | Clamp | F4e | B4e | Rc8 | Ecl | Ecr | Rc16 | Shiftamt | Finite | Infinite
            | Number | Notanumber | Normal | Subnormal | Pack => ModifierClass::Alu,
        }
    }
}

impl Opcode {
    /// Whether `m` is a modifier of this opcode at all (ptxas checks the
    /// combinations; the table keeps a memory modifier off arithmetic and
    /// arithmetic ones off memory).
    fn admits(self, m: Modifier) -> bool {
        match (self, m.class()) {
            (_, ModifierClass::Type) => true,
            (Opcode::Ld | Opcode::Ldu | Opcode::St, class) => class == ModifierClass::Memory,
            (Opcode::Cvta, ModifierClass::Conversion) => true,
            (Opcode::Cvta, ModifierClass::Memory) => m == Modifier::Global,
            (Opcode::Bra | Opcode::Ret | Opcode::Exit, class) => class == ModifierClass::Control,
            (Opcode::Cvta, _) => false,
            (_, class) => class == ModifierClass::Alu,
        }
    }
}

/// An instruction as the table reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Typed {
    pub(crate) opcode: Opcode,
    pub(crate) modifiers: Vec<Modifier>,
}

/// Whether operand `o` can play `role`.
fn plays(k: &Kernel, role: OperandRole, o: &Opnd) -> bool {
    let is_pred = |r: &u32| k.reg_types.get(*r as usize) == Some(&Ty::Pred);
    match (role, o) {
        (Dest, Opnd::Reg(_) | Opnd::Sink) => true,
        (PredPair, Opnd::Pair(a, b)) => is_pred(a) && is_pred(b),
        (Unpack, Opnd::List(items)) => items
            .iter()
            .all(|it| matches!(it, Opnd::Reg(_) | Opnd::Sink)),
        (Data, Opnd::Reg(_) | Opnd::Imm(_) | Opnd::Sreg(_)) => true,
        (Pack, Opnd::List(items)) => items
            .iter()
            .all(|it| matches!(it, Opnd::Reg(_) | Opnd::Imm(_))),
        (Guard, Opnd::Reg(r) | Opnd::Not(r)) => is_pred(r),
        (Address, Opnd::Addr { .. }) => true,
        (Target, Opnd::Label(_)) => true,
        (Immediate, Opnd::Imm(crate::ptx::parse::Imm::Int(_))) => true,
        _ => false,
    }
}

/// Reads `inst` against the table: its opcode, each modifier, and its
/// operands against the opcode's forms.
pub(crate) fn classify(k: &Kernel, inst: &Inst) -> Result<Typed, PtxError> {
    let line = Some(inst.line);
    let opcode = Opcode::from_name(&inst.base).ok_or_else(|| {
        refuse(
            SubReason::UnsupportedInstruction,
            None,
            line,
            format!("`{}` is not an elementwise instruction", inst.opcode),
        )
    })?;
    let mut modifiers = Vec::with_capacity(inst.mods.len());
    for m in &inst.mods {
        let unmodelled = |why: &str| {
            refuse(
                SubReason::UnsupportedInstruction,
                None,
                line,
                format!("`{}`: the modifier `.{m}` {why}", inst.opcode),
            )
        };
        let modifier = Modifier::from_name(m).ok_or_else(|| unmodelled("is not modelled"))?;
        if !opcode.admits(modifier) {
            return Err(unmodelled("is not modelled on this opcode"));
        }
        modifiers.push(modifier);
    }
    let fits = |form: &&[OperandRole]| {
        form.len() == inst.ops.len() && form.iter().zip(&inst.ops).all(|(r, o)| plays(k, *r, o))
    };
    if !opcode.forms().iter().any(fits) {
        return Err(refuse(
            SubReason::UnmodelledOperand,
            None,
            line,
            format!(
                "`{}` with these {} operands is no form ptxd models (each operand needs a known role)",
                inst.opcode,
                inst.ops.len()
            ),
        ));
    }
    Ok(Typed { opcode, modifiers })
}
