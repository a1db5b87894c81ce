//! One entry of a parsed module with its names resolved: registers to dense
//! ids (only registers an instruction names get one), labels to instruction
//! indices, params to their positions. The verifier and the host decoder
//! both read this form.
//!
//! Invariants:
//! - Every `Opnd::Reg(id)` satisfies `id < Kernel::reg_types.len()`.
//! - Every `Opnd::Label(pc)` satisfies `pc <= Kernel::insts.len()` (a label
//!   at the very end points one past the last instruction).
//! - An `ld`/`ldu`/`st` operand is never a one-element list: `{ %r }` there
//!   is `%r`.
//! - No instruction carries `.L2::cache_hint` with its policy operand: both
//!   are dropped here, so no client value can reach ptxas as a policy. A
//!   `createpolicy` whose result nothing else reads is dropped too; one
//!   whose result is read stays (and the verifier refuses it).
//! - `{ }` scopes are honoured: a register declared in a scope shadows an
//!   outer one of the same name and is gone after the scope's `}`.

use std::collections::HashMap;

use super::parse::{self, AddrBase, Imm, Operand, Stmt};
use super::{PtxError, SubReason};

/// A PTX fundamental type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ty {
    B8,
    B16,
    B32,
    B64,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    F16,
    Bf16,
    F32,
    F64,
    Pred,
    /// Packed and exotic types (`f16x2`, `b128`, `e4m3`, ..).
    Other,
}

impl Ty {
    pub fn from_name(s: &str) -> Option<Ty> {
        Some(match s {
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "pred" => Ty::Pred,
            "f16x2" | "bf16x2" | "b128" | "e4m3" | "e5m2" | "e4m3x2" | "e5m2x2" | "tf32" => {
                Ty::Other
            }
            _ => return None,
        })
    }

    /// Size in bytes (a predicate counts as 1; exotic types as 0).
    pub fn bytes(self) -> u32 {
        match self {
            Ty::B8 | Ty::U8 | Ty::S8 | Ty::Pred => 1,
            Ty::B16 | Ty::U16 | Ty::S16 | Ty::F16 | Ty::Bf16 => 2,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 => 4,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 8,
            Ty::Other => 0,
        }
    }

    pub fn bits(self) -> u32 {
        self.bytes() * 8
    }

    pub fn is_signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }

    pub fn is_float(self) -> bool {
        matches!(self, Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64)
    }

    pub fn is_int(self) -> bool {
        !self.is_float() && !matches!(self, Ty::Pred | Ty::Other)
    }
}

/// A special register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sreg {
    /// `%tid.{x,y,z}` (dimension 0..3).
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    /// `%laneid`, `%clock`, `%smid`, ... by name (kept for printing).
    Other(&'static str),
}

/// The special registers without dimensions that ptxd knows by name.
const OTHER_SREGS: &[&str] = &[
    "%laneid",
    "%warpid",
    "%nwarpid",
    "%smid",
    "%nsmid",
    "%gridid",
    "%clock",
    "%clock64",
    "%globaltimer",
    "%lanemask_eq",
    "%lanemask_lt",
    "%lanemask_le",
    "%lanemask_gt",
    "%lanemask_ge",
    "%dynamic_smem_size",
    "%total_smem_size",
];

/// Whether `name` is a special register (`%tid.x`, `%laneid`, ..).
pub(crate) fn is_sreg(name: &str) -> bool {
    Sreg::from_name(name).is_some()
}

impl Sreg {
    fn from_name(s: &str) -> Option<Sreg> {
        let (base, dim) = match s.rsplit_once('.') {
            Some((b, "x")) => (b, 0),
            Some((b, "y")) => (b, 1),
            Some((b, "z")) => (b, 2),
            _ => (s, 3),
        };
        Some(match (base, dim) {
            ("%tid", d) if d < 3 => Sreg::Tid(d),
            ("%ntid", d) if d < 3 => Sreg::Ntid(d),
            ("%ctaid", d) if d < 3 => Sreg::Ctaid(d),
            ("%nctaid", d) if d < 3 => Sreg::Nctaid(d),
            (other, 3) => Sreg::Other(OTHER_SREGS.iter().copied().find(|n| *n == other)?),
            _ => return None,
        })
    }

