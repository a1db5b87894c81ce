//! Adversarial review of the Triton family (issue 21): each test is one
//! attack on `triton.rs`/`affine.rs`, built from a real corpus kernel
//! changed as little as possible, with the verdict a sound verifier must
//! give. A refusal is asserted by its exact sub_reason; an acceptance by the
//! contract, evaluated at the count where the kernel would escape, against
//! the byte the kernel touches (computed by hand in each test's comment).
//! The review found one hole, now closed: a `setp` with a `.or`/`.xor`
//! combiner was read as its bare mask (the `a_setp_*_combiner_*` tests).
//!
//! The base kernel is `triton/add_bf16_b1024_w4_div16.ptx`: `.reqntid 128`,
//! index `i = 1024·ctaid + 8·tid` (`shl 10 | (tid << 3) & 1016`), mask
//! `i < n`, address `param + 2·i`, one `.v4.b32` (8 bf16, 16 bytes) per
//! access. Its contract: `param[roundup(n, 8) × 2]` per operand.

#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::contract::LaunchContract;
use ptxd::ptx::{self, Families, PtxError};

const ENTRY: &str = "add_kernel";

fn base() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit");
    std::fs::read_to_string(root.join("triton/add_bf16_b1024_w4_div16.ptx")).unwrap()
}

/// The contract, or the refusal's sub_reason.
fn verdict(text: &str) -> Result<LaunchContract, &'static str> {
    match ptx::canonicalize_with(text, ENTRY, None, Families::ALL) {
        Ok(c) => Ok(c.contract),
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => Err(sub_reason),
        Err(e) => panic!("not a verdict: {e}"),
    }
}

/// `text` with the first `from` replaced by `to` (which must be there).
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the kernel");
    text.replacen(from, to, 1)
}

fn base_edit(from: &str, to: &str) -> String {
    edit(&base(), from, to)
}

const SETP: &str = "setp.lt.s32 \t%p1, %r19, %r15;";
const STORE: &str = "@%p1 st.global.v4.b32 [ %rd3 + 0 ]";
const LOAD0: &str = "@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];";

/// The bytes operand `param` may touch at count `n` (block 128).
fn footprint(c: &LaunchContract, param: u16, n: u64) -> u128 {
    let v = c.values(n, 128);
    assert!(
        c.preconditions.iter().all(|p| p.holds(&v)),
        "a precondition fails at n = {n}"
    );
    c.footprints
        .iter()
        .find(|f| f.param == param)
        .unwrap()
        .bytes
        .eval(&v)
        .unwrap()
}

/// The bytes thread `tid` of block `ctaid` stores through param 2 when its
/// guard holds: `[2·i, 2·i + 16)` with `i = 1024·ctaid + 8·tid`.
fn store_end(ctaid: u64, tid: u64) -> u128 {
    u128::from(2 * (1024 * ctaid + 8 * tid) + 16)
}

/// Asserts that an accepted kernel whose guard does not bound its store
/// lets thread 127 of block 0 write past the output's footprint at n = 1.
fn assert_escapes(c: &LaunchContract) {
    let granted = footprint(c, 2, 1);
    assert_eq!(granted, 16, "roundup(1, 8) × 2");
    assert!(store_end(0, 127) > granted, "2·1016 + 16 = 2048 > 16");
}

// ---- The base and the sound variants (accepted; the contract is right) ----

#[test]
fn the_base_kernel_has_the_contract_worked_by_hand() {
    let c = verdict(&base()).unwrap();
    // At n = 1000: i < 1000 with i a multiple of 8 ends at i = 992, whose
    // 16 bytes end at 2·992 + 16 = 2000 = roundup(1000, 8) × 2.
    assert_eq!(footprint(&c, 2, 1000), 2000);
    assert_eq!(footprint(&c, 0, 1001), 2 * 1008);
    assert_eq!(c.geometry.elements_per_thread, 8);
}

/// `add` where Triton wrote `or`: the bits are disjoint, so the sum is the
/// same value and the contract is unchanged.
#[test]
fn an_add_in_place_of_a_disjoint_or_keeps_the_contract() {
    let c = verdict(&base_edit(
        "or.b32 \t%r19, %r18, %r14;",
        "add.s32 \t%r19, %r18, %r14;",
    ))
    .unwrap();
    assert!(c.same_terms(&verdict(&base()).unwrap()));
}

