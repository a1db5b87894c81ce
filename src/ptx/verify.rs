//! The scalar-ABI verifier: decides from the kernel's dataflow, not its name
//! or its param types alone, that it is
//! `(const T* in0, .., const T* inK-1, T* out, long long n[, float p0, ..])`
//! run one thread per element.
//!
//! Method: an abstract interpretation over registers on the control-flow
//! graph. Abstract values name what a register provably holds (a param, the
//! global thread index `i = ctaid.x * ntid.x + tid.x` computed in 64 bits,
//! `i × s`, `param + i × s`, a bounds-guard predicate); anything else is
//! `Top` (data). The state also records whether the current path passed the
//! guard `i < n`; joins keep a fact only when every incoming path has it, so
//! "guarded" at an access means the guard dominates it on every path.
//!
//! What acceptance guarantees (and the host engine and launch checks rely
//! on): every global access is a load through an input or a store through the
//! output at exactly `param + i × element size`, of `element size` bytes, on
//! a path where `i < n` holds; so `offset + n × element size <= size` for
//! every operand makes every access of every thread in bounds.

use std::collections::BTreeMap;

use super::ir::{Base, Inst, Kernel, Opnd, Sreg, Ty};
use super::{DeclaredAbi, PtxError, Signature};

/// The most input pointers a scalar kernel may take.
pub const MAX_INPUTS: usize = 64;
/// The most float params a scalar kernel may take.
pub const MAX_SCALAR_PARAMS: usize = 64;
/// The largest `.reqntid`/`.maxntid` x-extent a CUDA block can have.
const MAX_BLOCK: u32 = 1024;
/// Bound on the analysis work (blocks × registers) before refusing.
const MAX_ANALYSIS_CELLS: usize = 1 << 26;

/// What a param is, once verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Input pointer `k`.
    Input(u32),
    Output,
    Count,
    /// Float param `k`.
    Scalar(u32),
}

/// A verified kernel: its signature and each param's role.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub signature: Signature,
    pub roles: Vec<Role>,
}

fn refuse(
    sub_reason: &'static str,
    param: Option<&str>,
    line: Option<u32>,
    explanation: impl Into<String>,
) -> PtxError {
    PtxError::NonScalarAbi {
        sub_reason,
        param: param.map(str::to_string),
        line,
        explanation: explanation.into(),
    }
}

/// The special registers the index is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sk {
    Tid,
    Ntid,
    Ctaid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V {
    Top,
    Const(i64),
    /// The raw value of 64-bit integer param `k` (a pointer or the count).
    Param(u16),
    /// `%tid.x` etc. in 32 bits.
    S32(Sk),
    /// The same, zero-extended to 64 bits.
    S64(Sk),
    /// `ctaid.x * ntid.x` in 32 bits (wraps).
    Block32,
    /// `ctaid.x * ntid.x` exactly, in 64 bits.
    Block64,
    /// The global index, in 64 bits.
    Index,
    /// Anything derived from an index computed in 32 bits (wraps).
    Narrow,
    /// `i × s` in 64 bits.
    Scaled(u32),
    /// `param k + i × s`.
    Addr(u16, u32),
    /// `param k` plus something that is not `i × s`.
    Derived(u16),
    /// `param k + (32-bit index) × s`.
    NarrowAddr(u16),
    /// A predicate that is true when `i >= n` (`in_range == false`) or when
    /// `i < n` (`in_range == true`), `n` being param `count`.
    Guard {
        count: u16,
        in_range: bool,
    },
}

