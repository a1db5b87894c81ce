//! Inlining of `.func` calls into the entry before it is lowered, so that
//! the verifier proves (and the canonical text and the host engine run) one
//! call-free body: what a callee does is proved exactly as if the caller had
//! written it, under the caller's abstract state at the call.
//!
//! A call is inlined when it is a direct, unpredicated `call`/`call.uni` to a
//! `.func` defined (with a body) in the same module, its arguments and
//! return values are `.param` variables declared before it, each of the
//! callee's params' size and passed whole by value (`st.param`/`ld.param`
//! at offset 0 of the param's width; a param is a scalar or a 2-, 4- or
//! 8-byte `.b8` array, as NVRTC passes `__half` and `__nv_bfloat16`; a
//! return may also be a `.b8` struct of at most [`MAX_STRUCT_RETURN`]
//! bytes, as double `sin`'s slow path returns `{double, int}`, which
//! becomes one register per field: every `st.param` of the callee and
//! `ld.param` of the caller at its offset must lie inside the struct,
//! aligned to its width, each field at one width and disjoint from the
//! others, and the caller only reads it; a field the callee does not
//! write on some path is a register never written there, which the
//! verifier refuses, `undefined_register`). The call's `.param` variables become registers
//! (`st.param.T [p+0], x` is `mov.T %arg, x`; the callee's
//! `ld.param.T d, [f_param_0]` is `mov.T d, %arg`), the callee's body is
//! placed in a `{ }` scope (its registers shadow the caller's), its labels
//! are renamed apart and each `ret` branches to the end of that scope.
//!
//! Refused, each naming the call's or the callee's line:
//! - `call_indirect`: a call through a register, with a prototype or a
//!   target list, or to a name that is no function of the module;
//! - `call_extern`: a call to a function declared without a body here;
//! - `call_recursion`: a function that calls itself, directly or not;
//! - `call_arguments`: arity or size mismatches, arrays and `.reg` params,
//!   a struct return's access outside it, misaligned or overlapping
//!   another field, or written by the caller,
//!   a callee reading a param it was not passed (or not a param of its
//!   own), any other use of a param's address, a callee naming a register
//!   it does not declare (after inlining it would read the caller's);
//! - `call`: a predicated or malformed call;
//! - `too_complex`: more than [`MAX_CALL_DEPTH`] nested calls or more than
//!   [`MAX_INLINED_STATEMENTS`] statements after inlining.
//!
//! A callee's `.local` frame goes with its body (its scope's names are
//! renamed apart by `frame::flatten_scopes`) and is proved like the
//! entry's by [`promote_frame`].
//!
//! Invariant: the body this returns has no `call`, and every register a
//! callee's statements name is one the callee declares.

use std::collections::{HashMap, HashSet};

use super::parse::{AddrBase, Function, Instr, Module, Operand, Param, Stmt};
use super::{PtxError, SubReason};

mod carry;
mod frame;
pub use frame::{MAX_INDEXED_FRAME, MAX_SLOTS};

/// The deepest chain of calls inlined.
pub const MAX_CALL_DEPTH: usize = 16;
/// The largest `.local` frame [`promote_frame`] promotes, in bytes (so at
/// most 512 slots, each checked against the others).
pub const MAX_PROMOTED_FRAME: u64 = 1024;
/// The most statements inlined callees may add to one entry.
pub const MAX_INLINED_STATEMENTS: usize = 100_000;

fn refuse(sub: SubReason, line: u32, explanation: impl Into<String>) -> PtxError {
    PtxError::NonScalarAbi {
        sub_reason: sub.as_str(),
        param: None,
        line: Some(line),
        explanation: explanation.into(),
    }
}

fn is_call(s: &Stmt) -> bool {
    matches!(s, Stmt::Instr(i) if i.opcode == "call" || i.opcode.starts_with("call."))
}

/// Inlines every call of entry `symbol` in `module`. A module whose entry
/// makes no call is left as it is; a missing entry is for `ir::lower` to
/// report.
pub fn inline_calls(module: &mut Module, symbol: &str) -> Result<(), PtxError> {
    let Some(at) = module
        .functions
        .iter()
        .position(|f| f.is_entry && f.name == symbol)
    else {
        return Ok(());
    };
    let Some(body) = module.functions[at].body.as_ref() else {
        return Ok(());
    };
    if !body.iter().any(is_call) {
        return Ok(());
    }
    carry::check_not_across_calls(body, symbol)?;
    let mut inliner = Inliner {
        module,
        stack: vec![symbol.to_string()],
        next: 0,
        added: 0,
    };
    let out = inliner.body(body)?;
    module.functions[at].body = Some(out);
    Ok(())
}

struct Inliner<'m> {
    module: &'m Module,
    /// The functions being inlined, outermost first.
    stack: Vec<String>,
    /// The next fresh name's number.
    next: u32,
    /// Statements added so far.
    added: usize,
}

/// A call's parts: return `.param`s, callee, argument `.param`s.
struct Call<'i> {
    rets: Vec<&'i str>,
    callee: &'i str,
    args: Vec<&'i str>,
}

