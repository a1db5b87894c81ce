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
//! - Past [`classify`], every operand also has the type PTX's type-checking
//!   rules give its position ([`check_types`]): the opcode takes the
//!   instruction types it carries, and each register (by its declared type),
//!   special register, immediate, `mov` part, guard and address base agrees
//!   with its position's type, the relaxed rule of `ld`/`st`/`cvt` kept to
//!   wider integer registers. So the text ptxd models is one ptxas accepts
//!   and reads at the widths the model reads (`operand_type`).
//! - A modifier's meaning for the proof is the opcode's: the table says
//!   which spellings exist, the dataflow says what they compute.

use crate::ptx::ir::{Base, Inst, Kernel, Opnd, Sreg, Ty};
use crate::ptx::parse::Imm;
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
            // The list forms are `.v2`/`.v4` accesses: `slots` ties the
            // list's length to the vector modifier.
            Opcode::Ld => &[&[Dest, Address], &[Unpack, Address]],
            Opcode::Ldu => &[&[Dest, Address], &[Unpack, Address]],
            Opcode::St => &[&[Address, Data], &[Address, Pack]],
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
        // ptxas reads an address's constant offset as a 32-bit signed
        // number; a wider one is no address it accepts.
        (Address, Opnd::Addr { offset, .. }) => i32::try_from(*offset).is_ok(),
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
    // `.nc` (the non-coherent read-only path) exists only in the global
    // state space named as such: ptxas refuses it on a generic address.
    if modifiers.contains(&Modifier::Nc) && !modifiers.contains(&Modifier::Global) {
        return Err(refuse(
            SubReason::UnsupportedInstruction,
            None,
            line,
            format!(
                "`{}`: the modifier `.nc` needs `.global` (ptxas refuses it on a generic address)",
                inst.opcode
            ),
        ));
    }
    // A load or store's list forms are its vector forms: they fit only a
    // `.v2`/`.v4`/`.v8` access, and the scalar forms only a scalar one.
    let vector = modifiers
        .iter()
        .any(|m| matches!(m, Modifier::V2 | Modifier::V4 | Modifier::V8));
    let memory = matches!(opcode, Opcode::Ld | Opcode::Ldu | Opcode::St);
    let fits = |form: &&[OperandRole]| {
        form.len() == inst.ops.len()
            && form.iter().zip(&inst.ops).all(|(r, o)| plays(k, *r, o))
            && (!memory || form.iter().any(|r| matches!(r, Unpack | Pack)) == vector)
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
    let typed = Typed { opcode, modifiers };
    check_types(k, inst, &typed)?;
    // Special registers past the launch geometry: refused by policy, after
    // the type rules (a mistyped read stays `operand_type`).
    if let Some(s) = inst.ops.iter().find_map(|o| match o {
        Opnd::Sreg(s @ Sreg::Other(name)) if !LANE_SREGS.contains(name) => Some(*s),
        _ => None,
    }) {
        return Err(refuse(
            SubReason::UnmodelledOperand,
            None,
            line,
            format!(
                "`{}` reads `{}`: a kernel may read only its launch geometry \
                 (`%tid`, `%ntid`, `%ctaid`, `%nctaid`, and the lane registers \
                 that follow from it); {}",
                inst.opcode,
                s.name(),
                sreg_policy(s)
            ),
        ));
    }
    Ok(typed)
}

/// What kind of value a PTX type holds, for the type-checking rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `.bX`: raw bits.
    Bit,
    Unsigned,
    Signed,
    /// A floating-point or packed type; which one is the type's [`Modifier`]
    /// (`.f32` and `.f16x2` both have 32 bits and still do not agree).
    Float,
    Pred,
}

/// A PTX type as the type-checking rules read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PtxType {
    kind: Kind,
    bits: u32,
    /// The type itself (`Modifier::F32`, `Modifier::B64`, ..).
    name: Modifier,
}

