//! Review attacks (w34f), from long runs of the mutant oracles (the scalar,
//! families, client-text and Triton ones, with the never-written-register
//! check) and hand probes of what they reach: params read past the
//! modelled set, registers defined only under guards, vector lanes never
//! written. Each class is asserted with its exact refusal.
#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::{self, Families};
use rand::seq::IndexedRandom;
use rand::Rng;

use crate::support::corpus;
use crate::{refusal, rng};

/// `text` with the first `from` replaced by `to` (which must be there).
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the kernel");
    text.replacen(from, to, 1)
}

fn jit(file: &str) -> String {
    corpus(&format!("jit/{file}"))
}

/// The count's load in each scalar-ABI kernel: (text, entry, the load,
/// the count's register, its size in bytes).
fn count_loads() -> Vec<(String, &'static str, &'static str, &'static str, i64)> {
    vec![
        (
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            "ld.param.u64 \t%rd5, [add_f32_scalar_param_3];",
            "%rd5",
            8,
        ),
        // The count sits before the float params: a read past it reads
        // their bytes.
        (
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            "ld.param.u64 \t%rd4, [affine_f32_scalar_param_2];",
            "%rd4",
            8,
        ),
        (
            jit("nvrtc/add_f32_idx32_n32_O3.ptx"),
            "add_f32_idx32_n32",
            "ld.param.u32 \t%r2, [add_f32_idx32_n32_param_3];",
            "%r2",
            4,
        ),
    ]
}

/// A count read past its own param (past the last param, or into the
/// float params after it; at a negative offset; straddling its end) is
/// `param_out_of_range`, as a pointer read past its param always was. It
/// used to be reported as `unguarded_access` (the guard against the
/// unknown value is no guard, and the no-guard verdict named only some of
/// the reasons a guard can be none), against the order of the rules.
#[test]
fn a_count_read_past_its_param_is_param_out_of_range() {
    let mut r = rng("count past its param");
    for (text, entry, load, reg, size) in count_loads() {
        // The kernel as compiled is accepted: the edit alone refuses.
        assert!(
            ptx::canonicalize_with(&text, entry, None, Families::ALL).is_ok(),
            "{entry}"
        );
        let ty = if size == 8 { "u64" } else { "u32" };
        for _ in 0..8 {
            let offset = match r.random_range(0..3) {
                // Past its end, by whole params or not.
                0 => size * r.random_range(1..64) + *[0, 1, 2].choose(&mut r).unwrap(),
                // Before its start.
                1 => -(r.random_range(1..256i64)),
                // Straddling its end.
                _ => r.random_range(1..size),
            };
            let param = load
                .split_once('[')
                .and_then(|(_, p)| p.split_once(']'))
                .unwrap()
                .0;
            let t = edit(
                &text,
                load,
                &format!("ld.param.{ty} \t{reg}, [{param}+{offset}];").replace("+-", "-"),
            );
            let (reason, why) = refusal(&t, entry);
            assert_eq!(reason, "param_out_of_range", "{entry} +{offset}: {why}");
            assert!(why.contains(&format!("offset {offset}")), "{why}");
        }
    }
}

/// The count read whole is still the count (the control of the test
/// above): at offset 0 written out, every kernel stays accepted.
#[test]
fn a_count_read_at_offset_zero_stays_accepted() {
    for (text, entry, load, reg, size) in count_loads() {
        let ty = if size == 8 { "u64" } else { "u32" };
        let param = load
            .split_once('[')
            .and_then(|(_, p)| p.split_once(']'))
            .unwrap()
            .0;
        let t = edit(&text, load, &format!("ld.param.{ty} \t{reg}, [{param}+0];"));
        assert!(
            ptx::canonicalize_with(&t, entry, None, Families::ALL).is_ok(),
            "{entry}"
        );
    }
}