/// `.and` with another predicate only narrows the mask: still bounded.
#[test]
fn a_setp_and_combiner_only_narrows_the_mask() {
    let t = base_edit(
        SETP,
        "setp.eq.s32 \t%p0, %r16, 0;\n\tsetp.lt.and.s32 \t%p1, %r19, %r15, %p0;",
    );
    match verdict(&t) {
        Ok(c) => assert!(c.same_terms(&verdict(&base()).unwrap())),
        Err(r) => assert_eq!(r, "unguarded_access"),
    }
}

// ---- Predicate reasoning ----

/// HOLE: `setp.lt.or.s32 %p1, i, n, %p0` is `(i < n) || %p0`; with `%p0`
/// always true every lane stores. At n = 1 (grid 1) thread 127 stores
/// bytes [2032, 2048) of the output; the contract grants 16.
#[test]
fn a_setp_or_combiner_is_no_mask() {
    let t = base_edit(
        SETP,
        "setp.ge.s32 \t%p0, %r19, 0;\n\tsetp.lt.or.s32 \t%p1, %r19, %r15, %p0;",
    );
    match verdict(&t) {
        Ok(c) => {
            assert_escapes(&c);
            panic!("accepted a store guarded by (i < n) || true");
        }
        Err(r) => assert_eq!(r, "unguarded_access"),
    }
}

/// HOLE: `.xor` with a true predicate is `i >= n`: the store runs exactly
/// where the mask fails (at n = 1: every thread but thread 0).
#[test]
fn a_setp_xor_combiner_inverts_the_mask() {
    let t = base_edit(
        SETP,
        "setp.ge.s32 \t%p0, %r19, 0;\n\tsetp.lt.xor.s32 \t%p1, %r19, %r15, %p0;",
    );
    match verdict(&t) {
        Ok(c) => {
            assert_escapes(&c);
            panic!("accepted a store guarded by i >= n");
        }
        Err(r) => assert_eq!(r, "unguarded_access"),
    }
}

/// HOLE: `.and` with a negated true predicate: `(i < n) && !%p0`, safe; but
/// `.or` with `!%p0` where `%p0` is always false is again always true.
#[test]
fn a_setp_or_with_a_negated_false_predicate_is_no_mask() {
    let t = base_edit(
        SETP,
        "setp.lt.s32 \t%p0, %r19, 0;\n\tsetp.lt.or.s32 \t%p1, %r19, %r15, !%p0;",
    );
    match verdict(&t) {
        Ok(c) => {
            assert_escapes(&c);
            panic!("accepted a store guarded by (i < n) || !(i < 0)");
        }
        Err(r) => assert_eq!(r, "unguarded_access"),
    }
}