impl PtxType {
    fn of(m: Modifier) -> Option<PtxType> {
        use Modifier::*;
        let (kind, bits) = match m {
            B8 => (Kind::Bit, 8),
            B16 => (Kind::Bit, 16),
            B32 => (Kind::Bit, 32),
            B64 => (Kind::Bit, 64),
            B128 => (Kind::Bit, 128),
            U8 => (Kind::Unsigned, 8),
            U16 => (Kind::Unsigned, 16),
            U32 => (Kind::Unsigned, 32),
            U64 => (Kind::Unsigned, 64),
            S8 => (Kind::Signed, 8),
            S16 => (Kind::Signed, 16),
            S32 => (Kind::Signed, 32),
            S64 => (Kind::Signed, 64),
            E4m3 | E5m2 => (Kind::Float, 8),
            F16 | Bf16 | E4m3x2 | E5m2x2 => (Kind::Float, 16),
            F16x2 | Bf16x2 | F32 | Tf32 => (Kind::Float, 32),
            F64 => (Kind::Float, 64),
            Pred => (Kind::Pred, 1),
            _ => return None,
        };
        Some(PtxType {
            kind,
            bits,
            name: m,
        })
    }

    fn int(kind: Kind, bits: u32) -> PtxType {
        let name = match (kind, bits) {
            (Kind::Signed, 8) => Modifier::S8,
            (Kind::Signed, 16) => Modifier::S16,
            (Kind::Signed, 32) => Modifier::S32,
            (Kind::Signed, 64) => Modifier::S64,
            (Kind::Unsigned, 8) => Modifier::U8,
            (Kind::Unsigned, 16) => Modifier::U16,
            (Kind::Unsigned, 64) => Modifier::U64,
            (Kind::Bit, 8) => Modifier::B8,
            (Kind::Bit, 16) => Modifier::B16,
            (Kind::Bit, 32) => Modifier::B32,
            (Kind::Bit, 64) => Modifier::B64,
            (Kind::Bit, 128) => Modifier::B128,
            _ => Modifier::U32,
        };
        PtxType { kind, bits, name }
    }

    const U32: PtxType = PtxType {
        kind: Kind::Unsigned,
        bits: 32,
        name: Modifier::U32,
    };
    const U64: PtxType = PtxType {
        kind: Kind::Unsigned,
        bits: 64,
        name: Modifier::U64,
    };
    const S32: PtxType = PtxType {
        kind: Kind::Signed,
        bits: 32,
        name: Modifier::S32,
    };
    const PRED: PtxType = PtxType {
        kind: Kind::Pred,
        bits: 1,
        name: Modifier::Pred,
    };

    fn is_integer(self) -> bool {
        matches!(self.kind, Kind::Bit | Kind::Unsigned | Kind::Signed)
    }

    /// The standard rule (PTX ISA, "Type Checking Rules"): a `.bX`
    /// instruction type agrees with any register type of X bits; `.uX`/`.sX`
    /// with any bit or integer type of X bits; a floating type only with
    /// itself or `.bX` of its size; `.pred` only with `.pred`.
    fn agrees(self, reg: PtxType) -> bool {
        match (self.kind, reg.kind) {
            (Kind::Pred, k) | (k, Kind::Pred) => k == Kind::Pred && self.kind == reg.kind,
            (Kind::Bit, _) => self.bits == reg.bits,
            (Kind::Unsigned | Kind::Signed, Kind::Float) => false,
            (Kind::Unsigned | Kind::Signed, _) => self.bits == reg.bits,
            (Kind::Float, Kind::Bit) => self.bits == reg.bits,
            (Kind::Float, _) => self.name == reg.name,
        }
    }

