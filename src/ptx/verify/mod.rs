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
//! - A register is read only after it is written on every path from the
//!   entry (`undefined_register`): a GPU register holds what the previous
//!   kernel on that SM left there.
//! - Every operand of every instruction has a role in the typed table
//!   (`table.rs`) and the type ptxas gives that position (`operand_type`):
//!   the model never reads a text the driver's compiler would refuse or
//!   read at another width; a param access stays inside its own param
//!   (`param_out_of_range`).
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
//!
//! The result is a launch contract ([`super::contract`]): the scalar ABI's
//! footprints (`n × element size` per operand), geometry and the
//! preconditions the proof assumed. With [`super::Families`] two more
//! proofs are made (the daemon's loads make them, [`super::DAEMON_FAMILIES`]):
//! - `vectorized`: a `.v2`/`.v4` global access is one element whose size is
//!   the whole vector, at `param + i × vector size` (rule 3 lets it through,
//!   `decision.rs` holds it to one whole vector per thread, else
//!   `vectorized_access`);
//! - `index32`: `ctaid.x × ntid.x + tid.x` computed in 32 bits is exact when
//!   `grid × block <= 2^31` (every thread's value lies in `[0, grid ×
//!   block)`); widening it into the 64-bit index or `i × s` records that
//!   assumption, and the contract carries it as `index_fits_i32`. Any other
//!   32-bit arithmetic on it stays `Narrow` (`index_not_64bit`). A 32-bit
//!   count (`int n`, the last integer param) is `Count32`; compared with the
//!   exact 32-bit index it is the guard (assuming `index_fits_i32` too), and
//!   the contract adds `count_fits_i32`.
//!
//! # The rules, in the order they are checked
//!
//! Every refusal is a [`PtxError::NonScalarAbi`] whose `sub_reason` is one of
//! these; the first rule broken is the one reported. The file that checks
//! each rule is named in brackets.
//!
//! 1. Launch bounds (`layout.rs`): `.reqntid` must be `x,1,1` with
//!    `1 <= x <= 1024` (`reqntid_conflict`); `.maxntid` must be `x,1,1` with
//!    `x >= 1` (`maxntid`).
//! 2. Param layout (`layout.rs`): 64-bit integer params (the pointers, then
//!    the count), then `.f32` params, nothing else. A by-value aggregate or a
//!    param of another type (`param_type`); an integer param after a float
//!    (`extra_params`); a narrower integer param, i.e. a count that is not
//!    `long long` (`count_not_64bit`); fewer than two integer params
//!    (`missing_params`); more than [`MAX_INPUTS`] inputs or
//!    [`MAX_SCALAR_PARAMS`] floats (`param_count`).
//! 3. Instructions, without dataflow (`instructions.rs`, against the typed
//!    table in `table.rs`): `.shared`/`.local` variables and accesses
//!    (`shared_memory`, `local_memory`); a call left after inlining
//!    (`call`: `inline.rs` inlines direct calls to the module's `.func`s
//!    before lowering, refusing indirect (`call_indirect`), extern
//!    (`call_extern`) and recursive (`call_recursion`) calls and params it
//!    cannot pass by value (`call_arguments`)); an `ld`/`ldu`/`st`
//!    modifier that is no `table::Modifier`, an opcode that is no
//!    `table::Opcode` (elementwise ALU, memory or control)
//!    (`unsupported_instruction`); a predicated `.uni` branch or return
//!    (`uniform_branch`); a destination list naming one register twice
//!    (`duplicate_destination`); barriers and fences (`barrier`);
//!    `.v2`/`.v4`/`.v8` accesses (`vectorized_access`); atomics (`atomic`);
//!    `.const` loads (`const_memory`); a store to the param space
//!    (`param_misuse`); a `cvta` of a non-global address
//!    (`non_global_memory`); a named variable as an operand
//!    (`global_variable`); then the whole table: any other modifier that is
//!    no `table::Modifier` (`unsupported_instruction`), and operands that
//!    match no form of the opcode role for role (data, address, guard,
//!    target, immediate, destination) (`unmodelled_operand`); then PTX's
//!    type-checking rules: an instruction type the opcode does not take
//!    (`cvt.b64.u16`, `add.b32`), or an operand (register by its declared
//!    type, special register, immediate, `mov` part, guard, address base)
//!    whose type does not agree with its position's (`operand_type`). A
//!    `.L2::cache_hint` and its policy operand were dropped by the IR.
//! 4. Control flow (`cfg.rs`): a kernel whose analysis does not settle
//!    within work linear in its size, or within 16 visits per block
//!    (`too_complex`, also from `defined.rs`; the parser refuses a module of more than
//!    `parse::MAX_TOKENS` tokens or `parse::MAX_INSTRUCTIONS` instructions
//!    the same way, before building anything large); unreachable code
//!    holding anything but `ret`/`exit` (`unreachable_code`). (A branch to
//!    anything but a label has no form in the table: `unmodelled_operand`.)
//! 5. Dataflow (`dataflow.rs`, `arith.rs`), reported at the first
//!    instruction in program order by `decision.rs`: a param load whose
//!    bytes are not inside that param's own declared size, or a param the
//!    `dataflow::ParamSet` cannot name (`param_out_of_range`); a predicated definition
//!    of non-data (`predicated_definition`); a pointer's bits leaving as data
//!    (`pointer_escape`, or `param_misuse` for the count's); an index or guard
//!    computed in 32 bits (`index_not_64bit`); a pointer in a float
//!    instruction (`non_integer_arithmetic`); a pointer or the count used in
//!    any other way (`pointer_misuse`, `param_misuse`); an access whose
//!    address is not `param + i × s` (`non_elementwise_address`).
//! 6. The verdict (`decision.rs`): no `i < n` guard, or an access it does
//!    not dominate (`unguarded_access`); integer params after the count
//!    (`extra_params`); a second guard against another param
//!    (`param_misuse`); a store through an input, a load through the output,
//!    the count as a pointer (`pointer_misuse`); an access whose width is not
//!    its stride, or two widths through one pointer
//!    (`non_elementwise_address`); an output never stored (`no_output_store`)
//!    or an input never read (`unused_input`).
//! 7. Defined before use (`defined.rs`), on a kernel that passed every rule
//!    above: a register read (a source, an address base, a guard, a part of
//!    a vector or pair) that is not written on every path from the entry,
//!    a predicated write counting for nothing (`undefined_register`).
//! 8. The declared ABI, when the client gave one ([`verify`]): a different
//!    input or float-param count is [`PtxError::AbiMismatch`].
//!
//! The Triton family (`triton.rs`, with [`super::Families::triton`]) is a
//! proof of its own for a kernel shaped like Triton's and Inductor's
//! (`.reqntid`, a 32-bit integer param, two trailing `.u64` scratch
//! params): rules 1 and 3 as above (vectors allowed), then its own
//! dataflow (`affine.rs`: exact index forms over `ctaid.x`/`tid.x` with
//! known bits) and verdict, then rule 7. Its own refusals: a branch
//! backwards (`backward_branch`); a load or store through a scratch
//! pointer, which ptxd passes as null (`scratch_dereferenced`); an access
//! whose bytes the masks do not bound — its address no pointer param plus
//! a multiple of its mask's index, or a width past the mask's granularity
//! (`unbounded_access`); a 32-bit index form that `grid × A <= 2^31`
//! cannot make exact (`index_not_exact`). The shared ones keep their
//! meaning (`unguarded_access` for an access without a mask,
//! `pointer_misuse` for a pointer read and written or several outputs,
//! `param_misuse` for masks against different bounds). Its contract is
//! described in `triton.rs` and `docs/verifier.md`.
//!
//! The Strided family (`strided.rs`, with [`super::Families::strided`]) is
//! tried where rule 6 finds integer params after the count
//! (`extra_params`) on a kernel of 64-bit integer params then `.f32`s, and
//! its verdict is then the one reported: the count is the param the guard
//! compares `i` with, pointers before it, by-value 64-bit args after it;
//! addresses are one pointer plus an exact polynomial of `i`, `i / d`,
//! `i % d` and the args (`non_elementwise_address` otherwise; an address
//! based on an arg, or the count or a pointer in an offset, `param_misuse`
//! / `pointer_misuse`); the contract's footprints and preconditions read
//! the launch's args.
//!
//! Two more sub_reasons come from outside this module: `duplicate_label`
//! (the IR, [`super::ir`]) and `canonical_form` (in [`super`]: a module
//! without `.version` and one `.target sm_XX`, a `.target` option ptxd does
//! not know, a directive the canonical text cannot keep (`.pragma`, cluster
//! directives, `.noreturn`), or a round trip through the printer that does
//! not give back the verified program). Every sub_reason is a
//! [`SubReason`] variant; the test below checks this list names them all.

