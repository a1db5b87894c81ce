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
    // As root, another owner with an ordinary umask's mode; otherwise a
    // mode others can write (chown needs root).
    let (mode, other_owner) = if is_root() {
        (0o644, true)
    } else {
        (0o666, false)
    };
    plant(&entry, mode, other_owner);
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

/// The same class in the compiled-kernel cache beside it
/// (`src/executor/kernel_cache.rs`, not this review's to change): an entry
/// another user planted in a directory that was writable by others is
/// served as the driver's code for a key anyone computes (the canonical
/// text and the target). `KernelCache::get` now refuses an entry that is
/// not the daemon user's own (owner and mode of the opened file, as
/// `VerdictCache::get` does).
#[test]
fn a_compiled_kernel_another_user_could_have_written_is_a_miss() {
    use ptxd::executor::kernel_cache::{CacheKey, KernelCache, Lookup};
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let key = CacheKey::new(
        b"canonical text of a benign kernel",
        "cuda sm_90 driver 12080",
    );
    KernelCache::open(dir.path(), 1 << 20)
        .unwrap()
        .put(&key, b"the attacker's machine code");
    let entry = the_entry(dir.path());
    plant(&entry, 0o666, is_root());
    let cache = KernelCache::open(dir.path(), 1 << 20).unwrap();
    assert!(
        !matches!(cache.get(&key), Lookup::Hit(_)),
        "a planted compiled kernel was served"
    );
}

/// What held in the verdict cache (each a miss, never a verdict the
/// verifier would not give): an entry of another verifier identity is
/// never looked up; the same bytes under another entry name or declared
/// ABI are other keys; a truncated, extended or bit-flipped entry, and an
/// entry copied over another key's name, are misses and deleted; an entry
/// that is a symbolic link to a valid entry is a miss; a verdict directory
/// that is a symbolic link, or another user's, stops the cache opening.
#[test]
fn the_verdict_caches_other_attacks_are_misses() {
    use rand::Rng;
    let text = corpus("add_f32_scalar.ptx");
    let canonical = ptx::canonicalize(&text, "add_f32_scalar", None).unwrap();
    let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
    let accepted = Accepted { canonical, hash };
    let declared = |inputs, scalar_params| {
        Some(ptx::DeclaredAbi {
            inputs,
            scalar_params,
        })
    };
    let fresh = || {
        let dir = tempfile::tempdir().unwrap();
        let cache = VerdictCache::open(dir.path(), 1 << 20).unwrap();
        cache.put(text.as_bytes(), "add_f32_scalar", None, &accepted);
        assert_eq!(
            cache.get(text.as_bytes(), "add_f32_scalar", None).as_ref(),
            Some(&accepted)
        );
        let entry = the_entry(&dir.path().join(SUBDIRECTORY));
        (dir, cache, entry)
    };
    // Other inputs are other keys.
    let (_dir, cache, _) = fresh();
    for (bytes, symbol, abi) in [
        (text.as_bytes(), "add_f32_scalar_", None),
        (text.as_bytes(), "add_f32_scalar", declared(2, 0)),
        (text.as_bytes(), "add_f32_scalar", declared(0, 2)),
        (&text.as_bytes()[..text.len() - 1], "add_f32_scalar", None),
    ] {
        assert!(cache.get(bytes, symbol, abi).is_none(), "{symbol} {abi:?}");
    }
    // Damaged entries.
    let mut rng = rand::rng();
    for damage in 0..40 {
        let (_dir, cache, entry) = fresh();
        let mut bytes = std::fs::read(&entry).unwrap();
        match damage % 4 {
            0 => bytes.truncate(rng.random_range(0..bytes.len())),
            1 => bytes.push(rng.random()),
            _ => {
                let at = rng.random_range(0..bytes.len());
                bytes[at] ^= 1 << rng.random_range(0..8);
            }
        }
        std::fs::write(&entry, &bytes).unwrap();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            cache.get(text.as_bytes(), "add_f32_scalar", None).is_none(),
            "damage {damage}"
        );
        assert!(!entry.exists(), "damage {damage}: a damaged entry is kept");
    }
    // Another key's whole entry under this key's name.
    let (dir, cache, entry) = fresh();
    cache.put(text.as_bytes(), "add_f32_scalar", declared(2, 0), &accepted);
    let other = std::fs::read_dir(dir.path().join(SUBDIRECTORY))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| *p != entry)
        .unwrap();
    std::fs::rename(&other, &entry).unwrap();
    assert!(cache.get(text.as_bytes(), "add_f32_scalar", None).is_none());
    // An entry that is a link to a valid entry.
    let (dir, cache, entry) = fresh();
    let kept = dir.path().join("kept");
    std::fs::rename(&entry, &kept).unwrap();
    std::os::unix::fs::symlink(&kept, &entry).unwrap();
    assert!(cache.get(text.as_bytes(), "add_f32_scalar", None).is_none());
    // A verdict directory that is a link, or another user's.
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(SUBDIRECTORY)).unwrap();
    let error = VerdictCache::open(dir.path(), 1 << 20).unwrap_err();
    assert!(error.to_string().contains("a symbolic link"), "{error}");
    if is_root() {
        let dir = tempfile::tempdir().unwrap();
        let verdicts = dir.path().join(SUBDIRECTORY);
        std::fs::create_dir(&verdicts).unwrap();
        std::os::unix::fs::chown(&verdicts, Some(65534), Some(65534)).unwrap();
        let error = VerdictCache::open(dir.path(), 1 << 20).unwrap_err();
        assert!(error.to_string().contains("owned by uid 65534"), "{error}");
    }
}