    /// The relaxed rule of `ld`, `st` and `cvt` ("Operand Size Exceeding
    /// Instruction-Type Size"), kept to its integer half: a bit or integer
    /// register wider than a bit or integer instruction type (the value is
    /// chopped on the way in, zero- or sign-extended on the way out). The
    /// floating cases PTX also allows (a `.bX` register wider than an `.fY`
    /// type, a float register with a narrower `.bX` type) are refused: no
    /// compiler ptxd serves emits them.
    fn agrees_relaxed(self, reg: PtxType) -> bool {
        self.agrees(reg) || (self.is_integer() && reg.is_integer() && reg.bits > self.bits)
    }
}

/// The type of a special register (PTX ISA, "Special Registers").
fn sreg_type(s: Sreg) -> PtxType {
    match s {
        Sreg::Other("%gridid" | "%clock64" | "%globaltimer") => PtxType::U64,
        _ => PtxType::U32,
    }
}

/// The special registers a kernel may read besides the launch geometry:
/// each is a function of `%tid` (the lane, `%tid.x mod 32` in ptxd's 1-D
/// blocks, and masks of it), so it tells a kernel nothing about anyone else
/// (the host engine has no value for them and refuses them when it
/// compiles: `UnsupportedOnHost`).
const LANE_SREGS: [&str; 6] = [
    "%laneid",
    "%lanemask_eq",
    "%lanemask_lt",
    "%lanemask_le",
    "%lanemask_gt",
    "%lanemask_ge",
];

/// Why a special register other than the launch geometry is refused (the
/// policy, one line per class: docs/verifier.md, "Special registers").
fn sreg_policy(s: Sreg) -> &'static str {
    match s {
        Sreg::Other("%clock" | "%clock64" | "%globaltimer") => {
            "a timer measures other tenants' work on the GPU (a timing side channel) and no two runs agree"
        }
        Sreg::Other("%smid" | "%nsmid" | "%warpid" | "%nwarpid" | "%gridid") => {
            "it tells where the hardware placed the thread or how many grids ran before it, \
             which other tenants' work decides"
        }
        Sreg::Other("%dynamic_smem_size" | "%total_smem_size") => {
            "it depends on the executor's configuration, not the launch"
        }
        _ => "ptxd has no model of it",
    }
}

/// What one operand must be.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// A value of this type; `relaxed` under the `ld`/`st`/`cvt` rule.
    Value(PtxType, bool),
    /// A list of parts of this type (`mov` pack or unpack).
    Parts(PtxType),
    /// No type to check (an address, a label, a `lop3` table).
    Untyped,
}

/// The instruction types among `mods`, in order.
fn types(mods: &[Modifier]) -> Vec<PtxType> {
    mods.iter().filter_map(|m| PtxType::of(*m)).collect()
}

