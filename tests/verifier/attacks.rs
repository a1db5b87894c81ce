//! Attack kernels: one minimal kernel per way the verifier's proof was
//! broken (issue 8), each refused with the NON_SCALAR_ABI sub_reason that
//! names its class; and the valid shapes compilers emit that were refused
//! before, each accepted with the right signature.
#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::{self, PtxError};

const GUARD: &str = "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra DONE;";
const PROLOGUE: &str = "mov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;";
const STORE_ADDR: &str = "add.s64 %rd14, %rd13, %rd9;";

/// `out[i] = in0[i] + in1[i]` (f32), with the prologue, the guard, the
/// output address and the code just before the store replaceable.
fn kernel(prologue: &str, guard: &str, store_addr: &str, before_store: &str) -> String {
    format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n\
         .visible .entry k(\n\t.param .u64 k_in0,\n\t.param .u64 k_in1,\n\t.param .u64 k_out,\n\t.param .u64 k_n\n)\n{{\n\
         \t.reg .pred %p<8>;\n\t.reg .f32 %f<8>;\n\t.reg .b32 %r<8>;\n\t.reg .b64 %rd<32>;\n\t.reg .f64 %fd<4>;\n\
         \tld.param.u64 %rd2, [k_in0];\n\tld.param.u64 %rd3, [k_in1];\n\tld.param.u64 %rd4, [k_out];\n\tld.param.u64 %rd5, [k_n];\n\
         \t{prologue}\n\t{guard}\n\
         \tcvta.to.global.u64 %rd8, %rd2;\n\tshl.b64 %rd9, %rd1, 2;\n\tadd.s64 %rd10, %rd8, %rd9;\n\
         \tcvta.to.global.u64 %rd11, %rd3;\n\tadd.s64 %rd12, %rd11, %rd9;\n\
         \tld.global.f32 %f1, [%rd12];\n\tld.global.f32 %f2, [%rd10];\n\tadd.f32 %f3, %f2, %f1;\n\
         \tcvta.to.global.u64 %rd13, %rd4;\n\t{store_addr}\n\t{before_store}\n\
         \tst.global.f32 [%rd14], %f3;\nDONE:\n\tret;\n}}\n"
    )
}

fn with_store(before_store: &str) -> String {
    kernel(PROLOGUE, GUARD, STORE_ADDR, before_store)
}

fn with_guard(guard: &str) -> String {
    kernel(PROLOGUE, guard, STORE_ADDR, "")
}

/// The sub_reason of the refusal (canonicalize: the path LoadKernel takes).
fn refusal(text: &str) -> &'static str {
    match ptx::canonicalize(text, "k", None) {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => sub_reason,
        other => panic!("expected a NON_SCALAR_ABI refusal, got {other:?}\n{text}"),
    }
}

fn accepted(text: &str) -> ptx::Signature {
    ptx::canonicalize(text, "k", None)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .signature
}

/// A predicate that is false for every thread (`i == -1`).
const FALSE_PRED: &str = "setp.eq.s64 %p2, %rd1, -1;";

#[test]
fn the_template_is_accepted() {
    let sig = accepted(&with_store(""));
    assert_eq!(
        (sig.inputs, sig.element_sizes, sig.scalar_params),
        (2, vec![4, 4, 4], 0)
    );
}

#[test]
fn predicated_definitions_are_refused() {
    // Write-what-where: an address the verifier would believe, redefined
    // under a predicate that never holds.
    for body in [
        "@%p2 add.s64 %rd14, %rd13, %rd20;",
        "@%p2 mov.u64 %rd14, %rd10;",
        "@!%p3 mov.u64 %rd14, %rd20;",
        "@%p2 ld.param.u64 %rd14, [k_in0];",
        "@%p2 shl.b64 %rd9, %rd20, 2;\n\tadd.s64 %rd14, %rd13, %rd9;",
    ] {
        let text = with_store(&format!(
            "{FALSE_PRED}\n\tsetp.ne.s64 %p3, %rd1, -1;\n\t{body}"
        ));
        assert_eq!(refusal(&text), "predicated_definition", "{body}");
    }
    // A fake guard: the setp that makes it never runs.
    let fake = with_guard(&format!(
        "{FALSE_PRED}\n\t@%p2 setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra DONE;"
    ));
    assert_eq!(refusal(&fake), "predicated_definition");
    // A flipped guard: the `not` that would flip it never runs.
    let flipped = with_guard(&format!(
        "setp.lt.s64 %p1, %rd1, %rd5;\n\t{FALSE_PRED}\n\t@%p2 not.pred %p1, %p1;\n\t@!%p1 bra DONE;"
    ));
    assert_eq!(refusal(&flipped), "predicated_definition");
}

