//! Review attacks (w36r) on the broadcast proof (Inductor's 2-D bias
//! kernels): the unmasked grid bound, the remainder by a power of two or
//! by a `.u64` param, and the dropped `createpolicy`.
//!
//! Two holes, each closed as a class (a literal read otherwise than the
//! GPU reads it):
//! - `shr.s32` of a literal whose sign bit is set was folded as a logical
//!   shift: `0x80000000 >> 23` is 256 to the proof and -256 on the GPU, so
//!   an index `512·ctaid + that`, widened, read 1 KiB before its operand
//!   while its contract said inside. A signed shift of such a literal is
//!   now data.
//! - `mad.wide.s32`/`mul.wide.s32` of a remainder by a literal at or past
//!   `2^31` scaled it by that literal, where the GPU multiplies by its
//!   low 32 bits as a signed value (`0xFFFFFFFC` is -4): the bias was read
//!   before its buffer. A literal multiplier is now read at the
//!   instruction's type (`.s32` below `2^31`, `.u32` below `2^32`), else
//!   the product is data.
//!
//! Every other attack tried here was already refused; each is kept with
//! its exact reason (those not in `broadcast.rs`), and the variants the
//! proof accepts because they are in bounds are named with their
//! contract.
#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::contract::{ParamKind, ScalarType};
use ptxd::ptx::{self, Families};
use rand::Rng;

use crate::support::corpus;
use crate::{refusal, rng};

const ENTRY: &str = "triton_poi_fused_add_gelu_0";

fn bias_gelu(build: &str) -> String {
    corpus(&format!("jit/inductor/bias_gelu_2d_f32_{build}.ptx"))
}

/// `text` with every `from` replaced by `to` (which must be there).
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the kernel");
    text.replace(from, to)
}

/// Applies `(from, to)` edits in order.
fn edits(text: &str, list: &[(&str, &str)]) -> String {
    list.iter()
        .fold(text.to_string(), |t, (a, b)| edit(&t, a, b))
}

/// The contract's bias footprint in bytes (a static build's: a
/// constant), or the refusal's sub_reason.
fn bias_footprint(text: &str) -> Result<u128, &'static str> {
    match ptx::canonicalize_with(text, ENTRY, None, Families::ALL) {
        Ok(c) => {
            let v = c.contract.values(1024, 128);
            Ok(c.contract.footprints[1].bytes.eval_with(&v, &[]).unwrap())
        }
        Err(ptx::PtxError::NonScalarAbi { sub_reason, .. }) => Err(sub_reason),
        Err(e) => panic!("not a verdict: {e}"),
    }
}

/// Spare registers for the edits.
const SPARE: (&str, &str) = (
    ".reg .b64 \t%rd<10>;",
    ".reg .b64 \t%rd<10>;\n\t.reg .b32 \t%q<4>;\n\t.reg .b64 \t%qd<4>;",
);