/// Whether an opcode takes `t` as its instruction type number `index`
/// (PTX ISA, each instruction's `.type` list; narrower where ptxd's
/// compilers never go).
fn admits_type(op: Opcode, index: usize, t: PtxType) -> bool {
    use Modifier as M;
    let b = t.bits;
    let int = matches!(t.kind, Kind::Unsigned | Kind::Signed);
    let bit = t.kind == Kind::Bit;
    let int16_64 = int && matches!(b, 16 | 32 | 64);
    let bit16_64 = bit && matches!(b, 16 | 32 | 64);
    let signed16_64 = t.kind == Kind::Signed && matches!(b, 16 | 32 | 64);
    let f32_64 = matches!(t.name, M::F32 | M::F64);
    let half = matches!(t.name, M::F16 | M::F16x2 | M::Bf16 | M::Bf16x2);
    match op {
        Opcode::Add | Opcode::Sub | Opcode::Mul | Opcode::Mad | Opcode::Min | Opcode::Max => {
            int16_64 || f32_64 || half
        }
        Opcode::Neg | Opcode::Abs => signed16_64 || f32_64 || half,
        Opcode::Div => int16_64 || f32_64,
        Opcode::Rem | Opcode::Sad => int16_64,
        Opcode::Mul24 | Opcode::Mad24 => int && b == 32,
        Opcode::Fma => f32_64 || half,
        Opcode::Copysign | Opcode::Testp | Opcode::Rcp | Opcode::Sqrt | Opcode::Rsqrt => f32_64,
        Opcode::Ex2 | Opcode::Tanh => t.name == M::F32 || half,
        Opcode::Lg2 | Opcode::Sin | Opcode::Cos => t.name == M::F32,
        Opcode::And | Opcode::Or | Opcode::Xor | Opcode::Not => t.kind == Kind::Pred || bit16_64,
        Opcode::Cnot | Opcode::Shl => bit16_64,
        Opcode::Shr => bit16_64 || int16_64,
        Opcode::Popc | Opcode::Clz | Opcode::Brev | Opcode::Bfi => bit && matches!(b, 32 | 64),
        Opcode::Bfe | Opcode::Bfind => int && matches!(b, 32 | 64),
        Opcode::Prmt | Opcode::Lop3 | Opcode::Shf | Opcode::Fns => bit && b == 32,
        Opcode::Cvt => int || t.kind == Kind::Float,
        Opcode::Mov => t.kind == Kind::Pred || (bit && b >= 16) || int16_64 || f32_64,
        Opcode::Selp => bit16_64 || int16_64 || f32_64,
        Opcode::Slct if index == 0 => bit16_64 || int16_64 || f32_64,
        Opcode::Slct => matches!(t.name, M::S32 | M::F32),
        Opcode::Setp => bit16_64 || int16_64 || f32_64 || half,
        // `set`'s destination: `.u32`, `.s32`, `.f32` and the half forms.
        Opcode::Set if index == 0 => matches!(t.name, M::U32 | M::S32 | M::F32) || half,
        Opcode::Set => bit16_64 || int16_64 || f32_64 || half,
        Opcode::Dp4a | Opcode::Dp2a => int && b == 32,
        Opcode::Ld | Opcode::Ldu | Opcode::St => (bit && b <= 128) || int || f32_64,
        Opcode::Cvta => t.kind == Kind::Unsigned && matches!(b, 32 | 64),
        Opcode::Bra | Opcode::Ret | Opcode::Exit => false,
    }
}

/// How many instruction types an opcode carries.
fn type_count(op: Opcode) -> usize {
    match op {
        Opcode::Cvt | Opcode::Set | Opcode::Slct | Opcode::Dp4a | Opcode::Dp2a => 2,
        Opcode::Bra | Opcode::Ret | Opcode::Exit => 0,
        _ => 1,
    }
}