mod affine;
mod arith;
mod cfg;
mod dataflow;
mod decision;
mod defined;
mod instructions;
mod layout;
mod regs;
mod strided;
mod table;
mod triton;
mod value;

use super::ir::{self, Kernel};
pub use super::reason::SubReason;
use super::{DeclaredAbi, Families, LaunchContract, PtxError, Signature};

/// The most input pointers a scalar kernel may take.
pub const MAX_INPUTS: usize = 64;
/// The most float params a scalar kernel may take.
pub const MAX_SCALAR_PARAMS: usize = 64;

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

/// A verified kernel: its signature, each param's role, and the launch
/// contract the proof gives (see [`super::contract`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub signature: Signature,
    /// Each param's role, in kernel order. A Triton-family kernel's two
    /// trailing scratch pointers have none (the vector is two shorter):
    /// the proof shows they are never dereferenced, and the contract
    /// names them `PointerAccess::UnusedNull`.
    pub roles: Vec<Role>,
    pub contract: LaunchContract,
}

/// The one constructor of a `NonScalarAbi` refusal, shared by every pass.
fn refuse(
    sub_reason: SubReason,
    param: Option<&str>,
    line: Option<u32>,
    explanation: impl Into<String>,
) -> PtxError {
    PtxError::NonScalarAbi {
        sub_reason: sub_reason.as_str(),
        param: param.map(str::to_string),
        line,
        explanation: explanation.into(),
    }
}