/// The second predicate of `setp %p|%q` is `!(i < n)`: storing under it
/// stores exactly where the mask fails.
#[test]
fn the_complement_of_a_predicate_pair_is_no_mask() {
    let t = base_edit(SETP, "setp.lt.s32 \t%p1|%p0, %r19, %r15;");
    let t = edit(&t, STORE, "@%p0 st.global.v4.b32 [ %rd3 + 0 ]");
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

/// The first of the pair is the mask itself; the family does not model it
/// (completeness, not safety).
#[test]
fn the_first_of_a_predicate_pair_is_not_modelled() {
    let t = base_edit(SETP, "setp.lt.s32 \t%p1|%p0, %r19, %r15;");
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

#[test]
fn a_negated_mask_is_unguarded() {
    let t = base_edit(STORE, "@!%p1 st.global.v4.b32 [ %rd3 + 0 ]");
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

/// The mask overwritten (by an always-true compare) between setp and use.
#[test]
fn a_mask_overwritten_before_its_use_is_unguarded() {
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "add.s64 \t%rd3, %rd6, %rd7;\n\tsetp.eq.s32 \t%p1, %r19, %r19;",
    );
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

/// The mask overwritten under a predicate: it may or may not be the mask.
#[test]
fn a_mask_overwritten_under_a_predicate_is_unguarded() {
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "add.s64 \t%rd3, %rd6, %rd7;\n\tsetp.eq.s32 \t%p0, %r16, 0;\n\t@%p0 setp.eq.s32 \t%p1, %r19, %r19;",
    );
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

/// A mask defined only under a predicate: on the other lanes `%p1` holds
/// whatever the SM left there.
#[test]
fn a_mask_defined_under_a_predicate_is_undefined() {
    let t = base_edit(
        SETP,
        "setp.eq.s32 \t%p0, %r16, 0;\n\t@%p0 setp.lt.s32 \t%p1, %r19, %r15;",
    );
    assert_eq!(verdict(&t).err(), Some("undefined_register"));
}

/// A branch that skips the setp: `%p1` unwritten on that path.
#[test]
fn a_branch_that_skips_the_mask_is_undefined() {
    let t = base_edit(
        SETP,
        "setp.eq.s32 \t%p0, %r16, 0;\n\t@%p0 bra $L__skip;\n\tsetp.lt.s32 \t%p1, %r19, %r15;\n$L__skip:",
    );
    assert_eq!(verdict(&t).err(), Some("undefined_register"));
}

/// A branch that skips the setp after an always-true compare wrote `%p1`:
/// the join is no mask.
#[test]
fn a_branch_that_skips_the_mask_over_a_true_predicate_is_unguarded() {
    let t = base_edit(
        SETP,
        "setp.eq.s32 \t%p1, %r19, %r19;\n\tsetp.eq.s32 \t%p0, %r16, 0;\n\t@%p0 bra $L__skip;\n\tsetp.lt.s32 \t%p1, %r19, %r15;\n$L__skip:",
    );
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

/// No setp at all: the guard never written.
#[test]
fn an_uninitialised_predicate_is_unguarded() {
    let t = base_edit(SETP, "");
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

/// The guard on one index, the store through another (`i + 1024`): the
/// store ends at `2·(i + 1024) + 16`, past `2·roundup(n, 8)`.
#[test]
fn a_guard_on_one_index_and_a_store_through_another_is_unbounded() {
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "add.s32 \t%r0, %r19, 1024;\n\tmul.wide.s32 \t%rd7, %r0, 2;\n\tadd.s64 \t%rd3, %rd6, %rd7;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// `selp` of two pointers: the address is no pointer plus an index form.
#[test]
fn a_selp_of_addresses_is_pointer_misuse() {
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "selp.b64 \t%rd3, %rd6, %rd4, %p1;\n\tadd.s64 \t%rd3, %rd3, %rd7;",
    );
    assert_eq!(verdict(&t).err(), Some("pointer_misuse"));
}

// ---- Known bits and intervals ----

/// An `or` with the count's bits: no index form (the first access, the
/// load, is reported: its address is no pointer plus a form).
#[test]
fn an_or_with_a_param_is_no_index() {
    let t = base_edit("or.b32 \t%r19, %r18, %r14;", "or.b32 \t%r19, %r18, %r15;");
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// An `and` with the count as the mask: no index form.
#[test]
fn an_and_with_a_param_is_no_index() {
    let t = base_edit("and.b32 \t%r18, %r17, 1016;", "and.b32 \t%r18, %r17, %r15;");
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// `shl` by 32: PTX clamps the shift, the form would be wrong.
#[test]
fn a_shift_by_32_is_no_index() {
    let t = base_edit("shl.b32 \t%r14, %r13, 10;", "shl.b32 \t%r14, %r13, 32;");
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// The address's index is `i + (2^32 - 8)`, i.e. `i - 8` in 32 bits: its
/// `mul.wide.s32` is of a negative value for the first lane. The form
/// `i + 2^32 - 8` cannot be made exact.
#[test]
fn a_wide_multiply_of_a_wrapped_index_is_refused() {
    let t = base_edit(
        "mul.wide.s32 \t%rd7, %r19, 2;",
        "add.s32 \t%r0, %r19, 4294967288;\n\tmul.wide.s32 \t%rd7, %r0, 2;",
    );
    // The product's form `2·(i + 2^32 - 8)` is past a 64-bit form's bound:
    // the address is no pointer plus a form.
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// A negative immediate in the index (`i - 8`): no form.
#[test]
fn a_negative_index_immediate_is_no_index() {
    let t = base_edit(
        "mul.wide.s32 \t%rd7, %r19, 2;",
        "add.s32 \t%r0, %r19, -8;\n\tmul.wide.s32 \t%rd7, %r0, 2;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// The mask's index made `i + 2^32 - 8` (i.e. `i - 8`): the compare passes
/// lane 0 of block 0 at `i - 8 < n`, its form is not exact.
#[test]
fn a_wrapped_mask_index_is_not_exact() {
    let t = base_edit(
        SETP,
        "add.s32 \t%r0, %r19, 4294967288;\n\tsetp.lt.s32 \t%p1, %r0, %r15;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// A 32-bit multiply that wraps (`ctaid · 2^22`) is held at launch by
/// `index_fits_i32`: grid × 2^22 <= 2^31, so grid <= 512 and no product
/// reaches 2^31.
#[test]
fn a_wrapping_multiply_is_held_by_index_fits_i32() {
    let t = base_edit(
        "shl.b32 \t%r14, %r13, 10;",
        "mul.lo.s32 \t%r14, %r13, 4194304;",
    );
    let c = verdict(&t).unwrap();
    let idx = c
        .preconditions
        .iter()
        .find(|p| p.name == "index_fits_i32")
        .unwrap();
    // ept = 2^22 / 128 = 32768: grid = ceil(n / 2^22).
    assert!(idx.holds(&c.values(512 << 22, 128)));
    assert!(!idx.holds(&c.values((512 << 22) + 1, 128)));
}

/// A huge immediate address offset: no operand form takes it; one that
/// fits 32 bits is past any mask granule.
#[test]
fn a_huge_address_offset_is_refused() {
    let t = base_edit(STORE, "@%p1 st.global.v4.b32 [ %rd3 + 4294967296 ]");
    assert_eq!(verdict(&t).err(), Some("unmodelled_operand"));
    let t = base_edit(STORE, "@%p1 st.global.v4.b32 [ %rd3 + 2147483632 ]");
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "add.s64 \t%rd3, %rd6, %rd7;\n\tadd.s64 \t%rd3, %rd3, 2147483632;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

// ---- Vector accesses ----

/// 4 bf16 per thread (`tid << 2`, mask `& 508`) but a 16-byte vector: the
/// last masked lane's vector reaches 4 elements past the mask's granule.
#[test]
fn a_vector_wider_than_the_index_stride_is_unbounded() {
    let t = base_edit("shl.b32 \t%r17, %r16, 3;", "shl.b32 \t%r17, %r16, 2;");
    let t = edit(
        &t,
        "and.b32 \t%r18, %r17, 1016;",
        "and.b32 \t%r18, %r17, 508;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// A byte stride (`i × 1`) with a 16-byte vector: 16 bytes from byte `i`
/// end at `i + 16 > roundup(n, 8) × 1`.
#[test]
fn a_vector_wider_than_its_element_stride_is_unbounded() {
    let t = base_edit(
        "mul.wide.s32 \t%rd7, %r19, 2;",
        "mul.wide.s32 \t%rd7, %r19, 1;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// `.v8` is never the family's.
#[test]
fn a_v8_access_is_refused() {
    let t = base_edit(
        LOAD0,
        "@%p1 ld.global.v8.b32 { %r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8 }, [ %rd1 + 0 ];",
    );
    assert_eq!(verdict(&t).err(), Some("vectorized_access"));
}

// ---- Pointers and params ----

#[test]
fn a_store_to_an_input_is_pointer_misuse() {
    let t = base_edit("add.s64 \t%rd3, %rd6, %rd7;", "add.s64 \t%rd3, %rd4, %rd7;");
    assert_eq!(verdict(&t).err(), Some("pointer_misuse"));
}

#[test]
fn a_load_from_the_output_is_pointer_misuse() {
    let t = base_edit("add.s64 \t%rd2, %rd5, %rd7;", "add.s64 \t%rd2, %rd6, %rd7;");
    assert_eq!(verdict(&t).err(), Some("pointer_misuse"));
}

/// The output pointer copied into the second input's register: one param
/// read and written.
#[test]
fn an_aliased_pointer_register_is_pointer_misuse() {
    let t = base_edit(
        "add.s64 \t%rd2, %rd5, %rd7;",
        "mov.b64 \t%rd5, %rd6;\n\tadd.s64 \t%rd2, %rd5, %rd7;",
    );
    assert_eq!(verdict(&t).err(), Some("pointer_misuse"));
}

/// Two pointers added: no single param's footprint bounds it.
#[test]
fn a_sum_of_two_pointers_is_unbounded() {
    let t = base_edit("add.s64 \t%rd3, %rd6, %rd7;", "add.s64 \t%rd3, %rd6, %rd4;");
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// The high half of a pointer param read as a 32-bit value.
#[test]
fn a_pointer_high_half_is_out_of_range() {
    let t = base_edit(
        "ld.param.b32 \t%r15, [add_kernel_param_3];",
        "ld.param.b32 \t%r15, [add_kernel_param_0+4];",
    );
    assert_eq!(verdict(&t).err(), Some("param_out_of_range"));
}

/// A vector param load of the count: 8 bytes from a 4-byte param.
#[test]
fn a_vector_param_load_is_refused() {
    let t = base_edit(
        "ld.param.b32 \t%r15, [add_kernel_param_3];",
        "ld.param.v2.b32 \t{%r15, %r0}, [add_kernel_param_3];",
    );
    assert_eq!(verdict(&t).err(), Some("vectorized_access"));
}

/// The last scratch pointer read 8 bytes on: past the modelled params.
#[test]
fn a_param_past_the_last_is_out_of_range() {
    let t = base_edit(
        "ld.param.b64 \t%rd6, [add_kernel_param_2];",
        "ld.param.b64 \t%rd6, [add_kernel_param_5+8];",
    );
    assert_eq!(verdict(&t).err(), Some("param_out_of_range"));
}

/// The count param read as a 64-bit value (its 4 bytes and 4 more).
#[test]
fn a_wide_load_of_the_count_is_out_of_range() {
    let t = base_edit(
        "ld.param.b32 \t%r15, [add_kernel_param_3];",
        "ld.param.b64 \t%rd0, [add_kernel_param_3];\n\tcvt.u32.u64 \t%r15, %rd0;",
    );
    assert_eq!(verdict(&t).err(), Some("param_out_of_range"));
}

/// The store through a scratch pointer (passed null).
#[test]
fn a_store_through_the_second_scratch_pointer_is_refused() {
    let t = base_edit(
        "ld.param.b64 \t%rd6, [add_kernel_param_2];",
        "ld.param.b64 \t%rd6, [add_kernel_param_5];",
    );
    assert_eq!(verdict(&t).err(), Some("scratch_dereferenced"));
}

// ---- Registers and special registers ----

/// The inline asm's zeroing of the second load's destination removed: a
/// masked-off lane adds whatever `%r5` held (another tenant's data) into
/// its result; the store is masked too, but the read is still refused.
#[test]
fn a_load_destination_never_zeroed_is_undefined() {
    let t = base_edit("\tmov.u32 %r5, 0x0;\n", "");
    assert_eq!(verdict(&t).err(), Some("undefined_register"));
}

fn with_sreg(s: &str) -> Option<&'static str> {
    verdict(&base_edit(
        "mov.u32 \t%r13, %ctaid.x;",
        &format!("mov.u32 \t%r13, {s};"),
    ))
    .err()
}

#[test]
fn other_special_registers_in_the_block_index_are_no_index() {
    for s in ["%ctaid.y", "%ctaid.z", "%nctaid.x", "%laneid", "%tid.y"] {
        assert_eq!(with_sreg(s), Some("unbounded_access"), "{s}");
    }
    // `%warpid` is read by no kernel at all (w30r's special-register policy).
    assert_eq!(with_sreg("%warpid"), Some("unmodelled_operand"));
    let t = base_edit("mov.u32 \t%r16, %tid.x;", "mov.u32 \t%r16, %laneid;");
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

// ---- Memory spaces, atomics, control flow ----

#[test]
fn a_shared_store_is_refused() {
    let t = base_edit(STORE, "@%p1 st.shared.v4.b32 [ %rd3 + 0 ]");
    assert_eq!(verdict(&t).err(), Some("shared_memory"));
}

/// `.local` and generic accesses: a vector one outside `.global` is no
/// vector form of the family; a scalar one is refused for its space.
#[test]
fn a_local_load_is_refused() {
    let t = base_edit(
        LOAD0,
        "@%p1 ld.local.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];",
    );
    assert_eq!(verdict(&t).err(), Some("vectorized_access"));
    let t = base_edit(LOAD0, "@%p1 ld.local.b32 %r1, [ %rd1 + 0 ];");
    assert_eq!(verdict(&t).err(), Some("local_memory"));
}

#[test]
fn a_generic_store_is_refused() {
    // A generic vector passes the instruction table (NVRTC -G's Vectorized
    // builds use them) and the Triton pass refuses it as generic.
    let t = base_edit(STORE, "@%p1 st.v4.b32 [ %rd3 + 0 ]");
    assert_eq!(verdict(&t).err(), Some("non_global_memory"));
    let t = base_edit(
        STORE,
        "@%p1 st.b32 [ %rd3 + 0 ], %r9;\n\t@%p1 st.global.v4.b32 [ %rd3 + 0 ]",
    );
    assert_eq!(verdict(&t).err(), Some("non_global_memory"));
}

/// A load into the store's address register (guarded: on the lanes it
/// runs the address is loaded data; unguarded: on every lane).
#[test]
fn a_load_into_an_address_register_is_unbounded() {
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "add.s64 \t%rd3, %rd6, %rd7;\n\t@%p1 ld.global.b64 %rd3, [ %rd1 + 0 ];",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "add.s64 \t%rd3, %rd6, %rd7;\n\tld.global.b64 %rd3, [ %rd1 + 0 ];",
    );
    // The pass refuses the store's address before the verdict looks at
    // the unmasked load.
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

#[test]
fn an_atomic_is_refused() {
    let t = base_edit(
        STORE,
        "@%p1 atom.global.add.u32 %r9, [ %rd3 + 0 ], %r9;\n\t@%p1 st.global.v4.b32 [ %rd3 + 0 ]",
    );
    assert_eq!(verdict(&t).err(), Some("atomic"));
}

/// A backward branch over the store (a loop re-running it).
#[test]
fn a_loop_over_the_store_is_a_backward_branch() {
    let t = base_edit(STORE, "$L__again:\n\t@%p1 st.global.v4.b32 [ %rd3 + 0 ]");
    let t = edit(
        &t,
        "\tret;",
        "\tsetp.eq.s32 \t%p0, %r16, 0;\n\t@%p0 bra $L__again;\n\tret;",
    );
    assert_eq!(verdict(&t).err(), Some("backward_branch"));
}

/// A forward branch over the store (fine: fewer stores), then the store's
/// code reached again through the join: same contract.
#[test]
fn a_forward_branch_over_the_store_keeps_the_contract() {
    let t = base_edit(
        STORE,
        "setp.eq.s32 \t%p0, %r16, 0;\n\t@%p0 bra $L__end;\n\t@%p1 st.global.v4.b32 [ %rd3 + 0 ]",
    );
    let t = edit(&t, "\tret;", "$L__end:\n\tret;");
    let c = verdict(&t).unwrap();
    assert!(c.same_terms(&verdict(&base()).unwrap()));
}

/// Code after `ret` reached by a forward branch is analysed: a store there
/// through the scratch pointer is found.
#[test]
fn code_after_ret_reached_by_a_branch_is_checked() {
    let t = base_edit(
        STORE,
        "setp.eq.s32 \t%p0, %r16, 0;\n\t@%p0 bra $L__late;\n\t@%p1 st.global.v4.b32 [ %rd3 + 0 ]",
    );
    let t = edit(
        &t,
        "\tret;",
        "\tret;\n$L__late:\n\tld.param.b64 \t%rd0, [add_kernel_param_4];\n\tadd.s64 \t%rd0, %rd0, %rd7;\n\t@%p1 st.global.b32 [ %rd0 + 0 ], %r9;\n\tret;",
    );
    assert_eq!(verdict(&t).err(), Some("scratch_dereferenced"));
}

// ---- Static shapes ----

/// A literal bound read as `-1` by a signed compare: no lane passes, the
/// footprint is 0 and nothing is touched.
#[test]
fn a_negative_literal_bound_grants_nothing_and_touches_nothing() {
    let t = base_edit(SETP, "setp.lt.s32 \t%p1, %r19, 4294967295;");
    let c = verdict(&t).unwrap();
    assert_eq!(footprint(&c, 2, 1 << 20), 0);
}

/// The same literal as an unsigned compare: every lane passes, and the
/// footprint is the whole 2^32-element range.
#[test]
fn an_unsigned_huge_literal_bound_grants_its_whole_range() {
    let t = base_edit(SETP, "setp.lt.u32 \t%p1, %r19, 4294967295;");
    let c = verdict(&t).unwrap();
    // roundup(2^32 - 1, 8) × 2 = 2^33.
    assert_eq!(footprint(&c, 2, 1 << 20), 1 << 33);
}

// ---- More of the combiner class, and masks of the wrong element ----

/// HOLE, the same class on an Inductor kernel: `%p1` of
/// `triton_poi_fused_add_0` (8 scalar f32 per thread, mask `i < n` per
/// element, contract `n × 4`) made `(i < n) || true`. At n = 1 (grid 1)
/// thread 127's first store is at `4 · (1024·0 + 8·127) = 4064`, past the 4
/// bytes granted.
#[test]
fn an_inductor_setp_or_combiner_is_no_mask() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit");
    let text = std::fs::read_to_string(root.join("inductor/add_f32_dyn_0.ptx")).unwrap();
    let t = edit(
        &text,
        "setp.lt.s32 \t%p1, %r31, %r27;",
        "setp.ge.s32 \t%p1, %r31, 0;\n\tsetp.lt.or.s32 \t%p1, %r31, %r27, %p1;",
    );
    match ptx::canonicalize_with(&t, "triton_poi_fused_add_0", None, Families::ALL) {
        Ok(c) => {
            let c = c.contract;
            let out = c.footprints.last().unwrap();
            let granted = out.bytes.eval(&c.values(1, 128)).unwrap();
            assert_eq!(granted, 4, "n × 4");
            assert!(4 * (8 * 127) + 4 > granted);
            panic!("accepted a store guarded by (i < n) || true");
        }
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => {
            assert_eq!(sub_reason, "unguarded_access")
        }
        Err(e) => panic!("not a verdict: {e}"),
    }
}

/// A combiner on a predicate pair: neither half is modelled.
#[test]
fn a_setp_or_combiner_on_a_pair_is_no_mask() {
    let t = base_edit(
        SETP,
        "setp.ge.s32 \t%p0, %r19, 0;\n\tsetp.lt.or.s32 \t%p1|%p0, %r19, %r15, %p0;",
    );
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

const NODIV: &str = "triton/add_f16_b1024_w4_nodiv.ptx";

fn nodiv() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit");
    std::fs::read_to_string(root.join(NODIV)).unwrap()
}

/// The last f16 (`2i + 14`) loaded under the first element's mask `i < n`
/// instead of `i + 7 < n`: `i` is a multiple of 8, so `i < n` gives
/// `i <= roundup(n, 8) - 8` and the load ends by `2·roundup(n, 8)`: the
/// contract widens that input to `roundup(n, 8) × 2`, and at n = 1 thread 0
/// reads bytes [14, 16) of the 16 granted.
#[test]
fn a_last_element_under_the_first_mask_widens_the_footprint() {
    let t = edit(
        &nodiv(),
        "@%p8 ld.global.b16 { %rs8 }, [ %rd8 + 0 ];",
        "@%p1 ld.global.b16 { %rs8 }, [ %rd8 + 0 ];",
    );
    let c = verdict(&t).unwrap();
    let v = c.values(1, 128);
    let input0 = c.footprints.iter().find(|f| f.param == 0).unwrap();
    assert_eq!(input0.bytes.eval(&v), Some(16));
    let input1 = c.footprints.iter().find(|f| f.param == 1).unwrap();
    assert_eq!(input1.bytes.eval(&v), Some(2), "n × 2");
}

/// The last f16 under the second element's mask `i + 1 < n`: it ends at
/// `2(i + 1) + 14`, and `i + 1` is odd: no granule bounds it.
#[test]
fn a_last_element_under_the_second_mask_is_unbounded() {
    let t = edit(
        &nodiv(),
        "@%p8 ld.global.b16 { %rs8 }, [ %rd8 + 0 ];",
        "@%p2 ld.global.b16 { %rs8 }, [ %rd8 + 0 ];",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

// ---- Scopes, variables, calls, launch bounds ----

/// A mask written to a scope's own `%p1`: the outer `%p1` guarding the
/// accesses is never written.
#[test]
fn a_mask_in_an_inner_scope_does_not_guard_the_outer_register() {
    let t = base_edit(
        SETP,
        "{\n\t.reg .pred \t%p1;\n\tsetp.lt.s32 \t%p1, %r19, %r15;\n\t}",
    );
    assert_eq!(verdict(&t).err(), Some("unguarded_access"));
}

#[test]
fn a_module_variable_is_refused() {
    let t = base_edit(
        ".visible .entry add_kernel(",
        ".global .align 4 .b8 g[4096];\n\n.visible .entry add_kernel(",
    );
    let t = edit(&t, "add.s64 \t%rd3, %rd6, %rd7;", "mov.u64 \t%rd3, g;");
    assert_eq!(verdict(&t).err(), Some("global_variable"));
}

#[test]
fn a_call_is_refused() {
    let t = base_edit(
        ".visible .entry add_kernel(",
        ".extern .func f();\n\n.visible .entry add_kernel(",
    );
    let t = edit(&t, STORE, "call f;\n\t@%p1 st.global.v4.b32 [ %rd3 + 0 ]");
    // A call to a `.func` defined in the module is inlined (and proved);
    // one the module only declares is refused.
    assert_eq!(verdict(&t).err(), Some("call_extern"));
}

/// A 2-D block: `%tid.x` would no longer be the whole block.
#[test]
fn a_two_dimensional_block_is_refused() {
    let t = base_edit(".reqntid 128", ".reqntid 128, 2, 1");
    assert_eq!(verdict(&t).err(), Some("reqntid_conflict"));
}

/// A scratch pointer in the store's address arithmetic (it is null, but
/// the proof does not know the sum): no pointer plus a form.
#[test]
fn a_scratch_pointer_in_address_arithmetic_is_unbounded() {
    let t = base_edit(
        "add.s64 \t%rd3, %rd6, %rd7;",
        "ld.param.b64 \t%rd0, [add_kernel_param_4];\n\tadd.s64 \t%rd3, %rd6, %rd0;\n\tadd.s64 \t%rd3, %rd3, %rd7;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

// ---- Params through other addresses, selp of indices ----

/// A global load whose address is the param symbol itself (the param
/// space read as global memory): no register base.
#[test]
fn a_global_load_at_a_param_symbol_is_unbounded() {
    let t = base_edit(LOAD0, "@%p1 ld.global.b32 %r1, [add_kernel_param_0];");
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// A param load through a register: no param the proof can name.
#[test]
fn a_param_load_through_a_register_is_out_of_range() {
    let t = base_edit(
        "ld.param.b32 \t%r15, [add_kernel_param_3];",
        "ld.param.b32 \t%r15, [%rd4];",
    );
    assert_eq!(verdict(&t).err(), Some("param_out_of_range"));
}

/// `selp` between two index forms: the result is either, so neither.
#[test]
fn a_selp_of_indices_is_no_index() {
    let t = base_edit(
        "mul.wide.s32 \t%rd7, %r19, 2;",
        "selp.b32 \t%r0, %r19, %r18, %p1;\n\tmul.wide.s32 \t%rd7, %r0, 2;",
    );
    assert_eq!(verdict(&t).err(), Some("unbounded_access"));
}

/// A literal shifted right *signed* copies its sign bit: `shr.s32` of
/// `0x80000000` by 28 is `-8`, not `8`. Read as a logical shift (the
/// broadcast proof's literal folding did), the kernel below adds what the
/// proof takes for `+8` and is in fact `-8`: thread 0 of block 0 then
/// loads and stores 16 bytes before each operand. The block's span is
/// doubled (`shl 11`) so that `+8` would stay inside it, exact. Refused
/// now: the shifted literal with its sign bit set is data, and the address
/// no index form. A logical shift of the same literal (`8` indeed, in
/// the unused half of the block) keeps the contract.
#[test]
fn a_signed_shift_of_a_literal_keeps_its_sign() {
    let widened = base_edit("shl.b32 \t%r14, %r13, 10;", "shl.b32 \t%r14, %r13, 11;");
    let shifted = |op: &str| {
        edit(
            &widened,
            "or.b32 \t%r19, %r18, %r14;",
            &format!(
                "or.b32 \t%r19, %r18, %r14;\n\tmov.b32 \t%r0, 0x80000000;\n\t\
                 {op} \t%r0, %r0, 28;\n\tadd.s32 \t%r19, %r19, %r0;"
            ),
        )
    };
    assert_eq!(
        verdict(&shifted("shr.s32")).map(|_| ()),
        Err("unbounded_access")
    );
    // Index 2048·ctaid + 8·tid + 8 under the mask `index < n`: every
    // access lies below n, and the footprint covers n bf16 elements.
    let logical = verdict(&shifted("shr.u32")).expect("a logical shift is +8");
    let n = 4096;
    assert_eq!(footprint(&logical, 0, n), 2 * u128::from(n));
}