/// The slot of each operand of `inst`, from its opcode and types; `Err` with
/// why when the types themselves are not a form of the opcode.
fn slots(op: Opcode, mods: &[Modifier], ops: &[Opnd]) -> Result<Vec<Slot>, String> {
    let tys = types(mods);
    if tys.len() != type_count(op) {
        return Err(format!(
            "takes {} instruction type(s), not {}",
            type_count(op),
            tys.len()
        ));
    }
    if let Some((_, t)) = tys
        .iter()
        .enumerate()
        .find(|(j, t)| !admits_type(op, *j, **t))
    {
        return Err(format!("has no `.{}` form", modifier_name(t.name)));
    }
    let Some(&t) = tys.first() else {
        return Ok(vec![Slot::Untyped; ops.len()]);
    };
    let u = tys.get(1).copied().unwrap_or(t);
    let v = |t: PtxType| Slot::Value(t, false);
    let pred = v(PtxType::PRED);
    let wide = || {
        if !t.is_integer() || t.bits > 32 {
            return Err(format!(
                "`.wide` of `.{}` has no double-width type",
                modifier_name(t.name)
            ));
        }
        Ok(PtxType::int(t.kind, t.bits * 2))
    };
    let n = ops.len();
    let mut s = vec![v(t); n];
    match op {
        Opcode::Mul | Opcode::Mad if mods.contains(&Modifier::Wide) => {
            let w = v(wide()?);
            s[0] = w;
            if op == Opcode::Mad && n == 4 {
                s[3] = w;
            }
        }
        Opcode::Shl | Opcode::Shr if n == 3 => s[2] = v(PtxType::U32),
        Opcode::Popc | Opcode::Clz | Opcode::Bfind if n == 2 => s[0] = v(PtxType::U32),
        Opcode::Bfe if n == 4 => {
            s[2] = v(PtxType::U32);
            s[3] = v(PtxType::U32);
        }
        Opcode::Bfi if n == 5 => {
            s[3] = v(PtxType::U32);
            s[4] = v(PtxType::U32);
        }
        Opcode::Lop3 if n == 5 => s[4] = Slot::Untyped,
        Opcode::Shf if n == 4 => s[3] = v(PtxType::U32),
        Opcode::Fns if n == 4 => {
            s[2] = v(PtxType::U32);
            s[3] = v(PtxType::S32);
        }
        Opcode::Testp if n == 2 => s[0] = pred,
        Opcode::Setp => {
            s[0] = pred;
            if n == 4 {
                s[3] = pred;
            }
        }
        Opcode::Selp if n == 4 => s[3] = pred,
        Opcode::Set => {
            s = vec![v(u); n];
            s[0] = v(t);
            if n == 4 {
                s[3] = pred;
            }
        }
        Opcode::Slct if n == 4 => s[3] = v(u),
        Opcode::Dp4a | Opcode::Dp2a if n == 4 => {
            let acc = if t.kind == Kind::Signed || u.kind == Kind::Signed {
                PtxType::S32
            } else {
                PtxType::U32
            };
            s = vec![v(acc), v(t), v(u), v(acc)];
        }
        Opcode::Cvt => {
            if n == 2 {
                s = vec![Slot::Value(t, true), Slot::Value(u, true)];
            } else {
                // Two sources packed into one destination (`cvt.rn.f16x2.f32
                // d, a, b`), and `cvt.rs`'s random bits last.
                s = vec![v(u); n];
                s[0] = v(t);
                if n == 4 {
                    s[3] = v(PtxType::U32);
                }
            }
        }
        Opcode::Mov => {
            for (slot, o) in s.iter_mut().zip(ops) {
                if let Opnd::List(items) = o {
                    let parts = u32::try_from(items.len()).unwrap_or(0);
                    if t.kind != Kind::Bit
                        || !matches!(parts, 2 | 4)
                        || t.bits % parts != 0
                        || t.bits / parts < 8
                    {
                        return Err(format!(
                            "cannot split `.{}` into {} parts",
                            modifier_name(t.name),
                            items.len()
                        ));
                    }
                    *slot = Slot::Parts(PtxType::int(Kind::Bit, t.bits / parts));
                }
            }
        }
        Opcode::Ld | Opcode::Ldu | Opcode::St => {
            let lanes = if mods.contains(&Modifier::V2) {
                2
            } else if mods.contains(&Modifier::V4) {
                4
            } else if mods.contains(&Modifier::V8) {
                8
            } else {
                1
            };
            for (slot, o) in s.iter_mut().zip(ops) {
                *slot = match o {
                    Opnd::Addr { .. } => Slot::Untyped,
                    Opnd::List(items) if items.len() != lanes => {
                        return Err(format!(
                            "a list of {} registers for a {lanes}-lane access",
                            items.len()
                        ))
                    }
                    Opnd::List(_) => Slot::Value(t, true),
                    _ if lanes > 1 => {
                        return Err(format!("a {lanes}-lane access needs a list of registers"))
                    }
                    _ => Slot::Value(t, true),
                };
            }
        }
        _ => {}
    }
    Ok(s)
}