    /// The name as PTX spells it.
    pub fn name(self) -> String {
        let dim = |d: u8| ["x", "y", "z"].get(usize::from(d)).copied().unwrap_or("x");
        match self {
            Sreg::Tid(d) => format!("%tid.{}", dim(d)),
            Sreg::Ntid(d) => format!("%ntid.{}", dim(d)),
            Sreg::Ctaid(d) => format!("%ctaid.{}", dim(d)),
            Sreg::Nctaid(d) => format!("%nctaid.{}", dim(d)),
            Sreg::Other(n) => n.to_string(),
        }
    }
}

/// The base of an address operand.
#[derive(Debug, Clone, PartialEq)]
pub enum Base {
    Reg(u32),
    /// A kernel param by position.
    Param(u16),
    /// A variable (module or body level) by name.
    Var(String),
    Imm(i64),
}

/// A resolved operand.
#[derive(Debug, Clone, PartialEq)]
pub enum Opnd {
    Reg(u32),
    Not(u32),
    Pair(u32, u32),
    Sreg(Sreg),
    Imm(Imm),
    Addr {
        base: Base,
        offset: i64,
    },
    List(Vec<Opnd>),
    Label(u32),
    /// A name that is no register, label or param (a variable or function).
    Sym(String),
    /// `_`
    Sink,
}

/// A resolved instruction.
#[derive(Debug, Clone, PartialEq)]
pub struct Inst {
    /// The full dotted opcode as written.
    pub opcode: String,
    /// The mnemonic (`ld`).
    pub base: String,
    /// The modifiers without dots (`global`, `f32`).
    pub mods: Vec<String>,
    /// `@%p` (false) or `@!%p` (true).
    pub guard: Option<(bool, u32)>,
    pub ops: Vec<Opnd>,
    pub line: u32,
}

impl Inst {
    pub fn has(&self, m: &str) -> bool {
        self.mods.iter().any(|x| x == m)
    }

    /// The types among the modifiers, in order.
    pub fn types(&self) -> Vec<Ty> {
        self.mods.iter().filter_map(|m| Ty::from_name(m)).collect()
    }
}

/// A kernel param.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: String,
    pub array: Option<u64>,
    pub line: u32,
}

/// A variable declared in the module or the body.
#[derive(Debug, Clone, PartialEq)]
pub struct Var {
    pub space: String,
    pub name: String,
    pub line: u32,
}

/// One resolved entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// The module's `.version`, as written.
    pub version: Option<String>,
    /// The module's `.target` list.
    pub target: Vec<String>,
    /// The module's `.address_size`.
    pub address_size: Option<u32>,
    pub name: String,
    pub line: u32,
    pub params: Vec<Param>,
    pub reqntid: Option<[u32; 3]>,
    pub maxntid: Option<[u32; 3]>,
    pub minnctapersm: Option<u32>,
    pub maxnreg: Option<u32>,
    pub insts: Vec<Inst>,
    pub reg_types: Vec<Ty>,
    /// Each register's declared type as written (`f32`, `f16x2`, `pred`).
    pub reg_type_names: Vec<String>,
    pub reg_names: Vec<String>,
    /// Variables of the module and of the body.
    pub vars: Vec<Var>,
    /// Directives that change how ptxas compiles the kernel and that the
    /// canonical text does not keep (module, entry or body `.pragma`s,
    /// cluster directives), with their lines: `canonicalize` refuses them.
    pub unkept: Vec<(String, u32)>,
    /// The instructions a `.pragma "nounroll";` precedes (it heads their
    /// loop): the canonical text keeps it there.
    pub nounroll: Vec<usize>,
}

/// A declaration in a scope: a range `%r<N>` or a single name.
#[derive(Clone)]
struct Decl {
    ty: Ty,
    ty_name: String,
    /// `Some(N)` for a range.
    count: Option<u32>,
    /// Unique per declaration, to key dense ids.
    key: u32,
}