#[test]
fn predicated_data_is_still_fine() {
    // Triton's masked load: data under a predicate.
    let sig = accepted(&with_store(&format!(
        "{FALSE_PRED}\n\t@%p2 mov.f32 %f3, 0f00000000;"
    )));
    assert_eq!(sig.inputs, 2);
}

#[test]
fn text_ptxas_would_read_differently_is_refused_or_seen() {
    // A store hidden after `.loc` on the same line is parsed and checked.
    let hidden = with_store(".loc 1 1 0 st.global.f32 [%rd3], %f3;");
    assert_eq!(refusal(&hidden), "non_elementwise_address");
    let hidden_file = with_store(".file 1 \"x.cu\" st.global.f32 [%rd3], %f3;");
    assert_eq!(refusal(&hidden_file), "non_elementwise_address");
    // A pragma cannot hide code either.
    let pragma = with_store(".pragma \"nounroll\" st.global.f32 [%rd3], %f3;");
    assert!(matches!(
        ptx::canonicalize(&pragma, "k", None),
        Err(PtxError::Parse { .. })
    ));
    // One label in two sibling scopes: ptxas picks by scope.
    let labels = with_store("{\n\tbra L;\n\tL:\n\t}\n\t{\n\tL:\n\tst.global.f32 [%rd3], %f3;\n\t}");
    assert_eq!(refusal(&labels), "duplicate_label");
    // Code the verifier believes unreachable.
    let unreachable = with_store("bra SKIP;\n\tst.global.f32 [%rd3], %f3;\nSKIP:");
    assert_eq!(refusal(&unreachable), "unreachable_code");
}

#[test]
fn a_pair_destination_naming_one_register_twice_is_refused() {
    let pair = with_guard("setp.ge.s64 %p1|%p1, %rd1, %rd5;\n\t@%p1 bra DONE;");
    assert_eq!(refusal(&pair), "duplicate_destination");
    let list = with_store("mov.b64 {%r5, %r5}, %rd20;");
    assert_eq!(refusal(&list), "duplicate_destination");
}

#[test]
fn float_arithmetic_on_addresses_is_refused() {
    let f64_addr = kernel(PROLOGUE, GUARD, "add.f64 %rd14, %rd13, %rd9;", "");
    assert_eq!(refusal(&f64_addr), "non_integer_arithmetic");
    let via_fd = kernel(
        PROLOGUE,
        GUARD,
        "mov.b64 %fd1, %rd13;\n\tadd.f64 %fd2, %fd1, %fd1;\n\tmov.b64 %rd14, %fd2;",
        "",
    );
    assert_eq!(refusal(&via_fd), "non_integer_arithmetic");
    // A float compare as the guard is no guard.
    let fguard = with_guard("setp.ge.f64 %p1, %rd1, %rd5;\n\t@%p1 bra DONE;");
    assert_eq!(refusal(&fguard), "non_integer_arithmetic");
    // A 16-bit index is not the index.
    let narrow = kernel(
        "mov.u16 %rs1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;",
        GUARD,
        STORE_ADDR,
        "",
    )
    .replace(".reg .b32 %r<8>;", ".reg .b32 %r<8>;\n\t.reg .b16 %rs<4>;");
    assert_eq!(refusal(&narrow), "unguarded_access");
}

#[test]
fn pointer_escapes_are_refused() {
    for body in [
        // Unpacking into halves, then storing one as data.
        "mov.b64 {%r5, %r6}, %rd13;\n\tmov.b32 %f3, %r5;",
        // Narrowing.
        "cvt.u32.u64 %r5, %rd13;\n\tcvt.rn.f32.u32 %f3, %r5;",
        // A partial param load.
        "ld.param.u32 %r5, [k_out];\n\tmov.b32 %f3, %r5;",
        // A pointer laundered through a join with a constant.
        "setp.eq.s64 %p3, %rd1, 0;\n\tmov.u64 %rd20, %rd13;\n\t@%p3 bra J;\n\tmov.u64 %rd20, 0;\nJ:\n\tcvt.rn.f32.u64 %f3, %rd20;",
    ] {
        assert_eq!(refusal(&with_store(body)), "pointer_escape", "{body}");
    }
    // Storing the pointer itself (an 8-byte output).
    let store_ptr = kernel(
        PROLOGUE,
        GUARD,
        "shl.b64 %rd15, %rd1, 3;\n\tadd.s64 %rd14, %rd13, %rd15;",
        "st.global.u64 [%rd14], %rd13;",
    );
    assert_eq!(refusal(&store_ptr), "pointer_escape");
}