/// Concurrent writers and readers of one key (two daemons sharing a
/// directory, and several loads of one kernel): a reader sees the whole
/// verdict or none, never a torn one and never another's.
#[test]
fn concurrent_writers_of_a_key_never_serve_a_torn_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let kernels: Vec<(String, &str)> = vec![
        (corpus("add_f32_scalar.ptx"), "add_f32_scalar"),
        (corpus("affine_f32_scalar.ptx"), "affine_f32_scalar"),
    ];
    let verdicts: Vec<Accepted> = kernels
        .iter()
        .map(|(text, symbol)| {
            let canonical = ptx::canonicalize(text, symbol, None).unwrap();
            let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
            Accepted { canonical, hash }
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..6 {
            let (kernels, verdicts, path) = (&kernels, &verdicts, dir.path());
            s.spawn(move || {
                let cache = VerdictCache::open(path, 1 << 20).unwrap();
                for round in 0..150 {
                    let k = (t + round) % 2;
                    let (text, symbol) = &kernels[k];
                    if t % 2 == 0 {
                        cache.put(text.as_bytes(), symbol, None, &verdicts[k]);
                    } else if let Some(got) = cache.get(text.as_bytes(), symbol, None) {
                        assert_eq!(got, verdicts[k], "{symbol}");
                    }
                }
            });
        }
    });
}

/// The Strided kernels' contracts, as the verifier proves them.
fn strided_contracts() -> Vec<(String, ptx::LaunchContract)> {
    let mut out = Vec::new();
    for entry in [
        "add_f32_strided",
        "bias_add_f32_strided",
        "transpose_copy_f32_strided",
    ] {
        for build in ["O3", "G", "fast"] {
            let file = format!("jit/nvrtc/{entry}_{build}.ptx");
            let canonical = ptx::canonicalize(&corpus(&file), entry, None).unwrap();
            assert!(canonical.contract.reads_args(), "{file}");
            out.push((file, canonical.contract));
        }
    }
    out
}

