//! The verifier's classes of issue 20, each closed by construction and
//! tested as a class: registers defined before use, every operand in a
//! modelled role, params inside the model and inside their own size, a
//! canonical text that keeps what changes code generation, and bounded
//! verification cost. Every refusal asserts its exact sub_reason; every
//! accepted kernel that runs is checked element by element against a
//! reference on the host engine, from fresh random inputs into a poisoned
//! output.
#![allow(clippy::unwrap_used, clippy::panic)]

#[path = "support/attack_kernels.rs"]
mod attack_kernels;

use attack_kernels::{kernel64, with_guard, with_store};
use ptxd::ptx::{self, HostKernel, HostLaunch, HostSpan, PtxError, SubReason};
use rand::{Rng, SeedableRng};

/// The sub_reason of the refusal of `symbol` in `text` (canonicalize: the
/// path a load takes).
fn refusal_of(text: &str, symbol: &str) -> &'static str {
    match ptx::canonicalize(text, symbol, None) {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => sub_reason,
        other => panic!("expected a NON_SCALAR_ABI refusal, got {other:?}\n{text}"),
    }
}

fn refusal(text: &str) -> &'static str {
    refusal_of(text, "k")
}

fn canonical(text: &str, symbol: &str) -> ptx::Canonical {
    ptx::canonicalize(text, symbol, None).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Runs `text`'s canonical form on the host engine over `inputs` (f32
/// elements) with `params`; returns the f32 output of `n` elements (the
/// output buffer starts poisoned, and nothing past `n` may change).
fn run_f32(text: &str, symbol: &str, inputs: &[Vec<f32>], params: &[f32], n: usize) -> Vec<f32> {
    let c = canonical(text, symbol);
    let k = HostKernel::compile(&c.text, symbol).unwrap_or_else(|e| panic!("{e}\n{}", c.text));
    let mut bufs: Vec<Vec<u8>> = inputs
        .iter()
        .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let poison = f32::from_bits(0x7fc0_dead);
    let mut out: Vec<u8> = std::iter::repeat_n(poison.to_le_bytes(), n + 8)
        .flatten()
        .collect();
    let spans: Vec<HostSpan> = bufs
        .iter_mut()
        .map(|b| HostSpan {
            ptr: b.as_mut_ptr(),
            len: b.len(),
        })
        .collect();
    let l = HostLaunch {
        inputs: &spans,
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n: n as u64,
        params,
        threads: 3,
        checked: true,
        control: None,
    };
    // SAFETY: every span is a live Vec of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap_or_else(|e| panic!("{e}\n{}", c.text));
    let all: Vec<f32> = out
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert!(
        all[n..].iter().all(|x| x.to_bits() == poison.to_bits()),
        "written past n"
    );
    all[..n].to_vec()
}

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(rand::rng().random())
}

fn rand_f32(r: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-100.0f32..100.0)).collect()
}

// ---------------------------------------------------------------------
// 1. Defined before use.
// ---------------------------------------------------------------------

#[test]
fn a_register_never_written_is_refused() {
    // The leak: store a register nothing wrote.
    assert_eq!(refusal(&kernel64("")), "undefined_register");
    // Read as a source, an address base, a guard.
    assert_eq!(
        refusal(&with_store("add.f32 %f3, %f3, %f5;")),
        "undefined_register"
    );
    assert_eq!(
        refusal(&with_store("mov.b32 %r4, %r5;")),
        "undefined_register"
    );
    assert_eq!(
        refusal(&with_store("@%p5 mov.f32 %f3, 0f00000000;")),
        "undefined_register"
    );
    // (An undefined address base is refused earlier, by the address proof:
    // it is no `param + i × s`.)
    assert_eq!(
        refusal(&with_store(
            "ld.global.f32 %f4, [%rd21];\n\tadd.f32 %f3, %f3, %f4;"
        )),
        "non_elementwise_address"
    );
    // Part of a pack.
    assert_eq!(
        refusal(&kernel64("mov.b64 %rd20, {%r4, %r5};")),
        "undefined_register"
    );
}