/// The name PTX spells a type modifier with.
fn modifier_name(m: Modifier) -> &'static str {
    use Modifier::*;
    match m {
        B8 => "b8",
        B16 => "b16",
        B32 => "b32",
        B64 => "b64",
        B128 => "b128",
        U8 => "u8",
        U16 => "u16",
        U32 => "u32",
        U64 => "u64",
        S8 => "s8",
        S16 => "s16",
        S32 => "s32",
        S64 => "s64",
        F16 => "f16",
        F16x2 => "f16x2",
        Bf16 => "bf16",
        Bf16x2 => "bf16x2",
        F32 => "f32",
        F64 => "f64",
        Pred => "pred",
        Tf32 => "tf32",
        E4m3 => "e4m3",
        E5m2 => "e5m2",
        E4m3x2 => "e4m3x2",
        E5m2x2 => "e5m2x2",
        _ => "?",
    }
}

/// Why operand `o` does not have type `want` (`None`: it has).
///
/// `legacy16`: the instruction is a `mov` or `cvt`, which may read a
/// dimensioned special register at 16 bits.
fn mismatch(k: &Kernel, want: PtxType, relaxed: bool, legacy16: bool, o: &Opnd) -> Option<String> {
    let agree = |have: PtxType| {
        if relaxed {
            want.agrees_relaxed(have)
        } else {
            want.agrees(have)
        }
    };
    let wanted = modifier_name(want.name);
    match o {
        Opnd::Reg(r) | Opnd::Not(r) => {
            let declared = k
                .reg_type_names
                .get(*r as usize)
                .map_or("?", String::as_str);
            let name = k.reg_names.get(*r as usize).map_or("?", String::as_str);
            let have = Modifier::from_name(declared).and_then(PtxType::of);
            match have {
                Some(h) if agree(h) => None,
                _ => Some(format!(
                    "`{name}` is declared `.{declared}`, which does not agree with `.{wanted}`"
                )),
            }
        }
        // PTX keeps the legacy 16-bit `mov`/`cvt` of `%tid`, `%ntid`,
        // `%ctaid` and `%nctaid` (the low 16 bits).
        Opnd::Sreg(Sreg::Tid(_) | Sreg::Ntid(_) | Sreg::Ctaid(_) | Sreg::Nctaid(_))
            if legacy16 && want.is_integer() && want.bits == 16 =>
        {
            None
        }
        Opnd::Sreg(s) => (!agree(sreg_type(*s))).then(|| {
            format!(
                "`{}` is `.{}`, which does not agree with `.{wanted}`",
                s.name(),
                modifier_name(sreg_type(*s).name)
            )
        }),
        Opnd::Imm(imm) => {
            let fits = match imm {
                // An integer literal in a float position is that number as
                // a float (`mov.f32 %f, 4` is 4.0); kept to `.f32`/`.f64`.
                Imm::Int(_) => {
                    want.is_integer() || matches!(want.name, Modifier::F32 | Modifier::F64)
                }
                Imm::F32(_) => {
                    want.bits == 32 && matches!(want.name, Modifier::F32 | Modifier::B32)
                }
                Imm::F64(_) => matches!(want.name, Modifier::F64 | Modifier::B64 | Modifier::F32),
            };
            (!fits).then(|| format!("the immediate {imm:?} is no `.{wanted}` constant"))
        }
        Opnd::Sink => None,
        // Roles were checked first: nothing else reaches a value slot.
        _ => Some(format!("the operand is no `.{wanted}` value")),
    }
}