#[derive(Default)]
struct Scope {
    singles: HashMap<String, Decl>,
    ranges: HashMap<String, Decl>,
}

struct Resolver {
    scopes: Vec<Scope>,
    next_key: u32,
    dense: HashMap<(u32, u32), u32>,
    reg_types: Vec<Ty>,
    reg_type_names: Vec<String>,
    reg_names: Vec<String>,
}

impl Resolver {
    /// Whether `name` names a register declared in a scope open here.
    fn declared(&self, name: &str) -> bool {
        self.lookup(name).is_some()
    }

    fn lookup(&self, name: &str) -> Option<(Decl, u32)> {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, index) = name.split_at(name.len() - digits);
        let index: Option<u32> = index.parse().ok();
        for scope in self.scopes.iter().rev() {
            if let Some(d) = scope.singles.get(name) {
                return Some((d.clone(), 0));
            }
            if let (Some(d), Some(i)) = (scope.ranges.get(prefix), index) {
                if d.count.is_some_and(|n| i < n) {
                    return Some((d.clone(), i));
                }
            }
        }
        None
    }

    fn reg(&mut self, name: &str, line: u32, col: u32) -> Result<u32, PtxError> {
        let found = self.lookup(name);
        let (decl, index) = found.ok_or_else(|| PtxError::Parse {
            line,
            column: col,
            message: format!("undeclared register {:?}", parse::clip(name)),
        })?;
        if let Some(id) = self.dense.get(&(decl.key, index)) {
            return Ok(*id);
        }
        let id = u32::try_from(self.reg_types.len()).map_err(|_| PtxError::Parse {
            line,
            column: col,
            message: "too many registers".into(),
        })?;
        self.dense.insert((decl.key, index), id);
        self.reg_types.push(decl.ty);
        self.reg_type_names.push(decl.ty_name);
        self.reg_names.push(name.to_string());
        Ok(id)
    }
}

/// The modifier whose policy operand `lower` drops (see there).
const CACHE_HINT: &str = "L2::cache_hint";

