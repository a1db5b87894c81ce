//! Defined before use: a must-define analysis over the control-flow graph.
//!
//! A GPU register holds whatever the previous kernel on that SM left in it
//! until this kernel writes it, so a read before a write can return another
//! tenant's data. Every register an instruction reads (a source, an address
//! base, a guard, a part of a vector or pair) must be written on every path
//! from the entry to that read; otherwise the kernel is refused
//! (`undefined_register`), naming the register and the line.
//!
//! Invariants:
//! - A predicated write (`@%p mov ..`) defines nothing: it may not run. Only
//!   an unpredicated instruction's destinations (a register, both halves of
//!   a `%p|%q` pair, every register of a `{..}` list) become defined.
//! - Joins intersect: a register is defined at a block's entry only when it
//!   is defined at the end of every reachable predecessor, so "defined" at a
//!   read means written on every path to it.
//! - The state is one bit per register per block, in a register file whose
//!   copies share structure (`regs.rs`, words of 64 bits), so the states
//!   hold only the words the blocks change. The fixpoint only ever clears
//!   bits, and its work (instructions interpreted, nodes visited by meets)
//!   is bounded by the same linear budget as the dataflow
//!   (`cfg::work_budget`), past which the kernel is `too_complex`.

use crate::ptx::ir::{Base, Inst, Kernel, Opnd};
use crate::ptx::PtxError;

use super::cfg::{blocks, too_complex, work_budget};
use super::instructions::destinations;
use super::regs::{JoinMemo, Regs};
use super::{refuse, SubReason};

/// One bit per register: set when the register is written on every path.
#[derive(Clone)]
struct Defined(Regs<u64>);

impl Defined {
    fn none(nregs: usize) -> Defined {
        Defined(Regs::new(nregs.div_ceil(64), 0))
    }

    fn has(&self, r: u32) -> bool {
        let r = r as usize;
        self.0.get(r / 64).is_some_and(|w| w >> (r % 64) & 1 == 1)
    }

    fn add(&mut self, r: u32) {
        let r = r as usize;
        if let Some(w) = self.0.get(r / 64) {
            self.0.set(r / 64, w | 1 << (r % 64));
        }
    }

    /// Keeps only what `other` has too; whether anything changed. `memo`
    /// counts the nodes visited.
    fn meet(&mut self, other: &Defined, memo: &mut JoinMemo<u64>) -> bool {
        self.0.join_with(&other.0, |a, b| a & b, memo)
    }
}

/// Every register `o` reads when it is a source.
fn reads_of(o: &Opnd, into: &mut Vec<u32>) {
    match o {
        Opnd::Reg(r) | Opnd::Not(r) => into.push(*r),
        Opnd::Pair(a, b) => into.extend([*a, *b]),
        Opnd::Addr {
            base: Base::Reg(r), ..
        } => into.push(*r),
        Opnd::List(items) => items.iter().for_each(|it| reads_of(it, into)),
        Opnd::Addr { .. }
        | Opnd::Sreg(_)
        | Opnd::Imm(_)
        | Opnd::Label(_)
        | Opnd::Sym(_)
        | Opnd::Sink => {}
    }
}

/// The registers `inst` reads: its guard, and every operand but a
/// destination (stores and control flow have none).
fn reads(inst: &Inst) -> Vec<u32> {
    let mut out = Vec::new();
    if let Some((_, p)) = inst.guard {
        out.push(p);
    }
    let has_destination = !matches!(inst.base.as_str(), "st" | "bra" | "ret" | "exit");
    let sources = if has_destination {
        inst.ops.get(1..).unwrap_or(&[])
    } else {
        &inst.ops[..]
    };
    for o in sources {
        reads_of(o, &mut out);
    }
    out
}

/// Runs `inst` on `d`; the first register it reads undefined, if any.
fn step(inst: &Inst, d: &mut Defined) -> Option<u32> {
    let undefined = reads(inst).into_iter().find(|r| !d.has(*r));
    if inst.guard.is_none() {
        destinations(inst).into_iter().for_each(|r| d.add(r));
    }
    undefined
}

/// Refuses the kernel when some register is read before it is written on
/// some path; reports the read first in program order.
pub(super) fn check(k: &Kernel) -> Result<(), PtxError> {
    let blocks = blocks(k)?;
    if blocks.is_empty() {
        return Ok(());
    }
    let nregs = k.reg_types.len();
    let block_of_pc = |pc: usize| blocks.partition_point(|(s, _)| *s <= pc).checked_sub(1);
    let mut entry: Vec<Option<Defined>> = vec![None; blocks.len()];
    entry[0] = Some(Defined::none(nregs));
    let mut work = vec![0usize];
    let budget = work_budget(k, blocks.len());
    let mut spent = 0usize;
    let mut memo = JoinMemo::new();
    while let Some(b) = work.pop() {
        if spent.saturating_add(memo.work) > budget {
            return Err(too_complex(k, "the kernel is too large to analyse"));
        }
        let Some(mut d) = entry[b].clone() else {
            continue;
        };
        let (s, e) = blocks[b];
        spent = spent.saturating_add(e - s + 1);
        for inst in &k.insts[s..e] {
            step(inst, &mut d);
        }
        for t in successors(k, s, e) {
            let Some(t) = block_of_pc(t).filter(|_| t < k.insts.len()) else {
                continue;
            };
            match &mut entry[t] {
                slot @ None => {
                    *slot = Some(d.clone());
                    work.push(t);
                }
                Some(cur) => {
                    if cur.meet(&d, &mut memo) {
                        work.push(t);
                    }
                }
            }
        }
    }
    let mut first: Option<(usize, u32)> = None;
    for (b, (s, e)) in blocks.iter().enumerate() {
        let Some(mut d) = entry[b].clone() else {
            continue;
        };
        for pc in *s..*e {
            if let Some(r) = step(&k.insts[pc], &mut d) {
                if first.is_none_or(|(f, _)| pc < f) {
                    first = Some((pc, r));
                }
                break;
            }
        }
    }
    match first {
        None => Ok(()),
        Some((pc, r)) => {
            let inst = &k.insts[pc];
            let name = k.reg_names.get(r as usize).map_or("?", String::as_str);
            Err(refuse(
                SubReason::UndefinedRegister,
                None,
                Some(inst.line),
                format!(
                    "`{}` reads `{name}`, which is not written on every path to it \
                     (an unwritten register holds what the last kernel left)",
                    inst.opcode
                ),
            ))
        }
    }
}

/// The pcs control reaches after block `[s, e)`.
fn successors(k: &Kernel, s: usize, e: usize) -> Vec<usize> {
    let Some(last) = k.insts.get(e.saturating_sub(1)).filter(|_| e > s) else {
        return Vec::new();
    };
    match last.base.as_str() {
        "bra" => {
            let target = match last.ops.first() {
                Some(Opnd::Label(t)) => Some(*t as usize),
                _ => None,
            };
            let fall = last.guard.is_some().then_some(e);
            target.into_iter().chain(fall).collect()
        }
        "ret" | "exit" if last.guard.is_none() => Vec::new(),
        _ => vec![e],
    }
}