#[test]
fn compiler_shapes_that_were_refused_are_accepted() {
    // nvcc -O3 for `threadIdx.x + blockDim.x * blockIdx.x`.
    let ntid_first = kernel(
        "mov.u32 %r1, %ntid.x;\n\tmov.u32 %r2, %ctaid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd7, %rd6;",
        GUARD,
        STORE_ADDR,
        "",
    );
    accepted(&ntid_first);
    // `mad.wide.u32` with either order, and mad.lo.s64 addressing.
    accepted(&kernel(
        "mov.u32 %r1, %ntid.x;\n\tmov.u32 %r2, %ctaid.x;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tmad.wide.u32 %rd1, %r1, %r2, %rd7;",
        GUARD,
        "mad.lo.s64 %rd14, %rd1, 4, %rd13;",
        "",
    ));
    // Guards as early return and exit; unsigned compares.
    for guard in [
        "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 ret;",
        "setp.ge.u64 %p1, %rd1, %rd5;\n\t@%p1 exit;",
        "setp.hs.u64 %p1, %rd1, %rd5;\n\t@%p1 bra DONE;",
        "setp.lo.u64 %p1, %rd1, %rd5;\n\t@!%p1 bra DONE;",
        "setp.ls.u64 %p1, %rd5, %rd1;\n\t@%p1 bra DONE;",
        "setp.lt.s64 %p1, %rd1, %rd5;\n\tnot.pred %p2, %p1;\n\t@%p2 ret;",
    ] {
        accepted(&with_guard(guard));
    }
    // `c ? in0[i] : in1[i]` as one load through a selected address.
    let sig = accepted(&with_store(
        "setp.gt.f32 %p4, %f1, 0f00000000;\n\tselp.b64 %rd16, %rd10, %rd12, %p4;\n\tld.global.f32 %f3, [%rd16];",
    ));
    assert_eq!(sig.element_sizes, vec![4, 4, 4]);
    // `::` cache qualifiers.
    accepted(&with_store(
        "ld.global.L1::no_allocate.f32 %f4, [%rd10];\n\tld.global.nc.L2::256B.f32 %f5, [%rd12];\n\tst.global.L1::evict_first.f32 [%rd14], %f4;",
    ));
    // cuda_fp16.h-style scoped registers without `%`, and `.reg.b32`.
    accepted(&with_store(
        "{\n\t.reg .f32 tmp;\n\tadd.f32 tmp, %f2, %f1;\n\tmov.f32 %f3, tmp;\n\t}\n\t{.reg.b32 t2;\n\tmov.b32 t2, %f3;\n\tmov.b32 %f3, t2;\n\t}",
    ));
}

#[test]
fn selected_addresses_must_all_be_inputs_of_one_size() {
    // Selecting the output's address for a load is still a load through the output.
    let sel_out = with_store(
        "setp.gt.f32 %p4, %f1, 0f00000000;\n\tselp.b64 %rd16, %rd10, %rd14, %p4;\n\tld.global.f32 %f3, [%rd16];",
    );
    assert_eq!(refusal(&sel_out), "pointer_misuse");
    // A pointer and data: a gather.
    let sel_data = with_store(
        "setp.gt.f32 %p4, %f1, 0f00000000;\n\tselp.b64 %rd16, %rd10, %rd20, %p4;\n\tld.global.f32 %f3, [%rd16];",
    );
    assert_eq!(refusal(&sel_data), "pointer_misuse");
}

#[test]
fn an_integer_literal_in_a_float_instruction_is_no_integer_constant() {
    // `mov.f32 %f5, 4` holds the float 4.0 (0x40800000): a scale built from
    // it is not 4, so the address is no element address.
    for scale in [
        "mov.f32 %f5, 4;\n\tmov.b32 %r4, %f5;\n\tcvt.u64.u32 %rd16, %r4;",
        "mov.f64 %fd1, 4;\n\tmov.b64 %rd16, %fd1;",
        "setp.eq.s64 %p3, %rd1, 0;\n\tselp.f64 %fd1, 4, 4, %p3;\n\tmov.b64 %rd16, %fd1;",
    ] {
        let text = kernel(
            PROLOGUE,
            GUARD,
            &format!("{scale}\n\tmul.lo.s64 %rd15, %rd1, %rd16;\n\tadd.s64 %rd14, %rd13, %rd15;"),
            "",
        );
        assert_eq!(refusal(&text), "non_elementwise_address", "{scale}");
    }
    // The same literal in an integer instruction is the constant.
    accepted(&kernel(
        PROLOGUE,
        GUARD,
        "mov.u64 %rd16, 4;\n\tmul.lo.s64 %rd15, %rd1, %rd16;\n\tadd.s64 %rd14, %rd13, %rd15;",
        "",
    ));
}

