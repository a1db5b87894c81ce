//! Which instructions, state spaces and modifiers the verifier models at
//! all: the refusals visible from one instruction, without dataflow.
//!
//! Invariant: past [`structure`], every instruction is an `ld`/`ldu`/`st`
//! in the global or param space with only allow-listed modifiers, a
//! `cvta` to global, a branch or return, or a pure ALU opcode with no
//! memory or control effect; none names a variable, synchronizes threads,
//! or writes one register twice. The dataflow relies on this: an opcode it
//! does not model can only compute data.

use crate::ptx::ir::{Base, Inst, Kernel, Opnd, Ty};
use crate::ptx::PtxError;

use super::refuse;

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
pub(super) fn structure(k: &Kernel) -> Result<(), PtxError> {
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

/// The registers an instruction writes (none for stores and control).
pub(super) fn destinations(inst: &Inst) -> Vec<u32> {
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