/// Class: args of the wrong kind. A footprint or precondition's arg is
/// read as the kernel's signed 64-bit value; a contract that reads a
/// `.f32` scalar (its bits would be a stride or a divisor: 0x3f800000 for
/// 1.0) or a 32-bit one (its sign is not where a 64-bit read finds it)
/// is no contract the verifier gives. Before, a ring grant carrying one
/// decoded and its launches were checked with the float's bits as a
/// count, and a kept verdict carrying one was served; now the grant is
/// refused (the kernel is not granted to the ring) and the verdict is a
/// miss. The verifier's own contracts all pass.
#[test]
fn an_arg_of_another_kind_in_a_contract_is_refused() {
    use ptxd::ptx::contract::{ParamKind, ScalarType};
    use ptxd_proto::executor::param_slot::Slot;
    for (file, contract) in strided_contracts() {
        assert!(contract.reads_only_integer_args(), "{file}");
        let wire = ptxd::ring_check::encode(&contract);
        assert!(ptxd::ring_check::decode(&wire).is_ok(), "{file}");
        let scalars: Vec<usize> = wire
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p.slot, Some(Slot::Scalar(_))))
            .map(|(i, _)| i)
            .collect();
        let mut refused = 0;
        for (k, ty) in (0..scalars.len())
            .flat_map(|k| [ScalarType::F32, ScalarType::S32, ScalarType::U32].map(|t| (k, t)))
        {
            // The wire kind of `ty`, as the grant spells it.
            let mut typed = contract.clone();
            let at = contract
                .params
                .iter()
                .enumerate()
                .filter(|(_, p)| matches!(p.kind, ParamKind::Scalar(_)))
                .map(|(i, _)| i)
                .nth(k)
                .unwrap();
            typed.params[at].kind = ParamKind::Scalar(ty);
            let kind = ptxd::ring_check::encode(&typed).params[scalars[k]];
            let mut bad = wire.clone();
            bad.params[scalars[k]] = kind;
            // Refused exactly when a term reads arg k.
            let read = contract
                .to_string()
                .split("); block")
                .nth(1)
                .is_some_and(|terms| terms.contains(contract.arg_names()[k]));
            match ptxd::ring_check::decode(&bad) {
                Err(error) => {
                    assert!(read, "{file} arg {k} {ty:?}: {error}");
                    assert!(
                        error.contains("no 64-bit integer"),
                        "{file} {ty:?}: {error}"
                    );
                    assert!(!typed.reads_only_integer_args(), "{file} {ty:?}");
                    refused += 1;
                }
                Ok(_) => assert!(!read, "{file}: arg {k} {ty:?} read as a count"),
            }
        }
        assert!(refused >= 6, "{file}: {refused}");
    }
    // A kept verdict whose contract reads a `.f32` arg is a miss.
    let (file, entry) = ("jit/nvrtc/add_f32_strided_O3.ptx", "add_f32_strided");
    let text = corpus(file);
    let mut canonical = ptx::canonicalize(&text, entry, None).unwrap();
    let first = canonical
        .contract
        .params
        .iter()
        .position(|p| matches!(p.kind, ParamKind::Scalar(_)))
        .unwrap();
    canonical.contract.params[first].kind = ParamKind::Scalar(ScalarType::F32);
    let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
    let dir = tempfile::tempdir().unwrap();
    let cache = VerdictCache::open(dir.path(), 1 << 20).unwrap();
    cache.put(text.as_bytes(), entry, None, &Accepted { canonical, hash });
    assert!(cache.get(text.as_bytes(), entry, None).is_none());
}

/// The largest element index `f(i / d, i % d)` takes over `0 <= i < n`
/// (`n >= 1`, `d >= 1`) for an `f` non-decreasing in both: at `i = n - 1`,
/// or at the last element of the row before (`(q - 1, d - 1)`), in u128.
fn largest_index(n: u128, d: u128, f: impl Fn(u128, u128) -> u128) -> u128 {
    let q = (n - 1) / d;
    let last = f(q, (n - 1) - q * d);
    if q >= 1 {
        last.max(f(q - 1, d - 1))
    } else {
        last
    }
}

