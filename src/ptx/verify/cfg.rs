//! The control-flow graph: basic blocks, branch edges, the worklist that
//! runs the dataflow to a fixpoint over them, and reachability.
//!
//! Invariants: a block ends after every `bra`/`ret`/`exit` and starts at
//! every branch target, so a branch is always a block's last instruction and
//! its edges are the only ones besides fall-through. A branch on a bounds
//! guard gives each edge the guard fact that outcome implies. Every block
//! the analysis does not reach holds only `ret`/`exit`, so nothing
//! unchecked could run if ptxd's idea of the control flow were wrong.
//!
//! Cost: the per-block states share structure (`regs.rs`), so memory is the
//! registers the instructions write, not blocks × registers. The work (each
//! instruction interpreted, each register-file node a join visits, each
//! block visited) is bounded linearly in the kernel's size ([`work_budget`])
//! and the visits to 16 per block; past either the kernel is refused as
//! `too_complex`, so no kernel can stall the front. A kernel a compiler
//! emits settles in a few passes and uses a small part of the budget (see
//! BENCHMARKS.md, "Verification cost").

use std::collections::BTreeMap;

use crate::ptx::ir::{Kernel, Opnd};
use crate::ptx::{Families, PtxError};

use super::dataflow::{guard_fact, predicated, step, Event, State, V};
use super::regs::{JoinMemo, Regs};
use super::{refuse, SubReason};

/// Work allowed per instruction, block and register (in instructions
/// interpreted plus register-file nodes visited by joins). A compiler's
/// kernel uses at most a few units per instruction (BENCHMARKS.md); a
/// kernel built so that many joins meet states differing in many
/// registers runs out and is refused.
const WORK_PER_ITEM: usize = 128;

/// The work an analysis of `k` over `blocks` blocks may do: linear in the
/// kernel's size, with a floor for small kernels.
pub(super) fn work_budget(k: &Kernel, blocks: usize) -> usize {
    k.insts
        .len()
        .saturating_add(blocks)
        .saturating_add(k.reg_types.len())
        .saturating_mul(WORK_PER_ITEM)
        .saturating_add(1 << 16)
}

/// The refusal for a kernel whose analysis ran past its budget.
pub(super) fn too_complex(k: &Kernel, why: &str) -> PtxError {
    refuse(SubReason::TooComplex, None, Some(k.line), why)
}

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
pub(super) fn dataflow(k: &Kernel, families: Families) -> Result<BTreeMap<usize, Event>, PtxError> {
    dataflow_within(k, work_budget, families)
}

/// [`dataflow`] within the work `budget` gives for the kernel and its
/// number of blocks.
fn dataflow_within(
    k: &Kernel,
    budget: fn(&Kernel, usize) -> usize,
    families: Families,
) -> Result<BTreeMap<usize, Event>, PtxError> {
    let blocks = blocks(k)?;
    let budget = budget(k, blocks.len());
    let nregs = k.reg_types.len();
    let block_of_pc = |pc: usize| blocks.partition_point(|(s, _)| *s <= pc).checked_sub(1);
    let mut entry: Vec<Option<State>> = vec![None; blocks.len()];
    if !blocks.is_empty() {
        entry[0] = Some(State {
            regs: Regs::new(nregs, V::Top),
            guarded: None,
        });
    }
    let mut work: Vec<usize> = vec![0];
    let mut visits = 0usize;
    let limit = blocks.len().saturating_mul(16).saturating_add(64);
    let mut spent = 0usize;
    let mut memo = JoinMemo::new();
    let mut scratch = BTreeMap::new();
    while let Some(b) = work.pop() {
        visits += 1;
        if visits > limit {
            return Err(too_complex(k, "the control flow did not settle"));
        }
        let Some(mut st) = entry.get(b).cloned().flatten() else {
            continue;
        };
        let (s, e) = blocks[b];
        spent = spent.saturating_add(e - s + 1);
        let outs = run_block(k, s, e, &mut st, &mut scratch, families);
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
                    if cur.join(&out, &mut memo) {
                        work.push(t);
                    }
                }
            }
        }
        if spent.saturating_add(memo.work) > budget {
            return Err(too_complex(k, "the kernel is too large to analyse"));
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
            run_block(k, *s, *e, &mut st, &mut events, families);
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
    families: Families,
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
            _ if inst.guard.is_some() => predicated(k, pc, inst, st, events, families),
            _ => step(k, pc, inst, st, events, families),
        }
    }
    vec![(e, st.clone())]
}

#[cfg(test)]
mod tests {
    use super::{dataflow_within, work_budget};
    use crate::ptx::PtxError;

    /// A replicated guarded body (32 copies, each a block joining its
    /// guard's two edges).
    fn replicated() -> String {
        let mut s = String::from(
            ".version 8.3\n.target sm_90\n.address_size 64\n.visible .entry k(\n\t.param .u64 k_in0,\n\t.param .u64 k_out,\n\t.param .u64 k_n\n)\n{\n\t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<200>;\n\t.reg .f32 %f<40>;\n\tld.param.u64 %rd1, [k_in0];\n\tld.param.u64 %rd2, [k_out];\n\tld.param.u64 %rd3, [k_n];\n\tmov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd4, %r1, %r2;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd5, %r3;\n\tadd.s64 %rd6, %rd4, %rd5;\n\tsetp.ge.s64 %p1, %rd6, %rd3;\n",
        );
        for c in 0..32 {
            let r = 10 + 4 * c;
            s += &format!(
                "\t@%p1 bra L{c};\n\tshl.b64 %rd{r}, %rd6, 2;\n\tadd.s64 %rd{}, %rd1, %rd{r};\n\tld.global.f32 %f{c}, [%rd{}];\n\tadd.s64 %rd{}, %rd2, %rd{r};\n\tst.global.f32 [%rd{}], %f{c};\nL{c}:\n",
                r + 1,
                r + 1,
                r + 2,
                r + 2
            );
        }
        s + "\tret;\n}\n"
    }

    /// The budget is what bounds the analysis: the kernel settles well
    /// inside the real one, using a few units per instruction, and a
    /// budget just below the work it needs refuses it `too_complex`.
    #[test]
    fn the_work_budget_bounds_the_analysis() {
        let k = crate::ptx::lower(&replicated(), "k").unwrap_or_else(|e| panic!("{e}"));
        assert!(dataflow_within(&k, work_budget, crate::ptx::Families::SCALAR).is_ok());
        // A fixed budget, through the `fn` the analysis takes.
        thread_local!(static BUDGET: std::cell::Cell<usize> = const { std::cell::Cell::new(0) });
        let within = |b: usize| {
            BUDGET.with(|c| c.set(b));
            dataflow_within(
                &k,
                |_, _| BUDGET.with(|c| c.get()),
                crate::ptx::Families::SCALAR,
            )
        };
        // The least budget that lets it settle, by bisection.
        let (mut lo, mut hi) = (0usize, work_budget(&k, 1));
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if within(mid).is_ok() {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let needed = hi;
        // At least one visit of every block, and linear: a few units per
        // instruction, far inside the real budget.
        let once = k.insts.len() + super::blocks(&k).map_or(0, |b| b.len());
        assert!(needed >= once, "{needed} for {once}");
        assert!(needed < 8 * k.insts.len(), "{needed} for {}", k.insts.len());
        match within(needed - 1) {
            Err(PtxError::NonScalarAbi { sub_reason, .. }) => assert_eq!(sub_reason, "too_complex"),
            other => panic!("{other:?}"),
        }
    }
}
