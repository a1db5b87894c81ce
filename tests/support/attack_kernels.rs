//! The attack-kernel template shared by the red-team sweeps
//! (`tests/verifier/red_team.rs`, `tests/verifier/red_team2.rs`): `out[i] = in0[i] +
//! in1[i]` with its prologue, guard, output address and the code before the
//! store replaceable, and a u64-output variant for pointer-escape attacks.
#![allow(dead_code)]

use ptxd::ptx;

pub const GUARD: &str = "setp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra DONE;";
pub const PROLOGUE: &str = "mov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;";
pub const STORE_ADDR: &str = "add.s64 %rd14, %rd13, %rd9;";

pub fn kernel(prologue: &str, guard: &str, store_addr: &str, before_store: &str) -> String {
    format!(
        ".version 8.3\n.target sm_90\n.address_size 64\n\
         .visible .entry k(\n\t.param .u64 k_in0,\n\t.param .u64 k_in1,\n\t.param .u64 k_out,\n\t.param .u64 k_n\n)\n{{\n\
         \t.reg .pred %p<8>;\n\t.reg .f32 %f<8>;\n\t.reg .b32 %r<8>;\n\t.reg .b64 %rd<32>;\n\t.reg .f64 %fd<4>;\n\
         \t.reg .b16 %rs<8>;\n\t.reg .b128 %q<4>;\n\
         \tld.param.u64 %rd2, [k_in0];\n\tld.param.u64 %rd3, [k_in1];\n\tld.param.u64 %rd4, [k_out];\n\tld.param.u64 %rd5, [k_n];\n\
         \t{prologue}\n\t{guard}\n\
         \tcvta.to.global.u64 %rd8, %rd2;\n\tshl.b64 %rd9, %rd1, 2;\n\tadd.s64 %rd10, %rd8, %rd9;\n\
         \tcvta.to.global.u64 %rd11, %rd3;\n\tadd.s64 %rd12, %rd11, %rd9;\n\
         \tld.global.f32 %f1, [%rd12];\n\tld.global.f32 %f2, [%rd10];\n\tadd.f32 %f3, %f2, %f1;\n\
         \tcvta.to.global.u64 %rd13, %rd4;\n\t{store_addr}\n\t{before_store}\n\
         \tst.global.f32 [%rd14], %f3;\nDONE:\n\tret;\n}}\n"
    )
}

/// Like `kernel` but the output is 8-byte elements and the stored value is
/// `%rd20` (computed by `compute`): for pointer-escape attacks.
pub fn kernel64(compute: &str) -> String {
    format!(
        ".version 8.3\n.target sm_90\n.address_size 64\n\
         .visible .entry k(\n\t.param .u64 k_in0,\n\t.param .u64 k_in1,\n\t.param .u64 k_out,\n\t.param .u64 k_n\n)\n{{\n\
         \t.reg .pred %p<8>;\n\t.reg .f32 %f<8>;\n\t.reg .b32 %r<8>;\n\t.reg .b64 %rd<32>;\n\t.reg .f64 %fd<4>;\n\
         \t.reg .b16 %rs<8>;\n\t.reg .b128 %q<4>;\n\
         \tld.param.u64 %rd2, [k_in0];\n\tld.param.u64 %rd3, [k_in1];\n\tld.param.u64 %rd4, [k_out];\n\tld.param.u64 %rd5, [k_n];\n\
         \t{PROLOGUE}\n\t{GUARD}\n\
         \tcvta.to.global.u64 %rd8, %rd2;\n\tshl.b64 %rd9, %rd1, 2;\n\tadd.s64 %rd10, %rd8, %rd9;\n\
         \tcvta.to.global.u64 %rd11, %rd3;\n\tadd.s64 %rd12, %rd11, %rd9;\n\
         \tld.global.f32 %f1, [%rd12];\n\tld.global.f32 %f2, [%rd10];\n\
         \tcvta.to.global.u64 %rd13, %rd4;\n\tshl.b64 %rd15, %rd1, 3;\n\tadd.s64 %rd14, %rd13, %rd15;\n\
         \t{compute}\n\
         \tst.global.u64 [%rd14], %rd20;\nDONE:\n\tret;\n}}\n"
    )
}

pub fn with_store(before_store: &str) -> String {
    kernel(PROLOGUE, GUARD, STORE_ADDR, before_store)
}
pub fn with_guard(guard: &str) -> String {
    kernel(PROLOGUE, guard, STORE_ADDR, "")
}
pub fn with_prologue(p: &str) -> String {
    kernel(p, GUARD, STORE_ADDR, "")
}
pub fn with_addr(a: &str) -> String {
    kernel(PROLOGUE, GUARD, a, "")
}

/// Returns the names of the attacks that were ACCEPTED (with canonical text).
pub fn run_all(cases: &[(&str, String)]) -> Vec<String> {
    let mut accepted = Vec::new();
    for (name, text) in cases {
        match ptx::canonicalize(text, "k", None) {
            Ok(c) => {
                eprintln!("=== ACCEPTED: {name}\n{}\n", c.text);
                accepted.push((*name).to_string());
            }
            Err(e) => eprintln!("refused: {name}: {e}"),
        }
    }
    accepted
}

/// The cases the daemon accepts only with precondition `name` in their
/// contract (the 32-bit index's `index_fits_i32`, say): an attack on the
/// 64-bit index that is a valid kernel once the launch check holds it to
/// that precondition. Panics on an accepted case without it.
pub fn accepted_only_under(cases: &[(&str, String)], name: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (case, text) in cases {
        if let Ok(c) = ptx::canonicalize(text, "k", None) {
            let names: Vec<&str> = c.contract.preconditions.iter().map(|p| p.name).collect();
            assert!(
                names.contains(&name),
                "{case} is accepted without {name}: {names:?}"
            );
            found.push((*case).to_string());
        }
    }
    found
}