/// Resolves entry `symbol` of `module`.
pub fn lower(module: &parse::Module, symbol: &str) -> Result<Kernel, PtxError> {
    let Some(f) = module
        .functions
        .iter()
        .find(|f| f.is_entry && f.name == symbol && f.body.is_some())
    else {
        return Err(PtxError::SymbolNotFound {
            symbol: symbol.to_string(),
            entries: module
                .functions
                .iter()
                .filter(|f| f.is_entry && f.body.is_some())
                .map(|f| f.name.clone())
                .collect(),
        });
    };
    let body = f.body.as_deref().unwrap_or(&[]);
    let params: Vec<Param> = f
        .params
        .iter()
        .map(|p| Param {
            name: p.name.clone(),
            ty: p.ty.clone(),
            array: p.array,
            line: p.line,
        })
        .collect();
    let param_index: HashMap<&str, u16> = f
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), u16::try_from(i).unwrap_or(u16::MAX)))
        .collect();
    let mut vars: Vec<Var> = module
        .variables
        .iter()
        .map(|v| Var {
            space: v.space.clone(),
            name: v.name.clone(),
            line: v.line,
        })
        .collect();

    // Labels first: a branch may jump forward. ptxas resolves a label by
    // scope, so one name defined twice (even in sibling scopes) could mean
    // two places; ptxd refuses it instead of guessing which.
    let mut labels: HashMap<&str, u32> = HashMap::new();
    let mut count = 0u32;
    for s in body {
        match s {
            Stmt::Label { name, line } if labels.insert(name.as_str(), count).is_some() => {
                return Err(PtxError::NonScalarAbi {
                    sub_reason: SubReason::DuplicateLabel.as_str(),
                    param: None,
                    line: Some(*line),
                    explanation: format!(
                        "the label `{}` is defined more than once",
                        parse::clip(name)
                    ),
                });
            }
            Stmt::Instr(_) => count = count.saturating_add(1),
            _ => {}
        }
    }

    let mut r = Resolver {
        scopes: vec![Scope::default()],
        next_key: 0,
        dense: HashMap::new(),
        reg_types: Vec::new(),
        reg_type_names: Vec::new(),
        reg_names: Vec::new(),
    };
    let mut insts = Vec::new();
    let mut unkept: Vec<(String, u32)> = module.unkept.iter().chain(&f.unkept).cloned().collect();
    let mut nounroll: Vec<usize> = Vec::new();
    for s in body {
        match s {
            Stmt::Open => r.scopes.push(Scope::default()),
            Stmt::Close => {
                r.scopes.pop();
            }
            Stmt::Reg {
                ty: ty_name,
                name,
                count,
                line,
                col,
            } => {
                let ty = Ty::from_name(ty_name).ok_or_else(|| PtxError::Parse {
                    line: *line,
                    column: *col,
                    message: format!("unknown register type .{ty_name}"),
                })?;
                if labels.contains_key(name.as_str()) || param_index.contains_key(name.as_str()) {
                    return Err(PtxError::Parse {
                        line: *line,
                        column: *col,
                        message: format!(
                            "the register {:?} has the name of a label or param",
                            parse::clip(name)
                        ),
                    });
                }
                let decl = Decl {
                    ty,
                    ty_name: ty_name.clone(),
                    count: *count,
                    key: r.next_key,
                };
                r.next_key = r.next_key.saturating_add(1);
                if let Some(scope) = r.scopes.last_mut() {
                    if count.is_some() {
                        scope.ranges.insert(name.clone(), decl);
                    } else {
                        scope.singles.insert(name.clone(), decl);
                    }
                }
            }
            Stmt::Var {
                space, name, line, ..
            } => vars.push(Var {
                space: space.clone(),
                name: name.clone(),
                line: *line,
            }),
            Stmt::Label { .. } => {}
            Stmt::Unkept { directive, .. } if directive == super::parse::NOUNROLL => {
                nounroll.push(insts.len());
            }
            Stmt::Unkept { directive, line } => unkept.push((directive.clone(), *line)),
            Stmt::Instr(i) => {
                let guard = match &i.guard {
                    Some((neg, name)) => Some((*neg, r.reg(name, i.line, i.col)?)),
                    None => None,
                };
                let mut parts = i.opcode.split('.');
                let base = parts.next().unwrap_or_default().to_string();
                let mut mods: Vec<String> = parts.map(str::to_string).collect();
                let mut opcode = i.opcode.clone();
                let mut operands = &i.operands[..];
                // `ld`/`st` `.L2::cache_hint` takes a cache-policy operand
                // that ptxas uses as the access's memory descriptor (a data
                // value there faults the GPU). The hint never changes what
                // is computed, so the IR, and so the canonical text, drops
                // it and its operand; nothing downstream ever sees one.
                if matches!(base.as_str(), "ld" | "ldu" | "st")
                    && i.operands.len() == 3
                    && mods.iter().any(|m| m == CACHE_HINT)
                {
                    mods.retain(|m| m != CACHE_HINT);
                    operands = &i.operands[..2];
                    opcode = std::iter::once(base.as_str())
                        .chain(mods.iter().map(String::as_str))
                        .collect::<Vec<_>>()
                        .join(".");
                }
                let mut ops = Vec::with_capacity(operands.len());
                for o in operands {
                    let o = operand(o, i, &mut r, &labels, &param_index)?;
                    // A scalar access through a one-element list (Triton's
                    // `ld.global.b32 { %r1 }, [..]`) is the access through the
                    // register itself; a wider list is a vector access.
                    let o = match o {
                        Opnd::List(items)
                            if matches!(base.as_str(), "ld" | "ldu" | "st")
                                && matches!(items.as_slice(), [Opnd::Reg(_)]) =>
                        {
                            items.into_iter().next().unwrap_or(Opnd::Sink)
                        }
                        o => o,
                    };
                    ops.push(o);
                }
                insts.push(Inst {
                    opcode,
                    base,
                    mods,
                    guard,
                    ops,
                    line: i.line,
                });
            }
        }
    }
    // A label after the last instruction: make the implicit exit explicit,
    // so every label names an instruction (and the printed text has one).
    if labels.values().any(|pc| *pc as usize == insts.len()) {
        insts.push(Inst {
            opcode: "ret".into(),
            base: "ret".into(),
            mods: Vec::new(),
            guard: None,
            ops: Vec::new(),
            line: f.line,
        });
    }
    if drop_unread_policies(&mut insts, &mut nounroll) {
        let ret = Inst {
            opcode: "ret".into(),
            base: "ret".into(),
            mods: Vec::new(),
            guard: None,
            ops: Vec::new(),
            line: f.line,
        };
        // A branch to a dropped last instruction: it now names the end.
        let end = u32::try_from(insts.len()).unwrap_or(u32::MAX);
        if insts
            .iter()
            .flat_map(|i| &i.ops)
            .any(|o| *o == Opnd::Label(end))
        {
            insts.push(ret);
        }
    }
    Ok(Kernel {
        version: module.version.clone(),
        target: module.target.clone(),
        address_size: module.address_size,
        name: f.name.clone(),
        line: f.line,
        params,
        reqntid: f.reqntid,
        maxntid: f.maxntid,
        minnctapersm: f.minnctapersm,
        maxnreg: f.maxnreg,
        insts,
        reg_types: r.reg_types,
        reg_type_names: r.reg_type_names,
        reg_names: r.reg_names,
        vars,
        unkept,
        nounroll,
    })
}