/// What held: the Strided contract's arithmetic at values no buffer can
/// hold. For every corpus Strided kernel and random huge launches (counts
/// to 2^63 - 1, strides and divisors of 0, 1, powers of two to 2^62,
/// i64::MAX, u64::MAX, and the shape's own edges: d = n - 1, n, n + 1),
/// whenever the contract passes the launch (every precondition holds),
/// each input's footprint covers the largest element the kernel reads,
/// computed exactly in u128 from the kernel's index formula, and that
/// element's byte offset fits the kernel's signed 64-bit arithmetic (no
/// product or sum wraps); the output's is `4n`. Launches past 2^63 bytes
/// are refused by `strided_index_fits_i64`, a negative or huge divisor by
/// `divisor_positive`.
#[test]
fn the_strided_contract_bounds_what_the_kernel_reads_at_huge_args() {
    use ptxd::launch::{BoundContract, LaunchRefusal, LaunchTerms};
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let huge = |rng: &mut rand::rngs::StdRng, n: u64| -> u64 {
        match rng.random_range(0..9) {
            0 => 0,
            1 => 1,
            2 => 1 << rng.random_range(1..63),
            3 => i64::MAX as u64,
            4 => u64::MAX,
            5 => n.saturating_sub(1),
            6 => n.saturating_add(1),
            7 => n,
            _ => {
                let top: u64 = 1 << rng.random_range(2..63);
                rng.random_range(2..top)
            }
        }
    };
    let (mut passed, mut widest, mut refused) = (0usize, 0u128, Vec::new());
    for (file, contract) in strided_contracts() {
        let terms = BoundContract {
            contract: &contract,
            block: contract.geometry.block.host_block(),
        };
        for _ in 0..20_000 {
            let n: u64 = match rng.random_range(0..4) {
                0 => rng.random_range(1..5),
                1 => 1 << rng.random_range(0..63),
                _ => rng.random_range(1..=i64::MAX as u64),
            };
            let (s0, s1, d0, d1) = (
                huge(&mut rng, n),
                huge(&mut rng, n),
                huge(&mut rng, n),
                huge(&mut rng, n),
            );
            let transpose = file.contains("transpose");
            let args: Vec<u64> = if transpose {
                vec![s0, d0, d1]
            } else {
                vec![s0, s1, d0, d1]
            };
            let values = match terms.values(n, &args) {
                Ok(v) => v,
                Err(LaunchRefusal::PreconditionFailed { precondition, .. }) => {
                    refused.push(precondition);
                    continue;
                }
                Err(other) => panic!("{file}: {other}"),
            };
            let (n, s0, s1, d1) = (
                u128::from(n),
                u128::from(s0),
                u128::from(s1),
                u128::from(d1),
            );
            let reads: Vec<u128> = if transpose {
                vec![largest_index(n, d1, |r, c| c * s0 + r)]
            } else if file.contains("bias_add") {
                vec![n - 1, largest_index(n, d1, |_, c| c * s1)]
            } else {
                vec![
                    largest_index(n, d1, |r, c| r * s0 + c),
                    largest_index(n, d1, |_, c| c * s1),
                ]
            };
            for (k, largest) in reads.iter().enumerate() {
                let bytes = contract.footprints[k]
                    .bytes
                    .eval_with(&values, &args)
                    .unwrap_or_else(|| panic!("{file}: a passed launch without a footprint"));
                assert!(
                    bytes >= 4 * (largest + 1),
                    "{file}: input {k} reads element {largest}, footprint {bytes} bytes: n {n}, args {args:?}"
                );
                assert!(
                    4 * largest <= i64::MAX as u128,
                    "{file}: input {k}'s byte offset {} wraps the kernel's i64: n {n}, args {args:?}",
                    4 * largest
                );
                widest = widest.max(4 * largest);
            }
            let out = contract.footprints[reads.len()]
                .bytes
                .eval_with(&values, &args);
            assert_eq!(out, Some(4 * n), "{file}");
            passed += 1;
        }
    }
    refused.sort_unstable();
    refused.dedup();
    eprintln!("{passed} passed, the widest read at byte {widest}; refused by {refused:?}");
    assert!(passed > 1000, "{passed}");
    assert!(widest > 1 << 60, "{widest}");
    for name in [
        "divisor_positive",
        "arg_nonnegative",
        "strided_index_fits_i64",
    ] {
        assert!(refused.contains(&name), "{name}: {refused:?}");
    }
}

// The verdict cache's review leftovers (w33v).

/// Class: an optional cache that stops the daemon. A `verdicts` path the
/// daemon cannot use (a file, a symbolic link, another user's directory)
/// made `Front::start` fail, so a daemon whose kernel cache directory was
/// fine refused to start because of the verdict cache beside it. Now the
/// daemon starts without the verdict cache (a warning in its log), loads
/// and verifies kernels as without one, and leaves the foreign path alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_verdict_directory_does_not_stop_the_daemon() {
    let mut cases: Vec<&str> = vec!["a file", "a symbolic link"];
    if is_root() {
        cases.push("another user's directory");
    }
    for case in cases {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let verdicts = dir.path().join(SUBDIRECTORY);
        match case {
            "a file" => std::fs::write(&verdicts, b"not a directory").unwrap(),
            "a symbolic link" => std::os::unix::fs::symlink(elsewhere.path(), &verdicts).unwrap(),
            _ => {
                std::fs::create_dir(&verdicts).unwrap();
                std::os::unix::fs::chown(&verdicts, Some(65534), Some(65534)).unwrap();
            }
        }
        let daemon = Daemon::start_with(
            &["--kernel-cache-dir", dir.path().to_str().unwrap()],
            |command| {
                command.env("RUST_LOG", "warn,ptxd::verdicts=debug");
            },
        );
        let client = ptxd_client::Client::connect(&daemon.target())
            .await
            .unwrap();
        let session = client.open_session("foreign-verdicts").await.unwrap();
        crate::support::load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
        let log = daemon.stderr();
        assert!(
            log.contains("the verdict cache is not used"),
            "{case}: {log}"
        );
        assert!(
            std::fs::read_dir(elsewhere.path())
                .unwrap()
                .next()
                .is_none(),
            "{case}: a verdict was written through the link"
        );
        match case {
            "a file" => assert_eq!(std::fs::read(&verdicts).unwrap(), b"not a directory"),
            "a symbolic link" => {
                assert!(std::fs::symlink_metadata(&verdicts)
                    .unwrap()
                    .file_type()
                    .is_symlink())
            }
            _ => {
                let meta = std::fs::metadata(&verdicts).unwrap();
                assert_eq!(meta.uid(), 65534, "{case}");
                assert!(std::fs::read_dir(&verdicts).unwrap().next().is_none());
            }
        }
    }
}