impl V {
    fn pointer(self) -> Option<u16> {
        match self {
            V::Param(p) | V::Addr(p, _) | V::Derived(p) | V::NarrowAddr(p) => Some(p),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct State {
    regs: Vec<V>,
    /// `Some(n)`: every path here passed the guard `i < param n`.
    guarded: Option<u16>,
}

impl State {
    fn join(&mut self, other: &State) -> bool {
        let mut changed = false;
        for (a, b) in self.regs.iter_mut().zip(&other.regs) {
            if *a != *b && *a != V::Top {
                *a = V::Top;
                changed = true;
            }
        }
        if self.guarded != other.guarded && self.guarded.is_some() {
            self.guarded = None;
            changed = true;
        }
        changed
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccessKind {
    Load,
    Store,
}

#[derive(Debug, Clone)]
enum Event {
    Access {
        param: u16,
        kind: AccessKind,
        width: u32,
        scale: u32,
        guarded: Option<u16>,
    },
    Bad {
        sub_reason: &'static str,
        param: Option<u16>,
        explanation: String,
    },
    Misuse {
        param: u16,
        explanation: String,
    },
    Guard {
        count: u16,
    },
}

/// ALU opcodes with no memory or control effect; their results are data.
const PURE: &[&str] = &[
    "add", "sub", "mul", "mad", "fma", "div", "rem", "neg", "abs", "min", "max", "copysign", "and",
    "or", "xor", "not", "cnot", "shl", "shr", "cvt", "mov", "setp", "selp", "set", "slct", "ex2",
    "lg2", "rcp", "sqrt", "rsqrt", "sin", "cos", "tanh", "popc", "clz", "brev", "bfe", "bfi",
    "bfind", "prmt", "lop3", "shf", "testp", "mul24", "mad24", "sad", "fns", "cvt.pack", "mad.lo",
    "dp4a", "dp2a",
];

/// Verifies `kernel` against the scalar ABI and `declared`.
pub fn verify(kernel: &Kernel, declared: Option<DeclaredAbi>) -> Result<Verified, PtxError> {
    let (reqntid, maxntid) = launch_bounds(kernel)?;
    let layout = param_layout(kernel)?;
    structure(kernel)?;
    let events = dataflow(kernel)?;
    let verified = decide(kernel, &layout, &events, reqntid, maxntid)?;
    if let Some(d) = declared {
        if d.inputs != verified.signature.inputs {
            return Err(PtxError::AbiMismatch {
                what: "inputs",
                expected: d.inputs,
                found: verified.signature.inputs,
            });
        }
        if d.scalar_params != verified.signature.scalar_params {
            return Err(PtxError::AbiMismatch {
                what: "scalar_params",
                expected: d.scalar_params,
                found: verified.signature.scalar_params,
            });
        }
    }
    Ok(verified)
}

fn launch_bounds(k: &Kernel) -> Result<(Option<u32>, Option<u32>), PtxError> {
    let line = Some(k.line);
    if let Some([x, y, z]) = k.reqntid {
        if y != 1 || z != 1 || x == 0 || x > MAX_BLOCK {
            return Err(refuse(
                "reqntid_conflict",
                None,
                line,
                format!(".reqntid {x},{y},{z} cannot be honoured by a 1-D launch of one thread per element"),
            ));
        }
    }
    if let Some([x, y, z]) = k.maxntid {
        if y != 1 || z != 1 || x == 0 {
            return Err(refuse(
                "maxntid",
                None,
                line,
                format!(".maxntid {x},{y},{z} cannot be honoured by a 1-D launch"),
            ));
        }
    }
    Ok((k.reqntid.map(|d| d[0]), k.maxntid.map(|d| d[0])))
}

/// The param shape: `ints` 64-bit integer params, then `floats` f32 params.
struct Layout {
    ints: usize,
    floats: usize,
}

fn param_layout(k: &Kernel) -> Result<Layout, PtxError> {
    let mut ints = 0usize;
    let mut floats = 0usize;
    for p in &k.params {
        let name = Some(p.name.as_str());
        let line = Some(p.line);
        if p.array.is_some() {
            return Err(refuse(
                "param_type",
                name,
                line,
                "a by-value aggregate param is not part of the scalar ABI",
            ));
        }
        match p.ty.as_str() {
            "u64" | "s64" | "b64" if floats == 0 => ints += 1,
            "u64" | "s64" | "b64" => {
                return Err(refuse(
                    "extra_params",
                    name,
                    line,
                    "an integer param after the float params",
                ))
            }
            "f32" => floats += 1,
            "u32" | "s32" | "b32" | "u16" | "s16" | "b16" | "u8" | "s8" | "b8" => {
                return Err(refuse(
                    "count_not_64bit",
                    name,
                    line,
                    format!(
                        "a .{} integer param; the element count must be a 64-bit `long long`",
                        p.ty
                    ),
                ))
            }
            other => {
                return Err(refuse(
                    "param_type",
                    name,
                    line,
                    format!("a .{other} param is not part of the scalar ABI"),
                ))
            }
        }
    }
    if ints < 2 {
        return Err(refuse(
            "missing_params",
            None,
            Some(k.line),
            format!("{ints} pointer/count params; the scalar ABI needs at least an output pointer and a count"),
        ));
    }
    if ints - 2 > MAX_INPUTS || floats > MAX_SCALAR_PARAMS {
        return Err(refuse(
            "param_count",
            None,
            Some(k.line),
            format!(
                "{} inputs and {floats} float params exceed the limits ({MAX_INPUTS}, {MAX_SCALAR_PARAMS})",
                ints - 2
            ),
        ));
    }
    Ok(Layout { ints, floats })
}

fn is_memory(base: &str) -> bool {
    matches!(
        base,
        "ld" | "st"
            | "ldu"
            | "atom"
            | "red"
            | "cp"
            | "prefetch"
            | "prefetchu"
            | "tex"
            | "tld4"
            | "suld"
            | "sust"
            | "sured"
            | "ldmatrix"
            | "stmatrix"
            | "mbarrier"
            | "cvta"
            | "isspacep"
            | "multimem"
            | "wgmma"
            | "tensormap"
            | "discard"
            | "applypriority"
            | "createpolicy"
            | "st.async"
            | "red.async"
            | "cp.async"
            | "alloca"
            | "stackrestore"
            | "stacksave"
    )
}

/// Refusals visible without dataflow, in instruction order.
fn structure(k: &Kernel) -> Result<(), PtxError> {
    for v in &k.vars {
        let (sub, what) = match v.space.as_str() {
            "shared" => ("shared_memory", "a .shared variable"),
            "local" => ("local_memory", "a .local variable"),
            _ => continue,
        };
        return Err(refuse(
            sub,
            None,
            Some(v.line),
            format!("{what} `{}`", v.name),
        ));
    }
    for inst in &k.insts {
        let line = Some(inst.line);
        let b = inst.base.as_str();
        let space = |s: &str| inst.has(s);
        if space("shared") || space("shared::cta") || space("shared::cluster") {
            return Err(refuse(
                "shared_memory",
                None,
                line,
                format!("`{}` uses shared memory", inst.opcode),
            ));
        }
        if matches!(b, "bar" | "barrier" | "membar" | "fence" | "bar.warp") {
            return Err(refuse(
                "barrier",
                None,
                line,
                format!("`{}` synchronizes threads", inst.opcode),
            ));
        }
        if matches!(b, "ld" | "st" | "ldu") && (space("v2") || space("v4") || space("v8")) {
            return Err(refuse(
                "vectorized_access",
                None,
                line,
                format!(
                    "`{}` moves several elements per thread; the scalar ABI has one",
                    inst.opcode
                ),
            ));
        }
        if matches!(b, "atom" | "red") {
            return Err(refuse(
                "atomic",
                None,
                line,
                format!("`{}` is an atomic", inst.opcode),
            ));
        }
        if matches!(b, "ld" | "st") && space("local") {
            return Err(refuse(
                "local_memory",
                None,
                line,
                format!("`{}` uses local memory", inst.opcode),
            ));
        }
        if matches!(b, "ld" | "st") && space("const") {
            return Err(refuse(
                "const_memory",
                None,
                line,
                format!("`{}` reads constant memory", inst.opcode),
            ));
        }
        if b == "st" && space("param") {
            return Err(refuse(
                "param_misuse",
                None,
                line,
                "a store to the param space",
            ));
        }
        if matches!(b, "call") {
            return Err(refuse("call", None, line, "a function call"));
        }
        if b == "cvta" && !(space("to") && space("global")) && !space("global") {
            return Err(refuse(
                "non_global_memory",
                None,
                line,
                format!("`{}` converts a non-global address", inst.opcode),
            ));
        }
        let known = matches!(b, "ld" | "st" | "ldu" | "cvta" | "bra" | "ret" | "exit")
            || (PURE.contains(&b) && !is_memory(b));
        if !known {
            return Err(refuse(
                "unsupported_instruction",
                None,
                line,
                format!("`{}` is not an elementwise instruction", inst.opcode),
            ));
        }
        for o in &inst.ops {
            let syms = match o {
                Opnd::Sym(s) => Some(s.as_str()),
                Opnd::Addr {
                    base: Base::Var(s), ..
                } => Some(s.as_str()),
                _ => None,
            };
            if let (Some(s), false) = (syms, b == "bra") {
                return Err(refuse(
                    "global_variable",
                    None,
                    line,
                    format!("`{}` names the variable `{s}`", inst.opcode),
                ));
            }
        }
    }
    Ok(())
}

/// Basic blocks: `(start, end)` instruction ranges.
fn blocks(k: &Kernel) -> Result<Vec<(usize, usize)>, PtxError> {
    let n = k.insts.len();
    let mut leader = vec![false; n + 1];
    leader[0] = true;
    for (i, inst) in k.insts.iter().enumerate() {
        if matches!(inst.base.as_str(), "bra" | "ret" | "exit") {
            leader[i + 1] = true;
        }
        if inst.base == "bra" {
            match inst.ops.first() {
                Some(Opnd::Label(t)) => {
                    if let Some(l) = leader.get_mut(*t as usize) {
                        *l = true;
                    }
                }
                _ => {
                    return Err(refuse(
                        "unsupported_instruction",
                        None,
                        Some(inst.line),
                        "a branch whose target is not a label",
                    ))
                }
            }
        }
    }
    let starts: Vec<usize> = (0..n).filter(|i| leader[*i]).collect();
    Ok(starts
        .iter()
        .enumerate()
        .map(|(j, s)| (*s, starts.get(j + 1).copied().unwrap_or(n)))
        .collect())
}

fn dataflow(k: &Kernel) -> Result<BTreeMap<usize, Event>, PtxError> {
    let blocks = blocks(k)?;
    let nregs = k.reg_types.len();
    if blocks.len().saturating_mul(nregs.max(1)) > MAX_ANALYSIS_CELLS {
        return Err(refuse(
            "too_complex",
            None,
            Some(k.line),
            "the kernel is too large to analyse",
        ));
    }
    let block_of_pc = |pc: usize| blocks.partition_point(|(s, _)| *s <= pc).checked_sub(1);
    let mut entry: Vec<Option<State>> = vec![None; blocks.len()];
    if !blocks.is_empty() {
        entry[0] = Some(State {
            regs: vec![V::Top; nregs],
            guarded: None,
        });
    }
    let mut work: Vec<usize> = vec![0];
    let mut visits = 0usize;
    let limit = blocks.len().saturating_mul(16).saturating_add(64);
    let mut scratch = BTreeMap::new();
    while let Some(b) = work.pop() {
        visits += 1;
        if visits > limit {
            return Err(refuse(
                "too_complex",
                None,
                Some(k.line),
                "the control flow did not settle",
            ));
        }
        let Some(mut st) = entry.get(b).cloned().flatten() else {
            continue;
        };
        let (s, e) = blocks[b];
        let outs = run_block(k, s, e, &mut st, &mut scratch);
        scratch.clear();
        for (pc, out) in outs {
            if pc >= k.insts.len() {
                continue;
            }
            let Some(t) = block_of_pc(pc) else { continue };
            match &mut entry[t] {
                slot @ None => {
                    *slot = Some(out);
                    work.push(t);
                }
                Some(cur) => {
                    if cur.join(&out) {
                        work.push(t);
                    }
                }
            }
        }
    }
    // A final pass with the settled states records each event once.
    let mut events = BTreeMap::new();
    for (b, (s, e)) in blocks.iter().enumerate() {
        if let Some(mut st) = entry[b].clone() {
            run_block(k, *s, *e, &mut st, &mut events);
        }
    }
    Ok(events)
}

/// Interprets block `[s, e)`; returns the successor states by target pc.
fn run_block(
    k: &Kernel,
    s: usize,
    e: usize,
    st: &mut State,
    events: &mut BTreeMap<usize, Event>,
) -> Vec<(usize, State)> {
    for pc in s..e {
        let inst = &k.insts[pc];
        match inst.base.as_str() {
            "bra" => {
                let Some(Opnd::Label(t)) = inst.ops.first() else {
                    return Vec::new();
                };
                let t = *t as usize;
                let Some((neg, p)) = inst.guard else {
                    return vec![(t, st.clone())];
                };
                let mut taken = st.clone();
                let mut fall = st.clone();
                if let Some(V::Guard { count, in_range }) = st.regs.get(p as usize).copied() {
                    if in_range != neg {
                        taken.guarded = Some(count);
                    } else {
                        fall.guarded = Some(count);
                    }
                }
                return vec![(t, taken), (pc + 1, fall)];
            }
            "ret" | "exit" => {
                if inst.guard.is_none() {
                    return Vec::new();
                }
            }
            _ => step(k, pc, inst, st, events),
        }
    }
    vec![(e, st.clone())]
}

fn val(st: &State, o: &Opnd) -> V {
    match o {
        Opnd::Reg(r) => st.regs.get(*r as usize).copied().unwrap_or(V::Top),
        Opnd::Imm(super::parse::Imm::Int(v)) => V::Const(*v),
        Opnd::Sreg(Sreg::Tid(0)) => V::S32(Sk::Tid),
        Opnd::Sreg(Sreg::Ntid(0)) => V::S32(Sk::Ntid),
        Opnd::Sreg(Sreg::Ctaid(0)) => V::S32(Sk::Ctaid),
        _ => V::Top,
    }
}

fn set(st: &mut State, o: Option<&Opnd>, v: V) {
    match o {
        Some(Opnd::Reg(r)) => {
            if let Some(slot) = st.regs.get_mut(*r as usize) {
                *slot = v;
            }
        }
        Some(Opnd::Pair(a, b)) => {
            let negated = match v {
                V::Guard { count, in_range } => V::Guard {
                    count,
                    in_range: !in_range,
                },
                _ => V::Top,
            };
            set(st, Some(&Opnd::Reg(*a)), v);
            set(st, Some(&Opnd::Reg(*b)), negated);
        }
        Some(Opnd::List(items)) => {
            for it in items {
                set(st, Some(it), V::Top);
            }
        }
        _ => {}
    }
}

fn is64(inst: &Inst) -> bool {
    inst.types().first().is_some_and(|t| t.bits() == 64)
}

fn is32(inst: &Inst) -> bool {
    inst.types().first().is_some_and(|t| t.bits() == 32)
}

/// The abstract result of a two-operand integer instruction.
fn binary(inst: &Inst, a: V, b: V) -> Option<V> {
    use V::*;
    let op = inst.base.as_str();
    let wide = inst.has("wide");
    let pair = |x: V, y: V, f: &dyn Fn(V, V) -> Option<V>| f(x, y).or_else(|| f(y, x));
    match op {
        "mul" if wide => pair(a, b, &|x, y| match (x, y) {
            (S32(Sk::Ctaid), S32(Sk::Ntid)) => Some(Block64),
            (Narrow | S32(_) | Block32, _) => Some(Narrow),
            _ => None,
        }),
        "mul" if is32(inst) => pair(a, b, &|x, y| match (x, y) {
            (S32(Sk::Ctaid), S32(Sk::Ntid)) => Some(Block32),
            (Narrow, _) => Some(Narrow),
            _ => None,
        }),
        "mul" if is64(inst) && inst.has("lo") => pair(a, b, &|x, y| match (x, y) {
            (S64(Sk::Ctaid), S64(Sk::Ntid)) => Some(Block64),
            (Index, Const(c)) if (1..=64).contains(&c) => Some(Scaled(c as u32)),
            (Scaled(s), Const(c)) if (1..=64).contains(&c) => {
                Some(Scaled(s.saturating_mul(c as u32)))
            }
            (Narrow, _) => Some(Narrow),
            _ => None,
        }),
        "shl" if is64(inst) => match (a, b) {
            (Index, Const(c)) if (0..7).contains(&c) => Some(Scaled(1 << c)),
            (Scaled(s), Const(c)) if (0..7).contains(&c) => Some(Scaled(s.saturating_mul(1 << c))),
            (Narrow, _) => Some(Narrow),
            _ => None,
        },
        "shl" if is32(inst) => match a {
            Narrow | S32(_) | Block32 => Some(Narrow),
            _ => None,
        },
        "add" if is32(inst) => pair(a, b, &|x, y| match (x, y) {
            (Block32, S32(Sk::Tid)) | (Narrow, _) => Some(Narrow),
            _ => None,
        }),
        "add" if is64(inst) => pair(a, b, &|x, y| match (x, y) {
            (Block64, S64(Sk::Tid)) => Some(Index),
            (Param(p), Scaled(s)) => Some(Addr(p, s)),
            (Param(p), Index) => Some(Addr(p, 1)),
            (Param(p) | Addr(p, _) | Derived(p), Narrow) | (NarrowAddr(p), _) => {
                Some(NarrowAddr(p))
            }
            (Param(p) | Addr(p, _) | Derived(p), y) if y.pointer().is_none() => Some(Derived(p)),
            _ => None,
        }),
        "sub" if is64(inst) => match (a, b) {
            (Param(p) | Addr(p, _) | Derived(p), y) if y.pointer().is_none() => Some(Derived(p)),
            _ => None,
        },
        _ => None,
    }
}

/// Interprets one non-branch instruction.
fn step(k: &Kernel, pc: usize, inst: &Inst, st: &mut State, events: &mut BTreeMap<usize, Event>) {
    let op = inst.base.as_str();
    let ops = &inst.ops;
    let src = |i: usize| ops.get(i).map_or(V::Top, |o| val(st, o));
    let misuse = |events: &mut BTreeMap<usize, Event>, p: u16, what: &str| {
        events.entry(pc).or_insert(Event::Misuse {
            param: p,
            explanation: format!("`{}` {what}", inst.opcode),
        });
    };
    match op {
        "ld" | "ldu" if inst.has("param") => {
            let v = match ops.get(1) {
                Some(Opnd::Addr {
                    base: Base::Param(p),
                    offset: 0,
                }) => {
                    let pty = k.params.get(*p as usize).map(|x| x.ty.as_str());
                    let lty = inst.types().first().copied();
                    match (pty, lty) {
                        (Some("u64" | "s64" | "b64"), Some(Ty::U64 | Ty::S64 | Ty::B64)) => {
                            V::Param(*p)
                        }
                        (Some("f32"), Some(Ty::F32 | Ty::B32 | Ty::U32 | Ty::S32)) => V::Top,
                        _ => {
                            misuse(events, *p, "loads the param at another width");
                            V::Top
                        }
                    }
                }
                Some(Opnd::Addr {
                    base: Base::Param(p),
                    ..
                }) => {
                    misuse(events, *p, "loads part of the param");
                    V::Top
                }
                _ => {
                    events.entry(pc).or_insert(Event::Bad {
                        sub_reason: "param_misuse",
                        param: None,
                        explanation: "a param-space load not from a named param".into(),
                    });
                    V::Top
                }
            };
            set(st, ops.first(), v);
        }
        "ld" | "ldu" | "st" => {
            let (addr_i, data_i) = if op == "st" { (0, 1) } else { (1, 0) };
            let width = inst.types().last().map_or(0, |t| t.bytes());
            let pred_guard = inst
                .guard
                .and_then(|(neg, p)| match st.regs.get(p as usize) {
                    Some(V::Guard { count, in_range }) if *in_range != neg => Some(*count),
                    _ => None,
                });
            let guarded = st.guarded.or(pred_guard);
            let kind = if op == "st" {
                AccessKind::Store
            } else {
                AccessKind::Load
            };
            let ev = match ops.get(addr_i) {
                Some(Opnd::Addr {
                    base: Base::Reg(r),
                    offset,
                }) => match (st.regs.get(*r as usize).copied(), *offset) {
                    (Some(V::Addr(p, scale)), 0) => Event::Access {
                        param: p,
                        kind,
                        width,
                        scale,
                        guarded,
                    },
                    (Some(V::NarrowAddr(p)), _) => Event::Bad {
                        sub_reason: "index_not_64bit",
                        param: Some(p),
                        explanation: "the element index is computed in 32 bits and wraps".into(),
                    },
                    (Some(V::Param(p) | V::Addr(p, _) | V::Derived(p)), _) => Event::Bad {
                        sub_reason: "non_elementwise_address",
                        param: Some(p),
                        explanation: format!(
                            "`{}` does not access element i of its operand (broadcast, offset, gather or strided)",
                            inst.opcode
                        ),
                    },
                    _ => Event::Bad {
                        sub_reason: "non_elementwise_address",
                        param: None,
                        explanation: format!(
                            "`{}` accesses an address not derived from a pointer param",
                            inst.opcode
                        ),
                    },
                },
                _ => Event::Bad {
                    sub_reason: "non_elementwise_address",
                    param: None,
                    explanation: format!("`{}` uses an absolute or symbolic address", inst.opcode),
                },
            };
            events.entry(pc).or_insert(ev);
            if op == "st" {
                if let Some(p) = src(data_i).pointer() {
                    events.insert(
                        pc,
                        Event::Misuse {
                            param: p,
                            explanation: "a pointer param is stored to memory".into(),
                        },
                    );
                }
            } else {
                set(st, ops.first(), V::Top);
            }
        }
        "mov" => {
            let v = src(1);
            set(st, ops.first(), v);
        }
        "cvta" => {
            let v = src(1);
            set(
                st,
                ops.first(),
                if v.pointer().is_some() { v } else { V::Top },
            );
        }
        "cvt" => {
            let tys = inst.types();
            let v = src(1);
            let widen = matches!(tys.as_slice(), [Ty::U64 | Ty::S64, Ty::U32 | Ty::S32]);
            let r = match v {
                V::S32(sk) if widen => V::S64(sk),
                V::Narrow | V::Block32 => V::Narrow,
                V::Const(c) if widen => V::Const(c),
                other => {
                    if let Some(p) = other.pointer() {
                        misuse(events, p, "converts a pointer or count");
                    }
                    V::Top
                }
            };
            set(st, ops.first(), r);
        }
        "setp"
            if !inst
                .mods
                .iter()
                .any(|m| matches!(m.as_str(), "and" | "or" | "xor")) =>
        {
            let (a, b) = (src(1), src(2));
            let cmp = inst.mods.first().map(String::as_str).unwrap_or("");
            let r = match (a, b, cmp) {
                (V::Index, V::Param(p), "ge") | (V::Param(p), V::Index, "le") if is64(inst) => {
                    V::Guard {
                        count: p,
                        in_range: false,
                    }
                }
                (V::Index, V::Param(p), "lt") | (V::Param(p), V::Index, "gt") if is64(inst) => {
                    V::Guard {
                        count: p,
                        in_range: true,
                    }
                }
                (V::Narrow, V::Param(p), _) | (V::Param(p), V::Narrow, _) => {
                    events.entry(pc).or_insert(Event::Bad {
                        sub_reason: "index_not_64bit",
                        param: Some(p),
                        explanation: "the bounds guard compares a 32-bit index".into(),
                    });
                    V::Top
                }
                (x, y, _) => {
                    for p in [x.pointer(), y.pointer()].into_iter().flatten() {
                        misuse(events, p, "compares a param other than as `i < n`");
                    }
                    V::Top
                }
            };
            if let V::Guard { count, .. } = r {
                events.entry(pc).or_insert(Event::Guard { count });
            }
            set(st, ops.first(), r);
        }
        "not" if inst.has("pred") => {
            let r = match src(1) {
                V::Guard { count, in_range } => V::Guard {
                    count,
                    in_range: !in_range,
                },
                _ => V::Top,
            };
            set(st, ops.first(), r);
        }
        _ => {
            let (a, b) = (src(1), src(2));
            let r = if ops.len() == 3 {
                binary(inst, a, b)
            } else if op == "mad" && inst.has("wide") && ops.len() == 4 {
                match (a, b, src(3)) {
                    (V::S32(Sk::Ctaid), V::S32(Sk::Ntid), V::S64(Sk::Tid))
                    | (V::S32(Sk::Ntid), V::S32(Sk::Ctaid), V::S64(Sk::Tid)) => Some(V::Index),
                    (V::Narrow, _, c) | (_, V::Narrow, c) => {
                        Some(c.pointer().map_or(V::Narrow, V::NarrowAddr))
                    }
                    _ => None,
                }
            } else if op == "mad" && is32(inst) && ops.len() == 4 {
                match (a, b, src(3)) {
                    (V::S32(Sk::Ctaid), V::S32(Sk::Ntid), V::S32(Sk::Tid))
                    | (V::S32(Sk::Ntid), V::S32(Sk::Ctaid), V::S32(Sk::Tid)) => Some(V::Narrow),
                    _ => None,
                }
            } else {
                None
            };
            let r = match r {
                Some(v) => v,
                None => {
                    for o in ops.iter().skip(1) {
                        if let Some(p) = val(st, o).pointer() {
                            misuse(events, p, "computes with a pointer or count param");
                        }
                    }
                    V::Top
                }
            };
            set(st, ops.first(), r);
        }
    }
}

fn decide(
    k: &Kernel,
    layout: &Layout,
    events: &BTreeMap<usize, Event>,
    reqntid: Option<u32>,
    maxntid: Option<u32>,
) -> Result<Verified, PtxError> {
    let name = |p: u16| k.params.get(p as usize).map(|x| x.name.as_str());
    let line_of = |pc: usize| k.insts.get(pc).map(|i| i.line);
    let expected_count = u16::try_from(layout.ints - 1).unwrap_or(u16::MAX);
    let output = expected_count - 1;

    let guard = events.iter().find_map(|(pc, e)| match e {
        Event::Guard { count } => Some((*pc, *count)),
        _ => None,
    });
    let count = match guard {
        Some((_, c)) => c,
        None => {
            let at = events
                .iter()
                .find(|(_, e)| matches!(e, Event::Access { .. }))
                .map(|(pc, _)| *pc);
            return Err(refuse(
                "unguarded_access",
                None,
                at.and_then(line_of).or(Some(k.line)),
                "no `i < n` bounds guard against the global thread index",
            ));
        }
    };
    if count < expected_count {
        let extra = count + 1;
        return Err(refuse(
            "extra_params",
            name(extra),
            k.params.get(extra as usize).map(|p| p.line),
            format!(
                "{} integer params follow the count `{}`; the scalar ABI has none",
                expected_count - count,
                name(count).unwrap_or("?")
            ),
        ));
    }
    let mut sizes: Vec<Option<u32>> = vec![None; layout.ints - 1];
    for (pc, e) in events {
        let line = line_of(*pc);
        match e {
            Event::Guard { count: c } if *c != count => {
                return Err(refuse(
                    "param_misuse",
                    name(*c),
                    line,
                    "a second bounds guard against another param",
                ))
            }
            Event::Guard { .. } => {}
            Event::Bad {
                sub_reason,
                param,
                explanation,
            } => {
                return Err(refuse(
                    sub_reason,
                    param.and_then(name),
                    line,
                    explanation.clone(),
                ))
            }
            Event::Misuse { param, explanation } => {
                let sub = if *param == count {
                    "param_misuse"
                } else {
                    "pointer_misuse"
                };
                return Err(refuse(sub, name(*param), line, explanation.clone()));
            }
            Event::Access {
                param,
                kind,
                width,
                scale,
                guarded,
            } => {
                if *guarded != Some(count) {
                    return Err(refuse(
                        "unguarded_access",
                        name(*param),
                        line,
                        "a global access not dominated by the `i < n` guard",
                    ));
                }
                if *param >= expected_count {
                    return Err(refuse(
                        "pointer_misuse",
                        name(*param),
                        line,
                        "the count is used as a pointer",
                    ));
                }
                match (kind, *param == output) {
                    (AccessKind::Store, false) => {
                        return Err(refuse(
                            "pointer_misuse",
                            name(*param),
                            line,
                            "a store through an input pointer",
                        ))
                    }
                    (AccessKind::Load, true) => {
                        return Err(refuse(
                            "pointer_misuse",
                            name(*param),
                            line,
                            "a load through the output pointer",
                        ))
                    }
                    _ => {}
                }
                if width != scale || !matches!(width, 1 | 2 | 4 | 8) {
                    return Err(refuse(
                        "non_elementwise_address",
                        name(*param),
                        line,
                        format!("a {width}-byte access at a stride of {scale} bytes"),
                    ));
                }
                let slot = &mut sizes[*param as usize];
                if slot.is_some_and(|s| s != *width) {
                    return Err(refuse(
                        "non_elementwise_address",
                        name(*param),
                        line,
                        "accesses of different element sizes through one pointer",
                    ));
                }
                *slot = Some(*width);
            }
        }
    }
    let mut element_sizes = Vec::with_capacity(sizes.len());
    for (p, s) in sizes.iter().enumerate() {
        let p16 = u16::try_from(p).unwrap_or(u16::MAX);
        match s {
            Some(s) => element_sizes.push(*s),
            None if p16 == output => {
                return Err(refuse(
                    "no_output_store",
                    name(p16),
                    None,
                    "the output pointer is never stored through",
                ))
            }
            None => {
                return Err(refuse(
                    "unused_input",
                    name(p16),
                    None,
                    "an input pointer is never read",
                ))
            }
        }
    }
    let inputs = u32::from(output);
    let mut roles = Vec::with_capacity(k.params.len());
    for p in 0..k.params.len() {
        let p = u16::try_from(p).unwrap_or(u16::MAX);
        roles.push(if p < output {
            Role::Input(u32::from(p))
        } else if p == output {
            Role::Output
        } else if p == count {
            Role::Count
        } else {
            Role::Scalar(u32::from(p - count - 1))
        });
    }
    Ok(Verified {
        signature: Signature {
            inputs,
            element_sizes,
            scalar_params: u32::try_from(layout.floats).unwrap_or(u32::MAX),
            reqntid,
            maxntid,
        },
        roles,
    })
}