/// Opcodes whose first operand, a register, is read, not written.
const FIRST_OPERAND_READ: &[&str] = &[
    "st",
    "red",
    "bra",
    "brx",
    "bar",
    "barrier",
    "nanosleep",
    "stackrestore",
    "prefetch",
    "prefetchu",
    "pmevent",
];

/// Every register `inst` may read: each one it names but a destination
/// (the first operand of an opcode that writes it), and its guard. A
/// register counted here that is written is only a missed drop, never a
/// wrong one.
fn read_registers(inst: &Inst, out: &mut Vec<u32>) {
    fn regs(o: &Opnd, out: &mut Vec<u32>) {
        match o {
            Opnd::Reg(r) | Opnd::Not(r) => out.push(*r),
            Opnd::Pair(a, b) => out.extend([*a, *b]),
            Opnd::Addr {
                base: Base::Reg(r), ..
            } => out.push(*r),
            Opnd::List(items) => items.iter().for_each(|i| regs(i, out)),
            _ => {}
        }
    }
    if let Some((_, g)) = inst.guard {
        out.push(g);
    }
    let writes_first = !FIRST_OPERAND_READ.contains(&inst.base.as_str())
        && matches!(
            inst.ops.first(),
            Some(Opnd::Reg(_) | Opnd::Pair(..) | Opnd::List(_))
        );
    let sources = if writes_first {
        inst.ops.get(1..).unwrap_or(&[])
    } else {
        &inst.ops[..]
    };
    sources.iter().for_each(|o| regs(o, out));
}

