//! Review attacks (w32r) on what w30b and w30d added: the ring's launch
//! check (the Strided family's args, division, saturating subtraction,
//! min and `>=` preconditions), the launch contract's arithmetic on the
//! unary path, and the persistent verdict cache. Each hole found has a
//! test asserting its exact refusal; each class that held is asserted too.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ptxd::front::verdict_cache::{VerdictCache, SUBDIRECTORY};
use ptxd::ptx::memo::Accepted;
use ptxd::ptx::{self, PtxError};

use crate::support::{corpus, Daemon};

/// `add_f32_scalar` storing 4096 bytes past element i: a kernel the
/// verifier refuses (`non_elementwise_address`), as a client sends it.
fn out_of_bounds_add() -> String {
    let text = corpus("add_f32_scalar.ptx");
    let store = "\tst.global.f32 \t[%rd14], %f3;";
    assert!(text.contains(store));
    text.replace(
        store,
        "\tadd.s64 \t%rd14, %rd14, 4096;\n\tst.global.f32 \t[%rd14], %f3;",
    )
}

/// The verdict an attacker plants for `out_of_bounds_add`: its own text
/// as the canonical text (so the executor would compile the out-of-bounds
/// store) with the benign kernel's signature and contract, consistent in
/// every way the cache checks (hash, names, operands).
fn forged_verdict() -> (String, Accepted) {
    let bad = out_of_bounds_add();
    match ptx::canonicalize(&bad, "add_f32_scalar", None) {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => {
            assert_eq!(sub_reason, "non_elementwise_address")
        }
        other => panic!("the verifier must refuse the forged kernel: {other:?}"),
    }
    let mut canonical =
        ptx::canonicalize(&corpus("add_f32_scalar.ptx"), "add_f32_scalar", None).unwrap();
    canonical.text = bad.clone();
    let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
    (bad, Accepted { canonical, hash })
}

/// The one entry file under a verdict directory.
fn the_entry(verdicts: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(verdicts)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries.into_iter().next().unwrap()
}

/// What another local user leaves in a verdict directory that was
/// writable by others: an entry of theirs (owned by `nobody` where this
/// test can chown, i.e. runs as root) with their umask's mode.
fn plant(entry: &Path, mode: u32, other_owner: bool) {
    if other_owner {
        std::os::unix::fs::chown(entry, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(entry, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Class: trust inherited from a directory others could write. The cache
/// makes its directory 0700 when it opens, but an entry another user put
/// there before (the directory group-shared or `mkdir -m 777`) was kept
/// and served as the verifier's verdict: here an out-of-bounds store with
/// the benign kernel's contract. Now an entry owned by another user, or
/// writable by group or others, is a miss and is deleted; the daemon's
/// own entries (0600) are still served.
#[test]
fn a_verdict_another_user_could_have_written_is_a_miss() {
    let (bad, forged) = forged_verdict();
    let mut cases = vec![(0o666, false), (0o620, false), (0o602, false)];
    if is_root() {
        cases.extend([(0o644, true), (0o600, true)]);
    } else {
        eprintln!("not root: the owner cases are not run (chown needs root)");
    }
    for (mode, other_owner) in cases {
        let dir = tempfile::tempdir().unwrap();
        let verdicts = dir.path().join(SUBDIRECTORY);
        std::fs::create_dir(&verdicts).unwrap();
        std::fs::set_permissions(&verdicts, std::fs::Permissions::from_mode(0o777)).unwrap();
        // The attacker computes the key as the daemon does: the identity
        // and the key's inputs are public.
        VerdictCache::open(dir.path(), 1 << 20).unwrap().put(
            bad.as_bytes(),
            "add_f32_scalar",
            None,
            &forged,
        );
        let entry = the_entry(&verdicts);
        plant(&entry, mode, other_owner);
        // The daemon starts: the directory is made 0700, the planted entry
        // is not served, and it is gone.
        let cache = VerdictCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&verdicts).unwrap().mode() & 0o777, 0o700);
        assert!(
            cache.get(bad.as_bytes(), "add_f32_scalar", None).is_none(),
            "mode {mode:o}, another owner {other_owner}: a planted verdict was served"
        );
        assert!(!entry.exists(), "mode {mode:o}: the planted entry is kept");
        // The daemon's own entry of the same bytes (0600, its owner) is
        // served: the check refuses what others wrote, not the cache.
        cache.put(bad.as_bytes(), "add_f32_scalar", None, &forged);
        assert_eq!(
            std::fs::metadata(the_entry(&verdicts)).unwrap().mode() & 0o777,
            0o600
        );
        assert!(cache.get(bad.as_bytes(), "add_f32_scalar", None).is_some());
    }
}

/// The same attack on a daemon: the planted verdict for the out-of-bounds
/// kernel is in the cache directory before the daemon starts. Before the
/// fix the front served it ("PTX verdict served from the verdict cache")
/// and handed the text to the executor as verified; now the front's
/// verifier refuses the load with its own reason, and the entry is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_does_not_load_a_planted_verdict() {
    let (bad, forged) = forged_verdict();
    let dir = tempfile::tempdir().unwrap();
    let verdicts = dir.path().join(SUBDIRECTORY);
    std::fs::create_dir(&verdicts).unwrap();
    std::fs::set_permissions(&verdicts, std::fs::Permissions::from_mode(0o777)).unwrap();
    VerdictCache::open(dir.path(), 1 << 20).unwrap().put(
        bad.as_bytes(),
        "add_f32_scalar",
        None,
        &forged,
    );
    let entry = the_entry(&verdicts);
    plant(&entry, 0o644, is_root());
    let daemon = Daemon::start_with(
        &["--kernel-cache-dir", dir.path().to_str().unwrap()],
        |command| {
            command.env("RUST_LOG", "warn,ptxd::verdicts=debug");
        },
    );
    let client = ptxd_client::Client::connect(&daemon.target())
        .await
        .unwrap();
    let session = client.open_session("planted-verdict").await.unwrap();
    let error = session
        .load_ptx(
            0,
            bad.clone(),
            "add_f32_scalar",
            ptxd_client::LoadOptions::default(),
        )
        .await
        .expect_err("a planted verdict must not load a kernel the verifier refuses");
    // Refused by the front's verifier, not served from the cache (the host
    // executor, which verifies what it compiles, would refuse it too; a
    // CUDA executor compiles what the front hands it).
    assert!(
        !daemon
            .stderr()
            .contains("PTX verdict served from the verdict cache"),
        "{}",
        daemon.stderr()
    );
    assert_eq!(crate::support::reason(&error), "NON_SCALAR_ABI");
    assert_eq!(
        crate::support::meta(&error, "sub_reason"),
        "non_elementwise_address"
    );
    assert!(!entry.exists());
}