fn call_parts(i: &Instr) -> Result<Call<'_>, PtxError> {
    if i.opcode != "call" && i.opcode != "call.uni" {
        return Err(refuse(
            SubReason::Call,
            i.line,
            format!("`{}` is not a plain call", i.opcode),
        ));
    }
    if i.guard.is_some() {
        return Err(refuse(SubReason::Call, i.line, "a predicated call"));
    }
    let names = |l| param_names(l, i.line);
    let ops = &i.operands;
    let (rets, at) = match ops.first() {
        Some(Operand::List(l)) => (names(l)?, 1),
        _ => (Vec::new(), 0),
    };
    let callee = match ops.get(at) {
        Some(Operand::Name(n)) => n.as_str(),
        _ => return Err(refuse(SubReason::Call, i.line, "a call names no function")),
    };
    let args = match ops.get(at + 1) {
        Some(Operand::List(l)) => names(l)?,
        None => Vec::new(),
        Some(_) => {
            return Err(refuse(
                SubReason::CallIndirect,
                i.line,
                "a call with a prototype or a target list is indirect",
            ))
        }
    };
    if ops.len() > at + 2 {
        return Err(refuse(
            SubReason::CallIndirect,
            i.line,
            "a call with a prototype or a target list is indirect",
        ));
    }
    Ok(Call { rets, callee, args })
}

fn param_names(l: &[Operand], line: u32) -> Result<Vec<&str>, PtxError> {
    l.iter()
        .map(|o| match o {
            Operand::Name(n) => Ok(n.as_str()),
            _ => Err(refuse(
                SubReason::CallArguments,
                line,
                "a call's argument is not a .param variable",
            )),
        })
        .collect()
}

/// `ld.param.T` / `st.param.T`: (is a store, `T`), or `None` for any other
/// instruction.
fn param_access(i: &Instr) -> Option<(bool, &str)> {
    let mut parts = i.opcode.split('.');
    let store = match parts.next()? {
        "ld" => false,
        "st" => true,
        _ => return None,
    };
    if parts.next()? != "param" {
        return None;
    }
    Some((store, i.opcode.rsplit('.').next()?))
}

/// The name an `ld.param`/`st.param` addresses, with its offset.
fn param_address(i: &Instr, store: bool) -> Option<(&str, i64)> {
    let addr = if store {
        i.operands.first()
    } else {
        i.operands.get(1)
    };
    match addr {
        Some(Operand::Addr {
            base: AddrBase::Name(n),
            offset,
        }) => Some((n.as_str(), *offset)),
        _ => None,
    }
}

fn type_bytes(ty: &str) -> u32 {
    super::ir::Ty::from_name(ty).map_or(0, super::ir::Ty::bytes)
}

/// The register type that holds `p` whole: its own scalar type, or `.bN`
/// for a 2-, 4- or 8-byte `.b8` array (how NVRTC passes `__half`,
/// `__nv_bfloat16` and other small structs); `None` for anything else.
fn register_type(p: &Param) -> Option<String> {
    if p.is_reg {
        return None;
    }
    match p.array {
        None if type_bytes(&p.ty) > 0 => Some(p.ty.clone()),
        Some(n @ (2 | 4 | 8)) if p.ty == "b8" => Some(format!("b{}", n * 8)),
        _ => None,
    }
}

/// The largest struct a callee may return (`.param .b8 r[N]`, N past 8),
/// in bytes: each field it is read or written at becomes one register.
pub const MAX_STRUCT_RETURN: u64 = 64;

/// `p`'s size when it is a struct return: a `.b8` array that
/// [`register_type`] cannot hold in one register, at most
/// [`MAX_STRUCT_RETURN`] bytes.
fn struct_size(p: &Param) -> Option<u64> {
    match p.array {
        Some(n) if !p.is_reg && p.ty == "b8" && register_type(p).is_none() => {
            (n > 0 && n <= MAX_STRUCT_RETURN).then_some(n)
        }
        _ => None,
    }
}

/// A struct return's fields: byte offset -> (width in bytes, the type the
/// field's register is declared with).
type Fields = std::collections::BTreeMap<i64, (u32, String)>;