/// Drops each `createpolicy` whose result no instruction reads. Its only
/// reader was a `.L2::cache_hint` operand, which `lower` drops (see
/// there), so the policy computes nothing the kernel uses; one whose
/// result is read anywhere else (an address, a stored value, a compare)
/// stays, and the verifier refuses it (`unsupported_instruction`).
/// Branch targets and `nounroll` marks move to the same instruction as
/// before (a label on a dropped instruction to the next one kept).
/// Whether the kernel had any `createpolicy` (then the caller makes sure a
/// branch to the end finds an instruction).
fn drop_unread_policies(insts: &mut Vec<Inst>, nounroll: &mut [usize]) -> bool {
    if !insts.iter().any(|i| i.base == "createpolicy") {
        return false;
    }
    let mut read = std::collections::HashSet::new();
    let mut buf = Vec::new();
    for i in insts.iter() {
        buf.clear();
        read_registers(i, &mut buf);
        read.extend(buf.iter().copied());
    }
    let keep: Vec<bool> = insts
        .iter()
        .map(|i| {
            i.base != "createpolicy"
                || !matches!(i.ops.first(), Some(Opnd::Reg(r)) if !read.contains(r))
        })
        .collect();
    // The new index of each old one (and of one past the end).
    let mut moved = Vec::with_capacity(insts.len() + 1);
    let mut kept = 0u32;
    for k in &keep {
        moved.push(kept);
        kept += u32::from(*k);
    }
    moved.push(kept);
    let at = |pc: u32| moved.get(pc as usize).copied().unwrap_or(kept);
    let mut k = keep.iter();
    insts.retain(|_| k.next().copied().unwrap_or(true));
    for i in insts.iter_mut() {
        for o in &mut i.ops {
            if let Opnd::Label(pc) = o {
                *pc = at(*pc);
            }
        }
    }
    for pc in nounroll.iter_mut() {
        *pc = at(u32::try_from(*pc).unwrap_or(u32::MAX)) as usize;
    }
    true
}

/// Names the canonical printer makes up (`$ptxd_L<pc>`) may not be used.
fn reserved(n: &str, i: &parse::Instr) -> Result<(), PtxError> {
    if n.starts_with("$ptxd_") {
        return Err(PtxError::Parse {
            line: i.line,
            column: i.col,
            message: format!("{:?} uses the reserved prefix `$ptxd_`", parse::clip(n)),
        });
    }
    Ok(())
}

fn operand(
    o: &Operand,
    i: &parse::Instr,
    r: &mut Resolver,
    labels: &HashMap<&str, u32>,
    params: &HashMap<&str, u16>,
) -> Result<Opnd, PtxError> {
    let name = |n: &str, r: &mut Resolver| -> Result<Opnd, PtxError> {
        if n == "_" {
            return Ok(Opnd::Sink);
        }
        if n.starts_with('%') {
            if let Some(s) = Sreg::from_name(n) {
                return Ok(Opnd::Sreg(s));
            }
            return Ok(Opnd::Reg(r.reg(n, i.line, i.col)?));
        }
        // Registers need no `%` (cuda_fp16.h's inline asm declares scoped
        // `.reg .b16 c;`); a declared register wins, as in ptxas.
        if r.declared(n) {
            return Ok(Opnd::Reg(r.reg(n, i.line, i.col)?));
        }
        if let Some(pc) = labels.get(n) {
            return Ok(Opnd::Label(*pc));
        }
        reserved(n, i)?;
        Ok(Opnd::Sym(n.to_string()))
    };
    Ok(match o {
        Operand::Name(n) => name(n, r)?,
        Operand::Not(n) => Opnd::Not(r.reg(n, i.line, i.col)?),
        Operand::Pair(a, b) => Opnd::Pair(r.reg(a, i.line, i.col)?, r.reg(b, i.line, i.col)?),
        Operand::Imm(v) => Opnd::Imm(*v),
        Operand::Addr { base, offset } => {
            let base = match base {
                AddrBase::Imm(v) => Base::Imm(*v),
                AddrBase::Name(n) if n.starts_with('%') || r.declared(n) => {
                    Base::Reg(r.reg(n, i.line, i.col)?)
                }
                AddrBase::Name(n) => match params.get(n.as_str()) {
                    Some(k) => Base::Param(*k),
                    None => {
                        reserved(n, i)?;
                        if n.contains("_param_") {
                            return Err(PtxError::Parse {
                                line: i.line,
                                column: i.col,
                                message: format!(
                                    "{:?} looks like a param name but is no param of this entry",
                                    parse::clip(n)
                                ),
                            });
                        }
                        Base::Var(n.clone())
                    }
                },
            };
            Opnd::Addr {
                base,
                offset: *offset,
            }
        }
        Operand::List(items) => {
            let mut v = Vec::with_capacity(items.len());
            for it in items {
                v.push(operand(it, i, r, labels, params)?);
            }
            Opnd::List(v)
        }
    })
}
