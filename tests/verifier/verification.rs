//! The verifier inside the daemon (host backend): a refusal is remembered by
//! content and a second identical load is answered from the memo with the
//! same refusal; concurrent verifications are bounded per uid; the large
//! generated kernels of the verify benchmark get the verdicts they are built
//! to get.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{big_kernels, corpus, meta, Daemon};
use ptxd_client::{Client, LoadOptions, Session};

async fn session(daemon: &Daemon) -> (Client, Session) {
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("verification").await.unwrap();
    (client, session)
}

/// The daemon's debug lines saying a refusal was served from the memo.
fn served_from_memo(daemon: &Daemon) -> usize {
    daemon
        .stderr()
        .lines()
        .filter(|l| l.contains("PTX refused again") && l.contains("served=\"memo\""))
        .count()
}

/// The log filter that shows the LoadKernel path's debug lines.
const KERNELS_DEBUG: &str = "warn,ptxd::front::kernels=debug";

#[tokio::test]
async fn a_second_identical_refused_load_is_answered_from_the_memo() {
    let daemon = Daemon::start_with(&[], |c| {
        c.env("RUST_LOG", KERNELS_DEBUG);
    });
    let (_client, session) = session(&daemon).await;
    for (text, symbol) in [
        (
            corpus("nvcc/refused-ptx/grid_stride.sm_90.ptx"),
            "grid_stride_scale_f32",
        ),
        (big_kernels::refused(64 << 10), "big_hostile"),
    ] {
        let served_before = served_from_memo(&daemon);
        let first = session
            .load_ptx(0, text.clone(), symbol, LoadOptions::default())
            .await
            .unwrap_err();
        assert_eq!(first.reason_name(), "NON_SCALAR_ABI", "{first}");
        assert_eq!(
            served_from_memo(&daemon),
            served_before,
            "the first load is verified"
        );
        let second = session
            .load_ptx(0, text.clone(), symbol, LoadOptions::default())
            .await
            .unwrap_err();
        // The identical refusal: code, reason and every metadata value
        // (sub_reason, line, explanation).
        let (a, b) = (first.refusal().unwrap(), second.refusal().unwrap());
        assert_eq!(a.code(), b.code());
        assert_eq!(a.wire_name(), b.wire_name());
        assert_eq!(a.metadata(), b.metadata());
        assert!(!meta(&second, "sub_reason").is_empty());
        assert_eq!(
            served_from_memo(&daemon),
            served_before + 1,
            "the second load was not answered from the memo:\n{}",
            daemon.stderr()
        );
        // One byte more is another text, verified again.
        let other = session
            .load_ptx(0, format!("{text}\n"), symbol, LoadOptions::default())
            .await
            .unwrap_err();
        assert_eq!(other.reason_name(), "NON_SCALAR_ABI");
        assert_eq!(served_from_memo(&daemon), served_before + 1);
    }
    // Accepted kernels still load (and their repeat is a cache hit).
    let add = corpus("add_f32_scalar.ptx");
    session
        .load_ptx(0, add.clone(), "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    let again = session
        .load_ptx(0, add, "add_f32_scalar", LoadOptions::default())
        .await
        .unwrap();
    assert!(again.state().cache_hit);
}

#[tokio::test]
async fn a_uids_burst_of_verifications_waits_and_only_past_its_queue_is_refused() {
    // Each verification takes at least 300 ms (the daemon's test hook), so
    // the loads below all arrive while the first still runs.
    let daemon = Daemon::start_with(&["--max-concurrent-verifications-per-uid", "1"], |c| {
        c.env("PTXD_TEST_VERIFICATION_DELAY_MS", "300");
    });
    let (_client, session) = session(&daemon).await;
    // Distinct texts (none in the memo): one place to run, so a queue of
    // 16 (the gate's queue factor) runs or waits and the rest are refused.
    let session = &session;
    let queue = ptxd_queue_factor();
    let loads = (0..queue + 4).map(|k| {
        let text = format!("{}\n// {k}\n", corpus("add_f32_scalar.ptx"));
        async move {
            session
                .load_ptx(0, text, "add_f32_scalar", LoadOptions::default())
                .await
        }
    });
    let results = futures_util::future::join_all(loads).await;
    let mut loaded = 0;
    let mut over = 0;
    for result in &results {
        match result {
            Ok(_) => loaded += 1,
            Err(e) => {
                assert_eq!(e.reason_name(), "LIMIT_EXCEEDED", "{e}");
                assert_eq!(e.refusal().unwrap().code(), tonic::Code::ResourceExhausted);
                assert_eq!(meta(e, "limit"), "max_concurrent_verifications_per_uid");
                assert_eq!(meta(e, "value"), "1");
                over += 1;
            }
        }
    }
    // A burst within the queue waits its turn and loads; only what came
    // past it was refused, at once.
    assert_eq!((loaded, over), (queue, 4));
    // The places are given back: the next loads are verified and load, and
    // a repeat of an accepted text is answered from the memo (no place).
    for k in 0..2 {
        let text = format!("{}\n// again {k}\n", corpus("add_f32_scalar.ptx"));
        session
            .load_ptx(0, text, "add_f32_scalar", LoadOptions::default())
            .await
            .unwrap();
    }
}

/// The gate's queue: running or waiting verifications per uid, as a
/// multiple of `--max-concurrent-verifications-per-uid`.
fn ptxd_queue_factor() -> usize {
    ptxd::front::VERIFICATION_QUEUE_FACTOR as usize
}

#[test]
fn the_generated_kernels_get_the_verdicts_they_are_built_for() {
    for bytes in [1 << 10, 16 << 10, 32 << 10] {
        let accepted = big_kernels::accepted(bytes);
        assert!(accepted.len() >= bytes && accepted.len() < bytes + 1024);
        let canonical = ptxd::ptx::canonicalize(&accepted, "big_add", None)
            .unwrap_or_else(|e| panic!("{bytes}: {e}"));
        assert_eq!(canonical.signature.inputs, 2);
        let refused = big_kernels::refused(bytes);
        assert!(refused.len() >= bytes && refused.len() < bytes + 1024);
        match ptxd::ptx::canonicalize(&refused, "big_hostile", None) {
            // Refused by the verifier's own cost cap (blocks × registers)
            // before it walks the chain.
            Err(ptxd::ptx::PtxError::NonScalarAbi {
                sub_reason: "too_complex",
                ..
            }) => {}
            Err(ptxd::ptx::PtxError::NonScalarAbi { line, .. }) => {
                // Refused at the data-addressed store, after the chain.
                let stored = refused
                    .lines()
                    .position(|l| l.contains("st.global.f32 [%rd14]"))
                    .unwrap()
                    + 1;
                assert!(
                    line.is_some_and(|l| l as usize >= stored - 3),
                    "{bytes}: refused at line {line:?}, the store is at {stored}"
                );
            }
            other => panic!("{bytes}: {other:?}"),
        }
    }
}

/// The options of a text's `.target` directive (`sm_90`, `debug`, ...).
fn target_options(text: &str) -> Vec<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(".target"))
        .map(|rest| {
            rest.split(',')
                .map(|o| o.trim().trim_end_matches(';').to_string())
                .filter(|o| !o.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 20: the canonical text of a `-G` build dropped `, debug`, and
/// ptxas then contracted `mul` + `add` into `fma` where the client's text
/// does not (4 kernels of `tests/corpus/nvcc_g` differ on the H200); and
/// keeping `debug` without debug sections is refused by the driver's JIT.
/// So every other option is kept, `debug` goes, and no float add/sub/mul is
/// left that ptxas could contract.
#[test]
fn canonical_text_of_debug_builds_keeps_what_debug_means() {
    let dir = std::path::Path::new(crate::support::CORPUS).join("nvcc_g/ptx");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 20, "{}", dir.display());
    let (mut accepted, mut lost) = (0, Vec::new());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut want = target_options(&text);
        assert!(want.iter().any(|o| o == "debug"), "{}", file.display());
        want.retain(|o| o != "debug");
        for function in ptxd::ptx::parse::parse(&text).unwrap().functions {
            let Ok(canonical) = ptxd::ptx::canonicalize(&text, &function.name, None) else {
                continue;
            };
            accepted += 1;
            let got = target_options(&canonical.text);
            let contractible = canonical.text.lines().find(|l| {
                let op = l.split_whitespace().next().unwrap_or("");
                let mut parts = op.split('.');
                let base = parts.next().unwrap_or("");
                let mods: Vec<&str> = parts.collect();
                ["add", "sub", "mul"].contains(&base)
                    && mods
                        .iter()
                        .any(|m| m.starts_with('f') || m.starts_with("bf"))
                    && !mods.iter().any(|m| ["rn", "rz", "rm", "rp"].contains(m))
            });
            if got != want || contractible.is_some() {
                lost.push(format!(
                    "{} {}: {got:?} instead of {want:?}; {contractible:?}",
                    file.file_name().unwrap().to_string_lossy(),
                    function.name
                ));
            }
        }
    }
    assert!(accepted >= 100, "{accepted} accepted entries");
    assert!(
        lost.is_empty(),
        "{} of {accepted}:\n{}",
        lost.len(),
        lost.join("\n")
    );
}

/// Issue 20's first class, as the GPU oracle found it on the H200
/// (`tests/corpus/oracle_findings`): each of these reads a register whose
/// only write is predicated on the guard, false where the read runs, and
/// its output held the previous kernel's registers. Fails until the
/// verifier asks whether every register read was written on every path.
#[test]
fn kernels_the_gpu_oracle_caught_leaking_registers_are_refused() {
    let dir = std::path::Path::new(crate::support::CORPUS).join("oracle_findings");
    for (file, symbol) in [
        ("attacker-predicated_write.ptx", "predicated_write"),
        ("finding-246-add_i64.ptx", "add_i64"),
        (
            "finding-92-add_f32_asm_st_evict_first.ptx",
            "add_f32_asm_st_evict_first",
        ),
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        match ptxd::ptx::canonicalize(&text, symbol, None) {
            Err(ptxd::ptx::PtxError::NonScalarAbi { sub_reason, .. }) => {
                eprintln!("{file}: refused ({sub_reason})");
            }
            other => panic!("{file}: {other:?}"),
        }
    }
}