/// Adds the scalar `ld.param.T`/`st.param.T` `i` of the struct `name`
/// (`size` bytes) to `fields`: the access must lie inside the struct,
/// aligned to its width, and be the same bytes at the same width as every
/// other access of that field or disjoint from it; else `call_arguments`
/// naming it.
fn add_field(
    fields: &mut Fields,
    i: &Instr,
    store: bool,
    name: &str,
    size: u64,
) -> Result<(), PtxError> {
    let bad = |why: String| {
        refuse(
            SubReason::CallArguments,
            i.line,
            format!("`{}` {why}", i.opcode),
        )
    };
    let ty = match i.opcode.split('.').collect::<Vec<_>>()[..] {
        [_, "param", ty] => ty,
        _ => {
            return Err(bad(format!(
                "is not a scalar access of the struct `{name}`"
            )))
        }
    };
    let value = if store {
        i.operands.get(1)
    } else {
        i.operands.first()
    };
    if i.operands.len() != 2 || matches!(value, Some(Operand::List(_)) | None) {
        return Err(bad(format!(
            "is not a scalar access of the struct `{name}`"
        )));
    }
    let Some((_, off)) = param_address(i, store) else {
        return Err(bad(format!("does not address the struct `{name}`")));
    };
    let w = type_bytes(ty);
    let inside = w > 0
        && off >= 0
        && u64::try_from(off).is_ok_and(|o| o.saturating_add(u64::from(w)) <= size);
    if !inside {
        return Err(bad(format!(
            "at byte {off} (width {w}) leaves the struct `{name}` of {size} bytes"
        )));
    }
    if off % i64::from(w) != 0 {
        return Err(bad(format!(
            "at byte {off} is not aligned to its width {w} in the struct `{name}`"
        )));
    }
    for (&o, (ow, oty)) in fields.iter_mut() {
        if (o, *ow) == (off, w) {
            if oty != ty {
                *oty = format!("b{}", w * 8);
            }
            return Ok(());
        }
        if off < o + i64::from(*ow) && o < off + i64::from(w) {
            return Err(bad(format!(
                "at byte {off} (width {w}) overlaps the field at byte {o} (width {ow}) of the struct `{name}`"
            )));
        }
    }
    fields.insert(off, (w, ty.to_string()));
    Ok(())
}