#[test]
fn a_predicated_write_defines_nothing() {
    // Written only when %p2 holds: on the other path it holds what the
    // last kernel left.
    let k = kernel64("setp.eq.s64 %p2, %rd1, 3;\n\t@%p2 mov.u64 %rd20, 7;");
    assert_eq!(refusal(&k), "undefined_register");
    // Both arms predicated: still no definition (the analysis does not
    // reason about predicates).
    let k =
        kernel64("setp.eq.s64 %p2, %rd1, 3;\n\t@%p2 mov.u64 %rd20, 7;\n\t@!%p2 mov.u64 %rd20, 8;");
    assert_eq!(refusal(&k), "undefined_register");
    // The same written unpredicated first is fine.
    let k = kernel64("mov.u64 %rd20, 0;\n\tsetp.eq.s64 %p2, %rd1, 3;\n\t@%p2 mov.u64 %rd20, 7;");
    ptx::canonicalize(&k, "k", None).unwrap_or_else(|e| panic!("{e}\n{k}"));
}

#[test]
fn a_write_on_one_path_only_is_refused_and_on_every_path_accepted() {
    // Written on the fall-through path only.
    let one = kernel64("setp.eq.s64 %p2, %rd1, 3;\n\t@%p2 bra SKIP;\n\tmov.u64 %rd20, 7;\nSKIP:");
    assert_eq!(refusal(&one), "undefined_register");
    // Written on both paths.
    let both = kernel64(
        "setp.eq.s64 %p2, %rd1, 3;\n\t@%p2 bra ELSE;\n\tmov.u64 %rd20, 7;\n\tbra JOIN;\nELSE:\n\tmov.u64 %rd20, 8;\nJOIN:",
    );
    ptx::canonicalize(&both, "k", None).unwrap_or_else(|e| panic!("{e}\n{both}"));
    // A loop that reads what its own body writes later: undefined on entry.
    let lp = with_store(
        "mov.u32 %r4, 0;\nLOOP:\n\tadd.f32 %f3, %f3, %f6;\n\tmov.f32 %f6, 0f3F800000;\n\tadd.s32 %r4, %r4, 1;\n\tsetp.lt.s32 %p3, %r4, 4;\n\t@%p3 bra LOOP;",
    );
    assert_eq!(refusal(&lp), "undefined_register");
}

#[test]
fn pair_and_list_destinations_define_every_part() {
    // `setp` into a pair defines both predicates.
    let k = kernel64("setp.eq.s64 %p2|%p3, %rd1, 3;\n\tselp.u64 %rd20, 1, 2, %p3;");
    ptx::canonicalize(&k, "k", None).unwrap_or_else(|e| panic!("{e}\n{k}"));
    // `mov` unpacking defines both halves.
    let k =
        kernel64("mov.u64 %rd21, 5;\n\tmov.b64 {%r4, %r5}, %rd21;\n\tmov.b64 %rd20, {%r5, %r4};");
    ptx::canonicalize(&k, "k", None).unwrap_or_else(|e| panic!("{e}\n{k}"));
    // A predicate read before it is written is the same class.
    let k = with_guard("@%p1 bra DONE;\n\tsetp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra DONE;");
    assert_eq!(refusal(&k), "undefined_register");
}

