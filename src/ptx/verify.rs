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
//! PTX semantics the model follows, each a way the proof was broken before:
//! - A predicated instruction may not run: its destination keeps the old
//!   value or takes the new one. A predicated definition of anything but
//!   data (an index, an address, a pointer, a guard) is refused
//!   (`predicated_definition`); a guard never comes from a predicated setp.
//! - Joins are sound for pointers: a value that may carry a pointer's bits
//!   stays marked (`Tainted`), so no join can launder a pointer into data.
//! - Index, address and guard arithmetic counts only at integer types of
//!   the exact widths (`non_integer_arithmetic` for a pointer in a float
//!   instruction).
//! - A pointer's bits may not leave as data: stored, unpacked
//!   (`mov.b64 {lo, hi}`), narrowed (`cvt`, a narrower register or param
//!   load) — `pointer_escape`.
//! - A pair or list destination naming one register twice is refused
//!   (`duplicate_destination`); so are duplicate labels (in `ir`) and code
//!   the control flow cannot reach that holds anything but `ret`/`exit`
//!   (`unreachable_code`).
//! - The checked program is the one that runs: the executors get the text
//!   [`super::print`] prints from this IR, never the client's.
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

/// A set of params, one bit per param index (pointer and count params
/// come first, so at most `MAX_INPUTS + 2` bits are ever set).
type Mask = u128;

fn bit(p: u16) -> Mask {
    1u128.checked_shl(u32::from(p)).unwrap_or(0)
}