/// The static build's `x` load at `512·ctaid + (0x80000000 >> k)`,
/// `k` in 23..=29 (each accepted before the fix): the proof read the
/// shift as logical (`2^(31-k)`, inside the block's elements), the GPU
/// fills with the sign (`-2^(31-k)`: the load reads up to 1 KiB before
/// `x`). Also with the sign from `1 << 31`, and with random bits below
/// the shift; refused as the index it is not.
#[test]
fn a_signed_shift_of_a_literal_with_its_sign_set_is_no_index() {
    let mut r = rng("signed shift of a negative literal");
    let st = bias_gelu("static_0");
    for _ in 0..4 {
        let k = r.random_range(23..=29u32);
        for make in [
            "mov.u32 \t%q1, 0x80000000;".to_string(),
            "mov.u32 \t%q1, 1;\n\tshl.b32 \t%q1, %q1, 31;".to_string(),
            format!(
                "mov.u32 \t%q1, {};",
                0x8000_0000u32 | r.random_range(0..1u32 << k)
            ),
        ] {
            let body = format!(
                "{make}\n\tshr.s32 \t%q2, %q1, {k};\n\tadd.s32 \t%q3, %r22, %q2;\n\tmad.wide.s32 \t%rd3, %q3, 4, %rd6;"
            );
            let text = edits(
                &st,
                &[SPARE, ("mad.wide.s32 \t%rd3, %r26, 4, %rd6;", &body)],
            );
            let (reason, why) = refusal(&text, ENTRY);
            assert_eq!(reason, "unbounded_access", "k={k} {make}: {why}");
            assert!(why.contains("cannot bound"), "{why}");
        }
    }
    // The class, not more: the same shift of a literal without its sign
    // (`0x40000000 >> k`, a logical shift either way), and `shr.u32` of
    // the signed one, stay folded and in bounds.
    let k = r.random_range(23..=27u32);
    for (lit, op) in [("0x40000000", "shr.s32"), ("0x80000000", "shr.u32")] {
        let shift = if op == "shr.u32" { k + 1 } else { k };
        let body = format!(
            "mov.u32 \t%q1, {lit};\n\t{op} \t%q2, %q1, {shift};\n\tadd.s32 \t%q3, %r22, %q2;\n\tmad.wide.s32 \t%rd3, %q3, 4, %rd6;"
        );
        let text = edits(
            &st,
            &[SPARE, ("mad.wide.s32 \t%rd3, %r26, 4, %rd6;", &body)],
        );
        assert_eq!(bias_footprint(&text), Ok(4096), "{op} {lit} {shift}");
    }
}

/// The remainder of the static build (`x mod 4`, even) scaled by a
/// literal at or past `2^31` in a `.s32` widening multiply: the proof
/// granted `4 × literal` bytes of bias from its start, the GPU read at
/// `bias - 4·r·|literal as s32|` (before the buffer). `mad` and `mul`,
/// any such literal; a `.u32` multiply by one below `2^32` reads it
/// unsigned (as the proof) and stays accepted, its footprint that large.
#[test]
fn a_signed_wide_multiply_by_a_literal_past_i32_is_no_scale() {
    let mut r = rng("signed wide multiply by a negative literal");
    let st1 = edit(
        &bias_gelu("static_1"),
        "and.b32 \t%r20, %r19, -1024;",
        "and.b32 \t%r20, %r19, -4;",
    );
    let spare = (
        ".reg .b64 \t%rd<10>;",
        ".reg .b64 \t%rd<10>;\n\t.reg .b64 \t%qd<4>;",
    );
    for _ in 0..4 {
        let lit: u64 = r.random_range(1u64 << 31..1u64 << 32) & !7;
        for (form, body) in [
            (
                "mad.wide.s32",
                format!("mad.wide.s32 \t%rd5, %r21, {lit:#X}, %rd7;"),
            ),
            (
                "mul.wide.s32",
                format!("mul.wide.s32 \t%qd1, %r21, {lit};\n\tadd.s64 \t%rd5, %rd7, %qd1;"),
            ),
            (
                "mad.wide.s32 (a 64-bit literal)",
                format!("mad.wide.s32 \t%rd5, %r21, {:#X}, %rd7;", lit | 1 << 32),
            ),
        ] {
            let text = edits(
                &st1,
                &[spare, ("mad.wide.s32 \t%rd5, %r21, 4, %rd7;", &body)],
            );
            let (reason, why) = refusal(&text, ENTRY);
            assert_eq!(reason, "unbounded_access", "{form} by {lit:#x}: {why}");
        }
        let text = edits(
            &st1,
            &[(
                "mad.wide.s32 \t%rd5, %r21, 4, %rd7;",
                &format!("mad.wide.u32 \t%rd5, %r21, {lit}, %rd7;"),
            )],
        );
        assert_eq!(bias_footprint(&text), Ok(u128::from(4 * lit)), "{lit:#x}");
    }
    // Below 2^31 the signed read is the value: a scale of 8 is 8.
    let text = edit(
        &st1,
        "mad.wide.s32 \t%rd5, %r21, 4, %rd7;",
        "mad.wide.s32 \t%rd5, %r21, 8, %rd7;",
    );
    assert_eq!(bias_footprint(&text), Ok(32));
}