/// The type rule of PTX: every operand of `inst` agrees with the type its
/// position has under the instruction's types (`operand_type`).
/// Why a `setp`/`set` comparison is not one PTX defines for the type it
/// compares, if it is not: `lo`/`ls`/`hi`/`hs` compare unsigned integers
/// only; the unordered float comparisons (`equ` .. `geu`, `num`, `nan`)
/// floats only; the ordered `lt`/`le`/`gt`/`ge` numbers, not bit types;
/// `eq`/`ne` anything. ptxas refuses the rest ("mismatch between
/// instruction type and comparison qualifier").
fn comparison_mismatch(inst: &Inst) -> Option<String> {
    const UNSIGNED_ONLY: [&str; 4] = ["lo", "ls", "hi", "hs"];
    const FLOAT_ONLY: [&str; 8] = ["equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"];
    const ORDERED: [&str; 4] = ["lt", "le", "gt", "ge"];
    let cmp = inst.mods.iter().map(String::as_str).find(|m| {
        UNSIGNED_ONLY.contains(m)
            || FLOAT_ONLY.contains(m)
            || ORDERED.contains(m)
            || ["eq", "ne"].contains(m)
    })?;
    // The compared type is the last type of the instruction (`setp.lt.s32`,
    // `set.lt.u32.f32`).
    let ty = inst
        .mods
        .iter()
        .rev()
        .map(String::as_str)
        .find(|m| Ty::from_name(m).is_some() || m.ends_with("x2"))?;
    let float = ty.starts_with('f') || ty.starts_with("bf");
    let unsigned = ty.starts_with('u');
    let signed = ty.starts_with('s');
    let fits = if UNSIGNED_ONLY.contains(&cmp) {
        unsigned
    } else if FLOAT_ONLY.contains(&cmp) {
        float
    } else if ORDERED.contains(&cmp) {
        float || unsigned || signed
    } else {
        true
    };
    (!fits)
        .then(|| format!("compares `.{ty}` with `.{cmp}`, which PTX does not define for that type"))
}

