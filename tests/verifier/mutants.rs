//! Property: any mutant of an accepted kernel that the verifier still
//! accepts never touches memory outside its operands on the host engine in
//! checked mode (random n), and writes the same output whatever its
//! registers held before it wrote them. The mutants are of the canonical
//! text, and of the client's text (calls, frames) before inlining. The fuzz
//! target `verify_oracle` runs the same oracle for as long as one likes;
//! these tests run a bounded sample of it.
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::support::mutants;

use rand::Rng;

/// Accepted kernels of both corpora, canonical, with their entry names.
fn seeds() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files = vec![
        root.join("add_f32_scalar.ptx"),
        root.join("affine_f32_scalar.ptx"),
        root.join("silu_mul_f16_scalar.ptx"),
    ];
    for stem in ["f32_basic", "ints", "casts", "f16_bf16", "hints"] {
        files.push(root.join(format!("nvcc/ptx/{stem}.sm_90.ptx")));
    }
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for func in ptxd::ptx::parse::parse(&text).unwrap().functions {
            if let Ok(c) = ptxd::ptx::canonicalize(&text, &func.name, None) {
                out.push((c.text, func.name));
            }
        }
    }
    out
}

#[test]
fn accepted_mutants_stay_inside_their_operands() {
    let mut r = mutants::seeded_rng("PTXD_MUTANT_SEED");
    let seeds = seeds();
    assert!(seeds.len() > 50, "{} seeds", seeds.len());
    let rounds: usize = mutants::count_from("PTXD_MUTANTS").unwrap_or(1500);
    run_oracle(&seeds, rounds, &mut r, "");
}

/// Accepted kernels as their compiler wrote them, before inlining, with
/// their entry names: the debug builds (`.func` calls with params and
/// return values, `.local` frames) and NVRTC's double `sin` (a struct
/// return, an indexed frame, carry chains).
fn client_seeds() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<std::path::PathBuf> = ["call", "local_memory", "f32_math", "f16_bf16"]
        .iter()
        .map(|stem| root.join(format!("nvcc_g/ptx/{stem}.sm_90.G.ptx")))
        .collect();
    files.push(root.join("jit/nvrtc/sin_f64_O3.ptx"));
    files.push(root.join("jit/nvrtc/add_f16_vec2_G.ptx"));
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for func in ptxd::ptx::parse::parse(&text).unwrap().functions {
            // The entry alone with the module's `.func`s: mutations land
            // where they count.
            let own = only_entry(&text, &func.name);
            if ptxd::ptx::canonicalize(&own, &func.name, None).is_ok() {
                out.push((own, func.name));
            }
        }
    }
    out
}

/// `text` without its entries other than `entry` (each a block from its
/// `.entry` line to the `}` that closes it at the start of a line).
fn only_entry(text: &str, entry: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.contains(".entry ") {
            skipping = !line.contains(&format!(".entry {entry}("));
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
        if line == "}" {
            skipping = false;
        }
    }
    out
}

/// The same oracle over mutants of the client's text, not the canonical
/// one: mutations land in callees, in the call sequences' param moves and
/// in frame accesses, before the inliner and the frame proof see them.
#[test]
fn accepted_mutants_of_client_text_stay_inside_their_operands() {
    let mut r = mutants::seeded_rng("PTXD_MUTANT_SEED");
    let seeds = client_seeds();
    assert!(seeds.len() >= 10, "{} seeds", seeds.len());
    let rounds: usize = mutants::count_from("PTXD_MUTANTS")
        // A fifth of PTXD_MUTANTS: each costs about five canonical ones.
        .map_or(200, |n: usize| n / 5);
    run_oracle(&seeds, rounds, &mut r, "client-text ");
}

/// `rounds` mutants of random `seeds` through the oracle (each accepted
/// one run in bounds, or a panic naming it); the sample must exercise both
/// sides of the verifier. `what` names the mutants in the printed line.
fn run_oracle(seeds: &[(String, String)], rounds: usize, r: &mut impl Rng, what: &str) {
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..rounds {
        let (text, symbol) = &seeds[r.random_range(0..seeds.len())];
        let mutant = mutants::mutate(text, r);
        match mutants::oracle(&mutant, symbol, r) {
            Ok(true) => accepted += 1,
            Ok(false) => refused += 1,
            Err(e) => panic!("{e}\n--- mutant of {symbol} ---\n{mutant}"),
        }
    }
    eprintln!("{accepted} {what}mutants accepted and ran in bounds, {refused} refused");
    assert!(
        accepted > rounds / 20 && refused > rounds / 20,
        "{accepted} / {refused}"
    );
}