/// The lowest param of a mask, for messages.
fn first(m: Mask) -> Option<u16> {
    (m != 0).then(|| u16::try_from(m.trailing_zeros()).unwrap_or(u16::MAX))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V {
    /// Data: nothing ptxd relies on, and no pointer bits.
    Top,
    Const(i64),
    /// The raw value of one of these 64-bit integer params (a pointer or
    /// the count; more than one bit after a `selp` or a join).
    Param(Mask),
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
    /// `param + i × s` for one of the params of the mask.
    Addr(Mask, u32),
    /// A param plus something that is not `i × s`.
    Derived(Mask),
    /// A param plus a 32-bit (wrapping) index times something.
    NarrowAddr(Mask),
    /// May carry the bits of one of these params (after a join of a pointer
    /// with something else). Never an address, never data.
    Tainted(Mask),
    /// A predicate that is true when `i >= n` (`in_range == false`) or when
    /// `i < n` (`in_range == true`), `n` being param `count`.
    Guard {
        count: u16,
        in_range: bool,
    },
}

impl V {
    /// The params whose bits this value may carry.
    fn params(self) -> Mask {
        match self {
            V::Param(m) | V::Addr(m, _) | V::Derived(m) | V::NarrowAddr(m) | V::Tainted(m) => m,
            _ => 0,
        }
    }

    fn pointer(self) -> Option<u16> {
        first(self.params())
    }

    /// Plain data: losing track of it can never matter.
    fn is_data(self) -> bool {
        matches!(self, V::Top | V::Const(_))
    }

    /// The width in bits of the value class (0 for data).
    fn width(self) -> u32 {
        match self {
            // A wrapped index is never trusted, at any width.
            V::Top | V::Const(_) | V::Guard { .. } | V::Narrow => 0,
            V::S32(_) | V::Block32 => 32,
            _ => 64,
        }
    }

    /// What a register holds after paths with `self` and `other` meet.
    fn join(self, other: V) -> V {
        if self == other {
            return self;
        }
        let m = self.params() | other.params();
        match (self, other) {
            (V::Param(a), V::Param(b)) => V::Param(a | b),
            (V::Addr(a, s), V::Addr(b, t)) if s == t => V::Addr(a | b, s),
            _ if m != 0 => V::Tainted(m),
            _ => V::Top,
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
            let j = a.join(*b);
            if j != *a {
                *a = j;
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
        params: Mask,
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

/// The modifiers of `ld`/`ldu`/`st` besides types: state spaces (other
/// spaces and vectors are refused by their own checks first), cache
/// operators, memory-ordering semantics and scopes, and cache hints. None
/// changes which bytes an access touches.
const LD_ST_MODIFIERS: &[&str] = &[
    "global",
    "param",
    "local",
    "shared",
    "const",
    "shared::cta",
    "shared::cluster",
    "v2",
    "v4",
    "v8",
    "ca",
    "cg",
    "cs",
    "lu",
    "cv",
    "wb",
    "wt",
    "nc",
    "volatile",
    "relaxed",
    "acquire",
    "release",
    "weak",
    "mmio",
    "cta",
    "gpu",
    "sys",
    "cluster",
    "L1::evict_normal",
    "L1::evict_unchanged",
    "L1::evict_first",
    "L1::evict_last",
    "L1::no_allocate",
    "L2::evict_normal",
    "L2::evict_first",
    "L2::evict_last",
    "L2::64B",
    "L2::128B",
    "L2::256B",
    "L2::cache_hint",
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
    // A call first: the parameter passing around it (`st.param`) would
    // otherwise be what is reported.
    if let Some(inst) = k.insts.iter().find(|i| i.base == "call") {
        return Err(refuse("call", None, Some(inst.line), "a function call"));
    }
    for inst in &k.insts {
        let line = Some(inst.line);
        let b = inst.base.as_str();
        let space = |s: &str| inst.has(s);
        // A load or store is what its modifiers say: refuse any modifier
        // ptxd does not model (`.bulk` writes a range, `.async` completes
        // elsewhere, ..), rather than trust ptxas to reject it.
        if matches!(b, "ld" | "ldu" | "st") {
            if let Some(m) = inst
                .mods
                .iter()
                .find(|m| Ty::from_name(m).is_none() && !LD_ST_MODIFIERS.contains(&m.as_str()))
            {
                return Err(refuse(
                    "unsupported_instruction",
                    None,
                    line,
                    format!("`{}`: the modifier `.{m}` is not modelled", inst.opcode),
                ));
            }
        }
        // `.uni` promises that the whole warp agrees on the predicate; a
        // guard `i < n` splits the last warp, so the promise would be false
        // and the branch undefined. Compilers emit `.uni` only unpredicated.
        if matches!(b, "bra" | "ret" | "exit") && inst.has("uni") && inst.guard.is_some() {
            return Err(refuse(
                "uniform_branch",
                None,
                line,
                format!(
                    "`{}` is predicated but promises a warp-uniform predicate",
                    inst.opcode
                ),
            ));
        }
        let written = destinations(inst);
        if (1..written.len()).any(|j| written[..j].contains(&written[j])) {
            return Err(refuse(
                "duplicate_destination",
                None,
                line,
                format!(
                    "`{}` names one register twice as a destination; which write wins is not defined",
                    inst.opcode
                ),
            ));
        }
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

/// The registers an instruction writes (none for stores and control).
fn destinations(inst: &Inst) -> Vec<u32> {
    if matches!(inst.base.as_str(), "st" | "bra" | "ret" | "exit") {
        return Vec::new();
    }
    match inst.ops.first() {
        Some(Opnd::Reg(r)) => vec![*r],
        Some(Opnd::Pair(a, b)) => vec![*a, *b],
        Some(Opnd::List(items)) => items
            .iter()
            .filter_map(|o| match o {
                Opnd::Reg(r) => Some(*r),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
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
    // Code the control flow never reaches is not checked below, so it may
    // hold nothing that could matter if ptxd's idea of the control flow
    // were ever wrong.
    for (b, (s, e)) in blocks.iter().enumerate() {
        if entry[b].is_some() {
            continue;
        }
        if let Some(inst) = k.insts[*s..*e]
            .iter()
            .find(|i| !matches!(i.base.as_str(), "ret" | "exit"))
        {
            return Err(refuse(
                "unreachable_code",
                None,
                Some(inst.line),
                format!(
                    "`{}` can never run; only `ret` may be unreachable",
                    inst.opcode
                ),
            ));
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

/// The guard fact a predicate gives when it holds (`when_true`) or not:
/// `Some(count)` when that outcome implies `i < count`.
fn guard_fact(st: &State, p: u32, negated: bool, when_true: bool) -> Option<u16> {
    match st.regs.get(p as usize) {
        Some(V::Guard { count, in_range }) if (*in_range != negated) == when_true => Some(*count),
        _ => None,
    }
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
                if let Some(c) = guard_fact(st, p, neg, true) {
                    taken.guarded = Some(c);
                }
                if let Some(c) = guard_fact(st, p, neg, false) {
                    fall.guarded = Some(c);
                }
                return vec![(t, taken), (pc + 1, fall)];
            }
            "ret" | "exit" => match inst.guard {
                None => return Vec::new(),
                // `@%p ret` with `%p = i >= n`: whoever goes on has `i < n`.
                Some((neg, p)) => {
                    if let Some(c) = guard_fact(st, p, neg, false) {
                        st.guarded = Some(c);
                    }
                }
            },
            _ if inst.guard.is_some() => predicated(k, pc, inst, st, events),
            _ => step(k, pc, inst, st, events),
        }
    }
    vec![(e, st.clone())]
}

/// A predicated non-branch instruction: each destination keeps its old
/// value or takes the new one. Only data may be defined that way.
fn predicated(
    k: &Kernel,
    pc: usize,
    inst: &Inst,
    st: &mut State,
    events: &mut BTreeMap<usize, Event>,
) {
    let dests = destinations(inst);
    let before: Vec<V> = dests
        .iter()
        .map(|r| st.regs.get(*r as usize).copied().unwrap_or(V::Top))
        .collect();
    step(k, pc, inst, st, events);
    for (r, old) in dests.iter().zip(before) {
        let Some(slot) = st.regs.get_mut(*r as usize) else {
            continue;
        };
        let new = *slot;
        if new == old {
            continue;
        }
        if !old.is_data() || !new.is_data() {
            events.insert(
                pc,
                Event::Bad {
                    sub_reason: "predicated_definition",
                    param: first(old.params() | new.params()),
                    explanation: format!(
                        "`{}` is predicated: it may not run, and it defines an index, address, \
                         pointer or guard",
                        inst.opcode
                    ),
                },
            );
        }
        *slot = old.join(new);
    }
}

fn val(st: &State, o: &Opnd) -> V {
    match o {
        Opnd::Reg(r) => st.regs.get(*r as usize).copied().unwrap_or(V::Top),
        // A vector or pair source (`{%a, %b}`, `%a|%b`) packs its parts: it
        // carries every part's pointer bits (a `.b128` pack holds two whole
        // 64-bit pointers), and is never a value ptxd relies on.
        Opnd::List(items) => {
            let m = items.iter().fold(0, |m, it| m | val(st, it).params());
            if m != 0 {
                V::Tainted(m)
            } else {
                V::Top
            }
        }
        Opnd::Pair(a, b) => {
            let m = val(st, &Opnd::Reg(*a)).params() | val(st, &Opnd::Reg(*b)).params();
            if m != 0 {
                V::Tainted(m)
            } else {
                V::Top
            }
        }
        Opnd::Imm(super::parse::Imm::Int(v)) => V::Const(*v),
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
                sub_reason: "pointer_escape",
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

/// The instruction's first type, when it is an integer type of `bits`.
fn int_ty(inst: &Inst, bits: u32) -> bool {
    inst.types()
        .first()
        .is_some_and(|t| t.is_int() && t.bits() == bits)
}

fn is_int(inst: &Inst) -> bool {
    inst.types().first().is_some_and(|t| t.is_int())
}

/// `mul.wide`/`mad.wide` with 32-bit integer sources.
fn wide32(inst: &Inst) -> bool {
    inst.has("wide") && int_ty(inst, 32)
}

/// `ctaid.x × ntid.x`, either order.
fn is_block(a: V, b: V, s: fn(Sk) -> V) -> bool {
    (a == s(Sk::Ctaid) && b == s(Sk::Ntid)) || (a == s(Sk::Ntid) && b == s(Sk::Ctaid))
}

fn scale_by(x: V, c: V) -> Option<V> {
    match (x, c) {
        (V::Index, V::Const(c)) if (1..=64).contains(&c) => Some(V::Scaled(c as u32)),
        (V::Scaled(s), V::Const(c)) if (1..=64).contains(&c) => {
            Some(V::Scaled(s.saturating_mul(c as u32)))
        }
        _ => None,
    }
}

/// `base + off` in 64 bits, for a pointer-class `base`.
fn offset_by(base: V, off: V) -> Option<V> {
    use V::*;
    match (base, off) {
        (Param(m), Scaled(s)) => Some(Addr(m, s)),
        (Param(m), Index) => Some(Addr(m, 1)),
        (Param(m) | Addr(m, _) | Derived(m), Narrow) | (NarrowAddr(m), _) if off.params() == 0 => {
            Some(NarrowAddr(m))
        }
        (Param(m) | Addr(m, _) | Derived(m), y) if y.params() == 0 => Some(Derived(m)),
        _ => None,
    }
}

/// The abstract result of an integer instruction over `a`, `b` (and `c`
/// for `mad`), or `None` when it is not one ptxd models (then a pointer
/// operand is a misuse and the result is data).
fn arith(inst: &Inst, a: V, b: V, c: Option<V>) -> Option<V> {
    use V::*;
    let op = inst.base.as_str();
    let either = |f: &dyn Fn(V, V) -> Option<V>| f(a, b).or_else(|| f(b, a));
    match (op, c) {
        ("mul", None) if wide32(inst) => {
            if is_block(a, b, S32) {
                Some(Block64)
            } else if matches!(a, Narrow | S32(_) | Block32)
                || matches!(b, Narrow | S32(_) | Block32)
            {
                Some(Narrow)
            } else {
                None
            }
        }
        ("mul", None) if int_ty(inst, 32) && !inst.has("wide") => {
            if is_block(a, b, S32) {
                Some(Block32)
            } else if a == Narrow || b == Narrow {
                Some(Narrow)
            } else {
                None
            }
        }
        ("mul", None) if int_ty(inst, 64) && inst.has("lo") => {
            if is_block(a, b, S64) {
                Some(Block64)
            } else if a == Narrow || b == Narrow {
                Some(Narrow)
            } else {
                either(&scale_by)
            }
        }
        ("shl", None) if int_ty(inst, 64) => match (a, b) {
            (Index, Const(c)) if (0..7).contains(&c) => Some(Scaled(1 << c)),
            (Scaled(s), Const(c)) if (0..7).contains(&c) => Some(Scaled(s.saturating_mul(1 << c))),
            (Narrow, _) => Some(Narrow),
            _ => None,
        },
        ("shl", None) if int_ty(inst, 32) => match a {
            Narrow | S32(_) | Block32 => Some(Narrow),
            _ => None,
        },
        ("add", None) if int_ty(inst, 32) => {
            if matches!((a, b), (Block32, S32(Sk::Tid)) | (S32(Sk::Tid), Block32))
                || a == Narrow
                || b == Narrow
            {
                Some(Narrow)
            } else {
                None
            }
        }
        ("add", None) if int_ty(inst, 64) => {
            if matches!((a, b), (Block64, S64(Sk::Tid)) | (S64(Sk::Tid), Block64)) {
                Some(Index)
            } else if a.params() != 0 {
                offset_by(a, b)
            } else if b.params() != 0 {
                offset_by(b, a)
            } else {
                None
            }
        }
        ("sub", None) if int_ty(inst, 64) => match (a, b) {
            (Param(m) | Addr(m, _) | Derived(m), y) if y.params() == 0 => Some(Derived(m)),
            _ => None,
        },
        ("mad", Some(c)) if wide32(inst) => {
            if is_block(a, b, S32) && c == S64(Sk::Tid) {
                Some(Index)
            } else if matches!(a, Narrow | S32(_) | Block32)
                || matches!(b, Narrow | S32(_) | Block32)
            {
                Some(if c.params() != 0 {
                    NarrowAddr(c.params())
                } else {
                    Narrow
                })
            } else {
                None
            }
        }
        ("mad", Some(c)) if int_ty(inst, 32) && inst.has("lo") => {
            let index32 = is_block(a, b, S32) && c == S32(Sk::Tid);
            (index32 || a == Narrow || b == Narrow).then_some(Narrow)
        }
        ("mad", Some(c)) if int_ty(inst, 64) && inst.has("lo") => {
            if is_block(a, b, S64) && c == S64(Sk::Tid) {
                Some(Index)
            } else if c.params() != 0 {
                either(&scale_by).and_then(|sc| offset_by(c, sc))
            } else if a == Narrow || b == Narrow {
                Some(Narrow)
            } else {
                None
            }
        }
        _ => None,
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

/// Interprets one non-branch instruction.
fn step(k: &Kernel, pc: usize, inst: &Inst, st: &mut State, events: &mut BTreeMap<usize, Event>) {
    let op = inst.base.as_str();
    let ops = &inst.ops;
    // An integer literal is that integer only in an integer-typed
    // instruction; in `mov.f32 %f, 4` it is the float 4.0, whose bits are
    // anything but 4.
    let int_inst = is_int(inst);
    let src = |i: usize| match ops.get(i).map_or(V::Top, |o| val(st, o)) {
        V::Const(_) if !int_inst => V::Top,
        v => v,
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
                            V::Param(bit(*p))
                        }
                        (Some("f32"), Some(Ty::F32 | Ty::B32 | Ty::U32 | Ty::S32)) => V::Top,
                        (Some("u64" | "s64" | "b64"), _) => {
                            escape(
                                events,
                                pc,
                                V::Param(bit(*p)),
                                format!(
                                    "`{}` loads the pointer param at another width",
                                    inst.opcode
                                ),
                            );
                            V::Top
                        }
                        _ => {
                            misuse(
                                events,
                                pc,
                                V::Param(bit(*p)),
                                format!("`{}` loads the param at another width", inst.opcode),
                            );
                            V::Top
                        }
                    }
                }
                Some(Opnd::Addr {
                    base: Base::Param(p),
                    ..
                }) => {
                    escape(
                        events,
                        pc,
                        V::Param(bit(*p)),
                        format!("`{}` loads part of the param", inst.opcode),
                    );
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
            set(k, pc, st, ops.first(), v, events);
        }
        "ld" | "ldu" | "st" => {
            let (addr_i, data_i) = if op == "st" { (0, 1) } else { (1, 0) };
            // A cache-policy operand (`.L2::cache_hint`) is no place for a
            // pointer's bits either.
            for o in ops.iter().skip(2) {
                misuse(
                    events,
                    pc,
                    val(st, o),
                    format!("`{}` passes a pointer as an extra operand", inst.opcode),
                );
            }
            let width = inst.types().last().map_or(0, |t| t.bytes());
            let pred_guard = inst.guard.and_then(|(neg, p)| guard_fact(st, p, neg, true));
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
                    (Some(V::Addr(m, scale)), 0) => Event::Access {
                        params: m,
                        kind,
                        width,
                        scale,
                        guarded,
                    },
                    (Some(V::NarrowAddr(m)), _) => Event::Bad {
                        sub_reason: "index_not_64bit",
                        param: first(m),
                        explanation: "the element index is computed in 32 bits and wraps".into(),
                    },
                    (Some(v), _) if v.params() != 0 => Event::Bad {
                        sub_reason: "non_elementwise_address",
                        param: v.pointer(),
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
                let data = match ops.get(data_i) {
                    Some(Opnd::List(items)) => items
                        .iter()
                        .map(|o| val(st, o))
                        .fold(V::Top, |acc, v| if v.params() != 0 { v } else { acc }),
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
        "mov" => {
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
        "cvta" => {
            let v = src(1);
            let r = if v.params() != 0 && int_ty(inst, 64) {
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
        "cvt" => {
            let tys = inst.types();
            let v = src(1);
            let widen = matches!(tys.as_slice(), [Ty::U64 | Ty::S64, Ty::U32 | Ty::S32]);
            let r = match v {
                V::S32(sk) if widen => V::S64(sk),
                V::Narrow | V::Block32 if widen => V::Narrow,
                V::Const(c) if widen => V::Const(c),
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
        "setp"
            if !inst
                .mods
                .iter()
                .any(|m| matches!(m.as_str(), "and" | "or" | "xor")) =>
        {
            let (a, b) = (src(1), src(2));
            let cmp = inst.mods.first().map(String::as_str).unwrap_or("");
            let single = |m: Mask| (m.count_ones() == 1).then(|| first(m)).flatten();
            let r = match (a, b) {
                _ if !is_int(inst) => {
                    if a.params() | b.params() != 0 {
                        events.entry(pc).or_insert(Event::Bad {
                            sub_reason: "non_integer_arithmetic",
                            param: first(a.params() | b.params()),
                            explanation: format!("`{}` compares a pointer as a float", inst.opcode),
                        });
                    }
                    V::Top
                }
                (V::Index, V::Param(m)) | (V::Param(m), V::Index)
                    if int_ty(inst, 64) && single(m).is_some() =>
                {
                    let count = single(m).unwrap_or(u16::MAX);
                    // `n > i` is `i < n`: read the comparison with the index first.
                    let index_first = a == V::Index;
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
                                V::Param(m),
                                format!(
                                    "`{}` compares the count other than as `i < n`",
                                    inst.opcode
                                ),
                            );
                            V::Top
                        }
                    }
                }
                (V::Narrow, V::Param(m)) | (V::Param(m), V::Narrow) => {
                    events.entry(pc).or_insert(Event::Bad {
                        sub_reason: "index_not_64bit",
                        param: first(m),
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
                events.entry(pc).or_insert(Event::Guard { count });
            }
            set(k, pc, st, ops.first(), r, events);
        }
        "not" if inst.has("pred") => {
            let r = match src(1) {
                V::Guard { count, in_range } => V::Guard {
                    count,
                    in_range: !in_range,
                },
                _ => V::Top,
            };
            set(k, pc, st, ops.first(), r, events);
        }
        "selp" if ops.len() == 4 => {
            let (a, b) = (src(1), src(2));
            let r = if a == b {
                a
            } else {
                match (a, b) {
                    // `c ? in0 : in1`, then `[p + i × s]`: either operand's
                    // element i.
                    (V::Param(x), V::Param(y)) => V::Param(x | y),
                    (V::Addr(x, s), V::Addr(y, t)) if s == t => V::Addr(x | y, s),
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
        _ => {
            let (a, b) = (src(1), src(2));
            let r = match ops.len() {
                3 => arith(inst, a, b, None),
                4 => arith(inst, a, b, Some(src(3))),
                _ => None,
            };
            let r = match r {
                Some(v) => v,
                None => {
                    let float = inst.types().first().is_some_and(|t| !t.is_int());
                    for o in ops.iter().skip(1) {
                        let v = val(st, o);
                        if float && v.params() != 0 {
                            events.entry(pc).or_insert(Event::Bad {
                                sub_reason: "non_integer_arithmetic",
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
            // A guard that is no guard (computed from a 32-bit index, as a
            // float, under a predicate, ..) is reported as what it is.
            if let Some((
                pc,
                Event::Bad {
                    sub_reason,
                    param,
                    explanation,
                },
            )) = events.iter().find(|(_, e)| {
                matches!(
                    e,
                    Event::Bad {
                        sub_reason: "index_not_64bit"
                            | "predicated_definition"
                            | "non_integer_arithmetic"
                            | "duplicate_destination",
                        ..
                    }
                )
            }) {
                return Err(refuse(
                    sub_reason,
                    param.and_then(name),
                    line_of(*pc),
                    explanation.clone(),
                ));
            }
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
                // The count's bits are no secret: using them is a misuse of
                // the count, not a pointer escape.
                let sub_reason = match (*sub_reason, *param) {
                    ("pointer_escape", Some(p)) if p == count => "param_misuse",
                    (s, _) => s,
                };
                return Err(refuse(
                    sub_reason,
                    param.and_then(name),
                    line,
                    explanation.clone(),
                ));
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
                params,
                kind,
                width,
                scale,
                guarded,
            } => {
                for p in 0..128u16 {
                    if params & bit(p) == 0 {
                        continue;
                    }
                    let param = &p;
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