#[test]
fn the_refusal_names_the_register_and_the_line() {
    let text = with_store("add.f32 %f3, %f3, %f5;");
    match ptx::canonicalize(&text, "k", None) {
        Err(PtxError::NonScalarAbi {
            sub_reason,
            line,
            explanation,
            ..
        }) => {
            assert_eq!(sub_reason, SubReason::UndefinedRegister.as_str());
            assert!(explanation.contains("%f5"), "{explanation}");
            let line = line.unwrap() as usize;
            assert!(
                text.lines().nth(line - 1).unwrap().contains("%f5"),
                "line {line}"
            );
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------
// 2. Every operand has a modelled role.
// ---------------------------------------------------------------------

#[test]
fn forms_outside_the_table_are_refused_naming_opcode_and_modifier() {
    for (body, want, named) in [
        // A modifier that is no `Modifier` variant (a carry flag).
        (
            "add.cc.s32 %r4, %r1, %r2;",
            "unsupported_instruction",
            ".cc",
        ),
        // An opcode that is no `Opcode` variant.
        ("addc.s32 %r4, %r1, %r2;", "unsupported_instruction", "addc"),
        // An operand count no form has.
        ("add.f32 %f3, %f3;", "unmodelled_operand", "add.f32"),
        (
            "add.f32 %f3, %f3, %f2, %f1;",
            "unmodelled_operand",
            "add.f32",
        ),
        // A label as data, a non-predicate as a guard operand.
        ("mov.u64 %rd21, DONE;", "unmodelled_operand", "mov.u64"),
        (
            "selp.f32 %f3, %f3, %f2, %r1;",
            "unmodelled_operand",
            "selp.f32",
        ),
        // A data value in the cache-policy slot of a load without the hint.
        (
            "ld.global.f32 %f4, [%rd10], %rd21;",
            "unmodelled_operand",
            "ld.global.f32",
        ),
    ] {
        let text = with_store(body);
        match ptx::canonicalize(&text, "k", None) {
            Err(PtxError::NonScalarAbi {
                sub_reason,
                explanation,
                ..
            }) => {
                assert_eq!(sub_reason, want, "{body}");
                assert!(explanation.contains(named), "{body}: {explanation}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[test]
fn the_cache_hint_is_dropped_and_results_do_not_change() {
    let mut r = rng();
    let n = 1000;
    let a = rand_f32(&mut r, n);
    let b = rand_f32(&mut r, n);
    let plain = with_store("");
    let hinted = plain
        .replace(
            "ld.global.f32 %f1, [%rd12];",
            "mov.u64 %rd21, 12345;\n\tld.global.L2::cache_hint.f32 %f1, [%rd12], %rd21;",
        )
        .replace(
            "st.global.f32 [%rd14], %f3;",
            "st.global.L2::cache_hint.f32 [%rd14], %f3, %rd2;",
        );
    let c = canonical(&hinted, "k");
    assert!(!c.text.contains("cache_hint"), "{}", c.text);
    let got = run_f32(&hinted, "k", &[a.clone(), b.clone()], &[], n);
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
}

// ---------------------------------------------------------------------
// 3. Params inside the model and inside their own size.
// ---------------------------------------------------------------------

/// `k(in0..in63, out, n, f0..f63)`: 130 params, the most the layout
/// allows; `out[i] = in0[i] + .. + in63[i] + f63` plus whatever `extra`
/// computes into `%f9` (added too).
fn wide_kernel(extra: &str) -> String {
    let mut s = String::from(".version 8.3\n.target sm_90\n.address_size 64\n.visible .entry k(\n");
    let mut params = Vec::new();
    for j in 0..64 {
        params.push(format!("\t.param .u64 k_in{j}"));
    }
    params.push("\t.param .u64 k_out".into());
    params.push("\t.param .u64 k_n".into());
    for j in 0..64 {
        params.push(format!("\t.param .f32 k_f{j}"));
    }
    s += &params.join(",\n");
    s += "\n)\n{\n\t.reg .pred %p<4>;\n\t.reg .f32 %f<200>;\n\t.reg .b32 %r<8>;\n\t.reg .b64 %rd<400>;\n";
    s += "\tld.param.u64 %rd2, [k_out];\n\tld.param.u64 %rd3, [k_n];\n";
    s += "\tmov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;\n";
    s += "\tsetp.ge.s64 %p1, %rd1, %rd3;\n\t@%p1 bra DONE;\n\tshl.b64 %rd9, %rd1, 2;\n";
    s += "\tld.param.f32 %f0, [k_f63];\n\tmov.f32 %f9, 0f00000000;\n";
    s += &format!("\t{extra}\n");
    s += "\tadd.f32 %f0, %f0, %f9;\n";
    for j in 0..64 {
        let (p, g, a, v) = (100 + j, 200 + j, 300 + j, 10 + j);
        s += &format!(
            "\tld.param.u64 %rd{p}, [k_in{j}];\n\tcvta.to.global.u64 %rd{g}, %rd{p};\n\tadd.s64 %rd{a}, %rd{g}, %rd9;\n\tld.global.f32 %f{v}, [%rd{a}];\n\tadd.f32 %f0, %f0, %f{v};\n"
        );
    }
    s += "\tcvta.to.global.u64 %rd10, %rd2;\n\tadd.s64 %rd11, %rd10, %rd9;\n\tst.global.f32 [%rd11], %f0;\nDONE:\n\tret;\n}\n";
    s
}

#[test]
fn the_last_of_130_params_is_modelled_and_runs() {
    let text = wide_kernel("ld.param.f32 %f9, [k_f62];");
    let c = canonical(&text, "k");
    assert_eq!((c.signature.inputs, c.signature.scalar_params), (64, 64));
    let mut r = rng();
    let n = 300;
    let inputs: Vec<Vec<f32>> = (0..64).map(|_| rand_f32(&mut r, n)).collect();
    let params = rand_f32(&mut r, 64);
    let got = run_f32(&text, "k", &inputs, &params, n);
    for i in 0..n {
        let mut want = params[63] + params[62];
        for input in &inputs {
            want += input[i];
        }
        assert_eq!(got[i].to_bits(), want.to_bits(), "element {i}");
    }
}

#[test]
fn a_param_access_outside_its_own_param_is_refused() {
    for extra in [
        // Past the end of the last param (index 129): ptxas wraps it.
        "ld.param.f32 %f9, [k_f63+100000];",
        "ld.param.f32 %f9, [k_f63+4];",
        // Index 128, the first without a bit in a 128-bit mask.
        "ld.param.f32 %f9, [k_f62+2];",
        // Wider than the param.
        "ld.param.u64 %rd20, [k_f63];\n\tmov.b64 {%r4, %r5}, %rd20;\n\tmov.b32 %f9, %r4;",
        // Negative offsets, and a pointer param read past its 8 bytes.
        "ld.param.f32 %f9, [k_f0-4];",
        "ld.param.u64 %rd20, [k_in0+8];\n\tmov.b64 {%r4, %r5}, %rd20;\n\tmov.b32 %f9, %r4;",
        "ld.param.u32 %r4, [k_in63+6];\n\tmov.b32 %f9, %r4;",
    ] {
        assert_eq!(
            refusal(&wide_kernel(extra)),
            "param_out_of_range",
            "{extra}"
        );
    }
}

#[test]
fn more_params_than_the_layout_allows_are_refused() {
    let text = wide_kernel("").replace(
        "\t.param .f32 k_f63\n",
        "\t.param .f32 k_f63,\n\t.param .f32 k_f64\n",
    );
    assert_eq!(refusal(&text), "param_count");
}

// ---------------------------------------------------------------------
// 4. The canonical text compiles like the client's.
// ---------------------------------------------------------------------

#[test]
fn every_target_option_is_kept() {
    let text = with_store("").replace(".target sm_90", ".target sm_90, debug");
    let c = canonical(&text, "k");
    assert!(c.text.contains(".target sm_90, debug\n"), "{}", c.text);
    let text = with_store("").replace(".target sm_90", ".target sm_90a, map_f64_to_f32");
    let c = canonical(&text, "k");
    assert!(
        c.text.contains(".target sm_90a, map_f64_to_f32\n"),
        "{}",
        c.text
    );
    // An option ptxd does not know, or two architectures: refused, never
    // dropped.
    for target in [".target sm_90, fancy", ".target sm_90, sm_80"] {
        let text = with_store("").replace(".target sm_90", target);
        assert_eq!(refusal(&text), "canonical_form", "{target}");
    }
}

#[test]
fn directives_that_change_code_generation_are_kept_or_refused() {
    let kept = with_store("").replace(
        "\n)\n{",
        "\n)\n.maxntid 256, 1, 1\n.minnctapersm 2\n.maxnreg 40\n{",
    );
    let c = canonical(&kept, "k");
    for d in [".maxntid 256, 1, 1", ".minnctapersm 2", ".maxnreg 40"] {
        assert!(c.text.contains(d), "{d}:\n{}", c.text);
    }
    for (what, text) in [
        ("body pragma", with_store(".pragma \"nounroll\";")),
        (
            "entry pragma",
            with_store("").replace("\n)\n{", "\n)\n.pragma \"nounroll\";\n{"),
        ),
        (
            "module pragma",
            with_store("").replace(
                ".address_size 64\n",
                ".address_size 64\n.pragma \"nounroll\";\n",
            ),
        ),
        (
            "cluster rank",
            with_store("").replace("\n)\n{", "\n)\n.maxclusterrank 2\n{"),
        ),
        (
            "cluster dims",
            with_store("").replace("\n)\n{", "\n)\n.reqnctapercluster 2, 1, 1\n{"),
        ),
        (
            "noreturn",
            with_store("").replace("\n)\n{", "\n)\n.noreturn\n{"),
        ),
    ] {
        assert_eq!(refusal(&text), "canonical_form", "{what}");
    }
}
