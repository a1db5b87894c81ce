//! The second red-team sweep against the verifier: 67 attacks on index and
//! scale arithmetic, pointer mixing, special registers, address shapes,
//! state spaces, the canonical round trip and control flow, each of which
//! must be refused. It found one gap, now closed: a predicated `bra.uni` /
//! `ret.uni` on the bounds guard (`uniform_branch`).
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::support::attack_kernels;

use attack_kernels::*;

fn case_list() -> Vec<(&'static str, String)> {
    let k = |a: &str| with_addr(a);
    vec![
        // 1. control flow: uniform-branch / uniform-return hints on a divergent guard.
        // 1. modifiers the verifier ignores
        ("mul.hi.u64 scale", k("mul.hi.u64 %rd15, %rd1, 4;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("mul.wide.s64 scale", k("mul.wide.s64 %rd15, %rd1, 4;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("mul.lo.u64 neg", k("mul.lo.u64 %rd15, %rd1, -4;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("shl.b64 by 64", k("shl.b64 %rd15, %rd1, 64;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("shl.b64 by 66", k("shl.b64 %rd15, %rd1, 66;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("shl.b64 by -2", k("shl.b64 %rd15, %rd1, -2;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("shl.b64 by 2^32+2", k("shl.b64 %rd15, %rd1, 4294967298;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("mul.lo.s64 by 2^64+4", k("mul.lo.s64 %rd15, %rd1, 18446744073709551620;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        ("mad.hi.s64", k("mad.hi.s64 %rd14, %rd1, 4, %rd13;")),
        ("addc.s64 addr", k("add.cc.s64 %rd20, %rd1, 0;\n\taddc.s64 %rd14, %rd13, %rd9;")),
        ("sub addr neg", k("neg.s64 %rd15, %rd9;\n\tsub.s64 %rd14, %rd13, %rd15;")),
        ("add both ptr after join", k("setp.eq.s64 %p2, %rd1, 0;\n\tselp.b64 %rd15, %rd13, %rd9, %p2;\n\tadd.s64 %rd14, %rd15, %rd9;")),
        ("cvt.s64.s32 of ctaid*ntid 32", with_prologue("mov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.lo.s32 %r4, %r1, %r2;\n\tcvt.s64.s32 %rd6, %r4;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;")),
        ("cvta.to.global.shared", k("cvta.to.global.shared.u64 %rd15, %rd4;\n\tadd.s64 %rd14, %rd15, %rd9;")),
        ("tid.y index", with_prologue("mov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u32 %r3, %tid.y;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;")),
        ("nctaid index", with_prologue("mov.u32 %r1, %nctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;")),
        ("sreg direct mul.wide", with_prologue("mul.wide.u32 %rd6, %ctaid.x, %ntid.y;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;")),
        ("tid.x in u64 mov", with_prologue("mov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u64 %rd7, %tid.x;\n\tadd.s64 %rd1, %rd6, %rd7;")),
        ("selp pred from data as addr", k("setp.eq.f32 %p2, %f1, 0f00000000;\n\tselp.b64 %rd15, %rd9, 0, %p2;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        // 2. operand shapes
        ("imm addr", k("mov.u64 %rd14, 4096;")),
        ("addr wraps", k("add.s64 %rd14, %rd13, %rd9;").replace("st.global.f32 [%rd14]", "st.global.f32 [%rd14+18446744073709551616]")),
        ("addr neg off", k("add.s64 %rd14, %rd13, %rd9;").replace("st.global.f32 [%rd14]", "st.global.f32 [%rd14+-4]")),
        ("addr operand in add", k("add.s64 %rd14, [%rd13], %rd9;")),
        ("label as data", k("add.s64 %rd14, %rd13, DONE;")),
        ("list of one as addr", k("add.s64 %rd14, %rd13, %rd9;").replace("st.global.f32 [%rd14], %f3", "st.global.f32 {%rd14}, %f3")),
        ("list store value ptr", kernel64("mov.u64 %rd20, 0;").replace("st.global.u64 [%rd14], %rd20", "st.global.u64 [%rd14], {%rd2}")),
        ("pred as data", kernel64("setp.eq.s64 %p2, %rd2, 0;\n\tselp.u64 %rd20, 1, 0, %p2;")),
        ("param addr as mov", kernel64("mov.u64 %rd20, k_in0;")),
        ("sink store addr", k("add.s64 %rd14, %rd13, %rd9;").replace("st.global.f32 [%rd14]", "st.global.f32 [_]")),
        ("sink as index", k("add.s64 %rd14, %rd13, _;")),
        ("ld.param::entry", kernel64("ld.param::entry.u64 %rd20, [k_in0];")),
        ("st.param::func", kernel64("mov.u64 %rd20, 0;\n\tst.param::func.u64 [k_in0], %rd20;")),
        ("st.bulk", kernel(PROLOGUE, GUARD, STORE_ADDR, "st.bulk.weak [%rd14], 4096, 0;")),
        ("ld b128 from in", kernel(PROLOGUE, GUARD, STORE_ADDR, "ld.global.b128 %q1, [%rd10];")),
        ("prefetch addr", kernel(PROLOGUE, GUARD, STORE_ADDR, "prefetch.global.L2 [%rd10];")),
        ("ld.global.param mix", kernel(PROLOGUE, GUARD, STORE_ADDR, "ld.global.param.f32 %f4, [%rd10];")),
        // 3. round trip
        ("address_size 32", with_store("").replace(".address_size 64", ".address_size 32")),
        ("octal shift", k("shl.b64 %rd15, %rd1, 010;\n\tadd.s64 %rd14, %rd13, %rd15;")),
        // 4. control flow
        ("loop join", kernel(PROLOGUE, "setp.ge.s64 %p1, %rd1, %rd5;\n\tbra CHK;\nTOP:\n\t@%p1 bra DONE;\nCHK:\n\tsetp.eq.s64 %p3, %rd1, 0;\n\t@%p3 bra TOP;", STORE_ADDR, "")),
        ("@p ret from join", kernel(PROLOGUE, "setp.eq.s64 %p3, %rd1, 0;\n\t@%p3 bra A;\n\tsetp.ge.s64 %p1, %rd1, %rd5;\n\tbra B;\nA:\n\tsetp.eq.s64 %p1, %rd1, 5;\nB:\n\t@%p1 ret;", STORE_ADDR, "")),
        ("branch to end label", kernel(PROLOGUE, "setp.ge.s64 %p1, %rd1, %rd5;\n\t@!%p1 bra DONE;", STORE_ADDR, "")),
        ("exit unguarded then code", kernel(PROLOGUE, GUARD, STORE_ADDR, "").replace("DONE:\n\tret;", "DONE:\n\texit;\n\tst.global.f32 [%rd13], %f3;")),
        ("trap", kernel(PROLOGUE, "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 trap;", STORE_ADDR, "")),
        ("brkpt", kernel(PROLOGUE, "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 brkpt;", STORE_ADDR, "")),
    ]
}

/// FINDING (PTX ISA, not confirmed on hardware): `bra.uni` / `ret.uni`
/// promise ptxas that the guard predicate is warp-uniform; the bounds guard
/// `i >= n` is divergent in the tail warp, so ptxas may emit a uniform branch
/// (BRA.U / uniform predicate) and let threads with i >= n fall through into
/// the accesses. The verifier treats `bra.uni` as `bra`. Fails until fixed.
#[test]
fn uniform_branch_on_divergent_guard() {
    let k = |a: &str| with_addr(a);
    let _ = k;
    let cases: Vec<(&str, String)> = vec![
        (
            "guard bra.uni ge",
            with_guard("setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra.uni DONE;"),
        ),
        (
            "guard ret.uni ge",
            with_guard("setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 ret.uni;"),
        ),
        (
            "guard !p bra.uni lt",
            with_guard("setp.lt.s64 %p1, %rd1, %rd5;\n\t@!%p1 bra.uni DONE;"),
        ),
        (
            "setp.ge.ftz guard + bra",
            with_guard("setp.ge.ftz.s64 %p1, %rd1, %rd5;\n\t@%p1 bra.uni DONE;"),
        ),
    ];
    let accepted = run_all(&cases);
    assert!(accepted.is_empty(), "accepted: {accepted:?}");
}

/// Accepted and judged safe (or rejected later by ptxas); listed, not asserted.

#[test]
fn red_team2_all_refused() {
    let cases = case_list();
    let accepted = run_all(&cases);
    // A 32-bit `ctaid × ntid` widened by sign is exact under `index_fits_i32`,
    // which its contract carries; every other case stays refused.
    assert_eq!(
        accepted,
        ["cvt.s64.s32 of ctaid*ntid 32"],
        "accepted: {accepted:?}"
    );
    assert_eq!(
        accepted_only_under(&cases, "index_fits_i32"),
        ["cvt.s64.s32 of ctaid*ntid 32"]
    );
}
