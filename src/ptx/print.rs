//! The canonical printer: one verified entry, printed back as PTX from the
//! IR the verifier read. This text, never the client's, is what the CUDA
//! executor JIT-compiles, what the host engine runs and what the content
//! hash covers, so a disagreement between ptxd's parser and ptxas about the
//! client's text cannot reach the GPU.
//!
//! Invariants:
//! - The output names every register `%r<id>` with its own `.reg`
//!   declaration, every param `<entry>_param_<k>` and every branch target
//!   `$L<pc>`: no scopes, no shadowing, no name that can mean two things.
//! - Nothing but the entry is printed: no other function, no variable, no
//!   debug section, no `.loc`/`.file`. A `debug` target cannot be printed
//!   without the debug sections ptxas then requires (the driver's JIT
//!   refuses it), so its one effect on results, no `mul`+`add` contracted
//!   into `fma`, is kept by pinning every float `add`/`sub`/`mul` to `.rn`
//!   (which ptxas never contracts) and the option is dropped
//!   ([`without_debug_target`]). Every other `.target` option and every
//!   entry directive that changes code generation (`.maxnreg`,
//!   `.minnctapersm`, the launch bounds) is printed as written; the
//!   directives it cannot keep (`.pragma`, cluster directives) are refused by
//!   [`super::canonicalize`], never dropped.
//! - `parse(print(k))` lowers to `k` up to source positions and names
//!   ([`same_program`]); [`super::canonicalize`] checks this on every load.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::ir::{Base, Inst, Kernel, Opnd};
use super::parse::Imm;

fn reg(id: u32) -> String {
    format!("%r{id}")
}

fn param_name(k: &Kernel, index: u16) -> String {
    format!("{}_param_{index}", k.name)
}

fn operand(k: &Kernel, o: &Opnd, out: &mut String) {
    match o {
        Opnd::Reg(r) => out.push_str(&reg(*r)),
        Opnd::Not(r) => {
            out.push('!');
            out.push_str(&reg(*r));
        }
        Opnd::Pair(a, b) => {
            let _ = write!(out, "{}|{}", reg(*a), reg(*b));
        }
        Opnd::Sreg(s) => out.push_str(&s.name()),
        Opnd::Imm(Imm::Int(v)) => {
            let _ = write!(out, "{v}");
        }
        Opnd::Imm(Imm::F32(bits)) => {
            let _ = write!(out, "0f{bits:08X}");
        }
        Opnd::Imm(Imm::F64(bits)) => {
            let _ = write!(out, "0d{bits:016X}");
        }
        Opnd::Addr { base, offset } => {
            out.push('[');
            match base {
                Base::Reg(r) => out.push_str(&reg(*r)),
                Base::Param(p) => out.push_str(&param_name(k, *p)),
                Base::Var(name) => out.push_str(name),
                // The lexer reads an absolute address as an unsigned number.
                Base::Imm(v) => {
                    let _ = write!(out, "{}", *v as u64);
                }
            }
            // `[%r+-8]`, as nvcc writes it: ptxas reads no `[%r-8]`.
            if *offset != 0 {
                let _ = write!(out, "+{offset}");
            }
            out.push(']');
        }
        Opnd::List(items) => {
            out.push('{');
            for (j, it) in items.iter().enumerate() {
                if j > 0 {
                    out.push_str(", ");
                }
                operand(k, it, out);
            }
            out.push('}');
        }
        Opnd::Label(pc) => {
            let _ = write!(out, "$ptxd_L{pc}");
        }
        Opnd::Sym(name) => out.push_str(name),
        Opnd::Sink => out.push('_'),
    }
}

fn instruction(k: &Kernel, inst: &Inst, out: &mut String) {
    out.push('\t');
    if let Some((neg, p)) = inst.guard {
        let _ = write!(out, "@{}{} ", if neg { "!" } else { "" }, reg(p));
    }
    out.push_str(&inst.opcode);
    for (j, o) in inst.ops.iter().enumerate() {
        out.push_str(if j == 0 { " " } else { ", " });
        operand(k, o, out);
    }
    out.push_str(";\n");
}

fn labels_of(o: &Opnd, into: &mut BTreeSet<u32>) {
    match o {
        Opnd::Label(pc) => {
            into.insert(*pc);
        }
        Opnd::List(items) => items.iter().for_each(|it| labels_of(it, into)),
        _ => {}
    }
}

