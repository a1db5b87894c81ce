//! The verifier's memory-safety property under libFuzzer: the input seeds a
//! random mutation of an accepted corpus kernel (see
//! `tests/support/mutants.rs`); any mutant the verifier accepts must run on
//! the host engine, in checked mode over operands of exactly `n` elements,
//! without touching anything else. A fault is a crash.
#![no_main]

#[path = "../../tests/support/mutants.rs"]
mod mutants;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;

fn seeds() -> &'static Vec<(String, String)> {
    static SEEDS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/corpus");
        let mut files = vec![
            format!("{root}/add_f32_scalar.ptx"),
            format!("{root}/affine_f32_scalar.ptx"),
            format!("{root}/silu_mul_f16_scalar.ptx"),
        ];
        for stem in ["f32_basic", "f32_math", "f64", "ints", "casts", "f16_bf16", "hints"] {
            files.push(format!("{root}/nvcc/ptx/{stem}.sm_90.ptx"));
        }
        let mut out = Vec::new();
        for f in files {
            let Ok(text) = std::fs::read_to_string(&f) else { continue };
            let Ok(module) = ptxd::ptx::parse::parse(&text) else { continue };
            for func in module.functions {
                if let Ok(c) = ptxd::ptx::canonicalize(&text, &func.name, None) {
                    out.push((c.text, func.name));
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
    let (text, symbol) = &seeds[usize::from(data.first().copied().unwrap_or(0)) % seeds.len()];
    let mut mutant = mutants::mutate(text, &mut r);
    // Longer inputs stack more mutations.
    for _ in 0..data.len() / 64 {
        mutant = mutants::mutate(&mutant, &mut r);
    }
    if let Err(e) = mutants::oracle(&mutant, symbol, &mut r) {
        panic!("{e}\n--- mutant of {symbol} ---\n{mutant}");
    }
});