/// Class: one tenant's copies of one kernel in the shared store. Every
/// byte-different copy of a kernel (here a comment of its own) was a new
/// entry, and the least recently used went first, so a tenant's flood of
/// copies evicted every other tenant's verdicts. Now one kernel (one
/// canonical text) keeps at most `VARIANTS_PER_KERNEL` entries: the
/// other kernel's verdict, older than every copy, is still served, and the
/// store holds the other kernel and the newest copies only.
#[test]
fn one_tenants_copies_of_a_kernel_do_not_evict_other_verdicts() {
    use ptxd::front::verdict_cache::VARIANTS_PER_KERNEL;
    let verdict = |text: &str, symbol: &str| {
        let canonical = ptx::canonicalize(text, symbol, None).unwrap();
        let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
        Accepted { canonical, hash }
    };
    let victim = corpus("affine_f32_scalar.ptx");
    let flooded = corpus("add_f32_scalar.ptx");
    let dir = tempfile::tempdir().unwrap();
    // Room for about 16 entries of these kernels.
    let cache = VerdictCache::open(dir.path(), 16 * 2048).unwrap();
    cache.put(
        victim.as_bytes(),
        "affine_f32_scalar",
        None,
        &verdict(&victim, "affine_f32_scalar"),
    );
    let copies = 64;
    for i in 0..copies {
        let copy = format!("{flooded}\n// copy {i} {}\n", rand::random::<u64>());
        let accepted = verdict(&copy, "add_f32_scalar");
        cache.put(copy.as_bytes(), "add_f32_scalar", None, &accepted);
    }
    assert_eq!(
        cache.get(victim.as_bytes(), "affine_f32_scalar", None),
        Some(verdict(&victim, "affine_f32_scalar")),
        "the flood evicted another kernel's verdict"
    );
    let entries = std::fs::read_dir(dir.path().join(SUBDIRECTORY))
        .unwrap()
        .count();
    assert_eq!(entries, VARIANTS_PER_KERNEL + 1);
}

/// Class: a kept verdict whose counts agree but whose layout does not.
/// `consistent` compared the contract's operand and scalar counts with the
/// signature's, not the layout the executor checks at load: a verdict
/// passing one operand twice (and another never) was served, and the
/// executor then refused every load of the kernel. Now it is a miss, the
/// entry deleted, and the kernel verified again.
#[test]
fn a_kept_verdict_whose_layout_the_executor_refuses_is_a_miss() {
    let text = corpus("add_f32_scalar.ptx");
    let canonical = ptx::canonicalize(&text, "add_f32_scalar", None).unwrap();
    let hash = *blake3::hash(canonical.text.as_bytes()).as_bytes();
    let mut bad = Accepted {
        canonical: canonical.clone(),
        hash,
    };
    let pointers: Vec<usize> = (0..bad.canonical.contract.params.len())
        .filter(|&i| {
            matches!(
                bad.canonical.contract.params[i].kind,
                ptx::contract::ParamKind::Pointer {
                    operand: Some(_),
                    ..
                }
            )
        })
        .collect();
    assert!(pointers.len() >= 2);
    bad.canonical.contract.params[pointers[1]].kind =
        bad.canonical.contract.params[pointers[0]].kind.clone();
    let dir = tempfile::tempdir().unwrap();
    let cache = VerdictCache::open(dir.path(), 1 << 20).unwrap();
    cache.put(text.as_bytes(), "add_f32_scalar", None, &bad);
    let entry = the_entry(&dir.path().join(SUBDIRECTORY));
    assert!(cache.get(text.as_bytes(), "add_f32_scalar", None).is_none());
    assert!(!entry.exists(), "the entry is deleted");
    let good = Accepted { canonical, hash };
    cache.put(text.as_bytes(), "add_f32_scalar", None, &good);
    assert_eq!(
        cache.get(text.as_bytes(), "add_f32_scalar", None),
        Some(good)
    );
}