/// Attacks on the grid bound, the remainder and the policy drop that were
/// already refused (and not in `broadcast.rs`), with their exact reasons.
#[test]
fn attacks_already_refused_keep_their_reasons() {
    let st = bias_gelu("static_0");
    let dy = bias_gelu("dyn_0");
    let dy_regs = edit(&dy, ".reg .b64 \t%rd<26>;", ".reg .b64 \t%rd<30>;");
    let p = |n: u32| format!("triton_poi_fused_add_gelu_0_param_{n}");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "the index's ctaid scaled by half the block (blocks overlap)",
            edit(&st, "shl.b32 \t%r22, %r21, 9;", "shl.b32 \t%r22, %r21, 8;"),
            "unbounded_access",
        ),
        (
            "tid scaled past the block's elements",
            edit(
                &st,
                "shl.b32 \t%r24, %r23, 2;\n\tand.b32 \t%r25, %r24, 508;",
                "shl.b32 \t%r24, %r23, 3;\n\tand.b32 \t%r25, %r24, 1016;",
            ),
            "unbounded_access",
        ),
        (
            ".reqntid 256 for a 128-thread index (the mask drops tid's bit)",
            edit(&st, ".reqntid 128", ".reqntid 256"),
            "unbounded_access",
        ),
        (
            "ntid read for ctaid",
            edit(&st, "mov.u32 \t%r21, %ctaid.x;", "mov.u32 \t%r21, %ntid.x;"),
            "unbounded_access",
        ),
        (
            "ctaid.y for ctaid.x",
            edit(&st, "mov.u32 \t%r21, %ctaid.x;", "mov.u32 \t%r21, %ctaid.y;"),
            "unbounded_access",
        ),
        (
            "nctaid for ctaid",
            edit(&st, "mov.u32 \t%r21, %ctaid.x;", "mov.u32 \t%r21, %nctaid.x;"),
            "unbounded_access",
        ),
        (
            "a second unmasked store 16 bytes on",
            edit(
                &st,
                "st.global.v4.b32 [ %rd8 + 0 ], { %r80, %r81, %r82, %r83 };",
                "st.global.v4.b32 [ %rd8 + 0 ], { %r80, %r81, %r82, %r83 };\n\tst.global.v4.b32 [ %rd8 + 16 ], { %r80, %r81, %r82, %r83 };",
            ),
            "unbounded_access",
        ),
        (
            "the count read as 64 bits",
            edit(
                &st,
                "ld.param.b64 \t%rd7, [triton_poi_fused_add_gelu_0_param_1];",
                "ld.param.b64 \t%rd7, [triton_poi_fused_add_gelu_0_param_1];\n\tld.param.b64 \t%rd1, [triton_poi_fused_add_gelu_0_param_3];",
            ),
            "param_out_of_range",
        ),
        (
            "a mask on the x load only (the store is then unguarded)",
            edit(
                &st,
                "ld.global.v4.b32 { %r13, %r14, %r15, %r16 }, [ %rd3 + 0 ];",
                "setp.lt.s32 \t%p8, %r26, 4096;\n\t@%p8 ld.global.v4.b32 { %r13, %r14, %r15, %r16 }, [ %rd3 + 0 ];",
            ),
            "unguarded_access",
        ),
        (
            "a store through the bias pointer",
            edit(
                &st,
                "ld.param.b64 \t%rd2, [triton_poi_fused_add_gelu_0_param_2];",
                "ld.param.b64 \t%rd2, [triton_poi_fused_add_gelu_0_param_1];",
            ),
            "non_elementwise_address",
        ),
        (
            "a bfe of tid as the sign (tid << 9 is no exact index)",
            edit(&st, "bfe.s32 \t%r27, %r21, 22, 1;", "bfe.s32 \t%r27, %r23, 22, 1;"),
            "index_not_exact",
        ),
        (
            "the remainder plus 1 element after the sub",
            edit(
                &st,
                "sub.s32 \t%r31, %r26, %r30;",
                "sub.s32 \t%r31, %r26, %r30;\n\tadd.s32 \t%r31, %r31, 1;",
            ),
            "unbounded_access",
        ),
        (
            "the remainder plus tid",
            edit(
                &st,
                "mad.wide.s32 \t%rd5, %r31, 4, %rd7;",
                "add.s32 \t%r31, %r31, %r23;\n\tmad.wide.s32 \t%rd5, %r31, 4, %rd7;",
            ),
            "unbounded_access",
        ),
        (
            "the rounding minus x (reversed sub)",
            edit(&st, "sub.s32 \t%r31, %r26, %r30;", "sub.s32 \t%r31, %r30, %r26;"),
            "unbounded_access",
        ),
        (
            "a rounding subtracted from another value than it rounded",
            edit(&st, "sub.s32 \t%r31, %r26, %r30;", "sub.s32 \t%r31, %r22, %r30;"),
            "unbounded_access",
        ),
        (
            "rem.s64 of a loaded value (may be negative)",
            edit(
                &dy_regs,
                "rem.s64 \t%rd24, %rd1, %rd6;",
                "ld.global.b64 \t%rd27, [%rd4];\n\trem.s64 \t%rd24, %rd27, %rd6;",
            ),
            "unbounded_access",
        ),
        (
            "the 32-bit remainder widened signed",
            edit(&dy, "cvt.u64.u32 \t%rd24, %r16;", "cvt.s64.s32 \t%rd24, %r16;"),
            "unbounded_access",
        ),
        (
            "a test mask that drops bit 32 of x | ks0",
            edit(
                &dy,
                "and.b64 \t%rd8, %rd7, -4294967296;",
                "and.b64 \t%rd8, %rd7, -8589934592;",
            ),
            "unbounded_access",
        ),
        (
            "and for or in the test (ks0 as an operand)",
            edit(&dy, "or.b64 \t%rd7, %rd1, %rd6;", "and.b64 \t%rd7, %rd1, %rd6;"),
            "pointer_misuse",
        ),
        (
            "a test of x | x (not of ks0)",
            edit(&dy, "or.b64 \t%rd7, %rd1, %rd6;", "or.b64 \t%rd7, %rd1, %rd1;"),
            "unbounded_access",
        ),
        (
            "the first branch on the second test (computed after it)",
            edit(&dy, "setp.ne.b64 \t%p1, %rd8, 0;", "setp.ne.b64 \t%p1, %rd10, 0;"),
            "unbounded_access",
        ),
        (
            "the test compared with 1",
            edit(&dy, "setp.ne.b64 \t%p1, %rd8, 0;", "setp.ne.b64 \t%p1, %rd8, 1;"),
            "unbounded_access",
        ),
        (
            "the test as an unsigned >",
            edit(&dy, "setp.ne.b64 \t%p1, %rd8, 0;", "setp.gt.u64 \t%p1, %rd8, 0;"),
            "unbounded_access",
        ),
        (
            "the test overwritten under its own guard",
            edit(
                &dy,
                "setp.ne.b64 \t%p1, %rd8, 0;",
                "setp.ne.b64 \t%p1, %rd8, 0;\n\t@%p1 setp.ne.b64 \t%p1, %rd8, 1;",
            ),
            "unbounded_access",
        ),
        (
            "the test of another param (x's pointer) than the divisor",
            edit(
                &dy_regs,
                "or.b64 \t%rd7, %rd1, %rd6;",
                &format!("ld.param.b64 \t%rd27, [{}];\n\tor.b64 \t%rd7, %rd1, %rd27;", p(0)),
            ),
            "unbounded_access",
        ),
        (
            "ks0's low half by a 4-byte param load",
            edit(
                &dy,
                "cvt.u32.u64 \t%r15, %rd6;",
                &format!("ld.param.b32 \t%r15, [{}];", p(3)),
            ),
            "param_out_of_range",
        ),
        (
            "ks0's high half by a 4-byte param load at +4",
            edit(
                &dy,
                "cvt.u32.u64 \t%r15, %rd6;",
                &format!("ld.param.b32 \t%r15, [{}+4];", p(3)),
            ),
            "param_out_of_range",
        ),
        (
            "ks0 also dereferenced",
            edit(
                &dy_regs,
                "rem.s64 \t%rd24, %rd1, %rd6;",
                "rem.s64 \t%rd24, %rd1, %rd6;\n\tld.global.b32 \t%r15, [%rd6];",
            ),
            "unguarded_access",
        ),
        (
            "a divisor ks0 + 1 (no param)",
            edit(
                &dy_regs,
                "rem.s64 \t%rd24, %rd1, %rd6;",
                "add.s64 \t%rd27, %rd6, 1;\n\trem.s64 \t%rd24, %rd1, %rd27;",
            ),
            "pointer_misuse",
        ),
        (
            "the 32-bit path's result one element on (a phi of two values)",
            edit(
                &dy,
                "cvt.u64.u32 \t%rd24, %r16;",
                "cvt.u64.u32 \t%rd24, %r16;\n\tadd.s64 \t%rd24, %rd24, 1;",
            ),
            "unbounded_access",
        ),
        (
            "the 32-bit remainder skipped on one path",
            edit(
                &dy,
                "@%p1 bra \t$L__BB0_2;\n\tbra.uni \t$L__BB0_1;",
                "@%p1 bra \t$L__BB0_3;\n\tbra.uni \t$L__BB0_1;",
            ),
            "undefined_register",
        ),
        (
            "the 32-bit path taken unconditionally",
            edit(
                &dy,
                "@%p1 bra \t$L__BB0_2;\n\tbra.uni \t$L__BB0_1;",
                "bra.uni \t$L__BB0_1;",
            ),
            "unbounded_access",
        ),
        (
            "the remainder scaled by 8 next to one scaled by 4",
            edit(&dy, "shl.b64 \t%rd20, %rd24, 2;", "shl.b64 \t%rd20, %rd24, 3;"),
            "non_elementwise_address",
        ),
        (
            "the policy read through a mov",
            edit(
                &dy_regs,
                "createpolicy.fractional.L2::evict_last.b64 %rd11, 1.0;",
                "createpolicy.fractional.L2::evict_last.b64 %rd11, 1.0;\n\tmov.u64 \t%rd27, %rd11;",
            ),
            "unsupported_instruction",
        ),
        (
            "the policy compared (a guard's source)",
            edit(
                &dy,
                "createpolicy.fractional.L2::evict_last.b64 %rd11, 1.0;",
                "createpolicy.fractional.L2::evict_last.b64 %rd11, 1.0;\n\tsetp.ne.b64 \t%p8, %rd11, 0;",
            ),
            "unsupported_instruction",
        ),
        (
            "the policy's low half stored",
            edit(
                &dy,
                "@%p3 st.global.b32 [ %rd22 + 0 ], { %r47 };",
                "cvt.u32.u64 \t%r47, %rd11;\n\t@%p3 st.global.b32 [ %rd22 + 0 ], { %r47 };",
            ),
            "unsupported_instruction",
        ),
        (
            "ks0's low half as the mask's bound",
            edit(
                &dy,
                "setp.lt.s32 \t%p3, %r54, %r7;",
                "setp.lt.s32 \t%p3, %r54, %r15;",
            ),
            "unguarded_access",
        ),
    ];
    for (what, text, reason) in cases {
        let (got, why) = refusal(&text, ENTRY);
        assert_eq!(got, reason, "{what}: {why}");
    }
}

