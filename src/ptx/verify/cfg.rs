//! The control-flow graph: basic blocks, branch edges, the worklist that
//! runs the dataflow to a fixpoint over them, and reachability.
//!
//! Invariants: a block ends after every `bra`/`ret`/`exit` and starts at
//! every branch target, so a branch is always a block's last instruction and
//! its edges are the only ones besides fall-through. A branch on a bounds
//! guard gives each edge the guard fact that outcome implies. The work is
//! bounded (blocks × registers, and visits per block) and refused as
//! `too_complex` past the bound, so no kernel can stall the front. Every
//! block the analysis does not reach holds only `ret`/`exit`, so nothing
//! unchecked could run if ptxd's idea of the control flow were wrong.

use std::collections::BTreeMap;

use crate::ptx::ir::{Kernel, Opnd};
use crate::ptx::PtxError;

use super::dataflow::{guard_fact, predicated, step, Event, State, V};
use super::{refuse, SubReason};

/// Bound on the analysis state (blocks × registers) before refusing: one
/// abstract value per register per block is at most this many cells (about
/// 16 MiB), and the work at most 16 visits per block over them. With the
/// parser's token and instruction caps this keeps any kernel under the
/// artifact size limit within about 0.25 s and 64 MB (see the README).
const MAX_ANALYSIS_CELLS: usize = 1 << 19;

/// Basic blocks: `(start, end)` instruction ranges.
pub(super) fn blocks(k: &Kernel) -> Result<Vec<(usize, usize)>, PtxError> {
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
                        SubReason::UnsupportedInstruction,
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

/// Runs the abstract interpretation to a fixpoint over the blocks, refuses
/// unreachable code, and returns each instruction's event from the settled
/// states.
pub(super) fn dataflow(k: &Kernel) -> Result<BTreeMap<usize, Event>, PtxError> {
    let blocks = blocks(k)?;
    let nregs = k.reg_types.len();
    if blocks.len().saturating_mul(nregs.max(1)) > MAX_ANALYSIS_CELLS {
        return Err(refuse(
            SubReason::TooComplex,
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
                SubReason::TooComplex,
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
                SubReason::UnreachableCode,
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
