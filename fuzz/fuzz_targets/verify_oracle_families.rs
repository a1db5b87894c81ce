//! The verifier's memory-safety property under libFuzzer, for the families
//! beyond the scalar ABI (issue 21): the input seeds a random mutation of
//! an accepted JIT-corpus kernel (`tests/corpus/jit/`). A Triton or
//! Inductor kernel is mutated as `mutants::mutate_triton` does and judged
//! by `mutants::triton_oracle` (every global access of a few blocks
//! checked against its contract footprint); an NVRTC kernel (the scalar
//! ABI with `.func` calls, local frames, struct returns and carry chains)
//! by `mutants::mutate` and `mutants::oracle` (run on the host engine in
//! checked mode over operands of exactly `n` elements). Any accepted
//! mutant that touches a byte its contract does not grant is a crash.
//!
//! `cargo fuzz run verify_oracle_families` from `fuzz/`.
#![no_main]

#[path = "../../tests/support/mutants.rs"]
mod mutants;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use ptxd::ptx::Families;
use rand::SeedableRng;

/// A seed kernel: its canonical text, its entry, and whether it is judged
/// by the Triton oracle.
type Seed = (String, String, bool);

fn seeds() -> &'static Vec<Seed> {
    static SEEDS: OnceLock<Vec<Seed>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/corpus/jit");
        let mut out = Vec::new();
        for (dir, triton) in [("nvrtc", false), ("triton", true), ("inductor", true)] {
            let Ok(entries) = std::fs::read_dir(format!("{root}/{dir}")) else {
                continue;
            };
            let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for f in files {
                if f.extension().and_then(|e| e.to_str()) != Some("ptx") {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(&f) else { continue };
                let Ok(module) = ptxd::ptx::parse::parse(&text) else { continue };
                for func in module.functions {
                    let accepted = if triton {
                        ptxd::ptx::canonicalize_with(&text, &func.name, None, Families::ALL)
                    } else {
                        ptxd::ptx::canonicalize(&text, &func.name, None)
                    };
                    if let Ok(c) = accepted {
                        out.push((c.text, func.name, triton));
                    }
                }
            }
        }
        assert!(!out.is_empty(), "no seed kernels under {root}");
        out
    })
}

fuzz_target!(|data: &[u8]| {
    let mut seed = [0u8; 32];
    for (i, b) in data.iter().enumerate() {
        seed[i % 32] ^= b.rotate_left((i / 32) as u32);
    }
    let mut r = rand::rngs::StdRng::from_seed(seed);
    let seeds = seeds();
    let pick = data
        .get(..2)
        .map(|b| usize::from(b[0]) << 8 | usize::from(b[1]))
        .unwrap_or(0);
    let (text, symbol, triton) = &seeds[pick % seeds.len()];
    let mutate = |t: &str, r: &mut rand::rngs::StdRng| {
        if *triton {
            mutants::mutate_triton(t, r)
        } else {
            mutants::mutate(t, r)
        }
    };
    let mut mutant = mutate(text, &mut r);
    // Longer inputs stack more mutations.
    for _ in 0..data.len() / 64 {
        mutant = mutate(&mutant, &mut r);
    }
    let judged = if *triton {
        mutants::triton_oracle(&mutant, symbol, &mut r)
    } else {
        mutants::oracle(&mutant, symbol, &mut r)
    };
    if let Err(e) = judged {
        panic!("{e}\n--- mutant of {symbol} ---\n{mutant}");
    }
});
