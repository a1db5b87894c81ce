//! Carry chains: `add.cc`/`addc`, `sub.cc`/`subc`, `mad{,c}.{lo,hi}.cc` and
//! `madc` read and write the carry flag `CC.CF`, state that no operand
//! names. Each is rewritten here into plain integer instructions with the
//! flag in an explicit predicate register `%__cyf`, so that the canonical
//! text (what the GPU and the host engine both run) has no hidden state
//! and the verifier's defined-before-use rule covers the flag: a carry
//! read on a path where no `.cc` instruction wrote it reads a register
//! never written and is refused (`undefined_register`).
//!
//! With `U` the unsigned type of the instruction's width (the sums wrap
//! the same way for `.sN`):
//! - `add.cc d, a, b`: `t = a + b`, `CF = t < a`;
//! - `addc[.cc] d, a, b`: `t = a + b`, `u = t + CF`, `CF = t < a || u < t`;
//! - `sub.cc d, a, b`: `t = a - b`, `CF = a < b` (a borrow);
//! - `subc[.cc] d, a, b`: `t = a - b`, `u = t - CF`, `CF = a < b || t < CF`;
//! - `mad.{lo,hi}.cc d, a, b, c`: `m = mul.{lo,hi}.T a, b` (at the
//!   instruction's own type, so `.s32`'s high half is the signed one),
//!   `t = m + c`, `CF = t < m`;
//! - `madc.{lo,hi}[.cc] d, a, b, c`: `m` as above, `t = m + c`,
//!   `u = t + CF`, `CF = t < m || u < t`.
//!
//! `d` is written last, so it may be any of the operands. An instruction
//! at another type, or predicated, is left as it is (and refused by the
//! verifier's table, which models no carry).

use std::collections::HashMap;

use super::super::parse::{Imm, Instr, Module, Operand, Stmt};
use super::super::{PtxError, SubReason};

/// The prefix of the registers this lowering declares.
const PREFIX: &str = "%__cy";

/// What one carry instruction is: (base op, `.lo`/`.hi` for `mad`, writes
/// the flag, reads the flag, type).
fn carry_parts(opcode: &str) -> Option<(&'static str, Option<&str>, bool, bool, &str)> {
    let parts: Vec<&str> = opcode.split('.').collect();
    let (base, half, cc, ty) = match parts[..] {
        [b @ ("add" | "sub"), "cc", ty] => (b, None, true, ty),
        [b @ ("addc" | "subc"), ty] => (b, None, false, ty),
        [b @ ("addc" | "subc"), "cc", ty] => (b, None, true, ty),
        ["mad", h @ ("lo" | "hi"), "cc", ty] => ("mad", Some(h), true, ty),
        ["madc", h @ ("lo" | "hi"), ty] => ("madc", Some(h), false, ty),
        ["madc", h @ ("lo" | "hi"), "cc", ty] => ("madc", Some(h), true, ty),
        _ => return None,
    };
    if !matches!(ty, "u32" | "s32" | "u64" | "s64") {
        return None;
    }
    let (base, reads) = match base {
        "add" => ("add", false),
        "sub" => ("sub", false),
        "addc" => ("add", true),
        "subc" => ("sub", true),
        "mad" => ("mad", false),
        _ => ("mad", true),
    };
    Some((base, half, cc, reads, ty))
}

fn name(n: &str) -> Operand {
    Operand::Name(n.to_string())
}

/// The plain instructions that do what the carry instruction `i` does.
fn expand(i: &Instr) -> Option<Vec<Instr>> {
    let (base, half, cc, reads, ty) = carry_parts(&i.opcode)?;
    if i.guard.is_some() {
        return None;
    }
    let bits = &ty[1..];
    let u = format!("u{bits}");
    let reg = |r: &str| name(&format!("{PREFIX}{r}{bits}"));
    let (t, v, m, c) = (reg("t"), reg("u"), reg("m"), reg("c"));
    let (cf, p, q) = (name("%__cyf"), name("%__cyp"), name("%__cyq"));
    let mk = |op: String, operands: Vec<Operand>| Instr {
        guard: None,
        opcode: op,
        operands,
        line: i.line,
        col: i.col,
    };
    let o = &i.operands;
    let mut out = Vec::new();
    // `x < y` into `pred`, unsigned; an immediate `x` is compared from the
    // other side (`y > x`).
    let less = |pred: &Operand, x: &Operand, y: &Operand| {
        if matches!(x, Operand::Imm(_)) {
            mk(
                format!("setp.gt.{u}"),
                vec![pred.clone(), y.clone(), x.clone()],
            )
        } else {
            mk(
                format!("setp.lt.{u}"),
                vec![pred.clone(), x.clone(), y.clone()],
            )
        }
    };
    let (d, first) = match (base, &o[..]) {
        ("add" | "sub", [d, a, b]) => {
            out.push(mk(
                format!("{base}.{u}"),
                vec![t.clone(), a.clone(), b.clone()],
            ));
            (d, a.clone())
        }
        ("mad", [d, a, b, addend]) => {
            let half = half.unwrap_or("lo");
            out.push(mk(
                format!("mul.{half}.{ty}"),
                vec![m.clone(), a.clone(), b.clone()],
            ));
            out.push(mk(
                format!("add.{u}"),
                vec![t.clone(), m.clone(), addend.clone()],
            ));
            (d, m.clone())
        }
        _ => return None,
    };
    if matches!(d, Operand::Imm(_)) {
        return None;
    }
    let b = o.get(2).cloned().unwrap_or(Operand::Imm(Imm::Int(0)));
    let result = if reads {
        out.push(mk(
            format!("selp.{u}"),
            vec![
                c.clone(),
                Operand::Imm(Imm::Int(1)),
                Operand::Imm(Imm::Int(0)),
                cf.clone(),
            ],
        ));
        let op = if base == "sub" { "sub" } else { "add" };
        out.push(mk(
            format!("{op}.{u}"),
            vec![v.clone(), t.clone(), c.clone()],
        ));
        if cc {
            if base == "sub" {
                out.push(less(&p, &first, &b));
                out.push(less(&q, &t, &c));
            } else {
                out.push(less(&p, &t, &first));
                out.push(less(&q, &v, &t));
            }
            out.push(mk("or.pred".into(), vec![cf.clone(), p.clone(), q.clone()]));
        }
        v
    } else {
        if cc {
            if base == "sub" {
                out.push(less(&cf, &first, &b));
            } else {
                out.push(less(&cf, &t, &first));
            }
        }
        t
    };
    out.push(mk(format!("mov.{u}"), vec![d.clone(), result]));
    Some(out)
}