/// A register written only under complementary guards (`@p` one value,
/// `@!p` another) holds one of them on every run, but by no unguarded
/// write: as data it is `undefined_register`; as an address it is a
/// `predicated_definition`. (The class held under every oracle run.)
#[test]
fn complementary_guarded_definitions_are_refused() {
    let text = corpus("add_f32_scalar.ptx");
    let data = edit(
        &text,
        "\tadd.f32 \t%f3, %f2, %f1;",
        "\t@%p1 add.f32 \t%f3, %f2, %f1;\n\t@!%p1 mov.f32 \t%f3, %f2;",
    );
    assert_eq!(refusal(&data, "add_f32_scalar").0, "undefined_register");
    let address = edit(
        &text,
        "\tadd.s64 \t%rd14, %rd13, %rd9;",
        "\t@%p1 add.s64 \t%rd14, %rd13, %rd9;\n\t@!%p1 mov.b64 \t%rd14, %rd12;",
    );
    assert_eq!(
        refusal(&address, "add_f32_scalar").0,
        "predicated_definition"
    );
}

/// A lane of a vector store never written (Triton's `st.global.v4` with
/// one sum dropped) is `undefined_register`, naming the lane; so is a
/// lane whose zero default before a guarded vector load is dropped.
#[test]
fn a_vector_lane_never_written_is_undefined() {
    let text = jit("triton/add_f32_b1024_w4_div16.ptx");
    let c = ptx::canonicalize_with(&text, "add_kernel", None, Families::ALL).unwrap();
    let stored = edit(&c.text, "\tadd.f32 %r39, %r19, %r29;\n", "");
    let (reason, why) = refusal(&stored, "add_kernel");
    assert_eq!(reason, "undefined_register");
    assert!(why.contains("`%r39`"), "{why}");
    let loaded = edit(&c.text, "\tmov.u32 %r16, 0;\n", "");
    let (reason, why) = refusal(&loaded, "add_kernel");
    assert_eq!(reason, "undefined_register");
    assert!(why.contains("`%r16`"), "{why}");
}

/// Triton's relu (8 elements a thread, each store under its own mask)
/// with element 513's mask remade as `!(element 0's mask)`, the store of
/// element 1 moved past a `ret` placed after element 0's store, and
/// `ret` as given: the stores after it are dead (the mutant the Triton
/// oracle flagged on seed 30: its interpreter ran past `ret`).
fn relu_with_ret(ret: &str) -> String {
    let c = ptx::canonicalize_with(
        &jit("triton/relu_f32_b1024_w4_nodiv.ptx"),
        "relu_kernel",
        None,
        Families::ALL,
    )
    .unwrap();
    let t = edit(
        &c.text,
        "\tadd.s64 %r45, %r41, 2048;\n",
        "\tnot.pred %r21, %r16;\n\tadd.s64 %r45, %r41, 2048;\n",
    );
    let t = edit(
        &t,
        "\t@%r17 st.global.b32 [%r42], %r50;\n",
        &format!("{ret}\n"),
    );
    edit(
        &t,
        "\tret;\n}",
        "\tret;\n\t@%r17 st.global.b32 [%r42], %r50;\n}",
    )
}

/// Code after a `ret` that surely runs is dead in the Triton proof, and
/// the Triton oracle's interpreter now stops there too (it ran on, and
/// flagged the dead store of a mask that is no mask); after a guarded
/// `ret` or `exit` (either polarity) the same store is reachable and
/// refused.
#[test]
fn a_store_after_ret_is_dead_and_after_a_guarded_ret_is_checked() {
    let mut r = rng("store after ret");
    let dead = relu_with_ret("\tret;");
    assert!(ptx::canonicalize_with(&dead, "relu_kernel", None, Families::ALL).is_ok());
    // Never an escape, and judged in bounds for some launch (a random
    // count whose preconditions fail is not judged).
    let mut judged = false;
    for _ in 0..16 {
        judged |= crate::support::mutants::triton_oracle(&dead, "relu_kernel", &mut r)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(judged);
    for ret in ["\t@%r16 ret;", "\t@!%r16 ret;", "\t@%r16 exit;"] {
        let (reason, why) = refusal(&relu_with_ret(ret), "relu_kernel");
        assert_eq!(reason, "unguarded_access", "{ret}: {why}");
    }
}