/// A cache-policy operand never reaches ptxas: the IR drops
/// `.L2::cache_hint` and its operand (a data value there faults the GPU;
/// the hint never changes results), so a pointer or any data in that slot
/// is simply gone from the canonical text. Any other extra operand has no
/// modelled role and is refused.
#[test]
fn a_cache_policy_operand_never_reaches_the_canonical_text() {
    for (body, hinted) in [
        (
            "ld.global.L2::cache_hint.f32 %f4, [%rd10], %rd2;
	add.f32 %f3, %f3, %f4;",
            "ld.global.f32",
        ),
        (
            "mov.u64 %rd20, 99;
	ld.global.L2::cache_hint.f32 %f4, [%rd10], %rd20;
	add.f32 %f3, %f3, %f4;",
            "ld.global.f32",
        ),
    ] {
        let text = with_store(body);
        let c = ptx::canonicalize(&text, "k", None).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(!c.text.contains("cache_hint"), "{}", c.text);
        assert!(
            c.text
                .lines()
                .filter(|l| l.contains(hinted))
                .all(|l| l.matches(',').count() == 1),
            "a policy operand survived:\n{}",
            c.text
        );
    }
    // The store form too.
    let st = with_store("").replace(
        "st.global.f32 [%rd14], %f3;",
        "st.global.L2::cache_hint.f32 [%rd14], %f3, %rd2;",
    );
    let c = ptx::canonicalize(&st, "k", None).unwrap_or_else(|e| panic!("{e}\n{st}"));
    assert!(
        c.text.contains("st.global.f32 [%r") && !c.text.contains("cache_hint"),
        "{}",
        c.text
    );
    // Without the hint modifier an extra operand has no role.
    for body in [
        "ld.global.f32 %f4, [%rd10], %rd2;
	add.f32 %f3, %f3, %f4;",
        "ld.global.nc.f32 %f4, [%rd10], 16;
	add.f32 %f3, %f3, %f4;",
        "ld.global.L2::cache_hint.f32 %f4, [%rd10];
	add.f32 %f3, %f3, %f4;",
    ] {
        let r = refusal(&with_store(body));
        assert!(
            matches!(r, "unmodelled_operand" | "unsupported_instruction"),
            "{body}: {r}"
        );
    }
    assert_eq!(
        refusal(&with_store(
            "ld.global.f32 %f4, [%rd10], %rd2;
	add.f32 %f3, %f3, %f4;"
        )),
        "unmodelled_operand"
    );
    assert_eq!(
        refusal(&with_store(
            "ld.global.L2::cache_hint.f32 %f4, [%rd10];
	add.f32 %f3, %f3, %f4;"
        )),
        "unsupported_instruction"
    );
}

#[test]
fn a_predicated_uniform_branch_is_refused() {
    // `.uni` promises a warp-uniform predicate; the guard `i < n` is not.
    for guard in [
        "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra.uni DONE;",
        "setp.lt.s64 %p1, %rd1, %rd5;\n\t@!%p1 bra.uni DONE;",
        "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 ret.uni;",
    ] {
        assert_eq!(refusal(&with_guard(guard)), "uniform_branch", "{guard}");
    }
    // Unpredicated, as nvcc emits it, `.uni` is fine.
    accepted(&with_guard(
        "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra DONE;\n\tbra.uni NEXT;\nNEXT:",
    ));
}

#[test]
fn a_load_or_store_modifier_that_is_not_modelled_is_refused() {
    for body in [
        "st.bulk.weak.b32 [%rd14], 4096, 0;",
        "ld.global.async.f32 %f4, [%rd10];",
        "st.global.unknown_hint.f32 [%rd14], %f3;",
    ] {
        assert_eq!(
            refusal(&with_store(body)),
            "unsupported_instruction",
            "{body}"
        );
    }
    // Cache operators, ordering, scopes and hints are modelled.
    accepted(&with_store(
        "ld.relaxed.gpu.global.L1::evict_last.f32 %f4, [%rd10];\n\tst.global.cs.f32 [%rd14], %f4;",
    ));
}