/// Refuses a carry read in the body of `function` (before inlining) where,
/// on some path to it, no unpredicated `.cc` instruction of this body
/// wrote the flag since the function's entry or since the last `call`:
/// PTX does not preserve `CC.CF` across calls (ISA 9.7.2, extended
/// precision arithmetic), so a callee reading its caller's carry, or a
/// caller reading a carry across a call, reads an undefined flag. After
/// inlining the lowered flag is one register, which would carry the value
/// across and give that read a meaning the GPU does not; refused
/// `undefined_register`, naming the read. Only `.cc` instructions write
/// the flag (ISA 9.7.2); every other instruction leaves it.
pub fn check_not_across_calls(body: &[Stmt], function: &str) -> Result<(), PtxError> {
    let reads = |s: &Stmt| match s {
        Stmt::Instr(i) => carry_parts(&i.opcode).is_some_and(|p| p.3),
        _ => false,
    };
    if !body.iter().any(reads) {
        return Ok(());
    }
    let labels: HashMap<&str, usize> = body
        .iter()
        .enumerate()
        .filter_map(|(k, s)| match s {
            Stmt::Label { name, .. } => Some((name.as_str(), k)),
            _ => None,
        })
        .collect();
    // written[k]: on every path into `body[k]` seen so far, a `.cc`
    // instruction wrote the flag since the entry or the last call; `None`
    // while no path reaches it. Values only fall (None, true, false), so
    // the worklist ends.
    let mut written: Vec<Option<bool>> = vec![None; body.len() + 1];
    written[0] = Some(false);
    let mut work = vec![0usize];
    while let Some(k) = work.pop() {
        let Some(here) = written.get(k).copied().flatten() else {
            continue;
        };
        let after = match body.get(k) {
            Some(Stmt::Instr(i)) if i.opcode == "call" || i.opcode.starts_with("call.") => false,
            Some(Stmt::Instr(i)) => match carry_parts(&i.opcode) {
                Some((_, _, true, _, _)) if i.guard.is_none() => true,
                _ => here,
            },
            Some(_) => here,
            None => continue,
        };
        for next in super::successors(body, &labels, k) {
            let Some(slot) = written.get_mut(next) else {
                continue;
            };
            let joined = Some(slot.map_or(after, |w| w && after));
            if *slot != joined {
                *slot = joined;
                work.push(next);
            }
        }
    }
    for (k, s) in body.iter().enumerate() {
        if let Stmt::Instr(i) = s {
            if reads(s) && written[k] == Some(false) {
                return Err(PtxError::NonScalarAbi {
                    sub_reason: SubReason::UndefinedRegister.as_str(),
                    param: None,
                    line: Some(i.line),
                    explanation: format!(
                        "`{}` in `{function}` reads the carry flag, which no `.cc` instruction of `{function}` wrote since its entry or its last call on some path to it: PTX does not preserve the carry across calls",
                        i.opcode
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Rewrites every carry instruction of entry `symbol` (after inlining) as
/// plain instructions; one it cannot is left as it is.
pub fn lower(module: &mut Module, symbol: &str) {
    let Some(f) = module
        .functions
        .iter_mut()
        .find(|f| f.is_entry && f.name == symbol)
    else {
        return;
    };
    let Some(body) = f.body.as_mut() else { return };
    if !body
        .iter()
        .any(|s| matches!(s, Stmt::Instr(i) if carry_parts(&i.opcode).is_some()))
    {
        return;
    }
    // The lowering's own names must be fresh.
    let taken = body.iter().any(|s| match s {
        Stmt::Reg { name, .. } | Stmt::Var { name, .. } => name.starts_with(PREFIX),
        Stmt::Instr(i) => super::instr_names(i).iter().any(|n| n.starts_with(PREFIX)),
        _ => false,
    });
    if taken {
        return;
    }
    let mut out = Vec::with_capacity(body.len() + 64);
    let line = body.iter().find_map(|s| match s {
        Stmt::Instr(i) => Some(i.line),
        _ => None,
    });
    let line = line.unwrap_or(0);
    for bits in ["32", "64"] {
        for r in ["t", "u", "m", "c"] {
            out.push(Stmt::Reg {
                ty: format!("b{bits}"),
                name: format!("{PREFIX}{r}{bits}"),
                count: None,
                line,
                col: 0,
            });
        }
    }
    for r in ["f", "p", "q"] {
        out.push(Stmt::Reg {
            ty: "pred".into(),
            name: format!("{PREFIX}{r}"),
            count: None,
            line,
            col: 0,
        });
    }
    for s in body.drain(..) {
        match &s {
            Stmt::Instr(i) => match expand(i) {
                Some(v) => out.extend(v.into_iter().map(Stmt::Instr)),
                None => out.push(s),
            },
            _ => out.push(s),
        }
    }
    *body = out;
}