fn check_types(k: &Kernel, inst: &Inst, t: &Typed) -> Result<(), PtxError> {
    let refusal = |why: String| {
        refuse(
            SubReason::OperandType,
            None,
            Some(inst.line),
            format!("`{}` {why}", inst.opcode),
        )
    };
    // `.lo`/`.hi`/`.wide` pick half or all of an integer product: ptxas
    // refuses them on a float `mul`/`mad`.
    if matches!(t.opcode, Opcode::Mul | Opcode::Mad)
        && inst
            .mods
            .iter()
            .any(|m| ["lo", "hi", "wide"].contains(&m.as_str()))
    {
        if let Some(ty) = inst
            .mods
            .iter()
            .map(String::as_str)
            .find(|m| m.starts_with('f') || m.starts_with("bf"))
        {
            return Err(refusal(format!(
                "takes `.lo`/`.hi`/`.wide` with `.{ty}`: they select an integer product's bits"
            )));
        }
    }
    if matches!(t.opcode, Opcode::Setp | Opcode::Set) {
        if let Some(why) = comparison_mismatch(inst) {
            return Err(refusal(why));
        }
    }
    let slots = slots(t.opcode, &t.modifiers, &inst.ops).map_err(refusal)?;
    let legacy16 = matches!(t.opcode, Opcode::Mov | Opcode::Cvt);
    for (j, (slot, o)) in slots.iter().zip(&inst.ops).enumerate() {
        let why = match (slot, o) {
            (Slot::Untyped, _) => None,
            (Slot::Value(want, relaxed), Opnd::Pair(a, b)) => [a, b]
                .into_iter()
                .find_map(|r| mismatch(k, *want, *relaxed, false, &Opnd::Reg(*r))),
            // A `.v2`/`.v4` access: each lane as a scalar access's value.
            (Slot::Value(want, relaxed), Opnd::List(items)) => items
                .iter()
                .find_map(|it| mismatch(k, *want, *relaxed, legacy16, it)),
            (Slot::Value(want, relaxed), o) => mismatch(k, *want, *relaxed, legacy16, o),
            (Slot::Parts(want), Opnd::List(items)) => items
                .iter()
                .find_map(|it| mismatch(k, *want, false, false, it)),
            (Slot::Parts(want), o) => mismatch(k, *want, false, false, o),
        };
        if let Some(why) = why {
            return Err(refusal(format!("operand {}: {why}", j + 1)));
        }
    }
    if let Some((_, g)) = inst.guard {
        if let Some(why) = mismatch(k, PtxType::PRED, false, false, &Opnd::Reg(g)) {
            return Err(refusal(format!("guard: {why}")));
        }
    }
    // The address base of a load or store is a 64-bit integer register.
    for o in &inst.ops {
        if let Opnd::Addr {
            base: Base::Reg(r), ..
        } = o
        {
            if let Some(why) = mismatch(k, PtxType::U64, false, false, &Opnd::Reg(*r)) {
                return Err(refusal(format!("address: {why}")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(name: &str) -> PtxType {
        Modifier::from_name(name)
            .and_then(PtxType::of)
            .unwrap_or(PtxType::PRED)
    }

    /// The PTX ISA's "Type Checking Rules" table, row (instruction type) by
    /// column (operand type), at 32 bits, spelled out; and nothing agrees
    /// across sizes or with `.pred` but `.pred`.
    #[test]
    fn the_standard_rule_is_the_isa_table() {
        let cols = ["b32", "s32", "u32", "f32"];
        for (row, want) in [
            ("b32", [true, true, true, true]),
            ("s32", [true, true, true, false]),
            ("u32", [true, true, true, false]),
            ("f32", [true, false, false, true]),
        ] {
            for (col, w) in cols.iter().zip(want) {
                assert_eq!(ty(row).agrees(ty(col)), w, "{row} with {col}");
                assert_eq!(ty(row).agrees_relaxed(ty(col)), w, "{row} with {col}");
            }
        }
        let all = [
            "b16", "b32", "b64", "u16", "u32", "u64", "s16", "s32", "s64", "f16", "f32", "f64",
            "f16x2", "bf16", "pred",
        ];
        for a in all {
            for b in all {
                let (ta, tb) = (ty(a), ty(b));
                if ta.bits != tb.bits || (ta.kind == Kind::Pred) != (tb.kind == Kind::Pred) {
                    assert!(!ta.agrees(tb), "{a} with {b}");
                }
            }
        }
        // Same size, two float types: no.
        assert!(!ty("f16x2").agrees(ty("f32")));
        assert!(!ty("bf16").agrees(ty("f16")));
        assert!(ty("f16x2").agrees(ty("b32")));
    }

    /// The relaxed rule of `ld`/`st`/`cvt`, as ptxd keeps it: an integer or
    /// bit register wider than an integer or bit type; never narrower, and
    /// never across floats.
    #[test]
    fn the_relaxed_rule_widens_integers_only() {
        assert!(ty("u8").agrees_relaxed(ty("b16")));
        assert!(ty("s8").agrees_relaxed(ty("b64")));
        assert!(ty("b16").agrees_relaxed(ty("u32")));
        assert!(!ty("u32").agrees_relaxed(ty("b16")));
        assert!(!ty("u8").agrees_relaxed(ty("f32")));
        assert!(!ty("f32").agrees_relaxed(ty("b64")));
        assert!(!ty("f16").agrees_relaxed(ty("f32")));
        assert!(!ty("u32").agrees_relaxed(ty("pred")));
    }

    /// Every opcode with types takes at least one, and none takes `.pred`
    /// unless PTX gives it one (`and`/`or`/`xor`/`not`/`mov`).
    #[test]
    fn pred_is_an_instruction_type_of_logic_and_mov_only() {
        for op in [
            Opcode::Add,
            Opcode::Mul,
            Opcode::Cvt,
            Opcode::Setp,
            Opcode::Selp,
            Opcode::Ld,
            Opcode::St,
            Opcode::Cvta,
            Opcode::Shl,
        ] {
            assert!(!admits_type(op, 0, PtxType::PRED), "{op:?}");
        }
        for op in [
            Opcode::And,
            Opcode::Or,
            Opcode::Xor,
            Opcode::Not,
            Opcode::Mov,
        ] {
            assert!(admits_type(op, 0, PtxType::PRED), "{op:?}");
        }
    }
}
