//! Which instructions, state spaces and modifiers the verifier models at
//! all: the refusals visible from one instruction, without dataflow.
//!
//! Invariant: past [`structure`], every instruction is a form of the typed
//! table in `table.rs` (an [`Opcode`], only [`Modifier`]s, every operand in
//! a modelled role): an `ld`/`ldu`/`st` in the global or param space, a
//! `cvta` to global, a branch or return, or a pure ALU opcode with no
//! memory or control effect; none names a variable, synchronizes threads,
//! or writes one register twice. The dataflow relies on this: an opcode it
//! does not model can only compute data.

use crate::ptx::ir::{Base, Inst, Kernel, Opnd};
use crate::ptx::{Families, PtxError};

use super::table::{classify, Modifier, Opcode};
use super::{refuse, SubReason};

/// Refusals visible without dataflow, in instruction order.
pub(super) fn structure(k: &Kernel, families: Families) -> Result<(), PtxError> {
    for v in &k.vars {
        let (sub, what) = match v.space.as_str() {
            "shared" => (SubReason::SharedMemory, "a .shared variable"),
            "local" => (SubReason::LocalMemory, "a .local variable"),
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
        return Err(refuse(
            SubReason::Call,
            None,
            Some(inst.line),
            "a function call",
        ));
    }
    for inst in &k.insts {
        let line = Some(inst.line);
        let b = inst.base.as_str();
        let space = |s: &str| inst.has(s);
        // A load or store is what its modifiers say: refuse any modifier
        // ptxd does not model (`.bulk` writes a range, `.async` completes
        // elsewhere, ..), rather than trust ptxas to reject it.
        if matches!(b, "ld" | "ldu" | "st") {
            if let Some(m) = inst.mods.iter().find(|m| Modifier::from_name(m).is_none()) {
                return Err(refuse(
                    SubReason::UnsupportedInstruction,
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
                SubReason::UniformBranch,
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
                SubReason::DuplicateDestination,
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
                SubReason::SharedMemory,
                None,
                line,
                format!("`{}` uses shared memory", inst.opcode),
            ));
        }
        if matches!(b, "bar" | "barrier" | "membar" | "fence" | "bar.warp") {
            return Err(refuse(
                SubReason::Barrier,
                None,
                line,
                format!("`{}` synchronizes threads", inst.opcode),
            ));
        }
        // `.v2`/`.v4` global accesses are the Vectorized family's, proven
        // element-wise by the dataflow (one vector per thread), and so are
        // generic ones (`-G` builds address params generically; the
        // dataflow proves a generic access through a param as a global
        // one); `.v8`, and a vector in any other space (a param read past
        // its param), never are.
        let generic = !["local", "shared", "const", "param", "tex", "surf"]
            .iter()
            .any(|s| space(s));
        let vector_family = families.vectorized && !space("v8") && (space("global") || generic);
        if matches!(b, "ld" | "st" | "ldu")
            && (space("v2") || space("v4") || space("v8"))
            && !vector_family
        {
            return Err(refuse(
                SubReason::VectorizedAccess,
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
                SubReason::Atomic,
                None,
                line,
                format!("`{}` is an atomic", inst.opcode),
            ));
        }
        if matches!(b, "ld" | "st") && space("local") {
            return Err(refuse(
                SubReason::LocalMemory,
                None,
                line,
                format!("`{}` uses local memory", inst.opcode),
            ));
        }
        if matches!(b, "ld" | "st") && space("const") {
            return Err(refuse(
                SubReason::ConstMemory,
                None,
                line,
                format!("`{}` reads constant memory", inst.opcode),
            ));
        }
        if b == "st" && space("param") {
            return Err(refuse(
                SubReason::ParamMisuse,
                None,
                line,
                "a store to the param space",
            ));
        }
        if matches!(b, "call") {
            return Err(refuse(SubReason::Call, None, line, "a function call"));
        }
        if b == "cvta" && !(space("to") && space("global")) && !space("global") {
            return Err(refuse(
                SubReason::NonGlobalMemory,
                None,
                line,
                format!("`{}` converts a non-global address", inst.opcode),
            ));
        }
        if Opcode::from_name(b).is_none() {
            return Err(refuse(
                SubReason::UnsupportedInstruction,
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
                    SubReason::GlobalVariable,
                    None,
                    line,
                    format!("`{}` names the variable `{s}`", inst.opcode),
                ));
            }
        }
        // Last, the whole table: every modifier and every operand's role.
        classify(k, inst)?;
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