/// The target of `bra` at `pc` in a family whose proof is one forward pass
/// (Triton, Strided): a label after `pc`, or the refusal that names why not.
fn forward_target(inst: &ir::Inst, pc: usize, family: &str) -> Result<usize, PtxError> {
    let Some(ir::Opnd::Label(t)) = inst.ops.first() else {
        return Err(refuse(
            SubReason::UnmodelledOperand,
            None,
            Some(inst.line),
            "a branch to anything but a label",
        ));
    };
    let t = *t as usize;
    if t <= pc {
        return Err(refuse(
            SubReason::BackwardBranch,
            None,
            Some(inst.line),
            format!(
                "a branch backwards (a loop): the {family} family is straight-line code and forward branches"
            ),
        ));
    }
    Ok(t)
}

/// Verifies `kernel` against the scalar ABI and `declared`.
pub fn verify(
    kernel: &Kernel,
    declared: Option<DeclaredAbi>,
    families: Families,
) -> Result<Verified, PtxError> {
    let (reqntid, maxntid) = layout::launch_bounds(kernel)?;
    let verified = match reqntid {
        Some(block) if families.triton && triton::shaped(kernel) => {
            instructions::structure(
                kernel,
                Families {
                    vectorized: true,
                    ..families
                },
            )?;
            let verified = triton::verify(kernel, block)?;
            defined::check(kernel)?;
            verified
        }
        _ => {
            let layout = layout::param_layout(kernel, families)?;
            instructions::structure(kernel, families)?;
            let events = cfg::dataflow(kernel, families)?;
            match decision::decide(kernel, &layout, &events, reqntid, maxntid) {
                // Integer params after the scalar ABI's count: the Strided
                // family's proof decides (its refusal is the one reported).
                Err(PtxError::NonScalarAbi { sub_reason, .. })
                    if families.strided
                        && sub_reason == SubReason::ExtraParams.as_str()
                        && strided::shaped(kernel) =>
                {
                    let verified = strided::verify(kernel)?;
                    defined::check(kernel)?;
                    verified
                }
                decided => {
                    let verified = decided?;
                    defined::check(kernel)?;
                    verified
                }
            }
        }
    };
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

#[cfg(test)]
mod tests {
    use super::SubReason;

    /// The module doc claims to list every rule: each sub_reason the
    /// verifier can return is named there.
    #[test]
    fn module_doc_names_every_sub_reason() {
        let doc: String = include_str!("mod.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let missing: Vec<&str> = SubReason::ALL
            .iter()
            .map(|r| r.as_str())
            .filter(|r| !doc.contains(&format!("`{r}`")))
            .collect();
        assert!(missing.is_empty(), "not in the module doc: {missing:?}");
    }

    /// The wire strings are distinct and snake_case, so a client can match
    /// on them.
    #[test]
    fn sub_reason_strings_are_distinct_snake_case() {
        let mut all: Vec<&str> = SubReason::ALL.iter().map(|r| r.as_str()).collect();
        assert!(all.iter().all(|s| !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')));
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), SubReason::ALL.len());
    }
}