/// Variants the proof accepts, each in bounds as its contract says: a
/// signed 32-bit remainder by ks0's low half (when ks0's low half is
/// negative as an `.s32`, `|divisor| = 2^32 - ks0 <= ks0`), `rem.u64` on
/// the 64-bit path, a test mask that keeps more than the high half, ks0
/// declared `.s64`, a policy hint on the store (dropped), the static
/// remainder through `mad.wide.u32`, and a body that reads its count only
/// after `ret` (dead).
#[test]
fn in_bounds_variants_keep_the_corpus_contract() {
    let st = bias_gelu("static_0");
    let dy = bias_gelu("dyn_0");
    let base = |t: &str| {
        ptx::canonicalize_with(t, ENTRY, None, Families::ALL)
            .unwrap()
            .contract
    };
    let (st_c, dy_c) = (base(&st), base(&dy));
    for (what, text) in [
        (
            "rem.s32 on the 32-bit path",
            edit(
                &dy,
                "rem.u32 \t%r16, %r54, %r15;",
                "rem.s32 \t%r16, %r54, %r15;",
            ),
        ),
        (
            "rem.u64 on the 64-bit path",
            edit(
                &dy,
                "rem.s64 \t%rd24, %rd1, %rd6;",
                "rem.u64 \t%rd24, %rd1, %rd6;",
            ),
        ),
        (
            "a test mask keeping bit 31 too",
            edit(
                &dy,
                "and.b64 \t%rd8, %rd7, -4294967296;",
                "and.b64 \t%rd8, %rd7, -2147483648;",
            ),
        ),
        (
            "a policy hint on the store",
            edit(
                &dy,
                "@%p3 st.global.b32 [ %rd22 + 0 ], { %r47 };",
                "@%p3 st.global.L2::cache_hint.b32 [ %rd22 + 0 ], { %r47 }, %rd11;",
            ),
        ),
    ] {
        let c = ptx::canonicalize_with(&text, ENTRY, None, Families::ALL)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .contract;
        assert!(c.same_terms(&dy_c), "{what}");
    }
    // ks0 declared `.s64`: the same footprints, a `.s64` scalar (the
    // check reads it signed either way).
    let s64 = edit(
        &dy,
        ".param .u64 triton_poi_fused_add_gelu_0_param_3",
        ".param .s64 triton_poi_fused_add_gelu_0_param_3",
    );
    let c = base(&s64);
    assert_eq!(c.params[3].kind, ParamKind::Scalar(ScalarType::S64));
    assert_eq!(c.footprints.len(), dy_c.footprints.len());
    for (a, b) in c.footprints.iter().zip(&dy_c.footprints) {
        let (na, nb) = (c.arg_names(), dy_c.arg_names());
        assert_eq!(
            a.bytes.named(&na).to_string(),
            b.bytes.named(&nb).to_string()
        );
    }
    assert_eq!(c.preconditions.len(), dy_c.preconditions.len());
    for (what, text) in [
        (
            "the static remainder through mad.wide.u32",
            edit(
                &st,
                "mad.wide.s32 \t%rd5, %r31, 4, %rd7;",
                "mad.wide.u32 \t%rd5, %r31, 4, %rd7;",
            ),
        ),
        (
            "the count read after ret",
            edit(
                &st,
                "\tret;",
                "\tret;\n\tld.param.b32 \t%r0, [triton_poi_fused_add_gelu_0_param_3];",
            ),
        ),
    ] {
        let c = ptx::canonicalize_with(&text, ENTRY, None, Families::ALL)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .contract;
        assert!(c.same_terms(&st_c), "{what}");
    }
}