/// The fields of a call's struct return `var` (declared at `body[at]`,
/// `size` bytes): those the callee `f` writes to its return `ret` and those
/// the caller reads from `var` before `var` is declared again. The caller
/// may only read it; every access is checked by [`add_field`].
fn struct_fields(
    body: &[Stmt],
    at: usize,
    var: &str,
    f: &Function,
    ret: &str,
    size: u64,
) -> Result<Fields, PtxError> {
    let mut fields = Fields::new();
    for s in f.body.as_deref().unwrap_or_default() {
        let Stmt::Instr(i) = s else { continue };
        if let Some((store, _)) = param_access(i) {
            if param_address(i, store).is_some_and(|(n, _)| n == ret) && store {
                add_field(&mut fields, i, store, ret, size)?;
            }
        }
    }
    for s in body.iter().skip(at + 1) {
        match s {
            Stmt::Var { name, .. } if name == var => break,
            Stmt::Instr(i) => {
                if let Some((store, _)) = param_access(i) {
                    if param_address(i, store).is_some_and(|(n, _)| n == var) {
                        if store {
                            return Err(refuse(
                                SubReason::CallArguments,
                                i.line,
                                format!("`{}` writes the struct return `{var}`", i.opcode),
                            ));
                        }
                        add_field(&mut fields, i, store, var, size)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(fields)
}

/// Rewrites the access `i` of a struct's field (checked by [`add_field`])
/// as a `mov` with the field's register in `regs` (offset -> register).
fn field_move(
    i: &Instr,
    store: bool,
    ty: &str,
    regs: &HashMap<i64, String>,
) -> Result<Instr, PtxError> {
    let off = param_address(i, store).map_or(-1, |(_, o)| o);
    let Some(reg) = regs.get(&off) else {
        return Err(refuse(
            SubReason::CallArguments,
            i.line,
            format!("`{}` at byte {off} is no field of its struct", i.opcode),
        ));
    };
    Ok(move_with(i, store, ty, reg))
}

/// The `mov.{ty}` that does what the param access `i` (a load, or a store
/// when `store`) does, with register `reg` in place of the param's bytes;
/// under `i`'s guard, at `i`'s place.
fn move_with(i: &Instr, store: bool, ty: &str, reg: &str) -> Instr {
    let reg = Operand::Name(reg.to_string());
    let value = if store {
        i.operands.get(1)
    } else {
        i.operands.first()
    };
    let value = value
        .cloned()
        .unwrap_or(Operand::Imm(super::parse::Imm::Int(0)));
    Instr {
        guard: i.guard.clone(),
        opcode: format!("mov.{ty}"),
        operands: if store {
            vec![reg, value]
        } else {
            vec![value, reg]
        },
        line: i.line,
        col: i.col,
    }
}

/// Every name an operand mentions.
fn operand_names<'o>(o: &'o Operand, out: &mut Vec<&'o str>) {
    match o {
        Operand::Name(n) | Operand::Not(n) => out.push(n),
        Operand::Pair(a, b) => {
            out.push(a);
            out.push(b);
        }
        Operand::Addr {
            base: AddrBase::Name(n),
            ..
        } => out.push(n),
        Operand::List(l) => l.iter().for_each(|o| operand_names(o, out)),
        Operand::Imm(_) | Operand::Addr { .. } => {}
    }
}

/// The statements control may reach next from `body[pc]` (`labels`: each
/// label's statement): a branch's target when its label is known, and the
/// next statement when it is predicated; nothing after an unpredicated
/// `ret`/`exit`, nor after a `brx` (which neither user lets through: the
/// frame proof refuses reaching one, the verifier's table refuses it);
/// else the next statement. No index past the body's end.
fn successors(body: &[Stmt], labels: &HashMap<&str, usize>, pc: usize) -> Vec<usize> {
    let next = Some(pc + 1).filter(|n| *n < body.len());
    let Some(Stmt::Instr(i)) = body.get(pc) else {
        return next.into_iter().collect();
    };
    let mut out: Vec<usize> = match i.opcode.split('.').next().unwrap_or_default() {
        "bra" => match i.operands.first() {
            Some(Operand::Name(l)) => labels.get(l.as_str()).copied().into_iter().collect(),
            _ => Vec::new(),
        },
        "brx" | "ret" | "exit" => Vec::new(),
        _ => return next.into_iter().collect(),
    };
    if i.guard.is_some() {
        out.extend(next);
    }
    out
}

fn instr_names(i: &Instr) -> Vec<&str> {
    let mut out = Vec::new();
    if let Some((_, p)) = &i.guard {
        out.push(p.as_str());
    }
    i.operands.iter().for_each(|o| operand_names(o, &mut out));
    out
}

/// Rewrites a by-value `ld.param`/`st.param` of `name` as a `mov` with the
/// register `reg`, checking its offset and width against `param`.
fn param_move(
    i: &Instr,
    store: bool,
    ty: &str,
    reg: &str,
    param: &Param,
) -> Result<Instr, PtxError> {
    let (_, offset) = param_address(i, store).unwrap_or(("", -1));
    let whole = register_type(param).map_or(0, |t| type_bytes(&t));
    if offset != 0 || type_bytes(ty) == 0 || type_bytes(ty) != whole {
        return Err(refuse(
            SubReason::CallArguments,
            i.line,
            format!(
                "`{}` does not pass `{}` whole by value at offset 0",
                i.opcode, param.name
            ),
        ));
    }
    if i.operands.len() != 2 {
        return Err(refuse(
            SubReason::CallArguments,
            i.line,
            format!("`{}` has {} operands", i.opcode, i.operands.len()),
        ));
    }
    Ok(move_with(i, store, ty, reg))
}

impl<'m> Inliner<'m> {
    fn fresh(&mut self) -> u32 {
        self.next += 1;
        self.next
    }

    /// The function a call names, refusing extern, indirect and recursive
    /// calls.
    fn callee(&self, call: &Call<'_>, line: u32) -> Result<&'m Function, PtxError> {
        let module: &'m Module = self.module;
        let named: Vec<&Function> = module
            .functions
            .iter()
            .filter(|f| f.name == call.callee)
            .collect();
        if named.is_empty() || named.iter().any(|f| f.is_entry) {
            return Err(refuse(
                SubReason::CallIndirect,
                line,
                format!("`{}` is no .func of the module", call.callee),
            ));
        }
        let Some(f) = named.into_iter().find(|f| f.body.is_some()) else {
            return Err(refuse(
                SubReason::CallExtern,
                line,
                format!("`{}` is declared without a body here", call.callee),
            ));
        };
        if self.stack.iter().any(|s| s == call.callee) {
            return Err(refuse(
                SubReason::CallRecursion,
                line,
                format!("`{}` calls itself", call.callee),
            ));
        }
        if self.stack.len() > MAX_CALL_DEPTH {
            return Err(refuse(
                SubReason::TooComplex,
                line,
                format!("more than {MAX_CALL_DEPTH} nested calls"),
            ));
        }
        if call.args.len() != f.params.len() || call.rets.len() != f.returns.len() {
            return Err(refuse(
                SubReason::CallArguments,
                line,
                format!(
                    "`{}` takes {} params and returns {}; the call passes {} and takes {}",
                    f.name,
                    f.params.len(),
                    f.returns.len(),
                    call.args.len(),
                    call.rets.len()
                ),
            ));
        }
        if let Some(p) = f
            .params
            .iter()
            .filter(|p| register_type(p).is_none())
            .chain(
                f.returns
                    .iter()
                    .filter(|p| register_type(p).is_none() && struct_size(p).is_none()),
            )
            .next()
        {
            return Err(refuse(
                SubReason::CallArguments,
                p.line,
                format!(
                    "`{}`: only scalar .param params and 2-, 4- or 8-byte .b8 arrays are inlined (and .b8 struct returns of at most {MAX_STRUCT_RETURN} bytes)",
                    p.name
                ),
            ));
        }
        Ok(f)
    }

    /// `body` with every call inlined.
    fn body(&mut self, body: &[Stmt]) -> Result<Vec<Stmt>, PtxError> {
        // Which `.param` variables a call passes, and the callee param each
        // stands for (the most recent declaration of its name).
        let mut latest: HashMap<&str, usize> = HashMap::new();
        let mut typed: HashMap<usize, Param> = HashMap::new();
        // A struct return's `.param` variable -> the callee returning it.
        let mut returned_by: HashMap<usize, &'m Function> = HashMap::new();
        for (at, s) in body.iter().enumerate() {
            match s {
                Stmt::Var { space, name, .. } if space == "param" => {
                    latest.insert(name.as_str(), at);
                }
                Stmt::Instr(i) if is_call(s) => {
                    let call = call_parts(i)?;
                    let f = self.callee(&call, i.line)?;
                    for (name, p) in call
                        .args
                        .iter()
                        .zip(&f.params)
                        .chain(call.rets.iter().zip(&f.returns))
                    {
                        let Some(&var) = latest.get(name) else {
                            return Err(refuse(
                                SubReason::CallArguments,
                                i.line,
                                format!("`{name}` is not a .param declared before the call"),
                            ));
                        };
                        if f.returns.iter().any(|r| r.name == p.name) && struct_size(p).is_some() {
                            returned_by.insert(var, f);
                        }
                        if typed.insert(var, p.clone()).is_some() {
                            return Err(refuse(
                                SubReason::CallArguments,
                                i.line,
                                format!("`{name}` is passed twice"),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::with_capacity(body.len());
        // A call's `.param` variable -> (its register, the callee param).
        let mut regs: HashMap<&str, (String, &Param)> = HashMap::new();
        // A call's struct return variable -> its fields' registers by offset.
        let mut struct_regs: HashMap<&str, HashMap<i64, String>> = HashMap::new();
        for (at, s) in body.iter().enumerate() {
            match s {
                Stmt::Var { name, line, .. } if returned_by.contains_key(&at) => {
                    let p = &typed[&at];
                    let size = struct_size(p).unwrap_or_default();
                    let fields = struct_fields(body, at, name, returned_by[&at], &p.name, size)?;
                    let n = self.fresh();
                    let mut by_offset = HashMap::new();
                    for (off, (_, ty)) in fields {
                        let reg = format!("%__arg{n}_{off}");
                        out.push(Stmt::Reg {
                            ty,
                            name: reg.clone(),
                            count: None,
                            line: *line,
                            col: 0,
                        });
                        by_offset.insert(off, reg);
                    }
                    regs.remove(name.as_str());
                    struct_regs.insert(name.as_str(), by_offset);
                }
                Stmt::Var { name, line, .. } if typed.contains_key(&at) => {
                    let p = &typed[&at];
                    struct_regs.remove(name.as_str());
                    let reg = format!("%__arg{}", self.fresh());
                    out.push(Stmt::Reg {
                        ty: register_type(p).unwrap_or_default(),
                        name: reg.clone(),
                        count: None,
                        line: *line,
                        col: 0,
                    });
                    regs.insert(name.as_str(), (reg, p));
                }
                Stmt::Instr(i) if is_call(s) => {
                    let call = call_parts(i)?;
                    let f = self.callee(&call, i.line)?;
                    let reg_of = |n: &str| regs.get(n).map(|(r, _)| r.clone()).unwrap_or_default();
                    let params: HashMap<&str, String> = f
                        .params
                        .iter()
                        .zip(&call.args)
                        .chain(f.returns.iter().zip(&call.rets))
                        .map(|(p, a)| (p.name.as_str(), reg_of(a)))
                        .collect();
                    let fields: HashMap<&str, HashMap<i64, String>> = f
                        .returns
                        .iter()
                        .zip(&call.rets)
                        .filter_map(|(p, a)| Some((p.name.as_str(), struct_regs.get(a)?.clone())))
                        .collect();
                    let inlined = self.inline(f, &params, &fields, i.line)?;
                    out.extend(inlined);
                }
                Stmt::Instr(i) => {
                    if let Some((store, ty)) = param_access(i) {
                        if let Some((name, _)) = param_address(i, store) {
                            if let Some((reg, p)) = regs.get(name) {
                                out.push(Stmt::Instr(param_move(i, store, ty, reg, p)?));
                                continue;
                            }
                            if let Some(by_offset) = struct_regs.get(name) {
                                out.push(Stmt::Instr(field_move(i, store, ty, by_offset)?));
                                continue;
                            }
                        }
                    }
                    if let Some(n) = instr_names(i)
                        .into_iter()
                        .find(|n| regs.contains_key(n) || struct_regs.contains_key(n))
                    {
                        return Err(refuse(
                            SubReason::CallArguments,
                            i.line,
                            format!(
                                "`{}` uses the call param `{n}` other than by value",
                                i.opcode
                            ),
                        ));
                    }
                    out.push(s.clone());
                }
                _ => out.push(s.clone()),
            }
        }
        Ok(out)
    }

    /// The statements that replace a call to `f`, whose params (and return
    /// params) are the registers in `params`.
    fn inline(
        &mut self,
        f: &Function,
        params: &HashMap<&str, String>,
        fields: &HashMap<&str, HashMap<i64, String>>,
        line: u32,
    ) -> Result<Vec<Stmt>, PtxError> {
        let raw = f.body.as_deref().unwrap_or_default();
        carry::check_not_across_calls(raw, &f.name)?;
        self.stack.push(f.name.clone());
        let inner = self.body(raw);
        self.stack.pop();
        let inner = inner?;
        declared_only(self.module, f, &inner)?;
        let n = self.fresh();
        let end = format!("$__inl{n}_ret");
        let labels: HashMap<&str, String> = inner
            .iter()
            .filter_map(|s| match s {
                Stmt::Label { name, .. } => Some((name.as_str(), format!("{name}__inl{n}"))),
                _ => None,
            })
            .collect();
        let by_name: HashMap<&str, &Param> = f
            .params
            .iter()
            .chain(&f.returns)
            .map(|p| (p.name.as_str(), p))
            .collect();
        let mut out = Vec::with_capacity(inner.len() + 3);
        out.push(Stmt::Open);
        for s in &inner {
            match s {
                Stmt::Label { name, line } => out.push(Stmt::Label {
                    name: labels.get(name.as_str()).cloned().unwrap_or_default(),
                    line: *line,
                }),
                Stmt::Instr(i) if i.opcode == "ret" || i.opcode == "ret.uni" => {
                    out.push(Stmt::Instr(Instr {
                        guard: i.guard.clone(),
                        opcode: if i.guard.is_some() { "bra" } else { "bra.uni" }.into(),
                        operands: vec![Operand::Name(end.clone())],
                        line: i.line,
                        col: i.col,
                    }))
                }
                Stmt::Instr(i) => {
                    if let Some((store, ty)) = param_access(i) {
                        let name = param_address(i, store).map(|(n, _)| n);
                        let is_return = name.is_some_and(|n| f.returns.iter().any(|r| r.name == n));
                        let ok = name
                            .is_some_and(|n| params.contains_key(n) || fields.contains_key(n))
                            && (store == is_return);
                        if !ok {
                            return Err(refuse(
                                SubReason::CallArguments,
                                i.line,
                                format!(
                                    "`{}` in `{}` is not a read of a param it was passed or a write of its return",
                                    i.opcode, f.name
                                ),
                            ));
                        }
                        let name = name.unwrap_or_default();
                        if let Some(by_offset) = fields.get(name) {
                            out.push(Stmt::Instr(field_move(i, store, ty, by_offset)?));
                            continue;
                        }
                        let (Some(reg), Some(p)) = (params.get(name), by_name.get(name)) else {
                            continue;
                        };
                        out.push(Stmt::Instr(param_move(i, store, ty, reg, p)?));
                        continue;
                    }
                    let names = instr_names(i);
                    if let Some(p) = names.iter().find(|n| by_name.contains_key(*n)) {
                        return Err(refuse(
                            SubReason::CallArguments,
                            i.line,
                            format!("`{}` uses the param `{p}` other than by value", i.opcode),
                        ));
                    }
                    let mut i = i.clone();
                    for o in &mut i.operands {
                        if let Operand::Name(x) = o {
                            if let Some(l) = labels.get(x.as_str()) {
                                *x = l.clone();
                            }
                        }
                    }
                    out.push(Stmt::Instr(i));
                }
                other => out.push(other.clone()),
            }
        }
        out.push(Stmt::Label { name: end, line });
        out.push(Stmt::Close);
        self.added = self.added.saturating_add(out.len());
        if self.added > MAX_INLINED_STATEMENTS {
            return Err(refuse(
                SubReason::TooComplex,
                line,
                format!("inlining adds more than {MAX_INLINED_STATEMENTS} statements"),
            ));
        }
        Ok(out)
    }
}

/// Refuses a callee body that names a register it does not declare in a
/// scope open there: inlined, that name would resolve to the caller's.
fn declared_only(module: &Module, f: &Function, body: &[Stmt]) -> Result<(), PtxError> {
    let mut known: HashSet<&str> = f
        .params
        .iter()
        .chain(&f.returns)
        .map(|p| p.name.as_str())
        .collect();
    known.extend(module.variables.iter().map(|v| v.name.as_str()));
    known.extend(module.functions.iter().map(|f| f.name.as_str()));
    let labels: HashSet<&str> = body
        .iter()
        .filter_map(|s| match s {
            Stmt::Label { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    // Per open scope: single names, and ranges (prefix -> count).
    let mut scopes: Vec<(HashSet<&str>, HashMap<&str, u32>)> = vec![Default::default()];
    let declared = |scopes: &[(HashSet<&str>, HashMap<&str, u32>)], name: &str| {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, index) = name.split_at(name.len() - digits);
        let index: Option<u32> = index.parse().ok();
        scopes.iter().any(|(singles, ranges)| {
            singles.contains(name)
                || matches!((ranges.get(prefix), index), (Some(&n), Some(i)) if i < n)
        })
    };
    for s in body {
        match s {
            Stmt::Open => scopes.push(Default::default()),
            Stmt::Close => {
                scopes.pop();
                if scopes.is_empty() {
                    scopes.push(Default::default());
                }
            }
            Stmt::Reg { name, count, .. } => {
                if let Some(scope) = scopes.last_mut() {
                    match count {
                        Some(c) => {
                            scope.1.insert(name.as_str(), *c);
                        }
                        None => {
                            scope.0.insert(name.as_str());
                        }
                    }
                }
            }
            Stmt::Var { name, .. } => {
                if let Some(scope) = scopes.last_mut() {
                    scope.0.insert(name.as_str());
                }
            }
            Stmt::Instr(i) => {
                // Labels are renamed, params checked by the caller, and a
                // module symbol is the same one either way: every other
                // name must be a register the callee declares.
                if let Some(n) = instr_names(i)
                    .into_iter()
                    .filter(|n| !labels.contains(n) && !known.contains(n))
                    .find(|n| !super::ir::is_sreg(n) && !declared(&scopes, n))
                {
                    return Err(refuse(
                        SubReason::CallArguments,
                        i.line,
                        format!(
                            "`{}` names the register `{n}`, which it does not declare",
                            f.name
                        ),
                    ));
                }
            }
            Stmt::Label { .. } | Stmt::Unkept { .. } => {}
        }
    }
    Ok(())
}

/// Promotes entry `symbol`'s one `.local` frame to registers when every
/// use of it is provable at a glance: the frame pointer is made only by
/// `mov.u64 %SPL, frame` and `cvta.local.u64 %SP, %SPL`, used only as the
/// base of `ld`/`st` (`.local` through `%SPL`, generic through `%SP`) at
/// constant offsets, each lane inside the frame (offset + width <= size),
/// aligned to its width, and any two accesses either the same bytes at the
/// same width or disjoint. Each such slot becomes a register, each access a
/// `mov`: a read of a slot no path has written is then a read of a register
/// never written, which the verifier refuses (`undefined_register`): CUDA
/// does not zero local memory. Anything else leaves the frame for the
/// verifier to refuse (`local_memory`); an access past the frame or
/// overlapping another at a different width is refused here, naming it.
///
/// A frame this leaves (some access at a computed offset) goes to
/// `frame::lower_indexed`, which proves every access inside it on every
/// path and lowers it to registers, or refuses it naming the access.
/// Last, `carry::lower` rewrites carry chains (`add.cc`/`addc`/`madc`..)
/// as plain instructions with the carry in a predicate register.
pub fn promote_frame(module: &mut Module, symbol: &str) -> Result<(), PtxError> {
    // A scoped frame whose scopes were not renamed apart would be proved
    // with the names of different scopes conflated: left (and refused).
    if frame::flatten_frame_scopes(module, symbol) {
        promote_constant(module, symbol)?;
        frame::lower_indexed(module, symbol)?;
    }
    carry::lower(module, symbol);
    Ok(())
}

fn promote_constant(module: &mut Module, symbol: &str) -> Result<(), PtxError> {
    let Some(f) = module
        .functions
        .iter_mut()
        .find(|f| f.is_entry && f.name == symbol)
    else {
        return Ok(());
    };
    let Some(body) = f.body.as_mut() else {
        return Ok(());
    };
    let frames: Vec<(usize, &str, Option<u64>)> = body
        .iter()
        .enumerate()
        .filter_map(|(at, s)| match s {
            Stmt::Var {
                space, name, bytes, ..
            } if space == "local" => Some((at, name.as_str(), *bytes)),
            _ => None,
        })
        .collect();
    // A frame past MAX_PROMOTED_FRAME bytes is left alone (and refused):
    // below it, every offset and sum here is far from overflowing.
    let [(var_at, frame, Some(size))] = frames[..] else {
        return Ok(());
    };
    if size > MAX_PROMOTED_FRAME {
        return Ok(());
    }
    let frame = frame.to_string();
    let unpromoted = |line: u32, why: String| refuse(SubReason::LocalMemory, line, why);
    // The frame pointers: `mov.u64 %SPL, frame` and `cvta.local.u64 %SP, %SPL`.
    let (mut spl, mut sp) = (None, None);
    for s in body.iter() {
        let Stmt::Instr(i) = s else { continue };
        match (i.opcode.as_str(), &i.operands[..]) {
            ("mov.u64" | "mov.b64", [Operand::Name(d), Operand::Name(v)]) if *v == frame => {
                if spl.is_some() || i.guard.is_some() {
                    return Ok(());
                }
                spl = Some((d.clone(), i.line));
            }
            ("cvta.local.u64", [Operand::Name(d), Operand::Name(v)])
                if spl.as_ref().is_some_and(|(x, _)| x == v) =>
            {
                if sp.is_some() || i.guard.is_some() {
                    return Ok(());
                }
                sp = Some(d.clone());
            }
            _ => {}
        }
    }
    let Some((spl, _)) = spl else { return Ok(()) };
    // Every access: (statement, is a store, type, lanes, offset, width).
    let mut accesses = Vec::new();
    let mut slots: Vec<(i64, u32)> = Vec::new();
    for (at, s) in body.iter().enumerate() {
        let Stmt::Instr(i) = s else { continue };
        let names = instr_names(i);
        let mentions = |r: &str| names.contains(&r);
        if !mentions(&spl) && !sp.as_deref().is_some_and(mentions) && !mentions(&frame) {
            continue;
        }
        let parts: Vec<&str> = i.opcode.split('.').collect();
        let is_def = match &i.operands[..] {
            [Operand::Name(d), Operand::Name(v)] => {
                (i.opcode == "mov.u64" || i.opcode == "mov.b64") && *d == spl && *v == frame
                    || i.opcode == "cvta.local.u64" && Some(d) == sp.as_ref() && *v == spl
            }
            _ => false,
        };
        if is_def {
            continue;
        }
        let (store, space, lanes, ty) = match parts[..] {
            [op @ ("ld" | "st"), "local", ty] => (op == "st", true, 1, ty),
            [op @ ("ld" | "st"), "local", v @ ("v2" | "v4"), ty] => {
                (op == "st", true, if v == "v2" { 2 } else { 4 }, ty)
            }
            [op @ ("ld" | "st"), ty] => (op == "st", false, 1, ty),
            [op @ ("ld" | "st"), v @ ("v2" | "v4"), ty] => {
                (op == "st", false, if v == "v2" { 2 } else { 4 }, ty)
            }
            _ => return Ok(()),
        };
        let (addr, value) = if store {
            (i.operands.first(), i.operands.get(1))
        } else {
            (i.operands.get(1), i.operands.first())
        };
        let (
            Some(Operand::Addr {
                base: AddrBase::Name(b),
                offset,
            }),
            Some(value),
        ) = (addr, value)
        else {
            return Ok(());
        };
        // `.local` through `%SPL`, generic through `%SP`; the pointer in
        // the address only, never as the value.
        let based = if space {
            *b == spl
        } else {
            Some(b) == sp.as_ref()
        };
        let mut value_names = Vec::new();
        operand_names(value, &mut value_names);
        if !based
            || i.operands.len() != 2
            || value_names
                .iter()
                .any(|n| *n == spl || Some(*n) == sp.as_deref() || *n == frame)
        {
            return Ok(());
        }
        let w = type_bytes(ty);
        let lane_values = match value {
            Operand::List(l) if l.len() == lanes => l.clone(),
            v if lanes == 1 && !matches!(v, Operand::List(_)) => vec![v.clone()],
            _ => return Ok(()),
        };
        if w < 2 {
            return Ok(());
        }
        for k in 0..lanes {
            let off = offset.saturating_add(i64::from(w) * k as i64);
            let inside = off >= 0
                && u64::try_from(off).is_ok_and(|o| o.saturating_add(u64::from(w)) <= size);
            if !inside {
                return Err(unpromoted(
                    i.line,
                    format!(
                        "`{}` at byte {off} (width {w}) leaves the local frame `{frame}` of {size} bytes",
                        i.opcode
                    ),
                ));
            }
            // PTX aligns a `.v2`/`.v4` access to the whole vector: a frame
            // accessed otherwise is left (and refused).
            if off % i64::from(w) != 0 || (k == 0 && off % (i64::from(w) * lanes as i64) != 0) {
                return Ok(());
            }
            for &(o, ow) in &slots {
                let disjoint = off + i64::from(w) <= o || o + i64::from(ow) <= off;
                if !disjoint && (o, ow) != (off, w) {
                    return Err(unpromoted(
                        i.line,
                        format!(
                            "`{}` at byte {off} (width {w}) overlaps another access of the local frame `{frame}` at byte {o} (width {ow})",
                            i.opcode
                        ),
                    ));
                }
            }
            if !slots.contains(&(off, w)) {
                slots.push((off, w));
            }
        }
        accesses.push((at, store, ty.to_string(), lane_values, *offset, w));
    }
    let slot_name = |off: i64| format!("%__frame{off}");
    let mut rewritten: HashMap<usize, Vec<Stmt>> = HashMap::new();
    for (at, store, ty, lanes, offset, w) in accesses {
        let Stmt::Instr(i) = &body[at] else { continue };
        let movs = lanes
            .into_iter()
            .enumerate()
            .map(|(k, v)| {
                let slot = Operand::Name(slot_name(offset + i64::from(w) * k as i64));
                Stmt::Instr(Instr {
                    guard: i.guard.clone(),
                    opcode: format!("mov.{ty}"),
                    operands: if store { vec![slot, v] } else { vec![v, slot] },
                    line: i.line,
                    col: i.col,
                })
            })
            .collect();
        rewritten.insert(at, movs);
    }
    let line = match &body[var_at] {
        Stmt::Var { line, .. } => *line,
        _ => 0,
    };
    let mut out = Vec::with_capacity(body.len() + slots.len());
    for (at, s) in body.drain(..).enumerate() {
        if at == var_at {
            for &(off, w) in &slots {
                out.push(Stmt::Reg {
                    ty: format!("b{}", w * 8),
                    name: slot_name(off),
                    count: None,
                    line,
                    col: 0,
                });
            }
            continue;
        }
        match rewritten.remove(&at) {
            Some(movs) => out.extend(movs),
            None => {
                // The frame pointers' definitions go with the frame.
                if let Stmt::Instr(i) = &s {
                    let names = instr_names(i);
                    if names.contains(&frame.as_str())
                        || sp.as_deref().is_some_and(|p| names.first() == Some(&p))
                    {
                        continue;
                    }
                }
                out.push(s);
            }
        }
    }
    *body = out;
    Ok(())
}
