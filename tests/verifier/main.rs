//! The verifier's suites, one module per subject: what it refuses (attacks,
//! red-team sweeps, the closed classes, mutants), what it accepts from real
//! compilers (the corpora, with the host engine against a reference), the
//! canonical text that runs, and the verifier inside the daemon.

#[path = "../support/mod.rs"]
mod support;

mod attacks;
mod broadcast;
mod calls;
mod canonical;
mod canonical_daemon;
mod classes;
mod contracts;
mod corpus;
mod frames;
mod mutants;
mod nvcc_corpus;
mod red_team;
mod red_team2;
mod review_attacks;
mod review_attacks2;
mod review_attacks3;
mod review_attacks4;
mod review_attacks5;
mod review_attacks6;
mod strided;
mod struct_returns;
mod triton;
mod triton_attacks;
mod verification;

/// A fresh seed, printed so a failure can be replayed.
fn rng(what: &str) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    let seed: u64 = rand::random();
    eprintln!("{what}: seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// The refusal's (sub_reason, explanation) of `entry` of `text`, with every
/// family: panics when it is accepted.
#[allow(clippy::panic)]
fn refusal(text: &str, entry: &str) -> (&'static str, String) {
    match ptxd::ptx::canonicalize_with(text, entry, None, ptxd::ptx::Families::ALL) {
        Err(ptxd::ptx::PtxError::NonScalarAbi {
            sub_reason,
            explanation,
            ..
        }) => (sub_reason, explanation),
        other => panic!("expected a refusal, got {other:?}\n{text}"),
    }
}