/// Prints `k` as a complete PTX module holding only that entry.
pub fn print(k: &Kernel) -> String {
    let mut out = String::with_capacity(64 * k.insts.len() + 512);
    out.push_str("//\n// Canonical PTX printed by ptxd from its verified IR.\n//\n\n");
    // `canonicalize` refuses a module without both; printing what is there
    // keeps `parse(print(k))` faithful for any module.
    if let Some(v) = &k.version {
        let _ = writeln!(out, ".version {v}");
    }
    // Every option, as the client wrote it (`debug` is gone by now: see
    // `without_debug_target`).
    if !k.target.is_empty() {
        let _ = writeln!(out, ".target {}", k.target.join(", "));
    }
    out.push_str(".address_size 64\n\n");
    let _ = write!(out, ".visible .entry {}(", k.name);
    for (j, p) in k.params.iter().enumerate() {
        out.push_str(if j == 0 { "\n\t" } else { ",\n\t" });
        let index = u16::try_from(j).unwrap_or(u16::MAX);
        let _ = write!(out, ".param .{} {}", p.ty, param_name(k, index));
        if let Some(n) = p.array {
            let _ = write!(out, "[{n}]");
        }
    }
    out.push_str("\n)\n");
    if let Some([x, y, z]) = k.reqntid {
        let _ = writeln!(out, ".reqntid {x}, {y}, {z}");
    }
    if let Some([x, y, z]) = k.maxntid {
        let _ = writeln!(out, ".maxntid {x}, {y}, {z}");
    }
    if let Some(n) = k.minnctapersm {
        let _ = writeln!(out, ".minnctapersm {n}");
    }
    if let Some(n) = k.maxnreg {
        let _ = writeln!(out, ".maxnreg {n}");
    }
    out.push_str("{\n");
    for (id, ty) in k.reg_type_names.iter().enumerate() {
        let _ = writeln!(out, "\t.reg .{ty} %r{id};");
    }
    let mut targets = BTreeSet::new();
    for inst in &k.insts {
        inst.ops.iter().for_each(|o| labels_of(o, &mut targets));
    }
    for (pc, inst) in k.insts.iter().enumerate() {
        let pc = u32::try_from(pc).unwrap_or(u32::MAX);
        if targets.contains(&pc) {
            let _ = writeln!(out, "$ptxd_L{pc}:");
        }
        if k.nounroll.contains(&(pc as usize)) {
            let _ = writeln!(out, "\t{};", super::parse::NOUNROLL);
        }
        instruction(k, inst, &mut out);
    }
    out.push_str("}\n");
    out
}

/// Float types of `add`/`sub`/`mul` whose rounding can be pinned.
const FLOAT_ARITH_TYPES: [&str; 6] = ["f32", "f64", "f16", "f16x2", "bf16", "bf16x2"];

/// Rounding modifiers of float arithmetic.
const ROUNDINGS: [&str; 4] = ["rn", "rz", "rm", "rp"];

/// `k` without a `debug` target option, computing what it computed with
/// it: a `debug` target makes ptxas compile without contracting `mul` and
/// `add` into `fma`, and the canonical text cannot keep the option (ptxas
/// then wants debug sections, which ptxd never prints), so every float
/// `add`/`sub`/`mul` without a rounding modifier gets `.rn`: the same
/// rounding (round to nearest even is the default), and an instruction
/// with an explicit rounding is never contracted. A kernel without `debug`
/// is returned unchanged.
pub fn without_debug_target(mut k: Kernel) -> Kernel {
    if !k.target.iter().any(|t| t == "debug") {
        return k;
    }
    k.target.retain(|t| t != "debug");
    for inst in &mut k.insts {
        let arith = matches!(inst.base.as_str(), "add" | "sub" | "mul");
        let float = inst
            .mods
            .iter()
            .any(|m| FLOAT_ARITH_TYPES.contains(&m.as_str()));
        let rounded = inst.mods.iter().any(|m| ROUNDINGS.contains(&m.as_str()));
        if arith && float && !rounded {
            inst.mods.insert(0, "rn".to_string());
            inst.opcode = std::iter::once(inst.base.as_str())
                .chain(inst.mods.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(".");
        }
    }
    k
}

/// Whether `t` is a `.target` entry ptxd prints back unchanged: an
/// architecture, or an option whose meaning is known (`debug`, printed as
/// pinned roundings by [`without_debug_target`]; the texture modes change
/// nothing a kernel without textures can reach, but are kept all the same).
/// `map_f64_to_f32` is not: it tells the compiler to run every `.f64`
/// instruction at `.f32`, so the GPU would compute something other than
/// what was verified and what the host engine computes (refused).
pub fn known_target(t: &str) -> bool {
    let arch = |p: &str| {
        t.strip_prefix(p).is_some_and(|rest| {
            let digits = rest.trim_end_matches(['a', 'f']);
            !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && rest.len() <= digits.len() + 1
        })
    };
    arch("sm_") || matches!(t, "debug" | "texmode_unified" | "texmode_independent")
}

/// Whether `a` and `b` are the same program: equal in everything but source
/// lines, register names and param names (which printing renames).
pub fn same_program(a: &Kernel, b: &Kernel) -> bool {
    let strip = |k: &Kernel| {
        let mut k = k.clone();
        k.line = 0;
        k.reg_names.clear();
        k.vars.clear();
        // Refused by `canonicalize` before it prints; never printed.
        k.unkept.clear();
        k.address_size = Some(64);
        for (j, p) in k.params.iter_mut().enumerate() {
            p.line = 0;
            p.name = j.to_string();
        }
        for inst in &mut k.insts {
            inst.line = 0;
        }
        k
    };
    strip(a) == strip(b)
}
